/*
 * session.c — one connection = one session.
 *
 * Life: accept -> SO_PEERCRED check and the connection limit (a refused peer
 * gets an error Welcome, then the close) -> frames in, parsed incrementally
 * from a per-session buffer -> Hello answered by a Welcome sent with the pool
 * fds in one sendmsg -> Requests answered in order -> close.  On close (EOF,
 * reset, kill -9 of the peer, a protocol error, or shutdown) every request
 * of the session is freed at once.
 *
 * Errors in a frame header (magic, version, flags, length over the limit)
 * leave the stream impossible to resynchronise: the peer gets one error
 * reply and the connection closes.  A well-framed payload that does not
 * decode gets an EPROTO Response (ELIMIT when decoding it would take more
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
#include "daemon/observe/metrics.h"
#include "daemon/net/server.h"
#include "kvs_packed.h"
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

/* Should a session with q bytes queued stop being read?  And may a paused
 * one be read again? */
static int too_much_queued(const sess *c, size_t q) {
  return q > WRITE_QUEUE_MAX ||
         (c->srv->queued > c->srv->cfg->max_queued_bytes &&
          q > WRITE_QUEUE_PRESSED);
}

static int may_resume(const sess *c, size_t q) {
  return q < WRITE_QUEUE_MAX / 2 &&
         (c->srv->queued <= c->srv->cfg->max_queued_bytes / 2 ||
          q < WRITE_QUEUE_PRESSED / 2);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf);
static void process_input(sess *c);

static void link_session(srv *s, sess *c) {
  c->next = s->sessions;
  c->prev = NULL;
  if (s->sessions)
    s->sessions->prev = c;
  s->sessions = c;
}

static void unlink_session(srv *s, sess *c) {
  if (c->prev)
    c->prev->next = c->next;
  else
    s->sessions = c->next;
  if (c->next)
    c->next->prev = c->prev;
  c->prev = c->next = NULL;
}

static void free_one(core_req *r, void *arg) { core_req_free(arg, r); }

/* Frees every request of the session (idempotent). */
static void free_requests(sess *c) {
  if (c->reqs.count)
    log_debug(0, "session %llu: freeing %zu requests",
              (unsigned long long)c->id, c->reqs.count);
  if (c->promoting)
    c->promo.r = NULL; /* freed below; the promotion ends without it */
  if (c->swapping)
    c->swap.r = NULL;
  reqmap_drain(&c->reqs, free_one, c->srv->core);
  c->tokens_held = 0;
}

/* The last of the session: its handle is closed and no copy of its is in
 * flight. */
static void reap(sess *c) {
  srv *s = c->srv;

  reqmap_destroy(&c->reqs);
  ring_free(c);
  free(c->copy_pairs);
  free(c->rbuf);
  free(c);
  srv_session_closed(s);
}

static void on_closed(uv_handle_t *h) {
  sess *c = (sess *)h;

  if (c->copying) { /* the job points at c: on_copied reaps it */
    c->reaped = 1;
    return;
  }
  reap(c);
}

static void close_now(sess *c) {
  srv *s = c->srv;

  if (c->closed)
    return;
  c->closed = 1;
  c->closing = 1;
  free_requests(c);
  unlink_session(s, c);
  if (c->counted) {
    char ring[96] = "";

    if (c->ring != NULL) {
      ring[0] = ';';
      ring[1] = ' ';
      ring_describe(c, ring + 2, sizeof(ring) - 2);
    }
    s->nsessions--;
    log_info(0, "session %llu closed (pid %d%s%s%s)", (unsigned long long)c->id,
             (int)c->pid, c->name[0] ? ", " : "", c->name, ring);
  }
  uv_close((uv_handle_t *)&c->pipe, on_closed);
}

void sess_shutdown(sess *c, int force) {
  c->closing = 1;
  free_requests(c);
  if (c->reading) {
    uv_read_stop((uv_stream_t *)&c->pipe);
    c->reading = 0;
  }
  /* (A copy in flight holds a reply: on_copied sends it, then closes.) */
  if (force || (c->writes == 0 && !c->copying))
    close_now(c);
  /* else on_write closes it when the last reply is out */
}

