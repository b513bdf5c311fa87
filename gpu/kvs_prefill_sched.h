/*
 * kvs_prefill_sched.h — the schedule of the flash prefill kernel
 * (gpu/kernels_prefill.cuh): which CTA takes which query rows, which key
 * tiles it walks, which of them need a per-element causal mask, and how the
 * query heads of a GQA group are packed into the rows of a tile.
 *
 * Plain C11 and CUDA both compile this header (KVS_HD is __host__ __device__
 * under nvcc, nothing under gcc/clang), so the C model of the kernel
 * (tests/standin/flash_model.c) walks exactly the tiles the kernel walks,
 * and the unit tests check the same functions the kernel runs.  Not
 * installed.
 *
 * Packed rows.  A CTA works for one request s and one kv head h.  The
 * request's q_len new tokens times the GQA group's `ratio` query heads make
 * q_len * ratio packed rows, packed row r = token * ratio + head_in_group
 * (query head h * ratio + head_in_group of row q_start[s] + token).  Tile t
 * of the request holds packed rows [t * BM, t * BM + BM) (the last one
 * partial); so one K/V tile read into shared memory serves every query
 * head of the kv head.
 *
 * Grid.  grid.x = kvs__pf_grid_x() (an upper bound of the tiles of all
 * requests: ceil(rows * ratio / BM) + num_seqs), grid.y = num_kv_heads.
 * CTA x finds its (request, tile) with kvs__pf_locate(): requests in order,
 * each taking kvs__pf_tiles(q_len, ratio) consecutive CTAs, the request's
 * last tile (the one with the most keys) first; CTAs past the last request
 * have no tile and exit.  The host never reads q_start (device memory).
 */
#ifndef KVS_PREFILL_SCHED_H
#define KVS_PREFILL_SCHED_H

#include <stdint.h>

#include "kvs_layout.h" /* KVS_HD */

/* Packed query rows per CTA: 4 warps of 16 rows (an m16n8k16 A tile). */
#define KVS__PF_BM 64u
#define KVS__PF_WARPS 4u
#define KVS__PF_THREADS (KVS__PF_WARPS * 32u)

/* Keys per tile: 64 for head_dim 64 and 128; 16 for 256, so that Q, K and V
 * tiles of 16-bit elements, (BM + 2 * BN) * D * 2 bytes, fit the 48 KiB a
 * launch may ask for without an attribute (24, 48, 48 KiB). */
#define KVS__PF_BN(head_dim) ((head_dim) > 128 ? 16u : 64u)
static inline KVS_HD uint32_t kvs__pf_bn(uint32_t head_dim) {
  return KVS__PF_BN(head_dim);
}

/* int8/fp8 caches (head_dim 64 and 128): tiles of 32 keys.  The codes are
 * staged as exact 16-bit values (int8: the byte less 128 for a key, less
 * its row's rounded mean for a value; fp8: the e4m3 number), and each tile
 * carries its keys' and values' scales and offsets, 4 * BN floats, plus one
 * float per query row (the sum of its rotated q, int8): (BM + 2 * BN) * D
 * * 2 + (4 * BN + BM) * 4 bytes. */
#define KVS__PF_BN_Q 32u

/* Keys per tile for a cache of `dtype`. */
static inline KVS_HD uint32_t kvs__pf_bn_for(uint32_t dtype, uint32_t head_dim) {
  return kvs_dtype_quantized(dtype) ? KVS__PF_BN_Q : KVS__PF_BN(head_dim);
}

/* Dynamic shared memory of one CTA, in bytes: Q, K and V tiles of 16-bit
 * elements, then (int8/fp8) the scales: 16 / 32 KiB + 768 bytes for
 * head_dim 64 / 128. */
static inline KVS_HD uint32_t kvs__pf_smem_for(uint32_t dtype, uint32_t head_dim) {
  const uint32_t bn = kvs__pf_bn_for(dtype, head_dim);
  return (KVS__PF_BM + 2u * bn) * head_dim * 2u +
         (kvs_dtype_quantized(dtype) ? (4u * bn + KVS__PF_BM) * 4u : 0u);
}
static inline KVS_HD uint32_t kvs__pf_smem(uint32_t head_dim) {
  return kvs__pf_smem_for(KVS_DTYPE_FP16, head_dim);
}

/* Tiles (CTAs per kv head) of a request with q_len new rows. */
static inline KVS_HD uint32_t kvs__pf_tiles(uint32_t q_len, uint32_t ratio) {
  return (uint32_t)(((uint64_t)q_len * ratio + KVS__PF_BM - 1) / KVS__PF_BM);
}

