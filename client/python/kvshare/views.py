"""Zero-copy views of the block pool: numpy arrays (host pool),
__cuda_array_interface__ and DLPack (either pool).

A block is block-major (shm/kvs_layout.h): layer l's K plane then its V
plane, each [block_size][num_kv_heads][head_dim], so one block is the
C-contiguous array

    [num_layers][2][block_size][num_kv_heads][head_dim]      (2: K, V)

at kvs_block_ptr(b), and the pool is that array repeated every
block_stride bytes (block_stride is rounded up to 4096, so the pool view is
strided, not contiguous).

Element types: fp32 -> float32 ("<f4"), fp16 -> float16 ("<f2"), bf16 ->
uint16 ("<u2", the raw bits: numpy and the CUDA array interface have no
bfloat16; see bf16_to_float32 / float32_to_bf16, or view a DLPack import
as torch.bfloat16).  DLPack carries bf16 as itself (kDLBfloat, 16 bits).
int8 and fp8 -> uint8 ("|u1", kDLUInt 8: the stored bytes); each plane's
float32 scales follow its bytes (docs/kernels.md, Quantized KV blocks), so
a block or pool view of the bytes is strided, and the scales have views of
their own; dequantize() turns bytes and scales into float32 (int8 rows
rotated back: hadamard()).

Every view keeps the client's connection (and so the mapping) alive: see
Client.close().
"""
import ctypes
import threading
from ctypes import (POINTER, Structure, c_int32, c_int64, c_uint8, c_uint16,
                    c_uint64, c_void_p)

import numpy as np

from . import _lib

# numpy dtype and array-interface typestr per kvs_dtype.
# int8/fp8: the raw bytes ("|u1"); their float32 scales are views of
# their own (Client.scales_tensor), dtype fp32.
NUMPY_DTYPES = {_lib.DTYPE_FP32: np.dtype("<f4"),
                _lib.DTYPE_FP16: np.dtype("<f2"),
                _lib.DTYPE_BF16: np.dtype("<u2"),
                _lib.DTYPE_INT8: np.dtype("|u1"),
                _lib.DTYPE_FP8: np.dtype("|u1")}

# ---- DLPack (dlpack.h, the DLManagedTensor ABI every framework takes) -----
KDL_CPU = 1
KDL_CUDA = 2
_KDL_UINT = 1
_KDL_FLOAT = 2
_KDL_BFLOAT = 4
# kvs_dtype -> DLDataType (code, bits)
_DL_DTYPES = {_lib.DTYPE_FP32: (_KDL_FLOAT, 32),
              _lib.DTYPE_FP16: (_KDL_FLOAT, 16),
              _lib.DTYPE_BF16: (_KDL_BFLOAT, 16),
              _lib.DTYPE_INT8: (_KDL_UINT, 8),
              _lib.DTYPE_FP8: (_KDL_UINT, 8)}


class _DLDevice(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class _DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class _DLTensor(Structure):
    _fields_ = [("data", c_void_p), ("device", _DLDevice), ("ndim", c_int32),
                ("dtype", _DLDataType), ("shape", POINTER(c_int64)),
                ("strides", POINTER(c_int64)), ("byte_offset", c_uint64)]


class _DLManagedTensor(Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor),
                             ("manager_ctx", c_void_p),
                             ("deleter", _DELETER)]

# Tensors handed out and not yet released by their consumer: address of the
# DLManagedTensor -> what must outlive it (the struct, its shape and strides,
# the exporting view, which holds the connection).
_live = {}
_live_lock = threading.Lock()


def _release(addr):
    with _live_lock:
        _live.pop(addr, None)


@_DELETER
def _dl_deleter(managed):
    _release(ctypes.addressof(managed.contents))


_CAPSULE_NAME = b"dltensor"
# Private prototypes (the shared ctypes.pythonapi attributes may be retyped
# by other code).
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, c_void_p, ctypes.c_char_p,
                                 c_void_p)(("PyCapsule_New", ctypes.pythonapi))
