/*
 * test_gpu_cuda.c — every CUDA kernel against its C twin (and the attention
 * kernels also against the naive contiguous reference), on random data.
 * Plain C, no cmocka, so a GPU machine without the project's third-party
 * libraries builds it (make KVS_NO_DEPS=1 gpu-check).  Exits 77 with
 * "skipped: no GPU (...)" where CUDA cannot run.
 */
#include "gpu/kvs_kernels_int.h"
#include "kvs_status.h"
#include "test_gpu_util.h"

static int failures;
static int split_runs[2]; /* [decode, prefill] cases that really split */

#define CHECK(cond, ...)                              \
  do {                                                \
    if (!(cond)) {                                    \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                   \
      fprintf(stderr, "\n");                          \
      failures++;                                     \
    }                                                 \
  } while (0)

#define CU(call)                                                        \
  do {                                                                  \
    int rc_ = (call);                                                   \
    if (rc_) {                                                          \
      fprintf(stderr, "FAIL %s:%d: %s = %d (%s)\n", __FILE__, __LINE__, \
              #call, rc_, kvs_strerror(rc_));                           \
      exit(1);                                                          \
    }                                                                   \
  } while (0)

static void *dev_copy(const void *host, size_t bytes) {
  void *d;
  CU(kvs_cuda_malloc(&d, bytes));
  if (host)
    CU(kvs_cuda_memcpy_htod(d, host, bytes));
  return d;
}

/* Set by a forced-split pass: every case long enough (over one 256-token
 * partition) must have split its rows. */
static int want_split;

/* One attention case: CPU twin, CUDA with and without the split workspace,
 * naive reference. */
static void attn_case(const tg_params *p, int prefill) {
  tg_case c;
  if (tg_case_build(&c, p)) {
    CHECK(0, "case refused");
    return;
  }
  uint32_t D = p->head_dim;
  size_t n = (size_t)c.num_rows * c.num_heads * D;
  size_t qes = kvs_dtype_size(p->qo_dtype);
  void *cpu_out = tg_xmalloc(n * qes), *gpu_out = tg_xmalloc(n * qes);
  double *ref = tg_xmalloc(sizeof(double) * (n ? n : 1));
  kvs_attn_args a;
  tg_case_args(&c, &a, c.pool, cpu_out, c.q, c.seq_lens, c.q_start, c.tables);
  int rc = prefill ? kvs_cpu_prefill_attention(&a, NULL)
                   : kvs_cpu_decode_attention(&a, NULL);
  CHECK(rc == 0, "cpu attention: %d", rc);
  tg_naive(&c, ref);

  void *d_pool = dev_copy(c.pool, kvs_pool_bytes(&c.layout));
  void *d_q = dev_copy(c.q, n * qes);
  void *d_out = dev_copy(NULL, n * qes);
  void *d_lens = dev_copy(c.seq_lens, sizeof(uint32_t) * p->num_seqs);
  void *d_qs = c.q_start ? dev_copy(c.q_start, sizeof(uint32_t) * (p->num_seqs + 1))
                         : NULL;
  void *d_tab = dev_copy(c.tables, sizeof(uint32_t) * p->num_seqs * c.max_blocks);
  kvs_attn_args g;
  tg_case_args(&c, &g, d_pool, d_out, d_q, d_lens, d_qs, d_tab);
  uint64_t wsb = kvs_attn_workspace_bytes(&g);
  void *d_ws = wsb ? dev_copy(NULL, wsb) : NULL;

  for (int split = 0; split < 2; split++) {
    if (split && !wsb)
      break;
    g.workspace = split ? d_ws : NULL;
    g.workspace_bytes = split ? wsb : 0;
    CU(kvs_cuda_memset(d_out, 0xff, n * qes)); /* NaN: all must be written */
    rc = prefill ? kvs_cuda_prefill_attention(&g, NULL)
                 : kvs_cuda_decode_attention(&g, NULL);
    CHECK(rc == 0, "cuda attention: %d (%s)", rc, kvs_strerror(rc));
    CU(kvs_cuda_sync(NULL));
    CU(kvs_cuda_memcpy_dtoh(gpu_out, d_out, n * qes));
    uint32_t nsplit = kvs__cuda_attn_last_nsplit;
    double e_ref = tg_max_err(gpu_out, p->qo_dtype, ref, n);
    /* against the twin: within one unit in the last place of the output
     * dtype (tg_twin_tol), much tighter than against the naive reference */
    double x_twin = tg_twin_excess(gpu_out, cpu_out, p->qo_dtype, n);
    int ok = e_ref <= tg_tol(p->qo_dtype) && x_twin <= 1.0;
    if (want_split && split && c.max_len > KVS__ATTN_PART && nsplit < 2)
      ok = 0; /* the forced split did not happen */
    /* decode over int8/fp8 on the flash kernel where it applies */
    const uint32_t want_df = !prefill && kvs__cuda_decode_flash > 0 &&
                             p->ratio >= (uint32_t)kvs__cuda_decode_flash &&
                             kvs_dtype_quantized(p->dtype) && p->qo_dtype != KVS_DTYPE_FP32 &&
                             (D == 64 || D == 128);
    if (!prefill && kvs__cuda_attn_last_flash != want_df)
      ok = 0;
    printf("%s %-7s bs=%-2u kvh=%u ratio=%-2u D=%-3u kv=%s qo=%s rows=%-3u "
           "max_len=%-5u: vs twin %.2f of the tolerance, vs naive %.2e; %s\n",
           ok ? "ok  " : "FAIL",
           prefill ? "prefill" : want_df ? "decode-flash" : "decode", p->block_size,
           p->num_kv_heads, p->ratio, D, kvs_dtype_name(p->dtype),
           kvs_dtype_name(p->qo_dtype), c.num_rows, c.max_len, x_twin, e_ref,
           nsplit > 1 ? "split" : split ? "workspace given, not split"
                                        : "no workspace");
    if (nsplit > 1)
      split_runs[prefill]++;
    if (!ok)
      failures++;
  }
  kvs_cuda_free(d_pool);
  kvs_cuda_free(d_q);
  kvs_cuda_free(d_out);
  kvs_cuda_free(d_lens);
  kvs_cuda_free(d_qs);
  kvs_cuda_free(d_tab);
  kvs_cuda_free(d_ws);
  free(cpu_out);
  free(gpu_out);
  free(ref);
  tg_case_free(&c);
}

/* q/out dtype of a case: a quantized cache takes them in another dtype. */
static uint32_t qo_of(uint32_t dt, uint32_t k) {
  return kvs_dtype_quantized(dt) ? k % 3 : dt;
}

/* Every cache dtype (int8 and fp8 written by the C write kernel into pools
 * whose unused slots hold random codes and NaN/Inf scales: tg_case_build). */
static void test_attention(void) {
  static const uint32_t ratios[] = {1, 4, 8, 16}, dims[] = {64, 128, 256};
  int k = 0;
  for (uint32_t dt = 0; dt < KVS_DTYPE__COUNT; dt++)
    for (int ir = 0; ir < 4; ir++)
      for (int id = 0; id < 3; id++) {
        uint32_t bs = (k % 3 == 0) ? 8 : (k % 3 == 1) ? 16 : 32;
        uint32_t lens[] = {1, bs, 3 * bs + 1, 300, 1037, 0, 2 * 256 + 9};
        tg_params p = {.block_size = bs, .num_kv_heads = 2,
                       .head_dim = dims[id], .ratio = ratios[ir], .dtype = dt,
                       .qo_dtype = (dt + (uint32_t)id) % 3, .num_layers = 2,
                       .layer = (uint32_t)k % 2, .num_seqs = 7, .lens = lens,
                       .spare_blocks = 4, .q_scale = (k % 2) ? 5.f : 1.f,
                       .seed = 500 + (uint64_t)k};
        attn_case(&p, 0);
        k++;
      }
  for (uint32_t dt = 0; dt < KVS_DTYPE__COUNT; dt++)
    for (int ir = 0; ir < 3; ir++) {
      uint32_t bs = dt == KVS_DTYPE_INT8 ? 32 : 16;
      uint32_t lens[] = {40, 300, 600, 17, 0};
      uint32_t qlens[] = {40, 45, 290, 1, 0};
      tg_params p = {.block_size = bs, .num_kv_heads = 2,
                     .head_dim = ir == 2 ? 64 : 128, .ratio = ratios[ir],
                     .dtype = dt, .qo_dtype = qo_of(dt, (uint32_t)ir),
                     .num_layers = 3, .layer = 2,
                     .num_seqs = 5, .lens = lens, .qlens = qlens,
                     .spare_blocks = 2, .q_scale = 3.f, .seed = 900 + (uint64_t)k};
      attn_case(&p, 1);
      k++;
    }
  /* odd group sizes (a partial last group of query heads) and a head too
   * small for the transposing reduction (fp16, D=32: 4 lanes < 8 heads) */
  static const struct {
    uint32_t dim, ratio, dtype;
  } odd[] = {{32, 8, KVS_DTYPE_FP16},  {32, 8, KVS_DTYPE_FP32},
             {64, 2, KVS_DTYPE_BF16},  {128, 3, KVS_DTYPE_FP16},
             {128, 6, KVS_DTYPE_FP32}, {64, 12, KVS_DTYPE_FP16},
             /* tensor-core kernel: GQA >= 4, 16-bit, q/out same dtype */
             {128, 4, KVS_DTYPE_FP16}, {128, 8, KVS_DTYPE_BF16},
             {64, 6, KVS_DTYPE_BF16},  {128, 16, KVS_DTYPE_FP16},
             {128, 5, KVS_DTYPE_BF16},
             /* quantized: partial groups, a 2-lane row (D 32), D 512;
              * the smallest and largest rows: one lane (D 16) and two
              * 16-byte chunks a lane (D 1024) */
             {32, 8, KVS_DTYPE_INT8},   {128, 3, KVS_DTYPE_FP8},
             {128, 6, KVS_DTYPE_INT8},  {512, 2, KVS_DTYPE_FP8},
             {64, 12, KVS_DTYPE_INT8},  {16, 4, KVS_DTYPE_INT8},
             {16, 2, KVS_DTYPE_FP8},    {1024, 2, KVS_DTYPE_INT8},
             {1024, 4, KVS_DTYPE_FP8}};
  for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
    uint32_t lens[] = {1, 16, 49, 700, 0, 257};
    tg_params p = {.block_size = 16, .num_kv_heads = 2, .head_dim = odd[i].dim,
                   .ratio = odd[i].ratio, .dtype = odd[i].dtype,
                   .qo_dtype = qo_of(odd[i].dtype, (uint32_t)i),
                   .num_layers = 1, .layer = 0,
                   .num_seqs = 6, .lens = lens, .spare_blocks = 3,
                   .q_scale = 4.f, .seed = 4000 + (uint64_t)i};
    attn_case(&p, 0);
  }
  /* a head_dim the CUDA kernel does not take: refused, not wrong */
  uint32_t lens[] = {5};
  tg_params p = {.block_size = 16, .num_kv_heads = 1, .head_dim = 40,
                 .ratio = 1, .dtype = KVS_DTYPE_FP32, .qo_dtype = KVS_DTYPE_FP32,
                 .num_layers = 1, .num_seqs = 1, .lens = lens,
                 .spare_blocks = 1, .q_scale = 1.f, .seed = 1};
  tg_case c;
  tg_case_build(&c, &p);
  void *d_pool = dev_copy(c.pool, kvs_pool_bytes(&c.layout));
  kvs_attn_args g;
  tg_case_args(&c, &g, d_pool, d_pool, d_pool, d_pool, NULL, d_pool);
  int rc = kvs_cuda_decode_attention(&g, NULL);
  CHECK(rc == KVS_ENOTSUP, "head_dim 40 fp32: %d", rc);
  kvs_cuda_free(d_pool);
  tg_case_free(&c);
  /* nor an int8 row of 24 bytes */
  p.head_dim = 24;
  p.dtype = KVS_DTYPE_INT8;
  tg_case_build(&c, &p);
  d_pool = dev_copy(c.pool, kvs_pool_bytes(&c.layout));
  tg_case_args(&c, &g, d_pool, d_pool, d_pool, d_pool, NULL, d_pool);
  rc = kvs_cuda_decode_attention(&g, NULL);
  CHECK(rc == KVS_ENOTSUP, "head_dim 24 int8: %d", rc);
  kvs_cuda_free(d_pool);
  tg_case_free(&c);
}

