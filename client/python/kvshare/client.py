"""kvshare.Client: one connection (one session) to kvshared."""
import ctypes
import os
import warnings
import weakref
from ctypes import byref, c_uint32, c_uint64, c_void_p
from dataclasses import dataclass, field
from typing import Optional, Tuple

import numpy as np

from . import _lib
from .errors import ConnectError, KvsError, error_for
from .views import NUMPY_DTYPES, PoolTensor, bf16_to_float32, dequantize

_U32_MAX = 0xFFFFFFFF
_U64_MAX = 0xFFFFFFFFFFFFFFFF


# ---- results -------------------------------------------------------------------
@dataclass(frozen=True)
class Layout:
    """The pool layout the daemon announced (kvs_layout)."""
    block_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: int          # kvs_dtype: 0 fp32, 1 fp16, 2 bf16, 3 int8, 4 fp8
    num_blocks: int
    block_stride: int   # bytes from one block to the next

    @property
    def dtype_name(self):
        return _lib.DTYPES[self.dtype][0]

    @property
    def numpy_dtype(self):
        """float32, float16, uint16 for bf16 (its raw bits), uint8 for int8
        and fp8 (the stored bytes; the scales are float32)."""
        return NUMPY_DTYPES[self.dtype]

    @property
    def block_shape(self):
        """(num_layers, 2, block_size, num_kv_heads, head_dim): one block."""
        return (self.num_layers, 2, self.block_size, self.num_kv_heads,
                self.head_dim)

    @property
    def plane_shape(self):
        """(block_size, num_kv_heads, head_dim): one K or V plane."""
        return (self.block_size, self.num_kv_heads, self.head_dim)

    @property
    def quantized(self):
        """int8 or fp8: one byte per element plus float32 row parameters."""
        return self.dtype in _lib.SCALE_FLOATS

    @property
    def scale_floats(self):
        """kvs_scale_floats: float32 per (token, kv head) of a plane (int8
        2, [scale, min]; fp8 1; 0 for fp32/fp16/bf16)."""
        return _lib.SCALE_FLOATS.get(self.dtype, 0)

    @property
    def scale_offset(self):
        """kvs_scale_offset: bytes from a plane's start to its scales (the
        elements' bytes rounded up to 16); None for an unquantized pool."""
        if not self.quantized:
            return None
        n = self.block_size * self.num_kv_heads * self.head_dim
        return (n + 15) // 16 * 16

    @property
    def scales_shape(self):
        """The scales of one plane: int8 (block_size, num_kv_heads, 2),
        fp8 (block_size, num_kv_heads); None for an unquantized pool."""
        if not self.quantized:
            return None
        s = (self.block_size, self.num_kv_heads)
        return s + (2,) if self.scale_floats == 2 else s

    @property
    def plane_bytes(self):
        """kvs_plane_bytes: bytes of one K or V plane, an int8/fp8 plane's
        scales and padding included."""
        n = _lib.DTYPES[self.dtype][1]
        for d in self.plane_shape:
            n *= d
        nf = self.scale_floats
        if nf:
            r16 = lambda x: (x + 15) // 16 * 16
            n = r16(n) + r16(4 * nf * self.block_size * self.num_kv_heads)
        return n

    @property
    def block_bytes(self):
        """Useful bytes of a block (block_stride rounds this up to 4096);
        an int8/fp8 plane also holds its scales (kvs_plane_bytes): per
        (token, kv head) int8 a float32 scale and minimum, fp8 a scale."""
        return self.plane_bytes * 2 * self.num_layers


@dataclass(frozen=True)
class LookupResult:
    hit_tokens: int              # tokens of the prompt already cached
    blocks: Tuple[int, ...]      # the request's block table after the lookup


@dataclass(frozen=True)
class CowPair:
    """A copy-on-write pair of an allocation: copy block src into dst
    before writing (Client.copy_blocks), unless done_by_daemon."""
    src: int
    dst: int
    index: int                   # block-table index now holding dst
    done_by_daemon: bool         # has_cow 2: the daemon copied already


@dataclass(frozen=True)
class AllocResult:
    first_index: int             # block-table index of blocks[0]
    blocks: Tuple[int, ...]      # blocks appended to the request's table
    cow: Optional[CowPair] = None


@dataclass(frozen=True)
class SwapResult:
    tokens: int          # out: written tokens swapped out; in: restored
    lost_tokens: int     # in: written tokens not restored (compute again)
    copied_blocks: int
    blocks: Tuple[int, ...]  # in: the request's block table


