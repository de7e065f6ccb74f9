// runtime/reduce.h: the element-wise reduction kernels every backend uses when it reduces on the
// CPU, for every DType x ReduceOp. One definition of what each op means, so that all algorithms
// and backends agree bit for bit.
//
// A collective with op `op` runs, per element:
//   1. PremulSum only: premultiply() each rank's input by op.factor;
//   2. accumulate()/combine() the contributions pairwise, in any order the algorithm likes;
//   3. finalize() the reduced result once (Avg: divide by the number of contributing ranks).
// Avg and PremulSum accumulate exactly as Sum does.
//
// Semantics, per dtype:
//   Floating (float32, float64, float16, bfloat16, float8_e4m3fn, float8_e5m2): IEEE arithmetic,
//     round to nearest even. float16, bfloat16 and both fp8 formats are converted to float,
//     combined, and rounded back once; for sum and prod this equals rounding the exact result
//     once, because float carries at least 2p + 2 significand bits for all of them (the bound
//     under which double rounding is harmless), so results do not depend on the detour, nor on
//     whether F16C or software converts. Overflow gives infinity, except in float8_e4m3fn, which
//     has none: there it gives NaN, as PyTorch's conversion does (weft/half.h); denormals are kept
//     (unless the process itself runs with flush-to-zero). min/max propagate NaN, like
//     torch.minimum/maximum (not fmin/fmax): if either input is NaN the result is NaN. They order
//     -0.0 below +0.0, so min(-0, +0) is -0 and max is +0 whatever the argument order (IEEE
//     754-2019 minimum/maximum); results never depend on which rank's value came first. Bitwise ops
//     are refused (InvalidArgument).
//   Integer (int8, uint8, int32, int64, uint32, uint64): sum and prod wrap modulo 2^bits, two's
//     complement (done in the unsigned type: no undefined behaviour). min/max/band/bor/bxor as
//     usual, min and max comparing unsigned for the unsigned dtypes. Avg divides the wrapped sum
//     by the contributor count, truncating toward zero (as NCCL and C++ integer division do): avg
//     of {-3, 0} over 2 ranks is -1; of uint64 {2^64 - 2, 0} over 2 ranks, 2^63 - 1. PremulSum is
//     refused: its factor is real-valued and c10d offers it for floating types only.
//   Bool (one byte; zero is false, any other value true; results are always 0 or 1):
//     sum, max and bor are logical or; prod, min and band are logical and; bxor is exclusive or.
//     Avg and PremulSum are refused: they have no boolean meaning.
//
// Buffers are plain host memory of `count` elements of `dtype`. count == 0 does nothing and then
// the pointers may be null. Every function checks check_supported() first, so an unsupported
// pair, or a DType or op kind outside its enum (a corrupted value from the wire), throws
// Error(InvalidArgument) and touches no memory.
//
// Thread safety: the functions keep no state (but for the test switch in detail); calls on
// disjoint buffers may run concurrently.
#pragma once

#include <cstddef>

#include "weft/dtype.h"
#include "weft/reduce_op.h"

namespace weft::reduce {

// Throws Error(InvalidArgument) naming the op and the dtype when `op` is not defined on `dtype`
// (e.g. "reduce: band is not defined for float32 (bitwise ops need an integer or bool dtype)").
void check_supported(DType dtype, ReduceOp op);

// dst[i] = dst[i] op src[i] for i < count.
// REQUIRES: dst and src are equal or do not overlap.
void accumulate(void* dst, const void* src, size_t count, DType dtype, ReduceOp op);

// dst[i] = a[i] op b[i] for i < count.
// REQUIRES: dst is equal to a or b, or overlaps neither; a and b may be anything.
void combine(void* dst, const void* a, const void* b, size_t count, DType dtype, ReduceOp op);

// data[i] *= factor, for PremulSum's inputs. The factor is first rounded to the dtype's
// arithmetic type (float for float32/float16/bfloat16, double for float64), as NCCL does.
// Throws Error(InvalidArgument) for a non-floating dtype.
void premultiply(void* data, size_t count, DType dtype, double factor);
// dst[i] = src[i] * factor: the same, leaving src (the caller's input) untouched.
// REQUIRES: dst and src are equal or do not overlap.
void premultiply(void* dst, const void* src, size_t count, DType dtype, double factor);

// Applies the op's last step to a fully reduced buffer: Avg divides by `contributors` (floating
// types: IEEE division, rounded once; integers: truncating toward zero); every other op does
// nothing. REQUIRES: contributors >= 1 (a bug in the caller otherwise: WEFT_CHECK).
void finalize(void* data, size_t count, DType dtype, ReduceOp op, int contributors);

// Whether step 1 or step 3 above has any work to do, so that algorithms can skip a pass.
constexpr bool needs_premultiply(ReduceOp op) { return op.kind == ReduceOp::PremulSum; }
constexpr bool needs_finalize(ReduceOp op) { return op.kind == ReduceOp::Avg; }

namespace detail {
// For tests: false makes float16 combine use the portable software conversions even on a CPU
// with F16C, so that both paths are checked on one machine. Returns the previous setting.
bool set_fp16_hardware(bool enabled);
}  // namespace detail

}  // namespace weft::reduce
