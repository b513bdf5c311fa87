/* fuzz_gen.c — see fuzz_gen.h. */
#include "tests/fuzz/fuzz_gen.h"

#include "kvs_compact.h"
#include "kvs_packed.h"

#include <string.h>

#include "kvs_frame.h"

void fz_seed(fz_rng *r, uint64_t seed) {
  r->s = seed * 0x9e3779b97f4a7c15ull + 0x2545f4914f6cdd1dull;
  if (!r->s)
    r->s = 1;
}

uint64_t fz_next(fz_rng *r) { /* xorshift64* */
  r->s ^= r->s >> 12;
  r->s ^= r->s << 25;
  r->s ^= r->s >> 27;
  return r->s * 0x2545f4914f6cdd1dull;
}

uint32_t fz_below(fz_rng *r, uint32_t n) {
  return (uint32_t)((fz_next(r) >> 32) % n);
}

#define MAX_TOKENS 96
#define MAX_OPS 24

/* Storage for one random Request and what it points at. */
struct op_store {
  Kvshare__Request req;
  Kvshare__Lookup lookup;
  Kvshare__Allocate alloc;
  Kvshare__Append append;
  Kvshare__Commit commit;
  Kvshare__Fork fork;
  Kvshare__Free free_;
  Kvshare__Preempt preempt;
  Kvshare__Stats stats;
  Kvshare__Ping ping;
  Kvshare__SwapOut swap_out;
  Kvshare__SwapIn swap_in;
  uint32_t tokens[MAX_TOKENS];
  uint32_t blocks[8];
  uint8_t bytes[64];
};

static uint32_t some_count(fz_rng *r) {
  switch (fz_below(r, 8)) {
  case 0:
    return 0;
  case 1:
    return (uint32_t)fz_next(r); /* anything */
  case 2:
    return 1u << fz_below(r, 32);
  default:
    return 1 + fz_below(r, 40);
  }
}

static void fill_tokens(fz_rng *r, uint32_t *t, size_t n) {
  uint32_t stem = fz_below(r, 3);
  size_t i;

  /* A few shared stems, so lookups hit each other's prefixes; now and then
   * a token off the stem. */
  for (i = 0; i < n; i++)
    t[i] = fz_below(r, 16) ? stem * 1000 + (uint32_t)i : fz_below(r, 4);
}

