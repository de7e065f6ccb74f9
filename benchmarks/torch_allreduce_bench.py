"""dist.all_reduce through the "weft" backend against "gloo", side by side in one job (a gloo group
made with new_group), per size; and the time per call at 8 B. Run in the pytorch-peer chroot
(docs/python.md):

    USE_LIBUV=0 LD_LIBRARY_PATH=$PWD/build/hostlibs PYTHONPATH=$PWD/build/python \\
      build/tools/weftrun --nproc-per-node 2 --standalone \\
      ../shared/tools/pytorch-peer/pytorch-python benchmarks/torch_allreduce_bench.py

Rank 0 prints the median over 5 rounds."""
import os
import statistics
import time

import torch
import torch.distributed as dist

import weft.torch  # noqa: F401

torch.set_num_threads(1)
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                      use_libuv=False)
dist.init_process_group("weft", store=store, rank=int(os.environ["RANK"]),
                        world_size=int(os.environ["WORLD_SIZE"]))
gloo = dist.new_group(backend="gloo")
groups = {"weft": dist.group.WORLD, "gloo": gloo}


def per_call_us(group, nbytes, iters):
    t = torch.ones(max(1, nbytes // 4))
    for _ in range(max(2, iters // 10)):
        dist.all_reduce(t, group=group)
    rounds = []
    for _ in range(5):
        dist.barrier(group=group)
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t, group=group)
        rounds.append((time.perf_counter() - start) / iters * 1e6)
    return statistics.median(rounds)


for nbytes, iters in ((8, 2000), (1 << 16, 200), (16 << 20, 10)):
    times = {name: per_call_us(g, nbytes, iters) for name, g in groups.items()}
    if dist.get_rank() == 0:
        line = "  ".join(f"{name} {us:10.1f} us ({nbytes / us / 1e3:7.3f} GB/s algbw)"
                         for name, us in times.items())
        print(f"all_reduce {nbytes:>9} B: {line}  weft/gloo speedup {times['gloo'] / times['weft']:.2f}x")
dist.destroy_process_group()
