/*
 * tiers_int.h — what the files of the tiers front share (tiers.h): the
 * front's struct and the two movers behind it.  Not used outside
 * daemon/tiers/.
 */
#ifndef KVS_DAEMON_TIERS_INT_H
#define KVS_DAEMON_TIERS_INT_H

#include "daemon/tiers/tier_host.h"
#include "daemon/tiers/tiers.h"

typedef struct remote remote;

struct tiers {
  const cfg *cfg;
  core *core;
  uint32_t block_size;
  local *local;        /* the host and disk tiers; NULL: neither */
  remote *remote;      /* the remote tier; NULL: none */
  core_promo *scratch; /* a Lookup's promotions (tier_promote_max) */
  int stopped;
  void (*idle_cb)(void *);
  void *idle_data;
};

/* ---- local.c: the host and disk tiers ------------------------------------- */

/* Opens the host and disk tiers cfg asks for (neither: *out = NULL, 0). */
int local_open(uv_loop_t *loop, const cfg *c, core *cr, backend *pool,
               copy_engine *copy, local **out, char *err, size_t err_len);
int local_slots(const cfg *c, const kvs_layout *l, const backend *pool,
                uint32_t slots[CORE_TIERS], char *err, size_t err_len);
/* Most blocks a promotion may bring up now. */
uint32_t local_promote_room(const local *t);
/* Starts the promotion of p[0..n) (from core_lookup_promote) for pr.  0:
 * pr->stage_cb runs later, after core_promote_finish.  1: it ended at once
 * (the copy could not start: every block failed), finished, pr's results
 * set, stage_cb not called.  Negative: nothing started; the caller ends it
 * with core_promote_finish (ok NULL: none was tried; the copies below
 * stay). */
int local_promote(local *t, tier_promo *pr, const core_promo *p,
                  uint32_t n);
int local_swap_out(local *t, tier_swap *sw, const core_move *mv, uint32_t n);
int local_swap_in(local *t, tier_swap *sw, const core_promo *p, uint32_t n);
void local_set_idle_cb(local *t, void (*cb)(void *), void *data);
void local_kick(local *t);
void local_stop(local *t);
void local_abandon(local *t);
int local_idle(const local *t);
void local_close(local *t);
/* The host and disk histograms into h[0 .. TIER_HIST_REMOTE_GET). */
void local_get_hists(const local *t, tier_hist h[TIER_HISTS]);
void local_get_stats(const local *t, tiers_stats st[CORE_TIERS],
                     uint32_t *n);

/* ---- remote.c: the remote tier -------------------------------------------- */

/*
 * Write-through: every block a commit seals and indexes (the core's
 * `sealed` observer) is queued; at the end of the loop turn the queued
 * blocks still holding that hash are copied out into staging buffers
 * (as many as are free): on the host pool by memcpy there and then, held
 * or cached; on a GPU pool only those still IN USE, pinned for one
 * copy-engine job on the daemon's CUDA stream (at most an eighth of the
 * pool pinned at once).  Copies wait in staging for the store's write
 * window (tier_remote.h: a separate connection, 1 MiB of writes waiting
 * for answers) and go as one SET each.  A block evicted (or, on a GPU,
 * released) before its copy, a full queue or staging, a store that is
 * down: the block is skipped, counted (the store is a cache: a skipped
 * block is only a later miss).
 *
 * Promotion: after a Lookup (and its promotions from the tiers below), the
 * request's chain from its first missing block is asked of the store in
 * one pipelined round trip (up to tier_promote_max blocks); the longest
 * run that came back good gets device blocks (core_remote_promote), filled
 * as one copy-engine job, then core_promote_finish; the Lookup's reply
 * waits for it (at most remote_tier_timeout_ms for the store, then the
 * copy).
 */
/* Opens the store cfg names (none: *out = NULL, 0) and starts writing
 * through.  KVS_EINVAL (a bad URL, password file...) with a reason. */
int remote_open(uv_loop_t *loop, const cfg *c, core *cr, backend *pool,
                copy_engine *copy, remote **out, char *err, size_t err_len);
/* Brings up the rest of pr->r's chain from the store for a Lookup whose
 * other promotions are done (pr->hit_tokens, pr->promoted_tokens hold
 * them).  0: started; done(pr) runs later with both updated.  1: nothing
 * to ask or the store cannot be asked now: pr unchanged, done not called. */
int remote_promote(remote *m, tier_promo *pr, void (*done)(tier_promo *pr));
void remote_set_idle_cb(remote *m, void (*cb)(void *), void *data);
/* Stops writing (queued blocks are dropped; writes sent stay). */
void remote_stop(remote *m);
int remote_idle(const remote *m);
/* Idle first: closes the store (flushing writes sent) and frees m. */
void remote_close(remote *m);
/* The remote tier as one more tier in the stats (name "remote"). */
void remote_tier_stats(const remote *m, tiers_stats *st);
void remote_get_stats(const remote *m, tier_remote_stats *st);

#endif