static void random_op(fz_rng *r, struct op_store *o, int allow_batch) {
  uint64_t id = fz_below(r, 8);
  size_t n;

  kvshare__request__init(&o->req);
  switch (fz_below(r, allow_batch ? 12 : 11)) {
  case 0:
    kvshare__lookup__init(&o->lookup);
    o->lookup.req_id = id;
    n = fz_below(r, 8) ? 1 + fz_below(r, MAX_TOKENS) : 0;
    fill_tokens(r, o->tokens, n);
    o->lookup.n_tokens = n;
    o->lookup.tokens = o->tokens;
    if (!fz_below(r, 4)) {
      memset(o->bytes, (int)fz_below(r, 3), sizeof(o->bytes));
      o->lookup.salt.data = o->bytes;
      o->lookup.salt.len = fz_below(r, sizeof(o->bytes));
    }
    o->req.op_case = KVSHARE__REQUEST__OP_LOOKUP;
    o->req.lookup = &o->lookup;
    break;
  case 1:
    kvshare__allocate__init(&o->alloc);
    o->alloc.req_id = id;
    o->alloc.num_tokens = some_count(r);
    o->alloc.daemon_copy = fz_below(r, 2);
    o->req.op_case = KVSHARE__REQUEST__OP_ALLOCATE;
    o->req.allocate = &o->alloc;
    break;
  case 2:
    kvshare__append__init(&o->append);
    o->append.req_id = id;
    o->append.num_tokens = fz_below(r, 4) ? 1 : some_count(r);
    o->append.daemon_copy = fz_below(r, 2);
    o->req.op_case = KVSHARE__REQUEST__OP_APPEND;
    o->req.append = &o->append;
    break;
  case 3:
    kvshare__commit__init(&o->commit);
    o->commit.req_id = id;
    o->commit.start = fz_below(r, 4) ? fz_below(r, 64) : some_count(r);
    n = fz_below(r, 3) ? fz_below(r, MAX_TOKENS) : 0;
    fill_tokens(r, o->tokens, n);
    o->commit.n_tokens = n;
    o->commit.tokens = o->tokens;
    o->commit.num_tokens = fz_below(r, 2) ? (uint32_t)n : some_count(r);
    if (!fz_below(r, 3)) {
      size_t i, nb = fz_below(r, 8);

      for (i = 0; i < nb; i++)
        o->blocks[i] = fz_below(r, 4) ? fz_below(r, 300) : (uint32_t)fz_next(r);
      o->commit.n_blocks = nb;
      o->commit.blocks = o->blocks;
    }
    o->req.op_case = KVSHARE__REQUEST__OP_COMMIT;
    o->req.commit = &o->commit;
    break;
  case 4:
    kvshare__fork__init(&o->fork);
    o->fork.req_id = id;
    o->fork.child_id = fz_below(r, 8);
    o->req.op_case = KVSHARE__REQUEST__OP_FORK;
    o->req.fork = &o->fork;
    break;
  case 5:
    kvshare__free__init(&o->free_);
    o->free_.req_id = id;
    o->req.op_case = KVSHARE__REQUEST__OP_FREE;
    o->req.free = &o->free_;
    break;
  case 6:
    kvshare__preempt__init(&o->preempt);
    o->preempt.req_id = id;
    o->req.op_case = KVSHARE__REQUEST__OP_PREEMPT;
    o->req.preempt = &o->preempt;
    break;
  case 7:
    kvshare__stats__init(&o->stats);
    o->stats.check = fz_below(r, 2);
    o->req.op_case = KVSHARE__REQUEST__OP_STATS;
    o->req.stats = &o->stats;
    break;
  case 8:
    kvshare__ping__init(&o->ping);
    o->ping.payload.data = o->bytes;
    o->ping.payload.len = fz_below(r, sizeof(o->bytes));
    memset(o->bytes, 'p', sizeof(o->bytes));
    o->req.op_case = KVSHARE__REQUEST__OP_PING;
    o->req.ping = &o->ping;
    break;
  case 9:
    kvshare__swap_out__init(&o->swap_out);
    o->swap_out.req_id = id;
    o->req.op_case = KVSHARE__REQUEST__OP_SWAP_OUT;
    o->req.swap_out = &o->swap_out;
    break;
  case 10:
    kvshare__swap_in__init(&o->swap_in);
    o->swap_in.req_id = id;
    o->req.op_case = KVSHARE__REQUEST__OP_SWAP_IN;
    o->req.swap_in = &o->swap_in;
    break;
  default:
    break; /* a Batch: filled by the caller */
  }
}

/* A Batch that makes sense: lookup, allocate, commit, decode steps, maybe a
 * fork and a free — so that blocks get sealed, hit, shared and copied. */
