/*
 * compact.c — libkvshare: calls as compact frames (proto/kvs_compact.h).
 *
 * When the daemon takes them (Welcome.features), kvs__call sends every
 * request that has a compact form — Lookup without a salt, Allocate,
 * Append, Commit, Fork, Free, Preempt, Ping and PackedBatch — in
 * fixed-width fields read straight from the Request it was given, and turns
 * the fixed-width reply back into the Envelope { Response } the protobuf
 * path would have decoded, in the client's arena (c->last).  So every
 * caller reads results the same way, whichever path they took; only the
 * encoding work differs, which on a small call was most of the client's.
 * $KVS_COMPACT=0 turns it off.
 */
#include <string.h>

#include "client/client_int.h"
#include "kvs_compact.h"

int kvs__op_has_record(Kvshare__Request__OpCase kind, size_t salt_len) {
  switch (kind) {
  case KVSHARE__REQUEST__OP_LOOKUP:
    return salt_len == 0;
  case KVSHARE__REQUEST__OP_ALLOCATE:
  case KVSHARE__REQUEST__OP_APPEND:
  case KVSHARE__REQUEST__OP_COMMIT:
  case KVSHARE__REQUEST__OP_FORK:
  case KVSHARE__REQUEST__OP_FREE:
  case KVSHARE__REQUEST__OP_PREEMPT:
    return 1;
  default:
    return 0;
  }
}

int kvs__compact_ok(const Kvshare__Request *req) {
  switch (req->op_case) {
  case KVSHARE__REQUEST__OP_PING:
    return 1;
  case KVSHARE__REQUEST__OP_PACKED_BATCH:
    return req->packed_batch->ops.len % KVS_PACKED_OP_SIZE == 0 &&
           req->packed_batch->data.len % 4 == 0;
  case KVSHARE__REQUEST__OP_LOOKUP:
    return kvs__op_has_record(req->op_case, req->lookup->salt.len);
  default:
    return kvs__op_has_record(req->op_case, 0);
  }
}

/* What goes on the wire for req: a header, records, and up to two arrays
 * of u32 data (a Commit's tokens, then its blocks) or the ping's bytes. */
typedef struct out {
  kvs_compact_req h;
  kvs_pop op;                /* KVS_COMPACT_OP */
  const uint8_t *records;    /* KVS_COMPACT_BATCH */
  const void *a, *b;         /* data (or the ping's bytes: a) */
  size_t alen, blen;         /* bytes */
} out;

static void describe(const Kvshare__Request *req, out *o) {
  kvs_pop *p = &o->op;

  memset(o, 0, sizeof(*o));
  o->h.seq = 0;
  o->h.kind = KVS_COMPACT_OP;
  o->h.count = 1;
  p->op = (uint8_t)req->op_case;
  switch (req->op_case) {
  case KVSHARE__REQUEST__OP_LOOKUP:
    p->req_id = req->lookup->req_id;
    p->flags = req->lookup->no_promote ? KVS_POP_NO_PROMOTE : 0;
    p->tok_n = (uint32_t)req->lookup->n_tokens;
    o->a = req->lookup->tokens;
    o->alen = req->lookup->n_tokens * 4;
    break;
  case KVSHARE__REQUEST__OP_ALLOCATE:
    p->req_id = req->allocate->req_id;
    p->n = req->allocate->num_tokens;
    p->flags = req->allocate->daemon_copy ? KVS_POP_DAEMON_COPY : 0;
    break;
  case KVSHARE__REQUEST__OP_APPEND:
    p->req_id = req->append->req_id;
    p->n = req->append->num_tokens;
    p->flags = req->append->daemon_copy ? KVS_POP_DAEMON_COPY : 0;
    break;
  case KVSHARE__REQUEST__OP_COMMIT: {
    const Kvshare__Commit *m = req->commit;

    p->req_id = m->req_id;
    p->arg = m->start;
    p->n = m->num_tokens;
    if (m->n_tokens) {
      p->flags = KVS_POP_HAS_TOKENS;
      p->tok_n = (uint32_t)m->n_tokens;
      o->a = m->tokens;
      o->alen = m->n_tokens * 4;
    }
    p->blk_off = p->tok_n;
    p->blk_n = (uint32_t)m->n_blocks;
    o->b = m->blocks;
    o->blen = m->n_blocks * 4;
    break;
  }
  case KVSHARE__REQUEST__OP_FORK:
    p->req_id = req->fork->req_id;
    p->arg = req->fork->child_id;
    break;
  case KVSHARE__REQUEST__OP_FREE:
    p->req_id = req->free->req_id;
    break;
  case KVSHARE__REQUEST__OP_PREEMPT:
    p->req_id = req->preempt->req_id;
    break;
  case KVSHARE__REQUEST__OP_PING:
    o->h.kind = KVS_COMPACT_PING;
    o->h.count = (uint32_t)req->ping->payload.len;
    o->a = req->ping->payload.data;
    o->alen = req->ping->payload.len;
    return;
  default: /* KVSHARE__REQUEST__OP_PACKED_BATCH */
    o->h.kind = KVS_COMPACT_BATCH;
    o->h.count = (uint32_t)(req->packed_batch->ops.len / KVS_PACKED_OP_SIZE);
    o->records = req->packed_batch->ops.data;
    o->a = req->packed_batch->data.data;
    o->alen = req->packed_batch->data.len;
    break;
  }
  o->h.words = (uint32_t)((o->alen + o->blen) / 4);
}

