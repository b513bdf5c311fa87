#!/usr/bin/env python3
"""What finer int8 scales, or a rotation, would buy: the quantization error
of attention over int8 K/V with one scale and minimum per row of a kv head
(the cache's format, docs/kernels.md) against one per group of 64, 32 or
16 elements of the row, and against the row format over rotated rows (a
Hadamard rotation of K and V before quantizing, as QuaRot does; q rotated
alike, the output rotated back), and the bytes each costs.  numpy only; no
kvshare code runs.

The setting is test_gpu_quant's: head_dim 128, 8 query heads over 2 kv
heads, q Gaussian, softmax scale 1/sqrt(128), K/V Gaussian, Student-t
with 3 degrees of freedom, or Gaussian with 4 outlier channels (fixed
elements of every row 20 times larger, as a real model's K has), the last
8 positions of 17, 512 and 8192 keys; the error is the relative RMS of the
outputs against float64 attention over the unquantized K/V.  Each group's
scale and minimum are float32 (as the cache keeps them), or float16
(--half: half the bytes; their rounding adds to the error).  The last two
columns are fp8 (e4m3, a float32 scale per row: the cache's fp8 format,
quantized by tests/unit/test_gpu_quant.py's numpy quantizer) without and
with the same rotation, for the question whether fp8 would gain from it
too.  The rotation
is H / sqrt(128), H the 128 x 128 Sylvester-Hadamard matrix (orthogonal:
scores and outputs are unchanged without quantization); it costs no bytes.
Deterministic (seeded).

usage: quant_groups.py [--half] [--keys 17,512,8192]
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "unit"))
from test_gpu_numpy import e4m3, sylvester  # noqa: E402
from test_gpu_quant import q_fp8  # noqa: E402

D, H, KVH = 128, 8, 2
GROUPS = (128, 64, 32, 16)


def dequant(x, g, half):
    """[rows][D] float32 -> float64 after int8 with a scale and minimum per
    group of g elements (asymmetric, round half to even, 0..255)."""
    r, d = x.shape
    y = x.reshape(r, d // g, g).astype(np.float32)
    lo = y.min(axis=2, keepdims=True)
    hi = y.max(axis=2, keepdims=True)
    s = ((hi - lo) / np.float32(255)).astype(np.float32)
    if half:  # kept as float16 (nearest); codes clipped to 0..255
        lo = lo.astype(np.float16).astype(np.float32)
        s = s.astype(np.float16).astype(np.float32)
    safe = np.where(s == 0, np.float32(1), s)
    q = np.rint((y - lo) / safe).clip(0, 255)
    return (q * s.astype(np.float64) + lo).reshape(r, d)


ROT = sylvester(D) / np.sqrt(D)  # orthogonal


def dequant_fp8(x):
    """[rows][D] float32 -> float64 after fp8 e4m3 with a scale per row."""
    codes, scale = q_fp8(x.astype(np.float32))
    return e4m3(codes) * scale.astype(np.float64)


def dequant_rotated(x, half):
    """dequant of the rotated rows, rotated back (ROT is symmetric)."""
    xr = (x.astype(np.float64) @ ROT).astype(np.float32)
    return dequant(xr, D, half) @ ROT


def draws(rng):
    """The K/V distributions, by name: [n][KVH][D] float32 each."""
    def outliers(shape):
        x = rng.standard_normal(shape)
        x[..., [3, 50, 77, 101]] *= 20.0
        return x
    return (("gauss", rng.standard_normal),
            ("student-t3", lambda shape: rng.standard_t(3, shape)),
            ("outlier-ch", outliers))


def attn(q, k, v):
    out = np.zeros((H, D))
    for h in range(H):
        kv = h // (H // KVH)
        s = (k[:, kv, :] @ q[h]) / np.sqrt(D)
        p = np.exp(s - s.max())
        out[h] = (p / p.sum()) @ v[:, kv, :]
    return out


def main():
    half = "--half" in sys.argv
    keys = [17, 512, 8192]
    if "--keys" in sys.argv:
        keys = [int(x) for x in sys.argv[sys.argv.index("--keys") + 1].split(",")]
    rng = np.random.default_rng(7)
    sb = 2 if half else 4
    print("int8 K/V, a scale and minimum (float%d) per group; bytes per row of "
          "128 (fp16: 256):" % (16 if half else 32))
    print("  " + "  ".join("g%-3d %3d B" % (g, D + 2 * sb * (D // g)) for g in GROUPS)
          + "  rotated %3d B" % (D + 2 * sb))
    print("relative RMS error of attention against float64 over unquantized K/V:")
    print("%-11s %5s  " % ("K/V", "keys") + "  ".join("%8s" % ("g%d" % g) for g in GROUPS)
          + "  %8s  %8s  %8s" % ("rotated", "fp8", "fp8 rot"))
    for dist, draw in draws(rng):
        for n in keys:
            k = draw((n, KVH, D)).astype(np.float32)
            v = draw((n, KVH, D)).astype(np.float32)
            kq = {g: dequant(k.reshape(-1, D), g, half).reshape(n, KVH, D) for g in GROUPS}
            vq = {g: dequant(v.reshape(-1, D), g, half).reshape(n, KVH, D) for g in GROUPS}
            kq["rot"] = dequant_rotated(k.reshape(-1, D), half).reshape(n, KVH, D)
            vq["rot"] = dequant_rotated(v.reshape(-1, D), half).reshape(n, KVH, D)
            for name, kv, out_q in (("fp8", None, None), ("fp8r", ROT, None)):
                for src, dst in ((k, kq), (v, vq)):
                    x = src.reshape(-1, D)
                    y = dequant_fp8(x) if kv is None else \
                        dequant_fp8((x.astype(np.float64) @ kv).astype(np.float32)) @ kv
                    dst[name] = y.reshape(n, KVH, D)
            ref, out = [], {g: [] for g in kq}
            for pos in range(max(0, n - 8), n):
                q = rng.standard_normal((H, D))
                ref.append(attn(q, k[:pos + 1].astype(np.float64),
                                v[:pos + 1].astype(np.float64)))
                for g in kq:
                    out[g].append(attn(q, kq[g][:pos + 1], vq[g][:pos + 1]))
            r = np.array(ref)
            err = [np.sqrt(((np.array(out[g]) - r) ** 2).mean() / (r ** 2).mean())
                   for g in kq]
            print("%-11s %5d  " % (dist, n) + "  ".join("%7.3f%%" % (100 * e) for e in err),
                  flush=True)


if __name__ == "__main__":
    main()
