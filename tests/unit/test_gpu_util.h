/*
 * test_gpu_util.h — helpers shared by the kernel tests: a seeded generator,
 * a random paged-attention case (pool, shuffled block tables, contiguous
 * copies of every request's K/V), and the naive contiguous reference
 * attention, written plainly in double precision.
 */
#ifndef TEST_GPU_UTIL_H
#define TEST_GPU_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/kvs_kernels.h"

static inline uint64_t tg_next(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
static inline float tg_unif(uint64_t *s) {
  return (float)((double)(tg_next(s) >> 11) * 0x1p-52 - 1.0);
}

static inline void *tg_xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) {
    fprintf(stderr, "out of memory\n");
    exit(2);
  }
  return p;
}

/* Round a float through a dtype (what the cache can hold). */
static inline float tg_round(float f, uint32_t dtype) {
  switch (dtype) {
  case KVS_DTYPE_FP16:
    return kvs_fp16_to_float(kvs_float_to_fp16(f));
  case KVS_DTYPE_BF16:
    return kvs_bf16_to_float(kvs_float_to_bf16(f));
  default:
    return f;
  }
}

typedef struct tg_params {
  uint32_t block_size, num_kv_heads, head_dim, ratio, dtype, qo_dtype;
  uint32_t num_layers, layer;
  uint32_t num_seqs;
  const uint32_t *lens;  /* [num_seqs] keys per request */
  const uint32_t *qlens; /* NULL: decode; else new tokens per request */
  uint32_t spare_blocks; /* extra pool blocks holding garbage */
  float q_scale;         /* magnitude of q (sharpness of the softmax) */
  uint64_t seed;
} tg_params;

typedef struct tg_case {
  tg_params p;
  kvs_layout layout;
  void *pool;           /* host pool, kvs_pool_bytes(&layout) */
  uint32_t *seq_lens;   /* [num_seqs] */
  uint32_t *q_start;    /* [num_seqs + 1] or NULL */
  uint32_t *tables;     /* [num_seqs][max_blocks] */
  uint32_t max_blocks, max_len, num_rows, num_heads;
  float **k, **v;       /* per request: contiguous [len][kvh][D], rounded */
  float *qf;            /* [num_rows][H][D], rounded to qo dtype */
  void *q;              /* same, in qo dtype */
} tg_case;

static inline void tg_case_free(tg_case *c) {
  for (uint32_t s = 0; s < c->p.num_seqs; s++) {
    free(c->k[s]);
    free(c->v[s]);
  }
  free(c->k);
  free(c->v);
  free(c->pool);
  free(c->seq_lens);
  free(c->q_start);
  free(c->tables);
  free(c->qf);
  free(c->q);
  memset(c, 0, sizeof *c);
}

/* Element i of a quantized row (dtype int8 or fp8) with its scales, as a
 * float (what the kernels read; the reference attends over these): int8
 * byte * scale + min with the byte unsigned, fp8 value * scale. */
static inline float tg_dequant(const void *row, uint32_t dtype, uint32_t i,
                               const float *scales) {
  uint8_t b = ((const uint8_t *)row)[i];
  if (dtype == KVS_DTYPE_INT8)
    return (float)b * scales[0] + scales[1];
  return kvs_fp8_to_float(b) * scales[0];
}

/* An int8 row as the kernels read it: the dequantized bytes are a rotated
 * row (docs/kernels.md, "Quantized KV blocks"), so row = H y, H the
 * Sylvester Hadamard matrix of each power-of-two segment of the row
 * (largest first), entry (i, j) = (-1)^popcount(i & j): the matrix product
 * itself, in double, not the kernels' butterflies. */
static inline void tg_unrotate(float *row, uint32_t n) {
  double y[4096];
  for (uint32_t off = 0; off < n;) {
    uint32_t m = 1;
    while (2 * m <= n - off)
      m *= 2;
    for (uint32_t i = 0; i < m; i++) {
      double x = 0;
      for (uint32_t j = 0; j < m; j++)
        x += (__builtin_popcount(i & j) % 2 ? -1.0 : 1.0) * row[off + j];
      y[i] = x;
    }
    for (uint32_t i = 0; i < m; i++)
      row[off + i] = (float)y[i];
    off += m;
  }
}

