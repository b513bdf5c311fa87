/* shm/: memfd regions (create, seal, map a received fd) and SCM_RIGHTS fd
 * passing over a socketpair, with a forked child and without.  Ends by
 * checking that no descriptor leaked. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvs_shm.h"
#include "kvs_status.h"

static int count_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  struct dirent *e;
  int n = 0;

  if (!d)
    return -1;
  while ((e = readdir(d)))
    if (e->d_name[0] != '.')
      n++;
  closedir(d);
  return n - 1; /* the DIR's own fd */
}

static void test_region(void **state) {
  kvs_region a, b, c;
  int fd2;

  (void)state;
  assert_int_equal(kvs_region_create("t", 0, &a), KVS_EINVAL);
  assert_int_equal(kvs_region_create("kvs-test", 1 << 20, &a), 0);
  assert_non_null(a.base);
  assert_true(a.fd >= 0);
  assert_int_equal(fcntl(a.fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  if (a.sealed) /* sealed: the size cannot change */
    assert_int_equal(ftruncate(a.fd, 4096), -1);

  /* A second mapping of the same fd sees the same bytes. */
  fd2 = dup(a.fd);
  assert_true(fd2 >= 0);
  assert_int_equal(kvs_region_map(fd2, 1 << 20, &b), 0);
  assert_int_equal(b.sealed, a.sealed);
  ((char *)a.base)[12345] = 'x';
  assert_int_equal(((char *)b.base)[12345], 'x');
  kvs_region_close(&b);
  kvs_region_close(&b); /* idempotent */

  /* Asking for more than the file holds is refused; fd stays the caller's. */
  fd2 = dup(a.fd);
  assert_int_equal(kvs_region_map(fd2, (1 << 20) + 4096, &c), KVS_ERANGE);
  assert_int_equal(c.fd, -1);
  assert_int_equal(close(fd2), 0);
  assert_int_equal(kvs_region_map(-1, 4096, &c), KVS_EINVAL);
  kvs_region_close(&a);
}

static void test_fds_in_process(void **state) {
  int sv[2], fds[3], got[KVS_SHM_MAX_FDS], n, i;
  char buf[64];
  kvs_region r, m;

  (void)state;
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  assert_int_equal(kvs_region_create("kvs-test", 8192, &r), 0);
  ((char *)r.base)[100] = 'k';
  fds[0] = r.fd;
  fds[1] = r.fd;
  fds[2] = r.fd;

  /* Bytes and three descriptors in one message. */
  assert_int_equal(kvs_send_fds(sv[0], "hello", 5, fds, 3), 5);
  assert_int_equal(kvs_recv_fds(sv[1], buf, sizeof(buf), got, 3, &n), 5);
  assert_int_equal(n, 3);
  assert_memory_equal(buf, "hello", 5);
  for (i = 0; i < n; i++)
    assert_int_equal(fcntl(got[i], F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  assert_int_equal(kvs_region_map(got[0], 8192, &m), 0);
  assert_int_equal(((char *)m.base)[100], 'k');
  kvs_region_close(&m);
  close(got[1]);
  close(got[2]);

  /* Surplus descriptors are closed by the receiver; the bytes stand. */
  assert_int_equal(kvs_send_fds(sv[0], "abc", 3, fds, 3), 3);
  assert_int_equal(kvs_recv_fds(sv[1], buf, sizeof(buf), got, 1, &n), 3);
  assert_int_equal(n, 1);
  close(got[0]);
  assert_int_equal(kvs_send_fds(sv[0], "z", 1, fds, 2), 1);
  assert_int_equal(kvs_recv_fds(sv[1], buf, sizeof(buf), NULL, 0, &n), 1);
  assert_int_equal(n, 0);

  /* No descriptors at all. */
  assert_int_equal(kvs_send_fds(sv[0], "plain", 5, NULL, 0), 5);
  assert_int_equal(kvs_recv_fds(sv[1], buf, sizeof(buf), got, 4, &n), 5);
  assert_int_equal(n, 0);

  /* Argument checks, non-blocking empty read, end of stream, EPIPE. */
  assert_int_equal(kvs_send_fds(sv[0], "x", 0, NULL, 0), KVS_EINVAL);
  assert_int_equal(kvs_send_fds(sv[0], "x", 1, fds, KVS_SHM_MAX_FDS + 1),
                   KVS_EINVAL);
  assert_int_equal(fcntl(sv[1], F_SETFL, O_NONBLOCK), 0);
  assert_int_equal(kvs_recv_fds(sv[1], buf, sizeof(buf), got, 4, &n), -EAGAIN);
  close(sv[0]);
  assert_int_equal(kvs_recv_fds(sv[1], buf, sizeof(buf), got, 4, &n), 0);
  close(sv[1]);
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  close(sv[1]);
  assert_int_equal(kvs_send_fds(sv[0], "x", 1, fds, 1), -EPIPE);
  close(sv[0]);
  kvs_region_close(&r);
}

static void test_fds_across_fork(void **state) {
  int sv[2], status, got[1], n;
  char buf[16];
  kvs_region r, m;
  pid_t pid;

  (void)state;
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) { /* child: the "daemon" creates a region and sends it */
    close(sv[1]);
    if (kvs_region_create("kvs-child", 4096 * 4, &r) < 0)
      _exit(2);
    memcpy((char *)r.base + 4096, "shared", 7);
    if (kvs_send_fds(sv[0], "W", 1, &r.fd, 1) != 1)
      _exit(3);
    /* wait for the parent to write back, then check */
    if (read(sv[0], buf, 1) != 1)
      _exit(4);
    _exit(memcmp((char *)r.base + 8192, "back", 5) == 0 ? 0 : 5);
  }
  close(sv[0]);
  assert_int_equal(kvs_recv_fds(sv[1], buf, sizeof(buf), got, 1, &n), 1);
  assert_int_equal(n, 1);
  assert_int_equal(kvs_region_map(got[0], 4096 * 4, &m), 0);
  assert_string_equal((char *)m.base + 4096, "shared");
  memcpy((char *)m.base + 8192, "back", 5);
  assert_int_equal(write(sv[1], "d", 1), 1);
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  kvs_region_close(&m);
  close(sv[1]);
}

static int fds_at_start;

static int setup(void **state) {
  (void)state;
  fds_at_start = count_fds();
  return 0;
}

static int teardown(void **state) {
  (void)state;
  /* nothing leaked: the same descriptors as at the start */
  return count_fds() == fds_at_start ? 0 : -1;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_region),
      cmocka_unit_test(test_fds_in_process),
      cmocka_unit_test(test_fds_across_fork),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
