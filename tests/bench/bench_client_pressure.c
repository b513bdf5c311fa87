/*
 * bench_client_pressure — what the tiers cost a worker under memory
 * pressure, measured through the daemon.
 *
 * 1. Allocation latency with demotion on against off.  A worker runs
 *    prefill cycles on a full pool (lookup of a new prompt, allocate its
 *    blocks, write them, commit, free), so that every allocation evicts
 *    cached blocks.  Without tiers an eviction is free; with tiers the
 *    daemon must have copied each victim below first, in the background,
 *    so that the allocation never waits for a copy.  The round trip of each
 *    Allocate is timed; its median and 99th percentile with a host tier,
 *    and with host + disk tiers, are reported as ratios to the daemon
 *    without tiers, the three daemons run in turn, twice (same run, same
 *    machine).  tier_lost says whether write-back kept up (a block it
 *    lost is a later miss, never a wait); the disk's write rate and the
 *    evictions' rate say how hard write-back worked.
 * 2. Swap: a request of SWAP_BLOCKS blocks swapped out and back in through
 *    the daemon (host tier) against memcpy of the same bytes twice, and
 *    against two small round trips (Ping) + that memcpy.
 * 3. A burst of demotion: on a pool of BURST_POOL blocks with a host tier
 *    (alone, then over a disk tier), a worker allocates BURST_BLOCKS blocks
 *    at once, taking the reserve of demoted blocks and more, so that the
 *    daemon then has hundreds of blocks to copy down; another client times
 *    Pings right after; the same Pings with nothing moving are the
 *    baseline.  What that work costs a client that arrives meanwhile: the
 *    Pings' p99 and worst round trips, as ratios to the quiet ones.
 *
 * `bench_client_pressure burst` runs 3 alone, `bench_client_pressure
 * alloc` 1 alone.
 * KVS_BENCH_DIR: where the disk tier's file goes (default: the build
 * directory; not /tmp, which may be tmpfs).  KVS_BENCH_QUICK=1: fewer
 * cycles.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/integration/itest.h"

#define POOL "512"
#define PROMPT_BLOCKS 4
#define SWAP_BLOCKS 64

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double pct(double *v, size_t n, double p) {
  size_t i = (size_t)(p * (double)(n - 1));
  return v[i];
}

typedef struct run {
  const char *name;
  double *lat; /* µs, every Allocate of every round */
  size_t n;
  uint64_t lost, demoted, evicted;
  double secs;          /* in the cycles, every round */
  uint64_t disk_bytes;  /* written to the disk tier, every round */
} run;

/* Common options: 16-token blocks of 64 KiB (8 layers x K,V x 16 tokens x
 * 8 heads x 16 dims x fp16). */
#define LAYOUT "--pool-blocks", POOL, "--num-layers", "8", "--num-kv-heads", \
               "8", "--head-dim", "16", "--dtype", "fp16"

static void cycles(run *r, const char *const *opts, uint32_t ncycles,
                   uint64_t base) {
  itest_daemon d;
  itest_daemon_start(&d, opts);
  kvs_client *c = itest_connect(&d, "pressure");
  const kvs_layout *l = kvs_layout_of(c);
  uint32_t n = PROMPT_BLOCKS * l->block_size, tok[PROMPT_BLOCKS * 64];
  kvs_lookup_result lr;
  kvs_alloc_result ar;
  kvs_tier_stats ts[2];
  kvs_stats st;
  uint32_t nt;
  uint64_t lost = 0;

  CHECK(l->block_size <= 64);
  double start = itest_now();
  for (uint32_t i = 0; i < ncycles; i++) {
    uint64_t id = base + i;
    for (uint32_t k = 0; k < n; k++)
      tok[k] = (uint32_t)(id * 131 + k);
    CHECK_OK(c, kvs_lookup(c, id, tok, n, NULL, 0, &lr));
    double t0 = itest_now();
    CHECK_OK(c, kvs_allocate(c, id, n - lr.hit_tokens, &ar));
    r->lat[r->n++] = (itest_now() - t0) * 1e6;
    for (uint32_t b = 0; b < ar.num_blocks; b++)
      memset(kvs_block_ptr(c, ar.blocks[b]), (int)(id + b), l->block_stride);
    CHECK_OK(c, kvs_commit(c, id, 0, NULL, n, NULL, 0, NULL));
    CHECK_OK(c, kvs_free(c, id));
  }
  r->secs += itest_now() - start;
  CHECK_OK(c, kvs_stats_get(c, 0, &st));
  r->evicted += st.evictions;
  CHECK_OK(c, kvs_tier_stats_get(c, ts, 2, &nt, &lost));
  r->lost += lost;
  for (uint32_t i = 0; i < nt; i++) {
    r->demoted += ts[i].demotions;
    if (strcmp(ts[i].name, "disk") == 0)
      r->disk_bytes += ts[i].bytes_in;
  }
  kvs_close(c);
  itest_daemon_finish(&d, -1);
}

