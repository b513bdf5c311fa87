/*
 * tiers.h — the tiers below the pool, as one front: the host tier, the
 * disk tier and the remote tier, and every move between them and the
 * pool.  The core keeps the books of the host and disk tiers
 * (daemon/core/tierbook.c) and says what to move; the tiers move the bytes
 * and report back.
 *
 * Inside, by naming scheme:
 *   tiers.c        tiers_       this front: open, close, the promotion
 *                               chain of a Lookup, swaps, stats
 *   local.c        local_       the moves of the host and disk tiers:
 *                               demotion (write-back), promotion, swap
 *   remote.c       remote_      the moves of the remote tier:
 *                               write-through, promotion
 *   tier_host.c    tier_host_   the stores: the host tier's memory,
 *   tier_disk.c    tier_disk_   the disk tier's slots (io_uring,
 *   tier_remote.c  tier_remote_ O_DIRECT), the remote tier's Redis
 *
 * Demotion: every TIERS_TICK_MS a timer asks the core for the moves to
 * start (core_tier_plan: cached blocks near the cold end of the pool with no
 * copy below, and host blocks the host tier must push to disk) and runs
 * them: pool -> host slots as one copy-engine job (memcpy, or the daemon's
 * CUDA stream), host -> disk and pool -> disk through staging buffers and
 * io_uring.  So an allocation under pressure evicts blocks whose bytes are
 * already below, and never waits for I/O.  Sealed blocks are written
 * through to the remote tier as they are committed.
 *
 * Promotion (tiers_lookup): a Lookup's blocks found in the host or disk
 * tier (core_lookup_promote) are read (disk slots into staging buffers,
 * checked), then copied into their pool blocks as one copy-engine job;
 * then core_promote_finish; then the rest of the chain is asked of the
 * remote tier.  A failed read or copy makes that block (and the rest of
 * the prefix after it) a miss.  The owner's callback runs once, at the end
 * of the chain.
 *
 * Swap: a SwapOut's moves (core_swap_out) and a SwapIn's fills
 * (core_swap_in) run through the host and disk tiers the same way, in
 * chunks that fit the staging buffers (a chunk that finds none waits for
 * the next batch or promotion to give some back); after the last one,
 * core_swap_out_finish or core_swap_in_finish, and the owner's callback.
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

#include "daemon/config.h"
#include "daemon/core/core.h"
#include "daemon/pool/backend.h"
#include "daemon/pool/copy.h"
#include "daemon/tiers/tier_disk.h"
#include "daemon/tiers/tier_hist.h"
#include "daemon/tiers/tier_remote.h"

#define TIERS_TICK_MS 5
/* The tiers there can be, top first: host, disk, remote. */
#define TIERS_MAX (CORE_TIERS + 1)

typedef struct tiers tiers;
typedef struct local local;

typedef struct tier_promo tier_promo;
typedef void (*tier_promo_cb)(tier_promo *pr);

struct tier_promo {
  /* the owner's: set before tiers_lookup */
  tier_promo_cb cb;
  void *data;
  core_req *r;   /* the request; set to NULL when it is freed meanwhile */
  /* the result, for cb */
  uint32_t hit_tokens;      /* the request's hit after the promotion */
  uint32_t promoted_tokens; /* of which brought up */
  /* the tiers' own */
  tiers *front;
  tier_promo_cb stage_cb;   /* the end of the host/disk stage */
  local *t;
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
  uint64_t start_ns;
};

typedef struct tier_swap tier_swap;
typedef void (*tier_swap_cb)(tier_swap *sw);

