#include "kvs_frame.h"

#include <malloc.h>
#include <stdlib.h>
#include <string.h>

static void put_u16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}

static void put_u32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
  p[2] = (uint8_t)(v >> 16);
  p[3] = (uint8_t)(v >> 24);
}

static uint16_t get_u16(const uint8_t *p) {
  return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t get_u32(const uint8_t *p) {
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
         ((uint32_t)p[3] << 24);
}

void kvs_frame_header_encode(uint8_t out[KVS_FRAME_HEADER_SIZE],
                             uint32_t length) {
  put_u32(out, KVS_FRAME_MAGIC);
  put_u16(out + 4, (uint16_t)KVS_PROTO_VERSION);
  put_u16(out + 6, 0);
  put_u32(out + 8, length);
}

int kvs_frame_header_decode(const uint8_t in[KVS_FRAME_HEADER_SIZE],
                            uint32_t max_frame, kvs_frame_header *h) {
  h->magic = get_u32(in);
  h->version = get_u16(in + 4);
  h->flags = get_u16(in + 6);
  h->length = get_u32(in + 8);
  if (h->magic != KVS_FRAME_MAGIC)
    return KVS_EPROTO;
  if (h->version != KVS_PROTO_VERSION)
    return KVS_EVERSION;
  if (h->flags != 0)
    return KVS_EPROTO;
  if (h->length > max_frame)
    return KVS_ETOOBIG;
  return 0;
}

int kvs_frame_parse(const uint8_t *buf, size_t avail, uint32_t max_frame,
                    size_t *frame_len) {
  kvs_frame_header h;
  int rc;

  *frame_len = KVS_FRAME_HEADER_SIZE;
  if (avail < KVS_FRAME_HEADER_SIZE)
    return 0;
  rc = kvs_frame_header_decode(buf, max_frame, &h);
  if (rc < 0)
    return rc;
  *frame_len = KVS_FRAME_HEADER_SIZE + (size_t)h.length;
  return avail >= *frame_len ? 1 : 0;
}

size_t kvs_frame_size(const Kvshare__Envelope *env) {
  return KVS_FRAME_HEADER_SIZE + kvshare__envelope__get_packed_size(env);
}

long kvs_frame_pack_into(const Kvshare__Envelope *env, uint32_t max_frame,
                         uint8_t *buf, size_t cap) {
  size_t len = kvshare__envelope__get_packed_size(env);

  if (len > max_frame || len > UINT32_MAX)
    return KVS_ETOOBIG;
  if (cap < KVS_FRAME_HEADER_SIZE + len)
    return KVS_ERANGE;
  kvs_frame_header_encode(buf, (uint32_t)len);
  kvshare__envelope__pack(env, buf + KVS_FRAME_HEADER_SIZE);
  return (long)(KVS_FRAME_HEADER_SIZE + len);
}

int kvs_frame_pack(const Kvshare__Envelope *env, uint32_t max_frame,
                   uint8_t **out, size_t *out_len) {
  size_t len = kvshare__envelope__get_packed_size(env);
  uint8_t *buf;

  *out = NULL;
  *out_len = 0;
  if (len > max_frame || len > UINT32_MAX)
    return KVS_ETOOBIG;
  buf = malloc(KVS_FRAME_HEADER_SIZE + len);
  if (!buf)
    return KVS_ENOMEM;
  kvs_frame_header_encode(buf, (uint32_t)len);
  kvshare__envelope__pack(env, buf + KVS_FRAME_HEADER_SIZE);
  *out = buf;
  *out_len = KVS_FRAME_HEADER_SIZE + len;
  return 0;
}

/*
 * The decoder's allocator: plain malloc/free (so the envelope can later be
 * freed with protobuf-c's default allocator), keeping count of the bytes live
 * while decoding (protobuf-c also allocates scratch space it frees before it
 * returns) and refusing an allocation that would go over the budget.
 */
struct budget {
  size_t used, limit;
};

static void *budget_alloc(void *data, size_t size) {
  struct budget *b = data;
  void *p;

  /* used may pass limit by malloc's rounding: then limit - used would wrap
   * around and let any size through. */
  if (b->used >= b->limit || size > b->limit - b->used)
    return NULL;
  p = malloc(size);
  if (p)
    b->used += malloc_usable_size(p);
  return p;
}

static void budget_free(void *data, void *p) {
  struct budget *b = data;

  if (p)
    b->used -= malloc_usable_size(p);
  free(p);
}

/* Reads a varint at *p (below end); 0, or -1 when it is cut or too long. */
static int read_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
  unsigned shift = 0;

  *v = 0;
  while (*p < end && shift < 64) {
    uint8_t b = *(*p)++;

    *v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80))
      return 0;
    shift += 7;
  }
  return -1;
}

/*
 * protobuf-c unpacks nested messages by recursion with no depth limit, so a
 * few tens of kilobytes of Request { Batch { Request { Batch ... } } } would
 * overflow the stack.  This walks the wire format with the message's
 * descriptor first, descending only into message-typed fields, and refuses a
 * payload nested deeper than KVS_UNPACK_MAX_DEPTH (or malformed on the way).
 * Its own recursion is bounded by that limit.
 */
static int check_nesting(const ProtobufCMessageDescriptor *d,
                         const uint8_t *p, const uint8_t *end,
                         unsigned depth) {
  if (depth > KVS_UNPACK_MAX_DEPTH)
    return -1;
  while (p < end) {
    uint64_t key, v;

    if (read_varint(&p, end, &key) < 0)
      return -1;
    switch (key & 7) {
    case 0: /* varint */
      if (read_varint(&p, end, &v) < 0)
        return -1;
      break;
    case 1: /* 64-bit */
      if ((size_t)(end - p) < 8)
        return -1;
      p += 8;
      break;
    case 5: /* 32-bit */
      if ((size_t)(end - p) < 4)
        return -1;
      p += 4;
      break;
    case 2: { /* length-delimited: bytes, string, packed, or a message */
      const ProtobufCFieldDescriptor *f = NULL;

      if (read_varint(&p, end, &v) < 0 || v > (uint64_t)(end - p))
        return -1;
      if ((key >> 3) <= UINT32_MAX)
        f = protobuf_c_message_descriptor_get_field(d, (unsigned)(key >> 3));
      if (f && f->type == PROTOBUF_C_TYPE_MESSAGE &&
          check_nesting(f->descriptor, p, p + v, depth + 1) < 0)
        return -1;
      p += v;
      break;
    }
    default: /* groups (3, 4) and unknown wire types: protobuf-c refuses */
      return -1;
    }
  }
  return 0;
}

int kvs_envelope_unpack(const uint8_t *payload, size_t len,
                        size_t alloc_limit, Kvshare__Envelope **out) {
  struct budget b = {0, alloc_limit ? alloc_limit : KVS_UNPACK_LIMIT(len)};
  ProtobufCAllocator a = {budget_alloc, budget_free, &b};

  return kvs_envelope_unpack_with(payload, len, &a, out);
}

int kvs_envelope_unpack_with(const uint8_t *payload, size_t len,
                             ProtobufCAllocator *alloc,
                             Kvshare__Envelope **out) {
  *out = NULL;
  if (check_nesting(&kvshare__envelope__descriptor, payload, payload + len,
                    0) < 0)
    return KVS_EPROTO;
  *out = kvshare__envelope__unpack(alloc, len, payload);
  return *out ? 0 : KVS_EPROTO;
}

void kvs_envelope_free(Kvshare__Envelope *env) {
  if (env)
    kvshare__envelope__free_unpacked(env, NULL);
}
