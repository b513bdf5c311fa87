"""Independent cross-check of the C attention twins with numpy.

Reads the cases that test_gpu_numpy wrote (raw pool bytes, q, block tables,
lengths, and the C kernels' output), decodes the pool with its own layout
arithmetic (block-major: block, then layer, then K plane / V plane, each
[block_size][num_kv_heads][head_dim], an int8/fp8 plane followed by its
scales, int8's with the rows' minimums) and its own dtype decoding
(dequantized for int8/fp8), computes
attention with numpy in float64, and compares.  Exit 0 pass, 1 fail.
Usage: test_gpu_numpy.py DIR
"""
import os
import sys

import numpy as np


def e4m3(codes):
    """fp8 e4m3 (FN) codes -> float64, from the format's definition."""
    c = codes.astype(np.int64)
    e = (c >> 3) & 15
    m = (c & 7).astype(np.float64)
    mag = np.where(e == 0, m / 8 * 2.0 ** -6, (1 + m / 8) * 2.0 ** (e - 7))
    mag = np.where((c & 0x7f) == 0x7f, np.nan, mag)
    return np.where(c & 0x80, -mag, mag)


def scale_floats(dtype):
    """float32 per (token, kv head): int8 a scale and the row's minimum, fp8
    a scale."""
    return {3: 2, 4: 1}.get(dtype, 0)


def hadamard_segments(dim):
    """The power-of-two segments of an int8 row, largest first: [(off, m)]."""
    segs, off = [], 0
    while off < dim:
        m = 1 << ((dim - off).bit_length() - 1)
        segs.append((off, m))
        off += m
    return segs


def sylvester(m):
    """The m x m Hadamard matrix [[H, H], [H, -H]], float64."""
    h = np.ones((1, 1))
    while h.shape[0] < m:
        h = np.block([[h, h], [h, -h]])
    return h


def unrotate(y):
    """int8 rows as stored (rotated) -> the rows: y [..., dim] times the
    Hadamard matrix of each segment (float64; docs/kernels.md)."""
    x = np.array(y, dtype=np.float64)
    for off, m in hadamard_segments(y.shape[-1]):
        x[..., off:off + m] = y[..., off:off + m] @ sylvester(m)
    return x


def decode_plane(raw, dtype, bs, kvh, dim):
    """One K or V plane -> [bs][kvh][dim] float64.  int8/fp8 planes: the
    bytes, padded to 16, then float32 [bs][kvh][scale_floats] (docs/kernels.md):
    int8 reads as byte (unsigned) * scale + minimum, rotated back
    (unrotate), fp8 as value * scale."""
    if dtype not in (3, 4):
        return decode(raw, dtype).reshape(bs, kvh, dim)
    n, nf = bs * kvh * dim, scale_floats(dtype)
    data = np.ascontiguousarray(raw[:n])
    soff = (n + 15) // 16 * 16
    sc = np.ascontiguousarray(raw[soff:soff + 4 * bs * kvh * nf]).view("<f4")
    sc = sc.astype(np.float64).reshape(bs, kvh, nf)
    vals = (data.astype(np.float64) if dtype == 3
            else e4m3(data)).reshape(bs, kvh, dim)
    with np.errstate(invalid="ignore"):  # unused slots: poisoned scales
        if dtype == 3:
            return unrotate(vals * sc[:, :, 0:1] + sc[:, :, 1:2])
        return vals * sc[:, :, 0:1]


def plane_size(dtype, bs, kvh, dim):
    if dtype not in (3, 4):
        return bs * kvh * dim * ESIZE[dtype]
    r16 = lambda x: (x + 15) // 16 * 16
    return r16(bs * kvh * dim) + r16(4 * bs * kvh * scale_floats(dtype))


def decode(raw, dtype):
    raw = np.ascontiguousarray(raw)
    if dtype == 0:
        return raw.view("<f4").astype(np.float64)
    if dtype == 1:
        return raw.view("<f2").astype(np.float64)
    u = raw.view("<u2").astype(np.uint32) << 16
    return u.view("<f4").astype(np.float64)


ESIZE = {0: 4, 1: 2, 2: 2, 3: 1, 4: 1}
TOL = {0: 5e-5, 1: 2e-3, 2: 1.6e-2}


def check(d, name, meta):
    (dt, qdt, bs, nl, layer, kvh, dim, nh, nblk, stride, nseq, mb, prefill) = (
        int(x) for x in meta[:13])
    scale = float(meta[13])
    rd = lambda ext, t: np.fromfile(os.path.join(d, name + ext), dtype=t)
    pool = rd(".pool", np.uint8)
    assert pool.size == nblk * stride, "pool size"
    lens = rd(".lens", "<u4")
    tables = rd(".tables", "<u4").reshape(nseq, mb)
    qstart = rd(".qstart", "<u4") if prefill else np.arange(nseq + 1, dtype=np.uint32)
    rows = int(qstart[-1])
    q = decode(rd(".q", np.uint8), qdt).reshape(rows, nh, dim)
    out = decode(rd(".out", np.uint8), qdt).reshape(rows, nh, dim)

    plane = plane_size(dt, bs, kvh, dim)

    def plane_of(b, kv):
        off = b * stride + (layer * 2 + kv) * plane
        return decode_plane(pool[off:off + plane], dt, bs, kvh, dim)

    worst = 0.0
    group = nh // kvh
    for s in range(nseq):
        n = int(lens[s])
        nb = (n + bs - 1) // bs
        if nb:
            K = np.concatenate([plane_of(int(tables[s, j]), 0) for j in range(nb)])[:n]
            V = np.concatenate([plane_of(int(tables[s, j]), 1) for j in range(nb)])[:n]
        qlen = int(qstart[s + 1] - qstart[s])
        for i in range(qlen):
            r = int(qstart[s]) + i
            nk = n - qlen + i + 1 if n else 0
            for hq in range(nh):
                if nk == 0:
                    ref = np.zeros(dim)
                else:
                    h = hq // group
                    sc = K[:nk, h, :] @ q[r, hq] * scale
                    p = np.exp(sc - sc.max())
                    ref = (p / p.sum()) @ V[:nk, h, :]
                err = np.max(np.abs(out[r, hq] - ref))
                if not np.isfinite(err):
                    err = np.inf
                worst = max(worst, err)
    ok = worst <= TOL[qdt]
    print("%s %s: kv=%d qo=%d bs=%d kvh=%d heads=%d D=%d prefill=%d max err %.3g"
          % ("ok  " if ok else "FAIL", name, dt, qdt, bs, kvh, nh, dim, prefill, worst))
    return ok


def main():
    d = sys.argv[1]
    ok = True
    count = 0
    with open(os.path.join(d, "cases.txt")) as f:
        for line in f:
            parts = line.split()
            if parts:
                ok = check(d, parts[0], parts[1:]) and ok
                count += 1
    print("numpy %s, %d cases" % (np.__version__, count))
    if count == 0:
        ok = False
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
