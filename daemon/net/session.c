/*
 * session.c — one connection = one session (session.h).
 *
 * Life: accept -> SO_PEERCRED check and the connection limit (a refused peer
 * gets an error Welcome, then the close) -> frames in, parsed incrementally
 * from a per-session buffer -> Hello answered by a Welcome sent with the pool
 * fds in one sendmsg -> requests answered in order -> close.  On close (EOF,
 * reset, kill -9 of the peer, a protocol error, or shutdown) every request
 * of the session is freed at once.
 *
 * A frame: read -> decoded by its codec into a call (proto/kvs_codec.h) ->
 * its ops run by dispatch -> its reply encoded by the same codec -> written
 * (or held while a copy or an op's bytes move).
 *
 * Errors in a frame header (magic, version, flags, length over the limit)
 * leave the stream impossible to resynchronise: the peer gets one error
 * reply and the connection closes.  A well-framed payload that does not
 * decode gets an EPROTO reply (ELIMIT when decoding it would take more
 * memory than any frame the daemon accepts needs), with the frame's seq
 * when it could be read, and the connection goes on.  Before the
 * handshake, anything but a good Hello is answered by an error Welcome and
 * a close.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "daemon/log.h"
#include "daemon/net/session.h"
#include "kvs_codec.h"
#include "kvs_compact.h"
#include "kvs_frame.h"
#include "kvs_shm.h"

#define RBUF_MIN (64u << 10)
/* Stop reading from a peer that does not read its replies once this many
 * bytes are queued for it; resume below half. */
#define WRITE_QUEUE_MAX (32u << 20)
/* While the replies queued for all sessions together are over
 * max_queued_bytes, a session with more than this queued is paused too (it
 * resumes when its own writes bring it under half of it): the total stays
 * near max_queued_bytes however many sessions stop reading. */
#define WRITE_QUEUE_PRESSED (1u << 20)

typedef enum sess_life {
  SESS_NEW,     /* accepted; no Welcome sent yet */
  SESS_OPEN,    /* Welcome sent: requests are answered */
  SESS_CLOSING, /* no more input; queued replies are written */
  SESS_CLOSED,  /* uv_close called */
  SESS_GONE,    /* the handle closed; freed when its hold ends */
} sess_life;

typedef enum sess_hold {
  SESS_READY,   /* the next frame may be read */
  SESS_COPYING, /* the daemon's copy job holds the frame's reply */
  SESS_WAITING, /* an op's promotion or swap holds the frame's reply */
} sess_hold;

struct sess {
  uv_pipe_t pipe; /* first: the handle's address is the session's */
  sess_hub *hub;
  sess *prev, *next;
  uint64_t id;
  pid_t pid;
  uid_t uid;
  gid_t gid;
  sess_life life;
  sess_hold hold;
  int counted;    /* counts against max_connections */
  int reading;    /* uv_read_start'ed */
  uint64_t accepted_ms; /* uv_now at accept */
  uint64_t progress_ms; /* uv_now at the last bytes read, or when the
                           daemon last stopped waiting on them */
  char name[64];  /* Hello.client_name, for the log */
  uint8_t *rbuf;  /* bytes received, not yet parsed */
  size_t rlen, rcap;
  size_t writes;  /* uv_write requests in flight */
  disp_sess ds;   /* its requests, copies and held op */
  copy_job job;   /* the daemon's copies for the frame being answered */
  struct wreq *held; /* the reply the copy job holds back */
  /* The frame whose reply an op holds back (SESS_WAITING). */
  uint64_t held_seq;
  uint8_t held_shape;
  /* With metrics on: when the request being answered was taken up
   * (uv_hrtime; 0: none pending) and its kind, for the latency histogram. */
  uint64_t req_t0;
  int req_op;
  /* The session's request ring; NULL: none.  ring_cur: the frame being
   * answered came through it, so its reply goes back through it. */
  sring *ring;
  int ring_cur;
};

static int closing(const sess *c) { return c->life >= SESS_CLOSING; }

/* Should a session with q bytes queued stop being read?  And may a paused
 * one be read again? */
static int too_much_queued(const sess *c, size_t q) {
  const sess_hub *h = c->hub;

  return q > WRITE_QUEUE_MAX || (h->counts.queued_bytes >
                                     h->cfg->max_queued_bytes &&
                                 q > WRITE_QUEUE_PRESSED);
}

static int may_resume(const sess *c, size_t q) {
  const sess_hub *h = c->hub;

  return q < WRITE_QUEUE_MAX / 2 &&
         (h->counts.queued_bytes <= h->cfg->max_queued_bytes / 2 ||
          q < WRITE_QUEUE_PRESSED / 2);
}

static size_t write_queue(sess *c) {
  return uv_stream_get_write_queue_size((uv_stream_t *)&c->pipe);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf);
static void process_input(sess *c);

static void start_reading(sess *c) {
  if (!c->reading &&
      uv_read_start((uv_stream_t *)&c->pipe, on_alloc, on_read) == 0)
    c->reading = 1;
}

