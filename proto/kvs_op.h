/*
 * kvs_op.h — the one operation type of kvshare (internal: shared by the
 * daemon and libkvshare, not installed).
 *
 * Every call a client makes is an array of kvs_op, and every answer an
 * array of kvs_op_result, whatever carried it: an Envelope holding one
 * Request or a Batch, a PackedBatch, a compact frame, a ring frame.  The
 * codecs (kvs_codec.h) turn wire bytes into ops and results into wire
 * bytes, both ways; the daemon's dispatch and the client's calls see only
 * the structs below.
 *
 * Op codes are the field numbers of the Request oneof in kvshare.proto
 * (which are also the `op` byte of a packed record): 9 (Batch) and 13
 * (PackedBatch) are not ops but ways of carrying many.
 *
 * Arrays and strings an op or a result points to belong to whoever decoded
 * or built it (a frame's buffer or arena): they live as long as it does.
 */
#ifndef KVS_OP_H
#define KVS_OP_H

#include <stddef.h>
#include <stdint.h>

#include "kvs_arena.h"

/* X(NAME, code, name) */
#define KVS_OP_MAP(X)                                                        \
  X(LOOKUP, 1, "lookup")                                                     \
  X(ALLOCATE, 2, "allocate")                                                 \
  X(APPEND, 3, "append")                                                     \
  X(COMMIT, 4, "commit")                                                     \
  X(FORK, 5, "fork")                                                         \
  X(FREE, 6, "free")                                                         \
  X(PREEMPT, 7, "preempt")                                                   \
  X(STATS, 8, "stats")                                                       \
  X(PING, 10, "ping")                                                        \
  X(SWAP_OUT, 11, "swap_out")                                                \
  X(SWAP_IN, 12, "swap_in")

typedef enum kvs_opcode {
  /* An op the codec could not read: its result's status is already set
   * (nothing runs it). */
  KVS_OP_NONE = 0,
#define KVS_OP_ENUM(name, code, str) KVS_OP_##name = (code),
  KVS_OP_MAP(KVS_OP_ENUM)
#undef KVS_OP_ENUM
} kvs_opcode;

/* One past the largest code (for tables indexed by code). */
#define KVS_OP_CODES 13u

/* The op's name ("lookup"), or NULL for a code that is no op. */
const char *kvs_op_name(unsigned code);

/* In a batch's answer only the first this many failing ops carry their
 * message; the others carry their code alone, so that a reply's size is
 * bounded by its request (kvs_reply_bound). */
#define KVS_BATCH_MESSAGES 16u
/* A status message's bytes at most (longer ones are cut). */
#define KVS_MESSAGE_MAX 255u

/* kvs_op.flags */
#define KVS_OPF_DAEMON_COPY 1u /* Allocate, Append: the daemon makes the
                                  copy-on-write copy before it answers */
#define KVS_OPF_NO_PROMOTE 2u  /* Lookup: take only blocks in the pool */
#define KVS_OPF_CHECK 4u       /* Stats: also run the pool invariant check */

/* Bytes the op points at: an entry of a repeated bytes field (laid out as
 * protobuf-c's ProtobufCBinaryData, which the codec checks, so that the
 * arrays pass between them uncopied). */
typedef struct kvs_op_bytes {
  size_t len;
  const uint8_t *data;
} kvs_op_bytes;

/* Commit: the engine's keys of the blocks the commit completes, one per
 * block (kvshare.proto's Commit fields 6 to 9); nhashes 0: none. */
typedef struct kvs_op_keys {
  uint32_t nblocks;              /* of hashes or hash_bytes, and extra */
  const uint64_t *hashes;        /* integers, or NULL */
  const kvs_op_bytes *hash_bytes; /* or bytes (1 to 32 each), or NULL */
  const char *lora_name;         /* NULL: none */
  const kvs_op_bytes *extra;     /* msgpack objects (len 0: none), or NULL */
  uint32_t nextra;               /* 0 or nblocks */
} kvs_op_keys;

