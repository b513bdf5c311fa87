/*
 * test_gpu_flash_model.c — the flash prefill kernel without a GPU.
 *
 * Nothing here runs the CUDA kernel (gpu/kernels_prefill.cuh); what can be
 * checked on a CPU is checked:
 *   1. its schedule (gpu/kvs_prefill_sched.h, the functions the kernel
 *      runs): every (request, tile) taken by exactly one CTA, the grid's
 *      bound, the packed rows of each tile, and that a key tile the plan
 *      leaves unmasked is visible to every row of the tile, that every key
 *      past n_keys is masked, that no row needs a key past n_keys;
 *   2. its C model (tests/standin/flash_model.c: the same tiles, the same
 *      per-tile online softmax, weights rounded to the cache dtype before
 *      P.V; int8/fp8 caches as the kernel stages and scales them) against
 *      the C twin kvs_cpu_prefill_attention and the naive double-precision
 *      reference, on ragged batches over pools whose unused slots and
 *      blocks hold NaN and infinities;
 *   2b. the split over long prefixes: the model's partials merged;
 *   3. that those comparisons can fail: the model with a planted masking
 *      fault, a single 16-bit rounding of int8's q or weights, or a split
 *      short of a key tile must be caught;
 *   3b. the kernel's fragment plumbing: a warp emulated lane by lane, with
 *      ldmatrix (.x4, .trans) and mma.m16n8k16 written here from the PTX
 *      ISA's fragment layouts, addressing swizzled shared-memory tiles
 *      through the sched header's lane maps (the ones the kernel calls)
 *      and wiring registers as the kernel does, must compute Q.K^T and P.V
 *      exactly (small integers), with conflict-free ldmatrix phases;
 *   3c. whole CTAs of the kernel, transliterated onto that warp (per-lane
 *      softmax, mask, quad reductions, P packing, stores; cp.async landing
 *      only at its wait_group, shared memory NaN until written), over every
 *      CTA of the grid against the twin, with planted faults caught; the
 *      int8/fp8 kernel and the split's stores the same way;
 *   3d. value scales NaN, or 2^20 larger, at a key the earlier rows of its
 *      tile do not see: those rows as the twin's;
 *   4. the launcher: through the stand-in driver, kvs_cuda_prefill_attention
 *      with kvs__cuda_prefill_flash = 1 launches kvs_prefill_flash_* (which
 *      the stand-in runs as the model) for the shapes it takes, split and
 *      merged given a workspace, and the old kernel for everything else
 *      and with the knob at 0.
 * Plain C (no cmocka).  The real kernel's check is test_gpu_cuda on a GPU.
 */
#include <unistd.h>

#include "gpu/kvs_kernels_int.h"
#include "gpu/kvs_prefill_sched.h"
#include "kvs_asan.h"
#include "kvs_status.h"
#include "test_gpu_util.h"
#include "tests/standin/flash_model.h"

static int failures;

#define CHECK(cond, ...)                                   \
  do {                                                     \
    if (!(cond)) {                                         \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                        \
      fprintf(stderr, "\n");                               \
      failures++;                                          \
    }                                                      \
  } while (0)

/* ---- 1. the schedule ---------------------------------------------------- */

static void test_schedule(void) {
  uint64_t rng = 77;
  int cases = 0;
  for (int it = 0; it < 400; it++) {
    /* up to 9 requests; every 8th batch up to 100 (several scan steps) */
    uint32_t ns = 1 + (uint32_t)(tg_next(&rng) % (it % 8 == 7 ? 100 : 9));
    static const uint32_t ratios[] = {1, 2, 3, 4, 6, 8, 16};
    uint32_t ratio = ratios[tg_next(&rng) % 7];
    static const uint32_t dims[] = {64, 128, 256};
    uint32_t bn = kvs__pf_bn(dims[it % 3]);
    uint32_t qs[101], lens[100];
    qs[0] = 0;
    for (uint32_t s = 0; s < ns; s++) {
      uint32_t kind = (uint32_t)(tg_next(&rng) % 6);
      uint32_t ql = kind == 0 ? 0 : kind == 1 ? 1 : (uint32_t)(tg_next(&rng) % 300);
      uint32_t prefix = (uint32_t)(tg_next(&rng) % 3) == 0 ? 0 : (uint32_t)(tg_next(&rng) % 500);
      lens[s] = ql + prefix;
      if (kind == 5 && ql > 1)
        lens[s] = ql - 1; /* more rows than keys: zeros */
      qs[s + 1] = qs[s] + ql;
    }
    uint64_t gx = kvs__pf_grid_x(qs[ns], ns, ratio);
    uint32_t want = 0;
    for (uint32_t s = 0; s < ns; s++)
      want += kvs__pf_tiles(qs[s + 1] - qs[s], ratio);
    CHECK(gx >= want, "grid %llu < %u tiles", (unsigned long long)gx, want);
    /* each (request, tile) once, in order; spare CTAs have none */
    uint32_t seen = 0;
    char *hit = calloc((size_t)ns * 128, 1);
    for (uint32_t bx = 0; bx < gx; bx++) {
      uint32_t s, t;
      if (!kvs__pf_locate(qs, ns, ratio, bx, &s, &t)) {
        CHECK(bx >= want, "CTA %u of %u tiles has none", bx, want);
        continue;
      }
      CHECK(bx < want, "spare CTA %u got a tile", bx);
      uint32_t ql = qs[s + 1] - qs[s], n = kvs__pf_tiles(ql, ratio);
      CHECK(t < n && n <= 128, "tile %u of %u", t, n);
      if (t >= n || n > 128)
        continue;
      CHECK(!hit[s * 128 + t], "request %u tile %u twice", s, t);
      hit[s * 128 + t] = 1;
      seen++;
      kvs__pf_plan p;
      kvs__pf_plan_tile(ql, lens[s], ratio, bn, t, &p);
      CHECK(p.rows >= 1 && p.rows <= KVS__PF_BM && p.row0 + p.rows <= ql * ratio &&
                (t + 1 == n || p.rows == KVS__PF_BM),
            "rows [%u, +%u) of %u", p.row0, p.rows, ql * ratio);
      if (p.empty) {
        CHECK(lens[s] == 0 || ql > lens[s], "empty tile with keys");
        continue;
      }
      CHECK(p.n_keys <= lens[s], "n_keys %u > seq_len %u", p.n_keys, lens[s]);
      uint32_t maxpos = 0;
      for (uint32_t r = 0; r < KVS__PF_BM; r++) {
        uint32_t pos = kvs__pf_row_pos(&p, ql, lens[s], ratio, r);
        CHECK(pos < p.n_keys, "row %u at %u, n_keys %u", r, pos, p.n_keys);
        if (r < p.rows) {
          uint32_t tok = kvs__pf_row_token(p.row0 + r, ratio);
          CHECK(kvs__pf_row_head(p.row0 + r, ratio) < ratio && tok < ql &&
                    tok * ratio + kvs__pf_row_head(p.row0 + r, ratio) == p.row0 + r,
                "packing of row %u", p.row0 + r);
          CHECK(pos == lens[s] - ql + tok, "position of row %u", r);
          maxpos = pos > maxpos ? pos : maxpos;
        }
        for (uint32_t kt = 0; ns <= 9 && kt < p.n_ktiles; kt++)
          for (uint32_t c = 0; c < bn; c++) {
            uint32_t j = kt * bn + c;
            int vis = kvs__pf_visible(j, pos);
            CHECK(kvs__pf_tile_masked(&p, kt) || vis,
                  "unmasked tile %u hides key %u from row %u", kt, j, r);
            CHECK(j < p.n_keys || !vis, "key %u past n_keys %u visible", j, p.n_keys);
          }
      }
      CHECK(p.n_keys == maxpos + 1, "n_keys %u, last position %u", p.n_keys, maxpos);
      CHECK(p.n_ktiles == (p.n_keys + bn - 1) / bn, "key tiles");
      cases++;
    }
    CHECK(seen == want, "%u of %u tiles taken", seen, want);
    /* the kernel's warp scan (32 requests a step; shfl_up emulated) finds
     * what kvs__pf_locate finds, for every CTA of the grid */
    for (uint32_t bx = 0; bx < gx; bx++) {
      uint32_t s_ref = 0, t_ref = 0, s_k = 0, t_k = 0, before = 0;
      int ref = kvs__pf_locate(qs, ns, ratio, bx, &s_ref, &t_ref), found = 0;
      for (uint32_t c0 = 0; c0 < ns && !found; c0 += 32) {
        uint32_t n[32], inc[32];
        for (uint32_t l = 0; l < 32; l++)
          n[l] = c0 + l < ns ? kvs__pf_tiles(qs[c0 + l + 1] - qs[c0 + l], ratio) : 0;
        for (uint32_t l = 0; l < 32; l++)
          inc[l] = n[l] + (l ? inc[l - 1] : 0);
        for (uint32_t l = 0; l < 32; l++) {
          uint32_t t;
          if (kvs__pf_scan_pick(bx, before, inc[l], n[l], &t)) {
            CHECK(!found, "CTA %u: two lanes pick it", bx);
            s_k = c0 + l;
            t_k = t;
            found = 1;
          }
        }
        before += inc[31];
      }
      CHECK(found == ref && (!ref || (s_k == s_ref && t_k == t_ref)),
            "CTA %u: the warp scan finds (%d, %u, %u), locate (%d, %u, %u)",
            bx, found, s_k, t_k, ref, s_ref, t_ref);
    }
    free(hit);
  }
  printf("%s schedule: 400 random batches, %d tiles checked\n",
         failures ? "FAIL" : "ok  ", cases);
}

/* ---- 2, 3. the model against the twin ------------------------------------ */


static const tg_ragged batches[] = {
    /* prefix 0; chunk 1 (decode rows) with and without prefix; a prefix
     * not a multiple of the tile; q_len 0 with and without keys; lengths
     * off every multiple of 64 */
    {7, {0, 100, 37, 0, 200, 64, 0}, {70, 1, 150, 0, 0, 64, 1}},
    {5, {129, 0, 3, 250, 17}, {31, 200, 1, 77, 130}},
    {3, {0, 511, 65}, {257, 2, 63}},
};

static void attn_pair(const tg_params *pp, const tg_ragged *bt, int plant,
                      double *x_twin, double *e_ref) {
  uint32_t lens[8];
  tg_case c;
  if (tg_ragged_case(&c, pp, bt, lens)) {
    CHECK(0, "case refused");
    return;
  }
  tg_params p = c.p;
  uint32_t D = p.head_dim;
  size_t n = (size_t)c.num_rows * c.num_heads * D;
  void *twin = tg_xmalloc(n * 2), *model = tg_xmalloc(n * 2);
  double *ref = tg_xmalloc(sizeof(double) * (n ? n : 1));
  memset(model, 0xff, n * 2); /* NaN: every row must be written */
  kvs_attn_args a;
  tg_case_args(&c, &a, c.pool, twin, c.q, c.seq_lens, c.q_start, c.tables);
  CHECK(kvs_cpu_prefill_attention(&a, NULL) == 0, "twin");
  tg_naive(&c, ref);
  a.out = model;
  uint32_t ratio = p.ratio;
  uint64_t gx = kvs__pf_grid_x(a.num_rows, a.num_seqs, ratio);
  CHECK(kvs__flash_model(&a, (uint32_t)gx, p.num_kv_heads, 1, 0, plant) == 0, "model");
  *x_twin = tg_twin_excess(model, twin, p.qo_dtype, n);
  *e_ref = tg_max_err(model, p.qo_dtype, ref, n);
  free(twin);
  free(model);
  free(ref);
  tg_case_free(&c);
}

/* A case's verdict against the twin (x: excess over its tolerance) and
 * the naive reference (e: max error), printed and counted. */
static void report_case(const char *what, const tg_params *p, int batch,
                        double x, double e) {
  int ok = x <= 1.0 && e <= tg_tol(p->qo_dtype);
  printf("%s %s %s bs=%u D=%-3u ratio=%u batch %d: vs twin %.2f of the "
         "tolerance, vs naive %.2e\n",
         ok ? "ok  " : "FAIL", what, kvs_dtype_name(p->dtype), p->block_size,
         p->head_dim, p->ratio, batch, x, e);
  failures += !ok;
}

/* The case a planted fault is tried on: fp16, D 64, GQA 4, block size 16. */
static tg_params plant_params(uint64_t seed) {
  return (tg_params){.block_size = 16, .num_kv_heads = 2, .head_dim = 64,
                     .ratio = 4, .dtype = KVS_DTYPE_FP16,
                     .qo_dtype = KVS_DTYPE_FP16, .num_layers = 1,
                     .spare_blocks = 2, .q_scale = 1.f, .seed = seed};
}

/* A planted fault must take the result past the twin's tolerance. */
static void report_plant(const char *where, const char *what, double x) {
  int caught = x > 1.0;
  printf("%s %s (%s): vs twin %.2f of the tolerance, %s\n",
         caught ? "ok  " : "FAIL", where, what, x,
         caught ? "caught" : "NOT caught");
  failures += !caught;
}

/* Under AddressSanitizer the largest model cases (head_dim x GQA ratio of
 * 1024 or more: D 128 at ratio 8, D 256 at 4 and 8) took 40 of the test's
 * 57 s, in code the smaller cases run too; the plain build runs them all.
 * (int8/fp8 cases: 512 or more; the splits: spans of 512 over the
 * smaller batch only.) */
#define MODEL_MAX_WORK (KVS_ASAN ? 1024u : UINT32_MAX)

