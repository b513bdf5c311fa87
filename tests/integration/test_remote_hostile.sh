#!/bin/bash
# test_remote_hostile — the remote tier against a Redis that misbehaves on
# command (fake_redis.py, driven by remote_hostile.py): replies nobody asked
# for, 2^31-element arrays, 1.5 GB and 10^11-byte bulks, values cut off and
# silence, garbage.  None may crash the daemon, stall its loop or grow it
# past its in-flight bound; each connection is dropped, counted, logged
# once and made again.
set -u
build=${KVS_BUILD:-build}
here=$(dirname "$0")
[ -x "$build/kvshared" ] || { echo "SKIP: $build/kvshared not built"; exit 77; }
[ -x "$build/tests/integration/kvs_drive" ] || { echo "FAIL: kvs_drive not built"; exit 1; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/kvs-hostile-XXXXXX")
trap 'rm -rf "$dir"' EXIT
/usr/bin/python3 "$here/remote_hostile.py" "$build" "$dir"
