/*
 * bench_core.c — the core's block operations against bare baselines measured
 * in the same process, at 64K and 1M blocks (block size 16).
 *
 *   allocate   core_allocate of one block (16 tokens) per call, round-robin
 *              over 256 requests until the pool is full
 *              baseline: pop the head of an intrusive doubly-linked list,
 *              set a ref count, store the index in a block table
 *   free       core_preempt of those requests (every block released)
 *              baseline: push each block back on the list
 *   lookup     core_lookup of 257-token prompts whose 16 blocks are all
 *              cached (chains of 16 blocks fill the pool), per block hit;
 *              chains taken in random order
 *              baseline: XXH3-128 of the same 96 bytes (parent, salt, 16
 *              token ids) plus one probe of a plain open-addressing table
 *              (load 0.5, linear probing) holding every block's hash
 * and, for information (no target):
 *   allocate evicting   core_allocate when every free block is CACHED (the
 *              pool is full of cached blocks, released once, none reused:
 *              the steady state of a serving pool), per block evicted
 *              baseline: list pop plus one delete from the table
 *   release cached      core_preempt of those requests once their blocks
 *              are committed with new tokens: each block's first release
 *              as a cached block (slru and mq look its hash up among
 *              their ghosts here); this leaves the pool full of cached
 *              blocks for the next round's evictions
 *              baseline: push each block on the list's tail, in the
 *              core's order
 *   release after hit   core_preempt of the lookup's requests: every block
 *              was just hit (slru: it goes to the hot segment)
 *              baseline: push the same blocks on the list's tail (tail
 *              first, as the core releases them)
 *   lookup, verify off  core_lookup without comparing stored token ids
 *
 * Every core operation runs under each online eviction policy (lru, slru,
 * mq; one core per policy, built with the same blocks and the same steps,
 * measured in the same rounds in rotating order), against one baseline per
 * operation; "vs lru" is a policy's figure over lru's for the same
 * operation.  The policies differ only in the hooks of core_int.h: hit
 * (lookup), evict (allocation: a FREE block's unlink, a CACHED block's
 * ghost insert) and release (queue position; a cached block's first
 * release: the ghost lookup).
 *
 * Each figure is the median over rounds of ns per block.  Absolute times
 * drift from run to run and machine to machine; the ratio is what counts.
 * The target: each core operation within 2x of its baseline.
 *
 *   bench_core [--quick]     --quick (or KVS_BENCH_QUICK set): 64K blocks
 *                            only, 3 rounds
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "daemon/core/core.h"

#define BS 16u
#define CHAIN 16u                 /* blocks per cached chain (lookup) */
#define PROMPT (CHAIN * BS + 1)   /* tokens per lookup: all 16 blocks hit */
#define NREQ_ALLOC 256u
#define NREQ_LOOKUP 1024u
#define MAX_ROUNDS 9
#define MAX_POL 8
/* Untimed rounds before allocate evicting / release cached are measured:
 * enough evictions (one pool's worth a round) to fill every policy's ghost
 * ring (slru keeps 4 per pool block, mq 8), so that the timed rounds see a
 * ring that has stopped growing and forgets its oldest ghost on each
 * insert, as in a daemon that has run a while. */
#define WARM_EVICT 9

/* The online policies (core_policy_name), lru first. */
static const char *pols[MAX_POL];
static int npol;

static volatile uint64_t sink;

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof(*v), cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static void die(const char *what, int rc) {
  fprintf(stderr, "bench_core: %s: %s\n", what, kvs_strerror(rc));
  exit(1);
}

