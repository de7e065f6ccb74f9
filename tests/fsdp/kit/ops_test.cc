// fsdp/kit/ops.h and loss.h against values computed by hand or by naive loops in this file.
#include "fsdp/kit/ops.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "fsdp/kit/loss.h"
#include "tests/fsdp/kit/gradcheck.h"

namespace weft::kit {
namespace {

using Catch::Matchers::WithinAbs;
using Catch::Matchers::WithinRel;

TEST_CASE("gemm with each transpose and leading dimensions matches a naive triple loop",
          "[kit][ops]") {
  std::mt19937 rng(1);
  const int64_t m = 5, n = 7, k = 3;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      // A stored [m, k] (or [k, m]) inside rows of width lda = its width + 2.
      const int64_t a_rows = ta ? k : m, a_cols = ta ? m : k, lda = a_cols + 2;
      const int64_t b_rows = tb ? n : k, b_cols = tb ? k : n, ldb = b_cols + 1;
      const Tensor a = test::randn({a_rows * lda}, rng);
      const Tensor b = test::randn({b_rows * ldb}, rng);
      Tensor c = test::randn({m * (n + 3)}, rng);
      const Tensor c0 = c.clone(MemKind::Other);
      ops::gemm(ta, tb, m, n, k, 0.5f, a.f32(), lda, b.f32(), ldb, 2.0f, c.f32(), n + 3);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (int64_t p = 0; p < k; ++p) {
            const float av = ta ? a.f32()[p * lda + i] : a.f32()[i * lda + p];
            const float bv = tb ? b.f32()[j * ldb + p] : b.f32()[p * ldb + j];
            s += static_cast<double>(av) * bv;
          }
          const double expect = 0.5 * s + 2.0 * c0.f32()[i * (n + 3) + j];
          INFO("trans_a " << ta << " trans_b " << tb << " at " << i << "," << j);
          CHECK_THAT(c.f32()[i * (n + 3) + j], WithinAbs(expect, 1e-5));
        }
      }
      // Columns past n are untouched.
      CHECK(c.f32()[n] == c0.f32()[n]);
    }
  }
}

TEST_CASE("GELU at known points is x * Phi(x)", "[kit][ops]") {
  // x * Phi(x) with Phi from tables of the normal distribution (20 digits).
  const std::vector<float> x = {0.0f, 1.0f, -1.0f, 2.0f, -3.0f, 0.5f};
  const std::vector<double> expect = {0.0,
                                      0.84134474606854293,
                                      -0.15865525393145707,
                                      1.9544997361036416,
                                      -0.0040496940948903,
                                      0.34573123063700655};
  std::vector<float> y(x.size());
  ops::gelu(x.data(), y.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    INFO("x = " << x[i]);
    CHECK_THAT(y[i], WithinAbs(expect[i], 2e-7));
  }
  // Derivative at 0 is 1/2, at 1 is Phi(1) + phi(1).
  const std::vector<float> pts = {0.0f, 1.0f};
  const std::vector<float> ones = {1.0f, 1.0f};
  std::vector<float> d(2);
  ops::gelu_backward(pts.data(), ones.data(), d.data(), 2);
  CHECK_THAT(d[0], WithinAbs(0.5, 1e-7));
  CHECK_THAT(d[1], WithinAbs(0.84134474606854293 + 0.24197072451914337, 1e-6));
}

TEST_CASE("LayerNorm of [1, 2, 3, 4] uses the biased variance and eps", "[kit][ops]") {
  const std::vector<float> x = {1, 2, 3, 4, 10, 10, 10, 10};
  const std::vector<float> w = {1, 1, 2, 1}, b = {0, 0, 0, 1};
  std::vector<float> y(8), mean(2), rstd(2);
  ops::layer_norm(x.data(), w.data(), b.data(), y.data(), mean.data(), rstd.data(), 2, 4, 1e-5f);
  const double rs = 1.0 / std::sqrt(1.25 + 1e-5);  // mean 2.5, variance 5/4
  CHECK_THAT(mean[0], WithinAbs(2.5, 1e-7));
  CHECK_THAT(rstd[0], WithinRel(rs, 1e-6));
  CHECK_THAT(y[0], WithinAbs(-1.5 * rs, 1e-6));
  CHECK_THAT(y[1], WithinAbs(-0.5 * rs, 1e-6));
  CHECK_THAT(y[2], WithinAbs(2 * 0.5 * rs, 1e-6));
  CHECK_THAT(y[3], WithinAbs(1.5 * rs + 1, 1e-6));
  // A constant row normalises to the bias: variance 0, rstd = 1/sqrt(eps).
  CHECK_THAT(rstd[1], WithinRel(1.0 / std::sqrt(1e-5), 1e-5));
  CHECK(y[4] == 0.0f);
  CHECK(y[7] == 1.0f);
}

