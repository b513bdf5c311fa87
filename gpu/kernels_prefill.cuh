/*
 * kernels_prefill.cuh — the flash prefill kernel: paged causal attention of
 * many query rows per CTA on tensor cores.  Included by kernels.cu (it uses
 * that file's Mma<T>); compiled into the same fatbin.  On by default
 * (kvs__cuda_prefill_flash, gpu/cuda_driver.c) since it passed on an H100;
 * it also takes decode over int8/fp8 caches at GQA 4 or more
 * (kvs__cuda_decode_flash).  docs/kernels.md, "Flash prefill", describes it
 * and says what is verified where.
 *
 * One CTA: 4 warps, one request, one kv head, a tile of BM = 64 packed
 * query rows (row = token * ratio + head in the GQA group: every query head
 * of the kv head shares the K/V tiles), walking the request's keys in tiles
 * of BN (64; 16 for head_dim 256) with an online softmax.  The schedule —
 * which CTA takes which tile, its positions, its key tiles, which of them
 * are masked — is kvs_prefill_sched.h, shared with the C model the tests
 * run (tests/standin/flash_model.c).  Few rows over long prefixes: grid.z
 * splits the keys into spans (kvs__pf_split_tiles); each split stores its
 * rows' partials in the attention workspace and
 * kvs_prefill_flash_merge_kernel writes the output.
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
 * int8 / fp8 caches (kvs_prefill_flash_{int8,fp8}_{fp16,bf16}_d{64,128}):
 * tiles of 32 keys staged through registers as exact 16-bit values, the
 * scales applied around the tensor cores, int8's q rotated and split into
 * two halves, the weights split into two fp16 halves; see pq_fetch below
 * and docs/kernels.md.
 *
 * WG (kvs_prefill_flash_wg_*, the sm_90a image only; 16-bit caches, D
 * 128): the same body with the products on wgmma (kernels_wgmma.cuh).  The
 * body takes D 64 too, but ptxas 13.0 compiled that instance wrong (P's
 * fragments in Q's registers; docs/kernels.md), so it is not built.
 * K and V tiles in wgmma's 128-byte-swizzle layout (kvs__pf_wg_off, on 1024
 * bytes), read in place by the tensor cores through descriptors; Q staged
 * once in the V tile's bytes and kept in registers; S = Q K^T as D / 16
 * m64n64k16, O += P V as BN / 16 m64n{D}k16 with P's accumulators as the A
 * operand, as above.  docs/kernels.md, "The wgmma variant".
 *
 * Poisoned memory: a key or value row past the tile's n_keys (past the
 * request, or past every row's position) is never loaded: its chunks are
 * zero-filled in shared memory.  A masked score is selected to -inf, never
 * computed from a key; its weight is exactly 0 and meets a zero or a value
 * row the request wrote: poison in unused memory never reaches an output.
 * A written value row that is itself NaN or infinite (a later token of the
 * chunk) does reach the rows of its tile that mask it (0 x Inf and 0 x NaN
 * are NaN on the tensor cores), where the C twin skips it; docs/kernels.md
 * lists this.  Q rows past the tile (padding) are zeros and never stored.
 */
#include "kvs_prefill_sched.h"
#include "kernels_wgmma.cuh"

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

/* P.V, k-step kk: the accumulators of score n-tiles 2kk and 2kk + 1,
 * rounded to T and paired, are the A fragment as they stand. */
