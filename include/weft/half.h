// weft/half.h: float16, bfloat16 and fp8 (e4m3fn, e5m2) conversions to and from float, in
// software.
//
// Conversions to float are exact. Conversions from float round to nearest, ties to even, as IEEE
// 754 requires: values past the largest finite half (65504; bfloat16: about 3.39e38) that round
// up become infinity, tiny values become denormals or signed zero, infinities stay infinities,
// and NaN stays NaN (quiet, sign and top payload bits kept, never turned into infinity).
//
// Every function is branch-free (selects, integer adds and one float add), so a loop over an
// array of them vectorises. Float denormals are never produced or consumed by arithmetic in
// half_to_float, so a process running with flush-to-zero / denormals-are-zero (as PyTorch's
// set_flush_denormal enables) still converts half denormals exactly.
//
// The fp8 formats (OCP 8-bit floats, PyTorch's torch.float8_e4m3fn and torch.float8_e5m2) round to
// nearest even too, but follow PyTorch (c10/util/Float8_e4m3fn.h, Float8_e5m2.h) where IEEE has
// nothing to say, bit for bit, so that a tensor converted by torch and one reduced by weft agree:
//   e4m3fn has no infinity. |value| >= 480 (which would round past 448, the largest finite), an
//     infinity and a NaN all become NaN, 0x7f with the input's sign; values in (448, 464] round
//     down to 448 and those in (464, 480) up into the NaN encoding. Nothing saturates: a
//     saturating conversion (to +-448) is what NCCL's and CUDA's __NV_SATFINITE do, not PyTorch's
//     default cast, and weft's reductions keep PyTorch's.
//   e5m2 is IEEE-like: |value| >= 61440 (the tie between 57344 and 65536, rounded to even) and
//     infinities become infinity (0x7c), and every NaN becomes 0x7f with the input's sign (the
//     payload is dropped, as in PyTorch).
// Both turn tiny values into denormals (e4m3fn: steps of 2^-9; e5m2: 2^-16) or signed zero.
#pragma once

#include <bit>
#include <cstdint>

namespace weft {
namespace detail {
// `condition ? a : b` written with a mask. GCC turns a plain ternary whose operand is a float
// operation into a branch (it may not speculate a float op that could trap) and then refuses to
// vectorise the loop; the mask form keeps every lane straight-line.
inline uint32_t select_bits(bool condition, uint32_t a, uint32_t b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(condition);
  return (a & mask) | (b & ~mask);
}
}  // namespace detail

inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t magnitude = h & 0x7fffu;
  // Normal numbers: move exponent and significand into place and rebias the exponent by
  // 127 - 15 = 112. Infinity and NaN (exponent 31) need another 112 to reach exponent 255; the
  // significand, and so any NaN payload, is carried over bit for bit.
  uint32_t bits = (magnitude << 13) + (112u << 23);
  bits += magnitude >= 0x7c00u ? (112u << 23) : 0u;
  // Zero and denormals (m * 2^-24): build the normal float 2^-14 * (1 + m/1024) and subtract
  // 2^-14. Both operands and the result are normal floats, so the subtraction is exact.
  const float denormal =
      std::bit_cast<float>((magnitude << 13) + (113u << 23)) - std::bit_cast<float>(113u << 23);
  bits = detail::select_bits(magnitude < 0x0400u, std::bit_cast<uint32_t>(denormal), bits);
  return std::bit_cast<float>(bits | sign);
}

inline uint16_t float_to_half(float value) {
  const uint32_t all = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (all >> 16) & 0x8000u;
  const uint32_t f = all & 0x7fffffffu;
  // NaN: keep the top 10 payload bits and set the quiet bit, so a payload held only in the low
  // 13 bits cannot turn into infinity.
  const uint32_t nan = 0x7e00u | ((f >> 13) & 0x3ffu);
  // Results that are normal halves: rebias the exponent by -112 (0xc8000000 is -(112 << 23)
  // modulo 2^32) and round the 13 dropped bits to nearest even by adding 0xfff plus the lowest
  // kept bit. A carry out of the significand bumps the exponent, which is exactly right, and
  // from 65520 upwards it reaches 0x7c00, infinity.
  const uint32_t normal = (f + 0xc8000fffu + ((f >> 13) & 1u)) >> 13;
  // Results that are denormal halves (|value| < 2^-14): adding 0.5 leaves |value| in the low
  // bits of a float whose ulp is 2^-24, the half denormal step, and the float add rounds to
  // nearest even for us. 0x3f000000 is 0.5's bits. A carry to 0x400 is the smallest normal half.
  const uint32_t denormal = std::bit_cast<uint32_t>(std::bit_cast<float>(f) + 0.5f) - 0x3f000000u;
  uint32_t out = detail::select_bits(f < (113u << 23), denormal, normal);
  out = detail::select_bits(f >= (143u << 23), 0x7c00u, out);  // >= 65536: infinity, and inf
  out = detail::select_bits(f > 0x7f800000u, nan, out);
  return static_cast<uint16_t>(out | sign);
}

