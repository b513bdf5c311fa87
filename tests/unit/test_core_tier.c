/*
 * test_core_tier.c — the lower tiers' books in the pure core, two ways.
 *
 * 1. test_sync_vs_model: with tier_sync (the replayer's mode: a block is
 *    copied down the moment it is evicted), random requests run on the core
 *    and on a reference written here with plain arrays: a device pool with an
 *    LRU free queue, and per tier an LRU list of prefixes.  Every lookup's
 *    hit, every block id, every per-tier counter must agree.
 *
 * 2. test_async_bytes: the daemon's mode.  The test plays the daemon and the
 *    workers with a fake "content" per device block and per tier slot (the
 *    hash the bytes stand for, or garbage): moves and promotions take
 *    random time, fail at random, requests are freed while their
 *    promotion is in flight.  Whatever the core hands out must hold the
 *    right bytes: a demotion reads a block that still holds its hash, a
 *    promotion reads a slot that holds the entry's hash, and every block a
 *    lookup returns (resident or promoted) holds its hash.  Invariants
 *    (core_check, tiers included) run throughout; at the end nothing is held.
 *
 * 3. test_restore: a restarted daemon's disk tier (core_tier_restore_*)
 *    against a reference: random chains restored at random slots and
 *    gens, with duplicates; every lookup finds what the reference says,
 *    each promotion reads the newer duplicate's slot; a full restored tier
 *    drops its entries oldest gen first; misuse is refused.
 *
 * KVS_MODEL_OPS scales 1 and 2 (default 300,000 operations each).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/core/core.h"
#include "tests/unit/core_test.h"

#define BS 4
#define MAXREQ 10
#define MAXTOK 64
#define MAXB (MAXTOK / BS + 1)
#define NONE KVS_BLOCK_NONE

/* Prompts share stems and long prefixes (a small alphabet early on). */
static uint32_t gen_prompt(uint32_t *t) {
  return model_prompt(t, MAXTOK, BS);
}

static core *make_core(uint32_t nb, uint32_t reserve, uint32_t host,
                       uint32_t disk, int sync) {
  core_config cfg;
  core *c;
  kvs_layout l = {BS, 1, 1, 1, KVS_DTYPE_FP32, nb, 0};

  core_config_init(&cfg);
  cfg.num_blocks = nb;
  cfg.block_size = BS;
  cfg.reserve_blocks = reserve;
  cfg.root = core_root_hash(&l, "tier-model");
  cfg.tier_slots[CORE_TIER_HOST] = host;
  cfg.tier_slots[CORE_TIER_DISK] = disk;
  cfg.tier_sync = sync;
  cfg.tier_window = 6;
  assert_int_equal(core_create(&cfg, &c), 0);
  return c;
}

/* ==== 1. tier_sync against a reference ================================== */

#define NB 24
#define RES 2
#define HOST 20
#define DISK 40
#define SCAN 64 /* the core's scan limit for a victim (never reached here) */

typedef struct key {
  uint32_t len; /* prefix length in tokens: 0 = none */
  uint32_t t[MAXTOK];
} key;

static int key_eq(const key *a, const uint32_t *t, uint32_t len) {
  return a->len == len && memcmp(a->t, t, len * sizeof(uint32_t)) == 0;
}

typedef struct mb {
  uint32_t ref;
  int indexed;
  key k;
} mb;

typedef struct mtier {
  uint32_t cap, n;
  key lru[DISK]; /* [0] = least recently used */
  int busy[DISK];
  core_tier_stats st;
} mtier;

typedef struct mreq {
  int live;
  uint32_t nblocks, blocks[MAXB];
} mreq;

static mb M[NB];
static uint32_t mq[NB], mqlen;
static mtier T[CORE_TIERS];
static mreq R[MAXREQ];
static uint64_t m_lost, m_evictions;

static int t_find(int t, const uint32_t *p, uint32_t len) {
  for (uint32_t i = 0; i < T[t].n; i++)
    if (key_eq(&T[t].lru[i], p, len))
      return (int)i;
  return -1;
}

static key t_remove(int t, uint32_t i) {
  key k = T[t].lru[i];
  memmove(&T[t].lru[i], &T[t].lru[i + 1], (T[t].n - i - 1) * sizeof(key));
  memmove(&T[t].busy[i], &T[t].busy[i + 1], (T[t].n - i - 1) * sizeof(int));
  T[t].n--;
  return k;
}

static void t_push(int t, const key *k, int busy) {
  T[t].lru[T[t].n] = *k;
  T[t].busy[T[t].n++] = busy;
}

static uint32_t m_dev_find(const uint32_t *p, uint32_t len) {
  for (uint32_t b = 0; b < NB; b++)
    if (M[b].indexed && key_eq(&M[b].k, p, len))
      return b;
  return NONE;
}

/* Room for one more in tier t (the core's slot_take, in sync mode). */
static int t_room(int t) {
  if (T[t].n < T[t].cap)
    return 1;
  for (uint32_t i = 0; i < T[t].n && i < SCAN; i++) {
    if (T[t].busy[i])
      continue;
    if (t == CORE_TIER_HOST && T[CORE_TIER_DISK].cap &&
        m_dev_find(T[t].lru[i].t, T[t].lru[i].len) == NONE) {
      /* in sync mode an entry lives in one tier: down to disk (unless the
       * device holds the block: then the copy just goes) */
      if (!t_room(CORE_TIER_DISK))
        return 0;
      key k = t_remove(t, i);
      t_push(CORE_TIER_DISK, &k, 0);
      T[CORE_TIER_DISK].st.demotions++;
      return 1;
    }
    t_remove(t, i);
    T[t].st.drops++;
    return 1;
  }
  return 0;
}

