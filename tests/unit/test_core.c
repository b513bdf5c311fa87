/*
 * test_core.c — the core's request operations, scenario by scenario.  Every
 * test ends with the pool invariant check and, once all requests are freed,
 * every block back on the free queue.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "daemon/core/core.h"

#define BS 4

static core *mk(uint32_t nblocks, uint32_t reserve) {
  core_config cfg;
  core *c;
  core_config_init(&cfg);
  cfg.num_blocks = nblocks;
  cfg.block_size = BS;
  cfg.reserve_blocks = reserve;
  kvs_layout l = {BS, 2, 2, 8, KVS_DTYPE_FP16, nblocks, 0};
  cfg.root = core_root_hash(&l, "test-model");
  assert_int_equal(core_create(&cfg, &c), 0);
  return c;
}

static void check(core *c) {
  char msg[256];
  int rc = core_check(c, msg, sizeof(msg));
  if (rc != 0)
    fail_msg("invariant: %s", msg);
}

/* Frees nothing: checks that the core has no request and every block is back
 * on the free queue, then destroys it. */
static void finish(core *c) {
  core_stats st;
  check(c);
  core_get_stats(c, &st);
  assert_int_equal(st.num_requests, 0);
  assert_int_equal(st.used_blocks, 0);
  assert_int_equal(st.free_blocks + st.cached_blocks, st.num_blocks);
  core_destroy(c);
}

static void seq(uint32_t *t, uint32_t n, uint32_t base) {
  for (uint32_t i = 0; i < n; i++)
    t[i] = base + i;
}

/* create + lookup + allocate the rest + commit it all. */
static core_req *prefill(core *c, const uint32_t *t, uint32_t n,
                         uint32_t *hit) {
  core_req *r;
  core_cow cow;
  uint32_t h;
  assert_int_equal(core_req_create(c, NULL, 0, &r), 0);
  assert_int_equal(core_lookup(c, r, t, n, &h), 0);
  assert_int_equal(core_allocate(c, r, n - h, &cow), 0);
  assert_int_equal(cow.src, KVS_BLOCK_NONE);
  assert_int_equal(core_commit(c, r, h, NULL, n - h, NULL), 0);
  if (hit)
    *hit = h;
  return r;
}

static void test_share_prefix(void **state) {
  (void)state;
  core *c = mk(32, 0);
  uint32_t t[18], hit, n1, n2;
  seq(t, 18, 100);
  core_req *a = prefill(c, t, 18, &hit);
  assert_int_equal(hit, 0);
  assert_int_equal(core_req_num_sealed(a), 4);
  const uint32_t *ba = core_req_blocks(a, &n1);
  assert_int_equal(n1, 5);

  core_req *b = prefill(c, t, 18, &hit);
  assert_int_equal(hit, 16); /* 4 full blocks; the partial one is private */
  const uint32_t *bb = core_req_blocks(b, &n2);
  assert_int_equal(n2, 5);
  for (int i = 0; i < 4; i++) {
    core_block_info bi;
    assert_int_equal(bb[i], ba[i]);
    assert_int_equal(core_block_get(c, bb[i], &bi), 0);
    assert_int_equal(bi.ref, 2);
    assert_int_equal(bi.state, CORE_BLOCK_IN_USE);
  }
  assert_int_not_equal(bb[4], ba[4]);
  core_stats st;
  core_get_stats(c, &st);
  assert_int_equal(st.hit_blocks, 4);
  assert_int_equal(st.miss_blocks, 4);
  assert_int_equal(st.hit_tokens, 16);
  assert_int_equal(st.query_tokens, 36);
  assert_int_equal(st.used_blocks, 6);
  check(c);
  core_req_free(c, a);
  core_req_free(c, b);
  core_get_stats(c, &st);
  assert_int_equal(st.cached_blocks, 4);
  assert_int_equal(st.free_blocks, 28);
  finish(c);
}

