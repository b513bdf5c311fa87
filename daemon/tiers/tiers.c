/*
 * tiers.c — the front of the tiers below the pool (tiers.h): the host and
 * disk tiers (local.c) and the remote tier (remote.c) opened, stopped and
 * counted as one, and the promotion chain of a Lookup.
 */
#include "daemon/tiers/tiers_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvs_status.h"

static void on_mover_idle(void *arg) {
  tiers *t = arg;

  if (t->idle_cb && tiers_idle(t))
    t->idle_cb(t->idle_data);
}

int tiers_open(uv_loop_t *loop, const cfg *c, core *cr, backend *pool,
               copy_engine *copy, tiers **out, char *err, size_t err_len) {
  tiers *t;
  int rc;

  *out = NULL;
  if (!c->host_tier_bytes && !c->disk_tier[0] && !c->remote_tier[0])
    return 0;
  t = calloc(1, sizeof(*t));
  if (t)
    t->scratch = calloc(c->tier_promote_max ? c->tier_promote_max : 1,
                        sizeof(core_promo));
  if (!t || !t->scratch) {
    free(t);
    snprintf(err, err_len, "out of memory");
    return KVS_ENOMEM;
  }
  t->cfg = c;
  t->core = cr;
  t->block_size = pool->layout.block_size;
  rc = local_open(loop, c, cr, pool, copy, &t->local, err, err_len);
  if (rc < 0) { /* (the remote tier's reasons name it already) */
    char why[256];

    snprintf(why, sizeof(why), "%s", err);
    snprintf(err, err_len, "tiers: %s", why);
  } else {
    rc = remote_open(loop, c, cr, pool, copy, &t->remote, err, err_len);
  }
  if (rc < 0) {
    tiers_close(t); /* (handles close on the loop) */
    return rc;
  }
  if (t->local)
    local_set_idle_cb(t->local, on_mover_idle, t);
  if (t->remote)
    remote_set_idle_cb(t->remote, on_mover_idle, t);
  *out = t;
  return 0;
}

int tiers_slots(const cfg *c, const kvs_layout *l, const backend *pool,
                uint32_t slots[CORE_TIERS], char *err, size_t err_len) {
  return local_slots(c, l, pool, slots, err, err_len);
}

/* ---- a Lookup's promotion chain ------------------------------------------ */

/* The rest of the chain from the remote tier: 0 when under way (pr->cb runs
 * at its end), 1 when there is nothing to ask. */
static int chain_remote(tiers *t, tier_promo *pr) {
  if (!t->remote || !pr->r || t->stopped)
    return 1;
  return remote_promote(t->remote, pr, pr->cb);
}

/* The host and disk tiers' part is over. */
static void after_local(tier_promo *pr) {
  if (chain_remote(pr->front, pr) != 0)
    pr->cb(pr);
}

int tiers_lookup(tiers *t, core *cr, core_req *r, const uint32_t *tokens,
                 uint32_t n, int promote, tier_promo *pr, uint32_t *below) {
  uint32_t room = 0, bs;
  core_promo *promos = NULL;
  core_lookup_out out;
  int rc, st;

  promote = promote && t && !t->stopped;
  if (promote && t->local) {
    room = local_promote_room(t->local); /* (at most tier_promote_max) */
    promos = room ? t->scratch : NULL;
  }
  rc = core_lookup_promote(cr, r, tokens, n, promos != NULL, promos, room,
                           &out);
  if (rc < 0)
    return rc;
  bs = t ? t->block_size : 0; /* (no tier: nothing found below) */
  pr->hit_tokens = out.hit_tokens;
  pr->promoted_tokens = 0;
  *below = out.npromos ? 0
                       : (out.tier_blocks[0] + out.tier_blocks[1]) * bs;
  if (!promote)
    return 0;
  pr->front = t;
  if (out.npromos) {
    pr->stage_cb = after_local;
    st = local_promote(t->local, pr, promos, out.npromos);
    if (st < 0) /* nothing started: every promotion failed */
      pr->hit_tokens = core_promote_finish(cr, r, promos, out.npromos, NULL);
    else if (st == 0)
      return 1; /* after_local goes on */
    /* (st 1: ended at once, pr's results set) */
  }
  return chain_remote(t, pr) == 0 ? 1 : 0;
}

