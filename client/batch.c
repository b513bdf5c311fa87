/*
 * batch.c — libkvshare: the batch builder (many ops, one round trip).
 *
 * Ops are recorded compactly as they are added (arrays copied into two
 * growing pools, referenced by offset so the pools may move).  Submit sends
 * them as one PackedBatch when the daemon takes it and every op can be
 * packed (fixed-width records, the u32 pool as their data: no message per
 * op), else builds the protobuf Requests pointing into the pools and sends
 * one Batch.  Either way it keeps the reply, a packed one turned back into
 * Responses in the batch's arena: per-op results point into it until the
 * batch is reset, submitted again or freed.
 */
#include <stdlib.h>
#include <string.h>

#include "client/client_int.h"
#include "client/ops_int.h"
#include "kvs_packed.h"

typedef struct bop {
  Kvshare__Request__OpCase kind;
  uint64_t req_id, child_id;
  uint32_t n, start, nblocks;
  int has_tokens;
  size_t tok_off, blk_off; /* in u32 pool */
  size_t bytes_off, bytes_len; /* in byte pool (salt, ping payload) */
} bop;

/* The protobuf form of one op, built at submit time. */
typedef struct bmsg {
  Kvshare__Request req;
  union {
    Kvshare__Lookup lookup;
    Kvshare__Allocate allocate;
    Kvshare__Append append;
    Kvshare__Commit commit;
    Kvshare__Fork fork;
    Kvshare__Free free;
    Kvshare__Preempt preempt;
    Kvshare__Ping ping;
  } m;
} bmsg;

struct kvs_batch {
  bop *ops;
  uint32_t n, cap;
  uint32_t *u32;
  size_t nu32, capu32;
  uint8_t *bytes;
  size_t nbytes, capbytes;
  /* submit-time scratch */
  uint8_t *pops;  /* packed op records */
  size_t pcap;
  bmsg *msgs;
  Kvshare__Request **reqs;
  uint32_t msgcap;
  /* the reply of the last submit, decoded in arena */
  Kvshare__Envelope *reply;
  kvs__arena arena;
  Kvshare__Response **replies;
  uint32_t nreplies;
  int submitted;
};

int kvs_batch_new(kvs_batch **out) {
  if (!out)
    return KVS_EINVAL;
  *out = calloc(1, sizeof **out);
  return *out ? 0 : KVS_ENOMEM;
}

/* Frees the last reply (its results become invalid). */
static void drop_reply(kvs_batch *b) {
  kvs__arena_reset(&b->arena);
  b->reply = NULL;
  b->replies = NULL;
  b->nreplies = 0;
  b->submitted = 0;
}

void kvs_batch_free(kvs_batch *b) {
  if (!b)
    return;
  drop_reply(b);
  kvs__arena_destroy(&b->arena);
  free(b->ops);
  free(b->u32);
  free(b->bytes);
  free(b->msgs);
  free(b->reqs);
  free(b->pops);
  free(b);
}

void kvs_batch_reset(kvs_batch *b) {
  if (!b)
    return;
  drop_reply(b);
  b->n = 0;
  b->nu32 = 0;
  b->nbytes = 0;
}

uint32_t kvs_batch_count(const kvs_batch *b) { return b ? b->n : 0; }

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap)
    return 0;
  size_t ncap = *cap ? *cap : 64;
  while (ncap < need)
    ncap *= 2;
  void *np = realloc(*p, ncap * elem);
  if (!np)
    return KVS_ENOMEM;
  *p = np;
  *cap = ncap;
  return 0;
}

/* A new op (zeroed) or NULL.  Adding ops to a submitted batch starts a new
 * one; the old reply stays allocated until the next submit, reset or free,
 * so its results may be passed to the new ops (they are copied). */
static bop *add(kvs_batch *b, Kvshare__Request__OpCase kind) {
  if (b->submitted) {
    b->submitted = 0;
    b->n = 0;
    b->nu32 = 0;
    b->nbytes = 0;
  }
  if (b->n == INT32_MAX)
    return NULL;
  size_t cap = b->cap;
  if (grow((void **)&b->ops, &cap, (size_t)b->n + 1, sizeof(bop)))
    return NULL;
  b->cap = (uint32_t)cap;
  bop *o = &b->ops[b->n];
  memset(o, 0, sizeof *o);
  o->kind = kind;
  return o;
}

