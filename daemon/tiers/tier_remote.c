/*
 * tier_remote.c — the remote tier's store on Redis/Valkey (tier_remote.h).
 */
#include "daemon/tiers/tier_remote.h"

#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <xxhash.h>



#include "daemon/log.h"
#include "daemon/tiers/resp_gate.h"
#include "kvs_status.h"

/* hiredis exports it (redisAsyncHandleRead's second half) but its async.h
 * does not declare it. */
void redisProcessCallbacks(redisAsyncContext *ac);

#define MAX_NODES 64
#define NSLOTS 16384
#define NO_NODE 0xffff
#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 5000
#define REFRESH_MIN_MS 1000
#define CLOSE_GRACE_MS 2000
#define STALL_MIN_MS 2000   /* a connection owing answers and silent this
                               long (or 4 read timeouts) is dropped */
#define PENALTY_MS 10000    /* a connection dropped for its replies after
                               less time up than this keeps its back-off */
#define READ_CHUNK (256u << 10)
#define READS_PER_TURN 16
#define WRITE_WINDOW (1u << 20) /* write bytes waiting for answers */
#define KEY_MAX 160
#define HDR_FIXED 80
static const char MAGIC[8] = {'K', 'V', 'S', 'R', 'E', 'M', 'T', '1'};

typedef struct rhdr {
  char magic[8];
  uint32_t version, hdr_len;
  uint64_t len;
  uint64_t hash_lo, hash_hi;
  uint64_t root_lo, root_hi;
  uint32_t block_size, ntokens;
  uint64_t data_sum, hdr_sum;
} rhdr;
_Static_assert(sizeof(rhdr) == HDR_FIXED, "value header is 80 bytes");

enum { RN_DOWN = 0, RN_RESOLVING, RN_CONNECTING, RN_UP, RN_CLOSED };

typedef struct rnode {
  tier_remote *rm;
  char host[256];   /* "" for a Unix socket */
  char path[108];
  int port;
  int writer;       /* the server's connection for writes */
  int connected;    /* the socket is (hiredis calls on_disconnect) */
  int state;
  redisAsyncContext *ac;
  uv_timer_t retry;
  uv_getaddrinfo_t gai;
  int gai_busy;
  int was_up;       /* has been up once (a reconnect counts) */
  int down_logged;
  uint32_t backoff_ms;
  uint32_t pending; /* answers the connection owes */
  uint32_t setup;   /* AUTH, SELECT or PING answers still owed: the
                       connection counts as up (back-off reset, "connected"
                       logged) once they all came back good */
  char addr[300];   /* for the log */
  resp_gate gate;   /* the replies' structure, checked before hiredis */
  uint64_t last_rx; /* when a byte last came, or the first answer owed */
  uint64_t up_since;
  int dropped;      /* the last connection was dropped for its replies */
  int drop_logged;  /* a drop was logged (once per server connection) */
  int fault;        /* end_conn ended it for the server's replies (a drop) */
  char end_why[120]; /* set by end_conn, for on_disconnect's log line */
} rnode;

typedef struct gitem {
  struct rget *g;
  char *buf;        /* the value (hiredis's string, now ours) */
  uint8_t state;    /* GI_* */
} gitem;

enum { GI_WAIT = 0, GI_OK, GI_MISS, GI_BAD, GI_ERR };

typedef struct rget {
  tier_remote_get pub;
  tier_remote *rm;
  uint32_t pending;
  int cb_done, released, in_cb;
  uint64_t reserved;
  uint64_t deadline;
  uint64_t start_ns;
  struct rget *tprev, *tnext;
  int on_tlist;
  kvs_hash128 *hashes;
  uint32_t *tokens; /* NULL: no check */
  gitem items[];
} rget;

struct tier_remote {
  uv_loop_t *loop;
  tier_remote_config cfg;
  char url[512], prefix[64], user[128], pass[256];
  int db, cluster;
  rnode *nodes[MAX_NODES];
  uint32_t nnodes;
  uint16_t *slots;       /* cluster: slot -> node, NO_NODE */
  int have_map;
  uint32_t refresh_next; /* the node asked first next time */
  uint64_t last_refresh;
  uv_timer_t tick;       /* read timeouts, refresh retries */
  rget *thead, *ttail;   /* reads by deadline (all wait as long) */
  uint64_t value_len, hdr_len, put_pfx, put_size;
  /* Writes waiting for their answer, and how many bytes of them may: a
   * Lookup's reads queue behind them on the connection, so they are kept
   * to a small window (WRITE_WINDOW, at least two writes). */
  uint64_t write_inflight, write_window;
  void (*room_cb)(void *, kvs_hash128, int);
  void *room_data;
  tier_remote_stats st;
  int closing, started, grace_closed;
  uint32_t handles;      /* open uv handles, name lookups, hiredis contexts */
  uint32_t contexts;     /* hiredis contexts */
  uv_timer_t grace;
  char desc[600];
};

static uint64_t now_ms(const tier_remote *rm) { return uv_now(rm->loop); }

/* ---- hiredis on the loop ---------------------------------------------------
 * hiredis's own libuv adapter restarts its uv_poll on every read (two
 * epoll_ctl calls per 16 KiB read of a large value); this one changes the
 * watched events only when they change. */

typedef struct uvpoll {
  uv_poll_t h;
  redisAsyncContext *ac; /* NULL once hiredis let go of it */
  int events;
} uvpoll;

static void end_conn(rnode *n, const char *why, int fault);

/* Reads what n's server sent, passing it through n's gate before hiredis's
 * parser: hiredis's reader would take any size, any count and any reply
 * nobody asked for (resp_gate.h).  Up to READS_PER_TURN reads of
 * READ_CHUNK a turn (a syscall and a wake-up of the server per 16 KiB, as
 * hiredis reads, is slow for large values); the poll is level-triggered,
 * so what is left comes next turn.  Then the callbacks of the replies
 * completed.  The end of the stream, an error, or a reply the gate refuses
 * drops the connection (drop: its callbacks see NULL, on_disconnect backs
 * off). */
static void read_replies(uvpoll *p) {
  static char buf[READ_CHUNK];
  redisAsyncContext *ac = p->ac;
  rnode *n = ac->data;
  uint32_t owed = n->pending;
  const char *why = NULL;
  char what[120];
  int k = 0, fed = 0, gone = 0;

  while (k++ < READS_PER_TURN) {
    ssize_t got = read(ac->c.fd, buf, sizeof(buf));

    if (got < 0 && errno == EINTR)
      continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      break;
    if (got <= 0) {
      snprintf(what, sizeof(what), "connection lost (%s)",
               got == 0 ? "closed" : strerror(errno));
      why = what;
      gone = 1;
      break;
    }
    n->last_rx = now_ms(n->rm);
    if (resp_gate_scan(&n->gate, buf, (size_t)got) < 0) {
      why = n->gate.why;
      break;
    }
    if (n->gate.replies > owed) {
      why = "a reply nobody asked for";
      break;
    }
    if (redisReaderFeed(ac->c.reader, buf, (size_t)got) != REDIS_OK) {
      why = "a reply hiredis cannot read";
      break;
    }
    fed = 1;
    if ((size_t)got < sizeof(buf))
      break;
  }
  /* The replies fed go to their callbacks first, also when a later chunk
   * was refused or the stream ended (a server that answered, then
   * closed: its answers count). */
  if (fed) {
    n->gate.replies = 0;
    redisProcessCallbacks(ac); /* may free it: p->ac NULL */
  }
  if (why && p->ac)
    end_conn(n, why, !gone);
}

