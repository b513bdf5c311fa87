/*
 * bench_attention.c — CPU paged decode attention (the C twin, one thread):
 * GB/s of K/V read, beside memcpy bandwidth measured in the same run.
 *
 *   bench_attention [quick|sweep] [portable|avx2] [row=N] [prefetch=0|1|2]
 *
 * quick: fewer runs, no row longer than 4096.  sweep: the long-sequence rows
 * again under the other settings (AVX2 and portable bodies, prefetch off,
 * into L2, into L1).  portable: the portable C body even where a vector one
 * runs; avx2: the AVX2 body even where the AVX-512 one runs.  row=N: only the table's row N (for perf).  prefetch: the
 * kvs__cpu_prefetch knob (default -1: each body's own choice).
 *
 * Bytes counted for attention: every K and V element of every request's keys,
 * read once, and for int8/fp8 caches the float32 scales (and int8 minimums)
 * of every one of their rows, which the kernel reads too.  memcpy: bytes
 * copied per second (each byte is read once and written once) over buffers
 * far larger than the caches, one thread.  The
 * ratio is attention GB/s over memcpy GB/s; the target is >= 0.5 for long
 * sequences.
 *
 * The baseline is measured beside every attention run, not once: on a
 * shared VM memory bandwidth drifts by a third within a minute (13 to 19
 * GB/s seen in three runs of one binary), so a memcpy taken at the start
 * says little about a row timed later.  Each row runs `runs` rounds of
 * (memcpy, attention, memcpy); a round's ratio is its attention GB/s over
 * the mean of the two memcpy figures around it; the row reports the median
 * ratio and the lowest and highest.  Times are in CPU time of the thread,
 * so that other processes on the machine do not count (stalls on memory
 * do).  The header names the CPU and the body that ran.
 *
 * int8/fp8 rows also say how many keys per second they attend against the
 * fp16 row of the same shape earlier in the same run ("x fp16": keys per
 * second over the memcpy around them, median, int8/fp8 over fp16, so that
 * the drift between the two rows does not count).  Those shapes hold
 * 132-256 MiB of K/V, several times the L3.  Their caches are written by
 * the write kernel from fp32 values in [-1, 1), timed: a line under the
 * row gives its time over a memcpy of the same fp32 sources beside each
 * of its calls (the int8 rotation and the quantizing are compute).  The
 * last three rows repeat that GQA 4 shape with 2 x 256 keys, 1-2 MiB, in
 * cache (a round times 100 calls, the ms are one call's): their x memcpy
 * is how fast the body computes when memory does not stall it, the
 * ceiling of the long rows.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu/kvs_kernels.h"
#include "gpu/kvs_kernels_int.h"

/* CPU time of this thread: on a shared machine the time other processes
 * hold the core does not count (stalls on memory do). */
