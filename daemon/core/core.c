/*
 * core.c — requests and their operations over the block pool, the prefix
 * index and the eviction policy.  See core.h for the semantics.
 *
 * Every operation validates and reserves memory first and only then changes
 * state, so an error leaves the core exactly as it was.
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "core_int.h"
#include "kvs_asan.h"

static const core_policy *const policies[] = {
    &core_policy_lru, &core_policy_slru, &core_policy_mq, &core_policy_opt};

static const core_policy *policy_find(const char *name) {
  for (size_t i = 0; i < sizeof(policies) / sizeof(policies[0]); i++)
    if (strcmp(policies[i]->name, name) == 0)
      return policies[i];
  return NULL;
}

int core_policy_find(const char *name, int *offline) {
  const core_policy *p = policy_find(name);
  if (p == NULL)
    return KVS_EINVAL;
  if (offline != NULL)
    *offline = p->offline;
  return 0;
}

void core_policy_list(char *buf, size_t len, int offline) {
  size_t n = 0;
  if (len > 0)
    buf[0] = '\0';
  for (size_t i = 0; i < sizeof(policies) / sizeof(policies[0]); i++) {
    if (policies[i]->offline && !offline)
      continue;
    int w = snprintf(buf + n, len - n, "%s%s", n ? ", " : "", policies[i]->name);
    if (w < 0 || (size_t)w >= len - n)
      return;
    n += (size_t)w;
  }
}

const char *core_policy_name(size_t i, int *offline) {
  if (i >= sizeof(policies) / sizeof(policies[0]))
    return NULL;
  if (offline != NULL)
    *offline = policies[i]->offline;
  return policies[i]->name;
}

int core_policy_offline(const core *c) { return c->policy->offline; }

void core_policy_hint(core *c, uint32_t b, uint32_t value) {
  if (c->policy->hint != NULL && b < c->cfg.num_blocks)
    c->policy->hint(c, b, value);
}

/* At most this many freed requests are kept, and their arrays only up to
 * these capacities (so the spares hold at most ~2.3 MiB).  Under
 * AddressSanitizer none is kept: every freed request is really freed, so
 * that a use of one is reported.  (Poisoning the parked spares instead
 * would not do: LeakSanitizer does not follow pointers through poisoned
 * memory, and reports the spares behind the first as leaks.) */
#define SPARE_REQS (KVS_ASAN ? 0 : 64)
#define SPARE_BLOCKS 1024u
#define SPARE_TOKENS 8192u

/* A request's memory, once nothing refers to it. */
static void req_dealloc(core_req *r) {
  free(r->blocks);
  free(r->tokens);
  free(r);
}

/* Blocks hashed ahead of their index probes (core_lookup, seal_blocks): a
 * big index is probed at random, and a probe that waits for memory costs
 * more than hashing a block, so the slots are fetched while the next blocks
 * are hashed. */
#define LOOKAHEAD 8

/* hs[0..m) = the chained hashes of the m (<= LOOKAHEAD) blocks of tokens
 * after parent, their index slots being fetched. */
static inline void hash_ahead(const core *c, kvs_hash128 parent,
                              kvs_hash128 salt, const uint32_t *tokens,
                              uint32_t m, kvs_hash128 *hs) {
  for (uint32_t k = 0; k < m; k++) {
    hs[k] = blk_hash(c, k ? hs[k - 1] : parent, salt,
                     tokens + (size_t)k * c->cfg.block_size);
    hidx_prefetch(&c->index, hs[k]);
  }
}

void core_config_init(core_config *cfg) {
  memset(cfg, 0, sizeof(*cfg));
  cfg->block_size = 16;
  cfg->verify_tokens = 1;
  cfg->policy = "lru";
}

