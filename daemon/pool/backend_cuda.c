/*
 * backend_cuda.c — the GPU pool: device memory allocated with the CUDA
 * virtual memory management API in a few large chunks (gpu/vmm.c), each
 * exported once as a POSIX fd and sent to every worker with its Welcome.
 * The daemon maps the pool too, for the copies its copy engine makes on
 * its own non-blocking stream; the end of each job reaches the loop through
 * a host function on that stream (cuLaunchHostFunc -> copy_complete).
 *
 * The driver is reached only through gpu/'s dlopen'ed table, so this file
 * builds and links everywhere; without a driver or a GPU, opening fails
 * with KVS_ENODEV and a reason (backend auto then takes the host pool).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/log.h"
#include "daemon/pool/backend.h"
#include "gpu/kvs_vmm.h"
#include "kvs_status.h"

typedef struct cuda_backend {
  backend b; /* first */
  kvs_vmm_pool vmm;
  CUstream stream; /* the copy engine's */
  int batch;       /* device <-> host jobs as one cuMemcpyBatchAsync */
} cuda_backend;

/* A batched job's arrays, kept until the stream has run it. */
typedef struct batch_args {
  copy_job *j;
  CUdeviceptr *dsts, *srcs;
  size_t *sizes;
} batch_args;

static void cuda_close(backend *b) {
  cuda_backend *g = (cuda_backend *)b;

  if (g->stream) {
    kvs__cu.cuStreamSynchronize(g->stream);
    kvs__cu.cuStreamDestroy(g->stream);
  }
  kvs__vmm_close(&g->vmm);
  free(g);
}

/* On the driver's callback thread, once the stream has run the job. */
static void on_stream_done(void *arg) { copy_complete(arg, 0); }

static void on_batch_done(void *arg) {
  batch_args *a = arg;
  copy_job *j = a->j;

  free(a);
  copy_complete(j, 0);
}

/* A job of device <-> host copies (n > 1, none depending on another: each
 * block and each host buffer is in it once) as one batched call, the
 * driver's copy engine splitting it as it likes.  0: queued; 1: not
 * batched (nothing queued: the caller copies block by block); < 0: a
 * status (what was queued has landed). */
static int copy_batched(cuda_backend *g, copy_job *j) {
  uint64_t stride = g->b.layout.block_stride;
  CUmemcpyAttributes attr;
  size_t idx0 = 0;
  batch_args *a;
  CUresult r;

  if (!g->batch || j->n < 2 || j->kind == COPY_POOL)
    return 1;
  a = malloc(sizeof(*a) + (size_t)j->n * (2 * sizeof(CUdeviceptr) +
                                          sizeof(size_t)));
  if (a == NULL)
    return 1;
  a->j = j;
  a->dsts = (CUdeviceptr *)(a + 1);
  a->srcs = a->dsts + j->n;
  a->sizes = (size_t *)(a->srcs + j->n);
  for (uint32_t i = 0; i < j->n; i++) {
    CUdeviceptr dev = g->vmm.base + j->blocks[i] * stride;
    CUdeviceptr host = (CUdeviceptr)(uintptr_t)j->host[i];

    a->dsts[i] = j->kind == COPY_TO_HOST ? host : dev;
    a->srcs[i] = j->kind == COPY_TO_HOST ? dev : host;
    a->sizes[i] = stride;
  }
  memset(&attr, 0, sizeof(attr));
  attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
  r = kvs__cu.cuMemcpyBatchAsync(a->dsts, a->srcs, a->sizes, j->n, &attr,
                                 &idx0, 1, g->stream);
  if (r != CUDA_SUCCESS) {
    /* Refused before anything was queued: this job block by block; a
     * driver that does not batch this memory (an invalid value, not
     * supported), every job from now on, said once. */
    if (r == CUDA_ERROR_INVALID_VALUE || r == CUDA_ERROR_NOT_SUPPORTED) {
      char why[160];

      kvs__cu_describe(why, sizeof(why), "cuMemcpyBatchAsync", r);
      log_warn(0, "%s: device <-> host copies go block by block from now on",
               why);
      g->batch = 0;
    }
    free(a);
    return 1;
  }
  r = kvs__cu.cuLaunchHostFunc(g->stream, on_batch_done, a);
  if (r != CUDA_SUCCESS) {
    kvs__cu.cuStreamSynchronize(g->stream);
    free(a);
    return kvs__cu_status(r);
  }
  return 0;
}