@dataclass(frozen=True)
class TierStats:
    name: str
    capacity_bytes: int
    slots: int
    used: int
    demotions: int
    promotions: int
    hit_blocks: int
    drops: int
    failures: int
    bytes_in: int
    bytes_out: int
    io_errors: int
    checksum_failures: int


@dataclass(frozen=True)
class SwapStats:
    swapped_requests: int
    held_slots: int
    swap_outs: int
    swap_ins: int
    failures: int
    out_blocks: int
    kept_blocks: int
    in_blocks: int
    resident_blocks: int


@dataclass(frozen=True)
class TenantStats:
    """One tenant's partition of the pool (kvs_tenant_stats)."""
    name: str
    num_blocks: int      # its share of the pool
    free_blocks: int
    cached_blocks: int
    used_blocks: int
    num_requests: int
    sessions: int        # its sessions now
    lookups: int
    query_tokens: int
    hit_tokens: int
    evictions: int
    no_space: int
    pool_bytes: int

    @property
    def hit_rate(self):
        """hit_tokens / query_tokens; None before its first lookup."""
        return self.hit_tokens / self.query_tokens if self.query_tokens \
            else None


@dataclass(frozen=True)
class Stats:
    """The daemon's counters (kvs_stats), its tiers and swap counters, and
    with tenants the session's tenant and the tenants' lines it may see."""
    num_blocks: int
    free_blocks: int
    cached_blocks: int
    used_blocks: int
    num_requests: int
    sessions: int
    lookups: int
    query_tokens: int
    hit_tokens: int
    hit_blocks: int
    miss_blocks: int
    allocated_blocks: int
    evictions: int
    cow_copies: int
    sealed_blocks: int
    no_space: int
    frames_in: int
    protocol_errors: int
    check: int               # the invariant check's status (when asked)
    check_message: str
    backend: str
    gpu_uuid: str
    pool_bytes: int
    daemon_copies: int
    daemon_copy_blocks: int
    copy_errors: int
    queued_bytes: int = 0    # since libkvshare 0.5 (0 with an older one)
    indexed_blocks: int = 0  # since libkvshare 0.5
    tiers: Tuple[TierStats, ...] = ()
    tier_lost: int = 0
    swap: Optional[SwapStats] = None  # None: this library has no swap
    tenant: str = ""         # the session's tenant; "": none, or observer
    tenants: Tuple[TenantStats, ...] = ()  # empty: the daemon has none

    @property
    def check_ok(self):
        return self.check == 0

    def as_dict(self):
        """The same as plain dicts and lists (JSON-ready)."""
        import dataclasses
        return dataclasses.asdict(self)


def _struct_dict(s):
    out = {}
    for name, _ in s._fields_:
        v = getattr(s, name)
        out[name] = v.decode("utf-8", "replace") if isinstance(v, bytes) else v
    return out


# ---- arguments ----------------------------------------------------------------
def _req(x, what="req_id"):
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise TypeError(f"{what} must be an int, not {type(x).__name__}")
    x = int(x)
    if not 0 <= x <= _U64_MAX:
        raise ValueError(f"{what} {x} is not a 64-bit unsigned value")
    return x


def _u32(x, what):
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise TypeError(f"{what} must be an int, not {type(x).__name__}")
    x = int(x)
    if not 0 <= x <= _U32_MAX:
        raise ValueError(f"{what} {x} is out of range (0 .. 2**32-1)")
    return x


def as_u32_array(values, what="tokens"):
    """A C-contiguous uint32 numpy array of values (a list, tuple, range or
    numpy array of integers); no copy for a contiguous uint32 array.
    ValueError for values out of 0 .. 2**32-1, TypeError for non-integers."""
    if isinstance(values, np.ndarray):
        a = values
        if a.ndim != 1:
            raise ValueError(f"{what} must be one-dimensional, not {a.shape}")
        if a.dtype == np.uint32:
            return np.ascontiguousarray(a)
        if a.dtype.kind not in "iu":
            raise TypeError(f"{what} must be integers, not {a.dtype}")
    else:
        if isinstance(values, (str, bytes)):
            raise TypeError(f"{what} must be a sequence of ints")
        values = list(values)
        for v in values:
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise TypeError(f"{what} must be ints, not {type(v).__name__}")
        try:  # every value is an int: no silent truncation here
            a = np.array(values, dtype=np.int64)
        except OverflowError:
            raise ValueError(f"{what} out of range (0 .. 2**32-1)") from None
    if a.size and (a.min() < 0 or a.max() > _U32_MAX):
        raise ValueError(f"{what} out of range (0 .. 2**32-1)")
    return np.ascontiguousarray(a, dtype=np.uint32)


