/*
 * test_kill9 — kill -9 of workers holding blocks, over and over.
 *
 * The main process holds a committed prefix (and checks its bytes at the
 * end); a survivor process keeps a request of its own and runs one work
 * cycle per round.  Each round a victim process connects, takes the shared
 * prefix by lookup, allocates, writes, commits, forks a request and appends
 * to it, says it is ready and waits; it is killed with SIGKILL.  After every
 * kill: the daemon has closed the victim's session, the pool invariant
 * holds, exactly the blocks of the main process and the survivor are in
 * use, and the survivor's cycle worked.  At the end: nothing leaked.
 */
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "tests/integration/itest.h"

#define ROUNDS 120

static itest_daemon d;

static void prompt(uint32_t *tok, uint32_t n, uint32_t seed) {
  for (uint32_t i = 0; i < n; i++)
    tok[i] = seed * 100000 + i;
}

static void fill(kvs_client *c, const uint32_t *blocks, uint32_t nb,
                 uint8_t v) {
  for (uint32_t i = 0; i < nb; i++)
    memset(kvs_block_ptr(c, blocks[i]), v + (int)i,
           kvs_layout_of(c)->block_stride);
}

static int victim(int readyfd, uint32_t round, const uint32_t *shared,
                  uint32_t nshared) {
  kvs_client *c = itest_connect(&d, "victim");
  uint32_t bs = kvs_layout_of(c)->block_size;
  uint32_t tok[512];
  memcpy(tok, shared, nshared * sizeof *tok);
  uint32_t n = nshared + 2 * bs + (round % bs) + 1;
  for (uint32_t i = nshared; i < n; i++)
    tok[i] = 7000000 + round * 1000 + i;
  kvs_lookup_result lr;
  CHECK_OK(c, kvs_lookup(c, 1, tok, n, NULL, 0, &lr));
  CHECK(lr.hit_tokens == (nshared / bs) * bs);
  kvs_alloc_result ar;
  CHECK_OK(c, kvs_allocate(c, 1, n - lr.hit_tokens, &ar));
  fill(c, ar.blocks, ar.num_blocks, (uint8_t)round);
  CHECK_OK(c, kvs_commit(c, 1, lr.hit_tokens, NULL, n - lr.hit_tokens, NULL,
                         0, NULL));
  CHECK_OK(c, kvs_fork(c, 1, 2));
  CHECK_OK(c, kvs_append(c, 2, bs, &ar));
  /* A second request, and a batch still in flight in some rounds. */
  CHECK_OK(c, kvs_lookup(c, 3, tok, nshared + 1, NULL, 0, &lr));
  CHECK(write(readyfd, "r", 1) == 1);
  if (round % 3 == 0) {
    kvs_batch *b;
    CHECK_OK(c, kvs_batch_new(&b));
    for (;;) {
      kvs_batch_reset(b);
      kvs_batch_append(b, 1, 1);
      kvs_batch_ping(b, "k", 1);
      if (kvs_batch_submit(c, b))
        break;
    }
  }
  for (;;)
    pause();
}

/* Holds request 1 (its own prompt) and, per byte read on cmdfd, runs a
 * cycle on request 2 (lookup of the shared prefix, allocate, commit, free)
 * and answers one byte on donefd: 'k' ok, 'f' failed. */
static int survivor(int cmdfd, int donefd, const uint32_t *shared,
                    uint32_t nshared) {
  kvs_client *c = itest_connect(&d, "survivor");
  uint32_t bs = kvs_layout_of(c)->block_size;
  uint32_t own[64];
  prompt(own, 2 * bs + 1, 9);
  kvs_lookup_result lr;
  CHECK_OK(c, kvs_lookup(c, 1, own, 2 * bs + 1, NULL, 0, &lr));
  CHECK_OK(c, kvs_allocate(c, 1, 2 * bs + 1, NULL));
  char cmd;
  uint32_t cycles = 0;
  while (read(cmdfd, &cmd, 1) == 1) {
    int ok = 1;
    uint32_t tok[512];
    memcpy(tok, shared, nshared * sizeof *tok);
    uint32_t n = nshared + bs + 1;
    for (uint32_t i = nshared; i < n; i++)
      tok[i] = 8000000 + cycles * 100 + i;
    ok &= kvs_lookup(c, 2, tok, n, NULL, 0, &lr) == 0 &&
          lr.hit_tokens == (nshared / bs) * bs;
    ok &= kvs_allocate(c, 2, n - lr.hit_tokens, NULL) == 0;
    ok &= kvs_commit(c, 2, lr.hit_tokens, NULL, n - lr.hit_tokens, NULL, 0,
                     NULL) == 0;
    ok &= kvs_free(c, 2) == 0;
    cycles++;
    if (!ok)
      fprintf(stderr, "survivor cycle %u failed: %s\n", cycles,
              kvs_last_message(c));
    CHECK(write(donefd, ok ? "k" : "f", 1) == 1);
  }
  kvs_close(c);
  return 0;
}

