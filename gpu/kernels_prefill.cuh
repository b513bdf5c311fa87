/*
 * kernels_prefill.cuh — the flash prefill kernel: paged causal attention of
 * many query rows per CTA on tensor cores.  Included by kernels.cu (it uses
 * that file's Mma<T>); compiled into the same fatbin.  Off by default
 * (kvs__cuda_prefill_flash, gpu/cuda_driver.c) until a GPU has verified it;
 * docs/kernels.md, "Flash prefill", describes it and says what is verified
 * where.
 *
 * One CTA: 4 warps, one request, one kv head, a tile of BM = 64 packed
 * query rows (row = token * ratio + head in the GQA group: every query head
 * of the kv head shares the K/V tiles), walking the request's keys in tiles
 * of BN (64; 16 for head_dim 256) with an online softmax.  The schedule —
 * which CTA takes which tile, its positions, its key tiles, which of them
 * are masked — is kvs_prefill_sched.h, shared with the C model the tests
 * run (tests/standin/flash_model.c).
 *
 * Shared memory (dynamic, (BM + 2 BN) * D * 2 bytes, at most 48 KiB): Q
 * [BM][D], K [BN][D], V [BN][D], each row of D 16-bit elements in 16-byte
 * chunks stored at chunk ^ (row % 8) (an XOR swizzle: the 8 rows an
 * ldmatrix reads at once fall in 8 different bank groups).  K and V have one
 * buffer each, filled by cp.async: K of tile kt+1 loads while the warps
 * compute P.V of tile kt, V of tile kt+1 while they compute Q.K^T of tile
 * kt+1 (two commit groups in flight).
 *
 * Warp w owns tile rows 16w..16w+15.  m16n8k16 fragments (lane = 4g + t):
 *   S = Q K^T: A = Q rows (ldmatrix.x4 of the Q tile; kept in registers for
 *     D <= 128), B = K rows as columns (ldmatrix.x4 of the K tile, non
 *     transposed: a K row is a column of B); S[n-tile][0..1] is row g, keys
 *     8n + 2t, +1; [2..3] row g + 8.
 *   O += P V: the S accumulators of n-tiles 2k, 2k+1, rounded to the cache
 *     dtype and paired, are the A fragment of k-step k as they stand (the
 *     C-to-A register identity); B = V (ldmatrix.x4.trans of the V tile).
 * Scores are scaled by scale * log2(e) and exponentiated with exp2f; the
 * running max and sum of a row live in the 4 lanes of its quad (max
 * reduced per tile, sums per lane, reduced at the end).
 *
 * Poisoned memory: a key or value row past the tile's n_keys (past the
 * request, or past every row's position) is never loaded: its chunks are
 * zero-filled in shared memory.  A masked score is selected to -inf, never
 * computed from a key; its weight is exactly 0 and meets a zero or a real
 * value row, never a NaN.  Q rows past the tile (padding) are zeros and
 * never stored.
 */
#include "kvs_prefill_sched.h"

__device__ __forceinline__ void pf_cp_async16(uint32_t dst, const void *src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void pf_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
/* Wait until at most one commit group is still in flight. */
__device__ __forceinline__ void pf_wait_one() {
  asm volatile("cp.async.wait_group 1;\n" ::);
}
__device__ __forceinline__ void pf_zero16(uint32_t dst) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(dst), "r"(0u));
}
__device__ __forceinline__ void pf_ldsm_x4(uint32_t addr, uint32_t *r) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void pf_ldsm_x4_t(uint32_t addr, uint32_t *r) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/* Byte address of 16-byte chunk c of row r of a tile of D-element rows. */
template <int D>
__device__ __forceinline__ uint32_t pf_at(uint32_t tile, uint32_t r, uint32_t c) {
  return tile + kvs__pf_smem_off(D, r, c);
}

/* One K or V tile: keys j0 .. j0 + ROWS - 1 of the request, through the
 * block table; keys at or past n_keys zero-filled, never read. */
