#!/bin/bash
# test_socket_dir — one daemon per GPU, their sockets in one folder
# (socket_dir), and workers that find the daemon of their own GPU:
#   - two daemons on two stand-in GPUs (tests/standin/, each picking its GPU
#     with --gpu UUID) name their sockets GPU-<uuid>.sock in the folder; a
#     host-pool daemon names its kvshared.sock;
#   - a worker given the folder (--socket DIR, and KVS_SOCKET=DIR) with
#     NVIDIA_VISIBLE_DEVICES=<second UUID> reaches the second daemon, with
#     the first UUID the first; CUDA_VISIBLE_DEVICES's first UUID wins over
#     NVIDIA_VISIBLE_DEVICES; NVIDIA_VISIBLE_DEVICES naming a folder whose
#     entries are UUIDs (the device plugin's volume-mounts strategy) works;
#   - refused with ENODEV and a message naming the worker's GPU, the folder
#     and the daemons' GPUs: an unknown UUID, no UUID at all, two GPUs with
#     daemons and no CUDA_VISIBLE_DEVICES to choose;
#   - no UUID and a host pool's kvshared.sock in the folder: that one;
#   - kvshared refuses socket with socket_dir, and socket_dir under socket
#     activation.
# The worker here is the CLI (it connects with kvs_connect like any worker,
# without mapping the pool); a worker that maps a pool on a GPU it cannot
# use is refused with guidance in test_gpu_pool's wrong-gpu role.
set -u
build=${KVS_BUILD:-build}
daemon=$build/kvshared
cli=$build/kvshare
standin=$build/tests/standin/libcuda-standin.so
dir=
pids=()
fail() {
  echo "FAIL: $*" >&2
  for l in "$dir"/log.*; do [ -f "$l" ] && sed "s#^#  ${l##*/}| #" "$l" >&2; done
  exit 1
}
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  [ -n "$dir" ] && rm -rf "$dir"
}
trap cleanup EXIT

[ -x "$daemon" ] || { echo "SKIP: $daemon not built"; exit 77; }
[ -x "$cli" ] || fail "$cli not built"
[ -r "$standin" ] || { echo "SKIP: no stand-in CUDA driver ($standin)"; exit 77; }
dir=$(mktemp -d "${TMPDIR:-/tmp}/kvs-sockdir-XXXXXX")
socks=$dir/run
A=GPU-5354414e-4449-4e00-8000-00000000000a
B=GPU-5354414e-4449-4e00-8000-00000000000b
C=GPU-5354414e-4449-4e00-8000-00000000000c
small=(--num-layers 1 --num-kv-heads 1 --head-dim 8 --pool-blocks 64
       --exit-with-parent yes)
# Every process sees the stand-in's two GPUs (what the device plugin would
# have given it is what NVIDIA_VISIBLE_DEVICES says below).
export KVS_CUDA_DRIVER=$standin KVS_STANDIN_GPUS=$A,$B KVS_STANDIN_MEM=64M
unset KVS_SOCKET CUDA_VISIBLE_DEVICES NVIDIA_VISIBLE_DEVICES

# start NAME OPTION...: a daemon told --socket-dir $socks; its socket (from
# its "ready" line) in $sock.
start() {
  local name=$1 p
  shift
  exec 3>"$dir/ready.$name"
  "$daemon" serve --socket-dir "$socks" --ready-fd 3 "${small[@]}" "$@" \
    >"$dir/log.$name" 2>&1 &
  p=$!
  exec 3>&-
  pids+=("$p")
  for _ in $(seq 300); do
    grep -q ready "$dir/ready.$name" 2>/dev/null && break
    kill -0 "$p" 2>/dev/null || fail "$name: kvshared exited"
    sleep 0.1
  done
  sock=$(sed -n 's/^ready //p' "$dir/log.$name")
  [ -n "$sock" ] || fail "$name: not ready"
}
# uuid_of ENV...: the GPU of the daemon the CLI reaches with --socket $socks.
uuid_of() {
  env "$@" "$cli" --socket "$socks" layout --json |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["gpu_uuid"])'
}
# refused WANT... -- ENV...: the CLI is refused with ENODEV, each WANT in
# its message.
refused() {
  local want=() out
  while [ "$1" != -- ]; do want+=("$1"); shift; done
  shift
  out=$(env "$@" "$cli" --socket "$socks" stats 2>&1) && fail "connected ($*): $out"
  grep -q 'no device' <<<"$out" || fail "not ENODEV ($*): $out"
  for w in "${want[@]}"; do
    grep -qF -- "$w" <<<"$out" || fail "'$w' missing ($*): $out"
  done
  echo "refused ($*): ${out#*: }"
}

start a --backend cuda --gpu "$A"; sa=$sock
start b --backend cuda --gpu "$B"; sb=$sock
[ "$sa" = "$socks/$A.sock" ] || fail "daemon a listens on $sa"
[ "$sb" = "$socks/$B.sock" ] || fail "daemon b listens on $sb"
[ -S "$sa" ] && [ -S "$sb" ] || fail "sockets missing: $(ls "$socks")"
echo "two daemons: $(cd "$socks" && echo *)"