static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static uint64_t rng = 4242;
static uint64_t next_rand(void) {
  uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* The memcpy baseline: two buffers far larger than the caches. */
static char *mc_a, *mc_b;
static size_t mc_bytes;
static int mc_flip;

static double memcpy_once(void) {
  double t0 = now();
  memcpy(mc_flip ? mc_a : mc_b, mc_flip ? mc_b : mc_a, mc_bytes);
  double t = now() - t0;
  mc_flip ^= 1;
  volatile char sink = mc_a[mc_bytes / 2] + mc_b[mc_bytes / 3];
  (void)sink;
  return mc_bytes / t / 1e9;
}

/* The write kernel's time over the last fill_pool, and a memcpy's of the
 * same fp32 source bytes (K and V) beside each of its calls. */
static double fill_write_s, fill_memcpy_s;

/* Fill layer `layer` of every block of a pool: values in [-1, 1) in the
 * cache dtype (no subnormals, no NaN); int8/fp8 through the write kernel,
 * which also writes the rows' scales (timed: fill_write_s). */
static int fill_pool(void *pool, const kvs_layout *l, uint32_t layer) {
  size_t es = kvs_dtype_size(l->dtype);
  if (!kvs_dtype_quantized(l->dtype)) {
    for (uint64_t i = 0; i < kvs_pool_bytes(l) / es; i++) {
      float f = (float)((double)(next_rand() >> 11) * 0x1p-52 * 2.0 - 1.0);
      kvs_convert((char *)pool + i * es, l->dtype, &f, KVS_DTYPE_FP32, 1);
    }
    return 0;
  }
  const uint32_t row = l->num_kv_heads * l->head_dim, chunk = 4096;
  float *k = malloc(sizeof(float) * row * chunk);
  float *v = malloc(sizeof(float) * row * chunk);
  float *cp = malloc(2 * sizeof(float) * row * chunk);
  int64_t *slots = malloc(sizeof(int64_t) * chunk);
  uint64_t total = (uint64_t)l->num_blocks * l->block_size;
  int rc = !k || !v || !cp || !slots;
  fill_write_s = fill_memcpy_s = 0;
  kvs_write_args w = {.k = k, .v = v, .slots = slots, .src_token_stride = row,
                      .src_dtype = KVS_DTYPE_FP32};
  rc = rc || kvs_paged_kv_init(&w.kv, pool, l, layer);
  for (uint64_t t0 = 0; !rc && t0 < total; t0 += chunk) {
    w.num_tokens = (uint32_t)(total - t0 < chunk ? total - t0 : chunk);
    for (uint32_t i = 0; i < w.num_tokens; i++)
      slots[i] = (int64_t)(t0 + i);
    for (size_t i = 0; i < (size_t)row * w.num_tokens; i++) {
      k[i] = (float)((double)(next_rand() >> 11) * 0x1p-52 * 2.0 - 1.0);
      v[i] = (float)((double)(next_rand() >> 11) * 0x1p-52 * 2.0 - 1.0);
    }
    const size_t bytes = sizeof(float) * row * w.num_tokens;
    double tc = now();
    memcpy(cp, k, bytes);
    memcpy(cp + (size_t)row * chunk, v, bytes);
    double t1 = now();
    rc = kvs_cpu_write_kv(&w, NULL);
    fill_write_s += now() - t1;
    fill_memcpy_s += t1 - tc;
  }
  free(k);
  free(v);
  free(cp);
  free(slots);
  return rc;
}

/* The CPU, from /proc/cpuinfo (model name, family and model). */
static void cpu_name(char *out, size_t n) {
  FILE *f = fopen("/proc/cpuinfo", "r");
  char line[256], model[128] = "?";
  int fam = -1, mod = -1;
  while (f && fgets(line, sizeof line, f)) {
    char *v = strchr(line, ':');
    if (!v)
      continue;
    v += 2;
    v[strcspn(v, "\n")] = '\0';
    if (!strncmp(line, "model name", 10) && model[0] == '?')
      snprintf(model, sizeof model, "%s", v);
    else if (!strncmp(line, "cpu family", 10) && fam < 0)
      fam = atoi(v);
    else if (!strncmp(line, "model\t", 6) && mod < 0)
      mod = atoi(v);
  }
  if (f)
    fclose(f);
  snprintf(out, n, "%s (family %d, model %d)", model, fam, mod);
}

int main(int argc, char **argv) {
  int quick = 0, sweep = 0;
  long only = -1;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "quick") == 0)
      quick = 1;
    else if (strcmp(argv[i], "sweep") == 0)
      sweep = 1;
    else if (strcmp(argv[i], "portable") == 0)
      kvs__cpu_attn_portable = 1;
    else if (strcmp(argv[i], "avx2") == 0)
      kvs__cpu_attn_avx512 = 0;
    else if (strncmp(argv[i], "row=", 4) == 0)
      only = strtol(argv[i] + 4, NULL, 10);
    else if (strncmp(argv[i], "prefetch=", 9) == 0)
      kvs__cpu_prefetch = atoi(argv[i] + 9);
    else {
      fprintf(stderr, "usage: bench_attention [quick|sweep] [portable|avx2] "
                      "[row=N] [prefetch=0|1|2]\n");
      return 2;
    }
  }
  int runs = quick ? 3 : 7;
  char cpu[200];
  cpu_name(cpu, sizeof cpu);
  mc_bytes = (size_t)256 << 20;
  mc_a = malloc(mc_bytes);
  mc_b = malloc(mc_bytes);
  if (!mc_a || !mc_b)
    return 2;
  memset(mc_a, 1, mc_bytes);
  memset(mc_b, 2, mc_bytes);
  printf("cpu: %s\n", cpu);
  printf("attention body: %s, prefetch %d; memcpy of 256 MiB around every "
         "run, %d rounds a row\n", kvs__cpu_attn_body(), kvs__cpu_prefetch,
         runs);
  printf("\n%-5s %-5s %-6s %-5s %-4s %-4s %7s %8s %7s %7s %8s %11s %6s\n",
         "kv", "batch", "seqlen", "heads", "kvh", "D", "KV MiB", "ms", "GB/s",
         "memcpy", "x memcpy", "(min-max)", "x fp16");
  static const struct {
    uint32_t dtype, batch, len, heads, kvh, dim;
  } cfg[] = {
      {KVS_DTYPE_FP32, 4, 256, 32, 8, 128},  {KVS_DTYPE_FP32, 4, 4096, 8, 8, 128},
      {KVS_DTYPE_FP32, 4, 4096, 32, 8, 128}, {KVS_DTYPE_BF16, 4, 4096, 32, 8, 128},
      {KVS_DTYPE_FP16, 4, 4096, 32, 8, 128}, {KVS_DTYPE_FP16, 4, 4096, 8, 8, 128},
      {KVS_DTYPE_FP32, 2, 16384, 32, 8, 128}, {KVS_DTYPE_BF16, 4, 4096, 64, 8, 128},
      {KVS_DTYPE_FP16, 4, 4096, 64, 8, 128},  {KVS_DTYPE_BF16, 4, 256, 32, 8, 128},
      {KVS_DTYPE_BF16, 4, 256, 64, 8, 128},
      /* int8/fp8 against fp16: 132-256 MiB of K/V, several times the L3 */
      {KVS_DTYPE_FP16, 16, 4096, 32, 8, 128}, {KVS_DTYPE_INT8, 16, 4096, 32, 8, 128},
      {KVS_DTYPE_FP8, 16, 4096, 32, 8, 128},  {KVS_DTYPE_FP16, 16, 4096, 64, 8, 128},
      {KVS_DTYPE_INT8, 16, 4096, 64, 8, 128}, {KVS_DTYPE_FP8, 16, 4096, 64, 8, 128},
      /* the same GQA 4 in cache (1-2 MiB of K/V; rows of 512 keys or
       * fewer time 100 calls a round): how fast each body computes when
       * memory does not stall it */
      {KVS_DTYPE_FP16, 2, 256, 32, 8, 128}, {KVS_DTYPE_INT8, 2, 256, 32, 8, 128},
      {KVS_DTYPE_FP8, 2, 256, 32, 8, 128},
  };
  size_t ncfg = sizeof cfg / sizeof cfg[0];
  /* each row's median x memcpy per key, in the current setting (0: not
   * run): int8/fp8 rows compare theirs with fp16's */
  double row_keys[sizeof cfg / sizeof cfg[0]] = {0};
  /* sweep: the long rows again under each other setting. */
  const int base_portable = kvs__cpu_attn_portable, base_pf = kvs__cpu_prefetch;
  const int base_512 = kvs__cpu_attn_avx512;
  static const struct {
    int portable, avx512, prefetch;
  } var[] = {{0, 1, 0}, {0, 1, 1}, {0, 1, 2}, {0, 0, 0},
             {0, 0, 1}, {0, 0, 2}, {1, 0, 0}, {1, 0, 1}};
  size_t nvar = sweep ? 1 + sizeof var / sizeof var[0] : 1;
  for (size_t ci = 0; ci < nvar * ncfg; ci++) {
    if (ci % ncfg == 0 && ci > 0) {
      size_t vi = ci / ncfg - 1;
      kvs__cpu_attn_portable = var[vi].portable;
      kvs__cpu_attn_avx512 = var[vi].avx512;
      kvs__cpu_prefetch = var[vi].prefetch;
      if ((var[vi].avx512 && !kvs__cpu_attn_simd512()) ||
          (var[vi].portable == base_portable && var[vi].avx512 == base_512 &&
           var[vi].prefetch == base_pf)) {
        ci += ncfg - 1;
        continue;
      }
      printf("%s body, prefetch %d:\n", kvs__cpu_attn_body(),
             var[vi].prefetch);
      memset(row_keys, 0, sizeof row_keys);
    }
    uint32_t B = cfg[ci % ncfg].batch, len = cfg[ci % ncfg].len;
    if ((quick && len > 4096) || (ci >= ncfg && len < 4096) ||
        (only >= 0 && ci % ncfg != (size_t)only))
      continue;
    kvs_layout l = {.block_size = 16, .num_layers = 2,
                    .num_kv_heads = cfg[ci % ncfg].kvh, .head_dim = cfg[ci % ncfg].dim,
                    .dtype = cfg[ci % ncfg].dtype};
    uint32_t mb = (len + 15) / 16;
    l.num_blocks = B * mb;
    if (kvs_layout_finish(&l))
      return 1;
    uint64_t pool_bytes = kvs_pool_bytes(&l);
    uint16_t *pool = malloc(pool_bytes);
    uint32_t *tables = malloc(sizeof(uint32_t) * l.num_blocks);
    uint32_t *lens = malloc(sizeof(uint32_t) * B);
    size_t nq = (size_t)B * cfg[ci % ncfg].heads * l.head_dim;
    float *q = malloc(nq * 4), *out = malloc(nq * 4);
    if (!pool || !tables || !lens || !q || !out)
      return 2;
    if (fill_pool(pool, &l, 1))
      return 1;
    for (size_t i = 0; i < nq; i++)
      q[i] = (float)(next_rand() % 1000) / 1000.f - 0.5f;
    for (uint32_t i = 0; i < l.num_blocks; i++)
      tables[i] = i;
    for (uint32_t i = l.num_blocks; i > 1; i--) {
      uint32_t j = (uint32_t)(next_rand() % i), t = tables[i - 1];
      tables[i - 1] = tables[j];
      tables[j] = t;
    }
    for (uint32_t s = 0; s < B; s++)
      lens[s] = len;
    kvs_attn_args a;
    memset(&a, 0, sizeof a);
    kvs_paged_kv_init(&a.kv, pool, &l, 1);
    a.out = out;
    a.q = q;
    a.seq_lens = lens;
    a.block_tables = tables;
    a.num_seqs = a.num_rows = B;
    a.num_heads = cfg[ci % ncfg].heads;
    a.max_blocks_per_seq = mb;
    a.max_seq_len = len;
    a.qo_dtype = KVS_DTYPE_FP32;
    a.scale = 0.088f;
    double t[9], mcs[9], ratio[9];
    double kv = 2.0 * B * len * l.num_kv_heads *
                (l.head_dim * kvs_dtype_size(l.dtype) +
                 4.0 * kvs_scale_floats(l.dtype));
    kvs_cpu_decode_attention(&a, NULL); /* warm-up */
    const uint32_t reps = B * len <= 512 ? 100 : 1; /* calls a round */
    double before = memcpy_once();
    for (int i = 0; i < runs; i++) {
      double t0 = now();
      for (uint32_t r = 0; r < reps; r++)
        if (kvs_cpu_decode_attention(&a, NULL))
          return 1;
      t[i] = (now() - t0) / reps; /* a call's */
      double after = memcpy_once();
      mcs[i] = (before + after) / 2;
      ratio[i] = kv / t[i] / 1e9 / mcs[i];
      before = after;
    }
    qsort(t, runs, sizeof t[0], cmp_double);
    qsort(mcs, runs, sizeof mcs[0], cmp_double);
    qsort(ratio, runs, sizeof ratio[0], cmp_double);
    char range[32];
    snprintf(range, sizeof range, "(%.2f-%.2f)", ratio[0], ratio[runs - 1]);
    double gbs = kv / t[runs / 2] / 1e9;
    row_keys[ci % ncfg] = ratio[runs / 2] / kv * B * len;
    /* the fp16 row of the same shape, when it ran in this setting */
    char vs16[16] = "";
    for (size_t j = 0; kvs_dtype_quantized(l.dtype) && j < ncfg; j++)
      if (cfg[j].dtype == KVS_DTYPE_FP16 && cfg[j].batch == B &&
          cfg[j].len == len && cfg[j].heads == cfg[ci % ncfg].heads &&
          cfg[j].kvh == l.num_kv_heads && cfg[j].dim == l.head_dim &&
          row_keys[j] > 0)
        snprintf(vs16, sizeof vs16, "%.2f",
                 row_keys[ci % ncfg] / row_keys[j]);
    printf("%-5s %-5u %-6u %-5u %-4u %-4u %7.1f %8.2f %7.2f %7.2f %8.2f "
           "%11s %6s\n",
           kvs_dtype_name(l.dtype), B, len, cfg[ci % ncfg].heads,
           l.num_kv_heads, l.head_dim, kv / (1 << 20), t[runs / 2] * 1e3, gbs,
           mcs[runs / 2], ratio[runs / 2], range, vs16);
    if (kvs_dtype_quantized(l.dtype))
      printf("      its write kernel: %.1f ms, %.2fx a memcpy of its fp32 "
             "sources (K and V, the same chunks)\n",
             fill_write_s * 1e3, fill_write_s / fill_memcpy_s);
    free(pool);
    free(tables);
    free(lens);
    free(q);
    free(out);
  }
  free(mc_a);
  free(mc_b);
  return 0;
}
