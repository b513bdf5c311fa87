/*
 * kernels_cpu.c — the C twins of the CUDA kernels: write K/V into slots,
 * paged decode/prefill attention (GQA, fp32 accumulation), block copy,
 * gather/scatter of whole blocks.  See kvs_kernels.h for the semantics.
 *
 * Attention reads each key and value row of a kv head once per query row and
 * uses it for every query head of the group, so the K/V bytes are read once
 * per decode step; rows are converted to fp32 as they are read.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvs_kernels_int.h"
#include "kvs_status.h"

/* The helpers below are always inlined so that the attention body compiles
 * once for the baseline ISA and once for AVX2+FMA (chosen at run time). */
#define KVS_INLINE static inline __attribute__((always_inline))

KVS_INLINE uint32_t f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

KVS_INLINE float u2f(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* fp16 bits -> float, exact, branch-free (vectorisable); same result as
 * kvs_fp16_to_float. */
KVS_INLINE float h2f(uint16_t h) {
  uint32_t em = h & 0x7fffu;
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t fin = f2u(u2f(em << 13) * 0x1p112f);
  uint32_t inf = (em << 13) | 0x7f800000u;
  uint32_t big = 0u - (uint32_t)(em >= 0x7c00u); /* all ones for inf/NaN */
  return u2f((inf & big) | (fin & ~big) | sign);
}

/* fp8 e4m3 bits -> float, exact, branch-free; same result as
 * kvs_fp8_to_float.  The 7 bits below the sign, moved to the top of a
 * float's exponent and mantissa, rebias by 2^120 (subnormals included). */
KVS_INLINE float e4m3f(uint8_t b) {
  uint32_t em = b & 0x7fu;
  uint32_t sign = (uint32_t)(b & 0x80u) << 24;
  uint32_t fin = f2u(u2f(em << 20) * 0x1p120f);
  uint32_t nan = 0u - (uint32_t)(em == 0x7fu);
  return u2f((0x7fc00000u & nan) | (fin & ~nan) | sign);
}

/* One quantized row of n bytes with its scales -> floats: int8 byte *
 * scale + lo (the byte unsigned), fp8 value * scale. */
KVS_INLINE void load_row_q(float *restrict dst, const void *restrict src,
                           uint32_t dtype, uint32_t n, const float *sc) {
  const uint8_t *s = src;
  if (dtype == KVS_DTYPE_INT8) {
    float scale = sc[0], lo = sc[1];
    for (uint32_t i = 0; i < n; i++)
      dst[i] = (float)s[i] * scale + lo;
  } else {
    float scale = sc[0];
    for (uint32_t i = 0; i < n; i++)
      dst[i] = e4m3f(s[i]) * scale;
  }
}

/* Bits -> float for one row of n elements. */
KVS_INLINE void load_row(float *restrict dst, const void *restrict src,
                         uint32_t dtype, uint32_t n) {
  if (dtype == KVS_DTYPE_FP32) {
    memcpy(dst, src, (size_t)n * 4);
  } else if (dtype == KVS_DTYPE_BF16) {
    const uint16_t *s = src;
    uint32_t *d = (uint32_t *)(void *)dst;
    for (uint32_t i = 0; i < n; i++)
      d[i] = (uint32_t)s[i] << 16;
  } else {
    const uint16_t *s = src;
    for (uint32_t i = 0; i < n; i++)
      dst[i] = h2f(s[i]);
  }
}

static void store_row(void *restrict dst, uint32_t dtype,
                      const float *restrict src, uint32_t n) {
  if (dtype == KVS_DTYPE_FP32) {
    memcpy(dst, src, (size_t)n * 4);
  } else {
    uint16_t *d = dst;
    for (uint32_t i = 0; i < n; i++)
      d[i] = dtype == KVS_DTYPE_FP16 ? kvs_float_to_fp16(src[i])
                                     : kvs_float_to_bf16(src[i]);
  }
}

/* Eight floats; GCC/Clang vector extension: two SSE registers on the
 * baseline ISA, one AVX register in the AVX2 clone. */
typedef float v8f __attribute__((vector_size(32)));

KVS_INLINE v8f ld8(const float *p) {
  v8f v;
  memcpy(&v, p, sizeof v);
  return v;
}

KVS_INLINE void st8(float *p, v8f v) { memcpy(p, &v, sizeof v); }

KVS_INLINE float hsum8(v8f v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

/* Dot product, four independent vector chains. */
KVS_INLINE float dot(const float *restrict a, const float *restrict b,
                     uint32_t n) {
  v8f c0 = {0}, c1 = {0}, c2 = {0}, c3 = {0};
  uint32_t i = 0;
  for (; i + 32 <= n; i += 32) {
    c0 += ld8(a + i) * ld8(b + i);
    c1 += ld8(a + i + 8) * ld8(b + i + 8);
    c2 += ld8(a + i + 16) * ld8(b + i + 16);
    c3 += ld8(a + i + 24) * ld8(b + i + 24);
  }
  for (; i + 8 <= n; i += 8)
    c0 += ld8(a + i) * ld8(b + i);
  float t = 0.f;
  for (; i < n; i++)
    t += a[i] * b[i];
  return hsum8((c0 + c1) + (c2 + c3)) + t;
}

/* Four dot products (query rows q, q + qs, ...) against one key row, which
 * is loaded once. */
KVS_INLINE void dot4(const float *restrict q, uint32_t qs,
                     const float *restrict k, uint32_t n, float *out) {
  v8f c0 = {0}, c1 = {0}, c2 = {0}, c3 = {0};
  uint32_t i = 0;
  for (; i + 8 <= n; i += 8) {
    v8f kv = ld8(k + i);
    c0 += ld8(q + i) * kv;
    c1 += ld8(q + qs + i) * kv;
    c2 += ld8(q + 2 * qs + i) * kv;
    c3 += ld8(q + 3 * qs + i) * kv;
  }
  float t[4] = {0.f, 0.f, 0.f, 0.f};
  for (; i < n; i++)
    for (uint32_t r = 0; r < 4; r++)
      t[r] += q[r * qs + i] * k[i];
  out[0] = hsum8(c0) + t[0];
  out[1] = hsum8(c1) + t[1];
  out[2] = hsum8(c2) + t[2];
  out[3] = hsum8(c3) + t[3];
}

/* Four query rows against two key rows: 8 dot products, out[t * os + r]. */
KVS_INLINE void dot4x2(const float *restrict q, uint32_t qs,
                       const float *restrict k0, const float *restrict k1,
                       uint32_t n, float *out, uint32_t os) {
  v8f c[8] = {{0}};
  uint32_t i = 0;
  for (; i + 8 <= n; i += 8) {
    v8f ka = ld8(k0 + i), kb = ld8(k1 + i);
    for (uint32_t r = 0; r < 4; r++) {
      v8f qv = ld8(q + r * qs + i);
      c[r] += qv * ka;
      c[4 + r] += qv * kb;
    }
  }
  float t[8] = {0};
  for (; i < n; i++)
    for (uint32_t r = 0; r < 4; r++) {
      t[r] += q[r * qs + i] * k0[i];
      t[4 + r] += q[r * qs + i] * k1[i];
    }
  for (uint32_t r = 0; r < 4; r++) {
    out[r] = hsum8(c[r]) + t[r];
    out[os + r] = hsum8(c[4 + r]) + t[4 + r];
  }
}

KVS_INLINE void axpy(float *restrict y, float w, const float *restrict x,
                     uint32_t n) {
  uint32_t i = 0;
  for (; i + 8 <= n; i += 8)
    st8(y + i, ld8(y + i) + w * ld8(x + i));
  for (; i < n; i++)
    y[i] += w * x[i];
}

/* Four rows y, y + ys, ... += w[r] * x against one value row, loaded once. */
KVS_INLINE void axpy4(float *restrict y, uint32_t ys, const float *restrict w,
                      const float *restrict x, uint32_t n) {
  float w0 = w[0], w1 = w[1], w2 = w[2], w3 = w[3];
  uint32_t i = 0;
  for (; i + 8 <= n; i += 8) {
    v8f xv = ld8(x + i);
    st8(y + i, ld8(y + i) + w0 * xv);
    st8(y + ys + i, ld8(y + ys + i) + w1 * xv);
    st8(y + 2 * ys + i, ld8(y + 2 * ys + i) + w2 * xv);
    st8(y + 3 * ys + i, ld8(y + 3 * ys + i) + w3 * xv);
  }
  for (; i < n; i++)
    for (uint32_t r = 0; r < 4; r++)
      y[r * ys + i] += w[r] * x[i];
}

/* Tiles of up to KVS__CPU_TILE tokens (one block) for the value pass: the
 * output rows stay in registers across the tile's tokens. */
#define KVS__CPU_TILE 8u

/* y[r] (r < R, rows ys apart) += sum over t < T of p[t * ps + r] * x[t]. */
KVS_INLINE void axpy_tile(float *restrict y, uint32_t ys, uint32_t R,
                          const float *restrict p, uint32_t ps,
                          const float *const *x, uint32_t T, uint32_t n) {
  uint32_t d = 0;
  if (R == 4) {
    for (; d + 16 <= n; d += 16) {
      v8f a[8];
      for (uint32_t r = 0; r < 4; r++) {
        a[2 * r] = ld8(y + r * ys + d);
        a[2 * r + 1] = ld8(y + r * ys + d + 8);
      }
      for (uint32_t t = 0; t < T; t++) {
        v8f xl = ld8(x[t] + d), xh = ld8(x[t] + d + 8);
        for (uint32_t r = 0; r < 4; r++) {
          float w = p[t * ps + r];
          a[2 * r] += w * xl;
          a[2 * r + 1] += w * xh;
        }
      }
      for (uint32_t r = 0; r < 4; r++) {
        st8(y + r * ys + d, a[2 * r]);
        st8(y + r * ys + d + 8, a[2 * r + 1]);
      }
    }
  }
  for (; d + 8 <= n; d += 8)
    for (uint32_t r = 0; r < R; r++) {
      v8f acc = ld8(y + r * ys + d);
      for (uint32_t t = 0; t < T; t++)
        acc += p[t * ps + r] * ld8(x[t] + d);
      st8(y + r * ys + d, acc);
    }
  for (; d < n; d++)
    for (uint32_t r = 0; r < R; r++)
      for (uint32_t t = 0; t < T; t++)
        y[r * ys + d] += p[t * ps + r] * x[t][d];
}

/* Software prefetch of the next tile (portable body) or block (vector
 * bodies) in the attention passes: 0 off, 1 into L2, 2 into L1; -1 (the
 * default) each body's own choice, the faster one where it was measured
 * (git show b994ecf:docs/benchmarks.md): L2 for the portable and AVX2
 * bodies (L1 evicts the block in use), L1 for the AVX-512 one. */
int kvs__cpu_prefetch = -1;

static inline int prefetch_mode(int own) {
  return kvs__cpu_prefetch < 0 ? own : kvs__cpu_prefetch;
}

/* ---- write ---------------------------------------------------------------- */

/* The write kernel for an int8/fp8 cache: each (token, kv head) row is
 * converted to floats, then quantized with its own scales, which go to the
 * plane's scale array (slots already checked). */
static int write_quantized(const kvs_write_args *a) {
  const kvs_paged_kv *kv = &a->kv;
  size_t ses = kvs_dtype_size(a->src_dtype);
  const uint32_t nf = kvs_scale_floats(kv->dtype);
  float *row = malloc((size_t)kv->head_dim * sizeof(float));
  if (!row)
    return KVS_ENOMEM;
  for (uint32_t i = 0; i < a->num_tokens; i++) {
    int64_t slot = a->slots[i];
    if (slot < 0)
      continue;
    uint64_t b = (uint64_t)slot / kv->block_size;
    uint64_t t = (uint64_t)slot % kv->block_size;
    char *blk = (char *)kv->base + b * kv->block_stride;
    for (uint32_t h = 0; h < kv->num_kv_heads; h++) {
      uint64_t doff = t * kv->token_stride + h * kv->head_stride;
      uint64_t sidx = kv->scale_offset + (t * kv->num_kv_heads + h) * nf * 4;
      uint64_t soff = ((uint64_t)i * a->src_token_stride +
                       (uint64_t)h * kv->head_dim) * ses;
      for (int p = 0; p < 2; p++) {
        char *plane = blk + (p ? kv->v_offset : kv->k_offset);
        float scales[2];
        kvs_convert(row, KVS_DTYPE_FP32, (const char *)(p ? a->v : a->k) + soff,
                    a->src_dtype, kv->head_dim);
        int rc = kvs_quantize_row(plane + doff, scales, kv->dtype, row,
                                  kv->head_dim);
        if (rc) { /* (not reached: kvs__check_paged_kv refused the shape) */
          free(row);
          return rc;
        }
        memcpy(plane + sidx, scales, nf * sizeof(float));
      }
    }
  }
  free(row);
  return 0;
}

int kvs_cpu_write_kv(const kvs_write_args *a, void *stream) {
  (void)stream;
  if (!a || kvs__check_paged_kv(&a->kv) || kvs_dtype_size(a->src_dtype) == 0)
    return KVS_EINVAL;
  if (a->num_tokens == 0)
    return 0;
  const kvs_paged_kv *kv = &a->kv;
  uint32_t row = kv->num_kv_heads * kv->head_dim;
  if (!a->k || !a->v || !a->slots || a->src_token_stride < row)
    return KVS_EINVAL;
  if (kvs_dtype_quantized(a->src_dtype))
    return KVS_EINVAL;
  size_t ses = kvs_dtype_size(a->src_dtype), des = kvs_dtype_size(kv->dtype);
  uint64_t limit = (uint64_t)kv->num_blocks * kv->block_size;
  for (uint32_t i = 0; i < a->num_tokens; i++) /* check before writing */
    if (kv->num_blocks && a->slots[i] >= 0 && (uint64_t)a->slots[i] >= limit)
      return KVS_ERANGE;
  if (kvs_dtype_quantized(kv->dtype))
    return write_quantized(a);
  for (uint32_t i = 0; i < a->num_tokens; i++) {
    int64_t slot = a->slots[i];
    if (slot < 0)
      continue;
    uint64_t b = (uint64_t)slot / kv->block_size;
    uint64_t t = (uint64_t)slot % kv->block_size;
    char *blk = (char *)kv->base + b * kv->block_stride;
    for (uint32_t h = 0; h < kv->num_kv_heads; h++) {
      uint64_t doff = (t * kv->token_stride + h * kv->head_stride) * des;
      uint64_t soff = ((uint64_t)i * a->src_token_stride +
                       (uint64_t)h * kv->head_dim) * ses;
      kvs_convert(blk + kv->k_offset + doff, kv->dtype,
                  (const char *)a->k + soff, a->src_dtype, kv->head_dim);
      kvs_convert(blk + kv->v_offset + doff, kv->dtype,
                  (const char *)a->v + soff, a->src_dtype, kv->head_dim);
    }
  }
  return 0;
}

/* ---- attention ------------------------------------------------------------ */

typedef struct attn_scratch {
  float *q;      /* [H][D] */
  float *acc;    /* [H][D] */
  float *row;    /* [TILE][KVH][D]: tokens' keys or values, as floats */
  float *scores; /* [max_len][H]: token-major, heads contiguous */
  float *sum;    /* [H] */
  float *qsum;   /* [H]: int8, the vector bodies: sum of each head's q */
  float *corr;   /* [H]: int8, the vector bodies: sum of p * lo */
  float *qmul;   /* [block_size]: quantized, the vector bodies: scales */
  float *qlo;    /* [block_size]: int8, the vector bodies: lo, the value
                    of byte 128 (min + 128 * scale: quant_load_scales) */
  const float *tile[KVS__CPU_TILE]; /* rows of the current tile */
  uint32_t max_len;
} attn_scratch;

/*
 * The tokens j0 .. j0+T-1 of a request that lie in one block (T <= TILE):
 * rows[t] points at token j0+t's [KVH][D] keys (plane_off = k_offset) or
 * values, as floats: straight into the pool for packed fp32, else converted
 * into buf.  Returns T.
 */
KVS_INLINE uint32_t tile_rows(const kvs_attn_args *a, const uint32_t *bt,
                              uint32_t j0, uint32_t n, uint64_t plane_off,
                              float *buf, const float **rows) {
  const kvs_paged_kv *kv = &a->kv;
  const uint32_t D = kv->head_dim, KVH = kv->num_kv_heads;
  const size_t es = kvs_dtype_size(kv->dtype);
  uint32_t off = j0 % kv->block_size;
  uint32_t T = kv->block_size - off;
  T = T < n - j0 ? T : n - j0;
  T = T < KVS__CPU_TILE ? T : KVS__CPU_TILE;
  const char *plane = (const char *)kv->base +
                      (uint64_t)bt[j0 / kv->block_size] * kv->block_stride +
                      plane_off;
  const char *tok0 = plane + (uint64_t)off * kv->token_stride * es;
  int packed = kv->head_stride == D;
  /* Prefetch the next tile (often in another block, where the hardware
   * prefetcher has to start over). */
  uint32_t j1 = j0 + T;
  const int pf = prefetch_mode(1);
  if (j1 < n && pf) {
    uint32_t off1 = j1 % kv->block_size;
    uint32_t T1 = kv->block_size - off1;
    T1 = T1 < n - j1 ? T1 : n - j1;
    T1 = T1 < KVS__CPU_TILE ? T1 : KVS__CPU_TILE;
    const char *p1 = (const char *)kv->base +
                     (uint64_t)bt[j1 / kv->block_size] * kv->block_stride +
                     plane_off + (uint64_t)off1 * kv->token_stride * es;
    uint64_t bytes = ((uint64_t)(T1 - 1) * kv->token_stride +
                      (uint64_t)(KVH - 1) * kv->head_stride + D) * es;
    for (uint64_t b = 0; b < bytes; b += 64) {
      if (pf == 1)
        __builtin_prefetch(p1 + b, 0, 2);
      else
        __builtin_prefetch(p1 + b, 0, 3);
    }
  }
  for (uint32_t t = 0; t < T; t++) {
    const char *tok = tok0 + (uint64_t)t * kv->token_stride * es;
    float *dst = buf + (size_t)t * KVH * D;
    if (packed && kv->dtype == KVS_DTYPE_FP32) {
      rows[t] = (const float *)(const void *)tok;
      continue;
    }
    if (kvs_dtype_quantized(kv->dtype)) {
      /* Dequantized into the tile, each head with its own scales (those
       * of one token are contiguous: nf floats per head). */
      const uint32_t nf = kvs_scale_floats(kv->dtype);
      const char *sc = plane + kv->scale_offset +
                       (uint64_t)(off + t) * KVH * nf * 4;
      for (uint32_t h = 0; h < KVH; h++) {
        float scales[2];
        memcpy(scales, sc + (uint64_t)h * nf * 4, nf * sizeof(float));
        load_row_q(dst + (size_t)h * D, tok + (uint64_t)h * kv->head_stride,
                   kv->dtype, D, scales);
      }
      rows[t] = dst;
      continue;
    }
    if (packed)
      load_row(dst, tok, kv->dtype, KVH * D);
    else
      for (uint32_t h = 0; h < KVH; h++)
        load_row(dst + (size_t)h * D, tok + (uint64_t)h * kv->head_stride * es,
                 kv->dtype, D);
    rows[t] = dst;
  }
  return T;
}

/*
 * One query row of request s at position pos, every head: keys 0..pos.
 * Walks the request's blocks token by token; a token's K (then V) for all
 * kv heads is one contiguous run of the plane, read once and used by every
 * query head of every group, so the pool is streamed, not strided.
 */
KVS_INLINE void attend_row_body(const kvs_attn_args *a, uint32_t s,
                                uint32_t pos, const char *qrow, char *orow,
                                attn_scratch *w) {
  const kvs_paged_kv *kv = &a->kv;
  const uint32_t D = kv->head_dim, KVH = kv->num_kv_heads, H = a->num_heads;
  const uint32_t ratio = H / KVH;
  const size_t qes = kvs_dtype_size(a->qo_dtype);
  const uint32_t n = pos + 1;
  const uint32_t *bt = a->block_tables + (uint64_t)s * a->max_blocks_per_seq;
  for (uint32_t hq = 0; hq < H; hq++) {
    load_row(w->q + (size_t)hq * D, qrow + (size_t)hq * D * qes, a->qo_dtype,
             D);
    if (kv->dtype == KVS_DTYPE_INT8) /* rows are stored rotated */
      kvs__hadamard(w->q + (size_t)hq * D, D, 0);
  }

  /* Scores, a tile of tokens of one block at a time. */
  for (uint32_t j0 = 0; j0 < n;) {
    uint32_t T = tile_rows(a, bt, j0, n, kv->k_offset, w->row, w->tile);
    for (uint32_t h = 0; h < KVH; h++) {
      uint32_t g = 0;
      for (; g + 4 <= ratio; g += 4) {
        const float *qg = w->q + (size_t)(h * ratio + g) * D;
        uint32_t t = 0;
        for (; t + 2 <= T; t += 2)
          dot4x2(qg, D, w->tile[t] + (size_t)h * D, w->tile[t + 1] + (size_t)h * D,
                 D, w->scores + (size_t)(j0 + t) * H + h * ratio + g, H);
        for (; t < T; t++)
          dot4(qg, D, w->tile[t] + (size_t)h * D, D,
               w->scores + (size_t)(j0 + t) * H + h * ratio + g);
      }
      for (; g < ratio; g++)
        for (uint32_t t = 0; t < T; t++)
          w->scores[(size_t)(j0 + t) * H + h * ratio + g] =
              dot(w->q + (size_t)(h * ratio + g) * D, w->tile[t] + (size_t)h * D, D);
    }
    for (uint32_t t = 0; t < T; t++)
      for (uint32_t hq = 0; hq < H; hq++)
        w->scores[(size_t)(j0 + t) * H + hq] *= a->scale;
    j0 += T;
  }

  /* Softmax numerators, in place. */
  float *mx = w->acc; /* [H], free until the value pass */
  for (uint32_t hq = 0; hq < H; hq++) {
    mx[hq] = -INFINITY;
    w->sum[hq] = 0.f;
  }
  for (uint32_t j = 0; j < n; j++) {
    const float *sc = w->scores + (size_t)j * H;
    for (uint32_t hq = 0; hq < H; hq++)
      mx[hq] = sc[hq] > mx[hq] ? sc[hq] : mx[hq];
  }
  for (uint32_t j = 0; j < n; j++) {
    float *sc = w->scores + (size_t)j * H;
    for (uint32_t hq = 0; hq < H; hq++) {
      sc[hq] = expf(sc[hq] - mx[hq]);
      w->sum[hq] += sc[hq];
    }
  }

  /* Weighted values, a tile of tokens of one block at a time. */
  memset(w->acc, 0, (size_t)H * D * sizeof(float));
  for (uint32_t j0 = 0; j0 < n;) {
    uint32_t T = tile_rows(a, bt, j0, n, kv->v_offset, w->row, w->tile);
    const float *const *vt = w->tile;
    const float *p = w->scores + (size_t)j0 * H;
    for (uint32_t h = 0; h < KVH; h++) {
      const float *xh[KVS__CPU_TILE];
      for (uint32_t t = 0; t < T; t++)
        xh[t] = vt[t] + (size_t)h * D;
      uint32_t g = 0;
      for (; g + 4 <= ratio; g += 4)
        axpy_tile(w->acc + (size_t)(h * ratio + g) * D, D, 4,
                  p + h * ratio + g, H, xh, T, D);
      for (; g < ratio; g++)
        axpy_tile(w->acc + (size_t)(h * ratio + g) * D, D, 1,
                  p + h * ratio + g, H, xh, T, D);
    }
    j0 += T;
  }
  for (uint32_t hq = 0; hq < H; hq++) {
    float *acc = w->acc + (size_t)hq * D;
    float inv = 1.f / w->sum[hq];
    for (uint32_t d = 0; d < D; d++)
      acc[d] *= inv;
    if (kv->dtype == KVS_DTYPE_INT8) /* the rotated rows' sum, back */
      kvs__hadamard(acc, D, 0);
    store_row(orow + (size_t)hq * D * qes, a->qo_dtype, acc, D);
  }
}

static void attend_row_base(const kvs_attn_args *a, uint32_t s, uint32_t pos,
                            const char *qrow, char *orow, attn_scratch *w) {
  attend_row_body(a, s, pos, qrow, orow, w);
}

/* ---- attention: the AVX2 + FMA + F16C body (x86-64) ------------------------
 *
 * The portable body above converts each tile of K/V rows into a scratch tile
 * of floats (32 KiB for 8 tokens x 8 kv heads x 128: the size of L1, where q
 * also has to live), reads it back, and ends every dot product with its own
 * horizontal sum.  This body converts rows in registers straight from the
 * pool (vcvtph2ps for fp16, a zero-extend and shift for bf16), once per
 * group of up to four query heads, and blocks registers over heads and
 * tokens:
 *   - scores: R query heads x TT tokens (4x2, 2x4 or 1x8: 8 accumulators),
 *     the R*TT sums reduced together with a tree of horizontal adds;
 *   - values: R query heads x 8/R vectors of dimensions (8 accumulators)
 *     over all tokens of a block;
 *   - softmax on 8 scores at a time, head-major, with a vector exp.
 * Every sum is fp32.  One function per cache dtype, picked at run time.
 */
/* The vector bodies' first and last steps: the row's q of every head into
 * w->q (rows Dp floats apart, zero-padded), with each head's sum into
 * qsum when it is not NULL; the normalised outputs out of w->acc, each
 * head's corr[hq] (when not NULL) added to every element first. */
#if defined(__x86_64__) || defined(__i386__) /* (the vector bodies') */
/* kvs__hadamard (not down) eight lanes wide, for the vector bodies (below). */
__attribute__((target("avx2,fma,f16c"))) static void x_hadamard(float *x,
                                                                uint32_t n);
#define vec_hadamard x_hadamard

static void vec_load_q(const kvs_attn_args *a, const char *qrow,
                       attn_scratch *w, uint32_t Dp, float *qsum) {
  const uint32_t D = a->kv.head_dim;
  const size_t qes = kvs_dtype_size(a->qo_dtype);
  for (uint32_t hq = 0; hq < a->num_heads; hq++) {
    float *qd = w->q + (size_t)hq * Dp;
    load_row(qd, qrow + (size_t)hq * D * qes, a->qo_dtype, D);
    if (a->kv.dtype == KVS_DTYPE_INT8) /* rows are stored rotated */
      vec_hadamard(qd, D);
    memset(qd + D, 0, (size_t)(Dp - D) * 4);
    if (qsum) { /* (Dp is a multiple of 8; the padding is 0) */
      v8f t = {0};
      for (uint32_t d = 0; d < Dp; d += 8)
        t += ld8(qd + d);
      qsum[hq] = hsum8(t);
    }
  }
}

static void vec_store_out(const kvs_attn_args *a, char *orow,
                          attn_scratch *w, uint32_t Dp, const float *corr) {
  const uint32_t D = a->kv.head_dim;
  const size_t qes = kvs_dtype_size(a->qo_dtype);
  for (uint32_t hq = 0; hq < a->num_heads; hq++) {
    float *acc = w->acc + (size_t)hq * Dp;
    float inv = 1.f / w->sum[hq], c = corr ? corr[hq] : 0.f;
    for (uint32_t d = 0; d < D; d++)
      acc[d] = corr ? (acc[d] + c) * inv : acc[d] * inv;
    if (a->kv.dtype == KVS_DTYPE_INT8) /* the rotated rows' sum, back */
      vec_hadamard(acc, D);
    store_row(orow + (size_t)hq * D * qes, a->qo_dtype, acc, D);
  }
}
#endif /* x86 */

/*
 * Quantized caches in the vector bodies.  They read an int8/fp8 row as raw
 * floats (x_ld8, z_ld16: the int8 byte - 128, or the fp8 value / 256, an
 * exact move of its bits) and apply the row's scale and int8 offset per
 * token, not per element:
 *   score = (scale_t * (q . raw_t) + lo_t * sum(q)) * softmax scale
 *   out   = sum_t (p_t * scale_t) raw_t + sum_t p_t * lo_t
 * with lo_t = min_t + 128 * scale_t (the value of byte 128), which are the
 * portable body's sums over dequantized rows (byte * scale + min) in
 * another order, one multiply-add per element fewer.  Centring the bytes
 * keeps 128 * scale out of both sums, where lo * sum(q) or sum(p * lo)
 * would have to cancel it (uncentred, int8 decode over 8192 Student-t
 * keys was 60 times further from float64: test_gpu_quant).  A NaN scale
 * or minimum still makes the token's score or every output element NaN.
 * Only the scales of tokens below the row's length are read.
 */

/* The scales of T tokens of one kv head of a block (sc, rows st floats
 * apart) as the raw floats take them: mul[t] (fp8: times 256, exact) and,
 * int8, lo[t] the value of raw 0 (byte 128: the minimum + 128 * scale);
 * read once for every query head of the group. */
KVS_INLINE void quant_load_scales(const float *sc, uint32_t st, uint32_t T,
                                  uint32_t dt, float *mul, float *lo) {
  for (uint32_t t = 0; t < T; t++) {
    const float *s = sc + (size_t)t * st;
    mul[t] = dt == KVS_DTYPE_FP8 ? s[0] * 256.f : s[0];
    if (dt == KVS_DTYPE_INT8)
      lo[t] = s[1] + 128.f * s[0];
  }
}

/* The raw scores of G query heads (rows n floats apart) x T tokens made
 * real: (raw * mul[t] + lo[t] * qsum[g]) * scale (fp8: no lo). */
KVS_INLINE void quant_scores(float *sg, uint32_t n, uint32_t G, uint32_t T,
                             const float *mul, const float *lo,
                             const float *qsum, float scale, uint32_t dt) {
  const int int8 = dt == KVS_DTYPE_INT8;
  for (uint32_t g = 0; g < G; g++) {
    float *x = sg + (size_t)g * n;
    const float qs = int8 ? qsum[g] : 0.f;
    uint32_t t = 0;
    for (; t + 8 <= T; t += 8) {
      v8f v = ld8(x + t) * ld8(mul + t);
      if (int8)
        v += ld8(lo + t) * qs;
      st8(x + t, v * scale);
    }
    for (; t < T; t++)
      x[t] = int8 ? (x[t] * mul[t] + lo[t] * qs) * scale : x[t] * mul[t] * scale;
  }
}

/* A softmax weight (at most 1, the maximum's) below 2^-64 counts for
 * nothing in an fp32 output; times a row's scale or minimum it may be
 * subnormal, and on Intel an FMA on a subnormal takes a microcode assist
 * (measured: int8 decode 30x slower with a peaked softmax, whose weights
 * stop at exp(-87), 1.6e-38).  So such weights become 0 (NaN stays). */
KVS_INLINE float flush_weight(float p) { return p < 0x1p-64f ? 0.f : p; }

KVS_INLINE v8f flush_weights(v8f p) {
  typedef int32_t v8i __attribute__((vector_size(32)));
  const v8f tiny = (v8f){0} + 0x1p-64f;
  return (v8f)((v8i)p & ~(p < tiny));
}

/* Before the value pass over raw rows: the softmax weights of G query heads
 * x T tokens (flushed) times mul[t], and (int8) each head's sum of weight
 * * lo[t] added to corr[g]. */
KVS_INLINE void quant_weights(float *pg, uint32_t n, uint32_t G, uint32_t T,
                              const float *mul, const float *lo, float *corr,
                              uint32_t dt) {
  const int int8 = dt == KVS_DTYPE_INT8;
  for (uint32_t g = 0; g < G; g++) {
    float *p = pg + (size_t)g * n;
    v8f c = {0};
    uint32_t t = 0;
    for (; t + 8 <= T; t += 8) {
      v8f pv = flush_weights(ld8(p + t));
      if (int8)
        c += pv * ld8(lo + t);
      st8(p + t, pv * ld8(mul + t));
    }
    float cs = hsum8(c);
    for (; t < T; t++) {
      const float pt = flush_weight(p[t]);
      if (int8)
        cs += pt * lo[t];
      p[t] = pt * mul[t];
    }
    if (int8)
      corr[g] += cs;
  }
}

/* The scales of T tokens of kv head h of a block's quantized plane (rows
 * kvs_scale_floats * num_kv_heads floats apart) into w->qmul, w->qlo. */
KVS_INLINE void quant_head_scales(const kvs_paged_kv *kv, attn_scratch *w,
                                  const char *plane, uint32_t h, uint32_t T,
                                  uint32_t dt) {
  const uint32_t nf = kvs_scale_floats(dt);
  quant_load_scales((const float *)(const void *)(plane + kv->scale_offset) +
                        (size_t)h * nf,
                    kv->num_kv_heads * nf, T, dt, w->qmul, w->qlo);
}

/* A vector body's per-token step for kv head h's query heads and the T
 * tokens of a block (plane: its K or V plane; j0: its first token, of n):
 * before the value pass (values != 0) the softmax weights made ready for
 * the raw rows (quant_weights), else the raw scores made real
 * (quant_scores). */
KVS_INLINE void quant_head(const kvs_attn_args *a, attn_scratch *w,
                           const char *plane, uint32_t h, uint32_t T,
                           uint32_t j0, uint32_t n, uint32_t dt, int values) {
  const uint32_t G = a->num_heads / a->kv.num_kv_heads;
  float *sg = w->scores + (size_t)h * G * n + j0;
  quant_head_scales(&a->kv, w, plane, h, T, dt);
  if (values)
    quant_weights(sg, n, G, T, w->qmul, w->qlo, w->corr + (size_t)h * G, dt);
  else
    quant_scores(sg, n, G, T, w->qmul, w->qlo, w->qsum + (size_t)h * G,
                 a->scale, dt);
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define KVS_X86 __attribute__((target("avx2,fma,f16c")))
#define KVS_X86_INLINE \
  static inline __attribute__((always_inline, target("avx2,fma,f16c")))

/* fp8 e4m3 -> fp16 bits, 8 at a time; x: the bytes sign-extended to words.
 * Below the sign, e4m3's 7 bits shifted up by 7 are an fp16 of the same
 * digits with the exponent bias 15 instead of 7 (subnormals included): the
 * value / 256, exactly; the sign extension puts the sign in bit 15, and a
 * copy of it in bit 14, where a 0 belongs.  The NaN codes (0x7f, 0xff)
 * would read 1.875: for them alone one more mantissa step carries into bit
 * 14, so bit 14 of t ^ (t + 0x80) is 1 for NaN and 0 otherwise, which is
 * what bit 14 must hold (all ones in the exponent: NaN). */
KVS_X86_INLINE __m128i x_e4m3_h8(__m128i x) {
  __m128i t = _mm_slli_epi16(x, 7);
  __m128i y = _mm_add_epi16(t, _mm_set1_epi16(0x80));
  return _mm_xor_si128(t, _mm_and_si128(y, _mm_set1_epi16(0x4000)));
}

/* The butterflies at distances 1, 2, 4 of the 8 floats of x, each lane's
 * the same float32 operation as kvs__hadamard's (a + b, or a - b as a +
 * (-b), which IEEE defines as the same): the partner moved beside each
 * lane by a permute, its sign flipped where the lane takes the
 * difference. */
KVS_X86_INLINE __m256 x_hadamard8(__m256 x) {
  const __m256 s1 = _mm256_castsi256_ps(
      _mm256_setr_epi32(0, INT32_MIN, 0, INT32_MIN, 0, INT32_MIN, 0, INT32_MIN));
  const __m256 s2 = _mm256_castsi256_ps(
      _mm256_setr_epi32(0, 0, INT32_MIN, INT32_MIN, 0, 0, INT32_MIN, INT32_MIN));
  const __m256 s4 = _mm256_castsi256_ps(_mm256_setr_epi32(
      0, 0, 0, 0, INT32_MIN, INT32_MIN, INT32_MIN, INT32_MIN));
  /* lane j: x[j & ~1] + (+-) x[j | 1] */
  x = _mm256_add_ps(_mm256_moveldup_ps(x),
                    _mm256_xor_ps(_mm256_movehdup_ps(x), s1));
  /* lane j: x[j & ~2] + (+-) x[j | 2] */
  x = _mm256_add_ps(_mm256_permute_ps(x, 0x44),
                    _mm256_xor_ps(_mm256_permute_ps(x, 0xee), s2));
  /* lane j: x[j & ~4] + (+-) x[j | 4] */
  return _mm256_add_ps(_mm256_permute2f128_ps(x, x, 0x00),
                       _mm256_xor_ps(_mm256_permute2f128_ps(x, x, 0x11), s4));
}

KVS_X86 static void x_hadamard(float *x, uint32_t n) {
  for (uint32_t off = 0; off < n;) {
    const uint32_t m = kvs__hadamard_seg(n, off);
    float *y = x + off;
    if (m < 8) {
      kvs__hadamard(y, m, 0);
    } else {
      for (uint32_t i = 0; i < m; i += 8)
        _mm256_storeu_ps(y + i, x_hadamard8(_mm256_loadu_ps(y + i)));
      for (uint32_t h = 8; h < m; h *= 2)
        for (uint32_t i = 0; i < m; i += 2 * h)
          for (uint32_t j = i; j < i + h; j += 8) {
            const __m256 a = _mm256_loadu_ps(y + j), b = _mm256_loadu_ps(y + j + h);
            _mm256_storeu_ps(y + j, _mm256_add_ps(a, b));
            _mm256_storeu_ps(y + j + h, _mm256_sub_ps(a, b));
          }
    }
    off += m;
  }
}

/* 8 elements of dtype dt at p, as floats (dt is a constant after inlining);
 * int8 and fp8 raw (the byte - 128; the value / 256), without their row's
 * scale and offset. */
KVS_X86_INLINE __m256 x_ld8(const void *p, uint32_t dt) {
  if (dt == KVS_DTYPE_INT8) /* byte - 128 */
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_xor_si128(
        _mm_loadl_epi64((const __m128i *)p), _mm_set1_epi8(-128))));
  if (dt == KVS_DTYPE_FP8)
    return _mm256_cvtph_ps(
        x_e4m3_h8(_mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)p))));
  if (dt == KVS_DTYPE_FP16)
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
  if (dt == KVS_DTYPE_BF16) {
    /* Both 128-bit halves get the 8 values; one byte shuffle moves value i
     * (of 0-3 in the low half, 4-7 in the high half) to the top 16 bits of
     * lane i and zeroes the rest: one shuffle instead of a zero-extend and
     * a shift (a shift competes with the FMAs for their ports on Intel). */
    const __m256i m = _mm256_setr_epi8(
        -1, -1, 0, 1, -1, -1, 2, 3, -1, -1, 4, 5, -1, -1, 6, 7,
        -1, -1, 8, 9, -1, -1, 10, 11, -1, -1, 12, 13, -1, -1, 14, 15);
    __m128i x = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(
        _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(x), m));
  }
  return _mm256_loadu_ps((const float *)p);
}