/* grid.x: at least the sum of kvs__pf_tiles over the requests, since
 * ceil(a / BM) <= a / BM + 1 for each of them. */
static inline KVS_HD uint64_t kvs__pf_grid_x(uint32_t num_rows,
                                             uint32_t num_seqs,
                                             uint32_t ratio) {
  return ((uint64_t)num_rows * ratio + KVS__PF_BM - 1) / KVS__PF_BM + num_seqs;
}

/* The (request, tile) of CTA bx, walking the requests in order: 1 and
 * *seq, *tile set, or 0 when bx is past the last tile (the CTA exits).
 * Within a request the CTAs take its tiles last first.  (The kernel runs
 * the same walk 32 requests at a time, a warp scan; this is its
 * reference.) */
static inline KVS_HD int kvs__pf_locate(const uint32_t *q_start,
                                        uint32_t num_seqs, uint32_t ratio,
                                        uint32_t bx, uint32_t *seq,
                                        uint32_t *tile) {
  for (uint32_t s = 0; s < num_seqs; s++) {
    uint32_t n = kvs__pf_tiles(q_start[s + 1] - q_start[s], ratio);
    if (bx < n) {
      *seq = s;
      *tile = n - 1 - bx;
      return 1;
    }
    bx -= n;
  }
  return 0;
}

/* The kernel's form of kvs__pf_locate, one step of its warp scan: lane l
 * holds request c0 + l with n tiles, inc = the inclusive sum of n over the
 * lanes up to l, before = the tiles of every request before c0.  1 when CTA
 * bx is that request's (and *tile set, last tile first). */
static inline KVS_HD int kvs__pf_scan_pick(uint32_t bx, uint32_t before,
                                           uint32_t inc, uint32_t n,
                                           uint32_t *tile) {
  uint32_t first = before + inc - n;
  if (bx < first || bx >= before + inc)
    return 0;
  *tile = n - 1 - (bx - first);
  return 1;
}

/* What one CTA does for its tile. */
typedef struct kvs__pf_plan {
  uint32_t row0;         /* first packed row of the tile */
  uint32_t rows;         /* packed rows in the tile (<= BM) */
  uint32_t empty;        /* 1: no key for any row (seq_len 0, or more new
                            rows than keys): the rows get zeros */
  uint32_t pos_first;    /* position of the tile's first row */
  uint32_t pos_last;     /* position of its last row */
  uint32_t n_keys;       /* keys any row of the tile sees: pos_last + 1 */
  uint32_t n_ktiles;     /* key tiles walked: ceil(n_keys / BN) */
  uint32_t first_masked; /* key tiles from this one on hold a key past
                            pos_first: masked per element */
} kvs__pf_plan;

/* Plan tile `tile` of a request with q_len new rows of its seq_len keys, BN
 * keys per tile.  Row i of the request sits at position seq_len - q_len + i
 * and sees keys 0..position; a key tile wholly at or below pos_first needs
 * no mask (every row of the tile sees all of it); tiles past n_keys are
 * skipped. */
static inline KVS_HD void kvs__pf_plan_tile(uint32_t q_len, uint32_t seq_len,
                                            uint32_t ratio, uint32_t bn,
                                            uint32_t tile, kvs__pf_plan *p) {
  uint32_t total = q_len * ratio;
  p->row0 = tile * KVS__PF_BM;
  p->rows = total - p->row0 < KVS__PF_BM ? total - p->row0 : KVS__PF_BM;
  p->empty = seq_len == 0 || q_len > seq_len;
  if (p->empty) {
    p->pos_first = p->pos_last = p->n_keys = p->n_ktiles = 0;
    p->first_masked = 0;
    return;
  }
  uint32_t prefix = seq_len - q_len;
  p->pos_first = prefix + p->row0 / ratio;
  p->pos_last = prefix + (p->row0 + p->rows - 1) / ratio;
  p->n_keys = p->pos_last + 1;
  p->n_ktiles = (p->n_keys + bn - 1) / bn;
  p->first_masked = (p->pos_first + 1) / bn;
}

/* Token (within the request's new rows) and head in the group of packed row
 * r. */
static inline KVS_HD uint32_t kvs__pf_row_token(uint32_t r, uint32_t ratio) {
  return r / ratio;
}
static inline KVS_HD uint32_t kvs__pf_row_head(uint32_t r, uint32_t ratio) {
  return r % ratio;
}

/* The q and out row (of head_dim elements) of packed row r of kv head h,
 * for a request whose new rows start at row q0 of num_heads query heads:
 * token q0 + r / ratio, query head h * ratio + r % ratio. */