/* Closes after the replies queued so far are written. */
static void close_after_writes(sess *c) { sess_shutdown(c, 0); }

struct wreq {
  uv_write_t req;
  sess *c;
  size_t len;
  size_t queued; /* bytes of it counted in srv->queued */
  size_t cap;    /* bytes of data */
  struct wreq *next_spare;
  uint8_t data[];
};

/* Small reply buffers are kept for reuse (a malloc and a free per reply
 * were a tenth of a small call's work in the daemon). */
#define WREQ_SMALL 1024u
#define WREQ_SPARES 16u

static struct wreq *wreq_new(srv *s, size_t len) {
  struct wreq *w;

  if (len <= WREQ_SMALL && s->wspare) {
    w = s->wspare;
    s->wspare = w->next_spare;
    s->nwspare--;
    return w;
  }
  w = malloc(sizeof(*w) + (len < WREQ_SMALL ? WREQ_SMALL : len));
  if (w)
    w->cap = len < WREQ_SMALL ? WREQ_SMALL : len;
  return w;
}

static void wreq_free(srv *s, struct wreq *w) {
  if (w->cap == WREQ_SMALL && s->nwspare < WREQ_SPARES) {
    w->next_spare = s->wspare;
    s->wspare = w;
    s->nwspare++;
    return;
  }
  free(w);
}

void sess_spares_free(srv *s) {
  while (s->wspare) {
    struct wreq *w = s->wspare;

    s->wspare = w->next_spare;
    free(w);
  }
  s->nwspare = 0;
}

static void on_write(uv_write_t *req, int status) {
  struct wreq *w = (struct wreq *)req;
  sess *c = w->c;

  c->srv->queued -= w->queued;
  wreq_free(c->srv, w);
  c->writes--;
  if (c->closed)
    return;
  if (status < 0) {
    log_debug(status, "session %llu: write", (unsigned long long)c->id);
    close_now(c);
    return;
  }
  if (c->closing) {
    if (c->writes == 0)
      close_now(c);
    return;
  }
  /* A peer that had stopped reading its replies is reading again. */
  if (!c->reading && !c->copying &&
      may_resume(c, uv_stream_get_write_queue_size((uv_stream_t *)&c->pipe))) {
    if (uv_read_start((uv_stream_t *)&c->pipe, on_alloc, on_read) == 0)
      c->reading = 1;
    process_input(c);
    if (!c->closed)
      ring_resume(c);
  }
}

/* Sends bytes[off, len) of an already framed reply: at once when nothing
 * is queued before it and the socket takes it all (no uv_write_t, no
 * callback), else the rest is queued. */
