/*
 * ring.c — request rings beside the sockets (shm/kvs_ring.h).
 *
 * A client that asks for a ring in its Hello gets one (ring_open): its calls
 * then go through shared memory.  The daemon finds them by polling every
 * ring from a uv_idle handle, which keeps the loop from blocking, for
 * ring_poll_us after the last request it took; then it sleeps (each ring's
 * daemon_sleeping flag set, re-checked after a fence) until a byte on some
 * session's wake channel (a socket pair, watched by a uv_poll) wakes it.
 * A frame taken from a ring is copied out of the mapping first (the client
 * can write it at any time) and handled exactly as a socket frame
 * (sess_ring_frame); its reply goes back through the ring, or on the socket
 * when it does not fit.  A session that may not be read (a reply held back,
 * replies piling up unread) is skipped until it may (ring_resume).
 */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon/log.h"
#include "daemon/net/server.h"
#include "kvs_ring.h"
#include "kvs_status.h"

/* Freed when its wake handle is closed (after its session). */
struct sring {
  uv_poll_t wake; /* readable: the client sent a wake-up (or went away) */
  sess *c;        /* NULL once the session is gone */
  kvs_region reg;
  kvs_ring_hdr *h;
  uint32_t area;
  int wfd;        /* the daemon's end of the wake channel */
  int cfd;        /* the client's end, until the Welcome has carried it */
  uint64_t taken; /* the last req_seq taken */
  uint64_t requests, socket_replies; /* for the log at close */
};

struct rings {
  srv *s;
  uv_idle_t idle; /* active while polling */
  int polling;
  uint64_t poll_ns, last_ns;
  uint8_t *buf;   /* the frame taken, copied out of the mapping */
  size_t cap;
  uint64_t requests, socket_replies, wakeups;
};

/* Takes c's posted request, if any: 1 when one was handled. */
static int take(struct rings *g, sess *c) {
  struct sring *r = c->ring;
  uint64_t seq;
  uint32_t len;

  if (!kvs_ring_peek(r->h, r->taken, &seq, &len))
    return 0;
  r->taken = seq;
  r->requests++;
  g->requests++;
  if (len > r->area) {
    sess_ring_frame(c, NULL, len);
    return 1;
  }
  if (len > g->cap) {
    uint8_t *p = realloc(g->buf, r->area);

    if (p == NULL) {
      log_error(KVS_ENOMEM, "session %llu: ring request of %u bytes",
                (unsigned long long)c->id, len);
      sess_shutdown(c, 1);
      return 1;
    }
    g->buf = p;
    g->cap = r->area;
  }
  memcpy(g->buf, kvs_ring_req_area(r->h), len);
  sess_ring_frame(c, g->buf, len);
  return 1;
}

/* One look at every ring that may be read: the number of requests taken. */
static int poll_once(struct rings *g) {
  int n = 0;

  for (sess *c = g->s->sessions, *next; c != NULL; c = next) {
    next = c->next; /* (handling c may close c; it never frees another) */
    if (c->ring != NULL && sess_ring_ready(c))
      n += take(g, c);
  }
  return n;
}

static void on_idle(uv_idle_t *h);

/* Polling (again): every ring says the daemon is awake. */
static void start_polling(struct rings *g) {
  for (sess *c = g->s->sessions; c != NULL; c = c->next)
    if (c->ring != NULL)
      kvs_ring_daemon_awake(c->ring->h);
  g->last_ns = uv_hrtime();
  if (!g->polling && uv_idle_start(&g->idle, on_idle) == 0)
    g->polling = 1;
}

/* No request for poll_ns: every ring says the daemon sleeps, and each that
 * may be read is looked at once more after the fence.  A request that came
 * meanwhile sends the daemon back to polling (taken on the next round, so
 * that one busy client cannot keep the loop here). */
