/*
 * bench_core_scenario.c — a small serving scenario through the core, the
 * shape of the benchmark published by the kv-cache-scheduler project
 * (ermolushka/kv-cache-scheduler): 300 requests, a pool of 512 blocks of 16
 * tokens, at most 16 requests running; each step admits requests up to 16
 * (lookup, allocate the rest of the prompt, commit it), then every running
 * request decodes one token (append + commit) and those that reached their
 * completion length are freed.
 *
 * Workloads (our own generator; the published figures come from theirs):
 *   mixed        half the requests: a 64-token system prompt + 8..48 user
 *                tokens; the other half: 32..64 unique tokens (the brief)
 *   all-shared   every request has the system prompt (their "shared prefix")
 *   all-unique   every request unique (their "no sharing")
 * completion 16..96 tokens each.  Each workload runs with sharing (one prefix
 * cache) and without (each request its own cache salt: same work, no hits).
 *
 * Printed: blocks allocated (taken from the free queue), token hit rate
 * (prompt tokens found cached / prompt tokens), block hit rate (full blocks
 * hit / full blocks looked up), average and peak pool use (blocks in use /
 * 512, sampled once per step), evictions and steps.  The published figures:
 * 1,643 blocks and a 69.9% hit rate with a shared 64-token prompt, 2,070
 * blocks without sharing (12.9% and 16.1% average use).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/core/core.h"

#define NREQ 300u
#define NBLOCKS 512u
#define BS 16u
#define MAX_RUNNING 16u
#define SYS_LEN 64u

typedef struct sreq {
  uint32_t *tokens;   /* prompt */
  uint32_t len;       /* prompt tokens */
  uint32_t completion;
  uint32_t done;      /* output tokens decoded */
  core_req *r;
} sreq;

typedef struct result {
  uint64_t allocated, hit_tokens, query_tokens, hit_blocks, miss_blocks;
  uint64_t evictions, steps, refused;
  double avg_use, peak_use;
} result;

static uint64_t rng_state;

