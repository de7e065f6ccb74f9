"""Every collective of the weft Python package, run by each rank under weftrun (1..4 ranks):
results checked element by element against numpy references computed here from every rank's
inputs; errors checked as exceptions with weft's whole message (rank, group, op, sequence)."""
import array
import functools
import os
import re
import sys
import threading

try:
    import numpy as np
except ImportError:
    print("skipped: numpy is not installed (apt-get install python3-numpy)")
    sys.exit(77)

import weft

world = weft.init(timeout=60)
R, N = world.rank, world.size
assert (R, N) == (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])), (R, N)
WHERE = f'rank {R}/{N} group "world"'
checks = 0


def expect_equal(got, want, what):
    global checks
    checks += 1
    got = np.asarray(got)
    want = np.asarray(want)
    if got.shape != want.shape:
        raise AssertionError(f"rank {R}: {what}: shape {got.shape} != {want.shape}")
    if want.dtype.kind == "f":
        tol = 1e-3 if want.dtype == np.float16 else 1e-6
        bad = ~np.isclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=0)
    else:
        bad = got != want
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise AssertionError(
            f"rank {R}/{N}: {what}: element {i} is {got.flat[i]}, expected {want.flat[i]} "
            f"({int(bad.sum())} of {got.size} differ)")


def expect_raises(cls, fn, *fragments):
    global checks
    checks += 1
    try:
        fn()
    except weft.Error as e:
        if type(e) is not cls:
            raise AssertionError(f"rank {R}: expected {cls.__name__}, got {type(e).__name__}: {e}")
        for f in fragments:
            if (not f.search(str(e)) if isinstance(f, re.Pattern) else f not in str(e)):
                raise AssertionError(f"rank {R}: message {str(e)!r} lacks {f!r}")
        return e
    raise AssertionError(f"rank {R}: expected {cls.__name__}, nothing raised")


DTYPES = [np.float32, np.float64, np.float16, np.int8, np.uint8, np.int32, np.int64, np.bool_]


def data(rank, n, dtype, small=False):
    i = np.arange(n)
    if dtype == np.bool_:
        return (i + rank) % 3 == 0
    if small:  # for PROD: 1 or 2, so that 4 ranks stay within int8
        return ((i + rank) % 2 + 1).astype(dtype)
    return ((i * (rank + 1) + 3 * rank) % 23).astype(dtype)


NP_OPS = {
    weft.SUM: np.add, weft.PROD: np.multiply, weft.MIN: np.minimum, weft.MAX: np.maximum,
    weft.BAND: np.bitwise_and, weft.BOR: np.bitwise_or, weft.BXOR: np.bitwise_xor,
}


def ops_for(dtype):
    if dtype == np.bool_:
        return [weft.MIN, weft.MAX, weft.BAND, weft.BOR, weft.BXOR]
    ops = [weft.SUM, weft.PROD, weft.MIN, weft.MAX]
    if np.issubdtype(dtype, np.integer):
        ops += [weft.BAND, weft.BOR, weft.BXOR]
    return ops


def reference(op, n, dtype, count_per_rank=None):
    inputs = [data(r, n, dtype, small=op == weft.PROD) for r in range(N)]
    return functools.reduce(NP_OPS[op], inputs).astype(dtype)


n = 37
# ---- all_reduce: every dtype and op, in place and synchronous.
for dt in DTYPES:
    for op in ops_for(dt):
        x = data(R, n, dt, small=op == weft.PROD)
        world.all_reduce(x, op)
        expect_equal(x, reference(op, n, dt), f"all_reduce {op.name} {np.dtype(dt).name}")
# AVG and PREMUL_SUM on floats; out-of-place and asynchronous.
for dt in (np.float32, np.float64):
    x = data(R, n, dt)
    out = np.full(n, -1, dt)
    work = world.all_reduce(x, weft.AVG, out=out, async_op=True)
    assert isinstance(work, weft.Work)
    work.wait()
    assert work.is_completed()
    expect_equal(x, data(R, n, dt), "all_reduce out= leaves the input alone")
    expect_equal(out, reference(weft.SUM, n, dt) / N, f"all_reduce AVG {np.dtype(dt).name}")
    y = data(R, n, dt)
    world.all_reduce(y, "premul_sum", factor=0.25)
    expect_equal(y, reference(weft.SUM, n, dt) * 0.25, "all_reduce PREMUL_SUM")
