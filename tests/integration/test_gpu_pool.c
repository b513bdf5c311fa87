/*
 * test_gpu_pool.c — the cuda pool backend end to end: kvshared allocates the
 * pool with the CUDA VMM API and exports it, workers import and map it, write
 * K/V with the CUDA write kernel, read each other's blocks, run CUDA decode
 * attention on them, and copy on write (by the daemon and by themselves).
 *
 * On a machine without a GPU it runs on the stand-in driver
 * (tests/standin/: memfd + mmap behind the same driver calls, the C twins
 * behind the kernels), selected with KVS_CUDA_DRIVER; that proves the
 * plumbing — export, SCM_RIGHTS, import, one contiguous mapping over
 * several chunks, access, unmap, fds, errors, kill -9 — never the device.
 * With KVS_GPU_POOL_REAL=1 it uses the real libcuda.so.1 instead (a GPU
 * machine) and skips the checks only the stand-in can make (fault
 * injection, its memory accounting).
 *
 * Every worker role runs in a fresh process (this program re-executed with
 * --role), as real workers do: each opens the driver itself, with the
 * environment the test gives it.
 *
 * Checks against independent references: every block's bytes against K/V
 * regenerated in the test and converted with kvs_convert; attention
 * against a naive softmax(q.K)V in double precision over those values.
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu/kvs_vmm.h"
#include "tests/integration/itest.h"

/* The layout: a block of 5 layers x (K, V) x 16 tokens x 2 heads x 16 dims
 * of fp16 is 10240 bytes, 12288 with the 4 KiB rounding: 2 MiB chunks end in
 * the middle of blocks 170 and 341. */
#define BS 16
#define LAYERS 5
#define KVH 2
#define HD 16
#define NH 4 /* query heads: GQA 2 */
#define POOL_BLOCKS 1024
#define NFORKS 300 /* forks appending in one batch (over 255) */
#define PROMPT (360 * BS + 5) /* 360 full blocks and a partial one */
#define STANDIN_UUID "GPU-5354414e-4449-4e00-8000-000000000001"
#define OTHER_UUID "GPU-5354414e-4449-4e00-8000-0000000000ff"

static const char *self_exe = "/proc/self/exe";
static int real_gpu;

static uint32_t tok(uint32_t i) { return 1000 + (i * 7919u) % 30000u; }

/* The K (kv 0) or V (kv 1) value of (layer, position, head, dim). */
static float kv_value(uint32_t layer, uint32_t pos, uint32_t kv, uint32_t h,
                      uint32_t d) {
  uint64_t x = ((uint64_t)layer << 48) ^ ((uint64_t)pos << 20) ^
               ((uint64_t)kv << 12) ^ ((uint64_t)h << 8) ^ d ^ 0x9e3779b9ull;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return (float)((double)(x & 0xffffff) / (double)0xffffff * 2.0 - 1.0);
}

static float q_value(uint32_t h, uint32_t d) {
  return kv_value(99, 7, 0, h, d) * 0.5f;
}

/* ---- helpers of the worker roles ------------------------------------------ */

#define MUST(c, call)                                                        \
  do {                                                                       \
    int rc_ = (call);                                                        \
    if (rc_) {                                                               \
      fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #call,     \
              kvs_status_name(rc_), (c) ? kvs_last_message(c) : "");         \
      exit(1);                                                               \
    }                                                                        \
  } while (0)

static kvs_client *connect_worker(const char *sock, const char *name) {
  kvs_connect_opts o = {name, 30000, 0};
  kvs_client *c = NULL;
  int rc = kvs_connect(sock, &o, &c);
  if (rc) {
    fprintf(stderr, "%s: kvs_connect: %s: %s\n", name, kvs_status_name(rc),
            kvs_last_message(NULL));
    exit(1);
  }
  CHECK(strcmp(kvs_pool_backend(c), "cuda") == 0);
  CHECK(kvs_pool_kernels(c) == kvs_kernels_cuda());
  CHECK(kvs_pool_base(c) != NULL);
  if (!real_gpu)
    CHECK(strcmp(kvs_pool_gpu_uuid(c), STANDIN_UUID) == 0);
  return c;
}

static void *dev_copy(const void *host, size_t bytes) {
  void *d = NULL;
  MUST(NULL, kvs_cuda_malloc(&d, bytes));
  MUST(NULL, kvs_cuda_memcpy_htod(d, host, bytes));
  return d;
}

/* Write-kernel arguments for n tokens of layer `layer` from k, v
 * (rows of `row` elements of `dtype`) into slots. */
static kvs_write_args write_args(kvs_client *c, uint32_t layer, const void *k,
                                 const void *v, const int64_t *slots,
                                 uint32_t row, uint32_t dtype, uint32_t n) {
  kvs_write_args w;
  memset(&w, 0, sizeof w);
  MUST(c, kvs_paged_kv_of(c, layer, &w.kv));
  w.k = k;
  w.v = v;
  w.slots = slots;
  w.src_token_stride = row;
  w.src_dtype = dtype;
  w.num_tokens = n;
  return w;
}

/* Writes K/V of positions [from, to) of the prompt with the CUDA write
 * kernel, then synchronises (the stream rule: before the commit). */
static void write_positions(kvs_client *c, const uint32_t *table,
                            uint32_t from, uint32_t to) {
  uint32_t n = to - from, row = KVH * HD;
  float *k = malloc((size_t)n * row * sizeof *k);
  float *v = malloc((size_t)n * row * sizeof *v);
  int64_t *slots = malloc(n * sizeof *slots);
  CHECK(k && v && slots);
  for (uint32_t p = from; p < to; p++)
    slots[p - from] = (int64_t)table[p / BS] * BS + p % BS;
  void *dslots = dev_copy(slots, n * sizeof *slots);
  for (uint32_t layer = 0; layer < LAYERS; layer++) {
    for (uint32_t p = from; p < to; p++)
      for (uint32_t h = 0; h < KVH; h++)
        for (uint32_t d = 0; d < HD; d++) {
          k[(size_t)(p - from) * row + h * HD + d] = kv_value(layer, p, 0, h, d);
          v[(size_t)(p - from) * row + h * HD + d] = kv_value(layer, p, 1, h, d);
        }
    void *dk = dev_copy(k, (size_t)n * row * sizeof *k);
    void *dv = dev_copy(v, (size_t)n * row * sizeof *v);
    kvs_write_args w = write_args(c, layer, dk, dv, dslots, row, KVS_DTYPE_FP32, n);
    MUST(c, kvs_pool_kernels(c)->write_kv(&w, NULL));
    MUST(c, kvs_cuda_sync(NULL));
    kvs_cuda_free(dk);
    kvs_cuda_free(dv);
  }
  kvs_cuda_free(dslots);
  free(k);
  free(v);
  free(slots);
}

/* Checks every row of block b (positions [first, first + ntok)) against
 * the values, byte for byte, reading it back from the device. */
