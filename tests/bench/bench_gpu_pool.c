/*
 * bench_gpu_pool — what sharing the GPU pool costs a worker, each figure
 * beside a baseline measured in the same run on the same GPU:
 *
 *   1. import + map: a worker's kvs_connect to a daemon with a cuda pool of
 *      S bytes (its CUDA context already up, so the time is the handshake,
 *      cuMemImportFromShareableHandle of each chunk, the VA reservation, the
 *      maps and cuMemSetAccess), against cuMemCreate + reserve + map +
 *      access of the same S in the same process (kvs__vmm_create); and the
 *      unmap at kvs_close.  For several pool sizes.
 *   2. decode attention (CUDA, fp16, GQA 8, batch 32 x 4096 tokens) over
 *      the imported pool, against the same kernel over the same bytes
 *      copied into a cuMemAlloc buffer of this process: sharing should cost
 *      nothing (ratio 1 within noise).
 *   3. copy-on-write of 256 blocks: by the daemon's copy engine (a Batch of
 *      256 Appends with daemon_copy, less the same Batch without copies),
 *      and by the worker (kvs_copy_blocks + a stream sync), against
 *      cuMemcpyDtoD of the same blocks; GB/s of block bytes.
 *
 *   bench_gpu_pool [--standin] [--quick]
 *
 * Without a GPU it exits 77 (skipped).  --standin runs it on the stand-in
 * driver (tests/standin/) to check the program itself: those figures are
 * memcpy and the C twins, not a GPU.  Every CUDA call happens in forked
 * workers (CUDA does not survive fork); this process only starts daemons.
 */
#include <math.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpu/kvs_kernels_int.h"
#include "gpu/kvs_vmm.h"
#include "tests/integration/itest.h"

#define BS 16
#define LAYERS 4
#define KVH 8
#define HD 128
#define NH 64 /* GQA 8 */

static int standin, quick;

/* What a worker sends back (shared memory). */
typedef struct result {
  int ok;
  char err[256];
  double connect_ms, close_ms, create_ms, release_ms;
  uint32_t chunks;
  double attn_pool_us, attn_local_us;
  double batch_copy_us, batch_nocopy_us, worker_copy_us, dtod_us;
  uint64_t copy_bytes;
} result;

static result *res;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

#define W(call)                                                              \
  do {                                                                       \
    int rc_ = (call);                                                        \
    if (rc_) {                                                               \
      snprintf(res->err, sizeof res->err, "%s:%d: %s: %s (%s)", __FILE__,    \
               __LINE__, #call, kvs_status_name(rc_),                        \
               c ? kvs_last_message(c) : kvs_last_message(NULL));            \
      _exit(1);                                                              \
    }                                                                        \
  } while (0)

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return v[n / 2];
}

static int attn_fn(void *arg) { return kvs_cuda_decode_attention(arg, NULL); }

/* Median of 5 timings of `reps` calls, in microseconds per call. */
static double time_attention(kvs_attn_args *a, int reps) {
  double t[5];
  float ms;
  kvs_client *c = NULL;
  W(attn_fn(a)); /* warm-up */
  W(kvs_cuda_sync(NULL));
  for (int i = 0; i < 5; i++) {
    W(kvs_cuda_time_ms(NULL, attn_fn, a, reps, &ms));
    t[i] = ms * 1e3 / reps;
  }
  return median(t, 5);
}