static void test_model(void) {
  static const uint32_t dims[] = {64, 128, 256}, ratios[] = {1, 4, 8};
  int k = 0;
  for (uint32_t dt = KVS_DTYPE_FP16; dt <= KVS_DTYPE_BF16; dt++)
    for (int id = 0; id < 3; id++)
      for (int ir = 0; ir < 3; ir++, k++) {
        const tg_ragged *bt = &batches[k % 3];
        if (dims[id] * ratios[ir] >= MODEL_MAX_WORK) {
          printf("skip model %s D=%-3u ratio=%u: under the sanitizers (the "
                 "plain build runs it)\n",
                 kvs_dtype_name(dt), dims[id], ratios[ir]);
          continue;
        }
        tg_params p = {.block_size = k % 2 ? 32 : 16, .num_kv_heads = 2,
                       .head_dim = dims[id], .ratio = ratios[ir], .dtype = dt,
                       .qo_dtype = dt, .num_layers = 2, .layer = (uint32_t)k % 2,
                       .spare_blocks = 3, .q_scale = k % 2 ? 4.f : 1.f,
                       .seed = 7000 + (uint64_t)k};
        double x, e;
        attn_pair(&p, bt, KVS__FLASH_PLANT_NONE, &x, &e);
        report_case("model", &p, k % 3, x, e);
      }
  /* int8/fp8 caches under q/out fp16 and bf16, head_dim 64 and 128 */
  for (uint32_t dt = KVS_DTYPE_INT8; dt <= KVS_DTYPE_FP8; dt++)
    for (uint32_t qo = KVS_DTYPE_FP16; qo <= KVS_DTYPE_BF16; qo++)
      for (int id = 0; id < 2; id++)
        for (int ir = 0; ir < 3; ir++, k++) {
          const tg_ragged *bt = &batches[k % 3];
          if (dims[id] * ratios[ir] >= MODEL_MAX_WORK / 2) {
            printf("skip model %s/%s D=%-3u ratio=%u: under the sanitizers "
                   "(the plain build runs it)\n",
                   kvs_dtype_name(dt), kvs_dtype_name(qo), dims[id], ratios[ir]);
            continue;
          }
          tg_params p = {.block_size = k % 2 ? 32 : 16, .num_kv_heads = 2,
                         .head_dim = dims[id], .ratio = ratios[ir], .dtype = dt,
                         .qo_dtype = qo, .num_layers = 2,
                         .layer = (uint32_t)k % 2, .spare_blocks = 3,
                         .q_scale = k % 2 ? 4.f : 1.f, .seed = 7000 + (uint64_t)k};
          double x, e;
          attn_pair(&p, bt, KVS__FLASH_PLANT_NONE, &x, &e);
          report_case(qo == KVS_DTYPE_FP16 ? "model q/out fp16" : "model q/out bf16",
                      &p, k % 3, x, e);
        }
  /* the same comparisons must catch a planted fault */
  static const struct {
    int plant;
    uint32_t dt;
    const char *what;
  } plants[] = {
      {KVS__FLASH_PLANT_MASK, KVS_DTYPE_FP16, "a row sees one key too many"},
      {KVS__FLASH_PLANT_NOSKIP, KVS_DTYPE_FP16, "boundary tiles unmasked"},
      {KVS__FLASH_PLANT_MASK, KVS_DTYPE_INT8, "int8: a row sees one key too many"},
      /* the two halves the kernel splits a float into, shown needed: on
       * the cases above that the single rounding fails */
      {KVS__FLASH_PLANT_QHI, KVS_DTYPE_INT8, "int8: rotated q rounded once"},
      {KVS__FLASH_PLANT_PHI, KVS_DTYPE_INT8,
       "int8: weight times value scale rounded once"},
  };
  static const tg_params halves[] = {
      {.block_size = 32, .num_kv_heads = 2, .head_dim = 64, .ratio = 4,
       .dtype = KVS_DTYPE_INT8, .qo_dtype = KVS_DTYPE_FP16, .num_layers = 2,
       .layer = 1, .spare_blocks = 3, .q_scale = 4.f, .seed = 7019},
      {.block_size = 16, .num_kv_heads = 2, .head_dim = 128, .ratio = 4,
       .dtype = KVS_DTYPE_INT8, .qo_dtype = KVS_DTYPE_FP16, .num_layers = 2,
       .layer = 0, .spare_blocks = 3, .q_scale = 1.f, .seed = 7022},
  };
  for (int i = 0; i < 5; i++) {
    tg_params p = plant_params(9100 + (uint64_t)i);
    p.dtype = plants[i].dt;
    if (i >= 3)
      p = halves[i - 3];
    double x, e;
    attn_pair(&p, &batches[1], plants[i].plant, &x, &e);
    report_plant("planted fault", plants[i].what, x);
  }
}

/* ---- 3b. the fragment plumbing, on an emulated warp ------------------------ */

/*
 * ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16, per the PTX ISA: lanes
 * 8i..8i+7 give the addresses of rows 0..7 of matrix i (8 elements each);
 * lane L's register i holds, without .trans, elements (L/4, 2(L%4)) and
 * (L/4, 2(L%4)+1) of matrix i; with .trans, (2(L%4), L/4) and
 * (2(L%4)+1, L/4).  Low half first.  Also: the 8 rows of a matrix must fall
 * in 8 different 16-byte bank groups (else a bank conflict), counted.
 */
static int conflicts;
static void emu_ldsm(const uint16_t *tile, const uint32_t off[32], int trans,
                     uint32_t out[32][4]) {
  for (uint32_t i = 0; i < 4; i++) {
    uint32_t seen = 0;
    for (uint32_t r = 0; r < 8; r++) {
      uint32_t bank = (off[8 * i + r] / 16) % 8;
      conflicts += (seen >> bank) & 1;
      seen |= 1u << bank;
    }
    for (uint32_t L = 0; L < 32; L++) {
      uint32_t r0 = trans ? 2 * (L % 4) : L / 4, c0 = trans ? L / 4 : 2 * (L % 4);
      uint32_t r1 = trans ? r0 + 1 : r0, c1 = trans ? c0 : c0 + 1;
      uint16_t lo = (uint16_t)tile[off[8 * i + r0] / 2 + c0];
      uint16_t hi = (uint16_t)tile[off[8 * i + r1] / 2 + c1];
      out[L][i] = lo | (uint32_t)hi << 16;
    }
  }
}

static int emu_bf16; /* emu_mma decodes bf16 when set (3c) */
static int emu_bad_desc; /* descriptors emu_wg_b could not read (3b') */
static uint32_t emu_smem_size; /* bytes emu_wg_b may read (past them: a fault) */
static float h16(uint16_t b) {
  return emu_bf16 ? kvs_bf16_to_float(b) : kvs_fp16_to_float(b);
}
static float h_lo(uint32_t r) { return h16((uint16_t)r); }
static float h_hi(uint32_t r) { return h16((uint16_t)(r >> 16)); }

/* mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32, per the PTX ISA:
 * A a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..);
 * B b0 (k 2t..2t+1, n g), b1 (k 2t+8.., n g); C c0,c1 (g, 2t..2t+1),
 * c2,c3 (g+8, 2t..). */
/* The 16 x 16 A of a warp's A fragment (wgmma's per warp is the same). */
static void emu_unpack_a(const uint32_t a[32][4], float A[16][16]) {
  for (uint32_t L = 0; L < 32; L++) {
    uint32_t g = L / 4, t = L % 4;
    for (uint32_t h = 0; h < 2; h++) {
      uint32_t k = 2 * t + h;
      A[g][k] = h ? h_hi(a[L][0]) : h_lo(a[L][0]);
      A[g + 8][k] = h ? h_hi(a[L][1]) : h_lo(a[L][1]);
      A[g][k + 8] = h ? h_hi(a[L][2]) : h_lo(a[L][2]);
      A[g + 8][k + 8] = h ? h_hi(a[L][3]) : h_lo(a[L][3]);
    }
  }
}

static void emu_mma(float c[32][4], const uint32_t a[32][4],
                    const uint32_t b0[32], const uint32_t b1[32]) {
  float A[16][16], B[16][8];
  emu_unpack_a(a, A);
  for (uint32_t L = 0; L < 32; L++) {
    uint32_t g = L / 4, t = L % 4;
    for (uint32_t h = 0; h < 2; h++) {
      uint32_t k = 2 * t + h;
      B[k][g] = h ? h_hi(b0[L]) : h_lo(b0[L]);
      B[k + 8][g] = h ? h_hi(b1[L]) : h_lo(b1[L]);
    }
  }
  for (uint32_t L = 0; L < 32; L++)
    for (uint32_t e = 0; e < 4; e++) {
      uint32_t row = L / 4 + 8 * (e >> 1), col = 2 * (L % 4) + (e & 1);
      float x = 0.f;
      for (uint32_t k = 0; k < 16; k++)
        x += A[row][k] * B[k][col];
      c[L][e] += x;
    }
}

/* The two mma of one ldmatrix .x4 of B: registers 0, 1 are the b0, b1 of
 * the first n-tile (into c0), registers 2, 3 those of the second (c1). */
static void emu_mma_x4(float c0[32][4], float c1[32][4],
                       const uint32_t a[32][4], const uint32_t b[32][4]) {
  uint32_t b0[32], b1[32];
  for (uint32_t i = 0; i < 2; i++) {
    for (uint32_t L = 0; L < 32; L++) {
      b0[L] = b[L][2 * i];
      b1[L] = b[L][2 * i + 1];
    }
    emu_mma(i ? c1 : c0, a, b0, b1);
  }
}

static uint32_t pack_h(float lo, float hi) {
  return kvs_float_to_fp16(lo) | (uint32_t)kvs_float_to_fp16(hi) << 16;
}

/* P's accumulators (score n-tiles 2kk, 2kk + 1) packed into the A
 * fragments of P.V k-step kk, as the kernel packs them. */
static void pack_p(float (*sc)[32][4], uint32_t kk, uint32_t af[32][4]) {
  for (uint32_t L = 0; L < 32; L++) {
    af[L][0] = pack_h(sc[2 * kk][L][0], sc[2 * kk][L][1]);
    af[L][1] = pack_h(sc[2 * kk][L][2], sc[2 * kk][L][3]);
    af[L][2] = pack_h(sc[2 * kk + 1][L][0], sc[2 * kk + 1][L][1]);
    af[L][3] = pack_h(sc[2 * kk + 1][L][2], sc[2 * kk + 1][L][3]);
  }
}

/* A Q tile [64][D] of small integers: q, and sq in the kernel's swizzled
 * layout, stored chunk by chunk as the cp.async loads store them. */
static void fill_q_tile(float *q, uint16_t *sq, uint32_t D, uint64_t *rng) {
  for (uint32_t r = 0; r < KVS__PF_BM; r++)
    for (uint32_t d = 0; d < D; d++) {
      q[r * D + d] = (float)((int)(tg_next(rng) % 7) - 3);
      sq[kvs__pf_smem_off(D, r, d / 8) / 2 + d % 8] = kvs_float_to_fp16(q[r * D + d]);
    }
}

/* Warp w's scores S (BN / 8 accumulator tiles) against q . k; then S set
 * to the weights P, small integers of each score's row and key, also kept
 * in pm [16][BN] (the warp's rows).  Returns the wrong scores. */
static int check_s_set_p(float (*sc)[32][4], uint32_t w, uint32_t D, uint32_t BN,
                         const float *q, const float *k, float *pm) {
  int bad = 0;
  for (uint32_t n = 0; n < BN / 8; n++)
    for (uint32_t L = 0; L < 32; L++)
      for (uint32_t e = 0; e < 4; e++) {
        uint32_t row = 16 * w + kvs__pf_acc_row(L, e), key = 8 * n + kvs__pf_acc_col(L, e);
        float x = 0.f;
        for (uint32_t d = 0; d < D; d++)
          x += q[row * D + d] * k[key * D + d];
        bad += sc[n][L][e] != x;
        float p = (float)((row * 7 + key * 3) % 5);
        pm[(row - 16 * w) * BN + key] = p;
        sc[n][L][e] = p;
      }
  return bad;
}

/* A warp's O (D / 8 accumulator tiles) against pm [16][BN] . v. */
static int check_o(float (*o)[32][4], uint32_t D, uint32_t BN, const float *pm,
                   const float *v) {
  int bad = 0;
  for (uint32_t i = 0; i < D / 8; i++)
    for (uint32_t L = 0; L < 32; L++)
      for (uint32_t e = 0; e < 4; e++) {
        uint32_t row = kvs__pf_acc_row(L, e), dim = 8 * i + kvs__pf_acc_col(L, e);
        float x = 0.f;
        for (uint32_t j = 0; j < BN; j++)
          x += pm[row * BN + j] * v[j * D + dim];
        bad += o[i][L][e] != x;
      }
  return bad;
}

/* One warp (w) of a CTA over a Q tile [64][D], K and V tiles [BN][D] in
 * swizzled shared memory, values small integers (every sum exact). */
static int emu_warp(uint32_t D, uint32_t w, uint64_t *rng) {
  const uint32_t BN = kvs__pf_bn(D), BM = KVS__PF_BM;
  float *q = tg_xmalloc(sizeof(float) * BM * D), *k = tg_xmalloc(sizeof(float) * BN * D);
  float *v = tg_xmalloc(sizeof(float) * BN * D), *pm = tg_xmalloc(sizeof(float) * 16 * BN);
  uint16_t *sq = tg_xmalloc((size_t)BM * D * 2), *sk = tg_xmalloc((size_t)BN * D * 2);
  uint16_t *sv = tg_xmalloc((size_t)BN * D * 2);
  fill_q_tile(q, sq, D, rng);
  for (uint32_t r = 0; r < BN; r++)
    for (uint32_t d = 0; d < D; d++) {
      k[r * D + d] = (float)((int)(tg_next(rng) % 7) - 3);
      v[r * D + d] = (float)((int)(tg_next(rng) % 5) - 2);
      sk[kvs__pf_smem_off(D, r, d / 8) / 2 + d % 8] = kvs_float_to_fp16(k[r * D + d]);
      sv[kvs__pf_smem_off(D, r, d / 8) / 2 + d % 8] = kvs_float_to_fp16(v[r * D + d]);
    }
  int bad = 0;
  /* S = Q K^T, wired as the kernel does */
  float (*sc)[32][4] = calloc(BN / 8, sizeof *sc);
  uint32_t off[32], af[32][4], b[32][4];
  for (uint32_t ks = 0; ks < D / 16; ks++) {
    for (uint32_t L = 0; L < 32; L++)
      off[L] = kvs__pf_smem_off(D, 16 * w + kvs__pf_ldq_row(L), kvs__pf_ldq_chunk(L, ks));
    emu_ldsm(sq, off, 0, af);
    for (uint32_t np = 0; np < BN / 16; np++) {
      for (uint32_t L = 0; L < 32; L++)
        off[L] = kvs__pf_smem_off(D, kvs__pf_ldk_row(L, np), kvs__pf_ldk_chunk(L, ks));
      emu_ldsm(sk, off, 0, b);
      emu_mma_x4(sc[2 * np], sc[2 * np + 1], af, b);
    }
  }
  bad += check_s_set_p(sc, w, D, BN, q, k, pm);
  /* O += P V: P's accumulators packed into A fragments as the kernel does */
  float (*o)[32][4] = calloc(D / 8, sizeof *o);
  for (uint32_t kk = 0; kk < BN / 16; kk++) {
    pack_p(sc, kk, af);
    for (uint32_t dp = 0; dp < D / 16; dp++) {
      for (uint32_t L = 0; L < 32; L++)
        off[L] = kvs__pf_smem_off(D, kvs__pf_ldv_row(L, kk), kvs__pf_ldv_chunk(L, dp));
      emu_ldsm(sv, off, 1, b);
      emu_mma_x4(o[2 * dp], o[2 * dp + 1], af, b);
    }
  }
  bad += check_o(o, D, BN, pm, v);
  free(sc);
  free(o);
  free(q);
  free(k);
  free(v);
  free(pm);
  free(sq);
  free(sk);
  free(sv);
  return bad;
}

