// fsdp/kit/layers.cc: forward and backward of each layer; see layers.h.
#include "fsdp/kit/layers.h"

#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "fsdp/kit/check.h"
#include "fsdp/kit/ops.h"

namespace weft::kit {

namespace {
constexpr MemKind kAct = MemKind::Activations;

// x's rows for a layer whose last dimension must be `width`.
int64_t rows_of(const Tensor& x, int64_t width, const char* layer) {
  WEFT_KIT_CHECK(
      x.defined() && x.dtype() == DType::Float32 && !x.shape().empty() && x.dim(-1) == width,
      "{}: input {} is not float32 [..., {}]", layer, x.describe(), width);
  return x.numel() / width;
}

void check_grad_shape(const Tensor& grad, const std::vector<int64_t>& shape, const char* layer) {
  WEFT_KIT_CHECK(grad.defined() && grad.dtype() == DType::Float32 && grad.shape() == shape,
                 "{}: grad_out {} does not match the output float32[{}]", layer, grad.describe(),
                 fmt::join(shape, ", "));
}

void check_saved(const Tensor& saved, const char* layer) {
  WEFT_KIT_CHECK(saved.defined(), "{}: backward without a forward before it", layer);
}

std::vector<int64_t> with_last(std::vector<int64_t> shape, int64_t last) {
  shape.back() = last;
  return shape;
}
}  // namespace

// ---- Linear ----

Linear::Linear(int64_t in_features, int64_t out_features, bool bias)
    : in_(in_features), out_(out_features) {
  weight_ = &register_parameter("weight", {out_features, in_features});
  if (bias) bias_ = &register_parameter("bias", {out_features});
}

Tensor Linear::forward(const Tensor& x) {
  const int64_t rows = rows_of(x, in_, "Linear");
  const Tensor w = weight_->data_f32();
  Tensor y = Tensor::empty(with_last(x.shape(), out_), DType::Float32, kAct);
  // y = x w^T: [rows, in] x [in, out].
  ops::gemm(false, true, rows, out_, in_, 1.0f, x.f32(), in_, w.f32(), in_, 0.0f, y.f32(), out_);
  if (bias_ != nullptr) ops::add_bias(y.f32(), bias_->data_f32().f32(), rows, out_);
  x_ = x;
  return y;
}

Tensor Linear::backward(const Tensor& grad_out) {
  check_saved(x_, "Linear");
  check_grad_shape(grad_out, with_last(x_.shape(), out_), "Linear");
  const int64_t rows = x_.numel() / in_;
  const Tensor w = weight_->data_f32();
  Tensor dx = Tensor::empty(x_.shape(), DType::Float32, kAct);
  // dx = dy w: [rows, out] x [out, in]; dw += dy^T x: [out, rows] x [rows, in].
  ops::gemm(false, false, rows, in_, out_, 1.0f, grad_out.f32(), out_, w.f32(), in_, 0.0f, dx.f32(),
            in_);
  ops::gemm(true, false, out_, in_, rows, 1.0f, grad_out.f32(), out_, x_.f32(), in_, 1.0f,
            weight_->grad_for_accumulate().f32(), in_);
  if (bias_ != nullptr)
    ops::sum_rows_into(grad_out.f32(), bias_->grad_for_accumulate().f32(), rows, out_);
  x_ = Tensor();
  return dx;
}

// ---- Embedding ----

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim)
    : num_(num_embeddings), dim_(embedding_dim) {
  // Ids arrive as float32 values, exact only up to 2^24.
  WEFT_KIT_CHECK(num_embeddings <= (int64_t{1} << 24),
                 "Embedding: {} ids cannot all be held exactly as float32 (at most 2^24)",
                 num_embeddings);
  weight_ = &register_parameter("weight", {num_embeddings, embedding_dim});
}

Tensor Embedding::forward(const Tensor& ids) {
  WEFT_KIT_CHECK(ids.defined() && ids.dtype() == DType::Float32,
                 "Embedding: ids {} are not float32", ids.describe());
  const int64_t n = ids.numel();
  std::vector<int32_t> idx(static_cast<size_t>(n));
  const float* in = ids.f32();
  for (int64_t i = 0; i < n; ++i) {
    const float v = in[i];
    WEFT_KIT_CHECK(v >= 0.0f && v < static_cast<float>(num_) && v == std::floor(v),
                   "Embedding({}, {}): id {} at {} is not an integer in [0, {})", num_, dim_, v, i,
                   num_);
    idx[i] = static_cast<int32_t>(v);
  }
  std::vector<int64_t> shape = ids.shape();
  shape.push_back(dim_);
  Tensor out = Tensor::empty(std::move(shape), DType::Float32, kAct);
  ops::embedding(weight_->data_f32().f32(), idx.data(), out.f32(), n, dim_);
  ids_ = std::move(idx);
  return out;
}

