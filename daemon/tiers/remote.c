/*
 * remote.c — the moves of the remote tier (tiers_int.h): blocks written
 * through from the pool to the store, and a Lookup's chain brought up
 * from it.
 */
#include "daemon/tiers/tiers_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "daemon/log.h"
#include "kvs_status.h"

#define QUEUE_MAX 65536u /* sealed blocks waiting to be written */
#define JOB_MAX 128u     /* blocks per write job */
#define STAGE_MIN 16u
#define STAGE_MAX 1024u

typedef struct wq_ent {
  kvs_hash128 h;
  uint32_t b;
} wq_ent;

struct remote {
  uv_loop_t *loop;
  core *core;
  backend *pool;
  copy_engine *copy;
  const cfg *cfg;
  tier_remote *store;
  uint64_t stride;
  tier_host stage;     /* staging buffers (pinned on a GPU pool) */
  uint32_t *free_stage, nfree;
  uint32_t keep;       /* GPU pool: free buffers writes leave to
                          promotions (which copy through staging there) */
  wq_ent *q;           /* ring of sealed blocks to copy out */
  uint32_t qhead, qlen;
  /* Copied out, waiting for room in the store's write window: staging
   * buffers in order (ring of nstage), each with its hash and token ids
   * (stok: block_size per buffer; rtok: 0 when the core keeps none). */
  uint32_t *ready, rhead, rlen, nstage;
  kvs_hash128 *rhash;
  uint32_t *stok;
  uint8_t *rtok;
  uv_check_t drain;
  int draining, stopped, write;
  uint32_t pinned, max_pins; /* GPU pool: blocks pinned for their copy
                                out, at most an eighth of the pool (or one
                                job), so that allocations find room */
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
  remote *m;
  uint32_t n;
  copy_job job;
  uint32_t blocks[JOB_MAX];
  void *host[JOB_MAX];
  uint32_t stage[JOB_MAX];
  kvs_hash128 h[JOB_MAX];
} wjob;

typedef struct rpromo {
  remote *m;
  tier_promo *pr;
  void (*done)(tier_promo *pr);
  tier_remote_get *g;
  uint32_t n, base, np;
  kvs_hash128 *hashes;
  core_promo *p;
  int *ok;
  uint32_t *blocks, *stage;
  void **host;
  copy_job job;
} rpromo;

static void maybe_idle(remote *m) {
  if (m->idle_cb && remote_idle(m))
    m->idle_cb(m->idle_data);
}

static void *stage_ptr(remote *m, uint32_t s) {
  return tier_host_slot(&m->stage, s);
}

/* ---- write-through ------------------------------------------------------- */

static void drain_cb(uv_check_t *h);

static void wake(remote *m);

/* A write was answered: ready copies may go (at the end of this turn); a
 * stored block is told of (the KV events' REMOTE medium). */
static void on_room(void *arg, kvs_hash128 h, int ok) {
  remote *m = arg;

  if (ok)
    core_remote_stored(m->core, h);
  wake(m);
}

static void on_sealed(void *arg, kvs_hash128 h, uint32_t b, uint32_t pos) {
  remote *m = arg;
  (void)pos;

  if (m->stopped || !m->write)
    return;
  if (m->qlen == QUEUE_MAX) {
    m->dropped++;
    return;
  }
  m->q[(m->qhead + m->qlen++) % QUEUE_MAX] = (wq_ent){h, b};
  wake(m);
}

static void wake(remote *m) {
  if ((m->qlen || m->rlen) && !m->draining && !m->stopped) {
    m->draining = 1;
    uv_check_start(&m->drain, drain_cb);
  }
}

/* Block b (hash h) is copied into staging buffer s: on the ready list,
 * with its token ids (b must still hold them). */
static void stage_ready(remote *m, uint32_t s, kvs_hash128 h, uint32_t b) {
  const uint32_t bs = m->pool->layout.block_size;
  const uint32_t *tok = core_block_tokens(m->core, b);
  uint32_t at = (m->rhead + m->rlen++) % m->nstage;

  m->ready[at] = s;
  m->rhash[at] = h;
  m->rtok[at] = tok != NULL;
  if (tok)
    memcpy(m->stok + (size_t)s * bs, tok, bs * sizeof(uint32_t));
}

