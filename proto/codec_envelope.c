/*
 * codec_envelope.c — the protobuf codec (kvshare.proto): every op as a
 * Request and its result as a Response, both ways; Batch and PackedBatch
 * around them; Hello and Welcome.
 *
 * The daemon decodes Requests into ops and encodes results as a Response
 * sized once (protobuf-c's own packer sizes each nested message again at
 * every level above it, which for a Batch reply cost more than the
 * packing); the client encodes ops as Requests and decodes Responses into
 * results.  Messages are built in the caller's arena.
 */
#include <string.h>

#include "codec_int.h"
#include "kvs_frame.h"
#include "kvs_status.h"

/* ---- a Request, as ops (the daemon's side) -------------------------------- */

_Static_assert(sizeof(kvs_op_bytes) == sizeof(ProtobufCBinaryData) &&
                   offsetof(kvs_op_bytes, len) ==
                       offsetof(ProtobufCBinaryData, len) &&
                   offsetof(kvs_op_bytes, data) ==
                       offsetof(ProtobufCBinaryData, data),
               "kvs_op_bytes is laid out as ProtobufCBinaryData");

/* A Commit's engine keys (fields 6 to 9) as op->keys; their counts are the
 * dispatcher's to check against the blocks the commit completes. */
static void commit_keys(const Kvshare__Commit *m, kvs_op *op,
                        kvs_op_result *res, kvs__arena *a) {
  kvs_op_keys *k;

  if (m->n_engine_hashes && m->n_engine_hash_bytes) {
    kvs_result_error(res, a, KVS_EINVAL, "commit of request %llu: "
                     "engine_hashes and engine_hash_bytes are both set",
                     (unsigned long long)m->req_id);
    return;
  }
  k = kvs__arena_alloc(a, sizeof(*k));
  if (k == NULL) {
    kvs_result_error(res, a, KVS_ENOMEM, "out of memory");
    return;
  }
  memset(k, 0, sizeof(*k));
  k->nblocks = (uint32_t)(m->n_engine_hashes + m->n_engine_hash_bytes);
  k->hashes = m->n_engine_hashes ? m->engine_hashes : NULL;
  k->hash_bytes = m->n_engine_hash_bytes
                      ? (const kvs_op_bytes *)m->engine_hash_bytes
                      : NULL;
  k->lora_name = m->lora_name && m->lora_name[0] ? m->lora_name : NULL;
  k->extra = m->n_extra_keys ? (const kvs_op_bytes *)m->extra_keys : NULL;
  k->nextra = (uint32_t)m->n_extra_keys;
  op->keys = k;
}

/* Request req (the i'th of a batch when in_batch) as op; res set when it is
 * not one (a Batch in a Batch, an unknown op). */
static void request_to_op(const Kvshare__Request *req, int in_batch,
                          size_t i, kvs_op *op, kvs_op_result *res,
                          kvs__arena *a) {
  /* (op and res come zeroed: kvs_call_alloc) */
  switch (req->op_case) {
  case KVSHARE__REQUEST__OP_LOOKUP: {
    const Kvshare__Lookup *l = req->lookup;

    op->req_id = l->req_id;
    if (l->n_tokens > UINT32_MAX || l->salt.len > UINT32_MAX) {
      kvs_result_error(res, a, KVS_EINVAL, "lookup of request %llu needs 1 "
                       "to 2^32-1 tokens", (unsigned long long)l->req_id);
      return;
    }
    op->tokens = l->tokens;
    op->ntokens = (uint32_t)l->n_tokens;
    op->bytes = l->salt.data;
    op->nbytes = (uint32_t)l->salt.len;
    op->flags = l->no_promote ? KVS_OPF_NO_PROMOTE : 0;
    break;
  }
  case KVSHARE__REQUEST__OP_ALLOCATE:
    op->req_id = req->allocate->req_id;
    op->num_tokens = req->allocate->num_tokens;
    op->flags = req->allocate->daemon_copy ? KVS_OPF_DAEMON_COPY : 0;
    break;
  case KVSHARE__REQUEST__OP_APPEND:
    op->req_id = req->append->req_id;
    op->num_tokens = req->append->num_tokens;
    op->flags = req->append->daemon_copy ? KVS_OPF_DAEMON_COPY : 0;
    break;
  case KVSHARE__REQUEST__OP_COMMIT: {
    const Kvshare__Commit *m = req->commit;

    op->req_id = m->req_id;
    if (m->n_tokens > UINT32_MAX || m->n_blocks > UINT32_MAX) {
      kvs_result_error(res, a, KVS_EINVAL, "commit of request %llu: too "
                       "many tokens", (unsigned long long)m->req_id);
      return;
    }
    op->start = m->start;
    op->num_tokens = m->num_tokens;
    op->tokens = m->n_tokens ? m->tokens : NULL;
    op->ntokens = (uint32_t)m->n_tokens;
    op->blocks = m->n_blocks ? m->blocks : NULL;
    op->nblocks = (uint32_t)m->n_blocks;
    if (m->n_engine_hashes || m->n_engine_hash_bytes || m->n_extra_keys ||
        (m->lora_name && m->lora_name[0]))
      commit_keys(m, op, res, a);
    break;
  }
  case KVSHARE__REQUEST__OP_FORK:
    op->req_id = req->fork->req_id;
    op->child_id = req->fork->child_id;
    break;
  case KVSHARE__REQUEST__OP_FREE:
    op->req_id = req->free->req_id;
    break;
  case KVSHARE__REQUEST__OP_PREEMPT:
    op->req_id = req->preempt->req_id;
    break;
  case KVSHARE__REQUEST__OP_SWAP_OUT:
    op->req_id = req->swap_out->req_id;
    break;
  case KVSHARE__REQUEST__OP_SWAP_IN:
    op->req_id = req->swap_in->req_id;
    break;
  case KVSHARE__REQUEST__OP_STATS:
    op->flags = req->stats->check ? KVS_OPF_CHECK : 0;
    break;
  case KVSHARE__REQUEST__OP_PING:
    op->bytes = req->ping->payload.data;
    op->nbytes = (uint32_t)req->ping->payload.len; /* (< max_frame) */
    break;
  case KVSHARE__REQUEST__OP_BATCH:
    if (in_batch) {
      kvs_result_error(res, a, KVS_EINVAL, "op %zu: a batch inside a batch",
                       i);
      return;
    }
    break; /* (never: request_decode takes it) */
  case KVSHARE__REQUEST__OP_PACKED_BATCH:
    kvs_result_error(res, a, KVS_EINVAL, "a packed batch inside a batch");
    return;
  default:
    kvs_result_error(res, a, KVS_EUNKNOWN, "unknown or empty request op "
                     "(%d)", (int)req->op_case);
    return;
  }
  op->code = (uint8_t)req->op_case; /* the op codes are the field numbers */
}

