#!/bin/bash
# kvshare-replay --capacity-bytes: the tokens a pool of bytes holds for each
# dtype, against the layout formula of docs/kernels.md ("Quantized KV
# blocks") computed here in Python (not by the C code); and, on a small
# generated trace, an int8 or fp8 pool of the same bytes never hits less than
# an fp16 one.  Needs $KVS_BUILD (set by run-tests.sh) and python3.  Exit 0
# pass, 77 skip, 1 fail.
set -u
build=${KVS_BUILD:-build}
bin=$build/kvshare-replay
fail() { echo "FAIL: $*"; exit 1; }
[ -x "$bin" ] || fail "$bin not built"
command -v python3 >/dev/null || { echo "skipped: python3 not found"; exit 77; }
tmp=$(mktemp -d) || fail "mktemp"
trap 'rm -rf "$tmp"' EXIT

# A trace of 400 requests: 40 conversations, each a chain of 512-token
# blocks that grows by a block or two per turn, in shuffled order.
python3 - "$tmp/trace.jsonl" <<'PY' || fail "cannot write the trace"
import json, random, sys
rng = random.Random(24)
ids, next_id, convs = {}, 0, []
def bid(path):
    global next_id
    if path not in ids:
        ids[path] = next_id
        next_id += 1
    return ids[path]
for c in range(40):
    convs.append([c % 4, 100 + c])
with open(sys.argv[1], "w") as f:
    for i in range(400):
        conv = convs[rng.randrange(len(convs))]
        conv.extend(rng.randrange(1 << 30) for _ in range(rng.randint(1, 2)))
        hashes = [bid(tuple(conv[:k + 1])) for k in range(len(conv))]
        n = 512 * (len(hashes) - 1) + rng.randint(1, 512)
        f.write(json.dumps({"timestamp": i * 10, "input_length": n,
                            "output_length": 16, "hash_ids": hashes}) + "\n")
PY

# The derived capacity, for each dtype and a few layouts and sizes.
for layout in "32 8 128 16" "28 4 64 16" "80 8 128 32" "1 1 16 1"; do
  set -- $layout
  for dtype in fp32 fp16 bf16 int8 fp8; do
    for size in 8G 3000M 123456789 64M; do
      "$bin" --trace "$tmp/trace.jsonl" --limit 1 --no-progress --json \
        --layers "$1" --kv-heads "$2" --head-dim "$3" --block-size "$4" \
        --dtype "$dtype" --capacity-bytes "$size" >"$tmp/r.json" 2>"$tmp/err"
      rc=$?
      python3 - "$tmp/r.json" "$rc" "$dtype" "$size" $layout <<'PY' ||
import json, sys
path, rc, dtype, size = sys.argv[1:5]
layers, heads, dim, bs = map(int, sys.argv[5:9])
def round_up(x, a):
    return (x + a - 1) // a * a
mul = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
nbytes = int(size[:-1]) * mul[size[-1]] if size[-1] in mul else int(size)
elem = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1, "fp8": 1}[dtype]
floats = {"int8": 2, "fp8": 1}.get(dtype, 0)
p = bs * heads * dim * elem
if floats:
    p = round_up(p, 16) + round_up(bs * heads * floats * 4, 16)
stride = round_up(2 * p * layers, 4096)
blocks = nbytes // stride
if blocks == 0:
    assert rc == "2", (rc, "no block fits: want exit 2")
    sys.exit(0)
assert rc == "0", rc
r = json.load(open(path))
want = {"dtype": dtype, "block_stride": stride, "capacity_bytes": nbytes,
        "capacity_blocks": blocks, "capacity_tokens": blocks * bs,
        "num_blocks": blocks, "num_layers": layers, "num_kv_heads": heads,
        "head_dim": dim}
got = {k: r[k] for k in want}
assert got == want, (got, want)
PY
        fail "layout $layout $dtype $size: $(cat "$tmp/err")"
    done
  done
done

# The docs' example: int8 block 1 114 112 bytes, fp8 1 081 344, fp16 2 MiB.
"$bin" --trace "$tmp/trace.jsonl" --limit 1 --no-progress --dtype int8 \
  --capacity-bytes 1G >"$tmp/t.txt" || fail "text replay exits $?"
grep -q "^bytes  *1073741824 = 963 blocks of 1114112 bytes = 15408 tokens (int8" \
  "$tmp/t.txt" || fail "text output: $(grep bytes "$tmp/t.txt")"

# Refusals: with --capacity-tokens, no block fits, bad sizes and dtypes.
"$bin" --trace "$tmp/trace.jsonl" --capacity-bytes 1G --capacity-tokens 1e5 \
  2>"$tmp/err"; [ $? = 2 ] || fail "bytes and tokens: want exit 2"
grep -q "one or the other" "$tmp/err" || fail "bytes and tokens: $(cat "$tmp/err")"
for bad in "--capacity-bytes 0" "--capacity-bytes 1X" "--capacity-bytes -5" \
           "--dtype fp4" "--layers 0 --capacity-bytes 1G" \
           "--head-dim 5000 --capacity-bytes 1G" \
           "--capacity-bytes 1M --dtype int8"; do
  "$bin" --trace "$tmp/trace.jsonl" $bad --no-progress >/dev/null 2>"$tmp/err"
  [ $? = 2 ] || fail "$bad: want exit 2"
  grep -q "size a capacity in bytes" "$tmp/err" &&
    fail "$bad: refused for want of bytes, not for itself"
done
# A layout without a capacity in bytes would change nothing: refused.
for lay in "--dtype int8" "--head-dim 64 --capacity-tokens 1e5" \
           "--layers 2 --sweep 1e5,unlimited"; do
  "$bin" --trace "$tmp/trace.jsonl" $lay --no-progress >/dev/null 2>"$tmp/err"
  [ $? = 2 ] || fail "$lay: want exit 2"
  grep -q "size a capacity in bytes" "$tmp/err" || fail "$lay: $(cat "$tmp/err")"
done

# Quantized pools of the same bytes hit at least as much as fp16, over a
# range from a few blocks to more than the trace needs (one sweep each).
for pol in slru lru; do
  for dtype in fp16 int8 fp8; do
    "$bin" --trace "$tmp/trace.jsonl" --no-progress --json --policy "$pol" \
      --dtype "$dtype" --sweep 16M,32M,64M,128M,256M,512M,1G,2G,4G \
      >"$tmp/s-$pol-$dtype.json" || fail "sweep $pol $dtype exits $?"
  done
  python3 - "$tmp" "$pol" <<'PY' || fail "quantized pools hit less than fp16 ($pol)"
import json, sys
d, pol = sys.argv[1:3]
runs = {}
for dt in ("fp16", "int8", "fp8"):
    s = json.load(open(f"{d}/s-{pol}-{dt}.json"))
    assert s["dtype"] == dt, s["dtype"]
    runs[dt] = {r["capacity_bytes"]: r for r in s["runs"]}
grew = 0
for b, f in runs["fp16"].items():
    for dt in ("int8", "fp8"):
        q = runs[dt][b]
        assert q["capacity_tokens"] > f["capacity_tokens"], (b, dt)
        assert q["token_hit_rate"] >= f["token_hit_rate"], (b, dt, q, f)
        grew += q["token_hit_rate"] > f["token_hit_rate"]
assert grew > 0, "no capacity where the quantized pool hit more"
PY
done
echo "ok"
