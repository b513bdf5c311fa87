"""ctypes declarations of libkvshare's public C API (client/kvshare.h).

Loads libkvshare.so.0 once per process: $KVS_LIBRARY when set (a path),
else the dynamic linker's search (LD_LIBRARY_PATH, the ld.so cache, which
holds /usr/local/lib after `make install` and `ldconfig`).

The structs below mirror kvshare.h field for field; their sizes are checked
against the C layout rules by the tests (and the values against the CLI's
JSON).  Functions added in a later library version (0.3: tiers, 0.4: swap,
0.8: tenants) are resolved when first used, so an older library still
loads and only those calls fail (NotSupportedError).
"""
import ctypes
import os
import threading
from ctypes import (POINTER, Structure, c_char, c_char_p, c_int, c_int32,
                    c_size_t, c_uint8, c_uint32, c_uint64, c_void_p)

# ---- status codes (kvs_status.h; part of the wire format, never renumbered)
OK = 0
EINVAL = -4001
ENOSPC = -4002
ENOENT = -4003
EEXIST = -4004
ERANGE = -4005
EMISMATCH = -4006
ESTATE = -4007
ENOMEM = -4008
EPROTO = -4009
EVERSION = -4010
ETOOBIG = -4011
EUNKNOWN = -4012
EPERM = -4013
ELIMIT = -4014
ECLOSED = -4015
EINTERNAL = -4016
ENOTSUP = -4017
EIO = -4018
ENODEV = -4019
EDEVICE = -4020
ECHECKSUM = -4021

# kvs_layout.h's dtypes: value -> (name, element size)
DTYPE_FP32 = 0
DTYPE_FP16 = 1
DTYPE_BF16 = 2
DTYPE_INT8 = 3     # quantized: 1 byte per element + float32 scales per
DTYPE_FP8 = 4      # (token, kv head) inside each plane (docs/kernels.md)
DTYPES = {DTYPE_FP32: ("fp32", 4), DTYPE_FP16: ("fp16", 2),
          DTYPE_BF16: ("bf16", 2), DTYPE_INT8: ("int8", 1),
          DTYPE_FP8: ("fp8", 1)}
# kvs_scale_floats: float32 per (token, kv head) of a quantized plane (int8:
# the scale and the row's minimum; fp8: the scale)
SCALE_FLOATS = {DTYPE_INT8: 2, DTYPE_FP8: 1}
BLOCK_NONE = 0xFFFFFFFF


class kvs_layout(Structure):
    _fields_ = [("block_size", c_uint32), ("num_layers", c_uint32),
                ("num_kv_heads", c_uint32), ("head_dim", c_uint32),
                ("dtype", c_uint32), ("num_blocks", c_uint32),
                ("block_stride", c_uint64)]


class kvs_connect_opts(Structure):
    _fields_ = [("client_name", c_char_p), ("timeout_ms", c_int),
                ("no_map", c_int)]


class kvs_lookup_result(Structure):
    _fields_ = [("hit_tokens", c_uint32), ("num_blocks", c_uint32),
                ("blocks", POINTER(c_uint32))]


class kvs_alloc_result(Structure):
    _fields_ = [("first_index", c_uint32), ("num_blocks", c_uint32),
                ("blocks", POINTER(c_uint32)), ("has_cow", c_int),
                ("cow_src", c_uint32), ("cow_dst", c_uint32),
                ("cow_index", c_uint32)]


class kvs_stats(Structure):
    _fields_ = [("num_blocks", c_uint32), ("free_blocks", c_uint32),
                ("cached_blocks", c_uint32), ("used_blocks", c_uint32),
                ("num_requests", c_uint32), ("sessions", c_uint32),
                ("lookups", c_uint64), ("query_tokens", c_uint64),
                ("hit_tokens", c_uint64), ("hit_blocks", c_uint64),
                ("miss_blocks", c_uint64), ("allocated_blocks", c_uint64),
                ("evictions", c_uint64), ("cow_copies", c_uint64),
                ("sealed_blocks", c_uint64), ("no_space", c_uint64),
                ("frames_in", c_uint64), ("protocol_errors", c_uint64),
                ("check", c_int32), ("check_message", c_char * 256),
                # since 0.2
                ("backend", c_char * 16), ("gpu_uuid", c_char * 64),
                ("pool_bytes", c_uint64), ("daemon_copies", c_uint64),
                ("daemon_copy_blocks", c_uint64), ("copy_errors", c_uint64),
                # since 0.5
                ("queued_bytes", c_uint64), ("indexed_blocks", c_uint32)]


