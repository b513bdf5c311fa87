/*
 * test_remote — the remote tier: blocks shared through a Redis by the
 * daemons of several "nodes" (separate pools, separate sockets).
 *
 * The test starts its own redis-server children (skip, exit 77, when there
 * is none; they are killed at exit, also after a failure, which leaves
 * their directory and logs behind) and speaks RESP to them itself to look
 * at and corrupt what the daemons stored (keys PREFIX:ROOT:HASH, values: an
 * 80-byte header, the block's token ids, the block's bytes:
 * daemon/tiers/tier_remote.h); redis-cli only creates the cluster of case 8.
 *
 * 1. Share: daemon A computes prompts (some sharing prefixes), writing
 *    recognisable bytes; once A's remote tier has answered every write
 *    (exactly one per block A sealed), daemon B looks them up: each hits its
 *    full-block prefix, every byte checked, and B's promotions and hit
 *    blocks are the model's counts.  An unseen prompt hits 0, a prompt
 *    extending a stored one hits exactly the stored part, another salt hits
 *    0, and a session with promotion off hits 0.
 * 2. Corruption: one value's data byte and another value's header byte are
 *    changed in Redis: B's lookups stop exactly before each corrupted
 *    block, the bytes before it right, each counted a checksum failure.
 * 3. A TTL: every key written with --remote-tier-ttl-ms has a PTTL in
 *    (0, ttl]; keys written without have none.  A chain whose values are
 *    more than --remote-tier-inflight-bytes: a lookup brings up the blocks
 *    that fit (not none), the next one the rest.  A server that answers
 *    and closes at once: the answers count (misses, not errors).
 * 4. A worker killed (SIGKILL) while its lookups promote from the remote
 *    tier: B's pool comes back whole.
 * 5. Redis stopped (SIGSTOP: A's writes pile up unread) then killed
 *    (SIGKILL: a reset connection) while workers compute and look up on
 *    both daemons: no lookup fails or returns a wrong byte, the logs say
 *    the store is gone, writes are counted dropped; a redis-server
 *    restarted on the same socket is found again and sharing works again.
 * 6. SIGTERM while a worker commits (writes to Redis in flight): a clean
 *    stop.
 * 7. AUTH: a daemon with the password in a file and one with it in a TCP
 *    URL share a block; one with a wrong password starts, logs the refusal
 *    and misses.  Bad URLs and a missing password file stop kvshared with a
 *    message naming the option.  The wrong password is retried with the
 *    back-off (logged once), not every 100 ms.
 * 8. Redis Cluster (when this redis-server and redis-cli can make one):
 *    three masters; a prompt of many blocks spreads over them and is shared
 *    between two daemons, every byte checked.
 * 9. Tenants on one remote server (as root: workers run as uids 40001 and
 *    40002; skipped otherwise): one daemon, tenants a and b, a server of
 *    their own.  a's worker computes prompts and waits for its writes:
 *    every key in the server is PREFIX:a:ROOT:HASH (one root), none b's
 *    or the bare prefix's.  b's worker looks them up: 0 hits, its remote
 *    tier's promotions and hit blocks 0.  The daemon restarted (SIGTERM,
 *    the same tenants and server): a's worker hits every prompt from the
 *    store, every byte a's; b's still misses, though it asks the server
 *    (its GETs, seen through MONITOR, name PREFIX:b: and another root).
 *    a's values stored under those names fail b's checks (their headers
 *    name a's root and hashes): each a checksum failure, never served.
 * Every daemon ends with itest_daemon_finish (pool invariant, no fd left
 * open by the remote tier's connections, clean exit) or, in 6, with the
 * clean exit of a SIGTERM under load.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/integration/itest.h"

#define BS 4          /* tokens per block (--block-size) */
#define STRIDE 4096   /* bytes per block: 2 layers x K,V x 4 x 64 x fp32 */
#define HDR 80        /* a value's fixed header */
#define DATA_OFF (HDR + BS * 4) /* the block's bytes, after its token ids */
#define MAXBLK 32
#define NFILL 40      /* prompts of the fill (4 full blocks each) */

/* ---- redis-server children ---------------------------------------------- */

typedef struct rsrv {
  pid_t pid;
  int port;          /* 0: none */
  char sock[108];    /* "": none (under rdir) */
  char pass[32];     /* "": no AUTH */
  char name[32];
} rsrv;

static char rdir[80];    /* sockets, logs, password files */
static pid_t owner;
static rsrv *servers[16];
static int nservers;
static pid_t workers[8]; /* running worker processes */
static itest_daemon *daemons[16]; /* started by start() */
static int ndaemons, passed;

static void rm_tree(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *e;
  char p[600];

  if (!d)
    return;
  while ((e = readdir(d))) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    unlink(p);
  }
  closedir(d);
  rmdir(dir);
}

/* A failed test (exit from CHECK) leaves no daemon, redis-server or
 * worker behind (itest.c stops the daemon started last). */
static void stop_all_at_exit(void) {
  if (getpid() != owner)
    return;
  for (int i = 0; i < ndaemons; i++)
    if (daemons[i]->pid > 0) {
      fprintf(stderr, "(stopping kvshared %d after a failure)\n",
              (int)daemons[i]->pid);
      itest_print_log(daemons[i]);
      itest_daemon_kill(daemons[i]);
    }
  if (nservers && !passed)
    fprintf(stderr, "(redis-server logs in %s)\n", rdir);
  for (int i = 0; i < 8; i++)
    if (workers[i] > 0) {
      kill(workers[i], SIGKILL);
      itest_wait(workers[i]);
      workers[i] = 0;
    }
  for (int i = 0; i < nservers; i++)
    if (servers[i]->pid > 0) {
      kill(servers[i]->pid, SIGKILL);
      itest_wait(servers[i]->pid);
      servers[i]->pid = 0;
    }
}

static int have_program(const char *name) {
  char cmd[200];
  snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", name);
  return system(cmd) == 0;
}

/* A localhost TCP port nobody listens on now (and, for a cluster node, its
 * bus port + 10000 as well). */
static int free_port(int bus) {
  for (int tries = 0; tries < 200; tries++) {
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), port;
    struct sockaddr_in a = {0};
    socklen_t al = sizeof a;

    CHECK(s >= 0);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(bind(s, (struct sockaddr *)&a, sizeof a) == 0);
    CHECK(getsockname(s, (struct sockaddr *)&a, &al) == 0);
    port = ntohs(a.sin_port);
    close(s);
    if (!bus)
      return port;
    if (port + 10000 > 65535)
      continue;
    s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    a.sin_port = htons((uint16_t)(port + 10000));
    int ok = bind(s, (struct sockaddr *)&a, sizeof a) == 0;
    close(s);
    if (ok)
      return port;
  }
  fprintf(stderr, "no free localhost port\n");
  exit(1);
}

/* ---- a minimal RESP client ---------------------------------------------- */

typedef struct rconn {
  int fd;
  size_t pos, len;
  char buf[16384];
} rconn;

typedef struct rrep {
  char type;          /* + - : $ * ('$' with str NULL: nil) */
  long long num;
  char *str;
  size_t len;
  size_t n;
  struct rrep **el;
} rrep;

static void rfree(rrep *r) {
  if (!r)
    return;
  for (size_t i = 0; i < r->n; i++)
    rfree(r->el[i]);
  free(r->el);
  free(r->str);
  free(r);
}

static int rbyte(rconn *c) {
  if (c->pos == c->len) {
    ssize_t n = recv(c->fd, c->buf, sizeof c->buf, 0);
    if (n <= 0)
      return -1;
    c->pos = 0;
    c->len = (size_t)n;
  }
  return (uint8_t)c->buf[c->pos++];
}

static int rline(rconn *c, char *out, size_t max) {
  size_t k = 0;
  int ch;

  while ((ch = rbyte(c)) >= 0 && ch != '\n')
    if (ch != '\r' && k + 1 < max)
      out[k++] = (char)ch;
  out[k] = '\0';
  return ch < 0 ? -1 : 0;
}

static rrep *rread(rconn *c) {
  char line[512];
  int t = rbyte(c);
  rrep *r;

  if (t < 0 || rline(c, line, sizeof line) < 0)
    return NULL;
  r = calloc(1, sizeof *r);
  CHECK(r);
  r->type = (char)t;
  switch (t) {
  case '+':
  case '-':
    r->str = strdup(line);
    r->len = strlen(line);
    break;
  case ':':
    r->num = strtoll(line, NULL, 10);
    break;
  case '$': {
    long long n = strtoll(line, NULL, 10);
    if (n < 0)
      break;
    r->len = (size_t)n;
    r->str = malloc(r->len + 1);
    CHECK(r->str);
    for (size_t i = 0; i < r->len + 2; i++) { /* the value and "\r\n" */
      int ch = rbyte(c);
      CHECK(ch >= 0);
      if (i < r->len)
        r->str[i] = (char)ch;
    }
    r->str[r->len] = '\0';
    break;
  }
  case '*': {
    long long n = strtoll(line, NULL, 10);
    if (n <= 0)
      break;
    r->n = (size_t)n;
    r->el = calloc(r->n, sizeof *r->el);
    CHECK(r->el);
    for (size_t i = 0; i < r->n; i++)
      CHECK((r->el[i] = rread(c)) != NULL);
    break;
  }
  default:
    rfree(r);
    return NULL;
  }
  return r;
}