template <typename T>
__device__ __forceinline__ void pf_pack_p(const float (*sc)[4], int kk, uint32_t *a) {
  a[0] = Mma<T>::pack(sc[2 * kk][0], sc[2 * kk][1]);
  a[1] = Mma<T>::pack(sc[2 * kk][2], sc[2 * kk][3]);
  a[2] = Mma<T>::pack(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
  a[3] = Mma<T>::pack(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
}

/* Byte address of 16-byte chunk c of row r of a tile of D-element rows. */
template <int D>
__device__ __forceinline__ uint32_t pf_at(uint32_t tile, uint32_t r, uint32_t c) {
  return tile + kvs__pf_smem_off(D, r, c);
}

/* The warp's Q fragments (its 16 rows of the Q tile, k-steps 0 .. KS - 1)
 * from the Q tile into registers. */
template <int D, int KS>
__device__ __forceinline__ void pf_ldsm_q(uint32_t sQ, uint32_t warp, uint32_t lane,
                                          uint32_t (*qf)[4]) {
#pragma unroll
  for (int ks = 0; ks < KS; ks++)
    pf_ldsm_x4(pf_at<D>(sQ, 16 * warp + kvs__pf_ldq_row(lane), kvs__pf_ldq_chunk(lane, ks)),
               qf[ks]);
}

/* One K or V tile: keys j0 .. j0 + ROWS - 1 of the request, through the
 * block table; keys at or past n_keys zero-filled, never read. */
template <int D, int ROWS, bool WG = false>
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
    const uint32_t dst =
        WG ? tile + kvs__pf_wg_off(ROWS, r, c) : pf_at<D>(tile, r, c);
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

/*
 * int8 / fp8 caches (KQ = 1 / 2).  Their K and V tiles cannot be copied as
 * they are: the tensor cores take 16-bit values.  Each thread fetches its
 * 16-byte pieces of the next tile into registers (pq_fetch, right where
 * the 16-bit path issues its cp.async, so the loads fly during the next
 * phase's arithmetic) and converts them into shared memory where the
 * 16-bit path waits for its copies (pq_put).  A 32-key tile of D codes is
 * D / 64 pieces per thread; piece i is row i / (D / 16), codes
 * 16 (i % (D / 16)) on, and the thread holding a row's first piece also
 * holds its scales.
 *
 * Staged values are exact in fp16 and bf16: int8 byte - c, fp8 the e4m3
 * number.  c is 128 for a key; for a value it is the rounded mean of the
 * row's bytes (summed over the D / 16 threads of the row), so that the
 * codes' common part, which the output's rotation would send onto one
 * element times head_dim, carries at most half a code of the weights'
 * rounding (docs/kernels.md).  Keys go to the tile in the q/out dtype T,
 * values in fp16 (the weights times the value scales, split into two fp16
 * halves, are the A fragments of P.V).  Per row the tile keeps its scale
 * and offset: int8 (scale, lo + c * scale), fp8 (scale, 0).  Rows at or past
 * n_keys: zeros, scales 0, never read.
 */
template <bool VALUE, typename T> struct PqStage {
  typedef T type;
};
template <typename T> struct PqStage<true, T> {
  typedef __half type;
};

template <int D> struct PqRegs {
  enum { N = KVS__PF_BN_Q * D / 16 / KVS__PF_THREADS };
  uint4 raw[N];
  float2 scl[N]; /* (scale, lo) of the row whose first piece this is */
};

template <int KQ, int D>
__device__ __forceinline__ void pq_fetch(PqRegs<D> &r, const kvs_paged_kv &kv,
                                         const uint32_t *bt, uint64_t plane,
                                         uint32_t h, uint32_t j0, uint32_t n_keys,
                                         bool bs_pow2, uint32_t bs_shift) {
  constexpr int CH = D / 16;
  const char *base = (const char *)kv.base;
#pragma unroll
  for (int k = 0; k < PqRegs<D>::N; k++) {
    const uint32_t i = k * KVS__PF_THREADS + threadIdx.x, row = i / CH, c = i % CH;
    const uint32_t j = j0 + row;
    r.raw[k] = make_uint4(0, 0, 0, 0);
    r.scl[k] = make_float2(0.f, 0.f);
    if (j < n_keys) {
      const uint32_t bi = bs_pow2 ? j >> bs_shift : j / kv.block_size;
      const uint32_t bo = bs_pow2 ? j & (kv.block_size - 1) : j % kv.block_size;
      const char *pl = base + (uint64_t)bt[bi] * kv.block_stride + plane;
      r.raw[k] = __ldg((const uint4 *)(pl + (uint64_t)bo * kv.token_stride +
                                       (uint64_t)h * kv.head_stride + c * 16));
      if (c == 0) {
        const char *sp = pl + kv.scale_offset +
                         ((uint64_t)bo * kv.num_kv_heads + h) * (KQ == 1 ? 8 : 4);
        r.scl[k] = KQ == 1 ? __ldg((const float2 *)sp)
                           : make_float2(__ldg((const float *)sp), 0.f);
      }
    }
  }
}

/* 16 codes -> 16 floats (int8: byte - c; fp8: the e4m3 number). */
template <int KQ>
__device__ __forceinline__ void pq_codes(const uint4 &raw, uint32_t c, float *f) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int q = 0; q < 4; q++) {
    if (KQ == 1) { /* 2^23 + byte, less 2^23 + c: exact, no I2F */
      const float off = 8388608.f + (float)c;
#pragma unroll
      for (int b = 0; b < 4; b++)
        f[4 * q + b] = __uint_as_float(__byte_perm(w[q], 0x4b000000u, 0x7440u | b)) - off;
    } else {
      e4m3x2_to_float(w[q] & 0xffffu, f + 4 * q);
      e4m3x2_to_float(w[q] >> 16, f + 4 * q + 2);
    }
  }
}

/* The fetched tile into shared memory: values (VALUE: fp16, centred at the
 * row's mean) or keys (the dtype T, int8 centred at 128), and the rows'
 * scales and offsets. */
