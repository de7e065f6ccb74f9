// fsdp/kit/module.cc: hooks around calls, parameter registration and the module tree's walks.
#include "fsdp/kit/module.h"

#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "fsdp/kit/check.h"

namespace weft::kit {

Tensor Parameter::data_f32() const {
  if (!data.defined())
    throw std::logic_error(
        fmt::format("parameter '{}' [{}] has no data (sharded and not gathered?)", name,
                    fmt::join(shape, ", ")));
  if (data.dtype() == DType::Float32) return data;
  return data.to(DType::Float32, MemKind::Activations);
}

Tensor& Parameter::grad_for_accumulate() {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  if (!grad.defined()) {
    grad = Tensor::zeros(shape, DType::Float32, MemKind::Grads);
    return grad;
  }
  WEFT_KIT_CHECK(grad.dtype() == DType::Float32 && grad.numel() == n,
                 "parameter '{}' [{}]: its grad is {}, not float32 with {} elements", name,
                 fmt::join(shape, ", "), grad.describe(), n);
  return grad;
}

Tensor Module::forward(const Tensor&) {
  throw std::logic_error(
      fmt::format("{} has no forward(Tensor): call its own entry point", type_name()));
}

Tensor Module::backward(const Tensor&) {
  throw std::logic_error(
      fmt::format("{} has no backward(Tensor): call its own entry point", type_name()));
}

Tensor Module::call_forward(const Tensor& x) {
  run(pre_forward_);
  Tensor y = forward(x.as_float32(MemKind::Activations));
  run(post_forward_);
  return output_transform_ ? output_transform_(y) : y;
}

Tensor Module::call_backward(const Tensor& grad_out) {
  const Tensor g = grad_output_transform_ ? grad_output_transform_(grad_out) : grad_out;
  run(pre_backward_);
  Tensor dx = backward(g.as_float32(MemKind::Activations));
  run(post_backward_);
  return dx;
}

std::vector<Parameter*> Module::own_parameters() {
  std::vector<Parameter*> out;
  out.reserve(params_.size());
  for (auto& p : params_) out.push_back(p.get());
  return out;
}

namespace {
void collect_parameters(Module& m, const std::string& prefix,
                        std::vector<std::pair<std::string, Parameter*>>& out) {
  for (Parameter* p : m.own_parameters()) out.emplace_back(prefix + p->name, p);
  for (const auto& [name, child] : m.children())
    collect_parameters(*child, prefix + name + ".", out);
}

void collect_modules(Module& m, const std::string& path,
                     std::vector<std::pair<std::string, Module*>>& out) {
  out.emplace_back(path, &m);
  for (const auto& [name, child] : m.children())
    collect_modules(*child, path.empty() ? name : path + "." + name, out);
}
}  // namespace

std::vector<std::pair<std::string, Parameter*>> Module::named_parameters() {
  std::vector<std::pair<std::string, Parameter*>> out;
  collect_parameters(*this, "", out);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out;
  collect_modules(*this, "", out);
  return out;
}

void Module::zero_grad() {
  for (auto& [name, p] : named_parameters()) p->grad = Tensor();
}

Parameter& Module::register_parameter(std::string name, std::vector<int64_t> shape) {
  for (const auto& p : params_)
    WEFT_KIT_CHECK(p->name != name, "{}: parameter '{}' registered twice", type_name(), name);
  auto p = std::make_unique<Parameter>();
  p->name = std::move(name);
  p->shape = shape;
  p->data = Tensor::zeros(std::move(shape), DType::Float32, MemKind::Params);
  params_.push_back(std::move(p));
  return *params_.back();
}

void Module::register_module(std::string name, Module* child) {
  WEFT_KIT_CHECK(child != nullptr && child != this, "{}: bad child '{}'", type_name(), name);
  for (const auto& [n, c] : children_)
    WEFT_KIT_CHECK(n != name, "{}: child '{}' registered twice", type_name(), name);
  children_.emplace_back(std::move(name), child);
}

void Module::run(const std::vector<Hook>& hooks) {
  // By index: a hook may add hooks (an engine registering lazily), which may reallocate.
  for (size_t i = 0; i < hooks.size(); ++i) {
    const Hook hook = hooks[i];  // a copy: the vector may move under the call
    hook(*this);
  }
}

}  // namespace weft::kit