static void m_evict(const key *k) {
  int t = T[CORE_TIER_HOST].cap ? CORE_TIER_HOST : CORE_TIER_DISK;
  for (int u = 0; u < CORE_TIERS; u++) {
    int i = t_find(u, k->t, k->len);
    if (i >= 0) { /* the copy below becomes the most recently used */
      key x = t_remove(u, (uint32_t)i);
      t_push(u, &x, 0);
      return;
    }
  }
  if (!t_room(t)) {
    m_lost++;
    return;
  }
  t_push(t, k, 0);
  T[t].st.demotions++;
}

static void mq_remove(uint32_t b) {
  for (uint32_t i = 0; i < mqlen; i++)
    if (mq[i] == b) {
      memmove(mq + i, mq + i + 1, (mqlen - i - 1) * sizeof(uint32_t));
      mqlen--;
      return;
    }
  fail_msg("model: block %u not queued", b);
}

static uint32_t m_take(void) {
  uint32_t b = mq[0];
  mq_remove(b);
  if (M[b].indexed) {
    m_evict(&M[b].k);
    m_evictions++;
  }
  M[b].indexed = 0;
  M[b].k.len = 0;
  M[b].ref = 1;
  return b;
}

static void m_put(uint32_t b) {
  if (--M[b].ref > 0)
    return;
  if (M[b].indexed) {
    mq[mqlen++] = b;
  } else {
    memmove(mq + 1, mq, mqlen * sizeof(uint32_t));
    mq[0] = b;
    mqlen++;
    M[b].k.len = 0;
  }
}

static void m_seal(uint32_t b, const uint32_t *p, uint32_t len) {
  M[b].k.len = len;
  memcpy(M[b].k.t, p, len * sizeof(uint32_t));
  if (m_dev_find(p, len) == NONE)
    M[b].indexed = 1;
}

/* lookup with promotion, everything promoted at once and successfully */
static uint32_t m_lookup(mreq *r, const uint32_t *t, uint32_t n) {
  uint32_t full = (n - 1) / BS, m = 0, dev[MAXB];
  int tier[MAXB];

  for (; m < full; m++) {
    uint32_t len = (m + 1) * BS;
    dev[m] = m_dev_find(t, len);
    tier[m] = -1;
    if (dev[m] != NONE)
      continue;
    if (t_find(CORE_TIER_HOST, t, len) >= 0)
      tier[m] = CORE_TIER_HOST;
    else if (t_find(CORE_TIER_DISK, t, len) >= 0)
      tier[m] = CORE_TIER_DISK;
    else
      break;
  }
  for (uint32_t j = 0; j < m; j++)
    if (tier[j] >= 0)
      T[tier[j]].st.hit_blocks++;
  /* the device-resident prefix is taken first, as core_lookup does */
  uint32_t keep = 0;
  for (; keep < m && dev[keep] != NONE; keep++) {
    if (M[dev[keep]].ref == 0)
      mq_remove(dev[keep]);
    M[dev[keep]].ref++;
    r->blocks[keep] = dev[keep];
  }
  uint32_t first = keep;
  int64_t avail = (int64_t)mqlen - RES;
  for (; keep < m; keep++)
    if ((tier[keep] >= 0 || M[dev[keep]].ref == 0 ? --avail : avail) < 0)
      break;
  for (uint32_t j = first; j < keep; j++)
    if (dev[j] != NONE) {
      if (M[dev[j]].ref == 0)
        mq_remove(dev[j]);
      M[dev[j]].ref++;
      r->blocks[j] = dev[j];
    } else { /* busy, and out of the victims' way */
      key k = t_remove(tier[j], (uint32_t)t_find(tier[j], t, (j + 1) * BS));
      t_push(tier[j], &k, 1);
    }
  for (uint32_t j = first; j < keep; j++)
    if (dev[j] == NONE)
      r->blocks[j] = m_take();
  for (uint32_t j = first; j < keep; j++)
    if (dev[j] == NONE) {
      int t2 = tier[j];
      int i = t_find(t2, t, (j + 1) * BS);
      key k = t_remove(t2, (uint32_t)i);
      /* the device holds it now: its copy here is the first to go */
      memmove(&T[t2].lru[1], &T[t2].lru[0], T[t2].n * sizeof(key));
      memmove(&T[t2].busy[1], &T[t2].busy[0], T[t2].n * sizeof(int));
      T[t2].lru[0] = k;
      T[t2].busy[0] = 0;
      T[t2].n++;
      T[t2].st.promotions++;
      m_seal(r->blocks[j], t, (j + 1) * BS);
    }
  r->nblocks = keep;
  return keep * BS;
}

static void m_free(mreq *r) {
  for (uint32_t i = r->nblocks; i-- > 0;)
    m_put(r->blocks[i]);
  r->nblocks = 0;
  r->live = 0;
}