static size_t coherent(fz_rng *r, struct op_store *ops) {
  uint64_t id = fz_below(r, 8), child = fz_below(r, 8);
  uint32_t n = 1 + fz_below(r, 40), stem = fz_below(r, 3), i, k = 0, steps;

  kvshare__lookup__init(&ops[k].lookup);
  for (i = 0; i < n; i++)
    ops[k].tokens[i] = stem * 1000 + i;
  ops[k].lookup.req_id = id;
  ops[k].lookup.n_tokens = n;
  ops[k].lookup.tokens = ops[k].tokens;
  ops[k].req.op_case = KVSHARE__REQUEST__OP_LOOKUP;
  ops[k].req.lookup = &ops[k].lookup;
  k++;
  kvshare__allocate__init(&ops[k].alloc);
  ops[k].alloc.req_id = id;
  ops[k].alloc.num_tokens = n;
  ops[k].req.op_case = KVSHARE__REQUEST__OP_ALLOCATE;
  ops[k].req.allocate = &ops[k].alloc;
  k++;
  kvshare__commit__init(&ops[k].commit);
  ops[k].commit.req_id = id;
  ops[k].commit.num_tokens = n;
  ops[k].req.op_case = KVSHARE__REQUEST__OP_COMMIT;
  ops[k].req.commit = &ops[k].commit;
  k++;
  if (fz_below(r, 2)) {
    kvshare__fork__init(&ops[k].fork);
    ops[k].fork.req_id = id;
    ops[k].fork.child_id = child;
    ops[k].req.op_case = KVSHARE__REQUEST__OP_FORK;
    ops[k].req.fork = &ops[k].fork;
  k++;
    if (fz_below(r, 2))
      id = child;
  }
  steps = fz_below(r, 6);
  for (i = 0; i < steps && k + 2 <= MAX_OPS; i++) {
    kvshare__append__init(&ops[k].append);
    ops[k].append.req_id = id;
    ops[k].append.num_tokens = 1;
    ops[k].append.daemon_copy = fz_below(r, 2);
    ops[k].req.op_case = KVSHARE__REQUEST__OP_APPEND;
    ops[k].req.append = &ops[k].append;
  k++;
    kvshare__commit__init(&ops[k].commit);
    ops[k].commit.req_id = id;
    ops[k].commit.start = n + i;
    ops[k].tokens[0] = 7 + fz_below(r, 2);
    ops[k].commit.n_tokens = 1;
    ops[k].commit.tokens = ops[k].tokens;
    ops[k].req.op_case = KVSHARE__REQUEST__OP_COMMIT;
    ops[k].req.commit = &ops[k].commit;
  k++;
  }
  if (fz_below(r, 3) == 0 && k < MAX_OPS) {
    kvshare__free__init(&ops[k].free_);
    ops[k].free_.req_id = fz_below(r, 2) ? id : child;
    ops[k].req.op_case = KVSHARE__REQUEST__OP_FREE;
    ops[k].req.free = &ops[k].free_;
  k++;
  }
  return k;
}

/* The batch of ops as a PackedBatch (proto/kvs_packed.h): the ops a packed
 * batch takes as records, any other as a record of an unknown kind; now and
 * then an array offset pushed out of the data, or a stray op byte. */
