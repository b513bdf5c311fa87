/*
 * ring.c — request rings beside the sockets (ring.h).
 *
 * A frame taken from a ring is copied out of the mapping first and handed
 * to its owner (the session, which handles it exactly as a socket frame);
 * its reply goes back through the ring, or on the socket when it does not
 * fit.  An owner that may not be read (a reply held back, replies piling
 * up unread) is skipped until it may (ring_resume).
 */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon/log.h"
#include "daemon/net/ring.h"
#include "kvs_ring.h"
#include "kvs_shm.h"
#include "kvs_status.h"

/* Freed when its wake handle is closed (after its owner). */
struct sring {
  uv_poll_t wake; /* readable: the client sent a wake-up (or went away) */
  rings *g;
  void *owner;    /* NULL once the owner is gone */
  sring *prev, *next; /* on g's list while it has an owner */
  kvs_region reg;
  kvs_ring_hdr *h;
  uint32_t area;
  int wfd;        /* the daemon's end of the wake channel */
  int cfd;        /* the client's end, until the Welcome has carried it */
  uint64_t taken; /* the last req_seq taken */
  uint64_t requests, socket_replies; /* for the log at close */
};

struct rings {
  ring_owner_ops ops;
  uv_loop_t *loop;
  uint32_t area;  /* each ring's, each way */
  sring *list;    /* every ring with an owner */
  uv_idle_t idle; /* active while polling */
  int polling;
  int stopped, idle_closed;
  uint64_t poll_ns, last_ns;
  uint8_t *buf;   /* the frame taken, copied out of the mapping */
  size_t cap;
  uint64_t requests, socket_replies, wakeups;
};

/* Takes r's posted request, if any: 1 when one was handled. */
static int take(rings *g, sring *r) {
  uint64_t seq;
  uint32_t len;

  if (!kvs_ring_peek(r->h, r->taken, &seq, &len))
    return 0;
  r->taken = seq;
  r->requests++;
  g->requests++;
  if (len > r->area) {
    g->ops.frame(r->owner, NULL, len);
    return 1;
  }
  if (len > g->cap) {
    uint8_t *p = realloc(g->buf, r->area);

    if (p == NULL) {
      g->ops.gone(r->owner, "out of memory for a ring request");
      return 1;
    }
    g->buf = p;
    g->cap = r->area;
  }
  memcpy(g->buf, kvs_ring_req_area(r->h), len);
  g->ops.frame(r->owner, g->buf, len);
  return 1;
}

/* One look at every ring that may be read: the number of requests taken. */
static int poll_once(rings *g) {
  int n = 0;

  for (sring *r = g->list, *next; r != NULL; r = next) {
    next = r->next; /* (handling r may free r; it never frees another) */
    if (g->ops.ready(r->owner))
      n += take(g, r);
  }
  return n;
}

static void on_idle(uv_idle_t *h);

/* Polling (again): every ring says the daemon is awake. */
static void start_polling(rings *g) {
  for (sring *r = g->list; r != NULL; r = r->next)
    kvs_ring_daemon_awake(r->h);
  g->last_ns = uv_hrtime();
  if (!g->polling && uv_idle_start(&g->idle, on_idle) == 0)
    g->polling = 1;
}

/* No request for poll_ns: every ring says the daemon sleeps, and each that
 * may be read is looked at once more after the fence.  A request that came
 * meanwhile sends the daemon back to polling (taken on the next round, so
 * that one busy client cannot keep the loop here). */
static void go_to_sleep(rings *g) {
  int pending = 0;

  for (sring *r = g->list; r != NULL; r = r->next) {
    if (!g->ops.ready(r->owner))
      kvs_ring_daemon_asleep(r->h); /* ring_resume looks later */
    else if (kvs_ring_daemon_sleep(r->h, r->taken))
      pending = 1;
  }
  if (pending) {
    start_polling(g);
    g->last_ns = 0; /* (with poll_ns 0: asleep again after one round) */
    return;
  }
  if (g->polling) {
    uv_idle_stop(&g->idle);
    g->polling = 0;
  }
}

static void on_idle(uv_idle_t *h) {
  rings *g = h->data;

  if (poll_once(g) > 0) {
    g->last_ns = uv_hrtime();
    return;
  }
  if (uv_hrtime() - g->last_ns >= g->poll_ns)
    go_to_sleep(g);
  else
    sched_yield(); /* a client on this core gets to run */
}

static void on_wake(uv_poll_t *p, int status, int events) {
  sring *r = p->data;
  rings *g = r->g;
  int rc;

  (void)events;
  rc = status < 0 ? -1 : kvs_ring_drain(r->wfd);
  if (r->owner == NULL)
    return;
  if (rc < 0) { /* the client closed its end: no way to wake it any more */
    uv_poll_stop(p);
    g->ops.gone(r->owner, "its ring's wake channel is closed");
    return;
  }
  if (g->stopped)
    return;
  g->wakeups++;
  start_polling(g);
  poll_once(g);
  if (g->poll_ns == 0)
    go_to_sleep(g);
}

