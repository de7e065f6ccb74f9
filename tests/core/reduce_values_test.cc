// The reduce kernels on hand-picked values whose results are known exactly: half, bfloat16 and
// fp8 rounding and overflow, NaN/infinity/signed zero rules, integer wrap, Bool, and refusals.
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

#include <catch2/catch.hpp>

#include "weft/error.h"

#include "runtime/reduce.h"

namespace weft {
namespace {

// a op b through combine(), and through accumulate() for good measure (they must agree).
template <typename T>
T reduce2(T a, T b, DType dtype, ReduceOp op) {
  T out{};
  reduce::combine(&out, &a, &b, 1, dtype, op);
  T acc = a;
  reduce::accumulate(&acc, &b, 1, dtype, op);
  REQUIRE(std::bit_cast<std::array<uint8_t, sizeof(T)>>(acc) ==
          std::bit_cast<std::array<uint8_t, sizeof(T)>>(out));
  return out;
}

uint16_t half_op(uint16_t a, uint16_t b, ReduceOp op = ReduceOp::Sum) {
  return reduce2<uint16_t>(a, b, DType::Float16, op);
}
uint16_t bf16_op(uint16_t a, uint16_t b, ReduceOp op = ReduceOp::Sum) {
  return reduce2<uint16_t>(a, b, DType::BFloat16, op);
}
bool half_is_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }
bool bf16_is_nan(uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0; }

TEST_CASE("float16 sums round to nearest even, overflow to infinity and keep denormals",
          "[core][reduce]") {
  CHECK(half_op(0x3c00, 0x1000) == 0x3c00);     // 1 + 2^-11: a tie, to even (down)
  CHECK(half_op(0x3c01, 0x1000) == 0x3c02);     // (1 + 2^-10) + 2^-11: a tie, to even (up)
  CHECK(half_op(0x3c00, 0x1001) == 0x3c01);     // just above the tie
  CHECK(half_op(0x7bff, 0x7bff) == 0x7c00);     // 65504 + 65504 = inf
  CHECK(half_op(0x7bff, 0x4c00) == 0x7c00);     // 65504 + 16 = 65520: tie, to even = inf
  CHECK(half_op(0x7bff, 0x4800) == 0x7bff);     // 65504 + 8 rounds back down
  CHECK(half_op(0xfbff, 0xfbff) == 0xfc00);     // -inf
  CHECK(half_op(0x0001, 0x0001) == 0x0002);     // smallest denormals add exactly
  CHECK(half_op(0x03ff, 0x0001) == 0x0400);     // largest denormal + smallest = smallest normal
  CHECK(half_op(0x0001, 0x8001) == 0x0000);     // x + -x = +0
  CHECK(half_op(0x8000, 0x8000) == 0x8000);     // -0 + -0 = -0
  CHECK(half_op(0x8000, 0x0000) == 0x0000);     // -0 + +0 = +0
  CHECK(half_op(0x7c00, 0x3c00) == 0x7c00);     // inf + 1 = inf
  CHECK(half_is_nan(half_op(0x7c00, 0xfc00)));  // inf + -inf = NaN
}

uint8_t e4m3_op(uint8_t a, uint8_t b, ReduceOp op = ReduceOp::Sum) {
  return reduce2<uint8_t>(a, b, DType::Float8E4M3, op);
}
uint8_t e5m2_op(uint8_t a, uint8_t b, ReduceOp op = ReduceOp::Sum) {
  return reduce2<uint8_t>(a, b, DType::Float8E5M2, op);
}

// e4m3fn: 1 = 0x38, 2 = 0x40, 16 = 0x58, 18 = 0x59, 448 = 0x7e, NaN = 0x7f / 0xff.
TEST_CASE("fp8 e4m3fn sums round to nearest even and overflow to NaN, having no infinity",
          "[core][reduce]") {
  CHECK(e4m3_op(0x58, 0x38) == 0x58);  // 16 + 1 = 17: a tie, to even (16)
  CHECK(e4m3_op(0x59, 0x38) == 0x5a);  // 18 + 1 = 19: a tie, to even (20)
  CHECK(e4m3_op(0x38, 0x40) == 0x44);  // 1 + 2 = 3, exact
  CHECK(e4m3_op(0x7e, 0x38) == 0x7e);  // 448 + 1 rounds back to 448
  CHECK(e4m3_op(0x7e, 0x58) == 0x7e);  // 448 + 16 = 464: the tie, to even (448)
  CHECK(e4m3_op(0x7e, 0x59) == 0x7f);  // 448 + 18 = 466: past it, NaN
  CHECK(e4m3_op(0x7e, 0x7e) == 0x7f);  // 448 + 448: NaN, not infinity
  CHECK(e4m3_op(0xfe, 0xfe) == 0xff);  // -448 + -448: NaN with the sign
  CHECK(e4m3_op(0x7e, 0x7e, ReduceOp::Prod) == 0x7f);
  CHECK(e4m3_op(0x01, 0x01) == 0x02);  // smallest denormals (2^-9) add exactly
  CHECK(e4m3_op(0x07, 0x01) == 0x08);  // largest denormal + smallest = smallest normal
  CHECK(e4m3_op(0x01, 0x81) == 0x00);  // x + -x = +0
  CHECK(e4m3_op(0x80, 0x80) == 0x80);  // -0 + -0 = -0
  CHECK(e4m3_op(0x01, 0x01, ReduceOp::Prod) == 0x00);  // 2^-18 underflows to +0
  CHECK(e4m3_op(0x81, 0x01, ReduceOp::Prod) == 0x80);  // and keeps its sign
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max}) {
    CHECK((e4m3_op(0x7f, 0x38, op) & 0x7f) == 0x7f);  // NaN wins
    CHECK((e4m3_op(0x38, 0xff, op) & 0x7f) == 0x7f);
  }
  CHECK(e4m3_op(0x80, 0x00, ReduceOp::Min) == 0x80);  // -0 below +0
  CHECK(e4m3_op(0x00, 0x80, ReduceOp::Max) == 0x00);
  CHECK(e4m3_op(0xfe, 0x7e, ReduceOp::Min) == 0xfe);
  CHECK(e4m3_op(0xfe, 0x7e, ReduceOp::Max) == 0x7e);
}

