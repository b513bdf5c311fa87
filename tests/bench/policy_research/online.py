"""GIX: online class-index eviction.

Classes: a block's class is fixed at each use from online features
(default: 'L' = last block of its request, else min(prior uses, UMAX)).
Learner: metadata (last use time, class, use count) for every hash used in
the last W block-uses (a FIFO window; the cached blocks are a subset).  An
access is 'resolved' when the hash is used again (reuse at age a -> R[c][bucket(a)])
or when its metadata leaves the window (-> E[c], no reuse within W).
Every RECONF uses: for each class, from R and E, the index per age bucket
  I[c][b] = max over horizons H > age of P(reuse in (age, H]) / E[slot-time]
(the Gittins index of keeping the block); then R, E *= DECAY.
Eviction, mode 'lists': one LRU list per class; evict the head (oldest) of
the class whose head has the lowest index at its age (O(#classes)), its
cached descendants with it.  Mode 'sample': S random leaves, lowest index.
"""
import collections, random
from gittins import bucket_of, LO

class GIX:
    def __init__(self, cap, umax=4, W=1 << 17, reconf=8192, decay=0.9,
                 mode="lists", S=64, seed=1, mono=False, classfn=None,
                 warm_lru=True):
        self.cap = cap; self.umax = umax; self.W = W; self.reconf = reconf
        self.decay = decay; self.mode = mode; self.S = S; self.mono = mono
        self.rng = random.Random(seed)
        self.classfn = classfn or (lambda p, j, n, u, h: n - 1 if False else None)
        self.nc = umax + 2          # 0..umax uses, umax+1 = last block
        self.mb = bucket_of(W)
        self.R = [[0.0] * (self.mb + 1) for _ in range(self.nc)]
        self.E = [0.0] * self.nc
        self.I = [[1.0 / (LO[b] + 1) for b in range(self.mb + 1)] for _ in range(self.nc)]
        self.meta = {}   # h -> [t, cls, uses]   (hashes used within W)
        self.log = []    # (t, h, cls) per use; cursors below walk it
        self.cur = [0] * (self.mb + 1)   # cursor per bucket lower edge
        self.A = [[0.0] * (self.mb + 1) for _ in range(self.nc)]   # at risk
        self.cache = {}                          # h -> (t, cls)
        self.lists = [collections.OrderedDict() for _ in range(self.nc)]
        self.children = collections.defaultdict(set)
        self.t = 0; self.next = reconf
        self.arr = []; self.pos = {}; self.par = {}
    def cls(self, j, n, u):
        if j == n - 1: return self.nc - 1
        return u if u < self.umax else self.umax
    def request(self, i, ids, k):
        n = len(ids); meta = self.meta; cache = self.cache
        for j, h in enumerate(ids):
            self.t += 1; t = self.t
            m = meta.pop(h, None)
            if m is not None:
                a = t - m[0]
                if a < self.W: self.R[m[1]][bucket_of(a)] += 1
                u = m[2]
            else:
                u = 0
            c = self.cls(j, n, u)
            meta[h] = [t, c, u + 1]
            self.log.append((t, h, c))
            old = cache.get(h)
            if old is not None:
                del self.lists[old[1]][h]
            else:
                if j:
                    self.children[ids[j - 1]].add(h)
                    self.par[h] = ids[j - 1]
                if self.mode == "sample":
                    self._leaf_add(h)
                    p = ids[j - 1] if j else None
                    if p is not None and p in self.pos and len(self.children[p]) == 1:
                        self._leaf_rm(p)
            cache[h] = (t, c)
            self.lists[c][h] = t
        self.advance()
        if self.t >= self.next:
            self.recompute(); self.next = self.t + self.reconf
    def advance(self):
        """cursor b: every use whose hash reached age LO[b] unreused counts
        as at risk in bucket b (Kaplan-Meier exposure)."""
        log = self.log; meta = self.meta; t = self.t; A = self.A; cur = self.cur
        for b in range(self.mb + 1):
            lim = t - LO[b]; x = cur[b]
            while x < len(log) and log[x][0] <= lim:
                lt, h, c = log[x]
                m = meta.get(h)
                if m is not None and m[0] == lt:
                    A[c][b] += 1
                    if b == self.mb: del meta[h]      # leaves the window
                x += 1
            cur[b] = x
        # drop the consumed head of the log now and then
        if cur[self.mb] > 100000:
            d = cur[self.mb]; del log[:d]
            for b in range(self.mb + 1): cur[b] -= d
    def recompute(self):
        mb = self.mb
        # pooled hazards for classes with little data
        pool = [0.0] * (mb + 1)
        for c in range(self.nc):
            for b in range(mb + 1): pool[b] += self.R[c][b]
        poolA = [sum(self.A[c][b] for c in range(self.nc)) for b in range(mb + 1)]
        for c in range(self.nc):
            R = self.R[c]; A = self.A[c]; I = self.I[c]
            if A[0] < 1: continue
            # Kaplan-Meier: reuse mass per bucket per unit of starting mass
            surv = []; mass = []; S = 1.0
            for b in range(mb + 1):
                if A[b] >= 20: hz = R[b] / A[b]
                elif poolA[b] >= 20: hz = pool[b] / poolA[b]
                else: hz = 0.0
                hz = min(hz, 1.0)
                surv.append(S); mass.append(S * hz); S *= 1 - hz
            for b in range(mb + 1):
                best = num = den = 0.0
                if surv[b] > 1e-12:
                    for e in range(b, mb + 1):
                        w = LO[e + 1] - LO[e]
                        den += (surv[e] - mass[e] * 0.5) * w; num += mass[e]
                        if den > 0 and num > best * den: best = num / den
                I[b] = best
            if self.mono:
                for b in range(mb - 1, -1, -1):
                    if I[b] < I[b + 1]: I[b] = I[b + 1]
        for c in range(self.nc):
            for b in range(mb + 1):
                self.R[c][b] *= self.decay; self.A[c][b] *= self.decay

    def _leaf_add(self, h):
        self.pos[h] = len(self.arr); self.arr.append(h)
    def _leaf_rm(self, h):
        p = self.pos.pop(h); last = self.arr.pop()
        if p < len(self.arr): self.arr[p] = last; self.pos[last] = p
    def _evict(self, h):
        st = [h]
        while st:
            x = st.pop()
            e = self.cache.pop(x, None)
            if e is None: continue
            del self.lists[e[1]][x]
            if x in self.pos: self._leaf_rm(x)
            st.extend(self.children.pop(x, ()))
            p = self.par.pop(x, None)
            if p is not None and p in self.cache:
                ch = self.children.get(p)
                if ch is not None:
                    ch.discard(x)
                    if self.mode == "sample" and not ch and p not in self.pos:
                        self._leaf_add(p)
    def shrink(self):
        cache = self.cache; t = self.t; I = self.I; mb = self.mb; W = self.W
        while len(cache) > self.cap:
            best = None; bd = 9e99; bt = 0
            if self.mode == "lists":
                for c, L in enumerate(self.lists):
                    if not L: continue
                    h = next(iter(L)); lt = L[h]; a = t - lt
                    d = I[c][bucket_of(a) if a < W else mb]
                    if d < bd or (d == bd and lt < bt): bd = d; best = h; bt = lt
            else:
                arr = self.arr; L = len(arr); rnd = self.rng.random
                for _ in range(self.S):
                    h = arr[int(rnd() * L)]
                    lt, c = cache[h]; a = t - lt
                    d = I[c][bucket_of(a) if a < W else mb]
                    if d < bd or (d == bd and lt < bt): bd = d; best = h; bt = lt
            self._evict(best)
