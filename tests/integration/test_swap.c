/*
 * test_swap — a preempted request goes below the pool and comes back.
 *
 * 1. Round trip: a worker writes recognisable bytes into every block of
 *    four requests (sealed blocks and a partial last one), swaps them out
 *    (more blocks than the host tier holds: the rest go to disk), fills the
 *    whole pool with another request writing other bytes, and swaps them
 *    back in: every token restored, every byte of every block (the partial
 *    ones too) as written.  What a swapped request may not do, ENOSPC on
 *    swap-in while the pool is full, and the counters, on the way.
 * 2. Faults, on a disk tier alone, where the I/O is deterministic: a write
 *    that fails undoes the swap-out (EIO; the request keeps its blocks and
 *    bytes); a block whose copy fails its checksum on the way back ends the
 *    request there (lost_tokens), and what it keeps is right.
 * 3. kill -9 of a worker that swaps in a loop (once it has swapped: the
 *    signal lands mid-stream): the pool comes back whole, no slot stays
 *    held.  Then SIGTERM while another swaps: a clean exit.  The workers
 *    check every byte they get back: they must die of the SIGKILL (or,
 *    after SIGTERM, exit 0), never of a failed check.
 */
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/integration/itest.h"

static itest_daemon d;

/* A request of n tokens (its own tokens: no prefix shared), every block
 * written, all n committed. */
static void make_request(kvs_client *c, uint64_t req, uint32_t n) {
  uint32_t tok[256];
  kvs_lookup_result lr;
  kvs_alloc_result ar;

  CHECK(n <= 256);
  for (uint32_t i = 0; i < n; i++)
    tok[i] = (uint32_t)(1000 * req + i);
  CHECK_OK(c, kvs_lookup(c, req, tok, n, NULL, 0, &lr));
  CHECK(lr.hit_tokens == 0);
  CHECK_OK(c, kvs_allocate(c, req, n, &ar));
  for (uint32_t i = 0; i < ar.num_blocks; i++)
    itest_block_bytes(c, ar.blocks[i], req, i, 0);
  CHECK_OK(c, kvs_commit(c, req, 0, NULL, n, NULL, 0, NULL));
}

/* Every block of the table holds what was written into it. */
static void check_table(kvs_client *c, uint64_t req, const uint32_t *bl,
                        uint32_t n) {
  for (uint32_t i = 0; i < n; i++) {
    long bad = itest_block_bytes(c, bl[i], req, i, 1);
    if (bad) {
      fprintf(stderr, "request %llu block %u (pool block %u): %ld wrong "
              "bytes\n", (unsigned long long)req, i, bl[i], bad);
      exit(1);
    }
  }
}

/* A request that takes every block it can get, writing other bytes. */
static uint32_t hog(kvs_client *c, uint64_t req, uint32_t blocks) {
  const kvs_layout *l = kvs_layout_of(c);
  uint32_t tok[1];
  kvs_lookup_result lr;
  kvs_alloc_result ar;

  tok[0] = 7;
  CHECK_OK(c, kvs_lookup(c, req, tok, 1, NULL, 0, &lr));
  CHECK_OK(c, kvs_append(c, req, blocks * l->block_size, &ar));
  for (uint32_t i = 0; i < ar.num_blocks; i++)
    memset(kvs_block_ptr(c, ar.blocks[i]), 0xee, l->block_stride);
  return ar.num_blocks;
}

static void disk_path(char *buf, size_t len, const char *what) {
  snprintf(buf, len, "%s/%s-%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
           what, (int)getpid());
}

#define NREQ 4

