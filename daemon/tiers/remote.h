/*
 * remote_moves.h — blocks between the pool and the remote tier
 * (tier_remote.h: the store; the core's "remote tier" calls: the books).
 *
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
#ifndef KVS_DAEMON_REMOTE_MOVES_H
#define KVS_DAEMON_REMOTE_MOVES_H

#include <stdint.h>
#include <uv.h>

#include "daemon/pool/backend.h"
#include "daemon/config.h"
#include "daemon/pool/copy.h"
#include "daemon/core/core.h"
#include "daemon/tiers/tier_remote.h"
#include "daemon/tiers/tiers.h"

typedef struct rmoves rmoves;

/* Opens the store cfg names (none: *out = NULL, 0) and starts writing
 * through.  KVS_EINVAL (a bad URL, password file...) with a reason. */
int rmoves_open(uv_loop_t *loop, const cfg *c, core *cr, backend *pool,
                copy_engine *copy, rmoves **out, char *err, size_t err_len);

/* Brings up the rest of pr->r's chain from the store for a Lookup whose
 * other promotions are done (pr->hit_tokens, pr->promoted_tokens hold
 * them).  0: started; done(pr) runs later with both updated.  1: nothing
 * to ask or the store cannot be asked now: pr unchanged, done not called. */
int rmoves_promote(rmoves *m, tier_promo *pr, void (*done)(tier_promo *pr));

/* cb(data) whenever the last copy or read in flight ends. */
void rmoves_set_idle_cb(rmoves *m, void (*cb)(void *), void *data);
/* Stops writing (queued blocks are dropped; writes sent stay). */
void rmoves_stop(rmoves *m);
/* 1 when no copy or read is in flight. */
int rmoves_idle(const rmoves *m);
/* Idle first: closes the store (flushing writes sent) and frees m. */
void rmoves_close(rmoves *m);

/* The remote tier as one more tier in the stats (name "remote"). */
void rmoves_tier_stats(const rmoves *m, tiers_stats *st);
void rmoves_get_stats(const rmoves *m, remote_stats *st);

#endif
