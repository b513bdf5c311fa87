#!/bin/bash
# test_python — the Python binding (client/python): `pip install` of the
# package into a temporary virtual environment (offline, no build
# isolation), then its pytest suite (client/python/tests) run by that
# environment's interpreter against real kvshared daemons of this build:
# the Client's calls and errors, batches, numpy views read back byte for
# byte by a second client, DLPack, tiers and swap, a cuda pool through the
# stand-in driver, the toy engine example; every daemon checked for leaks
# and stopped with SIGTERM.
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

# ---- install: from a copy, so that pip's in-tree build leaves the source
# tree untouched (and two builds' runs do not meet there).
mkdir "$dir/src"
cp -r "$root/client/python/pyproject.toml" "$root/client/python/README.md" \
  "$root/client/python/kvshare" "$dir/src/"
if "$py" -m venv --system-site-packages "$dir/venv" >"$dir/venv.log" 2>&1; then
  "$dir/venv/bin/python" -m pip install --no-build-isolation --no-index \
    --disable-pip-version-check "$dir/src" >"$dir/pip.log" 2>&1 ||
    { cat "$dir/pip.log"; fail "pip install into a venv"; }
  run_py=$dir/venv/bin/python
  echo "installed into a venv: $(grep -m1 'Successfully installed' "$dir/pip.log")"
else
  # No python3-venv: a --target install (numpy comes from the system).
  echo "(no venv: $(tail -n1 "$dir/venv.log"); installing with --target)"
  "$py" -m pip install --no-build-isolation --no-index --no-deps \
    --disable-pip-version-check --target "$dir/site" "$dir/src" \
    >"$dir/pip.log" 2>&1 || { cat "$dir/pip.log"; fail "pip install --target"; }
  export PYTHONPATH=$dir/site
  run_py=$py
fi
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

cd "$root" || fail "cd $root"
"$run_py" -m pytest -p no:cacheprovider -q -rs client/python/tests
rc=$?
[ $rc = 0 ] || fail "pytest exit $rc"
echo "test_python: ok"
