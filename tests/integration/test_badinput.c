/*
 * test_badinput — bad input gets a clear error and the daemon survives with
 * its cache intact.
 *
 * Frame-level cases use raw sockets and frames built with libkvsproto:
 * garbage bytes, wrong magic, wrong version (frame and Hello), nonzero
 * flags, a length over the limit (error, then the daemon closes: the stream
 * cannot be resynchronised), an undecodable payload, an empty envelope, an
 * empty request, a Hello after the handshake, a Response sent to the daemon,
 * a nested batch (error reply, the connection goes on), a request before
 * Hello, disconnects mid-header and mid-frame, and a burst of random frames.
 * Request-level cases use libkvshare: request ids unknown or belonging to
 * another session, block ids out of range or belonging to another request,
 * double free, commit of positions the request never allocated, tokens not
 * matching, gaps, zero counts, a fork onto a live id.  Every error must come
 * with its status code and a non-empty message.  After each case an observer
 * session checks that its cached prefix still hits with the same blocks and
 * bytes and that the pool invariant holds; the test ends with the leak
 * checks.
 */
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "kvs_compact.h"
#include "kvs_frame.h"
#include "kvs_shm.h"
#include "tests/integration/itest.h"

static itest_daemon d;
static kvs_client *obs;        /* the observer */
static uint32_t obs_tok[256], obs_n, obs_blocks[16], obs_nfull;
static int cases;

/* The next reply must be an error `code` with a message (and seq `seq`
 * unless seq is UINT64_MAX); when closes, the daemon must then close. */
static void expect_error(int fd, uint64_t seq, int code, int closes,
                         const char *what) {
  Kvshare__Envelope *e = itest_raw_recv(fd);
  if (!e) {
    fprintf(stderr, "%s: connection closed with no error reply\n", what);
    exit(1);
  }
  /* Before the handshake an error comes as a Welcome with a status. */
  Kvshare__Status *st = NULL;
  if (e->body_case == KVSHARE__ENVELOPE__BODY_WELCOME && e->welcome)
    st = e->welcome->status;
  else if (e->body_case == KVSHARE__ENVELOPE__BODY_RESPONSE && e->response)
    st = e->response->status;
  CHECK(st != NULL);
  if (st->code != code || !st->message || !st->message[0] ||
      (seq != UINT64_MAX && e->seq != seq)) {
    fprintf(stderr, "%s: got %s (%d) \"%s\" seq %llu, wanted %s\n", what,
            kvs_status_name(st->code), st->code,
            st->message ? st->message : "", (unsigned long long)e->seq,
            kvs_status_name(code));
    exit(1);
  }
  printf("  %-40s -> %s: %s\n", what, kvs_status_name(code), st->message);
  kvs_envelope_free(e);
  if (closes) {
    uint8_t b;
    CHECK(itest_raw_read(fd, &b, 1) == -1);
  }
}

static void observe(const char *after);

/* ---- compact frames (proto/kvs_compact.h) --------------------------------- */

/* Sends a compact frame of payload p (n bytes). */
static void send_compact(int fd, const uint8_t *p, size_t n) {
  uint8_t *f = malloc(KVS_FRAME_HEADER_SIZE + n);

  CHECK(f);
  kvs_frame_header_encode_flags(f, (uint32_t)n, KVS_FRAME_COMPACT);
  memcpy(f + KVS_FRAME_HEADER_SIZE, p, n);
  itest_raw_send(fd, f, KVS_FRAME_HEADER_SIZE + n);
  free(f);
}

/* The next frame must be a compact reply with this seq and status, whose
 * lengths add up, with a message when the status is an error; whole: a
 * refusal of the whole frame (no record, the message filed under
 * KVS_COMPACT_FRAME_MSG), else one op's record (its message under op 0). */
