/*
 * test_persist — a disk tier kept across restarts (disk_tier_persist).
 *
 * 1. Restart: a worker fills far more than the pool and the host tier
 *    hold, so blocks land on disk; SIGTERM; a daemon restarted on the same
 *    file restores exactly the slots the disk tier held, and lookups of
 *    the old prompts hit, promoted from disk, every byte checked.
 * 2. Another layout (head_dim), another model id: nothing restored, the
 *    log says why; persistence off: nothing restored either.
 * 3. kill -9 of the daemon while a worker computes and demotions to disk
 *    are in flight (the round's first demotions done, then a random
 *    moment), many times, restarting each time: the daemon dies of the
 *    SIGKILL, not before; no lookup ever returns a wrong byte, the pool
 *    check passes.  Between two rounds the test tears slot headers and
 *    corrupts slot data in the file itself: the torn slots are counted
 *    skipped, the corrupt one is a checksum failure at promotion (a miss),
 *    and neither is served.
 */
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/integration/itest.h"

#define FULL 3   /* full blocks per prompt; prompts have FULL * bs + 1 tokens */
#define SLOT 8192 /* a 4 KiB header and a 4 KiB block (the layout below) */
#define HDR_TOK 128 /* offset of the token ids in a slot header */

static itest_daemon d;
static char disk[400];

static void prompt_tokens(uint32_t p, uint32_t *tok, uint32_t n) {
  for (uint32_t i = 0; i < n; i++)
    tok[i] = 100000 * (p + 1) + i;
}

/* Computes prompt p (its blocks written with recognisable bytes); 0, or -1
 * when the daemon is gone. */
static int compute(kvs_client *c, uint32_t p) {
  const kvs_layout *l = kvs_layout_of(c);
  uint32_t n = FULL * l->block_size + 1, tok[64];
  kvs_lookup_result lr;
  kvs_alloc_result ar;

  prompt_tokens(p, tok, n);
  if (kvs_lookup(c, p, tok, n, NULL, 0, &lr) != 0)
    return -1;
  if (kvs_allocate(c, p, n - lr.hit_tokens, &ar) != 0)
    return -1;
  for (uint32_t i = lr.hit_tokens / l->block_size; i < FULL; i++)
    itest_block_bytes(c, ar.blocks[i - lr.hit_tokens / l->block_size], p, i,
                      0);
  if (kvs_commit(c, p, lr.hit_tokens, NULL, n - lr.hit_tokens, NULL, 0,
                 NULL) != 0)
    return -1;
  return kvs_free(c, p);
}

/* Looks prompt p up; exits 1 on any wrong byte; returns the hit in
 * blocks. */
static uint32_t lookup_check(kvs_client *c, uint32_t p) {
  const kvs_layout *l = kvs_layout_of(c);
  uint32_t n = FULL * l->block_size + 1, tok[64];
  kvs_lookup_result lr;

  prompt_tokens(p, tok, n);
  CHECK_OK(c, kvs_lookup(c, 900000 + p, tok, n, NULL, 0, &lr));
  CHECK(lr.num_blocks == lr.hit_tokens / l->block_size);
  for (uint32_t i = 0; i < lr.num_blocks; i++) {
    long bad = itest_block_bytes(c, lr.blocks[i], p, i, 1);
    if (bad) {
      fprintf(stderr, "prompt %u block %u (pool block %u): %ld wrong bytes\n",
              p, i, lr.blocks[i], bad);
      exit(1);
    }
  }
  CHECK_OK(c, kvs_free(c, 900000 + p));
  return lr.num_blocks;
}

static void tier_stats(kvs_client *c, kvs_tier_stats *ts, uint32_t want) {
  uint32_t n = 0;
  uint64_t lost;
  CHECK_OK(c, kvs_tier_stats_get(c, ts, 2, &n, &lost));
  CHECK(n == want);
}

typedef struct restore_line {
  int found;
  unsigned restored, skipped, torn, layout, model, version;
} restore_line;

