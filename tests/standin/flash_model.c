/*
 * flash_model.c — the C model of the flash prefill kernel (see
 * flash_model.h and docs/kernels.md, "Flash prefill").  Its schedule is the
 * kernel's own (gpu/kvs_prefill_sched.h); its arithmetic is the kernel's in
 * order of operations where the order changes a result (per-tile max, the
 * rescale, weights rounded to the cache dtype before P.V, one reciprocal of
 * the sum at the end), in scalar fp32 where the kernel's only difference is
 * the order of a sum of products (the tensor cores').
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "flash_model.h"
#include "gpu/kvs_prefill_sched.h"
#include "kvs_status.h"

static float ld16(const void *p, uint64_t i, uint32_t dtype) {
  uint16_t b;
  memcpy(&b, (const char *)p + 2 * i, 2);
  return dtype == KVS_DTYPE_FP16 ? kvs_fp16_to_float(b) : kvs_bf16_to_float(b);
}

static void st16(void *p, uint64_t i, uint32_t dtype, float v) {
  uint16_t b = dtype == KVS_DTYPE_FP16 ? kvs_float_to_fp16(v)
                                       : kvs_float_to_bf16(v);
  memcpy((char *)p + 2 * i, &b, 2);
}

static float round16(float v, uint32_t dtype) {
  return dtype == KVS_DTYPE_FP16 ? kvs_fp16_to_float(kvs_float_to_fp16(v))
                                 : kvs_bf16_to_float(kvs_float_to_bf16(v));
}

/* Key or value row of token j of request s, kv head h (plane: k_offset or
 * v_offset). */
static const char *kv_row(const kvs_attn_args *a, uint32_t s, uint32_t j,
                          uint32_t h, uint64_t plane) {
  const kvs_paged_kv *kv = &a->kv;
  uint32_t blk = a->block_tables[(uint64_t)s * a->max_blocks_per_seq +
                                 j / kv->block_size];
  return (const char *)kv->base + (uint64_t)blk * kv->block_stride + plane +
         ((uint64_t)(j % kv->block_size) * kv->token_stride +
          (uint64_t)h * kv->head_stride) * 2;
}

