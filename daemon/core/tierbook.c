/*
 * tierbook.c — the books of the tiers below the device pool (core.h, "Lower
 * tiers"): entries by hash, slots and an LRU per tier, the demotions to
 * start, the eviction of a block with no copy below.  No I/O: the daemon
 * moves the bytes and reports back; the replayer (tier_sync) has them
 * "moved" at once.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core_int.h"

#define NONE KVS_BLOCK_NONE
/* LRU entries looked at for one slot before giving up (busy ones are
 * skipped). */
#define SCAN_MAX 64

/* ---- entries ------------------------------------------------------------ */

uint32_t tierbook_find(const core *c, kvs_hash128 h) {
  return c->ntents ? hidx_find(&c->tindex, h) : NONE;
}

const uint32_t *tierbook_tokens(const core *c, uint32_t e) {
  return c->ttok ? c->ttok + (size_t)e * c->cfg.block_size : NULL;
}

uint32_t tierbook_ent_new(core *c, kvs_hash128 h, const uint32_t *tokens,
                      int priv) {
  uint32_t e = c->tent_free;
  tent *x;

  assert(e != NONE);
  x = &c->tents[e];
  c->tent_free = x->next[0];
  memset(x, 0, sizeof(*x));
  x->h = h;
  x->used = 1;
  x->priv = (uint8_t)(priv != 0);
  for (int t = 0; t < CORE_TIERS; t++)
    x->slot[t] = x->prev[t] = x->next[t] = NONE;
  if (c->ttok && tokens)
    memcpy(c->ttok + (size_t)e * c->cfg.block_size, tokens,
           (size_t)c->cfg.block_size * sizeof(uint32_t));
  if (!priv)
    hidx_insert(&c->tindex, h, e);
  return e;
}

/* An entry with no slot left is forgotten. */
static void ent_maybe_free(core *c, uint32_t e) {
  tent *x = &c->tents[e];

  if (x->slot[CORE_TIER_HOST] != NONE || x->slot[CORE_TIER_DISK] != NONE ||
      x->hold)
    return;
  assert(x->busy == 0);
  if (!x->priv)
    hidx_remove(&c->tindex, x->h);
  x->used = 0;
  x->next[0] = c->tent_free;
  c->tent_free = e;
}

/* Entry e's copy in tier t is readable (v 1) or not: the observers hear
 * of each change (not of a swapped request's own copy). */
void tierbook_valid(core *c, uint32_t e, int t, int v) {
  tent *x = &c->tents[e];

  if (x->valid[t] == (uint8_t)v)
    return;
  x->valid[t] = (uint8_t)v;
  if (__builtin_expect(c->nobs != 0, 0) && !x->priv)
    obs_tier(c, x->h, t, v);
}

void core_remote_stored(core *c, kvs_hash128 h) {
  if (c->nobs != 0)
    obs_tier(c, h, CORE_TIER_REMOTE, 1);
}

int core_tier_holds(const core *c, kvs_hash128 h) {
  uint32_t e = tierbook_find(c, h);

  return e != NONE && (c->tents[e].valid[CORE_TIER_HOST] ||
                       c->tents[e].valid[CORE_TIER_DISK]);
}

void core_tier_each(const core *c, void (*fn)(void *arg, kvs_hash128 h, int t),
                    void *arg) {
  for (uint32_t e = 0; e < c->ntents; e++)
    for (int t = 0; t < CORE_TIERS; t++)
      if (c->tents[e].used && !c->tents[e].priv &&
          c->tents[e].slot[t] != NONE && c->tents[e].valid[t])
        fn(arg, c->tents[e].h, t);
}

/* ---- slots and LRU ---------------------------------------------------------- */

