/*
 * fuzz_dispatch.c — the daemon's input path without a socket: bytes ->
 * kvs_frame_parse -> kvs_envelope_unpack -> disp_request against an
 * in-process core -> the reply encoded as session.c encodes it (sized once,
 * disp_reply_encode), compared byte for byte with protobuf-c's own packing
 * of the same envelope, then decoded again.  Requests are decoded into the
 * arena as the daemon does (kvs__arena_unpack).  A libFuzzer target (LLVMFuzzerTestOneInput; `make fuzz`), also
 * driven by test_fuzz_dispatch.c with deterministic inputs in `make test`.
 *
 * Compact frames (proto/kvs_compact.h) go through compact_parse, the same
 * dispatch, and compact_reply_encode; each reply is read back field by
 * field against the Response it came from, and must fit disp_reply_bound.
 *
 * An input is one of:
 *   byte 0 even: chunks [u8 session][u16 length LE][payload], each payload
 *                framed with a valid header (two sessions, to check that
 *                neither can reach the other's requests; the session
 *                byte's top bit marks the payload compact);
 *   byte 0 odd:  a raw byte stream for session 0, framed or not.
 * After every frame the pool invariant is checked; at the end of the input
 * both sessions are closed (their requests freed, as on a disconnect) and
 * every block must be back.  Any violation aborts.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/log.h"
#include "daemon/tiers/remote.h"
#include "daemon/net/server.h"
#include "kvs_packed.h"
#include "tests/fuzz/fuzz_target.h"

#define NSESS 2

static cfg fz_cfg;
static unsigned long n_frames, n_undecodable, n_too_big, n_requests, n_ok,
    n_err, n_compact, n_compact_refused;
static unsigned long n_by_op[16], n_copies;
static srv fz_srv;
static sess *fz_sess[NSESS];
static backend fz_pool; /* what Stats reports; no memory behind it */

/* The copies a frame asks for (disp_copy_pair) are "made" (unpinned) once
 * its reply is built, as the copy engine would later. */
static void finish_copies(sess *c) {
  n_copies += c->ncopy;
  disp_copies_done(c);
}

static void die(const char *what, const char *detail) {
  fprintf(stderr, "fuzz_dispatch: %s%s%s\n", what, detail ? ": " : "",
          detail ? detail : "");
  abort();
}

/* No tiers here (srv.tiers is NULL): dispatch never promotes, and Stats
 * lists no tier.  These stand in for tiers.c and session.c at link time. */
uint32_t tiers_promote_room(const tiers *t) {
  (void)t;
  die("tiers_promote_room without tiers", NULL);
  return 0;
}
int tiers_promote(tiers *t, tier_promo *pr, const core_promo *p, uint32_t n) {
  (void)t, (void)pr, (void)p, (void)n;
  die("tiers_promote without tiers", NULL);
  return 0;
}
void tiers_get_stats(const tiers *t, tiers_stats st[CORE_TIERS], uint32_t *n) {
  (void)t, (void)st;
  *n = 0;
}
void tiers_kick(tiers *t) { (void)t; }
/* (serve.c's, over the same stand-ins: no remote tier here either) */
void srv_tiers_stats(const srv *s, tiers_stats st[SRV_TIERS], uint32_t *n) {
  tiers_get_stats(s->tiers, st, n);
}
int rmoves_promote(rmoves *m, tier_promo *pr, void (*done)(tier_promo *pr)) {
  (void)m, (void)pr, (void)done;
  die("rmoves_promote without a remote tier", NULL);
  return 1;
}
void sess_promoted(tier_promo *pr) {
  (void)pr;
  die("sess_promoted without tiers", NULL);
}
int tiers_swap_out(tiers *t, tier_swap *sw, const core_move *mv, uint32_t n) {
  (void)t, (void)sw, (void)mv, (void)n;
  die("tiers_swap_out without tiers", NULL);
  return 0;
}
int tiers_swap_in(tiers *t, tier_swap *sw, const core_promo *p, uint32_t n) {
  (void)t, (void)sw, (void)p, (void)n;
  die("tiers_swap_in without tiers", NULL);
  return 0;
}
void sess_swapped(tier_swap *sw) {
  (void)sw;
  die("sess_swapped without tiers", NULL);
}

