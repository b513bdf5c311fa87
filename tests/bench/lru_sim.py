#!/usr/bin/env python3
"""The baseline of the replayer's speed: a plain Python LRU prefix cache over
a Mooncake-format trace, at 16-token blocks named by (trace block id, place),
unlimited capacity, one request at a time in timestamp order; prints the
token hit rate (which must equal kvshare-replay's)."""
import collections
import json
import sys

recs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
recs.sort(key=lambda r: r["timestamp"])
cache = collections.OrderedDict()
hit = query = 0
for r in recs:
    n, ids = r["input_length"], r["hash_ids"]
    keys = [(ids[(j * 16 + 15) // 512], j) for j in range(n // 16)]
    h = 0
    while h < (n - 1) // 16 and keys[h] in cache:
        h += 1
    hit += h * 16
    query += n
    for k in keys:
        cache[k] = None
        cache.move_to_end(k)
print("%.4f" % (hit / query))
