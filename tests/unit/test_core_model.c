/*
 * test_core_model.c — over a million random operations, each run on the core
 * and on a plain reference model written here without hashing, without an
 * index and with O(n) lists, then compared: status codes, hit counts, every
 * block id handed out, copy-on-write pairs and block counts.  The invariant
 * check runs every few hundred operations and at the end.
 *
 * The model keys a sealed block by (salt, every token of its prefix), which
 * is what the chained hash stands for, so any divergence in hashing, index,
 * eviction order or request bookkeeping shows up as a mismatch.
 *
 * It runs once per eviction policy.  Each policy's model below is written
 * from the policy's rules with arrays and linear scans (no segment marks,
 * buckets or hash index), so the O(1) bookkeeping of the real one is
 * checked against the plain statement of what it should do.  The offline
 * policy gets random hints from the driver.
 *
 * KVS_MODEL_OPS overrides the number of operations per policy (default
 * 1,000,000).
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

#define NB 48
#define BS 4
#define RESERVE 3
#define MAXREQ 12
#define MAXTOK 96
#define NONE KVS_BLOCK_NONE

/* ---- the reference model ---------------------------------------------- */

typedef struct mblock {
  uint32_t ref;
  int sealed, indexed;
  int salt;
  uint32_t keylen;           /* prefix length in tokens */
  uint32_t key[MAXTOK];      /* the whole prefix up to this block's end */
} mblock;

typedef struct mreq {
  int live;
  int salt;
  uint32_t tokens[MAXTOK];
  uint32_t known, slots, written, sealed, nblocks;
  uint32_t blocks[MAXTOK / BS + 2];
} mreq;

static mblock mb[NB];
static uint32_t mq[NB], mqlen; /* free queue, head first */
static mreq mr[MAXREQ];

static void mq_remove(uint32_t b) {
  for (uint32_t i = 0; i < mqlen; i++)
    if (mq[i] == b) {
      memmove(mq + i, mq + i + 1, (mqlen - i - 1) * sizeof(uint32_t));
      mqlen--;
      return;
    }
  fail_msg("model: block %u not on the queue", b);
}
static void mq_push_head(uint32_t b) {
  memmove(mq + 1, mq, mqlen * sizeof(uint32_t));
  mq[0] = b;
  mqlen++;
}
static void mq_push_tail(uint32_t b) { mq[mqlen++] = b; }

/* ---- the policies' models ------------------------------------------------
 * Per block: slru's seen/reused/hot, mq's frequency/level/stamp, opt's
 * hint.  Ghosts: evicted blocks' keys, oldest first, with what the policy
 * remembers of them. */
enum { P_LRU, P_SLRU, P_MQ, P_OPT };
static int pol;
#define NEVER UINT32_MAX

typedef struct mpol {
  int seen, reused, hot;         /* slru */
  uint32_t freq, lvl, stamp;     /* mq: lvl is the level + 1 while queued */
  uint32_t hint, queued_hint;    /* opt: queued_hint NEVER = no bucket */
} mpol;
static mpol mp[NB];

typedef struct mghost {
  int live, salt, hot;
  uint32_t keylen, key[MAXTOK], freq;
} mghost;
#define NGHOST (8 * NB)
static mghost mg[NGHOST];
static uint32_t mg_n, mg_cap, mg_count[2];

/* slru's numbers for NB blocks (policy_slru.c: 95%, 5%, 4 ghosts per
 * block); mq's (8 levels, life 2 x NB, 8 ghosts per block). */
static uint32_t s_hot_max, s_hot_cap = NB * 95 / 100, s_hot_min = NB * 5 / 100;
static uint64_t m_now;
#define MQ_LEVELS 8
#define MQ_LIFE (2 * NB)

/* What a policy knows of a block that was just taken (or never used). */
static void mp_clear(uint32_t b) {
  memset(&mp[b], 0, sizeof(mp[b]));
  mp[b].hint = mp[b].queued_hint = NEVER;
}

