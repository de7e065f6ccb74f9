// weft/half.h against the format-generic reference in reference.h: every half, bfloat16 and fp8
// bit pattern one way, every rounding boundary and a sweep of floats the other way.
#include "weft/half.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include "tests/core/reference.h"

namespace weft {
namespace {

using test::kBf16Format;
using test::kE4m3fnFormat;
using test::kE5m2Format;
using test::kHalfFormat;
using test::ref_decode;
using test::ref_encode;

bool is_nan16(uint16_t bits, test::Format f) {
  return ((bits >> f.man) & f.exp_mask()) == f.exp_mask() && (bits & ((1u << f.man) - 1)) != 0;
}

// "" when to_16(x) rounds as the reference does for every x in `inputs`, else the first miss.
template <typename Convert>
std::string check_rounding(Convert to_16, test::Format f, float x) {
  const uint16_t got = to_16(x);
  const auto want = static_cast<uint16_t>(ref_encode(static_cast<double>(x), f));
  const bool ok = std::isnan(x) ? is_nan16(got, f) : got == want;
  return ok ? ""
            : fmt::format("{} (0x{:08x}) gave 0x{:04x}, expected 0x{:04x}", x,
                          std::bit_cast<uint32_t>(x), got, want);
}

TEST_CASE("half_to_float is exact for all 65536 half bit patterns", "[core][half]") {
  std::string mismatch;
  for (uint32_t h = 0; h <= 0xffff && mismatch.empty(); ++h) {
    const float got = half_to_float(static_cast<uint16_t>(h));
    const double want = ref_decode(h, kHalfFormat);
    const bool ok = std::isnan(want) ? std::isnan(got)
                                     : (static_cast<double>(got) == want &&
                                        std::signbit(got) == std::signbit(want));
    if (!ok) mismatch = fmt::format("0x{:04x} gave {}, expected {}", h, got, want);
  }
  CHECK(mismatch == "");
}

TEST_CASE("bf16_to_float is exact for all 65536 bfloat16 bit patterns", "[core][half]") {
  std::string mismatch;
  for (uint32_t b = 0; b <= 0xffff && mismatch.empty(); ++b) {
    const float got = bf16_to_float(static_cast<uint16_t>(b));
    const double want = ref_decode(b, kBf16Format);
    const bool ok = std::isnan(want) ? std::isnan(got)
                                     : (static_cast<double>(got) == want &&
                                        std::signbit(got) == std::signbit(want));
    if (!ok) mismatch = fmt::format("0x{:04x} gave {}, expected {}", b, got, want);
  }
  CHECK(mismatch == "");
}

TEST_CASE("float_to_half round-trips every half and rounds every midpoint to even",
          "[core][half]") {
  std::string mismatch;
  for (uint32_t h = 0; h <= 0xffff && mismatch.empty(); ++h) {
    const float x = half_to_float(static_cast<uint16_t>(h));
    if (std::isnan(x)) {
      if (!is_nan16(float_to_half(x), kHalfFormat)) mismatch = fmt::format("NaN 0x{:04x}", h);
      continue;
    }
    if (float_to_half(x) != h) mismatch = fmt::format("0x{:04x} did not round-trip", h);
    // The midpoint to the next half up in magnitude, and the floats either side of it.
    if ((h & 0x7fff) >= 0x7c00) continue;
    const double next = ref_decode(h + 1, kHalfFormat);
    const float mid = static_cast<float>((static_cast<double>(x) + next) / 2);  // exact in float
    for (float probe : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 2 * mid)}) {
      if (mismatch.empty()) mismatch = check_rounding(float_to_half, kHalfFormat, probe);
    }
  }
  CHECK(mismatch == "");
}

TEST_CASE("float_to_bf16 round-trips every bfloat16 and rounds every midpoint to even",
          "[core][half]") {
  std::string mismatch;
  for (uint32_t b = 0; b <= 0xffff && mismatch.empty(); ++b) {
    const float x = bf16_to_float(static_cast<uint16_t>(b));
    if (std::isnan(x)) {
      if (!is_nan16(float_to_bf16(x), kBf16Format)) mismatch = fmt::format("NaN 0x{:04x}", b);
      continue;
    }
    if (float_to_bf16(x) != b) mismatch = fmt::format("0x{:04x} did not round-trip", b);
    if ((b & 0x7fff) >= 0x7f80) continue;
    const uint32_t bits = static_cast<uint32_t>(b) << 16;
    for (uint32_t low : {0x7fffu, 0x8000u, 0x8001u, 0x0001u, 0xffffu}) {
      if (mismatch.empty()) {
        mismatch = check_rounding(float_to_bf16, kBf16Format, std::bit_cast<float>(bits | low));
      }
    }
  }
  CHECK(mismatch == "");
}