static void expect_compact(int fd, uint64_t seq, int code, int whole,
                           const char *what) {
  uint8_t hdr[KVS_FRAME_HEADER_SIZE], *p;
  kvs_frame_header fh;
  kvs_compact_rep h;
  size_t off;
  char msg[KVS_COMPACT_MSG_MAX + 1] = "";
  uint32_t msg_op = 0;

  CHECK(itest_raw_read(fd, hdr, sizeof hdr) == 0);
  CHECK(kvs_frame_header_decode(hdr, KVS_FRAME_MAX_DEFAULT, &fh) == 0);
  CHECK(fh.flags == KVS_FRAME_COMPACT);
  CHECK(fh.length >= KVS_COMPACT_HDR);
  p = malloc(fh.length);
  CHECK(p);
  CHECK(itest_raw_read(fd, p, fh.length) == 0);
  kvs_compact_rep_get(p, &h);
  off = KVS_COMPACT_HDR + (size_t)h.count * KVS_PACKED_RESULT_SIZE +
        (size_t)h.words * 4;
  for (uint32_t i = 0; i < h.nmsg; i++) {
    uint32_t op, n;

    CHECK(off + 8 <= fh.length);
    memcpy(&op, p + off, 4);
    memcpy(&n, p + off + 4, 4);
    CHECK(n <= KVS_COMPACT_MSG_MAX && off + kvs_compact_msg_size(n) <= fh.length);
    if (i == 0) {
      memcpy(msg, p + off + 8, n);
      msg[n] = '\0';
      msg_op = op;
    }
    off += kvs_compact_msg_size(n);
  }
  if (off != fh.length || h.seq != seq || h.status != code ||
      (code < 0 && !msg[0]) ||
      (whole ? h.count || h.words || msg_op != KVS_COMPACT_FRAME_MSG
             : h.count != 1 || msg_op != 0)) {
    fprintf(stderr, "%s: got seq %llu %s (%d) \"%s\" (op %u) in %u bytes "
            "(%zu counted; %u records), wanted seq %llu %s %s\n", what,
            (unsigned long long)h.seq, kvs_status_name(h.status), h.status,
            msg, msg_op, fh.length, off, h.count, (unsigned long long)seq,
            kvs_status_name(code), whole ? "refusing the frame" : "in a record");
    exit(1);
  }
  printf("  %-40s -> %s: %s\n", what, kvs_status_name(code), msg);
  free(p);
}

/* The session still answers a compact Ping, byte for byte. */
static void compact_alive(int fd, uint64_t seq) {
  uint8_t q[KVS_COMPACT_HDR + 5], hdr[KVS_FRAME_HEADER_SIZE],
      r[KVS_COMPACT_HDR + 5];
  kvs_compact_req h = {seq, KVS_COMPACT_PING, 5, 0};
  kvs_frame_header fh;
  kvs_compact_rep rh;

  kvs_compact_req_put(q, &h);
  memcpy(q + KVS_COMPACT_HDR, "alive", 5);
  send_compact(fd, q, sizeof q);
  CHECK(itest_raw_read(fd, hdr, sizeof hdr) == 0);
  CHECK(kvs_frame_header_decode(hdr, KVS_FRAME_MAX_DEFAULT, &fh) == 0);
  CHECK(fh.flags == KVS_FRAME_COMPACT && fh.length == sizeof r);
  CHECK(itest_raw_read(fd, r, sizeof r) == 0);
  kvs_compact_rep_get(r, &rh);
  CHECK(rh.seq == seq && rh.status == 0 && rh.count == 5 && rh.words == 0 &&
        rh.nmsg == 0 && memcmp(r + KVS_COMPACT_HDR, "alive", 5) == 0);
}

/* One op record as a compact request (words of data after it). */
static size_t compact_op(uint8_t *q, uint64_t seq, const kvs_pop *o,
                         const uint32_t *data, uint32_t words) {
  kvs_compact_req h = {seq, KVS_COMPACT_OP, 1, words};

  kvs_compact_req_put(q, &h);
  kvs_pop_put(q + KVS_COMPACT_HDR, o);
  if (words)
    memcpy(q + KVS_COMPACT_HDR + KVS_PACKED_OP_SIZE, data, words * 4);
  return KVS_COMPACT_HDR + KVS_PACKED_OP_SIZE + (size_t)words * 4;
}

