#!/usr/bin/python3
"""wgmma_sass -- reads nvdisasm's SASS of the sm_90a cubin (docs/kernels.md,
"The wgmma variant"): in every kvs_prefill_flash_wg_* kernel, Q's fragments
(the A registers of S = Q K^T's HGMMAs) must live through the key-tile loop.
ptxas 13.0 once gave P's fragments (the A registers of O += P V) the same
registers at head_dim 64, so that every tile after the first multiplied P by
K; an H100 caught it.  Checked per kernel:

  - S's HGMMAs (no tnspB) and P V's (tnspB) are both there, D/16 and 4;
  - no register of Q's is an A register of P V, or an accumulator of either;
  - inside the loop that holds S's HGMMAs (from the label a backward branch
    returns to, to that branch) no instruction writes a register of Q's.

Usage: wgmma_sass.py FILE.sass (nvdisasm -c of the cubin).  Prints one line
per kernel and exits 1 on any finding, 2 if no such kernel is there.
wgmma_sass.py --selftest runs the checks on small made-up kernels: a good
one must pass, and each planted fault must be reported.
"""
import re
import sys

INSN = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P[0-9T]+\s+)?([A-Z][A-Z0-9_.]*)\s*(.*?)\s*;")
HGMMA = re.compile(r"HGMMA\.64x(\d+)x16\S*\s+R(\d+),\s*R(\d+),")
LABEL = re.compile(r"^(\.L_x_\d+):")
BRANCH = re.compile(r"BRA\S*\s+(?:[!\w]+,\s*)?`\((\.L_x_\d+)\)")


def functions(text):
    """name -> its lines, for every kvs_prefill_flash_wg_* section."""
    out, name = {}, None
    for line in text.splitlines():
        m = re.match(r"^\.text\.(\S+):", line)
        if m:
            name = m.group(1) if m.group(1).startswith("kvs_prefill_flash_wg_") else None
            if name:
                out[name] = []
        elif name:
            out[name].append(line)
    return out


def dest_regs(op, args):
    """The registers an instruction writes (its first operand; SHFL's
    first is the predicate it writes, its register second), or ()."""
    if op.startswith("SHFL"):
        args = re.sub(r"^!?P(?:\d+|T),\s*", "", args)
    m = re.match(r"R(\d+)\b", args)
    if not m or op.startswith(("ST", "BRA", "HGMMA", "WARPGROUP", "BAR", "RED")):
        return ()
    r = int(m.group(1))
    if op.startswith("LDSM"):
        width = int(op.rsplit(".", 1)[1]) if op[-1].isdigit() else 1
    elif op.startswith("HMMA"):
        width = 4
    elif ".128" in op:
        width = 4
    elif ".64" in op or "WIDE" in op:
        width = 2
    else:
        width = 1
    return range(r, r + width)


def check(name, lines):
    d = int(re.search(r"_d(\d+)$", name).group(1))
    s_a, p_a, acc, first_s = [], [], set(), None
    for i, line in enumerate(lines):
        m = HGMMA.search(line)
        if not m:
            continue
        n, c, a = (int(g) for g in m.groups())
        acc.update(range(c, c + n // 2))
        (p_a if "tnspB" in line else s_a).append(a)
        if "tnspB" not in line and first_s is None:
            first_s = i
    bad = []
    if len(s_a) != d // 16 or len(p_a) != 4:
        bad.append(f"{len(s_a)} S and {len(p_a)} P V HGMMAs, want {d // 16} and 4")
    q = {a + k for a in s_a for k in range(4)}
    p = {a + k for a in p_a for k in range(4)}
    if q & p:
        bad.append(f"P's fragments in Q's registers R{min(q & p)}..R{max(q & p)}")
    if q & acc:
        bad.append(f"an accumulator in Q's registers R{min(q & acc)}")
    # the innermost loop around S (the key tiles): a backward branch past
    # the first S HGMMA to the closest label before it (an outer loop,
    # over the CTA's work, reloads Q, as it should)
    labels = {}
    for i, line in enumerate(lines):
        m = LABEL.match(line)
        if m:
            labels[m.group(1)] = i
    loop = None
    for i, line in enumerate(lines):
        m = BRANCH.search(line)
        if m and first_s is not None and i > first_s:
            at = labels.get(m.group(1))
            if at is not None and at < first_s and (loop is None or at > loop[0]):
                loop = (at, i)
    if loop is None:
        bad.append("no loop around S's HGMMAs")
    else:
        for line in lines[loop[0]:loop[1] + 1]:
            m = INSN.match(line)
            if m:
                hit = [r for r in dest_regs(m.group(1), m.group(2)) if r in q]
                if hit:
                    bad.append(f"Q's R{hit[0]} written in the loop: {m.group(1)} {m.group(2)}")
                    break
    print(f"{'ok  ' if not bad else 'FAIL'} {name}: Q in "
          f"{' '.join(f'R{a}' for a in s_a)}, P in {' '.join(f'R{a}' for a in p_a)}"
          + (": " + "; ".join(bad) if bad else ""))
    return not bad


def made_up(a_s=(120, 124, 128, 132), a_p=(88, 92, 96, 100), body=""):
    """A head_dim 64 kernel as nvdisasm prints one: S's HGMMAs in a loop,
    then P V's, `body` inside the loop, the back-edge."""
    ins = lambda op: f"        /*0000*/                   {op} ;"
    lines = [".text.kvs_prefill_flash_wg_fp16_d64:", ins("LDSM.16.M88.4 R120, [R2]"),
             ".L_x_7:"]
    lines += [ins(f"HGMMA.64x64x16.F32 R24, R{a}, gdesc[UR24], R24") for a in a_s]
    lines += [ins(x) for x in body.split(";") if x]
    lines += [ins(f"HGMMA.64x64x16.F32 R56, R{a}, gdesc[UR24].tnspB, R56") for a in a_p]
    lines += [ins("@!P3 BRA `(.L_x_7)"), ins("EXIT")]
    return "\n".join(lines) + "\n"


def selftest():
    cases = [("good", made_up(body="SHFL.BFLY PT, R30, R31, 0x1, 0x1f;FMNMX R30, R30, R31, !PT"), 0),
             ("P in Q's registers", made_up(a_p=(120, 92, 96, 100)), 1),
             ("Q written by an IMAD", made_up(body="IMAD R126, R4, 0x10, R5"), 1),
             ("Q written by a SHFL", made_up(body="SHFL.BFLY PT, R133, R31, 0x1, 0x1f"), 1),
             ("Q written by a 64-bit op", made_up(body="IMAD.WIDE.U32 R119, R4, 0x10, R6"), 1),
             ("an accumulator in Q", made_up(a_s=(24, 124, 128, 132)), 1),
             ("an MMA missing", made_up(a_s=(120, 124, 128)), 1),
             ("no loop", made_up().replace("@!P3 BRA `(.L_x_7)", "NOP"), 1)]
    bad = 0
    for what, text, want in cases:
        fns = functions(text)
        got = 0 if all(check(n, fns[n]) for n in fns) else 1
        if got != want:
            print(f"FAIL selftest: {what}: {'passed' if not got else 'reported'}")
            bad += 1
    print("selftest: " + ("ok" if not bad else f"{bad} wrong"))
    return 1 if bad else 0


def main():
    if sys.argv[1:] == ["--selftest"]:
        return selftest()
    text = open(sys.argv[1]).read()
    fns = functions(text)
    if not fns:
        print("no kvs_prefill_flash_wg_* kernel in the SASS")
        return 2
    ok = [check(n, fns[n]) for n in sorted(fns)]
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
