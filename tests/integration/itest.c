/*
 * itest.c — the integration tests' harness (see itest.h).
 */
#include "tests/integration/itest.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "kvs_frame.h"
#include "kvs_shm.h"

double itest_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

int itest_wait(pid_t pid) {
  int st;
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR)
      return -1;
  if (WIFEXITED(st))
    return WEXITSTATUS(st);
  return 128 + WTERMSIG(st);
}

int itest_reap(pid_t pid, int allow_kill) {
  int st;
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) {
      fprintf(stderr, "waitpid(%d): %s\n", (int)pid, strerror(errno));
      exit(1);
    }
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
    return 0;
  if (allow_kill && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL)
    return 128 + SIGKILL;
  if (WIFEXITED(st))
    fprintf(stderr, "child %d exited with %d\n", (int)pid, WEXITSTATUS(st));
  else
    fprintf(stderr, "child %d died of signal %d (%s)\n", (int)pid,
            WTERMSIG(st), strsignal(WTERMSIG(st)));
  exit(1);
}

int itest_fd_count(pid_t pid) {
  char path[64];
  if (pid)
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
  else
    snprintf(path, sizeof path, "/proc/self/fd");
  DIR *d = opendir(path);
  if (!d)
    return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (e->d_name[0] != '.')
      n++;
  closedir(d);
  return pid ? n : n - 1; /* not the directory's own fd */
}

/* Prints "fd -> target" for each open fd of pid. */
static void print_fds(pid_t pid, const char *when) {
  char path[64], link[400], target[256];
  snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
  DIR *dir = opendir(path);
  if (!dir)
    return;
  fprintf(stderr, "daemon fds %s:", when);
  struct dirent *e;
  while ((e = readdir(dir))) {
    if (e->d_name[0] == '.')
      continue;
    snprintf(link, sizeof link, "%s/%s", path, e->d_name);
    ssize_t n = readlink(link, target, sizeof target - 1);
    target[n > 0 ? n : 0] = '\0';
    fprintf(stderr, " %s=%s", e->d_name, target);
  }
  fprintf(stderr, "\n");
  closedir(dir);
}

void itest_print_log(const itest_daemon *d) {
  FILE *f = fopen(d->log, "r");
  if (!f)
    return;
  char line[512];
  fprintf(stderr, "---- kvshared log (%s)\n", d->log);
  while (fgets(line, sizeof line, f))
    fputs(line, stderr);
  fprintf(stderr, "----\n");
  fclose(f);
}

int itest_log_count(const itest_daemon *d, const char *what) {
  FILE *f = fopen(d->log, "r");
  if (!f)
    return 0;
  char line[512];
  int n = 0;
  while (fgets(line, sizeof line, f))
    n += strstr(line, what) != NULL;
  fclose(f);
  return n;
}

int itest_log_says(const itest_daemon *d, const char *what) {
  return itest_log_count(d, what) > 0;
}

/* A test that fails (exit from CHECK) must not leave its daemon running:
 * the process that started it kills it at exit. */
static itest_daemon *running;
static pid_t owner;

static void kill_at_exit(void) {
  if (running && getpid() == owner && running->pid > 0) {
    fprintf(stderr, "(stopping kvshared %d after a failure)\n",
            (int)running->pid);
    itest_print_log(running);
    itest_daemon_kill(running);
  }
}

