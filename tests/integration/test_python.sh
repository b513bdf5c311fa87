#!/bin/bash
# test_python — the Python binding (client/python): `pip install` of the
# package from the source tree into a temporary virtual environment
# (offline, no build isolation: Debian's setuptools), then its pytest suite
# (client/python/tests) run from client/python by that environment's
# interpreter against real kvshared daemons of this build: the Client's
# calls and errors, batches, numpy views read back byte for byte by a
# second client, DLPack, tiers and swap, a cuda pool through the stand-in
# driver, int8/fp8 views, scales and dequantizing against an independent
# decode, the toy engine example, kvshare.torch (writes, decode and
# chunked prefill on every pool dtype against float64 attention, refusals,
# the per-step batch helper; skipped, saying so, without PyTorch: Debian's
# python3-torch, which the venv sees through --system-site-packages);
# every daemon checked for leaks and stopped with SIGTERM.  Also:
#   - nothing is written into client/python, by pip or by pytest (every
#     path under it is listed before and after);
#   - pytest run from client/python with neither KVS_BUILD nor KVS_LIBRARY
#     finds the repository's build/ (plain build only);
#   - the route of a fresh venv with nothing but pip (a Python that is not
#     Debian's: $KVS_PY_FRESH, else a python3 on PATH other than
#     /usr/bin/python3, else Debian's without its site packages): `pip
#     install client/python` with build isolation, which fetches setuptools
#     from the package index; skipped, saying so, when the index is not
#     reachable (KVS_TEST_OFFLINE=1 skips it too).
#
# Under the sanitizer build, python loads an ASan+UBSan libkvshare: the
# runtimes are preloaded (LD_PRELOAD) with leak detection off for python
# (the interpreter's own allocations are not leaks); the daemons and the
# CLI the tests start get the environment they would have had without it.
set -u
build=${KVS_BUILD:-build}
build=$(cd "$build" && pwd) || { echo "FAIL: no build folder"; exit 1; }
root=$(cd "$(dirname "$0")/../.." && pwd)
py=${KVS_PYTHON:-/usr/bin/python3}
fail() { echo "FAIL: $*" >&2; exit 1; }

for f in libkvshare.so.0 kvshared kvshare; do
  [ -e "$build/$f" ] || fail "$build/$f not built"
done
[ -x "$py" ] || { echo "SKIP: no $py"; exit 77; }
"$py" -c 'import numpy, pytest' 2>/dev/null ||
  { echo "SKIP: $py lacks numpy or pytest (python3-numpy, python3-pytest)"; exit 77; }

dir=$(mktemp -d "${TMPDIR:-/tmp}/kvs-python-XXXXXX")
trap 'rm -rf "$dir"' EXIT
src=$root/client/python
# Every path under client/python (pip and pytest must add none).
tree() { (cd "$src" && find . | LC_ALL=C sort); }
tree >"$dir/tree.before"
tree_clean() { # WHAT
  tree >"$dir/tree.after"
  diff "$dir/tree.before" "$dir/tree.after" >"$dir/tree.diff" ||
    { cat "$dir/tree.diff"; fail "$1 wrote into client/python"; }
}

# ---- install from the source tree (pip builds in it since 21.3; setup.py
# keeps setuptools' build/ and egg-info out of it).
if "$py" -m venv --system-site-packages "$dir/venv" >"$dir/venv.log" 2>&1; then
  "$dir/venv/bin/python" -m pip install --no-build-isolation --no-index \
    --disable-pip-version-check "$src" >"$dir/pip.log" 2>&1 ||
    { cat "$dir/pip.log"; fail "pip install into a venv"; }
  run_py=$dir/venv/bin/python
  echo "installed into a venv: $(grep -m1 'Successfully installed' "$dir/pip.log")"
else
  # No python3-venv: a --target install (numpy comes from the system).
  echo "(no venv: $(tail -n1 "$dir/venv.log"); installing with --target)"
  "$py" -m pip install --no-build-isolation --no-index --no-deps \
    --disable-pip-version-check --target "$dir/site" "$src" \
    >"$dir/pip.log" 2>&1 || { cat "$dir/pip.log"; fail "pip install --target"; }
  export PYTHONPATH=$dir/site
  run_py=$py
fi
tree_clean "pip install --no-build-isolation"
echo "client/python unchanged by pip"
export KVS_PY_EXPECT_INSTALLED=1

# ---- the environment of the run
export KVS_BUILD=$build
export KVS_LIBRARY=$build/libkvshare.so.0
export PYTHONDONTWRITEBYTECODE=1
standin=$build/tests/standin/libcuda-standin.so
if [ -r "$standin" ]; then
  export KVS_CUDA_DRIVER=$standin
