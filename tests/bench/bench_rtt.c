/*
 * bench_rtt — the daemon's round trip against a raw Unix-socket ping-pong.
 *
 * Starts a kvshared (in a temporary directory, as the integration tests do)
 * and, in the same run, an echo process on a Unix socket pair that reads a
 * request of N bytes and writes a reply of M bytes, N and M being the exact
 * frame sizes of the daemon op it is compared with.  Measurements are
 * interleaved (raw, daemon, raw, daemon, ...) and the median round trip of
 * each is reported, with their ratio:
 *   - ping: one Ping (16-byte payload) through kvshared
 *   - append: one Append of 1 token (a real core operation)
 *   - batched steps of 256 ops: a prefill step (64 requests x lookup /
 *     allocate / commit / free) and a decode step (128 requests x append /
 *     commit); block-ops per second and the ratio of the step's round trip
 *     to the small raw ping-pong and to a raw ping-pong of the same bytes.
 *   - the same through the request ring, and over the socket with both
 *     sides polling instead of sleeping (socket_poll_us,
 *     KVS_SOCKET_SPIN_US).
 * With 2 or more CPUs the small ops are measured twice, with the client and
 * the servers pinned to different cores and to the same core; the batched
 * steps run on different cores.  KVS_BENCH_QUICK=1 runs fewer rounds.
 */
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <uv.h>

#include "daemon/core/core.h"
#include "kvs_compact.h"
#include "kvs_frame.h"
#include "tests/integration/itest.h"

static itest_daemon d;
static int quick;
/* CPU placement: the client on client_cpu, the servers (kvshared and the
 * echo processes) on server_cpu; -1: not pinned. */
static int client_cpu = -1, server_cpu = -1;

static void pin(pid_t pid, int cpu) {
  if (cpu < 0)
    return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  sched_setaffinity(pid, sizeof set, &set);
}

