/*
 * backend_host.c — the host pool: one memfd, size-sealed, exported as one
 * fd.  Pages are reserved as workers touch them.  The copy engine's copies
 * are memcpy: on the loop thread for a job of up to 1 MiB (a few blocks,
 * less than handing it to a thread would cost), on libuv's thread pool
 * above that, so that a Batch of many copies does not stall every session.
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/pool/backend.h"
#include "kvs_shm.h"
#include "kvs_status.h"

typedef struct host_backend {
  backend b; /* first */
  kvs_region region;
} host_backend;

static void host_close(backend *b) {
  host_backend *h = (host_backend *)b;

  kvs_region_close(&h->region);
  free(h);
}

#define INLINE_COPY_MAX (1u << 20)

/* A thread-pool copy gives its CPU up after every YIELD_BYTES copied. */
#define YIELD_BYTES (256u << 10)

/* The copies of job j (any thread).  yield: on a thread of the pool, where
 * a long job would otherwise keep the loop thread waiting for the CPU: the
 * kernel often wakes the loop onto the CPU this copy runs on, and leaves it
 * there, runnable, for the rest of the copy's time slice (milliseconds),
 * even with the other CPUs idle.  A sched_yield now and then lets it run
 * at once; it costs well under 1% of the copy. */
static void copy_blocks(const backend *b, const copy_job *j, int yield) {
  uint64_t stride = b->layout.block_stride, since = 0;
  char *base = b->base;
  uint32_t i;

  for (i = 0; i < j->n; i++) {
    if (yield && (since += stride) >= YIELD_BYTES) {
      sched_yield();
      since = 0;
    }
    switch (j->kind) {
    case COPY_POOL:
      if (j->blocks[2 * i] != j->blocks[2 * i + 1])
        memcpy(base + j->blocks[2 * i + 1] * stride,
               base + j->blocks[2 * i] * stride, stride);
      break;
    case COPY_TO_HOST:
      memcpy(j->host[i], base + j->blocks[i] * stride, stride);
      break;
    case COPY_FROM_HOST:
      memcpy(base + j->blocks[i] * stride, j->host[i], stride);
      break;
    }
  }
}

typedef struct host_work {
  uv_work_t req;
  backend *b;
  copy_job *j;
} host_work;

static void on_work(uv_work_t *req) {
  host_work *w = (host_work *)req;

  copy_blocks(w->b, w->j, 1);
}

static void on_work_done(uv_work_t *req, int status) {
  host_work *w = (host_work *)req;

  copy_complete(w->j, status < 0 ? status : 0);
  free(w);
}

static int host_copy(backend *b, copy_job *j) {
  host_work *w;
  int rc;

  if ((uint64_t)j->n * b->layout.block_stride <= INLINE_COPY_MAX ||
      !b->loop) {
    copy_blocks(b, j, 0);
    copy_complete(j, 0);
    return 0;
  }
  w = malloc(sizeof(*w));
  if (!w)
    return KVS_ENOMEM;
  w->b = b;
  w->j = j;
  rc = uv_queue_work(b->loop, &w->req, on_work, on_work_done);
  if (rc < 0)
    free(w);
  return rc;
}

static const backend_ops host_ops = {host_close, host_copy, NULL, NULL, NULL};

int backend_host_open(const cfg *c, const kvs_layout *l, backend **out,
                      char *err, size_t err_len) {
  host_backend *h;
  int rc;

  (void)c;
  *out = NULL;
  if (kvs_pool_bytes(l) > SIZE_MAX) {
    snprintf(err, err_len, "pool too big for this machine");
    return KVS_ERANGE;
  }
  h = calloc(1, sizeof(*h));
  if (!h) {
    snprintf(err, err_len, "out of memory");
    return KVS_ENOMEM;
  }
  rc = kvs_region_create("kvshare-pool", (size_t)kvs_pool_bytes(l),
                         &h->region);
  if (rc < 0) {
    snprintf(err, err_len, "memfd of %llu bytes: %s",
             (unsigned long long)kvs_pool_bytes(l), kvs_strerror(rc));
    free(h);
    return rc;
  }
  h->b.ops = &host_ops;
  h->b.layout = *l;
  h->b.base = h->region.base;
  h->b.ex.backend = "host";
  h->b.ex.size = h->region.size;
  h->b.ex.chunk_size = h->region.size;
  h->b.ex.nfds = 1;
  h->b.ex.fds = &h->region.fd;
  h->b.ex.gpu_uuid = "";
  snprintf(h->b.desc, sizeof(h->b.desc), "host memory (memfd, %llu MiB)",
           (unsigned long long)(h->region.size >> 20));
  *out = &h->b;
  return 0;
}
