/* The host backend: the pool is one memfd, size-sealed, exported as one fd.
 * Pages are reserved as workers touch them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/backend.h"
#include "kvs_shm.h"
#include "kvs_status.h"

struct backend {
  kvs_region region;
};

int backend_open(const cfg *c, const kvs_layout *l, backend **out, char *err,
              size_t err_len) {
  backend *p;
  int rc;

  *out = NULL;
  if (strcmp(c->backend, "host") != 0 && strcmp(c->backend, "auto") != 0) {
    snprintf(err, err_len, "backend '%s' is not built in", c->backend);
    return KVS_ENOTSUP;
  }
  if (kvs_pool_bytes(l) > SIZE_MAX) {
    snprintf(err, err_len, "pool too big for this machine");
    return KVS_ERANGE;
  }
  p = calloc(1, sizeof(*p));
  if (!p) {
    snprintf(err, err_len, "out of memory");
    return KVS_ENOMEM;
  }
  rc = kvs_region_create("kvshare-pool", (size_t)kvs_pool_bytes(l),
                         &p->region);
  if (rc < 0) {
    snprintf(err, err_len, "memfd of %llu bytes: %s",
             (unsigned long long)kvs_pool_bytes(l), kvs_strerror(rc));
    free(p);
    return rc;
  }
  *out = p;
  return 0;
}

void backend_close(backend *p) {
  if (!p)
    return;
  kvs_region_close(&p->region);
  free(p);
}

void backend_get_export(const backend *p, backend_export *e) {
  e->backend = "host";
  e->size = p->region.size;
  e->chunk_size = p->region.size;
  e->nfds = 1;
  e->fds = &p->region.fd;
  e->gpu_uuid = "";
}
