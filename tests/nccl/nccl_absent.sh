#!/usr/bin/env bash
# Registered in place of the nccl tests when meson found no CUDA or NCCL: a skip that says so.
echo "skipped: CUDA or NCCL was not found in nccl_home, so the nccl backend was not built (meson -Dnccl_home=...)"
exit 77