/* The daemon's "N slots restored, M skipped (...)" line. */
static restore_line restored(const itest_daemon *dm) {
  restore_line r;
  char line[1024];
  FILE *f = fopen(dm->log, "r");

  memset(&r, 0, sizeof r);
  CHECK(f != NULL);
  while (fgets(line, sizeof line, f)) {
    char *p = strstr(line, " slots restored, ");
    if (!p)
      continue;
    while (p > line && p[-1] != ' ')
      p--;
    CHECK(sscanf(p, "%u slots restored, %u skipped (%u torn, %u other "
                 "layout, %u other model, %u other version", &r.restored,
                 &r.skipped, &r.torn, &r.layout, &r.model, &r.version) == 6);
    r.found = 1;
  }
  fclose(f);
  return r;
}

static void start(const char *const *layout, const char *persist,
                  const char *host, const char *bytes) {
  const char *opts[40];
  int k = 0;

  for (int i = 0; layout[i]; i++)
    opts[k++] = layout[i];
  opts[k++] = "--disk-tier";
  opts[k++] = disk;
  opts[k++] = "--disk-tier-bytes";
  opts[k++] = bytes;
  opts[k++] = "--disk-tier-persist";
  opts[k++] = persist;
  if (host) {
    opts[k++] = "--host-tier-bytes";
    opts[k++] = host;
  }
  opts[k] = NULL;
  itest_daemon_start(&d, opts);
}

static const char *const layout4k[] = {
    "--pool-blocks", "32", "--block-size", "4", "--num-layers", "2",
    "--num-kv-heads", "1", "--head-dim", "64", "--dtype", "fp32", NULL};

/* ---- 1, 2 ------------------------------------------------------------------ */

#define NPROMPTS 40

static void test_restart(void) {
  kvs_tier_stats ts[2];
  restore_line r;

  start(layout4k, "yes", "48K", "2M");
  kvs_client *c = itest_connect(&d, "filler");
  CHECK(kvs_layout_of(c)->block_stride == 4096);
  r = restored(&d);
  CHECK(r.found && r.restored == 0);
  for (uint32_t p = 0; p < NPROMPTS; p++) {
    CHECK(compute(c, p) == 0);
    usleep(20000); /* demotion keeps up */
  }
  usleep(100000);
  tier_stats(c, ts, 2);
  uint32_t on_disk = ts[1].used;
  fprintf(stderr, "before SIGTERM: disk used %u, demoted %llu\n", on_disk,
          (unsigned long long)ts[1].demotions);
  CHECK(on_disk > 30);
  kvs_close(c);
  itest_daemon_finish(&d, -1); /* SIGTERM, exit 0 */

  /* The same file again: what the disk held is back. */
  start(layout4k, "yes", "48K", "2M");
  r = restored(&d);
  fprintf(stderr, "restart: %u restored, %u skipped\n", r.restored,
          r.skipped);
  CHECK(r.found && r.restored == on_disk && r.skipped == 0);
  c = itest_connect(&d, "reader");
  tier_stats(c, ts, 2);
  CHECK(ts[1].used == on_disk && ts[0].used == 0);
  uint32_t hits = 0;
  for (uint32_t p = 0; p < NPROMPTS; p++) {
    hits += lookup_check(c, p);
    usleep(5000);
  }
  tier_stats(c, ts, 2);
  fprintf(stderr, "restart: %u of %u blocks hit; disk promotions %llu\n",
          hits, NPROMPTS * FULL, (unsigned long long)ts[1].promotions);
  /* The pool and the host tier started empty: every hit came from disk. */
  CHECK(hits >= NPROMPTS * FULL / 3);
  CHECK(ts[1].promotions + ts[0].promotions == hits);
  CHECK(ts[1].checksum_failures == 0 && ts[1].failures == 0);
  kvs_close(c);
  itest_daemon_finish(&d, -1);

  /* Another layout (the same shape in fp16, slots of the same 4 KiB),
   * then another model id: nothing restored, and the log says why,
   * the dtypes by name. */
  const char *other[] = {"--pool-blocks", "32", "--block-size", "4",
                         "--num-layers", "2", "--num-kv-heads", "1",
                         "--head-dim", "64", "--dtype", "fp16", NULL};
  start(other, "yes", NULL, "2M");
  r = restored(&d);
  CHECK(r.found && r.restored == 0 && r.layout >= on_disk &&
        r.skipped == r.layout);
  CHECK(itest_log_says(&d, "written under another layout are not restored"));
  CHECK(itest_log_says(&d, "head_dim 64, dtype fp32, 4096 bytes; this "
                           "daemon's: 4, 2, 1, 64, fp16, 4096)"));
  c = itest_connect(&d, "other-layout");
  for (uint32_t p = 0; p < NPROMPTS; p++)
    CHECK(lookup_check(c, p) == 0);
  kvs_close(c);
  itest_daemon_finish(&d, -1);

  const char *model[] = {"--pool-blocks", "32", "--block-size", "4",
                         "--num-layers", "2", "--num-kv-heads", "1",
                         "--head-dim", "64", "--dtype", "fp32",
                         "--model-id", "another-model", NULL};
  start(model, "yes", "48K", "2M");
  r = restored(&d);
  CHECK(r.found && r.restored == 0 && r.model >= on_disk);
  CHECK(itest_log_says(&d, "for another model id"));
  itest_daemon_finish(&d, -1);

  /* Persistence off: the file is ignored. */
  start(layout4k, "no", "48K", "2M");
  CHECK(!restored(&d).found);
  c = itest_connect(&d, "off");
  for (uint32_t p = 0; p < NPROMPTS; p++)
    CHECK(lookup_check(c, p) == 0);
  tier_stats(c, ts, 2);
  CHECK(ts[1].used == 0 && ts[1].promotions == 0);
  kvs_close(c);
  itest_daemon_finish(&d, -1);

  /* ... and on again: the layout and model runs wrote nothing, and the run
   * with persistence off computed nothing: all of it is still there. */
  start(layout4k, "yes", "48K", "2M");
  r = restored(&d);
  CHECK(r.found && r.restored == on_disk);
  itest_daemon_finish(&d, -1);
  unlink(disk);
}