static void lru_unlink(core *c, int t, uint32_t e) {
  tier *q = &c->tiers[t];
  tent *x = &c->tents[e];

  if (x->prev[t] != NONE)
    c->tents[x->prev[t]].next[t] = x->next[t];
  else
    q->head = x->next[t];
  if (x->next[t] != NONE)
    c->tents[x->next[t]].prev[t] = x->prev[t];
  else
    q->tail = x->prev[t];
  x->prev[t] = x->next[t] = NONE;
}

static void lru_push_tail(core *c, int t, uint32_t e) {
  tier *q = &c->tiers[t];
  tent *x = &c->tents[e];

  x->next[t] = NONE;
  x->prev[t] = q->tail;
  if (q->tail != NONE)
    c->tents[q->tail].next[t] = e;
  else
    q->head = e;
  q->tail = e;
}

/* Entry e gets slot s of tier t (valid: the bytes are there already). */
void tierbook_slot_give(core *c, int t, uint32_t e, uint32_t s, int valid) {
  tent *x = &c->tents[e];

  x->slot[t] = s;
  x->valid[t] = 0;
  tierbook_valid(c, e, t, valid);
  lru_push_tail(c, t, e);
  c->tiers[t].st.used++;
}

/* Slot s of tier t goes back unused. */
static void slot_put(core *c, int t, uint32_t s) {
  c->tiers[t].free_slots[c->tiers[t].nfree++] = s;
}

/* Entry e loses its copy in tier t; forgotten when it was the last. */
static void tierbook_drop(core *c, uint32_t e, int t) {
  tier *q = &c->tiers[t];
  tent *x = &c->tents[e];

  assert(x->slot[t] != NONE);
  if (x->hold)
    q->st.held--;
  else
    lru_unlink(c, t, e);
  q->free_slots[q->nfree++] = x->slot[t];
  q->st.used--;
  tierbook_valid(c, e, t, 0);
  x->slot[t] = NONE;
  ent_maybe_free(c, e);
}

void tierbook_forget(core *c, uint32_t e, int t) {
  tent *x = &c->tents[e];

  tierbook_valid(c, e, t, 0);
  if (x->busy)
    x->bad |= (uint8_t)(1u << t);
  else
    tierbook_drop(c, e, t);
}

void tierbook_touch(core *c, uint32_t e, int t) {
  if (c->tents[e].slot[t] == NONE || c->tents[e].hold)
    return;
  lru_unlink(c, t, e);
  lru_push_tail(c, t, e);
}

void tierbook_cold(core *c, uint32_t e, int t) {
  tier *q = &c->tiers[t];
  tent *x = &c->tents[e];

  if (x->slot[t] == NONE || x->hold || q->head == e)
    return;
  lru_unlink(c, t, e);
  x->prev[t] = NONE;
  x->next[t] = q->head;
  c->tents[q->head].prev[t] = e;
  q->head = e;
}

void tierbook_busy(core *c, uint32_t e, int delta) {
  tent *x = &c->tents[e];

  x->busy = (uint16_t)(x->busy + delta);
  if (x->busy == 0 && x->bad) {
    uint8_t bad = x->bad;

    x->bad = 0;
    if ((bad & 2) && x->slot[CORE_TIER_DISK] != NONE)
      tierbook_drop(c, e, CORE_TIER_DISK); /* may free the entry: host last */
    if ((bad & 1) && x->used && x->slot[CORE_TIER_HOST] != NONE)
      tierbook_drop(c, e, CORE_TIER_HOST);
  }
}

/*
 * A free slot of tier t, making room if need be by dropping the least
 * recently used entry that is not busy.  In the host tier an entry that the
 * disk tier does not hold yet goes to disk first: with tier_sync at once;
 * otherwise a HOST_TO_DISK move is written to *pend (when not NULL), and
 * NONE is returned with *blocked set: the slot frees up once it is done.
 */