#define CHECK(call)                \
  do {                             \
    int rc_ = (call);              \
    if (rc_ != 0)                  \
      die(#call, rc_);             \
  } while (0)

static core *mk_core(uint32_t nblocks, int verify, const char *policy) {
  core_config cfg;
  core *c;
  core_config_init(&cfg);
  cfg.policy = policy;
  cfg.num_blocks = nblocks;
  cfg.block_size = BS;
  cfg.verify_tokens = verify;
  kvs_layout l = {BS, 32, 8, 128, KVS_DTYPE_FP16, nblocks, 0};
  cfg.root = core_root_hash(&l, "bench");
  CHECK(core_create(&cfg, &c));
  return c;
}

static void check_core(core *c) {
  char msg[256];
  if (core_check(c, msg, sizeof(msg)) != 0) {
    fprintf(stderr, "bench_core: core invariant: %s\n", msg);
    exit(1);
  }
}

/* Each policy's core (npol of them): checked, its nreq requests
 * r[p * nreq + i] freed, checked again, destroyed. */
static void finish_cores(core **c, core_req **r, uint32_t nreq) {
  for (int p = 0; p < npol; p++) {
    check_core(c[p]);
    for (uint32_t i = 0; i < nreq; i++)
      core_req_free(c[p], r[(size_t)p * nreq + i]);
    check_core(c[p]);
    core_destroy(c[p]);
  }
}

/* ---- baseline: intrusive doubly-linked list over an array of nodes ---- */

typedef struct bnode {
  uint32_t prev, next, ref, pad;
} bnode;

typedef struct blist {
  bnode *n;
  uint32_t head, tail;
} blist;

#define NIL UINT32_MAX

static void bl_push_tail(blist *l, uint32_t b) {
  bnode *x = &l->n[b];
  x->next = NIL;
  x->prev = l->tail;
  if (l->tail != NIL)
    l->n[l->tail].next = b;
  else
    l->head = b;
  l->tail = b;
}

static void bl_unlink(blist *l, uint32_t b) {
  bnode *x = &l->n[b];
  if (x->prev != NIL)
    l->n[x->prev].next = x->next;
  else
    l->head = x->next;
  if (x->next != NIL)
    l->n[x->next].prev = x->prev;
  else
    l->tail = x->prev;
}

static void bl_push_head(blist *l, uint32_t b) {
  bnode *x = &l->n[b];
  x->prev = NIL;
  x->next = l->head;
  if (l->head != NIL)
    l->n[l->head].prev = b;
  else
    l->tail = b;
  l->head = b;
}

static uint32_t bl_pop_head(blist *l) {
  uint32_t b = l->head;
  bnode *x = &l->n[b];
  l->head = x->next;
  if (l->head != NIL)
    l->n[l->head].prev = NIL;
  else
    l->tail = NIL;
  return b;
}

static void bl_init(blist *l, uint32_t n) {
  l->n = calloc(n, sizeof(*l->n));
  if (l->n == NULL)
    die("calloc", KVS_ENOMEM);
  l->head = l->tail = NIL;
  for (uint32_t b = 0; b < n; b++)
    bl_push_tail(l, b);
}

/* ---- baseline: open-addressing table of 128-bit hashes ---- */

typedef struct bslot {
  uint64_t lo, hi;
  uint32_t b, pad;
} bslot;

typedef struct btable {
  bslot *s;
  uint64_t mask;
} btable;

static void bt_init(btable *t, uint32_t entries) {
  uint64_t n = 16;
  while (n < 2 * (uint64_t)entries)
    n <<= 1;
  t->s = malloc(n * sizeof(*t->s));
  if (t->s == NULL)
    die("malloc", KVS_ENOMEM);
  for (uint64_t i = 0; i < n; i++)
    t->s[i].b = NIL;
  t->mask = n - 1;
}

static void bt_insert(btable *t, XXH128_hash_t h, uint32_t b) {
  uint64_t i = h.low64 & t->mask;
  while (t->s[i].b != NIL)
    i = (i + 1) & t->mask;
  t->s[i].lo = h.low64;
  t->s[i].hi = h.high64;
  t->s[i].b = b;
}

static inline uint32_t bt_find(const btable *t, XXH128_hash_t h) {
  for (uint64_t i = h.low64 & t->mask;; i = (i + 1) & t->mask) {
    const bslot *e = &t->s[i];
    if (e->b == NIL)
      return NIL;
    if (e->lo == h.low64 && e->hi == h.high64)
      return e->b;
  }
}

/* Deletes h (present) with backward shift. */
static void bt_delete(btable *t, XXH128_hash_t h) {
  uint64_t i = h.low64 & t->mask;
  while (t->s[i].lo != h.low64 || t->s[i].hi != h.high64 || t->s[i].b == NIL)
    i = (i + 1) & t->mask;
  uint64_t hole = i;
  for (uint64_t j = (i + 1) & t->mask; t->s[j].b != NIL; j = (j + 1) & t->mask) {
    uint64_t home = t->s[j].lo & t->mask;
    if (((j - home) & t->mask) >= ((j - hole) & t->mask)) {
      t->s[hole] = t->s[j];
      hole = j;
    }
  }
  t->s[hole].b = NIL;
}

/* The bare block hash: XXH3-128 of parent || salt || 16 token ids, laid out
 * in one buffer (what any implementation must hash). */
static inline XXH128_hash_t bare_hash(XXH128_hash_t parent,
                                      const uint32_t *tokens) {
  unsigned char buf[32 + BS * 4];
  uint64_t head[4] = {parent.low64, parent.high64, 0, 0};
  memcpy(buf, head, sizeof(head));
  memcpy(buf + 32, tokens, BS * 4);
  return XXH3_128bits(buf, sizeof(buf));
}

/* ---- results ---- */

typedef struct row {
  const char *op, *policy;
  uint32_t blocks;
  double core_ns, base_ns;
  int target; /* 1: the 2x target applies */
} row;

static row rows[128];
static int nrows;

/* One row per policy: core_ns[p] under pols[p], all against base_ns. */
static void add_rows(const char *op, uint32_t blocks, const double *core_ns,
                     double base_ns, int target) {
  for (int p = 0; p < npol; p++) {
    double ns = core_ns[p];
    if (nrows < (int)(sizeof(rows) / sizeof(rows[0])))
      rows[nrows++] = (row){op, pols[p], blocks, ns, base_ns, target};
    printf("  %-29s %-5s %8" PRIu32 " %9.1f %12.1f %7.2f %7.2f  %s\n", op,
           pols[p], blocks, ns, base_ns, ns / base_ns, ns / core_ns[0],
           !target ? "(info)" : ns <= 2 * base_ns ? "ok" : "OVER 2x");
  }
  fflush(stdout);
}

/* The median of each policy's rounds: v[p][round]. */
static void medians(double v[][MAX_ROUNDS], int rounds, double *out) {
  for (int p = 0; p < npol; p++)
    out[p] = median(v[p], rounds);
}

/* The order the policies run in, round k: rotated so that none always runs
 * first (right after the baseline, or with the caches of another). */
static int pol_at(int k, int i) { return (k + i) % npol; }

/* ---- allocate / free ---- */

static void bench_alloc_free(uint32_t n, int rounds, uint32_t per_call) {
  double a_core[MAX_POL][MAX_ROUNDS], f_core[MAX_POL][MAX_ROUNDS],
      a_base[MAX_ROUNDS], f_base[MAX_ROUNDS], a_med[MAX_POL], f_med[MAX_POL];
  /* Each request takes `per` blocks, per_call at a time; a round repeats the
   * fill-then-release cycle so that it covers at least 2^21 blocks. */
  uint32_t per = n / NREQ_ALLOC / per_call * per_call;
  uint32_t total = per * NREQ_ALLOC, reps = (1u << 21) / total + 1;
  core *c[MAX_POL];
  core_req *r[MAX_POL][NREQ_ALLOC];
  core_cow cow;
  blist l;
  uint32_t *tables = malloc((size_t)total * sizeof(*tables));
  if (tables == NULL)
    die("malloc", KVS_ENOMEM);
  bl_init(&l, n);
  for (int p = 0; p < npol; p++) {
    c[p] = mk_core(n, 1, pols[p]);
    for (uint32_t i = 0; i < NREQ_ALLOC; i++)
      CHECK(core_req_create(c[p], NULL, 0, &r[p][i]));
  }

  for (int round = -1; round < rounds; round++) { /* round -1: warm-up */
    double ta[MAX_POL] = {0}, tf[MAX_POL] = {0}, tba = 0, tbf = 0;
    for (uint32_t rep = 0; rep < reps; rep++) {
      for (int k = 0; k < npol; k++) {
        int p = pol_at((int)rep + round + 1, k);
        double t0 = now_ns();
        for (uint32_t j = 0; j < per; j += per_call)
          for (uint32_t i = 0; i < NREQ_ALLOC; i++)
            CHECK(core_allocate(c[p], r[p][i], per_call * BS, &cow));
        double t1 = now_ns();
        for (uint32_t i = 0; i < NREQ_ALLOC; i++)
          core_preempt(c[p], r[p][i]);
        double t2 = now_ns();
        ta[p] += t1 - t0;
        tf[p] += t2 - t1;
      }

      /* Baseline: the same pattern on a bare list; request i's block table
       * is tables[i * per ..]. */
      double t2 = now_ns();
      for (uint32_t k = 0; k < per; k += per_call)
        for (uint32_t i = 0; i < NREQ_ALLOC; i++)
          for (uint32_t j = 0; j < per_call; j++) {
            uint32_t b = bl_pop_head(&l);
            l.n[b].ref = 1;
            tables[i * per + k + j] = b;
          }
      double t3 = now_ns();
      for (uint32_t i = 0; i < NREQ_ALLOC; i++)
        for (uint32_t k = per; k-- > 0;) {
          uint32_t b = tables[i * per + k];
          l.n[b].ref = 0;
          bl_push_head(&l, b);
        }
      double t4 = now_ns();
      tba += t3 - t2;
      tbf += t4 - t3;
    }
    if (round >= 0) {
      for (int p = 0; p < npol; p++) {
        a_core[p][round] = ta[p] / ((double)total * reps);
        f_core[p][round] = tf[p] / ((double)total * reps);
      }
      a_base[round] = tba / ((double)total * reps);
      f_base[round] = tbf / ((double)total * reps);
    }
  }
  medians(a_core, rounds, a_med);
  add_rows(per_call == 1 ? "allocate (1 block per call)"
                         : "allocate (16 blocks per call)",
           n, a_med, median(a_base, rounds), 1);
  if (per_call == 1) {
    medians(f_core, rounds, f_med);
    add_rows("free (release a request)", n, f_med, median(f_base, rounds), 1);
  }
  finish_cores(c, &r[0][0], NREQ_ALLOC);
  free(l.n);
  free(tables);
}

/* ---- lookup (and allocation that evicts) ---- */

static void chain_tokens(uint32_t chain, uint32_t *out) {
  for (uint32_t i = 0; i < PROMPT; i++)
    out[i] = (uint32_t)(mix64((uint64_t)chain * PROMPT + i) >> 32);
}

/* Fills c with n / CHAIN cached chains of CHAIN blocks; the baseline table
 * gets the bare hashes of the same chains. */
static void fill_chains(core *c, btable *t, uint32_t nchains) {
  uint32_t tok[PROMPT], hit;
  core_cow cow;
  for (uint32_t ch = 0; ch < nchains; ch++) {
    core_req *r;
    chain_tokens(ch, tok);
    CHECK(core_req_create(c, NULL, 0, &r));
    CHECK(core_lookup(c, r, tok, CHAIN * BS, &hit));
    CHECK(core_allocate(c, r, CHAIN * BS - hit, &cow));
    CHECK(core_commit(c, r, hit, NULL, CHAIN * BS - hit, NULL));
    core_req_free(c, r);
    if (t != NULL) {
      XXH128_hash_t h = {0, 0};
      for (uint32_t j = 0; j < CHAIN; j++) {
        h = bare_hash(h, tok + j * BS);
        bt_insert(t, h, ch * CHAIN + j);
      }
    }
  }
}

static void shuffle(uint32_t *v, uint32_t n, uint64_t seed) {
  for (uint32_t i = n; i > 1; i--) {
    uint32_t j = (uint32_t)(mix64(seed + i) % i);
    uint32_t x = v[i - 1];
    v[i - 1] = v[j];
    v[j] = x;
  }
}

/* Lookup cost per block hit, core (verify on or off) vs baseline, and with
 * the baseline, the release of the blocks hit.  Returns the lookup
 * baseline (0 without). */
static double bench_lookup(uint32_t n, int rounds, int verify, int with_base,
                           double base_ns) {
  double l_core[MAX_POL][MAX_ROUNDS], r_core[MAX_POL][MAX_ROUNDS],
      l_base[MAX_ROUNDS], r_base[MAX_ROUNDS], med[MAX_POL];
  uint32_t nchains = n / CHAIN;
  uint32_t nreq = nchains < NREQ_LOOKUP ? nchains : NREQ_LOOKUP;
  uint32_t batches = nchains / nreq, reps = (1u << 20) / n + 1;
  core *c[MAX_POL];
  btable t = {0};
  blist l = {0};
  core_req **r = malloc((size_t)npol * nreq * sizeof(*r));
  uint32_t *perm = malloc((size_t)nchains * sizeof(*perm));
  uint32_t *buf = malloc((size_t)nreq * PROMPT * sizeof(*buf));
  if (r == NULL || perm == NULL || buf == NULL)
    die("malloc", KVS_ENOMEM);
  if (with_base) {
    bt_init(&t, n);
    bl_init(&l, n);
  }
  for (int p = 0; p < npol; p++) {
    c[p] = mk_core(n, verify, pols[p]);
    fill_chains(c[p], with_base && p == 0 ? &t : NULL, nchains);
    for (uint32_t i = 0; i < nreq; i++)
      CHECK(core_req_create(c[p], NULL, 0, &r[(size_t)p * nreq + i]));
  }
  for (uint32_t i = 0; i < nchains; i++)
    perm[i] = i;

  for (int round = -1; round < rounds; round++) {
    double core_t[MAX_POL] = {0}, rel_t[MAX_POL] = {0}, base_t = 0,
           brel_t = 0;
    for (uint32_t rep = 0; rep < reps; rep++) {
    shuffle(perm, nchains, (uint64_t)(round * 31 + (int)rep) * 7919 + n);
    for (uint32_t bt = 0; bt < batches; bt++) {
      for (uint32_t i = 0; i < nreq; i++)
        chain_tokens(perm[bt * nreq + i], buf + (size_t)i * PROMPT);
      for (int k = 0; k < npol; k++) {
        int p = pol_at((int)(rep * batches + bt) + round + 1, k);
        core_req **rp = r + (size_t)p * nreq;
        double t0 = now_ns();
        for (uint32_t i = 0; i < nreq; i++) {
          uint32_t hit;
          CHECK(core_lookup(c[p], rp[i], buf + (size_t)i * PROMPT, PROMPT,
                            &hit));
          if (hit != CHAIN * BS) {
            fprintf(stderr, "bench_core: lookup hit %u tokens, want %u (%s)\n",
                    hit, CHAIN * BS, pols[p]);
            exit(1);
          }
        }
        double t1 = now_ns();
        for (uint32_t i = 0; i < nreq; i++)
          core_preempt(c[p], rp[i]);
        double t2 = now_ns();
        core_t[p] += t1 - t0;
        rel_t[p] += t2 - t1;
      }
      if (!with_base)
        continue;
      uint64_t acc = 0;
      double t2 = now_ns();
      for (uint32_t i = 0; i < nreq; i++) {
        const uint32_t *tok = buf + (size_t)i * PROMPT;
        XXH128_hash_t h = {0, 0};
        for (uint32_t j = 0; j < CHAIN; j++) {
          h = bare_hash(h, tok + j * BS);
          acc += bt_find(&t, h);
        }
      }
      double t3 = now_ns();
      sink += acc;
      base_t += t3 - t2;
      /* Release baseline: block j of chain ch is ch * CHAIN + j (as
       * fill_chains put it in the table); untimed, take the blocks hit off
       * the list; timed, put them back on its tail, chain tails first. */
      for (uint32_t i = 0; i < nreq; i++)
        for (uint32_t j = 0; j < CHAIN; j++)
          bl_unlink(&l, perm[bt * nreq + i] * CHAIN + j);
      double t4 = now_ns();
      for (uint32_t i = 0; i < nreq; i++)
        for (uint32_t j = CHAIN; j-- > 0;) {
          uint32_t b = perm[bt * nreq + i] * CHAIN + j;
          l.n[b].ref = 0;
          bl_push_tail(&l, b);
        }
      double t5 = now_ns();
      brel_t += t5 - t4;
    }
    }
    if (round >= 0) {
      double per = (double)reps * batches * nreq * CHAIN;
      for (int p = 0; p < npol; p++) {
        l_core[p][round] = core_t[p] / per;
        r_core[p][round] = rel_t[p] / per;
      }
      l_base[round] = base_t / per;
      r_base[round] = brel_t / per;
    }
  }
  medians(l_core, rounds, med);
  if (with_base) {
    base_ns = median(l_base, rounds);
    add_rows("lookup (per block hit)", n, med, base_ns, 1);
    medians(r_core, rounds, med);
    add_rows("release after hit (info)", n, med, median(r_base, rounds), 0);
  } else {
    add_rows("lookup, verify off (info)", n, med, base_ns, 0);
  }
  finish_cores(c, r, nreq);
  free(t.s);
  free(l.n);
  free(r);
  free(perm);
  free(buf);
  return with_base ? base_ns : 0;
}

/* Allocation when every free block is CACHED: each block taken is evicted
 * (its hash leaves the index; slru and mq keep it as a ghost).  Baseline:
 * list pop + one table delete.  Then those blocks are committed with new
 * tokens and released: each is cached, released for the first time (slru
 * and mq look its hash up among their ghosts: a miss, as for most newly
 * computed blocks), and the pool is full of cached blocks again for the
 * next round.  Baseline: list push on the tail. */
static void bench_evict(uint32_t n, int rounds) {
  double e_core[MAX_POL][MAX_ROUNDS], c_core[MAX_POL][MAX_ROUNDS],
      e_base[MAX_ROUNDS], c_base[MAX_ROUNDS], med[MAX_POL];
  uint32_t nchains = n / CHAIN;
  core *c[MAX_POL];
  core_req *r[MAX_POL][NREQ_ALLOC];
  core_cow cow;
  blist l;
  btable t;
  uint32_t per = n / NREQ_ALLOC, total = per * NREQ_ALLOC;
  XXH128_hash_t *hashes = malloc((size_t)n * sizeof(*hashes));
  uint32_t *tok = malloc((size_t)per * BS * sizeof(*tok));
  uint64_t gen = 0; /* makes each commit's tokens new */
  if (hashes == NULL || tok == NULL)
    die("malloc", KVS_ENOMEM);
  bl_init(&l, n);
  bt_init(&t, n);
  for (int p = 0; p < npol; p++) {
    c[p] = mk_core(n, 1, pols[p]);
    fill_chains(c[p], NULL, nchains); /* untimed: n cached blocks */
    for (uint32_t i = 0; i < NREQ_ALLOC; i++)
      CHECK(core_req_create(c[p], NULL, 0, &r[p][i]));
  }

  for (int round = -WARM_EVICT; round < rounds; round++) {
    double te[MAX_POL], tc[MAX_POL];
    gen++;
    for (int k = 0; k < npol; k++) {
      int p = pol_at(round + WARM_EVICT, k);
      double t0 = now_ns();
      for (uint32_t j = 0; j < per; j++)
        for (uint32_t i = 0; i < NREQ_ALLOC; i++)
          CHECK(core_allocate(c[p], r[p][i], BS, &cow));
      double t1 = now_ns();
      for (uint32_t i = 0; i < NREQ_ALLOC; i++) { /* untimed */
        for (uint32_t x = 0; x < per * BS; x++)
          tok[x] = (uint32_t)(mix64((gen * NREQ_ALLOC + i) * per * BS + x) >>
                              32);
        CHECK(core_commit(c[p], r[p][i], 0, tok, per * BS, NULL));
      }
      double t2 = now_ns();
      for (uint32_t i = 0; i < NREQ_ALLOC; i++)
        core_preempt(c[p], r[p][i]);
      double t3 = now_ns();
      te[p] = t1 - t0;
      tc[p] = t3 - t2;
      /* Untimed: a preempted request keeps its tokens; the next round's
       * commit brings new ones, so it gets new requests. */
      for (uint32_t i = 0; i < NREQ_ALLOC; i++) {
        core_req_free(c[p], r[p][i]);
        CHECK(core_req_create(c[p], NULL, 0, &r[p][i]));
      }
    }

    /* Baseline.  Untimed: the same number of hashes in the table. */
    for (uint32_t b = 0; b < n; b++) {
      uint32_t x[BS];
      for (uint32_t j = 0; j < BS; j++)
        x[j] = (uint32_t)mix64(gen * n * BS + (uint64_t)b * BS + j);
      hashes[b] = bare_hash((XXH128_hash_t){b, gen}, x);
      bt_insert(&t, hashes[b], b);
    }
    double t2 = now_ns();
    for (uint32_t k = 0; k < total; k++) {
      uint32_t b = bl_pop_head(&l);
      bt_delete(&t, hashes[b]);
      l.n[b].ref = 1;
      sink += b;
    }
    double t3 = now_ns();
    /* The list held 0 .. total - 1 in order, so the k-th block popped was
     * k: the core's request i got blocks i, i + NREQ_ALLOC, ...; release
     * them in the core's order, request by request, tail first. */
    for (uint32_t i = 0; i < NREQ_ALLOC; i++)
      for (uint32_t j = per; j-- > 0;) {
        uint32_t b = j * NREQ_ALLOC + i;
        l.n[b].ref = 0;
        bl_push_tail(&l, b);
      }
    double t4 = now_ns();
    /* Untimed: back in order 0 .. total - 1 for the next round. */
    for (uint32_t b = 0; b < total; b++)
      bl_unlink(&l, b);
    for (uint32_t b = 0; b < total; b++)
      bl_push_tail(&l, b);
    if (round >= 0) {
      for (int p = 0; p < npol; p++) {
        e_core[p][round] = te[p] / total;
        c_core[p][round] = tc[p] / total;
      }
      e_base[round] = (t3 - t2) / total;
      c_base[round] = (t4 - t3) / total;
    }
  }
  medians(e_core, rounds, med);
  add_rows("allocate evicting (info)", n, med, median(e_base, rounds), 0);
  medians(c_core, rounds, med);
  add_rows("release cached (info)", n, med, median(c_base, rounds), 0);
  finish_cores(c, &r[0][0], NREQ_ALLOC);
  free(l.n);
  free(t.s);
  free(hashes);
  free(tok);
}

int main(int argc, char **argv) {
  int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
  quick |= getenv("KVS_BENCH_QUICK") != NULL;
  int rounds = quick ? 3 : 7;
  static const uint32_t sizes[] = {1u << 16, 1u << 20};
  int nsizes = quick ? 1 : 2;
  const char *name;
  int offline;

  for (size_t i = 0; (name = core_policy_name(i, &offline)) != NULL; i++)
    if (!offline && npol < MAX_POL)
      pols[npol++] = name;
  if (npol == 0 || strcmp(pols[0], "lru") != 0) {
    fprintf(stderr, "bench_core: lru is not the first online policy\n");
    return 1;
  }

  printf("core operations, block size %u: ns per block, median of %d rounds,\n"
         "under each online policy against the same baselines; \"vs lru\": "
         "the policy's ns over lru's\n"
         "(absolute times drift between runs and machines; the ratio is what "
         "counts)\n",
         BS, rounds);
  printf("  %-29s %-5s %8s %9s %12s %7s %7s  %s\n", "operation", "policy",
         "blocks", "core", "baseline", "ratio", "vs lru", "target 2x");
  for (int s = 0; s < nsizes; s++) {
    bench_alloc_free(sizes[s], rounds, 1);
    bench_alloc_free(sizes[s], rounds, 16);
    double base = bench_lookup(sizes[s], rounds, 1, 1, 0);
    bench_lookup(sizes[s], rounds, 0, 0, base);
    bench_evict(sizes[s], rounds);
  }
  int over = 0;
  for (int i = 0; i < nrows; i++)
    if (rows[i].target && rows[i].core_ns > 2 * rows[i].base_ns) {
      if (!over++)
        printf("over the 2x target:");
      printf(" %s, %s, at %u blocks (%.2fx);", rows[i].op, rows[i].policy,
             rows[i].blocks, rows[i].core_ns / rows[i].base_ns);
    }
  printf(over ? "\n" : "2x target met by every operation under every policy\n");
  return 0;
}
