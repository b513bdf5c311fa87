"""int8/fp8 pools: views of the bytes and of their float32 row parameters,
and the dequantize helpers, against an independent decode written out
here (docs/kernels.md, Quantized KV blocks).  Rows are written by the C
library's own quantizer (kvs_quantize_row, called through ctypes) into
the binding's views, and for int8 checked against a numpy quantizer (its
rotation written out here too, and checked against the Hadamard matrix)."""
import ctypes
import math

import numpy as np
import pytest

import kvshare
from conftest import SMALL


def _clib():
    lib = ctypes.CDLL(kvshare.library_path())
    lib.kvs_quantize_row.restype = ctypes.c_int
    lib.kvs_quantize_row.argtypes = [ctypes.c_void_p, ctypes.c_void_p,
                                     ctypes.c_uint32, ctypes.c_void_p,
                                     ctypes.c_size_t]
    lib.kvs_fp8_to_float.restype = ctypes.c_float
    lib.kvs_fp8_to_float.argtypes = [ctypes.c_uint8]
    return lib


def fp8_ref(b):
    """e4m3 "FN" from its definition, one byte at a time, in float64."""
    sign = -1.0 if b & 0x80 else 1.0
    e, m = (b >> 3) & 15, b & 7
    if e == 15 and m == 7:
        return math.nan
    if e == 0:
        return sign * math.ldexp(m, -9)           # m/8 * 2**-6
    return sign * math.ldexp(8 + m, e - 10)       # (1 + m/8) * 2**(e-7)


FP8_REF = np.array([fp8_ref(b) for b in range(256)], dtype=np.float32)


def sylvester(m):
    """The m x m Hadamard matrix, entry (i, j) = (-1)^popcount(i & j)."""
    i = np.arange(m)
    par = np.vectorize(lambda v: bin(v).count("1") & 1)(i[:, None] & i)
    return np.where(par == 1, -1.0, 1.0)


def segments(n):
    """int8 rotation segments of a row of n: powers of two, largest first."""
    out, off = [], 0
    while off < n:
        m = 2 ** int(math.log2(n - off))
        out.append((off, m))
        off += m
    return out