/* A compact frame that does not add up gets a compact error with its seq
 * (when it had one) and the session goes on; an op that cannot be run
 * gets its own status; compact before Hello closes like any frame then. */
static void compact_cases(void) {
  uint8_t q[512];
  uint32_t toks[4] = {1, 2, 3, 4};
  kvs_compact_req h;
  kvs_pop o;
  size_t n;
  int fd = itest_raw_session(&d);

  memset(q, 0, sizeof q);
  send_compact(fd, q, 4);
  expect_compact(fd, 0, KVS_EPROTO, 1, "compact: 4 bytes (no header)");
  compact_alive(fd, 100);

  h = (kvs_compact_req){101, 9, 0, 0};
  kvs_compact_req_put(q, &h);
  send_compact(fd, q, KVS_COMPACT_HDR);
  expect_compact(fd, 101, KVS_EPROTO, 1, "compact: unknown kind");
  compact_alive(fd, 102);

  memset(&o, 0, sizeof o);
  o.op = 6; /* Free */
  o.req_id = 77;
  n = compact_op(q, 103, &o, NULL, 0);
  q[8 + 2] = 1; /* a reserved byte */
  send_compact(fd, q, n);
  expect_compact(fd, 103, KVS_EPROTO, 1, "compact: reserved bytes set");

  h = (kvs_compact_req){104, KVS_COMPACT_OP, 2, 0};
  kvs_compact_req_put(q, &h);
  kvs_pop_put(q + KVS_COMPACT_HDR, &o);
  kvs_pop_put(q + KVS_COMPACT_HDR + KVS_PACKED_OP_SIZE, &o);
  send_compact(fd, q, KVS_COMPACT_HDR + 2 * KVS_PACKED_OP_SIZE);
  expect_compact(fd, 104, KVS_EPROTO, 1, "compact: one op, two records");

  n = compact_op(q, 105, &o, NULL, 0);
  h = (kvs_compact_req){105, KVS_COMPACT_OP, 1, 5}; /* no data follows */
  kvs_compact_req_put(q, &h);
  send_compact(fd, q, n);
  expect_compact(fd, 105, KVS_EPROTO, 1, "compact: lengths do not add up");

  h = (kvs_compact_req){106, KVS_COMPACT_PING, 4, 1};
  kvs_compact_req_put(q, &h);
  send_compact(fd, q, KVS_COMPACT_HDR + 8);
  expect_compact(fd, 106, KVS_EPROTO, 1, "compact: a ping with data words");
  compact_alive(fd, 107);

  /* Frames that add up, with ops the daemon refuses alone. */
  n = compact_op(q, 108, &o, NULL, 0);
  send_compact(fd, q, n);
  expect_compact(fd, 108, KVS_ENOENT, 0, "compact: free of an unknown id");

  memset(&o, 0, sizeof o);
  o.op = 8; /* Stats: not an op a record can carry */
  n = compact_op(q, 109, &o, NULL, 0);
  send_compact(fd, q, n);
  expect_compact(fd, 109, KVS_EINVAL, 0, "compact: an op with no record form");

  memset(&o, 0, sizeof o);
  o.op = 1; /* Lookup, its tokens past the data */
  o.req_id = 5;
  o.tok_off = 2;
  o.tok_n = 4;
  n = compact_op(q, 110, &o, toks, 4);
  send_compact(fd, q, n);
  expect_compact(fd, 110, KVS_EINVAL, 0, "compact: arrays outside the data");
  compact_alive(fd, 111);

  /* A batch over max_batch_ops (the daemon's default): none of it runs. */
  {
    uint32_t nops = 16385;
    size_t len = KVS_COMPACT_HDR + (size_t)nops * KVS_PACKED_OP_SIZE;
    uint8_t *b = calloc(1, len);

    CHECK(b);
    h = (kvs_compact_req){112, KVS_COMPACT_BATCH, nops, 0};
    kvs_compact_req_put(b, &h);
    memset(&o, 0, sizeof o);
    o.op = 6;
    o.req_id = 9;
    for (uint32_t i = 0; i < nops; i++)
      kvs_pop_put(b + KVS_COMPACT_HDR + (size_t)i * KVS_PACKED_OP_SIZE, &o);
    send_compact(fd, b, len);
    free(b);
    expect_compact(fd, 112, KVS_ELIMIT, 1, "compact: a batch over the limit");
  }
  compact_alive(fd, 113);
  close(fd);
  observe("compact frames");

  /* Compact before the handshake: an error Welcome, then the close. */
  fd = itest_raw_connect(&d);
  h = (kvs_compact_req){1, KVS_COMPACT_PING, 0, 0};
  kvs_compact_req_put(q, &h);
  send_compact(fd, q, KVS_COMPACT_HDR);
  expect_error(fd, 0, KVS_EPROTO, 1, "compact before Hello");
  close(fd);
  observe("compact before Hello");
}