/*
 * The flash prefill kernel (kvs__cuda_prefill_flash = 1) against the twin
 * and the naive reference: the cases its C model passes in
 * test_gpu_flash_model (ragged batches of prefixes and chunks, chunk 1,
 * prefix 0, prefixes off the tile, q_len 0, lengths off 64, block sizes
 * 16/32, D 64/128/256, GQA 1/4/8, pools poisoned with NaN/Inf in every
 * unused slot, block and layer), plus long prefixes; int8/fp8 caches under
 * q/out fp16 and bf16 at D 64/128.  The launcher must say it ran the flash
 * kernel: every case on mma.sync (kvs__cuda_prefill_wgmma = 0), then on
 * compute capability 9.0 the 16-bit cases at D 64/128 (split ones too) on
 * its wgmma variant, last.
 */
static int flash_cc; /* compute capability, major * 10 + minor */

static const tg_ragged flash_batches[] = {
    {7, {0, 100, 37, 0, 200, 64, 0}, {70, 1, 150, 0, 0, 64, 1}},
    {5, {129, 0, 3, 250, 17}, {31, 200, 1, 77, 130}},
    {3, {0, 511, 65}, {257, 2, 63}},
    {4, {0, 1500, 1100, 700}, {300, 100, 65, 1}},
};

