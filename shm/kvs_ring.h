/*
 * kvs_ring.h — a session's request ring: one shared mapping beside its
 * socket, through which a client's calls reach the daemon without a system
 * call while the daemon polls.
 *
 * The mapping is a memfd the daemon creates (size sealed), handed to the
 * client in the Welcome with two eventfds: one that wakes the daemon (shared
 * by every ring of the daemon) and one that wakes this client.  Layout:
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
 * and a full fence, writes the sleeper's eventfd when the flag is set.  One
 * of the two always sees the other (the flag, or the counter): no lost
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
 * owns fd on success).  *area is the size of each area.  0, KVS_EPROTO (not
 * a ring of this version, or not sealed), -errno. */
int kvs_ring_map(int fd, uint32_t area, kvs_region *r);

/* Writes one wake-up to an eventfd (nothing on error: a counter that is
 * already set wakes the sleeper anyway). */
void kvs_ring_wake(int efd);
/* Takes what an eventfd holds; returns 1 when it held something. */
int kvs_ring_drain(int efd);

/* The client posts request seq (its frame already in the request area),
 * waking the daemon if it sleeps. */
void kvs_ring_post(kvs_ring_hdr *h, uint64_t seq, uint32_t len,
                   int daemon_efd);

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
 * goes on the socket), waking the client if it sleeps. */
void kvs_ring_answer(kvs_ring_hdr *h, uint64_t seq, uint32_t len,
                     int client_efd);

/* The daemon is about to sleep: sets daemon_sleeping, then says whether a
 * request after `taken` came meanwhile (1: it must not sleep; the flag is
 * cleared again). */
int kvs_ring_daemon_sleep(kvs_ring_hdr *h, uint64_t taken);
static inline void kvs_ring_daemon_awake(kvs_ring_hdr *h) {
  atomic_store_explicit(&h->daemon_sleeping, 0, memory_order_relaxed);
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
