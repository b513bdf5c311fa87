/*
 * kvs_frame.h — framing of the kvshare wire protocol.
 *
 * A connection carries frames.  Each frame is a 12-byte header followed by
 * `length` bytes: one serialized kvshare.Envelope (proto/kvshare.proto).
 *
 *   offset 0  u32 magic    KVS_FRAME_MAGIC ("KVS1" in memory order)
 *   offset 4  u16 version  KVS_PROTO_VERSION
 *   offset 6  u16 flags    0 (reserved; a nonzero value is a protocol error)
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

#include "kvs_status.h"
#include "kvshare.pb-c.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVS_FRAME_MAGIC 0x3153564Bu /* bytes 'K' 'V' 'S' '1' */
#define KVS_PROTO_VERSION 1u
#define KVS_FRAME_HEADER_SIZE 12u
/* The default largest payload a peer accepts (the daemon's is configurable
 * and announced in Welcome.max_frame). */
#define KVS_FRAME_MAX_DEFAULT (16u << 20)
/* Most file descriptors one frame may carry (SCM_RIGHTS; the Welcome). */
#define KVS_FRAME_MAX_FDS 16u

typedef struct kvs_frame_header {
  uint32_t magic;
  uint16_t version;
  uint16_t flags;
  uint32_t length;
} kvs_frame_header;

/* Writes the header of a frame carrying `length` payload bytes. */
void kvs_frame_header_encode(uint8_t out[KVS_FRAME_HEADER_SIZE],
                             uint32_t length);

/*
 * Reads and checks a header.  Fills *h (always, so a caller can report what
 * it saw) and returns 0, or:
 *   KVS_EPROTO    wrong magic or nonzero flags
 *   KVS_EVERSION  version != KVS_PROTO_VERSION
 *   KVS_ETOOBIG   length > max_frame
 */
int kvs_frame_header_decode(const uint8_t in[KVS_FRAME_HEADER_SIZE],
                            uint32_t max_frame, kvs_frame_header *h);

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
 * Decodes one payload (the bytes after the header).  At most alloc_limit
 * bytes are live at any time while decoding (0 = KVS_UNPACK_LIMIT(len)), so
 * a payload cannot make the decoder allocate out of proportion to its size.
 * Real messages decode to a few times their wire size; a large Batch of
 * empty ops (about 20 times) is refused by the default limit.  Returns 0
 * and *out (free with kvs_envelope_free), or KVS_EPROTO (undecodable, over
 * the allocation limit, or messages nested deeper than
 * KVS_UNPACK_MAX_DEPTH).
 */
#define KVS_UNPACK_LIMIT(len) ((size_t)(len) * 16u + (1u << 20))
/* Deepest nesting of messages accepted (the Envelope is depth 0; a Batch
 * inside a Batch is depth 4).  Deeper payloads are refused with KVS_EPROTO
 * before protobuf-c, which recurses without a limit, sees them. */
#define KVS_UNPACK_MAX_DEPTH 16u
int kvs_envelope_unpack(const uint8_t *payload, size_t len,
                        size_t alloc_limit, Kvshare__Envelope **out);

/* The same checks (the nesting depth) with the caller's allocator, which
 * enforces its own limit; the caller frees the envelope accordingly (e.g.
 * all at once, with an arena). */
int kvs_envelope_unpack_with(const uint8_t *payload, size_t len,
                             ProtobufCAllocator *alloc,
                             Kvshare__Envelope **out);

/* Frees an envelope from kvs_envelope_unpack.  NULL is fine. */
void kvs_envelope_free(Kvshare__Envelope *env);

#ifdef __cplusplus
}
#endif
#endif /* KVS_FRAME_H */