/* The first n < 8 elements at p, zero-padded to 8 (int8: the padding
 * bytes read as -128; they meet q's zero padding in a score, and the
 * value sums' padding lanes are never stored). */
KVS_X86_INLINE __m256 x_ld8_tail(const void *p, uint32_t dt, uint32_t n) {
  float f[8] = {0};
  uint16_t h[8] = {0};
  if (kvs_dtype_size(dt) == 1) {
    uint8_t b[8] = {0};
    memcpy(b, p, n);
    return x_ld8(b, dt);
  }
  if (dt == KVS_DTYPE_FP32) {
    memcpy(f, p, (size_t)n * 4);
    return _mm256_loadu_ps(f);
  }
  memcpy(h, p, (size_t)n * 2);
  return x_ld8(h, dt);
}

/* Lane i of the result: the sum of the 8 lanes of c[i]. */
KVS_X86_INLINE __m256 x_reduce8(const __m256 *c) {
  __m256 a = _mm256_hadd_ps(c[0], c[1]), b = _mm256_hadd_ps(c[2], c[3]);
  __m256 e = _mm256_hadd_ps(c[4], c[5]), f = _mm256_hadd_ps(c[6], c[7]);
  a = _mm256_hadd_ps(a, b); /* [c0 c1 c2 c3 | c0 c1 c2 c3] halves */
  e = _mm256_hadd_ps(e, f);
  return _mm256_add_ps(_mm256_permute2f128_ps(a, e, 0x20),
                       _mm256_permute2f128_ps(a, e, 0x31));
}

