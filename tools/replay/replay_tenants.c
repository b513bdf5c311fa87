/*
 * replay_tenants.c — `kvshare-replay --tenants N`: what splitting the pool
 * into the daemon's per-tenant partitions costs in hit rate.  N cores, each
 * of its tenant's share of the pool and tiers, replay the records of their
 * tenant's users, all in timestamp order, one record at a time.  See
 * replay.h.
 */
#include "tools/replay/replay.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint32_t replay_tenant_depth(const trace *t, const replay_config *cfg) {
  const uint32_t *first;
  uint32_t common;

  if (cfg->tenant_depth != 0 || t->num_recs == 0)
    return cfg->tenant_depth ? cfg->tenant_depth : 1;
  first = trace_rec_hash_ids(t, &t->recs[0]);
  common = t->recs[0].num_hash_ids;
  for (size_t i = 1; i < t->num_recs && common > 0; i++) {
    const trace_rec *r = &t->recs[i];
    const uint32_t *ids = trace_rec_hash_ids(t, r);
    uint32_t k = 0, n = r->num_hash_ids < common ? r->num_hash_ids : common;
    while (k < n && ids[k] == first[k])
      k++;
    common = k;
  }
  return common + 1;
}

void replay_tenant_route(const trace *t, const replay_config *cfg,
                         uint32_t *out) {
  replay_nodes_config nc = {.nodes = cfg->tenants,
                            .split = REPLAY_SPLIT_PREFIX,
                            .prefix_blocks = replay_tenant_depth(t, cfg)};
  replay_route(t, &nc, out);
}

void replay_tenant_blocks(const replay_config *cfg, uint64_t blocks,
                          uint64_t *out) {
  uint64_t given = 0, rest;
  uint32_t k, nrest = 0;

  for (k = 0; k < cfg->tenants; k++) {
    double frac = cfg->tenant_share[k] / 100.0;
    if (cfg->tenant_share[k] > 0) {
      out[k] = (uint64_t)(frac * (double)blocks);
      given += out[k];
    } else {
      nrest++;
    }
  }
  rest = nrest && given < blocks ? (blocks - given) / nrest : 0;
  for (k = 0; k < cfg->tenants; k++)
    if (!(cfg->tenant_share[k] > 0))
      out[k] = rest;
}

/* Each tenant's pool, tiers and plan into tn, and its configuration into
 * tcfg (the runner keeps a pointer to it).  Returns 0 or an error, said. */
static int tenants_size(const trace *t, const replay_config *cfg,
                        const replay_plan *plan, const uint32_t *route,
                        replay_tenant *tn, replay_config *tcfg) {
  uint64_t split[REPLAY_MAX_TENANTS], sum = 0;
  uint32_t n = cfg->tenants, pool, k;
  int rc;

  if (replay_pool_blocks(cfg, plan, &pool) != 0) {
    fprintf(stderr,
            "kvshare-replay: a pool of %" PRIu64
            " tokens is not 1 .. 2^32-2 blocks of %u tokens\n",
            cfg->capacity_tokens ? cfg->capacity_tokens
                                 : plan->unlimited_blocks,
            cfg->block_size);
    return KVS_EINVAL;
  }
  for (k = 0; k < n; k++) {
    tcfg[k] = *cfg;
    tcfg[k].progress = 0;
    if ((rc = replay_plan_part(t, cfg, route, k, &tn[k].plan)) != 0) {
      fprintf(stderr, "kvshare-replay: %s\n", kvs_strerror(rc));
      return rc;
    }
  }
  replay_tenant_blocks(cfg, pool, split);
  for (k = 0; k < n; k++) {
    if (cfg->capacity_tokens == 0) {
      /* Unlimited: each holds all of its own records. */
      uint64_t b = tn[k].plan.unlimited_blocks;
      tn[k].num_blocks = b ? (uint32_t)b : 1;
    } else if (split[k] == 0) {
      fprintf(stderr,
              "kvshare-replay: tenant %u gets 0 blocks of a pool of %u "
              "blocks of %u tokens\n",
              k, pool, cfg->block_size);
      return KVS_EINVAL;
    } else {
      tn[k].num_blocks = (uint32_t)split[k];
    }
    tcfg[k].capacity_tokens = (uint64_t)tn[k].num_blocks * cfg->block_size;
    sum += tn[k].num_blocks;
  }
  if (sum >= KVS_BLOCK_NONE) { /* unlimited: one pool of the lot */
    fprintf(stderr, "kvshare-replay: the tenants' pools, %" PRIu64
            " blocks, are not 1 .. 2^32-2 blocks\n", sum);
    return KVS_EINVAL;
  }
  for (int x = 0; x < CORE_TIERS; x++) {
    replay_tenant_blocks(cfg, cfg->tier_tokens[x] / cfg->block_size, split);
    for (k = 0; k < n; k++) {
      tn[k].tier_tokens[x] = split[k] * cfg->block_size;
      tcfg[k].tier_tokens[x] = tn[k].tier_tokens[x];
    }
  }
  return 0;
}

