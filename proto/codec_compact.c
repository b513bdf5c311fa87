/*
 * codec_compact.c — compact frames (kvs_compact.h), both ways: one op's
 * record, a batch of records, or a Ping's bytes, with no protobuf message
 * on either side.  The records themselves are codec_packed.c's.
 *
 * The daemon reads a compact request only from its own memory (its read
 * buffer, or its copy of a ring request): the data words are read in
 * place when aligned, else from an aligned copy in the arena.
 */
#include <stdio.h>
#include <string.h>

#include "codec_int.h"
#include "kvs_compact.h"
#include "kvs_frame.h"
#include "kvs_status.h"

/* ---- requests (the daemon reads, the client writes) ----------------------- */

static int refuse(kvs_call *call, kvs__arena *a, size_t len,
                  const char *what) {
  call->shape = KVS_SHAPE_COMPACT_BAD;
  kvs_call_refuse(call, a, KVS_EPROTO, "compact frame of %zu bytes: %s", len,
                  what);
  return call->status;
}

int kvs_compact_decode_request(const uint8_t *payload, size_t len,
                               uint32_t max_batch_ops, kvs__arena *a,
                               kvs_call *call) {
  const uint8_t *body = payload + KVS_COMPACT_HDR;
  const uint32_t *data = NULL;
  static const uint8_t zero[12];
  kvs_compact_req h;
  char what[160];

  call->seq = 0;
  call->nops = 0;
  call->ops = NULL;
  call->res = NULL;
  call->status = 0;
  call->message = NULL;
  call->shape = KVS_SHAPE_COMPACT_BAD;
  if (len >= 8)
    memcpy(&call->seq, payload, 8);
  if (len < KVS_COMPACT_HDR)
    return refuse(call, a, len, "shorter than its 24-byte header");
  kvs_compact_req_get(payload, &h);
  if (h.kind < KVS_COMPACT_OP || h.kind > KVS_COMPACT_PING) {
    snprintf(what, sizeof(what), "unknown kind %u", (unsigned)h.kind);
    return refuse(call, a, len, what);
  }
  if (memcmp(payload + 9, zero, 3) || memcmp(payload + 20, zero, 4))
    return refuse(call, a, len, "reserved header bytes are not zero");
  if (kvs_compact_req_size(&h) != len ||
      (h.kind == KVS_COMPACT_PING && h.words != 0)) {
    snprintf(what, sizeof(what), "its header says %llu bytes (kind %u, "
             "count %u, words %u)",
             (unsigned long long)kvs_compact_req_size(&h), (unsigned)h.kind,
             h.count, h.words);
    return refuse(call, a, len, what);
  }
  if (h.kind == KVS_COMPACT_OP && h.count != 1) {
    snprintf(what, sizeof(what), "one op holds %u records", h.count);
    return refuse(call, a, len, what);
  }
  /* It adds up: answered in its kind's shape from here on. */
  call->shape = h.kind == KVS_COMPACT_OP      ? KVS_SHAPE_COMPACT_OP
                : h.kind == KVS_COMPACT_BATCH ? KVS_SHAPE_COMPACT_BATCH
                                              : KVS_SHAPE_COMPACT_PING;
  if (h.kind == KVS_COMPACT_PING) {
    if (kvs_call_alloc(call, 1, a) < 0)
      goto nomem;
    /* (the bytes stay in the frame: a Ping is answered before the frame's
     * buffer is touched again, never held) */
    call->ops[0].code = KVS_OP_PING;
    call->ops[0].bytes = body;
    call->ops[0].nbytes = h.count;
    return 0;
  }
  if (h.count > max_batch_ops) {
    kvs_call_refuse(call, a, KVS_ELIMIT, "batch of %u ops is over "
                    "max_batch_ops (%u); none ran", h.count, max_batch_ops);
    return KVS_ELIMIT;
  }
  if (h.words) {
    const uint8_t *d = body + (size_t)h.count * KVS_PACKED_OP_SIZE;

    if (((uintptr_t)d & 3) == 0) {
      data = (const uint32_t *)(const void *)d;
    } else {
      uint32_t *copy = kvs__arena_alloc(a, (size_t)h.words * 4);

      if (!copy)
        goto nomem;
      memcpy(copy, d, (size_t)h.words * 4);
      data = copy;
    }
  }
  /* (records are read with kvs_pop_get: any alignment) */
  if (kvs__records_decode(call, body, h.count, data, h.words, max_batch_ops,
                          a) < 0)
    goto nomem;
  return 0;
nomem:
  kvs_call_refuse(call, a, KVS_ENOMEM, "compact frame of %zu bytes: out of "
                  "memory", len);
  return KVS_ENOMEM;
}