TEST_CASE("float to half and bfloat16 match the reference across a sweep of float bit patterns",
          "[core][half]") {
  // A prime stride visits every exponent and many significand patterns, including NaN payloads
  // held only in the low bits; random patterns add the rest.
  std::mt19937 rng(42);
  std::string mismatch;
  for (uint64_t i = 0; i <= 0xffffffffu && mismatch.empty(); i += 4099) {
    const uint32_t bits = static_cast<uint32_t>(i) ^ (rng() & 0xffu);
    const float x = std::bit_cast<float>(bits);
    mismatch = check_rounding(float_to_half, kHalfFormat, x);
    if (mismatch.empty()) mismatch = check_rounding(float_to_bf16, kBf16Format, x);
  }
  CHECK(mismatch == "");
}

TEST_CASE("conversions keep NaN a NaN even when its payload sits below the kept bits",
          "[core][half]") {
  // Signalling NaN with only the lowest payload bit set: truncating would give infinity.
  const float low_payload = std::bit_cast<float>(0x7f800001u);
  CHECK(float_to_half(low_payload) == 0x7e00);
  CHECK(float_to_bf16(low_payload) == 0x7fc0);
  CHECK(float_to_half(-low_payload) == 0xfe00);
  CHECK(float_to_bf16(std::bit_cast<float>(0xff800001u)) == 0xffc0);
  // A half signalling NaN keeps its payload on the way to float.
  CHECK(std::bit_cast<uint32_t>(half_to_float(0x7c01)) == 0x7f802000u);
}

TEST_CASE("half conversions have the documented values at the edges", "[core][half]") {
  CHECK(float_to_half(65504.0f) == 0x7bff);   // largest finite
  CHECK(float_to_half(65519.99f) == 0x7bff);  // below the midpoint to 65536
  CHECK(float_to_half(65520.0f) == 0x7c00);   // the midpoint: ties to even = infinity
  CHECK(float_to_half(1e9f) == 0x7c00);
  CHECK(float_to_half(-INFINITY) == 0xfc00);
  CHECK(float_to_half(std::ldexp(1.0f, -24)) == 0x0001);     // smallest denormal
  CHECK(float_to_half(std::ldexp(1.0f, -25)) == 0x0000);     // its half: tie to even 0
  CHECK(float_to_half(std::ldexp(1.5f, -25)) == 0x0001);     // above the tie
  CHECK(float_to_half(std::ldexp(3.0f, -25)) == 0x0002);     // 1.5 ulp: tie to even 2
  CHECK(float_to_half(std::ldexp(1023.5f, -24)) == 0x0400);  // rounds up to normal
  CHECK(float_to_half(-0.0f) == 0x8000);
  CHECK(float_to_half(-std::ldexp(1.0f, -26)) == 0x8000);  // underflow keeps the sign
  CHECK(half_to_float(0x0001) == std::ldexp(1.0f, -24));
  CHECK(half_to_float(0x03ff) == std::ldexp(1023.0f, -24));
  CHECK(float_to_bf16(std::bit_cast<float>(0x7f7fffffu)) == 0x7f80);  // FLT_MAX rounds to inf
  CHECK(float_to_bf16(std::bit_cast<float>(0x00008000u)) == 0x0000);  // tie to even zero
  CHECK(float_to_bf16(std::bit_cast<float>(0x00018000u)) == 0x0002);  // tie to even up
}

// ---- fp8: e4m3fn (no infinities, NaN only at S.1111.111) and e5m2 (IEEE-like), with PyTorch's
// rounding of values past the range (weft/half.h).

bool is_nan8(uint8_t bits, test::Format f) { return std::isnan(ref_decode(bits, f)); }