template <int D, int ROWS>
__device__ __forceinline__ void pf_load_kv(uint32_t tile, const kvs_paged_kv &kv,
                                           const uint32_t *bt, uint64_t plane,
                                           uint32_t j0, uint32_t n_keys,
                                           bool bs_pow2, uint32_t bs_shift) {
  constexpr int CH = D / 8;
  const char *base = (const char *)kv.base;
  const uint64_t tok_bytes = kv.token_stride * 2;
#pragma unroll
  for (int i0 = 0; i0 < ROWS * CH; i0 += KVS__PF_THREADS) {
    const uint32_t i = i0 + threadIdx.x, r = i / CH, c = i % CH;
    const uint32_t j = j0 + r;
    const uint32_t dst = pf_at<D>(tile, r, c);
    if (j < n_keys) {
      uint32_t bi = bs_pow2 ? j >> bs_shift : j / kv.block_size;
      uint32_t bo = bs_pow2 ? j & (kv.block_size - 1) : j % kv.block_size;
      pf_cp_async16(dst, base + (uint64_t)bt[bi] * kv.block_stride + plane +
                             bo * tok_bytes + c * 16);
    } else {
      pf_zero16(dst);
    }
  }
}

template <typename T, int D>
__device__ __forceinline__ void prefill_flash_body(const kvs_attn_args &a) {
  constexpr int BM = KVS__PF_BM;
  constexpr int BN = KVS__PF_BN(D);
  constexpr int NT = BN / 8;            /* score n-tiles per warp */
  constexpr int DT = D / 8;             /* output n-tiles per warp */
  constexpr int KS = D / 16;            /* k-steps of Q.K^T */
  constexpr bool QREG = D <= 128;       /* Q fragments live in registers */
  constexpr int CH = D / 8;
  extern __shared__ __align__(16) unsigned char pf_smem[];
  const kvs_paged_kv &kv = a.kv;
  const uint32_t tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const uint32_t h = blockIdx.y, bx = blockIdx.x;
  const uint32_t ratio = a.num_heads / kv.num_kv_heads;
  const uint32_t sQ = (uint32_t)__cvta_generic_to_shared(pf_smem);
  const uint32_t sK = sQ + BM * D * 2, sV = sK + BN * D * 2;

  /* Which (request, tile): kvs__pf_locate, 32 requests per step of a warp
   * scan of their tile counts.  The answer goes through shared memory (the
   * K tile's first bytes, before anything is loaded there: a static
   * __shared__ would push the CTA past 48 KiB). */
  uint32_t *meta = (uint32_t *)(pf_smem + BM * D * 2);
  if (warp == 0) {
    uint32_t before = 0;
    int found = 0;
    for (uint32_t c0 = 0; c0 < a.num_seqs && !found; c0 += 32) {
      const uint32_t s = c0 + lane;
      const uint32_t n =
          s < a.num_seqs ? kvs__pf_tiles(a.q_start[s + 1] - a.q_start[s], ratio) : 0;
      uint32_t inc = n;
#pragma unroll
      for (int o = 1; o < 32; o *= 2) {
        uint32_t y = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= (uint32_t)o)
          inc += y;
      }
      uint32_t my_tile = 0;
      const bool mine = kvs__pf_scan_pick(bx, before, inc, n, &my_tile);
      if (mine) {
        meta[0] = s;
        meta[1] = my_tile;
      }
      found = __ballot_sync(0xffffffffu, mine) != 0;
      before += __shfl_sync(0xffffffffu, inc, 31);
    }
    if (lane == 0)
      meta[2] = (uint32_t)found;
  }
  __syncthreads();
  const uint32_t s = meta[0], tile = meta[1];
  const bool found = meta[2] != 0;
  __syncthreads(); /* everyone has read meta before the K tile lands there */
  if (!found)
    return; /* a spare CTA of the grid's upper bound */

  const uint32_t q0 = a.q_start[s], q_len = a.q_start[s + 1] - q0;
  const uint32_t len = a.seq_lens[s];
  kvs__pf_plan p;
  kvs__pf_plan_tile(q_len, len, ratio, BN, tile, &p);

  if (p.empty) { /* no key for any row: zeros */
    for (uint32_t i = tid; i < p.rows * CH; i += KVS__PF_THREADS) {
      const uint32_t pr = p.row0 + i / CH;
      const uint64_t qrow = kvs__pf_qrow(q0, pr, ratio, a.num_heads, h);
      *(uint4 *)((char *)a.out + qrow * D * 2 + (i % CH) * 16) = make_uint4(0, 0, 0, 0);
    }
    return;
  }

  const uint32_t *bt = a.block_tables + (uint64_t)s * a.max_blocks_per_seq;
  const bool bs_pow2 = (kv.block_size & (kv.block_size - 1)) == 0;
  const uint32_t bs_shift = __ffs(kv.block_size) - 1;
  const uint64_t head_off = (uint64_t)h * kv.head_stride * 2;

  /* Q tile (rows past the tile zero-filled), K and V of key tile 0. */