class kvs_tier_stats(Structure):
    _fields_ = [("name", c_char * 16), ("capacity_bytes", c_uint64),
                ("slots", c_uint32), ("used", c_uint32),
                ("demotions", c_uint64), ("promotions", c_uint64),
                ("hit_blocks", c_uint64), ("drops", c_uint64),
                ("failures", c_uint64), ("bytes_in", c_uint64),
                ("bytes_out", c_uint64), ("io_errors", c_uint64),
                ("checksum_failures", c_uint64)]


class kvs_tenant_stats(Structure):
    _fields_ = [("name", c_char * 32), ("num_blocks", c_uint32),
                ("free_blocks", c_uint32), ("cached_blocks", c_uint32),
                ("used_blocks", c_uint32), ("num_requests", c_uint32),
                ("sessions", c_uint32), ("lookups", c_uint64),
                ("query_tokens", c_uint64), ("hit_tokens", c_uint64),
                ("evictions", c_uint64), ("no_space", c_uint64),
                ("pool_bytes", c_uint64)]


class kvs_swap_result(Structure):
    _fields_ = [("tokens", c_uint32), ("lost_tokens", c_uint32),
                ("copied_blocks", c_uint32), ("num_blocks", c_uint32),
                ("blocks", POINTER(c_uint32))]


class kvs_swap_stats(Structure):
    _fields_ = [("swapped_requests", c_uint32), ("held_slots", c_uint32),
                ("swap_outs", c_uint64), ("swap_ins", c_uint64),
                ("failures", c_uint64), ("out_blocks", c_uint64),
                ("kept_blocks", c_uint64), ("in_blocks", c_uint64),
                ("resident_blocks", c_uint64)]


class kvs_block_keys(Structure):
    _fields_ = [("nblocks", c_uint32), ("hashes", POINTER(c_uint64)),
                ("hash_bytes", c_void_p), ("hash_len", c_uint32),
                ("lora_name", c_char_p), ("extra", c_void_p),
                ("extra_len", POINTER(c_uint32))]


# ---- kvs_kernels.h: the kernels' arguments (kvshare.torch calls them)
class kvs_paged_kv(Structure):
    _fields_ = [("base", c_void_p), ("block_stride", c_uint64),
                ("k_offset", c_uint64), ("v_offset", c_uint64),
                ("token_stride", c_uint64), ("head_stride", c_uint64),
                ("block_size", c_uint32), ("num_kv_heads", c_uint32),
                ("head_dim", c_uint32), ("dtype", c_uint32),
                ("num_blocks", c_uint32), ("scale_offset", c_uint32)]


class kvs_write_args(Structure):
    _fields_ = [("kv", kvs_paged_kv), ("k", c_void_p), ("v", c_void_p),
                ("slots", c_void_p), ("src_token_stride", c_uint64),
                ("src_dtype", c_uint32), ("num_tokens", c_uint32)]


class kvs_attn_args(Structure):
    _fields_ = [("kv", kvs_paged_kv), ("out", c_void_p), ("q", c_void_p),
                ("seq_lens", c_void_p), ("q_start", c_void_p),
                ("block_tables", c_void_p), ("workspace", c_void_p),
                ("workspace_bytes", c_uint64), ("num_seqs", c_uint32),
                ("num_rows", c_uint32), ("num_heads", c_uint32),
                ("max_blocks_per_seq", c_uint32), ("max_seq_len", c_uint32),
                ("qo_dtype", c_uint32), ("scale", ctypes.c_float),
                ("reserved_", c_uint32)]


