"""kvshare.torch against independent references: writes read back through
the numpy views and compared with numpy's conversions and the C quantizer;
decode and (chunked) prefill against plain causal attention in float64
over the K/V dequantized by the numpy path (Client.dequantize_plane),
gathered from the block tables; arguments refused before any kernel runs;
the Step helper's single round trip, tables and errors.  Every pool dtype
on a host pool; the cuda pool on the stand-in driver (no torch CUDA here:
refused clearly) and on a real GPU when PyTorch has CUDA (skipped
otherwise, saying so)."""
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import kvshare
from conftest import SMALL, SMALL_LAYOUT
from test_cuda_standin import STANDIN, pytestmark as on_standin
from test_quant import _clib, int8_quantize_ref

try:
    import torch
    import kvshare.torch as kvt
    WHY = ""
except ImportError as e:
    torch = kvt = None
    WHY = str(e)
needs_torch = pytest.mark.skipif(
    torch is None, reason=f"PyTorch is not importable ({WHY}): Debian's "
    "python3-torch (deploy/install-deps.sh) runs these")

DTYPES = ["fp32", "fp16", "bf16", "int8", "fp8"]
# Output tolerance per q/out dtype against float64 (atol, rtol).
TOL = {"float32": (2e-5, 1e-4), "float16": (2e-3, 2e-3),
       "bfloat16": (1.6e-2, 1.6e-2)}


def _package_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(kvshare.__file__))
    return env


def test_import_kvshare_does_not_import_torch():
    code = ("import sys, kvshare; assert 'torch' not in sys.modules, "
            "'kvshare imported torch'")
    subprocess.run([sys.executable, "-c", code], check=True,
                   env=_package_env())


def test_kvshare_torch_without_torch_says_why():
    code = ("import sys; sys.modules['torch'] = None\n"
            "try:\n    import kvshare.torch\n"
            "except ImportError as e:\n    print(e)\n"
            "else:\n    raise SystemExit('imported')\n")
    out = subprocess.run([sys.executable, "-c", code], check=True,
                         env=_package_env(), capture_output=True,
                         text=True).stdout
    assert "kvshare.torch needs PyTorch" in out and "python3-torch" in out


# ---- helpers ------------------------------------------------------------------------
class Pool:
    """A daemon of one dtype, a client and its PagedKV; close() drops the
    views, then the client."""

    def __init__(self, daemon_factory, dtype, args=SMALL):
        self.d = daemon_factory(args + ["--dtype", dtype])
        self.c = kvshare.Client(self.d.socket)
        self.kv = kvt.PagedKV(self.c)
        self.L = self.c.layout

    def close(self):
        self.kv = None
        self.c.close()


@pytest.fixture
def pool(daemon_factory):
    made = []

    def make(dtype, args=SMALL):
        p = Pool(daemon_factory, dtype, args)
        made.append(p)
        return p
    yield make
    for p in made:
        p.close()


def new_request(c, req, tokens):
    """lookup + allocate for the tokens not cached; (hit, table)."""
    h = c.lookup(req, tokens)
    a = c.allocate(req, len(tokens) - h.hit_tokens)
    return h.hit_tokens, list(h.blocks) + list(a.blocks)


def stored(c, blocks, layer, kv, n):
    """The float32 values of positions 0..n-1 of a request (numpy path)."""
    planes = [c.dequantize_plane(b, layer, kv) for b in blocks]
    return np.concatenate(planes)[:n] if planes else \
        np.zeros((0,) + c.layout.plane_shape[1:], np.float32)