static rrep *rcmdv(rconn *c, int argc, const char **argv, const size_t *argl) {
  char head[64];
  int hl = snprintf(head, sizeof head, "*%d\r\n", argc);

  CHECK(send(c->fd, head, (size_t)hl, MSG_NOSIGNAL) == hl);
  for (int i = 0; i < argc; i++) {
    hl = snprintf(head, sizeof head, "$%zu\r\n", argl[i]);
    CHECK(send(c->fd, head, (size_t)hl, MSG_NOSIGNAL) == hl);
    CHECK(send(c->fd, argv[i], argl[i], MSG_NOSIGNAL) == (ssize_t)argl[i]);
    CHECK(send(c->fd, "\r\n", 2, MSG_NOSIGNAL) == 2);
  }
  return rread(c);
}

/* A command of C strings (NULL-terminated list). */
static rrep *rcmd(rconn *c, ...) {
  const char *argv[16];
  size_t argl[16];
  int argc = 0;
  va_list ap;

  va_start(ap, c);
  while (argc < 16 && (argv[argc] = va_arg(ap, const char *)) != NULL) {
    argl[argc] = strlen(argv[argc]);
    argc++;
  }
  va_end(ap);
  return rcmdv(c, argc, argv, argl);
}

/* Connects (and AUTHs); 0, or -1 when the server does not answer. */
static int rconn_open(rconn *c, const rsrv *s) {
  memset(c, 0, sizeof *c);
  if (s->sock[0]) {
    struct sockaddr_un a = {0};
    c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    a.sun_family = AF_UNIX;
    snprintf(a.sun_path, sizeof a.sun_path, "%s", s->sock);
    if (connect(c->fd, (struct sockaddr *)&a, sizeof a) < 0)
      goto fail;
  } else {
    struct sockaddr_in a = {0};
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)s->port);
    if (connect(c->fd, (struct sockaddr *)&a, sizeof a) < 0)
      goto fail;
  }
  struct timeval tv = {10, 0};
  setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (s->pass[0]) {
    rrep *r = rcmd(c, "AUTH", s->pass, NULL);
    int ok = r && r->type == '+';
    rfree(r);
    if (!ok)
      goto fail;
  }
  return 0;
fail:
  close(c->fd);
  c->fd = -1;
  return -1;
}

static void rconn_close(rconn *c) {
  close(c->fd);
  c->fd = -1;
}

/* An integer reply of one command on a fresh connection. */
static long long redis_int(const rsrv *s, const char *cmd, const char *arg) {
  rconn c;
  CHECK(rconn_open(&c, s) == 0);
  rrep *r = rcmd(&c, cmd, arg, NULL);
  CHECK(r && r->type == ':');
  long long v = r->num;
  rfree(r);
  rconn_close(&c);
  return v;
}

/* Starts redis-server (name: its log's name) with the extra options; 0 once
 * it answers, -1 when it exits first (an option it does not know, a port
 * taken) or never answers. */
static int redis_start(rsrv *s, const char *const *extra) {
  char port[16], logp[400];
  const char *argv[40];
  int n = 0;

  snprintf(port, sizeof port, "%d", s->port);
  snprintf(logp, sizeof logp, "%s/%s.log", rdir, s->name);
  argv[n++] = "redis-server";
  argv[n++] = "--port";
  argv[n++] = port;
  argv[n++] = "--bind";
  argv[n++] = "127.0.0.1";
  argv[n++] = "--save";
  argv[n++] = "";
  argv[n++] = "--appendonly";
  argv[n++] = "no";
  argv[n++] = "--dir";
  argv[n++] = rdir;
  if (s->sock[0]) {
    argv[n++] = "--unixsocket";
    argv[n++] = s->sock;
    argv[n++] = "--unixsocketperm";
    argv[n++] = "700";
  }
  if (s->pass[0]) {
    argv[n++] = "--requirepass";
    argv[n++] = s->pass;
  }
  for (int i = 0; extra && extra[i] && n < 38; i++)
    argv[n++] = extra[i];
  argv[n] = NULL;

  if (s->sock[0])
    unlink(s->sock); /* a killed server's */
  fflush(NULL);
  s->pid = fork();
  CHECK(s->pid >= 0);
  if (s->pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int lf = open(logp, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    int nul = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (lf >= 0) {
      dup2(lf, 1);
      dup2(lf, 2);
    }
    if (nul >= 0)
      dup2(nul, 0);
    execvp("redis-server", (char *const *)argv);
    _exit(127);
  }
  int known = 0;
  for (int i = 0; i < nservers; i++)
    known |= servers[i] == s;
  if (!known) {
    CHECK(nservers < 16);
    servers[nservers++] = s;
  }
  double t0 = itest_now();
  while (itest_now() - t0 < 15) {
    rconn c;
    int st;
    if (waitpid(s->pid, &st, WNOHANG) == s->pid) {
      s->pid = 0;
      return -1;
    }
    if (rconn_open(&c, s) == 0) {
      rrep *r = rcmd(&c, "PING", NULL);
      int ok = r && r->type == '+';
      rfree(r);
      rconn_close(&c);
      if (ok)
        return 0;
    }
    usleep(10000);
  }
  kill(s->pid, SIGKILL);
  itest_wait(s->pid);
  s->pid = 0;
  return -1;
}

static void redis_start_or_fail(rsrv *s, const char *const *extra) {
  if (redis_start(s, extra) != 0) {
    char cmd[600];
    fprintf(stderr, "redis-server %s did not start; its log:\n", s->name);
    snprintf(cmd, sizeof cmd, "cat %s/%s.log >&2", rdir, s->name);
    if (system(cmd) != 0)
      fprintf(stderr, "(no log)\n");
    exit(1);
  }
}

static void redis_kill(rsrv *s) {
  if (s->pid > 0) {
    kill(s->pid, SIGKILL);
    itest_wait(s->pid);
    s->pid = 0;
  }
}

/* The keys PREFIX:* (an array reply; rfree it). */
static rrep *redis_keys(const rsrv *s, const char *prefix) {
  char pat[80];
  rconn c;
  rrep *r;

  snprintf(pat, sizeof pat, "%s:*", prefix);
  CHECK(rconn_open(&c, s) == 0);
  r = rcmd(&c, "KEYS", pat, NULL);
  CHECK(r && r->type == '*');
  rconn_close(&c);
  return r;
}

/* ---- prompts and the daemons -------------------------------------------- */

/* A prompt: full blocks with ids (the same id, the same block: a prompt
 * sharing a prefix repeats the ids of its first blocks), then `tail`
 * tokens.  Token j of block id x is x * 8 + j (a value's first token id
 * names its block). */
typedef struct prompt {
  uint32_t nblk, tail;
  uint32_t ids[MAXBLK];
} prompt;

static uint32_t prompt_tokens(const prompt *p, uint32_t *tok) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < p->nblk; i++)
    for (uint32_t j = 0; j < BS; j++)
      tok[n++] = p->ids[i] * 8 + j;
  for (uint32_t j = 0; j < p->tail; j++)
    tok[n++] = 0x70000000u + j;
  return n;
}

static prompt mkprompt(uint32_t first, uint32_t nblk, uint32_t tail) {
  prompt p = {nblk, tail, {0}};
  for (uint32_t i = 0; i < nblk; i++)
    p.ids[i] = first + i;
  return p;
}

/* The blocks a lookup of p can hit: never its last token's. */
static uint32_t hittable(const prompt *p) {
  return (p->nblk * BS + p->tail - 1) / BS;
}

static void check_blocks(kvs_client *c, const prompt *p,
                         const kvs_lookup_result *lr) {
  CHECK(lr->hit_tokens % BS == 0);
  CHECK(lr->num_blocks == lr->hit_tokens / BS);
  CHECK(lr->num_blocks <= p->nblk);
  for (uint32_t i = 0; i < lr->num_blocks; i++) {
    long bad = itest_block_bytes(c, lr->blocks[i], p->ids[i], i, 1);
    if (bad) {
      fprintf(stderr, "block %u (id %u, pool block %u): %ld wrong bytes\n",
              i, p->ids[i], lr->blocks[i], bad);
      exit(1);
    }
  }
}

/* Computes p as request id: looks it up (the hit's bytes checked),
 * allocates the rest, writes it, commits, frees.  Returns the hit (tokens),
 * or -1 when the daemon is gone and quiet is set. */
static int compute(kvs_client *c, uint64_t id, const prompt *p, int quiet) {
  uint32_t tok[MAXBLK * BS + BS], n = prompt_tokens(p, tok), h;
  kvs_lookup_result lr;
  kvs_alloc_result ar;
  int rc;

  if ((rc = kvs_lookup(c, id, tok, n, NULL, 0, &lr)) != 0 && quiet)
    return -1;
  CHECK_OK(c, rc);
  check_blocks(c, p, &lr);
  h = lr.hit_tokens;
  if ((rc = kvs_allocate(c, id, n - h, &ar)) != 0 && quiet)
    return -1;
  CHECK_OK(c, rc);
  CHECK(ar.first_index == h / BS && !ar.has_cow);
  for (uint32_t k = 0; k < ar.num_blocks; k++)
    if (ar.first_index + k < p->nblk)
      itest_block_bytes(c, ar.blocks[k], p->ids[ar.first_index + k],
                        ar.first_index + k, 0);
  if ((rc = kvs_commit(c, id, h, tok + h, n - h, NULL, 0, NULL)) != 0 &&
      quiet)
    return -1;
  CHECK_OK(c, rc);
  if ((rc = kvs_free(c, id)) != 0 && quiet)
    return -1;
  CHECK_OK(c, rc);
  return (int)h;
}