static int request_decode(const Kvshare__Request *req, uint32_t max_ops,
                          kvs__arena *a, kvs_call *call) {
  if (req->op_case == KVSHARE__REQUEST__OP_BATCH) {
    const Kvshare__Batch *b = req->batch;

    call->shape = KVS_SHAPE_BATCH;
    if (b->n_ops > max_ops) {
      kvs_call_refuse(call, a, KVS_ELIMIT, "batch of %zu ops is over "
                      "max_batch_ops (%u); none ran", b->n_ops, max_ops);
      return 0;
    }
    if (kvs_call_alloc(call, (uint32_t)b->n_ops, a) < 0)
      return KVS_ENOMEM;
    for (size_t i = 0; i < b->n_ops; i++)
      request_to_op(b->ops[i], 1, i, &call->ops[i], &call->res[i], a);
    return 0;
  }
  if (req->op_case == KVSHARE__REQUEST__OP_PACKED_BATCH) {
    const Kvshare__PackedBatch *pb = req->packed_batch;

    call->shape = KVS_SHAPE_PACKED;
    if (pb->ops.len % KVS_PACKED_OP_SIZE || pb->data.len % 4) {
      kvs_call_refuse(call, a, KVS_EINVAL, "packed batch of %zu op bytes "
                      "and %zu data bytes: not whole %u-byte ops and 4-byte "
                      "words", pb->ops.len, pb->data.len, KVS_PACKED_OP_SIZE);
      return 0;
    }
    /* (protobuf-c's copies of bytes fields are arena memory: aligned) */
    return kvs__records_decode(call, pb->ops.data,
                               pb->ops.len / KVS_PACKED_OP_SIZE,
                               (const uint32_t *)(const void *)pb->data.data,
                               pb->data.len / 4, max_ops, a);
  }
  call->shape = KVS_SHAPE_OP;
  if (kvs_call_alloc(call, 1, a) < 0)
    return KVS_ENOMEM;
  request_to_op(req, 0, 0, &call->ops[0], &call->res[0], a);
  return 0;
}

kvs_env_kind kvs_env_decode(const uint8_t *payload, size_t len,
                            uint32_t max_batch_ops, kvs__arena *a,
                            kvs_call *call, kvs_hello *hello) {
  size_t limit = KVS_UNPACK_LIMIT(len, max_batch_ops);
  kvs_payload_scan scan;
  Kvshare__Envelope *env;
  int rc;

  call->shape = KVS_SHAPE_OP;
  call->nops = 0;
  call->ops = NULL;
  call->res = NULL;
  call->status = 0;
  call->message = NULL;
  rc = kvs__arena_unpack(a, payload, len, limit, &scan, &env);
  call->seq = scan.seq;
  if (rc == KVS_ELIMIT) {
    kvs_call_refuse(call, a, rc, "decoding this %zu-byte message would take "
                    "%zu bytes, over the %zu allowed for it (max_batch_ops "
                    "%u)", len, scan.alloc_bound, limit, max_batch_ops);
    return KVS_ENV_BAD;
  }
  if (rc < 0) {
    kvs_call_refuse(call, a, rc, "undecodable message");
    return KVS_ENV_BAD;
  }
  call->seq = env->seq;
  switch (env->body_case) {
  case KVSHARE__ENVELOPE__BODY_HELLO:
    hello->version = env->hello->version;
    hello->client_name = env->hello->client_name ? env->hello->client_name
                                                 : "";
    hello->pid = env->hello->pid;
    hello->ring = env->hello->ring != 0;
    hello->no_map = env->hello->no_map != 0;
    return KVS_ENV_HELLO;
  case KVSHARE__ENVELOPE__BODY_REQUEST:
    if (request_decode(env->request, max_batch_ops, a, call) < 0) {
      call->nops = 0;
      kvs_call_refuse(call, a, KVS_ENOMEM, "out of memory");
    }
    return KVS_ENV_REQUEST;
  case KVSHARE__ENVELOPE__BODY_WELCOME:
  case KVSHARE__ENVELOPE__BODY_RESPONSE:
    return KVS_ENV_REPLY;
  default:
    return KVS_ENV_UNKNOWN;
  }
}

/* ---- results, as a Response (the daemon's side) --------------------------- */

/* Every OK reply points at this one (packing only reads it). */
static Kvshare__Status ok_status = KVSHARE__STATUS__INIT;

static Kvshare__Status *status_of(int32_t code, const char *msg,
                                  kvs__arena *a) {
  Kvshare__Status *st;

  if (code == 0)
    return &ok_status;
  st = kvs__arena_alloc(a, sizeof(*st));
  if (!st)
    return NULL;
  kvshare__status__init(st);
  st->code = code;
  st->message = (char *)(msg ? msg : "");
  return st;
}