static void on_written(copy_job *j) {
  wjob *w = j->data;
  remote *m = w->m;

  for (uint32_t i = 0; i < w->n; i++) {
    if (j->status != 0 || m->stopped) {
      m->dropped++;
      m->free_stage[m->nfree++] = w->stage[i];
    } else {
      stage_ready(m, w->stage[i], w->h[i], w->blocks[i]);
    }
    core_unpin(m->core, w->blocks[i]);
    m->pinned--;
  }
  m->jobs--;
  free(w);
  wake(m);
  maybe_idle(m);
}

/* Every block queued or copied out and not sent is let go (counted). */
static void drop_queued(remote *m) {
  m->dropped += m->qlen + m->rlen;
  m->qlen = 0;
  while (m->rlen) {
    m->free_stage[m->nfree++] = m->ready[m->rhead];
    m->rhead = (m->rhead + 1) % m->nstage;
    m->rlen--;
  }
}

/* Ready copies go to the store while its write window has room.  One the
 * store refuses with room left (its server down: a cluster node) is let
 * go, so that it does not hold back the others. */
static void send_ready(remote *m) {
  const uint32_t bs = m->pool->layout.block_size;
  uint32_t room = tier_remote_put_room(m->store);

  while (m->rlen && room) {
    uint32_t s = m->ready[m->rhead];

    if (tier_remote_put(m->store, stage_ptr(m, s), m->rhash[m->rhead],
                   m->rtok[m->rhead] ? m->stok + (size_t)s * bs : NULL) == 0)
      room--; /* (a refusal is counted by the store: puts_skipped) */
    m->rhead = (m->rhead + 1) % m->nstage;
    m->rlen--;
    m->free_stage[m->nfree++] = s;
  }
}

static void start_copies(remote *m);

/* End of a loop turn with blocks to write: ready copies are sent, then
 * the newly sealed blocks are copied out, as many as there are staging
 * buffers (on the host pool here and now, and sent; on a GPU pool by
 * start_copies). */
static void drain_cb(uv_check_t *h) {
  remote *m = h->data;
  tier_remote_stats st;

  tier_remote_get_stats(m->store, &st);
  if (m->stopped || st.nodes_up == 0) /* nothing to write to: let go */
    drop_queued(m);
  send_ready(m);
  if (!m->pool->ops->host_register) {
    /* The host pool: copied here and now, no pin, no job. */
    while (m->qlen && m->nfree > m->keep) {
      wq_ent e = m->q[m->qhead];
      uint32_t s;

      m->qhead = (m->qhead + 1) % QUEUE_MAX;
      m->qlen--;
      /* Its bytes stay put while memcpy runs, held or cached. */
      if (core_block_holds(m->core, e.b, e.h) == 0) {
        m->released++;
        continue;
      }
      s = m->free_stage[--m->nfree];
      memcpy((char *)stage_ptr(m, s) + tier_remote_put_offset(m->store),
             (const char *)m->pool->base + (uint64_t)e.b * m->stride,
             m->stride);
      stage_ready(m, s, e.h, e.b);
    }
    send_ready(m);
  } else {
    start_copies(m); /* a GPU pool: pinned, one copy-engine job */
  }
  /* Sleep until an answer (room in the window) or a copy (a buffer back)
   * or a new sealed block wakes it. */
  if ((m->qlen == 0 || m->nfree <= m->keep || m->pinned >= m->max_pins) &&
      (m->rlen == 0 || tier_remote_put_room(m->store) == 0)) {
    m->draining = 0;
    uv_check_stop(&m->drain);
  }
}

/* The queued blocks still held by their requests, pinned and copied out
 * by the copy engine into staging (on_written puts them on the ready
 * list). */
