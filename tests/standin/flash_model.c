/*
 * flash_model.c — the C model of the flash prefill kernel (see
 * flash_model.h and docs/kernels.md, "Flash prefill").  Its schedule is the
 * kernel's own (gpu/kvs_prefill_sched.h); its arithmetic is the kernel's in
 * order of operations where the order changes a result (per-tile max, the
 * rescale, weights rounded to the cache dtype before P.V, one reciprocal of
 * the sum at the end; int8/fp8: the staged codes, q and the weights as two
 * 16-bit halves each, the tile's unit, the rotations), in scalar fp32 where
 * the kernel's only difference is the order of a sum of products (the
 * tensor cores') or of a reduction (sum(q), sum(weight * offset)).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "flash_model.h"
#include "gpu/kvs_kernels_int.h"
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

/* The plane (k_offset or v_offset) of the block holding token j of
 * request s. */
static const char *kv_plane(const kvs_attn_args *a, uint32_t s, uint32_t j,
                            uint64_t plane) {
  const kvs_paged_kv *kv = &a->kv;
  uint32_t blk = a->block_tables[(uint64_t)s * a->max_blocks_per_seq +
                                 j / kv->block_size];
  return (const char *)kv->base + (uint64_t)blk * kv->block_stride + plane;
}

/* Token j's row of kv head h as the kernel stages it in shared memory: 16-bit
 * values, and the scale and offset the kernel applies to a product with it
 * (16-bit: 1, 0).  int8: byte - c with the offset lo + c * scale, where c is
 * 128 for a key and the rounded mean of the row's bytes for a value (below);
 * fp8: the e4m3 number, offset 0.  All exact in fp16 and bf16 (|byte - c| <=
 * 255).
 *
 * Why a value row is centred at its own mean: the kernel rounds each
 * weight times the row's scale to 16 bits, an error of up to 2^-11 of it
 * (fp16) times the row's codes.  Int8 rows are rotated, and rotating the
 * output back sends the codes' common part (their mean, times the weight's
 * error) onto output element 0 multiplied by head_dim: with codes centred
 * at 128 that was up to 4 units in the last place of fp16 there, against
 * the twin; at the row's own mean, what is left of it is at most half a
 * code. */
static void stage_row(const kvs_attn_args *a, uint32_t s, uint32_t j,
                      uint32_t h, uint64_t plane, int value, float *row,
                      float *sc, float *off) {
  const kvs_paged_kv *kv = &a->kv;
  const uint32_t D = kv->head_dim, dt = kv->dtype;
  const char *pl = kv_plane(a, s, j, plane);
  const uint64_t at = (uint64_t)(j % kv->block_size) * kv->token_stride +
                      (uint64_t)h * kv->head_stride;
  if (!kvs_dtype_quantized(dt)) {
    for (uint32_t d = 0; d < D; d++)
      row[d] = ld16(pl, at + d, dt);
    *sc = 1.f;
    *off = 0.f;
    return;
  }
  const uint8_t *codes = (const uint8_t *)pl + at;
  uint32_t c = 128, total = 0;
  if (dt == KVS_DTYPE_INT8 && value) {
    for (uint32_t d = 0; d < D; d++)
      total += codes[d];
    c = (total + D / 2) / D;
  }
  for (uint32_t d = 0; d < D; d++)
    row[d] = dt == KVS_DTYPE_INT8 ? (float)codes[d] - (float)c
                                  : kvs_fp8_to_float(codes[d]);
  float f[2];
  memcpy(f, pl + kv->scale_offset +
                ((uint64_t)(j % kv->block_size) * kv->num_kv_heads + h) *
                    kvs_scale_floats(dt) * 4,
         kvs_scale_floats(dt) * 4);
  *sc = f[0];
  *off = dt == KVS_DTYPE_INT8 ? f[1] + (float)c * f[0] : 0.f;
}

/* The power of two a row's weights times value scales are taken in
 * (int8/fp8): vmax * unit in [0.5, 1) for the largest of them, vmax (this
 * tile's, or an earlier one's times alpha), so that the products that
 * matter, rounded to fp16, are no subnormals.  Kept within [2^-60, 2^60]
 * (a change of unit, a quotient of two, stays finite); 1 for 0 or
 * non-finite.  Bit operations, as the kernel's. */
