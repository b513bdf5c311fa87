/*
 * kvs_ring.h — a session's request ring: one shared mapping beside its
 * socket, through which a client's calls reach the daemon without a system
 * call while the daemon polls.
 *
 * The mapping is a memfd the daemon creates (size sealed), handed to the
 * client in the Welcome with one end of a Unix socket pair: the session's
 * wake channel, both ways (one byte wakes the other side).  Each side reads
 * and writes its end with MSG_DONTWAIT, a flag of the call that the peer
 * cannot change (an eventfd's O_NONBLOCK belongs to the open file, which a
 * client could clear to block the daemon), and no wake object is shared
 * between sessions.  Layout:
 *
 *   [0, 4096)                    kvs_ring_hdr
 *   [4096, 4096 + area)          the request: one frame, header included
 *   [4096 + area, 4096 + 2*area) the reply: one frame
 *
 * One request at a time (libkvshare's calls are synchronous): the client
 * writes a frame into the request area and posts it (req_len, then req_seq
 * with release order); the daemon copies it out before reading it (the
 * client may write the mapping at any time: nothing in it is trusted),
 * handles it as a socket frame, and answers in the reply area (rep_len, then
 * rep_seq = the req_seq it took).  A reply too big for the area goes on the
 * socket instead, announced by rep_len 0.
 *
 * Sleeping.  Each side spins a short while on the other's counter, then
 * sleeps: it sets its *_sleeping flag, and re-checks the counter after a
 * full fence before it blocks; the other side, after publishing its counter
 * and a full fence, sends a byte on the wake channel when the flag is set.
 * One of the two always sees the other (the flag, or the counter): no lost
 * wake-up.
 */
#ifndef KVS_RING_H
#define KVS_RING_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "kvs_shm.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVS_RING_MAGIC 0x5253564bu /* "KVSR" little-endian */
#define KVS_RING_VERSION 1u
#define KVS_RING_HDR_SIZE 4096u
/* The smallest area worth having: a Ping, a small batch. */
#define KVS_RING_MIN_AREA 4096u

/* Each group on its own cache line: the client writes the second, the
 * daemon the third. */
typedef struct kvs_ring_hdr {
  uint32_t magic, version;
  uint32_t area; /* bytes of each area */
  uint32_t reserved[13];
  _Atomic uint64_t req_seq; /* the client's last request posted */
  _Atomic uint32_t req_len; /* its frame's bytes */
  _Atomic uint32_t client_sleeping;
  uint8_t pad1[48];
  _Atomic uint64_t rep_seq; /* the request last answered */
  _Atomic uint32_t rep_len; /* its reply's bytes; 0: on the socket */
  _Atomic uint32_t daemon_sleeping;
  uint8_t pad2[48];
} kvs_ring_hdr;

static inline size_t kvs_ring_size(uint32_t area) {
  return KVS_RING_HDR_SIZE + 2 * (size_t)area;
}
static inline uint8_t *kvs_ring_req_area(kvs_ring_hdr *h) {
  return (uint8_t *)h + KVS_RING_HDR_SIZE;
}
static inline uint8_t *kvs_ring_rep_area(kvs_ring_hdr *h, uint32_t area) {
  return (uint8_t *)h + KVS_RING_HDR_SIZE + area;
}

/* The daemon: a new ring of `area` bytes each way (a sealed memfd, mapped;
 * header written).  0, KVS_EINVAL (area under KVS_RING_MIN_AREA), -errno. */
int kvs_ring_create(uint32_t area, kvs_region *r);

/* The client: maps a received ring fd and checks its header (the region
 * owns fd on success).  area: the size of each area.  0, KVS_EPROTO (not a
 * ring of this version, or of another size), -errno. */
int kvs_ring_map(int fd, uint32_t area, kvs_region *r);

/* Sends one wake-up byte on a wake channel, never blocking (nothing on
 * error: a channel that is full already wakes its reader). */
void kvs_ring_wake(int fd);
/* Takes what a wake channel holds, never blocking: 1 when it held
 * something, 0 when nothing, -1 when the other end is closed (or the
 * channel failed). */
int kvs_ring_drain(int fd);

/* The client posts request seq (its frame already in the request area),
 * waking the daemon (wake channel wfd) if it sleeps. */
void kvs_ring_post(kvs_ring_hdr *h, uint64_t seq, uint32_t len, int wfd);

/* The daemon: is there a request after `taken`?  1 with *seq and *len (not
 * checked: the caller bounds len by the area), or 0. */
static inline int kvs_ring_peek(kvs_ring_hdr *h, uint64_t taken,
                                uint64_t *seq, uint32_t *len) {
  uint64_t s = atomic_load_explicit(&h->req_seq, memory_order_acquire);
  if (s == taken)
    return 0;
  *seq = s;
  *len = atomic_load_explicit(&h->req_len, memory_order_relaxed);
  return 1;
}

/* The daemon answers request seq (len bytes in the reply area; 0: the reply
 * goes on the socket), waking the client (wake channel wfd) if it sleeps. */
void kvs_ring_answer(kvs_ring_hdr *h, uint64_t seq, uint32_t len, int wfd);

/* The daemon is about to sleep: sets daemon_sleeping, then says whether a
 * request after `taken` came meanwhile (1: it must not sleep; the flag is
 * cleared again). */
int kvs_ring_daemon_sleep(kvs_ring_hdr *h, uint64_t taken);
static inline void kvs_ring_daemon_awake(kvs_ring_hdr *h) {
  atomic_store_explicit(&h->daemon_sleeping, 0, memory_order_relaxed);
}
/* The daemon sleeps without looking at this ring now (it is not to be read
 * until its session is ready again, when the daemon looks at it). */
static inline void kvs_ring_daemon_asleep(kvs_ring_hdr *h) {
  atomic_store_explicit(&h->daemon_sleeping, 1, memory_order_relaxed);
}

/* The client waits for the answer to seq: 1 when it is there (*len set),
 * else 0.  kvs_ring_client_sleep sets client_sleeping and checks once more
 * (1: answered; the flag is cleared again). */
static inline int kvs_ring_answered(kvs_ring_hdr *h, uint64_t seq,
                                    uint32_t *len) {
  if (atomic_load_explicit(&h->rep_seq, memory_order_acquire) != seq)
    return 0;
  *len = atomic_load_explicit(&h->rep_len, memory_order_relaxed);
  return 1;
}
int kvs_ring_client_sleep(kvs_ring_hdr *h, uint64_t seq, uint32_t *len);
static inline void kvs_ring_client_awake(kvs_ring_hdr *h) {
  atomic_store_explicit(&h->client_sleeping, 0, memory_order_relaxed);
}

#ifdef __cplusplus
}
#endif
#endif /* KVS_RING_H */
