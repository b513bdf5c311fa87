/*
 * test_core_index.c — the prefix index (open addressing, backward-shift
 * deletion) against a naive array, with keys crowded onto few home slots so
 * that long probe runs, wrap-around and deletion in the middle of a run all
 * happen.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/core/core_int.h"

#define MAXE 200

static uint64_t rng = 12345;
static uint32_t rnd(uint32_t n) {
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)((rng >> 33) % n);
}

static void test_index_vs_naive(void **state) {
  (void)state;
  hidx x;
  kvs_hash128 keys[MAXE];
  uint32_t vals[MAXE], n = 0;
  assert_int_equal(hidx_init(&x, MAXE), 0);
  uint64_t slots = x.mask + 1;
  for (int op = 0; op < 200000; op++) {
    /* lo lands on one of 6 home slots near the end of the table, so runs
     * wrap around; hi (within the 96 bits a slot keeps) makes the key
     * unique */
    kvs_hash128 k = {slots - 3 + rnd(6) + slots * rnd(4), rnd(300)};
    uint32_t found = KVS_BLOCK_NONE;
    uint32_t at = 0;
    for (uint32_t i = 0; i < n; i++)
      if (keys[i].lo == k.lo && keys[i].hi == k.hi) {
        found = vals[i];
        at = i;
      }
    assert_int_equal(hidx_find(&x, k), found);
    if (found == KVS_BLOCK_NONE && n < MAXE && rnd(2)) {
      keys[n] = k;
      vals[n] = (uint32_t)op;
      hidx_insert(&x, k, (uint32_t)op);
      n++;
    } else if (found != KVS_BLOCK_NONE) {
      hidx_remove(&x, k);
      keys[at] = keys[n - 1];
      vals[at] = vals[n - 1];
      n--;
    }
    assert_int_equal(x.count, n);
    if (op % 1000 == 0)
      for (uint32_t i = 0; i < n; i++)
        assert_int_equal(hidx_find(&x, keys[i]), vals[i]);
  }
  hidx_destroy(&x);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_index_vs_naive),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