/* Looks p up (salt may be NULL), checks every byte of the hit, frees the
 * request; returns the hit in tokens. */
static uint32_t lookup(kvs_client *c, uint64_t id, const prompt *p,
                       const char *salt) {
  uint32_t tok[MAXBLK * BS + BS], n = prompt_tokens(p, tok);
  kvs_lookup_result lr;

  CHECK_OK(c, kvs_lookup(c, id, tok, n, salt, salt ? strlen(salt) : 0, &lr));
  check_blocks(c, p, &lr);
  CHECK_OK(c, kvs_free(c, id));
  return lr.hit_tokens;
}

#define CHECK_HIT(c, id, p, salt, want)                                      \
  do {                                                                       \
    uint32_t got_ = lookup(c, id, p, salt);                                  \
    if (got_ != (uint32_t)(want)) {                                          \
      fprintf(stderr, "%s:%d: lookup hit %u tokens, the model says %u\n",    \
              __FILE__, __LINE__, got_, (uint32_t)(want));                   \
      exit(1);                                                               \
    }                                                                        \
  } while (0)

static void remote_stats(kvs_client *c, kvs_tier_stats *ts) {
  kvs_tier_stats all[4];
  uint32_t n = 0;

  CHECK_OK(c, kvs_tier_stats_get(c, all, 4, &n, NULL));
  for (uint32_t i = 0; i < n && i < 4; i++)
    if (strcmp(all[i].name, "remote") == 0) {
      *ts = all[i];
      return;
    }
  fprintf(stderr, "no tier named \"remote\" among %u tiers\n", n);
  exit(1);
}

static void print_stats(const char *who, const kvs_tier_stats *t) {
  fprintf(stderr, "%s remote: demotions %llu promotions %llu hit_blocks %llu "
          "drops %llu failures %llu io_errors %llu checksum_failures %llu\n",
          who, (unsigned long long)t->demotions,
          (unsigned long long)t->promotions,
          (unsigned long long)t->hit_blocks, (unsigned long long)t->drops,
          (unsigned long long)t->failures, (unsigned long long)t->io_errors,
          (unsigned long long)t->checksum_failures);
}

/* Waits (20 s at most) until the remote tier has answered `want` writes
 * in all (demotions), or lost one (a drop or failure), then checks it is
 * exactly that many. */
static void wait_demotions(kvs_client *c, uint64_t want, const char *who) {
  kvs_tier_stats t;
  double t0 = itest_now();
  uint64_t lost;

  remote_stats(c, &t);
  lost = t.drops + t.failures;
  for (;;) {
    remote_stats(c, &t);
    if (t.demotions >= want || t.drops + t.failures > lost ||
        itest_now() - t0 > 20)
      break;
    usleep(2000);
  }
  if (t.demotions != want) {
    print_stats(who, &t);
    fprintf(stderr, "%s: %llu blocks written to the remote tier, the model "
            "says %llu\n", who, (unsigned long long)t.demotions,
            (unsigned long long)want);
    exit(1);
  }
}

static void wait_log(const itest_daemon *d, const char *what) {
  double t0 = itest_now();
  while (!itest_log_says(d, what)) {
    if (itest_now() - t0 > 20) {
      itest_print_log(d);
      fprintf(stderr, "kvshared never logged \"%s\"\n", what);
      exit(1);
    }
    usleep(5000);
  }
}

/* Waits for the daemon's connection to the store at addr ("unix:PATH",
 * "HOST:PORT"), then takes its fds as the baseline of the final leak
 * check: a connection to the store is part of the steady state (a TCP one
 * is made after the name lookup, maybe after "ready"). */
static void wait_connected(itest_daemon *d, const char *addr) {
  char what[400];
  snprintf(what, sizeof what, "remote tier %s: connected", addr);
  wait_log(d, what);
  d->start_fds = itest_fd_count(d->pid);
}

/* itest_daemon_start, the daemon d (static: stopped at exit after a
 * failure) remembered. */
static void start(itest_daemon *d, const char *const *opts) {
  int known = 0;
  itest_daemon_start(d, opts);
  for (int i = 0; i < ndaemons; i++)
    known |= daemons[i] == d;
  if (!known) {
    CHECK(ndaemons < 16);
    daemons[ndaemons++] = d;
  }
}

static char unix_addr[120], unix_url[120];
static rsrv r1; /* the shared store of cases 1 to 6 */

static void daemon_opts(const char **o, const char *url, ...) {
  static const char *base[] = {"--pool-blocks", "64", "--block-size", "4",
                               "--num-layers", "2", "--num-kv-heads", "1",
                               "--head-dim", "64", "--dtype", "fp32",
                               "--remote-tier-timeout-ms", "5000", NULL};
  int k = 0;
  va_list ap;

  for (int i = 0; base[i]; i++)
    o[k++] = base[i];
  o[k++] = "--remote-tier";
  o[k++] = url;
  va_start(ap, url);
  while ((o[k] = va_arg(ap, const char *)) != NULL)
    k++;
  va_end(ap);
}

/* ---- workers (child processes) ------------------------------------------ */

static int stop_pipe[2] = {-1, -1};

static int told_to_stop(void) {
  struct pollfd p = {stop_pipe[0], POLLIN, 0};
  return poll(&p, 1, 0) > 0;
}

static void progress(int fd) {
  char b = 1;
  if (write(fd, &b, 1) < 0 && errno != EAGAIN)
    _exit(3);
}

/* Reads n progress bytes (a worker's iterations), 30 s at most. */
static void wait_progress(int fd, int n, const char *who) {
  double t0 = itest_now();
  char b[64];
  while (n > 0) {
    struct pollfd p = {fd, POLLIN, 0};
    CHECK(itest_now() - t0 < 30);
    if (poll(&p, 1, 200) <= 0)
      continue;
    ssize_t r = read(fd, b, n < 64 ? (size_t)n : sizeof b);
    if (r <= 0) {
      fprintf(stderr, "worker %s ended early\n", who);
      exit(1);
    }
    n -= (int)r;
  }
}

typedef enum { W_LOOKUP_FILL, W_COMPUTE, W_MIXED, W_COMPUTE_QUIET } wkind;

/* A worker: W_LOOKUP_FILL looks up the fill's prompts (all in the store:
 * each must hit all 4 blocks); W_COMPUTE computes new prompts (never seen:
 * each hits 0) from id base; W_MIXED does both, but its fill lookups may
 * hit anything (the store may be down), every byte still checked;
 * W_COMPUTE_QUIET computes until the daemon goes away.  One progress byte
 * per iteration on pfd; ends (0) when told to stop. */
static pid_t worker(const itest_daemon *d, wkind kind, uint32_t base,
                    int pfd[2]) {
  CHECK(pipe(pfd) == 0);
  fflush(NULL);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid) {
    close(pfd[1]);
    for (int i = 0; i < 8; i++)
      if (workers[i] <= 0) {
        workers[i] = pid;
        break;
      }
    return pid;
  }
  close(pfd[0]);
  close(stop_pipe[1]);
  fcntl(pfd[1], F_SETFL, O_NONBLOCK);
  kvs_client *c = itest_connect(d, "remote-worker");
  for (uint32_t i = 0; !told_to_stop(); i++) {
    uint64_t id = 100000 + i;
    if (kind == W_LOOKUP_FILL || (kind == W_MIXED && i % 2 == 0)) {
      prompt p = mkprompt(20000 + ((i * 7 + base) % NFILL) * 8, 4, 1);
      uint32_t h = lookup(c, id, &p, NULL);
      if (kind == W_LOOKUP_FILL && h != 4 * BS) {
        fprintf(stderr, "worker: fill prompt hit %u tokens, not %u\n", h,
                4 * BS);
        _exit(1);
      }
    } else {
      prompt p = mkprompt(base + i * 8, 3, 1);
      int h = compute(c, id, &p, kind == W_COMPUTE_QUIET);
      if (h < 0)
        _exit(0); /* the daemon stopped */
      if (h != 0) {
        fprintf(stderr, "worker: a new prompt hit %d tokens\n", h);
        _exit(1);
      }
    }
    progress(pfd[1]);
  }
  kvs_close(c);
  _exit(0);
}

static void forget(pid_t pid) {
  for (int i = 0; i < 8; i++)
    if (workers[i] == pid)
      workers[i] = 0;
}

/* Waits for a worker; its exit status. */
static int reap(pid_t pid) {
  int st = itest_wait(pid);
  forget(pid);
  return st;
}

static void start_stop_pipe(void) {
  CHECK(pipe(stop_pipe) == 0);
  fcntl(stop_pipe[0], F_SETFD, FD_CLOEXEC);
  fcntl(stop_pipe[1], F_SETFD, FD_CLOEXEC);
}

