// How the kernels are built. Each is a plain loop over one element function, instantiated per
// dtype x op and picked from a table (kCombine), so a call costs one indirect jump and the loop.
// Element functions are branch-free: a ternary whose operand is a float operation becomes a
// branch that GCC will not if-convert (it may not speculate an op that could trap), and the loop
// then stays scalar. With that, -O3 vectorises every loop but int64 prod/min/max, which SSE2 and
// AVX2 lack instructions for (checked with -fopt-info-vec-missed).
//
// On x86-64 each loop is compiled for SSE2 and for AVX2 (WEFT_KERNEL) and float16 additionally
// uses F16C's hardware conversions. Measured on the development VM (EPYC, 2 vCPUs under load, so
// ratios only), combine of float16 sum over 1 MiB buffers: SSE2 0.55 GB/s, AVX2 2.3 GB/s, F16C
// 10 GB/s; float32 sum 20 GB/s on SSE2. float16 narrowing from 32-bit lanes is what SSE2 lacks.
#include "runtime/reduce.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstdint>
#include <type_traits>

#include <fmt/format.h>

#include "weft/error.h"
#include "weft/half.h"

// WEFT_KERNEL compiles a loop twice, for the x86-64 baseline (SSE2) and for AVX2, and the loader
// picks one (an ifunc), so that one binary runs everywhere and is fast where it can be.
// Not under ThreadSanitizer: it instruments the ifunc resolvers, which the loader runs before
// the sanitizer's runtime is up, and the process dies at load.
#if defined(__x86_64__) && defined(__ELF__) && defined(__GNUC__) && !defined(__SANITIZE_THREAD__)
#include <immintrin.h>
#define WEFT_KERNEL __attribute__((target_clones("avx2", "default")))
#define WEFT_HAVE_F16C_PATH 1
#else
#define WEFT_KERNEL
#define WEFT_HAVE_F16C_PATH 0
#endif

namespace weft::reduce {
namespace {

// The unsigned integer of the same width as T, for bit manipulation and wrapping arithmetic.
template <typename T>
using Bits =
    std::conditional_t<sizeof(T) == 8, uint64_t,
                       std::conditional_t<sizeof(T) == 4, uint32_t,
                                          std::conditional_t<sizeof(T) == 2, uint16_t, uint8_t>>>;

// Element functions, one per op, for arithmetic types T (floating or integer). Integer sum and
// prod run in the unsigned type, where overflow wraps by definition; the conversion back to a
// signed T is modular in C++20.
struct SumFn {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      return a + b;
    } else {
      return static_cast<T>(static_cast<Bits<T>>(a) + static_cast<Bits<T>>(b));
    }
  }
};

struct ProdFn {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      return a * b;
    } else {
      // uint8_t operands promote to int; 255 * 255 fits, so this never overflows int either.
      return static_cast<T>(static_cast<Bits<T>>(a) * static_cast<Bits<T>>(b));
    }
  }
};

// NaN-propagating, with -0 < +0. For equal inputs the bitwise or of the two picks -0 from
// {-0, +0} and changes nothing otherwise (equal non-zero floats have equal bits); max uses and.
// `a + b` is a quiet NaN when either input is NaN. Every candidate is computed before the
// selects, which keeps them selects (see the top of the file); this exact shape vectorises for
// float and double alike, while mask arithmetic on the compare results does not for double.
struct MinFn {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      const T both = std::bit_cast<T>(std::bit_cast<Bits<T>>(a) | std::bit_cast<Bits<T>>(b));
      const T nan = a + b;
      T r = a < b ? a : b;
      r = a == b ? both : r;
      return a != a || b != b ? nan : r;
    } else {
      return std::min(a, b);
    }
  }
};

struct MaxFn {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      const T both = std::bit_cast<T>(std::bit_cast<Bits<T>>(a) & std::bit_cast<Bits<T>>(b));
      const T nan = a + b;
      T r = a > b ? a : b;
      r = a == b ? both : r;
      return a != a || b != b ? nan : r;
    } else {
      return std::max(a, b);
    }
  }
};

struct BAndFn {
  template <typename T>
  static T apply(T a, T b) {
    return static_cast<T>(a & b);
  }
};
struct BOrFn {
  template <typename T>
  static T apply(T a, T b) {
    return static_cast<T>(a | b);
  }
};
struct BXorFn {
  template <typename T>
  static T apply(T a, T b) {
    return static_cast<T>(a ^ b);
  }
};

// Bool elements are bytes read as uint8_t (reading a bool object holding 2 would be undefined);
// any non-zero byte is true and results are 0 or 1.
struct LogicalOrFn {
  static uint8_t apply(uint8_t a, uint8_t b) { return (a | b) != 0; }
};
struct LogicalAndFn {
  static uint8_t apply(uint8_t a, uint8_t b) { return (a != 0) & (b != 0); }
};
struct LogicalXorFn {
  static uint8_t apply(uint8_t a, uint8_t b) { return (a != 0) ^ (b != 0); }
};