static void compare(core *c, core_req **cr) {
  core_tier_stats st[CORE_TIERS];
  core_stats cs;

  for (uint32_t b = 0; b < NB; b++) {
    core_block_info bi;
    core_block_get(c, b, &bi);
    assert_int_equal(bi.ref, M[b].ref);
    assert_int_equal(bi.indexed, M[b].indexed);
  }
  for (int i = 0; i < MAXREQ; i++) {
    uint32_t n;
    const uint32_t *bl;
    if (!R[i].live)
      continue;
    bl = core_req_blocks(cr[i], &n);
    assert_int_equal(n, R[i].nblocks);
    assert_memory_equal(bl, R[i].blocks, n * sizeof(uint32_t));
  }
  core_tier_get_stats(c, st);
  core_get_stats(c, &cs);
  for (int t = 0; t < CORE_TIERS; t++) {
    assert_int_equal(st[t].slots, T[t].cap);
    assert_int_equal(st[t].used, T[t].n);
    assert_int_equal(st[t].demotions, T[t].st.demotions);
    assert_int_equal(st[t].promotions, T[t].st.promotions);
    assert_int_equal(st[t].hit_blocks, T[t].st.hit_blocks);
    assert_int_equal(st[t].drops, T[t].st.drops);
    assert_int_equal(st[t].failures, 0);
  }
  assert_int_equal(cs.tier_lost, m_lost);
  assert_int_equal(cs.evictions, m_evictions);
}

static void run_sync(uint32_t host, uint32_t disk) {
  core *c = make_core(NB, RES, host, disk, 1);
  core_req *cr[MAXREQ] = {0};
  uint32_t tok[MAXREQ][MAXTOK], ntok[MAXREQ];
  uint64_t ops = nops();

  memset(M, 0, sizeof(M));
  memset(T, 0, sizeof(T));
  memset(R, 0, sizeof(R));
  m_lost = m_evictions = 0;
  T[CORE_TIER_HOST].cap = host;
  T[CORE_TIER_DISK].cap = disk;
  for (uint32_t b = 0; b < NB; b++)
    mq[b] = b;
  mqlen = NB;
  rng = 0x2545f4914f6cdd1dull + host * 7 + disk;

  for (uint64_t op = 1; op <= ops; op++) {
    int i = (int)rnd(MAXREQ);
    if (!R[i].live) {
      core_lookup_out out;
      core_promo promos[MAXB];
      int ok[MAXB];
      uint32_t mhit;
      core_cow cow;

      ntok[i] = gen_prompt(tok[i]);
      assert_int_equal(core_req_create(c, NULL, 0, &cr[i]), 0);
      assert_int_equal(core_lookup_promote(c, cr[i], tok[i], ntok[i], 1,
                                           promos, MAXB, &out), 0);
      for (uint32_t j = 0; j < out.npromos; j++)
        ok[j] = 1;
      assert_int_equal(core_promote_finish(c, cr[i], promos, out.npromos, ok),
                       out.hit_tokens);
      R[i].live = 1;
      mhit = m_lookup(&R[i], tok[i], ntok[i]);
      assert_int_equal(out.hit_tokens, mhit);
      assert_int_equal(out.npromos, out.tier_blocks[0] + out.tier_blocks[1]);
      /* compute the rest: allocate (keeping the reserve) and commit */
      int rc = core_allocate(c, cr[i], ntok[i] - mhit, &cow);
      uint32_t nb = (ntok[i] + BS - 1) / BS - R[i].nblocks;
      if (mqlen >= nb + RES) {
        assert_int_equal(rc, 0);
        for (uint32_t j = 0; j < nb; j++)
          R[i].blocks[R[i].nblocks++] = m_take();
        assert_int_equal(core_commit(c, cr[i], mhit, tok[i] + mhit,
                                     ntok[i] - mhit, NULL), 0);
        for (uint32_t j = mhit / BS; j < ntok[i] / BS; j++)
          m_seal(R[i].blocks[j], tok[i], (j + 1) * BS);
      } else {
        assert_int_equal(rc, KVS_ENOSPC);
      }
    } else if (rnd(3) == 0) {
      core_req_free(c, cr[i]);
      m_free(&R[i]);
    }
    compare(c, cr);
    if (op % 1024 == 0)
      check(c);
  }
  core_tier_stats st[CORE_TIERS];
  core_tier_get_stats(c, st);
  print_message("host %u disk %u: promoted %llu + %llu, demoted %llu + %llu, "
                "dropped %llu + %llu, lost %llu\n", host, disk,
                (unsigned long long)st[0].promotions,
                (unsigned long long)st[1].promotions,
                (unsigned long long)st[0].demotions,
                (unsigned long long)st[1].demotions,
                (unsigned long long)st[0].drops,
                (unsigned long long)st[1].drops, (unsigned long long)m_lost);
  /* what the workload must exercise */
  if (host)
    assert_true(st[0].promotions > 1000 && st[0].drops + st[0].demotions > 1000);
  if (disk)
    assert_true(st[1].promotions > 100 && st[1].demotions > 1000);
  if (host && disk)
    assert_true(st[1].drops > 100);
  for (int i = 0; i < MAXREQ; i++)
    if (R[i].live) {
      core_req_free(c, cr[i]);
      m_free(&R[i]);
    }
  compare(c, cr);
  check(c);
  core_destroy(c);
}

static void test_sync_vs_model(void **state) {
  (void)state;
  run_sync(HOST, DISK); /* host and disk */
  run_sync(HOST, 0);    /* host only */
  run_sync(0, DISK);    /* disk only */
}

/* ==== 2. the daemon's mode, with bytes ================================== */

#define ANB 32
#define AHOST 24
#define ADISK 48
#define MAXMOVES 64

#define GARBAGE MODEL_GARBAGE

