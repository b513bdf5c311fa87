#!/usr/bin/env python3
"""Bounds for eviction policies, at 512-token blocks (the trace's own hash
ids; the replayer works at 16 tokens, so LRU and opt come out within about
0.01 of its figures).  One request at a time: look up the prefix (never the
last block), then every block of the prompt is used.

  lru     least recently used
  opt     Belady: evict the block used furthest in the future
  oradm   an oracle of admission: blocks never used again go first, the
          rest by LRU (knows *whether* a block comes back, not when)
  lfu     perfect LFU: exact counts of all past uses, ties by LRU

usage: policy_bounds.py TRACE CAPACITY_TOKENS [POLICY,...]
"""
import collections
import heapq
import json
import sys

recs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
recs.sort(key=lambda r: r["timestamp"])
cap = int(float(sys.argv[2]) / 512)
pols = sys.argv[3].split(",") if len(sys.argv) > 3 else ["lru", "opt", "oradm", "lfu"]
NEVER = 10 ** 9
nxt, last = [None] * len(recs), {}
for i in range(len(recs) - 1, -1, -1):
    ids = recs[i]["hash_ids"]
    nxt[i] = [last.get(h, NEVER) for h in ids]
    for h in ids:
        last[h] = i
total = sum(len(r["hash_ids"]) for r in recs)


def run(pol):
    cache, heap, freq, t, hits = {}, [], collections.Counter(), 0, 0
    for i, r in enumerate(recs):
        ids = r["hash_ids"]
        k = 0
        while k < len(ids) - 1 and ids[k] in cache:
            k += 1
        hits += k
        for j, h in enumerate(ids):
            t += 1
            freq[h] += 1
            if pol == "lru":
                p = t
            elif pol == "opt":  # deeper first on ties
                p = -nxt[i][j] * 1000 + (len(ids) - j)
            elif pol == "oradm":
                p = t if nxt[i][j] < NEVER else t - 1e9
            elif pol == "lfu":
                p = freq[h] * 1e7 + t
            else:
                sys.exit("unknown policy " + pol)
            cache[h] = p
            heapq.heappush(heap, (p, h))
        while len(cache) > cap:
            p, h = heapq.heappop(heap)
            if cache.get(h) == p:
                del cache[h]
    return hits / total


for p in pols:
    print("%-6s %.4f" % (p, run(p)), flush=True)