def ref_attention(c, layer, q, seq_lens, tables, q_start=None, scale=None):
    """Plain causal attention in float64 over the dequantized cache."""
    L = c.layout
    q = q.to(torch.float64)
    H = q.shape[1]
    group = H // L.num_kv_heads
    scale = 1 / math.sqrt(L.head_dim) if scale is None else scale
    out = torch.zeros(q.shape, dtype=torch.float64)
    for s, n in enumerate(seq_lens):
        if q_start is None:
            first, q_len = s, 1
        else:
            first, q_len = q_start[s], q_start[s + 1] - q_start[s]
        K = torch.from_numpy(stored(c, tables[s], layer, 0, n)).double()
        V = torch.from_numpy(stored(c, tables[s], layer, 1, n)).double()
        K = K.repeat_interleave(group, dim=1)   # [n][H][D]
        V = V.repeat_interleave(group, dim=1)
        for i in range(q_len):
            p = n - q_len + i                   # the row's position
            logits = scale * torch.einsum("hd,nhd->hn", q[first + i],
                                          K[:p + 1])
            w = torch.softmax(logits, dim=-1)
            out[first + i] = torch.einsum("hn,nhd->hd", w, V[:p + 1])
    return out


def assert_close(got, want, dtype):
    atol, rtol = TOL[str(dtype).split(".")[-1]]
    err = (got.double() - want).abs()
    lim = atol + rtol * want.abs()
    assert bool((err <= lim).all()), f"max error {float(err.max())}"


def write_random(kv, layer, table, start, n, gen, src=None):
    """Random K/V of positions start..start+n-1 written through kv."""
    L = kv.layout
    src = src or torch.float32
    k = torch.randn(n, L.num_kv_heads, L.head_dim, generator=gen).to(src)
    v = torch.randn(n, L.num_kv_heads, L.head_dim, generator=gen).to(src)
    kv.write(layer, k, v, kvt.slot_mapping(table, L.block_size, start, n))
    return k, v


def i32(x):
    return torch.tensor(x, dtype=torch.int32)


# ---- views and writes ---------------------------------------------------------------
def quantize_ref(dt, x):
    """bytes and scales [..., F] of float32 rows x: int8 by numpy, fp8 by
    the C library's kvs_quantize_row, row by row."""
    if dt == "int8":
        return int8_quantize_ref(x)
    lib = _clib()
    q = np.zeros(x.shape, np.uint8)
    s = np.zeros(x.shape[:-1] + (1,), np.float32)
    for idx in np.ndindex(x.shape[:-1]):
        row = np.ascontiguousarray(x[idx], dtype=np.float32)
        dst, sc = np.zeros(x.shape[-1], np.uint8), np.zeros(1, np.float32)
        assert lib.kvs_quantize_row(dst.ctypes.data, sc.ctypes.data,
                                    kvshare.DTYPE_FP8, row.ctypes.data,
                                    row.size) == 0
        q[idx], s[idx] = dst, sc
    return q, s


def expected_plane(dt, x):
    """What the cache holds for float32 values x (numpy's conversions)."""
    if dt == "fp32":
        return x
    if dt == "fp16":
        return x.astype(np.float16)
    if dt == "bf16":
        return kvshare.float32_to_bf16(x)
    return quantize_ref(dt, x)


