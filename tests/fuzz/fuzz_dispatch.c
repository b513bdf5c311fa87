/*
 * fuzz_dispatch.c — the daemon's input path without a socket: bytes ->
 * kvs_frame_parse -> the codecs (kvs_env_decode, kvs_compact_decode_request)
 * -> disp_run against an in-process core -> the reply encoded as session.c
 * encodes it (kvs_reply_size, kvs_reply_encode).  A libFuzzer target
 * (LLVMFuzzerTestOneInput; `make fuzz`), also driven by test_fuzz_dispatch.c
 * with deterministic inputs in `make test`.
 *
 * What every frame is checked against:
 * - the arena decoder and protobuf-c's own decoder agree on what decodes;
 * - the reply is within kvs_reply_bound (known before the ops ran), and a
 *   reply over max_frame comes only from ops that change nothing;
 * - an Envelope reply is exactly protobuf-c's packing of the message it
 *   decodes to (the hand encoder sizes each message once);
 * - the client's codec reads the reply back (kvs_reply_decode, the same
 *   shape and ops) into exactly the results dispatch made: statuses,
 *   messages (the first KVS_BATCH_MESSAGES failures of a batch only),
 *   every result field, every block id;
 * - the ops, encoded again by the client's codec in the same shape
 *   (kvs_request_size, kvs_request_encode) and decoded again, are the same
 *   ops;
 * - the pool invariant and each session's token charges hold.
 *
 * An input is one of:
 *   byte 0 = 0 mod 4: chunks [u8 session][u16 length LE][payload], each
 *                payload framed with a valid header (two sessions, to
 *                check that neither can reach the other's requests; the
 *                session byte's top bit marks the payload compact);
 *   byte 0 = 2 mod 4: ring requests [u8 session][u16 length LE][bytes]:
 *                what a client posts on its request ring, the length it
 *                claims and the bytes in the request area, taken as
 *                net/session.c takes them (over the area, or not exactly
 *                one whole frame: a protocol error, and the session
 *                reads nothing more);
 *   byte 0 odd:  a raw byte stream for session 0, framed or not.
 * At the end of the input both sessions are closed (their requests freed,
 * as on a disconnect) and every block must be back.  Any violation aborts.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/dispatch/dispatch.h"
#include "daemon/log.h"
#include "daemon/tiers/tiers_int.h"
#include "kvs_codec.h"
#include "kvs_compact.h"
#include "kvs_frame.h"
#include "tests/fuzz/fuzz_target.h"

#define NSESS 2

static cfg fz_cfg;
static unsigned long n_frames, n_undecodable, n_too_big, n_requests, n_ok,
    n_err, n_compact, n_compact_refused, n_ring, n_ring_refused;
static unsigned long n_by_op[16], n_copies;
static disp_env fz_env;
static disp_counts fz_counts;
static copy_engine fz_copy; /* never runs: the copies are only counted */
static backend fz_pool;     /* what Stats reports; no memory behind it */
static disp_sess fz_sess[NSESS];

static void die(const char *what, const char *detail) {
  fprintf(stderr, "fuzz_dispatch: %s%s%s\n", what, detail ? ": " : "",
          detail ? detail : "");
  abort();
}

/* No tier here (the env's tiers is NULL): tiers.c's front runs with none
 * and never reaches the movers.  These stand in for them at link time. */
