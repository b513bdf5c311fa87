/*
 * test_fuzz_daemon — a real kvshared under fire.  Several connections throw
 * thousands of mutated valid frames, misframed headers and garbage at it
 * (some read their replies, some never do, some vanish mid-frame), a flood
 * of connections goes over max_connections, and a few hand-made hostile
 * frames arrive, while well-behaved clients run lookup / allocate / write /
 * commit / hit / free cycles whose every result is checked, including the
 * bytes they wrote into their blocks.  At the end: Stats{check} must report
 * a sound pool with every block back and no request left, the daemon's fd
 * table must be back to its size at start, and SIGTERM must end it with
 * status 0.
 *
 * Bounded in count and time; loopback Unix socket in a private temporary
 * folder only.  KVS_BUILD names the build folder (run-tests.sh sets it).
 *   test_fuzz_daemon [SEED]
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvs_frame.h"
#include "kvs_layout.h"
#include "kvs_shm.h"
#include "tests/fuzz/fuzz_gen.h"

#define POOL_BLOCKS 256
#define BLOCK_SIZE 4
#define MAX_CONN 24
#define MAX_FRAME (256u << 10)
#define FUZZERS 6
#define FUZZ_FRAMES 20000 /* per fuzzing process */
#define GOOD 2
#define GOOD_CYCLES 400
#define CHILD_SECONDS 20 /* a child stops early past this */

static char dir[64], sock_path[100];
static pid_t daemon_pid;
static unsigned long seed = 7;

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fail(const char *fmt, ...) {
  va_list ap;

  fprintf(stderr, "[%d] FAIL: ", (int)getpid());
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  exit(1);
}

static double now(void) {
  struct timespec ts;

  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void start_daemon(void) {
  const char *build = getenv("KVS_BUILD");
  char bin[512], log[128], pool[16], maxc[16], maxf[16];
  int pfd[2];
  char buf[16];
  ssize_t n;

  snprintf(bin, sizeof(bin), "%s/kvshared", build ? build : "build");
  snprintf(log, sizeof(log), "%s/daemon.log", dir);
  snprintf(pool, sizeof(pool), "%d", POOL_BLOCKS);
  snprintf(maxc, sizeof(maxc), "%d", MAX_CONN);
  snprintf(maxf, sizeof(maxf), "%u", MAX_FRAME);
  if (pipe(pfd) < 0)
    fail("pipe: %s", strerror(errno));
  daemon_pid = fork();
  if (daemon_pid < 0)
    fail("fork: %s", strerror(errno));
  if (daemon_pid == 0) {
    int lfd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);

    close(pfd[0]);
    if (lfd >= 0) {
      dup2(lfd, 2);
      close(lfd);
    }
    dup2(pfd[1], 3);
    if (pfd[1] != 3)
      close(pfd[1]);
    execl(bin, bin, "--socket", sock_path, "--ready-fd", "3",
          "--exit-with-parent", "--pool-blocks", pool, "--block-size", "4",
          "--num-layers", "1", "--num-kv-heads", "1", "--head-dim", "8",
          "--max-connections", maxc, "--max-requests", "64",
          "--max-batch-ops", "64", "--max-frame", maxf,
          "--max-session-tokens", "20000", "--handshake-timeout-ms", "500",
          "--max-queued-bytes", "4M", "--host-tier-bytes", "512K",
          /* (its fds are counted through /proc/PID/fd: root always may,
           * another uid only while the daemon is dumpable) */
          "--dumpable", geteuid() == 0 ? "no" : "yes", "--log-level",
          getenv("FUZZ_LOG") ? "debug" : "info", (char *)NULL);
    _exit(127);
  }
  close(pfd[1]);
  n = read(pfd[0], buf, sizeof(buf));
  close(pfd[0]);
  if (n < 5 || strncmp(buf, "ready", 5) != 0)
    fail("kvshared (%s) did not start; see %s", bin, log);
}

static int count_fds(pid_t pid) {
  char path[64];
  struct dirent *e;
  DIR *d;
  int n = 0;

  snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
  d = opendir(path);
  if (!d)
    return -1;
  while ((e = readdir(d)))
    if (e->d_name[0] != '.')
      n++;
  closedir(d);
  return n;
}

static int connect_daemon(int nonblock) {
  struct sockaddr_un sa;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

  if (fd < 0)
    fail("socket: %s", strerror(errno));
  memset(&sa, 0, sizeof(sa));
  sa.sun_family = AF_UNIX;
  snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock_path);
  if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
    fail("connect: %s", strerror(errno));
  if (nonblock)
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  return fd;
}

/* Sends everything within timeout_ms (the socket may be non-blocking).
 * 0, or -1 on a timeout or an error (the daemon may have closed). */
static int send_all(int fd, const uint8_t *p, size_t len, int timeout_ms) {
  double end = now() + timeout_ms / 1000.0;

  while (len) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);

    if (n > 0) {
      p += n;
      len -= (size_t)n;
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EINTR)
      return -1;
    {
      struct pollfd pf = {fd, POLLOUT, 0};
      int left = (int)((end - now()) * 1000);

      if (left <= 0 || poll(&pf, 1, left) <= 0)
        return -1;
    }
  }
  return 0;
}