int core_create(const core_config *cfg, core **out) {
  const core_policy *pol =
      policy_find(cfg->policy != NULL ? cfg->policy : "lru");
  *out = NULL;
  if (pol == NULL || (pol->offline && !cfg->allow_offline) ||
      cfg->num_blocks == 0 ||
      cfg->num_blocks >= KVS_BLOCK_NONE || cfg->block_size == 0 ||
      cfg->block_size > 65536 || cfg->reserve_blocks >= cfg->num_blocks)
    return KVS_EINVAL;

  core *c = calloc(1, sizeof(*c));
  if (c == NULL)
    return KVS_ENOMEM;
  c->cfg = *cfg;
  c->cfg.policy = pol->name;
  c->policy = pol;
  c->blocks = core_big_alloc((size_t)cfg->num_blocks * sizeof(*c->blocks), 1);
  c->bhash = core_big_alloc((size_t)cfg->num_blocks * sizeof(*c->bhash), 1);
  if (cfg->verify_tokens || cfg->keep_tokens)
    c->btok = core_big_alloc((size_t)cfg->num_blocks * cfg->block_size *
                             sizeof(uint32_t), 0);
  if (c->blocks == NULL || c->bhash == NULL ||
      ((cfg->verify_tokens || cfg->keep_tokens) && c->btok == NULL) ||
      hidx_init(&c->index, cfg->num_blocks) != 0 ||
      (pol->init != NULL && pol->init(c) != 0))
    goto fail;
  c->fq_head = c->fq_tail = KVS_BLOCK_NONE;
  if (tierbook_init(c) != 0)
    goto fail;
  c->bs_shift = -1;
  if ((cfg->block_size & (cfg->block_size - 1)) == 0)
    c->bs_shift = __builtin_ctz(cfg->block_size);
  for (uint32_t b = 0; b < cfg->num_blocks; b++)
    pool_fq_push_tail(c, b);
  *out = c;
  return 0;
fail:
  if (pol->destroy != NULL)
    pol->destroy(c);
  tierbook_destroy(c);
  hidx_destroy(&c->index);
  free(c->btok);
  free(c->bhash);
  free(c->blocks);
  free(c);
  return KVS_ENOMEM;
}

void core_destroy(core *c) {
  if (c == NULL)
    return;
  while (c->reqs != NULL)
    core_req_free(c, c->reqs);
  while (c->spare != NULL) {
    core_req *r = c->spare;
    c->spare = r->next;
    req_dealloc(r);
  }
  if (c->policy->destroy != NULL)
    c->policy->destroy(c);
  tierbook_destroy(c);
  hidx_destroy(&c->index);
  free(c->btok);
  free(c->bhash);
  free(c->blocks);
  free(c);
}

/* ---- blocks ------------------------------------------------------------ */

int core_pin(core *c, uint32_t b) {
  blk *x;

  if (b >= c->cfg.num_blocks)
    return KVS_ERANGE;
  x = &c->blocks[b];
  if (x->ref == 0)
    return KVS_ESTATE;
  if (x->pins == UINT8_MAX)
    return KVS_ELIMIT;
  x->pins++;
  x->ref++;
  return 0;
}

void core_unpin(core *c, uint32_t b) {
  assert(b < c->cfg.num_blocks && c->blocks[b].pins > 0);
  c->blocks[b].pins--;
  blk_put(c, b);
}

/* ---- requests ---------------------------------------------------------- */

int core_grow_slow(uint32_t **arr, uint32_t *cap, uint64_t need) {
  if (need > UINT32_MAX)
    return KVS_ERANGE;
  uint64_t n = *cap ? *cap : 16;
  while (n < need)
    n *= 2;
  if (n > UINT32_MAX)
    n = UINT32_MAX;
  uint32_t *p = realloc(*arr, n * sizeof(uint32_t));
  if (p == NULL)
    return KVS_ENOMEM;
  *arr = p;
  *cap = (uint32_t)n;
  return 0;
}

int core_req_create(core *c, const void *salt, size_t salt_len,
                    core_req **out) {
  core_req *r = c->spare;
  *out = NULL;
  if (r != NULL) {
    uint32_t *blocks = r->blocks, *tokens = r->tokens;
    uint32_t cap_blocks = r->cap_blocks, cap_tokens = r->cap_tokens;
    c->spare = r->next;
    c->nspare--;
    memset(r, 0, sizeof(*r));
    r->blocks = blocks;
    r->cap_blocks = cap_blocks;
    r->tokens = tokens;
    r->cap_tokens = cap_tokens;
  } else if ((r = calloc(1, sizeof(*r))) == NULL) {
    return KVS_ENOMEM;
  }
  if (salt != NULL && salt_len > 0) {
    XXH128_hash_t s = XXH3_128bits(salt, salt_len);
    r->salt.lo = s.low64;
    r->salt.hi = s.high64;
  }
  r->chain = c->cfg.root;
  r->next = c->reqs;
  if (c->reqs != NULL)
    c->reqs->prev = r;
  c->reqs = r;
  c->nreqs++;
  *out = r;
  return 0;
}

static void req_release_blocks(core *c, core_req *r) {
  for (uint32_t i = r->nblocks; i-- > 0;)
    blk_put(c, r->blocks[i]);
  r->nblocks = 0;
  r->slots = r->written = r->sealed = 0;
  r->chain = c->cfg.root;
}

