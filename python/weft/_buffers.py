"""Turning Python objects into (pointer, element count, dtype) for the C API.

Two kinds of objects are accepted:
  - anything with the buffer protocol (numpy arrays, bytearray, bytes for inputs, memoryview,
    array.array): exported with PyObject_GetBuffer, C-contiguous, writable when weft writes it.
    The export is held until the collective completes, so the memory can neither move (a
    bytearray cannot be resized while exported) nor be freed under weft.
  - CPU torch tensors: data_ptr(), checked contiguous, on the CPU, of a dtype weft has. The
    tensor is referenced until the collective completes.
"""

import ctypes
import enum
import sys


class DType(enum.IntEnum):
    """weft_dtype_t."""

    FLOAT32 = 0
    FLOAT64 = 1
    FLOAT16 = 2
    BFLOAT16 = 3
    INT8 = 4
    UINT8 = 5
    INT32 = 6
    INT64 = 7
    BOOL = 8
    # Appended (values are never renumbered).
    UINT32 = 9
    UINT64 = 10
    FLOAT8_E4M3FN = 11  # torch.float8_e4m3fn, ncclFloat8e4m3: no infinities, max 448
    FLOAT8_E5M2 = 12  # torch.float8_e5m2, ncclFloat8e5m2


DTYPE_SIZE = {
    DType.FLOAT32: 4,
    DType.FLOAT64: 8,
    DType.FLOAT16: 2,
    DType.BFLOAT16: 2,
    DType.INT8: 1,
    DType.UINT8: 1,
    DType.INT32: 4,
    DType.INT64: 8,
    DType.BOOL: 1,
    DType.UINT32: 4,
    DType.UINT64: 8,
    DType.FLOAT8_E4M3FN: 1,
    DType.FLOAT8_E5M2: 1,
}

# struct-module format characters (native or little-endian standard sizes) -> weft dtype.
_FLOATS = {"f": DType.FLOAT32, "d": DType.FLOAT64, "e": DType.FLOAT16}
_SIGNED = {1: DType.INT8, 4: DType.INT32, 8: DType.INT64}

_TORCH_DTYPES = {
    "torch.float32": DType.FLOAT32,
    "torch.float64": DType.FLOAT64,
    "torch.float16": DType.FLOAT16,
    "torch.bfloat16": DType.BFLOAT16,
    "torch.int8": DType.INT8,
    "torch.uint8": DType.UINT8,
    "torch.int32": DType.INT32,
    "torch.int64": DType.INT64,
    "torch.bool": DType.BOOL,
    "torch.uint32": DType.UINT32,
    "torch.uint64": DType.UINT64,
    "torch.float8_e4m3fn": DType.FLOAT8_E4M3FN,
    "torch.float8_e5m2": DType.FLOAT8_E5M2,
}


class _PyBuffer(ctypes.Structure):
    """Py_buffer (part of the stable ABI since Python 3.11)."""

    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.POINTER(ctypes.c_ssize_t)),
        ("strides", ctypes.POINTER(ctypes.c_ssize_t)),
        ("suboffsets", ctypes.POINTER(ctypes.c_ssize_t)),
        ("internal", ctypes.c_void_p),
    ]


_PyObject_GetBuffer = ctypes.pythonapi.PyObject_GetBuffer
_PyObject_GetBuffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_PyObject_GetBuffer.restype = ctypes.c_int
_PyBuffer_Release = ctypes.pythonapi.PyBuffer_Release
_PyBuffer_Release.argtypes = [ctypes.POINTER(_PyBuffer)]
_PyBuffer_Release.restype = None

_PyBUF_WRITABLE = 0x0001
_PyBUF_FORMAT = 0x0004
_PyBUF_C_CONTIGUOUS = 0x0038  # PyBUF_STRIDES | 0x20


class BufferArgumentError(ValueError):
    """Raised for an object that cannot be a collective's buffer (the caller turns it into
    weft.InvalidArgument naming the rank, the operation and the argument)."""


def _dtype_of_format(fmt, itemsize):
    f = fmt
    if f and f[0] in "@=<":
        if f[0] == "<" and sys.byteorder != "little":
            return None
        f = f[1:]
    if len(f) != 1:
        return None
    if f in _FLOATS and DTYPE_SIZE[_FLOATS[f]] == itemsize:
        return _FLOATS[f]
    if f in "bhilq":
        return _SIGNED.get(itemsize)
    if f in "Bc":
        return DType.UINT8
    if f == "?":
        return DType.BOOL
    return None


class Borrowed:
    """One object lent to weft: its address, its element count and its dtype; release() ends the
    loan (the buffer export, or the reference to the tensor)."""

    __slots__ = ("ptr", "count", "dtype", "nbytes", "_view", "_obj")

    def __init__(self, ptr, count, dtype, nbytes, view=None, obj=None):
        self.ptr = ptr
        self.count = count
        self.dtype = dtype
        self.nbytes = nbytes
        self._view = view
        self._obj = obj

    def release(self):
        if self._view is not None:
            _PyBuffer_Release(ctypes.byref(self._view))
            self._view = None
        self._obj = None

    def __del__(self):
        self.release()


