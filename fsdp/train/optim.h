// fsdp/train/optim.h: SGD and AdamW over flat float32 spans, with PyTorch's arithmetic.
//
// An FSDP rank updates only its shard of each parameter, so an optimizer here never sees a
// module or a tensor: it sees one (param, grad) pair of equal-length float32 spans at a time,
// plus that parameter's state. Elements are independent, so updating a shard is the same as
// updating the full parameter and keeping the shard's part: sharding cannot change the result.
//
//   const Optimizer opt = AdamW{.lr = 1e-3, .weight_decay = 0.1};
//   std::vector<OptimizerState> states(n_params);
//   for (size_t i = 0; i < n_params; ++i) opt.step(shard[i], grad_shard[i], states[i]);
//
// Numerics. The update is the one torch.optim.SGD / torch.optim.AdamW (PyTorch 2.6, one
// parameter group, foreach=False, fused=False: what PyTorch runs for CPU tensors) computes, in
// float32 with the same operations in the same order; hyperparameters are combined in double as
// the Python code does, then rounded to float32 as a Python scalar is when it meets a float32
// tensor. Where PyTorch's CPU kernels fuse a multiply-add (lerp and add-with-alpha call fmadd;
// the compiler contracts addcmul's a + s * b * c), std::fma does here, and nowhere else.
// docs/fsdp-training-contract.md gives the formulas; optim.cc has them step by step. The results
// are PyTorch's bit for bit where PyTorch runs its AVX2 or AVX-512 kernels (checked against
// PyTorch 2.6: tests/fsdp/train/optim_test.cc); its non-AVX kernels fuse nothing and may differ
// in the last bit.
//
// State. Each parameter has a step count and float32 buffers of the parameter's (shard's)
// length, named as PyTorch's optimizer.state_dict() names them: AdamW keeps "exp_avg" and
// "exp_avg_sq"; SGD keeps "momentum_buffer" when momentum != 0 and nothing otherwise. The caller
// decides where they live: OptimizerState owns them in std::vectors (also the checkpoint form),
// or step() takes spans of the caller's memory (an offload pool, a block a memory tracker
// counts); state_bytes() says how much to allocate. New buffers must be zero-filled.
//
// Thread safety: the option structs and Optimizer are values; step() only writes the spans it is
// given, so different parameters may be stepped from different threads.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <variant>
#include <vector>

namespace weft::train {

// torch.optim.SGD(params, lr, momentum, weight_decay=...) with dampening 0, nesterov False,
// maximize False:
//   g = grad + weight_decay * param                      (when weight_decay != 0)
//   buf = g at the first step, then momentum * buf + g   (when momentum != 0; g = buf)
//   param -= lr * g
struct SGD {
  double lr = 0;
  double momentum = 0;
  double weight_decay = 0;
};

// torch.optim.AdamW(params, lr, betas=(beta1, beta2), eps, weight_decay), amsgrad False:
//   t += 1
//   param *= 1 - lr * weight_decay
//   m = lerp(m, grad, 1 - beta1)           (= beta1 * m + (1 - beta1) * grad)
//   v = beta2 * v + (1 - beta2) * grad^2
//   param -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
struct AdamW {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

// One parameter's optimizer state, owning its buffers: the default home of the state and the form
// it takes in a checkpoint. Empty buffers are allocated (zeroed, the parameter's length) by the
// first Optimizer::step().
struct OptimizerState {
  int64_t step = 0;                         // steps taken: PyTorch's state["step"]
  std::vector<std::vector<float>> buffers;  // in Optimizer::state_names() order
  int64_t bytes() const;                    // bytes of the buffers (what a tracker counts)
};

// The SGD step on one parameter. `momentum_buffer` is empty when sgd.momentum == 0, else it has
// param's length; `step` is incremented. At step 0 the buffer's contents are ignored (PyTorch
// starts it as a copy of the gradient).
// REQUIRES: grad.size() == param.size(); the spans do not overlap.
void sgd_step(const SGD& sgd, std::span<float> param, std::span<const float> grad,
              std::span<float> momentum_buffer, int64_t& step);

// The AdamW step on one parameter: `step` is incremented first, as PyTorch does, and the bias
// corrections use the new value. exp_avg and exp_avg_sq start zeroed.
// REQUIRES: all four spans have param's length and do not overlap.
void adamw_step(const AdamW& adamw, std::span<float> param, std::span<const float> grad,
                std::span<float> exp_avg, std::span<float> exp_avg_sq, int64_t& step);

// SGD or AdamW behind one interface, as a --optim flag picks it.
class Optimizer {
 public:
  Optimizer(const SGD& sgd) : options_(sgd) {}        // NOLINT: implicit on purpose
  Optimizer(const AdamW& adamw) : options_(adamw) {}  // NOLINT

  std::string_view name() const;  // "sgd" or "adamw"
  const std::variant<SGD, AdamW>& options() const { return options_; }
  // The learning rate, for a caller that schedules it between steps.
  double lr() const;
  void set_lr(double lr);

  // The float32 buffers kept per parameter, each as long as the parameter, named as in PyTorch's
  // optimizer.state_dict(): {"exp_avg", "exp_avg_sq"}, {"momentum_buffer"} or {}.
  std::span<const std::string_view> state_names() const;
  // Bytes of state for a parameter (or shard) of `numel` elements.
  int64_t state_bytes(int64_t numel) const {
    return static_cast<int64_t>(state_names().size()) * numel * static_cast<int64_t>(sizeof(float));
  }

  // One step on one parameter with its state in caller memory: `buffers` in state_names() order,
  // each of param's length, zero-filled before the first step. Throws weft::Error
  // (InvalidArgument) on a length or count mismatch.
  void step(std::span<float> param, std::span<const float> grad,
            std::span<const std::span<float>> buffers, int64_t& step) const;
  // The same with an owned state, whose buffers are allocated at the first step. Throws
  // weft::Error (InvalidArgument) when a loaded state does not fit the parameter.
  void step(std::span<float> param, std::span<const float> grad, OptimizerState& state) const;

 private:
  std::variant<SGD, AdamW> options_;
};

}  // namespace weft::train