static inline KVS_HD uint64_t kvs__pf_qrow(uint32_t q0, uint32_t r,
                                           uint32_t ratio, uint32_t num_heads,
                                           uint32_t h) {
  return (uint64_t)(q0 + kvs__pf_row_token(r, ratio)) * num_heads +
         (uint64_t)h * ratio + kvs__pf_row_head(r, ratio);
}

/* Position of row `local` of the tile (0..BM-1); rows past p->rows (padding,
 * never stored) take pos_last, so they see only keys that exist. */
static inline KVS_HD uint32_t kvs__pf_row_pos(const kvs__pf_plan *p,
                                              uint32_t q_len, uint32_t seq_len,
                                              uint32_t ratio, uint32_t local) {
  if (local >= p->rows)
    return p->pos_last;
  return seq_len - q_len + (p->row0 + local) / ratio;
}

/* Does key tile kt need the per-element mask? */
static inline KVS_HD int kvs__pf_tile_masked(const kvs__pf_plan *p,
                                             uint32_t kt) {
  return kt >= p->first_masked;
}

/* Does a row at position pos see key j?  (A key tile may run past n_keys:
 * those keys are past every row's position, so this masks them too.) */
static inline KVS_HD int kvs__pf_visible(uint32_t j, uint32_t pos) {
  return j <= pos;
}

/*
 * Splits over long prefixes (grid.z): split z of a tile walks the key tiles
 * of keys [z * span, (z + 1) * span), span a multiple of every BN (the
 * launcher takes a multiple of KVS__ATTN_PART), and writes each row's
 * partial result to the attention workspace (kvs_kernels_int.h: max, sum,
 * unnormalised output per (row, query head, split), grid.z splits as its
 * partitions) for the merge kernel,
 * which combines splits 0 .. ceil(keys / span) - 1 of every row.  A split
 * writes the rows that see a key in its range: keys = position + 1 >
 * z * span.  span 0: no split, the CTA writes the output itself.
 */
static inline KVS_HD void kvs__pf_split_tiles(const kvs__pf_plan *p,
                                              uint32_t span, uint32_t bn,
                                              uint32_t z, uint32_t *kt0,
                                              uint32_t *kt1) {
  if (!span) {
    *kt0 = 0;
    *kt1 = p->n_ktiles;
    return;
  }
  uint64_t a = (uint64_t)z * (span / bn), b = a + span / bn;
  *kt0 = a < p->n_ktiles ? (uint32_t)a : p->n_ktiles;
  *kt1 = b < p->n_ktiles ? (uint32_t)b : p->n_ktiles;
}

/* Does split z of a row at position pos have a partial to write? */
static inline KVS_HD int kvs__pf_split_writes(uint32_t pos, uint32_t span,
                                              uint32_t z) {
  return (uint64_t)pos + 1 > (uint64_t)z * span;
}

/* ---- shared-memory tiles and m16n8k16 fragments ---------------------------
 *
 * A tile row is D 16-bit elements, 16-byte chunks; chunk c of row r is
 * stored at chunk c ^ (r % 8) of the row (XOR swizzle: the 8 rows one
 * ldmatrix matrix reads sit in 8 different bank groups).  Lane = 4g + t.
 * ldmatrix.x4: lanes 8i..8i+7 give the row addresses of matrix i, which
 * lands in the lanes' register i.  The functions below say which tile row
 * and chunk each lane addresses; the kernel calls them, and the fragment
 * emulator of test_gpu_flash_model checks them against the PTX ISA's
 * fragment layouts. */

/* Byte offset of chunk c of row r in a tile of D-element rows. */
static inline KVS_HD uint32_t kvs__pf_smem_off(uint32_t d, uint32_t r,
                                               uint32_t c) {
  return r * d * 2u + ((c ^ (r & 7u)) << 4);
}

/* Q.K^T, k-step ks (dims 16ks..16ks+15): the A fragment of the warp's 16
 * rows (matrices: rows 0-7 | 8-15 of dims 0-7, then of dims 8-15). */
static inline KVS_HD uint32_t kvs__pf_ldq_row(uint32_t lane) {
  return lane & 15u;
}
static inline KVS_HD uint32_t kvs__pf_ldq_chunk(uint32_t lane, uint32_t ks) {
  return 2u * ks + (lane >> 4);
}

/* Q.K^T, k-step ks: the B fragments of key n-tiles 2np (registers 0, 1)
 * and 2np + 1 (2, 3); a K row is a column of B, no transpose. */
static inline KVS_HD uint32_t kvs__pf_ldk_row(uint32_t lane, uint32_t np) {
  return 16u * np + (lane & 7u) + ((lane >> 4) << 3);
}
static inline KVS_HD uint32_t kvs__pf_ldk_chunk(uint32_t lane, uint32_t ks) {
  return 2u * ks + ((lane >> 3) & 1u);
}