static void stop_reading(sess *c) {
  if (c->reading) {
    uv_read_stop((uv_stream_t *)&c->pipe);
    c->reading = 0;
  }
}

static void link_session(sess_hub *h, sess *c) {
  c->next = h->sessions;
  c->prev = NULL;
  if (h->sessions)
    h->sessions->prev = c;
  h->sessions = c;
}

static void unlink_session(sess_hub *h, sess *c) {
  if (c->prev)
    c->prev->next = c->next;
  else
    h->sessions = c->next;
  if (c->next)
    c->next->prev = c->prev;
  c->prev = c->next = NULL;
}

/* Frees every request of the session (idempotent). */
static void free_requests(sess *c) {
  if (c->ds.reqs.count)
    log_debug(0, "session %llu: freeing %zu requests",
              (unsigned long long)c->id, c->ds.reqs.count);
  disp_sess_free_requests(&c->ds);
}

/* The last of the session: its handle is closed and nothing of its is in
 * flight. */
static void reap(sess *c) {
  sess_hub *h = c->hub;

  disp_sess_destroy(&c->ds);
  ring_free(c->ring);
  free(c->rbuf);
  free(c);
  if (h->on_gone)
    h->on_gone(h->data);
}

static void on_closed(uv_handle_t *handle) {
  sess *c = (sess *)handle;

  c->life = SESS_GONE;
  if (c->hold == SESS_READY)
    reap(c); /* else the hold's end reaps it: the job points at c */
}

static void close_now(sess *c) {
  sess_hub *h = c->hub;

  if (c->life >= SESS_CLOSED)
    return;
  c->life = SESS_CLOSED;
  free_requests(c);
  unlink_session(h, c);
  if (c->counted) {
    char ring[96] = "";

    if (c->ring != NULL) {
      ring[0] = ';';
      ring[1] = ' ';
      ring_describe(c->ring, ring + 2, sizeof(ring) - 2);
    }
    h->counts.sessions--;
    c->ds.env->own.sessions--;
    log_info(0, "session %llu closed (pid %d%s%s%s)", (unsigned long long)c->id,
             (int)c->pid, c->name[0] ? ", " : "", c->name, ring);
  }
  uv_close((uv_handle_t *)&c->pipe, on_closed);
}

void sess_shutdown(sess *c, int force) {
  if (c->life < SESS_CLOSING)
    c->life = SESS_CLOSING;
  free_requests(c);
  stop_reading(c);
  /* (A held reply goes first: its hold's end sends it, then closes.) */
  if (force || (c->writes == 0 && c->hold == SESS_READY))
    close_now(c);
  /* else on_write closes it when the last reply is out */
}

void sess_shutdown_all(sess_hub *h, int force) {
  sess *c, *next;

  for (c = h->sessions; c; c = next) {
    next = c->next; /* (shutting c down closes only c) */
    sess_shutdown(c, force);
  }
}

/* Closes after the replies queued so far are written. */
static void close_after_writes(sess *c) { sess_shutdown(c, 0); }

/* ---- writes ---------------------------------------------------------------- */

struct wreq {
  uv_write_t req;
  sess *c;
  size_t len;
  size_t queued; /* bytes of it counted in the hub's queued_bytes */
  size_t cap;    /* bytes of data */
  struct wreq *next_spare;
  uint8_t data[];
};

/* Small reply buffers are kept for reuse (a malloc and a free per reply
 * were a tenth of a small call's work in the daemon). */
#define WREQ_SMALL 1024u
#define WREQ_SPARES 16u

static struct wreq *wreq_new(sess_hub *h, size_t len) {
  struct wreq *w;

  if (len <= WREQ_SMALL && h->wspare) {
    w = h->wspare;
    h->wspare = w->next_spare;
    h->nwspare--;
    return w;
  }
  w = malloc(sizeof(*w) + (len < WREQ_SMALL ? WREQ_SMALL : len));
  if (w)
    w->cap = len < WREQ_SMALL ? WREQ_SMALL : len;
  return w;
}

static void wreq_free(sess_hub *h, struct wreq *w) {
  if (w->cap == WREQ_SMALL && h->nwspare < WREQ_SPARES) {
    w->next_spare = h->wspare;
    h->wspare = w;
    h->nwspare++;
    return;
  }
  free(w);
}

void sess_hub_free(sess_hub *h) {
  while (h->wspare) {
    struct wreq *w = h->wspare;

    h->wspare = w->next_spare;
    free(w);
  }
  h->nwspare = 0;
  kvs__arena_destroy(&h->arena);
}

/* The session may be read again (its held reply sent, its replies read):
 * frames buffered meanwhile, and a request posted on its ring. */
static void resume(sess *c) {
  process_input(c);
  if (c->life < SESS_CLOSED)
    ring_resume(c->ring);
}