static void test_round_trip(void) {
  char disk[400];
  const char *opts[] = {"--pool-blocks", "32", "--block-size", "4",
                        "--num-layers", "2", "--num-kv-heads", "1",
                        "--head-dim", "64", "--dtype", "fp32",
                        "--host-tier-bytes", "48K", "--disk-tier", disk,
                        "--disk-tier-bytes", "2M", NULL};

  disk_path(disk, sizeof disk, "swap-disk");
  itest_daemon_start(&d, opts);
  kvs_client *c = itest_connect(&d, "swapper");
  const kvs_layout *l = kvs_layout_of(c);
  const uint32_t n = 5 * l->block_size + 2; /* 5 sealed + 1 partial block */
  kvs_swap_result sr;
  kvs_swap_stats ss;
  kvs_stats st;
  kvs_alloc_result ar;

  CHECK(l->block_stride == 4096);
  for (uint64_t r = 1; r <= NREQ; r++)
    make_request(c, r, n);
  /* 4 x 6 = 24 blocks down; the host tier holds 12 of them */
  for (uint64_t r = 1; r <= NREQ; r++) {
    CHECK_OK(c, kvs_swap_out(c, r, &sr));
    CHECK(sr.tokens == n);
    CHECK(sr.copied_blocks <= 6);
  }
  CHECK_OK(c, kvs_stats_get(c, 1, &st));
  CHECK(st.used_blocks == 0);
  CHECK_OK(c, kvs_swap_stats_get(c, &ss));
  CHECK(ss.swapped_requests == NREQ && ss.swap_outs == NREQ);
  CHECK(ss.held_slots == NREQ * 6);
  CHECK(ss.out_blocks + ss.kept_blocks == NREQ * 6);
  kvs_tier_stats ts[2];
  uint32_t nt;
  CHECK_OK(c, kvs_tier_stats_get(c, ts, 2, &nt, NULL));
  CHECK(nt == 2 && ts[0].used == 12 && ts[1].used >= NREQ * 6 - 12);

  /* A swapped request takes nothing but swap-in and free. */
  CHECK_RC(c, kvs_swap_out(c, 1, &sr), KVS_ESTATE);
  CHECK_RC(c, kvs_allocate(c, 1, 1, &ar), KVS_ESTATE);
  CHECK_RC(c, kvs_append(c, 1, 1, &ar), KVS_ESTATE);
  CHECK_RC(c, kvs_commit(c, 1, 0, NULL, 1, NULL, 0, NULL), KVS_ESTATE);
  CHECK_RC(c, kvs_fork(c, 1, 99), KVS_ESTATE);
  CHECK_RC(c, kvs_preempt(c, 1), KVS_ESTATE);
  CHECK_RC(c, kvs_swap_in(c, 77, &sr), KVS_ENOENT);

  /* The whole pool goes to another request (every sealed block of ours
   * is evicted); no room to swap in meanwhile. */
  CHECK(hog(c, 50, 32) == 32);
  CHECK_RC(c, kvs_swap_in(c, 1, &sr), KVS_ENOSPC);
  CHECK_OK(c, kvs_free(c, 50));

  for (uint64_t r = 1; r <= NREQ; r++) {
    CHECK_OK(c, kvs_swap_in(c, r, &sr));
    CHECK(sr.tokens == n && sr.lost_tokens == 0);
    CHECK(sr.num_blocks == 6);
    check_table(c, r, sr.blocks, sr.num_blocks);
  }
  CHECK_RC(c, kvs_swap_in(c, 1, &sr), KVS_ESTATE);
  CHECK_OK(c, kvs_swap_stats_get(c, &ss));
  CHECK(ss.swapped_requests == 0 && ss.held_slots == 0);
  CHECK(ss.swap_ins == NREQ && ss.failures == 0);
  CHECK(ss.in_blocks + ss.resident_blocks == NREQ * 6);
  CHECK(ss.in_blocks >= NREQ * 6 - 2); /* the hog evicted (almost) all */

  /* They go on: decode into the partial block, and a lookup of request
   * 2's prompt hits its sealed blocks again. */
  CHECK_OK(c, kvs_append(c, 1, 1, &ar));
  CHECK_OK(c, kvs_commit(c, 1, n, (uint32_t[]){424242}, 1, NULL, 0, NULL));
  {
    uint32_t tok[64];
    kvs_lookup_result lr;
    for (uint32_t i = 0; i < n; i++)
      tok[i] = 1000 * 2 + i;
    CHECK_OK(c, kvs_lookup(c, 60, tok, n, NULL, 0, &lr));
    CHECK(lr.hit_tokens == 5 * l->block_size);
    check_table(c, 2, lr.blocks, lr.num_blocks);
    CHECK_OK(c, kvs_free(c, 60));
  }
  /* Swapped out and freed: its held slots go. */
  CHECK_OK(c, kvs_swap_out(c, 3, &sr));
  CHECK_OK(c, kvs_free(c, 3));
  for (uint64_t r = 1; r <= NREQ; r++)
    if (r != 3)
      CHECK_OK(c, kvs_free(c, r));
  CHECK_OK(c, kvs_swap_stats_get(c, &ss));
  CHECK(ss.swapped_requests == 0 && ss.held_slots == 0);
  kvs_close(c);
  itest_daemon_finish(&d, -1);
  unlink(disk);
}

