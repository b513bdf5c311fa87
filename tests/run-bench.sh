#!/bin/bash
# Runs each benchmark (a program or a script) in turn; each prints its own
# figures as ratios against baselines it measures in the same run.  Exit
# status 77 means the benchmark does not apply here (no GPU, say).
set -u
build=$1; shift
export KVS_BUILD=$build
failed=0
for b in "$@"; do
  echo "== $(basename "$b")"
  "$b"
  rc=$?
  case $rc in
    0) ;;
    77) echo "   (skipped)" ;;
    *) echo "   FAILED (exit $rc)"; failed=1 ;;
  esac
done
exit $failed