int itest_daemon_try(itest_daemon *d, const char *const *extra) {
  memset(d, 0, sizeof *d);
  if (!owner) {
    owner = getpid();
    atexit(kill_at_exit);
  }
  running = d;
  const char *build = getenv("KVS_BUILD");
  if (!build)
    build = "build";
  char bin[512];
  snprintf(bin, sizeof bin, "%s/kvshared", build);
  if (access(bin, X_OK) != 0) {
    fprintf(stderr, "SKIP: %s not built\n", bin);
    exit(77);
  }
  const char *tmp = getenv("TMPDIR");
  snprintf(d->dir, sizeof d->dir, "%s/kvs-itest-XXXXXX", tmp ? tmp : "/tmp");
  CHECK(mkdtemp(d->dir) != NULL);
  snprintf(d->socket, sizeof d->socket, "%s/kvshared.sock", d->dir);
  snprintf(d->log, sizeof d->log, "%s/kvshared.log", d->dir);

  int pfd[2];
  CHECK(pipe(pfd) == 0);
  char readyfd[16];
  snprintf(readyfd, sizeof readyfd, "%d", pfd[1]);
  const char *argv[64];
  int n = 0;
  argv[n++] = bin;
  argv[n++] = "serve";
  argv[n++] = "--socket";
  argv[n++] = d->socket;
  argv[n++] = "--ready-fd";
  argv[n++] = readyfd;
  if (geteuid() != 0) { /* the fd checks read /proc/PID/fd: root always
                           may, another uid only while it is dumpable */
    argv[n++] = "--dumpable";
    argv[n++] = "yes";
  }
  /* test_sockpoll_suite.sh: every daemon polls its sockets */
  const char *poll_us = getenv("KVS_ITEST_SOCKET_POLL_US");
  if (poll_us) {
    argv[n++] = "--socket-poll-us";
    argv[n++] = poll_us;
  }
  for (int i = 0; extra && extra[i] && n < 62; i++)
    argv[n++] = extra[i];
  argv[n] = NULL;

  fflush(NULL);
  d->pid = fork();
  CHECK(d->pid >= 0);
  if (d->pid == 0) {
    close(pfd[0]);
    /* Dies with the test, even when the test is killed. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int lf = open(d->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int nul = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (lf >= 0) {
      dup2(lf, 2);
      dup2(lf, 1);
    }
    if (nul >= 0)
      dup2(nul, 0);
    execv(bin, (char *const *)argv);
    _exit(127);
  }
  close(pfd[1]);
  /* Wait for "ready\n" (or the daemon dying), 30 s at most. */
  char buf[16] = {0};
  size_t got = 0;
  double t0 = itest_now();
  while (got < 6 && itest_now() - t0 < 30) {
    struct pollfd p = {pfd[0], POLLIN, 0};
    int pr = poll(&p, 1, 200);
    if (pr > 0) {
      ssize_t r = read(pfd[0], buf + got, sizeof buf - 1 - got);
      if (r <= 0)
        break;
      got += (size_t)r;
    }
  }
  /* The daemon closes its end after "ready": wait for that too, so the fd
   * count below does not include it. */
  if (strncmp(buf, "ready", 5) == 0) {
    struct pollfd p = {pfd[0], POLLIN, 0};
    char rest[16];
    while (poll(&p, 1, 10000) > 0 && read(pfd[0], rest, sizeof rest) > 0)
      ;
  }
  close(pfd[0]);
  if (strncmp(buf, "ready", 5) != 0) {
    /* It said no: wait for its exit (it never listened). */
    double t1 = itest_now();
    int st;
    while (itest_now() - t1 < 30) {
      if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
        d->pid = 0;
        return WIFEXITED(st) ? (WEXITSTATUS(st) ? WEXITSTATUS(st) : 255)
                             : 128 + WTERMSIG(st);
      }
      usleep(10000);
    }
    return -1;
  }
  d->start_fds = itest_fd_count(d->pid);
  if (getenv("KVS_ITEST_FDS"))
    print_fds(d->pid, "at start");
  return 0;
}

void itest_daemon_start(itest_daemon *d, const char *const *extra) {
  int rc = itest_daemon_try(d, extra);
  if (rc == 0)
    return;
  if (rc > 0 && (itest_log_says(d, "not built yet") ||
                 itest_log_says(d, "unknown option"))) {
    itest_print_log(d);
    fprintf(stderr, "SKIP: this kvshared cannot serve the tests yet\n");
    exit(77);
  }
  itest_print_log(d);
  fprintf(stderr, "kvshared did not become ready (%s %d)\n",
          rc > 0 ? "exit status" : "timeout", rc);
  itest_daemon_kill(d);
  exit(1);
}

kvs_client *itest_connect(const itest_daemon *d, const char *name) {
  kvs_connect_opts o = {name, 30000, 0};
  kvs_client *c = NULL;
  int rc = kvs_connect(d->socket, &o, &c);
  if (rc) {
    fprintf(stderr, "kvs_connect(%s): %s (%s)\n", d->socket,
            kvs_status_name(rc), kvs_strerror(rc));
    exit(1);
  }
  /* Asked for a ring (test_ring_suite.sh): the daemon's default grants it,
   * so every session of the test goes through one. */
  const char *ring = getenv("KVS_RING");
  if (ring && strcmp(ring, "1") == 0 && !kvs_ring_active(c)) {
    fprintf(stderr, "KVS_RING=1 but the session has no request ring\n");
    exit(1);
  }
  return c;
}