_u32p = POINTER(c_uint32)
_client = c_void_p  # kvs_client *
_batch = c_void_p   # kvs_batch *

# name -> (restype, argtypes).  Every int function returns 0 or a status.
_FUNCS = {
    "kvs_version": (c_char_p, []),
    "kvs_strerror": (c_char_p, [c_int]),
    "kvs_status_name": (c_char_p, [c_int]),
    "kvs_connect": (c_int, [c_char_p, POINTER(kvs_connect_opts),
                            POINTER(c_void_p)]),
    "kvs_close": (None, [_client]),
    "kvs_layout_of": (POINTER(kvs_layout), [_client]),
    "kvs_pool_base": (c_void_p, [_client]),
    "kvs_pool_size": (c_uint64, [_client]),
    "kvs_pool_backend": (c_char_p, [_client]),
    "kvs_pool_gpu_uuid": (c_char_p, [_client]),
    "kvs_session_id": (c_uint64, [_client]),
    "kvs_model_id": (c_char_p, [_client]),
    "kvs_max_frame": (c_uint32, [_client]),
    "kvs_fd": (c_int, [_client]),
    "kvs_last_message": (c_char_p, [_client]),
    "kvs_block_ptr": (c_void_p, [_client, c_uint32]),
    "kvs_plane_ptr": (c_void_p, [_client, c_uint32, c_uint32, c_uint32]),
    "kvs_lookup": (c_int, [_client, c_uint64, _u32p, c_uint32, c_void_p,
                           c_size_t, POINTER(kvs_lookup_result)]),
    "kvs_allocate": (c_int, [_client, c_uint64, c_uint32,
                             POINTER(kvs_alloc_result)]),
    "kvs_append": (c_int, [_client, c_uint64, c_uint32,
                           POINTER(kvs_alloc_result)]),
    "kvs_commit": (c_int, [_client, c_uint64, c_uint32, _u32p, c_uint32,
                           _u32p, c_uint32, _u32p]),
    "kvs_commit_keys": (c_int, [_client, c_uint64, c_uint32, _u32p, c_uint32,
                                _u32p, c_uint32, POINTER(kvs_block_keys),
                                _u32p]),
    "kvs_fork": (c_int, [_client, c_uint64, c_uint64]),
    "kvs_free": (c_int, [_client, c_uint64]),
    "kvs_preempt": (c_int, [_client, c_uint64]),
    "kvs_stats_get": (c_int, [_client, c_int, POINTER(kvs_stats)]),
    "kvs_ping": (c_int, [_client, c_void_p, c_size_t]),
    "kvs_copy_blocks": (c_int, [_client, _u32p, c_uint32, c_void_p]),
    "kvs_set_daemon_copy": (c_int, [_client, c_int]),
    "kvs_tier_stats_get": (c_int, [_client, POINTER(kvs_tier_stats),
                                   c_uint32, _u32p, POINTER(c_uint64)]),
    "kvs_set_promote": (c_int, [_client, c_int]),
    "kvs_swap_out": (c_int, [_client, c_uint64, POINTER(kvs_swap_result)]),
    "kvs_swap_in": (c_int, [_client, c_uint64, POINTER(kvs_swap_result)]),
    "kvs_swap_stats_get": (c_int, [_client, POINTER(kvs_swap_stats)]),
    "kvs_tenant": (c_char_p, [_client]),
    "kvs_tenant_stats_get": (c_int, [_client, POINTER(kvs_tenant_stats),
                                     c_uint32, _u32p]),
    "kvs_batch_new": (c_int, [POINTER(c_void_p)]),
    "kvs_batch_free": (None, [_batch]),
    "kvs_batch_reset": (None, [_batch]),
    "kvs_batch_count": (c_uint32, [_batch]),
    "kvs_batch_lookup": (c_int, [_batch, c_uint64, _u32p, c_uint32,
                                 c_void_p, c_size_t]),
    "kvs_batch_allocate": (c_int, [_batch, c_uint64, c_uint32]),
    "kvs_batch_append": (c_int, [_batch, c_uint64, c_uint32]),
    "kvs_batch_commit": (c_int, [_batch, c_uint64, c_uint32, _u32p,
                                 c_uint32, _u32p, c_uint32]),
    "kvs_batch_commit_keys": (c_int, [_batch, c_uint64, c_uint32, _u32p,
                                      c_uint32, _u32p, c_uint32,
                                      POINTER(kvs_block_keys)]),
    "kvs_batch_fork": (c_int, [_batch, c_uint64, c_uint64]),
    "kvs_batch_free_req": (c_int, [_batch, c_uint64]),
    "kvs_batch_preempt": (c_int, [_batch, c_uint64]),
    "kvs_batch_ping": (c_int, [_batch, c_void_p, c_size_t]),
    "kvs_batch_submit": (c_int, [_client, _batch]),
    "kvs_batch_status": (c_int, [_batch, c_uint32]),
    "kvs_batch_message": (c_char_p, [_batch, c_uint32]),
    "kvs_batch_lookup_result": (c_int, [_batch, c_uint32,
                                        POINTER(kvs_lookup_result)]),
    "kvs_batch_alloc_result": (c_int, [_batch, c_uint32,
                                       POINTER(kvs_alloc_result)]),
    "kvs_batch_commit_result": (c_int, [_batch, c_uint32, _u32p]),
    # kvs_kernels.h (device pointers travel as void *)
    "kvs_paged_kv_of": (c_int, [_client, c_uint32, POINTER(kvs_paged_kv)]),
    "kvs_attn_workspace_bytes": (c_uint64, [POINTER(kvs_attn_args)]),
    "kvs_cpu_write_kv": (c_int, [POINTER(kvs_write_args), c_void_p]),
    "kvs_cpu_decode_attention": (c_int, [POINTER(kvs_attn_args), c_void_p]),
    "kvs_cpu_prefill_attention": (c_int, [POINTER(kvs_attn_args), c_void_p]),
    "kvs_cuda_write_kv": (c_int, [POINTER(kvs_write_args), c_void_p]),
    "kvs_cuda_decode_attention": (c_int, [POINTER(kvs_attn_args), c_void_p]),
    "kvs_cuda_prefill_attention": (c_int, [POINTER(kvs_attn_args), c_void_p]),
    "kvs_cuda_open": (c_int, [c_char_p]),
    "kvs_cuda_available": (c_int, [POINTER(c_char_p)]),
    "kvs_cuda_device_uuid": (c_char_p, []),
    "kvs_cuda_memcpy_htod": (c_int, [c_void_p, c_void_p, c_size_t]),
    "kvs_cuda_memcpy_dtoh": (c_int, [c_void_p, c_void_p, c_size_t]),
    "kvs_cuda_sync": (c_int, [c_void_p]),
}


