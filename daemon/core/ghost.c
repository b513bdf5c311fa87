/*
 * ghost.c — the hashes of recently evicted blocks, each with a small value
 * (what a policy remembers of it), in a FIFO ring with a hash index beside
 * it.  The ring and its index start small and double up to their maximum
 * as ghosts arrive, so a pool that never evicts pays nothing for them.
 */
#include <stdio.h>
#include <stdlib.h>

#include "core_int.h"

#define NONE KVS_BLOCK_NONE
#define GHOSTS_FIRST 1024u

void ghosts_init(ghosts *g, uint64_t max) {
  memset(g, 0, sizeof(*g));
  g->max = max == 0 ? 1 : max > UINT32_MAX / 4 ? UINT32_MAX / 4 : (uint32_t)max;
}

void ghosts_destroy(ghosts *g) {
  free(g->ring);
  free(g->val);
  if (g->cap)
    hidx_destroy(&g->idx);
  memset(g, 0, sizeof(*g));
}

/* Room for more before the ring wraps (it only wraps at max).  On no
 * memory the ring stays as it is and wraps early. */
static void ghosts_grow(ghosts *g) {
  uint32_t cap = g->cap ? g->cap * 2 : GHOSTS_FIRST;
  hidx idx;
  if (cap > g->max)
    cap = g->max;
  kvs_hash128 *ring = realloc(g->ring, (size_t)cap * sizeof(*ring));
  if (ring == NULL)
    return;
  g->ring = ring;
  uint16_t *val = realloc(g->val, (size_t)cap * sizeof(*val));
  if (val == NULL)
    return;
  g->val = val;
  /* Three slots a ghost (load <= 1/3, below the index's default 2/3): most
   * ghost probes are misses, and a miss reads the whole run. */
  if (hidx_init(&idx, cap * 2) != 0)
    return;
  for (uint32_t i = 0; i < g->filled; i++)
    if (hidx_find(&g->idx, g->ring[i]) == i)
      hidx_insert(&idx, g->ring[i], i);
  if (g->cap)
    hidx_destroy(&g->idx);
  g->idx = idx;
  g->cap = cap;
}

static void ghosts_forget(ghosts *g, kvs_hash128 h, uint32_t i) {
  hidx_remove(&g->idx, h);
  g->nonzero -= g->val[i] != 0;
}

void ghosts_add(ghosts *g, kvs_hash128 h, uint16_t v) {
  uint32_t i;
  if (g->filled == g->cap && g->cap < g->max)
    ghosts_grow(g);
  if (g->cap == 0)
    return;
  if (g->filled == g->cap) { /* full: the oldest goes */
    if (hidx_find(&g->idx, g->ring[g->pos]) == g->pos)
      ghosts_forget(g, g->ring[g->pos], g->pos);
  } else {
    g->pos = g->filled++;
  }
  if ((i = hidx_find(&g->idx, h)) != NONE)
    ghosts_forget(g, h, i);
  g->ring[g->pos] = h;
  g->val[g->pos] = v;
  g->nonzero += v != 0;
  hidx_insert(&g->idx, h, g->pos);
  g->pos = g->pos + 1 == g->cap ? 0 : g->pos + 1;
}

int ghosts_take(ghosts *g, kvs_hash128 h, uint16_t *v) {
  uint32_t i = g->cap ? hidx_find(&g->idx, h) : NONE;
  if (i == NONE)
    return 0;
  *v = g->val[i];
  ghosts_forget(g, h, i);
  return 1;
}

int ghosts_check(const ghosts *g, char *msg, size_t msg_len) {
  uint32_t live = 0, nonzero = 0;
  int rc = 0;
  for (uint32_t i = 0; i < g->filled; i++)
    if (hidx_find(&g->idx, g->ring[i]) == i) {
      live++;
      nonzero += g->val[i] != 0;
    }
  if (g->filled > g->cap || g->cap > g->max ||
      (g->cap && (live != g->idx.count || nonzero != g->nonzero)))
    CHECK_FAIL("ghosts: %u of %u filled (max %u), %u live but %u indexed, "
               "%u non-zero but %u counted",
               g->filled, g->cap, g->max, live, g->cap ? g->idx.count : 0,
               nonzero, g->nonzero);
out:
  return rc;
}
