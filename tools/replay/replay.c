/*
 * replay.c — kvshare-replay: the core over a Mooncake-format trace.
 * See replay.h for what one record does.
 */
#include "tools/replay/replay.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* --nodes: each node is a whole core. */
#define REPLAY_MAX_NODES 1024

void replay_config_init(replay_config *cfg) {
  memset(cfg, 0, sizeof(*cfg));
  cfg->block_size = 16;
  cfg->num_layers = 32;
  cfg->num_kv_heads = 8;
  cfg->head_dim = 128;
  cfg->dtype = KVS_DTYPE_FP16;
  cfg->tenants = 1;
}

int replay_layout(const replay_config *cfg, uint32_t num_blocks,
                  kvs_layout *out) {
  kvs_layout l = {.block_size = cfg->block_size,
                  .num_layers = cfg->num_layers,
                  .num_kv_heads = cfg->num_kv_heads,
                  .head_dim = cfg->head_dim,
                  .dtype = cfg->dtype,
                  .num_blocks = num_blocks};
  if (kvs_layout_finish(&l) != 0)
    return KVS_EINVAL;
  *out = l;
  return 0;
}

int replay_bytes_tokens(const replay_config *cfg, uint64_t bytes,
                        uint64_t *blocks, uint64_t *tokens) {
  kvs_layout l;
  uint64_t nb;
  if (replay_layout(cfg, 1, &l) != 0)
    return KVS_EINVAL;
  nb = bytes / l.block_stride;
  if (nb == 0)
    return KVS_EINVAL;
  if (blocks != NULL)
    *blocks = nb;
  *tokens = nb * cfg->block_size;
  return 0;
}