/* 2: attention over the imported pool and over a local copy of it. */
static void bench_attention(kvs_client *c) {
  const kvs_layout *l = kvs_layout_of(c);
  uint32_t B = quick || standin ? 4 : 32, len = standin ? 256 : 4096;
  uint32_t nb = len / BS, total = B * nb;
  if (total + 8 > l->num_blocks) {
    snprintf(res->err, sizeof res->err, "pool of %u blocks too small",
             l->num_blocks);
    _exit(1);
  }
  /* Random fp16 in [-1, 1] over the blocks used, through a host buffer. */
  size_t chunk = (size_t)l->block_stride * 64;
  uint16_t *h = malloc(chunk);
  uint64_t rng = 12345;
  for (size_t i = 0; i < chunk / 2; i++) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    h[i] = kvs_float_to_fp16((float)((rng >> 40) % 2001) / 1000.f - 1.f);
  }
  for (uint32_t b = 0; b < total; b += 64) {
    size_t n = (size_t)(total - b < 64 ? total - b : 64) * l->block_stride;
    W(kvs_cuda_memcpy_htod(kvs_block_ptr(c, b), h, n));
  }
  free(h);
  /* Each request's blocks, shuffled over the used ones. */
  uint32_t *tab = malloc(total * sizeof *tab), *lens = malloc(B * 4);
  for (uint32_t i = 0; i < total; i++)
    tab[i] = i;
  for (uint32_t i = total; i > 1; i--) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t j = (uint32_t)((rng >> 33) % i), t = tab[i - 1];
    tab[i - 1] = tab[j];
    tab[j] = t;
  }
  for (uint32_t s = 0; s < B; s++)
    lens[s] = len;
  size_t qn = (size_t)B * NH * HD;
  uint16_t *q = malloc(qn * 2);
  for (size_t i = 0; i < qn; i++)
    q[i] = kvs_float_to_fp16(0.01f * (float)(i % 97));
  void *dq, *dout, *dtab, *dlen, *dws = NULL, *local;
  W(kvs_cuda_malloc(&dq, qn * 2));
  W(kvs_cuda_malloc(&dout, qn * 2));
  W(kvs_cuda_malloc(&dtab, total * 4));
  W(kvs_cuda_malloc(&dlen, B * 4));
  W(kvs_cuda_memcpy_htod(dq, q, qn * 2));
  W(kvs_cuda_memcpy_htod(dtab, tab, total * 4));
  W(kvs_cuda_memcpy_htod(dlen, lens, B * 4));
  kvs_attn_args a;
  memset(&a, 0, sizeof a);
  W(kvs_paged_kv_of(c, 1, &a.kv));
  a.out = dout;
  a.q = dq;
  a.seq_lens = dlen;
  a.block_tables = dtab;
  a.num_seqs = a.num_rows = B;
  a.num_heads = NH;
  a.max_blocks_per_seq = nb;
  a.max_seq_len = len;
  a.qo_dtype = KVS_DTYPE_FP16;
  a.scale = 1.f / sqrtf((float)HD);
  a.workspace_bytes = kvs_attn_workspace_bytes(&a);
  if (a.workspace_bytes)
    W(kvs_cuda_malloc(&dws, a.workspace_bytes));
  a.workspace = dws;
  int reps = standin ? 2 : 20;
  double pool_us = time_attention(&a, reps);
  /* The same bytes in this process's own allocation. */
  size_t span = (size_t)total * l->block_stride;
  W(kvs_cuda_malloc(&local, span));
  W(kvs_cuda_memcpy_dtod(local, kvs_block_ptr(c, 0), span));
  kvs_attn_args b = a;
  b.kv.base = local;
  double local_us = time_attention(&b, reps);
  /* and again on the pool, so that neither side has the warmer GPU */
  double pool_us2 = time_attention(&a, reps);
  res->attn_pool_us = pool_us < pool_us2 ? pool_us : pool_us2;
  res->attn_local_us = local_us;
  kvs_cuda_free(local);
  kvs_cuda_free(dq);
  kvs_cuda_free(dout);
  kvs_cuda_free(dtab);
  kvs_cuda_free(dlen);
  kvs_cuda_free(dws);
  free(q);
  free(tab);
  free(lens);
}

/* One Batch of n Appends (children 1000..) with or without daemon copies;
 * returns its round trip in us and frees the children it made. */
