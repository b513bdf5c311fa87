#!/bin/bash
# test_events_flood — one unauthenticated peer of the KV event sockets
# (200,000 subscriptions, 8 MiB and 4 MiB ones, 10,000 replay requests of
# 100 KiB) grows kvshared's heap (and, but under ASan, its RSS) by at most
# 16 MiB, and the subscribers that can match the topic keep getting every
# batch.  events_flood.py does the work.
set -u
build=${KVS_BUILD:-build}
here=$(dirname "$0")
py=/usr/bin/python3
[ -x "$build/kvshared" ] || { echo "SKIP: $build/kvshared not built"; exit 77; }
$py -c 'import zmq' 2>/dev/null || { echo "FAIL: python3-zmq missing (deploy/install-deps.sh)"; exit 1; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/kvs-flood-XXXXXX")
trap 'rm -rf "$dir"' EXIT
$py "$here/events_flood.py" "$build" "$dir"
