#!/bin/bash
# Runs each benchmark (a program or a script) in turn; each prints its own
# figures as ratios against baselines it measures in the same run.
set -eu
build=$1; shift
export KVS_BUILD=$build
for b in "$@"; do
  echo "== $(basename "$b")"
  "$b"
done