static void mg_reset(void) {
  memset(mg, 0, sizeof(mg));
  for (uint32_t b = 0; b < NB; b++)
    mp_clear(b);
  mg_n = mg_count[0] = mg_count[1] = 0;
  mg_cap = pol == P_SLRU ? 4 * NB : 8 * NB;
  s_hot_max = s_hot_cap;
  m_now = 0;
}

static int mg_find(const mblock *x) {
  for (uint32_t i = 0; i < mg_n; i++)
    if (mg[i].live && mg[i].salt == x->salt && mg[i].keylen == x->keylen &&
        memcmp(mg[i].key, x->key, x->keylen * sizeof(uint32_t)) == 0)
      return (int)i;
  return -1;
}

static void mg_kill(int i) {
  mg[i].live = 0;
  mg_count[mg[i].hot]--;
}

static void mg_add(const mblock *x, int hot, uint32_t freq) {
  int old = mg_find(x);
  if (mg_n == mg_cap) { /* the oldest goes */
    if (mg[0].live)
      mg_kill(0);
    memmove(mg, mg + 1, (mg_n - 1) * sizeof(mg[0]));
    mg_n--;
    if (old > 0)
      old--;
    else if (old == 0)
      old = -1;
  }
  if (old >= 0)
    mg_kill(old);
  mghost *g = &mg[mg_n++];
  g->live = 1;
  g->salt = x->salt;
  g->hot = hot;
  g->freq = freq;
  g->keylen = x->keylen;
  memcpy(g->key, x->key, x->keylen * sizeof(uint32_t));
  mg_count[hot]++;
}

static void mq_insert_at(uint32_t i, uint32_t b) {
  memmove(mq + i + 1, mq + i, (mqlen - i) * sizeof(uint32_t));
  mq[i] = b;
  mqlen++;
}

static void slru_put(uint32_t b) {
  mpol *p = &mp[b];
  if (!p->seen) {
    int g = mg_find(&mb[b]);
    p->seen = 1;
    if (g >= 0) {
      int hot = mg[g].hot;
      mg_kill(g);
      p->reused = 1;
      if (hot) {
        uint32_t step = mg_count[1] ? mg_count[0] / mg_count[1] : mg_count[0];
        s_hot_max += step ? step : 1;
        if (s_hot_max > s_hot_cap)
          s_hot_max = s_hot_cap;
      } else {
        uint32_t step = mg_count[0] ? mg_count[1] / mg_count[0] : mg_count[1];
        step = step ? step : 1;
        s_hot_max = s_hot_max - s_hot_min > step ? s_hot_max - step : s_hot_min;
      }
    }
  }
  uint32_t first_hot = 0, hot = 0;
  while (first_hot < mqlen && !mp[mq[first_hot]].hot)
    first_hot++;
  if (!p->reused) {
    mq_insert_at(first_hot, b);
    return;
  }
  mq_push_tail(b);
  p->hot = 1;
  for (uint32_t i = 0; i < mqlen; i++)
    hot += mp[mq[i]].hot;
  for (uint32_t i = 0; i < mqlen && hot > s_hot_max; i++)
    if (mp[mq[i]].hot) {
      mp[mq[i]].hot = 0;
      hot--;
    }
}

static void mq_put(uint32_t b) {
  mpol *p = &mp[b];
  if (p->freq == 0) {
    int g = mg_find(&mb[b]);
    p->freq = 1;
    if (g >= 0) {
      p->freq += mg[g].freq;
      if (p->freq > 0xfff)
        p->freq = 0xfff;
      mg_kill(g);
    }
    p->stamp = (uint32_t)++m_now;
  }
  uint32_t f = p->freq, l = 0;
  while (l + 1 < MQ_LEVELS && f >> (l + 1))
    l++;
  uint32_t at = 0;
  while (at < mqlen && mp[mq[at]].lvl <= l + 1)
    at++;
  mq_insert_at(at, b);
  p->lvl = l + 1;
  for (uint32_t k = 1; k < MQ_LEVELS; k++) { /* aging: each level's head */
    for (uint32_t i = 0; i < mqlen; i++) {
      mpol *h = &mp[mq[i]];
      if (h->lvl != k + 1)
        continue;
      if ((uint32_t)m_now - h->stamp >= MQ_LIFE) {
        h->lvl = k;
        h->freq = h->freq / 2 > 1u << (k - 1) ? h->freq / 2 : 1u << (k - 1);
        h->stamp = (uint32_t)m_now;
      }
      break;
    }
  }
}

