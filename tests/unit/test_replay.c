/*
 * test_replay.c — the trace reader and kvshare-replay's replay
 * (tools/replay/trace.c, tools/replay/replay.c) over hand-made traces and
 * the two Mooncake traces.
 *
 * The main check: at unlimited capacity the core's token hit rate equals the
 * trace's ideal, which this file computes on its own from hash_ids alone (no
 * core, and not replay_plan_make's arithmetic either).  Every test ends with
 * core_check() == 0 and every request freed.
 *
 * The traces are read from ../shared/traces (relative to the repo root, the
 * cwd of `make test`); the tests that need them skip when they are missing.
 * Under a sanitizer only the first records of each trace are replayed.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvs_asan.h"
#include "tools/replay/replay.h"
#include "tools/replay/trace.h"


#define TRACE_DIR "../shared/traces"
/* Records replayed per trace under a sanitizer (0 = all). */
#define SAN_LIMIT 1500

static int skipped;

/* ---- helpers ---- */

/* Writes text to a fresh temporary file; returns its path (free it). */
static char *tmp_file(const char *text) {
  const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  size_t len = strlen(dir) + 32;
  char *path = malloc(len);
  assert_non_null(path);
  snprintf(path, len, "%s/kvs-trace-XXXXXX", dir);
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  size_t n = strlen(text);
  assert_int_equal(write(fd, text, n), (ssize_t)n);
  close(fd);
  return path;
}

static trace *load_text(const char *text) {
  char *path = tmp_file(text);
  char err[256];
  trace *t = NULL;
  int rc = trace_load(path, 0, &t, err, sizeof(err));
  unlink(path);
  free(path);
  if (rc != 0)
    fail_msg("trace_load: %s", err);
  return t;
}

static int load_error(const char *text, char *err, size_t err_len) {
  char *path = tmp_file(text);
  trace *t = NULL;
  int rc = trace_load(path, 0, &t, err, err_len);
  unlink(path);
  free(path);
  assert_null(t);
  return rc;
}

static void check_and_destroy(core *c) {
  char msg[256];
  core_stats st;
  if (core_check(c, msg, sizeof(msg)) != 0)
    fail_msg("core invariant: %s", msg);
  core_get_stats(c, &st);
  assert_int_equal(st.num_requests, 0);
  assert_int_equal(st.used_blocks, 0);
  assert_int_equal(st.free_blocks + st.cached_blocks, st.num_blocks);
  core_destroy(c);
}

/* Runs a replay of t with cfg into *res and checks the core afterwards. */
static void run(const trace *t, const replay_config *cfg, replay_result *res,
                replay_plan *plan) {
  uint32_t nb;
  core *c;
  assert_int_equal(replay_plan_make(t, cfg, plan), 0);
  assert_int_equal(replay_pool_blocks(cfg, plan, &nb), 0);
  assert_int_equal(replay_core_create(cfg, nb, NULL, &c), 0);
  assert_int_equal(replay_run(c, t, cfg, res), 0);
  assert_int_equal(res->requests, t->num_recs);
  assert_int_equal(res->served + res->refused, res->requests);
  check_and_destroy(c);
}

/*
 * The ideal hit tokens of an infinite prefix cache, from hash ids alone.
 *
 * A block of bs tokens is named by the trace block that holds its last token
 * and that token's offset there: the ids are chained, so (id, offset) names
 * the whole prefix up to that token.  A bitmap over (id, offset) records the
 * full blocks earlier requests wrote.  A request hits its blocks in order
 * while they are in the bitmap, and never the block holding its last token
 * (at least one token is computed: blocks whose end is <= n - 1).
 */
static uint64_t ideal_hit_tokens(const trace *t, uint32_t bs) {
  size_t bits = ((size_t)t->max_hash_id + 1) * TRACE_BLOCK_TOKENS;
  uint8_t *seen = calloc(bits / 8 + 1, 1);
  uint64_t hits = 0;
  assert_non_null(seen);
  for (size_t i = 0; i < t->num_recs; i++) {
    const trace_rec *r = &t->recs[i];
    const uint32_t *ids = trace_rec_hash_ids(t, r);
    uint64_t n = r->input_length;
    for (uint64_t end = bs; end <= n - 1; end += bs) {
      size_t key = (size_t)ids[(end - 1) / TRACE_BLOCK_TOKENS] *
                       TRACE_BLOCK_TOKENS + (end - 1) % TRACE_BLOCK_TOKENS;
      if (!(seen[key / 8] & (1u << (key % 8))))
        break;
      hits += bs;
    }
    for (uint64_t end = bs; end <= n; end += bs) {
      size_t key = (size_t)ids[(end - 1) / TRACE_BLOCK_TOKENS] *
                       TRACE_BLOCK_TOKENS + (end - 1) % TRACE_BLOCK_TOKENS;
      seen[key / 8] |= (uint8_t)(1u << (key % 8));
    }
  }
  free(seen);
  return hits;
}

