#!/usr/bin/env python3
"""Runs weft (shm and TCP), Gloo and Open MPI (shared memory and TCP) on the same ops and sizes,
alternating systems round by round so that drift hits all equally, and prints one table of bus
bandwidth (GB/s) per size per system with the ratios weft/peer, then small-message latency.

  benchmarks/compare_peers.py --build build --ranks 2,4 --ops all_reduce,all_gather,reduce_scatter \
      --sizes 1M,16M,64M --rounds 3

Every system checks its results (wrong=N); a system that computes wrong results is reported as
WRONG, not as fast. Peers that are not built (no libgloo-dev / libopenmpi-dev) are skipped with a
line saying so. Figures are the best of the rounds (the least disturbed by other load).
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

LINE = re.compile(r"peer=(\S+) op=(\S+) ranks=(\d+) bytes=(\d+) time_us=([\d.]+) "
                  r"algbw=([\d.]+) busbw=([\d.]+) wrong=(\d+)")


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text[-1].upper() in units:
        return int(float(text[:-1]) * units[text[-1].upper()])
    return int(text)


def systems(build, ranks):
    weftrun = os.path.join(build, "tools", "weftrun")
    bench = os.path.join(build, "benchmarks", "collective_bench")
    gloo = os.path.join(build, "benchmarks", "peers", "gloo_bench")
    mpi = os.path.join(build, "benchmarks", "peers", "mpi_bench")
    out = {
        "weft-shm": ([weftrun, "--nproc-per-node", str(ranks), "--standalone", "--no-prefix", bench],
                     {"WEFT_SHM": "1"}),
        "weft-tcp": ([weftrun, "--nproc-per-node", str(ranks), "--standalone", "--no-prefix", bench],
                     {"WEFT_SHM": "0"}),
    }
    if os.path.exists(gloo):
        out["gloo-tcp"] = ([gloo, "--spawn", str(ranks)], {})
    else:
        print(f"# gloo: {gloo} not built (needs libgloo-dev): skipped")
    mpirun = shutil.which("mpirun")
    if os.path.exists(mpi) and mpirun:
        base = [mpirun, "-n", str(ranks), "--allow-run-as-root", "--oversubscribe"]
        out["mpi-shm"] = (base + ["--mca", "pml", "ob1", "--mca", "btl", "self,vader", mpi], {})
        out["mpi-tcp"] = (base + ["--mca", "pml", "ob1", "--mca", "btl", "self,tcp", mpi], {})
    else:
        print(f"# mpi: {mpi} or mpirun missing (needs libopenmpi-dev, openmpi-bin): skipped")
    return out


def run(cmd, env_extra, op, sizes, iters, warmup, timeout):
    env = dict(os.environ, **env_extra)
    args = cmd + ["--op", op, "--sizes", ",".join(str(s) for s in sizes), "--iters", str(iters),
                  "--warmup", str(warmup)]
    try:
        proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {}, "timed out"
    results = {}
    for line in proc.stdout.splitlines():
        m = LINE.search(line)
        if m:
            results[int(m.group(4))] = (float(m.group(5)), float(m.group(7)), int(m.group(8)))
    if proc.returncode == 0:
        return results, None
    tail = proc.stderr.strip().splitlines()[-1:] or [""]
    return results, f"exit {proc.returncode}: {tail[0]}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--ops", default="all_reduce,all_gather,reduce_scatter")
    ap.add_argument("--sizes", default="1M,16M,64M")
    ap.add_argument("--latency-sizes", default="8")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=600)
    a = ap.parse_args()
    sizes = [parse_size(s) for s in a.sizes.split(",") if s]
    lat_sizes = [parse_size(s) for s in a.latency_sizes.split(",") if s]
    for ranks in [int(r) for r in a.ranks.split(",")]:
        sys_cmds = systems(a.build, ranks)
        for op in a.ops.split(","):
            best = {}  # (system, bytes) -> (time, busbw, wrong)
            for _ in range(a.rounds):
                for name, (cmd, env) in sys_cmds.items():
                    res, err = run(cmd, env, op, sizes + lat_sizes, a.iters, a.warmup, a.timeout)
                    if err:
                        print(f"# {name} {op} {ranks} ranks: {err}")
                    for b, r in res.items():
                        old = best.get((name, b))
                        # A wrong result sticks: a system that was wrong once is reported so.
                        if old is None or r[2] > 0 or (old[2] == 0 and r[0] < old[0]):
                            best[(name, b)] = r
            names = list(sys_cmds)
            print(f"\n## {op}, {ranks} ranks, fp32 sum: busbw GB/s (best of {a.rounds} rounds)")
            all_bytes = sorted({b for (_, b) in best if b >= min(sizes)})
            header = "| bytes | " + " | ".join(names) + " | " + " | ".join(
                f"shm/{n}" for n in names if not n.startswith("weft")) + " | " + " | ".join(
                f"tcp/{n}" for n in names if n in ("gloo-tcp", "mpi-tcp")) + " |"
            print(header)
            print("|" + " --- |" * (header.count("|") - 1))
            for b in all_bytes:
                cells, vals = [], {}
                for n in names:
                    r = best.get((n, b))
                    if r is None:
                        cells.append("-")
                    elif r[2] > 0:
                        cells.append(f"WRONG ({r[2]})")
                    else:
                        cells.append(f"{r[1]:.2f}")
                        vals[n] = r[1]
                ratios = []
                for base in ("weft-shm", "weft-tcp"):
                    peers = [n for n in names if not n.startswith("weft")]
                    if base == "weft-tcp":
                        peers = [n for n in peers if n in ("gloo-tcp", "mpi-tcp")]
                    for n in peers:
                        if base in vals and n in vals and vals[n] > 0:
                            ratios.append(f"{vals[base] / vals[n]:.2f}x")
                        else:
                            ratios.append("-")
                print(f"| {b} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
            print(f"\n## {op}, {ranks} ranks: latency, us (best of {a.rounds} rounds)")
            for b in sorted({b for (_, b) in best if b < min(sizes)}):
                row = []
                for n in names:
                    r = best.get((n, b))
                    row.append(f"{n} " + ("-" if r is None else
                                          ("WRONG" if r[2] else f"{r[0]:.1f}")))
                print(f"- {b} bytes: " + ", ".join(row))


if __name__ == "__main__":
    main()
