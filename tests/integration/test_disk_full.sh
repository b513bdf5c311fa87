#!/bin/bash
# test_disk_full — the disk tier on a full file system (a 1 MiB tmpfs: its
# failing writes back off, logged once, nothing lost from the pool) and on a
# slow disk (SIGTERM during writes exits 0).  disk_full.py does the work.
set -u
build=${KVS_BUILD:-build}
here=$(dirname "$0")
[ -x "$build/kvshared" ] || { echo "SKIP: $build/kvshared not built"; exit 77; }
[ -x "$build/tests/integration/kvs_drive" ] || { echo "FAIL: kvs_drive not built"; exit 1; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/kvs-full-XXXXXX")
trap 'umount -l "$dir/mnt" 2>/dev/null; rm -rf "$dir"' EXIT
/usr/bin/python3 "$here/disk_full.py" "$build" "$dir"