int local_open(uv_loop_t *loop, const cfg *c, core *cr, backend *pool,
               copy_engine *copy, local **out, char *err, size_t err_len) {
  (void)loop, (void)c, (void)cr, (void)pool, (void)copy, (void)err,
      (void)err_len;
  *out = NULL;
  return 0;
}
int local_slots(const cfg *c, const kvs_layout *l, const backend *pool,
                uint32_t slots[CORE_TIERS], char *err, size_t err_len) {
  (void)c, (void)l, (void)pool, (void)err, (void)err_len;
  slots[0] = slots[1] = 0;
  return 0;
}
#define NOT_HERE(what) die(what " without tiers", NULL)
uint32_t local_promote_room(const local *t) {
  (void)t;
  NOT_HERE("local_promote_room");
  return 0;
}
int local_promote(local *t, tier_promo *pr, const core_promo *p, uint32_t n) {
  (void)t, (void)pr, (void)p, (void)n;
  NOT_HERE("local_promote");
  return 0;
}
int local_swap_out(local *t, tier_swap *sw, const core_move *mv, uint32_t n) {
  (void)t, (void)sw, (void)mv, (void)n;
  NOT_HERE("local_swap_out");
  return 0;
}
int local_swap_in(local *t, tier_swap *sw, const core_promo *p, uint32_t n) {
  (void)t, (void)sw, (void)p, (void)n;
  NOT_HERE("local_swap_in");
  return 0;
}
void local_set_idle_cb(local *t, void (*cb)(void *), void *data) {
  (void)t, (void)cb, (void)data;
}
void local_kick(local *t) { (void)t; }
void local_stop(local *t) { (void)t; }
void local_abandon(local *t) { (void)t; }
int local_idle(const local *t) { return t == NULL; }
void local_close(local *t) { (void)t; }
void local_get_stats(const local *t, tiers_stats st[CORE_TIERS],
                     uint32_t *n) {
  (void)t, (void)st;
  *n = 0;
}
void local_get_hists(const local *t, tier_hist h[TIER_HISTS]) {
  (void)t, (void)h;
}
int remote_open(uv_loop_t *loop, const cfg *c, core *cr, backend *pool,
                copy_engine *copy, remote **out, char *err, size_t err_len) {
  (void)loop, (void)c, (void)cr, (void)pool, (void)copy, (void)err,
      (void)err_len;
  *out = NULL;
  return 0;
}
int remote_promote(remote *m, tier_promo *pr, void (*done)(tier_promo *pr)) {
  (void)m, (void)pr, (void)done;
  NOT_HERE("remote_promote");
  return 1;
}
void remote_set_idle_cb(remote *m, void (*cb)(void *), void *data) {
  (void)m, (void)cb, (void)data;
}
void remote_stop(remote *m) { (void)m; }
int remote_idle(const remote *m) { return m == NULL; }
void remote_close(remote *m) { (void)m; }
void remote_tier_stats(const remote *m, tiers_stats *st) {
  (void)m, (void)st;
  NOT_HERE("remote_tier_stats");
}
void remote_get_stats(const remote *m, tier_remote_stats *st) {
  (void)m, (void)st;
  NOT_HERE("remote_get_stats");
}

static void on_held(disp_sess *ds) {
  (void)ds;
  die("an op held its answer without tiers", NULL);
}

static void setup(void) {
  static const char *opts[][2] = {
      {"pool_blocks", "48"},  {"block_size", "4"},     {"num_layers", "1"},
      {"num_kv_heads", "1"},  {"head_dim", "8"},       {"max_requests", "6"},
      {"max_batch_ops", "20"}, {"reserve_blocks", "2"}, {"max_frame", "64K"},
      {"max_session_tokens", "300"}, {"ring_bytes", "16K"},
      {"socket", "/nonexistent/fuzz.sock"}};
  core_config cc;
  char err[256];
  size_t i;

  cfg_init(&fz_cfg);
  for (i = 0; i < sizeof(opts) / sizeof(opts[0]); i++)
    if (cfg_set(&fz_cfg, opts[i][0], opts[i][1], err, sizeof(err)) < 0)
      die("config", err);
  if (cfg_finish(&fz_cfg, err, sizeof(err)) < 0)
    die("config", err);
  log_level_cur = getenv("FUZZ_LOG") ? LOG_DEBUG : -1;
  memset(&fz_env, 0, sizeof(fz_env));
  fz_env.cfg = &fz_cfg;
  fz_env.layout = fz_cfg.layout;
  core_config_init(&cc);
  cc.num_blocks = fz_env.layout.num_blocks;
  cc.block_size = fz_env.layout.block_size;
  cc.reserve_blocks = fz_cfg.reserve_blocks;
  cc.root = core_root_hash(&fz_env.layout, fz_cfg.model_id);
  if (core_create(&cc, &fz_env.core) < 0)
    die("core_create", NULL);
  fz_pool.layout = fz_env.layout;
  fz_pool.ex.backend = "host";
  fz_pool.ex.gpu_uuid = "";
  fz_pool.ex.size = kvs_pool_bytes(&fz_env.layout);
  fz_env.pool = &fz_pool;
  fz_env.copy = &fz_copy;
  fz_env.counts = &fz_counts;
  fz_counts.sessions = NSESS;
  for (i = 0; i < NSESS; i++)
    disp_sess_init(&fz_sess[i], &fz_env, on_held, NULL);
}

