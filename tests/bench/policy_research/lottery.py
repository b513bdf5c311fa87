"""Expiry-priority policies with sticky per-branch random ranks.
priority = last_use_time + credit(block);  evict the lowest (heap), with
cascade to cached descendants.  Within a request, deeper blocks get
last_use - depth*eps so tails go first.
rank: a block inherits its parent's rank unless the parent is a branching
point (already had another child) or it is a root: then a fresh hash-random
rank in [0,1)."""
import collections, heapq, random
from sim import Ghosts

def hrand(h):
    x = (h * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & ((1 << 64) - 1)
    x ^= x >> 31; x = (x * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1); x ^= x >> 29
    return (x & 0xFFFFFF) / float(1 << 24)

class Lottery:
    def __init__(self, cap, credit):
        """credit(p, h, j, n, uses, rank) -> credit in block-uses."""
        self.cap = cap; self.credit = credit
        self.cache = {}; self.heap = []; self.t = 0
        self.rank = {}; self.firstchild = {}; self.uses = collections.Counter()
        self.children = collections.defaultdict(set)
    def request(self, i, ids, k):
        n = len(ids); t0 = self.t; self.t += n
        for j, h in enumerate(ids):
            if h not in self.rank:
                if j == 0:
                    self.rank[h] = hrand(h)
                else:
                    p = ids[j - 1]
                    fc = self.firstchild.setdefault(p, h)
                    self.rank[h] = self.rank[p] if fc == h else hrand(h)
            elif j and self.firstchild.get(ids[j - 1]) is None:
                self.firstchild[ids[j - 1]] = h
            u = self.uses[h]; self.uses[h] += 1
            pr = t0 + n - j + self.credit(self, h, j, n, u, self.rank[h])
            if h not in self.cache and j:
                self.children[ids[j - 1]].add(h)
            self.cache[h] = pr
            heapq.heappush(self.heap, (pr, h))
    def shrink(self):
        cache = self.cache
        while len(cache) > self.cap:
            p, h = heapq.heappop(self.heap)
            if cache.get(h) != p: continue
            st = [h]
            while st:
                x = st.pop()
                if x in cache:
                    del cache[x]; st.extend(self.children.pop(x, ()))
