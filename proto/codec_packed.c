/*
 * codec_packed.c — the fixed-width records (kvs_packed.h): every op that
 * has one, and its result, both ways.  PackedBatch (codec_envelope.c) and
 * compact frames (codec_compact.c) carry these records.
 *
 * Records carry Lookup (without a salt), Allocate, Append, Commit, Fork,
 * Free and Preempt; their op byte is the op's code.  A record that names
 * another op, or whose arrays fall outside the data sent with it, fails
 * alone with EINVAL.
 */
#include <string.h>

#include "codec_int.h"
#include "kvs_status.h"

void kvs__record_decode(const uint8_t *rec, size_t i, const uint32_t *data,
                        size_t words, kvs_op *op, kvs_op_result *res,
                        kvs__arena *a) {
  kvs_pop o;
  int has_tokens;

  kvs_pop_get(rec, &o); /* (op and res come zeroed: kvs_call_alloc) */
  has_tokens = o.op == KVS_OP_LOOKUP ||
               (o.op == KVS_OP_COMMIT && (o.flags & KVS_POP_HAS_TOKENS));
  if ((has_tokens && !kvs_packed_in(o.tok_off, o.tok_n, words)) ||
      (o.op == KVS_OP_COMMIT && !kvs_packed_in(o.blk_off, o.blk_n, words))) {
    kvs_result_error(res, a, KVS_EINVAL, "op %zu: its arrays are outside "
                     "the %zu data words sent with it", i, words);
    return;
  }
  op->req_id = o.req_id;
  switch (o.op) {
  case KVS_OP_LOOKUP:
    op->tokens = o.tok_n ? data + o.tok_off : NULL;
    op->ntokens = o.tok_n;
    op->flags = o.flags & KVS_POP_NO_PROMOTE ? KVS_OPF_NO_PROMOTE : 0;
    break;
  case KVS_OP_ALLOCATE:
  case KVS_OP_APPEND:
    op->num_tokens = o.n;
    op->flags = o.flags & KVS_POP_DAEMON_COPY ? KVS_OPF_DAEMON_COPY : 0;
    break;
  case KVS_OP_COMMIT:
    if (o.arg > UINT32_MAX) {
      kvs_result_error(res, a, KVS_ERANGE, "op %zu: commit start %llu is "
                       "out of range", i, (unsigned long long)o.arg);
      return;
    }
    op->start = (uint32_t)o.arg;
    op->num_tokens = o.n;
    if (has_tokens) {
      op->tokens = o.tok_n ? data + o.tok_off : NULL;
      op->ntokens = o.tok_n;
    }
    op->blocks = o.blk_n ? data + o.blk_off : NULL;
    op->nblocks = o.blk_n;
    break;
  case KVS_OP_FORK:
    op->child_id = o.arg;
    break;
  case KVS_OP_FREE:
  case KVS_OP_PREEMPT:
    break;
  default:
    kvs_result_error(res, a, KVS_EINVAL, "op %zu: op %u has no record form "
                     "(packed and compact records carry Lookup, Allocate, "
                     "Append, Commit, Fork, Free and Preempt only)", i,
                     (unsigned)o.op);
    op->req_id = 0;
    return;
  }
  op->code = o.op;
}

int kvs_op_has_record(const kvs_op *op) {
  switch (op->code) {
  case KVS_OP_LOOKUP:
    return op->nbytes == 0; /* (its bytes are its salt) */
  case KVS_OP_COMMIT:
    return op->keys == NULL; /* (the engine's keys go in a Commit message) */
  case KVS_OP_ALLOCATE:
  case KVS_OP_APPEND:
  case KVS_OP_FORK:
  case KVS_OP_FREE:
  case KVS_OP_PREEMPT:
    return 1;
  default:
    return 0;
  }
}

uint32_t kvs__record_words(const kvs_op *op) {
  if (op->code == KVS_OP_LOOKUP)
    return op->ntokens;
  if (op->code == KVS_OP_COMMIT)
    return op->ntokens + op->nblocks;
  return 0;
}

uint64_t kvs_records_size(const kvs_call *call) {
  uint64_t words = 0;

  for (uint32_t i = 0; i < call->nops; i++) {
    if (!kvs_op_has_record(&call->ops[i]))
      return 0;
    words += kvs__record_words(&call->ops[i]);
  }
  return (uint64_t)call->nops * KVS_PACKED_OP_SIZE + words * 4;
}

void kvs__record_encode(const kvs_op *op, uint8_t *rec, uint8_t *data,
                        uint32_t *nd) {
  kvs_pop p;

  memset(&p, 0, sizeof(p));
  p.op = op->code;
  p.req_id = op->req_id;
  switch (op->code) {
  case KVS_OP_LOOKUP:
    p.flags = op->flags & KVS_OPF_NO_PROMOTE ? KVS_POP_NO_PROMOTE : 0;
    p.tok_off = *nd;
    p.tok_n = op->ntokens;
    break;
  case KVS_OP_ALLOCATE:
  case KVS_OP_APPEND:
    p.n = op->num_tokens;
    p.flags = op->flags & KVS_OPF_DAEMON_COPY ? KVS_POP_DAEMON_COPY : 0;
    break;
  case KVS_OP_COMMIT:
    p.arg = op->start;
    p.n = op->num_tokens;
    if (op->tokens) {
      p.flags = KVS_POP_HAS_TOKENS;
      p.tok_off = *nd;
      p.tok_n = op->ntokens;
    }
    p.blk_off = *nd + (op->tokens ? op->ntokens : 0);
    p.blk_n = op->nblocks;
    break;
  case KVS_OP_FORK:
    p.arg = op->child_id;
    break;
  default:
    break;
  }
  if (p.tok_n)
    memcpy(data + (size_t)p.tok_off * 4, op->tokens, (size_t)p.tok_n * 4);
  if (p.blk_n)
    memcpy(data + (size_t)p.blk_off * 4, op->blocks, (size_t)p.blk_n * 4);
  *nd += p.tok_n + p.blk_n;
  kvs_pop_put(rec, &p);
}