static trace *load_mooncake(const char *name) {
  char path[256], err[256];
  trace *t = NULL;
  snprintf(path, sizeof(path), TRACE_DIR "/%s", name);
  if (access(path, R_OK) != 0) {
    print_message("skipped: %s not found (run from the repo root with "
                  "../shared/traces beside it)\n", path);
    skipped++;
    return NULL;
  }
  int rc = trace_load(path, KVS_ASAN ? SAN_LIMIT : 0, &t, err, sizeof(err));
  if (rc != 0)
    fail_msg("trace_load(%s): %s", path, err);
  return t;
}

/* ---- the reader ---- */

static void test_trace_parse(void **state) {
  (void)state;
  /* Out of timestamp order, a blank line, a partial last block. */
  trace *t = load_text(
      "{\"timestamp\": 20, \"input_length\": 600, \"output_length\": 5, "
      "\"hash_ids\": [0, 2]}\n"
      "\n"
      "{\"timestamp\": 10, \"input_length\": 512, \"output_length\": 7, "
      "\"hash_ids\": [0]}\n"
      "{\"timestamp\": 20, \"input_length\": 1, \"output_length\": 0, "
      "\"hash_ids\": [1]}\n");
  assert_int_equal(t->num_recs, 3);
  assert_int_equal(t->num_hash_ids, 4);
  assert_int_equal(t->max_hash_id, 2);
  assert_int_equal(t->max_input_length, 600);
  assert_int_equal(t->input_tokens, 1113);
  assert_int_equal(t->output_tokens, 12);
  /* Sorted by timestamp, file order on ties. */
  assert_int_equal(t->recs[0].timestamp, 10);
  assert_int_equal(t->recs[0].line, 3);
  assert_int_equal(t->recs[1].line, 1);
  assert_int_equal(t->recs[2].line, 4);
  assert_int_equal(t->recs[1].num_hash_ids, 2);
  assert_int_equal(trace_rec_hash_ids(t, &t->recs[1])[1], 2);

  /* Same id, same tokens; the partial block is cut to input_length. */
  uint32_t a[600], b[512];
  trace_rec_tokens(t, &t->recs[1], a);
  trace_rec_tokens(t, &t->recs[0], b);
  assert_memory_equal(a, b, sizeof(b));
  assert_int_equal(a[512], trace_token(2, 0));
  assert_int_equal(a[599], trace_token(2, 87));
  /* Different ids and offsets give different tokens here. */
  assert_int_not_equal(trace_token(0, 0), trace_token(1, 0));
  assert_int_not_equal(trace_token(0, 0), trace_token(0, 1));
  trace_free(t);
}

static void test_trace_errors(void **state) {
  (void)state;
  char err[256];
  trace *t = NULL;
  assert_int_equal(trace_load("/nonexistent/kvs-trace", 0, &t, err,
                              sizeof(err)),
                   -ENOENT);
  assert_null(t);
  /* Wrong number of hash ids for input_length, on line 2. */
  assert_int_equal(
      load_error("{\"timestamp\": 0, \"input_length\": 5, \"output_length\": "
                 "1, \"hash_ids\": [0]}\n"
                 "{\"timestamp\": 0, \"input_length\": 513, "
                 "\"output_length\": 1, \"hash_ids\": [1]}\n",
                 err, sizeof(err)),
      KVS_EINVAL);
  assert_non_null(strstr(err, "line 2"));
  assert_int_equal(load_error("not json\n", err, sizeof(err)), KVS_EINVAL);
  assert_int_equal(load_error("[1, 2]\n", err, sizeof(err)), KVS_EINVAL);
  assert_int_equal(load_error("{\"timestamp\": 0, \"input_length\": 0, "
                              "\"output_length\": 1, \"hash_ids\": []}\n",
                              err, sizeof(err)),
                   KVS_EINVAL);
  assert_int_equal(load_error("{\"timestamp\": 0, \"input_length\": 4, "
                              "\"output_length\": 1, \"hash_ids\": [-3]}\n",
                              err, sizeof(err)),
                   KVS_EINVAL);
  assert_int_equal(load_error("{\"timestamp\": 0, \"input_length\": 4, "
                              "\"hash_ids\": [0]}\n",
                              err, sizeof(err)),
                   KVS_EINVAL);
  assert_non_null(strstr(err, "output_length"));
  assert_int_equal(load_error("\n\n", err, sizeof(err)), KVS_EINVAL);
}

