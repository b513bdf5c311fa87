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

/* The smallest lo whose home slot is `home`. */
static uint64_t lo_for_home(const hidx *x, uint64_t home) {
  unsigned __int128 num = (unsigned __int128)home << 64;
  return (uint64_t)((num + x->nslots - 1) / x->nslots);
}

static void test_index_vs_naive(void **state) {
  (void)state;
  hidx x;
  kvs_hash128 keys[MAXE];
  uint32_t vals[MAXE], n = 0;
  assert_int_equal(hidx_init(&x, MAXE), 0);
  uint64_t slots = x.nslots;
  for (int op = 0; op < 200000; op++) {
    /* lo lands on one of 6 home slots around the end of the table (the
     * last 3 and the first 3), so runs wrap around; hi (within the 96 bits
     * a slot keeps) makes the key unique */
    uint64_t home = (slots - 3 + rnd(6)) % slots;
    kvs_hash128 k = {lo_for_home(&x, home) + rnd(4), rnd(300)};
    assert_int_equal(hidx_home(&x, k.lo), home);
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
    if (op % 1000 == 0) {
      uint64_t bad = 0;
      for (uint32_t i = 0; i < n; i++)
        assert_int_equal(hidx_find(&x, keys[i]), vals[i]);
      assert_int_equal(hidx_check(&x, &bad), 0);
    }
  }
  hidx_destroy(&x);
}

/* hidx_check finds an entry moved off its probe path and a wrong count. */
static void test_index_check_catches(void **state) {
  (void)state;
  hidx x;
  uint64_t bad = 0;
  assert_int_equal(hidx_init(&x, 64), 0);
  kvs_hash128 a = {lo_for_home(&x, 10), 1}, b = {lo_for_home(&x, 10), 2};
  hidx_insert(&x, a, 1);
  hidx_insert(&x, b, 2);
  assert_int_equal(hidx_check(&x, &bad), 0);
  assert_int_equal(x.slots[10].b, 1);
  assert_int_equal(x.slots[11].b, 2);
  /* b's entry one slot further, past an empty slot: unreachable */
  x.slots[12] = x.slots[11];
  x.slots[11].b = KVS_BLOCK_NONE;
  assert_int_equal(hidx_find(&x, b), KVS_BLOCK_NONE);
  assert_int_equal(hidx_check(&x, &bad), -1);
  assert_int_equal(bad, 12);
  x.slots[11] = x.slots[12];
  x.slots[12].b = KVS_BLOCK_NONE;
  assert_int_equal(hidx_check(&x, &bad), 0);
  /* an entry before its home slot */
  kvs_hash128 c = {lo_for_home(&x, 20), 3};
  hidx_insert(&x, c, 3);
  x.slots[19] = x.slots[20];
  x.slots[20].b = KVS_BLOCK_NONE;
  assert_int_equal(hidx_check(&x, &bad), -1);
  assert_int_equal(bad, 19);
  x.slots[20] = x.slots[19];
  x.slots[19].b = KVS_BLOCK_NONE;
  x.count++;
  assert_int_equal(hidx_check(&x, &bad), -1);
  assert_int_equal(bad, x.nslots);
  x.count--;
  assert_int_equal(hidx_check(&x, &bad), 0);
  hidx_destroy(&x);
}

/* core_check's index part: an index slot pointing at the wrong block, two
 * slots naming one block, an indexed block the index has lost, and an entry
 * off its probe path are each caught; put back, the check passes again. */