size_t kvs__compact_request_size(kvs_request *r, const kvs_call *call) {
  uint64_t words = 0, len = KVS_COMPACT_HDR;

  r->call = call;
  r->len = 0;
  if (call->shape == KVS_SHAPE_COMPACT_PING) {
    if (call->nops != 1)
      return 0;
    len += call->ops[0].nbytes;
  } else {
    uint64_t recs = kvs_records_size(call);

    if ((call->shape == KVS_SHAPE_COMPACT_OP && call->nops != 1) ||
        (call->nops && recs == 0))
      return 0;
    words = (recs - (uint64_t)call->nops * KVS_PACKED_OP_SIZE) / 4;
    if (words > UINT32_MAX)
      return 0;
    len += recs;
  }
  if (len > UINT32_MAX)
    return 0;
  r->nwords = (size_t)words;
  r->len = KVS_FRAME_HEADER_SIZE + (size_t)len;
  return r->len;
}

void kvs__compact_request_encode(const kvs_request *r, uint8_t *out) {
  const kvs_call *call = r->call;
  uint8_t *p = out + KVS_FRAME_HEADER_SIZE + KVS_COMPACT_HDR;
  kvs_compact_req h;
  uint32_t nd = 0;

  memset(&h, 0, sizeof(h));
  h.seq = call->seq;
  kvs_frame_header_encode_flags(out, (uint32_t)(r->len -
                                                KVS_FRAME_HEADER_SIZE),
                                KVS_FRAME_COMPACT);
  if (call->shape == KVS_SHAPE_COMPACT_PING) {
    h.kind = KVS_COMPACT_PING;
    h.count = call->ops[0].nbytes;
    if (h.count)
      memcpy(p, call->ops[0].bytes, h.count);
  } else {
    /* records, then the data */
    uint8_t *d = p + (size_t)call->nops * KVS_PACKED_OP_SIZE;

    h.kind = call->shape == KVS_SHAPE_COMPACT_OP ? KVS_COMPACT_OP
                                                 : KVS_COMPACT_BATCH;
    h.count = call->nops;
    h.words = (uint32_t)r->nwords;
    for (uint32_t i = 0; i < call->nops; i++)
      kvs__record_encode(&call->ops[i], p + (size_t)i * KVS_PACKED_OP_SIZE, d,
                         &nd);
  }
  kvs_compact_req_put(out + KVS_FRAME_HEADER_SIZE, &h);
}

/* ---- replies (the daemon writes, the client reads) ------------------------ */

/* Does the reply carry what the call asked for, rather than the frame's
 * status alone?  One op: always (its record carries its status). */
static int answered(const kvs_call *call) {
  if (call->shape == KVS_SHAPE_COMPACT_OP)
    return 1;
  return call->status == 0 && (call->shape == KVS_SHAPE_COMPACT_BATCH ||
                               call->shape == KVS_SHAPE_COMPACT_PING);
}

/* One op's result: the op's own, or the call's refusal in its place. */
static kvs_op_result one_result(const kvs_call *call) {
  kvs_op_result r;

  if (call->status || call->nops == 0) {
    memset(&r, 0, sizeof(r));
    r.status = call->status ? call->status : KVS_EINTERNAL;
    r.message = call->message;
    return r;
  }
  return call->res[0];
}

size_t kvs__compact_reply_size(kvs_reply *rep, const kvs_call *call) {
  size_t n = KVS_FRAME_HEADER_SIZE + KVS_COMPACT_HDR, words, nmsg;

  rep->call = call;
  rep->sizes = NULL;
  rep->resp = NULL;
  if (!answered(call)) { /* the frame's status and message alone */
    uint32_t m = kvs__message_len(call->message);

    rep->len = n + (m ? kvs_compact_msg_size(m) : 0);
  } else if (call->shape == KVS_SHAPE_COMPACT_PING) {
    rep->len = n + call->res[0].u.pong.len;
  } else if (call->shape == KVS_SHAPE_COMPACT_BATCH) {
    kvs__results_count(call, &words, &nmsg);
    rep->words = words; /* (for kvs__compact_reply_encode) */
    rep->nmsg = nmsg;
    n += (size_t)call->nops * KVS_PACKED_RESULT_SIZE + words * 4;
    for (uint32_t i = 0; nmsg && i < call->nops; i++)
      if (kvs__has_message(&call->res[i]))
        n += kvs_compact_msg_size(kvs__message_len(call->res[i].message));
    rep->len = n;
  } else { /* one op: its record, its blocks, its message */
    kvs_op_result r = one_result(call);
    uint32_t m = r.status ? kvs__message_len(r.message) : 0;
    unsigned code = call->nops ? call->ops[0].code : 0;
    size_t blocks = r.status == 0 && (code == KVS_OP_LOOKUP ||
                                      code == KVS_OP_ALLOCATE ||
                                      code == KVS_OP_APPEND)
                        ? r.nblocks
                        : 0;

    rep->len = n + KVS_PACKED_RESULT_SIZE + 4 * blocks +
               (m ? kvs_compact_msg_size(m) : 0);
  }
  return rep->len;
}