/* Quantized cache: request s's tokens go in through the write kernel (its
 * bytes and scales are checked against numpy in test_gpu_quant), and its
 * contiguous K/V become what the cache now holds, dequantized. */
static inline void tg_write_quantized(tg_case *c, uint32_t s) {
  const kvs_layout *l = &c->layout;
  uint32_t len = c->p.lens[s], bs = l->block_size, kvh = l->num_kv_heads;
  uint32_t D = l->head_dim;
  int64_t *slots = tg_xmalloc(sizeof(int64_t) * len);
  for (uint32_t t = 0; t < len; t++)
    slots[t] = (int64_t)c->tables[s * c->max_blocks + t / bs] * bs + t % bs;
  kvs_write_args w = {.k = c->k[s], .v = c->v[s], .slots = slots,
                      .src_token_stride = (uint64_t)kvh * D,
                      .src_dtype = KVS_DTYPE_FP32, .num_tokens = len};
  if (kvs_paged_kv_init(&w.kv, c->pool, l, c->p.layer) ||
      kvs_cpu_write_kv(&w, NULL)) {
    fprintf(stderr, "tg_write_quantized: the write kernel failed\n");
    exit(2);
  }
  for (uint32_t t = 0; t < len; t++)
    for (uint32_t kv = 0; kv < 2; kv++)
      for (uint32_t h = 0; h < kvh; h++) {
        uint32_t b = (uint32_t)(slots[t] / bs);
        const void *row = kvs_elem_ptr(c->pool, l, b, c->p.layer, kv, t % bs, h);
        const float *sc = kvs_scale_ptr(c->pool, l, b, c->p.layer, kv, t % bs, h);
        float *dst = (kv ? c->v[s] : c->k[s]) + ((size_t)t * kvh + h) * D;
        for (uint32_t d = 0; d < D; d++)
          dst[d] = tg_dequant(row, l->dtype, d, sc);
        if (l->dtype == KVS_DTYPE_INT8)
          tg_unrotate(dst, D);
      }
  free(slots);
}

