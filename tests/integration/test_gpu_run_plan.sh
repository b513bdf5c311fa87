#!/bin/bash
# test_gpu_run_plan — tests/gpu/run.sh's step selection, which lets a short
# GPU loan split the checks over calls that each fit a time limit: the
# plan it prints (-n) for KVS_GPU_STEPS and KVS_GPU_QUICK, a step it does
# not have refused, every step 1-5 behind its own selection, and, with no
# GPU, a refusal before any check runs.  Then step 1 rehearsed on the
# stand-in driver with a made-up nvidia-smi and compute-sanitizer: a
# memcheck that finds an error must fail the run (it once went through a
# pipeline, whose subshell lost the failure: "gpu run: all passed").
set -u
run=tests/gpu/run.sh
fail() { echo "FAIL: $*"; exit 1; }
out=$($run -n) || fail "-n exited $?"
[ "$out" = "steps: 1 2 3 4 5; quick: 0; binaries: build-gpucarry" ] || fail "default plan: $out"
out=$(KVS_GPU_STEPS="1 4" KVS_GPU_QUICK=1 $run -n somedir) || fail "-n with steps exited $?"
[ "$out" = "steps: 1 4; quick: 1; binaries: somedir" ] || fail "plan: $out"
out=$(KVS_GPU_STEPS="2 6" $run -n 2>&1); rc=$?
[ $rc = 2 ] || fail "step 6 exited $rc, not 2"
grep -q "no step '6'" <<<"$out" || fail "step 6: $out"
for n in 1 2 3 4 5; do
  [ "$(grep -c "^if want $n; then" $run)" = 1 ] || fail "step $n is not behind 'if want $n'"
  grep -q "^step \"$n\. " $run || fail "step $n has no heading"
done
if ! command -v nvidia-smi >/dev/null; then
  out=$(OUT= KVS_GPU_STEPS=1 $run 2>&1); rc=$?
  [ $rc = 1 ] || fail "without a GPU run.sh exited $rc, not 1"
  grep -q "^no GPU" <<<"$out" || fail "without a GPU: $out"
  grep -q "^== " <<<"$out" && fail "a step ran without a GPU: $out"
fi
build=${KVS_BUILD:-build}
standin=$build/tests/standin/libcuda-standin.so
if [ -r "$standin" ] && [ -x "$build/tests/unit/test_gpu_cuda" ]; then
  fake=$(mktemp -d "${TMPDIR:-/tmp}/kvs-fakegpu-XXXXXX") || exit 1
  trap 'rm -rf "$fake"' EXIT
  printf '#!/bin/sh\necho "GPU 0: made up"\n' >"$fake/nvidia-smi"
  for rc in 0 9; do
    printf '#!/bin/sh\necho "========= ERROR SUMMARY: %s error(s)"\nexit %s\n' \
      "$rc" "$rc" >"$fake/compute-sanitizer"
    chmod +x "$fake/nvidia-smi" "$fake/compute-sanitizer"
    out=$(PATH="$fake:$PATH" OUT= KVS_CUDA_DRIVER="$PWD/$standin" KVS_GPU_STEPS=1 \
      $run "$build" 2>&1); got=$?
    grep -q "^== 1b\. test_gpu_cuda flash under compute-sanitizer" <<<"$out" ||
      fail "no memcheck step: $out"
    if [ $rc = 0 ]; then
      [ $got = 0 ] && grep -q "^gpu run: all passed" <<<"$out" ||
        fail "a clean memcheck: exit $got: $out"
    else
      [ $got = 1 ] && grep -q "^gpu run: FAILED" <<<"$out" ||
        fail "a memcheck error did not fail the run (exit $got): $out"
    fi
  done
fi
echo PASS
