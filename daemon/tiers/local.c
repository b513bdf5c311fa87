/*
 * local.c — the moves of the local tiers, host and disk (tiers.h):
 * demotion between the pool and them, promotion, swap.
 */
#include "daemon/tiers/tiers_int.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/log.h"
#include "kvs_status.h"

#define NONE KVS_BLOCK_NONE
#define MOVES_MAX 256   /* moves in flight */
#define STAGE_INLINE_MAX (1u << 20)    /* staged on the loop up to this */
#define STAGE_YIELD_BYTES (256u << 10) /* stage_work's CPU given up */
#define STAGING 512     /* disk staging buffers */

struct local {
  uv_loop_t *loop;
  core *core;
  backend *pool;
  copy_engine *copy;
  const cfg *cfg;
  uint64_t stride;
  tier_host host;     /* base NULL: none */
  tier_disk *disk;    /* NULL: none */
  void *pinned_bufs;  /* the disk tier's staging buffers, pinned by pool */
  uv_timer_t tick;
  uv_check_t kick;    /* a plan at the end of a loop turn that had frames */
  int stopped, kicked;
  int handles;        /* uv handles left to close (local_close) */
  uint32_t moves, promos, swaps; /* in flight */
  tier_swap *waiting, **waiting_tail; /* swaps waiting for staging buffers */
  uint64_t host_in, host_out;
  /* Demotion backs off after a batch whose writes failed (a full or
   * failing disk would otherwise be asked again every tick and every
   * frame): no plan before resume_ns; the pause doubles from
   * BACKOFF_MIN_MS up to BACKOFF_MAX_MS while batches keep failing. */
  uint64_t resume_ns, fail_ns;
  uint32_t backoff_ms;
  uint64_t backoffs;
  tier_hist hist[TIER_HIST_REMOTE_GET]; /* host/disk, up/down */
  void (*idle_cb)(void *);
  void *idle_data;
};

/* A block moved through tier (CORE_TIER_*) up or down, start_ns on. */
static void note_move(local *t, uint32_t tier, int up, uint64_t start_ns) {
  tier_hist_add(&t->hist[(tier == CORE_TIER_DISK ? TIER_HIST_DISK_UP
                                                 : TIER_HIST_HOST_UP) +
                         (up ? 0 : 1)],
                uv_hrtime() - start_ns);
}

/* A batch of moves: those one tick started, or a chunk of a SwapOut's. */
typedef struct mbatch {
  local *t;
  tier_swap *sw;           /* a SwapOut's chunk: its moves from sw->next */
  uint32_t n, pending;
  core_move *mv;
  uint32_t *blocks, *bufs; /* pool -> host/staging job */
  void **host;
  int *ok;
  disk_io *ios;
  copy_job job;
  uv_work_t work;          /* stage_work: host -> staging, checksums */
  int staging_off_loop;    /* stage_work runs on a thread of the pool */
  uint64_t start_ns;
} mbatch;

static void swaps_retry(local *t);

#define BACKOFF_MIN_MS 10
#define BACKOFF_MAX_MS 5000

static void maybe_idle(local *t) {
  if (t->idle_cb && local_idle(t))
    t->idle_cb(t->idle_data);
}

void local_set_idle_cb(local *t, void (*cb)(void *), void *data) {
  t->idle_cb = cb;
  t->idle_data = data;
}

/* ---- demotion -------------------------------------------------------------- */

static void swap_chunk_done(tier_swap *sw, const int *ok, uint32_t n);

/* A demotion batch started at start_ns ended with failed disk writes
 * (failed: 1) or with all of them good.  (A batch started before the last
 * failure says nothing of the disk now.) */
static void note_writes(local *t, int failed, uint64_t start_ns) {
  if (!failed) {
    if (start_ns > t->fail_ns)
      t->backoff_ms = 0;
    return;
  }
  t->fail_ns = uv_hrtime();
  t->backoff_ms = t->backoff_ms ? t->backoff_ms * 2 : BACKOFF_MIN_MS;
  if (t->backoff_ms > BACKOFF_MAX_MS)
    t->backoff_ms = BACKOFF_MAX_MS;
  t->resume_ns = uv_hrtime() + (uint64_t)t->backoff_ms * 1000000u;
  t->backoffs++;
}