template <typename T, int KQ, int D, bool VALUE>
__device__ __forceinline__ void pq_put(uint32_t tile, float *scale, float *offset,
                                       const PqRegs<D> &r, uint32_t j0,
                                       uint32_t n_keys) {
  constexpr int CH = D / 16;
  typedef typename PqStage<VALUE, T>::type S;
#pragma unroll
  for (int k = 0; k < PqRegs<D>::N; k++) {
    const uint32_t i = k * KVS__PF_THREADS + threadIdx.x, row = i / CH, c = i % CH;
    uint32_t mid = 128;
    if (KQ == 1 && VALUE) {
      /* the row's byte sum over its CH threads (consecutive lanes) */
      const uint32_t w[4] = {r.raw[k].x, r.raw[k].y, r.raw[k].z, r.raw[k].w};
      uint32_t sum = 0;
#pragma unroll
      for (int q = 0; q < 4; q++)
        sum += __dp4a(w[q], 0x01010101u, 0u);
#pragma unroll
      for (int o = 1; o < CH; o *= 2)
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
      mid = (sum + D / 2) / D;
    }
    const bool live = j0 + row < n_keys;
    float f[16];
    pq_codes<KQ>(r.raw[k], mid, f);
    uint32_t u[8];
#pragma unroll
    for (int e = 0; e < 8; e++)
      u[e] = live ? Mma<S>::pack(f[2 * e], f[2 * e + 1]) : 0u;
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(pf_at<D>(tile, row, 2 * c)),
                 "r"(u[0]), "r"(u[1]), "r"(u[2]), "r"(u[3]));
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(pf_at<D>(tile, row, 2 * c + 1)),
                 "r"(u[4]), "r"(u[5]), "r"(u[6]), "r"(u[7]));
    if (c == 0) {
      const float2 sl = r.scl[k];
      scale[row] = live ? sl.x : 0.f;
      offset[row] = !live || KQ != 1 ? 0.f : __fadd_rn(sl.y, __fmul_rn((float)mid, sl.x));
    }
  }
}

/* kvs__hadamard (not scaled down) of a row of D floats held by a warp, E =
 * D / 32 consecutive elements per lane: the same butterflies in the same
 * order, so the same float32 results. */
template <int D>
__device__ __forceinline__ void pq_rotate_row(float *x, uint32_t lane) {
  constexpr int E = D / 32;
#pragma unroll
  for (int h = 1; h < D; h *= 2) {
    if (h < E) {
#pragma unroll
      for (int k = 0; k < E; k++)
        if (!(k & h)) {
          const float a = x[k], b = x[k + h];
          x[k] = __fadd_rn(a, b);
          x[k + h] = __fsub_rn(a, b);
        }
    } else {
#pragma unroll
      for (int k = 0; k < E; k++) {
        const float y = __shfl_xor_sync(0xffffffffu, x[k], h / E);
        x[k] = (lane * E) & h ? __fsub_rn(y, x[k]) : __fadd_rn(x[k], y);
      }
    }
  }
}

/* int8: the warp's 16 query rows rotated (q . H y = H q . y) and split into
 * two halves of the dtype T, hi + lo; pass 0 stores hi, pass 1 lo into the
 * Q tile (the sum of each rotated row, for the keys' offsets, in qsum). */
template <typename T, int D>
__device__ __forceinline__ void pq_q_rows(uint32_t sQ, float *qsum, const kvs_attn_args &a,
                                          const kvs__pf_plan &p, uint32_t q0,
                                          uint32_t ratio, uint32_t h, uint32_t warp,
                                          uint32_t lane, int pass) {
  constexpr int E = D / 32;
  static_assert(E == 2 || E == 4, "int8 flash rows: head_dim 64 or 128");
  for (uint32_t rr = 0; rr < 16; rr++) {
    const uint32_t r = 16 * warp + rr;
    float x[E];
    if (r < p.rows) {
      const uint64_t qrow = kvs__pf_qrow(q0, p.row0 + r, ratio, a.num_heads, h);
      const T *src = (const T *)a.q + qrow * D + E * lane;
#pragma unroll
      for (int k = 0; k < E; k++)
        x[k] = (float)src[k];
      pq_rotate_row<D>(x, lane);
    } else {
#pragma unroll
      for (int k = 0; k < E; k++)
        x[k] = 0.f;
    }
    if (pass == 0) {
      float sum = 0.f;
#pragma unroll
      for (int k = 0; k < E; k++)
        sum += x[k];
#pragma unroll
      for (int o = 16; o >= 1; o /= 2)
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
      if (lane == 0)
        qsum[r] = sum;
    }
    uint32_t u[E / 2];
#pragma unroll
    for (int k = 0; k < E; k += 2) {
      const T h0 = (T)x[k], h1 = (T)x[k + 1];
      u[k / 2] = pass == 0 ? Mma<T>::pack((float)h0, (float)h1)
                           : Mma<T>::pack(x[k] - (float)h0, x[k + 1] - (float)h1);
    }
    const uint32_t at = pf_at<D>(sQ, r, E * lane / 8) + (E * lane % 8) * 2;
    if (E == 2)
      asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(at), "r"(u[0]));
    else
      asm volatile("st.shared.v2.u32 [%0], {%1, %2};\n" ::"r"(at), "r"(u[0]),
                   "r"(u[E / 2 - 1]));
  }
}

/* The power of two a row's weights times value scales are taken in: vmax *
 * unit in [0.5, 1) for the largest of them, vmax, within [2^-60, 2^60] (a
 * change of unit, a quotient of two, stays finite); 1 for 0 or non-finite.
 * As flash_model.c's value_unit. */
__device__ __forceinline__ float pq_unit(float vmax) {
  int e = (int)((__float_as_uint(vmax) >> 23) & 0xffu);
  if (!(vmax > 0.f) || e == 255)
    return 1.f;
  e = 126 - e;
  e = e < -60 ? -60 : e > 60 ? 60 : e;
  return __uint_as_float((uint32_t)(e + 127) << 23);
}