static void check_block(kvs_client *c, uint32_t b, uint32_t first,
                        uint32_t ntok) {
  const kvs_layout *l = kvs_layout_of(c);
  uint8_t *host = malloc(l->block_stride);
  uint16_t want[HD];
  float f[HD];
  CHECK(host);
  MUST(c, kvs_cuda_memcpy_dtoh(host, kvs_block_ptr(c, b), l->block_stride));
  for (uint32_t layer = 0; layer < LAYERS; layer++)
    for (uint32_t kv = 0; kv < 2; kv++)
      for (uint32_t t = 0; t < ntok; t++)
        for (uint32_t h = 0; h < KVH; h++) {
          for (uint32_t d = 0; d < HD; d++)
            f[d] = kv_value(layer, first + t, kv, h, d);
          kvs_convert(want, KVS_DTYPE_FP16, f, KVS_DTYPE_FP32, HD);
          const uint8_t *got =
              host + (kvs_elem_offset(l, b, layer, kv, t, h) -
                      kvs_block_offset(l, b));
          if (memcmp(got, want, sizeof want) != 0) {
            fprintf(stderr, "block %u layer %u kv %u token %u head %u: bytes "
                    "differ from the prompt's K/V\n", b, layer, kv, t, h);
            exit(1);
          }
        }
  free(host);
}

/* Decode attention of one query at the end of n cached positions, through
 * the CUDA kernel on the shared pool, against a naive softmax in double
 * over the fp16-rounded values. */
static void check_attention(kvs_client *c, const uint32_t *table,
                            uint32_t nblocks, uint32_t n) {
  float q[NH * HD], out[NH * HD];
  for (uint32_t h = 0; h < NH; h++)
    for (uint32_t d = 0; d < HD; d++)
      q[h * HD + d] = q_value(h, d);
  void *dq = dev_copy(q, sizeof q), *dout = NULL, *dlen, *dtab;
  MUST(c, kvs_cuda_malloc(&dout, sizeof out));
  dlen = dev_copy(&n, sizeof n);
  dtab = dev_copy(table, nblocks * sizeof *table);
  double scale = 1.0 / sqrt((double)HD);
  /* The C twin runs on a host image of the pool read back from the device:
   * the CUDA kernel's reference. */
  const kvs_layout *l = kvs_layout_of(c);
  void *image = malloc(kvs_pool_bytes(l));
  float twin[NH * HD];
  CHECK(image);
  MUST(c, kvs_cuda_memcpy_dtoh(image, kvs_pool_base(c), kvs_pool_bytes(l)));
  for (uint32_t layer = 0; layer < LAYERS; layer += 2) {
    kvs_attn_args a;
    memset(&a, 0, sizeof a);
    MUST(c, kvs_paged_kv_of(c, layer, &a.kv));
    a.out = dout;
    a.q = dq;
    a.seq_lens = dlen;
    a.block_tables = dtab;
    a.num_seqs = a.num_rows = 1;
    a.num_heads = NH;
    a.max_blocks_per_seq = nblocks;
    a.max_seq_len = n;
    a.qo_dtype = KVS_DTYPE_FP32;
    a.scale = (float)scale;
    MUST(c, kvs_pool_kernels(c)->decode_attention(&a, NULL));
    MUST(c, kvs_cuda_sync(NULL));
    MUST(c, kvs_cuda_memcpy_dtoh(out, dout, sizeof out));
    kvs_attn_args ha = a;
    MUST(c, kvs_paged_kv_init(&ha.kv, image, l, layer));
    ha.out = twin;
    ha.q = q;
    ha.seq_lens = &n;
    ha.block_tables = table;
    MUST(c, kvs_cpu_decode_attention(&ha, NULL));
    for (uint32_t i = 0; i < NH * HD; i++)
      if (!(fabs((double)out[i] - twin[i]) <= 2e-5)) {
        fprintf(stderr, "attention layer %u element %u: %.7f, the C twin "
                "%.7f\n", layer, i, out[i], twin[i]);
        exit(1);
      }
    for (uint32_t hq = 0; hq < NH; hq++) {
      uint32_t h = hq / (NH / KVH);
      double m = -INFINITY, sum = 0, acc[HD] = {0};
      double *s = malloc(n * sizeof *s);
      CHECK(s);
      for (uint32_t p = 0; p < n; p++) {
        double dot = 0;
        for (uint32_t d = 0; d < HD; d++)
          dot += (double)q[hq * HD + d] *
                 kvs_fp16_to_float(kvs_float_to_fp16(kv_value(layer, p, 0, h, d)));
        s[p] = dot * scale;
        if (s[p] > m)
          m = s[p];
      }
      for (uint32_t p = 0; p < n; p++) {
        double e = exp(s[p] - m);
        sum += e;
        for (uint32_t d = 0; d < HD; d++)
          acc[d] += e * kvs_fp16_to_float(
                            kvs_float_to_fp16(kv_value(layer, p, 1, h, d)));
      }
      free(s);
      for (uint32_t d = 0; d < HD; d++) {
        double want = acc[d] / sum, got = out[hq * HD + d];
        if (!(fabs(got - want) <= 1e-4 + 1e-4 * fabs(want))) {
          fprintf(stderr, "attention layer %u head %u dim %u: %.7f, naive "
                  "%.7f\n", layer, hq, d, got, want);
          exit(1);
        }
      }
    }
  }
  free(image);
  kvs_cuda_free(dq);
  kvs_cuda_free(dout);
  kvs_cuda_free(dlen);
  kvs_cuda_free(dtab);
}

/* Does the block's whole content equal another's? */
static int blocks_equal(kvs_client *c, uint32_t a, uint32_t b) {
  uint64_t stride = kvs_layout_of(c)->block_stride;
  uint8_t *x = malloc(stride), *y = malloc(stride);
  CHECK(x && y);
  MUST(c, kvs_cuda_memcpy_dtoh(x, kvs_block_ptr(c, a), stride));
  MUST(c, kvs_cuda_memcpy_dtoh(y, kvs_block_ptr(c, b), stride));
  int eq = memcmp(x, y, stride) == 0;
  free(x);
  free(y);
  return eq;
}

/* Mappings of the stand-in's memory in a process (0 for a real GPU); with
 * owner, only of memory that process created (its memfds are named
 * "kvs-standin:<uuid>:<pid>:<n>"). */
static int standin_maps_of(pid_t pid, pid_t owner) {
  char path[64], line[512], mark[32];
  snprintf(path, sizeof path, "/proc/%d/maps", (int)pid);
  snprintf(mark, sizeof mark, ":%d:", (int)owner);
  FILE *f = fopen(path, "r");
  int n = 0;
  if (!f)
    return 0;
  while (fgets(line, sizeof line, f))
    n += strstr(line, "kvs-standin:") && (!owner || strstr(line, mark));
  fclose(f);
  return n;
}

static int standin_maps(pid_t pid) { return standin_maps_of(pid, 0); }

/* The stand-in names each chunk after its creator and creation order: the
 * mapping at base + k * chunk_size must be the daemon's k-th chunk (a pool
 * mapped out of order is consistent among workers and would pass every
 * other check). */
static void check_chunk_order(kvs_client *c) {
  FILE *f = fopen("/proc/self/maps", "r");
  uintptr_t base = (uintptr_t)kvs_pool_base(c), end = base + kvs_pool_size(c);
  uint64_t chunk = 2u << 20;
  char line[512];
  int seen = 0, owner = -1;
  unsigned first = 0;
  CHECK(f);
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    char *name = strstr(line, "kvs-standin:");
    int pid;
    unsigned serial;
    if (!name || sscanf(line, "%lx-%lx", &lo, &hi) != 2 || lo < base ||
        lo >= end)
      continue;
    char *p = strrchr(name, ':'); /* ":<n>" (" (deleted)" after it) */
    *p = '\0';
    char *q = strrchr(name, ':');
    CHECK(q && sscanf(q + 1, "%d", &pid) == 1 && sscanf(p + 1, "%u", &serial) == 1);
    CHECK((lo - base) % chunk == 0);
    unsigned k = (unsigned)((lo - base) / chunk);
    if (owner < 0) {
      owner = pid;
      first = serial - k;
    }
    if (pid != owner || serial != first + k) {
      fprintf(stderr, "chunk %u of the pool maps %d's allocation #%u, not "
              "#%u\n", k, pid, serial, first + k);
      exit(1);
    }
    seen++;
  }
  fclose(f);
  CHECK(seen == (int)(kvs_pool_size(c) / chunk));
}

