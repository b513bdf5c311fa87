#!/bin/bash
# test_gpu_pool_bench — bench_gpu_pool, the GPU machine's pool benchmark,
# run on the stand-in driver at the GPU's counts (256 forks appending
# from one block, each copy made by the daemon), so that what fails there
# for the program's own reasons fails here first.  Its figures are memcpy
# and the C twins, not a GPU: only that it completes is checked, and that
# each part printed its result.
set -u
build=${KVS_BUILD:-build}
bench=$build/tests/bench/bench_gpu_pool
[ -x "$bench" ] || { echo "SKIP: $bench not built"; exit 77; }
[ -e "$build/tests/standin/libcuda-standin.so" ] ||
  { echo "SKIP: no stand-in driver ($build/tests/standin)"; exit 77; }
out=$(KVS_BUILD=$build "$bench" --standin --quick 2>&1); rc=$?
echo "$out"
[ $rc = 0 ] || { echo "FAIL: bench_gpu_pool --standin exited $rc"; exit 1; }
for want in "STAND-IN DRIVER" "shared / local:" "copy-on-write of .* (256 blocks" \
            "daemon (Batch with daemon_copy"; do
  grep -q -- "$want" <<<"$out" || { echo "FAIL: no '$want' in its output"; exit 1; }
done
echo PASS
