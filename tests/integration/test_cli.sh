#!/bin/bash
# test_cli — the kvshare CLI against a real kvshared: ping, stats (text,
# JSON, with the invariant check), layout; exit codes for a missing daemon
# and bad usage; the daemon stops cleanly on SIGTERM.
set -u
build=${KVS_BUILD:-build}
cli=$build/kvshare
daemon=$build/kvshared
fail() { echo "FAIL: $*" >&2; [ -f "$dir/log" ] && sed 's/^/  log| /' "$dir/log" >&2; exit 1; }

[ -x "$cli" ] || fail "$cli not built"
[ -x "$daemon" ] || { echo "SKIP: $daemon not built"; exit 77; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/kvs-cli-XXXXXX")
pid=
cleanup() { [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
sock=$dir/kvshared.sock

. "$(dirname "$0")/../lib/daemon.sh"
if ! kvs_start_daemon "$daemon" "$dir" "$sock" "$dir/log" --num-layers 2 \
     --head-dim 16 --pool-blocks 128; then
  if grep -q "not built yet" "$dir/log"; then
    echo "SKIP: this kvshared cannot serve yet"; exit 77
  fi
  fail "kvshared did not become ready"
fi

out=$("$cli" --socket "$sock" ping --count 3) || fail "ping exit $?"
echo "$out"
[[ $out == "pong from $sock: session "*", 3 round trips, min "* ]] || fail "ping output: $out"

KVS_SOCKET=$sock "$cli" ping >/dev/null || fail "ping via \$KVS_SOCKET"

out=$("$cli" --socket "$sock" stats) || fail "stats exit $?"
echo "$out"
grep -Eq '^num_blocks +128$' <<<"$out" || fail "stats: num_blocks"
grep -Eq '^used_blocks +0$' <<<"$out" || fail "stats: used_blocks"

out=$("$cli" --socket "$sock" stats --json --check) || fail "stats --json exit $?"
echo "$out"
python3 - "$out" <<'EOF' || fail "stats --json is not the expected JSON"
import json, sys
s = json.loads(sys.argv[1])
assert s["num_blocks"] == 128, s
assert s["free_blocks"] + s["cached_blocks"] + s["used_blocks"] == 128, s
assert s["check"] == 0 and s["check_status"] == "OK", s
assert s["sessions"] >= 1, s
EOF

out=$("$cli" --socket "$sock" layout --json) || fail "layout exit $?"
echo "$out"
python3 - "$out" <<'EOF' || fail "layout --json"
import json, sys
l = json.loads(sys.argv[1])
assert l["num_layers"] == 2 and l["head_dim"] == 16 and l["num_blocks"] == 128, l
assert l["backend"] == "host", l
assert l["block_stride"] % 4096 == 0, l
EOF

"$cli" --socket "$dir/nope.sock" ping 2>/dev/null; rc=$?
[ $rc = 3 ] || fail "no daemon: exit $rc, wanted 3"
# Without a daemon, the message names the socket tried, given or default.
out=$("$cli" --socket "$dir/nope.sock" stats 2>&1); rc=$?
[ $rc = 3 ] || fail "stats, no daemon: exit $rc, wanted 3"
[ "$out" = "kvshare: cannot connect to $dir/nope.sock: No such file or directory" ] ||
  fail "stats, no daemon: $out"
out=$(env -u KVS_SOCKET XDG_RUNTIME_DIR="$dir/xdg" "$cli" stats 2>&1); rc=$?
[ $rc = 3 ] || fail "stats, default socket: exit $rc, wanted 3"
[ "$out" = "kvshare: cannot connect to $dir/xdg/kvshare/kvshared.sock: No such file or directory" ] ||
  fail "stats, default socket: $out"
out=$(KVS_SOCKET="$dir/env.sock" "$cli" ping 2>&1)
[ "$out" = "kvshare: cannot connect to $dir/env.sock: No such file or directory" ] ||
  fail "ping, \$KVS_SOCKET: $out"
# An unknown command says so (and no connection is tried).
out=$("$cli" --socket "$dir/nope.sock" statz 2>&1); rc=$?
[ $rc = 2 ] || fail "bad command: exit $rc, wanted 2"
[ "$out" = "kvshare: unknown command 'statz'
Commands: stats, ping, layout, top; 'kvshare --help' tells more." ] ||
  fail "bad command: $out"
"$cli" 2>/dev/null; rc=$?
[ $rc = 2 ] || fail "no command: exit $rc, wanted 2"
"$cli" --help | grep -q "usage: kvshare" || fail "--help"

# Nothing leaked by the CLI's sessions.
out=$("$cli" --socket "$sock" stats --json --check)
python3 - "$out" <<'EOF' || fail "after: $out"
import json, sys
s = json.loads(sys.argv[1])
assert s["sessions"] == 1 and s["used_blocks"] == 0 and s["num_requests"] == 0, s
assert s["check"] == 0, s
EOF

kill -TERM "$pid"
wait "$pid"; rc=$?
pid=
[ $rc = 0 ] || fail "kvshared exited $rc after SIGTERM"
[ -e "$sock" ] && fail "socket left behind"

# With a tier below the pool, stats shows each tier and the swap counters.
kvs_start_daemon "$daemon" "$dir" "$sock" "$dir/log" --num-layers 2 \
  --head-dim 16 --pool-blocks 128 --host-tier-bytes 1M ||
  fail "kvshared with a host tier did not become ready"
out=$("$cli" --socket "$sock" stats) || fail "stats (tiers) exit $?"
grep -Eq '^tier host:$' <<<"$out" || fail "stats: no host tier: $out"
grep -Eq '^swap:$' <<<"$out" || fail "stats: no swap section: $out"
grep -Eq '^  swapped_requests +0$' <<<"$out" || fail "stats: swapped_requests"
out=$("$cli" --socket "$sock" stats --json) || fail "stats --json (tiers) exit $?"
python3 - "$out" <<'EOF' || fail "stats --json with tiers: $out"
import json, sys
s = json.loads(sys.argv[1])
assert [t["name"] for t in s["tiers"]] == ["host"], s
assert s["tiers"][0]["capacity_bytes"] == 1 << 20, s
w = s["swap"]
assert set(w) == {"swapped_requests", "held_slots", "swap_outs", "swap_ins",
                  "failures", "out_blocks", "kept_blocks", "in_blocks",
                  "resident_blocks"}, w
assert all(v == 0 for v in w.values()), w
EOF
kill -TERM "$pid"
wait "$pid"; rc=$?
pid=
[ $rc = 0 ] || fail "kvshared (tiers) exited $rc after SIGTERM"
echo "test_cli: ok"
