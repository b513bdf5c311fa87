/*
 * test_tiers — blocks go down to the host and disk tiers and come back.
 *
 * 1. Fill: a worker computes far more prompts than the pool holds, writing
 *    recognisable bytes; the daemon demotes them in the background.  Then
 *    every prompt is looked up again: each must hit all its full blocks
 *    (pool + host + disk hold them all), and every byte of every block the
 *    lookup returns is checked.  The tier counters must show promotions
 *    from both tiers and no block lost; no_promote takes pool blocks only.
 * 2. Faults: a daemon with a disk tier only, whose disk tier fails reads
 *    (a flipped bit, EIO, a short read) and two writes (EIO, ENOSPC).  Each
 *    read fault is a miss, each fault a counter; no lookup ever returns a
 *    block with wrong bytes.  Then every copy in the file is corrupted
 *    behind the daemon's back: checksum failures, none served.  The log
 *    says each kind of failure once.
 * 0. The reserve of demoted blocks over a disk tier (tier_window): its
 *    default, and an explicit one.
 * 3. A worker killed (SIGKILL) while its lookups promote: the pool comes
 *    back whole.  Then SIGTERM while another worker promotes: the daemon
 *    drains its I/O and exits cleanly (status 0: the pool was whole).  The
 *    workers check every byte they get: they must die of the SIGKILL (or,
 *    after SIGTERM, exit 0), never of a failed check.
 * 4. Batches too big for the loop (their checksums and copies on libuv's
 *    thread pool): every block back, byte for byte; SIGTERM meanwhile.
 */
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/integration/itest.h"

#define NPROMPTS 40
#define FULL 3 /* full blocks per prompt; prompts have FULL * bs + 1 tokens */
#define SLOT 8192 /* a disk slot: a 4 KiB header and a 4 KiB block */

static itest_daemon d;

static void prompt_tokens(uint32_t p, uint32_t *tok, uint32_t n) {
  for (uint32_t i = 0; i < n; i++)
    tok[i] = 100000 * (p + 1) + i;
}

#define MAX_TOKENS 512 /* the longest prompt here (BIG blocks of 16) */

/* Computes prompt p of n tokens (new to the cache): allocates its blocks,
 * writes recognisable bytes into the full ones, commits, frees. */
static void compute_n(kvs_client *c, uint32_t p, uint32_t n) {
  const kvs_layout *l = kvs_layout_of(c);
  uint32_t tok[MAX_TOKENS];
  kvs_lookup_result lr;
  kvs_alloc_result ar;

  CHECK(n <= MAX_TOKENS);
  prompt_tokens(p, tok, n);
  CHECK_OK(c, kvs_lookup(c, p, tok, n, NULL, 0, &lr));
  CHECK(lr.hit_tokens == 0);
  CHECK_OK(c, kvs_allocate(c, p, n, &ar));
  CHECK(ar.num_blocks == (n + l->block_size - 1) / l->block_size);
  for (uint32_t i = 0; i < n / l->block_size; i++)
    itest_block_bytes(c, ar.blocks[i], p, i, 0);
  CHECK_OK(c, kvs_commit(c, p, 0, NULL, n, NULL, 0, NULL));
  CHECK_OK(c, kvs_free(c, p));
}

static void compute(kvs_client *c, uint32_t p) {
  compute_n(c, p, FULL * kvs_layout_of(c)->block_size + 1);
}

/* Looks prompt p of n tokens up; checks every returned block's bytes;
 * returns the hit in blocks. */
static uint32_t lookup_check_n(kvs_client *c, uint32_t p, uint64_t id,
                               uint32_t n) {
  const kvs_layout *l = kvs_layout_of(c);
  uint32_t tok[MAX_TOKENS];
  kvs_lookup_result lr;

  CHECK(n <= MAX_TOKENS);
  prompt_tokens(p, tok, n);
  CHECK_OK(c, kvs_lookup(c, id, tok, n, NULL, 0, &lr));
  CHECK(lr.hit_tokens % l->block_size == 0);
  CHECK(lr.num_blocks == lr.hit_tokens / l->block_size);
  for (uint32_t i = 0; i < lr.num_blocks; i++) {
    long bad = itest_block_bytes(c, lr.blocks[i], p, i, 1);
    if (bad) {
      fprintf(stderr, "prompt %u block %u (pool block %u): %ld wrong bytes\n",
              p, i, lr.blocks[i], bad);
      exit(1);
    }
  }
  CHECK_OK(c, kvs_free(c, id));
  return lr.num_blocks;
}

static uint32_t lookup_check(kvs_client *c, uint32_t p, uint64_t id) {
  return lookup_check_n(c, p, id, FULL * kvs_layout_of(c)->block_size + 1);
}