// e5m2: 1 = 0x3c, 2 = 0x40, 8 = 0x48, 10 = 0x49, 57344 = 0x7b, inf = 0x7c, NaN = 0x7d..0x7f.
TEST_CASE("fp8 e5m2 sums round to nearest even, overflow to infinity and keep NaN",
          "[core][reduce]") {
  CHECK(e5m2_op(0x48, 0x3c) == 0x48);               // 8 + 1 = 9: a tie, to even (8)
  CHECK(e5m2_op(0x49, 0x3c) == 0x4a);               // 10 + 1 = 11: a tie, to even (12)
  CHECK(e5m2_op(0x7b, 0x7b) == 0x7c);               // 57344 + 57344 = inf
  CHECK(e5m2_op(0x7b, 0x6c) == 0x7c);               // 57344 + 4096 = 61440: the tie, to even (inf)
  CHECK(e5m2_op(0x7b, 0x68) == 0x7b);               // 57344 + 2048 rounds back down
  CHECK(e5m2_op(0xfb, 0xfb) == 0xfc);               // -inf
  CHECK(e5m2_op(0x01, 0x01) == 0x02);               // smallest denormals (2^-16) add exactly
  CHECK(e5m2_op(0x7c, 0x3c) == 0x7c);               // inf + 1 = inf
  CHECK(e5m2_op(0x80, 0x80) == 0x80);               // -0 + -0 = -0
  const uint8_t nan_of_infs = e5m2_op(0x7c, 0xfc);  // inf + -inf
  CHECK(((nan_of_infs & 0x7c) == 0x7c && (nan_of_infs & 0x03) != 0));
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max}) {
    const uint8_t got = e5m2_op(0x7d, 0x3c, op);  // a NaN with the low payload bit only
    CHECK(((got & 0x7c) == 0x7c && (got & 0x03) != 0));
  }
  CHECK(e5m2_op(0x80, 0x00, ReduceOp::Min) == 0x80);
  CHECK(e5m2_op(0xfc, 0x7b, ReduceOp::Min) == 0xfc);  // -inf
  CHECK(e5m2_op(0xfc, 0x7c, ReduceOp::Max) == 0x7c);
}

