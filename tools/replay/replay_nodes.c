/*
 * replay_nodes.c — `kvshare-replay --nodes N --remote-tier-tokens R`: what
 * a remote tier shared by N daemons is worth.  N cores replay the records
 * routed to each (replay_route), all in timestamp order, one record at a
 * time, once alone (the baseline) and once above one shared store
 * (replay_store: write-through of every sealed block, the rest of a
 * lookup's chain read from it).  See replay.h.
 */
#include "tools/replay/replay.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the store: a hash set with an LRU list, O(1) per operation ---- */

#define STORE_NONE UINT32_MAX

typedef struct store_ent {
  kvs_hash128 h;
  uint32_t prev, next; /* LRU list: head least recent */
} store_ent;

struct replay_store {
  uint32_t cap; /* entries */
  uint32_t used;
  uint64_t *table; /* linear probing: tag << 32 | (entry + 1); 0 empty */
  unsigned shift;  /* 64 - log2(table size) */
  uint64_t mask;
  store_ent *ents;
  uint32_t head, tail;
  replay_store_stats st;
};

static uint64_t store_mix(kvs_hash128 h) {
  return (h.lo ^ h.hi) * 0x9e3779b97f4a7c15ull;
}

/* Home slot: the top bits of the mix; the tag: the low 32 (most probes end
 * on a tag mismatch without reading the entry). */
static uint64_t store_home(const replay_store *s, uint64_t m) {
  return m >> s->shift;
}

/* The table position holding h, or that of the empty slot ending its
 * probe. */
static uint64_t store_pos(const replay_store *s, kvs_hash128 h) {
  uint64_t m = store_mix(h), i = store_home(s, m), tag = m << 32, x;
  while ((x = s->table[i]) != 0) {
    if ((x & ~0xffffffffull) == tag) {
      const store_ent *e = &s->ents[(uint32_t)x - 1];
      if (e->h.lo == h.lo && e->h.hi == h.hi)
        break;
    }
    i = (i + 1) & s->mask;
  }
  return i;
}

static void store_unlink(replay_store *s, uint32_t e) {
  store_ent *x = &s->ents[e];
  if (x->prev != STORE_NONE)
    s->ents[x->prev].next = x->next;
  else
    s->head = x->next;
  if (x->next != STORE_NONE)
    s->ents[x->next].prev = x->prev;
  else
    s->tail = x->prev;
}

static void store_link_tail(replay_store *s, uint32_t e) {
  s->ents[e].prev = s->tail;
  s->ents[e].next = STORE_NONE;
  if (s->tail != STORE_NONE)
    s->ents[s->tail].next = e;
  else
    s->head = e;
  s->tail = e;
}

static void store_to_tail(replay_store *s, uint32_t e) {
  if (s->tail != e) {
    store_unlink(s, e);
    store_link_tail(s, e);
  }
}

/* Empties table position i, shifting back the entries probed past it. */
static void store_table_del(replay_store *s, uint64_t i) {
  uint64_t j = i;
  for (;;) {
    j = (j + 1) & s->mask;
    if (s->table[j] == 0)
      break;
    uint64_t k = store_home(s, store_mix(s->ents[(uint32_t)s->table[j] - 1].h));
    /* The entry at j may move to i when its home k is not in (i, j]. */
    if (i <= j ? (k <= i || k > j) : (k <= i && k > j)) {
      s->table[i] = s->table[j];
      i = j;
    }
  }
  s->table[i] = 0;
}

int replay_store_create(uint64_t blocks, replay_store **out) {
  replay_store *s;
  uint64_t size = 16;
  unsigned bits = 4;

  *out = NULL;
  if (blocks == 0 || blocks >= STORE_NONE / 2)
    return KVS_EINVAL;
  while (size < 2 * blocks) {
    size <<= 1;
    bits++;
  }
  s = calloc(1, sizeof(*s));
  if (s == NULL)
    return KVS_ENOMEM;
  s->cap = (uint32_t)blocks;
  s->shift = 64 - bits;
  s->mask = size - 1;
  s->head = s->tail = STORE_NONE;
  s->st.slots = blocks;
  s->table = calloc(size, sizeof(*s->table));
  s->ents = malloc(blocks * sizeof(*s->ents));
  if (s->table == NULL || s->ents == NULL) {
    replay_store_destroy(s);
    return KVS_ENOMEM;
  }
  *out = s;
  return 0;
}

