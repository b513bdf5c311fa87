/*
 * kvs_codec.h — the codecs: wire bytes <-> ops (kvs_op.h), both ways, for
 * both sides (internal: shared by the daemon and libkvshare, not
 * installed).
 *
 * A call is what one frame carries: an array of ops and, once they ran,
 * their results.  Its shape says how it travels; the reply goes back in
 * the same shape:
 *
 *   KVS_SHAPE_OP             Envelope { Request { one op } }
 *   KVS_SHAPE_BATCH          Envelope { Request { Batch { Request, ... } } }
 *   KVS_SHAPE_PACKED         Envelope { Request { PackedBatch } }: the ops
 *                            as fixed-width records (kvs_packed.h)
 *   KVS_SHAPE_COMPACT_OP     a compact frame (kvs_compact.h): one record
 *   KVS_SHAPE_COMPACT_BATCH  a compact frame: many records
 *   KVS_SHAPE_COMPACT_PING   a compact frame: a Ping's bytes
 *   KVS_SHAPE_COMPACT_BAD    a compact frame that did not add up: answered
 *                            with its status alone
 *
 * Three codecs, one file each, and each holds every op's wire form, both
 * ways: codec_envelope.c (protobuf: Request and Response, Batch, Hello and
 * Welcome), codec_packed.c (the fixed-width records of PackedBatch and of
 * compact frames), codec_compact.c (compact frames around those records).
 * codec.c has what they share, codec_frame.c sends each shape to its
 * codec.  Nothing here does I/O, logs or keeps
 * state; what a decode makes lives in the arena it is given.
 */
#ifndef KVS_CODEC_H
#define KVS_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "kvs_arena.h"
#include "kvs_op.h"

typedef enum kvs_shape {
  KVS_SHAPE_OP = 1,
  KVS_SHAPE_BATCH,
  KVS_SHAPE_PACKED,
  KVS_SHAPE_COMPACT_OP,
  KVS_SHAPE_COMPACT_BATCH,
  KVS_SHAPE_COMPACT_PING,
  KVS_SHAPE_COMPACT_BAD,
} kvs_shape;

/* Is a call of this shape a batch (its ops answered one by one, the call's
 * own status OK), rather than one op? */
static inline int kvs_shape_is_batch(unsigned shape) {
  return shape == KVS_SHAPE_BATCH || shape == KVS_SHAPE_PACKED ||
         shape == KVS_SHAPE_COMPACT_BATCH;
}
static inline int kvs_shape_is_compact(unsigned shape) {
  return shape >= KVS_SHAPE_COMPACT_OP;
}

typedef struct kvs_call {
  uint64_t seq;
  uint8_t shape;         /* kvs_shape */
  uint32_t nops;
  kvs_op *ops;
  kvs_op_result *res;    /* nops of them, zeroed by the decode */
  /* Refused as a whole (nothing ran; no op's result goes back): a batch
   * over max_batch_ops, a frame that does not decode, a reply that would
   * not fit.  For the one-op shapes this is op 0's status. */
  int32_t status;
  const char *message;
  /* Where a call of one op keeps it and its result (kvs_call_alloc): no
   * allocation for the commonest call. */
  kvs_op op1;
  kvs_op_result res1;
} kvs_call;

/* Writes "fmt ..." into the arena as call's refusal (code, message). */
void kvs_call_refuse(kvs_call *call, kvs__arena *a, int code,
                     const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* call's ops and results for n ops, zeroed, in the arena (one op: in the
 * call itself); 0 or KVS_ENOMEM. */
int kvs_call_alloc(kvs_call *call, uint32_t n, kvs__arena *a);

/* ---- the handshake -------------------------------------------------------- */

typedef struct kvs_hello {
  uint32_t version;
  const char *client_name;  /* never NULL after a decode */
  uint32_t pid;
  uint8_t ring;
  uint8_t no_map;           /* the client will not map the pool */
} kvs_hello;

typedef struct kvs_welcome {
  int32_t status;           /* a refusal when < 0 (with message) */
  const char *message;
  uint32_t version;
  uint8_t has_layout, has_pool;
  uint32_t block_size, num_layers, num_kv_heads, head_dim, dtype;
  uint32_t num_blocks;
  uint64_t block_stride;
  const char *backend, *gpu_uuid;  /* the pool */
  uint64_t pool_size, chunk_size;
  uint32_t num_fds;
  uint64_t session_id;
  const char *model_id;
  uint32_t max_frame, max_batch_ops, features, ring_bytes;
  const char *tenant;       /* "" or NULL: none */
} kvs_welcome;

/* ---- the daemon's side ---------------------------------------------------- */

/* What an Envelope frame held. */
typedef enum kvs_env_kind {
  KVS_ENV_REQUEST = 1, /* call holds it */
  KVS_ENV_HELLO,       /* hello holds it */
  KVS_ENV_REPLY,       /* a Welcome or Response: the daemon's to send */
  KVS_ENV_UNKNOWN,     /* no body, or one this version does not know */
  KVS_ENV_BAD,         /* undecodable, or over the decode's limit:
                          call->status and message say which */
} kvs_env_kind;

