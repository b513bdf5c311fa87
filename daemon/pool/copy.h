/*
 * copy.h — the daemon's copy engine: whole blocks the daemon moves itself,
 * off the event loop.
 *
 * A job names blocks of the pool and what to do with them: copy pairs inside
 * the pool (copy-on-write, for workers that ask the daemon to do it), or
 * move blocks to and from host buffers (the tiers).  The backend starts the
 * copies (memcpy for the host pool; async copies on the daemon's own CUDA
 * stream for the GPU pool) and reports the end of each job once, from
 * whatever thread it finishes on (copy_complete); the engine hands the job
 * back to its owner on the loop thread (job->cb).  Nothing here blocks the
 * loop while a GPU copies.
 *
 * Ownership: the job and every array it points to belong to the caller and
 * must stay valid and unchanged until its callback has run.  The blocks a
 * job touches must stay held (not freeable, not reusable) until then too:
 * the daemon pins them in the core (core_pin) while the job is in flight.
 *
 * Host buffers of COPY_TO_HOST / COPY_FROM_HOST must be registered with the
 * driver (pinned, cuMemHostRegister) where the pool is on a GPU: into
 * pageable memory the driver makes the "async" copy synchronous, which
 * would stall the loop for the whole job.
 *
 * A GPU fault loses the daemon's CUDA context for good, and the driver then
 * never runs the host function that reports a job's end (cuLaunchHostFunc,
 * unlike the older stream callbacks, is not run after a context error).  So
 * while jobs run, the engine asks the backend every 50 ms whether its
 * device is still there (backend_ops.check: KVS_EDEVICE only for an error
 * that loses the context — a job is failed only when its report can never
 * come, so no late report can reach a job its owner has freed); on a fault
 * every running job completes with that status and the engine is marked
 * failed: later copy_submit calls fail at once, and the daemon stops
 * offering copies (workers copy themselves).
 */
#ifndef KVS_DAEMON_COPY_H
#define KVS_DAEMON_COPY_H

#include <pthread.h>
#include <stdint.h>
#include <uv.h>

typedef struct backend backend;
typedef struct copy_engine copy_engine;
typedef struct copy_job copy_job;

typedef enum copy_kind {
  COPY_POOL,      /* block blocks[2i] -> block blocks[2i+1], i < n */
  COPY_TO_HOST,   /* block blocks[i] -> host[i] (block_stride bytes) */
  COPY_FROM_HOST, /* host[i] -> block blocks[i] */
} copy_kind;

typedef void (*copy_done_cb)(copy_job *j);

struct copy_job {
  copy_kind kind;
  const uint32_t *blocks; /* [2n] pairs (COPY_POOL) or [n] blocks */
  void *const *host;      /* [n] host buffers; NULL for COPY_POOL (pinned
                             memory where the pool is on a GPU) */
  uint32_t n;
  copy_done_cb cb;        /* on the loop thread, once */
  void *data;             /* the owner's */
  int status;             /* 0 or a negative status, set before cb */
  /* The engine's. */
  copy_job *next;         /* on the done list */
  copy_job *rprev, *rnext; /* on the running list */
  int done;               /* completed (under the engine's lock) */
  copy_engine *eng;
};

struct copy_engine {
  uv_async_t async;       /* completions wake the loop */
  uv_timer_t watch;       /* checks the device while jobs run */
  backend *pool;
  pthread_mutex_t lock;   /* guards done, running and each job's done */
  copy_job *done;         /* finished jobs, waiting for the loop */
  copy_job *running;      /* submitted, not finished */
  uint32_t inflight;      /* submitted, callback not run yet */
  int open;
  int failed;             /* the device is lost: no more jobs (status) */
  /* counters (loop thread): jobs run, their blocks, jobs failed (in
   * flight or refused at the start) */
  uint64_t jobs, blocks, errors;
};

/* 0, or a negative status. */
int copy_engine_init(copy_engine *e, uv_loop_t *loop, backend *pool);

/*
 * Starts job j.  0: j->cb runs later on the loop thread (never from inside
 * this call), with j->status set.  A negative status (bad block index,
 * nothing to copy, the backend refused): nothing was started and cb will not
 * run.
 */
int copy_submit(copy_engine *e, copy_job *j);

/* Backends: job j finished with status.  Any thread, once per job (a job
 * the engine already failed is ignored). */
void copy_complete(copy_job *j, int status);

/* Closes the engine's handle (in the loop's last turns).  Every submitted
 * job must have completed: the caller drains first (copy_idle). */
void copy_engine_close(copy_engine *e);

/* 1 when no job is in flight. */
static inline int copy_idle(const copy_engine *e) { return e->inflight == 0; }

#endif
