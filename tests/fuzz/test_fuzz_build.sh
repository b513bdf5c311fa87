#!/bin/bash
# fuzz_main (the libFuzzer target's own source list, linked without
# libFuzzer: tests/fuzz/module.mk) runs a generated corpus, ring requests
# among its inputs, through the target: no crash, no leak, the pool whole.
set -eu
build=${KVS_BUILD:-build}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$build/tests/fuzz/test_fuzz_dispatch" --corpus "$dir" 200
out=$("$build/tests/fuzz/fuzz_main" "$dir")
echo "$out"
echo "$out" | grep -q '^200 inputs: no crash' || { echo "FAIL: not 200 inputs"; exit 1; }
# The generator's ring inputs reached the ring path, and some were refused.
ring=$(echo "$out" | sed -n 's/^\([0-9]*\) ring requests (\([0-9]*\) refused).*/\1 \2/p')
set -- $ring
[ "${1:-0}" -gt 0 ] && [ "${2:-0}" -gt 0 ] && [ "$2" -lt "$1" ] ||
  { echo "FAIL: ring requests '$ring'"; exit 1; }
echo "PASS"
