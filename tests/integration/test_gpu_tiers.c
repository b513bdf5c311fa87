/*
 * test_gpu_tiers.c — the tiers under a cuda pool.  The daemon's copies
 * between the device and the host tier, and between the device and the
 * disk tier's staging buffers, run on its CUDA stream from pinned memory.
 *
 * On a machine without a GPU it runs on the stand-in driver
 * (tests/standin/), with KVS_STANDIN_PINNED_ONLY=1 for the daemon: an async
 * copy from or to memory that is not registered is refused there, where a
 * real driver would quietly copy it synchronously, on the daemon's loop.
 * With KVS_GPU_POOL_REAL=1 it runs on the real libcuda.so.1 (a GPU
 * machine: tests/gpu/run.sh).
 *
 * 1. A host tier and a disk tier: a worker computes three times the
 *    pool's blocks, writing each block's bytes into the device; then every
 *    prompt is looked up again (promotions from both tiers) and every
 *    block the lookup returns is read back from the device and checked.
 * 2. A disk tier alone (nothing pinned between it and the device but its
 *    staging buffers), two of whose reads fail (a flipped bit, EIO): the
 *    same fill and lookups, each fault a miss and a counter, never a wrong
 *    byte; then requests swapped out to the disk and back in, checked.
 * Each ends with no copy error, no refused copy in the daemon's log, the
 * pool whole, and a clean exit.
 */
#include <string.h>
#include <unistd.h>

#include "gpu/kvs_kernels.h"
#include "tests/integration/itest.h"

#define NPROMPTS 24
#define FULL 4 /* full blocks per prompt; prompts have FULL * bs + 1 tokens */
#define NSWAP 3

static int real_gpu;
static itest_daemon d;

static uint8_t pattern(uint64_t key, uint32_t blk, size_t i) {
  uint64_t x = (key + 1) * 0x9e3779b97f4a7c15ull ^ (blk + 1) * 0xd6e8feb8ull ^
               i * 0x2545f491u;
  x ^= x >> 31;
  return (uint8_t)(x * 0x94d049bb133111ebull >> 56);
}

/* Writes the pattern of (key, blk) into pool block b, through the driver. */
static void write_block(kvs_client *c, uint32_t b, uint64_t key,
                        uint32_t blk) {
  size_t n = kvs_layout_of(c)->block_stride;
  uint8_t *x = malloc(n);

  CHECK(x);
  for (size_t i = 0; i < n; i++)
    x[i] = pattern(key, blk, i);
  CHECK(kvs_cuda_memcpy_htod(kvs_block_ptr(c, b), x, n) == 0);
  free(x);
}

/* The bytes of pool block b that are not the pattern of (key, blk). */
static long bad_bytes(kvs_client *c, uint32_t b, uint64_t key, uint32_t blk) {
  size_t n = kvs_layout_of(c)->block_stride;
  uint8_t *x = malloc(n);
  long bad = 0;

  CHECK(x);
  CHECK(kvs_cuda_memcpy_dtoh(x, kvs_block_ptr(c, b), n) == 0);
  for (size_t i = 0; i < n; i++)
    bad += x[i] != pattern(key, blk, i);
  free(x);
  return bad;
}

static uint32_t ntokens(kvs_client *c) {
  return FULL * kvs_layout_of(c)->block_size + 1;
}

static void prompt_tokens(uint32_t p, uint32_t *tok, uint32_t n) {
  for (uint32_t i = 0; i < n; i++)
    tok[i] = 200000 * (p + 1) + i;
}

static void compute(kvs_client *c, uint32_t p) {
  uint32_t n = ntokens(c), tok[64];
  kvs_lookup_result lr;
  kvs_alloc_result ar;

  prompt_tokens(p, tok, n);
  CHECK_OK(c, kvs_lookup(c, p, tok, n, NULL, 0, &lr));
  CHECK(lr.hit_tokens == 0);
  CHECK_OK(c, kvs_allocate(c, p, n, &ar));
  for (uint32_t i = 0; i < FULL; i++)
    write_block(c, ar.blocks[i], p, i);
  CHECK_OK(c, kvs_commit(c, p, 0, NULL, n, NULL, 0, NULL));
  CHECK_OK(c, kvs_free(c, p));
}