class _Lib:
    """The loaded library; attributes are its functions, typed on first use.
    A function this library lacks is None (see has())."""

    def __init__(self, dll, path):
        self._dll = dll
        self.path = path

    def has(self, name):
        return getattr(self, name) is not None

    def __getattr__(self, name):
        if name not in _FUNCS:
            raise AttributeError(name)
        try:
            fn = getattr(self._dll, name)
        except AttributeError:
            fn = None
        else:
            fn.restype, fn.argtypes = _FUNCS[name]
        self.__dict__[name] = fn
        return fn


_lock = threading.Lock()
_lib = None


def lib():
    """The process's libkvshare, loaded on first use."""
    global _lib
    if _lib is None:
        with _lock:
            if _lib is None:
                path = os.environ.get("KVS_LIBRARY") or "libkvshare.so.0"
                try:
                    dll = ctypes.CDLL(path)
                except OSError as e:
                    raise OSError(
                        f"kvshare: cannot load {path}: {e} (install libkvshare "
                        "with `make install` and run ldconfig, or point "
                        "$KVS_LIBRARY at libkvshare.so.0)") from e
                _lib = _Lib(dll, path)
    return _lib


def text(b):
    """A C string from the library as str ('' for NULL)."""
    return b.decode("utf-8", "replace") if b else ""
