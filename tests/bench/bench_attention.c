/*
 * bench_attention.c — CPU paged decode attention (the C twin, one thread):
 * GB/s of K/V read, beside memcpy bandwidth measured in the same run.
 *
 *   bench_attention [quick|sweep] [portable] [row=N] [prefetch=0|1|2]
 *
 * quick: fewer runs, no row longer than 4096.  sweep: the long-sequence rows
 * again under the other settings (AVX2 and portable bodies, prefetch off,
 * into L2, into L1).  portable: the portable C body even where the AVX2 one
 * runs.  row=N: only the table's row N (for perf).  prefetch: the
 * kvs__cpu_prefetch knob (default 1, the library's).
 *
 * Bytes counted for attention: every K and V element of every request's keys,
 * read once.  memcpy: bytes copied per second (each byte is read once and
 * written once) over buffers far larger than the caches, one thread.  The
 * ratio is attention GB/s over memcpy GB/s; the target is >= 0.5 for long
 * sequences.  Times are medians of several runs, in CPU time of the thread
 * (both memcpy and attention), so that other processes on a shared machine
 * do not count.
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

static double memcpy_gbs(size_t bytes, int runs) {
  char *a = malloc(bytes), *b = malloc(bytes);
  if (!a || !b)
    exit(2);
  memset(a, 1, bytes);
  memset(b, 2, bytes);
  double t[9];
  for (int i = 0; i < runs; i++) {
    double t0 = now();
    memcpy(i % 2 ? a : b, i % 2 ? b : a, bytes);
    t[i] = now() - t0;
  }
  qsort(t, runs, sizeof t[0], cmp_double);
  volatile char sink = a[bytes / 2] + b[bytes / 3];
  (void)sink;
  free(a);
  free(b);
  return bytes / t[runs / 2] / 1e9;
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
    else if (strncmp(argv[i], "row=", 4) == 0)
      only = strtol(argv[i] + 4, NULL, 10);
    else if (strncmp(argv[i], "prefetch=", 9) == 0)
      kvs__cpu_prefetch = atoi(argv[i] + 9);
    else {
      fprintf(stderr, "usage: bench_attention [quick|sweep] [portable] "
                      "[row=N] [prefetch=0|1|2]\n");
      return 2;
    }
  }
  int runs = quick ? 3 : 7;
  double mc = memcpy_gbs(quick ? (128u << 20) : (512u << 20), runs);
  printf("memcpy (one thread, %s MiB buffers): %.2f GB/s copied\n",
         quick ? "128" : "512", mc);
  printf("attention body: %s, prefetch %d\n",
         kvs__cpu_attn_portable || !kvs__cpu_attn_simd() ? "portable C"
                                                          : "AVX2+FMA+F16C",
         kvs__cpu_prefetch);
  printf("\n%-5s %-5s %-6s %-5s %-4s %-4s %9s %9s %8s %8s\n", "kv", "batch",
         "seqlen", "heads", "kvh", "D", "KV MiB", "ms", "GB/s", "x memcpy");
  static const struct {
    uint32_t dtype, batch, len, heads, kvh, dim;
  } cfg[] = {
      {KVS_DTYPE_FP32, 4, 256, 32, 8, 128},  {KVS_DTYPE_FP32, 4, 4096, 8, 8, 128},
      {KVS_DTYPE_FP32, 4, 4096, 32, 8, 128}, {KVS_DTYPE_BF16, 4, 4096, 32, 8, 128},
      {KVS_DTYPE_FP16, 4, 4096, 32, 8, 128}, {KVS_DTYPE_FP16, 4, 4096, 8, 8, 128},
      {KVS_DTYPE_FP32, 2, 16384, 32, 8, 128}, {KVS_DTYPE_BF16, 4, 4096, 64, 8, 128},
      {KVS_DTYPE_FP16, 4, 4096, 64, 8, 128},  {KVS_DTYPE_BF16, 4, 256, 32, 8, 128},
      {KVS_DTYPE_BF16, 4, 256, 64, 8, 128},
  };
  size_t ncfg = sizeof cfg / sizeof cfg[0];
  /* sweep: the long rows again under each other setting. */
  const int base_portable = kvs__cpu_attn_portable, base_pf = kvs__cpu_prefetch;
  static const struct {
    int portable, prefetch;
  } var[] = {{0, 0}, {0, 1}, {0, 2}, {1, 0}, {1, 1}};
  size_t nvar = sweep ? 1 + sizeof var / sizeof var[0] : 1;
  for (size_t ci = 0; ci < nvar * ncfg; ci++) {
    if (ci % ncfg == 0 && ci > 0) {
      size_t vi = ci / ncfg - 1;
      if (var[vi].portable == base_portable && var[vi].prefetch == base_pf) {
        ci += ncfg - 1;
        continue;
      }
      kvs__cpu_attn_portable = var[vi].portable;
      kvs__cpu_prefetch = var[vi].prefetch;
      printf("%s body, prefetch %d:\n",
             var[vi].portable ? "portable" : "AVX2", var[vi].prefetch);
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
    /* Values in [-1, 1) in the cache dtype (no subnormals, no NaN). */
    size_t es = kvs_dtype_size(l.dtype);
    for (uint64_t i = 0; i < pool_bytes / es; i++) {
      float f = (float)((double)(next_rand() >> 11) * 0x1p-52 * 2.0 - 1.0);
      kvs_convert((char *)pool + i * es, l.dtype, &f, KVS_DTYPE_FP32, 1);
    }
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
    double t[9];
    kvs_cpu_decode_attention(&a, NULL); /* warm-up */
    for (int i = 0; i < runs; i++) {
      double t0 = now();
      if (kvs_cpu_decode_attention(&a, NULL))
        return 1;
      t[i] = now() - t0;
    }
    qsort(t, runs, sizeof t[0], cmp_double);
    double kv = 2.0 * B * len * l.num_kv_heads * l.head_dim *
                kvs_dtype_size(l.dtype);
    double gbs = kv / t[runs / 2] / 1e9;
    printf("%-5s %-5u %-6u %-5u %-4u %-4u %9.1f %9.2f %8.2f %8.2f\n",
           kvs_dtype_name(l.dtype), B, len, cfg[ci % ncfg].heads, l.num_kv_heads,
           l.head_dim, kv / (1 << 20), t[runs / 2] * 1e3, gbs, gbs / mc);
    free(pool);
    free(tables);
    free(lens);
    free(q);
    free(out);
  }
  return 0;
}
