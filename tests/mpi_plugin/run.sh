#!/usr/bin/env bash
# tests/mpi_plugin/run.sh WEFT_BUILD_DIR CONFORMANCE_TEST
#
# The out-of-tree plugin flow of examples/plugin-mpi, end to end, in a fresh temporary
# directory, as an outside project would go through it:
#   1. install weft from WEFT_BUILD_DIR into a stage (meson install --destdir; the build must
#      be current: meson test builds it first);
#   2. build the plugin against the staged weft through pkg-config, and install it into the
#      stage's <libdir>/weft/plugins;
#   3. check that weft loads it by name from WEFT_PLUGIN_PATH;
#   4. run the conformance suite (CONFORMANCE_TEST, from the build) on it under mpirun, on 2 and
#      on 4 ranks, against the staged libweft (LD_LIBRARY_PATH), every family but [debug];
#   5. run [debug] on 2 ranks with WEFT_DEBUG=detail (weft reads it once per process, and the
#      family runs on 1, 2, 3 or 5 ranks only).
# Exits 77 (a skip for meson) when mpirun, Open MPI's mpi.h, meson, ninja or pkg-config is
# missing.
#
# Cost, measured on the 2-core development VM (2026-12-03): 15 to 36 s in all, most of it
# compiling the plugin; the suite takes 2 to 6 s per world size. The figures of each run are
# printed at the end. WEFT_MPI_PLUGIN_TAGS overrides the Catch2 tags of step 4.
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 WEFT_BUILD_DIR CONFORMANCE_TEST" >&2
  exit 2
fi
build_dir=$(realpath "$1")
conformance=$(realpath "$2")
source_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

skip() {
  echo "SKIP: $*"
  exit 77
}
for tool in mpirun:openmpi-bin meson:meson ninja:ninja-build pkg-config:pkgconf; do
  command -v "${tool%%:*}" >/dev/null || skip "${tool%%:*} is not installed (Debian: ${tool#*:})"
done
mpi_include=$(pkg-config --variable=includedir ompi-cxx 2>/dev/null || mpicxx --showme:incdirs 2>/dev/null || true)
[[ -n "$mpi_include" && -f "${mpi_include%% *}/mpi.h" ]] ||
  skip "Open MPI's mpi.h was not found (Debian: libopenmpi-dev)"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/weft-mpi-plugin.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
step() { echo; echo "=== [$((SECONDS - start)) s] $*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }

step "1. install weft from $build_dir into $tmp/stage"
meson install -C "$build_dir" --destdir "$tmp/stage" --no-rebuild --quiet
pc=$(find "$tmp/stage" -path '*/pkgconfig/weft.pc' | head -n 1)
[[ -n "$pc" ]] || fail "meson install left no weft.pc in $tmp/stage"
libdir=$(dirname "$(dirname "$pc")")
# weft.pc is relocatable (prefix=${pcfiledir}/...): used where it was staged, unedited. The
# prefix weft was configured with is the staged prefix less the stage.
export PKG_CONFIG_PATH="$(dirname "$pc")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
stage=$(cd "$tmp/stage" && pwd -P)
libdir=$(cd "$libdir" && pwd -P)
prefix=$(cd "$(pkg-config --variable=prefix weft)" && pwd -P)
prefix=${prefix#"$stage"}
echo "weft.pc: $pc (prefix $prefix)"

step "2. build examples/plugin-mpi against the staged weft (pkg-config)"
# (Not PKG_CONFIG_SYSROOT_DIR: it would put the stage in front of every other package's paths too,
# Open MPI's ompi-cxx.pc among them, whose headers then cannot be found.)
echo "pkg-config --cflags weft: $(pkg-config --cflags weft)"
plugin_build="$tmp/plugin-build"
meson setup "$plugin_build" "$source_dir/examples/plugin-mpi" --prefix="$prefix" \
  --libdir="${libdir#"$stage$prefix/"}" >"$tmp/setup.log" 2>&1 ||
  { cat "$tmp/setup.log"; fail "meson setup of the plugin failed"; }
ninja -C "$plugin_build"
plugin="$plugin_build/libweft-backend-mpi.so"
[[ -f "$plugin" ]] || fail "no $plugin"
nm -D --defined-only "$plugin" | grep ' weftBackendPlugin_v1$' >/dev/null ||
  fail "$plugin does not export weftBackendPlugin_v1"
if readelf -d "$plugin" | grep 'NEEDED.*libweft' >/dev/null; then
  fail "$plugin links libweft; the plugin ABI is C and it should need only weft's headers"
fi
meson install -C "$plugin_build" --destdir "$tmp/stage" --quiet
[[ -f "$libdir/weft/plugins/libweft-backend-mpi.so" ]] ||
  fail "meson install did not put the plugin in <libdir>/weft/plugins ($libdir/weft/plugins)"
echo "installed: $libdir/weft/plugins/libweft-backend-mpi.so"

export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
LD_LIBRARY_PATH="$libdir" ldd "$conformance" | grep "$libdir/libweft.so" >/dev/null ||
  fail "$conformance does not pick up the staged libweft.so from LD_LIBRARY_PATH"

# mpirun: as root only with --allow-run-as-root; 4 ranks on fewer cores need --oversubscribe;
# weft's threads must float (--bind-to none). The suite's collectives time out after 30 s, so a
# hung run is a bug: `timeout` ends it.
mpi_run() {
  local ranks=$1
  shift
  timeout -k 10 1200 mpirun --allow-run-as-root --oversubscribe --bind-to none -n "$ranks" \
    -x LD_LIBRARY_PATH -x WEFT_TEST_LAUNCHER=env -x WEFT_TEST_BACKEND=mpi \
    -x WEFT_PLUGIN_PATH="$plugin_build" "$@"
}

step "3. weft loads the plugin by name from WEFT_PLUGIN_PATH"
mpi_run 1 -x WEFT_LOG=info "$conformance" '[errors]' >"$tmp/load.log" 2>&1 ||
  { cat "$tmp/load.log"; fail "the conformance suite's [errors] family failed on 1 rank"; }
grep -q "loaded backend plugin \"mpi\" from $plugin_build/libweft-backend-mpi.so" "$tmp/load.log" ||
  { cat "$tmp/load.log"; fail "no line saying the plugin \"mpi\" was loaded from $plugin_build"; }
grep "loaded backend plugin" "$tmp/load.log" | head -n 1

tags=${WEFT_MPI_PLUGIN_TAGS:-'~[debug]'}
times=()
for ranks in 2 4; do
  step "4. the conformance suite under mpirun -n $ranks, $tags"
  t0=$SECONDS
  mpi_run "$ranks" "$conformance" "$tags" || fail "the conformance suite failed on $ranks ranks"
  times+=("$ranks ranks, $tags: $((SECONDS - t0)) s")
done
step "5. the [debug] family under WEFT_DEBUG=detail, mpirun -n 2"
t0=$SECONDS
mpi_run 2 -x WEFT_DEBUG=detail "$conformance" '[debug]' ||
  fail "the conformance suite's [debug] family failed on 2 ranks"
times+=("2 ranks, [debug]: $((SECONDS - t0)) s")

step "passed"
printf '  %s\n' "${times[@]}"
