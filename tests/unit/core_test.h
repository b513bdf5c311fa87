/*
 * core_test.h — what the core's model tests share: a seeded xorshift
 * generator, the operation count (KVS_MODEL_OPS), the invariant check.
 * Include after <cmocka.h> and daemon/core/core.h.
 */
#ifndef KVS_TEST_CORE_TEST_H
#define KVS_TEST_CORE_TEST_H

#include <stdint.h>
#include <stdlib.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static inline uint32_t rnd(uint32_t n) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (uint32_t)(rng % n);
}

/* Operations per model run: KVS_MODEL_OPS, default 300,000. */
static inline uint64_t nops(void) {
  const char *env = getenv("KVS_MODEL_OPS");
  return env ? strtoull(env, NULL, 10) : 300000;
}

static inline int heq(kvs_hash128 a, kvs_hash128 b) {
  return a.lo == b.lo && a.hi == b.hi;
}

/* Fails the test with core_check's message. */
static inline void check(core *c) {
  char msg[256];
  if (core_check(c, msg, sizeof(msg)) != 0)
    fail_msg("invariant: %s", msg);
}

/* What a block or slot holds in the byte models: the hash its bytes stand
 * for, or this. */
static const kvs_hash128 MODEL_GARBAGE = {0xdeadbeefull, 0xfeedfaceull};

/* A prompt of 2..maxtok tokens: six stems, long shared prefixes (a small
 * alphabet early on). */
static inline uint32_t model_prompt(uint32_t *t, uint32_t maxtok,
                                    uint32_t bs) {
  uint32_t n = 2 + rnd(maxtok - 2), stem = rnd(6);
  for (uint32_t i = 0; i < n; i++)
    t[i] = i < 3 * bs ? 100 * stem + i : rnd(i < 6 * bs ? 2 : 5);
  return n;
}

/* The daemon's part of demotion move m in a byte model (dev[b]: what pool
 * block b holds; slots[t][s]: what slot s of tier t holds): its source
 * still holds the move's hash (a block being read is busy and never
 * reused), its destination gets those bytes, or garbage when !ok; then
 * core_tier_done. */
static inline void model_move_end(core *c, const core_move *m, int ok,
                                  const kvs_hash128 *dev,
                                  kvs_hash128 *const slots[CORE_TIERS]) {
  const kvs_hash128 *src;

  if (m->kind == CORE_MOVE_DOWN) {
    core_block_info bi;
    core_block_get(c, m->block, &bi);
    assert_true(bi.busy);
    src = &dev[m->block];
  } else {
    src = &slots[CORE_TIER_HOST][m->src_slot];
  }
  assert_true(heq(*src, m->hash));
  slots[m->tier][m->slot] = ok ? *src : MODEL_GARBAGE;
  core_tier_done(c, m, ok);
}

#endif
