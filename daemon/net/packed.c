/*
 * packed.c — PackedBatch: a Batch in fixed-width records (proto/kvs_packed.h).
 *
 * Each record becomes the Request it stands for (built on the stack, its
 * arrays pointing into the frame's data words), runs through disp_request
 * exactly as a Batch's op does, and its Response is written back as a
 * result record.  So a packed op is checked, run and answered like any
 * other; only the encoding differs.  A record that names an op that cannot
 * be packed, or arrays outside the data, fails alone with EINVAL.
 */
#include <stdio.h>

#include "daemon/net/server.h"
#include "kvs_packed.h"

/* The Request a record stands for; NULL (and resp filled) when it is bad.
 * Its arrays point into data (words u32 words). */
const Kvshare__Request *disp_packed_op(const kvs_pop *o, size_t i,
                                       const uint32_t *data, size_t words,
                                       Kvshare__Request *req,
                                       disp_packed_msg *m,
                                       Kvshare__Response *resp,
                                       kvs__arena *a) {
  kvshare__request__init(req);
  if (((o->op == 1 || (o->op == 4 && (o->flags & KVS_POP_HAS_TOKENS))) &&
       !kvs_packed_in(o->tok_off, o->tok_n, words)) ||
      (o->op == 4 && !kvs_packed_in(o->blk_off, o->blk_n, words))) {
    disp_status(resp, a, KVS_EINVAL, "op %zu: its arrays are outside the "
                "%zu data words sent with it", i, words);
    return NULL;
  }
  switch (o->op) {
  case 1:
    kvshare__lookup__init(&m->lookup);
    m->lookup.req_id = o->req_id;
    m->lookup.n_tokens = o->tok_n;
    m->lookup.tokens = o->tok_n ? (uint32_t *)data + o->tok_off : NULL;
    m->lookup.no_promote = (o->flags & KVS_POP_NO_PROMOTE) != 0;
    req->op_case = KVSHARE__REQUEST__OP_LOOKUP;
    req->lookup = &m->lookup;
    break;
  case 2:
    kvshare__allocate__init(&m->allocate);
    m->allocate.req_id = o->req_id;
    m->allocate.num_tokens = o->n;
    m->allocate.daemon_copy = (o->flags & KVS_POP_DAEMON_COPY) != 0;
    req->op_case = KVSHARE__REQUEST__OP_ALLOCATE;
    req->allocate = &m->allocate;
    break;
  case 3:
    kvshare__append__init(&m->append);
    m->append.req_id = o->req_id;
    m->append.num_tokens = o->n;
    m->append.daemon_copy = (o->flags & KVS_POP_DAEMON_COPY) != 0;
    req->op_case = KVSHARE__REQUEST__OP_APPEND;
    req->append = &m->append;
    break;
  case 4:
    if (o->arg > UINT32_MAX) {
      disp_status(resp, a, KVS_ERANGE, "op %zu: commit start %llu is out "
                  "of range", i, (unsigned long long)o->arg);
      return NULL;
    }
    kvshare__commit__init(&m->commit);
    m->commit.req_id = o->req_id;
    m->commit.start = (uint32_t)o->arg;
    m->commit.num_tokens = o->n;
    if (o->flags & KVS_POP_HAS_TOKENS) {
      m->commit.n_tokens = o->tok_n;
      m->commit.tokens = o->tok_n ? (uint32_t *)data + o->tok_off : NULL;
    }
    m->commit.n_blocks = o->blk_n;
    m->commit.blocks = o->blk_n ? (uint32_t *)data + o->blk_off : NULL;
    req->op_case = KVSHARE__REQUEST__OP_COMMIT;
    req->commit = &m->commit;
    break;
  case 5:
    kvshare__fork__init(&m->fork);
    m->fork.req_id = o->req_id;
    m->fork.child_id = o->arg;
    req->op_case = KVSHARE__REQUEST__OP_FORK;
    req->fork = &m->fork;
    break;
  case 6:
    kvshare__free__init(&m->free);
    m->free.req_id = o->req_id;
    req->op_case = KVSHARE__REQUEST__OP_FREE;
    req->free = &m->free;
    break;
  case 7:
    kvshare__preempt__init(&m->preempt);
    m->preempt.req_id = o->req_id;
    req->op_case = KVSHARE__REQUEST__OP_PREEMPT;
    req->preempt = &m->preempt;
    break;
  default:
    disp_status(resp, a, KVS_EINVAL, "op %zu: op %u has no record form "
                "(packed and compact records carry Lookup, Allocate, Append, "
                "Commit, Fork, Free and Preempt only)", i, (unsigned)o->op);
    return NULL;
  }
  return req;
}