static int put_u32(kvs_batch *b, const uint32_t *v, uint32_t n, size_t *off) {
  if (grow((void **)&b->u32, &b->capu32, b->nu32 + n, sizeof(uint32_t)))
    return KVS_ENOMEM;
  *off = b->nu32;
  if (n)
    memcpy(b->u32 + b->nu32, v, (size_t)n * sizeof(uint32_t));
  b->nu32 += n;
  return 0;
}

static int put_bytes(kvs_batch *b, const void *v, size_t n, size_t *off) {
  if (grow((void **)&b->bytes, &b->capbytes, b->nbytes + n, 1))
    return KVS_ENOMEM;
  *off = b->nbytes;
  if (n)
    memcpy(b->bytes + b->nbytes, v, n);
  b->nbytes += n;
  return 0;
}

static int commit_op(kvs_batch *b) { return (int)b->n++; }

int kvs_batch_lookup(kvs_batch *b, uint64_t req_id, const uint32_t *tokens,
                     uint32_t n, const void *salt, size_t salt_len) {
  if (!b || (n && !tokens) || (salt_len && !salt))
    return KVS_EINVAL;
  bop *o = add(b, KVSHARE__REQUEST__OP_LOOKUP);
  if (!o)
    return KVS_ENOMEM;
  o->req_id = req_id;
  o->n = n;
  if (put_u32(b, tokens, n, &o->tok_off) ||
      put_bytes(b, salt, salt_len, &o->bytes_off))
    return KVS_ENOMEM;
  o->bytes_len = salt_len;
  return commit_op(b);
}

static int add_simple(kvs_batch *b, Kvshare__Request__OpCase kind,
                      uint64_t req_id, uint64_t child_id, uint32_t n) {
  if (!b)
    return KVS_EINVAL;
  bop *o = add(b, kind);
  if (!o)
    return KVS_ENOMEM;
  o->req_id = req_id;
  o->child_id = child_id;
  o->n = n;
  return commit_op(b);
}

int kvs_batch_allocate(kvs_batch *b, uint64_t req_id, uint32_t num_tokens) {
  return add_simple(b, KVSHARE__REQUEST__OP_ALLOCATE, req_id, 0, num_tokens);
}

int kvs_batch_append(kvs_batch *b, uint64_t req_id, uint32_t num_tokens) {
  return add_simple(b, KVSHARE__REQUEST__OP_APPEND, req_id, 0, num_tokens);
}

int kvs_batch_fork(kvs_batch *b, uint64_t req_id, uint64_t child_id) {
  return add_simple(b, KVSHARE__REQUEST__OP_FORK, req_id, child_id, 0);
}

int kvs_batch_free_req(kvs_batch *b, uint64_t req_id) {
  return add_simple(b, KVSHARE__REQUEST__OP_FREE, req_id, 0, 0);
}

int kvs_batch_preempt(kvs_batch *b, uint64_t req_id) {
  return add_simple(b, KVSHARE__REQUEST__OP_PREEMPT, req_id, 0, 0);
}

int kvs_batch_commit(kvs_batch *b, uint64_t req_id, uint32_t start,
                     const uint32_t *tokens, uint32_t n,
                     const uint32_t *blocks, uint32_t nblocks) {
  if (!b || (nblocks && !blocks))
    return KVS_EINVAL;
  bop *o = add(b, KVSHARE__REQUEST__OP_COMMIT);
  if (!o)
    return KVS_ENOMEM;
  o->req_id = req_id;
  o->start = start;
  o->n = n;
  o->has_tokens = tokens != NULL;
  o->nblocks = nblocks;
  if (put_u32(b, tokens, tokens ? n : 0, &o->tok_off) ||
      put_u32(b, blocks, nblocks, &o->blk_off))
    return KVS_ENOMEM;
  return commit_op(b);
}

int kvs_batch_ping(kvs_batch *b, const void *payload, size_t len) {
  if (!b || (len && !payload))
    return KVS_EINVAL;
  bop *o = add(b, KVSHARE__REQUEST__OP_PING);
  if (!o)
    return KVS_ENOMEM;
  if (put_bytes(b, payload, len, &o->bytes_off))
    return KVS_ENOMEM;
  o->bytes_len = len;
  return commit_op(b);
}

