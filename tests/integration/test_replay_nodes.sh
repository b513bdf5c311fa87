#!/bin/bash
# test_replay_nodes — `kvshare-replay --nodes N --remote-tier-tokens R`
# (tools/replay/replay_nodes.c) against an independent model of N LRU pools
# and a shared LRU store (tests/bench/replay_nodes_ref.py), on a small
# generated trace (tests/bench/gen_trace.py): per node and for the store,
# every count must be equal.  Then what must hold whatever the model: an
# unlimited store gives every node at least its figure alone and the whole
# trace exactly the hits of one unlimited cache; no store means no remote
# hits, and one node without a store is the plain replay.  Options and
# errors last.  Needs $KVS_BUILD (set by run-tests.sh; under the sanitizer
# build every replay here must exit 0: no leak, no error) and python3.
# Exit 0 pass, 77 skip, 1 fail.
set -u
build=${KVS_BUILD:-build}
bin=$build/kvshare-replay
here=$(cd "$(dirname "$0")" && pwd)
ref=$here/../bench/replay_nodes_ref.py
fail() { echo "FAIL: $*"; exit 1; }
[ -x "$bin" ] || fail "$bin not built"
py=$(command -v /usr/bin/python3 || command -v python3) ||
  { echo "skipped: python3 not found"; exit 77; }
tmp=$(mktemp -d) || fail "mktemp"
trap 'rm -rf "$tmp"' EXIT

trace=$tmp/t.jsonl
"$py" "$here/../bench/gen_trace.py" --requests 1000 --seed 5 >"$trace" ||
  fail "gen_trace"

# One configuration: the replayer's JSON (exit 0) against the model's.
# Block size 64 keeps the model fast; 1e5 tokens per node evicts, and so
# does a store of 5e5 or 1e6 (the trace has ~6e6 tokens of distinct blocks).
check() {
  local name=$1; shift
  "$bin" --trace "$trace" --policy lru --block-size 64 --json \
    --no-progress "$@" >"$tmp/$name.c.json" 2>"$tmp/$name.err" ||
    fail "$name: replay exits $?: $(cat "$tmp/$name.err")"
  "$py" "$ref" "$trace" --block-size 64 "$@" >"$tmp/$name.ref.json" ||
    fail "$name: the model exits $?"
  "$py" - "$tmp/$name" <<'PY' || fail "$name: replayer and model differ"
import json, sys
c = json.load(open(sys.argv[1] + ".c.json"))
m = json.load(open(sys.argv[1] + ".ref.json"))
keys = ("requests", "refused", "query_tokens", "hit_tokens",
        "remote_hit_tokens")
for run in ("alone", "shared"):
    if m[run] is None:
        assert c[run] is None, (run, "the replayer ran a store")
        continue
    for k, (x, y) in enumerate(zip(m[run]["per_node"], c[run]["per_node"])):
        for f in keys:
            assert x[f] == y[f], (run, "node", k, f, x[f], y[f])
    assert len(m[run]["per_node"]) == len(c[run]["per_node"]) == c["nodes"]
    for f in keys:  # the total is the sum
        assert c[run][f] == sum(y[f] for y in c[run]["per_node"]), (run, f)
    if m[run]["store"] is not None:
        for f, v in m[run]["store"].items():
            assert c[run]["store"][f] == v, (run, "store", f, v,
                                             c[run]["store"][f])
print("%s: alone %.4f, shared %.4f (remote %.4f), equal to the model"
      % (sys.argv[1].rsplit("/", 1)[1], c["alone"]["token_hit_rate"],
         c["shared"]["token_hit_rate"] if c["shared"] else 0,
         c["shared"]["remote_hit_tokens"] / c["query_tokens"]
         if c["shared"] else 0))
PY
}

check rr4 --nodes 4 --capacity-tokens 1e5 --remote-tier-tokens 1e6
check prefix3 --nodes 3 --split prefix --capacity-tokens 1e5 --remote-tier-tokens 5e5
# 2e4 tokens = 312 blocks: the longest prompts are refused (all-miss).
check refused --nodes 4 --split prefix:2 --capacity-tokens 2e4 --remote-tier-tokens 1e6
check one --nodes 1 --capacity-tokens 1e5 --remote-tier-tokens 1e6
check unlimited --nodes 4 --capacity-tokens 1e5 --remote-tier-tokens unlimited
check none --nodes 4 --capacity-tokens 1e5 --remote-tier-tokens 0

