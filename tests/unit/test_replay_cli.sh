#!/bin/bash
# kvshare-replay from the command line: options, errors, text and JSON
# output, the progress bar; then `kvshared replay`, the alias that execs the
# kvshare-replay beside kvshared.  Needs $KVS_BUILD (set by run-tests.sh),
# python3 and ../shared/traces (skips without them).  Exit 0 pass, 77 skip,
# 1 fail.
set -u
build=${KVS_BUILD:-build}
bin=$build/kvshare-replay
daemon=$build/kvshared
trace=../shared/traces/synthetic_trace.jsonl
fail() { echo "FAIL: $*"; exit 1; }
[ -x "$bin" ] || fail "$bin not built"
[ -x "$daemon" ] || fail "$daemon not built"
[ -r "$trace" ] || { echo "skipped: $trace not found"; exit 77; }
command -v python3 >/dev/null || { echo "skipped: python3 not found"; exit 77; }
tmp=$(mktemp -d) || fail "mktemp"
trap 'rm -rf "$tmp"' EXIT

"$bin" --help >"$tmp/help" || fail "--help exits $?"
grep -q -- "--capacity-tokens" "$tmp/help" || fail "--help lacks --capacity-tokens"
"$bin" --capacity-tokens 1e6 2>/dev/null; [ $? = 2 ] || fail "no --trace: want exit 2"
"$bin" --trace "$trace" --capacity-tokens 1.5 2>/dev/null; [ $? = 2 ] || fail "bad capacity: want exit 2"
"$bin" --trace "$trace" --block-size 0 2>/dev/null; [ $? = 2 ] || fail "block size 0: want exit 2"
"$bin" --trace "$trace" --capacity-tokens 8 --no-progress >/dev/null 2>&1
[ $? = 1 ] || fail "a pool of 0 blocks: want exit 1"
"$bin" --trace "$tmp/none" --no-progress 2>"$tmp/err"; [ $? = 1 ] || fail "missing trace: want exit 1"
[ "$(cat "$tmp/err")" = "kvshare-replay: $tmp/none: No such file or directory" ] ||
  fail "missing trace (the reason once): $(cat "$tmp/err")"

# Unlimited: JSON, hit rate equal to the ideal, nothing evicted.
"$bin" --trace "$trace" --limit 300 --json --no-progress >"$tmp/u.json" \
  || fail "unlimited replay exits $?"
python3 - "$tmp/u.json" <<'PY' || fail "unlimited JSON"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["records"] == 300 and r["served"] == 300 and r["refused"] == 0, r
assert r["unlimited"] is True and r["evictions"] == 0, r
assert abs(r["token_hit_rate"] - r["ideal_token_hit_rate"]) < 0.01, r
assert r["peak_resident_blocks"] <= r["num_blocks"], r
PY

# Bounded, with the progress bar forced on: text output and a bar on stderr.
"$bin" --trace "$trace" --limit 300 --capacity-tokens 1e5 --policy lru \
  --block-size 16 --progress >"$tmp/b.txt" 2>"$tmp/b.err" || fail "bounded replay exits $?"
for f in "token hit rate" "block hit rate" "allocations" "evictions" "refused"; do
  grep -q "$f" "$tmp/b.txt" || fail "text output lacks '$f'"
done
grep -q "100% 300/300" "$tmp/b.err" || fail "no progress bar: $(head -c 300 "$tmp/b.err")"
"$bin" --trace "$trace" --limit 50 --policy no-such-policy --no-progress \
  >/dev/null 2>"$tmp/err"; [ $? = 2 ] || fail "unknown policy: want exit 2"
grep -q "lru, slru, mq, opt" "$tmp/err" || fail "unknown policy: $(cat "$tmp/err")"
# Messages name the program, getopt's too, whatever argv[0] is (a path, or
# "replay" as the daemon's subcommand once gave it).
for argv0 in "$bin" replay; do
  (exec -a "$argv0" "$bin" --no-such-option) >/dev/null 2>"$tmp/err"
  [ $? = 2 ] || fail "unknown option (argv[0] $argv0): want exit 2"
  [ "$(head -n 1 "$tmp/err")" = "kvshare-replay: bad option '--no-such-option'" ] ||
    fail "unknown option (argv[0] $argv0): $(cat "$tmp/err")"