static void check_pool(const char *when) {
  char msg[512];
  size_t k, i;

  /* Each session's token charge is the sum over its requests of
   * max(known, slots), and each request's recorded cost is its own. */
  for (k = 0; k < NSESS; k++) {
    const reqmap *m = &fz_sess[k].reqs;
    uint64_t sum = 0;

    for (i = 0; i < m->cap; i++) {
      const core_req *r = m->slots[i].req;
      uint64_t want;

      if (!r)
        continue;
      want = core_req_num_known(r) > core_req_num_slots(r)
                 ? core_req_num_known(r)
                 : core_req_num_slots(r);
      if (m->slots[i].cost != want)
        die("a request's token charge is off", when);
      sum += want;
    }
    if (sum != fz_sess[k].tokens_held)
      die("a session's token charge is off", when);
    if (sum > fz_cfg.max_session_tokens)
      die("a session is over max_session_tokens", when);
  }
  if (core_check(fz_env.core, msg, sizeof(msg)) < 0) {
    fprintf(stderr, "fuzz_dispatch: %s\n", when);
    die("pool invariant", msg);
  }
}

static kvs__arena arena = KVS__ARENA_INIT, back_arena = KVS__ARENA_INIT;

static int same_str(const char *a, const char *b) {
  return strcmp(a ? a : "", b ? b : "") == 0;
}

static int same_u32s(const uint32_t *a, const uint32_t *b, uint32_t n) {
  return n == 0 || memcmp(a, b, (size_t)n * 4) == 0;
}

/* Does the client's reading of op code's result (b) say what dispatch's
 * (a) did?  compact: records, which carry no promoted_tokens. */
static int same_result(unsigned code, const kvs_op_result *a,
                       const kvs_op_result *b, int records) {
  if (a->status != b->status)
    return 0;
  if (a->status) /* the first failures of a batch: their messages */
    return same_str(a->message, b->message);
  switch (code) {
  case KVS_OP_LOOKUP:
    return a->u.lookup.hit_tokens == b->u.lookup.hit_tokens &&
           a->u.lookup.below_tokens == b->u.lookup.below_tokens &&
           (records ||
            a->u.lookup.promoted_tokens == b->u.lookup.promoted_tokens) &&
           a->nblocks == b->nblocks && same_u32s(a->blocks, b->blocks,
                                                 a->nblocks);
  case KVS_OP_ALLOCATE:
  case KVS_OP_APPEND:
    return a->u.alloc.first_index == b->u.alloc.first_index &&
           a->u.alloc.has_cow == b->u.alloc.has_cow &&
           a->u.alloc.cow_src == b->u.alloc.cow_src &&
           a->u.alloc.cow_dst == b->u.alloc.cow_dst &&
           a->u.alloc.cow_index == b->u.alloc.cow_index &&
           a->u.alloc.cow_copied == b->u.alloc.cow_copied &&
           a->nblocks == b->nblocks && same_u32s(a->blocks, b->blocks,
                                                 a->nblocks);
  case KVS_OP_COMMIT:
    return a->u.commit.sealed == b->u.commit.sealed;
  case KVS_OP_PING:
    return a->u.pong.len == b->u.pong.len &&
           (a->u.pong.len == 0 ||
            memcmp(a->u.pong.data, b->u.pong.data, a->u.pong.len) == 0);
  case KVS_OP_STATS:
    return b->u.stats && a->u.stats->num_blocks == b->u.stats->num_blocks &&
           a->u.stats->used_blocks == b->u.stats->used_blocks &&
           a->u.stats->frames_in == b->u.stats->frames_in &&
           a->u.stats->check == b->u.stats->check &&
           same_str(a->u.stats->check_message, b->u.stats->check_message) &&
           same_str(a->u.stats->backend, b->u.stats->backend);
  default:
    return 1;
  }
}