/* One message entry at p; returns the byte after it. */
static uint8_t *put_msg(uint8_t *p, uint32_t op, const char *s) {
  uint32_t n = kvs__message_len(s);
  uint64_t sz = kvs_compact_msg_size(n);

  memcpy(p, &op, 4);
  memcpy(p + 4, &n, 4);
  memcpy(p + 8, s, n);
  memset(p + 8 + n, 0, (size_t)sz - 8 - n);
  return p + sz;
}

void kvs__compact_reply_encode(const kvs_reply *rep, uint8_t *out) {
  const kvs_call *call = rep->call;
  uint8_t *p = out + KVS_FRAME_HEADER_SIZE + KVS_COMPACT_HDR;
  kvs_compact_rep h = {call->seq, 0, 0, 0, 0};

  kvs_frame_header_encode_flags(out, (uint32_t)(rep->len -
                                                KVS_FRAME_HEADER_SIZE),
                                KVS_FRAME_COMPACT);
  if (!answered(call)) {
    h.status = call->status ? call->status : KVS_EPROTO;
    if (kvs__message_len(call->message)) {
      h.nmsg = 1;
      put_msg(p, KVS_COMPACT_FRAME_MSG, call->message);
    }
  } else if (call->shape == KVS_SHAPE_COMPACT_PING) {
    h.count = call->res[0].u.pong.len;
    if (h.count)
      memcpy(p, call->res[0].u.pong.data, h.count);
  } else if (call->shape == KVS_SHAPE_COMPACT_BATCH) {
    h.count = call->nops;
    h.words = (uint32_t)rep->words;
    kvs__results_write(call, p,
                       (uint32_t *)(void *)(p + (size_t)call->nops *
                                                    KVS_PACKED_RESULT_SIZE));
    p += (size_t)call->nops * KVS_PACKED_RESULT_SIZE + rep->words * 4;
    for (uint32_t i = 0; rep->nmsg && i < call->nops; i++)
      if (kvs__has_message(&call->res[i])) {
        p = put_msg(p, i, call->res[i].message);
        h.nmsg++;
      }
  } else {
    kvs_op_result r = one_result(call);
    uint32_t nd = 0;

    /* the record, then its blocks (4-byte aligned: out is, and the header
     * and the record are multiples of 4) */
    h.status = r.status;
    h.count = 1;
    kvs__result_record_encode(call->nops ? call->ops[0].code : 0, &r, p,
                              (uint32_t *)(void *)(p +
                                                   KVS_PACKED_RESULT_SIZE),
                              &nd);
    h.words = nd;
    p += KVS_PACKED_RESULT_SIZE + (size_t)nd * 4;
    if (kvs__has_message(&r)) {
      h.nmsg = 1;
      put_msg(p, 0, r.message);
    }
  }
  kvs_compact_rep_put(out + KVS_FRAME_HEADER_SIZE, &h);
}

/* A copy of n message bytes as a string in the arena (NULL when out of
 * memory). */
static char *keep_str(kvs__arena *a, const uint8_t *p, uint32_t n) {
  char *s = kvs__arena_alloc(a, (size_t)n + 1);

  if (s) {
    memcpy(s, p, n);
    s[n] = '\0';
  }
  return s;
}