# An unlimited store holds every block sealed so far: each node hits at
# least what it does alone (here on every record), and the whole trace hits
# exactly what one unlimited cache does (records run one at a time: the
# store has every earlier block).
"$py" - "$tmp/unlimited.c.json" "$tmp/refused.c.json" <<'PY' || fail "unlimited store"
import json, sys
u = json.load(open(sys.argv[1]))
assert u["remote_unlimited"] is True and u["shared"]["store"]["drops"] == 0
for a, s in zip(u["alone"]["per_node"], u["shared"]["per_node"]):
    assert s["hit_tokens"] >= a["hit_tokens"], (a, s)
    assert s["hit_tokens"] - s["remote_hit_tokens"] == a["hit_tokens"], (a, s)
ideal = round(u["ideal_token_hit_rate"] * u["query_tokens"])
assert u["shared"]["hit_tokens"] == ideal, (u["shared"]["hit_tokens"], ideal)
assert u["gain"] > 0
r = json.load(open(sys.argv[2]))
assert r["alone"]["refused"] > 0 and r["shared"]["refused"] == r["alone"]["refused"]
PY

# No store: no remote hits, no shared run.  One node without a store is the
# plain replay, count for count (default policy and lru, block size 16).
"$py" - "$tmp/none.c.json" <<'PY' || fail "no store"
import json, sys
n = json.load(open(sys.argv[1]))
assert n["shared"] is None and n["gain"] == 0 and n["remote_tier_tokens"] == 0
assert all(x["remote_hit_tokens"] == 0 for x in n["alone"]["per_node"])
PY
for p in slru lru; do
  "$bin" --trace "$trace" --policy $p --capacity-tokens 1e5 --json \
    --no-progress >"$tmp/plain-$p.json" || fail "plain $p exits $?"
  "$bin" "$trace" --policy $p --capacity-tokens 1e5 --nodes 1 --json \
    --no-progress >"$tmp/n1-$p.json" || fail "--nodes 1 $p exits $?"
  "$py" - "$tmp/plain-$p.json" "$tmp/n1-$p.json" <<'PY' || fail "--nodes 1 against the plain replay ($p)"
import json, sys
p = json.load(open(sys.argv[1]))
n = json.load(open(sys.argv[2]))
a = n["alone"]
assert n["shared"] is None and n["nodes"] == 1 and n["split"] == "rr"
for f in ("requests", "served", "refused", "query_tokens", "hit_tokens",
          "evictions", "host_hit_tokens", "disk_hit_tokens"):
    assert a[f] == p[f], (f, a[f], p[f])
assert a["token_hit_rate"] == p["token_hit_rate"]
assert n["ideal_token_hit_rate"] == p["ideal_token_hit_rate"]
assert a["per_node"][0]["hit_tokens"] == p["hit_tokens"]
PY
done

# Text output, with the lower tiers on (the core's other promotions), and
# the progress bar (two runs).
"$bin" "$trace" --nodes 2 --capacity-tokens 5e4 --host-tier-tokens 5e4 \
  --remote-tier-tokens 1e6 --split prefix --block-size 64 --progress \
  >"$tmp/t.txt" 2>"$tmp/t.err" ||
  fail "text run exits $?: $(cat "$tmp/t.err")"
cat "$tmp/t.txt"
for f in "nodes           2, split prefix" "host tier" "remote tier     1000000 tokens" \
         "alone" "shared" "remote      gain" "^total " "remote store" "time "; do
  grep -q -- "$f" "$tmp/t.txt" || fail "text output lacks '$f'"
done
[ "$(grep -c "100% 1000/1000" "$tmp/t.err")" = 2 ] || fail "progress: $(head -c 300 "$tmp/t.err")"

# Options.
"$bin" --help | grep -q -- "--remote-tier-tokens" || fail "--help lacks --remote-tier-tokens"
for bad in "--nodes 0" "--nodes x" "--nodes 2000" "--split foo" "--split prefix:0" \
           "--remote-tier-tokens -1" "--remote-tier-tokens 1.5" \
           "--nodes 2 --sweep 1e5" "--nodes 2 --policy lru,slru"; do
  # shellcheck disable=SC2086
  "$bin" --trace "$trace" $bad --no-progress >/dev/null 2>&1
  [ $? = 2 ] || fail "'$bad': want exit 2"
done
"$bin" --trace "$trace" --nodes 2 --remote-tier-tokens 8 --no-progress \
  >/dev/null 2>"$tmp/err"; [ $? = 1 ] || fail "a store under one block: want exit 1"
grep -q "remote tier of 8 tokens" "$tmp/err" || fail "small store: $(cat "$tmp/err")"
echo "ok"