static void batch_end(mbatch *b) {
  local *t = b->t;
  tier_swap *sw = b->sw;
  int failed = 0, wrote = 0;

  for (uint32_t i = 0; i < b->n; i++) {
    wrote |= b->mv[i].tier == CORE_TIER_DISK;
    failed |= !b->ok[i] && b->mv[i].tier == CORE_TIER_DISK;
    if (b->ok[i])
      note_move(t, b->mv[i].tier, 0, b->start_ns);
    if (!sw)
      core_tier_done(t->core, &b->mv[i], b->ok[i]);
    if (b->ok[i] && b->mv[i].tier == CORE_TIER_HOST)
      t->host_in += t->stride;
    if (b->bufs[i] != NONE)
      tier_disk_buf_put(t->disk, b->bufs[i]);
  }
  t->moves -= b->n;
  if (!sw && wrote)
    note_writes(t, failed, b->start_ns);
  if (sw)
    swap_chunk_done(sw, b->ok, b->n);
  free(b);
  swaps_retry(t);
  maybe_idle(t);
}

static void on_move_written(disk_io *io) {
  mbatch *b = io->data;

  b->ok[io - b->ios] = io->status == 0;
  if (--b->pending == 0)
    batch_end(b);
}

/* Staged moves go to disk (a move whose bytes did not make it is done). */
static void write_staged(mbatch *b) {
  b->pending = 1;
  for (uint32_t i = 0; i < b->n; i++) {
    if (b->mv[i].tier != CORE_TIER_DISK || !b->ok[i])
      continue;
    disk_io *io = &b->ios[i];
    io->write = 1;
    io->slot = b->mv[i].slot;
    io->buf = b->bufs[i];
    io->hash = b->mv[i].hash;
    io->restorable = core_tier_entry(b->t->core, b->mv[i].entry, &io->tokens);
    io->cb = on_move_written;
    io->data = b;
    b->pending++;
    tier_disk_submit(b->t->disk, io);
  }
  if (--b->pending == 0)
    batch_end(b);
}

/* A thread of libuv's pool: the batch's host -> staging copies and every
 * staged block's checksum, off the loop (a burst's batch is up to 256
 * blocks: milliseconds of memcpy and XXH3 that every session's frames
 * would otherwise wait behind).  It touches only the batch's own staging
 * buffers and the host slots its moves hold busy. */
static void stage_work(uv_work_t *w) {
  mbatch *b = w->data;
  local *t = b->t;
  uint64_t since = 0;

  for (uint32_t i = 0; i < b->n; i++) {
    const core_move *m = &b->mv[i];

    if (m->tier != CORE_TIER_DISK || !b->ok[i])
      continue;
    if (m->kind == CORE_MOVE_HOST_TO_DISK)
      memcpy(tier_disk_buf_data(t->disk, b->bufs[i]),
             tier_host_slot(&t->host, m->src_slot), t->stride);
    b->ios[i].sum = tier_disk_sum(t->disk, b->bufs[i]);
    b->ios[i].has_sum = 1;
    if (b->staging_off_loop &&
        (since += 2 * t->stride) >= STAGE_YIELD_BYTES) {
      sched_yield(); /* as the host pool's copies: the loop may be
                        waiting for this CPU */
      since = 0;
    }
  }
}

static void stage_done(uv_work_t *w, int status) {
  mbatch *b = w->data;

  (void)status; /* never cancelled: the loop drains moves before closing */
  write_staged(b);
}

/* The pool's bytes are where they go (host slots, staging buffers): the
 * moves to disk are staged, then written.  A few blocks' worth is staged
 * on the loop at once (a hop to a thread and back would cost more, and in
 * a steady stream of small batches it delays write-back enough to lose
 * blocks); a bigger batch, a burst's, off the loop. */
static void stage(mbatch *b) {
  uint64_t bytes = 0;

  for (uint32_t i = 0; i < b->n; i++)
    if (b->mv[i].tier == CORE_TIER_DISK && b->ok[i])
      bytes += b->mv[i].kind == CORE_MOVE_HOST_TO_DISK ? 2 * b->t->stride
                                                        : b->t->stride;
  b->work.data = b;
  b->staging_off_loop = bytes > STAGE_INLINE_MAX;
  if (b->staging_off_loop &&
      uv_queue_work(b->t->loop, &b->work, stage_work, stage_done) == 0)
    return;
  b->staging_off_loop = 0; /* (libuv refuses only bad arguments) */
  if (bytes)
    stage_work(&b->work);
  write_staged(b);
}

