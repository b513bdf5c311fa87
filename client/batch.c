/*
 * batch.c — libkvshare: the batch builder (many ops, one round trip).
 *
 * Ops (proto/kvs_op.h) are recorded as they are added, their arrays
 * copied into two growing pools and referenced by offset (the pools may
 * move); submit points them into the pools and hands the whole array to
 * kvs__call, which sends it as compactly as the daemon takes (a compact
 * frame of records, a PackedBatch, or a Batch of Envelopes).  The reply's
 * results stay with the batch (its arena, taken over from the client)
 * until the batch is reset, submitted again or freed.
 */
#include <stdlib.h>
#include <string.h>

#include "client/client_int.h"

/* Where an op's arrays are in the pools. */
typedef struct bref {
  size_t tok_off, blk_off;     /* in the u32 pool */
  size_t bytes_off;            /* in the byte pool (salt, ping payload) */
  kvs_op_keys *keys;           /* a Commit's engine keys (its own
                                  allocation), or NULL */
} bref;

struct kvs_batch {
  kvs_op *ops;
  bref *refs;
  uint32_t n, cap;
  uint32_t *u32;
  size_t nu32, capu32;
  uint8_t *bytes;
  size_t nbytes, capbytes;
  /* the results of the last submit, their arrays in arena */
  kvs_op_result *res;
  uint32_t rcap;
  kvs__arena arena;
  int submitted;
};

int kvs_batch_new(kvs_batch **out) {
  if (!out)
    return KVS_EINVAL;
  *out = calloc(1, sizeof **out);
  return *out ? 0 : KVS_ENOMEM;
}

/* The ops' engine keys go (their ops are being dropped). */
static void drop_keys(kvs_batch *b) {
  for (uint32_t i = 0; i < b->n; i++) {
    free(b->refs[i].keys);
    b->refs[i].keys = NULL;
  }
}

/* Frees the last reply (its results become invalid). */
static void drop_reply(kvs_batch *b) {
  kvs__arena_reset(&b->arena);
  b->submitted = 0;
}

void kvs_batch_free(kvs_batch *b) {
  if (!b)
    return;
  drop_keys(b);
  kvs__arena_destroy(&b->arena);
  free(b->ops);
  free(b->refs);
  free(b->u32);
  free(b->bytes);
  free(b->res);
  free(b);
}

