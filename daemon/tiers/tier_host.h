/*
 * tier_host.h — the host tier's memory: slots of one block each in one
 * anonymous mapping of the daemon's, pinned (registered with the CUDA
 * driver) when the pool is on a GPU so the copy engine's copies stay
 * asynchronous.  The core keeps the books; this only owns the bytes.
 */
#ifndef KVS_DAEMON_TIER_HOST_H
#define KVS_DAEMON_TIER_HOST_H

#include <stddef.h>
#include <stdint.h>

typedef struct backend backend;

typedef struct tier_host {
  uint8_t *base;
  size_t bytes;
  uint64_t slot_bytes;
  uint32_t nslots;
  backend *pinned_by; /* the backend that registered it, or NULL */
} tier_host;

/* As many slots of block_bytes as fit in bytes.  0, or a negative status
 * with a reason in err. */
int tier_host_open(tier_host *h, backend *pool, uint64_t bytes,
                   uint64_t block_bytes, char *err, size_t err_len);
void tier_host_close(tier_host *h);

static inline void *tier_host_slot(const tier_host *h, uint32_t s) {
  return h->base + (size_t)s * h->slot_bytes;
}

#endif