static uint32_t slot_take(core *c, int t, core_move *pend, int *blocked) {
  tier *q = &c->tiers[t];
  int scanned = 0;

  if (blocked)
    *blocked = 0;
  if (q->nfree)
    return q->free_slots[--q->nfree];
  if (t == CORE_TIER_HOST && !c->cfg.tier_sync) {
    /* The daemon: first an entry that can go at once (on disk already, or
     * held by the device), skipping those still being written. */
    for (uint32_t e = q->head; e != NONE && scanned < SCAN_MAX;
         e = c->tents[e].next[t], scanned++) {
      tent *x = &c->tents[e];
      uint32_t s = x->slot[t];

      if (x->busy || !((x->slot[CORE_TIER_DISK] != NONE &&
                        x->valid[CORE_TIER_DISK]) ||
                       hidx_find(&c->index, x->h) != NONE))
        continue;
      q->st.drops += x->slot[CORE_TIER_DISK] == NONE;
      tierbook_drop(c, e, t);
      q->nfree--;
      return s;
    }
    scanned = 0;
  }
  for (uint32_t e = q->head; e != NONE && scanned < SCAN_MAX;
       e = c->tents[e].next[t], scanned++) {
    tent *x = &c->tents[e];

    if (x->busy)
      continue;
    /* A copy of a block the device holds goes free: the device's eviction
     * copies it down again.  Any other goes to disk first. */
    if (t == CORE_TIER_HOST && c->tiers[CORE_TIER_DISK].nslots &&
        x->slot[CORE_TIER_DISK] == NONE &&
        hidx_find(&c->index, x->h) == NONE) {
      /* Write it to disk before its host slot goes. */
      uint32_t d = slot_take(c, CORE_TIER_DISK, NULL, NULL);

      if (d == NONE)
        return NONE;
      if (c->cfg.tier_sync) {
        uint32_t s = x->slot[t];

        tierbook_slot_give(c, CORE_TIER_DISK, e, d, 1);
        c->tiers[CORE_TIER_DISK].st.demotions++;
        tierbook_drop(c, e, t); /* moved down, not dropped */
        q->nfree--;
        return s;
      } else {
        if (!pend) { /* (cannot happen: the disk tier is not the host's) */
          c->tiers[CORE_TIER_DISK].free_slots[c->tiers[CORE_TIER_DISK].nfree++] = d;
          return NONE;
        }
        tierbook_slot_give(c, CORE_TIER_DISK, e, d, 0);
        x->busy++;
        pend->kind = CORE_MOVE_HOST_TO_DISK;
        pend->tier = CORE_TIER_DISK;
        pend->block = NONE;
        pend->entry = e;
        pend->slot = d;
        pend->src_slot = x->slot[CORE_TIER_HOST];
        pend->hash = x->h;
        if (blocked)
          *blocked = 1;
        return NONE;
      }
    }
    /* Its copy here can go: it lives on below, or nowhere else to keep it. */
    uint32_t s = x->slot[t];

    q->st.drops++;
    tierbook_drop(c, e, t);
    q->nfree--; /* tier_drop pushed s; take it back */
    return s;
  }
  return NONE;
}

/* slot_take for a new entry: NONE (the slot given back) when no entry is
 * free, which happens only when held copies lost their slots. */
static uint32_t slot_take_new(core *c, int t, core_move *pend, int *blocked) {
  uint32_t s = slot_take(c, t, pend, blocked);

  if (s != NONE && c->tent_free == NONE) {
    slot_put(c, t, s);
    s = NONE;
  }
  return s;
}

uint32_t tierbook_slot_take(core *c, int t) {
  return slot_take_new(c, t, NULL, NULL);
}

/* ---- holds (swap) ---------------------------------------------------------- */

int tierbook_hold(core *c, uint32_t e) {
  tent *x = &c->tents[e];

  if (x->hold == UINT16_MAX)
    return KVS_ELIMIT;
  if (x->hold++ == 0)
    for (int t = 0; t < CORE_TIERS; t++)
      if (x->slot[t] != NONE) {
        lru_unlink(c, t, e);
        c->tiers[t].st.held++;
      }
  return 0;
}

