#!/bin/bash
# Runs test programs and scripts, each under a timeout.
#   run-tests.sh BUILD TEST...
# Exit status of a test: 0 pass, 77 skip, anything else fail.  A test's output
# is kept in BUILD/test-logs/NAME.log and printed when it fails or skips.
# The last line is "N passed, N failed, N skipped".
set -u
build=$1; shift
export KVS_BUILD=$build
logs=$build/test-logs
mkdir -p "$logs"
timeout_s=${KVS_TEST_TIMEOUT:-300}
pass=0; fail=0; skip=0; failed=()
for t in "$@"; do
  name=$(basename "$t")
  log=$logs/$name.log
  start=${EPOCHREALTIME/./}
  timeout -k 10 "$timeout_s" "$t" >"$log" 2>&1
  rc=$?
  us=$(( ${EPOCHREALTIME/./} - start ))
  secs=$(printf '%d.%d' $((us / 1000000)) $((us / 100000 % 10)))
  case $rc in
    0)  pass=$((pass + 1)); printf '  PASS  %-32s %6ss\n' "$name" "$secs" ;;
    77) skip=$((skip + 1)); printf '  SKIP  %-32s (%s)\n' "$name" \
          "$(grep -m1 -i 'skip' "$log" | cut -c1-100)" ;;
    *)  fail=$((fail + 1)); failed+=("$name")
        [ $rc = 124 ] && echo "  (timed out after ${timeout_s}s)" >>"$log"
        printf '  FAIL  %-32s (exit %d)\n' "$name" $rc
        tail -n 40 "$log" | sed 's/^/        | /' ;;
  esac
done
echo "$pass passed, $fail failed, $skip skipped"
[ $fail = 0 ]