/* ---- the observer -------------------------------------------------------- */

static void observe(const char *after) {
  kvs_lookup_result lr;
  CHECK_OK(obs, kvs_ping(obs, "obs", 3));
  CHECK_OK(obs, kvs_lookup(obs, 2, obs_tok, obs_n, NULL, 0, &lr));
  if (lr.hit_tokens != obs_nfull * kvs_layout_of(obs)->block_size ||
      memcmp(lr.blocks, obs_blocks, obs_nfull * sizeof(uint32_t)) != 0) {
    fprintf(stderr, "after %s: the cached prefix changed\n", after);
    exit(1);
  }
  for (uint32_t i = 0; i < obs_nfull; i++) {
    const uint8_t *p = kvs_block_ptr(obs, obs_blocks[i]);
    for (uint64_t j = 0; j < kvs_layout_of(obs)->block_stride; j += 61)
      CHECK(p[j] == (uint8_t)(0x5A ^ i));
  }
  CHECK_OK(obs, kvs_free(obs, 2));
  kvs_stats st;
  CHECK_OK(obs, kvs_stats_get(obs, 1, &st));
  if (st.check != 0) {
    fprintf(stderr, "after %s: invariant check: %s\n", after,
            st.check_message);
    exit(1);
  }
  cases++;
}

/* ---- frame-level cases ---------------------------------------------------- */

