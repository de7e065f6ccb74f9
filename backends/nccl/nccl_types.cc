#include "backends/nccl/nccl_types.h"

#include <cstring>

#include <fmt/format.h>

#include "weft/half.h"

namespace weft::nccl {
namespace {

const char* result_name(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "ncclSuccess";
    case ncclUnhandledCudaError:
      return "ncclUnhandledCudaError";
    case ncclSystemError:
      return "ncclSystemError";
    case ncclInternalError:
      return "ncclInternalError";
    case ncclInvalidArgument:
      return "ncclInvalidArgument";
    case ncclInvalidUsage:
      return "ncclInvalidUsage";
    case ncclRemoteError:
      return "ncclRemoteError";
    case ncclInProgress:
      return "ncclInProgress";
    default:
      return "ncclResult";
  }
}

template <typename T>
void store_scalar(NcclReduction& reduction, T value) {
  static_assert(sizeof(T) <= sizeof(reduction.scalar));
  std::memcpy(reduction.scalar, &value, sizeof(T));
}

}  // namespace

std::optional<ncclDataType_t> to_nccl_dtype(DType dtype) {
  // default: a DType added after this file (fp8, ...) is unsupported until it is mapped here.
  switch (dtype) {
    case DType::Float32:
      return ncclFloat32;
    case DType::Float64:
      return ncclFloat64;
    case DType::Float16:
      return ncclFloat16;
    case DType::BFloat16:
      return ncclBfloat16;
    case DType::Int8:
      return ncclInt8;
    case DType::UInt8:
    case DType::Bool:
      return ncclUint8;
    case DType::Int32:
      return ncclInt32;
    case DType::Int64:
      return ncclInt64;
    case DType::UInt32:
      return ncclUint32;
    case DType::UInt64:
      return ncclUint64;
    case DType::Float8E4M3:
      return ncclFloat8e4m3;
    case DType::Float8E5M2:
      return ncclFloat8e5m2;
    default:
      return std::nullopt;
  }
}

const char* nccl_dtype_name(ncclDataType_t dtype) {
  switch (dtype) {
    case ncclInt8:
      return "ncclInt8";
    case ncclUint8:
      return "ncclUint8";
    case ncclInt32:
      return "ncclInt32";
    case ncclUint32:
      return "ncclUint32";
    case ncclInt64:
      return "ncclInt64";
    case ncclUint64:
      return "ncclUint64";
    case ncclFloat16:
      return "ncclFloat16";
    case ncclFloat32:
      return "ncclFloat32";
    case ncclFloat64:
      return "ncclFloat64";
    case ncclBfloat16:
      return "ncclBfloat16";
    case ncclFloat8e4m3:
      return "ncclFloat8e4m3";
    case ncclFloat8e5m2:
      return "ncclFloat8e5m2";
    default:
      return "ncclDataType";
  }
}

ncclDataType_t require_nccl_dtype(DType dtype, const ErrorContext& context) {
  std::optional<ncclDataType_t> mapped = to_nccl_dtype(dtype);
  if (!mapped) {
    throw Error(ErrorCode::Unsupported, context,
                fmt::format("backend \"nccl\" does not support dtype {} (NCCL {}.{} has no type "
                            "for it)",
                            dtype_name(dtype), NCCL_MAJOR, NCCL_MINOR));
  }
  return *mapped;
}

NcclReduction to_nccl_reduction(ReduceOp op, DType dtype, const ErrorContext& context) {
  const ncclDataType_t nccl_dtype = require_nccl_dtype(dtype, context);
  auto refuse = [&](ErrorCode code, std::string_view why) -> NcclReduction {
    throw Error(code, context,
                fmt::format("{} on {}: {}", reduce_op_name(op), dtype_name(dtype), why));
  };
  NcclReduction reduction;
  if (dtype == DType::Bool) {
    // Logical or / and as max / min over bytes, as c10d runs bool on NCCL.
    switch (op.kind) {
      case ReduceOp::Sum:
      case ReduceOp::Max:
      case ReduceOp::BOr:
        reduction.op = ncclMax;
        return reduction;
      case ReduceOp::Prod:
      case ReduceOp::Min:
      case ReduceOp::BAnd:
        reduction.op = ncclMin;
        return reduction;
      case ReduceOp::BXor:
        return refuse(ErrorCode::Unsupported,
                      "backend \"nccl\" has no exclusive or (NCCL has no bitwise reduction)");
      case ReduceOp::Avg:
      case ReduceOp::PremulSum:
        return refuse(ErrorCode::InvalidArgument, "no boolean meaning");
      default:
        return refuse(ErrorCode::InvalidArgument, "not a reduce op");
    }
  }
  switch (op.kind) {
    case ReduceOp::Sum:
      reduction.op = ncclSum;
      return reduction;
    case ReduceOp::Prod:
      reduction.op = ncclProd;
      return reduction;
    case ReduceOp::Min:
      reduction.op = ncclMin;
      return reduction;
    case ReduceOp::Max:
      reduction.op = ncclMax;
      return reduction;
    case ReduceOp::Avg:
      reduction.op = ncclAvg;
      return reduction;
    case ReduceOp::BAnd:
    case ReduceOp::BOr:
    case ReduceOp::BXor:
      return refuse(ErrorCode::Unsupported,
                    "backend \"nccl\" does not support bitwise reductions (NCCL has none); use "
                    "the tcp backend for them");
    case ReduceOp::PremulSum:
      break;
    default:
      return refuse(ErrorCode::InvalidArgument, "not a reduce op");
  }
  // PremulSum: the factor converted to the dtype, as ncclRedOpCreatePreMulSum reads it.
  reduction.premul = true;
  reduction.op = ncclSum;  // replaced by the per-call op
  switch (nccl_dtype) {
    case ncclFloat32:
      store_scalar(reduction, static_cast<float>(op.factor));
      return reduction;
    case ncclFloat64:
      store_scalar(reduction, op.factor);
      return reduction;
    case ncclFloat16:
      store_scalar(reduction, float_to_half(static_cast<float>(op.factor)));
      return reduction;
    case ncclBfloat16:
      store_scalar(reduction, float_to_bf16(static_cast<float>(op.factor)));
      return reduction;
    case ncclFloat8e4m3:
      store_scalar(reduction, float_to_e4m3fn(static_cast<float>(op.factor)));
      return reduction;
    case ncclFloat8e5m2:
      store_scalar(reduction, float_to_e5m2(static_cast<float>(op.factor)));
      return reduction;
    default:
      return refuse(ErrorCode::InvalidArgument,
                    "its factor is real-valued and is offered for floating dtypes only");
  }
}

ErrorCode error_code_for(ncclResult_t result) {
  switch (result) {
    case ncclRemoteError:
      return ErrorCode::PeerLost;
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return ErrorCode::InvalidArgument;
    default:
      return ErrorCode::Internal;
  }
}

std::string describe_nccl_result(ncclResult_t result, ncclComm_t comm) {
  std::string text = fmt::format("{} ({})", result_name(result), ncclGetErrorString(result));
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0') text += fmt::format(": {}", last);
  return text;
}

}  // namespace weft::nccl