static void on_moved_down(copy_job *j) {
  mbatch *b = j->data;

  if (j->status < 0)
    for (uint32_t i = 0; i < b->n; i++)
      if (b->mv[i].kind != CORE_MOVE_HOST_TO_DISK)
        b->ok[i] = 0;
  stage(b);
}

/* A batch for up to room moves (mv to be filled by the caller). */
static mbatch *batch_new(local *t, uint32_t room) {
  size_t sz = sizeof(mbatch) +
              room * (sizeof(core_move) + 2 * sizeof(uint32_t) +
                      sizeof(void *) + sizeof(int) + sizeof(disk_io));
  mbatch *b = calloc(1, sz);

  if (!b)
    return NULL;
  b->t = t;
  b->start_ns = uv_hrtime();
  b->ios = (disk_io *)(b + 1);
  b->mv = (core_move *)(b->ios + room);
  b->host = (void **)(b->mv + room);
  b->blocks = (uint32_t *)(b->host + room);
  b->bufs = b->blocks + room;
  b->ok = (int *)(b->bufs + room);
  return b;
}

/* Starts b's n moves: pool -> host slots or staging buffers as one copy
 * job; then host -> staging and the checksums (stage); then the disk
 * writes.  A staging buffer for each move to disk is free (the caller
 * checked). */
static void batch_start(mbatch *b, uint32_t n) {
  local *t = b->t;
  uint32_t nj = 0;

  b->n = n;
  t->moves += n;
  for (uint32_t i = 0; i < n; i++) {
    core_move *m = &b->mv[i];

    b->ok[i] = 1;
    b->bufs[i] = NONE;
    if (m->tier == CORE_TIER_DISK)
      tier_disk_buf_get(t->disk, &b->bufs[i]);
    if (m->kind == CORE_MOVE_HOST_TO_DISK) { /* copied by stage_work */
      t->host_out += t->stride;
      continue;
    }
    b->blocks[nj] = m->block;
    b->host[nj++] = m->tier == CORE_TIER_HOST
                        ? tier_host_slot(&t->host, m->slot)
                        : tier_disk_buf_data(t->disk, b->bufs[i]);
  }
  if (nj == 0) {
    stage(b);
    return;
  }
  b->job.kind = COPY_TO_HOST;
  b->job.blocks = b->blocks;
  b->job.host = b->host;
  b->job.n = nj;
  b->job.cb = on_moved_down;
  b->job.data = b;
  if (copy_submit(t->copy, &b->job) < 0) {
    for (uint32_t i = 0; i < n; i++)
      if (b->mv[i].kind != CORE_MOVE_HOST_TO_DISK)
        b->ok[i] = 0;
    stage(b);
  }
}

static void on_tick(uv_timer_t *h) {
  local *t = h->data;
  uint32_t room = MOVES_MAX - t->moves, n;
  mbatch *b;

  if (t->stopped || t->moves >= MOVES_MAX ||
      (t->backoff_ms && uv_hrtime() < t->resume_ns))
    return;
  if (t->disk && tier_disk_bufs_free(t->disk) / 2 < room)
    room = tier_disk_bufs_free(t->disk) / 2; /* half for promotions */
  if (room == 0 || !(b = batch_new(t, room)))
    return;
  n = core_tier_plan(t->core, b->mv, room);
  if (n == 0) {
    free(b);
    return;
  }
  batch_start(b, n);
}

static void on_kick(uv_check_t *h) {
  local *t = h->data;

  t->kicked = 0;
  uv_check_stop(h);
  on_tick(&t->tick);
}

void local_kick(local *t) {
  if (!t || t->stopped || t->kicked)
    return;
  t->kicked = 1;
  uv_check_start(&t->kick, on_kick);
}

/* ---- promotion ------------------------------------------------------------- */

uint32_t local_promote_room(const local *t) {
  uint32_t room = t->cfg->tier_promote_max;

  if (t->disk && tier_disk_bufs_free(t->disk) < room)
    room = tier_disk_bufs_free(t->disk);
  return room;
}

