/*
 * kernels_common.c — what both backends share: dtype conversion, the paged
 * view of a layer, argument checks, workspace size.
 */
#include <math.h>
#include <string.h>

#include "kvs_kernels_int.h"
#include "kvs_status.h"

static inline uint32_t f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static inline float u2f(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

float kvs_fp16_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t em = h & 0x7fffu;
  uint32_t bits;
  if (em >= 0x7c00u) /* inf or NaN: keep the payload, max the exponent */
    bits = (em << 13) | 0x7f800000u;
  else /* normal and subnormal: rebias the exponent by multiplying by 2^112 */
    bits = f2u(u2f(em << 13) * 0x1p112f);
  return u2f(bits | sign);
}

uint16_t kvs_float_to_fp16(float f) {
  uint32_t x = f2u(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) /* inf stays inf; NaN becomes a quiet NaN */
    return sign | (x > 0x7f800000u ? (uint16_t)(0x7e00u | ((x >> 13) & 0x3ffu))
                                   : (uint16_t)0x7c00u);
  if (x >= 0x477ff000u) /* >= 65520 rounds to inf */
    return sign | 0x7c00u;
  if (x < 0x38800000u) {
    /* Result is subnormal or zero: adding 0.5 places the half's ULP at the
     * float's last mantissa bit, so the FPU rounds to nearest even for us. */
    uint32_t r = f2u(u2f(x) + 0.5f) - f2u(0.5f);
    return sign | (uint16_t)r;
  }
  /* Normal: rebias the exponent, then round the 13 dropped bits to even. */
  uint32_t odd = (x >> 13) & 1u;
  x += ((uint32_t)(15 - 127) << 23) + 0xfffu + odd;
  return sign | (uint16_t)(x >> 13);
}

float kvs_bf16_to_float(uint16_t b) { return u2f((uint32_t)b << 16); }