/* ---- swaps ---------------------------------------------------------------- */

int tiers_can_swap(const tiers *t) { return t && t->local; }

int tiers_swap_out(tiers *t, tier_swap *sw, const core_move *mv, uint32_t n) {
  return local_swap_out(t->local, sw, mv, n);
}

int tiers_swap_in(tiers *t, tier_swap *sw, const core_promo *p, uint32_t n) {
  return local_swap_in(t->local, sw, p, n);
}

/* ---- life ----------------------------------------------------------------- */

void tiers_set_idle_cb(tiers *t, void (*cb)(void *), void *data) {
  t->idle_cb = cb;
  t->idle_data = data;
}

void tiers_kick(tiers *t) {
  if (t && t->local)
    local_kick(t->local);
}

void tiers_stop(tiers *t) {
  if (!t)
    return;
  t->stopped = 1;
  local_stop(t->local);
  remote_stop(t->remote);
}

void tiers_abandon(tiers *t) {
  if (t)
    local_abandon(t->local);
}

int tiers_idle(const tiers *t) {
  return !t || (local_idle(t->local) && remote_idle(t->remote));
}

void tiers_close(tiers *t) {
  if (!t)
    return;
  tiers_stop(t);
  /* The movers go when their handles have closed, and the callback that
   * led here may still be on the stack in one of them: it must not tell
   * the front (freed below) that it is idle again. */
  if (t->local) {
    local_set_idle_cb(t->local, NULL, NULL);
    local_close(t->local);
  }
  if (t->remote) {
    remote_set_idle_cb(t->remote, NULL, NULL);
    remote_close(t->remote);
  }
  free(t->scratch);
  free(t);
}

void tiers_get_stats(const tiers *t, tiers_stats st[TIERS_MAX],
                     uint32_t *n) {
  *n = 0;
  if (!t)
    return;
  if (t->local)
    local_get_stats(t->local, st, n);
  if (t->remote)
    remote_tier_stats(t->remote, &st[(*n)++]);
}

/* 10 us to 10 s. */
const uint64_t tier_hist_le_ns[TIER_HIST_N] = {
    10000,     25000,     50000,      100000,     250000,
    500000,    1000000,   2500000,    5000000,    10000000,
    25000000,  50000000,  100000000,  250000000,  500000000,
    1000000000, 2500000000, 5000000000, 10000000000};

void tiers_get_hists(const tiers *t, tier_hist h[TIER_HISTS]) {
  memset(h, 0, TIER_HISTS * sizeof(*h));
  if (t && t->local)
    local_get_hists(t->local, h);
  if (t && t->remote) {
    tier_remote_stats rs;

    remote_get_stats(t->remote, &rs);
    h[TIER_HIST_REMOTE_GET] = rs.get_hist;
    h[TIER_HIST_REMOTE_PUT] = rs.put_hist;
  }
}

int tiers_remote_stats(const tiers *t, tier_remote_stats *st) {
  if (!t || !t->remote)
    return KVS_ENOENT;
  remote_get_stats(t->remote, st);
  return 0;
}

void tiers_stats_add(tiers_stats acc[TIERS_MAX], uint32_t *nacc,
                     const tiers_stats *x, uint32_t n) {
  for (uint32_t i = 0; i < n && i < TIERS_MAX; i++) {
    tiers_stats *a = &acc[i];

    if (i >= *nacc) {
      memset(a, 0, sizeof(*a));
      a->name = x[i].name;
    }
#define ADD(f) a->f += x[i].f
    ADD(capacity_bytes);
    ADD(core.slots);
    ADD(core.used);
    ADD(core.demotions);
    ADD(core.promotions);
    ADD(core.hit_blocks);
    ADD(core.drops);
    ADD(core.failures);
    ADD(core.held);
    ADD(bytes_in);
    ADD(bytes_out);
    ADD(io_errors);
    ADD(checksum_failures);
    ADD(backoffs);
#undef ADD
  }
  if (n > *nacc)
    *nacc = n > TIERS_MAX ? TIERS_MAX : n;
}