/* Encodes o as one frame in c->wbuf; *flen its bytes.  KVS_ETOOBIG when it
 * is over the daemon's max_frame (or the fields' range). */
static int encode(kvs_client *c, out *o, size_t *flen) {
  size_t recs = o->h.kind == KVS_COMPACT_BATCH
                    ? (size_t)o->h.count * KVS_PACKED_OP_SIZE
                    : o->h.kind == KVS_COMPACT_OP ? KVS_PACKED_OP_SIZE : 0;
  size_t len = KVS_COMPACT_HDR + recs + o->alen + o->blen;
  uint8_t *p;
  int rc;

  if (len > c->max_frame || o->alen + o->blen > (size_t)UINT32_MAX * 4 ||
      (o->h.kind == KVS_COMPACT_PING && o->alen > UINT32_MAX))
    return KVS_ETOOBIG;
  rc = kvs__ensure_cap(&c->wbuf, &c->wcap, KVS_FRAME_HEADER_SIZE + len);
  if (rc)
    return rc;
  p = c->wbuf;
  kvs_frame_header_encode_flags(p, (uint32_t)len, KVS_FRAME_COMPACT);
  p += KVS_FRAME_HEADER_SIZE;
  kvs_compact_req_put(p, &o->h);
  p += KVS_COMPACT_HDR;
  if (o->h.kind == KVS_COMPACT_OP)
    kvs_pop_put(p, &o->op);
  else if (recs)
    memcpy(p, o->records, recs);
  p += recs;
  if (o->alen)
    memcpy(p, o->a, o->alen);
  if (o->blen)
    memcpy(p + o->alen, o->b, o->blen);
  *flen = KVS_FRAME_HEADER_SIZE + len;
  return 0;
}

/* ---- the reply, back into an Envelope in c->arena ------------------------- */

/* A copy of n bytes in the arena (NULL for none; *bad set when out of
 * memory). */
static void *keep(kvs_client *c, const void *p, size_t n, int *bad) {
  void *q;

  if (n == 0)
    return NULL;
  q = kvs__arena_alloc(&c->arena, n);
  if (!q) {
    *bad = 1;
    return NULL;
  }
  memcpy(q, p, n);
  return q;
}

static char *keep_str(kvs_client *c, const uint8_t *p, uint32_t n, int *bad) {
  char *s = kvs__arena_alloc(&c->arena, (size_t)n + 1);

  if (!s) {
    *bad = 1;
    return NULL;
  }
  memcpy(s, p, n);
  s[n] = '\0';
  return s;
}

static void *zalloc(kvs_client *c, size_t n, int *bad) {
  void *p = kvs__arena_alloc(&c->arena, n);

  if (!p)
    *bad = 1;
  else
    memset(p, 0, n);
  return p;
}

/* What one reply is turned back into, in one arena allocation. */
typedef struct rep_mem {
  Kvshare__Envelope env;
  Kvshare__Response r;
  Kvshare__Status st;
  union {
    kvs__op_result op;
    Kvshare__PackedBatchResult pr;
  } u;
} rep_mem;