static void test_fragments(void) {
  uint64_t rng = 991;
  static const uint32_t dims[] = {64, 128, 256};
  for (int i = 0; i < 3; i++) {
    int bad = 0;
    conflicts = 0;
    for (uint32_t w = 0; w < KVS__PF_WARPS; w++)
      bad += emu_warp(dims[i], w, &rng);
    int ok = bad == 0 && conflicts == 0;
    printf("%s fragments D=%-3u BN=%-2u: emulated warps' Q.K^T and P.V %s, "
           "%d ldmatrix bank conflicts\n",
           ok ? "ok  " : "FAIL", dims[i], kvs__pf_bn(dims[i]),
           bad ? "WRONG" : "exact", conflicts);
    failures += !ok;
  }
}

/* ---- 3b'. the wgmma variant's plumbing (sm_90a) --------------------------- */

/*
 * wgmma.mma_async.sync.aligned.m64nNk16.f32.f16.f16 with A in registers, per
 * the PTX ISA: warp w of the warpgroup holds rows 16w..16w+15 of A as the
 * A fragment of mma.m16n8k16 and the same rows of D as N / 8 accumulator
 * tiles of mma.m16n8 (so one warp's share is computed here); B, 16 x N, is
 * read from shared memory through the descriptor (start, leading and stride
 * byte offsets >> 4 in bits 0-13, 16-29, 32-45; swizzle mode in 62-63),
 * here only its canonical 128-byte-swizzle layouts:
 *   K-major (tnsp 0): B(k, n) at start + (n % 8) * 128 + (n / 8) * stride
 *     + 2k (the 16 k of a row in two 16-byte units, contiguous);
 *   MN-major (tnsp 1): B(k, n) at start + 2 (n % 64) + (n / 64) * leading
 *     + (k % 8) * 128 + (k / 8) * stride;
 * then the swizzle: address bits 4-6 XOR bits 7-9.  Written from the ISA's
 * layouts, not from the kernel's helpers, which are what it checks.
 */
static float emu_wg_b(const uint8_t *smem, uint64_t desc, int tnsp, uint32_t k,
                      uint32_t n) {
  uint32_t start = (uint32_t)(desc & 0x3fffu) << 4;
  uint32_t lead = (uint32_t)((desc >> 16) & 0x3fffu) << 4;
  uint32_t stride = (uint32_t)((desc >> 32) & 0x3fffu) << 4;
  if (desc >> 62 != 1 || ((desc >> 49) & 7u)) {
    emu_bad_desc++;
    return 0.f;
  }
  uint32_t at = tnsp ? start + 2 * (n % 64) + (n / 64) * lead + (k % 8) * 128 +
                           (k / 8) * stride
                     : start + (n % 8) * 128 + (n / 8) * stride + 2 * k;
  at ^= ((at >> 7) & 7u) << 4;
  if (at + 2 > emu_smem_size) {
    emu_bad_desc++;
    return 0.f;
  }
  uint16_t b;
  memcpy(&b, smem + at, 2);
  return h16(b);
}

static void emu_wgmma_warp(float (*d)[32][4], uint32_t N, const uint32_t a[32][4],
                           const uint8_t *smem, uint64_t desc, int tnsp) {
  float A[16][16];
  emu_unpack_a(a, A);
  for (uint32_t n8 = 0; n8 < N / 8; n8++)
    for (uint32_t L = 0; L < 32; L++)
      for (uint32_t e = 0; e < 4; e++) {
        uint32_t row = L / 4 + 8 * (e >> 1), col = 8 * n8 + 2 * (L % 4) + (e & 1);
        float x = 0.f;
        for (uint32_t k = 0; k < 16; k++)
          x += A[row][k] * emu_wg_b(smem, desc, tnsp, k, col);
        d[n8][L][e] += x;
      }
}

/* One CTA's S = Q K^T and O = P V on the wgmma variant's wiring: K and V
 * stored where the kernel's loads put them (kvs__pf_wg_off, tiles aligned
 * from the dynamic shared memory's start s0 as the kernel aligns them), Q
 * fragments from the Q tile staged in the V tile's bytes, descriptors from
 * kvs__pf_wg_desc_k / _v.  plant 1: the V descriptor's strides swapped;
 * 2: K read as MN-major (the planted runs must come out wrong).  Returns
 * the number of wrong elements (and layout faults). */
static int emu_wg_cta(uint32_t D, uint32_t s0, int plant, uint64_t *rng) {
  const uint32_t BN = kvs__pf_bn(D), BM = KVS__PF_BM, tile = BN * D * 2;
  const uint32_t sK = (s0 + 1023u) & ~1023u, sV = sK + tile;
  int bad = 0;
  if (sV + tile - s0 > kvs__pf_wg_smem(D))
    bad++; /* the tiles must fit the shared memory the launch asks for */
  uint8_t *smem = calloc(1, sV + tile);
  uint8_t *used = calloc(1, sV + tile);
  emu_smem_size = sV + tile;
  float *q = tg_xmalloc(sizeof(float) * BM * D), *k = tg_xmalloc(sizeof(float) * BN * D);
  float *v = tg_xmalloc(sizeof(float) * BN * D), *pm = tg_xmalloc(sizeof(float) * BM * BN);
  uint16_t *sq = tg_xmalloc((size_t)BM * D * 2);
  fill_q_tile(q, sq, D, rng);
  /* the 16-byte chunks as pf_load_kv<D, BN, true> stores them: each in the
   * tile, none twice */
  for (uint32_t r = 0; r < BN; r++)
    for (uint32_t c = 0; c < D / 8; c++) {
      uint32_t at = kvs__pf_wg_off(BN, r, c);
      if (at % 16 || at + 16 > tile || used[sK + at]) {
        bad++;
        continue;
      }
      used[sK + at] = 1;
      for (uint32_t e = 0; e < 8; e++) {
        uint32_t d = 8 * c + e;
        k[r * D + d] = (float)((int)(tg_next(rng) % 7) - 3);
        v[r * D + d] = (float)((int)(tg_next(rng) % 5) - 2);
        uint16_t kb = kvs_float_to_fp16(k[r * D + d]), vb = kvs_float_to_fp16(v[r * D + d]);
        memcpy(smem + sK + at + 2 * e, &kb, 2);
        memcpy(smem + sV + at + 2 * e, &vb, 2);
      }
    }
  emu_bad_desc = 0;
  uint32_t off[32], af[32][4];
  for (uint32_t w = 0; w < KVS__PF_WARPS; w++) {
    float (*sc)[32][4] = calloc(BN / 8, sizeof *sc);
    for (uint32_t ks = 0; ks < D / 16; ks++) {
      for (uint32_t L = 0; L < 32; L++)
        off[L] = kvs__pf_smem_off(D, 16 * w + kvs__pf_ldq_row(L), kvs__pf_ldq_chunk(L, ks));
      emu_ldsm(sq, off, 0, af);
      emu_wgmma_warp(sc, BN, af, smem, kvs__pf_wg_desc_k(sK, BN, ks), plant == 2);
    }
    bad += check_s_set_p(sc, w, D, BN, q, k, pm + 16 * w * BN);
    float (*o)[32][4] = calloc(D / 8, sizeof *o);
    for (uint32_t kk = 0; kk < BN / 16; kk++) {
      pack_p(sc, kk, af);
      uint64_t dv = kvs__pf_wg_desc_v(sV, BN, kk);
      if (plant == 1) /* leading and stride offsets swapped */
        dv = (dv & ~(0x3fffull << 16 | 0x3fffull << 32)) | ((dv >> 16) & 0x3fffu) << 32 |
             ((dv >> 32) & 0x3fffu) << 16;
      emu_wgmma_warp(o, D, af, smem, dv, 1);
    }
    bad += check_o(o, D, BN, pm + 16 * w * BN, v);
    free(sc);
    free(o);
  }
  bad += emu_bad_desc;
  free(smem);
  free(used);
  free(q);
  free(k);
  free(v);
  free(pm);
  free(sq);
  return bad;
}

static void test_wg_fragments(void) {
  uint64_t rng = 1993;
  static const uint32_t dims[] = {64, 128};
  emu_bf16 = 0;
  for (int i = 0; i < 2; i++) {
    int bad = 0;
    /* dynamic shared memory starting on 1024 bytes and off it */
    static const uint32_t starts[] = {0x400, 0x10, 0x7f0};
    for (int j = 0; j < 3; j++)
      bad += emu_wg_cta(dims[i], starts[j], 0, &rng);
    int caught1 = emu_wg_cta(dims[i], 0x400, 1, &rng) > 0;
    int caught2 = emu_wg_cta(dims[i], 0x400, 2, &rng) > 0;
    /* an image without wgmma runs the mma.sync body under the same launch */
    bad += kvs__pf_wg_smem(dims[i]) < kvs__pf_smem(dims[i]);
    int ok = bad == 0 && caught1 && caught2;
    printf("%s wgmma fragments D=%-3u BN=%-2u: emulated warpgroup's Q.K^T and P.V "
           "through the descriptors %s; planted faults (V strides swapped, K "
           "transposed) %s\n",
           ok ? "ok  " : "FAIL", dims[i], kvs__pf_bn(dims[i]), bad ? "WRONG" : "exact",
           caught1 && caught2 ? "caught" : "MISSED");
    failures += !ok;
  }
}

/* ---- 3c. whole CTAs of the kernel, emulated ------------------------------- */

/*
 * prefill_flash_body transliterated line by line onto the emulated warp
 * above: 4 warps of 32 lanes, each lane's registers (Q fragments, scores,
 * running max and sum, accumulators) kept per lane; the lane-level mask
 * (key 8n + acc_col, position of row g or g + 8), the quad reductions as
 * the two shfl_xor steps, the -inf guards, the packing of P into A
 * fragments and the output stores as the kernel does them.  Shared memory
 * starts as NaN; a cp.async lands only when a cp.async.wait_group lets it
 * (a commit group waited too early leaves NaN to be read), zero-fills land
 * at once.  Run over every CTA of the grid, the result must match the twin
 * as the model does; planted faults (a wait that lets V land one group
 * late, P packed high half first) must be caught.
 */
enum { EMU_PLANT_NONE, EMU_PLANT_WAIT, EMU_PLANT_PACK };

/* emu_cta runs the wgmma variant (WG) when set: K and V tiles in its layout
 * from the first 1024-byte boundary after a dynamic shared memory start of
 * EMU_WG_S0 (off that boundary, as the kernel must expect), Q staged in the
 * V tile and read into registers before V's first copy is issued, the
 * products through emu_wgmma_warp and the kernel's descriptors.  Planted
 * (EMU_PLANT_WGQ): V's first copy issued before Q's fragments are read. */
static int emu_wg;
#define EMU_WG_S0 0x230u
enum { EMU_PLANT_WGQ = 5 };
static uint32_t emu_smem_bytes(uint32_t dtype, uint32_t D) {
  uint32_t wg = EMU_WG_S0 + kvs__pf_wg_smem(D), mma = kvs__pf_smem_for(dtype, D);
  return emu_wg && wg > mma ? wg : mma;
}

typedef struct emu_cp {
  uint32_t dst; /* halfword index in shared memory */
  const char *src;
  uint32_t group;
} emu_cp;
typedef struct emu_smem {
  uint16_t *h;
  emu_cp *cp;
  uint32_t n_cp, cap, committed;
} emu_smem;

static void emu_cp_async(emu_smem *m, uint32_t byte_off, const char *src) {
  if (m->n_cp == m->cap) {
    m->cap = m->cap ? 2 * m->cap : 4096;
    m->cp = realloc(m->cp, sizeof(emu_cp) * m->cap);
    if (!m->cp)
      abort();
  }
  m->cp[m->n_cp++] = (emu_cp){byte_off / 2, src, m->committed};
}
static void emu_zero16(emu_smem *m, uint32_t byte_off) {
  memset(m->h + byte_off / 2, 0, 16);
}
/* cp.async.wait_group n: every group but the newest n committed lands. */
static void emu_wait(emu_smem *m, uint32_t n) {
  uint32_t k = 0;
  for (uint32_t i = 0; i < m->n_cp; i++) {
    if (m->cp[i].group + n < m->committed)
      memcpy(m->h + m->cp[i].dst, m->cp[i].src, 16);
    else
      m->cp[k++] = m->cp[i];
  }
  m->n_cp = k;
}

static uint32_t emu_pack(uint32_t dt, float lo, float hi) {
  if (dt == KVS_DTYPE_BF16)
    return kvs_float_to_bf16(lo) | (uint32_t)kvs_float_to_bf16(hi) << 16;
  return pack_h(lo, hi);
}

static float round_to(uint32_t dt, float v) {
  return dt == KVS_DTYPE_BF16 ? kvs_bf16_to_float(kvs_float_to_bf16(v))
                              : kvs_fp16_to_float(kvs_float_to_fp16(v));
}

