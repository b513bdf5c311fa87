/*
 * test_limits — every request the limits allow is served, and no refusal of
 * a well-formed frame costs the client its session.
 *
 * Against a daemon with the default max_frame (16 MiB) and max_batch_ops
 * (16384):
 * - through libkvshare: Batches of 14000 and 16384 empty Pings (the smallest
 *   op with a result) and 16384 Frees of unknown ids (every op failing:
 *   the first 16 carry the daemon's message, the others their code); 16385
 *   Pings refused whole with ELIMIT; 16384 Commits filling max_frame; after
 *   each, the same client goes on;
 * - raw frames: max_batch_ops empty ops (2 bytes each on the wire), a frame
 *   of exactly max_frame bytes, and a frame whose decode would take far
 *   more memory than any legal one (refused with ELIMIT and its seq, the
 *   connection alive);
 * - frame_timeout_ms: a peer that stops in the middle of a frame is
 *   closed; one that sends a frame slowly but steadily is served.
 * Against a daemon with max_frame 1 MiB: a Batch whose reply could exceed
 * max_frame is refused before any of its ops runs (its Lookup did not
 * create the request); a Ping of nearly max_frame is echoed.
 * Both end with the pool and fd checks.
 */
#include <poll.h>
#include <string.h>
#include <unistd.h>

#include "kvs_frame.h"
#include "tests/integration/itest.h"

#define OPS 16384u

static itest_daemon d;

static void expect_reply(int fd, uint64_t seq, int code, const char *what) {
  Kvshare__Envelope *e = itest_raw_recv(fd);
  const Kvshare__Status *st;

  CHECK(e != NULL);
  CHECK(e->body_case == KVSHARE__ENVELOPE__BODY_RESPONSE);
  st = e->response->status;
  if (e->seq != seq || (st ? st->code : 0) != code) {
    fprintf(stderr, "%s: seq %llu status %s, wanted seq %llu %s\n", what,
            (unsigned long long)e->seq, kvs_status_name(st ? st->code : 0),
            (unsigned long long)seq, kvs_status_name(code));
    exit(1);
  }
  if (code)
    CHECK(st->message && st->message[0]);
  printf("  %-44s -> %s%s%s\n", what, kvs_status_name(code),
         code ? ": " : "", code ? st->message : "");
  kvs_envelope_free(e);
}