@needs_torch
@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("src", ["float32", "float16", "bfloat16"])
def test_write_reads_back(pool, dt, src):
    p = pool(dt)
    c, kv, L = p.c, p.kv, p.L
    assert kv.device == torch.device("cpu") and kv.backend == "cpu"
    assert kv.dtype == kvt.TORCH_DTYPES[L.dtype]
    gen = torch.Generator().manual_seed(7)
    _, table = new_request(c, 1, list(range(3 * L.block_size)))
    before = [c.block_array(b).copy() for b in table]
    n = 3 * L.block_size
    # Strided rows: a fused [T][3][heads][dim] projection sliced.
    fused = torch.randn(n, 3, L.num_kv_heads, L.head_dim, generator=gen)
    fused = fused.to(getattr(torch, src))
    k, v = fused[:, 1], fused[:, 2]
    assert k.stride(0) == 3 * L.num_kv_heads * L.head_dim
    slots = kvt.slot_mapping(table, L.block_size, 0, n)
    slots[5] = -1                                    # skipped
    kv.write(1, k, v, slots)
    xk = k.float().numpy().reshape(3, L.block_size, L.num_kv_heads, -1)
    xv = v.float().numpy().reshape(xk.shape)
    for i, b in enumerate(table):
        blk = c.block_array(b)
        assert np.array_equal(blk[0], before[i][0])    # layer 0 untouched
        for plane, x in ((0, xk[i]), (1, xv[i])):
            got = c.plane_array(b, 1, plane)
            want = expected_plane(dt, x)
            keep = np.ones(L.block_size, bool)
            if i == 5 // L.block_size:
                keep[5 % L.block_size] = False
                assert np.array_equal(got[~keep], before[i][1, plane][~keep])
            if L.quantized:
                sc = c.scales_array(b, 1, plane).reshape(
                    L.block_size, L.num_kv_heads, -1)
                assert np.array_equal(got[keep], want[0][keep])
                assert np.array_equal(sc[keep], want[1][keep])
            else:
                assert np.array_equal(got[keep], want[keep])
    # The torch views are the pool (same addresses), and decode the same.
    kl, vl = kv.layer(1)
    assert kl.shape == (L.num_blocks,) + L.plane_shape and kl.dtype == kv.dtype
    b = table[1]
    assert kl[b].data_ptr() == c.plane_tensor(b, 1, 0).ptr
    assert vl[b].data_ptr() == c.plane_tensor(b, 1, 1).ptr
    dk, dv = kv.dequantize(1, table)
    assert dk.dtype == torch.float32 and dk.shape == (3,) + L.plane_shape
    for i, b in enumerate(table):
        assert np.array_equal(dk[i].numpy(), c.dequantize_plane(b, 1, 0))
        assert np.array_equal(dv[i].numpy(), c.dequantize_plane(b, 1, 1))
        assert np.array_equal(kvt.dequantize_block(c, b).numpy(),
                              c.dequantize_block(b))
    if L.quantized:
        ks, vs = kv.scales(1)
        assert ks.dtype == torch.float32
        assert ks.shape == (L.num_blocks, L.block_size, L.num_kv_heads,
                            L.scale_floats)
        assert ks[b].data_ptr() == c.scales_tensor(b, 1, 0).ptr
        assert vs[b].data_ptr() == c.scales_tensor(b, 1, 1).ptr
    else:
        with pytest.raises(kvshare.NotSupportedError, match="no scales"):
            kv.scales(1)
    del kl, vl
    c.free(1)


def test_block_tables_and_slots():
    if torch is None:
        pytest.skip(f"PyTorch is not importable ({WHY})")
    t = kvt.block_tables([[3, 1], [], [7, 8, 9]])
    assert t.dtype == torch.int32 and t.tolist() == [[3, 1, 0], [0, 0, 0],
                                                     [7, 8, 9]]
    assert kvt.block_tables([[]]).shape == (1, 1)
    s = kvt.slot_mapping([5, 2, 9], 4, 3, 6)
    assert s.dtype == torch.int64
    assert s.tolist() == [5 * 4 + 3, 2 * 4, 2 * 4 + 1, 2 * 4 + 2, 2 * 4 + 3,
                          9 * 4]
    with pytest.raises(ValueError, match="needs block index 3"):
        kvt.slot_mapping([5, 2, 9], 4, 10, 3)
    with pytest.raises(ValueError, match="out of range"):
        kvt.block_tables([[-1]])
    with pytest.raises(TypeError):
        kvt.block_tables([["a"]])