static void frame_cases(void) {
  uint8_t hdr[KVS_FRAME_HEADER_SIZE + 64];
  int fd;

  /* Garbage bytes instead of a frame. */
  fd = itest_raw_session(&d);
  for (int i = 0; i < 64; i++)
    hdr[i] = (uint8_t)(i * 37 + 11);
  itest_raw_send(fd, hdr, 64);
  expect_error(fd, 0, KVS_EPROTO, 1, "garbage bytes");
  close(fd);
  observe("garbage");

  /* Wrong magic. */
  fd = itest_raw_session(&d);
  kvs_frame_header_encode(hdr, 4);
  hdr[0] = 'X';
  memset(hdr + KVS_FRAME_HEADER_SIZE, 0, 4);
  itest_raw_send(fd, hdr, KVS_FRAME_HEADER_SIZE + 4);
  expect_error(fd, 0, KVS_EPROTO, 1, "wrong magic");
  close(fd);
  observe("wrong magic");

  /* Wrong frame version, before any Hello. */
  fd = itest_raw_connect(&d);
  kvs_frame_header_encode(hdr, 4);
  hdr[4] = 99;
  itest_raw_send(fd, hdr, KVS_FRAME_HEADER_SIZE + 4);
  expect_error(fd, 0, KVS_EVERSION, 1, "wrong frame version");
  close(fd);
  observe("wrong frame version");

  /* Hello with a version the daemon does not speak. */
  fd = itest_raw_connect(&d);
  itest_raw_hello(fd, 99);
  expect_error(fd, UINT64_MAX, KVS_EVERSION, 1, "Hello version 99");
  close(fd);
  observe("Hello version");

  /* A frame flag that does not exist (the compact one is compact_cases'). */
  fd = itest_raw_session(&d);
  kvs_frame_header_encode_flags(hdr, 4, 2);
  itest_raw_send(fd, hdr, KVS_FRAME_HEADER_SIZE + 4);
  expect_error(fd, 0, KVS_EPROTO, 1, "unknown frame flags");
  close(fd);
  observe("flags");

  /* A length over the limit. */
  fd = itest_raw_session(&d);
  kvs_frame_header_encode(hdr, kvs_max_frame(obs) + 1);
  itest_raw_send(fd, hdr, KVS_FRAME_HEADER_SIZE);
  expect_error(fd, 0, KVS_ETOOBIG, 1, "length over the limit");
  close(fd);
  observe("too big");

  /* An undecodable payload (a valid envelope cut short): error, go on. */
  fd = itest_raw_session(&d);
  {
    uint32_t tok[40];
    for (int i = 0; i < 40; i++)
      tok[i] = 50 + i;
    Kvshare__Lookup l = KVSHARE__LOOKUP__INIT;
    l.req_id = 9;
    l.n_tokens = 40;
    l.tokens = tok;
    Kvshare__Request r = KVSHARE__REQUEST__INIT;
    r.op_case = KVSHARE__REQUEST__OP_LOOKUP;
    r.lookup = &l;
    Kvshare__Envelope env = KVSHARE__ENVELOPE__INIT;
    env.seq = 2;
    env.body_case = KVSHARE__ENVELOPE__BODY_REQUEST;
    env.request = &r;
    uint8_t buf[512];
    size_t n = kvshare__envelope__pack(&env, buf + KVS_FRAME_HEADER_SIZE);
    CHECK(n > 20 && n < sizeof buf - KVS_FRAME_HEADER_SIZE);
    kvs_frame_header_encode(buf, (uint32_t)(n - 7));
    itest_raw_send(fd, buf, KVS_FRAME_HEADER_SIZE + n - 7);
  }
  expect_error(fd, 2, KVS_EPROTO, 0, "truncated (undecodable) payload");
  itest_raw_alive(fd);
  close(fd);
  observe("truncated payload");

  /* An envelope with no body, a request with no op: unknown messages. */
  fd = itest_raw_session(&d);
  {
    Kvshare__Envelope env = KVSHARE__ENVELOPE__INIT;
    env.seq = 3;
    itest_raw_send_env(fd, &env);
    expect_error(fd, 3, KVS_EUNKNOWN, 0, "envelope with no body");
    Kvshare__Request r = KVSHARE__REQUEST__INIT;
    env.seq = 4;
    env.body_case = KVSHARE__ENVELOPE__BODY_REQUEST;
    env.request = &r;
    itest_raw_send_env(fd, &env);
    expect_error(fd, 4, KVS_EUNKNOWN, 0, "request with no op");
    /* A field number from the future: decodes as an empty envelope. */
    uint8_t fut[KVS_FRAME_HEADER_SIZE + 3];
    kvs_frame_header_encode(fut, 3);
    fut[KVS_FRAME_HEADER_SIZE] = 0x98; /* tag of field 99, varint: 792 */
    fut[KVS_FRAME_HEADER_SIZE + 1] = 0x06;
    fut[KVS_FRAME_HEADER_SIZE + 2] = 0x01; /* value 1 */
    itest_raw_send(fd, fut, KVS_FRAME_HEADER_SIZE + 3);
    expect_error(fd, UINT64_MAX, KVS_EUNKNOWN, 0, "unknown field number");
    /* Hello again, and a Response sent to the daemon. */
    itest_raw_hello(fd, KVS_PROTO_VERSION);
    expect_error(fd, 1, KVS_EPROTO, 0, "Hello after the handshake");
    Kvshare__Response resp = KVSHARE__RESPONSE__INIT;
    env.seq = 5;
    env.body_case = KVSHARE__ENVELOPE__BODY_RESPONSE;
    env.response = &resp;
    itest_raw_send_env(fd, &env);
    expect_error(fd, 5, KVS_EPROTO, 0, "a Response sent to the daemon");
    /* A batch inside a batch: that op fails, the batch goes on. */
    Kvshare__Batch inner = KVSHARE__BATCH__INIT;
    Kvshare__Request rin = KVSHARE__REQUEST__INIT;
    rin.op_case = KVSHARE__REQUEST__OP_BATCH;
    rin.batch = &inner;
    Kvshare__Ping p = KVSHARE__PING__INIT;
    Kvshare__Request rping = KVSHARE__REQUEST__INIT;
    rping.op_case = KVSHARE__REQUEST__OP_PING;
    rping.ping = &p;
    Kvshare__Request *ops[2] = {&rin, &rping};
    Kvshare__Batch outer = KVSHARE__BATCH__INIT;
    outer.n_ops = 2;
    outer.ops = ops;
    Kvshare__Request rb = KVSHARE__REQUEST__INIT;
    rb.op_case = KVSHARE__REQUEST__OP_BATCH;
    rb.batch = &outer;
    env.seq = 6;
    env.body_case = KVSHARE__ENVELOPE__BODY_REQUEST;
    env.request = &rb;
    itest_raw_send_env(fd, &env);
    Kvshare__Envelope *e = itest_raw_recv(fd);
    CHECK(e && e->seq == 6 && e->response);
    CHECK(e->response->result_case == KVSHARE__RESPONSE__RESULT_BATCH);
    CHECK(e->response->batch->n_replies == 2);
    Kvshare__Status *s0 = e->response->batch->replies[0]->status;
    Kvshare__Status *s1 = e->response->batch->replies[1]->status;
    CHECK(s0 && s0->code == KVS_EINVAL && s0->message[0]);
    CHECK(!s1 || s1->code == 0);
    printf("  %-40s -> %s: %s\n", "batch inside a batch",
           kvs_status_name(s0->code), s0->message);
    kvs_envelope_free(e);
  }
  itest_raw_alive(fd);
  close(fd);
  observe("unknown messages");

  /* A request before Hello. */
  fd = itest_raw_connect(&d);
  {
    Kvshare__Ping p = KVSHARE__PING__INIT;
    Kvshare__Request r = KVSHARE__REQUEST__INIT;
    r.op_case = KVSHARE__REQUEST__OP_PING;
    r.ping = &p;
    Kvshare__Envelope env = KVSHARE__ENVELOPE__INIT;
    env.seq = 7;
    env.body_case = KVSHARE__ENVELOPE__BODY_REQUEST;
    env.request = &r;
    itest_raw_send_env(fd, &env);
  }
  expect_error(fd, UINT64_MAX, KVS_EPROTO, 1, "request before Hello");
  close(fd);
  observe("request before Hello");

  /* Disconnects mid-header, mid-frame, and right after Hello. */
  fd = itest_raw_session(&d);
  kvs_frame_header_encode(hdr, 100);
  itest_raw_send(fd, hdr, 5);
  close(fd);
  fd = itest_raw_session(&d);
  itest_raw_send(fd, hdr, KVS_FRAME_HEADER_SIZE + 10);
  close(fd);
  fd = itest_raw_connect(&d);
  itest_raw_hello(fd, KVS_PROTO_VERSION);
  close(fd);
  printf("  %-40s -> closed by the client\n", "disconnects mid-frame");
  observe("disconnects");

  /* A burst of random frames: random headers, valid headers with random
   * payloads, on fresh sessions. */
  uint64_t seed = 0x9E3779B97F4A7C15ull;
  for (int i = 0; i < 60; i++) {
    fd = itest_raw_session(&d);
    uint8_t buf[KVS_FRAME_HEADER_SIZE + 200];
    uint32_t n = (uint32_t)(itest_rand(&seed) % 200);
    for (size_t j = 0; j < sizeof buf; j++)
      buf[j] = (uint8_t)itest_rand(&seed);
    if (i % 2)
      kvs_frame_header_encode(buf, n);
    itest_raw_send(fd, buf, KVS_FRAME_HEADER_SIZE + n);
    /* Whatever comes back must be error replies, then maybe a close. */
    struct pollfd p = {fd, POLLIN, 0};
    while (poll(&p, 1, 50) > 0) {
      Kvshare__Envelope *e = itest_raw_recv(fd);
      if (!e)
        break;
      CHECK(e->body_case == KVSHARE__ENVELOPE__BODY_RESPONSE ||
            e->body_case == KVSHARE__ENVELOPE__BODY_WELCOME);
      kvs_envelope_free(e);
    }
    close(fd);
  }
  printf("  %-40s -> survived\n", "60 random frames");
  observe("random frames");
}