static void setup(void) {
  static const char *opts[][2] = {
      {"pool_blocks", "48"},  {"block_size", "4"},     {"num_layers", "1"},
      {"num_kv_heads", "1"},  {"head_dim", "8"},       {"max_requests", "6"},
      {"max_batch_ops", "20"}, {"reserve_blocks", "2"}, {"max_frame", "64K"},
      {"max_session_tokens", "300"},
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
  memset(&fz_srv, 0, sizeof(fz_srv));
  fz_srv.cfg = &fz_cfg;
  fz_srv.layout = fz_cfg.layout;
  core_config_init(&cc);
  cc.num_blocks = fz_srv.layout.num_blocks;
  cc.block_size = fz_srv.layout.block_size;
  cc.reserve_blocks = fz_cfg.reserve_blocks;
  cc.root = core_root_hash(&fz_srv.layout, fz_cfg.model_id);
  if (core_create(&cc, &fz_srv.core) < 0)
    die("core_create", NULL);
  for (i = 0; i < NSESS; i++) {
    fz_sess[i] = calloc(1, sizeof(sess));
    if (!fz_sess[i])
      die("out of memory", NULL);
    fz_sess[i]->srv = &fz_srv;
    fz_sess[i]->id = i + 1;
    fz_sess[i]->handshaken = 1;
    reqmap_init(&fz_sess[i]->reqs);
  }
  fz_srv.nsessions = NSESS;
  fz_pool.layout = fz_srv.layout;
  fz_pool.ex.backend = "host";
  fz_pool.ex.gpu_uuid = "";
  fz_pool.ex.size = kvs_pool_bytes(&fz_srv.layout);
  fz_srv.pool = &fz_pool;
}

static void check_pool(const char *when) {
  char msg[512];
  size_t k, i;

  /* Each session's token charge is the sum over its requests of
   * max(known, slots), and each request's recorded cost is its own. */
  for (k = 0; k < NSESS; k++) {
    const reqmap *m = &fz_sess[k]->reqs;
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
    if (sum != fz_sess[k]->tokens_held)
      die("a session's token charge is off", when);
    if (sum > fz_cfg.max_session_tokens)
      die("a session is over max_session_tokens", when);
  }

  if (core_check(fz_srv.core, msg, sizeof(msg)) < 0) {
    fprintf(stderr, "fuzz_dispatch: %s\n", when);
    die("pool invariant", msg);
  }
}

static kvs__arena arena = KVS__ARENA_INIT;

/* The reply as session.c builds it; then decoded again and checked. */
static void reply(const sess *c, const Kvshare__Request *req, uint64_t seq,
                  Kvshare__Response *resp) {
  Kvshare__Envelope env, *back = NULL;
  uint8_t *buf, *mine;
  disp_reply dr;
  size_t len, mylen;
  int rc, mutates;

  kvshare__envelope__init(&env);
  env.seq = seq;
  env.body_case = KVSHARE__ENVELOPE__BODY_RESPONSE;
  env.response = resp;
  if (!resp->status)
    die("a response without a status", NULL);
  if (resp->status->code > 0)
    die("a positive status code", NULL);
  if (resp->status->code < 0 &&
      (!resp->status->message || !resp->status->message[0]))
    die("an error without a message", kvs_status_name(resp->status->code));
  /* The reply is within the bound known before the request ran (which
   * session.c keeps under max_frame). */
  if (kvs_frame_size(&env) > disp_reply_bound(c, req, &mutates))
    die("a reply over disp_reply_bound", NULL);
  if (kvs_frame_size(&env) - KVS_FRAME_HEADER_SIZE > fz_cfg.max_frame) {
    if (mutates)
      die("a reply over max_frame after a request that changed things",
          NULL);
    return; /* session.c answers ETOOBIG */
  }
  if (req->op_case == KVSHARE__REQUEST__OP_BATCH && resp->status->code == 0) {
    size_t i, failed = 0;

    for (i = 0; i < resp->batch->n_replies; i++) {
      const Kvshare__Status *st = resp->batch->replies[i]->status;

      if (!st || st->code == 0)
        continue;
      if (++failed <= DISP_BATCH_MESSAGES ? !st->message || !st->message[0]
                                          : st->message && st->message[0])
        die("a batch's failures carry a message, the first ones only",
            NULL);
    }
  }
  rc = kvs_frame_pack(&env, (uint32_t)fz_cfg.max_frame, &buf, &len);
  if (rc < 0)
    die("packing a reply", kvs_status_name(rc));
  /* The daemon's encoder must give exactly protobuf-c's bytes. */
  mylen = disp_reply_size(&dr, &arena, seq, resp);
  mine = malloc(mylen);
  if (!mine)
    die("out of memory", NULL);
  disp_reply_encode(&dr, mine);
  if (mylen != len || memcmp(mine, buf, len) != 0)
    die("disp_reply_encode differs from protobuf-c's packing", NULL);
  free(mine);
  rc = kvs_envelope_unpack(buf + KVS_FRAME_HEADER_SIZE,
                           len - KVS_FRAME_HEADER_SIZE, 0, &back);
  if (rc < 0)
    die("the daemon's reply does not decode", NULL);
  if (back->seq != seq || back->body_case != KVSHARE__ENVELOPE__BODY_RESPONSE)
    die("reply seq or body", NULL);
  if (req->op_case == KVSHARE__REQUEST__OP_BATCH &&
      back->response->status->code == 0 &&
      (back->response->result_case != KVSHARE__RESPONSE__RESULT_BATCH ||
       back->response->batch->n_replies != req->batch->n_ops))
    die("a batch reply without one reply per op", NULL);
  if (req->op_case == KVSHARE__REQUEST__OP_PACKED_BATCH &&
      back->response->status->code == 0 &&
      (back->response->result_case !=
           KVSHARE__RESPONSE__RESULT_PACKED_BATCH ||
       back->response->packed_batch->results.len * KVS_PACKED_OP_SIZE !=
           req->packed_batch->ops.len * KVS_PACKED_RESULT_SIZE))
    die("a packed batch reply without one result per op", NULL);
  kvs_envelope_free(back);
  free(buf);
}

static void one_frame(sess *c, const uint8_t *payload, size_t len) {
  Kvshare__Envelope *env, *ref = NULL;
  Kvshare__Response resp;
  kvs__arena *a = &arena;
  int rc;

  fz_srv.frames_in++;
  n_frames++;
  /* The arena decoder and the malloc one agree on what decodes, and why
   * not: they charge every allocation alike (kvs__unpack_cost). */
  rc = kvs__arena_unpack(a, payload, len, 0, NULL, &env);
  if (kvs_envelope_unpack(payload, len, 0, &ref) != rc)
    die("kvs__arena_unpack and kvs_envelope_unpack disagree", NULL);
  kvs_envelope_free(ref);
  if (rc < 0) {
    kvs__arena_reset(a);
    n_undecodable++;
    return; /* EPROTO, the connection goes on */
  }
  if (env->body_case == KVSHARE__ENVELOPE__BODY_REQUEST) {
    int mutates;

    kvshare__response__init(&resp);
    if (disp_reply_bound(c, env->request, &mutates) - KVS_FRAME_HEADER_SIZE >
            fz_cfg.max_frame &&
        mutates) {
      n_too_big++; /* session.c answers ETOOBIG, none of it run */
      kvs__arena_reset(a);
      return;
    }
    disp_request(c, env->request, &resp, a);
    n_requests++;
    n_by_op[(unsigned)env->request->op_case & 15]++;
    if (resp.status && resp.status->code == 0)
      n_ok++;
    else
      n_err++;
    reply(c, env->request, env->seq, &resp);
    check_pool("while the frame's copies are pinned");
    finish_copies(c);
    check_pool("after a request");
  }
  kvs__arena_reset(a);
}

/* The message entry at buf + *off must be filed under op `op` and carry
 * `want` (cut to KVS_COMPACT_MSG_MAX; "" when NULL); *off passes it. */
static void check_msg(const uint8_t *buf, size_t *off, uint32_t op,
                      const char *want, const char *what) {
  size_t n = want ? strnlen(want, KVS_COMPACT_MSG_MAX) : 0;
  uint32_t msg_op, len;

  memcpy(&msg_op, buf + *off, 4);
  memcpy(&len, buf + *off + 4, 4);
  if (msg_op != op)
    die(what, "a message filed under another op");
  if (len != n || (n && memcmp(buf + *off + 8, want, n) != 0))
    die(what, "a message that differs from the Response's");
  *off += kvs_compact_msg_size(len);
}

/* The compact reply to a kind-`kind` request with this seq, read back
 * against the Response it was written from. */
static void check_compact_reply(const sess *c, uint8_t kind, uint64_t seq,
                                const Kvshare__Request *req,
                                const Kvshare__Response *resp) {
  size_t len = compact_reply_size(kind, resp), off, i;
  int code = resp->status ? resp->status->code : 0, mutates = 0;
  const char *msg = resp->status ? resp->status->message : NULL;
  kvs_frame_header fh;
  kvs_compact_rep h;
  uint8_t *buf;

  if (req && len > disp_reply_bound(c, req, &mutates))
    die("a compact reply over disp_reply_bound", NULL);
  buf = malloc(len + 8); /* (malloc: aligned, as the daemon's buffers) */
  if (!buf)
    die("out of memory", NULL);
  compact_reply_encode(kind, seq, resp, buf, len);
  if (kvs_frame_header_decode(buf, UINT32_MAX, &fh) != 0 ||
      fh.flags != KVS_FRAME_COMPACT || fh.length + KVS_FRAME_HEADER_SIZE != len ||
      fh.length < KVS_COMPACT_HDR)
    die("a compact reply's frame header", NULL);
  kvs_compact_rep_get(buf + KVS_FRAME_HEADER_SIZE, &h);
  off = KVS_FRAME_HEADER_SIZE + KVS_COMPACT_HDR;
  if (h.seq != seq || h.status > 0)
    die("a compact reply's seq or status", NULL);
  if (kind == KVS_COMPACT_PING && code == 0 &&
      resp->result_case == KVSHARE__RESPONSE__RESULT_PONG) {
    if (h.status || h.count != resp->pong.len || h.words || h.nmsg ||
        (resp->pong.len &&
         memcmp(buf + off, resp->pong.data, resp->pong.len) != 0))
      die("a compact Pong differs from the Ping's bytes", NULL);
    off += h.count;
  } else if (kind == KVS_COMPACT_BATCH && code == 0 &&
             resp->result_case == KVSHARE__RESPONSE__RESULT_PACKED_BATCH) {
    const Kvshare__PackedBatchResult *pr = resp->packed_batch;

    if (h.status || (size_t)h.count * KVS_PACKED_RESULT_SIZE != pr->results.len ||
        (size_t)h.words * 4 != pr->data.len || h.nmsg != pr->n_messages ||
        (pr->results.len &&
         memcmp(buf + off, pr->results.data, pr->results.len) != 0) ||
        (pr->data.len &&
         memcmp(buf + off + pr->results.len, pr->data.data, pr->data.len) != 0))
      die("a compact batch reply differs from its PackedBatchResult", NULL);
    off += pr->results.len + pr->data.len;
    for (i = 0; i < h.nmsg; i++)
      check_msg(buf, &off, pr->message_ops[i], pr->messages[i],
                "a compact batch reply");
  } else if (kind == KVS_COMPACT_OP) {
    /* one record, its status the Response's; the blocks after it */
    kvs_pres p;
    const uint32_t *blocks = NULL;
    size_t nb = 0;

    if (resp->result_case == KVSHARE__RESPONSE__RESULT_LOOKUP) {
      blocks = resp->lookup->blocks;
      nb = resp->lookup->n_blocks;
    } else if (resp->result_case == KVSHARE__RESPONSE__RESULT_ALLOC) {
      blocks = resp->alloc->blocks;
      nb = resp->alloc->n_blocks;
    }
    kvs_pres_get(buf + off, &p);
    if (h.count != 1 || h.status != code || p.status != code ||
        h.words != nb || p.blk_off != 0 || p.blk_n != nb ||
        (nb && memcmp(buf + off + KVS_PACKED_RESULT_SIZE, blocks,
                      nb * 4) != 0))
      die("a compact op reply differs from its Response", NULL);
    if (resp->result_case == KVSHARE__RESPONSE__RESULT_LOOKUP &&
        p.x != resp->lookup->hit_tokens)
      die("a compact lookup reply's hit_tokens", NULL);
    if (resp->result_case == KVSHARE__RESPONSE__RESULT_ALLOC &&
        (p.x != resp->alloc->first_index ||
         !(p.flags & KVS_PRES_HAS_COW) != !resp->alloc->has_cow))
      die("a compact allocation reply's fields", NULL);
    if (resp->result_case == KVSHARE__RESPONSE__RESULT_COMMIT &&
        p.x != resp->commit->sealed)
      die("a compact commit reply's sealed count", NULL);
    off += KVS_PACKED_RESULT_SIZE + nb * 4;
    if (h.nmsg != (msg && msg[0] ? 1u : 0u))
      die("a compact op reply's message count", NULL);
    if (h.nmsg)
      check_msg(buf, &off, 0, msg, "a compact op reply");
  } else { /* refused as a whole: its status and message alone */
    if (code >= 0 || h.status != code || h.count || h.words ||
        h.nmsg != (msg && msg[0] ? 1u : 0u))
      die("a compact refusal's status", NULL);
    if (h.nmsg)
      check_msg(buf, &off, KVS_COMPACT_FRAME_MSG, msg, "a compact refusal");
  }
  if (off != len)
    die("a compact reply's length does not add up", NULL);
  free(buf);
}

/* A compact frame, as session.c's handle_compact takes it. */
static void one_compact(sess *c, const uint8_t *payload, size_t len) {
  Kvshare__Response resp;
  kvs__arena *a = &arena;
  compact_in in;
  int rc, mutates;

  fz_srv.frames_in++;
  n_frames++;
  n_compact++;
  kvshare__response__init(&resp);
  rc = compact_parse(c, payload, len, &in, &resp, a);
  c->compact = in.kind ? in.kind : COMPACT_REFUSAL;
  if (rc < 0) {
    n_compact_refused++;
    if (!resp.status || resp.status->code != rc || !resp.status->message ||
        !resp.status->message[0])
      die("a compact refusal without its status and message", NULL);
    check_compact_reply(c, c->compact, in.seq, NULL, &resp);
  } else if (disp_reply_bound(c, &in.req, &mutates) - KVS_FRAME_HEADER_SIZE >
                 fz_cfg.max_frame &&
             mutates) {
    n_too_big++; /* session.c answers ETOOBIG, none of it run */
  } else {
    disp_request(c, &in.req, &resp, a);
    n_requests++;
    n_by_op[(unsigned)in.req.op_case & 15]++;
    if (resp.status && resp.status->code == 0)
      n_ok++;
    else
      n_err++;
    if (compact_reply_size(c->compact, &resp) - KVS_FRAME_HEADER_SIZE <=
        fz_cfg.max_frame)
      check_compact_reply(c, c->compact, in.seq, &in.req, &resp);
    else if (mutates)
      die("a compact reply over max_frame after a request that changed "
          "things", NULL);
    check_pool("while the frame's copies are pinned");
    finish_copies(c);
    check_pool("after a request");
  }
  c->compact = 0;
  kvs__arena_reset(a);
}

/* The session's read buffer: whole frames are handled, a bad header or a
 * cut frame ends the connection. */
static void stream(sess *c, const uint8_t *p, size_t n) {
  uint32_t max = (uint32_t)fz_cfg.max_frame;
  size_t flen;

  while (n) {
    int rc = kvs_frame_parse(p, n, max, &flen);

    if (rc <= 0)
      return;
    if (kvs_frame_flags(p) & KVS_FRAME_COMPACT)
      one_compact(c, p + KVS_FRAME_HEADER_SIZE, flen - KVS_FRAME_HEADER_SIZE);
    else
      one_frame(c, p + KVS_FRAME_HEADER_SIZE, flen - KVS_FRAME_HEADER_SIZE);
    p += flen;
    n -= flen;
  }
}

void fuzz_dispatch_report(FILE *out) {
  core_stats st;
  unsigned i;

  core_get_stats(fz_srv.core, &st);
  fprintf(out, "%lu frames (%lu compact, %lu of them refused), %lu "
          "undecodable, %lu with a reply too big to run, %lu requests (%lu "
          "ok, %lu errors); by op:", n_frames, n_compact, n_compact_refused,
          n_undecodable, n_too_big, n_requests, n_ok, n_err);
  for (i = 0; i < 16; i++)
    if (n_by_op[i])
      fprintf(out, " %u:%lu", i, n_by_op[i]);
  fprintf(out, "\n%lu daemon copies\n", n_copies);
  fprintf(out, "core: %llu lookups, %llu hit blocks, %llu allocated, %llu "
          "evictions, %llu cow, %llu sealed, %llu duplicates, %llu no_space\n",
          (unsigned long long)st.lookups, (unsigned long long)st.hit_blocks,
          (unsigned long long)st.allocated_blocks,
          (unsigned long long)st.evictions, (unsigned long long)st.cow_copies,
          (unsigned long long)st.sealed_blocks,
          (unsigned long long)st.duplicate_blocks,
          (unsigned long long)st.no_space);
}

static void free_one(core_req *r, void *arg) { core_req_free(arg, r); }

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
    stream(fz_sess[0], data + 1, size - 1);
  } else {
    size_t pos = 1;

    while (size - pos >= 3) {
      sess *c = fz_sess[(data[pos] & 0x7f) % NSESS];
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
      stream(c, f, KVS_FRAME_HEADER_SIZE + len);
      free(f);
      pos += len;
    }
  }
  /* Both connections close: every request goes, every block comes back. */
  for (i = 0; i < NSESS; i++) {
    reqmap_drain(&fz_sess[i]->reqs, free_one, fz_srv.core);
    fz_sess[i]->tokens_held = 0; /* as session.c's free_requests */
  }
  check_pool("after the sessions closed");
  core_get_stats(fz_srv.core, &st);
  if (st.used_blocks || st.num_requests) {
    char msg[128];

    snprintf(msg, sizeof(msg), "%u blocks in use by %u requests",
             st.used_blocks, st.num_requests);
    die("blocks leaked after close", msg);
  }
  return 0;
}