/* ---- the replay on a hand-made trace ---- */

/*
 *   A  1024 tokens  [0, 1]      nothing cached
 *   B  1030 tokens  [0, 1, 2]   hits A's 64 blocks (1024 tokens)
 *   C   600 tokens  [0, 3]      hits trace block 0: 32 blocks (512)
 *   D   512 tokens  [0]         31 blocks: never the block of the last token
 */
static const char *small_trace =
    "{\"timestamp\": 0, \"input_length\": 1024, \"output_length\": 20, "
    "\"hash_ids\": [0, 1]}\n"
    "{\"timestamp\": 1, \"input_length\": 1030, \"output_length\": 3, "
    "\"hash_ids\": [0, 1, 2]}\n"
    "{\"timestamp\": 2, \"input_length\": 600, \"output_length\": 40, "
    "\"hash_ids\": [0, 3]}\n"
    "{\"timestamp\": 3, \"input_length\": 512, \"output_length\": 1, "
    "\"hash_ids\": [0]}\n";

static void test_replay_small_unlimited(void **state) {
  (void)state;
  trace *t = load_text(small_trace);
  replay_config cfg;
  replay_plan plan;
  replay_result res;
  replay_config_init(&cfg);
  run(t, &cfg, &res, &plan);
  assert_int_equal(res.served, 4);
  assert_int_equal(res.refused, 0);
  assert_int_equal(res.query_tokens, 3166);
  assert_int_equal(res.hit_tokens, 1024 + 512 + 496);
  assert_int_equal(plan.ideal_hit_tokens, 1024 + 512 + 496);
  assert_int_equal(ideal_hit_tokens(t, 16), 1024 + 512 + 496);
  assert_int_equal(res.hit_blocks, 64 + 32 + 31);
  assert_int_equal(res.lookup_blocks, 63 + 64 + 37 + 31);
  /* Distinct full blocks: 64 (A) + 0 (B's partial) + 5 (C's id 3). */
  assert_int_equal(plan.distinct_blocks, 69);
  assert_int_equal(res.stats.evictions, 0);
  assert_true(res.peak_resident <= plan.unlimited_blocks);
  trace_free(t);
}

static void test_replay_small_capacity(void **state) {
  (void)state;
  trace *t = load_text(small_trace);
  replay_config cfg;
  replay_plan plan;
  replay_result res;
  replay_config_init(&cfg);
  /* 60 blocks: A (64 blocks) and B (65) do not fit and are refused; C runs
   * with nothing cached, D hits C's first 31 blocks. */
  cfg.capacity_tokens = 60 * 16 + 7;
  run(t, &cfg, &res, &plan);
  assert_int_equal(res.stats.num_blocks, 60);
  assert_int_equal(res.refused, 2);
  assert_int_equal(res.refused_tokens, 1024 + 1030);
  assert_int_equal(res.served, 2);
  assert_int_equal(res.query_tokens, 3166);
  assert_int_equal(res.hit_tokens, 496);
  /* Refused records miss every block they could have hit. */
  assert_int_equal(res.lookup_blocks, 63 + 64 + 37 + 31);
  assert_int_equal(res.hit_blocks, 31);

  /* Decode: C's 600 + 40 tokens fill 40 blocks, D's 513 fit too. */
  cfg.decode = 1;
  run(t, &cfg, &res, &plan);
  assert_int_equal(res.refused, 2);
  assert_int_equal(res.decode_tokens, 41);
  assert_int_equal(res.decode_truncated, 0);
  assert_int_equal(res.hit_tokens, 496);

  /* 38 blocks: C's decode runs out after 8 tokens (608 = 38 * 16). */
  cfg.capacity_tokens = 38 * 16;
  run(t, &cfg, &res, &plan);
  assert_int_equal(res.refused, 2);
  assert_int_equal(res.decode_truncated, 1);
  assert_int_equal(res.decode_tokens, 8 + 1);
  trace_free(t);
}