static uint32_t prompt[PROMPT];

/* ---- the worker roles -------------------------------------------------------- */

/* Computes the prompt's K/V into the pool and publishes it. */
static int role_writer(const char *sock) {
  kvs_client *c = connect_worker(sock, "writer");
  kvs_lookup_result lr;
  kvs_alloc_result ar;
  uint32_t sealed;
  MUST(c, kvs_lookup(c, 1, prompt, PROMPT, NULL, 0, &lr));
  CHECK(lr.hit_tokens == 0);
  MUST(c, kvs_allocate(c, 1, PROMPT, &ar));
  uint32_t *table = malloc(ar.num_blocks * sizeof *table);
  CHECK(table);
  memcpy(table, ar.blocks, ar.num_blocks * sizeof *table);
  /* The prompt must cover blocks that straddle two chunks (block_stride
   * does not divide the chunk size): the mapping is contiguous. */
  const kvs_layout *l = kvs_layout_of(c);
  uint64_t chunk = 2u << 20;
  int straddles = 0;
  for (uint32_t i = 0; i < ar.num_blocks; i++) {
    uint64_t s = kvs_block_offset(l, table[i]), e = s + l->block_stride;
    straddles += s / chunk != (e - 1) / chunk;
  }
  CHECK(straddles >= 2);
  if (!real_gpu)
    check_chunk_order(c);
  write_positions(c, table, 0, PROMPT);
  MUST(c, kvs_commit(c, 1, 0, NULL, PROMPT, table, ar.num_blocks, &sealed));
  CHECK(sealed == PROMPT / BS);
  MUST(c, kvs_free(c, 1));
  free(table);
  kvs_close(c);
  return 0;
}

/* Finds the prompt, checks every hit block and attention over it; reader 0
 * also runs the copy-on-write both ways. */
static int role_reader(const char *sock, int id) {
  char name[32];
  snprintf(name, sizeof name, "reader-%d", id);
  kvs_client *c = connect_worker(sock, name);
  kvs_lookup_result lr;
  uint64_t req = 10 + (uint64_t)id;
  MUST(c, kvs_lookup(c, req, prompt, PROMPT, NULL, 0, &lr));
  CHECK(lr.hit_tokens == PROMPT / BS * BS);
  uint32_t nb = lr.num_blocks;
  uint32_t *table = malloc((nb + 2) * sizeof *table);
  CHECK(table);
  memcpy(table, lr.blocks, nb * sizeof *table);
  for (uint32_t i = id % 3; i < nb; i += 3) /* a third of them each */
    check_block(c, table[i], i * BS, BS);
  check_attention(c, table, nb, lr.hit_tokens);
  if (id == 0) {
    /* The partial tail: allocate, write, commit; then fork twice and let
     * each child append into the shared partial block. */
    kvs_alloc_result ar;
    uint32_t h = lr.hit_tokens;
    MUST(c, kvs_allocate(c, req, PROMPT - h, &ar));
    CHECK(ar.num_blocks == 1 && ar.has_cow == 0);
    table[nb] = ar.blocks[0];
    write_positions(c, table, h, PROMPT);
    MUST(c, kvs_commit(c, req, h, NULL, PROMPT - h, NULL, 0, NULL));
    uint32_t tail = table[nb];
    check_block(c, tail, nb * BS, PROMPT - h);

    MUST(c, kvs_set_daemon_copy(c, 1));
    MUST(c, kvs_fork(c, req, 100));
    MUST(c, kvs_append(c, 100, 1, &ar));
    CHECK(ar.has_cow == 2 && ar.cow_src == tail && ar.cow_dst != tail);
    CHECK(blocks_equal(c, tail, ar.cow_dst)); /* the daemon copied */
    check_block(c, ar.cow_dst, nb * BS, PROMPT - h);

    MUST(c, kvs_set_daemon_copy(c, 0));
    MUST(c, kvs_fork(c, req, 101));
    MUST(c, kvs_append(c, 101, 1, &ar));
    CHECK(ar.has_cow == 1 && ar.cow_src == tail);
    uint32_t pair[2] = {ar.cow_src, ar.cow_dst};
    MUST(c, kvs_copy_blocks(c, pair, 1, NULL));
    MUST(c, kvs_cuda_sync(NULL));
    CHECK(blocks_equal(c, tail, ar.cow_dst));
    pair[0] = POOL_BLOCKS;
    CHECK(kvs_copy_blocks(c, pair, 1, NULL) == KVS_ERANGE);

    /* Batched, with the daemon copying: a batch of forks' appends, more
     * of them than a block's 8-bit pin count (the GPU run's bench made
     * 256: the 256th was left to the worker), all from one block. */
    kvs_batch *b;
    MUST(c, kvs_batch_new(&b));
    MUST(c, kvs_set_daemon_copy(c, 1));
    for (uint64_t k = 0; k < NFORKS; k++)
      CHECK(kvs_batch_fork(b, req, 200 + k) >= 0);
    for (uint64_t k = 0; k < NFORKS; k++)
      CHECK(kvs_batch_append(b, 200 + k, 1) >= 0);
    MUST(c, kvs_batch_submit(c, b));
    for (uint32_t k = 0; k < 2 * NFORKS; k++)
      MUST(c, kvs_batch_status(b, k));
    for (uint32_t k = NFORKS; k < 2 * NFORKS; k++) {
      MUST(c, kvs_batch_alloc_result(b, k, &ar));
      CHECK(ar.has_cow == 2 && ar.cow_src == tail);
      CHECK(blocks_equal(c, tail, ar.cow_dst));
    }
    kvs_batch_reset(b);
    for (uint64_t k = 0; k < NFORKS; k++)
      CHECK(kvs_batch_free_req(b, 200 + k) >= 0);
    MUST(c, kvs_batch_submit(c, b));
    kvs_batch_free(b);
  }
  free(table);
  kvs_close(c); /* frees every request */
  return 0;
}

/* Holds blocks and writes into them in a loop until it is killed. */
static int role_victim(const char *sock, int id) {
  kvs_client *c = connect_worker(sock, "victim");
  uint64_t req = 1000 + (uint64_t)id;
  kvs_lookup_result lr;
  kvs_alloc_result ar;
  MUST(c, kvs_lookup(c, req, prompt, 64, NULL, 0, &lr));
  MUST(c, kvs_set_daemon_copy(c, id & 1));
  uint32_t table[512];
  memcpy(table, lr.blocks, lr.num_blocks * sizeof *table);
  uint32_t n = lr.hit_tokens, nb = lr.num_blocks;
  printf("ready\n");
  fflush(stdout);
  for (uint64_t step = 0;; step++) {
    if (n + 1 >= 400 * BS) { /* start over, keeping the process busy */
      MUST(c, kvs_free(c, req));
      MUST(c, kvs_lookup(c, req, prompt, 64, NULL, 0, &lr));
      memcpy(table, lr.blocks, lr.num_blocks * sizeof *table);
      n = lr.hit_tokens;
      nb = lr.num_blocks;
    }
    MUST(c, kvs_append(c, req, 1, &ar));
    if (ar.num_blocks)
      table[nb++] = ar.blocks[0];
    write_positions(c, table, n, n + 1);
    uint32_t t = tok(n);
    MUST(c, kvs_commit(c, req, n, &t, 1, NULL, 0, NULL));
    n++;
    if (step % 5 == 4) { /* a fork and a CoW now and then */
      MUST(c, kvs_fork(c, req, req + 500));
      MUST(c, kvs_append(c, req + 500, 1, &ar));
      MUST(c, kvs_free(c, req + 500));
    }
  }
  return 0;
}

