/*
 * test_core_remote.c — the core's side of the remote tier (core.h, "The
 * remote tier") and its index events ("Index events"), three ways.
 *
 * 1. test_random_vs_reference: under every online eviction policy, random
 *    requests on a small pool (evictions all the time) are looked up,
 *    promoted from a fake remote store, allocated, committed, decoded,
 *    preempted and freed.  The store is a set of hashes that a `sealed`
 *    observer fills (write-through of what commits seal).  Everything is
 *    checked against what the test computes itself:
 *      - the chained hashes of every prompt (core_block_hash from the root,
 *        with the salt's digest as hash.c defines it): core_req_next_hashes
 *        must return exactly the ones after the request's table;
 *      - the prefix index as the observers tell it (a mirror set): it must
 *        equal the pool's indexed blocks after every operation, and every
 *        lookup must hit exactly its longest prefix;
 *      - core_remote_promote: which of the list are device hits (the
 *        mirror) and where the free room (keeping the reserve) ends the
 *        list, each promo's block, pos, hash, parent and tier, the table,
 *        counters and stats; a corrupted or short list ends there, a long
 *        one is capped;
 *      - core_promote_finish: the table cut at the first failure, the
 *        hashes indexed (stored events, never sealed ones), and a fresh
 *        lookup of the same prompt then hits at least what was promoted;
 *      - the events: both observers get the same ones in the same order; a
 *        commit stores and seals exactly the blocks it indexed; sealed (h,
 *        b) names a block holding h, IN USE; nothing else seals.
 *    Promotions stay in flight across other operations; their requests may
 *    be freed meanwhile.  core_check after every operation; at the end
 *    nothing is held.
 *
 * 2. test_observers: two observers see the same events; sealed only from
 *    commits (not from remote, host-tier or duplicate blocks);
 *    core_remove_observer / core_set_observer / the limit of
 *    CORE_OBSERVERS; core_block_holds in every state.
 *
 * 3. test_remote_edges: misuse and limits of core_remote_promote (swapping,
 *    swapped out, unsealed, partly written: KVS_ESTATE and nothing
 *    changes), capping, a full pool, the reserve, device hits meanwhile (an
 *    IN USE one needs no room), a forced collision with verify_tokens,
 *    failures and a freed request at finish.
 *
 * KVS_MODEL_OPS scales 1 (default 300,000 operations per policy).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <xxhash.h>

#include "daemon/core/core.h"
#include "tests/unit/core_test.h"

#define BS 4
#define NONE KVS_BLOCK_NONE
#define MAXTOK 64
#define MAXB (MAXTOK / BS + 1)

static const char *const salts[] = {NULL, "tenant-1"};

/* The salt's digest, as hash.c defines the chain (XXH3-128 of its bytes;
 * zero for none). */
static kvs_hash128 salt_digest(int s) {
  kvs_hash128 z = {0, 0};
  if (salts[s] == NULL)
    return z;
  XXH128_hash_t x = XXH3_128bits(salts[s], strlen(salts[s]));
  kvs_hash128 h = {x.low64, x.high64};
  return h;
}

/* h[0..(n - 1) / BS): the chained hashes of the full blocks of t. */
static uint32_t ref_chain(kvs_hash128 root, int salt, const uint32_t *t,
                          uint32_t n, kvs_hash128 *h) {
  uint32_t full = n ? (n - 1) / BS : 0;
  kvs_hash128 parent = root, sd = salt_digest(salt);
  for (uint32_t i = 0; i < full; i++) {
    h[i] = core_block_hash(parent, sd, t + (size_t)i * BS, BS);
    parent = h[i];
  }
  return full;
}

static kvs_layout layout(uint32_t nb) {
  kvs_layout l = {BS, 1, 1, 1, KVS_DTYPE_FP32, nb, 0};
  return l;
}

static core *mk(uint32_t nb, uint32_t reserve, const char *policy,
                core_hash_fn fn, uint32_t host) {
  core_config cfg;
  core *c;
  kvs_layout l = layout(nb);

  core_config_init(&cfg);
  cfg.num_blocks = nb;
  cfg.block_size = BS;
  cfg.reserve_blocks = reserve;
  cfg.root = core_root_hash(&l, "remote-model");
  cfg.policy = policy;
  cfg.hash_fn = fn;
  cfg.tier_slots[CORE_TIER_HOST] = host;
  cfg.tier_sync = host != 0;
  assert_int_equal(core_create(&cfg, &c), 0);
  return c;
}

static kvs_hash128 the_root(uint32_t nb) {
  kvs_layout l = layout(nb);
  return core_root_hash(&l, "remote-model");
}

/* ---- index events, as the observers tell them ----------------------------- */

enum { EV_STORED = 1, EV_REMOVED, EV_SEALED };

typedef struct ev {
  int kind;
  int has_parent, has_tokens;
  uint32_t b;
  kvs_hash128 h, parent;
  uint32_t t[BS];
} ev;

#define MAXEV 512
typedef struct evlog {
  ev e[MAXEV];
  uint32_t n;
  uint64_t stored, removed, sealed;
} evlog;

static evlog logs[2];

static ev *ev_push(void *arg, int kind, kvs_hash128 h) {
  evlog *l = arg;
  assert_true(l == &logs[0] || l == &logs[1]);
  assert_true(l->n < MAXEV);
  ev *e = &l->e[l->n++];
  memset(e, 0, sizeof(*e));
  e->kind = kind;
  e->h = h;
  return e;
}

static void on_stored(void *arg, kvs_hash128 h, const kvs_hash128 *parent,
                      const uint32_t *tokens) {
  ev *e = ev_push(arg, EV_STORED, h);
  ((evlog *)arg)->stored++;
  if (parent != NULL) {
    e->has_parent = 1;
    e->parent = *parent;
  }
  if (tokens != NULL) {
    e->has_tokens = 1;
    memcpy(e->t, tokens, sizeof(e->t));
  }
}

static void on_removed(void *arg, kvs_hash128 h) {
  ev_push(arg, EV_REMOVED, h);
  ((evlog *)arg)->removed++;
}

static void on_sealed(void *arg, kvs_hash128 h, uint32_t b, uint32_t pos) {
  ev *e = ev_push(arg, EV_SEALED, h);
  (void)pos;
  ((evlog *)arg)->sealed++;
  e->b = b;
}

static void add_observers(core *c) {
  core_observer o = {on_stored, on_removed, on_sealed, NULL, NULL};
  memset(logs, 0, sizeof(logs));
  for (int k = 0; k < 2; k++) {
    o.arg = &logs[k];
    assert_int_equal(core_add_observer(c, &o), 0);
  }
}

/* Both observers heard the same thing. */
static void logs_agree(void) {
  assert_int_equal(logs[0].n, logs[1].n);
  assert_memory_equal(logs[0].e, logs[1].e, logs[0].n * sizeof(ev));
}

static void expect_stored(const ev *e, kvs_hash128 h, const kvs_hash128 *parent,
                          const uint32_t *t) {
  assert_int_equal(e->kind, EV_STORED);
  assert_true(heq(e->h, h));
  assert_int_equal(e->has_parent, parent != NULL);
  if (parent != NULL)
    assert_true(heq(e->parent, *parent));
  assert_true(e->has_tokens); /* verify_tokens: the core keeps them */
  assert_memory_equal(e->t, t, sizeof(e->t));
}

/* Block tables (core_req_blocks may give NULL for an empty one). */
static void tbl_copy(uint32_t *dst, const uint32_t *src, uint32_t n) {
  if (n > 0)
    memcpy(dst, src, n * sizeof(uint32_t));
}

static void tbl_same(const uint32_t *a, const uint32_t *b, uint32_t n) {
  if (n > 0)
    assert_memory_equal(a, b, n * sizeof(uint32_t));
}

/* ==== 1. random operations against a reference ============================ */

#define NB 32
#define RES 2
#define MAXREQ 6
#define NDOC 6

/* The fake remote store: a growing open-addressed set of hashes. */
typedef struct hset {
  kvs_hash128 *v;
  size_t cap, n;
} hset;

static hset store;

static int hz(kvs_hash128 h) { return h.lo == 0 && h.hi == 0; }

static int hs_has(const hset *s, kvs_hash128 h) {
  if (s->cap == 0)
    return 0;
  for (size_t i = h.lo & (s->cap - 1);; i = (i + 1) & (s->cap - 1)) {
    if (hz(s->v[i]))
      return 0;
    if (heq(s->v[i], h))
      return 1;
  }
}

