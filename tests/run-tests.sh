#!/bin/bash
# Runs test programs and scripts, each under a timeout, up to $KVS_TEST_JOBS
# of them at once (default: 2 where the machine has 2 CPUs or more, else 1;
# each test keeps its own temporary folder, daemon and sockets, and none
# asserts a duration).
#   run-tests.sh BUILD TEST...
# Exit status of a test: 0 pass, 77 skip, anything else fail.  A test's output
# is kept in BUILD/test-logs/NAME.log and printed when it fails or skips.
# A line per test as it ends; the last line is "N passed, N failed, N
# skipped".
set -u
build=$1; shift
export KVS_BUILD=$build
logs=$build/test-logs
mkdir -p "$logs"
timeout_s=${KVS_TEST_TIMEOUT:-300}
ncpu=$(nproc 2>/dev/null || echo 1)
jobs_max=${KVS_TEST_JOBS:-$((ncpu >= 2 ? 2 : 1))}
state=$(mktemp -d "${TMPDIR:-/tmp}/kvs-run-tests-XXXXXX") || exit 1
trap 'rm -rf "$state"' EXIT

# One test: its log, then its report printed whole under a lock (so that
# two tests ending together do not mix their lines) and its outcome left
# in $state for the tally.
run_one() {
  local t=$1 name log start rc us secs out
  name=$(basename "$t")
  log=$logs/$name.log
  start=${EPOCHREALTIME/./}
  timeout -k 10 "$timeout_s" "$t" </dev/null >"$log" 2>&1
  rc=$?
  us=$(( ${EPOCHREALTIME/./} - start ))
  secs=$(printf '%d.%d' $((us / 1000000)) $((us / 100000 % 10)))
  case $rc in
    0)  out=$(printf '  PASS  %-32s %6ss' "$name" "$secs"); echo pass >"$state/$name" ;;
    77) out=$(printf '  SKIP  %-32s (%s)' "$name" \
              "$(grep -m1 -i 'skip' "$log" | cut -c1-100)"); echo skip >"$state/$name" ;;
    *)  [ $rc = 124 ] && echo "  (timed out after ${timeout_s}s)" >>"$log"
        out=$(printf '  FAIL  %-32s (exit %d)\n' "$name" $rc
              tail -n 40 "$log" | sed 's/^/        | /')
        echo fail >"$state/$name" ;;
  esac
  flock "$state" printf '%s\n' "$out"
}

running=0
for t in "$@"; do
  if [ "$running" -ge "$jobs_max" ]; then
    wait -n
    running=$((running - 1))
  fi
  run_one "$t" &
  running=$((running + 1))
done
wait

pass=0; fail=0; skip=0
for t in "$@"; do
  case $(cat "$state/$(basename "$t")" 2>/dev/null) in
    pass) pass=$((pass + 1)) ;;
    skip) skip=$((skip + 1)) ;;
    *)    fail=$((fail + 1)) ;;
  esac
done
echo "$pass passed, $fail failed, $skip skipped"
[ $fail = 0 ]
