"""A cuda pool, through the stand-in CUDA driver (tests/standin/: "device"
memory is memfd-backed, so this runs without a GPU).  The test script sets
KVS_CUDA_DRIVER for the whole run (libkvshare reads it when it first loads
the driver).  Checks: the numpy views refuse with a clear error; the
tensors' __cuda_array_interface__ and DLPack describe the block's device
memory; bytes copied into a block through the interface's pointer by one
client come back, through another client's interface pointer, byte for
byte, read with libkvshare's device copies (the device path, not a CPU
read of device memory)."""
import ctypes
import os

import numpy as np
import pytest

import kvshare
import kvshare.cuda
from conftest import SMALL_LAYOUT

STANDIN = os.environ.get("KVS_CUDA_DRIVER", "")
pytestmark = pytest.mark.skipif(
    "standin" not in os.path.basename(STANDIN) or not os.path.exists(STANDIN),
    reason="KVS_CUDA_DRIVER does not name the stand-in driver "
           "(tests/integration/test_python.sh sets it)")


def test_cuda_pool_views(daemon_factory):
    d = daemon_factory(SMALL_LAYOUT + ["--backend", "cuda", "--dtype", "fp16"],
                       env={"KVS_CUDA_DRIVER": STANDIN})
    with kvshare.Client(d.socket) as w, kvshare.Client(d.socket) as r:
        assert w.backend == "cuda" and w.gpu_uuid.startswith("GPU-")
        L = w.layout
        with pytest.raises(kvshare.NotSupportedError) as ei:
            w.block_array(0)
        assert ei.value.status == kvshare.ENOTSUP
        assert w.gpu_uuid in ei.value.message and "block_tensor" in ei.value.message
        toks = list(range(900, 900 + L.block_size + 1))
        w.lookup(1, toks)
        a = w.allocate(1, len(toks))
        t = w.block_tensor(a.blocks[0])
        assert t.device == ("cuda", 0)  # the stand-in's one device
        assert not hasattr(t, "__array_interface__")
        cai = t.__cuda_array_interface__
        assert cai["version"] == 3 and cai["shape"] == L.block_shape
        assert cai["typestr"] == "<f2" and cai["strides"] is None
        assert cai["stream"] is None and cai["data"][1] is False
        assert t.__dlpack_device__() == (2, 0)
        want = (np.arange(np.prod(L.block_shape)) % 97).astype(np.float16)
        kvshare.cuda.memcpy_htod(cai["data"][0], want)
        # A plane tensor sits at the layout's offset inside the block.
        pt = w.plane_tensor(a.blocks[0], 1, 1)
        plane = L.block_size * L.num_kv_heads * L.head_dim * 2
        assert pt.ptr == t.ptr + 3 * plane
        w.commit(1, 0, n=len(toks))
        h = r.lookup(2, toks)
        assert h.hit_tokens == L.block_size and h.blocks == a.blocks[:1]
        rt = r.block_tensor(h.blocks[0])
        got = np.empty(L.block_shape, np.float16)
        kvshare.cuda.memcpy_dtoh(got, rt.__cuda_array_interface__["data"][0])
        assert got.tobytes() == want.tobytes()
        pool = r.pool_tensor().__cuda_array_interface__
        assert pool["strides"][0] == L.block_stride
        assert pool["shape"] == (L.num_blocks,) + L.block_shape
        cap = rt.__dlpack__()
        assert kvshare.dlpack_live_count() == 1
        del cap, t, pt, rt
        assert kvshare.dlpack_live_count() == 0
        r.free(2)
        w.free(1)
