#!/bin/bash
# test_trust — kvshared is not dumpable: another process of the daemon's own
# uid cannot list or open /proc/PID/fd (the pool's memfd, tier files, every
# session's ring), read its maps or attach to it; with --dumpable yes it can
# (so this test can tell the two apart).  Needs root, to run both as an
# unprivileged uid (root itself may always look).
set -u
build=${KVS_BUILD:-build}
daemon=$build/kvshared
fail() { echo "FAIL: $*" >&2; for l in "$dir"/log*; do [ -f "$l" ] && sed 's/^/  log| /' "$l" >&2; done; exit 1; }

[ -x "$daemon" ] || { echo "SKIP: $daemon not built"; exit 77; }
[ "$(id -u)" = 0 ] || { echo "SKIP: needs root (to run the daemon and its neighbour as another uid)"; exit 77; }
command -v setpriv >/dev/null || { echo "SKIP: no setpriv (util-linux)"; exit 77; }
uid=65534
as_user() { setpriv --reuid=$uid --regid=$uid --clear-groups "$@"; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/kvs-trust-XXXXXX")
chmod 777 "$dir"
pid=
cleanup() { [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT

# start NAME [OPTION...]: a daemon as $uid, its pid in $pid.
start() {
  local name=$1; shift
  rm -f "$dir/$name.sock"
  setpriv --reuid=$uid --regid=$uid --clear-groups "$daemon" serve --socket "$dir/$name.sock" --pool-blocks 32 \
    --num-layers 1 --head-dim 8 --exit-with-parent yes "$@" >"$dir/log.$name" 2>&1 &
  pid=$!
  for _ in $(seq 200); do
    [ -S "$dir/$name.sock" ] && return 0
    kill -0 "$pid" 2>/dev/null || fail "$name: kvshared exited"
    sleep 0.05
  done
  fail "$name: kvshared did not listen"
}
stop() { kill -TERM "$pid"; wait "$pid"; local rc=$?; pid=; [ $rc = 0 ] || fail "exit $rc on SIGTERM"; }

start default
# The daemon's uid is $uid, yet its /proc files are root's.
[ "$(awk '/^Uid:/ {print $2}' /proc/$pid/status)" = $uid ] || fail "daemon uid"
owner=$(stat -c %u "/proc/$pid/fd" 2>/dev/null)
[ "$owner" = 0 ] || fail "/proc/$pid/fd owned by uid $owner, not root"
out=$(as_user ls "/proc/$pid/fd" 2>&1) && fail "a same-uid process listed the daemon's fds: $out"
echo "ls /proc/PID/fd as uid $uid: $out"
grep -q 'Permission denied' <<<"$out" || fail "ls: $out"
# Its fds cannot be opened either (fd 3 and up: the pool's memfd among them).
for fd in $(ls "/proc/$pid/fd"); do
  [ "$fd" -ge 3 ] || continue
  as_user cat "/proc/$pid/fd/$fd" >/dev/null 2>&1 && fail "opened the daemon's fd $fd as uid $uid"
done
as_user cat "/proc/$pid/maps" >/dev/null 2>&1 && fail "read the daemon's maps as uid $uid"
as_user cat "/proc/$pid/environ" >/dev/null 2>&1 && fail "read the daemon's environment as uid $uid"
stop

# With --dumpable yes the same look succeeds: the check above can fail.
start dumpable --dumpable yes
out=$(as_user ls -l "/proc/$pid/fd" 2>&1) || fail "--dumpable yes: $out"
grep -q 'memfd:' <<<"$out" || fail "--dumpable yes: no memfd among the fds: $out"
echo "with --dumpable yes, uid $uid sees $(grep -c -- '->' <<<"$out") fds"
stop
echo "PASS"
