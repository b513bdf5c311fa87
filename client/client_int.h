/*
 * client_int.h — libkvshare internals shared by the client sources.  Not installed.
 */
#ifndef KVS_CLIENT_INT_H
#define KVS_CLIENT_INT_H

#include <stddef.h>
#include <stdint.h>

#include "client/kvshare.h"
#include "kvs_arena.h"
#include "kvs_frame.h"
#include "kvs_packed.h"
#include "kvs_ring.h"
#include "kvs_shm.h"
#include "kvs_vmm.h"
#include "kvshare.pb-c.h"

/* Largest reply the client accepts before the daemon told its limit. */
#define KVS__CLIENT_MAX_FRAME (64u << 20)

/* Replies are decoded into a kvs__arena (proto/kvs_arena.h). */

struct kvs_client {
  int fd;
  int broken;            /* transport failed: every call returns ECLOSED */
  uint64_t next_seq;
  kvs_layout layout;
  kvs_region pool;       /* the host pool's mapping (fd -1 when none) */
  kvs_vmm_pool gpu;      /* the cuda pool's mapping (base 0 when none) */
  void *pool_base;       /* NULL when not mapped; a device address (cuda) */
  uint64_t pool_size;
  char backend[16];
  char gpu_uuid[64];     /* the cuda pool's GPU; "" for host */
  int daemon_copy;       /* ask the daemon to make CoW copies */
  int no_promote;        /* lookups take resident blocks only */
  uint64_t session_id;
  char model_id[128];
  uint32_t max_frame;
  uint32_t max_batch_ops; /* Welcome's; bounds the decode of a reply */
  int packed_batch;       /* the daemon takes PackedBatch (Welcome.features)
                             and $KVS_PACKED_BATCH is not 0 */
  int compact;            /* the daemon takes compact frames
                             (Welcome.features) and $KVS_COMPACT is not 0 */
  char msg[256];         /* the daemon's message for the last status */
  int timeout_ms;        /* kvs_connect_opts.timeout_ms */

  /* The request ring (ring.c; Welcome.ring_bytes): rh NULL when none. */
  kvs_region ring;
  kvs_ring_hdr *rh;
  uint32_t ring_area;
  int ring_wfd;          /* our end of the wake channel (both ways) */
  uint64_t ring_seq;
  uint64_t ring_spin_ns; /* $KVS_RING_SPIN_US */

  Kvshare__Envelope *last; /* the last reply; results point into it */
  kvs__arena arena;        /* where the last reply was decoded */

  /* Write buffer: frame header + packed envelope, sent with one send(). */
  uint8_t *wbuf;
  size_t wcap;
  /* Read buffer: bytes received and not yet consumed, [rpos, rlen). */
  uint8_t *rbuf;
  size_t rcap, rpos, rlen;
};

/* Send one request envelope and receive its reply (matching seq).  On
 * success *resp is the reply's Response (owned by the client, valid until
 * the next call) and the return value is the reply's status code (0 or a
 * negative status, message copied into c->msg).  Transport errors mark the
 * client broken and return KVS_ECLOSED / KVS_EPROTO / -errno. */
int kvs__call(kvs_client *c, Kvshare__Request *req, Kvshare__Response **resp);

/* conn.c: one whole frame into c->rbuf (*frame, *flen: valid until the
 * next receive), and the decode of an Envelope frame into c->arena. */
int kvs__recv_raw(kvs_client *c, uint32_t max_frame, int *fds, int *nfds,
                  int max, const uint8_t **frame, size_t *flen);
int kvs__decode_frame(kvs_client *c, const uint8_t *frame, size_t flen,
                      Kvshare__Envelope **out);

/* conn.c: sends the frame in c->wbuf (flen bytes; through the ring when
 * there is one and it fits) and receives the reply frame (see
 * kvs__recv_raw).  0, or a transport error (the caller marks the client
 * broken). */
int kvs__roundtrip(kvs_client *c, size_t flen, const uint8_t **frame,
                   size_t *rlen);

/* conn.c: the reply to the request sent as seq, in frame (an Envelope):
 * checked and kept as kvs__call returns it (a transport or protocol error
 * marks the client broken).  kvs__take_response keeps a reply already
 * decoded (c->last = env, *resp its Response, its status's message in
 * c->msg) and returns its status code. */
int kvs__take_reply(kvs_client *c, const uint8_t *frame, size_t rlen,
                    uint64_t seq, Kvshare__Response **resp);
int kvs__take_response(kvs_client *c, Kvshare__Envelope *env,
                       Kvshare__Response **resp);

/* compact.c: does an op of this kind have a fixed-width record
 * (kvs_packed.h; a Lookup only without a salt)? */
int kvs__op_has_record(Kvshare__Request__OpCase kind, size_t salt_len);
/* The result an op's record stands for, as the Response the protobuf path
 * would have decoded (status 0; blocks: its block ids, NULL for none), in
 * r and m.  KVS_EPROTO when the record does not fit the op. */
typedef union kvs__op_result {
  Kvshare__LookupResult l;
  Kvshare__AllocResult a;
  Kvshare__CommitResult cr;
} kvs__op_result;
int kvs__record_result(Kvshare__Request__OpCase kind, const kvs_pres *p,
                       const uint32_t *blocks, Kvshare__Response *r,
                       kvs__op_result *m);

/* compact.c: can req go as a compact frame (kvs_compact.h)?  And kvs__call
 * for one that can: the same results, as a Response in c->last's arena. */
int kvs__compact_ok(const Kvshare__Request *req);
/* KVS__COMPACT_TOO_BIG: the compact frame would be over max_frame; nothing
 * was sent or dropped (kvs__call then sends an Envelope). */
#define KVS__COMPACT_TOO_BIG 1
int kvs__compact_call(kvs_client *c, Kvshare__Request *req,
                      Kvshare__Response **resp);

/* ring.c.  Takes the ring's two descriptors (memfd, our end of the wake
 * channel): owned by the client on success, left to the caller on
 * failure. */
int kvs__ring_setup(kvs_client *c, const int fds[2], uint32_t area);
void kvs__ring_close(kvs_client *c);
/* Sends the frame in c->wbuf (len bytes, at most c->ring_area) through the
 * ring and receives its reply into c->rbuf (from the ring, or the socket
 * when the daemon put it there).  Then c->rbuf holds one whole frame.
 * 0, or a transport error as kvs__call returns them. */
int kvs__ring_roundtrip(kvs_client *c, size_t len);
int kvs__ensure_cap(uint8_t **buf, size_t *cap, size_t need);

/* The socket path used when none is given (see kvs_connect). */
const char *kvs__default_socket(char *buf, size_t len);

/* Drop the last reply. */
void kvs__drop_last(kvs_client *c);

/* Copies src (NULL: "") into dst[cap], cut to fit, always terminated. */
void kvs__copy_str(char *dst, size_t cap, const char *src);

#endif /* KVS_CLIENT_INT_H */