static void to_packed(fz_rng *r, Kvshare__Request **ops, size_t n,
                      Kvshare__PackedBatch *pb) {
  static uint8_t recs[MAX_OPS * KVS_PACKED_OP_SIZE];
  static uint32_t words[MAX_OPS * (MAX_TOKENS + 8)];
  size_t i, nw = 0;

  for (i = 0; i < n; i++) {
    const Kvshare__Request *q = ops[i];
    kvs_pop o;

    memset(&o, 0, sizeof(o));
    o.op = (uint8_t)q->op_case;
    switch (q->op_case) {
    case KVSHARE__REQUEST__OP_LOOKUP:
      o.req_id = q->lookup->req_id;
      o.tok_off = (uint32_t)nw;
      o.tok_n = (uint32_t)q->lookup->n_tokens;
      if (o.tok_n)
        memcpy(words + nw, q->lookup->tokens, o.tok_n * 4);
      nw += o.tok_n;
      o.flags = q->lookup->no_promote ? KVS_POP_NO_PROMOTE : 0;
      break;
    case KVSHARE__REQUEST__OP_ALLOCATE:
      o.req_id = q->allocate->req_id;
      o.n = q->allocate->num_tokens;
      o.flags = q->allocate->daemon_copy ? KVS_POP_DAEMON_COPY : 0;
      break;
    case KVSHARE__REQUEST__OP_APPEND:
      o.req_id = q->append->req_id;
      o.n = q->append->num_tokens;
      o.flags = q->append->daemon_copy ? KVS_POP_DAEMON_COPY : 0;
      break;
    case KVSHARE__REQUEST__OP_COMMIT:
      o.req_id = q->commit->req_id;
      o.arg = q->commit->start;
      o.n = q->commit->num_tokens;
      if (q->commit->n_tokens) {
        o.flags = KVS_POP_HAS_TOKENS;
        o.tok_off = (uint32_t)nw;
        o.tok_n = (uint32_t)q->commit->n_tokens;
        if (o.tok_n)
          memcpy(words + nw, q->commit->tokens, o.tok_n * 4);
        nw += o.tok_n;
      }
      o.blk_off = (uint32_t)nw;
      o.blk_n = (uint32_t)q->commit->n_blocks;
      if (o.blk_n)
        memcpy(words + nw, q->commit->blocks, o.blk_n * 4);
      nw += o.blk_n;
      break;
    case KVSHARE__REQUEST__OP_FORK:
      o.req_id = q->fork->req_id;
      o.arg = q->fork->child_id;
      break;
    case KVSHARE__REQUEST__OP_FREE:
      o.req_id = q->free->req_id;
      break;
    case KVSHARE__REQUEST__OP_PREEMPT:
      o.req_id = q->preempt->req_id;
      break;
    default: /* not packable: the daemon answers EINVAL in its slot */
      break;
    }
    switch (fz_below(r, 40)) {
    case 0:
      o.tok_off = fz_below(r, 2) ? UINT32_MAX - fz_below(r, 4)
                                 : (uint32_t)nw + 1;
      break;
    case 1:
      o.blk_n = (uint32_t)fz_next(r);
      break;
    case 2:
      o.op = (uint8_t)fz_next(r);
      break;
    case 3:
      o.arg = fz_next(r); /* a commit start past 2^32 */
      break;
    default:
      break;
    }
    kvs_pop_put(recs + i * KVS_PACKED_OP_SIZE, &o);
  }
  kvshare__packed_batch__init(pb);
  pb->ops.data = recs;
  pb->ops.len = n * KVS_PACKED_OP_SIZE;
  pb->data.data = (uint8_t *)words;
  pb->data.len = nw * 4;
  if (fz_below(r, 30) == 0) /* not whole records or words */
    fz_below(r, 2) ? (void)(pb->ops.len -= pb->ops.len ? 1 : 0)
                   : (void)(pb->data.len += pb->data.len ? -1 : 3);
}

size_t fz_request(fz_rng *r, uint64_t seq, uint8_t *out, size_t cap) {
  static struct op_store ops[MAX_OPS + 1];
  static Kvshare__Request *ptrs[MAX_OPS];
  Kvshare__Envelope env;
  Kvshare__Batch batch;
  Kvshare__PackedBatch packed;
  size_t len;

  random_op(r, &ops[MAX_OPS], 1);
  if (fz_below(r, 3) == 0) {
    size_t i, n;

    for (i = 0; i < MAX_OPS; i++)
      kvshare__request__init(&ops[i].req);
    n = coherent(r, ops);
    kvshare__batch__init(&batch);
    for (i = 0; i < n; i++)
      ptrs[i] = &ops[i].req;
    batch.n_ops = n;
    batch.ops = ptrs;
    kvshare__request__init(&ops[MAX_OPS].req);
    ops[MAX_OPS].req.op_case = KVSHARE__REQUEST__OP_BATCH;
    ops[MAX_OPS].req.batch = &batch;
  } else if (ops[MAX_OPS].req.op_case == KVSHARE__REQUEST__OP__NOT_SET) {
    size_t i, n = fz_below(r, MAX_OPS + 1);

    kvshare__batch__init(&batch);
    for (i = 0; i < n; i++) {
      random_op(r, &ops[i], 0);
      if (ops[i].req.op_case == KVSHARE__REQUEST__OP__NOT_SET) {
        /* a nested Batch (refused in its slot) */
        static Kvshare__Batch inner = KVSHARE__BATCH__INIT;

        ops[i].req.op_case = KVSHARE__REQUEST__OP_BATCH;
        ops[i].req.batch = &inner;
      }
      ptrs[i] = &ops[i].req;
    }
    batch.n_ops = n;
    batch.ops = ptrs;
    ops[MAX_OPS].req.op_case = KVSHARE__REQUEST__OP_BATCH;
    ops[MAX_OPS].req.batch = &batch;
  }
  if (ops[MAX_OPS].req.op_case == KVSHARE__REQUEST__OP_BATCH &&
      fz_below(r, 2) == 0) {
    to_packed(r, batch.ops, batch.n_ops, &packed);
    ops[MAX_OPS].req.op_case = KVSHARE__REQUEST__OP_PACKED_BATCH;
    ops[MAX_OPS].req.packed_batch = &packed;
  }
  kvshare__envelope__init(&env);
  env.seq = seq;
  env.body_case = KVSHARE__ENVELOPE__BODY_REQUEST;
  env.request = &ops[MAX_OPS].req;
  len = kvshare__envelope__get_packed_size(&env);
  if (len > cap)
    return 0;
  return kvshare__envelope__pack(&env, out);
}

