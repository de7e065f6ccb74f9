/* weft/c_types.h: the C enums shared by weft's C API (weft.h) and its backend plugin ABI
 * (plugin.h).
 *
 * Plain C (C99 and later; also valid C++). Every value equals the C++ enum it mirrors
 * (weft::ErrorCode, weft::DType, weft::ReduceOp::Kind, weft::DeviceKind, weft::CollectiveKind),
 * and values are never reused or renumbered: a new one gets the next free number. Fields that
 * carry these values are int32_t in every struct, so that adding a value never changes a layout.
 */
#ifndef WEFT_C_TYPES_H_
#define WEFT_C_TYPES_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Results. 0 is success; the others are weft::ErrorCode's values (error.h says what each means
 * and what a caller should do about it). */
typedef enum {
  WEFT_SUCCESS = 0,
  WEFT_ERR_TIMEOUT = 1,          /* did not finish within its timeout; a retry may work */
  WEFT_ERR_PEER_LOST = 2,        /* a peer died or closed its connection: rebuild the group */
  WEFT_ERR_INVALID_ARGUMENT = 3, /* the caller passed something wrong: fix the call */
  WEFT_ERR_UNSUPPORTED = 4,      /* not implemented by this backend or build */
  WEFT_ERR_ABORTED = 5,          /* the group (or backend) was aborted */
  WEFT_ERR_DESYNC = 6,           /* ranks issued different collectives */
  WEFT_ERR_PROTOCOL = 7,         /* a peer broke the wire protocol */
  WEFT_ERR_IO = 8,               /* an operating-system call failed */
  WEFT_ERR_INTERNAL = 9          /* a bug (in weft or a plugin): report it */
} weft_result_t;

typedef enum {
  WEFT_FLOAT32 = 0,
  WEFT_FLOAT64 = 1,
  WEFT_FLOAT16 = 2,
  WEFT_BFLOAT16 = 3,
  WEFT_INT8 = 4,
  WEFT_UINT8 = 5,
  WEFT_INT32 = 6,
  WEFT_INT64 = 7,
  WEFT_BOOL = 8,
  /* Appended: values are never renumbered. */
  WEFT_UINT32 = 9,
  WEFT_UINT64 = 10,
  WEFT_FLOAT8_E4M3 = 11, /* fp8 e4m3fn: torch.float8_e4m3fn, ncclFloat8e4m3 (no infinities) */
  WEFT_FLOAT8_E5M2 = 12  /* fp8 e5m2: torch.float8_e5m2, ncclFloat8e5m2 */
} weft_dtype_t;

typedef enum {
  WEFT_SUM = 0,
  WEFT_PROD = 1,
  WEFT_MIN = 2,
  WEFT_MAX = 3,
  WEFT_AVG = 4,
  WEFT_PREMUL_SUM = 5, /* each input scaled by a factor (passed beside the op), then summed */
  WEFT_BAND = 6,
  WEFT_BOR = 7,
  WEFT_BXOR = 8
} weft_red_op_t;

typedef enum { WEFT_DEVICE_CPU = 0, WEFT_DEVICE_CUDA = 1 } weft_device_kind_t;

#ifdef __cplusplus
}
#endif

#endif /* WEFT_C_TYPES_H_ */
