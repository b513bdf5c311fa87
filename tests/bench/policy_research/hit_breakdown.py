"""Which reuses does each policy turn into hits?  Bands of the gap since the
block's previous use (block-use clock)."""
import sys, collections
from sim import *
from online import GIX
name = sys.argv[1]; cap = int(float(sys.argv[2]) / 512)
if name == "gen":
    ensure_gen()
recs = load(TRACES[name]); nxt = next_uses(recs)
bands = [0, 2000, 5000, 10000, 20000, 40000, NEVER]
def band(g):
    for i in range(len(bands) - 1):
        if g < bands[i + 1]: return i
class Spy:
    def __init__(self, pol, heap):
        self.pol = pol; self.heap = heap
def run(make, heapmode):
    lastt = {}; t = 0; H = collections.Counter(); Tot = collections.Counter()
    pol = make()
    if heapmode:
        cache = {}; heap = []; import heapq; seq = 0
    else:
        cache = pol.cache
    for i, r in enumerate(recs):
        ids = r["hash_ids"]; n = len(ids); k = 0
        while k < n - 1 and ids[k] in cache: k += 1
        for j, h in enumerate(ids):
            t += 1
            if h in lastt and j < n - 1:
                b = band(t - lastt[h]); Tot[b] += 1
                if j < k: H[b] += 1
            lastt[h] = t
        if heapmode:
            for j, h in enumerate(ids):
                p = pol.prio(h, i, j, n, k, h in cache); cache[h] = p; seq += 1
                heapq.heappush(heap, (p, seq, h))
            while len(cache) > cap:
                p, _, h = heapq.heappop(heap)
                if cache.get(h) == p: del cache[h]
        else:
            pol.request(i, ids, k); pol.shrink()
    return H, Tot
rows = [("lru", lambda: LRU(cap), True), ("slru", lambda: SLRU(cap), False),
        ("gix", lambda: GIX(cap, mode="lists", mono=True), False),
        ("oradm", lambda: ORADM(cap, nxt), True), ("opt", lambda: OPT(cap, nxt), True)]
print(name, "cap", cap, "blocks; gap bands", bands[1:-1])
for nm, mk, hm in rows:
    H, Tot = run(mk, hm)
    print("%-6s" % nm, " ".join("%6d/%-6d" % (H[b], Tot[b]) for b in range(len(bands) - 1)), " total hits", sum(H.values()))