/* ---- request-level cases --------------------------------------------------- */

#define EXPECT(c, call, code)                                                \
  do {                                                                       \
    CHECK_RC(c, call, code);                                                 \
    CHECK(kvs_last_message(c)[0] != '\0');                                   \
    printf("  %-40s -> %s: %s\n", #call, kvs_status_name(code),              \
           kvs_last_message(c));                                             \
  } while (0)

static void request_cases(void) {
  kvs_client *a = itest_connect(&d, "session-a");
  kvs_client *b = itest_connect(&d, "session-b");
  const kvs_layout *l = kvs_layout_of(a);
  uint32_t bs = l->block_size;
  uint32_t tok[128], other[128];
  for (int i = 0; i < 128; i++) {
    tok[i] = 900000 + i;
    other[i] = 800000 + i;
  }
  kvs_alloc_result ar;
  /* Session a owns request 77 and its blocks. */
  CHECK_OK(a, kvs_lookup(a, 77, tok, 2 * bs, NULL, 0, NULL));
  CHECK_OK(a, kvs_allocate(a, 77, 2 * bs, &ar));
  uint32_t ablocks[2] = {ar.blocks[0], ar.blocks[1]};

  /* Request ids of another session (or none): not found. */
  EXPECT(b, kvs_free(b, 77), KVS_ENOENT);
  EXPECT(b, kvs_allocate(b, 77, 4, NULL), KVS_ENOENT);
  EXPECT(b, kvs_append(b, 77, 1, NULL), KVS_ENOENT);
  EXPECT(b, kvs_commit(b, 77, 0, tok, bs, NULL, 0, NULL), KVS_ENOENT);
  EXPECT(b, kvs_fork(b, 77, 78), KVS_ENOENT);
  EXPECT(b, kvs_preempt(b, 77), KVS_ENOENT);
  EXPECT(b, kvs_free(b, UINT64_MAX), KVS_ENOENT);
  observe("foreign request ids");

  /* Session b's own request 5. */
  CHECK_OK(b, kvs_lookup(b, 5, other, 2 * bs, NULL, 0, NULL));
  CHECK_OK(b, kvs_allocate(b, 5, 2 * bs, &ar));
  uint32_t bblocks[2] = {ar.blocks[0], ar.blocks[1]};
  uint32_t bad[2] = {l->num_blocks + 5, bblocks[1]};
  EXPECT(b, kvs_commit(b, 5, 0, NULL, 2 * bs, bad, 2, NULL), KVS_ERANGE);
  bad[0] = UINT32_MAX;
  EXPECT(b, kvs_commit(b, 5, 0, NULL, 2 * bs, bad, 2, NULL), KVS_ERANGE);
  EXPECT(b, kvs_commit(b, 5, 0, NULL, 2 * bs, ablocks, 2, NULL), KVS_EINVAL);
  EXPECT(b, kvs_commit(b, 5, 0, NULL, 2 * bs, bblocks, 1, NULL), KVS_EINVAL);
  /* Positions never allocated (not written by this request). */
  EXPECT(b, kvs_commit(b, 5, 0, other, 3 * bs, NULL, 0, NULL), KVS_ERANGE);
  /* A gap after the written positions. */
  EXPECT(b, kvs_commit(b, 5, bs, NULL, 1, NULL, 0, NULL), KVS_ERANGE);
  /* Tokens not matching the prompt the request looked up. */
  EXPECT(b, kvs_commit(b, 5, 0, tok, bs, NULL, 0, NULL), KVS_EMISMATCH);
  /* Zero counts. */
  EXPECT(b, kvs_allocate(b, 5, 0, NULL), KVS_EINVAL);
  EXPECT(b, kvs_lookup(b, 6, other, 0, NULL, 0, NULL), KVS_EINVAL);
  /* Lookup into a request that is not empty. */
  EXPECT(b, kvs_lookup(b, 5, other, 2 * bs, NULL, 0, NULL), KVS_ESTATE);
  /* Fork while slots are still unwritten. */
  EXPECT(b, kvs_fork(b, 5, 6), KVS_ESTATE);
  /* Nothing changed: the right commit still works. */
  uint32_t sealed = 0;
  CHECK_OK(b, kvs_commit(b, 5, 0, NULL, 2 * bs, bblocks, 2, &sealed));
  CHECK(sealed == 2);
  /* Fork onto a live id. */
  CHECK_OK(b, kvs_fork(b, 5, 6));
  EXPECT(b, kvs_fork(b, 5, 6), KVS_EEXIST);
  EXPECT(b, kvs_fork(b, 5, 5), KVS_EEXIST);
  /* Double free. */
  CHECK_OK(b, kvs_free(b, 5));
  EXPECT(b, kvs_free(b, 5), KVS_ENOENT);
  CHECK_OK(b, kvs_free(b, 6));
  EXPECT(b, kvs_free(b, 6), KVS_ENOENT);
  observe("request errors");

  /* Session a's request was never touched by b. */
  itest_check_pool(obs, 3, obs_nfull + 1 + 2, 2);
  CHECK_OK(a, kvs_free(a, 77));
  kvs_close(a);
  kvs_close(b);
}

