/*
 * index.c — the prefix index: 128-bit block hash -> block, open addressing
 * with linear probing and backward-shift deletion (no tombstones, so probe
 * lengths stay short however long the daemon runs).
 */
#include <assert.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "core_int.h"

#define HIDX_HUGE (2u << 20)

int hidx_init(hidx *x, uint32_t max_entries) {
  uint64_t n = 16;
  while (n < 2 * (uint64_t)max_entries)
    n <<= 1;
  size_t bytes = n * sizeof(*x->slots);
  if (bytes >= HIDX_HUGE) {
    /* A big index is probed at random: on 2 MiB pages a probe costs one
     * cache miss instead of a cache miss and a TLB miss. */
    if (posix_memalign((void **)&x->slots, HIDX_HUGE, bytes) != 0)
      return KVS_ENOMEM;
    (void)madvise(x->slots, bytes, MADV_HUGEPAGE);
  } else if ((x->slots = malloc(bytes)) == NULL) {
    return KVS_ENOMEM;
  }
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
    if (h_eq(e->h, h))
      return e->b;
  }
}

void hidx_insert(hidx *x, kvs_hash128 h, uint32_t b) {
  uint64_t i = h.lo & x->mask;
  while (x->slots[i].b != KVS_BLOCK_NONE) {
    assert(!h_eq(x->slots[i].h, h));
    i = (i + 1) & x->mask;
  }
  x->slots[i].h = h;
  x->slots[i].b = b;
  x->count++;
}

void hidx_remove(hidx *x, kvs_hash128 h) {
  uint64_t i = h.lo & x->mask;
  while (!h_eq(x->slots[i].h, h) || x->slots[i].b == KVS_BLOCK_NONE) {
    assert(x->slots[i].b != KVS_BLOCK_NONE);
    i = (i + 1) & x->mask;
  }
  /* Backward shift: move later entries of the run into the hole when the
   * hole lies on their probe path. */
  uint64_t hole = i;
  for (uint64_t j = (i + 1) & x->mask; x->slots[j].b != KVS_BLOCK_NONE;
       j = (j + 1) & x->mask) {
    uint64_t home = x->slots[j].h.lo & x->mask;
    if (((j - home) & x->mask) >= ((j - hole) & x->mask)) {
      x->slots[hole] = x->slots[j];
      hole = j;
    }
  }
  x->slots[hole].b = KVS_BLOCK_NONE;
  x->count--;
}
