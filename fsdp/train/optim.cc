#include "fsdp/train/optim.h"

#include <array>
#include <cmath>
#include <string>

#include <fmt/format.h>

#include "weft/error.h"

// Every float32 expression below is one PyTorch CPU kernel (PyTorch 2.6, aten/src/ATen/native/cpu:
// BinaryOpsKernel, PointwiseOpsKernel, Lerp.h, ufunc/add.h) applied to a float32 tensor and a
// Python float; the comment names it. A Python float meets a float32 tensor as float32 (the
// kernels cast the scalar to the tensor's type), hence the static_cast<float> of each
// hyperparameter after the double arithmetic the optimizer's Python code does. This file is
// compiled with -ffp-contract=off (fsdp/train/meson.build): a multiply-add is fused exactly where
// std::fma says so: where PyTorch's kernels call Vectorized<float>::fmadd, and where the compiler
// contracted a kernel's a * b + c in PyTorch's AVX2 / AVX-512 builds (which use -mfma), and
// nowhere else.

namespace weft::train {
namespace {

[[noreturn]] void invalid(std::string_view where, const std::string& detail) {
  throw_error(ErrorCode::InvalidArgument, where, detail);
}

// at::native::lerp with a scalar weight, as the vectorised kernel computes it (lerp_vec): a
// fused multiply-add from the nearer end, chosen by |weight| < 0.5.
inline float lerp(float self, float end, float weight) {
  return std::fabs(weight) < 0.5f ? std::fma(weight, end - self, self)
                                  : std::fma(weight - 1.0f, end - self, end);
}

constexpr std::array<std::string_view, 2> kAdamWStateNames = {"exp_avg", "exp_avg_sq"};
constexpr std::array<std::string_view, 1> kSGDMomentumStateNames = {"momentum_buffer"};

}  // namespace

int64_t OptimizerState::bytes() const {
  int64_t total = 0;
  for (const auto& buffer : buffers) total += static_cast<int64_t>(buffer.size() * sizeof(float));
  return total;
}

void sgd_step(const SGD& sgd, std::span<float> param, std::span<const float> grad,
              std::span<float> momentum_buffer, int64_t& step) {
  const size_t n = param.size();
  if (grad.size() != n) {
    invalid("sgd step", fmt::format("grad has {} elements, param {}", grad.size(), n));
  }
  const bool has_momentum = sgd.momentum != 0;
  if (has_momentum && momentum_buffer.size() != n) {
    invalid("sgd step",
            fmt::format("momentum_buffer has {} elements, param {}", momentum_buffer.size(), n));
  }
  const float weight_decay = static_cast<float>(sgd.weight_decay);
  const float momentum = static_cast<float>(sgd.momentum);
  const float neg_lr = static_cast<float>(-sgd.lr);
  const bool first = step == 0;
  for (size_t i = 0; i < n; ++i) {
    float g = grad[i];
    // grad = grad.add(param, alpha=weight_decay): add computes fmadd(other, alpha, self).
    if (sgd.weight_decay != 0) g = std::fma(param[i], weight_decay, g);
    if (has_momentum) {
      // buf = clone(grad) at the first step, then buf.mul_(momentum).add_(grad, alpha=1): the
      // add with alpha 1 is exact before its one rounding, so a plain sum.
      float& buf = momentum_buffer[i];
      buf = first ? g : buf * momentum + g;
      g = buf;
    }
    // param.add_(grad, alpha=-lr).
    param[i] = std::fma(g, neg_lr, param[i]);
  }
  ++step;
}

void adamw_step(const AdamW& adamw, std::span<float> param, std::span<const float> grad,
                std::span<float> exp_avg, std::span<float> exp_avg_sq, int64_t& step) {
  const size_t n = param.size();
  if (grad.size() != n || exp_avg.size() != n || exp_avg_sq.size() != n) {
    invalid("adamw step",
            fmt::format("param has {} elements but grad {}, exp_avg {}, exp_avg_sq {}", n,
                        grad.size(), exp_avg.size(), exp_avg_sq.size()));
  }
  // step_t += 1; PyTorch keeps it in a float32 tensor and reads it back with .item(), exact up to
  // 2^24 steps.
  ++step;
  const double t = static_cast<double>(static_cast<float>(step));
  // The Python scalars: 1 - lr * weight_decay, 1 - beta1, 1 - beta2, the bias corrections,
  // step_size = lr / bias_correction1 and bias_correction2 ** 0.5, all in double.
  const float decay = static_cast<float>(1.0 - adamw.lr * adamw.weight_decay);
  const float one_minus_beta1 = static_cast<float>(1.0 - adamw.beta1);
  const float beta2 = static_cast<float>(adamw.beta2);
  const float one_minus_beta2 = static_cast<float>(1.0 - adamw.beta2);
  const double bias_correction1 = 1.0 - std::pow(adamw.beta1, t);
  const double bias_correction2 = 1.0 - std::pow(adamw.beta2, t);
  const float neg_step_size = static_cast<float>(-(adamw.lr / bias_correction1));
  const float bias_correction2_sqrt = static_cast<float>(std::pow(bias_correction2, 0.5));
  const float eps = static_cast<float>(adamw.eps);
  for (size_t i = 0; i < n; ++i) {
    const float g = grad[i];
    // param.mul_(1 - lr * weight_decay)
    float p = param[i] * decay;
    // exp_avg.lerp_(grad, 1 - beta1)
    const float m = lerp(exp_avg[i], g, one_minus_beta1);
    // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2): the kernel's
    // self + value * t1 * t2, which the compiler contracts to fma(value * t1, t2, self) in
    // PyTorch's AVX2 and AVX-512 builds (measured: the unfused form differs in the last bit).
    const float v = std::fma(one_minus_beta2 * g, g, exp_avg_sq[i] * beta2);
    // denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
    const float denom = std::sqrt(v) / bias_correction2_sqrt + eps;
    // param.addcdiv_(exp_avg, denom, value=-step_size): self + value * t1 / t2.
    p = p + neg_step_size * m / denom;
    param[i] = p;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
  }
}

std::string_view Optimizer::name() const {
  return std::holds_alternative<SGD>(options_) ? "sgd" : "adamw";
}

double Optimizer::lr() const {
  return std::visit([](const auto& options) { return options.lr; }, options_);
}

void Optimizer::set_lr(double lr) {
  std::visit([lr](auto& options) { options.lr = lr; }, options_);
}

std::span<const std::string_view> Optimizer::state_names() const {
  if (const auto* sgd = std::get_if<SGD>(&options_)) {
    if (sgd->momentum == 0) return {};
    return kSGDMomentumStateNames;
  }
  return kAdamWStateNames;
}

void Optimizer::step(std::span<float> param, std::span<const float> grad,
                     std::span<const std::span<float>> buffers, int64_t& step) const {
  const size_t expected = state_names().size();
  if (buffers.size() != expected) {
    invalid(fmt::format("{} step", name()),
            fmt::format("{} state buffers given, {} expected", buffers.size(), expected));
  }
  if (const auto* sgd = std::get_if<SGD>(&options_)) {
    sgd_step(*sgd, param, grad, expected == 0 ? std::span<float>() : buffers[0], step);
  } else {
    adamw_step(std::get<AdamW>(options_), param, grad, buffers[0], buffers[1], step);
  }
}

void Optimizer::step(std::span<float> param, std::span<const float> grad,
                     OptimizerState& state) const {
  const size_t expected = state_names().size();
  if (state.buffers.empty() && state.step == 0) {
    state.buffers.assign(expected, std::vector<float>(param.size(), 0.0f));
  }
  if (state.buffers.size() != expected) {
    invalid(fmt::format("{} step", name()),
            fmt::format("state has {} buffers, {} expected", state.buffers.size(), expected));
  }
  std::vector<std::span<float>> spans(state.buffers.begin(), state.buffers.end());
  step(param, grad, spans, state.step);
}

}  // namespace weft::train
