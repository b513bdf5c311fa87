#!/bin/bash
# test_messages — kvshared's messages about its options, to the letter: a
# flag is named as it was typed (dashes or underscores), a config file key
# with FILE:LINE; each kind of value says what it wants.  Host names for
# --metrics-listen; ZMQ endpoints checked as they are read.  And the start
# order: what is wrong with the endpoints, the socket's folder or the tiers'
# paths is said before the pool is allocated (no "pool:" line, a pool of a
# million blocks never made).
set -u
build=${KVS_BUILD:-build}
daemon=$build/kvshared
fail() { echo "FAIL: $*" >&2; [ -f "$dir/log" ] && sed 's/^/  log| /' "$dir/log" >&2; exit 1; }

[ -x "$daemon" ] || { echo "SKIP: $daemon not built"; exit 77; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/kvs-msg-XXXXXX")
pid=
cleanup() { [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
sock=$dir/kvshared.sock

# says TEXT OPTION...: kvshared exits 2 with exactly "kvshared: TEXT".
says() {
  local want="kvshared: $1" out rc
  shift
  out=$("$daemon" --socket "$sock" "$@" 2>&1); rc=$?
  [ $rc = 2 ] || fail "$*: exit $rc, wanted 2 ($out)"
  [ "$out" = "$want" ] || fail "$*:
  got:    $out
  wanted: $want"
}

says "--pool-blocks: '10X' is not a decimal number" --pool-blocks 10X
says "--pool_blocks: '10X' is not a decimal number" --pool_blocks 10X
says "--pool-blocks: 0 is out of range [1, 67108864]" --pool-blocks=0
says "--pool-bytes: '10X' is not a byte count (a decimal number, optionally followed by K, M, G or T)" \
  --pool-bytes 10X
says "--max-frame: 100 is out of range [1K, 1G] bytes" --max-frame 100
says "--ready-fd: 'x' is not a decimal integer" --ready-fd x
says "--gpu-memory-fraction: '2' is not a fraction in [0, 1]" --gpu-memory-fraction 2
says "--verify-tokens: 'maybe' is not yes or no" --verify-tokens maybe
says "--allow-uids: 'x' is not a numeric id" --allow-uids 1,x
says "--pool-blocks needs a value" --pool-blocks --verify-tokens
says "unknown option '--pool-blockz' (try --help)" --pool-blockz 3
printf '# a comment\npool_blocks = 10X\n' >"$dir/a.conf"
says "$dir/a.conf:2: pool_blocks: '10X' is not a decimal number" --config "$dir/a.conf"

# Endpoints: checked as they are read, with what is expected.
says "--kv-events-endpoint: '5557' is not a ZMQ endpoint (tcp://*:5557, tcp://ADDRESS:PORT, ipc://PATH or inproc://NAME)" \
  --kv-events-endpoint 5557
says "--kv-events-replay-endpoint: 'tcp://localhost' is not a ZMQ endpoint (tcp://*:5557, tcp://ADDRESS:PORT, ipc://PATH or inproc://NAME)" \
  --kv-events-replay-endpoint tcp://localhost
says "--kv-events-endpoint: 'tcp://localhost:5557': libzmq binds to *, a numeric address or a network interface, not a host name (tcp://*:PORT, tcp://127.0.0.1:PORT, tcp://eth0:PORT)" \
  --kv-events-endpoint tcp://localhost:5557
says "--metrics-listen: 'localhost' is not HOST:PORT (localhost:9400, 10.0.0.5:9400, [::1]:9400 or *:9400)" \
  --metrics-listen localhost
out=$("$daemon" --socket "$sock" --metrics-listen nosuch.invalid:9400 2>&1)
[[ $out == "kvshared: --metrics-listen: 'nosuch.invalid:9400': cannot resolve 'nosuch.invalid' ("*")" ]] ||
  fail "unresolvable metrics host: $out"

# A host name for /metrics: localhost resolves, and the daemon serves there.
. "$(dirname "$0")/../lib/daemon.sh"
kvs_start_daemon "$daemon" "$dir" "$sock" "$dir/log" --pool-blocks 16 \
  --metrics-listen localhost:0 || fail "kvshared --metrics-listen localhost:0"
url=$(grep -o 'metrics: http://[^ ]*' "$dir/log" | cut -d' ' -f2)
[[ $url == http://127.0.0.1:*/metrics || $url == http://\[::1\]:*/metrics ]] ||
  fail "metrics on localhost: $url"
python3 - "$url" <<'EOF' || fail "GET $url"
import sys, urllib.request
body = urllib.request.urlopen(sys.argv[1], timeout=10).read().decode()
assert "kvshare_" in body, body[:200]
EOF
kill -TERM "$pid"; wait "$pid" || fail "kvshared (metrics) exit $?"
pid=

# What is wrong is said before the pool is allocated: a pool of a million
# blocks (the core alone ~100 MB) is never made.
early() { # WHAT EXPECTED-TEXT OPTION...
  local what=$1 text=$2 rc
  shift 2
  "$daemon" --socket "$sock" --pool-blocks 1000000 "$@" >"$dir/log" 2>&1; rc=$?
  [ $rc != 0 ] || fail "$what: started"
  grep -qF -- "$text" "$dir/log" || fail "$what: no '$text' in the log"
  grep -q "pool:" "$dir/log" && fail "$what: the pool was allocated first"
  [ -e "$sock" ] && fail "$what: left its socket behind"
  return 0
}
early "bad events endpoint" "is not a ZMQ endpoint" --kv-events-endpoint 5557
early "unresolvable metrics host" "cannot resolve 'nosuch.invalid'" \
  --metrics-listen nosuch.invalid:9400
early "disk tier in a missing folder" \
  "disk_tier $dir/no/such/tier.bin: cannot create it in $dir/no/such: No such file or directory" \
  --disk-tier "$dir/no/such/tier.bin" --disk-tier-bytes 64M
early "remote tier URL" \
  "remote_tier 'http://cache:6379': want redis://, unix:// or redis-cluster://" \
  --remote-tier http://cache:6379
early "remote tier password file" \
  "remote_tier_password_file $dir/nopass: No such file or directory" \
  --remote-tier redis://127.0.0.1:1 --remote-tier-password-file "$dir/nopass"
touch "$dir/plain"
early "socket folder is a file" \
  "the socket $dir/plain/kvshared.sock: $dir/plain is not a folder" \
  --socket "$dir/plain/kvshared.sock"
# (socket_dir names the socket with the pool: its folder is checked before)
"$daemon" --socket-dir "$dir/plain" --pool-blocks 1000000 >"$dir/log" 2>&1 &&
  fail "socket_dir is a file: started"
grep -qF "socket_dir $dir/plain: not a folder" "$dir/log" ||
  fail "socket_dir is a file: no message"
grep -q "pool:" "$dir/log" && fail "socket_dir is a file: the pool was allocated first"
# Busy TCP ports: tried before the pool too (the real bind comes later).
/usr/bin/python3 -c 'import socket,time
s=socket.socket(); s.bind(("127.0.0.1",0)); s.listen()
print(s.getsockname()[1], flush=True); time.sleep(30)' >"$dir/port" &
holder=$!
for _ in $(seq 50); do [ -s "$dir/port" ] && break; sleep 0.1; done
busy=$(cat "$dir/port")
early "metrics on a busy port" \
  "metrics: cannot serve metrics on 127.0.0.1:$busy: Address already in use" \
  --metrics-listen "127.0.0.1:$busy"
early "events on a busy port" \
  "kv events: cannot bind tcp://127.0.0.1:$busy: Address already in use" \
  --kv-events-endpoint "tcp://127.0.0.1:$busy"
early "replay on a busy port" \
  "kv events: cannot bind tcp://127.0.0.1:$busy: Address already in use" \
  --kv-events-endpoint "ipc://$dir/ev" --kv-events-replay-endpoint "tcp://127.0.0.1:$busy"
kill "$holder"; wait "$holder" 2>/dev/null
echo "test_messages: ok"