KVS_X86_INLINE float x_hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/*
 * Scores of R query heads (q, rows Dp floats apart, zero-padded) against TT
 * key rows (k, rows ks bytes apart), R * TT <= 8, times scale:
 * sc[r * n + t] (head-major).
 */
KVS_X86_INLINE void x_scores(const float *q, uint32_t Dp, uint32_t R,
                             const char *k, uint64_t ks, uint32_t TT,
                             uint32_t D, uint32_t dt, float scale, float *sc,
                             uint32_t n) {
  const size_t es = kvs_dtype_size(dt);
  __m256 c[8];
  for (uint32_t i = 0; i < 8; i++)
    c[i] = _mm256_setzero_ps();
  uint32_t d = 0;
  for (; d + 8 <= D; d += 8) {
    __m256 kv[8];
    for (uint32_t t = 0; t < TT; t++)
      kv[t] = x_ld8(k + t * ks + d * es, dt);
    for (uint32_t r = 0; r < R; r++) {
      __m256 qv = _mm256_loadu_ps(q + (size_t)r * Dp + d);
      /* Keep q in a register: folded into each FMA as a memory operand it
       * would be loaded TT times (the loads, not the FMAs, would bound). */
      __asm__("" : "+x"(qv));
      for (uint32_t t = 0; t < TT; t++)
        c[t * R + r] = _mm256_fmadd_ps(qv, kv[t], c[t * R + r]);
    }
  }
  if (d < D)
    for (uint32_t t = 0; t < TT; t++) {
      __m256 kv = x_ld8_tail(k + t * ks + d * es, dt, D - d);
      for (uint32_t r = 0; r < R; r++)
        c[t * R + r] = _mm256_fmadd_ps(_mm256_loadu_ps(q + (size_t)r * Dp + d),
                                       kv, c[t * R + r]);
    }
  float o[8];
  if (R * TT == 8) {
    _mm256_storeu_ps(o, _mm256_mul_ps(x_reduce8(c), _mm256_set1_ps(scale)));
  } else {
    for (uint32_t i = 0; i < R * TT; i++)
      o[i] = x_hsum(c[i]) * scale;
  }
  for (uint32_t t = 0; t < TT; t++)
    for (uint32_t r = 0; r < R; r++)
      sc[(size_t)r * n + t] = o[t * R + r];
}

