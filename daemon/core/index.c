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
  uint64_t n = 16;
  while (n < 2 * (uint64_t)max_entries)
    n <<= 1;
  x->slots = core_big_alloc(n * sizeof(*x->slots), 0);
  if (x->slots == NULL)
    return KVS_ENOMEM;
  for (uint64_t i = 0; i < n; i++)
    x->slots[i].b = KVS_BLOCK_NONE;
  x->mask = n - 1;
  x->count = 0;
  return 0;
}

void hidx_destroy(hidx *x) {
  free(x->slots);
  x->slots = NULL;
}

uint32_t hidx_find(const hidx *x, kvs_hash128 h) {
  for (uint64_t i = h.lo & x->mask;; i = (i + 1) & x->mask) {
    const hidx_entry *e = &x->slots[i];
    if (e->b == KVS_BLOCK_NONE)
      return KVS_BLOCK_NONE;
    if (hidx_is(e, h))
      return e->b;
  }
}

void hidx_insert(hidx *x, kvs_hash128 h, uint32_t b) {
  uint64_t i = h.lo & x->mask;
  while (x->slots[i].b != KVS_BLOCK_NONE) {
    assert(!hidx_is(&x->slots[i], h));
    i = (i + 1) & x->mask;
  }
  x->slots[i].lo = h.lo;
  x->slots[i].hi = (uint32_t)h.hi;
  x->slots[i].b = b;
  x->count++;
}

void hidx_remove(hidx *x, kvs_hash128 h) {
  uint64_t i = h.lo & x->mask;
  while (!hidx_is(&x->slots[i], h) || x->slots[i].b == KVS_BLOCK_NONE) {
    assert(x->slots[i].b != KVS_BLOCK_NONE);
    i = (i + 1) & x->mask;
  }
  /* Backward shift: move later entries of the run into the hole when the
   * hole lies on their probe path. */
  uint64_t hole = i;
  for (uint64_t j = (i + 1) & x->mask; x->slots[j].b != KVS_BLOCK_NONE;
       j = (j + 1) & x->mask) {
    uint64_t home = x->slots[j].lo & x->mask;
    if (((j - home) & x->mask) >= ((j - hole) & x->mask)) {
      x->slots[hole] = x->slots[j];
      hole = j;
    }
  }
  x->slots[hole].b = KVS_BLOCK_NONE;
  x->count--;
}