/* Builds op i's protobuf form in b->msgs[i]. */
static void build(kvs_batch *b, uint32_t i, int daemon_copy) {
  const bop *o = &b->ops[i];
  bmsg *m = &b->msgs[i];
  Kvshare__Request init = KVSHARE__REQUEST__INIT;
  m->req = init;
  m->req.op_case = o->kind;
  switch (o->kind) {
  case KVSHARE__REQUEST__OP_LOOKUP: {
    Kvshare__Lookup x = KVSHARE__LOOKUP__INIT;
    x.req_id = o->req_id;
    x.n_tokens = o->n;
    x.tokens = b->u32 + o->tok_off;
    x.salt.len = o->bytes_len;
    x.salt.data = b->bytes + o->bytes_off;
    m->m.lookup = x;
    m->req.lookup = &m->m.lookup;
    break;
  }
  case KVSHARE__REQUEST__OP_ALLOCATE: {
    Kvshare__Allocate x = KVSHARE__ALLOCATE__INIT;
    x.req_id = o->req_id;
    x.num_tokens = o->n;
    x.daemon_copy = daemon_copy;
    m->m.allocate = x;
    m->req.allocate = &m->m.allocate;
    break;
  }
  case KVSHARE__REQUEST__OP_APPEND: {
    Kvshare__Append x = KVSHARE__APPEND__INIT;
    x.req_id = o->req_id;
    x.num_tokens = o->n;
    x.daemon_copy = daemon_copy;
    m->m.append = x;
    m->req.append = &m->m.append;
    break;
  }
  case KVSHARE__REQUEST__OP_COMMIT: {
    Kvshare__Commit x = KVSHARE__COMMIT__INIT;
    x.req_id = o->req_id;
    x.start = o->start;
    x.num_tokens = o->n;
    if (o->has_tokens) {
      x.n_tokens = o->n;
      x.tokens = b->u32 + o->tok_off;
    }
    x.n_blocks = o->nblocks;
    x.blocks = b->u32 + o->blk_off;
    m->m.commit = x;
    m->req.commit = &m->m.commit;
    break;
  }
  case KVSHARE__REQUEST__OP_FORK: {
    Kvshare__Fork x = KVSHARE__FORK__INIT;
    x.req_id = o->req_id;
    x.child_id = o->child_id;
    m->m.fork = x;
    m->req.fork = &m->m.fork;
    break;
  }
  case KVSHARE__REQUEST__OP_FREE: {
    Kvshare__Free x = KVSHARE__FREE__INIT;
    x.req_id = o->req_id;
    m->m.free = x;
    m->req.free = &m->m.free;
    break;
  }
  case KVSHARE__REQUEST__OP_PREEMPT: {
    Kvshare__Preempt x = KVSHARE__PREEMPT__INIT;
    x.req_id = o->req_id;
    m->m.preempt = x;
    m->req.preempt = &m->m.preempt;
    break;
  }
  case KVSHARE__REQUEST__OP_PING: {
    Kvshare__Ping x = KVSHARE__PING__INIT;
    x.payload.len = o->bytes_len;
    x.payload.data = b->bytes + o->bytes_off;
    m->m.ping = x;
    m->req.ping = &m->m.ping;
    break;
  }
  default:
    break;
  }
  b->reqs[i] = &m->req;
}

/* Takes the reply over from the client: it lives in the client's arena, so
 * the batch takes that arena and gives the client its own (empty). */
static void take_reply(kvs_client *c, kvs_batch *b) {
  kvs__arena tmp = b->arena;

  b->reply = c->last;
  c->last = NULL;
  b->arena = c->arena;
  c->arena = tmp;
}

/* Can every op go in a PackedBatch, and does it fit a frame?  (Token ids
 * are 4 bytes each there, 1 to 5 as protobuf varints: a batch of small ids
 * near max_frame may fit only as a Batch.) */
static int packable(const kvs_client *c, const kvs_batch *b) {
  if ((size_t)b->n * KVS_PACKED_OP_SIZE + b->nu32 * 4 + 64 > c->max_frame)
    return 0;
  for (uint32_t i = 0; i < b->n; i++)
    if (!kvs__op_has_record(b->ops[i].kind, b->ops[i].bytes_len))
      return 0; /* (a Lookup's bytes are its salt) */
  /* Offsets are u32 words. */
  return b->nu32 <= UINT32_MAX;
}

/* The reply to a PackedBatch as Responses in the batch's arena, so that
 * the accessors read both kinds alike.  0 or KVS_EPROTO / KVS_ENOMEM. */