static void on_poll(uv_poll_t *h, int status, int events) {
  uvpoll *p = h->data;

  if (status < 0) /* let hiredis see the error on the socket */
    events = p->events;
  /* Not connected yet: hiredis's write handler finishes the connect (its
   * read handler would also read, past the gate). */
  if (p->ac && (events & (UV_READABLE | UV_WRITABLE)) &&
      !(p->ac->c.flags & REDIS_CONNECTED))
    redisAsyncHandleWrite(p->ac);
  if (p->ac && (events & UV_READABLE) && (p->ac->c.flags & REDIS_CONNECTED))
    read_replies(p);
  if (p->ac && (events & UV_WRITABLE) && (p->ac->c.flags & REDIS_CONNECTED))
    redisAsyncHandleWrite(p->ac);
}

static void poll_set(uvpoll *p, int events) {
  if (events == p->events)
    return;
  p->events = events;
  if (events)
    uv_poll_start(&p->h, events, on_poll);
  else
    uv_poll_stop(&p->h);
}

static void ev_add_read(void *d) {
  uvpoll *p = d;
  poll_set(p, p->events | UV_READABLE);
}
static void ev_del_read(void *d) {
  uvpoll *p = d;
  poll_set(p, p->events & ~UV_READABLE);
}
static void ev_add_write(void *d) {
  uvpoll *p = d;
  poll_set(p, p->events | UV_WRITABLE);
}
static void ev_del_write(void *d) {
  uvpoll *p = d;
  poll_set(p, p->events & ~UV_WRITABLE);
}

static void on_poll_closed(uv_handle_t *h) { free(h->data); }

static void ev_cleanup(void *d) {
  uvpoll *p = d;

  p->ac = NULL;
  uv_close((uv_handle_t *)&p->h, on_poll_closed);
}

static int attach(redisAsyncContext *ac, uv_loop_t *loop) {
  uvpoll *p;

  if (ac->ev.data || !(p = calloc(1, sizeof(*p))))
    return -1;
  if (uv_poll_init(loop, &p->h, ac->c.fd) != 0) {
    free(p);
    return -1;
  }
  p->h.data = p;
  p->ac = ac;
  ac->ev.data = p;
  ac->ev.addRead = ev_add_read;
  ac->ev.delRead = ev_del_read;
  ac->ev.addWrite = ev_add_write;
  ac->ev.delWrite = ev_del_write;
  ac->ev.cleanup = ev_cleanup;
  return 0;
}

/* ---- keys ----------------------------------------------------------------- */

static uint16_t crc16(const char *p, size_t n) {
  uint16_t crc = 0;

  for (size_t i = 0; i < n; i++) {
    crc ^= (uint16_t)((uint8_t)p[i] << 8);
    for (int k = 0; k < 8; k++)
      crc = (uint16_t)(crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1);
  }
  return crc;
}

/* The key's Redis Cluster slot: CRC16 (XMODEM) of the key, or of its hash
 * tag when it has one. */
static uint16_t key_slot(const char *key, size_t len) {
  const char *open = memchr(key, '{', len), *close;

  if (open) {
    size_t rest = len - (size_t)(open - key) - 1;
    close = memchr(open + 1, '}', rest);
    if (close && close > open + 1)
      return crc16(open + 1, (size_t)(close - open - 1)) & (NSLOTS - 1);
  }
  return crc16(key, len) & (NSLOTS - 1);
}

static size_t make_key(const tier_remote *rm, kvs_hash128 h, char *out) {
  return (size_t)snprintf(out, KEY_MAX, "%s:%016" PRIx64 ":%016" PRIx64
                          "%016" PRIx64, rm->prefix, rm->cfg.root.lo, h.hi,
                          h.lo);
}

/* The connection to key's server for reads (writer 0) or writes (1). */
static rnode *node_for(tier_remote *rm, const char *key, size_t len, int writer) {
  uint16_t i;

  if (!rm->cluster)
    return rm->nodes[writer];
  if (!rm->have_map)
    return NULL;
  i = rm->slots[key_slot(key, len)];
  return i == NO_NODE ? NULL : rm->nodes[i + writer];
}

/* ---- connections ---------------------------------------------------------- */

static void node_connect(rnode *n);
static void refresh_map(tier_remote *rm);

static void store_free(tier_remote *rm) {
  for (uint32_t i = 0; i < rm->nnodes; i++)
    free(rm->nodes[i]);
  free(rm->slots);
  free(rm);
}

/* One of rm's handles (a uv handle, a name lookup, a hiredis context) is
 * gone; the last one, while closing, frees rm. */
static void unref(tier_remote *rm) {
  if (--rm->handles == 0 && rm->closing)
    store_free(rm);
}

static void handle_closed(uv_handle_t *h) { unref(h->data); }

/* A hiredis context is gone. */
static void context_gone(tier_remote *rm) {
  if (--rm->contexts == 0 && rm->closing && !rm->grace_closed) {
    rm->grace_closed = 1;
    uv_close((uv_handle_t *)&rm->grace, handle_closed);
  }
  unref(rm);
}

static void on_retry(uv_timer_t *t) {
  rnode *n = t->data;

  if (n->state == RN_DOWN && !n->rm->closing)
    node_connect(n);
}

/* n's connection is gone (why: for the log; NULL: logged already). */
static void node_down(rnode *n, const char *why) {
  tier_remote *rm = n->rm;

  n->state = RN_DOWN;
  n->connected = 0;
  n->ac = NULL;
  if (rm->closing) {
    n->state = RN_CLOSED;
    return;
  }
  if (!n->down_logged && why) {
    log_warn(0, "remote tier %s: %s; reads miss and writes are skipped "
             "until it is back (retrying)", n->addr, why);
    n->down_logged = 1;
  }
  n->backoff_ms = n->backoff_ms ? n->backoff_ms * 2 : BACKOFF_MIN_MS;
  if (n->backoff_ms > BACKOFF_MAX_MS)
    n->backoff_ms = BACKOFF_MAX_MS;
  uv_timer_start(&n->retry, on_retry, n->backoff_ms, 0);
  if (rm->cluster) { /* the map may be stale (a failover): reloaded; the
                        old one serves the other nodes' slots meanwhile */
    rm->last_refresh = 0;
    refresh_map(rm);
  }
}


static void watch_stalls(tier_remote *rm);

static void on_connect(const redisAsyncContext *ac, int status) {
  rnode *n = ac->data;
  tier_remote *rm = n->rm;

  if (status != REDIS_OK) {
    char why[200];
    snprintf(why, sizeof(why), "cannot connect (%s)", ac->errstr);
    node_down(n, why);
    context_gone(rm); /* hiredis frees the context after this */
    return;
  }
  /* Connected; up (our commands go) once the set-up ones are answered
   * (node_good): a command pipelined behind a SELECT the server refused
   * would run on db 0.  The back-off is reset there too: a server that
   * accepts, then refuses (a wrong password, maxclients) is tried again
   * at the back-off's pace, not every 100 ms. */
  n->connected = 1;
  if (n->pending) /* silence counts from the connect; the tick may have
                     stopped while it took */
    n->last_rx = now_ms(rm);
  watch_stalls(rm);
}

