#!/bin/bash
# test_replay_tenants — `kvshare-replay --tenants N` (tools/replay/
# replay_tenants.c) against a plain Python model (tests/bench/lru_sim.py:
# a cache per tenant, users routed as the replayer routes them) on small
# generated traces: at unlimited capacity a block is a hit when the same
# tenant has seen it before; at a bounded capacity, with --policy lru, each
# tenant is an LRU pool of capacity / N.  Every tenant's counts must be
# equal.  Then: --tenants 1 is today's replay, output for output; --sweep
# gives the single runs' totals; tiers are split too; options and errors.
# Needs $KVS_BUILD (set by run-tests.sh; under the sanitizer build every
# replay here must exit 0: no leak, no error) and python3.  Exit 0 pass,
# 77 skip, 1 fail.
set -u
build=${KVS_BUILD:-build}
bin=$build/kvshare-replay
here=$(cd "$(dirname "$0")" && pwd)
sim=$here/../bench/lru_sim.py
fail() { echo "FAIL: $*"; exit 1; }
[ -x "$bin" ] || fail "$bin not built"
py=$(command -v /usr/bin/python3 || command -v python3) ||
  { echo "skipped: python3 not found"; exit 77; }
tmp=$(mktemp -d) || fail "mktemp"
trap 'rm -rf "$tmp"' EXIT

# Two traces of 1000 requests: as generated (system prompts of their own:
# the key is the first hash id), and the same behind one block every
# record shares, as the conversation trace opens (the key: the id after).
gen=$tmp/gen.jsonl
root=$tmp/root.jsonl
"$py" "$here/../bench/gen_trace.py" --requests 1000 --seed 5 >"$gen" ||
  fail "gen_trace"
"$py" - "$gen" "$root" <<'PY' || fail "the shared-root trace"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
top = 1 + max(i for r in recs for i in r["hash_ids"])
with open(sys.argv[2], "w") as f:
    for r in recs:
        r["hash_ids"] = [top] + r["hash_ids"]
        r["input_length"] += 512
        f.write(json.dumps(r) + "\n")
PY

# One configuration: the replayer's JSON (exit 0) against the model's.
check() {
  local name=$1 trace=$2; shift 2
  "$bin" --trace "$trace" --json --no-progress "$@" >"$tmp/$name.c.json" \
    2>"$tmp/$name.err" || fail "$name: replay exits $?: $(cat "$tmp/$name.err")"
  local args=()
  while [ $# -gt 0 ]; do  # the model takes no --policy
    case $1 in --policy) shift 2 ;; *) args+=("$1"); shift ;; esac
  done
  "$py" "$sim" "$trace" --json "${args[@]}" >"$tmp/$name.m.json" ||
    fail "$name: the model exits $?"
  "$py" - "$tmp/$name" <<'PY' || fail "$name: replayer and model differ"
import json, sys
c = json.load(open(sys.argv[1] + ".c.json"))
m = json.load(open(sys.argv[1] + ".m.json"))
assert len(c["tenants"]) == len(m["tenants"]), (len(c["tenants"]), m)
for k, (x, y) in enumerate(zip(m["tenants"], c["tenants"])):
    for f in ("requests", "refused", "query_tokens", "hit_tokens"):
        assert x[f] == y[f], ("tenant", k, f, x[f], y[f])
    if m["tenant_blocks"]:
        assert y["num_blocks"] == m["tenant_blocks"], (k, y, m)
for f in ("query_tokens", "hit_tokens"):  # the total is the sum
    assert c[f] == m[f] == sum(y[f] for y in c["tenants"]), f
print("%s: %.4f over %d tenants (%s), equal to the model"
      % (sys.argv[1].rsplit("/", 1)[1], c["token_hit_rate"],
         len(c["tenants"]),
         ", ".join("%.4f" % y["token_hit_rate"] for y in c["tenants"])))
PY
}

for n in 2 3 4; do
  check "gen-u$n" "$gen" --tenants $n
  check "root-u$n" "$root" --tenants $n
done
check gen-u16 "$gen" --tenants 16 --block-size 64
check root-k1 "$root" --tenants 2 --tenant-key 1  # one user: one tenant
check root-k3 "$root" --tenants 3 --tenant-key 3
# Bounded: LRU pools of capacity / N (block size 64 keeps the model fast;
# the trace has ~6e6 tokens of distinct blocks).  2e4 tokens = 312 blocks,
# 104 a tenant: the longest prompts are refused (all-miss).
for n in 2 3 4; do
  check "gen-b$n" "$gen" --tenants $n --capacity-tokens 4e5 --policy lru --block-size 64
  check "root-b$n" "$root" --tenants $n --capacity-tokens 4e5 --policy lru --block-size 64