static void library_batches(void) {
  kvs_client *c = itest_connect(&d, "limits");
  kvs_batch *b;
  uint32_t sizes[2] = {14000, OPS}, *tokens, n;

  CHECK(kvs_batch_new(&b) == 0);
  for (int k = 0; k < 2; k++) {
    kvs_batch_reset(b);
    for (uint32_t i = 0; i < sizes[k]; i++)
      CHECK(kvs_batch_ping(b, NULL, 0) == (int)i);
    CHECK_OK(c, kvs_batch_submit(c, b));
    for (uint32_t i = 0; i < sizes[k]; i++)
      CHECK(kvs_batch_status(b, i) == 0);
    CHECK_OK(c, kvs_ping(c, "x", 1));
    printf("  %-44s -> OK\n", sizes[k] == OPS ? "16384 pings (max_batch_ops)"
                                              : "14000 pings");
  }
  /* One op too many: refused whole, the session goes on.  (An op added
   * after a submit starts a new batch.) */
  for (uint32_t i = 0; i <= OPS; i++)
    CHECK(kvs_batch_ping(b, NULL, 0) == (int)i);
  CHECK_RC(c, kvs_batch_submit(c, b), KVS_ELIMIT);
  printf("  %-44s -> ELIMIT: %s\n", "16385 pings", kvs_last_message(c));
  CHECK_OK(c, kvs_ping(c, "x", 1));

  /* Every op failing: the reply stays small, every code is there. */
  kvs_batch_reset(b);
  for (uint32_t i = 0; i < OPS; i++)
    CHECK(kvs_batch_free_req(b, 1000000 + i) == (int)i);
  CHECK_OK(c, kvs_batch_submit(c, b));
  for (uint32_t i = 0; i < OPS; i++) {
    CHECK(kvs_batch_status(b, i) == KVS_ENOENT);
    if (i < 16)
      CHECK(strstr(kvs_batch_message(b, i), "no such request in this") != NULL);
    else
      CHECK(strcmp(kvs_batch_message(b, i), kvs_strerror(KVS_ENOENT)) == 0);
  }
  printf("  %-44s -> ENOENT each; \"%s\" / \"%s\"\n", "16384 frees of unknown ids",
         kvs_batch_message(b, 0), kvs_batch_message(b, OPS - 1));
  CHECK_OK(c, kvs_ping(c, "x", 1));

  /* max_batch_ops of a big op, the frame just under max_frame. */
  n = 1000;
  tokens = calloc(n, sizeof(*tokens));
  CHECK(tokens);
  for (uint32_t i = 0; i < n; i++)
    tokens[i] = i & 0x7f;
  kvs_batch_reset(b);
  for (uint32_t i = 0; i < OPS; i++)
    CHECK(kvs_batch_commit(b, 5000000 + i, 0, tokens, n, NULL, 0) == (int)i);
  CHECK_OK(c, kvs_batch_submit(c, b));
  for (uint32_t i = 0; i < OPS; i++)
    CHECK(kvs_batch_status(b, i) == KVS_ENOENT);
  printf("  %-44s -> ENOENT each\n", "16384 commits of 1000 tokens (16 MB)");
  CHECK_OK(c, kvs_ping(c, "x", 1));
  free(tokens);
  kvs_batch_free(b);
  kvs_close(c);
}


/* Request { Batch { n empty ops } } by hand: 2 bytes an op. */
static void raw_empty_ops(int fd, uint32_t n) {
  size_t len = 0, cap = 2 * (size_t)n + 64, body = 2 * (size_t)n;
  uint8_t *p = malloc(KVS_FRAME_HEADER_SIZE + cap), *q;

  CHECK(p);
  q = p + KVS_FRAME_HEADER_SIZE;
  q[len++] = 0x08; /* seq = 77 */
  q[len++] = 77;
  q[len++] = (4 << 3) | 2; /* Envelope.request */
  {
    uint8_t tmp[10];

    len += itest_put_varint(q + len, body + 1 + itest_put_varint(tmp, body));
  }
  q[len++] = (9 << 3) | 2; /* Request.batch */
  len += itest_put_varint(q + len, body);
  for (uint32_t i = 0; i < n; i++) {
    q[len++] = (1 << 3) | 2; /* Batch.ops: an empty Request */
    q[len++] = 0;
  }
  kvs_frame_header_encode(p, (uint32_t)len);
  itest_raw_send(fd, p, KVS_FRAME_HEADER_SIZE + len);
  free(p);
}