static void test_last_token_never_cached(void **state) {
  (void)state;
  core *c = mk(16, 0);
  uint32_t t[8], hit;
  seq(t, 8, 7);
  core_req *a = prefill(c, t, 8, &hit);
  core_req_free(c, a);
  /* The same 8 tokens: both blocks are cached, but the last token must be
   * computed, so only the first block hits. */
  core_req *b = prefill(c, t, 8, &hit);
  assert_int_equal(hit, 4);
  core_req_free(c, b);
  /* One more token: both blocks hit. */
  uint32_t u[9];
  seq(u, 9, 7);
  core_req *d = prefill(c, u, 9, &hit);
  assert_int_equal(hit, 8);
  core_req_free(c, d);
  /* A one-token prompt never hits. */
  core_req *e = prefill(c, u, 1, &hit);
  assert_int_equal(hit, 0);
  core_req_free(c, e);
  finish(c);
}

/* A pool of one block: a block sealed, cached, hit and evicted, and the
 * invariant checked at each step (core_check's scratch memory serves as
 * both a counter per block and a bitmap of whole 64-bit words). */
static void test_one_block_pool(void **state) {
  (void)state;
  core *c = mk(1, 0);
  uint32_t t[BS + 1], hit;
  seq(t, BS + 1, 40);
  core_req *a = prefill(c, t, BS, &hit);
  check(c);
  core_req_free(c, a);
  check(c);
  core_req *b = prefill(c, t, BS - 1, &hit); /* evicts the cached block */
  assert_int_equal(hit, 0);
  core_req_free(c, b);
  finish(c);
}

static void test_nospace_changes_nothing(void **state) {
  (void)state;
  core *c = mk(4, 0);
  uint32_t t[12], hit, n;
  core_req *r;
  core_cow cow;
  core_stats before, after;
  seq(t, 12, 1);
  core_req *a = prefill(c, t, 12, &hit); /* 3 blocks */
  assert_int_equal(core_req_create(c, NULL, 0, &r), 0);
  core_get_stats(c, &before);
  assert_int_equal(core_allocate(c, r, 5, &cow), KVS_ENOSPC); /* needs 2 */
  core_get_stats(c, &after);
  assert_int_equal(after.no_space, before.no_space + 1);
  after.no_space = before.no_space;
  assert_memory_equal(&before, &after, sizeof(before));
  core_req_blocks(r, &n);
  assert_int_equal(n, 0);
  assert_int_equal(core_req_num_slots(r), 0);
  assert_int_equal(core_allocate(c, r, 4, &cow), 0); /* exactly the last */
  assert_int_equal(core_append(c, r, 1, &cow), KVS_ENOSPC);
  check(c);
  core_req_free(c, a);
  core_req_free(c, r);
  finish(c);
}

static void test_reserve_watermark(void **state) {
  (void)state;
  core *c = mk(6, 2);
  core_req *r;
  core_cow cow;
  assert_int_equal(core_req_create(c, NULL, 0, &r), 0);
  assert_int_equal(core_allocate(c, r, 4 * BS + 1, &cow), KVS_ENOSPC);
  assert_int_equal(core_allocate(c, r, 4 * BS, &cow), 0); /* leaves 2 */
  assert_int_equal(core_allocate(c, r, 1, &cow), KVS_ENOSPC);
  assert_int_equal(core_append(c, r, 1, &cow), 0);  /* decode may use it */
  assert_int_equal(core_append(c, r, BS - 1, &cow), 0); /* same block */
  assert_int_equal(core_append(c, r, 1, &cow), 0);
  assert_int_equal(core_append(c, r, BS, &cow), KVS_ENOSPC);
  assert_int_equal(core_req_num_slots(r), 6 * BS - BS + 1);
  check(c);
  core_req_free(c, r);
  finish(c);
}