static double cow_batch(kvs_client *c, kvs_batch *b, uint32_t n, int copy) {
  kvs_batch_reset(b);
  for (uint32_t i = 0; i < n; i++)
    kvs_batch_fork(b, 1, 1000 + i);
  W(kvs_batch_submit(c, b));
  W(kvs_set_daemon_copy(c, copy));
  kvs_batch_reset(b);
  for (uint32_t i = 0; i < n; i++)
    kvs_batch_append(b, 1000 + i, 1);
  double t0 = now_ms();
  W(kvs_batch_submit(c, b));
  double us = (now_ms() - t0) * 1e3;
  for (uint32_t i = 0; i < n; i++) {
    kvs_alloc_result ar;
    W(kvs_batch_alloc_result(b, i, &ar));
    if (ar.has_cow != (copy ? 2 : 1)) {
      snprintf(res->err, sizeof res->err, "append %u: has_cow %d", i,
               ar.has_cow);
      _exit(1);
    }
  }
  kvs_batch_reset(b);
  for (uint32_t i = 0; i < n; i++)
    kvs_batch_free_req(b, 1000 + i);
  W(kvs_batch_submit(c, b));
  return us;
}

static int dtod_fn(void *arg) {
  void **p = arg; /* base, n, stride */
  uint64_t stride = (uint64_t)(uintptr_t)p[2];
  uint32_t n = (uint32_t)(uintptr_t)p[1];
  for (uint32_t i = 0; i < n; i++) {
    int rc = kvs_cuda_memcpy_dtod((char *)p[0] + (2 * i + 1) * stride,
                                  (char *)p[0] + (2 * i) * stride, stride);
    if (rc)
      return rc;
  }
  return 0;
}

/* 3: copy-on-write by the daemon, by the worker, and raw device copies. */
static void bench_cow(kvs_client *c) {
  const kvs_layout *l = kvs_layout_of(c);
  uint32_t n = 256, rounds = standin ? 3 : 9; /* the GPU's count on the
                                                 stand-in too */
  uint32_t prompt[BS + 3];
  for (uint32_t i = 0; i < BS + 3; i++)
    prompt[i] = 7 + i;
  kvs_lookup_result lr;
  kvs_alloc_result ar;
  W(kvs_lookup(c, 1, prompt, BS + 3, NULL, 0, &lr));
  W(kvs_allocate(c, 1, BS + 3, &ar));
  W(kvs_commit(c, 1, 0, NULL, BS + 3, NULL, 0, NULL));
  kvs_batch *b;
  W(kvs_batch_new(&b));
  double with[16], without[16];
  cow_batch(c, b, n, 1); /* warm-up */
  for (uint32_t r = 0; r < rounds; r++) {
    with[r] = cow_batch(c, b, n, 1);
    without[r] = cow_batch(c, b, n, 0);
  }
  res->batch_copy_us = median(with, (int)rounds);
  res->batch_nocopy_us = median(without, (int)rounds);
  kvs_batch_free(b);
  W(kvs_free(c, 1));

  /* The worker's own copies, and raw cuMemcpyDtoD, of n distinct blocks
   * (pairs (2i, 2i+1) of a free area of the pool). */
  uint32_t *pairs = malloc(2 * n * 4);
  uint32_t base = l->num_blocks - 2 * n;
  for (uint32_t i = 0; i < 2 * n; i++)
    pairs[i] = base + i;
  double t[16];
  for (uint32_t r = 0; r < rounds; r++) {
    double t0 = now_ms();
    W(kvs_copy_blocks(c, pairs, n, NULL));
    W(kvs_cuda_sync(NULL));
    t[r] = (now_ms() - t0) * 1e3;
  }
  res->worker_copy_us = median(t, (int)rounds);
  void *args[3] = {kvs_block_ptr(c, base), (void *)(uintptr_t)n,
                   (void *)(uintptr_t)l->block_stride};
  for (uint32_t r = 0; r < rounds; r++) {
    float ms;
    W(kvs_cuda_time_ms(NULL, dtod_fn, args, 1, &ms));
    t[r] = ms * 1e3;
  }
  res->dtod_us = median(t, (int)rounds);
  res->copy_bytes = (uint64_t)n * l->block_stride;
  free(pairs);
}

