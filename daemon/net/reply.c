/*
 * reply.c — the daemon's replies on the wire: their size and encoding
 * (a Batch's by hand, each reply sized once), and the most a request's reply
 * can take, known before the request runs.
 */
#include "daemon/net/server.h"
#include "kvs_packed.h"

static size_t varint_size(uint64_t v) {
  size_t n = 1;

  while (v >= 0x80) {
    v >>= 7;
    n++;
  }
  return n;
}

static uint8_t *put_varint(uint8_t *p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  *p++ = (uint8_t)v;
  return p;
}

/* Field numbers and tags of the messages written by hand below. */
#define TAG_LD(field) ((uint8_t)((field) << 3 | 2))
#define TAG_VARINT(field) ((uint8_t)((field) << 3))
enum {
  F_ENVELOPE_SEQ = 1, F_ENVELOPE_RESPONSE = 5, /* Envelope */
  F_RESPONSE_STATUS = 1, F_RESPONSE_BATCH = 6, /* Response */
  F_BATCH_REPLIES = 1                          /* BatchResult */
};

size_t disp_reply_size(disp_reply *r, kvs__arena *a, uint64_t seq,
                       const Kvshare__Response *resp) {
  size_t i, st;

  r->seq = seq;
  r->resp = resp;
  r->sizes = NULL;
  if (resp->result_case == KVSHARE__RESPONSE__RESULT_BATCH &&
      resp->batch->n_replies &&
      (r->sizes = kvs__arena_alloc(a, resp->batch->n_replies * sizeof(size_t)))) {
    /* Response { status, batch: BatchResult { replies... } } by hand;
     * each reply is sized once, here. */
    r->batch_size = 0;
    for (i = 0; i < resp->batch->n_replies; i++) {
      r->sizes[i] =
          kvshare__response__get_packed_size(resp->batch->replies[i]);
      r->batch_size += 1 + varint_size(r->sizes[i]) + r->sizes[i];
    }
    st = resp->status ? kvshare__status__get_packed_size(resp->status) : 0;
    r->resp_size = (resp->status ? 1 + varint_size(st) + st : 0) + 1 +
                   varint_size(r->batch_size) + r->batch_size;
  } else {
    r->resp_size = kvshare__response__get_packed_size(resp);
  }
  r->payload = (seq ? 1 + varint_size(seq) : 0) + 1 +
               varint_size(r->resp_size) + r->resp_size;
  return KVS_FRAME_HEADER_SIZE + r->payload;
}

void disp_reply_encode(const disp_reply *r, uint8_t *out) {
  const Kvshare__Response *resp = r->resp;
  uint8_t *p = out + KVS_FRAME_HEADER_SIZE;
  size_t i;

  kvs_frame_header_encode(out, (uint32_t)r->payload);
  if (r->seq) {
    *p++ = TAG_VARINT(F_ENVELOPE_SEQ);
    p = put_varint(p, r->seq);
  }
  *p++ = TAG_LD(F_ENVELOPE_RESPONSE);
  p = put_varint(p, r->resp_size);
  if (!r->sizes) {
    kvshare__response__pack(resp, p);
    return;
  }
  if (resp->status) {
    *p++ = TAG_LD(F_RESPONSE_STATUS);
    p = put_varint(p, kvshare__status__get_packed_size(resp->status));
    p += kvshare__status__pack(resp->status, p);
  }
  *p++ = TAG_LD(F_RESPONSE_BATCH);
  p = put_varint(p, r->batch_size);
  for (i = 0; i < resp->batch->n_replies; i++) {
    *p++ = TAG_LD(F_BATCH_REPLIES);
    p = put_varint(p, r->sizes[i]);
    p += kvshare__response__pack(resp->batch->replies[i], p);
  }
}

/*
 * The most the reply to req can take on the wire, known before it runs, so
 * that a request whose reply might not fit max_frame is refused before any
 * of its ops runs (nothing done and lost).  Generous by construction: every
 * varint at its widest, every result field present, messages at their
 * longest (a Status message is at most 255 bytes; in a Batch only the first
 * DISP_BATCH_MESSAGES failures carry one).  *mutates says whether any of
 * its ops changes anything (Stats and Ping do not: when their reply does not
 * fit, they are answered ETOOBIG after they ran, and nothing is lost).  The
 * block ids an op returns:
 * - Lookup: the hit blocks, at most one per block of its tokens;
 * - Allocate, Append: at most num_tokens / block_size + 2 (the last block
 *   partly written before, a copy-on-write block), never more than the
 *   pool has;
 * - SwapIn: the request's table, never more than the pool has.
 * A compact reply (compact.c) fits the same bound: its header (24 bytes)
 * is under BOUND_ENVELOPE, a result record (32) under BOUND_OP, a message
 * entry (8 + 255 + padding) under BOUND_MSG + BOUND_OP, and its blocks are
 * counted at 4 bytes each.
 * tests/fuzz checks it against every reply the fuzzer provokes.
 */
