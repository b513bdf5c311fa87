#!/bin/bash
# test_wgmma_ptx — the flash prefill's wgmma variant as nvcc compiles it
# (docs/kernels.md, "The wgmma variant (sm_90a)").  No GPU runs it here, so
# the PTX is read instead:
#  - sm_90a: each kvs_prefill_flash_wg_* has its two batches a key tile
#    (two wgmma.fence, commit_group, wait_group) and D/16 + 4 MMAs, and no
#    floating-point instruction sits between a fence and the MMAs after it
#    (the PTX ISA leaves a register access there undefined; nvcc once sank
#    S's zeroing there);
#  - no other kernel uses wgmma, and the compute_90 PTX (what later GPUs
#    JIT) has none at all;
#  - where nvdisasm is (deploy/install-deps.sh puts one from PyPI in
#    /usr/local/lib/kvshare-tools), the SASS ptxas makes of that PTX:
#    Q's fragments live through the key-tile loop, no register of theirs
#    given to P or written there (wgmma_sass.py; ptxas 13.0 broke this at
#    head_dim 64, which an H100 caught).
# Skipped where nvcc is not installed.
set -u
cd "$(dirname "$0")/../.."
nvcc=$(command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
[ -n "$nvcc" ] || { echo "skipped: no nvcc"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvs-wgptx-XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
for arch in 90a 90; do
  "$nvcc" -ptx -O3 -std=c++17 -I. -Ishm -Igpu -gencode arch=compute_$arch,code=compute_$arch \
    -o "$tmp/k$arch.ptx" gpu/kernels.cu || fail "nvcc -ptx for compute_$arch"
done
n=$(grep -c 'wgmma' "$tmp/k90.ptx")
[ "$n" = 0 ] || fail "$n wgmma lines in the compute_90 PTX"
# per entry: name, fences, MMAs, commits, waits, float ops between a fence
# and its first MMA
awk '
  /^\.visible \.entry/ { name = $3; sub(/\(.*/, "", name); next }
  name == "" { next }
  /wgmma\.fence/ { f[name]++; open = 1; next }
  /wgmma\.mma_async/ { m[name]++; open = 0; next }
  /wgmma\.commit_group/ { c[name]++; next }
  /wgmma\.wait_group/ { w[name]++; next }
  open && /^[ \t]*(mov|mul|add|sub|fma|cvt|max|min|neg|ex2|selp)\.[a-z0-9.]*(f32|f16|bf16)/ { bad[name]++ }
  END { for (k in f) printf "%s %d %d %d %d %d\n", k, f[k], m[k], c[k], w[k], bad[k] + 0 }
' "$tmp/k90a.ptx" | sort > "$tmp/wg"
cat "$tmp/wg"
# (head_dim 128 only: ptxas 13.0 compiled the D 64 instance wrong)
for t in fp16 bf16; do
  want="kvs_prefill_flash_wg_${t}_d128 2 12 2 2 0"
  grep -qx "$want" "$tmp/wg" || fail "want: $want"
done
n=$(wc -l < "$tmp/wg")
[ "$n" = 2 ] || fail "$n kernels use wgmma, want the 2 kvs_prefill_flash_wg_*"
# nvdisasm: the toolkit's own first (a newer one reads its cubins too)
nvdisasm=${NVDISASM:-}
for d in "$(dirname "$(readlink -f "$nvcc")")/nvdisasm" "$(command -v nvdisasm 2>/dev/null)" \
  /usr/local/lib/kvshare-tools/nvidia/cu13/bin/nvdisasm; do
  [ -z "$nvdisasm" ] && [ -x "$d" ] && nvdisasm=$d
done
if [ -z "$nvdisasm" ]; then
  echo "ok, but SKIPPED the SASS check: no nvdisasm (deploy/install-deps.sh installs one)"
  exit 0
fi
python3 tests/integration/wgmma_sass.py --selftest >/dev/null ||
  fail "wgmma_sass.py --selftest: a planted fault went unreported"
"$nvcc" -cubin -arch=sm_90a -o "$tmp/k.cubin" "$tmp/k90a.ptx" || fail "the sm_90a cubin"
"$nvdisasm" -c "$tmp/k.cubin" > "$tmp/k.sass" || fail "nvdisasm"
python3 tests/integration/wgmma_sass.py "$tmp/k.sass" || fail "the wgmma kernels' SASS"
echo "ok"