static void test_append_decode(void **state) {
  (void)state;
  core *c = mk(8, 0);
  uint32_t t[6], hit, n, tok;
  core_cow cow;
  seq(t, 6, 50);
  core_req *r = prefill(c, t, 6, &hit);
  core_req_blocks(r, &n);
  assert_int_equal(n, 2);
  for (uint32_t i = 0; i < 10; i++) {
    uint32_t pos = core_req_num_slots(r);
    assert_int_equal(core_append(c, r, 1, &cow), 0);
    core_req_blocks(r, &n);
    assert_int_equal(n, pos / BS + 1); /* a new block exactly at a boundary */
    tok = 1000 + i;
    assert_int_equal(core_commit(c, r, pos, &tok, 1, NULL), 0);
    assert_int_equal(core_req_num_sealed(r), (pos + 1) / BS);
  }
  /* The decoded sequence is now a cached prefix for another request. */
  uint32_t full[16];
  memcpy(full, t, sizeof(t));
  for (uint32_t i = 0; i < 10; i++)
    full[6 + i] = 1000 + i;
  core_req *d;
  assert_int_equal(core_req_create(c, NULL, 0, &d), 0);
  assert_int_equal(core_lookup(c, d, full, 16, &hit), 0);
  assert_int_equal(hit, 12);
  check(c);
  core_req_free(c, r);
  core_req_free(c, d);
  finish(c);
}

static void test_commit_errors(void **state) {
  (void)state;
  core *c = mk(8, 0);
  uint32_t t[10], bad[10], s;
  core_req *r;
  core_cow cow;
  seq(t, 10, 5);
  assert_int_equal(core_req_create(c, NULL, 0, &r), 0);
  assert_int_equal(core_lookup(c, r, t, 6, &s), 0);
  assert_int_equal(core_allocate(c, r, 6, &cow), 0);
  /* a gap: nothing written yet, so start must be 0 */
  assert_int_equal(core_commit(c, r, 2, t + 2, 2, NULL), KVS_ERANGE);
  /* positions without a slot: not written by this request */
  assert_int_equal(core_commit(c, r, 0, t, 7, NULL), KVS_ERANGE);
  /* unknown tokens with tokens == NULL */
  assert_int_equal(core_append(c, r, 2, &cow), 0);
  assert_int_equal(core_commit(c, r, 0, NULL, 7, NULL), KVS_EINVAL);
  /* tokens that differ from the prompt the lookup gave */
  memcpy(bad, t, sizeof(t));
  bad[3] ^= 1;
  assert_int_equal(core_commit(c, r, 0, bad, 6, NULL), KVS_EMISMATCH);
  assert_int_equal(core_req_num_written(r), 0);
  assert_int_equal(core_req_num_sealed(r), 0);
  /* now properly, in two steps, and idempotently */
  assert_int_equal(core_commit(c, r, 0, NULL, 3, &s), 0);
  assert_int_equal(s, 0);
  assert_int_equal(core_commit(c, r, 0, t, 6, &s), 0);
  assert_int_equal(s, 1);
  assert_int_equal(core_commit(c, r, 6, t + 6, 2, &s), 0);
  assert_int_equal(s, 1);
  assert_int_equal(core_commit(c, r, 7, bad + 7, 1, NULL), 0); /* same token */
  bad[7] ^= 2;
  assert_int_equal(core_commit(c, r, 7, bad + 7, 1, NULL), KVS_EMISMATCH);
  /* lookup on a non-empty request */
  assert_int_equal(core_lookup(c, r, t, 6, &s), KVS_ESTATE);
  check(c);
  core_req_free(c, r);
  finish(c);
}

