/*
 * arena.c — libkvshare: a bump allocator for decoded replies.
 *
 * protobuf-c allocates every sub-message, repeated field and string of a
 * decoded message separately; for a batch reply of a few hundred ops that is
 * a thousand malloc/free pairs, the largest share of a batched step's cost
 * on the client.  Replies are decoded into an arena instead and dropped all
 * at once.  The arena is bounded like proto/'s decoder (KVS_UNPACK_LIMIT of
 * the payload), so a small malicious reply cannot make it grow without end.
 */
#include <stdlib.h>

#include "client/client_int.h"

#define ARENA_CHUNK (64u << 10)
#define ARENA_ALIGN 16u

struct kvs__chunk {
  struct kvs__chunk *next;
  size_t size, used;
  _Alignas(16) unsigned char data[];
};

static void *arena_alloc(void *data, size_t size) {
  kvs__arena *a = data;
  size = (size + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
  if (size == 0)
    size = ARENA_ALIGN;
  if (a->total + size > a->limit)
    return NULL;
  struct kvs__chunk *ch = a->head;
  if (!ch || ch->size - ch->used < size) {
    size_t csize = size > ARENA_CHUNK ? size : ARENA_CHUNK;
    ch = malloc(sizeof *ch + csize);
    if (!ch)
      return NULL;
    ch->size = csize;
    ch->used = 0;
    ch->next = a->head;
    a->head = ch;
  }
  void *p = ch->data + ch->used;
  ch->used += size;
  a->total += size;
  return p;
}

static void arena_free(void *data, void *ptr) {
  (void)data;
  (void)ptr; /* everything goes at kvs__arena_reset */
}

void kvs__arena_reset(kvs__arena *a) {
  /* Keep one chunk (the oldest, a standard one when replies are small) for
   * the next reply. */
  struct kvs__chunk *ch = a->head, *keep = NULL;
  while (ch) {
    struct kvs__chunk *next = ch->next;
    if (!next && ch->size == ARENA_CHUNK)
      keep = ch;
    else
      free(ch);
    ch = next;
  }
  if (keep) {
    keep->used = 0;
    keep->next = NULL;
  }
  a->head = keep;
  a->total = 0;
}

void kvs__arena_destroy(kvs__arena *a) {
  kvs__arena_reset(a);
  free(a->head);
  a->head = NULL;
}

int kvs__arena_unpack(kvs__arena *a, const uint8_t *payload, size_t len,
                      Kvshare__Envelope **out) {
  ProtobufCAllocator al = {arena_alloc, arena_free, a};
  a->limit = a->total + KVS_UNPACK_LIMIT(len);
  *out = kvshare__envelope__unpack(&al, len, payload);
  return *out ? 0 : KVS_EPROTO;
}