static void on_write(uv_write_t *req, int status) {
  struct wreq *w = (struct wreq *)req;
  sess *c = w->c;

  c->hub->counts.queued_bytes -= w->queued;
  c->ds.env->own.queued_bytes -= w->queued;
  wreq_free(c->hub, w);
  c->writes--;
  if (c->life >= SESS_CLOSED)
    return;
  if (status < 0) {
    log_debug(status, "session %llu: write", (unsigned long long)c->id);
    close_now(c);
    return;
  }
  if (closing(c)) {
    if (c->writes == 0 && c->hold == SESS_READY)
      close_now(c);
    return;
  }
  /* A peer that had stopped reading its replies is reading again. */
  if (!c->reading && c->hold == SESS_READY && may_resume(c, write_queue(c))) {
    start_reading(c);
    resume(c);
  }
}

/* Sends bytes[off, len) of an already framed reply: at once when nothing
 * is queued before it and the socket takes it all (no uv_write_t, no
 * callback), else the rest is queued.  The reply to a frame that came
 * through the ring goes back through it when it fits. */
static int queue_bytes(sess *c, struct wreq *w, size_t off) {
  uv_buf_t b;
  int rc;

  if (c->ring_cur) {
    c->ring_cur = 0;
    if (ring_reply(c->ring, w->data + off, w->len - off) == 0) {
      wreq_free(c->hub, w);
      return 0;
    }
    /* too big for the ring, which now says so: on the socket */
  }
  if (c->writes == 0) {
    b = uv_buf_init((char *)w->data + off, (unsigned)(w->len - off));
    rc = uv_try_write((uv_stream_t *)&c->pipe, &b, 1);
    if (rc >= 0 && (size_t)rc == w->len - off) {
      wreq_free(c->hub, w);
      return 0;
    }
    if (rc >= 0) {
      off += (size_t)rc;
    } else if (rc != UV_EAGAIN) {
      wreq_free(c->hub, w);
      log_debug(rc, "session %llu: write", (unsigned long long)c->id);
      close_now(c);
      return rc;
    }
  }
  b = uv_buf_init((char *)w->data + off, (unsigned)(w->len - off));
  w->c = c;
  w->queued = w->len - off;
  rc = uv_write(&w->req, (uv_stream_t *)&c->pipe, &b, 1, on_write);
  if (rc < 0) {
    wreq_free(c->hub, w);
    log_debug(rc, "session %llu: write", (unsigned long long)c->id);
    close_now(c);
    return rc;
  }
  c->hub->counts.queued_bytes += w->queued;
  c->ds.env->own.queued_bytes += w->queued;
  c->writes++;
  return 0;
}

/* The reply to call, encoded: ETOOBIG in its place when it is over
 * max_frame (its ops ran; only their results cannot go back).  NULL
 * (logged) when out of memory. */
static struct wreq *encode_reply(sess *c, kvs_call *call) {
  sess_hub *h = c->hub;
  kvs_reply rep;
  struct wreq *w;
  size_t len = kvs_reply_size(&rep, call, &h->arena);

  if (len && len - KVS_FRAME_HEADER_SIZE > h->cfg->max_frame) {
    kvs_call_refuse(call, &h->arena, KVS_ETOOBIG, "the reply (%zu bytes) is "
                    "over max_frame; split the batch", len);
    len = kvs_reply_size(&rep, call, &h->arena);
  }
  if (len == 0 || !(w = wreq_new(h, len))) {
    log_error(KVS_ENOMEM, "session %llu: reply of %zu bytes",
              (unsigned long long)c->id, len);
    return NULL;
  }
  kvs_reply_encode(&rep, w->data);
  w->len = len;
  return w;
}

/* What every Welcome says, the refusals' too. */
static void welcome_init(const sess_hub *h, kvs_welcome *wel) {
  memset(wel, 0, sizeof(*wel));
  wel->version = KVS_PROTO_VERSION;
  wel->max_frame = (uint32_t)h->cfg->max_frame;
  wel->max_batch_ops = h->cfg->max_batch_ops;
}

/* The Welcome wel, framed (seq given); NULL when out of memory. */
static struct wreq *welcome_frame(sess_hub *h, const kvs_welcome *wel,
                                  uint64_t seq) {
  size_t len = kvs_welcome_frame_size(wel, seq);
  struct wreq *w = wreq_new(h, len);

  if (w) {
    kvs_welcome_frame_encode(wel, seq, w->data, len);
    w->len = len;
  }
  return w;
}

/* An error reply, seq given: a Welcome carrying the status before the
 * handshake, a Response after it. */
static void send_error(sess *c, uint64_t seq, int code, const char *what) {
  sess_hub *h = c->hub;
  struct wreq *w = NULL;

  if (c->life >= SESS_CLOSED)
    return;
  if (c->life == SESS_NEW) {
    kvs_welcome wel;

    welcome_init(h, &wel);
    wel.status = code;
    wel.message = what;
    w = welcome_frame(h, &wel, seq);
  } else {
    kvs_call call;

    memset(&call, 0, sizeof(call));
    call.seq = seq;
    call.shape = KVS_SHAPE_OP;
    call.status = code;
    call.message = what;
    w = encode_reply(c, &call);
  }
  if (!w) {
    log_error(KVS_ENOMEM, "session %llu: error reply",
              (unsigned long long)c->id);
    close_now(c);
    return;
  }
  queue_bytes(c, w, 0);
}