void core_req_free(core *c, core_req *r) {
  req_release_blocks(c, r);
  swap_req_free(c, r);
  if (r->prev != NULL)
    r->prev->next = r->next;
  else
    c->reqs = r->next;
  if (r->next != NULL)
    r->next->prev = r->prev;
  c->nreqs--;
  if (c->nspare + 1 > SPARE_REQS) { /* (not >=: SPARE_REQS may be 0) */
    req_dealloc(r);
    return;
  }
  if (r->cap_blocks > SPARE_BLOCKS) {
    free(r->blocks);
    r->blocks = NULL;
    r->cap_blocks = 0;
  }
  if (r->cap_tokens > SPARE_TOKENS) {
    free(r->tokens);
    r->tokens = NULL;
    r->cap_tokens = 0;
  }
  r->next = c->spare;
  c->spare = r;
  c->nspare++;
}

int core_preempt(core *c, core_req *r) {
  if (r->swap)
    return KVS_ESTATE;
  req_release_blocks(c, r);
  return 0;
}

int core_lookup(core *c, core_req *r, const uint32_t *tokens, uint32_t n,
                uint32_t *hit_tokens) {
  const uint32_t bs = c->cfg.block_size;
  int rc;
  *hit_tokens = 0;
  if (r->nblocks != 0 || r->slots != 0 || r->swap)
    return KVS_ESTATE;
  if (n > 0 && tokens == NULL)
    return KVS_EINVAL;
  uint32_t full = n > 0 ? (n - 1) / bs : 0;
  if ((rc = grow(&r->tokens, &r->cap_tokens, n)) != 0 ||
      (rc = grow(&r->blocks, &r->cap_blocks, full)) != 0)
    return rc;

  kvs_hash128 parent = c->cfg.root, hs[LOOKAHEAD];
  uint32_t hits = 0, stop = 0;
  while (hits < full && !stop) {
    uint32_t m = full - hits < LOOKAHEAD ? full - hits : LOOKAHEAD;
    hash_ahead(c, parent, r->salt, tokens + (size_t)hits * bs, m, hs);
    for (uint32_t k = 0; k < m && !stop; k++) {
      const uint32_t *t = tokens + (size_t)hits * bs;
      uint32_t b = hidx_find(&c->index, hs[k]);
      if (b == KVS_BLOCK_NONE) {
        stop = 1;
      } else if (c->cfg.verify_tokens &&
                 memcmp(btok(c, b), t, (size_t)bs * sizeof(uint32_t)) != 0) {
        c->st.collisions++;
        stop = 1;
      } else {
        r->blocks[hits++] = b; /* acquired below, once the walk is done */
        parent = hs[k];
      }
    }
  }
  for (uint32_t i = 0; i < hits; i++)
    blk_hit(c, r->blocks[i]);
  if (n > 0)
    memcpy(r->tokens, tokens, (size_t)n * sizeof(uint32_t));
  r->known = n;
  r->nblocks = r->sealed = hits;
  r->slots = r->written = hits * bs;
  r->chain = parent;

  c->st.lookups++;
  c->st.query_tokens += n;
  c->st.hit_tokens += (uint64_t)hits * bs;
  c->st.hit_blocks += hits;
  c->st.miss_blocks += full - hits;
  *hit_tokens = hits * bs;
  return 0;
}

/* One block of the chain after the device hits: resident on the device
 * (block b), or below (entry e, in tier t). */
typedef struct cont {
  kvs_hash128 h;
  uint32_t b, e, t;
} cont;

