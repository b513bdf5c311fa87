/*
 * remote.c — the core's side of the remote tier (core.h, "The remote
 * tier"): the hashes a lookup asks the store for, and device blocks for
 * what it found.  The core keeps no books of the store's contents.
 */
#include <stdlib.h>

#include "core_int.h"

uint32_t core_req_next_hashes(const core *c, const core_req *r,
                              kvs_hash128 *out, uint32_t max) {
  const uint32_t bs = c->cfg.block_size;
  uint32_t full = r->known > 0 ? (r->known - 1) / bs : 0, n = 0;
  kvs_hash128 parent = r->chain;

  if (r->swap || r->sealed != r->nblocks)
    return 0;
  for (uint32_t i = r->nblocks; i < full && n < max; i++) {
    parent = blk_hash(c, parent, r->salt, r->tokens + (size_t)i * bs);
    out[n++] = parent;
  }
  return n;
}

const uint32_t *core_req_tokens(const core_req *r) { return r->tokens; }

const uint32_t *core_block_tokens(const core *c, uint32_t b) {
  return b < c->cfg.num_blocks && c->blocks[b].sealed ? btok(c, b) : NULL;
}

int core_block_holds(const core *c, uint32_t b, kvs_hash128 h) {
  const blk *x;

  if (b >= c->cfg.num_blocks)
    return 0;
  x = &c->blocks[b];
  if (!x->sealed || !x->indexed || !h_eq(c->bhash[b], h))
    return 0;
  return x->ref > 0 ? 2 : 1;
}

int core_remote_promote(core *c, core_req *r, const kvs_hash128 *hashes,
                        uint32_t n, core_promo *promos, uint32_t *npromos,
                        uint32_t *taken) {
  const uint32_t bs = c->cfg.block_size;
  uint32_t full, m = 0, keep, ndev = 0, fresh = 0, base = r->nblocks;
  uint32_t *dev;
  kvs_hash128 parent = r->chain, chain0 = r->chain;
  int64_t avail;

  *npromos = *taken = 0;
  if (r->swap || r->sealed != r->nblocks || r->slots != r->nblocks * bs ||
      r->written != r->slots)
    return KVS_ESTATE;
  full = r->known > 0 ? (r->known - 1) / bs : 0;
  if (base >= full || n == 0)
    return 0;
  if (n > full - base)
    n = full - base;
  dev = malloc((size_t)n * sizeof(*dev));
  if (dev == NULL)
    return KVS_ENOMEM;

  /* The chain must be r's own: a hash that is not ends the list. */
  for (; m < n; m++) {
    const uint32_t *t = r->tokens + (size_t)(base + m) * bs;
    kvs_hash128 h = blk_hash(c, parent, r->salt, t);
    uint32_t b;

    if (!h_eq(h, hashes[m]))
      break;
    b = hidx_find(&c->index, h);
    if (b != KVS_BLOCK_NONE && c->cfg.verify_tokens &&
        memcmp(btok(c, b), t, (size_t)bs * sizeof(uint32_t)) != 0)
      break; /* a collision with what the device holds: stop here */
    dev[m] = b;
    parent = h;
  }

  /* How far the free queue goes, keeping the reserve (as Allocate): a
   * fresh block or a CACHED hit takes one from it; an IN USE hit takes
   * none, and is taken even when the queue is below the reserve already. */
  avail = (int64_t)c->fq_len - c->nbusy - c->cfg.reserve_blocks;
  for (keep = 0; keep < m; keep++) {
    uint32_t b = dev[keep];
    if ((b == KVS_BLOCK_NONE || c->blocks[b].ref == 0) && --avail < 0)
      break;
  }
  if (keep == 0 ||
      grow(&r->blocks, &r->cap_blocks, (uint64_t)base + keep) != 0) {
    free(dev);
    return keep == 0 ? 0 : KVS_ENOMEM;
  }
  /* Resident ones first: taking fresh blocks must not evict them. */
  for (uint32_t j = 0; j < keep; j++)
    if (dev[j] != KVS_BLOCK_NONE) {
      blk_hit(c, dev[j]);
      r->blocks[base + j] = dev[j];
      ndev++;
    }
  parent = chain0;
  for (uint32_t j = 0; j < keep; j++) {
    if (dev[j] != KVS_BLOCK_NONE) {
      parent = hashes[j];
      continue;
    }
    uint32_t b = blk_take(c);
    blk *x = &c->blocks[b];
    core_promo *p = &promos[fresh++];

    c->bhash[b] = hashes[j];
    btok_set(c, b, r->tokens + (size_t)(base + j) * bs);
    x->sealed = 1; /* not indexed until its bytes are there */
    x->pins++;     /* until core_promote_finish */
    x->ref++;
    r->blocks[base + j] = b;
    p->block = b;
    p->pos = base + j;
    p->entry = KVS_BLOCK_NONE;
    p->tier = CORE_TIER_REMOTE;
    p->slot = KVS_BLOCK_NONE;
    p->hash = hashes[j];
    p->parent = parent;
    parent = hashes[j];
  }
  r->nblocks = r->sealed = base + keep;
  r->slots = r->written = r->nblocks * bs;
  r->chain = hashes[keep - 1];
  c->st.hit_tokens += (uint64_t)ndev * bs;
  c->st.hit_blocks += ndev;
  c->st.miss_blocks -= keep;
  c->st.allocated_blocks += fresh;
  *npromos = fresh;
  *taken = keep;
  free(dev);
  return 0;
}