static uint64_t replay_div_up(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

/*
 * Full blocks of a prompt of n tokens whose last token lies in trace block k
 * (tokens [512k, 512(k+1))).  Because ids are chained, (id, position of the
 * block's last token) names the whole prefix of a block, so per id the blocks
 * ending inside it form a prefix of a fixed list, and a record covers the
 * first replay_ends_in() of them.
 */
static uint32_t replay_ends_in(uint64_t n, uint32_t k, uint32_t bs) {
  uint64_t lo = (uint64_t)k * TRACE_BLOCK_TOKENS;
  uint64_t hi = lo + TRACE_BLOCK_TOKENS < n ? lo + TRACE_BLOCK_TOKENS : n;
  if (hi <= lo)
    return 0;
  return (uint32_t)(hi / bs - lo / bs);
}

int replay_plan_make(const trace *t, const replay_config *cfg,
                     replay_plan *plan) {
  return replay_plan_part(t, cfg, NULL, 0, plan);
}

int replay_plan_part(const trace *t, const replay_config *cfg,
                     const uint32_t *route, uint32_t part, replay_plan *plan) {
  uint32_t bs = cfg->block_size;
  /* seen[id] = blocks ending in trace block `id` already sealed. */
  uint32_t *seen = calloc((size_t)t->max_hash_id + 1, sizeof(*seen));
  uint64_t max_req_blocks = 0, decode_sealed = 0;

  if (seen == NULL)
    return KVS_ENOMEM;
  memset(plan, 0, sizeof(*plan));
  for (size_t i = 0; i < t->num_recs; i++) {
    const trace_rec *r = &t->recs[i];
    const uint32_t *ids = trace_rec_hash_ids(t, r);
    uint64_t n = r->input_length;
    if (route != NULL && route[i] != part)
      continue;
    /* A lookup may hit blocks ending before the last token: the first
     * (n - 1) / bs blocks, i.e. the full blocks of a prompt of n - 1. */
    int hitting = 1;
    for (uint32_t k = 0; k < r->num_hash_ids; k++) {
      uint32_t avail = replay_ends_in(n - 1, k, bs);
      if (hitting) {
        uint32_t got = seen[ids[k]] < avail ? seen[ids[k]] : avail;
        plan->ideal_hit_tokens += (uint64_t)got * bs;
        if (got < avail)
          hitting = 0;
      }
    }
    for (uint32_t k = 0; k < r->num_hash_ids; k++) {
      uint32_t full = replay_ends_in(n, k, bs);
      if (full > seen[ids[k]])
        seen[ids[k]] = full;
    }
    plan->query_tokens += n;
    uint64_t blocks = replay_div_up(n, bs);
    if (cfg->decode) {
      uint64_t total = n + r->output_length;
      blocks = replay_div_up(total, bs);
      decode_sealed += total / bs - n / bs;
    }
    if (blocks > max_req_blocks)
      max_req_blocks = blocks;
  }
  for (uint64_t id = 0; id <= t->max_hash_id; id++)
    plan->distinct_blocks += seen[id];
  /* Resident at any time: every sealed block (cached) plus the running
   * request's blocks. */
  plan->unlimited_blocks = plan->distinct_blocks + decode_sealed + max_req_blocks;
  free(seen);
  return 0;
}

int replay_pool_blocks(const replay_config *cfg, const replay_plan *plan,
                       uint32_t *num_blocks) {
  uint64_t nb;
  if (cfg->block_size == 0)
    return KVS_EINVAL;
  nb = cfg->capacity_tokens ? cfg->capacity_tokens / cfg->block_size
                            : plan->unlimited_blocks;
  if (nb == 0 || nb >= KVS_BLOCK_NONE)
    return KVS_EINVAL;
  *num_blocks = (uint32_t)nb;
  return 0;
}

int replay_core_create(const replay_config *cfg, uint32_t num_blocks,
                       const replay_plan *plan, core **out) {
  /* The replay has no memory behind its blocks; the layout only seeds the
   * root hash. */
  kvs_layout layout;
  core_config cc;
  if (replay_layout(cfg, num_blocks, &layout) != 0)
    return KVS_EINVAL;
  core_config_init(&cc);
  cc.num_blocks = num_blocks;
  cc.block_size = cfg->block_size;
  cc.reserve_blocks = 0;
  cc.root = core_root_hash(&layout, "kvshared-replay");
  cc.policy = cfg->policy != NULL ? cfg->policy : REPLAY_DEFAULT_POLICY;
  for (int t = 0; t < CORE_TIERS; t++) {
    uint64_t slots = cfg->tier_tokens[t] / cfg->block_size;
    /* More slots than the trace has blocks would never fill. */
    if (plan != NULL && slots > plan->unlimited_blocks)
      slots = plan->unlimited_blocks;
    if (slots >= KVS_BLOCK_NONE / 2)
      return KVS_EINVAL;
    cc.tier_slots[t] = (uint32_t)slots;
  }
  cc.tier_sync = 1;
  cc.allow_offline = 1;
  /* The trace's token ids are made from its hash ids, so a hash hit is
   * always the same tokens: no need to keep them (4 x block_size bytes per
   * block, most of the replayer's memory). */
  cc.verify_tokens = 0;
  return core_create(&cc, out);
}

double replay_token_hit_rate(const replay_result *res) {
  return res->query_tokens ? (double)res->hit_tokens / (double)res->query_tokens
                           : 0.0;
}

double replay_block_hit_rate(const replay_result *res) {
  return res->lookup_blocks
             ? (double)res->hit_blocks / (double)res->lookup_blocks
             : 0.0;
}

double replay_share(const replay_result *res, uint64_t tokens) {
  return res->query_tokens ? (double)tokens / (double)res->query_tokens : 0.0;
}

void replay_result_add(replay_result *sum, const replay_result *a) {
  sum->requests += a->requests;
  sum->served += a->served;
  sum->refused += a->refused;
  sum->refused_tokens += a->refused_tokens;
  sum->query_tokens += a->query_tokens;
  sum->hit_tokens += a->hit_tokens;
  sum->lookup_blocks += a->lookup_blocks;
  sum->hit_blocks += a->hit_blocks;
  for (int k = 0; k < CORE_TIERS; k++) {
    sum->tier_hit_tokens[k] += a->tier_hit_tokens[k];
    sum->tiers[k].slots += a->tiers[k].slots;
    sum->tiers[k].used += a->tiers[k].used;
    sum->tiers[k].demotions += a->tiers[k].demotions;
    sum->tiers[k].promotions += a->tiers[k].promotions;
    sum->tiers[k].hit_blocks += a->tiers[k].hit_blocks;
    sum->tiers[k].drops += a->tiers[k].drops;
    sum->tiers[k].failures += a->tiers[k].failures;
  }
  sum->remote_hit_tokens += a->remote_hit_tokens;
  sum->decode_tokens += a->decode_tokens;
  sum->decode_truncated += a->decode_truncated;
  sum->peak_resident += a->peak_resident;
  if (a->seconds > sum->seconds)
    sum->seconds = a->seconds;
  sum->stats.num_blocks += a->stats.num_blocks;
  sum->stats.allocated_blocks += a->stats.allocated_blocks;
  sum->stats.evictions += a->stats.evictions;
  sum->stats.sealed_blocks += a->stats.sealed_blocks;
  sum->stats.duplicate_blocks += a->stats.duplicate_blocks;
  sum->stats.tier_lost += a->stats.tier_lost;
}

double replay_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void replay_progress(size_t done, size_t total, double t0) {
  enum { WIDTH = 40 };
  char bar[WIDTH + 1];
  size_t fill = total ? done * WIDTH / total : WIDTH;
  memset(bar, '#', fill);
  memset(bar + fill, '.', WIDTH - fill);
  bar[WIDTH] = '\0';
  fprintf(stderr, "\rreplay [%s] %3zu%% %zu/%zu requests %.1fs", bar,
          total ? done * 100 / total : 100, done, total, replay_now() - t0);
  if (done == total)
    fputc('\n', stderr);
  fflush(stderr);
}

/* Output token i of request number req: unique to the request (a replay never
 * hits a decoded block; the traces have no output ids). */
static uint32_t replay_decode_token(uint64_t req, uint32_t i) {
  uint64_t x = (req << 32 | i) ^ 0xd1b54a32d192ed03ull;
  x = (x ^ (x >> 31)) * 0x7fb5d329728ea185ull;
  x = (x ^ (x >> 27)) * 0x81dadef4bc2dd44dull;
  return (uint32_t)((x ^ (x >> 33)) >> 16);
}

static void replay_sample(core *c, replay_result *res) {
  core_stats st;
  core_get_stats(c, &st);
  uint64_t resident = (uint64_t)st.used_blocks + st.cached_blocks;
  if (resident > res->peak_resident)
    res->peak_resident = resident;
}

/*
 * For an offline policy: when each full prompt block of each record is next
 * used, as a record number (UINT32_MAX: never), record by record from
 * *out[0].  A 16-token block is named by the trace block its last token lies
 * in and its place among the blocks ending there (see replay_ends_in), which
 * is what its chained hash stands for.  With route, only the records i with
 * route[i] == node count (their uses, and their place in *out).
 */
static int replay_next_uses(const trace *t, uint32_t bs, const uint32_t *route,
                            uint32_t node, uint32_t **out) {
  const uint64_t stride = TRACE_BLOCK_TOKENS / bs + 2;
  uint64_t total = 0, nkeys = ((uint64_t)t->max_hash_id + 1) * stride;
  uint32_t *next, *last;

  for (size_t i = 0; i < t->num_recs; i++)
    if (route == NULL || route[i] == node)
      total += t->recs[i].input_length / bs;
  next = malloc((total ? total : 1) * sizeof(*next));
  last = malloc(nkeys * sizeof(*last));
  if (next == NULL || last == NULL || t->num_recs >= UINT32_MAX) {
    free(next);
    free(last);
    return KVS_ENOMEM;
  }
  memset(last, 0xff, nkeys * sizeof(*last));
  for (size_t i = t->num_recs; i-- > 0;) {
    const trace_rec *r = &t->recs[i];
    const uint32_t *ids = trace_rec_hash_ids(t, r);
    uint32_t full = r->input_length / bs;
    if (route != NULL && route[i] != node)
      continue;
    total -= full;
    for (uint32_t j = 0; j < full; j++) {
      uint64_t k = ((uint64_t)(j + 1) * bs - 1) / TRACE_BLOCK_TOKENS;
      uint64_t key = ids[k] * stride + (j - k * TRACE_BLOCK_TOKENS / bs);
      next[total + j] = last[key];
      last[key] = (uint32_t)i;
    }
  }
  free(last);
  *out = next;
  return 0;
}

struct replay_runner {
  core *c;
  const trace *t;
  const replay_config *cfg;
  replay_store *remote;  /* NULL: none */
  uint32_t num_blocks;
  uint32_t *tokens;      /* a prompt's token ids */
  core_promo *promos;    /* room for a prompt's blocks */
  int *ok;               /* all 1: the replay's copies never fail */
  kvs_hash128 *hashes;   /* the chain a lookup asks the store for */
  uint32_t *next;        /* offline policy: next uses (replay_next_uses) */
  uint64_t next_off;     /* where the next record's uses begin in next */
  double t0;
};

/* The `sealed` observer: write-through of every block a commit seals. */
static void replay_sealed(void *arg, kvs_hash128 h, uint32_t b,
                          uint32_t pos) {
  (void)b;
  (void)pos;
  replay_store_put(arg, h);
}

/* The store is asked about REPLAY_REMOTE_CHUNK blocks at a time, and what
 * it holds is promoted before the next are hashed: the run found is the
 * same as with one question for the whole chain (the daemon's), without
 * hashing the rest of every prompt the store does not hold. */
#define REPLAY_REMOTE_CHUNK 64u

/* After the lookup (hit tokens so far in *hit): the rest of the chain from
 * the remote store; *read = the tokens read from it.  Returns 0 or an
 * unexpected core error. */
static int replay_remote(replay_runner *x, core_req *q, uint32_t *hit,
                         uint32_t *read) {
  uint32_t bs = x->cfg->block_size, nh, run, np, taken;
  int rc;

  do {
    nh = core_req_next_hashes(x->c, q, x->hashes, REPLAY_REMOTE_CHUNK);
    run = replay_store_run(x->remote, x->hashes, nh);
    if (run == 0)
      return 0;
    rc = core_remote_promote(x->c, q, x->hashes, run, x->promos, &np, &taken);
    if (rc != 0)
      return rc;
    /* Taken as device hits (indexed meanwhile: no store read) or read. */
    replay_store_touch(x->remote, x->hashes, taken);
    if (np > 0)
      *hit = core_promote_finish(x->c, q, x->promos, np, x->ok);
    else
      *hit += taken * bs;
    *read += np * bs;
  } while (taken == REPLAY_REMOTE_CHUNK);
  return 0;
}

/* One record.  Returns 0 or an unexpected core error. */
static int replay_one(replay_runner *x, size_t index, replay_result *res) {
  core *c = x->c;
  const replay_config *cfg = x->cfg;
  const trace_rec *r = &x->t->recs[index];
  const uint32_t *next = x->next != NULL ? x->next + x->next_off : NULL;
  uint32_t bs = cfg->block_size, n = r->input_length, hit = 0, remote = 0;
  core_lookup_out lo;
  core_req *q = NULL;
  core_cow cow;
  int rc;

  res->requests++;
  res->query_tokens += n;
  res->lookup_blocks += (n - 1) / bs; /* a refused request misses them all */
  if (replay_div_up(n, bs) > x->num_blocks) {
    res->refused++;
    res->refused_tokens += n;
    return 0;
  }
  trace_rec_tokens(x->t, r, x->tokens);
  rc = core_req_create(c, NULL, 0, &q);
  if (rc != 0)
    return rc;
  /* Lower tiers move their bytes at once here: a promotion succeeds. */
  rc = core_lookup_promote(c, q, x->tokens, n, 1, x->promos, n / bs + 1, &lo);
  if (rc != 0)
    goto out;
  hit = core_promote_finish(c, q, x->promos, lo.npromos, x->ok);
  if (x->remote != NULL && (rc = replay_remote(x, q, &hit, &remote)) != 0)
    goto out;
  rc = core_allocate(c, q, n - hit, &cow);
  if (rc == KVS_ENOSPC) {
    /* Only reachable when blocks are pinned elsewhere; counted as refused. */
    res->refused++;
    res->refused_tokens += n;
    rc = 0;
    goto out;
  }
  if (rc != 0)
    goto out;
  rc = core_commit(c, q, hit, NULL, n - hit, NULL);
  if (rc != 0)
    goto out;
  if (next != NULL) {
    uint32_t nb, full = n / bs;
    const uint32_t *blocks = core_req_blocks(q, &nb);
    for (uint32_t j = 0; j < full && j < nb; j++)
      core_policy_hint(c, blocks[j], next[j]);
  }
  res->served++;
  res->hit_tokens += hit;
  res->hit_blocks += hit / bs;
  for (int k = 0; k < CORE_TIERS; k++)
    res->tier_hit_tokens[k] += (uint64_t)lo.tier_blocks[k] * bs;
  res->remote_hit_tokens += remote;
  replay_sample(c, res);
  if (cfg->decode) {
    for (uint32_t i = 0; i < r->output_length; i++) {
      uint32_t tok = replay_decode_token(index, i);
      rc = core_append(c, q, 1, &cow);
      if (rc == KVS_ENOSPC) {
        res->decode_truncated++;
        rc = 0;
        break;
      }
      if (rc != 0)
        goto out;
      rc = core_commit(c, q, n + i, &tok, 1, NULL);
      if (rc != 0)
        goto out;
      res->decode_tokens++;
    }
    replay_sample(c, res);
  }
out:
  core_req_free(c, q);
  return rc;
}

static void replay_runner_free(replay_runner *x) {
  if (x == NULL)
    return;
  if (x->remote != NULL)
    core_remove_observer(x->c, x->remote);
  free(x->tokens);
  free(x->promos);
  free(x->ok);
  free(x->hashes);
  free(x->next);
  free(x);
}

int replay_runner_create(core *c, const trace *t, const replay_config *cfg,
                         const uint32_t *route, uint32_t node,
                         replay_store *remote, replay_runner **out) {
  size_t maxb = (size_t)t->max_input_length / cfg->block_size + 1;
  replay_runner *x = calloc(1, sizeof(*x));
  core_stats st;
  int rc = KVS_ENOMEM;

  *out = NULL;
  if (x == NULL)
    return KVS_ENOMEM;
  x->c = c;
  x->t = t;
  x->cfg = cfg;
  core_get_stats(c, &st);
  x->num_blocks = st.num_blocks;
  x->t0 = replay_now();
  x->tokens = malloc((size_t)t->max_input_length * sizeof(*x->tokens));
  x->promos = malloc(maxb * sizeof(*x->promos));
  x->ok = malloc(maxb * sizeof(*x->ok));
  x->hashes = malloc(maxb * sizeof(*x->hashes));
  if (x->tokens == NULL || x->promos == NULL || x->ok == NULL ||
      x->hashes == NULL)
    goto fail;
  for (size_t i = 0; i < maxb; i++)
    x->ok[i] = 1;
  if (core_policy_offline(c) &&
      (rc = replay_next_uses(t, cfg->block_size, route, node, &x->next)) != 0)
    goto fail;
  if (remote != NULL) {
    core_observer obs = {.sealed = replay_sealed, .arg = remote};
    if ((rc = core_add_observer(c, &obs)) != 0)
      goto fail;
    x->remote = remote;
  }
  *out = x;
  return 0;
fail:
  replay_runner_free(x);
  return rc;
}

int replay_runner_step(replay_runner *x, size_t i, replay_result *res) {
  int rc = replay_one(x, i, res);
  x->next_off += x->t->recs[i].input_length / x->cfg->block_size;
  return rc;
}

void replay_runner_finish(replay_runner *x, replay_result *res) {
  if (x == NULL)
    return;
  res->seconds = replay_now() - x->t0;
  core_get_stats(x->c, &res->stats);
  core_tier_get_stats(x->c, res->tiers);
  replay_runner_free(x);
}

void replay_runners_free(core **cores, replay_runner **runners, uint32_t n) {
  for (uint32_t k = 0; cores != NULL && k < n; k++) {
    if (runners != NULL && runners[k] != NULL) {
      replay_result scratch;
      replay_runner_finish(runners[k], &scratch);
    }
    if (cores[k] != NULL)
      core_destroy(cores[k]);
  }
  free(runners);
  free(cores);
}

int replay_run(core *c, const trace *t, const replay_config *cfg,
               replay_result *res) {
  size_t step = t->num_recs / 200 + 1;
  replay_runner *x;
  int rc;

  memset(res, 0, sizeof(*res));
  if ((rc = replay_runner_create(c, t, cfg, NULL, 0, NULL, &x)) != 0)
    return rc;
  for (size_t i = 0; i < t->num_recs && rc == 0; i++) {
    rc = replay_runner_step(x, i, res);
    if (cfg->progress && (i % step == 0 || i + 1 == t->num_recs))
      replay_progress(i + 1, t->num_recs, x->t0);
  }
  replay_runner_finish(x, res);
  return rc;
}

int replay_checked(const trace *t, const replay_config *cfg,
                   const replay_plan *plan, uint32_t *num_blocks,
                   replay_result *res) {
  const char *pol = cfg->policy != NULL ? cfg->policy : REPLAY_DEFAULT_POLICY;
  core *c = NULL;
  char msg[256];
  int rc;

  if (replay_tenant_mode(cfg)) {
    replay_tenant *tn = calloc(cfg->tenants, sizeof(*tn));
    if (tn == NULL) {
      fprintf(stderr, "kvshare-replay: %s\n", kvs_strerror(KVS_ENOMEM));
      return KVS_ENOMEM;
    }
    rc = replay_tenants_run(t, cfg, plan, tn, res);
    *num_blocks = 0;
    for (uint32_t k = 0; k < cfg->tenants; k++)
      *num_blocks += tn[k].num_blocks;
    free(tn);
    return rc;
  }
  if (replay_pool_blocks(cfg, plan, num_blocks) != 0) {
    fprintf(stderr,
            "kvshare-replay: a pool of %" PRIu64
            " tokens is not 1 .. 2^32-2 blocks of %u tokens\n",
            cfg->capacity_tokens ? cfg->capacity_tokens : plan->unlimited_blocks,
            cfg->block_size);
    return KVS_EINVAL;
  }
  rc = replay_core_create(cfg, *num_blocks, plan, &c);
  if (rc != 0) {
    fprintf(stderr, "kvshare-replay: cannot create the core (%u blocks, "
            "policy '%s'): %s\n", *num_blocks, pol, kvs_strerror(rc));
    return rc;
  }
  rc = replay_run(c, t, cfg, res);
  if (rc != 0) {
    fprintf(stderr, "kvshare-replay: core error (policy '%s'): %s\n", pol,
            kvs_strerror(rc));
  } else if (core_check(c, msg, sizeof(msg)) != 0) {
    fprintf(stderr, "kvshare-replay: core invariant broken (policy '%s'): "
            "%s\n", pol, msg);
    rc = KVS_EINTERNAL;
  }
  core_destroy(c);
  return rc;
}

/* ---- command line ---- */

static void replay_usage(FILE *f) {
  fprintf(f,
          "usage: kvshare-replay [--trace] FILE [--capacity-tokens N|unlimited]\n"
          "                      [--capacity-bytes SIZE] [--dtype fp16]\n"
          "                      [--layers 32] [--kv-heads 8] [--head-dim 128]\n"
          "                      [--block-size 16] [--policy NAME[,NAME...]]\n"
          "                      [--sweep N,N,...] [--plot FILE.png] [--decode]\n"
          "                      [--plot-script FILE.gp]\n"
          "                      [--host-tier-tokens N] [--disk-tier-tokens N]\n"
          "                      [--limit N] [--skip N] [--json] [--progress|--no-progress]\n"
          "                      [--nodes N] [--remote-tier-tokens N|unlimited]\n"
          "                      [--split rr|prefix|prefix:K]\n"
          "                      [--tenants N] [--tenant-shares P,P,...]\n"
          "                      [--tenant-key auto|K]\n"
          "\n"
          "Replays a Mooncake-format request trace through the block-manager core,\n"
          "one request at a time in timestamp order, and prints token and block\n"
          "hit rates, allocations and evictions.\n"
          "\n"
          "  --trace FILE            JSON-lines trace (timestamp, input_length,\n"
          "                          output_length, hash_ids of 512-token blocks);\n"
          "                          or FILE alone, as the one argument\n"
          "  --capacity-tokens N     pool size in tokens (1e6 notation accepted);\n"
          "                          'unlimited' (default) sizes the pool to hold\n"
          "                          the whole trace without eviction\n"
          "  --capacity-bytes SIZE   pool size in bytes of the layout below (K, M,\n"
          "                          G, T: powers of 1024): floor(SIZE / block\n"
          "                          stride) blocks, the stride as the daemon's\n"
          "                          (shm/kvs_layout.h: int8/fp8 blocks carry\n"
          "                          their scales, rounded up to 4096 bytes);\n"
          "                          not with --capacity-tokens\n"
          "  --layers N, --kv-heads N, --head-dim N, --dtype fp32|fp16|bf16|int8|fp8\n"
          "                          the layout of a block (default 32, 8, 128,\n"
          "                          fp16: a Llama-3-8B-like model), which sizes\n"
          "                          a capacity in bytes (refused without one)\n"
          "  --block-size N          tokens per block (default 16)\n"
          "  --policy NAME[,NAME...] eviction policy: slru (default, as the daemon),\n"
          "                          lru, mq, or opt (Belady's offline optimum: it\n"
          "                          reads the trace's future; replayer only)\n"
          "  --sweep N,N,...         replay once per capacity (tokens, 1e6 notation\n"
          "                          or 'unlimited'; bytes of the layout when it\n"
          "                          has a K, M, G or T suffix) and policy; print\n"
          "                          a table\n"
          "  --plot FILE.png         with --sweep: draw hit rate vs capacity per\n"
          "                          policy, and the ideal (needs gnuplot)\n"
          "  --plot-script FILE      with --plot: keep the gnuplot script (its\n"
          "                          data inline) in FILE\n"
          "  --host-tier-tokens N    a host tier of N tokens below the pool: an\n"
          "                          evicted block is copied down, a lookup that\n"
          "                          finds it there promotes it (a hit)\n"
          "  --disk-tier-tokens N    a disk tier below the host tier (or the pool)\n"
          "  --decode                also append and commit output_length tokens\n"
          "                          per request (unique tokens: space, never hits)\n"
          "  --limit N               read only the first N records of the file\n"
          "  --skip N                then drop the first N records (by time): with\n"
          "                          --limit, a held-out part of a trace\n"
          "  --json                  print the result as one JSON object\n"
          "  --progress, --no-progress  progress bar on stderr (default: when\n"
          "                          stderr is a terminal)\n"
          "\n"
          "N nodes sharing a remote tier (any of these three options):\n"
          "  --nodes N               N cores, each with the pool and tiers above,\n"
          "                          each replaying the records routed to it, all\n"
          "                          in timestamp order (default 1)\n"
          "  --remote-tier-tokens N  one store of N tokens shared by the nodes\n"
          "                          (LRU; 0: none, the default; 'unlimited'):\n"
          "                          every sealed block is written through, a\n"
          "                          lookup goes on there and promotes what it\n"
          "                          finds.  Prints each node alone (no store)\n"
          "                          and shared, and the gain\n"
          "  --split rr|prefix|prefix:K  record i to node i %% N (rr, default), or\n"
          "                          by a hash of its first hash id (of its id at\n"
          "                          depth K: its first K blocks)\n"
          "\n"
          "Tenants (the daemon's partitions: what splitting the pool costs):\n"
          "  --tenants N             N tenants (1..16; default 1: one pool, the\n"
          "                          plain replay), each a core of its own: its\n"
          "                          share of the pool (capacity / N, the daemon's\n"
          "                          equal shares; unlimited: each holds all of its\n"
          "                          records) and of each tier, its own prefix\n"
          "                          index and eviction; no tenant hits another's\n"
          "                          blocks.  Records follow their user.  The\n"
          "                          traces have no user id: a user is a\n"
          "                          conversation, the records with the same hash\n"
          "                          id at the key depth (ids are chained: the same\n"
          "                          first blocks), and its tenant is mix(that id)\n"
          "                          mod N (splitmix64's finalizer, as --split\n"
          "                          prefix).  Prints the totals, then each\n"
          "                          tenant's pool and hit rate (JSON: the totals'\n"
          "                          keys and a \"tenants\" array).  Goes with\n"
          "                          --sweep (total hit rates), --policy and the\n"
          "                          tiers; not with the N nodes options\n"
          "  --tenant-key auto|K     the key depth: K, or auto (default): depth 1,\n"
          "                          the first hash id, unless every record shares\n"
          "                          its first blocks (a system prompt: the\n"
          "                          conversation trace's first block is the same\n"
          "                          in every record), then the first id after\n"
          "                          them (depth 2 there); over the records\n"
          "                          replayed (after --limit and --skip)\n"
          "  --tenant-shares P,P,... percents of the pool and of each tier for\n"
          "                          tenants 0, 1, ... (the daemon's share=P%%,\n"
          "                          rounded down to blocks); the tenants past the\n"
          "                          list split what is left equally; alone, one\n"
          "                          tenant per share\n");
}

/* Splits a comma-separated list in place: its non-empty items, at most max.
 * -1 when there are none or too many. */
static int replay_split(char *list, const char **items, size_t max,
                        size_t *n) {
  *n = 0;
  for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok != NULL;
       tok = strtok_r(NULL, ",", &save)) {
    if (*n == max)
      return -1;
    items[(*n)++] = tok;
  }
  return *n ? 0 : -1;
}

