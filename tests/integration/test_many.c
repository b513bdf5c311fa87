/*
 * test_many — many clients at once doing random operations.
 *
 * NCLIENTS worker processes, each with its own connection, run a random mix
 * of lookup / allocate / append / commit / fork / preempt / free (directly
 * and in batches) over prompts that share a few system prefixes, on a pool
 * small enough that allocation runs out and blocks get evicted.  Every
 * worker writes K/V bytes derived from (token, position) into the blocks it
 * fills and, on every prefix hit, checks the bytes of the blocks it got:
 * a block reused while still referenced would show up here.  Some workers
 * exit holding requests, some are killed; the daemon must free their
 * sessions.  Then: the invariant check, zero blocks in use, no leaked fds.
 */
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "tests/integration/itest.h"

#define NCLIENTS 72
#define STEPS 600
#define NREQ 6

static itest_daemon d;

typedef struct wreq {
  int live;
  uint64_t id;
  uint32_t tok[160];
  uint32_t n;        /* prompt length */
  uint32_t slots;    /* positions with a slot */
  uint32_t written;  /* positions committed */
  uint32_t table[16];
  uint32_t nblocks;
} wreq;

static uint8_t kv_byte(uint32_t tok, uint32_t pos) {
  uint32_t x = tok * 2246822519u + pos * 3266489917u;
  return (uint8_t)(x >> 24 ^ x >> 7);
}

/* Writes positions [from, to): the first 8 bytes of each position's K plane
 * of layer 0 get kv_byte(tok, pos). */
static void put(kvs_client *c, const wreq *r, uint32_t from, uint32_t to) {
  const kvs_layout *l = kvs_layout_of(c);
  for (uint32_t p = from; p < to; p++) {
    uint8_t *e = kvs_elem_ptr(kvs_pool_base(c), l, r->table[p / l->block_size],
                              0, 0, p % l->block_size, 0);
    memset(e, kv_byte(r->tok[p], p), 8);
  }
}

static int verify(kvs_client *c, const wreq *r, uint32_t to) {
  const kvs_layout *l = kvs_layout_of(c);
  for (uint32_t p = 0; p < to; p++) {
    uint8_t *e = kvs_elem_ptr(kvs_pool_base(c), l, r->table[p / l->block_size],
                              0, 0, p % l->block_size, 0);
    for (int i = 0; i < 8; i++)
      if (e[i] != kv_byte(r->tok[p], p))
        return 0;
  }
  return 1;
}

static void new_prompt(wreq *r, uint64_t *seed, uint32_t bs) {
  uint32_t sys = (uint32_t)(itest_rand(seed) % 4);
  uint32_t sys_len = (2 + sys) * bs;
  uint32_t user = 1 + (uint32_t)(itest_rand(seed) % (2 * bs));
  uint32_t u = (uint32_t)(itest_rand(seed) % 6); /* few users: repeats */
  r->n = sys_len + user;
  for (uint32_t i = 0; i < sys_len; i++)
    r->tok[i] = 1000 * (sys + 1) + i;
  for (uint32_t i = sys_len; i < r->n; i++)
    r->tok[i] = 500000 + u * 1000 + i;
}