void tierbook_unhold(core *c, uint32_t e) {
  tent *x = &c->tents[e];

  assert(x->hold > 0);
  if (--x->hold > 0)
    return;
  for (int t = 0; t < CORE_TIERS; t++) {
    tier *q = &c->tiers[t];

    if (x->slot[t] == NONE)
      continue;
    q->st.held--;
    /* The cold end: the device holds the block again, or nobody does. */
    x->prev[t] = NONE;
    x->next[t] = q->head;
    if (q->head != NONE)
      c->tents[q->head].prev[t] = e;
    else
      q->tail = e;
    q->head = e;
  }
  if (x->priv) { /* nobody else can find it */
    uint8_t had = (uint8_t)((x->slot[CORE_TIER_HOST] != NONE) |
                            (x->slot[CORE_TIER_DISK] != NONE) << 1);
    if (had & 2)
      tierbook_forget(c, e, CORE_TIER_DISK);
    if ((had & 1) && x->used && x->slot[CORE_TIER_HOST] != NONE)
      tierbook_forget(c, e, CORE_TIER_HOST);
  }
  if (x->used)
    ent_maybe_free(c, e); /* no copy left (went bad while held) */
}

/* ---- fills (promotion, swap-in) ------------------------------------------- */

uint32_t tierbook_fills_end(core *c, const core_promo *p, uint32_t n,
                        const int *ok) {
  uint32_t bad = n;

  for (uint32_t i = 0; i < n; i++) {
    if (p[i].tier == CORE_TIER_REMOTE) { /* no books here: only a miss */
      if ((ok == NULL || !ok[i]) && bad == n)
        bad = i;
      continue;
    }
    if (ok != NULL && ok[i]) {
      c->tiers[p[i].tier].st.promotions++;
      tierbook_cold(c, p[i].entry, (int)p[i].tier);
    } else {
      if (ok != NULL) { /* its bytes there are bad or unreadable: never
                           again (ok NULL: nothing was tried; they stay) */
        c->tiers[p[i].tier].st.failures++;
        tierbook_forget(c, p[i].entry, (int)p[i].tier);
      }
      if (bad == n)
        bad = i;
    }
    tierbook_busy(c, p[i].entry, -1);
  }
  /* Good sealed blocks up to the first failure join the prefix index (a
   * hash someone indexed meanwhile stays theirs: this copy stays private). */
  for (uint32_t i = 0; i < bad; i++) {
    blk *x = &c->blocks[p[i].block];

    if (x->sealed && hidx_find(&c->index, p[i].hash) == NONE) {
      hidx_insert(&c->index, p[i].hash, p[i].block);
      x->indexed = 1;
      obs_stored(c, p[i].hash, p[i].pos ? &p[i].parent : NULL,
                 btok(c, p[i].block));
    }
  }
  return bad;
}

/* ---- demotion ----------------------------------------------------------- */

/* Does hash h have a copy below (or one being written)? */
static int has_copy_below(const core *c, kvs_hash128 h) {
  uint32_t e = tierbook_find(c, h);

  return e != NONE;
}

int tierbook_first(const core *c) {
  return c->tiers[CORE_TIER_HOST].nslots ? CORE_TIER_HOST : CORE_TIER_DISK;
}

/* Host entries at the cold end of the host tier with no copy on disk are
 * written there ahead of need, so that the host tier always has entries it
 * can drop at once. */
