/*
 * ring.c — the client's side of a request ring (shm/kvs_ring.h).
 *
 * With KVS_RING=1 the Hello asks for a ring; a daemon that grants it sends
 * the ring's memfd and one end of the session's wake channel after the
 * pool's descriptors.  Each call whose frame fits then goes through the
 * ring: the frame is copied into the request area and posted; the client
 * spins on the reply counter for $KVS_RING_SPIN_US (50 by default; never
 * past timeout_ms), then sleeps in poll() on the wake channel and the
 * socket (which says when the daemon is gone, or brings a reply too big
 * for the ring).
 */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client/client_int.h"
#include "kvs_frame.h"

#define SPIN_US_DEFAULT 50
/* Rounds of pure spinning before the spin yields (about a microsecond). */
#define SPIN_PAUSES 32

uint64_t kvs__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

int kvs__ring_setup(kvs_client *c, const int fds[2], uint32_t area) {
  const char *e = getenv("KVS_RING_SPIN_US");
  int rc = kvs_ring_map(fds[0], area, &c->ring);

  if (rc != 0)
    return rc;
  c->rh = c->ring.base;
  c->ring_area = area;
  c->ring_wfd = fds[1];
  c->ring_seq = 0;
  c->ring_spin_ns = (uint64_t)(e && *e ? strtoul(e, NULL, 10)
                                       : SPIN_US_DEFAULT) * 1000u;
  return 0;
}

void kvs__ring_close(kvs_client *c) {
  if (c->rh == NULL)
    return;
  kvs_region_close(&c->ring);
  close(c->ring_wfd);
  c->rh = NULL;
}

/* The reply to seq is in the ring (len bytes): into c->rbuf. */
static int take_reply(kvs_client *c, uint32_t len) {
  size_t flen = 0;
  int rc;

  if (len == 0)
    return 0; /* too big for the ring: it comes on the socket */
  if (len > c->ring_area || c->rpos != c->rlen)
    return KVS_EPROTO;
  c->rpos = c->rlen = 0;
  rc = kvs__ensure_cap(&c->rbuf, &c->rcap, len);
  if (rc)
    return rc;
  memcpy(c->rbuf, kvs_ring_rep_area(c->rh, c->ring_area), len);
  if (kvs_frame_parse(c->rbuf, len, KVS__CLIENT_MAX_FRAME, &flen) != 1 ||
      flen != len)
    return KVS_EPROTO;
  c->rlen = len;
  return 0;
}

int kvs__ring_roundtrip(kvs_client *c, size_t len) {
  kvs_ring_hdr *h = c->rh;
  uint64_t seq = ++c->ring_seq, t0 = kvs__now_ns(), deadline = 0;
  uint32_t rlen;

  memcpy(kvs_ring_req_area(h), c->wbuf, len);
  uint64_t spin = c->ring_spin_ns;

  if (c->timeout_ms > 0 && spin > (uint64_t)c->timeout_ms * 1000000u)
    spin = (uint64_t)c->timeout_ms * 1000000u;
  kvs_ring_post(h, seq, (uint32_t)len, c->ring_wfd);
  /* Spin a while: a polling daemon answers within microseconds.  After
   * the first few rounds each one yields the CPU, so that a daemon on the
   * same core gets to run. */
  for (unsigned i = 0;; i++) {
    if (kvs_ring_answered(h, seq, &rlen))
      return take_reply(c, rlen);
    if (i >= SPIN_PAUSES) {
      if (kvs__now_ns() - t0 >= spin)
        break;
      sched_yield();
    } else {
      cpu_relax();
    }
  }
  if (c->timeout_ms > 0)
    deadline = t0 + (uint64_t)c->timeout_ms * 1000000u;
  /* Then sleep until the eventfd or the socket says something. */
  for (;;) {
    struct pollfd p[2] = {{c->ring_wfd, POLLIN, 0}, {c->fd, POLLIN, 0}};
    int wait = -1, n;

    if (kvs_ring_client_sleep(h, seq, &rlen))
      return take_reply(c, rlen);
    if (deadline) {
      uint64_t t = kvs__now_ns();

      if (t >= deadline) {
        kvs_ring_client_awake(h);
        return -EAGAIN;
      }
      wait = (int)((deadline - t + 999999) / 1000000);
    }
    n = poll(p, 2, wait);
    kvs_ring_client_awake(h);
    if (n < 0 && errno != EINTR)
      return -errno;
    if (n > 0 && p[0].revents && kvs_ring_drain(c->ring_wfd) < 0)
      p[1].revents = POLLHUP; /* the daemon's end is gone: so is it */
    if (kvs_ring_answered(h, seq, &rlen))
      return take_reply(c, rlen);
    if (n > 0 && p[1].revents)
      return 0; /* the reply, or the end, is on the socket */
  }
}

int kvs_ring_active(const kvs_client *c) { return c != NULL && c->rh != NULL; }