/* A positive integer, in plain or 1e6 notation.  -1 when it is not one. */
static int replay_parse_count(const char *s, uint64_t max, uint64_t *out) {
  char *end;
  errno = 0;
  if (strpbrk(s, "eE.") != NULL) {
    double d = strtod(s, &end);
    if (errno || *end || !(d >= 1) || d > (double)max || d != floor(d))
      return -1;
    *out = (uint64_t)d;
    return 0;
  }
  if (*s == '-')
    return -1;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s || *end || v == 0 || v > max)
    return -1;
  *out = v;
  return 0;
}

/* A size in bytes as the daemon takes them (daemon/config.c): decimal
 * digits, then K, M, G or T (powers of 1024, "KiB" and "KB" too) or
 * nothing.  suffixed: set to whether a suffix was given.  -1 when it is
 * not one, or is 0. */
static int replay_parse_size(const char *s, uint64_t *out, int *suffixed) {
  static const char units[] = "KMGT";
  unsigned long long v;
  uint64_t mul = 1;
  const char *u;
  char *end;

  if (*s < '0' || *s > '9')
    return -1;
  errno = 0;
  v = strtoull(s, &end, 10);
  if (errno || v == 0)
    return -1;
  *suffixed = *end != '\0';
  if (*end) {
    u = strchr(units, toupper((unsigned char)*end));
    if (u == NULL)
      return -1;
    mul = 1ull << (10 * (u - units + 1));
    end++;
    if (toupper((unsigned char)*end) == 'I')
      end++;
    if (toupper((unsigned char)*end) == 'B')
      end++;
  }
  if (*end || v > UINT64_MAX / mul)
    return -1;
  *out = v * mul;
  return 0;
}

