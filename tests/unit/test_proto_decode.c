/*
 * The decode's memory bound (kvs_envelope_scan, KVS_UNPACK_LIMIT):
 * - the scan's bound is never below what protobuf-c really allocates
 *   (counted by an allocator that charges kvs__unpack_cost), on random
 *   requests and replies with unknown fields, and is not far above it;
 * - the arena decoder and the malloc decoder charge alike;
 * - every frame a sender may send decodes under the receiver's limit: a
 *   Batch of max_batch_ops ops of the smallest and of the largest kind, a
 *   frame of max_frame bytes, the reply to the largest batch;
 * - a payload that would take more is refused before anything is
 *   allocated, its seq still read.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvs_arena.h"
#include "kvs_frame.h"

#define OPS KVS_UNPACK_OPS_DEFAULT

/* --- an allocator that charges as the decoders do ---------------------- */

struct charge {
  size_t charged;
};

static void *charge_alloc(void *data, size_t size) {
  ((struct charge *)data)->charged += kvs__unpack_cost(size);
  return malloc(size);
}

static void charge_free(void *data, void *p) {
  (void)data;
  free(p);
}

/* --- random messages ---------------------------------------------------- */

static uint64_t rs = 88172645463325252ull;

static uint64_t rnd(void) {
  rs ^= rs << 13;
  rs ^= rs >> 7;
  rs ^= rs << 17;
  return rs;
}

/* A value of random magnitude: a varint of 1 to 5 (or 10) bytes. */
static uint64_t rnd_mag(int bits) { return rnd() >> (64 - 1 - rnd() % bits); }

/* Everything the generator allocates, freed at once. */
static void *pool[1 << 16];
static size_t npool;

static void *take(size_t n) {
  void *p = calloc(1, n ? n : 1);

  assert_non_null(p);
  assert_true(npool < sizeof(pool) / sizeof(pool[0]));
  pool[npool++] = p;
  return p;
}

static void drop_all(void) {
  while (npool)
    free(pool[--npool]);
}

static uint32_t *rnd_u32s(size_t n) {
  uint32_t *a = take(n * sizeof(*a));
  size_t i;

  for (i = 0; i < n; i++)
    a[i] = (uint32_t)rnd_mag(32);
  return a;
}

static char *rnd_str(size_t max) {
  size_t n = rnd() % (max + 1), i;
  char *s = take(n + 1);

  for (i = 0; i < n; i++)
    s[i] = (char)('a' + rnd() % 26);
  return s;
}

static Kvshare__Request *rnd_op(int allow_batch);

static Kvshare__Batch *rnd_batch(size_t max_ops) {
  Kvshare__Batch *b = take(sizeof(*b));
  size_t i;

  kvshare__batch__init(b);
  b->n_ops = rnd() % (max_ops + 1);
  b->ops = take(b->n_ops * sizeof(*b->ops));
  for (i = 0; i < b->n_ops; i++)
    b->ops[i] = rnd_op(0);
  return b;
}

