#!/usr/bin/env bash
# The UCX backend's single copy (WEFT_UCX_SINGLE_COPY, docs/ucx.md): on two ranks of this host,
# an all_gather's messages are read straight from the peer's memory and an all_reduce's reduced
# ones come in pieces, both with correct results (weft-perf -c 1 checks every element); UCX_TLS
# without cross-memory attach turns it off; a bad value is refused, naming the variable.
# Usage: ucx_single_copy_test.sh WEFT-PERF UCX-MODULE-DIR
set -uo pipefail
perf=$1
export WEFT_PLUGIN_PATH=$2
fail=0

# Runs weft-perf OP on 2 ranks with WEFT_LOG=debug, host memory off (it would take all_gather and
# all_reduce off the messages); prints its output.
run() {
  local op=$1
  shift
  env WEFT_LOG=debug WEFT_UCX_HOST_MEMORY=0 "$@" "$perf" "$op" --backend ucx -g 2 -b 256K -e 1M -f 4 -n 2 -w 1 -c 1 2>&1
}
# The sum over ranks of the Nth number in the log's single-copy counts.
count() {
  awk -v n="$2" '/messages read by single copy/ {
      for (i = 1; i <= NF; ++i) if ($i == "messages") { reads += $(i - 1) }
      for (i = 1; i <= NF; ++i) if ($i == "received") { pieces += $(i - 1) }
    } END { print (n == 1 ? reads : pieces) + 0 }' <<<"$1"
}
# weft-perf's #wrong columns are 0 on every row, and there are rows.
results_ok() {
  awk '/^ +[0-9]/ { rows++; if ($9 != 0 || $13 != 0) bad++ } END { exit !(rows > 0 && bad == 0) }' <<<"$1"
}

out=$(run all_gather WEFT_UCX_SINGLE_COPY=65536)
if ! results_ok "$out" || ! grep -q "single copy from \[1,\]" <<<"$out" ||
  [ "$(count "$out" 1)" -eq 0 ]; then
  echo "FAIL: all_gather with WEFT_UCX_SINGLE_COPY=65536 read nothing by single copy, or wrongly:"
  echo "$out"
  fail=1
fi
out=$(run all_reduce WEFT_UCX_SINGLE_COPY=65536)
if ! results_ok "$out" || [ "$(count "$out" 2)" -eq 0 ]; then
  echo "FAIL: all_reduce with WEFT_UCX_SINGLE_COPY=65536 asked for no pieces, or summed wrongly:"
  echo "$out"
  fail=1
fi
out=$(run all_gather WEFT_UCX_SINGLE_COPY=65536 UCX_TLS=tcp)
if ! results_ok "$out" || grep -q "messages read by single copy" <<<"$out"; then
  echo "FAIL: UCX_TLS=tcp should rule single copy out:"
  echo "$out"
  fail=1
fi
out=$(run all_gather)
if ! results_ok "$out" || grep -q "messages read by single copy" <<<"$out"; then
  echo "FAIL: single copy should be off by default:"
  echo "$out"
  fail=1
fi
out=$(run all_gather WEFT_UCX_SINGLE_COPY=lots)
if ! grep -q 'WEFT_UCX_SINGLE_COPY="lots" is not valid' <<<"$out"; then
  echo "FAIL: WEFT_UCX_SINGLE_COPY=lots should be refused, naming the variable:"
  echo "$out"
  fail=1
fi
[ "$fail" -eq 0 ] && echo "ok: single copy reads, declines for reductions, and is off where it should be"
exit "$fail"
