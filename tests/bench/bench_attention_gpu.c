/*
 * bench_attention_gpu.c — CUDA paged decode attention: achieved bandwidth of
 * K/V read, against a device-to-device copy measured in the same run and the
 * device's nominal memory bandwidth.  Prints "skipped: no GPU" and exits 0
 * where CUDA cannot run (it is in `make bench`).
 *
 *   bench_attention_gpu [reps [sweep|profile|prefill|decode|smoke|ncu]]
 *
 * sweep: also times configurations at several split targets (blocks per
 * SM), on the CUDA-core kernel only, and with at most 4 query heads per
 * block; profile: one configuration only, for a profiler; decode: the 11
 * fp16/bf16/fp32 decode rows only, the rows the build of `b994ecf` times
 * (tests/gpu/run.sh runs both builds, alternately, for a before/after);
 * ncu: for a profiler (ncu --kernel-name regex:...), each kernel of the
 * open issues once at one shape: prefill 4/0/2048 fp16 on the old kernel,
 * the flash kernel and its wgmma variant; decode 32 x 4096 int8 and fp8
 * on the decode kernel and on the flash kernel, and fp16 (reps 1, no
 * warm-up, no median: the times printed say nothing);
 * smoke: every row of the default run, batches cut to 2 and lengths divided
 * (decode rows by 8, to keep their split; prefill rows by 64, the long
 * prefixes by 16, to keep theirs), each timed once, warm-up none, on the
 * stand-in driver too (make test runs
 * it there: the rows a GPU run reaches first, their workspaces, kernel
 * choices and printing, on the C twins; a row whose flash kernel does not
 * run is then an error).  Its times say nothing.
 *
 * Times are CUDA-event times (median of 5 runs of `reps` back-to-back calls,
 * after warm-up).  Bytes counted: every K and V element of every request's
 * keys, read once (the floor for decode), and for int8/fp8 their scales; q,
 * out, tables are ignored.  int8 and fp8 rows (q/out fp16) also give their
 * tokens/s against the fp16 row of the same shape timed just before
 * ("x fp16": issue 24 asks >= 1.6 at batch 32 x 4096, 32/8 heads, D 128),
 * on the decode kernel, then again on the flash kernel (kvs__cuda_decode_flash,
 * which by default takes them at GQA groups of 4 or more).
 *
 * Prefill (chunked, causal, after the decode rows; `prefill` as the second
 * argument runs only these): batch / cached prefix / new tokens per
 * request, 32 query / 8 kv heads, D 128, fp16, then a chunk sweep 128 ..
 * 8192 new tokens (prefix 0, batch 4).  Each shape is timed on the old
 * kernel (kvs__cuda_prefill_flash = 0; given the split workspace where it
 * is under 1 GiB) and on the flash kernel (= 1) in the same run, as
 * TFLOP/s of the causal attention's useful work: 4 * D flops per (query
 * head, row, key it sees).  Then the four shapes again over int8 and fp8
 * caches (the flash kernel's int8 path does twice the tensor-core products
 * of fp16's, fp8's P.V twice: docs/kernels.md), and long prefixes under
 * few new rows on the flash kernel without and with its split; the flash
 * columns are the mma.sync kernel (kvs__cuda_prefill_wgmma = 0).  Last, on
 * compute capability 9.0 only, the fp16 rows without split (the four shapes
 * and the chunk sweep) again on the flash kernel's wgmma variant, "x flash"
 * against the flash time of the same row above: last, so that a fault of
 * that unverified kernel, which ends the process, loses nothing else.  The
 * flash kernel's TFLOP/s are also given as % of the device's dense fp16
 * tensor-core peak (fp32 sums): SMs x flops per clock per SM (2048 on
 * sm_80, 4096 on sm_90; other devices: not given) x the driver's SM clock,
 * an upper bound (NVIDIA's datasheet figure takes a lower clock).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/kvs_kernels.h"
#include "gpu/kvs_kernels_int.h"
#include "kvs_status.h"

#define CU(call)                                                          \
  do {                                                                    \
    int rc_ = (call);                                                     \
    if (rc_) {                                                            \
      fprintf(stderr, "%s:%d: %s = %d (%s)\n", __FILE__, __LINE__, #call, \
              rc_, kvs_strerror(rc_));                                    \
      exit(1);                                                            \
    }                                                                     \
  } while (0)

static uint64_t rng = 12345;
static double tc_peak; /* TFLOP/s, 0: unknown */
static int dev_cc; /* compute capability, major * 10 + minor */
static uint32_t shrink = 1; /* smoke: lengths / shrink (64), batches <= 2 */