static float value_unit(float vmax) {
  uint32_t b;
  memcpy(&b, &vmax, 4);
  int e = (int)((b >> 23) & 0xffu);
  if (vmax <= 0.f || e == 255)
    return 1.f;
  e = 126 - e;
  e = e < -60 ? -60 : e > 60 ? 60 : e;
  b = (uint32_t)(e + 127) << 23;
  float u;
  memcpy(&u, &b, 4);
  return u;
}

int kvs__flash_model(const kvs_attn_args *a, uint32_t grid_x, uint32_t grid_y,
                     uint32_t grid_z, uint32_t span, int plant) {
  const kvs_paged_kv *kv = &a->kv;
  const uint32_t D = kv->head_dim, dt = kv->dtype, qt = a->qo_dtype;
  const uint32_t BM = KVS__PF_BM;
  const int quant = kvs_dtype_quantized(dt), q8 = dt == KVS_DTYPE_INT8;
  if ((qt != KVS_DTYPE_FP16 && qt != KVS_DTYPE_BF16) ||
      (quant ? D != 64 && D != 128
             : dt != qt || (D != 64 && D != 128 && D != 256)) ||
      !a->q_start || a->num_heads % kv->num_kv_heads)
    return KVS_EINVAL;
  const uint32_t ratio = a->num_heads / kv->num_kv_heads;
  const uint32_t BN = kvs__pf_bn_for(dt, D);
  /* the kernel folds log2(e) into the scale and takes exp2 */
  const float scale2 = a->scale * 1.44269504088896341f;
  /* one CTA's state: the K and V tiles in "shared memory" with their
   * scales and offsets, and per row of the tile its q (as the two 16-bit
   * halves the tensor cores take: int8's rotated q is a float32 that one
   * 16-bit value would round), the sum of its q, accumulators, running max,
   * sum and (int8) sum of weights times value offsets */
  float *kt_k = malloc(sizeof(float) * BN * D);
  float *kt_v = malloc(sizeof(float) * BN * D);
  float *ks = malloc(sizeof(float) * BN * 4), *ko = ks + BN, *vs = ko + BN,
        *vo = vs + BN;
  float *qh = malloc(sizeof(float) * BM * D), *ql = malloc(sizeof(float) * BM * D);
  float *o = malloc(sizeof(float) * BM * D), *qsum = malloc(sizeof(float) * BM);
  float *m = malloc(sizeof(float) * BM), *l = malloc(sizeof(float) * BM);
  float *lo_sum = malloc(sizeof(float) * BM);
  float *wmax = malloc(sizeof(float) * BM), *unit = malloc(sizeof(float) * BM);
  float *xs = malloc(sizeof(float) * BN);
  float *sc = malloc(sizeof(float) * BN);
  uint64_t *qrow = malloc(sizeof(uint64_t) * BM);
  int rc = 0;
  if (!kt_k || !kt_v || !ks || !qh || !ql || !o || !qsum || !m || !l ||
      !lo_sum || !wmax || !unit || !xs || !sc || !qrow) {
    rc = KVS_ENOMEM;
    goto out;
  }
  const uint64_t cells = (uint64_t)a->num_rows * a->num_heads;
  const uint32_t parts = grid_z; /* the workspace's partitions */
  float *ws = a->workspace;
  if (span && (!ws || span % KVS__ATTN_PART ||
               a->workspace_bytes < kvs_attn_workspace_bytes(a))) {
    rc = KVS_EINVAL;
    goto out;
  }
  for (uint32_t z = 0; z < (span ? grid_z : 1); z++)
  for (uint32_t h = 0; h < grid_y && h < kv->num_kv_heads; h++)
    for (uint32_t bx = 0; bx < grid_x; bx++) {
      uint32_t s, tile;
      if (!kvs__pf_locate(a->q_start, a->num_seqs, ratio, bx, &s, &tile))
        continue; /* a spare CTA: exits */
      const uint32_t q_len = a->q_start[s + 1] - a->q_start[s];
      const uint32_t len = a->seq_lens[s];
      kvs__pf_plan p;
      kvs__pf_plan_tile(q_len, len, ratio, BN, tile, &p);
      uint32_t kt0, kt1;
      kvs__pf_split_tiles(&p, span, BN, z, &kt0, &kt1);
      if (plant == KVS__FLASH_PLANT_SPLIT && kt1 > kt0 + 1)
        kt1--;
      if (span && (p.empty || kt0 >= kt1))
        continue; /* nothing of this split: the merge zeroes empty rows */
      for (uint32_t r = 0; r < p.rows; r++) {
        uint32_t pr = p.row0 + r;
        float *qr = qh + (size_t)r * D;
        qrow[r] = kvs__pf_qrow(a->q_start[s], pr, ratio, a->num_heads, h);
        for (uint32_t d = 0; d < D; d++) {
          qr[d] = ld16(a->q, qrow[r] * D + d, qt);
          ql[r * D + d] = 0.f;
          o[r * D + d] = 0.f;
        }
        qsum[r] = 0.f;
        if (q8) { /* q . H y = H q . y: the rotation once per row */
          kvs__hadamard(qr, D, 0);
          for (uint32_t d = 0; d < D; d++) {
            qsum[r] += qr[d];
            float hi = round16(qr[d], qt);
            ql[r * D + d] = plant == KVS__FLASH_PLANT_QHI
                                ? 0.f
                                : round16(qr[d] - hi, qt);
            qr[d] = hi;
          }
        }
        m[r] = -INFINITY;
        l[r] = 0.f;
        lo_sum[r] = 0.f;
        wmax[r] = 0.f;
        unit[r] = 1.f; /* the unit of the row's accumulators (int8/fp8) */
      }
      for (uint32_t kt = kt0; kt < kt1; kt++) {
        /* the tile in shared memory: keys past n_keys are zero-filled
         * (codes and scales), never loaded (the pool holds anything
         * there) */
        for (uint32_t c = 0; c < BN; c++) {
          uint32_t j = kt * BN + c;
          if (j < p.n_keys) {
            stage_row(a, s, j, h, kv->k_offset, 0, kt_k + (size_t)c * D, &ks[c], &ko[c]);
            stage_row(a, s, j, h, kv->v_offset, 1, kt_v + (size_t)c * D, &vs[c], &vo[c]);
          } else {
            memset(kt_k + (size_t)c * D, 0, sizeof(float) * D);
            memset(kt_v + (size_t)c * D, 0, sizeof(float) * D);
            ks[c] = ko[c] = vs[c] = vo[c] = 0.f;
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
            float x = 0.f, xl = 0.f;
            for (uint32_t d = 0; d < D; d++) {
              x += qh[r * D + d] * kt_k[c * D + d];
              xl += ql[r * D + d] * kt_k[c * D + d];
            }
            x += xl; /* the kernel: hi and lo products in one accumulator */
            if (quant)
              x = ks[c] * x + ko[c] * qsum[r];
            x *= scale2;
            if (masked && !kvs__pf_visible(j, see))
              x = -INFINITY; /* selected, never computed from the key */
            sc[c] = x;
            mt = fmaxf(mt, x);
          }
          float m_new = fmaxf(m[r], mt);
          float m_use = m_new == -INFINITY ? 0.f : m_new;
          float alpha = exp2f(m[r] - m_use);
          float sum = 0.f, osum = 0.f, mx = 0.f, *orow = o + (size_t)r * D;
          for (uint32_t c = 0; c < BN; c++) {
            float pw = exp2f(sc[c] - m_use);
            sum += pw;
            sc[c] = pw;
            /* int8/fp8: the weight times the value row's scale and times
             * its offset; a masked weight (0) stays 0, whatever the
             * scales of a key the row does not see */
            xs[c] = pw == 0.f ? 0.f : pw * vs[c];
            osum += pw == 0.f ? 0.f : pw * vo[c];
            mx = fmaxf(mx, xs[c]);
          }
          float rescale = alpha, u = 1.f;
          if (quant) { /* the row's unit; the accumulators into it */
            wmax[r] = fmaxf(wmax[r] * alpha, mx);
            u = value_unit(wmax[r]);
            rescale = alpha * (u / unit[r]); /* u / unit: exact */
            unit[r] = u;
          }
          for (uint32_t d = 0; d < D; d++)
            orow[d] *= rescale;
          for (uint32_t c = 0; c < BN; c++) {
            /* the A fragment of P.V */
            if (!quant) { /* the weight rounded to the cache dtype */
              float p16 = round16(sc[c], qt);
              for (uint32_t d = 0; d < D; d++)
                orow[d] += p16 * kt_v[c * D + d];
            } else {
              /* the product in the unit as two fp16 halves (two products
               * on the tensor cores): one would round the largest weight
               * too */
              float x = xs[c] * u;
              float hi = round16(x, KVS_DTYPE_FP16);
              float lo = plant == KVS__FLASH_PLANT_PHI
                             ? 0.f
                             : round16(x - hi, KVS_DTYPE_FP16);
              for (uint32_t d = 0; d < D; d++)
                orow[d] += hi * kt_v[c * D + d] + lo * kt_v[c * D + d];
            }
          }
          l[r] = l[r] * alpha + sum;
          lo_sum[r] = lo_sum[r] * alpha + osum;
          m[r] = m_new;
        }
      }
      for (uint32_t r = 0; r < p.rows; r++) {
        /* an empty tile (no key for any row) walks no key tile: l = 0 */
        float inv = l[r] > 0.f ? 1.f / l[r] : 0.f, *orow = o + (size_t)r * D;
        if (span) /* the partial, unnormalised: the merge divides */
          inv = 1.f;
        for (uint32_t d = 0; d < D; d++)
          orow[d] = quant ? (orow[d] / unit[r] + lo_sum[r]) * inv : orow[d] * inv;
        if (q8) /* out = H (what the rotated values give) */
          kvs__hadamard(orow, D, 0);
        if (span) {
          if (!kvs__pf_split_writes(kvs__pf_row_pos(&p, q_len, len, ratio, r),
                                    span, z))
            continue;
          uint64_t cell = qrow[r] * parts + z;
          ws[cell] = m[r] * 0.693147180559945309f; /* log2 units to e */
          ws[cells * parts + cell] = l[r];
          memcpy(ws + 2 * cells * parts + cell * D, orow, sizeof(float) * D);
          continue;
        }
        for (uint32_t d = 0; d < D; d++)
          st16(a->out, qrow[r] * D + d, qt, orow[d]);
      }
    }
out:
  free(kt_k);
  free(kt_v);
  free(ks);
  free(qh);
  free(ql);
  free(o);
  free(qsum);
  free(lo_sum);
  free(wmax);
  free(unit);
  free(xs);
  free(m);
  free(l);
  free(sc);
  free(qrow);
  return rc;
}

