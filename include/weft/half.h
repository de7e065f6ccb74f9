// weft/half.h: float16 and bfloat16 conversions to and from float, in software.
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

}  // namespace weft