def _u32_ptr(a):
    return a.ctypes.data_as(ctypes.POINTER(c_uint32)) if a.size else None


def _blocks(ptr, n):
    return tuple(ptr[:n]) if n else ()


def _salt(salt):
    if salt is None:
        return None, 0
    if isinstance(salt, str):
        salt = salt.encode()
    salt = bytes(salt)
    return salt, len(salt)


def _alloc_result(r):
    cow = None
    if r.has_cow:
        cow = CowPair(r.cow_src, r.cow_dst, r.cow_index, r.has_cow == 2)
    return AllocResult(r.first_index, _blocks(r.blocks, r.num_blocks), cow)


def _commit_args(tokens, n, blocks):
    if tokens is not None:
        toks = as_u32_array(tokens)
        if n is not None and n != toks.size:
            raise ValueError(f"n={n} but {toks.size} tokens given")
        n = toks.size
    else:
        toks = None
        if n is None:
            raise TypeError("commit needs tokens or n")
    n = _u32(n, "n")
    blk = as_u32_array(blocks, "blocks") if blocks is not None else None
    return toks, n, blk


def _block_keys(engine_hashes, lora_name, extra_keys):
    """The engine's block keys of a commit as a kvs_block_keys (and what
    it points at, to keep alive), or None when none are given."""
    if engine_hashes is None:
        if lora_name is not None or extra_keys is not None:
            raise ValueError("lora_name and extra_keys go with engine_hashes")
        return None
    hs = list(engine_hashes)
    if not hs:
        raise ValueError("engine_hashes is empty")
    k = _lib.kvs_block_keys()
    k.nblocks = len(hs)
    keep = []
    if all(isinstance(h, (bytes, bytearray)) for h in hs):
        n = len(hs[0])
        if not 1 <= n <= 32 or any(len(h) != n for h in hs):
            raise ValueError("engine_hashes as bytes: 1 to 32 bytes each, "
                             "all the same length")
        buf = ctypes.create_string_buffer(b"".join(bytes(h) for h in hs))
        keep.append(buf)
        k.hash_bytes = ctypes.cast(buf, c_void_p)
        k.hash_len = n
    elif all(isinstance(h, int) and not isinstance(h, bool) for h in hs):
        if any(not 0 <= h < 2**64 for h in hs):
            raise ValueError("engine_hashes as integers: 0 to 2**64-1")
        arr = (c_uint64 * len(hs))(*hs)
        keep.append(arr)
        k.hashes = ctypes.cast(arr, ctypes.POINTER(c_uint64))
    else:
        raise TypeError("engine_hashes: all ints or all bytes")
    if lora_name is not None:
        k.lora_name = str(lora_name).encode()
        keep.append(k.lora_name)
    if extra_keys is not None:
        xs = [b"" if x is None else bytes(x) for x in extra_keys]
        if len(xs) != len(hs):
            raise ValueError(f"{len(xs)} extra_keys for {len(hs)} hashes")
        buf = ctypes.create_string_buffer(b"".join(xs) or b"\0")
        lens = (c_uint32 * len(xs))(*[len(x) for x in xs])
        keep += [buf, lens]
        k.extra = ctypes.cast(buf, c_void_p)
        k.extra_len = lens
    return k, keep


# ---- the connection ----------------------------------------------------------
def _close_native(addr):
    _lib.lib().kvs_close(c_void_p(addr))


class _Conn:
    """Owns one kvs_client *.  Referenced by the Client and by every view of
    the pool; kvs_close runs when the Client closes with no view alive, or
    else when the last of them goes (its unmapping must wait for them)."""

    __slots__ = ("ptr", "pid", "exports", "_finalizer", "__weakref__")

    def __init__(self, ptr):
        self.ptr = ptr
        self.pid = os.getpid()
        self.exports = weakref.WeakSet()
        self._finalizer = weakref.finalize(self, _close_native, ptr)
        # Not at interpreter exit: views may still be read by later exit
        # handlers, and kvs_close would unmap the pool under them (the
        # kernel closes the socket, and the daemon frees the session, when
        # the process ends).
        self._finalizer.atexit = False

    def close(self):
        self._finalizer()
        self.ptr = None