static void bench_alloc(const char *dir, int quick) {
  char disk[512];
  const uint32_t ncycles = quick ? 2000 : 10000, rounds = 2;
  const char *off[] = {LAYOUT, NULL};
  const char *host[] = {LAYOUT, "--host-tier-bytes", "256M", NULL};
  const char *both[] = {LAYOUT, "--host-tier-bytes", "64M", "--disk-tier",
                        disk, "--disk-tier-bytes", "512M", NULL};
  run runs[3] = {{.name = "no tiers"}, {.name = "host tier"},
                 {.name = "host + disk"}};
  const char *const *opts[3] = {off, host, both};

  snprintf(disk, sizeof disk, "%s/bench-pressure-%d", dir, (int)getpid());
  for (int i = 0; i < 3; i++)
    runs[i].lat = calloc((size_t)ncycles * rounds, sizeof(double));
  for (uint32_t round = 0; round < rounds; round++)
    for (int i = 0; i < 3; i++) {
      cycles(&runs[i], opts[i], ncycles, (uint64_t)round * ncycles * 10 + 1);
      unlink(disk);
    }
  printf("allocation under pressure (pool %s blocks of 64 KiB, %u prefill "
         "cycles of %d blocks x %u rounds per daemon):\n", POOL, ncycles,
         PROMPT_BLOCKS, rounds);
  double p50_0 = 0, p99_0 = 0;
  for (int i = 0; i < 3; i++) {
    run *r = &runs[i];
    qsort(r->lat, r->n, sizeof(double), cmp_double);
    double p50 = pct(r->lat, r->n, 0.5), p99 = pct(r->lat, r->n, 0.99);
    if (i == 0) {
      p50_0 = p50;
      p99_0 = p99;
    }
    printf("  %-12s  Allocate round trip p50 %.1f us (%.2fx no tiers), p99 "
           "%.1f us (%.2fx), max %.0f us; evicted %llu, demoted %llu, lost "
           "%llu\n", r->name, p50, p50 / p50_0, p99, p99 / p99_0,
           r->lat[r->n - 1], (unsigned long long)r->evicted,
           (unsigned long long)r->demoted, (unsigned long long)r->lost);
    if (i == 2)
      printf("%16s(the disk tier wrote %.0f MB/s; %.0f evictions a "
             "second)\n", "", (double)r->disk_bytes / r->secs / 1e6,
             (double)r->evicted / r->secs);
    free(r->lat);
  }
}

#define BURST_POOL "4096"
#define BURST_BLOCKS 1024
#define BURST_PINGS 400

/* n Pings by c, timed, into v (µs). */
static void pings(kvs_client *c, double *v, int n) {
  for (int i = 0; i < n; i++) {
    double t0 = itest_now();
    CHECK_OK(c, kvs_ping(c, "burst", 5));
    v[i] = (itest_now() - t0) * 1e6;
  }
}

/* with_disk: a 64 MiB host tier over a 1 GiB disk tier; else a 1 GiB host
 * tier alone. */
