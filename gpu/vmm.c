/*
 * vmm.c — the GPU pool's memory: CUDA VMM chunks exported as POSIX fds by
 * the daemon, imported and mapped at one contiguous VA range by workers.
 * See kvs_vmm.h.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "kvs_status.h"
#include "kvs_vmm.h"

static void prop_init(CUmemAllocationProp *prop, CUdevice dev) {
  memset(prop, 0, sizeof *prop);
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop->location.id = dev;
}

/* A driver call that failed: the reason, and its status. */
static int cu_fail(char *err, size_t err_len, const char *what, CUresult r) {
  kvs__cu_describe(err, err_len, what, r);
  return kvs__cu_status(r);
}

static int granularity(CUdevice dev, uint64_t *g, char *err, size_t err_len) {
  CUmemAllocationProp prop;
  size_t v = 0;
  CUresult r;

  prop_init(&prop, dev);
  r = kvs__cu.cuMemGetAllocationGranularity(&v, &prop,
                                       CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  if (r != CUDA_SUCCESS)
    return cu_fail(err, err_len, "cuMemGetAllocationGranularity", r);
  if (v == 0 || (v & (v - 1))) {
    snprintf(err, err_len, "the driver reports an allocation granularity of "
             "%zu bytes", v);
    return KVS_EINTERNAL;
  }
  *g = v;
  return 0;
}

/* The context of device `want`, with VMM and POSIX-fd export checked. */
static int open_vmm(const char *want, char *err, size_t err_len) {
  CUdevice dev;
  int vmm = 0, posix = 0, rc;

  rc = kvs__cuda_ctx_open(want, err, err_len);
  if (rc)
    return rc;
  if (!kvs__cu_vmm) {
    snprintf(err, err_len, "the CUDA driver lacks the virtual memory "
             "management API (cuMemCreate ...; driver too old)");
    return KVS_ENOTSUP;
  }
  dev = kvs__cuda_device();
  if (kvs__cu.cuDeviceGetAttribute(&vmm, CU_ATTR_VMM_SUPPORTED, dev) !=
          CUDA_SUCCESS ||
      !vmm) {
    snprintf(err, err_len, "%s does not support virtual memory management",
             kvs__cuda_uuid());
    return KVS_ENOTSUP;
  }
  if (kvs__cu.cuDeviceGetAttribute(&posix, CU_ATTR_POSIX_FD_SUPPORTED, dev) !=
          CUDA_SUCCESS ||
      !posix) {
    snprintf(err, err_len, "%s cannot export memory as POSIX file "
             "descriptors", kvs__cuda_uuid());
    return KVS_ENOTSUP;
  }
  return 0;
}

int kvs__vmm_probe(const char *want, kvs_vmm_info *info, char *err,
                   size_t err_len) {
  size_t fr = 0, tot = 0;
  CUresult r;
  int rc;

  memset(info, 0, sizeof *info);
  rc = open_vmm(want, err, err_len);
  if (rc)
    return rc;
  snprintf(info->uuid, sizeof info->uuid, "%s", kvs__cuda_uuid());
  if (kvs__cu.cuDeviceGetName(info->name, (int)sizeof info->name,
                         kvs__cuda_device()) != CUDA_SUCCESS)
    snprintf(info->name, sizeof info->name, "?");
  r = kvs__cu.cuMemGetInfo(&fr, &tot);
  if (r != CUDA_SUCCESS)
    return cu_fail(err, err_len, "cuMemGetInfo", r);
  info->free_bytes = fr;
  info->total_bytes = tot;
  return granularity(kvs__cuda_device(), &info->granularity, err, err_len);
}

static uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

void kvs__vmm_plan(uint64_t bytes, uint64_t chunk_hint, uint64_t g,
                   uint64_t *chunk, uint32_t *nchunks, uint64_t *total) {
  uint64_t c, n;

  if (bytes == 0)
    bytes = 1;
  c = round_up(chunk_hint ? chunk_hint : bytes, g);
  if (c > round_up(bytes, g))
    c = round_up(bytes, g);
  n = (bytes + c - 1) / c;
  if (n > KVS_VMM_MAX_CHUNKS) {
    c = round_up((bytes + KVS_VMM_MAX_CHUNKS - 1) / KVS_VMM_MAX_CHUNKS, g);
    n = (bytes + c - 1) / c;
  }
  *chunk = c;
  *nchunks = (uint32_t)n;
  *total = (n - 1) * c + round_up(bytes - (n - 1) * c, g);
}

/* Bytes of chunk i. */
static uint64_t chunk_bytes(const kvs_vmm_pool *p, uint32_t i) {
  return i + 1 < p->nchunks ? p->chunk_size
                            : p->size - (uint64_t)(p->nchunks - 1) * p->chunk_size;
}

/* Reserves the VA range, maps every chunk in order and sets access. */
static int map_all(kvs_vmm_pool *p, uint64_t align, char *err,
                   size_t err_len) {
  CUmemAccessDesc acc;
  uint64_t off = 0;
  uint32_t i;
  CUresult r;

  r = kvs__cu.cuMemAddressReserve(&p->base, p->size, align, 0, 0);
  if (r != CUDA_SUCCESS) {
    p->base = 0;
    return cu_fail(err, err_len, "cuMemAddressReserve", r);
  }
  p->reserved = p->size;
  for (i = 0; i < p->nchunks; i++) {
    r = kvs__cu.cuMemMap(p->base + off, chunk_bytes(p, i), 0, p->handles[i], 0);
    if (r != CUDA_SUCCESS)
      return cu_fail(err, err_len, "cuMemMap", r);
    p->nmapped++;
    off += chunk_bytes(p, i);
  }
  memset(&acc, 0, sizeof acc);
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location.id = kvs__cuda_device();
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  r = kvs__cu.cuMemSetAccess(p->base, p->size, &acc, 1);
  if (r != CUDA_SUCCESS)
    return cu_fail(err, err_len, "cuMemSetAccess", r);
  return 0;
}

static void pool_init(kvs_vmm_pool *p) {
  int i;

  memset(p, 0, sizeof *p);
  for (i = 0; i < KVS_VMM_MAX_CHUNKS; i++)
    p->fds[i] = -1;
}

int kvs__vmm_create(uint64_t bytes, uint64_t chunk_hint, kvs_vmm_pool *p,
                    char *err, size_t err_len) {
  CUmemAllocationProp prop;
  uint64_t g;
  uint32_t i;
  CUresult r;
  int rc;

  pool_init(p);
  rc = open_vmm(NULL, err, err_len);
  if (rc)
    return rc;
  rc = granularity(kvs__cuda_device(), &g, err, err_len);
  if (rc)
    return rc;
  kvs__vmm_plan(bytes, chunk_hint, g, &p->chunk_size, &p->nchunks, &p->size);
  snprintf(p->uuid, sizeof p->uuid, "%s", kvs__cuda_uuid());
  prop_init(&prop, kvs__cuda_device());
  for (i = 0; i < p->nchunks; i++) {
    char what[64];

    r = kvs__cu.cuMemCreate(&p->handles[i], chunk_bytes(p, i), &prop, 0);
    if (r != CUDA_SUCCESS) {
      snprintf(what, sizeof what, "cuMemCreate of chunk %u (%llu bytes)", i,
               (unsigned long long)chunk_bytes(p, i));
      rc = cu_fail(err, err_len, what, r);
      goto fail;
    }
    p->nhandles++;
    r = kvs__cu.cuMemExportToShareableHandle(&p->fds[i], p->handles[i],
                                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                        0);
    if (r != CUDA_SUCCESS || p->fds[i] < 0) {
      p->fds[i] = -1;
      rc = cu_fail(err, err_len, "cuMemExportToShareableHandle", r);
      goto fail;
    }
    p->nfds++;
  }
  rc = map_all(p, g, err, err_len);
  if (rc)
    goto fail;
  return 0;
fail:
  kvs__vmm_close(p);
  return rc;
}

int kvs__vmm_import(const char *uuid, const int *fds, int nfds,
                    uint64_t chunk_size, uint64_t size, kvs_vmm_pool *p,
                    char *err, size_t err_len) {
  uint64_t g;
  uint32_t i;
  CUresult r;
  int rc;

  pool_init(p);
  if (!uuid || !*uuid) {
    snprintf(err, err_len, "the daemon did not name the pool's GPU");
    return KVS_EPROTO;
  }
  if (nfds < 1 || nfds > KVS_VMM_MAX_CHUNKS || !chunk_size ||
      (uint64_t)(nfds - 1) * chunk_size >= size ||
      size - (uint64_t)(nfds - 1) * chunk_size > chunk_size) {
    snprintf(err, err_len, "a pool of %llu bytes cannot be %d chunks of %llu",
             (unsigned long long)size, nfds, (unsigned long long)chunk_size);
    return KVS_EPROTO;
  }
  rc = open_vmm(uuid, err, err_len);
  if (rc == KVS_ENOENT) {
    char why[256];

    snprintf(why, sizeof why, "%s", err);
    snprintf(err, err_len, "the pool lives on %s, which this process cannot "
             "use: %s", uuid, why);
    return KVS_ENODEV;
  }
  if (rc)
    return rc;
  rc = granularity(kvs__cuda_device(), &g, err, err_len);
  if (rc)
    return rc;
  if (chunk_size % g || size % g) {
    snprintf(err, err_len, "chunks of %llu bytes are not multiples of the "
             "device's granularity (%llu)", (unsigned long long)chunk_size,
             (unsigned long long)g);
    return KVS_EPROTO;
  }
  p->chunk_size = chunk_size;
  p->size = size;
  p->nchunks = (uint32_t)nfds;
  snprintf(p->uuid, sizeof p->uuid, "%s", uuid);
  for (i = 0; i < p->nchunks; i++) {
    r = kvs__cu.cuMemImportFromShareableHandle(&p->handles[i],
                                          (void *)(uintptr_t)fds[i],
                                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (r != CUDA_SUCCESS) {
      char what[64];

      snprintf(what, sizeof what, "cuMemImportFromShareableHandle of chunk %u",
               i);
      rc = cu_fail(err, err_len, what, r);
      goto fail;
    }
    p->nhandles++;
  }
  rc = map_all(p, g, err, err_len);
  if (rc)
    goto fail;
  return 0;
fail:
  kvs__vmm_close(p);
  return rc;
}

void kvs__vmm_close(kvs_vmm_pool *p) {
  uint64_t off = 0;
  uint32_t i;
  int j;

  for (i = 0; i < p->nmapped; i++) {
    kvs__cu.cuMemUnmap(p->base + off, chunk_bytes(p, i));
    off += chunk_bytes(p, i);
  }
  p->nmapped = 0;
  for (i = 0; i < p->nhandles; i++)
    kvs__cu.cuMemRelease(p->handles[i]);
  p->nhandles = 0;
  if (p->reserved)
    kvs__cu.cuMemAddressFree(p->base, p->reserved);
  p->reserved = 0;
  p->base = 0;
  for (j = 0; j < p->nfds; j++) {
    close(p->fds[j]);
    p->fds[j] = -1;
  }
  p->nfds = 0;
}