template <typename T, int KQ, int D, bool WG = false>
__device__ __forceinline__ void prefill_flash_body(const kvs_attn_args &a,
                                                   uint32_t span) {
  static_assert(!WG || (KQ == 0 && D <= 128), "wgmma: 16-bit caches, D 64/128");
  constexpr int BM = KVS__PF_BM;
  constexpr int BN = KQ ? KVS__PF_BN_Q : KVS__PF_BN(D);
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
  const uint32_t s0 = (uint32_t)__cvta_generic_to_shared(pf_smem);
  /* WG: K and V tiles on 1024 bytes (the swizzle's period), Q staged in V's */
  const uint32_t sK = WG ? (s0 + 1023u) & ~1023u : s0 + BM * D * 2;
  const uint32_t sV = sK + BN * D * 2;
  const uint32_t sQ = WG ? sV : s0;
  /* int8/fp8: the tile's key and value scales and offsets, the rows' sums
   * of rotated q (past the V tile) */
  float *const kscl = (float *)(pf_smem + (BM + 2 * BN) * D * 2);
  float *const koff = kscl + BN, *const vscl = koff + BN, *const voff = vscl + BN;
  float *const qsum = voff + BN;

  /* Which (request, tile): kvs__pf_locate, 32 requests per step of a warp
   * scan of their tile counts.  The answer goes through shared memory (the
   * K tile's first bytes, before anything is loaded there: a static
   * __shared__ would push the CTA past 48 KiB). */
  uint32_t *meta = (uint32_t *)(pf_smem + (sK - s0));
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

  /* Split blockIdx.z: key tiles [kt0, kt1) (all of them without a span). */
  uint32_t kt0, kt1;
  kvs__pf_split_tiles(&p, span, BN, blockIdx.z, &kt0, &kt1);
  if (span && (p.empty || kt0 >= kt1))
    return; /* nothing of this split (the merge zeroes rows with no key) */
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

  uint32_t qf[QREG ? KS : 1][4];
  PqRegs<D> kreg, vreg; /* int8/fp8: the next K and V tiles, fetched */
  /* Q tile (rows past the tile zero-filled), K and V of key tile 0.  int8:
   * Q rotated and split by each warp for its own rows; the high halves go
   * to registers, the low halves stay in the Q tile. */
  if constexpr (KQ == 1) {
    pq_q_rows<T, D>(sQ, qsum, a, p, q0, ratio, h, warp, lane, 0);
    __syncwarp();
    pf_ldsm_q<D, QREG ? KS : 0>(sQ, warp, lane, qf);
    __syncwarp();
    pq_q_rows<T, D>(sQ, qsum, a, p, q0, ratio, h, warp, lane, 1);
  } else {
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
  }
  if (KQ) {
    pf_commit(); /* fp8: Q's copies */
    pq_fetch<KQ, D>(kreg, kv, bt, kv.k_offset, h, kt0 * BN, p.n_keys, bs_pow2, bs_shift);
    pq_fetch<KQ, D>(vreg, kv, bt, kv.v_offset, h, kt0 * BN, p.n_keys, bs_pow2, bs_shift);
  } else if (WG) {
    /* Q's fragments into registers before V lands where Q was staged */
    pf_load_kv<D, BN, true>(sK, kv, bt, kv.k_offset + head_off, kt0 * BN, p.n_keys,
                            bs_pow2, bs_shift);
    pf_commit();
    asm volatile("cp.async.wait_all;\n" ::);
    __syncthreads();
    pf_ldsm_q<D, QREG ? KS : 0>(sQ, warp, lane, qf);
    __syncthreads();
    pf_load_kv<D, BN, true>(sV, kv, bt, kv.v_offset + head_off, kt0 * BN, p.n_keys,
                            bs_pow2, bs_shift);
    pf_commit();
  } else {
    pf_load_kv<D, BN>(sK, kv, bt, kv.k_offset + head_off, kt0 * BN, p.n_keys, bs_pow2,
                      bs_shift);
    pf_commit();
    pf_load_kv<D, BN>(sV, kv, bt, kv.v_offset + head_off, kt0 * BN, p.n_keys, bs_pow2,
                      bs_shift);
    pf_commit();
  }

  /* This lane's two rows: tile rows 16 warp + g and + 8. */
  const uint32_t r_lo = 16 * warp + kvs__pf_acc_row(lane, 0);
  const uint32_t r_hi = 16 * warp + kvs__pf_acc_row(lane, 2);
  const uint32_t pos_lo = kvs__pf_row_pos(&p, q_len, len, ratio, r_lo);
  const uint32_t pos_hi = kvs__pf_row_pos(&p, q_len, len, ratio, r_hi);
  const float scale2 = a.scale * 1.44269504088896341f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;
  /* int8/fp8: each lane's share of sum(weight * value offset) of its two
   * rows; per row, the largest weight times value scale so far (decayed
   * with the running max) and the accumulators' unit */
  float w_lo = 0.f, w_hi = 0.f, ma_lo = 0.f, ma_hi = 0.f, u_lo = 1.f, u_hi = 1.f;
  float o[DT][4];
#pragma unroll
  for (int i = 0; i < DT; i++)
    o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;

  /* K or V (plane k_offset or v_offset) of key tile kt + 1 on its way, once
   * every warp is done with this tile's: int8/fp8 into this thread's
   * registers, 16-bit by cp.async into the tile (one commit group each,
   * empty past the last tile) */
  auto load_next = [&](PqRegs<D> &regs, uint32_t stile, uint64_t plane, uint32_t kt) {
    if (KQ) {
      if (kt + 1 < kt1)
        pq_fetch<KQ, D>(regs, kv, bt, plane, h, (kt + 1) * BN, p.n_keys, bs_pow2, bs_shift);
    } else {
      if (kt + 1 < kt1)
        pf_load_kv<D, BN, WG>(stile, kv, bt, plane + head_off, (kt + 1) * BN, p.n_keys,
                              bs_pow2, bs_shift);
      pf_commit();
    }
  };
  for (uint32_t kt = kt0; kt < kt1; kt++) {
    if (KQ) {
      pq_put<T, KQ, D, false>(sK, kscl, koff, kreg, kt * BN, p.n_keys);
      if (kt == kt0)
        asm volatile("cp.async.wait_all;\n" ::); /* fp8: Q is in */
    } else {
      pf_wait_one(); /* Q (first tile) and K of this tile are in */
      if (WG)
        wg_proxy_fence();
    }
    __syncthreads();
    if (QREG && KQ != 1 && !WG && kt == kt0) {
      pf_ldsm_q<D, QREG ? KS : 0>(sQ, warp, lane, qf);
    }

    /* S = Q K^T */
    float sc[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++)
      sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;
    if constexpr (WG) { /* the warpgroup's 64 rows x BN keys, B = K read in place */
      wg_hold<NT>(sc); /* the zeros written before the fence */
      wg_arrive();
#pragma unroll
      for (int ks = 0; ks < KS; ks++)
        Wg<T, BN, 0>::run(sc, qf[QREG ? ks : 0], kvs__pf_wg_desc_k(sK, BN, ks));
      wg_commit_wait();
      wg_hold<NT>(sc);
    }
#pragma unroll
    for (int ks = 0; ks < (WG ? 0 : KS); ks++) {
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
      uint32_t al[4]; /* int8: the low halves of the rotated q */
      if (KQ == 1)
        pf_ldsm_x4(pf_at<D>(sQ, 16 * warp + kvs__pf_ldq_row(lane), kvs__pf_ldq_chunk(lane, ks)),
                   al);
#pragma unroll
      for (int np = 0; np < NT / 2; np++) {
        uint32_t b[4];
        pf_ldsm_x4(pf_at<D>(sK, kvs__pf_ldk_row(lane, np), kvs__pf_ldk_chunk(lane, ks)), b);
        Mma<T>::run(sc[2 * np], af[0], af[1], af[2], af[3], b[0], b[1]);
        Mma<T>::run(sc[2 * np + 1], af[0], af[1], af[2], af[3], b[2], b[3]);
        if (KQ == 1) {
          Mma<T>::run(sc[2 * np], al[0], al[1], al[2], al[3], b[0], b[1]);
          Mma<T>::run(sc[2 * np + 1], al[0], al[1], al[2], al[3], b[2], b[3]);
        }
      }
    }
    /* int8/fp8: the keys' scales and offsets, before the next put */
    float2 ks2[NT], ko2[NT];
    if (KQ) {
#pragma unroll
      for (int n = 0; n < NT; n++) {
        ks2[n] = *(const float2 *)&kscl[8 * n + kvs__pf_acc_col(lane, 0)];
        ko2[n] = *(const float2 *)&koff[8 * n + kvs__pf_acc_col(lane, 0)];
      }
    }
    const float qs_lo = KQ == 1 ? qsum[r_lo] : 0.f, qs_hi = KQ == 1 ? qsum[r_hi] : 0.f;
    __syncthreads(); /* every warp is done with the K tile */
    load_next(kreg, sK, kv.k_offset, kt);

    /* Scale, mask (boundary tiles only), online softmax. */
    const bool masked = kvs__pf_tile_masked(&p, kt);
    float mt_lo = -INFINITY, mt_hi = -INFINITY;
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const uint32_t j = kt * BN + 8 * n + kvs__pf_acc_col(lane, e);
        float x = sc[n][e];
        if (KQ) /* the key's scale, and its offset times sum(q) (as the
                 * C model rounds it: no contraction) */
          x = __fadd_rn(__fmul_rn(e & 1 ? ks2[n].y : ks2[n].x, x),
                        __fmul_rn(e & 1 ? ko2[n].y : ko2[n].x, e < 2 ? qs_lo : qs_hi));
        x *= scale2;
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
      sum_lo = __fadd_rn(sum_lo, __fadd_rn(sc[n][0], sc[n][1]));
      sum_hi = __fadd_rn(sum_hi, __fadd_rn(sc[n][2], sc[n][3]));
    }
    l_lo = __fadd_rn(__fmul_rn(l_lo, al_lo), sum_lo); /* no fma: as the model */
    l_hi = __fadd_rn(__fmul_rn(l_hi, al_hi), sum_hi);

    if (KQ) {
      pq_put<T, KQ, D, true>(sV, vscl, voff, vreg, kt * BN, p.n_keys);
    } else {
      pf_wait_one(); /* V of this tile is in (K of the next may not be) */
      if (WG)
        wg_proxy_fence();
    }
    __syncthreads();
    if (KQ) {
      /* Each weight times its value row's scale, and times its offset
       * (summed apart).  A masked weight (exactly 0) stays 0: the scales of
       * a key the row does not see may be NaN (a row that overflowed).
       * Per row a unit, a power of two that brings the largest such
       * product (this tile's, or an earlier one's times alpha) into [0.5,
       * 1): the products in it as two fp16 halves; the accumulators
       * rescaled by the change of unit (exact) with alpha. */
      float ws_lo = 0.f, ws_hi = 0.f, mx_lo = 0.f, mx_hi = 0.f;
#pragma unroll
      for (int n = 0; n < NT; n++) {
        const float2 vs = *(const float2 *)&vscl[8 * n + kvs__pf_acc_col(lane, 0)];
        const float2 vo = *(const float2 *)&voff[8 * n + kvs__pf_acc_col(lane, 0)];
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const float pw = sc[n][e];
          const float x = pw == 0.f ? 0.f : __fmul_rn(pw, e & 1 ? vs.y : vs.x);
          const float y = pw == 0.f ? 0.f : __fmul_rn(pw, e & 1 ? vo.y : vo.x);
          sc[n][e] = x;
          if (e < 2) {
            ws_lo = __fadd_rn(ws_lo, y);
            mx_lo = fmaxf(mx_lo, x);
          } else {
            ws_hi = __fadd_rn(ws_hi, y);
            mx_hi = fmaxf(mx_hi, x);
          }
        }
      }
#pragma unroll
      for (int of = 1; of <= 2; of *= 2) {
        mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, of));
        mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, of));
      }
      ma_lo = fmaxf(__fmul_rn(ma_lo, al_lo), mx_lo);
      ma_hi = fmaxf(__fmul_rn(ma_hi, al_hi), mx_hi);
      const float nu_lo = pq_unit(ma_lo), nu_hi = pq_unit(ma_hi);
      const float rs_lo = __fmul_rn(al_lo, nu_lo / u_lo);
      const float rs_hi = __fmul_rn(al_hi, nu_hi / u_hi);
      u_lo = nu_lo;
      u_hi = nu_hi;
