// fsdp/kit/layers.h: every layer's input and parameter gradients against central finite
// differences, and attention's forward against a naive loop written here.
#include "fsdp/kit/layers.h"

#include <cmath>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/fsdp/kit/gradcheck.h"

namespace weft::kit {
namespace {

using test::check_module;
using test::randn;

// Every parameter of `m` random normal with `std_dev`; LayerNorm weights around 1.
void randomize(Module& m, std::mt19937& rng, float std_dev) {
  for (auto& [path, mod] : m.named_modules()) {
    const bool ln = std::string(mod->type_name()) == "LayerNorm";
    for (Parameter* p : mod->own_parameters()) {
      const Tensor r =
          randn(p->shape, rng, ln ? 0.3f : std_dev, ln && p->name == "weight" ? 1.0f : 0.0f);
      std::copy(r.f32(), r.f32() + r.numel(), p->data.f32());
    }
  }
}

TEST_CASE("Linear's gradients match finite differences, with and without bias", "[kit][layers]") {
  std::mt19937 rng(10);
  Linear with_bias(5, 3);
  randomize(with_bias, rng, 0.5f);
  CHECK(check_module(with_bias, randn({2, 4, 5}, rng), rng) == 0);
  Linear no_bias(4, 6, false);
  randomize(no_bias, rng, 0.5f);
  CHECK(no_bias.bias() == nullptr);
  CHECK(no_bias.named_parameters().size() == 1);
  CHECK(check_module(no_bias, randn({3, 4}, rng), rng) == 0);
}

TEST_CASE("Linear computes x w^T + b", "[kit][layers]") {
  Linear lin(2, 3);
  std::vector<float> w = {1, 2, 3, 4, 5, 6}, b = {0.5f, -1, 0};
  std::copy(w.begin(), w.end(), lin.weight().data.f32());
  std::copy(b.begin(), b.end(), lin.bias()->data.f32());
  const Tensor y = lin.call_forward(Tensor::from({1, 2}, {1, -1}, MemKind::Other));
  CHECK(y.shape() == std::vector<int64_t>{1, 3});
  CHECK(y.to_vector() == std::vector<float>{-0.5f, -2, -1});
}

TEST_CASE("Embedding's weight gradient matches finite differences with repeated ids",
          "[kit][layers]") {
  std::mt19937 rng(11);
  Embedding emb(7, 3);
  randomize(emb, rng, 1.0f);
  const Tensor ids = Tensor::from({2, 4}, {2, 4, 2, 6, 0, 0, 5, 2}, MemKind::Other);
  const Tensor y = emb.call_forward(ids);
  CHECK(y.shape() == std::vector<int64_t>{2, 4, 3});
  CHECK(y.item(3 * 3 + 1) == emb.weight().data.item(6 * 3 + 1));
  CHECK(check_module(emb, ids, rng) == 0);
  CHECK(emb.weight().grad.item(3 * 3) == 0.0f);  // id 3 unused
  CHECK_THROWS_AS(emb.call_forward(Tensor::from({1}, {7}, MemKind::Other)), std::invalid_argument);
  CHECK_THROWS_AS(emb.call_forward(Tensor::from({1}, {1.5f}, MemKind::Other)),
                  std::invalid_argument);
}

TEST_CASE("LayerNorm's gradients match finite differences", "[kit][layers]") {
  std::mt19937 rng(12);
  LayerNorm ln(6);
  CHECK(ln.weight().data.to_vector() == std::vector<float>(6, 1.0f));  // PyTorch's init
  CHECK(ln.bias().data.to_vector() == std::vector<float>(6, 0.0f));
  randomize(ln, rng, 0.0f);
  CHECK(check_module(ln, randn({4, 6}, rng, 2.0f, 0.5f), rng) == 0);
}

TEST_CASE("GELU's gradient matches finite differences", "[kit][layers]") {
  std::mt19937 rng(13);
  GELU gelu;
  CHECK(check_module(gelu, randn({3, 5}, rng, 2.0f), rng, {}, 100) == 0);
}

// nanoGPT's attention written as plain loops over b, t, h, s, in double.
std::vector<double> naive_attention(CausalSelfAttention& attn, const Tensor& x, int64_t nh) {
  const int64_t B = x.dim(0), T = x.dim(1), C = x.dim(2), hd = C / nh;
  const Tensor wa = attn.c_attn.weight().data, ba = attn.c_attn.bias()->data;
  const Tensor wp = attn.c_proj.weight().data, bp = attn.c_proj.bias()->data;
  std::vector<double> qkv(B * T * 3 * C), y(B * T * C), out(B * T * C);
  for (int64_t r = 0; r < B * T; ++r)
    for (int64_t o = 0; o < 3 * C; ++o) {
      double s = ba.item(o);
      for (int64_t i = 0; i < C; ++i) s += double{x.item(r * C + i)} * wa.item(o * C + i);
      qkv[r * 3 * C + o] = s;
    }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < nh; ++h)
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> p(T, 0.0);
        double mx = -1e300, sum = 0;
        for (int64_t s = 0; s <= t; ++s) {
          double dotqk = 0;
          for (int64_t d = 0; d < hd; ++d)
            dotqk +=
                qkv[(b * T + t) * 3 * C + h * hd + d] * qkv[(b * T + s) * 3 * C + C + h * hd + d];
          p[s] = dotqk / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, p[s]);
        }
        for (int64_t s = 0; s <= t; ++s) sum += (p[s] = std::exp(p[s] - mx));
        for (int64_t d = 0; d < hd; ++d) {
          double acc = 0;
          for (int64_t s = 0; s <= t; ++s)
            acc += p[s] / sum * qkv[(b * T + s) * 3 * C + 2 * C + h * hd + d];
          y[(b * T + t) * C + h * hd + d] = acc;
        }
      }
  for (int64_t r = 0; r < B * T; ++r)
    for (int64_t o = 0; o < C; ++o) {
      double s = bp.item(o);
      for (int64_t i = 0; i < C; ++i) s += y[r * C + i] * wp.item(o * C + i);
      out[r * C + o] = s;
    }
  return out;
}

