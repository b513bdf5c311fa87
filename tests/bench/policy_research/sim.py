#!/usr/bin/env python3
"""Generic replay in the exact model of policy_bounds.py: requests one at a
time (timestamp order), lookup = cached prefix (never the last block), then
every block of the prompt is used; after the request, evict until
len(cache) <= cap (cap = capacity_tokens // 512 blocks).  hit rate = hit
blocks / total blocks.  Optionally report only requests in [lo, hi) (the
cache state is still warmed by the earlier records)."""
import collections, heapq, json, os, subprocess, sys

NEVER = 10 ** 9

def load(path):
    recs = [json.loads(l) for l in open(path) if l.strip()]
    recs.sort(key=lambda r: r["timestamp"])
    return recs

def next_uses(recs):
    """nxt[i][j] = index of next request using recs[i].hash_ids[j]."""
    nxt, last = [None] * len(recs), {}
    for i in range(len(recs) - 1, -1, -1):
        ids = recs[i]["hash_ids"]
        nxt[i] = [last.get(h, NEVER) for h in ids]
        for h in ids:
            last[h] = i
    return nxt

class Policy:
    """Heap policy: prio(ctx) -> number; lowest evicted first."""
    cascade = False
    def __init__(self, cap): self.cap = cap
    def begin(self, i, r, k, sim): pass
    def prio(self, h, i, j, n, k, hit): raise NotImplementedError
    def end(self, i, r, sim): pass
    def evicted(self, h): pass

def replay(recs, cap, pol, lo=0, hi=None, nxt=None):
    hi = len(recs) if hi is None else hi
    cache = {}      # h -> prio
    heap = []
    parent = {}
    kids = collections.defaultdict(int)   # cached children count
    children = collections.defaultdict(set)
    hits = tot = 0
    seq = 0
    for i, r in enumerate(recs):
        ids = r["hash_ids"]; n = len(ids)
        k = 0
        while k < n - 1 and ids[k] in cache:
            k += 1
        if lo <= i < hi:
            hits += k; tot += n
        pol.begin(i, r, k, cache)
        for j, h in enumerate(ids):
            hit = h in cache
            if j and h not in parent:
                parent[h] = ids[j - 1]
            p = pol.prio(h, i, j, n, k, hit)
            cache[h] = p
            seq += 1
            heapq.heappush(heap, (p, seq, h))
            if pol.cascade and j and not hit:
                children[ids[j - 1]].add(h)
        pol.end(i, r, cache)
        while len(cache) > cap:
            p, _, h = heapq.heappop(heap)
            if cache.get(h) == p:
                del cache[h]
                pol.evicted(h)
                if pol.cascade:
                    st = list(children.pop(h, ()))
                    while st:
                        c = st.pop()
                        if c in cache:
                            del cache[c]; pol.evicted(c)
                            st.extend(children.pop(c, ()))
    return hits / tot

class LRU(Policy):
    def __init__(self, cap): super().__init__(cap); self.t = 0
    def prio(self, h, i, j, n, k, hit):
        self.t += 1; return self.t

class LRUrev(Policy):
    """LRU, deeper blocks of a request older (evict chain tails first)."""
    def prio(self, h, i, j, n, k, hit):
        return i * 1000 - j

class OPT(Policy):
    def __init__(self, cap, nxt): super().__init__(cap); self.nxt = nxt
    def prio(self, h, i, j, n, k, hit):
        return -self.nxt[i][j] * 1000 + (n - j)

class ORADM(Policy):
    def __init__(self, cap, nxt): super().__init__(cap); self.nxt = nxt; self.t = 0
    def prio(self, h, i, j, n, k, hit):
        self.t += 1
        return self.t if self.nxt[i][j] < NEVER else self.t - 1e9

# The repository's root is three folders up; ../shared/traces beside it.
_ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                      "..", "..", ".."))
TRACES = {"conv": os.path.join(_ROOT, "..", "shared", "traces", "conversation_trace.jsonl"),
          "syn": os.path.join(_ROOT, "..", "shared", "traces", "synthetic_trace.jsonl"),
          "gen": os.environ.get("KVS_GEN_TRACE", os.path.join(_ROOT, "build", "gen.jsonl"))}