void replay_store_destroy(replay_store *s) {
  if (s == NULL)
    return;
  free(s->table);
  free(s->ents);
  free(s);
}

void replay_store_put(replay_store *s, kvs_hash128 h) {
  uint64_t i = store_pos(s, h);
  uint32_t e;

  s->st.writes++;
  if (s->table[i] != 0) { /* held: now the most recent */
    store_to_tail(s, (uint32_t)s->table[i] - 1);
    return;
  }
  s->st.inserts++;
  if (s->used == s->cap) { /* full: the least recent goes */
    e = s->head;
    store_unlink(s, e);
    store_table_del(s, store_pos(s, s->ents[e].h));
    s->st.drops++;
    i = store_pos(s, h); /* the deletion may have moved h's probe end */
  } else {
    e = s->used++;
  }
  s->ents[e].h = h;
  s->table[i] = (store_mix(h) << 32) | (e + 1);
  store_link_tail(s, e);
}

uint32_t replay_store_run(const replay_store *s, const kvs_hash128 *h,
                          uint32_t n) {
  uint32_t k = 0;
  while (k < n && s->table[store_pos(s, h[k])] != 0)
    k++;
  return k;
}

void replay_store_touch(replay_store *s, const kvs_hash128 *h, uint32_t n) {
  for (uint32_t k = 0; k < n; k++) {
    uint64_t x = s->table[store_pos(s, h[k])];
    if (x == 0)
      continue; /* not held: the caller's mistake, nothing to touch */
    store_to_tail(s, (uint32_t)x - 1);
    s->st.hit_blocks++;
  }
}

void replay_store_get_stats(const replay_store *s, replay_store_stats *st) {
  *st = s->st;
  st->used = s->used;
}

/* ---- routing ---- */

/* splitmix64's finalizer: the record's node under --split prefix is
 * mix(its id at depth prefix_blocks) % N (tests/bench/replay_nodes_ref.py
 * does the same). */
static uint64_t nodes_mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void replay_route(const trace *t, const replay_nodes_config *nc,
                  uint32_t *out) {
  for (size_t i = 0; i < t->num_recs; i++) {
    const trace_rec *r = &t->recs[i];
    if (nc->split == REPLAY_SPLIT_PREFIX) {
      uint32_t d = nc->prefix_blocks < r->num_hash_ids ? nc->prefix_blocks
                                                       : r->num_hash_ids;
      out[i] =
          (uint32_t)(nodes_mix(trace_rec_hash_ids(t, r)[d - 1]) % nc->nodes);
    } else {
      out[i] = (uint32_t)(i % nc->nodes);
    }
  }
}

/* ---- one run of the N nodes ---- */

typedef struct nodes_run {
  replay_result *node; /* per node */
  replay_result total;
  replay_store_stats store; /* with a store */
  double seconds;           /* wall time of the run */
} nodes_run;