#pragma unroll
      for (int i = 0; i < DT; i++) {
        o[i][0] = __fmul_rn(o[i][0], rs_lo);
        o[i][1] = __fmul_rn(o[i][1], rs_lo);
        o[i][2] = __fmul_rn(o[i][2], rs_hi);
        o[i][3] = __fmul_rn(o[i][3], rs_hi);
      }
#pragma unroll
      for (int n = 0; n < NT; n++) {
        sc[n][0] = __fmul_rn(sc[n][0], nu_lo);
        sc[n][1] = __fmul_rn(sc[n][1], nu_lo);
        sc[n][2] = __fmul_rn(sc[n][2], nu_hi);
        sc[n][3] = __fmul_rn(sc[n][3], nu_hi);
      }
      w_lo = __fadd_rn(__fmul_rn(w_lo, al_lo), ws_lo);
      w_hi = __fadd_rn(__fmul_rn(w_hi, al_hi), ws_hi);
#pragma unroll
      for (int kk = 0; kk < BN / 16; kk++) {
        uint32_t ah[4], alo[4];
#pragma unroll
        for (int f = 0; f < 4; f++) {
          const float *x = &sc[2 * kk + (f >> 1)][2 * (f & 1)];
          const __half h0 = __float2half_rn(x[0]), h1 = __float2half_rn(x[1]);
          ah[f] = Mma<__half>::pack(__half2float(h0), __half2float(h1));
          alo[f] = Mma<__half>::pack(x[0] - __half2float(h0), x[1] - __half2float(h1));
        }
#pragma unroll
        for (int dp = 0; dp < DT / 2; dp++) {
          uint32_t b[4];
          pf_ldsm_x4_t(pf_at<D>(sV, kvs__pf_ldv_row(lane, kk), kvs__pf_ldv_chunk(lane, dp)), b);
          Mma<__half>::run(o[2 * dp], ah[0], ah[1], ah[2], ah[3], b[0], b[1]);
          Mma<__half>::run(o[2 * dp + 1], ah[0], ah[1], ah[2], ah[3], b[2], b[3]);
          Mma<__half>::run(o[2 * dp], alo[0], alo[1], alo[2], alo[3], b[0], b[1]);
          Mma<__half>::run(o[2 * dp + 1], alo[0], alo[1], alo[2], alo[3], b[2], b[3]);
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < DT; i++) {
        o[i][0] *= al_lo;
        o[i][1] *= al_lo;
        o[i][2] *= al_hi;
        o[i][3] *= al_hi;
      }
      /* O += P V: P's accumulators are the A fragments of the k-steps. */
      if constexpr (WG) { /* the warpgroup's 64 rows x D, B = V read transposed */
        uint32_t pa[BN / 16][4];
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++)
          pf_pack_p<T>(sc, kk, pa[kk]);
        wg_hold<DT>(o); /* the rescaled accumulators written before the fence */
        wg_arrive();
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++)
          Wg<T, D, 1>::run(o, pa[kk], kvs__pf_wg_desc_v(sV, BN, kk));
        wg_commit_wait();
        wg_hold<DT>(o);
      }