static Kvshare__StatsResult *stats_result(const kvs_op_stats *s,
                                          kvs__arena *a) {
  Kvshare__StatsResult *res = kvs__arena_alloc(a, sizeof(*res));

  if (!res)
    return NULL;
  kvshare__stats_result__init(res);
  res->num_blocks = s->num_blocks;
  res->free_blocks = s->free_blocks;
  res->cached_blocks = s->cached_blocks;
  res->used_blocks = s->used_blocks;
  res->num_requests = s->num_requests;
  res->lookups = s->lookups;
  res->query_tokens = s->query_tokens;
  res->hit_tokens = s->hit_tokens;
  res->hit_blocks = s->hit_blocks;
  res->miss_blocks = s->miss_blocks;
  res->allocated_blocks = s->allocated_blocks;
  res->evictions = s->evictions;
  res->cow_copies = s->cow_copies;
  res->sealed_blocks = s->sealed_blocks;
  res->no_space = s->no_space;
  res->sessions = s->sessions;
  res->check = s->check;
  res->check_message = (char *)(s->check_message ? s->check_message : "");
  res->frames_in = s->frames_in;
  res->protocol_errors = s->protocol_errors;
  res->queued_bytes = s->queued_bytes;
  res->backend = (char *)(s->backend ? s->backend : "");
  res->gpu_uuid = (char *)(s->gpu_uuid ? s->gpu_uuid : "");
  res->pool_bytes = s->pool_bytes;
  res->daemon_copies = s->daemon_copies;
  res->daemon_copy_blocks = s->daemon_copy_blocks;
  res->copy_errors = s->copy_errors;
  res->tier_lost = s->tier_lost;
  res->swapped_requests = s->swapped_requests;
  res->swap_outs = s->swap_outs;
  res->swap_ins = s->swap_ins;
  res->swap_failures = s->swap_failures;
  res->swap_out_blocks = s->swap_out_blocks;
  res->swap_kept_blocks = s->swap_kept_blocks;
  res->swap_in_blocks = s->swap_in_blocks;
  res->swap_resident_blocks = s->swap_resident_blocks;
  res->indexed_blocks = s->indexed_blocks;
  res->compact_frames = s->compact_frames;
  if (s->ntiers) {
    Kvshare__TierStats *ms = kvs__arena_alloc(a, s->ntiers * sizeof(*ms));
    Kvshare__TierStats **mp = kvs__arena_alloc(a, s->ntiers * sizeof(*mp));

    if (ms && mp) {
      for (uint32_t i = 0; i < s->ntiers; i++) {
        const kvs_op_tier *t = &s->tiers[i];

        kvshare__tier_stats__init(&ms[i]);
        ms[i].name = (char *)t->name;
        ms[i].capacity_bytes = t->capacity_bytes;
        ms[i].slots = t->slots;
        ms[i].used = t->used;
        ms[i].demotions = t->demotions;
        ms[i].promotions = t->promotions;
        ms[i].hit_blocks = t->hit_blocks;
        ms[i].drops = t->drops;
        ms[i].failures = t->failures;
        ms[i].bytes_in = t->bytes_in;
        ms[i].bytes_out = t->bytes_out;
        ms[i].io_errors = t->io_errors;
        ms[i].checksum_failures = t->checksum_failures;
        ms[i].held = t->held;
        mp[i] = &ms[i];
      }
      res->n_tiers = s->ntiers;
      res->tiers = mp;
    }
  }
  res->tenant = (char *)(s->tenant ? s->tenant : "");
  if (s->ntenants) {
    Kvshare__TenantStats *ms = kvs__arena_alloc(a, s->ntenants * sizeof(*ms));
    Kvshare__TenantStats **mp = kvs__arena_alloc(a, s->ntenants * sizeof(*mp));

    if (ms && mp) {
      for (uint32_t i = 0; i < s->ntenants; i++) {
        const kvs_op_tenant *t = &s->tenants[i];

        kvshare__tenant_stats__init(&ms[i]);
        ms[i].name = (char *)(t->name ? t->name : "");
        ms[i].num_blocks = t->num_blocks;
        ms[i].free_blocks = t->free_blocks;
        ms[i].cached_blocks = t->cached_blocks;
        ms[i].used_blocks = t->used_blocks;
        ms[i].num_requests = t->num_requests;
        ms[i].sessions = t->sessions;
        ms[i].lookups = t->lookups;
        ms[i].query_tokens = t->query_tokens;
        ms[i].hit_tokens = t->hit_tokens;
        ms[i].evictions = t->evictions;
        ms[i].no_space = t->no_space;
        ms[i].pool_bytes = t->pool_bytes;
        mp[i] = &ms[i];
      }
      res->n_tenants = s->ntenants;
      res->tenants = mp;
    }
  }
  return res;
}

/* The result of an op with this code as r's result (r->status set).  0 or
 * KVS_ENOMEM. */
static int result_to_response(unsigned code, const kvs_op_result *x,
                              Kvshare__Response *r, kvs__arena *a) {
  switch (code) {
  case KVS_OP_LOOKUP: {
    Kvshare__LookupResult *l = kvs__arena_alloc(a, sizeof(*l));

    if (!l)
      return KVS_ENOMEM;
    kvshare__lookup_result__init(l);
    l->hit_tokens = x->u.lookup.hit_tokens;
    l->promoted_tokens = x->u.lookup.promoted_tokens;
    l->below_tokens = x->u.lookup.below_tokens;
    l->n_blocks = x->nblocks;
    l->blocks = (uint32_t *)x->blocks;
    r->result_case = KVSHARE__RESPONSE__RESULT_LOOKUP;
    r->lookup = l;
    return 0;
  }
  case KVS_OP_ALLOCATE:
  case KVS_OP_APPEND: {
    Kvshare__AllocResult *m = kvs__arena_alloc(a, sizeof(*m));

    if (!m)
      return KVS_ENOMEM;
    kvshare__alloc_result__init(m);
    m->first_index = x->u.alloc.first_index;
    m->n_blocks = x->nblocks;
    m->blocks = (uint32_t *)x->blocks;
    m->has_cow = x->u.alloc.has_cow;
    m->cow_src = x->u.alloc.cow_src;
    m->cow_dst = x->u.alloc.cow_dst;
    m->cow_index = x->u.alloc.cow_index;
    m->cow_copied = x->u.alloc.cow_copied;
    r->result_case = KVSHARE__RESPONSE__RESULT_ALLOC;
    r->alloc = m;
    return 0;
  }
  case KVS_OP_COMMIT: {
    Kvshare__CommitResult *m = kvs__arena_alloc(a, sizeof(*m));

    if (!m)
      return KVS_ENOMEM;
    kvshare__commit_result__init(m);
    m->sealed = x->u.commit.sealed;
    r->result_case = KVSHARE__RESPONSE__RESULT_COMMIT;
    r->commit = m;
    return 0;
  }
  case KVS_OP_SWAP_OUT:
  case KVS_OP_SWAP_IN: {
    Kvshare__SwapResult *m = kvs__arena_alloc(a, sizeof(*m));

    if (!m)
      return KVS_ENOMEM;
    kvshare__swap_result__init(m);
    m->tokens = x->u.swap.tokens;
    m->copied_blocks = x->u.swap.copied_blocks;
    m->lost_tokens = x->u.swap.lost_tokens;
    m->n_blocks = x->nblocks;
    m->blocks = (uint32_t *)x->blocks;
    r->result_case = KVSHARE__RESPONSE__RESULT_SWAP;
    r->swap = m;
    return 0;
  }
  case KVS_OP_STATS:
    r->stats = x->u.stats ? stats_result(x->u.stats, a) : NULL;
    if (!r->stats)
      return KVS_ENOMEM;
    r->result_case = KVSHARE__RESPONSE__RESULT_STATS;
    return 0;
  case KVS_OP_PING:
    r->result_case = KVSHARE__RESPONSE__RESULT_PONG;
    r->pong.data = (uint8_t *)x->u.pong.data;
    r->pong.len = x->u.pong.len;
    return 0;
  default: /* Fork, Free, Preempt: status only */
    return 0;
  }
}

