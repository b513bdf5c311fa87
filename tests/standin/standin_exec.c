/*
 * standin_exec.c — streams, events, modules and kernel launches of the
 * stand-in CUDA driver (what the stand-in is: see cuda_standin.c).
 *
 * A stream is a thread and a FIFO of operations (async copies, kernels,
 * event records, host functions): the call that enqueues returns at once
 * and the thread runs the operations in order, so a caller that reads a
 * result before synchronising sees stale bytes, as on a GPU.  The legacy
 * NULL stream runs an operation on the calling thread, after the context's
 * blocking streams (created without CU_STREAM_NON_BLOCKING) drained.
 *
 * Kernels are the C twins run on the stream's thread over the "device"
 * pointers (which are host addresses here).  Before a kernel runs, every
 * range it will touch is checked to be device memory; a kernel that would
 * touch anything else, or whose C twin returns an error, faults the context
 * (standin__fault).  After a fault nothing more runs in that context, host
 * functions included.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

#include "flash_model.h"
#include "gpu/kvs_kernels_int.h"
#include "gpu/kvs_prefill_sched.h"
#include "kvs_status.h"
#include "standin_int.h"

/* ---- the kernels kvshare's fatbin holds (gpu/kernels.cu) ----------------- */

enum kernel_kind {
  K_WRITE,
  K_BLOCKS,
  K_ATTN,
  K_ATTN_MMA,
  K_MERGE,
  K_FLASH,
  K_FLASH_MERGE
};

struct CUfunc_st {
  const char *name;
  enum kernel_kind kind;
  unsigned max_threads; /* __launch_bounds__ in kernels.cu, else 1024 */
};

#define ATTN_G(dt, nv)                                                       \
  {"kvs_attn_" dt "_nv" nv "_g1", K_ATTN, 256},                              \
  {"kvs_attn_" dt "_nv" nv "_g2", K_ATTN, 256},                              \
  {"kvs_attn_" dt "_nv" nv "_g4", K_ATTN, 256},                              \
  {"kvs_attn_" dt "_nv" nv "_g8", K_ATTN, 256}

static struct CUfunc_st kernels[] = {
    {"kvs_write_kv_kernel", K_WRITE, 1024},
    {"kvs_write_kv_q_kernel", K_WRITE, 128},
    {"kvs_blocks_kernel", K_BLOCKS, 1024},
    {"kvs_attn_merge_kernel", K_MERGE, 1024},
    ATTN_G("fp32", "1"),
    ATTN_G("fp32", "2"),
    ATTN_G("fp16", "1"),
    ATTN_G("fp16", "2"),
    ATTN_G("bf16", "1"),
    ATTN_G("bf16", "2"),
    ATTN_G("int8", "1"),
    {"kvs_attn_int8_nv2_g1", K_ATTN, 256},
    {"kvs_attn_int8_nv2_g2", K_ATTN, 256},
    {"kvs_attn_int8_nv2_g4", K_ATTN, 256},
    ATTN_G("fp8", "1"),
    {"kvs_attn_fp8_nv2_g1", K_ATTN, 256},
    {"kvs_attn_fp8_nv2_g2", K_ATTN, 256},
    {"kvs_attn_fp8_nv2_g4", K_ATTN, 256},
    {"kvs_attn_mma_fp16_d64", K_ATTN_MMA, 256},
    {"kvs_attn_mma_fp16_d128", K_ATTN_MMA, 256},
    {"kvs_attn_mma_bf16_d64", K_ATTN_MMA, 256},
    {"kvs_attn_mma_bf16_d128", K_ATTN_MMA, 256},
    /* the flash prefill kernel: run as its C model (flash_model.c) */
    {"kvs_prefill_flash_fp16_d64", K_FLASH, KVS__PF_THREADS},
    {"kvs_prefill_flash_fp16_d128", K_FLASH, KVS__PF_THREADS},
    {"kvs_prefill_flash_fp16_d256", K_FLASH, KVS__PF_THREADS},
    {"kvs_prefill_flash_bf16_d64", K_FLASH, KVS__PF_THREADS},
    {"kvs_prefill_flash_bf16_d128", K_FLASH, KVS__PF_THREADS},
    {"kvs_prefill_flash_bf16_d256", K_FLASH, KVS__PF_THREADS},
    {"kvs_prefill_flash_wg_fp16_d128", K_FLASH, KVS__PF_THREADS},
    {"kvs_prefill_flash_wg_bf16_d128", K_FLASH, KVS__PF_THREADS},
    {"kvs_prefill_flash_int8_fp16_d64", K_FLASH, KVS__PF_THREADS},
    {"kvs_prefill_flash_int8_fp16_d128", K_FLASH, KVS__PF_THREADS},
    {"kvs_prefill_flash_int8_bf16_d64", K_FLASH, KVS__PF_THREADS},
    {"kvs_prefill_flash_int8_bf16_d128", K_FLASH, KVS__PF_THREADS},
    {"kvs_prefill_flash_fp8_fp16_d64", K_FLASH, KVS__PF_THREADS},
    {"kvs_prefill_flash_fp8_fp16_d128", K_FLASH, KVS__PF_THREADS},
    {"kvs_prefill_flash_fp8_bf16_d64", K_FLASH, KVS__PF_THREADS},
    {"kvs_prefill_flash_fp8_bf16_d128", K_FLASH, KVS__PF_THREADS},
    {"kvs_prefill_flash_merge_kernel", K_FLASH_MERGE, 1024},
};
#define NKERNELS (sizeof kernels / sizeof kernels[0])