int main(void) {
  int my_fds = itest_fd_count(0);
  static const char *const opts[] = {"--num-layers", "2", "--head-dim", "16",
                                     "--pool-blocks", "256", NULL};
  itest_daemon_start(&d, opts);
  obs = itest_connect(&d, "observer");
  uint32_t bs = kvs_layout_of(obs)->block_size;
  obs_nfull = 4;
  obs_n = obs_nfull * bs + 2;
  for (uint32_t i = 0; i < obs_n; i++)
    obs_tok[i] = 3000 + i * 3;
  kvs_alloc_result ar;
  CHECK_OK(obs, kvs_lookup(obs, 1, obs_tok, obs_n, NULL, 0, NULL));
  CHECK_OK(obs, kvs_allocate(obs, 1, obs_n, &ar));
  memcpy(obs_blocks, ar.blocks, ar.num_blocks * sizeof(uint32_t));
  for (uint32_t i = 0; i < obs_nfull; i++)
    memset(kvs_block_ptr(obs, obs_blocks[i]), 0x5A ^ i,
           kvs_layout_of(obs)->block_stride);
  CHECK_OK(obs, kvs_commit(obs, 1, 0, NULL, obs_n, NULL, 0, NULL));

  printf("frame-level:\n");
  frame_cases();
  printf("compact frames:\n");
  compact_cases();
  printf("request-level:\n");
  request_cases();

  kvs_stats st;
  CHECK_OK(obs, kvs_stats_get(obs, 1, &st));
  CHECK(st.protocol_errors >= 12);
  itest_check_pool(obs, 1, obs_nfull + 1, 1);
  CHECK_OK(obs, kvs_free(obs, 1));
  kvs_close(obs);
  itest_daemon_finish(&d, my_fds);
  printf("test_badinput: ok (%d cases observed, %llu protocol errors "
         "counted)\n",
         cases, (unsigned long long)st.protocol_errors);
  return 0;
}