/* The result record of op i's Response; its blocks go to data at *nd. */
void disp_pack_result(const Kvshare__Response *r, uint8_t *rec,
                        uint32_t *data, uint32_t *nd) {
  kvs_pres p;
  const uint32_t *blocks = NULL;
  size_t n = 0;

  memset(&p, 0, sizeof(p));
  p.status = r->status ? r->status->code : 0;
  switch (r->result_case) {
  case KVSHARE__RESPONSE__RESULT_LOOKUP:
    p.x = r->lookup->hit_tokens;
    p.y = r->lookup->below_tokens;
    blocks = r->lookup->blocks;
    n = r->lookup->n_blocks;
    break;
  case KVSHARE__RESPONSE__RESULT_ALLOC:
    p.x = r->alloc->first_index;
    p.y = r->alloc->cow_index;
    p.cow_src = r->alloc->cow_src;
    p.cow_dst = r->alloc->cow_dst;
    p.flags = (uint8_t)((r->alloc->has_cow ? KVS_PRES_HAS_COW : 0) |
                        (r->alloc->cow_copied ? KVS_PRES_COW_COPIED : 0));
    blocks = r->alloc->blocks;
    n = r->alloc->n_blocks;
    break;
  case KVSHARE__RESPONSE__RESULT_COMMIT:
    p.x = r->commit->sealed;
    break;
  default:
    break;
  }
  p.blk_off = *nd;
  p.blk_n = (uint32_t)n;
  if (n)
    memcpy(data + *nd, blocks, n * sizeof(*blocks));
  *nd += (uint32_t)n;
  kvs_pres_put(rec, &p);
}

/* Does a failed op's status still carry its message (disp_batch_trim)? */
static int has_message(const Kvshare__Response *r) {
  return r->status && r->status->code != 0 && r->status->message &&
         r->status->message[0];
}

static size_t result_blocks(const Kvshare__Response *r) {
  if (r->result_case == KVSHARE__RESPONSE__RESULT_LOOKUP)
    return r->lookup->n_blocks;
  if (r->result_case == KVSHARE__RESPONSE__RESULT_ALLOC)
    return r->alloc->n_blocks;
  return 0;
}

void disp_packed_batch(sess *c, const Kvshare__PackedBatch *pb,
                       Kvshare__Response *resp, kvs__arena *a) {
  size_t n = pb->ops.len / KVS_PACKED_OP_SIZE, i, nblocks = 0, nmsg = 0,
         failed = 0;
  Kvshare__PackedBatchResult *res;
  Kvshare__Response *rs;
  uint32_t nd = 0;

  if (pb->ops.len % KVS_PACKED_OP_SIZE || pb->data.len % 4) {
    disp_status(resp, a, KVS_EINVAL, "packed batch of %zu op bytes and %zu "
                "data bytes: not whole %u-byte ops and 4-byte words",
                pb->ops.len, pb->data.len, KVS_PACKED_OP_SIZE);
    return;
  }
  if (n > c->srv->cfg->max_batch_ops) {
    disp_status(resp, a, KVS_ELIMIT, "batch of %zu ops is over "
                "max_batch_ops (%u); none ran", n, c->srv->cfg->max_batch_ops);
    return;
  }
  res = kvs__arena_alloc(a, sizeof(*res));
  rs = n ? kvs__arena_alloc(a, n * sizeof(*rs)) : NULL;
  if (!res || (n && !rs)) {
    disp_status(resp, a, KVS_ENOMEM, "out of memory");
    return;
  }
  kvshare__packed_batch_result__init(res);
  c->in_batch = 1;
  for (i = 0; i < n; i++) {
    Kvshare__Request req;
    disp_packed_msg m;
    kvs_pop o;

    kvshare__response__init(&rs[i]);
    kvs_pop_get(pb->ops.data + i * KVS_PACKED_OP_SIZE, &o);
    if (disp_packed_op(&o, i, (const uint32_t *)(const void *)pb->data.data,
                       pb->data.len / 4, &req, &m, &rs[i], a))
      disp_request(c, &req, &rs[i], a);
    disp_batch_trim(&rs[i], &failed);
    nmsg += has_message(&rs[i]);
    nblocks += result_blocks(&rs[i]);
  }
  c->in_batch = 0;
  if (nblocks > UINT32_MAX) { /* never: the reply bound keeps it in a frame */
    disp_status(resp, a, KVS_ELIMIT, "%zu block ids in one reply", nblocks);
    return;
  }
  res->results.len = n * KVS_PACKED_RESULT_SIZE;
  res->results.data = n ? kvs__arena_alloc(a, res->results.len) : NULL;
  res->data.len = nblocks * 4;
  res->data.data = nblocks ? kvs__arena_alloc(a, res->data.len) : NULL;
  res->message_ops = nmsg ? kvs__arena_alloc(a, nmsg * sizeof(uint32_t))
                          : NULL;
  res->messages = nmsg ? kvs__arena_alloc(a, nmsg * sizeof(char *)) : NULL;
  if ((n && !res->results.data) || (nblocks && !res->data.data) ||
      (nmsg && (!res->message_ops || !res->messages))) {
    disp_status(resp, a, KVS_ENOMEM, "out of memory after the ops ran");
    return;
  }
  for (i = 0; i < n; i++) {
    disp_pack_result(&rs[i], res->results.data + i * KVS_PACKED_RESULT_SIZE,
                     (uint32_t *)(void *)res->data.data, &nd);
    if (has_message(&rs[i])) {
      res->message_ops[res->n_message_ops++] = (uint32_t)i;
      res->messages[res->n_messages++] = rs[i].status->message;
    }
  }
  resp->result_case = KVSHARE__RESPONSE__RESULT_PACKED_BATCH;
  resp->packed_batch = res;
  disp_ok(resp);
}