/* The nodes over t, above a store of store_blocks (0: none). */
static int nodes_replay(const trace *t, const replay_config *cfg,
                        const uint32_t *route, uint32_t n, uint32_t nb,
                        const replay_plan *plan, uint64_t store_blocks,
                        nodes_run *run) {
  const char *pol = cfg->policy != NULL ? cfg->policy : REPLAY_DEFAULT_POLICY;
  size_t step = t->num_recs / 200 + 1;
  replay_store *store = NULL;
  core **cores = calloc(n, sizeof(*cores));
  replay_runner **runners = calloc(n, sizeof(*runners));
  double t0 = replay_now();
  char msg[256];
  int rc = KVS_ENOMEM;

  memset(run->node, 0, n * sizeof(*run->node));
  memset(&run->total, 0, sizeof(run->total));
  memset(&run->store, 0, sizeof(run->store));
  if (cores == NULL || runners == NULL) {
    fprintf(stderr, "kvshare-replay: %s\n", kvs_strerror(rc));
    goto out;
  }
  if (store_blocks > 0 &&
      (rc = replay_store_create(store_blocks, &store)) != 0) {
    fprintf(stderr,
            "kvshare-replay: cannot create a remote store of %" PRIu64
            " blocks: %s\n",
            store_blocks, kvs_strerror(rc));
    goto out;
  }
  for (uint32_t k = 0; k < n; k++) {
    rc = replay_core_create(cfg, nb, plan, &cores[k]);
    if (rc == 0)
      rc = replay_runner_create(cores[k], t, cfg, route, k, store, &runners[k]);
    if (rc != 0) {
      fprintf(stderr,
              "kvshare-replay: cannot create node %u (%u blocks, "
              "policy '%s'): %s\n",
              k, nb, pol, kvs_strerror(rc));
      goto out;
    }
  }
  for (size_t i = 0; i < t->num_recs; i++) {
    rc = replay_runner_step(runners[route[i]], i, &run->node[route[i]]);
    if (rc != 0) {
      fprintf(stderr,
              "kvshare-replay: core error on node %u (policy '%s'): "
              "%s\n",
              route[i], pol, kvs_strerror(rc));
      goto out;
    }
    if (cfg->progress && (i % step == 0 || i + 1 == t->num_recs))
      replay_progress(i + 1, t->num_recs, t0);
  }
  run->seconds = replay_now() - t0;
  for (uint32_t k = 0; k < n; k++) {
    replay_runner_finish(runners[k], &run->node[k]);
    runners[k] = NULL;
    if (core_check(cores[k], msg, sizeof(msg)) != 0) {
      fprintf(stderr,
              "kvshare-replay: core invariant broken on node %u "
              "(policy '%s'): %s\n",
              k, pol, msg);
      rc = KVS_EINTERNAL;
      goto out;
    }
    replay_result_add(&run->total, &run->node[k]);
  }
  if (store != NULL)
    replay_store_get_stats(store, &run->store);
out:
  replay_runners_free(cores, runners, n);
  replay_store_destroy(store);
  return rc;
}

/* ---- output ---- */

static uint64_t nodes_device_hits(const replay_result *r) {
  return r->hit_tokens - r->tier_hit_tokens[CORE_TIER_HOST] -
         r->tier_hit_tokens[CORE_TIER_DISK] - r->remote_hit_tokens;
}

static double nodes_ideal(const replay_plan *plan) {
  return plan->query_tokens
             ? (double)plan->ideal_hit_tokens / (double)plan->query_tokens
             : 0.0;
}

/* "rr (record i -> node i mod 4)" and the like (detail), or "rr". */
static void nodes_split_name(const replay_nodes_config *nc, int detail,
                             char *buf, size_t len) {
  if (nc->split == REPLAY_SPLIT_RR)
    snprintf(buf, len, detail ? "rr (record i -> node i mod %u)" : "rr",
             nc->nodes);
  else if (nc->prefix_blocks == 1)
    snprintf(buf, len,
             detail ? "prefix (node = mix(first hash id) mod %u)" : "prefix",
             nc->nodes);
  else
    snprintf(buf, len,
             detail ? "prefix:%u (node = mix(hash id at depth %u) "
                      "mod %u)"
                    : "prefix:%u",
             nc->prefix_blocks, nc->prefix_blocks, nc->nodes);
}

/* The columns of one run: hit rate, then each source's share. */
static void nodes_cells(const replay_result *r, int tiers, int remote) {
  printf("  %7.4f  %7.4f", replay_token_hit_rate(r),
         replay_share(r, nodes_device_hits(r)));
  if (tiers)
    printf(" %7.4f %7.4f", replay_share(r, r->tier_hit_tokens[CORE_TIER_HOST]),
           replay_share(r, r->tier_hit_tokens[CORE_TIER_DISK]));
  if (remote)
    printf(" %7.4f", replay_share(r, r->remote_hit_tokens));
}