/* Reads exactly len bytes (blocking, 20 s at most). */
static void recv_all(int fd, uint8_t *p, size_t len) {
  while (len) {
    struct pollfd pf = {fd, POLLIN, 0};
    ssize_t n;

    if (poll(&pf, 1, 20000) <= 0)
      fail("no reply from the daemon in 20 s");
    n = recv(fd, p, len, 0);
    if (n <= 0)
      fail("the daemon closed the connection (%s)",
           n < 0 ? strerror(errno) : "EOF");
    p += n;
    len -= (size_t)n;
  }
}

static Kvshare__Envelope *recv_env(int fd) {
  uint8_t hdr[KVS_FRAME_HEADER_SIZE], *buf;
  kvs_frame_header h;
  Kvshare__Envelope *env;

  recv_all(fd, hdr, sizeof(hdr));
  if (kvs_frame_header_decode(hdr, 64u << 20, &h) < 0)
    fail("a bad frame header from the daemon");
  buf = malloc(h.length + 1);
  if (!buf)
    fail("out of memory");
  recv_all(fd, buf, h.length);
  if (kvs_envelope_unpack(buf, h.length, 0, &env) < 0)
    fail("an undecodable reply from the daemon");
  free(buf);
  return env;
}

static void send_env(int fd, const Kvshare__Envelope *env) {
  uint8_t *buf;
  size_t len;

  if (kvs_frame_pack(env, UINT32_MAX, &buf, &len) < 0)
    fail("pack");
  if (send_all(fd, buf, len, 20000) < 0)
    fail("send: %s", strerror(errno));
  free(buf);
}

/* Hello; the Welcome and its fds.  Returns the memfd (or -1 when not
 * wanted: then the fds are closed). */
static Kvshare__Envelope *handshake(int fd, int *pool_fd) {
  uint8_t payload[256], frame[300], hdr[KVS_FRAME_HEADER_SIZE], *buf;
  size_t len = fz_hello(1, payload, sizeof(payload));
  kvs_frame_header h;
  Kvshare__Envelope *env;
  int fds[KVS_FRAME_MAX_FDS], nfds = 0, i;
  ssize_t n;

  kvs_frame_header_encode(frame, (uint32_t)len);
  memcpy(frame + KVS_FRAME_HEADER_SIZE, payload, len);
  if (send_all(fd, frame, KVS_FRAME_HEADER_SIZE + len, 20000) < 0)
    fail("sending Hello");
  n = kvs_recv_fds(fd, hdr, sizeof(hdr), fds, KVS_FRAME_MAX_FDS, &nfds);
  if (n < 0)
    fail("recvmsg: %s", strerror((int)-n));
  if (n < (ssize_t)sizeof(hdr))
    recv_all(fd, hdr + n, sizeof(hdr) - (size_t)n);
  if (kvs_frame_header_decode(hdr, 64u << 20, &h) < 0)
    fail("a bad Welcome header");
  buf = malloc(h.length + 1);
  recv_all(fd, buf, h.length);
  if (kvs_envelope_unpack(buf, h.length, 0, &env) < 0 ||
      env->body_case != KVSHARE__ENVELOPE__BODY_WELCOME)
    fail("no Welcome");
  free(buf);
  for (i = 0; i < nfds; i++)
    if (!pool_fd || i > 0)
      close(fds[i]);
  if (pool_fd)
    *pool_fd = nfds ? fds[0] : -1;
  return env;
}

/* A connection with its handshake done, retrying while the daemon answers
 * ELIMIT (closes of other sessions are seen asynchronously). */
static int connect_hello(void) {
  int fd, tries;

  for (tries = 0;; tries++) {
    Kvshare__Envelope *w;
    int code;

    fd = connect_daemon(0);
    w = handshake(fd, NULL);
    code = w->welcome->status->code;
    kvs_envelope_free(w);
    if (code == 0)
      return fd;
    close(fd);
    if (code != KVS_ELIMIT || tries == 500)
      fail("handshake: %s", kvs_status_name(code));
    usleep(10000);
  }
}

/* ---- the fuzzing connections -------------------------------------- */

static void drain_replies(int fd) {
  uint8_t buf[65536];

  while (recv(fd, buf, sizeof(buf), MSG_DONTWAIT) > 0)
    ;
}

