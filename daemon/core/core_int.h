/*
 * core_int.h — the core's internal structures, shared by its modules only.
 */
#ifndef KVS_CORE_INT_H
#define KVS_CORE_INT_H

#include <assert.h>
#include <string.h>

#include "core.h"

/* One block of the pool: 16 bytes of hot metadata (what allocation and
 * release touch), plus its hash in core.bhash and block_size token ids in
 * core.btok, both valid when it is sealed. */
typedef struct blk {
  uint32_t ref;
  uint32_t prev, next; /* free-queue links, KVS_BLOCK_NONE at the ends */
  uint8_t on_queue : 1;
  uint8_t sealed : 1;  /* bhash and btok valid */
  uint8_t indexed : 1; /* hash present in the prefix index, pointing here */
  uint8_t busy : 1;    /* its bytes are being copied down a tier: never
                          taken for reuse until that is done */
  uint8_t pins;        /* references held by core_pin (counted in ref too) */
  uint16_t pol;        /* the eviction policy's own bits (0 when taken) */
} blk;
_Static_assert(sizeof(blk) == 16, "hot block record is 16 bytes");

/* Prefix index: open addressing, linear probing, backward-shift deletion.
 * At most max_entries entries in 1.5x as many slots (load <= 2/3: an
 * unsuccessful probe reads about five slots, two cache lines, when full);
 * a hash's home slot is its lo scaled to the table (multiply-shift), so
 * the table needs no power-of-two size.  A slot
 * keeps 96 of the hash's 128 bits (lo, and the low half of hi), so that it
 * is 16 bytes, four to a cache line: two hashes equal in those 96 bits
 * would share an entry, which among n blocks has a chance of about
 * n^2 / 2^97 (1e-16 for ten million); with verify_tokens a hit still
 * compares the token ids. */
typedef struct hidx_entry {
  uint64_t lo;
  uint32_t hi; /* the low 32 bits of the hash's hi */
  uint32_t b;  /* KVS_BLOCK_NONE = empty slot */
} hidx_entry;
_Static_assert(sizeof(hidx_entry) == 16, "index slot is 16 bytes");

static inline int hidx_is(const hidx_entry *e, kvs_hash128 h) {
  return e->lo == h.lo && e->hi == (uint32_t)h.hi;
}

typedef struct hidx {
  hidx_entry *slots;
  uint64_t nslots;
  uint32_t count;
} hidx;

static inline uint64_t hidx_home(const hidx *x, uint64_t lo) {
  return (uint64_t)(((unsigned __int128)lo * x->nslots) >> 64);
}

int hidx_init(hidx *x, uint32_t max_entries);
/* malloc (zero: calloc) for the big arrays: from 2 MiB up, on
 * transparent huge pages where the kernel allows them.  free() frees it. */
void *core_big_alloc(size_t bytes, int zero);
void hidx_destroy(hidx *x);
uint32_t hidx_find(const hidx *x, kvs_hash128 h);
/* h must not be present. */
void hidx_insert(hidx *x, kvs_hash128 h, uint32_t b);
/* Starts fetching h's home slot (a probe soon after finds it in cache). */
static inline void hidx_prefetch(const hidx *x, kvs_hash128 h) {
  __builtin_prefetch(&x->slots[hidx_home(x, h.lo)]);
}
/* Removes h (which must be present). */
void hidx_remove(hidx *x, kvs_hash128 h);
/* The table's own invariant: every entry reachable from its home slot (no
 * empty slot between them) and count entries in all.  0, or -1 with *bad =
 * the first slot out of place (nslots: the count is wrong). */
int hidx_check(const hidx *x, uint64_t *bad);

/* Ghosts (ghost.c): the hashes of the last `max` evicted blocks, each with
 * a 16-bit value, for policies that remember what they evicted.  FIFO: the
 * oldest is forgotten first.  Memory grows with the ghosts held (to about
 * 70 bytes each at max), never past max. */
typedef struct ghosts {
  kvs_hash128 *ring;
  uint16_t *val;
  uint32_t cap, max, pos, filled;
  uint32_t nonzero; /* live ghosts with a non-zero value */
  hidx idx;         /* hash -> ring position (live ghosts only) */
} ghosts;

