"""kvshare: Python binding of libkvshare, the client library of the kvshare
KV-cache service (ctypes over libkvshare.so.0; docs/python.md).

    import kvshare
    with kvshare.Client("/run/kvshare/kvshared.sock") as c:
        hit = c.lookup(1, prompt_tokens)
        a = c.allocate(1, len(prompt_tokens) - hit.hit_tokens)
        for b in a.blocks:
            kv = c.block_array(b)   # numpy view of the block, no copy
            ...
        c.commit(1, hit.hit_tokens, n=len(prompt_tokens) - hit.hit_tokens)
        c.free(1)
"""
from . import _lib
from ._lib import (BLOCK_NONE, DTYPE_BF16, DTYPE_FP16, DTYPE_FP32, DTYPE_FP8,
                   DTYPE_INT8)
from .batch import Batch, Op
from .client import (AllocResult, Client, CowPair, Layout, LookupResult,
                     Stats, SwapResult, SwapStats, TenantStats, TierStats,
                     as_u32_array)
from .errors import (ConnectError, ConnectionClosedError, KvsError,
                     LimitError, MismatchError, NoSpaceError,
                     NotSupportedError, RequestExistsError, StateError,
                     UnknownRequestError, status_name, strerror)
from .views import (FP8_E4M3_TABLE, PoolTensor, bf16_to_float32, dequantize,
                    dlpack_live_count, float32_to_bf16, fp8_e4m3_to_float32,
                    hadamard, to_torch)

__version__ = "0.1.0"  # the project's version (client/module.mk KVS_VERSION)

# The status codes, as kvshare.ENOSPC etc.
for _n in ("OK", "EINVAL", "ENOSPC", "ENOENT", "EEXIST", "ERANGE",
           "EMISMATCH", "ESTATE", "ENOMEM", "EPROTO", "EVERSION", "ETOOBIG",
           "EUNKNOWN", "EPERM", "ELIMIT", "ECLOSED", "EINTERNAL", "ENOTSUP",
           "EIO", "ENODEV", "EDEVICE", "ECHECKSUM"):
    globals()[_n] = getattr(_lib, _n)
del _n


def library_version():
    """kvs_version() of the libkvshare actually loaded ("0.1.0")."""
    return _lib.text(_lib.lib().kvs_version())


def library_path():
    """What was loaded: $KVS_LIBRARY, or "libkvshare.so.0" found by the
    dynamic linker."""
    return _lib.lib().path


__all__ = [
    "AllocResult", "Batch", "BLOCK_NONE", "Client", "ConnectError",
    "ConnectionClosedError", "CowPair", "DTYPE_BF16", "DTYPE_FP16",
    "DTYPE_FP32", "DTYPE_FP8", "DTYPE_INT8", "KvsError", "Layout",
    "LimitError", "LookupResult",
    "MismatchError", "NoSpaceError", "NotSupportedError", "Op", "PoolTensor",
    "RequestExistsError", "StateError", "Stats", "SwapResult", "SwapStats",
    "TenantStats", "TierStats", "UnknownRequestError", "as_u32_array",
    "FP8_E4M3_TABLE", "bf16_to_float32", "dequantize", "dlpack_live_count",
    "float32_to_bf16", "fp8_e4m3_to_float32", "hadamard", "to_torch",
    "library_path", "library_version", "status_name", "strerror",
]