done
check refused "$gen" --tenants 3 --capacity-tokens 2e4 --policy lru --block-size 64

"$py" - "$tmp" <<'PY' || fail "what holds whatever the model"
import json, sys
d = sys.argv[1] + "/"
j = lambda n: json.load(open(d + n + ".c.json"))
# Unlimited: nothing evicted; every tenant at its records' ideal.  Users
# keyed by their first id share no block (ids are chained): the tenants
# together hit what one cache does.  Behind a shared block, each tenant
# writes that block once: every tenant but the first to run misses it.
for n in (2, 3, 4):
    g, r = j("gen-u%d" % n), j("root-u%d" % n)
    for x in (g, r):
        assert x["evictions"] == 0 and x["unlimited"] is True, x
        assert x["tenant_key_auto"] is True
        for y in x["tenants"]:
            assert y["token_hit_rate"] == y["ideal_token_hit_rate"], y
            assert y["evictions"] == 0
        assert x["token_hit_rate"] == x["tenants_ideal_token_hit_rate"]
    assert g["tenant_key_depth"] == 1 and r["tenant_key_depth"] == 2
    assert g["hit_tokens"] == round(g["ideal_token_hit_rate"] * g["query_tokens"])
    one = round(r["ideal_token_hit_rate"] * r["query_tokens"])
    used = sum(1 for y in r["tenants"] if y["requests"])
    assert r["hit_tokens"] == one - (used - 1) * 512, (n, r["hit_tokens"], one)
