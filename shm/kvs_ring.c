/*
 * kvs_ring.c — the request ring's shared state (see kvs_ring.h).
 */
#include "kvs_ring.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvs_status.h"

_Static_assert(sizeof(kvs_ring_hdr) == 192, "three cache lines");
_Static_assert(sizeof(kvs_ring_hdr) <= KVS_RING_HDR_SIZE, "header fits");

int kvs_ring_create(uint32_t area, kvs_region *r) {
  kvs_ring_hdr *h;
  int rc;

  if (area < KVS_RING_MIN_AREA)
    return KVS_EINVAL;
  rc = kvs_region_create("kvshare-ring", kvs_ring_size(area), r);
  if (rc != 0)
    return rc;
  h = r->base;
  h->magic = KVS_RING_MAGIC;
  h->version = KVS_RING_VERSION;
  h->area = area;
  return 0;
}

int kvs_ring_map(int fd, uint32_t area, kvs_region *r) {
  const kvs_ring_hdr *h;
  int rc;

  if (area < KVS_RING_MIN_AREA)
    return KVS_EPROTO;
  rc = kvs_region_map(fd, kvs_ring_size(area), r);
  if (rc != 0)
    return rc == KVS_ERANGE ? KVS_EPROTO : rc;
  h = r->base;
  if (h->magic != KVS_RING_MAGIC || h->version != KVS_RING_VERSION ||
      h->area != area) {
    r->fd = -1; /* the caller still owns fd on failure */
    kvs_region_close(r);
    return KVS_EPROTO;
  }
  return 0;
}

void kvs_ring_wake(int fd) {
  ssize_t n;

  do
    n = send(fd, "w", 1, MSG_DONTWAIT | MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
}

int kvs_ring_drain(int fd) {
  char buf[64];
  int got = 0;

  /* Bounded: a peer that keeps writing cannot hold the caller here. */
  for (int i = 0; i < 16; i++) {
    ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);

    if (n > 0) {
      got = 1;
      if ((size_t)n < sizeof(buf))
        break;
      continue;
    }
    if (n == 0)
      return -1;
    if (errno == EINTR)
      continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK)
      break;
    return -1;
  }
  return got;
}

void kvs_ring_post(kvs_ring_hdr *h, uint64_t seq, uint32_t len, int wfd) {
  atomic_store_explicit(&h->req_len, len, memory_order_relaxed);
  atomic_store_explicit(&h->req_seq, seq, memory_order_release);
  atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load_explicit(&h->daemon_sleeping, memory_order_relaxed))
    kvs_ring_wake(wfd);
}

void kvs_ring_answer(kvs_ring_hdr *h, uint64_t seq, uint32_t len, int wfd) {
  atomic_store_explicit(&h->rep_len, len, memory_order_relaxed);
  atomic_store_explicit(&h->rep_seq, seq, memory_order_release);
  atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load_explicit(&h->client_sleeping, memory_order_relaxed))
    kvs_ring_wake(wfd);
}

int kvs_ring_daemon_sleep(kvs_ring_hdr *h, uint64_t taken) {
  atomic_store_explicit(&h->daemon_sleeping, 1, memory_order_relaxed);
  atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load_explicit(&h->req_seq, memory_order_relaxed) != taken) {
    kvs_ring_daemon_awake(h);
    return 1;
  }
  return 0;
}

int kvs_ring_client_sleep(kvs_ring_hdr *h, uint64_t seq, uint32_t *len) {
  atomic_store_explicit(&h->client_sleeping, 1, memory_order_relaxed);
  atomic_thread_fence(memory_order_seq_cst);
  if (kvs_ring_answered(h, seq, len)) {
    kvs_ring_client_awake(h);
    return 1;
  }
  return 0;
}