int kvs__record_result(Kvshare__Request__OpCase kind, const kvs_pres *p,
                       const uint32_t *blocks, Kvshare__Response *r,
                       kvs__op_result *m) {
  switch (kind) {
  case KVSHARE__REQUEST__OP_LOOKUP:
    kvshare__lookup_result__init(&m->l);
    m->l.hit_tokens = p->x;
    m->l.below_tokens = p->y;
    m->l.n_blocks = p->blk_n;
    m->l.blocks = (uint32_t *)(uintptr_t)blocks;
    r->result_case = KVSHARE__RESPONSE__RESULT_LOOKUP;
    r->lookup = &m->l;
    return 0;
  case KVSHARE__REQUEST__OP_ALLOCATE:
  case KVSHARE__REQUEST__OP_APPEND:
    kvshare__alloc_result__init(&m->a);
    m->a.first_index = p->x;
    m->a.cow_index = p->y;
    m->a.cow_src = p->cow_src;
    m->a.cow_dst = p->cow_dst;
    m->a.has_cow = (p->flags & KVS_PRES_HAS_COW) != 0;
    m->a.cow_copied = (p->flags & KVS_PRES_COW_COPIED) != 0;
    m->a.n_blocks = p->blk_n;
    m->a.blocks = (uint32_t *)(uintptr_t)blocks;
    r->result_case = KVSHARE__RESPONSE__RESULT_ALLOC;
    r->alloc = &m->a;
    return 0;
  case KVSHARE__REQUEST__OP_COMMIT:
    kvshare__commit_result__init(&m->cr);
    m->cr.sealed = p->x;
    r->result_case = KVSHARE__RESPONSE__RESULT_COMMIT;
    r->commit = &m->cr;
    return 0;
  default: /* Fork, Free, Preempt: no result; no blocks either */
    return p->blk_n ? KVS_EPROTO : 0;
  }
}

/*
 * Reads the compact reply (payload plen bytes) to the request o described
 * into an Envelope in the arena.  KVS_EPROTO when it does not add up.
 */