/* Build a case.  Returns 0, or -1 when the layout is refused. */
static inline int tg_case_build(tg_case *c, const tg_params *p) {
  memset(c, 0, sizeof *c);
  c->p = *p;
  uint64_t rng = p->seed;
  uint32_t bs = p->block_size, kvh = p->num_kv_heads, D = p->head_dim;
  c->num_heads = kvh * p->ratio;
  uint32_t total_blocks = p->spare_blocks;
  c->max_blocks = 1;
  for (uint32_t s = 0; s < p->num_seqs; s++) {
    uint32_t nb = (p->lens[s] + bs - 1) / bs;
    total_blocks += nb;
    if (nb > c->max_blocks)
      c->max_blocks = nb;
    if (p->lens[s] > c->max_len)
      c->max_len = p->lens[s];
  }
  c->max_blocks += 1; /* a spare column, filled with garbage indexes */
  kvs_layout l = {.block_size = bs,
                  .num_layers = p->num_layers,
                  .num_kv_heads = kvh,
                  .head_dim = D,
                  .dtype = p->dtype,
                  .num_blocks = total_blocks ? total_blocks : 1};
  if (kvs_layout_finish(&l))
    return -1;
  c->layout = l;
  size_t es = kvs_dtype_size(p->dtype);
  const int quant = kvs_dtype_quantized(p->dtype);

  /* Garbage everywhere (other layers, spare blocks, unused slots).  A
   * quantized pool gets random bytes (fp8 NaN codes among them) and every
   * scale and int8 minimum NaN, +Inf or -Inf until a token is written:
   * nothing of an unused slot may reach an output. */
  uint64_t pool_elems = kvs_pool_bytes(&l) / es;
  c->pool = tg_xmalloc(kvs_pool_bytes(&l));
  if (quant) {
    for (uint64_t i = 0; i < pool_elems; i++)
      ((uint8_t *)c->pool)[i] = (uint8_t)tg_next(&rng);
    static const float poison[] = {NAN, INFINITY, -INFINITY};
    for (uint32_t b = 0; b < l.num_blocks; b++)
      for (uint32_t ly = 0; ly < l.num_layers; ly++)
        for (uint32_t kv = 0; kv < 2; kv++)
          for (uint32_t t = 0; t < bs; t++)
            for (uint32_t h = 0; h < kvh; h++)
              for (uint32_t f = 0; f < kvs_scale_floats(l.dtype); f++)
                kvs_scale_ptr(c->pool, &l, b, ly, kv, t, h)[f] =
                    poison[(b + t + h + kv + f) % 3];
  }
  for (uint64_t i = 0; !quant && i < pool_elems; i++) {
    float g = 40.f * tg_unif(&rng);
    kvs_convert((char *)c->pool + i * es, p->dtype, &g, KVS_DTYPE_FP32, 1);
  }

  /* A shuffled permutation of the pool's blocks hands out the tables. */
  uint32_t *perm = tg_xmalloc(sizeof(uint32_t) * l.num_blocks);
  for (uint32_t i = 0; i < l.num_blocks; i++)
    perm[i] = i;
  for (uint32_t i = l.num_blocks; i > 1; i--) {
    uint32_t j = (uint32_t)(tg_next(&rng) % i);
    uint32_t t = perm[i - 1];
    perm[i - 1] = perm[j];
    perm[j] = t;
  }
  c->seq_lens = tg_xmalloc(sizeof(uint32_t) * p->num_seqs);
  c->tables = tg_xmalloc(sizeof(uint32_t) * p->num_seqs * c->max_blocks);
  c->k = tg_xmalloc(sizeof(float *) * p->num_seqs);
  c->v = tg_xmalloc(sizeof(float *) * p->num_seqs);
  uint32_t next = 0;
  for (uint32_t s = 0; s < p->num_seqs; s++) {
    uint32_t len = p->lens[s];
    c->seq_lens[s] = len;
    uint32_t nb = (len + bs - 1) / bs;
    for (uint32_t b = 0; b < c->max_blocks; b++)
      c->tables[s * c->max_blocks + b] =
          b < nb ? perm[next++] : (uint32_t)(tg_next(&rng) % l.num_blocks);
    size_t n = (size_t)len * kvh * D;
    c->k[s] = tg_xmalloc(sizeof(float) * n);
    c->v[s] = tg_xmalloc(sizeof(float) * n);
    for (uint32_t t = 0; t < len; t++)
      for (uint32_t h = 0; h < kvh; h++)
        for (uint32_t d = 0; d < D; d++) {
          size_t i = ((size_t)t * kvh + h) * D + d;
          c->k[s][i] = tg_round(tg_unif(&rng), p->dtype);
          c->v[s][i] = tg_round(tg_unif(&rng), p->dtype);
          if (quant)
            continue;
          uint32_t blk = c->tables[s * c->max_blocks + t / bs];
          char *kp = kvs_elem_ptr(c->pool, &l, blk, p->layer, 0, t % bs, h);
          char *vp = kvs_elem_ptr(c->pool, &l, blk, p->layer, 1, t % bs, h);
          kvs_convert(kp + d * es, p->dtype, &c->k[s][i], KVS_DTYPE_FP32, 1);
          kvs_convert(vp + d * es, p->dtype, &c->v[s][i], KVS_DTYPE_FP32, 1);
        }
    if (quant && len)
      tg_write_quantized(c, s);
  }
  free(perm);

  if (p->qlens) {
    c->q_start = tg_xmalloc(sizeof(uint32_t) * (p->num_seqs + 1));
    c->q_start[0] = 0;
    for (uint32_t s = 0; s < p->num_seqs; s++)
      c->q_start[s + 1] = c->q_start[s] + p->qlens[s];
    c->num_rows = c->q_start[p->num_seqs];
  } else {
    c->num_rows = p->num_seqs;
  }
  size_t nq = (size_t)c->num_rows * c->num_heads * D;
  c->qf = tg_xmalloc(sizeof(float) * nq);
  c->q = tg_xmalloc(nq * kvs_dtype_size(p->qo_dtype));
  for (size_t i = 0; i < nq; i++)
    c->qf[i] = tg_round(p->q_scale * tg_unif(&rng), p->qo_dtype);
  kvs_convert(c->q, p->qo_dtype, c->qf, KVS_DTYPE_FP32, nq);
  return 0;
}

/* A 16-bit pool: NaN, +Inf and -Inf in every element that no request's
 * token of the case's layer holds (unused slots of used blocks, spare
 * blocks, other layers): nothing of them may reach an output. */