#define BOUND_OP 64u       /* Response framing, Status and its code, a
                              result's scalar fields */
#define BOUND_MSG 260u     /* a Status message with its tag and length */
#define BOUND_STATS 1536u  /* a StatsResult with its tiers and strings */
#define BOUND_ENVELOPE 32u /* Envelope { seq, response } around it */

static size_t blocks_bound(const sess *c, uint64_t n) {
  uint32_t nb = c->srv->layout.num_blocks;

  if (n > nb)
    n = nb;
  /* a varint each, or a u32 each in a compact reply */
  return (size_t)n * (c->compact ? 4 : varint_size(nb ? nb - 1 : 0));
}

static size_t op_bound(const sess *c, const Kvshare__Request *op) {
  uint32_t bs = c->srv->layout.block_size;

  switch (op->op_case) {
  case KVSHARE__REQUEST__OP_LOOKUP:
    return BOUND_OP + blocks_bound(c, op->lookup->n_tokens / bs + 1);
  case KVSHARE__REQUEST__OP_ALLOCATE:
    return BOUND_OP + blocks_bound(c, op->allocate->num_tokens / bs + 2);
  case KVSHARE__REQUEST__OP_APPEND:
    return BOUND_OP + blocks_bound(c, op->append->num_tokens / bs + 2);
  case KVSHARE__REQUEST__OP_SWAP_IN:
    return BOUND_OP + blocks_bound(c, UINT64_MAX);
  case KVSHARE__REQUEST__OP_STATS:
    return BOUND_STATS;
  case KVSHARE__REQUEST__OP_PING:
    return BOUND_OP + op->ping->payload.len;
  default:
    return BOUND_OP;
  }
}

/* Does op change anything (so that running it without the client hearing
 * of it would lose something)? */
static int op_mutates(const Kvshare__Request *op) {
  switch (op->op_case) {
  case KVSHARE__REQUEST__OP_STATS:
  case KVSHARE__REQUEST__OP_PING:
  case KVSHARE__REQUEST__OP_BATCH: /* inside a Batch: refused */
  case KVSHARE__REQUEST__OP_PACKED_BATCH:
  case KVSHARE__REQUEST__OP__NOT_SET:
    return 0;
  default:
    return 1;
  }
}

/* A PackedBatch's result records, their blocks and messages. */
static size_t packed_bound(const sess *c, const Kvshare__PackedBatch *pb) {
  uint32_t bs = c->srv->layout.block_size, nb = c->srv->layout.num_blocks;
  size_t n = pb->ops.len / KVS_PACKED_OP_SIZE, i, blocks = 0, msgs;

  for (i = 0; i < n; i++) {
    kvs_pop o;
    uint64_t k = 0;

    kvs_pop_get(pb->ops.data + i * KVS_PACKED_OP_SIZE, &o);
    if (o.op == 1)
      k = o.tok_n / bs + 1;
    else if (o.op == 2 || o.op == 3)
      k = o.n / bs + 2;
    blocks += k < nb ? k : nb;
  }
  msgs = n < DISP_BATCH_MESSAGES ? n : DISP_BATCH_MESSAGES;
  /* results and data with their tags and lengths; per message its op
   * index and its text */
  return 16 + n * KVS_PACKED_RESULT_SIZE + 4 * blocks + msgs * (6 + BOUND_MSG);
}

size_t disp_reply_bound(const sess *c, const Kvshare__Request *req,
                        int *mutates) {
  size_t n = BOUND_ENVELOPE + BOUND_OP + BOUND_MSG, i, msgs;

  if (req->op_case == KVSHARE__REQUEST__OP_PACKED_BATCH) {
    *mutates = 1;
    return n + packed_bound(c, req->packed_batch);
  }
  if (req->op_case != KVSHARE__REQUEST__OP_BATCH) {
    *mutates = op_mutates(req);
    return n + op_bound(c, req);
  }
  *mutates = 0;
  for (i = 0; i < req->batch->n_ops; i++) { /* + the reply's tag, length */
    n += 1 + 4 + op_bound(c, req->batch->ops[i]);
    *mutates |= op_mutates(req->batch->ops[i]);
  }
  msgs = req->batch->n_ops < DISP_BATCH_MESSAGES ? req->batch->n_ops
                                                 : DISP_BATCH_MESSAGES;
  return n + msgs * BOUND_MSG;
}