/* The set-up commands of n's connection came back good. */
static void node_good(rnode *n) {
  tier_remote *rm = n->rm;

  n->state = RN_UP;
  n->up_since = now_ms(rm);
  if (!n->dropped)
    n->backoff_ms = 0;
  n->dropped = 0;
  if (rm->cluster && !rm->have_map)
    refresh_map(rm);
  if (n->down_logged) {
    log_info(0, "remote tier %s: connected again", n->addr);
    n->down_logged = 0;
  } else if (!n->was_up) {
    log_info(0, "remote tier %s: connected", n->addr);
  } /* (else: back after a drop, logged once) */
  if (n->was_up)
    rm->st.reconnects++;
  n->was_up = 1;
}


/* n owes one more answer (a command went out on it). */
static void owe(rnode *n) {
  if (n->pending++ == 0)
    n->last_rx = now_ms(n->rm); /* silence counts from here */
  watch_stalls(n->rm);
}

static void on_disconnect(const redisAsyncContext *ac, int status) {
  rnode *n = ac->data;
  tier_remote *rm = n->rm;
  char why[200];

  if (n->end_why[0])
    snprintf(why, sizeof(why), "%s", n->end_why);
  else
    snprintf(why, sizeof(why), "connection lost (%s)",
             status == REDIS_OK ? "closed" : ac->errstr);
  if (n->fault) { /* a drop: logged here once, not as an outage */
    if (!n->drop_logged)
      log_warn(0, "remote tier %s: %s; reconnecting with back-off (counted "
               "in kvshare_remote_dropped_total; logged once)", n->addr,
               why);
    n->drop_logged = 1;
  }
  n->pending = 0;
  node_down(n, n->fault ? NULL : why);
  n->end_why[0] = '\0';
  n->fault = 0;
  context_gone(rm);
}

/* Ends n's connection now: every answer still owed is an error, and
 * on_disconnect logs why and backs off before the next connection.
 * fault: the server misbehaved (a reply refused, silence): "dropped",
 * counted; else its connection ended or failed under a read, as hiredis
 * would have ended it. */
static void end_conn(rnode *n, const char *why, int fault) {
  snprintf(n->end_why, sizeof(n->end_why), "%s%s", fault ? "dropped: " : "",
           why);
  n->fault = fault;
  if (fault) {
    n->rm->st.dropped++;
    /* A server that answers badly soon after each connect is not tried
     * again every BACKOFF_MIN_MS: node_good keeps the back-off. */
    n->dropped = now_ms(n->rm) - n->up_since < PENALTY_MS;
  }
  redisAsyncFree(n->ac); /* callbacks with NULL, then on_disconnect */
}

static void on_setup_reply(redisAsyncContext *ac, void *r, void *priv) {
  rnode *n = ac->data;
  redisReply *reply = r;

  if (n->pending)
    n->pending--;
  if (reply && reply->type == REDIS_REPLY_ERROR) {
    /* (Once an outage: the retries are logged as one.) */
    log_at(n->down_logged ? LOG_DEBUG : LOG_ERROR, 0,
           "remote tier %s: %s refused: %s", n->addr, (const char *)priv,
           reply->str);
    redisAsyncDisconnect(ac); /* and back off: a wrong password stays */
  } else if (reply && n->setup && --n->setup == 0) {
    node_good(n);
  }
}

static void start_context(rnode *n, const char *ip) {
  tier_remote *rm = n->rm;
  redisAsyncContext *ac = ip ? redisAsyncConnect(ip, n->port)
                             : redisAsyncConnectUnix(n->path);
  char why[200];

  if (!ac || ac->err) {
    snprintf(why, sizeof(why), "cannot connect (%s)",
             ac ? ac->errstr : "out of memory");
    if (ac)
      redisAsyncFree(ac);
    node_down(n, why);
    return;
  }
  ac->data = n;
  if (attach(ac, rm->loop) != 0) {
    redisAsyncFree(ac);
    node_down(n, "cannot watch the connection");
    return;
  }
  redisAsyncSetConnectCallback(ac, on_connect);
  redisAsyncSetDisconnectCallback(ac, on_disconnect);
  n->ac = ac;
  n->state = RN_CONNECTING;
  n->pending = 0;
  n->setup = 0;
  n->end_why[0] = '\0';
  n->fault = 0;
  resp_gate_init(&n->gate, rm->value_len > 4096 ? rm->value_len : 4096);
  rm->handles++;
  rm->contexts++;
  if (rm->pass[0]) { /* AUTH [USER] PASSWORD, first in the pipeline */
    const char *argv[3] = {"AUTH", rm->user, rm->pass};
    int argc = 3;
    if (!rm->user[0]) {
      argv[1] = rm->pass;
      argc = 2;
    }
    redisAsyncCommandArgv(ac, on_setup_reply, (void *)"AUTH", argc, argv,
                          NULL);
    owe(n);
    n->setup++;
  }
  if (rm->db > 0) {
    redisAsyncCommand(ac, on_setup_reply, (void *)"SELECT", "SELECT %d",
                      rm->db);
    owe(n);
    n->setup++;
  }
  if (!n->setup) { /* an answer says the server takes commands */
    redisAsyncCommand(ac, on_setup_reply, (void *)"PING", "PING");
    owe(n);
    n->setup++;
  }
}

static void on_resolved(uv_getaddrinfo_t *req, int status,
                        struct addrinfo *res) {
  rnode *n = req->data;
  char ip[64], why[300];

  n->gai_busy = 0;
  if (n->rm->closing) {
    n->state = RN_CLOSED;
    if (res)
      uv_freeaddrinfo(res);
    unref(n->rm);
    return;
  }
  unref(n->rm); /* not the last: rm is open */
  if (status < 0 || !res) {
    snprintf(why, sizeof(why), "cannot resolve %s (%s)", n->host,
             uv_strerror(status));
    node_down(n, why);
    return;
  }
  if (res->ai_family == AF_INET6)
    uv_ip6_name((struct sockaddr_in6 *)res->ai_addr, ip, sizeof(ip));
  else
    uv_ip4_name((struct sockaddr_in *)res->ai_addr, ip, sizeof(ip));
  uv_freeaddrinfo(res);
  start_context(n, ip);
}

static void node_connect(rnode *n) {
  tier_remote *rm = n->rm;
  struct addrinfo hints;

  if (!n->host[0]) {
    start_context(n, NULL);
    return;
  }
  memset(&hints, 0, sizeof(hints));
  hints.ai_socktype = SOCK_STREAM;
  n->state = RN_RESOLVING;
  n->gai.data = n;
  if (uv_getaddrinfo(rm->loop, &n->gai, on_resolved, n->host, NULL,
                     &hints) < 0) {
    node_down(n, "cannot resolve its name");
    return;
  }
  n->gai_busy = 1;
  rm->handles++;
}

