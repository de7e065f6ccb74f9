// tests/core/reference.h: slow, obviously-correct scalar references for the reduce kernels.
//
// Written independently of weft/half.h and runtime/reduce.cc: formats are decoded with ldexp
// and rounded with frexp + nearbyint in double, integers are wrapped through __int128, so a bug
// shared by a kernel and its reference is unlikely.
#pragma once

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "weft/dtype.h"
#include "weft/reduce_op.h"

namespace weft::test {

// A binary floating-point format: `man` stored significand bits, `exp` exponent bits.
// `finite` marks the OCP "fn" formats (fp8 e4m3fn): no infinities, the all-ones exponent holds
// normal numbers, and only the all-ones pattern (S.1111.111) is NaN. Rounding into them follows
// PyTorch's conversion: a value that rounds past the largest finite one, an infinity and a NaN
// all become NaN (weft/half.h).
struct Format {
  int man;
  int exp;
  bool finite = false;
  int bias() const { return (1 << (exp - 1)) - 1; }
  uint32_t exp_mask() const { return (1u << exp) - 1; }
};
inline constexpr Format kHalfFormat{10, 5};
inline constexpr Format kBf16Format{7, 8};
inline constexpr Format kFloatFormat{23, 8};
inline constexpr Format kE4m3fnFormat{3, 4, true};
inline constexpr Format kE5m2Format{2, 5};

inline double ref_decode(uint32_t bits, Format f) {
  const bool negative = (bits >> (f.man + f.exp)) & 1u;
  const uint32_t e = (bits >> f.man) & f.exp_mask();
  const uint32_t m = bits & ((1u << f.man) - 1);
  double v;
  if (f.finite && (bits & ((1u << (f.man + f.exp)) - 1)) == (1u << (f.man + f.exp)) - 1) {
    v = std::nan("");
  } else if (e == f.exp_mask() && !f.finite) {
    v = m != 0 ? std::nan("") : INFINITY;
  } else if (e == 0) {
    v = std::ldexp(static_cast<double>(m), 1 - f.bias() - f.man);
  } else {
    v = std::ldexp(static_cast<double>(m + (1u << f.man)), static_cast<int>(e) - f.bias() - f.man);
  }
  return negative ? -v : v;
}

// Rounds x, taken as exact, to format f: nearest, ties to even. NaN gives a quiet NaN.
inline uint32_t ref_encode(double x, Format f) {
  const uint32_t sign = std::signbit(x) ? 1u << (f.man + f.exp) : 0u;
  const uint32_t inf = f.exp_mask() << f.man;
  const uint32_t all_ones = (1u << (f.man + f.exp)) - 1;  // the finite formats' only NaN
  if (std::isnan(x)) return f.finite ? sign | all_ones : sign | inf | (1u << (f.man - 1));
  const double ax = std::fabs(x);
  if (std::isinf(ax)) return sign | (f.finite ? all_ones : inf);
  const int min_exp = 1 - f.bias();  // exponent of the smallest normal number
  int e2 = 0;
  std::frexp(ax, &e2);  // ax = fraction * 2^e2, fraction in [0.5, 1)
  int exponent = std::max(e2 - 1, min_exp);
  // In units of the format's spacing at this exponent; dividing by a power of two is exact.
  const double units = ax / std::ldexp(1.0, exponent - f.man);
  uint64_t q = static_cast<uint64_t>(std::nearbyint(units));  // default mode: ties to even
  if (q == (uint64_t{1} << (f.man + 1))) {                    // rounded up into the next binade
    q >>= 1;
    ++exponent;
  }
  if (q < (uint64_t{1} << f.man)) return sign | static_cast<uint32_t>(q);  // zero or denormal
  const int field = exponent + f.bias();
  if (f.finite) {
    if (field > static_cast<int>(f.exp_mask())) return sign | all_ones;
    const uint32_t code =
        (static_cast<uint32_t>(field) << f.man) | static_cast<uint32_t>(q - (uint64_t{1} << f.man));
    return sign | std::min(code, all_ones);  // rounded onto or past the NaN pattern: NaN
  }
  if (field >= static_cast<int>(f.exp_mask())) return sign | inf;
  return sign | (static_cast<uint32_t>(field) << f.man) |
         static_cast<uint32_t>(q - (uint64_t{1} << f.man));
}

inline Format format_of(DType dtype) {
  return dtype == DType::Float16      ? kHalfFormat
         : dtype == DType::BFloat16   ? kBf16Format
         : dtype == DType::Float8E4M3 ? kE4m3fnFormat
         : dtype == DType::Float8E5M2 ? kE5m2Format
                                      : kFloatFormat;
}

// Element access on type-erased buffers.
template <typename T>
T load(const void* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
template <typename T>
void store(void* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

// Reads a floating element (float32/float16/bfloat16/float64/fp8) exactly as a double.
inline double load_real(DType dtype, const void* p) {
  switch (dtype) {
    case DType::Float64:
      return load<double>(p);
    case DType::Float32:
      return static_cast<double>(load<float>(p));
    case DType::Float8E4M3:
    case DType::Float8E5M2:
      return ref_decode(load<uint8_t>(p), format_of(dtype));
    default:
      return ref_decode(load<uint16_t>(p), format_of(dtype));
  }
}

// Writes x rounded once to the dtype. float64 must already be the result (no rounding left).
inline void store_real(DType dtype, void* p, double x) {
  switch (dtype) {
    case DType::Float64:
      return store<double>(p, x);
    case DType::Float32:
      return store<uint32_t>(p, ref_encode(x, kFloatFormat));
    case DType::Float8E4M3:
    case DType::Float8E5M2:
      return store<uint8_t>(p, static_cast<uint8_t>(ref_encode(x, format_of(dtype))));
    default:
      return store<uint16_t>(p, static_cast<uint16_t>(ref_encode(x, format_of(dtype))));
  }
}

// Integer elements widened to __int128, and a wrapped store back (modulo 2^bits).
inline __int128 load_int(DType dtype, const void* p) {
  switch (dtype) {
    case DType::Int8:
      return load<int8_t>(p);
    case DType::UInt8:
      return load<uint8_t>(p);
    case DType::Int32:
      return load<int32_t>(p);
    case DType::UInt32:
      return load<uint32_t>(p);
    case DType::UInt64:
      return load<uint64_t>(p);
    default:
      return load<int64_t>(p);
  }
}
inline void store_wrapped(DType dtype, void* p, __int128 v) {
  const unsigned __int128 u = static_cast<unsigned __int128>(v);  // modulo 2^128
  const uint64_t low = static_cast<uint64_t>(u);                  // little-endian low bytes
  std::memcpy(p, &low, dtype_size(dtype));
}

// IEEE 754-2019 minimum/maximum on doubles: NaN wins, -0 < +0.
inline double ref_min(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::nan("");
  if (a == 0 && b == 0) return (std::signbit(a) || std::signbit(b)) ? -0.0 : 0.0;
  return a < b ? a : b;
}
inline double ref_max(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::nan("");
  if (a == 0 && b == 0) return (std::signbit(a) && std::signbit(b)) ? -0.0 : 0.0;
  return a > b ? a : b;
}

// out = a op b, for an op that check_supported accepts on dtype (Avg and PremulSum as Sum).
inline void ref_combine(DType dtype, ReduceOp::Kind kind, const void* a, const void* b, void* out) {
  if (kind == ReduceOp::Avg || kind == ReduceOp::PremulSum) kind = ReduceOp::Sum;
  if (dtype == DType::Bool) {
    const bool x = load<uint8_t>(a) != 0, y = load<uint8_t>(b) != 0;
    bool r = false;
    switch (kind) {
      case ReduceOp::Sum:
      case ReduceOp::Max:
      case ReduceOp::BOr:
        r = x || y;
        break;
      case ReduceOp::Prod:
      case ReduceOp::Min:
      case ReduceOp::BAnd:
        r = x && y;
        break;
      default:
        r = x != y;
    }
    return store<uint8_t>(out, r ? 1 : 0);
  }
  if (is_floating(dtype)) {
    const double x = load_real(dtype, a), y = load_real(dtype, b);
    double r = 0;
    switch (kind) {
      case ReduceOp::Sum:
        r = x + y;
        break;
      case ReduceOp::Prod:
        r = x * y;
        break;
      case ReduceOp::Min:
        r = ref_min(x, y);
        break;
      default:
        r = ref_max(x, y);
    }
    return store_real(dtype, out, r);
  }
  const __int128 x = load_int(dtype, a), y = load_int(dtype, b);
  __int128 r = 0;
  switch (kind) {
    case ReduceOp::Sum:
      r = x + y;
      break;
    case ReduceOp::Prod:
      // In unsigned arithmetic: uint64 max squared overflows a signed __int128 (undefined); the
      // low bits, all that the dtype keeps, are the same either way.
      r = static_cast<__int128>(static_cast<unsigned __int128>(x) *
                                static_cast<unsigned __int128>(y));
      break;
    case ReduceOp::Min:
      r = x < y ? x : y;
      break;
    case ReduceOp::Max:
      r = x > y ? x : y;
      break;
    case ReduceOp::BAnd:
      r = x & y;
      break;
    case ReduceOp::BOr:
      r = x | y;
      break;
    default:
      r = x ^ y;
  }
  store_wrapped(dtype, out, r);
}

// True when two elements are the same value: equal bytes, or both NaN (payloads may differ).
inline bool same_element(DType dtype, const void* got, const void* want) {
  if (is_floating(dtype) && std::isnan(load_real(dtype, want))) {
    return std::isnan(load_real(dtype, got));
  }
  return std::memcmp(got, want, dtype_size(dtype)) == 0;
}

inline std::string show_element(DType dtype, const void* p) {
  uint64_t bits = 0;
  std::memcpy(&bits, p, dtype_size(dtype));
  if (is_floating(dtype)) return fmt::format("{} (0x{:x})", load_real(dtype, p), bits);
  if (dtype == DType::Bool) return fmt::format("bool byte {}", bits);
  return fmt::format("{}", static_cast<int64_t>(load_int(dtype, p)));
}

}  // namespace weft::test
