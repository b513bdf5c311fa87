/*
 * copy.c — the copy engine (copy.h): jobs go to the backend, which starts
 * them and reports their end from any thread; the ends are queued under a
 * lock and a uv_async wakes the loop, which runs each job's callback.  A
 * timer watches the device while jobs run, so a GPU fault (after which the
 * driver reports nothing) still ends them.
 */
#include <stdlib.h>

#include "daemon/pool/backend.h"
#include "daemon/pool/copy.h"
#include "daemon/log.h"
#include "kvs_status.h"

#define WATCH_MS 50

/* Lock held: j leaves the running list, done. */
static void unrun_locked(copy_engine *e, copy_job *j) {
  j->done = 1;
  if (j->rprev)
    j->rprev->rnext = j->rnext;
  else
    e->running = j->rnext;
  if (j->rnext)
    j->rnext->rprev = j->rprev;
  j->rprev = j->rnext = NULL;
}

/* Lock held: j leaves the running list and joins the done list. */
static void finish_locked(copy_engine *e, copy_job *j, int status) {
  unrun_locked(e, j);
  j->status = status;
  j->next = e->done;
  e->done = j;
}

/* On the loop: run the callbacks of every finished job, in the order they
 * finished. */
static void on_async(uv_async_t *h) {
  copy_engine *e = h->data;
  copy_job *list, *rev = NULL, *j;

  pthread_mutex_lock(&e->lock);
  list = e->done;
  e->done = NULL;
  pthread_mutex_unlock(&e->lock);
  while (list) { /* the list was pushed front-first: reverse it */
    j = list;
    list = j->next;
    j->next = rev;
    rev = j;
  }
  while ((j = rev)) {
    rev = j->next;
    j->next = NULL;
    e->inflight--;
    e->jobs++;
    e->blocks += j->n;
    if (j->status < 0) {
      e->errors++;
      log_error(j->status, "copy engine: a job of %u block%s failed", j->n,
                j->n == 1 ? "" : "s");
    }
    j->cb(j);
  }
  if (e->inflight == 0 && e->open)
    uv_timer_stop(&e->watch);
}

/* While jobs run: is the device still there?  If not, they all end now,
 * with its fault (the driver will not report them any more). */
static void on_watch(uv_timer_t *t) {
  copy_engine *e = t->data;
  int rc, n = 0;

  if (!e->pool->ops->check || (rc = e->pool->ops->check(e->pool)) == 0)
    return;
  pthread_mutex_lock(&e->lock);
  while (e->running) {
    finish_locked(e, e->running, rc);
    n++;
  }
  pthread_mutex_unlock(&e->lock);
  if (!e->failed)
    log_error(rc, "copy engine: the device failed with %d job%s in flight; "
              "the daemon makes no more copies (workers make their own)", n,
              n == 1 ? "" : "s");
  e->failed = rc;
  on_async(&e->async);
}

int copy_engine_init(copy_engine *e, uv_loop_t *loop, backend *pool) {
  int rc;

  e->pool = pool;
  pool->loop = loop;
  e->done = e->running = NULL;
  e->inflight = 0;
  e->jobs = e->blocks = e->errors = 0;
  e->open = e->failed = 0;
  rc = pthread_mutex_init(&e->lock, NULL);
  if (rc)
    return -rc;
  rc = uv_async_init(loop, &e->async, on_async);
  if (rc < 0) {
    pthread_mutex_destroy(&e->lock);
    return rc;
  }
  uv_timer_init(loop, &e->watch);
  e->async.data = e->watch.data = e;
  e->open = 1;
  return 0;
}

int copy_submit(copy_engine *e, copy_job *j) {
  uint32_t i, nb = j->kind == COPY_POOL ? 2 * j->n : j->n;
  uint32_t max = e->pool->layout.num_blocks;
  int rc;

  if (!e->open || j->n == 0 || !j->blocks || !j->cb ||
      (j->kind != COPY_POOL && !j->host))
    return KVS_EINVAL;
  if (e->failed)
    return e->failed;
  for (i = 0; i < nb; i++)
    if (j->blocks[i] >= max)
      return KVS_ERANGE;
  j->eng = e;
  j->status = 0;
  j->done = 0;
  j->next = NULL;
  pthread_mutex_lock(&e->lock);
  j->rprev = NULL;
  j->rnext = e->running;
  if (e->running)
    e->running->rprev = j;
  e->running = j;
  pthread_mutex_unlock(&e->lock);
  if (e->inflight++ == 0 && e->pool->ops->check)
    uv_timer_start(&e->watch, on_watch, WATCH_MS, WATCH_MS);
  rc = e->pool->ops->copy(e->pool, j);
  if (rc < 0) {
    /* (The backend reported nothing for a job it refused.) */
    pthread_mutex_lock(&e->lock);
    unrun_locked(e, j);
    pthread_mutex_unlock(&e->lock);
    if (--e->inflight == 0)
      uv_timer_stop(&e->watch);
    e->errors++;
    /* A refusal may be the device gone (whatever status the call mapped
     * to): then no later job can run either. */
    int dev = rc == KVS_EDEVICE ? rc
              : e->pool->ops->check ? e->pool->ops->check(e->pool) : 0;
    if (dev < 0 && !e->failed) {
      log_error(dev, "copy engine: the device failed; the daemon makes no "
                "more copies (workers make their own)");
      e->failed = dev;
    }
  }
  return rc;
}

void copy_complete(copy_job *j, int status) {
  copy_engine *e = j->eng;

  pthread_mutex_lock(&e->lock);
  if (j->done) { /* the watch already failed it */
    pthread_mutex_unlock(&e->lock);
    return;
  }
  finish_locked(e, j, status);
  /* Sent under the lock: the loop reads the done list under it, so it can
   * never run this job's callback — and, at the end, close the engine and
   * the loop — before this thread is done with the handle. */
  uv_async_send(&e->async);
  pthread_mutex_unlock(&e->lock);
}

static void on_closed(uv_handle_t *h) {
  copy_engine *e = h->data;

  pthread_mutex_destroy(&e->lock);
}

void copy_engine_close(copy_engine *e) {
  if (!e->open)
    return;
  e->open = 0;
  if (e->inflight)
    log_error(0, "copy engine closed with %u jobs in flight", e->inflight);
  uv_close((uv_handle_t *)&e->watch, NULL);
  uv_close((uv_handle_t *)&e->async, on_closed);
}
