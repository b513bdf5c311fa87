/*
 * swap.c — a preempted request's blocks below the device pool and back
 * (core.h, "Swap").  The copies below are tier entries the request holds
 * (tierbook.c: a held entry is off the LRUs and never dropped); the daemon
 * moves the bytes, as it does for demotion and promotion, and reports back.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core_int.h"

#define NONE KVS_BLOCK_NONE

int core_req_swap_state(const core_req *r) { return r->swap; }

uint32_t core_req_swap_blocks(const core_req *r) {
  return r->swap == CORE_SWAP_OUT ? r->sw_n : 0;
}

uint32_t core_req_swap_written(const core_req *r) {
  return r->swap == CORE_SWAP_OUT ? r->sw_written : 0;
}

/* The entry holding a good copy of sealed block b (its hash, its tokens),
 * or NONE. */
static uint32_t good_copy(const core *c, uint32_t b) {
  uint32_t e = tierbook_find(c, c->bhash[b]);
  const tent *x;

  if (e == NONE)
    return NONE;
  x = &c->tents[e];
  if (!x->valid[CORE_TIER_HOST] && !x->valid[CORE_TIER_DISK])
    return NONE;
  if (c->cfg.verify_tokens &&
      memcmp(tierbook_tokens(c, e), btok(c, b),
             (size_t)c->cfg.block_size * sizeof(uint32_t)) != 0)
    return NONE;
  return e;
}

/* A slot for a new copy: the host tier, else the disk tier. */
static uint32_t swap_slot(core *c, int *t) {
  uint32_t s;

  *t = tierbook_first(c);
  s = tierbook_slot_take(c, *t);
  if (s == NONE && *t == CORE_TIER_HOST && c->tiers[CORE_TIER_DISK].nslots) {
    *t = CORE_TIER_DISK;
    s = tierbook_slot_take(c, *t);
  }
  return s;
}

/* Lets go of the copies held for blocks [0, k) of r; mv[0..nm) are the
 * moves planned for new ones, none started: those copies are dropped. */
static void let_go(core *c, core_req *r, uint32_t k, const core_move *mv,
                   uint32_t nm, int started) {
  for (uint32_t i = 0; i < k; i++)
    tierbook_unhold(c, r->swent[i]);
  for (uint32_t i = 0; i < nm && !started; i++) {
    tierbook_forget(c, mv[i].entry, (int)mv[i].tier);
    tierbook_busy(c, mv[i].entry, -1);
    core_unpin(c, mv[i].block);
  }
  free(r->swent);
  r->swent = NULL;
  r->sw_n = 0;
  r->swap = CORE_SWAP_NONE;
}

int core_swap_out(core *c, core_req *r, core_move *mv, uint32_t max,
                  uint32_t *nmoves) {
  const kvs_hash128 zero = {0, 0};
  uint32_t n = r->nblocks, nm = 0, kept = 0, i;
  int rc = 0;

  *nmoves = 0;
  if (r->swap)
    return KVS_ESTATE;
  if (!tierbook_any(c))
    return KVS_ENOTSUP;
  if (max < n)
    return KVS_EINVAL;
  r->swent = malloc((n ? n : 1) * sizeof(uint32_t));
  if (r->swent == NULL)
    return KVS_ENOMEM;
  for (i = 0; i < n; i++) {
    uint32_t b = r->blocks[i], e, s;
    blk *x = &c->blocks[b];
    int sealed = i < r->sealed, t;

    if (sealed && (e = good_copy(c, b)) != NONE) {
      if ((rc = tierbook_hold(c, e)) < 0)
        goto undo;
      r->swent[i] = e;
      kept++;
      continue;
    }
    if (x->pins == UINT8_MAX) {
      rc = KVS_ELIMIT;
      goto undo;
    }
    if ((s = swap_slot(c, &t)) == NONE) {
      rc = KVS_ENOSPC;
      goto undo;
    }
    /* A sealed block is a cache entry like any demoted one, unless its
     * hash has one already (being written): then, as an unsealed block,
     * a private copy. */
    e = tierbook_ent_new(c, sealed ? c->bhash[b] : zero,
                     sealed ? btok(c, b) : NULL,
                     !sealed || tierbook_find(c, c->bhash[b]) != NONE);
    tierbook_slot_give(c, t, e, s, 0);
    tierbook_busy(c, e, 1);
    tierbook_hold(c, e); /* (a new entry: cannot fail) */
    x->pins++;
    x->ref++;
    mv[nm].kind = CORE_MOVE_SWAP;
    mv[nm].tier = (uint32_t)t;
    mv[nm].block = b;
    mv[nm].entry = e;
    mv[nm].slot = s;
    mv[nm].src_slot = NONE;
    mv[nm].hash = c->tents[e].h;
    nm++;
    r->swent[i] = e;
  }
  r->swap = CORE_SWAP_OUT_PENDING;
  r->sw_n = n;
  c->st.swapped_requests++;
  c->st.swap_kept_blocks += kept;
  *nmoves = nm;
  return 0;
undo:
  /* swent[0..i) are held: a copy kept, or a new one planned in mv */
  let_go(c, r, i, mv, nm, 0);
  return rc;
}