int core_lookup_promote(core *c, core_req *r, const uint32_t *tokens,
                        uint32_t n, int promote, core_promo *promos,
                        uint32_t max_promos, core_lookup_out *out) {
  const uint32_t bs = c->cfg.block_size;
  uint32_t hit, full, m = 0, keep, lower = 0, ndev = 0;
  cont *ch = NULL;
  int rc;

  memset(out, 0, sizeof(*out));
  rc = core_lookup(c, r, tokens, n, &hit);
  if (rc != 0)
    return rc;
  out->hit_tokens = hit;
  out->device_blocks = hit / bs;
  full = n > 0 ? (n - 1) / bs : 0;
  if (!tierbook_any(c) || r->nblocks >= full)
    return 0;
  ch = malloc((size_t)(full - r->nblocks) * sizeof(*ch));
  if (ch == NULL)
    return 0; /* the device hits stand; nothing more */

  /* Walk on: each block resident (the device index) or below (a tier). */
  kvs_hash128 parent = r->chain, chain0 = r->chain;
  for (uint32_t i = r->nblocks; i < full; i++, m++) {
    const uint32_t *t = tokens + (size_t)i * bs;
    kvs_hash128 h = blk_hash(c, parent, r->salt, t);
    uint32_t b = hidx_find(&c->index, h), e;
    ch[m].h = h;
    ch[m].b = ch[m].e = KVS_BLOCK_NONE;
    if (b != KVS_BLOCK_NONE &&
        (!c->cfg.verify_tokens ||
         memcmp(btok(c, b), t, (size_t)bs * sizeof(uint32_t)) == 0)) {
      ch[m].b = b;
    } else if ((e = tierbook_find(c, h)) != KVS_BLOCK_NONE &&
               (c->tents[e].valid[CORE_TIER_HOST] ||
                c->tents[e].valid[CORE_TIER_DISK]) &&
               (!c->cfg.verify_tokens ||
                memcmp(tierbook_tokens(c, e), t, (size_t)bs * sizeof(uint32_t)) ==
                    0)) {
      ch[m].e = e;
      ch[m].t = c->tents[e].valid[CORE_TIER_HOST] ? CORE_TIER_HOST
                                                  : CORE_TIER_DISK;
    } else {
      break;
    }
    parent = h;
  }
  for (uint32_t j = 0; j < m; j++)
    if (ch[j].e != KVS_BLOCK_NONE)
      c->tiers[ch[j].t].st.hit_blocks++;
  if (!promote) {
    for (uint32_t j = 0; j < m; j++)
      if (ch[j].e != KVS_BLOCK_NONE)
        out->tier_blocks[ch[j].t]++;
    free(ch);
    return 0;
  }

  /* How far the free queue goes, keeping the reserve (as Allocate): a
   * resident CACHED block leaves it when taken, a block below takes one. */
  int64_t avail = (int64_t)c->fq_len - c->nbusy - c->cfg.reserve_blocks;
  for (keep = 0; keep < m; keep++) {
    int below = ch[keep].e != KVS_BLOCK_NONE;
    /* (an IN USE resident block takes no room: taken even when the
     * queue is already below the reserve) */
    if ((below && lower == max_promos) ||
        ((below || c->blocks[ch[keep].b].ref == 0) && --avail < 0))
      break;
    lower += (uint32_t)below;
  }
  if (keep == 0 || grow(&r->blocks, &r->cap_blocks, (uint64_t)r->nblocks + keep) != 0) {
    free(ch);
    return 0;
  }
  /* Resident ones first: taking free blocks must not evict them; and the
   * entries to read are busy before any block is taken (an eviction may
   * make room in a tier, never by dropping one of them). */
  uint32_t base = r->nblocks;
  for (uint32_t j = 0; j < keep; j++)
    if (ch[j].e != KVS_BLOCK_NONE) {
      tierbook_busy(c, ch[j].e, 1);
      tierbook_touch(c, ch[j].e, (int)ch[j].t); /* out of the victims' way */
    }
  for (uint32_t j = 0; j < keep; j++)
    if (ch[j].b != KVS_BLOCK_NONE) {
      blk_hit(c, ch[j].b);
      r->blocks[base + j] = ch[j].b;
      ndev++;
    }
  for (uint32_t j = 0; j < keep; j++) {
    if (ch[j].e == KVS_BLOCK_NONE)
      continue;
    uint32_t b = blk_take(c);
    blk *x = &c->blocks[b];
    c->bhash[b] = ch[j].h;
    btok_set(c, b, tokens + (size_t)(base + j) * bs);
    x->sealed = 1; /* not indexed until its bytes are there */
    x->pins++;     /* until core_promote_finish */
    x->ref++;
    r->blocks[base + j] = b;
    core_promo *p = &promos[out->npromos++];
    p->block = b;
    p->pos = base + j;
    p->entry = ch[j].e;
    p->tier = ch[j].t;
    p->slot = c->tents[ch[j].e].slot[ch[j].t];
    p->hash = ch[j].h;
    p->parent = j ? ch[j - 1].h : chain0;
    out->tier_blocks[ch[j].t]++;
  }
  r->nblocks = r->sealed = base + keep;
  r->slots = r->written = r->nblocks * bs;
  r->chain = ch[keep - 1].h;
  c->st.hit_tokens += (uint64_t)ndev * bs;
  c->st.hit_blocks += ndev;
  c->st.miss_blocks -= keep;
  c->st.allocated_blocks += lower;
  out->device_blocks += ndev;
  out->hit_tokens = r->nblocks * bs;
  free(ch);
  return 0;
}