TEST_CASE("causal attention with one head and with two matches a naive loop", "[kit][layers]") {
  std::mt19937 rng(14);
  for (int64_t nh : {1, 2}) {
    CausalSelfAttention attn(4, nh);
    randomize(attn, rng, 0.7f);
    const Tensor x = randn({2, 5, 4}, rng);
    const Tensor y = attn.call_forward(x);
    REQUIRE(y.shape() == x.shape());
    const std::vector<double> expect = naive_attention(attn, x, nh);
    for (int64_t i = 0; i < y.numel(); ++i) {
      INFO("n_head " << nh << " element " << i);
      CHECK_THAT(y.item(i), Catch::Matchers::WithinAbs(expect[i], 1e-5));
    }
  }
}

TEST_CASE("causal attention's first position attends only to itself", "[kit][layers]") {
  // One head, C = 2, c_attn = [I; I; I] (q = k = v = x), c_proj = I, no biases: position 0's
  // output is its own input, position 1's a softmax-weighted mix of positions 0 and 1.
  CausalSelfAttention attn(2, 1);
  const std::vector<float> eye3 = {1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1};
  std::copy(eye3.begin(), eye3.end(), attn.c_attn.weight().data.f32());
  const std::vector<float> eye = {1, 0, 0, 1};
  std::copy(eye.begin(), eye.end(), attn.c_proj.weight().data.f32());
  const Tensor x = Tensor::from({1, 2, 2}, {1, 0, 0, 2}, MemKind::Other);
  const Tensor y = attn.call_forward(x);
  CHECK(y.item(0) == 1.0f);
  CHECK(y.item(1) == 0.0f);
  // Position 1: scores q1.k0 / sqrt 2 = 0, q1.k1 / sqrt 2 = 4 / sqrt 2.
  const double w1 = 1.0 / (1.0 + std::exp(-4.0 / std::sqrt(2.0)));
  CHECK_THAT(y.item(2), Catch::Matchers::WithinAbs(1 - w1, 1e-6));
  CHECK_THAT(y.item(3), Catch::Matchers::WithinAbs(2 * w1, 1e-6));
}

TEST_CASE("CausalSelfAttention's gradients match finite differences", "[kit][layers]") {
  std::mt19937 rng(15);
  CausalSelfAttention attn(8, 2);
  randomize(attn, rng, 0.4f);
  CHECK(check_module(attn, randn({2, 5, 8}, rng), rng) == 0);
}

TEST_CASE("Mlp's gradients match finite differences", "[kit][layers]") {
  std::mt19937 rng(16);
  Mlp mlp(4);
  randomize(mlp, rng, 0.5f);
  CHECK(mlp.children().size() == 3);
  CHECK(check_module(mlp, randn({2, 3, 4}, rng), rng) == 0);
}

TEST_CASE("Block's gradients match finite differences", "[kit][layers]") {
  std::mt19937 rng(17);
  Block block(8, 2);
  randomize(block, rng, 0.4f);
  CHECK(check_module(block, randn({2, 4, 8}, rng), rng, {}, 25) == 0);
}

TEST_CASE("ModuleList runs its children in order and names them by position", "[kit][layers]") {
  std::mt19937 rng(18);
  ModuleList list;
  list.emplace_back<Linear>(3, 4);
  list.emplace_back<GELU>();
  list.emplace_back<Linear>(4, 2);
  randomize(list, rng, 0.6f);
  REQUIRE(list.size() == 3);
  CHECK(list.children()[2].first == "2");
  CHECK(list.named_parameters()[2].first == "2.weight");
  CHECK(&list.at<Linear>(2) == list.children()[2].second);
  CHECK(check_module(list, randn({5, 3}, rng), rng) == 0);
}

TEST_CASE("backward without a forward is refused, and a wrong input shape too", "[kit][layers]") {
  Linear lin(3, 2);
  CHECK_THROWS_AS(lin.call_backward(Tensor::zeros({1, 2}, DType::Float32, MemKind::Other)),
                  std::invalid_argument);
  CHECK_THROWS_AS(lin.call_forward(Tensor::zeros({1, 4}, DType::Float32, MemKind::Other)),
                  std::invalid_argument);
  GELU g;
  CHECK_THROWS_AS(g.call_backward(Tensor::zeros({1}, DType::Float32, MemKind::Other)),
                  std::invalid_argument);
}

}  // namespace
}  // namespace weft::kit
