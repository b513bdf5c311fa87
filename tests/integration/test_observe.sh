#!/bin/bash
# test_observe — /metrics and the KV event stream of a real kvshared, seen
# by the tools that consume them: prometheus_client's text parser, a pyzmq +
# msgpack subscriber that rebuilds the prefix index (observe_check.py, three
# daemons: the standard checks, events longer than one run, blocks brought
# up from a tier without verify_tokens); and the refusals of bad
# metrics_listen / kv_events_endpoint values.
set -u
build=${KVS_BUILD:-build}
daemon=$build/kvshared
py=/usr/bin/python3
here=$(dirname "$0")
export KVS_LIBRARY=$build/libkvshare.so.0 # (observe_check.py engine)
dir= pid= holder=
fail() { echo "FAIL: $*" >&2; [ -n "$dir" ] && [ -f "$dir/log" ] && sed 's/^/  log| /' "$dir/log" >&2; exit 1; }

[ -x "$daemon" ] || { echo "SKIP: $daemon not built"; exit 77; }
[ -x "$build/tests/integration/kvs_drive" ] || fail "kvs_drive not built"
$py -c 'import zmq, msgpack, prometheus_client' 2>/dev/null ||
  fail "python3-zmq, python3-msgpack or python3-prometheus-client missing (deploy/install-deps.sh)"
