"""LHD (Beckmann et al., NSDI'18) adapted to prefix chains."""
import collections, random
from sim import Ghosts

class LHD:
    def __init__(self, cap, classify, nclass, G=None, nbuck=1024, sample=64,
                 reconf=None, decay=0.9, cascade=True, seed=1, ghosts=0):
        self.cap = cap; self.classify = classify; self.nclass = nclass
        self.G = G or max(1, cap // 32)
        self.nb = nbuck; self.S = sample
        self.reconf = reconf or max(4096, cap)
        self.decay = decay; self.cascade = cascade
        self.rng = random.Random(seed)
        self.cache = {}          # h -> [last_t, cls]
        self.arr = []; self.pos = {}
        self.hits = [[0.0] * nbuck for _ in range(nclass)]
        self.evs = [[0.0] * nbuck for _ in range(nclass)]
        self.dens = [[1.0 / (a + 1) for a in range(nbuck)] for _ in range(nclass)]
        self.t = 0; self.next_reconf = self.reconf
        self.children = collections.defaultdict(set)
        self.uses = collections.Counter()   # prior uses (kept beyond eviction, like a ghost)
        self.gh = Ghosts(ghosts * cap) if ghosts else None
        self.state = {}   # per-request info for classify
    def age(self, h):
        a = (self.t - self.cache[h][0]) // self.G
        return a if a < self.nb else self.nb - 1
    def _add(self, h):
        self.pos[h] = len(self.arr); self.arr.append(h)
    def _rm(self, h):
        p = self.pos.pop(h); last = self.arr.pop()
        if p < len(self.arr):
            self.arr[p] = last; self.pos[last] = p
    def request(self, i, ids, k):
        n = len(ids)
        for j, h in enumerate(ids):
            self.t += 1
            e = self.cache.get(h)
            if e is not None:
                a = self.age(h)
                self.hits[e[1]][a] += 1
            else:
                self._add(h)
                if j:
                    self.children[ids[j - 1]].add(h)
            c = self.classify(self, h, i, j, n, k, e is not None)
            self.cache[h] = [self.t, c]
            self.uses[h] += 1
        if self.t >= self.next_reconf:
            self.reconfigure(); self.next_reconf = self.t + self.reconf
    def reconfigure(self):
        for c in range(self.nclass):
            H = self.hits[c]; E = self.evs[c]; D = self.dens[c]
            th = te = life = 0.0
            for a in range(self.nb - 1, -1, -1):
                th += H[a]; te += H[a] + E[a]; life += te
                D[a] = th / life if life > 0 else 0.0
                H[a] *= self.decay; E[a] *= self.decay
    def _evict(self, h):
        e = self.cache.pop(h)
        a = (self.t - e[0]) // self.G
        self.evs[e[1]][a if a < self.nb else self.nb - 1] += 1
        self._rm(h)
        if self.cascade:
            for c in self.children.pop(h, ()):
                if c in self.cache:
                    self._evict(c)
    def shrink(self):
        cache = self.cache; arr = self.arr; rnd = self.rng.random
        G = self.G; nb = self.nb; t = self.t; dens = self.dens
        while len(cache) > self.cap:
            best = None; bd = 9e99
            L = len(arr)
            for _ in range(self.S):
                h = arr[int(rnd() * L)]
                e = cache[h]
                a = (t - e[0]) // G
                d = dens[e[1]][a if a < nb else nb - 1]
                if d < bd:
                    bd = d; best = h
            self._evict(best)

# ---- classifiers ----
def cls_none(p, h, i, j, n, k, hit):
    return 0
def cls_uses(p, h, i, j, n, k, hit):
    # prior uses 0,1,2,3+  (x2 for last block)
    u = p.uses[h]
    return (2 if j == n - 1 else 0) * 0 + min(u, 3) + (4 if j == n - 1 else 0)
def cls_uses_k(p, h, i, j, n, k, hit):
    u = min(p.uses[h], 3)
    if j == n - 1: return 8
    return u * 2 + (1 if k > 1 else 0)
CLASSIFIERS = {"none": (cls_none, 1), "uses": (cls_uses, 8), "usesk": (cls_uses_k, 9)}