static void unpin(pid_t pid) {
  cpu_set_t set;
  CPU_ZERO(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  for (long i = 0; i < n && i < CPU_SETSIZE; i++)
    CPU_SET(i, &set);
  sched_setaffinity(pid, sizeof set, &set);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ---- the raw ping-pong --------------------------------------------------- */

typedef struct raw {
  int fd;
  pid_t pid;
  size_t req, resp;
  uint8_t *buf;
} raw;

static int read_full(int fd, uint8_t *p, size_t n) {
  while (n) {
    ssize_t r = read(fd, p, n);
    if (r <= 0)
      return -1;
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

static int write_full(int fd, const uint8_t *p, size_t n) {
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w <= 0)
      return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* A raw echo process for requests of req bytes and replies of resp: in the
 * child, returns its end of the socket pair (the caller serves it, then
 * exits); in the parent, -1 (r->fd is its end). */
static int raw_spawn(raw *r, size_t req, size_t resp) {
  int sv[2];
  CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  r->req = req;
  r->resp = resp;
  r->buf = calloc(1, req > resp ? req : resp);
  CHECK(r->buf);
  fflush(NULL);
  r->pid = fork();
  CHECK(r->pid >= 0);
  if (r->pid == 0) {
    /* Keep only its end: other echo processes' sockets (inherited) must
     * not stay open here. */
    for (int fd = 3; fd < 1024; fd++)
      if (fd != sv[1])
        close(fd);
    pin(0, server_cpu);
    return sv[1];
  }
  close(sv[1]);
  r->fd = sv[0];
  return -1;
}

static void raw_start(raw *r, size_t req, size_t resp) {
  int fd = raw_spawn(r, req, resp);

  if (fd < 0)
    return;
  /* The echo side does what a server minimally must: read the request,
   * write the reply. */
  while (read_full(fd, r->buf, req) == 0)
    if (write_full(fd, r->buf, resp))
      break;
  _exit(0);
}

/* The same echo on a libuv loop (uv_read_start, uv_try_write), as kvshared
 * reads and answers: what the loop alone costs over a blocking server. */
struct uvecho {
  uv_pipe_t pipe;
  size_t req, resp, have;
  uint8_t *in, *out;
};

static void uvecho_alloc(uv_handle_t *h, size_t sz, uv_buf_t *b) {
  struct uvecho *e = h->data;

  (void)sz;
  *b = uv_buf_init((char *)e->in + e->have, (unsigned)(e->req - e->have));
}

static void uvecho_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b) {
  struct uvecho *e = s->data;

  (void)b;
  if (n < 0) {
    uv_close((uv_handle_t *)s, NULL);
    return;
  }
  e->have += (size_t)n;
  if (e->have == e->req) {
    uv_buf_t o = uv_buf_init((char *)e->out, (unsigned)e->resp);

    e->have = 0;
    if (uv_try_write(s, &o, 1) != (int)e->resp)
      uv_close((uv_handle_t *)s, NULL);
  }
}

static void raw_start_uv(raw *r, size_t req, size_t resp) {
  int fd = raw_spawn(r, req, resp);
  uv_loop_t loop;
  struct uvecho e = {.req = req, .resp = resp};

  if (fd < 0)
    return;
  e.in = calloc(1, req);
  e.out = calloc(1, resp);
  if (!e.in || !e.out || uv_loop_init(&loop) ||
      uv_pipe_init(&loop, &e.pipe, 0) || uv_pipe_open(&e.pipe, fd))
    _exit(1);
  e.pipe.data = &e;
  uv_read_start((uv_stream_t *)&e.pipe, uvecho_alloc, uvecho_read);
  uv_run(&loop, UV_RUN_DEFAULT);
  _exit(0);
}

static double raw_rtt(raw *r) {
  double t0 = itest_now();
  CHECK(write_full(r->fd, r->buf, r->req) == 0);
  CHECK(read_full(r->fd, r->buf, r->resp) == 0);
  return (itest_now() - t0) * 1e6;
}

static void raw_stop(raw *r) {
  close(r->fd);
  itest_wait(r->pid);
  free(r->buf);
}

/* Frame sizes of a request and its reply. */
static size_t req_size(Kvshare__Request *rq) {
  Kvshare__Envelope e = KVSHARE__ENVELOPE__INIT;
  e.seq = 100000;
  e.body_case = KVSHARE__ENVELOPE__BODY_REQUEST;
  e.request = rq;
  return kvs_frame_size(&e);
}

static size_t resp_size(Kvshare__Response *rs) {
  Kvshare__Envelope e = KVSHARE__ENVELOPE__INIT;
  e.seq = 100000;
  e.body_case = KVSHARE__ENVELOPE__BODY_RESPONSE;
  e.response = rs;
  return kvs_frame_size(&e);
}

/* ---- a minimal protocol server ---------------------------------------------
 * A blocking process that speaks just enough of the protocol for Ping:
 * Welcome (no pool), then for each frame: decode, answer a Pong, encode.  It
 * separates the cost of the protocol (framing and protobuf on both ends,
 * libkvshare's call path) from the daemon's own (event loop, dispatch). */

typedef struct mini {
  pid_t pid;
  kvs_client *c;
  char path[108];
} mini;

static void mini_serve(int fd) {
  uint8_t *buf = malloc(1 << 16), *out = malloc(1 << 16);
  size_t have = 0;
  for (;;) {
    /* One read per request, as the raw echo does (frames are small). */
    size_t flen = 0;
    int pr;
    while ((pr = kvs_frame_parse(buf, have, 1 << 15, &flen)) == 0) {
      ssize_t r = read(fd, buf + have, (1 << 16) - have);
      if (r <= 0)
        goto out;
      have += (size_t)r;
    }
    if (pr < 0)
      break;
    kvs_frame_header h;
    kvs_frame_header_decode(buf, 1 << 15, &h);
    Kvshare__Envelope *in;
    if (kvs_envelope_unpack(buf + KVS_FRAME_HEADER_SIZE, h.length, 0, &in))
      break;
    Kvshare__Envelope env = KVSHARE__ENVELOPE__INIT;
    Kvshare__Welcome w = KVSHARE__WELCOME__INIT;
    Kvshare__Layout l = KVSHARE__LAYOUT__INIT;
    Kvshare__PoolExport pe = KVSHARE__POOL_EXPORT__INIT;
    Kvshare__Status st = KVSHARE__STATUS__INIT;
    Kvshare__Response r = KVSHARE__RESPONSE__INIT;
    env.seq = in->seq;
    if (in->body_case == KVSHARE__ENVELOPE__BODY_HELLO) {
      kvs_layout lay = {16, 1, 1, 8, KVS_DTYPE_FP32, 1, 0};
      kvs_layout_finish(&lay);
      l.block_size = lay.block_size;
      l.num_layers = lay.num_layers;
      l.num_kv_heads = lay.num_kv_heads;
      l.head_dim = lay.head_dim;
      l.dtype = lay.dtype;
      l.num_blocks = lay.num_blocks;
      l.block_stride = lay.block_stride;
      pe.backend = "host";
      pe.size = kvs_pool_bytes(&lay);
      w.status = &st;
      w.version = KVS_PROTO_VERSION;
      w.layout = &l;
      w.pool = &pe;
      env.body_case = KVSHARE__ENVELOPE__BODY_WELCOME;
      env.welcome = &w;
    } else {
      r.status = &st;
      if (in->body_case == KVSHARE__ENVELOPE__BODY_REQUEST && in->request &&
          in->request->op_case == KVSHARE__REQUEST__OP_PING) {
        r.result_case = KVSHARE__RESPONSE__RESULT_PONG;
        r.pong = in->request->ping->payload;
      }
      env.body_case = KVSHARE__ENVELOPE__BODY_RESPONSE;
      env.response = &r;
    }
    long n = kvs_frame_pack_into(&env, 1 << 16, out, 1 << 16);
    kvs_envelope_free(in);
    if (n < 0 || write_full(fd, out, (size_t)n))
      break;
    memmove(buf, buf + flen, have - flen);
    have -= flen;
  }
out:
  free(buf);
  free(out);
}

static void mini_start(mini *m) {
  CHECK(strlen(d.dir) + 10 < sizeof m->path);
  memcpy(m->path, d.dir, strlen(d.dir));
  memcpy(m->path + strlen(d.dir), "/mini.sock", 11);
  int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  CHECK(lfd >= 0);
  struct sockaddr_un sa = {0};
  sa.sun_family = AF_UNIX;
  memcpy(sa.sun_path, m->path, sizeof m->path);
  CHECK(bind(lfd, (struct sockaddr *)&sa, sizeof sa) == 0);
  CHECK(listen(lfd, 1) == 0);
  fflush(NULL);
  m->pid = fork();
  CHECK(m->pid >= 0);
  if (m->pid == 0) {
    pin(0, server_cpu);
    int fd = accept(lfd, NULL, NULL);
    for (int i = 3; i < 1024; i++)
      if (i != fd)
        close(i);
    if (fd >= 0)
      mini_serve(fd);
    _exit(0);
  }
  close(lfd);
  kvs_connect_opts o = {"bench-mini", 30000, 1};
  kvs_client *c = NULL;
  CHECK(kvs_connect(m->path, &o, &c) == 0);
  m->c = c;
}

static void mini_stop(mini *m) {
  kvs_close(m->c);
  itest_wait(m->pid);
  unlink(m->path);
}

/* Microseconds the daemon's side of the protocol takes for one step, in
 * process: decode the request with proto/'s bounded decoder (protobuf-c,
 * one allocation per field), free it, encode the reply. */
static double codec_us(Kvshare__Request *rq, Kvshare__Response *rs) {
  Kvshare__Envelope a = KVSHARE__ENVELOPE__INIT, b = KVSHARE__ENVELOPE__INIT;
  a.seq = b.seq = 100000;
  a.body_case = KVSHARE__ENVELOPE__BODY_REQUEST;
  a.request = rq;
  b.body_case = KVSHARE__ENVELOPE__BODY_RESPONSE;
  b.response = rs;
  size_t na = kvs_frame_size(&a), nb = kvs_frame_size(&b);
  uint8_t *ba = malloc(na), *bb = malloc(nb);
  CHECK(kvs_frame_pack_into(&a, UINT32_MAX, ba, na) == (long)na);
  int reps = quick ? 50 : 300;
  double t0 = itest_now();
  for (int i = 0; i < reps; i++) {
    Kvshare__Envelope *x;
    CHECK(kvs_envelope_unpack(ba + KVS_FRAME_HEADER_SIZE,
                              na - KVS_FRAME_HEADER_SIZE, 0, &x) == 0);
    kvs_envelope_free(x);
    CHECK(kvs_frame_pack_into(&b, UINT32_MAX, bb, nb) == (long)nb);
  }
  double us = (itest_now() - t0) * 1e6 / reps;
  free(ba);
  free(bb);
  return us;
}

/* ---- the measurements ---------------------------------------------------- */

typedef struct series {
  double *v;
  int n, cap;
} series;

static void add(series *s, double x) {
  if (s->n == s->cap) {
    s->cap = s->cap ? 2 * s->cap : 1024;
    s->v = realloc(s->v, (size_t)s->cap * sizeof *s->v);
    CHECK(s->v);
  }
  s->v[s->n++] = x;
}

static const char payload16[16] = "0123456789abcdef";

/* compact: c sends compact frames (kvs_compact.h), and the raw baseline
 * moves their sizes; else Envelopes'. */
static void bench_small(kvs_client *c, const char *mode, double *raw_small,
                        int compact) {
  /* Exact frame sizes of Ping(16 B) and Append(1). */
  Kvshare__Ping p = KVSHARE__PING__INIT;
  p.payload.data = (uint8_t *)payload16;
  p.payload.len = 16;
  Kvshare__Request rq = KVSHARE__REQUEST__INIT;
  rq.op_case = KVSHARE__REQUEST__OP_PING;
  rq.ping = &p;
  Kvshare__Status ok = KVSHARE__STATUS__INIT;
  Kvshare__Response rs = KVSHARE__RESPONSE__INIT;
  rs.status = &ok;
  rs.result_case = KVSHARE__RESPONSE__RESULT_PONG;
  rs.pong = p.payload;
  size_t ping_req = req_size(&rq), ping_resp = resp_size(&rs);

  Kvshare__Append ap = KVSHARE__APPEND__INIT;
  ap.req_id = 1;
  ap.num_tokens = 1;
  rq.op_case = KVSHARE__REQUEST__OP_APPEND;
  rq.append = &ap;
  Kvshare__AllocResult ar = KVSHARE__ALLOC_RESULT__INIT;
  ar.first_index = 100;
  rs.result_case = KVSHARE__RESPONSE__RESULT_ALLOC;
  rs.alloc = &ar;
  size_t app_req = req_size(&rq), app_resp = resp_size(&rs);
  if (compact) { /* header, compact header, then the bytes or the record */
    ping_req = ping_resp = KVS_FRAME_HEADER_SIZE + KVS_COMPACT_HDR + 16;
    app_req = KVS_FRAME_HEADER_SIZE + KVS_COMPACT_HDR + KVS_PACKED_OP_SIZE;
    app_resp = KVS_FRAME_HEADER_SIZE + KVS_COMPACT_HDR + KVS_PACKED_RESULT_SIZE;
  }

  raw rp, ra, ru;
  raw_start(&rp, ping_req, ping_resp);
  raw_start(&ra, app_req, app_resp);
  raw_start_uv(&ru, ping_req, ping_resp);
  series sraw_p = {0}, sd_p = {0}, sraw_a = {0}, sd_a = {0}, sm_p = {0},
         su_p = {0};
  mini m;
  mini_start(&m);
  uint32_t bs = kvs_layout_of(c)->block_size;
  uint32_t tok[4] = {1, 2, 3, 4};
  int rounds = quick ? 4 : 20, per = quick ? 500 : 2000;
  uint64_t req = 1;
  CHECK_OK(c, kvs_lookup(c, req, tok, 4, NULL, 0, NULL));
  uint32_t appended = 0;
  /* Warm up. */
  for (int i = 0; i < 200; i++) {
    raw_rtt(&rp);
    CHECK_OK(c, kvs_ping(c, payload16, 16));
  }
  for (int r = 0; r < rounds; r++) {
    for (int i = 0; i < per; i++)
      add(&sraw_p, raw_rtt(&rp));
    for (int i = 0; i < per; i++)
      add(&su_p, raw_rtt(&ru));
    for (int i = 0; i < per; i++) {
      double t0 = itest_now();
      CHECK_OK(c, kvs_ping(c, payload16, 16));
      add(&sd_p, (itest_now() - t0) * 1e6);
    }
    for (int i = 0; i < per; i++) {
      double t0 = itest_now();
      CHECK_OK(m.c, kvs_ping(m.c, payload16, 16));
      add(&sm_p, (itest_now() - t0) * 1e6);
    }
    for (int i = 0; i < per; i++)
      add(&sraw_a, raw_rtt(&ra));
    for (int i = 0; i < per; i++) {
      if (appended == 64 * bs) { /* keep the request small */
        CHECK_OK(c, kvs_free(c, req));
        CHECK_OK(c, kvs_lookup(c, ++req, tok, 4, NULL, 0, NULL));
        appended = 0;
      }
      double t0 = itest_now();
      CHECK_OK(c, kvs_append(c, req, 1, NULL));
      add(&sd_a, (itest_now() - t0) * 1e6);
      appended++;
    }
  }
  CHECK_OK(c, kvs_free(c, req));
  raw_stop(&rp);
  raw_stop(&ra);
  raw_stop(&ru);
  mini_stop(&m);
  double mmp = median(sm_p.v, sm_p.n), mup = median(su_p.v, su_p.n);
  double mrp = median(sraw_p.v, sraw_p.n), mdp = median(sd_p.v, sd_p.n);
  double mra = median(sraw_a.v, sraw_a.n), mda = median(sd_a.v, sd_a.n);
  printf("small op, %s, median round trip over %d samples each "
         "(interleaved):\n",
         mode, sd_p.n);
  printf("  raw unix-socket ping-pong %3zu B / %3zu B   %7.2f us\n", ping_req,
         ping_resp, mrp);
  printf("  the same bytes echoed by a libuv loop    %7.2f us   ratio %.2fx "
         "(what the loop costs)\n",
         mup, mup / mrp);
  printf("  Ping(16 B) to a minimal blocking server %7.2f us   ratio %.2fx "
         "(Envelopes, decoded and encoded by protobuf-c)\n",
         mmp, mmp / mrp);
  printf("  Ping(16 B) through kvshared             %7.2f us   ratio %.2fx "
         "(target <= 1.25x)\n",
         mdp, mdp / mrp);
  printf("  raw unix-socket ping-pong %3zu B / %3zu B   %7.2f us\n", app_req,
         app_resp, mra);
  printf("  Append(1 token) through kvshared        %7.2f us   ratio %.2fx "
         "(target <= 1.25x)\n",
         mda, mda / mra);
  *raw_small = mrp;
  free(sraw_p.v);
  free(sd_p.v);
  free(sraw_a.v);
  free(sd_a.v);
  free(sm_p.v);
  free(su_p.v);
}

/* A prefill step: NREQ x (lookup, allocate, commit, free) = 4 NREQ ops. */
#define PREFILL_REQS 64
#define DECODE_REQS 128

/* The framed sizes of a PackedBatch of nops records and words data words,
 * and of its reply with nblocks block ids. */
static void packed_sizes(size_t nops, size_t words, size_t nblocks,
                         size_t *req, size_t *resp) {
  uint8_t *buf = calloc(1, nops * 40 + (words + nblocks) * 4 + 1);
  Kvshare__PackedBatch pb = KVSHARE__PACKED_BATCH__INIT;
  Kvshare__Request top = KVSHARE__REQUEST__INIT;
  Kvshare__PackedBatchResult pr = KVSHARE__PACKED_BATCH_RESULT__INIT;
  Kvshare__Response tr = KVSHARE__RESPONSE__INIT;
  Kvshare__Status st = KVSHARE__STATUS__INIT;

  CHECK(buf);
  pb.ops.data = pb.data.data = pr.results.data = pr.data.data = buf;
  pb.ops.len = nops * 40;
  pb.data.len = words * 4;
  top.op_case = KVSHARE__REQUEST__OP_PACKED_BATCH;
  top.packed_batch = &pb;
  pr.results.len = nops * 32;
  pr.data.len = nblocks * 4;
  tr.status = &st;
  tr.result_case = KVSHARE__RESPONSE__RESULT_PACKED_BATCH;
  tr.packed_batch = &pr;
  *req = req_size(&top);
  *resp = resp_size(&tr);
  free(buf);
}

/* Said after the batched steps' title (which daemon). */
static const char *batch_label = "";

/* One prefill step into b: PREFILL_REQS requests from id on, each a
 * lookup of the 2-block system prompt (token ids 7...) and a turn of its
 * own (ids from first + 64 r), then allocate, commit, free. */
static void prefill_batch(kvs_batch *b, uint32_t *tok, uint32_t plen,
                          uint32_t bs, uint32_t first, uint64_t id) {
  kvs_batch_reset(b);
  for (int r = 0; r < PREFILL_REQS; r++) {
    uint32_t *t = tok + (size_t)r * plen;
    for (uint32_t i = 0; i < plen; i++)
      t[i] = i < 2 * bs ? 7 + i : first + (uint32_t)r * 64 + i;
    kvs_batch_lookup(b, id + (uint64_t)r, t, plen, NULL, 0);
    kvs_batch_allocate(b, id + (uint64_t)r, plen - 2 * bs);
    kvs_batch_commit(b, id + (uint64_t)r, 2 * bs, NULL, plen - 2 * bs, NULL,
                     0);
    kvs_batch_free_req(b, id + (uint64_t)r);
  }
}

static void bench_batch(kvs_client *c, double raw_small, int packed) {
  uint32_t bs = kvs_layout_of(c)->block_size;
  uint32_t plen = 2 * bs + 5; /* 2 shared system blocks + the user's turn */
  uint32_t *tok = malloc((size_t)PREFILL_REQS * plen * sizeof *tok);
  kvs_batch *b;
  CHECK_OK(c, kvs_batch_new(&b));
  series sp = {0}, sdec = {0}, sraw = {0}, sraw2 = {0};
  int steps = quick ? 100 : 400;
  uint64_t id = 1000;
  size_t preq = 0, presp = 0, dreq = 0, dresp = 0;
  double pcodec = 0, dcodec = 0;
  uint64_t blocks_touched = 0;

  /* The shared system prompt is cached first. */
  for (uint32_t i = 0; i < plen; i++)
    tok[i] = i < 2 * bs ? 7 + i : 99 + i;
  CHECK_OK(c, kvs_lookup(c, 1, tok, plen, NULL, 0, NULL));
  CHECK_OK(c, kvs_allocate(c, 1, plen, NULL));
  CHECK_OK(c, kvs_commit(c, 1, 0, NULL, plen, NULL, 0, NULL));
  CHECK_OK(c, kvs_free(c, 1));

  /* Prefill steps. */
  for (int s = 0; s < steps; s++) {
    prefill_batch(b, tok, plen, bs, 100000 + (uint32_t)s * PREFILL_REQS * 64,
                  id);
    double t0 = itest_now();
    CHECK_OK(c, kvs_batch_submit(c, b));
    add(&sp, (itest_now() - t0) * 1e6);
    for (uint32_t i = 0; i < kvs_batch_count(b); i++)
      CHECK(kvs_batch_status(b, i) == 0);
    kvs_lookup_result lr;
    CHECK_OK(c, kvs_batch_lookup_result(b, 4, &lr));
    CHECK(lr.hit_tokens == 2 * bs);
    blocks_touched += (uint64_t)PREFILL_REQS * (2 + 1 + 1);
    id += PREFILL_REQS;
  }
  {
    /* Exact sizes: pack what the last submit sent.  The reply size is
     * estimated from the same op list (statuses + results). */
    Kvshare__Request **ops = calloc(4 * PREFILL_REQS, sizeof *ops);
    Kvshare__Request *rq = calloc(4 * PREFILL_REQS, sizeof *rq);
    Kvshare__Lookup *lk = calloc(PREFILL_REQS, sizeof *lk);
    Kvshare__Allocate *al = calloc(PREFILL_REQS, sizeof *al);
    Kvshare__Commit *cm = calloc(PREFILL_REQS, sizeof *cm);
    Kvshare__Free *fr = calloc(PREFILL_REQS, sizeof *fr);
    Kvshare__Response **rps = calloc(4 * PREFILL_REQS, sizeof *rps);
    Kvshare__Response *rp = calloc(4 * PREFILL_REQS, sizeof *rp);
    Kvshare__LookupResult *lres = calloc(PREFILL_REQS, sizeof *lres);
    Kvshare__AllocResult *ares = calloc(PREFILL_REQS, sizeof *ares);
    Kvshare__CommitResult *cres = calloc(PREFILL_REQS, sizeof *cres);
    Kvshare__Status st = KVSHARE__STATUS__INIT;
    uint32_t blk[3] = {4000, 4001, 4002};
    for (int r = 0; r < PREFILL_REQS; r++) {
      Kvshare__Request ri = KVSHARE__REQUEST__INIT;
      Kvshare__Response si = KVSHARE__RESPONSE__INIT;
      kvshare__lookup__init(&lk[r]);
      lk[r].req_id = id + (uint64_t)r;
      lk[r].n_tokens = plen;
      lk[r].tokens = tok + (size_t)r * plen;
      kvshare__allocate__init(&al[r]);
      al[r].req_id = id + (uint64_t)r;
      al[r].num_tokens = plen - 2 * bs;
      kvshare__commit__init(&cm[r]);
      cm[r].req_id = id + (uint64_t)r;
      cm[r].start = 2 * bs;
      cm[r].num_tokens = plen - 2 * bs;
      kvshare__free__init(&fr[r]);
      fr[r].req_id = id + (uint64_t)r;
      for (int k = 0; k < 4; k++) {
        rq[4 * r + k] = ri;
        rp[4 * r + k] = si;
        rp[4 * r + k].status = &st;
        ops[4 * r + k] = &rq[4 * r + k];
        rps[4 * r + k] = &rp[4 * r + k];
      }
      rq[4 * r].op_case = KVSHARE__REQUEST__OP_LOOKUP;
      rq[4 * r].lookup = &lk[r];
      rq[4 * r + 1].op_case = KVSHARE__REQUEST__OP_ALLOCATE;
      rq[4 * r + 1].allocate = &al[r];
      rq[4 * r + 2].op_case = KVSHARE__REQUEST__OP_COMMIT;
      rq[4 * r + 2].commit = &cm[r];
      rq[4 * r + 3].op_case = KVSHARE__REQUEST__OP_FREE;
      rq[4 * r + 3].free = &fr[r];
      kvshare__lookup_result__init(&lres[r]);
      lres[r].hit_tokens = 2 * bs;
      lres[r].n_blocks = 2;
      lres[r].blocks = blk;
      kvshare__alloc_result__init(&ares[r]);
      ares[r].first_index = 2;
      ares[r].n_blocks = 1;
      ares[r].blocks = blk + 2;
      kvshare__commit_result__init(&cres[r]);
      rp[4 * r].result_case = KVSHARE__RESPONSE__RESULT_LOOKUP;
      rp[4 * r].lookup = &lres[r];
      rp[4 * r + 1].result_case = KVSHARE__RESPONSE__RESULT_ALLOC;
      rp[4 * r + 1].alloc = &ares[r];
      rp[4 * r + 2].result_case = KVSHARE__RESPONSE__RESULT_COMMIT;
      rp[4 * r + 2].commit = &cres[r];
    }
    Kvshare__Batch batch = KVSHARE__BATCH__INIT;
    batch.n_ops = 4 * PREFILL_REQS;
    batch.ops = ops;
    Kvshare__Request top = KVSHARE__REQUEST__INIT;
    top.op_case = KVSHARE__REQUEST__OP_BATCH;
    top.batch = &batch;
    preq = req_size(&top);
    Kvshare__BatchResult br = KVSHARE__BATCH_RESULT__INIT;
    br.n_replies = 4 * PREFILL_REQS;
    br.replies = rps;
    Kvshare__Response tr = KVSHARE__RESPONSE__INIT;
    tr.status = &st;
    tr.result_case = KVSHARE__RESPONSE__RESULT_BATCH;
    tr.batch = &br;
    presp = resp_size(&tr);
    pcodec = codec_us(&top, &tr);
    free(ops), free(rq), free(lk), free(al), free(cm), free(fr);
    free(rps), free(rp), free(lres), free(ares), free(cres);
  }

  /* Decode steps: DECODE_REQS running requests, each step appends one token
   * to each and commits it (2 x DECODE_REQS ops). */
  uint32_t dtok[DECODE_REQS];
  for (int r = 0; r < DECODE_REQS; r++) {
    uint32_t t[8] = {1, 2, 3, 4, 5, 6, 7, (uint32_t)r};
    CHECK_OK(c, kvs_lookup(c, 50000 + (uint64_t)r, t, 8, NULL, 0, NULL));
    CHECK_OK(c, kvs_allocate(c, 50000 + (uint64_t)r, 8, NULL));
    CHECK_OK(c, kvs_commit(c, 50000 + (uint64_t)r, 0, NULL, 8, NULL, 0, NULL));
  }
  int dsteps = quick ? 60 : 8 * (int)bs;
  if (packed) /* what goes on the wire instead */
    packed_sizes(4 * PREFILL_REQS, (size_t)PREFILL_REQS * plen,
                 3 * PREFILL_REQS, &preq, &presp);
  for (int s = 0; s < dsteps; s++) {
    kvs_batch_reset(b);
    for (int r = 0; r < DECODE_REQS; r++) {
      dtok[r] = 900 + (uint32_t)s;
      kvs_batch_append(b, 50000 + (uint64_t)r, 1);
      kvs_batch_commit(b, 50000 + (uint64_t)r, 8 + (uint32_t)s, &dtok[r], 1,
                       NULL, 0);
    }
    double t0 = itest_now();
    CHECK_OK(c, kvs_batch_submit(c, b));
    add(&sdec, (itest_now() - t0) * 1e6);
    for (uint32_t i = 0; i < kvs_batch_count(b); i++)
      CHECK(kvs_batch_status(b, i) == 0);
  }
  {
    Kvshare__Append ap = KVSHARE__APPEND__INIT;
    ap.req_id = 50000;
    ap.num_tokens = 1;
    Kvshare__Commit cm = KVSHARE__COMMIT__INIT;
    cm.req_id = 50000;
    cm.start = 100;
    cm.n_tokens = 1;
    cm.tokens = dtok;
    cm.num_tokens = 1;
    Kvshare__Request ra = KVSHARE__REQUEST__INIT, rc = KVSHARE__REQUEST__INIT;
    ra.op_case = KVSHARE__REQUEST__OP_APPEND;
    ra.append = &ap;
    rc.op_case = KVSHARE__REQUEST__OP_COMMIT;
    rc.commit = &cm;
    Kvshare__Request *ops[2 * DECODE_REQS];
    for (int r = 0; r < DECODE_REQS; r++) {
      ops[2 * r] = &ra;
      ops[2 * r + 1] = &rc;
    }
    Kvshare__Batch batch = KVSHARE__BATCH__INIT;
    batch.n_ops = 2 * DECODE_REQS;
    batch.ops = ops;
    Kvshare__Request top = KVSHARE__REQUEST__INIT;
    top.op_case = KVSHARE__REQUEST__OP_BATCH;
    top.batch = &batch;
    dreq = req_size(&top);
    Kvshare__Status st = KVSHARE__STATUS__INIT;
    Kvshare__AllocResult ar = KVSHARE__ALLOC_RESULT__INIT;
    ar.first_index = 7;
    Kvshare__Response r0 = KVSHARE__RESPONSE__INIT, r1 = KVSHARE__RESPONSE__INIT;
    r0.status = &st;
    r0.result_case = KVSHARE__RESPONSE__RESULT_ALLOC;
    r0.alloc = &ar;
    r1.status = &st;
    Kvshare__Response *rps[2 * DECODE_REQS];
    for (int r = 0; r < DECODE_REQS; r++) {
      rps[2 * r] = &r0;
      rps[2 * r + 1] = &r1;
    }
    Kvshare__BatchResult br = KVSHARE__BATCH_RESULT__INIT;
    br.n_replies = 2 * DECODE_REQS;
    br.replies = rps;
    Kvshare__Response tr = KVSHARE__RESPONSE__INIT;
    tr.status = &st;
    tr.result_case = KVSHARE__RESPONSE__RESULT_BATCH;
    tr.batch = &br;
    dresp = resp_size(&tr);
    dcodec = codec_us(&top, &tr);
  }
  for (int r = 0; r < DECODE_REQS; r++)
    CHECK_OK(c, kvs_free(c, 50000 + (uint64_t)r));

  /* Raw ping-pongs of the same bytes as the prefill step. */
  raw rw;
  raw_start(&rw, preq, presp);
  for (int i = 0; i < steps; i++)
    add(&sraw, raw_rtt(&rw));
  raw_stop(&rw);
  raw_start(&rw, dreq, dresp);
  for (int i = 0; i < dsteps; i++)
    add(&sraw2, raw_rtt(&rw));
  raw_stop(&rw);

  double mp = median(sp.v, sp.n), md = median(sdec.v, sdec.n);
  double mraw = median(sraw.v, sraw.n), mraw2 = median(sraw2.v, sraw2.n);
  int pops = 4 * PREFILL_REQS, dops = 2 * DECODE_REQS;
  if (packed)
    packed_sizes(2 * DECODE_REQS, DECODE_REQS, DECODE_REQS / bs, &dreq,
                 &dresp);
  printf("batched steps as %s%s, median round trip (%d / %d steps):\n",
         packed ? "PackedBatch (the default)" : "Batch (KVS_PACKED_BATCH=0)",
         batch_label, sp.n, sdec.n);
  printf("  prefill step: %d ops (%d x lookup/allocate/commit/free), %zu B / "
         "%zu B\n",
         pops, PREFILL_REQS, preq, presp);
  printf("    %8.1f us   %.2f M block-ops/s   %.1fx the small raw "
         "ping-pong, %.2fx a raw ping-pong of the same bytes (%.1f us)\n",
         mp, pops / mp, mp / raw_small, mp / mraw, mraw);
  if (!packed)
    printf("    of which the daemon's protobuf work (decode the request, "
           "encode the reply; in-process): %.1f us\n",
           pcodec);
  printf("    per op: %.0f ns in all, %.0f ns over the raw ping-pong of the "
         "same bytes\n", mp * 1e3 / pops, (mp - mraw) * 1e3 / pops);
  printf("  decode step: %d ops (%d x append/commit), %zu B / %zu B\n", dops,
         DECODE_REQS, dreq, dresp);
  printf("    %8.1f us   %.2f M block-ops/s   %.1fx the small raw "
         "ping-pong, %.2fx a raw ping-pong of the same bytes (%.1f us)\n",
         md, dops / md, md / raw_small, md / mraw2, mraw2);
  if (!packed)
    printf("    of which the daemon's protobuf work (decode the request, "
           "encode the reply; in-process): %.1f us\n",
           dcodec);
  printf("    per op: %.0f ns in all, %.0f ns over the raw ping-pong of the "
         "same bytes\n", md * 1e3 / dops, (md - mraw2) * 1e3 / dops);
  (void)blocks_touched;
  free(sp.v);
  free(sdec.v);
  free(sraw.v);
  free(sraw2.v);
  kvs_batch_free(b);
  free(tok);
}

/*
 * One Lookup of a 1024-token prompt (63 blocks cached, token ids of 3-byte
 * varints) through kvshared, against the core's own lookup of the same
 * prompt in this process (a request created, the lookup, which hashes the
 * prompt and probes the index) plus a raw ping-pong of the same frame
 * bytes.  Interleaved; medians.
 */
static void bench_lookup(kvs_client *c) {
  enum { N = 1024 };
  const kvs_layout *l = kvs_layout_of(c);
  uint32_t tok[N], hit = 0, want = (N - 1) / l->block_size * l->block_size;
  core_config cc;
  core *co;
  core_req *r;
  series sd = {0}, sc = {0}, sr = {0};
  int rounds = quick ? 10 : 40, per = 200;
  uint64_t id = 900000;
  size_t qlen, plen;

  for (uint32_t i = 0; i < N; i++)
    tok[i] = 200000 + i * 7;
  /* Cached in the daemon... */
  CHECK_OK(c, kvs_lookup(c, id, tok, N, NULL, 0, NULL));
  CHECK_OK(c, kvs_allocate(c, id, N, NULL));
  CHECK_OK(c, kvs_commit(c, id, 0, NULL, N, NULL, 0, NULL));
  CHECK_OK(c, kvs_free(c, id));
  /* ...and in a core of the same shape, in this process. */
  memset(&cc, 0, sizeof cc);
  cc.num_blocks = l->num_blocks;
  cc.block_size = l->block_size;
  cc.root = core_root_hash(l, kvs_model_id(c));
  cc.verify_tokens = 1;
  CHECK(core_create(&cc, &co) == 0);
  CHECK(core_req_create(co, NULL, 0, &r) == 0);
  CHECK(core_lookup(co, r, tok, N, &hit) == 0);
  CHECK(core_allocate(co, r, N, NULL) == 0);
  CHECK(core_commit(co, r, 0, NULL, N, NULL) == 0);
  core_req_free(co, r);
  /* The frames' sizes, for the raw ping-pong. */
  {
    Kvshare__Lookup lk = KVSHARE__LOOKUP__INIT;
    Kvshare__Request rq = KVSHARE__REQUEST__INIT;
    Kvshare__LookupResult lr = KVSHARE__LOOKUP_RESULT__INIT;
    Kvshare__Response rs = KVSHARE__RESPONSE__INIT;
    Kvshare__Status st = KVSHARE__STATUS__INIT;
    uint32_t blocks[N];

    lk.req_id = id;
    lk.n_tokens = N;
    lk.tokens = tok;
    rq.op_case = KVSHARE__REQUEST__OP_LOOKUP;
    rq.lookup = &lk;
    for (uint32_t i = 0; i < N; i++)
      blocks[i] = 4000 + i;
    lr.hit_tokens = want;
    lr.n_blocks = want / l->block_size;
    lr.blocks = blocks;
    rs.status = &st;
    rs.result_case = KVSHARE__RESPONSE__RESULT_LOOKUP;
    rs.lookup = &lr;
    qlen = req_size(&rq);
    plen = resp_size(&rs);
  }
  raw rw;
  raw_start(&rw, qlen, plen);
  for (int k = 0; k < rounds; k++) {
    for (int i = 0; i < per; i++) {
      kvs_lookup_result res;
      double t0 = itest_now();
      CHECK_OK(c, kvs_lookup(c, ++id, tok, N, NULL, 0, &res));
      add(&sd, (itest_now() - t0) * 1e6);
      CHECK(res.hit_tokens == want);
      CHECK_OK(c, kvs_free(c, id));
    }
    for (int i = 0; i < per; i++) {
      double t0 = itest_now();
      CHECK(core_req_create(co, NULL, 0, &r) == 0);
      CHECK(core_lookup(co, r, tok, N, &hit) == 0);
      add(&sc, (itest_now() - t0) * 1e6);
      CHECK(hit == want);
      core_req_free(co, r);
    }
    for (int i = 0; i < per; i++)
      add(&sr, raw_rtt(&rw));
  }
  raw_stop(&rw);
  core_destroy(co);
  double md = median(sd.v, sd.n), mc = median(sc.v, sc.n),
         mr = median(sr.v, sr.n);
  printf("lookup of a %d-token prompt (%u tokens hit)%s, median over %d "
         "samples each (interleaved):\n", N, want, batch_label, sd.n);
  printf("  the core in-process (create + lookup)     %8.2f us\n", mc);
  printf("  raw ping-pong of the same bytes %zu B / %zu B  %8.2f us\n",
         qlen, plen, mr);
  printf("  through kvshared                          %8.2f us   ratio "
         "%.2fx core + raw (target <= 2x)\n", md, md / (mc + mr));
  free(sd.v);
  free(sc.v);
  free(sr.v);
}

/* The same prefill steps (64 x lookup/allocate/commit/free over a cached
 * system prompt) on two daemons, alternating step by step so that both see
 * the same load: the median round trip of each and their ratio. */
static void bench_tenant_cost(kvs_client *plain, kvs_client *part) {
  kvs_client *cs[2] = {plain, part};
  uint32_t bs = kvs_layout_of(plain)->block_size;
  uint32_t plen = 2 * bs + 5;
  uint32_t *tok = malloc((size_t)PREFILL_REQS * plen * sizeof *tok);
  kvs_batch *b;
  series sv[2] = {{0}, {0}};
  int steps = quick ? 100 : 400;
  uint64_t id = 500000;

  CHECK(tok);
  CHECK_OK(plain, kvs_batch_new(&b));
  for (int k = 0; k < 2; k++) {
    for (uint32_t i = 0; i < plen; i++)
      tok[i] = i < 2 * bs ? 7 + i : 99 + i;
    CHECK_OK(cs[k], kvs_lookup(cs[k], 1, tok, plen, NULL, 0, NULL));
    CHECK_OK(cs[k], kvs_allocate(cs[k], 1, plen, NULL));
    CHECK_OK(cs[k], kvs_commit(cs[k], 1, 0, NULL, plen, NULL, 0, NULL));
    CHECK_OK(cs[k], kvs_free(cs[k], 1));
  }
  for (int s = 0; s < 2 * steps; s++) {
    kvs_client *c = cs[s & 1];
    prefill_batch(b, tok, plen, bs, 900000 + (uint32_t)s * PREFILL_REQS * 64,
                  id);
    double t0 = itest_now();
    CHECK_OK(c, kvs_batch_submit(c, b));
    add(&sv[s & 1], (itest_now() - t0) * 1e6);
    for (uint32_t i = 0; i < kvs_batch_count(b); i++)
      CHECK(kvs_batch_status(b, i) == 0);
    id += PREFILL_REQS;
  }
  double m0 = median(sv[0].v, sv[0].n), m1 = median(sv[1].v, sv[1].n);
  printf("prefill steps (256 ops), a daemon without tenants and one whose "
         "pool is split between two tenants (this uid in one), alternating, "
         "median over %d steps each:\n", sv[0].n);
  printf("  without tenants   %8.2f us   %4.0f ns per op\n", m0,
         m0 * 1e3 / (4 * PREFILL_REQS));
  printf("  with tenants      %8.2f us   %4.0f ns per op   ratio %.3fx\n",
         m1, m1 * 1e3 / (4 * PREFILL_REQS), m1 / m0);
  kvs_batch_free(b);
  free(sv[0].v);
  free(sv[1].v);
  free(tok);
}

int main(void) {
  quick = getenv("KVS_BENCH_QUICK") != NULL;
  int my_fds = itest_fd_count(0);
  /* A host pool on every machine: the protocol's cost does not depend on
   * the pool, and a client that maps a cuda pool starts the CUDA driver,
   * whose descriptors (device nodes, its threads' pipes) stay open for the
   * life of the process: the GPU run's "test fd leak: 36 open, 3 at
   * start" after the last client closed. */
  static const char *const opts[] = {"--num-layers", "2", "--head-dim", "16",
                                     "--pool-blocks", "16384", "--backend",
                                     "host", "--log-level", "warn", NULL};
  itest_daemon_start(&d, opts);
  kvs_client *c = itest_connect(&d, "bench_rtt");
  double raw_small, unused;
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  /* Where the two processes run changes a Unix-socket round trip a lot
   * (a cross-core wake-up can cost more than the work): measure both
   * placements, the same for the raw baseline and for the daemon. */
  /* The same small ops from a second client that sends Envelopes only
   * ($KVS_COMPACT=0), each against its own raw baseline, in this run. */
  setenv("KVS_COMPACT", "0", 1);
  kvs_client *ce = itest_connect(&d, "bench_rtt_envelopes");
  unsetenv("KVS_COMPACT");
  if (ncpu >= 2) {
    client_cpu = 0;
    server_cpu = 1;
    pin(0, client_cpu);
    pin(d.pid, server_cpu);
    bench_small(c, "compact frames, client and server on different cores",
                &raw_small, 1);
    bench_small(ce, "Envelopes, client and server on different cores",
                &unused, 0);
    server_cpu = 0;
    pin(d.pid, server_cpu);
    bench_small(c, "compact frames, client and server on the same core",
                &unused, 1);
    bench_small(ce, "Envelopes, client and server on the same core", &unused,
                0);
    server_cpu = 1;
    pin(d.pid, server_cpu);
  } else {
    bench_small(c, "compact frames, one core", &raw_small, 1);
    bench_small(ce, "Envelopes, one core", &unused, 0);
  }
  bench_lookup(c);
  {
    /* The batched steps both ways, each with its own client: the protobuf
     * Batch first, then the packed records libkvshare uses by default. */
    kvs_client *cb;

    setenv("KVS_PACKED_BATCH", "0", 1);
    cb = itest_connect(&d, "bench_rtt_batch");
    unsetenv("KVS_PACKED_BATCH");
    bench_batch(cb, raw_small, 0);
    kvs_close(cb);
    bench_batch(c, raw_small, 1);
    batch_label = ", in Envelopes (KVS_COMPACT=0)";
    bench_batch(ce, raw_small, 1);
    batch_label = "";
    kvs_close(ce);
  }
  for (int fmt = 0; fmt < 2; fmt++) {
    /* The same steps on a second daemon with /metrics and the KV event
     * stream on (every sealed and evicted block published), in this run,
     * in each event encoding: their cost is the difference per op. */
    static const char *const fmts[] = {"map", "array"};
    itest_daemon d2;
    char ep[320];
    const char *o2[] = {"--num-layers", "2", "--head-dim", "16",
                        "--pool-blocks", "16384", "--backend", "host",
                        "--log-level", "warn",
                        "--metrics-listen", "127.0.0.1:0",
                        "--kv-events-endpoint", ep,
                        "--kv-events-format", fmts[fmt], NULL};
    kvs_client *c2;

    snprintf(ep, sizeof(ep), "ipc://%s/events", d.dir);
    itest_daemon_start(&d2, o2);
    pin(d2.pid, server_cpu);
    c2 = itest_connect(&d2, "bench_rtt_observed");
    batch_label = fmt == 0 ? ", daemon with --metrics-listen and "
                             "--kv-events-endpoint (map encoding)"
                           : ", daemon with --metrics-listen and "
                             "--kv-events-endpoint (array encoding)";
    bench_batch(c2, raw_small, 1);
    kvs_close(c2);
    itest_daemon_finish(&d2, itest_fd_count(0));
  }
  {
    /* The same steps and small ops on a daemon whose pool is split between
     * two tenants, this process's uid in one (docs/operations.md
     * "Tenants"), in this run: what partitions cost on the hot path. */
    itest_daemon d3;
    char mine[64];
    kvs_client *c3;

    snprintf(mine, sizeof(mine), "bench uids=%u share=50%%",
             (unsigned)getuid());
    const char *o3[] = {"--num-layers", "2", "--head-dim", "16",
                        "--pool-blocks", "32768", "--backend", "host",
                        "--log-level", "warn", "--tenant", mine,
                        "--tenant", "other uids=40009", NULL};
    itest_daemon_start(&d3, o3);
    pin(d3.pid, server_cpu);
    c3 = itest_connect(&d3, "bench_rtt_tenant");
    bench_tenant_cost(c, c3);
    kvs_close(c3);
    itest_daemon_finish(&d3, itest_fd_count(0));
  }
  {
    /* The same measures through a request ring (KVS_RING=1, the daemon's
     * default ring_poll_us), against the same raw socket baselines: a
     * call posted in shared memory that a polling daemon takes. */
    kvs_client *cr;

    setenv("KVS_RING", "1", 1);
    cr = itest_connect(&d, "bench_rtt_ring");
    unsetenv("KVS_RING");
    CHECK(kvs_ring_active(cr));
    batch_label = ", through the request ring";
    if (ncpu >= 2) {
      bench_small(cr, "through the request ring, client and server on "
                  "different cores", &unused, 1);
      server_cpu = 0;
      pin(d.pid, server_cpu);
      bench_small(cr, "through the request ring, client and server on the "
                  "same core", &unused, 1);
      server_cpu = 1;
      pin(d.pid, server_cpu);
    } else {
      bench_small(cr, "through the request ring, one core", &unused, 1);
    }
    bench_lookup(cr);
    bench_batch(cr, raw_small, 1);
    kvs_close(cr);
  }
  {
    /* The socket again, with both sides polling instead of sleeping: a
     * daemon started with --socket-poll-us 100, a client with
     * KVS_SOCKET_SPIN_US=100 (docs/client.md), against the same raw
     * baselines (which sleep). */
    itest_daemon d4;
    const char *o4[] = {"--num-layers", "2", "--head-dim", "16",
                        "--pool-blocks", "16384", "--backend", "host",
                        "--log-level", "warn", "--socket-poll-us", "100",
                        NULL};
    kvs_client *cs;

    itest_daemon_start(&d4, o4);
    pin(d4.pid, server_cpu);
    setenv("KVS_SOCKET_SPIN_US", "100", 1);
    cs = itest_connect(&d4, "bench_rtt_spin");
    unsetenv("KVS_SOCKET_SPIN_US");
    batch_label = ", socket polled by both sides (--socket-poll-us 100, "
                  "KVS_SOCKET_SPIN_US=100)";
    if (ncpu >= 2)
      bench_small(cs, "socket polled by both sides, client and server on "
                  "different cores", &unused, 1);
    bench_batch(cs, raw_small, 1);
    kvs_close(cs);
    itest_daemon_finish(&d4, itest_fd_count(0));
  }
  unpin(0);
  unpin(d.pid);
  kvs_close(c);
  itest_daemon_finish(&d, my_fds);
  return 0;
}
