/*
 * test_events — the KV event stream (daemon/observe/events.c) of two cores
 * on one endpoint, as the daemon has with two tenants: two cores with
 * different roots, one events object observing both on ipc:// endpoints,
 * a ZMQ SUB subscriber and a DEALER asking the ROUTER for a replay.
 *
 *   test_two_cores   core B's restored disk copy is published after the one
 *                    AllBlocksCleared; a commit on each core in one loop
 *                    iteration goes out in one batch, each under its own
 *                    core's hashes; the engine's keys of B's commit are
 *                    refused for the block B's tier holds (on_sealed asks
 *                    the core it came from) and kept for the other, down to
 *                    its removal; the replay holds every batch in order;
 *                    events_close publishes AllBlocksCleared and detaches
 *                    from both cores (they go on without it: ASan sees any
 *                    use of the freed events).
 *   test_open_fails  a bind that fails leaves no observer and no leak.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <msgpack.h>
#include <uv.h>
#include <zmq.h>

#include "daemon/config.h"
#include "daemon/core/core.h"
#include "daemon/observe/events.h"

#define BS 4
#define NB 8
#define MAXH 16
#define MAXEV 64
#define WAIT_MS 5000

/* An event of a batch, decoded (map encoding). */
typedef struct ev {
  char type[32];
  char medium[16];
  uint32_t nh;
  uint64_t h[MAXH];
  int parent_nil;
  uint64_t seq; /* its batch's */
} ev;

static const kvs_hash128 ZERO = {0, 0};

static const msgpack_object *mp_get(const msgpack_object *map,
                                    const char *key) {
  assert_int_equal(map->type, MSGPACK_OBJECT_MAP);
  for (uint32_t i = 0; i < map->via.map.size; i++) {
    const msgpack_object_kv *kv = &map->via.map.ptr[i];

    if (kv->key.type == MSGPACK_OBJECT_STR &&
        kv->key.via.str.size == strlen(key) &&
        memcmp(kv->key.via.str.ptr, key, kv->key.via.str.size) == 0)
      return &kv->val;
  }
  return NULL;
}

static void mp_str(const msgpack_object *o, char *out, size_t len) {
  assert_non_null(o);
  assert_int_equal(o->type, MSGPACK_OBJECT_STR);
  assert_true(o->via.str.size < len);
  memcpy(out, o->via.str.ptr, o->via.str.size);
  out[o->via.str.size] = '\0';
}

/* The events of one batch's payload, appended to evs (*n of them). */
static void decode(const void *buf, size_t len, uint64_t seq, ev *evs,
                   uint32_t *n) {
  msgpack_unpacked u;
  size_t off = 0;
  const msgpack_object *list;

  msgpack_unpacked_init(&u);
  assert_int_equal(msgpack_unpack_next(&u, buf, len, &off),
                   MSGPACK_UNPACK_SUCCESS);
  assert_int_equal(off, len);
  assert_non_null(mp_get(&u.data, "ts"));
  list = mp_get(&u.data, "events");
  assert_non_null(list);
  assert_int_equal(list->type, MSGPACK_OBJECT_ARRAY);
  for (uint32_t i = 0; i < list->via.array.size; i++) {
    const msgpack_object *o = &list->via.array.ptr[i], *f;
    ev *x = &evs[*n];

    assert_true(*n < MAXEV);
    memset(x, 0, sizeof(*x));
    x->seq = seq;
    mp_str(mp_get(o, "type"), x->type, sizeof(x->type));
    if ((f = mp_get(o, "medium")) != NULL)
      mp_str(f, x->medium, sizeof(x->medium));
    if ((f = mp_get(o, "block_hashes")) != NULL) {
      assert_int_equal(f->type, MSGPACK_OBJECT_ARRAY);
      assert_true(f->via.array.size <= MAXH);
      x->nh = f->via.array.size;
      for (uint32_t j = 0; j < x->nh; j++) {
        assert_int_equal(f->via.array.ptr[j].type,
                         MSGPACK_OBJECT_POSITIVE_INTEGER);
        x->h[j] = f->via.array.ptr[j].via.u64;
      }
    }
    if ((f = mp_get(o, "parent_block_hash")) != NULL)
      x->parent_nil = f->type == MSGPACK_OBJECT_NIL;
    (*n)++;
  }
  msgpack_unpacked_destroy(&u);
}

static uint64_t be64(const uint8_t b[8]) {
  uint64_t v = 0;

  for (int i = 0; i < 8; i++)
    v = v << 8 | b[i];
  return v;
}

