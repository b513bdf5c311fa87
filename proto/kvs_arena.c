/*
 * kvs_arena.c — the bump allocator of kvs_arena.h.
 */
#include "kvs_arena.h"

#include <stdlib.h>

#include "kvs_frame.h"

#define CHUNK_MIN (16u << 10)
#define CHUNK_KEEP (64u << 10)

struct kvs__chunk {
  kvs__chunk *next; /* older */
  size_t size, used;
  max_align_t data[];
};

void *kvs__arena_alloc(kvs__arena *a, size_t size) {
  kvs__chunk *c = a->head;
  size_t need = (size + 15) & ~(size_t)15;
  void *p;

  if (need == 0)
    need = 16;
  /* Charged as the decode's scan bounds it (kvs__unpack_cost). */
  if (need < size || (a->limit && need + 16 > a->limit - a->total))
    return NULL;
  if (!c || c->size - c->used < need) {
    size_t cap = c ? c->size * 2 : CHUNK_MIN;

    while (cap < need)
      cap *= 2;
    c = malloc(sizeof(*c) + cap);
    if (!c)
      return NULL;
    c->size = cap;
    c->used = 0;
    c->next = a->head;
    a->head = c;
  }
  p = (char *)c->data + c->used;
  c->used += need;
  a->total += need + 16;
  return p;
}

void kvs__arena_reset(kvs__arena *a) {
  kvs__chunk *c = a->head;

  if (a->total == 0 && a->limit == 0)
    return; /* nothing handed out since the last reset */
  /* Free every chunk but the oldest, and that one too when it is big. */
  while (c && (c->next || c->size > CHUNK_KEEP)) {
    kvs__chunk *next = c->next;

    free(c);
    c = next;
  }
  a->head = c;
  if (c)
    c->used = 0;
  a->total = 0;
  a->limit = 0;
}

void kvs__arena_destroy(kvs__arena *a) {
  kvs__chunk *c = a->head;

  while (c) {
    kvs__chunk *next = c->next;

    free(c);
    c = next;
  }
  a->head = NULL;
  a->total = 0;
  a->limit = 0;
}

static void *pb_alloc(void *data, size_t size) {
  return kvs__arena_alloc(data, size);
}

static void pb_free(void *data, void *p) {
  (void)data;
  (void)p; /* the arena is reset as a whole */
}

int kvs__arena_unpack(kvs__arena *a, const uint8_t *payload, size_t len,
                      size_t alloc_limit, kvs_payload_scan *scan,
                      Kvshare__Envelope **out) {
  ProtobufCAllocator pa = {pb_alloc, pb_free, a};
  kvs_payload_scan own;
  size_t budget;
  int rc;

  *out = NULL;
  if (!scan)
    scan = &own;
  if (!alloc_limit)
    alloc_limit = KVS_UNPACK_LIMIT(len, KVS_UNPACK_OPS_DEFAULT);
  rc = kvs_envelope_scan(payload, len, scan);
  if (rc < 0)
    return rc;
  if (scan->alloc_bound > alloc_limit)
    return KVS_ELIMIT;
  budget = kvs__unpack_budget(scan, alloc_limit);
  /* The budget counts from what the arena already holds. */
  a->limit = a->total + budget < a->total ? SIZE_MAX : a->total + budget;
  *out = kvshare__envelope__unpack(&pa, len, payload);
  a->limit = 0;
  return *out ? 0 : KVS_EPROTO;
}
