/*
 * replay.h — kvshare-replay: runs the core in-process over a request trace
 * (trace.h) and measures hit rates, allocations and evictions.
 *
 * The replay of one record, in timestamp order, one request at a time:
 *   core_req_create -> core_lookup_promote(prompt) -> [remote store:
 *   core_req_next_hashes, core_remote_promote(the run the store holds),
 *   core_promote_finish] -> core_allocate(prompt - hit)
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
#ifndef KVS_REPLAY_H
#define KVS_REPLAY_H

#include <stdint.h>

#include "daemon/core/core.h"
#include "tools/replay/trace.h"

/* The policy when none is given: the daemon's default (daemon/config.c). */
#define REPLAY_DEFAULT_POLICY "slru"

/* --tenants: as many as the daemon takes (CFG_MAX_TENANTS). */
#define REPLAY_MAX_TENANTS 16

struct json_t; /* jansson's */

/* kvshare-replay's command line (main.c; `kvshared replay ...` execs it).
 * argv[0] is not read: it may be a path to kvshare-replay or "replay", and
 * every message, getopt's included, names kvshare-replay.  Returns the exit
 * status: 0, 1 (the replay failed) or 2 (a bad command line). */
int replay_main(int argc, char **argv);

typedef struct replay_config {
  uint64_t capacity_tokens; /* pool size in tokens; 0 = unlimited (a pool
                               that holds the whole trace, see
                               replay_plan) */
  uint32_t block_size;      /* tokens per block (default 16) */
  /* The layout of a block (--layers, --kv-heads, --head-dim, --dtype):
   * what --capacity-bytes divides by (replay_bytes_tokens), and the root
   * hash's seed.  Default: a Llama-3-8B-like model, 32 layers, 8 kv heads,
   * head dim 128, fp16. */
  uint32_t num_layers;
  uint32_t num_kv_heads;
  uint32_t head_dim;
  uint32_t dtype;           /* kvs_dtype */
  uint64_t capacity_bytes;  /* the --capacity-bytes that capacity_tokens
                               was derived from; 0: given in tokens */
  const char *policy;       /* eviction policy; NULL = the daemon's default
                               (slru) */
  int decode;               /* also append and commit output tokens */
  uint64_t tier_tokens[CORE_TIERS]; /* host and disk tiers below the pool,
                               in tokens (0: none); copies move at once
                               (core tier_sync), a lookup promotes what it
                               finds below */
  int progress;             /* progress bar on stderr */
  /* Tenants (replay_tenants.c): the pool and the tiers split into
   * partitions, a core each.  On when tenants > 1 or a share is given. */
  uint32_t tenants;         /* 1 .. REPLAY_MAX_TENANTS (default 1) */
  uint32_t tenant_depth;    /* a user: the records with the same hash id at
                               this depth; 0: auto (replay_tenant_depth) */
  double tenant_share[REPLAY_MAX_TENANTS]; /* percent of the pool and of
                               each tier, 0 < P <= 100, from tenant 0 on;
                               0: an equal part of what the shares leave */
} replay_config;

/* Defaults: unlimited, block size 16, the layout above, default policy,
 * no decode, no bar, one tenant. */
void replay_config_init(replay_config *cfg);

/* The layout of one block of cfg, of num_blocks blocks (>= 1), its
 * block_stride filled in by kvs_layout_finish.  KVS_EINVAL when that
 * refuses it. */
int replay_layout(const replay_config *cfg, uint32_t num_blocks,
                  kvs_layout *out);

/* The pool `bytes` of cfg's layout hold: floor(bytes / block_stride)
 * blocks (*blocks, may be NULL) of block_size tokens (*tokens).
 * KVS_EINVAL when the layout is refused or not one block fits. */
int replay_bytes_tokens(const replay_config *cfg, uint64_t bytes,
                        uint64_t *blocks, uint64_t *tokens);

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

/* The same for the records i of t with route[i] == part only (route NULL:
 * all): what that part replayed alone needs.  KVS_ENOMEM. */
int replay_plan_part(const trace *t, const replay_config *cfg,
                     const uint32_t *route, uint32_t part, replay_plan *plan);

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
  uint64_t remote_hit_tokens; /* of hit_tokens, those promoted from the
                               remote store (replay_runner_create) */
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

/* Token hit rate of a part of hit_tokens (parts / query tokens). */
double replay_share(const replay_result *res, uint64_t tokens);

/* Adds a's counts into sum (the nodes' total; stats, tiers and peak
 * summed, seconds the largest). */
void replay_result_add(replay_result *sum, const replay_result *a);

/*
 * ---- The remote store (replay_nodes.c) --------------------------------
 *
 * The model of a remote tier shared by several daemons: a set of block
 * hashes with room for `blocks`, least recently used dropped at capacity.
 * A write and a hit make a hash the most recent.  Every operation is O(1).
 */
typedef struct replay_store replay_store;