/* Looks prompt p up (promoting), checks every returned block's bytes on
 * the device; returns the hit in blocks. */
static uint32_t lookup_check(kvs_client *c, uint32_t p, uint64_t id) {
  uint32_t n = ntokens(c), tok[64];
  kvs_lookup_result lr;

  prompt_tokens(p, tok, n);
  CHECK_OK(c, kvs_lookup(c, id, tok, n, NULL, 0, &lr));
  CHECK(lr.num_blocks * kvs_layout_of(c)->block_size == lr.hit_tokens);
  for (uint32_t i = 0; i < lr.num_blocks; i++) {
    long bad = bad_bytes(c, lr.blocks[i], p, i);
    if (bad) {
      fprintf(stderr, "prompt %u block %u (pool block %u): %ld wrong bytes "
              "on the device\n", p, i, lr.blocks[i], bad);
      exit(1);
    }
  }
  CHECK_OK(c, kvs_free(c, id));
  return lr.num_blocks;
}

static void tier_stats(kvs_client *c, kvs_tier_stats *ts, uint32_t want,
                       uint64_t *lost) {
  uint32_t n = 0;

  CHECK_OK(c, kvs_tier_stats_get(c, ts, 2, &n, lost));
  CHECK(n == want);
}

/* Fills, then looks every prompt up; the tiers' counters into ts (ntiers
 * of them) and lost; returns the blocks hit. */
static uint32_t fill_and_lookup(kvs_client *c, const char *label,
                                kvs_tier_stats *ts, uint32_t ntiers,
                                uint64_t *lost) {
  uint32_t hits = 0;

  for (uint32_t p = 0; p < NPROMPTS; p++) {
    compute(c, p);
    usleep(20000); /* a few demotion ticks: write-back keeps up */
  }
  usleep(100000);
  for (uint32_t p = 0; p < NPROMPTS; p++) {
    hits += lookup_check(c, p, 1000 + p);
    usleep(20000);
  }
  tier_stats(c, ts, ntiers, lost);
  fprintf(stderr, "%s: %u of %u blocks hit, lost %llu\n", label, hits,
          NPROMPTS * FULL, (unsigned long long)*lost);
  for (uint32_t i = 0; i < ntiers; i++)
    fprintf(stderr, "  %s: demoted %llu promoted %llu, failures %llu "
            "(checksum %llu, I/O %llu)\n", ts[i].name,
            (unsigned long long)ts[i].demotions,
            (unsigned long long)ts[i].promotions,
            (unsigned long long)ts[i].failures,
            (unsigned long long)ts[i].checksum_failures,
            (unsigned long long)ts[i].io_errors);
  return hits;
}

static void start(const char *const *tail) {
  const char *opts[32] = {"--backend", "cuda", "--pool-blocks", "32",
                          "--block-size", "4", "--num-layers", "2",
                          "--num-kv-heads", "1", "--head-dim", "64",
                          "--dtype", "fp32"};
  int k = 14;

  for (int i = 0; tail[i]; i++)
    opts[k++] = tail[i];
  opts[k] = NULL;
  if (!real_gpu)
    setenv("KVS_STANDIN_PINNED_ONLY", "1", 1);
  itest_daemon_start(&d, opts);
  unsetenv("KVS_STANDIN_PINNED_ONLY");
}

/* No copy failed, none was refused for pageable memory; the pool whole;
 * a clean exit. */
static void finish(kvs_client *c) {
  kvs_stats st;

  CHECK_OK(c, kvs_stats_get(c, 0, &st));
  CHECK(strcmp(st.backend, "cuda") == 0);
  if (st.copy_errors != 0 || itest_log_says(&d, "pageable host memory")) {
    itest_print_log(&d);
    fprintf(stderr, "copy errors: %llu\n",
            (unsigned long long)st.copy_errors);
    exit(1);
  }
  itest_check_pool(c, 1, 0, 0);
  kvs_close(c);
  itest_daemon_finish(&d, -1);
}

/* How the daemon's device <-> host copies go: batched (one
 * cuMemcpyBatchAsync a job), block by block (KVS_CUDA_COPY_BATCH=0), or
 * batched until the driver refuses a batch (the stand-in's memcpy_batch
 * failure point), then block by block. */
enum { COPIES_BATCHED, COPIES_BY_BLOCK, COPIES_REFUSED };

