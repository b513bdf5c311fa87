/*
 * tier_host.c — the host tier's memory (tier_host.h).
 */
#include "daemon/tiers/tier_host.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "daemon/pool/backend.h"
#include "kvs_status.h"

int tier_host_open(tier_host *h, backend *pool, uint64_t bytes,
                   uint64_t block_bytes, char *err, size_t err_len) {
  uint64_t n = block_bytes ? bytes / block_bytes : 0;
  int rc;

  memset(h, 0, sizeof(*h));
  if (n == 0 || n >= KVS_BLOCK_NONE / 2 || n * block_bytes > SIZE_MAX) {
    snprintf(err, err_len, "host_tier_bytes %llu holds %llu blocks of %llu "
             "bytes; want 1 .. 2^31", (unsigned long long)bytes,
             (unsigned long long)n, (unsigned long long)block_bytes);
    return KVS_EINVAL;
  }
  h->slot_bytes = block_bytes;
  h->nslots = (uint32_t)n;
  h->bytes = (size_t)(n * block_bytes);
  h->base = mmap(NULL, h->bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (h->base == MAP_FAILED) {
    h->base = NULL;
    snprintf(err, err_len, "host tier of %zu bytes: %s", h->bytes,
             strerror(errno));
    return KVS_ENOMEM;
  }
  if (pool->ops->host_register) {
    rc = pool->ops->host_register(pool, h->base, h->bytes);
    if (rc < 0) {
      snprintf(err, err_len, "host tier of %zu bytes: pinning it for the "
               "GPU's copies failed: %s", h->bytes, kvs_strerror(rc));
      munmap(h->base, h->bytes);
      h->base = NULL;
      return rc;
    }
    h->pinned_by = pool;
  }
  return 0;
}

void tier_host_close(tier_host *h) {
  if (!h->base)
    return;
  if (h->pinned_by)
    h->pinned_by->ops->host_unregister(h->pinned_by, h->base);
  munmap(h->base, h->bytes);
  h->base = NULL;
}