typedef struct replay_store_stats {
  uint64_t slots;      /* capacity in blocks */
  uint64_t used;       /* hashes held now */
  uint64_t writes;     /* replay_store_put calls (write-through) */
  uint64_t inserts;    /* of writes, hashes not held already */
  uint64_t drops;      /* hashes dropped to make room */
  uint64_t hit_blocks; /* hashes touched by replay_store_touch */
} replay_store_stats;

/* A store of `blocks` hashes (>= 1).  KVS_EINVAL, KVS_ENOMEM. */
int replay_store_create(uint64_t blocks, replay_store **out);
void replay_store_destroy(replay_store *s); /* NULL is fine */
/* h written: held, most recent (the least recent dropped for room). */
void replay_store_put(replay_store *s, kvs_hash128 h);
/* How many of h[0..n) are held, from h[0] on (the run a lookup finds). */
uint32_t replay_store_run(const replay_store *s, const kvs_hash128 *h,
                          uint32_t n);
/* h[0..n) (all held) read: each the most recent, in that order. */
void replay_store_touch(replay_store *s, const kvs_hash128 *h, uint32_t n);
void replay_store_get_stats(const replay_store *s, replay_store_stats *st);

/*
 * ---- Record by record ---------------------------------------------------
 *
 * replay_run is a loop of replay_runner_step over every record; the nodes
 * mode (replay_nodes) steps several cores through one trace, each through
 * its own records.  With a remote store, every block the core seals (a
 * `sealed` observer) is written to it, and after a record's lookup (and
 * its promotions from the host and disk tiers) the rest of its chain is
 * looked for there: the longest run found is promoted
 * (core_remote_promote, then core_promote_finish, every copy good) and
 * counted in remote_hit_tokens.
 */
typedef struct replay_runner replay_runner;

/* A runner of c over t's records: those with route[i] == node (route NULL:
 * all).  An offline policy's next uses are those of these records.  remote
 * may be NULL (none).  KVS_ENOMEM, KVS_ELIMIT (the core's observers). */
int replay_runner_create(core *c, const trace *t, const replay_config *cfg,
                         const uint32_t *route, uint32_t node,
                         replay_store *remote, replay_runner **out);
/* Replays record i (one of the runner's, in increasing order) into *res.
 * Returns 0 or an unexpected core error. */
int replay_runner_step(replay_runner *x, size_t i, replay_result *res);
/* The run is over: res gets its wall time and the core's counters; the
 * runner is freed (NULL is fine) and its observer removed. */
void replay_runner_finish(replay_runner *x, replay_result *res);
/* Frees n runners and their cores (either array may be NULL, any entry
 * NULL), and the two arrays: the end of a run over several cores. */
void replay_runners_free(core **cores, replay_runner **runners, uint32_t n);

/* Shared by replay*.c: a monotonic clock in seconds, and the progress bar
 * on stderr. */
double replay_now(void);
void replay_progress(size_t done, size_t total, double t0);

/*
 * Replays every record of t through c.  Returns 0, or the first unexpected
 * core error (the requests of the run are freed either way; c stays valid).
 */
int replay_run(core *c, const trace *t, const replay_config *cfg,
               replay_result *res);

/*
 * One replay of t on a fresh core for cfg (pool sized by replay_pool_blocks,
 * into *num_blocks), and the core's invariant checked after it; with
 * tenants (replay_tenant_mode), replay_tenants_run: res the total,
 * *num_blocks the tenants' pools together.  Returns 0 or the first error,
 * said on stderr.
 */
int replay_checked(const trace *t, const replay_config *cfg,
                   const replay_plan *plan, uint32_t *num_blocks,
                   replay_result *res);

/* The report of one replay (totals, with tenants), on stdout: text, or
 * the JSON object (NULL when out of memory; the caller owns it). */
void replay_print_text(const char *path, const trace *t,
                       const replay_config *cfg, uint32_t num_blocks,
                       const replay_plan *plan, const replay_result *res);
struct json_t *replay_json(const char *path, const trace *t,
                           const replay_config *cfg, uint32_t num_blocks,
                           const replay_plan *plan, const replay_result *res);

/* Adds cfg's layout to o: "dtype", "num_layers", "num_kv_heads",
 * "head_dim" and "block_stride".  0, or -1 when out of memory.
 * replay_json adds it, and "capacity_bytes" (0: the capacity was given in
 * tokens) and "capacity_blocks" (capacity_tokens / block_size; 0:
 * unlimited). */
int replay_json_layout(struct json_t *o, const replay_config *cfg);

/*
 * `--sweep`: replays t once per capacity (caps[k] tokens, 0 = unlimited;
 * derived from cap_bytes[k] bytes of base's layout when that is not 0, and
 * the table and JSON say so; cap_bytes may be NULL: none) and
 * policy on a fresh core each (base gives the rest), checks the core after
 * each, prints the table of token hit rates and wall times (or JSON), and,
 * with plot != NULL, has gnuplot draw hit rate against capacity into that
 * PNG file (the trace's ideal as a line; the gnuplot script, its data
 * inline, is kept in plot_script when that is not NULL).  Returns 0 or the
 * first error (reported on stderr).
 */
