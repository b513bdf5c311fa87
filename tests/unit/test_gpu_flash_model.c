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
 *      P.V) against the C twin kvs_cpu_prefill_attention and the naive
 *      double-precision reference, on ragged batches over pools whose
 *      unused slots and blocks hold NaN and infinities;
 *   3. that those comparisons can fail: the model with a planted masking
 *      fault must be caught;
 *   4. the launcher: through the stand-in driver, kvs_cuda_prefill_attention
 *      with kvs__cuda_prefill_flash = 1 launches kvs_prefill_flash_* (which
 *      the stand-in runs as the model) for the shapes it takes, and the old
 *      kernel for everything else and with the knob at 0.
 * Plain C (no cmocka).  The real kernel's check is test_gpu_cuda on a GPU.
 */
#include <unistd.h>

#include "gpu/kvs_kernels_int.h"
#include "gpu/kvs_prefill_sched.h"
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
    uint32_t ns = 1 + (uint32_t)(tg_next(&rng) % 9);
    static const uint32_t ratios[] = {1, 2, 3, 4, 6, 8, 16};
    uint32_t ratio = ratios[tg_next(&rng) % 7];
    static const uint32_t dims[] = {64, 128, 256};
    uint32_t bn = kvs__pf_bn(dims[it % 3]);
    uint32_t qs[10], lens[9];
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
        for (uint32_t kt = 0; kt < p.n_ktiles; kt++)
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
    free(hit);
  }
  printf("%s schedule: 400 random batches, %d tiles checked\n",
         failures ? "FAIL" : "ok  ", cases);
}

/* ---- 2, 3. the model against the twin ------------------------------------ */

/* The ragged batch of a case: (prefix, new rows) per request. */
typedef struct batch {
  uint32_t n;
  uint32_t prefix[8], qlen[8];
} batch;

static const batch batches[] = {
    /* prefix 0; chunk 1 (decode rows) with and without prefix; a prefix
     * not a multiple of the tile; q_len 0 with and without keys; lengths
     * off every multiple of 64 */
    {7, {0, 100, 37, 0, 200, 64, 0}, {70, 1, 150, 0, 0, 64, 1}},
    {5, {129, 0, 3, 250, 17}, {31, 200, 1, 77, 130}},
    {3, {0, 511, 65}, {257, 2, 63}},
};

static void attn_pair(const tg_params *pp, const batch *bt, int plant,
                      double *x_twin, double *e_ref) {
  uint32_t lens[8];
  for (uint32_t s = 0; s < bt->n; s++)
    lens[s] = bt->prefix[s] + bt->qlen[s];
  tg_params p = *pp;
  p.num_seqs = bt->n;
  p.lens = lens;
  p.qlens = bt->qlen;
  tg_case c;
  if (tg_case_build(&c, &p)) {
    CHECK(0, "case refused");
    return;
  }
  tg_poison_unused(&c);
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
  CHECK(kvs__flash_model(&a, (uint32_t)gx, p.num_kv_heads, plant) == 0, "model");
  *x_twin = tg_twin_excess(model, twin, p.qo_dtype, n);
  *e_ref = tg_max_err(model, p.qo_dtype, ref, n);
  free(twin);
  free(model);
  free(ref);
  tg_case_free(&c);
}