/* A connection to host:port or path (its retry timer once rm started). */
static rnode *node_new(tier_remote *rm, const char *host, int port,
                       const char *path) {
  rnode *n = calloc(1, sizeof(*n));

  if (!n)
    return NULL;
  n->rm = rm;
  snprintf(n->host, sizeof(n->host), "%s", host);
  snprintf(n->path, sizeof(n->path), "%s", path);
  n->port = port;
  if (path[0])
    snprintf(n->addr, sizeof(n->addr), "unix:%s", path);
  else
    snprintf(n->addr, sizeof(n->addr), strchr(host, ':') ? "[%s]:%d"
                                                         : "%s:%d",
             host, port);
  return n;
}

/* A server: two connections, nodes[k] for reads and nodes[k + 1] for
 * writes, so that a Lookup's reads never wait behind a window of large
 * writes (the server serves its connections in turn).  Returns the
 * reader. */
static rnode *node_add(tier_remote *rm, const char *host, int port,
                       const char *path) {
  rnode *r, *w;

  for (uint32_t i = 0; i < rm->nnodes; i += 2) {
    r = rm->nodes[i];
    if (r->port == port && strcmp(r->host, host) == 0 &&
        strcmp(r->path, path) == 0)
      return r;
  }
  if (rm->nnodes + 2 > MAX_NODES)
    return NULL;
  r = node_new(rm, host, port, path);
  w = r ? node_new(rm, host, port, path) : NULL;
  if (!w) {
    free(r);
    return NULL;
  }
  w->writer = 1;
  strncat(w->addr, " (writes)", sizeof(w->addr) - strlen(w->addr) - 1);
  rm->nodes[rm->nnodes++] = r;
  rm->nodes[rm->nnodes++] = w;
  if (rm->started)
    for (int k = 0; k < 2; k++) {
      rnode *n = k ? w : r;
      uv_timer_init(rm->loop, &n->retry);
      n->retry.data = n;
      rm->handles++;
    }
  return r;
}

static int node_up(const rnode *n) {
  return n && n->state == RN_UP;
}

/* ---- cluster slot map ----------------------------------------------------- */

static void on_slots(redisAsyncContext *ac, void *r, void *priv) {
  rnode *from = ac->data;
  tier_remote *rm = priv;
  redisReply *reply = r;
  uint32_t mapped = 0;

  (void)from;
  if (from->pending)
    from->pending--;
  if (rm->closing || !reply || reply->type != REDIS_REPLY_ARRAY) {
    if (reply && reply->type == REDIS_REPLY_ERROR && !rm->closing)
      log_error(0, "remote tier %s: CLUSTER SLOTS: %s", from->addr,
                reply->str);
    return;
  }
  for (uint32_t s = 0; s < NSLOTS; s++)
    rm->slots[s] = NO_NODE;
  for (size_t i = 0; i < reply->elements; i++) {
    redisReply *e = reply->element[i], *m;
    char host[256];
    rnode *n;
    uint32_t idx;

    if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
        e->element[0]->type != REDIS_REPLY_INTEGER ||
        e->element[1]->type != REDIS_REPLY_INTEGER)
      continue;
    m = e->element[2];
    if (m->type != REDIS_REPLY_ARRAY || m->elements < 2 ||
        m->element[0]->type != REDIS_REPLY_STRING ||
        m->element[1]->type != REDIS_REPLY_INTEGER)
      continue;
    /* An empty or "?" host: the one we asked. */
    snprintf(host, sizeof(host), "%s",
             m->element[0]->len && strcmp(m->element[0]->str, "?") != 0
                 ? m->element[0]->str
                 : from->host);
    n = node_add(rm, host, (int)m->element[1]->integer, "");
    if (!n)
      continue;
    for (idx = 0; rm->nodes[idx] != n; idx++)
      ;
    for (int w = 0; w < 2; w++) {
      rnode *c = rm->nodes[idx + (uint32_t)w];
      if (c->state == RN_DOWN && !c->ac && !c->gai_busy &&
          !uv_is_active((uv_handle_t *)&c->retry))
        node_connect(c);
    }
    /* (a range clamped first: a bogus start of -2^63 must not loop) */
    for (long long s = e->element[0]->integer < 0 ? 0 : e->element[0]->integer;
         s <= e->element[1]->integer && s < NSLOTS; s++) {
      rm->slots[s] = (uint16_t)idx;
      mapped++;
    }
  }
  rm->have_map = mapped > 0;
  rm->st.slot_refreshes++;
  log_info(0, "remote tier: cluster slot map: %u of %u slots over %u nodes",
           mapped, NSLOTS, rm->nnodes / 2);
}

static void refresh_map(tier_remote *rm) {
  uint64_t now = now_ms(rm);

  /* (A reload still unanswered after REFRESH_MIN_MS does not hold the
   * next one: its node may hang.  The nodes up are asked in turn.) */
  if (!rm->cluster || rm->closing ||
      (rm->last_refresh && now - rm->last_refresh < REFRESH_MIN_MS))
    return;
  for (uint32_t k = 0; k < rm->nnodes; k++) {
    uint32_t i = (rm->refresh_next + k) % rm->nnodes;
    rnode *n = rm->nodes[i];
    if (!node_up(n))
      continue;
    rm->refresh_next = i + 1;
    if (redisAsyncCommand(n->ac, on_slots, rm, "CLUSTER SLOTS") == REDIS_OK) {
      owe(n);
      rm->last_refresh = now;
    }
    return;
  }
}

/* ---- reads ---------------------------------------------------------------- */

static void tlist_remove(rget *g) {
  tier_remote *rm = g->rm;

  if (!g->on_tlist)
    return;
  if (g->tprev)
    g->tprev->tnext = g->tnext;
  else
    rm->thead = g->tnext;
  if (g->tnext)
    g->tnext->tprev = g->tprev;
  else
    rm->ttail = g->tprev;
  g->on_tlist = 0;
}

static void get_free(rget *g) {
  tier_remote *rm = g->rm;

  for (uint32_t i = 0; i < g->pub.n; i++)
    free(g->items[i].buf);
  rm->st.inflight_bytes -= g->reserved;
  free(g);
}

/* Every answer is in, or the time is up: the owner hears of it once. */
static void get_finish(rget *g, int timed_out) {
  uint32_t k = 0;

  tlist_remove(g);
  g->cb_done = 1;
  while (k < g->pub.n && g->items[k].state == GI_OK)
    k++;
  g->pub.found = k;
  if (timed_out)
    g->rm->st.timeouts++;
  g->in_cb = 1;
  g->pub.cb(&g->pub); /* may release g */
  g->in_cb = 0;
  if (g->released && g->pending == 0)
    get_free(g);
}

/* The header's checksum: XXH3-64 of its token ids, seeded with XXH3-64 of
 * its 80 bytes (hdr_sum zero). */
static uint64_t hdr_sum(const rhdr *h, const void *tokens, size_t len) {
  return XXH3_64bits_withSeed(tokens, len, XXH3_64bits(h, sizeof(*h)));
}