int kvs__flash_model(const kvs_attn_args *a, uint32_t grid_x, uint32_t grid_y,
                     int plant) {
  const kvs_paged_kv *kv = &a->kv;
  const uint32_t D = kv->head_dim, dt = kv->dtype, BM = KVS__PF_BM;
  if ((dt != KVS_DTYPE_FP16 && dt != KVS_DTYPE_BF16) || a->qo_dtype != dt ||
      (D != 64 && D != 128 && D != 256) || !a->q_start ||
      a->num_heads % kv->num_kv_heads)
    return KVS_EINVAL;
  const uint32_t ratio = a->num_heads / kv->num_kv_heads;
  const uint32_t BN = kvs__pf_bn(D);
  /* the kernel folds log2(e) into the scale and takes exp2 */
  const float scale2 = a->scale * 1.44269504088896341f;
  /* one CTA's state: the K and V tiles in "shared memory", and per row of
   * the tile its q, accumulators, running max and sum */
  float *kt_k = malloc(sizeof(float) * BN * D);
  float *kt_v = malloc(sizeof(float) * BN * D);
  float *q = malloc(sizeof(float) * BM * D), *o = malloc(sizeof(float) * BM * D);
  float *m = malloc(sizeof(float) * BM), *l = malloc(sizeof(float) * BM);
  float *sc = malloc(sizeof(float) * BN);
  uint64_t *qrow = malloc(sizeof(uint64_t) * BM);
  int rc = 0;
  if (!kt_k || !kt_v || !q || !o || !m || !l || !sc || !qrow) {
    rc = KVS_ENOMEM;
    goto out;
  }
  for (uint32_t h = 0; h < grid_y && h < kv->num_kv_heads; h++)
    for (uint32_t bx = 0; bx < grid_x; bx++) {
      uint32_t s, tile;
      if (!kvs__pf_locate(a->q_start, a->num_seqs, ratio, bx, &s, &tile))
        continue; /* a spare CTA: exits */
      const uint32_t q_len = a->q_start[s + 1] - a->q_start[s];
      const uint32_t len = a->seq_lens[s];
      kvs__pf_plan p;
      kvs__pf_plan_tile(q_len, len, ratio, BN, tile, &p);
      for (uint32_t r = 0; r < p.rows; r++) {
        uint32_t pr = p.row0 + r;
        qrow[r] = kvs__pf_qrow(a->q_start[s], pr, ratio, a->num_heads, h);
        for (uint32_t d = 0; d < D; d++) {
          q[r * D + d] = ld16(a->q, qrow[r] * D + d, dt);
          o[r * D + d] = 0.f;
        }
        m[r] = -INFINITY;
        l[r] = 0.f;
      }
      for (uint32_t kt = 0; kt < p.n_ktiles; kt++) {
        /* the tile in shared memory: keys past n_keys are zero-filled,
         * never loaded (the pool holds anything there) */
        for (uint32_t c = 0; c < BN; c++) {
          uint32_t j = kt * BN + c;
          const char *kr = j < p.n_keys ? kv_row(a, s, j, h, kv->k_offset) : NULL;
          const char *vr = j < p.n_keys ? kv_row(a, s, j, h, kv->v_offset) : NULL;
          for (uint32_t d = 0; d < D; d++) {
            kt_k[c * D + d] = kr ? ld16(kr, d, dt) : 0.f;
            kt_v[c * D + d] = vr ? ld16(vr, d, dt) : 0.f;
          }
        }
        int masked = kvs__pf_tile_masked(&p, kt);
        if (plant == KVS__FLASH_PLANT_NOSKIP)
          masked = 0;
        /* padding rows (r >= p.rows) compute nothing that is stored */
        for (uint32_t r = 0; r < p.rows; r++) {
          uint32_t pos = kvs__pf_row_pos(&p, q_len, len, ratio, r);
          uint32_t see = plant == KVS__FLASH_PLANT_MASK ? pos + 1 : pos;
          float mt = -INFINITY;
          for (uint32_t c = 0; c < BN; c++) {
            uint32_t j = kt * BN + c;
            float x = 0.f;
            for (uint32_t d = 0; d < D; d++)
              x += q[r * D + d] * kt_k[c * D + d];
            x *= scale2;
            if (masked && !kvs__pf_visible(j, see))
              x = -INFINITY; /* selected, never computed from the key */
            sc[c] = x;
            mt = fmaxf(mt, x);
          }
          float m_new = fmaxf(m[r], mt);
          float m_use = m_new == -INFINITY ? 0.f : m_new;
          float alpha = exp2f(m[r] - m_use);
          float sum = 0.f, *orow = o + (size_t)r * D;
          for (uint32_t d = 0; d < D; d++)
            orow[d] *= alpha;
          for (uint32_t c = 0; c < BN; c++) {
            float pw = exp2f(sc[c] - m_use);
            sum += pw;
            float p16 = round16(pw, dt); /* the A fragment of P.V */
            for (uint32_t d = 0; d < D; d++)
              orow[d] += p16 * kt_v[c * D + d];
          }
          l[r] = l[r] * alpha + sum;
          m[r] = m_new;
        }
      }
      for (uint32_t r = 0; r < p.rows; r++) {
        /* an empty tile (no key for any row) walks no key tile: l = 0 */
        float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
        for (uint32_t d = 0; d < D; d++)
          st16(a->out, qrow[r] * D + d, dt, o[r * D + d] * inv);
      }
    }
out:
  free(kt_k);
  free(kt_v);
  free(q);
  free(o);
  free(m);
  free(l);
  free(sc);
  free(qrow);
  return rc;
}
