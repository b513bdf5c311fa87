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

  if (size > b->limit - b->used)
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

int kvs_envelope_unpack(const uint8_t *payload, size_t len,
                        size_t alloc_limit, Kvshare__Envelope **out) {
  struct budget b = {0, alloc_limit ? alloc_limit : KVS_UNPACK_LIMIT(len)};
  ProtobufCAllocator a = {budget_alloc, budget_free, &b};

  *out = kvshare__envelope__unpack(&a, len, payload);
  return *out ? 0 : KVS_EPROTO;
}

void kvs_envelope_free(Kvshare__Envelope *env) {
  if (env)
    kvshare__envelope__free_unpacked(env, NULL);
}