#pragma unroll
      for (int kk = 0; kk < (WG ? 0 : BN / 16); kk++) {
        uint32_t pa[4];
        pf_pack_p<T>(sc, kk, pa);
#pragma unroll
        for (int dp = 0; dp < DT / 2; dp++) {
          uint32_t b[4];
          pf_ldsm_x4_t(pf_at<D>(sV, kvs__pf_ldv_row(lane, kk), kvs__pf_ldv_chunk(lane, dp)),
                       b);
          Mma<T>::run(o[2 * dp], pa[0], pa[1], pa[2], pa[3], b[0], b[1]);
          Mma<T>::run(o[2 * dp + 1], pa[0], pa[1], pa[2], pa[3], b[2], b[3]);
        }
      }
    }
    __syncthreads(); /* every warp is done with the V tile */
    load_next(vreg, sV, kv.v_offset, kt);
  }
  asm volatile("cp.async.wait_all;\n" ::);

  /* The rows' sums over their quads; out = O / l in the cache dtype. */
#pragma unroll
  for (int of = 1; of <= 2; of *= 2) {
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, of);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, of);
    if (KQ) {
      w_lo += __shfl_xor_sync(0xffffffffu, w_lo, of);
      w_hi += __shfl_xor_sync(0xffffffffu, w_hi, of);
    }
  }
  /* (a split leaves its partial unnormalised: the merge divides) */
  const float inv_lo = span ? 1.f : l_lo > 0.f ? 1.f / l_lo : 0.f;
  const float inv_hi = span ? 1.f : l_hi > 0.f ? 1.f / l_hi : 0.f;
  if (KQ) {
    /* out = (O in the unit, plus the offsets' share) / l; int8: rotated
     * back, a row's D columns over the quad's 4 lanes (column 8i + 2t + e
     * in o[i][e] of lane t: butterflies of stride 1 within a pair, 2 and 4
     * across the quad, 8 and up across i), kvs__hadamard's order */
    const float iu_lo = 1.f / u_lo, iu_hi = 1.f / u_hi; /* exact */
#pragma unroll
    for (int i = 0; i < DT; i++) {
      o[i][0] = __fmul_rn(__fadd_rn(__fmul_rn(o[i][0], iu_lo), w_lo), inv_lo);
      o[i][1] = __fmul_rn(__fadd_rn(__fmul_rn(o[i][1], iu_lo), w_lo), inv_lo);
      o[i][2] = __fmul_rn(__fadd_rn(__fmul_rn(o[i][2], iu_hi), w_hi), inv_hi);
      o[i][3] = __fmul_rn(__fadd_rn(__fmul_rn(o[i][3], iu_hi), w_hi), inv_hi);
    }
    if (KQ == 1) {
#pragma unroll
      for (int e = 0; e < 4; e += 2)
#pragma unroll
        for (int i = 0; i < DT; i++) {
          const float x0 = o[i][e], x1 = o[i][e + 1];
          o[i][e] = __fadd_rn(x0, x1);
          o[i][e + 1] = __fsub_rn(x0, x1);
        }
#pragma unroll
      for (int of = 1; of <= 2; of *= 2)
#pragma unroll
        for (int i = 0; i < DT; i++)
#pragma unroll
          for (int e = 0; e < 4; e++) {
            const float y = __shfl_xor_sync(0xffffffffu, o[i][e], of);
            o[i][e] = lane & of ? __fsub_rn(y, o[i][e]) : __fadd_rn(o[i][e], y);
          }
#pragma unroll
      for (int hi = 1; hi < DT; hi *= 2)
#pragma unroll
        for (int i = 0; i < DT; i++)
          if (!(i & hi))
#pragma unroll
            for (int e = 0; e < 4; e++) {
              const float x0 = o[i][e], x1 = o[i + hi][e];
              o[i][e] = __fadd_rn(x0, x1);
              o[i + hi][e] = __fsub_rn(x0, x1);
            }
    }
  }