/* Holds nothing until the first add: allocates nothing. */
void ghosts_init(ghosts *g, uint64_t max);
void ghosts_destroy(ghosts *g);
/* Remembers h with value v (a ghost of h already there is replaced). */
void ghosts_add(ghosts *g, kvs_hash128 h, uint16_t v);
/* 1 and *v when h is remembered (the ghost is spent), else 0. */
int ghosts_take(ghosts *g, kvs_hash128 h, uint16_t *v);
static inline uint32_t ghosts_live(const ghosts *g) {
  return g->cap ? g->idx.count : 0;
}
int ghosts_check(const ghosts *g, char *msg, size_t msg_len);

/* Eviction policy.  The free queue is kept in eviction order and allocation
 * always takes its head (blk_take); a policy decides where a released block
 * goes on the queue, and sees every block leave it.  The queue itself
 * (pool_fq_*) is shared by all policies; what a policy keeps beside it lives
 * in core.pol (from init) and in each block's blk.pol bits.  Every hook is
 * O(1) in the pool size (mq: O(levels); opt: O(buckets / 4096)). */
typedef struct core_policy {
  const char *name;
  int offline;  /* needs the future (core_policy_hint): the replayer only */
  int (*init)(core *c);     /* optional; KVS_ENOMEM */
  void (*destroy)(core *c); /* optional */
  /* b's ref reached 0; cached: its hash stays indexed (CACHED), else FREE.
   * The policy puts b on the queue. */
  void (*release)(core *c, uint32_t b, int cached);
  /* A lookup hits sealed block b; when its ref is 0 (on the queue) the
   * policy takes it off. */
  void (*hit)(core *c, uint32_t b);
  /* Allocation takes b (FREE or CACHED, near the head) off the queue. */
  void (*evict)(core *c, uint32_t b);
  /* Optional: what the caller knows of b's future (core_policy_hint). */
  void (*hint)(core *c, uint32_t b, uint32_t value);
  /* Optional: the policy's part of core_check. */
  int (*check)(const core *c, char *msg, size_t msg_len);
} core_policy;

extern const core_policy core_policy_lru;
extern const core_policy core_policy_slru;
extern const core_policy core_policy_mq;
extern const core_policy core_policy_opt;

/* ---- lower tiers (tierbook.c) ------------------------------------------------
 * An entry is one sealed block's bytes below the device pool, found by its
 * hash (core.tindex), with a slot in the host tier, the disk tier, or both.
 * Each tier keeps its slots' entries in LRU order (head: next to drop). */
typedef struct tent {
  kvs_hash128 h;
  uint32_t slot[CORE_TIERS];  /* KVS_BLOCK_NONE when none in that tier */
  uint32_t prev[CORE_TIERS], next[CORE_TIERS]; /* the tier's LRU */
  uint8_t valid[CORE_TIERS];  /* the slot holds the bytes (else: being
                                 written) */
  uint8_t used;               /* allocated (else on the free list: next[0]) */
  uint8_t bad;                /* bit t: tier t's bytes failed a read; the
                                 copy goes when busy drops to 0 */
  uint8_t priv;               /* a swapped request's own copy (an unsealed
                                 block): not in the tier index */
  uint16_t busy;              /* moves and promotions reading or writing it */
  uint16_t hold;              /* swapped-out requests keeping it (swap.c):
                                 off the LRUs, never dropped */
} tent;

typedef struct tier {
  uint32_t nslots;     /* 0: no such tier */
  uint32_t *free_slots;
  uint32_t nfree;
  uint32_t head, tail; /* LRU of the entries holding a slot here (held
                          ones are not in it) */
  core_tier_stats st;  /* st.held: slots of held entries */
} tier;

/* Set up / free the tiers of cfg (no-ops without tiers). */
int tierbook_init(core *c);
void tierbook_destroy(core *c);
/* Block b, CACHED, is being evicted: its hash leaves the device. */
void tierbook_on_evict(core *c, uint32_t b);
/* The tiers' part of core_check. */
int tierbook_check(const core *c, char *msg, size_t msg_len);
/* The entry of hash h, or KVS_BLOCK_NONE; its stored tokens (NULL without
 * verify_tokens). */
uint32_t tierbook_find(const core *c, kvs_hash128 h);
const uint32_t *tierbook_tokens(const core *c, uint32_t e);
/* Entry e to the most recently used end of tier t's LRU. */
void tierbook_touch(core *c, uint32_t e, int t);
/* Entry e to the least recently used end of tier t's LRU (a promoted
 * copy: the device holds the block now, this copy is the first to go). */
