/*
 * policy_slru.c — segmented LRU with ghost admission.
 *
 * The free queue is cut in two, head to tail: FREE blocks and the cold
 * segment, then the hot segment (from `mark` to the tail).  A cached block
 * released for the first time since it was allocated is cold: it goes to
 * the end of the cold segment, before every hot block, so blocks that were
 * computed once and never asked for again are evicted before anything that
 * was reused.  A block that a lookup hit, or whose hash was evicted not long
 * ago (a ghost: its prefix was computed twice), is hot: it goes to the tail.
 * The hot segment holds at most hot_max blocks; past that its coldest block
 * becomes the newest cold one.  Within each segment the order is LRU, and
 * requests release their blocks tail-first, so chain tails go first.
 *
 * Ghosts are the hashes of the last `ghosts` evicted cached blocks, a FIFO
 * ring with a hash index beside it: memory in proportion to the pool.
 */
#include <stdio.h>
#include <stdlib.h>

#include "core_int.h"

#define NONE KVS_BLOCK_NONE

/* blk.pol */
enum {
  SLRU_SEEN = 1u << 0,   /* released cached at least once */
  SLRU_REUSED = 1u << 1, /* hit, or admitted from the ghosts */
  SLRU_HOT = 1u << 2,    /* in the hot segment of the queue */
};

/* The hot segment's share of the pool moves between SLRU_MIN_PCT and
 * SLRU_HOT_PCT percent (starting at the top); SLRU_GHOSTS ghosts per pool
 * block.  Chosen on the first halves of the two traces (docs/policies.md). */
#define SLRU_HOT_PCT 95
#define SLRU_MIN_PCT 5
#define SLRU_GHOSTS 4

typedef struct slru {
  uint32_t mark;    /* first hot block on the queue; NONE: none */
  uint32_t hot;     /* hot blocks on the queue */
  uint32_t hot_max;
  uint32_t hot_min, hot_cap; /* bounds of hot_max's adaptation */
  ghosts gh;         /* value 1: the block was hot (reused) */
} slru;

static int slru_init(core *c) {
  slru *s = calloc(1, sizeof(*s));
  if (s == NULL)
    return KVS_ENOMEM;
  c->pol = s;
  uint64_t nb = c->cfg.num_blocks;
  s->mark = NONE;
  s->hot_cap = (uint32_t)(nb * SLRU_HOT_PCT / 100);
  s->hot_min = (uint32_t)(nb * SLRU_MIN_PCT / 100);
  s->hot_max = s->hot_cap;
  ghosts_init(&s->gh, SLRU_GHOSTS * nb);
  return 0;
}

static void slru_destroy(core *c) {
  slru *s = c->pol;
  if (s == NULL)
    return;
  ghosts_destroy(&s->gh);
  free(s);
  c->pol = NULL;
}

/* Was h evicted lately?  A ghost found is spent, and moves the split: a
 * block evicted cold and needed again says the cold segment was too short,
 * one evicted hot says the hot segment was (as ARC adapts its target). */
static int ghost_take(slru *s, kvs_hash128 h) {
  uint16_t hot;
  uint32_t step, nhot, ncold;
  if (!ghosts_take(&s->gh, h, &hot))
    return 0;
  nhot = s->gh.nonzero;
  ncold = ghosts_live(&s->gh) - nhot;
  if (hot) {
    step = nhot ? ncold / nhot : ncold;
    uint64_t up = (uint64_t)s->hot_max + (step ? step : 1);
    s->hot_max = up < s->hot_cap ? (uint32_t)up : s->hot_cap;
  } else {
    step = ncold ? nhot / ncold : nhot;
    step = step ? step : 1;
    s->hot_max = s->hot_max - s->hot_min > step ? s->hot_max - step : s->hot_min;
  }
  return 1;
}

static void slru_unlink(core *c, slru *s, uint32_t b) {
  blk *x = &c->blocks[b];
  if (b == s->mark)
    s->mark = x->next;
  if (x->pol & SLRU_HOT) {
    x->pol &= (uint16_t)~SLRU_HOT;
    s->hot--;
  }
  pool_fq_unlink(c, b);
}

static void slru_release(core *c, uint32_t b, int cached) {
  slru *s = c->pol;
  blk *x = &c->blocks[b];
  if (!cached) {
    x->pol = 0;
    pool_fq_push_head(c, b);
    return;
  }
  if (!(x->pol & SLRU_SEEN)) {
    x->pol |= SLRU_SEEN;
    if (ghost_take(s, c->bhash[b]))
      x->pol |= SLRU_REUSED;
  }
  if (!(x->pol & SLRU_REUSED)) {
    pool_fq_insert_before(c, b, s->mark);
    return;
  }
  pool_fq_push_tail(c, b);
  x->pol |= SLRU_HOT;
  s->hot++;
  if (s->mark == NONE)
    s->mark = b;
  while (s->hot > s->hot_max) { /* the coldest hot block turns cold */
    blk *m = &c->blocks[s->mark];
    m->pol &= (uint16_t)~SLRU_HOT;
    s->hot--;
    s->mark = m->next;
  }
}

static void slru_hit(core *c, uint32_t b) {
  blk *x = &c->blocks[b];
  x->pol |= SLRU_REUSED;
  if (x->ref == 0)
    slru_unlink(c, c->pol, b);
}

static void slru_evict(core *c, uint32_t b) {
  slru *s = c->pol;
  slru_unlink(c, s, b);
  if (c->blocks[b].indexed)
    ghosts_add(&s->gh, c->bhash[b], !!(c->blocks[b].pol & SLRU_REUSED));
}

static int slru_check(const core *c, char *msg, size_t msg_len) {
  const slru *s = c->pol;
  uint32_t hot = 0, in_hot = 0;
  int rc = 0;
  for (uint32_t b = c->fq_head; b != NONE; b = c->blocks[b].next) {
    const blk *x = &c->blocks[b];
    in_hot |= b == s->mark;
    if (!!(x->pol & SLRU_HOT) != !!in_hot)
      CHECK_FAIL("slru: block %u %s the hot segment but marked %s", b,
                 in_hot ? "in" : "before", x->pol & SLRU_HOT ? "hot" : "cold");
    if ((x->pol & SLRU_HOT) && !(x->pol & SLRU_REUSED))
      CHECK_FAIL("slru: hot block %u was never reused", b);
    if (!x->indexed && x->pol != 0)
      CHECK_FAIL("slru: FREE block %u has policy bits %#x", b, x->pol);
    hot += in_hot;
  }
  if (s->mark != NONE && !in_hot)
    CHECK_FAIL("slru: mark %u is not on the queue", s->mark);
  if (s->hot_max < s->hot_min || s->hot_max > s->hot_cap)
    CHECK_FAIL("slru: hot_max %u outside [%u, %u]", s->hot_max, s->hot_min,
               s->hot_cap);
  if (hot != s->hot || hot > s->hot_max)
    CHECK_FAIL("slru: %u hot blocks, counted %u, at most %u", hot, s->hot,
               s->hot_max);
  rc = ghosts_check(&s->gh, msg, msg_len);
out:
  return rc;
}

const core_policy core_policy_slru = {
    .name = "slru",
    .init = slru_init,
    .destroy = slru_destroy,
    .release = slru_release,
    .hit = slru_hit,
    .evict = slru_evict,
    .check = slru_check,
};