dir=$(mktemp -d "${TMPDIR:-/tmp}/kvs-obs-XXXXXX")
cleanup() {
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
  [ -n "$holder" ] && kill "$holder" 2>/dev/null
  [ -n "${redis:-}" ] && kill "$redis" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
sock=$dir/kvshared.sock
. "$here/../lib/daemon.sh"

# Refusals: each is a clear error at start-up, and no socket is left.
refuse() { # WHAT EXPECTED-TEXT OPTION...
  local what=$1 text=$2; shift 2
  "$daemon" serve --socket "$sock" --pool-blocks 8 "$@" >"$dir/log" 2>&1 && fail "$what: started"
  grep -q -- "$text" "$dir/log" || fail "$what: no '$text' in the log"
  [ -e "$sock" ] && fail "$what: left its socket behind"
  return 0
}
refuse "metrics without a port" "is not HOST:PORT" --metrics-listen 127.0.0.1
refuse "metrics on an unknown name" "cannot resolve" --metrics-listen nosuch.invalid:9400
refuse "metrics port 70000" "is not HOST:PORT" --metrics-listen 127.0.0.1:70000
refuse "events on a bad endpoint" "'bogus://x' is not a ZMQ endpoint" \
  --kv-events-endpoint bogus://x
refuse "replay on the events endpoint" "must differ" \
  --kv-events-endpoint "ipc://$dir/same" --kv-events-replay-endpoint "ipc://$dir/same"
# A port in use.
$py -c 'import socket,sys,time
s=socket.socket(); s.bind(("127.0.0.1",0)); s.listen()
print(s.getsockname()[1], flush=True); time.sleep(30)' >"$dir/port" &
holder=$!
for _ in $(seq 50); do [ -s "$dir/port" ] && break; sleep 0.1; done
busy=$(cat "$dir/port")
refuse "metrics on a busy port" "cannot serve metrics" --metrics-listen "127.0.0.1:$busy"
refuse "events on a busy port" "cannot bind tcp://127.0.0.1:$busy" \
  --kv-events-endpoint "tcp://127.0.0.1:$busy"
kill "$holder"; wait "$holder" 2>/dev/null
holder=

# Off by default: no metrics thread, no event sockets.
kvs_start_daemon "$daemon" "$dir" "$sock" "$dir/log" --pool-blocks 8 || fail "plain start"
grep -Eq "metrics:|kv events:" "$dir/log" && fail "metrics or events on by default"
kill -TERM "$pid"; wait "$pid" || fail "plain daemon exit $?"
pid=

# The engine mode loads libkvshare into python: a sanitizer build's needs
# its runtimes preloaded (leak detection off for python itself).
sanpy=()
if readelf -d "$build/libkvshare.so.0" 2>/dev/null | grep -q 'NEEDED.*libasan'; then
  asan=$(${CC:-cc} -print-file-name=libasan.so)
  ubsan=$(${CC:-cc} -print-file-name=libubsan.so)
  [ -e "$asan" ] && [ -e "$ubsan" ] || fail "no ASan/UBSan runtime to preload into python"
  sanpy=(env LD_PRELOAD="$asan $ubsan" ASAN_OPTIONS=detect_leaks=0)
fi

# observe MODE BLOCK_SIZE OPTION...: observe_check.py MODE against a daemon
# started with the options.
observe() {
  local mode=$1 bs=$2; shift 2
  kvs_start_daemon "$daemon" "$dir" "$sock" "$dir/log" --num-layers 1 --head-dim 8 \
    --block-size "$bs" --metrics-listen 127.0.0.1:0 \
    --kv-events-endpoint "ipc://$dir/events" \
    --kv-events-replay-endpoint "ipc://$dir/replay" "$@" ||
    fail "kvshared did not become ready ($mode)"
  url=$(grep -o 'metrics: http://[^ ]*' "$dir/log" | head -1 | cut -d' ' -f2)
  [[ $url == http://127.0.0.1:[1-9]*/metrics ]] || fail "no metrics URL in the log ($url)"
  [ "$mode" = standard ] && bad_http
  local pre=()
  [ "$mode" = engine ] || [ "$mode" = mixed ] && pre=("${sanpy[@]}")
  "${pre[@]}" $py "$here/observe_check.py" "$mode" "$build" "$sock" "ipc://$dir/events" \
    "ipc://$dir/replay" "$url" "$pid" "$bs" || fail "observe_check.py $mode"
  wait "$pid"; rc=$?
  pid=
  [ $rc = 0 ] || fail "kvshared exited $rc after SIGTERM ($mode)"
  grep -q "stopped cleanly" "$dir/log" || fail "no clean stop ($mode)"
}

# The HTTP side refuses what it does not serve.
bad_http() {
  code=$(curl -s -o /dev/null -w '%{http_code}' "${url%/metrics}/nope") || fail "curl"
  [ "$code" = 404 ] || fail "GET /nope: $code"
  code=$(curl -s -o /dev/null -w '%{http_code}' -X POST -d x "$url") || fail "curl"
  [ "$code" = 405 ] || fail "POST /metrics: $code"
  curl -sf "$url" | grep -q '^kvshare_pool_size_blocks 64$' || fail "curl /metrics"
}

# Every batch the subscribers apply is also dumped, per format, for
# vllm_decode.py.
KVS_EVENTS_DUMP=$dir/map.dump observe standard 16 --pool-blocks 64
KVS_EVENTS_FORMAT=array KVS_EVENTS_DUMP=$dir/array.dump \
  observe long 1 --pool-blocks 5100 --num-kv-heads 1 --kv-events-format array
observe tier 16 --pool-blocks 64 --verify-tokens no --host-tier-bytes 1M
# (with a remote tier when redis-server is installed: its copies too)
remote=()
if command -v redis-server >/dev/null; then
  redis-server --port 0 --unixsocket "$dir/redis.sock" --save "" \
    --appendonly no >"$dir/redis.log" 2>&1 &
  redis=$!
  for _ in $(seq 100); do [ -S "$dir/redis.sock" ] && break; sleep 0.05; done
  remote=(--remote-tier "unix://$dir/redis.sock")
fi
KVS_EVENTS_DUMP=$dir/map.dump KVS_WANT_REMOTE=${#remote[@]} observe engine 4 \
  --pool-blocks 48 --host-tier-bytes 64K --disk-tier "$dir/disk" \
  --disk-tier-bytes 256K "${remote[@]}"
[ -n "${redis:-}" ] && kill "$redis"
observe mixed 4 --pool-blocks 48 --host-tier-bytes 64K --disk-tier "$dir/disk2" \
  --disk-tier-bytes 256K

# The dumps through msgspec structs shaped as vLLM's (KVS_VLLM_PY: a
# python3 with msgspec; without one this part is skipped, visibly).
vpy=${KVS_VLLM_PY:-$py}
for f in map array; do
  "$vpy" "$here/vllm_decode.py" "$f" "$dir/$f.dump"; rc=$?
  [ $rc = 77 ] && { echo "vllm_decode: skipped (no msgspec in $vpy)"; break; }
  [ $rc = 0 ] || fail "vllm_decode.py $f"
done
echo "PASS"
