#!/usr/bin/env python3
"""FSDP benchmark: weft-train on 1, 2 and 4 local ranks, with and without prefetch, fp32 and bf16
gathers, each with symmetric buffers (the default) and with ordinary ones (--no-symmetric).
Prints a Markdown table.

  benchmarks/fsdp_bench.py --build build [--ranks 1,2,4] [--steps 8] [--no-comm-difference]
                           [-- extra weft-train flags]

Per configuration, over the steps after the first two (warm-up), from rank 0's JSON lines:
- step: the median step time (ms), with min..max over the timed steps, and tokens/s at the median;
- exposed comm: the median over the timed steps of the time rank 0's training thread was blocked
  waiting for FSDP's collectives in the step (weft-train's "exposed_comm_ms",
  FsdpStats::exposed_comm_ns), with min..max, so the noise shows beside it, and the same for its
  all-gather part (the rest is the reduce-scatters the end of backward waits for);
- rank 0's peak bytes per kind in the last step.
"hidden by prefetch" compares the medians: 1 - exposed(prefetch) / exposed(no prefetch).

--no-comm-difference adds the old estimate, beside it and labelled: the median step time minus
that of the same configuration with communication replaced by local copies (--no-comm-benchmark).
It is a difference of two noisy runs (it came out negative at 1 rank), so it is not the measure.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

MODEL = ["--n-layer", "4", "--n-embd", "128", "--n-head", "4", "--vocab-size", "256",
         "--block-size", "64", "--batch-size", "16", "--lr", "1e-3"]
TOKENS = 16 * 64  # --batch-size x --block-size


def run(build, ranks, steps, flags):
    cmd = [os.path.join(build, "tools", "weftrun"), "--nproc-per-node", str(ranks),
           "--standalone", "--no-prefix", os.path.join(build, "fsdp", "weft-train"), *MODEL,
           "--steps", str(steps), *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr}")
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    timed = rows[2:] or rows
    step_ms = [TOKENS / r["tokens_per_s"] * 1000 for r in timed]
    exposed = [r["exposed_comm_ms"] for r in timed]
    gathers = [r["exposed_all_gather_ms"] for r in timed]
    return {"step_ms": step_ms, "exposed_ms": exposed, "gather_ms": gathers,
            "peak": rows[-1]["peak_bytes"],
            "cmd": " ".join(cmd)}


def spread(values):
    return f"{statistics.median(values):.1f} ({min(values):.1f}..{max(values):.1f})"


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--no-comm-difference", action="store_true",
                    help="also run each configuration without communication and print the step "
                         "time difference (the old, noisy estimate)")
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    configs = [("fp32, prefetch", []), ("bf16 gathers, prefetch", ["--mp", "bf16"]),
               ("fp32, no prefetch", ["--no-prefetch"])]
    buffers = [("symmetric", []), ("ordinary", ["--no-symmetric"])]
    kib = lambda b: f"{b / 1024:.0f}"
    diff_head, diff_rule = ("step - no-comm step (ms, noisy) | ", "---: | ") \
        if a.no_comm_difference else ("", "")
    print(f"| ranks | configuration | buffers | step (ms): median (min..max) | tokens/s | "
          f"exposed comm (ms): median (min..max) | of which all-gathers | {diff_head}params | grads | optimizer | "
          f"activations | comm | total (KiB, rank 0 peak) |")
    print(f"| ---: | --- | --- | ---: | ---: | ---: | ---: | {diff_rule}---: | ---: | ---: | ---: | ---: "
          f"| ---: |")
    for ranks in [int(r) for r in a.ranks.split(",")]:
        exposed = {}
        for name, flags in configs:
            for kind, kind_flags in buffers:
                r = run(a.build, ranks, a.steps, flags + kind_flags + a.extra)
                exposed[(name, kind)] = statistics.median(r["exposed_ms"])
                step = statistics.median(r["step_ms"])
                diff = ""
                if a.no_comm_difference:
                    alone = run(a.build, ranks, a.steps,
                                flags + kind_flags + a.extra + ["--no-comm-benchmark"])
                    diff = f"{step - statistics.median(alone['step_ms']):.1f} | "
                p = r["peak"]
                print(f"| {ranks} | {name} | {kind} | {spread(r['step_ms'])} | "
                      f"{TOKENS / step * 1000:.0f} | {spread(r['exposed_ms'])} | {spread(r['gather_ms'])} | {diff}"
                      f"{kib(p['params'])} | {kib(p['grads'])} | {kib(p['optimizer'])} | "
                      f"{kib(p['activations'])} | {kib(p['comm'])} | {kib(p['total'])} |",
                      flush=True)
        if ranks > 1:
            for kind, _ in buffers:
                on, off = exposed[("fp32, prefetch", kind)], exposed[("fp32, no prefetch", kind)]
                ratio = f"{1 - on / off:.0%}" if off > 0 else "n/a (nothing exposed)"
                print(f"| {ranks} | hidden by prefetch ({kind}, medians): 1 - {on:.1f} / {off:.1f} "
                      f"= {ratio} | | | | | | | | | | | |", flush=True)


if __name__ == "__main__":
    main()