void itest_check_pool(kvs_client *c, uint32_t sessions, uint32_t used,
                      uint32_t requests) {
  kvs_stats st;
  double t0 = itest_now();
  for (;;) {
    CHECK_OK(c, kvs_stats_get(c, 1, &st));
    if (st.sessions == sessions || itest_now() - t0 > 30)
      break;
    usleep(2000);
  }
  if (st.check != 0 || st.sessions != sessions ||
      (used != UINT32_MAX && st.used_blocks != used) ||
      (requests != UINT32_MAX && st.num_requests != requests) ||
      st.free_blocks + st.cached_blocks + st.used_blocks != st.num_blocks) {
    fprintf(stderr,
            "pool check: check=%d (%s) sessions=%u (want %u) used=%u (want "
            "%u) requests=%u (want %u) free=%u cached=%u num=%u\n",
            st.check, st.check_message, st.sessions, sessions, st.used_blocks,
            used, st.num_requests, requests, st.free_blocks, st.cached_blocks,
            st.num_blocks);
    exit(1);
  }
}

void itest_daemon_kill(itest_daemon *d) {
  if (d->pid > 0) {
    kill(d->pid, SIGKILL);
    itest_wait(d->pid);
    d->pid = 0;
  }
  if (d->dir[0]) {
    unlink(d->socket);
    unlink(d->log);
    rmdir(d->dir);
  }
}

void itest_daemon_finish(itest_daemon *d, int my_fds) {
  /* Stats only, no mapping: also the way in for root when the daemon has
   * tenants (an observer). */
  kvs_connect_opts o = {"itest-final", 30000, 1};
  kvs_client *c = NULL;
  int rc = kvs_connect(d->socket, &o, &c);
  if (rc) {
    fprintf(stderr, "kvs_connect(%s): %s (%s)\n", d->socket,
            kvs_status_name(rc), kvs_last_message(NULL));
    exit(1);
  }
  itest_check_pool(c, 1, 0, 0);
  kvs_close(c);
  /* Back to the daemon's fds at start (sessions close asynchronously). */
  double t0 = itest_now();
  int fds = itest_fd_count(d->pid);
  /* (Fewer than at start is no leak: a descriptor of the daemon's start-up
   * may still have been open when start_fds was counted.) */
  while (fds > d->start_fds && itest_now() - t0 < 30) {
    usleep(2000);
    fds = itest_fd_count(d->pid);
  }
  if (fds > d->start_fds) {
    fprintf(stderr, "daemon fd leak: %d open, %d at start\n", fds,
            d->start_fds);
    print_fds(d->pid, "now");
    itest_daemon_kill(d);
    exit(1);
  }
  if (my_fds >= 0) {
    int mine = itest_fd_count(0);
    if (mine != my_fds) {
      fprintf(stderr, "test fd leak: %d open, %d at start\n", mine, my_fds);
      itest_daemon_kill(d);
      exit(1);
    }
  }
  CHECK(kill(d->pid, SIGTERM) == 0);
  int st = itest_wait(d->pid);
  d->pid = 0;
  if (st != 0) {
    itest_print_log(d);
    fprintf(stderr, "kvshared exited with %d after SIGTERM\n", st);
    exit(1);
  }
  if (getenv("KVS_ITEST_LOG"))
    itest_print_log(d);
  itest_daemon_kill(d);
}

static uint8_t block_pattern(uint64_t key, uint32_t blk, size_t i) {
  uint64_t x = key * 0x9e3779b97f4a7c15ull ^ blk * 0x85ebca6bu ^
               i * 0xc2b2ae35u;
  x ^= x >> 29;
  return (uint8_t)(x * 0xbf58476d1ce4e5b9ull >> 56);
}

long itest_block_bytes(kvs_client *c, uint32_t b, uint64_t key, uint32_t blk,
                       int check) {
  const kvs_layout *l = kvs_layout_of(c);
  uint8_t *x = kvs_block_ptr(c, b);
  long bad = 0;

  for (size_t i = 0; i < l->block_stride; i++) {
    if (check)
      bad += x[i] != block_pattern(key, blk, i);
    else
      x[i] = block_pattern(key, blk, i);
  }
  return bad;
}

void itest_term_under_load(itest_daemon *d, pid_t worker) {
  int st;

  kill(d->pid, SIGTERM);
  st = itest_wait(d->pid);
  d->pid = 0;
  kill(worker, SIGKILL);
  /* (It may have seen the daemon go and exited 0 before the kill.) */
  itest_reap(worker, 1);
  if (st != 0)
    itest_print_log(d);
  CHECK(st == 0);
  CHECK(itest_log_says(d, "stopped cleanly"));
}

