#!/bin/bash
# test_bench_sdpa — bench_attention_sdpa.py's plumbing, where no GPU is:
# its kernel-argument structs handed to libkvshare's C decode and prefill
# twins over numpy arrays must match a numpy reference (--selftest), so that the GPU
# run (tests/gpu/run.sh) measures the kernel, not a wrong struct.
set -u
build=${KVS_BUILD:-build}
py=/usr/bin/python3
[ -e "$build/libkvshare.so.0" ] || { echo "SKIP: $build/libkvshare.so.0 not built"; exit 77; }
$py -c 'import numpy' 2>/dev/null || { echo "FAIL: python3-numpy missing"; exit 1; }
pre=()
if readelf -d "$build/libkvshare.so.0" 2>/dev/null | grep -q 'NEEDED.*libasan'; then
  pre=(env LD_PRELOAD="$(${CC:-cc} -print-file-name=libasan.so) $(${CC:-cc} -print-file-name=libubsan.so)"
       ASAN_OPTIONS=detect_leaks=0)
fi
KVS_BUILD=$build "${pre[@]}" $py "$(dirname "$0")/../bench/bench_attention_sdpa.py" --selftest