static void fuzzer(unsigned id) {
  double stop = now() + CHILD_SECONDS;
  size_t cap = MAX_FRAME + 1024;
  uint8_t *buf = malloc(cap);
  unsigned sent = 0;
  uint64_t seq = 1;
  fz_rng r;

  fz_seed(&r, seed * 1000 + id);
  while (sent < FUZZ_FRAMES && now() < stop) {
    int fd = connect_daemon(1);
    int reader = fz_below(&r, 4) != 0; /* some never read their replies */
    int in_sync = fz_below(&r, 10) < 7;  /* most keep the framing intact */
    unsigned k, burst = 1 + fz_below(&r, 300);

    if (fz_below(&r, 10)) { /* usually a proper Hello first */
      size_t len = fz_hello(seq++, buf + KVS_FRAME_HEADER_SIZE, 256);

      kvs_frame_header_encode(buf, (uint32_t)len);
      send_all(fd, buf, KVS_FRAME_HEADER_SIZE + len, 1000);
    }
    for (k = 0; k < burst && sent < FUZZ_FRAMES; k++) {
      size_t len = fz_frame(&r, seq++, buf, cap, in_sync);

      if (send_all(fd, buf, len, reader ? 2000 : 200) < 0)
        break; /* closed by the daemon, or it stopped reading us */
      sent++;
      if (reader)
        drain_replies(fd);
    }
    switch (fz_below(&r, 4)) {
    case 0: { /* vanish in the middle of a frame */
      size_t len = fz_frame(&r, seq++, buf, cap, 1);

      send_all(fd, buf, len / 2 + 1, 200);
      break;
    }
    case 1: /* a polite close: read to the end */
      shutdown(fd, SHUT_WR);
      if (reader) {
        struct pollfd pf = {fd, POLLIN, 0};

        while (poll(&pf, 1, 2000) > 0 &&
               recv(fd, buf, cap, MSG_DONTWAIT) > 0)
          ;
      }
      break;
    default:
      break;
    }
    close(fd);
  }
  free(buf);
  exit(0);
}

/* ---- the well-behaved clients -------------------------------------- */

struct good {
  int fd;
  uint64_t seq;
  uint8_t *base;
  uint64_t stride;
  unsigned id;
};

static Kvshare__Envelope *call(struct good *g, Kvshare__Request *req) {
  Kvshare__Envelope env, *rep;

  kvshare__envelope__init(&env);
  env.seq = ++g->seq;
  env.body_case = KVSHARE__ENVELOPE__BODY_REQUEST;
  env.request = req;
  send_env(g->fd, &env);
  rep = recv_env(g->fd);
  if (rep->seq != g->seq)
    fail("reply seq %llu, expected %llu", (unsigned long long)rep->seq,
         (unsigned long long)g->seq);
  if (rep->body_case != KVSHARE__ENVELOPE__BODY_RESPONSE ||
      !rep->response->status)
    fail("not a Response");
  return rep;
}

static void expect_ok(const Kvshare__Response *r, const char *what) {
  if (r->status->code != 0)
    fail("%s: %s (%s)", what, kvs_status_name(r->status->code),
         r->status->message);
}

/* The stamp a good client writes into the first bytes of a block. */
static void stamp(struct good *g, uint32_t b, uint64_t v) {
  memcpy(g->base + (uint64_t)b * g->stride, &v, sizeof(v));
}

static uint64_t read_stamp(struct good *g, uint32_t b) {
  uint64_t v;

  memcpy(&v, g->base + (uint64_t)b * g->stride, sizeof(v));
  return v;
}