/* Static shared memory a block may ask for without cuFuncSetAttribute. */
#define MAX_SMEM (48u * 1024)

/* The kernels' parameters (gpu/cuda_driver.c), copied at launch. */
typedef struct blocks_params {
  char *base;
  uint64_t stride;
  char *staging;
  const uint32_t *idx;
  int mode; /* 0 pairs, 1 gather, else scatter */
} blocks_params;

typedef struct attn_params {
  kvs_attn_args a;
  int prefill;
  uint32_t lanes; /* CUDA-core kernels only */
  uint32_t split;
} attn_params;

union kernel_params {
  kvs_write_args write;
  blocks_params blocks;
  attn_params attn;
};

struct CUmod_st {
  struct CUmod_st *next;
  struct CUctx_st *ctx;
};

/* ---- streams, events, operations ----------------------------------------- */

enum op_kind { OP_COPY, OP_KERNEL, OP_EVENT, OP_HOST_FN };

struct op {
  struct op *next;
  enum op_kind kind;
  union {
    struct {
      void *dst;
      const void *src;
      size_t bytes;
      int dev_dst, dev_src; /* which side is device memory */
      void *staged;         /* pageable source copied at enqueue; owned */
    } copy;
    struct {
      const struct CUfunc_st *f;
      unsigned grid[3];
      union kernel_params p;
    } kernel;
    struct {
      struct CUevent_st *e;
      uint64_t seq; /* which cuEventRecord of e this is */
    } event;
    struct {
      CUhostFn fn;
      void *data;
    } host;
  } u;
};

struct CUstream_st {
  struct CUstream_st *next;
  struct CUctx_st *ctx;
  unsigned flags;
  pthread_t thread;
  pthread_cond_t work; /* the thread waits here for operations */
  struct op *head, *tail;
  int running; /* the thread is executing an operation */
  int stop;    /* cuStreamDestroy: exit once the FIFO is empty */
  int dying;   /* cuStreamDestroy in progress: the handle is gone */
};

struct CUevent_st {
  struct CUevent_st *next;
  struct CUctx_st *ctx;
  unsigned flags;
  uint64_t recorded; /* cuEventRecord calls */
  uint64_t reached;  /* the latest of them a stream completed */
  struct timespec when;
  int refs; /* the caller's handle, plus one per queued record */
};

static struct CUstream_st *streams;
static struct CUevent_st *events; /* those the caller has not destroyed */
static struct CUmod_st *modules;  /* kept for the process (no unload) */

static int busy_locked(const struct CUstream_st *s) {
  return s->head || s->running;
}

void standin__drain_locked(struct CUctx_st *ctx, int all) {
  for (;;) {
    struct CUstream_st *s;

    for (s = streams; s; s = s->next)
      if (s->ctx == ctx && (all || !(s->flags & CU_STREAM_NON_BLOCKING)) &&
          busy_locked(s))
        break;
    if (!s)
      return;
    pthread_cond_wait(&standin__changed, &standin__lock);
  }
}

static void event_put_locked(struct CUevent_st *e) {
  if (--e->refs == 0)
    free(e);
}

static void op_free(struct op *op) {
  if (op->kind == OP_COPY)
    free(op->u.copy.staged);
  if (op->kind == OP_EVENT) {
    pthread_mutex_lock(&standin__lock);
    event_put_locked(op->u.event.e);
    pthread_mutex_unlock(&standin__lock);
  }
  free(op);
}

/* ---- kernel emulation ---------------------------------------------------- */

/* Does the kernel's access to [p, p + n) hit device memory?  0, or -1 with
 * why filled. */
static int need(const char *what, const void *p, uint64_t n, int write,
                char *why, size_t len) {
  if (n <= SIZE_MAX && standin__dev_range(p, (size_t)n, write))
    return 0;
  snprintf(why, len, "%s [%p, +%llu bytes) is not %s device memory", what, p,
           (unsigned long long)n, write ? "writable" : "readable");
  return -1;
}

static const void *at(const void *base, uint64_t i, uint64_t stride) {
  return (const char *)base + i * stride;
}

static int twin_failed(int rc, const char *twin, char *why, size_t len) {
  if (rc == 0)
    return 0;
  snprintf(why, len, "its C twin %s returned %s (%s)", twin,
           kvs_status_name(rc), kvs_strerror(rc));
  return -1;
}

/* kvs_write_kv_kernel and kvs_write_kv_q_kernel (int8/fp8 caches): one
 * CUDA block per token (grid.x), a slot < 0 or past the pool skipped, as
 * kernels.cu does. */
static int run_write(const struct op *op, char *why, size_t len) {
  kvs_write_args a = op->u.kernel.p.write;
  const kvs_paged_kv *kv = &a.kv;
  uint32_t n = op->u.kernel.grid[0];
  size_t ses = kvs_dtype_size(a.src_dtype), des = kvs_dtype_size(kv->dtype);
  uint64_t limit = (uint64_t)kv->num_blocks * kv->block_size;
  uint64_t row = (uint64_t)kv->num_kv_heads * kv->head_dim;
  int64_t *slots;
  int rc;

  if (need("slots", a.slots, (uint64_t)n * sizeof *slots, 0, why, len))
    return -1;
  slots = malloc((size_t)n * sizeof *slots);
  if (!slots)
    return twin_failed(KVS_ENOMEM, "(copy of the slots)", why, len);
  memcpy(slots, a.slots, (size_t)n * sizeof *slots);
  rc = 0;
  if (ses && des && kv->block_size) { /* else the twin refuses the args */
    uint64_t src = ((uint64_t)(n - 1) * a.src_token_stride + row) * ses;

    if (need("k", a.k, src, 0, why, len) || need("v", a.v, src, 0, why, len))
      rc = -1;
    for (uint32_t i = 0; i < n && !rc; i++) {
      if (slots[i] < 0 || (kv->num_blocks && (uint64_t)slots[i] >= limit)) {
        slots[i] = -1;
        continue;
      }
      rc = need("the slot's block",
                at(kv->base, (uint64_t)slots[i] / kv->block_size,
                   kv->block_stride),
                kv->block_stride, 1, why, len);
    }
  }
  if (rc == 0) {
    a.slots = slots;
    a.num_tokens = n;
    rc = twin_failed(kvs_cpu_write_kv(&a, NULL), "kvs_cpu_write_kv", why, len);
  }
  free(slots);
  return rc;
}