static void start_copies(remote *m) {
  while (m->qlen && m->nfree > m->keep && m->pinned < m->max_pins) {
    wjob *w = malloc(sizeof(*w));

    if (!w)
      break;
    w->m = m;
    w->n = 0;
    while (m->qlen && w->n < JOB_MAX && m->nfree > m->keep &&
           m->pinned < m->max_pins) {
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
      m->pinned++;
      w->blocks[w->n] = e.b;
      w->h[w->n] = e.h;
      w->stage[w->n] = m->free_stage[--m->nfree];
      w->host[w->n] = (char *)stage_ptr(m, w->stage[w->n]) +
                      tier_remote_put_offset(m->store);
      w->n++;
    }
    if (w->n == 0) {
      free(w);
      continue;
    }
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
}

/* ---- promotion ----------------------------------------------------------- */

static void promo_end(rpromo *x) {
  remote *m = x->m;
  tier_promo *pr = x->pr;

  if (x->g)
    tier_remote_get_release(x->g);
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
  remote *m = x->m;
  tier_promo *pr = x->pr;
  const uint32_t bs = m->pool->layout.block_size;
  uint32_t good = 0;

  if (j->status < 0)
    for (uint32_t i = 0; i < x->np; i++)
      x->ok[i] = 0;
  /* The run stops at the first failure: the blocks after it go too. */
  while (good < x->np && x->ok[good])
    good++;
  m->promoted += good;
  m->promote_failed += x->np - good;
  pr->hit_tokens = core_promote_finish(m->core, pr->r, x->p, x->np, x->ok);
  if (pr->r)
    pr->promoted_tokens += good * bs;
  promo_end(x);
}

static void on_got(tier_remote_get *g) {
  rpromo *x = g->data;
  remote *m = x->m;
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
    const void *src = tier_remote_get_data(g, x->p[i].pos - x->base);

    x->ok[i] = 1;
    x->stage[i] = KVS_BLOCK_NONE;
    if (m->stage.pinned_by) { /* a GPU copies from pinned memory only */
      if (m->nfree == 0) { /* the run ends here: no copy of the rest */
        for (uint32_t k = i; k < x->np; k++) {
          x->ok[k] = 0;
          x->stage[k] = KVS_BLOCK_NONE;
        }
        break;
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

int remote_promote(remote *m, tier_promo *pr, void (*done)(tier_promo *pr)) {
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
      tier_remote_get_start(m->store, x->hashes, n,
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

void remote_close(remote *m);

/* Frees m, its staging and its arrays (its store is closed). */
static void release(remote *m) {
  tier_host_close(&m->stage);
  free(m->free_stage);
  free(m->ready);
  free(m->rhash);
  free(m->rtok);
  free(m->stok);
  free(m->q);
  free(m);
}

int remote_open(uv_loop_t *loop, const cfg *c, core *cr, backend *pool,
                copy_engine *copy, remote **out, char *err, size_t err_len) {
  tier_remote_config rc;
  core_observer obs;
  remote *m;
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
  m->max_pins = pool->layout.num_blocks / 8 > JOB_MAX
                    ? pool->layout.num_blocks / 8
                    : JOB_MAX;
  memset(&rc, 0, sizeof(rc));
  rc.url = c->remote_tier;
  rc.password_file = c->remote_tier_password_file;
  rc.prefix = c->remote_tier_prefix;
  rc.ttl_ms = c->remote_tier_ttl_ms;
  rc.timeout_ms = c->remote_tier_timeout_ms;
  rc.inflight_bytes = c->remote_tier_inflight_bytes;
  rc.block_bytes = m->stride;
  rc.block_size = pool->layout.block_size;
  rc.root = core_tenant_root(core_root_hash(&pool->layout, c->model_id),
                             c->part_tenant);
  rcode = tier_remote_open(loop, &rc, &m->store, err, err_len);
  if (rcode < 0) {
    free(m);
    return rcode;
  }
  /* Staging: a quarter of the in-flight bound, 16 to 1024 buffers. */
  n = c->remote_tier_inflight_bytes / 4 / tier_remote_put_size(m->store);
  n = n < STAGE_MIN ? STAGE_MIN : n > STAGE_MAX ? STAGE_MAX : n;
  rcode = tier_host_open(&m->stage, pool, n * tier_remote_put_size(m->store),
                         tier_remote_put_size(m->store), err, err_len);
  m->nstage = (uint32_t)n;
  m->free_stage = malloc(n * sizeof(uint32_t));
  m->ready = malloc(n * sizeof(uint32_t));
  m->rhash = malloc(n * sizeof(kvs_hash128));
  m->rtok = malloc(n);
  m->stok = malloc(n * pool->layout.block_size * sizeof(uint32_t));
  m->q = malloc(QUEUE_MAX * sizeof(wq_ent));
  if (rcode < 0 || !m->free_stage || !m->q || !m->ready || !m->rhash ||
      !m->rtok || !m->stok) {
    if (rcode == 0)
      snprintf(err, err_len, "out of memory");
    tier_remote_close(m->store);
    release(m);
    return rcode < 0 ? rcode : KVS_ENOMEM;
  }
  /* Faulted in now, not by the first copies: a block stays pinned while
   * it is copied out, and a first touch of this VM's memory is slower than
   * the copy (a burst of commits right after start would pin blocks for
   * milliseconds, and allocations could find no room). */
  if (!m->stage.pinned_by &&
      madvise(m->stage.base, m->stage.bytes, MADV_POPULATE_WRITE) != 0)
    memset(m->stage.base, 0, m->stage.bytes);
  for (uint32_t i = 0; i < (uint32_t)n; i++)
    m->free_stage[m->nfree++] = (uint32_t)n - 1 - i;
  /* A burst of writes must not take every buffer a Lookup's promotion
   * needs on a GPU pool: half stay for reads (at most tier_promote_max). */
  if (m->stage.pinned_by)
    m->keep = (uint32_t)(n / 2 < c->tier_promote_max ? n / 2
                                                      : c->tier_promote_max);
  uv_check_init(loop, &m->drain);
  m->drain.data = m;
  tier_remote_set_room_cb(m->store, on_room, m);
  memset(&obs, 0, sizeof(obs));
  obs.sealed = on_sealed;
  obs.arg = m;
  rcode = core_add_observer(cr, &obs);
  if (rcode < 0) {
    snprintf(err, err_len, "remote tier: %s", kvs_strerror(rcode));
    remote_close(m); /* its handles close on the loop */
    return rcode;
  }
  log_info(0, "remote tier: %s; writes %s, reads wait %u ms at most, %u "
           "staging buffers", tier_remote_describe(m->store),
           m->write ? "on" : "off", c->remote_tier_timeout_ms,
           (uint32_t)n);
  *out = m;
  return 0;
}

void remote_set_idle_cb(remote *m, void (*cb)(void *), void *data) {
  m->idle_cb = cb;
  m->idle_data = data;
}

void remote_stop(remote *m) {
  if (!m || m->stopped)
    return;
  m->stopped = 1;
  /* Blocks not sent yet are let go (a server that hangs must not hold the
   * shutdown); writes already sent are flushed by tier_remote_close. */
  drop_queued(m);
  m->draining = 0;
  uv_check_stop(&m->drain);
  core_remove_observer(m->core, m);
}

int remote_idle(const remote *m) {
  return !m || (m->jobs == 0 && m->reads == 0);
}

static void on_drain_closed(uv_handle_t *h) { release(h->data); }

void remote_close(remote *m) {
  tier_remote_stats st;

  if (!m)
    return;
  remote_stop(m);
  tier_remote_get_stats(m->store, &st);
  log_info(0, "remote tier: %llu blocks written (%llu skipped, %llu "
           "refused), %llu brought up, %llu bad values refused",
           (unsigned long long)st.puts,
           (unsigned long long)(st.puts_skipped + m->dropped + m->released),
           (unsigned long long)st.put_errors,
           (unsigned long long)m->promoted,
           (unsigned long long)st.bad_blocks);
  tier_remote_close(m->store);
  m->store = NULL;
  uv_close((uv_handle_t *)&m->drain, on_drain_closed);
}

void remote_get_stats(const remote *m, tier_remote_stats *st) {
  tier_remote_get_stats(m->store, st);
}

void remote_tier_stats(const remote *m, tiers_stats *s) {
  tier_remote_stats st;

  tier_remote_get_stats(m->store, &st);
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