TEST_CASE("fp8 avg and premul_sum over simulated ranks round once", "[core][reduce]") {
  // Eight ranks' small integers: every partial sum is exact in both formats (|sum| <= 8), so the
  // result is the exact mean rounded once, whatever the order.
  for (DType dtype : {DType::Float8E4M3, DType::Float8E5M2}) {
    const bool e4m3 = dtype == DType::Float8E4M3;
    auto to8 = [&](double x) {  // exact for the small values used here
      const int e = x == 0 ? 0 : static_cast<int>(std::floor(std::log2(std::fabs(x))));
      const int bias = e4m3 ? 7 : 15, man = e4m3 ? 3 : 2;
      const double frac = std::fabs(x) / std::ldexp(1.0, e) - 1;
      const auto bits =
          static_cast<uint8_t>(((e + bias) << man) | static_cast<int>(frac * (1 << man)));
      return static_cast<uint8_t>((x == 0 ? 0 : bits) | (x < 0 ? 0x80 : 0));
    };
    const double inputs[8] = {1, 1, -1, 1, 0, 1, 1, 1};  // sum 5
    std::vector<uint8_t> acc = {to8(inputs[0])};
    for (int r = 1; r < 8; ++r) {
      const uint8_t x = to8(inputs[r]);
      reduce::accumulate(acc.data(), &x, 1, dtype, ReduceOp::Avg);
    }
    CHECK(acc[0] == to8(5));
    reduce::finalize(acc.data(), 1, dtype, ReduceOp::Avg, 8);
    // 5/8 = 0.625 = 1.01b * 2^-1: exact in both.
    CHECK(acc[0] == to8(0.625));
    // premul_sum(0.5): each input halved (exact), then summed: 2.5.
    std::vector<uint8_t> total = {to8(0)};
    for (double in : inputs) {
      uint8_t x = to8(in), scaled = 0;
      reduce::premultiply(&scaled, &x, 1, dtype, 0.5);
      reduce::accumulate(total.data(), &scaled, 1, dtype, ReduceOp::premul_sum(0.5));
    }
    CHECK(total[0] == to8(2.5));
    // avg of 5 over 3 = 1.666...: e4m3fn rounds to 1.625 (1.101b), e5m2 to 1.75 (1.11b).
    std::vector<uint8_t> five = {to8(5)};
    reduce::finalize(five.data(), 1, dtype, ReduceOp::Avg, 3);
    CHECK(five[0] == to8(e4m3 ? 1.625 : 1.75));
  }
}

TEST_CASE("float16 NaN stays NaN through sum, prod, min and max", "[core][reduce]") {
  for (uint16_t nan : {uint16_t{0x7c01}, uint16_t{0x7e00}, uint16_t{0xfe00}, uint16_t{0x7fff}}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max}) {
      INFO(reduce_op_name(op) << " with NaN 0x" << std::hex << nan);
      CHECK(half_is_nan(half_op(nan, 0x3c00, op)));
      CHECK(half_is_nan(half_op(0xfc00, nan, op)));
      CHECK(half_is_nan(half_op(nan, nan, op)));
    }
  }
}

