/*
 * codec_int.h — what the codec files share among themselves (not used
 * outside proto/).
 */
#ifndef KVS_CODEC_INT_H
#define KVS_CODEC_INT_H

#include "kvs_codec.h"
#include "kvs_packed.h"

/* Bytes of v as a protobuf varint. */
size_t kvs__varint_size(uint64_t v);

/* Does a failed op's result carry a message to send? */
static inline int kvs__has_message(const kvs_op_result *r) {
  return r->status != 0 && r->message && r->message[0];
}
/* A status message as sent: cut to KVS_MESSAGE_MAX bytes. */
static inline uint32_t kvs__message_len(const char *m) {
  size_t n = 0;

  while (m && n < KVS_MESSAGE_MAX && m[n])
    n++;
  return (uint32_t)n;
}

/* ---- codec_packed.c: one op as a fixed-width record ---------------------- */

/* Record i (KVS_PACKED_OP_SIZE bytes at rec) as an op, its arrays pointing
 * into data (words u32 words).  A record that cannot be read (an op with no
 * record form, arrays outside data) comes as KVS_OP_NONE with res set. */
void kvs__record_decode(const uint8_t *rec, size_t i, const uint32_t *data,
                        size_t words, kvs_op *op, kvs_op_result *res,
                        kvs__arena *a);
/* The u32 words op's arrays take in a packed data field. */
uint32_t kvs__record_words(const kvs_op *op);
/* Writes op's record at rec, its arrays at word *nd of data (any
 * alignment; *nd advances). */
void kvs__record_encode(const kvs_op *op, uint8_t *rec, uint8_t *data,
                        uint32_t *nd);
/* The result record of an op with this code at rec, its blocks at data +
 * *nd (*nd advances). */
void kvs__result_record_encode(unsigned code, const kvs_op_result *r,
                               uint8_t *rec, uint32_t *data, uint32_t *nd);
/* A result record as the result of an op with this code (its blocks in
 * data, words u32 words; its message is the caller's).  KVS_EPROTO when it
 * does not fit the op. */
int kvs__result_record_decode(unsigned code, const uint8_t *rec,
                              const uint32_t *data, size_t words,
                              kvs_op_result *r);

/* Records (nrec of them at recs) and their data as call's ops; refused as
 * a whole (call->status) past max_batch_ops.  0 or KVS_ENOMEM. */
int kvs__records_decode(kvs_call *call, const uint8_t *recs, size_t nrec,
                        const uint32_t *data, size_t words,
                        uint32_t max_batch_ops, kvs__arena *a);
/* The u32 words the results of call's ops return, and how many of them
 * carry a message. */
void kvs__results_count(const kvs_call *call, size_t *words, size_t *nmsg);
/* Writes call's result records at recs and their blocks at data. */
void kvs__results_write(const kvs_call *call, uint8_t *recs, uint32_t *data);

/* ---- codec_envelope.c and codec_compact.c: the shapes of each -------------- */

size_t kvs__env_reply_size(kvs_reply *r, const kvs_call *call, kvs__arena *a);
void kvs__env_reply_encode(const kvs_reply *r, uint8_t *out);
size_t kvs__env_request_size(kvs_request *r, const kvs_call *call,
                             kvs__arena *a);
void kvs__env_request_encode(const kvs_request *r, uint8_t *out);
int kvs__env_reply_decode(kvs_call *call, const uint8_t *frame, size_t flen,
                          uint32_t max_batch_ops, kvs__arena *a);

size_t kvs__compact_reply_size(kvs_reply *r, const kvs_call *call);
void kvs__compact_reply_encode(const kvs_reply *r, uint8_t *out);
size_t kvs__compact_request_size(kvs_request *r, const kvs_call *call);
void kvs__compact_request_encode(const kvs_request *r, uint8_t *out);
int kvs__compact_reply_decode(kvs_call *call, const uint8_t *frame,
                              size_t flen, kvs__arena *a);

#endif