static void nodes_row(const char *name, const replay_result *a,
                      const replay_result *b, int tiers) {
  printf("%-6s %9" PRIu64 " %13" PRIu64, name, a->requests, a->query_tokens);
  nodes_cells(a, tiers, 0);
  if (b != NULL) {
    printf("  |");
    nodes_cells(b, tiers, 1);
    printf("  %+8.4f", replay_token_hit_rate(b) - replay_token_hit_rate(a));
  }
  printf("\n");
}

static void nodes_header(int tiers, int remote) {
  const char *src = tiers ? "   device    host    disk" : "   device";
  printf("%-6s %9s %13s  %7s%s", "node", "requests", "prompt tokens",
         remote ? "alone" : "hit", src);
  if (remote)
    printf("  |  %7s%s  remote      gain", "shared", src);
  printf("\n");
}

static void nodes_print_text(const char *path, const trace *t,
                             const replay_config *cfg, const replay_plan *plan,
                             const replay_nodes_config *nc, uint32_t nb,
                             uint64_t store_blocks, const nodes_run *base,
                             const nodes_run *rem) {
  int tiers =
      cfg->tier_tokens[CORE_TIER_HOST] || cfg->tier_tokens[CORE_TIER_DISK];
  char split[128], name[16];

  nodes_split_name(nc, 1, split, sizeof(split));
  printf("trace           %s: %zu requests, %" PRIu64 " prompt tokens, %" PRIu64
         " output tokens\n",
         path, t->num_recs, t->input_tokens, t->output_tokens);
  printf("nodes           %u, split %s\n", nc->nodes, split);
  printf("pool            %" PRIu64 " tokens = %u blocks of %u tokens%s per "
         "node, policy %s, decode %s\n",
         (uint64_t)nb * cfg->block_size, nb, cfg->block_size,
         cfg->capacity_tokens ? "" : " (unlimited: holds the whole trace)",
         cfg->policy ? cfg->policy : REPLAY_DEFAULT_POLICY,
         cfg->decode ? "on" : "off");
  for (int k = 0; k < CORE_TIERS; k++)
    if (cfg->tier_tokens[k])
      printf("%s tier       %" PRIu64 " tokens = %u slots per node\n",
             k == CORE_TIER_HOST ? "host" : "disk",
             (uint64_t)base->total.tiers[k].slots / nc->nodes * cfg->block_size,
             base->total.tiers[k].slots / nc->nodes);
  if (rem != NULL)
    printf("remote tier     %s%" PRIu64 " tokens = %" PRIu64 " blocks, "
           "shared: LRU, every sealed block written through\n",
           nc->remote_tokens == UINT64_MAX ? "unlimited: " : "",
           store_blocks * cfg->block_size, store_blocks);
  else
    printf("remote tier     none\n");
  printf("ideal           %.4f  token hit rate of one unlimited cache of the "
         "whole trace (from hash ids)\n",
         nodes_ideal(plan));
  printf("\ntoken hit rate per node%s; then the share of prompt tokens hit "
         "in each place\n",
         rem != NULL ? ": alone (no remote tier) and shared (the remote tier)"
                     : "");
  nodes_header(tiers, rem != NULL);
  for (uint32_t k = 0; k < nc->nodes; k++) {
    snprintf(name, sizeof(name), "%u", k);
    nodes_row(name, &base->node[k], rem != NULL ? &rem->node[k] : NULL, tiers);
  }
  nodes_row("total", &base->total, rem != NULL ? &rem->total : NULL, tiers);
  printf("\n");
  if (base->total.refused || (rem != NULL && rem->total.refused))
    printf("refused         %" PRIu64 " requests (a prompt larger than a "
           "node's pool: all-miss)\n",
           base->total.refused);
  printf("evictions       %" PRIu64 " blocks%s", base->total.stats.evictions,
         rem != NULL ? " alone" : "");
  if (rem != NULL)
    printf(", %" PRIu64 " shared", rem->total.stats.evictions);
  printf(" (all nodes)\n");
  if (rem != NULL) {
    const replay_store_stats *s = &rem->store;
    printf("remote store    %" PRIu64 " of %" PRIu64 " blocks used; %" PRIu64
           " writes (%" PRIu64 " new), %" PRIu64 " dropped, %" PRIu64
           " blocks read\n",
           s->used, s->slots, s->writes, s->inserts, s->drops, s->hit_blocks);
    printf("time            %.2f s alone + %.2f s shared\n", base->seconds,
           rem->seconds);
  } else {
    printf("time            %.2f s\n", base->seconds);
  }
}

