"""Final table: every policy on conv/syn/gen at 1e6/3e6/1e7, full trace and
second half (cache warmed by the first half).  Parameters were chosen on the
first halves (run_on.py ... first, run_lot.py ... first)."""
import sys, time
from sim import *
from online import GIX
from lottery import Lottery
from lhd import LHD, CLASSIFIERS
import static_idx as S
POLS = [
  ("lru", lambda cap, recs, nxt: LRU(cap)),
  ("slru", lambda cap, recs, nxt: SLRU(cap)),
  ("lhd-uses", lambda cap, recs, nxt: LHD(cap, *CLASSIFIERS["uses"])),
  ("gix-lists", lambda cap, recs, nxt: GIX(cap, mode="lists", mono=True)),
  ("gix-sample", lambda cap, recs, nxt: GIX(cap, mode="sample", umax=8)),
  ("credit", lambda cap, recs, nxt: Lottery(cap, lambda p, h, j, n, u, r: (j < n - 1) * min(u, 4) * 2 * cap)),
  ("oradm", lambda cap, recs, nxt: ORADM(cap, nxt)),
  ("opt", lambda cap, recs, nxt: OPT(cap, nxt)),
]
names = sys.argv[1].split(",")
sel = sys.argv[2].split(",") if len(sys.argv) > 2 else [p for p, _ in POLS]
for name in names:
    if name == "gen":
        ensure_gen()
    recs = load(TRACES[name]); N = len(recs); nxt = next_uses(recs)
    for pn, mk in POLS:
        if pn not in sel: continue
        t0 = time.time(); full = []; sec = []
        for c in CAPS:
            cap = int(c / 512)
            for lo, out in ((0, full), (N // 2, sec)):
                p = mk(cap, recs, nxt)
                out.append(replay2(recs, p, lo=lo) if hasattr(p, "shrink") else replay(recs, cap, p, lo=lo))
        print("%-5s %-11s full %s | second-half %s  (%.0fs)" % (name, pn, " ".join("%.4f" % x for x in full),
              " ".join("%.4f" % x for x in sec), time.time() - t0), flush=True)