class Client:
    """A connection to kvshared: one session.

        with kvshare.Client() as c:          # $KVS_SOCKET or the default
            hit = c.lookup(1, prompt)

    socket      the daemon's Unix socket; None: $KVS_SOCKET, else the
                daemon's default ($XDG_RUNTIME_DIR/kvshare/kvshared.sock,
                else /run/kvshare/kvshared.sock), as kvs_connect(NULL, ...)
    name        shown in the daemon's logs (default "libkvshare")
    timeout_ms  per-call socket timeout; 0 waits forever.  A call that
                times out raises (EAGAIN) and leaves the client broken.
    no_map      do not map the pool (control-plane tools)

    Raises ConnectError (with the reason in .message) when it cannot
    connect.  Every method raises KvsError (or a subclass) on failure.
    A client is used by one thread at a time (the C library takes no lock);
    open one per thread.  A child process after os.fork() must connect
    anew (calls on the parent's client raise StateError there).
    """

    def __init__(self, socket=None, *, name=None, timeout_ms=0,
                 no_map=False):
        if not 0 <= int(timeout_ms) <= 2**31 - 1:
            raise ValueError(f"timeout_ms {timeout_ms} out of 0 .. 2**31-1")
        L = _lib.lib()
        opts = _lib.kvs_connect_opts(
            os.fsencode(name) if name is not None else None,
            int(timeout_ms), 1 if no_map else 0)
        out = c_void_p()
        path = os.fsencode(socket) if socket is not None else None
        rc = L.kvs_connect(path, byref(opts), byref(out))
        if rc:
            raise ConnectError(rc, _lib.text(L.kvs_last_message(None)),
                               op=f"connect {os.fsdecode(path) if path else '(default)'}")
        self._conn = _Conn(out.value)
        self._L = L
        lay = L.kvs_layout_of(self._conn.ptr).contents
        self.layout = Layout(lay.block_size, lay.num_layers, lay.num_kv_heads,
                             lay.head_dim, lay.dtype, lay.num_blocks,
                             lay.block_stride)
        p = self._conn.ptr
        self.backend = _lib.text(L.kvs_pool_backend(p))
        self.gpu_uuid = (_lib.text(L.kvs_pool_gpu_uuid(p))
                         if L.has("kvs_pool_gpu_uuid") else "")
        self.session_id = L.kvs_session_id(p)
        self.model_id = _lib.text(L.kvs_model_id(p))
        self.max_frame = L.kvs_max_frame(p)
        self.pool_size = L.kvs_pool_size(p)
        self.mapped = bool(L.kvs_pool_base(p))
        self._tenant = (_lib.text(L.kvs_tenant(p)) if L.has("kvs_tenant")
                        else "")
        self._cuda_ordinal = None

    # -- lifetime ---------------------------------------------------------------
    def close(self):
        """Close the connection: the daemon frees every request of the
        session.  Idempotent.  If numpy arrays or tensors of the pool are
        still alive, the pool stays mapped — and therefore the connection
        open, since libkvshare unmaps the pool when it closes the socket —
        until the last of them is released; the client is unusable at once
        either way, and a ResourceWarning says so.  Drop the views before
        closing when the session's requests must be released now."""
        conn, self._conn = getattr(self, "_conn", None), None
        if conn is None:
            return
        alive = len(conn.exports)
        if alive:  # (in a forked child too: its views share the mapping)
            if conn.pid == os.getpid():
                warnings.warn(
                    f"kvshare.Client.close(): {alive} view(s) of the pool "
                    "are still alive; the connection closes when the last "
                    "is released", ResourceWarning, stacklevel=2)
            return  # the last view's release runs kvs_close
        conn.close()

    @property
    def closed(self):
        return self._conn is None

    @property
    def tenant(self):
        """The session's tenant, as the daemon named it at connect: the
        tenant whose partition of the pool this session uses.  "" when the
        daemon has no tenants, and for an observer (a peer in no tenant,
        such as root: it must connect with no_map=True and may only ask
        for stats and ping)."""
        return self._tenant

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        # The _Conn's finalizer closes the native client once nothing (the
        # client, a view) refers to it; nothing to do here but drop it.
        self._conn = None

    def __repr__(self):
        state = "closed" if self.closed else f"session {self.session_id}"
        return (f"<kvshare.Client {state}, {self.backend} pool of "
                f"{self.layout.num_blocks} blocks>")

    def _p(self):
        conn = self._conn
        if conn is None:
            raise error_for(_lib.ECLOSED, "the client is closed")
        if conn.pid != os.getpid():
            raise error_for(_lib.ESTATE, "this client belongs to process "
                            f"{conn.pid}: a child must connect anew")
        return conn.ptr

    def _check(self, rc, op):
        if rc:
            msg = ""
            if self._conn is not None:
                msg = _lib.text(self._L.kvs_last_message(self._conn.ptr))
            raise error_for(rc, msg, op)

    def _fn(self, name, since):
        fn = getattr(self._L, name)
        if fn is None:
            raise error_for(_lib.ENOTSUP, f"{self._L.path} has no {name} "
                            f"(libkvshare older than {since})", name)
        return fn

    def fileno(self):
        """The socket's descriptor (to poll for the daemon going away)."""
        return self._L.kvs_fd(self._p())

    # -- operations, one round trip each -----------------------------------------
    def lookup(self, req_id, tokens, salt=None):
        """Longest cached prefix of tokens (whole blocks, never the last
        token).  Creates the request when new.  tokens: list or numpy array
        of uint32 token ids; salt: bytes/str (a tenant's cache salt)."""
        p = self._p()
        toks = as_u32_array(tokens)
        s, slen = _salt(salt)
        r = _lib.kvs_lookup_result()
        rc = self._L.kvs_lookup(p, _req(req_id), _u32_ptr(toks), toks.size,
                                s, slen, byref(r))
        self._check(rc, "lookup")
        return LookupResult(r.hit_tokens, _blocks(r.blocks, r.num_blocks))

    def allocate(self, req_id, num_tokens):
        """Slots for num_tokens more tokens (prefill)."""
        p = self._p()
        r = _lib.kvs_alloc_result()
        rc = self._L.kvs_allocate(p, _req(req_id), _u32(num_tokens, "num_tokens"),
                                  byref(r))
        self._check(rc, "allocate")
        return _alloc_result(r)

    def append(self, req_id, num_tokens=1):
        """Slots for num_tokens more tokens (decode; may use the reserve)."""
        p = self._p()
        r = _lib.kvs_alloc_result()
        rc = self._L.kvs_append(p, _req(req_id), _u32(num_tokens, "num_tokens"),
                                byref(r))
        self._check(rc, "append")
        return _alloc_result(r)

    def commit(self, req_id, start, tokens=None, *, n=None, blocks=None,
               engine_hashes=None, lora_name=None, extra_keys=None):
        """Positions [start, start+n) are written and hold tokens (n =
        len(tokens)); tokens None (give n) when the daemon knows them from
        the lookup's prompt.  blocks: the block ids written, checked by the
        daemon.  engine_hashes: the engine's own hash of each block this
        commit completes (ints, or bytes of one length up to 32), which the
        KV events publish instead of the daemon's; lora_name and extra_keys
        (one packed msgpack object or None per block) go with them.
        Returns how many full blocks this commit sealed."""
        p = self._p()
        toks, n, blk = _commit_args(tokens, n, blocks)
        keys = _block_keys(engine_hashes, lora_name, extra_keys)
        sealed = c_uint32(0)
        rc = self._L.kvs_commit_keys(
            p, _req(req_id), _u32(start, "start"),
            _u32_ptr(toks) if toks is not None else None, n,
            _u32_ptr(blk) if blk is not None else None,
            blk.size if blk is not None else 0,
            byref(keys[0]) if keys else None, byref(sealed))
        self._check(rc, "commit")
        return sealed.value

    def fork(self, req_id, child_id):
        """A new request child_id sharing every block of req_id (CoW)."""
        self._check(self._L.kvs_fork(self._p(), _req(req_id),
                                     _req(child_id, "child_id")), "fork")

    def free(self, req_id):
        """Release every block of req_id and forget it."""
        self._check(self._L.kvs_free(self._p(), _req(req_id)), "free")

    def preempt(self, req_id):
        """Release every block of req_id; the request stays."""
        self._check(self._L.kvs_preempt(self._p(), _req(req_id)), "preempt")

    def ping(self, payload=b""):
        """An echo round trip carrying payload (bytes); checks the echo."""
        p = self._p()
        payload = bytes(payload)
        self._check(self._L.kvs_ping(p, payload or None, len(payload)), "ping")

    def stats(self, check=False):
        """The daemon's counters; check=True also runs the pool invariant
        check (its result in .check / .check_message, .check_ok).  Includes
        the tiers below the pool, the swap counters and the tenants (one
        round trip each, when the library has them): .tenant is the
        session's, .tenants the lines it may see (its own tenant's, or
        every tenant's for an observer; empty without tenants)."""
        p = self._p()
        st = _lib.kvs_stats()
        self._check(self._L.kvs_stats_get(p, 1 if check else 0, byref(st)),
                    "stats")
        d = _struct_dict(st)
        tiers, lost, swap = (), 0, None
        if self._L.has("kvs_tier_stats_get"):
            tiers, lost = self.tier_stats()
        if self._L.has("kvs_swap_stats_get"):
            swap = self.swap_stats()
        tenants = ()
        if self._L.has("kvs_tenant_stats_get"):
            tenants = self.tenant_stats()
        return Stats(**d, tiers=tiers, tier_lost=lost, swap=swap,
                     tenant=self.tenant, tenants=tenants)

    def tier_stats(self):
        """(tuple of TierStats top first, tier_lost): the tiers below the
        pool (empty: none) and cached blocks evicted with no copy below."""
        fn = self._fn("kvs_tier_stats_get", "0.3")
        p = self._p()
        arr = (_lib.kvs_tier_stats * 8)()
        n, lost = c_uint32(0), c_uint64(0)
        self._check(fn(p, arr, 8, byref(n), byref(lost)), "tier_stats")
        return (tuple(TierStats(**_struct_dict(arr[i]))
                      for i in range(min(n.value, 8))), lost.value)

    def tenant_stats(self):
        """Tuple of TenantStats: one per tenant this session may see (its
        own, or every tenant for an observer), in the daemon's order;
        empty when the daemon has no tenants."""
        fn = self._fn("kvs_tenant_stats_get", "0.8")
        p = self._p()
        cap = 16  # a daemon's most; asked again when it has more
        while True:
            arr = (_lib.kvs_tenant_stats * cap)()
            n = c_uint32(0)
            self._check(fn(p, arr, cap, byref(n)), "tenant_stats")
            if n.value <= cap:
                return tuple(TenantStats(**_struct_dict(arr[i]))
                             for i in range(n.value))
            cap = n.value

    def swap_stats(self):
        fn = self._fn("kvs_swap_stats_get", "0.4")
        p = self._p()
        st = _lib.kvs_swap_stats()
        self._check(fn(p, byref(st)), "swap_stats")
        return SwapStats(**_struct_dict(st))

    def swap_out(self, req_id):
        """Send req_id's blocks below the pool (needs a tier); the request
        then takes only swap_in and free."""
        fn = self._fn("kvs_swap_out", "0.4")
        p = self._p()
        r = _lib.kvs_swap_result()
        self._check(fn(p, _req(req_id), byref(r)), "swap_out")
        return SwapResult(r.tokens, r.lost_tokens, r.copied_blocks, ())

    def swap_in(self, req_id):
        """Bring a swapped-out request back; .blocks is its block table,
        .lost_tokens those to compute again."""
        fn = self._fn("kvs_swap_in", "0.4")
        p = self._p()
        r = _lib.kvs_swap_result()
        self._check(fn(p, _req(req_id), byref(r)), "swap_in")
        return SwapResult(r.tokens, r.lost_tokens, r.copied_blocks,
                          _blocks(r.blocks, r.num_blocks))

    def set_promote(self, on):
        """Whether this session's lookups wait for blocks coming up from the
        tiers (default on)."""
        fn = self._fn("kvs_set_promote", "0.3")
        self._check(fn(self._p(), 1 if on else 0), "set_promote")

    def set_daemon_copy(self, on):
        """Ask the daemon to make this client's copy-on-write copies."""
        fn = self._fn("kvs_set_daemon_copy", "0.2")
        self._check(fn(self._p(), 1 if on else 0), "set_daemon_copy")

    def copy_blocks(self, pairs, stream=None):
        """Copy block src into dst for each (src, dst) in pairs, in this
        process (memcpy on a host pool; device copies on `stream`, an int
        CUstream or None for the legacy default, on a cuda pool)."""
        fn = self._fn("kvs_copy_blocks", "0.2")
        p = self._p()
        flat = []
        for pair in pairs:
            src, dst = pair
            flat += [src, dst]
        a = as_u32_array(flat, "pairs")
        self._check(fn(p, _u32_ptr(a), a.size // 2,
                       c_void_p(stream) if stream else None), "copy_blocks")

    def batch(self):
        """A Batch: many ops, one round trip.  As a context manager it
        submits on a normal exit."""
        from .batch import Batch
        return Batch(self)

    # -- views of the pool ----------------------------------------------------------
    def _mapped_ptr(self, ptr, what):
        if not ptr:
            raise error_for(_lib.EINVAL if self.mapped else _lib.ESTATE,
                            "block out of range" if self.mapped else
                            "the pool is not mapped (no_map)", what)
        return ptr

    def _check_host(self, what):
        self._p()
        if self.backend != "host":
            raise error_for(
                _lib.ENOTSUP,
                f"the pool is on {self.gpu_uuid or self.backend} (device "
                "memory the CPU cannot read): use block_tensor() / "
                "plane_tensor() / pool_tensor() for "
                "__cuda_array_interface__ or DLPack", what)

    def _device(self):
        if self.backend != "cuda":
            return ("cpu", 0)
        if self._cuda_ordinal is None:
            from .cuda import device_ordinal
            self._cuda_ordinal = device_ordinal(self.gpu_uuid)
        return ("cuda", self._cuda_ordinal)

    def _export(self, ptr, shape, strides=None, dtype=None):
        dtype = self.layout.dtype if dtype is None else dtype
        if dtype not in NUMPY_DTYPES:
            raise error_for(_lib.ENOTSUP, f"kvs_dtype {dtype} has no tensor "
                            "views in this binding", "views")
        conn = self._conn
        t = PoolTensor(ptr, shape, dtype, strides, self._device(), owner=conn)
        conn.exports.add(t)
        return t

    def _check_block(self, b):
        b = _u32(b, "block")
        if b >= self.layout.num_blocks:
            raise error_for(_lib.ERANGE, f"block {b} out of range (pool of "
                            f"{self.layout.num_blocks})", "block")
        return b

    def _check_plane(self, layer, kv, what):
        layer, kv = _u32(layer, "layer"), _u32(kv, "kv")
        if layer >= self.layout.num_layers or kv > 1:
            raise error_for(_lib.ERANGE, f"layer {layer} / kv {kv} out of "
                            f"range ({self.layout.num_layers} layers, kv 0 "
                            "or 1)", what)
        return layer, kv

    def _check_quantized(self, what):
        """The layout, when the pool has scales (NotSupportedError else)."""
        L = self.layout
        if not L.quantized:
            raise error_for(_lib.ENOTSUP, f"a {L.dtype_name} pool has no "
                            "scales (only int8 and fp8 pools do)", what)
        return L

    def _block_strides(self, elem_strides, itemsize):
        """Strides of [layers][2] + a plane's inner shape, in bytes."""
        pb = self.layout.plane_bytes
        return (2 * pb, pb) + tuple(s * itemsize for s in elem_strides)

    def _inner_strides(self, shape):
        out, s = [], 1
        for d in reversed(shape):
            out.append(s)
            s *= d
        return tuple(reversed(out))

    def block_tensor(self, b):
        """Block b as a PoolTensor [layers][2][block_size][heads][head_dim]
        (host or cuda; DLPack, array interfaces; no copy).  int8/fp8: the
        bytes (uint8), strided (each plane's scales lie between its bytes
        and the next plane's: scales_tensor(b))."""
        p = self._p()
        b = self._check_block(b)
        ptr = self._mapped_ptr(self._L.kvs_block_ptr(p, b), "block_tensor")
        L = self.layout
        strides = None
        if L.quantized:
            strides = self._block_strides(self._inner_strides(L.plane_shape), 1)
        return self._export(ptr, L.block_shape, strides)

    def plane_tensor(self, b, layer, kv):
        """Layer `layer`'s K (kv=0) or V (kv=1) plane of block b as a
        PoolTensor [block_size][heads][head_dim] (int8/fp8: its bytes,
        uint8; the scales: scales_tensor)."""
        p = self._p()
        b = self._check_block(b)
        layer, kv = self._check_plane(layer, kv, "plane_tensor")
        ptr = self._mapped_ptr(self._L.kvs_plane_ptr(p, b, layer, kv),
                               "plane_tensor")
        return self._export(ptr, self.layout.plane_shape)

    def scales_tensor(self, b, layer=None, kv=None):
        """An int8/fp8 pool's row parameters, float32, no copy (writable):
        of one plane, int8 [block_size][heads][2] ([scale, min] per token
        and kv head), fp8 [block_size][heads] (the scale); with layer and
        kv None, of the whole block: [layers][2] + that (strided).
        NotSupportedError on an fp32/fp16/bf16 pool (it has none)."""
        p = self._p()
        L = self._check_quantized("scales_tensor")
        b = self._check_block(b)
        if (layer is None) != (kv is None):
            raise TypeError("scales_tensor: give both layer and kv, or "
                            "neither (the whole block)")
        if layer is None:
            ptr = self._mapped_ptr(self._L.kvs_block_ptr(p, b),
                                   "scales_tensor")
            shape = L.scales_shape
            strides = self._block_strides(self._inner_strides(shape), 4)
            return self._export(ptr + L.scale_offset, (L.num_layers, 2) + shape,
                                strides, _lib.DTYPE_FP32)
        layer, kv = self._check_plane(layer, kv, "scales_tensor")
        ptr = self._mapped_ptr(self._L.kvs_plane_ptr(p, b, layer, kv),
                               "scales_tensor")
        return self._export(ptr + L.scale_offset, L.scales_shape, None,
                            _lib.DTYPE_FP32)

    def pool_tensor(self):
        """The whole pool as a strided PoolTensor [num_blocks][layers][2]
        [block_size][heads][head_dim] (block axis stride: block_stride;
        int8/fp8: the bytes, the planes' strides skipping their scales)."""
        p = self._p()
        ptr = self._mapped_ptr(self._L.kvs_pool_base(p), "pool_tensor")
        L = self.layout
        isz = _lib.DTYPES[L.dtype][1]
        shape = (L.num_blocks,) + L.block_shape
        strides = (L.block_stride,) + self._block_strides(
            self._inner_strides(L.plane_shape), isz)
        return self._export(ptr, shape, strides)

    def pool_scales_tensor(self):
        """An int8/fp8 pool's row parameters for every block, float32, no
        copy: [num_blocks][layers][2] + layout.scales_shape, strided (block
        axis stride: block_stride).  NotSupportedError on an fp32/fp16/bf16
        pool."""
        p = self._p()
        L = self._check_quantized("pool_scales_tensor")
        ptr = self._mapped_ptr(self._L.kvs_pool_base(p), "pool_scales_tensor")
        shape = L.scales_shape
        strides = (L.block_stride,) + self._block_strides(
            self._inner_strides(shape), 4)
        return self._export(ptr + L.scale_offset,
                            (L.num_blocks, L.num_layers, 2) + shape, strides,
                            _lib.DTYPE_FP32)

    def block_array(self, b):
        """Block b as a writable numpy array (host pool), no copy:
        [num_layers][2][block_size][num_kv_heads][head_dim], dtype float32,
        float16, uint16 holding bf16 bits, or uint8 (int8/fp8 bytes,
        strided).  NotSupportedError on a cuda pool (use block_tensor)."""
        self._check_host("block_array")
        return np.asarray(self.block_tensor(b))

    def plane_array(self, b, layer, kv):
        """One K (kv=0) or V (kv=1) plane: [block_size][heads][head_dim]."""
        self._check_host("plane_array")
        return np.asarray(self.plane_tensor(b, layer, kv))

    def scales_array(self, b, layer=None, kv=None):
        """scales_tensor as a writable numpy array (host pool), no copy."""
        self._check_host("scales_array")
        return np.asarray(self.scales_tensor(b, layer, kv))

    def pool_array(self):
        """The whole pool: [num_blocks][layers][2][block_size][heads]
        [head_dim], strided by block_stride (no copy)."""
        self._check_host("pool_array")
        return np.asarray(self.pool_tensor())

    def _as_float32(self, data, scales, torch):
        L = self.layout
        if L.quantized:
            out = dequantize(data, scales, L.dtype)
        elif L.dtype == _lib.DTYPE_BF16:
            out = bf16_to_float32(data)
        else:
            out = np.array(data, dtype=np.float32)
        if torch:
            from .views import to_torch
            return to_torch(out)
        return out

    def dequantize_plane(self, b, layer, kv, torch=False):
        """The float32 values of one K (kv=0) or V (kv=1) plane of a host
        pool, [block_size][heads][head_dim], a copy: int8 byte * scale +
        min rotated back (kvshare.hadamard), fp8 e4m3(byte) * scale
        (kvshare.dequantize), and for an
        fp32/fp16/bf16 pool its values as float32.  torch=True: a torch
        tensor instead (ImportError without PyTorch)."""
        self._check_host("dequantize_plane")
        data = self.plane_array(b, layer, kv)
        scales = (self.scales_array(b, layer, kv) if self.layout.quantized
                  else None)
        return self._as_float32(data, scales, torch)

    def dequantize_block(self, b, torch=False):
        """The float32 values of block b (host pool), [layers][2]
        [block_size][heads][head_dim], a copy (as dequantize_plane)."""
        self._check_host("dequantize_block")
        data = self.block_array(b)
        scales = self.scales_array(b) if self.layout.quantized else None
        return self._as_float32(data, scales, torch)

    @property
    def views_alive(self):
        """How many views (arrays, tensors, DLPack exports) of the pool are
        alive (each keeps the mapping; see close())."""
        return 0 if self._conn is None else len(self._conn.exports)
