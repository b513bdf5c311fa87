#!/bin/bash
# The replayer against a plain Python LRU simulation of the same trace
# (tests/bench/lru_sim.py), unlimited capacity, in the same run: wall time
# ratio, peak RSS, and the hit rates (which must agree).
set -eu
build=${KVS_BUILD:-build}
trace=${1:-../shared/traces/conversation_trace.jsonl}
[ -r "$trace" ] || { echo "bench_replay: $trace not found, skipped"; exit 0; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
/usr/bin/time -f "%e %M" -o "$tmp/py.t" python3 tests/bench/lru_sim.py "$trace" >"$tmp/py.out"
/usr/bin/time -f "%e %M" -o "$tmp/c.t" "$build/kvshared" replay --trace "$trace" \
  --policy lru --no-progress --json >"$tmp/c.json"
read -r pys pykb <"$tmp/py.t"; read -r cs ckb <"$tmp/c.t"
chit=$(python3 -c "import json; print('%.4f' % json.load(open('$tmp/c.json'))['token_hit_rate'])")
echo "replay vs Python LRU, $(basename "$trace"), unlimited:"
echo "  python: ${pys} s, ${pykb} KB peak RSS, token hit rate $(cat "$tmp/py.out")"
echo "  replay: ${cs} s, ${ckb} KB peak RSS, token hit rate ${chit}"
python3 -c "print('  replay is %.1fx faster, %.2fx the memory' % ($pys / $cs, $ckb / $pykb))"
[ "$chit" = "$(cat "$tmp/py.out")" ] || { echo "hit rates differ"; exit 1; }