// Storage type and arithmetic type of each dtype; half types compute in float.
struct Fp16 {
  static float load(uint16_t v) { return half_to_float(v); }
  static uint16_t store(float v) { return float_to_half(v); }
};
struct Bf16 {
  static float load(uint16_t v) { return bf16_to_float(v); }
  static uint16_t store(float v) { return float_to_bf16(v); }
};
// fp8 computes in float like the half types: each element is widened exactly, combined once in
// float and rounded once back (weft/half.h says how: PyTorch's rounding, overflow and NaN).
struct Fp8E4M3 {
  static float load(uint8_t v) { return e4m3fn_to_float(v); }
  static uint8_t store(float v) { return float_to_e4m3fn(v); }
};
struct Fp8E5M2 {
  static float load(uint8_t v) { return e5m2_to_float(v); }
  static uint8_t store(float v) { return float_to_e5m2(v); }
};

// The storage type a Conv reads and writes: uint16_t for the half types, uint8_t for fp8.
template <typename Conv>
using Storage = decltype(Conv::store(0.0f));

using CombineFn = void (*)(void* dst, const void* a, const void* b, size_t count);

// Half types without F16C (bfloat16 and fp8 always): one fused loop, load, convert, combine,
// convert, store. The software conversions are branch-free and vectorise inside it.
template <typename T, typename Fn>
WEFT_KERNEL void combine_loop(void* dst, const void* a, const void* b, size_t count) {
  T* d = static_cast<T*>(dst);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < count; ++i) d[i] = Fn::template apply<T>(x[i], y[i]);
}

template <typename Conv, typename Fn>
WEFT_KERNEL void combine_loop_half(void* dst, const void* a, const void* b, size_t count) {
  using S = Storage<Conv>;
  S* d = static_cast<S*>(dst);
  const S* x = static_cast<const S*>(a);
  const S* y = static_cast<const S*>(b);
  for (size_t i = 0; i < count; ++i) {
    d[i] = Conv::store(Fn::template apply<float>(Conv::load(x[i]), Conv::load(y[i])));
  }
}

#if WEFT_HAVE_F16C_PATH
// float16 on CPUs with F16C: the hardware converts 8 elements per instruction, with the same
// round-to-nearest-even, denormal and infinity results as half.h. A block of each input becomes
// float in L1-resident scratch, the op runs there (vectorised for AVX2), and the block goes back.
constexpr size_t kF16cBlock = 256;  // 2 x 1 KiB of float scratch

__attribute__((target("avx2,f16c"))) void halves_to_floats(float* out, const uint16_t* in,
                                                           size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) out[i] = half_to_float(in[i]);
}

__attribute__((target("avx2,f16c"))) void floats_to_halves(uint16_t* out, const float* in,
                                                           size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < n; ++i) out[i] = float_to_half(in[i]);
}

template <typename Fn>
__attribute__((target("avx2,f16c"))) void combine_fp16_f16c(void* dst, const void* a, const void* b,
                                                            size_t count) {
  uint16_t* d = static_cast<uint16_t*>(dst);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  float fx[kF16cBlock];
  float fy[kF16cBlock];
  for (size_t base = 0; base < count; base += kF16cBlock) {
    const size_t n = std::min(kF16cBlock, count - base);
    halves_to_floats(fx, x + base, n);
    halves_to_floats(fy, y + base, n);
    for (size_t i = 0; i < n; ++i) fx[i] = Fn::template apply<float>(fx[i], fy[i]);
    floats_to_halves(d + base, fx, n);
  }
}

bool cpu_has_f16c() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
}
#endif

// Whether float16 kernels may use F16C; tests turn it off to cover the portable path too.
std::atomic<bool> g_fp16_hardware{true};

template <typename Fn>
void combine_fp16(void* dst, const void* a, const void* b, size_t count) {
#if WEFT_HAVE_F16C_PATH
  static const bool has_f16c = cpu_has_f16c();
  if (has_f16c && g_fp16_hardware.load(std::memory_order_relaxed)) {
    return combine_fp16_f16c<Fn>(dst, a, b, count);
  }
#endif
  combine_loop_half<Fp16, Fn>(dst, a, b, count);
}

template <typename Fn>
WEFT_KERNEL void combine_loop_bool(void* dst, const void* a, const void* b, size_t count) {
  uint8_t* d = static_cast<uint8_t*>(dst);
  const uint8_t* x = static_cast<const uint8_t*>(a);
  const uint8_t* y = static_cast<const uint8_t*>(b);
  for (size_t i = 0; i < count; ++i) d[i] = Fn::apply(x[i], y[i]);
}