// "" when to_8(x) rounds as the reference does, else the miss.
template <typename Convert>
std::string check_rounding8(Convert to_8, test::Format f, float x) {
  const uint8_t got = to_8(x);
  const auto want = static_cast<uint8_t>(ref_encode(static_cast<double>(x), f));
  const bool ok =
      std::isnan(ref_decode(want, f)) ? is_nan8(got, f) && (got >> 7) == (want >> 7) : got == want;
  return ok ? ""
            : fmt::format("{} (0x{:08x}) gave 0x{:02x}, expected 0x{:02x}", x,
                          std::bit_cast<uint32_t>(x), got, want);
}

// Every one of the 256 patterns: to float exactly (sign of zero included), back to the same bits
// (NaNs to a NaN of the same sign), and the midpoint to the next pattern up in magnitude, with
// the floats either side of it, rounded as the reference rounds (ties to even).
template <typename ToFloat, typename ToFp8>
std::string check_fp8(ToFloat to_float, ToFp8 to_fp8, test::Format f) {
  for (uint32_t b = 0; b <= 0xff; ++b) {
    const float x = to_float(static_cast<uint8_t>(b));
    const double want = ref_decode(b, f);
    const bool exact = std::isnan(want) ? std::isnan(x)
                                        : (static_cast<double>(x) == want &&
                                           std::signbit(x) == std::signbit(want));
    if (!exact) return fmt::format("0x{:02x} gave {}, expected {}", b, x, want);
    const uint8_t back = to_fp8(x);
    if (std::isnan(want)) {
      if (!is_nan8(back, f) || (back >> 7) != (b >> 7)) {
        return fmt::format("NaN 0x{:02x} came back as 0x{:02x}", b, back);
      }
      continue;
    }
    if (back != b) return fmt::format("0x{:02x} came back as 0x{:02x}", b, back);
    const double next = ref_decode(b + 1, f);  // the next pattern up in magnitude
    if ((b & 0x7f) == 0x7f || std::isnan(next) || std::isinf(x)) continue;
    const double top = std::isinf(next) ? 2 * std::fabs(x) - std::fabs(ref_decode(b - 1, f)) : 0;
    // Past the largest finite e5m2 the "next" is infinity: probe the midpoint to where the next
    // value would be (the overflow tie) instead.
    const double above = std::isinf(next) ? std::copysign(top, x) : next;
    const float mid = static_cast<float>((static_cast<double>(x) + above) / 2);  // exact
    for (float probe : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 2 * mid)}) {
      const std::string miss = check_rounding8(to_fp8, f, probe);
      if (!miss.empty()) return miss;
    }
  }
  return "";
}

TEST_CASE("fp8 e4m3fn converts all 256 patterns exactly, round-trips and rounds midpoints to even",
          "[core][half]") {
  CHECK(check_fp8(e4m3fn_to_float, float_to_e4m3fn, kE4m3fnFormat) == "");
}

TEST_CASE("fp8 e5m2 converts all 256 patterns exactly, round-trips and rounds midpoints to even",
          "[core][half]") {
  CHECK(check_fp8(e5m2_to_float, float_to_e5m2, kE5m2Format) == "");
}

TEST_CASE("float to fp8 matches the reference across a sweep of float bit patterns",
          "[core][half]") {
  std::mt19937 rng(8);
  std::string mismatch;
  for (uint64_t i = 0; i <= 0xffffffffu && mismatch.empty(); i += 4099) {
    const float x = std::bit_cast<float>(static_cast<uint32_t>(i ^ (rng() & 0xffu)));
    mismatch = check_rounding8(float_to_e4m3fn, kE4m3fnFormat, x);
    if (mismatch.empty()) mismatch = check_rounding8(float_to_e5m2, kE5m2Format, x);
  }
  CHECK(mismatch == "");
}