static void bench_burst(const char *dir, int quick, int with_disk) {
  char disk[512];
  const char *opts[] = {"--pool-blocks", BURST_POOL, "--num-layers", "8",
                        "--num-kv-heads", "8", "--head-dim", "16", "--dtype",
                        "fp16", "--host-tier-bytes",
                        with_disk ? "64M" : "1G", with_disk ? "--disk-tier"
                                                            : NULL,
                        disk, "--disk-tier-bytes", "1G", NULL};
  const int bursts = quick ? 4 : 12;
  double *quiet = calloc((size_t)bursts * BURST_PINGS, sizeof(double));
  double *busy = calloc((size_t)bursts * BURST_PINGS, sizeof(double));
  itest_daemon d;
  kvs_tier_stats ts[2];
  uint32_t nt;
  uint64_t lost, demoted = 0;

  CHECK(quiet && busy);
  snprintf(disk, sizeof disk, "%s/bench-burst-%d", dir, (int)getpid());
  itest_daemon_start(&d, opts);
  kvs_client *w = itest_connect(&d, "burst-worker");
  kvs_client *p = itest_connect(&d, "burst-pinger");
  const kvs_layout *l = kvs_layout_of(w);
  uint32_t n = BURST_BLOCKS * l->block_size, *tok = malloc(n * 4);
  kvs_lookup_result lr;
  kvs_alloc_result ar;

  CHECK(tok);
  for (int b = 0; b < bursts; b++) {
    uint64_t id = 1000 + (uint64_t)b;

    for (uint32_t k = 0; k < n; k++)
      tok[k] = (uint32_t)(id * 7919 + k);
    /* Quiet first: wait until nothing moves, then the baseline Pings. */
    for (int k = 0; k < 100; k++) {
      usleep(10000);
      CHECK_OK(p, kvs_ping(p, "x", 1));
    }
    pings(p, quiet + (size_t)b * BURST_PINGS, BURST_PINGS);
    /* The Allocate takes the reserve (and more) at once: the daemon then
     * copies a new reserve down, and the Pings arrive meanwhile. */
    CHECK_OK(w, kvs_lookup(w, id, tok, n, NULL, 0, &lr));
    CHECK_OK(w, kvs_allocate(w, id, n - lr.hit_tokens, &ar));
    pings(p, busy + (size_t)b * BURST_PINGS, BURST_PINGS);
    for (uint32_t i = 0; i < ar.num_blocks; i++)
      memset(kvs_block_ptr(w, ar.blocks[i]), (int)(id + i), l->block_stride);
    CHECK_OK(w, kvs_commit(w, id, 0, NULL, n, NULL, 0, NULL));
    CHECK_OK(w, kvs_free(w, id));
  }
  CHECK_OK(w, kvs_tier_stats_get(w, ts, 2, &nt, &lost));
  for (uint32_t i = 0; i < nt; i++)
    demoted += ts[i].demotions;
  free(tok);
  kvs_close(w);
  kvs_close(p);
  itest_daemon_finish(&d, -1);
  unlink(disk);
  size_t m = (size_t)bursts * BURST_PINGS;
  qsort(quiet, m, sizeof(double), cmp_double);
  qsort(busy, m, sizeof(double), cmp_double);
  printf("a burst of demotion (pool %s blocks of 64 KiB, %s; %d x %d "
         "blocks allocated at once, %d Pings right after each; demoted %llu, "
         "lost %llu):\n", BURST_POOL,
         with_disk ? "host tier 64 MiB + disk tier 1 GiB" : "host tier 1 GiB",
         bursts, BURST_BLOCKS, BURST_PINGS, (unsigned long long)demoted,
         (unsigned long long)lost);
  printf("  Ping after a burst: p50 %.1f us (%.2fx quiet), p99 %.1f us "
         "(%.2fx), max %.0f us (%.2fx); quiet p99 %.1f us, max %.0f us\n",
         pct(busy, m, 0.5), pct(busy, m, 0.5) / pct(quiet, m, 0.5),
         pct(busy, m, 0.99), pct(busy, m, 0.99) / pct(quiet, m, 0.99),
         busy[m - 1], busy[m - 1] / quiet[m - 1], pct(quiet, m, 0.99),
         quiet[m - 1]);
  free(quiet);
  free(busy);
}