/* One message of want frames from s (frames[i] up to 64 KiB each). */
static void recv_msg(void *s, int want, uint8_t frames[][65536],
                     size_t *lens) {
  for (int i = 0; i < want; i++) {
    int n = zmq_recv(s, frames[i], 65536, 0), more = 0;
    size_t sz = sizeof(more);

    if (n < 0)
      fail_msg("zmq_recv: %s", zmq_strerror(zmq_errno()));
    assert_true(n <= 65536);
    lens[i] = (size_t)n;
    assert_int_equal(zmq_getsockopt(s, ZMQ_RCVMORE, &more, &sz), 0);
    assert_int_equal(more, i < want - 1);
  }
}

/* One batch from the SUB socket (topic, seq, payload), decoded. */
static uint64_t recv_batch(void *sub, const char *topic, ev *evs,
                           uint32_t *n) {
  static uint8_t frames[3][65536];
  size_t lens[3];
  uint64_t seq;

  recv_msg(sub, 3, frames, lens);
  assert_int_equal(lens[0], strlen(topic));
  assert_memory_equal(frames[0], topic, lens[0]);
  assert_int_equal(lens[1], 8);
  seq = be64(frames[1]);
  decode(frames[2], lens[2], seq, evs, n);
  return seq;
}

static core *make_core(const char *model) {
  core_config cc;
  kvs_layout l = {BS, 1, 1, 1, KVS_DTYPE_FP32, NB, 0};
  core *c;

  core_config_init(&cc);
  cc.num_blocks = NB;
  cc.block_size = BS;
  cc.root = core_root_hash(&l, model);
  cc.keep_tokens = 1;
  cc.tier_slots[CORE_TIER_DISK] = 4;
  assert_int_equal(core_create(&cc, &c), 0);
  return c;
}

static kvs_hash128 root_of(const char *model) {
  kvs_layout l = {BS, 1, 1, 1, KVS_DTYPE_FP32, NB, 0};

  return core_root_hash(&l, model);
}

/* A request on c that writes and commits the 2 blocks of tokens. */
static core_req *commit2(core *c, const uint32_t *tokens) {
  core_req *r;
  core_cow cow;
  uint32_t sealed = 0;

  assert_int_equal(core_req_create(c, NULL, 0, &r), 0);
  assert_int_equal(core_allocate(c, r, 2 * BS, &cow), 0);
  assert_int_equal(core_commit(c, r, 0, tokens, 2 * BS, &sealed), 0);
  assert_int_equal(sealed, 2);
  return r;
}

/* Every block of c's pool taken by one request, then freed: the cached
 * ones are evicted. */
static void evict_all(core *c) {
  core_req *r;
  core_cow cow;

  assert_int_equal(core_req_create(c, NULL, 0, &r), 0);
  assert_int_equal(core_allocate(c, r, NB * BS, &cow), 0);
  core_req_free(c, r);
}

static int has(const ev *x, uint64_t h) {
  for (uint32_t i = 0; i < x->nh; i++)
    if (x->h[i] == h)
      return 1;
  return 0;
}

/* The events of type (and medium, unless NULL) that name h. */
static uint32_t count(const ev *evs, uint32_t n, const char *type,
                      const char *medium, uint64_t h) {
  uint32_t k = 0;

  for (uint32_t i = 0; i < n; i++)
    if (strcmp(evs[i].type, type) == 0 &&
        (medium == NULL || strcmp(evs[i].medium, medium) == 0) &&
        has(&evs[i], h))
      k++;
  return k;
}

static void run_once(uv_loop_t *loop) { uv_run(loop, UV_RUN_NOWAIT); }