/* Waits (up to 10 s) until the tiers' moves stop for 200 ms:
 * the blocks just cached are all below. */
static void settle(kvs_client *c) {
  kvs_tier_stats ts[2];
  uint32_t n;
  uint64_t lost, last = UINT64_MAX;
  int still = 0;

  for (int i = 0; i < 500 && still < 10; i++) {
    uint64_t now = 0;

    usleep(20000);
    CHECK_OK(c, kvs_tier_stats_get(c, ts, 2, &n, &lost));
    for (uint32_t k = 0; k < n; k++)
      now += ts[k].demotions + ts[k].promotions;
    still = now == last ? still + 1 : 0;
    last = now;
  }
}

static void tier_stats(kvs_client *c, kvs_tier_stats *ts, uint32_t want,
                       uint64_t *lost) {
  uint32_t n = 0;
  CHECK_OK(c, kvs_tier_stats_get(c, ts, 2, &n, lost));
  CHECK(n == want);
}

static void test_fill_and_promote(void) {
  char disk[400];
  const char *opts_tail[] = {"--host-tier-bytes", "48K", "--disk-tier", NULL,
                             "--disk-tier-bytes", "2M", NULL};
  const char *opts[24] = {"--pool-blocks", "32", "--block-size", "4",
                          "--num-layers", "2", "--num-kv-heads", "1",
                          "--head-dim", "64", "--dtype", "fp32"};
  int k = 12;

  snprintf(disk, sizeof disk, "%s/disk-tier-%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
  for (int i = 0; opts_tail[i] || i == 3; i++)
    opts[k++] = i == 3 ? disk : opts_tail[i];
  opts[k] = NULL;
  itest_daemon_start(&d, opts);
  kvs_client *c = itest_connect(&d, "tiers");
  const kvs_layout *l = kvs_layout_of(c);
  kvs_tier_stats ts[2];
  uint64_t lost;

  CHECK(l->block_stride == 4096); /* 2 layers x K,V x 4 tokens x 64 x 4 B */
  tier_stats(c, ts, 2, &lost);
  CHECK(strcmp(ts[0].name, "host") == 0 && ts[0].slots == 12);
  CHECK(strcmp(ts[1].name, "disk") == 0 && ts[1].slots == 256);
  /* 40 prompts x 3 blocks = 120 blocks: 32 in the pool, the rest below */
  for (uint32_t p = 0; p < NPROMPTS; p++) {
    compute(c, p);
    usleep(20000); /* a few demotion ticks: write-back keeps up */
  }
  usleep(100000);
  tier_stats(c, ts, 2, &lost);
  fprintf(stderr, "after the fill: lost %llu, host used %u, disk used %u\n",
          (unsigned long long)lost, ts[0].used, ts[1].used);
  uint32_t hits = 0;
  for (uint32_t p = 0; p < NPROMPTS; p++) {
    uint32_t h = lookup_check(c, p, 1000 + p);
    if (h != FULL)
      fprintf(stderr, "prompt %u: %u of %u blocks hit\n", p, h, FULL);
    hits += h;
    usleep(20000); /* (a burst faster than the disk loses blocks: lost) */
  }
  tier_stats(c, ts, 2, &lost);
  fprintf(stderr, "tiers: lost %llu; host: demoted %llu promoted %llu "
          "dropped %llu; disk: demoted %llu promoted %llu bytes in %llu\n",
          (unsigned long long)lost, (unsigned long long)ts[0].demotions,
          (unsigned long long)ts[0].promotions,
          (unsigned long long)ts[0].drops, (unsigned long long)ts[1].demotions,
          (unsigned long long)ts[1].promotions,
          (unsigned long long)ts[1].bytes_in);
  /* Every block is found, or was counted lost (evicted before demotion
   * caught up: only when the disk falls behind, i.e. a slow machine). */
  CHECK(hits + FULL * lost >= NPROMPTS * FULL);
  CHECK(hits >= NPROMPTS * FULL / 2);
  CHECK(ts[0].promotions > 0 && ts[1].promotions > 0);
  CHECK(ts[1].bytes_in == ts[1].demotions * l->block_stride);
  CHECK(ts[1].bytes_out == ts[1].promotions * l->block_stride);
  CHECK(ts[0].failures == 0 && ts[1].failures == 0);
  CHECK(ts[1].io_errors == 0 && ts[1].checksum_failures == 0);

  /* Without promotion only pool blocks are taken: the first prompts are
   * below again by now (the lookups above cycled the pool). */
  CHECK_OK(c, kvs_set_promote(c, 0));
  uint64_t promoted = ts[0].promotions + ts[1].promotions;
  CHECK(lookup_check(c, 0, 5000) < FULL);
  tier_stats(c, ts, 2, &lost);
  CHECK(ts[0].promotions + ts[1].promotions == promoted);
  CHECK_OK(c, kvs_set_promote(c, 1));
  CHECK(lookup_check(c, 0, 5001) == FULL);

  kvs_close(c);
  itest_daemon_finish(&d, -1);
  unlink(disk);
}

/* A disk tier alone, failing reads 1-3 (flip, EIO, short) and writes 5
 * (EIO) and 7 (ENOSPC). */
static void test_faults(void) {
  char disk[400];
  const char *opts[] = {"--pool-blocks", "16", "--block-size", "4",
                        "--num-layers", "2", "--num-kv-heads", "1",
                        "--head-dim", "64", "--dtype", "fp32",
                        "--disk-tier", disk, "--disk-tier-bytes", "1M",
                        "--tier-fault",
                        "flip:1,read-eio:2,short:3,write-eio:5,write-enospc:7",
                        NULL};
  /* (The daemon's words, daemon/tiers/tier_disk.c.) */
  const char *io_line = "(counted in io_errors";
  const char *sum_line = "failed its header or checksum check";

  snprintf(disk, sizeof disk, "%s/disk-fault-%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
  itest_daemon_start(&d, opts);
  kvs_client *c = itest_connect(&d, "faults");
  kvs_tier_stats ts[2];
  uint64_t lost;
  uint32_t hits = 0, misses = 0;

  for (uint32_t p = 0; p < 20; p++) {
    compute(c, p);
    usleep(20000);
  }
  usleep(100000);
  for (uint32_t p = 0; p < 20; p++) {
    uint32_t h = lookup_check(c, p, 1000 + p); /* never wrong bytes */
    hits += h;
    misses += FULL - h;
  }
  tier_stats(c, ts, 1, &lost);
  fprintf(stderr, "faults: hits %u misses %u; disk: failures %llu io_errors "
          "%llu checksum_failures %llu, lost %llu\n", hits, misses,
          (unsigned long long)ts[0].failures,
          (unsigned long long)ts[0].io_errors,
          (unsigned long long)ts[0].checksum_failures,
          (unsigned long long)lost);
  CHECK(strcmp(ts[0].name, "disk") == 0);
  CHECK(ts[0].checksum_failures == 1);
  CHECK(ts[0].io_errors == 4);      /* EIO, short read, the failed writes */
  CHECK(ts[0].failures == 5);       /* three reads, two writes */
  CHECK(misses >= 3 && hits > 0);   /* each read fault: a miss (and what
                                       follows it in that prompt's chain) */
  /* (A failed write need not be a miss: its block stays cached in the
   * pool with no copy below, and a later demotion pass writes it again.) */
  /* A copy that failed a read is dropped, never read again: a second pass
   * finds no new fault (the injected ones are spent) and no wrong byte. */
  for (uint32_t p = 0; p < 20; p++) {
    lookup_check(c, p, 3000 + p);
    usleep(5000);
  }
  tier_stats(c, ts, 1, &lost);
  CHECK(ts[0].checksum_failures == 1 && ts[0].io_errors == 4);
  CHECK(ts[0].failures == 5);
  /* Four I/O errors (writes and reads), one line. */
  CHECK(itest_log_count(&d, io_line) == 1);
  CHECK(itest_log_count(&d, sum_line) == 1);

  /* The data of every slot in the file corrupted (the injected flip
   * happens once per daemon; this makes many): each copy read is a
   * checksum failure and a miss, never served, and still one line. */
  int fd = open(disk, O_RDWR);
  CHECK(fd >= 0);
  uint32_t planted = 0;
  uint8_t junk[16];
  memset(junk, 0xa5, sizeof junk);
  for (uint32_t s = 0; s < (1u << 20) / SLOT; s++) {
    char magic[8];
    if (pread(fd, magic, 8, (off_t)s * SLOT) != 8 ||
        memcmp(magic, "KZSTIER1", 8) != 0)
      continue;
    CHECK(pwrite(fd, junk, sizeof junk, (off_t)s * SLOT + 4096 + 1000) ==
          (ssize_t)sizeof junk);
    planted++;
  }
  close(fd);
  CHECK(planted >= 20);
  for (uint32_t p = 0; p < 20; p++)
    lookup_check(c, p, 5000 + p);
  tier_stats(c, ts, 1, &lost);
  fprintf(stderr, "faults: %u slots corrupted; checksum_failures %llu\n",
          planted, (unsigned long long)ts[0].checksum_failures);
  CHECK(ts[0].checksum_failures >= 1 + 3 && ts[0].io_errors == 4);
  CHECK(ts[0].failures == 4 + ts[0].checksum_failures);
  CHECK(itest_log_count(&d, sum_line) == 1);
  CHECK(itest_log_count(&d, io_line) == 1);
  kvs_close(c);
  itest_daemon_finish(&d, -1);
  unlink(disk);
}

/* The reserve over a disk tier: a pool full of cached blocks, the daemon
 * idle; background demotion copies down exactly the tier_window blocks
 * next to be evicted.  By default, with a disk tier, 64 MiB of blocks up to
 * a quarter of the pool (here 16 of 64: pool / 16 would be 4, raised to
 * the floor of 8); an explicit tier_window (5) is taken as it is. */
static void window_case(const char *window, uint32_t want) {
  char disk[400];
  const char *opts[] = {"--pool-blocks", "64", "--block-size", "4",
                        "--num-layers", "2", "--num-kv-heads", "1",
                        "--head-dim", "64", "--dtype", "fp32",
                        "--disk-tier", disk, "--disk-tier-bytes", "1M",
                        window ? "--tier-window" : NULL, window, NULL};
  kvs_tier_stats ts[2];
  uint64_t lost;

  snprintf(disk, sizeof disk, "%s/disk-window-%d",
           getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
  itest_daemon_start(&d, opts);
  kvs_client *c = itest_connect(&d, "window");

  for (uint32_t p = 0; p < 16; p++) /* 16 prompts x 4 full blocks */
    compute_n(c, p, 4 * kvs_layout_of(c)->block_size);
  settle(c);
  tier_stats(c, ts, 1, &lost);
  fprintf(stderr, "window %s: %llu blocks demoted, %u slots used (want %u)\n",
          window ? window : "default", (unsigned long long)ts[0].demotions,
          ts[0].used, want);
  CHECK(ts[0].demotions == want && ts[0].used == want && lost == 0);
  kvs_close(c);
  itest_daemon_finish(&d, -1);
  unlink(disk);
}

static void test_window(void) {
  window_case(NULL, 16);
  window_case("5", 5);
}

/* Big batches: 64 KiB blocks, prompts of BIG blocks, a pool of BIG blocks
 * and a window of BIG, so that each demotion pass moves BIG blocks (2 MiB)
 * at once: more than the loop stages itself, so the checksums (and the
 * host -> staging copies) run on libuv's thread pool.  With a host tier
 * over the disk, and with a disk tier alone: every prompt comes back, byte
 * for byte, from below; then SIGTERM while a worker keeps the batches
 * coming: a clean drain. */
#define BIG 32

/* The SIGTERM worker's prompts: as compute_n, but the daemon going away
 * ends it quietly (exit 0). */
static void big_worker(void) {
  kvs_client *c = itest_connect(&d, "big-worker");
  uint32_t n = BIG * kvs_layout_of(c)->block_size, tok[MAX_TOKENS];
  kvs_lookup_result lr;
  kvs_alloc_result ar;

  CHECK(n <= MAX_TOKENS);
  for (uint32_t p = 1000;; p++) {
    prompt_tokens(p, tok, n);
    if (kvs_lookup(c, p, tok, n, NULL, 0, &lr) != 0 ||
        kvs_allocate(c, p, n - lr.hit_tokens, &ar) != 0)
      _exit(0);
    for (uint32_t i = 0; i < ar.num_blocks; i++)
      itest_block_bytes(c, ar.blocks[i], p, lr.num_blocks + i, 0);
    if (kvs_commit(c, p, 0, NULL, n, NULL, 0, NULL) != 0 ||
        kvs_free(c, p) != 0)
      _exit(0);
  }
}

static void big_case(int host) {
  char disk[400];
  const char *opts[] = {"--pool-blocks", "32", "--block-size", "16",
                        "--num-layers", "2", "--num-kv-heads", "4",
                        "--head-dim", "64", "--dtype", "fp32",
                        "--tier-window", "32", "--disk-tier", disk,
                        "--disk-tier-bytes", "24M",
                        host ? "--host-tier-bytes" : NULL, "2M", NULL};
  kvs_tier_stats ts[2];
  uint64_t lost;
  const uint32_t nprompts = 6;

  snprintf(disk, sizeof disk, "%s/disk-big-%d",
           getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
  itest_daemon_start(&d, opts);
  kvs_client *c = itest_connect(&d, "big");
  CHECK(kvs_layout_of(c)->block_stride == 64 << 10);
  const uint32_t n = BIG * kvs_layout_of(c)->block_size;
  for (uint32_t p = 0; p < nprompts; p++) {
    compute_n(c, p, n);
    settle(c); /* its blocks all go down before the next evicts them */
  }
  for (uint32_t p = 0; p < nprompts; p++) { /* every block, checked */
    CHECK(lookup_check_n(c, p, 100 + p, n) == BIG - 1); /* (not the last
                                                     token's block) */
    settle(c);
  }
  tier_stats(c, ts, host ? 2 : 1, &lost);
  fprintf(stderr, "big batches (%s): lost %llu; disk demoted %llu "
          "promoted %llu\n", host ? "host + disk" : "disk alone",
          (unsigned long long)lost, (unsigned long long)ts[host].demotions,
          (unsigned long long)ts[host].promotions);
  CHECK(lost == 0);
  CHECK(ts[host].demotions >= (nprompts - 2) * (BIG - 1) &&
        ts[host].promotions > 0); /* the disk wrote and read whole batches */
  kvs_close(c);

  /* SIGTERM while a worker keeps prompts coming (batches in flight). */
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0)
    big_worker();
  usleep(300000);
  itest_term_under_load(&d, pid);
  unlink(disk);
}

static void test_big_batches(void) {
  big_case(1);
  big_case(0);
}

/* A worker that looks up promoting prompts until it is killed, or until
 * the daemon goes away (SIGTERM: ECLOSED ends it quietly). */
static void promoter(uint32_t seed) {
  kvs_client *c = itest_connect(&d, "promoter");
  const kvs_layout *l = kvs_layout_of(c);
  uint32_t n = FULL * l->block_size + 1, tok[64];
  kvs_lookup_result lr;

  for (uint64_t i = 0;; i++) {
    uint32_t p = (uint32_t)((i * 7 + seed) % NPROMPTS);
    prompt_tokens(p, tok, n);
    if (kvs_lookup(c, 10000 + i, tok, n, NULL, 0, &lr) != 0)
      _exit(0);
    for (uint32_t b = 0; b < lr.num_blocks; b++)
      CHECK(itest_block_bytes(c, lr.blocks[b], p, b, 1) == 0);
    if (kvs_free(c, 10000 + i) != 0)
      _exit(0);
  }
}

/* The tiers' promotions, both tiers. */
static uint64_t promotions(kvs_client *c) {
  kvs_tier_stats ts[2];
  uint64_t lost;
  tier_stats(c, ts, 2, &lost);
  return ts[0].promotions + ts[1].promotions;
}

/* Waits (20 s at most) until the promotions pass `above`. */
static void wait_promotions(kvs_client *c, uint64_t above) {
  double t0 = itest_now();
  uint64_t n;
  while ((n = promotions(c)) <= above && itest_now() - t0 < 20)
    usleep(1000);
  if (n <= above)
    fprintf(stderr, "promotions stuck at %llu, waited for > %llu\n",
            (unsigned long long)n, (unsigned long long)above);
  CHECK(n > above);
}

static void test_kill_and_term(void) {
  char disk[400];
  const char *opts[] = {"--pool-blocks", "32", "--block-size", "4",
                        "--num-layers", "2", "--num-kv-heads", "1",
                        "--head-dim", "64", "--dtype", "fp32",
                        "--host-tier-bytes", "32K", "--disk-tier", disk,
                        "--disk-tier-bytes", "2M", NULL};

  snprintf(disk, sizeof disk, "%s/disk-kill-%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
  itest_daemon_start(&d, opts);
  kvs_client *c = itest_connect(&d, "filler");
  for (uint32_t p = 0; p < NPROMPTS; p++) {
    compute(c, p);
    usleep(10000);
  }
  for (int round = 0; round < 3; round++) {
    uint64_t before = promotions(c);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0)
      promoter((uint32_t)round);
    /* Killed once its lookups have promoted (more each round): it never
     * stops promoting by itself, so the signal lands mid-stream. */
    wait_promotions(c, before + 2 + 6 * (uint64_t)round);
    kill(pid, SIGKILL);
    CHECK(itest_reap(pid, 1) == 128 + SIGKILL); /* killed, no failed check */
    itest_check_pool(c, 1, 0, 0);
  }
  kvs_close(c);

  /* SIGTERM while a worker promotes (it has begun to): a clean exit. */
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0)
    promoter(5);
  c = itest_connect(&d, "watcher");
  wait_promotions(c, promotions(c) + 3);
  kvs_close(c);
  itest_term_under_load(&d, pid);
  unlink(disk);
}

int main(void) {
  test_window();
  test_fill_and_promote();
  test_faults();
  test_kill_and_term();
  test_big_batches();
  return 0;
}
