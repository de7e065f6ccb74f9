"""libweft's C API (include/weft/weft.h) through ctypes: loading the library and the prototypes.

Every foreign call goes through ctypes.CDLL, which releases the GIL for the call's duration, so a
collective that waits lets the other Python threads run.
"""

import ctypes
import ctypes.util
import os

c_group_p = ctypes.c_void_p
c_work_p = ctypes.c_void_p


class InitOptions(ctypes.Structure):
    """weft_init_options_t."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("rank", ctypes.c_int32),
        ("world_size", ctypes.c_int32),
        ("url", ctypes.c_char_p),
        ("backend", ctypes.c_char_p),
        ("timeout_ms", ctypes.c_int64),
    ]


def _candidates():
    """Where libweft may be, in order: $WEFT_LIBRARY, the path meson wrote beside this file
    (_libpath.py: the build tree's libweft in build/python, the installed one after meson
    install), then the dynamic loader's search path."""
    explicit = os.environ.get("WEFT_LIBRARY")
    if explicit:
        return [explicit], True
    found = []
    try:
        from . import _libpath  # written by meson; absent in the source tree

        found.append(_libpath.LIBRARY)
    except ImportError:
        pass
    found.append("libweft.so.0")
    name = ctypes.util.find_library("weft")
    if name:
        found.append(name)
    return found, False


def _load():
    paths, explicit = _candidates()
    errors = []
    for path in paths:
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            errors.append(f"{path}: {e}")
            if explicit:
                break
    raise ImportError(
        "weft: cannot load libweft (" + "; ".join(errors) + "). Set WEFT_LIBRARY to the path of "
        "libweft.so, or use the package meson built or installed (docs/python.md)"
    )


lib, library_path = _load()

_result = ctypes.c_int
_size = ctypes.c_size_t
_int = ctypes.c_int32
_work_out = ctypes.POINTER(c_work_p)
_ptr = ctypes.c_void_p
_sizes = ctypes.POINTER(ctypes.c_size_t)

_PROTOTYPES = {
    "weft_init_from_env": [ctypes.POINTER(c_group_p)],
    "weft_init": [ctypes.POINTER(InitOptions), ctypes.POINTER(c_group_p)],
    "weft_group_rank": [c_group_p, ctypes.POINTER(ctypes.c_int32)],
    "weft_group_size": [c_group_p, ctypes.POINTER(ctypes.c_int32)],
    "weft_new_group": [c_group_p, ctypes.POINTER(ctypes.c_int32), _size, ctypes.POINTER(c_group_p)],
    "weft_split": [c_group_p, _int, _int, ctypes.POINTER(c_group_p)],
    "weft_group_abort": [c_group_p, ctypes.c_char_p],
    "weft_group_destroy": [c_group_p],
    "weft_all_reduce": [c_group_p, _ptr, _ptr, _size, _int, _int, _work_out],
    "weft_all_reduce_premul": [c_group_p, _ptr, _ptr, _size, _int, ctypes.c_double, _work_out],
    "weft_reduce": [c_group_p, _ptr, _ptr, _size, _int, _int, _int, _work_out],
    "weft_broadcast": [c_group_p, _ptr, _size, _int, _int, _work_out],
    "weft_all_gather": [c_group_p, _ptr, _ptr, _size, _int, _work_out],
    "weft_reduce_scatter": [c_group_p, _ptr, _ptr, _size, _int, _int, _work_out],
    "weft_reduce_scatter_premul": [c_group_p, _ptr, _ptr, _size, _int, ctypes.c_double, _work_out],
    "weft_all_to_all": [c_group_p, _ptr, _ptr, _size, _int, _work_out],
    "weft_gather": [c_group_p, _ptr, _ptr, _size, _int, _int, _work_out],
    "weft_scatter": [c_group_p, _ptr, _ptr, _size, _int, _int, _work_out],
    "weft_all_to_all_v": [c_group_p, _ptr, _sizes, _ptr, _sizes, _int, _work_out],
    "weft_barrier": [c_group_p, _work_out],
    "weft_send": [c_group_p, _ptr, _size, _int, _int, ctypes.c_uint64, _work_out],
    "weft_recv": [c_group_p, _ptr, _size, _int, _int, ctypes.c_uint64, _work_out],
    "weft_recv_any": [c_group_p, _ptr, _size, _int, ctypes.c_uint64, ctypes.POINTER(ctypes.c_int32),
                      _work_out],
    "weft_work_source_rank": [c_work_p, ctypes.POINTER(ctypes.c_int32)],
    "weft_work_wait": [c_work_p, ctypes.c_int64],
    "weft_work_test": [c_work_p, ctypes.POINTER(ctypes.c_int)],
    "weft_work_free": [c_work_p],
    "weft_dump_trace": [ctypes.c_char_p, _sizes],
}

for _name, _args in _PROTOTYPES.items():
    try:
        _fn = getattr(lib, _name)
    except AttributeError as e:
        raise ImportError(
            f"weft: {library_path} has no {_name}: it is older than this Python package "
            f"(set WEFT_LIBRARY to a matching libweft)"
        ) from e
    _fn.argtypes = _args
    _fn.restype = _result

lib.weft_last_error.argtypes = []
lib.weft_last_error.restype = ctypes.c_char_p
lib.weft_result_name.argtypes = [ctypes.c_int]
lib.weft_result_name.restype = ctypes.c_char_p
lib.weft_version.argtypes = []
lib.weft_version.restype = ctypes.c_char_p


def last_error():
    return lib.weft_last_error().decode("utf-8", "replace")


def result_name(code):
    return lib.weft_result_name(code).decode()