Tensor Embedding::backward(const Tensor& grad_out) {
  const int64_t n = static_cast<int64_t>(ids_.size());
  WEFT_KIT_CHECK(grad_out.defined() && grad_out.dtype() == DType::Float32 &&
                     grad_out.numel() == n * dim_ && grad_out.dim(-1) == dim_,
                 "Embedding: grad_out {} does not match {} ids of dim {}", grad_out.describe(), n,
                 dim_);
  ops::embedding_backward(grad_out.f32(), ids_.data(), weight_->grad_for_accumulate().f32(), n,
                          dim_);
  ids_.clear();
  return Tensor();
}

// ---- LayerNorm ----

LayerNorm::LayerNorm(int64_t dim, float eps) : dim_(dim), eps_(eps) {
  weight_ = &register_parameter("weight", {dim});
  bias_ = &register_parameter("bias", {dim});
  weight_->data.fill(1.0f);  // PyTorch's reset_parameters: ones and zeros
}

Tensor LayerNorm::forward(const Tensor& x) {
  const int64_t rows = rows_of(x, dim_, "LayerNorm");
  Tensor y = Tensor::empty(x.shape(), DType::Float32, kAct);
  mean_ = Tensor::empty({rows}, DType::Float32, kAct);
  rstd_ = Tensor::empty({rows}, DType::Float32, kAct);
  ops::layer_norm(x.f32(), weight_->data_f32().f32(), bias_->data_f32().f32(), y.f32(), mean_.f32(),
                  rstd_.f32(), rows, dim_, eps_);
  x_ = x;
  return y;
}

Tensor LayerNorm::backward(const Tensor& grad_out) {
  check_saved(x_, "LayerNorm");
  check_grad_shape(grad_out, x_.shape(), "LayerNorm");
  const int64_t rows = x_.numel() / dim_;
  Tensor dx = Tensor::empty(x_.shape(), DType::Float32, kAct);
  ops::layer_norm_backward(x_.f32(), weight_->data_f32().f32(), mean_.f32(), rstd_.f32(),
                           grad_out.f32(), dx.f32(), weight_->grad_for_accumulate().f32(),
                           bias_->grad_for_accumulate().f32(), rows, dim_);
  x_ = mean_ = rstd_ = Tensor();
  return dx;
}

// ---- GELU ----

Tensor GELU::forward(const Tensor& x) {
  WEFT_KIT_CHECK(x.defined() && x.dtype() == DType::Float32, "GELU: input {} is not float32",
                 x.describe());
  Tensor y = Tensor::empty(x.shape(), DType::Float32, kAct);
  ops::gelu(x.f32(), y.f32(), x.numel());
  x_ = x;
  return y;
}

Tensor GELU::backward(const Tensor& grad_out) {
  check_saved(x_, "GELU");
  check_grad_shape(grad_out, x_.shape(), "GELU");
  Tensor dx = Tensor::empty(x_.shape(), DType::Float32, kAct);
  ops::gelu_backward(x_.f32(), grad_out.f32(), dx.f32(), x_.numel());
  x_ = Tensor();
  return dx;
}

// ---- CausalSelfAttention ----

CausalSelfAttention::CausalSelfAttention(int64_t n_embd, int64_t n_head)
    : c_attn(n_embd, 3 * n_embd), c_proj(n_embd, n_embd), n_embd_(n_embd), n_head_(n_head) {
  WEFT_KIT_CHECK(n_head > 0 && n_embd % n_head == 0,
                 "CausalSelfAttention: n_embd {} is not a multiple of n_head {}", n_embd, n_head);
  register_module("c_attn", &c_attn);
  register_module("c_proj", &c_proj);
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  WEFT_KIT_CHECK(x.defined() && x.shape().size() == 3 && x.dim(2) == n_embd_,
                 "CausalSelfAttention: input {} is not [B, T, {}]", x.describe(), n_embd_);
  const int64_t B = x.dim(0), T = x.dim(1), C = n_embd_, nh = n_head_, hd = C / nh;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  Tensor qkv = c_attn.call_forward(x);
  Tensor att = Tensor::empty({B, nh, T, T}, DType::Float32, kAct);
  Tensor y = Tensor::empty({B, T, C}, DType::Float32, kAct);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < nh; ++h) {
      // Head h's q, k, v are column blocks of qkv's rows (stride 3C): no copies.
      const float* q = qkv.f32() + b * T * 3 * C + h * hd;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* a = att.f32() + (b * nh + h) * T * T;
      ops::gemm(false, true, T, T, hd, scale, q, 3 * C, k, 3 * C, 0.0f, a, T);
      ops::causal_softmax(a, T);
      ops::gemm(false, false, T, hd, T, 1.0f, a, T, v, 3 * C, 0.0f, y.f32() + b * T * C + h * hd,
                C);
    }
  }
  qkv_ = std::move(qkv);
  att_ = std::move(att);
  return c_proj.call_forward(y);
}

