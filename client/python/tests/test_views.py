"""numpy views of the host pool, DLPack, the CUDA array interface's dict,
bf16 helpers, and the views' hold on the mapping."""
import ctypes
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import kvshare
from conftest import SMALL


def layout_offset(L, b, layer, kv):
    """kvs_layout.h's offset math, written out again independently."""
    isz = {0: 4, 1: 2, 2: 2}[L.dtype]
    plane = L.block_size * L.num_kv_heads * L.head_dim * isz
    return b * L.block_stride + layer * 2 * plane + kv * plane


def fill_pattern(L, b):
    """Recognisable values for block b, as the pool's numpy dtype."""
    n = int(np.prod(L.block_shape))
    v = (np.arange(n, dtype=np.float64) % 251) / 8 + b
    if L.dtype == kvshare.DTYPE_BF16:
        return kvshare.float32_to_bf16(v.astype(np.float32)).reshape(L.block_shape)
    return v.astype(L.numpy_dtype).reshape(L.block_shape)


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_second_client_reads_the_bytes_written(daemon_factory, dtype):
    d = daemon_factory(SMALL + ["--dtype", dtype])
    with kvshare.Client(d.socket) as w, kvshare.Client(d.socket) as r:
        L = w.layout
        assert L.dtype_name == dtype
        assert L.numpy_dtype == {"fp32": np.float32, "fp16": np.float16,
                                 "bf16": np.uint16}[dtype]
        toks = list(range(500, 500 + 3 * L.block_size + 1))
        w.lookup(1, toks)
        a = w.allocate(1, len(toks))
        for b in a.blocks:
            arr = w.block_array(b)
            assert arr.shape == L.block_shape and arr.dtype == L.numpy_dtype
            assert arr.flags.c_contiguous and arr.flags.writeable
            arr[...] = fill_pattern(L, b)
            del arr
        assert w.commit(1, 0, toks, blocks=a.blocks) == 3
        h = r.lookup(7, toks)
        assert h.hit_tokens == 3 * L.block_size
        assert h.blocks == a.blocks[:3]
        # The reader maps the pool at another address of its own.
        assert r.block_tensor(0).ptr != w.block_tensor(0).ptr
        for b in h.blocks:
            got = r.block_array(b)
            want = fill_pattern(L, b)
            assert got.tobytes() == want.tobytes()
            # Byte for byte against the pool read at the offset the layout
            # header's math gives, through a plain ctypes read.
            base = r.block_tensor(0).ptr
            for layer in range(L.num_layers):
                for kv in (0, 1):
                    off = layout_offset(L, b, layer, kv)
                    plane = r.plane_array(b, layer, kv)
                    assert plane.shape == L.plane_shape
                    assert plane.ctypes.data == base + off
                    raw = ctypes.string_at(base + off, plane.nbytes)
                    assert raw == want[layer, kv].tobytes()
        pool = r.pool_array()
        assert pool.shape == (L.num_blocks,) + L.block_shape
        assert pool.strides[0] == L.block_stride
        assert pool[h.blocks[1]].tobytes() == fill_pattern(L, h.blocks[1]).tobytes()
        r.free(7)
        w.free(1)


def test_bf16_conversions_match_the_c_library():
    lib = ctypes.CDLL(kvshare.library_path())
    lib.kvs_float_to_bf16.restype = ctypes.c_uint16
    lib.kvs_float_to_bf16.argtypes = [ctypes.c_float]
    lib.kvs_bf16_to_float.restype = ctypes.c_float
    lib.kvs_bf16_to_float.argtypes = [ctypes.c_uint16]
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.normal(0, 100, 2000).astype(np.float32),
                        np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40,
                                  3.4e38, 1.00390625, 1.01171875],
                                 dtype=np.float32)])
    bits = kvshare.float32_to_bf16(x)
    want = np.array([lib.kvs_float_to_bf16(float(v)) for v in x], np.uint16)
    assert np.array_equal(bits, want)
    back = kvshare.bf16_to_float32(bits)
    want_back = np.array([lib.kvs_bf16_to_float(int(v)) for v in bits],
                         np.float32)
    assert np.array_equal(back.view(np.uint32), want_back.view(np.uint32))


