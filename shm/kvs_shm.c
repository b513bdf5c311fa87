#include "kvs_shm.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "kvs_status.h"

#ifndef MFD_CLOEXEC
#define MFD_CLOEXEC 0x0001U
#endif
#ifndef MFD_ALLOW_SEALING
#define MFD_ALLOW_SEALING 0x0002U
#endif

static int size_sealed(int fd) {
#ifdef F_GET_SEALS
  int seals = fcntl(fd, F_GET_SEALS);

  return seals >= 0 && (seals & F_SEAL_SHRINK) && (seals & F_SEAL_GROW);
#else
  (void)fd;
  return 0;
#endif
}

int kvs_region_create(const char *name, size_t size, kvs_region *r) {
  int fd, rc;
  void *base;

  r->fd = -1;
  r->base = NULL;
  r->size = 0;
  r->sealed = 0;
  if (size == 0)
    return KVS_EINVAL;
  fd = memfd_create(name ? name : "kvshare", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0 && errno == EINVAL) /* sealing not supported */
    fd = memfd_create(name ? name : "kvshare", MFD_CLOEXEC);
  if (fd < 0)
    return -errno;
  if (ftruncate(fd, (off_t)size) < 0) {
    rc = -errno;
    goto fail;
  }
#ifdef F_ADD_SEALS
  /* Best effort: a kernel or filesystem without seals still works; the
   * receiver's size check then guards against a shrink. */
  (void)fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
#endif
  base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    rc = -errno;
    goto fail;
  }
  r->fd = fd;
  r->base = base;
  r->size = size;
  r->sealed = size_sealed(fd);
  return 0;
fail:
  close(fd);
  return rc;
}

int kvs_region_map(int fd, size_t size, kvs_region *r) {
  struct stat st;
  void *base;

  r->fd = -1;
  r->base = NULL;
  r->size = 0;
  r->sealed = 0;
  if (fd < 0 || size == 0)
    return KVS_EINVAL;
  if (fstat(fd, &st) < 0)
    return -errno;
  if (st.st_size < 0 || (uint64_t)st.st_size < size)
    return KVS_ERANGE;
  base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED)
    return -errno;
  r->fd = fd;
  r->base = base;
  r->size = size;
  r->sealed = size_sealed(fd);
  return 0;
}

void kvs_region_close(kvs_region *r) {
  if (r->base && r->size)
    munmap(r->base, r->size);
  if (r->fd >= 0)
    close(r->fd);
  r->base = NULL;
  r->size = 0;
  r->fd = -1;
  r->sealed = 0;
}

ssize_t kvs_send_fds(int sock, const void *buf, size_t len, const int *fds,
                     int nfds) {
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int) * KVS_SHM_MAX_FDS)];
  } ctl;
  struct iovec iov = {(void *)buf, len};
  struct msghdr msg;
  ssize_t n;

  if (len == 0 || nfds < 0 || nfds > KVS_SHM_MAX_FDS || (nfds && !fds))
    return KVS_EINVAL;
  memset(&msg, 0, sizeof(msg));
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (nfds > 0) {
    struct cmsghdr *c;

    memset(&ctl, 0, sizeof(ctl));
    msg.msg_control = ctl.buf;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
    c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
  }
  do
    n = sendmsg(sock, &msg, MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  return n < 0 ? -errno : n;
}

ssize_t kvs_recv_fds(int sock, void *buf, size_t len, int *fds, int max_fds,
                     int *nfds) {
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int) * KVS_SHM_MAX_FDS)];
  } ctl;
  struct iovec iov = {buf, len};
  struct msghdr msg;
  struct cmsghdr *c;
  ssize_t n;

  *nfds = 0;
  if (max_fds < 0 || (max_fds && !fds))
    return KVS_EINVAL;
  memset(&msg, 0, sizeof(msg));
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = ctl.buf;
  msg.msg_controllen = sizeof(ctl.buf);
  do
    n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  if (n < 0)
    return -errno;
  for (c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    size_t i, count;

    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
      continue;
    count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (i = 0; i < count; i++) {
      int fd;

      memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (*nfds < max_fds) {
        fds[(*nfds)++] = fd;
      } else {
        close(fd);
      }
    }
  }
  /* Descriptors beyond max_fds were closed above; with MSG_CTRUNC the kernel
   * dropped those that did not fit in ctl.  Either way the bytes stand. */
  return n;
}