/* x_scores over T tokens: 8 / R at a time, then one at a time (R is a
 * constant at every call, so each instance keeps its accumulators in
 * registers). */
KVS_X86_INLINE void x_scores_rows(const float *q, uint32_t Dp, uint32_t R,
                                  const char *k, uint64_t ks, uint32_t T,
                                  uint32_t D, uint32_t dt, float scale,
                                  float *sc, uint32_t n) {
  uint32_t t = 0;
  for (; t + 8 / R <= T; t += 8 / R)
    x_scores(q, Dp, R, k + t * ks, ks, 8 / R, D, dt, scale, sc + t, n);
  for (; t < T; t++)
    x_scores(q, Dp, R, k + t * ks, ks, 1, D, dt, scale, sc + t, n);
}

/*
 * acc[r] (R rows Dp floats apart, r < R) += sum over t < T of
 * p[r * n + t] * v[t] (value rows vs bytes apart, D elements).
 */
KVS_X86_INLINE void x_values(float *acc, uint32_t Dp, uint32_t R,
                             const float *p, uint32_t n, const char *v,
                             uint64_t vs, uint32_t T, uint32_t D,
                             uint32_t dt) {
  const size_t es = kvs_dtype_size(dt);
  const uint32_t V = 8 / R; /* vectors of dimensions per pass */
  uint32_t d = 0;
  for (; d + 8 * V <= D; d += 8 * V) {
    __m256 a[8];
    for (uint32_t r = 0; r < R; r++)
      for (uint32_t i = 0; i < V; i++)
        a[r * V + i] = _mm256_loadu_ps(acc + (size_t)r * Dp + d + 8 * i);
    for (uint32_t t = 0; t < T; t++) {
      __m256 x[8];
      for (uint32_t i = 0; i < V; i++)
        x[i] = x_ld8(v + t * vs + (d + 8 * i) * es, dt);
      for (uint32_t r = 0; r < R; r++) {
        __m256 w = _mm256_broadcast_ss(p + (size_t)r * n + t);
        for (uint32_t i = 0; i < V; i++)
          a[r * V + i] = _mm256_fmadd_ps(w, x[i], a[r * V + i]);
      }
    }
    for (uint32_t r = 0; r < R; r++)
      for (uint32_t i = 0; i < V; i++)
        _mm256_storeu_ps(acc + (size_t)r * Dp + d + 8 * i, a[r * V + i]);
  }
  for (; d < D; d += 8) { /* one vector at a time, the last one padded */
    __m256 a[4];
    for (uint32_t r = 0; r < R; r++)
      a[r] = _mm256_loadu_ps(acc + (size_t)r * Dp + d);
    for (uint32_t t = 0; t < T; t++) {
      __m256 x = d + 8 <= D ? x_ld8(v + t * vs + d * es, dt)
                            : x_ld8_tail(v + t * vs + d * es, dt, D - d);
      for (uint32_t r = 0; r < R; r++)
        a[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + (size_t)r * n + t), x,
                               a[r]);
    }
    for (uint32_t r = 0; r < R; r++)
      _mm256_storeu_ps(acc + (size_t)r * Dp + d, a[r]);
  }
}