def rotate_ref(x, down):
    """The int8 rotation written out: per segment, for h = 1, 2, 4, ...,
    every pair (j, j + h) with j's bit h clear becomes (a + b, a - b) in
    float32; down: then times 1/m."""
    y = np.array(x, dtype=np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        for off, m in segments(y.shape[-1]):
            h = 1
            while h < m:
                j = np.array([off + k for k in range(m) if not k & h])
                a, b = y[..., j], y[..., j + h]
                y[..., j], y[..., j + h] = a + b, a - b
                h *= 2
            if down and m > 1:
                y[..., off:off + m] *= np.float32(1.0 / m)
    return y


def ref_decode(dtype, data, scales):
    """Element by element decode: int8 byte*scale + min, then rotated back
    (rotate_ref), fp8 e4m3*scale, each operation rounded to float32."""
    out = np.empty(data.shape, dtype=np.float32)
    for idx in np.ndindex(data.shape):
        row = idx[:-1]
        if dtype == "int8":
            sc, lo = scales[row + (0,)], scales[row + (1,)]
            out[idx] = np.float32(np.float32(data[idx]) * sc) + lo
        else:
            out[idx] = np.float32(FP8_REF[data[idx]] * scales[row])
    return rotate_ref(out, False) if dtype == "int8" else out


def int8_quantize_ref(x):
    """The int8 rows of the format in numpy, float32 throughout: the rows
    rotated (rotate_ref, down), then a scale and minimum each."""
    x = rotate_ref(x, True)
    lo, hi = x.min(axis=-1), x.max(axis=-1)
    scale = ((hi - lo) / np.float32(255)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.rint((x - lo[..., None]) / scale[..., None])
    q = np.where((scale[..., None] == 0) | np.isnan(q), 0, np.clip(q, 0, 255))
    return q.astype(np.uint8), np.stack([scale, lo], axis=-1)


def test_int8_rotation():
    """kvshare.hadamard and kvshare.torch.hadamard against the matrix
    product (float64) and the written-out butterflies (bit for bit), for
    rows of one segment and of several; down then up is the row again."""
    rng = np.random.default_rng(7)
    for n in (1, 3, 64, 96, 128, 200):
        x = rng.standard_normal((5, n)).astype(np.float32)
        want = np.zeros((5, n))
        for off, m in segments(n):
            want[:, off:off + m] = x[:, off:off + m] @ sylvester(m)
        got = kvshare.hadamard(x)
        assert got.dtype == np.float32 and got.shape == x.shape
        assert np.allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())
        assert np.array_equal(got, rotate_ref(x, False))
        down = kvshare.hadamard(x, down=True)
        assert np.array_equal(down, rotate_ref(x, True))
        assert np.allclose(kvshare.hadamard(down), x, rtol=0, atol=1e-5)
        try:
            import torch
        except ImportError:
            continue
        import kvshare.torch as kvt
        t = kvt.hadamard(torch.from_numpy(x), down=True)
        assert np.array_equal(t.numpy(), down)
    # The C quantizer rotates the same way: a row whose rotation is
    # constant has scale 0 and its minimum the constant.
    lib = _clib()
    row = np.zeros(96, np.float32)
    row[0], row[64] = 64 * 2.5, 32 * 2.5      # segments 64 and 32
    q, sc = np.zeros(96, np.uint8), np.zeros(2, np.float32)
    assert lib.kvs_quantize_row(q.ctypes.data, sc.ctypes.data,
                                kvshare.DTYPE_INT8, row.ctypes.data, 96) == 0
    assert sc.tolist() == [0.0, 2.5] and not q.any()
    back = kvshare.dequantize(q, sc, kvshare.DTYPE_INT8)
    assert np.array_equal(back, row)


def test_fp8_table_is_e4m3():
    t = kvshare.FP8_E4M3_TABLE
    assert t.dtype == np.float32 and t.shape == (256,)
    assert np.array_equal(t, FP8_REF, equal_nan=True)
    lib = _clib()
    c = np.array([lib.kvs_fp8_to_float(b) for b in range(256)], np.float32)
    assert np.array_equal(t, c, equal_nan=True)
    assert np.isnan(t[0x7F]) and np.isnan(t[0xFF])
    assert np.isnan(t).sum() == 2 and not np.isinf(t).any()
    assert t[0x7E] == 448 and t[0xFE] == -448 and t[0x01] == 2.0 ** -9
    assert t[0x08] == 2.0 ** -6 and t[0x38] == 1.0 and t[0x80] == 0
    got = kvshare.fp8_e4m3_to_float32(np.arange(256, dtype=np.uint8))
    assert np.array_equal(got, c, equal_nan=True)


def write_block(lib, c, dt, b, rng):
    """Quantize random rows into block b through c's views with the C
    quantizer; returns the source values [layers][2][bs][heads][dim]."""
    L = c.layout
    x = rng.standard_normal(L.block_shape).astype(np.float32) * 3
    if dt == "int8":    # a row whose rotation is constant (scale 0)
        x[0, 0, 1, 0] = 0
        x[0, 0, 1, 0, 0] = 1.5 * L.head_dim  # (head_dim: a power of two)
    else:               # a constant row
        x[0, 0, 1, 0] = 1.5
    x[1, 1, 2, 1, 3] = np.nan                # a NaN row reads as NaN
    for layer in range(L.num_layers):
        for kv in (0, 1):
            data = c.plane_array(b, layer, kv)
            sc = c.scales_array(b, layer, kv)
            assert data.dtype == np.uint8 and data.shape == L.plane_shape
            assert sc.dtype == np.float32 and sc.shape == L.scales_shape
            assert data.flags.writeable and sc.flags.writeable
            nf = L.scale_floats
            for t in range(L.block_size):
                for h in range(L.num_kv_heads):
                    row = np.ascontiguousarray(x[layer, kv, t, h])
                    dst = data.ctypes.data + (t * L.num_kv_heads + h) * L.head_dim
                    sp = sc.ctypes.data + (t * L.num_kv_heads + h) * nf * 4
                    assert lib.kvs_quantize_row(dst, sp, L.dtype,
                                                row.ctypes.data,
                                                L.head_dim) == 0
            if dt == "int8":
                q, s = int8_quantize_ref(x[layer, kv])
                ok = ~np.isnan(x[layer, kv]).any(axis=-1)
                assert np.array_equal(data[ok], q[ok])
                assert np.array_equal(sc[ok], s[ok])
            del data, sc
    return x


@pytest.mark.parametrize("dt", ["int8", "fp8"])
def test_quantized_views_and_dequantize(daemon_factory, dt):
    d = daemon_factory(SMALL + ["--dtype", dt])
    lib = _clib()
    rng = np.random.default_rng(24)
    with kvshare.Client(d.socket) as w, kvshare.Client(d.socket) as r:
        L = w.layout
        assert L.quantized and L.scale_floats == {"int8": 2, "fp8": 1}[dt]
        assert L.scales_shape == ((4, 2, 2) if dt == "int8" else (4, 2))
        toks = list(range(900, 900 + 2 * L.block_size + 1))
        w.lookup(1, toks)
        a = w.allocate(1, len(toks))
        src = {b: write_block(lib, w, dt, b, rng) for b in a.blocks[:2]}
        # Where the views are: the layout math written out again (plane:
        # bytes rounded up to 16, then the scales rounded up to 16).
        P = L.block_size * L.num_kv_heads * L.head_dim
        S = (P + 15) // 16 * 16
        PB = S + (4 * L.scale_floats * L.block_size * L.num_kv_heads + 15) \
            // 16 * 16
        assert L.plane_bytes == PB and L.scale_offset == S
        b0 = a.blocks[0]
        base = r.pool_tensor().ptr
        for layer in range(L.num_layers):
            for kv in (0, 1):
                off = b0 * L.block_stride + (2 * layer + kv) * PB
                assert r.plane_array(b0, layer, kv).ctypes.data == base + off
                assert r.scales_array(b0, layer, kv).ctypes.data == \
                    base + off + S
        # No copy: bytes and scales written through the writer's views are
        # what the reader's own mapping sees.
        wb, ws = w.block_array(b0), w.scales_array(b0)
        assert wb.shape == L.block_shape and wb.strides[:2] == (2 * PB, PB)
        assert ws.shape == (L.num_layers, 2) + L.scales_shape
        wb[1, 0, 3, 1, 5] ^= 0x01
        ws[1, 0, 3, 1] *= 2
        assert r.plane_array(b0, 1, 0)[3, 1, 5] == wb[1, 0, 3, 1, 5]
        assert np.array_equal(r.scales_array(b0, 1, 0)[3, 1], ws[1, 0, 3, 1])
        assert w.pool_array()[b0].tobytes() == wb.tobytes()
        del wb, ws
        src[b0] = None  # its values changed by hand: decode checks only
        assert w.commit(1, 0, toks, blocks=a.blocks) == 2
        h = r.lookup(7, toks)
        assert h.blocks == a.blocks[:2]
        for b in h.blocks:
            blk = r.dequantize_block(b)
            assert blk.dtype == np.float32 and blk.shape == L.block_shape
            bytes_ = r.block_array(b)
            scales = r.scales_array(b)
            want = ref_decode(dt, bytes_, scales)
            assert np.array_equal(blk, want, equal_nan=True)
            for layer in range(L.num_layers):
                for kv in (0, 1):
                    p = r.dequantize_plane(b, layer, kv)
                    assert p.shape == L.plane_shape
                    assert np.array_equal(p, blk[layer, kv], equal_nan=True)
            # The decode is a copy.
            blk[...] = 0
            assert np.array_equal(r.dequantize_block(b), want, equal_nan=True)
            x = src[b]
            if x is None:
                continue
            nanrow = np.isnan(x).any(axis=-1, keepdims=True)
            assert np.isnan(want[np.broadcast_to(nanrow, x.shape)]).all()
            ok = ~np.broadcast_to(nanrow, x.shape)
            if dt == "int8":   # rotated constant: its minimum, exactly
                assert scales[0, 0, 1, 0, 0] == 0
                assert scales[0, 0, 1, 0, 1] == 1.5
                assert np.array_equal(want[0, 0, 1, 0], x[0, 0, 1, 0])
            err = np.abs(want - x)[ok]
            if dt == "int8":
                step = np.broadcast_to(scales[..., 0:1], x.shape)[ok]
                # rotated: half a step, and float32 roundings
                raw = bytes_.astype(np.float32) * scales[..., 0:1] + \
                    scales[..., 1:2]
                rerr = np.abs(raw - rotate_ref(x, True))[ok]
                assert (rerr <= step * 0.5001 + 1e-5).all()
                # the row: at most head_dim such errors (an element is a
                # signed sum of its segment's)
                assert (err <= L.head_dim * step * 0.5001 + 1e-4).all()
            else:              # 3 mantissa bits: 2**-4 relative
                assert (err <= np.abs(x[ok]) * 2.0 ** -4 + 1e-4).all()
        # DLPack carries the bytes as uint8 and the scales as float32.
        t = r.plane_tensor(h.blocks[1], 0, 1)
        assert t.typestr == "|u1" and t.dtype_name == dt
        got = np.from_dlpack(t)
        assert got.dtype == np.uint8
        assert got.tobytes() == r.plane_array(h.blocks[1], 0, 1).tobytes()
        sc = np.from_dlpack(r.scales_tensor(h.blocks[1]))
        assert sc.dtype == np.float32
        assert np.array_equal(sc, r.scales_array(h.blocks[1]), equal_nan=True)
        del t, got, sc
        r.free(7)
        w.free(1)


@pytest.mark.parametrize("dt", ["int8", "fp8"])
def test_quantized_out_of_range(daemon_factory, dt):
    d = daemon_factory(SMALL + ["--dtype", dt])
    with kvshare.Client(d.socket) as c:
        L = c.layout
        bad = [(L.num_blocks, 0, 0), (0, L.num_layers, 0), (0, 0, 2)]
        for fn in (c.scales_tensor, c.scales_array, c.plane_tensor,
                   c.dequantize_plane):
            for args in bad:
                with pytest.raises(kvshare.KvsError) as ei:
                    fn(*args)
                assert ei.value.status == kvshare.ERANGE, (fn, args)
        for fn in (c.scales_array, c.dequantize_block, c.block_tensor):
            with pytest.raises(kvshare.KvsError) as ei:
                fn(L.num_blocks)
            assert ei.value.status == kvshare.ERANGE
        with pytest.raises(TypeError):
            c.scales_array(0, 0)
        with pytest.raises(ValueError):
            c.scales_array(-1, 0, 0)


@pytest.mark.parametrize("dt", ["fp32", "fp16", "bf16"])
def test_unquantized_pools(daemon_factory, dt):
    """No scales to view; the dequantize helpers return the values as
    float32 (so code can call them on any pool)."""
    d = daemon_factory(SMALL + ["--dtype", dt])
    with kvshare.Client(d.socket) as c:
        L = c.layout
        assert not L.quantized and L.scales_shape is None
        for fn, args in ((c.scales_tensor, (0, 0, 0)),
                         (c.scales_array, (0, 1, 1)), (c.scales_array, (0,))):
            with pytest.raises(kvshare.NotSupportedError, match="no scales"):
                fn(*args)
        v = (np.arange(int(np.prod(L.block_shape))) % 97 / 4 - 12)
        v = v.astype(np.float32).reshape(L.block_shape)
        blk = c.block_array(3)
        blk[...] = (kvshare.float32_to_bf16(v) if dt == "bf16"
                    else v.astype(L.numpy_dtype))
        del blk
        got = c.dequantize_block(3)
        assert got.dtype == np.float32 and np.array_equal(got, v)
        assert np.array_equal(c.dequantize_plane(3, 1, 0), v[1, 0])


def test_dequantize_to_torch(daemon_factory):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    d = daemon_factory(SMALL + ["--dtype", "int8"])
    with kvshare.Client(d.socket) as c:
        sc = c.scales_array(2, 0, 1)
        sc[..., 0], sc[..., 1] = 0.5, -1.0
        c.plane_array(2, 0, 1)[...] = 4
        del sc
        t = c.dequantize_plane(2, 0, 1, torch=True)
        assert isinstance(t, torch.Tensor) and t.dtype == torch.float32
        # every row reads 4 * 0.5 - 1 = 1 rotated, so (head_dim, 0, ...)
        want = torch.zeros(c.layout.plane_shape)
        want[..., 0] = c.layout.head_dim
        assert t.shape == c.layout.plane_shape and torch.equal(t, want)
        tb = kvshare.to_torch(c.dequantize_block(2))
        assert torch.equal(tb[0, 1], t)


def test_dequantize_helper_checks_shapes():
    data = np.zeros((4, 2, 8), np.uint8)
    with pytest.raises(ValueError):
        kvshare.dequantize(data, np.zeros((4, 2), np.float32),
                           kvshare.DTYPE_INT8)
    with pytest.raises(ValueError):
        kvshare.dequantize(data, np.zeros((4, 2, 2), np.float32),
                           kvshare.DTYPE_FP8)
    with pytest.raises(ValueError):
        kvshare.dequantize(data, None, kvshare.DTYPE_FP16)
    with pytest.raises(TypeError):
        kvshare.dequantize(data.astype(np.int8), np.zeros((4, 2, 2)),
                           kvshare.DTYPE_INT8)
