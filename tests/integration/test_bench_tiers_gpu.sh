#!/bin/bash
# test_bench_tiers_gpu — `bench_tiers gpu`, which tests/gpu/run.sh runs on a
# GPU for issue 30's device <-> host figures, run here on the stand-in
# driver: it must finish and print, for each of its three block sizes and
# both directions, the copy engine's rate against raw per-block copies,
# one cuMemcpy of the same bytes and raw batched copies (on the stand-in
# those are CPU memcpys: only the plumbing is checked, no figure).
set -u
build=${KVS_BUILD:-build}
bin=$build/tests/bench/bench_tiers
standin=$build/tests/standin/libcuda-standin.so
fail() { echo "FAIL: $*"; exit 1; }
[ -x "$bin" ] || fail "$bin not built"
[ -r "$standin" ] || fail "$standin not built"
out=$(KVS_CUDA_DRIVER=$standin "$bin" gpu 2>&1) || fail "bench_tiers gpu exits $?: $out"
echo "$out"
for kib in 64 128 2048; do
  echo "$out" | grep -q "blocks of $kib KiB, pinned host memory" ||
    fail "no run at $kib KiB blocks"
done
for dir in "device -> host" "host -> device"; do
  n=$(echo "$out" | grep -cE "^  $dir engine +[0-9.]+ GB/s  raw per block +[0-9.]+ GB/s \([0-9.]+x\)  one cuMemcpy +[0-9.]+ GB/s \([0-9.]+x\)  raw batched +[0-9.]+ GB/s \([0-9.]+x\)$")
  [ "$n" = 4 ] || fail "$dir: $n complete rows of 4 (3 sizes, then a job of 2 blocks)"
done
echo "$out" | grep -q "device <-> host copies batched" ||
  fail "the pool did not batch its copies on the stand-in"
echo "ok"