int replay_tenants_run(const trace *t, const replay_config *cfg,
                       const replay_plan *plan, replay_tenant *tn,
                       replay_result *total) {
  const char *pol = cfg->policy != NULL ? cfg->policy : REPLAY_DEFAULT_POLICY;
  uint32_t n = cfg->tenants, k;
  size_t step = t->num_recs / 200 + 1;
  uint32_t *route = malloc(t->num_recs * sizeof(*route));
  replay_config *tcfg = calloc(n, sizeof(*tcfg));
  core **cores = calloc(n, sizeof(*cores));
  replay_runner **runners = calloc(n, sizeof(*runners));
  double t0 = replay_now();
  char msg[256];
  int rc = KVS_ENOMEM;

  memset(tn, 0, n * sizeof(*tn));
  memset(total, 0, sizeof(*total));
  if (route == NULL || tcfg == NULL || cores == NULL || runners == NULL) {
    fprintf(stderr, "kvshare-replay: %s\n", kvs_strerror(rc));
    goto out;
  }
  replay_tenant_route(t, cfg, route);
  if ((rc = tenants_size(t, cfg, plan, route, tn, tcfg)) != 0)
    goto out;
  for (k = 0; k < n; k++) {
    rc = replay_core_create(&tcfg[k], tn[k].num_blocks, &tn[k].plan,
                            &cores[k]);
    if (rc == 0)
      rc = replay_runner_create(cores[k], t, &tcfg[k], route, k, NULL,
                                &runners[k]);
    if (rc != 0) {
      fprintf(stderr,
              "kvshare-replay: cannot create tenant %u's core (%u blocks, "
              "policy '%s'): %s\n",
              k, tn[k].num_blocks, pol, kvs_strerror(rc));
      goto out;
    }
  }
  for (size_t i = 0; i < t->num_recs; i++) {
    rc = replay_runner_step(runners[route[i]], i, &tn[route[i]].res);
    if (rc != 0) {
      fprintf(stderr,
              "kvshare-replay: core error in tenant %u (policy '%s'): %s\n",
              route[i], pol, kvs_strerror(rc));
      goto out;
    }
    if (cfg->progress && (i % step == 0 || i + 1 == t->num_recs))
      replay_progress(i + 1, t->num_recs, t0);
  }
  for (k = 0; k < n; k++) {
    replay_runner_finish(runners[k], &tn[k].res);
    runners[k] = NULL;
    if (core_check(cores[k], msg, sizeof(msg)) != 0) {
      fprintf(stderr,
              "kvshare-replay: core invariant broken in tenant %u "
              "(policy '%s'): %s\n",
              k, pol, msg);
      rc = KVS_EINTERNAL;
      goto out;
    }
    replay_result_add(total, &tn[k].res);
  }
  /* One run: its wall time, not the longest tenant's. */
  total->seconds = replay_now() - t0;
out:
  replay_runners_free(cores, runners, n);
  free(tcfg);
  free(route);
  return rc;
}

