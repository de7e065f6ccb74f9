#!/usr/bin/env python3
"""weft-train refuses bad flags and inputs with a message naming the flag, its value and what it
must be, and an exit code (2 for flags, 1 for inputs), never a signal, a bare std::bad_alloc, a
hang or a run to NaN. Flags checked before the job starts run the binary alone; the rest run on
ranks of weftrun.

  weft_train_flags_test.py WEFTRUN WEFT_TRAIN
"""
import os
import subprocess
import sys
import tempfile

# A small model, so that the runs that do start are quick.
SMALL = ["--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--vocab-size", "32",
         "--block-size", "8", "--batch-size", "4"]

failures = []


def check(cmd, code, *wanted, timeout=60):
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        failures.append(f"{' '.join(cmd)}: still running after {timeout} s")
        return
    out = proc.stdout + proc.stderr
    if proc.returncode != code:
        failures.append(f"{' '.join(cmd)}: exit code {proc.returncode}, want {code}\n{out}")
        return
    for text in wanted:
        if text not in out:
            failures.append(f"{' '.join(cmd)}: no {text!r} in:\n{out}")


def main():
    weftrun, binary = sys.argv[1:3]

    def alone(*flags):
        return [binary, *flags]

    def ranks(n, *flags):
        return [weftrun, "--nproc-per-node", str(n), "--standalone", "--no-prefix", binary, *flags]

    # Integers: range, syntax; every one named with its value and range.
    for flag, value in [("--n-embd", "0"), ("--vocab-size", "0"), ("--block-size", "0"),
                        ("--n-layer", "0"), ("--n-head", "0"), ("--batch-size", "0"),
                        ("--micro-batches", "0"), ("--steps", "-1"), ("--steps", "1e20"),
                        ("--batch-size", "99999999999999999999"),
                        ("--synthetic-tokens", "-5")]:
        check(alone(flag, value), 2, f"weft-train: {flag} {value} is out of range: it must be an "
              "integer in [")
    check(alone("--batch-size", "2.5"), 2,
          'weft-train: --batch-size wants an integer in [1, 2147483647], not "2.5"')
    check(alone("--seed", "-3"), 2, 'weft-train: --seed wants an integer in [0, ')
    check(alone("--mesh", "0x2"), 2,
          "weft-train: --mesh 0x2: R 0 is out of range: it must be an integer in [1, ")
    check(alone("--mesh", "2x"), 2, 'weft-train: --mesh 2x: S wants an integer')
    check(alone("--mesh", "4"), 2, 'weft-train: --mesh wants RxS, e.g. 2x2, not "4"')
    # Reals: finite, and in the optimizer's range.
    for flag, value in [("--lr", "nan"), ("--lr", "inf"), ("--eps", "nan"), ("--beta1", "-inf"),
                        ("--lr", "1e999"), ("--weight-decay", "nan"), ("--momentum", "nan")]:
        check(alone(flag, value), 2, f"weft-train: {flag} {value} is not a finite number")
    check(alone("--eps", "0"), 2, "weft-train: --eps 0 is out of range: it must be > 0")
    check(alone("--lr", "-1"), 2, "weft-train: --lr -1 is out of range: it must be >= 0")
    check(alone("--beta2", "1"), 2, "weft-train: --beta2 1 is out of range: it must be in [0, 1)")
    check(alone("--weight-decay", "-0.1"), 2, "--weight-decay -0.1 is out of range")
    check(alone("--momentum", "-1"), 2, "--momentum -1 is out of range: it must be >= 0")
    check(alone("--lr", "fast"), 2, 'weft-train: --lr wants a number, not "fast"')
    # Shapes that cannot work.
    check(alone("--n-head", "3"), 2, "weft-train: --n-head 3 does not divide --n-embd 32")
    check(alone("--synthetic-tokens", "10"), 2,
          "weft-train: --synthetic-tokens 10 is too few for --block-size 16")
    check(alone("--optim", "adam"), 2, 'weft-train: --optim is adamw or sgd, not "adam"')
    # Too big to allocate: refused up front with the bytes it needs, not std::bad_alloc.
    check(alone("--n-embd", "1000000", "--n-head", "1000"), 2,
          "weft-train: the model does not fit in memory: it needs about 192001376000000 bytes")

    # Checks that need the job's size, on every rank alike.
    check(ranks(1, "--block-size", "100000"), 2,
          "weft-train: the model does not fit in memory", "activations of 8 sequence(s) of "
          "100000 tokens")
    check(ranks(2, *SMALL, "--batch-size", "3"), 2,
          "weft-train: --batch-size 3 does not split evenly over the 2 ranks")
    check(ranks(2, *SMALL, "--micro-batches", "3"), 2,
          "weft-train: --micro-batches 3 does not divide the 2 sequence(s) each rank trains on")
    check(ranks(2, *SMALL, "--mesh", "2x2"), 2, "weft-train: --mesh 2x2 has 4 ranks but the job "
          "has 2")
    # Training that diverges stops, saying so.
    check(ranks(1, *SMALL, "--lr", "1e30", "--steps", "5"), 1,
          "training diverged (--lr 1e+30, --optim adamw); stopping")

    # Inputs that are not regular files: refused, never opened (a FIFO would block).
    with tempfile.TemporaryDirectory() as tmp:
        fifo = os.path.join(tmp, "tokens.fifo")
        os.mkfifo(fifo)
        check(ranks(1, *SMALL, "--steps", "1", "--data", fifo), 1,
              f'token file "{fifo}": InvalidArgument: a FIFO, not a regular file')
        check(ranks(1, *SMALL, "--steps", "1", "--init", fifo), 1,
              f'safetensors "{fifo}": InvalidArgument: a FIFO, not a regular file')
        check(ranks(1, *SMALL, "--steps", "1", "--data", tmp), 1,
              "a directory, not a regular file")
        ckpt = os.path.join(tmp, "ckpt")
        os.mkdir(ckpt)
        os.mkfifo(os.path.join(ckpt, "metadata.safetensors"))
        check(ranks(1, *SMALL, "--steps", "1", "--load", ckpt), 1,
              "metadata.safetensors\": InvalidArgument: a FIFO, not a regular file")

    if failures:
        print("\n\n".join(failures))
        raise SystemExit(f"FAILED: {len(failures)} check(s)")
    print("weft-train flags: ok")


if __name__ == "__main__":
    main()
