/*
 * test_packed — a PackedBatch does exactly what the same Batch does.
 *
 * The same seeded workload runs twice, each time against a fresh daemon:
 * once with packed batches off ($KVS_PACKED_BATCH=0: every batch goes as a
 * protobuf Batch, the reference) and once on (libkvshare packs every batch
 * it can).  The workload is 600 scheduler steps of random batches over 24
 * requests sharing a few prefixes: lookups, allocates, appends, commits
 * (with and without tokens, with right and wrong block ids), forks, frees,
 * preempts, ids that do not exist (some steps fail more than 16 ops), and
 * daemon copies on.  The core is deterministic, so every op's status,
 * message and result (hit tokens, block tables, first index, copy-on-write
 * pair, sealed count) must be the same both times.  Then the pool checks.
 *
 * Two more runs take the request ring ($KVS_RING=1) against the same
 * reference: one with the daemon polling and the client spinning (calls
 * meet in shared memory), one with both asleep between calls (every call
 * wakes the daemon's eventfd and then the client's) and 4 KiB areas, so
 * that the bigger frames go on the socket and the bigger replies come back
 * on it.
 *
 * Last, the encodings: a client sends every call that has a compact form
 * as a compact frame, and one with $KVS_COMPACT=0 sends none, counted by
 * the daemon (StatsResult.compact_frames, read on a raw session).
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvs_frame.h"
#include "tests/integration/itest.h"

#define STEPS 600
#define NREQ 24
#define MAXOPS 64

/* What one op gave back, flattened into words. */
typedef struct trace {
  uint32_t *w;
  size_t n, cap;
  char **msgs;
  size_t nmsg, msgcap;
} trace;

static void put(trace *t, uint32_t v) {
  if (t->n == t->cap) {
    t->cap = t->cap ? 2 * t->cap : 4096;
    t->w = realloc(t->w, t->cap * sizeof(*t->w));
    CHECK(t->w);
  }
  t->w[t->n++] = v;
}

static void put_msg(trace *t, const char *m) {
  if (t->nmsg == t->msgcap) {
    t->msgcap = t->msgcap ? 2 * t->msgcap : 1024;
    t->msgs = realloc(t->msgs, t->msgcap * sizeof(*t->msgs));
    CHECK(t->msgs);
  }
  t->msgs[t->nmsg] = strdup(m);
  CHECK(t->msgs[t->nmsg]);
  t->nmsg++;
}

enum mode { BATCH, PACKED, RING_POLLING, RING_SLEEPING };