static Kvshare__Request *rnd_op(int allow_batch) {
  Kvshare__Request *r = take(sizeof(*r));

  kvshare__request__init(r);
  switch (rnd() % (allow_batch ? 9 : 8)) {
  case 0: {
    Kvshare__Lookup *l = take(sizeof(*l));

    kvshare__lookup__init(l);
    l->req_id = rnd_mag(64);
    l->n_tokens = rnd() % 600;
    l->tokens = rnd_u32s(l->n_tokens);
    l->salt.len = rnd() % 3 ? 0 : rnd() % 40;
    l->salt.data = take(l->salt.len);
    l->no_promote = (protobuf_c_boolean)(rnd() & 1);
    r->op_case = KVSHARE__REQUEST__OP_LOOKUP;
    r->lookup = l;
    break;
  }
  case 1: {
    Kvshare__Allocate *a = take(sizeof(*a));

    kvshare__allocate__init(a);
    a->req_id = rnd_mag(64);
    a->num_tokens = (uint32_t)rnd_mag(32);
    r->op_case = KVSHARE__REQUEST__OP_ALLOCATE;
    r->allocate = a;
    break;
  }
  case 2: {
    Kvshare__Commit *c = take(sizeof(*c));

    kvshare__commit__init(c);
    c->req_id = rnd_mag(64);
    c->start = (uint32_t)rnd_mag(32);
    c->n_tokens = rnd() % 300;
    c->tokens = rnd_u32s(c->n_tokens);
    c->n_blocks = rnd() % 20;
    c->blocks = rnd_u32s(c->n_blocks);
    r->op_case = KVSHARE__REQUEST__OP_COMMIT;
    r->commit = c;
    break;
  }
  case 3: {
    Kvshare__Free *f = take(sizeof(*f));

    kvshare__free__init(f);
    f->req_id = rnd_mag(64);
    r->op_case = KVSHARE__REQUEST__OP_FREE;
    r->free = f;
    break;
  }
  case 4: {
    Kvshare__Ping *p = take(sizeof(*p));

    kvshare__ping__init(p);
    p->payload.len = rnd() % 100;
    p->payload.data = take(p->payload.len);
    r->op_case = KVSHARE__REQUEST__OP_PING;
    r->ping = p;
    break;
  }
  case 5: {
    Kvshare__Stats *s = take(sizeof(*s));

    kvshare__stats__init(s);
    s->check = (protobuf_c_boolean)(rnd() & 1);
    r->op_case = KVSHARE__REQUEST__OP_STATS;
    r->stats = s;
    break;
  }
  case 6: {
    Kvshare__Fork *f = take(sizeof(*f));

    kvshare__fork__init(f);
    f->req_id = rnd_mag(64);
    f->child_id = rnd_mag(64);
    r->op_case = KVSHARE__REQUEST__OP_FORK;
    r->fork = f;
    break;
  }
  case 7: /* an empty op: no oneof member set */
    break;
  default:
    r->op_case = KVSHARE__REQUEST__OP_BATCH;
    r->batch = rnd_batch(400);
    break;
  }
  return r;
}

static Kvshare__Response *rnd_reply(int allow_batch) {
  Kvshare__Response *r = take(sizeof(*r));

  kvshare__response__init(r);
  if (rnd() & 1) {
    Kvshare__Status *st = take(sizeof(*st));

    kvshare__status__init(st);
    st->code = -(int32_t)(rnd() % 5000);
    st->message = rnd_str(255);
    r->status = st;
  }
  switch (rnd() % (allow_batch ? 5 : 4)) {
  case 0: {
    Kvshare__LookupResult *l = take(sizeof(*l));

    kvshare__lookup_result__init(l);
    l->hit_tokens = (uint32_t)rnd_mag(32);
    l->n_blocks = rnd() % 300;
    l->blocks = rnd_u32s(l->n_blocks);
    r->result_case = KVSHARE__RESPONSE__RESULT_LOOKUP;
    r->lookup = l;
    break;
  }
  case 1: {
    Kvshare__AllocResult *a = take(sizeof(*a));

    kvshare__alloc_result__init(a);
    a->n_blocks = rnd() % 50;
    a->blocks = rnd_u32s(a->n_blocks);
    a->has_cow = (protobuf_c_boolean)(rnd() & 1);
    r->result_case = KVSHARE__RESPONSE__RESULT_ALLOC;
    r->alloc = a;
    break;
  }
  case 2: {
    Kvshare__StatsResult *s = take(sizeof(*s));
    size_t i;

    kvshare__stats_result__init(s);
    s->lookups = rnd_mag(64);
    s->check_message = rnd_str(100);
    s->backend = rnd_str(8);
    s->n_tiers = rnd() % 3;
    s->tiers = take(s->n_tiers * sizeof(*s->tiers));
    for (i = 0; i < s->n_tiers; i++) {
      s->tiers[i] = take(sizeof(**s->tiers));
      kvshare__tier_stats__init(s->tiers[i]);
      s->tiers[i]->name = rnd_str(6);
      s->tiers[i]->bytes_out = rnd_mag(64);
    }
    r->result_case = KVSHARE__RESPONSE__RESULT_STATS;
    r->stats = s;
    break;
  }
  case 3:
    r->result_case = KVSHARE__RESPONSE__RESULT_PONG;
    r->pong.len = rnd() % 64;
    r->pong.data = take(r->pong.len);
    break;
  default: {
    Kvshare__BatchResult *b = take(sizeof(*b));
    size_t i;

    kvshare__batch_result__init(b);
    b->n_replies = rnd() % 300;
    b->replies = take(b->n_replies * sizeof(*b->replies));
    for (i = 0; i < b->n_replies; i++)
      b->replies[i] = rnd_reply(0);
    r->result_case = KVSHARE__RESPONSE__RESULT_BATCH;
    r->batch = b;
    break;
  }
  }
  return r;
}

