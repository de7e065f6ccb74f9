"""weft from Python: process groups and collectives over libweft's C API (ctypes).

    import numpy as np, weft
    world = weft.init()                      # under weftrun / torchrun / srun / mpirun
    x = np.arange(4, dtype=np.float32)
    world.all_reduce(x)                      # in place, sum
    work = world.all_reduce(x, weft.AVG, async_op=True)
    work.wait()

docs/python.md has the whole API; `import weft.torch` registers the torch.distributed backend
"weft".
"""

from ._buffers import DType
from ._capi import library_path
from .errors import (
    Aborted,
    Desync,
    Error,
    InternalError,
    InvalidArgument,
    IoError,
    PeerLost,
    ProtocolError,
    Timeout,
    Unsupported,
)
from .group import Group, ReduceOp, Work, init
from . import _capi

__version__ = _capi.lib.weft_version().decode()


def dump_trace(reason=None):
    """Writes every group's flight recorder to WEFT_TRACE_DIR (docs/flight-recorder.md), one file
    per world rank; returns how many files were written (0 when WEFT_TRACE_BUFFER=0)."""
    import ctypes

    from .errors import check

    written = ctypes.c_size_t(0)
    check(_capi.lib.weft_dump_trace(None if reason is None else reason.encode(),
                                    ctypes.byref(written)))
    return written.value

SUM = ReduceOp.SUM
PROD = ReduceOp.PROD
MIN = ReduceOp.MIN
MAX = ReduceOp.MAX
AVG = ReduceOp.AVG
PREMUL_SUM = ReduceOp.PREMUL_SUM
BAND = ReduceOp.BAND
BOR = ReduceOp.BOR
BXOR = ReduceOp.BXOR

float32 = DType.FLOAT32
float64 = DType.FLOAT64
float16 = DType.FLOAT16
bfloat16 = DType.BFLOAT16
int8 = DType.INT8
uint8 = DType.UINT8
int32 = DType.INT32
int64 = DType.INT64
bool_ = DType.BOOL
uint32 = DType.UINT32
uint64 = DType.UINT64
float8_e4m3fn = DType.FLOAT8_E4M3FN
float8_e5m2 = DType.FLOAT8_E5M2

__all__ = [
    "init", "Group", "Work", "ReduceOp", "DType", "library_path", "dump_trace",
    "Error", "Timeout", "PeerLost", "InvalidArgument", "Unsupported", "Aborted", "Desync",
    "ProtocolError", "IoError", "InternalError",
    "SUM", "PROD", "MIN", "MAX", "AVG", "PREMUL_SUM", "BAND", "BOR", "BXOR",
    "float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64", "bool_",
    "uint32", "uint64", "float8_e4m3fn", "float8_e5m2",
]
