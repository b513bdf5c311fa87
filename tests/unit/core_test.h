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

#endif