# ---- a worker reaches the daemon of its GPU
got=$(uuid_of NVIDIA_VISIBLE_DEVICES="$B") || fail "NVIDIA_VISIBLE_DEVICES=B: no connection"
[ "$got" = "$B" ] || fail "NVIDIA_VISIBLE_DEVICES=B reached $got"
got=$(uuid_of NVIDIA_VISIBLE_DEVICES="$A") || fail "NVIDIA_VISIBLE_DEVICES=A: no connection"
[ "$got" = "$A" ] || fail "NVIDIA_VISIBLE_DEVICES=A reached $got"
got=$(env KVS_SOCKET="$socks" NVIDIA_VISIBLE_DEVICES="$B" "$cli" layout --json |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["gpu_uuid"])') ||
  fail "KVS_SOCKET=DIR: no connection"
[ "$got" = "$B" ] || fail "KVS_SOCKET=DIR, NVIDIA_VISIBLE_DEVICES=B reached $got"
# CUDA_VISIBLE_DEVICES's first entry is CUDA's device 0: it decides.
got=$(uuid_of NVIDIA_VISIBLE_DEVICES="$A,$B" CUDA_VISIBLE_DEVICES="$B,$A") ||
  fail "CUDA_VISIBLE_DEVICES=B,A: no connection"
[ "$got" = "$B" ] || fail "CUDA_VISIBLE_DEVICES=B,A reached $got"
# An index in CUDA_VISIBLE_DEVICES says nothing about UUIDs: the one GPU of
# NVIDIA_VISIBLE_DEVICES that has a daemon.
got=$(uuid_of NVIDIA_VISIBLE_DEVICES="$C,$A" CUDA_VISIBLE_DEVICES=0) ||
  fail "NVIDIA_VISIBLE_DEVICES=C,A: no connection"
[ "$got" = "$A" ] || fail "NVIDIA_VISIBLE_DEVICES=C,A reached $got"
# The device plugin's volume-mounts strategy: a folder of UUID entries.
mkdir -p "$dir/devs" && : >"$dir/devs/$B"
got=$(uuid_of NVIDIA_VISIBLE_DEVICES="$dir/devs") || fail "NVIDIA_VISIBLE_DEVICES=folder: no connection"
[ "$got" = "$B" ] || fail "NVIDIA_VISIBLE_DEVICES=folder of B reached $got"
echo "workers reach their GPU's daemon (NVIDIA_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES, KVS_SOCKET, a device folder)"

# ---- refusals that say what to do
refused "$C" "$socks" "$A" "$B" "NVIDIA_VISIBLE_DEVICES" -- NVIDIA_VISIBLE_DEVICES="$C"
refused "$C" "$socks" "CUDA_VISIBLE_DEVICES" -- CUDA_VISIBLE_DEVICES="$C" NVIDIA_VISIBLE_DEVICES="$A"
refused "$socks" "$A" "$B" "names this process's GPU by UUID" -- NVIDIA_VISIBLE_DEVICES=all
refused "$A" "$B" "several GPUs" "CUDA_VISIBLE_DEVICES" -- NVIDIA_VISIBLE_DEVICES="$A,$B"

# ---- a host pool in the folder: the worker that names no GPU gets it
start h --backend host; sh=$sock
[ "$sh" = "$socks/kvshared.sock" ] || fail "host daemon listens on $sh"
"$cli" --socket "$socks" layout --json | grep -q '"backend": "host"' ||
  fail "no GPU named: not the host pool's daemon"
got=$(uuid_of NVIDIA_VISIBLE_DEVICES="$A") || fail "with a host pool there: no connection"
[ "$got" = "$A" ] || fail "NVIDIA_VISIBLE_DEVICES=A with a host pool there reached $got"
refused "$C" -- NVIDIA_VISIBLE_DEVICES="$C"
echo "host pool: kvshared.sock, for workers that name no GPU"

# ---- stop: each daemon removes its own socket
for p in "${pids[@]}"; do kill -TERM "$p"; done
for p in "${pids[@]}"; do
  wait "$p" || fail "a daemon exited $? on SIGTERM"
done
pids=()
left=$(ls -A "$socks")
[ -z "$left" ] || fail "sockets left behind: $left"

# ---- the daemon's refusals
out=$("$daemon" serve --socket-dir "$socks" --socket "$dir/x.sock" "${small[@]}" 2>&1) &&
  fail "socket with socket_dir accepted"
grep -q 'exclude each other' <<<"$out" || fail "socket with socket_dir: $out"
out=$("$daemon" serve --socket-dir "$(printf '/%.0s' $(seq 80))x" "${small[@]}" 2>&1) &&
  fail "a socket_dir too long accepted"
grep -q 'too long' <<<"$out" || fail "a long socket_dir: $out"
if command -v systemd-socket-activate >/dev/null; then
  out=$(timeout 20 systemd-socket-activate -l "$dir/act.sock" -- "$daemon" serve \
          --socket-dir "$socks" "${small[@]}" --backend host 2>&1 </dev/null &
        sleep 0.5; "$cli" --socket "$dir/act.sock" stats >/dev/null 2>&1; wait) 
  grep -q 'socket_dir names the socket' <<<"$out" ||
    fail "socket_dir under socket activation: $out"
  echo "socket activation with socket_dir: refused"
else
  echo "note: no systemd-socket-activate: socket_dir under activation not run"
fi
echo "test_socket_dir: ok"
