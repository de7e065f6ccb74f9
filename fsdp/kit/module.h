// fsdp/kit/module.h: modules with explicit forward and backward, named parameters, and the hook
// points the FSDP engine attaches to.
//
// A Module computes forward(x) and keeps what its backward needs (a one-entry tape: forward and
// backward alternate); backward(dy) returns dx and adds the parameters' gradients into their
// .grad (allocating float32 zeros the first time). Parents call children through call_forward()
// and call_backward(), which run the hooks around the child's own code:
//
//   pre_forward hooks  -> forward  -> post_forward hooks  -> output transform
//   grad transform -> pre_backward hooks -> backward -> post_backward hooks
//
// FSDP uses them to gather a module's parameters before it runs, free them after, and
// reduce-scatter its gradients after its backward. Hooks run on the calling thread, in the order
// they were added.
//
// Parameter names follow PyTorch: named_parameters() of a GPT yields
// "transformer.wte.weight", "transformer.h.0.attn.c_attn.weight", ..., "lm_head.weight", so a
// state dict maps one to one onto nanoGPT's.
//
// Compute is float32. A parameter's data may be bfloat16 (FSDP's param_dtype): modules read it
// through weight_f32() (a float32 copy or the tensor itself), and gradients are always float32
// and shaped like the parameter. A module's output may be bfloat16 too (FSDP's output_dtype,
// through the output transform): call_forward hands a module float32 input whatever its caller
// passes (a float32 copy of anything else), and models read children's outputs as_float32().
//
// Thread safety: none; one thread drives a model. Ownership: a module owns its children (members
// of the derived class, registered by pointer) and its parameters.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/kit/tensor.h"

namespace weft::kit {

struct Parameter {
  std::string name;            // local to its module: "weight", "bias"
  std::vector<int64_t> shape;  // the full (unsharded) shape, fixed at construction
  Tensor data;                 // empty while FSDP holds it sharded and not gathered
  Tensor grad;                 // float32, `shape`; empty until a backward writes it

  // data as float32: the tensor itself, or a float32 copy of bfloat16 data (counted as
  // activations while it lives).
  Tensor data_f32() const;
  // The gradient to add into: .grad itself (which FSDP may have set to a view of its unsharded
  // gradient buffer), or, while .grad is empty, float32 zeros of `shape` (MemKind::Grads)
  // allocated now and stored in .grad. Throws unless .grad is float32 with `shape`'s numel.
  Tensor& grad_for_accumulate();
};

class Module {
 public:
  using Hook = std::function<void(Module&)>;

  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  virtual const char* type_name() const = 0;
  // Containers (ModuleList and models with their own entry points) need not implement these:
  // the default throws std::logic_error naming the type.
  virtual Tensor forward(const Tensor& x);
  virtual Tensor backward(const Tensor& grad_out);

  Tensor call_forward(const Tensor& x);
  Tensor call_backward(const Tensor& grad_out);

  void add_pre_forward_hook(Hook hook) { pre_forward_.push_back(std::move(hook)); }
  void add_post_forward_hook(Hook hook) { post_forward_.push_back(std::move(hook)); }
  void add_pre_backward_hook(Hook hook) { pre_backward_.push_back(std::move(hook)); }
  void add_post_backward_hook(Hook hook) { post_backward_.push_back(std::move(hook)); }
  // One transform each of what leaves forward (after the post-forward hooks) and of the gradient
  // that enters backward (before the pre-backward hooks): FSDP's output_dtype casts the output
  // and rounds its gradient to the same dtype, as autograd does for a tensor of that dtype.
  using Transform = std::function<Tensor(const Tensor&)>;
  void set_output_transform(Transform transform) { output_transform_ = std::move(transform); }
  void set_grad_output_transform(Transform transform) {
    grad_output_transform_ = std::move(transform);
  }
  // For modules whose entry point is not forward()/backward() (a model's loss): run the hooks
  // around your own code.
  void run_pre_forward_hooks() { run(pre_forward_); }
  void run_post_forward_hooks() { run(post_forward_); }
  void run_pre_backward_hooks() { run(pre_backward_); }
  void run_post_backward_hooks() { run(post_backward_); }

  // This module's own parameters, in registration order.
  std::vector<Parameter*> own_parameters();
  // Direct children with their names, in registration order.
  const std::vector<std::pair<std::string, Module*>>& children() const { return children_; }
  // Every parameter of this module and its descendants, depth first in registration order,
  // named with dotted paths from this module ("h.0.attn.c_attn.weight").
  std::vector<std::pair<std::string, Parameter*>> named_parameters();
  // Every module of the tree, this one first, with its dotted path ("" for this one).
  std::vector<std::pair<std::string, Module*>> named_modules();
  // Sets every parameter's .grad to an empty tensor.
  void zero_grad();

 protected:
  // Registers a parameter of `shape`, float32, allocated as MemKind::Params and zero-filled;
  // the model's init fills it.
  Parameter& register_parameter(std::string name, std::vector<int64_t> shape);
  void register_module(std::string name, Module* child);

 private:
  void run(const std::vector<Hook>& hooks);

  std::vector<std::unique_ptr<Parameter>> params_;
  std::vector<std::pair<std::string, Module*>> children_;
  std::vector<Hook> pre_forward_, post_forward_, pre_backward_, post_backward_;
  Transform output_transform_, grad_output_transform_;
};

}  // namespace weft::kit