# bfloat16 carried in uint16 arrays.
f32 = data(R, n, np.float32)
bf = (f32.view(np.uint32) >> 16).astype(np.uint16)
world.all_reduce(bf, weft.SUM, dtype=weft.bfloat16)
want = (reference(weft.SUM, n, np.float32).view(np.uint32) >> 16).astype(np.uint16)
expect_equal(bf, want, "all_reduce bfloat16")
# fp8 carried in bytearrays. Every rank's 1.0 (e4m3fn 0x38, e5m2 0x3c) sums to N, exact in both
# for N <= 8; positive fp8 values order as their bytes, so max of 1.0 + R ulps is 1.0 + N - 1 ulps.
def fp8_int(n, mantissa, bias):
    e = n.bit_length() - 1
    return ((e + bias) << mantissa) | (((n - (1 << e)) << mantissa) >> e)
for name, dtype, mantissa, bias in (("e4m3fn", weft.float8_e4m3fn, 3, 7),
                                    ("e5m2", weft.float8_e5m2, 2, 15)):
    ones = bytearray([fp8_int(1, mantissa, bias)] * 5)
    world.all_reduce(ones, weft.SUM, dtype=dtype)
    expect_equal(np.frombuffer(ones, np.uint8), [fp8_int(N, mantissa, bias)] * 5,
                 f"all_reduce float8_{name} sum")
    ulps = bytearray([fp8_int(1, mantissa, bias) + R] * 3)
    world.all_reduce(ulps, weft.MAX, dtype=dtype)
    expect_equal(np.frombuffer(ulps, np.uint8), [fp8_int(1, mantissa, bias) + N - 1] * 3,
                 f"all_reduce float8_{name} max")