def ensure_gen():
    """The generated workload (tests/bench/gen_trace.py, its defaults: seed
    7, 20000 requests), made once."""
    if not os.path.exists(TRACES["gen"]):
        os.makedirs(os.path.dirname(TRACES["gen"]), exist_ok=True)
        with open(TRACES["gen"], "w") as f:
            subprocess.run([sys.executable, os.path.join(_ROOT, "tests", "bench", "gen_trace.py")],
                           stdout=f, check=True)
CAPS = [1e6, 3e6, 1e7]

def replay2(recs, pol, lo=0, hi=None):
    """For policies owning their state: pol.cache (membership),
    pol.request(i, ids, k) uses all blocks, pol.shrink() evicts to cap."""
    hi = len(recs) if hi is None else hi
    hits = tot = 0
    cache = pol.cache
    for i, r in enumerate(recs):
        ids = r["hash_ids"]; n = len(ids)
        k = 0
        while k < n - 1 and ids[k] in cache:
            k += 1
        if lo <= i < hi:
            hits += k; tot += n
        pol.request(i, ids, k)
        pol.shrink()
    return hits / tot

class Ghosts:
    """FIFO ring of the last `size` evicted hashes, value = flag."""
    def __init__(self, size):
        self.size = size; self.d = collections.OrderedDict(); self.nonzero = 0
    def add(self, h, v):
        if h in self.d:
            self.nonzero -= self.d.pop(h)
        self.d[h] = v; self.nonzero += v
        while len(self.d) > self.size:
            _, ov = self.d.popitem(last=False); self.nonzero -= ov
    def take(self, h):
        v = self.d.pop(h, None)
        if v is not None:
            self.nonzero -= v
        return v

class SLRU:
    """Reference of daemon/core/policy_slru.c (hot 95%, min 5%, 4 ghosts)."""
    def __init__(self, cap, hot_pct=95, min_pct=5, ghosts=4, adapt=True):
        self.cap = cap
        self.cold = collections.OrderedDict(); self.hot = collections.OrderedDict()
        self.hot_cap = cap * hot_pct // 100; self.hot_min = cap * min_pct // 100
        self.hot_max = self.hot_cap; self.adapt = adapt
        self.gh = Ghosts(ghosts * cap)
        self.reused = set()
        self.cache = self   # membership via __contains__
    def __contains__(self, h): return h in self.cold or h in self.hot
    def __len__(self): return len(self.cold) + len(self.hot)
    def ghost_take(self, h):
        v = self.gh.take(h)
        if v is None: return False
        if self.adapt:
            nhot = self.gh.nonzero; ncold = len(self.gh.d) - nhot
            if v:
                step = (ncold // nhot if nhot else ncold) or 1
                self.hot_max = min(self.hot_max + step, self.hot_cap)
            else:
                step = (nhot // ncold if ncold else nhot) or 1
                self.hot_max = max(self.hot_max - step, self.hot_min)
        return True
    def request(self, i, ids, k):
        for j in range(k):
            self.reused.add(ids[j])
        for j in range(len(ids) - 1, -1, -1):   # released tail-first
            h = ids[j]
            if h in self.cold: del self.cold[h]
            elif h in self.hot: del self.hot[h]
            else:
                if self.ghost_take(h): self.reused.add(h)
            if h in self.reused:
                self.hot[h] = 1
                while len(self.hot) > self.hot_max:
                    m, _ = self.hot.popitem(last=False); self.cold[m] = 1
            else:
                self.cold[h] = 1
    def shrink(self):
        while len(self) > self.cap:
            if self.cold: h, _ = self.cold.popitem(last=False)
            else: h, _ = self.hot.popitem(last=False)
            r = h in self.reused
            self.reused.discard(h)
            self.gh.add(h, 1 if r else 0)
