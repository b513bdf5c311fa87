/*
 * remote_moves.c — blocks between the pool and the remote tier
 * (remote_moves.h).
 */
#include "daemon/remote_moves.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/log.h"
#include "daemon/tier_host.h"
#include "kvs_status.h"

#define QUEUE_MAX 65536u /* sealed blocks waiting to be written */
#define JOB_MAX 128u     /* blocks per write job */
#define STAGE_MIN 16u
#define STAGE_MAX 1024u

typedef struct wq_ent {
  kvs_hash128 h;
  uint32_t b;
} wq_ent;

struct rmoves {
  uv_loop_t *loop;
  core *core;
  backend *pool;
  copy_engine *copy;
  const cfg *cfg;
  remote *store;
  uint64_t stride;
  tier_host stage;     /* staging buffers (pinned on a GPU pool) */
  uint32_t *free_stage, nfree;
  wq_ent *q;           /* ring of sealed blocks to write */
  uint32_t qhead, qlen;
  uv_check_t drain;
  int draining, stopped, write;
  uint32_t jobs, reads; /* in flight */
  /* counters besides the store's */
  uint64_t dropped;    /* queued writes let go (queue full, store down,
                          stopping) */
  uint64_t released;   /* released or evicted before their copy */
  uint64_t promoted, promote_failed;
  void (*idle_cb)(void *);
  void *idle_data;
};

typedef struct wjob {
  rmoves *m;
  uint32_t n;
  copy_job job;
  uint32_t blocks[JOB_MAX];
  void *host[JOB_MAX];
  uint32_t stage[JOB_MAX];
  kvs_hash128 h[JOB_MAX];
} wjob;

typedef struct rpromo {
  rmoves *m;
  tier_promo *pr;
  void (*done)(tier_promo *pr);
  remote_get *g;
  uint32_t n, base, np;
  kvs_hash128 *hashes;
  core_promo *p;
  int *ok;
  uint32_t *blocks, *stage;
  void **host;
  copy_job job;
} rpromo;

static void maybe_idle(rmoves *m) {
  if (m->idle_cb && rmoves_idle(m))
    m->idle_cb(m->idle_data);
}

static void *stage_ptr(rmoves *m, uint32_t s) {
  return tier_host_slot(&m->stage, s);
}

/* ---- write-through ------------------------------------------------------- */

static void drain_cb(uv_check_t *h);

static void on_sealed(void *arg, kvs_hash128 h, uint32_t b) {
  rmoves *m = arg;

  if (m->stopped || !m->write)
    return;
  if (m->qlen == QUEUE_MAX) {
    m->dropped++;
    return;
  }
  m->q[(m->qhead + m->qlen++) % QUEUE_MAX] = (wq_ent){h, b};
  if (!m->draining) {
    m->draining = 1;
    uv_check_start(&m->drain, drain_cb);
  }
}

static void on_written(copy_job *j) {
  wjob *w = j->data;
  rmoves *m = w->m;

  for (uint32_t i = 0; i < w->n; i++) {
    /* still pinned: its token ids are stable */
    if (j->status == 0)
      remote_put(m->store, stage_ptr(m, w->stage[i]), w->h[i],
                 core_block_tokens(m->core, w->blocks[i]));
    else
      m->dropped++;
    core_unpin(m->core, w->blocks[i]);
    m->free_stage[m->nfree++] = w->stage[i];
  }
  m->jobs--;
  free(w);
  if (m->qlen && !m->draining && !m->stopped) {
    m->draining = 1;
    uv_check_start(&m->drain, drain_cb);
  }
  maybe_idle(m);
}

