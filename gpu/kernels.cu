/*
 * kernels.cu — the CUDA kernels.  Compiled by nvcc into a fatbin (sm_80,
 * sm_90, PTX) that the library embeds; the host side (cuda_driver.c) loads
 * it through the driver API.  Every kernel has extern "C" linkage so the
 * loader finds it by name; the semantics are those of the C twins in
 * kernels_cpu.c (see kvs_kernels.h).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "kvs_kernels_int.h"

#define NWARPS (KVS__ATTN_THREADS / 32)
/* Token groups whose loads a warp has in flight at once. */
#define UNR 4

/* ---- element access ------------------------------------------------------ */

__device__ __forceinline__ float ld_elem(const void *p, uint64_t i,
                                         uint32_t dtype) {
  switch (dtype) {
  case KVS_DTYPE_FP32:
    return ((const float *)p)[i];
  case KVS_DTYPE_FP16:
    return __half2float(((const __half *)p)[i]);
  default:
    return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
  }
}

__device__ __forceinline__ void st_elem(void *p, uint64_t i, uint32_t dtype,
                                        float v) {
  switch (dtype) {
  case KVS_DTYPE_FP32:
    ((float *)p)[i] = v;
    break;
  case KVS_DTYPE_FP16:
    ((__half *)p)[i] = __float2half_rn(v);
    break;
  default:
    ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
    break;
  }
}

/* int8 / fp8 caches: one byte (a code) per element; a row of one token
 * and kv head reads as code * scale + min (int8, the byte unsigned) or
 * e4m3(code) * scale (fp8) with the row's float32 scales (kvs_layout.h). */
struct KvInt8 {
  uint8_t code;
};
struct KvFp8 {
  uint8_t code;
};

/* 16 bytes -> N = 16 / sizeof(T) floats; NF float32 scales per row (0 for
 * the unquantized dtypes).  For int8 and fp8 the floats are the codes' own
 * values (the byte - 128, the e4m3 number): the attention body applies the
 * scales once per row where it can (phase 1, phase 3 for fp8) rather than
 * once per element. */
template <typename T> struct Vec;
template <> struct Vec<float> {
  enum { N = 4, NF = 0 };
  static __device__ __forceinline__ void cvt(const uint4 &r, float *f) {
    f[0] = __uint_as_float(r.x);
    f[1] = __uint_as_float(r.y);
    f[2] = __uint_as_float(r.z);
    f[3] = __uint_as_float(r.w);
  }
};
template <> struct Vec<__half> {
  enum { N = 8, NF = 0 };
  static __device__ __forceinline__ void cvt(const uint4 &r, float *f) {
    const __half2 *h = (const __half2 *)&r;
#pragma unroll
    for (int i = 0; i < 4; i++) {
      float2 t = __half22float2(h[i]);
      f[2 * i] = t.x;
      f[2 * i + 1] = t.y;
    }
  }
};
template <> struct Vec<__nv_bfloat16> {
  enum { N = 8, NF = 0 };
  static __device__ __forceinline__ void cvt(const uint4 &r, float *f) {
    const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
      f[2 * i] = __uint_as_float(w[i] << 16);
      f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  }
};

/* Four bytes -> four floats byte - 128 (-128..127), exactly: each byte
 * under the exponent of 2^23 (0x4b000000 | b is 2^23 + b), then 2^23 + 128
 * off.  A byte permute and an add per element, no integer-to-float
 * conversion (a quarter-rate instruction).  Centred, so that the sums of
 * a row's codes do not carry 128 times its scale for the minimum's term to
 * cancel (ld_scales moves the minimum to byte 128's value). */
__device__ __forceinline__ void u8x4_to_float(uint32_t w, float *f) {
#pragma unroll
  for (int k = 0; k < 4; k++)
    f[k] = __uint_as_float(__byte_perm(w, 0x4b000000u, 0x7440u | k)) - 8388736.f;
}
template <> struct Vec<KvInt8> {
  enum { N = 16, NF = 2 };
  static __device__ __forceinline__ void cvt(const uint4 &r, float *f) {
    u8x4_to_float(r.x, f);
    u8x4_to_float(r.y, f + 4);
    u8x4_to_float(r.z, f + 8);
    u8x4_to_float(r.w, f + 12);
  }
};

/* fp8 e4m3 bits -> float, exact, as kvs_fp8_to_float (0x7f/0xff NaN).
 * sm_89 and later convert two codes per instruction to half2 (e4m3 values
 * are all fp16 values); sm_80 has no fp8 instruction and takes the C
 * twin's branch-free form: the 7 bits below the sign moved under a float's
 * exponent rebias by 2^120 (subnormals included; needs no flush-to-zero,
 * which nvcc does not do without --use_fast_math). */
__device__ __forceinline__ void e4m3x2_to_float(uint32_t two, float *f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"((unsigned short)two));
  float2 t = __half22float2(*(const __half2 *)&h2);
  f[0] = t.x;
  f[1] = t.y;
#else
#pragma unroll
  for (int k = 0; k < 2; k++) {
    uint32_t b = (two >> (8 * k)) & 0xffu, em = b & 0x7fu;
    float v = em == 0x7fu ? __uint_as_float(0x7fc00000u)
                          : __uint_as_float(em << 20) * 0x1p120f;
    f[k] = __uint_as_float(__float_as_uint(v) | ((b & 0x80u) << 24));
  }
#endif
}
template <> struct Vec<KvFp8> {
  enum { N = 16, NF = 1 };
  static __device__ __forceinline__ void cvt(const uint4 &r, float *f) {
    const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
      e4m3x2_to_float(w[i] & 0xffffu, f + 4 * i);
      e4m3x2_to_float(w[i] >> 16, f + 4 * i + 2);
    }
  }
};

/* The NF scales of one row as the codes of Vec::cvt take them: int8
 * (scale, min + 128 * scale: the value of byte 128, whose code is 0), fp8
 * (scale, 0).  The scale arrays are 16-byte aligned (KVS_SCALE_ALIGN), so
 * the pair is 8-byte aligned.  (128 * scale is exact, so a contraction of
 * the sum into an fma rounds the same: the C bodies' lo.) */
template <int NF>
__device__ __forceinline__ float2 ld_scales(const char *p) {
  if (NF == 2) {
    float2 s = __ldg((const float2 *)p);
    return make_float2(s.x, s.y + 128.f * s.x);
  }
  return make_float2(NF ? __ldg((const float *)p) : 0.f, 0.f);
}

