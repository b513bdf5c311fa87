#!/bin/bash
# test_disk_owner — the disk tier's file is the daemon's: a file at the
# tier's path that another uid made before the daemon started (where the
# folder let it: with tenants, DISK.NAME for each tenant) is refused, and
# the daemon does not start, rather than write the tenants' KV data into a
# file its owner reads.  A file of root's, or one the daemon makes itself
# (mode 0600), is taken.  Needs root (to give the file to another uid).
set -u
build=${KVS_BUILD:-build}
daemon=$build/kvshared
dir=
fail() { echo "FAIL: $*" >&2; [ -f "$dir/log" ] && sed 's/^/  log| /' "$dir/log" >&2; exit 1; }

[ -x "$daemon" ] || { echo "SKIP: $daemon not built"; exit 77; }
[ "$(id -u)" = 0 ] || { echo "SKIP: needs root (a file of another uid)"; exit 77; }
"$daemon" --help 2>&1 | grep -q -- '--tenant' ||
  { echo "SKIP: this kvshared has no --tenant option"; exit 77; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/kvs-diskowner-XXXXXX")
pid=
cleanup() { [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT

# run: a daemon with tenants a and b and a disk tier at $dir/disk; its
# exit status once it stopped (it is stopped by SIGTERM once ready).
run() {
  rm -f "$dir/s.sock"
  "$daemon" --socket "$dir/s.sock" --backend host --pool-blocks 64 \
    --num-layers 1 --head-dim 8 --tenant "a uids=40001 blocks=32" \
    --tenant "b uids=40002 blocks=32" --disk-tier "$dir/disk" \
    --disk-tier-bytes 1M >"$dir/log" 2>&1 &
  pid=$!
  for _ in $(seq 200); do
    [ -S "$dir/s.sock" ] && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.05
  done
  kill -TERM $pid 2>/dev/null
  wait $pid
  local rc=$?
  pid=
  return $rc
}

# 1. b's uid made disk.a, world-readable: refused, nothing written into it.
: >"$dir/disk.a"
chown 40002:40002 "$dir/disk.a"
chmod 0666 "$dir/disk.a"
run && fail "the daemon started with a disk.a of uid 40002"
grep -q "disk_tier $dir/disk.a belongs to uid 40002, not to the daemon's" "$dir/log" ||
  fail "no message naming disk.a's owner"
[ "$(stat -c %s "$dir/disk.a")" = 0 ] || fail "the daemon wrote into disk.a"
echo "a tier file of another uid: refused"

# 2. The daemon's own files (made 0600), and a file of root's: taken.
rm -f "$dir/disk.a" "$dir/disk.b"
run || fail "the daemon did not start with no tier files"
for t in a b; do
  [ "$(stat -c '%a %u' "$dir/disk.$t")" = "600 0" ] ||
    fail "disk.$t: $(stat -c '%a %u' "$dir/disk.$t"), wanted mode 600 of uid 0"
done
run || fail "the daemon did not start again with its own tier files"
echo "the daemon's own tier files (0600): taken"
echo "PASS"