uint32_t core_promote_finish(core *c, core_req *r, const core_promo *p,
                             uint32_t n, const int *ok) {
  const uint32_t bs = c->cfg.block_size;
  uint32_t bad = tierbook_fills_end(c, p, n, ok);

  if (r != NULL && bad < n) { /* the request's prefix ends before it */
    uint32_t keep = p[bad].pos;
    for (uint32_t i = r->nblocks; i-- > keep;)
      blk_put(c, r->blocks[i]);
    r->nblocks = r->sealed = keep;
    r->slots = r->written = keep * bs;
    r->chain = keep ? c->bhash[r->blocks[keep - 1]] : c->cfg.root;
  }
  for (uint32_t i = 0; i < n; i++)
    core_unpin(c, p[i].block);
  return r != NULL ? r->nblocks * bs : 0;
}

static int alloc_common(core *c, core_req *r, uint32_t n, core_cow *cow,
                        uint32_t reserve) {
  const uint32_t bs = c->cfg.block_size;
  int rc;
  if (cow != NULL)
    cow->src = cow->dst = KVS_BLOCK_NONE;
  if (r->swap)
    return KVS_ESTATE;
  if (n == 0)
    return 0;
  uint64_t end = (uint64_t)r->slots + n;
  if (end > UINT32_MAX - bs)
    return KVS_ERANGE;
  /* Shared with another request: pins are not holders (a block the daemon
   * is copying into or out of is written only after the copy lands). */
  const blk *last_blk = r->nblocks ? &c->blocks[r->blocks[r->nblocks - 1]] : NULL;
  int need_cow = core_in_block(c, r->slots) != 0 &&
                 last_blk->ref - last_blk->pins > 1;
  uint32_t new_blocks = core_blocks_for(c, end) - r->nblocks;
  uint64_t need = (uint64_t)new_blocks + (uint64_t)need_cow;
  if (need_cow && cow == NULL)
    return KVS_EINVAL;
  if ((uint64_t)c->fq_len - c->nbusy < need + reserve) {
    c->st.no_space++;
    return KVS_ENOSPC;
  }
  if ((rc = grow(&r->blocks, &r->cap_blocks, (uint64_t)r->nblocks + new_blocks)) != 0)
    return rc;
  if (need_cow) {
    uint32_t last = r->nblocks - 1;
    uint32_t src = r->blocks[last];
    uint32_t dst = blk_take(c);
    blk_put(c, src); /* ref > 1: stays in use by its other holders */
    r->blocks[last] = dst;
    cow->src = src;
    cow->dst = dst;
    c->st.cow_copies++;
  }
  uint32_t *tbl = r->blocks + r->nblocks;
  for (uint32_t i = 0; i < new_blocks; i++)
    tbl[i] = blk_take(c);
  r->nblocks += new_blocks;
  r->slots = (uint32_t)end;
  c->st.allocated_blocks += need;
  return 0;
}

int core_allocate(core *c, core_req *r, uint32_t n, core_cow *cow) {
  return alloc_common(c, r, n, cow, c->cfg.reserve_blocks);
}

int core_append(core *c, core_req *r, uint32_t n, core_cow *cow) {
  return alloc_common(c, r, n, cow, 0);
}

/* Seal blocks [r->sealed, full) of r, whose tokens are all known. */
static uint32_t seal_blocks(core *c, core_req *r, uint32_t full) {
  const uint32_t bs = c->cfg.block_size;
  uint32_t n = 0;
  kvs_hash128 hs[LOOKAHEAD];
  for (uint32_t i = r->sealed; i < full; i++) {
    const uint32_t *t = r->tokens + (size_t)i * bs;
    uint32_t k = (i - r->sealed) % LOOKAHEAD;
    if (k == 0)
      hash_ahead(c, r->chain, r->salt, t,
                 full - i < LOOKAHEAD ? full - i : LOOKAHEAD, hs);
    kvs_hash128 h = hs[k];
    uint32_t b = r->blocks[i];
    blk *x = &c->blocks[b];
    kvs_hash128 parent = r->chain;
    r->chain = h;
    if (x->sealed) /* shared with a fork sibling that sealed it (same hash:
                      checked by the caller) */
      continue;
    c->bhash[b] = h;
    x->sealed = 1;
    btok_set(c, b, t);
    uint32_t other = hidx_find(&c->index, h);
    if (other == KVS_BLOCK_NONE) {
      hidx_insert(&c->index, h, b);
      x->indexed = 1;
      if (__builtin_expect(c->nobs != 0, 0))
        obs_sealed(c, h, i ? &parent : NULL, t, b, i);
    } else {
      c->st.duplicate_blocks++;
      if (c->btok != NULL &&
          memcmp(btok(c, other), t, (size_t)bs * sizeof(uint32_t)) != 0)
        c->st.collisions++;
    }
    c->st.sealed_blocks++;
    n++;
  }
  r->sealed = full;
  return n;
}