static int worker(int idx) {
  kvs_client *c = itest_connect(&d, "many");
  const kvs_layout *l = kvs_layout_of(c);
  uint32_t bs = l->block_size;
  uint64_t seed = 0x1234567ull * (uint64_t)(idx + 1);
  wreq req[NREQ];
  memset(req, 0, sizeof req);
  uint64_t next_id = 1;
  long hits = 0, nospace = 0, bad = 0;
  kvs_batch *b;
  CHECK_OK(c, kvs_batch_new(&b));

  for (int step = 0; step < STEPS; step++) {
    wreq *r = &req[itest_rand(&seed) % NREQ];
    int op = (int)(itest_rand(&seed) % 10);
    if (!r->live) {
      new_prompt(r, &seed, bs);
      r->id = next_id++;
      kvs_lookup_result lr;
      CHECK_OK(c, kvs_lookup(c, r->id, r->tok, r->n, NULL, 0, &lr));
      CHECK(lr.num_blocks == lr.hit_tokens / bs && lr.hit_tokens < r->n);
      memcpy(r->table, lr.blocks, lr.num_blocks * sizeof(uint32_t));
      r->nblocks = lr.num_blocks;
      r->slots = r->written = lr.hit_tokens;
      r->live = 1;
      if (lr.hit_tokens) {
        hits++;
        if (!verify(c, r, lr.hit_tokens))
          bad++;
      }
      continue;
    }
    if (op < 3 && r->slots < r->n) {
      /* Prefill the rest of the prompt, write it, commit it. */
      kvs_alloc_result ar;
      int rc = kvs_allocate(c, r->id, r->n - r->slots, &ar);
      if (rc == KVS_ENOSPC) {
        nospace++;
        continue;
      }
      CHECK_OK(c, rc);
      if (ar.has_cow) {
        memcpy(kvs_block_ptr(c, ar.cow_dst), kvs_block_ptr(c, ar.cow_src),
               l->block_stride);
        r->table[ar.cow_index] = ar.cow_dst;
      }
      memcpy(r->table + ar.first_index, ar.blocks,
             ar.num_blocks * sizeof(uint32_t));
      r->nblocks = ar.first_index + ar.num_blocks;
      r->slots = r->n;
      put(c, r, r->written, r->n);
      CHECK_OK(c, kvs_commit(c, r->id, r->written, NULL, r->n - r->written,
                             r->table + r->written / bs,
                             r->nblocks - r->written / bs, NULL));
      r->written = r->n;
    } else if (op < 5 && r->slots == r->n && r->written == r->n &&
               r->n < 150) {
      /* Decode a few tokens, in one batch: append, commit. */
      kvs_alloc_result ar;
      int rc = kvs_append(c, r->id, 1, &ar);
      if (rc == KVS_ENOSPC) {
        nospace++;
        continue;
      }
      CHECK_OK(c, rc);
      if (ar.has_cow) {
        memcpy(kvs_block_ptr(c, ar.cow_dst), kvs_block_ptr(c, ar.cow_src),
               l->block_stride);
        r->table[ar.cow_index] = ar.cow_dst;
      }
      if (ar.num_blocks)
        r->table[ar.first_index] = ar.blocks[0];
      r->nblocks = ar.first_index + ar.num_blocks > r->nblocks
                       ? ar.first_index + ar.num_blocks
                       : r->nblocks;
      r->tok[r->n] = 700000 + (uint32_t)idx * 1000 + r->n;
      r->slots = ++r->n;
      put(c, r, r->written, r->n);
      kvs_batch_reset(b);
      kvs_batch_commit(b, r->id, r->written, r->tok + r->written, 1, NULL, 0);
      kvs_batch_ping(b, "p", 1);
      CHECK_OK(c, kvs_batch_submit(c, b));
      CHECK(kvs_batch_status(b, 0) == 0 && kvs_batch_status(b, 1) == 0);
      r->written = r->n;
    } else if (op == 5) {
      /* Fork into a free slot of the table, then let the child go. */
      wreq *ch = NULL;
      for (int i = 0; i < NREQ; i++)
        if (!req[i].live)
          ch = &req[i];
      if (!ch || r->written != r->slots)
        continue;
      *ch = *r;
      ch->id = next_id++;
      CHECK_OK(c, kvs_fork(c, r->id, ch->id));
    } else if (op == 6) {
      CHECK_OK(c, kvs_preempt(c, r->id));
      CHECK_OK(c, kvs_free(c, r->id));
      r->live = 0;
    } else if (op == 7) {
      /* Free through a batch with a second, failing free. */
      kvs_batch_reset(b);
      kvs_batch_free_req(b, r->id);
      kvs_batch_free_req(b, r->id);
      CHECK_OK(c, kvs_batch_submit(c, b));
      CHECK(kvs_batch_status(b, 0) == 0);
      CHECK(kvs_batch_status(b, 1) == KVS_ENOENT);
      r->live = 0;
    } else if (op == 8) {
      kvs_stats st;
      CHECK_OK(c, kvs_stats_get(c, step % 20 == 0, &st));
      CHECK(st.check == 0);
    }
  }
  kvs_batch_free(b);
  if (bad) {
    fprintf(stderr, "worker %d: %ld hits with wrong bytes\n", idx, bad);
    return 1;
  }
  /* A third of the workers leave requests behind on purpose. */
  if (idx % 3 != 0)
    for (int i = 0; i < NREQ; i++)
      if (req[i].live)
        CHECK_OK(c, kvs_free(c, req[i].id));
  kvs_close(c);
  printf("worker %d: %ld hits verified, %ld ENOSPC\n", idx, hits, nospace);
  return 0;
}

int main(void) {
  int my_fds = itest_fd_count(0);
  static const char *const opts[] = {
      "--num-layers", "1",  "--num-kv-heads",    "1",   "--head-dim", "8",
      "--pool-blocks", "160", "--max-connections", "256", NULL};
  itest_daemon_start(&d, opts);
  kvs_client *c = itest_connect(&d, "many-main");

  pid_t pid[NCLIENTS];
  fflush(NULL);
  for (int i = 0; i < NCLIENTS; i++) {
    pid[i] = fork();
    CHECK(pid[i] >= 0);
    if (pid[i] == 0)
      _exit(worker(i));
  }
  /* Kill a few in the middle of their work. */
  usleep(20000);
  for (int i = 5; i < NCLIENTS; i += 16)
    kill(pid[i], SIGKILL);
  int failed = 0;
  for (int i = 0; i < NCLIENTS; i++) {
    int st = itest_wait(pid[i]);
    if (st != 0 && !(st == 128 + SIGKILL && i >= 5 && (i - 5) % 16 == 0)) {
      fprintf(stderr, "worker %d exited with %d\n", i, st);
      failed++;
    }
  }
  CHECK(failed == 0);
  itest_check_pool(c, 1, 0, 0);
  kvs_stats st;
  CHECK_OK(c, kvs_stats_get(c, 0, &st));
  printf("test_many: ok (%d clients, %llu lookups, %llu hit blocks, %llu "
         "evictions, %llu ENOSPC)\n",
         NCLIENTS, (unsigned long long)st.lookups,
         (unsigned long long)st.hit_blocks, (unsigned long long)st.evictions,
         (unsigned long long)st.no_space);
  kvs_close(c);
  itest_daemon_finish(&d, my_fds);
  return 0;
}