TEST_CASE("fp8 e4m3fn turns overflow, infinity and NaN into NaN, as PyTorch does", "[core][half]") {
  CHECK(float_to_e4m3fn(448.0f) == 0x7e);  // largest finite
  CHECK(float_to_e4m3fn(464.0f) == 0x7e);  // the tie between 448 and 480: to even, 448
  CHECK(float_to_e4m3fn(std::nextafter(464.0f, 500.0f)) == 0x7f);  // past it: NaN
  CHECK(float_to_e4m3fn(480.0f) == 0x7f);
  CHECK(float_to_e4m3fn(1e6f) == 0x7f);
  CHECK(float_to_e4m3fn(-1e6f) == 0xff);
  CHECK(float_to_e4m3fn(INFINITY) == 0x7f);
  CHECK(float_to_e4m3fn(-INFINITY) == 0xff);
  CHECK(float_to_e4m3fn(std::nanf("")) == 0x7f);
  CHECK(float_to_e4m3fn(std::bit_cast<float>(0x7f800001u)) == 0x7f);  // low-payload NaN
  CHECK(std::isnan(e4m3fn_to_float(0x7f)));
  CHECK(std::isnan(e4m3fn_to_float(0xff)));
  CHECK(std::signbit(e4m3fn_to_float(0xff)));
  CHECK(e4m3fn_to_float(0x7e) == 448.0f);
  CHECK(e4m3fn_to_float(0x78) == 256.0f);                 // the all-ones exponent holds numbers
  CHECK(e4m3fn_to_float(0x01) == std::ldexp(1.0f, -9));   // smallest denormal
  CHECK(e4m3fn_to_float(0x08) == std::ldexp(1.0f, -6));   // smallest normal
  CHECK(float_to_e4m3fn(std::ldexp(1.0f, -10)) == 0x00);  // half the smallest denormal: to 0
  CHECK(float_to_e4m3fn(std::ldexp(3.0f, -10)) == 0x02);  // 1.5 steps: tie to even 2
  CHECK(float_to_e4m3fn(std::ldexp(7.5f, -9)) == 0x08);   // rounds up to normal
  CHECK(float_to_e4m3fn(-0.0f) == 0x80);
  CHECK(float_to_e4m3fn(-std::ldexp(1.0f, -12)) == 0x80);  // underflow keeps the sign
  CHECK(std::signbit(e4m3fn_to_float(0x80)));
  CHECK(float_to_e4m3fn(17.0f) == float_to_e4m3fn(16.0f));  // 17: tie between 16 and 18, even
  CHECK(float_to_e4m3fn(19.0f) == float_to_e4m3fn(20.0f));  // 19: tie between 18 and 20, even
}

TEST_CASE("fp8 e5m2 overflows to infinity, keeps infinities and NaN", "[core][half]") {
  CHECK(float_to_e5m2(57344.0f) == 0x7b);  // largest finite
  CHECK(float_to_e5m2(std::nextafter(61440.0f, 0.0f)) == 0x7b);
  CHECK(float_to_e5m2(61440.0f) == 0x7c);  // the tie to 65536: to even, infinity
  CHECK(float_to_e5m2(1e9f) == 0x7c);
  CHECK(float_to_e5m2(-1e9f) == 0xfc);
  CHECK(float_to_e5m2(INFINITY) == 0x7c);
  CHECK(float_to_e5m2(-INFINITY) == 0xfc);
  CHECK(float_to_e5m2(std::nanf("")) == 0x7f);
  CHECK(float_to_e5m2(-std::nanf("")) == 0xff);
  CHECK(float_to_e5m2(std::bit_cast<float>(0x7f800001u)) == 0x7f);  // never infinity
  CHECK(std::isinf(e5m2_to_float(0x7c)));
  for (uint8_t nan : {0x7d, 0x7e, 0x7f, 0xfd, 0xfe, 0xff}) CHECK(std::isnan(e5m2_to_float(nan)));
  CHECK(e5m2_to_float(0x01) == std::ldexp(1.0f, -16));  // smallest denormal
  CHECK(e5m2_to_float(0x04) == std::ldexp(1.0f, -14));  // smallest normal
  CHECK(float_to_e5m2(std::ldexp(1.0f, -17)) == 0x00);  // tie to even zero
  CHECK(float_to_e5m2(std::ldexp(3.0f, -17)) == 0x02);  // tie to even 2
  CHECK(float_to_e5m2(-0.0f) == 0x80);
  CHECK(float_to_e5m2(9.0f) == 0x48);   // 9: tie between 8 and 10, even 8
  CHECK(float_to_e5m2(11.0f) == 0x4a);  // 11: tie between 10 and 12, even 12
}

}  // namespace
}  // namespace weft