else
  echo "(no $standin: the cuda-pool test will skip)"
fi
if readelf -d "$build/libkvshare.so.0" 2>/dev/null | grep -q 'NEEDED.*libasan'; then
  cc=${CC:-cc}
  asan=$("$cc" -print-file-name=libasan.so)
  ubsan=$("$cc" -print-file-name=libubsan.so)
  if [ ! -e "$asan" ] || [ ! -e "$ubsan" ]; then
    echo "SKIP: sanitizer build, but no ASan/UBSan runtime to preload into python ($asan, $ubsan)"
    exit 77
  fi
  # What the daemons and the CLI get (conftest.py restores these).
  export KVS_PY_CHILD_ASAN_OPTIONS=${ASAN_OPTIONS-}
  export KVS_PY_CHILD_LD_PRELOAD=${LD_PRELOAD-}
  export LD_PRELOAD="$asan $ubsan${LD_PRELOAD:+ $LD_PRELOAD}"
  export ASAN_OPTIONS=detect_leaks=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}
  echo "sanitizer build: python runs with $LD_PRELOAD preloaded, detect_leaks=0"
fi

# From client/python, the installed package: -P keeps the current folder
# (the package's sources) off sys.path.
if "$run_py" -P -c pass 2>/dev/null; then
  cd "$src" || fail "cd $src"
  where=client/python
  pytest=("$run_py" -P -m pytest -p no:cacheprovider)
else
  cd "$root" || fail "cd $root"
  where="the repository root (this python has no -P)"
  pytest=("$run_py" -m pytest -p no:cacheprovider)
fi
echo "pytest from $where"
"${pytest[@]}" -q -rs "$src/tests"
rc=$?
[ $rc = 0 ] || fail "pytest exit $rc"
if [ "$build" = "$root/build" ] && [ -z "${LD_PRELOAD-}" ]; then
  # The default build folder, found from the tests' own place.
  env -u KVS_BUILD -u KVS_LIBRARY "${pytest[@]}" -q "$src/tests/test_client.py" \
    >"$dir/default.log" 2>&1 || { cat "$dir/default.log"; fail "pytest without KVS_BUILD"; }
  echo "without KVS_BUILD: $(tail -n1 "$dir/default.log")"
fi
tree_clean "pytest"
echo "client/python unchanged by pytest"

# ---- the route of a fresh venv: pip alone, build isolation
fresh_route() {
  local fresh=${KVS_PY_FRESH:-} p site=
  if [ "${KVS_TEST_OFFLINE:-0}" = 1 ]; then
    echo "SKIPPED fresh-venv route: KVS_TEST_OFFLINE=1"; return
  fi
  if [ -z "$fresh" ]; then
    for p in $(type -ap python3); do
      [ "$(readlink -f "$p")" != "$(readlink -f /usr/bin/python3)" ] &&
        "$p" -c 'import venv' 2>/dev/null && { fresh=$p; break; }
    done
  fi
  [ -n "$fresh" ] || fresh=$py
  local index=${PIP_INDEX_URL:-https://pypi.org/simple}
  if ! "$fresh" -c 'import sys, urllib.request
urllib.request.urlopen(sys.argv[1].rstrip("/") + "/setuptools/", timeout=5)' \
      "$index" 2>/dev/null; then
    echo "SKIPPED fresh-venv route: $index not reachable"; return
  fi
  "$fresh" -m venv "$dir/fresh" >"$dir/fresh.log" 2>&1 ||
    { cat "$dir/fresh.log"; fail "venv from $fresh"; }
  # --no-deps: numpy is not what is tested here.
  timeout 240 "$dir/fresh/bin/python" -m pip install --no-deps \
    --disable-pip-version-check "$src" >"$dir/fresh.log" 2>&1 ||
    { cat "$dir/fresh.log"; fail "pip install from a fresh venv ($fresh)"; }
  site=$("$dir/fresh/bin/python" -P -c 'import importlib.metadata as m
print(m.distribution("kvshare").locate_file("kvshare"))' 2>&1) ||
    fail "kvshare not installed in the fresh venv: $site"
  case $site in "$dir/fresh/"*) ;; *) fail "kvshare found at $site" ;; esac
  tree_clean "pip install with build isolation"
  echo "fresh venv ($("$fresh" -V 2>&1), $fresh): pip install with build isolation: ok"
}
fresh_route
echo "test_python: ok"