void tierbook_cold(core *c, uint32_t e, int t);
/* I/O on entry e starts (+1) or ends (-1). */
void tierbook_busy(core *c, uint32_t e, int delta);
/* Entry e's copy in tier t is bad: nobody reads it from now on, and its
 * slot goes back once no I/O uses it (at once when none does). */
void tierbook_forget(core *c, uint32_t e, int t);
/* e's copy in tier t is readable or not (observers told of changes). */
void tierbook_valid(core *c, uint32_t e, int t, int v);
static inline int tierbook_any(const core *c);
/* For swap.c: a new entry (priv: not in the tier index); a free slot of
 * tier t, dropping its coldest entry that can go at once (NONE when none
 * can); entry e gets slot s of tier t. */
uint32_t tierbook_ent_new(core *c, kvs_hash128 h, const uint32_t *tokens,
                      int priv);
uint32_t tierbook_slot_take(core *c, int t);
void tierbook_slot_give(core *c, int t, uint32_t e, uint32_t s, int valid);
/* The tier device blocks go down to (host when there is one). */
int tierbook_first(const core *c);
/* A swapped request keeps entry e (+1) or lets it go (-1): a held entry
 * is off its tiers' LRUs and never dropped to make room; let go, it goes
 * back to the cold end of each LRU (a private one is forgotten). */
int tierbook_hold(core *c, uint32_t e);
void tierbook_unhold(core *c, uint32_t e);
/* Fills of device blocks from copies below, p[0..n), ended (ok[i]; NULL:
 * none good): counted per tier, a failed copy dropped, busy ended; good
 * sealed blocks before the first failure join the prefix index.  Returns
 * the index of the first failure (n: none). */
uint32_t tierbook_fills_end(core *c, const core_promo *p, uint32_t n,
                        const int *ok);
/* The swaps' part of core_check. */
int swap_check(const core *c, char *msg, size_t msg_len);
/* r's swap ends (r freed, or swapped in): it lets go of what it holds. */
void swap_req_free(core *c, core_req *r);

struct core_req {
  core_req *prev, *next; /* all requests of the core */
  uint32_t *blocks;
  uint32_t nblocks, cap_blocks;
  uint32_t *tokens;
  uint32_t known, cap_tokens;
  uint32_t slots, written, sealed;
  kvs_hash128 chain; /* hash of blocks[sealed - 1], or the root */
  kvs_hash128 salt;  /* digest of the request's salt; zero for none */
  void *udata;
  /* swap (swap.c): while swapped out the block table is empty and swent
   * names, per block, the tier entry holding its bytes; sw_* keep the
   * counters the table had. */
  uint8_t swap;      /* CORE_SWAP_* */
  uint32_t *swent;
  uint32_t sw_n, sw_slots, sw_written, sw_sealed;
  kvs_hash128 sw_chain;
};

struct core {
  core_config cfg;
  const core_policy *policy;
  void *pol;          /* the policy's state (init) */
  blk *blocks;
  kvs_hash128 *bhash; /* num_blocks hashes of sealed blocks */
  uint32_t *btok; /* num_blocks * block_size token ids of sealed blocks
                     (NULL without verify_tokens and keep_tokens) */
  uint32_t fq_head, fq_tail, fq_len;
  uint32_t ncached;
  int bs_shift; /* log2(block_size), or -1 when not a power of two */
  hidx index;
  core_req *reqs;
  uint32_t nreqs;
  /* Freed requests kept for the next core_req_create (linked by next), with
   * their block and token arrays when those are small: a scheduler step
   * frees and creates requests by the dozen, and each create/free pair was
   * a calloc, two reallocs and three frees. */
  core_req *spare;
  uint32_t nspare;
  core_stats st; /* counters; block counts are derived in core_get_stats */
  /* lower tiers (tierbook.c); nothing allocated without tiers */
  tier tiers[CORE_TIERS];
  tent *tents;
  uint32_t ntents, tent_free; /* capacity; free list head */
  uint32_t *ttok;             /* ntents * block_size token ids */
  hidx tindex;                /* hash -> entry */
  uint32_t nbusy;             /* blocks on the free queue being copied
                                 down (allocation skips them) */
  uint32_t ndown;             /* blocks being copied down, on the free
                                 queue or not (a lookup may hold them):
                                 at most tier_window */
  core_observer obs[CORE_OBSERVERS]; /* index events: obs[0..nobs) */
  uint32_t nobs;
  /* a restore (core_tier_restore_*) in progress: tier + 1 (0: none), the
   * gen of each entry, which slots are taken */
  int restoring;
  uint64_t *rgen;
  uint8_t *rtaken;
};

