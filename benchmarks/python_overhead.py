"""What the Python package adds per call: a synchronous all_reduce of a few bytes through
weft.Group.all_reduce (numpy, bytearray), through the bare ctypes call it makes, asynchronously
with Work.wait(), and through torch.distributed with the "weft" backend when PyTorch is there.
Compare with benchmarks/c_api_latency (the same loop in C):

    weftrun --nproc-per-node 2 --standalone build/benchmarks/c_api_latency 2000 8
    PYTHONPATH=build/python weftrun --nproc-per-node 2 --standalone python3 \\
        benchmarks/python_overhead.py 2000 8

Rank 0 prints the median over 7 rounds of ITERS calls, in microseconds per call."""
import ctypes
import os
import statistics
import sys
import time

import weft
from weft import _capi

iters = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
nbytes = int(sys.argv[2]) if len(sys.argv) > 2 else 8
world = weft.init()
results = {}


def timed(name, fn):
    for _ in range(iters // 10 + 10):
        fn()
    rounds = []
    for _ in range(7):
        world.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        rounds.append((time.perf_counter() - start) / iters * 1e6)
    results[name] = statistics.median(rounds)


try:
    import numpy as np

    arr = np.zeros(nbytes // 4, np.float32)
    timed("weft.Group.all_reduce (numpy)", lambda: world.all_reduce(arr))
    timed("weft.Group.all_reduce async + wait (numpy)",
          lambda: world.all_reduce(arr, async_op=True).wait())
except ImportError:
    pass
ba = bytearray(nbytes)
timed("weft.Group.all_reduce (bytearray)", lambda: world.all_reduce(ba, weft.MAX, dtype=weft.float32))
raw = (ctypes.c_float * (nbytes // 4))()
ptr = ctypes.addressof(raw)
handle = world._handle
fn = _capi.lib.weft_all_reduce
timed("bare ctypes weft_all_reduce", lambda: fn(handle, ptr, ptr, nbytes // 4, 0, 0, None))
try:  # again, last: the first loop of a process runs while it warms up
    timed("weft.Group.all_reduce (numpy), again", lambda: world.all_reduce(arr))
except NameError:
    pass

if os.environ.get("WEFT_BENCH_TORCH") == "1":
    import torch
    import torch.distributed as dist
    import weft.torch  # noqa: F401

    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False, use_libuv=False)
    dist.init_process_group("weft", store=store, rank=world.rank, world_size=world.size)
    t = torch.zeros(nbytes // 4)
    timed("torch.distributed.all_reduce (weft backend)", lambda: dist.all_reduce(t))
    dist.destroy_process_group()

if world.rank == 0:
    for name, us in results.items():
        print(f"{name} {nbytes} B: {us:.2f} us/call (median of 7 rounds of {iters})")
world.destroy()
