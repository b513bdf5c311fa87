#!/usr/bin/python3
"""bench_attention_sdpa -- kvshare's paged decode attention against
PyTorch's scaled_dot_product_attention on contiguous K/V (what an engine
without paging runs), same shapes, same GPU, same run; and each against a
device-to-device copy of 1 GiB (bandwidth: decode reads every K/V byte
once).  The five shapes of issue 30, fp16, head_dim 128:

    16 x 2048, 32/8 heads    32 x 4096, 32/8    64 x 8192, 32/8
    32 x 4096, 32/32 (MHA)   32 x 4096, 64/8 (GQA 8)
    (and 16 x 2048 with 32/4 heads, head_dim 64)

kvshare's kernel runs through libkvshare (ctypes: kvs_cuda_decode_attention
on PyTorch's current stream, the pool a torch tensor laid out as
[block][K|V][token][kv head][dim]); SDPA gets the same K/V gathered into
contiguous [batch][kv head][token][dim] tensors (with enable_gqa).  The
outputs are compared before anything is timed.

Prefill: batch / cached prefix / new tokens 4/0/2048, 4/4096/512,
4/8192/2048, 16/1024/256, a chunk sweep 4/0/128..8192, and 1/32768/128,
2/16384/256 (given a workspace up to 1 GiB: where the flash kernel splits
long prefixes), 32/8 heads, D 128, fp16: kvs_cuda_prefill_attention
on the old kernel, on the flash kernel (mma.sync) and, on compute
capability 9.0, on its wgmma variant (each in a child process with
KVS_CUDA_PREFILL_FLASH and KVS_CUDA_PREFILL_WGMMA set: the knobs are read
when the kernels load) against SDPA with a lower-right causal mask (the new tokens see the
whole prefix) on the same K/V gathered contiguous; TFLOP/s of the useful
causal work (4 * D flops per query head, row and key seen).

Needs a GPU and PyTorch: elsewhere it says why and exits 77 (skipped).
`--selftest` checks this script's own plumbing on the CPU instead: the
same argument structs given to libkvshare's C twins (kvs_cpu_decode_attention,
and kvs_cpu_prefill_attention with q_start as the prefill rows set it)
over numpy arrays, against a numpy reference; run by make test.

KVS_LIBRARY names libkvshare.so.0 (default: $KVS_BUILD/libkvshare.so.0).
"""
import ctypes
import math
import os
import sys

BS = 16  # tokens per block
FP32, FP16 = 0, 1


class PagedKV(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("block_stride", ctypes.c_uint64),
                ("k_offset", ctypes.c_uint64), ("v_offset", ctypes.c_uint64),
                ("token_stride", ctypes.c_uint64), ("head_stride", ctypes.c_uint64),
                ("block_size", ctypes.c_uint32), ("num_kv_heads", ctypes.c_uint32),
                ("head_dim", ctypes.c_uint32), ("dtype", ctypes.c_uint32),
                ("num_blocks", ctypes.c_uint32), ("scale_offset", ctypes.c_uint32)]


class AttnArgs(ctypes.Structure):
    _fields_ = [("kv", PagedKV), ("out", ctypes.c_void_p), ("q", ctypes.c_void_p),
                ("seq_lens", ctypes.c_void_p), ("q_start", ctypes.c_void_p),
                ("block_tables", ctypes.c_void_p), ("workspace", ctypes.c_void_p),
                ("workspace_bytes", ctypes.c_uint64), ("num_seqs", ctypes.c_uint32),
                ("num_rows", ctypes.c_uint32), ("num_heads", ctypes.c_uint32),
                ("max_blocks_per_seq", ctypes.c_uint32), ("max_seq_len", ctypes.c_uint32),
                ("qo_dtype", ctypes.c_uint32), ("scale", ctypes.c_float),
                ("reserved_", ctypes.c_uint32)]


