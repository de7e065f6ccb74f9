// weft/dtype.h: the element types weft communicates and reduces, their sizes and names.
//
// DType is what a Tensor view holds and what crosses the wire in a collective's header; its
// numeric values are stable (the C API and the desync check send them). Float16, BFloat16 and the
// two fp8 formats have no arithmetic C++ type: weft::Half, weft::BFloat16, weft::Float8E4M3 and
// weft::Float8E5M2 below are containers only, and reductions on them go through float
// (weft/half.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <type_traits>

namespace weft {

enum class DType : uint8_t {
  Float32 = 0,
  Float64 = 1,
  Float16 = 2,   // IEEE 754 binary16
  BFloat16 = 3,  // bfloat16: float32's exponent, 8-bit significand
  Int8 = 4,
  UInt8 = 5,
  Int32 = 6,
  Int64 = 7,
  Bool = 8,  // one byte per element; zero is false, anything else true
  // Appended later (values are never renumbered): PyTorch's torch.uint32 / torch.uint64, NCCL's
  // ncclUint32 / ncclUint64.
  UInt32 = 9,
  UInt64 = 10,
  // Appended later: PyTorch's torch.float8_e4m3fn / torch.float8_e5m2, NCCL's ncclFloat8e4m3 /
  // ncclFloat8e5m2 (NCCL 2.24+). OCP 8-bit floats, one byte per element:
  Float8E4M3 = 11,  // e4m3 "fn": 4 exponent bits (bias 7), 3 significand bits, no infinities,
                    // NaN is S.1111.111 only; largest finite 448
  Float8E5M2 = 12,  // e5m2: 5 exponent bits (bias 15), 2 significand bits, IEEE-like infinities
                    // and NaNs; largest finite 57344
};

// Number of DType values; a byte from the wire is a DType only if it is below this.
inline constexpr int kNumDTypes = 13;

// Every DType in declaration order, for tests and tools that iterate over them.
inline constexpr DType kAllDTypes[kNumDTypes] = {
    DType::Float32, DType::Float64,    DType::Float16,    DType::BFloat16, DType::Int8,
    DType::UInt8,   DType::Int32,      DType::Int64,      DType::Bool,     DType::UInt32,
    DType::UInt64,  DType::Float8E4M3, DType::Float8E5M2,
};

// True when `value` is one of the enumerators (a DType made from an arbitrary integer may not be).
constexpr bool is_valid(DType dtype) { return static_cast<uint8_t>(dtype) < kNumDTypes; }

// Bytes per element; 0 for an invalid DType.
constexpr size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::Float64:
    case DType::Int64:
    case DType::UInt64:
      return 8;
    case DType::Float32:
    case DType::Int32:
    case DType::UInt32:
      return 4;
    case DType::Float16:
    case DType::BFloat16:
      return 2;
    case DType::Int8:
    case DType::UInt8:
    case DType::Bool:
    case DType::Float8E4M3:
    case DType::Float8E5M2:
      return 1;
  }
  return 0;
}

// PyTorch's names: "float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64",
// "bool", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2"; "invalid" for an invalid DType.
std::string_view dtype_name(DType dtype);

// Accepts the names above, PyTorch's aliases ("float", "double", "half", "long", "int") and the
// nccl-tests short names ("half", "bfloat16", "int8", "uint8", "int32", "int64", "float",
// "double", "f8e4m3", "f8e5m2"); case-insensitive. nullopt for anything else.
std::optional<DType> parse_dtype(std::string_view text);

// Float32, Float64, Float16, BFloat16, Float8E4M3, Float8E5M2.
constexpr bool is_floating(DType dtype) {
  return dtype == DType::Float32 || dtype == DType::Float64 || dtype == DType::Float16 ||
         dtype == DType::BFloat16 || dtype == DType::Float8E4M3 || dtype == DType::Float8E5M2;
}

// Int8, UInt8, Int32, Int64, UInt32, UInt64. Bool is neither integral nor floating, as in
// PyTorch's default.
constexpr bool is_integral(DType dtype) {
  return dtype == DType::Int8 || dtype == DType::UInt8 || dtype == DType::Int32 ||
         dtype == DType::Int64 || dtype == DType::UInt32 || dtype == DType::UInt64;
}

// UInt8, UInt32, UInt64: the integers whose min, max and avg are unsigned.
constexpr bool is_unsigned_integral(DType dtype) {
  return dtype == DType::UInt8 || dtype == DType::UInt32 || dtype == DType::UInt64;
}

// Storage for one IEEE binary16 value (bits as in memory). No arithmetic: convert with
// half_to_float / float_to_half (weft/half.h) or the caller's own half type.
struct Half {
  uint16_t bits;
};
// Storage for one bfloat16 value (the top 16 bits of the float32 it approximates).
struct BFloat16 {
  uint16_t bits;
};
// Storage for one fp8 e4m3fn value (torch.float8_e4m3fn); convert with e4m3fn_to_float /
// float_to_e4m3fn (weft/half.h).
struct Float8E4M3 {
  uint8_t bits;
};
// Storage for one fp8 e5m2 value (torch.float8_e5m2: float16's top byte); convert with
// e5m2_to_float / float_to_e5m2 (weft/half.h).
struct Float8E5M2 {
  uint8_t bits;
};

// dtype_of_v<T>: the DType of C++ element type T, so Tensor::of(p, n) can take a typed pointer.
// Integers map by width and signedness (int64_t is `long`, but `long long` also maps to Int64,
// and size_t to UInt64); plain `char`, whose signedness is the platform's choice, deliberately
// maps to nothing. 16-bit integers have no DType.
template <typename T, typename = void>
struct dtype_of {};

template <>
struct dtype_of<float> {
  static constexpr DType value = DType::Float32;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::Float64;
};
template <>
struct dtype_of<Half> {
  static constexpr DType value = DType::Float16;
};
template <>
struct dtype_of<BFloat16> {
  static constexpr DType value = DType::BFloat16;
};
template <>
struct dtype_of<Float8E4M3> {
  static constexpr DType value = DType::Float8E4M3;
};
template <>
struct dtype_of<Float8E5M2> {
  static constexpr DType value = DType::Float8E5M2;
};
template <>
struct dtype_of<bool> {
  static constexpr DType value = DType::Bool;
};
template <typename T>
struct dtype_of<T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool> &&
                                    !std::is_same_v<T, char> &&
                                    (sizeof(T) == 1 || sizeof(T) == 4 || sizeof(T) == 8)>> {
  static constexpr DType value =
      sizeof(T) == 8        ? (std::is_signed_v<T> ? DType::Int64 : DType::UInt64)
      : sizeof(T) == 4      ? (std::is_signed_v<T> ? DType::Int32 : DType::UInt32)
      : std::is_signed_v<T> ? DType::Int8
                            : DType::UInt8;
};

template <typename T>
inline constexpr DType dtype_of_v = dtype_of<std::remove_cv_t<T>>::value;

}  // namespace weft
