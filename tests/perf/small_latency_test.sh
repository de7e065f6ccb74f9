#!/usr/bin/env bash
# benchmarks/small_latency on 2 and 3 ranks, one short round: every weft column is a number, and
# Open MPI's is a number or "skipped" (when it is not installed).
set -uo pipefail
script=$1 build=$2
out=$("$script" --build "$build" --ranks 2,3 --rounds 1 --iters 50 2>&1)
status=$?
echo "$out"
[ $status -eq 0 ] || { echo "FAIL: exit $status"; exit 1; }
lines=$(echo "$out" | grep -c '^round=1 ranks=[23] ')
[ "$lines" -eq 2 ] || { echo "FAIL: $lines result lines, want 2"; exit 1; }
num='[0-9]+(\.[0-9]+)?'
bad=$(echo "$out" | grep '^round=' | grep -Ev "slots_z0=$num slots_z2=$num msgs_z0=$num msgs_z2=$num mpi=($num|skipped)$")
[ -z "$bad" ] || { echo "FAIL: malformed: $bad"; exit 1; }
echo ok