static void flash_case(const tg_params *pp, const tg_ragged *bt, int split) {
  uint32_t lens[8];
  tg_case c;
  if (tg_ragged_case(&c, pp, bt, lens)) {
    CHECK(0, "case refused");
    return;
  }
  tg_params p = c.p;
  uint32_t D = p.head_dim;
  size_t n = (size_t)c.num_rows * c.num_heads * D;
  void *cpu_out = tg_xmalloc(n * 2), *gpu_out = tg_xmalloc(n * 2);
  double *ref = tg_xmalloc(sizeof(double) * (n ? n : 1));
  kvs_attn_args a;
  tg_case_args(&c, &a, c.pool, cpu_out, c.q, c.seq_lens, c.q_start, c.tables);
  CHECK(kvs_cpu_prefill_attention(&a, NULL) == 0, "cpu prefill");
  tg_naive(&c, ref);
  void *d_pool = dev_copy(c.pool, kvs_pool_bytes(&c.layout));
  void *d_q = dev_copy(c.q, n * 2), *d_out = dev_copy(NULL, n * 2);
  void *d_lens = dev_copy(c.seq_lens, sizeof(uint32_t) * p.num_seqs);
  void *d_qs = dev_copy(c.q_start, sizeof(uint32_t) * (p.num_seqs + 1));
  void *d_tab = dev_copy(c.tables, sizeof(uint32_t) * p.num_seqs * c.max_blocks);
  kvs_attn_args g;
  tg_case_args(&c, &g, d_pool, d_out, d_q, d_lens, d_qs, d_tab);
  CU(kvs_cuda_memset(d_out, 0xff, n * 2)); /* NaN: all must be written */
  void *d_ws = NULL;
  if (split) { /* a workspace, NaN: the launcher splits few long rows */
    g.workspace_bytes = kvs_attn_workspace_bytes(&g);
    d_ws = dev_copy(NULL, g.workspace_bytes);
    CU(kvs_cuda_memset(d_ws, 0xff, g.workspace_bytes));
    g.workspace = d_ws;
  }
  kvs__cuda_attn_last_nsplit = 0;
  int rc = kvs_cuda_prefill_attention(&g, NULL);
  CHECK(rc == 0, "flash prefill: %d (%s)", rc, kvs_strerror(rc));
  CU(kvs_cuda_sync(NULL));
  CU(kvs_cuda_memcpy_dtoh(gpu_out, d_out, n * 2));
  double e_ref = tg_max_err(gpu_out, p.qo_dtype, ref, n);
  double x_twin = tg_twin_excess(gpu_out, cpu_out, p.qo_dtype, n);
  const uint32_t want_wg = kvs__cuda_prefill_wgmma && flash_cc == 90 &&
                           !kvs_dtype_quantized(p.dtype) && D == 128;
  int ok = rc == 0 && kvs__cuda_attn_last_flash == 1 &&
           kvs__cuda_attn_last_wg == want_wg && e_ref <= tg_tol(p.qo_dtype) &&
           x_twin <= 1.0 && (!split || kvs__cuda_attn_last_nsplit > 1);
  printf("%s flash%s bs=%-2u kvh=%u ratio=%-2u D=%-3u kv=%s qo=%s rows=%-4u "
         "max_len=%-5u splits %u: vs twin %.2f of the tolerance, vs naive %.2e%s\n",
         ok ? "ok  " : "FAIL", kvs__cuda_attn_last_wg ? "-wg" : "   ", p.block_size,
         p.num_kv_heads, p.ratio, D,
         kvs_dtype_name(p.dtype), kvs_dtype_name(p.qo_dtype), c.num_rows,
         c.max_len, kvs__cuda_attn_last_nsplit, x_twin, e_ref,
         kvs__cuda_attn_last_flash == 1 ? "" : " (NOT the flash kernel)");
  if (!ok)
    failures++;
  kvs_cuda_free(d_pool);
  kvs_cuda_free(d_q);
  kvs_cuda_free(d_out);
  kvs_cuda_free(d_lens);
  kvs_cuda_free(d_qs);
  kvs_cuda_free(d_tab);
  kvs_cuda_free(d_ws);
  free(cpu_out);
  free(gpu_out);
  free(ref);
  tg_case_free(&c);
}

