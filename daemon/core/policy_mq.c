/*
 * policy_mq.c — multi-queue: frequency classes with aging, and a memory of
 * evicted blocks' frequencies (after Zhou, Philbin and Li, "The Multi-Queue
 * replacement algorithm for second level buffer caches", USENIX ATC 2001,
 * written for caches whose reuse distances are much longer than the cache:
 * a prefix cache's).
 *
 * A block's frequency counts the requests that used it: the one that
 * computed it and every lookup hit since.  A cached block sits in level
 * floor(log2(frequency)) (at most MQ_LEVELS - 1); the free queue holds, head
 * to tail, the FREE blocks, then level 0, level 1, ..., each level in LRU
 * order, so allocation still takes the head and the queue stays in eviction
 * order.  A block that has not been used for `life` block references drops
 * one level (its frequency halves): the head of each level is checked on
 * every release, and since a level's head is next to the tail of the level
 * below it on the queue, the move is a relabelling, not a relink.
 *
 * An evicted cached block leaves its hash and frequency behind (a ghost,
 * in a FIFO ring of `ghosts` entries with a hash index): a prefix computed
 * again comes back with the frequency it had, so blocks reused at distances
 * longer than the cache climb the levels all the same.
 *
 * Requests release their blocks tail-first, so within a level a chain's
 * deeper blocks are nearer the head and go first.  Every operation is O(1)
 * in the pool size (O(MQ_LEVELS) at worst).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core_int.h"

#define NONE KVS_BLOCK_NONE

/* Levels, life in block references per pool block (x10), ghosts per pool
 * block (docs/policies.md). */
#define MQ_LEVELS 8 /* at most 15: blk.pol keeps the level + 1 in 4 bits */
#define MQ_LIFE_X10 20 /* life = 2.0 x num_blocks references */
#define MQ_GHOSTS 8

/* blk.pol: bits 0-3 the level + 1 when queued as cached (0: FREE or not on
 * the queue); bits 4-15 the frequency (saturating). */
#define POL_LVL(p) ((p) & 0xfu)
#define POL_FREQ(p) ((uint32_t)(p) >> 4)
#define POL_MAKE(lvl1, f) ((uint16_t)((lvl1) | ((f) > 0xfff ? 0xfff : (f)) << 4))

typedef struct mq {
  uint32_t levels;
  uint64_t life;
  uint64_t now;          /* block references so far */
  uint32_t first[16];    /* head block of each level, NONE when empty */
  uint32_t *stamp;       /* per block: `now` at its last use (low 32 bits) */
  ghosts gh;             /* value: the frequency at eviction */
} mq;

static int mq_init(core *c) {
  mq *m = calloc(1, sizeof(*m));
  if (m == NULL)
    return KVS_ENOMEM;
  c->pol = m;
  m->levels = MQ_LEVELS;
  m->life = (uint64_t)c->cfg.num_blocks * MQ_LIFE_X10 / 10;
  if (m->life == 0)
    m->life = 1;
  if (m->life > UINT32_MAX / 2)
    m->life = UINT32_MAX / 2;
  for (int i = 0; i < 16; i++)
    m->first[i] = NONE;
  ghosts_init(&m->gh, (uint64_t)MQ_GHOSTS * c->cfg.num_blocks);
  m->stamp = core_big_alloc((size_t)c->cfg.num_blocks * sizeof(*m->stamp), 1);
  if (m->stamp == NULL)
    return KVS_ENOMEM;
  return 0;
}

static void mq_destroy(core *c) {
  mq *m = c->pol;
  if (m == NULL)
    return;
  ghosts_destroy(&m->gh);
  free(m->stamp);
  free(m);
  c->pol = NULL;
}

static uint32_t level_of(const mq *m, uint32_t freq) {
  uint32_t l = freq <= 1 ? 0 : 31 - (uint32_t)__builtin_clz(freq);
  return l < m->levels ? l : m->levels - 1;
}

static void mq_unlink(core *c, mq *m, uint32_t b) {
  blk *x = &c->blocks[b];
  uint32_t l1 = POL_LVL(x->pol);
  if (l1 != 0 && m->first[l1 - 1] == b) {
    uint32_t n = x->next;
    m->first[l1 - 1] =
        n != NONE && POL_LVL(c->blocks[n].pol) == l1 ? n : NONE;
  }
  x->pol = POL_MAKE(0, POL_FREQ(x->pol));
  pool_fq_unlink(c, b);
}

