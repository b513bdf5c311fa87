/*
 * server.h — the I/O layer of kvshared: the loop, the listener, sessions and
 * the dispatch of requests to the core.  Internal to the daemon's files.
 *
 *   serve.c     srv_   start-up, listening socket, accept, signals, shutdown
 *   session.c   sess_  one connection: peer check, frames in and out,
 *                      handshake, close (frees every request of the session)
 *   dispatch.c  disp_  one Request -> core calls -> one Response
 *   reqmap.c    reqmap_  a session's request ids
 *   backend*.c  backend_ the memory behind the pool (one backend per file)
 *   copy.c      copy_  the copy engine: block copies the daemon makes
 *   tiers.c     tiers_ the tiers below the pool (tier_host.c, tier_disk.c)
 *   remote_moves.c rmoves_ the remote tier below them (tier_remote.c)
 *   ring.c      ring_  request rings beside the sockets (shm/kvs_ring.h)
 *   packed.c    disp_  PackedBatch: ops in fixed-width records
 *   compact.c   compact_ compact frames: one call in fixed-width fields
 *
 * Everything runs on the one loop thread; nothing here blocks on I/O.
 */
#ifndef KVS_DAEMON_SERVER_H
#define KVS_DAEMON_SERVER_H

#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "daemon/pool/backend.h"
#include "daemon/config.h"
#include "daemon/pool/copy.h"
#include "daemon/core/core.h"
#include "daemon/dispatch/reqmap.h"
#include "daemon/tiers/tiers.h"
#include "kvs_arena.h"
#include "kvs_compact.h"
#include "kvs_frame.h"


typedef struct srv srv;
typedef struct sess sess;
struct wreq;
struct metrics;
struct events;
struct rings;
struct sring;

struct srv {
  uv_loop_t *loop;
  uv_pipe_t listener;
  uv_signal_t sig_term, sig_int;
  uv_timer_t drain_timer;
  uv_timer_t sweep_timer; /* closes connections that never say Hello or
                             stall mid-frame */
  const cfg *cfg;
  kvs_layout layout;
  core *core;
  backend *pool;
  copy_engine copy;
  tiers *tiers;          /* NULL: no tier below the pool */
  struct rmoves *remote; /* the remote tier (remote_moves.c); NULL: none */
  struct metrics *metrics; /* /metrics (metrics.c); NULL: off */
  struct events *events;   /* the KV event stream (events.c); NULL: off */
  struct rings *rings;     /* request rings (ring.c); NULL: off */
  uid_t self_uid;
  int null_fd;           /* /dev/null, for releasing ready_fd; or -1 */
  sess *sessions;        /* every open connection (doubly linked) */
  uint32_t nsessions;    /* accepted ones (rejected ones not counted) */
  uint64_t next_session_id;
  int stopping;
  int socket_passed;     /* the listener came from systemd: never unlinked */
  kvs__arena arena;      /* the frame being handled: request and reply */
  struct wreq *wspare;   /* small reply buffers kept for reuse (session.c) */
  uint32_t nwspare;
  uint64_t check_frame;  /* frames_in when Stats{check} last ran */
  uint64_t queued;       /* reply bytes in uv_write requests, all sessions */
  /* counters for Stats */
  uint64_t frames_in;
  uint64_t compact_frames; /* of frames_in */
  uint64_t protocol_errors;
};

struct sess {
  uv_pipe_t pipe; /* first: the handle's address is the session's */
  srv *srv;
  sess *prev, *next;
  uint64_t id;
  pid_t pid;
  uid_t uid;
  gid_t gid;
  int counted;    /* counts against max_connections */
  uint64_t accepted_ms; /* uv_now at accept */
  uint64_t progress_ms; /* uv_now at the last bytes read, or when the
                           daemon last stopped waiting on them */
  int handshaken; /* Welcome sent */
  int closing;    /* no more input is processed */
  int closed;     /* uv_close called */
  int reading;
  char name[64];  /* Hello.client_name, for the log */
  uint8_t *rbuf;  /* bytes received, not yet parsed */
  size_t rlen, rcap;
  size_t writes;  /* uv_write requests in flight */
  reqmap reqs;
  uint64_t tokens_held; /* sum of the costs in reqs (max_session_tokens) */
  /* Copies the daemon makes for this session (Allocate/Append with
   * daemon_copy): the (src, dst) pairs the frame being handled asked for,
   * each block pinned in the core; then one job.  While it runs the frame's
   * reply waits in held and no further frame is read, so replies stay in
   * order.  The struct outlives its closed handle until the job is back. */
  uint32_t *copy_pairs;
  uint32_t ncopy, copy_cap; /* pairs */
  copy_job job;
  struct wreq *held;
  int copying;    /* job in flight (or a promotion: promoting) */
  int reaped;     /* the handle closed while copying: free on completion */
  /* A Lookup bringing blocks up from the tiers: its reply is built when
   * they are in (sess_promoted); meanwhile, as for copies, no further
   * frame is read.  in_batch: the frame being handled is a Batch (its
   * lookups do not promote). */
  tier_promo promo;
  int promoting;
  /* A SwapOut or SwapIn moving a request's blocks: its reply waits the
   * same way (sess_swapped). */
  tier_swap swap;
  int swapping;
  int in_batch;
  /* With metrics on: when the request being answered was taken up
   * (uv_hrtime; 0: none pending) and its op, for the latency histogram. */
  uint64_t req_t0;
  int req_op;
  /* The session's request ring (ring.c); NULL: none.  ring_cur: the frame
   * being answered came through it, so its reply goes back through it. */
  struct sring *ring;
  int ring_cur;
  /* The frame being answered is a compact one (compact.c) of this kind
   * (KVS_COMPACT_*, or COMPACT_REFUSAL when it did not add up), so its
   * reply is compact too; 0: an Envelope.  Set
   * for each frame; a held reply (copies, promotion, swap) keeps it, since
   * no frame is read meanwhile. */
  uint8_t compact;
};