typedef struct kvs_op {
  uint8_t code;         /* kvs_opcode */
  uint8_t flags;        /* KVS_OPF_* */
  uint64_t req_id;      /* every op but Stats and Ping */
  uint64_t child_id;    /* Fork */
  uint32_t num_tokens;  /* Allocate, Append; Commit when tokens is empty */
  uint32_t start;       /* Commit */
  const uint32_t *tokens; /* Lookup's prompt; Commit's tokens (may be none) */
  uint32_t ntokens;
  const uint32_t *blocks; /* Commit: the block ids the client wrote */
  uint32_t nblocks;
  const uint8_t *bytes; /* Lookup's salt; Ping's payload */
  uint32_t nbytes;
  const kvs_op_keys *keys; /* Commit: the engine's block keys, or NULL */
} kvs_op;

/* One tier below the pool, in a Stats result (top first; the remote tier
 * last). */
typedef struct kvs_op_tier {
  const char *name;     /* "host", "disk", "remote" */
  uint64_t capacity_bytes;
  uint32_t slots, used, held;
  uint64_t demotions, promotions, hit_blocks, drops, failures;
  uint64_t bytes_in, bytes_out, io_errors, checksum_failures;
} kvs_op_tier;

/* One tenant's partition in a Stats answer (kvshare.proto's TenantStats). */
typedef struct kvs_op_tenant {
  const char *name;
  uint32_t num_blocks, free_blocks, cached_blocks, used_blocks;
  uint32_t num_requests, sessions;
  uint64_t lookups, query_tokens, hit_tokens, evictions, no_space;
  uint64_t pool_bytes;
} kvs_op_tenant;

/* What Stats answers (kvshare.proto's StatsResult, field by field). */
typedef struct kvs_op_stats {
  uint32_t num_blocks, free_blocks, cached_blocks, used_blocks;
  uint32_t num_requests, sessions, indexed_blocks, swapped_requests;
  uint64_t lookups, query_tokens, hit_tokens, hit_blocks, miss_blocks;
  uint64_t allocated_blocks, evictions, cow_copies, sealed_blocks, no_space;
  uint64_t frames_in, compact_frames, protocol_errors, queued_bytes;
  const char *backend, *gpu_uuid;
  uint64_t pool_bytes;
  uint64_t daemon_copies, daemon_copy_blocks, copy_errors;
  uint64_t tier_lost;
  uint64_t swap_outs, swap_ins, swap_failures, swap_out_blocks;
  uint64_t swap_kept_blocks, swap_in_blocks, swap_resident_blocks;
  int32_t check;              /* the check's status (KVS_OPF_CHECK) */
  const char *check_message;  /* "" when it passed or did not run */
  const kvs_op_tier *tiers;
  uint32_t ntiers;
  const char *tenant;         /* "" or NULL: none */
  const kvs_op_tenant *tenants;
  uint32_t ntenants;
} kvs_op_stats;

/*
 * The answer to one op.  status 0: the op's result is in the member of u
 * its code names (Fork, Free and Preempt have none), and blocks holds the
 * block ids it returns: Lookup's and SwapIn's block table, the blocks
 * Allocate and Append added.  status < 0: nothing else is set.
 */
typedef struct kvs_op_result {
  int32_t status;       /* 0 or a negative kvs_status */
  const char *message;  /* why, in words; NULL or "": the code alone */
  const uint32_t *blocks;
  uint32_t nblocks;
  union {
    struct {
      uint32_t hit_tokens, promoted_tokens, below_tokens;
    } lookup;
    struct { /* Allocate, Append */
      uint32_t first_index, cow_src, cow_dst, cow_index;
      uint8_t has_cow, cow_copied;
    } alloc;
    struct {
      uint32_t sealed;
    } commit;
    struct { /* SwapOut, SwapIn */
      uint32_t tokens, copied_blocks, lost_tokens;
    } swap;
    struct {
      const uint8_t *data;
      uint32_t len;
    } pong;
    const kvs_op_stats *stats;
  } u;
} kvs_op_result;

/* Sets r's status and message, printf-formatted into the arena (ENOMEM,
 * "out of memory" when the arena cannot hold it).  (codec.c) */
void kvs_result_error(kvs_op_result *r, kvs__arena *a, int code,
                      const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
