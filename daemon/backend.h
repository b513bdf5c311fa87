/*
 * backend.h — the memory behind the block pool, as the daemon exports it.
 *
 * One interface, one backend per source file, chosen by daemon/module.mk:
 * backend_host.c (a sealed memfd, exported as one fd) now; a CUDA VMM backend
 * (several POSIX fds from cuMemExportToShareableHandle) later.  The core
 * never sees this: it manages block indexes only.
 */
#ifndef KVS_DAEMON_BACKEND_H
#define KVS_DAEMON_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "daemon/config.h"
#include "kvs_layout.h"

typedef struct backend backend;

/* What a Welcome tells a worker about the pool. */
typedef struct backend_export {
  const char *backend; /* "host" or "cuda" */
  uint64_t size;       /* bytes of the whole pool */
  uint64_t chunk_size; /* bytes per fd (the last may be smaller) */
  int nfds;
  const int *fds;      /* owned by the pool; sent with SCM_RIGHTS */
  const char *gpu_uuid; /* "" for host */
} backend_export;

/* Creates the pool for the layout.  0, or a negative status with a reason
 * in err. */
int backend_open(const cfg *c, const kvs_layout *l, backend **out, char *err,
              size_t err_len);
void backend_close(backend *p);
void backend_get_export(const backend *p, backend_export *e);

#endif