TEST_CASE("float16 products and premultiply round denormal ties to even", "[core][reduce]") {
  CHECK(half_op(0x0001, 0x3800, ReduceOp::Prod) == 0x0000);  // 2^-24 * 0.5: tie, to even 0
  CHECK(half_op(0x0003, 0x3800, ReduceOp::Prod) == 0x0002);  // 1.5 ulp: tie, to even 2
  CHECK(half_op(0x5bff, 0x5bff, ReduceOp::Prod) == 0x7bfe);  // 255.875^2 = 65472.02 -> 65472
  CHECK(half_op(0x5c00, 0x5c00, ReduceOp::Prod) == 0x7c00);  // 256^2 = 65536 overflows
  uint16_t x[] = {0x0001, 0x0003, 0x3c00, 0x7bff};
  reduce::premultiply(x, 4, DType::Float16, 0.5);
  CHECK(x[0] == 0x0000);
  CHECK(x[1] == 0x0002);
  CHECK(x[2] == 0x3800);
  CHECK(x[3] == 0x77ff);
}

TEST_CASE("min and max order -0 below +0 whatever the argument order", "[core][reduce]") {
  CHECK(half_op(0x8000, 0x0000, ReduceOp::Min) == 0x8000);
  CHECK(half_op(0x0000, 0x8000, ReduceOp::Min) == 0x8000);
  CHECK(half_op(0x8000, 0x0000, ReduceOp::Max) == 0x0000);
  CHECK(half_op(0x0000, 0x8000, ReduceOp::Max) == 0x0000);
  CHECK(std::signbit(reduce2(0.0f, -0.0f, DType::Float32, ReduceOp::Min)));
  CHECK(std::signbit(reduce2(-0.0f, 0.0f, DType::Float32, ReduceOp::Min)));
  CHECK(!std::signbit(reduce2(-0.0f, 0.0f, DType::Float32, ReduceOp::Max)));
  CHECK(!std::signbit(reduce2(0.0, -0.0, DType::Float64, ReduceOp::Max)));
  CHECK(std::signbit(reduce2(0.0, -0.0, DType::Float64, ReduceOp::Min)));
  CHECK(std::signbit(reduce2(-0.0, -0.0, DType::Float64, ReduceOp::Max)));
}

TEST_CASE("bfloat16 sums round to nearest even and overflow to infinity", "[core][reduce]") {
  CHECK(bf16_op(0x3f80, 0x3b80) == 0x3f80);  // 1 + 2^-8: a tie, to even (down)
  CHECK(bf16_op(0x3f81, 0x3b80) == 0x3f82);  // a tie, to even (up)
  CHECK(bf16_op(0x7f7f, 0x7f7f) == 0x7f80);  // max + max = inf
  CHECK(bf16_op(0xff7f, 0xff7f) == 0xff80);
  CHECK(bf16_op(0x0001, 0x0001) == 0x0002);  // denormals
  CHECK(bf16_op(0x8000, 0x8000) == 0x8000);
  CHECK(bf16_is_nan(bf16_op(0x7fc1, 0x3f80)));
  CHECK(bf16_is_nan(bf16_op(0x7f81, 0x3f80, ReduceOp::Max)));
  CHECK(bf16_is_nan(bf16_op(0x7f80, 0xff80)));
  CHECK(bf16_op(0x4000, 0x4040, ReduceOp::Min) == 0x4000);  // 2 vs 3
  CHECK(bf16_op(0x4000, 0x4040, ReduceOp::Max) == 0x4040);
}

TEST_CASE("float32 and float64 propagate NaN and infinity and keep denormals", "[core][reduce]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const float tiny = std::numeric_limits<float>::denorm_min();
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max}) {
    CHECK(std::isnan(reduce2(nan, 1.0f, DType::Float32, op)));
    CHECK(std::isnan(reduce2(-inf, nan, DType::Float32, op)));
    CHECK(std::isnan(reduce2(1.0, std::nan(""), DType::Float64, op)));
  }
  CHECK(reduce2(inf, 1e30f, DType::Float32, ReduceOp::Sum) == inf);
  CHECK(std::isnan(reduce2(inf, -inf, DType::Float32, ReduceOp::Sum)));
  CHECK(reduce2(3e38f, 3e38f, DType::Float32, ReduceOp::Sum) == inf);
  CHECK(reduce2(tiny, tiny, DType::Float32, ReduceOp::Sum) == 2 * tiny);
  CHECK(reduce2(tiny, 0.5f, DType::Float32, ReduceOp::Prod) == 0.0f);  // tie to even zero
  CHECK(reduce2(-inf, 5.0f, DType::Float32, ReduceOp::Min) == -inf);
  CHECK(reduce2(-inf, 5.0f, DType::Float32, ReduceOp::Max) == 5.0f);
  CHECK(reduce2(1e308, 1e308, DType::Float64, ReduceOp::Sum) ==
        std::numeric_limits<double>::infinity());
}