static void bench_swap(int quick) {
  const char *opts[] = {LAYOUT, "--host-tier-bytes", "64M", NULL};
  itest_daemon d;
  const int reps = quick ? 20 : 100;

  itest_daemon_start(&d, opts);
  kvs_client *c = itest_connect(&d, "swap");
  const kvs_layout *l = kvs_layout_of(c);
  uint32_t n = SWAP_BLOCKS * l->block_size - 3, *tok = malloc(n * 4);
  size_t bytes = (size_t)SWAP_BLOCKS * l->block_stride;
  uint8_t *a = malloc(bytes), *b = malloc(bytes);
  kvs_lookup_result lr;
  kvs_alloc_result ar;
  kvs_swap_result sr;
  double best_swap = 1e30, best_copy = 1e30, best_ping = 1e30;

  for (uint32_t k = 0; k < n; k++)
    tok[k] = 77 + k;
  CHECK_OK(c, kvs_lookup(c, 1, tok, n, NULL, 0, &lr));
  CHECK_OK(c, kvs_allocate(c, 1, n, &ar));
  for (uint32_t i = 0; i < ar.num_blocks; i++)
    memset(kvs_block_ptr(c, ar.blocks[i]), (int)i, l->block_stride);
  /* written but not committed: no block sealed, so every swap copies
   * every block both ways (nothing kept below, nothing resident) */
  memset(a, 1, bytes);
  memset(b, 2, bytes);
  for (int r = 0; r < reps; r++) {
    double t0 = itest_now();
    CHECK_OK(c, kvs_swap_out(c, 1, &sr));
    CHECK(sr.copied_blocks == SWAP_BLOCKS);
    CHECK_OK(c, kvs_swap_in(c, 1, &sr));
    CHECK(sr.copied_blocks == SWAP_BLOCKS);
    double t1 = itest_now();
    memcpy(b, a, bytes);
    memcpy(a, b, bytes);
    double t2 = itest_now();
    CHECK_OK(c, kvs_ping(c, "x", 1));
    CHECK_OK(c, kvs_ping(c, "x", 1));
    double t3 = itest_now();
    if (t1 - t0 < best_swap)
      best_swap = t1 - t0;
    if (t2 - t1 < best_copy)
      best_copy = t2 - t1;
    if (t3 - t2 < best_ping)
      best_ping = t3 - t2;
  }
  CHECK(a[bytes - 1] == 1 && b[0] == 1); /* (the copies happened) */
  printf("swap out + in of %d blocks (%zu KiB) through the daemon, host "
         "tier, best of %d: %.0f us = %.2fx memcpy of the bytes twice "
         "(%.0f us, %.1f GB/s), %.2fx that memcpy + 2 ping round trips\n",
         SWAP_BLOCKS, bytes >> 10, reps, best_swap * 1e6,
         best_swap / best_copy, best_copy * 1e6, 2 * bytes / best_copy / 1e9,
         best_swap / (best_copy + best_ping));
  CHECK_OK(c, kvs_free(c, 1));
  free(tok);
  free(a);
  free(b);
  kvs_close(c);
  itest_daemon_finish(&d, -1);
}

int main(int argc, char **argv) {
  const char *dir = getenv("KVS_BENCH_DIR");
  const char *build = getenv("KVS_BUILD");
  int quick = getenv("KVS_BENCH_QUICK") != NULL;
  const char *only = argc > 1 ? argv[1] : "";
  const char *where = dir ? dir : build ? build : ".";

  if (strcmp(only, "burst") != 0) {
    bench_alloc(where, quick);
    if (strcmp(only, "alloc") == 0)
      return 0;
    bench_swap(quick);
  }
  bench_burst(where, quick, 0);
  bench_burst(where, quick, 1);
  return 0;
}