static inline void tg_poison_unused(tg_case *c) {
  const kvs_layout *l = &c->layout;
  uint32_t bs = l->block_size;
  char *used = calloc((size_t)l->num_blocks * bs, 1);
  if (!used || kvs_dtype_size(l->dtype) != 2) {
    fprintf(stderr, "tg_poison_unused: out of memory or not a 16-bit pool\n");
    exit(2);
  }
  for (uint32_t s = 0; s < c->p.num_seqs; s++)
    for (uint32_t t = 0; t < c->p.lens[s]; t++)
      used[(size_t)c->tables[s * c->max_blocks + t / bs] * bs + t % bs] = 1;
  static const float bad[] = {NAN, INFINITY, -INFINITY};
  for (uint32_t b = 0; b < l->num_blocks; b++)
    for (uint32_t ly = 0; ly < l->num_layers; ly++)
      for (uint32_t kv = 0; kv < 2; kv++)
        for (uint32_t t = 0; t < bs; t++) {
          if (ly == c->p.layer && used[(size_t)b * bs + t])
            continue;
          for (uint32_t h = 0; h < l->num_kv_heads; h++) {
            char *e = (char *)kvs_elem_ptr(c->pool, l, b, ly, kv, t, h);
            for (uint32_t d = 0; d < l->head_dim; d++)
              kvs_convert(e + 2 * d, l->dtype, &bad[(b + t + h + d) % 3],
                          KVS_DTYPE_FP32, 1);
          }
        }
  free(used);
}

/* A ragged prefill batch: (cached prefix, new rows) per request. */
typedef struct tg_ragged {
  uint32_t n;
  uint32_t prefix[8], qlen[8];
} tg_ragged;

/* The case of *pp for batch bt: lens (bt->n entries, kept for the case's
 * life) gets prefix + new rows per request; a 16-bit pool's unused memory
 * is poisoned.  0, or -1 when the layout is refused. */
static inline int tg_ragged_case(tg_case *c, const tg_params *pp,
                                 const tg_ragged *bt, uint32_t *lens) {
  tg_params p = *pp;
  for (uint32_t s = 0; s < bt->n; s++)
    lens[s] = bt->prefix[s] + bt->qlen[s];
  p.num_seqs = bt->n;
  p.lens = lens;
  p.qlens = bt->qlen;
  if (tg_case_build(c, &p))
    return -1;
  if (kvs_dtype_size(p.dtype) == 2)
    tg_poison_unused(c);
  return 0;
}

/* Attention args for the case over a pool at `base` (host or device), with
 * metadata arrays given (host or device). */
static inline void tg_case_args(const tg_case *c, kvs_attn_args *a, void *base,
                                void *out, const void *q,
                                const uint32_t *seq_lens,
                                const uint32_t *q_start,
                                const uint32_t *tables) {
  memset(a, 0, sizeof *a);
  kvs_paged_kv_init(&a->kv, base, &c->layout, c->p.layer);
  a->out = out;
  a->q = q;
  a->seq_lens = seq_lens;
  a->q_start = q_start;
  a->block_tables = tables;
  a->num_seqs = c->p.num_seqs;
  a->num_rows = c->num_rows;
  a->num_heads = c->num_heads;
  a->max_blocks_per_seq = c->max_blocks;
  a->max_seq_len = c->max_len;
  a->qo_dtype = c->p.qo_dtype;
  a->scale = 1.0f / sqrtf((float)c->p.head_dim);
}

/* The naive reference: contiguous K/V, one query head at a time, causal
 * within the new tokens, double precision.  ref: [num_rows][H][D]. */