/* session.c: one frame taken from the session's ring (a copy, len bytes,
 * header included), handled as a socket frame; its reply goes back through
 * the ring. */
void sess_ring_frame(sess *c, const uint8_t *frame, size_t len);
/* May the session's ring be read now?  (Not while a reply is held back or
 * the session is closing.) */
int sess_ring_ready(const sess *c);

/* ring.c */
int ring_start(srv *s);       /* 0 also when rings are off */
void ring_stop(srv *s);       /* closes its handles (the loop finishes) */
/* A ring for c: fds[0..1] = the ring's memfd and the client's end of its
 * wake channel (owned by the ring: send them with the Welcome, then
 * ring_handed closes the daemon's copy of the client's end). */
int ring_open(sess *c, int fds[2], uint32_t *area);
void ring_handed(sess *c);
/* c is gone: its ring goes (its wake handle closes, then it is freed). */
void ring_free(sess *c);      /* idempotent */
/* c may be read again (its held reply sent, its replies read): a request
 * posted meanwhile is taken now. */
void ring_resume(sess *c);
/* Answers c's ring request with the framed reply: 0 when it went through
 * the ring; 1 when it does not fit (the ring says so: send it on the
 * socket). */
int ring_reply(sess *c, const uint8_t *frame, size_t len);
/* Since start: requests taken from rings, replies that did not fit one,
 * wake-ups of the daemon (all 0 when rings are off). */
void ring_counts(const srv *s, uint64_t *requests, uint64_t *socket_replies,
                 uint64_t *wakeups);
/* For the log line of c's close: what went through its ring. */
void ring_describe(const sess *c, char *buf, size_t len);

/* serve.c: every tier below the pool, top first, the remote tier last. */
#define SRV_TIERS (CORE_TIERS + 1)
void srv_tiers_stats(const srv *s, tiers_stats st[SRV_TIERS], uint32_t *n);

/* session.c */
/* Accepts one connection from the listener (checks the peer, the limit). */
void sess_accept(srv *s);
/* Frees every request of the session now; the connection closes once
 * queued replies are written (or at once when force). */
void sess_shutdown(sess *c, int force);

/* Closes (after an EPROTO reply) every session that has not sent its
 * Hello within handshake_timeout_ms of its accept, and every one stalled
 * in the middle of a frame for frame_timeout_ms. */
void sess_sweep(srv *s);

/* The promotion of c->promo is over: sends the Lookup's reply. */
void sess_promoted(tier_promo *pr);
/* The swap of c->swap is over: sends its reply. */
void sess_swapped(tier_swap *sw);

/* Frees the reply buffers kept for reuse (at shutdown). */
void sess_spares_free(srv *s);

/* Queue one envelope for writing.  0, or a negative status (the session is
 * then being closed). */
int sess_send(sess *c, const Kvshare__Envelope *env);



/* reply.c */
/* What lives while one frame is handled — the decoded request
 * (kvs__arena_unpack) and the reply's messages and arrays — comes from the
 * session's kvs__arena (proto/kvs_arena.h), reset after each frame. */

/*
 * The framed size of Envelope { seq, response } (header included), with
 * the size of each message computed once: protobuf-c's own packer computes
 * the size of a nested message again at every level above it, which for a
 * Batch reply cost more than the packing.  disp_reply_encode then writes
 * exactly those bytes (as kvs_frame_pack_into would) into out.
 */
typedef struct disp_reply {
  uint64_t seq;
  const Kvshare__Response *resp;
  size_t *sizes;  /* a Batch's replies' sizes (arena), or NULL */
  size_t resp_size, batch_size, payload;
} disp_reply;
size_t disp_reply_size(disp_reply *r, kvs__arena *a, uint64_t seq,
                       const Kvshare__Response *resp);
