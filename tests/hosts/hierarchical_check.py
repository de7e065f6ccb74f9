"""Run by every rank of a job that spans hosts (tests/hosts/multi_host_test.py, case
"hierarchical"): all_reduce, reduce_scatter, all_gather and broadcast at sizes on both sides of
the planner's crossover, every result checked against numpy; then the rank's flight recorder
(weft.dump_trace) must show that the collectives the planner should run hierarchically did, and
the others did not. With WEFT_ALGO=hierarchical every one of the four runs hierarchically."""
import json
import os
import sys

import numpy as np

import weft

world = weft.init(timeout=60)
R, N = world.rank, world.size
forced = os.environ.get("WEFT_ALGO", "") == "hierarchical"
SMALL, LARGE = 1000, 300_000  # float32 elements: 4 KB and 1.2 MB, either side of 256 KiB
expected = []  # (op, hierarchical?, what), in the order issued


def inputs(rank, count, dtype):
    i = np.arange(count, dtype=np.int64)
    return ((rank * 7 + i * 13 + 3) % 17 - 8).astype(dtype)


def expect(got, want, what):
    if not np.array_equal(got, want):
        bad = int(np.flatnonzero(got != want)[0])
        sys.exit(f"rank {R}: {what}: element {bad} is {got[bad]}, want {want[bad]}")


def issued(hierarchical, what):
    expected.append((what.split()[0], hierarchical, what))


for dtype in (np.float32, np.int32):
    for count in (SMALL, LARGE):
        big = count * 4 > 256 * 1024
        data = inputs(R, count, dtype)
        want = sum(inputs(r, count, dtype) for r in range(N))
        world.all_reduce(data)
        issued(forced or big, f"all_reduce {count}")
        expect(data, want, f"all_reduce {np.dtype(dtype).name} x {count}")

        send = np.concatenate([inputs(R * N + j, count // N, dtype) for j in range(N)])
        recv = np.zeros(count // N, dtype)
        world.reduce_scatter(send, recv)
        issued(forced or big, f"reduce_scatter {count}")
        expect(recv, sum(inputs(r * N + R, count // N, dtype) for r in range(N)),
               f"reduce_scatter {np.dtype(dtype).name} x {count}")

        block = count // N
        gathered = np.zeros(block * N, dtype)
        world.all_gather(inputs(R, block, dtype), gathered)
        issued(forced or big, f"all_gather {count}")
        expect(gathered, np.concatenate([inputs(r, block, dtype) for r in range(N)]),
               f"all_gather {np.dtype(dtype).name} x {count}")

def flat_tree_crossings(root):
    """Edges of the binomial tree from `root` (v's parent: v with its lowest set bit cleared, in
    ranks relative to the root) that join different hosts; hosts hold consecutive ranks."""
    host = [r // int(os.environ["LOCAL_WORLD_SIZE"]) for r in range(N)]
    return sum(host[(v + root) % N] != host[((v & (v - 1)) + root) % N] for v in range(1, N))


hosts = N // int(os.environ["LOCAL_WORLD_SIZE"])
for root in range(N):
    data = inputs(root, LARGE, np.float32) if R == root else np.zeros(LARGE, np.float32)
    world.broadcast(data, root=root)
    issued(forced or flat_tree_crossings(root) > hosts - 1, f"broadcast from {root}")
    expect(data, inputs(root, LARGE, np.float32), f"broadcast from {root}")

weft.dump_trace("hierarchical check")
with open(os.path.join(os.environ["WEFT_TRACE_DIR"], f"weft-trace-rank{R}.json")) as f:
    dump = json.load(f)
ops = {op for op, _, _ in expected}
entries = sorted((e for g in dump["groups"] if g["name"] == "world" for e in g["entries"]
                  if e["op"] in ops), key=lambda e: e["seq"])
if [e["op"] for e in entries] != [op for op, _, _ in expected]:
    sys.exit(f"rank {R}: the recorder lists {[e['op'] for e in entries]}, "
             f"not the {len(expected)} collectives issued")
for entry, (_, hierarchical, what) in zip(entries, expected):
    if (entry["algorithm"] == "hierarchical") != hierarchical:
        sys.exit(f"rank {R}: {what} (#{entry['seq']}) ran {entry['algorithm']!r}, want "
                 f"{'hierarchical' if hierarchical else 'a flat algorithm'}")
print(f"rank {R}: hierarchical check ok: {len(expected)} collectives right, "
      f"{sum(1 for _, h, _ in expected if h)} of them hierarchical")
world.destroy()