/* Is value v (len bytes) block i's? */
static int value_good(const rget *g, uint32_t i, const char *v, size_t len) {
  const tier_remote *rm = g->rm;
  rhdr h;
  uint64_t sum;

  if (len != rm->value_len)
    return 0;
  memcpy(&h, v, sizeof(h));
  if (memcmp(h.magic, MAGIC, sizeof(MAGIC)) != 0 || h.version != 1 ||
      h.hdr_len != rm->hdr_len || h.len != rm->cfg.block_bytes ||
      h.hash_lo != g->hashes[i].lo || h.hash_hi != g->hashes[i].hi ||
      h.root_lo != rm->cfg.root.lo || h.root_hi != rm->cfg.root.hi ||
      h.block_size != rm->cfg.block_size ||
      (h.ntokens != 0 && h.ntokens != rm->cfg.block_size))
    return 0;
  sum = h.hdr_sum;
  h.hdr_sum = 0;
  if (hdr_sum(&h, v + HDR_FIXED, rm->hdr_len - HDR_FIXED) != sum)
    return 0;
  if (XXH3_64bits(v + rm->hdr_len, rm->cfg.block_bytes) != h.data_sum)
    return 0;
  if (g->tokens && h.ntokens &&
      memcmp(v + HDR_FIXED, g->tokens + (size_t)i * rm->cfg.block_size,
             (size_t)rm->cfg.block_size * sizeof(uint32_t)) != 0)
    return 0;
  return 1;
}

static void on_get_reply(redisAsyncContext *ac, void *r, void *priv) {
  gitem *it = priv;
  rget *g = it->g;
  tier_remote *rm = g->rm;
  rnode *n = ac->data;
  redisReply *reply = r;
  uint32_t i = (uint32_t)(it - g->items);

  if (n->pending)
    n->pending--;
  g->pending--;
  if (!reply) {
    it->state = GI_ERR;
    rm->st.error_blocks++;
  } else if (reply->type == REDIS_REPLY_NIL) {
    it->state = GI_MISS;
    rm->st.miss_blocks++;
  } else if (reply->type == REDIS_REPLY_STRING) {
    if (!g->cb_done && value_good(g, i, reply->str, (size_t)reply->len)) {
      it->state = GI_OK;
      it->buf = reply->str; /* ours now: hiredis frees a NULL */
      reply->str = NULL;
      reply->len = 0;
      rm->st.hit_blocks++;
      rm->st.bytes_read += rm->cfg.block_bytes;
    } else if (!g->cb_done) {
      it->state = GI_BAD;
      rm->st.bad_blocks++;
      if (rm->st.bad_blocks == 1)
        log_warn(0, "remote tier %s: a value with a wrong header, length "
                 "or checksum (not served; counted in bad_blocks; logged "
                 "once)", n->addr);
    }
  } else {
    it->state = GI_ERR;
    rm->st.error_blocks++;
    if (reply->type == REDIS_REPLY_ERROR &&
        (strncmp(reply->str, "MOVED", 5) == 0 ||
         strncmp(reply->str, "ASK", 3) == 0))
      refresh_map(rm);
  }
  if (g->pending == 0)
    tier_hist_add(&rm->st.get_hist, uv_hrtime() - g->start_ns);
  if (g->pending == 0 && !g->cb_done)
    get_finish(g, 0); /* frees g when its owner released it */
  else if (g->pending == 0 && g->released)
    get_free(g);
}

/* How long a connection owing answers may stay silent. */
static uint64_t stall_ms(const tier_remote *rm) {
  uint64_t t = (uint64_t)rm->cfg.timeout_ms * 4;

  return t > STALL_MIN_MS ? t : STALL_MIN_MS;
}

/* Drops the connections that owe answers and have been silent for
 * stall_ms (a server that stopped mid-reply would hold its connection,
 * and every read queued behind, for ever); 1 when some still owe. */
static int check_stalls(tier_remote *rm, uint64_t now) {
  int owing = 0;

  for (uint32_t i = 0; i < rm->nnodes; i++) {
    rnode *n = rm->nodes[i];

    if (!n->ac || n->pending == 0)
      continue;
    if (!n->connected) { /* (still connecting: looked at once it is) */
      owing = 1;
      continue;
    }
    if (now - n->last_rx >= stall_ms(rm)) {
      char why[80];
      snprintf(why, sizeof(why), "no answer for %llu ms",
               (unsigned long long)(now - n->last_rx));
      end_conn(n, why, 1);
    } else {
      owing = 1;
    }
  }
  return owing;
}

static void on_tick(uv_timer_t *t) {
  tier_remote *rm = t->data;
  uint64_t now = now_ms(rm), next = UINT64_MAX;

  while (rm->thead && rm->thead->deadline <= now)
    get_finish(rm->thead, 1);
  if (check_stalls(rm, now))
    next = stall_ms(rm) / 4;
  if (rm->thead && rm->thead->deadline - now < next)
    next = rm->thead->deadline - now;
  if (next != UINT64_MAX)
    uv_timer_start(&rm->tick, on_tick, next, 0);
  if (rm->cluster && !rm->have_map)
    refresh_map(rm);
}

/* Something is owed: the tick looks for stalls (and read deadlines). */
static void watch_stalls(tier_remote *rm) {
  if (rm->started && !rm->closing && !uv_is_active((uv_handle_t *)&rm->tick))
    uv_timer_start(&rm->tick, on_tick, stall_ms(rm) / 4, 0);
}

int tier_remote_get_start(tier_remote *rm, const kvs_hash128 *hashes, uint32_t n,
                     const uint32_t *tokens, tier_remote_get_cb cb, void *data,
                     tier_remote_get **out) {
  const uint64_t per = rm->value_len + 64;
  uint64_t room = rm->st.inflight_bytes < rm->cfg.inflight_bytes
                      ? (rm->cfg.inflight_bytes - rm->st.inflight_bytes) / per
                      : 0;
  uint64_t want;
  size_t ntok;
  rget *g;
  char key[KEY_MAX];

  *out = NULL;
  if (n == 0 || rm->closing || room == 0 ||
      (rm->cluster && !rm->have_map) || (!rm->cluster && !node_up(rm->nodes[0]))) {
    rm->st.unavailable++;
    if (rm->cluster && !rm->have_map)
      refresh_map(rm);
    return KVS_ELIMIT;
  }
  /* A chain longer than the bound leaves room for: its first blocks (the
   * rest could not be served past a miss anyway). */
  if (n > room)
    n = (uint32_t)room;
  want = (uint64_t)n * per;
  ntok = tokens ? (size_t)n * rm->cfg.block_size : 0;
  g = calloc(1, sizeof(*g) + n * sizeof(gitem) + n * sizeof(kvs_hash128) +
                    ntok * sizeof(uint32_t));
  if (!g)
    return KVS_ENOMEM;
  g->rm = rm;
  g->pub.cb = cb;
  g->pub.data = data;
  g->pub.n = n;
  g->hashes = (kvs_hash128 *)(g->items + n);
  memcpy(g->hashes, hashes, n * sizeof(kvs_hash128));
  if (tokens) {
    g->tokens = (uint32_t *)(g->hashes + n);
    memcpy(g->tokens, tokens, ntok * sizeof(uint32_t));
  }
  for (uint32_t i = 0; i < n; i++) {
    size_t klen = make_key(rm, hashes[i], key);
    rnode *nd = node_for(rm, key, klen, 0);
    const char *argv[2] = {"GET", key};
    size_t argl[2] = {3, klen};

    g->items[i].g = g;
    if (!node_up(nd) || redisAsyncCommandArgv(nd->ac, on_get_reply,
                                              &g->items[i], 2, argv,
                                              argl) != REDIS_OK) {
      /* Its server is down (a cluster node): the chain stops here, the
       * rest could not be served anyway. */
      g->items[i].state = GI_ERR;
      g->pub.n = i + 1;
      break;
    }
    owe(nd);
    g->pending++;
  }
  if (g->pending == 0) { /* nothing went out */
    free(g);
    rm->st.unavailable++;
    return KVS_ELIMIT;
  }
  rm->st.gets++;
  rm->st.get_blocks += g->pending;
  if (g->pending < g->pub.n)
    rm->st.error_blocks++; /* the block whose server is down */
  g->reserved = want;
  rm->st.inflight_bytes += want;
  g->deadline = now_ms(rm) + rm->cfg.timeout_ms;
  g->start_ns = uv_hrtime();
  g->tprev = rm->ttail;
  if (rm->ttail)
    rm->ttail->tnext = g;
  else
    rm->thead = g;
  rm->ttail = g;
  g->on_tlist = 1;
  if (!uv_is_active((uv_handle_t *)&rm->tick) ||
      uv_timer_get_due_in(&rm->tick) > rm->cfg.timeout_ms)
    uv_timer_start(&rm->tick, on_tick, rm->cfg.timeout_ms, 0);
  *out = &g->pub;
  return 0;
}