/* n / (shrink / less): less is 8 for decode rows, 4 for long prefixes */
static uint32_t shrunk_len(uint32_t n, uint32_t less) {
  uint32_t by = shrink / less ? shrink / less : 1;
  return n / by ? n / by : (n ? 1 : 0);
}

static uint32_t shrunk_batch(uint32_t b) {
  return shrink == 1 || b <= 2 ? b : 2;
}
static uint64_t next_rand(void) {
  uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

typedef struct {
  const void *src;
  void *dst;
  size_t bytes;
} copy_job;

static int do_copy(void *arg) {
  copy_job *j = arg;
  return kvs_cuda_memcpy_dtod(j->dst, j->src, j->bytes);
}

static int do_decode(void *arg) {
  return kvs_cuda_decode_attention(arg, NULL);
}

static int once; /* ncu: every timed call once, no warm-up */

static float median_ms(int (*fn)(void *), void *arg, int reps) {
  float t[5];
  int n = shrink > 1 || once ? 1 : 5; /* (smoke, ncu: once, no warm-up) */
  for (int i = 0; i < 2 && n > 1; i++) /* warm-up */
    CU(fn(arg));
  CU(kvs_cuda_sync(NULL));
  for (int i = 0; i < n; i++)
    CU(kvs_cuda_time_ms(NULL, fn, arg, reps, &t[i]));
  qsort(t, (size_t)n, sizeof t[0], cmp_float);
  return t[n / 2] / (float)reps;
}

/* Fill device memory with random bytes that are finite in every dtype. */
static void fill_random(void *d, size_t bytes) {
  size_t chunk = 16u << 20;
  unsigned char *h = malloc(chunk);
  for (size_t i = 0; i < chunk; i++)
    h[i] = (unsigned char)(next_rand() & 0x3f); /* exponent bits never all 1 */
  for (size_t off = 0; off < bytes; off += chunk)
    CU(kvs_cuda_memcpy_htod((char *)d + off, h,
                            bytes - off < chunk ? bytes - off : chunk));
  free(h);
}

/* Block ids 0 .. n-1 in a random order: the requests' tables, one after
 * the other, scattered over the pool. */
static uint32_t *shuffled_ids(uint32_t n) {
  uint32_t *ids = malloc(sizeof(uint32_t) * (n ? n : 1));
  if (!ids) {
    printf("out of memory\n");
    exit(1);
  }
  for (uint32_t i = 0; i < n; i++)
    ids[i] = i;
  for (uint32_t i = n; i > 1; i--) {
    uint32_t j = (uint32_t)(next_rand() % i), t = ids[i - 1];
    ids[i - 1] = ids[j];
    ids[j] = t;
  }
  return ids;
}

typedef struct {
  uint32_t dtype, batch, len, heads, kvh, dim;
} bench_cfg;

/* Time of the last fp16 row, by shape, for the quantized rows' ratio. */
static bench_cfg fp16_cfg;
static float fp16_ms;

static void run_cfg(const bench_cfg *c, int reps, int one_pass, double copy_bw,
                    double peak) {
  kvs_layout l = {.block_size = 16, .num_layers = 2,
                  .num_kv_heads = c->kvh, .head_dim = c->dim,
                  .dtype = c->dtype};
  uint32_t B = shrunk_batch(c->batch), len = shrunk_len(c->len, 8);
  uint32_t mb = (len + l.block_size - 1) / l.block_size;
  l.num_blocks = B * mb;
  if (kvs_layout_finish(&l)) {
    printf("layout refused\n");
    exit(1);
  }
  uint32_t *tables = shuffled_ids(l.num_blocks);
  uint32_t *lens = malloc(sizeof(uint32_t) * B);
  for (uint32_t s = 0; s < B; s++)
    lens[s] = len;
  /* q/out in the cache dtype, fp16 for int8/fp8 */
  uint32_t qo = kvs_dtype_quantized(l.dtype) ? KVS_DTYPE_FP16 : l.dtype;
  size_t qbytes = (size_t)B * c->heads * l.head_dim * kvs_dtype_size(qo);
  void *d_pool, *d_q, *d_out, *d_tab, *d_lens, *d_ws = NULL;
  CU(kvs_cuda_malloc(&d_pool, kvs_pool_bytes(&l)));
  fill_random(d_pool, kvs_pool_bytes(&l));
  CU(kvs_cuda_malloc(&d_q, qbytes));
  fill_random(d_q, qbytes);
  CU(kvs_cuda_malloc(&d_out, qbytes));
  CU(kvs_cuda_malloc(&d_tab, sizeof(uint32_t) * l.num_blocks));
  CU(kvs_cuda_memcpy_htod(d_tab, tables, sizeof(uint32_t) * l.num_blocks));
  CU(kvs_cuda_malloc(&d_lens, sizeof(uint32_t) * B));
  CU(kvs_cuda_memcpy_htod(d_lens, lens, sizeof(uint32_t) * B));
  kvs_attn_args a;
  memset(&a, 0, sizeof a);
  CU(kvs_paged_kv_init(&a.kv, d_pool, &l, 1));
  a.out = d_out;
  a.q = d_q;
  a.seq_lens = d_lens;
  a.block_tables = d_tab;
  a.num_seqs = a.num_rows = B;
  a.num_heads = c->heads;
  a.max_blocks_per_seq = mb;
  a.max_seq_len = len;
  a.qo_dtype = qo;
  a.scale = 0.088f;
  uint64_t wsb = kvs_attn_workspace_bytes(&a);
  if (wsb)
    CU(kvs_cuda_malloc(&d_ws, wsb));
  double kv_bytes = 2.0 * B * len * l.num_kv_heads *
                    ((double)l.head_dim * kvs_dtype_size(l.dtype) +
                     4.0 * kvs_scale_floats(l.dtype));
  for (int split = 1; split >= 0; split--) {
    if (split && !wsb)
      continue;
    if (!split && !one_pass)
      continue; /* the one-pass path, for two configurations only */
    a.workspace = split ? d_ws : NULL;
    a.workspace_bytes = split ? wsb : 0;
    float ms = median_ms(do_decode, &a, reps);
    double bw = kv_bytes / (ms * 1e-3) / 1e9;
    /* "ws": a split workspace was given; "parts": what the launcher made of
     * it (1: the rows were not split after all). */
    /* tokens/s against the fp16 row of the same shape (same split mode) */
    char ratio[16] = "";
    bench_cfg same = *c;
    same.dtype = KVS_DTYPE_FP16;
    if (l.dtype == KVS_DTYPE_FP16 && split) {
      fp16_cfg = *c;
      fp16_ms = ms;
    } else if (kvs_dtype_quantized(l.dtype) && split && fp16_ms > 0 &&
               memcmp(&same, &fp16_cfg, sizeof same) == 0) {
      snprintf(ratio, sizeof ratio, "%.2fx", fp16_ms / ms);
    }
    printf("%-5s %-5u %-6u %-5u %-6u %-4u %-3s %5u %10.1f %10.1f %9.0f %7.0f%% "
           "%7.0f%% %7s\n",
           kvs_dtype_name(l.dtype), B, len, c->heads, l.num_kv_heads,
           l.head_dim, split ? "yes" : "no", kvs__cuda_attn_last_nsplit,
           kv_bytes / (1 << 20), ms * 1e3, bw, 100.0 * bw / copy_bw,
           100.0 * bw / peak, ratio);
  }
  kvs_cuda_free(d_pool);
  kvs_cuda_free(d_q);
  kvs_cuda_free(d_out);
  kvs_cuda_free(d_tab);
  kvs_cuda_free(d_lens);
  kvs_cuda_free(d_ws);
  free(tables);
  free(lens);
}

static int do_prefill(void *arg) {
  return kvs_cuda_prefill_attention(arg, NULL);
}

/* One prefill shape over a cache of dtype (q/out fp16): on the old kernel
 * and on the flash kernel (mma.sync), returning the flash time (ms); or
 * (split) on the flash kernel without and with its split over long
 * prefixes (both given the workspace); or (wg_vs > 0) on the wgmma variant
 * only, against a flash time of wg_vs ms. */
static float run_prefill(uint32_t B, uint32_t prefix, uint32_t qlen, int reps,
                         uint32_t dtype, int split, float wg_vs) {
  const uint32_t H = 32, KVH = 8, D = 128;
  B = shrunk_batch(B);
  prefix = shrunk_len(prefix, split ? 4 : 1);
  qlen = shrunk_len(qlen, split ? 4 : 1);
  kvs_layout l = {.block_size = 16, .num_layers = 2, .num_kv_heads = KVH,
                  .head_dim = D, .dtype = dtype};
  uint32_t len = prefix + qlen, mb = (len + l.block_size - 1) / l.block_size;
  l.num_blocks = B * mb;
  if (kvs_layout_finish(&l)) {
    printf("layout refused\n");
    exit(1);
  }
  uint32_t *tables = shuffled_ids(l.num_blocks);
  uint32_t *lens = malloc(sizeof(uint32_t) * B);
  uint32_t *qs = malloc(sizeof(uint32_t) * (B + 1));
  qs[0] = 0;
  for (uint32_t s = 0; s < B; s++) {
    lens[s] = len;
    qs[s + 1] = qs[s] + qlen;
  }
  uint32_t rows = B * qlen;
  size_t qbytes = (size_t)rows * H * D * 2;
  void *d_pool, *d_q, *d_out, *d_tab, *d_lens, *d_qs, *d_ws = NULL;
  CU(kvs_cuda_malloc(&d_pool, kvs_pool_bytes(&l)));
  fill_random(d_pool, kvs_pool_bytes(&l));
  CU(kvs_cuda_malloc(&d_q, qbytes));
  fill_random(d_q, qbytes);
  CU(kvs_cuda_malloc(&d_out, qbytes));
  CU(kvs_cuda_malloc(&d_tab, sizeof(uint32_t) * l.num_blocks));
  CU(kvs_cuda_memcpy_htod(d_tab, tables, sizeof(uint32_t) * l.num_blocks));
  CU(kvs_cuda_malloc(&d_lens, sizeof(uint32_t) * B));
  CU(kvs_cuda_memcpy_htod(d_lens, lens, sizeof(uint32_t) * B));
  CU(kvs_cuda_malloc(&d_qs, sizeof(uint32_t) * (B + 1)));
  CU(kvs_cuda_memcpy_htod(d_qs, qs, sizeof(uint32_t) * (B + 1)));
  kvs_attn_args a;
  memset(&a, 0, sizeof a);
  CU(kvs_paged_kv_init(&a.kv, d_pool, &l, 1));
  a.out = d_out;
  a.q = d_q;
  a.seq_lens = d_lens;
  a.q_start = d_qs;
  a.block_tables = d_tab;
  a.num_seqs = B;
  a.num_rows = rows;
  a.num_heads = H;
  a.max_blocks_per_seq = mb;
  a.max_seq_len = len;
  a.qo_dtype = KVS_DTYPE_FP16;
  a.scale = 0.088f;
  uint64_t wsb = kvs_attn_workspace_bytes(&a);
  if (wsb && wsb <= (1ull << 30))
    CU(kvs_cuda_malloc(&d_ws, wsb));
  else
    wsb = 0;
  /* keys seen: row i of a request sees prefix + i + 1 */
  double flops = 4.0 * D * H * B *
                 ((double)qlen * prefix + (double)qlen * (qlen + 1) / 2.0);
  float ms[3] = {0.f, 0.f, 0.f};
  uint32_t parts = 1;
  /* k 0: old (or flash without split), 1: flash (mma.sync; with split),
   * 2: flash, its wgmma variant (wg_vs: that one only) */
  for (int k = wg_vs > 0 ? 2 : 0; k < (wg_vs > 0 ? 3 : 2); k++) {
    int flash = split || k;
    kvs__cuda_prefill_flash = flash;
    kvs__cuda_prefill_flash_split = split && k;
    kvs__cuda_prefill_wgmma = k == 2;
    a.workspace = flash && !split ? NULL : d_ws;
    a.workspace_bytes = flash && !split ? 0 : wsb;
    ms[k] = median_ms(do_prefill, &a, reps);
    if (k == split)
      parts = kvs__cuda_attn_last_nsplit;
    if ((flash && kvs__cuda_attn_last_flash != 1) ||
        (int)kvs__cuda_attn_last_wg != (k == 2)) {
      printf("(the %s kernel did not run)\n", k == 2 ? "wgmma" : "flash");
      if (shrink > 1)
        exit(1);
    }
  }
  kvs__cuda_prefill_flash = 0;
  kvs__cuda_prefill_flash_split = 1;
  kvs__cuda_prefill_wgmma = 1;
  const int f = wg_vs > 0 ? 2 : 1; /* the flash time printed */
  double tf = flops / (ms[f] * 1e-3) / 1e12;
  char pk[16] = "-";
  if (tc_peak > 0)
    snprintf(pk, sizeof pk, "%.1f%%", 100.0 * tf / tc_peak);
  if (wg_vs > 0)
    printf("%-5s %-5u %-6u %-6u %-5u %-4u %-4u %11.1f %11.1f %8.1f %6s %7.2fx\n",
           kvs_dtype_name(dtype), B, prefix, qlen, H, KVH, D, wg_vs * 1e3, ms[2] * 1e3, tf,
           pk, wg_vs / ms[2]);
  else
    printf("%-5s %-5u %-6u %-6u %-5u %-4u %-4u %5u %11.1f %8.1f %11.1f %8.1f %6s %7.1fx\n",
           kvs_dtype_name(dtype), B, prefix, qlen, H, KVH, D, parts, ms[0] * 1e3,
           flops / (ms[0] * 1e-3) / 1e12, ms[1] * 1e3, tf, pk, ms[0] / ms[1]);
  kvs_cuda_free(d_pool);
  kvs_cuda_free(d_q);
  kvs_cuda_free(d_out);
  kvs_cuda_free(d_tab);
  kvs_cuda_free(d_lens);
  kvs_cuda_free(d_qs);
  kvs_cuda_free(d_ws);
  free(tables);
  free(lens);
  free(qs);
  return ms[f];
}

static void run_prefills(int reps) {
  printf("\nprefill, fp16, causal over the cached prefix and the new tokens "
         "(old kernel: parts = its split; flash: no split):\n");
  printf("%-5s %-5s %-6s %-6s %-5s %-4s %-4s %5s %11s %8s %11s %8s %6s %8s\n", "cache",
         "batch", "prefix", "new", "heads", "kvh", "D", "parts", "old us", "TFLOP/s",
         "flash us", "TFLOP/s", "%peak", "speedup");
  static const uint32_t shapes[][3] = {
      {4, 0, 2048}, {4, 4096, 512}, {4, 8192, 2048}, {16, 1024, 256}};
  int pr = reps / 10 > 0 ? reps / 10 : 1;
  /* the fp16 rows the wgmma variant is timed on last: shapes, then chunks */
  enum { N_WG = 4 + 7 };
  uint32_t wg_rows[N_WG][3];
  float wg_flash[N_WG];
  int nw = 0;
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++, nw++) {
    memcpy(wg_rows[nw], shapes[i], sizeof wg_rows[nw]);
    wg_flash[nw] = run_prefill(shapes[i][0], shapes[i][1], shapes[i][2], pr,
                               KVS_DTYPE_FP16, 0, 0.f);
  }
  printf("chunk sweep (batch 4, prefix 0):\n");
  for (uint32_t q = 128; q <= 8192; q *= 2, nw++) {
    wg_rows[nw][0] = 4;
    wg_rows[nw][1] = 0;
    wg_rows[nw][2] = q;
    wg_flash[nw] = run_prefill(4, 0, q, pr, KVS_DTYPE_FP16, 0, 0.f);
  }
  printf("int8 and fp8 caches (q/out fp16; pools of random bytes), the same "
         "shapes:\n");
  for (uint32_t dt = KVS_DTYPE_INT8; dt <= KVS_DTYPE_FP8; dt++)
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
      run_prefill(shapes[i][0], shapes[i][1], shapes[i][2], pr, dt, 0, 0.f);
  printf("long prefixes, few new rows: the flash kernel without its split "
         "(\"old\" columns) and with it (parts = its splits):\n");
  static const uint32_t longs[][3] = {
      {1, 16384, 512}, {1, 32768, 128}, {2, 65536, 64}, {4, 8192, 256}};
  for (size_t i = 0; i < sizeof longs / sizeof longs[0]; i++)
    run_prefill(longs[i][0], longs[i][1], longs[i][2], pr, KVS_DTYPE_FP16, 1, 0.f);
  run_prefill(1, 32768, 128, pr, KVS_DTYPE_INT8, 1, 0.f);
  if (dev_cc != 90) {
    printf("wgmma variant: not on this GPU (compute capability %d.%d; it runs on "
           "9.0 only)\n", dev_cc / 10, dev_cc % 10);
    return;
  }
  printf("the flash kernel's wgmma variant (sm_90a), fp16, the shapes and the chunk "
         "sweep again (flash us: the mma.sync time of the row above):\n");
  printf("%-5s %-5s %-6s %-6s %-5s %-4s %-4s %11s %11s %8s %6s %8s\n", "cache", "batch",
         "prefix", "new", "heads", "kvh", "D", "flash us", "wgmma us", "TFLOP/s", "%peak",
         "x flash");
  for (int i = 0; i < nw; i++)
    run_prefill(wg_rows[i][0], wg_rows[i][1], wg_rows[i][2], pr, KVS_DTYPE_FP16, 0,
                wg_flash[i]);
}