static json_t *nodes_json_res(const replay_result *r) {
  return json_pack(
      "{s:I, s:I, s:I, s:I, s:I, s:f, s:I, s:I, s:I, s:I, s:I}", "requests",
      (json_int_t)r->requests, "served", (json_int_t)r->served, "refused",
      (json_int_t)r->refused, "query_tokens", (json_int_t)r->query_tokens,
      "hit_tokens", (json_int_t)r->hit_tokens, "token_hit_rate",
      replay_token_hit_rate(r), "device_hit_tokens",
      (json_int_t)nodes_device_hits(r), "host_hit_tokens",
      (json_int_t)r->tier_hit_tokens[CORE_TIER_HOST], "disk_hit_tokens",
      (json_int_t)r->tier_hit_tokens[CORE_TIER_DISK], "remote_hit_tokens",
      (json_int_t)r->remote_hit_tokens, "evictions",
      (json_int_t)r->stats.evictions);
}

/* One run: its total's fields, seconds, per_node, and the store's. */
static json_t *nodes_json_run(const nodes_run *run, uint32_t n, int store) {
  json_t *o = nodes_json_res(&run->total), *per = json_array(), *x;
  if (o == NULL || per == NULL)
    goto fail;
  for (uint32_t k = 0; k < n; k++) {
    x = nodes_json_res(&run->node[k]);
    if (x == NULL)
      goto fail;
    if (json_object_set_new(x, "node", json_integer(k)) != 0) {
      json_decref(x);
      goto fail;
    }
    if (json_array_append_new(per, x) != 0) /* takes x either way */
      goto fail;
  }
  if (json_object_set_new(o, "seconds", json_real(run->seconds)) != 0)
    goto fail;
  x = per; /* set_new takes it, even when it fails */
  per = NULL;
  if (json_object_set_new(o, "per_node", x) != 0)
    goto fail;
  if (store) {
    const replay_store_stats *s = &run->store;
    x = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I}", "slots",
                  (json_int_t)s->slots, "used", (json_int_t)s->used, "writes",
                  (json_int_t)s->writes, "inserts", (json_int_t)s->inserts,
                  "drops", (json_int_t)s->drops, "hit_blocks",
                  (json_int_t)s->hit_blocks);
    if (x == NULL || json_object_set_new(o, "store", x) != 0)
      goto fail;
  }
  return o;
fail:
  json_decref(per);
  json_decref(o);
  return NULL;
}

