#!/usr/bin/env python3
"""FSDP benchmark: weft-train on 1, 2 and 4 local ranks, with and without prefetch, fp32 and bf16
gathers, and with communication replaced by local copies (--no-comm-benchmark) to measure the
communication a step leaves exposed. Prints a Markdown table.

  benchmarks/fsdp_bench.py --build build [--ranks 1,2,4] [--steps 8] [-- extra weft-train flags]

Per configuration: the mean step time and tokens/s over the steps after the first two (warm-up),
rank 0's peak bytes per kind in the last step, and for the runs with communication, the exposed
communication: step time minus the same configuration's step time without communication. The
hidden share compares that with prefetch on and off: 1 - exposed(prefetch) / exposed(no prefetch).
"""
import argparse
import json
import os
import subprocess
import sys

MODEL = ["--n-layer", "4", "--n-embd", "128", "--n-head", "4", "--vocab-size", "256",
         "--block-size", "64", "--batch-size", "16", "--lr", "1e-3"]


def run(build, ranks, steps, flags):
    cmd = [os.path.join(build, "tools", "weftrun"), "--nproc-per-node", str(ranks),
           "--standalone", "--no-prefix", os.path.join(build, "fsdp", "weft-train"), *MODEL,
           "--steps", str(steps), *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr}")
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    timed = rows[2:] or rows
    tokens = 16 * 64
    step_ms = sum(tokens / r["tokens_per_s"] for r in timed) / len(timed) * 1000
    return {"step_ms": step_ms, "tokens_per_s": tokens / step_ms * 1000,
            "peak": rows[-1]["peak_bytes"], "cmd": " ".join(cmd)}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    configs = [("fp32, prefetch", []), ("bf16 gathers, prefetch", ["--mp", "bf16"]),
               ("fp32, no prefetch", ["--no-prefetch"])]
    kib = lambda b: f"{b / 1024:.0f}"
    print("| ranks | configuration | step (ms) | tokens/s | exposed comm (ms) | params | grads | "
          "optimizer | activations | comm | total (KiB, rank 0 peak) |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for ranks in [int(r) for r in a.ranks.split(",")]:
        exposed = {}
        for name, flags in configs:
            with_comm = run(a.build, ranks, a.steps, flags + a.extra)
            alone = run(a.build, ranks, a.steps, flags + a.extra + ["--no-comm-benchmark"])
            exposed[name] = with_comm["step_ms"] - alone["step_ms"]
            p = with_comm["peak"]
            print(f"| {ranks} | {name} | {with_comm['step_ms']:.1f} | "
                  f"{with_comm['tokens_per_s']:.0f} | {exposed[name]:.1f} | {kib(p['params'])} | "
                  f"{kib(p['grads'])} | {kib(p['optimizer'])} | {kib(p['activations'])} | "
                  f"{kib(p['comm'])} | {kib(p['total'])} |", flush=True)
        on, off = exposed["fp32, prefetch"], exposed["fp32, no prefetch"]
        if ranks > 1 and off > 0:
            print(f"| {ranks} | hidden by prefetch: 1 - {on:.1f} / {off:.1f} = "
                  f"{1 - on / off:.0%} | | | | | | | | | |", flush=True)


if __name__ == "__main__":
    main()
