// fsdp/kit/layers.h: the layers a GPT is made of, shaped and named like PyTorch's (nanoGPT's).
//
//   Linear(in, out, bias)        weight [out, in], bias [out]; x [..., in] -> [..., out]
//   Embedding(num, dim)          weight [num, dim]; ids [...] -> [..., dim]
//   LayerNorm(dim, eps = 1e-5)   weight [dim] (ones), bias [dim]; x [..., dim] -> same shape
//   GELU                         erf form (PyTorch's approximate='none'); no parameters
//   CausalSelfAttention(C, nh)   c_attn Linear(C, 3C), c_proj Linear(C, C); x [B, T, C]
//   Mlp(C)                       c_fc Linear(C, 4C), gelu, c_proj Linear(4C, C)
//   Block(C, nh)                 x + attn(ln_1(x)), then x + mlp(ln_2(x))
//   ModuleList                   children "0", "1", ...; forward runs them in order
//
// Every layer follows module.h: forward keeps what its backward needs (released again by the
// backward), backward returns the input's gradient and adds into the parameters' .grad. Parents
// call children only through call_forward/call_backward, so every module's hooks fire: in
// forward in registration order (a parent's pre hooks before its children's, its post hooks
// after), in backward in the reverse order. Parameter data is read afresh through data_f32() in
// both forward and backward, since FSDP may swap it in between.
//
// Embedding takes its ids as a float32 tensor holding integers (exact up to 2^24), so it is
// called through the same call_forward(Tensor) as every module and its hooks fire; its backward
// returns an empty tensor (ids have no gradient). Dropout is left out (nanoGPT's default 0.0).
//
// All outputs, saved values and input gradients are MemKind::Activations.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "fsdp/kit/module.h"

namespace weft::kit {

class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  const char* type_name() const override { return "Linear"; }
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& grad_out) override;

  Parameter& weight() { return *weight_; }
  Parameter* bias() { return bias_; }  // null when built without
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }

 private:
  int64_t in_, out_;
  Parameter* weight_;
  Parameter* bias_ = nullptr;
  Tensor x_;  // saved input
};

class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim);
  const char* type_name() const override { return "Embedding"; }
  // ids: any shape, float32 holding integers in [0, num_embeddings).
  Tensor forward(const Tensor& ids) override;
  Tensor backward(const Tensor& grad_out) override;  // returns an empty tensor

  Parameter& weight() { return *weight_; }

 private:
  int64_t num_, dim_;
  Parameter* weight_;
  std::vector<int32_t> ids_;  // saved
};

class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, float eps = 1e-5f);
  const char* type_name() const override { return "LayerNorm"; }
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& grad_out) override;

  Parameter& weight() { return *weight_; }
  Parameter& bias() { return *bias_; }

 private:
  int64_t dim_;
  float eps_;
  Parameter* weight_;
  Parameter* bias_;
  Tensor x_, mean_, rstd_;  // saved
};

class GELU : public Module {
 public:
  const char* type_name() const override { return "GELU"; }
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& grad_out) override;

 private:
  Tensor x_;  // saved
};

// nanoGPT's CausalSelfAttention without dropout: qkv = c_attn(x) split into q, k, v of C each;
// head h uses columns [h*hd, (h+1)*hd) of each (hd = C / n_head); att = softmax(q k^T / sqrt(hd))
// with key s > query t masked; y = att v, heads concatenated, then c_proj.
class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(int64_t n_embd, int64_t n_head);
  const char* type_name() const override { return "CausalSelfAttention"; }
  Tensor forward(const Tensor& x) override;  // x [B, T, C]
  Tensor backward(const Tensor& grad_out) override;

  Linear c_attn;
  Linear c_proj;

 private:
  int64_t n_embd_, n_head_;
  Tensor qkv_;  // saved: [B, T, 3C]
  Tensor att_;  // saved: [B, n_head, T, T], softmax probabilities (masked entries 0)
};

class Mlp : public Module {
 public:
  explicit Mlp(int64_t n_embd);
  const char* type_name() const override { return "MLP"; }
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& grad_out) override;

  Linear c_fc;
  GELU gelu;
  Linear c_proj;
};

class Block : public Module {
 public:
  Block(int64_t n_embd, int64_t n_head);
  const char* type_name() const override { return "Block"; }
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& grad_out) override;

  LayerNorm ln_1;
  CausalSelfAttention attn;
  LayerNorm ln_2;
  Mlp mlp;
};

// Owns its children, named by position. forward runs them in order (nn.Sequential's behaviour,
// which nanoGPT's loop over transformer.h is), backward in reverse.
class ModuleList : public Module {
 public:
  const char* type_name() const override { return "ModuleList"; }
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& grad_out) override;

  template <typename M, typename... Args>
  M& emplace_back(Args&&... args) {
    auto m = std::make_unique<M>(std::forward<Args>(args)...);
    M& ref = *m;
    append(std::move(m));
    return ref;
  }
  void append(std::unique_ptr<Module> m);
  size_t size() const { return modules_.size(); }
  Module& operator[](size_t i) { return *modules_.at(i); }
  template <typename M>
  M& at(size_t i) {
    return dynamic_cast<M&>(*modules_.at(i));
  }

 private:
  std::vector<std::unique_ptr<Module>> modules_;
};

}  // namespace weft::kit
