// tests/fsdp/kit/gradcheck.h: random tensors and central finite differences for the kit's tests.
//
// A module's gradients are checked through the scalar L(x, params) = sum(forward(x) * r) for a
// fixed random r: backward(r) gives dL/dx and adds dL/dparam into .grad, and each checked entry
// e is compared with (L(e + h) - L(e - h)) / 2h, L summed in double. Forward runs in float32, so
// h trades truncation (h^2 f''') against rounding (eps_f32 |L| / h); 1e-2 suits O(1) inputs.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include "fsdp/kit/module.h"

namespace weft::kit::test {

inline Tensor randn(std::vector<int64_t> shape, std::mt19937& rng, float std_dev = 1.0f,
                    float mean = 0.0f) {
  Tensor t = Tensor::empty(std::move(shape), DType::Float32, MemKind::Other);
  std::normal_distribution<float> dist(mean, std_dev);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = dist(rng);
  return t;
}

inline double dot(const Tensor& a, const Tensor& b) {
  double s = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i)
    s += static_cast<double>(a.f32()[i]) * static_cast<double>(b.f32()[i]);
  return s;
}

struct Tolerance {
  double h = 1e-2;     // finite-difference step
  double atol = 1e-3;  // |numeric - analytic| <= atol + rtol * max(|numeric|, |analytic|)
  double rtol = 1e-2;
};

// Entries of an n-element tensor to check: all of them up to `max_samples`, else a random
// sample that always includes the first and the last.
inline std::vector<int64_t> sample_indices(int64_t n, int max_samples, std::mt19937& rng) {
  std::vector<int64_t> out;
  if (n <= max_samples) {
    for (int64_t i = 0; i < n; ++i) out.push_back(i);
    return out;
  }
  out = {0, n - 1};
  std::uniform_int_distribution<int64_t> pick(0, n - 1);
  while (static_cast<int>(out.size()) < max_samples) out.push_back(pick(rng));
  return out;
}

// Checks `analytic[i]` against the central difference of `loss` in `values[i]` for the sampled
// entries; `what` names the tensor in failure messages. Returns the number of mismatches.
inline int check_entries(const std::string& what, float* values, const float* analytic, int64_t n,
                         const std::function<double()>& loss, Tolerance tol, int max_samples,
                         std::mt19937& rng) {
  int bad = 0;
  for (int64_t i : sample_indices(n, max_samples, rng)) {
    const float saved = values[i];
    values[i] = saved + static_cast<float>(tol.h);
    const double plus = loss();
    values[i] = saved - static_cast<float>(tol.h);
    const double minus = loss();
    values[i] = saved;
    // The step actually taken in float32, not the nominal h.
    const double step = static_cast<double>(saved + static_cast<float>(tol.h)) -
                        static_cast<double>(saved - static_cast<float>(tol.h));
    const double numeric = (plus - minus) / step;
    const double a = analytic[i];
    const double limit = tol.atol + tol.rtol * std::max(std::abs(numeric), std::abs(a));
    if (!(std::abs(numeric - a) <= limit)) {
      ++bad;
      UNSCOPED_INFO(fmt::format("{}[{}]: analytic {:.6g}, numeric {:.6g} (limit {:.3g})", what, i,
                                a, numeric, limit));
    }
  }
  return bad;
}

// Every parameter gradient of `m` and the input gradient (unless the module returns none)
// against finite differences of sum(m(x) * r). Returns the number of mismatches.
inline int check_module(Module& m, Tensor x, std::mt19937& rng, Tolerance tol = {},
                        int max_samples = 40) {
  m.zero_grad();
  const Tensor y = m.call_forward(x);
  const Tensor r = randn(y.shape(), rng);
  const Tensor dx = m.call_backward(r);
  const auto loss = [&] { return dot(m.call_forward(x), r); };
  int bad = 0;
  if (dx.defined()) {
    REQUIRE(dx.shape() == x.shape());
    bad += check_entries("input", x.f32(), dx.f32(), x.numel(), loss, tol, max_samples, rng);
  }
  for (auto& [name, p] : m.named_parameters()) {
    REQUIRE(p->grad.defined());
    REQUIRE(p->grad.shape() == p->shape);
    bad += check_entries(name, p->data.f32(), p->grad.f32(), p->data.numel(), loss, tol,
                         max_samples, rng);
  }
  return bad;
}

}  // namespace weft::kit::test