const void *tier_remote_get_data(const tier_remote_get *pg, uint32_t i) {
  const rget *g = (const rget *)pg;

  return g->items[i].buf + g->rm->hdr_len;
}

void tier_remote_get_release(tier_remote_get *pg) {
  rget *g = (rget *)pg;

  tlist_remove(g);
  g->cb_done = 1;
  g->released = 1;
  for (uint32_t i = 0; i < g->pub.n; i++) {
    free(g->items[i].buf);
    g->items[i].buf = NULL;
  }
  if (g->pending == 0 && !g->in_cb)
    get_free(g);
}

/* ---- writes --------------------------------------------------------------- */

size_t tier_remote_put_size(const tier_remote *rm) { return rm->put_size; }
size_t tier_remote_put_offset(const tier_remote *rm) {
  return rm->put_pfx + rm->hdr_len;
}

uint32_t tier_remote_put_room(const tier_remote *rm) {
  uint64_t left, window;

  if (rm->closing || (rm->cluster ? !rm->have_map : !node_up(rm->nodes[1])))
    return 0;
  if (rm->st.inflight_bytes >= rm->cfg.inflight_bytes ||
      rm->write_inflight >= rm->write_window)
    return 0;
  left = (rm->cfg.inflight_bytes - rm->st.inflight_bytes) / rm->put_size;
  window = (rm->write_window - rm->write_inflight) / rm->put_size;
  if (left > window)
    left = window;
  return left > UINT32_MAX ? UINT32_MAX : (uint32_t)left;
}

void tier_remote_set_room_cb(tier_remote *rm,
                             void (*cb)(void *, kvs_hash128, int),
                             void *data) {
  rm->room_cb = cb;
  rm->room_data = data;
}

/* A write in flight: what its answer is about. */
typedef struct put_ctx {
  tier_remote *rm;
  kvs_hash128 h;
  uint64_t start_ns;
} put_ctx;

static void on_put_reply(redisAsyncContext *ac, void *r, void *priv) {
  rnode *n = ac->data;
  put_ctx pc = *(put_ctx *)priv;
  tier_remote *rm = pc.rm;
  redisReply *reply = r;
  int ok = reply && reply->type == REDIS_REPLY_STATUS;

  free(priv);
  if (n->pending)
    n->pending--;
  rm->st.inflight_bytes -= rm->put_size;
  rm->write_inflight -= rm->put_size;
  if (ok) {
    rm->st.puts++;
    rm->st.put_bytes += rm->cfg.block_bytes;
    tier_hist_add(&rm->st.put_hist, uv_hrtime() - pc.start_ns);
  } else {
    rm->st.put_errors++;
  }
  if (rm->room_cb && !rm->closing)
    rm->room_cb(rm->room_data, pc.h, ok); /* (it writes later, not from
                                             here) */
  if (ok)
    return;
  if (reply && reply->type == REDIS_REPLY_ERROR) {
    if (strncmp(reply->str, "MOVED", 5) == 0 ||
        strncmp(reply->str, "ASK", 3) == 0)
      refresh_map(rm);
    else if (rm->st.put_errors == 1 || strncmp(reply->str, "OOM", 3) == 0)
      log_at(rm->st.put_errors == 1 ? LOG_WARN : LOG_DEBUG, 0,
             "remote tier %s: a write refused: %s (counted in put_errors)",
             n->addr, reply->str);
  }
}

int tier_remote_put(tier_remote *rm, void *buf, kvs_hash128 h, const uint32_t *tokens) {
  char *p = buf, key[KEY_MAX], *v;
  size_t klen = make_key(rm, h, key);
  rnode *nd = node_for(rm, key, klen, 1);
  put_ctx *pc;
  rhdr hd;
  size_t off;

  if (!node_up(nd) || tier_remote_put_room(rm) == 0) {
    rm->st.puts_skipped++;
    return KVS_ELIMIT;
  }
  /* "*3\r\n$3\r\nSET\r\n$K\r\nKEY\r\n$V\r\n" VALUE "\r\n" [PX] */
  off = (size_t)sprintf(p, "*%d\r\n$3\r\nSET\r\n$%zu\r\n", rm->cfg.ttl_ms ? 5 : 3,
                        klen);
  memcpy(p + off, key, klen);
  off += klen;
  off += (size_t)sprintf(p + off, "\r\n$%" PRIu64 "\r\n", rm->value_len);
  if (off != rm->put_pfx) /* the layout is fixed at open */
    return KVS_EINTERNAL;
  v = p + off;
  memset(&hd, 0, sizeof(hd));
  memcpy(hd.magic, MAGIC, sizeof(MAGIC));
  hd.version = 1;
  hd.hdr_len = (uint32_t)rm->hdr_len;
  hd.len = rm->cfg.block_bytes;
  hd.hash_lo = h.lo;
  hd.hash_hi = h.hi;
  hd.root_lo = rm->cfg.root.lo;
  hd.root_hi = rm->cfg.root.hi;
  hd.block_size = rm->cfg.block_size;
  hd.ntokens = tokens ? rm->cfg.block_size : 0;
  if (tokens)
    memcpy(v + HDR_FIXED, tokens,
           (size_t)rm->cfg.block_size * sizeof(uint32_t));
  else
    memset(v + HDR_FIXED, 0, rm->hdr_len - HDR_FIXED);
  hd.data_sum = XXH3_64bits(v + rm->hdr_len, rm->cfg.block_bytes);
  hd.hdr_sum = hdr_sum(&hd, v + HDR_FIXED, rm->hdr_len - HDR_FIXED);
  memcpy(v, &hd, sizeof(hd));
  off += rm->value_len;
  memcpy(p + off, "\r\n", 2);
  off += 2;
  if (rm->cfg.ttl_ms) {
    char ttl[16];
    int tl = snprintf(ttl, sizeof(ttl), "%u", rm->cfg.ttl_ms);
    off += (size_t)sprintf(p + off, "$2\r\nPX\r\n$%d\r\n%s\r\n", tl, ttl);
  }
  pc = malloc(sizeof(*pc));
  if (pc != NULL)
    *pc = (put_ctx){rm, h, uv_hrtime()};
  if (pc == NULL ||
      redisAsyncFormattedCommand(nd->ac, on_put_reply, pc, p, off) !=
          REDIS_OK) {
    free(pc);
    rm->st.puts_skipped++;
    return KVS_ELIMIT;
  }
  owe(nd);
  rm->st.inflight_bytes += rm->put_size;
  rm->write_inflight += rm->put_size;
  return 0;
}

