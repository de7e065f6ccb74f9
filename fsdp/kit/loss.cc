// fsdp/kit/loss.cc: cross-entropy; see loss.h.
#include "fsdp/kit/loss.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "fsdp/kit/check.h"
#include "fsdp/kit/ops.h"

namespace weft::kit {

namespace {
// Rows and vocabulary of `logits`, checking `targets` against them; returns the counted rows.
int64_t check_args(const Tensor& logits, const std::vector<int32_t>& targets, int32_t ignore_index,
                   int64_t& rows, int64_t& vocab) {
  WEFT_KIT_CHECK(logits.defined() && logits.dtype() == DType::Float32 && !logits.shape().empty(),
                 "cross_entropy: logits {} are not float32 [..., V]", logits.describe());
  vocab = logits.dim(-1);
  rows = vocab == 0 ? 0 : logits.numel() / vocab;
  WEFT_KIT_CHECK(static_cast<int64_t>(targets.size()) == rows,
                 "cross_entropy: {} targets for {} rows of logits {}", targets.size(), rows,
                 logits.describe());
  int64_t counted = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const int32_t t = targets[i];
    if (t == ignore_index) continue;
    WEFT_KIT_CHECK(t >= 0 && t < vocab, "cross_entropy: target {} at row {} is not in [0, {})", t,
                   i, vocab);
    ++counted;
  }
  return counted;
}
}  // namespace

float cross_entropy(const Tensor& logits, const std::vector<int32_t>& targets,
                    int32_t ignore_index) {
  int64_t rows = 0, vocab = 0;
  const int64_t counted = check_args(logits, targets, ignore_index, rows, vocab);
  if (counted == 0) return std::numeric_limits<float>::quiet_NaN();
  // Each row's loss in float, as PyTorch's log_softmax kernel; the sum over rows in double so
  // the mean does not depend on N's size.
  double total = 0.0;
  for (int64_t i = 0; i < rows; ++i) {
    if (targets[i] == ignore_index) continue;
    const float* row = logits.f32() + i * vocab;
    float mx = -INFINITY;
    for (int64_t c = 0; c < vocab; ++c) mx = std::max(mx, row[c]);
    float sum = 0.0f;
    for (int64_t c = 0; c < vocab; ++c) sum += std::exp(row[c] - mx);
    // -log_softmax = log(sum) - (x_t - max), in PyTorch's order: x_t - max is exact when x_t is
    // near the max, so large logits lose nothing to a rounded logsumexp.
    total += static_cast<double>(std::log(sum) - (row[targets[i]] - mx));
  }
  return static_cast<float>(total / static_cast<double>(counted));
}

Tensor cross_entropy_backward(const Tensor& logits, const std::vector<int32_t>& targets,
                              float grad_scale, int32_t ignore_index) {
  int64_t rows = 0, vocab = 0;
  const int64_t counted = check_args(logits, targets, ignore_index, rows, vocab);
  Tensor grad = Tensor::empty(logits.shape(), DType::Float32, MemKind::Activations);
  const float scale = grad_scale / static_cast<float>(counted);
  for (int64_t i = 0; i < rows; ++i) {
    float* g = grad.f32() + i * vocab;
    if (targets[i] == ignore_index) {
      for (int64_t c = 0; c < vocab; ++c) g[c] = 0.0f;
      continue;
    }
    ops::softmax_rows(logits.f32() + i * vocab, g, 1, vocab);
    g[targets[i]] -= 1.0f;
    for (int64_t c = 0; c < vocab; ++c) g[c] *= scale;
  }
  return grad;
}

}  // namespace weft::kit
