/*
 * codec.c — what the codecs share (kvs_codec.h): op names, calls, results'
 * errors and refusals, and the bound on a reply's size known before its
 * call runs.  It calls no other codec file: they call it.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "codec_int.h"
#include "kvs_status.h"

const char *kvs_op_name(unsigned code) {
  switch (code) {
#define KVS_OP_CASE(name, code, str)                                         \
  case code:                                                                 \
    return str;
    KVS_OP_MAP(KVS_OP_CASE)
#undef KVS_OP_CASE
  default:
    return NULL;
  }
}

/* A static message for when the arena cannot hold one. */
static const char nomem_msg[] = "out of memory";

static const char *vformat(kvs__arena *a, const char *fmt, va_list ap) {
  char *msg = kvs__arena_alloc(a, KVS_MESSAGE_MAX + 1);

  if (!msg)
    return NULL;
  vsnprintf(msg, KVS_MESSAGE_MAX + 1, fmt, ap);
  return msg;
}

/* *status, *message = code, the message formatted into the arena (ENOMEM,
 * "out of memory" when it cannot hold it). */
static void set_error(int32_t *status, const char **message, kvs__arena *a,
                      int code, const char *fmt, va_list ap) {
  *message = vformat(a, fmt, ap);
  *status = code;
  if (!*message) {
    *status = KVS_ENOMEM;
    *message = nomem_msg;
  }
}

void kvs_call_refuse(kvs_call *call, kvs__arena *a, int code,
                     const char *fmt, ...) {
  va_list ap;

  va_start(ap, fmt);
  set_error(&call->status, &call->message, a, code, fmt, ap);
  va_end(ap);
}

void kvs_result_error(kvs_op_result *r, kvs__arena *a, int code,
                      const char *fmt, ...) {
  va_list ap;

  va_start(ap, fmt);
  set_error(&r->status, &r->message, a, code, fmt, ap);
  va_end(ap);
}

int kvs_call_alloc(kvs_call *call, uint32_t n, kvs__arena *a) {
  size_t no = (n ? n : 1) * sizeof(kvs_op), nr = (n ? n : 1) *
                                                   sizeof(kvs_op_result);

  if (n == 1) {
    memset(&call->op1, 0, sizeof(call->op1));
    memset(&call->res1, 0, sizeof(call->res1));
    call->ops = &call->op1;
    call->res = &call->res1;
    call->nops = 1;
    return 0;
  }
  call->nops = 0;
  call->ops = kvs__arena_alloc(a, no);
  call->res = kvs__arena_alloc(a, nr);
  if (!call->ops || !call->res)
    return KVS_ENOMEM;
  memset(call->ops, 0, no);
  memset(call->res, 0, nr);
  call->nops = n;
  return 0;
}

/* ---- the bound on a reply ------------------------------------------------ */

/*
 * Generous by construction (kvs_codec.h).  A compact reply fits the same
 * constants: its header (24 bytes) is under BOUND_ENVELOPE, a result record
 * (32) under BOUND_OP, a message entry (8 + 255 + padding) under BOUND_MSG
 * + BOUND_OP, and its blocks are counted at 4 bytes each.  tests/fuzz
 * checks it against every reply the fuzzer provokes.
 */
#define BOUND_OP 64u       /* Response framing, Status and its code, a
                              result's scalar fields */
#define BOUND_MSG 260u     /* a Status message with its tag and length */
#define BOUND_STATS 5120u  /* a StatsResult with its tiers, its tenants
                              (16 of at most 200 bytes each) and strings */
#define BOUND_ENVELOPE 32u /* Envelope { seq, response } around it */

size_t kvs__varint_size(uint64_t v) {
  size_t n = 1;

  while (v >= 0x80) {
    v >>= 7;
    n++;
  }
  return n;
}

/* The block ids op can return, at most. */
static uint64_t op_blocks(const kvs_op *op, uint32_t bs, uint32_t nb) {
  uint64_t k;

  switch (op->code) {
  case KVS_OP_LOOKUP:
    k = op->ntokens / bs + 1;
    break;
  case KVS_OP_ALLOCATE:
  case KVS_OP_APPEND:
    k = op->num_tokens / bs + 2;
    break;
  case KVS_OP_SWAP_IN:
    k = nb;
    break;
  default:
    k = 0;
  }
  return k < nb ? k : nb;
}

/* Does op change anything, so that running it without the client hearing
 * of it would lose something? */
static int op_mutates(const kvs_op *op) {
  switch (op->code) {
  case KVS_OP_NONE: /* refused by the codec: does not run */
  case KVS_OP_STATS:
  case KVS_OP_PING:
    return 0;
  default:
    return 1;
  }
}

/* compact: block ids are u32s, else varints of up to nb - 1. */
static size_t op_bound(const kvs_op *op, uint32_t bs, uint32_t nb,
                       int compact) {
  uint64_t k;

  if (op->code == KVS_OP_STATS)
    return BOUND_STATS;
  if (op->code == KVS_OP_PING)
    return BOUND_OP + op->nbytes;
  k = op_blocks(op, bs, nb);
  return BOUND_OP + (size_t)k * (compact || k == 0
                                     ? 4
                                     : kvs__varint_size(nb ? nb - 1 : 0));
}

size_t kvs_reply_bound(const kvs_call *call, uint32_t bs, uint32_t nb,
                       int *mutates) {
  size_t n = BOUND_ENVELOPE + BOUND_OP + BOUND_MSG, i, msgs, blocks = 0;
  /* a varint each in an Envelope, a u32 each in a record */
  int compact = call->shape != KVS_SHAPE_OP && call->shape != KVS_SHAPE_BATCH;

  if (call->nops == 1 && !kvs_shape_is_batch(call->shape)) { /* (most) */
    *mutates = op_mutates(&call->ops[0]);
    return n + op_bound(&call->ops[0], bs, nb, compact);
  }
  *mutates = 0;
  msgs = call->nops < KVS_BATCH_MESSAGES ? call->nops : KVS_BATCH_MESSAGES;
  switch (call->shape) {
  case KVS_SHAPE_OP:
  case KVS_SHAPE_COMPACT_OP:
  case KVS_SHAPE_COMPACT_PING:
    return n + BOUND_OP; /* (no op: refused by the codec) */
  case KVS_SHAPE_BATCH:
    for (i = 0; i < call->nops; i++) { /* + the reply's tag and length */
      *mutates |= op_mutates(&call->ops[i]);
      n += 1 + 4 + op_bound(&call->ops[i], bs, nb, compact);
    }
    return n + msgs * BOUND_MSG;
  case KVS_SHAPE_PACKED:
  case KVS_SHAPE_COMPACT_BATCH:
    /* result records and their blocks with the fields' tags and lengths;
     * per message its op index and its text */
    for (i = 0; i < call->nops; i++) {
      *mutates |= op_mutates(&call->ops[i]);
      blocks += op_blocks(&call->ops[i], bs, nb);
    }
    return n + 16 + call->nops * KVS_PACKED_RESULT_SIZE + 4 * blocks +
           msgs * (6 + BOUND_MSG);
  default: /* a refusal: its status alone */
    for (i = 0; i < call->nops; i++)
      *mutates |= op_mutates(&call->ops[i]);
    return n;
  }
}