/* Levels whose head has not been used for `life` references drop it one
 * level: the head of level l is next to the tail of level l - 1. */
static void mq_age(core *c, mq *m) {
  for (uint32_t l = 1; l < m->levels; l++) {
    uint32_t b = m->first[l];
    if (b == NONE || (uint32_t)m->now - m->stamp[b] < m->life)
      continue;
    blk *x = &c->blocks[b];
    uint32_t n = x->next;
    m->first[l] = n != NONE && POL_LVL(c->blocks[n].pol) == l + 1 ? n : NONE;
    if (m->first[l - 1] == NONE)
      m->first[l - 1] = b;
    x->pol = POL_MAKE(l, POL_FREQ(x->pol) / 2 > 1u << (l - 1)
                             ? POL_FREQ(x->pol) / 2
                             : 1u << (l - 1));
    m->stamp[b] = (uint32_t)m->now;
  }
}

static void mq_release(core *c, uint32_t b, int cached) {
  mq *m = c->pol;
  blk *x = &c->blocks[b];
  if (!cached) {
    x->pol = 0;
    pool_fq_push_head(c, b);
    return;
  }
  uint32_t f = POL_FREQ(x->pol);
  if (f == 0) { /* computed by the request now releasing it */
    uint16_t g = 0;
    ghosts_take(&m->gh, c->bhash[b], &g);
    f = (uint32_t)g + 1;
    m->stamp[b] = (uint32_t)++m->now;
  }
  uint32_t l = level_of(m, f), at = NONE;
  for (uint32_t k = l + 1; k < m->levels && at == NONE; k++)
    at = m->first[k];
  pool_fq_insert_before(c, b, at);
  x->pol = POL_MAKE(l + 1, f);
  if (m->first[l] == NONE)
    m->first[l] = b;
  mq_age(c, m);
}

static void mq_hit(core *c, uint32_t b) {
  mq *m = c->pol;
  blk *x = &c->blocks[b];
  if (x->ref == 0)
    mq_unlink(c, m, b);
  x->pol = POL_MAKE(0, POL_FREQ(x->pol) + 1);
  m->stamp[b] = (uint32_t)++m->now;
}

static void mq_evict(core *c, uint32_t b) {
  mq *m = c->pol;
  uint32_t f = POL_FREQ(c->blocks[b].pol);
  mq_unlink(c, m, b);
  if (c->blocks[b].indexed)
    ghosts_add(&m->gh, c->bhash[b], (uint16_t)f);
}

static int mq_check(const core *c, char *msg, size_t msg_len) {
  const mq *m = c->pol;
  uint32_t prev_l1 = 0;
  int rc = 0;
  for (uint32_t b = c->fq_head; b != NONE; b = c->blocks[b].next) {
    const blk *x = &c->blocks[b];
    uint32_t l1 = POL_LVL(x->pol);
    if (!x->indexed && x->pol != 0)
      CHECK_FAIL("mq: FREE block %u has policy bits %#x", b, x->pol);
    if (x->indexed && (l1 == 0 || l1 > m->levels || POL_FREQ(x->pol) == 0))
      CHECK_FAIL("mq: cached block %u in level %u with frequency %u", b, l1,
                 POL_FREQ(x->pol));
    if (l1 < prev_l1)
      CHECK_FAIL("mq: block %u of level %u after level %u", b, l1, prev_l1);
    if (l1 != prev_l1 && m->first[l1 - 1] != b)
      CHECK_FAIL("mq: level %u starts at %u, recorded %u", l1 - 1, b,
                 m->first[l1 - 1]);
    prev_l1 = l1;
  }
  for (uint32_t l = 0; l < m->levels; l++) {
    uint32_t b = m->first[l];
    if (b != NONE && (!c->blocks[b].on_queue || POL_LVL(c->blocks[b].pol) != l + 1))
      CHECK_FAIL("mq: level %u head %u is not a queued block of it", l, b);
  }
  rc = ghosts_check(&m->gh, msg, msg_len);
out:
  return rc;
}

const core_policy core_policy_mq = {
    .name = "mq",
    .init = mq_init,
    .destroy = mq_destroy,
    .release = mq_release,
    .hit = mq_hit,
    .evict = mq_evict,
    .check = mq_check,
};