int kvs__compact_reply_decode(kvs_call *call, const uint8_t *frame,
                              size_t flen, kvs__arena *a) {
  const uint8_t *pl = frame + KVS_FRAME_HEADER_SIZE;
  size_t plen = flen - KVS_FRAME_HEADER_SIZE;
  const uint8_t *body = pl + KVS_COMPACT_HDR, *q, *end = pl + plen;
  const uint8_t *msg = NULL;
  uint32_t msg_n = 0;
  int ping = call->shape == KVS_SHAPE_COMPACT_PING;
  int batch = call->shape == KVS_SHAPE_COMPACT_BATCH;
  kvs_compact_rep h;
  uint64_t need;

  if (plen < KVS_COMPACT_HDR)
    return KVS_EPROTO;
  kvs_compact_rep_get(pl, &h);
  if (h.seq != call->seq || h.status > 0 || (ping && h.words))
    return KVS_EPROTO;
  need = ping && h.status == 0
             ? (uint64_t)KVS_COMPACT_HDR + h.count
             : (uint64_t)KVS_COMPACT_HDR +
                   (uint64_t)h.count * KVS_PACKED_RESULT_SIZE +
                   (uint64_t)h.words * 4;
  if (need > plen || h.nmsg > plen / 8)
    return KVS_EPROTO;
  /* The messages: each within the payload, and nothing after them. */
  q = pl + need;
  for (uint32_t i = 0; i < h.nmsg; i++) {
    uint32_t op, n;

    if ((size_t)(end - q) < 8)
      return KVS_EPROTO;
    memcpy(&op, q, 4);
    memcpy(&n, q + 4, 4);
    if (n > KVS_COMPACT_MSG_MAX || kvs_compact_msg_size(n) > (size_t)(end - q))
      return KVS_EPROTO;
    if (batch && h.status == 0 && op >= h.count)
      return KVS_EPROTO;
    if (!msg) {
      msg = q + 8;
      msg_n = n;
    }
    q += kvs_compact_msg_size(n);
  }
  if (q != end)
    return KVS_EPROTO;
  if (h.status && (!(call->shape == KVS_SHAPE_COMPACT_OP) ||
                   (h.count == 0 && h.words == 0))) {
    /* A refusal of the whole frame (any kind): its status alone. */
    if (h.count || h.words)
      return KVS_EPROTO;
    call->status = h.status;
    call->message = msg ? keep_str(a, msg, msg_n) : "";
    if (!call->message)
      return KVS_ENOMEM;
    if (call->shape == KVS_SHAPE_COMPACT_OP) {
      call->res[0].status = call->status;
      call->res[0].message = call->message;
    }
    return 0;
  }
  if (ping) {
    /* (left in the receive buffer: it stays until the next call) */
    call->res[0].u.pong.data = h.count ? body : NULL;
    call->res[0].u.pong.len = h.count;
    return 0;
  }
  if (batch) {
    const uint32_t *data = NULL;

    if (h.count != call->nops)
      return KVS_EPROTO;
    /* A batch's results outlive the next call: copied into the arena. */
    if (h.words) {
      uint32_t *d = kvs__arena_alloc(a, (size_t)h.words * 4);

      if (!d)
        return KVS_ENOMEM;
      memcpy(d, body + (size_t)h.count * KVS_PACKED_RESULT_SIZE,
             (size_t)h.words * 4);
      data = d;
    }
    for (uint32_t i = 0; i < h.count; i++)
      if (kvs__result_record_decode(call->ops[i].code,
                                    body + (size_t)i * KVS_PACKED_RESULT_SIZE,
                                    data, h.words, &call->res[i]) < 0)
        return KVS_EPROTO;
    q = pl + need;
    for (uint32_t i = 0; i < h.nmsg; i++) {
      uint32_t op, n;

      memcpy(&op, q, 4);
      memcpy(&n, q + 4, 4);
      if (call->res[op].status) {
        call->res[op].message = keep_str(a, q + 8, n);
        if (!call->res[op].message)
          return KVS_ENOMEM;
      }
      q += kvs_compact_msg_size(n);
    }
    return 0;
  }
  { /* one op: one record, whose status is the frame's */
    kvs_pres p;
    const uint32_t *blocks;
    kvs_op_result *r = &call->res[0];

    if (h.count != 1)
      return KVS_EPROTO;
    kvs_pres_get(body, &p);
    if (p.status != h.status || !kvs_packed_in(p.blk_off, p.blk_n, h.words))
      return KVS_EPROTO;
    if (h.status) {
      r->status = call->status = h.status;
      r->message = call->message = msg ? keep_str(a, msg, msg_n) : "";
      return r->message ? 0 : KVS_ENOMEM;
    }
    /* The blocks stay in the receive buffer until the next call, where
     * they are aligned (else a copy in the arena). */
    blocks = (const uint32_t *)(const void *)(body + KVS_PACKED_RESULT_SIZE);
    if (((uintptr_t)blocks & 3) != 0 && h.words) {
      uint32_t *d = kvs__arena_alloc(a, (size_t)h.words * 4);

      if (!d)
        return KVS_ENOMEM;
      memcpy(d, blocks, (size_t)h.words * 4);
      blocks = d;
    }
    return kvs__result_record_decode(call->ops[0].code, body, blocks,
                                     h.words, r) < 0
               ? KVS_EPROTO
               : 0;
  }
}