typedef struct areq {
  core_req *r;
  int live, promoting, doomed; /* doomed: freed while promoting */
  uint32_t tok[MAXTOK], n;
  core_promo promos[MAXB];
  uint32_t npromos;
} areq;

static kvs_hash128 dev_bytes[ANB], slot_bytes[CORE_TIERS][ADISK];
static core_move moves[MAXMOVES];
static uint32_t nmoves;
static areq A[MAXREQ];
static uint64_t faults, moved, promoted;

/* Every block of the request's table that is sealed holds its hash. */
static void check_req_bytes(core *c, areq *a) {
  uint32_t n;
  const uint32_t *bl = core_req_blocks(a->r, &n);
  for (uint32_t i = 0; i < core_req_num_sealed(a->r); i++) {
    core_block_info bi;
    core_block_get(c, bl[i], &bi);
    assert_true(heq(dev_bytes[bl[i]], bi.hash));
  }
  (void)n;
}

static void end_move(core *c, uint32_t k) {
  core_move m = moves[k];
  int ok = rnd(16) != 0;
  kvs_hash128 *const slots[CORE_TIERS] = {slot_bytes[0], slot_bytes[1]};

  moves[k] = moves[--nmoves];
  faults += !ok;
  moved += ok;
  model_move_end(c, &m, ok, dev_bytes, slots);
}

static void end_promotion(core *c, areq *a) {
  int ok[MAXB];
  for (uint32_t j = 0; j < a->npromos; j++) {
    core_promo *p = &a->promos[j];
    /* the slot read holds what its entry says */
    assert_true(heq(slot_bytes[p->tier][p->slot], p->hash));
    ok[j] = rnd(12) != 0; /* a failed read or a bad checksum */
    dev_bytes[p->block] = ok[j] ? slot_bytes[p->tier][p->slot] : GARBAGE;
    faults += !ok[j];
    promoted += ok[j];
  }
  core_promote_finish(c, a->doomed ? NULL : a->r, a->promos, a->npromos, ok);
  a->promoting = 0;
  if (a->doomed) {
    a->doomed = 0;
    a->live = 0;
  } else {
    check_req_bytes(c, a);
  }
}

static void new_request(core *c, areq *a) {
  core_lookup_out out;
  core_cow cow;

  memset(a, 0, sizeof(*a));
  a->n = gen_prompt(a->tok);
  a->live = 1;
  assert_int_equal(core_req_create(c, NULL, 0, &a->r), 0);
  assert_int_equal(core_lookup_promote(c, a->r, a->tok, a->n, rnd(8) != 0,
                                       a->promos, MAXB, &out), 0);
  a->npromos = out.npromos;
  if (a->npromos) {
    a->promoting = 1;
    return;
  }
  check_req_bytes(c, a);
  /* compute the rest: the worker writes garbage, then the K/V, then
   * commits */
  uint32_t hit = out.hit_tokens, nb0 = core_req_num_sealed(a->r), n;
  if (core_allocate(c, a->r, a->n - hit, &cow) != 0)
    return;
  const uint32_t *bl = core_req_blocks(a->r, &n);
  for (uint32_t j = nb0; j < n; j++)
    dev_bytes[bl[j]] = GARBAGE;
  assert_int_equal(core_commit(c, a->r, hit, a->tok + hit, a->n - hit, NULL),
                   0);
  bl = core_req_blocks(a->r, &n);
  for (uint32_t j = nb0; j < core_req_num_sealed(a->r); j++) {
    core_block_info bi;
    core_block_get(c, bl[j], &bi);
    dev_bytes[bl[j]] = bi.hash;
  }
}

/* The index as the core's observer tells it (the KV event stream's
 * source): every hash stored once, removed only when stored, each stored
 * one the hash of its tokens under its parent (the root for a chain's
 * first block), and the set always the index itself. */
static kvs_hash128 ev_set[ANB], ev_root;
static uint32_t ev_n;
static uint64_t ev_stored, ev_removed;

static int ev_find(kvs_hash128 h) {
  for (uint32_t i = 0; i < ev_n; i++)
    if (heq(ev_set[i], h))
      return (int)i;
  return -1;
}

static void ev_on_stored(void *arg, kvs_hash128 h, const kvs_hash128 *parent,
                         const uint32_t *tokens) {
  kvs_hash128 zero = {0, 0};

  assert_ptr_equal(arg, &ev_n);
  assert_true(ev_find(h) < 0);
  assert_true(ev_n < ANB);
  assert_non_null(tokens); /* verify_tokens: the core keeps them */
  assert_true(heq(core_block_hash(parent ? *parent : ev_root, zero, tokens, BS),
                  h));
  ev_set[ev_n++] = h;
  ev_stored++;
}

static void ev_on_removed(void *arg, kvs_hash128 h) {
  int i = ev_find(h);

  (void)arg;
  assert_true(i >= 0);
  ev_set[i] = ev_set[--ev_n];
  ev_removed++;
}

/* Copies below, as the tier events tell them: each (hash, tier) comes
 * once and goes once, and what they add up to is what the books hold. */
static kvs_hash128 tv_h[AHOST + ADISK];
static int tv_t[AHOST + ADISK];
static uint32_t tv_n, tv_seen;
static uint64_t tv_stored, tv_removed;

static int tv_find(kvs_hash128 h, int t) {
  for (uint32_t i = 0; i < tv_n; i++)
    if (tv_t[i] == t && heq(tv_h[i], h))
      return (int)i;
  return -1;
}

