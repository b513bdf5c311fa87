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

/* Bits -> float for one row of n elements; vectorisable (no branches). */
static void load_row(float *restrict dst, const void *restrict src,
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
      dst[i] = kvs_fp16_to_float(s[i]);
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

/* Dot product with eight independent partial sums (fp32). */
static inline float dot(const float *restrict a, const float *restrict b,
                        uint32_t n) {
  float acc[8] = {0};
  uint32_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (uint32_t j = 0; j < 8; j++)
      acc[j] += a[i + j] * b[i + j];
  for (; i < n; i++)
    acc[0] += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) +
         ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

static inline void axpy(float *restrict y, float w, const float *restrict x,
                        uint32_t n) {
  for (uint32_t i = 0; i < n; i++)
    y[i] += w * x[i];
}

/* ---- write ---------------------------------------------------------------- */

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
  size_t ses = kvs_dtype_size(a->src_dtype), des = kvs_dtype_size(kv->dtype);
  uint64_t limit = (uint64_t)kv->num_blocks * kv->block_size;
  for (uint32_t i = 0; i < a->num_tokens; i++) /* check before writing */
    if (kv->num_blocks && a->slots[i] >= 0 && (uint64_t)a->slots[i] >= limit)
      return KVS_ERANGE;
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
  float *q;      /* [G][D] */
  float *acc;    /* [G][D] */
  float *row;    /* [D] */
  float *scores; /* [G][max_len] */
  uint32_t max_len;
} attn_scratch;

/*
 * One query row of request s at position pos, the G query heads of kv head
 * h starting at query head hq0: keys 0..pos.
 */
static void attend_row(const kvs_attn_args *a, uint32_t s, uint32_t h,
                       uint32_t hq0, uint32_t G, uint32_t pos,
                       const char *qrow, char *orow, attn_scratch *w) {
  const kvs_paged_kv *kv = &a->kv;
  uint32_t D = kv->head_dim;
  size_t es = kvs_dtype_size(kv->dtype), qes = kvs_dtype_size(a->qo_dtype);
  uint32_t n = pos + 1;
  const uint32_t *bt = a->block_tables + (uint64_t)s * a->max_blocks_per_seq;
  for (uint32_t g = 0; g < G; g++)
    load_row(w->q + (size_t)g * D, qrow + (size_t)(hq0 + g) * D * qes,
             a->qo_dtype, D);

  /* Scores. */
  for (uint32_t j = 0; j < n; j++) {
    const char *blk = (const char *)kv->base +
                      (uint64_t)bt[j / kv->block_size] * kv->block_stride;
    uint64_t off = ((uint64_t)(j % kv->block_size) * kv->token_stride +
                    (uint64_t)h * kv->head_stride) * es;
    const float *k;
    if (kv->dtype == KVS_DTYPE_FP32) {
      k = (const float *)(const void *)(blk + kv->k_offset + off);
    } else {
      load_row(w->row, blk + kv->k_offset + off, kv->dtype, D);
      k = w->row;
    }
    for (uint32_t g = 0; g < G; g++)
      w->scores[(size_t)g * w->max_len + j] =
          dot(w->q + (size_t)g * D, k, D) * a->scale;
  }

  /* Softmax numerators, in place. */
  float sum[KVS__ATTN_MAX_GROUP];
  for (uint32_t g = 0; g < G; g++) {
    float *sc = w->scores + (size_t)g * w->max_len;
    float m = -INFINITY;
    for (uint32_t j = 0; j < n; j++)
      m = sc[j] > m ? sc[j] : m;
    float l = 0.f;
    for (uint32_t j = 0; j < n; j++) {
      sc[j] = expf(sc[j] - m);
      l += sc[j];
    }
    sum[g] = l;
  }

  /* Weighted values. */
  memset(w->acc, 0, (size_t)G * D * sizeof(float));
  for (uint32_t j = 0; j < n; j++) {
    const char *blk = (const char *)kv->base +
                      (uint64_t)bt[j / kv->block_size] * kv->block_stride;
    uint64_t off = ((uint64_t)(j % kv->block_size) * kv->token_stride +
                    (uint64_t)h * kv->head_stride) * es;
    const float *v;
    if (kv->dtype == KVS_DTYPE_FP32) {
      v = (const float *)(const void *)(blk + kv->v_offset + off);
    } else {
      load_row(w->row, blk + kv->v_offset + off, kv->dtype, D);
      v = w->row;
    }
    for (uint32_t g = 0; g < G; g++)
      axpy(w->acc + (size_t)g * D, w->scores[(size_t)g * w->max_len + j], v,
           D);
  }
  for (uint32_t g = 0; g < G; g++) {
    float *acc = w->acc + (size_t)g * D;
    float inv = 1.f / sum[g];
    for (uint32_t d = 0; d < D; d++)
      acc[d] *= inv;
    store_row(orow + (size_t)(hq0 + g) * D * qes, a->qo_dtype, acc, D);
  }
}

static int cpu_attention(const kvs_attn_args *a, int prefill) {
  int rc = kvs__check_attn(a, prefill);
  if (rc || a->num_seqs == 0)
    return rc;
  const kvs_paged_kv *kv = &a->kv;
  uint32_t D = kv->head_dim, H = a->num_heads;
  uint32_t ratio = H / kv->num_kv_heads;
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

  uint32_t G = ratio < KVS__ATTN_MAX_GROUP ? ratio : KVS__ATTN_MAX_GROUP;
  attn_scratch w;
  w.max_len = max_len;
  float *mem = malloc(((size_t)3 * G * D + D + (size_t)G * max_len) *
                      sizeof(float));
  if (!mem)
    return KVS_ENOMEM;
  w.q = mem;
  w.acc = w.q + (size_t)G * D;
  w.row = w.acc + (size_t)G * D;
  w.scores = w.row + D;

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
      uint32_t pos = len - (q1 - q0) + (r - q0);
      for (uint32_t h = 0; h < kv->num_kv_heads; h++)
        for (uint32_t g0 = 0; g0 < ratio; g0 += G)
          attend_row(a, s, h, h * ratio + g0,
                     ratio - g0 < G ? ratio - g0 : G, pos, qrow, orow, &w);
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