/* ---- 3 --------------------------------------------------------------------- */

#define ROUNDS 12
#define PER_ROUND 200 /* prompt ids each round's worker may use */

/* Computes prompts base, base+1, ... until the daemon goes away. */
static void worker(uint32_t base) {
  kvs_client *c = itest_connect(&d, "worker");
  for (uint32_t k = 0; k < PER_ROUND; k++) {
    if (compute(c, base + k) != 0)
      _exit(0);
    usleep(1000);
  }
  for (;;)
    pause();
}

/* The slots whose header says they hold block 0 of some prompt: their
 * prompt ids into p[] (slot s -> p[s], or UINT32_MAX). */
static uint32_t first_blocks(int fd, uint32_t nslots, uint32_t *p) {
  uint32_t n = 0;
  for (uint32_t s = 0; s < nslots; s++) {
    uint8_t h[HDR_TOK + 4];
    uint32_t tok0;
    p[s] = UINT32_MAX;
    if (pread(fd, h, sizeof h, (off_t)s * SLOT) != (ssize_t)sizeof h ||
        memcmp(h, "KZSTIER1", 8) != 0)
      continue;
    memcpy(&tok0, h + HDR_TOK, 4);
    if (tok0 % 100000 == 0 && tok0 >= 100000) {
      p[s] = tok0 / 100000 - 1;
      n++;
    }
  }
  return n;
}