/* P.V, k-step kk (keys 16kk..16kk+15): the B fragments (ldmatrix .trans of
 * V rows) of dim n-tiles 2dp (registers 0, 1) and 2dp + 1 (2, 3). */
static inline KVS_HD uint32_t kvs__pf_ldv_row(uint32_t lane, uint32_t kk) {
  return 16u * kk + (lane & 7u) + (((lane >> 3) & 1u) << 3);
}
static inline KVS_HD uint32_t kvs__pf_ldv_chunk(uint32_t lane, uint32_t dp) {
  return 2u * dp + (lane >> 4);
}

/* Accumulator element e (0..3) of a lane: row in the warp's 16, column in
 * the 8-wide n-tile. */
static inline KVS_HD uint32_t kvs__pf_acc_row(uint32_t lane, uint32_t e) {
  return lane / 4u + 8u * (e >> 1);
}
static inline KVS_HD uint32_t kvs__pf_acc_col(uint32_t lane, uint32_t e) {
  return 2u * (lane % 4u) + (e & 1u);
}

/*
 * The sm_90a variant (kvs_prefill_flash_wg_*: 16-bit caches, head_dim 128;
 * the layout below also serves 64, which the model tests) multiplies with
 * wgmma, whose B operand the tensor cores read from shared memory through a
 * 64-bit descriptor.  Its K and V tiles use the
 * canonical 128-byte-swizzle layout: the tile's D columns in atoms of 64
 * (128 bytes a row), atom a at a * BN * 128, row r (a key) at r * 128 in
 * it, 16-byte chunk c of the row at (c ^ (r % 8)) * 16 -- the hardware's
 * swizzle XORs address bits 4-6 with bits 7-9, so the tiles start on 1024
 * bytes.  The Q tile is staged in the V tile's bytes (the old layout) and
 * lives in registers from then on.
 *
 * Descriptor: bits 0-13 start address >> 4, 16-29 the leading byte offset
 * >> 4, 32-45 the stride byte offset >> 4, 62-63 the swizzle (1: 128
 * bytes).  S = Q K^T reads K "K-major" (a key's dims contiguous): 8-row
 * groups 1024 bytes apart (stride), the leading offset unused (1); k-step ks
 * starts at atom ks / 4, byte 32 (ks % 4).  O = P V reads V "MN-major"
 * (transposed: a key's dims are B's columns): 8-key groups 1024 bytes
 * apart (stride), the 64-column atoms BN * 128 apart (leading); k-step kk
 * starts at key 16 kk. */
static inline KVS_HD uint32_t kvs__pf_wg_off(uint32_t bn, uint32_t r, uint32_t c) {
  return (c >> 3) * bn * 128u + r * 128u + (((c & 7u) ^ (r & 7u)) << 4);
}
static inline KVS_HD uint64_t kvs__pf_wg_desc(uint32_t addr, uint32_t lead,
                                              uint32_t stride) {
  return (uint64_t)((addr & 0x3ffffu) >> 4) | (uint64_t)((lead >> 4) & 0x3fffu) << 16 |
         (uint64_t)((stride >> 4) & 0x3fffu) << 32 | (uint64_t)1 << 62;
}
static inline KVS_HD uint64_t kvs__pf_wg_desc_k(uint32_t tile, uint32_t bn,
                                                uint32_t ks) {
  return kvs__pf_wg_desc(tile + (ks >> 2) * bn * 128u + (ks & 3u) * 32u, 16u, 1024u);
}
static inline KVS_HD uint64_t kvs__pf_wg_desc_v(uint32_t tile, uint32_t bn,
                                                uint32_t kk) {
  return kvs__pf_wg_desc(tile + kk * 2048u, bn * 128u, 1024u);
}
/* Its dynamic shared memory: the K and V tiles and up to 1 KiB to align
 * them (17 / 33 KiB at head_dim 64 / 128), or the mma.sync body's if that
 * is more (24 / 48 KiB): an image other than sm_90a runs that body under
 * the same name (the driver should load the sm_90a image on compute
 * capability 9.0, but a JIT of the compute_90 PTX must not fault). */
static inline KVS_HD uint32_t kvs__pf_wg_smem(uint32_t head_dim) {
  const uint32_t wg = 2u * KVS__PF_BN(head_dim) * head_dim * 2u + 1024u;
  const uint32_t mma = kvs__pf_smem(head_dim);
  return wg > mma ? wg : mma;
}

#endif /* KVS_PREFILL_SCHED_H */
