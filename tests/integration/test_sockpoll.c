/*
 * test_sockpoll.c — socket round trips without wake-ups (socket_poll_us on
 * the daemon, $KVS_SOCKET_SPIN_US in the client; docs/client.md, "Polled
 * sockets"):
 *  1. with both polling, a client's calls do not block: 500 Pings cost it
 *     fewer than 50 voluntary context switches, where a client that does
 *     not spin blocks on at least half of its 500 (same daemon, same run);
 *  2. a negative or unreadable $KVS_SOCKET_SPIN_US means no spin (the
 *     client blocks as one without it);
 *  3. timeout_ms holds while the client spins: a call to a stopped daemon,
 *     with a spin of 1 s and a timeout of 200 ms, gets -EAGAIN after the
 *     timeout, well before the spin would have ended; the session is then
 *     broken, as documented;
 * then the pool, the daemon's fds and ours are checked, and the daemon
 * says that frames came while it polled.
 */
#include <errno.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include "tests/integration/itest.h"

/* Times this process has blocked (voluntary context switches). */
static long blocked(void) {
  struct rusage ru;

  CHECK(getrusage(RUSAGE_SELF, &ru) == 0);
  return ru.ru_nvcsw;
}

static kvs_client *connect_spin(const itest_daemon *d, const char *name,
                                const char *spin_us, int timeout_ms) {
  kvs_connect_opts o = {name, timeout_ms, 0};
  kvs_client *c = NULL;

  if (spin_us)
    setenv("KVS_SOCKET_SPIN_US", spin_us, 1);
  CHECK_OK(NULL, kvs_connect(d->socket, &o, &c));
  unsetenv("KVS_SOCKET_SPIN_US");
  return c;
}

/* Voluntary context switches of n Pings. */
static long pings_blocked(kvs_client *c, int n) {
  long b0 = blocked();

  for (int i = 0; i < n; i++)
    CHECK_OK(c, kvs_ping(c, "p", 1));
  return blocked() - b0;
}

int main(void) {
  static const char *const opts[] = {"--num-layers", "2", "--head-dim", "16",
                                     "--pool-blocks", "64", "--ring-bytes",
                                     "0", "--socket-poll-us", "200000", NULL};
  itest_daemon d;
  int my_fds = itest_fd_count(0);

  itest_daemon_start(&d, opts);

  /* 1, 2 */
  kvs_client *spin = connect_spin(&d, "spinning", "200000", 0);
  kvs_client *plain = connect_spin(&d, "plain", NULL, 0);
  kvs_client *neg = connect_spin(&d, "negative", "-5", 0);
  kvs_client *junk = connect_spin(&d, "junk", "soon", 0);
  long bs = pings_blocked(spin, 500), bp = pings_blocked(plain, 500);
  long bn = pings_blocked(neg, 500), bj = pings_blocked(junk, 500);
  printf("blocked in 500 Pings: spinning %ld, plain %ld, KVS_SOCKET_SPIN_US=-5 "
         "%ld, =soon %ld\n", bs, bp, bn, bj);
  CHECK(bs < 50);
  CHECK(bp >= 250 && bn >= 250 && bj >= 250);
  kvs_close(spin);
  kvs_close(plain);
  kvs_close(neg);
  kvs_close(junk);

  /* 3 */
  kvs_client *c = connect_spin(&d, "impatient", "1000000", 200);
  CHECK_OK(c, kvs_ping(c, "p", 1));
  CHECK(kill(d.pid, SIGSTOP) == 0);
  double t0 = itest_now();
  CHECK_RC(c, kvs_ping(c, "p", 1), -EAGAIN);
  double took = itest_now() - t0;
  CHECK(kill(d.pid, SIGCONT) == 0);
  printf("a call to a stopped daemon: -EAGAIN after %.3f s (timeout 0.2 s, "
         "spin 1 s)\n", took);
  CHECK(took >= 0.15 && took < 0.9);
  CHECK_RC(c, kvs_ping(c, "p", 1), KVS_ECLOSED); /* broken, as documented */
  kvs_close(c);

  itest_daemon_finish(&d, my_fds);
  printf("test_sockpoll: ok\n");
  return 0;
}
