/*
 * kvs_packed.h — the fixed-width records of PackedBatch and
 * PackedBatchResult (internal: shared by the daemon and libkvshare, not
 * installed).
 *
 * A Batch costs a protobuf message per op to encode and decode: on a
 * 256-op scheduler step that was most of the daemon's and the client's work.
 * A PackedBatch carries the same ops as records in one `bytes` field and
 * their token and block arrays as u32 words in another; the results come
 * back the same way.  All fields are little-endian; offsets and counts are
 * in u32 words of the `data` field.
 *
 * Op record (KVS_PACKED_OP_SIZE = 40 bytes):
 *   0  u8   op      the Request field number: 1 Lookup, 2 Allocate, 3 Append,
 *                   4 Commit, 5 Fork, 6 Free, 7 Preempt
 *   1  u8   flags   KVS_POP_DAEMON_COPY (Allocate, Append),
 *                   KVS_POP_NO_PROMOTE (Lookup), KVS_POP_HAS_TOKENS (Commit)
 *   2  u16  0
 *   4  u32  n       num_tokens (Allocate, Append, Commit)
 *   8  u64  req_id
 *  16  u64  arg     child_id (Fork), start (Commit)
 *  24  u32  tok_off, 28 u32 tok_n   tokens (Lookup; Commit with HAS_TOKENS)
 *  32  u32  blk_off, 36 u32 blk_n   blocks (Commit)
 *
 * Result record (KVS_PACKED_RESULT_SIZE = 32 bytes):
 *   0  i32  status
 *   4  u32  x       hit_tokens (Lookup), first_index (Allocate, Append),
 *                   sealed (Commit)
 *   8  u32  y       below_tokens (Lookup), cow_index (Allocate, Append)
 *  12  u32  cow_src, 16 u32 cow_dst
 *  20  u32  blk_off, 24 u32 blk_n   the Lookup's table, the blocks added
 *  28  u8   flags   KVS_PRES_HAS_COW, KVS_PRES_COW_COPIED; 29..31 zero
 */
#ifndef KVS_PACKED_H
#define KVS_PACKED_H

#include <stdint.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "packed batches assume a little-endian host"
#endif

/* Welcome.features bits. */
#define KVS_FEATURE_PACKED_BATCH 1u

#define KVS_PACKED_OP_SIZE 40u
#define KVS_PACKED_RESULT_SIZE 32u

#define KVS_POP_DAEMON_COPY 1u
#define KVS_POP_NO_PROMOTE 2u
#define KVS_POP_HAS_TOKENS 4u

#define KVS_PRES_HAS_COW 1u
#define KVS_PRES_COW_COPIED 2u

typedef struct kvs_pop {
  uint8_t op, flags;
  uint32_t n;
  uint64_t req_id, arg;
  uint32_t tok_off, tok_n, blk_off, blk_n;
} kvs_pop;

typedef struct kvs_pres {
  int32_t status;
  uint32_t x, y, cow_src, cow_dst, blk_off, blk_n;
  uint8_t flags;
} kvs_pres;

static inline void kvs_pop_put(uint8_t *p, const kvs_pop *o) {
  memset(p, 0, KVS_PACKED_OP_SIZE);
  p[0] = o->op;
  p[1] = o->flags;
  memcpy(p + 4, &o->n, 4);
  memcpy(p + 8, &o->req_id, 8);
  memcpy(p + 16, &o->arg, 8);
  memcpy(p + 24, &o->tok_off, 4);
  memcpy(p + 28, &o->tok_n, 4);
  memcpy(p + 32, &o->blk_off, 4);
  memcpy(p + 36, &o->blk_n, 4);
}

static inline void kvs_pop_get(const uint8_t *p, kvs_pop *o) {
  o->op = p[0];
  o->flags = p[1];
  memcpy(&o->n, p + 4, 4);
  memcpy(&o->req_id, p + 8, 8);
  memcpy(&o->arg, p + 16, 8);
  memcpy(&o->tok_off, p + 24, 4);
  memcpy(&o->tok_n, p + 28, 4);
  memcpy(&o->blk_off, p + 32, 4);
  memcpy(&o->blk_n, p + 36, 4);
}

static inline void kvs_pres_put(uint8_t *p, const kvs_pres *r) {
  memset(p, 0, KVS_PACKED_RESULT_SIZE);
  memcpy(p, &r->status, 4);
  memcpy(p + 4, &r->x, 4);
  memcpy(p + 8, &r->y, 4);
  memcpy(p + 12, &r->cow_src, 4);
  memcpy(p + 16, &r->cow_dst, 4);
  memcpy(p + 20, &r->blk_off, 4);
  memcpy(p + 24, &r->blk_n, 4);
  p[28] = r->flags;
}

static inline void kvs_pres_get(const uint8_t *p, kvs_pres *r) {
  memcpy(&r->status, p, 4);
  memcpy(&r->x, p + 4, 4);
  memcpy(&r->y, p + 8, 4);
  memcpy(&r->cow_src, p + 12, 4);
  memcpy(&r->cow_dst, p + 16, 4);
  memcpy(&r->blk_off, p + 20, 4);
  memcpy(&r->blk_n, p + 24, 4);
  r->flags = p[28];
}

/* Is [off, off + n) inside a data field of `words` u32 words? */
static inline int kvs_packed_in(uint32_t off, uint32_t n, size_t words) {
  return (size_t)off <= words && (size_t)n <= words - (size_t)off;
}

#endif