/* exp(x) for x <= 0, 8 at a time: 2^k * e^r, |r| <= ln2/2, a degree-7
 * Taylor polynomial (error below 1e-8 relative); x below -87 gives
 * exp(-87) ~ 1.6e-38 instead of a smaller number or 0 (nothing a sum that
 * holds a 1 can tell apart).  NaN stays NaN, as expf keeps it in the
 * portable body: maxps returns its second operand when either is NaN, so x
 * goes second (the other order turned a NaN score into -87 and dropped the
 * token without a trace). */
KVS_X86_INLINE __m256 x_exp(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(-87.f), x);
  __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.f / 5040.f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.f / 720.f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.f / 120.f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.f / 24.f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.f / 6.f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(0.5f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.f));
  __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* Softmax numerators of one head's n scores, in place; returns their sum. */
KVS_X86_INLINE float x_softmax(float *sc, uint32_t n) {
  __m256 m = _mm256_set1_ps(-INFINITY);
  uint32_t j = 0;
  for (; j + 8 <= n; j += 8)
    m = _mm256_max_ps(m, _mm256_loadu_ps(sc + j));
  float mx = -INFINITY;
  for (; j < n; j++)
    mx = sc[j] > mx ? sc[j] : mx;
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  mx = _mm_cvtss_f32(h) > mx ? _mm_cvtss_f32(h) : mx;
  __m256 mv = _mm256_set1_ps(mx), s = _mm256_setzero_ps();
  for (j = 0; j + 8 <= n; j += 8) {
    __m256 e = x_exp(_mm256_sub_ps(_mm256_loadu_ps(sc + j), mv));
    _mm256_storeu_ps(sc + j, e);
    s = _mm256_add_ps(s, e);
  }
  if (j < n) {
    float t[8] = {0};
    memcpy(t, sc + j, (size_t)(n - j) * 4);
    __m256 e = x_exp(_mm256_sub_ps(_mm256_loadu_ps(t), mv));
    _mm256_storeu_ps(t, e);
    memcpy(sc + j, t, (size_t)(n - j) * 4);
    float tail = 0.f;
    for (uint32_t i = 0; i < n - j; i++)
      tail += t[i];
    return x_hsum(s) + tail;
  }
  return x_hsum(s);
}

/* The tokens of request row (s, pos) that lie in block i of its table:
 * their first token's K or V plane (plane_off) and their count. */
KVS_X86_INLINE const char *x_block(const kvs_attn_args *a, const uint32_t *bt,
                                   uint32_t i, uint32_t n, uint64_t plane_off,
                                   uint32_t *T) {
  const kvs_paged_kv *kv = &a->kv;
  uint32_t j0 = i * kv->block_size;
  *T = n - j0 < kv->block_size ? n - j0 : kv->block_size;
  return (const char *)kv->base + (uint64_t)bt[i] * kv->block_stride +
         plane_off;
}

/* Prefetch kv head h's rows of the next block's T tokens (plane at p) into
 * L2 (prefetcht1: into L1 it would evict the block being read), one head at
 * a time so the requests are spread over the block's work.  mode 0: none. */
KVS_X86_INLINE void x_prefetch(const char *p, uint64_t ts, uint32_t T,
                               uint64_t row, int mode) {
  if (!mode)
    return;
  for (uint32_t t = 0; t < T; t++)
    for (uint64_t b = 0; b < row; b += 64) {
      if (mode == 1)
        __builtin_prefetch(p + t * ts + b, 0, 2);
      else
        __builtin_prefetch(p + t * ts + b, 0, 3);
    }
}

KVS_X86_INLINE void attend_row_x86(const kvs_attn_args *a, uint32_t s,
                                   uint32_t pos, const char *qrow, char *orow,
                                   attn_scratch *w, const uint32_t dt) {
  const kvs_paged_kv *kv = &a->kv;
  const uint32_t D = kv->head_dim, KVH = kv->num_kv_heads, H = a->num_heads;
  const uint32_t Dp = (D + 7) & ~7u, ratio = H / KVH;
  const uint32_t R = ratio % 4 == 0 ? 4 : ratio % 2 == 0 ? 2 : 1;
  const size_t es = kvs_dtype_size(dt);
  const uint64_t ts = kv->token_stride * es, hs = kv->head_stride * es;
  const uint32_t n = pos + 1, bs = kv->block_size;
  const uint32_t nb = (n + bs - 1) / bs;
  const uint32_t *bt = a->block_tables + (uint64_t)s * a->max_blocks_per_seq;
  const int pf = prefetch_mode(1);
  const int quant = kvs_dtype_quantized(dt), int8 = dt == KVS_DTYPE_INT8;
  const uint32_t sst = KVH * kvs_scale_floats(dt); /* scale rows, floats */
  float *sc = w->scores; /* [H][n] */
  vec_load_q(a, qrow, w, Dp, int8 ? w->qsum : NULL);

  /* Scores, a block at a time: every kv head, R query heads x TT tokens. */
  for (uint32_t i = 0; i < nb; i++) {
    uint32_t T;
    const char *kp = x_block(a, bt, i, n, kv->k_offset, &T);
    uint32_t T1 = 0;
    const char *kp1 = i + 1 < nb ? x_block(a, bt, i + 1, n, kv->k_offset, &T1)
                                 : kp;
    const uint32_t j0 = i * bs;
    if (quant)
      x_prefetch(kp1 + kv->scale_offset, 0, 1, (uint64_t)T1 * sst * 4, pf);
    for (uint32_t h = 0; h < KVH; h++) {
      x_prefetch(kp1 + h * hs, ts, T1, (uint64_t)D * es, pf);
      for (uint32_t g = 0; g < ratio; g += R) {
        const float *qg = w->q + (size_t)(h * ratio + g) * Dp;
        float *sg = sc + (size_t)(h * ratio + g) * n + j0;
        const char *kh = kp + h * hs;
        const float sm = quant ? 1.f : a->scale; /* quant_scores applies it */
        if (R == 4)
          x_scores_rows(qg, Dp, 4, kh, ts, T, D, dt, sm, sg, n);
        else if (R == 2)
          x_scores_rows(qg, Dp, 2, kh, ts, T, D, dt, sm, sg, n);
        else
          x_scores_rows(qg, Dp, 1, kh, ts, T, D, dt, sm, sg, n);
      }
      if (quant)
        quant_head(a, w, kp, h, T, j0, n, dt, 0);
    }
  }

  for (uint32_t hq = 0; hq < H; hq++) {
    w->sum[hq] = x_softmax(sc + (size_t)hq * n, n);
    w->corr[hq] = 0.f;
  }

  /* Weighted values, a block at a time. */
  memset(w->acc, 0, (size_t)H * Dp * sizeof(float));
  for (uint32_t i = 0; i < nb; i++) {
    uint32_t T;
    const char *vp = x_block(a, bt, i, n, kv->v_offset, &T);
    uint32_t T1 = 0;
    const char *vp1 = i + 1 < nb ? x_block(a, bt, i + 1, n, kv->v_offset, &T1)
                                 : vp;
    const uint32_t j0 = i * bs;
    if (quant)
      x_prefetch(vp1 + kv->scale_offset, 0, 1, (uint64_t)T1 * sst * 4, pf);
    for (uint32_t h = 0; h < KVH; h++) {
      x_prefetch(vp1 + h * hs, ts, T1, (uint64_t)D * es, pf);
      if (quant)
        quant_head(a, w, vp, h, T, j0, n, dt, 1);
      for (uint32_t g = 0; g < ratio; g += R) {
        float *ag = w->acc + (size_t)(h * ratio + g) * Dp;
        const float *pg = sc + (size_t)(h * ratio + g) * n + j0;
        if (R == 4)
          x_values(ag, Dp, 4, pg, n, vp + h * hs, ts, T, D, dt);
        else if (R == 2)
          x_values(ag, Dp, 2, pg, n, vp + h * hs, ts, T, D, dt);
        else
          x_values(ag, Dp, 1, pg, n, vp + h * hs, ts, T, D, dt);
      }
    }
  }
  vec_store_out(a, orow, w, Dp, int8 ? w->corr : NULL);
}

