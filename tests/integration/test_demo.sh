#!/bin/bash
# test_demo — the demo (tests/demo.sh) at a small size with half-precision
# and quantized pools: fp16, bf16, int8 and fp8 caches, where every cached
# block must still match byte for byte (int8/fp8: each row's bytes and
# scales as kvs_quantize_row makes them) and every attention row must match
# the from-scratch output over K/V rounded or quantized the same way, within
# the dtype's tolerance.  (make demo runs the fp32 defaults.)
set -u
build=${KVS_BUILD:-build}
[ -x "$build/tests/demo/worker" ] || { echo "FAIL: demo worker not built"; exit 1; }
[ -x "$build/kvshared" ] || { echo "SKIP: kvshared not built"; exit 77; }
for dt in fp16 bf16 int8 fp8; do
  echo "== $dt"
  KVS_DEMO_WORKERS=3 KVS_DEMO_USERS=2 KVS_DEMO_TURNS=3 KVS_DEMO_SYS=40 \
  KVS_DEMO_REPLY=3 \
  KVS_DEMO_DAEMON_ARGS="--dtype $dt --num-layers 2 --num-kv-heads 2 --head-dim 32 --pool-blocks 512" \
    tests/demo.sh "$build" || { echo "FAIL: the demo with a $dt pool"; exit 1; }
done
# The same demo on fp16, int8 and fp8 cuda pools through the stand-in driver (no GPU here:
# the workers' device path — staging, CUDA kernel launches, stream
# synchronisation, device reads — runs against memfd "device" memory and
# the C twins; tests/standin/).  On a GPU machine make demo does this for
# real.
standin=$build/tests/standin/libcuda-standin.so
[ -r "$standin" ] || { echo "FAIL: $standin not built"; exit 1; }
for dt in fp16 int8 fp8; do
  echo "== $dt, cuda pool on the stand-in driver"
  KVS_CUDA_DRIVER=$standin KVS_DEMO_WORKERS=3 KVS_DEMO_USERS=2 KVS_DEMO_TURNS=2 \
  KVS_DEMO_SYS=40 KVS_DEMO_REPLY=3 \
  KVS_DEMO_DAEMON_ARGS="--backend cuda --dtype $dt --num-layers 2 --num-kv-heads 2 --head-dim 32 --pool-blocks 512" \
    tests/demo.sh "$build" >"$build/test-logs/test_demo_cuda.out" 2>&1 ||
    { cat "$build/test-logs/test_demo_cuda.out"; echo "FAIL: the demo on a stand-in $dt cuda pool"; exit 1; }
  cat "$build/test-logs/test_demo_cuda.out"
  grep -q "cuda backend on GPU-" "$build/test-logs/test_demo_cuda.out" ||
    { echo "FAIL: the demo did not run on the cuda pool"; exit 1; }
done
echo "test_demo: ok"
