// weft/half.h against the format-generic reference in reference.h: every half and bfloat16
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

}  // namespace
}  // namespace weft