/* ---- set-up --------------------------------------------------------------- */

static int fail(char *err, size_t len, const char *fmt, const char *arg) {
  snprintf(err, len, fmt, arg);
  return KVS_EINVAL;
}

/* "HOST[:PORT]" or "[V6]:PORT" into host, port. */
static int parse_hostport(const char *s, size_t len, char *host, int *port) {
  const char *colon;
  char buf[256];

  if (len == 0 || len >= sizeof(buf))
    return -1;
  memcpy(buf, s, len);
  buf[len] = '\0';
  *port = 6379;
  if (buf[0] == '[') {
    char *end = strchr(buf, ']');
    if (!end || end == buf + 1)
      return -1;
    *end = '\0';
    snprintf(host, 256, "%s", buf + 1);
    colon = end[1] == ':' ? end + 1 : NULL;
    if (end[1] && !colon)
      return -1;
  } else {
    char *c = strrchr(buf, ':');
    if (c)
      *c = '\0';
    if (!buf[0] || strlen(buf) >= 256)
      return -1;
    snprintf(host, 256, "%s", buf);
    colon = c;
  }
  if (colon) {
    char *e;
    long p = strtol(colon + 1, &e, 10);
    if (*e || p < 1 || p > 65535)
      return -1;
    *port = (int)p;
  }
  return 0;
}

/* "[USER[:PASS]@]" at the front of s: consumed, into rm. */
static const char *parse_userinfo(tier_remote *rm, const char *s) {
  const char *at = strchr(s, '@'), *slash = strchr(s, '/');
  const char *colon;

  if (!at || (slash && slash < at))
    return s;
  colon = memchr(s, ':', (size_t)(at - s));
  if (colon) {
    snprintf(rm->user, sizeof(rm->user), "%.*s", (int)(colon - s), s);
    snprintf(rm->pass, sizeof(rm->pass), "%.*s", (int)(at - colon - 1),
             colon + 1);
  } else {
    snprintf(rm->pass, sizeof(rm->pass), "%.*s", (int)(at - s), s);
  }
  return at + 1;
}

static int parse_url(tier_remote *rm, char *err, size_t len) {
  const char *u = rm->url, *p;
  char host[256];
  int port;

  if (strncmp(u, "unix://", 7) == 0) {
    const char *q = strstr(u + 7, "?db=");
    size_t plen = q ? (size_t)(q - (u + 7)) : strlen(u + 7);
    char path[108];
    if (plen == 0 || plen >= sizeof(path) || u[7] != '/')
      return fail(err, len, "remote_tier '%s': want unix:///PATH[?db=N] "
                  "with an absolute path shorter than 108 bytes", u);
    memcpy(path, u + 7, plen);
    path[plen] = '\0';
    if (q) {
      char *e;
      long d = strtol(q + 4, &e, 10);
      if (*e || d < 0 || d > 1000000)
        return fail(err, len, "remote_tier '%s': bad db number", u);
      rm->db = (int)d;
    }
    return node_add(rm, "", 0, path) ? 0 : KVS_ENOMEM;
  }
  if (strncmp(u, "redis://", 8) == 0) {
    const char *slash;
    p = parse_userinfo(rm, u + 8);
    slash = strchr(p, '/');
    if (parse_hostport(p, slash ? (size_t)(slash - p) : strlen(p), host,
                       &port) < 0)
      return fail(err, len, "remote_tier '%s': want "
                  "redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]", u);
    if (slash && slash[1]) {
      char *e;
      long d = strtol(slash + 1, &e, 10);
      if (*e || d < 0 || d > 1000000)
        return fail(err, len, "remote_tier '%s': bad db number", u);
      rm->db = (int)d;
    }
    return node_add(rm, host, port, "") ? 0 : KVS_ENOMEM;
  }
  if (strncmp(u, "redis-cluster://", 16) == 0) {
    rm->cluster = 1;
    p = parse_userinfo(rm, u + 16);
    while (*p) {
      const char *comma = strchr(p, ',');
      size_t l = comma ? (size_t)(comma - p) : strlen(p);
      if (parse_hostport(p, l, host, &port) < 0)
        return fail(err, len, "remote_tier '%s': want "
                    "redis-cluster://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT"
                    "...]", u);
      if (!node_add(rm, host, port, ""))
        return fail(err, len, "remote_tier '%s': too many seed nodes", u);
      p += l + (comma ? 1 : 0);
    }
    if (rm->nnodes == 0)
      return fail(err, len, "remote_tier '%s': no seed node", u);
    rm->slots = malloc(NSLOTS * sizeof(uint16_t));
    if (!rm->slots)
      return KVS_ENOMEM;
    for (uint32_t s = 0; s < NSLOTS; s++)
      rm->slots[s] = NO_NODE;
    return 0;
  }
  return fail(err, len, "remote_tier '%s': want redis://, unix:// or "
              "redis-cluster://", u);
}

static int read_password(tier_remote *rm, const char *path, char *err,
                         size_t len) {
  FILE *f = fopen(path, "r");
  char line[512], *sp;
  size_t n;

  if (!f) {
    snprintf(err, len, "remote_tier_password_file %s: %s", path,
             strerror(errno));
    return KVS_EINVAL;
  }
  if (!fgets(line, sizeof(line), f)) {
    fclose(f);
    return fail(err, len, "remote_tier_password_file %s is empty", path);
  }
  fclose(f);
  n = strcspn(line, "\r\n");
  line[n] = '\0';
  /* "PASSWORD" or "USER PASSWORD" (an ACL user) */
  sp = strchr(line, ' ');
  rm->user[0] = '\0';
  if (sp) {
    *sp = '\0';
    if (strlen(line) >= sizeof(rm->user))
      return fail(err, len, "remote_tier_password_file %s: user name too "
                  "long", path);
    memcpy(rm->user, line, strlen(line) + 1);
    sp++;
  } else {
    sp = line;
  }
  if (strlen(sp) >= sizeof(rm->pass))
    return fail(err, len, "remote_tier_password_file %s: password too long",
                path);
  memcpy(rm->pass, sp, strlen(sp) + 1);
  if (!rm->pass[0])
    return fail(err, len, "remote_tier_password_file %s: no password", path);
  return 0;
}

int tier_remote_check(const char *url, const char *password_file, char *err,
                      size_t err_len) {
  tier_remote *rm = calloc(1, sizeof(*rm));
  int rcode;

  if (!rm) {
    snprintf(err, err_len, "out of memory");
    return KVS_ENOMEM;
  }
  snprintf(rm->url, sizeof(rm->url), "%s", url);
  rcode = parse_url(rm, err, err_len);
  if (rcode == 0 && password_file && password_file[0])
    rcode = read_password(rm, password_file, err, err_len);
  if (rcode == KVS_ENOMEM)
    snprintf(err, err_len, "out of memory");
  store_free(rm);
  return rcode;
}

