#!/usr/bin/env bash
# weft-conformance as a plugin author runs it, against the forwarding test plugin: --only by path,
# --unsupported=report turning a refused operation (FORWARD_UNSUPPORTED) into a table row, the
# same refusal failing without it, and the usage errors, each with its text.
# Usage: tool_test.sh WEFT_CONFORMANCE PLUGIN_DIR
set -euo pipefail
tool=$1
plugin_dir=$2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/weft-conformance-tool.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# Runs the tool with the given arguments; its output in $tmp/out, its status in $status.
run() {
  status=0
  "$tool" "$@" >"$tmp/out" 2>&1 || status=$?
}
expect_row() {  # family result [detail]
  grep -Eq "^$1 +$2 +[0-9.]+ +${3:-}" "$tmp/out" ||
    fail "no table row \"$1 $2 ${3:-}\" in:$(printf '\n%s' "$(cat "$tmp/out")")"
}

# 1. --only, the plugin by path: two families run, pass, and nothing else runs.
run --plugin "$plugin_dir/libweft-backend-forward.so" --only all_reduce,p2p --world-sizes 1,2,3
[[ $status == 0 ]] || fail "--only all_reduce,p2p exited $status:$(printf '\n%s' "$(cat "$tmp/out")")"
expect_row all_reduce pass
expect_row p2p pass
[[ $(grep -Ec '^[a-z0-9_]+ +(pass|FAIL|unsupported) ' "$tmp/out") == 2 ]] ||
  fail "--only all_reduce,p2p ran other families: $(cat "$tmp/out")"
echo "ok: --only all_reduce,p2p against the forwarding plugin by path"

# 2. A partial plugin under --unsupported=report: a table row, not a failure. By name, --skip.
export WEFT_PLUGIN_PATH=$plugin_dir
FORWARD_UNSUPPORTED=all_to_all run --plugin forward --unsupported=report --world-sizes 2 \
  --skip all_reduce,reduce,all_gather,reduce_scatter,gather_scatter,p2p,async,algorithms,debug,errors
[[ $status == 0 ]] || fail "--unsupported=report exited $status:$(printf '\n%s' "$(cat "$tmp/out")")"
expect_row all_to_all unsupported "world sizes 2: .*all_to_all is not implemented \(FORWARD_UNSUPPORTED\)"
expect_row broadcast pass
echo "ok: --unsupported=report lists all_to_all as unsupported"

# 3. The same refusal without report mode fails the family.
FORWARD_UNSUPPORTED=all_to_all run --plugin forward --only all_to_all --world-sizes 2
[[ $status == 1 ]] || fail "an unsupported all_to_all without report mode exited $status"
expect_row all_to_all FAIL
grep -q "all_to_all is not implemented (FORWARD_UNSUPPORTED)" "$tmp/out" ||
  fail "the failure does not carry the plugin's message: $(cat "$tmp/out")"
echo "ok: without report mode, Unsupported fails the family"

# 4. Usage errors: said once, exit 2.
run --only nonesuch
[[ $status == 2 ]] || fail "--only nonesuch exited $status"
grep -q 'no family "nonesuch"; the families are: algorithms, all_gather' "$tmp/out" ||
  fail "--only nonesuch: $(cat "$tmp/out")"
run --plugin nonesuch
[[ $status == 2 ]] || fail "--plugin nonesuch exited $status"
grep -q 'weft-conformance: backend nonesuch: .*unknown backend "nonesuch"' "$tmp/out" ||
  fail "--plugin nonesuch: $(cat "$tmp/out")"
run --unsupported=maybe
[[ $status == 2 ]] || fail "--unsupported=maybe exited $status"
grep -q -- '--unsupported=maybe: expected fail or report' "$tmp/out" || fail "$(cat "$tmp/out")"
echo "ok: usage errors"
echo "PASS"
