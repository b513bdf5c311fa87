/*
 * kvs_compact.h — compact frames: one call in fixed-width fields, with no
 * protobuf message on either side (internal: shared by the daemon and
 * libkvshare, not installed).
 *
 * A frame whose header carries KVS_FRAME_COMPACT holds, instead of an
 * Envelope, one of three requests in the records of kvs_packed.h:
 *   KVS_COMPACT_OP     one op record (Lookup without a salt, Allocate,
 *                      Append, Commit, Fork, Free, Preempt), run exactly as
 *                      the same Request sent alone (a Lookup may promote);
 *   KVS_COMPACT_BATCH  count op records, run as a PackedBatch;
 *   KVS_COMPACT_PING   count bytes, echoed back.
 * The daemon answers a compact frame with a compact frame.  A client sends
 * them only to a daemon whose Welcome.features has KVS_FEATURE_COMPACT.
 * All fields are little-endian.
 *
 * Request payload:
 *    0  u64  seq
 *    8  u8   kind     KVS_COMPACT_*
 *    9  u8   0, 0, 0
 *   12  u32  count    op records (1 for KVS_COMPACT_OP), or ping bytes
 *   16  u32  words    u32 words of data after the records
 *   20  u32  0
 *   24  count * KVS_PACKED_OP_SIZE bytes of records, then words * 4 bytes
 *       (the records' token and block arrays); a ping: count bytes.
 *
 * Reply payload:
 *    0  u64  seq      the request's (0 when it could not be read)
 *    8  i32  status   the frame's: 0, or why nothing ran (a malformed
 *                     frame, a batch over the limits, a reply too big; then
 *                     count and words are 0, and the message is filed under
 *                     KVS_COMPACT_FRAME_MSG); for KVS_COMPACT_OP, the op's
 *                     status, in its record too
 *   12  u32  count    result records, or ping bytes
 *   16  u32  words    u32 words of data after the records
 *   20  u32  nmsg     messages after the data
 *   24  count * KVS_PACKED_RESULT_SIZE bytes of results (their blocks in
 *       the data, as in a PackedBatchResult), words * 4 bytes of data, then
 *       nmsg messages, each { u32 op, u32 len, len bytes, zeros to a
 *       multiple of 4 }: op is the op the message is for, or
 *       KVS_COMPACT_FRAME_MSG for the frame's status.  A ping: count bytes.
 *
 * Every length is checked against the frame's: a compact request that does
 * not add up is answered with KVS_EPROTO and the session goes on (the
 * frame's length says where the next one starts).
 */
#ifndef KVS_COMPACT_H
#define KVS_COMPACT_H

#include <stdint.h>
#include <string.h>

#include "kvs_packed.h"

/* Welcome.features: the daemon takes compact frames. */
#define KVS_FEATURE_COMPACT 2u

#define KVS_COMPACT_HDR 24u
#define KVS_COMPACT_OP 1u
#define KVS_COMPACT_BATCH 2u
#define KVS_COMPACT_PING 3u
/* The op a message about the whole frame is filed under. */
#define KVS_COMPACT_FRAME_MSG UINT32_MAX
/* A message's bytes at most (a Status message's length). */
#define KVS_COMPACT_MSG_MAX 255u

typedef struct kvs_compact_req {
  uint64_t seq;
  uint8_t kind;
  uint32_t count, words;
} kvs_compact_req;

typedef struct kvs_compact_rep {
  uint64_t seq;
  int32_t status;
  uint32_t count, words, nmsg;
} kvs_compact_rep;

static inline void kvs_compact_req_put(uint8_t *p, const kvs_compact_req *r) {
  memset(p, 0, KVS_COMPACT_HDR);
  memcpy(p, &r->seq, 8);
  p[8] = r->kind;
  memcpy(p + 12, &r->count, 4);
  memcpy(p + 16, &r->words, 4);
}

static inline void kvs_compact_req_get(const uint8_t *p, kvs_compact_req *r) {
  memcpy(&r->seq, p, 8);
  r->kind = p[8];
  memcpy(&r->count, p + 12, 4);
  memcpy(&r->words, p + 16, 4);
}

static inline void kvs_compact_rep_put(uint8_t *p, const kvs_compact_rep *r) {
  memset(p, 0, KVS_COMPACT_HDR);
  memcpy(p, &r->seq, 8);
  memcpy(p + 8, &r->status, 4);
  memcpy(p + 12, &r->count, 4);
  memcpy(p + 16, &r->words, 4);
  memcpy(p + 20, &r->nmsg, 4);
}

static inline void kvs_compact_rep_get(const uint8_t *p, kvs_compact_rep *r) {
  memcpy(&r->seq, p, 8);
  memcpy(&r->status, p + 8, 4);
  memcpy(&r->count, p + 12, 4);
  memcpy(&r->words, p + 16, 4);
  memcpy(&r->nmsg, p + 20, 4);
}

/* Bytes a message of len bytes takes (its op, its length, padding). */
static inline uint64_t kvs_compact_msg_size(uint32_t len) {
  return 8 + (((uint64_t)len + 3) & ~(uint64_t)3);
}

/* The payload bytes of a request (from its header); 64-bit so that no
 * count can wrap it. */
static inline uint64_t kvs_compact_req_size(const kvs_compact_req *r) {
  if (r->kind == KVS_COMPACT_PING)
    return (uint64_t)KVS_COMPACT_HDR + r->count;
  return (uint64_t)KVS_COMPACT_HDR + (uint64_t)r->count * KVS_PACKED_OP_SIZE +
         (uint64_t)r->words * 4;
}

#endif