#pragma unroll
  for (int hl = 0; hl < 2; hl++) {
    const uint32_t r = hl ? r_hi : r_lo;
    if (r >= p.rows)
      continue;
    const uint32_t pr = p.row0 + r;
    const uint64_t qrow = kvs__pf_qrow(q0, pr, ratio, a.num_heads, h);
    const float inv = hl ? inv_hi : inv_lo;
    if (span) {
      /* the row's partial: max (natural-log units), sum, output */
      if (!kvs__pf_split_writes(hl ? pos_hi : pos_lo, span, blockIdx.z))
        continue;
      const uint32_t parts = gridDim.z; /* the workspace's, as kernels.cu's */
      const uint64_t cells = (uint64_t)a.num_rows * a.num_heads * parts;
      const uint64_t cell = qrow * parts + blockIdx.z;
      float *ws = (float *)a.workspace;
      if (lane % 4 == 0) {
        ws[cell] = (hl ? m_hi : m_lo) * 0.693147180559945309f;
        ws[cells + cell] = hl ? l_hi : l_lo;
      }
#pragma unroll
      for (int i = 0; i < DT; i++)
        *(float2 *)(ws + 2 * cells + cell * D + 8 * i + kvs__pf_acc_col(lane, 0)) =
            KQ ? make_float2(o[i][2 * hl], o[i][2 * hl + 1])
               : make_float2(o[i][2 * hl] * inv, o[i][2 * hl + 1] * inv);
      continue;
    }
    char *orow = (char *)a.out + qrow * D * 2;
#pragma unroll
    for (int i = 0; i < DT; i++)
      *(uint32_t *)(orow + (8 * i + kvs__pf_acc_col(lane, 0)) * 2) =
          KQ ? Mma<T>::pack(o[i][2 * hl], o[i][2 * hl + 1])
             : Mma<T>::pack(o[i][2 * hl] * inv, o[i][2 * hl + 1] * inv);
  }
}