/* Packs env into a new buffer, with `extra` bytes of room after it. */
static uint8_t *pack(const Kvshare__Envelope *env, size_t extra, size_t *len) {
  uint8_t *buf;

  *len = kvshare__envelope__get_packed_size(env);
  buf = malloc(*len + extra);
  assert_non_null(buf);
  kvshare__envelope__pack(env, buf);
  return buf;
}

/* Appends an unknown field (number 1000 + k) of a random wire type. */
static size_t put_unknown(uint8_t *p, unsigned k) {
  uint32_t num = 1000 + k;
  size_t n = 0, i, len;

  switch (rnd() % 3) {
  case 0: /* varint */
    p[n++] = (uint8_t)(((num << 3) | 0) | 0x80);
    p[n++] = (uint8_t)(num >> 4);
    p[n++] = 0x96;
    p[n++] = 0x01;
    break;
  case 1: /* fixed32 */
    p[n++] = (uint8_t)(((num << 3) | 5) | 0x80);
    p[n++] = (uint8_t)(num >> 4);
    for (i = 0; i < 4; i++)
      p[n++] = (uint8_t)rnd();
    break;
  default: /* length-delimited */
    p[n++] = (uint8_t)(((num << 3) | 2) | 0x80);
    p[n++] = (uint8_t)(num >> 4);
    len = rnd() % 100;
    p[n++] = (uint8_t)len;
    for (i = 0; i < len; i++)
      p[n++] = (uint8_t)rnd();
    break;
  }
  return n;
}

/* Decodes payload with both decoders and the charging allocator; checks the
 * scan's bound against what was charged.  Returns the charge. */
static size_t check_bound(const uint8_t *payload, size_t len, uint64_t seq) {
  struct charge ch = {0};
  ProtobufCAllocator a = {charge_alloc, charge_free, &ch};
  kvs__arena arena = KVS__ARENA_INIT;
  kvs_payload_scan scan, ascan;
  Kvshare__Envelope *env, *aenv;

  if (kvs_envelope_scan(payload, len, &scan) != 0) {
    Kvshare__Envelope *e = kvshare__envelope__unpack(NULL, len, payload);
    fail_msg("scan refused %zu bytes; protobuf-c %s", len, e ? "decodes" : "refuses");
  }
  assert_int_equal(scan.seq, seq);
  env = kvshare__envelope__unpack(&a, len, payload);
  assert_non_null(env);
  if (ch.charged > scan.alloc_bound)
    fail_msg("the decode charged %zu, over the scan's bound %zu (%zu bytes)",
             ch.charged, scan.alloc_bound, len);
  /* Tight: the bound counts every scanned-member slab, and may put a
   * packed run's elements at 8 bytes where they take 4. */
  if (scan.alloc_bound > 2 * ch.charged + 4096)
    fail_msg("the bound %zu is far over the charge %zu", scan.alloc_bound,
             ch.charged);
  protobuf_c_message_free_unpacked(&env->base, &a);
  /* The arena charges the same allocations the same way. */
  assert_int_equal(kvs__arena_unpack(&arena, payload, len, 0, &ascan, &aenv),
                   0);
  assert_int_equal(ascan.alloc_bound, scan.alloc_bound);
  assert_int_equal(arena.total, ch.charged);
  kvs__arena_destroy(&arena);
  return ch.charged;
}

static void test_bound_random(void **state) {
  int it;

  (void)state;
  for (it = 0; it < 3000; it++) {
    Kvshare__Envelope env;
    uint8_t *buf;
    size_t len;
    unsigned k, nunk = (unsigned)(rnd() % 4);

    kvshare__envelope__init(&env);
    env.seq = rnd_mag(64);
    if (rnd() & 1) {
      env.body_case = KVSHARE__ENVELOPE__BODY_REQUEST;
      env.request = rnd_op(1);
    } else {
      env.body_case = KVSHARE__ENVELOPE__BODY_RESPONSE;
      env.response = rnd_reply(1);
    }
    buf = pack(&env, nunk * 200, &len);
    for (k = 0; k < nunk; k++) /* unknown fields at the top level */
      len += put_unknown(buf + len, k);
    check_bound(buf, len, env.seq);
    free(buf);
    drop_all();
  }
}

/* --- the limits --------------------------------------------------------- */