void kvs__flash_model_merge(const kvs_attn_args *a, uint32_t parts,
                            uint32_t span) {
  const uint32_t D = a->kv.head_dim;
  const uint64_t R = a->num_rows, H = a->num_heads;
  const float *ws = a->workspace;
  for (uint32_t s = 0; s < a->num_seqs; s++) {
    const uint32_t q0 = a->q_start[s], q_len = a->q_start[s + 1] - q0;
    const uint32_t len = a->seq_lens[s];
    for (uint32_t i = 0; i < q_len; i++) {
      const uint32_t n = q_len > len ? 0 : len - q_len + i + 1;
      const uint32_t np0 = (n + span - 1) / span;
      const uint32_t np = np0 < parts ? np0 : parts; /* (as the kernel) */
      for (uint32_t hq = 0; hq < H; hq++) {
        const uint64_t cell0 = ((uint64_t)(q0 + i) * H + hq) * parts;
        float M = -INFINITY, L = 0.f;
        for (uint32_t z = 0; z < np; z++)
          M = fmaxf(M, ws[cell0 + z]);
        for (uint32_t z = 0; z < np; z++)
          L += ws[R * H * parts + cell0 + z] * expf(ws[cell0 + z] - M);
        for (uint32_t d = 0; d < D; d++) {
          float x = 0.f;
          for (uint32_t z = 0; z < np; z++)
            x += ws[2 * R * H * parts + (cell0 + z) * D + d] *
                 expf(ws[cell0 + z] - M);
          st16(a->out, ((uint64_t)(q0 + i) * H + hq) * D + d, a->qo_dtype,
               np ? x / L : 0.f);
        }
      }
    }
  }
}
