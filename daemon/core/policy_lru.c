/*
 * policy_lru.c — least recently used.  A block released with its hash cached
 * goes to the tail (most recently used); a block with nothing worth keeping
 * goes to the head, so it is reused before any cached block.  Requests
 * release their blocks tail-first, so a chain's tail sits nearer the head
 * than its parents and is evicted first.
 */
#include "core_int.h"

static void lru_release(core *c, uint32_t b, int cached) {
  if (cached)
    pool_fq_push_tail(c, b);
  else
    pool_fq_push_head(c, b);
}

static void lru_hit(core *c, uint32_t b) {
  if (c->blocks[b].ref == 0)
    pool_fq_unlink(c, b);
}

static void lru_evict(core *c, uint32_t b) { pool_fq_unlink(c, b); }

const core_policy core_policy_lru = {
    .name = "lru",
    .release = lru_release,
    .hit = lru_hit,
    .evict = lru_evict,
};
