import math
import static_idx as S
lg = S.lg
F = S.FEATS
def L(j, c): return j == c["n"] - 1
F["turn"] = lambda j, h, u, pg, c: "L" if L(j, c) else min(c["turn"], 6)
F["pg"] = lambda j, h, u, pg, c: "L" if L(j, c) else lg(pg)
F["usespg1"] = lambda j, h, u, pg, c: "L" if L(j, c) else (min(u, 6), lg(pg))
F["usesturnpg"] = lambda j, h, u, pg, c: "L" if L(j, c) else (min(u, 4), min(c["turn"], 4), lg(pg) // 2)
F["usesk2"] = lambda j, h, u, pg, c: "L" if L(j, c) else (min(u, 6), min(c["k"], 3), j >= c["k"])
F["outlen"] = lambda j, h, u, pg, c: "L" if L(j, c) else (min(u, 4), lg(c["r"]["output_length"]) // 2)
F["nlen"] = lambda j, h, u, pg, c: "L" if L(j, c) else (min(u, 4), lg(c["n"]))
def kidsb(h, c):
    x = c["kids"][h]; return 0 if x == 0 else 1 if x == 1 else 2
F["usespgkids"] = lambda j, h, u, pg, c: "L" if L(j, c) else (min(u, 6), lg(pg), kidsb(h, c))
F["usespgout"] = lambda j, h, u, pg, c: "L" if L(j, c) else (min(u, 4), lg(pg) // 2, lg(c["r"]["output_length"]) // 3)
F["usespgrpg"] = lambda j, h, u, pg, c: "L" if L(j, c) else (min(u, 4), lg(pg) // 2, lg(c["rpg"]) // 2)
F["usespgpg2"] = lambda j, h, u, pg, c: "L" if L(j, c) else (min(u, 4), lg(pg) // 2, lg(c["pg2"].get(h, -1)) // 2)
F["usesrate"] = lambda j, h, u, pg, c: "L" if L(j, c) else (min(u, 6), lg(pg), lg((c["t"] - c["first"][h]) // max(u, 1)) // 2)