static void hs_add(hset *s, kvs_hash128 h) {
  assert_false(hz(h));
  if (hs_has(s, h))
    return;
  if (2 * (s->n + 1) > s->cap) {
    hset g = {calloc(s->cap ? 2 * s->cap : 1024, sizeof(kvs_hash128)),
              s->cap ? 2 * s->cap : 1024, 0};
    assert_non_null(g.v);
    for (size_t i = 0; i < s->cap; i++)
      if (!hz(s->v[i]))
        hs_add(&g, s->v[i]);
    free(s->v);
    *s = g;
  }
  size_t i = h.lo & (s->cap - 1);
  while (!hz(s->v[i]))
    i = (i + 1) & (s->cap - 1);
  s->v[i] = h;
  s->n++;
}

/* The prefix index as the events tell it. */
static kvs_hash128 mirror[NB];
static uint32_t nmirror;

static int mirror_find(kvs_hash128 h) {
  for (uint32_t i = 0; i < nmirror; i++)
    if (heq(mirror[i], h))
      return (int)i;
  return -1;
}

typedef enum phase {
  P_EMPTY,     /* created or preempted: no blocks */
  P_LOOKED,    /* looked up; the store's answer in list */
  P_PROMOTING, /* promos in flight */
  P_READY,     /* a sealed prefix: the rest to compute */
  P_ALLOC,     /* slots for the whole prompt, partly written */
  P_RUN        /* all written: decoding */
} phase;

typedef struct slot {
  core_req *r;
  int live, doomed, salt;
  phase ph;
  uint32_t t[MAXTOK], n; /* every token the request knows */
  kvs_hash128 list[MAXB];
  uint32_t nlist;
  core_promo promos[MAXB];
  uint32_t npromos, base, taken;
} slot;

static core *C;
static kvs_hash128 ROOT;
static slot S[MAXREQ];
static uint32_t doc[NDOC][MAXTOK];
static struct {
  uint64_t promotes, taken, promos, dev_hits, capped_by_room, corrupt,
      cut, long_lists, finish_fail, finish_ok, doomed, fresh_checks, estate,
      empty_store;
} cnt;

/* Prompts: a prefix of one of a few documents (which share stems), now and
 * then going its own way from some point on. */
static uint32_t gen_prompt(uint32_t *t) {
  uint32_t d = rnd(NDOC), n = 2 + rnd(MAXTOK - 2);
  uint32_t from = rnd(3) == 0 ? rnd(n) : n;
  for (uint32_t i = 0; i < n; i++)
    t[i] = i < from ? doc[d][i] : 50 + rnd(3);
  return n;
}

static uint32_t pool_ref0(void) {
  uint32_t n = 0;
  for (uint32_t b = 0; b < NB; b++) {
    core_block_info bi;
    assert_int_equal(core_block_get(C, b, &bi), 0);
    n += bi.ref == 0;
  }
  return n;
}

/* The device block of c (nb blocks) indexed with h (NONE), by a scan of the
 * pool; *ref (may be NULL) its ref count. */
static uint32_t pool_find_in(core *c, uint32_t nb, kvs_hash128 h,
                             uint32_t *ref) {
  for (uint32_t b = 0; b < nb; b++) {
    core_block_info bi;
    core_block_get(c, b, &bi);
    if (bi.indexed && heq(bi.hash, h)) {
      if (ref != NULL)
        *ref = bi.ref;
      return b;
    }
  }
  return NONE;
}

/* After every operation: the events agree, and applied to the mirror (and
 * the store: sealed blocks are written through) they give the pool's
 * index; the invariants hold. */
static void settle(void) {
  logs_agree();
  for (uint32_t i = 0; i < logs[0].n; i++) {
    const ev *e = &logs[0].e[i];
    int k = mirror_find(e->h);
    if (e->kind == EV_STORED) {
      assert_true(k < 0);
      assert_true(nmirror < NB);
      mirror[nmirror++] = e->h;
    } else if (e->kind == EV_REMOVED) {
      assert_true(k >= 0);
      mirror[k] = mirror[--nmirror];
    } else {
      /* sealed: right after its stored; the block holds it, in use */
      assert_true(i > 0 && logs[0].e[i - 1].kind == EV_STORED &&
                  heq(logs[0].e[i - 1].h, e->h));
      assert_int_equal(core_block_holds(C, e->b, e->h), 2);
      hs_add(&store, e->h);
    }
  }
  logs[0].n = logs[1].n = 0;
  uint32_t indexed = 0;
  for (uint32_t b = 0; b < NB; b++) {
    core_block_info bi;
    core_block_get(C, b, &bi);
    if (bi.indexed) {
      indexed++;
      assert_true(mirror_find(bi.hash) >= 0);
      assert_int_equal(core_block_holds(C, b, bi.hash), bi.ref ? 2 : 1);
    } else {
      assert_int_equal(core_block_holds(C, b, bi.hash), 0);
    }
  }
  assert_int_equal(indexed, nmirror);
  check(C);
}

/* Only evictions (removed events) happened: as many as the stats say. */
static void expect_only_removed(const core_stats *before) {
  core_stats st;
  core_get_stats(C, &st);
  for (uint32_t i = 0; i < logs[0].n; i++)
    assert_int_equal(logs[0].e[i].kind, EV_REMOVED);
  assert_int_equal(st.evictions - before->evictions, logs[0].n);
}

static void expect_table(slot *s, uint32_t nblocks, uint32_t slots,
                         uint32_t written) {
  uint32_t n;
  core_req_blocks(s->r, &n);
  assert_int_equal(n, nblocks);
  assert_int_equal(core_req_num_slots(s->r), slots);
  assert_int_equal(core_req_num_written(s->r), written);
  assert_int_equal(core_req_num_sealed(s->r), written / BS);
  assert_int_equal(core_req_num_known(s->r), s->n);
}

/* The request's sealed blocks hold its chain, indexed or not. */
static void expect_sealed_chain(slot *s) {
  kvs_hash128 h[MAXB];
  uint32_t n, sealed = core_req_num_sealed(s->r);
  const uint32_t *bl = core_req_blocks(s->r, &n);
  ref_chain(ROOT, s->salt, s->t, sealed * BS + 1, h);
  for (uint32_t i = 0; i < sealed; i++) {
    core_block_info bi;
    core_block_get(C, bl[i], &bi);
    assert_int_not_equal(bi.state, CORE_BLOCK_FREE);
    assert_true(heq(bi.hash, h[i]));
  }
}

static void do_lookup(slot *s) {
  kvs_hash128 h[MAXB], nh[MAXB];
  uint32_t full = ref_chain(ROOT, s->salt, s->t, s->n, h), want = 0, hit;
  core_stats before;

  while (want < full && mirror_find(h[want]) >= 0)
    want++;
  core_get_stats(C, &before);
  if (rnd(2)) {
    assert_int_equal(core_lookup(C, s->r, s->t, s->n, &hit), 0);
  } else { /* no tiers: the same, with or without promote */
    core_lookup_out out;
    core_promo p[MAXB];
    assert_int_equal(core_lookup_promote(C, s->r, s->t, s->n, (int)rnd(2), p,
                                         MAXB, &out), 0);
    assert_int_equal(out.device_blocks, want);
    assert_int_equal(out.npromos, 0);
    assert_int_equal(out.tier_blocks[0] + out.tier_blocks[1], 0);
    hit = out.hit_tokens;
  }
  assert_int_equal(hit, want * BS);
  assert_int_equal(logs[0].n, 0);
  expect_table(s, want, want * BS, want * BS);
  expect_sealed_chain(s);
  for (uint32_t i = 0; i < want; i++) {
    uint32_t n;
    assert_int_equal(core_block_holds(C, core_req_blocks(s->r, &n)[i], h[i]), 2);
  }

  /* What the daemon asks the store for: the rest of the chain. */
  uint32_t max = rnd(4) == 0 ? rnd(full - want + 2) : MAXB;
  uint32_t k = core_req_next_hashes(C, s->r, nh, max);
  assert_int_equal(k, full - want < max ? full - want : max);
  for (uint32_t i = 0; i < k; i++)
    assert_true(heq(nh[i], h[want + i]));
  if (k < full - want)
    k = core_req_next_hashes(C, s->r, nh, MAXB);
  assert_int_equal(k, full - want);
  /* The store answers with the longest run it holds. */
  s->nlist = 0;
  while (s->nlist < k && hs_has(&store, nh[s->nlist]))
    s->nlist++;
  memcpy(s->list, nh, s->nlist * sizeof(kvs_hash128));
  s->ph = P_LOOKED;
}