static void opt_put(uint32_t b) {
  uint32_t k = mp[b].hint, i = 0;
  if (k == NEVER) {
    mq_push_head(b);
    return;
  }
  /* after every block used no sooner, before the first one used sooner */
  while (i < mqlen && (mp[mq[i]].queued_hint == NEVER || mp[mq[i]].queued_hint >= k))
    i++;
  mq_insert_at(i, b);
  mp[b].queued_hint = k;
}

/* b leaves the queue (a hit, or taken for allocation). */
static void mpol_off_queue(uint32_t b) {
  mp[b].hot = 0;
  mp[b].lvl = 0;
  mp[b].queued_hint = NEVER;
}


static uint32_t m_find(int salt, const uint32_t *prefix, uint32_t len) {
  for (uint32_t b = 0; b < NB; b++)
    if (mb[b].indexed && mb[b].salt == salt && mb[b].keylen == len &&
        memcmp(mb[b].key, prefix, len * sizeof(uint32_t)) == 0)
      return b;
  return NONE;
}

static uint32_t m_take(void) {
  uint32_t b = mq[0];
  mq_remove(b);
  mpol_off_queue(b);
  if (mb[b].indexed && pol == P_SLRU)
    mg_add(&mb[b], mp[b].reused, 0);
  if (mb[b].indexed && pol == P_MQ)
    mg_add(&mb[b], 0, mp[b].freq);
  mp_clear(b);
  mb[b].indexed = mb[b].sealed = 0;
  mb[b].ref = 1;
  return b;
}

static void m_put(uint32_t b) {
  if (--mb[b].ref > 0)
    return;
  if (!mb[b].indexed) {
    mb[b].sealed = 0;
    mp_clear(b);
    mq_push_head(b);
  } else if (pol == P_SLRU) {
    slru_put(b);
  } else if (pol == P_MQ) {
    mq_put(b);
  } else if (pol == P_OPT) {
    opt_put(b);
  } else {
    mq_push_tail(b);
  }
}

static void m_release(mreq *r) {
  for (uint32_t i = r->nblocks; i-- > 0;)
    m_put(r->blocks[i]);
  r->nblocks = r->slots = r->written = r->sealed = 0;
}

static int m_lookup(mreq *r, const uint32_t *t, uint32_t n, uint32_t *hit) {
  *hit = 0;
  if (r->nblocks || r->slots)
    return KVS_ESTATE;
  uint32_t full = n ? (n - 1) / BS : 0, h = 0;
  while (h < full && m_find(r->salt, t, (h + 1) * BS) != NONE)
    h++;
  for (uint32_t i = 0; i < h; i++) {
    uint32_t b = m_find(r->salt, t, (i + 1) * BS);
    if (mb[b].ref == 0) {
      mq_remove(b);
      mpol_off_queue(b);
    }
    mp[b].reused = 1;
    if (pol == P_MQ) {
      mp[b].freq += mp[b].freq < 0xfff;
      mp[b].stamp = (uint32_t)++m_now;
    }
    mb[b].ref++;
    r->blocks[i] = b;
  }
  memcpy(r->tokens, t, n * sizeof(uint32_t));
  r->known = n;
  r->nblocks = r->sealed = h;
  r->slots = r->written = h * BS;
  *hit = h * BS;
  return 0;
}

