/*
 * kvs_frame.h — framing of the kvshare wire protocol.
 *
 * A connection carries frames.  Each frame is a 12-byte header followed by
 * `length` bytes: one serialized kvshare.Envelope (proto/kvshare.proto).
 *
 *   offset 0  u32 magic    KVS_FRAME_MAGIC ("KVS1" in memory order)
 *   offset 4  u16 version  KVS_PROTO_VERSION
 *   offset 6  u16 flags    0, or KVS_FRAME_COMPACT: the payload is a compact
 *                          request or reply (kvs_compact.h), not an Envelope;
 *                          any other bit is a protocol error
 *   offset 8  u32 length   payload bytes, <= the receiver's max frame
 *
 * All header fields are little-endian.  A receiver checks the header before
 * it allocates anything for the payload; a header that fails the check means
 * the stream cannot be resynchronised and the connection must be closed.
 *
 * Ownership: every function that returns a buffer or an Envelope hands it to
 * the caller, who frees it with free() (buffers) or kvs_envelope_free()
 * (envelopes).  Nothing here logs, blocks or keeps global state.
 */
#ifndef KVS_FRAME_H
#define KVS_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "kvs_arena.h"
#include "kvs_status.h"
#include "kvshare.pb-c.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVS_FRAME_MAGIC 0x3153564Bu /* bytes 'K' 'V' 'S' '1' */
#define KVS_PROTO_VERSION 1u
#define KVS_FRAME_HEADER_SIZE 12u
/* Header flags: the payload is a compact frame (kvs_compact.h). */
#define KVS_FRAME_COMPACT 1u
/* The default largest payload a peer accepts (the daemon's is configurable
 * and announced in Welcome.max_frame). */
#define KVS_FRAME_MAX_DEFAULT (16u << 20)
/* Most file descriptors one frame may carry (SCM_RIGHTS; the Welcome). */
#define KVS_FRAME_MAX_FDS 20u

/* One daemon per GPU, their sockets in one folder (kvshared's socket_dir,
 * a folder given to kvs_connect): a GPU pool's socket is
 * <dir>/<GPU UUID>KVS_SOCKET_GPU_SUFFIX, a host pool's
 * <dir>/KVS_SOCKET_HOST_NAME. */
#define KVS_SOCKET_GPU_SUFFIX ".sock"
#define KVS_SOCKET_HOST_NAME "kvshared.sock"

typedef struct kvs_frame_header {
  uint32_t magic;
  uint16_t version;
  uint16_t flags;
  uint32_t length;
} kvs_frame_header;

/* Writes the header of a frame carrying `length` payload bytes. */
void kvs_frame_header_encode(uint8_t out[KVS_FRAME_HEADER_SIZE],
                             uint32_t length);
/* The same with header flags (0 or KVS_FRAME_COMPACT). */
void kvs_frame_header_encode_flags(uint8_t out[KVS_FRAME_HEADER_SIZE],
                                   uint32_t length, uint16_t flags);

/*
 * Reads and checks a header.  Fills *h (always, so a caller can report what
 * it saw) and returns 0, or:
 *   KVS_EPROTO    wrong magic, or a flag other than KVS_FRAME_COMPACT
 *   KVS_EVERSION  version != KVS_PROTO_VERSION
 *   KVS_ETOOBIG   length > max_frame
 */
int kvs_frame_header_decode(const uint8_t in[KVS_FRAME_HEADER_SIZE],
                            uint32_t max_frame, kvs_frame_header *h);

/* The flags of a header that kvs_frame_header_decode (or kvs_frame_parse)
 * accepted: 0, or KVS_FRAME_COMPACT. */
static inline uint16_t kvs_frame_flags(const uint8_t hdr[KVS_FRAME_HEADER_SIZE]) {
  return (uint16_t)(hdr[6] | hdr[7] << 8);
}

/*
 * Incremental parsing: looks at the `avail` bytes buffered at buf.
 * Returns 1 and sets *frame_len (header + payload) when a whole frame is
 * there; 0 when more bytes are needed (*frame_len is then the total the
 * frame will need once its header is known, or KVS_FRAME_HEADER_SIZE);
 * or a negative status from kvs_frame_header_decode.
 */
int kvs_frame_parse(const uint8_t *buf, size_t avail, uint32_t max_frame,
                    size_t *frame_len);

/* Bytes the framed envelope takes (header included). */
size_t kvs_frame_size(const Kvshare__Envelope *env);

/*
 * Serializes env as one frame into buf (capacity cap).  Returns the bytes
 * written, or KVS_ETOOBIG when the payload exceeds max_frame, KVS_ERANGE when
 * cap is too small.
 */