static void stop_workers(void) {
  close(stop_pipe[1]);
  stop_pipe[1] = -1;
}

static void end_stop_pipe(void) {
  if (stop_pipe[1] >= 0)
    close(stop_pipe[1]);
  close(stop_pipe[0]);
  stop_pipe[0] = stop_pipe[1] = -1;
}

/* ---- 1 to 6: two nodes sharing one Redis ---------------------------------- */

static itest_daemon A, B;
static kvs_client *ca, *cb;

/* The prompts of case 1 and 2 (block ids; some share prefixes). */
static prompt P[8];

static void make_prompts(void) {
  P[0] = mkprompt(100, 5, 1);                 /* 21 tokens */
  P[1] = mkprompt(100, 4, 2);                 /* shares 2 blocks with P0 */
  P[1].ids[2] = 110, P[1].ids[3] = 111;
  P[2] = mkprompt(100, 6, 3);                 /* shares 3 */
  P[2].ids[3] = 120, P[2].ids[4] = 121, P[2].ids[5] = 122;
  P[3] = mkprompt(130, 3, 0);                 /* ends on a block boundary */
  P[4] = mkprompt(140, 4, 1);                 /* extended below */
  P[5] = mkprompt(150, 3, 1);                 /* salt, no promotion */
  P[6] = mkprompt(160, 4, 1);                 /* data corrupted (block 2) */
  P[7] = mkprompt(170, 4, 1);                 /* header corrupted (block 1) */
}

/* The blocks of q that earlier prompts of the list already sealed. */
static uint32_t shared_with(const prompt *list, uint32_t k) {
  uint32_t best = 0;
  for (uint32_t j = 0; j < k; j++) {
    uint32_t m = 0;
    while (m < list[k].nblk && m < list[j].nblk &&
           list[k].ids[m] == list[j].ids[m])
      m++;
    best = m > best ? m : best;
  }
  return best;
}

static void test_share(void) {
  char url[320];
  const char *o[40];
  kvs_tier_stats ta, tb, t0;
  uint64_t written = 0, promos = 0, hits = 0;
  uint64_t rid = 1;

  snprintf(url, sizeof url, "%s", unix_url);
  daemon_opts(o, url, NULL);
  start(&A, o);
  wait_connected(&A, unix_addr);
  start(&B, o);
  wait_connected(&B, unix_addr);
  ca = itest_connect(&A, "node-a");
  cb = itest_connect(&B, "node-b");
  CHECK(kvs_layout_of(ca)->block_size == BS);
  CHECK(kvs_layout_of(ca)->block_stride == STRIDE);
  remote_stats(cb, &t0);
  CHECK(t0.demotions == 0 && t0.promotions == 0 && t0.hit_blocks == 0);

  /* 1. A computes; each prompt hits what earlier ones sealed on A. */
  make_prompts();
  for (uint32_t k = 0; k < 8; k++) {
    uint32_t s = shared_with(P, k), h = hittable(&P[k]);
    int got = compute(ca, rid++, &P[k], 0);
    CHECK(got == (int)((s < h ? s : h) * BS));
    written += P[k].nblk - s; /* every sealed block, once */
  }
  CHECK(written == 28);
  wait_demotions(ca, written, "A");
  remote_stats(ca, &ta);
  CHECK(ta.drops == 0 && ta.failures == 0 && ta.io_errors == 0);
  CHECK(ta.promotions == 0); /* nothing more in the store for A */
  rrep *keys = redis_keys(&r1, "kvshare");
  CHECK(keys->n == written);
  {
    rconn c;
    CHECK(rconn_open(&c, &r1) == 0);
    for (size_t i = 0; i < keys->n; i++) {
      rrep *r = rcmd(&c, "STRLEN", keys->el[i]->str, NULL);
      CHECK(r && r->type == ':' && r->num == DATA_OFF + STRIDE);
      rfree(r);
    }
    rconn_close(&c);
  }

  /* B finds every prompt's full-block prefix; blocks an earlier lookup
   * brought up are B's own by then, the rest come from the store. */
  for (uint32_t k = 0; k < 4; k++) {
    uint32_t s = shared_with(P, k), h = hittable(&P[k]);
    CHECK_HIT(cb, rid++, &P[k], NULL, h * BS);
    promos += h - (s < h ? s : h);
  }
  hits = promos;
  remote_stats(cb, &tb);
  print_stats("B after sharing", &tb);
  CHECK(tb.promotions == promos && tb.hit_blocks == hits);
  CHECK(promos == 5 + 2 + 3 + 2);

  /* Unseen: 0.  Extending P4: exactly P4's 4 blocks. */
  prompt unseen = mkprompt(900, 3, 1), ext = P[4];
  CHECK_HIT(cb, rid++, &unseen, NULL, 0);
  ext.ids[4] = 144, ext.ids[5] = 145, ext.nblk = 6;
  CHECK_HIT(cb, rid++, &ext, NULL, 4 * BS);
  promos += 4, hits += 4;
  /* Another salt: another chain, not in the store. */
  CHECK_HIT(cb, rid++, &P[5], "tenant-b", 0);
  /* Promotion off: only the pool (empty for P5) answers. */
  CHECK_OK(cb, kvs_set_promote(cb, 0));
  CHECK_HIT(cb, rid++, &P[5], NULL, 0);
  remote_stats(cb, &tb);
  CHECK(tb.promotions == promos && tb.hit_blocks == hits);
  CHECK_OK(cb, kvs_set_promote(cb, 1));
  CHECK_HIT(cb, rid++, &P[5], NULL, 3 * BS);
  promos += 3, hits += 3;
  remote_stats(cb, &tb);
  CHECK(tb.promotions == promos && tb.hit_blocks == hits);
  CHECK(tb.demotions == 0 && tb.drops == 0 && tb.failures == 0);
  CHECK(tb.io_errors == 0 && tb.checksum_failures == 0);

  /* 2. Corruption: a data byte of P6's block 2, a header byte (the root
   * hash) of P7's block 1.  Keys are found by their values' first token
   * id (block id * 8). */
  {
    rconn c;
    int fixed = 0;
    CHECK(rconn_open(&c, &r1) == 0);
    for (size_t i = 0; i < keys->n; i++) {
      const char *key = keys->el[i]->str;
      char off[16];
      uint32_t tok0;
      rrep *r = rcmd(&c, "GETRANGE", key, "80", "83", NULL);
      CHECK(r && r->type == '$' && r->len == 4);
      memcpy(&tok0, r->str, 4);
      rfree(r);
      long at = tok0 / 8 == 162 ? DATA_OFF + 1000
                : tok0 / 8 == 171 ? 40 : -1;
      if (at < 0)
        continue;
      snprintf(off, sizeof off, "%ld", at);
      r = rcmd(&c, "GETRANGE", key, off, off, NULL);
      CHECK(r && r->type == '$' && r->len == 1);
      char flipped = (char)(r->str[0] ^ 0x5a);
      rfree(r);
      const char *argv[] = {"SETRANGE", key, off, &flipped};
      size_t argl[] = {8, strlen(key), strlen(off), 1};
      r = rcmdv(&c, 4, argv, argl);
      CHECK(r && r->type == ':' && r->num == DATA_OFF + STRIDE);
      rfree(r);
      fixed++;
    }
    CHECK(fixed == 2);
    rconn_close(&c);
  }
  rfree(keys);
  /* (hit_blocks counts every value that came back good, block 3 too,
   * though the run stops at block 2) */
  CHECK_HIT(cb, rid++, &P[6], NULL, 2 * BS);
  promos += 2, hits += 3; /* blocks 0, 1 and 3 came back good */
  remote_stats(cb, &tb);
  CHECK(tb.checksum_failures == 1);
  CHECK_HIT(cb, rid++, &P[7], NULL, 1 * BS);
  promos += 1, hits += 3; /* blocks 0, 2 and 3 */
  remote_stats(cb, &tb);
  print_stats("B after corruption", &tb);
  CHECK(tb.checksum_failures == 2);
  CHECK(tb.promotions == promos && tb.hit_blocks == hits);
  CHECK(tb.failures == 0 && tb.io_errors == 0);
}

/* 3. TTL: a third daemon writing with expiry, under another prefix. */
static void test_ttl(void) {
  static itest_daemon T;
  const char *o[40];
  char url[320];

  snprintf(url, sizeof url, "%s", unix_url);
  daemon_opts(o, url, "--remote-tier-prefix", "kvsttl",
              "--remote-tier-ttl-ms", "600000", NULL);
  start(&T, o);
  wait_connected(&T, unix_addr);
  kvs_client *c = itest_connect(&T, "ttl");
  prompt q = mkprompt(400, 2, 1);
  CHECK(compute(c, 1, &q, 0) == 0);
  wait_demotions(c, 2, "T");
  kvs_close(c);

  rconn rc;
  rrep *keys = redis_keys(&r1, "kvsttl");
  CHECK(keys->n == 2);
  CHECK(rconn_open(&rc, &r1) == 0);
  for (size_t i = 0; i < keys->n; i++) {
    rrep *r = rcmd(&rc, "PTTL", keys->el[i]->str, NULL);
    CHECK(r && r->type == ':');
    if (r->num < 1 || r->num > 600000) {
      fprintf(stderr, "PTTL of %s: %lld\n", keys->el[i]->str, r->num);
      exit(1);
    }
    rfree(r);
  }
  rfree(keys);
  keys = redis_keys(&r1, "kvshare"); /* written without a TTL */
  CHECK(keys->n > 0);
  rrep *r = rcmd(&rc, "PTTL", keys->el[0]->str, NULL);
  CHECK(r && r->type == ':' && r->num == -1);
  rfree(r);
  rfree(keys);
  rconn_close(&rc);
  itest_daemon_finish(&T, -1);
}