/* One instance of a vector body (attr: its target) per cache dtype, dt a
 * constant in each: body_f32, body_f16, body_bf16, body_i8, body_f8. */
#define KVS_BODY_INSTANCE(attr, body, suffix, dt)                          \
  attr static void body##suffix(const kvs_attn_args *a, uint32_t s,        \
                                uint32_t pos, const char *qrow, char *orow, \
                                attn_scratch *w) {                         \
    body(a, s, pos, qrow, orow, w, dt);                                    \
  }
#define KVS_BODY_INSTANCES(attr, body)                      \
  KVS_BODY_INSTANCE(attr, body, _f32, KVS_DTYPE_FP32)       \
  KVS_BODY_INSTANCE(attr, body, _f16, KVS_DTYPE_FP16)       \
  KVS_BODY_INSTANCE(attr, body, _bf16, KVS_DTYPE_BF16)      \
  KVS_BODY_INSTANCE(attr, body, _i8, KVS_DTYPE_INT8)        \
  KVS_BODY_INSTANCE(attr, body, _f8, KVS_DTYPE_FP8)

KVS_BODY_INSTANCES(KVS_X86, attend_row_x86)

/* ---- the AVX-512 body ------------------------------------------------------
 *
 * The same algorithm 16 lanes wide, where the CPU has AVX-512F.  Its 32
 * vector registers let one register block take a whole GQA group of up to 8
 * query heads: a key or value row is converted from 16 bits once for all of
 * them (the AVX2 body, with 16 registers, converts it once per 4 heads).
 *   - scores: R query heads x 16/R tokens (16 accumulators), reduced
 *     together by a tree of lane shuffles;
 *   - values: R query heads x 16/R vectors of 16 dimensions;
 *   - softmax: the AVX2 one (a small share of the time);
 *   - the next block's rows of a kv head are prefetched row by row as the
 *     same rows of the current block are used (z_prefetch_next).
 * Every sum is fp32, as in the other bodies; only the order of the sums
 * differs.
 */
#define KVS_X512 __attribute__((target("avx512f,avx512bw,avx2,fma,f16c")))
#define KVS_X512_INLINE                                                  \
  static inline __attribute__((always_inline,                            \
                               target("avx512f,avx512bw,avx2,fma,f16c")))

/* x_e4m3_h8, 16 at a time; its last step, t ^ (y & 0x4000), is one
 * ternary-logic op (C ? A ^ B : A) on the low halves of zmm registers. */
KVS_X512_INLINE __m256i z_e4m3_h16(__m256i x) {
  __m256i t = _mm256_slli_epi16(x, 7);
  __m256i y = _mm256_add_epi16(t, _mm256_set1_epi16(0x80));
  return _mm512_castsi512_si256(_mm512_ternarylogic_epi32(
      _mm512_castsi256_si512(t), _mm512_castsi256_si512(y),
      _mm512_set1_epi16(0x4000), 0x78));
}

/* 16 elements of dtype dt at p, as floats; int8 and fp8 raw, as x_ld8. */
KVS_X512_INLINE __m512 z_ld16(const void *p, uint32_t dt) {
  if (dt == KVS_DTYPE_INT8) /* byte - 128 */
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_xor_si128(
        _mm_loadu_si128((const __m128i *)p), _mm_set1_epi8(-128))));
  if (dt == KVS_DTYPE_FP8)
    return _mm512_cvtph_ps(z_e4m3_h16(
        _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p))));
  if (dt == KVS_DTYPE_FP16)
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
  if (dt == KVS_DTYPE_BF16)
    return _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
  return _mm512_loadu_ps((const float *)p);
}

/* 32 elements of dtype dt at p, as floats: lo the first 16, hi the next.
 * fp8 converts 32 bytes at once with AVX-512BW word ops (one sign-extend,
 * shift, add and ternary-logic op for 32 elements, not two of each), then
 * two vcvtph2ps; the other dtypes are two z_ld16. */
KVS_X512_INLINE void z_ld32(const void *p, uint32_t dt, __m512 *lo,
                            __m512 *hi) {
  if (dt == KVS_DTYPE_FP8) {
    __m512i x = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)p));
    __m512i t = _mm512_slli_epi16(x, 7);
    __m512i y = _mm512_add_epi16(t, _mm512_set1_epi16(0x80));
    __m512i h = _mm512_ternarylogic_epi32(t, y, _mm512_set1_epi16(0x4000),
                                          0x78);
    *lo = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
    *hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
    return;
  }
  *lo = z_ld16(p, dt);
  *hi = z_ld16((const char *)p + 16 * kvs_dtype_size(dt), dt);
}

/* The first n < 16 elements at p, zero-padded to 16 (int8: -128, as
 * x_ld8_tail). */
KVS_X512_INLINE __m512 z_ld16_tail(const void *p, uint32_t dt, uint32_t n) {
  uint32_t b[16] = {0};
  memcpy(b, p, (size_t)n * kvs_dtype_size(dt));
  return z_ld16(b, dt);
}

/* Lane 4k + j: the sum of the 16 lanes of c[4j + k], for 16 vectors. */
KVS_X512_INLINE __m512 z_reduce16(const __m512 *c) {
  __m512 x[8], y[4];
  for (int i = 0; i < 8; i++) /* halves: c[2i] low, c[2i+1] high */
    x[i] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0xee));
  for (int m = 0; m < 4; m++) /* quarters: c[4m] .. c[4m + 3] */
    y[m] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * m], x[2 * m + 1], 0x88),
                         _mm512_shuffle_f32x4(x[2 * m], x[2 * m + 1], 0xdd));
  __m512 z01 = _mm512_add_ps(_mm512_unpacklo_ps(y[0], y[1]),
                             _mm512_unpackhi_ps(y[0], y[1]));
  __m512 z23 = _mm512_add_ps(_mm512_unpacklo_ps(y[2], y[3]),
                             _mm512_unpackhi_ps(y[2], y[3]));
  __m512d a = _mm512_castps_pd(z01), b = _mm512_castps_pd(z23);
  return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                       _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
}

/*
 * Scores of R query heads (q, rows Dp floats apart, zero-padded to 16)
 * against TT key rows (k, rows ks bytes apart), R * TT == 16 or TT == 1,
 * times scale: sc[r * n + t].
 */
KVS_X512_INLINE void z_scores(const float *q, uint32_t Dp, uint32_t R,
                              const char *k, uint64_t ks, uint32_t TT,
                              uint32_t D, uint32_t dt, float scale, float *sc,
                              uint32_t n) {
  const size_t es = kvs_dtype_size(dt);
  __m512 c[16];
  for (uint32_t i = 0; i < R * TT; i++)
    c[i] = _mm512_setzero_ps();
  uint32_t d = 0;
  if (TT <= 4) /* 32 dimensions a step: 2 * TT rows in registers */
    for (; d + 32 <= D; d += 32) {
      __m512 kv[8];
      for (uint32_t t = 0; t < TT; t++)
        z_ld32(k + t * ks + d * es, dt, &kv[t], &kv[TT + t]);
      for (uint32_t hf = 0; hf < 2; hf++)
        for (uint32_t r = 0; r < R; r++) {
          __m512 qv = _mm512_loadu_ps(q + (size_t)r * Dp + d + 16 * hf);
          __asm__("" : "+v"(qv));
          for (uint32_t t = 0; t < TT; t++)
            c[t * R + r] = _mm512_fmadd_ps(qv, kv[hf * TT + t], c[t * R + r]);
        }
    }
  for (; d < D; d += 16) {
    __m512 kv[16];
    for (uint32_t t = 0; t < TT; t++)
      kv[t] = d + 16 <= D ? z_ld16(k + t * ks + d * es, dt)
                          : z_ld16_tail(k + t * ks + d * es, dt, D - d);
    for (uint32_t r = 0; r < R; r++) {
      __m512 qv = _mm512_loadu_ps(q + (size_t)r * Dp + d);
      __asm__("" : "+v"(qv)); /* one load of q for TT FMAs (see x_scores) */
      for (uint32_t t = 0; t < TT; t++)
        c[t * R + r] = _mm512_fmadd_ps(qv, kv[t], c[t * R + r]);
    }
  }
  if (R == 4 && TT == 4) { /* head r's 4 scores: 128-bit lane r */
    __m512 o = _mm512_mul_ps(z_reduce16(c), _mm512_set1_ps(scale));
    _mm_storeu_ps(sc, _mm512_castps512_ps128(o));
    _mm_storeu_ps(sc + n, _mm512_extractf32x4_ps(o, 1));
    _mm_storeu_ps(sc + 2 * (size_t)n, _mm512_extractf32x4_ps(o, 2));
    _mm_storeu_ps(sc + 3 * (size_t)n, _mm512_extractf32x4_ps(o, 3));
  } else if (R * TT == 16) {
    float o[16];
    _mm512_storeu_ps(o, z_reduce16(c));
    for (uint32_t t = 0; t < TT; t++)
      for (uint32_t r = 0; r < R; r++) {
        uint32_t i = t * R + r;
        sc[(size_t)r * n + t] = o[4 * (i % 4) + i / 4] * scale;
      }
  } else {
    for (uint32_t r = 0; r < R; r++)
      for (uint32_t t = 0; t < TT; t++)
        sc[(size_t)r * n + t] = _mm512_reduce_add_ps(c[t * R + r]) * scale;
  }
}