static int m_alloc(mreq *r, uint32_t n, uint32_t reserve, core_cow *cow) {
  cow->src = cow->dst = NONE;
  if (n == 0)
    return 0;
  uint32_t end = r->slots + n;
  int need_cow = r->slots % BS != 0 && mb[r->blocks[r->nblocks - 1]].ref > 1;
  uint32_t nb = (end + BS - 1) / BS - r->nblocks;
  if (mqlen < nb + need_cow + reserve)
    return KVS_ENOSPC;
  if (need_cow) {
    uint32_t src = r->blocks[r->nblocks - 1], dst = m_take();
    m_put(src);
    r->blocks[r->nblocks - 1] = dst;
    cow->src = src;
    cow->dst = dst;
  }
  for (uint32_t i = 0; i < nb; i++)
    r->blocks[r->nblocks++] = m_take();
  r->slots = end;
  return 0;
}

static int m_commit(mreq *r, uint32_t start, const uint32_t *t, uint32_t n) {
  if (start > r->written)
    return KVS_ERANGE;
  uint32_t end = start + n;
  if (end > r->slots)
    return KVS_ERANGE;
  if (t == NULL && end > r->known)
    return KVS_EINVAL;
  uint32_t all[MAXTOK];
  memcpy(all, r->tokens, r->known * sizeof(uint32_t));
  for (uint32_t p = start; t != NULL && p < end; p++) {
    if (p < r->known && r->tokens[p] != t[p - start])
      return KVS_EMISMATCH;
    all[p] = t[p - start];
  }
  uint32_t nw = end > r->written ? end : r->written, full = nw / BS;
  for (uint32_t i = r->sealed; i < full; i++) {
    mblock *x = &mb[r->blocks[i]];
    if (x->sealed && (x->keylen != (i + 1) * BS || x->salt != r->salt ||
                      memcmp(x->key, all, x->keylen * sizeof(uint32_t))))
      return KVS_EMISMATCH;
  }
  if (end > r->known) {
    memcpy(r->tokens, all, end * sizeof(uint32_t));
    r->known = end;
  }
  r->written = nw;
  for (uint32_t i = r->sealed; i < full; i++) {
    uint32_t b = r->blocks[i];
    mblock *x = &mb[b];
    if (x->sealed)
      continue;
    x->sealed = 1;
    x->salt = r->salt;
    x->keylen = (i + 1) * BS;
    memcpy(x->key, r->tokens, x->keylen * sizeof(uint32_t));
    if (m_find(r->salt, r->tokens, x->keylen) == NONE)
      x->indexed = 1;
  }
  r->sealed = full;
  return 0;
}

static int m_fork(mreq *r, mreq *k) {
  if (r->written != r->slots)
    return KVS_ESTATE;
  *k = *r;
  for (uint32_t i = 0; i < r->nblocks; i++)
    mb[r->blocks[i]].ref++;
  return 0;
}

/* ---- the driver ------------------------------------------------------- */

static core *c;
static core_req *cr[MAXREQ];
static const char *salts[] = {"", "tenant-1"};

/* A prompt: one of a few shared stems, then random tokens from a small
 * alphabet so that longer prefixes are shared too. */
static uint32_t gen_prompt(uint32_t *t) {
  uint32_t n = 1 + rnd(MAXTOK / 2);
  uint32_t stem = rnd(4);
  for (uint32_t i = 0; i < n; i++)
    t[i] = i < 2 * BS * stem ? 1000 * (stem + 1) + i : rnd(i < 3 * BS ? 2 : 6);
  return n;
}

static void compare_req(int i) {
  uint32_t n;
  const uint32_t *b = core_req_blocks(cr[i], &n);
  assert_int_equal(n, mr[i].nblocks);
  assert_memory_equal(b, mr[i].blocks, n * sizeof(uint32_t));
  assert_int_equal(core_req_num_slots(cr[i]), mr[i].slots);
  assert_int_equal(core_req_num_written(cr[i]), mr[i].written);
  assert_int_equal(core_req_num_sealed(cr[i]), mr[i].sealed);
  assert_int_equal(core_req_num_known(cr[i]), mr[i].known);
}

