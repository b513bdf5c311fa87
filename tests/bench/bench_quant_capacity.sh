#!/bin/bash
# Quantized KV: what the same bytes hold.  For each trace, the token hit
# rate of fp16, int8 and fp8 pools of the same bytes (kvshare-replay
# --capacity-bytes, default layout: 32 layers, 8 kv heads, head dim 128,
# block size 16), slru, all in this run, and the ratios to fp16.  The byte
# capacities are fixed, measured first so that fp16 gets about 30% and 60% of
# its unlimited hit rate: conversation 144G and 600G, synthetic 176G and
# 480G (the fp16 column's "of unl." says how close they came).
#   bench_quant_capacity.sh [TRACE SIZE,SIZE ...]
# (default: both traces of ../shared/traces with the sizes above).
# KVS_BUILD.
set -eu
build=${KVS_BUILD:-build}
bin=$build/kvshare-replay
dir=../shared/traces
args=("$@")
if [ ${#args[@]} = 0 ]; then
  args=("$dir/conversation_trace.jsonl" 144G,600G
        "$dir/synthetic_trace.jsonl" 176G,480G)
fi
[ -x "$bin" ] || { echo "bench_quant_capacity: $bin not built"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
set -- "${args[@]}"
while [ $# -ge 2 ]; do
  t=$1 sizes=$2
  shift 2
  [ -r "$t" ] || { echo "bench_quant_capacity: $t not found, skipped"; continue; }
  for dtype in fp16 int8 fp8; do
    "$bin" --trace "$t" --no-progress --json --policy slru --dtype "$dtype" \
      --sweep "$sizes,unlimited" >"$tmp/$dtype.json"
  done
  python3 - "$tmp" "$t" <<'PY'
import json, os, sys
d, path = sys.argv[1:3]
runs, stride = {}, {}
for dt in ("fp16", "int8", "fp8"):
    s = json.load(open(f"{d}/{dt}.json"))
    stride[dt] = s["block_stride"]
    runs[dt] = {r["capacity_bytes"]: r for r in s["runs"]}
unl = runs["fp16"][0]["token_hit_rate"]
def gib(b):
    return f"{b / 2**30:g} GiB"
print(f"{os.path.basename(path)}: unlimited hit rate {unl:.4f}; block "
      f"bytes fp16 {stride['fp16']}, int8 {stride['int8']}, fp8 "
      f"{stride['fp8']}")
print("| capacity | fp16 tokens | fp16 hit (of unl.) | int8 tokens | int8 hit "
      "| int8/fp16 | fp8 tokens | fp8 hit | fp8/fp16 |")
print("|---|---|---|---|---|---|---|---|---|")
for b in sorted(k for k in runs["fp16"] if k):
    f = runs["fp16"][b]
    row = [gib(b), f"{f['capacity_tokens']:,}",
           f"{f['token_hit_rate']:.4f} ({f['token_hit_rate'] / unl:.0%})"]
    for dt in ("int8", "fp8"):
        q = runs[dt][b]
        row += [f"{q['capacity_tokens']:,}", f"{q['token_hit_rate']:.4f}",
                f"{q['token_hit_rate'] / f['token_hit_rate']:.3f}"]
    print("| " + " | ".join(row) + " |")
print()
PY
done