static void test_fork_cow(void **state) {
  (void)state;
  core *c = mk(16, 0);
  uint32_t t[6], hit, n, tok;
  core_cow cow;
  core_block_info bi;
  core_req *k;
  seq(t, 6, 70);
  core_req *p = prefill(c, t, 6, &hit); /* one full block + 2 tokens */
  uint32_t partial = core_req_blocks(p, &n)[1];
  assert_int_equal(core_fork(c, p, &k), 0);
  const uint32_t *bk = core_req_blocks(k, &n);
  assert_int_equal(n, 2);
  assert_int_equal(bk[1], partial);
  assert_int_equal(core_block_get(c, partial, &bi), 0);
  assert_int_equal(bi.ref, 2);
  /* the child writes into the shared partial block: it gets a copy */
  assert_int_equal(core_append(c, k, 1, &cow), 0);
  assert_int_equal(cow.src, partial);
  assert_int_not_equal(cow.dst, KVS_BLOCK_NONE);
  assert_int_equal(core_req_blocks(k, &n)[1], cow.dst);
  assert_int_equal(core_block_get(c, partial, &bi), 0);
  assert_int_equal(bi.ref, 1);
  /* the parent now holds it alone: no copy */
  assert_int_equal(core_append(c, p, 1, &cow), 0);
  assert_int_equal(cow.src, KVS_BLOCK_NONE);
  assert_int_equal(core_req_blocks(p, &n)[1], partial);
  /* the two diverge: different tokens at position 6 */
  tok = 1;
  assert_int_equal(core_commit(c, p, 6, &tok, 1, NULL), 0);
  tok = 2;
  assert_int_equal(core_commit(c, k, 6, &tok, 1, NULL), 0);
  core_stats st;
  core_get_stats(c, &st);
  assert_int_equal(st.cow_copies, 1);
  /* a fork with unwritten slots is refused */
  core_req *k2;
  assert_int_equal(core_append(c, p, 1, &cow), 0);
  assert_int_equal(core_fork(c, p, &k2), KVS_ESTATE);
  check(c);
  core_req_free(c, p); /* child first or parent first: both orders work */
  check(c);
  core_req_free(c, k);
  finish(c);
}

static void test_fork_full_block_sealed_by_both(void **state) {
  (void)state;
  core *c = mk(16, 0);
  uint32_t t[8], hit, s, n;
  core_cow cow;
  core_req *p, *k;
  seq(t, 8, 300);
  assert_int_equal(core_req_create(c, NULL, 0, &p), 0);
  assert_int_equal(core_lookup(c, p, t, 3, &hit), 0);
  assert_int_equal(core_allocate(c, p, 3, &cow), 0);
  assert_int_equal(core_commit(c, p, 0, NULL, 3, NULL), 0);
  assert_int_equal(core_fork(c, p, &k), 0);
  /* both append into the shared partial block: one copies */
  assert_int_equal(core_append(c, k, 1, &cow), 0);
  assert_int_not_equal(cow.src, KVS_BLOCK_NONE);
  assert_int_equal(core_append(c, p, 1, &cow), 0);
  assert_int_equal(cow.src, KVS_BLOCK_NONE);
  /* same token in both: two equal blocks, one indexed, one duplicate */
  assert_int_equal(core_commit(c, p, 3, t + 3, 1, &s), 0);
  assert_int_equal(s, 1);
  assert_int_equal(core_commit(c, k, 3, t + 3, 1, &s), 0);
  assert_int_equal(s, 1);
  core_stats st;
  core_get_stats(c, &st);
  assert_int_equal(st.duplicate_blocks, 1);
  core_block_info bp, bk;
  core_block_get(c, core_req_blocks(p, &n)[0], &bp);
  core_block_get(c, core_req_blocks(k, &n)[0], &bk);
  assert_true(bp.indexed != bk.indexed);
  assert_true(bp.hash.lo == bk.hash.lo && bp.hash.hi == bk.hash.hi);
  core_req_free(c, p);
  core_req_free(c, k);
  core_get_stats(c, &st);
  assert_int_equal(st.cached_blocks, 1);
  finish(c);
}

static void test_free_tail_first_eviction(void **state) {
  (void)state;
  core *c = mk(4, 0);
  uint32_t t[13], hit, n;
  core_cow cow;
  core_req *r;
  seq(t, 13, 900);
  core_req *a = prefill(c, t, 12, &hit); /* 3 full blocks, all sealed */
  uint32_t blocks[3];
  memcpy(blocks, core_req_blocks(a, &n), sizeof(blocks));
  core_req_free(c, a);
  /* one FREE block is used before any cached one */
  assert_int_equal(core_req_create(c, NULL, 0, &r), 0);
  assert_int_equal(core_allocate(c, r, 1, &cow), 0);
  core_stats st;
  core_get_stats(c, &st);
  assert_int_equal(st.evictions, 0);
  /* the next allocation evicts the chain tail, not its parents */
  assert_int_equal(core_allocate(c, r, BS, &cow), 0);
  assert_int_equal(core_req_blocks(r, &n)[1], blocks[2]);
  core_get_stats(c, &st);
  assert_int_equal(st.evictions, 1);
  core_req_free(c, r);
  core_req *b = prefill(c, t, 13, &hit);
  assert_int_equal(hit, 8); /* the two parents survived */
  core_req_free(c, b);
  finish(c);
}