/* --dtype NAME: kvs_dtype_name's names.  -1 when unknown. */
static int replay_parse_dtype(const char *s, uint32_t *out) {
  for (uint32_t d = 0; d < KVS_DTYPE__COUNT; d++)
    if (strcmp(s, kvs_dtype_name(d)) == 0) {
      *out = d;
      return 0;
    }
  return -1;
}

/* Bytes given (cfg->capacity_bytes) into cfg->capacity_tokens; -1 (said)
 * when the layout is refused or the bytes hold no block. */
static int replay_bytes_capacity(replay_config *cfg, uint64_t bytes,
                                 uint64_t *tokens) {
  kvs_layout l;
  if (replay_layout(cfg, 1, &l) != 0) {
    fprintf(stderr, "kvshare-replay: bad layout (block size %u, %u layers, "
            "%u kv heads, head dim %u, %s: a block is 1 byte .. 1 GiB)\n",
            cfg->block_size, cfg->num_layers, cfg->num_kv_heads,
            cfg->head_dim, kvs_dtype_name(cfg->dtype));
    return -1;
  }
  if (replay_bytes_tokens(cfg, bytes, NULL, tokens) != 0) {
    fprintf(stderr, "kvshare-replay: %" PRIu64 " bytes hold no block of "
            "%" PRIu64 " bytes (%s)\n", bytes, l.block_stride,
            kvs_dtype_name(cfg->dtype));
    return -1;
  }
  return 0;
}

