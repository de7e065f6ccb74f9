#!/usr/bin/env python3
"""weft-train end to end: the same losses on 1, 2 and 4 ranks (FSDP and HSDP 2x2, with
micro-batches), a checkpoint saved on 4 ranks resumed on 2, and an export whose tensors carry
nanoGPT's names. Checks the JSON lines weft-train prints.

  weft_train_test.py WEFTRUN WEFT_TRAIN
"""
import json
import os
import subprocess
import sys
import tempfile

FLAGS = ["--n-layer", "2", "--n-embd", "16", "--n-head", "2", "--vocab-size", "32",
         "--block-size", "8", "--batch-size", "8", "--lr", "3e-3"]


def train(weftrun, binary, ranks, *extra):
    cmd = [weftrun, "--nproc-per-node", str(ranks), "--standalone", "--no-prefix", binary,
           *FLAGS, *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    if proc.returncode != 0:
        raise SystemExit(f"FAILED: {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}")
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    for line in lines:
        kinds = line["peak_bytes"]
        assert set(kinds) >= {"params", "grads", "optimizer", "activations", "comm", "host"}, line
        assert line["tokens_per_s"] > 0, line
    return lines


def same(got, want, what):
    assert [g["step"] for g in got] == [w["step"] for w in want], what
    for g, w in zip(got, want):
        rel = abs(g["loss"] - w["loss"]) / abs(w["loss"])
        if rel > 1e-5:
            raise SystemExit(f"FAILED: {what}: step {g['step']} loss {g['loss']} vs {w['loss']}")


def main():
    weftrun, binary = sys.argv[1:3]
    one = train(weftrun, binary, 1, "--steps", "8")
    assert one[-1]["loss"] < one[0]["loss"], "it learns"
    same(train(weftrun, binary, 2, "--steps", "8", "--micro-batches", "2"), one, "2 ranks x 2")
    same(train(weftrun, binary, 4, "--steps", "8", "--mesh", "2x2"), one, "HSDP 2x2")
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = os.path.join(tmp, "ckpt")
        same(train(weftrun, binary, 4, "--steps", "4", "--save", ckpt), one[:4], "4 ranks, saved")
        export = os.path.join(tmp, "final.safetensors")
        same(train(weftrun, binary, 2, "--steps", "4", "--load", ckpt, "--export", export),
             one[4:], "resumed on 2 ranks")
        with open(export, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
        names = [k for k in header if k != "__metadata__"]
        assert "transformer.h.1.attn.c_attn.weight" in names and "lm_head.weight" in names, names
        assert header["lm_head.weight"]["shape"] == [32, 16], header["lm_head.weight"]
    print("weft-train: ok")


if __name__ == "__main__":
    main()