/* A request whose last block is partial and written, forked: the child's
 * first append needs a copy-on-write copy of it. */
static void cow_ready(kvs_client *c, uint64_t req, uint64_t child) {
  kvs_lookup_result lr;
  kvs_alloc_result ar;
  uint32_t table[4];
  MUST(c, kvs_lookup(c, req, prompt, BS + 3, NULL, 0, &lr));
  MUST(c, kvs_allocate(c, req, BS + 3 - lr.hit_tokens, &ar));
  memcpy(table, lr.blocks, lr.num_blocks * sizeof *table);
  memcpy(table + ar.first_index, ar.blocks, ar.num_blocks * sizeof *table);
  write_positions(c, table, lr.hit_tokens, BS + 3);
  MUST(c, kvs_commit(c, req, lr.hit_tokens, NULL, BS + 3 - lr.hit_tokens,
                     NULL, 0, NULL));
  MUST(c, kvs_fork(c, req, child));
}

/* Asks the daemon for a CoW copy and says so first (the test kills the
 * daemon or this worker while the copy runs).  The append returns when the
 * copy is done, or KVS_ECLOSED when the daemon went away first (accepted
 * unless id bit 2 is set: then only OK is).  With id bit 1: one Batch
 * appends with the copy and frees both requests at once, so their blocks
 * are let go while the copy still runs. */
static int role_copier(const char *sock, int id) {
  int frees = id & 1, must_ok = id & 2;
  kvs_client *c = connect_worker(sock, "copier");
  kvs_alloc_result ar;
  int rc;
  cow_ready(c, 1, 2);
  MUST(c, kvs_set_daemon_copy(c, 1));
  printf("copying\n");
  fflush(stdout);
  if (frees) {
    kvs_batch *b;
    MUST(c, kvs_batch_new(&b));
    kvs_batch_append(b, 2, 1);
    kvs_batch_free_req(b, 2);
    kvs_batch_free_req(b, 1);
    MUST(c, kvs_batch_submit(c, b));
    for (uint32_t i = 0; i < 3; i++)
      MUST(c, kvs_batch_status(b, i));
    MUST(c, kvs_batch_alloc_result(b, 0, &ar));
    rc = ar.has_cow == 2 ? 0 : KVS_EINTERNAL;
    kvs_batch_free(b);
  } else {
    rc = kvs_append(c, 2, 1, &ar);
  }
  fprintf(stderr, "copier: append: %s\n", kvs_status_name(rc));
  kvs_close(c);
  return rc == 0 || (rc == KVS_ECLOSED && !must_ok) ? 0 : 1;
}

/* Against a daemon whose GPU faults on its second copy: the first copy is
 * made, the session of the second is closed, and from then on the daemon
 * leaves copies to the workers. */
static int role_faulty(const char *sock) {
  kvs_client *c = connect_worker(sock, "faulty");
  kvs_alloc_result ar;
  cow_ready(c, 1, 10);
  MUST(c, kvs_set_daemon_copy(c, 1));
  MUST(c, kvs_append(c, 10, 1, &ar));
  CHECK(ar.has_cow == 2);
  MUST(c, kvs_fork(c, 1, 11));
  int rc = kvs_append(c, 11, 1, &ar);
  if (rc != KVS_ECLOSED) {
    fprintf(stderr, "append whose copy faulted: %s, wanted ECLOSED\n",
            kvs_status_name(rc));
    return 1;
  }
  kvs_close(c);
  c = connect_worker(sock, "faulty-again");
  cow_ready(c, 1, 12);
  MUST(c, kvs_set_daemon_copy(c, 1));
  MUST(c, kvs_append(c, 12, 1, &ar));
  CHECK(ar.has_cow == 1); /* the worker's to make now */
  kvs_close(c);
  return 0;
}

/* A GPU with no image of kvshare's kernels (KVS_STANDIN_FAIL=module): the
 * pool still maps and copies work; the kernels are refused with the reason,
 * which kvs_cuda_available then gives too. */
static int role_no_kernels(const char *sock) {
  setenv("KVS_STANDIN_FAIL", "module", 1);
  kvs_client *c = connect_worker(sock, "no-kernels");
  const char *why = NULL;
  uint8_t x;
  MUST(c, kvs_cuda_memcpy_dtoh(&x, kvs_block_ptr(c, 0), 1));
  kvs_write_args w;
  memset(&w, 0, sizeof w);
  MUST(c, kvs_paged_kv_of(c, 0, &w.kv));
  w.k = w.v = kvs_pool_base(c);
  w.slots = kvs_pool_base(c);
  w.src_token_stride = KVH * HD;
  w.num_tokens = 1;
  int rc = kvs_pool_kernels(c)->write_kv(&w, NULL);
  int arc = kvs_cuda_available(&why);
  if (rc != KVS_ENOTSUP || arc != KVS_ENOTSUP ||
      !strstr(why, "cannot load the kernels")) {
    fprintf(stderr, "kernels without an image: launch %s, available %s "
            "(%s)\n", kvs_status_name(rc), kvs_status_name(arc), why);
    return 1;
  }
  kvs_close(c);
  return 0;
}

/* A worker that must be refused with a clear reason.  Returns 0 when the
 * connect failed with want_rc and a message holding want_text, and left no
 * fd or mapping behind. */
static int role_refused(const char *sock, int want_rc, const char *want_text) {
  int fds0 = itest_fd_count(0);
  kvs_connect_opts o = {"refused", 30000, 0};
  kvs_client *c = NULL;
  int rc = kvs_connect(sock, &o, &c);
  const char *msg = kvs_last_message(NULL);
  if (rc != want_rc || !strstr(msg, want_text)) {
    fprintf(stderr, "kvs_connect: %s (%s), wanted %s with \"%s\"\n",
            kvs_status_name(rc), msg, kvs_status_name(want_rc), want_text);
    return 1;
  }
  printf("refused as expected: %s: %s\n", kvs_status_name(rc), msg);
  /* Whatever the import got as far as (chunks imported, mapped) was given
   * back.  (A real driver keeps descriptors of its own once loaded; these
   * refusals run on the stand-in or without a driver.) */
  if (itest_fd_count(0) != fds0 || standin_maps(getpid()) != 0) {
    fprintf(stderr, "a refused connect left %d fds (%d before) and %d "
            "stand-in mappings\n", itest_fd_count(0), fds0,
            standin_maps(getpid()));
    return 1;
  }
  return 0;
}

/* Connects and closes many times: no fd, mapping or memory left. */
static int role_churn(const char *sock) {
  kvs_client *c = connect_worker(sock, "churn");
  kvs_close(c);
  int fds0 = itest_fd_count(0), maps0 = standin_maps(getpid());
  for (int i = 0; i < 40; i++) {
    c = connect_worker(sock, "churn");
    uint32_t b = 0;
    uint8_t x;
    MUST(c, kvs_cuda_memcpy_dtoh(&x, kvs_block_ptr(c, b), 1));
    kvs_close(c);
  }
  if (itest_fd_count(0) != fds0 || standin_maps(getpid()) != maps0) {
    fprintf(stderr, "40 connect/close: fds %d -> %d, stand-in maps %d -> %d\n",
            fds0, itest_fd_count(0), maps0, standin_maps(getpid()));
    return 1;
  }
  return 0;
}