static inline int tierbook_any(const core *c) {
  return c->tiers[CORE_TIER_HOST].nslots || c->tiers[CORE_TIER_DISK].nslots;
}

/* The free queue: an intrusive doubly-linked list of the ref-0 blocks in
 * eviction order (head = next to be allocated).  All O(1); inline because
 * allocation and release run them once per block. */
static inline void pool_fq_push_head(core *c, uint32_t b) {
  blk *x = &c->blocks[b];
  assert(!x->on_queue && x->ref == 0);
  x->prev = KVS_BLOCK_NONE;
  x->next = c->fq_head;
  if (c->fq_head != KVS_BLOCK_NONE)
    c->blocks[c->fq_head].prev = b;
  else
    c->fq_tail = b;
  c->fq_head = b;
  x->on_queue = 1;
  c->fq_len++;
}

static inline void pool_fq_push_tail(core *c, uint32_t b) {
  blk *x = &c->blocks[b];
  assert(!x->on_queue && x->ref == 0);
  x->next = KVS_BLOCK_NONE;
  x->prev = c->fq_tail;
  if (c->fq_tail != KVS_BLOCK_NONE)
    c->blocks[c->fq_tail].next = b;
  else
    c->fq_head = b;
  c->fq_tail = b;
  x->on_queue = 1;
  c->fq_len++;
}

/* b onto the queue just before block `at` (on the queue), or at the tail
 * when at is KVS_BLOCK_NONE. */
static inline void pool_fq_insert_before(core *c, uint32_t b, uint32_t at) {
  if (at == KVS_BLOCK_NONE) {
    pool_fq_push_tail(c, b);
    return;
  }
  blk *x = &c->blocks[b], *y = &c->blocks[at];
  assert(!x->on_queue && x->ref == 0 && y->on_queue);
  x->next = at;
  x->prev = y->prev;
  if (y->prev != KVS_BLOCK_NONE)
    c->blocks[y->prev].next = b;
  else
    c->fq_head = b;
  y->prev = b;
  x->on_queue = 1;
  c->fq_len++;
}

static inline void pool_fq_unlink(core *c, uint32_t b) {
  blk *x = &c->blocks[b];
  assert(x->on_queue);
  if (x->prev != KVS_BLOCK_NONE)
    c->blocks[x->prev].next = x->next;
  else
    c->fq_head = x->next;
  if (x->next != KVS_BLOCK_NONE)
    c->blocks[x->next].prev = x->prev;
  else
    c->fq_tail = x->prev;
  x->prev = x->next = KVS_BLOCK_NONE;
  x->on_queue = 0;
  c->fq_len--;
}

static inline uint32_t pool_fq_pop_head(core *c) {
  uint32_t b = c->fq_head;
  assert(b != KVS_BLOCK_NONE);
  pool_fq_unlink(c, b);
  return b;
}

/* Block arithmetic without a division when block_size is a power of two. */
static inline uint32_t core_blocks_for(const core *c, uint64_t tokens) {
  if (c->bs_shift >= 0)
    return (uint32_t)((tokens + c->cfg.block_size - 1) >> c->bs_shift);
  return (uint32_t)((tokens + c->cfg.block_size - 1) / c->cfg.block_size);
}

static inline uint32_t core_full_blocks(const core *c, uint32_t tokens) {
  return c->bs_shift >= 0 ? tokens >> c->bs_shift : tokens / c->cfg.block_size;
}

static inline uint32_t core_in_block(const core *c, uint32_t pos) {
  return c->bs_shift >= 0 ? pos & (c->cfg.block_size - 1)
                          : pos % c->cfg.block_size;
}

/* core_check and its parts: the first violation goes into msg. */
#define CHECK_FAIL(...)                                                      \
  do {                                                                       \
    if (msg != NULL && msg_len > 0)                                          \
      snprintf(msg, msg_len, __VA_ARGS__);                                   \
    rc = KVS_EINTERNAL;                                                      \
    goto out;                                                                \
  } while (0)

/* ---- blocks (core.c, swap.c) --------------------------------------------- */

static inline int h_eq(kvs_hash128 a, kvs_hash128 b) {
  return a.lo == b.lo && a.hi == b.hi;
}

