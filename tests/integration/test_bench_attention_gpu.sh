#!/bin/bash
# test_bench_attention_gpu — bench_attention_gpu, whose rows tests/gpu/run.sh
# times on a GPU for issues 24, 26 and 30, run here in its smoke mode on
# the stand-in driver (lengths cut, each row once, the kernels' C twins):
# every decode row (with the split workspace where the full run has one,
# int8/fp8 rows with their tokens/s against fp16, on the decode kernel and
# on the flash kernel), every prefill row of
# the old and the flash kernel (the four shapes, the chunk sweep, int8/fp8,
# the long prefixes with the split) with its % of the tensor-core peak,
# and no row whose flash kernel did not run.  The times say nothing; the
# plumbing a GPU slot runs first does not crash or go missing.  Without
# smoke the bench must still skip the stand-in.
set -u
build=${KVS_BUILD:-build}
bin=$build/tests/bench/bench_attention_gpu
standin=$build/tests/standin/libcuda-standin.so
fail() { echo "FAIL: $*"; exit 1; }
[ -x "$bin" ] || fail "$bin not built"
[ -r "$standin" ] || fail "$standin not built"
out=$(KVS_CUDA_DRIVER=$standin "$bin" 1 2>&1) || fail "plain run exits $?"
grep -q "skipped: no GPU (kvshare CUDA stand-in" <<<"$out" ||
  fail "a timed run on the stand-in: $out"
out=$(KVS_CUDA_DRIVER=$standin "$bin" 1 smoke 2>&1) || fail "smoke run exits $?: $out"
echo "$out"
grep -q "did not run" <<<"$out" && fail "a flash row fell back to the old kernel"
grep -q "^sm_90: dense fp16 tensor-core peak 16 TFLOP/s" <<<"$out" ||
  fail "no tensor-core peak line"
num='[0-9]+\.[0-9]'
dec="^(fp16|bf16|fp32|int8|fp8) +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ +(yes|no) +[0-9]+ +$num +$num +[0-9]+ +[0-9]+% +[0-9]+%"
n=$(grep -cE "$dec" <<<"$out")
[ "$n" -ge 20 ] || fail "$n decode rows, want 20 or more"
q=$(grep -cE "${dec} +$num+x$" <<<"$out")
[ "$q" = 20 ] || fail "$q int8/fp8 rows with their x fp16, want 20 (10, then 10 on the flash kernel)"
grep -q "^int8/fp8 decode on the flash kernel" <<<"$out" || fail "no decode-on-flash section"
pre="^(fp16|int8|fp8) +[0-9]+ +[0-9]+ +[0-9]+ +32 +8 +128 +[0-9]+ +$num +$num +$num +$num +$num+% +$num+x$"
n=$(grep -cE "$pre" <<<"$out")
[ "$n" = 24 ] || fail "$n prefill rows, want 24 (4 shapes, 7 chunks, 8 int8/fp8, 5 long)"
# the stand-in is compute capability 9.0: the fp16 rows without split (4
# shapes, 7 chunks) again on the wgmma variant, after all the others
wg="^fp16 +[0-9]+ +[0-9]+ +[0-9]+ +32 +8 +128 +$num +$num +$num +$num+% +$num+x$"
n=$(grep -cE "$wg" <<<"$out")
[ "$n" = 11 ] || fail "$n wgmma prefill rows, want 11"
last=$(grep -E "$pre|$wg" <<<"$out" | tail -11 | grep -cE "$wg")
[ "$last" = 11 ] || fail "the wgmma rows are not the last prefill rows"
echo "ok"