/* Are two decodes of the same ops the same ops? */
static int same_op(const kvs_op *a, const kvs_op *b) {
  return a->code == b->code && a->flags == b->flags &&
         a->req_id == b->req_id && a->child_id == b->child_id &&
         a->num_tokens == b->num_tokens && a->start == b->start &&
         a->ntokens == b->ntokens && a->nblocks == b->nblocks &&
         a->nbytes == b->nbytes &&
         same_u32s(a->tokens, b->tokens, a->ntokens) &&
         same_u32s(a->blocks, b->blocks, a->nblocks) &&
         (a->nbytes == 0 || memcmp(a->bytes, b->bytes, a->nbytes) == 0);
}

/* The ops of call, encoded again by the client's codec in the same shape
 * and decoded again by the daemon's, are the same ops.  (Only calls whose
 * every op read cleanly: a refused op has no wire form to give back.) */
static void check_request_round_trip(const kvs_call *call) {
  kvs_request rq;
  kvs_call again;
  kvs_hello hello;
  uint8_t *buf;
  size_t len;
  int rc;

  for (uint32_t i = 0; i < call->nops; i++)
    if (call->ops[i].code == KVS_OP_NONE)
      return;
  if (call->status)
    return;
  len = kvs_request_size(&rq, call, &back_arena);
  if (len == 0)
    die("the client's codec cannot encode ops the daemon's decoded", NULL);
  buf = malloc(len);
  if (!buf)
    die("out of memory", NULL);
  kvs_request_encode(&rq, buf);
  if (kvs_shape_is_compact(call->shape))
    rc = kvs_compact_decode_request(buf + KVS_FRAME_HEADER_SIZE,
                                    len - KVS_FRAME_HEADER_SIZE,
                                    fz_cfg.max_batch_ops, &back_arena, &again);
  else
    rc = kvs_env_decode(buf + KVS_FRAME_HEADER_SIZE,
                        len - KVS_FRAME_HEADER_SIZE, fz_cfg.max_batch_ops,
                        &back_arena, &again, &hello) == KVS_ENV_REQUEST
             ? 0
             : -1;
  if (rc != 0 || again.shape != call->shape || again.nops != call->nops ||
      again.seq != call->seq || again.status)
    die("ops encoded again do not decode to the same call", NULL);
  for (uint32_t i = 0; i < call->nops; i++)
    if (!same_op(&call->ops[i], &again.ops[i]))
      die("ops encoded again do not decode to the same ops", NULL);
  free(buf);
}