inline float bf16_to_float(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

inline uint16_t float_to_bf16(float value) {
  const uint32_t f = std::bit_cast<uint32_t>(value);
  // Round the 16 dropped bits to nearest even; a carry into the exponent is right, and past the
  // largest finite bfloat16 it yields infinity. The sign bit is never reached: the largest
  // magnitude, 0x7fffffff, is NaN and takes the other branch.
  const uint32_t rounded = (f + 0x7fffu + ((f >> 16) & 1u)) >> 16;
  const uint32_t nan = (f >> 16) | 0x40u;  // quiet, sign and top payload kept
  return static_cast<uint16_t>((f & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

// fp8 e4m3fn to float, exact: 0x7f and 0xff (the only NaNs) give a quiet NaN with their sign.
inline float e4m3fn_to_float(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t magnitude = b & 0x7fu;
  // Normal numbers: exponent and significand into place, exponent rebiased by 127 - 7 = 120.
  const uint32_t normal = (magnitude << 20) + (120u << 23);
  // Zero and denormals (m * 2^-9): the normal float 2^-6 * (1 + m/8) minus 2^-6, exact, as in
  // half_to_float, so that flush-to-zero modes cannot touch it.
  const float denormal =
      std::bit_cast<float>((magnitude << 20) + (121u << 23)) - std::bit_cast<float>(121u << 23);
  uint32_t bits = detail::select_bits(magnitude < 0x08u, std::bit_cast<uint32_t>(denormal), normal);
  bits = detail::select_bits(magnitude == 0x7fu, 0x7fc00000u, bits);
  return std::bit_cast<float>(bits | sign);
}

inline uint8_t float_to_e4m3fn(float value) {
  const uint32_t all = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (all >> 24) & 0x80u;
  const uint32_t f = all & 0x7fffffffu;
  // Normal results (|value| >= 2^-6): rebias the exponent by -120 (0xc4000000 is -(120 << 23)
  // modulo 2^32) and round the 20 dropped bits to nearest even, as float_to_half does.
  const uint32_t normal = (f + 0xc407ffffu + ((f >> 20) & 1u)) >> 20;
  // Denormal results: 2^14's float ulp is 2^-9, the e4m3 denormal step; the float add rounds to
  // nearest even. 0x46800000 is 2^14's bits. A carry to 0x08 is the smallest normal.
  const uint32_t denormal =
      std::bit_cast<uint32_t>(std::bit_cast<float>(f) + 16384.0f) - 0x46800000u;
  uint32_t out = detail::select_bits(f < (121u << 23), denormal, normal);
  out = detail::select_bits(f >= 0x43f00000u, 0x7fu, out);  // >= 480, inf, NaN: NaN
  return static_cast<uint8_t>(out | sign);
}

// fp8 e5m2 to float, exact: e5m2 is float16's top byte.
inline float e5m2_to_float(uint8_t b) { return half_to_float(static_cast<uint16_t>(b << 8)); }

inline uint8_t float_to_e5m2(float value) {
  const uint32_t all = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (all >> 24) & 0x80u;
  const uint32_t f = all & 0x7fffffffu;
  // Normal results (|value| >= 2^-14): rebias by -112 and round the 21 dropped bits to nearest
  // even; from 61440 upwards the carry reaches 0x7c, infinity.
  const uint32_t normal = (f + 0xc80fffffu + ((f >> 21) & 1u)) >> 21;
  // Denormal results: 2^7's float ulp is 2^-16, the e5m2 denormal step. 0x43000000 is 2^7.
  const uint32_t denormal = std::bit_cast<uint32_t>(std::bit_cast<float>(f) + 128.0f) - 0x43000000u;
  uint32_t out = detail::select_bits(f < (113u << 23), denormal, normal);
  out = detail::select_bits(f >= (143u << 23), 0x7cu, out);  // >= 65536, and inf: infinity
  out = detail::select_bits(f > 0x7f800000u, 0x7fu, out);    // NaN
  return static_cast<uint8_t>(out | sign);
}

}  // namespace weft