static void test_replay_block_sizes(void **state) {
  (void)state;
  /* Block sizes that do not divide 512 still match the ideal exactly. */
  trace *t = load_text(small_trace);
  static const uint32_t sizes[] = {1, 7, 24, 100, 512, 1000};
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    replay_config cfg;
    replay_plan plan;
    replay_result res;
    replay_config_init(&cfg);
    cfg.block_size = sizes[i];
    run(t, &cfg, &res, &plan);
    assert_int_equal(res.hit_tokens, ideal_hit_tokens(t, sizes[i]));
    assert_int_equal(plan.ideal_hit_tokens, res.hit_tokens);
    assert_int_equal(res.stats.evictions, 0);
  }
  trace_free(t);
}

/* ---- the Mooncake traces ---- */

static void replay_ideal(const char *name) {
  trace *t = load_mooncake(name);
  if (t == NULL)
    return;
  replay_config cfg;
  replay_plan plan;
  replay_result res;
  replay_config_init(&cfg);
  run(t, &cfg, &res, &plan);

  uint64_t ideal = ideal_hit_tokens(t, cfg.block_size);
  double rate = replay_token_hit_rate(&res);
  double ideal_rate = (double)ideal / (double)t->input_tokens;
  print_message("%s (%zu records): core %.6f (%llu tokens), ideal %.6f "
                "(%llu tokens), pool %llu blocks, peak %llu, distinct %llu\n",
                name, t->num_recs, rate, (unsigned long long)res.hit_tokens,
                ideal_rate, (unsigned long long)ideal,
                (unsigned long long)plan.unlimited_blocks,
                (unsigned long long)res.peak_resident,
                (unsigned long long)plan.distinct_blocks);
  assert_int_equal(res.refused, 0);
  assert_int_equal(res.stats.evictions, 0);
  assert_true(res.peak_resident <= plan.unlimited_blocks);
  assert_true(rate - ideal_rate < 0.01 && ideal_rate - rate < 0.01);
  /* In fact they are equal: the core can only differ from the ideal through
   * a 128-bit hash collision or a whole block of 32-bit trace_token()
   * collisions under the same parent, neither of which happens here. */
  assert_int_equal(res.hit_tokens, ideal);
  assert_int_equal(plan.ideal_hit_tokens, ideal);
  trace_free(t);
}

static void test_replay_conversation_ideal(void **state) {
  (void)state;
  replay_ideal("conversation_trace.jsonl");
}

static void test_replay_synthetic_ideal(void **state) {
  (void)state;
  replay_ideal("synthetic_trace.jsonl");
}

/* A bounded pool over a real trace: prompts larger than the pool are
 * refused (and counted), eviction happens, hits stay under the ideal. */
static void test_replay_synthetic_bounded(void **state) {
  (void)state;
  trace *t = load_mooncake("synthetic_trace.jsonl");
  if (t == NULL)
    return;
  static const uint64_t caps[] = {20000, 200000, 2000000};
  for (size_t i = 0; i < sizeof(caps) / sizeof(caps[0]); i++) {
    replay_config cfg;
    replay_plan plan;
    replay_result res;
    uint64_t too_big = 0, too_big_tokens = 0;
    replay_config_init(&cfg);
    cfg.capacity_tokens = caps[i];
    cfg.decode = i == 1;
    run(t, &cfg, &res, &plan);
    for (size_t k = 0; k < t->num_recs; k++) {
      uint64_t n = t->recs[k].input_length;
      if ((n + 15) / 16 > caps[i] / 16) {
        too_big++;
        too_big_tokens += n;
      }
    }
    print_message("synthetic, %llu tokens%s: hit rate %.4f, %llu refused, "
                  "%llu evictions\n",
                  (unsigned long long)caps[i], cfg.decode ? ", decode" : "",
                  replay_token_hit_rate(&res),
                  (unsigned long long)res.refused,
                  (unsigned long long)res.stats.evictions);
    assert_int_equal(res.refused, too_big);
    assert_int_equal(res.refused_tokens, too_big_tokens);
    assert_true(res.hit_tokens <= plan.ideal_hit_tokens);
    assert_true(res.stats.evictions > 0);
    assert_true(res.peak_resident <= caps[i] / 16);
  }
  trace_free(t);
}

