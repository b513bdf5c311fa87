#!/bin/bash
# The replayer against a plain Python LRU simulation of the same trace
# (tests/bench/lru_sim.py), unlimited capacity, in the same run: wall time
# ratio, peak RSS, and the hit rates (which must agree).  The two alternate
# for KVS_BENCH_ROUNDS rounds (3; 1 with KVS_BENCH_QUICK=1) and the median
# of the rounds' ratios is reported: on a VM the first touch of fresh memory
# costs the one or the other a different amount from round to round.
set -eu
build=${KVS_BUILD:-build}
trace=${1:-../shared/traces/conversation_trace.jsonl}
rounds=${KVS_BENCH_ROUNDS:-3}
[ -n "${KVS_BENCH_QUICK:-}" ] && rounds=1
[ -r "$trace" ] || { echo "bench_replay: $trace not found, skipped"; exit 0; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
echo "replay vs Python LRU, $(basename "$trace"), unlimited, $rounds round(s):"
ratios=""
for r in $(seq "$rounds"); do
  /usr/bin/time -f "%e %M" -o "$tmp/py.t" python3 tests/bench/lru_sim.py "$trace" >"$tmp/py.out"
  /usr/bin/time -f "%e %M" -o "$tmp/c.t" "$build/kvshare-replay" --trace "$trace" \
    --policy lru --no-progress --json >"$tmp/c.json"
  read -r pys pykb <"$tmp/py.t"; read -r cs ckb <"$tmp/c.t"
  chit=$(python3 -c "import json; print('%.4f' % json.load(open('$tmp/c.json'))['token_hit_rate'])")
  [ "$chit" = "$(cat "$tmp/py.out")" ] || { echo "hit rates differ: $chit vs $(cat "$tmp/py.out")"; exit 1; }
  ratio=$(python3 -c "print('%.1f' % ($pys / $cs))")
  mem=$(python3 -c "print('%.2f' % ($ckb / $pykb))")
  echo "  round $r: python ${pys} s ${pykb} KB, replay ${cs} s ${ckb} KB: ${ratio}x faster, ${mem}x the memory (token hit rate $chit both)"
  ratios="$ratios $ratio"
done
python3 -c "import statistics, sys; r = sorted(map(float, sys.argv[1:])); print('  replay is %.1fx faster (median of %s)' % (statistics.median(r), ', '.join('%.1f' % x for x in r)))" $ratios