static void do_promote(slot *s) {
  kvs_hash128 h[MAXB], list[MAXB + 4], nh[MAXB];
  uint32_t full = ref_chain(ROOT, s->salt, s->t, s->n, h), n = s->nlist;
  uint32_t nb, base, np = 99, taken = 99, mode = rnd(8);
  const uint32_t *bl = core_req_blocks(s->r, &nb);
  uint32_t before_tbl[MAXB], ref_before[NB];
  core_stats before, st;

  base = nb;
  tbl_copy(before_tbl, bl, nb);
  /* the request did not change since the store was asked */
  assert_int_equal(core_req_next_hashes(C, s->r, nh, MAXB), full - base);
  memcpy(list, s->list, n * sizeof(kvs_hash128));
  cnt.empty_store += n == 0;
  if (mode == 0 && n > 0) { /* the store's run, cut short */
    n = rnd(n);
    cnt.cut++;
  } else if (mode == 1 && n > 0) { /* one hash wrong: the list ends there */
    list[rnd(n)].hi ^= 1ull << rnd(64);
    cnt.corrupt++;
  } else if (mode == 2) { /* longer than the chain: capped */
    uint32_t extra = 1 + rnd(4);
    for (uint32_t j = 0; j < extra; j++) {
      list[n + j].lo = 0x1234 + j;
      list[n + j].hi = rnd(1000);
    }
    n += extra;
    cnt.long_lists++;
  }

  /* The reference: the list goes on while it is the request's chain; a
   * block indexed on the device is a hit (it needs room only when CACHED),
   * any other a fresh block; the reserve is kept. */
  uint32_t m = 0, dev[MAXB], want_taken = 0, want_np = 0, ndev = 0;
  uint32_t room = pool_ref0();
  int64_t avail = (int64_t)room - RES;
  while (m < n && base + m < full && heq(list[m], h[base + m]))
    m++;
  for (; want_taken < m; want_taken++) {
    uint32_t ref = 0;
    dev[want_taken] = pool_find_in(C, NB, h[base + want_taken], &ref);
    if ((dev[want_taken] == NONE || ref == 0) && --avail < 0)
      break;
    if (dev[want_taken] == NONE)
      want_np++;
  }
  cnt.capped_by_room += want_taken < m;
  for (uint32_t b = 0; b < NB; b++) {
    core_block_info bi;
    core_block_get(C, b, &bi);
    ref_before[b] = bi.ref;
  }

  core_get_stats(C, &before);
  assert_int_equal(core_remote_promote(C, s->r, list, n, s->promos, &np,
                                       &taken), 0);
  core_get_stats(C, &st);
  assert_int_equal(taken, want_taken);
  assert_int_equal(np, want_np);
  expect_only_removed(&before);
  cnt.promotes++;
  cnt.taken += taken;
  cnt.promos += np;
  cnt.dev_hits += taken - np;

  /* the table: what it had, then device hits and promos in chain order */
  bl = core_req_blocks(s->r, &nb);
  assert_int_equal(nb, base + taken);
  tbl_same(bl, before_tbl, base);
  expect_table(s, base + taken, (base + taken) * BS, (base + taken) * BS);
  uint32_t k = 0;
  for (uint32_t j = 0; j < taken; j++) {
    uint32_t pos = base + j;
    core_block_info bi;
    if (dev[j] != NONE) {
      assert_int_equal(bl[pos], dev[j]);
      assert_int_equal(core_block_holds(C, dev[j], h[pos]), 2);
      core_block_get(C, dev[j], &bi);
      assert_int_equal(bi.ref, ref_before[dev[j]] + 1);
      ndev++;
      continue;
    }
    const core_promo *p = &s->promos[k++];
    assert_int_equal(p->block, bl[pos]);
    assert_int_equal(p->pos, pos);
    assert_int_equal(p->tier, CORE_TIER_REMOTE);
    assert_int_equal(p->entry, NONE);
    assert_int_equal(p->slot, NONE);
    assert_true(heq(p->hash, h[pos]));
    assert_true(heq(p->parent, pos ? h[pos - 1] : ROOT));
    core_block_get(C, p->block, &bi);
    assert_int_equal(bi.state, CORE_BLOCK_IN_USE);
    assert_int_equal(bi.ref, 2); /* the request and the pin */
    assert_int_equal(bi.pins, 1);
    assert_false(bi.indexed);
    assert_true(heq(bi.hash, h[pos]));
    assert_int_equal(core_block_holds(C, p->block, h[pos]), 0);
  }
  assert_int_equal(k, np);
  assert_int_equal(ndev, taken - np);
  /* the stats: device hits are hits, promos allocations, none a miss */
  assert_int_equal(st.hit_blocks - before.hit_blocks, taken - np);
  assert_int_equal(st.hit_tokens - before.hit_tokens, (taken - np) * BS);
  assert_int_equal(st.allocated_blocks - before.allocated_blocks, np);
  assert_int_equal(before.miss_blocks - st.miss_blocks, taken);
  assert_int_equal(st.lookups, before.lookups);
  /* the reserve is kept */
  uint32_t after = pool_ref0();
  assert_true(after >= RES || after == room);
  /* the rest of the chain is what comes next */
  assert_int_equal(core_req_next_hashes(C, s->r, nh, MAXB), full - base - taken);
  for (uint32_t j = 0; base + taken + j < full; j++)
    assert_true(heq(nh[j], h[base + taken + j]));
  expect_sealed_chain(s);

  s->npromos = np;
  s->base = base;
  s->taken = taken;
  s->ph = np ? P_PROMOTING : P_READY;
}

static void do_finish(slot *s) {
  int ok[MAXB], *okp = ok;
  uint32_t np = s->npromos, bad = np, nb;
  uint32_t before_tbl[MAXB];
  kvs_hash128 fresh[MAXB];
  uint32_t nfresh = 0;
  core_stats before, st;

  for (uint32_t i = 0; i < np; i++)
    ok[i] = 1;
  if (rnd(4) == 0) { /* a failed read at some k; after it, anything */
    bad = rnd(np);
    ok[bad] = 0;
    for (uint32_t i = bad + 1; i < np; i++)
      ok[i] = (int)rnd(2);
    if (bad == 0 && rnd(3) == 0)
      okp = NULL;
  }
  if (!s->doomed) {
    const uint32_t *bl = core_req_blocks(s->r, &nb);
    tbl_copy(before_tbl, bl, nb);
  }
  /* The stored events to come: the good ones before the failure whose
   * hash nobody indexed meanwhile. */
  for (uint32_t i = 0; i < bad; i++)
    if (mirror_find(s->promos[i].hash) < 0)
      fresh[nfresh++] = s->promos[i].hash;
  core_get_stats(C, &before);
  uint32_t want = s->doomed ? 0
                  : bad < np ? s->promos[bad].pos * BS
                             : (s->base + s->taken) * BS;
  assert_int_equal(core_promote_finish(C, s->doomed ? NULL : s->r, s->promos,
                                       np, okp), want);
  core_get_stats(C, &st);
  cnt.finish_fail += bad < np;
  cnt.finish_ok += bad == np;

  /* events: stored only (hashes the commit did not write: not sealed) */
  assert_int_equal(logs[0].n, nfresh);
  for (uint32_t i = 0, k = 0; i < bad; i++) {
    const core_promo *p = &s->promos[i];
    if (k < nfresh && heq(fresh[k], p->hash))
      expect_stored(&logs[0].e[k++], p->hash, p->pos ? &p->parent : NULL,
                    s->t + (size_t)p->pos * BS);
  }
  assert_int_equal(st.evictions, before.evictions);
  for (uint32_t i = 0; i < np; i++) {
    core_block_info bi;
    core_block_get(C, s->promos[i].block, &bi);
    assert_int_equal(bi.pins, 0);
  }
  settle();

  if (s->doomed) {
    s->doomed = 0;
    s->live = 0;
    cnt.doomed++;
    return;
  }
  uint32_t keep = want / BS;
  const uint32_t *bl = core_req_blocks(s->r, &nb);
  tbl_same(bl, before_tbl, keep);
  expect_table(s, keep, want, want);
  expect_sealed_chain(s);
  for (uint32_t i = 0; i < bad; i++) /* indexed, by it or by another */
    assert_true(mirror_find(s->promos[i].hash) >= 0);
  if (bad == np) {
    /* another request looking up the same prompt hits the promoted prefix */
    core_req *q;
    uint32_t hit;
    assert_int_equal(core_req_create(C, salts[s->salt],
                                     salts[s->salt] ? strlen(salts[s->salt]) : 0,
                                     &q), 0);
    assert_int_equal(core_lookup(C, q, s->t, s->n, &hit), 0);
    assert_true(hit >= (s->base + s->taken) * BS);
    core_req_free(C, q);
    cnt.fresh_checks++;
    assert_int_equal(logs[0].n, 0);
  }
  s->ph = P_READY;
}