_capsule_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi))
_capsule_get_pointer = ctypes.PYFUNCTYPE(c_void_p, c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, c_void_p)


@_CAPSULE_DESTRUCTOR
def _capsule_destructor(capsule):
    # A capsule still named "dltensor" was never consumed: release the
    # tensor here.  A consumer renames it "used_dltensor" and calls the
    # deleter itself when it is done with the memory.  (The capsule is
    # being destroyed: touch it through its address only.)
    if _capsule_is_valid(capsule, _CAPSULE_NAME):
        _release(_capsule_get_pointer(capsule, _CAPSULE_NAME))


def dlpack_live_count():
    """DLPack tensors exported and not yet released by their consumer
    (for tests and leak checks)."""
    with _live_lock:
        return len(_live)


class PoolTensor:
    """A typed, strided window on pool memory, host or device, for the
    array protocols.

    ptr     the address of element 0 in this process (a device address on a
            cuda pool)
    shape   tuple of ints; strides: bytes per step of each axis (None: C
            order, contiguous)
    dtype   the elements' kvs_dtype (0 fp32, 1 fp16, 2 bf16, 3 int8 and
            4 fp8 as their raw bytes); dtype_name "fp32" / "fp16" /
            "bf16" / "int8" / "fp8".  A quantized pool's scales are an
            fp32 tensor.
    device  ("cpu", 0) or ("cuda", ordinal)

    Protocols: on the cpu, __array_interface__ (np.asarray(t) is a view)
    and DLPack (kDLCPU); on cuda, __cuda_array_interface__ (version 3) and
    DLPack (kDLCUDA), so torch.as_tensor(t, device="cuda") or
    torch.from_dlpack(t) use the blocks without a copy.  A cuda tensor has
    no __array_interface__ and a cpu one no __cuda_array_interface__
    (hasattr() is False: consumers pick the right protocol).

    Constructing one from a pointer is allowed (tests, or memory the caller
    vouches for); owner is any object that must stay alive as long as the
    tensor and every export of it.
    """

    __slots__ = ("ptr", "shape", "strides", "dtype", "device", "_owner",
                 "__weakref__")

    def __init__(self, ptr, shape, dtype, strides=None, device=("cpu", 0),
                 owner=None):
        if dtype not in NUMPY_DTYPES:
            raise ValueError(f"unknown kvs_dtype {dtype}")
        if device[0] not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', not {device[0]!r}")
        if not ptr:
            raise ValueError("NULL pointer")
        self.ptr = int(ptr)
        self.shape = tuple(int(n) for n in shape)
        self.strides = None if strides is None else tuple(int(s) for s in strides)
        if self.strides is not None and len(self.strides) != len(self.shape):
            raise ValueError("strides and shape differ in length")
        self.dtype = dtype
        self.device = (device[0], int(device[1]))
        self._owner = owner

    @property
    def dtype_name(self):
        return _lib.DTYPES[self.dtype][0]

    @property
    def itemsize(self):
        return _lib.DTYPES[self.dtype][1]

    @property
    def typestr(self):
        """The array-interface typestr ('<u2' for bf16: its raw bits)."""
        return NUMPY_DTYPES[self.dtype].str

    @property
    def nbytes(self):
        n = self.itemsize
        for d in self.shape:
            n *= d
        return n

    def _byte_strides(self):
        if self.strides is not None:
            return self.strides
        s, out = self.itemsize, []
        for d in reversed(self.shape):
            out.append(s)
            s *= d
        return tuple(reversed(out))

    def __repr__(self):
        return (f"PoolTensor({self.device[0]}:{self.device[1]}, "
                f"0x{self.ptr:x}, shape={self.shape}, {self.dtype_name})")

    # -- numpy's array interface (host memory only) --------------------------
    @property
    def __array_interface__(self):
        if self.device[0] != "cpu":
            raise AttributeError(
                "__array_interface__: this tensor is in GPU memory "
                f"(cuda:{self.device[1]}); the CPU cannot read it: use "
                "__cuda_array_interface__ or DLPack")
        return {"version": 3, "shape": self.shape, "typestr": self.typestr,
                "data": (self.ptr, False), "strides": self.strides}

    # -- the CUDA array interface, version 3 ---------------------------------
    @property
    def __cuda_array_interface__(self):
        if self.device[0] != "cuda":
            raise AttributeError(
                "__cuda_array_interface__: this tensor is in host memory "
                "(a host pool): use numpy (np.asarray, Client.block_array) "
                "or DLPack")
        # stream None: no synchronisation is owed to the consumer.  A
        # writer synchronises its own stream before it commits (the stream
        # rule, docs/client.md), so a committed block is complete.
        return {"version": 3, "shape": self.shape, "typestr": self.typestr,
                "data": (self.ptr, False), "strides": self.strides,
                "stream": None}

    # -- DLPack ---------------------------------------------------------------
    def __dlpack_device__(self):
        return (KDL_CUDA if self.device[0] == "cuda" else KDL_CPU,
                self.device[1])

    def __dlpack__(self, stream=None):
        """A "dltensor" capsule of this memory.  stream is accepted and
        ignored: the pool's bytes are complete once committed, so no
        ordering with the consumer's stream is needed."""
        if stream is not None and not isinstance(stream, int):
            raise TypeError("stream must be an int or None")
        ndim = len(self.shape)
        m = _DLManagedTensor()
        shape = (c_int64 * max(ndim, 1))(*self.shape)
        strides = None
        if self.strides is not None:
            for s in self.strides:
                if s % self.itemsize:
                    raise BufferError("strides not a multiple of the element")
            strides = (c_int64 * max(ndim, 1))(
                *[s // self.itemsize for s in self.strides])
        t = m.dl_tensor
        t.data = self.ptr
        t.device.device_type, t.device.device_id = self.__dlpack_device__()
        t.ndim = ndim
        code, bits = _DL_DTYPES[self.dtype]
        t.dtype.code, t.dtype.bits, t.dtype.lanes = code, bits, 1
        t.shape = ctypes.cast(shape, POINTER(c_int64))
        if strides is not None:
            t.strides = ctypes.cast(strides, POINTER(c_int64))
        t.byte_offset = 0
        m.manager_ctx = None
        m.deleter = _dl_deleter
        addr = ctypes.addressof(m)
        with _live_lock:
            _live[addr] = (m, shape, strides, self)
        try:
            return _capsule_new(
                addr, _CAPSULE_NAME,
                ctypes.cast(_capsule_destructor, c_void_p))
        except BaseException:
            _release(addr)
            raise

    def numpy(self):
        """A numpy view (cpu only; the pool's dtype, bf16 as uint16, int8
        and fp8 as uint8)."""
        return np.asarray(self)


# ---- bf16 helpers ------------------------------------------------------------
def bf16_to_float32(a):
    """bf16 bits (uint16 array) -> float32, exactly."""
    a = np.asarray(a, dtype=np.uint16)
    return (a.astype(np.uint32) << 16).view(np.float32)


def float32_to_bf16(a):
    """float32 -> bf16 bits (uint16), rounding to nearest even, NaN kept NaN
    (the rounding of kvs_float_to_bf16)."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    u = a.view(np.uint32)
    rounded = (u + (np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1)))) >> 16
    nan = np.isnan(a)
    out = rounded.astype(np.uint16)
    out[nan] = ((u[nan] >> 16) | np.uint32(0x40)).astype(np.uint16)
    return out


# ---- quantized blocks --------------------------------------------------------
def _fp8_e4m3_table():
    """The 256 values of OCP fp8 e4m3 ("FN"), from the format's definition:
    sign bit, 4 exponent bits with bias 7, 3 mantissa bits; exponent 0 is
    subnormal (m / 8 * 2**-6); 0x7f and 0xff (exponent and mantissa all
    ones) are NaN; no infinities (largest finite 448)."""
    t = np.empty(256, dtype=np.float32)
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        e, m = (b >> 3) & 0xF, b & 0x7
        if e == 0xF and m == 0x7:
            v = float("nan")
        elif e == 0:
            v = sign * (m / 8.0) * 2.0 ** -6
        else:
            v = sign * (1.0 + m / 8.0) * 2.0 ** (e - 7)
        t[b] = v
    t.flags.writeable = False
    return t


FP8_E4M3_TABLE = _fp8_e4m3_table()


def fp8_e4m3_to_float32(a):
    """fp8 e4m3 bytes (uint8 array) -> float32, exactly (FP8_E4M3_TABLE)."""
    return FP8_E4M3_TABLE[np.asarray(a, dtype=np.uint8)]


def hadamard(x, down=False):
    """The int8 format's rotation of rows x [..., n] (docs/kernels.md,
    Quantized KV blocks), float32, a new array: the last axis split into
    power-of-two segments, the largest first (96: 64 then 32), each
    multiplied by the Sylvester Hadamard matrix of its size as butterflies
    (a, b) -> (a + b, a - b) at distances 1, 2, 4, ... in float32, the
    kernels' own order.  down=True also divides each segment by its size:
    an int8 row quantizes hadamard(row, down=True), and hadamard() of what
    it reads back is the row again."""
    y = np.array(x, dtype=np.float32)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN, inf: kept
        _hadamard_into(y, down)
    return y


def _hadamard_into(y, down):
    n, off = y.shape[-1], 0
    while off < n:
        m = 1 << ((n - off).bit_length() - 1)
        seg = np.ascontiguousarray(y[..., off:off + m])
        h = 1
        while h < m:
            t = seg.reshape(seg.shape[:-1] + (m // (2 * h), 2, h))
            a, b = t[..., 0, :].copy(), t[..., 1, :].copy()
            t[..., 0, :] = a + b
            t[..., 1, :] = a - b
            h *= 2
        if down and m > 1:
            seg *= np.float32(1.0 / m)
        y[..., off:off + m] = seg
        off += m


def dequantize(data, scales, dtype):
    """float32 values of quantized bytes and their row parameters (numpy
    arrays or host PoolTensors; a copy), every operation in float32:

    dtype int8 (3):  data [..., head_dim] uint8, scales [..., 2] float32
                     ([scale, min] per row): byte * scale + min, rotated
                     back (hadamard)
    dtype fp8 (4):   data [..., head_dim] uint8, scales [...] float32:
                     e4m3(byte) * scale

    (the multiply and the add are rounded apart; a GPU's fused multiply-add
    may differ by one float32 rounding).  A row whose scale is NaN reads
    as NaN."""
    d = np.asarray(data)
    s = np.asarray(scales, dtype=np.float32)
    if d.dtype != np.uint8:
        raise TypeError(f"data must be uint8 bytes, not {d.dtype}")
    if dtype == _lib.DTYPE_INT8:
        if s.shape != d.shape[:-1] + (2,):
            raise ValueError(f"int8 scales of shape {s.shape} for data "
                             f"{d.shape}: want {d.shape[:-1] + (2,)}")
        out = d.astype(np.float32)
        out *= s[..., 0:1]
        out += s[..., 1:2]
        return hadamard(out)  # (a NaN row stays NaN)
    if dtype == _lib.DTYPE_FP8:
        if s.shape != d.shape[:-1]:
            raise ValueError(f"fp8 scales of shape {s.shape} for data "
                             f"{d.shape}: want {d.shape[:-1]}")
        out = FP8_E4M3_TABLE[d]
        out *= s[..., None]
        return out
    raise ValueError(f"kvs_dtype {dtype} is not quantized (int8 3, fp8 4)")


def to_torch(a):
    """A torch tensor sharing a numpy array's memory (torch.from_numpy).
    ImportError when PyTorch is not installed (the binding does not need
    it)."""
    try:
        import torch
    except ImportError as e:
        raise ImportError("kvshare.to_torch needs PyTorch, which is not "
                          f"importable here ({e})") from e
    return torch.from_numpy(np.asarray(a))
