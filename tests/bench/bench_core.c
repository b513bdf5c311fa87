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
 *   allocate evicting   core_allocate when every free block is CACHED
 *              baseline: list pop plus one delete from the table
 *   lookup, verify off  core_lookup without comparing stored token ids
 *
 * Each figure is the median over rounds of ns per block.  Absolute times
 * drift from run to run and machine to machine; the ratio is what counts.
 * The target: each core operation within 2x of its baseline.
 *
 *   bench_core [--quick]     --quick: 64K blocks only, 3 rounds
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

static core *mk_core(uint32_t nblocks, int verify) {
  core_config cfg;
  core *c;
  core_config_init(&cfg);
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
  const char *op;
  uint32_t blocks;
  double core_ns, base_ns;
  int target; /* 1: the 2x target applies */
} row;

static row rows[32];
static int nrows;

static void add_row(const char *op, uint32_t blocks, double core_ns,
                    double base_ns, int target) {
  rows[nrows++] = (row){op, blocks, core_ns, base_ns, target};
  printf("  %-28s %8" PRIu32 " %9.1f %12.1f %7.2f  %s\n", op, blocks, core_ns,
         base_ns, core_ns / base_ns,
         !target ? "(info)" : core_ns <= 2 * base_ns ? "ok" : "OVER 2x");
  fflush(stdout);
}

/* ---- allocate / free ---- */