/* A protocol error is counted and logged (closing: the session is). */
static void note_protocol_error(sess *c, int close, int code,
                                const char *what) {
  c->hub->counts.protocol_errors++;
  c->ds.env->own.protocol_errors++;
  log_warn(0, "session %llu (pid %d): %s: %s%s", (unsigned long long)c->id,
           (int)c->pid, kvs_status_name(code), what,
           close ? "; closing" : "");
}

/* A protocol error: count it, log it, reply; close when asked. */
static void protocol_error(sess *c, uint64_t seq, int close, int code,
                           const char *what) {
  note_protocol_error(c, close, code, what);
  send_error(c, seq, code, what);
  if (close)
    close_after_writes(c);
}

/* ---- the handshake --------------------------------------------------------- */

static void handle_hello(sess *c, uint64_t seq, const kvs_hello *hello) {
  sess_hub *h = c->hub;
  disp_env *env = c->ds.env;
  const backend_export *ex = &env->pool->ex;
  const kvs_layout *l = &env->layout;
  kvs_welcome wel;
  struct wreq *wr;
  uv_os_fd_t fd;
  ssize_t n;
  int fds[KVS_SHM_MAX_FDS];
  int nfds = ex->nfds;

  if (hello->version != KVS_PROTO_VERSION) {
    char what[96];

    snprintf(what, sizeof(what), "protocol version %u not supported (the "
             "daemon speaks %u)", hello->version, KVS_PROTO_VERSION);
    protocol_error(c, seq, 1, KVS_EVERSION, what);
    return;
  }
  if (env->core == NULL && !hello->no_map) {
    char what[160];

    snprintf(what, sizeof(what), "uid %d belongs to no tenant: it may only "
             "observe, without mapping the pool (kvshare stats, kvshare "
             "top; no_map in the client's options)", (int)c->uid);
    protocol_error(c, seq, 1, KVS_EPERM, what);
    return;
  }
  snprintf(c->name, sizeof(c->name), "%s", hello->client_name);
  /* The name goes into log lines: no control characters (a newline would
   * let a client forge a line of the daemon's log). */
  for (char *p = c->name; *p; p++)
    if ((unsigned char)*p < 0x20 || *p == 0x7f)
      *p = '?';
  welcome_init(h, &wel);
  wel.has_layout = wel.has_pool = 1;
  wel.block_size = l->block_size;
  wel.num_layers = l->num_layers;
  wel.num_kv_heads = l->num_kv_heads;
  wel.head_dim = l->head_dim;
  wel.dtype = l->dtype;
  wel.num_blocks = l->num_blocks;
  wel.block_stride = l->block_stride;
  wel.backend = ex->backend;
  wel.pool_size = ex->size;
  wel.num_fds = (uint32_t)ex->nfds;
  wel.chunk_size = ex->chunk_size;
  wel.gpu_uuid = ex->gpu_uuid;
  wel.session_id = c->id;
  wel.model_id = h->cfg->model_id;
  wel.features = KVS_FEATURE_PACKED_BATCH | KVS_FEATURE_COMPACT;
  wel.tenant = env->tenant;
  if (env->core == NULL) { /* an observer: no descriptor, the whole pool's
                              size */
    nfds = 0;
    wel.num_fds = 0;
    wel.chunk_size = 0;
    wel.pool_size = kvs_pool_bytes(l);
  } else {
    memcpy(fds, ex->fds, (size_t)ex->nfds * sizeof(int));
  }
  if (hello->ring && h->rings != NULL && nfds + 2 <= KVS_SHM_MAX_FDS) {
    int rc = ring_open(h->rings, c, fds + nfds, &wel.ring_bytes, &c->ring);

    if (rc == 0)
      nfds += 2;
    else
      log_warn(rc, "session %llu: no request ring (the session goes on "
               "without one)", (unsigned long long)c->id);
  }
  wr = welcome_frame(h, &wel, seq);
  if (!wr) {
    log_error(KVS_ENOMEM, "session %llu: welcome", (unsigned long long)c->id);
    close_now(c);
    return;
  }
  /* libuv cannot pass fds on a pipe it did not open with ipc: send the
   * Welcome and the fds with one sendmsg on the raw socket.  Nothing else is
   * queued yet (Hello is the first frame), so the order holds. */
  if (uv_fileno((uv_handle_t *)&c->pipe, &fd) < 0 || c->writes != 0) {
    wreq_free(h, wr);
    log_error(0, "session %llu: cannot send the welcome",
              (unsigned long long)c->id);
    close_now(c);
    return;
  }
  n = kvs_send_fds(fd, wr->data, wr->len, fds, nfds);
  ring_handed(c->ring); /* the client's end of the wake channel went (or
                           not) */
  if (n < 0) {
    wreq_free(h, wr);
    log_warn((int)n, "session %llu: sending the welcome",
             (unsigned long long)c->id);
    close_now(c);
    return;
  }
  c->life = SESS_OPEN;
  log_info(0, "session %llu: pid %d uid %d '%s' connected%s%s%s",
           (unsigned long long)c->id, (int)c->pid, (int)c->uid, c->name,
           c->ring ? " (request ring)" : "",
           env->tenant && env->tenant[0] ? ", tenant " : "",
           env->tenant && env->tenant[0] ? env->tenant
           : env->core == NULL ? " (observer)" : "");
  if ((size_t)n < wr->len) /* the fds went with the first byte */
    queue_bytes(c, wr, (size_t)n);
  else
    wreq_free(h, wr);
}