void kvs_batch_reset(kvs_batch *b) {
  if (!b)
    return;
  drop_reply(b);
  drop_keys(b);
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
static kvs_op *add(kvs_batch *b, uint8_t code) {
  if (b->submitted) {
    b->submitted = 0;
    drop_keys(b);
    b->n = 0;
    b->nu32 = 0;
    b->nbytes = 0;
  }
  if (b->n == INT32_MAX)
    return NULL;
  size_t cap = b->cap, rcap = b->cap;
  if (grow((void **)&b->ops, &cap, (size_t)b->n + 1, sizeof(kvs_op)) ||
      grow((void **)&b->refs, &rcap, (size_t)b->n + 1, sizeof(bref)))
    return NULL;
  b->cap = (uint32_t)(cap < rcap ? cap : rcap);
  kvs_op *o = &b->ops[b->n];
  memset(o, 0, sizeof *o);
  memset(&b->refs[b->n], 0, sizeof(bref));
  o->code = code;
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
  if (!b || (n && !tokens) || (salt_len && !salt) || salt_len > UINT32_MAX)
    return KVS_EINVAL;
  kvs_op *o = add(b, KVS_OP_LOOKUP);
  if (!o)
    return KVS_ENOMEM;
  bref *f = &b->refs[b->n];
  o->req_id = req_id;
  o->ntokens = n;
  o->nbytes = (uint32_t)salt_len;
  if (put_u32(b, tokens, n, &f->tok_off) ||
      put_bytes(b, salt, salt_len, &f->bytes_off))
    return KVS_ENOMEM;
  return commit_op(b);
}

static int add_simple(kvs_batch *b, uint8_t code, uint64_t req_id,
                      uint64_t child_id, uint32_t n) {
  if (!b)
    return KVS_EINVAL;
  kvs_op *o = add(b, code);
  if (!o)
    return KVS_ENOMEM;
  o->req_id = req_id;
  o->child_id = child_id;
  o->num_tokens = n;
  return commit_op(b);
}

int kvs_batch_allocate(kvs_batch *b, uint64_t req_id, uint32_t num_tokens) {
  return add_simple(b, KVS_OP_ALLOCATE, req_id, 0, num_tokens);
}

int kvs_batch_append(kvs_batch *b, uint64_t req_id, uint32_t num_tokens) {
  return add_simple(b, KVS_OP_APPEND, req_id, 0, num_tokens);
}

int kvs_batch_fork(kvs_batch *b, uint64_t req_id, uint64_t child_id) {
  return add_simple(b, KVS_OP_FORK, req_id, child_id, 0);
}

int kvs_batch_free_req(kvs_batch *b, uint64_t req_id) {
  return add_simple(b, KVS_OP_FREE, req_id, 0, 0);
}

int kvs_batch_preempt(kvs_batch *b, uint64_t req_id) {
  return add_simple(b, KVS_OP_PREEMPT, req_id, 0, 0);
}

int kvs_batch_commit(kvs_batch *b, uint64_t req_id, uint32_t start,
                     const uint32_t *tokens, uint32_t n,
                     const uint32_t *blocks, uint32_t nblocks) {
  return kvs_batch_commit_keys(b, req_id, start, tokens, n, blocks, nblocks,
                               NULL);
}

int kvs_batch_commit_keys(kvs_batch *b, uint64_t req_id, uint32_t start,
                          const uint32_t *tokens, uint32_t n,
                          const uint32_t *blocks, uint32_t nblocks,
                          const kvs_block_keys *keys) {
  kvs_op_keys *k = NULL;
  int rc;

  if (!b || (nblocks && !blocks))
    return KVS_EINVAL;
  kvs_op *o = add(b, KVS_OP_COMMIT);
  if (!o)
    return KVS_ENOMEM;
  bref *f = &b->refs[b->n];
  o->req_id = req_id;
  o->start = start;
  o->num_tokens = n;
  o->ntokens = tokens ? n : 0; /* (pointed into the pool at submit) */
  o->nblocks = nblocks;
  if (put_u32(b, tokens, tokens ? n : 0, &f->tok_off) ||
      put_u32(b, blocks, nblocks, &f->blk_off))
    return KVS_ENOMEM;
  if (keys && (k = kvs__keys_copy(keys, &rc)) == NULL)
    return rc; /* (the op is not counted: the next add takes its place) */
  f->keys = k;
  o->keys = k;
  return commit_op(b);
}

int kvs_batch_ping(kvs_batch *b, const void *payload, size_t len) {
  if (!b || (len && !payload) || len > UINT32_MAX)
    return KVS_EINVAL;
  kvs_op *o = add(b, KVS_OP_PING);
  if (!o)
    return KVS_ENOMEM;
  if (put_bytes(b, payload, len, &b->refs[b->n].bytes_off))
    return KVS_ENOMEM;
  o->nbytes = (uint32_t)len;
  return commit_op(b);
}

/* Points every op's arrays into the pools, as they are now. */
static void point(kvs_batch *b, int daemon_copy, int no_promote) {
  for (uint32_t i = 0; i < b->n; i++) {
    kvs_op *o = &b->ops[i];
    const bref *f = &b->refs[i];

    switch (o->code) {
    case KVS_OP_LOOKUP:
      o->tokens = b->u32 + f->tok_off;
      o->bytes = o->nbytes ? b->bytes + f->bytes_off : NULL;
      o->flags = no_promote ? KVS_OPF_NO_PROMOTE : 0;
      break;
    case KVS_OP_ALLOCATE:
    case KVS_OP_APPEND:
      o->flags = daemon_copy ? KVS_OPF_DAEMON_COPY : 0;
      break;
    case KVS_OP_COMMIT:
      o->tokens = o->ntokens ? b->u32 + f->tok_off : NULL;
      o->blocks = b->u32 + f->blk_off;
      break;
    case KVS_OP_PING:
      o->bytes = o->nbytes ? b->bytes + f->bytes_off : NULL;
      break;
    default:
      break;
    }
  }
}

int kvs_batch_submit(kvs_client *c, kvs_batch *b) {
  kvs_call call;
  int rc;

  if (!c || !b)
    return KVS_EINVAL;
  drop_reply(b);
  if (b->n > b->rcap) {
    kvs_op_result *nr = realloc(b->res, (size_t)b->n * sizeof(*nr));
    if (!nr)
      return KVS_ENOMEM;
    b->res = nr;
    b->rcap = b->n;
  }
  point(b, c->daemon_copy, c->no_promote);
  memset(&call, 0, sizeof call);
  call.shape = KVS_SHAPE_BATCH;
  call.ops = b->ops;
  call.nops = b->n;
  static kvs_op_result none;
  call.res = b->res ? b->res : &none;
  rc = kvs__call(c, &call);
  if (rc)
    return rc;
  kvs__take_reply(c, &b->arena); /* the results' arrays go with them */
  b->submitted = 1;
  return 0;
}

/* Op i's result, and its status in *rc. */
static const kvs_op_result *result_at(const kvs_batch *b, uint32_t i,
                                      int *rc) {
  if (!b || !b->submitted) {
    *rc = KVS_ESTATE;
    return NULL;
  }
  if (i >= b->n) {
    *rc = KVS_ERANGE;
    return NULL;
  }
  *rc = b->res[i].status;
  return &b->res[i];
}

int kvs_batch_status(const kvs_batch *b, uint32_t i) {
  int rc;
  result_at(b, i, &rc);
  return rc;
}

const char *kvs_batch_message(const kvs_batch *b, uint32_t i) {
  int rc;
  const kvs_op_result *r = result_at(b, i, &rc);
  if (!r || !r->status)
    return r && r->message ? r->message : "";
  /* Past the batch's first 16 failures the daemon sends the code alone. */
  if (!r->message || !r->message[0])
    return kvs_strerror(r->status);
  return r->message;
}

int kvs_batch_lookup_result(const kvs_batch *b, uint32_t i,
                            kvs_lookup_result *res) {
  int rc;
  const kvs_op_result *r = result_at(b, i, &rc);
  if (res)
    memset(res, 0, sizeof *res);
  if (!r || rc)
    return rc;
  if (b->ops[i].code != KVS_OP_LOOKUP)
    return KVS_EINVAL;
  kvs__lookup_result(r, res);
  return 0;
}

int kvs_batch_alloc_result(const kvs_batch *b, uint32_t i,
                           kvs_alloc_result *res) {
  int rc;
  const kvs_op_result *r = result_at(b, i, &rc);
  if (res) {
    memset(res, 0, sizeof *res);
    res->cow_src = res->cow_dst = KVS_BLOCK_NONE;
  }
  if (!r || rc)
    return rc;
  if (b->ops[i].code != KVS_OP_ALLOCATE && b->ops[i].code != KVS_OP_APPEND)
    return KVS_EINVAL;
  kvs__alloc_result(r, res);
  return 0;
}

int kvs_batch_commit_result(const kvs_batch *b, uint32_t i, uint32_t *sealed) {
  int rc;
  const kvs_op_result *r = result_at(b, i, &rc);
  if (sealed)
    *sealed = 0;
  if (!r || rc)
    return rc;
  if (b->ops[i].code != KVS_OP_COMMIT)
    return KVS_EINVAL;
  if (sealed)
    *sealed = r->u.commit.sealed;
  return 0;
}