static int unpack_results(kvs_batch *b, const Kvshare__PackedBatchResult *pr) {
  size_t words = pr->data.len / 4;
  const uint32_t *data = (const uint32_t *)(const void *)pr->data.data;
  uint32_t n = b->n;

  if (pr->results.len != (size_t)n * KVS_PACKED_RESULT_SIZE ||
      pr->data.len % 4 || pr->n_messages != pr->n_message_ops)
    return KVS_EPROTO;
  b->replies = kvs__arena_alloc(&b->arena, (size_t)n * sizeof(*b->replies));
  Kvshare__Response *rs = kvs__arena_alloc(&b->arena, (size_t)n * sizeof(*rs));
  if (!b->replies || !rs)
    return KVS_ENOMEM;
  for (uint32_t i = 0; i < n; i++) {
    Kvshare__Response *r = &rs[i];
    kvs_pres p;

    kvs_pres_get(pr->results.data + (size_t)i * KVS_PACKED_RESULT_SIZE, &p);
    if (!kvs_packed_in(p.blk_off, p.blk_n, words) || p.status > 0)
      return KVS_EPROTO;
    kvshare__response__init(r);
    b->replies[i] = r;
    if (p.status) {
      Kvshare__Status *st = kvs__arena_alloc(&b->arena, sizeof(*st));
      if (!st)
        return KVS_ENOMEM;
      kvshare__status__init(st);
      st->code = p.status;
      for (size_t k = 0; k < pr->n_message_ops; k++)
        if (pr->message_ops[k] == i)
          st->message = pr->messages[k];
      r->status = st;
      continue;
    }
    kvs__op_result *m = kvs__arena_alloc(&b->arena, sizeof(*m));
    if (!m)
      return KVS_ENOMEM;
    if (kvs__record_result(b->ops[i].kind, &p, data ? data + p.blk_off : NULL,
                           r, m) < 0)
      return KVS_EPROTO;
  }
  b->nreplies = n;
  return 0;
}

/* Sends the batch as a PackedBatch; the reply taken over as for a Batch. */
static int submit_packed(kvs_client *c, kvs_batch *b) {
  size_t need = (size_t)b->n * KVS_PACKED_OP_SIZE;

  if (need > b->pcap) {
    uint8_t *np = realloc(b->pops, need);
    if (!np)
      return KVS_ENOMEM;
    b->pops = np;
    b->pcap = need;
  }
  for (uint32_t i = 0; i < b->n; i++) {
    const bop *o = &b->ops[i];
    kvs_pop p;

    memset(&p, 0, sizeof p);
    p.op = (uint8_t)o->kind;
    p.req_id = o->req_id;
    p.n = o->n;
    switch (o->kind) {
    case KVSHARE__REQUEST__OP_LOOKUP:
      p.flags = c->no_promote ? KVS_POP_NO_PROMOTE : 0;
      p.tok_off = (uint32_t)o->tok_off;
      p.tok_n = o->n;
      break;
    case KVSHARE__REQUEST__OP_ALLOCATE:
    case KVSHARE__REQUEST__OP_APPEND:
      p.flags = c->daemon_copy ? KVS_POP_DAEMON_COPY : 0;
      break;
    case KVSHARE__REQUEST__OP_COMMIT:
      p.arg = o->start;
      if (o->has_tokens) {
        p.flags = KVS_POP_HAS_TOKENS;
        p.tok_off = (uint32_t)o->tok_off;
        p.tok_n = o->n;
      }
      p.blk_off = (uint32_t)o->blk_off;
      p.blk_n = o->nblocks;
      break;
    case KVSHARE__REQUEST__OP_FORK:
      p.arg = o->child_id;
      break;
    default:
      break;
    }
    kvs_pop_put(b->pops + (size_t)i * KVS_PACKED_OP_SIZE, &p);
  }
  Kvshare__PackedBatch pb = KVSHARE__PACKED_BATCH__INIT;
  pb.ops.data = b->pops;
  pb.ops.len = need;
  static uint8_t none[4];
  pb.data.data = b->u32 ? (uint8_t *)b->u32 : none;
  pb.data.len = b->nu32 * 4;
  Kvshare__Request req = KVSHARE__REQUEST__INIT;
  req.op_case = KVSHARE__REQUEST__OP_PACKED_BATCH;
  req.packed_batch = &pb;
  Kvshare__Response *r;
  int rc = kvs__call(c, &req, &r);
  if (rc)
    return rc;
  if (r->result_case != KVSHARE__RESPONSE__RESULT_PACKED_BATCH ||
      !r->packed_batch) {
    c->broken = 1; /* the reply does not match what was sent */
    return KVS_EPROTO;
  }
  take_reply(c, b);
  rc = unpack_results(b, r->packed_batch);
  if (rc) {
    drop_reply(b);
    if (rc == KVS_EPROTO)
      c->broken = 1;
    return rc;
  }
  b->submitted = 1;
  return 0;
}

