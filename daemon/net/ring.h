/*
 * ring.h — request rings beside the sockets (shm/kvs_ring.h has the
 * layout and the sleep/wake protocol both sides follow).
 *
 * A session whose client asks for a ring gets one (ring_open): the ring's
 * memfd and the client's end of a wake channel (a socket pair) go with its
 * Welcome.  The rings are polled from a uv_idle handle, which keeps the
 * loop from blocking, for ring_poll_us after the last request taken; then
 * the daemon sleeps (each ring's daemon_sleeping flag set, re-checked
 * after a fence) until a byte on some wake channel (a uv_poll) wakes it.
 *
 * This module knows nothing of sessions: each ring has an owner, and the
 * owner's three functions, given once to rings_start, say whether its ring
 * may be read now, take a request (a copy of the frame, out of the
 * mapping: the client can write it at any time), and close an owner whose
 * client closed its wake channel.
 */
#ifndef KVS_DAEMON_RING_H
#define KVS_DAEMON_RING_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "daemon/config.h"

typedef struct rings rings;
typedef struct sring sring;

typedef struct ring_owner_ops {
  /* May owner's ring be read now?  (Not while its reply is held back,
   * its replies pile up unread, or it is closing.) */
  int (*ready)(void *owner);
  /* A request taken from owner's ring: frame (len bytes, header
   * included), valid during the call; NULL when its length is over the
   * ring's area.  Its reply goes back with ring_reply. */
  void (*frame)(void *owner, const uint8_t *frame, size_t len);
  /* owner's ring cannot be served any more (why: for the log): its
   * client closed its end of the wake channel, or a request could not be
   * taken. */
  void (*gone)(void *owner, const char *why);
} ring_owner_ops;

/* Starts the rings (*out = NULL when c->ring_bytes is 0).  0, or a
 * negative status (logged). */
int rings_start(uv_loop_t *loop, const cfg *c, const ring_owner_ops *ops,
                rings **out);
/* Logs the counts and closes the poller (rings still open are the
 * owners' to free).  NULL: nothing. */
void rings_stop(rings *g);
/* Since start: requests taken, replies that did not fit a ring, wake-ups
 * of the daemon. */
void rings_counts(const rings *g, uint64_t *requests,
                  uint64_t *socket_replies, uint64_t *wakeups);

/* A ring for owner: fds[0..1] = the ring's memfd and the client's end of
 * its wake channel (send them with the Welcome, then ring_handed closes
 * the daemon's copy of the client's end).  0, or a negative status. */
int ring_open(rings *g, void *owner, int fds[2], uint32_t *area,
              sring **out);
void ring_handed(sring *r);
/* The owner is gone: its ring goes (its wake handle closes, then it is
 * freed).  NULL: nothing. */
void ring_free(sring *r);
/* The owner may be read again: a request posted meanwhile is taken now. */
void ring_resume(sring *r);
/* Answers the request taken with the framed reply: 0 when it went through
 * the ring; 1 when it does not fit (the ring says so: send it on the
 * socket). */
int ring_reply(sring *r, const uint8_t *frame, size_t len);
/* For the log line of the owner's close: what went through its ring. */
void ring_describe(const sring *r, char *buf, size_t len);

#endif