static void emu_load_kv(emu_smem *m, uint32_t tile, const kvs_attn_args *a,
                        const uint32_t *bt, uint64_t plane, uint32_t j0,
                        uint32_t n_keys, uint32_t rows) {
  const kvs_paged_kv *kv = &a->kv;
  const uint32_t D = kv->head_dim, CH = D / 8;
  for (uint32_t i = 0; i < rows * CH; i++) {
    uint32_t r = i / CH, c = i % CH, j = j0 + r;
    uint32_t dst = tile + (emu_wg ? kvs__pf_wg_off(rows, r, c) : kvs__pf_smem_off(D, r, c));
    if (j < n_keys)
      emu_cp_async(m, dst, (const char *)kv->base +
                               (uint64_t)bt[j / kv->block_size] * kv->block_stride +
                               plane + (j % kv->block_size) * kv->token_stride * 2 +
                               c * 16);
    else
      emu_zero16(m, dst);
  }
}

/* A CTA's request and plan (kvs__pf_locate, kvs__pf_plan_tile) and, for
 * split z, its key tiles [*kt0, *kt1); shared memory reset to NaN.  0 for a
 * spare CTA, for an empty tile (whose zeros it stores unless split), or a
 * split with no key tile. */
static int emu_cta_begin(const kvs_attn_args *a, uint32_t h, uint32_t bx,
                         uint32_t BN, uint32_t span, uint32_t z, emu_smem *m,
                         uint32_t *s, kvs__pf_plan *p, uint32_t *kt0,
                         uint32_t *kt1) {
  const uint32_t D = a->kv.head_dim, CH = D / 8;
  const uint32_t ratio = a->num_heads / a->kv.num_kv_heads;
  uint32_t tile;
  if (!kvs__pf_locate(a->q_start, a->num_seqs, ratio, bx, s, &tile))
    return 0;
  const uint32_t q0 = a->q_start[*s], q_len = a->q_start[*s + 1] - q0;
  kvs__pf_plan_tile(q_len, a->seq_lens[*s], ratio, BN, tile, p);
  if (p->empty && span)
    return 0; /* the merge zeroes these rows */
  if (p->empty) {
    for (uint32_t i = 0; i < p->rows * CH; i++) {
      uint32_t pr = p->row0 + i / CH;
      uint64_t qrow = kvs__pf_qrow(q0, pr, ratio, a->num_heads, h);
      memset((char *)a->out + qrow * D * 2 + (i % CH) * 16, 0, 16);
    }
    return 0;
  }
  kvs__pf_split_tiles(p, span, BN, z, kt0, kt1);
  if (*kt0 >= *kt1)
    return 0;
  memset(m->h, 0xff, emu_smem_bytes(a->kv.dtype, D)); /* NaN until written */
  m->n_cp = m->committed = 0;
  return 1;
}

/* Each lane's two rows (g and g + 8 of its warp's 16): tile row, position,
 * running max and sum, and the last tile's alpha. */
typedef struct emu_rows {
  uint32_t rr[KVS__PF_WARPS][32][2], pos[KVS__PF_WARPS][32][2];
  float ml[KVS__PF_WARPS][32][2], ll[KVS__PF_WARPS][32][2];
  float al[KVS__PF_WARPS][32][2];
} emu_rows;

static void emu_rows_init(emu_rows *R, const kvs_attn_args *a, uint32_t s,
                          const kvs__pf_plan *p) {
  const uint32_t ratio = a->num_heads / a->kv.num_kv_heads;
  const uint32_t q_len = a->q_start[s + 1] - a->q_start[s];
  for (uint32_t w = 0; w < KVS__PF_WARPS; w++)
    for (uint32_t L = 0; L < 32; L++)
      for (uint32_t hl = 0; hl < 2; hl++) {
        R->rr[w][L][hl] = 16 * w + kvs__pf_acc_row(L, 2 * hl);
        R->pos[w][L][hl] =
            kvs__pf_row_pos(p, q_len, a->seq_lens[s], ratio, R->rr[w][L][hl]);
        R->ml[w][L][hl] = -INFINITY;
        R->ll[w][L][hl] = 0.f;
      }
}

/* The two shfl_xor steps (1, 2) of a quad: max or sum of each row's value. */
static void emu_quad(float v[32][2], int max) {
  for (uint32_t of = 1; of <= 2; of *= 2) {
    float t[32][2];
    memcpy(t, v, sizeof t);
    for (uint32_t L = 0; L < 32; L++)
      for (uint32_t hl = 0; hl < 2; hl++)
        v[L][hl] = max ? fmaxf(t[L][hl], t[L ^ of][hl]) : t[L][hl] + t[L ^ of][hl];
  }
}

/* Warp w's online softmax over key tile kt (its scores S, NT n-tiles):
 * scaled, masked, the tile's max over the quad, alpha, the weights in S,
 * the running sum. */
static void emu_softmax(float (*S)[32][4], uint32_t NT, uint32_t j0, int masked,
                        float scale2, emu_rows *R, uint32_t w) {
  float mt[32][2], mu[32][2];
  for (uint32_t L = 0; L < 32; L++) {
    mt[L][0] = mt[L][1] = -INFINITY;
    for (uint32_t n = 0; n < NT; n++)
      for (uint32_t e = 0; e < 4; e++) {
        uint32_t j = j0 + 8 * n + kvs__pf_acc_col(L, e);
        float x = S[n][L][e] * scale2;
        if (masked && !kvs__pf_visible(j, R->pos[w][L][e >> 1]))
          x = -INFINITY;
        S[n][L][e] = x;
        mt[L][e >> 1] = fmaxf(mt[L][e >> 1], x);
      }
  }
  emu_quad(mt, 1);
  for (uint32_t L = 0; L < 32; L++) {
    float sum[2] = {0.f, 0.f};
    for (uint32_t hl = 0; hl < 2; hl++) {
      float mn = fmaxf(R->ml[w][L][hl], mt[L][hl]);
      mu[L][hl] = mn == -INFINITY ? 0.f : mn;
      R->al[w][L][hl] = exp2f(R->ml[w][L][hl] - mu[L][hl]);
      R->ml[w][L][hl] = mn;
    }
    for (uint32_t n = 0; n < NT; n++) {
      for (uint32_t e = 0; e < 4; e++)
        S[n][L][e] = exp2f(S[n][L][e] - mu[L][e >> 1]);
      sum[0] += S[n][L][0] + S[n][L][1]; /* pairwise, as the kernel */
      sum[1] += S[n][L][2] + S[n][L][3];
    }
    for (uint32_t hl = 0; hl < 2; hl++)
      R->ll[w][L][hl] = R->ll[w][L][hl] * R->al[w][L][hl] + sum[hl];
  }
}

/* The epilogue's stores of warp w, O its final values: the rows' outputs
 * in the q/out dtype (4-byte pairs at column 8i + acc_col), or, with a
 * span, split z's partials to the workspace of gridDim.z = parts
 * partitions: lane t = 0 of a quad writes the row's max (natural-log
 * units) and sum, every lane its float pairs. */
static void emu_store(const kvs_attn_args *a, uint32_t s, uint32_t h,
                      const kvs__pf_plan *p, const emu_rows *R, uint32_t w,
                      float (*O)[32][4], uint32_t span, uint32_t z,
                      uint32_t parts) {
  const uint32_t D = a->kv.head_dim, DT = D / 8;
  const uint32_t ratio = a->num_heads / a->kv.num_kv_heads;
  const uint64_t cells = (uint64_t)a->num_rows * a->num_heads * parts;
  float *ws = a->workspace;
  for (uint32_t L = 0; L < 32; L++)
    for (uint32_t hl = 0; hl < 2; hl++) {
      uint32_t r = R->rr[w][L][hl];
      if (r >= p->rows)
        continue;
      uint64_t qrow = kvs__pf_qrow(a->q_start[s], p->row0 + r, ratio, a->num_heads, h);
      if (span) {
        if (!kvs__pf_split_writes(R->pos[w][L][hl], span, z))
          continue;
        uint64_t cell = qrow * parts + z;
        if (L % 4 == 0) {
          ws[cell] = R->ml[w][L][hl] * 0.693147180559945309f;
          ws[cells + cell] = R->ll[w][L][hl];
        }
        for (uint32_t i = 0; i < DT; i++)
          memcpy(ws + 2 * cells + cell * D + 8 * i + kvs__pf_acc_col(L, 0),
                 &O[i][L][2 * hl], 8);
        continue;
      }
      char *orow = (char *)a->out + qrow * D * 2;
      for (uint32_t i = 0; i < DT; i++) {
        uint32_t v = emu_pack(a->qo_dtype, O[i][L][2 * hl], O[i][L][2 * hl + 1]);
        memcpy(orow + (8 * i + kvs__pf_acc_col(L, 0)) * 2, &v, 4);
      }
    }
}

static void emu_cta(const kvs_attn_args *a, uint32_t h, uint32_t bx,
                    uint32_t span, uint32_t z, uint32_t parts, emu_smem *m,
                    int plant) {
  const kvs_paged_kv *kv = &a->kv;
  const uint32_t D = kv->head_dim, dt = kv->dtype, BM = KVS__PF_BM;
  const uint32_t BN = kvs__pf_bn(D), NT = BN / 8, DT = D / 8, KS = D / 16, CH = D / 8;
  const uint32_t ratio = a->num_heads / kv->num_kv_heads;
  uint32_t s, kt0, kt1;
  kvs__pf_plan p;
  if (!emu_cta_begin(a, h, bx, BN, span, z, m, &s, &p, &kt0, &kt1))
    return;
  const uint32_t q0 = a->q_start[s];
  const uint32_t sK = emu_wg ? (EMU_WG_S0 + 1023u) & ~1023u : BM * D * 2;
  const uint32_t sV = sK + BN * D * 2, sQ = emu_wg ? sV : 0;
  const uint8_t *bytes = (const uint8_t *)m->h;
  const uint32_t *bt = a->block_tables + (uint64_t)s * a->max_blocks_per_seq;
  const uint64_t head_off = (uint64_t)h * kv->head_stride * 2;
  for (uint32_t i = 0; i < BM * CH; i++) {
    uint32_t r = i / CH, c = i % CH, dst = sQ + kvs__pf_smem_off(D, r, c);
    if (r < p.rows) {
      uint32_t pr = p.row0 + r;
      uint64_t qrow = kvs__pf_qrow(q0, pr, ratio, a->num_heads, h);
      emu_cp_async(m, dst, (const char *)a->q + qrow * D * 2 + c * 16);
    } else {
      emu_zero16(m, dst);
    }
  }
  emu_load_kv(m, sK, a, bt, kv->k_offset + head_off, kt0 * BN, p.n_keys, BN);
  m->committed++;
  /* per warp, per lane registers */
  uint32_t (*qf)[32][4] = calloc((size_t)KVS__PF_WARPS * KS, sizeof *qf);
  uint32_t off[32], b[32][4], af[32][4];
  if (emu_wg) { /* Q's fragments into registers, then V over the Q tile */
    if (plant == EMU_PLANT_WGQ) {
      emu_load_kv(m, sV, a, bt, kv->v_offset + head_off, kt0 * BN, p.n_keys, BN);
      m->committed++;
    }
    emu_wait(m, 0);
    for (uint32_t w = 0; w < KVS__PF_WARPS; w++)
      for (uint32_t ks = 0; ks < KS; ks++) {
        for (uint32_t L = 0; L < 32; L++)
          off[L] = sQ + kvs__pf_smem_off(D, 16 * w + kvs__pf_ldq_row(L),
                                        kvs__pf_ldq_chunk(L, ks));
        emu_ldsm(m->h, off, 0, qf[w * KS + ks]);
      }
  }
  if (plant != EMU_PLANT_WGQ) {
    emu_load_kv(m, sV, a, bt, kv->v_offset + head_off, kt0 * BN, p.n_keys, BN);
    m->committed++;
  }

  const float scale2 = a->scale * 1.44269504088896341f;
  float (*o)[32][4] = calloc((size_t)KVS__PF_WARPS * DT, sizeof *o);
  float (*sc)[32][4] = calloc((size_t)KVS__PF_WARPS * NT, sizeof *sc);
  static emu_rows R;
  emu_rows_init(&R, a, s, &p);
  for (uint32_t kt = kt0; kt < kt1; kt++) {
    emu_wait(m, 1);
    for (uint32_t w = 0; w < KVS__PF_WARPS; w++) {
      float (*S)[32][4] = sc + w * NT;
      memset(S, 0, sizeof *sc * NT);
      for (uint32_t ks = 0; ks < KS && emu_wg; ks++)
        emu_wgmma_warp(S, BN, qf[w * KS + ks], bytes, kvs__pf_wg_desc_k(sK, BN, ks), 0);
      for (uint32_t ks = 0; ks < KS && !emu_wg; ks++) {
        if (kt == kt0 || D > 128) { /* QREG: read once; else every tile */
          for (uint32_t L = 0; L < 32; L++)
            off[L] = sQ + kvs__pf_smem_off(D, 16 * w + kvs__pf_ldq_row(L),
                                          kvs__pf_ldq_chunk(L, ks));
          emu_ldsm(m->h, off, 0, qf[w * KS + ks]);
        }
        for (uint32_t np = 0; np < NT / 2; np++) {
          for (uint32_t L = 0; L < 32; L++)
            off[L] = sK + kvs__pf_smem_off(D, kvs__pf_ldk_row(L, np),
                                          kvs__pf_ldk_chunk(L, ks));
          emu_ldsm(m->h, off, 0, b);
          emu_mma_x4(S[2 * np], S[2 * np + 1], qf[w * KS + ks], b);
        }
      }
    }
    if (kt + 1 < kt1)
      emu_load_kv(m, sK, a, bt, kv->k_offset + head_off, (kt + 1) * BN, p.n_keys, BN);
    m->committed++;
    const int masked = kvs__pf_tile_masked(&p, kt);
    for (uint32_t w = 0; w < KVS__PF_WARPS; w++) {
      emu_softmax(sc + w * NT, NT, kt * BN, masked, scale2, &R, w);
      for (uint32_t L = 0; L < 32; L++)
        for (uint32_t i = 0; i < DT; i++)
          for (uint32_t e = 0; e < 4; e++)
            o[w * DT + i][L][e] *= R.al[w][L][e >> 1];
    }
    emu_wait(m, plant == EMU_PLANT_WAIT ? 2 : 1);
    for (uint32_t w = 0; w < KVS__PF_WARPS; w++) {
      float (*S)[32][4] = sc + w * NT;
      for (uint32_t kk = 0; kk < BN / 16; kk++) {
        for (uint32_t L = 0; L < 32; L++)
          for (uint32_t i = 0; i < 4; i++) { /* a0..a3 */
            const float *x = S[2 * kk + i / 2][L] + 2 * (i % 2);
            af[L][i] = plant == EMU_PLANT_PACK ? emu_pack(dt, x[1], x[0])
                                               : emu_pack(dt, x[0], x[1]);
          }
        if (emu_wg)
          emu_wgmma_warp(o + w * DT, D, af, bytes, kvs__pf_wg_desc_v(sV, BN, kk), 1);
        for (uint32_t dp = 0; dp < DT / 2 && !emu_wg; dp++) {
          for (uint32_t L = 0; L < 32; L++)
            off[L] = sV + kvs__pf_smem_off(D, kvs__pf_ldv_row(L, kk),
                                          kvs__pf_ldv_chunk(L, dp));
          emu_ldsm(m->h, off, 1, b);
          emu_mma_x4(o[w * DT + 2 * dp], o[w * DT + 2 * dp + 1], af, b);
        }
      }
    }
    if (kt + 1 < kt1)
      emu_load_kv(m, sV, a, bt, kv->v_offset + head_off, (kt + 1) * BN, p.n_keys, BN);
    m->committed++;
  }
  emu_wait(m, 0);
  for (uint32_t w = 0; w < KVS__PF_WARPS; w++) {
    emu_quad(R.ll[w], 0);
    for (uint32_t L = 0; L < 32; L++)
      for (uint32_t e = 0; e < 4; e++) {
        float l = R.ll[w][L][e >> 1], inv = span ? 1.f : l > 0.f ? 1.f / l : 0.f;
        for (uint32_t i = 0; i < DT; i++)
          o[w * DT + i][L][e] *= inv;
      }
    emu_store(a, s, h, &p, &R, w, o + w * DT, span, z, parts);
  }
  free(o);
  free(sc);
  free(qf);
}