int replay_sweep(const trace *t, const char *path, const replay_config *base,
                 const replay_plan *plan, const uint64_t *caps,
                 const uint64_t *cap_bytes, size_t ncaps,
                 const char *const *pols, size_t npols, int json,
                 const char *plot, const char *plot_script);

/*
 * ---- N nodes sharing one remote store (replay_nodes.c) ------------------
 *
 * `--nodes N --remote-tier-tokens R`: N cores (each with cfg's pool and
 * tiers) replay the records routed to each, all in timestamp order, one
 * at a time; a store of R tokens (replay_store) is shared by all of them.
 * Each run is made twice: without the store (the baseline: each node
 * alone) and with it.
 */
typedef enum replay_split_kind {
  REPLAY_SPLIT_RR = 0,  /* record i -> node i % N: no affinity */
  REPLAY_SPLIT_PREFIX,  /* by a hash of the record's first prefix_blocks
                           hash ids (chained: its id at that depth) */
} replay_split_kind;

typedef struct replay_nodes_config {
  uint32_t nodes;          /* >= 1 */
  replay_split_kind split;
  uint32_t prefix_blocks;  /* REPLAY_SPLIT_PREFIX: depth (default 1) */
  uint64_t remote_tokens;  /* store size; 0: none, UINT64_MAX: unlimited
                              (what the trace can fill) */
} replay_nodes_config;

/* The node of each record of t (out: t->num_recs entries). */
void replay_route(const trace *t, const replay_nodes_config *nc,
                  uint32_t *out);

/* Runs the baseline and the run with the store, checks every core, prints
 * the per-node and total figures (text, or JSON).  Returns 0 or the first
 * error (said on stderr). */
int replay_nodes(const trace *t, const char *path, const replay_config *cfg,
                 const replay_plan *plan, const replay_nodes_config *nc,
                 int json);

/*
 * ---- Tenants (replay_tenants.c) -----------------------------------------
 *
 * `--tenants N`: the daemon's tenants.  Each has a partition of its own:
 * pool memory, core (prefix index, free queue, eviction) and tiers, and
 * its prefixes are salted by the tenant, so it never hits another's
 * blocks.  Here each tenant is a core of its share of the pool and of each
 * tier (replay_tenant_blocks) and replays the records of its users, all in
 * timestamp order, one at a time.  The traces have no user id: a user is a
 * conversation, the records with the same hash id at the key depth (ids
 * are chained: the same first blocks), and its tenant is mix(that id) mod N
 * (splitmix64's finalizer: replay_route's --split prefix:depth).
 */
static inline int replay_tenant_mode(const replay_config *cfg) {
  return cfg->tenants > 1 || cfg->tenant_share[0] > 0;
}

/* The key depth over t's records: cfg->tenant_depth, or (0, auto) one more
 * than the blocks every record shares (the conversation trace opens every
 * request with the same block, a system prompt: 2 there; the synthetic
 * trace 1).  A record with fewer blocks is keyed by its last id. */
uint32_t replay_tenant_depth(const trace *t, const replay_config *cfg);

/* The tenant of each record of t (out: t->num_recs entries). */
void replay_tenant_route(const trace *t, const replay_config *cfg,
                         uint32_t *out);

/* `blocks` split among cfg's tenants as the daemon splits its pool
 * (cfg_tenant_blocks): a share of P% gets P/100 of them rounded down, the
 * tenants without a share split what is left equally and the remainder of
 * that division stays unused.  out: cfg->tenants entries. */
void replay_tenant_blocks(const replay_config *cfg, uint64_t blocks,
                          uint64_t *out);

typedef struct replay_tenant {
  uint32_t num_blocks;  /* its pool: its share, or at unlimited capacity
                           what its own records fill (at least 1) */
  uint64_t tier_tokens[CORE_TIERS]; /* its share of each tier */
  replay_plan plan;     /* of its records (replay_plan_part) */
  replay_result res;
} replay_tenant;

/* Replays t over cfg's tenants (plan: t's): tn[0 .. cfg->tenants) gets
 * each one's pool, plan and result, *total their sum (replay_result_add);
 * every core is checked after the run.  Returns 0 or the first error, said
 * on stderr (KVS_EINVAL: the pool is not 1 .. 2^32-2 blocks, or a tenant's
 * share of it is 0 blocks). */
int replay_tenants_run(const trace *t, const replay_config *cfg,
                       const replay_plan *plan, replay_tenant *tn,
                       replay_result *total);

/* The run, then its report: the totals as replay_print_text and
 * replay_json give them, and each tenant's pool and hit rates (text: a
 * table; JSON: "tenants", an array).  Returns 0 or the first error (said
 * on stderr). */
int replay_tenants(const trace *t, const char *path, const replay_config *cfg,
                   const replay_plan *plan, int json);

#endif /* KVS_REPLAY_H */