static void run(enum mode mode, trace *t, unsigned *packed_ops) {
  static const char *const opts[] = {"--num-layers", "2", "--head-dim", "16",
                                     "--pool-blocks", "96", NULL};
  static const char *const sleepy[] = {
      "--num-layers", "2", "--head-dim", "16", "--pool-blocks", "96",
      "--ring-poll-us", "0", "--ring-bytes", "4096", NULL};
  static const char *const names[] = {"batch", "packed", "ring-polling",
                                      "ring-sleeping"};
  itest_daemon d;
  int my_fds = itest_fd_count(0);
  kvs_client *c;
  kvs_batch *b;
  uint64_t rng = 20261123;
  uint32_t bs, prompt[4][96];
  int packed = mode != BATCH;

  setenv("KVS_PACKED_BATCH", packed ? "1" : "0", 1);
  setenv("KVS_RING", mode >= RING_POLLING ? "1" : "0", 1);
  setenv("KVS_RING_SPIN_US", mode == RING_SLEEPING ? "0" : "50", 1);
  itest_daemon_start(&d, mode == RING_SLEEPING ? sleepy : opts);
  c = itest_connect(&d, names[mode]);
  CHECK(kvs_ring_active(c) == (mode >= RING_POLLING));
  CHECK_OK(c, kvs_set_daemon_copy(c, 1));
  bs = kvs_layout_of(c)->block_size;
  for (int p = 0; p < 4; p++)
    for (int i = 0; i < 96; i++)
      prompt[p][i] = (uint32_t)(p < 2 ? 1000 + i : 2000 + 97 * p + i);
  CHECK(kvs_batch_new(&b) == 0);
  for (int step = 0; step < STEPS; step++) {
    uint32_t nops = 1 + (uint32_t)(itest_rand(&rng) % MAXOPS);
    uint32_t blocks[4];

    kvs_batch_reset(b);
    for (uint32_t k = 0; k < nops; k++) {
      uint64_t id = 1 + itest_rand(&rng) % (NREQ + 4); /* some never made */
      uint32_t n = 1 + (uint32_t)(itest_rand(&rng) % (3 * bs));
      const uint32_t *pr = prompt[itest_rand(&rng) % 4];
      int rc = 0;

      switch (itest_rand(&rng) % 9) {
      case 0:
      case 1:
        rc = kvs_batch_lookup(b, id, pr, 1 + (uint32_t)(itest_rand(&rng) % 96),
                              NULL, 0);
        break;
      case 2:
        rc = kvs_batch_allocate(b, id, n);
        break;
      case 3:
        rc = kvs_batch_append(b, id, 1 + n % 3);
        break;
      case 4: /* known tokens, or the prompt's own */
        rc = itest_rand(&rng) % 2
                 ? kvs_batch_commit(b, id, 0, NULL, n, NULL, 0)
                 : kvs_batch_commit(b, id, 0, pr, n % 96 + 1, NULL, 0);
        break;
      case 5: /* block ids that may or may not be the request's */
        for (int j = 0; j < 4; j++)
          blocks[j] = (uint32_t)(itest_rand(&rng) % 100);
        rc = kvs_batch_commit(b, id, 0, NULL, (1 + n % 4) * bs, blocks,
                              1 + n % 4);
        break;
      case 6:
        rc = kvs_batch_fork(b, id, 1 + itest_rand(&rng) % (NREQ + 4));
        break;
      case 7:
        rc = kvs_batch_free_req(b, id);
        break;
      default:
        rc = kvs_batch_preempt(b, id);
        break;
      }
      CHECK(rc == (int)k);
    }
    CHECK_OK(c, kvs_batch_submit(c, b));
    *packed_ops += packed ? nops : 0;
    put(t, nops);
    for (uint32_t k = 0; k < nops; k++) {
      int st = kvs_batch_status(b, k);
      kvs_lookup_result lr;
      kvs_alloc_result ar;
      uint32_t sealed;

      put(t, (uint32_t)st);
      put_msg(t, kvs_batch_message(b, k));
      if (st)
        continue;
      if (kvs_batch_lookup_result(b, k, &lr) == 0) {
        put(t, 1);
        put(t, lr.hit_tokens);
        put(t, lr.num_blocks);
        for (uint32_t j = 0; j < lr.num_blocks; j++)
          put(t, lr.blocks[j]);
      } else if (kvs_batch_alloc_result(b, k, &ar) == 0) {
        put(t, 2);
        put(t, ar.first_index);
        put(t, (uint32_t)ar.has_cow);
        put(t, ar.cow_src);
        put(t, ar.cow_dst);
        put(t, ar.cow_index);
        put(t, ar.num_blocks);
        for (uint32_t j = 0; j < ar.num_blocks; j++)
          put(t, ar.blocks[j]);
      } else if (kvs_batch_commit_result(b, k, &sealed) == 0) {
        put(t, 3);
        put(t, sealed);
      }
    }
  }
  /* Free everything the workload left, and check the pool. */
  kvs_batch_reset(b);
  for (uint64_t id = 1; id <= NREQ + 4; id++)
    kvs_batch_free_req(b, id);
  CHECK_OK(c, kvs_batch_submit(c, b));
  kvs_batch_free(b);
  itest_check_pool(c, 1, 0, 0);
  kvs_close(c);
  itest_daemon_finish(&d, my_fds);
}

/* t's results must equal the reference's, word for word and message for
 * message; t is freed. */
static void same_as(const trace *ref, trace *t, const char *what) {
  CHECK(ref->n == t->n && ref->nmsg == t->nmsg);
  for (size_t i = 0; i < ref->n; i++)
    if (ref->w[i] != t->w[i]) {
      fprintf(stderr, "word %zu differs: batch %u, %s %u\n", i, ref->w[i],
              what, t->w[i]);
      exit(1);
    }
  for (size_t i = 0; i < ref->nmsg; i++) {
    if (strcmp(ref->msgs[i], t->msgs[i]) != 0) {
      fprintf(stderr, "message %zu differs: batch \"%s\", %s \"%s\"\n", i,
              ref->msgs[i], what, t->msgs[i]);
      exit(1);
    }
    free(t->msgs[i]);
  }
  free(t->w);
  free(t->msgs);
}

/* The daemon's count of compact frames, read with a protobuf Stats on a
 * raw session (which counts one frame, not compact). */
