// backends/nccl/nccl_types.h: weft's dtypes and reduce ops as NCCL's, and NCCL's and CUDA's
// result codes as weft::Error.
//
// The mapping is pure (no device, no communicator), so it is tested on machines without a GPU
// (tests/nccl/nccl_types_test.cc). What NCCL cannot do is refused here, before any NCCL call:
//
//   dtype     | NCCL           | ops
//   ----------+----------------+--------------------------------------------------------------
//   float32.. | ncclFloat32..  | sum, prod, min, max, avg (ncclAvg), premul_sum (floating only)
//   int*/uint*| ncclInt8..     | sum, prod, min, max, avg (truncating, as the CPU path)
//   bool      | ncclUint8      | sum/max/bor as ncclMax, prod/min/band as ncclMin (c10d's trick)
//   any       |                | band/bor/bxor on integers: Unsupported (NCCL has no bitwise op)
//
// Bool's max/min keep the truth of each element but, unlike the CPU path, do not turn a true
// value other than 1 into 1 (max of 2 and 0 is 2): pass 0/1 bools for identical bytes.
//
// Thread safety: plain functions of their arguments.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nccl.h>

#include "weft/dtype.h"
#include "weft/error.h"
#include "weft/reduce_op.h"

namespace weft::nccl {

// The NCCL dtype that carries `dtype` (Bool as ncclUint8), or nullopt for a dtype NCCL has no
// type for (or one this build does not know yet: a newer DType reads as unsupported).
std::optional<ncclDataType_t> to_nccl_dtype(DType dtype);

// "ncclFloat32", for messages and tests.
const char* nccl_dtype_name(ncclDataType_t dtype);

// How a reduction runs on NCCL: a built-in op, or a premul_sum whose scalar (the factor
// converted to the dtype, in its bytes) makes a per-call op with ncclRedOpCreatePreMulSum.
struct NcclReduction {
  ncclRedOp_t op = ncclSum;
  bool premul = false;
  // The factor as one element of the dtype (float32: 4 bytes, float16: its bits, ...).
  alignas(8) unsigned char scalar[8] = {};
};

// The reduction for `op` on `dtype`. Throws Error(Unsupported) for what NCCL lacks (bitwise ops
// on integers, a dtype NCCL has no type for) and Error(InvalidArgument) for what has no meaning
// (avg or premul_sum on bool, premul_sum on integers, bxor on bool), with the CPU path's wording.
// Every message starts with `context`.
NcclReduction to_nccl_reduction(ReduceOp op, DType dtype, const ErrorContext& context);

// The dtype of `dtype` for a collective that does not reduce: Error(Unsupported) when NCCL has
// none.
ncclDataType_t require_nccl_dtype(DType dtype, const ErrorContext& context);

// The weft code for an NCCL result: ncclRemoteError (a peer died or the network failed) is
// PeerLost; ncclInvalidArgument / ncclInvalidUsage are InvalidArgument; everything else
// (system, internal, CUDA errors) is Internal.
ErrorCode error_code_for(ncclResult_t result);

// "ncclRemoteError (remote process exited or there was a network error): <last error>", NCCL's
// name, string and, when it has one, ncclGetLastError's text (NCCL keeps one last error per
// process: its argument is unused, so `comm` may be null).
std::string describe_nccl_result(ncclResult_t result, ncclComm_t comm);

}  // namespace weft::nccl
