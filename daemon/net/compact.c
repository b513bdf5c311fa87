/*
 * compact.c — compact frames (proto/kvs_compact.h): a call in fixed-width
 * fields.
 *
 * A compact request becomes the Request it stands for (built in place, its
 * u32 arrays read where they are, or from an aligned copy), and runs
 * through session.c and disp_request exactly as the same Request sent in an
 * Envelope: one op alone, a PackedBatch, or a Ping.  Only the encoding
 * differs, both ways: no protobuf message is decoded or encoded, which on a
 * small call was most of the daemon's and the client's work.  The reply is
 * written here from the Response, in fixed-width fields.
 */
#include <stdio.h>
#include <string.h>

#include "daemon/net/server.h"

static int fail(Kvshare__Response *resp, kvs__arena *a, int code,
                const char *what, size_t len) {
  disp_status(resp, a, code, "compact frame of %zu bytes: %s", len, what);
  return code;
}

/* A copy of n bytes in the arena (NULL when n is 0 or memory ran out). */
static void *copy_in(kvs__arena *a, const uint8_t *p, size_t n) {
  void *q = n ? kvs__arena_alloc(a, n) : NULL;

  if (q)
    memcpy(q, p, n);
  return q;
}

int compact_parse(const sess *c, const uint8_t *payload, size_t len,
                  compact_in *in, Kvshare__Response *resp, kvs__arena *a) {
  const uint8_t *body = payload + KVS_COMPACT_HDR;
  const uint32_t *data = NULL;
  static const uint8_t zero[12];
  kvs_compact_req h;
  char what[160];
  kvs_pop o;

  in->seq = 0;
  in->kind = 0;
  kvshare__request__init(&in->req);
  if (len >= 8)
    memcpy(&in->seq, payload, 8);
  if (len < KVS_COMPACT_HDR)
    return fail(resp, a, KVS_EPROTO, "shorter than its 24-byte header", len);
  kvs_compact_req_get(payload, &h);
  if (h.kind < KVS_COMPACT_OP || h.kind > KVS_COMPACT_PING) {
    snprintf(what, sizeof(what), "unknown kind %u", (unsigned)h.kind);
    return fail(resp, a, KVS_EPROTO, what, len);
  }
  if (memcmp(payload + 9, zero, 3) || memcmp(payload + 20, zero, 4))
    return fail(resp, a, KVS_EPROTO, "reserved header bytes are not zero",
                len);
  if (kvs_compact_req_size(&h) != len ||
      (h.kind == KVS_COMPACT_PING && h.words != 0)) {
    snprintf(what, sizeof(what), "its header says %llu bytes (kind %u, "
             "count %u, words %u)",
             (unsigned long long)kvs_compact_req_size(&h), (unsigned)h.kind,
             h.count, h.words);
    return fail(resp, a, KVS_EPROTO, what, len);
  }
  if (h.kind == KVS_COMPACT_PING) {
    in->kind = h.kind;
    /* (the bytes stay in the frame: a Ping is answered before the frame's
     * buffer is touched again, never held) */
    kvshare__ping__init(&in->m.ping);
    in->m.ping.payload.len = h.count;
    in->m.ping.payload.data = (uint8_t *)body;
    in->req.op_case = KVSHARE__REQUEST__OP_PING;
    in->req.ping = &in->m.ping;
    return 0;
  }
  if (h.kind == KVS_COMPACT_OP && h.count != 1) {
    snprintf(what, sizeof(what), "one op holds %u records", h.count);
    return fail(resp, a, KVS_EPROTO, what, len);
  }
  in->kind = h.kind; /* (it adds up: answered in its kind's shape) */
  if (h.count > c->srv->cfg->max_batch_ops) {
    disp_status(resp, a, KVS_ELIMIT, "batch of %u ops is over "
                "max_batch_ops (%u); none ran", h.count,
                c->srv->cfg->max_batch_ops);
    return KVS_ELIMIT;
  }
  /* The data is read in place when it is aligned (the frame is the
   * daemon's own copy, in its read buffer or taken out of a ring, and
   * stays put until the frame is handled), else from an aligned copy. */
  if (h.words) {
    const uint8_t *d = body + (size_t)h.count * KVS_PACKED_OP_SIZE;

    data = ((uintptr_t)d & 3) == 0 ? (const uint32_t *)(const void *)d
                                   : copy_in(a, d, (size_t)h.words * 4);
    if (!data)
      return fail(resp, a, KVS_ENOMEM, "out of memory", len);
  }
  if (h.kind == KVS_COMPACT_OP) {
    kvs_pop_get(body, &o);
    if (!disp_packed_op(&o, 0, data, h.words, &in->req, &in->m.op, resp, a))
      return resp->status->code;
    return 0;
  }
  kvshare__packed_batch__init(&in->m.pb);
  in->m.pb.ops.len = (size_t)h.count * KVS_PACKED_OP_SIZE;
  in->m.pb.ops.data = (uint8_t *)body; /* read with kvs_pop_get: any
                                          alignment */
  in->m.pb.data.len = (size_t)h.words * 4;
  in->m.pb.data.data = (uint8_t *)data;
  in->req.op_case = KVSHARE__REQUEST__OP_PACKED_BATCH;
  in->req.packed_batch = &in->m.pb;
  return 0;
}

/* ---- replies --------------------------------------------------------------- */