static uint64_t compact_frames(const itest_daemon *d) {
  Kvshare__Stats q = KVSHARE__STATS__INIT;
  Kvshare__Request req = KVSHARE__REQUEST__INIT;
  Kvshare__Envelope env = KVSHARE__ENVELOPE__INIT, *r;
  int fd = itest_raw_session(d);
  uint64_t n;

  req.op_case = KVSHARE__REQUEST__OP_STATS;
  req.stats = &q;
  env.seq = 2;
  env.body_case = KVSHARE__ENVELOPE__BODY_REQUEST;
  env.request = &req;
  itest_raw_send_env(fd, &env);
  r = itest_raw_recv(fd);
  CHECK(r && r->body_case == KVSHARE__ENVELOPE__BODY_RESPONSE &&
        r->response->result_case == KVSHARE__RESPONSE__RESULT_STATS);
  n = r->response->stats->compact_frames;
  kvs_envelope_free(r);
  close(fd);
  return n;
}

/* The calls that have a compact form, once each (plus a Stats, which has
 * none): how many compact frames they are. */
static unsigned some_calls(kvs_client *c) {
  uint32_t tok[40];
  kvs_alloc_result ar;
  kvs_lookup_result lr;
  kvs_stats st;
  kvs_batch *b;

  for (uint32_t i = 0; i < 40; i++)
    tok[i] = 500 + i;
  CHECK_OK(c, kvs_ping(c, "x", 1));
  CHECK_OK(c, kvs_lookup(c, 1, tok, 40, NULL, 0, &lr));
  CHECK_OK(c, kvs_allocate(c, 1, 40 - lr.hit_tokens, &ar));
  CHECK_OK(c, kvs_commit(c, 1, lr.hit_tokens, tok + lr.hit_tokens,
                         40 - lr.hit_tokens, NULL, 0, NULL));
  CHECK_OK(c, kvs_fork(c, 1, 2));
  CHECK_OK(c, kvs_append(c, 2, 1, NULL));
  CHECK_OK(c, kvs_preempt(c, 2));
  CHECK_OK(c, kvs_free(c, 2));
  CHECK_OK(c, kvs_batch_new(&b));
  CHECK(kvs_batch_free_req(b, 1) >= 0);
  CHECK_OK(c, kvs_batch_submit(c, b));
  CHECK(kvs_batch_status(b, 0) == 0);
  kvs_batch_free(b);
  CHECK_OK(c, kvs_stats_get(c, 1, &st));
  CHECK(st.check == 0);
  return 9;
}

static void check_encodings(void) {
  static const char *const opts[] = {"--num-layers", "2", "--head-dim", "16",
                                     "--pool-blocks", "64", NULL};
  itest_daemon d;
  int fds = itest_fd_count(0);
  uint64_t n0, n1, n2;
  unsigned sent;
  kvs_client *c;

  const char *e = getenv("KVS_COMPACT");
  char *was = e ? strdup(e) : NULL; /* (test_envelope_suite sets it) */

  itest_daemon_start(&d, opts);
  n0 = compact_frames(&d);
  setenv("KVS_COMPACT", "1", 1);
  c = itest_connect(&d, "compact");
  sent = some_calls(c);
  kvs_close(c);
  n1 = compact_frames(&d);
  setenv("KVS_COMPACT", "0", 1);
  c = itest_connect(&d, "envelopes");
  if (was)
    setenv("KVS_COMPACT", was, 1);
  else
    unsetenv("KVS_COMPACT");
  free(was);
  some_calls(c);
  kvs_close(c);
  n2 = compact_frames(&d);
  if (n1 - n0 != sent || n2 != n1) {
    fprintf(stderr, "compact frames: %llu for %u compact calls, then %llu "
            "more with KVS_COMPACT=0\n", (unsigned long long)(n1 - n0), sent,
            (unsigned long long)(n2 - n1));
    exit(1);
  }
  itest_daemon_finish(&d, fds);
}

int main(void) {
  trace ref = {0}, pk = {0}, rp = {0}, rs = {0};
  unsigned packed_ops = 0, unused = 0;

  run(BATCH, &ref, &packed_ops);
  run(PACKED, &pk, &packed_ops);
  run(RING_POLLING, &rp, &unused);
  run(RING_SLEEPING, &rs, &unused);
  same_as(&ref, &pk, "packed");
  same_as(&ref, &rp, "ring (polling)");
  same_as(&ref, &rs, "ring (sleeping)");
  check_encodings();
  printf("test_packed: ok (%u packed ops, %zu ops' results the same as "
         "the Batch's, packed and through the ring, %zu words)\n",
         packed_ops, ref.nmsg, ref.n);
  for (size_t i = 0; i < ref.nmsg; i++)
    free(ref.msgs[i]);
  free(ref.w);
  free(ref.msgs);
  return 0;
}