/*
 * The int8/fp8 kernel (KQ = 1, 2) the same way: the pieces each thread
 * fetches (pq_fetch) and converts into shared memory (pq_put: rows, chunks,
 * the swizzled stores, a value row's byte sum over its threads' shuffles),
 * the rotated q rows of each warp (lane elements, butterflies across
 * lanes, the sum, the two halves and where they are stored), the keys'
 * scales per accumulator column, the tile's unit, the weights' two fp16
 * halves as A fragments (the tensor cores take fp16 for P.V whatever the
 * q/out dtype), the offsets' share, and the output's rotation over the
 * quad's lanes.  Planted: a value row's mean from one thread's piece only;
 * the output's butterflies across lanes 4 and 8 apart (other rows) instead
 * of 1 and 2 (the quad).
 */
enum { EMU_PLANT_MEAN = 3, EMU_PLANT_ROT };

typedef struct emu_pq {
  uint8_t raw[KVS__PF_THREADS][2][16];
  float scl[KVS__PF_THREADS][2][2];
} emu_pq;

static void emu_pq_fetch(emu_pq *r, const kvs_attn_args *a, const uint32_t *bt,
                         uint64_t plane, uint32_t h, uint32_t j0, uint32_t n_keys) {
  const kvs_paged_kv *kv = &a->kv;
  const uint32_t D = kv->head_dim, CH = D / 16, N = KVS__PF_BN_Q * CH / KVS__PF_THREADS;
  const uint32_t nf = kvs_scale_floats(kv->dtype);
  for (uint32_t tid = 0; tid < KVS__PF_THREADS; tid++)
    for (uint32_t k = 0; k < N; k++) {
      uint32_t i = k * KVS__PF_THREADS + tid, row = i / CH, c = i % CH, j = j0 + row;
      memset(r->raw[tid][k], 0, 16);
      r->scl[tid][k][0] = r->scl[tid][k][1] = 0.f;
      if (j >= n_keys)
        continue;
      const char *pl = (const char *)kv->base +
                       (uint64_t)bt[j / kv->block_size] * kv->block_stride + plane;
      uint32_t bo = j % kv->block_size;
      memcpy(r->raw[tid][k], pl + (uint64_t)bo * kv->token_stride +
                                 (uint64_t)h * kv->head_stride + c * 16, 16);
      if (c == 0)
        memcpy(r->scl[tid][k], pl + kv->scale_offset +
                                   ((uint64_t)bo * kv->num_kv_heads + h) * nf * 4,
               nf * 4);
    }
}

static void emu_st32(emu_smem *m, uint32_t byte_off, uint32_t v) {
  memcpy(m->h + byte_off / 2, &v, 4);
}

static void emu_pq_put(emu_smem *m, uint32_t tile, float *scale, float *offset,
                       const emu_pq *r, const kvs_attn_args *a, uint32_t sdt,
                       int value, uint32_t j0, uint32_t n_keys, int plant) {
  const uint32_t D = a->kv.head_dim, CH = D / 16, N = KVS__PF_BN_Q * CH / KVS__PF_THREADS;
  const int q8 = a->kv.dtype == KVS_DTYPE_INT8;
  for (uint32_t k = 0; k < N; k++) {
    uint32_t sum[KVS__PF_THREADS], t[KVS__PF_THREADS];
    for (uint32_t tid = 0; tid < KVS__PF_THREADS; tid++) {
      sum[tid] = 0;
      for (uint32_t b = 0; b < 16; b++)
        sum[tid] += r->raw[tid][k][b];
    }
    for (uint32_t o = 1; o < CH && plant != EMU_PLANT_MEAN; o *= 2) {
      memcpy(t, sum, sizeof t);
      for (uint32_t tid = 0; tid < KVS__PF_THREADS; tid++)
        sum[tid] = t[tid] + t[tid ^ o];
    }
    for (uint32_t tid = 0; tid < KVS__PF_THREADS; tid++) {
      uint32_t i = k * KVS__PF_THREADS + tid, row = i / CH, c = i % CH;
      uint32_t mid = q8 && value ? (sum[tid] + D / 2) / D : 128;
      int live = j0 + row < n_keys;
      uint32_t u[8];
      for (uint32_t e = 0; e < 8; e++) {
        float f[2];
        for (uint32_t z = 0; z < 2; z++) {
          uint8_t byte = r->raw[tid][k][2 * e + z];
          f[z] = q8 ? (float)byte - (float)mid : kvs_fp8_to_float(byte);
        }
        u[e] = live ? emu_pack(sdt, f[0], f[1]) : 0u;
      }
      for (uint32_t e = 0; e < 8; e++)
        emu_st32(m, tile + kvs__pf_smem_off(D, row, 2 * c + e / 4) + 4 * (e % 4), u[e]);
      if (c == 0) {
        scale[row] = live ? r->scl[tid][k][0] : 0.f;
        offset[row] = !live || !q8 ? 0.f : r->scl[tid][k][1] + (float)mid * r->scl[tid][k][0];
      }
    }
  }
}

/* pq_q_rows: warp w's 16 rows, pass 0 (hi, and the sums) or 1 (lo). */
static void emu_pq_q_rows(emu_smem *m, float *qsum, const kvs_attn_args *a,
                          const kvs__pf_plan *p, uint32_t q0, uint32_t ratio,
                          uint32_t h, uint32_t w, int pass) {
  const uint32_t D = a->kv.head_dim, E = D / 32, qt = a->qo_dtype;
  for (uint32_t rr = 0; rr < 16; rr++) {
    uint32_t r = 16 * w + rr;
    float x[32][4], y[32][4];
    for (uint32_t L = 0; L < 32; L++)
      for (uint32_t k = 0; k < E; k++) {
        x[L][k] = 0.f;
        if (r < p->rows) {
          uint64_t qrow = kvs__pf_qrow(q0, p->row0 + r, ratio, a->num_heads, h);
          uint16_t b;
          memcpy(&b, (const char *)a->q + (qrow * D + E * L + k) * 2, 2);
          x[L][k] = qt == KVS_DTYPE_BF16 ? kvs_bf16_to_float(b) : kvs_fp16_to_float(b);
        }
      }
    if (r < p->rows)
      for (uint32_t hh = 1; hh < D; hh *= 2) {
        memcpy(y, x, sizeof y);
        for (uint32_t L = 0; L < 32; L++)
          for (uint32_t k = 0; k < E; k++) {
            if (hh < E) {
              if (!(k & hh)) {
                x[L][k] = y[L][k] + y[L][k + hh];
                x[L][k + hh] = y[L][k] - y[L][k + hh];
              }
            } else {
              float o = y[L ^ (hh / E)][k];
              x[L][k] = (E * L) & hh ? o - y[L][k] : y[L][k] + o;
            }
          }
      }
    if (pass == 0) {
      float sm[32], t[32];
      for (uint32_t L = 0; L < 32; L++) {
        sm[L] = 0.f;
        for (uint32_t k = 0; k < E; k++)
          sm[L] += x[L][k];
      }
      for (uint32_t o = 16; o >= 1; o /= 2) {
        memcpy(t, sm, sizeof t);
        for (uint32_t L = 0; L < 32; L++)
          sm[L] = t[L] + t[L ^ o];
      }
      qsum[r] = sm[0];
    }
    for (uint32_t L = 0; L < 32; L++)
      for (uint32_t k = 0; k < E; k += 2) {
        float h0 = round_to(qt, x[L][k]), h1 = round_to(qt, x[L][k + 1]);
        uint32_t v = pass == 0 ? emu_pack(qt, h0, h1)
                               : emu_pack(qt, x[L][k] - h0, x[L][k + 1] - h1);
        emu_st32(m, kvs__pf_smem_off(D, r, E * L / 8) + (E * L % 8) * 2 + 2 * k, v);
      }
  }
}

static float emu_unit(float vmax) {
  uint32_t b;
  memcpy(&b, &vmax, 4);
  int e = (int)((b >> 23) & 0xffu);
  if (!(vmax > 0.f) || e == 255)
    return 1.f;
  e = 126 - e;
  e = e < -60 ? -60 : e > 60 ? 60 : e;
  return ldexpf(1.f, e);
}