uint16_t kvs_float_to_bf16(float f) {
  uint32_t x = f2u(f);
  if ((x & 0x7fffffffu) > 0x7f800000u)
    return (uint16_t)((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

/* ---- fp8 e4m3 and the per-row quantizer ----------------------------------- */

float kvs_fp8_to_float(uint8_t b) {
  uint32_t e = (b >> 3) & 15u, m = b & 7u;
  float v;
  if (e == 15 && m == 7)
    v = u2f(0x7fc00000u);
  else if (e == 0)
    v = (float)m * 0x1p-9f; /* subnormal: m/8 * 2^-6 */
  else
    v = u2f(((e + 120u) << 23) | (m << 20)); /* rebias 7 -> 127 */
  return (b & 0x80u) ? -v : v;
}

uint8_t kvs_float_to_fp8(float f) {
  uint32_t x = f2u(f);
  uint8_t sign = (uint8_t)((x >> 24) & 0x80u);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) /* NaN */
    return sign | 0x7fu;
  if (x >= 0x43e80000u) /* >= 464 (inf included): 448 wins or saturates */
    return sign | 0x7eu;
  if (x < 0x3c800000u) { /* below 2^-6: subnormal or zero, steps of 2^-9 */
    /* Adding 2^14 makes the sum's last mantissa bit worth 2^-9, so the FPU
     * rounds to nearest even for us; 8 steps (2^-6) is the smallest normal,
     * whose code (0x08) follows 0x07. */
    uint32_t r = f2u(u2f(x) + 0x1p14f) - f2u(0x1p14f);
    return sign | (uint8_t)r;
  }
  /* Normal: round the 20 dropped mantissa bits to even, then rebias. */
  uint32_t odd = (x >> 20) & 1u;
  x += 0x7ffffu + odd;
  uint32_t code = (x >> 20) - (120u << 3);
  return sign | (uint8_t)(code > 0x7eu ? 0x7eu : code);
}

typedef float kvs__v4f __attribute__((vector_size(16)));

/* The butterflies at distances 1, 2 and 4 of 8 elements at z, each the
 * same float32 operation as the loop's. */
static inline void hadamard8(float *z) {
  const float a0 = z[0] + z[1], a1 = z[0] - z[1], a2 = z[2] + z[3],
              a3 = z[2] - z[3], a4 = z[4] + z[5], a5 = z[4] - z[5],
              a6 = z[6] + z[7], a7 = z[6] - z[7];
  const float b0 = a0 + a2, b2 = a0 - a2, b1 = a1 + a3, b3 = a1 - a3,
              b4 = a4 + a6, b6 = a4 - a6, b5 = a5 + a7, b7 = a5 - a7;
  z[0] = b0 + b4, z[4] = b0 - b4, z[1] = b1 + b5, z[5] = b1 - b5;
  z[2] = b2 + b6, z[6] = b2 - b6, z[3] = b3 + b7, z[7] = b3 - b7;
}

void kvs__hadamard(float *x, uint32_t n, int down) {
  for (uint32_t off = 0; off < n;) {
    const uint32_t m = kvs__hadamard_seg(n, off);
    float *y = x + off;
    if (m < 8) { /* (m = 1, 2 or 4) */
      for (uint32_t h = 1; h < m; h *= 2)
        for (uint32_t i = 0; i < m; i += 2 * h)
          for (uint32_t j = i; j < i + h; j++) {
            const float a = y[j], b = y[j + h];
            y[j] = a + b;
            y[j + h] = a - b;
          }
    } else { /* distances 1, 2, 4 in registers, 8 elements at a time; the
                longer ones four pairs at once (vectors: the same roundings) */
      for (uint32_t i = 0; i < m; i += 8)
        hadamard8(y + i);
      for (uint32_t h = 8; h < m; h *= 2)
        for (uint32_t i = 0; i < m; i += 2 * h)
          for (uint32_t j = i; j < i + h; j += 4) {
            kvs__v4f a, b;
            memcpy(&a, y + j, sizeof a);
            memcpy(&b, y + j + h, sizeof b);
            const kvs__v4f s = a + b, d = a - b;
            memcpy(y + j, &s, sizeof s);
            memcpy(y + j + h, &d, sizeof d);
          }
    }
    if (down && m > 1) {
      const float inv = 1.f / (float)m;
      for (uint32_t j = 0; j < m; j++)
        y[j] *= inv;
    }
    off += m;
  }
}

/* int8, asymmetric, of the row rotated (kvs__hadamard, down): scales[0] =
 * (max - min) / 255, scales[1] = min, byte i = round_even((y[i] - min) /
 * scale) in 0..255, y the rotated row. */
static void quantize_int8(uint8_t *dst, float *scales, const float *row,
                          size_t n) {
  float buf[KVS__QROW_MAX];
  memcpy(buf, row, n * sizeof(float));
  kvs__hadamard(buf, (uint32_t)n, 1);
  const float *src = buf;
  float lo = n ? src[0] : 0.f, hi = lo;
  int bad = 0;
  for (size_t i = 0; i < n; i++) {
    bad |= !(src[i] - src[i] == 0.f); /* NaN or infinite */
    lo = src[i] < lo ? src[i] : lo;
    hi = src[i] > hi ? src[i] : hi;
  }
  float range = hi - lo;
  bad |= !(range <= 0x1.fffffep127f); /* the range overflows float32 */
  float s = bad ? 0.f : range / 255.f;
  if (bad || s == 0.f) { /* constant (or next to constant) row: reads as min */
    memset(dst, 0, n);
    scales[0] = bad ? u2f(0x7fc00000u) : 0.f;
    scales[1] = bad ? u2f(0x7fc00000u) : lo;
    return;
  }
  scales[0] = s;
  scales[1] = lo;
  for (size_t i = 0; i < n; i++) {
    float r = rintf((src[i] - lo) / s); /* nearest even (the default mode) */
    dst[i] = (uint8_t)(r > 255.f ? 255.f : r < 0.f ? 0.f : r);
  }
}

/* fp8 e4m3: scales[0] = amax / 448, byte i = kvs_float_to_fp8(src[i] /
 * scale). */
static void quantize_fp8(uint8_t *dst, float *scales, const float *src,
                         size_t n) {
  float amax = 0.f;
  int bad = 0;
  for (size_t i = 0; i < n; i++) {
    float a = src[i] < 0.f ? -src[i] : src[i];
    bad |= !(a <= 0x1.fffffep127f); /* NaN or infinite */
    amax = a > amax ? a : amax;
  }
  float s = bad ? 0.f : amax / 448.f;
  if (bad || s == 0.f) {
    memset(dst, 0, n);
    scales[0] = bad ? u2f(0x7fc00000u) : 0.f;
    return;
  }
  scales[0] = s;
  for (size_t i = 0; i < n; i++)
    dst[i] = kvs_float_to_fp8(src[i] / s);
}

int kvs_quantize_row(void *dst, float *scales, uint32_t dtype,
                     const float *src, size_t n) {
  if (!kvs_dtype_quantized(dtype) || !scales || (n && (!dst || !src)) ||
      n > KVS__QROW_MAX)
    return KVS_EINVAL;
  if (dtype == KVS_DTYPE_INT8)
    quantize_int8(dst, scales, src, n);
  else
    quantize_fp8(dst, scales, src, n);
  return 0;
}

int kvs_convert(void *dst, uint32_t dst_dtype, const void *src,
                uint32_t src_dtype, size_t n) {
  if (kvs_dtype_size(dst_dtype) == 0 || kvs_dtype_size(src_dtype) == 0 ||
      kvs_dtype_quantized(dst_dtype) || kvs_dtype_quantized(src_dtype) ||
      (n && (!dst || !src)))
    return KVS_EINVAL;
  if (dst_dtype == src_dtype) {
    memmove(dst, src, n * kvs_dtype_size(src_dtype));
    return 0;
  }
  const float *sf = src;
  const uint16_t *sh = src;
  float *df = dst;
  uint16_t *dh = dst;
  for (size_t i = 0; i < n; i++) {
    float v;
    switch (src_dtype) {
    case KVS_DTYPE_FP32:
      v = sf[i];
      break;
    case KVS_DTYPE_FP16:
      v = kvs_fp16_to_float(sh[i]);
      break;
    default:
      v = kvs_bf16_to_float(sh[i]);
      break;
    }
    switch (dst_dtype) {
    case KVS_DTYPE_FP32:
      df[i] = v;
      break;
    case KVS_DTYPE_FP16:
      dh[i] = kvs_float_to_fp16(v);
      break;
    default:
      dh[i] = kvs_float_to_bf16(v);
      break;
    }
  }
  return 0;
}

int kvs_paged_kv_init(kvs_paged_kv *kv, void *base, const kvs_layout *l,
                      uint32_t layer) {
  if (!kv || !l || layer >= l->num_layers || kvs_dtype_size(l->dtype) == 0 ||
      l->block_stride < kvs_block_bytes(l) || l->block_size == 0)
    return KVS_EINVAL;
  memset(kv, 0, sizeof *kv);
  kv->base = base;
  kv->block_stride = l->block_stride;
  kv->k_offset = kvs_plane_offset(l, layer, 0);
  kv->v_offset = kvs_plane_offset(l, layer, 1);
  kv->token_stride = kvs_token_stride(l);
  kv->head_stride = kvs_head_stride(l);
  kv->block_size = l->block_size;
  kv->num_kv_heads = l->num_kv_heads;
  kv->head_dim = l->head_dim;
  kv->dtype = l->dtype;
  kv->num_blocks = l->num_blocks;
  kv->scale_offset =
      kvs_dtype_quantized(l->dtype) ? (uint32_t)kvs_scale_offset(l) : 0;
  return 0;
}

int kvs__check_paged_kv(const kvs_paged_kv *kv) {
  if (!kv->base || kv->block_size == 0 || kv->num_kv_heads == 0 ||
      kv->head_dim == 0 || kvs_dtype_size(kv->dtype) == 0 ||
      kv->head_stride < kv->head_dim ||
      kv->token_stride < (uint64_t)kv->head_stride * kv->num_kv_heads)
    return KVS_EINVAL;
  /* int8 rows are rotated whole (kvs__hadamard): at most KVS__QROW_MAX
   * elements, the layout's own limit, on both backends. */
  if (kv->dtype == KVS_DTYPE_INT8 && kv->head_dim > KVS__QROW_MAX)
    return KVS_EINVAL;
  /* Quantized: the scales follow the plane's last element, 4-byte aligned. */
  if (kvs_dtype_quantized(kv->dtype) &&
      (kv->scale_offset % 4 ||
       kv->scale_offset < (uint64_t)(kv->block_size - 1) * kv->token_stride +
                              (uint64_t)(kv->num_kv_heads - 1) * kv->head_stride +
                              kv->head_dim))
    return KVS_EINVAL;
  return 0;
}

int kvs__check_attn(const kvs_attn_args *a, int prefill) {
  if (!a || kvs__check_paged_kv(&a->kv) || kvs_dtype_size(a->qo_dtype) == 0 ||
      kvs_dtype_quantized(a->qo_dtype) ||
      a->num_heads == 0 || a->num_heads % a->kv.num_kv_heads != 0)
    return KVS_EINVAL;
  if (a->num_seqs == 0)
    return 0;
  if (!a->q || !a->out || !a->seq_lens || !a->block_tables ||
      a->max_blocks_per_seq == 0)
    return KVS_EINVAL;
  if (prefill ? !a->q_start : a->num_rows != a->num_seqs)
    return KVS_EINVAL;
  if ((uint64_t)a->max_blocks_per_seq * a->kv.block_size < a->max_seq_len)
    return KVS_EINVAL;
  return 0;
}

uint64_t kvs_attn_workspace_bytes(const kvs_attn_args *a) {
  uint32_t parts = kvs__attn_parts(a->max_seq_len);
  if (parts <= 1)
    return 0;
  return 4 * kvs__attn_ws_floats(a->num_rows, a->num_heads, parts,
                                 a->kv.head_dim);
}

static const kvs_kernels cpu_table = {
    .name = "cpu",
    .write_kv = kvs_cpu_write_kv,
    .decode_attention = kvs_cpu_decode_attention,
    .prefill_attention = kvs_cpu_prefill_attention,
    .copy_blocks = kvs_cpu_copy_blocks,
    .gather_blocks = kvs_cpu_gather_blocks,
    .scatter_blocks = kvs_cpu_scatter_blocks,
};

const kvs_kernels *kvs_kernels_cpu(void) { return &cpu_table; }
