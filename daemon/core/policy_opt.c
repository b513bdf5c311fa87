/*
 * policy_opt.c — Belady's offline optimum, for the replayer only: evict the
 * block whose next use lies furthest in the future.  It needs the future,
 * which the caller gives block by block (core_policy_hint), so the daemon
 * never offers it; it is the ceiling the online policies are measured
 * against.
 *
 * The free queue holds, head to tail: blocks with no known next use (FREE
 * ones, and cached ones never used again), then cached blocks by next use,
 * furthest first.  Blocks with the same next use form a bucket, contiguous
 * on the queue; a two-level bitmap of non-empty buckets finds where a new
 * bucket goes in O(buckets / 4096).  Within a bucket, later releases go
 * nearer the tail: requests release their blocks tail-first, so a chain's
 * deeper blocks go first, as they must (a lookup stops at the first miss).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core_int.h"

#define NONE KVS_BLOCK_NONE
#define NEVER UINT32_MAX

enum { OPT_QUEUED = 1u << 0 }; /* blk.pol: in bucket qkey[b] */

typedef struct opt {
  uint32_t *hint;  /* next use given by core_policy_hint, NEVER unknown */
  uint32_t *qkey;  /* the bucket a queued block sits in */
  uint32_t *head, *tail; /* per bucket, NONE when empty */
  uint64_t *bits, *sum;  /* non-empty buckets; non-zero words of bits */
  uint32_t nkeys;        /* buckets allocated */
} opt;

static int opt_init(core *c) {
  opt *o = calloc(1, sizeof(*o));
  if (o == NULL)
    return KVS_ENOMEM;
  c->pol = o;
  o->hint = core_big_alloc((size_t)c->cfg.num_blocks * sizeof(*o->hint), 0);
  o->qkey = core_big_alloc((size_t)c->cfg.num_blocks * sizeof(*o->qkey), 0);
  if (o->hint == NULL || o->qkey == NULL)
    return KVS_ENOMEM;
  memset(o->hint, 0xff, (size_t)c->cfg.num_blocks * sizeof(*o->hint));
  return 0;
}

static void opt_destroy(core *c) {
  opt *o = c->pol;
  if (o == NULL)
    return;
  free(o->hint);
  free(o->qkey);
  free(o->head);
  free(o->tail);
  free(o->bits);
  free(o->sum);
  free(o);
  c->pol = NULL;
}

/* Room for bucket k: sizes grow by doubling, in multiples of 4096. */
static int opt_grow(opt *o, uint32_t k) {
  if (k < o->nkeys)
    return 0;
  uint64_t n = o->nkeys ? o->nkeys : 4096;
  while (n <= k)
    n *= 2;
  uint32_t *h = realloc(o->head, n * sizeof(*h));
  if (h != NULL)
    o->head = h;
  uint32_t *t = realloc(o->tail, n * sizeof(*t));
  if (t != NULL)
    o->tail = t;
  uint64_t *b = realloc(o->bits, n / 64 * sizeof(*b));
  if (b != NULL)
    o->bits = b;
  uint64_t *s = realloc(o->sum, n / 4096 * sizeof(*s));
  if (s != NULL)
    o->sum = s;
  if (h == NULL || t == NULL || b == NULL || s == NULL)
    return KVS_ENOMEM;
  memset(o->head + o->nkeys, 0xff, (n - o->nkeys) * sizeof(*h));
  memset(o->tail + o->nkeys, 0xff, (n - o->nkeys) * sizeof(*t));
  memset(o->bits + o->nkeys / 64, 0, (n - o->nkeys) / 64 * sizeof(*b));
  memset(o->sum + o->nkeys / 4096, 0, (n - o->nkeys) / 4096 * sizeof(*s));
  o->nkeys = (uint32_t)n;
  return 0;
}

static void bit_set(opt *o, uint32_t k) {
  o->bits[k / 64] |= 1ull << (k % 64);
  o->sum[k / 4096] |= 1ull << (k / 64 % 64);
}

static void bit_clear(opt *o, uint32_t k) {
  if ((o->bits[k / 64] &= ~(1ull << (k % 64))) == 0)
    o->sum[k / 4096] &= ~(1ull << (k / 64 % 64));
}

