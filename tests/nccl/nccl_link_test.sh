#!/usr/bin/env bash
# libweft never links CUDA or NCCL: neither as a dependency (ldd) nor by a symbol it defines or
# needs (nm -D). The nccl module does link both (and never the driver, libcuda), which shows that
# the checks see them where they are.
# Usage: nccl_link_test.sh LIBWEFT.so libweft-backend-nccl.so
set -uo pipefail
libweft=$1
module=$2
fail=0
cuda_libs='lib(nccl|cudart|cuda)\.so'
cuda_symbols='^(nccl|pnccl|cuda|cu[A-Z])'

if ldd "$libweft" | grep -E "$cuda_libs"; then
  echo "FAIL: $libweft depends on CUDA or NCCL (ldd above)"
  fail=1
fi
if nm -D "$libweft" | awk '{print $NF}' | grep -E "$cuda_symbols"; then
  echo "FAIL: $libweft defines or needs CUDA or NCCL symbols (nm -D above)"
  fail=1
fi
# Whole listings first: `grep -q` would stop early and SIGPIPE the writer under pipefail.
module_needed=$(readelf -d "$module" | grep NEEDED)
module_undefined=$(nm -D --undefined-only "$module" | awk '{print $NF}')
for lib in libnccl.so libcudart.so libweft.so; do
  if ! grep -q "$lib" <<<"$module_needed"; then
    echo "FAIL: $module does not link $lib: the checks above cannot be trusted"
    fail=1
  fi
done
if grep -qE '\[libcuda\.so' <<<"$module_needed"; then
  echo "FAIL: $module links the CUDA driver (libcuda.so): it must load where there is none"
  fail=1
fi
if ! grep -qE '^ncclCommInitRankConfig' <<<"$module_undefined"; then
  echo "FAIL: $module needs no NCCL symbol: the nm check above cannot be trusted"
  fail=1
fi
[ $fail = 0 ] && echo "ok: $(basename "$libweft") links no CUDA or NCCL; $(basename "$module") links libnccl and libcudart, not libcuda"
exit $fail