/* x_exp 16 at a time (the same steps, NaN kept the same way). */
KVS_X512_INLINE __m512 z_exp(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-87.f), x);
  __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.f / 5040.f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.f / 720.f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.f / 120.f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.f / 24.f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.f / 6.f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(0.5f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.f));
  __m512i e = _mm512_slli_epi32(
      _mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}

/* x_softmax 16 at a time, the last scores under a mask: the 8-wide one
 * costs twice the instructions on the port the FMAs use. */
KVS_X512_INLINE float z_softmax(float *sc, uint32_t n) {
  __m512 m = _mm512_set1_ps(-INFINITY);
  uint32_t j = 0;
  for (; j + 16 <= n; j += 16)
    m = _mm512_max_ps(m, _mm512_loadu_ps(sc + j));
  const __mmask16 tm = (__mmask16)((1u << (n - j)) - 1); /* n - j < 16 */
  if (j < n)
    m = _mm512_mask_max_ps(m, tm, m, _mm512_maskz_loadu_ps(tm, sc + j));
  const __m512 mv = _mm512_set1_ps(_mm512_reduce_max_ps(m));
  __m512 s = _mm512_setzero_ps();
  for (j = 0; j + 16 <= n; j += 16) {
    __m512 e = z_exp(_mm512_sub_ps(_mm512_loadu_ps(sc + j), mv));
    _mm512_storeu_ps(sc + j, e);
    s = _mm512_add_ps(s, e);
  }
  if (j < n) {
    __m512 e = z_exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(tm, sc + j), mv));
    _mm512_mask_storeu_ps(sc + j, tm, e);
    s = _mm512_mask_add_ps(s, tm, s, e);
  }
  return _mm512_reduce_add_ps(s);
}

/* The rows of tokens [from, to) below Tn of the next block's same kv head
 * (kn, rows ks bytes apart, row bytes each), prefetched as the AVX-512
 * body reaches the same tokens of the current block: spread over the
 * block's work, since a whole head's rows at once (x_prefetch) stalls
 * waiting for line fill buffers (dev VM, 16 x 4096 tokens, GQA 4, in
 * x memcpy: int8 0.75 at once, 0.83-0.87 spread; fp16 1.12, 1.27). */
KVS_X512_INLINE void z_prefetch_next(const char *kn, uint64_t ks,
                                     uint32_t from, uint32_t to, uint32_t Tn,
                                     uint64_t row, int pf) {
  for (uint32_t i = from; i < to && i < Tn; i++)
    x_prefetch(kn + i * ks, 0, 1, row, pf);
}

/* z_scores over T tokens, 16 / R at a time, then one at a time; the next
 * block's rows (kn, Tn of them) are prefetched along. */
KVS_X512_INLINE void z_scores_rows(const float *q, uint32_t Dp, uint32_t R,
                                   const char *k, uint64_t ks, uint32_t T,
                                   uint32_t D, uint32_t dt, float scale,
                                   float *sc, uint32_t n, const char *kn,
                                   uint32_t Tn, int pf) {
  const uint64_t row = (uint64_t)D * kvs_dtype_size(dt);
  uint32_t t = 0;
  for (; t + 16 / R <= T; t += 16 / R) {
    z_prefetch_next(kn, ks, t, t + 16 / R, Tn, row, pf);
    z_scores(q, Dp, R, k + t * ks, ks, 16 / R, D, dt, scale, sc + t, n);
  }
  for (; t < T; t++) {
    z_prefetch_next(kn, ks, t, t + 1, Tn, row, pf);
    z_scores(q, Dp, R, k + t * ks, ks, 1, D, dt, scale, sc + t, n);
  }
}

/* acc[r] (R rows Dp floats apart) += sum over t < T of p[r * n + t] * v[t];
 * the next block's rows (vn, Tn <= T of them) are prefetched along. */
KVS_X512_INLINE void z_values_tile(float *acc, uint32_t Dp, uint32_t R,
                              const float *p, uint32_t n, const char *v,
                              uint64_t vs, uint32_t T, uint32_t D,
                              uint32_t dt, const char *vn, uint32_t Tn,
                              int pf) {
  const size_t es = kvs_dtype_size(dt);
  const uint32_t V = 16 / R; /* vectors of dimensions per pass */
  uint32_t d = 0;
  for (; d + 16 * V <= D; d += 16 * V) {
    __m512 a[16];
    for (uint32_t r = 0; r < R; r++)
      for (uint32_t i = 0; i < V; i++)
        a[r * V + i] = _mm512_loadu_ps(acc + (size_t)r * Dp + d + 16 * i);
    for (uint32_t t = 0; t < T; t++) {
      if (d == 0)
        z_prefetch_next(vn, vs, t, t + 1, Tn, (uint64_t)D * es, pf);
      __m512 x[16];
      if (V % 2 == 0)
        for (uint32_t i = 0; i < V; i += 2)
          z_ld32(v + t * vs + (d + 16 * i) * es, dt, &x[i], &x[i + 1]);
      else
        for (uint32_t i = 0; i < V; i++)
          x[i] = z_ld16(v + t * vs + (d + 16 * i) * es, dt);
      for (uint32_t r = 0; r < R; r++) {
        __m512 w = _mm512_set1_ps(p[(size_t)r * n + t]);
        for (uint32_t i = 0; i < V; i++)
          a[r * V + i] = _mm512_fmadd_ps(w, x[i], a[r * V + i]);
      }
    }
    for (uint32_t r = 0; r < R; r++)
      for (uint32_t i = 0; i < V; i++)
        _mm512_storeu_ps(acc + (size_t)r * Dp + d + 16 * i, a[r * V + i]);
  }
  for (; d < D; d += 16) { /* one vector at a time, the last one padded */
    __m512 a[8];
    for (uint32_t r = 0; r < R; r++)
      a[r] = _mm512_loadu_ps(acc + (size_t)r * Dp + d);
    for (uint32_t t = 0; t < T; t++) {
      __m512 x = d + 16 <= D ? z_ld16(v + t * vs + d * es, dt)
                             : z_ld16_tail(v + t * vs + d * es, dt, D - d);
      for (uint32_t r = 0; r < R; r++)
        a[r] = _mm512_fmadd_ps(_mm512_set1_ps(p[(size_t)r * n + t]), x, a[r]);
    }
    for (uint32_t r = 0; r < R; r++)
      _mm512_storeu_ps(acc + (size_t)r * Dp + d, a[r]);
  }
}

/* z_values_tile over the weights copied, 64 tokens at a time, into rows a
 * constant 64 floats apart: each of the R weights of a token is then a
 * broadcast at a fixed offset from one register, where R row pointers
 * n floats apart were reloaded from the stack for every token (the
 * registers hold the accumulators, rows and loop state). */
KVS_X512_INLINE void z_values(float *acc, uint32_t Dp, uint32_t R,
                              const float *p, uint32_t n, const char *v,
                              uint64_t vs, uint32_t T, uint32_t D,
                              uint32_t dt, const char *vn, uint32_t Tn,
                              int pf) {
  float pl[8 * 64];
  for (uint32_t t0 = 0; t0 < T; t0 += 64) {
    const uint32_t Tc = T - t0 < 64 ? T - t0 : 64;
    for (uint32_t r = 0; r < R; r++)
      for (uint32_t t = 0; t < Tc; t += 16) {
        const __mmask16 m =
            Tc - t >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (Tc - t)) - 1);
        _mm512_storeu_ps(pl + r * 64 + t,
                         _mm512_maskz_loadu_ps(m, p + (size_t)r * n + t0 + t));
      }
    z_values_tile(acc, Dp, R, pl, 64, v + t0 * vs, vs, Tc, D, dt,
                  vn + t0 * vs, Tn > t0 ? Tn - t0 : 0, pf);
  }
}

