// fsdp/kit/models.h: the models the FSDP engine is tested on: an MLP and nanoGPT's GPT.
//
// GPT has nanoGPT's module tree and parameter names, so named_parameters() is, in order, the
// keys of nanoGPT's state_dict (without the causal-mask buffers, which are not parameters):
//
//   transformer.wte.weight [V, C]            transformer.h.{i}.attn.c_proj.{weight [C, C], bias}
//   transformer.wpe.weight [block_size, C]   transformer.h.{i}.ln_2.{weight, bias} [C]
//   transformer.h.{i}.ln_1.{weight, bias}    transformer.h.{i}.mlp.c_fc.{weight [4C, C], bias}
//   transformer.h.{i}.attn.c_attn.weight [3C, C], .bias [3C]
//   transformer.h.{i}.mlp.c_proj.{weight [C, 4C], bias [C]}
//   transformer.ln_f.{weight, bias} [C]      lm_head.weight [V, C] (no bias; NOT tied to wte)
//
// Entry points compute the mean cross-entropy (forward_loss) and the whole backward into every
// parameter's .grad (backward_loss). They run the model's own hooks around themselves (pre
// forward first thing in forward_loss, post forward last, the same for backward) and call every
// child through call_forward/call_backward, so every module's hooks fire: in forward in
// named_modules() order, in backward in the reverse order. No dropout (nanoGPT's default).
//
// Initialisation (init_gpt, init_mlp) is nanoGPT's _init_weights rule from a deterministic RNG
// that does not match PyTorch's (weights that must match come from a safetensors file). Each
// parameter draws from its own stream, so its values depend only on the seed and its name:
// SplitMix64 seeded with SplitMix64(seed XOR FNV-1a-64(full name)); normals by Box-Muller on
// two 53-bit uniforms (u1 in (0, 1]), both values of a pair used, cos first, computed in double
// and rounded to the parameter's dtype.
//
// Thread safety: none (module.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "fsdp/kit/layers.h"
#include "fsdp/kit/module.h"

namespace weft::kit {

struct GptConfig {
  int64_t vocab_size = 50304;  // nanoGPT's GPTConfig defaults: GPT-2 small, vocab padded to 64
  int64_t block_size = 1024;
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_embd = 768;
};

// nanoGPT's `transformer` ModuleDict, with a forward: ids [B, T] (float32 holding token ids)
// -> ln_f(h(wte(ids) + wpe(0..T-1))) [B, T, C]. Its backward returns an empty tensor.
class GptTransformer : public Module {
 public:
  explicit GptTransformer(const GptConfig& config);
  const char* type_name() const override { return "GptTransformer"; }
  Tensor forward(const Tensor& ids) override;
  Tensor backward(const Tensor& grad_out) override;

  Embedding wte;
  Embedding wpe;
  ModuleList h;  // Blocks
  LayerNorm ln_f;

  Block& block(size_t i) { return h.at<Block>(i); }

 private:
  int64_t batch_ = 0;  // saved: B of the forward, to sum wpe's gradient over it
};

class GPT : public Module {
 public:
  explicit GPT(const GptConfig& config);
  const char* type_name() const override { return "GPT"; }

  // tokens, targets: B * T ids each, row-major [B, T]; REQUIRES T <= block_size, tokens in
  // [0, vocab_size), targets in [0, vocab_size) or -1 (ignored, as nanoGPT's ignore_index).
  float forward_loss(const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets, int B,
                     int T);
  // The backward of the last forward_loss, adding into .grad; releases what it kept.
  void backward_loss();
  // Logits [B, T, V] of the last forward_loss, until backward_loss.
  const Tensor& logits() const { return logits_; }
  const GptConfig& config() const { return config_; }

  GptTransformer transformer;
  Linear lm_head;

 private:
  GptConfig config_;
  Tensor logits_;
  std::vector<int32_t> targets_;
};

// Linear(dims[0], dims[1]), GELU, Linear(dims[1], dims[2]), GELU, ..., Linear(.., dims.back()),
// as an nn.Sequential: children "0", "1", ..., so parameters are "0.weight", "0.bias",
// "2.weight", ... REQUIRES dims.size() >= 2.
class MlpModel : public Module {
 public:
  explicit MlpModel(std::vector<int64_t> dims);
  const char* type_name() const override { return "MlpModel"; }
  // x [N, dims[0]] (or [..., dims[0]]) -> logits [..., dims.back()], children in order.
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& grad_out) override;

  // Mean cross-entropy of forward(x) against targets (one per row, in [0, dims.back())).
  float forward_loss(const Tensor& x, const std::vector<int32_t>& targets);
  void backward_loss();
  const Tensor& logits() const { return logits_; }
  const std::vector<int64_t>& dims() const { return dims_; }
  // The i-th Linear (0 .. dims.size() - 2).
  Linear& linear(size_t i);

 private:
  std::vector<int64_t> dims_;
  std::vector<std::unique_ptr<Module>> layers_;
  Tensor logits_;
  std::vector<int32_t> targets_;
};

// nanoGPT's _init_weights: Linear and Embedding weights normal(0, 0.02), biases 0, LayerNorm
// weight 1 and bias 0, then every "c_proj.weight" normal(0, 0.02 / sqrt(2 * n_layer)).
// REQUIRES every parameter's data is defined (initialise before sharding).
void init_gpt(GPT& model, uint64_t seed);
// The same rule for an MlpModel: Linear weights normal(0, 0.02), biases 0.
void init_mlp(MlpModel& model, uint64_t seed);

}  // namespace weft::kit