/* kvs_blocks_kernel: grid.x items; mode 0 copies pairs, 1 gathers into
 * staging, anything else scatters from it (kernels.cu's branches). */
static int run_blocks(const struct op *op, char *why, size_t len) {
  const blocks_params *b = &op->u.kernel.p.blocks;
  uint32_t n = op->u.kernel.grid[0];
  uint64_t stride = b->stride;

  if (b->mode == 0) {
    if (need("pairs", b->idx, (uint64_t)n * 8, 0, why, len))
      return -1;
    for (uint32_t i = 0; i < n; i++) {
      uint32_t src = b->idx[2 * i], dst = b->idx[2 * i + 1];

      if (src != dst && (need("source block", at(b->base, src, stride), stride,
                              0, why, len) ||
                         need("destination block", at(b->base, dst, stride),
                              stride, 1, why, len)))
        return -1;
    }
    kvs_copy_args c = {.base = b->base, .block_stride = stride,
                       .pairs = b->idx, .num_pairs = n};
    return twin_failed(kvs_cpu_copy_blocks(&c, NULL), "kvs_cpu_copy_blocks",
                       why, len);
  }
  int gather = b->mode == 1;
  if (need("block indexes", b->idx, (uint64_t)n * 4, 0, why, len))
    return -1;
  for (uint32_t i = 0; i < n; i++)
    if (need("pool block", at(b->base, b->idx[i], stride), stride, !gather,
             why, len) ||
        need("staging slot", at(b->staging, i, stride), stride, gather, why,
             len))
      return -1;
  kvs_xfer_args x = {.base = b->base, .block_stride = stride,
                     .staging = b->staging, .blocks = b->idx, .count = n};
  return gather ? twin_failed(kvs_cpu_gather_blocks(&x, NULL),
                              "kvs_cpu_gather_blocks", why, len)
                : twin_failed(kvs_cpu_scatter_blocks(&x, NULL),
                              "kvs_cpu_scatter_blocks", why, len);
}

/* Does an attention kernel's every access (metadata, q, out, the blocks of
 * each request's keys, a split's workspace) hit device memory?  0 or -1. */
static int attn_ranges(const kvs_attn_args *ap, int prefill, uint32_t split,
                       char *why, size_t len) {
  kvs_attn_args a = *ap;
  const kvs_paged_kv *kv = &a.kv;

  if (kvs__check_attn(&a, prefill) == 0 && a.num_seqs) {
    uint64_t ns = a.num_seqs, mb = a.max_blocks_per_seq;
    uint64_t qo = (uint64_t)a.num_rows * a.num_heads * kv->head_dim *
                  kvs_dtype_size(a.qo_dtype);

    if (need("seq_lens", a.seq_lens, ns * 4, 0, why, len) ||
        (prefill && need("q_start", a.q_start, (ns + 1) * 4, 0, why, len)) ||
        need("block_tables", a.block_tables, ns * mb * 4, 0, why, len) ||
        need("q", a.q, qo, 0, why, len) || need("out", a.out, qo, 1, why, len))
      return -1;
    for (uint64_t s = 0; s < ns; s++) {
      uint64_t nb = ((uint64_t)a.seq_lens[s] + kv->block_size - 1) /
                    kv->block_size;

      for (uint64_t j = 0; j < nb && j < mb; j++) {
        uint32_t blk = a.block_tables[s * mb + j];

        if (kv->num_blocks && blk >= kv->num_blocks)
          continue; /* the twin reports it */
        if (need("key/value block", at(kv->base, blk, kv->block_stride),
                 kv->block_stride, 0, why, len))
          return -1;
      }
    }
    if (split && a.workspace &&
        need("workspace", a.workspace, kvs_attn_workspace_bytes(&a), 1, why,
             len))
      return -1;
  }
  return 0;
}

/* kvs_attn_* and kvs_attn_mma_*: the C twin computes the final output (a
 * split launch's merge kernel is then a no-op). */
static int run_attn(const struct op *op, char *why, size_t len) {
  const attn_params *p = &op->u.kernel.p.attn;
  kvs_attn_args a = p->a;
  int prefill = p->prefill != 0;

  if (!prefill)
    a.q_start = NULL; /* the decode kernel never reads it */
  if (attn_ranges(&a, prefill, p->split, why, len))
    return -1;
  return prefill ? twin_failed(kvs_cpu_prefill_attention(&a, NULL),
                               "kvs_cpu_prefill_attention", why, len)
                 : twin_failed(kvs_cpu_decode_attention(&a, NULL),
                               "kvs_cpu_decode_attention", why, len);
}

/* kvs_prefill_flash_*: the kernel's C model over the launched grid (the
 * twin checks the arguments first, as the launcher did: the model trusts
 * them, as the kernel does); with a span, its partials go to the workspace
 * and kvs_prefill_flash_merge_kernel combines them, as on a GPU. */