static int queue_bytes(sess *c, struct wreq *w, size_t off) {
  uv_buf_t b;
  int rc;

  if (c->ring_cur) { /* the reply to a frame that came through the ring */
    c->ring_cur = 0;
    if (ring_reply(c, w->data + off, w->len - off) == 0) {
      wreq_free(c->srv, w);
      return 0;
    }
    /* too big for the ring, which now says so: on the socket */
  }
  if (c->writes == 0) {
    b = uv_buf_init((char *)w->data + off, (unsigned)(w->len - off));
    rc = uv_try_write((uv_stream_t *)&c->pipe, &b, 1);
    if (rc >= 0 && (size_t)rc == w->len - off) {
      wreq_free(c->srv, w);
      return 0;
    }
    if (rc >= 0) {
      off += (size_t)rc;
    } else if (rc != UV_EAGAIN) {
      wreq_free(c->srv, w);
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
    wreq_free(c->srv, w);
    log_debug(rc, "session %llu: write", (unsigned long long)c->id);
    close_now(c);
    return rc;
  }
  c->srv->queued += w->queued;
  c->writes++;
  return 0;
}

static struct wreq *frame(sess *c, const Kvshare__Envelope *env) {
  size_t len = kvs_frame_size(env);
  struct wreq *w = wreq_new(c->srv, len);
  long n;

  if (!w)
    return NULL;
  /* Our own replies may exceed the peer's max_frame only if the peer sent a
   * huge batch; the client limit is the same default. */
  n = kvs_frame_pack_into(env, UINT32_MAX, w->data, len);
  if (n < 0) {
    wreq_free(c->srv, w);
    return NULL;
  }
  w->len = (size_t)n;
  return w;
}

int sess_send(sess *c, const Kvshare__Envelope *env) {
  struct wreq *w;

  if (c->closed)
    return KVS_ECLOSED;
  w = frame(c, env);
  if (!w) {
    log_error(KVS_ENOMEM, "session %llu: reply of %zu bytes",
              (unsigned long long)c->id, kvs_frame_size(env));
    close_now(c);
    return KVS_ENOMEM;
  }
  return queue_bytes(c, w, 0);
}

/* An error Welcome (before the handshake) or Response (after), seq given,
 * framed; NULL when out of memory. */
static struct wreq *error_frame(sess *c, uint64_t seq, int code,
                                const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static struct wreq *error_frame(sess *c, uint64_t seq, int code,
                                const char *fmt, ...) {
  Kvshare__Envelope env;
  Kvshare__Welcome w;
  Kvshare__Response r;
  Kvshare__Status st;
  char msg[256];
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  kvshare__envelope__init(&env);
  kvshare__status__init(&st);
  st.code = code;
  st.message = msg;
  env.seq = seq;
  if (!c->handshaken) {
    kvshare__welcome__init(&w);
    w.status = &st;
    w.version = KVS_PROTO_VERSION;
    w.max_frame = (uint32_t)c->srv->cfg->max_frame;
    w.max_batch_ops = c->srv->cfg->max_batch_ops;
    env.body_case = KVSHARE__ENVELOPE__BODY_WELCOME;
    env.welcome = &w;
  } else {
    kvshare__response__init(&r);
    r.status = &st;
    env.body_case = KVSHARE__ENVELOPE__BODY_RESPONSE;
    env.response = &r;
  }
  return frame(c, &env);
}

/* Queues an error reply (see error_frame). */
static void send_error(sess *c, uint64_t seq, int code, const char *what) {
  struct wreq *w;

  if (c->closed)
    return;
  w = error_frame(c, seq, code, "%s", what);
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
  c->srv->protocol_errors++;
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

static void handle_hello(sess *c, uint64_t seq, const Kvshare__Hello *h) {
  srv *s = c->srv;
  Kvshare__Envelope env;
  Kvshare__Welcome w;
  Kvshare__Status st;
  Kvshare__Layout lay;
  Kvshare__PoolExport pe;
  const backend_export *ex = &s->pool->ex;
  struct wreq *wr;
  uv_os_fd_t fd;
  ssize_t n;
  int fds[KVS_SHM_MAX_FDS];
  int nfds = ex->nfds;

  if (h->version != KVS_PROTO_VERSION) {
    char what[96];

    snprintf(what, sizeof(what), "protocol version %u not supported (the "
             "daemon speaks %u)", h->version, KVS_PROTO_VERSION);
    protocol_error(c, seq, 1, KVS_EVERSION, what);
    return;
  }
  snprintf(c->name, sizeof(c->name), "%s", h->client_name ? h->client_name : "");
  /* The name goes into log lines: no control characters (a newline would
   * let a client forge a line of the daemon's log). */
  for (char *p = c->name; *p; p++)
    if ((unsigned char)*p < 0x20 || *p == 0x7f)
      *p = '?';
  kvshare__envelope__init(&env);
  kvshare__welcome__init(&w);
  kvshare__status__init(&st);
  kvshare__layout__init(&lay);
  kvshare__pool_export__init(&pe);
  lay.block_size = s->layout.block_size;
  lay.num_layers = s->layout.num_layers;
  lay.num_kv_heads = s->layout.num_kv_heads;
  lay.head_dim = s->layout.head_dim;
  lay.dtype = s->layout.dtype;
  lay.num_blocks = s->layout.num_blocks;
  lay.block_stride = s->layout.block_stride;
  pe.backend = (char *)ex->backend;
  pe.size = ex->size;
  pe.num_fds = (uint32_t)ex->nfds;
  pe.chunk_size = ex->chunk_size;
  pe.gpu_uuid = (char *)ex->gpu_uuid;
  w.status = &st;
  w.version = KVS_PROTO_VERSION;
  w.layout = &lay;
  w.pool = &pe;
  w.session_id = c->id;
  w.model_id = (char *)s->cfg->model_id;
  w.max_frame = (uint32_t)s->cfg->max_frame;
  w.max_batch_ops = s->cfg->max_batch_ops;
  w.features = KVS_FEATURE_PACKED_BATCH | KVS_FEATURE_COMPACT;
  memcpy(fds, ex->fds, (size_t)ex->nfds * sizeof(int));
  if (h->ring && s->rings != NULL && nfds + 2 <= KVS_SHM_MAX_FDS) {
    int rc = ring_open(c, fds + nfds, &w.ring_bytes);

    if (rc == 0)
      nfds += 2;
    else
      log_warn(rc, "session %llu: no request ring (the session goes on "
               "without one)", (unsigned long long)c->id);
  }
  env.seq = seq;
  env.body_case = KVSHARE__ENVELOPE__BODY_WELCOME;
  env.welcome = &w;

  wr = frame(c, &env);
  if (!wr) {
    log_error(KVS_ENOMEM, "session %llu: welcome", (unsigned long long)c->id);
    close_now(c);
    return;
  }
  /* libuv cannot pass fds on a pipe it did not open with ipc: send the
   * Welcome and the fds with one sendmsg on the raw socket.  Nothing else is
   * queued yet (Hello is the first frame), so the order holds. */
  if (uv_fileno((uv_handle_t *)&c->pipe, &fd) < 0 || c->writes != 0) {
    free(wr);
    log_error(0, "session %llu: cannot send the welcome",
              (unsigned long long)c->id);
    close_now(c);
    return;
  }
  n = kvs_send_fds(fd, wr->data, wr->len, fds, nfds);
  ring_handed(c); /* the client's end of the wake channel went (or not) */
  if (n < 0) {
    free(wr);
    log_warn((int)n, "session %llu: sending the welcome",
             (unsigned long long)c->id);
    close_now(c);
    return;
  }
  c->handshaken = 1;
  log_info(0, "session %llu: pid %d uid %d '%s' connected%s",
           (unsigned long long)c->id, (int)c->pid, (int)c->uid, c->name,
           c->ring ? " (request ring)" : "");
  if ((size_t)n < wr->len) /* the fds went with the first byte */
    queue_bytes(c, wr, (size_t)n);
  else
    free(wr);
}

/* ---- the daemon's copies for a session ------------------------------------ */

/* The request's reply is queued: its latency (metrics on). */
static void request_answered(sess *c) {
  if (c->req_t0 && c->srv->metrics)
    metrics_request(c->srv->metrics, c->req_op, uv_hrtime() - c->req_t0);
  c->req_t0 = 0;
}

/* The reply a copy or a promotion held back goes; reading resumes. */
static void send_held(sess *c, struct wreq *w) {
  queue_bytes(c, w, 0);
  request_answered(c);
  if (c->closed)
    return;
  if (c->closing) {
    if (c->writes == 0)
      close_now(c);
    return;
  }
  if (!c->reading &&
      may_resume(c, uv_stream_get_write_queue_size((uv_stream_t *)&c->pipe)) &&
      uv_read_start((uv_stream_t *)&c->pipe, on_alloc, on_read) == 0)
    c->reading = 1;
  process_input(c);
  if (!c->closed)
    ring_resume(c);
}

/* On the loop, when the session's copy job is back. */
static void on_copied(copy_job *j) {
  sess *c = j->data;
  struct wreq *w = c->held;

  c->held = NULL;
  c->copying = 0;
  disp_copies_done(c);
  if (c->closed) { /* the peer went away meanwhile */
    wreq_free(c->srv, w);
    if (c->reaped)
      reap(c);
    return;
  }
  if (j->status < 0) {
    /* The reply promised copied blocks it does not have: the session's
     * requests cannot be trusted any more.  (Only a failing GPU gets here.) */
    log_error(j->status, "session %llu (pid %d): the daemon's copy failed; "
              "closing the session", (unsigned long long)c->id, (int)c->pid);
    wreq_free(c->srv, w);
    close_now(c);
    return;
  }
  send_held(c, w);
}

/* The framed reply resp (in the server's arena) to frame seq: ETOOBIG in
 * its place when it is over max_frame.  Compact when the frame was
 * (c->compact).  NULL (logged) when out of memory. */
static struct wreq *encode_reply(sess *c, uint64_t seq,
                                 const Kvshare__Response *resp) {
  disp_reply r;
  struct wreq *w;
  size_t len = c->compact
                   ? compact_reply_size(c->compact, resp)
                   : disp_reply_size(&r, &c->srv->arena, seq, resp);

  if (len - KVS_FRAME_HEADER_SIZE > c->srv->cfg->max_frame) {
    /* The ops ran; only their results are too big to send back. */
    if (c->compact) {
      Kvshare__Response e;

      kvshare__response__init(&e);
      disp_status(&e, &c->srv->arena, KVS_ETOOBIG, "the reply (%zu bytes) "
                  "is over max_frame; split the batch", len);
      return encode_reply(c, seq, &e);
    }
    w = error_frame(c, seq, KVS_ETOOBIG, "the reply (%zu bytes) is over "
                    "max_frame; split the batch", len);
  } else if ((w = wreq_new(c->srv, len))) {
    if (c->compact)
      compact_reply_encode(c->compact, seq, resp, w->data, len);
    else
      disp_reply_encode(&r, w->data);
    w->len = len;
  }
  if (!w)
    log_error(KVS_ENOMEM, "session %llu: reply of %zu bytes",
              (unsigned long long)c->id, len);
  return w;
}

/* A copy or a promotion holds the frame's reply back: the frames after it
 * wait, so replies stay in order. */
static void hold_input(sess *c) {
  c->copying = 1;
  if (c->reading) {
    uv_read_stop((uv_stream_t *)&c->pipe);
    c->reading = 0;
  }
}

/* A held reply (a promotion's, a swap's) is ready: build() writes it. */
static void send_async_reply(sess *c, uint64_t seq,
                             void (*build)(sess *, Kvshare__Response *,
                                           kvs__arena *)) {
  kvs__arena *a = &c->srv->arena;
  Kvshare__Response resp;
  struct wreq *w;

  c->copying = 0;
  if (c->closed) {
    if (c->reaped)
      reap(c);
    return;
  }
  /* (No frame is being handled now: the server's arena is free.) */
  kvshare__response__init(&resp);
  build(c, &resp, a);
  w = encode_reply(c, seq, &resp);
  kvs__arena_reset(a);
  if (!w) {
    close_now(c);
    return;
  }
  send_held(c, w);
}

/* On the loop, when the Lookup's blocks are up (or failed). */
void sess_promoted(tier_promo *pr) {
  sess *c = pr->data;

  c->promoting = 0;
  send_async_reply(c, pr->seq, disp_lookup_promoted);
}

/* On the loop, when a SwapOut's or SwapIn's blocks have moved. */
void sess_swapped(tier_swap *sw) {
  sess *c = sw->data;

  c->swapping = 0;
  send_async_reply(c, sw->seq, disp_swap_done);
}

/* Sends w now, or, when the frame asked for copies, once they are done. */
static void reply_after_copies(sess *c, struct wreq *w) {
  int rc;

  if (c->ncopy == 0) {
    queue_bytes(c, w, 0);
    return;
  }
  memset(&c->job, 0, sizeof(c->job));
  c->job.kind = COPY_POOL;
  c->job.blocks = c->copy_pairs;
  c->job.n = c->ncopy;
  c->job.cb = on_copied;
  c->job.data = c;
  rc = copy_submit(&c->srv->copy, &c->job);
  if (rc < 0) {
    log_error(rc, "session %llu: the daemon's copy of %u blocks could not "
              "start; closing the session", (unsigned long long)c->id,
              c->ncopy);
    disp_copies_done(c);
    wreq_free(c->srv, w);
    close_now(c);
    return;
  }
  c->held = w;
  hold_input(c);
}

/* The reply lives in the server's arena (reset by handle_frame). */
static void handle_request(sess *c, uint64_t seq, const Kvshare__Request *req) {
  kvs__arena *a = &c->srv->arena;
  int mutates;
  size_t bound =
      disp_reply_bound(c, req, &mutates) - KVS_FRAME_HEADER_SIZE;
  Kvshare__Response resp;
  struct wreq *w;

  if (c->srv->metrics) {
    c->req_t0 = uv_hrtime();
    c->req_op = (int)req->op_case;
    if (req->op_case == KVSHARE__REQUEST__OP_BATCH)
      metrics_batch(c->srv->metrics, req->batch->n_ops);
    else if (req->op_case == KVSHARE__REQUEST__OP_PACKED_BATCH)
      metrics_batch(c->srv->metrics,
                    req->packed_batch->ops.len / KVS_PACKED_OP_SIZE);
  }
  kvshare__response__init(&resp);
  /* Refused before it runs when its reply might not fit a frame: ops that
   * ran and could not be answered would be lost to the client.  (Stats and
   * Pings run: encode_reply answers ETOOBIG if they do not fit.) */
  if (mutates && bound > c->srv->cfg->max_frame)
    disp_status(&resp, a, KVS_ETOOBIG, "the reply to this request could "
                "take %zu bytes, over max_frame (%zu); none of it ran: split "
                "it", bound, c->srv->cfg->max_frame);
  else
    disp_request(c, req, &resp, a);
  if (c->promoting || c->swapping) { /* its blocks are on the move:
                                         sess_promoted, sess_swapped */
    c->promo.seq = c->swap.seq = seq;
    hold_input(c);
    return;
  }
  w = encode_reply(c, seq, &resp);
  if (!w) {
    disp_copies_done(c);
    close_now(c);
    return;
  }
  reply_after_copies(c, w);
  if (!c->copying && !c->closed) /* (closed: the copies could not start) */
    request_answered(c);
}

/* A compact frame (compact.c): the Request it stands for runs as any
 * other; a frame that does not add up is answered (compactly) and the
 * session goes on. */
static void handle_compact(sess *c, const uint8_t *payload, size_t len) {
  srv *s = c->srv;
  Kvshare__Response resp;
  struct wreq *w;
  compact_in in;
  int rc;

  kvshare__response__init(&resp);
  rc = compact_parse(c, payload, len, &in, &resp, &s->arena);
  c->compact = in.kind ? in.kind : COMPACT_REFUSAL;
  if (rc == 0) {
    handle_request(c, in.seq, &in.req);
    return;
  }
  if (rc == KVS_EPROTO)
    note_protocol_error(c, 0, rc, resp.status && resp.status->message
                                      ? resp.status->message
                                      : "");
  w = encode_reply(c, in.seq, &resp);
  if (!w) {
    close_now(c);
    return;
  }
  queue_bytes(c, w, 0);
}

/* One frame's payload (len bytes; flags from its header). */
static void handle_frame(sess *c, unsigned flags, const uint8_t *payload,
                         size_t len) {
  srv *s = c->srv;
  size_t limit = KVS_UNPACK_LIMIT(len, s->cfg->max_batch_ops);
  kvs_payload_scan scan;
  Kvshare__Envelope *env;
  int rc;

  s->frames_in++;
  c->compact = 0;
  if (flags & KVS_FRAME_COMPACT) {
    if (!c->handshaken) {
      protocol_error(c, 0, 1, KVS_EPROTO, "a compact frame before the "
                     "handshake; expected Hello");
      return;
    }
    s->compact_frames++;
    handle_compact(c, payload, len);
    kvs__arena_reset(&s->arena);
    return;
  }
  /* The envelope and the reply live in s->arena until the reset below. */
  rc = kvs__arena_unpack(&s->arena, payload, len, limit, &scan, &env);
  if (rc < 0) {
    char what[200];

    kvs__arena_reset(&s->arena);
    /* Answered in the frame's place when its seq could be read: the
     * client's call fails, its session goes on. */
    if (rc == KVS_ELIMIT)
      snprintf(what, sizeof(what), "decoding this %zu-byte message would "
               "take %zu bytes, over the %zu allowed for it (max_batch_ops "
               "%u)", len, scan.alloc_bound, limit, s->cfg->max_batch_ops);
    else
      snprintf(what, sizeof(what), "undecodable message%s",
               c->handshaken ? "" : "; expected Hello");
    protocol_error(c, scan.seq, !c->handshaken, rc, what);
    return;
  }
  if (!c->handshaken) {
    if (env->body_case == KVSHARE__ENVELOPE__BODY_HELLO)
      handle_hello(c, env->seq, env->hello);
    else
      protocol_error(c, env->seq, 1, KVS_EPROTO,
                     "the first message must be Hello");
    kvs__arena_reset(&s->arena);
    return;
  }
  switch (env->body_case) {
  case KVSHARE__ENVELOPE__BODY_REQUEST:
    handle_request(c, env->seq, env->request);
    break;
  case KVSHARE__ENVELOPE__BODY_HELLO:
    protocol_error(c, env->seq, 0, KVS_EPROTO, "Hello after the handshake");
    break;
  case KVSHARE__ENVELOPE__BODY_WELCOME:
  case KVSHARE__ENVELOPE__BODY_RESPONSE:
    protocol_error(c, env->seq, 0, KVS_EPROTO,
                   "Welcome and Response go from the daemon to clients");
    break;
  default:
    protocol_error(c, env->seq, 0, KVS_EUNKNOWN, "unknown message type");
    break;
  }
  kvs__arena_reset(&s->arena);
}

int sess_ring_ready(const sess *c) {
  /* reading: not paused by a held reply, nor by replies piling up unread
   * (a reply too big for the ring queues on the socket) */
  return c->handshaken && c->reading && !c->closing && !c->copying &&
         !c->promoting && !c->swapping && !c->ring_cur;
}

void sess_ring_frame(sess *c, const uint8_t *frame, size_t len) {
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
  rc = kvs_frame_parse(frame, len, (uint32_t)c->srv->cfg->max_frame, &flen);
  if (rc != 1 || flen != len) {
    snprintf(what, sizeof(what), "a ring request of %zu bytes that is not "
             "one whole frame (%s)", len,
             rc < 0 ? kvs_status_name(rc) : "length differs");
    protocol_error(c, 0, 1, rc < 0 ? rc : KVS_EPROTO, what);
    return;
  }
  handle_frame(c, kvs_frame_flags(frame), frame + KVS_FRAME_HEADER_SIZE,
               len - KVS_FRAME_HEADER_SIZE);
  tiers_kick(c->srv->tiers);
  /* Back-pressure, as for socket frames: replies too big for the ring
   * queue on the socket; a peer that does not read them is paused (ring
   * and socket) until it does (on_write, then ring_resume). */
  if (!c->closed && c->reading &&
      too_much_queued(c, uv_stream_get_write_queue_size(
                             (uv_stream_t *)&c->pipe))) {
    uv_read_stop((uv_stream_t *)&c->pipe);
    c->reading = 0;
  }
}

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
  uint32_t max = (uint32_t)c->srv->cfg->max_frame;
  size_t pos = 0, flen;

  while (!c->closing && !c->copying && pos < c->rlen) {
    int rc = kvs_frame_parse(c->rbuf + pos, c->rlen - pos, max, &flen);

    if (rc < 0) {
      kvs_frame_header h;
      char what[128];

      kvs_frame_header_decode(c->rbuf + pos, max, &h);
      if (rc == KVS_ETOOBIG)
        snprintf(what, sizeof(what), "frame of %u bytes is over the %u-byte "
                 "limit", h.length, max);
      else if (rc == KVS_EVERSION)
        snprintf(what, sizeof(what), "frame version %u (the daemon speaks %u)",
                 h.version, KVS_PROTO_VERSION);
      else if (h.magic != KVS_FRAME_MAGIC)
        snprintf(what, sizeof(what), "bad frame magic 0x%08x", h.magic);
      else
        snprintf(what, sizeof(what), "unknown frame flags 0x%04x", h.flags);
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
    handle_frame(c, kvs_frame_flags(c->rbuf + pos),
                 c->rbuf + pos + KVS_FRAME_HEADER_SIZE,
                 flen - KVS_FRAME_HEADER_SIZE);
    tiers_kick(c->srv->tiers);
    pos += flen;
    if (c->closed)
      return;
    /* Back-pressure: a peer that pipelines without reading its replies. */
    if (c->reading && too_much_queued(c, uv_stream_get_write_queue_size(
                                             (uv_stream_t *)&c->pipe))) {
      uv_read_stop((uv_stream_t *)&c->pipe);
      c->reading = 0;
      break;
    }
  }
  if (c->closed)
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

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  sess *c = (sess *)h;

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
  if (nread == 0 || c->closing)
    return;
  c->rlen += (size_t)nread;
  c->progress_ms = uv_now(c->srv->loop);
  process_input(c);
}

void sess_sweep(srv *s) {
  uint64_t now = uv_now(s->loop), hello = s->cfg->handshake_timeout_ms,
           frame = s->cfg->frame_timeout_ms;
  sess *c, *next;
  char what[128];

  for (c = s->sessions; c; c = next) {
    next = c->next;
    if (c->closing || !c->counted)
      continue;
    if (!c->handshaken) {
      if (!hello || now - c->accepted_ms < hello)
        continue;
      snprintf(what, sizeof(what), "no Hello within %llu ms of connecting",
               (unsigned long long)hello);
      protocol_error(c, 0, 1, KVS_EPROTO, what);
      continue;
    }
    if (!c->reading || c->copying || c->rlen == 0) {
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

void sess_accept(srv *s) {
  const cfg *cf = s->cfg;
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
  c->srv = s;
  reqmap_init(&c->reqs);
  uv_pipe_init(s->loop, &c->pipe, 0);
  link_session(s, c);
  rc = uv_accept((uv_stream_t *)&s->listener, (uv_stream_t *)&c->pipe);
  if (rc < 0) {
    log_warn(rc, "accept");
    close_now(c);
    return;
  }
  c->id = ++s->next_session_id;
  c->accepted_ms = uv_now(s->loop);
  if (uv_fileno((uv_handle_t *)&c->pipe, &fd) < 0 ||
      getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0) {
    log_warn(errno, "SO_PEERCRED");
    close_now(c);
    return;
  }
  c->pid = cred.pid;
  c->uid = cred.uid;
  c->gid = cred.gid;
  if (!cfg_peer_allowed(cf, cred.uid, cred.gid, s->self_uid)) {
    char what[128];

    snprintf(what, sizeof(what), "uid %d gid %d is not allowed to connect",
             (int)cred.uid, (int)cred.gid);
    protocol_error(c, 0, 1, KVS_EPERM, what);
    return;
  }
  if (s->nsessions >= cf->max_connections) {
    char what[128];

    snprintf(what, sizeof(what), "too many connections (max_connections %u)",
             cf->max_connections);
    protocol_error(c, 0, 1, KVS_ELIMIT, what);
    return;
  }
  c->counted = 1;
  s->nsessions++;
  rc = uv_read_start((uv_stream_t *)&c->pipe, on_alloc, on_read);
  if (rc < 0) {
    log_warn(rc, "session %llu: read", (unsigned long long)c->id);
    close_now(c);
    return;
  }
  c->reading = 1;
  log_debug(0, "session %llu: accepted pid %d uid %d",
            (unsigned long long)c->id, (int)c->pid, (int)c->uid);
}