/* --tenant-shares P,P,...: percents (0 < P <= 100, adding up to 100 at
 * most) of tenants 0, 1, ...; without --tenants, one tenant per share.
 * -1 (said) when the list is bad. */
static int replay_parse_shares(char *list, replay_config *cfg,
                               int tenants_given) {
  const char *items[REPLAY_MAX_TENANTS + 1];
  double sum = 0;
  size_t n;

  if (replay_split(list, items, REPLAY_MAX_TENANTS + 1, &n) != 0 ||
      n > REPLAY_MAX_TENANTS) {
    fprintf(stderr, "kvshare-replay: bad --tenant-shares (1..%d percents, "
            "comma-separated)\n", REPLAY_MAX_TENANTS);
    return -1;
  }
  for (size_t k = 0; k < n; k++) {
    char *end;
    double p;
    errno = 0;
    p = strtod(items[k], &end);
    if (errno || end == items[k] || (*end != '\0' && strcmp(end, "%") != 0) ||
        !(p > 0 && p <= 100)) {
      fprintf(stderr, "kvshare-replay: bad --tenant-shares percent '%s' "
              "(0 < P <= 100)\n", items[k]);
      return -1;
    }
    cfg->tenant_share[k] = p;
    sum += p;
  }
  if (!tenants_given)
    cfg->tenants = (uint32_t)n;
  if (n > cfg->tenants) {
    fprintf(stderr, "kvshare-replay: --tenant-shares gives %zu shares for "
            "%u tenants\n", n, cfg->tenants);
    return -1;
  }
  if (sum > 100 + 1e-9 || (n < cfg->tenants && sum >= 100)) {
    fprintf(stderr, "kvshare-replay: --tenant-shares add up to %g%%%s\n", sum,
            n < cfg->tenants ? ", nothing left for the tenants without one"
                             : ", more than the pool");
    return -1;
  }
  return 0;
}

void replay_print_text(const char *path, const trace *t,
                       const replay_config *cfg, uint32_t num_blocks,
                       const replay_plan *plan, const replay_result *res) {
  const core_stats *st = &res->stats;
  printf("trace           %s: %zu requests, %" PRIu64 " prompt tokens, %" PRIu64
         " output tokens\n",
         path, t->num_recs, t->input_tokens, t->output_tokens);
  printf("pool            %" PRIu64 " tokens = %u blocks of %u tokens%s, "
         "policy %s, decode %s\n",
         (uint64_t)num_blocks * cfg->block_size, num_blocks, cfg->block_size,
         replay_tenant_mode(cfg) ? " in the tenants' partitions (below)"
         : cfg->capacity_tokens  ? ""
                                 : " (unlimited: holds the whole trace)",
         cfg->policy ? cfg->policy : REPLAY_DEFAULT_POLICY, cfg->decode ? "on" : "off");
  if (cfg->capacity_bytes) {
    kvs_layout l;
    uint64_t blocks = 0, tokens = 0;
    if (replay_layout(cfg, 1, &l) == 0)
      (void)replay_bytes_tokens(cfg, cfg->capacity_bytes, &blocks, &tokens);
    printf("bytes           %" PRIu64 " = %" PRIu64 " blocks of %" PRIu64
           " bytes = %" PRIu64 " tokens (%s, %u layers, %u kv heads, head "
           "dim %u)\n",
           cfg->capacity_bytes, blocks, l.block_stride, tokens,
           kvs_dtype_name(cfg->dtype), cfg->num_layers, cfg->num_kv_heads,
           cfg->head_dim);
  }
  printf("requests        %" PRIu64 " served, %" PRIu64 " refused (%" PRIu64
         " prompt tokens larger than the pool)\n",
         res->served, res->refused, res->refused_tokens);
  printf("token hit rate  %.4f  (%" PRIu64 " of %" PRIu64 " prompt tokens)\n",
         replay_token_hit_rate(res), res->hit_tokens, res->query_tokens);
  printf("block hit rate  %.4f  (%" PRIu64 " of %" PRIu64
         " full blocks a lookup may hit)\n",
         replay_block_hit_rate(res), res->hit_blocks, res->lookup_blocks);
  for (int k = 0; k < CORE_TIERS; k++) {
    const core_tier_stats *ts = &res->tiers[k];
    if (!ts->slots)
      continue;
    printf("%s tier       %" PRIu64 " tokens = %u slots: hits %.4f of prompt "
           "tokens (%" PRIu64 "), %" PRIu64 " demoted, %" PRIu64
           " dropped\n",
           k == CORE_TIER_HOST ? "host" : "disk",
           (uint64_t)ts->slots * cfg->block_size, ts->slots,
           res->query_tokens ? (double)res->tier_hit_tokens[k] /
                                   (double)res->query_tokens
                             : 0.0,
           res->tier_hit_tokens[k], ts->demotions, ts->drops);
  }
  if (res->tiers[0].slots || res->tiers[1].slots)
    printf("recomputed      %" PRIu64 " prompt tokens (device hits %" PRIu64
           ")\n",
           res->query_tokens - res->hit_tokens,
           res->hit_tokens - res->tier_hit_tokens[0] - res->tier_hit_tokens[1]);
  printf("ideal           %.4f  token hit rate of an unlimited cache (from "
         "hash ids)\n",
         plan->query_tokens
             ? (double)plan->ideal_hit_tokens / (double)plan->query_tokens
             : 0.0);
  printf("allocations     %" PRIu64 " blocks\n", st->allocated_blocks);
  printf("evictions       %" PRIu64 " blocks\n", st->evictions);
  printf("sealed          %" PRIu64 " blocks (%" PRIu64
         " duplicates of an indexed hash)\n",
         st->sealed_blocks, st->duplicate_blocks);
  printf("peak resident   %" PRIu64 " blocks in use + cached (%" PRIu64
         " distinct full prompt blocks in the trace)\n",
         res->peak_resident, plan->distinct_blocks);
  if (cfg->decode)
    printf("decode          %" PRIu64 " tokens, %" PRIu64
           " requests cut short by a full pool\n",
           res->decode_tokens, res->decode_truncated);
  printf("time            %.2f s (%.0f requests/s)\n", res->seconds,
         res->seconds > 0 ? (double)res->requests / res->seconds : 0.0);
}

