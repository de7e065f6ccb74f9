"""Process groups, their collectives, and work handles."""

import atexit
import ctypes
import enum
import threading
import weakref

from . import _capi
from ._buffers import DType, BufferArgumentError, borrow
from .errors import Error, InvalidArgument, check, error_for

lib = _capi.lib


class ReduceOp(enum.IntEnum):
    """weft_red_op_t. PREMUL_SUM takes a factor (factor= of all_reduce and reduce_scatter)."""

    SUM = 0
    PROD = 1
    MIN = 2
    MAX = 3
    AVG = 4
    PREMUL_SUM = 5
    BAND = 6
    BOR = 7
    BXOR = 8


def _op(op):
    if isinstance(op, str):
        try:
            return ReduceOp[op.upper()]
        except KeyError:
            raise InvalidArgument(f"op {op!r} is not a weft.ReduceOp name") from None
    return ReduceOp(op)


# Work handles dropped before their operation finished: the buffers they borrow stay lent until
# weft reports completion. Reaped (tested, freed, released) whenever a new operation is issued
# and when a group is destroyed.
_orphans = []
_orphans_lock = threading.Lock()


def _reap_orphans():
    with _orphans_lock:
        keep = []
        for handle, borrowed in _orphans:
            done = ctypes.c_int(0)
            lib.weft_work_test(handle, ctypes.byref(done))
            if done.value:
                lib.weft_work_free(handle)
                for b in borrowed:
                    b.release()
            else:
                keep.append((handle, borrowed))
        _orphans[:] = keep


class Work:
    """An asynchronous operation (weft_work_t), returned by a collective given async_op=True.

    wait(timeout=None) blocks until it completes and raises its error (a weft.Error subclass);
    with a timeout in seconds, raises weft.Timeout past it while the operation keeps running
    (wait again later). is_completed() never blocks. The buffers stay lent to weft until the
    operation completes: do not read the outputs or change the inputs before."""

    __slots__ = ("_handle", "_borrowed", "_error", "_done", "_lock", "_then", "_result", "op",
                 "__weakref__")

    def __init__(self, handle, borrowed, op, then=None):
        self._handle = handle
        self._borrowed = borrowed
        self._error = None
        self._done = False
        self._lock = threading.Lock()
        self._then = then
        self._result = None
        self.op = op

    def _finish(self, code):
        # Under self._lock. Frees the handle, releases the buffers, keeps the result.
        if code != 0:
            self._error = error_for(code, _capi.last_error())
        elif self.op == "recv_any":  # its result: the rank it received from
            source = ctypes.c_int32(-1)
            lib.weft_work_source_rank(self._handle, ctypes.byref(source))
            self._result = source.value
        lib.weft_work_free(self._handle)
        self._handle = None
        for b in self._borrowed:
            b.release()
        self._borrowed = ()
        self._done = True
        if self._error is None and self._then is not None:
            try:
                self._result = self._then()
            except Error as e:
                self._error = e
            self._then = None

    def wait(self, timeout=None):
        """Waits for completion (timeout in seconds; None: the group's timeout) and returns its
        result (None for plain collectives), or raises the operation's error. Waiting again on a
        completed work gives the same outcome."""
        with self._lock:
            if not self._done:
                ms = -1 if timeout is None else max(0, int(timeout * 1000))
                code = lib.weft_work_wait(self._handle, ms)
                if code == 1:
                    # weft_work_wait's own timeout: the operation is still running.
                    done = ctypes.c_int(0)
                    test_code = lib.weft_work_test(self._handle, ctypes.byref(done))
                    if not done.value:
                        raise error_for(code, _capi.last_error())
                    code = test_code
                self._finish(code)
            if self._error is not None:
                raise self._error
            return self._result

    def is_completed(self):
        """True once the operation has completed, successfully or not (wait() then returns or
        raises at once). Never blocks."""
        with self._lock:
            if self._done:
                return True
            done = ctypes.c_int(0)
            code = lib.weft_work_test(self._handle, ctypes.byref(done))
            if done.value:
                self._finish(code)
            return self._done

    def exception(self):
        """The error the completed operation failed with, else None (None too while pending)."""
        with self._lock:
            return self._error

    def __del__(self):
        handle = getattr(self, "_handle", None)
        if handle is None:
            return
        with _orphans_lock:
            _orphans.append((handle, self._borrowed))