static void test_faults(void) {
  char disk[400];
  /* No block but this test's request is ever cached with no copy below,
   * so no background demotion writes: the Nth write and read below are
   * the swaps'. */
  const char *opts[] = {"--pool-blocks", "8", "--block-size", "4",
                        "--num-layers", "2", "--num-kv-heads", "1",
                        "--head-dim", "64", "--dtype", "fp32",
                        "--disk-tier", disk, "--disk-tier-bytes", "1M",
                        "--tier-fault", "write-eio:2,flip:2", NULL};

  disk_path(disk, sizeof disk, "swap-fault");
  itest_daemon_start(&d, opts);
  kvs_client *c = itest_connect(&d, "swap-faults");
  const kvs_layout *l = kvs_layout_of(c);
  const uint32_t n = 3 * l->block_size + 1; /* 3 sealed + 1 partial */
  kvs_swap_result sr;
  kvs_swap_stats ss;
  kvs_stats st;
  uint32_t nbl;

  make_request(c, 1, n);
  /* writes 1-4; the 2nd to complete fails: undone.  (Completions come in
   * any order: the failed one is a sealed block's or the partial one's.
   * A sealed block whose write went through keeps its copy below, as a
   * cached copy; the partial one's private copy goes with the undo.) */
  CHECK_RC(c, kvs_swap_out(c, 1, &sr), KVS_EIO);
  CHECK_OK(c, kvs_stats_get(c, 1, &st));
  CHECK(st.used_blocks == 4);
  uint32_t kept;
  {
    kvs_tier_stats ts1[1];
    uint32_t nt1;

    CHECK_OK(c, kvs_tier_stats_get(c, ts1, 1, &nt1, NULL));
    kept = ts1[0].used; /* 2 or 3 of the 3 sealed blocks */
    CHECK(nt1 == 1 && (kept == 2 || kept == 3));
    fprintf(stderr, "swap-out with a failed write: %u sealed copies kept\n",
            kept);
  }
  CHECK_OK(c, kvs_swap_stats_get(c, &ss));
  CHECK(ss.failures == 1 && ss.swapped_requests == 0 && ss.held_slots == 0);
  /* the request goes on as before: one more token, its bytes intact */
  {
    kvs_alloc_result ar;
    kvs_lookup_result lr;
    uint32_t tok[64];
    CHECK_OK(c, kvs_append(c, 1, 1, &ar));
    CHECK_OK(c, kvs_commit(c, 1, n, (uint32_t[]){1000 + n}, 1, NULL, 0,
                           NULL));
    for (uint32_t i = 0; i < n; i++)
      tok[i] = 1000 + i;
    CHECK_OK(c, kvs_lookup(c, 2, tok, n, NULL, 0, &lr));
    CHECK(lr.hit_tokens == 3 * l->block_size);
    check_table(c, 1, lr.blocks, lr.num_blocks);
    CHECK_OK(c, kvs_free(c, 2));
  }
  /* Again: the sealed blocks that kept their copies from the first try
   * are not written again; the others and the partial one are. */
  CHECK_OK(c, kvs_swap_out(c, 1, &sr));
  CHECK(sr.tokens == n + 1 && sr.copied_blocks == 4 - kept);
  /* Every block evicted, then back: reads 1-4, the 2nd to complete fails
   * its checksum (completions come in any order).  The request ends before
   * that block; what it keeps is right, the rest is to compute again. */
  CHECK(hog(c, 50, 8) == 8);
  CHECK_OK(c, kvs_free(c, 50));
  CHECK_OK(c, kvs_swap_in(c, 1, &sr));
  const uint32_t keep = sr.num_blocks;
  fprintf(stderr, "swap-in after a flip: %u tokens restored, %u lost, %u "
          "blocks\n", sr.tokens, sr.lost_tokens, keep);
  CHECK(keep < 4);
  CHECK(sr.tokens == keep * l->block_size);
  CHECK(sr.tokens + sr.lost_tokens == n + 1);
  check_table(c, 1, sr.blocks, keep);
  kvs_tier_stats ts[1];
  uint32_t nt;
  CHECK_OK(c, kvs_tier_stats_get(c, ts, 1, &nt, NULL));
  CHECK(ts[0].checksum_failures == 1 && ts[0].io_errors == 1);
  CHECK_OK(c, kvs_swap_stats_get(c, &ss));
  CHECK(ss.failures == 2 && ss.held_slots == 0 && ss.swapped_requests == 0);
  /* The worker computes the rest again: the request is whole. */
  {
    kvs_alloc_result ar;
    CHECK_OK(c, kvs_allocate(c, 1, n + 1 - sr.tokens, &ar));
    CHECK(ar.first_index == keep);
    for (uint32_t i = 0; i < ar.num_blocks; i++)
      itest_block_bytes(c, ar.blocks[i], 1, keep + i, 0);
    CHECK_OK(c, kvs_commit(c, 1, keep * l->block_size, NULL,
                           n + 1 - keep * l->block_size, NULL, 0, NULL));
  }
  CHECK_OK(c, kvs_swap_out(c, 1, &sr));
  CHECK_OK(c, kvs_swap_in(c, 1, &sr));
  CHECK(sr.lost_tokens == 0);
  const uint32_t *bl = sr.blocks;
  nbl = sr.num_blocks;
  check_table(c, 1, bl, nbl);
  CHECK_OK(c, kvs_free(c, 1));
  kvs_close(c);
  itest_daemon_finish(&d, -1);
  unlink(disk);
}