size_t fz_compact(fz_rng *r, uint64_t seq, uint8_t *out, size_t cap) {
  static struct op_store ops[MAX_OPS];
  static Kvshare__Request *ptrs[MAX_OPS];
  Kvshare__PackedBatch pb;
  kvs_compact_req h;
  size_t i, n, len;
  uint32_t k = fz_below(r, 20);

  memset(&h, 0, sizeof(h));
  h.seq = seq;
  if (k < 2) { /* a Ping */
    h.kind = KVS_COMPACT_PING;
    h.count = fz_below(r, 64);
    len = KVS_COMPACT_HDR + h.count;
    if (len > cap)
      return 0;
    kvs_compact_req_put(out, &h);
    for (i = 0; i < h.count; i++)
      out[KVS_COMPACT_HDR + i] = (uint8_t)fz_next(r);
    return len;
  }
  if (k < 11) { /* one op, any (those with no record form are refused) */
    kvshare__request__init(&ops[0].req);
    random_op(r, &ops[0], 0);
    n = 1;
    h.kind = KVS_COMPACT_OP;
  } else { /* a batch that makes sense */
    for (i = 0; i < MAX_OPS; i++)
      kvshare__request__init(&ops[i].req);
    n = coherent(r, ops);
    h.kind = KVS_COMPACT_BATCH;
  }
  for (i = 0; i < n; i++)
    ptrs[i] = &ops[i].req;
  to_packed(r, ptrs, n, &pb); /* (now and then a bad offset or op) */
  h.count = (uint32_t)n;
  h.words = (uint32_t)(pb.data.len / 4);
  len = KVS_COMPACT_HDR + pb.ops.len + pb.data.len;
  if (len > cap)
    return 0;
  switch (fz_below(r, 40)) { /* a header that lies */
  case 0:
    h.kind = (uint8_t)fz_next(r);
    break;
  case 1:
    h.count += 1 + fz_below(r, 3);
    break;
  case 2:
    h.words = (uint32_t)fz_next(r);
    break;
  case 3:
    h.kind = KVS_COMPACT_OP; /* one op with several records */
    break;
  default:
    break;
  }
  kvs_compact_req_put(out, &h);
  if (fz_below(r, 40) == 0)
    out[9 + fz_below(r, 3)] = (uint8_t)(1 + fz_below(r, 255)); /* reserved */
  memcpy(out + KVS_COMPACT_HDR, pb.ops.data, pb.ops.len);
  if (pb.data.len)
    memcpy(out + KVS_COMPACT_HDR + pb.ops.len, pb.data.data, pb.data.len);
  return len;
}

size_t fz_hello(uint64_t seq, uint8_t *out, size_t cap) {
  Kvshare__Envelope env;
  Kvshare__Hello h;

  kvshare__envelope__init(&env);
  kvshare__hello__init(&h);
  h.version = KVS_PROTO_VERSION;
  h.client_name = (char *)"fuzz";
  env.seq = seq;
  env.body_case = KVSHARE__ENVELOPE__BODY_HELLO;
  env.hello = &h;
  if (kvshare__envelope__get_packed_size(&env) > cap)
    return 0;
  return kvshare__envelope__pack(&env, out);
}