/* The request is not in a state core_remote_promote accepts (or has
 * nothing left): it says so and changes nothing. */
static void do_misuse(slot *s) {
  kvs_hash128 h[MAXB], nh[MAXB];
  uint32_t nb, full = ref_chain(ROOT, s->salt, s->t, s->n, h);
  uint32_t np = 99, taken = 99, tbl[MAXB];
  core_block_info pool[NB], pool2[NB];
  core_stats before, st;
  const uint32_t *bl = core_req_blocks(s->r, &nb);
  uint32_t slots = core_req_num_slots(s->r), written = core_req_num_written(s->r),
           sealed = core_req_num_sealed(s->r);
  int ok = sealed == nb && slots == nb * BS && written == slots;
  uint32_t from = nb < full ? nb : full, n = full - from;

  tbl_copy(tbl, bl, nb);
  memset(pool, 0, sizeof(pool)); /* compared whole: no stray padding */
  memset(pool2, 0, sizeof(pool2));
  memset(&before, 0, sizeof(before));
  memset(&st, 0, sizeof(st));
  for (uint32_t b = 0; b < NB; b++)
    core_block_get(C, b, &pool[b]);
  core_get_stats(C, &before);
  assert_int_equal(core_req_next_hashes(C, s->r, nh, MAXB),
                   ok && nb < full ? full - nb : 0);
  int rc = core_remote_promote(C, s->r, h + from, n, s->promos, &np, &taken);
  if (ok) {
    assert_int_equal(rc, 0);
    assert_int_equal(n, 0); /* everything written: nothing to take */
  } else {
    assert_int_equal(rc, KVS_ESTATE);
    cnt.estate++;
  }
  assert_int_equal(np, 0);
  assert_int_equal(taken, 0);
  core_get_stats(C, &st);
  assert_memory_equal(&st, &before, sizeof(st));
  for (uint32_t b = 0; b < NB; b++)
    core_block_get(C, b, &pool2[b]);
  assert_memory_equal(pool, pool2, sizeof(pool));
  bl = core_req_blocks(s->r, &nb);
  tbl_same(bl, tbl, nb);
  expect_table(s, nb, slots, written);
  assert_int_equal(logs[0].n, 0);
}

static void do_allocate(slot *s) {
  uint32_t nb, slots = core_req_num_slots(s->r);
  core_cow cow;
  core_stats before;
  core_req_blocks(s->r, &nb);
  uint32_t need = (s->n + BS - 1) / BS - nb, room = pool_ref0();

  core_get_stats(C, &before);
  int rc = core_allocate(C, s->r, s->n - slots, &cow);
  assert_int_equal(rc, room >= need + RES ? 0 : KVS_ENOSPC);
  assert_int_equal(cow.src, NONE);
  expect_only_removed(&before);
  if (rc == 0) {
    expect_table(s, nb + need, s->n, slots);
    s->ph = P_ALLOC;
  }
}

/* Commit [written, written + k): exactly the blocks it indexes are stored
 * and sealed, in chain order, each in the request's block. */
static void do_commit(slot *s, uint32_t k) {
  kvs_hash128 h[MAXB];
  uint32_t written = core_req_num_written(s->r), old = written / BS, sealed;
  uint32_t nb, nev = 0;
  core_stats before;

  core_get_stats(C, &before);
  assert_int_equal(core_commit(C, s->r, written, s->t + written, k, &sealed), 0);
  uint32_t now = (written + k) / BS;
  assert_int_equal(sealed, now - old);
  ref_chain(ROOT, s->salt, s->t, now * BS + 1, h);
  const uint32_t *bl = core_req_blocks(s->r, &nb);
  for (uint32_t i = old; i < now; i++) {
    if (mirror_find(h[i]) >= 0) /* a duplicate: indexed by another */
      continue;
    assert_true(nev + 2 <= logs[0].n);
    expect_stored(&logs[0].e[nev], h[i], i ? &h[i - 1] : NULL, s->t + i * BS);
    assert_int_equal(logs[0].e[nev + 1].kind, EV_SEALED);
    assert_true(heq(logs[0].e[nev + 1].h, h[i]));
    assert_int_equal(logs[0].e[nev + 1].b, bl[i]);
    assert_int_equal(core_block_holds(C, bl[i], h[i]), 2);
    nev += 2;
  }
  assert_int_equal(logs[0].n, nev);
  core_stats st;
  core_get_stats(C, &st);
  assert_int_equal(st.evictions, before.evictions);
  assert_int_equal(st.sealed_blocks - before.sealed_blocks, now - old);
}

static void do_decode(slot *s) {
  core_cow cow;
  core_stats before;
  uint32_t slots = core_req_num_slots(s->r), room = pool_ref0();
  uint32_t need = slots % BS == 0;

  if (s->n == MAXTOK)
    return;
  core_get_stats(C, &before);
  int rc = core_append(C, s->r, 1, &cow);
  assert_int_equal(rc, room >= need ? 0 : KVS_ENOSPC);
  expect_only_removed(&before);
  if (rc != 0)
    return;
  settle();
  s->t[s->n++] = 50 + rnd(3);
  do_commit(s, 1);
}

static void do_free(slot *s) {
  core_req_free(C, s->r);
  assert_int_equal(logs[0].n, 0);
  if (s->ph == P_PROMOTING) { /* its promos end later, with no request */
    s->doomed = 1;
    return;
  }
  s->live = 0;
}

static void do_preempt(slot *s) {
  assert_int_equal(core_preempt(C, s->r), 0);
  assert_int_equal(logs[0].n, 0);
  expect_table(s, 0, 0, 0);
  s->ph = P_EMPTY;
}

static void one_op(void) {
  slot *s = &S[rnd(MAXREQ)];
  uint32_t what = rnd(100);

  if (!s->live) {
    memset(s, 0, sizeof(*s));
    s->salt = rnd(5) == 0;
    assert_int_equal(core_req_create(C, salts[s->salt],
                                     salts[s->salt] ? strlen(salts[s->salt]) : 0,
                                     &s->r), 0);
    s->live = 1;
    s->n = gen_prompt(s->t);
    s->ph = P_EMPTY;
    what = 0;
  }
  if (s->doomed) {
    do_finish(s);
    return;
  }
  if (what >= 92 && s->ph != P_PROMOTING) {
    do_free(s);
  } else if (what >= 92) {
    if (rnd(2)) /* its worker died mid-promotion */
      do_free(s);
    else
      do_finish(s);
  } else {
    switch (s->ph) {
    case P_EMPTY:
      do_lookup(s);
      if (rnd(4) == 0) { /* the store answers at once */
        settle();
        do_promote(s);
      }
      break;
    case P_LOOKED:
      if (what < 40) /* the store answered */
        do_promote(s);
      else if (what < 50)
        s->ph = P_READY; /* no store: compute it all */
      else if (what < 56)
        do_preempt(s);
      break;
    case P_PROMOTING:
      if (what < 50)
        do_finish(s);
      break;
    case P_READY:
      if (what < 70)
        do_allocate(s);
      else if (what < 80)
        do_preempt(s);
      break;
    case P_ALLOC: {
      uint32_t w = core_req_num_written(s->r), sl = core_req_num_slots(s->r);
      if (what < 15) {
        do_misuse(s);
      } else if (what < 80) {
        uint32_t k = rnd(2) ? sl - w : 1 + rnd(sl - w);
        do_commit(s, k);
        if (w + k == sl)
          s->ph = P_RUN;
      } else if (what < 86) {
        do_preempt(s);
      }
      break;
    }
    case P_RUN:
      if (what < 10)
        do_misuse(s);
      else if (what < 70)
        do_decode(s);
      else if (what < 80)
        do_preempt(s);
      break;
    }
  }
  settle();
}