/* Request { Batch { n copies of op } } with seq; the frame's payload. */
static uint8_t *batch_of(Kvshare__Request *op, size_t n, size_t *len) {
  Kvshare__Envelope env;
  Kvshare__Request req;
  Kvshare__Batch b;
  Kvshare__Request **ops = malloc(n * sizeof(*ops));
  uint8_t *buf;
  size_t i;

  assert_non_null(ops);
  for (i = 0; i < n; i++)
    ops[i] = op;
  kvshare__envelope__init(&env);
  kvshare__request__init(&req);
  kvshare__batch__init(&b);
  b.n_ops = n;
  b.ops = ops;
  req.op_case = KVSHARE__REQUEST__OP_BATCH;
  req.batch = &b;
  env.seq = 7;
  env.body_case = KVSHARE__ENVELOPE__BODY_REQUEST;
  env.request = &req;
  buf = pack(&env, 0, len);
  free(ops);
  return buf;
}

/* Decodes under the receiver's limit with both decoders; returns the
 * scan's bound per wire byte. */
static double decodes(const uint8_t *p, size_t len, size_t limit,
                      const char *what) {
  kvs__arena arena = KVS__ARENA_INIT;
  kvs_payload_scan scan;
  Kvshare__Envelope *env;
  int rc;

  rc = kvs__arena_unpack(&arena, p, len, limit, &scan, &env);
  if (rc != 0)
    fail_msg("%s (%zu bytes, bound %zu, limit %zu): %s", what, len,
             scan.alloc_bound, limit, kvs_status_name(rc));
  assert_int_equal(env->seq, 7);
  kvs__arena_destroy(&arena);
  assert_int_equal(kvs_envelope_unpack(p, len, limit, &env), 0);
  kvs_envelope_free(env);
  return (double)scan.alloc_bound / (double)len;
}

static void test_largest_batches_decode(void **state) {
  Kvshare__Request op;
  Kvshare__Ping ping;
  Kvshare__Free fr;
  Kvshare__Commit cm;
  Kvshare__Stats st;
  uint32_t *tokens;
  uint8_t *p;
  size_t len, n, i;
  double worst = 0, r;

  (void)state;
  /* max_batch_ops of the smallest ops: an empty op (no member set) and an
   * empty Ping: 2 and 4 bytes on the wire. */
  kvshare__request__init(&op);
  p = batch_of(&op, OPS, &len);
  r = decodes(p, len, KVS_UNPACK_LIMIT(len, OPS), "empty ops");
  worst = r > worst ? r : worst;
  free(p);
  kvshare__ping__init(&ping);
  op.op_case = KVSHARE__REQUEST__OP_PING;
  op.ping = &ping;
  p = batch_of(&op, OPS, &len);
  r = decodes(p, len, KVS_UNPACK_LIMIT(len, OPS), "empty pings");
  worst = r > worst ? r : worst;
  free(p);
  kvshare__free__init(&fr);
  fr.req_id = UINT64_MAX;
  op.op_case = KVSHARE__REQUEST__OP_FREE;
  op.free = &fr;
  p = batch_of(&op, OPS, &len);
  decodes(p, len, KVS_UNPACK_LIMIT(len, OPS), "frees");
  free(p);
  kvshare__stats__init(&st);
  st.check = 1;
  op.op_case = KVSHARE__REQUEST__OP_STATS;
  op.stats = &st;
  p = batch_of(&op, OPS, &len);
  decodes(p, len, KVS_UNPACK_LIMIT(len, OPS), "stats");
  free(p);
  print_message("a batch of %u empty ops: %.1f bytes decoded per wire "
                "byte at most\n", OPS, worst);

  /* max_batch_ops of the largest op filling max_frame: Commits of tokens
   * and block ids, the tokens 1-byte varints (4 bytes decoded each). */
  n = (KVS_FRAME_MAX_DEFAULT - 64) / OPS / 2 - 16;
  tokens = calloc(n, sizeof(*tokens));
  assert_non_null(tokens);
  for (i = 0; i < n; i++)
    tokens[i] = (uint32_t)(i & 0x7f);
  kvshare__commit__init(&cm);
  cm.req_id = UINT64_MAX;
  cm.start = UINT32_MAX;
  cm.n_tokens = n;
  cm.tokens = tokens;
  cm.n_blocks = n;
  cm.blocks = tokens;
  op.op_case = KVSHARE__REQUEST__OP_COMMIT;
  op.commit = &cm;
  p = batch_of(&op, OPS, &len);
  assert_true(len <= KVS_FRAME_MAX_DEFAULT);
  assert_true(len > KVS_FRAME_MAX_DEFAULT - KVS_FRAME_MAX_DEFAULT / 64);
  decodes(p, len, KVS_UNPACK_LIMIT(len, OPS), "commits filling max_frame");
  free(p);
  /* One op of max_frame bytes. */
  free(tokens);
  n = KVS_FRAME_MAX_DEFAULT - 64;
  tokens = calloc(n, sizeof(*tokens));
  assert_non_null(tokens);
  cm.n_tokens = n;
  cm.tokens = tokens;
  cm.n_blocks = 0;
  p = batch_of(&op, 1, &len);
  assert_true(len <= KVS_FRAME_MAX_DEFAULT);
  decodes(p, len, KVS_UNPACK_LIMIT(len, OPS), "one commit of max_frame");
  free(p);
  free(tokens);
}