static void promo_end(tier_promo *pr) {
  local *t = pr->t;
  uint32_t good = 0;

  for (uint32_t i = 0; i < pr->n; i++) {
    if (pr->ok[i])
      note_move(t, pr->p[i].tier, 1, pr->start_ns);
    if (pr->bufs[i] != NONE)
      tier_disk_buf_put(t->disk, pr->bufs[i]);
    if (pr->ok[i] && pr->p[i].tier == CORE_TIER_HOST)
      t->host_out += t->stride;
  }
  if (pr->ok_out) { /* a swap-in's chunk: its owner calls the core */
    memcpy(pr->ok_out, pr->ok, pr->n * sizeof(int));
  } else {
    pr->hit_tokens =
        core_promote_finish(t->core, pr->r, pr->p, pr->n, pr->ok);
    /* what the request kept of them: good ones up to the first failure */
    while (good < pr->n && pr->ok[good])
      good++;
    pr->promoted_tokens = pr->r ? good * t->pool->layout.block_size : 0;
  }
  free(pr->ios); /* the allocation holds p, ok, bufs... too */
  pr->p = NULL;
  pr->ios = NULL;
  t->promos--;
  if (pr->starting) { /* inside local_promote: it tells the caller */
    pr->early = 1;
    return;
  }
  pr->stage_cb(pr);
  swaps_retry(t);
  maybe_idle(t);
}

static void on_promo_copied(copy_job *j) {
  tier_promo *pr = j->data;

  if (j->status < 0)
    for (uint32_t i = 0; i < pr->n; i++)
      pr->ok[i] = 0;
  promo_end(pr);
}

/* Every disk read is back: one job brings up whatever is good. */
static void promo_copy(tier_promo *pr) {
  local *t = pr->t;
  uint32_t nj = 0;

  for (uint32_t i = 0; i < pr->n; i++) {
    if (!pr->ok[i])
      continue;
    pr->jblocks[nj] = pr->p[i].block;
    pr->jhost[nj++] = pr->p[i].tier == CORE_TIER_HOST
                          ? tier_host_slot(&t->host, pr->p[i].slot)
                          : tier_disk_buf_data(t->disk, pr->bufs[i]);
  }
  if (nj == 0) {
    promo_end(pr);
    return;
  }
  memset(&pr->job, 0, sizeof(pr->job));
  pr->job.kind = COPY_FROM_HOST;
  pr->job.blocks = pr->jblocks;
  pr->job.host = pr->jhost;
  pr->job.n = nj;
  pr->job.cb = on_promo_copied;
  pr->job.data = pr;
  if (copy_submit(t->copy, &pr->job) < 0) {
    for (uint32_t i = 0; i < pr->n; i++)
      pr->ok[i] = 0;
    promo_end(pr);
  }
}

static void on_promo_read(disk_io *io) {
  tier_promo *pr = io->data;

  pr->ok[io - pr->ios] = io->status == 0;
  if (--pr->reads == 0)
    promo_copy(pr);
}

int local_promote(local *t, tier_promo *pr, const core_promo *p,
                  uint32_t n) {
  size_t sz = n * (sizeof(core_promo) + sizeof(int) + 2 * sizeof(uint32_t) +
                   sizeof(void *) + sizeof(disk_io));
  uint8_t *mem;

  if (n == 0 || n > local_promote_room(t))
    return KVS_EINVAL;
  mem = malloc(sz);
  if (!mem)
    return KVS_ENOMEM;
  pr->t = t;
  pr->n = n;
  pr->ios = (disk_io *)mem;
  pr->p = (core_promo *)(pr->ios + n);
  pr->jhost = (void **)(pr->p + n);
  pr->ok = (int *)(pr->jhost + n);
  pr->bufs = (uint32_t *)(pr->ok + n);
  pr->jblocks = pr->bufs + n;
  memcpy(pr->p, p, n * sizeof(*p));
  pr->start_ns = uv_hrtime();
  pr->reads = 1;
  pr->starting = 1;
  pr->early = 0;
  t->promos++;
  for (uint32_t i = 0; i < n; i++) {
    pr->ok[i] = 1;
    pr->bufs[i] = NONE;
    if (p[i].tier != CORE_TIER_DISK)
      continue;
    tier_disk_buf_get(t->disk, &pr->bufs[i]); /* room checked above */
    disk_io *io = &pr->ios[i];
    io->write = 0;
    io->slot = p[i].slot;
    io->buf = pr->bufs[i];
    io->hash = p[i].hash;
    io->tokens = NULL;
    io->restorable = 0;
    io->cb = on_promo_read;
    io->data = pr;
    pr->reads++;
    tier_disk_submit(t->disk, io);
  }
  if (--pr->reads == 0)
    promo_copy(pr);
  pr->starting = 0;
  return pr->early;
}