/* ---- the report ---- */

static double tenants_ideal(const replay_plan *p) {
  return p->query_tokens
             ? (double)p->ideal_hit_tokens / (double)p->query_tokens
             : 0.0;
}

/* How the pool is split: "equally", "50%, 30%, 20%", "70%, the rest
 * equally". */
static void tenants_shares_name(const replay_config *cfg, char *buf,
                                size_t len) {
  size_t used = 0;
  int w = 0;

  if (!(cfg->tenant_share[0] > 0)) {
    snprintf(buf, len, "equally");
    return;
  }
  buf[0] = '\0';
  for (uint32_t k = 0; k < cfg->tenants && used < len && w >= 0; k++) {
    if (cfg->tenant_share[k] > 0) {
      w = snprintf(buf + used, len - used, "%s%g%%", k ? ", " : "",
                   cfg->tenant_share[k]);
    } else { /* the rest are the same */
      snprintf(buf + used, len - used, ", the rest equally");
      break;
    }
    used += (size_t)w;
  }
}

static void tenants_print_text(const trace *t, const replay_config *cfg,
                               const replay_plan *plan,
                               const replay_tenant *tn,
                               const replay_result *total) {
  int tiers =
      cfg->tier_tokens[CORE_TIER_HOST] || cfg->tier_tokens[CORE_TIER_DISK];
  uint32_t depth = replay_tenant_depth(t, cfg);
  uint64_t pool = 0, ideal = 0, host = 0, disk = 0;
  char shares[160];

  tenants_shares_name(cfg, shares, sizeof(shares));
  printf("\ntenants         %u, a partition each: pool%s split %s%s\n"
         "                a user: the records with the same hash id at depth "
         "%u%s;\n"
         "                its tenant: mix(that id) mod %u\n",
         cfg->tenants, tiers ? " and tiers" : "", shares,
         cfg->capacity_tokens ? "" : " (unlimited: each holds its records)",
         depth,
         cfg->tenant_depth ? ""
         : depth > 1       ? " (auto: every record shares the blocks above)"
                           : " (auto)",
         cfg->tenants);
  printf("%-6s %9s %14s %12s", "tenant", "requests", "prompt tokens",
         "pool tokens");
  if (tiers)
    printf(" %12s %12s", "host tokens", "disk tokens");
  printf(" %9s %7s %8s %10s\n", "hit rate", "ideal", "refused", "evictions");
  for (uint32_t k = 0; k <= cfg->tenants; k++) {
    int sum = k == cfg->tenants;
    const replay_result *r = sum ? total : &tn[k].res;
    uint64_t p = sum ? pool : (uint64_t)tn[k].num_blocks * cfg->block_size;
    uint64_t h = sum ? host : tn[k].tier_tokens[CORE_TIER_HOST];
    uint64_t d = sum ? disk : tn[k].tier_tokens[CORE_TIER_DISK];
    double id = sum ? replay_share(r, ideal) : tenants_ideal(&tn[k].plan);

    if (sum)
      printf("%-6s", "total");
    else
      printf("%-6u", k);
    printf(" %9" PRIu64 " %14" PRIu64 " %12" PRIu64, r->requests,
           r->query_tokens, p);
    if (tiers)
      printf(" %12" PRIu64 " %12" PRIu64, h, d);
    printf(" %9.4f %7.4f %8" PRIu64 " %10" PRIu64 "\n",
           replay_token_hit_rate(r), id, r->refused, r->stats.evictions);
    pool += p;
    host += h;
    disk += d;
    ideal += sum ? 0 : tn[k].plan.ideal_hit_tokens;
  }
  printf("ideal: the hit rate of the tenant's records in an unlimited cache "
         "of their own;\n"
         "the total's, of the tenants together (one cache of the whole "
         "trace: %.4f)\n",
         tenants_ideal(plan));
}