/* A pool of --dtype int8 or fp8: K/V written with the CUDA write kernel
 * (quantized on the device), committed, found by a second request, then
 * decode and chunked prefill through the CUDA kernels on the shared pool
 * (split workspace given); the written bytes and scales against the C
 * write kernel's on a host image of the pool taken before, the outputs
 * against the C twins on the image taken after. */
#define QTOK (3 * BS + 5)
static int role_quant(const char *sock) {
  kvs_client *c = connect_worker(sock, "quant");
  const kvs_layout *l = kvs_layout_of(c);
  const uint32_t kvh = l->num_kv_heads, hd = l->head_dim, nh = 2 * kvh;
  const uint32_t row = kvh * hd;
  const uint64_t pool_bytes = kvs_pool_bytes(l);
  CHECK(kvs_dtype_quantized(l->dtype));
  kvs_lookup_result lr;
  kvs_alloc_result ar;
  uint32_t sealed;
  MUST(c, kvs_lookup(c, 1, prompt, QTOK, NULL, 0, &lr));
  MUST(c, kvs_allocate(c, 1, QTOK, &ar));
  uint32_t nb = ar.num_blocks, table[8];
  CHECK(nb <= 8);
  memcpy(table, ar.blocks, nb * sizeof *table);
  uint8_t *before = malloc(pool_bytes), *after = malloc(pool_bytes);
  uint16_t *k = malloc((size_t)QTOK * row * 2), *v = malloc((size_t)QTOK * row * 2);
  int64_t slots[QTOK];
  CHECK(before && after && k && v);
  for (uint32_t p = 0; p < QTOK; p++)
    slots[p] = (int64_t)table[p / BS] * BS + p % BS;
  MUST(c, kvs_cuda_memcpy_dtoh(before, kvs_pool_base(c), pool_bytes));
  void *dslots = dev_copy(slots, sizeof slots);
  for (uint32_t layer = 0; layer < l->num_layers; layer++) {
    for (uint32_t i = 0; i < QTOK * row; i++) {
      float x = kv_value(layer, i / row, 0, i % row / hd, i % hd) * 3.f;
      float y = kv_value(layer, i / row, 1, i % row / hd, i % hd);
      k[i] = kvs_float_to_fp16(x);
      v[i] = kvs_float_to_fp16(y);
    }
    void *dk = dev_copy(k, (size_t)QTOK * row * 2);
    void *dv = dev_copy(v, (size_t)QTOK * row * 2);
    kvs_write_args w = write_args(c, layer, dk, dv, dslots, row, KVS_DTYPE_FP16, QTOK);
    MUST(c, kvs_pool_kernels(c)->write_kv(&w, NULL));
    /* the same on the host image */
    MUST(c, kvs_paged_kv_init(&w.kv, before, l, layer));
    w.k = k;
    w.v = v;
    w.slots = slots;
    MUST(c, kvs_cpu_write_kv(&w, NULL));
    MUST(c, kvs_cuda_sync(NULL));
    kvs_cuda_free(dk);
    kvs_cuda_free(dv);
  }
  MUST(c, kvs_cuda_memcpy_dtoh(after, kvs_pool_base(c), pool_bytes));
  if (memcmp(before, after, pool_bytes) != 0) {
    fprintf(stderr, "%s pool: the CUDA write kernel's bytes differ from the "
            "C twin's\n", kvs_dtype_name(l->dtype));
    return 1;
  }
  MUST(c, kvs_commit(c, 1, 0, NULL, QTOK, table, nb, &sealed));
  CHECK(sealed == QTOK / BS);
  MUST(c, kvs_lookup(c, 2, prompt, QTOK, NULL, 0, &lr));
  CHECK(lr.hit_tokens == QTOK / BS * BS);
  CHECK(memcmp(lr.blocks, table, lr.num_blocks * sizeof *table) == 0);

  /* decode of request 1 (all QTOK keys), then prefill of its last 9 */
  enum { QLEN = 9 };
  uint32_t lens[1] = {QTOK}, qstart[2] = {0, QLEN};
  float q[QLEN * 8 * 256], out[QLEN * 8 * 256], twin[QLEN * 8 * 256];
  CHECK(nh <= 8 && hd <= 256);
  for (uint32_t i = 0; i < QLEN * nh * hd; i++)
    q[i] = kv_value(77, i / (nh * hd), 0, i / hd % nh, i % hd);
  void *dq = dev_copy(q, sizeof q), *dout = dev_copy(q, sizeof q);
  void *dlen = dev_copy(lens, sizeof lens), *dqs = dev_copy(qstart, sizeof qstart);
  void *dtab = dev_copy(table, nb * sizeof *table), *dws = NULL;
  for (int prefill = 0; prefill < 2; prefill++)
    for (uint32_t layer = 0; layer < l->num_layers; layer++) {
      kvs_attn_args a;
      memset(&a, 0, sizeof a);
      MUST(c, kvs_paged_kv_of(c, layer, &a.kv));
      a.out = dout;
      a.q = dq;
      a.seq_lens = dlen;
      a.q_start = prefill ? dqs : NULL;
      a.block_tables = dtab;
      a.num_seqs = 1;
      a.num_rows = prefill ? QLEN : 1;
      a.num_heads = nh;
      a.max_blocks_per_seq = nb;
      a.max_seq_len = QTOK;
      a.qo_dtype = KVS_DTYPE_FP32;
      a.scale = 1.f / sqrtf((float)hd);
      a.workspace_bytes = kvs_attn_workspace_bytes(&a);
      if (a.workspace_bytes && !dws)
        MUST(c, kvs_cuda_malloc(&dws, a.workspace_bytes));
      a.workspace = dws;
      const kvs_kernels *kk = kvs_pool_kernels(c);
      MUST(c, prefill ? kk->prefill_attention(&a, NULL)
                      : kk->decode_attention(&a, NULL));
      MUST(c, kvs_cuda_sync(NULL));
      size_t n = (size_t)a.num_rows * nh * hd;
      MUST(c, kvs_cuda_memcpy_dtoh(out, dout, n * sizeof *out));
      kvs_attn_args h = a;
      MUST(c, kvs_paged_kv_init(&h.kv, after, l, layer));
      h.out = twin;
      h.q = q;
      h.seq_lens = lens;
      h.q_start = prefill ? qstart : NULL;
      h.block_tables = table;
      h.workspace = NULL;
      MUST(c, prefill ? kvs_cpu_prefill_attention(&h, NULL)
                      : kvs_cpu_decode_attention(&h, NULL));
      for (size_t i = 0; i < n; i++)
        if (!(fabs((double)out[i] - twin[i]) <= 2e-5)) {
          fprintf(stderr, "%s pool, %s layer %u element %zu: %.7f, the C "
                  "twin %.7f\n", kvs_dtype_name(l->dtype),
                  prefill ? "prefill" : "decode", layer, i, out[i], twin[i]);
          return 1;
        }
    }
  kvs_cuda_free(dq);
  kvs_cuda_free(dout);
  kvs_cuda_free(dlen);
  kvs_cuda_free(dqs);
  kvs_cuda_free(dtab);
  kvs_cuda_free(dws);
  kvs_cuda_free(dslots);
  free(before);
  free(after);
  free(k);
  free(v);
  kvs_close(c);
  return 0;
}