/* ---- requests, and the replies they hold back ----------------------------- */

/* The kind of request a call is, for the latency histogram. */
static int request_kind(const kvs_call *call) {
  switch (call->shape) {
  case KVS_SHAPE_BATCH:
    return METRICS_BATCH;
  case KVS_SHAPE_PACKED:
  case KVS_SHAPE_COMPACT_BATCH:
    return METRICS_PACKED_BATCH;
  default:
    return call->nops ? call->ops[0].code : 0;
  }
}

/* The request's reply is queued: its latency (metrics on). */
static void request_answered(sess *c) {
  if (c->req_t0 && c->hub->metrics)
    metrics_request(c->hub->metrics, c->req_op, uv_hrtime() - c->req_t0);
  c->req_t0 = 0;
}

/* A reply the hold kept back goes (w NULL: none could be made); reading
 * resumes. */
static void send_held(sess *c, struct wreq *w) {
  c->hold = SESS_READY;
  if (c->life == SESS_GONE) { /* the peer went away meanwhile */
    if (w)
      wreq_free(c->hub, w);
    reap(c);
    return;
  }
  if (c->life >= SESS_CLOSED) { /* (on_closed reaps it) */
    if (w)
      wreq_free(c->hub, w);
    return;
  }
  if (!w) {
    close_now(c);
    return;
  }
  queue_bytes(c, w, 0);
  request_answered(c);
  if (c->life >= SESS_CLOSED)
    return;
  if (closing(c)) {
    if (c->writes == 0)
      close_now(c);
    return;
  }
  if (may_resume(c, write_queue(c)))
    start_reading(c);
  resume(c);
}

/* On the loop, when the session's copy job is back. */
static void on_copied(copy_job *j) {
  sess *c = j->data;
  struct wreq *w = c->held;

  c->held = NULL;
  disp_copies_done(&c->ds);
  if (j->status < 0 && c->life < SESS_CLOSED) {
    /* The reply promised copied blocks it does not have: the session's
     * requests cannot be trusted any more.  (Only a failing GPU gets here.) */
    log_error(j->status, "session %llu (pid %d): the daemon's copy failed; "
              "closing the session", (unsigned long long)c->id, (int)c->pid);
    wreq_free(c->hub, w);
    c->hold = SESS_READY;
    close_now(c);
    return;
  }
  send_held(c, w);
}

/* A held op is over: its reply is built (in the hub's arena: no frame is
 * being handled now) and goes. */
static void on_held(disp_sess *ds) {
  sess *c = ds->owner;
  sess_hub *h = c->hub;
  kvs_op op;
  kvs_op_result res;
  kvs_call call;
  struct wreq *w = NULL;

  memset(&op, 0, sizeof(op));
  memset(&call, 0, sizeof(call));
  op.code = (uint8_t)ds->held_code;
  disp_held_result(ds, &res, &h->arena);
  call.seq = c->held_seq;
  call.shape = c->held_shape;
  call.nops = 1;
  call.ops = &op;
  call.res = &res;
  if (c->life < SESS_CLOSED)
    w = encode_reply(c, &call);
  kvs__arena_reset(&h->arena);
  send_held(c, w);
}

/* The held frame's reply stops reading until it goes. */
static void hold(sess *c, sess_hold why) {
  c->hold = why;
  stop_reading(c);
}

/* Sends w now, or, when the frame asked for copies, once they are done. */
static void reply_after_copies(sess *c, struct wreq *w) {
  disp_sess *ds = &c->ds;
  int rc;

  if (ds->ncopy == 0) {
    queue_bytes(c, w, 0);
    return;
  }
  memset(&c->job, 0, sizeof(c->job));
  c->job.kind = COPY_POOL;
  c->job.blocks = ds->copy_pairs;
  c->job.n = ds->ncopy;
  c->job.cb = on_copied;
  c->job.data = c;
  rc = copy_submit(c->ds.env->copy, &c->job);
  if (rc < 0) {
    log_error(rc, "session %llu: the daemon's copy of %u blocks could not "
              "start; closing the session", (unsigned long long)c->id,
              ds->ncopy);
    disp_copies_done(ds);
    wreq_free(c->hub, w);
    close_now(c);
    return;
  }
  c->held = w;
  hold(c, SESS_COPYING);
}