static void test_lru_order(void **state) {
  (void)state;
  core *c = mk(4, 0);
  uint32_t x[5], y[5], z[5], hit;
  seq(x, 5, 10);
  seq(y, 5, 20);
  seq(z, 5, 30);
  core_req_free(c, prefill(c, x, 5, &hit)); /* x: 1 cached block */
  core_req_free(c, prefill(c, y, 5, &hit)); /* y: 1 cached block */
  core_req_free(c, prefill(c, x, 5, &hit)); /* touch x: now y is older */
  assert_int_equal(hit, 4);
  core_req_free(c, prefill(c, z, 5, &hit));
  core_req *big;
  core_cow cow;
  core_stats st;
  assert_int_equal(core_req_create(c, NULL, 0, &big), 0);
  /* 4 blocks: 1 free + 3 cached (y, x, z). Take 2: the free one and y. */
  assert_int_equal(core_allocate(c, big, 2 * BS, &cow), 0);
  core_get_stats(c, &st);
  assert_int_equal(st.evictions, 1);
  core_req_free(c, big);
  core_req *r = prefill(c, y, 5, &hit);
  assert_int_equal(hit, 0);
  core_req_free(c, r);
  r = prefill(c, x, 5, &hit);
  assert_int_equal(hit, 4);
  core_req_free(c, r);
  finish(c);
}

static kvs_hash128 const_hash(kvs_hash128 parent, kvs_hash128 salt,
                              const uint32_t *tokens, uint32_t n, void *arg) {
  (void)parent;
  (void)salt;
  (void)tokens;
  (void)n;
  (void)arg;
  kvs_hash128 h = {42, 42};
  return h;
}

static void test_forced_collision_never_served(void **state) {
  (void)state;
  core_config cfg;
  core *c;
  core_config_init(&cfg);
  cfg.num_blocks = 16;
  cfg.block_size = BS;
  cfg.hash_fn = const_hash; /* every block has the same hash */
  assert_int_equal(core_create(&cfg, &c), 0);
  uint32_t a[5], b[5], hit;
  seq(a, 5, 1);
  seq(b, 5, 2);
  core_req *ra = prefill(c, a, 5, &hit);
  core_req *rb = prefill(c, b, 5, &hit);
  assert_int_equal(hit, 0); /* same hash, other tokens: a miss */
  core_stats st;
  core_get_stats(c, &st);
  assert_int_equal(st.collisions, 2); /* at lookup, and again at sealing */
  core_req *ra2 = prefill(c, a, 5, &hit);
  assert_int_equal(hit, 4); /* the real owner still hits */
  check(c);
  core_req_free(c, ra);
  core_req_free(c, rb);
  core_req_free(c, ra2);
  finish(c);
}

static void test_salt_isolation(void **state) {
  (void)state;
  core *c = mk(16, 0);
  uint32_t t[9], hit;
  core_req *r;
  core_cow cow;
  seq(t, 9, 3);
  const char *s1 = "tenant-a", *s2 = "tenant-b";
  for (int round = 0; round < 3; round++) {
    const char *salt = round == 1 ? s2 : s1;
    assert_int_equal(core_req_create(c, salt, strlen(salt), &r), 0);
    assert_int_equal(core_lookup(c, r, t, 9, &hit), 0);
    assert_int_equal(hit, round == 2 ? 8 : 0);
    assert_int_equal(core_allocate(c, r, 9 - hit, &cow), 0);
    assert_int_equal(core_commit(c, r, hit, NULL, 9 - hit, NULL), 0);
    core_req_free(c, r);
  }
  core_req *plain = prefill(c, t, 9, &hit); /* no salt: no hit either */
  assert_int_equal(hit, 0);
  core_req_free(c, plain);
  finish(c);
}