/* ---- write ------------------------------------------------------------------ */

extern "C" __global__ void kvs_write_kv_kernel(kvs_write_args a) {
  const kvs_paged_kv &kv = a.kv;
  uint32_t i = blockIdx.x;
  int64_t slot = a.slots[i];
  /* Padding, or a slot outside the pool: nothing is written (a kernel
   * cannot fail the call as the C twin does with ERANGE, but it never
   * writes past the pool another worker's blocks live in). */
  if (slot < 0 ||
      (kv.num_blocks && (uint64_t)slot >= (uint64_t)kv.num_blocks * kv.block_size))
    return;
  uint64_t b = (uint64_t)slot / kv.block_size;
  uint64_t t = (uint64_t)slot % kv.block_size;
  char *blk = (char *)kv.base + b * kv.block_stride;
  uint32_t row = kv.num_kv_heads * kv.head_dim;
  for (uint32_t e = threadIdx.x; e < row; e += blockDim.x) {
    uint32_t h = e / kv.head_dim, d = e % kv.head_dim;
    uint64_t src = (uint64_t)i * a.src_token_stride + e;
    uint64_t dst = t * kv.token_stride + (uint64_t)h * kv.head_stride + d;
    st_elem(blk + kv.k_offset, dst, kv.dtype, ld_elem(a.k, src, a.src_dtype));
    st_elem(blk + kv.v_offset, dst, kv.dtype, ld_elem(a.v, src, a.src_dtype));
  }
}

/* float -> fp8 e4m3 bits, the C twin's kvs_float_to_fp8 step for step
 * (integer operations and one float add, the same bits): round to nearest
 * even, saturating at +-448, NaN -> 0x7f with the sign. */
__device__ __forceinline__ uint32_t float_to_e4m3(float f) {
  uint32_t x = __float_as_uint(f);
  uint32_t sign = (x >> 24) & 0x80u;
  x &= 0x7fffffffu;
  if (x > 0x7f800000u)
    return sign | 0x7fu;
  if (x >= 0x43e80000u) /* >= 464: 448 wins or saturates */
    return sign | 0x7eu;
  if (x < 0x3c800000u) /* below 2^-6: the add rounds to steps of 2^-9 */
    return sign | (__float_as_uint(__uint_as_float(x) + 0x1p14f) - 0x46800000u);
  uint32_t code = ((x + 0x7ffffu + ((x >> 20) & 1u)) >> 20) - (120u << 3);
  return sign | (code > 0x7eu ? 0x7eu : code);
}

/*
 * kvs__hadamard (kvs_kernels_int.h) of `rows` rows of n floats, `stride`
 * apart, in shared memory, by `count` threads of which this is `rank`: the
 * same butterflies in the same order, so the same float32 results; every
 * thread of the block (BLOCK) or of the warp calls it.  Each step is one
 * correctly rounded operation (__fadd_rn, __fsub_rn, __fmul_rn: none is
 * contracted).
 */
template <bool BLOCK> __device__ __forceinline__ void par_sync() {
  if (BLOCK)
    __syncthreads();
  else
    __syncwarp();
}

template <bool BLOCK>
__device__ __forceinline__ void hadamard_par(float *y, uint32_t rows,
                                             uint32_t stride, uint32_t n,
                                             uint32_t rank, uint32_t count,
                                             bool down) {
  for (uint32_t off = 0; off < n;) {
    const uint32_t m = kvs__hadamard_seg(n, off);
    for (uint32_t h = 1; h < m; h *= 2) {
      for (uint32_t p = rank; p < rows * (m / 2); p += count) {
        const uint32_t r = p / (m / 2), q = p % (m / 2);
        float *x = y + (uint64_t)r * stride + off + (q / h) * 2 * h + q % h;
        const float a = x[0], b = x[h];
        x[0] = __fadd_rn(a, b);
        x[h] = __fsub_rn(a, b);
      }
      par_sync<BLOCK>();
    }
    if (down && m > 1) {
      const float inv = 1.f / (float)m;
      for (uint32_t p = rank; p < rows * m; p += count) {
        float *x = y + (uint64_t)(p / m) * stride + off + p % m;
        *x = __fmul_rn(*x, inv);
      }
      par_sync<BLOCK>();
    }
    off += m;
  }
}

/*
 * The write kernel for an int8 / fp8 cache: one block per token, one warp
 * per (kv head, K or V) row at a time, lanes over the row's elements.  The
 * row's minimum and maximum (int8) or largest magnitude (fp8) are reduced
 * over the warp, then each lane quantizes its elements as
 * kvs_quantize_row does, every step one correctly rounded float32
 * operation (a subtraction, a division, rintf; no contraction is
 * possible), so bytes and scales equal the C twin's.  The one choice a
 * reduction could make differently is the sign of a zero minimum: the twin
 * keeps the first of equal minima (-0 == +0), so the warp keeps the one of
 * lowest index too.  int8 rows are rotated first (kvs__hadamard, down),
 * each warp in its own D floats of the dynamic shared memory.
 */