/*
 * Decodes an Envelope payload (len bytes) into the arena: its kind, and
 * call->seq always (0 when it could not be read).  A Request becomes call
 * (kvs_call_alloc'd); an op the codec cannot read (a Batch inside a Batch,
 * an unknown op, a bad packed record) comes as KVS_OP_NONE with its result
 * set, a batch over max_batch_ops as call->status.
 */
kvs_env_kind kvs_env_decode(const uint8_t *payload, size_t len,
                            uint32_t max_batch_ops, kvs__arena *a,
                            kvs_call *call, kvs_hello *hello);

/*
 * Decodes a compact request payload (len bytes).  0: call holds it.  Else a
 * negative status and call is its refusal: shape KVS_SHAPE_COMPACT_BAD when
 * the frame did not add up (KVS_EPROTO), else its own shape (a batch over
 * max_batch_ops: KVS_ELIMIT).  call->seq is set when it could be read.
 */
int kvs_compact_decode_request(const uint8_t *payload, size_t len,
                               uint32_t max_batch_ops, kvs__arena *a,
                               kvs_call *call);

/*
 * The most the reply to call can take, framed, before it runs: every
 * varint at its widest, every result field present, messages at their
 * longest (in a batch only the first KVS_BATCH_MESSAGES failures carry
 * one), and the block ids each op can return (a Lookup one per block of its
 * tokens, an Allocate or Append num_tokens / block_size + 2, a SwapIn the
 * whole pool; never more than the pool's num_blocks).  *mutates: whether
 * any op changes anything (Stats and Ping do not).
 */
size_t kvs_reply_bound(const kvs_call *call, uint32_t block_size,
                       uint32_t num_blocks, int *mutates);

/* A reply being encoded: sized once, then written. */
typedef struct kvs_reply {
  const kvs_call *call;
  size_t len;              /* framed bytes */
  /* the Envelope's */
  const void *resp;        /* the Kvshare__Response built from the results */
  size_t *sizes;           /* a Batch's replies' sizes, or NULL */
  size_t resp_size, batch_size, payload;
  uint64_t store[8];       /* where resp is (no allocation per reply) */
  /* a compact batch's: its results' block words and messages */
  size_t words, nmsg;
} kvs_reply;

/* The framed size of the reply to call (results in call->res, or its
 * refusal), building what the encoding needs in the arena; 0 when the
 * arena is out of memory.  kvs_reply_encode writes exactly r->len bytes
 * (out 4-byte aligned). */
size_t kvs_reply_size(kvs_reply *r, const kvs_call *call, kvs__arena *a);
void kvs_reply_encode(const kvs_reply *r, uint8_t *out);

/* The Welcome frame (with seq): its size, then its bytes. */
size_t kvs_welcome_frame_size(const kvs_welcome *w, uint64_t seq);
void kvs_welcome_frame_encode(const kvs_welcome *w, uint64_t seq,
                              uint8_t *out, size_t len);

/* ---- the client's side ---------------------------------------------------- */

/* The Hello frame: size, then bytes. */
size_t kvs_hello_frame_size(const kvs_hello *h, uint64_t seq);
void kvs_hello_frame_encode(const kvs_hello *h, uint64_t seq, uint8_t *out,
                            size_t len);
/*
 * Reads the daemon's answer to the Hello (a whole frame, header included):
 * 0 and *w (its strings in the arena; a refusal sent as a Response comes as
 * w->status), or KVS_EPROTO / KVS_ELIMIT.
 */
int kvs_welcome_decode(const uint8_t *frame, size_t flen,
                       uint32_t max_batch_ops, kvs__arena *a,
                       kvs_welcome *w);

/* Can op travel as a packed record (a Lookup only without a salt)? */
int kvs_op_has_record(const kvs_op *op);
/* The bytes call's ops take as packed records and their data words; 0
 * when one of them has no record form. */
uint64_t kvs_records_size(const kvs_call *call);

/*
 * The request frame of call (shape set by the caller: a one-op shape with
 * one op, a batch shape with any), built in the arena where the encoding
 * needs it: its size (0: out of memory, or an op or array too big for the
 * shape's fields), then its bytes.  The ops' arrays are read by the
 * encode, not by the size.
 */
typedef struct kvs_request {
  const kvs_call *call;
  size_t len;
  const void *env;       /* the Kvshare__Envelope (Envelope shapes) */
  size_t nwords;         /* compact shapes: u32 words of data */
  uint64_t store[32];    /* where a one-op Envelope is built */
} kvs_request;
size_t kvs_request_size(kvs_request *r, const kvs_call *call,
                        kvs__arena *a);
void kvs_request_encode(const kvs_request *r, uint8_t *out);

/*
 * Reads the reply (a whole frame, header included) to call, whose seq and
 * shape are those sent, into call->res (zeroed first) and call->status /
 * message, pointing into the frame or the arena.  0: read (the ops'
 * statuses may be errors; a refusal is call->status; for the one-op
 * shapes KVS_SHAPE_OP and KVS_SHAPE_COMPACT_OP, whose refusal and whose
 * op's failure read alike, call->status is op 0's status).  Else the connection
 * cannot go on: KVS_EPROTO (not the reply to call), KVS_ENOMEM, or the
 * status of an error the daemon sent with seq 0 (a frame it could not
 * read; its message in call->message).
 */
int kvs_reply_decode(kvs_call *call, const uint8_t *frame, size_t flen,
                     uint32_t max_batch_ops, kvs__arena *a);

#endif
