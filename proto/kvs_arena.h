/*
 * kvs_arena.h — a bump allocator for decoded messages, shared by the daemon
 * and libkvshare (internal: not installed).
 *
 * protobuf-c allocates every sub-message, repeated field and string of a
 * decoded message separately; a batch of a few hundred ops is then a
 * thousand malloc/free pairs.  Decoding into an arena instead costs one
 * reset.  Chunks grow as needed (16 KiB, doubling); a reset keeps the oldest
 * chunk when it is at most 64 KiB, so a steady stream of small frames does no
 * malloc at all.  `limit` (0 = none) caps what is handed out, each
 * allocation charged kvs__unpack_cost (kvs_frame.h): the decode
 * (kvs__arena_unpack, kvs_frame.h) sets it from the payload's scan and
 * clears it afterwards, so a small malicious frame cannot make the arena
 * grow without end.  Nothing here knows protobuf: the codecs' own structs
 * (kvs_op.h) live in arenas too.
 */
#ifndef KVS_ARENA_H
#define KVS_ARENA_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvs__chunk kvs__chunk;
typedef struct kvs__arena {
  kvs__chunk *head; /* the chunk being filled; older ones behind it */
  size_t total;     /* charged since the reset (kvs__unpack_cost each) */
  size_t limit;     /* 0 = none */
} kvs__arena;
#define KVS__ARENA_INIT {NULL, 0, 0}

/* 16-byte aligned memory valid until the next reset; NULL past the limit or
 * when malloc fails. */
void *kvs__arena_alloc(kvs__arena *a, size_t size);
/* Forgets every allocation; keeps the oldest chunk (up to 64 KiB). */
void kvs__arena_reset(kvs__arena *a);
/* Frees every chunk; the arena may be used again. */
void kvs__arena_destroy(kvs__arena *a);

#endif