/* Blocks of different cache dtypes never share a hash chain: the root
 * names the dtype, and int8's its format, so a disk slot or a remote key
 * written under one is never found under another, even where two dtypes'
 * blocks have the same size.  The reference root is XXH3-128 over the tag,
 * the shape and the model id as hash.c documents it; int8 must differ from
 * it (it is what the earlier int8 formats' blocks were keyed by), the other
 * dtypes equal it. */
static void test_root_per_dtype(void **state) {
  (void)state;
  static const char tag[] = "kvshare/root/v1", model[] = "m";
  kvs_hash128 roots[KVS_DTYPE__COUNT], first[KVS_DTYPE__COUNT];
  uint32_t tok[BS] = {1, 2, 3, 4};
  kvs_hash128 nosalt = {0, 0};

  for (uint32_t dt = 0; dt < KVS_DTYPE__COUNT; dt++) {
    kvs_layout l = {BS, 2, 2, 32, dt, 16, 0};
    uint32_t f[5] = {BS, 2, 2, 32, dt};
    XXH3_state_t st;

    roots[dt] = core_root_hash(&l, model);
    XXH3_128bits_reset(&st);
    XXH3_128bits_update(&st, tag, sizeof(tag));
    XXH3_128bits_update(&st, f, sizeof(f));
    XXH3_128bits_update(&st, model, strlen(model));
    XXH128_hash_t ref = XXH3_128bits_digest(&st);
    int same = roots[dt].lo == ref.low64 && roots[dt].hi == ref.high64;
    assert_int_equal(same, dt != KVS_DTYPE_INT8);
    first[dt] = core_block_hash(roots[dt], nosalt, tok, BS);
  }
  for (uint32_t a = 0; a < KVS_DTYPE__COUNT; a++)
    for (uint32_t b = a + 1; b < KVS_DTYPE__COUNT; b++) {
      assert_false(roots[a].lo == roots[b].lo && roots[a].hi == roots[b].hi);
      assert_false(first[a].lo == first[b].lo && first[a].hi == first[b].hi);
    }
}

/* Freed requests are reused (core.c keeps up to 64, with their arrays when
 * small): a reused request starts as a new one, whatever the old one held
 * (a salt, a long prompt whose arrays are dropped, a short one whose arrays
 * are kept, a block table). */
static void test_reused_requests_start_clean(void **state) {
  (void)state;
  enum { LONG = 9000 };
  core *c = mk(LONG / BS + 400, 0);
  uint32_t *t = malloc(LONG * sizeof(*t)), hit, n;
  core_req *r[100];
  core_cow cow;
  seq(t, LONG, 1);
  for (int round = 0; round < 3; round++) {
    /* one long salted request, then 99 short ones of 9 tokens */
    assert_int_equal(core_req_create(c, "s", 1, &r[0]), 0);
    assert_int_equal(core_lookup(c, r[0], t, LONG, &hit), 0);
    assert_int_equal(hit, round ? LONG - BS : 0);
    assert_int_equal(core_allocate(c, r[0], LONG - hit, &cow), 0);
    assert_int_equal(core_commit(c, r[0], hit, NULL, LONG - hit, NULL), 0);
    for (int i = 1; i < 100; i++) {
      uint32_t u[9];
      seq(u, 9, 100000 + (uint32_t)i * 16);
      r[i] = prefill(c, u, 9, &hit);
      assert_int_equal(hit, round ? 8 : 0);
    }
    check(c);
    for (int i = 99; i >= 0; i--)
      core_req_free(c, r[i]);
    check(c);
    /* what is created now is a spare: empty, no salt */
    core_req *f;
    assert_int_equal(core_req_create(c, NULL, 0, &f), 0);
    assert_int_equal(core_req_num_known(f), 0);
    assert_int_equal(core_req_num_slots(f), 0);
    assert_int_equal(core_req_num_sealed(f), 0);
    assert_int_equal(core_req_swap_state(f), CORE_SWAP_NONE);
    core_req_blocks(f, &n);
    assert_int_equal(n, 0);
    assert_int_equal(core_lookup(c, f, t, 9, &hit), 0);
    assert_int_equal(hit, 0); /* the cached prefix is salted */
    core_req_free(c, f);
  }
  free(t);
  finish(c);
}