extern "C" __global__ void __launch_bounds__(128)
    kvs_write_kv_q_kernel(kvs_write_args a) {
  extern __shared__ float wq_rot[]; /* int8: [warps][head_dim] */
  const kvs_paged_kv &kv = a.kv;
  uint32_t i = blockIdx.x;
  int64_t slot = a.slots[i];
  if (slot < 0 ||
      (kv.num_blocks && (uint64_t)slot >= (uint64_t)kv.num_blocks * kv.block_size))
    return;
  uint64_t t = (uint64_t)slot % kv.block_size;
  char *blk = (char *)kv.base + (uint64_t)slot / kv.block_size * kv.block_stride;
  const uint32_t D = kv.head_dim, nf = kvs_scale_floats(kv.dtype);
  const uint32_t lane = threadIdx.x % 32;
  const bool int8 = kv.dtype == KVS_DTYPE_INT8;
  for (uint32_t r = threadIdx.x / 32; r < 2 * kv.num_kv_heads; r += blockDim.x / 32) {
    const uint32_t h = r / 2;
    const void *src = r % 2 ? a.v : a.k;
    const uint64_t s0 = (uint64_t)i * a.src_token_stride + (uint64_t)h * D;
    char *plane = blk + (r % 2 ? kv.v_offset : kv.k_offset);
    uint8_t *dst = (uint8_t *)plane + t * kv.token_stride + (uint64_t)h * kv.head_stride;
    float *sc = (float *)(plane + kv.scale_offset + (t * kv.num_kv_heads + h) * nf * 4);
    float *rot = wq_rot + (threadIdx.x / 32) * D;
    if (int8) {
      __syncwarp(); /* (the warp's last row is read) */
      for (uint32_t d = lane; d < D; d += 32)
        rot[d] = ld_elem(src, s0 + d, a.src_dtype);
      __syncwarp();
      hadamard_par<false>(rot, 1, D, D, lane, 32, true);
    }
    int bad = 0;
    float lo = INFINITY, hi = -INFINITY, amax = 0.f;
    uint32_t lo_at = UINT32_MAX;
    for (uint32_t d = lane; d < D; d += 32) {
      float x = int8 ? rot[d] : ld_elem(src, s0 + d, a.src_dtype);
      bad |= !(x - x == 0.f); /* NaN or infinite */
      if (x < lo) {
        lo = x;
        lo_at = d;
      }
      hi = fmaxf(hi, x);
      amax = fmaxf(amax, fabsf(x));
    }
    for (int o = 16; o >= 1; o /= 2) {
      float olo = __shfl_xor_sync(0xffffffffu, lo, o);
      uint32_t oat = __shfl_xor_sync(0xffffffffu, lo_at, o);
      if (olo < lo || (olo == lo && oat < lo_at)) {
        lo = olo;
        lo_at = oat;
      }
      bad |= __shfl_xor_sync(0xffffffffu, bad, o);
      hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, o));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    }
    float s;
    if (int8) {
      float range = hi - lo;
      bad |= !(range <= 0x1.fffffep127f); /* the range overflows float32 */
      s = bad ? 0.f : range / 255.f;
    } else {
      s = bad ? 0.f : amax / 448.f;
    }
    if (bad || s == 0.f) { /* bytes 0; a bad row's scales NaN (reads NaN) */
      const float nan = __uint_as_float(0x7fc00000u);
      for (uint32_t d = lane; d < D; d += 32)
        dst[d] = 0;
      if (lane == 0) {
        sc[0] = bad ? nan : 0.f;
        if (int8)
          sc[1] = bad ? nan : lo;
      }
      continue;
    }
    if (lane == 0) {
      sc[0] = s;
      if (int8)
        sc[1] = lo;
    }
    for (uint32_t d = lane; d < D; d += 32) {
      float x = int8 ? rot[d] : ld_elem(src, s0 + d, a.src_dtype);
      if (int8) {
        float q = rintf((x - lo) / s); /* nearest even */
        dst[d] = (uint8_t)(q > 255.f ? 255.f : q < 0.f ? 0.f : q);
      } else {
        dst[d] = (uint8_t)float_to_e4m3(x / s);
      }
    }
  }
}

/* ---- whole blocks ------------------------------------------------------------ */

/* mode 0: pairs (src, dst) inside the pool; 1: gather pool -> staging;
 * 2: scatter staging -> pool.  grid.x = item, grid.y = slices of a block. */
extern "C" __global__ void kvs_blocks_kernel(char *base, uint64_t stride,
                                             char *staging,
                                             const uint32_t *idx, int mode) {
  uint32_t i = blockIdx.x;
  const char *src;
  char *dst;
  if (mode == 0) {
    src = base + (uint64_t)idx[2 * i] * stride;
    dst = base + (uint64_t)idx[2 * i + 1] * stride;
    if (src == dst)
      return;
  } else if (mode == 1) {
    src = base + (uint64_t)idx[i] * stride;
    dst = staging + (uint64_t)i * stride;
  } else {
    src = staging + (uint64_t)i * stride;
    dst = base + (uint64_t)idx[i] * stride;
  }
  uint64_t first = (uint64_t)blockIdx.y * blockDim.x + threadIdx.x;
  uint64_t step = (uint64_t)gridDim.y * blockDim.x;
  if ((((uintptr_t)src | (uintptr_t)dst | stride) & 15) == 0) {
    const uint4 *s = (const uint4 *)src;
    uint4 *d = (uint4 *)dst;
    for (uint64_t k = first; k < stride / 16; k += step)
      d[k] = s[k];
  } else {
    for (uint64_t k = first; k < stride; k += step)
      dst[k] = src[k];
  }
}

/* ---- attention ---------------------------------------------------------------- */

/*
 * One block: one query row, one kv head, up to G query heads of its group,
 * and a token range: the whole row (span == 0) or split blockIdx.z, tokens
 * [z * span, (z + 1) * span) (span != 0, partial results to the workspace,
 * merged by kvs_attn_merge_kernel).  The range is walked in chunks of
 * KVS__ATTN_PART tokens with an online softmax.
 *
 * Lanes: a key row of head_dim elements is `lanes` lanes x NV vectors of 16
 * bytes; a warp reads 32 / lanes tokens at a time.  Lane c of a token holds
 * elements (v * lanes + c) * VEC + [0, VEC) for v < NV.
 *
 * int8 / fp8 caches (NF scales per row): each lane loads its token's
 * scales once, with the row's vectors, and applies them per row where the
 * algebra allows: a score is scale * sum(q * code) (+ lo * sum(q) for
 * int8, sum(q) computed once per block, lo = min + 128 * scale with the
 * int8 code centred, byte - 128), so the dot product runs on the codes;
 * fp8 values are weighted by p * scale; int8 values are dequantized (code
 * * scale + lo, one fma) before they are weighted.  (The C bodies split
 * off sum(p * lo) instead, which the centred codes keep from cancelling;
 * whether that pays here is for a GPU to measure.)
 */