/* Flash case k: a cache of dtype dt, q/out qo. */
static tg_params flash_params(int k, uint32_t dt, uint32_t qo, uint32_t dim,
                              uint32_t ratio) {
  tg_params p = {.block_size = k % 2 ? 32 : 16, .num_kv_heads = 2, .head_dim = dim,
                 .ratio = ratio, .dtype = dt, .qo_dtype = qo, .num_layers = 2,
                 .layer = (uint32_t)k % 2, .spare_blocks = 3,
                 .q_scale = k % 3 ? 4.f : 1.f, .seed = 12000 + (uint64_t)k};
  return p;
}

static void test_flash_prefill(void) {
  static const uint32_t dims[] = {64, 128, 256}, ratios[] = {1, 4, 8};
  int k = 0, smclk = 0, ccmaj = 0, ccmin = 0;
  if (kvs__cuda_device_compute(&smclk, &ccmaj, &ccmin) == 0)
    flash_cc = 10 * ccmaj + ccmin;
  kvs__cuda_prefill_flash = 1;
  /* the mma.sync kernel first, every case; then (compute capability 9.0)
   * the 16-bit cases at D 128 again on the wgmma variant */
  kvs__cuda_prefill_wgmma = 0;
  for (uint32_t dt = KVS_DTYPE_FP16; dt <= KVS_DTYPE_BF16; dt++)
    for (int id = 0; id < 3; id++)
      for (int ir = 0; ir < 3; ir++)
        for (int ib = 0; ib < 4; ib++, k++) {
          tg_params p = flash_params(k, dt, dt, dims[id], ratios[ir]);
          flash_case(&p, &flash_batches[ib], 0);
        }
  /* int8/fp8 caches, q/out fp16 and bf16, head_dim 64 and 128 */
  for (uint32_t dt = KVS_DTYPE_INT8; dt <= KVS_DTYPE_FP8; dt++)
    for (uint32_t qo = KVS_DTYPE_FP16; qo <= KVS_DTYPE_BF16; qo++)
      for (int id = 0; id < 2; id++)
        for (int ir = 0; ir < 3; ir++)
          for (int ib = 0; ib < 4; ib++, k++) {
            tg_params p = flash_params(k, dt, qo, dims[id], ratios[ir]);
            flash_case(&p, &flash_batches[ib], 0);
          }
  /* few new rows over long prefixes, with a workspace: split over spans of
   * the keys and merged (kvs_prefill_flash_merge_kernel) */
  static const tg_ragged long_batches[] = {
      {2, {3000, 1500}, {16, 1}},
      {3, {4000, 0, 700}, {1, 9, 30}},
  };
  static const uint32_t split_dts[][2] = {{KVS_DTYPE_FP16, KVS_DTYPE_FP16},
                                          {KVS_DTYPE_BF16, KVS_DTYPE_BF16},
                                          {KVS_DTYPE_INT8, KVS_DTYPE_FP16},
                                          {KVS_DTYPE_FP8, KVS_DTYPE_BF16}};
  /* (and head dim 256 for the 16-bit caches: i 0 and 1, batch 0); on the
   * wgmma pass the 16-bit ones at D 128 again, the same seeds */
  const int k_split = k;
  for (int wg = 0; wg <= (flash_cc == 90); wg++) {
    kvs__cuda_prefill_wgmma = wg;
    if (wg) { /* the 16-bit cases at D 128 on the wgmma variant */
      int k2 = 0;
      for (uint32_t dt = KVS_DTYPE_FP16; dt <= KVS_DTYPE_BF16; dt++)
        for (int id = 0; id < 3; id++)
          for (int ir = 0; ir < 3; ir++)
            for (int ib = 0; ib < 4; ib++, k2++) {
              if (dims[id] != 128)
                continue; /* D 64 and 256: the mma.sync kernel's, above */
              tg_params p = flash_params(k2, dt, dt, dims[id], ratios[ir]);
              flash_case(&p, &flash_batches[ib], 0);
            }
    }
    k = k_split;
    for (int i = 0; i < 4; i++)
      for (int ib = 0; ib < 2 + (i < 2); ib++, k++) {
        if (wg && (i >= 2 || ib != 0))
          continue; /* int8/fp8, D 64 and 256: no wgmma variant */
        tg_params p = {.block_size = k % 2 ? 32 : 16, .num_kv_heads = 2,
                       .head_dim = ib == 2 ? 256 : ib ? 64 : 128, .ratio = ib == 1 ? 1 : 4,
                       .dtype = split_dts[i][0], .qo_dtype = split_dts[i][1],
                       .num_layers = 1, .spare_blocks = 2, .q_scale = 2.f,
                       .seed = 12000 + (uint64_t)k};
        flash_case(&p, &long_batches[ib % 2], 1);
      }
  }
  kvs__cuda_prefill_wgmma = 1;
  kvs__cuda_prefill_flash = 0;
}