/* Tiers below the pool, against the plain LRU cache of the whole
 * capacity: an evicted block goes down, a hit below comes back up, so the
 * hierarchy hits (within 0.01) what one LRU pool of the sum does.  And
 * with LRU the device's own contents do not depend on where a hit came
 * from: the device hits are exactly those of the pool alone. */
static void test_replay_synthetic_tiers(void **state) {
  (void)state;
  trace *t = load_mooncake("synthetic_trace.jsonl");
  if (t == NULL)
    return;
  static const uint64_t dev = 200000, host = 1800000, disk = 20000000;
  replay_config cfg;
  replay_plan plan;
  replay_result alone, two, three, flat2, flat3;

  replay_config_init(&cfg);
  cfg.policy = "lru"; /* the tiers are LRU: the equality is LRU's */
  cfg.capacity_tokens = dev;
  run(t, &cfg, &alone, &plan);
  cfg.capacity_tokens = dev + host;
  run(t, &cfg, &flat2, &plan);
  cfg.capacity_tokens = dev + host + disk;
  run(t, &cfg, &flat3, &plan);
  cfg.capacity_tokens = dev;
  cfg.tier_tokens[CORE_TIER_HOST] = host;
  run(t, &cfg, &two, &plan);
  cfg.tier_tokens[CORE_TIER_DISK] = disk;
  run(t, &cfg, &three, &plan);
  print_message("synthetic: device %.4f, +host %.4f (flat %.4f), +disk %.4f "
                "(flat %.4f)\n", replay_token_hit_rate(&alone),
                replay_token_hit_rate(&two), replay_token_hit_rate(&flat2),
                replay_token_hit_rate(&three), replay_token_hit_rate(&flat3));
  assert_true(fabs(replay_token_hit_rate(&two) -
                   replay_token_hit_rate(&flat2)) <= 0.01);
  assert_true(fabs(replay_token_hit_rate(&three) -
                   replay_token_hit_rate(&flat3)) <= 0.01);
  /* the tiers add hits, and serve every one of them */
  assert_true(two.hit_tokens > alone.hit_tokens);
  assert_true(two.tier_hit_tokens[CORE_TIER_HOST] > 0);
  assert_true(three.tier_hit_tokens[CORE_TIER_DISK] > 0 || KVS_ASAN);
  assert_int_equal(two.tier_hit_tokens[CORE_TIER_DISK], 0);
  assert_int_equal(two.hit_tokens - two.tier_hit_tokens[CORE_TIER_HOST],
                   alone.hit_tokens);
  assert_int_equal(three.hit_tokens - three.tier_hit_tokens[CORE_TIER_HOST] -
                       three.tier_hit_tokens[CORE_TIER_DISK],
                   alone.hit_tokens);
  assert_true(three.hit_tokens <= plan.ideal_hit_tokens);
  assert_int_equal(two.stats.tier_lost + three.stats.tier_lost, 0);
  assert_int_equal(two.tiers[CORE_TIER_HOST].slots, host / 16);
  trace_free(t);
}

/* ---- tenants ---- */

/* The daemon's split (cfg_tenant_blocks): shares rounded down, the rest
 * equal, the remainder of that division unused. */
static void test_replay_tenant_split(void **state) {
  (void)state;
  replay_config cfg;
  uint64_t b[REPLAY_MAX_TENANTS];

  replay_config_init(&cfg);
  assert_false(replay_tenant_mode(&cfg));
  cfg.tenants = 3;
  assert_true(replay_tenant_mode(&cfg));
  replay_tenant_blocks(&cfg, 1000, b);
  assert_int_equal(b[0], 333);
  assert_int_equal(b[1], 333);
  assert_int_equal(b[2], 333);
  cfg.tenant_share[0] = 70;
  replay_tenant_blocks(&cfg, 1001, b);
  assert_int_equal(b[0], 700);
  assert_int_equal(b[1], 150);
  assert_int_equal(b[2], 150);
  cfg.tenant_share[1] = 20;
  cfg.tenant_share[2] = 10;
  replay_tenant_blocks(&cfg, 10, b);
  assert_int_equal(b[0], 7);
  assert_int_equal(b[1], 2);
  assert_int_equal(b[2], 1);
  /* One tenant, the whole pool: tenant mode all the same. */
  replay_config_init(&cfg);
  cfg.tenant_share[0] = 100;
  assert_true(replay_tenant_mode(&cfg));
  replay_tenant_blocks(&cfg, 62500, b);
  assert_int_equal(b[0], 62500);
  /* Tiers of nothing: nothing each. */
  cfg.tenants = 2;
  cfg.tenant_share[0] = 0;
  replay_tenant_blocks(&cfg, 1, b);
  assert_int_equal(b[0], 0);
  assert_int_equal(b[1], 0);
}