/* The "tenants" array and the keys beside it, set into o. */
static int tenants_json(const trace *t, const replay_config *cfg,
                        const replay_tenant *tn, const replay_result *total,
                        json_t *o) {
  json_t *arr = json_array(), *x;
  uint64_t ideal = 0;

  if (arr == NULL)
    return -1;
  for (uint32_t k = 0; k < cfg->tenants; k++) {
    const replay_result *r = &tn[k].res;
    ideal += tn[k].plan.ideal_hit_tokens;
    x = json_pack(
        "{s:I, s:f, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f,"
        " s:I, s:I, s:I, s:f}",
        "tenant", (json_int_t)k, "share_percent", cfg->tenant_share[k],
        "capacity_tokens",
        (json_int_t)tn[k].num_blocks * (json_int_t)cfg->block_size,
        "num_blocks", (json_int_t)tn[k].num_blocks, "host_tier_tokens",
        (json_int_t)tn[k].tier_tokens[CORE_TIER_HOST], "disk_tier_tokens",
        (json_int_t)tn[k].tier_tokens[CORE_TIER_DISK], "requests",
        (json_int_t)r->requests, "served", (json_int_t)r->served, "refused",
        (json_int_t)r->refused, "query_tokens", (json_int_t)r->query_tokens,
        "hit_tokens", (json_int_t)r->hit_tokens, "token_hit_rate",
        replay_token_hit_rate(r), "block_hit_rate", replay_block_hit_rate(r),
        "host_hit_tokens", (json_int_t)r->tier_hit_tokens[CORE_TIER_HOST],
        "disk_hit_tokens", (json_int_t)r->tier_hit_tokens[CORE_TIER_DISK],
        "evictions", (json_int_t)r->stats.evictions, "ideal_token_hit_rate",
        tenants_ideal(&tn[k].plan));
    if (x == NULL || json_array_append_new(arr, x) != 0) { /* takes x */
      json_decref(arr);
      return -1;
    }
  }
  x = json_pack("{s:I, s:b, s:f, s:o}", "tenant_key_depth",
                (json_int_t)replay_tenant_depth(t, cfg), "tenant_key_auto",
                cfg->tenant_depth == 0, "tenants_ideal_token_hit_rate",
                replay_share(total, ideal), "tenants", arr);
  if (x == NULL) /* json_pack took arr */
    return -1;
  if (json_object_update(o, x) != 0) {
    json_decref(x);
    return -1;
  }
  json_decref(x);
  return 0;
}

int replay_tenants(const trace *t, const char *path, const replay_config *cfg,
                   const replay_plan *plan, int json) {
  replay_tenant *tn = calloc(cfg->tenants, sizeof(*tn));
  replay_result total;
  uint32_t blocks = 0; /* < KVS_BLOCK_NONE (tenants_size) */
  json_t *o;
  int rc = KVS_ENOMEM;

  if (tn == NULL) {
    fprintf(stderr, "kvshare-replay: %s\n", kvs_strerror(rc));
    return rc;
  }
  if ((rc = replay_tenants_run(t, cfg, plan, tn, &total)) != 0)
    goto out;
  for (uint32_t k = 0; k < cfg->tenants; k++)
    blocks += tn[k].num_blocks;
  if (!json) {
    replay_print_text(path, t, cfg, blocks, plan, &total);
    tenants_print_text(t, cfg, plan, tn, &total);
    goto out;
  }
  o = replay_json(path, t, cfg, blocks, plan, &total);
  if (o == NULL || tenants_json(t, cfg, tn, &total, o) != 0 ||
      json_dumpf(o, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0) {
    fprintf(stderr, "kvshare-replay: cannot write JSON\n");
    rc = KVS_EIO;
  } else {
    fputc('\n', stdout);
  }
  json_decref(o);
out:
  free(tn);
  return rc;
}