/* The reply to the largest batch decodes under the client's limit: every
 * op failing with a full-length message, or returning a LookupResult. */
static void test_largest_replies_decode(void **state) {
  Kvshare__Envelope env;
  Kvshare__Response top, one, **replies;
  Kvshare__BatchResult b;
  Kvshare__Status st;
  Kvshare__LookupResult lr;
  uint32_t blocks[4] = {1, 2, 3, 4};
  char msg[256];
  uint8_t *p;
  size_t len, i;

  (void)state;
  memset(msg, 'm', 255);
  msg[255] = '\0';
  replies = malloc(OPS * sizeof(*replies));
  assert_non_null(replies);
  for (i = 0; i < OPS; i++)
    replies[i] = &one;
  kvshare__status__init(&st);
  st.code = -4001;
  st.message = msg;
  kvshare__lookup_result__init(&lr);
  lr.n_blocks = 4;
  lr.blocks = blocks;
  kvshare__response__init(&one);
  one.status = &st;
  kvshare__batch_result__init(&b);
  b.n_replies = OPS;
  b.replies = replies;
  kvshare__response__init(&top);
  top.result_case = KVSHARE__RESPONSE__RESULT_BATCH;
  top.batch = &b;
  kvshare__envelope__init(&env);
  env.seq = 7;
  env.body_case = KVSHARE__ENVELOPE__BODY_RESPONSE;
  env.response = &top;
  p = pack(&env, 0, &len);
  decodes(p, len, KVS_UNPACK_LIMIT(len, OPS), "errors with messages");
  free(p);
  /* Short messages, each with a result: the most messages per byte. */
  st.message = (char *)"";
  one.result_case = KVSHARE__RESPONSE__RESULT_LOOKUP;
  one.lookup = &lr;
  p = pack(&env, 0, &len);
  decodes(p, len, KVS_UNPACK_LIMIT(len, OPS), "lookup results");
  free(p);
  free(replies);
}

/* A payload past the limit is refused before the decode, its seq read; a
 * malformed one reports the seq it saw before the fault. */
static void test_refused_early(void **state) {
  size_t n = 1u << 20, len = 0, i;
  uint8_t *p = malloc(2 * n + 16);
  kvs__arena arena = KVS__ARENA_INIT;
  kvs_payload_scan scan;
  Kvshare__Envelope *env = NULL;

  (void)state;
  assert_non_null(p);
  p[len++] = 0x08; /* seq = 300 */
  p[len++] = 0xac;
  p[len++] = 0x02;
  for (i = 0; i < n; i++) { /* request {} a million times: merged */
    p[len++] = (4 << 3) | 2;
    p[len++] = 0;
  }
  assert_int_equal(kvs_envelope_scan(p, len, &scan), 0);
  assert_int_equal(scan.seq, 300);
  assert_int_equal(scan.messages, n + 1);
  assert_true(scan.alloc_bound > KVS_UNPACK_LIMIT(len, OPS));
  assert_int_equal(kvs__arena_unpack(&arena, p, len, 0, &scan, &env),
                   KVS_ELIMIT);
  assert_null(env);
  assert_int_equal(scan.seq, 300);
  assert_null(arena.head); /* nothing was allocated */
  assert_int_equal(kvs_envelope_unpack(p, len, 0, &env), KVS_ELIMIT);
  assert_null(env);
  /* Cut in the middle of a field: malformed, the seq still known. */
  assert_int_equal(kvs__arena_unpack(&arena, p, 4, 0, &scan, &env),
                   KVS_EPROTO);
  assert_int_equal(scan.seq, 300);
  kvs__arena_destroy(&arena);
  free(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bound_random),
      cmocka_unit_test(test_largest_batches_decode),
      cmocka_unit_test(test_largest_replies_decode),
      cmocka_unit_test(test_refused_early),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