size_t fz_mutate(fz_rng *r, uint8_t *buf, size_t len, size_t cap) {
  unsigned k, rounds = 1 + fz_below(r, 4);

  for (k = 0; k < rounds; k++) {
    switch (fz_below(r, 6)) {
    case 0: /* flip a bit */
      if (len)
        buf[fz_below(r, (uint32_t)len)] ^= (uint8_t)(1u << fz_below(r, 8));
      break;
    case 1: /* a random byte */
      if (len)
        buf[fz_below(r, (uint32_t)len)] = (uint8_t)fz_next(r);
      break;
    case 2: /* cut the tail */
      if (len)
        len = fz_below(r, (uint32_t)len);
      break;
    case 3: /* insert random bytes */
      if (len < cap) {
        size_t at = fz_below(r, (uint32_t)len + 1), n = 1 + fz_below(r, 8);

        if (n > cap - len)
          n = cap - len;
        memmove(buf + at + n, buf + at, len - at);
        for (size_t i = 0; i < n; i++)
          buf[at + i] = (uint8_t)fz_next(r);
        len += n;
      }
      break;
    case 4: /* a big varint (a length or a count) */
      if (len >= 5) {
        size_t at = fz_below(r, (uint32_t)len - 4);

        buf[at] = 0xff;
        buf[at + 1] = 0xff;
        buf[at + 2] = 0xff;
        buf[at + 3] = 0xff;
        buf[at + 4] = 0x0f;
      }
      break;
    default: /* duplicate a slice (a repeated field twice, a oneof twice) */
      if (len && len < cap) {
        size_t from = fz_below(r, (uint32_t)len);
        size_t n = 1 + fz_below(r, (uint32_t)(len - from));

        if (n > cap - len)
          n = cap - len;
        memmove(buf + from + n, buf + from, len - from);
        len += n;
      }
      break;
    }
  }
  return len;
}

size_t fz_frame(fz_rng *r, uint64_t seq, uint8_t *out, size_t cap,
                int keep_framing) {
  uint32_t kind = keep_framing ? 3 + fz_below(r, 87) : fz_below(r, 100);
  size_t len;
  int compact;

  if (cap < KVS_FRAME_HEADER_SIZE + 64)
    return 0;
  if (kind < 3) { /* garbage bytes */
    len = 1 + fz_below(r, 64);
    for (size_t i = 0; i < len; i++)
      out[i] = (uint8_t)fz_next(r);
    return len;
  }
  compact = kind >= 6 && fz_below(r, 4) == 0;
  if (kind < 6) /* a Hello after the handshake */
    len = fz_hello(seq, out + KVS_FRAME_HEADER_SIZE,
                   cap - KVS_FRAME_HEADER_SIZE);
  else if (compact)
    len = fz_compact(r, seq, out + KVS_FRAME_HEADER_SIZE,
                     cap - KVS_FRAME_HEADER_SIZE);
  else
    len = fz_request(r, seq, out + KVS_FRAME_HEADER_SIZE,
                     cap - KVS_FRAME_HEADER_SIZE);
  if (kind >= 60 && kind < 90) /* a mutated payload, framed honestly */
    len = fz_mutate(r, out + KVS_FRAME_HEADER_SIZE, len,
                    cap - KVS_FRAME_HEADER_SIZE);
  kvs_frame_header_encode_flags(out, (uint32_t)len,
                                compact ? KVS_FRAME_COMPACT : 0);
  len += KVS_FRAME_HEADER_SIZE;
  if (kind >= 90 && kind < 95) /* a mutated header */
    out[fz_below(r, KVS_FRAME_HEADER_SIZE)] ^= (uint8_t)(1u << fz_below(r, 8));
  else if (kind >= 95) /* mutate the whole frame */
    len = fz_mutate(r, out, len, cap);
  return len;
}