static void compare_counts(void) {
  core_stats st;
  uint32_t cached = 0;
  core_get_stats(c, &st);
  for (uint32_t b = 0; b < NB; b++) {
    core_block_info bi;
    core_block_get(c, b, &bi);
    assert_int_equal(bi.ref, mb[b].ref);
    assert_int_equal(bi.indexed, mb[b].indexed);
    cached += mb[b].ref == 0 && mb[b].indexed;
  }
  assert_int_equal(st.free_blocks + st.cached_blocks, mqlen);
  assert_int_equal(st.cached_blocks, cached);
}

static void check_invariant(void) {
  char msg[256];
  if (core_check(c, msg, sizeof(msg)) != 0)
    fail_msg("invariant: %s", msg);
}

static void one_op(uint64_t opno) {
  int i = (int)rnd(MAXREQ), rc, mrc;
  uint32_t t[MAXTOK], hit, mhit;
  core_cow cow, mcow;
  uint32_t op = rnd(100);

  if (!mr[i].live) { /* create, and usually look up at once */
    int s = (int)rnd(2);
    assert_int_equal(core_req_create(c, salts[s], strlen(salts[s]), &cr[i]), 0);
    memset(&mr[i], 0, sizeof(mr[i]));
    mr[i].live = 1;
    mr[i].salt = s;
    op = 0;
  }
  if (op < 15) { /* lookup */
    uint32_t n = gen_prompt(t);
    rc = core_lookup(c, cr[i], t, n, &hit);
    mrc = m_lookup(&mr[i], t, n, &mhit);
    assert_int_equal(rc, mrc);
    assert_int_equal(hit, mhit);
  } else if (op < 35) { /* allocate or append */
    uint32_t room = MAXTOK - mr[i].slots;
    if (room == 0)
      return;
    uint32_t n = 1 + rnd(room < 3 * BS ? room : 3 * BS);
    int app = rnd(2);
    rc = app ? core_append(c, cr[i], n, &cow) : core_allocate(c, cr[i], n, &cow);
    mrc = m_alloc(&mr[i], n, app ? 0 : RESERVE, &mcow);
    assert_int_equal(rc, mrc);
    assert_int_equal(cow.src, mcow.src);
    assert_int_equal(cow.dst, mcow.dst);
  } else if (op < 65) { /* commit: mostly valid, sometimes not */
    mreq *m = &mr[i];
    uint32_t start = m->written, n;
    int kind = (int)rnd(10);
    if (kind == 0 && m->written > 0)
      start = rnd(m->written + 1);                 /* rewrite (idempotent) */
    else if (kind == 1)
      start = m->written + 1 + rnd(3);             /* a gap */
    uint32_t room = m->slots > start ? m->slots - start : 0;
    n = kind == 2 ? room + 1 + rnd(2) : (room ? 1 + rnd(room) : 0);
    if (start + n > MAXTOK)
      n = MAXTOK - start;
    const uint32_t *tp = NULL;
    if (start + n > m->known || rnd(2)) {
      for (uint32_t p = 0; p < n; p++)
        t[p] = start + p < m->known ? m->tokens[start + p] : rnd(6);
      if (kind == 3 && n > 0)
        t[rnd(n)] ^= 8;                            /* maybe a mismatch */
      tp = t;
    }
    rc = core_commit(c, cr[i], start, tp, n, NULL);
    mrc = m_commit(m, start, tp, n);
    assert_int_equal(rc, mrc);
    for (uint32_t k = 0; pol == P_OPT && rc == 0 && k < m->nblocks; k++) {
      uint32_t v = rnd(4) == 0 ? NEVER : rnd(8); /* ties on purpose */
      if (rnd(2) == 0)
        continue;
      core_policy_hint(c, m->blocks[k], v);
      mp[m->blocks[k]].hint = v;
    }
  } else if (op < 72) { /* fork into a free slot */
    int j = (int)rnd(MAXREQ);
    if (mr[j].live || j == i)
      return;
    core_req *k = NULL;
    rc = core_fork(c, cr[i], &k);
    mrc = m_fork(&mr[i], &mr[j]);
    assert_int_equal(rc, mrc);
    if (rc == 0) {
      cr[j] = k;
      compare_req(j);
    }
  } else if (op < 80) { /* preempt */
    assert_int_equal(core_preempt(c, cr[i]), 0);
    m_release(&mr[i]);
  } else if (op < 92) { /* free */
    core_req_free(c, cr[i]);
    m_release(&mr[i]);
    mr[i].live = 0;
    cr[i] = NULL;
  }
  if (mr[i].live)
    compare_req(i);
  if (opno % 512 == 0) {
    compare_counts();
    check_invariant();
  }
}