void disp_reply_encode(const disp_reply *r, uint8_t *out);
/* In a Batch, only the first this many failing ops carry their message;
 * the others carry their code alone, so the reply stays within
 * disp_reply_bound. */
#define DISP_BATCH_MESSAGES 16u
/* A Batch's op i has its Response r: past the DISP_BATCH_MESSAGES'th
 * failure (counted in *failed), its status keeps its code alone.  Batch and
 * PackedBatch both call it after each op. */
void disp_batch_trim(Kvshare__Response *r, size_t *failed);
/* The most the reply to req can take, framed, before it runs; *mutates:
 * whether any of its ops changes anything. */
size_t disp_reply_bound(const sess *c, const Kvshare__Request *req,
                        int *mutates);

/* dispatch.c */

/* resp is OK (a shared, empty Status). */
void disp_ok(Kvshare__Response *resp);
/* packed.c: a PackedBatch, each op run through disp_request. */
void disp_packed_batch(sess *c, const Kvshare__PackedBatch *pb,
                       Kvshare__Response *resp, kvs__arena *a);
/* The message behind a packed op's Request. */
typedef union disp_packed_msg {
  Kvshare__Lookup lookup;
  Kvshare__Allocate allocate;
  Kvshare__Append append;
  Kvshare__Commit commit;
  Kvshare__Fork fork;
  Kvshare__Free free;
  Kvshare__Preempt preempt;
} disp_packed_msg;
/* The Request op record o (the i'th) stands for, in *req and *m, its arrays
 * pointing into data (words u32 words); NULL, with resp's status set, when
 * the record is bad (an op that cannot be packed, arrays outside data). */
const Kvshare__Request *disp_packed_op(const kvs_pop *o, size_t i,
                                       const uint32_t *data, size_t words,
                                       Kvshare__Request *req,
                                       disp_packed_msg *m,
                                       Kvshare__Response *resp,
                                       kvs__arena *a);
/* The result record (KVS_PACKED_RESULT_SIZE bytes at rec) of an op's
 * Response; its blocks are copied to data + *nd, and *nd advances. */
void disp_pack_result(const Kvshare__Response *r, uint8_t *rec,
                      uint32_t *data, uint32_t *nd);

/* compact.c: compact frames (proto/kvs_compact.h).  Pure: no I/O. */
typedef struct compact_in {
  uint64_t seq;   /* 0 until read */
  uint8_t kind;   /* KVS_COMPACT_*; 0 until read */
  Kvshare__Request req;
  union {
    disp_packed_msg op;
    Kvshare__PackedBatch pb;
    Kvshare__Ping ping;
  } m;
} compact_in;
/* The kind a compact frame that does not add up is answered as: the
 * frame's status and message alone (kvs_compact.h). */
#define COMPACT_REFUSAL 0xffu
/* Reads the compact request at payload (len bytes) into *in, its arrays
 * pointing into the payload (which must stay put until the request is
 * handled), or copied into a where they are not 4-byte aligned.
 * 0: in->req is to be run.  Else a negative status, and resp's status says
 * why (in->seq is set when it could be read; in->kind only once the frame
 * adds up, else 0: answer it as COMPACT_REFUSAL). */
int compact_parse(const sess *c, const uint8_t *payload, size_t len,
                  compact_in *in, Kvshare__Response *resp, kvs__arena *a);
/* The framed size of the compact reply of a kind-`kind` request, and its
 * bytes (len: what compact_reply_size said; at out, which must be 4-byte
 * aligned). */
size_t compact_reply_size(uint8_t kind, const Kvshare__Response *resp);
void compact_reply_encode(uint8_t kind, uint64_t seq,
                          const Kvshare__Response *resp, uint8_t *out,
                          size_t len);

/* Fills resp (already initialised) for one request of session c. */
void disp_request(sess *c, const Kvshare__Request *req,
                  Kvshare__Response *resp, kvs__arena *a);
/* The frame being handled asks the daemon to copy block src into dst before
 * its reply goes: both are pinned in the core and recorded in c->copy_pairs
 * (session.c then runs them as one job).  0, or a negative status (nothing
 * pinned: the worker must copy itself). */
int disp_copy_pair(sess *c, uint32_t src, uint32_t dst);
/* The recorded copies are done (or abandoned): unpins them all. */
void disp_copies_done(sess *c);

/* The reply of c->promo's Lookup, once its blocks are up. */
void disp_lookup_promoted(sess *c, Kvshare__Response *resp, kvs__arena *a);
/* The reply of c->swap's SwapOut or SwapIn, once its blocks moved. */
void disp_swap_done(sess *c, Kvshare__Response *resp, kvs__arena *a);

/* Sets resp->status to (code, message). */
void disp_status(Kvshare__Response *resp, kvs__arena *a, int code,
                 const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* serve.c */
/* Called by session.c when a session is gone (its handle closed and its
 * copies back): finishes a shutdown once nothing is left. */
void srv_session_closed(srv *s);

#endif