static void drain_cb(uv_check_t *h) {
  rmoves *m = h->data;
  remote_stats st;
  uint32_t room;

  remote_get_stats(m->store, &st);
  if (m->stopped || st.nodes_up == 0) { /* nothing to write to: let go */
    m->dropped += m->qlen;
    m->qlen = 0;
  }
  room = remote_put_room(m->store);
  while (m->qlen && room && m->nfree) {
    wjob *w = malloc(sizeof(*w));
    uint32_t take = JOB_MAX;

    if (!w)
      break;
    w->m = m;
    w->n = 0;
    if (take > room)
      take = room;
    while (m->qlen && w->n < take && m->nfree) {
      wq_ent e = m->q[m->qhead];

      m->qhead = (m->qhead + 1) % QUEUE_MAX;
      m->qlen--;
      /* Still sealed with that hash and held by a request (a pin keeps it
       * through the copy)?  Else its bytes may be changing: skip it. */
      if (core_block_holds(m->core, e.b, e.h) != 2 ||
          core_pin(m->core, e.b) != 0) {
        m->released++;
        continue;
      }
      w->blocks[w->n] = e.b;
      w->h[w->n] = e.h;
      w->stage[w->n] = m->free_stage[--m->nfree];
      w->host[w->n] = (char *)stage_ptr(m, w->stage[w->n]) +
                      remote_put_offset(m->store);
      w->n++;
    }
    if (w->n == 0) {
      free(w);
      continue;
    }
    room -= w->n;
    memset(&w->job, 0, sizeof(w->job));
    w->job.kind = COPY_TO_HOST;
    w->job.blocks = w->blocks;
    w->job.host = w->host;
    w->job.n = w->n;
    w->job.cb = on_written;
    w->job.data = w;
    m->jobs++;
    if (copy_submit(m->copy, &w->job) < 0) {
      w->job.status = KVS_EIO;
      on_written(&w->job);
    }
  }
  if (m->qlen == 0 || room == 0 || m->nfree == 0) {
    /* empty, or waiting for answers or copies: they restart it */
    m->draining = 0;
    uv_check_stop(&m->drain);
  }
}

/* ---- promotion ----------------------------------------------------------- */

static void promo_end(rpromo *x) {
  rmoves *m = x->m;
  tier_promo *pr = x->pr;

  if (x->g)
    remote_get_release(x->g);
  if (x->stage)
    for (uint32_t i = 0; i < x->np; i++)
      if (x->stage[i] != KVS_BLOCK_NONE)
        m->free_stage[m->nfree++] = x->stage[i];
  free(x->hashes);
  free(x->p);
  m->reads--;
  x->done(pr);
  free(x);
  maybe_idle(m);
}

static void on_filled(copy_job *j) {
  rpromo *x = j->data;
  rmoves *m = x->m;
  tier_promo *pr = x->pr;
  const uint32_t bs = m->pool->layout.block_size;
  uint32_t good = 0;

  if (j->status < 0)
    for (uint32_t i = 0; i < x->np; i++)
      x->ok[i] = 0;
  for (uint32_t i = 0; i < x->np; i++) {
    if (x->ok[i])
      m->promoted++;
    else
      m->promote_failed++;
  }
  pr->hit_tokens = core_promote_finish(m->core, pr->r, x->p, x->np, x->ok);
  if (pr->r) {
    while (good < x->np && x->ok[good])
      good++;
    pr->promoted_tokens += good * bs;
  }
  promo_end(x);
}