def load_lib():
    build = os.environ.get("KVS_BUILD", "build")
    lib = ctypes.CDLL(os.environ.get("KVS_LIBRARY") or os.path.join(build, "libkvshare.so.0"))
    for name in ("kvs_cpu_decode_attention", "kvs_cuda_decode_attention",
                 "kvs_cpu_prefill_attention", "kvs_cuda_prefill_attention"):
        getattr(lib, name).argtypes = [ctypes.POINTER(AttnArgs), ctypes.c_void_p]
        getattr(lib, name).restype = ctypes.c_int
    lib.kvs_attn_workspace_bytes.argtypes = [ctypes.POINTER(AttnArgs)]
    lib.kvs_attn_workspace_bytes.restype = ctypes.c_uint64
    lib.kvs_cuda_open.argtypes = [ctypes.c_char_p]
    lib.kvs_cuda_open.restype = ctypes.c_int
    return lib


def args_for(pool_ptr, elem, nblocks, kvh, d, dtype, out_ptr, q_ptr, lens_ptr, tab_ptr,
             b, h, maxb, maxlen):
    """The kernel's arguments for a pool of [block][K|V][token][kv head][d]
    elements of `elem` bytes."""
    a = AttnArgs()
    plane = BS * kvh * d * elem
    a.kv.base, a.kv.block_stride = pool_ptr, 2 * plane
    a.kv.k_offset, a.kv.v_offset = 0, plane
    a.kv.token_stride, a.kv.head_stride = kvh * d, d
    a.kv.block_size, a.kv.num_kv_heads, a.kv.head_dim = BS, kvh, d
    a.kv.dtype, a.kv.num_blocks = dtype, nblocks
    a.out, a.q, a.seq_lens, a.q_start, a.block_tables = out_ptr, q_ptr, lens_ptr, None, tab_ptr
    a.num_seqs = a.num_rows = b
    a.num_heads, a.max_blocks_per_seq, a.max_seq_len = h, maxb, maxlen
    a.qo_dtype, a.scale = dtype, 1.0 / math.sqrt(d)
    return a