static void host_and_disk(const char *disk, int copies) {
  const char *tail[] = {"--host-tier-bytes", "64K", "--disk-tier", disk,
                        "--disk-tier-bytes", "2M", NULL};
  kvs_tier_stats ts[2];
  uint64_t lost;

  if (!real_gpu) {
    setenv("KVS_STANDIN_REPORT", "1", 1);
    if (copies == COPIES_REFUSED)
      setenv("KVS_STANDIN_FAIL", "memcpy_batch", 1);
  }
  if (copies == COPIES_BY_BLOCK)
    setenv("KVS_CUDA_COPY_BATCH", "0", 1);
  start(tail);
  unsetenv("KVS_STANDIN_REPORT");
  unsetenv("KVS_STANDIN_FAIL");
  unsetenv("KVS_CUDA_COPY_BATCH");
  if (!itest_log_says(&d, "MiB, pinned") ||
      !itest_log_says(&d, "staging buffers pinned") ||
      !itest_log_says(&d, copies == COPIES_BY_BLOCK
                              ? "device <-> host copies block by block"
                              : "device <-> host copies batched")) {
    itest_print_log(&d);
    exit(1);
  }
  kvs_client *c = itest_connect(&d, "gpu-tiers");
  CHECK(strcmp(kvs_pool_backend(c), "cuda") == 0);
  CHECK(kvs_layout_of(c)->block_stride == 4096);
  uint32_t hits = fill_and_lookup(c, "host + disk", ts, 2, &lost);
  /* Every block found, or counted lost (evicted before write-back caught
   * up: a slow machine). */
  CHECK(hits + FULL * lost >= NPROMPTS * FULL);
  CHECK(hits >= NPROMPTS * FULL / 2);
  CHECK(ts[0].promotions > 0 && ts[1].promotions > 0);
  CHECK(ts[0].failures == 0 && ts[1].failures == 0);
  CHECK(ts[1].io_errors == 0 && ts[1].checksum_failures == 0);
  if (!real_gpu) { /* the stand-in says each batched call it queued */
    int batched = itest_log_says(&d, "cuda stand-in: a batched copy of");
    int fell_back = itest_log_says(&d, "go block by block from now on");

    if (batched != (copies == COPIES_BATCHED) ||
        fell_back != (copies == COPIES_REFUSED)) {
      itest_print_log(&d);
      fprintf(stderr, "copies mode %d: batched %d, fell back %d\n", copies,
              batched, fell_back);
      exit(1);
    }
  }
  finish(c);
}

/* The stand-in's batched copies in one direction ("host to device" or
 * "device to host") so far, waiting up to 5 s for more than `above` (the
 * daemon's log is read as it grows). */
static int batched_copies(const char *dir, int above) {
  char what[64];
  int n = 0;

  snprintf(what, sizeof what, "(%s, batched)", dir);
  for (int i = 0; i < 500 && (n = itest_log_count(&d, what)) <= above; i++)
    usleep(10000);
  return n;
}