static void emu_cta_q(const kvs_attn_args *a, uint32_t h, uint32_t bx,
                      uint32_t span, uint32_t z, uint32_t parts, emu_smem *m,
                      int plant) {
  const kvs_paged_kv *kv = &a->kv;
  const uint32_t D = kv->head_dim, qt = a->qo_dtype, BM = KVS__PF_BM;
  const int q8 = kv->dtype == KVS_DTYPE_INT8;
  const uint32_t BN = KVS__PF_BN_Q, NT = BN / 8, DT = D / 8, KS = D / 16, CH = D / 8;
  const uint32_t ratio = a->num_heads / kv->num_kv_heads;
  uint32_t s, kt0, kt1;
  kvs__pf_plan p;
  if (!emu_cta_begin(a, h, bx, BN, span, z, m, &s, &p, &kt0, &kt1))
    return;
  const uint32_t q0 = a->q_start[s];
  const uint32_t sQ = 0, sK = BM * D * 2, sV = sK + BN * D * 2;
  float kscl[KVS__PF_BN_Q], koff[KVS__PF_BN_Q], vscl[KVS__PF_BN_Q],
      voff[KVS__PF_BN_Q], qsum[KVS__PF_BM];
  for (uint32_t i = 0; i < BN; i++) /* NaN until written */
    kscl[i] = koff[i] = vscl[i] = voff[i] = NAN;
  for (uint32_t i = 0; i < BM; i++)
    qsum[i] = NAN;
  const uint32_t *bt = a->block_tables + (uint64_t)s * a->max_blocks_per_seq;
  uint32_t (*qf)[32][4] = calloc((size_t)KVS__PF_WARPS * KS, sizeof *qf);
  uint32_t off[32], b[32][4], af[32][4], al[32][4];
  if (q8) {
    for (uint32_t w = 0; w < KVS__PF_WARPS; w++) {
      emu_pq_q_rows(m, qsum, a, &p, q0, ratio, h, w, 0);
      emu_bf16 = qt == KVS_DTYPE_BF16;
      for (uint32_t ks = 0; ks < KS; ks++) {
        for (uint32_t L = 0; L < 32; L++)
          off[L] = sQ + kvs__pf_smem_off(D, 16 * w + kvs__pf_ldq_row(L),
                                        kvs__pf_ldq_chunk(L, ks));
        emu_ldsm(m->h, off, 0, qf[w * KS + ks]);
      }
      emu_pq_q_rows(m, qsum, a, &p, q0, ratio, h, w, 1);
    }
  } else {
    for (uint32_t i = 0; i < BM * CH; i++) {
      uint32_t r = i / CH, c = i % CH, dst = sQ + kvs__pf_smem_off(D, r, c);
      if (r < p.rows) {
        uint64_t qrow = kvs__pf_qrow(q0, p.row0 + r, ratio, a->num_heads, h);
        emu_cp_async(m, dst, (const char *)a->q + qrow * D * 2 + c * 16);
      } else {
        emu_zero16(m, dst);
      }
    }
  }
  m->committed++;
  static emu_pq kreg, vreg;
  emu_pq_fetch(&kreg, a, bt, kv->k_offset, h, kt0 * BN, p.n_keys);
  emu_pq_fetch(&vreg, a, bt, kv->v_offset, h, kt0 * BN, p.n_keys);

  const float scale2 = a->scale * 1.44269504088896341f;
  float (*o)[32][4] = calloc((size_t)KVS__PF_WARPS * DT, sizeof *o);
  float (*sc)[32][4] = calloc((size_t)KVS__PF_WARPS * NT, sizeof *sc);
  float wl[KVS__PF_WARPS][32][2], ma[KVS__PF_WARPS][32][2], un[KVS__PF_WARPS][32][2];
  static emu_rows R;
  emu_rows_init(&R, a, s, &p);
  memset(wl, 0, sizeof wl);
  memset(ma, 0, sizeof ma);
  for (uint32_t w = 0; w < KVS__PF_WARPS; w++)
    for (uint32_t L = 0; L < 32; L++)
      un[w][L][0] = un[w][L][1] = 1.f;
  for (uint32_t kt = kt0; kt < kt1; kt++) {
    emu_pq_put(m, sK, kscl, koff, &kreg, a, qt, 0, kt * BN, p.n_keys, plant);
    if (kt == kt0)
      emu_wait(m, 0);
    emu_bf16 = qt == KVS_DTYPE_BF16; /* Q.K^T in the q/out dtype */
    for (uint32_t w = 0; w < KVS__PF_WARPS; w++) {
      float (*S)[32][4] = sc + w * NT;
      memset(S, 0, sizeof *sc * NT);
      for (uint32_t ks = 0; ks < KS; ks++) {
        /* int8: the low halves every tile; fp8: Q once (QREG) */
        for (uint32_t L = 0; L < 32; L++)
          off[L] = sQ + kvs__pf_smem_off(D, 16 * w + kvs__pf_ldq_row(L),
                                        kvs__pf_ldq_chunk(L, ks));
        if (q8 || kt == kt0)
          emu_ldsm(m->h, off, 0, q8 ? al : qf[w * KS + ks]);
        for (uint32_t np = 0; np < NT / 2; np++) {
          for (uint32_t L = 0; L < 32; L++)
            off[L] = sK + kvs__pf_smem_off(D, kvs__pf_ldk_row(L, np),
                                          kvs__pf_ldk_chunk(L, ks));
          emu_ldsm(m->h, off, 0, b);
          emu_mma_x4(S[2 * np], S[2 * np + 1], qf[w * KS + ks], b);
          if (q8)
            emu_mma_x4(S[2 * np], S[2 * np + 1], al, b);
        }
      }
    }
    if (kt + 1 < kt1)
      emu_pq_fetch(&kreg, a, bt, kv->k_offset, h, (kt + 1) * BN, p.n_keys);
    const int masked = kvs__pf_tile_masked(&p, kt);
    for (uint32_t w = 0; w < KVS__PF_WARPS; w++) {
      float (*S)[32][4] = sc + w * NT;
      for (uint32_t L = 0; L < 32; L++) /* the key's scale and offset */
        for (uint32_t n = 0; n < NT; n++)
          for (uint32_t e = 0; e < 4; e++) {
            uint32_t col = 8 * n + kvs__pf_acc_col(L, e);
            S[n][L][e] = kscl[col] * S[n][L][e] +
                         koff[col] * (q8 ? qsum[R.rr[w][L][e >> 1]] : 0.f);
          }
      emu_softmax(S, NT, kt * BN, masked, scale2, &R, w);
    }
    emu_pq_put(m, sV, vscl, voff, &vreg, a, KVS_DTYPE_FP16, 1, kt * BN, p.n_keys, plant);
    emu_bf16 = 0; /* P.V in fp16 */
    for (uint32_t w = 0; w < KVS__PF_WARPS; w++) {
      float (*S)[32][4] = sc + w * NT, mx[32][2], ws[32][2];
      for (uint32_t L = 0; L < 32; L++) {
        ws[L][0] = ws[L][1] = mx[L][0] = mx[L][1] = 0.f;
        for (uint32_t n = 0; n < NT; n++)
          for (uint32_t e = 0; e < 4; e++) {
            uint32_t col = 8 * n + kvs__pf_acc_col(L, e);
            float pw = S[n][L][e];
            float x = pw == 0.f ? 0.f : pw * vscl[col];
            float y = pw == 0.f ? 0.f : pw * voff[col];
            S[n][L][e] = x;
            ws[L][e >> 1] += y;
            mx[L][e >> 1] = fmaxf(mx[L][e >> 1], x);
          }
      }
      emu_quad(mx, 1);
      for (uint32_t L = 0; L < 32; L++) {
        float nu[2], rs[2];
        for (uint32_t hl = 0; hl < 2; hl++) {
          ma[w][L][hl] = fmaxf(ma[w][L][hl] * R.al[w][L][hl], mx[L][hl]);
          nu[hl] = emu_unit(ma[w][L][hl]);
          rs[hl] = R.al[w][L][hl] * (nu[hl] / un[w][L][hl]);
          un[w][L][hl] = nu[hl];
        }
        for (uint32_t i = 0; i < DT; i++)
          for (uint32_t e = 0; e < 4; e++)
            o[w * DT + i][L][e] *= rs[e >> 1];
        for (uint32_t n = 0; n < NT; n++)
          for (uint32_t e = 0; e < 4; e++)
            S[n][L][e] *= nu[e >> 1];
        for (uint32_t hl = 0; hl < 2; hl++)
          wl[w][L][hl] = wl[w][L][hl] * R.al[w][L][hl] + ws[L][hl];
      }
      for (uint32_t kk = 0; kk < BN / 16; kk++) {
        for (uint32_t L = 0; L < 32; L++)
          for (uint32_t i = 0; i < 4; i++) {
            const float *x = S[2 * kk + i / 2][L] + 2 * (i % 2);
            float h0 = round_to(KVS_DTYPE_FP16, x[0]), h1 = round_to(KVS_DTYPE_FP16, x[1]);
            af[L][i] = pack_h(h0, h1);
            al[L][i] = pack_h(x[0] - h0, x[1] - h1);
          }
        for (uint32_t dp = 0; dp < DT / 2; dp++) {
          for (uint32_t L = 0; L < 32; L++)
            off[L] = sV + kvs__pf_smem_off(D, kvs__pf_ldv_row(L, kk),
                                          kvs__pf_ldv_chunk(L, dp));
          emu_ldsm(m->h, off, 1, b);
          emu_mma_x4(o[w * DT + 2 * dp], o[w * DT + 2 * dp + 1], af, b);
          emu_mma_x4(o[w * DT + 2 * dp], o[w * DT + 2 * dp + 1], al, b);
        }
      }
    }
    if (kt + 1 < kt1)
      emu_pq_fetch(&vreg, a, bt, kv->v_offset, h, (kt + 1) * BN, p.n_keys);
  }
  for (uint32_t w = 0; w < KVS__PF_WARPS; w++) {
    emu_quad(R.ll[w], 0);
    emu_quad(wl[w], 0);
    float (*O)[32][4] = o + w * DT;
    for (uint32_t L = 0; L < 32; L++)
      for (uint32_t i = 0; i < DT; i++)
        for (uint32_t e = 0; e < 4; e++) {
          float l = R.ll[w][L][e >> 1], inv = span ? 1.f : l > 0.f ? 1.f / l : 0.f;
          O[i][L][e] = (O[i][L][e] * (1.f / un[w][L][e >> 1]) + wl[w][L][e >> 1]) * inv;
        }
    if (q8) {
      for (uint32_t L = 0; L < 32; L++)
        for (uint32_t i = 0; i < DT; i++)
          for (uint32_t e = 0; e < 4; e += 2) {
            float x0 = O[i][L][e], x1 = O[i][L][e + 1];
            O[i][L][e] = x0 + x1;
            O[i][L][e + 1] = x0 - x1;
          }
      for (uint32_t of = 1; of <= 2; of *= 2) {
        uint32_t lanes = plant == EMU_PLANT_ROT ? 4 * of : of;
        for (uint32_t i = 0; i < DT; i++) {
          float t[32][4];
          for (uint32_t L = 0; L < 32; L++)
            memcpy(t[L], O[i][L], sizeof t[L]);
          for (uint32_t L = 0; L < 32; L++)
            for (uint32_t e = 0; e < 4; e++)
              O[i][L][e] = L & lanes ? t[L ^ lanes][e] - t[L][e] : t[L][e] + t[L ^ lanes][e];
        }
      }
      for (uint32_t hi = 1; hi < DT; hi *= 2)
        for (uint32_t i = 0; i < DT; i++)
          if (!(i & hi))
            for (uint32_t L = 0; L < 32; L++)
              for (uint32_t e = 0; e < 4; e++) {
                float x0 = O[i][L][e], x1 = O[i + hi][L][e];
                O[i][L][e] = x0 + x1;
                O[i + hi][L][e] = x0 - x1;
              }
    }
    emu_store(a, s, h, &p, &R, w, O, span, z, parts);
  }
  emu_bf16 = 0;
  free(o);
  free(sc);
  free(qf);
}

/* The emulated kernel (emulate) or the model over a whole grid, split over
 * spans of `span` keys (0: not split) and merged, against the twin and the
 * naive reference: excess over the twin's tolerance (*nsplit: the splits). */
static double grid_case(const tg_params *pp, const tg_ragged *bt, uint32_t span,
                        int emulate, int plant, double *e_ref, uint32_t *nsplit) {
  uint32_t lens[8];
  tg_case c;
  if (tg_ragged_case(&c, pp, bt, lens)) {
    CHECK(0, "case refused");
    return 1e9;
  }
  tg_params p = c.p;
  size_t n = (size_t)c.num_rows * c.num_heads * p.head_dim;
  void *twin = tg_xmalloc(n * 2), *got = tg_xmalloc(n * 2);
  double *ref = tg_xmalloc(sizeof(double) * (n ? n : 1));
  memset(got, 0xff, n * 2); /* NaN: every row must be written */
  kvs_attn_args a;
  tg_case_args(&c, &a, c.pool, twin, c.q, c.seq_lens, c.q_start, c.tables);
  CHECK(kvs_cpu_prefill_attention(&a, NULL) == 0, "twin");
  tg_naive(&c, ref);
  a.out = got;
  uint32_t parts = span ? (a.max_seq_len + span - 1) / span : 1;
  if (span) { /* the workspace NaN: a partial read but never written shows */
    a.workspace_bytes = kvs_attn_workspace_bytes(&a);
    a.workspace = tg_xmalloc(a.workspace_bytes);
    memset(a.workspace, 0xff, a.workspace_bytes);
  }
  emu_smem m = {tg_xmalloc(emu_smem_bytes(p.dtype, p.head_dim)), NULL, 0, 0, 0};
  emu_smem_size = emu_smem_bytes(p.dtype, p.head_dim);
  emu_bad_desc = 0;
  emu_bf16 = p.dtype == KVS_DTYPE_BF16;
  uint64_t gx = kvs__pf_grid_x(a.num_rows, a.num_seqs, p.ratio);
  for (uint32_t z = 0; z < parts && emulate; z++)
    for (uint32_t h = 0; h < p.num_kv_heads; h++)
      for (uint32_t bx = 0; bx < gx; bx++) {
        if (kvs_dtype_quantized(p.dtype))
          emu_cta_q(&a, h, bx, span, z, parts, &m, plant);
        else
          emu_cta(&a, h, bx, span, z, parts, &m, plant);
      }
  emu_bf16 = 0;
  CHECK(emu_bad_desc == 0, "%d wgmma operand reads outside shared memory", emu_bad_desc);
  if (!emulate)
    CHECK(kvs__flash_model(&a, (uint32_t)gx, p.num_kv_heads, parts, span, plant) == 0,
          "model");
  *nsplit = parts;
  if (span)
    kvs__flash_model_merge(&a, parts, span);
  free(a.workspace);
  double x = tg_twin_excess(got, twin, p.qo_dtype, n);
  *e_ref = tg_max_err(got, p.qo_dtype, ref, n);
  free(m.h);
  free(m.cp);
  free(twin);
  free(got);
  free(ref);
  tg_case_free(&c);
  return x;
}

/* ---- 2b. splits over long prefixes ----------------------------------------- */

/*
 * The model split over its keys (spans of 256 and 512: grid.z splits, each
 * writing its rows' partials to the workspace) and merged as the merge
 * kernel does, against the twin: long prefixes, a request shorter than one
 * span among long ones, chunk 1, q_len 0; every cache dtype the kernel
 * takes.  The workspace starts as NaN (a partial the merge reads but no
 * split wrote would show), and so does the output.  A planted fault (a
 * split that skips its last key tile) must be caught.
 */
static const tg_ragged split_batches[] = {
    {4, {1300, 0, 700, 100}, {40, 300, 1, 0}},
    {3, {2000, 511, 0}, {64, 2, 9}},
};

static void test_split(void) {
  static const uint32_t dts[][2] = {{KVS_DTYPE_FP16, KVS_DTYPE_FP16},
                                    {KVS_DTYPE_BF16, KVS_DTYPE_BF16},
                                    {KVS_DTYPE_INT8, KVS_DTYPE_FP16},
                                    {KVS_DTYPE_FP8, KVS_DTYPE_BF16}};
  int k = 0;
  for (int i = 0; i < 4; i++)
    for (uint32_t span = KVS_ASAN ? 512 : 256; span <= 512; span *= 2)
      for (int ib = KVS_ASAN; ib < 2; ib++, k++) { /* ASan: the smaller */
        tg_params p = {.block_size = k % 2 ? 32 : 16, .num_kv_heads = 2,
                       .head_dim = k % 3 ? 64 : 128, .ratio = (k >> 1) % 2 ? 4 : 1,
                       .dtype = dts[i][0], .qo_dtype = dts[i][1], .num_layers = 1,
                       .spare_blocks = 2, .q_scale = k % 2 ? 4.f : 1.f,
                       .seed = 17000 + (uint64_t)k};
        if (KVS_ASAN && p.head_dim == 128)
          p.head_dim = 64; /* time: the plain build runs D 128 */
        double e;
        uint32_t ns;
        double x = grid_case(&p, &split_batches[ib], span, 0, KVS__FLASH_PLANT_NONE, &e, &ns);
        int ok = x <= 1.0 && e <= tg_tol(p.qo_dtype);
        printf("%s split %s/%s D=%-3u ratio=%u span %u (%u splits) batch %d: vs twin "
               "%.2f of the tolerance, vs naive %.2e\n",
               ok ? "ok  " : "FAIL", kvs_dtype_name(p.dtype), kvs_dtype_name(p.qo_dtype),
               p.head_dim, p.ratio, span, ns, ib, x, e);
        failures += !ok;
      }
  /* head dim 256 (16-key tiles), the 16-bit caches only (int8/fp8 flash
   * takes 64 and 128): the plain build, for time */
  for (int i = 0; i < 2 && !KVS_ASAN; i++, k++) {
    tg_params p = {.block_size = 16, .num_kv_heads = 2, .head_dim = 256,
                   .ratio = i ? 1 : 4, .dtype = dts[i][0], .qo_dtype = dts[i][1],
                   .num_layers = 1, .spare_blocks = 2, .q_scale = 2.f,
                   .seed = 17000 + (uint64_t)k};
    double e;
    uint32_t ns;
    double x = grid_case(&p, &split_batches[1], 256, 0, KVS__FLASH_PLANT_NONE, &e, &ns);
    int ok = x <= 1.0 && e <= tg_tol(p.qo_dtype) && ns > 1;
    printf("%s split %s/%s D=%-3u ratio=%u span 256 (%u splits) batch 1: vs twin "
           "%.2f of the tolerance, vs naive %.2e\n",
           ok ? "ok  " : "FAIL", kvs_dtype_name(p.dtype), kvs_dtype_name(p.qo_dtype),
           p.head_dim, p.ratio, ns, x, e);
    failures += !ok;
  }
  tg_params p = plant_params(9400);
  double e;
  uint32_t ns;
  report_plant("planted fault", "a split that stops one key tile short",
               grid_case(&p, &split_batches[0], 256, 0, KVS__FLASH_PLANT_SPLIT, &e, &ns));
}