// The arithmetic kernels of one dtype, indexed by ReduceOp::Kind: bitwise ops for integers,
// PremulSum (summing premultiplied inputs) for floats. nullptr where check_supported refuses the
// op; it runs first, so a nullptr is never called.
template <template <typename> class Loop, bool kBitwise>
constexpr std::array<CombineFn, ReduceOp::kNumKinds> arithmetic_row() {
  if constexpr (kBitwise) {
    return {Loop<SumFn>::fn, Loop<ProdFn>::fn, Loop<MinFn>::fn, Loop<MaxFn>::fn, Loop<SumFn>::fn,
            nullptr,         Loop<BAndFn>::fn, Loop<BOrFn>::fn, Loop<BXorFn>::fn};
  } else {
    return {Loop<SumFn>::fn, Loop<ProdFn>::fn, Loop<MinFn>::fn, Loop<MaxFn>::fn, Loop<SumFn>::fn,
            Loop<SumFn>::fn, nullptr,          nullptr,         nullptr};
  }
}

template <typename T>
struct Plain {
  template <typename Fn>
  struct Loop {
    static constexpr CombineFn fn = &combine_loop<T, Fn>;
  };
};
template <typename Conv>
struct ViaFloat {
  template <typename Fn>
  struct Loop {
    static constexpr CombineFn fn = &combine_loop_half<Conv, Fn>;
  };
};
template <>
template <typename Fn>
struct ViaFloat<Fp16>::Loop {
  static constexpr CombineFn fn = &combine_fp16<Fn>;
};

// Indexed by DType, then ReduceOp::Kind.
constexpr std::array<std::array<CombineFn, ReduceOp::kNumKinds>, kNumDTypes> kCombine = {{
    arithmetic_row<Plain<float>::Loop, false>(),
    arithmetic_row<Plain<double>::Loop, false>(),
    arithmetic_row<ViaFloat<Fp16>::Loop, false>(),
    arithmetic_row<ViaFloat<Bf16>::Loop, false>(),
    arithmetic_row<Plain<int8_t>::Loop, true>(),
    arithmetic_row<Plain<uint8_t>::Loop, true>(),
    arithmetic_row<Plain<int32_t>::Loop, true>(),
    arithmetic_row<Plain<int64_t>::Loop, true>(),
    {&combine_loop_bool<LogicalOrFn>, &combine_loop_bool<LogicalAndFn>,
     &combine_loop_bool<LogicalAndFn>, &combine_loop_bool<LogicalOrFn>, nullptr, nullptr,
     &combine_loop_bool<LogicalAndFn>, &combine_loop_bool<LogicalOrFn>,
     &combine_loop_bool<LogicalXorFn>},
    arithmetic_row<Plain<uint32_t>::Loop, true>(),
    arithmetic_row<Plain<uint64_t>::Loop, true>(),
    arithmetic_row<ViaFloat<Fp8E4M3>::Loop, false>(),
    arithmetic_row<ViaFloat<Fp8E5M2>::Loop, false>(),
}};

template <typename T, typename S>
WEFT_KERNEL void scale_loop(void* dst, const void* src, size_t count, S factor) {
  T* d = static_cast<T*>(dst);
  const T* s = static_cast<const T*>(src);
  for (size_t i = 0; i < count; ++i) d[i] = s[i] * factor;
}

template <typename Conv>
WEFT_KERNEL void scale_loop_half(void* dst, const void* src, size_t count, float factor) {
  using S = Storage<Conv>;
  S* d = static_cast<S*>(dst);
  const S* s = static_cast<const S*>(src);
  for (size_t i = 0; i < count; ++i) d[i] = Conv::store(Conv::load(s[i]) * factor);
}

// Division, not multiplication by 1/n: x / n is rounded once, x * (1/n) twice, and avg of equal
// inputs must give the input back exactly. Integers divide in D, wide enough for any contributor
// count (an int8 average over 200 ranks divides by 200), truncating toward zero.
template <typename T, typename D = T>
WEFT_KERNEL void divide_loop(void* data, size_t count, D divisor) {
  T* d = static_cast<T*>(data);
  for (size_t i = 0; i < count; ++i) d[i] = static_cast<T>(static_cast<D>(d[i]) / divisor);
}

template <typename Conv>
WEFT_KERNEL void divide_loop_half(void* data, size_t count, float divisor) {
  Storage<Conv>* d = static_cast<Storage<Conv>*>(data);
  for (size_t i = 0; i < count; ++i) d[i] = Conv::store(Conv::load(d[i]) / divisor);
}

}  // namespace