static void test_two_cores(void **state) {
  static const uint32_t toks[2 * BS] = {11, 12, 13, 14, 21, 22, 23, 24};
  static const uint64_t keys[2] = {1001, 1002};
  char dir[] = "/tmp/kvs-events-XXXXXX", ep[128], rep[128], err[256];
  kvs_hash128 a0, a1, b0, b1;
  core *cores[2];
  events *e = NULL;
  events_stats st;
  uv_loop_t loop;
  cfg c;
  void *zctx, *sub, *dealer;
  int tmo = WAIT_MS;
  ev live[MAXEV], rp[MAXEV];
  uint32_t nlive = 0, nrp = 0;
  uint64_t first_seq, seq;
  core_req *ra, *rb;
  kvs_op_keys k;
  kvs_op op;

  (void)state;
  assert_non_null(mkdtemp(dir));
  snprintf(ep, sizeof(ep), "ipc://%s/ev", dir);
  snprintf(rep, sizeof(rep), "ipc://%s/replay", dir);
  cfg_init(&c);
  assert_int_equal(cfg_set(&c, "kv_events_endpoint", ep, err, sizeof(err)), 0);
  assert_int_equal(
      cfg_set(&c, "kv_events_replay_endpoint", rep, err, sizeof(err)), 0);
  assert_int_equal(cfg_set(&c, "kv_events_topic", "kv", err, sizeof(err)), 0);

  /* The same tokens in both: different hashes (the roots differ). */
  a0 = core_block_hash(root_of("tenant-a"), ZERO, toks, BS);
  a1 = core_block_hash(a0, ZERO, toks + BS, BS);
  b0 = core_block_hash(root_of("tenant-b"), ZERO, toks, BS);
  b1 = core_block_hash(b0, ZERO, toks + BS, BS);
  assert_true(a0.lo != b0.lo && a1.lo != b1.lo);
  cores[0] = make_core("tenant-a");
  cores[1] = make_core("tenant-b");
  /* B's disk tier kept b0 across a restart. */
  assert_int_equal(core_tier_restore_begin(cores[1], CORE_TIER_DISK), 0);
  assert_int_equal(core_tier_restore(cores[1], 0, 1, b0, toks), 0);
  assert_int_equal(core_tier_restore_end(cores[1]), 1);

  assert_int_equal(uv_loop_init(&loop), 0);
  assert_int_equal(events_open(&loop, &c, cores, 2, "GPU", BS, &e, err,
                               sizeof(err)),
                   0);
  assert_non_null(e);

  /* A subscriber, once its subscription is taken. */
  zctx = zmq_ctx_new();
  sub = zmq_socket(zctx, ZMQ_SUB);
  zmq_setsockopt(sub, ZMQ_RCVTIMEO, &tmo, sizeof(tmo));
  assert_int_equal(zmq_connect(sub, ep), 0);
  assert_int_equal(zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "kv", 2), 0);
  for (int i = 0;; i++) {
    run_once(&loop);
    events_get_stats(e, &st);
    if (st.subscriptions > 0)
      break;
    if (i == WAIT_MS / 10)
      fail_msg("the subscription was not taken");
    usleep(10000);
  }

  /* One commit on each core in one iteration: one batch. */
  ra = commit2(cores[0], toks);
  memset(&k, 0, sizeof(k));
  k.nblocks = 2;
  k.hashes = keys;
  memset(&op, 0, sizeof(op));
  op.keys = &k;
  assert_int_equal(events_keys_begin(e, &op, 0, err, sizeof(err)), 0);
  rb = commit2(cores[1], toks);
  events_keys_end(e);
  run_once(&loop);
  first_seq = recv_batch(sub, "kv", live, &nlive);
  assert_int_equal(nlive, 2);
  assert_string_equal(live[0].type, "BlockStored");
  assert_string_equal(live[0].medium, "GPU");
  assert_int_equal(live[0].nh, 2);
  assert_true(live[0].h[0] == a0.lo && live[0].h[1] == a1.lo);
  assert_true(live[0].parent_nil);
  /* b0's copy below went out under B's hash: its key is refused (B's
   * tier, not A's, holds it); b1 takes the engine's. */
  assert_string_equal(live[1].type, "BlockStored");
  assert_string_equal(live[1].medium, "GPU");
  assert_int_equal(live[1].nh, 2);
  assert_true(live[1].h[0] == b0.lo && live[1].h[1] == keys[1]);
  assert_true(live[1].parent_nil);

  /* Both cores evict: their removals, under the keys they went out as. */
  core_req_free(cores[0], ra);
  core_req_free(cores[1], rb);
  evict_all(cores[0]);
  evict_all(cores[1]);
  run_once(&loop);
  seq = recv_batch(sub, "kv", live, &nlive);
  assert_true(seq == first_seq + 1);
  assert_int_equal(count(live, nlive, "BlockRemoved", "GPU", a0.lo), 1);
  assert_int_equal(count(live, nlive, "BlockRemoved", "GPU", a1.lo), 1);
  assert_int_equal(count(live, nlive, "BlockRemoved", "GPU", b0.lo), 1);
  assert_int_equal(count(live, nlive, "BlockRemoved", "GPU", keys[1]), 1);
  assert_int_equal(count(live, nlive, "BlockRemoved", NULL, b1.lo), 0);

  events_get_stats(e, &st);
  assert_int_equal(st.stored, 5); /* b0 on disk, then 4 in the pool */
  assert_int_equal(st.removed, 4);
  assert_int_equal(st.tier_blocks, 1);
  assert_int_equal(st.key_failures, 1);
  assert_int_equal(st.dropped, 0);

  /* The replay: every kept batch from the first, in order. */
  dealer = zmq_socket(zctx, ZMQ_DEALER);
  zmq_setsockopt(dealer, ZMQ_RCVTIMEO, &tmo, sizeof(tmo));
  assert_int_equal(zmq_connect(dealer, rep), 0);
  {
    static const uint8_t zero8[8] = {0};
    static uint8_t frames[2][65536];
    size_t lens[2];
    uint64_t prev = 0;
    int batches = 0;

    assert_int_equal(zmq_send(dealer, zero8, 8, 0), 8);
    for (;;) {
      /* (the ROUTER answers on the loop thread) */
      for (int i = 0;; i++) {
        zmq_pollitem_t pi = {dealer, 0, ZMQ_POLLIN, 0};

        run_once(&loop);
        if (zmq_poll(&pi, 1, 10) > 0)
          break;
        if (i == WAIT_MS / 10)
          fail_msg("no replay");
      }
      recv_msg(dealer, 2, frames, lens);
      assert_int_equal(lens[0], 8);
      seq = be64(frames[0]);
      if (seq == UINT64_MAX) {
        assert_int_equal(lens[1], 0);
        break;
      }
      if (batches++)
        assert_true(seq == prev + 1);
      prev = seq;
      decode(frames[1], lens[1], seq, rp, &nrp);
    }
    assert_int_equal(batches, 4);
    assert_true(prev == first_seq + 1);
  }
  /* AllBlocksCleared once, then B's restored copy, then the live ones. */
  assert_true(nrp >= 4);
  assert_string_equal(rp[0].type, "AllBlocksCleared");
  assert_true(rp[0].seq == first_seq - 2);
  assert_string_equal(rp[1].type, "BlockStored");
  assert_string_equal(rp[1].medium, "DISK");
  assert_int_equal(rp[1].nh, 1);
  assert_true(rp[1].h[0] == b0.lo);
  assert_true(rp[1].seq == first_seq - 1);
  assert_int_equal(nrp, 2 + nlive);
  for (uint32_t i = 0; i < nlive; i++) {
    assert_string_equal(rp[2 + i].type, live[i].type);
    assert_int_equal(rp[2 + i].nh, live[i].nh);
    assert_memory_equal(rp[2 + i].h, live[i].h, live[i].nh * sizeof(uint64_t));
    assert_true(rp[2 + i].seq == live[i].seq);
  }
  events_get_stats(e, &st);
  assert_int_equal(st.replays, 1);

  /* Closed: AllBlocksCleared goes out, and neither core tells it more. */
  events_close(e);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  nlive = 0;
  seq = recv_batch(sub, "kv", live, &nlive);
  assert_true(seq == first_seq + 2);
  assert_int_equal(nlive, 1);
  assert_string_equal(live[0].type, "AllBlocksCleared");
  for (int i = 0; i < 2; i++) {
    core_req_free(cores[i], commit2(cores[i], toks));
    evict_all(cores[i]);
  }

  zmq_close(dealer);
  zmq_close(sub);
  zmq_ctx_term(zctx);
  assert_int_equal(uv_loop_close(&loop), 0);
  core_destroy(cores[0]);
  core_destroy(cores[1]);
  {
    char p[160];

    snprintf(p, sizeof(p), "%s/ev", dir);
    unlink(p);
    snprintf(p, sizeof(p), "%s/replay", dir);
    unlink(p);
  }
  assert_int_equal(rmdir(dir), 0);
}

static void test_open_fails(void **state) {
  char err[256];
  core *cores[2];
  events *e = (events *)&e;
  uv_loop_t loop;
  cfg c;

  (void)state;
  cfg_init(&c);
  assert_int_equal(cfg_set(&c, "kv_events_endpoint",
                           "ipc:///nonexistent-kvs-dir/ev", err, sizeof(err)),
                   0);
  cores[0] = make_core("tenant-a");
  cores[1] = make_core("tenant-b");
  assert_int_equal(uv_loop_init(&loop), 0);
  err[0] = '\0';
  assert_int_equal(events_open(&loop, &c, cores, 2, "GPU", BS, &e, err,
                               sizeof(err)),
                   -1);
  assert_null(e);
  assert_non_null(strstr(err, "cannot bind"));
  /* No observer was left on either core. */
  for (int i = 0; i < 2; i++) {
    core_req_free(cores[i], commit2(cores[i], (const uint32_t[2 * BS]){1}));
    evict_all(cores[i]);
  }
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(uv_loop_close(&loop), 0);
  core_destroy(cores[0]);
  core_destroy(cores[1]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_two_cores),
      cmocka_unit_test(test_open_fails),
  };

  return cmocka_run_group_tests(tests, NULL, NULL);
}
