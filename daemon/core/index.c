/*
 * index.c — the prefix index: 128-bit block hash -> block, open addressing
 * with linear probing and backward-shift deletion (no tombstones, so probe
 * lengths stay short however long the daemon runs).
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core_int.h"

#define HUGE_PAGE (2u << 20)

void *core_big_alloc(size_t bytes, int zero) {
  void *p;

  if (bytes < HUGE_PAGE)
    return zero ? calloc(1, bytes ? bytes : 1) : malloc(bytes ? bytes : 1);
  /* Arrays indexed by block or hash are touched at random: on 2 MiB pages
   * an access costs one cache miss instead of a cache miss and a TLB miss,
   * and filling them takes 512 times fewer page faults. */
  if (posix_memalign(&p, HUGE_PAGE, bytes) != 0)
    return NULL;
  (void)madvise(p, bytes, MADV_HUGEPAGE);
  if (zero)
    memset(p, 0, bytes);
  return p;
}

int hidx_init(hidx *x, uint32_t max_entries) {
  /* 1.5 slots an entry, rounded up to whole cache lines (four slots). */
  uint64_t n = ((uint64_t)max_entries * 3 / 2 + 4 + 3) & ~(uint64_t)3;
  x->slots = core_big_alloc(n * sizeof(*x->slots), 0);
  if (x->slots == NULL)
    return KVS_ENOMEM;
  for (uint64_t i = 0; i < n; i++)
    x->slots[i].b = KVS_BLOCK_NONE;
  x->nslots = n;
  x->count = 0;
  return 0;
}

void hidx_destroy(hidx *x) {
  free(x->slots);
  x->slots = NULL;
}

static inline uint64_t hidx_next(const hidx *x, uint64_t i) {
  return i + 1 == x->nslots ? 0 : i + 1;
}

/* How far slot i lies past slot home along the probe path. */
static inline uint64_t hidx_dist(const hidx *x, uint64_t home, uint64_t i) {
  return i >= home ? i - home : i + x->nslots - home;
}

uint32_t hidx_find(const hidx *x, kvs_hash128 h) {
  for (uint64_t i = hidx_home(x, h.lo);; i = hidx_next(x, i)) {
    const hidx_entry *e = &x->slots[i];
    if (e->b == KVS_BLOCK_NONE)
      return KVS_BLOCK_NONE;
    if (hidx_is(e, h))
      return e->b;
  }
}

void hidx_insert(hidx *x, kvs_hash128 h, uint32_t b) {
  uint64_t i = hidx_home(x, h.lo);
  while (x->slots[i].b != KVS_BLOCK_NONE) {
    assert(!hidx_is(&x->slots[i], h));
    i = hidx_next(x, i);
  }
  x->slots[i].lo = h.lo;
  x->slots[i].hi = (uint32_t)h.hi;
  x->slots[i].b = b;
  x->count++;
}

void hidx_remove(hidx *x, kvs_hash128 h) {
  uint64_t i = hidx_home(x, h.lo);
  while (!hidx_is(&x->slots[i], h) || x->slots[i].b == KVS_BLOCK_NONE) {
    assert(x->slots[i].b != KVS_BLOCK_NONE);
    i = hidx_next(x, i);
  }
  /* Backward shift: move later entries of the run into the hole when the
   * hole lies on their probe path. */
  uint64_t hole = i;
  for (uint64_t j = hidx_next(x, i); x->slots[j].b != KVS_BLOCK_NONE;
       j = hidx_next(x, j)) {
    uint64_t home = hidx_home(x, x->slots[j].lo);
    if (hidx_dist(x, home, j) >= hidx_dist(x, hole, j)) {
      x->slots[hole] = x->slots[j];
      hole = j;
    }
  }
  x->slots[hole].b = KVS_BLOCK_NONE;
  x->count--;
}

int hidx_check(const hidx *x, uint64_t *bad) {
  uint64_t n = x->nslots, start = n, count = 0;

  /* Every entry must be reachable from its home: no empty slot between
   * them.  Start the walk just after an empty slot (the table is never
   * full), so each run of occupied slots is seen whole. */
  for (uint64_t i = 0; i < n; i++)
    if (x->slots[i].b == KVS_BLOCK_NONE) {
      start = i;
      break;
    }
  if (start == n) {
    *bad = 0;
    return -1;
  }
  uint64_t run = start; /* the empty slot before the current run */
  for (uint64_t k = 1, i = start; k <= n; k++) {
    i = hidx_next(x, i);
    const hidx_entry *e = &x->slots[i];
    if (e->b == KVS_BLOCK_NONE) {
      run = i;
      continue;
    }
    count++;
    /* the home must lie within the run: after the empty slot, at or before i */
    uint64_t home = hidx_home(x, e->lo);
    if (hidx_dist(x, home, i) >= hidx_dist(x, run, i)) {
      *bad = i;
      return -1;
    }
  }
  if (count != x->count) {
    *bad = n;
    return -1;
  }
  return 0;
}
