/*
 * itest.h — harness of the integration tests: a real kvshared in a
 * temporary directory, checks, leak checks.
 *
 * A test starts the daemon (itest_daemon_start), connects workers with
 * libkvshare, and ends with itest_daemon_finish: the pool invariant check,
 * block counts back to what the test expects, the daemon's fd count back to
 * where it started, SIGTERM and a clean exit.  Tests exit 0 pass, 77 skip,
 * anything else fail (CHECK exits 1 with the file and line).
 */
#ifndef KVS_ITEST_H
#define KVS_ITEST_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>

#include "client/kvshare.h"

#define CHECK(cond)                                                          \
  do {                                                                       \
    if (!(cond)) {                                                           \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__,       \
              #cond);                                                        \
      exit(1);                                                               \
    }                                                                        \
  } while (0)

/* Checks that a call returned `want` (0 or a status), printing both names
 * and the daemon's message otherwise. */
#define CHECK_RC(c, call, want)                                              \
  do {                                                                       \
    int rc_ = (call);                                                        \
    if (rc_ != (want)) {                                                     \
      fprintf(stderr, "%s:%d: %s returned %d %s (%s), wanted %s; daemon: %s\n", \
              __FILE__, __LINE__, #call, rc_, kvs_status_name(rc_),          \
              kvs_strerror(rc_), kvs_status_name(want),                      \
              (c) ? kvs_last_message(c) : "");                               \
      exit(1);                                                               \
    }                                                                        \
  } while (0)

#define CHECK_OK(c, call) CHECK_RC(c, call, 0)

typedef struct itest_daemon {
  pid_t pid;
  char dir[256];      /* temporary directory */
  char socket[300];   /* its socket */
  char log[300];      /* its stderr */
  int start_fds;      /* its open fds once ready */
} itest_daemon;

/* Starts $KVS_BUILD/kvshared serve --socket DIR/kvshared.sock plus the extra
 * options (NULL-terminated, may be NULL), and waits until it is ready.
 * Exits 77 (skip) when the daemon cannot serve in this build, 1 on any
 * other failure. */
void itest_daemon_start(itest_daemon *d, const char *const *extra);

/* The same, but a daemon that refuses to start is not a failure: returns
 * 0 once it listens, its exit status (> 0) when it exits first (d->pid is
 * then 0; its log stays in d->log until itest_daemon_kill), -1 on a
 * timeout. */
int itest_daemon_try(itest_daemon *d, const char *const *extra);

/* Does the daemon's log hold `what`?  How many of its lines do?  Print it
 * to stderr. */
int itest_log_says(const itest_daemon *d, const char *what);
int itest_log_count(const itest_daemon *d, const char *what);
void itest_print_log(const itest_daemon *d);

/* Open fds of the daemon process, or of this process (pid 0). */
int itest_fd_count(pid_t pid);

/* Connects a client (exits 1 on failure). */
kvs_client *itest_connect(const itest_daemon *d, const char *name);

/*
 * Waits until the daemon reports `sessions` sessions (the ones a test just
 * closed or killed may take a moment to be noticed), then checks the pool:
 * invariant check passes, used_blocks == used, num_requests == requests.
 * Uses c for the query (its own session counts).  UINT32_MAX for used or
 * requests: not checked.  Exits 1 on failure.
 */
void itest_check_pool(kvs_client *c, uint32_t sessions, uint32_t used,
                      uint32_t requests);

/* The final check of every test: with no client connected, opens one,
 * checks the pool (invariant, 0 blocks in use, 0 requests), the daemon's
 * fds back to start_fds, stops it with SIGTERM, checks it exited 0, and
 * removes the directory.  Also checks this process's fd count equals
 * my_fds (pass -1 to skip that). */
void itest_daemon_finish(itest_daemon *d, int my_fds);

/* Stops the daemon without checks (for error paths). */
void itest_daemon_kill(itest_daemon *d);

/* Deterministic small random numbers (xorshift). */
static inline uint64_t itest_rand(uint64_t *s) {
  uint64_t x = *s;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return *s = x;
}

/* Monotonic seconds. */
double itest_now(void);

/* Waits for a child; returns its exit status (128+sig if killed). */
int itest_wait(pid_t pid);

/* Reaps a worker child (one whose CHECKs exit 1): it must have exited 0,
 * or, with allow_kill, died of the test's SIGKILL; anything else (a failed
 * CHECK, another signal) fails the test here.  Returns 0 or 128 + SIGKILL. */
int itest_reap(pid_t pid, int allow_kill);

/* Writes (check = 0), or counts the wrong bytes in (check = 1), pool block
 * b as the recognisable bytes of block blk of `key` (a prompt, a
 * request). */
long itest_block_bytes(kvs_client *c, uint32_t b, uint64_t key, uint32_t blk,
                       int check);

/* SIGTERM to the daemon while `worker` (a child process) is busy with it:
 * the daemon must drain and exit 0, saying "stopped cleanly"; the worker
 * is then killed and reaped. */
void itest_term_under_load(itest_daemon *d, pid_t worker);

/* Raw connections to the daemon, frames built by hand (libkvsproto): a
 * connection (20 s receive timeout), bytes and envelopes out, exactly n
 * bytes in (0, or -1 at the end of the stream; passed fds are closed), the
 * next envelope (NULL at the end of the stream; free it with
 * kvs_envelope_free), a Hello, a connection past the handshake. */
struct Kvshare__Envelope;
int itest_raw_connect(const itest_daemon *d);
void itest_raw_send(int fd, const void *p, size_t n);
void itest_raw_send_env(int fd, const struct Kvshare__Envelope *env);
int itest_raw_read(int fd, uint8_t *p, size_t n);
struct Kvshare__Envelope *itest_raw_recv(int fd);
void itest_raw_hello(int fd, uint32_t version);
int itest_raw_session(const itest_daemon *d);
/* The raw connection still answers a Ping (exits 1 otherwise). */
void itest_raw_alive(int fd);
/* Writes v as a protobuf varint at p; returns its length (at most 10). */
size_t itest_put_varint(uint8_t *p, uint64_t v);

#endif /* KVS_ITEST_H */