static void test_model(void) {
  static const uint32_t dims[] = {64, 128, 256}, ratios[] = {1, 4, 8};
  int k = 0;
  for (uint32_t dt = KVS_DTYPE_FP16; dt <= KVS_DTYPE_BF16; dt++)
    for (int id = 0; id < 3; id++)
      for (int ir = 0; ir < 3; ir++, k++) {
        const batch *bt = &batches[k % 3];
        tg_params p = {.block_size = k % 2 ? 32 : 16, .num_kv_heads = 2,
                       .head_dim = dims[id], .ratio = ratios[ir], .dtype = dt,
                       .qo_dtype = dt, .num_layers = 2, .layer = (uint32_t)k % 2,
                       .spare_blocks = 3, .q_scale = k % 2 ? 4.f : 1.f,
                       .seed = 7000 + (uint64_t)k};
        double x, e;
        attn_pair(&p, bt, KVS__FLASH_PLANT_NONE, &x, &e);
        int ok = x <= 1.0 && e <= tg_tol(dt);
        printf("%s model %s bs=%u D=%-3u ratio=%u batch %d: vs twin %.2f of "
               "the tolerance, vs naive %.2e\n",
               ok ? "ok  " : "FAIL", kvs_dtype_name(dt), p.block_size, p.head_dim,
               p.ratio, k % 3, x, e);
        failures += !ok;
      }
  /* the same comparisons must catch a planted fault */
  static const struct {
    int plant;
    const char *what;
  } plants[] = {{KVS__FLASH_PLANT_MASK, "a row sees one key too many"},
                {KVS__FLASH_PLANT_NOSKIP, "boundary tiles unmasked"}};
  for (int i = 0; i < 2; i++) {
    tg_params p = {.block_size = 16, .num_kv_heads = 2, .head_dim = 64,
                   .ratio = 4, .dtype = KVS_DTYPE_FP16, .qo_dtype = KVS_DTYPE_FP16,
                   .num_layers = 1, .spare_blocks = 2, .q_scale = 1.f,
                   .seed = 9100 + (uint64_t)i};
    double x, e;
    attn_pair(&p, &batches[0], plants[i].plant, &x, &e);
    int caught = x > 1.0;
    printf("%s planted fault (%s): vs twin %.2f of the tolerance, %s\n",
           caught ? "ok  " : "FAIL", plants[i].what, x,
           caught ? "caught" : "NOT caught");
    failures += !caught;
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

/* One prefill call through kvs_cuda_prefill_attention: expect the flash
 * kernel or not; the result against the twin. */
static void standin_case(const tg_params *pp, const batch *bt, int want_flash) {
  uint32_t lens[8];
  for (uint32_t s = 0; s < bt->n; s++)
    lens[s] = bt->prefix[s] + bt->qlen[s];
  tg_params p = *pp;
  p.num_seqs = bt->n;
  p.lens = lens;
  p.qlens = bt->qlen;
  tg_case c;
  if (tg_case_build(&c, &p)) {
    CHECK(0, "case refused");
    return;
  }
  if (kvs_dtype_size(p.dtype) == 2)
    tg_poison_unused(&c);
  size_t qes = kvs_dtype_size(p.qo_dtype);
  size_t n = (size_t)c.num_rows * c.num_heads * p.head_dim;
  void *twin = tg_xmalloc(n * qes), *got = tg_xmalloc(n * qes);
  kvs_attn_args a;
  tg_case_args(&c, &a, c.pool, twin, c.q, c.seq_lens, c.q_start, c.tables);
  CHECK(kvs_cpu_prefill_attention(&a, NULL) == 0, "twin");
  void *d_pool = dev_copy(c.pool, kvs_pool_bytes(&c.layout));
  void *d_q = dev_copy(c.q, n * qes), *d_out = dev_copy(NULL, n * qes);
  void *d_lens = dev_copy(c.seq_lens, 4 * p.num_seqs);
  void *d_qs = dev_copy(c.q_start, 4 * (p.num_seqs + 1));
  void *d_tab = dev_copy(c.tables, 4 * (size_t)p.num_seqs * c.max_blocks);
  kvs_attn_args g;
  tg_case_args(&c, &g, d_pool, d_out, d_q, d_lens, d_qs, d_tab);
  CHECK(kvs_cuda_memset(d_out, 0xff, n * qes) == 0, "memset");
  kvs__cuda_attn_last_flash = 2; /* neither: the launcher must say */
  int rc = kvs_cuda_prefill_attention(&g, NULL);
  CHECK(rc == 0, "prefill: %s", kvs_strerror(rc));
  CHECK(kvs_cuda_sync(NULL) == 0, "sync");
  CHECK(kvs_cuda_memcpy_dtoh(got, d_out, n * qes) == 0, "dtoh");
  double x = tg_twin_excess(got, twin, p.qo_dtype, n);
  int ok = rc == 0 && x <= 1.0 && (int)kvs__cuda_attn_last_flash == want_flash;
  printf("%s stand-in knob=%d kv=%s qo=%s D=%-3u ratio=%u: %s kernel (want %s), "
         "vs twin %.2f of the tolerance\n",
         ok ? "ok  " : "FAIL", kvs__cuda_prefill_flash, kvs_dtype_name(p.dtype),
         kvs_dtype_name(p.qo_dtype), p.head_dim, p.ratio,
         kvs__cuda_attn_last_flash == 1 ? "flash" : "old",
         want_flash ? "flash" : "old", x);
  failures += !ok;
  kvs_cuda_free(d_pool);
  kvs_cuda_free(d_q);
  kvs_cuda_free(d_out);
  kvs_cuda_free(d_lens);
  kvs_cuda_free(d_qs);
  kvs_cuda_free(d_tab);
  free(twin);
  free(got);
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
  CHECK(kvs__cuda_prefill_flash == 0, "the flash kernel is on by default");
  tg_params p = {.block_size = 16, .num_kv_heads = 2, .head_dim = 128,
                 .ratio = 4, .dtype = KVS_DTYPE_FP16, .qo_dtype = KVS_DTYPE_FP16,
                 .num_layers = 2, .layer = 1, .spare_blocks = 2, .q_scale = 2.f,
                 .seed = 31};
  standin_case(&p, &batches[0], 0); /* knob off: the old kernel */
  kvs__cuda_prefill_flash = 1;
  static const struct {
    uint32_t dt, qo, dim, ratio, bs;
    int flash;
  } shapes[] = {
      {KVS_DTYPE_FP16, KVS_DTYPE_FP16, 128, 4, 16, 1},
      {KVS_DTYPE_BF16, KVS_DTYPE_BF16, 64, 8, 32, 1},
      {KVS_DTYPE_FP16, KVS_DTYPE_FP16, 256, 1, 16, 1},
      {KVS_DTYPE_BF16, KVS_DTYPE_BF16, 128, 1, 32, 1},
      /* not the flash kernel's: the old one, the same answers */
      {KVS_DTYPE_FP32, KVS_DTYPE_FP32, 128, 4, 16, 0},
      {KVS_DTYPE_FP16, KVS_DTYPE_FP32, 128, 4, 16, 0},
      {KVS_DTYPE_BF16, KVS_DTYPE_BF16, 32, 4, 16, 0},
      {KVS_DTYPE_INT8, KVS_DTYPE_FP16, 128, 4, 16, 0},
  };
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    p.dtype = shapes[i].dt;
    p.qo_dtype = shapes[i].qo;
    p.head_dim = shapes[i].dim;
    p.ratio = shapes[i].ratio;
    p.block_size = shapes[i].bs;
    p.seed = 40 + i;
    standin_case(&p, &batches[(i + 1) % 3], shapes[i].flash);
  }
  kvs__cuda_prefill_flash = 0;
  return 0;
}

int main(void) {
  setvbuf(stdout, NULL, _IONBF, 0);
  test_schedule();
  test_model();
  test_launcher();
  printf("%s: %d failure(s)\n", failures ? "FAIL" : "PASS", failures);
  return failures ? 1 : 0;
}
