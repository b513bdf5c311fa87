#!/bin/bash
# tests/gpu/pack.sh — prepares the checks only a GPU can make (run.sh).
#
# The GPU machine this project is sometimes lent has the CUDA toolkit and
# driver but none of kvshare's libraries (libuv, protobuf-c, ...) and no
# network, so everything is built here and carried there: this builds into
# build-gpu/ and copies the programs run.sh needs, with the shared libraries
# they load that are not glibc's, into build-gpucarry/ (ignored by git, like
# every build-*/), keeping build/'s layout so the programs find each other,
# debug sections stripped, and packs that into build-gpucarry.tgz: each
# program that links the kernels carries their ~6 MB fatbin, and the
# folder (64 MiB) would not fit the device tool's 64 MiB with the tree,
# the archive (about 24 MiB) does.  Then, with the device tool:
#   run(carry=["build-gpucarry.tgz"], command="tests/gpu/run.sh")
# (run.sh unpacks the archive when the folder is not there.)
# The binaries are x86-64 and linked against this machine's glibc; a newer
# glibc there runs them.
#
# It also builds bench_attention_gpu as it was at KVS_GPU_BASE (default
# b994ecf, the build whose decode figures the first GPU run measured) and
# carries it as tests/bench/bench_attention_gpu.base: run.sh times its
# decode rows and today's alternately, for a before/after in one run.
# KVS_GPU_BASE= (empty) leaves it out.
set -euo pipefail
cd "$(dirname "$0")/../.."
src=build-gpu
out=build-gpucarry
make BUILD=$src all $src/tests/bench/bench_attention_gpu \
  $src/tests/bench/bench_attention >/dev/null
rm -rf "$out"
progs=(kvshared kvshare tests/unit/test_gpu_cuda tests/unit/test_gpu_numpy
       tests/integration/test_gpu_pool tests/integration/test_gpu_tiers
       tests/demo/worker tests/bench/bench_tiers
       tests/bench/bench_gpu_pool tests/bench/bench_attention_gpu
       tests/bench/bench_attention tests/bench/bench_rtt)
base=${KVS_GPU_BASE-b994ecf}
if [ -n "$base" ]; then
  # the old tree from git (no worktree to clean up), built on its own
  wt=$(mktemp -d "${TMPDIR:-/tmp}/kvs-gpu-base.XXXXXX")
  trap 'rm -rf "$wt"' EXIT
  git archive "$base" | tar -x -C "$wt"
  make -C "$wt" BUILD=build-gpu build-gpu/tests/bench/bench_attention_gpu \
    >/dev/null
  cp "$wt/build-gpu/tests/bench/bench_attention_gpu" \
    "$src/tests/bench/bench_attention_gpu.base"
  progs+=(tests/bench/bench_attention_gpu.base)
fi
for p in "${progs[@]}"; do
  mkdir -p "$out/$(dirname "$p")"
  cp "$src/$p" "$out/$p"
done
cp -P "$src"/libkvshare.so* "$out/"
mkdir -p "$out/deps"
for p in "${progs[@]}" libkvshare.so; do
  ldd "$out/$p" | awk '$3 ~ /^\// {print $3}'
done | sort -u | grep -v -E '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libgcc_s|libstdc\+\+)\.so' |
  grep -v "$out" | while read -r lib; do cp -L "$lib" "$out/deps/"; done
strip --strip-debug "$out"/deps/* "$out"/libkvshare.so.* 2>/dev/null || true
for p in "${progs[@]}"; do strip --strip-debug "$out/$p"; done
rm -f "$out.tgz"
tar czf "$out.tgz" "$out"
size=$(du -sm "$out.tgz" | cut -f1)
echo "$out.tgz: ${size} MiB ($(du -sm "$out" | cut -f1) MiB unpacked); libraries carried: $(ls "$out/deps" | tr '\n' ' ')"
[ "$size" -lt 56 ] || { echo "too big to carry (the device tool takes 64 MiB with the tree)" >&2; exit 1; }