k1 = j("root-k1")
assert k1["tenant_key_depth"] == 1 and k1["tenant_key_auto"] is False
assert sorted(y["requests"] for y in k1["tenants"]) == [0, 1000], k1
# Bounded: each tenant's pool is its share; evictions; refusals counted.
for n in (2, 3, 4):
    b = j("gen-b%d" % n)
    assert b["capacity_tokens"] == 400000 // 64 // n * 64 * n, b
    assert all(y["capacity_tokens"] == 400000 // 64 // n * 64 for y in b["tenants"])
    assert b["evictions"] > 0 and b["hit_tokens"] < j("gen-u%d" % n)["hit_tokens"]
f = j("refused")
assert f["refused"] > 0 and f["refused"] == sum(y["refused"] for y in f["tenants"])
PY

# --tenants 1 is today's replay: the same output but the wall time, text
# and JSON, bounded and unlimited, and `kvshared replay` too.
for cap in 2e5 unlimited; do
  "$bin" "$gen" --capacity-tokens $cap --no-progress | grep -v '^time ' \
    >"$tmp/plain.txt" || fail "plain text exits $?"
  "$bin" "$gen" --capacity-tokens $cap --tenants 1 --no-progress |
    grep -v '^time ' >"$tmp/one.txt" || fail "--tenants 1 text exits $?"
  cmp -s "$tmp/plain.txt" "$tmp/one.txt" ||
    fail "--tenants 1 text differs ($cap): $(diff "$tmp/plain.txt" "$tmp/one.txt")"
  "$bin" "$gen" --capacity-tokens $cap --json --no-progress >"$tmp/plain.json" ||
    fail "plain JSON exits $?"
  "$bin" "$gen" --capacity-tokens $cap --json --tenants 1 --no-progress \
    >"$tmp/one.json" || fail "--tenants 1 JSON exits $?"
  # One tenant of 100% runs the tenants' code: the same totals.
  "$bin" "$gen" --capacity-tokens $cap --json --tenant-shares 100 --no-progress \
    >"$tmp/full.json" || fail "--tenant-shares 100 exits $?"
  "$py" - "$tmp" <<'PY' || fail "--tenants 1 JSON differs ($cap)"
import json, sys
d = sys.argv[1] + "/"
p, o, f = (json.load(open(d + n)) for n in ("plain.json", "one.json", "full.json"))
for r in (p, o, f):
    del r["seconds"]
assert p == o, [(k, p[k], o.get(k)) for k in p if p[k] != o.get(k)]
assert "tenants" not in o
assert len(f.pop("tenants")) == 1
for k in ("tenant_key_depth", "tenant_key_auto", "tenants_ideal_token_hit_rate"):
    f.pop(k)
assert p == f, [(k, p[k], f.get(k)) for k in p if p[k] != f.get(k)]
PY
done

# --sweep over tenants: each cell is the single run's total.
"$bin" "$gen" --tenants 3 --sweep 2e5,unlimited --policy lru,slru --json \
  --no-progress >"$tmp/sweep.json" || fail "sweep exits $?"
for p in lru slru; do
  "$bin" "$gen" --tenants 3 --capacity-tokens 2e5 --policy $p --json \
    --no-progress >"$tmp/single-$p.json" || fail "single $p exits $?"
done
"$py" - "$tmp" <<'PY' || fail "sweep over tenants"
import json, sys
d = sys.argv[1] + "/"
s = json.load(open(d + "sweep.json"))
assert s["tenant_count"] == 3 and s["tenant_key_depth"] == 1, s
runs = {(r["capacity_tokens"], r["policy"]): r for r in s["runs"]}
for p in ("lru", "slru"):
    one = json.load(open(d + "single-%s.json" % p))
    assert runs[(200000, p)]["token_hit_rate"] == one["token_hit_rate"], p
    assert runs[(0, p)]["token_hit_rate"] == s["ideal_token_hit_rate"], p
PY
"$bin" "$gen" --tenants 2 --sweep 2e5 --no-progress | grep -q "^2 tenants, a partition each" ||
  fail "sweep text: no tenants line"

# Tiers: each tenant a share of each tier; shares.
"$bin" "$gen" --tenant-shares 60,40 --capacity-tokens 2e5 --host-tier-tokens 1e6 \
  --json --no-progress >"$tmp/tier.json" || fail "tiered tenants exit $?"
"$bin" "$gen" --tenant-shares 60,40 --capacity-tokens 2e5 --json --no-progress \
  >"$tmp/flat.json" || fail "tenants without tiers exit $?"
"$py" - "$tmp/tier.json" "$tmp/flat.json" <<'PY' || fail "tiers and shares"
import json, sys
t, f = (json.load(open(x)) for x in sys.argv[1:])
assert [y["capacity_tokens"] for y in t["tenants"]] == [120000, 80000], t["tenants"]
assert [y["host_tier_tokens"] for y in t["tenants"]] == [600000, 400000]
assert [y["share_percent"] for y in t["tenants"]] == [60, 40]
assert t["host_tier_tokens"] == 1000000 and t["host_hit_tokens"] > 0, t
assert t["host_hit_tokens"] == sum(y["host_hit_tokens"] for y in t["tenants"])
assert t["hit_tokens"] > f["hit_tokens"], (t["hit_tokens"], f["hit_tokens"])
assert t["tier_lost"] == 0
PY

# Text output and the progress bar (one bar over every record).
"$bin" "$gen" --tenants 3 --capacity-tokens 2e5 --host-tier-tokens 1e6 \
  --progress >"$tmp/t.txt" 2>"$tmp/t.err" || fail "text run exits $?"
cat "$tmp/t.txt"
for f in "^token hit rate" "in the tenants' partitions" "^tenants         3, a partition each" \
         "depth 1 (auto)" "mix(that id) mod 3" "host tokens" "^0 " "^2 " "^total "; do
  grep -q -- "$f" "$tmp/t.txt" || fail "text output lacks '$f'"
done
[ "$(grep -c "100% 1000/1000" "$tmp/t.err")" = 1 ] || fail "progress: $(head -c 300 "$tmp/t.err")"

# Options.
"$bin" --help >"$tmp/help" || fail "--help exits $?"
for f in "--tenants N" "--tenant-key" "--tenant-shares" "same hash" "mix(that id)"; do
  grep -q -- "$f" "$tmp/help" || fail "--help lacks '$f'"
done
for bad in "--tenants 0" "--tenants 17" "--tenants x" "--tenant-key 2" \
           "--tenants 2 --tenant-key 0" "--tenant-shares 60,50" \
           "--tenants 3 --tenant-shares 60,40" "--tenants 2 --tenant-shares 10,20,30" \
           "--tenant-shares 0" "--tenants 2 --nodes 2" \
           "--tenants 2 --remote-tier-tokens 1e6" "--tenants 2 --split prefix"; do
  # shellcheck disable=SC2086
  "$bin" --trace "$gen" $bad --no-progress >/dev/null 2>"$tmp/err"
  [ $? = 2 ] || fail "'$bad': want exit 2"
  [ -s "$tmp/err" ] || fail "'$bad': no message"
done
"$bin" "$gen" --tenants 2 --nodes 2 --no-progress 2>"$tmp/err"
grep -q "do not go with --nodes" "$tmp/err" || fail "--tenants --nodes: $(cat "$tmp/err")"
"$bin" "$gen" --tenants 16 --capacity-tokens 100 --no-progress >/dev/null 2>"$tmp/err"
[ $? = 1 ] || fail "a tenant of 0 blocks: want exit 1"
grep -q "tenant 0 gets 0 blocks" "$tmp/err" || fail "0 blocks: $(cat "$tmp/err")"
echo "ok"