/* The write kernel against the twin, byte for byte: for int8 and fp8 the
 * codes, scales and minimums too (each quantizing step is one correctly
 * rounded float32 operation on both sides: docs/kernels.md).  Rows of
 * head_dim 128, and for the quantized dtypes 37 (lanes without elements;
 * int8: a rotation over segments of 32, 4 and 1) and 3200 (int8: three
 * warps, 38400 bytes of shared memory, and segments of 2048, 1024 and
 * 128) and 4096 from fp32 (int8: one segment, all 48 KiB of shared
 * memory), and rows with a NaN, an infinity, a constant value, zeros of
 * both signs. */
static void test_write(void) {
  for (uint32_t dt = 0; dt < KVS_DTYPE__COUNT; dt++)
    for (uint32_t case_ = 0; case_ < 4; case_++) {
      int quant = kvs_dtype_quantized(dt);
      uint32_t sdt = case_ % 3; /* the sources' dtype */
      if (case_ == 3 && !quant)
        continue;
      kvs_layout l = {.block_size = 16, .num_layers = 4, .num_kv_heads = 4,
                      .head_dim = !quant ? 128 : case_ == 0 ? 128 : case_ == 1 ? 37
                                           : case_ == 2 ? 3200 : 4096,
                      .dtype = dt,
                      .num_blocks = 20};
      kvs_layout_finish(&l);
      uint64_t bytes = kvs_pool_bytes(&l);
      char *pool = tg_xmalloc(bytes), *back = tg_xmalloc(bytes);
      uint64_t rng = 31 + dt * 4 + case_;
      for (uint64_t i = 0; i < bytes; i++)
        pool[i] = (char)(tg_next(&rng) & 0x3f); /* finite in every dtype */
      enum { N = 100 };
      uint32_t row = l.num_kv_heads * l.head_dim;
      size_t ses = kvs_dtype_size(sdt);
      char *k = tg_xmalloc((size_t)N * row * ses), *v = tg_xmalloc((size_t)N * row * ses);
      for (uint32_t i = 0; i < N * row; i++) {
        float x = 3.f * tg_unif(&rng), y = 3.f * tg_unif(&rng);
        uint32_t r = i / l.head_dim; /* (token, head) row */
        if (quant && r % 7 == 1 && i % l.head_dim == 5)
          x = NAN; /* a NaN row: codes 0, scales NaN */
        if (quant && r % 7 == 3 && i % l.head_dim == 9)
          y = -INFINITY;
        if (quant && r % 7 == 5)
          x = y = 0.75f; /* constant: scale 0 */
        if (quant && r % 7 == 6)
          x = (i % 2) ? 0.f : -0.f; /* zeros of both signs: the min's sign */
        kvs_convert(k + i * ses, sdt, &x, KVS_DTYPE_FP32, 1);
        kvs_convert(v + i * ses, sdt, &y, KVS_DTYPE_FP32, 1);
      }
      int64_t slots[N];
      for (uint32_t i = 0; i < N; i++)
        slots[i] = i % 9 == 4 ? -1 : (int64_t)((i * 53 + 7) % (l.num_blocks * l.block_size));
      void *d_pool = dev_copy(pool, bytes), *d_k = dev_copy(k, (size_t)N * row * ses),
           *d_v = dev_copy(v, (size_t)N * row * ses), *d_s = dev_copy(slots, sizeof slots);
      kvs_write_args a = {.k = k, .v = v, .slots = slots, .src_token_stride = row,
                          .src_dtype = sdt, .num_tokens = N};
      kvs_paged_kv_init(&a.kv, pool, &l, 2);
      CU(kvs_cpu_write_kv(&a, NULL));
      kvs_write_args g = a;
      g.k = d_k;
      g.v = d_v;
      g.slots = d_s;
      kvs_paged_kv_init(&g.kv, d_pool, &l, 2);
      g.kv.num_blocks = l.num_blocks;
      CU(kvs_cuda_write_kv(&g, NULL));
      CU(kvs_cuda_sync(NULL));
      CU(kvs_cuda_memcpy_dtoh(back, d_pool, bytes));
      int same = memcmp(back, pool, bytes) == 0;
      uint64_t first = 0;
      while (!same && first < bytes && back[first] == pool[first])
        first++;
      printf("%s write kv=%s src=%s D=%u", same ? "ok  " : "FAIL",
             kvs_dtype_name(dt), kvs_dtype_name(sdt), l.head_dim);
      if (!same)
        printf(" (first difference at byte %llu: %02x, the twin %02x)",
               (unsigned long long)first, (unsigned char)back[first],
               (unsigned char)pool[first]);
      printf("\n");
      if (!same)
        failures++;
      kvs_cuda_free(d_pool);
      kvs_cuda_free(d_k);
      kvs_cuda_free(d_v);
      kvs_cuda_free(d_s);
      free(pool);
      free(back);
      free(k);
      free(v);
    }
}