/* Would sealing up to `full` with the request's (future) tokens meet a block
 * already sealed with another hash?  tokens/start describe the commit. */
static int seal_conflicts(const core *c, const core_req *r, uint32_t full,
                          const uint32_t *tokens, uint32_t start) {
  const uint32_t bs = c->cfg.block_size;
  int any = 0;
  for (uint32_t i = r->sealed; i < full && !any; i++)
    any = c->blocks[r->blocks[i]].sealed;
  if (!any)
    return 0;
  uint32_t *tmp = malloc((size_t)bs * sizeof(uint32_t));
  if (tmp == NULL)
    return KVS_ENOMEM;
  kvs_hash128 parent = r->chain;
  int rc = 0;
  for (uint32_t i = r->sealed; i < full && rc == 0; i++) {
    for (uint32_t k = 0; k < bs; k++) {
      uint32_t p = i * bs + k;
      tmp[k] = p < r->known ? r->tokens[p] : tokens[p - start];
    }
    kvs_hash128 h = blk_hash(c, parent, r->salt, tmp);
    const blk *x = &c->blocks[r->blocks[i]];
    if (x->sealed && !h_eq(c->bhash[r->blocks[i]], h))
      rc = KVS_EMISMATCH;
    parent = h;
  }
  free(tmp);
  return rc;
}

int core_commit(core *c, core_req *r, uint32_t start, const uint32_t *tokens,
                uint32_t n, uint32_t *sealed) {
  int rc;
  if (sealed != NULL)
    *sealed = 0;
  if (r->swap)
    return KVS_ESTATE;
  if (start > r->written)
    return KVS_ERANGE;
  uint64_t end = (uint64_t)start + n;
  if (end > r->slots)
    return KVS_ERANGE;
  if (tokens == NULL) {
    if (end > r->known)
      return KVS_EINVAL;
  } else {
    for (uint32_t p = start; p < end && p < r->known; p++)
      if (r->tokens[p] != tokens[p - start])
        return KVS_EMISMATCH;
  }
  uint32_t new_written = end > r->written ? (uint32_t)end : r->written;
  uint32_t full = core_full_blocks(c, new_written);
  if ((rc = grow(&r->tokens, &r->cap_tokens, end)) != 0)
    return rc;
  if ((rc = seal_conflicts(c, r, full, tokens, start)) != 0)
    return rc;
  if (tokens != NULL && end > r->known) {
    memcpy(r->tokens + r->known, tokens + (r->known - start),
           (size_t)(end - r->known) * sizeof(uint32_t));
    r->known = (uint32_t)end;
  }
  r->written = new_written;
  uint32_t s = seal_blocks(c, r, full);
  if (sealed != NULL)
    *sealed = s;
  return 0;
}

int core_fork(core *c, core_req *r, core_req **child) {
  core_req *k;
  int rc;
  *child = NULL;
  if (r->swap)
    return KVS_ESTATE;
  if (r->written != r->slots)
    return KVS_ESTATE; /* unwritten slots would be written by both */
  if ((rc = core_req_create(c, NULL, 0, &k)) != 0)
    return rc;
  if ((rc = grow(&k->blocks, &k->cap_blocks, r->nblocks)) != 0 ||
      (rc = grow(&k->tokens, &k->cap_tokens, r->known)) != 0) {
    core_req_free(c, k);
    return rc;
  }
  if (r->nblocks)
    memcpy(k->blocks, r->blocks, (size_t)r->nblocks * sizeof(uint32_t));
  if (r->known)
    memcpy(k->tokens, r->tokens, (size_t)r->known * sizeof(uint32_t));
  for (uint32_t i = 0; i < r->nblocks; i++)
    c->blocks[r->blocks[i]].ref++; /* held by r already: in use, off queue */
  k->nblocks = r->nblocks;
  k->known = r->known;
  k->slots = r->slots;
  k->written = r->written;
  k->sealed = r->sealed;
  k->chain = r->chain;
  k->salt = r->salt;
  *child = k;
  return 0;
}

uint32_t core_req_num_slots(const core_req *r) { return r->slots; }
uint32_t core_req_num_known(const core_req *r) { return r->known; }
uint32_t core_req_num_written(const core_req *r) { return r->written; }
uint32_t core_req_num_sealed(const core_req *r) { return r->sealed; }
const uint32_t *core_req_blocks(const core_req *r, uint32_t *n) {
  *n = r->nblocks;
  return r->blocks;
}
void core_req_set_udata(core_req *r, void *udata) { r->udata = udata; }
void *core_req_udata(const core_req *r) { return r->udata; }

