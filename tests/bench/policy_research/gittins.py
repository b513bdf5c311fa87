"""Index policy from policy-independent reuse-time statistics.

Every block access is put in a class (features known online).  For every
class we learn, from ALL accesses (metadata of every hash seen: its last
access time and the class it was given then), the distribution of the time
to its next use (block-access clock), with a mass for 'not within MAXAGE'.
From that distribution we compute, per (class, age bucket), the Gittins-like
index  max_H P(reuse in (a,H] | alive at a) / E[time spent in cache until
min(reuse, H) | alive at a] : the best achievable hits per cache-slot-time if
we keep the block up to some horizon H.  Eviction: sample S resident blocks,
evict the one with the lowest index (cascade: its cached descendants too).
"""
import collections, random

def bucket_of(x):
    # 4 buckets per octave
    if x < 8: return x
    b = x.bit_length()
    return 4 * (b - 2) + ((x >> (b - 3)) & 3)
NB = bucket_of(1 << 22) + 1
LO = [0] * NB
for _x in range(1 << 22, -1, -1):
    pass
def _lo(b):
    if b < 8: return b
    o = b // 4 + 2; s = b % 4
    return (1 << (o - 1)) + s * (1 << (o - 3))
LO = [_lo(b) for b in range(NB + 1)]

class Gittins:
    def __init__(self, cap, classify, nclass, maxage=1 << 18, sample=64,
                 reconf=20000, decay=0.8, cascade=True, seed=1, oracle=None,
                 horizon_max=None, prior=None):
        self.cap = cap; self.classify = classify; self.nclass = nclass
        self.S = sample; self.reconf = reconf; self.decay = decay
        self.cascade = cascade; self.rng = random.Random(seed)
        self.maxage = maxage; self.mb = bucket_of(maxage)
        self.cache = {}; self.arr = []; self.pos = {}
        self.meta = {}       # h -> (last_t, cls)   (all hashes ever seen)
        self.uses = collections.Counter()
        self.children = collections.defaultdict(set)
        self.reuse = [[0.0] * (self.mb + 1) for _ in range(nclass)]
        self.total = [0.0] * nclass
        self.pending = collections.deque()
        self.idx = [[1.0 / (LO[b] + 1) for b in range(self.mb + 1)] for _ in range(nclass)]
        self.t = 0; self.next_reconf = reconf
        self.oracle = oracle
        self.ext = {}   # free slot for classifiers
    def request(self, i, ids, k):
        n = len(ids)
        self.ctx = (i, ids, k)
        for j, h in enumerate(ids):
            self.t += 1
            m = self.meta.get(h)
            if m is not None:
                a = self.t - m[0]
                if a < self.maxage:
                    self.reuse[m[1]][bucket_of(a)] += 1
            if h not in self.cache:
                self.pos[h] = len(self.arr); self.arr.append(h)
                if j:
                    self.children[ids[j - 1]].add(h)
            c = self.classify(self, h, i, j, n, k, h in self.cache)
            self.meta[h] = (self.t, c)
            self.cache[h] = (self.t, c)
            self.pending.append((self.t, c))
            self.uses[h] += 1
        if self.t >= self.next_reconf:
            self.reconfigure(); self.next_reconf = self.t + self.reconf
    def reconfigure(self):
        lim = self.t - self.maxage
        # count accesses old enough that their outcome is known
        while self.pending and self.pending[0][0] < lim:
            _, c = self.pending.popleft(); self.total[c] += 1
        # still-pending ones: count those already reused is hard; use ratio
        for c in range(self.nclass):
            R = self.reuse[c]; tot = self.total[c]
            if tot <= 0:
                # not enough data yet: use raw counts incl. pending
                tot = sum(1 for _ in ()) + max(sum(R), 1) * 2
            s = sum(R)
            tot = max(tot, s)
            # survival at bucket lower edge
            surv = [0.0] * (self.mb + 2)
            acc = tot
            for b in range(self.mb + 1):
                surv[b] = acc; acc -= R[b]
            surv[self.mb + 1] = acc
            I = self.idx[c]
            for b in range(self.mb + 1):
                if surv[b] <= 0:
                    I[b] = 0.0; continue
                best = 0.0; num = 0.0; den = 0.0
                for e in range(b, self.mb + 1):
                    w = LO[e + 1] - LO[e]
                    # mass reused within bucket e spends ~half its width
                    den += (surv[e] - R[e] * 0.5) * w
                    num += R[e]
                    if den > 0 and num / den > best:
                        best = num / den
                I[b] = best
            for b in range(self.mb + 1):
                R[b] *= self.decay
            self.total[c] *= self.decay
    def _evict(self, h):
        self.cache.pop(h)
        p = self.pos.pop(h); last = self.arr.pop()
        if p < len(self.arr):
            self.arr[p] = last; self.pos[last] = p
        if self.cascade:
            for c in self.children.pop(h, ()):
                if c in self.cache:
                    self._evict(c)
    def shrink(self):
        cache = self.cache; arr = self.arr; rnd = self.rng.random
        t = self.t; idx = self.idx; mb = self.mb
        while len(cache) > self.cap:
            best = None; bd = 9e99
            L = len(arr)
            for _ in range(self.S):
                h = arr[int(rnd() * L)]
                lt, c = cache[h]
                a = t - lt
                b = bucket_of(a) if a < self.maxage else mb
                d = idx[c][b]
                if d < bd or (d == bd and lt < cache[best][0]):
                    bd = d; best = h
            self._evict(best)

# ---- classifiers: (function, nclass)
def c_none(p, h, i, j, n, k, res): return 0
def c_uses(p, h, i, j, n, k, res):
    if j == n - 1: return 4
    return min(p.uses[h], 3)
def c_usesk(p, h, i, j, n, k, res):
    if j == n - 1: return 8
    return min(p.uses[h], 3) * 2 + (1 if k > 1 else 0)
def c_oracle(p, h, i, j, n, k, res):
    # cheating: whether it is ever used again
    return 1 if p.oracle[i][j] < 10 ** 9 else 0
CLS = {"none": (c_none, 1), "uses": (c_uses, 5), "usesk": (c_usesk, 9),
       "oracle": (c_oracle, 2)}