/* Swaps its own requests out and in until killed, or until the daemon
 * goes (ECLOSED), checking every byte that comes back. */
static void swapper(uint64_t base) {
  kvs_client *c = itest_connect(&d, "swapper");
  const kvs_layout *l = kvs_layout_of(c);
  const uint32_t n = 4 * l->block_size + 3;
  kvs_swap_result sr;

  for (uint64_t r = base; r < base + 3; r++)
    make_request(c, r, n);
  for (uint64_t i = 0;; i++) {
    uint64_t r = base + i % 3;
    if (kvs_swap_out(c, r, &sr) != 0 || kvs_swap_in(c, r, &sr) != 0)
      _exit(0);
    CHECK(sr.lost_tokens == 0);
    check_table(c, r, sr.blocks, sr.num_blocks);
  }
}

/* Waits (20 s at most) until the daemon has done more than `above`
 * swap-outs; returns them. */
static uint64_t wait_swap_outs(kvs_client *c, uint64_t above) {
  kvs_swap_stats ss;
  double t0 = itest_now();
  for (;;) {
    CHECK_OK(c, kvs_swap_stats_get(c, &ss));
    if (ss.swap_outs > above || itest_now() - t0 > 20)
      break;
    usleep(1000);
  }
  if (ss.swap_outs <= above)
    fprintf(stderr, "swap-outs stuck at %llu, waited for > %llu\n",
            (unsigned long long)ss.swap_outs, (unsigned long long)above);
  CHECK(ss.swap_outs > above);
  return ss.swap_outs;
}

static void test_kill_and_term(void) {
  char disk[400];
  const char *opts[] = {"--pool-blocks", "48", "--block-size", "4",
                        "--num-layers", "2", "--num-kv-heads", "1",
                        "--head-dim", "64", "--dtype", "fp32",
                        "--host-tier-bytes", "32K", "--disk-tier", disk,
                        "--disk-tier-bytes", "2M", NULL};

  disk_path(disk, sizeof disk, "swap-kill");
  itest_daemon_start(&d, opts);
  kvs_client *c = itest_connect(&d, "watcher");
  uint64_t outs = 0;
  for (int round = 0; round < 3; round++) {
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0)
      swapper(100 * (round + 1));
    /* Killed once it has swapped out (more each round): it never stops
     * by itself, so the signal lands while it swaps. */
    wait_swap_outs(c, outs + 2 + 4 * (uint64_t)round);
    kill(pid, SIGKILL);
    CHECK(itest_reap(pid, 1) == 128 + SIGKILL); /* killed, no failed check */
    itest_check_pool(c, 1, 0, 0);
    kvs_swap_stats ss;
    CHECK_OK(c, kvs_swap_stats_get(c, &ss));
    CHECK(ss.swapped_requests == 0 && ss.held_slots == 0);
    fprintf(stderr, "round %d: %llu swap-outs, %llu swap-ins so far\n",
            round, (unsigned long long)ss.swap_outs,
            (unsigned long long)ss.swap_ins);
    CHECK(ss.swap_outs > outs);
    outs = ss.swap_outs;
  }
  kvs_close(c);

  /* SIGTERM while a worker swaps (it has begun to): a clean exit. */
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0)
    swapper(900);
  c = itest_connect(&d, "watcher");
  wait_swap_outs(c, outs + 3);
  kvs_close(c);
  itest_term_under_load(&d, pid);
  unlink(disk);
}

int main(void) {
  test_round_trip();
  test_faults();
  test_kill_and_term();
  return 0;
}