static int nodes_print_json(const char *path, const trace *t,
                            const replay_config *cfg, const replay_plan *plan,
                            const replay_nodes_config *nc, uint32_t nb,
                            uint64_t store_blocks, const nodes_run *base,
                            const nodes_run *rem) {
  char split[32];
  json_t *b = NULL, *r = NULL, *o;
  int rc;

  nodes_split_name(nc, 0, split, sizeof(split));
  b = nodes_json_run(base, nc->nodes, 0);
  r = rem != NULL ? nodes_json_run(rem, nc->nodes, 1) : json_null();
  if (b == NULL || r == NULL) {
    json_decref(b);
    json_decref(r);
    return -1;
  }
  o = json_pack(
      "{s:s, s:I, s:I, s:s, s:I, s:I, s:b, s:s, s:b, s:I, s:I, s:I,"
      " s:I, s:b, s:I, s:f, s:o, s:o, s:f}",
      "trace", path, "records", (json_int_t)t->num_recs, "nodes",
      (json_int_t)nc->nodes, "split", split, "capacity_tokens",
      (json_int_t)nb * cfg->block_size, "num_blocks", (json_int_t)nb,
      "unlimited", cfg->capacity_tokens == 0, "policy",
      cfg->policy ? cfg->policy : REPLAY_DEFAULT_POLICY, "decode",
      cfg->decode != 0, "block_size", (json_int_t)cfg->block_size,
      "host_tier_tokens", (json_int_t)cfg->tier_tokens[CORE_TIER_HOST],
      "disk_tier_tokens", (json_int_t)cfg->tier_tokens[CORE_TIER_DISK],
      "remote_tier_tokens", (json_int_t)store_blocks * cfg->block_size,
      "remote_unlimited", nc->remote_tokens == UINT64_MAX, "query_tokens",
      (json_int_t)plan->query_tokens, "ideal_token_hit_rate", nodes_ideal(plan),
      "alone", b, "shared", r, "gain",
      rem != NULL ? replay_token_hit_rate(&rem->total) -
                        replay_token_hit_rate(&base->total)
                  : 0.0);
  if (o == NULL)
    return -1; /* json_pack stole b and r */
  rc = json_dumpf(o, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  fputc('\n', stdout);
  json_decref(o);
  return rc;
}

int replay_nodes(const trace *t, const char *path, const replay_config *cfg,
                 const replay_plan *plan, const replay_nodes_config *nc,
                 int json) {
  uint32_t n = nc->nodes, nb, *route = NULL;
  uint64_t store_blocks = 0;
  nodes_run base = {0}, rem = {0};
  int rc = KVS_ENOMEM;

  if (replay_pool_blocks(cfg, plan, &nb) != 0) {
    fprintf(stderr,
            "kvshare-replay: a pool of %" PRIu64 " tokens is not "
            "1 .. 2^32-2 blocks of %u tokens\n",
            cfg->capacity_tokens ? cfg->capacity_tokens
                                 : plan->unlimited_blocks,
            cfg->block_size);
    return KVS_EINVAL;
  }
  if (nc->remote_tokens > 0) {
    /* More than the trace can fill would never fill (as the tiers). */
    store_blocks = nc->remote_tokens == UINT64_MAX
                       ? plan->unlimited_blocks
                       : nc->remote_tokens / cfg->block_size;
    if (store_blocks > plan->unlimited_blocks)
      store_blocks = plan->unlimited_blocks;
    if (store_blocks == 0 || store_blocks >= STORE_NONE / 2) {
      fprintf(stderr,
              "kvshare-replay: a remote tier of %" PRIu64 " tokens "
              "is not 1 .. 2^31-2 blocks of %u tokens\n",
              nc->remote_tokens, cfg->block_size);
      return KVS_EINVAL;
    }
  }
  route = malloc(t->num_recs * sizeof(*route));
  base.node = calloc(n, sizeof(*base.node));
  rem.node = calloc(n, sizeof(*rem.node));
  if (route == NULL || base.node == NULL || rem.node == NULL) {
    fprintf(stderr, "kvshare-replay: %s\n", kvs_strerror(rc));
    goto out;
  }
  replay_route(t, nc, route);
  if ((rc = nodes_replay(t, cfg, route, n, nb, plan, 0, &base)) != 0)
    goto out;
  if (store_blocks > 0 &&
      (rc = nodes_replay(t, cfg, route, n, nb, plan, store_blocks, &rem)) != 0)
    goto out;
  if (json) {
    rc = nodes_print_json(path, t, cfg, plan, nc, nb, store_blocks, &base,
                          store_blocks > 0 ? &rem : NULL);
    if (rc != 0)
      fprintf(stderr, "kvshare-replay: cannot write JSON\n");
  } else {
    nodes_print_text(path, t, cfg, plan, nc, nb, store_blocks, &base,
                     store_blocks > 0 ? &rem : NULL);
  }
out:
  free(route);
  free(base.node);
  free(rem.node);
  return rc;
}