/* Runs a call (its ops and results in the hub's arena) and answers it. */
static void run_call(sess *c, kvs_call *call) {
  sess_hub *h = c->hub;
  const kvs_layout *l = &c->ds.env->layout;
  int mutates;
  size_t bound = kvs_reply_bound(call, l->block_size, l->num_blocks,
                                 &mutates) -
                 KVS_FRAME_HEADER_SIZE;
  struct wreq *w;

  if (h->metrics) {
    c->req_t0 = uv_hrtime();
    c->req_op = request_kind(call);
    if (kvs_shape_is_batch(call->shape) && !call->status)
      metrics_batch(h->metrics, call->nops);
  }
  /* Refused before it runs when its reply might not fit a frame: ops that
   * ran and could not be answered would be lost to the client.  (Stats and
   * Pings run: encode_reply answers ETOOBIG if they do not fit.) */
  if (call->status == 0 && mutates && bound > h->cfg->max_frame)
    kvs_call_refuse(call, &h->arena, KVS_ETOOBIG, "the reply to this "
                    "request could take %zu bytes, over max_frame (%zu); "
                    "none of it ran: split it", bound, h->cfg->max_frame);
  if (call->status == 0 &&
      disp_run(&c->ds, call->ops, call->res, call->nops,
               kvs_shape_is_batch(call->shape), &h->arena) == DISP_HELD) {
    /* its bytes are on the move: on_held answers */
    c->held_seq = call->seq;
    c->held_shape = call->shape;
    hold(c, SESS_WAITING);
    return;
  }
  w = encode_reply(c, call);
  if (!w) {
    disp_copies_done(&c->ds);
    close_now(c);
    return;
  }
  reply_after_copies(c, w);
  if (c->hold == SESS_READY && c->life < SESS_CLOSED)
    request_answered(c);
}

/* A frame refused as a whole (its call's status set): answered in its own
 * shape, the session goes on. */
static void answer_refusal(sess *c, kvs_call *call) {
  struct wreq *w = encode_reply(c, call);

  if (!w) {
    close_now(c);
    return;
  }
  queue_bytes(c, w, 0);
}

/* One frame's payload (len bytes; flags from its header). */
static void handle_frame(sess *c, unsigned flags, const uint8_t *payload,
                         size_t len) {
  sess_hub *h = c->hub;
  uint32_t max_ops = h->cfg->max_batch_ops;
  kvs_env_kind kind;
  kvs_hello hello;
  kvs_call call;
  char what[320];
  int rc;

  h->counts.frames_in++;
  c->ds.env->own.frames_in++;
  if (flags & KVS_FRAME_COMPACT) {
    if (c->life == SESS_NEW) {
      protocol_error(c, 0, 1, KVS_EPROTO, "a compact frame before the "
                     "handshake; expected Hello");
      return;
    }
    h->counts.compact_frames++;
    c->ds.env->own.compact_frames++;
    rc = kvs_compact_decode_request(payload, len, max_ops, &h->arena, &call);
    if (rc == 0) {
      run_call(c, &call);
    } else {
      if (rc == KVS_EPROTO)
        note_protocol_error(c, 0, rc, call.message ? call.message : "");
      answer_refusal(c, &call);
    }
    kvs__arena_reset(&h->arena);
    return;
  }
  kind = kvs_env_decode(payload, len, max_ops, &h->arena, &call, &hello);
  if (kind == KVS_ENV_BAD) {
    /* Answered in the frame's place when its seq could be read: the
     * client's call fails, its session goes on. */
    snprintf(what, sizeof(what), "%s%s", call.message,
             call.status == KVS_EPROTO && c->life == SESS_NEW
                 ? "; expected Hello"
                 : "");
    protocol_error(c, call.seq, c->life == SESS_NEW, call.status, what);
  } else if (c->life == SESS_NEW) {
    if (kind == KVS_ENV_HELLO)
      handle_hello(c, call.seq, &hello);
    else
      protocol_error(c, call.seq, 1, KVS_EPROTO,
                     "the first message must be Hello");
  } else if (kind == KVS_ENV_REQUEST) {
    run_call(c, &call);
  } else if (kind == KVS_ENV_HELLO) {
    protocol_error(c, call.seq, 0, KVS_EPROTO, "Hello after the handshake");
  } else if (kind == KVS_ENV_REPLY) {
    protocol_error(c, call.seq, 0, KVS_EPROTO,
                   "Welcome and Response go from the daemon to clients");
  } else {
    protocol_error(c, call.seq, 0, KVS_EUNKNOWN, "unknown message type");
  }
  kvs__arena_reset(&h->arena);
}

/* ---- the request ring ------------------------------------------------------ */

static int ring_ready(void *owner) {
  const sess *c = owner;

  /* reading: not paused by a held reply, nor by replies piling up unread
   * (a reply too big for the ring queues on the socket) */
  return c->life == SESS_OPEN && c->reading && c->hold == SESS_READY &&
         !c->ring_cur;
}