static void ev_on_tier(void *arg, kvs_hash128 h, int t, int present) {
  int i = tv_find(h, t);

  (void)arg;
  assert_true(t == CORE_TIER_HOST || t == CORE_TIER_DISK);
  if (present) {
    assert_true(i < 0);
    assert_true(tv_n < AHOST + ADISK);
    tv_h[tv_n] = h;
    tv_t[tv_n++] = t;
    tv_stored++;
  } else {
    assert_true(i >= 0);
    tv_h[i] = tv_h[--tv_n];
    tv_t[i] = tv_t[tv_n];
    tv_removed++;
  }
}

static void tv_each(void *arg, kvs_hash128 h, int t) {
  (void)arg;
  assert_true(tv_find(h, t) >= 0);
  tv_seen++;
}

static void ev_compare(core *c) {
  uint32_t indexed = 0;

  tv_seen = 0;
  core_tier_each(c, tv_each, NULL);
  assert_int_equal(tv_seen, tv_n);

  for (uint32_t b = 0; b < ANB; b++) {
    core_block_info bi;
    core_block_get(c, b, &bi);
    if (bi.indexed) {
      indexed++;
      assert_true(ev_find(bi.hash) >= 0);
    }
  }
  assert_int_equal(indexed, ev_n);
}

static void test_async_bytes(void **state) {
  (void)state;
  core *c = make_core(ANB, 2, AHOST, ADISK, 0);
  uint64_t ops = nops();
  kvs_layout l = {BS, 1, 1, 1, KVS_DTYPE_FP32, ANB, 0};
  core_observer obs = {ev_on_stored, ev_on_removed, NULL, &ev_n, ev_on_tier};

  ev_root = core_root_hash(&l, "tier-model");
  core_set_observer(c, &obs);

  rng = 0x9e3779b97f4a7c15ull;
  for (uint32_t b = 0; b < ANB; b++)
    dev_bytes[b] = GARBAGE;
  for (uint32_t s = 0; s < ADISK; s++)
    slot_bytes[0][s] = slot_bytes[1][s] = GARBAGE;

  for (uint64_t op = 1; op <= ops; op++) {
    uint32_t what = rnd(100);
    areq *a = &A[rnd(MAXREQ)];

    if (what < 30) { /* a request arrives, or one ends */
      if (!a->live)
        new_request(c, a);
      else if (a->promoting && !a->doomed && rnd(4) == 0) {
        core_req_free(c, a->r); /* its worker died mid-promotion */
        a->doomed = 1;
      } else if (!a->promoting) {
        core_req_free(c, a->r);
        a->live = 0;
      }
    } else if (what < 50) { /* a promotion completes */
      if (a->promoting)
        end_promotion(c, a);
    } else if (what < 65) { /* the daemon's demotion timer */
      nmoves += core_tier_plan(c, moves + nmoves, MAXMOVES - nmoves);
    } else if (nmoves) { /* a move completes */
      end_move(c, rnd(nmoves));
    }
    if (op % 256 == 0) {
      check(c);
      ev_compare(c);
    }
  }
  while (nmoves)
    end_move(c, nmoves - 1);
  for (int i = 0; i < MAXREQ; i++) {
    if (A[i].promoting)
      end_promotion(c, &A[i]);
    if (A[i].live) {
      core_req_free(c, A[i].r);
      A[i].live = 0;
    }
  }
  check(c);

  core_tier_stats st[CORE_TIERS];
  core_stats cs;
  core_tier_get_stats(c, st);
  core_get_stats(c, &cs);
  print_message("moves ok %llu, promotions ok %llu, faults %llu, host "
                "promotions %llu, disk promotions %llu, lost %llu\n",
                (unsigned long long)moved, (unsigned long long)promoted,
                (unsigned long long)faults,
                (unsigned long long)st[0].promotions,
                (unsigned long long)st[1].promotions,
                (unsigned long long)cs.tier_lost);
  assert_true(st[0].promotions > 1000 && st[1].promotions > 100);
  assert_true(st[0].failures > 100 && st[1].failures > 10);
  assert_true(st[1].demotions > 1000);
  assert_int_equal(cs.used_blocks, 0);
  ev_compare(c);
  print_message("observer: %llu stored, %llu removed, %u indexed\n",
                (unsigned long long)ev_stored, (unsigned long long)ev_removed,
                ev_n);
  assert_true(ev_stored > 1000 && ev_removed > 1000);
  print_message("tier events: %llu stored, %llu removed, %u present\n",
                (unsigned long long)tv_stored, (unsigned long long)tv_removed,
                tv_n);
  assert_true(tv_stored > 1000 && tv_removed > 1000);
  assert_true(tv_stored == moved); /* one per copy down that landed */
  for (uint32_t b = 0; b < ANB; b++) {
    core_block_info bi;
    core_block_get(c, b, &bi);
    assert_false(bi.busy);
    if (bi.indexed) /* what stays cached holds its bytes */
      assert_true(heq(dev_bytes[b], bi.hash));
  }
  core_destroy(c);
}

/* A lookup without promotion takes only resident blocks, and counts what
 * lies below; the tier stats say where. */