# ---- attention -------------------------------------------------------------------------
@needs_torch
@pytest.mark.parametrize("dt", DTYPES)
def test_decode_and_prefill(pool, dt):
    p = pool(dt)
    c, kv, L = p.c, p.kv, p.L
    gen = torch.Generator().manual_seed(25)
    H = 2 * L.num_kv_heads                            # GQA, group 2
    qdtypes = [torch.float32, torch.float16, torch.bfloat16] \
        if dt == "fp16" else [torch.float32]
    # Request 1: 10 tokens, committed; request 2 shares its first 8
    # (two blocks) and adds 5: chunked prefill over a cached prefix.
    # Request 3: 7 tokens from scratch; request 4: 3 tokens, none new.
    p1 = list(range(100, 110))
    p2 = p1[:8] + list(range(500, 505))
    p3 = list(range(700, 707))
    p4 = list(range(900, 903))
    _, t1 = new_request(c, 1, p1)
    for layer in range(L.num_layers):
        write_random(kv, layer, t1, 0, len(p1), gen)
    c.commit(1, 0, p1)
    hit2, t2 = new_request(c, 2, p2)
    assert hit2 == 8 and t2[:2] == t1[:2]
    _, t3 = new_request(c, 3, p3)
    _, t4 = new_request(c, 4, p4)
    for layer in range(L.num_layers):
        write_random(kv, layer, t2, 8, 5, gen)
        write_random(kv, layer, t3, 0, 7, gen)
        write_random(kv, layer, t4, 0, 3, gen)
    tables = [t2, t3, t4]
    lens = [13, 7, 3]
    bt = kvt.block_tables(tables)
    qs = [0, 5, 12, 12]
    for qd in qdtypes:
        for layer in range(L.num_layers):
            q = torch.randn(12, H, L.head_dim, generator=gen).to(qd)
            out = kv.prefill(layer, q, i32(qs), i32(lens), bt)
            assert out.dtype == qd and out.shape == q.shape
            want = ref_attention(c, layer, q, lens, tables, qs)
            assert_close(out, want, qd)
            # Decode: ragged lengths (one inside a block, one at a block's
            # end, one of one token), into a given out, another scale.
            dl = [12, 7, 1]
            qd1 = torch.randn(3, H, L.head_dim, generator=gen).to(qd)
            out = torch.full(qd1.shape, float("nan"), dtype=qd)
            got = kv.decode(layer, qd1, i32(dl), bt, scale=0.3, out=out,
                            max_seq_len=12)
            assert got is out
            assert_close(out, ref_attention(c, layer, qd1, dl, tables,
                                            scale=0.3), qd)
    for r in (1, 2, 3, 4):
        c.free(r)