static void ring_frame(void *owner, const uint8_t *frame, size_t len) {
  sess *c = owner;
  size_t flen = 0;
  int rc;
  char what[128];

  c->ring_cur = 1; /* whatever the answer, it goes through the ring */
  if (frame == NULL) {
    snprintf(what, sizeof(what), "a ring request of %zu bytes, over the "
             "ring's area", len);
    protocol_error(c, 0, 1, KVS_EPROTO, what);
    return;
  }
  rc = kvs_frame_parse(frame, len, (uint32_t)c->hub->cfg->max_frame, &flen);
  if (rc != 1 || flen != len) {
    snprintf(what, sizeof(what), "a ring request of %zu bytes that is not "
             "one whole frame (%s)", len,
             rc < 0 ? kvs_status_name(rc) : "length differs");
    protocol_error(c, 0, 1, rc < 0 ? rc : KVS_EPROTO, what);
    return;
  }
  handle_frame(c, kvs_frame_flags(frame), frame + KVS_FRAME_HEADER_SIZE,
               len - KVS_FRAME_HEADER_SIZE);
  tiers_kick(c->ds.env->tiers);
  /* Back-pressure, as for socket frames: replies too big for the ring
   * queue on the socket; a peer that does not read them is paused (ring
   * and socket) until it does (on_write, then ring_resume). */
  if (c->life < SESS_CLOSED && c->reading &&
      too_much_queued(c, write_queue(c)))
    stop_reading(c);
}

static void ring_gone(void *owner, const char *why) {
  sess *c = owner;

  if (closing(c))
    return;
  log_warn(0, "session %llu (pid %d): %s; closing the session",
           (unsigned long long)c->id, (int)c->pid, why);
  sess_shutdown(c, 1);
}

const ring_owner_ops sess_ring_ops = {ring_ready, ring_frame, ring_gone};

/* ---- reading --------------------------------------------------------------- */

static int reserve(sess *c, size_t need) {
  uint8_t *p;
  size_t cap;

  if (c->rcap >= need)
    return 0;
  cap = c->rcap ? c->rcap : RBUF_MIN;
  while (cap < need)
    cap *= 2;
  p = realloc(c->rbuf, cap);
  if (!p)
    return KVS_ENOMEM;
  c->rbuf = p;
  c->rcap = cap;
  return 0;
}

/* Parses and handles every whole frame buffered. */
static void process_input(sess *c) {
  uint32_t max = (uint32_t)c->hub->cfg->max_frame;
  size_t pos = 0, flen;

  while (!closing(c) && c->hold == SESS_READY && pos < c->rlen) {
    int rc = kvs_frame_parse(c->rbuf + pos, c->rlen - pos, max, &flen);

    if (rc < 0) {
      kvs_frame_header hd;
      char what[128];

      kvs_frame_header_decode(c->rbuf + pos, max, &hd);
      if (rc == KVS_ETOOBIG)
        snprintf(what, sizeof(what), "frame of %u bytes is over the %u-byte "
                 "limit", hd.length, max);
      else if (rc == KVS_EVERSION)
        snprintf(what, sizeof(what), "frame version %u (the daemon speaks %u)",
                 hd.version, KVS_PROTO_VERSION);
      else if (hd.magic != KVS_FRAME_MAGIC)
        snprintf(what, sizeof(what), "bad frame magic 0x%08x", hd.magic);
      else
        snprintf(what, sizeof(what), "unknown frame flags 0x%04x", hd.flags);
      protocol_error(c, 0, 1, rc, what);
      break;
    }
    if (rc == 0) {
      if (reserve(c, flen) < 0) {
        log_error(KVS_ENOMEM, "session %llu: frame of %zu bytes",
                  (unsigned long long)c->id, flen);
        close_now(c);
        return;
      }
      break;
    }
    sockpoll_frame(&c->hub->poll);
    handle_frame(c, kvs_frame_flags(c->rbuf + pos),
                 c->rbuf + pos + KVS_FRAME_HEADER_SIZE,
                 flen - KVS_FRAME_HEADER_SIZE);
    tiers_kick(c->ds.env->tiers);
    pos += flen;
    if (c->life >= SESS_CLOSED)
      return;
    /* Back-pressure: a peer that pipelines without reading its replies. */
    if (c->reading && too_much_queued(c, write_queue(c))) {
      stop_reading(c);
      break;
    }
  }
  if (c->life >= SESS_CLOSED)
    return;
  if (pos) {
    memmove(c->rbuf, c->rbuf + pos, c->rlen - pos);
    c->rlen -= pos;
  }
  /* Give back the room a big frame took. */
  if (c->rcap > 4 * RBUF_MIN && c->rlen <= RBUF_MIN) {
    uint8_t *p = realloc(c->rbuf, RBUF_MIN);

    if (p) {
      c->rbuf = p;
      c->rcap = RBUF_MIN;
    }
  }
}

