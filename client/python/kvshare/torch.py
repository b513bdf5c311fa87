"""kvshare.torch: the pool as PyTorch tensors, libkvshare's K/V kernels on
them, and one Batch per scheduler step (docs/python.md, "kvshare.torch").

    import kvshare, kvshare.torch as kvt
    c = kvshare.Client(sock)
    kv = kvt.PagedKV(c)                  # views of the pool, no copy
    kv.write(layer, k, v, slots)         # K/V of new tokens into their slots
    out = kv.decode(layer, q, seq_lens, block_tables)

On a host pool the C twins run (kvs_cpu_*) on cpu tensors; on a cuda pool
the CUDA kernels (kvs_cuda_*) run on cuda tensors of the pool's GPU, queued
on torch's current stream.  Shapes, dtypes, devices and the pool's layout
are checked before any kernel runs (TypeError / ValueError); a kernel's
failure raises the KvsError of its status.

`import kvshare` never imports torch; importing this module does, and
raises ImportError when PyTorch is not installed.
"""
import math
from ctypes import byref, c_void_p

try:
    import torch
except ImportError as _e:
    raise ImportError(
        "kvshare.torch needs PyTorch, which is not importable here "
        f"({_e}); install it (Debian: apt-get install python3-torch, or pip "
        "install torch); the rest of kvshare works without it") from _e

import numpy as np

from . import _lib
from .client import LookupResult, _req, as_u32_array
from .errors import error_for
from .views import FP8_E4M3_TABLE

# kvs_dtype of the cache -> torch dtype of its views (int8/fp8: the bytes)
TORCH_DTYPES = {_lib.DTYPE_FP32: torch.float32,
                _lib.DTYPE_FP16: torch.float16,
                _lib.DTYPE_BF16: torch.bfloat16,
                _lib.DTYPE_INT8: torch.uint8,
                _lib.DTYPE_FP8: torch.uint8}
# q, out and the write kernel's sources: never quantized
_FLOAT_DTYPES = {torch.float32: _lib.DTYPE_FP32,
                 torch.float16: _lib.DTYPE_FP16,
                 torch.bfloat16: _lib.DTYPE_BF16}
_FLOAT_NAMES = "torch.float32, torch.float16 or torch.bfloat16"


# ---- checks -------------------------------------------------------------------
def _int(x, what):
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise TypeError(f"{what} must be an int, not {type(x).__name__}")
    return int(x)