# Other buffer-protocol objects: array.array, memoryview, bytearray.
a = array.array("i", [R + k for k in range(8)])
world.all_reduce(memoryview(a), weft.MAX)
expect_equal(np.frombuffer(a, np.int32), np.arange(8) + N - 1, "all_reduce array.array")
ba = bytearray(range(R, R + 16))
world.all_reduce(ba, weft.MIN)
expect_equal(np.frombuffer(ba, np.uint8), np.arange(16), "all_reduce bytearray")
# A read-only input for an out-of-place call.
out = np.zeros(4, np.uint8)
world.all_reduce(bytes([R] * 4), weft.SUM, out=out)
expect_equal(out, [N * (N - 1) // 2] * 4, "all_reduce bytes input")

# ---- reduce and broadcast, every root.
for root in range(N):
    x = data(R, n, np.int64)
    world.reduce(x, root, weft.SUM)
    if R == root:
        expect_equal(x, reference(weft.SUM, n, np.int64), f"reduce to {root}")
    out = np.full(n, -7.0)
    world.reduce(data(R, n, np.float64), root, weft.MAX, out=out if R == root else None)
    expect_equal(out, reference(weft.MAX, n, np.float64) if R == root else np.full(n, -7.0),
                 f"reduce out= to {root}")
    b = data(R, n, np.float32) if R == root else np.zeros(n, np.float32)
    world.broadcast(b, root)
    expect_equal(b, data(root, n, np.float32), f"broadcast from {root}")
    ba = bytearray(b"weft from %d" % root) if R == root else bytearray(len(b"weft from %d" % root))
    world.broadcast(ba, root)
    assert bytes(ba) == b"weft from %d" % root, ba

# ---- all_gather, reduce_scatter, all_to_all (even and with counts), gather, scatter.
m = 5
g = np.zeros(N * m, np.int32)
world.all_gather(data(R, m, np.int32), g)
expect_equal(g, np.concatenate([data(r, m, np.int32) for r in range(N)]), "all_gather")
for op in (weft.SUM, weft.MAX):
    rs = np.zeros(m, np.float64)
    world.reduce_scatter(data(R, N * m, np.float64), rs, op)
    expect_equal(rs, reference(op, N * m, np.float64)[R * m:(R + 1) * m], f"reduce_scatter {op.name}")
rs = np.zeros(m, np.float32)
world.reduce_scatter(data(R, N * m, np.float32), rs, weft.PREMUL_SUM, factor=2.0)
expect_equal(rs, 2.0 * reference(weft.SUM, N * m, np.float32)[R * m:(R + 1) * m],
             "reduce_scatter PREMUL_SUM")


def a2a_block(src, dst, count):  # what rank src sends to rank dst
    return (np.arange(count) + 100 * src + 10 * dst).astype(np.int64)


send = np.concatenate([a2a_block(R, j, 3) for j in range(N)])
recv = np.zeros_like(send)
world.all_to_all(send, recv)
expect_equal(recv, np.concatenate([a2a_block(j, R, 3) for j in range(N)]), "all_to_all")
world.all_to_all(send, send)
expect_equal(send, recv, "all_to_all in place")
counts = lambda src, dst: (src + 2 * dst) % 4  # zero-size blocks included
send = np.concatenate([a2a_block(R, j, counts(R, j)) for j in range(N)])
recv = np.full(sum(counts(j, R) for j in range(N)), -1, np.int64)
world.all_to_all_v(send, [counts(R, j) for j in range(N)], recv, [counts(j, R) for j in range(N)])
expect_equal(recv, np.concatenate([a2a_block(j, R, counts(j, R)) for j in range(N)]),
             "all_to_all_v")
for root in range(N):
    gathered = np.full(N * m, -1, np.int64) if R == root else None
    world.gather(data(R, m, np.int64), gathered, root)
    if R == root:
        expect_equal(gathered, np.concatenate([data(r, m, np.int64) for r in range(N)]),
                     f"gather to {root}")
    piece = np.zeros(m, np.float32)
    world.scatter(data(root, N * m, np.float32) if R == root else None, piece, root)
    expect_equal(piece, data(root, N * m, np.float32)[R * m:(R + 1) * m], f"scatter from {root}")
world.barrier()

# ---- send/recv around a ring, and several asynchronous works at once.
if N > 1:
    out = data(R, n, np.float64)
    inc = np.zeros(n, np.float64)
    ws = world.send(out, (R + 1) % N, tag=7, async_op=True)
    world.recv(inc, (R - 1) % N, tag=7)
    ws.wait()
    expect_equal(inc, data((R - 1) % N, n, np.float64), "recv from the ring")
    # From any source (peer=None): rank 0 takes every other rank's message once, the sender
    # named by the return value (synchronous) or by wait() (async).
    if R == 0:
        got = {}
        for k in range(N - 1):
            buf = np.zeros(n, np.float64)
            if k % 2 == 0:
                src = world.recv(buf, None, tag=11)
            else:
                src = world.recv(buf, tag=11, async_op=True).wait()
            assert src in range(1, N) and src not in got, (src, sorted(got))
            got[src] = buf
            expect_equal(buf, data(100 + src, n, np.float64), f"recv from any source ({src})")
    else:
        world.send(data(100 + R, n, np.float64), 0, tag=11)
works = [world.all_reduce(data(R, n, np.int32), weft.SUM, out=np.zeros(n, np.int32),
                          async_op=True) for _ in range(3)]
outs = [np.zeros(n, np.int64) for _ in range(3)]
works = [world.all_reduce(data(R, n, np.int64), weft.SUM, out=o, async_op=True) for o in outs]
works.append(world.barrier(async_op=True))
for w in works:
    assert w.wait(timeout=30) is None
for o in outs:
    expect_equal(o, reference(weft.SUM, n, np.int64), "async all_reduce")

# ---- Work.wait(timeout) on a recv that is not matched yet, on a sub-group, without blocking the
# world group; the GIL is released while a thread waits in weft.
if N > 1:
    sub = world.new_group(list(range(N)))
    if R == 0:
        got = np.zeros(4, np.int32)
        pending = sub.recv(got, 1, tag=3, async_op=True)
        e = expect_raises(weft.Timeout, lambda: pending.wait(timeout=0.05))
        assert isinstance(e, TimeoutError)
        assert not pending.is_completed()
        ticks = []
        waiter = threading.Thread(target=lambda: ticks.append(pending.wait(timeout=30)))
        waiter.start()
        world.barrier()  # the main thread runs Python and weft while the waiter waits
        waiter.join(60)
        assert ticks == [1], ticks  # a recv's wait() returns its sender
        expect_equal(got, [1, 2, 3, 4], "recv after a timed-out wait")
    else:
        world.barrier()
        if R == 1:
            sub.send(np.array([1, 2, 3, 4], np.int32), 0, tag=3)
    sub.destroy()

# ---- Sub-groups: new_group of the even ranks, split by parity.
evens = world.new_group([r for r in range(N) if r % 2 == 0])
assert (evens is None) == (R % 2 == 1)
if evens is not None:
    assert (evens.rank, evens.size) == (R // 2, (N + 1) // 2)
    x = data(R, n, np.int64)
    evens.all_reduce(x)
    expect_equal(x, sum(data(r, n, np.int64) for r in range(0, N, 2)), "new_group all_reduce")
half = world.split(R % 2, key=-R)  # key -R: reversed order
members = [r for r in range(N) if r % 2 == R % 2]
assert (half.rank, half.size) == (sorted(members, reverse=True).index(R), len(members))
x = np.full(3, R, np.int32)
half.all_gather(np.full(3, R, np.int32), y := np.zeros(3 * half.size, np.int32))
expect_equal(y, np.repeat(sorted(members, reverse=True), 3), "split all_gather order")
assert world.split(-1) is None

# ---- Errors: weft's message whole, a class per code; Python-side checks say the same things.
e = expect_raises(weft.InvalidArgument, lambda: world.broadcast(np.zeros(4), N),
                  re.compile(re.escape(WHERE) + r" broadcast #\d+: InvalidArgument: root "
                             + f"{N} is out of range for a group of {N} ranks$"))
assert isinstance(e, ValueError) and e.code == 3 and e.code_name == "WEFT_ERR_INVALID_ARGUMENT"
expect_raises(weft.InvalidArgument, lambda: world.all_reduce(np.zeros(4), weft.BXOR),
              WHERE, "all_reduce #", "op bxor cannot reduce float64")
expect_raises(weft.InvalidArgument, lambda: world.all_reduce(np.zeros((4, 4))[:, 0]),
              f"rank {R}/{N} all_reduce: InvalidArgument: buf must be writable and C-contiguous")
expect_raises(weft.InvalidArgument, lambda: world.all_reduce(b"abcd"),
              "buf must be writable and C-contiguous")
expect_raises(weft.InvalidArgument, lambda: world.all_reduce(np.zeros(4, np.uint16)),
              "buf has elements of format 'H'")
expect_raises(weft.InvalidArgument, lambda: world.all_reduce([1, 2, 3]),
              "buf: a list has neither the buffer protocol nor is a torch tensor")
expect_raises(weft.InvalidArgument,
              lambda: world.all_reduce(np.zeros(4), out=np.zeros(5)),
              "out holds 5 elements but buf holds 4")
expect_raises(weft.InvalidArgument,
              lambda: world.all_gather(np.zeros(2, np.int32), np.zeros(2 * N + 1, np.int32)),
              f"recv holds {2 * N + 1} elements, not size {N} times send's 2")
expect_raises(weft.InvalidArgument, lambda: world.all_reduce(np.zeros(2), weft.PREMUL_SUM),
              "op PREMUL_SUM needs factor=")
expect_raises(weft.InvalidArgument, lambda: world.all_to_all_v(np.zeros(1), [1], np.zeros(1), [1]),
              f"send_counts must hold {N} counts") if N > 1 else None
expect_raises(weft.InvalidArgument, lambda: world.new_group([0, 0]),
              f"{WHERE} new_group: InvalidArgument: ranks: 0 twice")
# Nothing of it was issued: the group still works.
x = np.ones(3, np.float32)
world.all_reduce(x)
expect_equal(x, [N] * 3, "all_reduce after refused calls")

# ---- abort: pending and later work fail with weft.Aborted and the reason.
doomed = world.split(0)
doomed.abort("the test gives up on this group")
expect_raises(weft.Aborted, lambda: doomed.all_reduce(np.ones(2)),
              f'rank {R}/{N} group "', "the test gives up on this group")
doomed.destroy()
expect_raises(weft.InvalidArgument, lambda: doomed.barrier(), "the group was destroyed")

# ---- The flight recorder: one file for this rank, where WEFT_TRACE_DIR says.
expect_equal(weft.dump_trace("from python"), 1, "files dump_trace wrote")
trace_dir = os.environ.get("WEFT_TRACE_DIR") or "."
assert os.path.exists(os.path.join(trace_dir, f"weft-trace-rank{R}.json")), trace_dir

half.destroy()
if evens is not None:
    evens.destroy()
world.barrier()
world.destroy()
print(f"rank {R}/{N}: {checks} checks passed (weft {weft.__version__}, {weft.library_path})")