static void test_no_promote(void **state) {
  (void)state;
  core *c = make_core(8, 0, 8, 0, 1);
  core_req *r;
  core_lookup_out out;
  core_promo promos[MAXB];
  core_cow cow;
  uint32_t t[4 * BS + 1];

  for (uint32_t i = 0; i < 4 * BS + 1; i++)
    t[i] = 7 + i;
  /* cache 4 blocks, then push them out of the 8-block pool */
  assert_int_equal(core_req_create(c, NULL, 0, &r), 0);
  assert_int_equal(core_allocate(c, r, 4 * BS, &cow), 0);
  assert_int_equal(core_commit(c, r, 0, t, 4 * BS, NULL), 0);
  core_req_free(c, r);
  assert_int_equal(core_req_create(c, NULL, 0, &r), 0);
  assert_int_equal(core_allocate(c, r, 8 * BS, &cow), 0);
  core_req_free(c, r);

  core_tier_stats st[CORE_TIERS];
  core_tier_get_stats(c, st);
  assert_int_equal(st[0].used, 4);
  assert_int_equal(st[0].demotions, 4);

  assert_int_equal(core_req_create(c, NULL, 0, &r), 0);
  assert_int_equal(core_lookup_promote(c, r, t, 4 * BS + 1, 0, promos, MAXB,
                                       &out), 0);
  assert_int_equal(out.hit_tokens, 0);
  assert_int_equal(out.tier_blocks[0], 4);
  assert_int_equal(out.npromos, 0);
  core_req_free(c, r);

  /* with promotion, limited by max_promos to 3 */
  assert_int_equal(core_req_create(c, NULL, 0, &r), 0);
  assert_int_equal(core_lookup_promote(c, r, t, 4 * BS + 1, 1, promos, 3,
                                       &out), 0);
  assert_int_equal(out.npromos, 3);
  assert_int_equal(out.hit_tokens, 3 * BS);
  /* the second fails: the request keeps one block */
  int ok[3] = {1, 0, 1};
  assert_int_equal(core_promote_finish(c, r, promos, 3, ok), BS);
  assert_int_equal(core_req_num_sealed(r), 1);
  core_tier_get_stats(c, st);
  assert_int_equal(st[0].promotions, 2);
  assert_int_equal(st[0].failures, 1);
  assert_int_equal(st[0].used, 3); /* the bad copy is gone */
  assert_int_equal(st[0].hit_blocks, 4 + 4);
  check(c);
  core_req_free(c, r);
  check(c);

  /* Copies that could not start (the daemon out of memory: ok NULL): the
   * request keeps nothing, and the copies below are neither failures nor
   * dropped: a later lookup promotes them.  (Another prompt, all of it
   * below: the first one's chain now breaks at its dropped copy.) */
  uint32_t t2[4 * BS + 1];
  for (uint32_t i = 0; i < 4 * BS + 1; i++)
    t2[i] = 5000 + i;
  assert_int_equal(core_req_create(c, NULL, 0, &r), 0);
  assert_int_equal(core_allocate(c, r, 4 * BS, &cow), 0);
  assert_int_equal(core_commit(c, r, 0, t2, 4 * BS, NULL), 0);
  core_req_free(c, r);
  assert_int_equal(core_req_create(c, NULL, 0, &r), 0);
  assert_int_equal(core_allocate(c, r, 8 * BS, &cow), 0);
  core_req_free(c, r);
  core_tier_get_stats(c, st);
  uint32_t used = st[0].used;
  assert_int_equal(core_req_create(c, NULL, 0, &r), 0);
  assert_int_equal(core_lookup_promote(c, r, t2, 4 * BS + 1, 1, promos, MAXB,
                                       &out), 0);
  assert_int_equal(out.npromos, 4);
  assert_int_equal(core_promote_finish(c, r, promos, 4, NULL), 0);
  core_tier_get_stats(c, st);
  assert_int_equal(st[0].failures, 1);
  assert_int_equal(st[0].used, used);
  check(c);
  core_req_free(c, r);
  assert_int_equal(core_req_create(c, NULL, 0, &r), 0);
  assert_int_equal(core_lookup_promote(c, r, t2, 4 * BS + 1, 1, promos, MAXB,
                                       &out), 0);
  assert_int_equal(out.npromos, 4);
  int all[MAXB];
  for (uint32_t i = 0; i < out.npromos; i++)
    all[i] = 1;
  assert_int_equal(core_promote_finish(c, r, promos, out.npromos, all),
                   4 * BS);
  core_tier_get_stats(c, st);
  assert_int_equal(st[0].failures, 1);
  check(c);
  core_req_free(c, r);
  check(c);
  core_destroy(c);
}

/* ==== 3. restart ========================================================== */

#define RNB 64  /* pool */
#define RP 40   /* prompts */
#define RL 3    /* full blocks each */
#define RDISK 160

typedef struct ritem {
  uint32_t p, i, slot;
  uint64_t gen;
} ritem;

static uint32_t r_tok[RP][RL * BS + 1];
static kvs_hash128 r_hash[RP][RL];
/* the reference: the copy a restore keeps of each block (slot NONE: none) */
static uint32_t r_slot[RP][RL];
static uint64_t r_gen[RP][RL];

static void r_prompts(uint32_t salt) {
  kvs_layout l = {BS, 1, 1, 1, KVS_DTYPE_FP32, RNB, 0};
  kvs_hash128 zero = {0, 0};

  for (uint32_t p = 0; p < RP; p++) {
    kvs_hash128 parent = core_root_hash(&l, "tier-model");
    for (uint32_t k = 0; k < RL * BS + 1; k++)
      r_tok[p][k] = salt * 1000000 + p * 1000 + k;
    for (uint32_t i = 0; i < RL; i++) {
      r_hash[p][i] = core_block_hash(parent, zero, &r_tok[p][i * BS], BS);
      parent = r_hash[p][i];
      r_slot[p][i] = NONE;
    }
  }
}