static void run_policy(const char *policy) {
  uint64_t ops = nops();
  core_stats st;

  C = mk(NB, RES, policy, NULL, 0);
  ROOT = the_root(NB);
  add_observers(C);
  memset(S, 0, sizeof(S));
  memset(&cnt, 0, sizeof(cnt));
  memset(&store, 0, sizeof(store));
  nmirror = 0;
  rng = 0x51ed2701a3c9b4e7ull;
  for (uint32_t d = 0; d < NDOC; d++)
    for (uint32_t i = 0; i < MAXTOK; i++)
      doc[d][i] = i < 2 * BS ? 100 * (d % 3) + i : rnd(i < 6 * BS ? 2 : 4);

  for (uint64_t op = 0; op < ops; op++)
    one_op();

  core_get_stats(C, &st);
  print_message("%s: %llu ops, %llu remote promotes: %llu blocks taken, "
                "%llu promos, %llu device hits; capped by room %llu, cut %llu, "
                "corrupt %llu, long %llu, store empty %llu; finish ok %llu, "
                "failed %llu, freed meanwhile %llu; estate %llu; "
                "fresh lookups %llu; evictions %llu; store %zu hashes\n",
                policy, (unsigned long long)ops,
                (unsigned long long)cnt.promotes, (unsigned long long)cnt.taken,
                (unsigned long long)cnt.promos,
                (unsigned long long)cnt.dev_hits,
                (unsigned long long)cnt.capped_by_room,
                (unsigned long long)cnt.cut, (unsigned long long)cnt.corrupt,
                (unsigned long long)cnt.long_lists,
                (unsigned long long)cnt.empty_store,
                (unsigned long long)cnt.finish_ok,
                (unsigned long long)cnt.finish_fail,
                (unsigned long long)cnt.doomed, (unsigned long long)cnt.estate,
                (unsigned long long)cnt.fresh_checks,
                (unsigned long long)st.evictions, store.n);
  /* what the workload must exercise (per 100,000 operations) */
  uint64_t k = ops / 100000;
  assert_true(cnt.promos >= 8000 * k && cnt.dev_hits >= 250 * k);
  assert_true(cnt.capped_by_room >= 1000 * k && cnt.corrupt >= 300 * k &&
              cnt.cut >= 300 * k && cnt.long_lists >= 500 * k);
  assert_true(cnt.finish_fail >= 400 * k && cnt.finish_ok >= 1500 * k);
  assert_true(cnt.doomed >= 100 * k && cnt.fresh_checks >= 1500 * k);
  assert_true(cnt.estate >= 1500 * k && st.evictions >= 10000 * k);

  for (int i = 0; i < MAXREQ; i++) {
    slot *s = &S[i];
    if (s->live && !s->doomed)
      do_free(s);
    if (s->doomed)
      do_finish(s);
    settle();
  }
  core_get_stats(C, &st);
  assert_int_equal(st.used_blocks, 0);
  assert_int_equal(st.num_requests, 0);
  assert_int_equal(st.free_blocks + st.cached_blocks, NB);
  assert_int_equal(st.indexed_blocks, nmirror);
  check(C);
  core_destroy(C);
  free(store.v);
  memset(&store, 0, sizeof(store));
}

static void test_random_vs_reference(void **state) {
  (void)state;
  int offline, n = 0;
  const char *name;
  for (size_t i = 0; (name = core_policy_name(i, &offline)) != NULL; i++) {
    if (offline)
      continue;
    run_policy(name);
    n++;
  }
  assert_true(n >= 3);
}

/* ==== 2. observers ======================================================== */

static void seq(uint32_t *t, uint32_t n, uint32_t base) {
  for (uint32_t i = 0; i < n; i++)
    t[i] = base + i;
}

/* A request that looked up t[0..n) and computed the rest. */
static core_req *prefill(core *c, const uint32_t *t, uint32_t n, uint32_t *hit) {
  core_req *r;
  core_cow cow;
  assert_int_equal(core_req_create(c, NULL, 0, &r), 0);
  assert_int_equal(core_lookup(c, r, t, n, hit), 0);
  assert_int_equal(core_allocate(c, r, n - *hit, &cow), 0);
  assert_int_equal(core_commit(c, r, *hit, t + *hit, n - *hit, NULL), 0);
  return r;
}

static void clear_logs(void) { logs[0].n = logs[1].n = 0; }

/* Counts of each kind in log k. */
static uint32_t count(int k, int kind) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < logs[k].n; i++)
    n += logs[k].e[i].kind == kind;
  return n;
}

static int n_removed_only;
static void on_removed_only(void *arg, kvs_hash128 h) {
  (void)h;
  assert_ptr_equal(arg, &n_removed_only);
  n_removed_only++;
}

