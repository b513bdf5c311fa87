/*
 * replay.h — `kvshared replay`: runs the core in-process over a request trace
 * (trace.h) and measures hit rates, allocations and evictions.
 *
 * The replay of one record, in timestamp order, one request at a time:
 *   core_req_create -> core_lookup_promote(prompt) -> core_allocate(prompt - hit)
 *   -> core_commit(hit .. prompt) -> [decode: per output token core_append(1)
 *   + core_commit(that token)] -> core_req_free.
 * Requests never overlap, so a request never hits blocks of a request still
 * running: the figures are those of a cache of that capacity, not of an
 * engine's batch.  A prompt that needs more blocks than the pool has is
 * refused: it counts as a miss (its tokens are in the denominator) and in
 * `refused`.  Decode is off by default: the traces give no output token ids,
 * so output tokens are unique per request and only take space (they are
 * sealed and cached, and can never be hit by a later prompt).
 */
#ifndef KVS_DAEMON_REPLAY_H
#define KVS_DAEMON_REPLAY_H

#include <stdint.h>

#include "daemon/core/core.h"
#include "daemon/trace.h"

/* `kvshared replay ...`: argv[0] is "replay".  Returns the exit status. */
int replay_main(int argc, char **argv);

typedef struct replay_config {
  uint64_t capacity_tokens; /* pool size in tokens; 0 = unlimited (a pool
                               that holds the whole trace, see
                               replay_plan) */
  uint32_t block_size;      /* tokens per block (default 16) */
  const char *policy;       /* eviction policy; NULL = the daemon's default
                               (slru) */
  int decode;               /* also append and commit output tokens */
  uint64_t tier_tokens[CORE_TIERS]; /* host and disk tiers below the pool,
                               in tokens (0: none); copies move at once
                               (core tier_sync), a lookup promotes what it
                               finds below */
  int progress;             /* progress bar on stderr */
} replay_config;

/* Defaults: unlimited, block size 16, default policy, no decode, no bar. */
void replay_config_init(replay_config *cfg);

/* What the trace needs, from its hash ids alone (no core). */
typedef struct replay_plan {
  uint64_t distinct_blocks;   /* distinct full prompt blocks of the trace */
  uint64_t unlimited_blocks;  /* a pool this big never evicts */
  uint64_t ideal_hit_tokens;  /* hits of an infinite prefix cache */
  uint64_t query_tokens;      /* prompt tokens of the trace */
} replay_plan;

/* Fills *plan.  KVS_ENOMEM. */
int replay_plan_make(const trace *t, const replay_config *cfg,
                     replay_plan *plan);

/* The pool size for cfg: capacity_tokens / block_size, or
 * plan->unlimited_blocks when capacity_tokens is 0.  KVS_EINVAL when it is 0
 * blocks or does not fit a block index. */
int replay_pool_blocks(const replay_config *cfg, const replay_plan *plan,
                       uint32_t *num_blocks);

/* A core for the replay (root hash of a made-up layout, no reserve), with
 * cfg's tiers (slots capped at what the trace can fill: plan may be NULL
 * for no cap). */
int replay_core_create(const replay_config *cfg, uint32_t num_blocks,
                       const replay_plan *plan, core **out);

typedef struct replay_result {
  uint64_t requests;        /* records replayed */
  uint64_t served;
  uint64_t refused;         /* prompt (or the pool) too small: all-miss */
  uint64_t refused_tokens;
  uint64_t query_tokens;    /* prompt tokens of all records */
  uint64_t hit_tokens;      /* prompt tokens found in the cache */
  uint64_t lookup_blocks;   /* full blocks a lookup may hit: (n - 1) / bs,
                               refused records included (all misses) */
  uint64_t hit_blocks;
  uint64_t tier_hit_tokens[CORE_TIERS]; /* of hit_tokens, those promoted
                               from the host and the disk tier */
  uint64_t decode_tokens;   /* output tokens appended (decode on) */
  uint64_t decode_truncated;/* requests whose decode ran out of blocks */
  uint64_t peak_resident;   /* most blocks in use + cached at one time */
  double seconds;           /* wall time of the run */
  core_stats stats;         /* the core's counters after the run */
  core_tier_stats tiers[CORE_TIERS];
} replay_result;

/* Token hit rate (hit / query tokens) and block hit rate (hit / lookup
 * blocks); 0 when there is nothing to divide. */
double replay_token_hit_rate(const replay_result *res);
double replay_block_hit_rate(const replay_result *res);

/*
 * Replays every record of t through c.  Returns 0, or the first unexpected
 * core error (the requests of the run are freed either way; c stays valid).
 */
int replay_run(core *c, const trace *t, const replay_config *cfg,
               replay_result *res);

/*
 * One replay of t on a fresh core for cfg (pool sized by replay_pool_blocks,
 * into *num_blocks), and the core's invariant checked after it.  Returns 0
 * or the first error, said on stderr.
 */
int replay_checked(const trace *t, const replay_config *cfg,
                   const replay_plan *plan, uint32_t *num_blocks,
                   replay_result *res);

/*
 * `--sweep`: replays t once per capacity (caps[k] tokens, 0 = unlimited) and
 * policy on a fresh core each (base gives the rest), checks the core after
 * each, prints the table of token hit rates and wall times (or JSON), and,
 * with plot != NULL, has gnuplot draw hit rate against capacity into that
 * PNG file.  Returns 0 or the first error (reported on stderr).
 */
int replay_sweep(const trace *t, const char *path, const replay_config *base,
                 const replay_plan *plan, const uint64_t *caps, size_t ncaps,
                 const char *const *pols, size_t npols, int json,
                 const char *plot);

#endif /* KVS_DAEMON_REPLAY_H */