long kvs_frame_pack_into(const Kvshare__Envelope *env, uint32_t max_frame,
                         uint8_t *buf, size_t cap);

/*
 * Serializes env as one frame into a new malloc'ed buffer (*out, *out_len).
 * Returns 0, KVS_ETOOBIG or KVS_ENOMEM.
 */
int kvs_frame_pack(const Kvshare__Envelope *env, uint32_t max_frame,
                   uint8_t **out, size_t *out_len);

/*
 * What a first pass over a payload finds before anything is allocated
 * (kvs_envelope_scan): the envelope's seq, so that even a payload refused
 * later can be answered in its place; and a bound on what decoding it will
 * allocate, so that a receiver can refuse it without trying.
 */
typedef struct kvs_payload_scan {
  uint64_t seq;       /* Envelope.seq (0 when absent or past a fault) */
  size_t messages;    /* messages in the payload, the Envelope included */
  size_t alloc_bound; /* what decoding it allocates, at most (in
                         kvs__unpack_cost units) */
} kvs_payload_scan;

/*
 * Walks a payload: the wire format, the nesting depth (at most
 * KVS_UNPACK_MAX_DEPTH) and the bound.  Returns 0, or KVS_EPROTO when the
 * payload is malformed or nested too deep (s->seq is still set when the
 * seq came before the fault).
 */
int kvs_envelope_scan(const uint8_t *payload, size_t len,
                      kvs_payload_scan *s);

/*
 * The most a receiver lets the decode of a len-byte payload allocate: 16
 * bytes per byte plus 1 MiB, and KVS_UNPACK_OP_COST more for each op of
 * the largest Batch it accepts (max_ops).  Every frame a sender may send
 * (docs/protocol.md: up to max_frame bytes, up to max_batch_ops ops of any
 * kind) fits; tests/unit/test_proto_decode.c checks it at both limits.
 * A Batch of empty ops (2 bytes each on the wire) takes 68 bytes per wire
 * byte, packed numbers at most 8 plus their message: the per-op allowance
 * is what lets the former through without letting every payload grow 68
 * times.
 */
#define KVS_UNPACK_OP_COST 1024u
#define KVS_UNPACK_OPS_DEFAULT 16384u /* the daemon's default max_batch_ops */
#define KVS_UNPACK_LIMIT(len, max_ops)                                      \
  ((size_t)(len) * 16u + ((size_t)1 << 20) +                                \
   (size_t)(max_ops) * KVS_UNPACK_OP_COST)
/* Deepest nesting of messages accepted (the Envelope is depth 0; a Batch
 * inside a Batch is depth 4).  Deeper payloads are refused with KVS_EPROTO
 * before protobuf-c, which recurses without a limit, sees them. */
#define KVS_UNPACK_MAX_DEPTH 16u

/* What one allocation of n bytes counts for against a decode's limit (the
 * arena's rounding to 16, or malloc's header and rounding). */
static inline size_t kvs__unpack_cost(size_t n) {
  return ((n + 15) & ~(size_t)15) + 16;
}
/* The budget a decode runs under once its scan fits alloc_limit: the bound
 * and some room (for what the bound does not count, such as a merge of a
 * repeated singular message), never more than alloc_limit. */
size_t kvs__unpack_budget(const kvs_payload_scan *s, size_t alloc_limit);

/*
 * Decodes one payload (the bytes after the header), allocating at most
 * alloc_limit bytes in all (0 = KVS_UNPACK_LIMIT(len,
 * KVS_UNPACK_OPS_DEFAULT)).  Returns 0 and *out (free with
 * kvs_envelope_free); KVS_EPROTO when the payload is malformed, nested
 * deeper than KVS_UNPACK_MAX_DEPTH or does not decode; KVS_ELIMIT when its
 * scan's bound is over alloc_limit (nothing was allocated).
 */
int kvs_envelope_unpack(const uint8_t *payload, size_t len,
                        size_t alloc_limit, Kvshare__Envelope **out);

/* Frees an envelope from kvs_envelope_unpack.  NULL is fine. */
void kvs_envelope_free(Kvshare__Envelope *env);

/*
 * Decodes one payload into the arena as kvs_envelope_unpack does: 0,
 * KVS_EPROTO or KVS_ELIMIT (alloc_limit 0 = the same default).  scan, when
 * not NULL, receives the payload's scan, filled even when the decode
 * fails: its seq names the frame to answer.  The envelope lives until the
 * arena is reset; never pass it to kvs_envelope_free.
 */
int kvs__arena_unpack(kvs__arena *a, const uint8_t *payload, size_t len,
                      size_t alloc_limit, kvs_payload_scan *scan,
                      Kvshare__Envelope **out);

#ifdef __cplusplus
}
#endif
#endif /* KVS_FRAME_H */