/* 3a. A db number the server refuses (SELECT 9999 of its 16): the daemon
 * says so, and no write reaches db 0 meanwhile (commands go only once the
 * set-up ones are answered). */
static void test_bad_db(void) {
  static itest_daemon D;
  const char *o[40];
  char url[320];

  snprintf(url, sizeof url, "%s?db=9999", unix_url);
  daemon_opts(o, url, "--remote-tier-prefix", "kvsbaddb", NULL);
  start(&D, o);
  wait_log(&D, "SELECT refused");
  kvs_client *c = itest_connect(&D, "bad-db");
  prompt q = mkprompt(450, 3, 1);
  CHECK(compute(c, 1, &q, 0) == 0);
  CHECK_HIT(c, 2, &q, NULL, hittable(&q) * BS); /* resident: its own pool */
  kvs_tier_stats t;
  remote_stats(c, &t);
  CHECK(t.demotions == 0);
  kvs_close(c);
  itest_daemon_finish(&D, -1);
  rrep *keys = redis_keys(&r1, "kvsbaddb");
  CHECK(keys->n == 0);
  rfree(keys);
}

/* 3b. Blocks of 128 KiB, a reader whose reads may hold 1 MiB: a chain
 * of 12 is more than that.  The reader asks for the blocks that fit (it
 * used to ask for none: every lookup of a long chain missed). */
static void test_bound(void) {
  static itest_daemon W, R;
  const char *o[40];
  char url[320];
  kvs_tier_stats t;

  snprintf(url, sizeof url, "%s", unix_url);
  /* (W's pool large enough to copy all 12 out in the commit's turn) */
  daemon_opts(o, url, "--head-dim", "2048", "--remote-tier-prefix",
              "kvsbound", "--pool-blocks", "256", NULL);
  start(&W, o);
  wait_connected(&W, unix_addr);
  daemon_opts(o, url, "--head-dim", "2048", "--remote-tier-prefix",
              "kvsbound", "--remote-tier-inflight-bytes", "1M",
              "--remote-tier-write", "no", NULL);
  start(&R, o);
  wait_connected(&R, unix_addr);
  kvs_client *w = itest_connect(&W, "bound-writer");
  kvs_client *r = itest_connect(&R, "bound-reader");
  uint64_t stride = kvs_layout_of(r)->block_stride;
  /* (a read reserves its value, and 64 bytes, per block) */
  uint32_t fit = (uint32_t)((1u << 20) / (HDR + BS * 4 + stride + 64));
  prompt q = mkprompt(700, 12, 1);

  CHECK(stride == 32 * STRIDE && fit > 0 && fit < 12);
  CHECK(compute(w, 1, &q, 0) == 0);
  wait_demotions(w, 12, "W");
  CHECK_HIT(r, 1, &q, NULL, fit * BS);
  CHECK_HIT(r, 2, &q, NULL, 12 * BS); /* the rest, next time */
  remote_stats(r, &t);
  CHECK(t.promotions == 12 && t.hit_blocks == 12);
  CHECK(t.failures == 0 && t.io_errors == 0 && t.checksum_failures == 0);
  kvs_close(w);
  kvs_close(r);
  itest_daemon_finish(&W, -1);
  itest_daemon_finish(&R, -1);
}

/* 3c. A "server" (a child) that answers a lookup's GETs with nils and
 * closes at once, the daemon stopped meanwhile so that it finds the
 * answers and the end of the stream in one wake-up: the answers count
 * (misses), they are not dropped as errors of a lost connection. */
static void fake_server(int lfd, pid_t daemon) {
  /* GET kvshare:ROOT:HASH (a key of 7 + 1 + 16 + 1 + 32 bytes) */
  static const char get[] = "*2\r\n$3\r\nGET\r\n$57\r\n";
  const size_t getlen = sizeof get - 1 + 57 + 2;
  char buf[4096];
  size_t len = 0;
  int fd = accept(lfd, NULL, NULL);

  if (fd < 0)
    _exit(2);
  /* PING (the daemon's first command, if any), then a lookup's 3 GETs (a
   * 13-token prompt, blocks of 4) */
  size_t off = 0;
  while (len < off + 3 * getlen) {
    ssize_t n = read(fd, buf + len, sizeof buf - len);
    if (n <= 0)
      _exit(3);
    len += (size_t)n;
    if (off == 0 && len >= 14 && memcmp(buf, "*1\r\n$4\r\nPING\r\n", 14) == 0) {
      if (write(fd, "+PONG\r\n", 7) != 7)
        _exit(4);
      off = 14;
    }
  }
  if (len != off + 3 * getlen || memcmp(buf + off, get, sizeof get - 1) != 0)
    _exit(5);
  kill(daemon, SIGSTOP);
  usleep(50000);
  if (write(fd, "$-1\r\n$-1\r\n$-1\r\n", 15) != 15)
    _exit(6);
  close(fd);
  usleep(50000);
  kill(daemon, SIGCONT);
  _exit(0);
}

static void test_close_after_answers(void) {
  static itest_daemon F;
  struct sockaddr_un sa;
  const char *o[40];
  char url[320], addr[200];
  kvs_tier_stats t;
  int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

  CHECK(lfd >= 0);
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s/fake.sock", rdir);
  CHECK(bind(lfd, (struct sockaddr *)&sa, sizeof sa) == 0);
  CHECK(listen(lfd, 4) == 0);
  snprintf(url, sizeof url, "unix://%s", sa.sun_path);
  snprintf(addr, sizeof addr, "unix:%s", sa.sun_path);
  daemon_opts(o, url, "--remote-tier-write", "no", NULL);
  start(&F, o);
  fflush(NULL);
  pid_t child = fork();
  CHECK(child >= 0);
  if (child == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    fake_server(lfd, F.pid);
  }
  close(lfd);
  wait_connected(&F, addr);
  kvs_client *c = itest_connect(&F, "close-after-answers");
  prompt q = mkprompt(800, 3, 1);
  CHECK_HIT(c, 1, &q, NULL, 0);
  CHECK(itest_wait(child) == 0);
  remote_stats(c, &t);
  print_stats("F", &t);
  CHECK(t.io_errors == 0 && t.hit_blocks == 0);
  kvs_close(c);
  itest_daemon_finish(&F, -1);
  unlink(sa.sun_path);
}

/* How many lines of d's log hold what. */
static int log_count(const itest_daemon *d, const char *what) {
  FILE *f = fopen(d->log, "r");
  char line[1024];
  int n = 0;

  if (!f)
    return 0;
  while (fgets(line, sizeof line, f))
    n += strstr(line, what) != NULL;
  fclose(f);
  return n;
}

/* The fill: NFILL prompts of 4 blocks computed on A, all in the store. */
static void fill(void) {
  kvs_tier_stats ta;
  remote_stats(ca, &ta);
  for (uint32_t q = 0; q < NFILL; q++) {
    prompt p = mkprompt(20000 + q * 8, 4, 1);
    CHECK(compute(ca, 5000 + q, &p, 0) == 0);
  }
  wait_demotions(ca, ta.demotions + NFILL * 4, "A (fill)");
}

/* 4. kill -9 of a worker whose lookups promote from the store. */
static void test_kill_worker(void) {
  kvs_tier_stats tb0, tb;
  remote_stats(cb, &tb0);
  start_stop_pipe();
  for (int round = 0; round < 3; round++) {
    int pfd[2];
    pid_t pid = worker(&B, W_LOOKUP_FILL, (uint32_t)round * 13, pfd);
    wait_progress(pfd[0], 12 + 7 * round, "lookup-fill");
    kill(pid, SIGKILL);
    CHECK(reap(pid) == 128 + SIGKILL);
    close(pfd[0]);
    itest_check_pool(cb, 1, 0, 0);
  }
  end_stop_pipe();
  remote_stats(cb, &tb);
  print_stats("B after the killed workers", &tb);
  CHECK(tb.promotions > tb0.promotions);
  CHECK(tb.failures == 0 && tb.checksum_failures == 2);
}