def _tensor(t, what, device, dtypes=None, ndim=None):
    """t checked: a torch.Tensor on device, of one of dtypes, ndim axes."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, not "
                        f"{type(t).__name__}")
    if dtypes is not None and t.dtype not in dtypes:
        names = " or ".join(str(d) for d in dtypes)
        raise TypeError(f"{what} must be {names}, not {t.dtype}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{what} must have {ndim} dimensions, not shape "
                         f"{tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{what} is on {t.device}, but the pool's kernels "
                         f"run on {device}: move it there first")
    return t


def _index(t, what, device, dtype, shape):
    """An index tensor (slots, seq_lens, q_start, block tables): dtype and
    shape exact (None in shape: any), on the pool's device, made
    contiguous."""
    _tensor(t, what, device, (dtype,), len(shape))
    for want, got in zip(shape, t.shape):
        if want is not None and want != got:
            raise ValueError(f"{what} must have shape {_shape(shape)}, not "
                             f"{tuple(t.shape)}")
    return t.contiguous()


def _shape(shape):
    dims = ["*" if d is None else str(d) for d in shape]
    return f"({dims[0]},)" if len(dims) == 1 else f"({', '.join(dims)})"


def _ptr(t):
    return c_void_p(t.data_ptr()) if t is not None and t.numel() else None


# ---- dequantizing, on any device ------------------------------------------------
_fp8_tables = {}


def _fp8_table(device):
    t = _fp8_tables.get(device)
    if t is None:
        t = torch.from_numpy(FP8_E4M3_TABLE.copy()).to(device)
        _fp8_tables[device] = t
    return t


def hadamard(x, down=False):
    """kvshare.hadamard on a tensor (any device): the int8 format's
    rotation of the rows x [..., n], float32, a new tensor, the same
    butterflies in the same order."""
    y = x.to(torch.float32, copy=True)
    n, off = y.shape[-1], 0
    while off < n:
        m = 1 << ((n - off).bit_length() - 1)
        seg = y[..., off:off + m].contiguous()
        h = 1
        while h < m:
            t = seg.view(seg.shape[:-1] + (m // (2 * h), 2, h))
            a, b = t[..., 0, :].clone(), t[..., 1, :].clone()
            t[..., 0, :] = a + b
            t[..., 1, :] = a - b
            h *= 2
        if down and m > 1:
            seg.mul_(1.0 / m)
        y[..., off:off + m] = seg
        off += m
    return y


def _to_float32(data, scales, dtype):
    """float32 values (a new tensor) of pool elements of kvs_dtype dtype;
    scales [..., F] for int8/fp8 (the row parameters), as kvshare.dequantize
    computes them: the multiply and the add rounded apart, int8 rows
    rotated back (hadamard)."""
    if dtype == _lib.DTYPE_INT8:
        out = data.to(torch.float32)
        out.mul_(scales[..., 0:1])
        out.add_(scales[..., 1:2])
        return hadamard(out)
    if dtype == _lib.DTYPE_FP8:
        out = _fp8_table(data.device)[data.long()]
        out.mul_(scales[..., 0:1])
        return out
    return data.to(torch.float32, copy=True)


def _from_pool(t):
    return torch.from_dlpack(t)


def dequantize_block(client, b):
    """The float32 values of block b, [layers][2][block_size][heads]
    [head_dim], a new tensor on the pool's device: int8 byte * scale + min
    rotated back (hadamard), fp8 e4m3(byte) * scale (the same float32 operations as
    kvshare.dequantize), fp32/fp16/bf16 their values.  A cuda pool needs
    torch with CUDA."""
    L = client.layout
    data = _from_pool(client.block_tensor(b))
    scales = None
    if L.quantized:
        scales = _from_pool(client.scales_tensor(b))
        if L.scale_floats == 1:
            scales = scales.unsqueeze(-1)
    return _to_float32(data, scales, L.dtype)


# ---- block tables and slots -------------------------------------------------------
def block_tables(tables, device=None):
    """An int32 tensor [len(tables), width] of block tables (each a list of
    block ids), padded with block 0 (never read: a request's seq_len says
    how many entries count); width is the longest table's length, at
    least 1."""
    rows = [as_u32_array(t, f"tables[{i}]") for i, t in enumerate(tables)]
    width = max([r.size for r in rows] + [1])
    a = np.zeros((len(rows), width), dtype=np.int32)
    for i, r in enumerate(rows):
        if r.size and r.max() > 2**31 - 1:
            raise ValueError(f"tables[{i}]: block ids must be in 0 .. "
                             "2**31-1")
        a[i, :r.size] = r
    return torch.from_numpy(a).to(device or "cpu")


def slot_mapping(blocks, block_size, start, n, device=None):
    """An int64 tensor [n]: the slots (block * block_size + offset) of
    positions start .. start+n-1 of a request whose block table is
    `blocks`."""
    bs, start, n = (_int(block_size, "block_size"), _int(start, "start"),
                    _int(n, "n"))
    if bs <= 0 or start < 0 or n < 0:
        raise ValueError(f"block_size {bs}, start {start}, n {n}: block_size "
                         "must be positive, start and n not negative")
    blocks = [_int(x, "blocks[i]") for x in blocks]
    if n and (start + n - 1) // bs >= len(blocks):
        raise ValueError(f"position {start + n - 1} needs block index "
                         f"{(start + n - 1) // bs}, but the table has "
                         f"{len(blocks)} blocks")
    pos = np.arange(start, start + n, dtype=np.int64)
    table = np.array(blocks, dtype=np.int64)
    slots = table[pos // bs] * bs + pos % bs if n else pos
    return torch.from_numpy(slots).to(device or "cpu")


# ---- the pool as tensors, and the kernels -------------------------------------------
class PagedKV:
    """The pool of a Client as torch tensors (no copy) and the K/V kernels
    over it.

    device    torch.device("cpu") on a host pool; torch.device("cuda", n)
              on a cuda pool (n: the pool's GPU in this process)
    dtype     torch dtype of the cache views (torch.uint8 for int8/fp8)
    layout    the client's Layout
    validate  check index values (slots, seq_lens, q_start, block ids)
              before each kernel: on a cuda pool this reads them to the
              host, one device synchronisation per call; set it False in
              a hot loop whose tables are known to be right (shapes,
              dtypes and devices are checked either way)

    The views keep the client's mapping alive (like every view): drop the
    PagedKV, or close() it, before closing the client.  A cuda pool needs
    PyTorch with CUDA (KvsError ENODEV otherwise).
    """

    def __init__(self, client, *, validate=True):
        client._p()
        if not client.mapped:
            raise error_for(_lib.ESTATE, "the pool is not mapped (no_map)",
                            "PagedKV")
        L = client.layout
        self.client = client
        self.layout = L
        self.validate = bool(validate)
        self.dtype = TORCH_DTYPES[L.dtype]
        self._L = _lib.lib()
        if client.backend == "cuda":
            if not torch.cuda.is_available():
                raise error_for(
                    _lib.ENODEV, f"the pool is on {client.gpu_uuid}, but this "
                    f"PyTorch ({torch.__version__}) has no CUDA device "
                    "(torch.cuda.is_available() is False)", "PagedKV")
            rc = self._L.kvs_cuda_open(client.gpu_uuid.encode())
            if rc:
                raise error_for(rc, f"the CUDA kernels on {client.gpu_uuid}",
                                "kvs_cuda_open")
            self.device = torch.device("cuda", client._device()[1])
            self.backend = "cuda"
        else:
            self.device = torch.device("cpu")
            self.backend = "cpu"
        prefix = f"kvs_{self.backend}_"
        self._write_kv = getattr(self._L, prefix + "write_kv")
        self._decode = getattr(self._L, prefix + "decode_attention")
        self._prefill = getattr(self._L, prefix + "prefill_attention")
        # [num_blocks][layers][2][block_size][heads][head_dim]
        self._pool = _from_pool(client.pool_tensor())
        self._scales = None
        if L.quantized:  # [num_blocks][layers][2][block_size][heads][F]
            s = _from_pool(client.pool_scales_tensor())
            self._scales = s.unsqueeze(-1) if L.scale_floats == 1 else s
        self._planes = []
        for layer in range(L.num_layers):
            kv = _lib.kvs_paged_kv()
            rc = self._L.kvs_paged_kv_of(client._p(), layer, byref(kv))
            if rc:
                client._check(rc, "kvs_paged_kv_of")
            self._planes.append(kv)
        self._workspaces = {}  # CUstream -> uint8 tensor (CUDA splits)

    def close(self):
        """Drop the views (the mapping goes with the last view)."""
        self._pool = self._scales = None
        self._workspaces = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        L = self.layout
        return (f"<kvshare.torch.PagedKV {L.num_blocks} blocks of "
                f"{L.block_size}, {L.num_layers} layers, {L.num_kv_heads}x"
                f"{L.head_dim} {L.dtype_name}, on {self.device}>")

    # -- views --------------------------------------------------------------------
    def _layer(self, layer, what):
        layer = _int(layer, "layer")
        if not 0 <= layer < self.layout.num_layers:
            raise ValueError(f"{what}: layer {layer} out of range (the pool "
                             f"has {self.layout.num_layers} layers)")
        if self._pool is None:
            raise error_for(_lib.ESTATE, "this PagedKV is closed", what)
        return layer

    def layer(self, layer):
        """(k, v): layer `layer` of every block, each [num_blocks]
        [block_size][num_kv_heads][head_dim] of self.dtype, views of the
        pool (strided by the block stride; int8/fp8: the bytes)."""
        layer = self._layer(layer, "layer")
        return self._pool[:, layer, 0], self._pool[:, layer, 1]

    def scales(self, layer):
        """(ks, vs): an int8/fp8 pool's row parameters of layer `layer`,
        float32 views [num_blocks][block_size][num_kv_heads][F] (int8 F=2:
        scale, min; fp8 F=1: scale).  NotSupportedError on other pools."""
        layer = self._layer(layer, "scales")
        if self._scales is None:
            raise error_for(_lib.ENOTSUP, f"a {self.layout.dtype_name} pool "
                            "has no scales (only int8 and fp8 pools do)",
                            "scales")
        return self._scales[:, layer, 0], self._scales[:, layer, 1]

    def dequantize(self, layer, blocks):
        """(k, v) float32, [len(blocks)][block_size][num_kv_heads][head_dim]
        each, new tensors: the values of layer `layer` of those blocks
        (int8/fp8 dequantized as kvshare.dequantize does; fp32/fp16/bf16
        converted)."""
        k, v = self.layer(layer)
        idx = self._blocks(blocks)
        if self._scales is None:
            return _to_float32(k[idx], None, self.layout.dtype), \
                _to_float32(v[idx], None, self.layout.dtype)
        ks, vs = self.scales(layer)
        return (_to_float32(k[idx], ks[idx], self.layout.dtype),
                _to_float32(v[idx], vs[idx], self.layout.dtype))

    def _blocks(self, blocks):
        if isinstance(blocks, torch.Tensor):
            idx = blocks.to("cpu", torch.int64).reshape(-1)
        else:
            idx = torch.tensor([_int(b, "blocks[i]") for b in blocks],
                               dtype=torch.int64)
        n = self.layout.num_blocks
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= n):
            raise ValueError(f"block ids must be in 0 .. {n - 1} (the pool "
                             f"has {n} blocks)")
        return idx.to(self.device)

    # -- kernels ------------------------------------------------------------------
    def _stream(self):
        if self.backend != "cuda":
            return None
        return c_void_p(torch.cuda.current_stream(self.device).cuda_stream)

    def _launch(self, fn, args, stream, what):
        rc = fn(byref(args), stream)
        if rc:
            raise error_for(rc, f"{fn.__name__} refused or failed (see "
                            "docs/kernels.md)", what)

    def _host(self, *tensors):
        """numpy copies (cpu views on a host pool) of int32 tensors, read
        with one device transfer on a cuda pool."""
        if self.backend != "cuda":
            return [t.numpy() for t in tensors]
        flat = torch.cat([t.reshape(-1) for t in tensors]).cpu().numpy()
        out, at = [], 0
        for t in tensors:
            out.append(flat[at:at + t.numel()].reshape(tuple(t.shape)))
            at += t.numel()
        return out

    def write(self, layer, k, v, slots):
        """Write the K and V of T new tokens of layer `layer` into their
        slots.  k, v: [T][num_kv_heads][head_dim], float32, float16 or
        bfloat16 (both the same), on the pool's device; rows may be strided
        (a slice of a fused projection), the last two axes packed (else a
        packed copy is made).  slots: int64 [T], block * block_size +
        offset, negative = skip.  Converted to the cache dtype (round to
        nearest even; int8/fp8 rows quantized, kvs_quantize_row).  On a
        cuda pool the write is queued on torch's current stream: synchronise
        it before committing the blocks."""
        what = "write"
        layer = self._layer(layer, what)
        L = self.layout
        _tensor(k, "k", self.device, _FLOAT_DTYPES, 3)
        _tensor(v, "v", self.device, _FLOAT_DTYPES, 3)
        if k.dtype != v.dtype:
            raise TypeError(f"k is {k.dtype} but v is {v.dtype}: give both "
                            "in one dtype")
        want = (k.shape[0], L.num_kv_heads, L.head_dim)
        if tuple(k.shape) != want or tuple(v.shape) != want:
            raise ValueError(
                f"k and v must be [T, num_kv_heads={L.num_kv_heads}, "
                f"head_dim={L.head_dim}], not {tuple(k.shape)} and "
                f"{tuple(v.shape)}")
        T = want[0]
        slots = _index(slots, "slots", self.device, torch.int64, (T,))
        if T == 0:
            return
        row = L.num_kv_heads * L.head_dim
        k, v = _rows(k, row), _rows(v, row)
        if k.stride(0) != v.stride(0):
            k, v = k.contiguous(), v.contiguous()
        if self.validate:
            s = slots.cpu().numpy()
            end = L.num_blocks * L.block_size
            if s.max() >= end:
                i = int(np.argmax(s >= end))
                raise ValueError(f"slots[{i}] = {s[i]} is past the pool "
                                 f"({L.num_blocks} blocks of {L.block_size} "
                                 "tokens)")
        a = _lib.kvs_write_args()
        a.kv = self._planes[layer]
        a.k, a.v, a.slots = _ptr(k), _ptr(v), _ptr(slots)
        a.src_token_stride = k.stride(0) if T > 1 else row
        a.src_dtype = _FLOAT_DTYPES[k.dtype]
        a.num_tokens = T
        self._launch(self._write_kv, a, self._stream(), what)

    def decode(self, layer, q, seq_lens, block_tables, scale=None, out=None,
               *, max_seq_len=None):
        """Paged decode attention of layer `layer`: one query row per
        request, its last token (position seq_lens[s] - 1).  q [B][H]
        [head_dim] float32/float16/bfloat16, H a multiple of num_kv_heads
        (GQA); seq_lens int32 [B]; block_tables int32 [B][W].  scale:
        softmax scale (default 1/sqrt(head_dim)); out: a packed tensor like
        q to write into (default: a new one).  max_seq_len: a bound of
        seq_lens, saving the cuda path a device read when validate is off.
        Returns out."""
        return self._attend("decode", layer, q, None, seq_lens, block_tables,
                            scale, out, max_seq_len)

    def prefill(self, layer, q, q_start, seq_lens, block_tables, scale=None,
                out=None, *, max_seq_len=None):
        """Paged (chunked) prefill attention of layer `layer`: request s has
        the q rows q_start[s] .. q_start[s+1]-1 (q_start int32 [B+1], from
        0 to rows, non-decreasing), the last q_len of its seq_lens[s]
        tokens, each attending causally to its request's keys; the earlier
        seq_lens[s] - q_len keys are a cached prefix.  Write the new
        tokens' K/V first.  q [rows][H][head_dim]; otherwise as decode."""
        return self._attend("prefill", layer, q, q_start, seq_lens,
                            block_tables, scale, out, max_seq_len)

    def _attend(self, what, layer, q, q_start, seq_lens, block_tables, scale,
                out, max_seq_len):
        layer = self._layer(layer, what)
        L = self.layout
        dev = self.device
        _tensor(q, "q", dev, _FLOAT_DTYPES, 3)
        rows, heads, dim = q.shape
        if dim != L.head_dim:
            raise ValueError(f"q's head_dim is {dim}, the pool's {L.head_dim}")
        if heads == 0 or heads % L.num_kv_heads:
            raise ValueError(f"q has {heads} heads: grouped-query attention "
                             "needs a multiple of the pool's "
                             f"{L.num_kv_heads} kv heads")
        seq_lens = _index(seq_lens, "seq_lens", dev, torch.int32, (None,))
        B = seq_lens.shape[0]
        tables = _index(block_tables, "block_tables", dev, torch.int32,
                        (B, None))
        if q_start is None:
            if rows != B:
                raise ValueError(f"decode: q has {rows} rows for {B} "
                                 "requests (one row each)")
        else:
            q_start = _index(q_start, "q_start", dev, torch.int32, (B + 1,))
        if out is None:
            out = torch.empty(q.shape, dtype=q.dtype, device=dev)
        else:
            _tensor(out, "out", dev, (q.dtype,), 3)
            if out.shape != q.shape or not out.is_contiguous():
                raise ValueError(f"out must be a contiguous tensor of q's "
                                 f"shape {tuple(q.shape)}, not "
                                 f"{tuple(out.shape)}"
                                 f"{'' if out.is_contiguous() else ' strided'}")
        if scale is None:
            scale = 1.0 / math.sqrt(L.head_dim)
        scale = float(scale)
        if max_seq_len is not None:
            max_seq_len = _int(max_seq_len, "max_seq_len")
            if max_seq_len < 0:
                raise ValueError(f"max_seq_len {max_seq_len} is negative")
        if B == 0:
            if rows:
                raise ValueError(f"{what}: q has {rows} rows for no request")
            return out
        if self.validate or max_seq_len is None:
            idx = [seq_lens, tables] + ([q_start] if q_start is not None
                                        else [])
            host = self._host(*idx) if self.validate else self._host(seq_lens)
            longest = int(host[0].max())
            if self.validate:
                self._check_tables(what, rows, *host)
                if max_seq_len is not None and max_seq_len < longest:
                    raise ValueError(f"max_seq_len {max_seq_len} is below "
                                     f"the longest seq_len, {longest}")
            if max_seq_len is None:
                max_seq_len = max(longest, 0)
        if rows == 0:
            return out
        q = q.contiguous()
        if _overlap(q, out):
            raise ValueError(f"{what}: out overlaps q (the kernels read q "
                             "while they write out): give a separate "
                             "tensor")
        a = _lib.kvs_attn_args()
        a.kv = self._planes[layer]
        a.out, a.q = _ptr(out), _ptr(q)
        a.seq_lens, a.q_start = _ptr(seq_lens), _ptr(q_start)
        a.block_tables = _ptr(tables)
        a.num_seqs, a.num_rows, a.num_heads = B, rows, heads
        a.max_blocks_per_seq = tables.shape[1]
        a.max_seq_len = max_seq_len
        a.qo_dtype = _FLOAT_DTYPES[q.dtype]
        a.scale = scale
        stream = self._stream()
        if self.backend == "cuda":
            need = self._L.kvs_attn_workspace_bytes(byref(a))
            if need:
                ws = self._workspace(stream, need)
                a.workspace, a.workspace_bytes = _ptr(ws), ws.numel()
        fn = self._prefill if q_start is not None else self._decode
        self._launch(fn, a, stream, what)
        return out

    def _workspace(self, stream, need):
        """The split workspace of one stream, grown to `need` bytes (kept
        per stream: the kernels of one stream use it in order)."""
        ws = self._workspaces.get(stream.value)
        if ws is None or ws.numel() < need:
            ws = torch.empty(need, dtype=torch.uint8, device=self.device)
            self._workspaces[stream.value] = ws
        return ws

    def _check_tables(self, what, rows, lens, tables, q_start=None):
        L = self.layout
        bs, width = L.block_size, tables.shape[1]
        lens = lens.astype(np.int64)
        bad = np.flatnonzero((lens < 0) | (lens > width * bs))
        if bad.size:
            s = int(bad[0])
            raise ValueError(f"seq_lens[{s}] = {lens[s]} does not fit the "
                             f"block table's {width} columns of {bs} tokens")
        used = np.arange(width)[None, :] < ((lens + bs - 1) // bs)[:, None]
        wrong = used & ((tables < 0) | (tables >= L.num_blocks))
        if wrong.any():
            s, j = (int(x) for x in np.argwhere(wrong)[0])
            raise ValueError(f"block_tables[{s}][{j}] = {tables[s, j]} is "
                             f"not a block of the pool (0 .. "
                             f"{L.num_blocks - 1})")
        if q_start is None:
            return
        qs = q_start.astype(np.int64)
        q_len = np.diff(qs)
        if qs[0] != 0 or qs[-1] != rows or (q_len < 0).any():
            raise ValueError(f"q_start must rise from 0 to q's {rows} rows, "
                             f"not {qs.tolist()}")
        over = np.flatnonzero(q_len > lens)
        if over.size:
            s = int(over[0])
            raise ValueError(f"request {s} has {q_len[s]} query rows but "
                             f"seq_lens[{s}] = {lens[s]}")


def _overlap(a, b):
    """Whether the bytes of two contiguous tensors intersect."""
    a0, b0 = a.data_ptr(), b.data_ptr()
    return (a0 < b0 + b.numel() * b.element_size() and
            b0 < a0 + a.numel() * a.element_size())


def _rows(t, row):
    """t [T][heads][head_dim] with its last two axes packed (a copy if they
    are not)."""
    if t.shape[0] and (t.stride(2) != 1 or t.stride(1) != t.shape[2] or
                       (t.shape[0] > 1 and t.stride(0) < row)):
        return t.contiguous()
    return t


# ---- one Batch per scheduler step -----------------------------------------------------
class Step:
    """The daemon ops of one scheduler step, sent as one Batch, with each
    live request's block table tracked across steps.

        step = kvt.Step(c)
        h = step.lookup(1, prompt); a = step.allocate(1, n)
        step.submit()                 # one round trip
        step.table(1), step.hit(1)    # the table after lookup + allocate

    Each op returns its kvshare Op: after submit(), .result is its
    LookupResult, AllocResult or sealed count.  submit() applies every
    successful op to the tables in order (the daemon ran the ops after a
    failed one too), then raises the first failed op's error, naming the
    op and its request.  A lookup sets the request's table and hit count,
    allocate/append extend it (a copy-on-write pair replaces the entry it
    names: copy `step.cow`'s pairs before writing those blocks), fork
    copies it to the child, preempt empties it, free drops it.
    """

    def __init__(self, client):
        self.client = client
        self._batch = client.batch()
        self._ops = []      # (req, op) of the step being built
        self._tables = {}
        self._hits = {}
        self.cow = ()       # CowPairs of the last submit the daemon left

    def close(self):
        self._batch.close()

    # -- ops ----------------------------------------------------------------------
    def _add(self, req, op, child=None):
        self._ops.append((req, child, op))
        return op

    def lookup(self, req, tokens, salt=None):
        return self._add(req, self._batch.lookup(req, tokens, salt))

    def allocate(self, req, n):
        return self._add(req, self._batch.allocate(req, n))

    def append(self, req, n=1):
        return self._add(req, self._batch.append(req, n))

    def commit(self, req, start, tokens=None, **kw):
        """As Batch.commit (n=, blocks=, engine_hashes=, ...)."""
        return self._add(req, self._batch.commit(req, start, tokens, **kw))

    def fork(self, req, child):
        return self._add(req, self._batch.fork(req, child), child)

    def preempt(self, req):
        return self._add(req, self._batch.preempt(req))

    def free(self, req):
        return self._add(req, self._batch.free(req))

    def __len__(self):
        return len(self._ops)

    # -- submit ---------------------------------------------------------------------
    def submit(self):
        """Send the step's ops in one round trip (none: no round trip),
        update the tables, then raise the first failed op's KvsError (its
        .op names the op, its index and the request).  Returns the ops.
        When the round trip itself fails (the batch refused whole, e.g.
        TOOBIG, or the connection lost) its KvsError is raised and the
        step's ops are dropped: nothing is known of them, and the next
        submit sends only the ops added after."""
        ops, self._ops = self._ops, []
        if not ops:
            return ()
        try:
            self._batch.submit()
        except BaseException:
            # Refused whole (e.g. TOOBIG) or the round trip failed: the
            # step's ops are dropped on both sides, else the Batch would
            # send them again, untracked, with the next step's.
            self._batch.close()
            try:
                self._batch = self.client.batch()
            except Exception:
                pass        # (a closed batch: the next op says so)
            raise
        first, cow = None, []
        for req, child, op in ops:
            if op.status:
                if first is None:
                    first = (req, op)
                continue
            self._apply(req, child, op, cow)
        self.cow = tuple(cow)
        if first is not None:
            req, op = first
            raise error_for(op.status, op.message,
                            f"step {op.kind} of request {req} (op "
                            f"{op.index + 1} of {len(ops)})")
        return tuple(op for _, _, op in ops)

    def _apply(self, req, child, op, cow):
        kind, r = op.kind, op.result
        if kind == "lookup":
            self._tables[req] = list(r.blocks)
            self._hits[req] = r.hit_tokens
        elif kind in ("allocate", "append"):
            t = self._tables.setdefault(req, [])
            end = r.first_index + len(r.blocks)
            if len(t) < end:
                t.extend([_lib.BLOCK_NONE] * (end - len(t)))
            t[r.first_index:end] = r.blocks
            if r.cow is not None:
                t[r.cow.index] = r.cow.dst
                if not r.cow.done_by_daemon:
                    cow.append(r.cow)
        elif kind == "fork":
            self._tables[child] = list(self._tables.get(req, ()))
            self._hits[child] = self._hits.get(req, 0)
        elif kind == "preempt":
            self._tables[req] = []
        elif kind == "free":
            self._tables.pop(req, None)
            self._hits.pop(req, None)

    # -- what is tracked ----------------------------------------------------------------
    def table(self, req):
        """The request's block table (a new list)."""
        try:
            return list(self._tables[_req(req)])
        except KeyError:
            raise KeyError(f"request {req} has no table in this step helper "
                           "(no lookup through it, or freed)") from None

    def hit(self, req):
        """Tokens the request's last lookup found cached."""
        self.table(req)
        return self._hits.get(_req(req), 0)

    def adopt(self, req, looked_up):
        """Track a request looked up outside the step: looked_up is the
        LookupResult of Client.lookup, which (unlike a lookup inside a
        Batch) waits while the prefix's blocks come up from the tiers
        below the pool.  Submit the step's pending ops first when they
        must run before that lookup."""
        if not isinstance(looked_up, LookupResult):
            raise TypeError(f"adopt: a LookupResult, not "
                            f"{type(looked_up).__name__}")
        req = _req(req)
        self._tables[req] = list(looked_up.blocks)
        self._hits[req] = looked_up.hit_tokens

    @property
    def requests(self):
        """The requests whose tables are tracked."""
        return tuple(self._tables)