done
"$bin" --trace 2>"$tmp/err"; [ $? = 2 ] || fail "--trace without a value: want exit 2"
grep -q "^kvshare-replay: --trace needs a value" "$tmp/err" || fail "--trace: $(cat "$tmp/err")"
"$bin" --trace "$trace" --plot "$tmp/x.png" 2>/dev/null; [ $? = 2 ] || fail "--plot without --sweep: want exit 2"
"$bin" --trace "$trace" --sweep 1e5,x 2>/dev/null; [ $? = 2 ] || fail "bad --sweep: want exit 2"
"$bin" --trace "$trace" --policy , 2>/dev/null; [ $? = 2 ] || fail "empty --policy: want exit 2"
"$bin" --trace "$trace" --skip 5000 --no-progress 2>"$tmp/err"; [ $? = 1 ] || fail "skip all: want exit 1"
grep -q "no records left" "$tmp/err" || fail "skip all: $(cat "$tmp/err")"

# A sweep: every policy at three capacities, against the figures of single
# runs, and opt (which reads the future) never below any online policy nor
# above the ideal; then the same as a plot.
"$bin" --trace "$trace" --limit 600 --sweep 2e5,5e5,unlimited \
  --policy lru,slru,mq,opt --json --no-progress >"$tmp/s.json" || fail "sweep exits $?"
for p in lru slru; do
  "$bin" --trace "$trace" --limit 600 --capacity-tokens 5e5 --policy $p \
    --json --no-progress >"$tmp/one-$p.json" || fail "single $p exits $?"
done
python3 - "$tmp" <<'PY' || fail "sweep JSON"
import json, sys
d = sys.argv[1]
s = json.load(open(d + "/s.json"))
runs = {(r["capacity_tokens"], r["policy"]): r for r in s["runs"]}
assert len(runs) == 12, runs.keys()
for p in ("lru", "slru"):
    one = json.load(open(d + "/one-%s.json" % p))
    assert one["policy"] == p
    assert runs[(500000, p)]["token_hit_rate"] == one["token_hit_rate"], (p, one)
for cap in (200000, 500000):
    opt = runs[(cap, "opt")]["token_hit_rate"]
    for p in ("lru", "slru", "mq"):
        assert opt >= runs[(cap, p)]["token_hit_rate"], (cap, p, opt)
    assert opt <= s["ideal_token_hit_rate"] + 1e-9
for p in ("lru", "slru", "mq", "opt"):  # unlimited: nothing evicted, all equal
    assert abs(runs[(0, p)]["token_hit_rate"] - s["ideal_token_hit_rate"]) < 0.01, p
PY
"$bin" --trace "$trace" --plot-script "$tmp/p.gp" --sweep 1e5 2>/dev/null
[ $? = 2 ] || fail "--plot-script without --plot: want exit 2"
# The plot's script (kept by --plot-script, written before gnuplot runs):
# the ideal as a line, y from 0 to 100 %, a log x axis with 1-2-5 tics.
"$bin" --trace "$trace" --limit 300 --sweep 1e5,3e5,unlimited --policy lru,slru \
  --plot "$tmp/p.png" --plot-script "$tmp/p.gp" --no-progress --json >"$tmp/p.json"
prc=$?
python3 - "$tmp/p.gp" "$tmp/p.json" <<'PY' || fail "the plot's script"
import json, re, sys
gp = open(sys.argv[1]).read()
ideal = json.load(open(sys.argv[2]))["ideal_token_hit_rate"]
lines = gp.splitlines()
assert "set logscale x 10" in lines, gp
assert "set yrange [0:100]" in lines, gp
xt = [l for l in lines if l.startswith("set xtics (")][0]
for lab in ("100k", "200k", "500k", "1M", "2M"):
    assert '"%s"' % lab in xt, (lab, xt)
assert re.search(r'"" 300000 1', xt), xt  # the other digits: minor tics
plot = [l for l in lines if l.startswith("plot ")][0]
assert plot.count("with linespoints") == 2, plot
m = re.search(r", ([\d.]+) with lines dashtype 2 .*title \"ideal \(unlimited cache\): ([\d.]+)%\"$", plot)
assert m, plot
assert abs(float(m.group(1)) - 100 * ideal) < 0.01, (m.group(1), ideal)
data = gp.split("$sweep << EOD\n")[1].split("EOD\n")[0].splitlines()
assert len(data) == 3 and all(0 <= float(v) <= 100 for l in data for v in l.split()[1:]), data
PY
if command -v gnuplot >/dev/null; then
  [ $prc = 0 ] || fail "plot exits $prc"
  "$bin" --trace "$trace" --limit 300 --sweep 1e5,3e5 --policy lru,slru \
    --plot "$tmp/p.png" --no-progress >"$tmp/p.txt" || fail "plot exits $?"
  grep -q "slru" "$tmp/p.txt" || fail "sweep table lacks slru"
  [ "$(head -c 8 "$tmp/p.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] \
    || fail "--plot did not write a PNG"