KVS_X512_INLINE void attend_row_x512(const kvs_attn_args *a, uint32_t s,
                                     uint32_t pos, const char *qrow,
                                     char *orow, attn_scratch *w,
                                     const uint32_t dt) {
  const kvs_paged_kv *kv = &a->kv;
  const uint32_t D = kv->head_dim, KVH = kv->num_kv_heads, H = a->num_heads;
  const uint32_t Dp = (D + 15) & ~15u, ratio = H / KVH;
  const uint32_t R = ratio % 8 == 0   ? 8
                     : ratio % 4 == 0 ? 4
                     : ratio % 2 == 0 ? 2
                                      : 1;
  const size_t es = kvs_dtype_size(dt);
  const uint64_t ts = kv->token_stride * es, hs = kv->head_stride * es;
  const uint32_t n = pos + 1, bs = kv->block_size;
  const uint32_t nb = (n + bs - 1) / bs;
  const uint32_t *bt = a->block_tables + (uint64_t)s * a->max_blocks_per_seq;
  const int pf = prefetch_mode(2);
  const int quant = kvs_dtype_quantized(dt), int8 = dt == KVS_DTYPE_INT8;
  const uint32_t sst = KVH * kvs_scale_floats(dt);
  float *sc = w->scores; /* [H][n] */
  vec_load_q(a, qrow, w, Dp, int8 ? w->qsum : NULL);
  for (uint32_t i = 0; i < nb; i++) {
    uint32_t T, T1 = 0;
    const char *kp = x_block(a, bt, i, n, kv->k_offset, &T);
    const char *kp1 = i + 1 < nb ? x_block(a, bt, i + 1, n, kv->k_offset, &T1)
                                 : kp;
    const uint32_t j0 = i * bs;
    if (quant)
      x_prefetch(kp1 + kv->scale_offset, 0, 1, (uint64_t)T1 * sst * 4, pf);
    for (uint32_t h = 0; h < KVH; h++) {
      for (uint32_t g = 0; g < ratio; g += R) {
        const float *qg = w->q + (size_t)(h * ratio + g) * Dp;
        float *sg = sc + (size_t)(h * ratio + g) * n + j0;
        const char *kh = kp + h * hs, *kn = kp1 + h * hs;
        const uint32_t Tn = g ? 0 : T1; /* (prefetched once) */
        const float sm = quant ? 1.f : a->scale; /* quant_scores applies it */
        if (R == 8)
          z_scores_rows(qg, Dp, 8, kh, ts, T, D, dt, sm, sg, n, kn, Tn, pf);
        else if (R == 4)
          z_scores_rows(qg, Dp, 4, kh, ts, T, D, dt, sm, sg, n, kn, Tn, pf);
        else if (R == 2)
          z_scores_rows(qg, Dp, 2, kh, ts, T, D, dt, sm, sg, n, kn, Tn, pf);
        else
          z_scores_rows(qg, Dp, 1, kh, ts, T, D, dt, sm, sg, n, kn, Tn, pf);
      }
      if (quant)
        quant_head(a, w, kp, h, T, j0, n, dt, 0);
    }
  }
  for (uint32_t hq = 0; hq < H; hq++) {
    w->sum[hq] = z_softmax(sc + (size_t)hq * n, n);
    w->corr[hq] = 0.f;
  }
  memset(w->acc, 0, (size_t)H * Dp * sizeof(float));
  for (uint32_t i = 0; i < nb; i++) {
    uint32_t T, T1 = 0;
    const char *vp = x_block(a, bt, i, n, kv->v_offset, &T);
    const char *vp1 = i + 1 < nb ? x_block(a, bt, i + 1, n, kv->v_offset, &T1)
                                 : vp;
    const uint32_t j0 = i * bs;
    if (quant)
      x_prefetch(vp1 + kv->scale_offset, 0, 1, (uint64_t)T1 * sst * 4, pf);
    for (uint32_t h = 0; h < KVH; h++) {
      if (quant)
        quant_head(a, w, vp, h, T, j0, n, dt, 1);
      for (uint32_t g = 0; g < ratio; g += R) {
        float *ag = w->acc + (size_t)(h * ratio + g) * Dp;
        const float *pg = sc + (size_t)(h * ratio + g) * n + j0;
        const char *vh = vp + h * hs, *vn = vp1 + h * hs;
        const uint32_t Tn = g ? 0 : T1;
        if (R == 8)
          z_values(ag, Dp, 8, pg, n, vh, ts, T, D, dt, vn, Tn, pf);
        else if (R == 4)
          z_values(ag, Dp, 4, pg, n, vh, ts, T, D, dt, vn, Tn, pf);
        else if (R == 2)
          z_values(ag, Dp, 2, pg, n, vh, ts, T, D, dt, vn, Tn, pf);
        else
          z_values(ag, Dp, 1, pg, n, vh, ts, T, D, dt, vn, Tn, pf);
      }
    }
  }
  vec_store_out(a, orow, w, Dp, int8 ? w->corr : NULL);
}

KVS_BODY_INSTANCES(KVS_X512, attend_row_x512)
#endif /* x86 */

typedef void (*attend_fn)(const kvs_attn_args *, uint32_t, uint32_t,
                          const char *, char *, attn_scratch *);

/* 1: the portable body even where a vector one could run (tests, bench). */
int kvs__cpu_attn_portable = 0;
/* 0: the AVX2 body even where the AVX-512 one could run (tests, bench). */
int kvs__cpu_attn_avx512 = 1;

int kvs__cpu_attn_simd(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
#else
  return 0;
#endif
}

/* The AVX-512 body also uses AVX-512BW word ops (z_ld32). */
int kvs__cpu_attn_simd512(void) {
#if defined(__x86_64__) || defined(__i386__)
  /* (libgcc's check includes the OS saving the 512-bit state.) */
  return kvs__cpu_attn_simd() && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bw");
#else
  return 0;
#endif
}

const char *kvs__cpu_attn_body(void) {
  if (kvs__cpu_attn_portable || !kvs__cpu_attn_simd())
    return "portable C";
  if (kvs__cpu_attn_avx512 && kvs__cpu_attn_simd512())
    return "AVX-512F";
  return "AVX2+FMA+F16C";
}

static attend_fn pick_attend(uint32_t dtype) {
#if defined(__x86_64__) || defined(__i386__)
  /* indexed by kvs_dtype */
  static const attend_fn x512[KVS_DTYPE__COUNT] = {
      attend_row_x512_f32, attend_row_x512_f16, attend_row_x512_bf16,
      attend_row_x512_i8, attend_row_x512_f8};
  static const attend_fn x86[KVS_DTYPE__COUNT] = {
      attend_row_x86_f32, attend_row_x86_f16, attend_row_x86_bf16,
      attend_row_x86_i8, attend_row_x86_f8};
  if (!kvs__cpu_attn_portable && kvs__cpu_attn_avx512 &&
      kvs__cpu_attn_simd512())
    return x512[dtype];
  if (!kvs__cpu_attn_portable && kvs__cpu_attn_simd())
    return x86[dtype];
#endif
  (void)dtype;
  return attend_row_base;
}

static int cpu_attention(const kvs_attn_args *a, int prefill) {
  int rc = kvs__check_attn(a, prefill);
  if (rc || a->num_seqs == 0)
    return rc;
  const kvs_paged_kv *kv = &a->kv;
  uint32_t D = kv->head_dim, H = a->num_heads;
  size_t qes = kvs_dtype_size(a->qo_dtype);
  uint64_t row_bytes = (uint64_t)H * D * qes;

  /* Check every request before touching the output. */
  uint32_t max_len = 1;
  for (uint32_t s = 0; s < a->num_seqs; s++) {
    uint32_t len = a->seq_lens[s];
    uint32_t q0 = prefill ? a->q_start[s] : s;
    uint32_t q1 = prefill ? a->q_start[s + 1] : s + 1;
    if (q1 < q0 || q1 > a->num_rows || (prefill && s == 0 && q0 != 0) ||
        (len > 0 && q1 - q0 > len) || len > a->max_seq_len)
      return KVS_EINVAL;
    if (prefill && s + 1 == a->num_seqs && q1 != a->num_rows)
      return KVS_EINVAL;
    uint32_t nb = (len + kv->block_size - 1) / kv->block_size;
    if (nb > a->max_blocks_per_seq)
      return KVS_EINVAL;
    for (uint32_t b = 0; kv->num_blocks && b < nb; b++)
      if (a->block_tables[(uint64_t)s * a->max_blocks_per_seq + b] >=
          kv->num_blocks)
        return KVS_ERANGE;
    max_len = len > max_len ? len : max_len;
  }

  uint32_t KVH = kv->num_kv_heads;
  attn_scratch w;
  w.max_len = max_len;
  /* q and acc rows are padded to a multiple of 16 floats (the vector
   * bodies read whole vectors, of 8 or 16; the portable one uses the first
   * D of each). */
  size_t Dp = (D + 15) & ~(size_t)15;
  float *mem = malloc(((size_t)2 * H * Dp + (size_t)KVS__CPU_TILE * KVH * D +
                       3 * (size_t)H + 2 * (size_t)kv->block_size +
                       (size_t)H * max_len) * sizeof(float));
  if (!mem)
    return KVS_ENOMEM;
  w.q = mem;
  w.acc = w.q + (size_t)H * Dp;
  w.row = w.acc + (size_t)H * Dp;
  w.sum = w.row + (size_t)KVS__CPU_TILE * KVH * D;
  w.qsum = w.sum + H;
  w.corr = w.qsum + H;
  w.qmul = w.corr + H;
  w.qlo = w.qmul + kv->block_size;
  w.scores = w.qlo + kv->block_size;
  attend_fn attend = pick_attend(kv->dtype);

  for (uint32_t s = 0; s < a->num_seqs; s++) {
    uint32_t len = a->seq_lens[s];
    uint32_t q0 = prefill ? a->q_start[s] : s;
    uint32_t q1 = prefill ? a->q_start[s + 1] : s + 1;
    for (uint32_t r = q0; r < q1; r++) {
      const char *qrow = (const char *)a->q + r * row_bytes;
      char *orow = (char *)a->out + r * row_bytes;
      if (len == 0) {
        memset(orow, 0, row_bytes);
        continue;
      }
      attend(a, s, len - (q1 - q0) + (r - q0), qrow, orow, &w);
    }
  }
  free(mem);
  return 0;
}

int kvs_cpu_decode_attention(const kvs_attn_args *a, void *stream) {
  (void)stream;
  if (a && a->q_start)
    return KVS_EINVAL;
  return cpu_attention(a, 0);
}

int kvs_cpu_prefill_attention(const kvs_attn_args *a, void *stream) {
  (void)stream;
  return cpu_attention(a, 1);
}

/* ---- whole blocks ----------------------------------------------------------- */

int kvs_cpu_copy_blocks(const kvs_copy_args *a, void *stream) {
  (void)stream;
  if (!a || (a->num_pairs && (!a->base || !a->pairs)) || a->block_stride == 0)
    return KVS_EINVAL;
  for (uint32_t i = 0; a->num_blocks && i < 2 * a->num_pairs; i++)
    if (a->pairs[i] >= a->num_blocks)
      return KVS_ERANGE;
  for (uint32_t i = 0; i < a->num_pairs; i++) {
    uint32_t src = a->pairs[2 * i], dst = a->pairs[2 * i + 1];
    if (src != dst)
      memcpy((char *)a->base + (uint64_t)dst * a->block_stride,
             (const char *)a->base + (uint64_t)src * a->block_stride,
             a->block_stride);
  }
  return 0;
}

static int cpu_xfer(const kvs_xfer_args *a, int to_staging) {
  if (!a || (a->count && (!a->base || !a->staging || !a->blocks)) ||
      a->block_stride == 0)
    return KVS_EINVAL;
  for (uint32_t i = 0; a->num_blocks && i < a->count; i++)
    if (a->blocks[i] >= a->num_blocks)
      return KVS_ERANGE;
  for (uint32_t i = 0; i < a->count; i++) {
    char *blk = (char *)a->base + (uint64_t)a->blocks[i] * a->block_stride;
    char *stg = (char *)a->staging + (uint64_t)i * a->block_stride;
    if (to_staging)
      memcpy(stg, blk, a->block_stride);
    else
      memcpy(blk, stg, a->block_stride);
  }
  return 0;
}

int kvs_cpu_gather_blocks(const kvs_xfer_args *a, void *stream) {
  (void)stream;
  return cpu_xfer(a, 1);
}

int kvs_cpu_scatter_blocks(const kvs_xfer_args *a, void *stream) {
  (void)stream;
  return cpu_xfer(a, 0);
}