void kvs__result_record_encode(unsigned code, const kvs_op_result *r,
                               uint8_t *rec, uint32_t *data, uint32_t *nd) {
  kvs_pres p;
  uint32_t n = 0;

  memset(&p, 0, sizeof(p));
  p.status = r->status;
  if (r->status == 0) {
    switch (code) {
    case KVS_OP_LOOKUP:
      p.x = r->u.lookup.hit_tokens;
      p.y = r->u.lookup.below_tokens;
      n = r->nblocks;
      break;
    case KVS_OP_ALLOCATE:
    case KVS_OP_APPEND:
      p.x = r->u.alloc.first_index;
      p.y = r->u.alloc.cow_index;
      p.cow_src = r->u.alloc.cow_src;
      p.cow_dst = r->u.alloc.cow_dst;
      p.flags = (uint8_t)((r->u.alloc.has_cow ? KVS_PRES_HAS_COW : 0) |
                          (r->u.alloc.cow_copied ? KVS_PRES_COW_COPIED : 0));
      n = r->nblocks;
      break;
    case KVS_OP_COMMIT:
      p.x = r->u.commit.sealed;
      break;
    default:
      break;
    }
  }
  p.blk_off = *nd;
  p.blk_n = n;
  if (n)
    memcpy(data + *nd, r->blocks, (size_t)n * 4);
  *nd += n;
  kvs_pres_put(rec, &p);
}

int kvs__result_record_decode(unsigned code, const uint8_t *rec,
                              const uint32_t *data, size_t words,
                              kvs_op_result *r) {
  kvs_pres p;

  kvs_pres_get(rec, &p);
  if (!kvs_packed_in(p.blk_off, p.blk_n, words) || p.status > 0)
    return KVS_EPROTO;
  r->status = p.status;
  if (p.status)
    return 0; /* (its message, if any, comes apart) */
  r->blocks = p.blk_n ? data + p.blk_off : NULL;
  r->nblocks = p.blk_n;
  switch (code) {
  case KVS_OP_LOOKUP:
    r->u.lookup.hit_tokens = p.x;
    r->u.lookup.below_tokens = p.y;
    return 0;
  case KVS_OP_ALLOCATE:
  case KVS_OP_APPEND:
    r->u.alloc.first_index = p.x;
    r->u.alloc.cow_index = p.y;
    r->u.alloc.cow_src = p.cow_src;
    r->u.alloc.cow_dst = p.cow_dst;
    r->u.alloc.has_cow = (p.flags & KVS_PRES_HAS_COW) != 0;
    r->u.alloc.cow_copied = (p.flags & KVS_PRES_COW_COPIED) != 0;
    return 0;
  case KVS_OP_COMMIT:
    r->u.commit.sealed = p.x;
    return 0;
  default: /* Fork, Free, Preempt: no result, no blocks either */
    return p.blk_n ? KVS_EPROTO : 0;
  }
}

int kvs__records_decode(kvs_call *call, const uint8_t *recs, size_t nrec,
                        const uint32_t *data, size_t words,
                        uint32_t max_batch_ops, kvs__arena *a) {
  if (nrec > max_batch_ops) {
    kvs_call_refuse(call, a, KVS_ELIMIT, "batch of %zu ops is over "
                    "max_batch_ops (%u); none ran", nrec, max_batch_ops);
    return 0;
  }
  if (kvs_call_alloc(call, (uint32_t)nrec, a) < 0)
    return KVS_ENOMEM;
  for (size_t i = 0; i < nrec; i++)
    kvs__record_decode(recs + i * KVS_PACKED_OP_SIZE, i, data, words,
                       &call->ops[i], &call->res[i], a);
  return 0;
}

void kvs__results_count(const kvs_call *call, size_t *words, size_t *nmsg) {
  *words = *nmsg = 0;
  for (uint32_t i = 0; i < call->nops; i++) {
    const kvs_op_result *r = &call->res[i];
    unsigned code = call->ops[i].code;

    if (r->status == 0 && (code == KVS_OP_LOOKUP ||
                           code == KVS_OP_ALLOCATE || code == KVS_OP_APPEND))
      *words += r->nblocks;
    *nmsg += kvs__has_message(r);
  }
}

void kvs__results_write(const kvs_call *call, uint8_t *recs, uint32_t *data) {
  uint32_t nd = 0;

  for (uint32_t i = 0; i < call->nops; i++)
    kvs__result_record_encode(call->ops[i].code, &call->res[i],
                              recs + (size_t)i * KVS_PACKED_RESULT_SIZE, data,
                              &nd);
}