int rings_start(uv_loop_t *loop, const cfg *c, const ring_owner_ops *ops,
                rings **out) {
  rings *g;

  *out = NULL;
  if (c->ring_bytes == 0)
    return 0;
  if (c->ring_bytes < KVS_RING_MIN_AREA) {
    log_error(KVS_EINVAL, "ring_bytes %llu: 0 (no rings) or at least %u",
              (unsigned long long)c->ring_bytes, KVS_RING_MIN_AREA);
    return KVS_EINVAL;
  }
  g = calloc(1, sizeof(*g));
  if (g == NULL)
    return KVS_ENOMEM;
  g->ops = *ops;
  g->loop = loop;
  g->area = (uint32_t)c->ring_bytes;
  g->poll_ns = (uint64_t)c->ring_poll_us * 1000;
  uv_idle_init(loop, &g->idle);
  g->idle.data = g;
  *out = g;
  return 0;
}

/* g goes once it is stopped, its handle closed and no ring is left. */
static void maybe_free(rings *g) {
  if (g->idle_closed && g->list == NULL) {
    free(g->buf);
    free(g);
  }
}

static void on_idle_closed(uv_handle_t *h) {
  rings *g = h->data;

  g->idle_closed = 1;
  maybe_free(g);
}

void rings_stop(rings *g) {
  if (g == NULL || g->stopped)
    return;
  log_info(0, "request rings: %llu requests, %llu replies on the socket, "
           "%llu wake-ups", (unsigned long long)g->requests,
           (unsigned long long)g->socket_replies,
           (unsigned long long)g->wakeups);
  g->stopped = 1;
  uv_close((uv_handle_t *)&g->idle, on_idle_closed);
}

static void sring_close_fds(sring *r) {
  kvs_region_close(&r->reg);
  if (r->wfd >= 0)
    close(r->wfd);
  if (r->cfd >= 0)
    close(r->cfd);
  free(r);
}

int ring_open(rings *g, void *owner, int fds[2], uint32_t *area,
              sring **out) {
  sring *r;
  int sv[2], rc;

  *area = 0;
  *out = NULL;
  if (g == NULL || g->stopped)
    return KVS_ENOTSUP;
  r = calloc(1, sizeof(*r));
  if (r == NULL)
    return KVS_ENOMEM;
  r->area = g->area;
  r->wfd = r->cfd = -1;
  rc = kvs_ring_create(r->area, &r->reg);
  if (rc == 0 && !r->reg.sealed)
    rc = KVS_ENOTSUP; /* a client could shrink it under the daemon */
  if (rc == 0 && socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
    rc = -errno;
  if (rc == 0) {
    r->wfd = sv[0];
    r->cfd = sv[1];
    rc = uv_poll_init(g->loop, &r->wake, r->wfd);
  }
  if (rc != 0) {
    sring_close_fds(r);
    return rc;
  }
  r->wake.data = r;
  r->h = r->reg.base;
  r->g = g;
  r->owner = owner;
  r->next = g->list; /* (from here ring_free undoes it) */
  if (g->list)
    g->list->prev = r;
  g->list = r;
  rc = uv_poll_start(&r->wake, UV_READABLE, on_wake);
  if (rc < 0) {
    ring_free(r);
    return rc;
  }
  if (!g->polling) /* the first post must wake the daemon */
    kvs_ring_daemon_asleep(r->h);
  fds[0] = r->reg.fd;
  fds[1] = r->cfd;
  *area = r->area;
  *out = r;
  return 0;
}

void ring_handed(sring *r) {
  if (r != NULL && r->cfd >= 0) {
    close(r->cfd);
    r->cfd = -1;
  }
}

static void on_wake_closed(uv_handle_t *h) { sring_close_fds(h->data); }

void ring_free(sring *r) {
  rings *g;

  if (r == NULL || r->owner == NULL)
    return;
  g = r->g;
  if (r->prev)
    r->prev->next = r->next;
  else
    g->list = r->next;
  if (r->next)
    r->next->prev = r->prev;
  r->owner = NULL;
  uv_close((uv_handle_t *)&r->wake, on_wake_closed);
  if (g->stopped)
    maybe_free(g);
}

void ring_resume(sring *r) {
  rings *g;

  if (r == NULL || (g = r->g)->stopped || !g->ops.ready(r->owner))
    return;
  if (take(g, r) && g->poll_ns)
    start_polling(g);
}

int ring_reply(sring *r, const uint8_t *frame, size_t len) {
  if (len > r->area) {
    kvs_ring_answer(r->h, r->taken, 0, r->wfd);
    r->socket_replies++;
    r->g->socket_replies++;
    return 1;
  }
  memcpy(kvs_ring_rep_area(r->h, r->area), frame, len);
  kvs_ring_answer(r->h, r->taken, (uint32_t)len, r->wfd);
  return 0;
}

void ring_describe(const sring *r, char *buf, size_t len) {
  if (r == NULL)
    snprintf(buf, len, "no ring");
  else
    snprintf(buf, len, "ring: %llu requests, %llu replies on the socket",
             (unsigned long long)r->requests,
             (unsigned long long)r->socket_replies);
}

void rings_counts(const rings *g, uint64_t *requests,
                  uint64_t *socket_replies, uint64_t *wakeups) {
  *requests = g ? g->requests : 0;
  *socket_replies = g ? g->socket_replies : 0;
  *wakeups = g ? g->wakeups : 0;
}