/* The Response of op code's result (a status, and a result when OK). */
static int op_response(unsigned code, const kvs_op_result *x,
                       Kvshare__Response *r, kvs__arena *a) {
  kvshare__response__init(r);
  r->status = status_of(x->status, x->message, a);
  if (!r->status)
    return KVS_ENOMEM;
  return x->status == 0 ? result_to_response(code, x, r, a) : 0;
}

/* The Response of a batch of records (PackedBatch). */
static int packed_response(const kvs_call *call, Kvshare__Response *r,
                           kvs__arena *a) {
  Kvshare__PackedBatchResult *pr = kvs__arena_alloc(a, sizeof(*pr));
  size_t n = call->nops, words, nmsg;

  if (!pr)
    return KVS_ENOMEM;
  kvshare__packed_batch_result__init(pr);
  kvs__results_count(call, &words, &nmsg);
  pr->results.len = n * KVS_PACKED_RESULT_SIZE;
  pr->results.data = n ? kvs__arena_alloc(a, pr->results.len) : NULL;
  pr->data.len = words * 4;
  pr->data.data = words ? kvs__arena_alloc(a, pr->data.len) : NULL;
  pr->message_ops = nmsg ? kvs__arena_alloc(a, nmsg * sizeof(uint32_t))
                         : NULL;
  pr->messages = nmsg ? kvs__arena_alloc(a, nmsg * sizeof(char *)) : NULL;
  if ((n && !pr->results.data) || (words && !pr->data.data) ||
      (nmsg && (!pr->message_ops || !pr->messages)))
    return KVS_ENOMEM;
  kvs__results_write(call, pr->results.data,
                     (uint32_t *)(void *)pr->data.data);
  for (size_t i = 0; i < n; i++) {
    if (!kvs__has_message(&call->res[i]))
      continue;
    pr->message_ops[pr->n_message_ops++] = (uint32_t)i;
    pr->messages[pr->n_messages++] = (char *)call->res[i].message;
  }
  r->status = &ok_status;
  r->result_case = KVSHARE__RESPONSE__RESULT_PACKED_BATCH;
  r->packed_batch = pr;
  return 0;
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

/* The Batch reply's Responses (one per op) into r; their sizes once. */
static int batch_response(kvs_reply *rep, const kvs_call *call,
                          Kvshare__Response *r, kvs__arena *a) {
  Kvshare__BatchResult *br = kvs__arena_alloc(a, sizeof(*br));
  Kvshare__Response **replies = NULL, *rs = NULL;
  size_t st, n = call->nops;

  if (!br)
    return KVS_ENOMEM;
  kvshare__batch_result__init(br);
  if (n) {
    replies = kvs__arena_alloc(a, n * sizeof(*replies));
    rs = kvs__arena_alloc(a, n * sizeof(*rs));
    rep->sizes = kvs__arena_alloc(a, n * sizeof(size_t));
    if (!replies || !rs || !rep->sizes)
      return KVS_ENOMEM;
  }
  rep->batch_size = 0;
  for (size_t i = 0; i < n; i++) {
    if (op_response(call->ops[i].code, &call->res[i], &rs[i], a) < 0)
      return KVS_ENOMEM;
    replies[i] = &rs[i];
    rep->sizes[i] = kvshare__response__get_packed_size(&rs[i]);
    rep->batch_size += 1 + kvs__varint_size(rep->sizes[i]) + rep->sizes[i];
  }
  br->n_replies = n;
  br->replies = replies;
  r->status = &ok_status;
  r->result_case = KVSHARE__RESPONSE__RESULT_BATCH;
  r->batch = br;
  /* Response { status, batch: BatchResult { replies... } } by hand */
  st = kvshare__status__get_packed_size(r->status);
  rep->resp_size = 1 + kvs__varint_size(st) + st + 1 +
                   kvs__varint_size(rep->batch_size) + rep->batch_size;
  return 0;
}

_Static_assert(sizeof(Kvshare__Response) <= sizeof(((kvs_reply *)0)->store),
               "kvs_reply.store holds a Response");

size_t kvs__env_reply_size(kvs_reply *rep, const kvs_call *call,
                           kvs__arena *a) {
  Kvshare__Response *r = (Kvshare__Response *)(void *)rep->store;
  int rc = 0;

  rep->call = call;
  rep->sizes = NULL;
  rep->resp = r;
  kvshare__response__init(r);
  if (call->status) {
    r->status = status_of(call->status, call->message, a);
    rc = r->status ? 0 : KVS_ENOMEM;
  } else if (call->shape == KVS_SHAPE_BATCH) {
    rc = batch_response(rep, call, r, a);
  } else if (call->shape == KVS_SHAPE_PACKED) {
    rc = packed_response(call, r, a);
  } else {
    rc = op_response(call->ops[0].code, &call->res[0], r, a);
  }
  if (rc < 0)
    return 0;
  if (!rep->sizes)
    rep->resp_size = kvshare__response__get_packed_size(r);
  rep->payload = (call->seq ? 1 + kvs__varint_size(call->seq) : 0) + 1 +
                 kvs__varint_size(rep->resp_size) + rep->resp_size;
  rep->len = KVS_FRAME_HEADER_SIZE + rep->payload;
  return rep->len;
}

void kvs__env_reply_encode(const kvs_reply *rep, uint8_t *out) {
  const Kvshare__Response *r = rep->resp;
  uint8_t *p = out + KVS_FRAME_HEADER_SIZE;

  kvs_frame_header_encode(out, (uint32_t)rep->payload);
  if (rep->call->seq) {
    *p++ = TAG_VARINT(F_ENVELOPE_SEQ);
    p = put_varint(p, rep->call->seq);
  }
  *p++ = TAG_LD(F_ENVELOPE_RESPONSE);
  p = put_varint(p, rep->resp_size);
  if (!rep->sizes) {
    kvshare__response__pack(r, p);
    return;
  }
  *p++ = TAG_LD(F_RESPONSE_STATUS);
  p = put_varint(p, kvshare__status__get_packed_size(r->status));
  p += kvshare__status__pack(r->status, p);
  *p++ = TAG_LD(F_RESPONSE_BATCH);
  p = put_varint(p, rep->batch_size);
  for (size_t i = 0; i < r->batch->n_replies; i++) {
    *p++ = TAG_LD(F_BATCH_REPLIES);
    p = put_varint(p, rep->sizes[i]);
    p += kvshare__response__pack(r->batch->replies[i], p);
  }
}

/* ---- Welcome (the daemon's side) ----------------------------------------- */

typedef struct welcome_msg {
  Kvshare__Envelope env;
  Kvshare__Welcome w;
  Kvshare__Status st;
  Kvshare__Layout lay;
  Kvshare__PoolExport pe;
} welcome_msg;

static void welcome_build(const kvs_welcome *in, uint64_t seq,
                          welcome_msg *m) {
  kvshare__envelope__init(&m->env);
  kvshare__welcome__init(&m->w);
  kvshare__status__init(&m->st);
  m->st.code = in->status;
  m->st.message = (char *)(in->message ? in->message : "");
  m->w.status = &m->st;
  m->w.version = in->version;
  if (in->has_layout) {
    kvshare__layout__init(&m->lay);
    m->lay.block_size = in->block_size;
    m->lay.num_layers = in->num_layers;
    m->lay.num_kv_heads = in->num_kv_heads;
    m->lay.head_dim = in->head_dim;
    m->lay.dtype = in->dtype;
    m->lay.num_blocks = in->num_blocks;
    m->lay.block_stride = in->block_stride;
    m->w.layout = &m->lay;
  }
  if (in->has_pool) {
    kvshare__pool_export__init(&m->pe);
    m->pe.backend = (char *)(in->backend ? in->backend : "");
    m->pe.size = in->pool_size;
    m->pe.num_fds = in->num_fds;
    m->pe.chunk_size = in->chunk_size;
    m->pe.gpu_uuid = (char *)(in->gpu_uuid ? in->gpu_uuid : "");
    m->w.pool = &m->pe;
  }
  m->w.session_id = in->session_id;
  m->w.model_id = (char *)(in->model_id ? in->model_id : "");
  m->w.max_frame = in->max_frame;
  m->w.max_batch_ops = in->max_batch_ops;
  m->w.features = in->features;
  m->w.ring_bytes = in->ring_bytes;
  m->w.tenant = (char *)(in->tenant ? in->tenant : "");
  m->env.seq = seq;
  m->env.body_case = KVSHARE__ENVELOPE__BODY_WELCOME;
  m->env.welcome = &m->w;
}

size_t kvs_welcome_frame_size(const kvs_welcome *w, uint64_t seq) {
  welcome_msg m;

  welcome_build(w, seq, &m);
  return kvs_frame_size(&m.env);
}

void kvs_welcome_frame_encode(const kvs_welcome *w, uint64_t seq,
                              uint8_t *out, size_t len) {
  welcome_msg m;

  welcome_build(w, seq, &m);
  kvs_frame_pack_into(&m.env, UINT32_MAX, out, len);
}

/* ---- Hello and Welcome (the client's side) -------------------------------- */

static void hello_build(const kvs_hello *h, uint64_t seq,
                        Kvshare__Envelope *env, Kvshare__Hello *m) {
  kvshare__envelope__init(env);
  kvshare__hello__init(m);
  m->version = h->version;
  m->client_name = (char *)(h->client_name ? h->client_name : "");
  m->pid = h->pid;
  m->ring = h->ring != 0;
  m->no_map = h->no_map != 0;
  env->seq = seq;
  env->body_case = KVSHARE__ENVELOPE__BODY_HELLO;
  env->hello = m;
}

size_t kvs_hello_frame_size(const kvs_hello *h, uint64_t seq) {
  Kvshare__Envelope env;
  Kvshare__Hello m;

  hello_build(h, seq, &env, &m);
  return kvs_frame_size(&env);
}

void kvs_hello_frame_encode(const kvs_hello *h, uint64_t seq, uint8_t *out,
                            size_t len) {
  Kvshare__Envelope env;
  Kvshare__Hello m;

  hello_build(h, seq, &env, &m);
  kvs_frame_pack_into(&env, UINT32_MAX, out, len);
}

int kvs_welcome_decode(const uint8_t *frame, size_t flen,
                       uint32_t max_batch_ops, kvs__arena *a,
                       kvs_welcome *w) {
  size_t plen = flen - KVS_FRAME_HEADER_SIZE;
  Kvshare__Envelope *env;
  const Kvshare__Welcome *m;
  int rc;

  memset(w, 0, sizeof(*w));
  if (kvs_frame_flags(frame))
    return KVS_EPROTO;
  rc = kvs__arena_unpack(a, frame + KVS_FRAME_HEADER_SIZE, plen,
                         KVS_UNPACK_LIMIT(plen, max_batch_ops), NULL, &env);
  if (rc < 0)
    return rc;
  if (env->body_case == KVSHARE__ENVELOPE__BODY_RESPONSE && env->response &&
      env->response->status && env->response->status->code < 0) {
    w->status = env->response->status->code;
    w->message = env->response->status->message;
    return 0;
  }
  if (env->body_case != KVSHARE__ENVELOPE__BODY_WELCOME || !env->welcome)
    return KVS_EPROTO;
  m = env->welcome;
  if (m->status) {
    w->status = m->status->code;
    w->message = m->status->message;
  }
  w->version = m->version;
  if (m->layout) {
    w->has_layout = 1;
    w->block_size = m->layout->block_size;
    w->num_layers = m->layout->num_layers;
    w->num_kv_heads = m->layout->num_kv_heads;
    w->head_dim = m->layout->head_dim;
    w->dtype = m->layout->dtype;
    w->num_blocks = m->layout->num_blocks;
    w->block_stride = m->layout->block_stride;
  }
  if (m->pool) {
    w->has_pool = 1;
    w->backend = m->pool->backend;
    w->pool_size = m->pool->size;
    w->num_fds = m->pool->num_fds;
    w->chunk_size = m->pool->chunk_size;
    w->gpu_uuid = m->pool->gpu_uuid;
  }
  w->session_id = m->session_id;
  w->model_id = m->model_id;
  w->max_frame = m->max_frame;
  w->max_batch_ops = m->max_batch_ops;
  w->features = m->features;
  w->ring_bytes = m->ring_bytes;
  w->tenant = m->tenant;
  return 0;
}

/* ---- ops, as a Request (the client's side) ------------------------------- */

typedef union op_msg {
  Kvshare__Lookup lookup;
  Kvshare__Allocate allocate;
  Kvshare__Append append;
  Kvshare__Commit commit;
  Kvshare__Fork fork;
  Kvshare__Free free;
  Kvshare__Preempt preempt;
  Kvshare__SwapOut swap_out;
  Kvshare__SwapIn swap_in;
  Kvshare__Stats stats;
  Kvshare__Ping ping;
} op_msg;

/* op as req, its message in m (its arrays point to op's). */
static void op_to_request(const kvs_op *op, Kvshare__Request *req,
                          op_msg *m) {
  kvshare__request__init(req);
  req->op_case = (Kvshare__Request__OpCase)op->code;
  switch (op->code) {
  case KVS_OP_LOOKUP:
    kvshare__lookup__init(&m->lookup);
    m->lookup.req_id = op->req_id;
    m->lookup.n_tokens = op->ntokens;
    m->lookup.tokens = (uint32_t *)op->tokens;
    m->lookup.salt.len = op->nbytes;
    m->lookup.salt.data = (uint8_t *)op->bytes;
    m->lookup.no_promote = (op->flags & KVS_OPF_NO_PROMOTE) != 0;
    req->lookup = &m->lookup;
    break;
  case KVS_OP_ALLOCATE:
    kvshare__allocate__init(&m->allocate);
    m->allocate.req_id = op->req_id;
    m->allocate.num_tokens = op->num_tokens;
    m->allocate.daemon_copy = (op->flags & KVS_OPF_DAEMON_COPY) != 0;
    req->allocate = &m->allocate;
    break;
  case KVS_OP_APPEND:
    kvshare__append__init(&m->append);
    m->append.req_id = op->req_id;
    m->append.num_tokens = op->num_tokens;
    m->append.daemon_copy = (op->flags & KVS_OPF_DAEMON_COPY) != 0;
    req->append = &m->append;
    break;
  case KVS_OP_COMMIT:
    kvshare__commit__init(&m->commit);
    m->commit.req_id = op->req_id;
    m->commit.start = op->start;
    m->commit.num_tokens = op->num_tokens;
    if (op->tokens) {
      m->commit.n_tokens = op->ntokens;
      m->commit.tokens = (uint32_t *)op->tokens;
    }
    m->commit.n_blocks = op->nblocks;
    m->commit.blocks = (uint32_t *)op->blocks;
    if (op->keys) {
      const kvs_op_keys *k = op->keys;

      if (k->hashes) {
        m->commit.n_engine_hashes = k->nblocks;
        m->commit.engine_hashes = (uint64_t *)k->hashes;
      } else if (k->hash_bytes) {
        m->commit.n_engine_hash_bytes = k->nblocks;
        m->commit.engine_hash_bytes = (ProtobufCBinaryData *)k->hash_bytes;
      }
      if (k->lora_name)
        m->commit.lora_name = (char *)k->lora_name;
      m->commit.n_extra_keys = k->nextra;
      m->commit.extra_keys = (ProtobufCBinaryData *)k->extra;
    }
    req->commit = &m->commit;
    break;
  case KVS_OP_FORK:
    kvshare__fork__init(&m->fork);
    m->fork.req_id = op->req_id;
    m->fork.child_id = op->child_id;
    req->fork = &m->fork;
    break;
  case KVS_OP_FREE:
    kvshare__free__init(&m->free);
    m->free.req_id = op->req_id;
    req->free = &m->free;
    break;
  case KVS_OP_PREEMPT:
    kvshare__preempt__init(&m->preempt);
    m->preempt.req_id = op->req_id;
    req->preempt = &m->preempt;
    break;
  case KVS_OP_SWAP_OUT:
    kvshare__swap_out__init(&m->swap_out);
    m->swap_out.req_id = op->req_id;
    req->swap_out = &m->swap_out;
    break;
  case KVS_OP_SWAP_IN:
    kvshare__swap_in__init(&m->swap_in);
    m->swap_in.req_id = op->req_id;
    req->swap_in = &m->swap_in;
    break;
  case KVS_OP_STATS:
    kvshare__stats__init(&m->stats);
    m->stats.check = (op->flags & KVS_OPF_CHECK) != 0;
    req->stats = &m->stats;
    break;
  case KVS_OP_PING:
    kvshare__ping__init(&m->ping);
    m->ping.payload.len = op->nbytes;
    m->ping.payload.data = (uint8_t *)op->bytes;
    req->ping = &m->ping;
    break;
  default:
    req->op_case = KVSHARE__REQUEST__OP__NOT_SET;
    break;
  }
}

/* A one-op Envelope, built in kvs_request.store. */
typedef struct one_request {
  Kvshare__Envelope env;
  Kvshare__Request req;
  op_msg m;
} one_request;
_Static_assert(sizeof(one_request) <= sizeof(((kvs_request *)0)->store),
               "kvs_request.store holds a one-op Envelope");

size_t kvs__env_request_size(kvs_request *rq, const kvs_call *call,
                             kvs__arena *a) {
  one_request *one = (one_request *)(void *)rq->store;
  Kvshare__Envelope *env = &one->env;
  Kvshare__Request *req = &one->req;
  size_t n = call->nops, len;

  rq->call = call;
  rq->env = env;
  kvshare__envelope__init(env);
  env->seq = call->seq;
  env->body_case = KVSHARE__ENVELOPE__BODY_REQUEST;
  env->request = req;
  if (call->shape == KVS_SHAPE_OP) {
    if (n != 1)
      return 0;
    op_to_request(&call->ops[0], req, &one->m);
  } else if (call->shape == KVS_SHAPE_BATCH) {
    Kvshare__Batch *b = kvs__arena_alloc(a, sizeof(*b));
    Kvshare__Request *reqs = n ? kvs__arena_alloc(a, n * sizeof(*reqs)) : NULL;
    Kvshare__Request **rp = n ? kvs__arena_alloc(a, n * sizeof(*rp)) : NULL;
    op_msg *ms = n ? kvs__arena_alloc(a, n * sizeof(*ms)) : NULL;

    if (!b || (n && (!reqs || !rp || !ms)))
      return 0;
    kvshare__batch__init(b);
    for (size_t i = 0; i < n; i++) {
      op_to_request(&call->ops[i], &reqs[i], &ms[i]);
      rp[i] = &reqs[i];
    }
    b->n_ops = n;
    b->ops = rp;
    kvshare__request__init(req);
    req->op_case = KVSHARE__REQUEST__OP_BATCH;
    req->batch = b;
  } else { /* KVS_SHAPE_PACKED */
    Kvshare__PackedBatch *pb = kvs__arena_alloc(a, sizeof(*pb));
    static uint8_t none[4];
    uint64_t words = 0;
    uint32_t nd = 0;
    uint8_t *recs;
    uint32_t *data;

    for (size_t i = 0; i < n; i++)
      words += kvs__record_words(&call->ops[i]);
    if (!pb || words > UINT32_MAX)
      return 0;
    recs = n ? kvs__arena_alloc(a, n * KVS_PACKED_OP_SIZE) : none;
    data = words ? kvs__arena_alloc(a, words * 4) : (uint32_t *)none;
    if (!recs || !data)
      return 0;
    for (size_t i = 0; i < n; i++)
      kvs__record_encode(&call->ops[i], recs + i * KVS_PACKED_OP_SIZE,
                         (uint8_t *)data, &nd);
    kvshare__packed_batch__init(pb);
    pb->ops.data = recs;
    pb->ops.len = n * KVS_PACKED_OP_SIZE;
    pb->data.data = (uint8_t *)data;
    pb->data.len = words * 4;
    kvshare__request__init(req);
    req->op_case = KVSHARE__REQUEST__OP_PACKED_BATCH;
    req->packed_batch = pb;
  }
  len = kvshare__envelope__get_packed_size(env);
  rq->len = KVS_FRAME_HEADER_SIZE + len;
  return rq->len;
}

void kvs__env_request_encode(const kvs_request *rq, uint8_t *out) {
  kvs_frame_header_encode(out, (uint32_t)(rq->len - KVS_FRAME_HEADER_SIZE));
  kvshare__envelope__pack(rq->env, out + KVS_FRAME_HEADER_SIZE);
}

/* ---- a Response, as results (the client's side) --------------------------- */

static const kvs_op_stats *stats_from(const Kvshare__StatsResult *s,
                                      kvs__arena *a) {
  kvs_op_stats *o = kvs__arena_alloc(a, sizeof(*o));
  kvs_op_tier *t = NULL;

  if (!o)
    return NULL;
  memset(o, 0, sizeof(*o));
  if (s->n_tiers) {
    t = kvs__arena_alloc(a, s->n_tiers * sizeof(*t));
    if (!t)
      return NULL;
    memset(t, 0, s->n_tiers * sizeof(*t));
  }
  o->num_blocks = s->num_blocks;
  o->free_blocks = s->free_blocks;
  o->cached_blocks = s->cached_blocks;
  o->used_blocks = s->used_blocks;
  o->num_requests = s->num_requests;
  o->sessions = s->sessions;
  o->indexed_blocks = s->indexed_blocks;
  o->swapped_requests = s->swapped_requests;
  o->lookups = s->lookups;
  o->query_tokens = s->query_tokens;
  o->hit_tokens = s->hit_tokens;
  o->hit_blocks = s->hit_blocks;
  o->miss_blocks = s->miss_blocks;
  o->allocated_blocks = s->allocated_blocks;
  o->evictions = s->evictions;
  o->cow_copies = s->cow_copies;
  o->sealed_blocks = s->sealed_blocks;
  o->no_space = s->no_space;
  o->frames_in = s->frames_in;
  o->compact_frames = s->compact_frames;
  o->protocol_errors = s->protocol_errors;
  o->queued_bytes = s->queued_bytes;
  o->backend = s->backend;
  o->gpu_uuid = s->gpu_uuid;
  o->pool_bytes = s->pool_bytes;
  o->daemon_copies = s->daemon_copies;
  o->daemon_copy_blocks = s->daemon_copy_blocks;
  o->copy_errors = s->copy_errors;
  o->tier_lost = s->tier_lost;
  o->swap_outs = s->swap_outs;
  o->swap_ins = s->swap_ins;
  o->swap_failures = s->swap_failures;
  o->swap_out_blocks = s->swap_out_blocks;
  o->swap_kept_blocks = s->swap_kept_blocks;
  o->swap_in_blocks = s->swap_in_blocks;
  o->swap_resident_blocks = s->swap_resident_blocks;
  o->check = s->check;
  o->check_message = s->check_message;
  for (size_t i = 0; i < s->n_tiers; i++) {
    const Kvshare__TierStats *m = s->tiers[i];

    if (!m)
      continue;
    t[i].name = m->name;
    t[i].capacity_bytes = m->capacity_bytes;
    t[i].slots = m->slots;
    t[i].used = m->used;
    t[i].held = m->held;
    t[i].demotions = m->demotions;
    t[i].promotions = m->promotions;
    t[i].hit_blocks = m->hit_blocks;
    t[i].drops = m->drops;
    t[i].failures = m->failures;
    t[i].bytes_in = m->bytes_in;
    t[i].bytes_out = m->bytes_out;
    t[i].io_errors = m->io_errors;
    t[i].checksum_failures = m->checksum_failures;
  }
  o->tiers = t;
  o->ntiers = (uint32_t)s->n_tiers;
  o->tenant = s->tenant ? s->tenant : "";
  if (s->n_tenants) {
    kvs_op_tenant *x = kvs__arena_alloc(a, s->n_tenants * sizeof(*x));

    if (!x)
      return NULL;
    memset(x, 0, s->n_tenants * sizeof(*x));
    for (size_t i = 0; i < s->n_tenants; i++) {
      const Kvshare__TenantStats *m = s->tenants[i];

      if (!m)
        continue;
      x[i].name = m->name;
      x[i].num_blocks = m->num_blocks;
      x[i].free_blocks = m->free_blocks;
      x[i].cached_blocks = m->cached_blocks;
      x[i].used_blocks = m->used_blocks;
      x[i].num_requests = m->num_requests;
      x[i].sessions = m->sessions;
      x[i].lookups = m->lookups;
      x[i].query_tokens = m->query_tokens;
      x[i].hit_tokens = m->hit_tokens;
      x[i].evictions = m->evictions;
      x[i].no_space = m->no_space;
      x[i].pool_bytes = m->pool_bytes;
    }
    o->tenants = x;
    o->ntenants = (uint32_t)s->n_tenants;
  }
  return o;
}

/* r as the result of an op with this code; a successful op may come with
 * no result: read as an empty one.  0, KVS_EPROTO (another kind of result),
 * KVS_ENOMEM. */
static int response_to_result(unsigned code, const Kvshare__Response *r,
                              kvs_op_result *x, kvs__arena *a) {
  Kvshare__Response__ResultCase want;

  /* (x comes zeroed: kvs_reply_decode) */
  if (r->status) {
    if (r->status->code > 0)
      return KVS_EPROTO;
    x->status = r->status->code;
    x->message = r->status->message;
  }
  if (x->status)
    return 0;
  switch (code) {
  case KVS_OP_LOOKUP: want = KVSHARE__RESPONSE__RESULT_LOOKUP; break;
  case KVS_OP_ALLOCATE:
  case KVS_OP_APPEND: want = KVSHARE__RESPONSE__RESULT_ALLOC; break;
  case KVS_OP_COMMIT: want = KVSHARE__RESPONSE__RESULT_COMMIT; break;
  case KVS_OP_SWAP_OUT:
  case KVS_OP_SWAP_IN: want = KVSHARE__RESPONSE__RESULT_SWAP; break;
  case KVS_OP_STATS: want = KVSHARE__RESPONSE__RESULT_STATS; break;
  case KVS_OP_PING: want = KVSHARE__RESPONSE__RESULT_PONG; break;
  default: want = KVSHARE__RESPONSE__RESULT__NOT_SET; break;
  }
  if (r->result_case == KVSHARE__RESPONSE__RESULT__NOT_SET)
    return code == KVS_OP_STATS || code == KVS_OP_SWAP_OUT ||
                   code == KVS_OP_SWAP_IN
               ? KVS_EPROTO /* (these always carry one) */
               : 0;
  if (r->result_case != want)
    return KVS_EPROTO;
  switch (r->result_case) {
  case KVSHARE__RESPONSE__RESULT_LOOKUP:
    x->u.lookup.hit_tokens = r->lookup->hit_tokens;
    x->u.lookup.promoted_tokens = r->lookup->promoted_tokens;
    x->u.lookup.below_tokens = r->lookup->below_tokens;
    x->blocks = r->lookup->blocks;
    x->nblocks = (uint32_t)r->lookup->n_blocks;
    break;
  case KVSHARE__RESPONSE__RESULT_ALLOC:
    x->u.alloc.first_index = r->alloc->first_index;
    x->u.alloc.has_cow = r->alloc->has_cow != 0;
    x->u.alloc.cow_src = r->alloc->cow_src;
    x->u.alloc.cow_dst = r->alloc->cow_dst;
    x->u.alloc.cow_index = r->alloc->cow_index;
    x->u.alloc.cow_copied = r->alloc->cow_copied != 0;
    x->blocks = r->alloc->blocks;
    x->nblocks = (uint32_t)r->alloc->n_blocks;
    break;
  case KVSHARE__RESPONSE__RESULT_COMMIT:
    x->u.commit.sealed = r->commit->sealed;
    break;
  case KVSHARE__RESPONSE__RESULT_SWAP:
    x->u.swap.tokens = r->swap->tokens;
    x->u.swap.copied_blocks = r->swap->copied_blocks;
    x->u.swap.lost_tokens = r->swap->lost_tokens;
    x->blocks = r->swap->blocks;
    x->nblocks = (uint32_t)r->swap->n_blocks;
    break;
  case KVSHARE__RESPONSE__RESULT_STATS:
    x->u.stats = stats_from(r->stats, a);
    if (!x->u.stats)
      return KVS_ENOMEM;
    break;
  case KVSHARE__RESPONSE__RESULT_PONG:
    x->u.pong.data = r->pong.data;
    x->u.pong.len = (uint32_t)r->pong.len;
    break;
  default:
    break;
  }
  return 0;
}

/* A PackedBatchResult as the results of call's ops. */
static int packed_results(kvs_call *call, const Kvshare__PackedBatchResult *pr,
                          kvs__arena *a) {
  size_t words = pr->data.len / 4;
  const uint32_t *data = (const uint32_t *)(const void *)pr->data.data;

  (void)a;
  if (pr->results.len != (size_t)call->nops * KVS_PACKED_RESULT_SIZE ||
      pr->data.len % 4 || pr->n_messages != pr->n_message_ops)
    return KVS_EPROTO;
  for (uint32_t i = 0; i < call->nops; i++) {
    kvs_op_result *x = &call->res[i];

    if (kvs__result_record_decode(call->ops[i].code,
                                  pr->results.data +
                                      (size_t)i * KVS_PACKED_RESULT_SIZE,
                                  data, words, x) < 0)
      return KVS_EPROTO;
    if (!x->status)
      continue;
    for (size_t k = 0; k < pr->n_message_ops; k++)
      if (pr->message_ops[k] == i)
        x->message = pr->messages[k];
  }
  return 0;
}

int kvs__env_reply_decode(kvs_call *call, const uint8_t *frame, size_t flen,
                          uint32_t max_batch_ops, kvs__arena *a) {
  size_t plen = flen - KVS_FRAME_HEADER_SIZE;
  const Kvshare__Response *r;
  Kvshare__Envelope *env;
  int rc;

  rc = kvs__arena_unpack(a, frame + KVS_FRAME_HEADER_SIZE, plen,
                         KVS_UNPACK_LIMIT(plen, max_batch_ops), NULL, &env);
  if (rc < 0)
    return rc;
  if (env->body_case != KVSHARE__ENVELOPE__BODY_RESPONSE || !env->response)
    return KVS_EPROTO;
  r = env->response;
  if (env->seq != call->seq) {
    /* The daemon answers a frame it could not read with seq 0 and an error
     * status: report that status. */
    if (env->seq == 0 && r->status && r->status->code < 0) {
      call->message = r->status->message;
      return r->status->code;
    }
    return KVS_EPROTO;
  }
  if (r->status && r->status->code > 0)
    return KVS_EPROTO;
  if (r->status && r->status->code < 0) { /* refused as a whole */
    call->status = r->status->code;
    call->message = r->status->message;
    if (call->shape == KVS_SHAPE_OP) {
      call->res[0].status = call->status;
      call->res[0].message = call->message;
    }
    return 0;
  }
  switch (call->shape) {
  case KVS_SHAPE_OP:
    return response_to_result(call->ops[0].code, r, &call->res[0], a);
  case KVS_SHAPE_BATCH:
    if (call->nops == 0)
      return 0;
    if (r->result_case != KVSHARE__RESPONSE__RESULT_BATCH || !r->batch ||
        r->batch->n_replies != call->nops)
      return KVS_EPROTO;
    for (uint32_t i = 0; i < call->nops; i++) {
      if (!r->batch->replies[i])
        return KVS_EPROTO;
      rc = response_to_result(call->ops[i].code, r->batch->replies[i],
                              &call->res[i], a);
      if (rc < 0)
        return rc;
    }
    return 0;
  default: /* KVS_SHAPE_PACKED */
    if (r->result_case != KVSHARE__RESPONSE__RESULT_PACKED_BATCH ||
        !r->packed_batch)
      return KVS_EPROTO;
    return packed_results(call, r->packed_batch, a);
  }
}