static void raw_frames(void) {
  int fd = itest_raw_session(&d);
  Kvshare__Envelope *e;

  /* max_batch_ops empty ops: each answered EUNKNOWN, the first 16 with a
   * message. */
  raw_empty_ops(fd, OPS);
  e = itest_raw_recv(fd);
  CHECK(e && e->seq == 77 && e->response);
  CHECK(e->response->result_case == KVSHARE__RESPONSE__RESULT_BATCH);
  CHECK(e->response->batch->n_replies == OPS);
  for (uint32_t i = 0; i < OPS; i++) {
    const Kvshare__Status *st = e->response->batch->replies[i]->status;

    CHECK(st && st->code == KVS_EUNKNOWN);
    CHECK((i < 16) == (st->message && st->message[0] != '\0'));
  }
  kvs_envelope_free(e);
  printf("  %-44s -> EUNKNOWN each\n", "16384 empty ops (32 KB)");
  itest_raw_alive(fd);
  printf("  %-44s -> OK\n", "ping after it");

  /* A frame of exactly max_frame bytes: a Commit of 1-byte tokens. */
  {
    size_t n = KVS_FRAME_MAX_DEFAULT - 32, len;
    uint32_t *tok = calloc(n, sizeof(*tok));
    Kvshare__Commit cm = KVSHARE__COMMIT__INIT;
    Kvshare__Request r = KVSHARE__REQUEST__INIT;
    Kvshare__Envelope env = KVSHARE__ENVELOPE__INIT;

    CHECK(tok);
    cm.req_id = 31337;
    cm.tokens = tok;
    r.op_case = KVSHARE__REQUEST__OP_COMMIT;
    r.commit = &cm;
    env.seq = 78;
    env.body_case = KVSHARE__ENVELOPE__BODY_REQUEST;
    env.request = &r;
    /* One token is one byte: step the count until the payload is exact. */
    for (int k = 0; k < 8; k++) {
      cm.n_tokens = n;
      len = kvshare__envelope__get_packed_size(&env);
      if (len == KVS_FRAME_MAX_DEFAULT)
        break;
      n += KVS_FRAME_MAX_DEFAULT - (long)len;
    }
    CHECK(kvshare__envelope__get_packed_size(&env) == KVS_FRAME_MAX_DEFAULT);
    itest_raw_send_env(fd, &env);
    expect_reply(fd, 78, KVS_ENOENT, "a frame of exactly max_frame");
    free(tok);
  }
  itest_raw_alive(fd);
  printf("  %-44s -> OK\n", "ping after it");

  /* A million `request {}` merged into one: 2 MB whose decode would take
   * over 100 MB.  Refused before decoding, answered with its seq. */
  {
    size_t n = 1u << 20, len = 0;
    uint8_t *p = malloc(KVS_FRAME_HEADER_SIZE + 2 * n + 8), *q;

    CHECK(p);
    q = p + KVS_FRAME_HEADER_SIZE;
    q[len++] = 0x08;
    q[len++] = 79;
    for (size_t i = 0; i < n; i++) {
      q[len++] = (4 << 3) | 2;
      q[len++] = 0;
    }
    kvs_frame_header_encode(p, (uint32_t)len);
    itest_raw_send(fd, p, KVS_FRAME_HEADER_SIZE + len);
    free(p);
    expect_reply(fd, 79, KVS_ELIMIT, "2 MB decoding to > 100 MB");
  }
  itest_raw_alive(fd);
  printf("  %-44s -> OK\n", "ping after it");
  close(fd);
}

/* Waits up to 10 s for the daemon to close fd; the reply before the close
 * must be EPROTO.  Returns the seconds it took. */
static double expect_closed(int fd, const char *what) {
  double t0 = itest_now();
  Kvshare__Envelope *e = itest_raw_recv(fd);
  uint8_t b;

  CHECK(e && e->body_case == KVSHARE__ENVELOPE__BODY_RESPONSE);
  CHECK(e->response->status && e->response->status->code == KVS_EPROTO);
  printf("  %-44s -> EPROTO: %s; closed\n", what,
         e->response->status->message);
  kvs_envelope_free(e);
  CHECK(itest_raw_read(fd, &b, 1) == -1);
  return itest_now() - t0;
}