#pragma unroll
  for (int i0 = 0; i0 < BM * CH; i0 += KVS__PF_THREADS) {
    const uint32_t i = i0 + tid, r = i / CH, c = i % CH;
    const uint32_t dst = pf_at<D>(sQ, r, c);
    if (r < p.rows) {
      const uint32_t pr = p.row0 + r;
      const uint64_t qrow = kvs__pf_qrow(q0, pr, ratio, a.num_heads, h);
      pf_cp_async16(dst, (const char *)a.q + qrow * D * 2 + c * 16);
    } else {
      pf_zero16(dst);
    }
  }
  pf_load_kv<D, BN>(sK, kv, bt, kv.k_offset + head_off, 0, p.n_keys, bs_pow2, bs_shift);
  pf_commit();
  pf_load_kv<D, BN>(sV, kv, bt, kv.v_offset + head_off, 0, p.n_keys, bs_pow2, bs_shift);
  pf_commit();

  /* This lane's two rows: tile rows 16 warp + g and + 8. */
  const uint32_t r_lo = 16 * warp + kvs__pf_acc_row(lane, 0);
  const uint32_t r_hi = 16 * warp + kvs__pf_acc_row(lane, 2);
  const uint32_t pos_lo = kvs__pf_row_pos(&p, q_len, len, ratio, r_lo);
  const uint32_t pos_hi = kvs__pf_row_pos(&p, q_len, len, ratio, r_hi);
  const float scale2 = a.scale * 1.44269504088896341f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;
  float o[DT][4];
#pragma unroll
  for (int i = 0; i < DT; i++)
    o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  uint32_t qf[QREG ? KS : 1][4];

  for (uint32_t kt = 0; kt < p.n_ktiles; kt++) {
    pf_wait_one(); /* Q (first tile) and K of this tile are in */
    __syncthreads();
    if (QREG && kt == 0) {
#pragma unroll
      for (int ks = 0; ks < (QREG ? KS : 0); ks++)
        pf_ldsm_x4(pf_at<D>(sQ, 16 * warp + kvs__pf_ldq_row(lane), kvs__pf_ldq_chunk(lane, ks)),
                   qf[ks]);
    }

    /* S = Q K^T */
    float sc[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++)
      sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
      uint32_t af[4];
      if (QREG) {
        af[0] = qf[QREG ? ks : 0][0];
        af[1] = qf[QREG ? ks : 0][1];
        af[2] = qf[QREG ? ks : 0][2];
        af[3] = qf[QREG ? ks : 0][3];
      } else {
        pf_ldsm_x4(pf_at<D>(sQ, 16 * warp + kvs__pf_ldq_row(lane), kvs__pf_ldq_chunk(lane, ks)),
                   af);
      }
#pragma unroll
      for (int np = 0; np < NT / 2; np++) {
        uint32_t b[4];
        pf_ldsm_x4(pf_at<D>(sK, kvs__pf_ldk_row(lane, np), kvs__pf_ldk_chunk(lane, ks)), b);
        Mma<T>::run(sc[2 * np], af[0], af[1], af[2], af[3], b[0], b[1]);
        Mma<T>::run(sc[2 * np + 1], af[0], af[1], af[2], af[3], b[2], b[3]);
      }
    }
    __syncthreads(); /* every warp is done with the K tile */
    if (kt + 1 < p.n_ktiles)
      pf_load_kv<D, BN>(sK, kv, bt, kv.k_offset + head_off, (kt + 1) * BN, p.n_keys,
                        bs_pow2, bs_shift);
    pf_commit();

    /* Scale, mask (boundary tiles only), online softmax. */
    const bool masked = kvs__pf_tile_masked(&p, kt);
    float mt_lo = -INFINITY, mt_hi = -INFINITY;
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const uint32_t j = kt * BN + 8 * n + kvs__pf_acc_col(lane, e);
        float x = sc[n][e] * scale2;
        if (masked && !kvs__pf_visible(j, e < 2 ? pos_lo : pos_hi))
          x = -INFINITY;
        sc[n][e] = x;
        if (e < 2)
          mt_lo = fmaxf(mt_lo, x);
        else
          mt_hi = fmaxf(mt_hi, x);
      }
#pragma unroll
    for (int of = 1; of <= 2; of *= 2) {
      mt_lo = fmaxf(mt_lo, __shfl_xor_sync(0xffffffffu, mt_lo, of));
      mt_hi = fmaxf(mt_hi, __shfl_xor_sync(0xffffffffu, mt_hi, of));
    }
    const float mn_lo = fmaxf(m_lo, mt_lo), mn_hi = fmaxf(m_hi, mt_hi);
    const float mu_lo = mn_lo == -INFINITY ? 0.f : mn_lo;
    const float mu_hi = mn_hi == -INFINITY ? 0.f : mn_hi;
    const float al_lo = exp2f(m_lo - mu_lo), al_hi = exp2f(m_hi - mu_hi);
    m_lo = mn_lo;
    m_hi = mn_hi;
    float sum_lo = 0.f, sum_hi = 0.f;