int core_swap_out_finish(core *c, core_req *r, const core_move *mv,
                         uint32_t n, const int *ok) {
  int all = 1;

  for (uint32_t i = 0; i < n; i++) {
    tier *q = &c->tiers[mv[i].tier];
    tent *x = &c->tents[mv[i].entry];

    assert(mv[i].kind == CORE_MOVE_SWAP && x->used && x->busy > 0);
    if (ok != NULL && ok[i]) {
      tierbook_valid(c, mv[i].entry, (int)mv[i].tier, 1);
      q->st.demotions++;
      c->st.swap_out_blocks++;
    } else {
      all = 0;
      q->st.failures++;
      tierbook_forget(c, mv[i].entry, (int)mv[i].tier);
    }
    tierbook_busy(c, mv[i].entry, -1);
    core_unpin(c, mv[i].block); /* r (when alive) still holds it */
  }
  if (r == NULL)
    return all ? 0 : KVS_EIO;
  assert(r->swap == CORE_SWAP_OUT_PENDING);
  if (!all) {
    let_go(c, r, r->sw_n, mv, n, 1);
    c->st.swapped_requests--;
    c->st.swap_failures++;
    return KVS_EIO;
  }
  r->sw_slots = r->slots;
  r->sw_written = r->written;
  r->sw_sealed = r->sealed;
  r->sw_chain = r->chain;
  for (uint32_t i = r->nblocks; i-- > 0;)
    blk_put(c, r->blocks[i]);
  r->nblocks = r->slots = r->written = r->sealed = 0;
  r->chain = c->cfg.root;
  r->swap = CORE_SWAP_OUT;
  c->st.swap_outs++;
  return 0;
}

/* r's counters for a table of its first `keep` swapped blocks. */
static void set_counters(core *c, core_req *r, uint32_t keep) {
  const uint32_t bs = c->cfg.block_size;

  if (keep == r->sw_n) {
    r->slots = r->sw_slots;
    r->written = r->sw_written;
    r->sealed = r->sw_sealed;
    r->chain = r->sw_chain;
    return;
  }
  r->slots = r->sw_slots < keep * bs ? r->sw_slots : keep * bs;
  r->written = r->sw_written < r->slots ? r->sw_written : r->slots;
  r->sealed = r->written / bs;
  r->chain = r->sealed ? c->bhash[r->blocks[r->sealed - 1]] : c->cfg.root;
}