static void test_blocks(void) {
  kvs_layout l = {.block_size = 16, .num_layers = 3, .num_kv_heads = 2,
                  .head_dim = 128, .dtype = KVS_DTYPE_FP16, .num_blocks = 16};
  kvs_layout_finish(&l);
  uint64_t bytes = kvs_pool_bytes(&l), st = l.block_stride;
  char *pool = tg_xmalloc(bytes), *back = tg_xmalloc(bytes);
  char *stg = tg_xmalloc(4 * st), *stg_back = tg_xmalloc(4 * st);
  uint64_t rng = 5;
  for (uint64_t i = 0; i < bytes; i++)
    pool[i] = (char)tg_next(&rng);
  for (uint64_t i = 0; i < 4 * st; i++)
    stg[i] = (char)tg_next(&rng);
  void *d_pool = dev_copy(pool, bytes), *d_stg = dev_copy(NULL, 4 * st);
  uint32_t pairs[] = {1, 9, 4, 4, 15, 2, 7, 0};
  uint32_t list[] = {3, 12, 9, 6};
  void *d_pairs = dev_copy(pairs, sizeof pairs), *d_list = dev_copy(list, sizeof list);

  kvs_copy_args ca = {.base = pool, .block_stride = st, .pairs = pairs,
                      .num_pairs = 4, .num_blocks = l.num_blocks};
  CU(kvs_cpu_copy_blocks(&ca, NULL));
  kvs_copy_args cg = ca;
  cg.base = d_pool;
  cg.pairs = d_pairs;
  CU(kvs_cuda_copy_blocks(&cg, NULL));
  CU(kvs_cuda_memcpy_dtoh(back, d_pool, bytes));
  int ok = memcmp(back, pool, bytes) == 0;
  printf("%s copy_blocks\n", ok ? "ok  " : "FAIL");
  failures += !ok;

  kvs_xfer_args xa = {.base = pool, .block_stride = st, .staging = stg,
                      .blocks = list, .count = 4, .num_blocks = l.num_blocks};
  CU(kvs_cpu_gather_blocks(&xa, NULL));
  kvs_xfer_args xg = xa;
  xg.base = d_pool;
  xg.staging = d_stg;
  xg.blocks = d_list;
  CU(kvs_cuda_gather_blocks(&xg, NULL));
  CU(kvs_cuda_memcpy_dtoh(stg_back, d_stg, 4 * st));
  ok = memcmp(stg_back, stg, 4 * st) == 0;
  printf("%s gather_blocks\n", ok ? "ok  " : "FAIL");
  failures += !ok;

  /* scatter fresh bytes into other blocks */
  for (uint64_t i = 0; i < 4 * st; i++)
    stg[i] = (char)tg_next(&rng);
  CU(kvs_cuda_memcpy_htod(d_stg, stg, 4 * st));
  uint32_t list2[] = {0, 5, 10, 14};
  CU(kvs_cuda_memcpy_htod(d_list, list2, sizeof list2));
  xa.blocks = list2;
  CU(kvs_cpu_scatter_blocks(&xa, NULL));
  CU(kvs_cuda_scatter_blocks(&xg, NULL));
  CU(kvs_cuda_memcpy_dtoh(back, d_pool, bytes));
  ok = memcmp(back, pool, bytes) == 0;
  printf("%s scatter_blocks\n", ok ? "ok  " : "FAIL");
  failures += !ok;
  kvs_cuda_free(d_pool);
  kvs_cuda_free(d_stg);
  kvs_cuda_free(d_pairs);
  kvs_cuda_free(d_list);
  free(pool);
  free(back);
  free(stg);
  free(stg_back);
}