TEST_CASE("integer sum and prod wrap modulo 2^bits", "[core][reduce]") {
  CHECK(reduce2<int32_t>(INT32_MAX, 1, DType::Int32, ReduceOp::Sum) == INT32_MIN);
  CHECK(reduce2<int32_t>(INT32_MIN, -1, DType::Int32, ReduceOp::Sum) == INT32_MAX);
  CHECK(reduce2<int32_t>(65536, 65536, DType::Int32, ReduceOp::Prod) == 0);
  CHECK(reduce2<int32_t>(INT32_MIN, -1, DType::Int32, ReduceOp::Prod) == INT32_MIN);
  CHECK(reduce2<int64_t>(INT64_MIN, -1, DType::Int64, ReduceOp::Sum) == INT64_MAX);
  CHECK(reduce2<int64_t>(INT64_MAX, 2, DType::Int64, ReduceOp::Prod) == -2);
  CHECK(reduce2<int64_t>(INT64_MIN, -1, DType::Int64, ReduceOp::Prod) == INT64_MIN);
  CHECK(reduce2<int8_t>(16, 16, DType::Int8, ReduceOp::Prod) == 0);
  CHECK(reduce2<int8_t>(-128, -1, DType::Int8, ReduceOp::Prod) == -128);
  CHECK(reduce2<int8_t>(100, 3, DType::Int8, ReduceOp::Prod) == 44);  // 300 - 256
  CHECK(reduce2<int8_t>(127, 1, DType::Int8, ReduceOp::Sum) == -128);
  CHECK(reduce2<uint8_t>(255, 1, DType::UInt8, ReduceOp::Sum) == 0);
  CHECK(reduce2<uint8_t>(16, 17, DType::UInt8, ReduceOp::Prod) == 16);  // 272 - 256
  CHECK(reduce2<int8_t>(-128, 127, DType::Int8, ReduceOp::Min) == -128);
  CHECK(reduce2<uint8_t>(200, 100, DType::UInt8, ReduceOp::Max) == 200);
  CHECK(reduce2<int64_t>(0x0f0f, 0x00ff, DType::Int64, ReduceOp::BAnd) == 0x000f);
  CHECK(reduce2<int32_t>(0x0f0f, 0x00ff, DType::Int32, ReduceOp::BOr) == 0x0fff);
  CHECK(reduce2<int8_t>(-1, 0x0f, DType::Int8, ReduceOp::BXor) == static_cast<int8_t>(0xf0));
}

TEST_CASE("integer avg truncates toward zero and handles many contributors", "[core][reduce]") {
  int32_t sums[] = {-3, 7, -7, 0, INT32_MIN};
  reduce::finalize(sums, 5, DType::Int32, ReduceOp::Avg, 2);
  CHECK(sums[0] == -1);
  CHECK(sums[1] == 3);
  CHECK(sums[2] == -3);
  CHECK(sums[3] == 0);
  CHECK(sums[4] == INT32_MIN / 2);
  int8_t small[] = {-128, 127, -100};
  reduce::finalize(small, 3, DType::Int8, ReduceOp::Avg, 200);  // divisor beyond int8's range
  CHECK(small[0] == 0);
  CHECK(small[1] == 0);
  CHECK(small[2] == 0);
  uint8_t bytes[] = {255, 7};
  reduce::finalize(bytes, 2, DType::UInt8, ReduceOp::Avg, 2);
  CHECK(bytes[0] == 127);
  CHECK(bytes[1] == 3);
}