/* Smaller batches than the model's (the emulation is slow under ASan):
 * prefix 0 and off the tile, chunk 1, q_len 0 with and without keys, more
 * than one query and key tile. */
static const tg_ragged emu_batches[] = {
    {6, {0, 100, 37, 0, 9, 64}, {70, 1, 40, 0, 0, 3}},
    {3, {129, 0, 5}, {31, 90, 1}},
};

static void test_emulated_kernel(void) {
  uint32_t ns;
  /* GQA groups that straddle tiles (3, 6), a block size not a power of 2 */
  static const uint32_t dims[] = {64, 128, 256}, ratios[] = {1, 8, 3, 6, 4, 2};
  static const uint32_t bss[] = {16, 32, 24};
  int k = 0;
  for (uint32_t dt = KVS_DTYPE_FP16; dt <= KVS_DTYPE_BF16; dt++)
    for (int id = 0; id < 3; id++, k++) {
      tg_params p = {.block_size = bss[k % 3], .num_kv_heads = 2,
                     .head_dim = dims[id], .ratio = ratios[k], .dtype = dt,
                     .qo_dtype = dt, .num_layers = 2, .layer = (uint32_t)k % 2,
                     .spare_blocks = 3, .q_scale = k % 2 ? 4.f : 1.f,
                     .seed = 15000 + (uint64_t)k};
      double e, x = grid_case(&p, &emu_batches[k % 2], 0, 1, EMU_PLANT_NONE, &e, &ns);
      report_case("emulated kernel", &p, k % 2, x, e);
    }
  /* int8/fp8 caches: both q/out dtypes, head_dim 64 and 128 */
  for (uint32_t dt = KVS_DTYPE_INT8; dt <= KVS_DTYPE_FP8; dt++)
    for (uint32_t qo = KVS_DTYPE_FP16; qo <= KVS_DTYPE_BF16; qo++)
      for (int id = 0; id < 2; id++, k++) {
        tg_params p = {.block_size = bss[k % 3], .num_kv_heads = 2,
                       .head_dim = dims[id], .ratio = ratios[k % 6], .dtype = dt,
                       .qo_dtype = qo, .num_layers = 2, .layer = (uint32_t)k % 2,
                       .spare_blocks = 3, .q_scale = k % 2 ? 4.f : 1.f,
                       .seed = 15000 + (uint64_t)k};
        double e, x = grid_case(&p, &emu_batches[k % 2], 0, 1, EMU_PLANT_NONE, &e, &ns);
        report_case(qo == KVS_DTYPE_FP16 ? "emulated kernel q/out fp16"
                                         : "emulated kernel q/out bf16",
                    &p, k % 2, x, e);
      }
  static const struct {
    int plant;
    uint32_t dt;
    const char *what;
  } plants[] = {{EMU_PLANT_WAIT, KVS_DTYPE_FP16, "V read one commit group early"},
                {EMU_PLANT_PACK, KVS_DTYPE_FP16, "P packed high half first"},
                {EMU_PLANT_MEAN, KVS_DTYPE_INT8,
                 "int8: a value row's mean from one thread's piece"},
                {EMU_PLANT_ROT, KVS_DTYPE_INT8,
                 "int8: the output's butterflies across rows, not the quad"}};
  for (int i = 0; i < 4; i++) {
    tg_params p = plant_params(9300 + (uint64_t)i);
    p.dtype = plants[i].dt;
    double e, x = grid_case(&p, &emu_batches[0], 0, 1, plants[i].plant, &e, &ns);
    report_plant("planted fault in the emulated kernel", plants[i].what, x);
  }
  /* split over long prefixes: each split's partials written lane by lane
   * as the kernel's epilogue does, then merged */
  /* request 1's rows at positions 200..299: split 1 (keys 256..511)
   * stores only those from 255 on */
  static const tg_ragged long_batch = {3, {700, 200, 300}, {40, 100, 1}};
  static const uint32_t split_dt[][2] = {{KVS_DTYPE_FP16, KVS_DTYPE_FP16},
                                         {KVS_DTYPE_INT8, KVS_DTYPE_BF16},
                                         {KVS_DTYPE_FP8, KVS_DTYPE_FP16}};
  for (int i = 0; i < 3; i++) {
    tg_params p = {.block_size = 16, .num_kv_heads = 2, .head_dim = 64,
                   .ratio = i == 1 ? 1 : 4, .dtype = split_dt[i][0],
                   .qo_dtype = split_dt[i][1], .num_layers = 1, .spare_blocks = 2,
                   .q_scale = 2.f, .seed = 16000 + (uint64_t)i};
    double e, x = grid_case(&p, &long_batch, 256, 1, EMU_PLANT_NONE, &e, &ns);
    report_case("emulated kernel, split over spans of 256", &p, 0, x, e);
  }
  /* the wgmma variant's body (16-bit caches, D 64/128; only 128 is built,
   * docs/kernels.md), split or not */
  emu_wg = 1;
  for (int i = 0; i < 5; i++, k++) {
    tg_params p = {.block_size = bss[k % 3], .num_kv_heads = 2,
                   .head_dim = i % 2 ? 64 : 128, .ratio = ratios[k % 6],
                   .dtype = i % 3 == 1 ? KVS_DTYPE_BF16 : KVS_DTYPE_FP16,
                   .num_layers = 2, .layer = (uint32_t)k % 2, .spare_blocks = 3,
                   .q_scale = k % 2 ? 4.f : 1.f, .seed = 15000 + (uint64_t)k};
    p.qo_dtype = p.dtype;
    double e, x = i == 4 ? grid_case(&p, &long_batch, 256, 1, EMU_PLANT_NONE, &e, &ns)
                         : grid_case(&p, &emu_batches[i % 2], 0, 1, EMU_PLANT_NONE, &e, &ns);
    report_case(i == 4 ? "emulated wgmma kernel, split over spans of 256"
                       : "emulated wgmma kernel",
                &p, i == 4 ? 0 : i % 2, x, e);
  }
  static const struct {
    int plant;
    const char *what;
  } wg_plants[] = {{EMU_PLANT_WGQ, "wgmma: V's first copy issued before Q is read"},
                   {EMU_PLANT_WAIT, "wgmma: V read one commit group early"},
                   {EMU_PLANT_PACK, "wgmma: P packed high half first"}};
  for (int i = 0; i < 3; i++) {
    tg_params p = plant_params(9400 + (uint64_t)i);
    double e, x = grid_case(&p, &emu_batches[0], 0, 1, wg_plants[i].plant, &e, &ns);
    report_plant("planted fault in the emulated kernel", wg_plants[i].what, x);
  }
  emu_wg = 0;
}

/* ---- 3d. value scales the rows do not all see ------------------------------ */

/*
 * Review findings, kept as tests: (1) a value row whose scales are NaN (a
 * row that overflowed when written) must turn NaN only the rows that see
 * it, as in the twin, not the earlier rows of its tile, whose weight for it
 * is 0; (2) a value scale 2^20 times the others at a key the earlier rows
 * do not see must not cost those rows their precision (a unit per tile
 * from its largest scale made their products subnormal).  Request 0's new
 * rows are at positions 100..163; key 150's value scales (kv head 0) are
 * changed in the pool after it is written.  The model and the emulated
 * kernel against the twin, NaN where and only where the twin has NaN.
 */
static void poke_vscale(const kvs_attn_args *a, uint32_t s, uint32_t j,
                        uint32_t h, int nan, float factor) {
  const kvs_paged_kv *kv = &a->kv;
  uint32_t blk = a->block_tables[(uint64_t)s * a->max_blocks_per_seq + j / kv->block_size];
  float *f = (float *)((char *)kv->base + (uint64_t)blk * kv->block_stride +
                       kv->v_offset + kv->scale_offset +
                       ((uint64_t)(j % kv->block_size) * kv->num_kv_heads + h) *
                           kvs_scale_floats(kv->dtype) * 4);
  for (uint32_t i = 0; i < kvs_scale_floats(kv->dtype); i++)
    f[i] = nan ? NAN : f[i] * factor;
}

/* max excess over the twin's tolerance where both are numbers; 1e30 when
 * NaN sits in one and not the other */
static double nan_aware_excess(const void *got, const void *twin, uint32_t dt,
                               size_t n, size_t *nans) {
  double worst = 0;
  *nans = 0;
  for (size_t i = 0; i < n; i++) {
    float g, t;
    kvs_convert(&g, KVS_DTYPE_FP32, (const char *)got + 2 * i, dt, 1);
    kvs_convert(&t, KVS_DTYPE_FP32, (const char *)twin + 2 * i, dt, 1);
    if (isnan(g) || isnan(t)) {
      if (isnan(g) != isnan(t))
        return 1e30;
      ++*nans;
      continue;
    }
    double x = fabs((double)g - t) / tg_twin_tol(dt, t);
    worst = x > worst ? x : worst;
  }
  return worst;
}

static void test_scales(void) {
  static const tg_ragged bt = {2, {100, 30}, {64, 40}};
  static const uint32_t dts[][2] = {{KVS_DTYPE_INT8, KVS_DTYPE_FP16},
                                    {KVS_DTYPE_FP8, KVS_DTYPE_BF16}};
  for (int i = 0; i < 2; i++)
    for (int what = 0; what < 2; what++) {
      tg_params pp = {.block_size = 16, .num_kv_heads = 2, .head_dim = 64,
                      .ratio = 2, .dtype = dts[i][0], .qo_dtype = dts[i][1],
                      .num_layers = 1, .spare_blocks = 2, .q_scale = 1.f,
                      .seed = 18000 + (uint64_t)(2 * i + what)};
      uint32_t lens[8];
      tg_case c;
      if (tg_ragged_case(&c, &pp, &bt, lens)) {
        CHECK(0, "case refused");
        return;
      }
      tg_params p = c.p;
      size_t n = (size_t)c.num_rows * c.num_heads * p.head_dim;
      void *twin = tg_xmalloc(n * 2), *got = tg_xmalloc(n * 2);
      kvs_attn_args a;
      tg_case_args(&c, &a, c.pool, twin, c.q, c.seq_lens, c.q_start, c.tables);
      poke_vscale(&a, 0, 150, 0, what == 0, 1048576.f);
      CHECK(kvs_cpu_prefill_attention(&a, NULL) == 0, "twin");
      uint64_t gx = kvs__pf_grid_x(a.num_rows, a.num_seqs, p.ratio);
      for (int emu = 0; emu < 2; emu++) {
        memset(got, 0xff, n * 2);
        a.out = got;
        if (emu) {
          emu_smem m = {tg_xmalloc(emu_smem_bytes(p.dtype, p.head_dim)), NULL, 0, 0, 0};
          for (uint32_t h = 0; h < p.num_kv_heads; h++)
            for (uint32_t bx = 0; bx < gx; bx++)
              emu_cta_q(&a, h, bx, 0, 0, 1, &m, EMU_PLANT_NONE);
          free(m.h);
          free(m.cp);
        } else {
          CHECK(kvs__flash_model(&a, (uint32_t)gx, p.num_kv_heads, 1, 0,
                                 KVS__FLASH_PLANT_NONE) == 0, "model");
        }
        size_t nans;
        double x = nan_aware_excess(got, twin, p.qo_dtype, n, &nans);
        /* what == 0: the twin has NaN rows (those at or past key 150) */
        int ok = x <= 1.0 && (what ? nans == 0 : nans > 0);
        printf("%s %s %s/%s, key 150's value scales %s: vs twin %.2f of the "
               "tolerance, %zu NaN outputs as the twin\n",
               ok ? "ok  " : "FAIL", emu ? "emulated kernel" : "model",
               kvs_dtype_name(p.dtype), kvs_dtype_name(p.qo_dtype),
               what ? "x 2^20" : "NaN", x, nans);
        failures += !ok;
        a.out = twin;
      }
      free(twin);
      free(got);
      tg_case_free(&c);
    }
}

/* ---- 4. the launcher, on the stand-in driver ------------------------------ */

static void *dev_copy(const void *host, size_t bytes) {
  void *d = NULL;
  int rc = kvs_cuda_malloc(&d, bytes);
  CHECK(rc == 0, "kvs_cuda_malloc: %s", kvs_strerror(rc));
  if (rc)
    exit(1);
  if (host)
    CHECK(kvs_cuda_memcpy_htod(d, host, bytes) == 0, "htod");
  return d;
}

/* One call of a built case through the launcher on the stand-in driver
 * (prefill, or decode when the case has no q_start): its inputs copied to
 * the device, the output poisoned with NaN (every row must be written), a
 * workspace of NaN when ws; *rc the call's status; the device's output
 * against the C twin's, as tg_twin_excess gives it.  The caller sets and
 * reads the launcher's kvs__cuda_attn_last_* around it. */