int tier_remote_open(uv_loop_t *loop, const tier_remote_config *rc, tier_remote **out,
                char *err, size_t err_len) {
  tier_remote *rm = calloc(1, sizeof(*rm));
  size_t klen;
  int rcode;
  char pfx[64];

  *out = NULL;
  if (!rm) {
    snprintf(err, err_len, "out of memory");
    return KVS_ENOMEM;
  }
  rm->loop = loop;
  rm->cfg = *rc;
  snprintf(rm->url, sizeof(rm->url), "%s", rc->url);
  snprintf(rm->prefix, sizeof(rm->prefix), "%s", rc->prefix);
  rm->cfg.url = rm->url;
  rm->cfg.prefix = rm->prefix;
  rm->cfg.password_file = NULL;
  /* Everything that can fail first, before any handle exists. */
  rcode = parse_url(rm, err, err_len);
  if (rcode == 0 && rc->password_file && rc->password_file[0])
    rcode = read_password(rm, rc->password_file, err, err_len);
  if (rcode == 0 && (!rc->block_bytes || !rc->block_size || !rc->timeout_ms ||
                     !rc->inflight_bytes))
    rcode = fail(err, err_len, "remote tier: %s", "bad configuration");
  if (rcode < 0) {
    if (rcode == KVS_ENOMEM)
      snprintf(err, err_len, "out of memory");
    store_free(rm);
    return rcode;
  }
  rm->hdr_len = HDR_FIXED + (uint64_t)rc->block_size * sizeof(uint32_t);
  rm->value_len = rm->hdr_len + rc->block_bytes;
  klen = (size_t)snprintf(NULL, 0, "%s:%016x:%032x", rm->prefix, 0, 0);
  rm->put_pfx = (uint64_t)snprintf(pfx, sizeof(pfx),
                                   "*3\r\n$3\r\nSET\r\n$%zu\r\n", klen) +
                klen +
                (uint64_t)snprintf(pfx, sizeof(pfx), "\r\n$%" PRIu64 "\r\n",
                                   rm->value_len);
  rm->put_size = rm->put_pfx + rm->value_len + 2 + (rc->ttl_ms ? 40 : 0);
  rm->write_window = WRITE_WINDOW > 2 * rm->put_size ? WRITE_WINDOW
                                                     : 2 * rm->put_size;
  snprintf(rm->desc, sizeof(rm->desc), "%s%s%s, key prefix '%s', %s%s",
           rm->cluster ? "cluster, seeds " : "", rm->nodes[0]->addr,
           rm->nnodes > 1 ? ",..." : "", rm->prefix,
           rm->pass[0] ? "AUTH" : "no AUTH", rm->db ? ", SELECT db" : "");
  /* hiredis gives each value its own malloc'd string, freed when the
   * lookup is done with it; glibc's default would give megabytes back to
   * the kernel after every lookup and fault them in again for the next
   * (first-touch faults cost more than the copies here: 2.5 vs 25 ms for a
   * 2 MiB lookup on the dev VM).  Keep up to the in-flight bound of freed
   * heap instead; values stay on the heap, not mmap'd one by one. */
  mallopt(M_MMAP_THRESHOLD, (int)(rm->value_len * 4 > (32u << 20)
                                      ? rm->value_len * 4
                                      : (32u << 20)));
  mallopt(M_TRIM_THRESHOLD, (int)(rc->inflight_bytes + (64u << 20) < INT32_MAX
                                      ? rc->inflight_bytes + (64u << 20)
                                      : INT32_MAX));
  uv_timer_init(loop, &rm->tick);
  uv_timer_init(loop, &rm->grace);
  rm->tick.data = rm->grace.data = rm;
  rm->handles = 2;
  rm->started = 1;
  for (uint32_t i = 0; i < rm->nnodes; i++) {
    rnode *n = rm->nodes[i];
    uv_timer_init(loop, &n->retry);
    n->retry.data = n;
    rm->handles++;
  }
  for (uint32_t i = 0; i < rm->nnodes; i++)
    node_connect(rm->nodes[i]);
  *out = rm;
  return 0;
}

static void on_grace(uv_timer_t *t) {
  tier_remote *rm = t->data;

  /* Writes not flushed by now are lost (counted): the server is gone.  A
   * context freed here calls its callbacks and on_disconnect. */
  for (uint32_t i = 0; i < rm->nnodes; i++)
    if (rm->nodes[i]->ac)
      redisAsyncFree(rm->nodes[i]->ac);
}

void tier_remote_close(tier_remote *rm) {
  if (!rm)
    return;
  rm->closing = 1;
  while (rm->thead)
    get_finish(rm->thead, 0);
  uv_timer_stop(&rm->tick);
  uv_close((uv_handle_t *)&rm->tick, handle_closed);
  rm->handles++; /* held across the loop below */
  for (uint32_t i = 0; i < rm->nnodes; i++) {
    rnode *n = rm->nodes[i];
    uv_timer_stop(&n->retry);
    n->retry.data = rm;
    uv_close((uv_handle_t *)&n->retry, handle_closed);
    if (n->gai_busy)
      uv_cancel((uv_req_t *)&n->gai);
    if (n->ac && n->connected) {
      redisAsyncDisconnect(n->ac); /* after its answers: on_disconnect */
    } else if (n->ac) { /* never connected: no callback will come */
      redisAsyncContext *ac = n->ac;
      n->ac = NULL;
      n->state = RN_CLOSED;
      redisAsyncFree(ac);
      context_gone(rm);
    }
  }
  /* (A disconnect owing no answer is synchronous: context_gone may have
   * closed grace already.) */
  if (rm->contexts == 0 && !rm->grace_closed) {
    rm->grace_closed = 1;
    uv_close((uv_handle_t *)&rm->grace, handle_closed);
  } else if (rm->contexts) {
    uv_timer_start(&rm->grace, on_grace, CLOSE_GRACE_MS, 0);
  }
  unref(rm);
}

void tier_remote_get_stats(const tier_remote *rm, tier_remote_stats *st) {
  *st = rm->st;
  st->nodes = rm->nnodes / 2;
  st->nodes_up = 0;
  for (uint32_t i = 0; i < rm->nnodes; i += 2) /* both connections */
    st->nodes_up += (uint32_t)(node_up(rm->nodes[i]) &&
                               node_up(rm->nodes[i + 1]));
}

const char *tier_remote_describe(const tier_remote *rm) { return rm->desc; }

void tier_remote_stats_add(tier_remote_stats *acc,
                           const tier_remote_stats *x) {
#define ADD(f) acc->f += x->f
  ADD(nodes);
  ADD(nodes_up);
  ADD(inflight_bytes);
  ADD(gets);
  ADD(get_blocks);
  ADD(hit_blocks);
  ADD(miss_blocks);
  ADD(bad_blocks);
  ADD(error_blocks);
  ADD(timeouts);
  ADD(unavailable);
  ADD(puts);
  ADD(put_bytes);
  ADD(put_errors);
  ADD(puts_skipped);
  ADD(bytes_read);
  ADD(reconnects);
  ADD(dropped);
  ADD(slot_refreshes);
#undef ADD
  tier_hist_merge(&acc->get_hist, &x->get_hist);
  tier_hist_merge(&acc->put_hist, &x->put_hist);
}