/* A worker process: everything CUDA happens here. */
static void worker(const char *sock, uint64_t pool_bytes, int full) {
  kvs_client *c = NULL;
  W(kvs_cuda_open(NULL)); /* the context first: not part of the import */
  kvs_connect_opts o = {"bench", 60000, 0};
  double t0 = now_ms();
  W(kvs_connect(sock, &o, &c));
  res->connect_ms = now_ms() - t0;
  if (full) {
    bench_attention(c);
    bench_cow(c);
  }
  t0 = now_ms();
  kvs_close(c);
  c = NULL;
  res->close_ms = now_ms() - t0;
  /* Baseline: create and map the same size in this process. */
  kvs_vmm_pool p;
  char err[200];
  t0 = now_ms();
  int rc = kvs__vmm_create(pool_bytes, 1ull << 30, &p, err, sizeof err);
  res->create_ms = now_ms() - t0;
  if (rc) {
    snprintf(res->err, sizeof res->err, "kvs__vmm_create: %s", err);
    _exit(1);
  }
  res->chunks = p.nchunks;
  t0 = now_ms();
  kvs__vmm_close(&p);
  res->release_ms = now_ms() - t0;
  res->ok = 1;
  _exit(0);
}

static int run_size(uint64_t bytes, int full) {
  char pb[32];
  snprintf(pb, sizeof pb, "%llu", (unsigned long long)bytes);
  const char *args[] = {"--backend", "cuda", "--pool-bytes", pb,
                        "--block-size", "16", "--num-layers", "4",
                        "--num-kv-heads", "8", "--head-dim", "128",
                        "--dtype", "fp16", NULL};
  itest_daemon d;
  if (itest_daemon_try(&d, args) != 0) {
    itest_print_log(&d);
    itest_daemon_kill(&d);
    return -1;
  }
  memset(res, 0, sizeof *res);
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0)
    worker(d.socket, bytes, full);
  int st = itest_wait(pid);
  itest_daemon_kill(&d);
  if (st != 0 || !res->ok) {
    fprintf(stderr, "worker failed (%d): %s\n", st, res->err);
    return -1;
  }
  return 0;
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    standin |= !strcmp(argv[i], "--standin");
    quick |= !strcmp(argv[i], "--quick");
  }
  quick |= getenv("KVS_BENCH_QUICK") != NULL;
  res = mmap(NULL, sizeof *res, PROT_READ | PROT_WRITE,
             MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  CHECK(res != MAP_FAILED);
  uint64_t free_b = 0;
  char name[256] = "";
  if (standin) {
    char path[512];
    const char *build = getenv("KVS_BUILD") ? getenv("KVS_BUILD") : "build";
    snprintf(path, sizeof path, "%s/tests/standin/libcuda-standin.so", build);
    setenv("KVS_CUDA_DRIVER", path, 1);
    setenv("KVS_STANDIN_MEM", "2G", 1);
  }
  /* How much the GPU has, asked by a short-lived process. */
  pid_t pid = fork();
  if (pid == 0) {
    kvs_vmm_info info;
    char err[256];
    if (kvs__vmm_probe(NULL, &info, err, sizeof err)) {
      snprintf(res->err, sizeof res->err, "%s", err);
      _exit(77);
    }
    res->copy_bytes = info.free_bytes;
    snprintf(res->err, sizeof res->err, "%s (%s)", info.name, info.uuid);
    _exit(0);
  }
  int st = itest_wait(pid);
  if (st == 77) {
    printf("skipped: no GPU (%s)\n", res->err);
    return 77;
  }
  CHECK(st == 0);
  free_b = res->copy_bytes;
  snprintf(name, sizeof name, "%s", res->err);
  printf("device: %s, %llu MiB free%s\n", name,
         (unsigned long long)(free_b >> 20),
         standin ? "  [STAND-IN DRIVER: these figures are memcpy and the C "
                   "twins, not a GPU]" : "");

  /* 1: import + map against create + map, over pool sizes the GPU holds
   * twice (the daemon's pool and the baseline's). */
  printf("\n1. a worker's import + map of the pool (kvs_connect, context "
         "already up) vs\n   cuMemCreate + reserve + map + access of the same "
         "size (kvs__vmm_create)\n");
  printf("%10s %7s %14s %14s %7s %11s %12s\n", "pool MiB", "chunks",
         "import+map ms", "create+map ms", "ratio", "unmap ms", "release ms");
  uint64_t sizes[] = {256ull << 20, 1ull << 30, 4ull << 30, 16ull << 30,
                      32ull << 30};
  uint64_t full_size = 0;
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    uint64_t s = standin ? sizes[i] >> 6 : sizes[i];
    if (2 * s + (1ull << 30) > free_b || (quick && i > 2))
      break;
    if (run_size(s, 0) < 0)
      return 1;
    printf("%10llu %7u %14.2f %14.2f %7.2f %11.2f %12.2f\n",
           (unsigned long long)(s >> 20), res->chunks, res->connect_ms,
           res->create_ms, res->connect_ms / res->create_ms, res->close_ms,
           res->release_ms);
  }
  /* Parts 2 and 3 use B x len/16 blocks for attention and 2 x 256 for the
   * copies, of 256 KiB each (this layout's block). */
  {
    uint64_t B = quick || standin ? 4 : 32, len = standin ? 256 : 4096;
    full_size = (B * len / BS + 2 * 256 + 64) * (256u << 10);
    if (2 * full_size + (1ull << 30) > free_b) {
      printf("not enough device memory for parts 2 and 3 (%llu MiB)\n",
             (unsigned long long)(full_size >> 20));
      return 1;
    }
  }
  if (run_size(full_size, 1) < 0)
    return 1;
  printf("\n2. decode attention, fp16, GQA 8, %s, one layer\n",
         standin ? "batch 4 x 256 tokens" : quick ? "batch 4 x 4096 tokens"
                                                  : "batch 32 x 4096 tokens");
  printf("   over the shared pool (imported): %9.1f us\n", res->attn_pool_us);
  printf("   over a local cuMemAlloc copy:    %9.1f us\n", res->attn_local_us);
  printf("   shared / local: %.3f\n", res->attn_pool_us / res->attn_local_us);
  double mib = res->copy_bytes / 1048576.0;
  double dcopy = res->batch_copy_us - res->batch_nocopy_us;
  printf("\n3. copy-on-write of %.0f MiB (256 blocks of %llu KiB)\n", mib,
         (unsigned long long)(res->copy_bytes / 256 / 1024));
  printf("   cuMemcpyDtoD, one per block:      %9.1f us  %7.1f GB/s\n",
         res->dtod_us, res->copy_bytes / res->dtod_us / 1e3);
  printf("   worker's kvs_copy_blocks + sync:  %9.1f us  %7.1f GB/s  (%.2fx "
         "the DtoD rate)\n", res->worker_copy_us,
         res->copy_bytes / res->worker_copy_us / 1e3,
         res->dtod_us / res->worker_copy_us);
  printf("   daemon (Batch with daemon_copy %.1f us - without %.1f us): "
         "%.1f us  %7.1f GB/s  (%.2fx the DtoD rate)\n", res->batch_copy_us,
         res->batch_nocopy_us, dcopy,
         dcopy > 0 ? res->copy_bytes / dcopy / 1e3 : 0.0,
         dcopy > 0 ? res->dtod_us / dcopy : 0.0);
  return 0;
}
