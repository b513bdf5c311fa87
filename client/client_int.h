/*
 * client_int.h — libkvshare internals shared by the client sources.  Not installed.
 */
#ifndef KVS_CLIENT_INT_H
#define KVS_CLIENT_INT_H

#include <stddef.h>
#include <stdint.h>

#include "client/kvshare.h"
#include "client/sockpath.h"
#include "kvs_arena.h"
#include "kvs_codec.h"
#include "kvs_op.h"
#include "kvs_ring.h"
#include "kvs_shm.h"
#include "kvs_vmm.h"

/* Largest reply the client accepts before the daemon told its limit. */
#define KVS__CLIENT_MAX_FRAME (64u << 20)

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
  char tenant[32];       /* the Welcome's; "" without tenants, observers */
  uint32_t max_frame;
  uint32_t max_batch_ops; /* Welcome's; bounds the decode of a reply */
  int packed_batch;       /* the daemon takes PackedBatch (Welcome.features)
                             and $KVS_PACKED_BATCH is not 0 */
  int compact;            /* the daemon takes compact frames
                             (Welcome.features) and $KVS_COMPACT is not 0 */
  char msg[512];         /* the daemon's message for the last status */
  int timeout_ms;        /* kvs_connect_opts.timeout_ms */

  /* The request ring (ring.c; Welcome.ring_bytes): rh NULL when none. */
  kvs_region ring;
  kvs_ring_hdr *rh;
  uint32_t ring_area;
  int ring_wfd;          /* our end of the wake channel (both ways) */
  uint64_t ring_seq;
  uint64_t ring_spin_ns; /* $KVS_RING_SPIN_US */
  uint64_t sock_spin_ns; /* $KVS_SOCKET_SPIN_US: a reply's socket polled
                            this long before the call blocks (0: at once) */

  kvs__arena arena;      /* the last reply's results */
  kvs__arena scratch;    /* what encoding a request needs */

  /* Write buffer: the request frame, sent with one send(). */
  uint8_t *wbuf;
  size_t wcap;
  /* Read buffer: bytes received and not yet consumed, [rpos, rlen). */
  uint8_t *rbuf;
  size_t rcap, rpos, rlen;
};

/*
 * One call (conn.c): call->ops[0..nops) and call->res, with call->shape
 * KVS_SHAPE_OP (one op) or KVS_SHAPE_BATCH (any number); the client picks
 * the encoding (a compact frame, a PackedBatch, an Envelope) from what the
 * daemon takes.  The ops' arrays may point into the last reply.  Returns
 * 0 with every result in call->res (statuses may be errors) and the
 * results' arrays in c->arena (or the receive buffer) until the next call;
 * or the call's own failure: the one op's status for KVS_SHAPE_OP, a
 * refusal of the whole batch, ETOOBIG (nothing sent: too big for
 * max_frame), or a transport or protocol error (the client is then broken:
 * ECLOSED, EPROTO, -errno).  The message of the status returned is in
 * c->msg.
 */
int kvs__call(kvs_client *c, kvs_call *call);

/* ops.c: a result as the public struct (res may be NULL). */
void kvs__lookup_result(const kvs_op_result *r, kvs_lookup_result *res);
void kvs__alloc_result(const kvs_op_result *r, kvs_alloc_result *res);

/* conn.c: one whole frame into c->rbuf (*frame, *flen: valid until the
 * next receive); fds passed with it are collected (up to max) or closed. */
int kvs__recv_raw(kvs_client *c, uint32_t max_frame, int *fds, int *nfds,
                  int max, const uint8_t **frame, size_t *flen);

/* ring.c.  Takes the ring's two descriptors (memfd, our end of the wake
 * channel): owned by the client on success, left to the caller on
 * failure. */
int kvs__ring_setup(kvs_client *c, const int fds[2], uint32_t area);
/* CLOCK_MONOTONIC in ns (the ring's and the socket's spins). */
uint64_t kvs__now_ns(void);
void kvs__ring_close(kvs_client *c);
/* Sends the frame in c->wbuf (len bytes, at most c->ring_area) through the
 * ring and receives its reply into c->rbuf (from the ring, or the socket
 * when the daemon put it there).  Then c->rbuf holds one whole frame.
 * 0, or a transport error as kvs__call returns them. */
int kvs__ring_roundtrip(kvs_client *c, size_t len);
int kvs__ensure_cap(uint8_t **buf, size_t *cap, size_t need);


/* sockdir.c.  The socket in the folder `dir` of the daemon of this
 * process's GPU (by CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES) into
 * out: 0, or KVS_ENODEV with msg saying which GPUs were looked for and
 * which daemons are there. */
int kvs__socket_in_dir(const char *dir, char *out, size_t out_len, char *msg,
                       size_t msg_len);

/* Drop the last reply. */
void kvs__drop_last(kvs_client *c);
/* Takes the last reply's memory from the client into *keep (a batch keeps
 * its results), leaving the client an empty arena. */
void kvs__take_reply(kvs_client *c, kvs__arena *keep);

/* Copies src (NULL: "") into dst[cap], cut to fit, always terminated. */
void kvs__copy_str(char *dst, size_t cap, const char *src);

/* A kvs_block_keys as one allocation (free() it) holding the op's keys;
 * NULL with *rc set (KVS_EINVAL: not well formed, KVS_ENOMEM). */
kvs_op_keys *kvs__keys_copy(const kvs_block_keys *k, int *rc);

#endif /* KVS_CLIENT_INT_H */