/* The user key: the first id, or the first after the blocks every record
 * shares; a record with fewer blocks is keyed by its last id. */
static void test_replay_tenant_key(void **state) {
  (void)state;
  trace *t = load_text(small_trace);
  replay_config cfg;
  uint32_t route[4];

  replay_config_init(&cfg);
  cfg.tenants = REPLAY_MAX_TENANTS;
  /* Every record of small_trace begins with id 0: depth 2. */
  assert_int_equal(replay_tenant_depth(t, &cfg), 2);
  replay_tenant_route(t, &cfg, route);
  assert_int_equal(route[0], route[1]); /* A and B: id 1 at depth 2 */
  for (int i = 0; i < 4; i++)
    assert_true(route[i] < REPLAY_MAX_TENANTS);
  cfg.tenant_depth = 1; /* the literal first id: one user */
  assert_int_equal(replay_tenant_depth(t, &cfg), 1);
  replay_tenant_route(t, &cfg, route);
  for (int i = 1; i < 4; i++)
    assert_int_equal(route[i], route[0]);
  cfg.tenant_depth = 0;
  trace_skip(t, 3); /* D alone: all its one block shared, keyed by it */
  assert_int_equal(replay_tenant_depth(t, &cfg), 2);
  trace_free(t);

  t = load_text(
      "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 5, "
      "\"hash_ids\": [0, 1]}\n"
      "{\"timestamp\": 1, \"input_length\": 600, \"output_length\": 5, "
      "\"hash_ids\": [2, 3]}\n");
  assert_int_equal(replay_tenant_depth(t, &cfg), 1);
  trace_free(t);
}

/* small_trace over 2 tenants at unlimited capacity: a record hits what
 * its own tenant's earlier records wrote, and nothing of the other's. */
static void test_replay_tenants_small(void **state) {
  (void)state;
  trace *t = load_text(small_trace);
  replay_config cfg;
  replay_plan plan;
  replay_tenant tn[2];
  replay_result total;
  uint32_t route[4];
  uint64_t want = 1024; /* B after A: the same user */

  replay_config_init(&cfg);
  cfg.tenants = 2;
  replay_tenant_route(t, &cfg, route);
  if (route[2] == route[0])
    want += 512; /* C: trace block 0 */
  if (route[3] == route[0] || route[3] == route[2])
    want += 496; /* D: 31 blocks of trace block 0 */
  assert_int_equal(replay_plan_make(t, &cfg, &plan), 0);
  assert_int_equal(replay_tenants_run(t, &cfg, &plan, tn, &total), 0);
  assert_int_equal(total.requests, 4);
  assert_int_equal(total.query_tokens, 3166);
  assert_int_equal(total.hit_tokens, want);
  assert_int_equal(total.stats.evictions, 0);
  assert_int_equal(tn[0].plan.ideal_hit_tokens + tn[1].plan.ideal_hit_tokens,
                   want);
  for (int k = 0; k < 2; k++) {
    assert_int_equal(tn[k].res.hit_tokens, tn[k].plan.ideal_hit_tokens);
    assert_int_equal(tn[k].num_blocks,
                     tn[k].plan.unlimited_blocks ? tn[k].plan.unlimited_blocks
                                                 : 1);
  }
  trace_free(t);
}

/* The records of part k of t, in order (hash ids shared with t: free only
 * sub->recs). */
static void sub_trace(const trace *t, const uint32_t *route, uint32_t k,
                      trace *sub) {
  *sub = *t;
  sub->recs = malloc((t->num_recs ? t->num_recs : 1) * sizeof(*sub->recs));
  assert_non_null(sub->recs);
  sub->num_recs = 0;
  for (size_t i = 0; i < t->num_recs; i++)
    if (route[i] == k)
      sub->recs[sub->num_recs++] = t->recs[i];
}