/* ---- swap ------------------------------------------------------------------ */

#define SWAP_CHUNK 128 /* moves or fills per chunk */

static void swap_step(tier_swap *sw);

/* Ends sw: the core's finish, then (unless still inside local_swap_*)
 * the owner's callback. */
static void swap_end(tier_swap *sw) {
  local *t = sw->t;

  for (uint32_t i = 0; i < sw->n; i++)
    sw->copied += (uint32_t)(sw->ok[i] != 0);
  if (sw->in) {
    sw->tokens = core_swap_in_finish(t->core, sw->r, sw->p, sw->n, sw->ok);
  } else {
    sw->status = core_swap_out_finish(t->core, sw->r, sw->mv, sw->n, sw->ok);
  }
  free(sw->in ? (void *)sw->p : (void *)sw->mv); /* (ok is in it) */
  sw->ok = NULL;
  sw->mv = NULL;
  sw->p = NULL;
  t->swaps--;
  if (sw->starting) { /* inside local_swap_*: it tells the caller */
    sw->starting = 0;
    return;
  }
  sw->cb(sw);
  maybe_idle(t);
}

static void swap_chunk_done(tier_swap *sw, const int *ok, uint32_t n) {
  memcpy(sw->ok + sw->next, ok, n * sizeof(int));
  sw->next += n;
  swap_step(sw);
}

static void on_swap_fill(tier_promo *pr) {
  tier_swap *sw = pr->data;

  sw->next += pr->n;
  swap_step(sw);
}

/* The staging buffers a chunk of sw from sw->next may use: 0 means wait. */
static uint32_t swap_room(const tier_swap *sw) {
  const local *t = sw->t;
  uint32_t room = sw->n - sw->next, need = 0, free_bufs;

  if (room > SWAP_CHUNK)
    room = SWAP_CHUNK;
  if (sw->in && room > local_promote_room(t))
    room = local_promote_room(t);
  if (!t->disk)
    return room;
  free_bufs = tier_disk_bufs_free(t->disk);
  for (uint32_t i = 0; i < room; i++) {
    uint32_t tier = sw->in ? sw->p[sw->next + i].tier
                           : sw->mv[sw->next + i].tier;
    if (tier == CORE_TIER_DISK && ++need > free_bufs)
      return i;
  }
  return room;
}

/* Starts sw's next chunk, ends it when none is left, or queues it to wait
 * for staging buffers. */
static void swap_step(tier_swap *sw) {
  local *t = sw->t;
  uint32_t k;

  if (sw->next == sw->n) {
    swap_end(sw);
    return;
  }
  k = swap_room(sw);
  if (k == 0) { /* a batch or promotion in flight gives buffers back */
    sw->wait_next = NULL;
    *t->waiting_tail = sw;
    t->waiting_tail = &sw->wait_next;
    return;
  }
  if (!sw->in) {
    mbatch *b = batch_new(t, k);

    if (!b) {
      for (uint32_t i = sw->next; i < sw->n; i++)
        sw->ok[i] = 0;
      sw->next = sw->n;
      swap_end(sw);
      return;
    }
    b->sw = sw;
    memcpy(b->mv, sw->mv + sw->next, k * sizeof(core_move));
    batch_start(b, k);
    return;
  }
  memset(&sw->fill, 0, sizeof(sw->fill));
  sw->fill.stage_cb = on_swap_fill;
  sw->fill.data = sw;
  sw->fill.ok_out = sw->ok + sw->next;
  int rc = local_promote(t, &sw->fill, sw->p + sw->next, k);
  if (rc < 0) {
    /* Nothing of this chunk started (out of memory): the request ends
     * before it, so the chunks after it are not worth trying either.  (It
     * used to restart the same chunk, recursively, for ever.) */
    for (uint32_t i = sw->next; i < sw->n; i++)
      sw->ok[i] = 0;
    sw->next = sw->n;
    swap_end(sw);
    return;
  }
  if (rc == 1) /* ended at once */
    on_swap_fill(&sw->fill);
}

