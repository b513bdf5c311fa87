#!/bin/bash
# test_cross_arm64 — every C source of libkvshare and kvshared compiles for
# aarch64 (an Arm host beside the GPU, as on Grace Hopper nodes) with the
# Makefile's own warnings as errors: the x86-only code (the AVX2 and
# AVX-512 attention bodies and their helpers) must stay behind its guards,
# and the portable paths must build alone.  A compile, not a run: the C
# library is the cross compiler's, the other headers this machine's
# (architecture-independent).  Skipped, saying so, without
# aarch64-linux-gnu-gcc and its C library (Debian: gcc-aarch64-linux-gnu,
# libc6-dev-arm64-cross), and in the
# sanitizer build (the sources are the same).
set -u
build=${KVS_BUILD:-build}
cc=aarch64-linux-gnu-gcc
command -v "$cc" >/dev/null 2>&1 ||
  { echo "SKIP: no $cc (gcc-aarch64-linux-gnu)"; exit 77; }
[ -d "$build/proto" ] || { echo "SKIP: $build/proto not generated"; exit 77; }
# (its C library's headers are a separate package, only recommended)
echo '#include <stdio.h>' | "$cc" -E -x c - >/dev/null 2>&1 ||
  { echo "SKIP: $cc has no C library headers (libc6-dev-arm64-cross)"; exit 77; }
if grep -q __asan_init "$build/kvshared" 2>/dev/null; then
  echo "SKIP: the sanitizer build (the plain build's run covers the sources)"
  exit 77
fi
warn=$(sed -n '/^WARN *:=/,/[^\\]$/p' Makefile | tr -d '\\\n' | sed 's/^WARN *:= *//')
[ -n "$warn" ] || { echo "FAIL: no WARN in the Makefile" >&2; exit 1; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/kvs-a64-XXXXXX")
trap 'rm -rf "$dir"' EXIT
srcs=$(ls client/*.c proto/*.c "$build"/proto/*.c shm/*.c gpu/*.c \
          daemon/*.c daemon/*/*.c)
export cc warn dir build
# shellcheck disable=SC2016
printf '%s\n' $srcs | xargs -P 2 -I{} sh -c '
  o="$dir/$(echo {} | tr / _).o"
  $cc -D_GNU_SOURCE -I. -Ishm -Iproto -I"$build/proto" -Igpu \
      -I/usr/local/cuda/include -idirafter /usr/include -std=gnu11 -O2 \
      $warn -fPIC -c -o "$o" {} >"$o.log" 2>&1 || { echo "{}" >>"$dir/failed"; }'
n=$(printf '%s\n' $srcs | wc -l)
if [ -s "$dir/failed" ]; then
  for f in $(cat "$dir/failed"); do
    echo "FAIL: $f does not compile for aarch64:" >&2
    sed 's/^/  | /' "$dir/$(echo "$f" | tr / _).o.log" | head -20 >&2
  done
  exit 1
fi
objs=$(ls "$dir"/*.o | wc -l)
readelf -h "$dir/gpu_kernels_cpu.c.o" | grep -q 'Machine: *AArch64' ||
  { echo "FAIL: the objects are not aarch64" >&2; exit 1; }
[ "$objs" = "$n" ] || { echo "FAIL: $objs objects for $n sources" >&2; exit 1; }
echo "PASS: $n sources compile for aarch64 ($($cc -dumpversion)) with the Makefile's warnings as errors"