def test_dlpack_round_trip_through_numpy(client):
    L = client.layout
    client.lookup(1, [1, 2, 3])
    a = client.allocate(1, 3)
    b = a.blocks[0]
    client.block_array(b)[...] = fill_pattern(L, b)
    t = client.block_tensor(b)
    assert t.__dlpack_device__() == (1, 0)  # kDLCPU
    x = np.from_dlpack(t)  # numpy consumes the capsule
    assert x.shape == L.block_shape and x.dtype == np.float32
    assert x.ctypes.data == t.ptr  # no copy
    assert x.tobytes() == fill_pattern(L, b).tobytes()
    client.block_array(b)[0, 0, 0, 0, 0] = -7.0  # the same memory
    assert x[0, 0, 0, 0, 0] == -7.0
    assert kvshare.dlpack_live_count() == 1
    # Strided: the whole pool, a DLPack tensor with strides.
    p = np.from_dlpack(client.pool_tensor())
    assert p.strides[0] == L.block_stride
    assert p[b].tobytes() == client.block_array(b).tobytes()
    del x, p
    assert kvshare.dlpack_live_count() == 0
    # A capsule never consumed is released by its destructor.
    cap = t.__dlpack__()
    assert kvshare.dlpack_live_count() == 1
    del cap
    assert kvshare.dlpack_live_count() == 0
    del t
    client.free(1)


def test_host_pool_has_no_cuda_interface(client):
    t = client.block_tensor(0)
    assert not hasattr(t, "__cuda_array_interface__")
    with pytest.raises(AttributeError, match="host memory"):
        t.__cuda_array_interface__
    assert t.__array_interface__["data"] == (t.ptr, False)


def test_cuda_interface_from_a_given_pointer():
    buf = np.zeros(2 * 2 * 4 * 2 * 8, dtype=np.float16)
    t = kvshare.PoolTensor(buf.ctypes.data, (2, 2, 4, 2, 8),
                           kvshare.DTYPE_FP16, device=("cuda", 3), owner=buf)
    cai = t.__cuda_array_interface__
    assert cai == {"version": 3, "shape": (2, 2, 4, 2, 8), "typestr": "<f2",
                   "data": (buf.ctypes.data, False), "strides": None,
                   "stream": None}
    assert not hasattr(t, "__array_interface__")
    assert t.__dlpack_device__() == (2, 3)  # kDLCUDA, ordinal 3
    with pytest.raises(TypeError):
        t.__dlpack__(stream="x")
    # The capsule's DLManagedTensor, read back field by field.
    cap = t.__dlpack__(stream=1)
    get = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
        ("PyCapsule_GetPointer", ctypes.pythonapi))
    addr = get(cap, b"dltensor")
    f = (ctypes.c_int64 * 2).from_address(addr)  # data
    assert f[0] == buf.ctypes.data
    dev = (ctypes.c_int32 * 3).from_address(addr + 8)
    assert list(dev) == [2, 3, 5]  # device type, id, ndim
    dt = (ctypes.c_uint8 * 4).from_address(addr + 20)
    assert list(dt) == [2, 16, 1, 0]  # kDLFloat, 16 bits, 1 lane
    shape_ptr, strides_ptr = (ctypes.c_void_p * 2).from_address(addr + 24)
    assert list((ctypes.c_int64 * 5).from_address(shape_ptr)) == [2, 2, 4, 2, 8]
    assert strides_ptr is None
    del cap
    assert kvshare.dlpack_live_count() == 0
    # bf16: raw bits for the array interfaces, kDLBfloat for DLPack.
    tb = kvshare.PoolTensor(buf.ctypes.data, (4,), kvshare.DTYPE_BF16,
                            strides=(4,), device=("cuda", 0), owner=buf)
    assert tb.__cuda_array_interface__["typestr"] == "<u2"
    assert tb.__cuda_array_interface__["strides"] == (4,)
    cap = tb.__dlpack__()
    addr = get(cap, b"dltensor")
    assert list((ctypes.c_uint8 * 4).from_address(addr + 20)) == [4, 16, 1, 0]
    strides_ptr = ctypes.c_void_p.from_address(addr + 32).value
    assert list((ctypes.c_int64 * 1).from_address(strides_ptr)) == [2]
    del cap
    with pytest.raises(ValueError):
        kvshare.PoolTensor(0, (1,), kvshare.DTYPE_FP32)
    with pytest.raises(ValueError):
        kvshare.PoolTensor(buf.ctypes.data, (1,), 9)