/* Blocks of prompt p found below by a lookup without promotion. */
static uint32_t r_found(core *c, uint32_t p) {
  core_req *r;
  core_lookup_out out;
  core_promo promos[RL];

  assert_int_equal(core_req_create(c, NULL, 0, &r), 0);
  assert_int_equal(core_lookup_promote(c, r, r_tok[p], RL * BS + 1, 0,
                                       promos, RL, &out), 0);
  assert_int_equal(out.hit_tokens, 0);
  core_req_free(c, r);
  return out.tier_blocks[CORE_TIER_DISK];
}

/* Restores items[0..n) in their order; checks each return against the
 * reference; returns the entries kept. */
static uint32_t r_restore(core *c, const ritem *items, uint32_t n) {
  uint32_t kept = 0;

  assert_int_equal(core_tier_restore_begin(c, CORE_TIER_DISK), 0);
  for (uint32_t k = 0; k < n; k++) {
    const ritem *x = &items[k];
    int dup = r_slot[x->p][x->i] != NONE;
    int rc = core_tier_restore(c, x->slot, x->gen, r_hash[x->p][x->i],
                               &r_tok[x->p][x->i * BS]);

    assert_int_equal(rc, dup);
    if (!dup || x->gen > r_gen[x->p][x->i]) {
      r_slot[x->p][x->i] = x->slot;
      r_gen[x->p][x->i] = x->gen;
    }
    kept += !dup;
    /* misuse: a slot given twice, out of range; no token ids */
    if (k == n / 2) { /* (x's hash holds r_slot's slot, whichever copy won) */
      assert_int_equal(core_tier_restore(c, r_slot[x->p][x->i], 1, r_hash[0][0],
                                         r_tok[0]), KVS_EINVAL);
      assert_int_equal(core_tier_restore(c, RDISK + 5, 1, r_hash[0][0],
                                         r_tok[0]), KVS_EINVAL);
      assert_int_equal(core_tier_restore(c, items[n - 1].slot, 1,
                                         r_hash[0][0], NULL), KVS_EINVAL);
      char msg[128];
      assert_int_not_equal(core_check(c, msg, sizeof(msg)), 0);
    }
  }
  assert_int_equal(core_tier_restore_end(c), kept);
  check(c);
  return kept;
}

static void test_restore(void **state) {
  (void)state;
  core *c = make_core(RNB, 0, 0, RDISK, 0);
  ritem items[RDISK];
  uint32_t slots[RDISK], n = 0;
  uint64_t gens[RDISK];

  rng = 0x5eed;
  r_prompts(1);
  /* Random slots and gens (distinct); most blocks restored, some twice. */
  for (uint32_t s = 0; s < RDISK; s++) {
    slots[s] = s;
    gens[s] = 100 + s;
  }
  for (uint32_t s = RDISK; s-- > 1;) {
    uint32_t j = rnd(s + 1), t = slots[s];
    uint64_t g = gens[s];
    slots[s] = slots[j];
    slots[j] = t;
    j = rnd(s + 1);
    gens[s] = gens[j];
    gens[j] = g;
  }
  for (uint32_t p = 0; p < RP; p++)
    for (uint32_t i = 0; i < RL; i++)
      for (uint32_t copies = rnd(6) == 0 ? 0 : 1 + (rnd(5) == 0); copies;
           copies--) {
        items[n].p = p;
        items[n].i = i;
        items[n].slot = slots[n];
        items[n].gen = gens[n];
        n++;
      }
  assert_true(n <= RDISK);
  uint32_t kept = r_restore(c, items, n);
  print_message("restore: %u items, %u kept, %u duplicates\n", n, kept,
                n - kept);
  assert_true(kept > RP && n - kept > 5);

  core_tier_stats st[CORE_TIERS];
  core_tier_get_stats(c, st);
  assert_int_equal(st[CORE_TIER_DISK].used, kept);
  /* A second restore: the tier holds entries now. */
  assert_int_equal(core_tier_restore_begin(c, CORE_TIER_DISK), KVS_ESTATE);
  assert_int_equal(core_tier_restore_begin(c, CORE_TIER_HOST), KVS_EINVAL);
  assert_int_equal(core_tier_restore(c, 0, 1, r_hash[0][0], r_tok[0]),
                   KVS_ESTATE);

  /* Lookups find the restored prefix of each chain; promotions read the
   * kept (newer) copy's slot and index the blocks. */
  for (uint32_t p = 0; p < RP; p++) {
    uint32_t want = 0;
    while (want < RL && r_slot[p][want] != NONE)
      want++;
    assert_int_equal(r_found(c, p), want);
    if (p % 2)
      continue;
    core_req *r;
    core_lookup_out out;
    core_promo promos[RL];
    int ok[RL] = {1, 1, 1};
    assert_int_equal(core_req_create(c, NULL, 0, &r), 0);
    assert_int_equal(core_lookup_promote(c, r, r_tok[p], RL * BS + 1, 1,
                                         promos, RL, &out), 0);
    assert_int_equal(out.npromos, want);
    for (uint32_t k = 0; k < out.npromos; k++) {
      assert_int_equal(promos[k].tier, CORE_TIER_DISK);
      assert_int_equal(promos[k].slot, r_slot[p][k]);
      assert_true(heq(promos[k].hash, r_hash[p][k]));
    }
    assert_int_equal(core_promote_finish(c, r, promos, out.npromos, ok),
                     want * BS);
    core_req_free(c, r);
    check(c);
  }
  core_tier_get_stats(c, st);
  assert_int_equal(st[CORE_TIER_DISK].failures, 0);
  core_destroy(c);

  /* A full tier, one block per prompt: new demotions drop the restored
   * entries oldest gen first. */
  c = make_core(8, 0, 0, RP, 0);
  r_prompts(2);
  for (uint32_t k = 0; k < RP; k++) {
    items[k].p = k;
    items[k].i = 0;
    items[k].slot = (k * 7 + 3) % RP;    /* a permutation of the slots */
    items[k].gen = 1 + (k * 13 + 5) % RP; /* and of the gens */
  }
  assert_int_equal(r_restore(c, items, RP), RP);
  core_tier_get_stats(c, st);
  assert_int_equal(st[CORE_TIER_DISK].used, RP);

  /* New blocks fill the pool, are freed (cached), and go down. */
  uint32_t tok[4 * BS];
  core_req *r;
  core_cow cow;
  uint32_t drops = 0;
  for (uint32_t round = 0; round < 6; round++) {
    for (uint32_t k = 0; k < 4 * BS; k++)
      tok[k] = 900000 + round * 100 + k;
    assert_int_equal(core_req_create(c, NULL, 0, &r), 0);
    assert_int_equal(core_allocate(c, r, 4 * BS, &cow), 0);
    assert_int_equal(core_commit(c, r, 0, tok, 4 * BS, NULL), 0);
    core_req_free(c, r);
    core_move mv[16];
    uint32_t nm;
    while ((nm = core_tier_plan(c, mv, 16)) > 0)
      for (uint32_t k = 0; k < nm; k++)
        core_tier_done(c, &mv[k], 1);
    check(c);
    core_tier_get_stats(c, st);
    drops = (uint32_t)st[CORE_TIER_DISK].drops;
    /* the `drops` oldest gens are gone, the others are all there */
    for (uint32_t p = 0; p < RP; p++)
      assert_int_equal(r_found(c, p), items[p].gen > drops ? 1 : 0);
  }
  print_message("full tier: %u restored entries dropped, oldest first\n",
                drops);
  assert_true(drops >= 4);
  core_destroy(c);
}