void check_supported(DType dtype, ReduceOp op) {
  if (!is_valid(dtype)) {
    throw_error(ErrorCode::InvalidArgument, "reduce",
                fmt::format("unknown dtype {}", static_cast<int>(dtype)));
  }
  if (static_cast<int>(op.kind) >= ReduceOp::kNumKinds) {
    throw_error(ErrorCode::InvalidArgument, "reduce",
                fmt::format("unknown reduce op {}", static_cast<int>(op.kind)));
  }
  const bool bitwise =
      op.kind == ReduceOp::BAnd || op.kind == ReduceOp::BOr || op.kind == ReduceOp::BXor;
  if (bitwise && is_floating(dtype)) {
    throw_error(ErrorCode::InvalidArgument, "reduce",
                fmt::format("{} is not defined for {} (bitwise ops need an integer or bool dtype)",
                            reduce_op_name(op), dtype_name(dtype)));
  }
  if (op.kind == ReduceOp::PremulSum && !is_floating(dtype)) {
    throw_error(ErrorCode::InvalidArgument, "reduce",
                fmt::format("premul_sum is not defined for {} (it needs a floating dtype)",
                            dtype_name(dtype)));
  }
  if (op.kind == ReduceOp::Avg && dtype == DType::Bool) {
    throw_error(ErrorCode::InvalidArgument, "reduce",
                "avg is not defined for bool (use max for any, min for all)");
  }
}

void combine(void* dst, const void* a, const void* b, size_t count, DType dtype, ReduceOp op) {
  check_supported(dtype, op);
  if (count == 0) return;
  kCombine[static_cast<size_t>(dtype)][op.kind](dst, a, b, count);
}

void accumulate(void* dst, const void* src, size_t count, DType dtype, ReduceOp op) {
  combine(dst, dst, src, count, dtype, op);
}

void premultiply(void* dst, const void* src, size_t count, DType dtype, double factor) {
  check_supported(dtype, ReduceOp::premul_sum(factor));
  if (count == 0) return;
  switch (dtype) {
    case DType::Float32:
      return scale_loop<float>(dst, src, count, static_cast<float>(factor));
    case DType::Float64:
      return scale_loop<double>(dst, src, count, factor);
    case DType::Float16:
      return scale_loop_half<Fp16>(dst, src, count, static_cast<float>(factor));
    case DType::BFloat16:
      return scale_loop_half<Bf16>(dst, src, count, static_cast<float>(factor));
    case DType::Float8E4M3:
      return scale_loop_half<Fp8E4M3>(dst, src, count, static_cast<float>(factor));
    case DType::Float8E5M2:
      return scale_loop_half<Fp8E5M2>(dst, src, count, static_cast<float>(factor));
    default:
      WEFT_CHECK(false, "check_supported let a non-floating dtype through");
  }
}

void premultiply(void* data, size_t count, DType dtype, double factor) {
  premultiply(data, data, count, dtype, factor);
}

void finalize(void* data, size_t count, DType dtype, ReduceOp op, int contributors) {
  check_supported(dtype, op);
  WEFT_CHECK(contributors >= 1, "finalize needs at least one contributor");
  if (!needs_finalize(op) || count == 0) return;
  switch (dtype) {
    case DType::Float32:
      return divide_loop<float>(data, count, static_cast<float>(contributors));
    case DType::Float64:
      return divide_loop<double>(data, count, static_cast<double>(contributors));
    case DType::Float16:
      return divide_loop_half<Fp16>(data, count, static_cast<float>(contributors));
    case DType::BFloat16:
      return divide_loop_half<Bf16>(data, count, static_cast<float>(contributors));
    case DType::Float8E4M3:
      return divide_loop_half<Fp8E4M3>(data, count, static_cast<float>(contributors));
    case DType::Float8E5M2:
      return divide_loop_half<Fp8E5M2>(data, count, static_cast<float>(contributors));
    case DType::Int8:
      return divide_loop<int8_t, int>(data, count, contributors);
    case DType::UInt8:
      return divide_loop<uint8_t, int>(data, count, contributors);
    case DType::Int32:
      return divide_loop<int32_t, int>(data, count, contributors);
    case DType::Int64:
      return divide_loop<int64_t, int64_t>(data, count, contributors);
    case DType::UInt32:
      return divide_loop<uint32_t, uint64_t>(data, count, static_cast<uint64_t>(contributors));
    case DType::UInt64:
      return divide_loop<uint64_t, uint64_t>(data, count, static_cast<uint64_t>(contributors));
    case DType::Bool:
      WEFT_CHECK(false, "check_supported let avg on bool through");
  }
}

namespace detail {
bool set_fp16_hardware(bool enabled) { return g_fp16_hardware.exchange(enabled); }
}  // namespace detail

}  // namespace weft::reduce