/* The reply to call as session.c writes it; then checked (see the top). */
static void reply(kvs_call *call, int mutates) {
  const kvs_layout *l = &fz_env.layout;
  int m2, records = call->shape != KVS_SHAPE_OP &&
                    call->shape != KVS_SHAPE_BATCH;
  size_t bound = kvs_reply_bound(call, l->block_size, l->num_blocks, &m2);
  kvs_reply rep;
  kvs_call back;
  uint8_t *buf;
  size_t len, failed = 0;
  int rc;

  for (uint32_t i = 0; i < call->nops; i++) {
    const kvs_op_result *r = &call->res[i];

    if (r->status > 0)
      die("a positive status code", NULL);
    if (kvs_shape_is_batch(call->shape) && r->status &&
        (++failed <= KVS_BATCH_MESSAGES ? !r->message || !r->message[0]
                                        : r->message && r->message[0]))
      die("a batch's failures carry a message, the first ones only", NULL);
    if (!kvs_shape_is_batch(call->shape) && r->status &&
        (!r->message || !r->message[0]))
      die("an error without a message", kvs_status_name(r->status));
  }
  len = kvs_reply_size(&rep, call, &arena);
  if (len == 0)
    die("a reply that cannot be sized", NULL);
  /* The reply is within the bound known before the ops ran (which
   * session.c keeps under max_frame). */
  if (len > bound)
    die("a reply over kvs_reply_bound", NULL);
  if (len - KVS_FRAME_HEADER_SIZE > fz_cfg.max_frame) {
    if (mutates)
      die("a reply over max_frame after a request that changed things",
          NULL);
    return; /* session.c answers ETOOBIG */
  }
  buf = malloc(len + 8); /* (malloc: aligned, as the daemon's buffers) */
  if (!buf)
    die("out of memory", NULL);
  kvs_reply_encode(&rep, buf);
  if (!kvs_shape_is_compact(call->shape)) {
    /* The daemon's encoder must give exactly protobuf-c's bytes. */
    Kvshare__Envelope *env = NULL;
    uint8_t *packed;
    size_t plen;

    if (kvs_envelope_unpack(buf + KVS_FRAME_HEADER_SIZE,
                            len - KVS_FRAME_HEADER_SIZE, 0, &env) < 0)
      die("the daemon's reply does not decode", NULL);
    if (kvs_frame_pack(env, UINT32_MAX, &packed, &plen) < 0)
      die("packing a reply", NULL);
    if (plen != len || memcmp(packed, buf, len) != 0)
      die("the reply encoder differs from protobuf-c's packing", NULL);
    free(packed);
    kvs_envelope_free(env);
  }
  /* The client reads back what dispatch answered. */
  back = *call;
  back.res = kvs__arena_alloc(&back_arena, (call->nops ? call->nops : 1) *
                                               sizeof(kvs_op_result));
  if (!back.res)
    die("out of memory", NULL);
  rc = kvs_reply_decode(&back, buf, len, fz_cfg.max_batch_ops, &back_arena);
  if (rc != 0)
    die("the client cannot read the daemon's reply", kvs_status_name(rc));
  if (call->shape == KVS_SHAPE_OP || call->shape == KVS_SHAPE_COMPACT_OP) {
    /* one op: a refusal reads as the op's failure */
    kvs_op_result want;

    memset(&want, 0, sizeof(want));
    if (call->status) {
      want.status = call->status;
      want.message = call->message;
    } else {
      want = call->res[0];
    }
    if (back.status != want.status ||
        !same_result(call->nops ? call->ops[0].code : 0, &want, &back.res[0],
                     records))
      die("the client reads another result than dispatch made",
          call->nops ? kvs_op_name(call->ops[0].code) : "(refused)");
  } else {
    if (back.status != call->status ||
        (back.status && !same_str(back.message, call->message)))
      die("the client reads another refusal", NULL);
    if (!call->status)
      for (uint32_t i = 0; i < call->nops; i++)
        if (!same_result(call->ops[i].code, &call->res[i], &back.res[i],
                         records))
          die("the client reads another result than dispatch made",
              kvs_op_name(call->ops[i].code));
  }
  free(buf);
}

