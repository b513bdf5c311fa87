/*
 * kvs_vmm.h — the GPU pool: device memory allocated with the CUDA virtual
 * memory management API, exported as POSIX file descriptors, and mapped at
 * one contiguous virtual address range in every process that uses it.
 * Internal to kvshare (kvshared and libkvshare link it); not installed.
 *
 * The daemon (kvs__vmm_create) allocates the pool as a few physical chunks
 * (cuMemCreate, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), exports each one
 * once as an fd, reserves one VA range, maps the chunks in order and gives
 * the device read-write access.  A worker (kvs__vmm_import) receives the fds
 * (SCM_RIGHTS), imports them on the device with the same UUID, and maps them
 * the same way, so `base + b * block_stride` is block b in every process,
 * also for a block that straddles two chunks.
 *
 * Chunk sizes are multiples of the device's allocation granularity; every
 * chunk but the last has chunk_size bytes.
 *
 * Everything returns 0 or a negative status with a one-line reason in err;
 * nothing logs.  The calling thread gets the device's primary context made
 * current (kvs__cuda_ctx_open).
 */
#ifndef KVS_VMM_H
#define KVS_VMM_H

#include <stddef.h>
#include <stdint.h>

#include "kvs_cuda_int.h"

/* Most chunks one pool is made of (the fds of one Welcome). */
#define KVS_VMM_MAX_CHUNKS 16

/* What a device offers, read by kvs__vmm_probe. */
typedef struct kvs_vmm_info {
  char uuid[64];
  char name[128];
  uint64_t free_bytes;   /* cuMemGetInfo, at the time of the probe */
  uint64_t total_bytes;
  uint64_t granularity;  /* recommended allocation granularity */
} kvs_vmm_info;

typedef struct kvs_vmm_pool {
  CUdeviceptr base;  /* start of the mapped range; 0 when none */
  uint64_t size;     /* bytes mapped (sum of the chunks) */
  uint64_t chunk_size;
  uint64_t reserved; /* bytes of the VA reservation (0 when none) */
  uint32_t nchunks;  /* chunks the pool is made of */
  uint32_t nhandles; /* allocation handles held */
  uint32_t nmapped;  /* chunks mapped, from the first */
  int nfds;          /* exported fds (created pools only) */
  CUmemGenericAllocationHandle handles[KVS_VMM_MAX_CHUNKS];
  int fds[KVS_VMM_MAX_CHUNKS];
  char uuid[64];
} kvs_vmm_pool;

/*
 * Opens the device `want` (UUID, ordinal, or NULL/"" for the first) and
 * checks that it supports VMM allocations exportable as POSIX fds.
 * KVS_ENODEV (no driver, no device), KVS_ENOENT (no such device),
 * KVS_ENOTSUP (no VMM or no POSIX-fd export on this device or driver).
 */
int kvs__vmm_probe(const char *want, kvs_vmm_info *info, char *err,
                   size_t err_len);

/*
 * The chunk size and count a pool of `bytes` gets: chunk_hint rounded up to
 * the granularity, grown when more than KVS_VMM_MAX_CHUNKS chunks would be
 * needed; *total is the bytes allocated (the last chunk rounded up too).
 */
void kvs__vmm_plan(uint64_t bytes, uint64_t chunk_hint, uint64_t granularity,
                   uint64_t *chunk, uint32_t *nchunks, uint64_t *total);

/*
 * Allocates, exports, reserves, maps and sets access for a pool of at least
 * `bytes` (kvs__vmm_plan with chunk_hint) on the device kvs__vmm_probe
 * opened.  On failure nothing is left allocated.  KVS_ENOMEM when the device
 * has not enough memory.
 */
int kvs__vmm_create(uint64_t bytes, uint64_t chunk_hint, kvs_vmm_pool *p,
                    char *err, size_t err_len);

/*
 * Imports a pool another process created: nfds fds (the caller keeps and
 * closes them), every chunk chunk_size bytes but the last, `size` bytes in
 * all, on the device with UUID `uuid`.  KVS_ENODEV (no driver, or the GPU
 * is not visible here), KVS_ENOTSUP, KVS_EPROTO (sizes that do not add up),
 * KVS_ESTATE (this process already works on another GPU), or the driver's
 * error mapped to a status.  On failure nothing is left mapped or held.
 */
int kvs__vmm_import(const char *uuid, const int *fds, int nfds,
                    uint64_t chunk_size, uint64_t size, kvs_vmm_pool *p,
                    char *err, size_t err_len);

/* Unmaps, releases, frees the VA range and closes exported fds.  Safe on a
 * zeroed pool and twice. */
void kvs__vmm_close(kvs_vmm_pool *p);

#endif /* KVS_VMM_H */