static double standin_call(const tg_case *c, int ws, int *rc) {
  const tg_params *p = &c->p;
  const int prefill = c->q_start != NULL;
  size_t qes = kvs_dtype_size(p->qo_dtype);
  size_t n = (size_t)c->num_rows * c->num_heads * p->head_dim;
  void *twin = tg_xmalloc(n * qes), *got = tg_xmalloc(n * qes);
  kvs_attn_args a;
  tg_case_args(c, &a, c->pool, twin, c->q, c->seq_lens, c->q_start, c->tables);
  CHECK((prefill ? kvs_cpu_prefill_attention(&a, NULL)
                 : kvs_cpu_decode_attention(&a, NULL)) == 0, "twin");
  void *d_pool = dev_copy(c->pool, kvs_pool_bytes(&c->layout));
  void *d_q = dev_copy(c->q, n * qes), *d_out = dev_copy(NULL, n * qes);
  void *d_lens = dev_copy(c->seq_lens, 4 * p->num_seqs);
  void *d_qs = prefill ? dev_copy(c->q_start, 4 * (p->num_seqs + 1)) : NULL;
  void *d_tab = dev_copy(c->tables, 4 * (size_t)p->num_seqs * c->max_blocks);
  kvs_attn_args g;
  tg_case_args(c, &g, d_pool, d_out, d_q, d_lens, d_qs, d_tab);
  CHECK(kvs_cuda_memset(d_out, 0xff, n * qes) == 0, "memset");
  void *d_ws = NULL;
  if (ws) { /* a workspace (NaN): the launcher may split */
    g.workspace_bytes = kvs_attn_workspace_bytes(&g);
    d_ws = dev_copy(NULL, g.workspace_bytes);
    CHECK(kvs_cuda_memset(d_ws, 0xff, g.workspace_bytes) == 0, "memset");
    g.workspace = d_ws;
  }
  *rc = prefill ? kvs_cuda_prefill_attention(&g, NULL) : kvs_cuda_decode_attention(&g, NULL);
  CHECK(*rc == 0, "%s: %s", prefill ? "prefill" : "decode", kvs_strerror(*rc));
  CHECK(kvs_cuda_sync(NULL) == 0, "sync");
  CHECK(kvs_cuda_memcpy_dtoh(got, d_out, n * qes) == 0, "dtoh");
  double x = tg_twin_excess(got, twin, p->qo_dtype, n);
  kvs_cuda_free(d_ws);
  kvs_cuda_free(d_pool);
  kvs_cuda_free(d_q);
  kvs_cuda_free(d_out);
  kvs_cuda_free(d_lens);
  kvs_cuda_free(d_qs);
  kvs_cuda_free(d_tab);
  free(twin);
  free(got);
  return x;
}

/* One prefill call through kvs_cuda_prefill_attention: expect the flash
 * kernel or not; the result against the twin.  ws: give the call a
 * workspace (NaN); want_split: the launcher must split (more than one
 * split), else it must not. */
static void standin_case(const tg_params *pp, const tg_ragged *bt,
                         int want_flash, int ws, int want_split) {
  uint32_t lens[8];
  tg_case c;
  if (tg_ragged_case(&c, pp, bt, lens)) {
    CHECK(0, "case refused");
    return;
  }
  const tg_params p = c.p;
  kvs__cuda_attn_last_flash = 2; /* neither: the launcher must say */
  kvs__cuda_attn_last_wg = 2;
  kvs__cuda_attn_last_nsplit = 0;
  /* the stand-in is compute capability 9.0: the wgmma variant where it
   * applies, unless turned off */
  const int want_wg = want_flash && kvs__cuda_prefill_wgmma &&
                      !kvs_dtype_quantized(p.dtype) && p.head_dim == 128;
  int rc;
  double x = standin_call(&c, ws, &rc);
  int ok = rc == 0 && x <= 1.0 && (int)kvs__cuda_attn_last_flash == want_flash &&
           (int)kvs__cuda_attn_last_wg == want_wg &&
           (kvs__cuda_attn_last_nsplit > 1) == (want_split != 0);
  printf("%s stand-in knob=%d wgmma=%d kv=%s qo=%s D=%-3u ratio=%u: %s kernel (want "
         "%s), %u split(s)%s, vs twin %.2f of the tolerance\n",
         ok ? "ok  " : "FAIL", kvs__cuda_prefill_flash, kvs__cuda_prefill_wgmma,
         kvs_dtype_name(p.dtype), kvs_dtype_name(p.qo_dtype), p.head_dim, p.ratio,
         kvs__cuda_attn_last_flash != 1 ? "old"
         : kvs__cuda_attn_last_wg == 1  ? "flash wgmma"
                                        : "flash",
         !want_flash ? "old" : want_wg ? "flash wgmma" : "flash",
         kvs__cuda_attn_last_nsplit,
         want_split ? " (want more than 1)" : ws ? " (want 1)" : "", x);
  failures += !ok;
  tg_case_free(&c);
}

/* One decode call through kvs_cuda_decode_attention (one new row a request,
 * q_start none): the flash kernel (kvs__cuda_decode_flash, int8/fp8) or the
 * decode kernel as want_flash says, with a workspace (NaN) or none; the
 * result against the decode twin, every output written. */
static void standin_decode(const tg_params *pp, int want_flash, int ws) {
  uint32_t lens[] = {1, 17, 300, 0, 1100, 64, 33};
  tg_params p = *pp;
  p.num_seqs = 7;
  p.lens = lens;
  p.qlens = NULL;
  tg_case c;
  if (tg_case_build(&c, &p)) {
    CHECK(0, "case refused");
    return;
  }
  kvs__cuda_attn_last_flash = 2; /* neither: the launcher must say */
  int rc;
  double x = standin_call(&c, ws, &rc);
  int ok = rc == 0 && x <= 1.0 && (int)kvs__cuda_attn_last_flash == want_flash;
  printf("%s stand-in decode knob=%d kv=%s qo=%s D=%-3u ratio=%u%s: %s kernel (want %s), "
         "%u split(s), vs twin %.2f of the tolerance\n",
         ok ? "ok  " : "FAIL", kvs__cuda_decode_flash, kvs_dtype_name(p.dtype),
         kvs_dtype_name(p.qo_dtype), p.head_dim, p.ratio, ws ? ", workspace" : "",
         kvs__cuda_attn_last_flash == 1 ? "flash" : "decode", want_flash ? "flash" : "decode",
         kvs__cuda_attn_last_nsplit, x);
  failures += !ok;
  tg_case_free(&c);
}

static int test_launcher(void) {
  const char *build = getenv("KVS_BUILD");
  char so[512];
  snprintf(so, sizeof so, "%s/tests/standin/libcuda-standin.so",
           build && *build ? build : "build");
  if (access(so, R_OK) != 0) {
    CHECK(0, "%s missing (build it first)", so);
    return -1;
  }
  setenv("KVS_CUDA_DRIVER", so, 1);
  const char *why = NULL;
  int rc = kvs_cuda_available(&why);
  CHECK(rc == 0, "stand-in: %s", why ? why : "?");
  if (rc)
    return -1;
  CHECK(kvs_cuda_open(NULL) == 0, "open");
  CHECK(strstr(kvs_cuda_device_name(), "stand-in") != NULL, "device %s",
        kvs_cuda_device_name());
  CHECK(kvs__cuda_prefill_flash == 1, "the flash kernel is off by default");
  CHECK(kvs__cuda_decode_flash == 4, "decode on the flash kernel from GQA %d by default",
        kvs__cuda_decode_flash);
  kvs__cuda_prefill_flash = 0;
  tg_params p = {.block_size = 16, .num_kv_heads = 2, .head_dim = 128,
                 .ratio = 4, .dtype = KVS_DTYPE_FP16, .qo_dtype = KVS_DTYPE_FP16,
                 .num_layers = 2, .layer = 1, .spare_blocks = 2, .q_scale = 2.f,
                 .seed = 31};
  standin_case(&p, &batches[0], 0, 0, 0); /* knob off: the old kernel */
  kvs__cuda_prefill_flash = 1;
  static const struct {
    uint32_t dt, qo, dim, ratio, bs;
    int flash;
  } shapes[] = {
      {KVS_DTYPE_FP16, KVS_DTYPE_FP16, 128, 4, 16, 1},
      {KVS_DTYPE_BF16, KVS_DTYPE_BF16, 64, 8, 32, 1},
      {KVS_DTYPE_FP16, KVS_DTYPE_FP16, 256, 1, 16, 1},
      {KVS_DTYPE_BF16, KVS_DTYPE_BF16, 128, 1, 32, 1},
      {KVS_DTYPE_INT8, KVS_DTYPE_FP16, 128, 4, 16, 1},
      {KVS_DTYPE_INT8, KVS_DTYPE_BF16, 64, 8, 32, 1},
      {KVS_DTYPE_FP8, KVS_DTYPE_FP16, 64, 1, 16, 1},
      {KVS_DTYPE_FP8, KVS_DTYPE_BF16, 128, 4, 32, 1},
      /* not the flash kernel's: the old one, the same answers */
      {KVS_DTYPE_FP32, KVS_DTYPE_FP32, 128, 4, 16, 0},
      {KVS_DTYPE_FP16, KVS_DTYPE_FP32, 128, 4, 16, 0},
      {KVS_DTYPE_BF16, KVS_DTYPE_BF16, 32, 4, 16, 0},
      {KVS_DTYPE_INT8, KVS_DTYPE_FP16, 256, 4, 16, 0},
      {KVS_DTYPE_FP8, KVS_DTYPE_FP32, 128, 4, 16, 0},
      {KVS_DTYPE_INT8, KVS_DTYPE_BF16, 32, 2, 16, 0},
  };
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    p.dtype = shapes[i].dt;
    p.qo_dtype = shapes[i].qo;
    p.head_dim = shapes[i].dim;
    p.ratio = shapes[i].ratio;
    p.block_size = shapes[i].bs;
    p.seed = 40 + i;
    standin_case(&p, &batches[(i + 1) % 3], shapes[i].flash, 0, 0);
  }
  /* few tiles over long prefixes, a workspace: split (the stand-in's 4
   * "SMs" want 16 CTAs), merged by kvs_prefill_flash_merge_kernel; with
   * kvs__cuda_prefill_flash_split = 0 not */
  static const tg_ragged few = {3, {1400, 900, 0}, {8, 1, 5}};
  static const uint32_t split_dts[][2] = {{KVS_DTYPE_FP16, KVS_DTYPE_FP16},
                                          {KVS_DTYPE_INT8, KVS_DTYPE_BF16},
                                          {KVS_DTYPE_FP8, KVS_DTYPE_FP16}};
  for (int i = 0; i < 3; i++) {
    p.dtype = split_dts[i][0];
    p.qo_dtype = split_dts[i][1];
    p.head_dim = i == 1 ? 64 : 128;
    p.ratio = i == 2 ? 1 : 4;
    p.block_size = 16;
    p.seed = 60 + i;
    standin_case(&p, &few, 1, 1, 1);
  }
  kvs__cuda_prefill_flash_split = 0; /* a workspace, the knob off */
  standin_case(&p, &few, 1, 1, 0);
  kvs__cuda_prefill_flash_split = 1;
  /* the wgmma variant off: the mma.sync kernels (their names and shared
   * memory), split or not */
  kvs__cuda_prefill_wgmma = 0;
  for (int i = 0; i < 4; i++) {
    p.dtype = i % 2 ? KVS_DTYPE_BF16 : KVS_DTYPE_FP16;
    p.qo_dtype = p.dtype;
    p.head_dim = i < 2 ? 128 : 64;
    p.ratio = i == 3 ? 1 : 4;
    p.block_size = 16;
    p.seed = 70 + i;
    standin_case(&p, i == 2 ? &few : &batches[i % 3], 1, i == 2, i == 2);
  }
  kvs__cuda_prefill_wgmma = 1;
  /* decode: int8/fp8 on the flash kernel at GQA groups of at least
   * kvs__cuda_decode_flash query heads (0: never; 1: always; the default 4),
   * the decode kernel otherwise and for what the flash kernel does not
   * take; with a workspace or not */
  static const struct {
    uint32_t dt, qo, dim, ratio;
    int flash;
  } dec[] = {
      {KVS_DTYPE_INT8, KVS_DTYPE_FP16, 128, 4, 1}, {KVS_DTYPE_FP8, KVS_DTYPE_BF16, 64, 8, 1},
      {KVS_DTYPE_INT8, KVS_DTYPE_BF16, 64, 1, 1},  {KVS_DTYPE_FP8, KVS_DTYPE_FP16, 128, 2, 1},
      {KVS_DTYPE_INT8, KVS_DTYPE_FP32, 128, 4, 0}, {KVS_DTYPE_FP8, KVS_DTYPE_FP16, 256, 2, 0},
      {KVS_DTYPE_FP16, KVS_DTYPE_FP16, 128, 4, 0}, {KVS_DTYPE_BF16, KVS_DTYPE_BF16, 64, 8, 0},
  };
  static const int knobs[] = {0, 1, 4};
  for (int ik = 0; ik < 3; ik++) {
    const int knob = knobs[ik];
    kvs__cuda_decode_flash = knob;
    for (size_t i = 0; i < sizeof dec / sizeof dec[0]; i++) {
      p.dtype = dec[i].dt;
      p.qo_dtype = dec[i].qo;
      p.head_dim = dec[i].dim;
      p.ratio = dec[i].ratio;
      p.block_size = i % 2 ? 32 : 16;
      p.seed = 80 + i;
      standin_decode(&p, knob && (int)dec[i].ratio >= knob && dec[i].flash, (int)i % 2);
    }
  }
  kvs__cuda_decode_flash = 4;
  kvs__cuda_prefill_flash = 1;
  return 0;
}

/* In the sanitizer build: LeakSanitizer's exit scan once crashed reading
 * the dynamic TLS of the stand-in driver (dlopen'ed by test_launcher), with
 * no leak and no ASan report, depending on the heap layout (GCC 12's
 * libsanitizer, glibc 2.36).  Not scanning TLS cannot hide a leak (a block
 * only TLS pointed to would be reported, not missed), so this test runs
 * without it; LSAN_OPTIONS in the environment still overrides. */
const char *__lsan_default_options(void);
const char *__lsan_default_options(void) { return "use_tls=0"; }

int main(void) {
  setvbuf(stdout, NULL, _IONBF, 0);
  test_schedule();
  test_fragments();
  test_wg_fragments();
  test_model();
  test_split();
  test_launcher();
  /* (after the launcher: in this order LeakSanitizer's exit scan passed
   * even with TLS scanned; see __lsan_default_options above) */
  test_emulated_kernel();
  test_scales();
  printf("%s: %d failure(s)\n", failures ? "FAIL" : "PASS", failures);
  return failures ? 1 : 0;
}
