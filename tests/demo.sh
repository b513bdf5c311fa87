#!/bin/bash
# make demo: the shared-prompt chat demo of kvshare.
#
#   tests/demo.sh [BUILD]     (make demo runs it after building everything)
#
# Starts kvshared with its built-in defaults (only the socket moved into a
# temporary directory), runs several worker processes (tests/demo/worker.c)
# on a chat workload — every conversation starts with the same system prompt,
# each user adds turns — where each worker computes K/V with a small
# deterministic stand-in model, writes it into the shared pool with the
# write kernel, reuses whatever prefix the daemon finds cached (the system
# prompt computed by another worker, its users' earlier turns), checks every
# cached block it is given byte for byte and every attention output against
# the output computed from scratch, then prints a report, stops the daemon
# with SIGTERM and exits 0 only if every check passed.
#
# Knobs (environment): KVS_DEMO_WORKERS (4), KVS_DEMO_USERS (3 per worker),
# KVS_DEMO_TURNS (4), KVS_DEMO_SYS (100 system-prompt tokens),
# KVS_DEMO_REPLY (6 decoded tokens per turn); KVS_DEMO_DAEMON_ARGS: extra
# kvshared options (the demo itself uses none; tests pass --dtype fp16 ...).
set -u
build=${1:-build}
workers=${KVS_DEMO_WORKERS:-4}
users=${KVS_DEMO_USERS:-3}
turns=${KVS_DEMO_TURNS:-4}
sys=${KVS_DEMO_SYS:-100}
reply=${KVS_DEMO_REPLY:-6}
daemon=$build/kvshared
cli=$build/kvshare
worker=$build/tests/demo/worker

die() { echo "kvshare demo: FAILED: $*" >&2; [ -f "${dir:-}/kvshared.log" ] &&
        sed 's/^/  kvshared| /' "$dir/kvshared.log" >&2; exit 1; }
for f in "$daemon" "$cli" "$worker"; do
  [ -x "$f" ] || die "$f is not built (run: make BUILD=$build all)"
done

dir=$(mktemp -d "${TMPDIR:-/tmp}/kvshare-demo-XXXXXX") || die "mktemp"
pid=
wpids=()
cleanup() {
  for p in "${wpids[@]}"; do kill -9 "$p" 2>/dev/null; done
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
sock=$dir/kvshared.sock

echo "== kvshare demo: $workers workers x $users users x $turns turns," \
     "a shared $sys-token system prompt"
. "$(dirname "$0")/lib/daemon.sh"
# shellcheck disable=SC2086
kvs_start_daemon "$daemon" "$dir" "$sock" "$dir/kvshared.log" \
  ${KVS_DEMO_DAEMON_ARGS:-} || die "kvshared did not start"
echo "kvshared $pid listening on $sock (${KVS_DEMO_DAEMON_ARGS:-built-in defaults})"
grep -m2 -E "backend auto: |pool: " "$dir/kvshared.log" |
  sed -e 's/^.*backend auto: /  backend auto: /' -e 's/^.*pool: /  pool: /'
layout=$("$cli" --socket "$sock" layout --json) || die "kvshare layout"

run_worker() {
  local id=$1; shift
  "$worker" --socket "$sock" --id "$id" --users "$users" --turns "$turns" \
    --sys "$sys" --reply "$reply" "$@" >"$dir/worker$id.out" 2>"$dir/worker$id.err" &
  wpids+=($!)
}

# Worker 0 goes first; the others start once the system prompt's full
# blocks are sealed in the pool, so they find it cached.
run_worker 0
bs=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["block_size"])' "$layout")
need=$((sys / bs))
for _ in $(seq 600); do
  sealed=$("$cli" --socket "$sock" stats --json |
           python3 -c 'import json,sys; print(json.load(sys.stdin)["sealed_blocks"])')
  [ "${sealed:-0}" -ge "$need" ] && break
  kill -0 "${wpids[0]}" 2>/dev/null || break
  sleep 0.05
done
for ((i = 1; i < workers; i++)); do run_worker "$i"; done

ok=1
for ((i = 0; i < workers; i++)); do
  if ! wait "${wpids[$i]}"; then
    ok=0
    echo "worker $i FAILED:" >&2
    sed 's/^/  | /' "$dir/worker$i.err" >&2
  fi