static uint32_t plan_host_to_disk(core *c, core_move *mv, uint32_t max) {
  tier *q = &c->tiers[CORE_TIER_HOST];
  uint32_t n = 0, seen = 0;

  for (uint32_t e = q->head; e != NONE && seen < c->cfg.tier_window && n < max;
       e = c->tents[e].next[CORE_TIER_HOST], seen++) {
    tent *x = &c->tents[e];
    uint32_t d;

    if (x->busy || x->slot[CORE_TIER_DISK] != NONE ||
        !x->valid[CORE_TIER_HOST] || hidx_find(&c->index, x->h) != NONE)
      continue;
    d = slot_take(c, CORE_TIER_DISK, NULL, NULL);
    if (d == NONE)
      break;
    tierbook_slot_give(c, CORE_TIER_DISK, e, d, 0);
    x->busy++;
    mv[n].kind = CORE_MOVE_HOST_TO_DISK;
    mv[n].tier = CORE_TIER_DISK;
    mv[n].block = NONE;
    mv[n].entry = e;
    mv[n].slot = d;
    mv[n].src_slot = x->slot[CORE_TIER_HOST];
    mv[n].hash = x->h;
    n++;
  }
  return n;
}

uint32_t core_tier_plan(core *c, core_move *mv, uint32_t max) {
  const int t = tierbook_first(c);
  uint32_t n = 0, seen = 0;

  if (!tierbook_any(c) || c->cfg.tier_sync)
    return 0;
  if (c->tiers[CORE_TIER_HOST].nslots && c->tiers[CORE_TIER_DISK].nslots)
    n = plan_host_to_disk(c, mv, max / 2);
  /* The window bounds the blocks being copied down, wherever they are: a
   * lookup that hits one takes it off the queue's cold end, and when it is
   * released at the warm end the window would otherwise start copies of
   * the blocks now at the cold end, and so on until every free block is
   * busy with a slow tier's writes and allocation refused. */
  for (uint32_t b = c->fq_head; b != NONE && seen < c->cfg.tier_window &&
                                n < max && c->ndown < c->cfg.tier_window;
       b = c->blocks[b].next, seen++) {
    blk *x = &c->blocks[b];
    uint32_t e, s;
    int blocked;

    if (!x->indexed || x->busy || has_copy_below(c, c->bhash[b]))
      continue;
    s = slot_take_new(c, t, &mv[n], &blocked);
    if (s == NONE) {
      n += (uint32_t)blocked; /* a host entry goes to disk first */
      if (!blocked)
        break;
      continue;
    }
    e = tierbook_ent_new(c, c->bhash[b], btok(c, b), 0);
    tierbook_slot_give(c, t, e, s, 0);
    c->tents[e].busy++;
    x->busy = 1;
    c->nbusy++;
    c->ndown++;
    mv[n].kind = CORE_MOVE_DOWN;
    mv[n].tier = (uint32_t)t;
    mv[n].block = b;
    mv[n].entry = e;
    mv[n].slot = s;
    mv[n].src_slot = NONE;
    mv[n].hash = c->bhash[b];
    n++;
  }
  return n;
}

void core_tier_done(core *c, const core_move *m, int ok) {
  tent *x = &c->tents[m->entry];
  tier *q = &c->tiers[m->tier];

  assert(x->used && x->busy > 0 && x->slot[m->tier] == m->slot);
  if (m->kind == CORE_MOVE_DOWN) {
    blk *b = &c->blocks[m->block];

    assert(b->busy && c->ndown > 0);
    b->busy = 0;
    c->nbusy -= b->on_queue;
    c->ndown--;
  }
  if (ok) {
    tierbook_valid(c, m->entry, (int)m->tier, 1);
    q->st.demotions++;
    /* (A host copy now also on disk stays until the host tier needs its
     * slot: slot_take drops it at once then.) */
  } else {
    q->st.failures++;
    tierbook_forget(c, m->entry, (int)m->tier);
  }
  tierbook_busy(c, m->entry, -1);
}

