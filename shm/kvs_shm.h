/*
 * kvs_shm.h — what processes share: memfd regions and fd passing.
 *
 * A region is a shared mapping of a file descriptor.  The daemon creates the
 * host pool with kvs_region_create (a memfd whose size is sealed); a worker
 * receives the fd over the Unix socket (kvs_recv_fds) and maps it with
 * kvs_region_map.  Both sides compute addresses from the base with
 * kvs_layout.h; pointers are never shared.
 *
 * Every function returns 0 (or a byte count) or a negative status: -errno for
 * system errors, KVS_* codes (kvs_status.h) for the rest.  Nothing here logs.
 * Every fd this module creates or receives is close-on-exec.
 */
#ifndef KVS_SHM_H
#define KVS_SHM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvs_region {
  int fd;       /* owned by the region; -1 when closed */
  void *base;   /* the mapping; NULL when closed */
  size_t size;  /* bytes mapped */
  int sealed;   /* size sealed (F_SEAL_SHRINK | F_SEAL_GROW) */
} kvs_region;

/*
 * Creates a memfd of `size` bytes named `name` (for /proc; any string), seals
 * its size where the kernel allows it (r->sealed says whether it did), and
 * maps it shared, read-write.  Returns 0, -errno, or KVS_EINVAL for size 0.
 * Memory is reserved lazily, page by page, as it is touched.
 */
int kvs_region_create(const char *name, size_t size, kvs_region *r);

/*
 * Maps `size` bytes of a received fd shared, read-write.  Checks first that
 * the file holds at least `size` bytes (KVS_ERANGE otherwise), so touching
 * the mapping cannot fault past the end.  On success the region owns fd; on
 * failure the caller still does.  r->sealed reports whether the file's size
 * is sealed against shrinking.
 */
int kvs_region_map(int fd, size_t size, kvs_region *r);

/* Unmaps and closes.  Safe on a zeroed or already closed region. */
void kvs_region_close(kvs_region *r);

/*
 * Sends len bytes (len >= 1) from buf and, attached to its first byte, nfds
 * descriptors (0 <= nfds <= KVS_SHM_MAX_FDS) with one sendmsg, retrying on
 * EINTR.  Never raises SIGPIPE.  Returns the bytes sent (may be fewer than
 * len on a non-blocking socket: send the rest without fds), -EAGAIN when
 * nothing could be sent, another -errno, or KVS_EINVAL.
 */
#define KVS_SHM_MAX_FDS 20 /* a pool's 16, a request ring's 2 */
ssize_t kvs_send_fds(int sock, const void *buf, size_t len, const int *fds,
                     int nfds);

/*
 * Receives up to len bytes into buf with one recvmsg (MSG_CMSG_CLOEXEC),
 * retrying on EINTR.  Descriptors that arrive are stored in fds (up to
 * max_fds, count in *nfds, which is always set); any beyond max_fds are
 * closed at once (compare *nfds with what the peer announced).  Returns the
 * bytes read * (0 at end of stream), -EAGAIN on a non-blocking socket with nothing to
 * read, or another -errno.
 */
ssize_t kvs_recv_fds(int sock, void *buf, size_t len, int *fds, int max_fds,
                     int *nfds);

#ifdef __cplusplus
}
#endif
#endif /* KVS_SHM_H */