/* The largest non-empty bucket below k, or NEVER. */
static uint32_t bit_below(const opt *o, uint32_t k) {
  uint32_t w = k / 64;
  uint64_t m = o->bits[w] & ((1ull << (k % 64)) - 1);
  if (m != 0)
    return w * 64 + 63 - (uint32_t)__builtin_clzll(m);
  /* words below w, first in w's summary word, then whole summary words */
  uint32_t sw = w / 64;
  uint64_t sm = o->sum[sw] & ((1ull << (w % 64)) - 1);
  while (sm == 0) {
    if (sw == 0)
      return NEVER;
    sm = o->sum[--sw];
  }
  w = sw * 64 + 63 - (uint32_t)__builtin_clzll(sm);
  return w * 64 + 63 - (uint32_t)__builtin_clzll(o->bits[w]);
}

static void opt_unlink(core *c, opt *o, uint32_t b) {
  blk *x = &c->blocks[b];
  if (x->pol & OPT_QUEUED) {
    uint32_t k = o->qkey[b];
    int first = o->head[k] == b, last = o->tail[k] == b;
    if (first && last) {
      o->head[k] = o->tail[k] = NONE;
      bit_clear(o, k);
    } else if (first) {
      o->head[k] = x->next;
    } else if (last) {
      o->tail[k] = x->prev;
    }
    x->pol = 0;
  }
  pool_fq_unlink(c, b);
}

static void opt_release(core *c, uint32_t b, int cached) {
  opt *o = c->pol;
  uint32_t k = cached ? o->hint[b] : NEVER;
  if (k == NEVER || opt_grow(o, k) != 0) {
    /* never used again (or no memory to order it): evicted first */
    pool_fq_push_head(c, b);
    return;
  }
  if (o->head[k] != NONE) {
    pool_fq_insert_before(c, b, c->blocks[o->tail[k]].next);
    o->tail[k] = b;
  } else {
    uint32_t j = bit_below(o, k);
    pool_fq_insert_before(c, b, j == NEVER ? NONE : o->head[j]);
    o->head[k] = o->tail[k] = b;
    bit_set(o, k);
  }
  c->blocks[b].pol = OPT_QUEUED;
  o->qkey[b] = k;
}

static void opt_hit(core *c, uint32_t b) {
  if (c->blocks[b].ref == 0)
    opt_unlink(c, c->pol, b);
}

static void opt_evict(core *c, uint32_t b) {
  opt *o = c->pol;
  opt_unlink(c, o, b);
  o->hint[b] = NEVER;
}

static void opt_hint(core *c, uint32_t b, uint32_t value) {
  ((opt *)c->pol)->hint[b] = value;
}

static int opt_check(const core *c, char *msg, size_t msg_len) {
  const opt *o = c->pol;
  uint32_t prev = NONE, last = NEVER;
  int rc = 0;
  for (uint32_t b = c->fq_head; b != NONE; prev = b, b = c->blocks[b].next) {
    const blk *x = &c->blocks[b];
    if (!(x->pol & OPT_QUEUED)) {
      if (last != NEVER)
        CHECK_FAIL("opt: block %u with no next use after bucket %u", b, last);
      continue;
    }
    uint32_t k = o->qkey[b];
    if (!x->indexed)
      CHECK_FAIL("opt: FREE block %u in bucket %u", b, k);
    if (k != last) {
      if (last != NEVER && k > last)
        CHECK_FAIL("opt: bucket %u after bucket %u", k, last);
      if (o->head[k] != b || (prev != NONE && last != NEVER && o->tail[last] != prev))
        CHECK_FAIL("opt: bucket %u head/tail wrong at block %u", k, b);
      if (!(o->bits[k / 64] >> (k % 64) & 1) ||
          !(o->sum[k / 4096] >> (k / 64 % 64) & 1))
        CHECK_FAIL("opt: bucket %u not marked non-empty", k);
      last = k;
    }
  }
  if (last != NEVER && o->tail[last] != prev)
    CHECK_FAIL("opt: last bucket %u ends at %u, not %u", last, o->tail[last], prev);
out:
  return rc;
}

const core_policy core_policy_opt = {
    .name = "opt",
    .offline = 1,
    .init = opt_init,
    .destroy = opt_destroy,
    .release = opt_release,
    .hit = opt_hit,
    .evict = opt_evict,
    .hint = opt_hint,
    .check = opt_check,
};