static int cuda_copy(backend *b, copy_job *j) {
  cuda_backend *g = (cuda_backend *)b;
  uint64_t stride = b->layout.block_stride;
  CUdeviceptr base = g->vmm.base;
  CUresult r = CUDA_SUCCESS;
  uint32_t i;
  int rc = copy_batched(g, j);

  if (rc <= 0)
    return rc;
  for (i = 0; i < j->n && r == CUDA_SUCCESS; i++) {
    switch (j->kind) {
    case COPY_POOL:
      if (j->blocks[2 * i] != j->blocks[2 * i + 1])
        r = kvs__cu.cuMemcpyDtoDAsync(base + j->blocks[2 * i + 1] * stride,
                                      base + j->blocks[2 * i] * stride,
                                      stride, g->stream);
      break;
    case COPY_TO_HOST:
      r = kvs__cu.cuMemcpyDtoHAsync(j->host[i], base + j->blocks[i] * stride,
                                    stride, g->stream);
      break;
    case COPY_FROM_HOST:
      r = kvs__cu.cuMemcpyHtoDAsync(base + j->blocks[i] * stride, j->host[i],
                                    stride, g->stream);
      break;
    }
  }
  if (r == CUDA_SUCCESS)
    r = kvs__cu.cuLaunchHostFunc(g->stream, on_stream_done, j);
  if (r != CUDA_SUCCESS) {
    /* Whatever was queued must land before the caller may reuse the
     * blocks: wait for it (an error path; the loop stalls for one job). */
    kvs__cu.cuStreamSynchronize(g->stream);
    return kvs__cu_status(r);
  }
  return 0;
}

/* KVS_EDEVICE once the context is lost (the stream answers with the
 * fault), else 0: busy (NOT_READY), idle, or an error that leaves the
 * context usable (its jobs still report their end). */
static int cuda_check(backend *b) {
  CUresult r = kvs__cu.cuStreamQuery(((cuda_backend *)b)->stream);
  int rc = kvs__cu_status(r);

  return rc == KVS_EDEVICE ? rc : 0;
}

static int cuda_host_register(backend *b, void *p, size_t len) {
  (void)b;
  return kvs__cu_status(kvs__cu.cuMemHostRegister(p, len, 0));
}

static void cuda_host_unregister(backend *b, void *p) {
  (void)b;
  kvs__cu.cuMemHostUnregister(p);
}

static const backend_ops cuda_ops = {cuda_close, cuda_copy, cuda_check,
                                     cuda_host_register,
                                     cuda_host_unregister};

/* gpu_memory_fraction: the number of blocks F x (free - reserve) holds. */
static int size_from_fraction(const cfg *c, const kvs_vmm_info *info,
                              kvs_layout *l, char *err, size_t err_len) {
  uint64_t usable = 0, n;

  if (info->free_bytes > c->gpu_reserve + info->granularity)
    usable = info->free_bytes - c->gpu_reserve - info->granularity;
  n = (uint64_t)((double)usable * c->gpu_memory_fraction) / l->block_stride;
  if (n > CFG_MAX_BLOCKS)
    n = CFG_MAX_BLOCKS;
  if (n == 0) {
    snprintf(err, err_len, "gpu_memory_fraction %g of %s's %llu MiB free "
             "(less gpu_reserve %llu MiB) holds no block of %llu bytes",
             c->gpu_memory_fraction, info->uuid,
             (unsigned long long)(info->free_bytes >> 20),
             (unsigned long long)(c->gpu_reserve >> 20),
             (unsigned long long)l->block_stride);
    return KVS_ENOMEM;
  }
  if (c->reserve_blocks >= n) {
    snprintf(err, err_len, "reserve_blocks %u must be below the pool's %llu "
             "blocks", c->reserve_blocks, (unsigned long long)n);
    return KVS_EINVAL;
  }
  l->num_blocks = (uint32_t)n;
  return kvs_layout_finish(l) < 0 ? KVS_EINVAL : 0;
}