static uint64_t rng_next(void) {
  uint64_t x = (rng_state += 0x9e3779b97f4a7c15ull);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static uint32_t rng_range(uint32_t lo, uint32_t hi) {
  return lo + (uint32_t)(rng_next() % (hi - lo + 1));
}

static void die(const char *what, int rc) {
  fprintf(stderr, "bench_core_scenario: %s: %s\n", what, kvs_strerror(rc));
  exit(1);
}

#define CHECK(call)                \
  do {                             \
    int rc_ = (call);              \
    if (rc_ != 0)                  \
      die(#call, rc_);             \
  } while (0)

/* shared_every: 0 = none shares the system prompt, 1 = all, 2 = every
 * other request. */
static sreq *make_workload(uint32_t shared_every, uint64_t seed) {
  sreq *w = calloc(NREQ, sizeof(*w));
  if (w == NULL)
    die("calloc", KVS_ENOMEM);
  rng_state = seed;
  for (uint32_t i = 0; i < NREQ; i++) {
    int shared = shared_every == 1 || (shared_every == 2 && i % 2 == 0);
    uint32_t len = shared ? SYS_LEN + rng_range(8, 48) : rng_range(32, 64);
    w[i].len = len;
    w[i].completion = rng_range(16, 96);
    w[i].tokens = malloc(len * sizeof(uint32_t));
    if (w[i].tokens == NULL)
      die("malloc", KVS_ENOMEM);
    for (uint32_t p = 0; p < len; p++)
      w[i].tokens[p] = shared && p < SYS_LEN
                           ? 1000 + p                      /* system prompt */
                           : (uint32_t)(rng_next() >> 40) + 100000; /* user */
  }
  return w;
}

static void free_workload(sreq *w) {
  for (uint32_t i = 0; i < NREQ; i++)
    free(w[i].tokens);
  free(w);
}

static result run(sreq *w, int sharing) {
  core_config cfg;
  core *c;
  core_cow cow;
  core_stats st;
  result res = {0};
  sreq *running[MAX_RUNNING];
  uint32_t nrunning = 0, next = 0;
  double use_sum = 0;

  core_config_init(&cfg);
  cfg.num_blocks = NBLOCKS;
  cfg.block_size = BS;
  kvs_layout l = {BS, 32, 8, 128, KVS_DTYPE_FP16, NBLOCKS, 0};
  cfg.root = core_root_hash(&l, "scenario");
  CHECK(core_create(&cfg, &c));

  while (next < NREQ || nrunning > 0) {
    /* Admit. */
    while (nrunning < MAX_RUNNING && next < NREQ) {
      sreq *q = &w[next];
      uint32_t hit, salt = next;
      CHECK(core_req_create(c, sharing ? NULL : &salt, sharing ? 0 : sizeof(salt),
                            &q->r));
      CHECK(core_lookup(c, q->r, q->tokens, q->len, &hit));
      int rc = core_allocate(c, q->r, q->len - hit, &cow);
      if (rc == KVS_ENOSPC) { /* not with these sizes; counted if it were */
        core_req_free(c, q->r);
        q->r = NULL;
        res.refused++;
        next++;
        continue;
      }
      CHECK(rc);
      CHECK(core_commit(c, q->r, hit, NULL, q->len - hit, NULL));
      q->done = 0;
      running[nrunning++] = q;
      next++;
    }
    /* One decode step for every running request. */
    for (uint32_t i = 0; i < nrunning; i++) {
      sreq *q = running[i];
      uint32_t tok = 0x80000000u | (uint32_t)((q - w) << 12) | q->done;
      CHECK(core_append(c, q->r, 1, &cow));
      CHECK(core_commit(c, q->r, q->len + q->done, &tok, 1, NULL));
      q->done++;
    }
    res.steps++;
    core_get_stats(c, &st);
    double use = (double)st.used_blocks / NBLOCKS;
    use_sum += use;
    if (use > res.peak_use)
      res.peak_use = use;
    /* Retire. */
    for (uint32_t i = 0; i < nrunning;) {
      if (running[i]->done >= running[i]->completion) {
        core_req_free(c, running[i]->r);
        running[i]->r = NULL;
        running[i] = running[--nrunning];
      } else {
        i++;
      }
    }
  }
  char msg[256];
  if (core_check(c, msg, sizeof(msg)) != 0) {
    fprintf(stderr, "bench_core_scenario: core invariant: %s\n", msg);
    exit(1);
  }
  core_get_stats(c, &st);
  if (st.num_requests != 0 || st.used_blocks != 0) {
    fprintf(stderr, "bench_core_scenario: blocks or requests left over\n");
    exit(1);
  }
  res.allocated = st.allocated_blocks;
  res.hit_tokens = st.hit_tokens;
  res.query_tokens = st.query_tokens;
  res.hit_blocks = st.hit_blocks;
  res.miss_blocks = st.miss_blocks;
  res.evictions = st.evictions;
  res.avg_use = res.steps ? use_sum / (double)res.steps : 0;
  core_destroy(c);
  return res;
}

static void print_row(const char *name, const char *sharing, const result *r,
                      const char *published) {
  printf("  %-11s %-4s %9" PRIu64 " %8.1f%% %8.1f%% %8.1f%% %8.1f%% %9" PRIu64
         " %6" PRIu64 "  %s\n",
         name, sharing, r->allocated,
         r->query_tokens ? 100.0 * (double)r->hit_tokens / (double)r->query_tokens
                         : 0.0,
         r->hit_blocks + r->miss_blocks
             ? 100.0 * (double)r->hit_blocks /
                   (double)(r->hit_blocks + r->miss_blocks)
             : 0.0,
         100.0 * r->avg_use, 100.0 * r->peak_use, r->evictions, r->steps,
         published);
}

int main(void) {
  static const struct {
    const char *name;
    uint32_t shared_every;
    const char *published_on, *published_off;
  } loads[] = {
      {"mixed", 2, "", ""},
      {"all-shared", 1, "published: 1643 blocks, 69.9% hit, 12.9% use", ""},
      {"all-unique", 0, "published: 2070 blocks, 0.0% hit, 16.1% use", ""},
  };
  printf("scenario: %u requests, %u blocks of %u tokens, at most %u running, "
         "64-token system prompt\n",
         NREQ, NBLOCKS, BS, MAX_RUNNING);
  printf("  %-11s %-4s %9s %9s %9s %9s %9s %9s %6s\n", "workload", "share",
         "allocated", "tok hit", "blk hit", "avg use", "peak use", "evictions",
         "steps");
  for (size_t i = 0; i < sizeof(loads) / sizeof(loads[0]); i++) {
    sreq *w = make_workload(loads[i].shared_every, 42 + i);
    result on = run(w, 1);
    result off = run(w, 0);
    print_row(loads[i].name, "on", &on, loads[i].published_on);
    print_row(loads[i].name, "off", &off, loads[i].published_off);
    if (off.allocated)
      printf("  %-11s sharing saves %.1f%% of block allocations\n", "",
             100.0 * (1.0 - (double)on.allocated / (double)off.allocated));
    free_workload(w);
  }
  return 0;
}
