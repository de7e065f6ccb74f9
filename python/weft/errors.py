"""weft's errors as Python exceptions: one class per weft_result_t code, all subclasses of
weft.Error. The message is weft's own, whole: it names the rank, group, operation and sequence
number, then what went wrong (rank 1/3 group "world" broadcast #4: InvalidArgument: ...)."""

from . import _capi


class Error(Exception):
    """A weft call failed. `code` is the weft_result_t value, `code_name` its enumerator name
    ("WEFT_ERR_PEER_LOST"), `message` weft's message (also str(error))."""

    code = None

    def __init__(self, message, code=None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    @property
    def code_name(self):
        return _capi.result_name(self.code) if self.code is not None else "WEFT_ERR_UNKNOWN"


class Timeout(Error, TimeoutError):
    """Did not finish within its timeout (WEFT_ERR_TIMEOUT). After a Work.wait(timeout) the
    operation is still running; after a synchronous collective the group is aborted."""

    code = 1


class PeerLost(Error, ConnectionError):
    """A peer died or closed its connection (WEFT_ERR_PEER_LOST): rebuild the group."""

    code = 2


class InvalidArgument(Error, ValueError):
    """The caller passed something wrong (WEFT_ERR_INVALID_ARGUMENT); nothing was issued."""

    code = 3


class Unsupported(Error):
    """Not implemented by this backend or build (WEFT_ERR_UNSUPPORTED)."""

    code = 4


class Aborted(Error):
    """The group was aborted (WEFT_ERR_ABORTED); the message holds the reason."""

    code = 5


class Desync(Error):
    """Ranks issued different collectives (WEFT_ERR_DESYNC)."""

    code = 6


class ProtocolError(Error):
    """A peer broke the wire protocol (WEFT_ERR_PROTOCOL)."""

    code = 7


class IoError(Error, OSError):
    """An operating-system call failed (WEFT_ERR_IO)."""

    code = 8


class InternalError(Error):
    """A bug in weft or a plugin (WEFT_ERR_INTERNAL): report it."""

    code = 9


_BY_CODE = {
    cls.code: cls
    for cls in (
        Timeout,
        PeerLost,
        InvalidArgument,
        Unsupported,
        Aborted,
        Desync,
        ProtocolError,
        IoError,
        InternalError,
    )
}


def error_for(code, message):
    """The exception for a failed call's code and message."""
    cls = _BY_CODE.get(code)
    if cls is None:
        return Error(f"{message} (result {code}, {_capi.result_name(code)})", code)
    return cls(message)


def check(code):
    """Raises the exception for a weft_result_t other than WEFT_SUCCESS, with weft's message (the
    calling thread's last error, read right after the failed call on the same thread)."""
    if code != 0:
        raise error_for(code, _capi.last_error())