struct tier_swap {
  /* the owner's: set before tiers_swap_out/tiers_swap_in */
  tier_swap_cb cb;
  void *data;
  core_req *r;   /* the request; set to NULL when it is freed meanwhile */
  uint32_t before;  /* written tokens before (for the reply) */
  /* the result, for cb */
  int in;           /* a SwapIn (else a SwapOut) */
  int status;       /* SwapOut: 0 or KVS_EIO */
  uint32_t copied;  /* blocks whose bytes moved */
  uint32_t tokens;  /* SwapIn: written tokens after it */
  /* the tiers' own */
  local *t;
  core_move *mv;    /* SwapOut */
  core_promo *p;    /* SwapIn */
  int *ok;
  uint32_t n, next;
  int starting;
  tier_swap *wait_next;
  tier_promo fill;  /* SwapIn: the chunk being filled */
};

/* The checks of the tiers' settings that need no pool, made before it is
 * allocated: the disk tier's file can be opened or created, the remote
 * tier's URL and password file are well-formed.  0, or a negative status
 * with a reason. */
int tiers_check(const cfg *c, char *err, size_t err_len);
/* Opens the tiers cfg asks for (none: *out = NULL, 0) over the core, which
 * must have been created with the matching tier_slots (tiers_slots).  0,
 * or a negative status with a reason. */
int tiers_open(uv_loop_t *loop, const cfg *c, core *cr, backend *pool,
               copy_engine *copy, tiers **out, char *err, size_t err_len);
/* The slots of the host and disk tiers cfg asks for (for the core's
 * config); 0, or a negative status with a reason. */
int tiers_slots(const cfg *c, const kvs_layout *l, const backend *pool,
                uint32_t slots[CORE_TIERS], char *err, size_t err_len);

/*
 * A Lookup of tokens[0..n) for request r, the whole chain: the blocks
 * resident in the pool (core_lookup_promote), then, when promote and t
 * (which may be NULL: no tier), those found in the host or disk tier
 * brought up, then the rest asked of the remote tier.  pr->cb, data and r
 * are the caller's.  A core error: returned, nothing done.  0: done,
 * pr->hit_tokens and pr->promoted_tokens set, and *below the cached tokens
 * found below and not taken (no promotion).  1: under way; pr->cb runs
 * later, once, with both set.
 */
int tiers_lookup(tiers *t, core *cr, core_req *r, const uint32_t *tokens,
                 uint32_t n, int promote, tier_promo *pr, uint32_t *below);

/* Is there a tier a SwapOut can go to (host or disk)? */
int tiers_can_swap(const tiers *t);
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
 * demotions at the end of this loop turn too, not only on the timer.
 * NULL: nothing. */
void tiers_kick(tiers *t);

/* Stops starting moves (shutdown): demotions, writes to the remote tier,
 * promotions. */
void tiers_stop(tiers *t);
/* The daemon leaves with tier I/O still in flight: the writes that
 * completed are made durable (a persistent disk tier).  NULL: nothing. */
void tiers_abandon(tiers *t);
/* 1 when no move or promotion is in flight (or t is NULL). */
int tiers_idle(const tiers *t);
/* Every move and promotion must be done.  NULL: nothing. */
void tiers_close(tiers *t);

typedef struct tiers_stats {
  const char *name;     /* "host", "disk", "remote" */
  uint64_t capacity_bytes;
  core_tier_stats core;
  uint64_t bytes_in, bytes_out, io_errors, checksum_failures;
  uint64_t backoffs;    /* demotion paused after failed writes */
} tiers_stats;
/* The tiers that exist, top first (the remote tier last), into
 * st[0..*n). */
void tiers_get_stats(const tiers *t, tiers_stats st[TIERS_MAX], uint32_t *n);
/* acc[0..*nacc) += x[0..n), tier by tier (the partitions of a daemon with
 * tenants have the same tiers, in the same order); *nacc grows to n. */
void tiers_stats_add(tiers_stats acc[TIERS_MAX], uint32_t *nacc,
                     const tiers_stats *x, uint32_t n);
/* The remote tier's store counters; 0, or KVS_ENOENT with none. */
int tiers_remote_stats(const tiers *t, tier_remote_stats *st);
/* The latency histograms (zeros for a tier that does not exist). */
void tiers_get_hists(const tiers *t, tier_hist h[TIER_HISTS]);

#endif
