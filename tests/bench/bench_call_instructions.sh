#!/bin/bash
# The instructions one small call costs, client and daemon, counted by
# callgrind (repeatable: it counts instructions, not time): a Ping of 16
# bytes as a compact frame and as a protobuf Envelope ($KVS_COMPACT=0).
# The client's figure is the difference between two runs of `kvshare ping`
# (11000 and 1000 calls); the daemon's between two daemons under callgrind
# that served 10000 Pings and 1.  Needs valgrind; exit 77 without it.
set -eu
build=${KVS_BUILD:-build}
command -v valgrind >/dev/null || { echo "no valgrind: skipped"; exit 77; }
tmp=$(mktemp -d); trap 'pkill -f "$tmp/s.sock" 2>/dev/null || true; rm -rf "$tmp"' EXIT
sock=$tmp/s.sock
collected() { grep -h "Collected" "$1" | awk '{print $4}' | tr -d ,; }
wait_sock() { for _ in $(seq 200); do [ -S "$sock" ] && return; sleep 0.05; done; echo "no daemon"; exit 1; }
# A daemon under callgrind that answers n Pings, then stops; its count.
daemon_count() {
  local mode=$1 n=$2
  local log=$tmp/d$n.log
  rm -f "$sock"
  valgrind --tool=callgrind --callgrind-out-file=/dev/null "$build/kvshared" \
    --socket "$sock" --pool-blocks 256 --log-level warn >"$log" 2>&1 &
  local pid=$!
  wait_sock
  KVS_COMPACT=$mode "$build/kvshare" --socket "$sock" ping --count "$n" >/dev/null
  kill -TERM $pid; wait $pid || true
  collected "$log"
}
client_count() {
  local mode=$1 n=$2
  KVS_COMPACT=$mode valgrind --tool=callgrind --callgrind-out-file=/dev/null \
    "$build/kvshare" --socket "$sock" ping --count "$n" 2>&1 >/dev/null |
    grep Collected | awk '{print $4}' | tr -d ,
}
echo "instructions per Ping (16 B), counted by callgrind:"
for mode in 1 0; do
  rm -f "$sock"
  "$build/kvshared" --socket "$sock" --pool-blocks 256 --log-level warn >/dev/null 2>&1 &
  pid=$!
  wait_sock
  c1=$(client_count $mode 1000); c2=$(client_count $mode 11000)
  kill -TERM $pid; wait $pid || true
  d0=$(daemon_count $mode 1); d1=$(daemon_count $mode 10001)
  name=$([ $mode = 1 ] && echo "compact frame" || echo "Envelope (KVS_COMPACT=0)")
  echo "  $name: client $(( (c2 - c1) / 10000 )), daemon $(( (d1 - d0) / 10000 ))"
done