/* One call, as session.c's run_call takes it. */
static void run(disp_sess *ds, kvs_call *call) {
  const kvs_layout *l = &fz_env.layout;
  int mutates;
  size_t bound = kvs_reply_bound(call, l->block_size, l->num_blocks,
                                 &mutates);

  check_request_round_trip(call);
  if (call->status == 0 && mutates &&
      bound - KVS_FRAME_HEADER_SIZE > fz_cfg.max_frame) {
    n_too_big++; /* session.c answers ETOOBIG, none of it run */
    return;
  }
  if (call->status == 0 &&
      disp_run(ds, call->ops, call->res, call->nops,
               kvs_shape_is_batch(call->shape), &arena) != DISP_DONE)
    die("an op held its answer without tiers", NULL);
  n_requests++;
  for (uint32_t i = 0; i < call->nops; i++) {
    n_by_op[call->ops[i].code & 15]++;
    if (call->res[i].status == 0)
      n_ok++;
    else
      n_err++;
  }
  reply(call, mutates);
  check_pool("while the frame's copies are pinned");
  n_copies += ds->ncopy;
  disp_copies_done(ds); /* as the copy engine would, later */
  check_pool("after a request");
}

static void one_frame(disp_sess *ds, const uint8_t *payload, size_t len) {
  Kvshare__Envelope *env = NULL, *ref = NULL;
  kvs_hello hello;
  kvs_call call;
  int rc;

  fz_counts.frames_in++;
  n_frames++;
  /* The arena decoder and the malloc one agree on what decodes, and why
   * not: they charge every allocation alike (kvs__unpack_cost). */
  rc = kvs__arena_unpack(&back_arena, payload, len, 0, NULL, &env);
  if (kvs_envelope_unpack(payload, len, 0, &ref) != rc)
    die("kvs__arena_unpack and kvs_envelope_unpack disagree", NULL);
  kvs_envelope_free(ref);
  switch (kvs_env_decode(payload, len, fz_cfg.max_batch_ops, &arena, &call,
                         &hello)) {
  case KVS_ENV_BAD:
    n_undecodable++; /* EPROTO or ELIMIT, the connection goes on */
    if (call.status >= 0 || !call.message || !call.message[0])
      die("an undecodable frame without its status and message", NULL);
    reply(&call, 0);
    break;
  case KVS_ENV_REQUEST:
    run(ds, &call);
    break;
  default:
    break;
  }
  kvs__arena_reset(&arena);
  kvs__arena_reset(&back_arena);
}

/* A compact frame, as session.c takes it. */
static void one_compact(disp_sess *ds, const uint8_t *payload, size_t len) {
  kvs_call call;
  int rc;

  fz_counts.frames_in++;
  fz_counts.compact_frames++;
  n_frames++;
  n_compact++;
  rc = kvs_compact_decode_request(payload, len, fz_cfg.max_batch_ops, &arena,
                                  &call);
  if (rc < 0) {
    n_compact_refused++;
    if (call.status != rc || !call.message || !call.message[0])
      die("a compact refusal without its status and message", NULL);
    reply(&call, 0);
  } else {
    run(ds, &call);
  }
  kvs__arena_reset(&arena);
  kvs__arena_reset(&back_arena);
}

/* The session's read buffer: whole frames are handled, a bad header or a
 * cut frame ends the connection. */
/* A ring request as net/session.c's ring_frame takes it: 0 when it ends
 * the session (the daemon answers a protocol error and closes). */
static int ring_request(disp_sess *ds, const uint8_t *p, size_t len) {
  size_t flen = 0;

  n_ring++;
  if (len > fz_cfg.ring_bytes ||
      kvs_frame_parse(p, len, (uint32_t)fz_cfg.max_frame, &flen) != 1 ||
      flen != len) {
    n_ring_refused++;
    return 0;
  }
  if (kvs_frame_flags(p) & KVS_FRAME_COMPACT)
    one_compact(ds, p + KVS_FRAME_HEADER_SIZE, len - KVS_FRAME_HEADER_SIZE);
  else
    one_frame(ds, p + KVS_FRAME_HEADER_SIZE, len - KVS_FRAME_HEADER_SIZE);
  return 1;
}