int replay_json_layout(json_t *o, const replay_config *cfg) {
  kvs_layout l;
  json_t *more;
  int rc;

  if (replay_layout(cfg, 1, &l) != 0)
    l.block_stride = 0;
  more = json_pack("{s:s, s:I, s:I, s:I, s:I}", "dtype",
                   kvs_dtype_name(cfg->dtype), "num_layers",
                   (json_int_t)cfg->num_layers, "num_kv_heads",
                   (json_int_t)cfg->num_kv_heads, "head_dim",
                   (json_int_t)cfg->head_dim, "block_stride",
                   (json_int_t)l.block_stride);
  if (more == NULL)
    return -1;
  rc = json_object_update(o, more);
  json_decref(more);
  return rc;
}

json_t *replay_json(const char *path, const trace *t,
                    const replay_config *cfg, uint32_t num_blocks,
                    const replay_plan *plan, const replay_result *res) {
  const core_stats *st = &res->stats;
  json_t *o = json_pack(
      "{s:s, s:I, s:I, s:I, s:b, s:s, s:b, s:I, s:I, s:I, s:I, s:I, s:I, s:f,"
      " s:I, s:I, s:f, s:f}",
      "trace", path, "records", (json_int_t)t->num_recs, "capacity_tokens",
      (json_int_t)num_blocks * cfg->block_size, "num_blocks",
      (json_int_t)num_blocks, "unlimited", cfg->capacity_tokens == 0,
      "policy", cfg->policy ? cfg->policy : REPLAY_DEFAULT_POLICY, "decode", cfg->decode != 0,
      "block_size", (json_int_t)cfg->block_size, "requests",
      (json_int_t)res->requests, "served", (json_int_t)res->served, "refused",
      (json_int_t)res->refused, "query_tokens", (json_int_t)res->query_tokens,
      "hit_tokens", (json_int_t)res->hit_tokens, "token_hit_rate",
      replay_token_hit_rate(res), "lookup_blocks",
      (json_int_t)res->lookup_blocks, "hit_blocks",
      (json_int_t)res->hit_blocks, "block_hit_rate",
      replay_block_hit_rate(res), "ideal_token_hit_rate",
      plan->query_tokens
          ? (double)plan->ideal_hit_tokens / (double)plan->query_tokens
          : 0.0);
  if (o == NULL)
    return NULL;
  json_t *more = json_pack(
      "{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I,"
      " s:I, s:I, s:f}",
      "host_tier_tokens",
      (json_int_t)res->tiers[CORE_TIER_HOST].slots * cfg->block_size,
      "disk_tier_tokens",
      (json_int_t)res->tiers[CORE_TIER_DISK].slots * cfg->block_size,
      "host_hit_tokens", (json_int_t)res->tier_hit_tokens[CORE_TIER_HOST],
      "disk_hit_tokens", (json_int_t)res->tier_hit_tokens[CORE_TIER_DISK],
      "tier_lost", (json_int_t)st->tier_lost,
      "refused_tokens", (json_int_t)res->refused_tokens, "allocated_blocks",
      (json_int_t)st->allocated_blocks, "evictions", (json_int_t)st->evictions,
      "sealed_blocks", (json_int_t)st->sealed_blocks, "duplicate_blocks",
      (json_int_t)st->duplicate_blocks, "peak_resident_blocks",
      (json_int_t)res->peak_resident, "distinct_prompt_blocks",
      (json_int_t)plan->distinct_blocks, "unlimited_blocks",
      (json_int_t)plan->unlimited_blocks, "decode_tokens",
      (json_int_t)res->decode_tokens, "decode_truncated",
      (json_int_t)res->decode_truncated, "seconds", res->seconds);
  if (more == NULL || json_object_update(o, more) != 0) {
    json_decref(more);
    json_decref(o);
    return NULL;
  }
  json_decref(more);
  if (replay_json_layout(o, cfg) != 0 ||
      json_object_set_new(o, "capacity_bytes",
                          json_integer((json_int_t)cfg->capacity_bytes)) ||
      json_object_set_new(
          o, "capacity_blocks",
          json_integer((json_int_t)(cfg->capacity_tokens / cfg->block_size)))) {
    json_decref(o);
    return NULL;
  }
  return o;
}