static void test_observers(void **state) {
  (void)state;
  core *c = mk(8, 0, NULL, NULL, 0);
  kvs_hash128 root = the_root(8), h[MAXB];
  uint32_t t[3 * BS + 1], hit, n;
  core_req *r, *r2;
  core_cow cow;

  add_observers(c);
  seq(t, 3 * BS + 1, 500);
  ref_chain(root, 0, t, 3 * BS + 1, h);

  /* A commit seals 3 blocks: stored then sealed, each; both alike. */
  r = prefill(c, t, 3 * BS + 1, &hit);
  logs_agree();
  assert_int_equal(logs[0].n, 6);
  const uint32_t *bl = core_req_blocks(r, &n);
  uint32_t b0[3] = {bl[0], bl[1], bl[2]};
  for (uint32_t i = 0; i < 3; i++) {
    expect_stored(&logs[0].e[2 * i], h[i], i ? &h[i - 1] : NULL, t + i * BS);
    assert_int_equal(logs[0].e[2 * i + 1].kind, EV_SEALED);
    assert_true(heq(logs[0].e[2 * i + 1].h, h[i]));
    assert_int_equal(logs[0].e[2 * i + 1].b, b0[i]);
    assert_int_equal(core_block_holds(c, b0[i], h[i]), 2);
  }
  clear_logs();
  /* A second request with the same tokens, computed again: duplicates are
   * neither stored nor sealed. */
  assert_int_equal(core_req_create(c, NULL, 0, &r2), 0);
  assert_int_equal(core_allocate(c, r2, 3 * BS, &cow), 0);
  assert_int_equal(core_commit(c, r2, 0, t, 3 * BS, NULL), 0);
  assert_int_equal(logs[0].n + logs[1].n, 0);
  core_req_free(c, r2);
  /* A fork's child sealing the shared block does not seal it again. */
  assert_int_equal(core_req_create(c, NULL, 0, &r2), 0);
  uint32_t u[2 * BS];
  seq(u, 2 * BS, 900);
  assert_int_equal(core_allocate(c, r2, 2, &cow), 0);
  assert_int_equal(core_commit(c, r2, 0, u, 2, NULL), 0);
  core_req *child;
  assert_int_equal(core_fork(c, r2, &child), 0);
  assert_int_equal(core_append(c, child, 2, &cow), 0);
  assert_int_equal(cow.dst != NONE, 1); /* a private copy: its own block */
  assert_int_equal(core_commit(c, child, 2, u + 2, 2, NULL), 0);
  assert_int_equal(count(0, EV_SEALED), 1);
  assert_int_equal(count(0, EV_STORED), 1);
  core_req_free(c, child);
  core_req_free(c, r2);
  clear_logs();

  /* Freed: CACHED; out of range or another hash: 0. */
  core_req_free(c, r);
  for (uint32_t i = 0; i < 3; i++)
    assert_int_equal(core_block_holds(c, b0[i], h[i]), 1);
  assert_int_equal(core_block_holds(c, b0[0], h[1]), 0);
  assert_int_equal(core_block_holds(c, 8, h[0]), 0);
  assert_int_equal(core_block_holds(c, NONE, h[0]), 0);
  assert_int_equal(logs[0].n, 0);

  /* Another request takes the whole pool: evictions, same order in both. */
  assert_int_equal(core_req_create(c, NULL, 0, &r2), 0);
  assert_int_equal(core_allocate(c, r2, 8 * BS, &cow), 0);
  logs_agree();
  assert_int_equal(count(0, EV_REMOVED), 4); /* 3 + the fork's block */
  assert_int_equal(logs[0].n, 4);
  for (uint32_t i = 0; i < 3; i++)
    assert_int_equal(core_block_holds(c, b0[i], h[i]), 0);
  core_req_free(c, r2);
  clear_logs();

  /* Brought up from the remote store: stored, never sealed. */
  core_promo p[MAXB];
  kvs_hash128 nh[MAXB];
  uint32_t np, taken;
  assert_int_equal(core_req_create(c, NULL, 0, &r), 0);
  assert_int_equal(core_lookup(c, r, t, 3 * BS + 1, &hit), 0);
  assert_int_equal(hit, 0);
  assert_int_equal(core_req_next_hashes(c, r, nh, MAXB), 3);
  for (uint32_t i = 0; i < 3; i++)
    assert_true(heq(nh[i], h[i]));
  assert_int_equal(core_remote_promote(c, r, nh, 3, p, &np, &taken), 0);
  assert_int_equal(np, 3);
  assert_int_equal(taken, 3);
  assert_int_equal(logs[0].n, 0);
  int ok[3] = {1, 1, 1};
  assert_int_equal(core_promote_finish(c, r, p, 3, ok), 3 * BS);
  logs_agree();
  assert_int_equal(logs[0].n, 3);
  for (uint32_t i = 0; i < 3; i++) {
    expect_stored(&logs[0].e[i], h[i], i ? &h[i - 1] : NULL, t + i * BS);
    assert_int_equal(core_block_holds(c, p[i].block, h[i]), 2);
  }
  clear_logs();
  /* The request goes on: only the block its commit fills is sealed. */
  assert_int_equal(core_allocate(c, r, 1, &cow), 0);
  assert_int_equal(core_commit(c, r, 3 * BS, NULL, 1, NULL), 0);
  assert_int_equal(logs[0].n, 0);
  uint32_t more[BS - 1] = {7, 8, 9};
  assert_int_equal(core_append(c, r, BS - 1, &cow), 0);
  assert_int_equal(core_commit(c, r, 3 * BS + 1, more, BS - 1, NULL), 0);
  logs_agree();
  assert_int_equal(logs[0].n, 2);
  assert_int_equal(logs[0].e[1].kind, EV_SEALED);
  bl = core_req_blocks(r, &n);
  assert_int_equal(logs[0].e[1].b, bl[3]);
  assert_int_equal(core_block_holds(c, bl[3], logs[0].e[1].h), 2);
  core_req_free(c, r);
  clear_logs();

  /* Removing one observer: the other alone hears. */
  core_remove_observer(c, &logs[0]);
  assert_int_equal(core_req_create(c, NULL, 0, &r2), 0);
  assert_int_equal(core_allocate(c, r2, 8 * BS, &cow), 0);
  assert_int_equal(logs[0].n, 0);
  assert_int_equal(count(1, EV_REMOVED), 4);
  core_req_free(c, r2);
  clear_logs();

  /* Up to CORE_OBSERVERS: logs[1] + 3 more; a fifth is refused.  One of
   * them has only a removed callback. */
  core_observer o = {on_stored, on_removed, on_sealed, &logs[0], NULL};
  core_observer ro = {NULL, on_removed_only, NULL, &n_removed_only, NULL};
  assert_int_equal(core_add_observer(c, &o), 0);
  assert_int_equal(core_add_observer(c, &o), 0); /* logs[0] twice */
  assert_int_equal(core_add_observer(c, &ro), 0);
  assert_int_equal(core_add_observer(c, &ro), KVS_ELIMIT);
  r = prefill(c, t, 3 * BS + 1, &hit); /* 3 stored + sealed */
  assert_int_equal(hit, 0);
  core_req_free(c, r);
  assert_int_equal(core_req_create(c, NULL, 0, &r2), 0);
  assert_int_equal(core_allocate(c, r2, 8 * BS, &cow), 0); /* 3 removed */
  core_req_free(c, r2);
  assert_int_equal(logs[1].n, 6 + 3);
  assert_int_equal(logs[0].n, 2 * (6 + 3)); /* told twice, in turn */
  assert_int_equal(n_removed_only, 3);
  for (uint32_t i = 0; i < logs[1].n; i++) {
    assert_memory_equal(&logs[0].e[2 * i], &logs[1].e[i], sizeof(ev));
    assert_memory_equal(&logs[0].e[2 * i + 1], &logs[1].e[i], sizeof(ev));
  }
  clear_logs();
  /* Removing by arg removes both copies; there is room again. */
  core_remove_observer(c, &logs[0]);
  assert_int_equal(core_add_observer(c, &o), 0);  /* 3 */
  assert_int_equal(core_add_observer(c, &ro), 0); /* 4 */
  assert_int_equal(core_add_observer(c, &ro), KVS_ELIMIT);
  /* core_set_observer: that one alone; NULL: none. */
  core_set_observer(c, &ro);
  n_removed_only = 0;
  r = prefill(c, t, 3 * BS + 1, &hit);
  core_req_free(c, r);
  assert_int_equal(core_req_create(c, NULL, 0, &r2), 0);
  assert_int_equal(core_allocate(c, r2, 8 * BS, &cow), 0);
  core_req_free(c, r2);
  assert_int_equal(logs[0].n + logs[1].n, 0);
  assert_int_equal(n_removed_only, 3);
  core_set_observer(c, NULL);
  n_removed_only = 0;
  r = prefill(c, t, 3 * BS + 1, &hit);
  core_req_free(c, r);
  assert_int_equal(core_req_create(c, NULL, 0, &r2), 0);
  assert_int_equal(core_allocate(c, r2, 8 * BS, &cow), 0);
  core_req_free(c, r2);
  assert_int_equal(n_removed_only + logs[0].n + logs[1].n, 0);
  for (int i = 0; i < CORE_OBSERVERS; i++)
    assert_int_equal(core_add_observer(c, &ro), 0);
  assert_int_equal(core_add_observer(c, &o), KVS_ELIMIT);
  core_remove_observer(c, &n_removed_only);
  check(c);
  core_destroy(c);

  /* Brought up from the host tier: stored, not sealed either. */
  c = mk(8, 0, NULL, NULL, 8);
  add_observers(c);
  r = prefill(c, t, 3 * BS + 1, &hit);
  assert_int_equal(count(0, EV_SEALED), 3);
  core_req_free(c, r);
  assert_int_equal(core_req_create(c, NULL, 0, &r2), 0);
  assert_int_equal(core_allocate(c, r2, 8 * BS, &cow), 0); /* copied down */
  core_req_free(c, r2);
  clear_logs();
  core_lookup_out out;
  assert_int_equal(core_req_create(c, NULL, 0, &r), 0);
  assert_int_equal(core_lookup_promote(c, r, t, 3 * BS + 1, 1, p, MAXB, &out),
                   0);
  assert_int_equal(out.npromos, 3);
  assert_int_equal(p[0].tier, CORE_TIER_HOST);
  assert_int_equal(core_promote_finish(c, r, p, 3, ok), 3 * BS);
  logs_agree();
  assert_int_equal(count(0, EV_STORED), 3);
  assert_int_equal(count(0, EV_SEALED), 0);
  core_req_free(c, r);
  check(c);
  core_destroy(c);
}

/* ==== 3. edge cases ======================================================= */

/* Everything a failed call must leave as it was. */
typedef struct snap {
  core_stats st;
  core_block_info pool[32];
  uint32_t nb, tbl[MAXB], slots, written, sealed, known;
} snap;

static void take_snap(core *c, core_req *r, snap *s) {
  memset(s, 0, sizeof(*s));
  core_get_stats(c, &s->st);
  assert_true(s->st.num_blocks <= 32);
  for (uint32_t b = 0; b < s->st.num_blocks; b++)
    core_block_get(c, b, &s->pool[b]);
  const uint32_t *bl = core_req_blocks(r, &s->nb);
  tbl_copy(s->tbl, bl, s->nb);
  s->slots = core_req_num_slots(r);
  s->written = core_req_num_written(r);
  s->sealed = core_req_num_sealed(r);
  s->known = core_req_num_known(r);
}

static void same_snap(core *c, core_req *r, const snap *a) {
  snap b;
  take_snap(c, r, &b);
  assert_memory_equal(a, &b, sizeof(b));
}

static void expect_refused(core *c, core_req *r, const kvs_hash128 *h,
                           uint32_t n) {
  snap a;
  core_promo p[MAXB];
  kvs_hash128 nh[MAXB];
  uint32_t np = 99, taken = 99;

  take_snap(c, r, &a);
  assert_int_equal(core_remote_promote(c, r, h, n, p, &np, &taken), KVS_ESTATE);
  assert_int_equal(np, 0);
  assert_int_equal(taken, 0);
  assert_int_equal(core_req_next_hashes(c, r, nh, MAXB), 0);
  same_snap(c, r, &a);
  check(c);
}

/* Only the first token of a block makes its hash: blocks that agree on it
 * collide. */
static kvs_hash128 first_token_hash(kvs_hash128 parent, kvs_hash128 salt,
                                    const uint32_t *tokens, uint32_t n,
                                    void *arg) {
  (void)arg;
  (void)n;
  return core_block_hash(parent, salt, tokens, 1);
}