static int run_role(int argc, char **argv) {
  const char *role = argv[2], *sock = argv[3];
  int id = argc > 4 ? atoi(argv[4]) : 0;
  if (!strcmp(role, "writer"))
    return role_writer(sock);
  if (!strcmp(role, "reader"))
    return role_reader(sock, id);
  if (!strcmp(role, "victim"))
    return role_victim(sock, id);
  if (!strcmp(role, "churn"))
    return role_churn(sock);
  if (!strcmp(role, "no-kernels"))
    return role_no_kernels(sock);
  if (!strcmp(role, "copier"))
    return role_copier(sock, id);
  if (!strcmp(role, "faulty"))
    return role_faulty(sock);
  if (!strcmp(role, "quant"))
    return role_quant(sock);
  if (!strcmp(role, "meminfo")) { /* the GPU's free memory, in bytes */
    kvs_vmm_info info;
    char err[256];
    if (kvs__vmm_probe(NULL, &info, err, sizeof err)) {
      fprintf(stderr, "%s\n", err);
      return 1;
    }
    printf("%llu\n", (unsigned long long)info.free_bytes);
    return 0;
  }
  if (!strcmp(role, "no-driver")) {
    setenv("KVS_CUDA_DRIVER", "/nonexistent/libcuda.so.1", 1);
    return role_refused(sock, KVS_ENODEV, "no CUDA driver");
  }
  if (!strcmp(role, "wrong-gpu")) {
    setenv("KVS_STANDIN_GPUS", OTHER_UUID, 1);
    if (role_refused(sock, KVS_ENODEV, "which this process cannot use"))
      return 1;
    /* ... and says what to do about it. */
    if (!strstr(kvs_last_message(NULL), "give their socket folder")) {
      fprintf(stderr, "no guidance in: %s\n", kvs_last_message(NULL));
      return 1;
    }
    return 0;
  }
  if (!strcmp(role, "import-fails")) {
    setenv("KVS_STANDIN_FAIL", "import:2", 1);
    return role_refused(sock, KVS_EINVAL, "cuMemImportFromShareableHandle");
  }
  if (!strcmp(role, "map-fails")) {
    setenv("KVS_STANDIN_FAIL", "map:3", 1);
    return role_refused(sock, KVS_EINVAL, "cuMemMap");
  }
  fprintf(stderr, "unknown role %s\n", role);
  return 2;
}

/* ---- the test ----------------------------------------------------------------- */

static pid_t spawn(const char *role, const char *sock, int id, int out_fd) {
  char ids[16];
  snprintf(ids, sizeof ids, "%d", id);
  fflush(NULL);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    if (out_fd >= 0)
      dup2(out_fd, 1);
    execl(self_exe, self_exe, "--role", role, sock, ids, (char *)NULL);
    _exit(127);
  }
  return pid;
}

static int run_to_end(const char *role, const char *sock, int id) {
  return itest_wait(spawn(role, sock, id, -1));
}

/* The GPU's free memory as a fresh process sees it (its own context
 * included, the same each time). */
static unsigned long long gpu_free(void) {
  int p[2];
  char buf[32] = {0};
  CHECK(pipe(p) == 0);
  pid_t pid = spawn("meminfo", "-", 0, p[1]);
  close(p[1]);
  ssize_t n = read(p[0], buf, sizeof buf - 1);
  close(p[0]);
  CHECK(itest_wait(pid) == 0 && n > 0);
  return strtoull(buf, NULL, 10);
}

/* Starts a daemon that must refuse to start; checks its log says why. */
static void refuse_start(const char *const *extra, const char *why) {
  itest_daemon d;
  int rc = itest_daemon_try(&d, extra);
  if (rc <= 0 || !itest_log_says(&d, why)) {
    itest_print_log(&d);
    fprintf(stderr, "kvshared %s (status %d), wanted a refusal saying \"%s\"\n",
            rc == 0 ? "started" : "did not say why", rc, why);
    itest_daemon_kill(&d);
    exit(1);
  }
  fprintf(stderr, "refused to start as expected: %s\n", why);
  itest_daemon_kill(&d);
}

/* Starts a daemon, checks a log line and a client's view, stops it. */
static void start_and_look(const char *const *extra, const char *log_line,
                           const char *backend, uint32_t num_blocks) {
  itest_daemon d;
  itest_daemon_start(&d, extra);
  if (!itest_log_says(&d, log_line)) {
    itest_print_log(&d);
    fprintf(stderr, "the log does not say \"%s\"\n", log_line);
    exit(1);
  }
  kvs_connect_opts o = {"look", 30000, 1};
  kvs_client *c;
  CHECK_OK(NULL, kvs_connect(d.socket, &o, &c));
  CHECK(strcmp(kvs_pool_backend(c), backend) == 0);
  if (num_blocks)
    CHECK(kvs_layout_of(c)->num_blocks == num_blocks);
  kvs_close(c);
  itest_daemon_finish(&d, -1);
}

static void startup_checks(const char *driver) {
  static const char *layout[] = {"--block-size", "16", "--num-layers", "5",
                                 "--num-kv-heads", "2", "--head-dim", "16",
                                 "--dtype", "fp16"};
  const char *a[32];
  int n;
#define ARGS(...)                                                            \
  do {                                                                       \
    const char *more_[] = {__VA_ARGS__};                                     \
    n = 0;                                                                   \
    for (size_t i_ = 0; i_ < sizeof layout / sizeof *layout; i_++)           \
      a[n++] = layout[i_];                                                   \
    for (size_t i_ = 0; i_ < sizeof more_ / sizeof *more_; i_++)             \
      a[n++] = more_[i_];                                                    \
    a[n] = NULL;                                                             \
  } while (0)

  /* No driver: cuda refuses, auto falls back to host and says so. */
  setenv("KVS_CUDA_DRIVER", "/nonexistent/libcuda.so.1", 1);
  ARGS("--backend", "cuda");
  refuse_start(a, "no CUDA driver");
  ARGS("--backend", "auto", "--pool-blocks", "64");
  start_and_look(a, "backend auto: no usable GPU (no CUDA driver", "host", 64);
  setenv("KVS_CUDA_DRIVER", driver, 1);

  /* A GPU that is not there, by UUID and by ordinal. */
  ARGS("--backend", "cuda", "--gpu", OTHER_UUID);
  refuse_start(a, "no visible CUDA device has the UUID " OTHER_UUID);
  ARGS("--backend", "cuda", "--gpu", "7");
  refuse_start(a, "no CUDA device 7");
  /* auto does not hide a bad --gpu behind the host pool */
  ARGS("--backend", "auto", "--gpu", OTHER_UUID);
  refuse_start(a, "no visible CUDA device has the UUID");

  if (real_gpu)
    return;
  /* A pool bigger than the GPU. */
  setenv("KVS_STANDIN_MEM", "64M", 1);
  ARGS("--backend", "cuda", "--pool-bytes", "100M");
  refuse_start(a, "is larger than the free memory of " STANDIN_UUID);
  /* gpu_memory_fraction: 0.5 x (64 MiB - 16 MiB reserve - one 2 MiB
   * granule) in blocks of 12288 bytes. */
  ARGS("--backend", "cuda", "--gpu-memory-fraction", "0.5", "--gpu-reserve",
       "16M");
  start_and_look(a, "pool: GPU " STANDIN_UUID, "cuda",
                 (uint32_t)(((64u << 20) - (16u << 20) - (2u << 20)) / 2 /
                            12288));
  ARGS("--backend", "cuda", "--gpu-memory-fraction", "0.001");
  refuse_start(a, "holds no block");
  /* More chunks than a Welcome can carry: the chunks grow (40 MiB in 2 MiB
   * chunks would be 20; 16 at most, so 10 of 4 MiB). */
  ARGS("--backend", "cuda", "--pool-bytes", "40M", "--gpu-chunk-size", "2M");
  start_and_look(a, "in 10 chunks of 4 MiB", "cuda", 0);
  unsetenv("KVS_STANDIN_MEM");

  /* A device without VMM or POSIX-fd export: cuda refuses, auto falls back. */
  setenv("KVS_STANDIN_FAIL", "vmm", 1);
  ARGS("--backend", "cuda");
  refuse_start(a, "does not support virtual memory management");
  ARGS("--backend", "auto", "--pool-blocks", "32");
  start_and_look(a, "does not support virtual memory management); using the "
                    "host backend", "host", 32);
  setenv("KVS_STANDIN_FAIL", "posix_fd", 1);
  ARGS("--backend", "cuda");
  refuse_start(a, "cannot export memory as POSIX file descriptors");
  /* Failures half-way through the pool's creation. */
  setenv("KVS_STANDIN_FAIL", "create:3", 1);
  ARGS("--backend", "cuda", "--pool-blocks", "512", "--gpu-chunk-size", "2M");
  refuse_start(a, "cuMemCreate of chunk 2");
  setenv("KVS_STANDIN_FAIL", "export:2", 1);
  refuse_start(a, "cuMemExportToShareableHandle");
  setenv("KVS_STANDIN_FAIL", "map:2", 1);
  refuse_start(a, "cuMemMap");
  setenv("KVS_STANDIN_FAIL", "set_access", 1);
  refuse_start(a, "cuMemSetAccess");
  unsetenv("KVS_STANDIN_FAIL");
#undef ARGS
}

