/*
 * session.h — one connection = one session: frames in, through the
 * codecs (proto/kvs_codec.h) to ops, run by dispatch, their results back
 * through the same codec, frames out.
 *
 * A session's life: accepted (NEW) -> its Hello answered by a Welcome and
 * the pool's descriptors (OPEN) -> closing: no more input, queued replies
 * written (CLOSING) -> its handle closed (CLOSED) -> gone, freed once
 * nothing it started is in flight.  Its hold state says what its next
 * reply waits for: nothing (READY), a copy job the daemon makes for it
 * (COPYING), an op moving bytes through the tiers (WAITING); while held,
 * no further frame of the session is read, so replies stay in order.
 *
 * Every session shares one hub: the loop, the options, what their ops run
 * against (dispatch), the traffic counters, the frame arena and the write
 * buffers kept for reuse.  serve.c owns the hub.
 */
#ifndef KVS_DAEMON_SESSION_H
#define KVS_DAEMON_SESSION_H

#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "daemon/config.h"
#include "daemon/dispatch/dispatch.h"
#include "daemon/net/ring.h"
#include "daemon/net/sockpoll.h"
#include "daemon/observe/metrics.h"
#include "kvs_arena.h"

typedef struct sess sess;
struct wreq;

typedef struct sess_hub {
  uv_loop_t *loop;
  const cfg *cfg;
  /* What the sessions' ops run against: one env per partition (one
   * without tenants; a session runs against its tenant's), and the
   * observers' (a peer in no tenant that maps nothing: no core). */
  disp_env *const *parts;
  uint32_t nparts;
  disp_env *observer;
  metrics *metrics;      /* NULL: off */
  rings *rings;          /* NULL: off */
  uid_t self_uid;
  sess *sessions;        /* every open connection (doubly linked) */
  uint64_t next_session_id;
  int stopping;
  disp_counts counts;    /* Stats reads them (disp->counts) */
  kvs__arena arena;      /* the frame being handled: its ops and reply */
  struct wreq *wspare;   /* small reply buffers kept for reuse */
  uint32_t nwspare;
  /* Called when a session is gone for good (serve.c: a shutdown may be
   * over). */
  void (*on_gone)(void *data);
  void *data;
  sockpoll poll;         /* socket_poll_us (serve.c starts and closes it) */
} sess_hub;

/* The ring owner's functions the hub gives rings_start. */
extern const ring_owner_ops sess_ring_ops;

/* Accepts one connection from the listener (checks the peer, the limit). */
void sess_accept(sess_hub *h, uv_stream_t *listener);
/* Frees every request of the session now; the connection closes once
 * queued replies are written (or at once when force). */
void sess_shutdown(sess *c, int force);
/* sess_shutdown of every session. */
void sess_shutdown_all(sess_hub *h, int force);
/* Closes (after an EPROTO reply) every session that has not sent its
 * Hello within handshake_timeout_ms of its accept, and every one stalled
 * in the middle of a frame for frame_timeout_ms. */
void sess_sweep(sess_hub *h);
/* Frees what the hub keeps (at exit, every session gone). */
void sess_hub_free(sess_hub *h);

#endif