/* 5. Redis killed while both daemons work; restarted. */
static void test_outage(void) {
  char what[400];
  kvs_tier_stats ta0, tb0, ta, tb;
  int pa[2], pb[2];
  pid_t wa, wb;
  int sa, sb;

  start_stop_pipe();
  wa = worker(&A, W_COMPUTE, 1000000, pa);
  wb = worker(&B, W_MIXED, 2000000, pb);
  wait_progress(pa[0], 5, "A");
  wait_progress(pb[0], 5, "B");
  remote_stats(ca, &ta0);
  remote_stats(cb, &tb0);
  /* Redis hangs (stops reading) while A writes, then dies: what A sent
   * meanwhile is left unread, so A's connection ends in a reset, not an
   * end of stream.  (The pause only makes the reset likely: a daemon that
   * sees an end of stream must pass the same checks.) */
  CHECK(kill(r1.pid, SIGSTOP) == 0);
  prompt s = mkprompt(69000, 3, 1);
  CHECK_OK(ca, kvs_set_promote(ca, 0)); /* (a lookup would wait) */
  CHECK(compute(ca, 899, &s, 0) == 0);  /* 3 writes sent, never read */
  CHECK_OK(ca, kvs_set_promote(ca, 1));
  usleep(100000);
  redis_kill(&r1);
  snprintf(what, sizeof what, "remote tier %s: connection lost", unix_addr);
  wait_log(&A, what);
  wait_log(&B, what);
  wait_log(&A, "reads miss and writes are skipped");
  /* Both keep answering, every byte right (the workers check). */
  wait_progress(pa[0], 10, "A");
  wait_progress(pb[0], 10, "B");
  /* What A seals now is dropped; B finds nothing of it. */
  prompt o = mkprompt(70000, 3, 1);
  CHECK(compute(ca, 900, &o, 0) == 0);
  CHECK_HIT(cb, 901, &o, NULL, 0);
  double t0 = itest_now();
  for (;;) {
    remote_stats(ca, &ta);
    remote_stats(cb, &tb);
    if ((ta.drops >= ta0.drops + 3 && tb.drops > tb0.drops) ||
        itest_now() - t0 > 20)
      break;
    usleep(2000);
  }
  print_stats("A while Redis is down", &ta);
  print_stats("B while Redis is down", &tb);
  CHECK(ta.drops >= ta0.drops + 3 && tb.drops > tb0.drops);
  CHECK(ta.failures >= ta0.failures + 3); /* sent, never answered */
  CHECK(ta.checksum_failures == 0);
  stop_workers();
  sa = reap(wa);
  sb = reap(wb);
  close(pa[0]);
  close(pb[0]);
  end_stop_pipe();
  CHECK(sa == 0 && sb == 0);
  itest_check_pool(ca, 1, 0, 0);
  itest_check_pool(cb, 1, 0, 0);

  /* The same socket again (an empty store): both find it. */
  redis_start_or_fail(&r1, NULL);
  snprintf(what, sizeof what, "remote tier %s: connected again", unix_addr);
  wait_log(&A, what);
  wait_log(&B, what);
  remote_stats(ca, &ta0);
  remote_stats(cb, &tb0);
  prompt n = mkprompt(71000, 3, 1);
  CHECK(compute(ca, 902, &n, 0) == 0);
  wait_demotions(ca, ta0.demotions + 3, "A after the restart");
  CHECK_HIT(cb, 903, &n, NULL, 3 * BS);
  remote_stats(cb, &tb);
  CHECK(tb.promotions == tb0.promotions + 3);
  CHECK(tb.hit_blocks == tb0.hit_blocks + 3);
  rrep *keys = redis_keys(&r1, "kvshare");
  CHECK(keys->n == 3);
  rfree(keys);
}

/* 6. SIGTERM while a worker commits and writes are in flight. */
static void test_term(void) {
  static itest_daemon S;
  const char *o[40];
  char url[320];
  int pfd[2];

  snprintf(url, sizeof url, "%s", unix_url);
  daemon_opts(o, url, NULL);
  start(&S, o);
  wait_connected(&S, unix_addr);
  start_stop_pipe();
  pid_t pid = worker(&S, W_COMPUTE_QUIET, 3000000, pfd);
  wait_progress(pfd[0], 20, "committer");
  kvs_client *c = itest_connect(&S, "term");
  kvs_tier_stats t;
  remote_stats(c, &t);
  CHECK(t.demotions > 0);
  kvs_close(c);
  itest_term_under_load(&S, pid);
  forget(pid); /* (reaped there) */
  close(pfd[0]);
  end_stop_pipe();
  /* Its last words count what it wrote. */
  CHECK(itest_log_says(&S, "blocks written"));
  itest_daemon_kill(&S);
}

/* ---- 7. AUTH and bad options --------------------------------------------- */

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  CHECK(f);
  fputs(text, f);
  fclose(f);
}

static void test_auth(void) {
  rsrv r2 = {0};
  static itest_daemon C, W, R;
  const char *o[40];
  char url[320], tcp_url[320], tcp_addr[64], good[400], bad[400], line[200];

  snprintf(r2.name, sizeof r2.name, "redis-auth");
  snprintf(r2.sock, sizeof r2.sock, "%s/r2.sock", rdir);
  snprintf(r2.pass, sizeof r2.pass, "s3cret-%d", (int)getpid());
  for (int tries = 0;; tries++) { /* a port taken meanwhile: another */
    r2.port = free_port(0);
    if (redis_start(&r2, NULL) == 0)
      break;
    CHECK(tries < 3);
  }
  snprintf(good, sizeof good, "%s/pw-good", rdir);
  snprintf(bad, sizeof bad, "%s/pw-bad", rdir);
  snprintf(line, sizeof line, "%s\n", r2.pass);
  write_file(good, line);
  write_file(bad, "not-the-password\n");

  /* C writes with the password from a file. */
  snprintf(url, sizeof url, "unix://%s", r2.sock);
  daemon_opts(o, url, "--remote-tier-password-file", good, NULL);
  start(&C, o);
  snprintf(line, sizeof line, "unix:%s", r2.sock);
  wait_connected(&C, line);
  kvs_client *c = itest_connect(&C, "auth-writer");
  prompt z = mkprompt(500, 3, 1);
  CHECK(compute(c, 1, &z, 0) == 0);
  wait_demotions(c, 3, "C");
  rrep *keys = redis_keys(&r2, "kvshare");
  CHECK(keys->n == 3);
  rfree(keys);

  /* W has the wrong one: it starts, says so, and misses. */
  daemon_opts(o, url, "--remote-tier-password-file", bad, NULL);
  start(&W, o);
  wait_log(&W, "AUTH refused");
  usleep(1500000);
  /* Retried with the back-off (100, 200, 400, 800 ms: 4 more tries in
   * 1.5 s, not 15), the refusal logged once a connection (at most two a
   * server: reads, writes). */
  if (log_count(&W, "AUTH refused") > 2) {
    itest_print_log(&W);
    fprintf(stderr, "the refusal logged %d times\n",
            log_count(&W, "AUTH refused"));
    exit(1);
  }
  kvs_client *w = itest_connect(&W, "auth-wrong");
  CHECK_HIT(w, 1, &z, NULL, 0);
  kvs_tier_stats t;
  remote_stats(w, &t);
  CHECK(t.promotions == 0 && t.hit_blocks == 0);
  kvs_close(w);
  itest_daemon_finish(&W, -1);
  /* The password never reaches the log. */
  CHECK(!itest_log_says(&C, r2.pass));

  /* R reads over TCP, the password in the URL. */
  snprintf(tcp_url, sizeof tcp_url, "redis://:%s@127.0.0.1:%d", r2.pass,
           r2.port);
  snprintf(tcp_addr, sizeof tcp_addr, "127.0.0.1:%d", r2.port);
  daemon_opts(o, tcp_url, NULL);
  start(&R, o);
  wait_connected(&R, tcp_addr);
  kvs_client *r = itest_connect(&R, "auth-tcp");
  CHECK_HIT(r, 1, &z, NULL, 3 * BS);
  remote_stats(r, &t);
  CHECK(t.promotions == 3 && t.hit_blocks == 3);
  CHECK(!itest_log_says(&R, r2.pass));
  kvs_close(r);
  itest_daemon_finish(&R, -1);
  kvs_close(c);
  itest_daemon_finish(&C, -1);
  redis_kill(&r2);

  /* Options kvshared refuses, naming them. */
  static const char *const bad_opts[][3] = {
      {"--remote-tier", "foo://x", "remote_tier"},
      {"--remote-tier", "redis://localhost:99999", "remote_tier"},
      {"--remote-tier", "unix://relative.sock", "remote_tier"},
      {"--remote-tier-password-file", "/nonexistent/kvs-pw",
       "remote_tier_password_file"},
  };
  for (size_t i = 0; i < sizeof bad_opts / sizeof bad_opts[0]; i++) {
    itest_daemon X;
    if (strcmp(bad_opts[i][0], "--remote-tier") == 0)
      daemon_opts(o, bad_opts[i][1], NULL);
    else
      daemon_opts(o, url, bad_opts[i][0], bad_opts[i][1], NULL);
    /* (an exit 0 before "ready" reads 255) */
    int rc = itest_daemon_try(&X, o);
    if (rc <= 0 || rc >= 128 || !itest_log_says(&X, bad_opts[i][2])) {
      itest_print_log(&X);
      fprintf(stderr, "%s %s: kvshared %s (status %d), wanted an exit "
              "naming %s\n", bad_opts[i][0], bad_opts[i][1],
              rc == 0 ? "started" : "exited", rc, bad_opts[i][2]);
      itest_daemon_kill(&X);
      exit(1);
    }
    itest_daemon_kill(&X);
  }
}

/* ---- 8. Redis Cluster ------------------------------------------------------ */

