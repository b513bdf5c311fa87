"""The most an index policy on a feature set could get (kbound.py: a
knapsack/LP optimum, optimistic), in-sample on the whole trace and out of
sample on its second half.

usage: ceilings.py conv|syn|gen FEATURES[,FEATURES...]  (static_idx.FEATS,
feats_more.py)"""
import sys
import feats_more
import kbound
from sim import *
import static_idx as S
name = sys.argv[1]
if name == "gen":
    ensure_gen()
recs = load(TRACES[name]); N = len(recs)
T = sum(len(r["hash_ids"]) for r in recs)
for f in sys.argv[2].split(","):
    G, NN = kbound.analyse(recs, S.FEATS[f]); P = kbound.prep(G)
    G1, N1 = kbound.analyse(recs, S.FEATS[f], 0, N // 2)
    G2, N2 = kbound.analyse(recs, S.FEATS[f], N // 2, N)
    ins = [kbound.bound(P, int(c / 512) * T, NN) for c in CAPS]
    oos = [kbound.bound_oos(G1, G2, int(c / 512) * N2, N2) for c in CAPS]
    ins2 = [kbound.bound(kbound.prep(G2), int(c / 512) * N2, N2) for c in CAPS]
    print("%-5s %-12s cls=%-4d full-in-sample %s | 2nd-half: oos %s in-sample %s" % (name, f, len(G),
          " ".join("%.4f" % x for x in ins), " ".join("%.4f" % x for x in oos), " ".join("%.4f" % x for x in ins2)), flush=True)