static void test_preempt_and_resume(void **state) {
  (void)state;
  core *c = mk(8, 0);
  uint32_t t[10], hit;
  core_stats st;
  core_cow cow;
  seq(t, 10, 40);
  core_req *r = prefill(c, t, 10, &hit);
  assert_int_equal(core_preempt(c, r), 0);
  core_get_stats(c, &st);
  assert_int_equal(st.used_blocks, 0);
  assert_int_equal(st.num_requests, 1);
  check(c);
  assert_int_equal(core_lookup(c, r, t, 10, &hit), 0);
  assert_int_equal(hit, 8);
  assert_int_equal(core_allocate(c, r, 2, &cow), 0);
  assert_int_equal(core_commit(c, r, 8, NULL, 2, NULL), 0);
  check(c);
  core_req_free(c, r);
  finish(c);
}

/* Pins: the daemon's copies hold their source and destination off the free
 * queue however the requests go.  The hazard: a CoW pair whose requests are
 * freed while the copy runs must not let either block be reallocated. */
static void test_pins(void **state) {
  (void)state;
  core *c = mk(8, 0);
  uint32_t t[6], hit, n;
  core_cow cow;
  core_block_info bi;
  core_req *k, *other;
  seq(t, 6, 300);
  core_req *p = prefill(c, t, 6, &hit); /* one full block + 2 tokens */
  assert_int_equal(core_fork(c, p, &k), 0);
  assert_int_equal(core_append(c, k, 1, &cow), 0);
  assert_int_not_equal(cow.src, KVS_BLOCK_NONE);
  assert_int_equal(core_pin(c, cow.src), 0);
  assert_int_equal(core_pin(c, cow.dst), 0);
  assert_int_equal(core_block_get(c, cow.dst, &bi), 0);
  assert_int_equal(bi.ref, 2); /* the child's slot and the pin */
  assert_int_equal(bi.pins, 1);
  check(c);
  /* both requests go while the copy would still run */
  core_req_free(c, k);
  core_req_free(c, p);
  check(c);
  assert_int_equal(core_block_get(c, cow.src, &bi), 0);
  assert_int_equal(bi.state, CORE_BLOCK_IN_USE);
  assert_int_equal(core_block_get(c, cow.dst, &bi), 0);
  assert_int_equal(bi.state, CORE_BLOCK_IN_USE);
  /* every other block can be allocated, the pinned two never */
  assert_int_equal(core_req_create(c, NULL, 0, &other), 0);
  assert_int_equal(core_allocate(c, other, 6 * BS, &cow), 0);
  const uint32_t *ob = core_req_blocks(other, &n);
  core_cow again;
  assert_int_equal(core_allocate(c, other, 1, &again), KVS_ENOSPC);
  for (uint32_t i = 0; i < n; i++) {
    assert_int_not_equal(core_block_get(c, ob[i], &bi), KVS_ERANGE);
    assert_int_equal(bi.pins, 0);
  }
  core_req_free(c, other);
  /* a pin is not a holder: the request that alone holds a pinned partial
   * block appends into it in place, with no copy-on-write */
  {
    core_req *p2, *k2;
    core_cow c1, c2;
    assert_int_equal(core_req_create(c, NULL, 0, &p2), 0);
    uint32_t t2[6];
    seq(t2, 6, 900);
    assert_int_equal(core_lookup(c, p2, t2, 6, &hit), 0);
    assert_int_equal(core_allocate(c, p2, 6 - hit, &c1), 0);
    assert_int_equal(core_commit(c, p2, hit, NULL, 6 - hit, NULL), 0);
    assert_int_equal(core_fork(c, p2, &k2), 0);
    assert_int_equal(core_append(c, k2, 1, &c1), 0); /* the child copies */
    assert_int_not_equal(c1.src, KVS_BLOCK_NONE);
    assert_int_equal(core_pin(c, c1.src), 0);
    assert_int_equal(core_pin(c, c1.dst), 0);
    assert_int_equal(core_append(c, p2, 1, &c2), 0); /* parent: in place */
    assert_int_equal(c2.src, KVS_BLOCK_NONE);
    assert_int_equal(core_commit(c, k2, 6, (uint32_t[]){1}, 1, NULL), 0);
    assert_int_equal(core_append(c, k2, 1, &c2), 0); /* child: in place */
    assert_int_equal(c2.src, KVS_BLOCK_NONE);
    core_unpin(c, c1.src);
    core_unpin(c, c1.dst);
    core_req_free(c, k2);
    core_req_free(c, p2);
    check(c);
  }
  /* pins are refused on blocks nobody holds, and are bounded */
  uint32_t pinned[2];
  uint32_t nfound = 0;
  for (uint32_t b = 0; b < 8; b++) {
    assert_int_equal(core_block_get(c, b, &bi), 0);
    if (bi.pins)
      pinned[nfound++] = b;
    else
      assert_int_equal(core_pin(c, b), KVS_ESTATE);
  }
  assert_int_equal(nfound, 2);
  assert_int_equal(core_pin(c, 8), KVS_ERANGE);
  for (int i = 1; i < 255; i++)
    assert_int_equal(core_pin(c, pinned[0]), 0);
  assert_int_equal(core_pin(c, pinned[0]), KVS_ELIMIT);
  check(c);
  for (int i = 0; i < 255; i++)
    core_unpin(c, pinned[0]);
  core_unpin(c, pinned[1]);
  /* the shared block was partial (never sealed): both come back FREE */
  assert_int_equal(core_block_get(c, pinned[0], &bi), 0);
  assert_int_equal(bi.state, CORE_BLOCK_FREE);
  finish(c);
}