int kvs_batch_submit(kvs_client *c, kvs_batch *b) {
  if (!c || !b)
    return KVS_EINVAL;
  drop_reply(b);
  if (c->packed_batch && b->n && packable(c, b))
    return submit_packed(c, b);
  if (b->n > b->msgcap) {
    bmsg *nm = realloc(b->msgs, (size_t)b->n * sizeof *nm);
    if (!nm)
      return KVS_ENOMEM;
    b->msgs = nm;
    Kvshare__Request **nr = realloc(b->reqs, (size_t)b->n * sizeof *nr);
    if (!nr)
      return KVS_ENOMEM;
    b->reqs = nr;
    b->msgcap = b->n;
  }
  for (uint32_t i = 0; i < b->n; i++)
    build(b, i, c->daemon_copy);
  Kvshare__Batch batch = KVSHARE__BATCH__INIT;
  batch.n_ops = b->n;
  batch.ops = b->reqs;
  Kvshare__Request req = KVSHARE__REQUEST__INIT;
  req.op_case = KVSHARE__REQUEST__OP_BATCH;
  req.batch = &batch;
  Kvshare__Response *r;
  int rc = kvs__call(c, &req, &r);
  if (rc)
    return rc;
  if (b->n &&
      (r->result_case != KVSHARE__RESPONSE__RESULT_BATCH || !r->batch ||
       r->batch->n_replies != b->n)) {
    c->broken = 1; /* the reply does not match what was sent */
    return KVS_EPROTO;
  }
  take_reply(c, b);
  if (b->n) {
    b->replies = r->batch->replies;
    b->nreplies = (uint32_t)r->batch->n_replies;
    for (uint32_t i = 0; i < b->nreplies; i++)
      if (!b->replies[i]) {
        drop_reply(b);
        return KVS_EPROTO;
      }
  }
  b->submitted = 1;
  return 0;
}

static const Kvshare__Response *reply_at(const kvs_batch *b, uint32_t i,
                                         int *rc) {
  if (!b || !b->submitted) {
    *rc = KVS_ESTATE;
    return NULL;
  }
  if (i >= b->nreplies) {
    *rc = KVS_ERANGE;
    return NULL;
  }
  const Kvshare__Response *r = b->replies[i];
  *rc = r->status ? r->status->code : 0;
  if (*rc > 0)
    *rc = KVS_EPROTO;
  return r;
}

int kvs_batch_status(const kvs_batch *b, uint32_t i) {
  int rc;
  reply_at(b, i, &rc);
  return rc;
}

const char *kvs_batch_message(const kvs_batch *b, uint32_t i) {
  int rc;
  const Kvshare__Response *r = reply_at(b, i, &rc);
  if (!r || !r->status)
    return "";
  /* Past the batch's first 16 failures the daemon sends the code alone. */
  if ((!r->status->message || !r->status->message[0]) && r->status->code < 0)
    return kvs_strerror(r->status->code);
  return r->status->message ? r->status->message : "";
}

int kvs_batch_lookup_result(const kvs_batch *b, uint32_t i,
                            kvs_lookup_result *res) {
  int rc;
  const Kvshare__Response *r = reply_at(b, i, &rc);
  if (res)
    memset(res, 0, sizeof *res);
  if (!r || rc)
    return rc;
  if (b->ops[i].kind != KVSHARE__REQUEST__OP_LOOKUP)
    return KVS_EINVAL;
  return kvs__lookup_result(r, res);
}

int kvs_batch_alloc_result(const kvs_batch *b, uint32_t i,
                           kvs_alloc_result *res) {
  int rc;
  const Kvshare__Response *r = reply_at(b, i, &rc);
  if (res) {
    memset(res, 0, sizeof *res);
    res->cow_src = res->cow_dst = KVS_BLOCK_NONE;
  }
  if (!r || rc)
    return rc;
  if (b->ops[i].kind != KVSHARE__REQUEST__OP_ALLOCATE &&
      b->ops[i].kind != KVSHARE__REQUEST__OP_APPEND)
    return KVS_EINVAL;
  return kvs__alloc_result(r, res);
}

int kvs_batch_commit_result(const kvs_batch *b, uint32_t i, uint32_t *sealed) {
  int rc;
  const Kvshare__Response *r = reply_at(b, i, &rc);
  if (sealed)
    *sealed = 0;
  if (!r || rc)
    return rc;
  if (b->ops[i].kind != KVSHARE__REQUEST__OP_COMMIT)
    return KVS_EINVAL;
  return kvs__commit_result(r, sealed);
}