static void test_remote_edges(void **state) {
  (void)state;
  kvs_hash128 root = the_root(16), h[MAXB], nh[MAXB];
  uint32_t t[6 * BS + 1], hit, np, taken, n;
  core_promo p[MAXB];
  core_req *r, *hog;
  core_cow cow;
  core_stats st;
  int ok[MAXB];

  for (uint32_t i = 0; i < MAXB; i++)
    ok[i] = 1;
  seq(t, 6 * BS + 1, 300);
  ref_chain(root, 0, t, 6 * BS + 1, h);

  /* -- KVS_ESTATE: unsealed, partly written, swapping, swapped out -- */
  core *c = mk(16, 0, NULL, NULL, 16);
  assert_int_equal(core_req_create(c, NULL, 0, &r), 0);
  assert_int_equal(core_lookup(c, r, t, 6 * BS + 1, &hit), 0);
  assert_int_equal(core_allocate(c, r, BS, &cow), 0); /* not written */
  expect_refused(c, r, h, 6);
  assert_int_equal(core_commit(c, r, 0, NULL, 2, NULL), 0); /* half */
  expect_refused(c, r, h, 6);
  assert_int_equal(core_allocate(c, r, BS, &cow), 0);
  assert_int_equal(core_commit(c, r, 2, NULL, BS, NULL), 0);
  /* one block sealed, the second half written: still refused */
  assert_int_equal(core_req_num_sealed(r), 1);
  expect_refused(c, r, h + 1, 5);
  assert_int_equal(core_commit(c, r, BS + 2, NULL, 2, NULL), 0);
  /* two blocks sealed, all written: accepted, the rest of the chain */
  assert_int_equal(core_req_next_hashes(c, r, nh, MAXB), 4);
  for (uint32_t i = 0; i < 4; i++)
    assert_true(heq(nh[i], h[2 + i]));
  core_move mv[MAXB];
  uint32_t nmv;
  assert_int_equal(core_swap_out(c, r, mv, MAXB, &nmv), 0);
  assert_int_equal(core_req_swap_state(r), CORE_SWAP_OUT_PENDING);
  expect_refused(c, r, h + 2, 4);
  for (uint32_t i = 0; i < nmv; i++)
    ok[i] = 1;
  assert_int_equal(core_swap_out_finish(c, r, mv, nmv, ok), 0);
  assert_int_equal(core_req_swap_state(r), CORE_SWAP_OUT);
  expect_refused(c, r, h + 2, 4);
  expect_refused(c, r, h, 6);
  core_req_free(c, r);
  check(c);
  core_destroy(c);

  /* -- the list: capped at the chain, ended by a hash that is not r's -- */
  c = mk(16, 0, NULL, NULL, 0);
  /* the block of the last known token is never taken, even when the list
   * names it rightly */
  assert_int_equal(core_req_create(c, NULL, 0, &r), 0);
  assert_int_equal(core_lookup(c, r, t, 6 * BS, &hit), 0);
  assert_int_equal(core_req_next_hashes(c, r, nh, MAXB), 5);
  assert_int_equal(core_remote_promote(c, r, h, 6, p, &np, &taken), 0);
  assert_int_equal(taken, 5);
  assert_int_equal(np, 5);
  assert_int_equal(core_promote_finish(c, r, p, np, ok), 5 * BS);
  core_req_free(c, r);
  /* (evicted again) */
  assert_int_equal(core_req_create(c, NULL, 0, &hog), 0);
  assert_int_equal(core_allocate(c, hog, 16 * BS, &cow), 0);
  core_req_free(c, hog);
  check(c);
  assert_int_equal(core_req_create(c, NULL, 0, &r), 0);
  assert_int_equal(core_lookup(c, r, t, 6 * BS + 1, &hit), 0);
  assert_int_equal(core_req_next_hashes(c, r, nh, 2), 2);
  assert_int_equal(core_req_next_hashes(c, r, nh, 0), 0);
  assert_int_equal(core_req_next_hashes(c, r, nh, MAXB), 6);
  kvs_hash128 list[10];
  memcpy(list, h, 6 * sizeof(kvs_hash128));
  for (uint32_t i = 6; i < 10; i++)
    list[i] = h[0]; /* past the chain: never looked at */
  list[2].lo++; /* the third is not r's */
  core_get_stats(c, &st);
  uint64_t miss0 = st.miss_blocks, alloc0 = st.allocated_blocks;
  assert_int_equal(core_remote_promote(c, r, list, 10, p, &np, &taken), 0);
  assert_int_equal(taken, 2);
  assert_int_equal(np, 2);
  assert_int_equal(core_req_num_sealed(r), 2);
  core_get_stats(c, &st);
  assert_int_equal(miss0 - st.miss_blocks, 2);
  assert_int_equal(st.allocated_blocks - alloc0, 2);
  assert_int_equal(st.used_blocks, 2);
  for (uint32_t i = 0; i < 2; i++) {
    assert_int_equal(p[i].pos, i);
    assert_true(heq(p[i].hash, h[i]));
    assert_true(heq(p[i].parent, i ? h[i - 1] : root));
  }
  /* the first fails: the table is empty again, the blocks free, no miss is
   * dropped from a tier (there is none) */
  assert_int_equal(core_promote_finish(c, r, p, 2, NULL), 0);
  assert_int_equal(core_req_num_sealed(r), 0);
  core_get_stats(c, &st);
  assert_int_equal(st.used_blocks, 0);
  assert_int_equal(st.indexed_blocks, 0);
  check(c);
  /* again, now with the whole chain and more: capped at 6 */
  memcpy(list, h, 6 * sizeof(kvs_hash128));
  assert_int_equal(core_remote_promote(c, r, list, 10, p, &np, &taken), 0);
  assert_int_equal(taken, 6);
  assert_int_equal(np, 6);
  assert_int_equal(core_req_next_hashes(c, r, nh, MAXB), 0);
  /* nothing more to take */
  uint32_t np2 = 9, taken2 = 9;
  assert_int_equal(core_remote_promote(c, r, list, 10, p + 6, &np2, &taken2), 0);
  assert_int_equal(np2 + taken2, 0);
  ok[3] = 0; /* the fourth failed: blocks 0..2 stay, and are indexed */
  assert_int_equal(core_promote_finish(c, r, p, 6, ok), 3 * BS);
  ok[3] = 1;
  core_get_stats(c, &st);
  assert_int_equal(st.used_blocks, 3);
  assert_int_equal(st.indexed_blocks, 3);
  for (uint32_t i = 0; i < 3; i++)
    assert_int_equal(core_block_holds(c, p[i].block, h[i]), 2);
  for (uint32_t i = 3; i < 6; i++)
    assert_int_equal(core_block_holds(c, p[i].block, h[i]), 0);
  check(c);
  /* -- a device hit meanwhile: another request computed blocks 3..4 -- */
  core_req *other;
  uint32_t ohit;
  assert_int_equal(core_req_create(c, NULL, 0, &other), 0);
  assert_int_equal(core_lookup(c, other, t, 6 * BS + 1, &ohit), 0);
  assert_int_equal(ohit, 3 * BS); /* what r promoted is indexed */
  assert_int_equal(core_allocate(c, other, 2 * BS, &cow), 0);
  assert_int_equal(core_commit(c, other, 3 * BS, NULL, 2 * BS, NULL), 0);
  uint32_t ob[2];
  const uint32_t *obl = core_req_blocks(other, &n);
  ob[0] = obl[3];
  ob[1] = obl[4];
  core_get_stats(c, &st);
  uint64_t hits0 = st.hit_blocks;
  assert_int_equal(core_req_next_hashes(c, r, nh, MAXB), 3);
  assert_int_equal(core_remote_promote(c, r, nh, 3, p, &np, &taken), 0);
  assert_int_equal(taken, 3);
  assert_int_equal(np, 1); /* 3, 4 are hits; 5 is a promo */
  const uint32_t *rbl = core_req_blocks(r, &n);
  assert_int_equal(rbl[3], ob[0]);
  assert_int_equal(rbl[4], ob[1]);
  assert_int_equal(p[0].pos, 5);
  assert_true(heq(p[0].parent, h[4]));
  core_get_stats(c, &st);
  assert_int_equal(st.hit_blocks - hits0, 2);
  core_block_info bi;
  core_block_get(c, ob[0], &bi);
  assert_int_equal(bi.ref, 2);
  /* the promo fails: r keeps the hits before it */
  assert_int_equal(core_promote_finish(c, r, p, 1, NULL), 5 * BS);
  check(c);
  core_req_free(c, other);
  core_req_free(c, r);
  check(c);

  /* -- room: a full pool takes nothing; the reserve is kept -- */
  core_destroy(c);
  c = mk(16, 2, NULL, NULL, 0);
  assert_int_equal(core_req_create(c, NULL, 0, &r), 0);
  assert_int_equal(core_lookup(c, r, t, 6 * BS + 1, &hit), 0);
  assert_int_equal(core_req_create(c, NULL, 0, &hog), 0);
  assert_int_equal(core_allocate(c, hog, 14 * BS, &cow), 0);
  assert_int_equal(core_req_next_hashes(c, r, nh, MAXB), 6);
  snap a;
  take_snap(c, r, &a);
  assert_int_equal(core_remote_promote(c, r, nh, 6, p, &np, &taken), 0);
  assert_int_equal(taken, 0); /* only the reserve is left */
  assert_int_equal(np, 0);
  same_snap(c, r, &a);
  core_req_free(c, hog);
  assert_int_equal(core_req_create(c, NULL, 0, &hog), 0);
  assert_int_equal(core_allocate(c, hog, 13 * BS, &cow), 0);
  assert_int_equal(core_remote_promote(c, r, nh, 6, p, &np, &taken), 0);
  assert_int_equal(taken, 1); /* one block above the reserve */
  assert_int_equal(np, 1);
  core_get_stats(c, &st);
  assert_int_equal(st.free_blocks + st.cached_blocks, 2);
  assert_int_equal(core_promote_finish(c, r, p, 1, ok), BS);
  core_req_free(c, hog);
  check(c);

  /* -- an IN USE device hit needs no room -- */
  core_req *h2;
  assert_int_equal(core_req_create(c, NULL, 0, &h2), 0);
  assert_int_equal(core_lookup(c, h2, t, 6 * BS + 1, &hit), 0);
  assert_int_equal(hit, BS); /* r's promoted block */
  assert_int_equal(core_allocate(c, h2, 2 * BS, &cow), 0);
  assert_int_equal(core_commit(c, h2, BS, NULL, 2 * BS, NULL), 0);
  const uint32_t *hb = core_req_blocks(h2, &n);
  assert_int_equal(core_block_holds(c, hb[1], h[1]), 2);
  assert_int_equal(core_block_holds(c, hb[2], h[2]), 2);
  core_get_stats(c, &st);
  assert_int_equal(core_req_create(c, NULL, 0, &hog), 0);
  assert_int_equal(core_allocate(c, hog,
                                 (st.free_blocks + st.cached_blocks - 2) * BS,
                                 &cow), 0);
  assert_int_equal(core_req_next_hashes(c, r, nh, MAXB), 5);
  assert_int_equal(core_remote_promote(c, r, nh, 5, p, &np, &taken), 0);
  assert_int_equal(taken, 2); /* both hits, then no room */
  assert_int_equal(np, 0);
  const uint32_t *rbl2 = core_req_blocks(r, &n);
  assert_int_equal(n, 3);
  assert_int_equal(rbl2[1], hb[1]);
  assert_int_equal(rbl2[2], hb[2]);
  core_block_get(c, hb[1], &bi);
  assert_int_equal(bi.ref, 2);
  core_req_free(c, r);
  core_req_free(c, h2);
  core_req_free(c, hog);
  check(c);
  core_destroy(c);

  /* -- below the reserve (decode dipped into it), IN USE device hits are
   *    still taken: they need no room -- */
  c = mk(16, 2, NULL, NULL, 0);
  assert_int_equal(core_req_create(c, NULL, 0, &r), 0);
  assert_int_equal(core_lookup(c, r, t, 6 * BS + 1, &hit), 0);
  assert_int_equal(core_req_create(c, NULL, 0, &h2), 0);
  assert_int_equal(core_allocate(c, h2, 2 * BS, &cow), 0);
  assert_int_equal(core_commit(c, h2, 0, t, 2 * BS, NULL), 0); /* h0, h1 */
  assert_int_equal(core_req_create(c, NULL, 0, &hog), 0);
  assert_int_equal(core_allocate(c, hog, 12 * BS, &cow), 0); /* the reserve */
  assert_int_equal(core_append(c, hog, 1, &cow), 0);          /* and 1 */
  core_get_stats(c, &st);
  assert_int_equal(st.free_blocks + st.cached_blocks, 1);
  assert_int_equal(core_req_next_hashes(c, r, nh, MAXB), 6);
  assert_int_equal(core_remote_promote(c, r, nh, 6, p, &np, &taken), 0);
  assert_int_equal(taken, 2);
  assert_int_equal(np, 0);
  hb = core_req_blocks(h2, &n);
  rbl2 = core_req_blocks(r, &n);
  assert_int_equal(rbl2[0], hb[0]);
  assert_int_equal(rbl2[1], hb[1]);
  core_get_stats(c, &st);
  assert_int_equal(st.free_blocks + st.cached_blocks, 1);
  core_req_free(c, r);
  core_req_free(c, h2);
  core_req_free(c, hog);
  check(c);
  core_destroy(c);

  /* -- a CACHED device hit does need room -- */
  c = mk(16, 2, NULL, NULL, 0);
  assert_int_equal(core_req_create(c, NULL, 0, &r), 0);
  assert_int_equal(core_lookup(c, r, t, 6 * BS + 1, &hit), 0);
  assert_int_equal(hit, 0);
  h2 = prefill(c, t, 6 * BS + 1, &hit); /* meanwhile, computed elsewhere */
  core_req_free(c, h2);
  /* 10 free blocks (first to go), then 6 cached: the chain's tail first */
  assert_int_equal(core_req_create(c, NULL, 0, &hog), 0);
  assert_int_equal(core_allocate(c, hog, 13 * BS, &cow), 0);
  core_get_stats(c, &st);
  assert_int_equal(st.free_blocks, 0);
  assert_int_equal(st.cached_blocks, 3);
  for (uint32_t i = 0; i < 3; i++)
    assert_int_not_equal(pool_find_in(c, 16, h[i], NULL), NONE);
  assert_int_equal(core_req_next_hashes(c, r, nh, MAXB), 6);
  assert_int_equal(core_remote_promote(c, r, nh, 6, p, &np, &taken), 0);
  assert_int_equal(taken, 1); /* 3 queued, the reserve 2: one CACHED hit */
  assert_int_equal(np, 0);
  assert_int_equal(core_req_blocks(r, &n)[0], pool_find_in(c, 16, h[0], NULL));
  core_req_free(c, r);
  core_req_free(c, hog);
  check(c);
  core_destroy(c);

  /* -- a forced collision with verify_tokens ends the list; a freed
   *    request's promos end with r NULL -- */
  c = mk(16, 0, NULL, first_token_hash, 0);
  uint32_t ta[3 * BS + 1], tb[3 * BS + 1];
  seq(ta, 3 * BS + 1, 10);
  memcpy(tb, ta, sizeof(tb));
  tb[BS + 1] = 99; /* block 1 differs after its first token: same hash */
  r = prefill(c, ta, 3 * BS + 1, &hit);
  core_req_free(c, r);
  assert_int_equal(core_req_create(c, NULL, 0, &r), 0);
  assert_int_equal(core_lookup(c, r, tb, 3 * BS + 1, &hit), 0);
  assert_int_equal(hit, BS); /* the collision stops the lookup */
  assert_int_equal(core_req_next_hashes(c, r, nh, MAXB), 2);
  take_snap(c, r, &a);
  assert_int_equal(core_remote_promote(c, r, nh, 2, p, &np, &taken), 0);
  assert_int_equal(taken, 0); /* block 1's hash is ta's on the device */
  assert_int_equal(np, 0);
  same_snap(c, r, &a);
  core_req_free(c, r);
  /* evicted, the same list is promoted (the store would serve tb's bytes) */
  assert_int_equal(core_req_create(c, NULL, 0, &hog), 0);
  assert_int_equal(core_allocate(c, hog, 16 * BS, &cow), 0);
  core_req_free(c, hog);
  assert_int_equal(core_req_create(c, NULL, 0, &r), 0);
  assert_int_equal(core_lookup(c, r, tb, 3 * BS + 1, &hit), 0);
  assert_int_equal(hit, 0);
  assert_int_equal(core_req_next_hashes(c, r, nh, MAXB), 3);
  assert_int_equal(core_remote_promote(c, r, nh, 3, p, &np, &taken), 0);
  assert_int_equal(np, 3);
  core_req_free(c, r); /* its worker died */
  core_get_stats(c, &st);
  assert_int_equal(st.used_blocks, 3); /* the pins */
  assert_int_equal(core_promote_finish(c, NULL, p, 3, ok), 0);
  core_get_stats(c, &st);
  assert_int_equal(st.used_blocks, 0);
  assert_int_equal(st.indexed_blocks, 3); /* good bytes: cached */
  for (uint32_t i = 0; i < 3; i++)
    assert_int_equal(core_block_holds(c, p[i].block, p[i].hash), 1);
  check(c);
  core_destroy(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_observers),
      cmocka_unit_test(test_remote_edges),
      cmocka_unit_test(test_random_vs_reference),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