done
wpids=()
# The round trip, measured once the workers are done (a quiet machine).
# With two CPUs or more, the client runs on CPU 0 and both servers (kvshared
# and the raw echo process) on CPU 1, so the two see the same wake-ups.
rtt_pin=()
placement="unpinned"
if [ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null &&
   taskset -pc 1 "$pid" >/dev/null 2>&1; then
  rtt_pin=(taskset -c 0)
  placement="client on CPU 0, servers on CPU 1"
fi
"${rtt_pin[@]}" "$worker" --socket "$sock" --id "$workers" --rtt-only \
  ${rtt_pin:+--pin-server 1} >"$dir/rtt.out" 2>"$dir/rtt.err" ||
  { ok=0; sed 's/^/  | /' "$dir/rtt.err" >&2; }
cat "$dir"/worker*.out >"$dir/results"
stats=$("$cli" --socket "$sock" stats --json --check) || die "kvshare stats"

kill -TERM "$pid"
wait "$pid"
drc=$?
pid=
[ $drc = 0 ] || { ok=0; echo "kvshared exited $drc after SIGTERM" >&2; }
[ -e "$sock" ] && { ok=0; echo "kvshared left its socket behind" >&2; }

python3 - "$dir/results" "$stats" "$layout" "$workers" "$ok" "$dir/rtt.out" \
  "$placement" <<'EOF'
import json, sys
path, stats, layout, nworkers, ok = sys.argv[1], json.loads(sys.argv[2]), \
    json.loads(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
def results(path):
    out = []
    for line in open(path):
        if line.startswith("RESULT "):
            out.append({k: float(v) for k, v in
                        (kv.split("=", 1) for kv in line.split()[1:])})
    return out
rows = results(path)
rt = results(sys.argv[6])
def total(key): return int(sum(r[key] for r in rows))
checks = []
def check(name, cond):
    checks.append((name, cond))
L = layout
mib = L["block_stride"] * L["num_blocks"] / 2**20
print(f"layout: {L['num_layers']} layers x {L['num_kv_heads']} kv heads x "
      f"{L['head_dim']} dims, {L['dtype']}, {L['block_size']}-token blocks "
      f"of {L['block_stride'] // 1024} KiB; pool {L['num_blocks']} blocks "
      f"({mib:.0f} MiB, {L['backend']} backend"
      f"{' on ' + L['gpu_uuid'] if L['gpu_uuid'] else ''}), "
      f"model '{L['model_id']}'")
print()
print(f"{'worker':>6} {'requests':>8} {'prompt':>7} {'cached':>7} "
      f"{'computed':>8} {'decoded':>7} {'blocks':>6} {'verified':>8} "
      f"{'rows ok':>7} {'secs':>5}")
for r in sorted(rows, key=lambda r: r["worker"]):
    print(f"{int(r['worker']):>6} {int(r['requests']):>8} "
          f"{int(r['prompt_tokens']):>7} {int(r['hit_tokens']):>7} "
          f"{int(r['computed_tokens']):>8} {int(r['decode_tokens']):>7} "
          f"{int(r['blocks_allocated']):>6} {int(r['hit_blocks_checked']):>8} "
          f"{int(r['rows_checked']):>7} {r['seconds']:>5.2f}")
print()
others = [r for r in rows if r["worker"] > 0]
if others:
    print("first request of each later worker: "
          + ", ".join(f"worker {int(r['worker'])} found {int(r['first_hit'])} "
                      f"tokens cached" for r in sorted(others, key=lambda r: r["worker"]))
          + " (the system prompt, computed by worker 0)")
prompt, hit = total("prompt_tokens"), total("hit_tokens")
rate = hit / prompt if prompt else 0
print(f"prefill tokens:     {prompt} in prompts, {hit} served from the cache, "
      f"{total('computed_tokens')} computed")
print(f"  saved by the cache: {hit} prefill tokens ({100 * rate:.1f}% token hit rate)")
print(f"  daemon counters:    {stats['lookups']} lookups, {stats['hit_blocks']} "
      f"hit blocks, {stats['miss_blocks']} missed, {stats['sealed_blocks']} sealed")
print(f"blocks allocated:   {total('blocks_allocated')} "
      f"(daemon: {stats['allocated_blocks']}, {stats['evictions']} evictions)")
used, cached, free = stats["used_blocks"], stats["cached_blocks"], stats["free_blocks"]
print(f"pool use at the end: {cached} blocks cached "
      f"({cached * L['block_stride'] / 2**20:.1f} MiB, "
      f"{100 * cached / L['num_blocks']:.1f}% of the pool), {used} in use, "
      f"{free} free")
print(f"shared blocks verified byte for byte: {total('hit_blocks_checked')}")
maxerr = max(r["max_rel_err"] for r in rows) if rows else 0
print(f"attention rows checked against the from-scratch output: "
      f"{total('rows_checked')} (max relative error {maxerr:.2g})")
if rt and rt[0]["rtt_raw_us"] > 0:
    d, raw = rt[0]["rtt_daemon_us"], rt[0]["rtt_raw_us"]
    print(f"round trip ({sys.argv[7]}): ping through kvshared {d:.1f} us, "
          f"raw Unix-socket ping-pong of the same size {raw:.1f} us: "
          f"{d / raw:.2f}x (medians)")
print(f"round trips to the daemon: {total('round_trips')} "
      f"(one batch per decode step)")
if stats["daemon_copies"]:
    print(f"copies made by the daemon: {stats['daemon_copies']}")
print(f"invariant check: {stats['check_status']}")

check("every worker finished", len(rows) == nworkers and ok)
check("no worker reported a failure", total("failures") == 0)
check("the cache saved prefill tokens", hit > 0)
check("later workers reused worker 0's system prompt",
      all(r["first_hit"] > 0 for r in others))
check("shared blocks were verified", total("hit_blocks_checked") > 0)
check("attention matched from scratch", total("rows_checked") > 0)
check("no block in use after the workers", used == 0 and stats["num_requests"] == 0)
check("pool invariant", stats["check"] == 0)
check("kvshared stopped cleanly on SIGTERM", ok)
check("round trip measured", bool(rt) and rt[0]["rtt_raw_us"] > 0)
bad = [n for n, c in checks if not c]
for n in bad:
    print(f"FAILED: {n}")
print("kvshare demo: " + ("all checks passed" if not bad else "FAILED"))
sys.exit(1 if bad else 0)
EOF