template <typename T, int NV, int G>
__device__ __forceinline__ void attn_body(const kvs_attn_args &a, int prefill,
                                          uint32_t lanes, uint32_t span) {
  constexpr int VEC = Vec<T>::N;
  constexpr int E = NV * VEC;
  constexpr int NF = Vec<T>::NF;
  /* Token groups in flight: int8 keeps 3 (its minimum and the fma that
   * dequantizes values take the registers a fourth would need at two
   * blocks per SM; ptxas -v: no spill). */
  constexpr int U = NF == 2 ? 3 : UNR;
  extern __shared__ float smem[];
  const kvs_paged_kv &kv = a.kv;
  const uint32_t D = kv.head_dim;
  float *logits = smem;                    /* [G][PART] */
  float *red = logits + G * KVS__ATTN_PART; /* [G][D]: output accumulator */
  float *sq = red + G * D;                  /* [G][D]: q as floats */
  __shared__ float sm_m[G], sm_l[G], sm_qsum[G];

  const uint32_t row = blockIdx.x;
  uint32_t s, n;
  if (!prefill) {
    s = row;
    n = a.seq_lens[s];
  } else {
    uint32_t lo = 0, hi = a.num_seqs;
    while (hi - lo > 1) {
      uint32_t mid = (lo + hi) / 2;
      if (a.q_start[mid] <= row)
        lo = mid;
      else
        hi = mid;
    }
    s = lo;
    uint32_t len = a.seq_lens[s];
    uint32_t qlen = a.q_start[s + 1] - a.q_start[s];
    n = qlen > len ? 0 : len - qlen + (row - a.q_start[s]) + 1;
  }
  const uint32_t ratio = a.num_heads / kv.num_kv_heads;
  const uint32_t gchunks = (ratio + G - 1) / G;
  const uint32_t h = blockIdx.y / gchunks;
  const uint32_t hq0 = h * ratio + (blockIdx.y % gchunks) * G;
  const uint32_t ng = min((uint32_t)G, ratio - (blockIdx.y % gchunks) * G);
  uint32_t t0 = 0, t1 = n;
  if (span) {
    t0 = blockIdx.z * span;
    t1 = min(n, t0 + span);
    if (t0 >= t1)
      return; /* the merge kernel never reads this partition */
  }

  const uint32_t tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const uint32_t c = lane % lanes, sub = lane / lanes;
  const uint32_t tpw = 32 / lanes, tpc = NWARPS * tpw;
  const size_t es = sizeof(T), qes = kvs_dtype_size(a.qo_dtype);
  const uint32_t *bt = a.block_tables + (uint64_t)s * a.max_blocks_per_seq;
  const char *base = (const char *)kv.base;
  const uint64_t head_off = (uint64_t)h * kv.head_stride * es;
  const uint64_t tok_bytes = kv.token_stride * es;
  /* Block sizes are powers of two in practice: shift and mask then. */
  const bool bs_pow2 = (kv.block_size & (kv.block_size - 1)) == 0;
  const uint32_t bs_shift = __ffs(kv.block_size) - 1, bs_mask = kv.block_size - 1;

  /* q of the G heads, as floats, in shared memory: each phase 1 loads its
   * lane's slice into registers, so q and the value accumulators are never
   * live at the same time (registers decide how many blocks fit an SM). */
  const char *qrow0 = (const char *)a.q + ((uint64_t)row * a.num_heads + hq0) * D * qes;
  for (uint32_t i = tid; i < G * D; i += blockDim.x) {
    red[i] = 0.f;
    uint32_t g = i / D;
    sq[i] = g < ng ? ld_elem(qrow0, i, a.qo_dtype) : 0.f;
  }
  if (tid < G) {
    sm_m[tid] = -INFINITY;
    sm_l[tid] = 0.f;
  }
  __syncthreads();
  if (NF == 2) /* int8: keys are stored rotated, so q is rotated alike */
    hadamard_par<true>(sq, G, D, D, tid, blockDim.x, false);
  if (NF == 2) { /* int8: sum(q) of head `warp`, for lo * sum(q) */
    if (warp < G) {
      float x = 0.f;
      for (uint32_t d = lane; d < D; d += 32)
        x += sq[warp * D + d];
      for (int o = 16; o >= 1; o /= 2)
        x += __shfl_xor_sync(0xffffffffu, x, o);
      if (lane == 0)
        sm_qsum[warp] = x;
    }
    __syncthreads();
  }

  for (uint32_t c0 = t0; c0 < t1; c0 += KVS__ATTN_PART) {
    const uint32_t C = min(KVS__ATTN_PART, t1 - c0);

    /* Phase 1: scores of the chunk.  Each warp issues the loads of U
     * token groups before it uses any of them (bytes in flight). */
    {
      float q[G][E];
#pragma unroll
      for (int g = 0; g < G; g++)
#pragma unroll
        for (int v = 0; v < NV; v++)
#pragma unroll
          for (int k = 0; k < VEC; k += 4) {
            float4 t = *(const float4 *)&sq[g * D + (v * lanes + c) * VEC + k];
            q[g][v * VEC + k] = t.x;
            q[g][v * VEC + k + 1] = t.y;
            q[g][v * VEC + k + 2] = t.z;
            q[g][v * VEC + k + 3] = t.w;
          }
      for (uint32_t ib = warp * tpw; ib < C; ib += U * tpc) {
        uint4 raw[U][NV];
        float2 scl[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
          uint32_t idx = ib + u * tpc + sub;
          if (idx < C) {
            uint32_t j = c0 + idx;
            uint32_t bi = bs_pow2 ? j >> bs_shift : j / kv.block_size;
            uint32_t bo = bs_pow2 ? j & bs_mask : j % kv.block_size;
            const char *plane = base + (uint64_t)bt[bi] * kv.block_stride + kv.k_offset;
            const char *row_p = plane + bo * tok_bytes + head_off;
#pragma unroll
            for (int v = 0; v < NV; v++)
              raw[u][v] = __ldg(
                  (const uint4 *)(row_p + ((uint64_t)v * lanes + c) * 16));
            scl[u] = ld_scales<NF>(plane + kv.scale_offset +
                                   ((uint64_t)bo * kv.num_kv_heads + h) * (NF * 4));
          } else {
            /* zero bytes (int8 codes -128) and zero scales: a score of
             * 0, never stored (a slot past the row is not read, its
             * poison never loaded) */
#pragma unroll
            for (int v = 0; v < NV; v++)
              raw[u][v] = make_uint4(0, 0, 0, 0);
            scl[u] = make_float2(0.f, 0.f);
          }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
          uint32_t idx = ib + u * tpc + sub;
          float dotp[G];
#pragma unroll
          for (int g = 0; g < G; g++)
            dotp[g] = 0.f;
#pragma unroll
          for (int v = 0; v < NV; v++) {
            float f[VEC];
            Vec<T>::cvt(raw[u][v], f);
#pragma unroll
            for (int g = 0; g < G; g++)
#pragma unroll
              for (int k = 0; k < VEC; k++)
                dotp[g] += q[g][v * VEC + k] * f[k];
          }
          if (NF) {
#pragma unroll
            for (int g = 0; g < G; g++)
              dotp[g] *= scl[u].x;
          }
          if (G <= lanes) {
            /* Transposing butterfly: each step halves the values a lane
             * keeps (G/2 + G/4 + ... + 1 shuffles, then plain steps), and
             * lane c ends with head c / (lanes / G). */
#pragma unroll
            for (int st = 0, nv = G; nv > 1; st++, nv /= 2) {
              uint32_t o = lanes >> (st + 1);
              bool upper = (c & o) != 0;
#pragma unroll
              for (int i = 0; i < nv / 2; i++) {
                float send = upper ? dotp[i] : dotp[i + nv / 2];
                float keep = upper ? dotp[i + nv / 2] : dotp[i];
                dotp[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
              }
            }
            uint32_t per = lanes / G;
            for (uint32_t o = per / 2; o >= 1; o /= 2)
              dotp[0] += __shfl_xor_sync(0xffffffffu, dotp[0], o);
            if (idx < C && c % per == 0) {
              if (NF == 2)
                dotp[0] += scl[u].y * sm_qsum[c / per];
              logits[(c / per) * KVS__ATTN_PART + idx] = dotp[0] * a.scale;
            }
          } else {
#pragma unroll
            for (int g = 0; g < G; g++) {
              for (uint32_t o = lanes / 2; o >= 1; o /= 2)
                dotp[g] += __shfl_xor_sync(0xffffffffu, dotp[g], o);
              if (idx < C && c == 0)
                logits[g * KVS__ATTN_PART + idx] =
                    (NF == 2 ? dotp[g] + scl[u].y * sm_qsum[g] : dotp[g]) * a.scale;
            }
          }
        }
      }
    }
    __syncthreads();

    /* Phase 2: running max and sum, probabilities in place; warp g also
     * rescales the accumulated output row g to the new max. */
    if (warp < ng) {
      float *lg = logits + warp * KVS__ATTN_PART;
      float cm = -INFINITY;
      for (uint32_t k = lane; k < C; k += 32)
        cm = fmaxf(cm, lg[k]);
      for (int o = 16; o >= 1; o /= 2)
        cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, o));
      float m_old = sm_m[warp];
      float m_new = fmaxf(m_old, cm);
      float sum = 0.f;
      for (uint32_t k = lane; k < C; k += 32) {
        float p = expf(lg[k] - m_new);
        lg[k] = p;
        sum += p;
      }
      for (int o = 16; o >= 1; o /= 2)
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
      float sc = m_old == -INFINITY ? 0.f : expf(m_old - m_new);
      for (uint32_t d = lane; d < D; d += 32)
        red[warp * D + d] *= sc;
      __syncwarp();
      if (lane == 0) {
        sm_l[warp] = sm_l[warp] * sc + sum;
        sm_m[warp] = m_new;
      }
    }
    __syncthreads();

    /* Phase 3: weighted values of the chunk, then added into red. */
    {
      float acc[G][E];
#pragma unroll
      for (int g = 0; g < G; g++)
#pragma unroll
        for (int e = 0; e < E; e++)
          acc[g][e] = 0.f;
      for (uint32_t ib = warp * tpw; ib < C; ib += U * tpc) {
        uint4 raw[U][NV];
        float2 scl[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
          uint32_t idx = ib + u * tpc + sub;
          if (idx < C) {
            uint32_t j = c0 + idx;
            uint32_t bi = bs_pow2 ? j >> bs_shift : j / kv.block_size;
            uint32_t bo = bs_pow2 ? j & bs_mask : j % kv.block_size;
            const char *plane = base + (uint64_t)bt[bi] * kv.block_stride + kv.v_offset;
            const char *row_p = plane + bo * tok_bytes + head_off;
#pragma unroll
            for (int v = 0; v < NV; v++)
              raw[u][v] = __ldg(
                  (const uint4 *)(row_p + ((uint64_t)v * lanes + c) * 16));
            scl[u] = ld_scales<NF>(plane + kv.scale_offset +
                                   ((uint64_t)bo * kv.num_kv_heads + h) * (NF * 4));
          }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
          uint32_t idx = ib + u * tpc + sub;
          if (idx >= C)
            break;
          float p[G];
#pragma unroll
          for (int g = 0; g < G; g++)
            p[g] = logits[g * KVS__ATTN_PART + idx] * (NF == 1 ? scl[u].x : 1.f);
#pragma unroll
          for (int v = 0; v < NV; v++) {
            float f[VEC];
            Vec<T>::cvt(raw[u][v], f);
            if (NF == 2) {
#pragma unroll
              for (int k = 0; k < VEC; k++)
                f[k] = fmaf(f[k], scl[u].x, scl[u].y);
            }
#pragma unroll
            for (int g = 0; g < G; g++)
#pragma unroll
              for (int k = 0; k < VEC; k++)
                acc[g][v * VEC + k] += p[g] * f[k];
          }
        }
      }
      /* Sum over the tokens a warp's lanes held, then over warps. */
#pragma unroll
      for (int g = 0; g < G; g++)
#pragma unroll
        for (int e = 0; e < E; e++) {
          float x = acc[g][e];
          for (uint32_t o = lanes; o < 32; o *= 2)
            x += __shfl_xor_sync(0xffffffffu, x, o);
          acc[g][e] = x;
        }
      if (sub == 0) {
#pragma unroll
        for (int g = 0; g < G; g++)
          if (g < (int)ng)
#pragma unroll
            for (int v = 0; v < NV; v++)
#pragma unroll
              for (int k = 0; k < VEC; k++)
                atomicAdd(&red[g * D + (v * lanes + c) * VEC + k],
                          acc[g][v * VEC + k]);
      }
    }
    __syncthreads();
  }
  /* int8: the sum of rotated value rows, rotated back (linear, so the
   * split's partial sums may be rotated before the merge adds them). */
  if (NF == 2)
    hadamard_par<true>(red, G, D, D, tid, blockDim.x, false);

  if (span) {
    uint32_t P = gridDim.z;
    float *ws = (float *)a.workspace;
    uint64_t R = a.num_rows, H = a.num_heads;
    for (uint32_t i = tid; i < ng * D; i += blockDim.x) {
      uint32_t g = i / D, d = i % D;
      uint64_t cell = ((uint64_t)row * H + hq0 + g) * P + blockIdx.z;
      ws[2 * R * H * P + cell * D + d] = red[g * D + d];
    }
    if (tid < ng) {
      uint64_t cell = ((uint64_t)row * H + hq0 + tid) * P + blockIdx.z;
      ws[cell] = sm_m[tid];
      ws[R * H * P + cell] = sm_l[tid];
    }
  } else {
    for (uint32_t i = tid; i < ng * D; i += blockDim.x) {
      uint32_t g = i / D, d = i % D;
      float v = n ? red[g * D + d] / sm_l[g] : 0.f;
      st_elem(a.out, ((uint64_t)row * a.num_heads + hq0 + g) * D + d,
              a.qo_dtype, v);
    }
  }
}