int main(int argc, char **argv) {
  int reps = argc > 1 ? atoi(argv[1]) : 20;
  const char *why;
  if (strcmp(argc > 2 ? argv[2] : "", "smoke") == 0) {
    shrink = 64;
    reps = 1;
  }
  if (kvs_cuda_available(&why)) {
    printf("bench_attention_gpu: skipped: no GPU (%s)\n", why);
    return 0;
  }
  CU(kvs_cuda_open(NULL));
  if (strstr(kvs_cuda_device_name(), "stand-in") && shrink == 1) {
    printf("bench_attention_gpu: skipped: no GPU (%s)\n",
           kvs_cuda_device_name());
    return 0;
  }
  int clk = 0, bus = 0, sms = 0;
  CU(kvs_cuda_device_info(&clk, &bus, &sms));
  double peak = 2.0 * clk * 1e3 * bus / 8.0 / 1e9; /* GB/s, DDR */
  printf("device: %s (%s), %d SMs, nominal memory bandwidth %.0f GB/s\n",
         kvs_cuda_device_name(), kvs_cuda_device_uuid(), sms, peak);
  int smclk = 0, ccmaj = 0, ccmin = 0;
  CU(kvs__cuda_device_compute(&smclk, &ccmaj, &ccmin));
  int fpc = ccmaj == 8 && ccmin == 0 ? 2048 : ccmaj == 9 && ccmin == 0 ? 4096 : 0;
  tc_peak = (double)sms * fpc * smclk * 1e3 / 1e12;
  dev_cc = 10 * ccmaj + ccmin;
  if (fpc)
    printf("sm_%d%d: dense fp16 tensor-core peak %.0f TFLOP/s (%d SMs x %d "
           "flops/clock x %.0f MHz)\n", ccmaj, ccmin, tc_peak, sms, fpc,
           smclk / 1e3);
  else
    printf("sm_%d%d, %.0f MHz: no tensor-core peak known here (%%peak: -)\n",
           ccmaj, ccmin, smclk / 1e3);

  /* Baseline: a large device-to-device copy, bytes read + written. */
  size_t cbytes = (1ull << 30) / shrink;
  void *ca, *cb;
  CU(kvs_cuda_malloc(&ca, cbytes));
  CU(kvs_cuda_malloc(&cb, cbytes));
  CU(kvs_cuda_memset(ca, 0x5a, cbytes));
  copy_job cj = {ca, cb, cbytes};
  float cms = median_ms(do_copy, &cj, 5);
  double copy_bw = 2.0 * cbytes / (cms * 1e-3) / 1e9;
  printf("device-to-device copy (1 GiB, read+write): %.0f GB/s = %.0f%% of nominal\n",
         copy_bw, 100.0 * copy_bw / peak);
  CU(kvs_cuda_free(ca));
  CU(kvs_cuda_free(cb));
  /* the decode kernel's rows (int8/fp8 at GQA >= 4 would default to the
   * flash kernel: a section of their own below) */
  kvs__cuda_decode_flash = 0;

  if (strcmp(argc > 2 ? argv[2] : "", "prefill") == 0) {
    run_prefills(reps);
    return 0;
  }
  printf("\n%-5s %-5s %-6s %-5s %-6s %-4s %-3s %5s %10s %10s %9s %8s %8s %7s\n",
         "kv", "batch", "seqlen", "heads", "kvh", "D", "ws", "parts", "KV MiB",
         "time us", "GB/s", "%copy", "%nominal", "x fp16");

  static const bench_cfg cfg[] = {
      {KVS_DTYPE_FP16, 16, 2048, 32, 8, 128},
      {KVS_DTYPE_FP16, 16, 4096, 32, 8, 128},
      {KVS_DTYPE_FP16, 32, 4096, 32, 8, 128},
      {KVS_DTYPE_FP16, 64, 2048, 32, 8, 128},
      {KVS_DTYPE_FP16, 16, 8192, 32, 8, 128},
      {KVS_DTYPE_FP16, 64, 8192, 32, 8, 128},
      {KVS_DTYPE_BF16, 32, 4096, 32, 8, 128},
      {KVS_DTYPE_FP32, 32, 4096, 32, 8, 128},
      {KVS_DTYPE_FP16, 32, 4096, 32, 32, 128}, /* MHA */
      {KVS_DTYPE_FP16, 32, 4096, 64, 8, 128},  /* GQA 8 */
      {KVS_DTYPE_FP16, 32, 4096, 32, 4, 64},
      /* quantized caches, each after the fp16 row of its shape */
      {KVS_DTYPE_FP16, 32, 4096, 32, 8, 128},
      {KVS_DTYPE_INT8, 32, 4096, 32, 8, 128},
      {KVS_DTYPE_FP8, 32, 4096, 32, 8, 128},
      {KVS_DTYPE_FP16, 16, 8192, 32, 8, 128},
      {KVS_DTYPE_INT8, 16, 8192, 32, 8, 128},
      {KVS_DTYPE_FP8, 16, 8192, 32, 8, 128},
      {KVS_DTYPE_FP16, 32, 4096, 64, 8, 128}, /* GQA 8 */
      {KVS_DTYPE_INT8, 32, 4096, 64, 8, 128},
      {KVS_DTYPE_FP8, 32, 4096, 64, 8, 128},
      /* GQA 2 and 1: where the decode kernel keeps int8/fp8 by default
       * (kvs__cuda_decode_flash = 4), unmeasured on the flash kernel */
      {KVS_DTYPE_FP16, 32, 4096, 32, 16, 128},
      {KVS_DTYPE_INT8, 32, 4096, 32, 16, 128},
      {KVS_DTYPE_FP8, 32, 4096, 32, 16, 128},
      {KVS_DTYPE_FP16, 16, 4096, 32, 32, 128}, /* MHA */
      {KVS_DTYPE_INT8, 16, 4096, 32, 32, 128},
      {KVS_DTYPE_FP8, 16, 4096, 32, 32, 128},
  };
  const char *mode = argc > 2 ? argv[2] : "";
  if (strcmp(mode, "profile") == 0) {
    run_cfg(&cfg[2], reps, 0, copy_bw, peak);
    return 0;
  }
  enum { BASE_ROWS = 11 }; /* b994ecf's rows: cfg[0 .. BASE_ROWS - 1] */
  if (strcmp(mode, "ncu") == 0) {
    once = 1;
    run_prefill(4, 0, 2048, 1, KVS_DTYPE_FP16, 0, 0.f);
    if (dev_cc == 90)
      run_prefill(4, 0, 2048, 1, KVS_DTYPE_FP16, 0, 1.f);
    /* cfg[BASE_ROWS ..]: fp16, int8, fp8 at 32 x 4096; the quantized ones
     * on the decode kernel, then on the flash kernel */
    for (int df = 0; df < 2; df++) {
      kvs__cuda_decode_flash = df;
      for (int i = df; i < 3; i++)
        run_cfg(&cfg[BASE_ROWS + i], 1, 1, copy_bw, peak);
    }
    kvs__cuda_decode_flash = 0;
    return 0;
  }
  if (strcmp(mode, "decode") == 0) {
    for (size_t ci = 0; ci < BASE_ROWS; ci++)
      run_cfg(&cfg[ci], reps, ci == 0 || ci == 2, copy_bw, peak);
    return 0;
  }
  for (size_t ci = 0; ci < sizeof cfg / sizeof cfg[0]; ci++)
    run_cfg(&cfg[ci], reps, ci == 0 || ci == 2, copy_bw, peak);
  /* the quantized rows again with decode over int8/fp8 on the flash
   * kernel, each after its fp16 row (which keeps the decode kernel) */
  printf("int8/fp8 decode on the flash kernel (kvs__cuda_decode_flash = 1), "
         "each after its fp16 row:\n");
  kvs__cuda_decode_flash = 1;
  for (size_t ci = BASE_ROWS; ci < sizeof cfg / sizeof cfg[0]; ci++) {
    run_cfg(&cfg[ci], reps, 0, copy_bw, peak);
    if (kvs_dtype_quantized(cfg[ci].dtype) && kvs__cuda_attn_last_flash != 1) {
      printf("(the flash kernel did not run)\n");
      if (shrink > 1)
        exit(1);
    }
  }
  kvs__cuda_decode_flash = 0;
  if (strcmp(mode, "sweep") == 0) {
    static const int bps[] = {2, 4, 8, 16};
    for (size_t i = 0; i < sizeof bps / sizeof bps[0]; i++) {
      kvs__cuda_attn_blocks_per_sm = bps[i];
      printf("split aiming at %d blocks per SM (default: whole waves):\n", bps[i]);
      run_cfg(&cfg[0], reps, 0, copy_bw, peak);
      run_cfg(&cfg[2], reps, 0, copy_bw, peak);
      run_cfg(&cfg[5], reps, 0, copy_bw, peak);
    }
    kvs__cuda_attn_blocks_per_sm = 0;
    kvs__cuda_attn_mma = 0;
    printf("CUDA-core kernel only (default: tensor cores for GQA >= 4, 16-bit):\n");
    run_cfg(&cfg[2], reps, 0, copy_bw, peak);
    run_cfg(&cfg[5], reps, 0, copy_bw, peak);
    run_cfg(&cfg[6], reps, 0, copy_bw, peak);
    run_cfg(&cfg[9], reps, 0, copy_bw, peak);
    run_cfg(&cfg[10], reps, 0, copy_bw, peak);
    kvs__cuda_attn_mma = 1;
    kvs__cuda_attn_max_group = 4;
    printf("query heads per block capped at 4 (default 8):\n");
    run_cfg(&cfg[9], reps, 0, copy_bw, peak);
    run_cfg(&cfg[10], reps, 0, copy_bw, peak);
    kvs__cuda_attn_max_group = 8;
  }
  run_prefills(reps);
  printf("\n%%copy: against the device-to-device copy above (read+write bytes);"
         " %%nominal: against %.0f GB/s; x fp16: tokens/s against the fp16 row of"
         " the same shape (split workspace given to both).\n", peak);
  return 0;
}