static void on_got(remote_get *g) {
  rpromo *x = g->data;
  rmoves *m = x->m;
  tier_promo *pr = x->pr;
  const uint32_t bs = m->pool->layout.block_size;
  uint32_t taken = 0, nj = 0;
  int rc;

  if (!pr->r || g->found == 0 || m->stopped) {
    promo_end(x);
    return;
  }
  x->p = malloc(g->found * (sizeof(core_promo) + sizeof(int) +
                            2 * sizeof(uint32_t) + sizeof(void *)));
  if (!x->p) {
    promo_end(x);
    return;
  }
  x->host = (void **)(x->p + g->found);
  x->ok = (int *)(x->host + g->found);
  x->blocks = (uint32_t *)(x->ok + g->found);
  x->stage = x->blocks + g->found;
  rc = core_remote_promote(m->core, pr->r, x->hashes, g->found, x->p, &x->np,
                           &taken);
  if (rc < 0 || taken == 0) {
    x->np = 0;
    promo_end(x);
    return;
  }
  /* Device hits among them count as hits now; the fills follow. */
  pr->hit_tokens = core_req_num_sealed(pr->r) * bs;
  if (x->np == 0) {
    promo_end(x);
    return;
  }
  for (uint32_t i = 0; i < x->np; i++) {
    const void *src = remote_get_data(g, x->p[i].pos - x->base);

    x->ok[i] = 1;
    x->stage[i] = KVS_BLOCK_NONE;
    if (m->stage.pinned_by) { /* a GPU copies from pinned memory only */
      if (m->nfree == 0) {
        x->ok[i] = 0;
        continue;
      }
      x->stage[i] = m->free_stage[--m->nfree];
      memcpy(stage_ptr(m, x->stage[i]), src, m->stride);
      x->host[nj] = stage_ptr(m, x->stage[i]);
    } else {
      memcpy(&x->host[nj], &src, sizeof(src)); /* only read from */
    }
    x->blocks[nj++] = x->p[i].block;
  }
  memset(&x->job, 0, sizeof(x->job));
  x->job.kind = COPY_FROM_HOST;
  x->job.blocks = x->blocks;
  x->job.host = x->host;
  x->job.n = nj;
  x->job.cb = on_filled;
  x->job.data = x;
  if (nj == 0 || copy_submit(m->copy, &x->job) < 0) {
    x->job.status = nj == 0 ? 0 : KVS_EIO;
    on_filled(&x->job);
  }
}

int rmoves_promote(rmoves *m, tier_promo *pr, void (*done)(tier_promo *pr)) {
  uint32_t max = m->cfg->tier_promote_max, n;
  const uint32_t bs = m->pool->layout.block_size;
  rpromo *x;

  if (m->stopped || !pr->r)
    return 1;
  x = calloc(1, sizeof(*x));
  if (!x)
    return 1;
  x->hashes = malloc(max * sizeof(kvs_hash128));
  if (!x->hashes) {
    free(x);
    return 1;
  }
  n = core_req_next_hashes(m->core, pr->r, x->hashes, max);
  x->base = core_req_num_sealed(pr->r);
  if (n == 0 ||
      remote_get_start(m->store, x->hashes, n,
                       m->cfg->verify_tokens
                           ? core_req_tokens(pr->r) + (size_t)x->base * bs
                           : NULL,
                       on_got, x, &x->g) < 0) {
    free(x->hashes);
    free(x);
    return 1;
  }
  x->m = m;
  x->pr = pr;
  x->done = done;
  x->n = n;
  m->reads++;
  return 0;
}

/* ---- set-up -------------------------------------------------------------- */

void rmoves_close(rmoves *m);