/* Blocks per SM each instantiation is built for: fewer live values per
 * lane (G query heads x E elements) leave room for more. */
#define KVS_ATTN_W(T, NV, G) ((G) * (NV) * (16 / (int)sizeof(T)))
#define KVS_ATTN_MINB(T, NV, G)                                  \
  (Vec<T>::NF ? ((NV) == 1 && (G) <= 4 ? 2 : 1)                   \
   : (NV) == 1 ? (KVS_ATTN_W(T, NV, G) <= 32 ? 3 : KVS_ATTN_W(T, NV, G) <= 64 ? 2 : 1) \
               : (KVS_ATTN_W(T, NV, G) <= 32 ? 2 : 1))

#define KVS_ATTN_INST(NAME, T, NV, G)                                        \
  extern "C" __global__ void __launch_bounds__(                             \
      KVS__ATTN_THREADS, KVS_ATTN_MINB(T, NV, G))                           \
      kvs_attn_##NAME##_nv##NV##_g##G(kvs_attn_args a, int prefill,          \
                                      uint32_t lanes, uint32_t span) {       \
    attn_body<T, NV, G>(a, prefill, lanes, span);                            \
  }
#define KVS_ATTN_INST_G(NAME, T, NV) \
  KVS_ATTN_INST(NAME, T, NV, 1)      \
  KVS_ATTN_INST(NAME, T, NV, 2)      \
  KVS_ATTN_INST(NAME, T, NV, 4)      \
  KVS_ATTN_INST(NAME, T, NV, 8)