def selftest():
    """The plumbing on the CPU: ragged lengths, scattered blocks, GQA 4;
    decode, then prefill with cached prefixes."""
    import numpy as np
    lib = load_lib()
    rng = np.random.default_rng(5)
    b, h, kvh, d = 3, 8, 2, 64
    lens = np.array([37, 1, 64], dtype=np.uint32)
    maxb = (int(lens.max()) + BS - 1) // BS
    nblocks = 4 * b * maxb
    pool = rng.standard_normal((nblocks, 2, BS, kvh, d)).astype(np.float32)
    tab = rng.permutation(nblocks)[:b * maxb].astype(np.uint32).reshape(b, maxb)
    q = rng.standard_normal((b, h, d)).astype(np.float32)
    out = np.zeros((b, h, d), dtype=np.float32)
    a = args_for(pool.ctypes.data, 4, nblocks, kvh, d, FP32, out.ctypes.data, q.ctypes.data,
                 lens.ctypes.data, tab.ctypes.data, b, h, maxb, int(lens.max()))
    rc = lib.kvs_cpu_decode_attention(ctypes.byref(a), None)
    if rc:
        sys.exit(f"kvs_cpu_decode_attention: {rc}")
    worst = 0.0
    for s in range(b):
        n = int(lens[s])
        blocks = [tab[s, j // BS] for j in range(n)]
        k = np.stack([pool[blocks[j], 0, j % BS] for j in range(n)]).astype(np.float64)
        v = np.stack([pool[blocks[j], 1, j % BS] for j in range(n)]).astype(np.float64)
        for hq in range(h):
            g = hq // (h // kvh)
            w = (k[:, g] @ q[s, hq].astype(np.float64)) / math.sqrt(d)
            w = np.exp(w - w.max())
            ref = (w / w.sum()) @ v[:, g]
            worst = max(worst, float(np.abs(ref - out[s, hq]).max()))
    if worst > 1e-4:
        sys.exit(f"selftest: max error {worst:.3g} against numpy")
    print(f"selftest: the argument struct through the C twin matches numpy "
          f"(max error {worst:.2g}, {b} ragged requests, GQA {h // kvh})")
    # Prefill, as prefill_rows sets it up: q_start and num_rows on top of
    # args_for, the new tokens the last qlen of each request's keys.
    qlens = np.array([5, 1, 64], dtype=np.uint32)
    qstart = np.concatenate([[0], np.cumsum(qlens)]).astype(np.uint32)
    rows = int(qstart[-1])
    q = rng.standard_normal((rows, h, d)).astype(np.float32)
    out = np.full((rows, h, d), np.nan, dtype=np.float32)
    a = args_for(pool.ctypes.data, 4, nblocks, kvh, d, FP32, out.ctypes.data, q.ctypes.data,
                 lens.ctypes.data, tab.ctypes.data, b, h, maxb, int(lens.max()))
    a.q_start, a.num_rows = qstart.ctypes.data, rows
    rc = lib.kvs_cpu_prefill_attention(ctypes.byref(a), None)
    if rc:
        sys.exit(f"kvs_cpu_prefill_attention: {rc}")
    worst = 0.0
    for s in range(b):
        n, ql = int(lens[s]), int(qlens[s])
        blocks = [tab[s, j // BS] for j in range(n)]
        k = np.stack([pool[blocks[j], 0, j % BS] for j in range(n)]).astype(np.float64)
        v = np.stack([pool[blocks[j], 1, j % BS] for j in range(n)]).astype(np.float64)
        for i in range(ql):
            pos = n - ql + i
            for hq in range(h):
                g = hq // (h // kvh)
                w = (k[:pos + 1, g] @ q[qstart[s] + i, hq].astype(np.float64)) / math.sqrt(d)
                w = np.exp(w - w.max())
                ref = (w / w.sum()) @ v[:pos + 1, g]
                worst = max(worst, float(np.abs(ref - out[qstart[s] + i, hq]).max()))
    if not worst <= 1e-4:
        sys.exit(f"selftest: prefill max error {worst:.3g} against numpy")
    print(f"selftest: the prefill struct through the C twin matches numpy "
          f"(max error {worst:.2g}, {rows} rows of {b} requests with cached prefixes)")


SHAPES = [  # batch, tokens, heads, kv heads, head_dim, label
    (16, 2048, 32, 8, 128, "16x2048 32/8"),
    (32, 4096, 32, 8, 128, "32x4096 32/8"),
    (64, 8192, 32, 8, 128, "64x8192 32/8"),
    (32, 4096, 32, 32, 128, "32x4096 MHA"),
    (32, 4096, 64, 8, 128, "32x4096 GQA 8"),
    (16, 2048, 32, 4, 64, "16x2048 32/4 D64"),
]


def time_ms(torch, fn, reps=20):
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(reps):
            fn()
        e1.record()
        torch.cuda.synchronize()
        best = min(best, e0.elapsed_time(e1) / reps)
    return best


def gpu_bench():
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("skipped: no PyTorch")
        sys.exit(77)
    if not torch.cuda.is_available():
        print("skipped: no GPU visible to PyTorch")
        sys.exit(77)
    lib = load_lib()
    torch.zeros(1, device="cuda")  # the primary context, current here
    if lib.kvs_cuda_open(None):
        print("skipped: libkvshare cannot open the GPU")
        sys.exit(77)
    dev = torch.cuda.get_device_name()
    gib = 1 << 30
    src = torch.empty(gib, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_ms = time_ms(torch, lambda: dst.copy_(src), 10)
    copy_gbs = 2 * gib / copy_ms / 1e6  # read + write, as bench_attention_gpu
    del src, dst
    print(f"device: {dev}; torch {torch.__version__}; 1 GiB device copy "
          f"{copy_gbs:.0f} GB/s (read + write)")
    print(f"{'shape':18} {'kvshare us':>10} {'SDPA us':>9} {'x SDPA':>7} "
          f"{'% copy':>7} {'max err':>8}")
    for b, n, h, kvh, d, label in SHAPES:
        maxb = n // BS
        nblocks = b * maxb + 64
        g = torch.Generator(device="cuda").manual_seed(3)
        pool = torch.randn((nblocks, 2, BS, kvh, d), device="cuda", dtype=torch.float16,
                           generator=g)
        perm = torch.randperm(nblocks, device="cuda", generator=g)[:b * maxb]
        tab = perm.to(torch.int32).reshape(b, maxb).contiguous()
        lens = torch.full((b,), n, dtype=torch.int32, device="cuda")
        q = torch.randn((b, h, d), device="cuda", dtype=torch.float16, generator=g)
        out = torch.empty_like(q)
        a = args_for(pool.data_ptr(), 2, nblocks, kvh, d, FP16, out.data_ptr(), q.data_ptr(),
                     lens.data_ptr(), tab.data_ptr(), b, h, maxb, n)
        ws = torch.empty(max(1, lib.kvs_attn_workspace_bytes(ctypes.byref(a))),
                         dtype=torch.uint8, device="cuda")
        a.workspace, a.workspace_bytes = ws.data_ptr(), ws.numel()
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

        def ours():
            rc = lib.kvs_cuda_decode_attention(ctypes.byref(a), stream)
            if rc:
                sys.exit(f"kvs_cuda_decode_attention: {rc}")

        # contiguous K/V for SDPA: [b][kvh][n][d]
        gathered = pool[tab.long()]                   # [b][maxb][2][BS][kvh][d]
        k = gathered[:, :, 0].reshape(b, n, kvh, d).transpose(1, 2).contiguous()
        v = gathered[:, :, 1].reshape(b, n, kvh, d).transpose(1, 2).contiguous()
        del gathered
        qs = q.unsqueeze(2)                           # [b][h][1][d]

        def sdpa():
            return F.scaled_dot_product_attention(qs, k, v, enable_gqa=(h != kvh))

        ours()
        ref = sdpa().squeeze(2)
        torch.cuda.synchronize()
        err = (out.float() - ref.float()).abs().max().item()
        if err > 2e-2:
            sys.exit(f"{label}: kvshare and SDPA differ by {err:.3g}")
        t_ours = time_ms(torch, ours)
        t_sdpa = time_ms(torch, sdpa)
        kv_bytes = 2 * b * n * kvh * d * 2
        pct = kv_bytes / (t_ours / 1e3) / 1e9 / copy_gbs * 100
        print(f"{label:18} {t_ours * 1e3:10.1f} {t_sdpa * 1e3:9.1f} "
              f"{t_sdpa / t_ours:6.2f}x {pct:6.0f}% {err:8.2g}")
        del pool, k, v, ws


PREFILLS = [(4, 0, 2048), (4, 4096, 512), (4, 8192, 2048), (16, 1024, 256)]
# issue 26's chunk sweep (batch 4, prefix 0), then few new rows over long
# prefixes (where the flash kernel splits the keys: the call gets the
# workspace, as the decode rows do)
PREFILLS += [(4, 0, q) for q in (128, 256, 512, 1024, 4096, 8192)]
PREFILLS += [(1, 32768, 128), (2, 16384, 256)]


def prefill_rows(which):
    """Child process: the prefill shapes on the kernel the environment
    chose (KVS_CUDA_PREFILL_FLASH, KVS_CUDA_PREFILL_WGMMA), against SDPA."""
    import torch
    import torch.nn.functional as F
    lib = load_lib()
    torch.zeros(1, device="cuda")
    if lib.kvs_cuda_open(None):
        sys.exit("libkvshare cannot open the GPU")
    h, kvh, d = 32, 8, 128
    for b, prefix, qlen in PREFILLS:
        n = prefix + qlen
        maxb = (n + BS - 1) // BS
        nblocks = b * maxb + 64
        g = torch.Generator(device="cuda").manual_seed(4)
        pool = torch.randn((nblocks, 2, BS, kvh, d), device="cuda", dtype=torch.float16,
                           generator=g)
        perm = torch.randperm(nblocks, device="cuda", generator=g)[:b * maxb]
        tab = perm.to(torch.int32).reshape(b, maxb).contiguous()
        lens = torch.full((b,), n, dtype=torch.int32, device="cuda")
        qstart = (torch.arange(b + 1, dtype=torch.int32, device="cuda") * qlen).contiguous()
        q = torch.randn((b * qlen, h, d), device="cuda", dtype=torch.float16, generator=g)
        out = torch.empty_like(q)
        a = args_for(pool.data_ptr(), 2, nblocks, kvh, d, FP16, out.data_ptr(), q.data_ptr(),
                     lens.data_ptr(), tab.data_ptr(), b, h, maxb, n)
        a.q_start, a.num_rows = qstart.data_ptr(), b * qlen
        wsb = lib.kvs_attn_workspace_bytes(ctypes.byref(a))
        ws = None  # a workspace up to 1 GiB (as bench_attention_gpu)
        if 0 < wsb <= 1 << 30:
            ws = torch.empty(wsb, dtype=torch.uint8, device="cuda")
            a.workspace, a.workspace_bytes = ws.data_ptr(), ws.numel()
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

        def ours():
            rc = lib.kvs_cuda_prefill_attention(ctypes.byref(a), stream)
            if rc:
                sys.exit(f"kvs_cuda_prefill_attention: {rc}")

        gathered = pool[tab.long()]
        k = gathered[:, :, 0].reshape(b, maxb * BS, kvh, d)[:, :n].transpose(1, 2).contiguous()
        v = gathered[:, :, 1].reshape(b, maxb * BS, kvh, d)[:, :n].transpose(1, 2).contiguous()
        del gathered
        qs = q.reshape(b, qlen, h, d).transpose(1, 2)  # [b][h][qlen][d]
        try:
            from torch.nn.attention.bias import causal_lower_right
            mask = causal_lower_right(qlen, n)
        except ImportError:  # older torch: the same mask, spelled out
            mask = torch.ones(qlen, n, dtype=torch.bool, device="cuda").tril(n - qlen)

        def sdpa():
            return F.scaled_dot_product_attention(qs, k, v, attn_mask=mask,
                                                  enable_gqa=(h != kvh))

        ours()
        ref = sdpa().transpose(1, 2).reshape(b * qlen, h, d)
        torch.cuda.synchronize()
        err = (out.float() - ref.float()).abs().max().item()
        if err > 2e-2:
            sys.exit(f"prefill {b}/{prefix}/{qlen} ({which}): kvshare and SDPA differ by {err:.3g}")
        t_ours = time_ms(torch, ours, 5)
        t_sdpa = time_ms(torch, sdpa, 5)
        flops = 4.0 * d * h * b * (qlen * prefix + qlen * (qlen + 1) / 2)
        print(f"{b}/{prefix}/{qlen:<10} {which:6} {t_ours * 1e3:10.1f} "
              f"{flops / t_ours / 1e9:8.1f} {t_sdpa * 1e3:9.1f} {flops / t_sdpa / 1e9:8.1f} "
              f"{t_sdpa / t_ours:6.2f}x {err:8.2g}", flush=True)
        del pool, k, v, ws


def prefill_bench():
    import subprocess
    print(f"\nprefill, 32/8 heads, D 128, fp16 (b/prefix/new):")
    print(f"{'shape':16} {'kernel':6} {'kvshare us':>10} {'TFLOP/s':>8} {'SDPA us':>9} "
          f"{'TFLOP/s':>8} {'x SDPA':>7} {'max err':>8}", flush=True)
    import torch
    # the old kernel, the flash kernel on mma.sync, and on compute
    # capability 9.0 its wgmma variant (the knobs are read when the kernels
    # load: a child process each)
    runs = [("old", "0", "0"), ("flash", "1", "0")]
    if torch.cuda.get_device_capability() == (9, 0):
        runs.append(("wgmma", "1", "1"))
    for which, flash, wg in runs:
        env = dict(os.environ, KVS_CUDA_PREFILL_FLASH=flash, KVS_CUDA_PREFILL_WGMMA=wg)
        rc = subprocess.run([sys.executable, os.path.abspath(__file__), "--prefill-rows",
                             which], env=env).returncode
        if rc:
            sys.exit(f"prefill rows ({which}): exit {rc}")


if __name__ == "__main__":
    if "--selftest" in sys.argv[1:]:
        selftest()
    elif "--prefill-rows" in sys.argv[1:]:
        prefill_rows(sys.argv[-1])
    else:
        gpu_bench()
        prefill_bench()