/* Each tenant is exactly a plain replay of its users' records on a pool of
 * its share: counts equal, under slru and lru, at unlimited capacity (and
 * there the ideal of its records) and bounded; the total is the sum. */
static void test_replay_tenants_synthetic(void **state) {
  (void)state;
  trace *t = load_mooncake("synthetic_trace.jsonl");
  if (t == NULL)
    return;
  static const uint32_t ns[] = {2, 3};
  static const uint64_t caps[] = {0, 1000000};
  static const char *const pols[] = {"slru", "lru"};
  uint32_t *route = malloc(t->num_recs * sizeof(*route));
  assert_non_null(route);
  for (size_t a = 0; a < 2; a++)
    for (size_t b = 0; b < 2; b++) {
      replay_config cfg;
      replay_plan plan;
      replay_tenant tn[3];
      replay_result total, sum;

      replay_config_init(&cfg);
      cfg.tenants = ns[a];
      cfg.capacity_tokens = caps[b];
      cfg.policy = pols[a];
      assert_int_equal(replay_plan_make(t, &cfg, &plan), 0);
      assert_int_equal(replay_tenants_run(t, &cfg, &plan, tn, &total), 0);
      replay_tenant_route(t, &cfg, route);
      memset(&sum, 0, sizeof(sum));
      for (uint32_t k = 0; k < cfg.tenants; k++) {
        trace sub;
        replay_config one = cfg;
        replay_plan sp;
        replay_result res;

        sub_trace(t, route, k, &sub);
        one.tenants = 1;
        one.capacity_tokens = caps[b] ? (uint64_t)tn[k].num_blocks * 16 : 0;
        run(&sub, &one, &res, &sp);
        if (caps[b] == 0) {
          assert_int_equal(tn[k].num_blocks, sp.unlimited_blocks);
          assert_int_equal(res.hit_tokens, ideal_hit_tokens(&sub, 16));
        } else {
          assert_int_equal(tn[k].num_blocks, caps[b] / 16 / cfg.tenants);
          assert_true(res.stats.evictions > 0);
        }
        assert_int_equal(tn[k].res.requests, sub.num_recs);
        assert_int_equal(tn[k].res.query_tokens, res.query_tokens);
        assert_int_equal(tn[k].res.hit_tokens, res.hit_tokens);
        assert_int_equal(tn[k].res.refused, res.refused);
        assert_int_equal(tn[k].res.stats.evictions, res.stats.evictions);
        assert_int_equal(tn[k].plan.ideal_hit_tokens, sp.ideal_hit_tokens);
        replay_result_add(&sum, &tn[k].res);
        free(sub.recs);
      }
      print_message("synthetic, %u tenants, %llu tokens, %s: %.4f\n",
                    cfg.tenants, (unsigned long long)caps[b], cfg.policy,
                    replay_token_hit_rate(&total));
      assert_int_equal(total.requests, t->num_recs);
      assert_int_equal(total.hit_tokens, sum.hit_tokens);
      assert_int_equal(total.stats.evictions, sum.stats.evictions);
      assert_true(total.hit_tokens <= plan.ideal_hit_tokens);
    }
  free(route);
  trace_free(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_trace_parse),
      cmocka_unit_test(test_trace_errors),
      cmocka_unit_test(test_replay_small_unlimited),
      cmocka_unit_test(test_replay_small_capacity),
      cmocka_unit_test(test_replay_block_sizes),
      cmocka_unit_test(test_replay_synthetic_ideal),
      cmocka_unit_test(test_replay_conversation_ideal),
      cmocka_unit_test(test_replay_synthetic_bounded),
      cmocka_unit_test(test_replay_synthetic_tiers),
      cmocka_unit_test(test_replay_tenant_split),
      cmocka_unit_test(test_replay_tenant_key),
      cmocka_unit_test(test_replay_tenants_small),
      cmocka_unit_test(test_replay_tenants_synthetic),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  if (failed)
    return 1;
  if (skipped) {
    printf("skipped: %d trace test(s): " TRACE_DIR " not found\n", skipped);
    return 77;
  }
  return 0;
}