else
  echo "note: gnuplot not installed, --plot not tested"
fi
# The daemon refuses the offline policy with the reason.
"$daemon" --policy opt --socket "$tmp/s" 2>"$tmp/err" </dev/null; [ $? != 0 ] || fail "daemon took --policy opt"
grep -q "replayer only" "$tmp/err" || fail "daemon --policy opt: $(cat "$tmp/err")"

# Tiers: options, per-tier hits in text and JSON.
"$bin" --trace "$trace" --host-tier-tokens 0 2>/dev/null; [ $? = 2 ] || fail "host tier 0: want exit 2"
"$bin" --trace "$trace" --disk-tier-tokens x 2>/dev/null; [ $? = 2 ] || fail "bad disk tier: want exit 2"
"$bin" --trace "$trace" --limit 1000 --capacity-tokens 1e5 --host-tier-tokens 2e5 \
  --disk-tier-tokens 1e6 --no-progress >"$tmp/t.txt" || fail "tiered replay exits $?"
for f in "host tier" "disk tier" "recomputed"; do
  grep -q "$f" "$tmp/t.txt" || fail "tiered text output lacks '$f'"
done
"$bin" --trace "$trace" --limit 1000 --capacity-tokens 1e5 --host-tier-tokens 2e5 \
  --disk-tier-tokens 1e6 --json --no-progress >"$tmp/t.json" || fail "tiered JSON exits $?"
"$bin" --trace "$trace" --limit 1000 --capacity-tokens 1.3e6 --json --no-progress \
  >"$tmp/f.json" || fail "flat JSON exits $?"
python3 - "$tmp/t.json" "$tmp/f.json" <<'PY' || fail "tiered JSON"
import json, sys
t = json.load(open(sys.argv[1])); f = json.load(open(sys.argv[2]))
assert t["host_tier_tokens"] == 200000 and t["host_hit_tokens"] > 0, t
assert t["disk_hit_tokens"] + t["host_hit_tokens"] <= t["hit_tokens"], t
assert t["tier_lost"] == 0, t
assert abs(t["token_hit_rate"] - f["token_hit_rate"]) <= 0.01, (t, f)
PY
# `kvshared replay ARGS` is `kvshare-replay ARGS`: the same output (but the
# wall time), exit status and messages.
"$daemon" replay --help | grep -q -- "^usage: kvshare-replay " || fail "kvshared replay --help"
"$daemon" replay --trace "$trace" --limit 300 --capacity-tokens 1e5 --json \
  --no-progress >"$tmp/alias.json" || fail "kvshared replay exits $?"
"$bin" --trace "$trace" --limit 300 --capacity-tokens 1e5 --json \
  --no-progress >"$tmp/direct.json" || fail "kvshare-replay exits $?"
python3 - "$tmp/alias.json" "$tmp/direct.json" <<'PY' || fail "kvshared replay and kvshare-replay differ"
import json, sys
a, d = (json.load(open(f)) for f in sys.argv[1:])
for r in (a, d):
    del r["seconds"]
assert a == d, (a, d)
assert a["records"] == 300 and a["evictions"] > 0, a
PY
"$daemon" replay --capacity-tokens 1e6 2>"$tmp/err"; [ $? = 2 ] || fail "kvshared replay, no --trace: want exit 2"
grep -q "^kvshare-replay: --trace FILE is required" "$tmp/err" ||
  fail "kvshared replay, no --trace: $(cat "$tmp/err")"
# kvshared finds kvshare-replay in its own folder, not the caller's nor the
# link's: through a symbolic link elsewhere it runs; copied alone into a
# folder it says what is missing and exits non-zero.
mkdir "$tmp/link" "$tmp/alone" || fail "mkdir"
ln -s "$(cd "$build" && pwd)/kvshared" "$tmp/link/kvshared" || fail "ln"
"$tmp/link/kvshared" replay --help >/dev/null || fail "kvshared replay through a link exits $?"
cp "$daemon" "$tmp/alone/kvshared" || fail "cp"
"$tmp/alone/kvshared" replay --help >"$tmp/out" 2>"$tmp/err"; rc=$?
[ $rc != 0 ] || fail "kvshared replay without kvshare-replay exits 0"
[ -s "$tmp/out" ] && fail "kvshared replay without kvshare-replay printed: $(cat "$tmp/out")"
grep -q "cannot run .*/alone/kvshare-replay: No such file" "$tmp/err" ||
  fail "kvshared replay without kvshare-replay: $(cat "$tmp/err")"
echo "ok"