static int read_reply(kvs_client *c, const out *o, const uint8_t *pl,
                      size_t plen, Kvshare__Envelope **envp) {
  const uint8_t *body = pl + KVS_COMPACT_HDR, *q;
  const uint8_t *msg = NULL, *end = pl + plen;
  uint32_t msg_n = 0, *msg_ops = NULL;
  char **msgs = NULL;
  uint64_t need;
  kvs_compact_rep h;
  rep_mem *m;
  Kvshare__Response *r;
  int bad = 0;

  if (plen < KVS_COMPACT_HDR)
    return KVS_EPROTO;
  kvs_compact_rep_get(pl, &h);
  if (h.seq != o->h.seq || h.status > 0 ||
      (o->h.kind == KVS_COMPACT_PING && h.words))
    return KVS_EPROTO;
  need = o->h.kind == KVS_COMPACT_PING && h.status == 0
             ? (uint64_t)KVS_COMPACT_HDR + h.count
             : (uint64_t)KVS_COMPACT_HDR +
                   (uint64_t)h.count * KVS_PACKED_RESULT_SIZE +
                   (uint64_t)h.words * 4;
  if (need > plen)
    return KVS_EPROTO;
  /* The messages: each within the payload, and nothing after them. */
  if (h.nmsg > plen / 8)
    return KVS_EPROTO;
  if (h.nmsg && o->h.kind == KVS_COMPACT_BATCH && h.status == 0) {
    msg_ops = zalloc(c, h.nmsg * sizeof(*msg_ops), &bad);
    msgs = zalloc(c, h.nmsg * sizeof(*msgs), &bad);
    if (bad)
      return KVS_ENOMEM;
  }
  q = pl + need;
  for (uint32_t i = 0; i < h.nmsg; i++) {
    uint32_t op, n;

    if ((size_t)(end - q) < 8)
      return KVS_EPROTO;
    memcpy(&op, q, 4);
    memcpy(&n, q + 4, 4);
    if (n > KVS_COMPACT_MSG_MAX || kvs_compact_msg_size(n) > (size_t)(end - q))
      return KVS_EPROTO;
    if (msgs) {
      if (op >= h.count)
        return KVS_EPROTO;
      msg_ops[i] = op;
      msgs[i] = keep_str(c, q + 8, n, &bad);
    } else if (!msg) {
      msg = q + 8;
      msg_n = n;
    }
    q += kvs_compact_msg_size(n);
  }
  if (q != end)
    return KVS_EPROTO;

  m = kvs__arena_alloc(&c->arena, sizeof(*m));
  if (!m)
    return KVS_ENOMEM;
  r = &m->r;
  kvshare__envelope__init(&m->env);
  kvshare__response__init(r);
  m->env.seq = h.seq;
  m->env.body_case = KVSHARE__ENVELOPE__BODY_RESPONSE;
  m->env.response = r;
  *envp = &m->env;
  if (h.status) {
    Kvshare__Status *st = &m->st;

    kvshare__status__init(st);
    st->code = h.status;
    st->message = msg ? keep_str(c, msg, msg_n, &bad) : (char *)"";
    r->status = st;
    /* A refusal of the whole frame (any kind): its status alone. */
    if (o->h.kind != KVS_COMPACT_OP || (h.count == 0 && h.words == 0))
      return bad ? KVS_ENOMEM : (h.count || h.words ? KVS_EPROTO : 0);
  }
  switch (o->h.kind) {
  case KVS_COMPACT_PING:
    /* (left in the receive buffer: it stays until the next call) */
    r->result_case = KVSHARE__RESPONSE__RESULT_PONG;
    r->pong.len = h.count;
    r->pong.data = h.count ? (uint8_t *)(uintptr_t)body : NULL;
    break;
  case KVS_COMPACT_BATCH: {
    Kvshare__PackedBatchResult *pr = &m->u.pr;

    kvshare__packed_batch_result__init(pr);
    pr->results.len = (size_t)h.count * KVS_PACKED_RESULT_SIZE;
    pr->results.data = keep(c, body, pr->results.len, &bad);
    pr->data.len = (size_t)h.words * 4;
    pr->data.data = keep(c, body + pr->results.len, pr->data.len, &bad);
    pr->n_message_ops = pr->n_messages = msgs ? h.nmsg : 0;
    pr->message_ops = msg_ops;
    pr->messages = msgs;
    r->result_case = KVSHARE__RESPONSE__RESULT_PACKED_BATCH;
    r->packed_batch = pr;
    break;
  }
  default: { /* one op: one record, whose status is the frame's */
    kvs_pres p;
    const uint32_t *blocks;

    if (h.count != 1)
      return KVS_EPROTO;
    kvs_pres_get(body, &p);
    if (p.status != h.status || !kvs_packed_in(p.blk_off, p.blk_n, h.words))
      return KVS_EPROTO;
    if (h.status)
      break;
    /* The blocks stay in the receive buffer until the next call, where
     * they are aligned (else a copy in the arena). */
    blocks = (const uint32_t *)(const void *)(body + KVS_PACKED_RESULT_SIZE +
                                              (size_t)p.blk_off * 4);
    if (((uintptr_t)blocks & 3) != 0)
      blocks = keep(c, blocks, (size_t)p.blk_n * 4, &bad);
    if (kvs__record_result((Kvshare__Request__OpCase)o->op.op, &p, blocks, r,
                           &m->u.op) < 0)
      return KVS_EPROTO;
    break;
  }
  }
  return bad ? KVS_ENOMEM : 0;
}

int kvs__compact_call(kvs_client *c, Kvshare__Request *req,
                      Kvshare__Response **resp) {
  const uint8_t *frame;
  size_t flen = 0, rlen;
  Kvshare__Envelope *env = NULL;
  out o;
  int rc;

  describe(req, &o);
  o.h.seq = c->next_seq++;
  rc = encode(c, &o, &flen);
  if (rc == KVS_ETOOBIG)
    return KVS__COMPACT_TOO_BIG; /* nothing sent, nothing dropped: token
                                    ids take 4 bytes each here, 1 to 5 as
                                    varints, so the Envelope may fit */
  /* Only now may the previous reply go: the request may point into it. */
  kvs__drop_last(c);
  if (rc == 0)
    rc = kvs__roundtrip(c, flen, &frame, &rlen);
  if (rc == 0 && !kvs_frame_flags(frame)) /* an Envelope: the daemon refused
                                             the frame as a whole */
    return kvs__take_reply(c, frame, rlen, o.h.seq, resp);
  if (rc == 0)
    rc = read_reply(c, &o, frame + KVS_FRAME_HEADER_SIZE,
                    rlen - KVS_FRAME_HEADER_SIZE, &env);
  if (rc) {
    c->broken = 1;
    return rc;
  }
  return kvs__take_response(c, env, resp);
}
