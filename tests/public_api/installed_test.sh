#!/usr/bin/env bash
# Installs weft into a temporary directory (meson install --destdir), then compiles and runs
# installed_program.cc with nothing but what pkg-config says about the installed weft: no source
# tree, no build tree on the include path. Fails if a public header is not installed, includes
# something that is not, or the flags and libraries in weft.pc do not suffice.
# Usage: installed_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build_dir=$1
source_dir=$2
command -v pkg-config >/dev/null || { echo "SKIP: no pkg-config"; exit 77; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/weft-installed.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

meson install -C "$build_dir" --destdir "$tmp/stage" --no-rebuild --quiet
pc=$(find "$tmp/stage" -path '*/pkgconfig/weft.pc' | head -n 1)
[[ -n "$pc" ]] || fail "meson install left no weft.pc in $tmp/stage"
libdir=$(dirname "$(dirname "$pc")")
prefix=$(sed -n 's/^prefix=//p' "$pc")
# weft.pc says prefix=$prefix; relocate it to the stage, as if installed with that prefix.
mkdir -p "$tmp/pkgconfig"
sed "s|^prefix=.*|prefix=$tmp/stage$prefix|" "$pc" >"$tmp/pkgconfig/weft.pc"
export PKG_CONFIG_PATH="$tmp/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
cflags=$(pkg-config --cflags weft)
libs=$(pkg-config --libs weft)
echo "pkg-config --cflags weft: $cflags"
echo "pkg-config --libs weft: $libs"
case " $cflags " in
  *"$source_dir"*|*"$build_dir"*) fail "weft.pc points into the source or build tree: $cflags" ;;
esac

# A sanitizer build's libweft needs its runtime loaded first: build the program with the same
# sanitizer, as a user of such a build would.
sanitize=""
ldd "$libdir/libweft.so" >"$tmp/ldd-lib.txt"
grep -q libasan "$tmp/ldd-lib.txt" && sanitize="-fsanitize=address,undefined"
grep -q libtsan "$tmp/ldd-lib.txt" && sanitize="-fsanitize=thread"
# shellcheck disable=SC2086  # the flags are words
"${CXX:-c++}" -std=c++20 -Wall -Wextra -Werror $sanitize -o "$tmp/program" \
  "$source_dir/tests/public_api/installed_program.cc" $cflags $libs ||
  fail "installed_program.cc does not build against the installed weft"
export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Through a file: `ldd | grep -q` fails under pipefail when grep stops reading early.
ldd "$tmp/program" >"$tmp/ldd.txt"
grep -q "$libdir/libweft.so" "$tmp/ldd.txt" || fail "the program would not load the staged libweft"
"$tmp/program"
echo "PASS"