TEST_CASE("uint32 and uint64 wrap, compare and divide unsigned", "[core][reduce]") {
  CHECK(reduce2<uint32_t>(UINT32_MAX, 2, DType::UInt32, ReduceOp::Sum) == 1);
  CHECK(reduce2<uint32_t>(65536, 65537, DType::UInt32, ReduceOp::Prod) == 65536);  // mod 2^32
  CHECK(reduce2<uint32_t>(UINT32_MAX, 1, DType::UInt32, ReduceOp::Max) == UINT32_MAX);
  CHECK(reduce2<uint32_t>(UINT32_MAX, 1, DType::UInt32, ReduceOp::Min) == 1);
  CHECK(reduce2<uint64_t>(UINT64_MAX, 1, DType::UInt64, ReduceOp::Sum) == 0);
  CHECK(reduce2<uint64_t>(uint64_t{1} << 63, 2, DType::UInt64, ReduceOp::Prod) == 0);
  CHECK(reduce2<uint64_t>(uint64_t{1} << 63, 1, DType::UInt64, ReduceOp::Max) ==
        uint64_t{1} << 63);  // an int64 compare would take 1
  CHECK(reduce2<uint64_t>(uint64_t{1} << 63, 1, DType::UInt64, ReduceOp::Min) == 1);
  CHECK(reduce2<uint64_t>(0xff00, 0x0ff0, DType::UInt64, ReduceOp::BXor) == 0xf0f0);
  uint64_t sums[] = {UINT64_MAX - 1, 7};
  reduce::finalize(sums, 2, DType::UInt64, ReduceOp::Avg, 2);
  CHECK(sums[0] == UINT64_MAX / 2);  // 2^63 - 1: divided unsigned, not as -2 / 2
  CHECK(sums[1] == 3);
  uint32_t words[] = {UINT32_MAX, 5};
  reduce::finalize(words, 2, DType::UInt32, ReduceOp::Avg, 200);
  CHECK(words[0] == UINT32_MAX / 200);
  CHECK(words[1] == 0);
}

TEST_CASE("avg and premul_sum over simulated ranks give the mean", "[core][reduce]") {
  // Three ranks' inputs, reduced as a collective would: premultiply (PremulSum) or sum, then
  // finalize (Avg).
  const std::vector<std::vector<float>> inputs = {{3, -6, 1.5f}, {6, 0, 1.5f}, {9, 3, 1.5f}};
  std::vector<float> avg = inputs[0];
  for (size_t r = 1; r < inputs.size(); ++r) {
    reduce::accumulate(avg.data(), inputs[r].data(), 3, DType::Float32, ReduceOp::Avg);
  }
  reduce::finalize(avg.data(), 3, DType::Float32, ReduceOp::Avg, 3);
  CHECK(avg == std::vector<float>{6, -1, 1.5f});

  const ReduceOp premul = ReduceOp::premul_sum(0.5);
  std::vector<float> total(3, 0.0f);
  for (const auto& input : inputs) {
    std::vector<float> scaled(3);
    reduce::premultiply(scaled.data(), input.data(), 3, DType::Float32, premul.factor);
    reduce::accumulate(total.data(), scaled.data(), 3, DType::Float32, premul);
  }
  reduce::finalize(total.data(), 3, DType::Float32, premul, 3);  // a no-op for premul_sum
  CHECK(total == std::vector<float>{9, -1.5f, 2.25f});

  // Avg of equal inputs gives the input back exactly (division, not a reciprocal multiply).
  std::vector<float> equal(1000, 0.1f);
  std::vector<float> sum(1000, 0.0f);
  for (int r = 0; r < 3; ++r) {
    reduce::accumulate(sum.data(), equal.data(), 1000, DType::Float32, ReduceOp::Avg);
  }
  reduce::finalize(sum.data(), 1000, DType::Float32, ReduceOp::Avg, 3);
  CHECK(sum[999] == 0.3f / 3);  // the sum 0.1+0.1+0.1 = 0.3f in float, divided once
}