Tensor CausalSelfAttention::backward(const Tensor& grad_out) {
  check_saved(qkv_, "CausalSelfAttention");
  const int64_t B = qkv_.dim(0), T = qkv_.dim(1), C = n_embd_, nh = n_head_, hd = C / nh;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const Tensor dy = c_proj.call_backward(grad_out);  // [B, T, C], heads side by side
  Tensor dqkv = Tensor::empty({B, T, 3 * C}, DType::Float32, kAct);
  Tensor ds = Tensor::empty({T, T}, DType::Float32, kAct);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t head = b * T * 3 * C + h * hd;
      const float* q = qkv_.f32() + head;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* dq = dqkv.f32() + head;
      float* dk = dq + C;
      float* dv = dq + 2 * C;
      const float* a = att_.f32() + (b * nh + h) * T * T;
      const float* dyh = dy.f32() + b * T * C + h * hd;
      // y = a v: da = dy v^T, dv = a^T dy.
      ops::gemm(false, true, T, T, hd, 1.0f, dyh, C, v, 3 * C, 0.0f, ds.f32(), T);
      ops::gemm(true, false, T, hd, T, 1.0f, a, T, dyh, C, 0.0f, dv, 3 * C);
      // Through the softmax; masked entries have a = 0 and so get 0.
      ops::softmax_rows_backward(a, ds.f32(), ds.f32(), T, T);
      // s = scale q k^T: dq = scale ds k, dk = scale ds^T q.
      ops::gemm(false, false, T, hd, T, scale, ds.f32(), T, k, 3 * C, 0.0f, dq, 3 * C);
      ops::gemm(true, false, T, hd, T, scale, ds.f32(), T, q, 3 * C, 0.0f, dk, 3 * C);
    }
  }
  qkv_ = att_ = Tensor();
  return c_attn.call_backward(dqkv);
}

// ---- Mlp ----

Mlp::Mlp(int64_t n_embd) : c_fc(n_embd, 4 * n_embd), c_proj(4 * n_embd, n_embd) {
  register_module("c_fc", &c_fc);
  register_module("gelu", &gelu);
  register_module("c_proj", &c_proj);
}

Tensor Mlp::forward(const Tensor& x) {
  return c_proj.call_forward(gelu.call_forward(c_fc.call_forward(x)));
}

Tensor Mlp::backward(const Tensor& grad_out) {
  return c_fc.call_backward(gelu.call_backward(c_proj.call_backward(grad_out)));
}

// ---- Block ----

Block::Block(int64_t n_embd, int64_t n_head)
    : ln_1(n_embd), attn(n_embd, n_head), ln_2(n_embd), mlp(n_embd) {
  register_module("ln_1", &ln_1);
  register_module("attn", &attn);
  register_module("ln_2", &ln_2);
  register_module("mlp", &mlp);
}

Tensor Block::forward(const Tensor& x) {
  Tensor x1 = Tensor::empty(x.shape(), DType::Float32, kAct);
  const Tensor a = attn.call_forward(ln_1.call_forward(x));
  ops::add(x.f32(), a.f32(), x1.f32(), x.numel());
  const Tensor m = mlp.call_forward(ln_2.call_forward(x1));
  Tensor out = Tensor::empty(x.shape(), DType::Float32, kAct);
  ops::add(x1.f32(), m.f32(), out.f32(), x.numel());
  return out;
}

Tensor Block::backward(const Tensor& grad_out) {
  // out = x1 + mlp(ln_2(x1)), x1 = x + attn(ln_1(x)): each residual adds the branch's gradient.
  const int64_t n = grad_out.numel();
  Tensor dx1 = ln_2.call_backward(mlp.call_backward(grad_out));
  ops::add(dx1.f32(), grad_out.f32(), dx1.f32(), n);
  Tensor dx = ln_1.call_backward(attn.call_backward(dx1));
  ops::add(dx.f32(), dx1.f32(), dx.f32(), n);
  return dx;
}

// ---- ModuleList ----

void ModuleList::append(std::unique_ptr<Module> m) {
  register_module(std::to_string(modules_.size()), m.get());
  modules_.push_back(std::move(m));
}

Tensor ModuleList::forward(const Tensor& x) {
  Tensor y = x;
  for (auto& m : modules_) y = m->call_forward(y);
  return y;
}

Tensor ModuleList::backward(const Tensor& grad_out) {
  Tensor g = grad_out;
  for (auto it = modules_.rbegin(); it != modules_.rend(); ++it) g = (*it)->call_backward(g);
  return g;
}

}  // namespace weft::kit