void tierbook_on_evict(core *c, uint32_t b) {
  uint32_t s, e;
  int t;

  if (!tierbook_any(c))
    return;
  e = tierbook_find(c, c->bhash[b]);
  if (e != NONE) {
    /* Its copy below is the only one now: recently used. */
    tierbook_touch(c, e, c->tents[e].slot[CORE_TIER_HOST] != NONE ? CORE_TIER_HOST
                                                              : CORE_TIER_DISK);
    return;
  }
  if (!c->cfg.tier_sync) {
    c->st.tier_lost++;
    return;
  }
  /* An ideal write-back: down at once. */
  t = tierbook_first(c);
  s = slot_take_new(c, t, NULL, NULL);
  if (s == NONE) {
    c->st.tier_lost++;
    return;
  }
  e = tierbook_ent_new(c, c->bhash[b], btok(c, b), 0);
  tierbook_slot_give(c, t, e, s, 1);
  c->tiers[t].st.demotions++;
}

/* ---- restart ------------------------------------------------------------- */

int core_tier_entry(const core *c, uint32_t entry, const uint32_t **tokens) {
  const tent *x = &c->tents[entry];

  assert(entry < c->ntents && x->used);
  *tokens = tierbook_tokens(c, entry);
  return !x->priv;
}

int core_tier_restore_begin(core *c, int t) {
  tier *q;

  if (t < 0 || t >= CORE_TIERS || c->restoring || !c->tiers[t].nslots)
    return KVS_EINVAL;
  q = &c->tiers[t];
  for (int u = 0; u < CORE_TIERS; u++)
    if (c->tiers[u].st.used)
      return KVS_ESTATE;
  c->rgen = calloc(c->ntents, sizeof(*c->rgen));
  c->rtaken = calloc(q->nslots, 1);
  if (!c->rgen || !c->rtaken) {
    free(c->rgen);
    free(c->rtaken);
    c->rgen = NULL;
    c->rtaken = NULL;
    return KVS_ENOMEM;
  }
  c->restoring = t + 1;
  return 0;
}

int core_tier_restore(core *c, uint32_t slot, uint64_t gen, kvs_hash128 h,
                      const uint32_t *tokens) {
  const int t = c->restoring - 1;
  uint32_t e;

  if (!c->restoring)
    return KVS_ESTATE;
  if (slot >= c->tiers[t].nslots || c->rtaken[slot] ||
      (c->cfg.verify_tokens && !tokens) || (h.lo == 0 && h.hi == 0))
    return KVS_EINVAL;
  e = tierbook_find(c, h);
  if (e != NONE) { /* the newer copy stays */
    tent *x = &c->tents[e];

    if (c->rgen[e] >= gen)
      return 1;
    c->rtaken[x->slot[t]] = 0;
    x->slot[t] = slot;
    c->rtaken[slot] = 1;
    c->rgen[e] = gen;
    if (c->ttok && tokens)
      memcpy(c->ttok + (size_t)e * c->cfg.block_size, tokens,
             (size_t)c->cfg.block_size * sizeof(uint32_t));
    return 1;
  }
  e = tierbook_ent_new(c, h, tokens, 0); /* (entries >= this tier's slots) */
  tierbook_slot_give(c, t, e, slot, 1);
  c->rtaken[slot] = 1;
  c->rgen[e] = gen;
  return 0;
}

typedef struct rkey {
  uint64_t gen;
  uint32_t slot, e;
} rkey;

static int rkey_cmp(const void *a, const void *b) {
  const rkey *x = a, *y = b;

  if (x->gen != y->gen)
    return x->gen < y->gen ? -1 : 1;
  return x->slot < y->slot ? -1 : x->slot > y->slot;
}

