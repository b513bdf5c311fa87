"""What the binding needs from CUDA, with no GPU library in Python.

- device_ordinal(uuid): the ordinal, in this process, of the GPU named
  "GPU-..." (the DLPack device id of a cuda pool's tensors; the driver's
  ordinals follow CUDA_VISIBLE_DEVICES, as the frameworks' do).  It asks
  the driver libkvshare loads: $KVS_CUDA_DRIVER when set, else
  libcuda.so.1.
- memcpy_htod / memcpy_dtoh: libkvshare's own synchronous copies
  (kvs_cuda_memcpy_*), to move bytes in and out of device memory without
  PyTorch or CuPy (tests, small tools).
"""
import ctypes
import os

import numpy as np

from . import _lib
from .errors import error_for


def _uuid_text(raw):
    h = bytes(raw).hex()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def device_ordinal(uuid):
    """The ordinal of the GPU `uuid` among this process's visible devices.
    KvsError ENODEV when the driver cannot be loaded or has no such GPU."""
    path = os.environ.get("KVS_CUDA_DRIVER") or "libcuda.so.1"
    try:
        drv = ctypes.CDLL(path)
    except OSError as e:
        raise error_for(_lib.ENODEV, f"no CUDA driver: {e}",
                        "device_ordinal") from e
    rc = drv.cuInit(0)
    if rc:
        raise error_for(_lib.ENODEV, f"cuInit failed with CUresult {rc}",
                        "device_ordinal")
    count = ctypes.c_int(0)
    rc = drv.cuDeviceGetCount(ctypes.byref(count))
    if rc:
        raise error_for(_lib.ENODEV, f"cuDeviceGetCount: CUresult {rc}",
                        "device_ordinal")
    seen = []
    for i in range(count.value):
        dev = ctypes.c_int(0)
        raw = (ctypes.c_ubyte * 16)()
        rc = drv.cuDeviceGet(ctypes.byref(dev), i)
        if rc == 0:
            rc = drv.cuDeviceGetUuid(raw, dev)
        if rc:
            seen.append(f"device {i}: CUresult {rc}")
            continue
        seen.append(_uuid_text(raw))
        if seen[-1].lower() == uuid.strip().lower():
            return i
    raise error_for(_lib.ENODEV, f"the pool's GPU {uuid} is not visible in "
                    f"this process (the driver {path} lists: "
                    f"{', '.join(seen) or 'no device'})", "device_ordinal")


def _check(rc, op):
    if rc:
        raise error_for(rc, "", op)


def memcpy_htod(dst, src):
    """Copy the bytes of numpy array src (made contiguous) to device
    address dst (an int, e.g. PoolTensor.ptr).  Synchronous."""
    a = np.ascontiguousarray(src)
    _check(_lib.lib().kvs_cuda_memcpy_htod(ctypes.c_void_p(int(dst)),
                                           a.ctypes.data_as(ctypes.c_void_p),
                                           a.nbytes), "memcpy_htod")


def memcpy_dtoh(dst, src):
    """Fill contiguous numpy array dst with the bytes at device address src
    (an int).  Synchronous."""
    if not (isinstance(dst, np.ndarray) and dst.flags.c_contiguous
            and dst.flags.writeable):
        raise ValueError("dst must be a writable C-contiguous numpy array")
    _check(_lib.lib().kvs_cuda_memcpy_dtoh(dst.ctypes.data_as(ctypes.c_void_p),
                                           ctypes.c_void_p(int(src)),
                                           dst.nbytes), "memcpy_dtoh")
