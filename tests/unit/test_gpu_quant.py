"""int8/fp8 caches, checked with numpy (cases written by test_gpu_quant.c).

For every case: the bytes, scales and int8 minimums the C write kernel left
in the pool against this file's own quantizer (exact: int8 of the row
rotated by butterflies in float32, asymmetric by float32 arithmetic and
round-half-even, fp8 e4m3 by a nearest search over
the format's values with ties to the even code); the C decode and
chunked-prefill outputs against float64 attention over the dequantized cache
(fp32 tolerance); and the quantization error, the relative RMS of the C
outputs against float64 attention over the unquantized K/V, bounded (BOUND)
and printed.  For the record, the same error with the unrotated int8
format (the one before, docs/decisions.md) is measured in numpy alongside.
Usage: test_gpu_quant.py DIR.  Exit 0 pass, 1 fail.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_gpu_numpy import (decode, decode_plane, e4m3,  # noqa: E402
                            hadamard_segments, plane_size, scale_floats,
                            sylvester)

# Bounds of the quantization error, (dtype, distribution) -> relative RMS,
# each just above the largest figure measured (docs/kernels.md, "Quantized
# KV blocks").  The aim is 1% for int8 and 4% for fp8.  int8 meets it on
# heavy-tailed K/V by its rotation: unrotated, one outlier set the step of
# its whole row (3.8% at 8192 keys, the "unrotated" column).  With outlier
# channels (4 of 128, 20 times larger) both miss it, int8 by less (1.7%
# at 8192 keys, 6.5% unrotated), fp8 by more (7.5%: the outliers' own
# 3-bit mantissa errors dominate the scores): those two bounds only catch
# a regression.
BOUND = {(3, 0): 0.01, (3, 1): 0.01, (3, 2): 0.02,
         (4, 0): 0.04, (4, 1): 0.04, (4, 2): 0.08}
NAME = {3: "int8", 4: "fp8"}
DIST = {0: "gauss", 1: "student-t3", 2: "outlier-ch"}
F32_TOL = 1e-5   # relative to the largest |V| (>= 1): fp32 sums, 8192 keys

# The 127 non-negative finite e4m3 values, code c at index c (monotonic).
E4M3 = e4m3(np.arange(127))


def rotate(x):
    """[rows][D] float32 -> the rows as the int8 format stores them: each
    power-of-two segment times its Hadamard matrix, divided by its size,
    as butterflies in float32 at distances 1, 2, 4, ... (the write
    kernel's order, so the same roundings); checked against the matrix
    product in float64."""
    y = x.astype(np.float32).copy()
    rows = y.shape[0]
    for off, m in hadamard_segments(y.shape[1]):
        s = y[:, off:off + m]
        h = 1
        while h < m:
            t = s.reshape(rows, m // (2 * h), 2, h)
            a, b = t[:, :, 0, :].copy(), t[:, :, 1, :].copy()
            t[:, :, 0, :], t[:, :, 1, :] = a + b, a - b
            s = t.reshape(rows, m)
            h *= 2
        y[:, off:off + m] = s * np.float32(1.0 / m)
        with np.errstate(invalid="ignore", over="ignore"):
            ref = x[:, off:off + m].astype(np.float64) @ sylvester(m) / m
            fin = np.isfinite(ref).all(axis=1)
            err = np.abs(y[fin, off:off + m] - ref[fin]).max(initial=0)
            assert err <= 1e-5 * max(1.0, np.abs(ref[fin]).max(initial=0)), \
                "the butterflies are not the Hadamard product"
    return y


def q_int8(x, rotated=True):
    """[rows][D] float32 -> (uint8 bytes, float32 [rows][2]: the scale and
    the minimum) of the rows rotated (rotate), asymmetric: scale (max -
    min) / 255, byte rint((x - min) / scale) in 0..255.  A constant row:
    scale 0, bytes 0.  A row with a NaN or an infinity, or whose range
    overflows float32: bytes 0, both NaN.  rotated=False: the format
    before (no rotation), for the comparison column."""
    x = rotate(x) if rotated else x.astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        lo, hi = x.min(axis=1), x.max(axis=1)
        rng = (hi - lo).astype(np.float32)
        bad = ~np.isfinite(x).all(axis=1) | ~np.isfinite(rng)
        scale = (rng / np.float32(255)).astype(np.float32)
        flat = bad | (scale == 0)
        safe = np.where(flat, np.float32(1), scale).astype(np.float32)
        q = np.rint((x - lo[:, None]) / safe[:, None]).clip(0, 255)
    q = np.where(flat[:, None], 0, q).astype(np.uint8)
    nan = np.float32(np.nan)
    scale = np.where(bad, nan, np.where(flat, 0, scale)).astype(np.float32)
    lo = np.where(bad, nan, lo).astype(np.float32)
    return q, np.stack([scale, lo], axis=1)


def to_e4m3(y):
    """float32 -> e4m3 codes: the nearest value, ties to the even code,
    saturating at 448 (no value above it to be nearer)."""
    a = np.abs(y.astype(np.float64))
    hi = np.searchsorted(E4M3, a).clip(1, 126)
    lo = hi - 1
    dlo, dhi = a - E4M3[lo], E4M3[hi] - a
    code = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi,
                                            np.where(lo % 2 == 0, lo, hi)))
    code = np.where(a >= E4M3[126], 126, code)
    return (code | np.where(np.signbit(y), 0x80, 0)).astype(np.uint8)


def q_fp8(x):
    """[rows][D] float32 -> (e4m3 codes, float32 [rows][1]: the scale)."""
    x = x.astype(np.float32)
    amax = np.abs(x).max(axis=1)
    scale = (amax / np.float32(448)).astype(np.float32)
    safe = np.where(scale == 0, np.float32(1), scale)
    codes = to_e4m3(x / safe[:, None])
    codes = np.where(scale[:, None] == 0, 0, codes).astype(np.uint8)
    return codes, scale[:, None]


def dq_unrotated(x):
    """The rows through the unrotated int8 format and back (float64)."""
    q, s = q_int8(x, rotated=False)
    s = s.astype(np.float64)
    return q.astype(np.float64) * s[:, 0:1] + s[:, 1:2]


def attention(q, K, V, scale, n, qr, kvh):
    """q [qr][H][D]; K, V [n][kvh][D]; row i at position n - qr + i."""
    H = q.shape[1]
    out = np.zeros(q.shape)
    for i in range(qr):
        nk = n - qr + i + 1
        for hq in range(H):
            h = hq // (H // kvh)
            sc = K[:nk, h, :] @ q[i, hq] * scale
            p = np.exp(sc - sc.max())
            out[i, hq] = (p / p.sum()) @ V[:nk, h, :]
    return out


def rel_rms(out, ref):
    return float(np.sqrt(np.mean((out - ref) ** 2) / np.mean(ref ** 2)))


def check(d, name, meta, table_rows):
    (dt, dist, n, sdt, stride, rows, bs, kvh, dim, H, bstride, layer,
     qr) = (int(x) for x in meta[:13])
    scale = float(meta[13])
    rd = lambda ext, t: np.fromfile(os.path.join(d, name + ext), dtype=t)
    pool = rd(".pool", np.uint8)
    table = rd(".table", "<u4")
    slots = rd(".slots", "<i8")
    src_k = decode(rd(".k", np.uint8), sdt).reshape(rows, stride)
    src_v = decode(rd(".v", np.uint8), sdt).reshape(rows, stride)
    keep = slots >= 0
    assert keep.sum() == n, "slots"
    K32 = src_k[keep, :kvh * dim].reshape(n * kvh, dim)
    V32 = src_v[keep, :kvh * dim].reshape(n * kvh, dim)
    q = rd(".q", "<f4").astype(np.float64).reshape(qr, H, dim)
    dec = rd(".dec", "<f4").astype(np.float64).reshape(1, H, dim)
    pre = rd(".pre", "<f4").astype(np.float64).reshape(qr, H, dim)
    plane = plane_size(dt, bs, kvh, dim)
    ok = True

    # 1. the bytes and scales (int8: and minimums) of every written token,
    # exactly
    nd, nf = bs * kvh * dim, scale_floats(dt)
    soff = (nd + 15) // 16 * 16
    mism = 0
    for kv, src in ((0, K32), (1, V32)):
        want_q, want_s = (q_int8 if dt == 3 else q_fp8)(src.astype(np.float32))
        want_q = want_q.reshape(n, kvh, dim)
        want_s = want_s.reshape(n, kvh, nf)
        for j in range((n + bs - 1) // bs):
            off = int(table[j]) * bstride + (layer * 2 + kv) * plane
            t = min(bs, n - j * bs)
            got_q = pool[off:off + nd].reshape(bs, kvh, dim)[:t]
            got_s = pool[off + soff:off + soff + 4 * bs * kvh * nf]
            got_s = got_s.view("<f4").reshape(bs, kvh, nf)[:t]
            mism += int((got_q != want_q[j * bs:j * bs + t]).sum())
            mism += int((got_s.view("<u4") !=
                         want_s[j * bs:j * bs + t].view("<u4")).sum())
    if mism:
        print("FAIL %s: %d bytes or scales differ from numpy's quantizer"
              % (name, mism))
        ok = False

    # 2. attention over the dequantized cache, fp32 tolerance
    blocks = [decode_plane(pool[int(table[j]) * bstride + (layer * 2 + kv) *
                                plane:][:plane], dt, bs, kvh, dim)
              for kv in (0, 1) for j in range((n + bs - 1) // bs)]
    nb = (n + bs - 1) // bs
    Kq = np.concatenate(blocks[:nb])[:n]
    Vq = np.concatenate(blocks[nb:])[:n]
    ref_q = attention(q, Kq, Vq, scale, n, qr, kvh)
    tol = F32_TOL * max(1.0, float(np.abs(Vq).max()))
    err = max(float(np.abs(pre - ref_q).max()),
              float(np.abs(dec[0] - ref_q[-1]).max()))
    if not err <= tol:
        print("FAIL %s: attention over the dequantized cache: max err %.3g "
              "(tolerance %.3g)" % (name, err, tol))
        ok = False

    # 3. the quantization error against the unquantized K/V
    K = K32.reshape(n, kvh, dim)
    V = V32.reshape(n, kvh, dim)
    ref = attention(q, K, V, scale, n, qr, kvh)
    e = rel_rms(pre, ref)
    sym = ""
    if dt == 3:
        Ks = dq_unrotated(K32).reshape(n, kvh, dim)
        Vs = dq_unrotated(V32).reshape(n, kvh, dim)
        sym = "%.3f%%" % (100 * rel_rms(attention(q, Ks, Vs, scale, n, qr,
                                                  kvh), ref))
    if name.startswith("err"):
        table_rows.append((NAME[dt], DIST[dist], n, 100 * e, sym))
        if not e <= BOUND[dt, dist]:
            print("FAIL %s: %s %s n=%d: relative RMS error %.3f%% over the "
                  "bound %.1f%%" % (name, NAME[dt], DIST[dist], n, 100 * e,
                                    100 * BOUND[dt, dist]))
            ok = False
    print("%s %s: %s dist=%s n=%d src=%d: dequantized max err %.2g; "
          "quantization error %.3f%%%s" % ("ok  " if ok else "FAIL", name,
                                          NAME[dt], DIST[dist], n, sdt,
                                          err, 100 * e,
                                          " (unrotated: %s)" % sym if sym else ""))
    return ok


def main():
    d = sys.argv[1]
    ok, count, table_rows = True, 0, []
    with open(os.path.join(d, "cases.txt")) as f:
        for line in f:
            parts = line.split()
            if parts:
                ok = check(d, parts[0], parts[1:], table_rows) and ok
                count += 1
    print("\nquantization error (relative RMS of attention outputs against "
          "fp32 K/V; prefill rows, fp32 q/out):")
    print("| dtype | K/V | keys | error | int8 unrotated |")
    print("|---|---|---:|---:|---:|")
    for r in table_rows:
        print("| %s | %s | %d | %.3f%% | %s |" % (r[0], r[1], r[2], r[3],
                                                  r[4] or "-"))
    print("numpy %s, %d cases" % (np.__version__, count))
    sys.exit(0 if ok and count else 1)


if __name__ == "__main__":
    main()