static void test_config_errors(void **state) {
  (void)state;
  core_config cfg;
  core *c;
  core_config_init(&cfg);
  cfg.num_blocks = 0;
  assert_int_equal(core_create(&cfg, &c), KVS_EINVAL);
  cfg.num_blocks = 8;
  cfg.policy = "nope";
  assert_int_equal(core_create(&cfg, &c), KVS_EINVAL);
  cfg.policy = NULL;
  cfg.reserve_blocks = 8;
  assert_int_equal(core_create(&cfg, &c), KVS_EINVAL);
  cfg.reserve_blocks = 0;
  cfg.block_size = 0;
  assert_int_equal(core_create(&cfg, &c), KVS_EINVAL);
  cfg.block_size = 16;
  assert_int_equal(core_create(&cfg, &c), 0);
  core_block_info bi;
  assert_int_equal(core_block_get(c, 8, &bi), KVS_ERANGE);
  assert_int_equal(core_block_get(c, 7, &bi), 0);
  assert_int_equal(bi.state, CORE_BLOCK_FREE);
  finish(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_share_prefix),
      cmocka_unit_test(test_last_token_never_cached),
      cmocka_unit_test(test_one_block_pool),
      cmocka_unit_test(test_nospace_changes_nothing),
      cmocka_unit_test(test_reserve_watermark),
      cmocka_unit_test(test_append_decode),
      cmocka_unit_test(test_commit_errors),
      cmocka_unit_test(test_fork_cow),
      cmocka_unit_test(test_fork_full_block_sealed_by_both),
      cmocka_unit_test(test_free_tail_first_eviction),
      cmocka_unit_test(test_lru_order),
      cmocka_unit_test(test_forced_collision_never_served),
      cmocka_unit_test(test_salt_isolation),
      cmocka_unit_test(test_root_per_dtype),
      cmocka_unit_test(test_reused_requests_start_clean),
      cmocka_unit_test(test_preempt_and_resume),
      cmocka_unit_test(test_pins),
      cmocka_unit_test(test_config_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
