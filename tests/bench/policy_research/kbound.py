"""Knapsack estimate of what an index policy on a feature set can reach:
per class, keep every access up to a horizon H_c (or until its reuse);
choose H_c by a Lagrange multiplier so that total slot-time <= C*T.
Ignores chain effects; calibrate against simulations."""
import sys, collections, math, bisect
from sim import *
import static_idx as S

def analyse(recs, featfn, lo=0, hi=None):
    hi = len(recs) if hi is None else hi
    T = 0; start = []
    for r in recs: start.append(T); T += len(r["hash_ids"])
    nxt = next_uses(recs)
    # position of h in next request: approximate by same j (prefix ids keep depth)
    G = collections.defaultdict(list); N = 0
    for i, j, h, t, key in S.feats_gen(recs, featfn):
        if not (lo <= i < hi): continue
        N += 1
        ni = nxt[i][j]
        g = start[ni] + j + 1 - t if ni < NEVER else NEVER
        G[key].append(g)
    return G, N

HS = [int(2 ** (x / 4)) for x in range(0, 4 * 18)] + [NEVER]
def prep(G):
    out = []
    for key, gs in G.items():
        gs.sort(); n = len(gs)
        pre = [0]
        for g in gs: pre.append(pre[-1] + (g if g < NEVER else 0))
        opts = []
        for H in HS[:-1]:
            m = bisect.bisect_right(gs, H)       # hits: reuse within H
            cost = pre[m] + (n - m) * H
            opts.append((m, cost))
        out.append(opts)
    return out

def hull_segs(P):
    segs = []
    for ci, opts in enumerate(P):
        pts = sorted(set([(0, 0)] + [(c, m) for m, c in opts]))
        hull = []
        for p in pts:
            while len(hull) >= 2:
                (x1, y1), (x2, y2) = hull[-2], hull[-1]
                if (y2 - y1) * (p[0] - x1) <= (p[1] - y1) * (x2 - x1): hull.pop()
                else: break
            hull.append(p)
        for (x1, y1), (x2, y2) in zip(hull, hull[1:]):
            if y2 > y1 and x2 > x1: segs.append(((y2 - y1) / (x2 - x1), ci, x1, x2))
    return segs

def bound_oos(G1, G2, budget2, N2):
    """segments (class, horizon range) ordered by first-half slope; hits and
    costs measured on the second half."""
    keys = list(G1)
    P1 = prep({k: G1[k] for k in keys})
    segs = hull_segs(P1); segs.sort(reverse=True)
    # second half options per class indexed like HS
    P2 = prep({k: G2.get(k, []) for k in keys})
    # map cost boundary x in first half back to horizon index
    hsx = []
    for ci, opts in enumerate(P1):
        hsx.append({c: hi for hi, (m, c) in enumerate(opts)})
    hits = 0.0; left = budget2
    for sl, ci, x1, x2 in segs:
        h1 = hsx[ci].get(x1, -1); h2 = hsx[ci][x2]
        m1, c1 = (0, 0) if h1 < 0 else P2[ci][h1]
        m2, c2 = P2[ci][h2]
        dc, dh = c2 - c1, m2 - m1
        if dc <= 0: hits += dh; continue
        if dc <= left: hits += dh; left -= dc
        else: hits += dh * left / dc; break
    return hits / N2

def bound(P, budget, N):
    """LP relaxation: per class the upper concave hull of (cost, hits);
    take hull segments by decreasing slope until the budget is spent
    (a fraction of a segment = admitting a random fraction)."""
    segs = []
    for opts in P:
        pts = sorted(set([(0, 0)] + [(c, m) for m, c in opts]))
        hull = []
        for p in pts:
            while len(hull) >= 2:
                (x1, y1), (x2, y2) = hull[-2], hull[-1]
                if (y2 - y1) * (p[0] - x1) <= (p[1] - y1) * (x2 - x1): hull.pop()
                else: break
            hull.append(p)
        for (x1, y1), (x2, y2) in zip(hull, hull[1:]):
            if y2 > y1 and x2 > x1: segs.append(((y2 - y1) / (x2 - x1), x2 - x1, y2 - y1))
    segs.sort(reverse=True)
    hits = 0.0; left = budget
    for sl, dc, dh in segs:
        if dc <= left: hits += dh; left -= dc
        else: hits += sl * left; break
    return hits / N

if __name__ == "__main__":
    name = sys.argv[1]; recs = load(TRACES[name])
    nxt = next_uses(recs)
    T = sum(len(r["hash_ids"]) for r in recs)
    for f in sys.argv[2].split(","):
        G, N = analyse(recs, S.FEATS[f])
        P = prep(G)
        print(name, f, "classes", len(G), " ".join("%.0e:%.4f" % (c, bound(P, int(c / 512) * T, N)) for c in CAPS), flush=True)