int main(int argc, char **argv) {
  /* "flash": only the flash kernel's checks (a GPU run short of time) */
  const int only_flash = argc > 1 && strcmp(argv[1], "flash") == 0;
  const char *why = NULL;
  if (kvs_cuda_available(&why) != 0) {
    printf("skipped: no GPU (%s)\n", why);
    return 77;
  }
  CU(kvs_cuda_open(NULL));
  if (strstr(kvs_cuda_device_name(), "stand-in")) {
    /* Its kernels are the C twins: comparing them proves nothing. */
    printf("skipped: no GPU (%s is the stand-in driver, whose kernels are "
           "the C twins)\n", kvs_cuda_device_name());
    return 77;
  }
  char uuid[64];
  snprintf(uuid, sizeof uuid, "%s", kvs_cuda_device_uuid());
  printf("device: %s %s\n", kvs_cuda_device_name(), uuid);
  CHECK(strncmp(uuid, "GPU-", 4) == 0, "uuid %s", uuid);
  CHECK(kvs_cuda_open(uuid) == 0, "reopen by uuid");
  CHECK(kvs_cuda_open(uuid + 4) == 0, "reopen by bare uuid");
  int rc = kvs_cuda_open("GPU-00000000-0000-0000-0000-000000000000");
  CHECK(rc == KVS_ENOENT, "unknown uuid: %d", rc);
  CHECK(kvs_kernels_cuda()->decode_attention == kvs_cuda_decode_attention,
        "table");

  /* The kernels before the flash kernel (on by default for prefill) */
  kvs__cuda_prefill_flash = 0;
  kvs__cuda_decode_flash = 0;
  if (only_flash)
    goto flash;
  test_write();
  test_blocks();
  test_attention();
  /* the same shapes again on the CUDA-core kernel only */
  printf("-- without the tensor-core kernel:\n");
  kvs__cuda_attn_mma = 0;
  test_attention();
  kvs__cuda_attn_mma = 1;
  /* Rows split over many partitions (and merged) whatever the launcher
   * would choose: on an H100 the prefill rows of these shapes never split
   * by themselves, so this is the only run of prefill's split + merge. */
  printf("-- forced splits (aiming at 64 blocks per SM):\n");
  int before[2] = {split_runs[0], split_runs[1]};
  want_split = 1;
  kvs__cuda_attn_blocks_per_sm = 64;
  test_attention();
  kvs__cuda_attn_mma = 0;
  test_attention();
  kvs__cuda_attn_mma = 1;
  kvs__cuda_attn_blocks_per_sm = 0;
  want_split = 0;
  CHECK(split_runs[1] > before[1] && split_runs[0] > before[0],
        "the forced pass split %d decode and %d prefill cases",
        split_runs[0] - before[0], split_runs[1] - before[1]);
  printf("cases that split: %d decode, %d prefill\n", split_runs[0],
         split_runs[1]);
flash:
  /* The flash prefill kernel last, its wgmma variant (compute capability
   * 9.0) after the mma.sync kernel: a fault of a kernel no GPU has run yet
   * ends the process (the context is lost), and must cost no other check. */
  test_flash_prefill();
  for (int wg = 0; wg <= (flash_cc == 90); wg++) {
    /* the same shapes with prefill on the flash kernel where it applies,
     * and decode over int8/fp8 caches (kvs__cuda_decode_flash) */
    printf("-- prefill on the flash kernel (kvs__cuda_prefill_flash = 1, %s), "
           "decode over int8/fp8 too (kvs__cuda_decode_flash = 1):\n",
           wg ? "its wgmma variant" : "mma.sync");
    kvs__cuda_prefill_flash = 1;
    kvs__cuda_decode_flash = 1;
    kvs__cuda_prefill_wgmma = wg;
    test_attention();
  }
  kvs__cuda_prefill_flash = 1;
  kvs__cuda_decode_flash = 0;
  kvs__cuda_prefill_wgmma = 1;
  printf("%s: %d failure(s)\n", failures ? "FAIL" : "PASS", failures);
  return failures ? 1 : 0;
}