int core_block_get(const core *c, uint32_t b, core_block_info *info) {
  if (b >= c->cfg.num_blocks)
    return KVS_ERANGE;
  const blk *x = &c->blocks[b];
  info->ref = x->ref;
  info->pins = x->pins;
  info->busy = x->busy;
  info->indexed = x->indexed;
  info->hash = c->bhash[b];
  info->state = x->ref > 0     ? CORE_BLOCK_IN_USE
                : x->indexed ? CORE_BLOCK_CACHED
                             : CORE_BLOCK_FREE;
  return 0;
}

void core_get_stats(const core *c, core_stats *st) {
  *st = c->st;
  st->num_blocks = c->cfg.num_blocks;
  st->cached_blocks = c->ncached;
  st->free_blocks = c->fq_len - c->ncached;
  st->used_blocks = c->cfg.num_blocks - c->fq_len;
  st->num_requests = c->nreqs;
  st->indexed_blocks = c->index.count;
}

void core_set_observer(core *c, const core_observer *obs) {
  memset(c->obs, 0, sizeof(c->obs));
  c->nobs = 0;
  if (obs != NULL)
    core_add_observer(c, obs);
}

int core_add_observer(core *c, const core_observer *obs) {
  if (c->nobs == CORE_OBSERVERS)
    return KVS_ELIMIT;
  c->obs[c->nobs++] = *obs;
  return 0;
}

void core_remove_observer(core *c, void *arg) {
  uint32_t j = 0;

  for (uint32_t i = 0; i < c->nobs; i++)
    if (c->obs[i].arg != arg)
      c->obs[j++] = c->obs[i];
  memset(&c->obs[j], 0, (c->nobs - j) * sizeof(c->obs[0]));
  c->nobs = j;
}

/* ---- invariant check --------------------------------------------------- */