static void test_cluster(void) {
  rsrv n[3];
  static itest_daemon K1, K2;
  const char *o[40];
  char url[320], conf[3][400], what[300], cmd[1200];

  if (!have_program("redis-cli")) {
    fprintf(stderr, "(cluster case skipped: no redis-cli)\n");
    return;
  }
  memset(n, 0, sizeof n);
  for (int i = 0; i < 3; i++) {
    snprintf(n[i].name, sizeof n[i].name, "redis-cluster-%d", i);
    snprintf(conf[i], sizeof conf[i], "%s/nodes%d.conf", rdir, i);
    const char *extra[] = {"--cluster-enabled", "yes",
                           "--cluster-config-file", conf[i], NULL};
    int tries = 0;
    for (;;) {
      n[i].port = free_port(1);
      if (redis_start(&n[i], extra) == 0)
        break;
      if (++tries == 3) {
        fprintf(stderr, "(cluster case skipped: this redis-server does not "
                "start with --cluster-enabled yes)\n");
        for (int j = 0; j < i; j++)
          redis_kill(&n[j]);
        return;
      }
    }
  }
  snprintf(cmd, sizeof cmd, "redis-cli --cluster create 127.0.0.1:%d "
           "127.0.0.1:%d 127.0.0.1:%d --cluster-replicas 0 --cluster-yes "
           ">%s/cluster-create.log 2>&1", n[0].port, n[1].port, n[2].port,
           rdir);
  if (system(cmd) != 0) {
    snprintf(cmd, sizeof cmd, "cat %s/cluster-create.log >&2", rdir);
    if (system(cmd) != 0)
      fprintf(stderr, "(no log)\n");
    fprintf(stderr, "redis-cli --cluster create failed\n");
    exit(1);
  }
  for (int i = 0; i < 3; i++) {
    double t0 = itest_now();
    for (;;) {
      rconn c;
      CHECK(rconn_open(&c, &n[i]) == 0);
      rrep *r = rcmd(&c, "CLUSTER", "INFO", NULL);
      int ok = r && r->type == '$' && strstr(r->str, "cluster_state:ok");
      rfree(r);
      rconn_close(&c);
      if (ok)
        break;
      CHECK(itest_now() - t0 < 20);
      usleep(20000);
    }
  }

  snprintf(url, sizeof url, "redis-cluster://127.0.0.1:%d", n[0].port);
  daemon_opts(o, url, NULL);
  start(&K1, o);
  start(&K2, o);
  for (int k = 0; k < 2; k++) {
    itest_daemon *d = k ? &K2 : &K1;
    wait_log(d, "cluster slot map: 16384 of 16384 slots over 3 nodes");
    for (int i = 0; i < 3; i++) { /* (each server's two connections:
                                     the fds are counted after both) */
      snprintf(what, sizeof what, "127.0.0.1:%d (writes): connected",
               n[i].port);
      wait_log(d, what);
      snprintf(what, sizeof what, "127.0.0.1:%d", n[i].port);
      wait_connected(d, what);
    }
  }
  kvs_client *c1 = itest_connect(&K1, "cluster-1");
  kvs_client *c2 = itest_connect(&K2, "cluster-2");
  prompt big = mkprompt(3000, 24, 1);
  CHECK(compute(c1, 1, &big, 0) == 0);
  wait_demotions(c1, 24, "K1");
  long long total = 0;
  int holding = 0;
  for (int i = 0; i < 3; i++) {
    long long k = redis_int(&n[i], "DBSIZE", NULL);
    fprintf(stderr, "cluster node %d holds %lld keys\n", i, k);
    total += k;
    holding += k > 0;
  }
  CHECK(total == 24 && holding > 1);
  CHECK_HIT(c2, 1, &big, NULL, 24 * BS);
  kvs_tier_stats t;
  remote_stats(c2, &t);
  print_stats("K2", &t);
  CHECK(t.promotions == 24 && t.hit_blocks == 24);
  CHECK(t.failures == 0 && t.io_errors == 0 && t.checksum_failures == 0);
  kvs_close(c1);
  kvs_close(c2);
  itest_daemon_finish(&K1, -1);
  itest_daemon_finish(&K2, -1);
  for (int i = 0; i < 3; i++)
    redis_kill(&n[i]);
}

/* ---- 9. Tenants on one remote server ------------------------------------- */

#define UID_A 40001
#define UID_B 40002
#define TPREFIX "kvsten" /* the tenants' daemon's --remote-tier-prefix */
#define NTP 3            /* tenant a's prompts */
#define TBLK (3 + 4 + 5) /* their blocks */

static itest_daemon TD;
static rsrv r3; /* the tenants' server: every key in it is theirs */
static prompt TP[NTP];

/* This process becomes uid (its group: the same number). */
static void become(uid_t uid) {
  CHECK(setgroups(0, NULL) == 0);
  CHECK(setresgid(uid, uid, uid) == 0);
  CHECK(setresuid(uid, uid, uid) == 0);
}

/* Runs fn(arg) in a child that became uid; it must exit 0. */
static void run_as(uid_t uid, int (*fn)(const void *), const void *arg) {
  fflush(NULL);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    become(uid);
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* (after: a new uid clears it) */
    _exit(fn(arg));
  }
  itest_reap(pid, 0);
}

/* Tenant a computes its prompts and waits until the store has answered
 * every write. */
static int a_write(const void *arg) {
  kvs_client *c = itest_connect(&TD, "tenant-a");
  kvs_tier_stats t;
  uint64_t written = 0;

  (void)arg;
  for (uint32_t k = 0; k < NTP; k++) {
    CHECK(compute(c, 1 + k, &TP[k], 0) == 0);
    written += TP[k].nblk;
  }
  CHECK(written == TBLK);
  wait_demotions(c, written, "tenant a");
  remote_stats(c, &t);
  CHECK(t.drops == 0 && t.failures == 0 && t.io_errors == 0);
  CHECK(t.promotions == 0 && t.hit_blocks == 0);
  kvs_close(c);
  return 0;
}

/* Tenant a, its pool empty: every prompt hits, brought up from the store,
 * every byte a's. */
static int a_read(const void *arg) {
  kvs_client *c = itest_connect(&TD, "tenant-a");
  kvs_tier_stats t;

  (void)arg;
  for (uint32_t k = 0; k < NTP; k++)
    CHECK_HIT(c, 1 + k, &TP[k], NULL, hittable(&TP[k]) * BS);
  remote_stats(c, &t);
  print_stats("tenant a after the restart", &t);
  CHECK(t.promotions == TBLK && t.hit_blocks == TBLK);
  CHECK(t.checksum_failures == 0 && t.failures == 0 && t.io_errors == 0);
  kvs_close(c);
  return 0;
}

/* Tenant b looks a's prompts up: nothing hits, from the pool or the
 * store; *bad of the values the store answers fail their checks. */
static int b_lookup(const void *arg) {
  const uint64_t *bad = arg;
  kvs_client *c = itest_connect(&TD, "tenant-b");
  kvs_tier_stats t;
  kvs_stats st;

  for (uint32_t k = 0; k < NTP; k++)
    CHECK_HIT(c, 1 + k, &TP[k], NULL, 0);
  CHECK_OK(c, kvs_stats_get(c, 0, &st));
  CHECK(st.hit_tokens == 0 && st.query_tokens > 0);
  remote_stats(c, &t);
  print_stats("tenant b", &t);
  CHECK(t.hit_blocks == 0 && t.promotions == 0 && t.demotions == 0);
  CHECK(t.checksum_failures == *bad);
  CHECK(t.io_errors == 0);
  kvs_close(c);
  return 0;
}

/* Splits key PREFIX:T:ROOT:HASH (T a tenant's one-letter name, ROOT 16
 * hex digits, HASH 32): 0, or -1 for a key of any other shape. */
static int tenant_key(const char *key, char *tenant, char root[17]) {
  size_t pl = strlen(TPREFIX), len = strlen(key);

  if (len != pl + 3 + 16 + 1 + 32 || strncmp(key, TPREFIX ":", pl + 1) ||
      key[pl + 2] != ':' || key[pl + 19] != ':')
    return -1;
  for (size_t i = pl + 3; i < len; i++)
    if (i != pl + 19 && !strchr("0123456789abcdef", key[i]))
      return -1;
  *tenant = key[pl + 1];
  memcpy(root, key + pl + 3, 16);
  root[16] = '\0';
  return 0;
}

/* Every key of r3: na of tenant a's, nb of b's, one root each (b's, if
 * any, another than a's), none of another shape (the bare prefix's: a
 * daemon without tenants). */
static void check_tenant_keys(uint32_t na, uint32_t nb) {
  char root_a[17] = "", root_b[17] = "", root[17], t;
  uint32_t n[2] = {0, 0};
  rconn c;

  CHECK(rconn_open(&c, &r3) == 0);
  rrep *keys = rcmd(&c, "KEYS", "*", NULL);
  CHECK(keys && keys->type == '*');
  rconn_close(&c);
  for (size_t i = 0; i < keys->n; i++) {
    const char *key = keys->el[i]->str;
    if (tenant_key(key, &t, root) < 0 || (t != 'a' && t != 'b')) {
      fprintf(stderr, "key %s: not %s:a: or %s:b:\n", key, TPREFIX,
              TPREFIX);
      exit(1);
    }
    char *r = t == 'a' ? root_a : root_b;
    if (!r[0])
      memcpy(r, root, 17);
    if (strcmp(r, root) != 0) {
      fprintf(stderr, "key %s: another root than %s\n", key, r);
      exit(1);
    }
    n[t == 'b']++;
  }
  rfree(keys);
  if (n[0] != na || n[1] != nb) {
    fprintf(stderr, "%u keys of a and %u of b, the model says %u and %u\n",
            n[0], n[1], na, nb);
    exit(1);
  }
  CHECK(strcmp(root_a, root_b) != 0);
}