/* ---- raw connections ---------------------------------------------------- */

int itest_raw_connect(const itest_daemon *d) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  CHECK(fd >= 0);
  struct sockaddr_un sa = {0};
  sa.sun_family = AF_UNIX;
  strcpy(sa.sun_path, d->socket);
  CHECK(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
  struct timeval tv = {20, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

void itest_raw_send(int fd, const void *p, size_t n) {
  CHECK(send(fd, p, n, MSG_NOSIGNAL) == (ssize_t)n);
}

void itest_raw_send_env(int fd, const Kvshare__Envelope *env) {
  uint8_t *buf;
  size_t len;
  CHECK(kvs_frame_pack(env, KVS_FRAME_MAX_DEFAULT, &buf, &len) == 0);
  itest_raw_send(fd, buf, len);
  free(buf);
}

/* Reads exactly n bytes; 0, or -1 at end of stream / error.  Passed fds
 * are closed. */
int itest_raw_read(int fd, uint8_t *p, size_t n) {
  while (n) {
    int fds[KVS_SHM_MAX_FDS], nfds = 0;
    ssize_t r = kvs_recv_fds(fd, p, n, fds, KVS_SHM_MAX_FDS, &nfds);
    for (int i = 0; i < nfds; i++)
      close(fds[i]);
    if (r <= 0)
      return -1;
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

/* The next envelope from the daemon, or NULL at end of stream. */
Kvshare__Envelope *itest_raw_recv(int fd) {
  uint8_t hdr[KVS_FRAME_HEADER_SIZE];
  if (itest_raw_read(fd, hdr, sizeof hdr))
    return NULL;
  kvs_frame_header h;
  CHECK(kvs_frame_header_decode(hdr, KVS_FRAME_MAX_DEFAULT, &h) == 0);
  uint8_t *payload = malloc(h.length + 1);
  CHECK(payload);
  CHECK(itest_raw_read(fd, payload, h.length) == 0);
  Kvshare__Envelope *env = NULL;
  CHECK(kvs_envelope_unpack(payload, h.length, 0, &env) == 0);
  free(payload);
  return env;
}

void itest_raw_hello(int fd, uint32_t version) {
  Kvshare__Hello h = KVSHARE__HELLO__INIT;
  h.version = version;
  h.client_name = "raw";
  Kvshare__Envelope env = KVSHARE__ENVELOPE__INIT;
  env.seq = 1;
  env.body_case = KVSHARE__ENVELOPE__BODY_HELLO;
  env.hello = &h;
  itest_raw_send_env(fd, &env);
}

/* A raw connection past the handshake (the pool fd is closed). */
int itest_raw_session(const itest_daemon *d) {
  int fd = itest_raw_connect(d);
  itest_raw_hello(fd, KVS_PROTO_VERSION);
  Kvshare__Envelope *w = itest_raw_recv(fd);
  CHECK(w && w->body_case == KVSHARE__ENVELOPE__BODY_WELCOME);
  CHECK(w->welcome->status == NULL || w->welcome->status->code == 0);
  kvs_envelope_free(w);
  return fd;
}

/* The connection still works: a ping comes back. */
void itest_raw_alive(int fd) {
  Kvshare__Ping p = KVSHARE__PING__INIT;
  p.payload.data = (uint8_t *)"alive";
  p.payload.len = 5;
  Kvshare__Request r = KVSHARE__REQUEST__INIT;
  r.op_case = KVSHARE__REQUEST__OP_PING;
  r.ping = &p;
  Kvshare__Envelope env = KVSHARE__ENVELOPE__INIT;
  env.seq = 4242;
  env.body_case = KVSHARE__ENVELOPE__BODY_REQUEST;
  env.request = &r;
  itest_raw_send_env(fd, &env);
  Kvshare__Envelope *e = itest_raw_recv(fd);
  CHECK(e && e->seq == 4242 && e->response);
  CHECK(e->response->result_case == KVSHARE__RESPONSE__RESULT_PONG);
  CHECK(e->response->pong.len == 5);
  kvs_envelope_free(e);
}

size_t itest_put_varint(uint8_t *p, uint64_t v) {
  size_t n = 0;

  while (v >= 0x80) {
    p[n++] = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  p[n++] = (uint8_t)v;
  return n;
}
