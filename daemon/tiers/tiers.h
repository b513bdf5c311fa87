/*
 * tiers.h — the tiers below the pool, as the daemon runs them: the host
 * tier's memory (tier_host.c), the disk tier's I/O (tier_disk.c), and the
 * moves between them and the pool.  The core (daemon/core/tierbook.c) keeps the
 * books and says what to move; this moves the bytes and reports back.
 *
 * Demotion: every TIERS_TICK_MS a timer asks the core for the moves to
 * start (core_tier_plan: cached blocks near the cold end of the pool with no
 * copy below, and host blocks the host tier must push to disk) and runs
 * them: pool -> host slots as one copy-engine job (memcpy, or the daemon's
 * CUDA stream), host -> disk and pool -> disk through staging buffers and
 * io_uring.  So an allocation under pressure evicts blocks whose bytes are
 * already below, and never waits for I/O.
 *
 * Promotion: a Lookup's blocks found below (core_lookup_promote) are read
 * (disk slots into staging buffers, checked), then copied into their pool
 * blocks as one copy-engine job; then core_promote_finish, and the
 * owner's callback sends the Lookup's reply.  A failed read or copy makes
 * that block (and the rest of the prefix after it) a miss.
 *
 * Swap: a SwapOut's moves (core_swap_out) and a SwapIn's fills
 * (core_swap_in) run the same way, in chunks that fit the staging buffers
 * (a chunk that finds none waits for the next batch or promotion to give
 * some back); after the last one, core_swap_out_finish or
 * core_swap_in_finish, and the owner's callback sends the reply.
 *
 * Restart (disk_tier_persist): tiers_open reads the disk tier's slot
 * headers (tier_disk_scan) and gives the good ones to the core
 * (core_tier_restore_*) before the daemon serves; tiers_close, with every
 * write done, fdatasyncs the file.
 */
#ifndef KVS_DAEMON_TIERS_H
#define KVS_DAEMON_TIERS_H

#include <stdint.h>
#include <uv.h>

#include "daemon/pool/backend.h"
#include "daemon/config.h"
#include "daemon/pool/copy.h"
#include "daemon/core/core.h"
#include "daemon/tiers/tier_disk.h"
#include "daemon/tiers/tier_host.h"

#define TIERS_TICK_MS 5

typedef struct tiers tiers;
typedef struct tier_promo tier_promo;
typedef void (*tier_promo_cb)(tier_promo *pr);

struct tier_promo {
  /* the owner's: set before tiers_promote */
  tier_promo_cb cb;
  void *data;
  core_req *r;   /* the request; set to NULL when it is freed meanwhile */
  uint64_t req_id, seq;
  /* the result, for cb */
  uint32_t hit_tokens;      /* the request's hit after the promotion */
  uint32_t promoted_tokens; /* of which brought up */
  /* tiers.c's */
  tiers *t;
  core_promo *p;
  int *ok;
  uint32_t n, reads;
  int starting, early;
  uint32_t *bufs;    /* staging buffer of a disk promotion, or NONE */
  disk_io *ios;
  uint32_t *jblocks;
  void **jhost;
  copy_job job;
  int *ok_out;       /* a swap-in's fill: each block's result goes here and
                        no core call is made */
};

typedef struct tier_swap tier_swap;
typedef void (*tier_swap_cb)(tier_swap *sw);

struct tier_swap {
  /* the owner's: set before tiers_swap_out/tiers_swap_in */
  tier_swap_cb cb;
  void *data;
  core_req *r;   /* the request; set to NULL when it is freed meanwhile */
  uint64_t req_id, seq;
  uint32_t before;  /* written tokens before (for the reply) */
  /* the result, for cb */
  int in;           /* a SwapIn (else a SwapOut) */
  int status;       /* SwapOut: 0 or KVS_EIO */
  uint32_t copied;  /* blocks whose bytes moved */
  uint32_t tokens;  /* SwapIn: written tokens after it */
  /* tiers.c's */
  tiers *t;
  core_move *mv;    /* SwapOut */
  core_promo *p;    /* SwapIn */
  int *ok;
  uint32_t n, next;
  int starting;
  tier_swap *wait_next;
  tier_promo fill;  /* SwapIn: the chunk being filled */
};

/* Opens the tiers cfg asks for (none: *out = NULL, 0) over the core, which
 * must have been created with the matching tier_slots (tiers_slots). */
int tiers_open(uv_loop_t *loop, const cfg *c, core *cr, backend *pool,
               copy_engine *copy, tiers **out, char *err, size_t err_len);
/* The slots of each tier cfg asks for (for the core's config); 0, or a
 * negative status with a reason. */
int tiers_slots(const cfg *c, const kvs_layout *l, const backend *pool,
                uint32_t slots[CORE_TIERS], char *err, size_t err_len);

/* Most blocks a promotion may bring up now. */
uint32_t tiers_promote_room(const tiers *t);
/* Starts the promotion of p[0..n) (from core_lookup_promote) for pr.  0:
 * pr->cb runs later, after core_promote_finish.  1: it ended at once (the
 * copy could not start: every block failed), finished, pr's results set,
 * cb not called.  Negative: nothing started; the caller ends it with
 * core_promote_finish (ok NULL: none was tried; the copies below stay). */
int tiers_promote(tiers *t, tier_promo *pr, const core_promo *p, uint32_t n);

/* Runs a SwapOut's moves mv[0..n) (n > 0; copied) for sw.  0: sw->cb runs
 * later, after core_swap_out_finish.  1: it ended at once (the copies could
 * not start), finished, sw's results set, cb not called.  KVS_ENOMEM:
 * nothing started; the caller ends it with core_swap_out_finish (ok
 * NULL). */
int tiers_swap_out(tiers *t, tier_swap *sw, const core_move *mv, uint32_t n);
/* Likewise a SwapIn's fills p[0..n), then core_swap_in_finish. */
int tiers_swap_in(tiers *t, tier_swap *sw, const core_promo *p, uint32_t n);

/* cb(data) runs whenever the last move or promotion in flight ends. */
void tiers_set_idle_cb(tiers *t, void (*cb)(void *), void *data);

/* Frames were handled (allocations may have taken blocks): plan
 * demotions at the end of this loop turn too, not only on the timer. */
void tiers_kick(tiers *t);

/* Stops starting demotions (shutdown). */
void tiers_stop(tiers *t);
/* 1 when no move or promotion is in flight. */
int tiers_idle(const tiers *t);
/* Every move and promotion must be done. */
void tiers_close(tiers *t);

typedef struct tiers_stats {
  const char *name;
  uint64_t capacity_bytes;
  core_tier_stats core;
  uint64_t bytes_in, bytes_out, io_errors, checksum_failures;
} tiers_stats;
/* The tiers that exist, top first, into st[0..*n). */
void tiers_get_stats(const tiers *t, tiers_stats st[CORE_TIERS], uint32_t *n);

#endif