int rmoves_open(uv_loop_t *loop, const cfg *c, core *cr, backend *pool,
                copy_engine *copy, rmoves **out, char *err, size_t err_len) {
  remote_config rc;
  core_observer obs;
  rmoves *m;
  uint64_t n;
  int rcode;

  *out = NULL;
  if (!c->remote_tier[0])
    return 0;
  m = calloc(1, sizeof(*m));
  if (!m) {
    snprintf(err, err_len, "out of memory");
    return KVS_ENOMEM;
  }
  m->loop = loop;
  m->core = cr;
  m->pool = pool;
  m->copy = copy;
  m->cfg = c;
  m->stride = pool->layout.block_stride;
  m->write = c->remote_tier_write;
  memset(&rc, 0, sizeof(rc));
  rc.url = c->remote_tier;
  rc.password_file = c->remote_tier_password_file;
  rc.prefix = c->remote_tier_prefix;
  rc.ttl_ms = c->remote_tier_ttl_ms;
  rc.timeout_ms = c->remote_tier_timeout_ms;
  rc.inflight_bytes = c->remote_tier_inflight_bytes;
  rc.block_bytes = m->stride;
  rc.block_size = pool->layout.block_size;
  rc.root = core_root_hash(&pool->layout, c->model_id);
  rcode = remote_open(loop, &rc, &m->store, err, err_len);
  if (rcode < 0) {
    free(m);
    return rcode;
  }
  /* Staging: a quarter of the in-flight bound, 16 to 1024 buffers. */
  n = c->remote_tier_inflight_bytes / 4 / remote_put_size(m->store);
  n = n < STAGE_MIN ? STAGE_MIN : n > STAGE_MAX ? STAGE_MAX : n;
  rcode = tier_host_open(&m->stage, pool, n * remote_put_size(m->store),
                         remote_put_size(m->store), err, err_len);
  m->free_stage = malloc(n * sizeof(uint32_t));
  m->q = malloc(QUEUE_MAX * sizeof(wq_ent));
  if (rcode < 0 || !m->free_stage || !m->q) {
    if (rcode == 0)
      snprintf(err, err_len, "out of memory");
    tier_host_close(&m->stage);
    free(m->free_stage);
    free(m->q);
    remote_close(m->store, NULL);
    free(m);
    return rcode < 0 ? rcode : KVS_ENOMEM;
  }
  for (uint32_t i = 0; i < (uint32_t)n; i++)
    m->free_stage[m->nfree++] = (uint32_t)n - 1 - i;
  uv_check_init(loop, &m->drain);
  m->drain.data = m;
  memset(&obs, 0, sizeof(obs));
  obs.sealed = on_sealed;
  obs.arg = m;
  rcode = core_add_observer(cr, &obs);
  if (rcode < 0) {
    snprintf(err, err_len, "remote tier: %s", kvs_strerror(rcode));
    rmoves_close(m); /* its handles close on the loop */
    return rcode;
  }
  log_info(0, "remote tier: %s; writes %s, reads wait %u ms at most, %u "
           "staging buffers", remote_describe(m->store),
           m->write ? "on" : "off", c->remote_tier_timeout_ms,
           (uint32_t)n);
  *out = m;
  return 0;
}

void rmoves_set_idle_cb(rmoves *m, void (*cb)(void *), void *data) {
  m->idle_cb = cb;
  m->idle_data = data;
}

void rmoves_stop(rmoves *m) {
  if (!m || m->stopped)
    return;
  m->stopped = 1;
  m->dropped += m->qlen;
  m->qlen = 0;
  m->draining = 0;
  uv_check_stop(&m->drain);
  core_remove_observer(m->core, m);
}

int rmoves_idle(const rmoves *m) {
  return !m || (m->jobs == 0 && m->reads == 0);
}

static void on_drain_closed(uv_handle_t *h) {
  rmoves *m = h->data;

  tier_host_close(&m->stage);
  free(m->free_stage);
  free(m->q);
  free(m);
}

void rmoves_close(rmoves *m) {
  remote_stats st;

  if (!m)
    return;
  rmoves_stop(m);
  remote_get_stats(m->store, &st);
  log_info(0, "remote tier: %llu blocks written (%llu skipped, %llu "
           "refused), %llu brought up, %llu bad values refused",
           (unsigned long long)st.puts,
           (unsigned long long)(st.puts_skipped + m->dropped + m->released),
           (unsigned long long)st.put_errors,
           (unsigned long long)m->promoted,
           (unsigned long long)st.bad_blocks);
  remote_close(m->store, NULL);
  m->store = NULL;
  uv_close((uv_handle_t *)&m->drain, on_drain_closed);
}

void rmoves_get_stats(const rmoves *m, remote_stats *st) {
  remote_get_stats(m->store, st);
}

void rmoves_tier_stats(const rmoves *m, tiers_stats *s) {
  remote_stats st;

  remote_get_stats(m->store, &st);
  memset(s, 0, sizeof(*s));
  s->name = "remote";
  s->core.demotions = st.puts;
  s->core.promotions = m->promoted;
  s->core.hit_blocks = st.hit_blocks;
  s->core.drops = st.puts_skipped + m->dropped + m->released;
  s->core.failures = st.put_errors + m->promote_failed;
  s->bytes_in = st.put_bytes;
  s->bytes_out = st.bytes_read;
  s->io_errors = st.error_blocks + st.put_errors;
  s->checksum_failures = st.bad_blocks;
}