/* ==== 4. the window under lookups ======================================= */

/* A slow tier (no copy down ever completes here) and lookups that hit the
 * blocks being copied: each hit takes its block off the free queue's cold
 * end, and its release puts it back at the warm end.  The blocks being
 * copied down stay within the window wherever they are, so a pool that no
 * request holds always has room: compute 40 prompts, look them all up,
 * compute 40 more, planning moves after every step as the daemon does. */
static void test_window_under_lookups(void **state) {
  enum { POOL = 64, WINDOW = 16, PROMPTS = 56, LEN = BS + 1, LONG = 12 * BS };
  core_move mv[POOL];
  uint32_t tok[LONG];
  uint32_t planned = 0, refused = 0;
  char msg[256];
  core_config cfg;
  kvs_layout l = {BS, 1, 1, 1, KVS_DTYPE_FP32, POOL, 0};
  core *c;

  (void)state;
  core_config_init(&cfg);
  cfg.num_blocks = POOL;
  cfg.block_size = BS;
  cfg.root = core_root_hash(&l, "window-model");
  cfg.tier_slots[CORE_TIER_DISK] = 4 * POOL;
  cfg.tier_window = WINDOW;
  assert_int_equal(core_create(&cfg, &c), 0);
  for (int pass = 0; pass < 3; pass++)
    for (uint32_t p = 0; p < PROMPTS; p++) {
      core_req *r;
      core_cow cow;
      uint32_t hit;

      uint32_t len = pass == 2 ? LONG : LEN; /* 12 blocks at once */

      for (uint32_t i = 0; i < len; i++) /* pass 1 looks up pass 0's */
        tok[i] = (pass == 2 ? 100000 : 0) + p * 1000 + i + 1;
      assert_int_equal(core_req_create(c, NULL, 0, &r), 0);
      assert_int_equal(core_lookup(c, r, tok, len, &hit), 0);
      if (pass != 1) {
        int rc = core_allocate(c, r, len - hit, &cow);

        if (rc == KVS_ENOSPC)
          refused++;
        else
          assert_int_equal(rc, 0);
        if (rc == 0)
          assert_int_equal(core_commit(c, r, hit, tok + hit, len - hit, NULL),
                           0);
      } else {
        assert_int_equal(hit, BS); /* its sealed block */
      }
      core_req_free(c, r);
      planned += core_tier_plan(c, mv, POOL); /* never done: a slow disk */
      if (core_check(c, msg, sizeof(msg)) != 0)
        fail_msg("pass %d prompt %u: %s", pass, p, msg);
    }
  print_message("%u copies down started (window %u), %u allocations "
                "refused\n", planned, WINDOW, refused);
  assert_int_equal(refused, 0);
  assert_int_equal(planned, WINDOW);
  core_destroy(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_restore),
      cmocka_unit_test(test_no_promote),
      cmocka_unit_test(test_sync_vs_model),
      cmocka_unit_test(test_async_bytes),
      cmocka_unit_test(test_window_under_lookups),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
