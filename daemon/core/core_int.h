/*
 * core_int.h — the core's internal structures, shared by its modules only.
 */
#ifndef KVS_CORE_INT_H
#define KVS_CORE_INT_H

#include "core.h"

/* One block of the pool: 40 bytes of metadata, plus block_size token ids in
 * core.btok when it is sealed. */
typedef struct blk {
  kvs_hash128 hash; /* valid when sealed */
  uint32_t ref;
  uint32_t prev, next; /* free-queue links, KVS_BLOCK_NONE at the ends */
  uint8_t on_queue;
  uint8_t sealed;  /* hash and btok valid */
  uint8_t indexed; /* hash present in the prefix index, pointing here */
  uint8_t pad_;
} blk;

/* Prefix index: open addressing, linear probing, backward-shift deletion.
 * At most num_blocks entries in 2x as many slots (load <= 0.5). */
typedef struct hidx_entry {
  kvs_hash128 h;
  uint32_t b; /* KVS_BLOCK_NONE = empty slot */
  uint32_t pad_;
} hidx_entry;

typedef struct hidx {
  hidx_entry *slots;
  uint64_t mask;
  uint32_t count;
} hidx;

int hidx_init(hidx *x, uint32_t max_entries);
void hidx_destroy(hidx *x);
uint32_t hidx_find(const hidx *x, kvs_hash128 h);
/* h must not be present. */
void hidx_insert(hidx *x, kvs_hash128 h, uint32_t b);
/* Removes h (which must be present). */
void hidx_remove(hidx *x, kvs_hash128 h);

/* Eviction policy: where freed blocks go on the free queue and which one an
 * allocation takes.  The queue itself (pool_fq_*) is shared by all policies. */
typedef struct core_policy {
  const char *name;
  /* b's ref reached 0; cached: its hash stays indexed (CACHED), else FREE. */
  void (*release)(core *c, uint32_t b, int cached);
  /* A lookup hit takes CACHED block b off the free queue. */
  void (*take)(core *c, uint32_t b);
  /* Removes and returns the block to allocate next (queue not empty). */
  uint32_t (*victim)(core *c);
} core_policy;

extern const core_policy core_policy_lru;

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
};

struct core {
  core_config cfg;
  const core_policy *policy;
  blk *blocks;
  uint32_t *btok; /* num_blocks * block_size token ids of sealed blocks */
  uint32_t fq_head, fq_tail, fq_len;
  uint32_t ncached;
  hidx index;
  core_req *reqs;
  uint32_t nreqs;
  core_stats st; /* counters; block counts are derived in core_get_stats */
};

/* Free queue (pool.c). */
void pool_fq_push_head(core *c, uint32_t b);
void pool_fq_push_tail(core *c, uint32_t b);
void pool_fq_unlink(core *c, uint32_t b);
uint32_t pool_fq_pop_head(core *c);

#endif
