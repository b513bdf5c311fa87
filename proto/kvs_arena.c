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
  if (need < size || (a->limit && need > a->limit - a->total))
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
  a->total += need;
  return p;
}

void kvs__arena_reset(kvs__arena *a) {
  kvs__chunk *c = a->head;

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
                      Kvshare__Envelope **out) {
  ProtobufCAllocator pa = {pb_alloc, pb_free, a};
  size_t limit = KVS_UNPACK_LIMIT(len);
  int rc;

  /* The budget counts from what the arena already holds. */
  a->limit = a->total + limit < a->total ? SIZE_MAX : a->total + limit;
  rc = kvs_envelope_unpack_with(payload, len, &pa, out);
  a->limit = 0;
  return rc;
}