TEST_CASE("bool reduces as logic on any non-zero byte and writes only 0 or 1", "[core][reduce]") {
  const uint8_t a[] = {0, 0, 2, 2, 255};
  const uint8_t b[] = {0, 7, 0, 1, 128};
  auto run = [&](ReduceOp op) {
    std::vector<uint8_t> out(5, 0xee);
    reduce::combine(out.data(), a, b, 5, DType::Bool, op);
    return out;
  };
  using V = std::vector<uint8_t>;
  CHECK(run(ReduceOp::Sum) == V{0, 1, 1, 1, 1});
  CHECK(run(ReduceOp::Max) == V{0, 1, 1, 1, 1});
  CHECK(run(ReduceOp::BOr) == V{0, 1, 1, 1, 1});
  CHECK(run(ReduceOp::Prod) == V{0, 0, 0, 1, 1});
  CHECK(run(ReduceOp::Min) == V{0, 0, 0, 1, 1});
  CHECK(run(ReduceOp::BAnd) == V{0, 0, 0, 1, 1});
  CHECK(run(ReduceOp::BXor) == V{0, 1, 1, 0, 0});
}

std::string refusal(DType dtype, ReduceOp op) {
  try {
    float data[2] = {1.0f, 2.0f};
    reduce::accumulate(data, data, 1, dtype, op);
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::InvalidArgument);
    return e.what();
  }
  return "(accepted)";
}

TEST_CASE("unsupported dtype and op pairs are refused naming the op and the dtype",
          "[core][reduce]") {
  CHECK(refusal(DType::Float32, ReduceOp::BAnd) ==
        "reduce: InvalidArgument: band is not defined for float32 (bitwise ops need an integer "
        "or bool dtype)");
  CHECK_THAT(refusal(DType::BFloat16, ReduceOp::BXor),
             Catch::Contains("bxor") && Catch::Contains("bfloat16"));
  CHECK_THAT(refusal(DType::Float64, ReduceOp::BOr), Catch::Contains("bor"));
  CHECK_THAT(refusal(DType::Float8E4M3, ReduceOp::BAnd),
             Catch::Contains("band") && Catch::Contains("float8_e4m3fn"));
  CHECK_THAT(refusal(DType::Float8E5M2, ReduceOp::BXor),
             Catch::Contains("bxor") && Catch::Contains("float8_e5m2"));
  CHECK_THAT(refusal(DType::Int32, ReduceOp::premul_sum(2)),
             Catch::Contains("premul_sum") && Catch::Contains("int32"));
  CHECK_THAT(refusal(DType::Bool, ReduceOp::Avg),
             Catch::Contains("avg") && Catch::Contains("bool"));
  CHECK_THAT(refusal(static_cast<DType>(42), ReduceOp::Sum), Catch::Contains("unknown dtype 42"));
  CHECK_THAT(refusal(DType::Int8, ReduceOp(static_cast<ReduceOp::Kind>(17))),
             Catch::Contains("unknown reduce op 17"));
  CHECK_THROWS_AS(reduce::premultiply(nullptr, 0, DType::Int64, 2.0), Error);
  CHECK_THROWS_AS(reduce::finalize(nullptr, 0, DType::Bool, ReduceOp::Avg, 2), Error);
}

TEST_CASE("a refused call leaves the buffer untouched", "[core][reduce]") {
  float data[] = {1.5f, 2.5f};
  const float other[] = {4.0f, 8.0f};
  CHECK_THROWS_AS(reduce::combine(data, data, other, 2, DType::Float32, ReduceOp::BOr), Error);
  CHECK(data[0] == 1.5f);
  CHECK(data[1] == 2.5f);
}

TEST_CASE("finalize with no contributors is a caller bug reported as a logic error",
          "[core][reduce]") {
  float x = 1.0f;
  CHECK_THROWS_AS(reduce::finalize(&x, 1, DType::Float32, ReduceOp::Avg, 0), std::logic_error);
  CHECK(x == 1.0f);
}

}  // namespace
}  // namespace weft