static void on_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf) {
  sess *c = (sess *)handle;

  (void)suggested;
  if (c->rcap - c->rlen < 4096 && reserve(c, c->rlen + RBUF_MIN) < 0) {
    *buf = uv_buf_init(NULL, 0); /* on_read gets UV_ENOBUFS */
    return;
  }
  *buf = uv_buf_init((char *)c->rbuf + c->rlen, (unsigned)(c->rcap - c->rlen));
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf) {
  sess *c = (sess *)stream;

  (void)buf;
  if (nread < 0) {
    if (nread != UV_EOF)
      log_debug((int)nread, "session %llu: read", (unsigned long long)c->id);
    if (c->rlen)
      log_info(0, "session %llu: peer went away in the middle of a frame "
               "(%zu bytes buffered)", (unsigned long long)c->id, c->rlen);
    close_now(c);
    return;
  }
  if (nread == 0 || closing(c))
    return;
  c->rlen += (size_t)nread;
  c->progress_ms = uv_now(c->hub->loop);
  process_input(c);
  sockpoll_kick(&c->hub->poll); /* (closed once the daemon stops) */
}

/* ---- the hub's side -------------------------------------------------------- */

void sess_sweep(sess_hub *h) {
  uint64_t now = uv_now(h->loop), hello = h->cfg->handshake_timeout_ms,
           frame = h->cfg->frame_timeout_ms;
  sess *c, *next;
  char what[128];

  for (c = h->sessions; c; c = next) {
    next = c->next;
    if (closing(c) || !c->counted)
      continue;
    if (c->life == SESS_NEW) {
      if (!hello || now - c->accepted_ms < hello)
        continue;
      snprintf(what, sizeof(what), "no Hello within %llu ms of connecting",
               (unsigned long long)hello);
      protocol_error(c, 0, 1, KVS_EPROTO, what);
      continue;
    }
    if (!c->reading || c->hold != SESS_READY || c->rlen == 0) {
      /* Not waiting on the peer: the window starts when we are. */
      c->progress_ms = now;
      continue;
    }
    if (!frame || now - c->progress_ms < frame)
      continue;
    snprintf(what, sizeof(what), "%zu bytes of a frame, then nothing for "
             "%llu ms (frame_timeout_ms)", c->rlen,
             (unsigned long long)(now - c->progress_ms));
    protocol_error(c, 0, 1, KVS_EPROTO, what);
  }
}

void sess_accept(sess_hub *h, uv_stream_t *listener) {
  const cfg *cf = h->cfg;
  struct ucred cred;
  socklen_t clen = sizeof(cred);
  uv_os_fd_t fd;
  sess *c;
  int rc;

  c = calloc(1, sizeof(*c));
  if (!c) {
    log_error(KVS_ENOMEM, "accepting a connection");
    return;
  }
  c->hub = h;
  disp_sess_init(&c->ds, h->parts[0], on_held, c);
  uv_pipe_init(h->loop, &c->pipe, 0);
  link_session(h, c);
  rc = uv_accept(listener, (uv_stream_t *)&c->pipe);
  if (rc < 0) {
    log_warn(rc, "accept");
    close_now(c);
    return;
  }
  c->id = ++h->next_session_id;
  c->accepted_ms = uv_now(h->loop);
  if (uv_fileno((uv_handle_t *)&c->pipe, &fd) < 0 ||
      getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0) {
    log_warn(errno, "SO_PEERCRED");
    close_now(c);
    return;
  }
  c->pid = cred.pid;
  c->uid = cred.uid;
  c->gid = cred.gid;
  if (cf->ntenants) {
    /* The peer's tenant, from its credentials only; a peer in none (uid 0,
     * the daemon's own) may only observe. */
    int t = cfg_tenant_of(cf, cred.uid, cred.gid);

    c->ds.env = t >= 0 && (uint32_t)t < h->nparts ? h->parts[t]
                                                  : h->observer;
  }
  if (!cfg_peer_allowed(cf, cred.uid, cred.gid, h->self_uid)) {
    char what[128];

    snprintf(what, sizeof(what), "uid %d gid %d is not allowed to connect",
             (int)cred.uid, (int)cred.gid);
    protocol_error(c, 0, 1, KVS_EPERM, what);
    return;
  }
  if (h->counts.sessions >= cf->max_connections) {
    char what[128];

    snprintf(what, sizeof(what), "too many connections (max_connections %u)",
             cf->max_connections);
    protocol_error(c, 0, 1, KVS_ELIMIT, what);
    return;
  }
  if (cf->ntenants && c->ds.env->core != NULL) {
    uint32_t lim = cf->max_tenant_connections;

    if (!lim)
      lim = cf->max_connections / cf->ntenants ? cf->max_connections /
                                                     cf->ntenants
                                               : 1;
    if (c->ds.env->own.sessions >= lim) {
      char what[160];

      snprintf(what, sizeof(what), "too many connections of tenant %s "
               "(max_tenant_connections %u)", c->ds.env->tenant, lim);
      protocol_error(c, 0, 1, KVS_ELIMIT, what);
      return;
    }
  }
  c->counted = 1;
  h->counts.sessions++;
  c->ds.env->own.sessions++;
  start_reading(c);
  if (!c->reading) {
    log_warn(0, "session %llu: cannot read", (unsigned long long)c->id);
    close_now(c);
    return;
  }
  log_debug(0, "session %llu: accepted pid %d uid %d",
            (unsigned long long)c->id, (int)c->pid, (int)c->uid);
}
