// fsdp/kit/loss.h: cross-entropy over logits and integer targets, as F.cross_entropy computes it.
//
// logits: float32 [..., V], read as N = numel / V rows; targets: N class indices. Rows whose
// target is `ignore_index` (PyTorch's default -100; nanoGPT passes -1) count neither in the sum
// nor in N; every other target must lie in [0, V). The loss is the mean over counted rows of
// logsumexp(row) - row[target], logsumexp taken with the row maximum subtracted; with no counted
// rows it is NaN, as in PyTorch.
#pragma once

#include <cstdint>
#include <vector>

#include "fsdp/kit/tensor.h"

namespace weft::kit {

constexpr int32_t kDefaultIgnoreIndex = -100;

float cross_entropy(const Tensor& logits, const std::vector<int32_t>& targets,
                    int32_t ignore_index = kDefaultIgnoreIndex);

// d loss / d logits times grad_scale (the loss's upstream gradient; 1 for loss.backward()):
// (softmax(row) - onehot(target)) * grad_scale / N per counted row, 0 for ignored rows. Shaped
// like logits, float32, MemKind::Activations.
Tensor cross_entropy_backward(const Tensor& logits, const std::vector<int32_t>& targets,
                              float grad_scale = 1.0f, int32_t ignore_index = kDefaultIgnoreIndex);

}  // namespace weft::kit
