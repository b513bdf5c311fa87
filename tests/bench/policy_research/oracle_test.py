import sys
import static_idx as S
from sim import *
name = sys.argv[1]
if name == "gen":
    ensure_gen()
recs = load(TRACES[name]); nxt = next_uses(recs)
T = 0; start = []
for r in recs: start.append(T); T += len(r["hash_ids"])
def gap(j, c):
    i = c["i"]; ni = nxt[i][j]
    if ni >= NEVER: return -1
    return start[ni] - start[i]
S.FEATS["orwhether"] = lambda j, h, u, pg, c: nxt[c["i"]][j] < NEVER
S.FEATS["orgap"] = lambda j, h, u, pg, c: S.lg(gap(j, c))
S.FEATS["orwhether_uses"] = lambda j, h, u, pg, c: (nxt[c["i"]][j] < NEVER, "L" if j == c["n"] - 1 else min(u, 4))
maxage = 1 << 17; mb = S.bucket_of(maxage)
N = len(recs)
for f in sys.argv[2].split(","):
    stats, keys = S.build(recs, S.FEATS[f], 0, N // 2, maxage)
    table = {key: S.index_table(s[1], s[0], mb) for key, s in stats.items()}
    dflt = [0.0] * (mb + 1)
    res = [S.replay_static(recs, int(c / 512), keys, table, mb, maxage, default=dflt) for c in CAPS]
    print(name, f, " ".join("%.4f" % x[0] for x in res), flush=True)