# ---- refusals ---------------------------------------------------------------------------
@needs_torch
def test_refused_before_any_kernel(pool):
    p = pool("fp16")
    c, kv, L = p.c, p.kv, p.L
    _, table = new_request(c, 1, list(range(6)))
    before = c.pool_array().copy()
    D, Hk = L.head_dim, L.num_kv_heads
    k = torch.zeros(2, Hk, D)
    slots = torch.tensor([0, 1])
    lens, bt = i32([6]), kvt.block_tables([table])
    q = torch.zeros(1, 2 * Hk, D)
    out = torch.full(q.shape, 7.0)
    meta = torch.empty(2, Hk, D, device="meta")
    qo = torch.full((3, 2 * Hk, D), 7.0)    # q and out sharing memory
    cases = [
        (lambda: kv.write(2, k, k, slots), ValueError, "layer 2 out of range"),
        (lambda: kv.write("0", k, k, slots), TypeError, "layer must be an int"),
        (lambda: kv.write(0, k.numpy(), k, slots), TypeError,
         "k must be a torch.Tensor"),
        (lambda: kv.write(0, k.int(), k, slots), TypeError, "k must be"),
        (lambda: kv.write(0, k, k.half(), slots), TypeError,
         "k is torch.float32 but v is torch.float16"),
        (lambda: kv.write(0, torch.zeros(2, Hk + 1, D), k, slots), ValueError,
         f"num_kv_heads={Hk}"),
        (lambda: kv.write(0, meta, meta, slots), ValueError,
         "k is on meta, but the pool's kernels run on cpu"),
        (lambda: kv.write(0, k, k, slots.int()), TypeError,
         "slots must be torch.int64"),
        (lambda: kv.write(0, k, k, slots[:1]), ValueError,
         "slots must have shape (2,)"),
        (lambda: kv.write(0, k, k, torch.tensor([0, 64 * L.block_size])),
         ValueError, f"slots[1] = {64 * L.block_size} is past the pool"),
        (lambda: kv.decode(0, q.int(), lens, bt), TypeError, "q must be"),
        (lambda: kv.decode(0, torch.zeros(1, 2 * Hk, D + 1), lens, bt),
         ValueError, f"head_dim is {D + 1}, the pool's {D}"),
        (lambda: kv.decode(0, torch.zeros(1, 3, D), lens, bt), ValueError,
         f"multiple of the pool's {Hk} kv heads"),
        (lambda: kv.decode(0, q, lens.long(), bt), TypeError,
         "seq_lens must be torch.int32"),
        (lambda: kv.decode(0, q, lens, bt.repeat(2, 1)), ValueError,
         "block_tables must have shape (1, *)"),
        (lambda: kv.decode(0, torch.zeros(2, 2 * Hk, D), lens, bt),
         ValueError, "q has 2 rows for 1 requests"),
        (lambda: kv.decode(0, q, i32([6 + 2 * L.block_size]), bt), ValueError,
         f"seq_lens[0] = {6 + 2 * L.block_size} does not fit"),
        (lambda: kv.decode(0, q, i32([-1]), bt), ValueError,
         "seq_lens[0] = -1"),
        (lambda: kv.decode(0, q, lens, i32([[table[0], 64]])), ValueError,
         "block_tables[0][1] = 64 is not a block of the pool (0 .. 63)"),
        (lambda: kv.decode(0, q, lens, bt, out=out.half()), TypeError,
         "out must be torch.float32"),
        (lambda: kv.decode(0, q, lens, bt, out=torch.zeros(1, D, 2 * Hk).transpose(1, 2)),
         ValueError, "out must be a contiguous tensor"),
        (lambda: kv.decode(0, q, lens, bt, max_seq_len=5), ValueError,
         "max_seq_len 5 is below the longest seq_len, 6"),
        (lambda: kv.prefill(0, q, i32([0, 2]), lens, bt), ValueError,
         "q_start must rise from 0 to q's 1 rows"),
        (lambda: kv.prefill(0, torch.zeros(7, 2 * Hk, D), i32([0, 7]), lens,
                            bt), ValueError,
         "request 0 has 7 query rows but seq_lens[0] = 6"),
        (lambda: kv.prefill(0, q, i32([0]), lens, bt), ValueError,
         "q_start must have shape (2,)"),
        (lambda: kv.decode(0, out, lens, bt, out=out), ValueError,
         "out overlaps q"),
        (lambda: kv.prefill(0, qo[:2], i32([0, 2]), lens, bt, out=qo[1:]),
         ValueError, "out overlaps q"),
    ]
    for call, exc, msg in cases:
        with pytest.raises(exc) as ei:
            call()
        assert msg in str(ei.value), (msg, str(ei.value))
    assert np.array_equal(c.pool_array(), before)     # nothing was written
    assert bool((out == 7).all())                     # nor into out
    assert bool((qo == 7).all())
    # Past the checks (validate off), the kernel's own refusal comes back
    # as the KvsError of its status, naming the kernel.
    kv.validate = False
    with pytest.raises(kvshare.KvsError) as ei:
        kv.decode(0, q, lens, i32([[table[0], 64]]))
    assert ei.value.name == "ERANGE" and ei.value.op == "decode"
    assert "kvs_cpu_decode_attention" in str(ei.value)
    c.free(1)


