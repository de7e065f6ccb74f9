#!/usr/bin/env bash
# fsdp/, benchmarks/ and examples/ use weft's public API only (include/weft). Their own build
# targets still see the repository root (fsdp includes its headers as "fsdp/..."), so the build
# alone would not stop an include of an internal header there; this check does.
# weftrun is the one documented exception (docs/architecture.md, "Public API"): it reads the
# launchers' environments as init_process_group() does, names shared-memory segments as the
# ranks do, and words running out of descriptors as they do.
# The GPU benchmarks may include runtime/cuda_runtime.h, libweft's loader of the CUDA runtime:
# weft-perf --device cuda and benchmarks/gpu/nccl_raw allocate and copy device memory through
# it, so that neither links CUDA and both say "no usable CUDA device: ..." where there is none.
# allreduce_ceiling (not weft: a bound) copies with runtime/copy.h, weft's copy primitive, so that
# the bound is never below what the library reaches with it.
# weftrun, weft-perf (the ranks it starts itself), allreduce_ceiling and gloo_bench --spawn bind ranks to cores with
# runtime/cpu_binding.h, a launcher's helper outside libweft.
# Usage: private_includes_test.sh SOURCE_DIR
set -euo pipefail
cd "$1"
if hits=$(grep -rEn '#include "(runtime|collectives|backends|tests)/' fsdp benchmarks examples \
            tools --include='*.cc' --include='*.h' --include='*.c' |
          grep -vE '^tools/weftrun.cc:.*"runtime/launch_env.h"|^tools/weftrun_supervisor.cc:.*"runtime/(shm_names|fd_limit).h"' |
          grep -vE '^benchmarks/(weft_perf|gpu/nccl_raw).cc:.*"runtime/cuda_runtime.h"' |
          grep -vE '^benchmarks/allreduce_ceiling.cc:.*"runtime/copy.h"' |
          grep -vE '^(tools/weftrun_supervisor|benchmarks/weft_perf|benchmarks/allreduce_ceiling|benchmarks/peers/gloo_bench).cc:.*"runtime/cpu_binding.h"'); then
  echo "FAIL: internal headers included from code that may use the public API only:" >&2
  echo "$hits" >&2
  exit 1
fi
echo "PASS: fsdp/, benchmarks/, examples/ and tools/ include public headers only"