def test_views_out_of_range_and_unmapped(client, daemon):
    with pytest.raises(kvshare.KvsError) as ei:
        client.block_array(client.layout.num_blocks)
    assert ei.value.status == kvshare.ERANGE
    with pytest.raises(kvshare.KvsError):
        client.plane_array(0, client.layout.num_layers, 0)
    with pytest.raises(kvshare.KvsError):
        client.plane_array(0, 0, 2)
    with kvshare.Client(daemon.socket, no_map=True) as c:
        assert not c.mapped
        with pytest.raises(kvshare.StateError, match="not mapped"):
            c.block_array(0)


def test_a_view_keeps_the_mapping_after_close(daemon):
    c = kvshare.Client(daemon.socket)
    toks = list(range(40, 49))
    c.lookup(1, toks)
    a = c.allocate(1, 9)
    view = c.block_array(a.blocks[0])[1]  # a derived view keeps it too
    view[...] = 3.25
    assert c.views_alive == 1
    with pytest.warns(ResourceWarning, match="still alive"):
        c.close()
    assert c.closed
    with pytest.raises(kvshare.ConnectionClosedError):
        c.lookup(2, toks)
    # Still mapped and readable; the session lives until the view goes.
    assert float(view.sum()) == 3.25 * view.size
    assert daemon.cli("stats", "--json")["num_requests"] == 1
    del view
    import gc
    gc.collect()
    daemon.check_clean()


def test_child_process_cannot_use_the_parents_client(client):
    pid = os.fork()
    if pid == 0:
        try:
            client.ping()
            os._exit(1)
        except kvshare.StateError:
            os._exit(0)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    client.ping()  # the parent's session is untouched


def test_a_forked_child_closing_keeps_its_views_mapped(client):
    toks = list(range(60, 69))
    client.lookup(1, toks)
    a = client.allocate(1, 9)
    view = client.block_array(a.blocks[0])
    view[...] = 1.5
    pid = os.fork()
    if pid == 0:  # the child's close must not unmap under its view
        try:
            client.close()
            ok = float(view.sum()) == 1.5 * view.size
            os._exit(0 if ok else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    del view
    client.free(1)


def test_views_read_by_exit_handlers_stay_mapped(daemon):
    # An exit handler registered before the client reads a view after the
    # client was closed: the interpreter's exit must not unmap under it.
    code = f"""
import atexit, kvshare
seen = []
atexit.register(lambda: seen.append(float(v.sum())) or print("sum", seen[0]))
c = kvshare.Client({daemon.socket!r})
c.lookup(1, [1, 2, 3])
a = c.allocate(1, 3)
v = c.block_array(a.blocks[0])
v[...] = 2.0
import warnings
warnings.simplefilter("ignore")
c.close()
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert r.stdout.startswith("sum "), r.stdout


@pytest.mark.parametrize("dtype", ["int8", "fp8"])
def test_quantized_pool_layout(daemon_factory, dtype):
    """An int8/fp8 pool: the layout says so (block bytes with the scales);
    its views are the bytes as uint8 (test_quant.py covers them)."""
    d = daemon_factory(SMALL + ["--dtype", dtype])
    with kvshare.Client(d.socket) as c:
        L = c.layout
        assert L.dtype_name == dtype
        assert L.dtype == {"int8": kvshare.DTYPE_INT8,
                           "fp8": kvshare.DTYPE_FP8}[dtype]
        assert L.block_stride == (L.block_bytes + 4095) // 4096 * 4096
        # 2 layers x (K, V) x (4 x 2 x 8 bytes + the scales: per token and
        # head, int8 a float32 scale and minimum, fp8 a scale)
        assert L.block_bytes == 2 * 2 * (64 + {"int8": 64, "fp8": 32}[dtype])
        assert L.scale_offset == 64 and L.plane_bytes == L.block_bytes // 4
        assert L.numpy_dtype == np.uint8
        t = c.block_tensor(0)
        assert t.typestr == "|u1" and t.shape == L.block_shape
        assert t.strides == (2 * L.plane_bytes, L.plane_bytes, 16, 8, 1)
        del t