# Live groups in creation order, destroyed children first at exit (the world group, whose rank 0
# may host the store, last).
_live_groups = []
_live_lock = threading.Lock()


class Group:
    """A weft process group (weft_group_t). Made by weft.init(), Group.new_group() or
    Group.split(); released by destroy() (also at exit, and as a context manager).

    Every collective takes async_op=False (returns None once done, or raises) or async_op=True
    (returns a Work at once). Buffers are numpy arrays, bytearray, memoryview or any other
    buffer-protocol object, or CPU torch tensors; counts come from their sizes and the dtype from
    their element type (dtype= overrides it)."""

    def __init__(self, handle, parent=None):
        self._handle = handle
        self._parent = parent  # keeps the parent (and its store) alive while this group lives
        rank = ctypes.c_int32()
        size = ctypes.c_int32()
        check(lib.weft_group_rank(handle, ctypes.byref(rank)))
        check(lib.weft_group_size(handle, ctypes.byref(size)))
        self.rank = rank.value
        self.size = size.value
        with _live_lock:
            _live_groups.append(weakref.ref(self))

    def __repr__(self):
        state = "destroyed" if self._handle is None else f"rank {self.rank}/{self.size}"
        return f"<weft.Group {state}>"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()

    def __del__(self):
        try:
            self.destroy()
        except Exception:
            pass

    # ---- Plumbing.

    def _h(self, op):
        if self._handle is None:
            raise InvalidArgument(f"weft.Group.{op}: the group was destroyed")
        return self._handle

    def _borrow(self, op, obj, name, writable, dtype=None):
        try:
            return borrow(obj, name, writable, dtype)
        except BufferArgumentError as e:
            raise InvalidArgument(f"rank {self.rank}/{self.size} {op}: InvalidArgument: {e}") from None

    def _issue(self, op, call, borrowed, async_op, then=None):
        """Runs `call(work_out)` (a C collective); synchronous when async_op is false."""
        if _orphans:
            _reap_orphans()
        if not async_op:
            try:
                check(call(None))
            finally:
                for b in borrowed:
                    b.release()
            return then() if then is not None else None
        handle = _capi.c_work_p()
        code = call(ctypes.byref(handle))
        if code != 0:
            for b in borrowed:
                b.release()
            check(code)
        return Work(handle, borrowed, op, then)

    # ---- Groups.

    def new_group(self, ranks):
        """A group of the listed ranks of this one (group rank i is ranks[i]); None on ranks not
        listed. Every rank of this group calls it, in the same order as its other new_group and
        split calls, with the same list."""
        ranks = list(ranks)
        arr = (ctypes.c_int32 * len(ranks))(*ranks)
        out = _capi.c_group_p()
        check(lib.weft_new_group(self._h("new_group"), arr, len(ranks), ctypes.byref(out)))
        return Group(out, parent=self) if out.value else None

    def split(self, color, key=0):
        """Groups by color: ranks passing the same color >= 0 form a group ordered by (key, rank);
        a negative color gives None. Collective over this group."""
        out = _capi.c_group_p()
        check(lib.weft_split(self._h("split"), color, key, ctypes.byref(out)))
        return Group(out, parent=self) if out.value else None

    def abort(self, reason=None):
        """Fails every pending and later operation of the group with weft.Aborted (the message
        holds `reason`), unblocking the running one in bounded time. Any thread, any time."""
        check(lib.weft_group_abort(self._h("abort"), None if reason is None else reason.encode()))

    def destroy(self):
        """Waits (up to the group's timeout) for the operations issued, then closes the group.
        Idempotent. Destroy sub-groups before the world group on the rank hosting the store."""
        handle, self._handle = self._handle, None
        if handle is None:
            return
        code = lib.weft_group_destroy(handle)
        _reap_orphans()
        check(code)

    # ---- Collectives.

    def all_reduce(self, buf, op=ReduceOp.SUM, *, out=None, factor=None, dtype=None,
                   async_op=False):
        """Reduces `buf` over every rank, in place, or into `out` when given (the same size).
        op=PREMUL_SUM needs factor= (each input scaled by it, then summed)."""
        op = _op(op)
        h = self._h("all_reduce")
        src = self._borrow("all_reduce", buf, "buf", out is None, dtype)
        dst = src if out is None else self._borrow("all_reduce", out, "out", True, dtype)
        borrowed = [src] if out is None else [src, dst]
        self._same(dst, src, "all_reduce", "out", "buf", borrowed)
        if op == ReduceOp.PREMUL_SUM:
            f = self._factor(factor, "all_reduce", borrowed)
            return self._issue("all_reduce", lambda w: lib.weft_all_reduce_premul(
                h, src.ptr, dst.ptr, src.count, src.dtype, f, w), borrowed, async_op)
        return self._issue("all_reduce", lambda w: lib.weft_all_reduce(
            h, src.ptr, dst.ptr, src.count, src.dtype, op, w), borrowed, async_op)

    def reduce(self, buf, root, op=ReduceOp.SUM, *, out=None, dtype=None, async_op=False):
        """Reduces every rank's `buf` into root's (in place), or into root's `out` when given."""
        op = _op(op)
        h = self._h("reduce")
        src = self._borrow("reduce", buf, "buf", out is None and root == self.rank, dtype)
        borrowed = [src]
        dst = src
        if out is not None and root == self.rank:
            dst = self._borrow("reduce", out, "out", True, dtype)
            borrowed.append(dst)
            self._same(dst, src, "reduce", "out", "buf", borrowed)
        recv = dst.ptr if root == self.rank else None
        return self._issue("reduce", lambda w: lib.weft_reduce(
            h, src.ptr, recv, src.count, src.dtype, op, root, w), borrowed, async_op)

    def broadcast(self, buf, root=0, *, dtype=None, async_op=False):
        """Copies root's `buf` into every rank's `buf`."""
        h = self._h("broadcast")
        b = self._borrow("broadcast", buf, "buf", root != self.rank, dtype)
        return self._issue("broadcast", lambda w: lib.weft_broadcast(
            h, b.ptr, b.count, b.dtype, root, w), [b], async_op)

    def all_gather(self, send, recv, *, dtype=None, async_op=False):
        """Gathers every rank's `send` into `recv` (size times larger), rank-major."""
        h = self._h("all_gather")
        s = self._borrow("all_gather", send, "send", False, dtype)
        r = self._borrow("all_gather", recv, "recv", True, dtype)
        self._blocks(r, s, "all_gather", "recv", "send", [s, r])
        return self._issue("all_gather", lambda w: lib.weft_all_gather(
            h, s.ptr, r.ptr, s.count, s.dtype, w), [s, r], async_op)

    def reduce_scatter(self, send, recv, op=ReduceOp.SUM, *, factor=None, dtype=None,
                       async_op=False):
        """Reduces every rank's `send` (size times `recv`, rank-major) and leaves block r of the
        reduction in rank r's `recv`. op=PREMUL_SUM needs factor=."""
        op = _op(op)
        h = self._h("reduce_scatter")
        s = self._borrow("reduce_scatter", send, "send", False, dtype)
        r = self._borrow("reduce_scatter", recv, "recv", True, dtype)
        self._blocks(s, r, "reduce_scatter", "send", "recv", [s, r])
        if op == ReduceOp.PREMUL_SUM:
            f = self._factor(factor, "reduce_scatter", [s, r])
            return self._issue("reduce_scatter", lambda w: lib.weft_reduce_scatter_premul(
                h, s.ptr, r.ptr, r.count, r.dtype, f, w), [s, r], async_op)
        return self._issue("reduce_scatter", lambda w: lib.weft_reduce_scatter(
            h, s.ptr, r.ptr, r.count, r.dtype, op, w), [s, r], async_op)

    def all_to_all(self, send, recv, *, dtype=None, async_op=False):
        """Even all-to-all: block j of `send` goes to rank j, block j of `recv` comes from rank j
        (both hold size equal blocks; in place when they are the same object)."""
        h = self._h("all_to_all")
        in_place = send is recv
        s = self._borrow("all_to_all", send, "send", in_place, dtype)
        r = s if in_place else self._borrow("all_to_all", recv, "recv", True, dtype)
        borrowed = [s] if in_place else [s, r]
        self._same(r, s, "all_to_all", "recv", "send", borrowed)
        if s.count % self.size:
            self._refuse("all_to_all", f"send holds {s.count} elements, not {self.size} equal "
                         f"blocks", borrowed)
        return self._issue("all_to_all", lambda w: lib.weft_all_to_all(
            h, s.ptr, r.ptr, s.count // self.size, s.dtype, w), borrowed, async_op)

    def all_to_all_v(self, send, send_counts, recv, recv_counts, *, dtype=None, async_op=False):
        """All-to-all with a count per rank: the j-th block of `send` (send_counts[j] elements)
        goes to rank j; the j-th block of `recv` (recv_counts[j]) comes from rank j."""
        h = self._h("all_to_all_v")
        sc = self._counts(send_counts, "send_counts", "all_to_all_v")
        rc = self._counts(recv_counts, "recv_counts", "all_to_all_v")
        s = self._borrow("all_to_all_v", send, "send", False, dtype)
        r = self._borrow("all_to_all_v", recv, "recv", True, dtype)
        return self._issue("all_to_all_v", lambda w: lib.weft_all_to_all_v(
            h, s.ptr, sc, r.ptr, rc, s.dtype, w), [s, r], async_op)

    def gather(self, send, recv, root, *, dtype=None, async_op=False):
        """Gathers every rank's `send` into root's `recv` (size times larger, rank-major); `recv`
        is ignored (may be None) on other ranks."""
        h = self._h("gather")
        s = self._borrow("gather", send, "send", False, dtype)
        borrowed = [s]
        rptr = None
        if root == self.rank:
            r = self._borrow("gather", recv, "recv", True, dtype)
            borrowed.append(r)
            self._blocks(r, s, "gather", "recv", "send", borrowed)
            rptr = r.ptr
        return self._issue("gather", lambda w: lib.weft_gather(
            h, s.ptr, rptr, s.count, s.dtype, root, w), borrowed, async_op)

    def scatter(self, send, recv, root, *, dtype=None, async_op=False):
        """Scatters root's `send` (size times `recv`, rank-major): rank r's `recv` gets block r.
        `send` is ignored (may be None) on other ranks."""
        h = self._h("scatter")
        r = self._borrow("scatter", recv, "recv", True, dtype)
        borrowed = [r]
        sptr = None
        if root == self.rank:
            s = self._borrow("scatter", send, "send", False, dtype)
            borrowed.append(s)
            self._blocks(s, r, "scatter", "send", "recv", borrowed)
            sptr = s.ptr
        return self._issue("scatter", lambda w: lib.weft_scatter(
            h, sptr, r.ptr, r.count, r.dtype, root, w), borrowed, async_op)

    def barrier(self, *, async_op=False):
        """Completes when every rank of the group has entered it."""
        h = self._h("barrier")
        return self._issue("barrier", lambda w: lib.weft_barrier(h, w), [], async_op)

    def send(self, buf, peer, tag=0, *, dtype=None, async_op=False):
        """Sends `buf` to group rank `peer`; pairs with peer's recv(.., this rank, tag)."""
        h = self._h("send")
        b = self._borrow("send", buf, "buf", False, dtype)
        return self._issue("send", lambda w: lib.weft_send(
            h, b.ptr, b.count, b.dtype, peer, tag, w), [b], async_op)

    def recv(self, buf, peer=None, tag=0, *, dtype=None, async_op=False):
        """Receives into `buf` from group rank `peer`'s send(.., this rank, tag); peer=None takes
        the first such send from any other rank (torch.distributed's src=None). Returns the
        sender's rank (async: the work's wait() does)."""
        h = self._h("recv")
        b = self._borrow("recv", buf, "buf", True, dtype)
        if peer is not None:
            return self._issue("recv", lambda w: lib.weft_recv(
                h, b.ptr, b.count, b.dtype, peer, tag, w), [b], async_op, then=lambda: peer)
        source = ctypes.c_int32(-1)
        work = self._issue("recv_any", lambda w: lib.weft_recv_any(
            h, b.ptr, b.count, b.dtype, tag, None if w else ctypes.byref(source), w), [b],
            async_op)
        return work if async_op else source.value

    # ---- Argument checks done here because the C API gets one count for two buffers.

    def _refuse(self, op, detail, borrowed):
        for b in borrowed:
            b.release()
        raise InvalidArgument(f"rank {self.rank}/{self.size} {op}: InvalidArgument: {detail}")

    def _same(self, a, b, op, a_name, b_name, borrowed):
        if a.dtype != b.dtype:
            self._refuse(op, f"{a_name} is {a.dtype.name.lower()} but {b_name} is "
                         f"{b.dtype.name.lower()}", borrowed)
        if a.count != b.count:
            self._refuse(op, f"{a_name} holds {a.count} elements but {b_name} holds {b.count}",
                         borrowed)

    def _blocks(self, big, small, op, big_name, small_name, borrowed):
        if big.dtype != small.dtype:
            self._refuse(op, f"{big_name} is {big.dtype.name.lower()} but {small_name} is "
                         f"{small.dtype.name.lower()}", borrowed)
        if big.count != small.count * self.size:
            self._refuse(op, f"{big_name} holds {big.count} elements, not size {self.size} times "
                         f"{small_name}'s {small.count}", borrowed)

    def _factor(self, factor, op, borrowed):
        if factor is None:
            self._refuse(op, "op PREMUL_SUM needs factor=", borrowed)
        return float(factor)

    def _counts(self, counts, name, op):
        counts = [int(c) for c in counts]
        if len(counts) != self.size or any(c < 0 for c in counts):
            raise InvalidArgument(f"rank {self.rank}/{self.size} {op}: InvalidArgument: {name} "
                                  f"must hold {self.size} counts >= 0, not {counts}")
        return (ctypes.c_size_t * self.size)(*counts)


def init(url=None, *, rank=-1, size=-1, backend=None, timeout=None):
    """Meets the other ranks and returns the world Group.

    With no URL, from the launcher's environment (weftrun, torchrun, srun, mpirun:
    docs/launching.md). Otherwise "env://", "tcp://HOST:PORT" (rank 0 hosts the store) or
    "file:///PATH", with rank and size given or taken from the environment. backend: as c10d
    writes it ("tcp", "cpu:tcp"); timeout: seconds, bounding the rendezvous and every collective
    (default WEFT_TIMEOUT, 300 s)."""
    options = _capi.InitOptions()
    options.struct_size = ctypes.sizeof(_capi.InitOptions)
    options.rank = rank
    options.world_size = size
    options.url = url.encode() if url else None
    options.backend = backend.encode() if backend else None
    if timeout is None:
        options.timeout_ms = 0
    else:
        if timeout <= 0:
            raise InvalidArgument(f"weft.init: InvalidArgument: timeout {timeout} is not > 0 s")
        options.timeout_ms = max(1, int(timeout * 1000))
    out = _capi.c_group_p()
    check(lib.weft_init(ctypes.byref(options), ctypes.byref(out)))
    return Group(out)


def _destroy_live_groups():
    with _live_lock:
        groups = [ref() for ref in reversed(_live_groups)]
        _live_groups.clear()
    for g in groups:
        if g is not None:
            try:
                g.destroy()
            except Error:
                pass


atexit.register(_destroy_live_groups)

__all__ = ["DType", "ReduceOp", "Group", "Work", "init"]