#define KVS_ATTN_INST_NV(NAME, T) \
  KVS_ATTN_INST_G(NAME, T, 1)     \
  KVS_ATTN_INST_G(NAME, T, 2)

KVS_ATTN_INST_NV(fp32, float)
KVS_ATTN_INST_NV(fp16, __half)
KVS_ATTN_INST_NV(bf16, __nv_bfloat16)
/* int8 / fp8: 16 codes per vector, so the lanes hold twice the values of
 * fp16 (and the scales): two blocks per SM up to 4 query heads, one for 8;
 * head_dim 1024 (two vectors per lane) takes up to 4 heads per block (8
 * would spill), which the launcher respects. */
#define KVS_ATTN_INST_Q(NAME, T) \
  KVS_ATTN_INST_G(NAME, T, 1)    \
  KVS_ATTN_INST(NAME, T, 2, 1)   \
  KVS_ATTN_INST(NAME, T, 2, 2)   \
  KVS_ATTN_INST(NAME, T, 2, 4)
KVS_ATTN_INST_Q(int8, KvInt8)
KVS_ATTN_INST_Q(fp8, KvFp8)

/* ---- attention on tensor cores (GQA, 16-bit caches) ---------------------------- */

/* D = A.B + C, m16n8k16, A row-major 16x16, B column-major 16x8, fp32 C/D. */
template <typename T> struct Mma;
template <> struct Mma<__half> {
  static __device__ __forceinline__ void run(float *d, uint32_t a0, uint32_t a1,
                                             uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *(uint32_t *)&h;
  }
};
template <> struct Mma<__nv_bfloat16> {
  static __device__ __forceinline__ void run(float *d, uint32_t a0, uint32_t a1,
                                             uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&h;
  }
};