int core_swap_in(core *c, core_req *r, core_promo *p, uint32_t max,
                 uint32_t *npromos) {
  const uint32_t bs = c->cfg.block_size;
  uint32_t n = r->sw_n, cut = n, np = 0, *res;
  int64_t avail = (int64_t)c->fq_len - c->nbusy - c->cfg.reserve_blocks;
  int rc;

  *npromos = 0;
  if (r->swap != CORE_SWAP_OUT)
    return KVS_ESTATE;
  if (max < n)
    return KVS_EINVAL;
  res = malloc((n ? n : 1) * sizeof(uint32_t));
  if (res == NULL)
    return KVS_ENOMEM;
  /* Each block: resident on the device still, or from its copy; the table
   * ends before a block with neither. */
  for (uint32_t i = 0; i < n; i++) {
    const tent *x = &c->tents[r->swent[i]];
    uint32_t b = NONE;

    if (i < r->sw_sealed) {
      b = hidx_find(&c->index, x->h);
      if (b != NONE && c->cfg.verify_tokens &&
          memcmp(btok(c, b), r->tokens + (size_t)i * bs,
                 (size_t)bs * sizeof(uint32_t)) != 0)
        b = NONE;
    }
    res[i] = b;
    if (b == NONE && !x->valid[CORE_TIER_HOST] && !x->valid[CORE_TIER_DISK]) {
      cut = i;
      break;
    }
    if (b == NONE || c->blocks[b].ref == 0)
      avail--;
  }
  if (avail < 0) {
    free(res);
    c->st.no_space++;
    return KVS_ENOSPC;
  }
  if ((rc = grow(&r->blocks, &r->cap_blocks, cut)) != 0) {
    free(res);
    return rc;
  }
  /* Copies to read are busy (they outlive a free of r); resident blocks are
   * taken before any free block, so that taking one cannot evict them. */
  for (uint32_t i = 0; i < cut; i++)
    if (res[i] == NONE)
      tierbook_busy(c, r->swent[i], 1);
  for (uint32_t i = 0; i < cut; i++)
    if (res[i] != NONE) {
      blk_hit(c, res[i]);
      r->blocks[i] = res[i];
      c->st.swap_resident_blocks++;
    }
  for (uint32_t i = 0; i < cut; i++) {
    uint32_t e = r->swent[i], b;
    const tent *x = &c->tents[e];
    blk *y;

    if (res[i] != NONE)
      continue;
    b = blk_take(c);
    y = &c->blocks[b];
    if (i < r->sw_sealed) { /* indexed once its bytes are in */
      c->bhash[b] = x->h;
      btok_set(c, b, r->tokens + (size_t)i * bs);
      y->sealed = 1;
    }
    y->pins++;
    y->ref++;
    r->blocks[i] = b;
    p[np].block = b;
    p[np].pos = i;
    p[np].entry = e;
    p[np].tier = x->valid[CORE_TIER_HOST] ? CORE_TIER_HOST : CORE_TIER_DISK;
    p[np].slot = x->slot[p[np].tier];
    p[np].hash = x->h;
    p[np].parent = i > 0 ? c->tents[r->swent[i - 1]].h : (kvs_hash128){0, 0};
    np++;
  }
  c->st.allocated_blocks += np;
  r->nblocks = cut;
  set_counters(c, r, cut);
  r->swap = CORE_SWAP_IN_PENDING;
  *npromos = np;
  free(res);
  return 0;
}

uint32_t core_swap_in_finish(core *c, core_req *r, const core_promo *p,
                             uint32_t n, const int *ok) {
  uint32_t bad = tierbook_fills_end(c, p, n, ok);

  for (uint32_t i = 0; i < n; i++)
    c->st.swap_in_blocks += ok != NULL && ok[i];
  if (r != NULL) {
    assert(r->swap == CORE_SWAP_IN_PENDING);
    if (bad < n) {
      uint32_t keep = p[bad].pos;

      for (uint32_t i = r->nblocks; i-- > keep;)
        blk_put(c, r->blocks[i]);
      r->nblocks = keep;
      set_counters(c, r, keep);
    }
    if (r->nblocks == r->sw_n)
      c->st.swap_ins++;
    else
      c->st.swap_failures++;
    swap_req_free(c, r);
  }
  for (uint32_t i = 0; i < n; i++)
    core_unpin(c, p[i].block);
  return r != NULL ? r->written : 0;
}

void swap_req_free(core *c, core_req *r) {
  if (!r->swap)
    return;
  for (uint32_t i = 0; i < r->sw_n; i++)
    tierbook_unhold(c, r->swent[i]);
  free(r->swent);
  r->swent = NULL;
  r->sw_n = 0;
  r->swap = CORE_SWAP_NONE;
  c->st.swapped_requests--;
}

int swap_check(const core *c, char *msg, size_t msg_len) {
  uint32_t *holds = calloc(c->ntents ? c->ntents : 1, sizeof(uint32_t));
  uint32_t swapped = 0;
  int rc = 0;

  if (holds == NULL)
    return KVS_ENOMEM;
  for (const core_req *r = c->reqs; r != NULL; r = r->next) {
    if (!r->swap)
      continue;
    swapped++;
    if (r->swap == CORE_SWAP_OUT && r->nblocks != 0)
      CHECK_FAIL("a swapped-out request holds %u blocks", r->nblocks);
    for (uint32_t i = 0; i < r->sw_n; i++) {
      uint32_t e = r->swent[i];

      if (e >= c->ntents || !c->tents[e].used)
        CHECK_FAIL("a swapped request names entry %u, not in use", e);
      holds[e]++;
    }
  }
  if (swapped != c->st.swapped_requests)
    CHECK_FAIL("%u swapped requests, counter says %u", swapped,
          c->st.swapped_requests);
  for (uint32_t e = 0; e < c->ntents; e++)
    if (c->tents[e].used && c->tents[e].hold != holds[e])
      CHECK_FAIL("entry %u: %u holds, %u swapped requests name it", e,
            c->tents[e].hold, holds[e]);
out:
  free(holds);
  return rc;
}
