/*
 * copy.c — the copy engine (copy.h): jobs go to the backend, which starts
 * them and reports their end from any thread; the ends are queued under a
 * lock and a uv_async wakes the loop, which runs each job's callback.
 */
#include <stdlib.h>

#include "daemon/backend.h"
#include "daemon/copy.h"
#include "daemon/log.h"
#include "kvs_status.h"

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
}

int copy_engine_init(copy_engine *e, uv_loop_t *loop, backend *pool) {
  int rc;

  e->pool = pool;
  e->done = NULL;
  e->inflight = 0;
  e->jobs = e->blocks = e->errors = 0;
  e->open = 0;
  rc = pthread_mutex_init(&e->lock, NULL);
  if (rc)
    return -rc;
  rc = uv_async_init(loop, &e->async, on_async);
  if (rc < 0) {
    pthread_mutex_destroy(&e->lock);
    return rc;
  }
  e->async.data = e;
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
  for (i = 0; i < nb; i++)
    if (j->blocks[i] >= max)
      return KVS_ERANGE;
  j->eng = e;
  j->status = 0;
  j->next = NULL;
  e->inflight++;
  rc = e->pool->ops->copy(e->pool, j);
  if (rc < 0)
    e->inflight--;
  return rc;
}

void copy_complete(copy_job *j, int status) {
  copy_engine *e = j->eng;

  j->status = status;
  pthread_mutex_lock(&e->lock);
  j->next = e->done;
  e->done = j;
  pthread_mutex_unlock(&e->lock);
  uv_async_send(&e->async);
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
  uv_close((uv_handle_t *)&e->async, on_closed);
}
