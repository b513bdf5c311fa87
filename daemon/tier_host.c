/*
 * tier_host.c — the host tier's memory (tier_host.h).
 */
#include "daemon/tier_host.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "daemon/backend.h"
#include "kvs_status.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif
#define FAULT_CHUNK ((size_t)64 << 20)

/* The faulting thread: the whole mapping, a chunk at a time, at nice 19
 * (a thread's own on Linux), stopping early when asked.  A kernel without
 * MADV_POPULATE_WRITE leaves the pages to be faulted as they are written. */
static void *fault_in(void *arg) {
  tier_host *h = arg;

  (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19);
  for (size_t off = 0; off < h->bytes; off += FAULT_CHUNK) {
    size_t n = h->bytes - off < FAULT_CHUNK ? h->bytes - off : FAULT_CHUNK;

    if (atomic_load_explicit(&h->stop, memory_order_relaxed) ||
        madvise(h->base + off, n, MADV_POPULATE_WRITE) != 0)
      break;
    atomic_store_explicit(&h->faulted, off + n, memory_order_relaxed);
  }
  return NULL;
}

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
    return 0; /* (pinning faulted every page in) */
  }
  h->faulting = pthread_create(&h->faulter, NULL, fault_in, h) == 0;
  return 0;
}

void tier_host_close(tier_host *h) {
  if (!h->base)
    return;
  if (h->faulting) {
    atomic_store_explicit(&h->stop, 1, memory_order_relaxed);
    pthread_join(h->faulter, NULL);
    h->faulting = 0;
  }
  if (h->pinned_by)
    h->pinned_by->ops->host_unregister(h->pinned_by, h->base);
  munmap(h->base, h->bytes);
  h->base = NULL;
}