static void stream(disp_sess *ds, const uint8_t *p, size_t n) {
  uint32_t max = (uint32_t)fz_cfg.max_frame;
  size_t flen;

  while (n) {
    int rc = kvs_frame_parse(p, n, max, &flen);

    if (rc <= 0)
      return;
    if (kvs_frame_flags(p) & KVS_FRAME_COMPACT)
      one_compact(ds, p + KVS_FRAME_HEADER_SIZE,
                  flen - KVS_FRAME_HEADER_SIZE);
    else
      one_frame(ds, p + KVS_FRAME_HEADER_SIZE, flen - KVS_FRAME_HEADER_SIZE);
    p += flen;
    n -= flen;
  }
}

void fuzz_dispatch_report(FILE *out) {
  core_stats st;
  unsigned i;

  core_get_stats(fz_env.core, &st);
  fprintf(out, "%lu frames (%lu compact, %lu of them refused), %lu "
          "undecodable, %lu with a reply too big to run, %lu requests; ops "
          "%lu ok, %lu errors; by op:", n_frames, n_compact,
          n_compact_refused, n_undecodable, n_too_big, n_requests, n_ok,
          n_err);
  for (i = 0; i < 16; i++)
    if (n_by_op[i])
      fprintf(out, " %u:%lu", i, n_by_op[i]);
  fprintf(out, "\n%lu ring requests (%lu refused), %lu daemon copies\n",
          n_ring, n_ring_refused, n_copies);
  fprintf(out, "core: %llu lookups, %llu hit blocks, %llu allocated, %llu "
          "evictions, %llu cow, %llu sealed, %llu duplicates, %llu no_space\n",
          (unsigned long long)st.lookups, (unsigned long long)st.hit_blocks,
          (unsigned long long)st.allocated_blocks,
          (unsigned long long)st.evictions, (unsigned long long)st.cow_copies,
          (unsigned long long)st.sealed_blocks,
          (unsigned long long)st.duplicate_blocks,
          (unsigned long long)st.no_space);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int ready;
  core_stats st;
  size_t i;

  if (!ready) {
    setup();
    ready = 1;
  }
  if (size == 0)
    return 0;
  if (data[0] & 1) {
    stream(&fz_sess[0], data + 1, size - 1);
  } else if (data[0] & 2) {
    size_t pos = 1;
    int open[NSESS] = {1, 1};

    while (size - pos >= 3) {
      unsigned k = (data[pos] & 0x7f) % NSESS;
      size_t len = (size_t)data[pos + 1] | (size_t)data[pos + 2] << 8;

      pos += 3;
      if (len > size - pos)
        len = size - pos;
      if (open[k])
        open[k] = ring_request(&fz_sess[k], data + pos, len);
      pos += len;
    }
  } else {
    size_t pos = 1;

    while (size - pos >= 3) {
      disp_sess *ds = &fz_sess[(data[pos] & 0x7f) % NSESS];
      uint16_t flags = data[pos] & 0x80 ? KVS_FRAME_COMPACT : 0;
      size_t len = (size_t)data[pos + 1] | (size_t)data[pos + 2] << 8;
      uint8_t *f;

      pos += 3;
      if (len > size - pos)
        len = size - pos;
      f = malloc(KVS_FRAME_HEADER_SIZE + len + 1);
      if (!f)
        die("out of memory", NULL);
      kvs_frame_header_encode_flags(f, (uint32_t)len, flags);
      if (len)
        memcpy(f + KVS_FRAME_HEADER_SIZE, data + pos, len);
      stream(ds, f, KVS_FRAME_HEADER_SIZE + len);
      free(f);
      pos += len;
    }
  }
  /* Both connections close: every request goes, every block comes back. */
  for (i = 0; i < NSESS; i++)
    disp_sess_free_requests(&fz_sess[i]);
  check_pool("after the sessions closed");
  core_get_stats(fz_env.core, &st);
  if (st.used_blocks || st.num_requests) {
    char msg[128];

    snprintf(msg, sizeof(msg), "%u blocks in use by %u requests",
             st.used_blocks, st.num_requests);
    die("blocks leaked after close", msg);
  }
  return 0;
}