static int run_flash(const struct op *op, char *why, size_t len) {
  kvs_attn_args a = op->u.kernel.p.attn.a;
  uint32_t span = op->u.kernel.p.attn.split;

  if (kvs__check_attn(&a, 1) || !a.num_seqs) {
    snprintf(why, len, "arguments the launcher refuses");
    return -1;
  }
  if (attn_ranges(&a, 1, span != 0, why, len))
    return -1;
  if (op->u.kernel.f->kind == K_FLASH_MERGE) {
    if (!span || !a.workspace) {
      snprintf(why, len, "a merge without a span or a workspace");
      return -1;
    }
    kvs__flash_model_merge(&a, op->u.kernel.p.attn.lanes, span);
    return 0;
  }
  return twin_failed(kvs__flash_model(&a, op->u.kernel.grid[0],
                                      op->u.kernel.grid[1],
                                      op->u.kernel.grid[2], span,
                                      KVS__FLASH_PLANT_NONE),
                     "kvs__flash_model", why, len);
}

static void run_kernel(struct CUctx_st *ctx, const struct op *op) {
  const struct CUfunc_st *f = op->u.kernel.f;
  char why[320];
  int rc = 0;

  switch (f->kind) {
  case K_WRITE:
    rc = run_write(op, why, sizeof why);
    break;
  case K_BLOCKS:
    rc = run_blocks(op, why, sizeof why);
    break;
  case K_ATTN:
  case K_ATTN_MMA:
    rc = run_attn(op, why, sizeof why);
    break;
  case K_FLASH:
  case K_FLASH_MERGE:
    rc = run_flash(op, why, sizeof why);
    break;
  case K_MERGE:
    break;
  }
  if (rc)
    standin__fault(ctx, "kernel %s faulted: %s", f->name, why);
}

static void run_copy(struct CUctx_st *ctx, const struct op *op) {
  const void *src = op->u.copy.staged ? op->u.copy.staged : op->u.copy.src;
  size_t n = op->u.copy.bytes;

  /* Checked at enqueue too; this catches memory unmapped since. */
  if ((op->u.copy.dev_dst && !standin__dev_range(op->u.copy.dst, n, 1)) ||
      (op->u.copy.dev_src && !standin__dev_range(src, n, 0))) {
    standin__fault(ctx, "async copy of %zu bytes from %p to %p: memory no "
                   "longer mapped", n, src, op->u.copy.dst);
    return;
  }
  if (standin__copy_delay_ms)
    usleep(standin__copy_delay_ms * 1000u);
  /* KVS_STANDIN_FAIL=fault[:N]: the copy faults on the device, as a copy
   * over a bad page would: nothing moves and the context is lost. */
  if (standin__fail(FAIL_FAULT)) {
    standin__fault(ctx, "async copy of %zu bytes from %p to %p: injected "
                   "fault", n, src, op->u.copy.dst);
    return;
  }
  memmove(op->u.copy.dst, src, n);
}

/* Runs one operation (no lock held); skipped once the context faulted. */
static void run_op(struct CUctx_st *ctx, struct op *op) {
  struct CUevent_st *e;
  CUresult sticky;

  pthread_mutex_lock(&standin__lock);
  sticky = ctx->sticky;
  pthread_mutex_unlock(&standin__lock);
  if (sticky)
    return;
  switch (op->kind) {
  case OP_COPY:
    run_copy(ctx, op);
    break;
  case OP_KERNEL:
    run_kernel(ctx, op);
    break;
  case OP_EVENT:
    e = op->u.event.e;
    pthread_mutex_lock(&standin__lock);
    if (op->u.event.seq > e->reached) {
      e->reached = op->u.event.seq;
      clock_gettime(CLOCK_MONOTONIC, &e->when);
    }
    pthread_cond_broadcast(&standin__changed);
    pthread_mutex_unlock(&standin__lock);
    break;
  case OP_HOST_FN:
    standin__in_host_fn = 1;
    op->u.host.fn(op->u.host.data);
    standin__in_host_fn = 0;
    break;
  }
}

static void *stream_main(void *arg) {
  struct CUstream_st *s = arg;

  pthread_mutex_lock(&standin__lock);
  for (;;) {
    struct op *op;

    while (!s->head && !s->stop)
      pthread_cond_wait(&s->work, &standin__lock);
    op = s->head;
    if (!op)
      break; /* stopped, and nothing left */
    s->head = op->next;
    if (!s->head)
      s->tail = NULL;
    s->running = 1;
    pthread_mutex_unlock(&standin__lock);
    run_op(s->ctx, op);
    op_free(op);
    pthread_mutex_lock(&standin__lock);
    s->running = 0;
    pthread_cond_broadcast(&standin__changed);
  }
  pthread_mutex_unlock(&standin__lock);
  return NULL;
}

/* The stream behind a handle (NULL for the legacy stream); lock held. */
static CUresult stream_find_locked(CUstream h, struct CUstream_st **out) {
  *out = NULL;
  if (!h)
    return CUDA_SUCCESS;
  for (struct CUstream_st *s = streams; s; s = s->next)
    if (s == h && !s->dying) {
      *out = s;
      return CUDA_SUCCESS;
    }
  return CUDA_ERROR_INVALID_HANDLE;
}

/*
 * Takes op: on the legacy stream runs it now on this thread (after the
 * blocking streams drained), else queues it on h.  *sp gets the stream.
 */
