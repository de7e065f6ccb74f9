// fsdp/kit/models.cc: GPT and MlpModel, their entry points and initialisation; see models.h.
#include "fsdp/kit/models.h"

#include <cmath>
#include <numbers>
#include <string>

#include "fsdp/kit/check.h"
#include "fsdp/kit/loss.h"
#include "fsdp/kit/ops.h"

namespace weft::kit {

namespace {
constexpr MemKind kAct = MemKind::Activations;
constexpr int32_t kGptIgnoreIndex = -1;  // nanoGPT's F.cross_entropy(..., ignore_index=-1)

Tensor ids_tensor(const std::vector<int32_t>& ids, std::vector<int64_t> shape) {
  Tensor t = Tensor::empty(std::move(shape), DType::Float32, kAct);
  for (size_t i = 0; i < ids.size(); ++i) t.f32()[i] = static_cast<float>(ids[i]);
  return t;
}
}  // namespace

// ---- GptTransformer ----

GptTransformer::GptTransformer(const GptConfig& config)
    : wte(config.vocab_size, config.n_embd),
      wpe(config.block_size, config.n_embd),
      ln_f(config.n_embd) {
  for (int64_t i = 0; i < config.n_layer; ++i) h.emplace_back<Block>(config.n_embd, config.n_head);
  register_module("wte", &wte);
  register_module("wpe", &wpe);
  register_module("h", &h);
  register_module("ln_f", &ln_f);
}

Tensor GptTransformer::forward(const Tensor& ids) {
  WEFT_KIT_CHECK(ids.defined() && ids.shape().size() == 2, "GptTransformer: ids {} are not [B, T]",
                 ids.describe());
  const int64_t B = ids.dim(0), T = ids.dim(1);
  std::vector<float> positions(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) positions[t] = static_cast<float>(t);
  Tensor x = wte.call_forward(ids).as_float32(kAct);  // [B, T, C]
  const Tensor pos = wpe.call_forward(Tensor::from({T}, positions, kAct)).as_float32(kAct);
  const int64_t tc = pos.numel();
  for (int64_t b = 0; b < B; ++b) ops::add(x.f32() + b * tc, pos.f32(), x.f32() + b * tc, tc);
  batch_ = B;
  return ln_f.call_forward(h.call_forward(x));
}

Tensor GptTransformer::backward(const Tensor& grad_out) {
  const Tensor dx = h.call_backward(ln_f.call_backward(grad_out));  // [B, T, C]
  // wpe's output was broadcast over B: its gradient is the sum over B.
  const int64_t tc = dx.numel() / batch_;
  Tensor dpos = Tensor::zeros({dx.dim(1), dx.dim(2)}, DType::Float32, kAct);
  for (int64_t b = 0; b < batch_; ++b) ops::add(dpos.f32(), dx.f32() + b * tc, dpos.f32(), tc);
  wpe.call_backward(dpos);  // reverse order of the forward: wpe, then wte
  wte.call_backward(dx);
  return Tensor();
}

// ---- GPT ----

GPT::GPT(const GptConfig& config)
    : transformer(config), lm_head(config.n_embd, config.vocab_size, false), config_(config) {
  register_module("transformer", &transformer);
  register_module("lm_head", &lm_head);
}

float GPT::forward_loss(const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets,
                        int B, int T) {
  WEFT_KIT_CHECK(B > 0 && T > 0 && T <= config_.block_size, "GPT: B = {}, T = {} (block_size {})",
                 B, T, config_.block_size);
  const size_t n = static_cast<size_t>(B) * static_cast<size_t>(T);
  WEFT_KIT_CHECK(tokens.size() == n && targets.size() == n,
                 "GPT: {} tokens and {} targets for B * T = {}", tokens.size(), targets.size(), n);
  run_pre_forward_hooks();
  const Tensor x = transformer.call_forward(ids_tensor(tokens, {B, T}));
  logits_ = lm_head.call_forward(x).as_float32(kAct);
  targets_ = targets;
  const float loss = cross_entropy(logits_, targets_, kGptIgnoreIndex);
  run_post_forward_hooks();
  return loss;
}

void GPT::backward_loss() {
  WEFT_KIT_CHECK(logits_.defined(), "GPT: backward_loss without a forward_loss before it");
  run_pre_backward_hooks();
  Tensor dlogits = cross_entropy_backward(logits_, targets_, 1.0f, kGptIgnoreIndex);
  logits_ = Tensor();
  transformer.call_backward(lm_head.call_backward(dlogits));
  run_post_backward_hooks();
}

// ---- MlpModel ----

MlpModel::MlpModel(std::vector<int64_t> dims) : dims_(std::move(dims)) {
  WEFT_KIT_CHECK(dims_.size() >= 2, "MlpModel: {} dims, need at least 2", dims_.size());
  for (size_t i = 0; i + 1 < dims_.size(); ++i) {
    if (i > 0) layers_.push_back(std::make_unique<GELU>());
    layers_.push_back(std::make_unique<Linear>(dims_[i], dims_[i + 1]));
  }
  for (size_t i = 0; i < layers_.size(); ++i) register_module(std::to_string(i), layers_[i].get());
}

Linear& MlpModel::linear(size_t i) { return dynamic_cast<Linear&>(*layers_.at(2 * i)); }

Tensor MlpModel::forward(const Tensor& x) {
  Tensor y = x;
  for (auto& m : layers_) y = m->call_forward(y);
  return y;
}

Tensor MlpModel::backward(const Tensor& grad_out) {
  Tensor g = grad_out;
  for (auto it = layers_.rbegin(); it != layers_.rend(); ++it) g = (*it)->call_backward(g);
  return g;
}

float MlpModel::forward_loss(const Tensor& x, const std::vector<int32_t>& targets) {
  run_pre_forward_hooks();
  logits_ = forward(x).as_float32(MemKind::Activations);
  targets_ = targets;
  const float loss = cross_entropy(logits_, targets_);
  run_post_forward_hooks();
  return loss;
}

void MlpModel::backward_loss() {
  WEFT_KIT_CHECK(logits_.defined(), "MlpModel: backward_loss without a forward_loss before it");
  run_pre_backward_hooks();
  Tensor dlogits = cross_entropy_backward(logits_, targets_);
  logits_ = Tensor();
  backward(dlogits);
  run_post_backward_hooks();
}

// ---- Initialisation ----

namespace {
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

void write_values(Parameter& p, const std::string& name, const std::vector<double>& values) {
  WEFT_KIT_CHECK(p.data.defined() && p.data.numel() == static_cast<int64_t>(values.size()),
                 "init: parameter '{}' has data {}, not its full shape (sharded?)", name,
                 p.data.describe());
  if (p.data.dtype() == DType::Float32) {
    for (size_t i = 0; i < values.size(); ++i) p.data.f32()[i] = static_cast<float>(values[i]);
  } else {
    for (size_t i = 0; i < values.size(); ++i)
      p.data.bf16()[i] = float_to_bf16(static_cast<float>(values[i]));
  }
}

void fill_normal(Parameter& p, const std::string& name, double std_dev, uint64_t seed) {
  uint64_t state = seed ^ fnv1a64(name);
  state = splitmix64(state);
  std::vector<double> values(static_cast<size_t>(p.data.numel()));
  for (size_t i = 0; i < values.size(); i += 2) {
    const double u1 = static_cast<double>((splitmix64(state) >> 11) + 1) * 0x1.0p-53;  // (0, 1]
    const double u2 = static_cast<double>(splitmix64(state) >> 11) * 0x1.0p-53;        // [0, 1)
    const double r = std::sqrt(-2.0 * std::log(u1)) * std_dev;
    const double theta = 2.0 * std::numbers::pi * u2;
    values[i] = r * std::cos(theta);
    if (i + 1 < values.size()) values[i + 1] = r * std::sin(theta);
  }
  write_values(p, name, values);
}

void fill_constant(Parameter& p, const std::string& name, double value) {
  write_values(p, name, std::vector<double>(static_cast<size_t>(p.data.numel()), value));
}

// nanoGPT's rule for every Linear, Embedding and LayerNorm under `model`.
void init_modules(Module& model, uint64_t seed, double c_proj_std) {
  constexpr double kStd = 0.02;
  for (auto& [path, m] : model.named_modules()) {
    const std::string type = m->type_name();
    const std::string prefix = path.empty() ? "" : path + ".";
    for (Parameter* p : m->own_parameters()) {
      const std::string name = prefix + p->name;
      if (type == "LayerNorm") {
        fill_constant(*p, name, p->name == "weight" ? 1.0 : 0.0);
      } else if (p->name == "bias") {
        fill_constant(*p, name, 0.0);
      } else {  // Linear and Embedding weights
        const bool c_proj = name.ends_with("c_proj.weight");
        fill_normal(*p, name, c_proj ? c_proj_std : kStd, seed);
      }
    }
  }
}
}  // namespace

void init_gpt(GPT& model, uint64_t seed) {
  init_modules(model, seed, 0.02 / std::sqrt(2.0 * static_cast<double>(model.config().n_layer)));
}

void init_mlp(MlpModel& model, uint64_t seed) { init_modules(model, seed, 0.02); }

}  // namespace weft::kit