/* Block b's stored token ids: NULL without verify_tokens or keep_tokens
 * (none kept). */
static inline uint32_t *btok(const core *c, uint32_t b) {
  return c->btok != NULL ? c->btok + (size_t)b * c->cfg.block_size : NULL;
}

/* Stores block b's token ids when they are kept (verify_tokens). */
static inline void btok_set(core *c, uint32_t b, const uint32_t *t) {
  if (c->btok != NULL)
    memcpy(btok(c, b), t, (size_t)c->cfg.block_size * sizeof(uint32_t));
}

/* The observers (core_add_observer) hear of a hash entering the index
 * (obs_stored; obs_sealed when a commit wrote it, in block b) or leaving
 * it, and of copies below coming and going (obs_tier). */
static inline void obs_stored(core *c, kvs_hash128 h, const kvs_hash128 *parent,
                              const uint32_t *tokens) {
  for (uint32_t i = 0; i < c->nobs; i++)
    if (c->obs[i].stored != NULL)
      c->obs[i].stored(c->obs[i].arg, h, parent, tokens);
}

static inline void obs_sealed(core *c, kvs_hash128 h, const kvs_hash128 *parent,
                              const uint32_t *tokens, uint32_t b, uint32_t pos) {
  obs_stored(c, h, parent, tokens);
  for (uint32_t i = 0; i < c->nobs; i++)
    if (c->obs[i].sealed != NULL)
      c->obs[i].sealed(c->obs[i].arg, h, b, pos);
}

static inline void obs_tier(core *c, kvs_hash128 h, int t, int present) {
  for (uint32_t i = 0; i < c->nobs; i++)
    if (c->obs[i].tier != NULL)
      c->obs[i].tier(c->obs[i].arg, h, t, present);
}

static inline void obs_removed(core *c, kvs_hash128 h) {
  for (uint32_t i = 0; i < c->nobs; i++)
    if (c->obs[i].removed != NULL)
      c->obs[i].removed(c->obs[i].arg, h);
}

static inline kvs_hash128 blk_hash(const core *c, kvs_hash128 parent,
                                   kvs_hash128 salt, const uint32_t *tokens) {
  if (c->cfg.hash_fn != NULL)
    return c->cfg.hash_fn(parent, salt, tokens, c->cfg.block_size,
                          c->cfg.hash_arg);
  return core_block_hash(parent, salt, tokens, c->cfg.block_size);
}

/* Takes the head of the free queue (skipping blocks being copied down a
 * tier: at most nbusy of them); a CACHED block loses its hash (an
 * eviction).  Caller has checked the queue holds enough blocks (fq_len -
 * nbusy). */
static inline uint32_t blk_take(core *c) {
  uint32_t b = c->fq_head;
  while (__builtin_expect(c->blocks[b].busy, 0))
    b = c->blocks[b].next;
  c->policy->evict(c, b);
  blk *x = &c->blocks[b];
  x->pol = 0;
  if (x->indexed) {
    tierbook_on_evict(c, b);
    hidx_remove(&c->index, c->bhash[b]);
    if (__builtin_expect(c->nobs != 0, 0))
      obs_removed(c, c->bhash[b]);
    x->indexed = 0;
    c->ncached--;
    c->st.evictions++;
  }
  x->sealed = 0;
  x->ref = 1;
  return b;
}

/* A lookup hit: one more holder of b. */
static inline void blk_hit(core *c, uint32_t b) {
  blk *x = &c->blocks[b];
  c->policy->hit(c, b);
  if (x->ref == 0) {
    c->ncached--;
    c->nbusy -= x->busy;
  }
  x->ref++;
}

static inline void blk_put(core *c, uint32_t b) {
  blk *x = &c->blocks[b];
  assert(x->ref > 0);
  if (--x->ref > 0)
    return;
  c->nbusy += x->busy;
  if (x->indexed) {
    c->ncached++;
    c->policy->release(c, b, 1);
  } else {
    x->sealed = 0;
    c->policy->release(c, b, 0);
  }
}

/* Makes room for `need` entries in a request's array (core.c). */
int core_grow_slow(uint32_t **arr, uint32_t *cap, uint64_t need);
static inline int grow(uint32_t **arr, uint32_t *cap, uint64_t need) {
  return __builtin_expect(need <= *cap, 1) ? 0 : core_grow_slow(arr, cap, need);
}

#endif