TEST_CASE("softmax of [1, 2, 3] and of rows with large values", "[kit][ops]") {
  const std::vector<float> x = {1, 2, 3, 1000, 1001, 1002};
  std::vector<float> y(6);
  ops::softmax_rows(x.data(), y.data(), 2, 3);
  const double e = std::exp(1.0), s = e + e * e + e * e * e;
  for (int r = 0; r < 2; ++r) {
    CHECK_THAT(y[3 * r + 0], WithinAbs(e / s, 1e-7));
    CHECK_THAT(y[3 * r + 1], WithinAbs(e * e / s, 1e-7));
    CHECK_THAT(y[3 * r + 2], WithinAbs(e * e * e / s, 1e-7));
  }
}

TEST_CASE("causal softmax normalises each row over its first i + 1 entries and zeroes the rest",
          "[kit][ops]") {
  std::vector<float> s = {5, 9, 9, 1, 1, 9, 0, 1, 2};
  ops::causal_softmax(s.data(), 3);
  CHECK(s[0] == 1.0f);
  CHECK(s[1] == 0.0f);
  CHECK(s[2] == 0.0f);
  CHECK_THAT(s[3], WithinAbs(0.5, 1e-7));
  CHECK_THAT(s[4], WithinAbs(0.5, 1e-7));
  CHECK(s[5] == 0.0f);
  const double e = std::exp(1.0), sum = 1 + e + e * e;
  CHECK_THAT(s[6], WithinAbs(1 / sum, 1e-7));
  CHECK_THAT(s[8], WithinAbs(e * e / sum, 1e-7));
}

TEST_CASE("embedding gathers rows and its backward adds repeated ids up", "[kit][ops]") {
  const std::vector<float> w = {0, 1, 10, 11, 20, 21};
  const std::vector<int32_t> ids = {2, 0, 2};
  std::vector<float> out(6);
  ops::embedding(w.data(), ids.data(), out.data(), 3, 2);
  CHECK(out == std::vector<float>{20, 21, 0, 1, 20, 21});
  std::vector<float> dw(6, 0.0f);
  const std::vector<float> dout = {1, 2, 3, 4, 5, 6};
  ops::embedding_backward(dout.data(), ids.data(), dw.data(), 3, 2);
  CHECK(dw == std::vector<float>{3, 4, 0, 0, 6, 8});
}

TEST_CASE("cross-entropy of a known row is logsumexp minus the target's logit", "[kit][loss]") {
  const Tensor logits = Tensor::from({2, 3}, {1, 2, 3, 1, 2, 3}, MemKind::Other);
  // -log softmax([1, 2, 3]) = [2.40760596, 1.40760596, 0.40760596].
  CHECK_THAT(cross_entropy(logits, {2, 0}), WithinAbs((0.40760596 + 2.40760596) / 2, 1e-6));
  CHECK_THAT(cross_entropy(logits, {1, 1}), WithinAbs(1.40760596, 1e-6));
  // Ignored rows leave the mean; all ignored is NaN.
  CHECK_THAT(cross_entropy(logits, {2, -1}, -1), WithinAbs(0.40760596, 1e-6));
  CHECK(std::isnan(cross_entropy(logits, {-100, -100})));
  CHECK_THROWS_AS(cross_entropy(logits, {3, 0}), std::invalid_argument);
  CHECK_THROWS_AS(cross_entropy(logits, {0}), std::invalid_argument);
  // Large logits do not overflow.
  const Tensor big = Tensor::from({1, 3}, {1001, 1002, 1003}, MemKind::Other);
  CHECK_THAT(cross_entropy(big, {2}), WithinAbs(0.40760596, 1e-6));

  const Tensor g = cross_entropy_backward(logits, {2, -1}, 2.0f, -1);
  const double e = std::exp(1.0), s = e + e * e + e * e * e;
  CHECK_THAT(g.item(0), WithinAbs(2 * e / s, 1e-6));
  CHECK_THAT(g.item(2), WithinAbs(2 * (e * e * e / s - 1), 1e-6));
  CHECK(g.item(3) == 0.0f);
}

TEST_CASE("cross-entropy's gradient matches finite differences", "[kit][loss]") {
  std::mt19937 rng(3);
  Tensor logits = test::randn({6, 5}, rng, 2.0f);
  const std::vector<int32_t> targets = {0, 4, 2, 2, -100, 1};
  const Tensor g = cross_entropy_backward(logits, targets);
  const auto loss = [&] { return static_cast<double>(cross_entropy(logits, targets)); };
  CHECK(test::check_entries("logits", logits.f32(), g.f32(), logits.numel(), loss,
                            {.h = 1e-2, .atol = 2e-4, .rtol = 1e-2}, 100, rng) == 0);
}

}  // namespace
}  // namespace weft::kit