uint32_t core_tier_restore_end(core *c) {
  const int t = c->restoring - 1;
  tier *q;
  rkey *k;
  uint32_t n = 0;

  assert(c->restoring);
  q = &c->tiers[t];
  /* The LRU, oldest written first: sorted (slots are unique: no ties). */
  k = malloc((size_t)(q->st.used ? q->st.used : 1) * sizeof(*k));
  if (k) {
    for (uint32_t e = q->head; e != NONE; e = c->tents[e].next[t]) {
      k[n].gen = c->rgen[e];
      k[n].slot = c->tents[e].slot[t];
      k[n].e = e;
      n++;
    }
    assert(n == q->st.used);
    qsort(k, n, sizeof(*k), rkey_cmp);
    q->head = q->tail = NONE;
    for (uint32_t i = 0; i < n; i++)
      lru_push_tail(c, t, k[i].e);
    free(k);
  } /* (out of memory: the LRU stays in the order given) */
  /* The free slots, the lowest on top (as tier_init hands them out). */
  q->nfree = 0;
  for (uint32_t s = q->nslots; s-- > 0;)
    if (!c->rtaken[s])
      q->free_slots[q->nfree++] = s;
  assert(q->nfree + q->st.used == q->nslots);
  free(c->rgen);
  free(c->rtaken);
  c->rgen = NULL;
  c->rtaken = NULL;
  c->restoring = 0;
  return q->st.used;
}

/* ---- stats, set-up, check -------------------------------------------------- */

void core_tier_get_stats(const core *c, core_tier_stats st[CORE_TIERS]) {
  for (int t = 0; t < CORE_TIERS; t++) {
    st[t] = c->tiers[t].st;
    st[t].slots = c->tiers[t].nslots;
  }
}

int tierbook_init(core *c) {
  uint64_t n = (uint64_t)c->cfg.tier_slots[CORE_TIER_HOST] +
               c->cfg.tier_slots[CORE_TIER_DISK];

  for (int t = 0; t < CORE_TIERS; t++) {
    tier *q = &c->tiers[t];

    q->head = q->tail = NONE;
    q->nslots = c->cfg.tier_slots[t];
    if (!q->nslots)
      continue;
    q->free_slots = malloc((size_t)q->nslots * sizeof(uint32_t));
    if (!q->free_slots)
      return KVS_ENOMEM;
    /* Slot 0 on top: slots are handed out in order. */
    for (uint32_t i = 0; i < q->nslots; i++)
      q->free_slots[i] = q->nslots - 1 - i;
    q->nfree = q->nslots;
  }
  c->tent_free = NONE;
  if (n == 0)
    return 0;
  if (n >= NONE)
    return KVS_EINVAL;
  if (c->cfg.tier_window == 0) {
    c->cfg.tier_window = c->cfg.num_blocks / 16;
    if (c->cfg.tier_window < 8)
      c->cfg.tier_window = 8;
  }
  c->ntents = (uint32_t)n;
  c->tents = calloc(n, sizeof(*c->tents));
  if (c->cfg.verify_tokens)
    c->ttok = malloc(n * c->cfg.block_size * sizeof(uint32_t));
  if (!c->tents || (c->cfg.verify_tokens && !c->ttok) ||
      hidx_init(&c->tindex, (uint32_t)n) != 0)
    return KVS_ENOMEM;
  for (uint32_t e = (uint32_t)n; e-- > 0;) {
    c->tents[e].next[0] = c->tent_free;
    c->tent_free = e;
  }
  return 0;
}

void tierbook_destroy(core *c) {
  for (int t = 0; t < CORE_TIERS; t++)
    free(c->tiers[t].free_slots);
  free(c->tents);
  free(c->ttok);
  free(c->rgen);
  free(c->rtaken);
  if (c->ntents)
    hidx_destroy(&c->tindex);
}