# ---- Step -------------------------------------------------------------------------------
@needs_torch
def test_step_two_requests_share_a_prefix(pool, daemon_factory):
    p = pool("fp32")
    c, kv, L = p.c, p.kv, p.L
    bs = L.block_size
    gen = torch.Generator().manual_seed(3)
    step = kvt.Step(c)
    p1 = list(range(10, 20))                  # 10 tokens: 2 full blocks + 2
    p2 = p1[:8] + [40, 41, 42, 43]
    assert step.submit() == ()                 # nothing: no round trip
    f0 = c.stats().frames_in
    f1 = c.stats().frames_in                  # f1 - f0: a stats call's own
    h1 = step.lookup(1, p1)
    a1 = step.allocate(1, len(p1))
    assert len(step) == 2
    step.submit()
    assert c.stats().frames_in - f1 == (f1 - f0) + 1   # one round trip
    assert h1.result.hit_tokens == 0 and step.hit(1) == 0
    assert step.table(1) == list(a1.result.blocks) and len(step.table(1)) == 3
    write_random(kv, 0, step.table(1), 0, len(p1), gen)
    # Commit 1 and look 2 up in one step: the daemon runs them in order.
    cm = step.commit(1, 0, p1)
    h2 = step.lookup(2, p2)
    step.submit()
    assert cm.result == 2
    assert step.hit(2) == 8 and step.table(2) == step.table(1)[:2]
    assert h2.result.blocks == tuple(step.table(2))
    step.allocate(2, len(p2) - 8)
    ap = step.append(1, 1)
    step.submit()
    assert len(step.table(1)) == 3 and ap.result.blocks == ()
    assert len(step.table(2)) == 3 and step.table(2)[:2] == step.table(1)[:2]
    assert set(step.requests) == {1, 2}
    # The second request's attention reads the first one's prefix.
    write_random(kv, 0, step.table(2), 8, 4, gen)
    q = torch.randn(4, L.num_kv_heads, L.head_dim, generator=gen)
    out = kv.prefill(0, q, i32([0, 4]), i32([12]),
                     kvt.block_tables([step.table(2)]))
    assert_close(out, ref_attention(c, 0, q, [12], [step.table(2)],
                                    [0, 4]), torch.float32)
    # A failed op: named with its request; the others still applied.
    step.free(1)
    step.allocate(99, 4)
    with pytest.raises(kvshare.UnknownRequestError) as ei:
        step.submit()
    assert "allocate of request 99 (op 2 of 2)" in ei.value.op
    assert ei.value.message and ei.value.message in str(ei.value)
    assert set(step.requests) == {2}
    with pytest.raises(KeyError, match="request 1 has no table"):
        step.table(1)
    # No space: request 3 takes 2 blocks, then 2 asks for all but 1 of
    # the pool's (it holds 3): more than are free, less than the pool.
    step.lookup(3, list(range(60, 68)))
    step.allocate(3, 2 * bs)
    step.allocate(2, (L.num_blocks - 4) * bs)
    with pytest.raises(kvshare.NoSpaceError) as ei:
        step.submit()
    assert "allocate of request 2 (op 3 of 3)" in ei.value.op
    assert ei.value.message and ei.value.message in str(ei.value)
    assert len(step.table(2)) == 3 and len(step.table(3)) == 2
    step.free(2)
    step.free(3)
    step.submit()
    assert step.requests == ()
    assert c.stats(check=True).check_ok
    step.close()