static void test_core_check_sees_index(void **state) {
  (void)state;
  core_config cfg;
  core *c;
  core_req *r;
  core_cow cow;
  uint32_t t[64], hit;
  char msg[256];
  core_config_init(&cfg);
  cfg.num_blocks = 32;
  cfg.block_size = 4;
  assert_int_equal(core_create(&cfg, &c), 0);
  for (uint32_t i = 0; i < 64; i++)
    t[i] = 1000 + i;
  assert_int_equal(core_req_create(c, NULL, 0, &r), 0);
  assert_int_equal(core_lookup(c, r, t, 64, &hit), 0);
  assert_int_equal(core_allocate(c, r, 64, &cow), 0);
  assert_int_equal(core_commit(c, r, 0, t, 64, NULL), 0);
  core_req_free(c, r); /* 16 cached blocks, 16 index entries */
  assert_int_equal(c->index.count, 16);
  assert_int_equal(core_check(c, msg, sizeof(msg)), 0);

  uint64_t s0 = 0, s1;
  while (c->index.slots[s0].b == KVS_BLOCK_NONE)
    s0++;
  for (s1 = s0 + 1; c->index.slots[s1].b == KVS_BLOCK_NONE; s1++)
    ;
  hidx_entry e0 = c->index.slots[s0], e1 = c->index.slots[s1];

  /* slot s0 names s1's block */
  c->index.slots[s0].b = e1.b;
  assert_int_not_equal(core_check(c, msg, sizeof(msg)), 0);
  assert_non_null(strstr(msg, "index slot"));
  c->index.slots[s0] = e0;
  assert_int_equal(core_check(c, msg, sizeof(msg)), 0);

  /* s1's entry replaced by a second copy of s0's, on s0's probe path (the
   * empty slot just after s0's run): the counts agree, every slot names an
   * indexed block holding its hash, and only the duplicate is wrong */
  hidx_remove(&c->index, c->bhash[e1.b]);
  uint64_t hole = s0;
  while (c->index.slots[hole].b != KVS_BLOCK_NONE)
    hole = (hole + 1) % c->index.nslots;
  c->index.slots[hole] = c->index.slots[s0];
  c->index.count++;
  assert_int_not_equal(core_check(c, msg, sizeof(msg)), 0);
  assert_non_null(strstr(msg, "another slot names"));
  c->index.slots[hole].b = KVS_BLOCK_NONE;
  c->index.count--;
  hidx_insert(&c->index, c->bhash[e1.b], e1.b);
  assert_int_equal(core_check(c, msg, sizeof(msg)), 0);

  /* the index loses s0's entry: an indexed block it cannot find (the
   * counts differ) */
  hidx_remove(&c->index, c->bhash[e0.b]);
  assert_int_not_equal(core_check(c, msg, sizeof(msg)), 0);
  hidx_insert(&c->index, c->bhash[e0.b], e0.b);
  assert_int_equal(core_check(c, msg, sizeof(msg)), 0);

  /* an entry moved off its probe path, to the empty slot just before its
   * home: every other part of the check still holds */
  int moved = 0;
  for (uint64_t i = 0; i < c->index.nslots && !moved; i++) {
    hidx_entry e = c->index.slots[i];
    if (e.b == KVS_BLOCK_NONE)
      continue;
    uint64_t home = hidx_home(&c->index, e.lo);
    uint64_t before = (home + c->index.nslots - 1) % c->index.nslots;
    if (c->index.slots[before].b != KVS_BLOCK_NONE)
      continue;
    hidx_remove(&c->index, c->bhash[e.b]);
    c->index.slots[before] = e;
    c->index.count++;
    assert_int_equal(hidx_find(&c->index, c->bhash[e.b]), KVS_BLOCK_NONE);
    assert_int_not_equal(core_check(c, msg, sizeof(msg)), 0);
    assert_non_null(strstr(msg, "not reachable"));
    c->index.slots[before].b = KVS_BLOCK_NONE;
    c->index.count--;
    hidx_insert(&c->index, c->bhash[e.b], e.b);
    moved = 1;
  }
  assert_true(moved);
  assert_int_equal(core_check(c, msg, sizeof(msg)), 0);

  /* a block's hash changed under its entry */
  c->bhash[e1.b].lo ^= 1;
  assert_int_not_equal(core_check(c, msg, sizeof(msg)), 0);
  c->bhash[e1.b].lo ^= 1;
  assert_int_equal(core_check(c, msg, sizeof(msg)), 0);
  core_destroy(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_index_vs_naive),
      cmocka_unit_test(test_index_check_catches),
      cmocka_unit_test(test_core_check_sees_index),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
