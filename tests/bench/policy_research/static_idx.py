"""Static index tables: classes from policy-independent features; per class
reuse-time distribution measured on a training range of the trace (first
half by default); index = Gittins-like max_H hits/slot-time.  Then replay
with sampled eviction (lowest index; cascade) on the full trace."""
import collections, random, math, sys, time
from sim import *
from gittins import bucket_of, LO

def feats_gen(recs, featfn):
    """yield (i, j, h, t, key) for every access, computing online features.
    featfn(j, h, uses, prevgap, ctx); ctx has i, n, k, turn, r, t, and the
    per-block dicts first (time of first use), kids (distinct children seen),
    pg2 (previous-previous gap), rpg (time since this conversation's
    previous request, -1 if none)."""
    uses = collections.Counter(); lastt = {}; owner = {}; turn = {}
    first = {}; kids = collections.Counter(); pg2 = {}; reqt = {}
    t = 0
    for i, r in enumerate(recs):
        ids = r["hash_ids"]; n = len(ids)
        k = 0
        while k < n and ids[k] in owner: k += 1
        tr = turn.get(owner[ids[k - 1]], -1) + 1 if k >= 2 else 0
        rpg = t - reqt[owner[ids[k - 1]]] if k >= 2 else -1
        turn[i] = tr; reqt[i] = t
        ctx = dict(i=i, n=n, k=k, turn=tr, r=r, first=first, kids=kids, pg2=pg2, rpg=rpg)
        for j, h in enumerate(ids):
            t += 1
            if h not in first:
                first[h] = t
                if j: kids[ids[j - 1]] += 1
            pg = t - lastt[h] if h in lastt else -1
            ctx["t"] = t
            key = featfn(j, h, uses[h], pg, ctx)
            yield i, j, h, t, key
            uses[h] += 1
            if h in lastt: pg2[h] = pg
            lastt[h] = t
        for h in ids: owner[h] = i

def build(recs, featfn, lo, hi, maxage=1 << 17):
    T = 0; start = []
    for r in recs: start.append(T); T += len(r["hash_ids"])
    nxt = next_uses(recs)
    stats = collections.defaultdict(lambda: [0, [0] * (bucket_of(maxage) + 1)])
    keys = []
    for i, j, h, t, key in feats_gen(recs, featfn):
        keys.append(key)
        if lo <= i < hi:
            s = stats[key]; s[0] += 1
            ni = nxt[i][j]
            if ni < NEVER:
                # time of the next use
                g = start[ni] + recs[ni]["hash_ids"].index(h) + 1 - t
                if g < maxage: s[1][bucket_of(g)] += 1
    return stats, keys

def index_table(R, tot, mb, minn=1):
    surv = []; acc = tot
    for b in range(mb + 1):
        surv.append(acc); acc -= R[b]
    I = [0.0] * (mb + 1)
    for b in range(mb + 1):
        if surv[b] <= minn: continue
        best = num = den = 0.0
        for e in range(b, mb + 1):
            w = LO[e + 1] - LO[e]
            den += (surv[e] - R[e] * 0.5) * w; num += R[e]
            if den > 0 and num / den > best: best = num / den
        I[b] = best
    return I

def replay_static(recs, cap, keys, table, mb, maxage, S=64, seed=1, default=None, leaf=True):
    """leaf=True: sample only cached blocks with no cached child."""
    rng = random.Random(seed)
    cache = {}; arr = []; pos = {}; children = collections.defaultdict(set)
    par = {}
    hits = tot = 0; t = 0; ai = 0
    half = len(recs) // 2; hits2 = tot2 = 0
    def arr_add(h):
        pos[h] = len(arr); arr.append(h)
    def arr_rm(h):
        p = pos.pop(h); last = arr.pop()
        if p < len(arr): arr[p] = last; pos[last] = p
    for i, r in enumerate(recs):
        ids = r["hash_ids"]; n = len(ids)
        k = 0
        while k < n - 1 and ids[k] in cache: k += 1
        hits += k; tot += n
        if i >= half: hits2 += k; tot2 += n
        for j, h in enumerate(ids):
            t += 1
            if h not in cache:
                if j:
                    p = ids[j - 1]; par[h] = p
                    ch = children[p]
                    if leaf and not ch and p in pos: arr_rm(p)
                    ch.add(h)
                arr_add(h)
            I = table.get(keys[ai], default); ai += 1
            cache[h] = (t, I)
        while len(cache) > cap:
            best = None; bd = 9e99; bt = 0; L = len(arr)
            for _ in range(S):
                h = arr[int(rng.random() * L)]
                lt, I = cache[h]
                a = t - lt
                d = I[bucket_of(a) if a < maxage else mb]
                if d < bd or (d == bd and lt < bt):
                    bd = d; best = h; bt = lt
            st = [best]
            while st:
                x = st.pop()
                if x in cache:
                    del cache[x]
                    if x in pos: arr_rm(x)
                    st.extend(children.pop(x, ()))
                    p = par.get(x)
                    if p is not None and p in cache:
                        ch = children.get(p)
                        if ch is not None:
                            ch.discard(x)
                            if leaf and not ch and p not in pos: arr_add(p)
    return hits / tot, hits2 / tot2