static void frame_timeout(void) {
  uint8_t frame[KVS_FRAME_HEADER_SIZE + 64];
  Kvshare__Ping p = KVSHARE__PING__INIT;
  Kvshare__Request r = KVSHARE__REQUEST__INIT;
  Kvshare__Envelope env = KVSHARE__ENVELOPE__INIT;
  size_t len;
  int fd;

  p.payload.data = (uint8_t *)"0123456789012345678901234567890123456789";
  p.payload.len = 40;
  r.op_case = KVSHARE__REQUEST__OP_PING;
  r.ping = &p;
  env.seq = 5;
  env.body_case = KVSHARE__ENVELOPE__BODY_REQUEST;
  env.request = &r;
  len = (size_t)kvs_frame_pack_into(&env, KVS_FRAME_MAX_DEFAULT, frame,
                                    sizeof frame);
  CHECK(len > KVS_FRAME_HEADER_SIZE + 40);

  /* Half a frame, then silence: closed after about frame_timeout_ms. */
  fd = itest_raw_session(&d);
  itest_raw_send(fd, frame, len / 2);
  CHECK(expect_closed(fd, "half a frame, then silence") < 8.0);
  close(fd);

  /* A frame a few bytes at a time over more than the timeout: served. */
  fd = itest_raw_session(&d);
  for (size_t off = 0; off < len; off += 8) {
    itest_raw_send(fd, frame + off, len - off < 8 ? len - off : 8);
    usleep(150 * 1000);
  }
  expect_reply(fd, 5, 0, "a frame over 1 s, 8 bytes per 150 ms");
  close(fd);
}

/* A daemon with a 1 MiB max_frame: replies that might not fit. */
static void reply_bounds(void) {
  static const char *const opts[] = {"--num-layers", "2", "--head-dim", "16",
                                     "--pool-blocks", "256", "--max-frame",
                                     "1M", NULL};
  itest_daemon d2;
  int my_fds = itest_fd_count(0);
  kvs_client *c;
  kvs_batch *b;
  uint32_t tok[64];
  void *big;

  itest_daemon_start(&d2, opts);
  c = itest_connect(&d2, "bounds");
  for (int i = 0; i < 64; i++)
    tok[i] = 100 + (uint32_t)i;
  CHECK(kvs_batch_new(&b) == 0);
  /* A Lookup creating request 1, then Allocates that could each return
   * the whole pool: 4000 * 256 block ids do not fit 1 MiB. */
  CHECK(kvs_batch_lookup(b, 1, tok, 64, NULL, 0) == 0);
  for (int i = 0; i < 4000; i++)
    kvs_batch_allocate(b, 1, 1u << 30);
  CHECK_RC(c, kvs_batch_submit(c, b), KVS_ETOOBIG);
  printf("  %-44s -> ETOOBIG: %s\n", "4000 allocates of the whole pool",
         kvs_last_message(c));
  /* None of it ran: request 1 was never created. */
  CHECK_RC(c, kvs_free(c, 1), KVS_ENOENT);
  /* The same Lookup alone runs. */
  CHECK_OK(c, kvs_lookup(c, 1, tok, 64, NULL, 0, NULL));
  CHECK_OK(c, kvs_free(c, 1));
  /* A Ping of nearly max_frame: its echo fits (a Ping changes nothing,
   * so it is never refused ahead; it would get ETOOBIG after). */
  big = calloc(1, (1u << 20) - 64);
  CHECK(big);
  CHECK_OK(c, kvs_ping(c, big, (1u << 20) - 64));
  printf("  %-44s -> OK\n", "a ping of max_frame - 64 bytes");
  free(big);
  kvs_batch_free(b);
  kvs_close(c);
  itest_daemon_finish(&d2, my_fds);
}

int main(void) {
  int my_fds = itest_fd_count(0);
  static const char *const opts[] = {"--num-layers", "2", "--head-dim", "16",
                                     "--pool-blocks", "256",
                                     "--frame-timeout-ms", "400", NULL};

  itest_daemon_start(&d, opts);
  printf("batches through libkvshare:\n");
  library_batches();
  printf("raw frames:\n");
  raw_frames();
  printf("frame_timeout_ms 400:\n");
  frame_timeout();
  {
    kvs_client *c = itest_connect(&d, "check");

    itest_check_pool(c, 1, 0, 0);
    kvs_close(c);
  }
  itest_daemon_finish(&d, my_fds);
  printf("max_frame 1 MiB:\n");
  reply_bounds();
  printf("test_limits: ok\n");
  return 0;
}
