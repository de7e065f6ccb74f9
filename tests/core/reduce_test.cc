// Every dtype x op of the reduce kernels against the scalar references of reference.h, on random
// data rich in special values, at lengths that exercise empty, scalar and odd vector tails.
#include "runtime/reduce.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include "weft/error.h"

#include "tests/core/reference.h"

namespace weft {
namespace {

using test::load_real;
using test::ref_combine;
using test::same_element;
using test::show_element;
using test::store_real;

constexpr size_t kLengths[] = {0, 1, 7, 1000, 4099};

// Random elements: a third raw random bits (every NaN payload, denormal and infinity the format
// has, for 2-byte types in proportion, and every one of fp8's 256 patterns), a third small values
// where sums round and cancel, and a third drawn from a list of edge cases.
std::vector<uint8_t> random_buffer(DType dtype, size_t count, std::mt19937_64& rng) {
  const size_t size = dtype_size(dtype);
  std::vector<uint8_t> out(count * size);
  std::uniform_int_distribution<int> pick(0, 2);
  std::uniform_real_distribution<double> small(-4, 4);
  for (size_t i = 0; i < count; ++i) {
    uint8_t* p = out.data() + i * size;
    const uint64_t bits = rng();
    const int kind = pick(rng);
    if (dtype == DType::Bool) {
      // Mostly 0/1, sometimes another non-zero byte, which must read as true.
      const uint8_t byte = kind == 0 ? static_cast<uint8_t>(bits) : static_cast<uint8_t>(bits & 1);
      *p = byte;
    } else if (kind == 0 || !is_floating(dtype)) {
      std::memcpy(p, &bits, size);
      if (kind == 1 && !is_floating(dtype)) {
        // Small integers too, so that min/max/sum see close values and not only random ones.
        const int64_t v = static_cast<int64_t>(bits % 7) - 3;
        test::store_wrapped(dtype, p, v);
      } else if (kind == 2 && !is_floating(dtype)) {
        const __int128 edges[] = {0,   -1,        1,         127,       -128,
                                  255, INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN};
        test::store_wrapped(dtype, p, edges[bits % std::size(edges)]);
      }
    } else if (kind == 1) {
      // Quantised so that ties to even actually occur after the format's rounding.
      store_real(dtype, p, std::ldexp(std::round(std::ldexp(small(rng), 12)), -12));
    } else {
      // The last row: fp8's largest finite values, its overflow boundaries (464 rounds down to
      // e4m3fn's 448, 480 is NaN there; 61440 is e5m2's tie to infinity) and denormal steps.
      const double edges[] = {0.0,   -0.0,    INFINITY, -INFINITY, std::nan(""), 1.0,
                              -1.0,  65504.0, 65520.0,  6e-8,      -6e-8,        1e-40,
                              3e38,  -3e38,   1.0e-300, 1e308,     448.0,        -448.0,
                              464.0, 480.0,   57344.0,  -61440.0,  0x1p-9,       0x1p-16};
      store_real(dtype, p, edges[bits % std::size(edges)]);
    }
  }
  return out;
}

// Which DType x op pairs check_supported accepts: the documented table, restated.
bool supported(DType dtype, ReduceOp::Kind kind) {
  const bool bitwise = kind == ReduceOp::BAnd || kind == ReduceOp::BOr || kind == ReduceOp::BXor;
  if (is_floating(dtype)) return !bitwise;
  if (kind == ReduceOp::PremulSum) return false;
  if (dtype == DType::Bool) return kind != ReduceOp::Avg;
  return true;
}

// "" when got[i] == a[i] op b[i] for every i, else the first index that differs, with values.
std::string first_mismatch(DType dtype, ReduceOp::Kind kind, const std::vector<uint8_t>& a,
                           const std::vector<uint8_t>& b, const std::vector<uint8_t>& got) {
  const size_t size = dtype_size(dtype);
  uint8_t want[8];
  for (size_t i = 0; i * size < got.size(); ++i) {
    ref_combine(dtype, kind, &a[i * size], &b[i * size], want);
    if (!same_element(dtype, &got[i * size], want)) {
      return fmt::format("{} {} at index {}: {} op {} gave {}, expected {}", dtype_name(dtype),
                         reduce_op_name(kind), i, show_element(dtype, &a[i * size]),
                         show_element(dtype, &b[i * size]), show_element(dtype, &got[i * size]),
                         show_element(dtype, want));
    }
  }
  return "";
}

// Restores the float16 hardware switch when a test section ends, however it ends.
struct Fp16Hardware {
  explicit Fp16Hardware(bool enabled) : previous(reduce::detail::set_fp16_hardware(enabled)) {}
  ~Fp16Hardware() { reduce::detail::set_fp16_hardware(previous); }
  bool previous;
};

TEST_CASE("combine and accumulate match the scalar reference for every dtype, op and length",
          "[core][reduce]") {
  // float16 runs twice: with F16C where the CPU has it, and with the portable conversions.
  const bool hardware = GENERATE(true, false);
  Fp16Hardware fp16(hardware);
  INFO("float16 hardware conversions allowed: " << hardware);
  std::mt19937_64 rng(20261202);
  for (DType dtype : kAllDTypes) {
    if (!hardware && dtype != DType::Float16) continue;
    for (int k = 0; k < ReduceOp::kNumKinds; ++k) {
      const auto kind = static_cast<ReduceOp::Kind>(k);
      if (!supported(dtype, kind)) continue;
      const ReduceOp op = kind == ReduceOp::PremulSum ? ReduceOp::premul_sum(0.5) : kind;
      for (size_t count : kLengths) {
        const std::vector<uint8_t> a = random_buffer(dtype, count, rng);
        const std::vector<uint8_t> b = random_buffer(dtype, count, rng);

        std::vector<uint8_t> out(a.size(), 0xAB);
        reduce::combine(out.data(), a.data(), b.data(), count, dtype, op);
        CHECK(first_mismatch(dtype, kind, a, b, out) == "");

        std::vector<uint8_t> into_a = a;  // dst aliases a
        reduce::combine(into_a.data(), into_a.data(), b.data(), count, dtype, op);
        CHECK(first_mismatch(dtype, kind, a, b, into_a) == "");

        std::vector<uint8_t> into_b = b;  // dst aliases b
        reduce::combine(into_b.data(), a.data(), into_b.data(), count, dtype, op);
        CHECK(first_mismatch(dtype, kind, a, b, into_b) == "");

        std::vector<uint8_t> acc = a;
        reduce::accumulate(acc.data(), b.data(), count, dtype, op);
        CHECK(first_mismatch(dtype, kind, a, b, acc) == "");

        std::vector<uint8_t> self = a;  // dst, a and b all the same buffer
        reduce::accumulate(self.data(), self.data(), count, dtype, op);
        CHECK(first_mismatch(dtype, kind, a, a, self) == "");
      }
    }
  }
}

TEST_CASE("combine with count 0 accepts null pointers and touches nothing", "[core][reduce]") {
  for (DType dtype : kAllDTypes) {
    reduce::combine(nullptr, nullptr, nullptr, 0, dtype, ReduceOp::Max);
    reduce::accumulate(nullptr, nullptr, 0, dtype, ReduceOp::Min);
    reduce::finalize(nullptr, 0, dtype, ReduceOp::Sum, 3);
  }
  reduce::premultiply(nullptr, 0, DType::Float32, 2.0);
  reduce::finalize(nullptr, 0, DType::Int32, ReduceOp::Avg, 3);
}

TEST_CASE("finalize divides avg by the contributor count and rounds or truncates once",
          "[core][reduce]") {
  std::mt19937_64 rng(7);
  for (DType dtype : kAllDTypes) {
    if (dtype == DType::Bool) continue;
    for (int contributors : {1, 3, 8, 200}) {
      for (size_t count : kLengths) {
        const std::vector<uint8_t> in = random_buffer(dtype, count, rng);
        std::vector<uint8_t> got = in;
        reduce::finalize(got.data(), count, dtype, ReduceOp::Avg, contributors);
        const size_t size = dtype_size(dtype);
        std::string mismatch;
        for (size_t i = 0; i < count && mismatch.empty(); ++i) {
          uint8_t want[8];
          if (is_floating(dtype)) {
            store_real(dtype, want, load_real(dtype, &in[i * size]) / contributors);
          } else {
            // Truncation toward zero, spelled out: the quotient of the magnitudes, signed.
            const __int128 v = test::load_int(dtype, &in[i * size]);
            const __int128 q = (v < 0 ? -v : v) / contributors;
            test::store_wrapped(dtype, want, v < 0 ? -q : q);
          }
          if (!same_element(dtype, &got[i * size], want)) {
            mismatch = fmt::format("{} / {} at index {}: got {}, expected {}",
                                   show_element(dtype, &in[i * size]), contributors, i,
                                   show_element(dtype, &got[i * size]), show_element(dtype, want));
          }
        }
        INFO(dtype_name(dtype));
        CHECK(mismatch == "");
      }
    }
  }
}

TEST_CASE("finalize leaves the buffer alone for every op but avg", "[core][reduce]") {
  std::mt19937_64 rng(11);
  for (DType dtype : kAllDTypes) {
    for (int k = 0; k < ReduceOp::kNumKinds; ++k) {
      const auto kind = static_cast<ReduceOp::Kind>(k);
      if (kind == ReduceOp::Avg || !supported(dtype, kind)) continue;
      const ReduceOp op = kind == ReduceOp::PremulSum ? ReduceOp::premul_sum(3.0) : kind;
      const std::vector<uint8_t> in = random_buffer(dtype, 1000, rng);
      std::vector<uint8_t> got = in;
      reduce::finalize(got.data(), 1000, dtype, op, 4);
      CHECK(got == in);
    }
  }
}

TEST_CASE("premultiply scales floating buffers by the factor rounded to the compute type",
          "[core][reduce]") {
  std::mt19937_64 rng(3);
  // Factors with few significand bits, so that x * factor is exact in float and the result is
  // rounded once whichever way it is computed.
  for (double factor : {0.5, 3.0, -1.25, 1.0 / 1024, 0.0}) {
    for (DType dtype : {DType::Float32, DType::Float64, DType::Float16, DType::BFloat16,
                        DType::Float8E4M3, DType::Float8E5M2}) {
      for (size_t count : kLengths) {
        const std::vector<uint8_t> in = random_buffer(dtype, count, rng);
        std::vector<uint8_t> in_place = in;
        std::vector<uint8_t> copied(in.size());
        reduce::premultiply(in_place.data(), count, dtype, factor);
        reduce::premultiply(copied.data(), in.data(), count, dtype, factor);
        CHECK(copied == in_place);
        const size_t size = dtype_size(dtype);
        std::string mismatch;
        for (size_t i = 0; i < count && mismatch.empty(); ++i) {
          uint8_t want[8];
          store_real(dtype, want, load_real(dtype, &in[i * size]) * factor);
          if (!same_element(dtype, &in_place[i * size], want)) {
            mismatch = fmt::format(
                "{} * {} at index {}: got {}, expected {}", show_element(dtype, &in[i * size]),
                factor, i, show_element(dtype, &in_place[i * size]), show_element(dtype, want));
          }
        }
        INFO(dtype_name(dtype));
        CHECK(mismatch == "");
      }
    }
  }
}

TEST_CASE("premultiply rounds a float32 factor to float before multiplying", "[core][reduce]") {
  const float x = 3.0f;
  float out = 0;
  reduce::premultiply(&out, &x, 1, DType::Float32, 0.1);
  CHECK(out == 3.0f * static_cast<float>(0.1));
  double xd = 3.0, outd = 0;
  reduce::premultiply(&outd, &xd, 1, DType::Float64, 0.1);
  CHECK(outd == 3.0 * 0.1);
}

}  // namespace
}  // namespace weft