static int good_cycle(struct good *g, unsigned cycle) {
  uint32_t tokens[64], blocks[16], n = 9 + (cycle * 7 + g->id) % 12, nb, i;
  uint8_t salt[8];
  uint64_t a = 1000 + cycle * 2, b = a + 1;
  Kvshare__Request req;
  Kvshare__Lookup lk;
  Kvshare__Allocate al;
  Kvshare__Commit cm;
  Kvshare__Free fr;
  Kvshare__Envelope *rep;
  uint32_t hit, expect_hit = (n - 1) / BLOCK_SIZE * BLOCK_SIZE;
  int ok = 1;

  for (i = 0; i < n; i++)
    tokens[i] = g->id * 100000 + (cycle % 5) * 1000 + i;
  memset(salt, 0x40 + (int)g->id, sizeof(salt)); /* nobody else's cache */

  /* Lookup A: a hit only on this client's own earlier cycles. */
  kvshare__request__init(&req);
  kvshare__lookup__init(&lk);
  lk.req_id = a;
  lk.n_tokens = n;
  lk.tokens = tokens;
  lk.salt.data = salt;
  lk.salt.len = sizeof(salt);
  req.op_case = KVSHARE__REQUEST__OP_LOOKUP;
  req.lookup = &lk;
  rep = call(g, &req);
  expect_ok(rep->response, "lookup A");
  hit = rep->response->lookup->hit_tokens;
  if (hit % BLOCK_SIZE || hit > expect_hit ||
      rep->response->lookup->n_blocks != hit / BLOCK_SIZE)
    fail("lookup A: hit %u of %u tokens, %zu blocks", hit, n,
         rep->response->lookup->n_blocks);
  for (i = 0; i < hit / BLOCK_SIZE; i++) {
    blocks[i] = rep->response->lookup->blocks[i];
    /* A cached block holds what this client wrote for that position. */
    if (read_stamp(g, blocks[i]) != ((uint64_t)g->id << 48 |
                                     (uint64_t)(cycle % 5) << 32 | i))
      fail("lookup A: block %u (index %u) does not hold what was written "
           "there", blocks[i], i);
  }
  kvs_envelope_free(rep);

  /* Allocate the rest; under the fuzzers' pressure ENOSPC is an answer. */
  kvshare__allocate__init(&al);
  al.req_id = a;
  al.num_tokens = n - hit;
  kvshare__request__init(&req);
  req.op_case = KVSHARE__REQUEST__OP_ALLOCATE;
  req.allocate = &al;
  rep = call(g, &req);
  if (rep->response->status->code == KVS_ENOSPC) {
    ok = 0;
  } else {
    expect_ok(rep->response, "allocate A");
    nb = (n + BLOCK_SIZE - 1) / BLOCK_SIZE;
    if (rep->response->alloc->first_index != hit / BLOCK_SIZE ||
        rep->response->alloc->n_blocks != nb - hit / BLOCK_SIZE)
      fail("allocate A: first_index %u, %zu blocks",
           rep->response->alloc->first_index, rep->response->alloc->n_blocks);
    for (i = hit / BLOCK_SIZE; i < nb; i++) {
      uint32_t blk = rep->response->alloc->blocks[i - hit / BLOCK_SIZE];
      uint32_t j;

      if (blk >= POOL_BLOCKS)
        fail("allocate A: block %u out of range", blk);
      for (j = 0; j < i; j++)
        if (blocks[j] == blk)
          fail("allocate A: block %u twice in one table", blk);
      blocks[i] = blk;
      stamp(g, blk, (uint64_t)g->id << 48 | (uint64_t)(cycle % 5) << 32 | i);
    }
  }
  kvs_envelope_free(rep);

  if (ok) {
    /* Commit what was written. */
    kvshare__commit__init(&cm);
    cm.req_id = a;
    cm.start = hit;
    cm.tokens = tokens + hit;
    cm.n_tokens = n - hit;
    kvshare__request__init(&req);
    req.op_case = KVSHARE__REQUEST__OP_COMMIT;
    req.commit = &cm;
    rep = call(g, &req);
    expect_ok(rep->response, "commit A");
    if (rep->response->commit->sealed != n / BLOCK_SIZE - hit / BLOCK_SIZE)
      fail("commit A: sealed %u", rep->response->commit->sealed);
    kvs_envelope_free(rep);

    /* Lookup B, same prompt: A holds the blocks, so every full block but
     * the one with the last token must hit, and they hold what A wrote.
     * (Mostly A's blocks; but where A's lookup found its chain broken -
     * a parent dropped from the host tier while a child stayed in the pool
     * - A re-sealed blocks whose hash an older copy still holds, and B
     * gets that copy: the same bytes, written by an earlier cycle.) */
    kvshare__lookup__init(&lk);
    lk.req_id = b;
    lk.n_tokens = n;
    lk.tokens = tokens;
    lk.salt.data = salt;
    lk.salt.len = sizeof(salt);
    kvshare__request__init(&req);
    req.op_case = KVSHARE__REQUEST__OP_LOOKUP;
    req.lookup = &lk;
    rep = call(g, &req);
    expect_ok(rep->response, "lookup B");
    if (rep->response->lookup->hit_tokens != expect_hit)
      fail("lookup B: hit %u, expected %u", rep->response->lookup->hit_tokens,
           expect_hit);
    for (i = 0; i < expect_hit / BLOCK_SIZE; i++) {
      uint32_t blk = rep->response->lookup->blocks[i];

      if (read_stamp(g, blk) != ((uint64_t)g->id << 48 |
                                 (uint64_t)(cycle % 5) << 32 | i))
        fail("lookup B: block %u (index %u; A has %u) does not hold what "
             "was written there", blk, i, blocks[i]);
      if (read_stamp(g, blocks[i]) != read_stamp(g, blk))
        fail("block %u was overwritten while in use", blocks[i]);
    }
    kvs_envelope_free(rep);
  }

  /* Free both (B may not exist: ENOENT is then the right answer). */
  kvshare__free__init(&fr);
  fr.req_id = b;
  kvshare__request__init(&req);
  req.op_case = KVSHARE__REQUEST__OP_FREE;
  req.free = &fr;
  rep = call(g, &req);
  if (rep->response->status->code != (ok ? 0 : KVS_ENOENT))
    fail("free B: %s", kvs_status_name(rep->response->status->code));
  kvs_envelope_free(rep);
  fr.req_id = a;
  rep = call(g, &req);
  expect_ok(rep->response, "free A");
  kvs_envelope_free(rep);
  fr.req_id = a; /* a double free is ENOENT */
  rep = call(g, &req);
  if (rep->response->status->code != KVS_ENOENT)
    fail("double free: %s", kvs_status_name(rep->response->status->code));
  kvs_envelope_free(rep);
  return ok;
}