static CUresult submit(struct CUctx_st *ctx, CUstream h, struct op *op,
                       struct CUstream_st **sp) {
  struct CUstream_st *s;
  CUresult r;

  pthread_mutex_lock(&standin__lock);
  r = stream_find_locked(h, &s);
  if (r == CUDA_SUCCESS && s && s->ctx != ctx)
    r = CUDA_ERROR_INVALID_HANDLE; /* a stream of another context */
  if (r == CUDA_SUCCESS && !s)
    standin__drain_locked(ctx, 0);
  if (r == CUDA_SUCCESS)
    r = ctx->sticky;
  if (r != CUDA_SUCCESS || !s) {
    pthread_mutex_unlock(&standin__lock);
    if (r == CUDA_SUCCESS)
      run_op(ctx, op);
    op_free(op);
    if (sp)
      *sp = NULL;
    return r;
  }
  op->next = NULL;
  if (s->tail)
    s->tail->next = op;
  else
    s->head = op;
  s->tail = op;
  pthread_cond_signal(&s->work);
  pthread_mutex_unlock(&standin__lock);
  if (sp)
    *sp = s;
  return CUDA_SUCCESS;
}

CUresult cuStreamCreate(CUstream *out, unsigned flags) {
  struct CUctx_st *ctx;
  struct CUstream_st *s;
  sigset_t all, old;
  CUresult r;
  int err;

  STANDIN_ENTER();
  if ((r = standin__current(&ctx)))
    return r;
  if (!out || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
    return CUDA_ERROR_INVALID_VALUE;
  s = calloc(1, sizeof *s);
  if (!s)
    return CUDA_ERROR_OUT_OF_MEMORY;
  s->ctx = ctx;
  s->flags = flags;
  pthread_cond_init(&s->work, NULL);
  /* The thread takes no signal: those stay the application's business. */
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  err = pthread_create(&s->thread, NULL, stream_main, s);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (err) {
    pthread_cond_destroy(&s->work);
    free(s);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  pthread_mutex_lock(&standin__lock);
  s->next = streams;
  streams = s;
  pthread_mutex_unlock(&standin__lock);
  *out = s;
  return CUDA_SUCCESS;
}

CUresult cuStreamDestroy(CUstream h) {
  struct CUstream_st *s, **pp;
  CUresult r;

  STANDIN_ENTER();
  if (!h)
    return CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&standin__lock);
  r = stream_find_locked(h, &s);
  if (r != CUDA_SUCCESS) {
    pthread_mutex_unlock(&standin__lock);
    return r;
  }
  s->dying = 1;
  while (busy_locked(s))
    pthread_cond_wait(&standin__changed, &standin__lock);
  s->stop = 1;
  pthread_cond_signal(&s->work);
  pthread_mutex_unlock(&standin__lock);
  pthread_join(s->thread, NULL);
  pthread_mutex_lock(&standin__lock);
  for (pp = &streams; *pp != s; pp = &(*pp)->next)
    ;
  *pp = s->next;
  pthread_mutex_unlock(&standin__lock);
  pthread_cond_destroy(&s->work);
  free(s);
  return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream h) {
  struct CUctx_st *ctx;
  struct CUstream_st *s;
  CUresult r;

  STANDIN_ENTER();
  if (!h && (r = standin__current(&ctx)))
    return r;
  pthread_mutex_lock(&standin__lock);
  r = stream_find_locked(h, &s);
  if (r == CUDA_SUCCESS && !s) {
    standin__drain_locked(ctx, 0);
    r = ctx->sticky;
  } else if (r == CUDA_SUCCESS) {
    while (busy_locked(s))
      pthread_cond_wait(&standin__changed, &standin__lock);
    r = s->ctx->sticky;
  }
  pthread_mutex_unlock(&standin__lock);
  return r;
}

/* Done (CUDA_SUCCESS), still busy (CUDA_ERROR_NOT_READY), or the
 * context's fault. */
CUresult cuStreamQuery(CUstream h) {
  struct CUctx_st *ctx;
  struct CUstream_st *s;
  CUresult r;

  STANDIN_ENTER();
  if (!h && (r = standin__current(&ctx)))
    return r;
  pthread_mutex_lock(&standin__lock);
  r = stream_find_locked(h, &s);
  if (r == CUDA_SUCCESS && s)
    r = s->ctx->sticky ? s->ctx->sticky
                       : busy_locked(s) ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
  else if (r == CUDA_SUCCESS)
    r = ctx->sticky;
  pthread_mutex_unlock(&standin__lock);
  return r;
}

CUresult cuCtxSynchronize(void) {
  struct CUctx_st *ctx;
  CUresult r;

  STANDIN_ENTER();
  if ((r = standin__current(&ctx)))
    return r;
  pthread_mutex_lock(&standin__lock);
  standin__drain_locked(ctx, 1);
  r = ctx->sticky;
  pthread_mutex_unlock(&standin__lock);
  return r;
}

/* ---- async copies and host functions ------------------------------------- */

static CUresult copy_async(void *dst, const void *src, size_t bytes,
                           int dev_dst, int dev_src, CUstream h) {
  struct CUctx_st *ctx;
  struct CUstream_st *s;
  struct op *op;
  CUresult r;

  STANDIN_ENTER();
  if ((r = standin__current(&ctx)))
    return r;
  if (standin__fail(FAIL_COPY))
    return CUDA_ERROR_INVALID_VALUE;
  if (bytes == 0)
    return CUDA_SUCCESS;
  if (!dst || !src || (dev_dst && !standin__dev_range(dst, bytes, 1)) ||
      (dev_src && !standin__dev_range(src, bytes, 0)))
    return CUDA_ERROR_INVALID_VALUE;
  if (standin__pinned_only &&
      ((!dev_src && !standin__host_registered(src, bytes)) ||
       (!dev_dst && !standin__host_registered(dst, bytes)))) {
    fprintf(stderr, "cuda stand-in: an async copy of %zu bytes %s pageable "
            "host memory %p (KVS_STANDIN_PINNED_ONLY)\n", bytes,
            dev_src ? "to" : "from", dev_src ? dst : (void *)(uintptr_t)src);
    return CUDA_ERROR_INVALID_VALUE;
  }
  op = calloc(1, sizeof *op);
  if (!op)
    return CUDA_ERROR_OUT_OF_MEMORY;
  op->kind = OP_COPY;
  op->u.copy.dst = dst;
  op->u.copy.src = src;
  op->u.copy.bytes = bytes;
  op->u.copy.dev_dst = dev_dst;
  op->u.copy.dev_src = dev_src;
  /* From pageable host memory the driver stages the bytes before it
   * returns (the caller may reuse its buffer); from registered memory it
   * reads them when the stream gets there. */
  if (!dev_src && !standin__host_registered(src, bytes)) {
    op->u.copy.staged = malloc(bytes);
    if (!op->u.copy.staged) {
      free(op);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    memcpy(op->u.copy.staged, src, bytes);
  }
  int pageable_dst = !dev_dst && !standin__host_registered(dst, bytes);
  r = submit(ctx, h, op, &s);
  if (r == CUDA_SUCCESS && s && pageable_dst) {
    /* To pageable host memory the call returns once the copy is done. */
    pthread_mutex_lock(&standin__lock);
    while (busy_locked(s))
      pthread_cond_wait(&standin__changed, &standin__lock);
    r = ctx->sticky;
    pthread_mutex_unlock(&standin__lock);
  }
  return r;
}

CUresult cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes,
                           CUstream s) {
  return copy_async((void *)(uintptr_t)dst, (const void *)(uintptr_t)src,
                    bytes, 1, 1, s);
}

CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t bytes,
                           CUstream s) {
  return copy_async((void *)(uintptr_t)dst, src, bytes, 1, 0, s);
}