static void swaps_retry(local *t) {
  tier_swap *list = t->waiting;

  t->waiting = NULL;
  t->waiting_tail = &t->waiting;
  while (list) {
    tier_swap *sw = list;

    list = sw->wait_next;
    swap_step(sw); /* may queue it again */
  }
}

static int swap_start(local *t, tier_swap *sw, const void *items,
                      size_t item_size, uint32_t n) {
  /* One allocation: the items first (they hold 64-bit fields), then ok. */
  uint8_t *mem = malloc(n * (item_size + sizeof(int)));

  if (!mem)
    return KVS_ENOMEM;
  sw->t = t;
  memcpy(mem, items, n * item_size);
  sw->ok = (int *)(mem + n * item_size);
  if (sw->in)
    sw->p = (core_promo *)mem;
  else
    sw->mv = (core_move *)mem;
  sw->n = n;
  sw->next = 0;
  sw->copied = 0;
  sw->status = 0;
  t->swaps++;
  sw->starting = 1; /* swap_end does not call back: we tell the caller */
  swap_step(sw);
  if (sw->starting == 0)
    return 1;
  sw->starting = 0;
  return 0;
}

int local_swap_out(local *t, tier_swap *sw, const core_move *mv, uint32_t n) {
  sw->in = 0;
  return swap_start(t, sw, mv, sizeof(*mv), n);
}

int local_swap_in(local *t, tier_swap *sw, const core_promo *p, uint32_t n) {
  sw->in = 1;
  return swap_start(t, sw, p, sizeof(*p), n);
}

/* ---- set-up ---------------------------------------------------------------- */

int local_slots(const cfg *c, const kvs_layout *l, const backend *pool,
                uint32_t slots[CORE_TIERS], char *err, size_t err_len) {
  uint64_t h = c->host_tier_bytes / l->block_stride;

  slots[CORE_TIER_HOST] = slots[CORE_TIER_DISK] = 0;
  if (c->host_tier_bytes && (h == 0 || h >= NONE / 2)) {
    snprintf(err, err_len, "host_tier_bytes %llu holds %llu blocks of %llu "
             "bytes; want 1 .. 2^31", (unsigned long long)c->host_tier_bytes,
             (unsigned long long)h, (unsigned long long)l->block_stride);
    return KVS_EINVAL;
  }
  slots[CORE_TIER_HOST] = (uint32_t)h;
  if (c->disk_tier[0]) {
    uint64_t slot = 4096 + (l->block_stride + 4095) / 4096 * 4096;
    uint64_t d = c->disk_tier_bytes / slot;

    if (d == 0 || d >= NONE / 2) {
      snprintf(err, err_len, "disk_tier_bytes %llu holds %llu slots of %llu "
               "bytes (a block and a 4 KiB header); want 1 .. 2^31",
               (unsigned long long)c->disk_tier_bytes, (unsigned long long)d,
               (unsigned long long)slot);
      return KVS_EINVAL;
    }
    slots[CORE_TIER_DISK] = (uint32_t)d;
  }
  return 0;
}

/* ---- restart --------------------------------------------------------------- */

typedef struct restore_ctx {
  core *core;
  uint32_t restored, duplicates, no_tokens, refused;
} restore_ctx;

static void on_scanned(void *arg, uint32_t slot, uint64_t gen, kvs_hash128 h,
                       const uint32_t *tokens) {
  restore_ctx *x = arg;
  int rc = core_tier_restore(x->core, slot, gen, h, tokens);

  if (rc == 0)
    x->restored++;
  else if (rc == 1)
    x->duplicates++;
  else if (tokens == NULL)
    x->no_tokens++; /* verify_tokens is on */
  else
    x->refused++; /* the core's refusal (a zero hash, a slot twice) */
}

/* A kept disk tier: its slot headers back into the core's books.  Only a
 * ring that fails is an error: the daemon does not start. */