def lg(x): return -1 if x < 0 else min(int(math.log2(x + 1)), 17)
FEATS = {
 "none": lambda j, h, u, pg, c: 0,
 "uses": lambda j, h, u, pg, c: ("L" if j == c["n"] - 1 else min(u, 4)),
 "uses8": lambda j, h, u, pg, c: ("L" if j == c["n"] - 1 else min(u, 8)),
 "usesk": lambda j, h, u, pg, c: ("L" if j == c["n"] - 1 else (min(u, 4), c["k"] > 1)),
 "usesturn": lambda j, h, u, pg, c: ("L" if j == c["n"] - 1 else (min(u, 4), min(c["turn"], 4))),
 "usespg": lambda j, h, u, pg, c: ("L" if j == c["n"] - 1 else (min(u, 4), lg(pg) // 2)),
 "usesdepth": lambda j, h, u, pg, c: ("L" if j == c["n"] - 1 else (min(u, 4), min(lg(j), 6))),
 "all": lambda j, h, u, pg, c: ("L" if j == c["n"] - 1 else (min(u, 4), min(c["turn"], 3), lg(pg) // 2, min(lg(j), 6) // 2)),
}

if __name__ == "__main__":
    names = sys.argv[1].split(","); fl = sys.argv[2].split(",")
    train = sys.argv[3] if len(sys.argv) > 3 else "first"
    maxage = 1 << 17; mb = bucket_of(maxage)
    for name in names:
        recs = load(TRACES[name]); N = len(recs)
        lo, hi = (0, N // 2) if train == "first" else (0, N)
        for f in fl:
            t0 = time.time()
            stats, keys = build(recs, FEATS[f], lo, hi, maxage)
            table = {key: index_table(s[1], s[0], mb) for key, s in stats.items()}
            dflt = index_table(*[[sum(s[1][b] for s in stats.values()) for b in range(mb + 1)],
                                  sum(s[0] for s in stats.values())], mb)
            res = [replay_static(recs, int(c / 512), keys, table, mb, maxage, default=dflt) for c in CAPS]
            print(name, f, "train=" + train, "classes=%d" % len(table),
                  "full", " ".join("%.4f" % x[0] for x in res),
                  "| 2nd half", " ".join("%.4f" % x[1] for x in res), "%.0fs" % (time.time() - t0), flush=True)

def replay_classlru(recs, cap, keys, table, mb, maxage, default=None, monotone=False):
    """Per-class LRU lists; evict, among the classes' LRU-oldest blocks, the
    one whose (class, age) index is lowest; cascade to cached descendants."""
    cls_of = {}; lists = {}
    cache = {}; children = collections.defaultdict(set)
    hits = tot = 0; t = 0; ai = 0
    half = len(recs) // 2; hits2 = tot2 = 0
    tabs = {}
    for key, I in table.items():
        if monotone:
            J = list(I)
            for b in range(len(J) - 2, -1, -1): J[b] = max(J[b], J[b + 1])
            I = J
        tabs[key] = I
    for i, r in enumerate(recs):
        ids = r["hash_ids"]; n = len(ids)
        k = 0
        while k < n - 1 and ids[k] in cache: k += 1
        hits += k; tot += n
        if i >= half: hits2 += k; tot2 += n
        for j in range(n):     # touch tail-first so a parent is younger
            pass
        for j, h in enumerate(ids):
            t += 1
            key = keys[ai]; ai += 1
            old = cache.get(h)
            if old is not None:
                del lists[cls_of[h]][h]
            elif j:
                children[ids[j - 1]].add(h)
            if key not in lists: lists[key] = collections.OrderedDict()
            # parents younger than children: give block j time t - j*eps
            lists[key][h] = t
            cls_of[h] = key; cache[h] = t
        while len(cache) > cap:
            best = None; bd = 9e99
            for key, L in lists.items():
                if not L: continue
                h = next(iter(L)); lt = L[h]; a = t - lt
                I = tabs.get(key, default)
                d = I[S_b(a, maxage, mb)]
                if d < bd: bd = d; best = h
            st = [best]
            while st:
                x = st.pop()
                if x in cache:
                    del cache[x]; del lists[cls_of.pop(x)][x]
                    st.extend(children.pop(x, ()))
    return hits / tot, hits2 / tot2

def S_b(a, maxage, mb):
    return bucket_of(a) if a < maxage else mb