def _is_torch_tensor(obj):
    t = type(obj)
    return t.__module__.startswith("torch") and hasattr(obj, "data_ptr") and hasattr(obj, "numel")


def borrow(obj, name, writable, dtype=None):
    """Borrows `obj` as a collective's buffer `name`. `dtype` (a weft.DType) overrides the one
    read from the object (for bfloat16 data held in a uint16 numpy array, say); the element count
    is then the byte size over the dtype's size. Raises BufferArgumentError saying what is
    wrong."""
    if obj is None:
        raise BufferArgumentError(f"{name} is None")
    if _is_torch_tensor(obj):
        return _borrow_tensor(obj, name, dtype)
    fast = _borrow_writable(obj, name, writable, dtype)
    if fast is not None:
        return fast
    view = _PyBuffer()
    flags = _PyBUF_FORMAT | _PyBUF_C_CONTIGUOUS | (_PyBUF_WRITABLE if writable else 0)
    try:
        _PyObject_GetBuffer(obj, ctypes.byref(view), flags)
    except (BufferError, TypeError, ValueError) as e:
        if not hasattr(obj, "__buffer__") and not isinstance(obj, (bytes, bytearray, memoryview)):
            try:
                memoryview(obj)
            except TypeError:
                raise BufferArgumentError(
                    f"{name}: a {type(obj).__name__} has neither the buffer protocol nor is a "
                    f"torch tensor"
                ) from None
        what = "writable and C-contiguous" if writable else "C-contiguous"
        raise BufferArgumentError(f"{name} must be {what}: {e}") from None
    fmt = view.format.decode() if view.format else "B"
    nbytes = view.len
    if dtype is None:
        found = _dtype_of_format(fmt, view.itemsize)
        if found is None:
            _PyBuffer_Release(ctypes.byref(view))
            raise BufferArgumentError(
                f"{name} has elements of format {fmt!r} ({view.itemsize} bytes), which weft has no "
                f"dtype for (float16/32/64, int8/32/64, uint8, bool; pass dtype= to reinterpret)"
            )
        dtype = found
    else:
        dtype = DType(dtype)
    size = DTYPE_SIZE[dtype]
    if nbytes % size:
        _PyBuffer_Release(ctypes.byref(view))
        raise BufferArgumentError(
            f"{name} holds {nbytes} bytes, not a whole number of {dtype.name.lower()} elements"
        )
    return Borrowed(view.buf or 0, nbytes // size, dtype, nbytes, view=view)


_format_cache = {}


def _borrow_writable(obj, name, writable, dtype):
    """The fast path, for writable C-contiguous buffers (most numpy arrays, bytearray): a
    memoryview and ctypes.c_char.from_buffer, which holds an export of the buffer for as long as
    the Borrowed lives. None when it does not apply (read-only, or not a buffer: the general path
    says why)."""
    try:
        mv = memoryview(obj)
    except TypeError:
        return None
    if mv.readonly or not mv.c_contiguous or mv.nbytes == 0:
        return None
    if dtype is None:
        key = (mv.format, mv.itemsize)
        dtype = _format_cache.get(key)
        if dtype is None:
            dtype = _dtype_of_format(*key)
            if dtype is None:
                return None  # the general path names the format
            _format_cache[key] = dtype
    else:
        dtype = DType(dtype)
    size = DTYPE_SIZE[dtype]
    nbytes = mv.nbytes
    if nbytes % size:
        return None
    anchor = ctypes.c_char.from_buffer(mv)
    return Borrowed(ctypes.addressof(anchor), nbytes // size, dtype, nbytes, obj=anchor)


def _borrow_tensor(t, name, dtype):
    if t.device.type != "cpu":
        raise BufferArgumentError(f"{name} is a torch tensor on {t.device}; weft takes CPU tensors")
    if not t.is_contiguous():
        raise BufferArgumentError(f"{name} is a non-contiguous torch tensor (call .contiguous())")
    found = _TORCH_DTYPES.get(str(t.dtype))
    if found is None:
        raise BufferArgumentError(f"{name} is a torch tensor of {t.dtype}, which weft has no dtype for")
    nbytes = t.numel() * t.element_size()
    if dtype is not None:
        found = DType(dtype)
        if nbytes % DTYPE_SIZE[found]:
            raise BufferArgumentError(
                f"{name} holds {nbytes} bytes, not a whole number of {found.name.lower()} elements"
            )
    return Borrowed(t.data_ptr(), nbytes // DTYPE_SIZE[found], found, nbytes, obj=t)