__device__ __forceinline__ uint32_t u4_get(const uint4 &v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/*
 * Same contract and grid as attn_body, for q/out and cache of the same 16-bit
 * dtype, head_dim D (64 or 128) and up to 8 query heads per block (rows of
 * the 16-row tensor-core tiles; the others are zero).  Lane (g, t) = (lane /
 * 4, lane % 4).
 *
 * Scores S = Q K^T, m16n8k16 per 16 dimensions: a warp takes 8 tokens; lane
 * (g, t) loads 16-byte pieces t, t+4, ... of token g's key row, and the
 * reduction index k is mapped onto dimensions so that those pieces are its B
 * fragments as loaded (Q's fragments use the same map).  S[head g][tokens 2t,
 * 2t+1] comes out in lane (g, t).
 *
 * Values O^T += V^T P^T, m16n8k16 per 16 tokens: rows are dimensions, columns
 * the 8 heads.  Lane (g, t) loads dims [8g', 8g'+8) (g' = g, g+8) of tokens
 * 2t, 2t+1, 2t+8, 2t+9 and pairs the two tokens' halves with byte permutes;
 * row g of tile (v, m) is dimension 8(g + 8v) + 2m, row g+8 the next one.
 * The probabilities are rounded to the cache dtype for the product (as flash
 * attention does); sums, max and accumulators stay fp32.
 */
template <typename T, int D>
__device__ __forceinline__ void attn_mma_body(const kvs_attn_args &a, int prefill,
                                              uint32_t span) {
  constexpr int G = 8;
  constexpr int NC = D / 32; /* 16-byte pieces per lane in a key row */
  constexpr int NVD = D / 64; /* value vectors per token per lane */
  extern __shared__ float smem[];
  const kvs_paged_kv &kv = a.kv;
  float *logits = smem;                     /* [G][PART] */
  float *red = logits + G * KVS__ATTN_PART; /* [G][D] */
  __shared__ float sm_m[G], sm_l[G], sm_scale[G];

  const uint32_t row = blockIdx.x;
  uint32_t s, n;
  if (!prefill) {
    s = row;
    n = a.seq_lens[s];
  } else {
    uint32_t lo = 0, hi = a.num_seqs;
    while (hi - lo > 1) {
      uint32_t mid = (lo + hi) / 2;
      if (a.q_start[mid] <= row)
        lo = mid;
      else
        hi = mid;
    }
    s = lo;
    uint32_t len = a.seq_lens[s];
    uint32_t qlen = a.q_start[s + 1] - a.q_start[s];
    n = qlen > len ? 0 : len - qlen + (row - a.q_start[s]) + 1;
  }
  const uint32_t ratio = a.num_heads / kv.num_kv_heads;
  const uint32_t gchunks = (ratio + G - 1) / G;
  const uint32_t h = blockIdx.y / gchunks;
  const uint32_t hq0 = h * ratio + (blockIdx.y % gchunks) * G;
  const uint32_t ng = min((uint32_t)G, ratio - (blockIdx.y % gchunks) * G);
  uint32_t t0 = 0, t1 = n;
  if (span) {
    t0 = blockIdx.z * span;
    t1 = min(n, t0 + span);
    if (t0 >= t1)
      return;
  }
  const uint32_t tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const uint32_t g = lane / 4, t = lane % 4;
  const uint32_t *bt = a.block_tables + (uint64_t)s * a.max_blocks_per_seq;
  const char *base = (const char *)kv.base;
  const uint64_t head_off = (uint64_t)h * kv.head_stride * 2;
  const uint64_t tok_bytes = kv.token_stride * 2;
  const bool bs_pow2 = (kv.block_size & (kv.block_size - 1)) == 0;
  const uint32_t bs_shift = __ffs(kv.block_size) - 1, bs_mask = kv.block_size - 1;

  for (uint32_t i = tid; i < G * D; i += blockDim.x)
    red[i] = 0.f;
  if (tid < G) {
    sm_m[tid] = -INFINITY;
    sm_l[tid] = 0.f;
  }

  /* Q fragments: head g, pieces t + 4i of its row. */
  uint4 qf[NC];
  {
    const char *qrow = (const char *)a.q + ((uint64_t)row * a.num_heads + hq0 + g) * D * 2;
#pragma unroll
    for (int i = 0; i < NC; i++)
      qf[i] = g < ng ? *(const uint4 *)(qrow + (t + 4 * i) * 16) : make_uint4(0, 0, 0, 0);
  }
  float o[2 * NVD * 4][4]; /* value tiles (v, m) */
#pragma unroll
  for (int i = 0; i < 2 * NVD * 4; i++)
    o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  __syncthreads();

  for (uint32_t c0 = t0; c0 < t1; c0 += KVS__ATTN_PART) {
    const uint32_t C = min(KVS__ATTN_PART, t1 - c0);

    /* Phase 1: two 8-token tiles per warp per step. */
    for (uint32_t tb = warp * 16; tb < C; tb += NWARPS * 16) {
      uint4 kr[2][NC];
#pragma unroll
      for (int u = 0; u < 2; u++) {
        uint32_t idx = tb + u * 8 + g;
        if (idx < C) {
          uint32_t j = c0 + idx;
          uint32_t bi = bs_pow2 ? j >> bs_shift : j / kv.block_size;
          uint32_t bo = bs_pow2 ? j & bs_mask : j % kv.block_size;
          const char *rp = base + (uint64_t)bt[bi] * kv.block_stride + kv.k_offset +
                           bo * tok_bytes + head_off;
#pragma unroll
          for (int i = 0; i < NC; i++)
            kr[u][i] = __ldg((const uint4 *)(rp + (t + 4 * i) * 16));
        } else {
#pragma unroll
          for (int i = 0; i < NC; i++)
            kr[u][i] = make_uint4(0, 0, 0, 0);
        }
      }
#pragma unroll
      for (int u = 0; u < 2; u++) {
        float sc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int i = 0; i < NC; i++)
#pragma unroll
          for (int hh = 0; hh < 2; hh++)
            Mma<T>::run(sc, u4_get(qf[i], 2 * hh), 0u, u4_get(qf[i], 2 * hh + 1), 0u,
                        u4_get(kr[u][i], 2 * hh), u4_get(kr[u][i], 2 * hh + 1));
        uint32_t idx = tb + u * 8 + 2 * t;
        if (g < ng) {
          if (idx < C)
            logits[g * KVS__ATTN_PART + idx] = sc[0] * a.scale;
          if (idx + 1 < C)
            logits[g * KVS__ATTN_PART + idx + 1] = sc[1] * a.scale;
        }
      }
    }
    __syncthreads();

    /* Phase 2: running max and sum, probabilities in place. */
    if (warp < ng) {
      float *lg = logits + warp * KVS__ATTN_PART;
      float cm = -INFINITY;
      for (uint32_t k = lane; k < C; k += 32)
        cm = fmaxf(cm, lg[k]);
      for (int of = 16; of >= 1; of /= 2)
        cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, of));
      float m_old = sm_m[warp];
      float m_new = fmaxf(m_old, cm);
      float sum = 0.f;
      for (uint32_t k = lane; k < C; k += 32) {
        float p = expf(lg[k] - m_new);
        lg[k] = p;
        sum += p;
      }
      for (int of = 16; of >= 1; of /= 2)
        sum += __shfl_xor_sync(0xffffffffu, sum, of);
      __syncwarp();
      if (lane == 0) {
        float sc = m_old == -INFINITY ? 0.f : expf(m_old - m_new);
        sm_scale[warp] = sc;
        sm_l[warp] = sm_l[warp] * sc + sum;
        sm_m[warp] = m_new;
      }
    } else if (warp < G && tid % 32 == 0) {
      sm_scale[warp] = 0.f;
    }
    __syncthreads();

    /* Phase 3: O^T += V^T P^T, 16 tokens per step. */
    {
      float s0 = sm_scale[2 * t], s1 = sm_scale[2 * t + 1];
#pragma unroll
      for (int i = 0; i < 2 * NVD * 4; i++) {
        o[i][0] *= s0;
        o[i][1] *= s1;
        o[i][2] *= s0;
        o[i][3] *= s1;
      }
    }
    for (uint32_t kb = warp * 16; kb < C; kb += NWARPS * 16) {
      uint4 vr[4][NVD]; /* tokens 2t, 2t+1, 2t+8, 2t+9 */
#pragma unroll
      for (int r = 0; r < 4; r++) {
        uint32_t idx = kb + 2 * t + (r & 1) + (r >> 1) * 8;
        if (idx < C) {
          uint32_t j = c0 + idx;
          uint32_t bi = bs_pow2 ? j >> bs_shift : j / kv.block_size;
          uint32_t bo = bs_pow2 ? j & bs_mask : j % kv.block_size;
          const char *rp = base + (uint64_t)bt[bi] * kv.block_stride + kv.v_offset +
                           bo * tok_bytes + head_off;
#pragma unroll
          for (int v = 0; v < NVD; v++)
            vr[r][v] = __ldg((const uint4 *)(rp + (g + 8 * v) * 16));
        } else {
#pragma unroll
          for (int v = 0; v < NVD; v++)
            vr[r][v] = make_uint4(0, 0, 0, 0);
        }
      }
      /* P^T fragments: head g, tokens 2t, 2t+1 and 2t+8, 2t+9. */
      float p[4];
#pragma unroll
      for (int r = 0; r < 4; r++) {
        uint32_t idx = kb + 2 * t + (r & 1) + (r >> 1) * 8;
        p[r] = (g < ng && idx < C) ? logits[g * KVS__ATTN_PART + idx] : 0.f;
      }
      uint32_t b0 = Mma<T>::pack(p[0], p[1]), b1 = Mma<T>::pack(p[2], p[3]);
#pragma unroll
      for (int v = 0; v < NVD; v++)
#pragma unroll
        for (int m = 0; m < 4; m++) {
          uint32_t x0 = u4_get(vr[0][v], m), x1 = u4_get(vr[1][v], m);
          uint32_t x8 = u4_get(vr[2][v], m), x9 = u4_get(vr[3][v], m);
          Mma<T>::run(o[v * 4 + m], __byte_perm(x0, x1, 0x5410),
                      __byte_perm(x0, x1, 0x7632), __byte_perm(x8, x9, 0x5410),
                      __byte_perm(x8, x9, 0x7632), b0, b1);
        }
    }
    __syncthreads();
  }

  /* Columns 2t, 2t+1 are heads; rows dims 8(g + 8v) + 2m (+1). */