int core_check(const core *c, char *msg, size_t msg_len) {
  const uint32_t nb = c->cfg.num_blocks, bs = c->cfg.block_size;
  int rc = 0;
  /* Room for the bitmap it becomes below too: one word is more than the
   * counters of a pool of one block. */
  const size_t words = ((size_t)nb + 63) / 64 * sizeof(uint64_t);
  const size_t counts = (size_t)nb * sizeof(uint32_t);
  uint32_t *holders = core_big_alloc(counts > words ? counts : words, 1);
  if (holders == NULL)
    return KVS_ENOMEM;
  if (msg != NULL && msg_len > 0)
    msg[0] = '\0';

  uint32_t nreqs = 0;
  for (const core_req *r = c->reqs; r != NULL; r = r->next, nreqs++) {
    if (r->next != NULL && r->next->prev != r)
      CHECK_FAIL("request list broken after request %u", nreqs);
    if (r->nblocks != core_blocks_for(c, r->slots))
      CHECK_FAIL("request %u: %u blocks for %u slots", nreqs, r->nblocks, r->slots);
    if (r->written > r->slots || r->written > r->known)
      CHECK_FAIL("request %u: written %u > slots %u or known %u", nreqs, r->written,
           r->slots, r->known);
    if (r->sealed != r->written / bs)
      CHECK_FAIL("request %u: %u sealed blocks, %u written tokens", nreqs, r->sealed,
           r->written);
    kvs_hash128 parent = c->cfg.root;
    for (uint32_t i = 0; i < r->nblocks; i++) {
      uint32_t b = r->blocks[i];
      if (b >= nb)
        CHECK_FAIL("request %u slot %u: block %u out of range", nreqs, i, b);
      holders[b]++;
      if (i < r->sealed) {
        const blk *x = &c->blocks[b];
        kvs_hash128 h = blk_hash(c, parent, r->salt, r->tokens + (size_t)i * bs);
        if (!x->sealed || !h_eq(c->bhash[b], h))
          CHECK_FAIL("request %u: sealed block %u (index %u) has the wrong hash",
               nreqs, b, i);
        parent = h;
      }
    }
    if (!h_eq(parent, r->chain))
      CHECK_FAIL("request %u: chain hash does not match its last sealed block", nreqs);
  }
  if (nreqs != c->nreqs)
    CHECK_FAIL("%u requests listed, %u counted", nreqs, c->nreqs);

  uint32_t ref0 = 0, indexed = 0, cached = 0;
  for (uint32_t b = 0; b < nb; b++) {
    const blk *x = &c->blocks[b];
    if (x->ref != holders[b] + x->pins)
      CHECK_FAIL("block %u: ref %u but %u holders and %u pins", b, x->ref,
           holders[b], x->pins);
    if ((x->ref == 0) != (x->on_queue != 0))
      CHECK_FAIL("block %u: ref %u but %s the free queue", b, x->ref,
           x->on_queue ? "on" : "off");
    if (x->indexed && !x->sealed)
      CHECK_FAIL("block %u: indexed but not sealed", b);
    if (x->ref == 0 && !x->indexed && x->sealed)
      CHECK_FAIL("block %u: FREE but still sealed", b);
    indexed += x->indexed;
    ref0 += x->ref == 0;
    cached += x->ref == 0 && x->indexed;
  }
  if (indexed != c->index.count)
    CHECK_FAIL("%u indexed blocks, index holds %u", indexed, c->index.count);
  if (cached != c->ncached)
    CHECK_FAIL("%u cached blocks, counter says %u", cached, c->ncached);
  if (ref0 != c->fq_len)
    CHECK_FAIL("%u blocks with ref 0, free queue length %u", ref0, c->fq_len);

  uint32_t n = 0, prev = KVS_BLOCK_NONE;
  for (uint32_t b = c->fq_head; b != KVS_BLOCK_NONE; b = c->blocks[b].next) {
    if (b >= nb || n > nb)
      CHECK_FAIL("free queue: bad link to %u", b);
    if (c->blocks[b].prev != prev)
      CHECK_FAIL("free queue: block %u prev %u, expected %u", b, c->blocks[b].prev,
           prev);
    if (!c->blocks[b].on_queue)
      CHECK_FAIL("free queue: block %u not marked on queue", b);
    prev = b;
    n++;
  }
  if (prev != c->fq_tail || n != c->fq_len)
    CHECK_FAIL("free queue: %u linked, length %u, tail mismatch", n, c->fq_len);

  /* Each indexed block is found by its hash: the index reaches each of its
   * entries (hidx_check), each entry points at an indexed block holding
   * its hash, no two at the same block, and there are as many entries as
   * indexed blocks (checked above).  One pass over the slots, in order,
   * instead of a probe per block. */
  uint64_t bad;
  if (hidx_check(&c->index, &bad) != 0)
    CHECK_FAIL("index slot %llu: entry not reachable from its home slot, or "
               "count %u wrong", (unsigned long long)bad, c->index.count);
  /* holders' memory, now a bitmap of the blocks a slot names (nb bits; it
   * stays in cache where nb words would not) */
  uint64_t *seen = (uint64_t *)holders;
  memset(seen, 0, words);
  for (uint64_t i = 0; i < c->index.nslots; i++) {
    const hidx_entry *e = &c->index.slots[i];
    if (i + 16 < c->index.nslots && c->index.slots[i + 16].b < nb) {
      __builtin_prefetch(&c->blocks[c->index.slots[i + 16].b]);
      __builtin_prefetch(&c->bhash[c->index.slots[i + 16].b]);
    }
    if (e->b == KVS_BLOCK_NONE)
      continue;
    uint64_t bit = e->b < nb ? 1ull << (e->b % 64) : 0;
    if (e->b >= nb || !c->blocks[e->b].indexed ||
        !hidx_is(e, c->bhash[e->b]) || (seen[e->b / 64] & bit) != 0)
      CHECK_FAIL("index slot %llu: points at block %u which does not hold its "
                 "hash, or at a block another slot names",
                 (unsigned long long)i, e->b);
    seen[e->b / 64] |= bit;
  }
  rc = tierbook_check(c, msg, msg_len);
  if (rc == 0 && c->policy->check != NULL)
    rc = c->policy->check(c, msg, msg_len);
out:
  free(holders);
  return rc;
}

void core_stats_add(core_stats *acc, const core_stats *x) {
#define ADD(f) acc->f += x->f
  ADD(num_blocks);
  ADD(free_blocks);
  ADD(cached_blocks);
  ADD(used_blocks);
  ADD(num_requests);
  ADD(lookups);
  ADD(query_tokens);
  ADD(hit_tokens);
  ADD(hit_blocks);
  ADD(miss_blocks);
  ADD(allocated_blocks);
  ADD(evictions);
  ADD(cow_copies);
  ADD(sealed_blocks);
  ADD(duplicate_blocks);
  ADD(collisions);
  ADD(no_space);
  ADD(tier_lost);
  ADD(swapped_requests);
  ADD(swap_outs);
  ADD(swap_ins);
  ADD(swap_failures);
  ADD(swap_out_blocks);
  ADD(swap_kept_blocks);
  ADD(swap_in_blocks);
  ADD(swap_resident_blocks);
  ADD(indexed_blocks);
#undef ADD
}