static int replay_print_json(const char *path, const trace *t,
                             const replay_config *cfg, uint32_t num_blocks,
                             const replay_plan *plan,
                             const replay_result *res) {
  json_t *o = replay_json(path, t, cfg, num_blocks, plan, res);
  int rc;

  if (o == NULL)
    return -1;
  rc = json_dumpf(o, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  fputc('\n', stdout);
  json_decref(o);
  return rc;
}

enum {
  OPT_TRACE = 256,
  OPT_CAPACITY,
  OPT_BLOCK_SIZE,
  OPT_POLICY,
  OPT_JSON,
  OPT_DECODE,
  OPT_LIMIT,
  OPT_SKIP,
  OPT_SWEEP,
  OPT_PLOT,
  OPT_PLOT_SCRIPT,
  OPT_HOST_TIER,
  OPT_DISK_TIER,
  OPT_PROGRESS,
  OPT_NO_PROGRESS,
  OPT_NODES,
  OPT_REMOTE_TIER,
  OPT_SPLIT,
  OPT_TENANTS,
  OPT_TENANT_SHARES,
  OPT_TENANT_KEY,
  OPT_CAPACITY_BYTES,
  OPT_LAYERS,
  OPT_KV_HEADS,
  OPT_HEAD_DIM,
  OPT_DTYPE,
  OPT_HELP
};

int replay_main(int argc, char **argv) {
  static const struct option opts[] = {
      {"trace", required_argument, NULL, OPT_TRACE},
      {"capacity-tokens", required_argument, NULL, OPT_CAPACITY},
      {"block-size", required_argument, NULL, OPT_BLOCK_SIZE},
      {"policy", required_argument, NULL, OPT_POLICY},
      {"json", no_argument, NULL, OPT_JSON},
      {"decode", no_argument, NULL, OPT_DECODE},
      {"limit", required_argument, NULL, OPT_LIMIT},
      {"skip", required_argument, NULL, OPT_SKIP},
      {"sweep", required_argument, NULL, OPT_SWEEP},
      {"plot", required_argument, NULL, OPT_PLOT},
      {"plot-script", required_argument, NULL, OPT_PLOT_SCRIPT},
      {"host-tier-tokens", required_argument, NULL, OPT_HOST_TIER},
      {"disk-tier-tokens", required_argument, NULL, OPT_DISK_TIER},
      {"progress", no_argument, NULL, OPT_PROGRESS},
      {"no-progress", no_argument, NULL, OPT_NO_PROGRESS},
      {"nodes", required_argument, NULL, OPT_NODES},
      {"remote-tier-tokens", required_argument, NULL, OPT_REMOTE_TIER},
      {"split", required_argument, NULL, OPT_SPLIT},
      {"tenants", required_argument, NULL, OPT_TENANTS},
      {"tenant-shares", required_argument, NULL, OPT_TENANT_SHARES},
      {"tenant-key", required_argument, NULL, OPT_TENANT_KEY},
      {"capacity-bytes", required_argument, NULL, OPT_CAPACITY_BYTES},
      {"layers", required_argument, NULL, OPT_LAYERS},
      {"kv-heads", required_argument, NULL, OPT_KV_HEADS},
      {"head-dim", required_argument, NULL, OPT_HEAD_DIM},
      {"dtype", required_argument, NULL, OPT_DTYPE},
      {"help", no_argument, NULL, OPT_HELP},
      {NULL, 0, NULL, 0}};
  replay_config cfg;
  replay_plan plan;
  replay_result res;
  enum { MAX_LIST = 32 };
  const char *path = NULL, *plot = NULL, *plot_script = NULL, *pols[MAX_LIST];
  char *pol_list = NULL, *sweep_list = NULL, *share_list = NULL;
  uint64_t v, limit = 0, skip = 0, caps[MAX_LIST], cap_bytes[MAX_LIST];
  size_t npols = 0, ncaps = 0;
  uint32_t num_blocks;
  int json = 0, progress = -1, opt, rc, status = 1, nodes_mode = 0;
  int tenants_given = 0, key_given = 0, tokens_given = 0, suffixed;
  int layout_given = 0, bytes_given = 0;
  replay_nodes_config nc = {.nodes = 1, .split = REPLAY_SPLIT_RR,
                            .prefix_blocks = 1};
  trace *t = NULL;
  char err[256];

  replay_config_init(&cfg);
  optind = 1;
  opterr = 0; /* getopt's messages would name argv[0]: ours, below */
  while ((opt = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
    switch (opt) {
    case OPT_TRACE:
      path = optarg;
      break;
    case OPT_CAPACITY:
      if (strcmp(optarg, "unlimited") == 0) {
        cfg.capacity_tokens = 0;
      } else if (replay_parse_count(optarg, UINT64_MAX >> 1, &v) == 0) {
        cfg.capacity_tokens = v;
      } else {
        fprintf(stderr, "kvshare-replay: bad --capacity-tokens '%s'\n", optarg);
        return 2;
      }
      tokens_given = 1;
      break;
    case OPT_CAPACITY_BYTES:
      if (replay_parse_size(optarg, &cfg.capacity_bytes, &suffixed) != 0) {
        fprintf(stderr, "kvshare-replay: bad --capacity-bytes '%s' (bytes, "
                "or with K, M, G or T)\n", optarg);
        return 2;
      }
      break;
    case OPT_LAYERS:
    case OPT_KV_HEADS:
    case OPT_HEAD_DIM:
      if (replay_parse_count(optarg, opt == OPT_HEAD_DIM ? 4096 : 1024,
                             &v) != 0) {
        fprintf(stderr, "kvshare-replay: bad --%s '%s' (1..%d)\n",
                opt == OPT_LAYERS     ? "layers"
                : opt == OPT_KV_HEADS ? "kv-heads"
                                      : "head-dim",
                optarg, opt == OPT_HEAD_DIM ? 4096 : 1024);
        return 2;
      }
      *(opt == OPT_LAYERS     ? &cfg.num_layers
        : opt == OPT_KV_HEADS ? &cfg.num_kv_heads
                              : &cfg.head_dim) = (uint32_t)v;
      layout_given = 1;
      break;
    case OPT_DTYPE:
      if (replay_parse_dtype(optarg, &cfg.dtype) != 0) {
        fprintf(stderr, "kvshare-replay: bad --dtype '%s' (fp32, fp16, bf16, "
                "int8, fp8)\n", optarg);
        return 2;
      }
      layout_given = 1;
      break;
    case OPT_BLOCK_SIZE:
      if (replay_parse_count(optarg, 4096, &v) != 0) {
        fprintf(stderr, "kvshare-replay: bad --block-size '%s' (1..4096)\n",
                optarg);
        return 2;
      }
      cfg.block_size = (uint32_t)v;
      break;
    case OPT_POLICY:
      pol_list = optarg;
      break;
    case OPT_SWEEP:
      sweep_list = optarg;
      break;
    case OPT_PLOT:
      plot = optarg;
      break;
    case OPT_PLOT_SCRIPT:
      plot_script = optarg;
      break;
    case OPT_JSON:
      json = 1;
      break;
    case OPT_DECODE:
      cfg.decode = 1;
      break;
    case OPT_LIMIT:
      if (replay_parse_count(optarg, SIZE_MAX, &limit) != 0) {
        fprintf(stderr, "kvshare-replay: bad --limit '%s'\n", optarg);
        return 2;
      }
      break;
    case OPT_SKIP:
      if (strcmp(optarg, "0") != 0 &&
          replay_parse_count(optarg, SIZE_MAX, &skip) != 0) {
        fprintf(stderr, "kvshare-replay: bad --skip '%s'\n", optarg);
        return 2;
      }
      break;
    case OPT_HOST_TIER:
    case OPT_DISK_TIER:
      if (replay_parse_count(optarg, UINT64_MAX >> 1, &v) != 0) {
        fprintf(stderr, "kvshare-replay: bad --%s-tier-tokens '%s'\n",
                opt == OPT_HOST_TIER ? "host" : "disk", optarg);
        return 2;
      }
      cfg.tier_tokens[opt == OPT_HOST_TIER ? CORE_TIER_HOST : CORE_TIER_DISK] =
          v;
      break;
    case OPT_NODES:
      if (replay_parse_count(optarg, REPLAY_MAX_NODES, &v) != 0) {
        fprintf(stderr, "kvshare-replay: bad --nodes '%s' (1..%d)\n", optarg,
                REPLAY_MAX_NODES);
        return 2;
      }
      nc.nodes = (uint32_t)v;
      nodes_mode = 1;
      break;
    case OPT_REMOTE_TIER:
      if (strcmp(optarg, "unlimited") == 0) {
        nc.remote_tokens = UINT64_MAX;
      } else if (strcmp(optarg, "0") == 0) {
        nc.remote_tokens = 0;
      } else if (replay_parse_count(optarg, UINT64_MAX >> 1, &v) == 0) {
        nc.remote_tokens = v;
      } else {
        fprintf(stderr, "kvshare-replay: bad --remote-tier-tokens '%s'\n",
                optarg);
        return 2;
      }
      nodes_mode = 1;
      break;
    case OPT_SPLIT:
      if (strcmp(optarg, "rr") == 0) {
        nc.split = REPLAY_SPLIT_RR;
      } else if (strcmp(optarg, "prefix") == 0) {
        nc.split = REPLAY_SPLIT_PREFIX;
        nc.prefix_blocks = 1;
      } else if (strncmp(optarg, "prefix:", 7) == 0 &&
                 replay_parse_count(optarg + 7, 1u << 20, &v) == 0) {
        nc.split = REPLAY_SPLIT_PREFIX;
        nc.prefix_blocks = (uint32_t)v;
      } else {
        fprintf(stderr, "kvshare-replay: bad --split '%s' (rr, prefix, "
                "prefix:K)\n", optarg);
        return 2;
      }
      nodes_mode = 1;
      break;
    case OPT_TENANTS:
      if (replay_parse_count(optarg, REPLAY_MAX_TENANTS, &v) != 0) {
        fprintf(stderr, "kvshare-replay: bad --tenants '%s' (1..%d)\n",
                optarg, REPLAY_MAX_TENANTS);
        return 2;
      }
      cfg.tenants = (uint32_t)v;
      tenants_given = 1;
      break;
    case OPT_TENANT_SHARES:
      share_list = optarg;
      break;
    case OPT_TENANT_KEY:
      if (strcmp(optarg, "auto") == 0) {
        cfg.tenant_depth = 0;
      } else if (replay_parse_count(optarg, 1u << 20, &v) == 0) {
        cfg.tenant_depth = (uint32_t)v;
      } else {
        fprintf(stderr, "kvshare-replay: bad --tenant-key '%s' (auto, or a "
                "depth K >= 1)\n", optarg);
        return 2;
      }
      key_given = 1;
      break;
    case OPT_PROGRESS:
      progress = 1;
      break;
    case OPT_NO_PROGRESS:
      progress = 0;
      break;
    case OPT_HELP:
      replay_usage(stdout);
      return 0;
    case ':': /* getopt has stepped past the option: argv[optind - 1] */
      fprintf(stderr, "kvshare-replay: %s needs a value\n", argv[optind - 1]);
      replay_usage(stderr);
      return 2;
    default:
      if (optopt > 0 && optopt < OPT_TRACE)
        fprintf(stderr, "kvshare-replay: unknown option '-%c'\n", optopt);
      else
        fprintf(stderr, "kvshare-replay: bad option '%s'\n", argv[optind - 1]);
      replay_usage(stderr);
      return 2;
    }
  }
  if (path == NULL && optind + 1 == argc)
    path = argv[optind++]; /* `kvshare-replay FILE` */
  if (optind < argc || path == NULL) {
    fprintf(stderr, "kvshare-replay: %s\n",
            path == NULL ? "--trace FILE is required" : "unexpected argument");
    replay_usage(stderr);
    return 2;
  }
  cfg.progress = progress >= 0 ? progress : isatty(STDERR_FILENO);
  if (pol_list != NULL &&
      replay_split(pol_list, pols, MAX_LIST, &npols) != 0) {
    fprintf(stderr, "kvshare-replay: bad --policy list '%s'\n", pol_list);
    return 2;
  }
  if (sweep_list != NULL) {
    const char *items[MAX_LIST];
    if (replay_split(sweep_list, items, MAX_LIST, &ncaps) != 0) {
      fprintf(stderr, "kvshare-replay: bad --sweep list '%s'\n", sweep_list);
      return 2;
    }
    for (size_t i = 0; i < ncaps; i++) {
      cap_bytes[i] = 0;
      if (strcmp(items[i], "unlimited") == 0) {
        caps[i] = 0;
      } else if (replay_parse_size(items[i], &cap_bytes[i], &suffixed) == 0 &&
                 suffixed) {
        /* Bytes of the layout (a K, M, G or T suffix). */
        if (replay_bytes_capacity(&cfg, cap_bytes[i], &caps[i]) != 0)
          return 2;
        bytes_given = 1;
      } else if (replay_parse_count(items[i], UINT64_MAX >> 1, &caps[i]) != 0) {
        fprintf(stderr, "kvshare-replay: bad --sweep capacity '%s'\n",
                items[i]);
        return 2;
      }
    }
  }
  if (cfg.capacity_bytes && tokens_given) {
    fprintf(stderr, "kvshare-replay: --capacity-bytes and --capacity-tokens "
            "are two ways to give one capacity: one or the other\n");
    return 2;
  }
  if (cfg.capacity_bytes &&
      replay_bytes_capacity(&cfg, cfg.capacity_bytes, &cfg.capacity_tokens) !=
          0)
    return 2;
  if (layout_given && !cfg.capacity_bytes && !bytes_given) {
    fprintf(stderr, "kvshare-replay: --layers, --kv-heads, --head-dim and "
            "--dtype size a capacity in bytes (--capacity-bytes, or a --sweep "
            "capacity with a K, M, G or T suffix); a capacity in tokens does "
            "not depend on them\n");
    return 2;
  }
  if (plot != NULL && sweep_list == NULL) {
    fprintf(stderr, "kvshare-replay: --plot goes with --sweep\n");
    return 2;
  }
  if (plot_script != NULL && plot == NULL) {
    fprintf(stderr, "kvshare-replay: --plot-script goes with --plot\n");
    return 2;
  }
  if (share_list != NULL &&
      replay_parse_shares(share_list, &cfg, tenants_given) != 0)
    return 2;
  if (key_given && !replay_tenant_mode(&cfg)) {
    fprintf(stderr, "kvshare-replay: --tenant-key goes with --tenants\n");
    return 2;
  }
  if (nodes_mode && replay_tenant_mode(&cfg)) {
    fprintf(stderr, "kvshare-replay: --tenants and --tenant-shares do not "
            "go with --nodes, --remote-tier-tokens or --split (each node "
            "would hold a partition of every tenant): one or the other\n");
    return 2;
  }
  if (nodes_mode && (sweep_list != NULL || npols > 1)) {
    fprintf(stderr, "kvshare-replay: --nodes, --remote-tier-tokens and "
            "--split take one policy and no --sweep\n");
    return 2;
  }
  if (npols > 1 && sweep_list == NULL) {
    caps[0] = cfg.capacity_tokens;
    cap_bytes[0] = cfg.capacity_bytes;
    ncaps = 1;
  }
  if (npols == 0)
    pols[npols++] = REPLAY_DEFAULT_POLICY;
  for (size_t i = 0; i < npols; i++) {
    if (core_policy_find(pols[i], NULL) != 0) {
      char names[128];
      core_policy_list(names, sizeof(names), 1);
      fprintf(stderr, "kvshare-replay: unknown policy '%s' (%s)\n", pols[i],
              names);
      return 2;
    }
  }
  cfg.policy = pols[0];

  rc = trace_load(path, (size_t)limit, &t, err, sizeof(err));
  if (rc != 0) {
    fprintf(stderr, "kvshare-replay: %s\n", err); /* the reason, once */
    goto out;
  }
  trace_skip(t, (size_t)skip);
  if (t->num_recs == 0) {
    fprintf(stderr, "kvshare-replay: no records left to replay\n");
    goto out;
  }
  rc = replay_plan_make(t, &cfg, &plan);
  if (rc != 0) {
    fprintf(stderr, "kvshare-replay: %s\n", kvs_strerror(rc));
    goto out;
  }
  if (nodes_mode) {
    status = replay_nodes(t, path, &cfg, &plan, &nc, json) == 0 &&
                     fflush(stdout) == 0
                 ? 0
                 : 1;
    goto out;
  }
  if (ncaps > 0) {
    status = replay_sweep(t, path, &cfg, &plan, caps, cap_bytes, ncaps, pols,
                          npols, json,
                          plot, plot_script) == 0 && fflush(stdout) == 0
                 ? 0
                 : 1;
    goto out;
  }
  if (replay_tenant_mode(&cfg)) {
    status = replay_tenants(t, path, &cfg, &plan, json) == 0 &&
                     fflush(stdout) == 0
                 ? 0
                 : 1;
    goto out;
  }
  if (replay_checked(t, &cfg, &plan, &num_blocks, &res) != 0)
    goto out;
  if (json) {
    if (replay_print_json(path, t, &cfg, num_blocks, &plan, &res) != 0) {
      fprintf(stderr, "kvshare-replay: cannot write JSON\n");
      goto out;
    }
  } else {
    replay_print_text(path, t, &cfg, num_blocks, &plan, &res);
  }
  status = fflush(stdout) == 0 ? 0 : 1;
out:
  trace_free(t);
  return status;
}
