#!/usr/bin/env bash
# Installs weft into a temporary directory (meson install --destdir), then, as a user of that
# install would, with nothing but what the staged weft.pc says (PKG_CONFIG_PATH naming the staged
# pkgconfig directory only; no source or build tree on any path):
#  - builds installed_program.cc (C++) and installed_program.c (C, by the C compiler), and the
#    example of tensor.h's header comment (pasted from the installed header into
#    tensor_example.cc.in), with the rpath the docs show (docs/c-api.md), and runs each with no
#    environment at all (env -i: no LD_LIBRARY_PATH);
#  - checks that every installed program linking libweft loads the staged one with no
#    environment (install_rpath $ORIGIN/../LIBDIR), and runs the installed weft-conformance so:
#    --help, then its p2p family against the forwarding test plugin (by path, PLUGIN_DIR).
# weft.pc must be relocatable (prefix=${pcfiledir}/...): it is used where it was staged, unedited.
# Usage: installed_test.sh BUILD_DIR SOURCE_DIR [PLUGIN_DIR]
set -euo pipefail
build_dir=$1
source_dir=$2
plugin_dir=${3:-}
command -v pkg-config >/dev/null || { echo "SKIP: no pkg-config"; exit 77; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/weft-installed.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

meson install -C "$build_dir" --destdir "$tmp/stage" --no-rebuild --quiet
pc=$(find "$tmp/stage" -path '*/pkgconfig/weft.pc' | head -n 1)
[[ -n "$pc" ]] || fail "meson install left no weft.pc in $tmp/stage"
grep -q '^prefix=${pcfiledir}' "$pc" || fail "weft.pc is not relocatable: $(grep '^prefix=' "$pc")"
export PKG_CONFIG_PATH
PKG_CONFIG_PATH=$(dirname "$pc")
cflags=$(pkg-config --cflags weft)
libs=$(pkg-config --libs weft)
libdir=$(pkg-config --variable=libdir weft)
echo "pkg-config --cflags weft: $cflags"
echo "pkg-config --libs weft: $libs"
case " $cflags $libs " in
  *"$source_dir"*|*"$build_dir"*) fail "weft.pc points into the source or build tree" ;;
esac
[[ -f "$libdir/libweft.so" ]] || fail "pkg-config's libdir $libdir holds no libweft.so"
[[ "$(cd "$libdir" && pwd -P)" == "$(cd "$tmp/stage" && pwd -P)/"* ]] ||
  fail "pkg-config's libdir $libdir is not in the stage"
rpath="-Wl,-rpath,$libdir"  # as docs/c-api.md shows, for an install outside the linker's path

# A sanitizer build's libweft needs its runtime loaded first: build the programs with the same
# sanitizer, as a user of such a build would.
sanitize=""
ldd "$libdir/libweft.so" >"$tmp/ldd-lib.txt"
grep -q libasan "$tmp/ldd-lib.txt" && sanitize="-fsanitize=address,undefined"
grep -q libtsan "$tmp/ldd-lib.txt" && sanitize="-fsanitize=thread"

# Runs a program with no environment at all, and checks that it loaded the staged libweft.
run_bare() {
  local program=$1
  shift
  env -i /usr/bin/ldd "$program" >"$tmp/ldd.txt"  # through a file: grep -q under pipefail
  grep -q "=> $tmp/stage/.*libweft.so" "$tmp/ldd.txt" ||
    fail "$program would not load the staged libweft with no environment: $(cat "$tmp/ldd.txt")"
  env -i "$program" "$@" || fail "$program $* failed with no environment"
}

# shellcheck disable=SC2086  # the flags are words
"${CXX:-c++}" -std=c++20 -Wall -Wextra -Werror $sanitize -o "$tmp/program" \
  "$source_dir/tests/public_api/installed_program.cc" $cflags $libs $rpath ||
  fail "installed_program.cc does not build against the installed weft"
run_bare "$tmp/program"

# shellcheck disable=SC2086
"${CC:-cc}" -std=c99 -Wall -Wextra -Werror $sanitize -o "$tmp/program_c" \
  "$source_dir/tests/public_api/installed_program.c" $cflags $libs $rpath ||
  fail "installed_program.c does not build with the C compiler against the installed weft"
run_bare "$tmp/program_c" "$tmp/store"

# tensor.h's example: the comment lines indented by three spaces, from the installed header.
tensor_h=$(find "$tmp/stage" -path '*/include/weft/tensor.h' | head -n 1)
sed -n 's|^//   ||p' "$tensor_h" >"$tmp/example.txt"
[[ -s "$tmp/example.txt" ]] || fail "no example found in $tensor_h"
python3 -c 'import sys; t = open(sys.argv[1]).read(); e = open(sys.argv[2]).read()
sys.stdout.write(t.replace("@EXAMPLE@\n", e))' \
  "$source_dir/tests/public_api/tensor_example.cc.in" "$tmp/example.txt" >"$tmp/tensor_example.cc"
# shellcheck disable=SC2086
"${CXX:-c++}" -std=c++20 -Wall -Wextra -Werror $sanitize -o "$tmp/tensor_example" \
  "$tmp/tensor_example.cc" $cflags $libs $rpath ||
  fail "the example in tensor.h's comment does not compile:$(printf '\n%s' "$(cat "$tmp/example.txt")")"
run_bare "$tmp/tensor_example"

# Installed programs that link libweft find it with no environment (install_rpath).
bindir=$(dirname "$(find "$tmp/stage" -path '*/bin/weftrun' | head -n 1)")
for program in "$bindir"/*; do
  /usr/bin/ldd "$program" >"$tmp/ldd.txt" 2>&1 || continue
  grep -q 'libweft.so' "$tmp/ldd.txt" || continue
  env -i /usr/bin/ldd "$program" >"$tmp/ldd.txt"
  grep -q "=> $tmp/stage/.*libweft.so" "$tmp/ldd.txt" ||
    fail "installed $(basename "$program") does not find the staged libweft with no environment"
  echo "installed $(basename "$program") finds libweft by its rpath"
done
if [[ -x "$bindir/weft-conformance" ]]; then
  run_bare "$bindir/weft-conformance" --help >"$tmp/help.txt"
  grep -q -- '--only' "$tmp/help.txt" || fail "weft-conformance --help does not mention --only"
  if [[ -n "$plugin_dir" ]]; then
    run_bare "$bindir/weft-conformance" --plugin "$plugin_dir/libweft-backend-forward.so" \
      --only p2p --world-sizes 2 >"$tmp/conformance.txt" 2>&1 ||
      fail "installed weft-conformance --only p2p: $(cat "$tmp/conformance.txt")"
    grep -Eq '^p2p +pass ' "$tmp/conformance.txt" ||
      fail "installed weft-conformance printed no passing p2p row: $(cat "$tmp/conformance.txt")"
    echo "installed weft-conformance --only p2p passes against the forwarding plugin"
  fi
fi
echo "PASS"