static void good_client(unsigned id) {
  struct good g = {0};
  Kvshare__Envelope *w;
  kvs_region reg;
  int pool_fd, done = 0;
  unsigned c;
  double stop = now() + CHILD_SECONDS;

  g.id = id;
  for (c = 0;; c++) { /* the flood may hold every slot for a moment */
    g.fd = connect_daemon(0);
    w = handshake(g.fd, &pool_fd);
    if (w->welcome->status->code != KVS_ELIMIT || c == 500)
      break;
    kvs_envelope_free(w);
    close(g.fd);
    usleep(10000);
  }
  if (w->welcome->status->code != 0 || pool_fd < 0)
    fail("welcome: %s", kvs_status_name(w->welcome->status->code));
  g.stride = w->welcome->layout->block_stride;
  if (kvs_region_map(pool_fd, w->welcome->pool->size, &reg) < 0)
    fail("mapping the pool");
  g.base = reg.base;
  kvs_envelope_free(w);
  for (c = 0; c < GOOD_CYCLES && now() < stop; c++)
    done += good_cycle(&g, c);
  if (done == 0)
    fail("no cycle of good client %u got space", id);
  kvs_region_close(&reg);
  close(g.fd);
  printf("good client %u: %u cycles, %d completed\n", id, c, done);
  exit(0);
}

/* ---- hand-made hostile input, from the parent --------------------- */