#pragma unroll
  for (int v = 0; v < NVD; v++)
#pragma unroll
    for (int m = 0; m < 4; m++) {
      uint32_t d = 8 * (g + 8 * v) + 2 * m;
      if (2 * t < ng) {
        atomicAdd(&red[(2 * t) * D + d], o[v * 4 + m][0]);
        atomicAdd(&red[(2 * t) * D + d + 1], o[v * 4 + m][2]);
      }
      if (2 * t + 1 < ng) {
        atomicAdd(&red[(2 * t + 1) * D + d], o[v * 4 + m][1]);
        atomicAdd(&red[(2 * t + 1) * D + d + 1], o[v * 4 + m][3]);
      }
    }
  __syncthreads();

  if (span) {
    uint32_t P = gridDim.z;
    float *ws = (float *)a.workspace;
    uint64_t R = a.num_rows, H = a.num_heads;
    for (uint32_t i = tid; i < ng * D; i += blockDim.x) {
      uint32_t gg = i / D, d = i % D;
      uint64_t cell = ((uint64_t)row * H + hq0 + gg) * P + blockIdx.z;
      ws[2 * R * H * P + cell * D + d] = red[gg * D + d];
    }
    if (tid < ng) {
      uint64_t cell = ((uint64_t)row * H + hq0 + tid) * P + blockIdx.z;
      ws[cell] = sm_m[tid];
      ws[R * H * P + cell] = sm_l[tid];
    }
  } else {
    for (uint32_t i = tid; i < ng * D; i += blockDim.x) {
      uint32_t gg = i / D, d = i % D;
      float v = n ? red[gg * D + d] / sm_l[gg] : 0.f;
      st_elem(a.out, ((uint64_t)row * a.num_heads + hq0 + gg) * D + d, a.qo_dtype, v);
    }
  }
}

#define KVS_ATTN_MMA_INST(NAME, T, D)                                          \
  extern "C" __global__ void __launch_bounds__(KVS__ATTN_THREADS, 2)          \
      kvs_attn_mma_##NAME##_d##D(kvs_attn_args a, int prefill, uint32_t span) { \
    attn_mma_body<T, D>(a, prefill, span);                                     \
  }
KVS_ATTN_MMA_INST(fp16, __half, 64)
KVS_ATTN_MMA_INST(fp16, __half, 128)
KVS_ATTN_MMA_INST(bf16, __nv_bfloat16, 64)
KVS_ATTN_MMA_INST(bf16, __nv_bfloat16, 128)

/* Merge the partitions of a split row: grid (row, query head). */
/* One (row, query head) per block: out from the partials of its splits
 * (those of the row's keys, ceil(keys / span); none: zeros). */
__device__ __forceinline__ void attn_merge_body(const kvs_attn_args &a, int prefill,
                                                uint32_t parts, uint32_t span) {
  const uint32_t row = blockIdx.x, hq = blockIdx.y;
  const uint32_t D = a.kv.head_dim;
  uint32_t n;
  if (!prefill) {
    n = a.seq_lens[row];
  } else {
    uint32_t lo = 0, hi = a.num_seqs;
    while (hi - lo > 1) {
      uint32_t mid = (lo + hi) / 2;
      if (a.q_start[mid] <= row)
        lo = mid;
      else
        hi = mid;
    }
    uint32_t len = a.seq_lens[lo];
    uint32_t qlen = a.q_start[lo + 1] - a.q_start[lo];
    n = qlen > len ? 0 : len - qlen + (row - a.q_start[lo]) + 1;
  }
  /* (at most the partitions the workspace holds, should a length break
   * the max_seq_len contract the host cannot check: no read past it) */
  const uint32_t np = min((n + span - 1) / span, parts);
  const float *ws = (const float *)a.workspace;
  const uint64_t R = a.num_rows, H = a.num_heads;
  const uint64_t cell0 = ((uint64_t)row * H + hq) * parts;
  float M = -INFINITY;
  for (uint32_t p = 0; p < np; p++)
    M = fmaxf(M, ws[cell0 + p]);
  float L = 0.f;
  for (uint32_t p = 0; p < np; p++)
    L += ws[R * H * parts + cell0 + p] * expf(ws[cell0 + p] - M);
  for (uint32_t d = threadIdx.x; d < D; d += blockDim.x) {
    float x = 0.f;
    for (uint32_t p = 0; p < np; p++)
      x += ws[2 * R * H * parts + (cell0 + p) * D + d] *
           expf(ws[cell0 + p] - M);
    st_elem(a.out, ((uint64_t)row * H + hq) * D + d, a.qo_dtype,
            np ? x / L : 0.f);
  }
}

extern "C" __global__ void kvs_attn_merge_kernel(kvs_attn_args a, int prefill,
                                                 uint32_t parts, uint32_t span) {
  attn_merge_body(a, prefill, parts, span);
}

/* ---- prefill on tensor cores, many rows per CTA -------------------------------- */

#include "kernels_prefill.cuh"