CUresult cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t bytes,
                           CUstream s) {
  return copy_async(dst, (const void *)(uintptr_t)src, bytes, 0, 1, s);
}

/* Batched copies (CUDA 13's cuMemcpyBatchAsync): arguments checked as the
 * driver documents them, then each copy queued as one async copy of its
 * own, in reverse order: a batch's copies run in no set order, so a caller
 * that gave two dependent ones sees it here.  A pointer in device memory
 * is a device operand, anything else host memory. */
CUresult cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs,
                            size_t *sizes, size_t count,
                            CUmemcpyAttributes *attrs, size_t *attrsIdxs,
                            size_t numAttrs, CUstream h) {
  CUresult r = CUDA_SUCCESS;

  STANDIN_ENTER();
  if (standin__fail(FAIL_BATCH))
    return CUDA_ERROR_INVALID_VALUE;
  if (!dsts || !srcs || !sizes || count == 0 || !attrs || !attrsIdxs ||
      numAttrs == 0 || numAttrs > count || attrsIdxs[0] != 0 || h == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  for (size_t k = 0; k < numAttrs; k++)
    if (attrs[k].srcAccessOrder < 1 || attrs[k].srcAccessOrder > 3 ||
        (k && attrsIdxs[k] <= attrsIdxs[k - 1]) || attrsIdxs[k] >= count)
      return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = count; i-- > 0 && r == CUDA_SUCCESS;) {
    void *d = (void *)(uintptr_t)dsts[i];
    const void *sp = (const void *)(uintptr_t)srcs[i];

    r = copy_async(d, sp, sizes[i], standin__dev_range(d, sizes[i], 1),
                   standin__dev_range(sp, sizes[i], 0), h);
  }
  /* (its direction by the first destination: kvshare batches device <->
   * host jobs only, one direction a job) */
  if (r == CUDA_SUCCESS && getenv("KVS_STANDIN_REPORT"))
    fprintf(stderr, "cuda stand-in: a batched copy of %zu (%s, batched)\n",
            count,
            standin__on_device((void *)(uintptr_t)dsts[0]) ? "host to device"
                                                           : "device to host");
  return r;
}

CUresult cuLaunchHostFunc(CUstream h, CUhostFn fn, void *user_data) {
  struct CUctx_st *ctx;
  struct op *op;
  CUresult r;

  STANDIN_ENTER();
  if ((r = standin__current(&ctx)))
    return r;
  if (standin__fail(FAIL_HOSTFUNC))
    return CUDA_ERROR_INVALID_VALUE;
  if (!fn)
    return CUDA_ERROR_INVALID_VALUE;
  op = calloc(1, sizeof *op);
  if (!op)
    return CUDA_ERROR_OUT_OF_MEMORY;
  op->kind = OP_HOST_FN;
  op->u.host.fn = fn;
  op->u.host.data = user_data;
  return submit(ctx, h, op, NULL);
}

/* ---- events -------------------------------------------------------------- */

static struct CUevent_st *event_find_locked(CUevent h) {
  for (struct CUevent_st *e = events; e; e = e->next)
    if (e == h)
      return e;
  return NULL;
}

