#!/bin/bash
# What the daemon's per-tenant partitions cost in hit rate: the token hit
# rate of a trace's users on one pool (1 tenant) against the same users
# split over N tenants (default 2) of an equal share each of the same total
# capacity (kvshare-replay --tenants N), in the same run, default policy
# (slru).  Capacities: unlimited, and those where one tenant gets about
# 50% and 80% of its unlimited hit rate (found by bisection on a log scale,
# capacities of two significant digits, within 2 points of the target).
#   bench_tenants.sh [TRACE...]     (default: both traces of ../shared/traces)
# KVS_BENCH_TENANTS=N, KVS_BUILD; KVS_BENCH_QUICK=1: the synthetic trace only.
set -eu
build=${KVS_BUILD:-build}
tenants=${KVS_BENCH_TENANTS:-2}
traces=("$@")
if [ ${#traces[@]} = 0 ]; then
  traces=(../shared/traces/conversation_trace.jsonl ../shared/traces/synthetic_trace.jsonl)
  [ -n "${KVS_BENCH_QUICK:-}" ] && traces=(../shared/traces/synthetic_trace.jsonl)
fi
for t in "${traces[@]}"; do
  [ -r "$t" ] || { echo "bench_tenants: $t not found, skipped"; exit 0; }
done
[ -x "$build/kvshare-replay" ] || { echo "bench_tenants: $build/kvshare-replay not built"; exit 1; }
python3 - "$build/kvshare-replay" "$tenants" "${traces[@]}" <<'PY'
import json, math, os, subprocess, sys

replay, tenants, traces = sys.argv[1], int(sys.argv[2]), sys.argv[3:]


def run(trace, cap, n):
    args = [replay, trace, "--json", "--no-progress",
            "--capacity-tokens", str(cap) if cap else "unlimited"]
    if n > 1:
        args += ["--tenants", str(n)]
    return json.loads(subprocess.run(args, check=True, capture_output=True,
                                     text=True).stdout)


def tokens(x):  # 1450000 -> "1.45e6", 3000000 -> "3e6"
    m, e = ("%.2e" % x).split("e")
    return "%se%d" % (m.rstrip("0").rstrip("."), int(e))


def two_digits(x):
    e = 10 ** (math.floor(math.log10(x)) - 1)
    return int(round(x / e) * e)


def find(trace, unl, target, top, cache):
    """The capacity whose 1-tenant hit rate is nearest target * unl."""
    lo, hi, best = math.log10(1e5), math.log10(top), None
    for _ in range(10):
        cap = two_digits(10 ** ((lo + hi) / 2))
        if cap not in cache:
            cache[cap] = run(trace, cap, 1)
        frac = cache[cap]["token_hit_rate"] / unl
        if best is None or abs(frac - target) < abs(best[1] - target):
            best = (cap, frac)
        if abs(frac - target) <= 0.02:
            break
        if frac < target:
            lo = math.log10(cap)
        else:
            hi = math.log10(cap)
    return best[0]


print("token hit rate, 1 tenant against %d (users split, an equal share "
      "each of the same capacity), policy slru" % tenants)
print("%-13s %10s %16s %10s %7s  %s" % ("trace", "capacity", "1 tenant",
                                        "%d tenants" % tenants, "ratio",
                                        "each tenant (share)"))
for trace in traces:
    name = os.path.basename(trace).replace("_trace.jsonl", "")
    one = run(trace, 0, 1)
    unl = one["token_hit_rate"]
    top = one["unlimited_blocks"] * one["block_size"]
    cache = {}
    rows = [(0, one)]
    for target in (0.5, 0.8):
        cap = find(trace, unl, target, top, cache)
        rows.append((cap, cache[cap]))
    for cap, a in rows:
        b = run(trace, cap, tenants)
        each = ", ".join("%.4f (%s)" % (y["token_hit_rate"],
                                        tokens(y["capacity_tokens"]) if cap
                                        else "its records")
                         for y in b["tenants"])
        print("%-13s %10s %8.4f (%3.0f%%) %10.4f %7.4f  %s"
              % (name, tokens(cap) if cap else "unlimited",
                 a["token_hit_rate"], 100 * a["token_hit_rate"] / unl,
                 b["token_hit_rate"],
                 b["token_hit_rate"] / a["token_hit_rate"], each))
    print("%-13s key depth %d (auto), tenants' requests %s"
          % ("", b["tenant_key_depth"],
             " / ".join(str(y["requests"]) for y in b["tenants"])))
PY