/* The keys of the next n GETs the server runs (m: a connection in
 * MONITOR) whose key starts with prefix. */
static void monitored_gets(rconn *m, const char *prefix, char (*keys)[80],
                           uint32_t n) {
  for (uint32_t got = 0; got < n;) {
    rrep *r = rread(m);
    const char *at, *end;

    CHECK(r && r->type == '+');
    at = strstr(r->str, "\"GET\" \"");
    if (at) {
      at += 7;
      end = strchr(at, '"');
      CHECK(end && (size_t)(end - at) < 80);
      if (strncmp(at, prefix, strlen(prefix)) == 0) {
        memcpy(keys[got], at, (size_t)(end - at));
        keys[got++][end - at] = '\0';
      }
    }
    rfree(r);
  }
}

/* Stores a's value of block i of TP[k] under key (b's name for it). */
static void copy_a_value(rconn *c, const rrep *keys_a, uint32_t k,
                         uint32_t i, const char *key) {
  for (size_t j = 0; j < keys_a->n; j++) {
    const char *from = keys_a->el[j]->str;
    rrep *r = rcmd(c, "GET", from, NULL);
    uint32_t tok0;

    CHECK(r && r->type == '$' && r->len == DATA_OFF + STRIDE);
    memcpy(&tok0, r->str + HDR, 4);
    if (tok0 == TP[k].ids[i] * 8) {
      const char *argv[] = {"SET", key, r->str};
      size_t argl[] = {3, strlen(key), r->len};
      rrep *ok = rcmdv(c, 3, argv, argl);
      CHECK(ok && ok->type == '+');
      rfree(ok);
      rfree(r);
      return;
    }
    rfree(r);
  }
  fprintf(stderr, "no value of a's for block %u of prompt %u\n", i, k);
  exit(1);
}

/* Starts the tenants' daemon on r3, open to the tenants' uids. */
static void start_tenants(void) {
  char url[320], rd[300], wr[300], ta[64], tb[64];
  const char *o[40];
  double t0 = itest_now();

  snprintf(ta, sizeof ta, "a uids=%d blocks=32", UID_A);
  snprintf(tb, sizeof tb, "b uids=%d blocks=32", UID_B);
  snprintf(url, sizeof url, "unix://%s", r3.sock);
  daemon_opts(o, url, "--remote-tier-prefix", TPREFIX, "--tenant", ta,
              "--tenant", tb, NULL);
  start(&TD, o);
  CHECK(chmod(TD.dir, 0755) == 0);
  CHECK(chmod(TD.socket, 0666) == 0);
  /* each partition's two connections */
  snprintf(rd, sizeof rd, "remote tier unix:%s: connected", r3.sock);
  snprintf(wr, sizeof wr, "remote tier unix:%s (writes): connected",
           r3.sock);
  while (itest_log_count(&TD, rd) < 2 || itest_log_count(&TD, wr) < 2) {
    if (itest_now() - t0 > 20) {
      itest_print_log(&TD);
      fprintf(stderr, "the tenants' remote tiers never all connected\n");
      exit(1);
    }
    usleep(5000);
  }
  TD.start_fds = itest_fd_count(TD.pid);
}

static kvs_client *observer(void) {
  kvs_connect_opts co = {"observer", 30000, 1};
  kvs_client *c = NULL;
  CHECK_OK(NULL, kvs_connect(TD.socket, &co, &c));
  return c;
}

static void test_tenants(void) {
  char keys_b[TBLK][80];
  static const uint64_t no_bad = 0, all_bad = TBLK;
  kvs_tier_stats t;
  kvs_client *obs;
  rconn mon;

  if (geteuid() != 0) {
    fprintf(stderr, "(tenants case skipped: not root, it runs workers as "
            "other uids)\n");
    return;
  }
  snprintf(r3.name, sizeof r3.name, "redis-tenants");
  snprintf(r3.sock, sizeof r3.sock, "%s/r3.sock", rdir);
  redis_start_or_fail(&r3, NULL);
  TP[0] = mkprompt(6000, 3, 1);
  TP[1] = mkprompt(6010, 4, 2);
  TP[2] = mkprompt(6020, 5, 1);
  start_tenants();

  /* a writes; every key is a's; b finds nothing. */
  run_as(UID_A, a_write, NULL);
  check_tenant_keys(TBLK, 0);
  run_as(UID_B, b_lookup, &no_bad);
  obs = observer(); /* (both partitions added up: b's are the rest) */
  remote_stats(obs, &t);
  CHECK(t.demotions == TBLK && t.promotions == 0 && t.hit_blocks == 0);
  kvs_close(obs);
  itest_daemon_finish(&TD, -1);

  /* A new daemon, the pools empty: a's prompts come from the store. */
  start_tenants();
  run_as(UID_A, a_read, NULL);
  /* b asks the store under its own names (seen through MONITOR), and
   * misses... */
  CHECK(rconn_open(&mon, &r3) == 0);
  rrep *r = rcmd(&mon, "MONITOR", NULL);
  CHECK(r && r->type == '+');
  rfree(r);
  run_as(UID_B, b_lookup, &no_bad);
  monitored_gets(&mon, TPREFIX ":b:", keys_b, TBLK);
  rconn_close(&mon);
  /* ... and a's values stored under those names fail b's checks (their
   * headers name a's root and hashes): never served.  (b's lookups ask
   * for each prompt's blocks in order.) */
  {
    rconn c;
    rrep *keys_a;
    uint32_t j = 0;
    CHECK(rconn_open(&c, &r3) == 0);
    keys_a = rcmd(&c, "KEYS", TPREFIX ":a:*", NULL);
    CHECK(keys_a && keys_a->type == '*' && keys_a->n == TBLK);
    for (uint32_t k = 0; k < NTP; k++)
      for (uint32_t i = 0; i < TP[k].nblk; i++, j++)
        copy_a_value(&c, keys_a, k, i, keys_b[j]);
    rfree(keys_a);
    rconn_close(&c);
  }
  check_tenant_keys(TBLK, TBLK);
  run_as(UID_B, b_lookup, &all_bad);
  obs = observer();
  remote_stats(obs, &t);
  print_stats("both tenants", &t);
  CHECK(t.promotions == TBLK && t.hit_blocks == TBLK);
  CHECK(t.checksum_failures == TBLK);
  kvs_close(obs);
  itest_daemon_finish(&TD, -1);
  redis_kill(&r3);
}

int main(void) {
  double t0 = itest_now();
  const char *tmp = getenv("TMPDIR");

  setvbuf(stderr, NULL, _IOLBF, 0);
  if (!have_program("redis-server")) {
    fprintf(stderr, "SKIP: no redis-server (Debian package redis-server)\n");
    return 77;
  }
  owner = getpid();
  atexit(stop_all_at_exit);
  /* (short: the Unix socket paths under it) */
  CHECK(strlen(tmp ? tmp : "/tmp") + 20 < sizeof rdir);
  snprintf(rdir, sizeof rdir, "%s/kvs-remote-XXXXXX", tmp ? tmp : "/tmp");
  CHECK(mkdtemp(rdir) != NULL);
  snprintf(r1.name, sizeof r1.name, "redis-1");
  snprintf(r1.sock, sizeof r1.sock, "%s/r1.sock", rdir);
  snprintf(unix_addr, sizeof unix_addr, "unix:%s", r1.sock);
  snprintf(unix_url, sizeof unix_url, "unix://%s", r1.sock);
  redis_start_or_fail(&r1, NULL);

  test_share();
  fprintf(stderr, "share and corruption: ok (%.1f s)\n", itest_now() - t0);
  test_ttl();
  test_bad_db();
  test_bound();
  test_close_after_answers();
  fprintf(stderr, "ttl, the in-flight bound, answers then close: ok "
          "(%.1f s)\n", itest_now() - t0);
  fill();
  test_kill_worker();
  fprintf(stderr, "ttl, killed workers: ok (%.1f s)\n", itest_now() - t0);
  test_outage();
  fprintf(stderr, "redis killed and restarted: ok (%.1f s)\n",
          itest_now() - t0);
  kvs_close(ca);
  kvs_close(cb);
  itest_daemon_finish(&A, -1);
  itest_daemon_finish(&B, -1);
  test_term();
  redis_kill(&r1);
  fprintf(stderr, "sigterm under load: ok (%.1f s)\n", itest_now() - t0);
  test_auth();
  fprintf(stderr, "auth and bad options: ok (%.1f s)\n", itest_now() - t0);
  test_cluster();
  fprintf(stderr, "redis cluster: ok (%.1f s)\n", itest_now() - t0);
  test_tenants();
  fprintf(stderr, "all: ok (%.1f s)\n", itest_now() - t0);
  rm_tree(rdir);
  passed = 1;
  return 0;
}