int backend_cuda_open(const cfg *c, kvs_layout *l, backend **out, char *err,
                      size_t err_len) {
  cuda_backend *g;
  kvs_vmm_info info;
  CUresult r;
  int rc;

  *out = NULL;
  rc = kvs__vmm_probe(c->gpu, &info, err, err_len);
  if (rc)
    return rc;
  if (c->gpu_memory_fraction > 0) {
    rc = size_from_fraction(c, &info, l, err, err_len);
    if (rc)
      return rc;
  }
  if (kvs_pool_bytes(l) > info.free_bytes) {
    snprintf(err, err_len, "the pool (%u blocks, %llu MiB) is larger than "
             "the free memory of %s (%llu of %llu MiB)", l->num_blocks,
             (unsigned long long)(kvs_pool_bytes(l) >> 20), info.uuid,
             (unsigned long long)(info.free_bytes >> 20),
             (unsigned long long)(info.total_bytes >> 20));
    return KVS_ENOMEM;
  }
  g = calloc(1, sizeof(*g));
  if (!g) {
    snprintf(err, err_len, "out of memory");
    return KVS_ENOMEM;
  }
  rc = kvs__vmm_create(kvs_pool_bytes(l), c->gpu_chunk_size, &g->vmm, err,
                       err_len);
  if (rc) {
    free(g);
    return rc;
  }
  g->b.ops = &cuda_ops;
  r = kvs__cu.cuStreamCreate(&g->stream, CU_STREAM_NON_BLOCKING);
  if (r != CUDA_SUCCESS) {
    g->stream = NULL;
    kvs__cu_describe(err, err_len, "cuStreamCreate", r);
    rc = kvs__cu_status(r);
    goto fail;
  }
  /* New device memory holds whatever was there before: a FREE block reads
   * as zeros, as on the host pool.  A memset of device memory may return
   * before it is done, and the copy stream does not wait for the NULL
   * stream: wait here, before any worker or copy can touch the pool. */
  r = kvs__cu.cuMemsetD8(g->vmm.base, 0, g->vmm.size);
  if (r == CUDA_SUCCESS)
    r = kvs__cu.cuCtxSynchronize();
  if (r != CUDA_SUCCESS) {
    kvs__cu_describe(err, err_len, "clearing the pool (cuMemsetD8)", r);
    rc = kvs__cu_status(r);
    goto fail;
  }
  g->b.layout = *l;
  g->b.base = (void *)(uintptr_t)g->vmm.base;
  g->b.ex.backend = "cuda";
  g->b.ex.size = g->vmm.size;
  g->b.ex.chunk_size = g->vmm.chunk_size;
  g->b.ex.nfds = g->vmm.nfds;
  g->b.ex.fds = g->vmm.fds;
  g->b.ex.gpu_uuid = g->vmm.uuid;
  g->batch = kvs__cu_batch;
  snprintf(g->b.desc, sizeof(g->b.desc), "GPU %s (%s, %llu MiB free of %llu "
           "before the pool): %llu MiB in %u chunk%s of %llu MiB; device <-> "
           "host copies %s",
           info.uuid, info.name, (unsigned long long)(info.free_bytes >> 20),
           (unsigned long long)(info.total_bytes >> 20),
           (unsigned long long)(g->vmm.size >> 20), g->vmm.nchunks,
           g->vmm.nchunks == 1 ? "" : "s",
           (unsigned long long)(g->vmm.chunk_size >> 20),
           g->batch ? "batched (cuMemcpyBatchAsync)" : "block by block");
  *out = &g->b;
  return 0;
fail:
  cuda_close(&g->b);
  return rc;
}