CUresult cuEventCreate(CUevent *out, unsigned flags) {
  struct CUctx_st *ctx;
  struct CUevent_st *e;
  CUresult r;

  STANDIN_ENTER();
  if ((r = standin__current(&ctx)))
    return r;
  /* BLOCKING_SYNC 1, DISABLE_TIMING 2, INTERPROCESS 4 */
  if (!out || (flags & ~7u))
    return CUDA_ERROR_INVALID_VALUE;
  e = calloc(1, sizeof *e);
  if (!e)
    return CUDA_ERROR_OUT_OF_MEMORY;
  e->ctx = ctx;
  e->flags = flags;
  e->refs = 1;
  pthread_mutex_lock(&standin__lock);
  e->next = events;
  events = e;
  pthread_mutex_unlock(&standin__lock);
  *out = e;
  return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent h, CUstream s) {
  struct CUctx_st *ctx;
  struct CUevent_st *e;
  struct op *op;
  CUresult r;

  STANDIN_ENTER();
  if ((r = standin__current(&ctx)))
    return r;
  op = calloc(1, sizeof *op);
  if (!op)
    return CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&standin__lock);
  e = event_find_locked(h);
  r = !e ? CUDA_ERROR_INVALID_HANDLE : ctx->sticky;
  if (r == CUDA_SUCCESS) {
    /* The stream first: a record that never gets queued must not count
     * (cuEventSynchronize would wait for it forever). */
    struct CUstream_st *st;

    r = stream_find_locked(s, &st);
    if (r == CUDA_SUCCESS && st && st->ctx != ctx)
      r = CUDA_ERROR_INVALID_HANDLE;
  }
  if (r == CUDA_SUCCESS) {
    op->kind = OP_EVENT;
    op->u.event.e = e;
    op->u.event.seq = ++e->recorded;
    e->refs++; /* until the stream reaches (or drops) the record */
  }
  pthread_mutex_unlock(&standin__lock);
  if (r != CUDA_SUCCESS) {
    free(op);
    return r;
  }
  return submit(ctx, s, op, NULL);
}

CUresult cuEventSynchronize(CUevent h) {
  struct CUevent_st *e;
  CUresult r = CUDA_ERROR_INVALID_HANDLE;

  STANDIN_ENTER();
  pthread_mutex_lock(&standin__lock);
  e = event_find_locked(h);
  if (e) {
    /* The work captured now: the latest record (none: nothing to wait). */
    uint64_t target = e->recorded;

    while (e->reached < target && !e->ctx->sticky)
      pthread_cond_wait(&standin__changed, &standin__lock);
    r = e->ctx->sticky;
  }
  pthread_mutex_unlock(&standin__lock);
  return r;
}

CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end) {
  struct CUevent_st *a, *b;
  CUresult r = CUDA_SUCCESS;

  STANDIN_ENTER();
  if (!ms)
    return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&standin__lock);
  a = event_find_locked(start);
  b = event_find_locked(end);
  /* cuda.h: never recorded, or created with DISABLE_TIMING: invalid
   * handle; recorded but not completed: not ready. */
  if (!a || !b || !a->recorded || !b->recorded ||
      ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING))
    r = CUDA_ERROR_INVALID_HANDLE;
  else if (a->reached < a->recorded || b->reached < b->recorded)
    r = CUDA_ERROR_NOT_READY;
  else
    *ms = (float)((double)(b->when.tv_sec - a->when.tv_sec) * 1e3 +
                  (double)(b->when.tv_nsec - a->when.tv_nsec) / 1e6);
  pthread_mutex_unlock(&standin__lock);
  return r;
}

CUresult cuEventDestroy(CUevent h) {
  struct CUevent_st **pp;
  CUresult r = CUDA_ERROR_INVALID_HANDLE;

  STANDIN_ENTER();
  pthread_mutex_lock(&standin__lock);
  for (pp = &events; *pp; pp = &(*pp)->next)
    if (*pp == h) {
      struct CUevent_st *e = *pp;

      /* Records still queued keep it until the stream passes them. */
      *pp = e->next;
      event_put_locked(e);
      r = CUDA_SUCCESS;
      break;
    }
  pthread_mutex_unlock(&standin__lock);
  return r;
}

/* ---- modules and launches ------------------------------------------------ */

CUresult cuModuleLoadData(CUmodule *out, const void *image) {
  struct CUctx_st *ctx;
  struct CUmod_st *m;
  CUresult r;

  STANDIN_ENTER();
  if ((r = standin__current(&ctx)))
    return r;
  if (!out || !image)
    return CUDA_ERROR_INVALID_VALUE;
  if (standin__fail(FAIL_MODULE))
    return CUDA_ERROR_NO_BINARY_FOR_GPU;
  m = calloc(1, sizeof *m); /* the image is not read: kernels are C twins */
  if (!m)
    return CUDA_ERROR_OUT_OF_MEMORY;
  m->ctx = ctx;
  pthread_mutex_lock(&standin__lock);
  m->next = modules;
  modules = m;
  pthread_mutex_unlock(&standin__lock);
  *out = m;
  return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction *f, CUmodule mod, const char *name) {
  struct CUmod_st *m;

  STANDIN_ENTER();
  if (!f || !name)
    return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&standin__lock);
  for (m = modules; m && m != mod; m = m->next)
    ;
  pthread_mutex_unlock(&standin__lock);
  if (!m)
    return CUDA_ERROR_INVALID_HANDLE;
  for (size_t i = 0; i < NKERNELS; i++)
    if (strcmp(kernels[i].name, name) == 0) {
      *f = &kernels[i];
      return CUDA_SUCCESS;
    }
  return CUDA_ERROR_NOT_FOUND;
}

/* Copies the parameter values the kernel takes (the real driver copies
 * them at launch: params point at the caller's variables). */
