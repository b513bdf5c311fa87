/*
 * backend.c — picks the pool's backend at start-up (see backend.h).
 */
#include <stdio.h>
#include <string.h>

#include "daemon/pool/backend.h"
#include "daemon/log.h"
#include "kvs_status.h"

int backend_open(const cfg *c, kvs_layout *l, backend **out, char *err,
                 size_t err_len) {
  int rc;

  *out = NULL;
  if (strcmp(c->backend, "host") == 0)
    return backend_host_open(c, l, out, err, err_len);
  rc = backend_cuda_open(c, l, out, err, err_len);
  if (rc == 0 || strcmp(c->backend, "auto") != 0)
    return rc;
  /* auto: a machine with no usable GPU runs on the host pool; a GPU that
   * is there but refuses the pool (too big, a bad --gpu) is an error. */
  if (rc != KVS_ENODEV && rc != KVS_ENOTSUP)
    return rc;
  log_info(0, "backend auto: no usable GPU (%s); using the host backend "
              "(memfd)%s",
           err, c->gpu_memory_fraction > 0
                    ? "; gpu_memory_fraction ignored, the pool has "
                      "pool_blocks/pool_bytes blocks"
                    : "");
  return backend_host_open(c, l, out, err, err_len);
}

void backend_close(backend *b) {
  if (b)
    b->ops->close(b);
}