static void random_vs_model(int policy, const char *name) {
  core_config cfg;
  core_config_init(&cfg);
  cfg.policy = name;
  cfg.allow_offline = 1;
  pol = policy;
  mqlen = 0;
  memset(mb, 0, sizeof(mb));
  memset(mr, 0, sizeof(mr));
  mg_reset();
  cfg.num_blocks = NB;
  cfg.block_size = BS;
  cfg.reserve_blocks = RESERVE;
  kvs_layout l = {BS, 1, 1, 1, KVS_DTYPE_FP32, NB, 0};
  cfg.root = core_root_hash(&l, "model");
  assert_int_equal(core_create(&cfg, &c), 0);
  for (uint32_t b = 0; b < NB; b++)
    mq[mqlen++] = b;

  uint64_t ops = 1000000;
  const char *env = getenv("KVS_MODEL_OPS");
  if (env != NULL)
    ops = strtoull(env, NULL, 10);
  for (uint64_t n = 1; n <= ops; n++)
    one_op(n);

  core_stats st;
  core_get_stats(c, &st);
  print_message("%s: ops %llu: lookups %llu hit blocks %llu, evictions %llu, "
                "cow %llu, no-space %llu, duplicates %llu\n",
                name, (unsigned long long)ops, (unsigned long long)st.lookups,
                (unsigned long long)st.hit_blocks,
                (unsigned long long)st.evictions,
                (unsigned long long)st.cow_copies,
                (unsigned long long)st.no_space,
                (unsigned long long)st.duplicate_blocks);
  /* the workload must actually exercise what it claims to */
  assert_true(st.hit_blocks > 1000);
  assert_true(st.evictions > 1000);
  assert_true(st.cow_copies > 100);
  assert_true(st.no_space > 100);
  assert_true(st.duplicate_blocks > 10);

  for (int i = 0; i < MAXREQ; i++)
    if (mr[i].live) {
      core_req_free(c, cr[i]);
      m_release(&mr[i]);
    }
  compare_counts();
  check_invariant();
  core_get_stats(c, &st);
  assert_int_equal(st.used_blocks, 0);
  assert_int_equal(st.num_requests, 0);
  core_destroy(c);
}

static void test_lru(void **state) {
  (void)state;
  random_vs_model(P_LRU, "lru");
}

static void test_slru(void **state) {
  (void)state;
  random_vs_model(P_SLRU, "slru");
}

static void test_mq(void **state) {
  (void)state;
  random_vs_model(P_MQ, "mq");
}

static void test_opt(void **state) {
  (void)state;
  random_vs_model(P_OPT, "opt");
}

/* Every policy the core has is modelled here. */
static void test_all_policies_modelled(void **state) {
  (void)state;
  static const char *modelled[] = {"lru", "slru", "mq", "opt"};
  size_t n = 0;
  while (core_policy_name(n, NULL) != NULL) {
    assert_true(n < 4);
    assert_string_equal(core_policy_name(n, NULL), modelled[n]);
    n++;
  }
  assert_int_equal(n, 4);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_all_policies_modelled),
      cmocka_unit_test(test_lru),
      cmocka_unit_test(test_slru),
      cmocka_unit_test(test_mq),
      cmocka_unit_test(test_opt),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
