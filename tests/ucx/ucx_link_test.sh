#!/usr/bin/env bash
# libweft never links UCX: neither as a dependency (ldd) nor by a UCX symbol it defines or needs
# (nm -D). The UCX module does link it, which shows that the checks see UCX where it is.
# Usage: ucx_link_test.sh LIBWEFT.so libweft-backend-ucx.so
set -uo pipefail
libweft=$1
module=$2
fail=0
ucx_libs='lib(ucp|uct|ucs|ucm)\.so'
ucx_symbols='^(ucp|uct|ucs|ucm)_'

if ldd "$libweft" | grep -E "$ucx_libs"; then
  echo "FAIL: $libweft depends on UCX (ldd above)"
  fail=1
fi
if nm -D "$libweft" | awk '{print $NF}' | grep -E "$ucx_symbols"; then
  echo "FAIL: $libweft defines or needs UCX symbols (nm -D above)"
  fail=1
fi
# Read each listing whole first: `grep -q` stops at the first match, and under pipefail the
# writer's SIGPIPE would fail the pipeline although the match was found.
module_deps=$(ldd "$module")
module_undefined=$(nm -D --undefined-only "$module" | awk '{print $NF}')
if ! grep -qE "$ucx_libs" <<<"$module_deps"; then
  echo "FAIL: $module does not depend on UCX: the ldd check above cannot be trusted"
  ldd "$module"
  fail=1
fi
if ! grep -qE "$ucx_symbols" <<<"$module_undefined"; then
  echo "FAIL: $module needs no UCX symbol: the nm check above cannot be trusted"
  fail=1
fi
if ! grep -q "libweft.so" <<<"$module_deps"; then
  echo "FAIL: $module does not link libweft (it should use libweft's classes, not copies)"
  fail=1
fi
[ $fail = 0 ] && echo "ok: $(basename "$libweft") links no UCX; $(basename "$module") does"
exit $fail