static void go_to_sleep(struct rings *g) {
  int pending = 0;

  for (sess *c = g->s->sessions; c != NULL; c = c->next) {
    if (c->ring == NULL)
      continue;
    if (!sess_ring_ready(c))
      kvs_ring_daemon_asleep(c->ring->h); /* ring_resume looks later */
    else if (kvs_ring_daemon_sleep(c->ring->h, c->ring->taken))
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
  struct rings *g = h->data;

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
  struct sring *r = p->data;
  sess *c = r->c;
  struct rings *g;
  int rc;

  (void)events;
  rc = status < 0 ? -1 : kvs_ring_drain(r->wfd);
  if (c == NULL || c->closing)
    return;
  if (rc < 0) { /* the client closed its end: no way to wake it any more */
    log_warn(0, "session %llu (pid %d): its ring's wake channel is closed; "
             "closing the session", (unsigned long long)c->id, (int)c->pid);
    uv_poll_stop(p);
    sess_shutdown(c, 1);
    return;
  }
  if ((g = c->srv->rings) == NULL)
    return;
  g->wakeups++;
  start_polling(g);
  poll_once(g);
  if (g->poll_ns == 0)
    go_to_sleep(g);
}

int ring_start(srv *s) {
  struct rings *g;

  s->rings = NULL;
  if (s->cfg->ring_bytes == 0)
    return 0;
  if (s->cfg->ring_bytes < KVS_RING_MIN_AREA) {
    log_error(KVS_EINVAL, "ring_bytes %llu: 0 (no rings) or at least %u",
              (unsigned long long)s->cfg->ring_bytes, KVS_RING_MIN_AREA);
    return KVS_EINVAL;
  }
  g = calloc(1, sizeof(*g));
  if (g == NULL)
    return KVS_ENOMEM;
  g->s = s;
  g->poll_ns = (uint64_t)s->cfg->ring_poll_us * 1000;
  uv_idle_init(s->loop, &g->idle);
  g->idle.data = g;
  s->rings = g;
  return 0;
}

static void on_idle_closed(uv_handle_t *h) {
  struct rings *g = h->data;

  free(g->buf);
  free(g);
}

void ring_stop(srv *s) {
  struct rings *g = s->rings;

  if (g == NULL)
    return;
  log_info(0, "request rings: %llu requests, %llu replies on the socket, "
           "%llu wake-ups", (unsigned long long)g->requests,
           (unsigned long long)g->socket_replies,
           (unsigned long long)g->wakeups);
  s->rings = NULL;
  uv_close((uv_handle_t *)&g->idle, on_idle_closed);
}

static void sring_close_fds(struct sring *r) {
  kvs_region_close(&r->reg);
  if (r->wfd >= 0)
    close(r->wfd);
  if (r->cfd >= 0)
    close(r->cfd);
  free(r);
}

int ring_open(sess *c, int fds[2], uint32_t *area) {
  struct rings *g = c->srv->rings;
  struct sring *r;
  int sv[2], rc;

  *area = 0;
  if (g == NULL)
    return KVS_ENOTSUP;
  r = calloc(1, sizeof(*r));
  if (r == NULL)
    return KVS_ENOMEM;
  r->area = (uint32_t)c->srv->cfg->ring_bytes;
  r->wfd = r->cfd = -1;
  rc = kvs_ring_create(r->area, &r->reg);
  if (rc == 0 && !r->reg.sealed)
    rc = KVS_ENOTSUP; /* a client could shrink it under the daemon */
  if (rc == 0 && socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
    rc = -errno;
  if (rc == 0) {
    r->wfd = sv[0];
    r->cfd = sv[1];
    rc = uv_poll_init(c->srv->loop, &r->wake, r->wfd);
  }
  if (rc != 0) {
    sring_close_fds(r);
    return rc;
  }
  r->wake.data = r;
  rc = uv_poll_start(&r->wake, UV_READABLE, on_wake);
  r->h = r->reg.base;
  r->c = c;
  c->ring = r; /* (from here ring_free undoes it) */
  if (rc < 0) {
    ring_free(c);
    return rc;
  }
  if (!g->polling) /* the first post must wake the daemon */
    kvs_ring_daemon_asleep(r->h);
  fds[0] = r->reg.fd;
  fds[1] = r->cfd;
  *area = r->area;
  return 0;
}

void ring_handed(sess *c) {
  struct sring *r = c->ring;

  if (r != NULL && r->cfd >= 0) {
    close(r->cfd);
    r->cfd = -1;
  }
}

static void on_wake_closed(uv_handle_t *h) { sring_close_fds(h->data); }

void ring_free(sess *c) {
  struct sring *r = c->ring;

  if (r == NULL)
    return;
  c->ring = NULL;
  r->c = NULL;
  uv_close((uv_handle_t *)&r->wake, on_wake_closed);
}

void ring_resume(sess *c) {
  struct rings *g = c->srv->rings;

  if (c->ring != NULL && g != NULL && sess_ring_ready(c) && take(g, c) &&
      g->poll_ns)
    start_polling(g);
}

int ring_reply(sess *c, const uint8_t *frame, size_t len) {
  struct sring *r = c->ring;
  struct rings *g = c->srv->rings;

  if (len > r->area) {
    kvs_ring_answer(r->h, r->taken, 0, r->wfd);
    r->socket_replies++;
    if (g != NULL)
      g->socket_replies++;
    return 1;
  }
  memcpy(kvs_ring_rep_area(r->h, r->area), frame, len);
  kvs_ring_answer(r->h, r->taken, (uint32_t)len, r->wfd);
  return 0;
}

void ring_describe(const sess *c, char *buf, size_t len) {
  const struct sring *r = c->ring;

  if (r == NULL)
    snprintf(buf, len, "no ring");
  else
    snprintf(buf, len, "ring: %llu requests, %llu replies on the socket",
             (unsigned long long)r->requests,
             (unsigned long long)r->socket_replies);
}

void ring_counts(const srv *s, uint64_t *requests, uint64_t *socket_replies,
                 uint64_t *wakeups) {
  const struct rings *g = s->rings;

  *requests = g ? g->requests : 0;
  *socket_replies = g ? g->socket_replies : 0;
  *wakeups = g ? g->wakeups : 0;
}