#pragma unroll
    for (int n = 0; n < NT; n++) {
      sc[n][0] = exp2f(sc[n][0] - mu_lo);
      sc[n][1] = exp2f(sc[n][1] - mu_lo);
      sc[n][2] = exp2f(sc[n][2] - mu_hi);
      sc[n][3] = exp2f(sc[n][3] - mu_hi);
      sum_lo += sc[n][0] + sc[n][1];
      sum_hi += sc[n][2] + sc[n][3];
    }
    l_lo = l_lo * al_lo + sum_lo;
    l_hi = l_hi * al_hi + sum_hi;
#pragma unroll
    for (int i = 0; i < DT; i++) {
      o[i][0] *= al_lo;
      o[i][1] *= al_lo;
      o[i][2] *= al_hi;
      o[i][3] *= al_hi;
    }

    pf_wait_one(); /* V of this tile is in (K of the next may not be) */
    __syncthreads();
    /* O += P V: P's accumulators are the A fragments of the k-steps. */
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++) {
      const uint32_t a0 = Mma<T>::pack(sc[2 * kk][0], sc[2 * kk][1]);
      const uint32_t a1 = Mma<T>::pack(sc[2 * kk][2], sc[2 * kk][3]);
      const uint32_t a2 = Mma<T>::pack(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
      const uint32_t a3 = Mma<T>::pack(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
#pragma unroll
      for (int dp = 0; dp < DT / 2; dp++) {
        uint32_t b[4];
        pf_ldsm_x4_t(pf_at<D>(sV, kvs__pf_ldv_row(lane, kk), kvs__pf_ldv_chunk(lane, dp)), b);
        Mma<T>::run(o[2 * dp], a0, a1, a2, a3, b[0], b[1]);
        Mma<T>::run(o[2 * dp + 1], a0, a1, a2, a3, b[2], b[3]);
      }
    }
    __syncthreads(); /* every warp is done with the V tile */
    if (kt + 1 < p.n_ktiles)
      pf_load_kv<D, BN>(sV, kv, bt, kv.v_offset + head_off, (kt + 1) * BN, p.n_keys,
                        bs_pow2, bs_shift);
    pf_commit();
  }
  asm volatile("cp.async.wait_all;\n" ::);

  /* The rows' sums over their quads; out = O / l in the cache dtype. */
#pragma unroll
  for (int of = 1; of <= 2; of *= 2) {
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, of);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, of);
  }
  const float inv_lo = l_lo > 0.f ? 1.f / l_lo : 0.f;
  const float inv_hi = l_hi > 0.f ? 1.f / l_hi : 0.f;
#pragma unroll
  for (int hl = 0; hl < 2; hl++) {
    const uint32_t r = hl ? r_hi : r_lo;
    if (r >= p.rows)
      continue;
    const uint32_t pr = p.row0 + r;
    const uint64_t qrow = kvs__pf_qrow(q0, pr, ratio, a.num_heads, h);
    char *orow = (char *)a.out + qrow * D * 2;
    const float inv = hl ? inv_hi : inv_lo;
#pragma unroll
    for (int i = 0; i < DT; i++)
      *(uint32_t *)(orow + (8 * i + kvs__pf_acc_col(lane, 0)) * 2) =
          Mma<T>::pack(o[i][2 * hl] * inv, o[i][2 * hl + 1] * inv);
  }
}

#define KVS_PREFILL_FLASH_INST(NAME, T, D)                                    \
  extern "C" __global__ void __launch_bounds__(KVS__PF_THREADS, 2)           \
      kvs_prefill_flash_##NAME##_d##D(kvs_attn_args a) {                       \
    prefill_flash_body<T, D>(a);                                               \
  }
KVS_PREFILL_FLASH_INST(fp16, __half, 64)
KVS_PREFILL_FLASH_INST(fp16, __half, 128)
KVS_PREFILL_FLASH_INST(fp16, __half, 256)
KVS_PREFILL_FLASH_INST(bf16, __nv_bfloat16, 64)
KVS_PREFILL_FLASH_INST(bf16, __nv_bfloat16, 128)
KVS_PREFILL_FLASH_INST(bf16, __nv_bfloat16, 256)
