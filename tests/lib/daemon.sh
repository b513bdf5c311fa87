# tests/lib/daemon.sh — sourced by the shell tests and the demo.
#
#   kvs_start_daemon KVSHARED DIR SOCKET LOG [OPTION...]
#
# Starts KVSHARED serving SOCKET with the given options, its output in LOG,
# and waits (up to 30 s) until it says "ready" on the fd passed with
# --ready-fd (a file in DIR).  Sets $pid to the daemon's process id either
# way; returns 0 once it listens, 1 if it exited or never became ready.
kvs_start_daemon() {
  local daemon=$1 dir=$2 sock=$3 log=$4
  shift 4
  exec 3>"$dir/ready"
  "$daemon" serve --socket "$sock" --ready-fd 3 "$@" >"$log" 2>&1 &
  pid=$!
  exec 3>&-
  for _ in $(seq 300); do
    grep -q ready "$dir/ready" 2>/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  grep -q ready "$dir/ready" 2>/dev/null
}