@needs_torch
def test_step_after_a_batch_refused_whole(pool):
    """A step the daemon could not take (a frame over its limit) is dropped
    on both sides: the next step sends only its own ops."""
    p = pool("fp32", SMALL + ["--max-frame", "65536"])
    c = p.c
    step = kvt.Step(c)
    step.lookup(1, np.arange(c.max_frame // 2, dtype=np.uint32))
    with pytest.raises(kvshare.KvsError) as ei:
        step.submit()
    assert ei.value.name == "ETOOBIG"
    h = step.lookup(2, [1, 2, 3])
    a = step.allocate(2, 3)
    assert step.submit() == (h, a)
    assert step.requests == (2,) and len(step.table(2)) == 1
    assert c.stats().num_requests == 1       # request 1 never reached it
    step.free(2)
    step.submit()
    step.close()


# ---- cuda pools ------------------------------------------------------------------------
@needs_torch
@on_standin
def test_cuda_pool_on_the_standin(daemon_factory):
    d = daemon_factory(SMALL_LAYOUT + ["--backend", "cuda", "--dtype", "fp16"],
                       env={"KVS_CUDA_DRIVER": STANDIN})
    with kvshare.Client(d.socket) as c:
        assert c.backend == "cuda"
        if torch.cuda.is_available():
            pytest.skip("PyTorch has CUDA here: the stand-in's pool is not "
                        "on torch's GPU")
        with pytest.raises(kvshare.KvsError) as ei:
            kvt.PagedKV(c)
        assert ei.value.name == "ENODEV"
        assert c.gpu_uuid in str(ei.value)
        assert "torch.cuda.is_available() is False" in str(ei.value)
        assert c.views_alive == 0
        # The helpers that need no device still work for such an engine.
        assert kvt.block_tables([[1, 2]]).tolist() == [[1, 2]]


def _cuda_ready():
    if torch is None:
        return f"PyTorch is not importable ({WHY})"
    if not torch.cuda.is_available():
        return "no CUDA in PyTorch here (torch.cuda.is_available() is False)"
    if "standin" in os.path.basename(STANDIN):
        return ("KVS_CUDA_DRIVER names the stand-in: run this file with it "
                "unset to use the GPU's driver")
    return ""


@pytest.fixture
def cuda_pool(daemon_factory):
    why = _cuda_ready()
    if why:
        pytest.skip(why)
    made = []

    def make(dtype):
        try:
            p = Pool(daemon_factory, dtype, SMALL_LAYOUT + ["--backend",
                                                            "cuda"])
        except RuntimeError as e:
            pytest.skip(f"no cuda pool: {e}")
        made.append(p)
        return p
    yield make
    for p in made:
        p.close()


@pytest.mark.parametrize("dt", ["fp32", "fp16", "bf16"])
def test_cuda_pool_attention_on_torch_streams(cuda_pool, dt):
    """On a GPU: the kernels run on torch's current stream.  A side stream
    first sleeps, then fills K/V/q; the write and the attention queued
    after it on that stream must see the values (on another stream they
    would read them before they exist)."""
    p = cuda_pool(dt)
    c, kv, L = p.c, p.kv, p.L
    dev = kv.device
    assert dev.type == "cuda" and kv.backend == "cuda"
    _, table = new_request(c, 1, list(range(4 * L.block_size + 3)))
    n = 4 * L.block_size + 3
    H = 2 * L.num_kv_heads
    gen = torch.Generator().manual_seed(11)
    kh = torch.randn(n, L.num_kv_heads, L.head_dim, generator=gen)
    vh = torch.randn(n, L.num_kv_heads, L.head_dim, generator=gen)
    qh = torch.randn(n, H, L.head_dim, generator=gen)
    side = torch.cuda.Stream(dev)
    with torch.cuda.stream(side):
        k = torch.zeros(kh.shape, device=dev)
        v = torch.zeros(vh.shape, device=dev)
        q = torch.zeros(qh.shape, device=dev)
        torch.cuda._sleep(200_000_000)         # ~0.1 s on the side stream
        k.copy_(kh, non_blocking=True)
        v.copy_(vh, non_blocking=True)
        q.copy_(qh, non_blocking=True)
        slots = kvt.slot_mapping(table, L.block_size, 0, n, device=dev)
        kv.write(0, k, v, slots)
        bt = kvt.block_tables([table], device=dev)
        lens = torch.tensor([n], dtype=torch.int32, device=dev)
        qs = torch.tensor([0, n], dtype=torch.int32, device=dev)
        out = kv.prefill(0, q, qs, lens, bt, max_seq_len=n)
        dec = kv.decode(0, q[-1:].contiguous(), lens, bt, max_seq_len=n)
    side.synchronize()
    got_k = kv.dequantize(0, table)[0].reshape(-1, L.num_kv_heads,
                                              L.head_dim)[:n].cpu()
    want_k = kh.to(kv.dtype).float()
    assert torch.equal(got_k, want_k)
    # The reference reads the cache through DLPack (a cuda pool has no
    # numpy path): K/V as stored, in float64.
    Kc, Vc = (t.reshape(-1, L.num_kv_heads, L.head_dim)[:n].double().cpu()
              for t in kv.dequantize(0, table))
    group = H // L.num_kv_heads
    Kc, Vc = Kc.repeat_interleave(group, 1), Vc.repeat_interleave(group, 1)
    want = torch.zeros(n, H, L.head_dim, dtype=torch.float64)
    for i in range(n):
        w = torch.softmax(torch.einsum("hd,nhd->hn", qh[i].double(),
                                       Kc[:i + 1]) / math.sqrt(L.head_dim), -1)
        want[i] = torch.einsum("hn,nhd->hd", w, Vc[:i + 1])
    assert_close(out.cpu(), want, torch.float32)
    assert_close(dec.cpu(), want[-1:], torch.float32)
    # Index tensors on the host are refused for a cuda pool.
    with pytest.raises(ValueError, match="is on cpu"):
        kv.decode(0, q[-1:].contiguous(), lens.cpu(), bt)
    del k, v, q, out, dec
    c.free(1)