static void test_kill9(void) {
  const char *const layout[] = {"--pool-blocks", "16", "--block-size", "4",
                                "--num-layers", "2", "--num-kv-heads", "1",
                                "--head-dim", "64", "--dtype", "fp32", NULL};
  const uint32_t nslots = (1u << 20) / SLOT;
  uint64_t seed = 0x1234567u ^ (uint64_t)getpid();
  uint32_t total_hits = 0, total_restored = 0, torn_seen = 0;
  uint32_t torn_prompt = UINT32_MAX, bad_prompt = UINT32_MAX, planted = 0;
  uint64_t sum_failures = 0;

  for (uint32_t round = 0; round < ROUNDS; round++) {
    start(layout, "yes", NULL, "1M");
    restore_line r = restored(&d);
    CHECK(r.found);
    total_restored += r.restored;
    torn_seen += r.torn;
    kvs_client *c = itest_connect(&d, "checker");
    uint32_t hits = 0;
    /* Every prompt any earlier round may have computed: never a wrong
     * byte; the planted ones are misses. */
    for (uint32_t pr = 0; pr < round; pr++)
      for (uint32_t k = 0; k < PER_ROUND; k++) {
        uint32_t p = pr * PER_ROUND + k, h = lookup_check(c, p);
        hits += h;
        if (p == torn_prompt || p == bad_prompt)
          CHECK(h == 0);
      }
    kvs_tier_stats ts[2];
    tier_stats(c, ts, 1);
    if (bad_prompt != UINT32_MAX) { /* its data was read: a checksum miss */
      CHECK(ts[0].checksum_failures >= 1);
      CHECK(r.torn >= planted);
      fprintf(stderr, "round %u: planted %u torn headers (skipped: %u torn) "
              "and one corrupt block (checksum failures %llu)\n", round,
              planted, r.torn, (unsigned long long)ts[0].checksum_failures);
      torn_prompt = bad_prompt = UINT32_MAX;
    }
    sum_failures += ts[0].checksum_failures;
    uint64_t demoted = ts[0].demotions;
    itest_check_pool(c, 1, 0, 0);
    kvs_close(c);
    fprintf(stderr, "round %u: %u restored, %u skipped (%u torn); %u blocks "
            "hit\n", round, r.restored, r.skipped, r.torn, hits);
    total_hits += hits;

    /* A worker computes; demotions to disk run; kill -9 at a random
     * moment once the worker's first blocks have gone to disk (only its
     * blocks are new here: nothing else demotes). */
    fflush(NULL);
    pid_t w = fork();
    CHECK(w >= 0);
    if (w == 0)
      worker(round * PER_ROUND);
    c = itest_connect(&d, "watcher");
    double t0 = itest_now();
    do {
      tier_stats(c, ts, 1);
      if (ts[0].demotions > demoted)
        break;
      usleep(1000);
    } while (itest_now() - t0 < 20);
    CHECK(ts[0].demotions > demoted);
    kvs_close(c);
    usleep((useconds_t)(itest_rand(&seed) % 200000));
    CHECK(kill(d.pid, SIGKILL) == 0);
    /* It was alive until then: no crash, no exit of its own. */
    CHECK(itest_reap(d.pid, 1) == 128 + SIGKILL);
    d.pid = 0;
    itest_daemon_kill(&d);
    kill(w, SIGKILL);
    itest_reap(w, 1); /* (exit 0: it saw the daemon go first) */

    if (round == ROUNDS / 2) {
      /* Tear the headers of every copy of one prompt's first block
       * (the second half of the header overwritten, as a write cut
       * short would leave it), and corrupt the data of every copy of
       * another's. */
      uint32_t *p = malloc(nslots * sizeof *p);
      int fd = open(disk, O_RDWR);
      CHECK(p && fd >= 0);
      CHECK(first_blocks(fd, nslots, p) >= 2);
      for (uint32_t s = 0; s < nslots; s++) {
        if (p[s] == UINT32_MAX)
          continue;
        if (torn_prompt == UINT32_MAX)
          torn_prompt = p[s];
        else if (bad_prompt == UINT32_MAX && p[s] != torn_prompt)
          bad_prompt = p[s];
      }
      uint8_t junk[2048];
      memset(junk, 0xa5, sizeof junk);
      for (uint32_t s = 0; s < nslots; s++) {
        if (p[s] == torn_prompt) {
          CHECK(pwrite(fd, junk, sizeof junk, (off_t)s * SLOT + 2048) ==
                (ssize_t)sizeof junk);
          planted++;
        } else if (p[s] == bad_prompt) {
          CHECK(pwrite(fd, junk, 16, (off_t)s * SLOT + 4096 + 1000) == 16);
        }
      }
      close(fd);
      free(p);
    }
  }
  fprintf(stderr, "kill -9: %u rounds, %u slots restored in all, %u blocks "
          "hit (all checked), %u torn headers skipped\n", ROUNDS,
          total_restored, total_hits, torn_seen);
  CHECK(total_restored > 0 && total_hits > 0);
  CHECK(planted > 0 && torn_seen >= planted && sum_failures >= 1);
  start(layout, "yes", NULL, "1M");
  itest_daemon_finish(&d, -1);
  unlink(disk);
}

int main(void) {
  snprintf(disk, sizeof disk, "%s/disk-persist-%d",
           getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
  unlink(disk);
  test_restart();
  test_kill9();
  return 0;
}