/* The message a status carries, cut to KVS_COMPACT_MSG_MAX; 0 when none. */
static uint32_t msg_len(const Kvshare__Status *st) {
  size_t n;

  if (!st || !st->message || !st->message[0])
    return 0;
  n = strnlen(st->message, KVS_COMPACT_MSG_MAX);
  return (uint32_t)n;
}

static int status_of(const Kvshare__Response *r) {
  return r->status ? r->status->code : 0;
}

/* Does the reply to a kind-`kind` request carry what the request asked for
 * (else only the frame's status: nothing ran, or the reply was refused)? */
static int answered(uint8_t kind, const Kvshare__Response *r) {
  switch (kind) {
  case KVS_COMPACT_PING:
    return r->result_case == KVSHARE__RESPONSE__RESULT_PONG &&
           status_of(r) == 0;
  case KVS_COMPACT_BATCH:
    return r->result_case == KVSHARE__RESPONSE__RESULT_PACKED_BATCH &&
           r->packed_batch && status_of(r) == 0;
  case KVS_COMPACT_OP:
    return 1; /* one op: its record carries its status, whatever it is */
  default:
    return 0; /* COMPACT_REFUSAL: a frame that did not add up */
  }
}

static size_t op_blocks(const Kvshare__Response *r) {
  if (r->result_case == KVSHARE__RESPONSE__RESULT_LOOKUP && r->lookup)
    return r->lookup->n_blocks;
  if (r->result_case == KVSHARE__RESPONSE__RESULT_ALLOC && r->alloc)
    return r->alloc->n_blocks;
  return 0;
}

size_t compact_reply_size(uint8_t kind, const Kvshare__Response *r) {
  size_t n = KVS_FRAME_HEADER_SIZE + KVS_COMPACT_HDR, i;
  uint32_t m = msg_len(r->status);

  if (!answered(kind, r)) /* the frame's status and message alone */
    return n + (m ? kvs_compact_msg_size(m) : 0);
  switch (kind) {
  case KVS_COMPACT_PING:
    return n + r->pong.len;
  case KVS_COMPACT_BATCH: {
    const Kvshare__PackedBatchResult *pr = r->packed_batch;

    n += pr->results.len + pr->data.len;
    for (i = 0; i < pr->n_messages && i < pr->n_message_ops; i++)
      n += kvs_compact_msg_size(
          (uint32_t)strnlen(pr->messages[i], KVS_COMPACT_MSG_MAX));
    return n;
  }
  default: /* one op: its record, its blocks, its message */
    return n + KVS_PACKED_RESULT_SIZE + 4 * op_blocks(r) +
           (m ? kvs_compact_msg_size(m) : 0);
  }
}

/* One message entry at p; returns the byte after it. */
static uint8_t *put_msg(uint8_t *p, uint32_t op, const char *s, uint32_t n) {
  uint64_t sz = kvs_compact_msg_size(n);

  memcpy(p, &op, 4);
  memcpy(p + 4, &n, 4);
  memcpy(p + 8, s, n);
  memset(p + 8 + n, 0, (size_t)sz - 8 - n);
  return p + sz;
}

void compact_reply_encode(uint8_t kind, uint64_t seq,
                          const Kvshare__Response *r, uint8_t *out,
                          size_t len) {
  size_t i;
  uint8_t *p = out + KVS_FRAME_HEADER_SIZE + KVS_COMPACT_HDR;
  kvs_compact_rep h = {seq, status_of(r), 0, 0, 0};
  uint32_t m = msg_len(r->status);

  kvs_frame_header_encode_flags(out, (uint32_t)(len - KVS_FRAME_HEADER_SIZE),
                                KVS_FRAME_COMPACT);
  if (!answered(kind, r)) {
    if (h.status == 0) /* (never: a refusal has its status) */
      h.status = KVS_EPROTO;
    if (m) {
      h.nmsg = 1;
      put_msg(p, KVS_COMPACT_FRAME_MSG, r->status->message, m);
    }
  } else if (kind == KVS_COMPACT_PING) {
    h.count = (uint32_t)r->pong.len;
    if (r->pong.len)
      memcpy(p, r->pong.data, r->pong.len);
  } else if (kind == KVS_COMPACT_BATCH) {
    const Kvshare__PackedBatchResult *pr = r->packed_batch;

    h.count = (uint32_t)(pr->results.len / KVS_PACKED_RESULT_SIZE);
    h.words = (uint32_t)(pr->data.len / 4);
    if (pr->results.len)
      memcpy(p, pr->results.data, pr->results.len);
    p += pr->results.len;
    if (pr->data.len)
      memcpy(p, pr->data.data, pr->data.len);
    p += pr->data.len;
    for (i = 0; i < pr->n_messages && i < pr->n_message_ops; i++, h.nmsg++)
      p = put_msg(p, pr->message_ops[i], pr->messages[i],
                  (uint32_t)strnlen(pr->messages[i], KVS_COMPACT_MSG_MAX));
  } else {
    uint32_t nd = 0;

    /* the record, then its blocks (4-byte aligned: out is, and the header
     * and the record are multiples of 4) */
    h.count = 1;
    disp_pack_result(r, p, (uint32_t *)(void *)(p + KVS_PACKED_RESULT_SIZE),
                     &nd);
    h.words = nd;
    p += KVS_PACKED_RESULT_SIZE + (size_t)nd * 4;
    if (m) {
      h.nmsg = 1;
      put_msg(p, 0, r->status->message, m);
    }
  }
  kvs_compact_rep_put(out + KVS_FRAME_HEADER_SIZE, &h);
}