/* After a split launch of `parts` splits: the rows' partials into out
 * (kernels.cu's merge; a name of its own, so that the stand-in driver, whose
 * old attention kernels write the final output, can tell the two apart). */
extern "C" __global__ void kvs_prefill_flash_merge_kernel(kvs_attn_args a, uint32_t parts,
                                                          uint32_t span) {
  attn_merge_body(a, 1, parts, span);
}

#define KVS_PREFILL_FLASH_INST(NAME, T, D)                                    \
  extern "C" __global__ void __launch_bounds__(KVS__PF_THREADS, 2)           \
      kvs_prefill_flash_##NAME##_d##D(kvs_attn_args a, uint32_t span) {        \
    prefill_flash_body<T, 0, D>(a, span);                                      \
  }
/* int8 / fp8 caches, q/out fp16 or bf16: kvs_prefill_flash_int8_fp16_d64 */
#define KVS_PREFILL_FLASH_INST_Q(CACHE, KQ, NAME, T, D)                        \
  extern "C" __global__ void __launch_bounds__(KVS__PF_THREADS, 2)           \
      kvs_prefill_flash_##CACHE##_##NAME##_d##D(kvs_attn_args a, uint32_t span) { \
    prefill_flash_body<T, KQ, D>(a, span);                                        \
  }
/* The sm_90a variant: wgmma (kernels_wgmma.cuh), 16-bit caches, D 128;
 * the launcher picks it on compute capability 9.0 only, with shared memory
 * for either body (kvs__pf_wg_smem): any other image (a JIT of the
 * compute_90 PTX) runs the mma.sync body under this name. */
template <typename T, int D>
__device__ __forceinline__ void prefill_flash_wg(const kvs_attn_args &a, uint32_t span) {
#if KVS_WGMMA
  prefill_flash_body<T, 0, D, true>(a, span);
#else
  prefill_flash_body<T, 0, D, false>(a, span);
#endif
}
#define KVS_PREFILL_FLASH_WG_INST(NAME, T, D)                                 \
  extern "C" __global__ void __launch_bounds__(KVS__PF_THREADS, 2)           \
      kvs_prefill_flash_wg_##NAME##_d##D(kvs_attn_args a, uint32_t span) {     \
    prefill_flash_wg<T, D>(a, span);                                           \
  }
KVS_PREFILL_FLASH_WG_INST(fp16, __half, 128)
KVS_PREFILL_FLASH_WG_INST(bf16, __nv_bfloat16, 128)
KVS_PREFILL_FLASH_INST(fp16, __half, 64)
KVS_PREFILL_FLASH_INST(fp16, __half, 128)
KVS_PREFILL_FLASH_INST(fp16, __half, 256)
KVS_PREFILL_FLASH_INST(bf16, __nv_bfloat16, 64)
KVS_PREFILL_FLASH_INST(bf16, __nv_bfloat16, 128)
KVS_PREFILL_FLASH_INST(bf16, __nv_bfloat16, 256)
KVS_PREFILL_FLASH_INST_Q(int8, 1, fp16, __half, 64)
KVS_PREFILL_FLASH_INST_Q(int8, 1, fp16, __half, 128)
KVS_PREFILL_FLASH_INST_Q(int8, 1, bf16, __nv_bfloat16, 64)
KVS_PREFILL_FLASH_INST_Q(int8, 1, bf16, __nv_bfloat16, 128)
KVS_PREFILL_FLASH_INST_Q(fp8, 2, fp16, __half, 64)
KVS_PREFILL_FLASH_INST_Q(fp8, 2, fp16, __half, 128)
KVS_PREFILL_FLASH_INST_Q(fp8, 2, bf16, __nv_bfloat16, 64)
KVS_PREFILL_FLASH_INST_Q(fp8, 2, bf16, __nv_bfloat16, 128)
