/*
 * backend.h — the memory behind the block pool, as the daemon owns and
 * exports it.
 *
 * One interface, one backend per source file; both are built into every
 * kvshared (the CUDA driver is opened with dlopen, so nothing links against
 * it) and backend.c picks one at start-up from the `backend` option:
 *   backend_host.c  a size-sealed memfd, exported as one fd;
 *   backend_cuda.c  GPU memory from the CUDA VMM API (gpu/vmm.c), exported
 *                   as up to 16 POSIX fds, with the daemon's own stream for
 *                   copies.
 * The core never sees this: it manages block indexes only.
 */
#ifndef KVS_DAEMON_BACKEND_H
#define KVS_DAEMON_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "daemon/config.h"
#include "daemon/pool/copy.h"
#include "kvs_layout.h"

/* What a Welcome tells a worker about the pool. */
typedef struct backend_export {
  const char *backend;  /* "host" or "cuda" */
  uint64_t size;        /* bytes of the whole pool */
  uint64_t chunk_size;  /* bytes per fd (the last may be smaller) */
  int nfds;
  const int *fds;       /* owned by the backend; sent with SCM_RIGHTS */
  const char *gpu_uuid; /* "" for host */
} backend_export;

typedef struct backend_ops {
  void (*close)(backend *b);
  /* Starts job j's copies (kvs_layout block_stride bytes per block); 0 and
   * later copy_complete(j, status) exactly once, or a negative status with
   * nothing left running and no copy_complete. */
  int (*copy)(backend *b, copy_job *j);
  /* Is the device still there?  0, or the fault's status (KVS_EDEVICE):
   * every job started and not finished is then lost.  NULL: never fails. */
  int (*check)(backend *b);
  /* Pins host memory for the device's async copies (the host tier);
   * NULL where host memory needs nothing (the host pool). */
  int (*host_register)(backend *b, void *p, size_t len);
  void (*host_unregister)(backend *b, void *p);
} backend_ops;

struct backend {
  const backend_ops *ops;
  uv_loop_t *loop; /* the daemon's loop (set by copy_engine_init) */
  backend_export ex;
  kvs_layout layout;
  void *base;    /* the pool in the daemon's address space: a host address,
                    or a device address (cuda; never dereferenced here) */
  char desc[384]; /* one line for the log: where the pool lives */
};

/*
 * Opens the pool the configuration asks for, for layout l.  With
 * gpu_memory_fraction the cuda backend sets l->num_blocks (and
 * block_stride) itself.  auto falls back to host, with a log line, when no
 * usable GPU is there; any other failure is returned.  0, or a negative
 * status with a reason in err.
 */
int backend_open(const cfg *c, kvs_layout *l, backend **out, char *err,
                 size_t err_len);

/* Releases the pool (every copy job must have completed).  NULL: no-op. */
void backend_close(backend *b);

/* The two backends (backend_open picks). */
int backend_host_open(const cfg *c, const kvs_layout *l, backend **out,
                      char *err, size_t err_len);
int backend_cuda_open(const cfg *c, kvs_layout *l, backend **out, char *err,
                      size_t err_len);

#endif