static const char *const small_pool[] = {
    "--backend", "cuda", "--pool-blocks", "64", "--block-size", "16",
    "--num-layers", "5", "--num-kv-heads", "2", "--head-dim", "16",
    "--dtype", "fp16", NULL};

/* Starts a copier and waits until its copy is under way. */
static pid_t start_copier(const itest_daemon *d, int frees) {
  int p[2];
  char buf[16] = {0};
  CHECK(pipe(p) == 0);
  pid_t pid = spawn("copier", d->socket, frees, p[1]);
  close(p[1]);
  CHECK(read(p[0], buf, 8) == 8 && !strncmp(buf, "copying", 7));
  close(p[0]);
  usleep(100000); /* the request reached the daemon; its copy runs */
  return pid;
}

/* The daemon's copies when things go wrong (stand-in only: it can fault a
 * copy and make one take a second). */
static void copy_failures(void) {
  kvs_connect_opts look = {"test", 30000, 1};
  kvs_client *c;
  kvs_stats st;
  itest_daemon d;

  /* A GPU fault during a copy. */
  setenv("KVS_STANDIN_FAIL", "fault:2", 1);
  itest_daemon_start(&d, small_pool);
  unsetenv("KVS_STANDIN_FAIL");
  CHECK(run_to_end("faulty", d.socket, 0) == 0);
  CHECK_OK(NULL, kvs_connect(d.socket, &look, &c));
  itest_check_pool(c, 1, 0, 0);
  CHECK_OK(c, kvs_stats_get(c, 0, &st));
  /* (The fault shows to the engine's watch, the job failing in flight, or
   * to the next driver call, the job refused at its start.) */
  if (st.copy_errors != 1 || st.daemon_copies < 1 || st.daemon_copies > 2 ||
      (!itest_log_says(&d, "the device failed with 1 job in flight") &&
       !itest_log_says(&d, "could not start; closing the session"))) {
    itest_print_log(&d);
    fprintf(stderr, "copy_errors %llu daemon_copies %llu\n",
            (unsigned long long)st.copy_errors,
            (unsigned long long)st.daemon_copies);
    exit(1);
  }
  kvs_close(c);
  itest_daemon_finish(&d, -1);
  fprintf(stderr, "a GPU fault during a copy: session closed, the daemon "
          "goes on without copies: ok\n");

  /* Requests freed while their copy runs (a Batch: the copying Append,
   * then Free of both): the two blocks stay pinned — in use, off the free
   * queue, never handed to anyone — until the copy ends, then come back. */
  setenv("KVS_STANDIN_COPY_DELAY_MS", "1500", 1);
  itest_daemon_start(&d, small_pool);
  unsetenv("KVS_STANDIN_COPY_DELAY_MS");
  CHECK_OK(NULL, kvs_connect(d.socket, &look, &c));
  pid_t v = start_copier(&d, 1);
  double t0 = itest_now();
  CHECK_OK(c, kvs_stats_get(c, 1, &st));
  if (st.num_requests != 0 || st.used_blocks != 2 || st.check != 0) {
    fprintf(stderr, "while the copy runs: %u requests, %u blocks in use "
            "(want 0 and the 2 pinned), check %d, %.2f s in\n",
            st.num_requests, st.used_blocks, st.check, itest_now() - t0);
    exit(1);
  }
  CHECK(itest_wait(v) == 0);
  itest_check_pool(c, 1, 0, 0);
  fprintf(stderr, "requests freed during a daemon copy: their blocks pinned "
          "until it ended: ok\n");

  /* kill -9 of a worker whose copy runs: the daemon reads nothing more from
   * that session until the copy ends (its replies stay in order), then
   * sees it gone and frees it. */
  v = start_copier(&d, 0);
  CHECK(kill(v, SIGKILL) == 0);
  CHECK(itest_wait(v) == 128 + SIGKILL);
  itest_check_pool(c, 1, 0, 0);
  kvs_close(c);
  itest_daemon_finish(&d, -1);
  fprintf(stderr, "kill -9 during a daemon copy: ok\n");

  /* SIGTERM while a copy runs: the daemon finishes it, sends the reply
   * that waited for it (the copier must get OK), then exits 0. */
  setenv("KVS_STANDIN_COPY_DELAY_MS", "1500", 1);
  itest_daemon_start(&d, small_pool);
  unsetenv("KVS_STANDIN_COPY_DELAY_MS");
  v = start_copier(&d, 2);
  t0 = itest_now();
  CHECK(kill(d.pid, SIGTERM) == 0);
  int dst = itest_wait(d.pid);
  double waited = itest_now() - t0;
  d.pid = 0;
  if (dst != 0 || !itest_log_says(&d, "stopped cleanly")) {
    itest_print_log(&d);
    fprintf(stderr, "kvshared exited %d after SIGTERM\n", dst);
    exit(1);
  }
  CHECK(waited > 0.8); /* it waited for the copy */
  CHECK(itest_wait(v) == 0);
  itest_daemon_kill(&d);
  fprintf(stderr, "SIGTERM during a daemon copy: drained (%.2f s), reply "
          "delivered, exit 0: ok\n", waited);

  /* A copy that outlasts the shutdown (a hung GPU: here a 20 s copy and a
   * 100 ms shutdown_timeout_ms): the daemon gives up after two timeouts
   * and exits 1, saying so, instead of hanging on SIGTERM. */
  const char *hung[32];
  int k = 0;
  for (; small_pool[k]; k++)
    hung[k] = small_pool[k];
  hung[k++] = "--shutdown-timeout-ms";
  hung[k++] = "100";
  hung[k] = NULL;
  setenv("KVS_STANDIN_COPY_DELAY_MS", "20000", 1);
  itest_daemon_start(&d, hung);
  unsetenv("KVS_STANDIN_COPY_DELAY_MS");
  v = start_copier(&d, 0);
  t0 = itest_now();
  CHECK(kill(d.pid, SIGTERM) == 0);
  dst = itest_wait(d.pid);
  waited = itest_now() - t0;
  d.pid = 0;
  if (dst != 1 || waited > 10 ||
      !itest_log_says(&d, "copies still in flight 100 ms after the sessions "
                          "closed; exiting without them")) {
    itest_print_log(&d);
    fprintf(stderr, "kvshared exited %d after %.2f s\n", dst, waited);
    exit(1);
  }
  CHECK(itest_wait(v) == 0); /* ECLOSED */
  itest_daemon_kill(&d);
  fprintf(stderr, "SIGTERM with a hung copy: exit 1 after %.2f s: ok\n",
          waited);
}