static void bench_alloc_free(uint32_t n, int rounds, uint32_t per_call) {
  double a_core[MAX_ROUNDS], f_core[MAX_ROUNDS], a_base[MAX_ROUNDS],
      f_base[MAX_ROUNDS];
  /* Each request takes `per` blocks, per_call at a time; a round repeats the
   * fill-then-release cycle so that it covers at least 2^21 blocks. */
  uint32_t per = n / NREQ_ALLOC / per_call * per_call;
  uint32_t total = per * NREQ_ALLOC, reps = (1u << 21) / total + 1;
  core *c = mk_core(n, 1);
  core_req *r[NREQ_ALLOC];
  core_cow cow;
  blist l;
  uint32_t *tables = malloc((size_t)total * sizeof(*tables));
  if (tables == NULL)
    die("malloc", KVS_ENOMEM);
  bl_init(&l, n);
  for (uint32_t i = 0; i < NREQ_ALLOC; i++)
    CHECK(core_req_create(c, NULL, 0, &r[i]));

  for (int round = -1; round < rounds; round++) { /* round -1: warm-up */
    double ta = 0, tf = 0, tba = 0, tbf = 0;
    for (uint32_t rep = 0; rep < reps; rep++) {
      double t0 = now_ns();
      for (uint32_t k = 0; k < per; k += per_call)
        for (uint32_t i = 0; i < NREQ_ALLOC; i++)
          CHECK(core_allocate(c, r[i], per_call * BS, &cow));
      double t1 = now_ns();
      for (uint32_t i = 0; i < NREQ_ALLOC; i++)
        core_preempt(c, r[i]);
      double t2 = now_ns();

      /* Baseline: the same pattern on a bare list; request i's block table
       * is tables[i * per ..]. */
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
      ta += t1 - t0;
      tf += t2 - t1;
      tba += t3 - t2;
      tbf += t4 - t3;
    }
    if (round >= 0) {
      a_core[round] = ta / ((double)total * reps);
      f_core[round] = tf / ((double)total * reps);
      a_base[round] = tba / ((double)total * reps);
      f_base[round] = tbf / ((double)total * reps);
    }
  }
  check_core(c);
  add_row(per_call == 1 ? "allocate (1 block per call)"
                        : "allocate (16 blocks per call)",
          n, median(a_core, rounds), median(a_base, rounds), 1);
  if (per_call == 1)
    add_row("free (release a request)", n, median(f_core, rounds),
            median(f_base, rounds), 1);
  for (uint32_t i = 0; i < NREQ_ALLOC; i++)
    core_req_free(c, r[i]);
  check_core(c);
  core_destroy(c);
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

/* Lookup cost per block hit, core (verify on or off) vs baseline. */
static void bench_lookup(uint32_t n, int rounds, int verify, int with_base) {
  double l_core[MAX_ROUNDS], l_base[MAX_ROUNDS];
  uint32_t nchains = n / CHAIN;
  uint32_t nreq = nchains < NREQ_LOOKUP ? nchains : NREQ_LOOKUP;
  uint32_t batches = nchains / nreq, reps = (1u << 20) / n + 1;
  core *c = mk_core(n, verify);
  btable t = {0};
  core_req **r = malloc(nreq * sizeof(*r));
  uint32_t *perm = malloc((size_t)nchains * sizeof(*perm));
  uint32_t *buf = malloc((size_t)nreq * PROMPT * sizeof(*buf));
  if (r == NULL || perm == NULL || buf == NULL)
    die("malloc", KVS_ENOMEM);
  if (with_base)
    bt_init(&t, n);
  fill_chains(c, with_base ? &t : NULL, nchains);
  for (uint32_t i = 0; i < nreq; i++)
    CHECK(core_req_create(c, NULL, 0, &r[i]));
  for (uint32_t i = 0; i < nchains; i++)
    perm[i] = i;

  for (int round = -1; round < rounds; round++) {
    double core_t = 0, base_t = 0;
    for (uint32_t rep = 0; rep < reps; rep++) {
    shuffle(perm, nchains, (uint64_t)(round * 31 + (int)rep) * 7919 + n);
    for (uint32_t bt = 0; bt < batches; bt++) {
      for (uint32_t i = 0; i < nreq; i++)
        chain_tokens(perm[bt * nreq + i], buf + (size_t)i * PROMPT);
      double t0 = now_ns();
      for (uint32_t i = 0; i < nreq; i++) {
        uint32_t hit;
        CHECK(core_lookup(c, r[i], buf + (size_t)i * PROMPT, PROMPT, &hit));
        if (hit != CHAIN * BS) {
          fprintf(stderr, "bench_core: lookup hit %u tokens, want %u\n", hit,
                  CHAIN * BS);
          exit(1);
        }
      }
      double t1 = now_ns();
      for (uint32_t i = 0; i < nreq; i++)
        core_preempt(c, r[i]);
      core_t += t1 - t0;
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
    }
    }
    if (round >= 0) {
      l_core[round] = core_t / ((double)reps * batches * nreq * CHAIN);
      l_base[round] = base_t / ((double)reps * batches * nreq * CHAIN);
    }
  }
  check_core(c);
  if (with_base)
    add_row("lookup (per block hit)", n, median(l_core, rounds),
            median(l_base, rounds), 1);
  else
    add_row("lookup, verify off (info)", n, median(l_core, rounds),
            rows[nrows - 1].base_ns, 0);
  for (uint32_t i = 0; i < nreq; i++)
    core_req_free(c, r[i]);
  check_core(c);
  core_destroy(c);
  free(t.s);
  free(r);
  free(perm);
  free(buf);
}

/* Allocation when every free block is CACHED: each block taken is evicted
 * (its hash leaves the index).  Baseline: list pop + one table delete. */
static void bench_evict(uint32_t n, int rounds) {
  double e_core[MAX_ROUNDS], e_base[MAX_ROUNDS];
  uint32_t nchains = n / CHAIN;
  core *c = mk_core(n, 1);
  core_req *r[NREQ_ALLOC];
  core_cow cow;
  blist l;
  btable t;
  XXH128_hash_t *hashes = malloc((size_t)n * sizeof(*hashes));
  uint32_t *tok = malloc((size_t)n * BS * sizeof(*tok));
  uint32_t per = n / NREQ_ALLOC;
  if (hashes == NULL || tok == NULL)
    die("malloc", KVS_ENOMEM);
  bl_init(&l, n);
  bt_init(&t, n);
  for (uint32_t i = 0; i < NREQ_ALLOC; i++)
    CHECK(core_req_create(c, NULL, 0, &r[i]));

  for (int round = -1; round < rounds; round++) {
    /* Untimed: cache n distinct blocks, and the same number of hashes in
     * the baseline table. */
    fill_chains(c, NULL, nchains);
    for (uint32_t b = 0; b < n; b++) {
      uint32_t x[BS];
      for (uint32_t j = 0; j < BS; j++)
        x[j] = (uint32_t)mix64((uint64_t)round * n * BS + (uint64_t)b * BS + j);
      hashes[b] = bare_hash((XXH128_hash_t){b, (uint64_t)round}, x);
      bt_insert(&t, hashes[b], b);
    }
    double t0 = now_ns();
    for (uint32_t k = 0; k < per; k++)
      for (uint32_t i = 0; i < NREQ_ALLOC; i++)
        CHECK(core_allocate(c, r[i], BS, &cow));
    double t1 = now_ns();
    for (uint32_t i = 0; i < NREQ_ALLOC; i++)
      core_preempt(c, r[i]);
    double t2 = now_ns();
    for (uint32_t k = 0; k < per * NREQ_ALLOC; k++) {
      uint32_t b = bl_pop_head(&l);
      bt_delete(&t, hashes[b]);
      l.n[b].ref = 1;
      sink += b;
    }
    double t3 = now_ns();
    for (uint32_t b = 0; b < per * NREQ_ALLOC; b++) {
      l.n[b].ref = 0;
      bl_push_tail(&l, b);
    }
    if (round >= 0) {
      e_core[round] = (t1 - t0) / (per * NREQ_ALLOC);
      e_base[round] = (t3 - t2) / (per * NREQ_ALLOC);
    }
  }
  check_core(c);
  add_row("allocate evicting (info)", n, median(e_core, rounds),
          median(e_base, rounds), 0);
  for (uint32_t i = 0; i < NREQ_ALLOC; i++)
    core_req_free(c, r[i]);
  check_core(c);
  core_destroy(c);
  free(l.n);
  free(t.s);
  free(hashes);
  free(tok);
}

int main(int argc, char **argv) {
  int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
  int rounds = quick ? 3 : 7;
  static const uint32_t sizes[] = {1u << 16, 1u << 20};
  int nsizes = quick ? 1 : 2;

  printf("core operations, block size %u: ns per block, median of %d rounds\n"
         "(absolute times drift between runs and machines; the ratio is what "
         "counts)\n",
         BS, rounds);
  printf("  %-28s %8s %9s %12s %7s  %s\n", "operation", "blocks", "core",
         "baseline", "ratio", "target 2x");
  for (int s = 0; s < nsizes; s++) {
    bench_alloc_free(sizes[s], rounds, 1);
    bench_alloc_free(sizes[s], rounds, 16);
    bench_lookup(sizes[s], rounds, 1, 1);
    bench_lookup(sizes[s], rounds, 0, 0);
    bench_evict(sizes[s], rounds);
  }
  int over = 0;
  for (int i = 0; i < nrows; i++)
    if (rows[i].target && rows[i].core_ns > 2 * rows[i].base_ns) {
      if (!over++)
        printf("over the 2x target:");
      printf(" %s at %u blocks (%.2fx);", rows[i].op, rows[i].blocks,
             rows[i].core_ns / rows[i].base_ns);
    }
  printf(over ? "\n" : "2x target met by every operation\n");
  return 0;
}