static void disk_alone(const char *disk) {
  const char *tail[] = {"--disk-tier", disk, "--disk-tier-bytes", "2M",
                        "--tier-fault", "flip:1,read-eio:2", NULL};
  kvs_tier_stats ts[2];
  kvs_swap_result sr;
  kvs_swap_stats ss;
  uint64_t lost;

  if (!real_gpu)
    setenv("KVS_STANDIN_REPORT", "1", 1);
  start(tail);
  unsetenv("KVS_STANDIN_REPORT");
  if (!itest_log_says(&d, "staging buffers pinned")) {
    itest_print_log(&d);
    exit(1);
  }
  kvs_client *c = itest_connect(&d, "gpu-disk");
  uint32_t hits = fill_and_lookup(c, "disk alone", ts, 1, &lost);
  CHECK(strcmp(ts[0].name, "disk") == 0);
  CHECK(ts[0].checksum_failures == 1 && ts[0].io_errors == 1);
  CHECK(ts[0].failures == 2);
  /* each fault a miss, with what follows it in its prompt's chain */
  CHECK(hits + FULL * lost + 2 * FULL >= NPROMPTS * FULL);
  CHECK(ts[0].promotions > 0);

  /* Requests swapped out to the disk, the pool cycled, swapped back in:
   * the bytes come back through the staging buffers. */
  uint32_t n = FULL * kvs_layout_of(c)->block_size, tok[64];
  kvs_lookup_result lr;
  kvs_alloc_result ar;
  int out0 = real_gpu ? 0 : batched_copies("device to host", -1);
  for (uint64_t r = 1; r <= NSWAP; r++) {
    prompt_tokens(5000 + (uint32_t)r, tok, n);
    CHECK_OK(c, kvs_lookup(c, r, tok, n, NULL, 0, &lr));
    CHECK_OK(c, kvs_allocate(c, r, n, &ar));
    for (uint32_t i = 0; i < ar.num_blocks; i++)
      write_block(c, ar.blocks[i], 5000 + r, i);
    CHECK_OK(c, kvs_commit(c, r, 0, NULL, n, NULL, 0, NULL));
    CHECK_OK(c, kvs_swap_out(c, r, &sr));
    CHECK(sr.tokens == n);
  }
  /* On the stand-in each SwapOut's FULL blocks leave in one batched copy
   * (demotions may add more of them: this proves swaps do not go block by
   * block only as far as the count goes); each SwapIn's come back in one,
   * and nothing else copies to the device while they run (no Lookup). */
  if (!real_gpu)
    CHECK(batched_copies("device to host", out0 + NSWAP - 1) >= out0 + NSWAP);
  for (uint32_t p = 100; p < 100 + 32 / FULL; p++) /* the pool cycled */
    compute(c, p);
  int in0 = real_gpu ? 0 : batched_copies("host to device", -1);
  for (uint64_t r = 1; r <= NSWAP; r++) {
    CHECK_OK(c, kvs_swap_in(c, r, &sr));
    CHECK(sr.tokens == n && sr.lost_tokens == 0 && sr.num_blocks == FULL);
    for (uint32_t i = 0; i < sr.num_blocks; i++)
      CHECK(bad_bytes(c, sr.blocks[i], 5000 + r, i) == 0);
    CHECK_OK(c, kvs_free(c, r));
  }
  if (!real_gpu) {
    int in1 = batched_copies("host to device", in0 + NSWAP - 1);
    if (in1 != in0 + NSWAP) {
      itest_print_log(&d);
      fprintf(stderr, "swap-in: %d batched copies to the device, want %d\n",
              in1 - in0, NSWAP);
      exit(1);
    }
  }
  CHECK_OK(c, kvs_swap_stats_get(c, &ss));
  fprintf(stderr, "swap: %llu blocks out, %llu kept below, %llu in\n",
          (unsigned long long)ss.out_blocks,
          (unsigned long long)ss.kept_blocks,
          (unsigned long long)ss.in_blocks);
  CHECK(ss.swap_outs == NSWAP && ss.swap_ins == NSWAP && ss.failures == 0);
  CHECK(ss.in_blocks > 0);
  finish(c);
}

int main(void) {
  char driver[512], disk[400];
  const char *build = getenv("KVS_BUILD") ? getenv("KVS_BUILD") : "build";
  const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";

  real_gpu = getenv("KVS_GPU_POOL_REAL") && atoi(getenv("KVS_GPU_POOL_REAL"));
  if (real_gpu) {
    const char *why;
    if (kvs_cuda_available(&why)) {
      printf("skipped: no GPU (%s)\n", why);
      return 77;
    }
  } else {
    snprintf(driver, sizeof driver, "%s/tests/standin/libcuda-standin.so",
             build);
    CHECK(access(driver, R_OK) == 0);
    fprintf(stderr, "on the stand-in CUDA driver %s (no GPU: this proves "
            "the plumbing, not the device)\n", driver);
    setenv("KVS_CUDA_DRIVER", driver, 1);
  }
  snprintf(disk, sizeof disk, "%s/gpu-tiers-%d", tmp, (int)getpid());
  host_and_disk(disk, COPIES_BATCHED);
  unlink(disk);
  if (!real_gpu) { /* (the driver's choice on a GPU) */
    host_and_disk(disk, COPIES_BY_BLOCK);
    unlink(disk);
    host_and_disk(disk, COPIES_REFUSED);
    unlink(disk);
  }
  disk_alone(disk);
  unlink(disk);
  return 0;
}