static int restore_disk(local *t, const cfg *c, char *err, size_t err_len) {
  restore_ctx x = {t->core, 0, 0, 0, 0};
  tier_disk_scan_stats st;
  struct timespec t0, t1;
  uint32_t kept;
  int rc;

  rc = core_tier_restore_begin(t->core, CORE_TIER_DISK);
  if (rc < 0) {
    snprintf(err, err_len, "disk tier: restore: %s", kvs_strerror(rc));
    return rc;
  }
  clock_gettime(CLOCK_MONOTONIC, &t0);
  rc = tier_disk_scan(t->disk, on_scanned, &x, &st);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  kept = core_tier_restore_end(t->core);
  if (rc < 0) {
    snprintf(err, err_len, "disk tier %s: reading the slot headers: %s",
             c->disk_tier, strerror(-rc));
    return KVS_EIO;
  }
  log_info(0, "disk tier %s: %u slots restored, %u skipped (%u torn, %u "
           "other layout, %u other model, %u other version, %u swap copies, "
           "%u without token ids, %u refused, %u read errors), %u "
           "duplicates freed, %u empty; %u headers read in %.1f ms",
           c->disk_tier, kept,
           st.torn + st.other_layout + st.other_model + st.other_version +
               st.private_copies + x.no_tokens + x.refused + st.io_errors,
           st.torn, st.other_layout, st.other_model, st.other_version,
           st.private_copies, x.no_tokens, x.refused, st.io_errors,
           x.duplicates,
           st.empty, st.slots,
           (double)(t1.tv_sec - t0.tv_sec) * 1e3 +
               (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
  if (st.other_layout)
    log_warn(0, "disk tier %s: %u slots written under another layout are "
             "not restored (%s)", c->disk_tier, st.other_layout,
             st.layout_note);
  if (st.other_model)
    log_warn(0, "disk tier %s: %u slots written for another model id (not "
             "'%s'%s%s) are not restored", c->disk_tier, st.other_model,
             c->model_id, c->part_tenant[0] ? " of tenant " : "",
             c->part_tenant);
  return 0;
}

/* On a GPU pool the disk tier's bytes go between the device and the
 * staging buffers by DMA, from pinned memory (pageable memory would make
 * the driver copy synchronously, on the loop). */
static int pin_staging(local *t, char *err, size_t err_len) {
  void *p;
  size_t len;
  int rc;

  if (!t->pool->ops->host_register)
    return 0;
  tier_disk_bufs_region(t->disk, &p, &len);
  rc = t->pool->ops->host_register(t->pool, p, len);
  if (rc < 0) {
    snprintf(err, err_len, "disk tier: pinning its %zu bytes of staging "
             "buffers for the GPU's copies failed: %s", len,
             kvs_strerror(rc));
    tier_disk_close(t->disk); /* (its handles close on the loop) */
    t->disk = NULL;
    return rc;
  }
  t->pinned_bufs = p;
  return 0;
}

static void unpin_staging(local *t) {
  if (t->pinned_bufs)
    t->pool->ops->host_unregister(t->pool, t->pinned_bufs);
  t->pinned_bufs = NULL;
}

int local_open(uv_loop_t *loop, const cfg *c, core *cr, backend *pool,
               copy_engine *copy, local **out, char *err, size_t err_len) {
  local *t;
  int rc;

  *out = NULL;
  if (!c->host_tier_bytes && !c->disk_tier[0])
    return 0;
  t = calloc(1, sizeof(*t));
  if (!t) {
    snprintf(err, err_len, "out of memory");
    return KVS_ENOMEM;
  }
  t->loop = loop;
  t->core = cr;
  t->pool = pool;
  t->copy = copy;
  t->cfg = c;
  t->stride = pool->layout.block_stride;
  if (c->host_tier_bytes) {
    rc = tier_host_open(&t->host, pool, c->host_tier_bytes, t->stride, err,
                        err_len);
    if (rc < 0) {
      free(t);
      return rc;
    }
  }
  if (c->disk_tier[0]) {
    const kvs_layout *l = &pool->layout;
    tier_disk_stamp stamp = {l->block_size, l->num_layers, l->num_kv_heads,
                             l->head_dim, (uint32_t)l->dtype,
                             core_tenant_root(core_root_hash(l, c->model_id),
                                              c->part_tenant)};

    rc = tier_disk_open(loop, c->disk_tier, c->disk_tier_bytes, t->stride,
                        &stamp, STAGING, c->tier_fault, &t->disk, err,
                        err_len);
    if (rc == 0 && c->disk_tier_persist) {
      rc = restore_disk(t, c, err, err_len);
      if (rc < 0) {
        tier_disk_close(t->disk); /* (its handles close on the loop) */
        t->disk = NULL;
      }
    }
    if (rc == 0)
      rc = pin_staging(t, err, err_len);
    if (rc < 0) {
      tier_host_close(&t->host);
      free(t);
      return rc;
    }
  }
  t->waiting_tail = &t->waiting;
  uv_timer_init(loop, &t->tick);
  uv_check_init(loop, &t->kick);
  t->tick.data = t->kick.data = t;
  uv_timer_start(&t->tick, on_tick, TIERS_TICK_MS, TIERS_TICK_MS);
  if (t->host.base)
    log_info(0, "host tier: %u blocks, %llu MiB%s", t->host.nslots,
             (unsigned long long)(t->host.bytes >> 20),
             t->host.pinned_by ? ", pinned" : "");
  if (t->disk)
    log_info(0, "disk tier: %s, %u slots, %u staging buffers, %s, %s%s",
             c->disk_tier, tier_disk_slots(t->disk), tier_disk_bufs(t->disk),
             tier_disk_direct(t->disk) ? "O_DIRECT"
                                       : "buffered (no O_DIRECT here)",
             tier_disk_registered(t->disk) ? "registered buffers and file"
                                           : "unregistered",
             t->pinned_bufs ? ", staging buffers pinned" : "");
  *out = t;
  return 0;
}

void local_stop(local *t) {
  if (!t || t->stopped)
    return;
  t->stopped = 1;
  uv_timer_stop(&t->tick);
  uv_check_stop(&t->kick);
}

int local_idle(const local *t) {
  return !t || (t->moves == 0 && t->promos == 0 && t->swaps == 0 &&
                (!t->disk || tier_disk_idle(t->disk)));
}

static void on_tick_closed(uv_handle_t *h) {
  local *t = h->data;

  if (--t->handles > 0)
    return;
  tier_host_close(&t->host);
  free(t);
}

/* A persistent disk tier's completed writes made durable. */
static void sync_disk(local *t) {
  if (t->disk && t->cfg->disk_tier_persist) {
    int rc = tier_disk_sync(t->disk);
    core_tier_stats cs[CORE_TIERS];

    core_tier_get_stats(t->core, cs);
    if (rc < 0)
      log_error(-rc, "disk tier %s: fdatasync", t->cfg->disk_tier);
    else
      log_info(0, "disk tier %s: synced for the next start (%u slots in "
               "use)", t->cfg->disk_tier, cs[CORE_TIER_DISK].used);
  }
}

void local_abandon(local *t) {
  if (t)
    sync_disk(t); /* (a slot still being written fails its check later) */
}

void local_close(local *t) {
  if (!t)
    return;
  local_stop(t);
  sync_disk(t); /* every write has completed (the daemon drained) */
  unpin_staging(t);
  tier_disk_close(t->disk);
  t->disk = NULL;
  t->handles = 2;
  uv_close((uv_handle_t *)&t->tick, on_tick_closed);
  uv_close((uv_handle_t *)&t->kick, on_tick_closed);
}

void local_get_hists(const local *t, tier_hist h[TIER_HISTS]) {
  memcpy(h, t->hist, sizeof(t->hist));
}

void local_get_stats(const local *t, tiers_stats st[CORE_TIERS],
                     uint32_t *n) {
  core_tier_stats cs[CORE_TIERS];

  *n = 0;
  if (!t)
    return;
  core_tier_get_stats(t->core, cs);
  if (t->host.base) {
    tiers_stats *s = &st[(*n)++];
    memset(s, 0, sizeof(*s));
    s->name = "host";
    s->capacity_bytes = t->host.bytes;
    s->core = cs[CORE_TIER_HOST];
    s->bytes_in = t->host_in;
    s->bytes_out = t->host_out;
  }
  if (t->disk) {
    tiers_stats *s = &st[(*n)++];
    tier_disk_stats ds;
    tier_disk_get_stats(t->disk, &ds);
    memset(s, 0, sizeof(*s));
    s->name = "disk";
    s->capacity_bytes = t->cfg->disk_tier_bytes;
    s->core = cs[CORE_TIER_DISK];
    s->bytes_in = ds.bytes_written;
    s->bytes_out = ds.bytes_read;
    s->io_errors = ds.io_errors;
    s->checksum_failures = ds.checksum_failures;
    s->backoffs = t->backoffs;
  }
}
