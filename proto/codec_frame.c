/*
 * codec_frame.c — a call's frames, by its shape, to the codec that writes
 * and reads them (kvs_codec.h): codec_envelope.c for the Envelope shapes,
 * codec_compact.c for the compact ones.
 */
#include <string.h>

#include "codec_int.h"
#include "kvs_frame.h"

size_t kvs_reply_size(kvs_reply *r, const kvs_call *call, kvs__arena *a) {
  return kvs_shape_is_compact(call->shape) ? kvs__compact_reply_size(r, call)
                                           : kvs__env_reply_size(r, call, a);
}

void kvs_reply_encode(const kvs_reply *r, uint8_t *out) {
  if (kvs_shape_is_compact(r->call->shape))
    kvs__compact_reply_encode(r, out);
  else
    kvs__env_reply_encode(r, out);
}

size_t kvs_request_size(kvs_request *r, const kvs_call *call,
                        kvs__arena *a) {
  return kvs_shape_is_compact(call->shape)
             ? kvs__compact_request_size(r, call)
             : kvs__env_request_size(r, call, a);
}

void kvs_request_encode(const kvs_request *r, uint8_t *out) {
  if (kvs_shape_is_compact(r->call->shape))
    kvs__compact_request_encode(r, out);
  else
    kvs__env_request_encode(r, out);
}

int kvs_reply_decode(kvs_call *call, const uint8_t *frame, size_t flen,
                     uint32_t max_batch_ops, kvs__arena *a) {
  call->status = 0;
  call->message = NULL;
  memset(call->res, 0, (call->nops ? call->nops : 1) * sizeof(*call->res));
  /* A compact call may be answered with an Envelope (the daemon refused
   * the frame as a whole before it could read it as compact); an Envelope
   * call never with a compact frame. */
  if (kvs_frame_flags(frame) & KVS_FRAME_COMPACT)
    return kvs_shape_is_compact(call->shape)
               ? kvs__compact_reply_decode(call, frame, flen, a)
               : KVS_EPROTO;
  if (kvs_shape_is_compact(call->shape)) {
    /* read as the one-op Envelope it stands for: its status alone */
    kvs_call as = *call;
    int rc;

    as.shape = KVS_SHAPE_OP;
    rc = kvs__env_reply_decode(&as, frame, flen, max_batch_ops, a);
    if (rc == 0 && !as.status)
      return KVS_EPROTO; /* (never: only refusals come this way) */
    call->status = as.status;
    call->message = as.message;
    if (call->shape == KVS_SHAPE_COMPACT_OP)
      call->res[0] = as.res[0];
    return rc;
  }
  return kvs__env_reply_decode(call, frame, flen, max_batch_ops, a);
}