static size_t put_varint(uint8_t *p, uint64_t v) {
  size_t n = 0;

  while (v >= 0x80) {
    p[n++] = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  p[n++] = (uint8_t)v;
  return n;
}

#define FORGED "2026-01-01T00:00:00.000Z kvshared error: forged"

/* A Hello whose client_name carries a newline and a made-up log line. */
static void forged_name(void) {
  Kvshare__Envelope env, *w;
  Kvshare__Hello h;
  uint8_t hdr[KVS_FRAME_HEADER_SIZE];
  int fds[KVS_FRAME_MAX_FDS], nfds = 0, i, tries = 0, code;

again:
  kvshare__envelope__init(&env);
  kvshare__hello__init(&h);
  h.version = KVS_PROTO_VERSION;
  h.client_name = (char *)"x\n" FORGED;
  env.body_case = KVSHARE__ENVELOPE__BODY_HELLO;
  env.hello = &h;
  i = connect_daemon(0);
  send_env(i, &env);
  if (kvs_recv_fds(i, hdr, 1, fds, KVS_FRAME_MAX_FDS, &nfds) != 1)
    fail("forged name: no Welcome");
  while (nfds > 0)
    close(fds[--nfds]);
  {
    /* the rest of the Welcome, then a clean close */
    uint8_t rest[KVS_FRAME_HEADER_SIZE - 1];
    kvs_frame_header hh;
    uint8_t *body;

    recv_all(i, rest, sizeof(rest));
    memcpy(hdr + 1, rest, sizeof(rest));
    if (kvs_frame_header_decode(hdr, 1u << 20, &hh) < 0)
      fail("forged name: bad Welcome header");
    body = malloc(hh.length + 1);
    recv_all(i, body, hh.length);
    if (kvs_envelope_unpack(body, hh.length, 0, &w) < 0 ||
        w->body_case != KVSHARE__ENVELOPE__BODY_WELCOME)
      fail("forged name: no Welcome");
    code = w->welcome->status->code;
    kvs_envelope_free(w);
    free(body);
  }
  close(i);
  if (code == KVS_ELIMIT && tries++ < 500) { /* every slot taken for now */
    usleep(10000);
    goto again;
  }
  if (code != 0)
    fail("forged name: refused with %s", kvs_status_name(code));
}

/* No line of the daemon's log may be one a client wrote. */
static void check_log(void) {
  char path[160], line[4096];
  FILE *f;

  snprintf(path, sizeof(path), "%s/daemon.log", dir);
  f = fopen(path, "r");
  if (!f)
    fail("%s: %s", path, strerror(errno));
  while (fgets(line, sizeof(line), f))
    if (strncmp(line, FORGED, strlen(FORGED)) == 0)
      fail("a client forged a line of the daemon's log: %s", line);
  fclose(f);
}

/* A session that must survive these: returns its fd after a Hello. */
static void hostile(void) {
  struct good g = {0};
  Kvshare__Envelope *w, *rep;
  Kvshare__Request req;
  Kvshare__Ping ping;
  size_t cap = 200000, len = 0;
  uint8_t *buf = malloc(cap), *p;
  unsigned i;

  g.fd = connect_daemon(0);
  w = handshake(g.fd, NULL);
  kvs_envelope_free(w);

  /* Request { Batch { Request { Batch ... } } } 10000 deep (34 KB): the
   * decoder used to recurse until the stack overflowed. */
  p = buf + cap;
  for (i = 0; i < 10000; i++) {
    uint8_t h[24];
    size_t n = put_varint(h, (1 << 3) | 2);

    n += put_varint(h + n, (uint64_t)(buf + cap - p));
    p -= n;
    memcpy(p, h, n);
    n = put_varint(h, (9 << 3) | 2);
    n += put_varint(h + n, (uint64_t)(buf + cap - p));
    p -= n;
    memcpy(p, h, n);
  }
  {
    uint8_t h[24];
    size_t n = put_varint(h, (4 << 3) | 2);

    n += put_varint(h + n, (uint64_t)(buf + cap - p));
    p -= n;
    memcpy(p, h, n);
    len = (size_t)(buf + cap - p);
    p -= KVS_FRAME_HEADER_SIZE;
    kvs_frame_header_encode(p, (uint32_t)len);
  }
  if (send_all(g.fd, p, len + KVS_FRAME_HEADER_SIZE, 20000) < 0)
    fail("sending the nested frame");
  rep = recv_env(g.fd);
  if (rep->body_case != KVSHARE__ENVELOPE__BODY_RESPONSE ||
      rep->response->status->code != KVS_EPROTO)
    fail("deeply nested frame: expected EPROTO");
  kvs_envelope_free(rep);

  /* The session goes on. */
  kvshare__request__init(&req);
  kvshare__ping__init(&ping);
  ping.payload.data = (uint8_t *)"still here";
  ping.payload.len = 10;
  req.op_case = KVSHARE__REQUEST__OP_PING;
  req.ping = &ping;
  rep = call(&g, &req);
  expect_ok(rep->response, "ping after the nested frame");
  kvs_envelope_free(rep);
  /* One long prompt, then a Batch of Forks, each of which copied it: a few
   * kilobytes of input used to make the daemon allocate without bound.
   * Now the session's token budget (20000 here) refuses the fork. */
  {
    static uint32_t toks[15000];
    Kvshare__Lookup lk;
    Kvshare__Fork fk;
    Kvshare__Free fr;

    for (i = 0; i < 15000; i++)
      toks[i] = i;
    kvshare__lookup__init(&lk);
    lk.req_id = 1;
    lk.tokens = toks;
    lk.n_tokens = 15000;
    kvshare__request__init(&req);
    req.op_case = KVSHARE__REQUEST__OP_LOOKUP;
    req.lookup = &lk;
    rep = call(&g, &req);
    expect_ok(rep->response, "lookup of 15000 tokens");
    kvs_envelope_free(rep);
    kvshare__fork__init(&fk);
    fk.req_id = 1;
    fk.child_id = 2;
    kvshare__request__init(&req);
    req.op_case = KVSHARE__REQUEST__OP_FORK;
    req.fork = &fk;
    rep = call(&g, &req);
    if (rep->response->status->code != KVS_ELIMIT ||
        !strstr(rep->response->status->message, "max_session_tokens"))
      fail("fork over the session's token budget: %s (%s)",
           kvs_status_name(rep->response->status->code),
           rep->response->status->message);
    kvs_envelope_free(rep);
    kvshare__free__init(&fr);
    fr.req_id = 1;
    kvshare__request__init(&req);
    req.op_case = KVSHARE__REQUEST__OP_FREE;
    req.free = &fr;
    rep = call(&g, &req);
    expect_ok(rep->response, "free");
    kvs_envelope_free(rep);
    /* Freed, the budget is back. */
    lk.req_id = 3;
    kvshare__request__init(&req);
    req.op_case = KVSHARE__REQUEST__OP_LOOKUP;
    req.lookup = &lk;
    rep = call(&g, &req);
    expect_ok(rep->response, "lookup after the free");
    kvs_envelope_free(rep);
  }
  /* A Batch of Stats{check}: each walked the whole pool, so one frame
   * could stall the loop for max_batch_ops walks.  One runs per frame. */
  {
    Kvshare__Stats st;
    Kvshare__Request op, *ops[3] = {&op, &op, &op};
    Kvshare__Batch bt;

    kvshare__stats__init(&st);
    st.check = 1;
    kvshare__request__init(&op);
    op.op_case = KVSHARE__REQUEST__OP_STATS;
    op.stats = &st;
    kvshare__batch__init(&bt);
    bt.n_ops = 3;
    bt.ops = ops;
    kvshare__request__init(&req);
    req.op_case = KVSHARE__REQUEST__OP_BATCH;
    req.batch = &bt;
    rep = call(&g, &req);
    expect_ok(rep->response, "batch of checks");
    if (rep->response->batch->n_replies != 3 ||
        rep->response->batch->replies[0]->status->code != 0 ||
        rep->response->batch->replies[0]->stats->check != 0 ||
        rep->response->batch->replies[1]->status->code != KVS_ELIMIT ||
        rep->response->batch->replies[2]->status->code != KVS_ELIMIT)
      fail("a Batch of Stats{check}: expected one check, then ELIMIT");
    kvs_envelope_free(rep);
    /* The next frame may check again. */
    rep = call(&g, ops[0]);
    expect_ok(rep->response, "check in the next frame");
    kvs_envelope_free(rep);
  }
  close(g.fd);
  free(buf);
}

/* More connections than max_connections: the extra ones get ELIMIT. */
static void flood(void) {
  int fds[MAX_CONN + 8], i, limited = 0;

  /* A connection that never says Hello used to hold its slot for ever;
   * now it gets an EPROTO Welcome and an end of file (timeout 500 ms). */
  {
    int fd, tries;
    Kvshare__Envelope *w;
    uint8_t b;

    for (tries = 0;; tries++) { /* other sessions may hold every slot */
      fd = connect_daemon(0);
      w = recv_env(fd);
      if (w->body_case != KVSHARE__ENVELOPE__BODY_WELCOME ||
          w->welcome->status->code != KVS_ELIMIT || tries == 500)
        break;
      kvs_envelope_free(w);
      close(fd);
      usleep(10000);
    }
    if (w->body_case != KVSHARE__ENVELOPE__BODY_WELCOME ||
        w->welcome->status->code != KVS_EPROTO ||
        !strstr(w->welcome->status->message, "Hello"))
      fail("a silent connection: expected an EPROTO Welcome, got %s",
           w->body_case == KVSHARE__ENVELOPE__BODY_WELCOME
               ? kvs_status_name(w->welcome->status->code)
               : "another message");
    kvs_envelope_free(w);
    if (recv(fd, &b, 1, 0) != 0)
      fail("a silent connection: expected the daemon to close it");
    close(fd);
  }

  for (i = 0; i < MAX_CONN + 8; i++)
    fds[i] = connect_daemon(0);
  for (i = 0; i < MAX_CONN + 8; i++) {
    struct pollfd pf = {fds[i], POLLIN, 0};

    /* A refused connection is answered at once; an accepted one waits for
     * its Hello (or the handshake timeout: EPROTO). */
    if (poll(&pf, 1, i >= MAX_CONN - 1 ? 2000 : 0) > 0) {
      Kvshare__Envelope *w = recv_env(fds[i]);

      if (w->body_case != KVSHARE__ENVELOPE__BODY_WELCOME ||
          (w->welcome->status->code != KVS_ELIMIT &&
           w->welcome->status->code != KVS_EPROTO))
        fail("flood: expected an ELIMIT (or a timeout's EPROTO) Welcome");
      limited += w->welcome->status->code == KVS_ELIMIT;
      kvs_envelope_free(w);
    }
  }
  for (i = 0; i < MAX_CONN + 8; i++)
    close(fds[i]);
  /* The fuzzers and the good clients hold some of the slots meanwhile. */
  if (limited < 8)
    fail("flood: only %d of %d connections refused", limited, MAX_CONN + 8);
}

/* Four sessions pipeline big Pings and never read the echoes.  Each used
 * to be paused only at 32 MiB queued, so together they held 128 MiB of
 * the daemon's memory; with max_queued_bytes (4 MiB here) the total stays
 * near the limit. */
static void nonreaders(void) {
  enum { N = 4, PAYLOAD = 200 << 10 };
  Kvshare__Envelope env, *rep;
  Kvshare__Request req;
  Kvshare__Ping ping;
  Kvshare__Stats st;
  struct good g = {0};
  uint8_t *payload = calloc(1, PAYLOAD), *frame;
  size_t flen, sent[N] = {0};
  int fds[N], done[N] = {0}, i, progress = 1;

  kvshare__envelope__init(&env);
  kvshare__request__init(&req);
  kvshare__ping__init(&ping);
  ping.payload.data = payload;
  ping.payload.len = PAYLOAD;
  req.op_case = KVSHARE__REQUEST__OP_PING;
  req.ping = &ping;
  env.seq = 9;
  env.body_case = KVSHARE__ENVELOPE__BODY_REQUEST;
  env.request = &req;
  if (kvs_frame_pack(&env, UINT32_MAX, &frame, &flen) < 0)
    fail("pack");
  for (i = 0; i < N; i++) {
    fds[i] = connect_hello();
    fcntl(fds[i], F_SETFL, fcntl(fds[i], F_GETFL) | O_NONBLOCK);
  }
  /* Round robin until every socket stays full (64 MiB each at most); a
   * frame cut by a timeout ends that connection's sending. */
  while (progress) {
    progress = 0;
    for (i = 0; i < N; i++) {
      if (done[i] || sent[i] >= (64u << 20))
        continue;
      if (send_all(fds[i], frame, flen, 1000) == 0) {
        sent[i] += flen;
        progress = 1;
      } else {
        done[i] = 1;
      }
    }
  }
  g.fd = connect_hello();
  kvshare__request__init(&req);
  kvshare__stats__init(&st);
  req.op_case = KVSHARE__REQUEST__OP_STATS;
  req.stats = &st;
  rep = call(&g, &req);
  expect_ok(rep->response, "stats");
  printf("4 sessions that never read: %zu+%zu+%zu+%zu bytes sent, %llu bytes "
         "of replies queued in the daemon\n",
         sent[0], sent[1], sent[2], sent[3],
         (unsigned long long)rep->response->stats->queued_bytes);
  /* the limit, plus per session up to 1 MiB and a frame's reply or two */
  if (rep->response->stats->queued_bytes > (4u << 20) + N * (2u << 20))
    fail("replies queued for sessions that do not read: %llu bytes",
         (unsigned long long)rep->response->stats->queued_bytes);
  kvs_envelope_free(rep);
  close(g.fd);
  for (i = 0; i < N; i++)
    close(fds[i]);
  free(frame);
  free(payload);
}

static void final_check(int fds_at_start) {
  struct good g = {0};
  Kvshare__Envelope *w, *rep = NULL;
  Kvshare__Request req;
  Kvshare__Stats st;
  const Kvshare__StatsResult *s = NULL;
  int tries, fds = -1, status;

  g.fd = connect_daemon(0);
  w = handshake(g.fd, NULL);
  if (w->welcome->status->code != 0)
    fail("final session refused: %s",
         kvs_status_name(w->welcome->status->code));
  kvs_envelope_free(w);
  kvshare__request__init(&req);
  kvshare__stats__init(&st);
  st.check = 1;
  req.op_case = KVSHARE__REQUEST__OP_STATS;
  req.stats = &st;
  /* The daemon sees the other sessions' closes asynchronously: ask again
   * until they are gone (bounded). */
  for (tries = 0; tries < 200; tries++) {
    if (rep)
      kvs_envelope_free(rep);
    rep = call(&g, &req);
    expect_ok(rep->response, "stats");
    s = rep->response->stats;
    if (s->check != 0)
      fail("pool invariant: %s", s->check_message);
    fds = count_fds(daemon_pid);
    if (s->sessions == 1 && s->used_blocks == 0 && s->num_requests == 0 &&
        fds == fds_at_start + 1)
      break;
    usleep(10000);
  }
  printf("daemon: %llu frames, %llu protocol errors, %u sessions, %u blocks "
         "in use, %u requests, %u cached, %llu evictions, %llu no_space; fds "
         "%d (at start %d, +1 for this session)\n",
         (unsigned long long)s->frames_in,
         (unsigned long long)s->protocol_errors, s->sessions, s->used_blocks,
         s->num_requests, s->cached_blocks, (unsigned long long)s->evictions,
         (unsigned long long)s->no_space, fds, fds_at_start);
  printf("daemon: %llu swap-outs (%llu failed or cut), %llu swap-ins; %u "
         "swapped now\n", (unsigned long long)s->swap_outs,
         (unsigned long long)s->swap_failures,
         (unsigned long long)s->swap_ins, s->swapped_requests);
  if (s->sessions != 1 || s->used_blocks || s->num_requests ||
      s->swapped_requests)
    fail("blocks or requests left after every other session closed");
  if (fds != fds_at_start + 1)
    fail("the daemon's fd table: %d, expected %d", fds, fds_at_start + 1);
  if (s->frames_in < 5000) /* most frames may go unread or out of sync */
    fail("only %llu frames reached the daemon",
         (unsigned long long)s->frames_in);
  kvs_envelope_free(rep);
  close(g.fd);

  if (kill(daemon_pid, SIGTERM) < 0)
    fail("kill: %s", strerror(errno));
  if (waitpid(daemon_pid, &status, 0) < 0)
    fail("waitpid: %s", strerror(errno));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    fail("kvshared exited with status 0x%x after SIGTERM", status);
}

int main(int argc, char **argv) {
  pid_t kids[FUZZERS + GOOD];
  int i, fds_at_start, failed = 0;

  if (argc > 1)
    seed = strtoul(argv[1], NULL, 0);
  setvbuf(stdout, NULL, _IOLBF, 0);
  signal(SIGPIPE, SIG_IGN);
  snprintf(dir, sizeof(dir), "/tmp/kvs-fuzz-XXXXXX");
  if (!mkdtemp(dir))
    fail("mkdtemp: %s", strerror(errno));
  snprintf(sock_path, sizeof(sock_path), "%s/kvshared.sock", dir);
  start_daemon();
  fds_at_start = count_fds(daemon_pid);

  for (i = 0; i < FUZZERS + GOOD; i++) {
    kids[i] = fork();
    if (kids[i] < 0)
      fail("fork: %s", strerror(errno));
    if (kids[i] == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (i < FUZZERS)
        fuzzer((unsigned)i);
      good_client((unsigned)(i - FUZZERS + 1));
    }
  }
  hostile();
  forged_name();
  flood();
  nonreaders();
  for (i = 0; i < FUZZERS + GOOD; i++) {
    int status;

    if (waitpid(kids[i], &status, 0) < 0 || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0) {
      fprintf(stderr, "child %d (%s) failed: status 0x%x\n", i,
              i < FUZZERS ? "fuzzer" : "good client", status);
      failed = 1;
    }
  }
  if (failed || kill(daemon_pid, 0) < 0)
    fail("a child failed, or the daemon died (see %s/daemon.log)", dir);
  final_check(fds_at_start);
  check_log();
  printf("seed %lu: %d fuzzing connections x %d frames, %d good clients, "
         "daemon alive and whole, exit 0 on SIGTERM\n",
         seed, FUZZERS, FUZZ_FRAMES, GOOD);
  {
    char path[160];

    snprintf(path, sizeof(path), "%s/daemon.log", dir);
    unlink(path);
    rmdir(dir);
  }
  return 0;
}
