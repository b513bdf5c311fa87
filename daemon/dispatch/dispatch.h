/*
 * dispatch.h — a session's ops (proto/kvs_op.h) to the core, their results
 * back.  No wire type is seen here: the codecs (proto/kvs_codec.h) turn
 * frames into ops and results into frames, in the session layer above.
 *
 * Request ids are looked up in the session's own map, so a session can
 * never name another's request.  Every argument is checked here before the
 * core sees it; the core's own checks (all-or-nothing) come second.  Every
 * error carries a kvs_status code and a message that names what was wrong.
 *
 * Two things outlive the ops that start them, and the session layer waits
 * for both before it sends the reply:
 * - copies the daemon makes for the worker (Allocate/Append with
 *   KVS_OPF_DAEMON_COPY): the (src, dst) pairs, each block pinned in the
 *   core, in ds->copy_pairs; the caller runs them as one copy job, then
 *   calls disp_copies_done;
 * - one op that moves bytes before it can answer (a Lookup bringing blocks
 *   up from the tiers, a SwapOut or SwapIn): disp_run returns DISP_HELD,
 *   ds->held_cb runs when it is over, and disp_held_result builds its
 *   result.
 */
#ifndef KVS_DAEMON_DISPATCH_H
#define KVS_DAEMON_DISPATCH_H

#include <stdint.h>

#include "daemon/config.h"
#include "daemon/core/core.h"
#include "daemon/dispatch/reqmap.h"
#include "daemon/pool/backend.h"
#include "daemon/pool/copy.h"
#include "daemon/tiers/tiers.h"
#include "kvs_arena.h"
#include "kvs_op.h"

/* The daemon's traffic counters, kept by the session layer and read by
 * Stats. */
typedef struct disp_counts {
  uint32_t sessions;        /* admitted ones */
  uint64_t frames_in;
  uint64_t compact_frames;  /* of frames_in */
  uint64_t protocol_errors;
  uint64_t queued_bytes;    /* replies queued for all sessions */
} disp_counts;

/* What every session's ops run against (filled by serve.c). */
typedef struct disp_env {
  const cfg *cfg;
  kvs_layout layout;
  core *core;
  tiers *tiers;             /* NULL: no tier below the pool */
  copy_engine *copy;
  const backend *pool;
  const disp_counts *counts;
  int stopping;             /* the daemon is shutting down: nothing
                               starts moving bytes */
  uint64_t check_frame;     /* frames_in when Stats{check} last ran */
  /* A Commit with the engine's block keys (kvs_op.keys, counts checked):
   * keys_begin before the core seals its blocks (first: the block-table
   * index of the first block it completes; -1 with a reason in err refuses
   * the commit), keys_end after.  NULL: the keys are only checked. */
  int (*keys_begin)(void *arg, const kvs_op *op, uint32_t first, char *err,
                    size_t len);
  void (*keys_end)(void *arg);
  void *keys_arg;
  /* Tenants (daemon/part/partition.h): the partition's tenant ("" without
   * tenants) and its sessions now, kept by the session layer.  An observer
   * (a peer in no tenant that maps nothing) runs against an env with no
   * core: only Stats and Ping, and its Stats adds up every partition in
   * parts[0..nparts).  own: its sessions and their traffic, kept by the
   * session layer beside the daemon's counts; with tenants, a tenant's
   * Stats reports these, never the daemon's (another tenant's frames would
   * tell when and how much it works). */
  const char *tenant;
  disp_counts own;
  /* With tenants: the token positions its sessions' requests hold
   * together, and the most they may (max_tenant_tokens). */
  uint64_t tokens_held, max_tokens;
  struct disp_env *const *parts;
  uint32_t nparts;
} disp_env;

typedef struct disp_sess disp_sess;

/* What an op holding its answer back is waiting for. */
typedef enum disp_held {
  DISP_HELD_NONE = 0,
  DISP_HELD_LOOKUP,  /* blocks coming up from the tiers */
  DISP_HELD_SWAP,    /* a SwapOut's or SwapIn's bytes moving */
} disp_held;

struct disp_sess {
  disp_env *env;
  reqmap reqs;
  uint64_t tokens_held;     /* sum of the costs in reqs */
  /* The copies the ops run since the last disp_copies_done asked for: (src,
   * dst) pairs, every dst pinned, and each distinct src pinned once (in
   * srcs: open addressing, KVS_BLOCK_NONE empty; many forks' appends copy
   * from one block). */
  uint32_t *copy_pairs;
  uint32_t ncopy, copy_cap;
  uint32_t *srcs;
  uint32_t nsrcs, srcs_cap;  /* srcs_cap: 0 or a power of two */
  /* The op holding its answer back, and when it ends, held_cb(ds). */
  disp_held held;
  uint32_t held_code;
  uint64_t held_req;
  tier_promo promo;
  tier_swap swap;
  void (*held_cb)(disp_sess *ds);
  void *owner;              /* the caller's */
};

/* Sets ds up for a new session (held_cb: see above). */
void disp_sess_init(disp_sess *ds, disp_env *env,
                    void (*held_cb)(disp_sess *ds), void *owner);
/* Frees every request of the session (its close).  A held op ends without
 * its request (its result: ECLOSED).  Idempotent. */
void disp_sess_free_requests(disp_sess *ds);
/* Frees what ds holds (after disp_sess_free_requests, nothing held). */
void disp_sess_destroy(disp_sess *ds);

/* disp_run's answers. */
#define DISP_DONE 0
#define DISP_HELD 1

/*
 * Runs ops[0..n) of one frame, in order, into res[0..n) (messages and
 * arrays in the arena).  An op the codec refused (KVS_OP_NONE) keeps the
 * result it came with.  batch: the ops are a batch's (no op may hold its
 * answer back; only the first KVS_BATCH_MESSAGES failures keep their
 * messages).  DISP_HELD: op 0 (alone) holds its answer back.
 */
int disp_run(disp_sess *ds, const kvs_op *ops, kvs_op_result *res,
             uint32_t n, int batch, kvs__arena *a);
/* The held op is over (held_cb ran): its result, built in the arena. */
void disp_held_result(disp_sess *ds, kvs_op_result *res, kvs__arena *a);
/* The copies in ds->copy_pairs are done (or abandoned): unpins them all. */
void disp_copies_done(disp_sess *ds);

#endif