static inline void tg_naive(const tg_case *c, double *ref) {
  uint32_t kvh = c->p.num_kv_heads, D = c->p.head_dim, H = c->num_heads;
  double scale = 1.0 / sqrt((double)D);
  double *w = tg_xmalloc(sizeof(double) * (c->max_len + 1));
  for (uint32_t s = 0; s < c->p.num_seqs; s++) {
    uint32_t len = c->p.lens[s];
    uint32_t qlen = c->q_start ? c->q_start[s + 1] - c->q_start[s] : 1;
    uint32_t r0 = c->q_start ? c->q_start[s] : s;
    for (uint32_t i = 0; i < qlen; i++) {
      uint32_t row = r0 + i;
      uint32_t nkeys = len == 0 ? 0 : len - qlen + i + 1;
      for (uint32_t hq = 0; hq < H; hq++) {
        uint32_t h = hq / (H / kvh);
        const float *q = c->qf + ((size_t)row * H + hq) * D;
        double *o = ref + ((size_t)row * H + hq) * D;
        double mx = -INFINITY, sum = 0;
        for (uint32_t t = 0; t < nkeys; t++) {
          const float *k = c->k[s] + ((size_t)t * kvh + h) * D;
          double x = 0;
          for (uint32_t d = 0; d < D; d++)
            x += (double)q[d] * k[d];
          w[t] = x * scale;
          if (w[t] > mx)
            mx = w[t];
        }
        for (uint32_t t = 0; t < nkeys; t++) {
          w[t] = exp(w[t] - mx);
          sum += w[t];
        }
        for (uint32_t d = 0; d < D; d++) {
          double x = 0;
          for (uint32_t t = 0; t < nkeys; t++)
            x += w[t] * c->v[s][((size_t)t * kvh + h) * D + d];
          o[d] = nkeys ? x / sum : 0.0;
        }
      }
    }
  }
  free(w);
}

/* Largest error allowed for one output element of a dtype (|v| <= 1). */
static inline double tg_tol(uint32_t qo_dtype) {
  switch (qo_dtype) {
  case KVS_DTYPE_FP16:
    return 2e-3;
  case KVS_DTYPE_BF16:
    return 1.6e-2;
  default:
    return 5e-5;
  }
}

/*
 * How far the CUDA kernel may be from its C twin, both rounded to the output
 * dtype: one unit in the last place of that dtype at the value (the
 * tensor-core kernel rounds softmax weights to the cache dtype, so a result
 * near a rounding boundary may land on the next value), and no less than
 * 4e-4 (fp16) or 3e-3 (bf16) where values are small; fp32 outputs, summed
 * in another order, 2e-5.  A dropped key among 257 moves a result by about
 * 1/257 of a value: well outside.
 */
static inline double tg_twin_tol(uint32_t qo_dtype, double v) {
  int e;
  frexp(fabs(v), &e); /* |v| in [2^(e-1), 2^e) */
  switch (qo_dtype) {
  case KVS_DTYPE_FP16: {
    double ulp = ldexp(1.0, (e - 1 < -14 ? -14 : e - 1) - 10);
    return ulp > 4e-4 ? ulp : 4e-4;
  }
  case KVS_DTYPE_BF16: {
    double ulp = ldexp(1.0, e - 1 - 7);
    return ulp > 3e-3 ? ulp : 3e-3;
  }
  default:
    return 2e-5;
  }
}

/* The worst |gpu - twin| / tg_twin_tol over n outputs in dtype (NaN in
 * either: 1e30); at most 1 passes. */
static inline double tg_twin_excess(const void *gpu, const void *twin,
                                    uint32_t dtype, size_t n) {
  double worst = 0;
  size_t es = kvs_dtype_size(dtype);
  for (size_t i = 0; i < n; i++) {
    float g, t;
    kvs_convert(&g, KVS_DTYPE_FP32, (const char *)gpu + i * es, dtype, 1);
    kvs_convert(&t, KVS_DTYPE_FP32, (const char *)twin + i * es, dtype, 1);
    double x = isnan(g) || isnan(t) ? 1e30
                                    : fabs((double)g - t) / tg_twin_tol(dtype, t);
    if (x > worst)
      worst = x;
  }
  return worst;
}

/* Max |out - ref| over n elements of out (in dtype); NaN counts as 1e30. */
static inline double tg_max_err(const void *out, uint32_t dtype,
                                const double *ref, size_t n) {
  double worst = 0;
  for (size_t i = 0; i < n; i++) {
    float f;
    kvs_convert(&f, KVS_DTYPE_FP32,
                (const char *)out + i * kvs_dtype_size(dtype), dtype, 1);
    double e = isnan(f) ? 1e30 : fabs((double)f - ref[i]);
    if (e > worst)
      worst = e;
  }
  return worst;
}

#endif /* TEST_GPU_UTIL_H */