/* Processes other than the daemon and this test that map the pool. */
static int other_mappers(pid_t daemon) {
  DIR *d = opendir("/proc");
  struct dirent *e;
  int n = 0;
  CHECK(d);
  while ((e = readdir(d))) {
    pid_t pid = (pid_t)atoi(e->d_name);
    if (pid > 0 && pid != daemon && pid != getpid() &&
        standin_maps_of(pid, daemon))
      n++;
  }
  closedir(d);
  return n;
}

int main(int argc, char **argv) {
  for (uint32_t i = 0; i < PROMPT; i++)
    prompt[i] = tok(i);
  real_gpu = getenv("KVS_GPU_POOL_REAL") && atoi(getenv("KVS_GPU_POOL_REAL"));
  if (argc > 3 && !strcmp(argv[1], "--role"))
    return run_role(argc, argv);

  char driver[512];
  const char *build = getenv("KVS_BUILD") ? getenv("KVS_BUILD") : "build";
  if (real_gpu) {
    const char *why;
    if (kvs_cuda_available(&why)) {
      printf("skipped: no GPU (%s)\n", why);
      return 77;
    }
    snprintf(driver, sizeof driver, "%s",
             getenv("KVS_CUDA_DRIVER") ? getenv("KVS_CUDA_DRIVER")
                                       : "libcuda.so.1");
  } else {
    snprintf(driver, sizeof driver, "%s/tests/standin/libcuda-standin.so",
             build);
    CHECK(access(driver, R_OK) == 0);
    fprintf(stderr, "on the stand-in CUDA driver %s (no GPU: this proves "
            "the plumbing, not the device)\n", driver);
    setenv("KVS_CUDA_DRIVER", driver, 1);
  }
  unsetenv("KVS_STANDIN_FAIL");
  startup_checks(driver);

  const char *args[] = {"--backend", "cuda", "--pool-blocks", "1024",
                        "--gpu-chunk-size", "2M", "--block-size", "16",
                        "--num-layers", "5", "--num-kv-heads", "2",
                        "--head-dim", "16", "--dtype", "fp16", NULL};
  itest_daemon d;
  itest_daemon_start(&d, args);
  if (!itest_log_says(&d, real_gpu ? "pool: GPU" : "pool: GPU " STANDIN_UUID) ||
      !itest_log_says(&d, "cuda pool of 1024 blocks")) {
    itest_print_log(&d);
    exit(1);
  }
  kvs_connect_opts look = {"test", 30000, 1};
  kvs_client *c;
  CHECK_OK(NULL, kvs_connect(d.socket, &look, &c));
  CHECK(strcmp(kvs_pool_backend(c), "cuda") == 0);
  CHECK(kvs_pool_base(c) == NULL); /* no_map */

  /* One worker computes the prompt; three others read it at once. */
  CHECK(run_to_end("writer", d.socket, 0) == 0);
  pid_t r[3];
  for (int i = 0; i < 3; i++)
    r[i] = spawn("reader", d.socket, i, -1);
  for (int i = 0; i < 3; i++)
    CHECK(itest_wait(r[i]) == 0);
  itest_check_pool(c, 1, 0, 0);
  kvs_stats st;
  CHECK_OK(c, kvs_stats_get(c, 0, &st));
  CHECK(strcmp(st.backend, "cuda") == 0);
  CHECK(st.daemon_copies >= 2 && st.daemon_copy_blocks >= 5);
  CHECK(st.copy_errors == 0);
  CHECK(st.cached_blocks >= PROMPT / BS);

  /* Workers that must be refused, with the reason and nothing leaked. */
  CHECK(run_to_end("no-driver", d.socket, 0) == 0);
  if (!real_gpu) {
    CHECK(run_to_end("wrong-gpu", d.socket, 0) == 0);
    CHECK(run_to_end("import-fails", d.socket, 0) == 0);
    CHECK(run_to_end("map-fails", d.socket, 0) == 0);
    CHECK(run_to_end("no-kernels", d.socket, 0) == 0);
  }
  CHECK(run_to_end("churn", d.socket, 0) == 0);
  itest_check_pool(c, 1, 0, 0);

  /* kill -9 of workers in the middle of their steps: the daemon frees
   * their requests, the pool is whole, nothing maps the pool but the
   * daemon, and on a GPU the device memory the workers held comes back. */
  unsigned long long free0 = real_gpu ? gpu_free() : 0;
  for (int round = 0; round < 6; round++) {
    int p[2];
    CHECK(pipe(p) == 0);
    pid_t v = spawn("victim", d.socket, round, p[1]);
    close(p[1]);
    char buf[8] = {0};
    CHECK(read(p[0], buf, 6) == 6 && !strncmp(buf, "ready", 5));
    close(p[0]);
    usleep(20000 + 15000 * (useconds_t)round);
    CHECK(kill(v, SIGKILL) == 0);
    CHECK(itest_wait(v) == 128 + SIGKILL);
    itest_check_pool(c, 1, 0, 0);
    if (!real_gpu)
      CHECK(other_mappers(d.pid) == 0);
  }
  if (real_gpu) {
    unsigned long long free1 = gpu_free();
    long long lost = (long long)free0 - (long long)free1;
    printf("GPU free memory before the kills %llu MiB, after %llu MiB\n",
           free0 >> 20, free1 >> 20);
    CHECK(lost < (64ll << 20)); /* a leaked context would be ~500 MiB */
  }
  CHECK_OK(c, kvs_stats_get(c, 0, &st));
  CHECK(st.copy_errors == 0);
  kvs_close(c);
  itest_daemon_finish(&d, -1);

  /* int8 and fp8 pools: the quantizing write and attention on the device
   * (the C twins behind them on the stand-in: the plumbing). */
  static const char *const qdtypes[] = {"int8", "fp8"};
  for (int i = 0; i < 2; i++) {
    const char *qargs[] = {"--backend", "cuda", "--pool-blocks", "64",
                           "--gpu-chunk-size", "2M", "--block-size", "16",
                           "--num-layers", "2", "--num-kv-heads", "2",
                           "--head-dim", "128", "--dtype", qdtypes[i], NULL};
    itest_daemon_start(&d, qargs);
    CHECK(run_to_end("quant", d.socket, 0) == 0);
    itest_daemon_finish(&d, -1);
  }
  if (!real_gpu)
    copy_failures();
  printf("gpu pool: %s: export, import, kernels, CoW by daemon and worker, "
         "refusals, kill -9, int8 and fp8 pools%s: ok\n", real_gpu ? "real GPU" : "stand-in driver",
         real_gpu ? "" : ", copies that fault or outlive their session");
  return 0;
}