static CUresult copy_params(const struct CUfunc_st *f, void **params,
                            union kernel_params *p) {
  static const int count[] = {[K_WRITE] = 1,    [K_BLOCKS] = 5,
                              [K_ATTN] = 4,     [K_ATTN_MMA] = 3,
                              [K_MERGE] = 4,    [K_FLASH] = 2,
                              [K_FLASH_MERGE] = 3};
  int n = count[f->kind];

  if (!params)
    return CUDA_ERROR_INVALID_VALUE;
  for (int i = 0; i < n; i++)
    if (!params[i])
      return CUDA_ERROR_INVALID_VALUE;
  switch (f->kind) {
  case K_WRITE:
    memcpy(&p->write, params[0], sizeof p->write);
    break;
  case K_BLOCKS:
    memcpy(&p->blocks.base, params[0], sizeof p->blocks.base);
    memcpy(&p->blocks.stride, params[1], sizeof p->blocks.stride);
    memcpy(&p->blocks.staging, params[2], sizeof p->blocks.staging);
    memcpy(&p->blocks.idx, params[3], sizeof p->blocks.idx);
    memcpy(&p->blocks.mode, params[4], sizeof p->blocks.mode);
    break;
  case K_ATTN:
  case K_ATTN_MMA:
    memcpy(&p->attn.a, params[0], sizeof p->attn.a);
    memcpy(&p->attn.prefill, params[1], sizeof p->attn.prefill);
    if (f->kind == K_ATTN) {
      memcpy(&p->attn.lanes, params[2], sizeof p->attn.lanes);
      memcpy(&p->attn.split, params[3], sizeof p->attn.split);
    } else {
      memcpy(&p->attn.split, params[2], sizeof p->attn.split);
    }
    break;
  case K_FLASH:
    memcpy(&p->attn.a, params[0], sizeof p->attn.a);
    memcpy(&p->attn.split, params[1], sizeof p->attn.split); /* span */
    p->attn.prefill = 1;
    break;
  case K_FLASH_MERGE:
    memcpy(&p->attn.a, params[0], sizeof p->attn.a);
    memcpy(&p->attn.lanes, params[1], sizeof p->attn.lanes); /* parts */
    memcpy(&p->attn.split, params[2], sizeof p->attn.split); /* span */
    p->attn.prefill = 1;
    break;
  case K_MERGE:
    break; /* a no-op here */
  }
  return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                        unsigned bx, unsigned by, unsigned bz, unsigned smem,
                        CUstream s, void **params, void **extra) {
  struct CUctx_st *ctx;
  struct op *op;
  size_t i;
  CUresult r;

  STANDIN_ENTER();
  if ((r = standin__current(&ctx)))
    return r;
  if (standin__fail(FAIL_LAUNCH) || !f)
    return CUDA_ERROR_INVALID_VALUE;
  for (i = 0; i < NKERNELS && f != &kernels[i]; i++)
    ;
  if (i == NKERNELS)
    return CUDA_ERROR_INVALID_HANDLE;
  /* The hardware's limits (sm_80/sm_90): a launch past them fails. */
  if (!gx || !gy || !gz || gx > 0x7fffffffu || gy > 65535 || gz > 65535 ||
      !bx || !by || !bz || bx > 1024 || by > 1024 || bz > 64 ||
      (uint64_t)bx * by * bz > f->max_threads || smem > MAX_SMEM)
    return CUDA_ERROR_INVALID_VALUE;
  if (extra) /* kvshare passes kernelParams only */
    return CUDA_ERROR_INVALID_VALUE;
  op = calloc(1, sizeof *op);
  if (!op)
    return CUDA_ERROR_OUT_OF_MEMORY;
  op->kind = OP_KERNEL;
  op->u.kernel.f = f;
  op->u.kernel.grid[0] = gx;
  op->u.kernel.grid[1] = gy;
  op->u.kernel.grid[2] = gz;
  if ((r = copy_params(f, params, &op->u.kernel.p))) {
    free(op);
    return r;
  }
  if (f->kind == K_FLASH_MERGE &&
      (gx != op->u.kernel.p.attn.a.num_rows || gy != op->u.kernel.p.attn.a.num_heads ||
       gz != 1)) {
    free(op); /* one block per (row, query head), as the kernel takes it */
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (f->kind == K_FLASH) {
    /* the kernel the launcher picked must be the one for the call's
     * dtypes and head size, with its shared memory: the model would run
     * any of them alike (the wgmma variant, kvs_prefill_flash_wg_*, for a
     * 16-bit cache at head_dim 64 or 128, with its own) */
    const kvs_attn_args *a = &op->u.kernel.p.attn.a;
    const int wg = strncmp(f->name, "kvs_prefill_flash_wg_", 21) == 0;
    char want[64];
    if (kvs_dtype_quantized(a->kv.dtype))
      snprintf(want, sizeof want, "kvs_prefill_flash_%s_%s_d%u",
               kvs_dtype_name(a->kv.dtype), kvs_dtype_name(a->qo_dtype),
               a->kv.head_dim);
    else
      snprintf(want, sizeof want, "kvs_prefill_flash_%s%s_d%u", wg ? "wg_" : "",
               kvs_dtype_name(a->kv.dtype), a->kv.head_dim);
    if (strcmp(f->name, want) ||
        smem != (wg ? kvs__pf_wg_smem(a->kv.head_dim)
                    : kvs__pf_smem_for(a->kv.dtype, a->kv.head_dim))) {
      free(op);
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  return submit(ctx, s, op, NULL);
}