int tierbook_check(const core *c, char *msg, size_t msg_len) {
  uint8_t *seen[CORE_TIERS] = {NULL, NULL};
  uint32_t used = 0, nbusy = 0, ndown = 0;
  int rc = 0;

  for (uint32_t b = 0; b < c->cfg.num_blocks; b++) {
    nbusy += c->blocks[b].busy && c->blocks[b].on_queue;
    ndown += c->blocks[b].busy;
  }
  if (nbusy != c->nbusy)
    CHECK_FAIL("%u busy blocks queued, counter says %u", nbusy, c->nbusy);
  if (ndown != c->ndown || ndown > c->cfg.tier_window)
    CHECK_FAIL("%u blocks being copied down, counter says %u, window %u",
               ndown, c->ndown, c->cfg.tier_window);
  if (c->restoring)
    CHECK_FAIL("a restore of tier %d is in progress", c->restoring - 1);
  if (!c->ntents)
    return 0;
  for (int t = 0; t < CORE_TIERS; t++) {
    const tier *q = &c->tiers[t];
    uint32_t n = 0, prev = NONE;

    seen[t] = calloc(q->nslots ? q->nslots : 1, 1);
    if (!seen[t])
      CHECK_FAIL("out of memory");
    for (uint32_t i = 0; i < q->nfree; i++) {
      if (q->free_slots[i] >= q->nslots || seen[t][q->free_slots[i]])
        CHECK_FAIL("tier %d: free slot %u out of range or twice", t,
              q->free_slots[i]);
      seen[t][q->free_slots[i]] = 1;
    }
    for (uint32_t e = q->head; e != NONE; e = c->tents[e].next[t]) {
      const tent *x = &c->tents[e];

      if (e >= c->ntents || !x->used || n > c->ntents)
        CHECK_FAIL("tier %d: LRU holds a bad entry %u", t, e);
      if (x->prev[t] != prev)
        CHECK_FAIL("tier %d: entry %u's prev is %u, expected %u", t, e, x->prev[t],
              prev);
      if (x->slot[t] >= q->nslots || seen[t][x->slot[t]])
        CHECK_FAIL("tier %d: entry %u's slot %u out of range or shared", t, e,
              x->slot[t]);
      if (x->hold)
        CHECK_FAIL("tier %d: held entry %u in the LRU", t, e);
      seen[t][x->slot[t]] = 1;
      prev = e;
      n++;
    }
    uint32_t held = 0;
    for (uint32_t e = 0; e < c->ntents; e++) {
      const tent *x = &c->tents[e];

      if (!x->used || !x->hold || x->slot[t] == NONE)
        continue;
      if (x->slot[t] >= q->nslots || seen[t][x->slot[t]])
        CHECK_FAIL("tier %d: held entry %u's slot %u out of range or shared", t,
              e, x->slot[t]);
      seen[t][x->slot[t]] = 1;
      held++;
    }
    if (prev != q->tail || n + held != q->st.used ||
        held != q->st.held || n + held + q->nfree != q->nslots)
      CHECK_FAIL("tier %d: %u in the LRU, %u held (counter %u), %u free, %u used, "
            "%u slots", t, n, held, q->st.held, q->nfree, q->st.used,
            q->nslots);
  }
  for (uint32_t e = 0; e < c->ntents; e++) {
    const tent *x = &c->tents[e];

    if (!x->used)
      continue;
    used += !x->priv;
    if (!x->priv && hidx_find(&c->tindex, x->h) != e)
      CHECK_FAIL("entry %u: the tier index does not point at it", e);
    if (x->priv && !x->hold && !x->busy)
      CHECK_FAIL("entry %u: private, yet nobody holds it", e);
    if (x->slot[CORE_TIER_HOST] == NONE && x->slot[CORE_TIER_DISK] == NONE &&
        !x->hold)
      CHECK_FAIL("entry %u holds no slot", e);
    for (int t = 0; t < CORE_TIERS; t++)
      if (x->slot[t] == NONE && x->valid[t])
        CHECK_FAIL("entry %u: valid in tier %d without a slot", e, t);
    if (!x->busy && ((x->slot[0] != NONE && !x->valid[0]) ||
                     (x->slot[1] != NONE && !x->valid[1]) || x->bad))
      CHECK_FAIL("entry %u: a slot being written or a bad copy, yet nothing in "
            "flight", e);
  }
  if (used != c->tindex.count)
    CHECK_FAIL("%u entries, the tier index holds %u", used, c->tindex.count);
  rc = swap_check(c, msg, msg_len);
out:
  free(seen[0]);
  free(seen[1]);
  return rc;
}