int main(void) {
  int my_fds = itest_fd_count(0);
  static const char *const opts[] = {"--num-layers", "2", "--head-dim", "16",
                                     "--pool-blocks", "512", NULL};
  itest_daemon_start(&d, opts);
  kvs_client *c = itest_connect(&d, "kill9-main");
  const kvs_layout *l = kvs_layout_of(c);
  uint32_t bs = l->block_size;

  /* The shared prefix: 3 full blocks + 1 token, committed and held. */
  uint32_t nshared = 3 * bs + 1, shared[512];
  prompt(shared, nshared, 1);
  kvs_alloc_result ar;
  CHECK_OK(c, kvs_lookup(c, 1, shared, nshared, NULL, 0, NULL));
  CHECK_OK(c, kvs_allocate(c, 1, nshared, &ar));
  uint32_t mine[8];
  memcpy(mine, ar.blocks, ar.num_blocks * sizeof *mine);
  uint32_t nmine = ar.num_blocks;
  fill(c, mine, nmine, 0xA0);
  CHECK_OK(c, kvs_commit(c, 1, 0, shared, nshared, mine, nmine, NULL));
  nshared = 3 * bs; /* what the others look up: the full blocks */

  int cmd[2], done[2];
  CHECK(pipe(cmd) == 0 && pipe(done) == 0);
  fflush(NULL);
  pid_t sp = fork();
  CHECK(sp >= 0);
  if (sp == 0) {
    close(cmd[1]);
    close(done[0]);
    _exit(survivor(cmd[0], done[1], shared, nshared));
  }
  close(cmd[0]);
  close(done[1]);
  uint32_t held = nmine + 3; /* main's blocks + the survivor's request */
  itest_check_pool(c, 2, UINT32_MAX, UINT32_MAX);

  for (uint32_t round = 0; round < ROUNDS; round++) {
    int rd[2];
    CHECK(pipe(rd) == 0);
    pid_t v = fork();
    CHECK(v >= 0);
    if (v == 0) {
      close(rd[0]);
      close(cmd[1]);
      close(done[0]);
      victim(rd[1], round, shared, nshared);
      _exit(1);
    }
    close(rd[1]);
    char r = 0;
    CHECK(read(rd[0], &r, 1) == 1 && r == 'r');
    close(rd[0]);
    CHECK(write(cmd[1], "c", 1) == 1); /* the survivor works meanwhile */
    CHECK(kill(v, SIGKILL) == 0);
    CHECK(itest_wait(v) == 128 + SIGKILL);
    char ok = 0;
    CHECK(read(done[0], &ok, 1) == 1);
    CHECK(ok == 'k');
    itest_check_pool(c, 2, held, 2);
  }
  close(cmd[1]);
  CHECK(itest_wait(sp) == 0);
  close(done[0]);

  /* The main process's blocks were never touched. */
  for (uint32_t i = 0; i < nmine; i++) {
    const uint8_t *p = kvs_block_ptr(c, mine[i]);
    for (uint64_t j = 0; j < l->block_stride; j++)
      CHECK(p[j] == (uint8_t)(0xA0 + i));
  }
  itest_check_pool(c, 1, nmine, 1);
  kvs_stats st;
  CHECK_OK(c, kvs_stats_get(c, 0, &st));
  CHECK(st.hit_blocks >= ROUNDS * 3);
  CHECK_OK(c, kvs_free(c, 1));
  kvs_close(c);
  itest_daemon_finish(&d, my_fds);
  printf("test_kill9: ok (%d workers killed with SIGKILL)\n", ROUNDS);
  return 0;
}
