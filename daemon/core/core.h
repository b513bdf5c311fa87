/*
 * core.h — the pure block-manager core of kvshared.
 *
 * The block pool, the prefix index, the chained block hash, the eviction
 * policy and the request-level operations.  No libuv, io_uring, CUDA or
 * socket header; no I/O; deterministic for a given sequence of calls.
 * Single-threaded: the daemon calls it from its loop thread only.
 *
 * Blocks (see ../shared/DESIGN.md):
 *   FREE    ref 0, on the free queue, no hash.
 *   CACHED  ref 0, on the free queue, hash indexed: reusable by a hit,
 *           evictable.
 *   IN USE  ref >= 1, off the free queue.
 * ref(b) == number of (request, slot) pairs that hold b, plus its pins.
 *
 * A request is a sequence of token positions.  For each request the core
 * keeps:
 *   blocks[]    its block table; slot p lives in blocks[p / block_size]
 *   num_slots   positions that have a slot (allocate/append add to it)
 *   known       token ids the core knows (from lookup's prompt or commit)
 *   written     positions [0, written) the client has committed as written
 *   sealed      full blocks hashed and published (blocks[0..sealed))
 *
 * Life of a request:  create -> lookup(prompt) -> allocate(n) -> the worker
 * writes K/V -> commit(...) -> append(1)/commit(...) per decode step -> free.
 * All operations are all-or-nothing: on an error nothing changes.
 */
#ifndef KVS_CORE_H
#define KVS_CORE_H

#include <stddef.h>
#include <stdint.h>

#include "kvs_layout.h"
#include "kvs_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvs_hash128 {
  uint64_t lo, hi;
} kvs_hash128;

typedef struct core core;
typedef struct core_req core_req;

/* Hash of one full block: H(parent || salt || tokens[0..n)).  The default is
 * XXH3-128; tests pass their own to force collisions. */
typedef kvs_hash128 (*core_hash_fn)(kvs_hash128 parent, kvs_hash128 salt,
                                    const uint32_t *tokens, uint32_t n,
                                    void *arg);

/* The tiers below the device pool. */
enum { CORE_TIER_HOST = 0, CORE_TIER_DISK = 1, CORE_TIERS = 2 };

typedef struct core_config {
  uint32_t num_blocks;     /* blocks in the pool (>= 1) */
  uint32_t block_size;     /* tokens per block (>= 1) */
  uint32_t reserve_blocks; /* watermark: allocate() keeps this many free
                              blocks for append() (decode of running
                              requests); 0 = none */
  kvs_hash128 root;        /* parent of block 0: core_root_hash() */
  int verify_tokens;       /* on a hit, compare stored token ids (1) */
  int keep_tokens;         /* keep sealed blocks' token ids even without
                              verify_tokens (for the observer's events) */
  const char *policy;      /* eviction policy name; NULL = "lru" */
  int allow_offline;       /* 1: an offline policy ("opt", which needs
                              core_policy_hint) may be chosen: the replayer */
  core_hash_fn hash_fn;    /* NULL = XXH3-128 */
  void *hash_arg;
  /* Lower tiers (0: none): slots of block_stride bytes in host memory and
   * on disk; see "Lower tiers" below. */
  uint32_t tier_slots[CORE_TIERS];
  uint32_t tier_window;    /* device blocks at the head of the free queue
                              that core_tier_plan keeps copied down (0:
                              num_blocks / 16, at least 8) */
  int tier_sync;           /* 1: a block evicted with no copy below is
                              copied down at once, as by an ideal
                              write-back (the replayer: no I/O to wait
                              for); 0: the daemon's background demotion */
} core_config;

/* Fills cfg with the defaults (verify_tokens = 1, policy "lru"). */
void core_config_init(core_config *cfg);

/* The root parent hash for a layout and a model id (any string). */
kvs_hash128 core_root_hash(const kvs_layout *layout, const char *model_id);
/* root salted with a tenant's name (docs/operations.md "Tenants"); root
 * itself when tenant is NULL or "". */
kvs_hash128 core_tenant_root(kvs_hash128 root, const char *tenant);

/* The default block hash (XXH3-128). */
kvs_hash128 core_block_hash(kvs_hash128 parent, kvs_hash128 salt,
                            const uint32_t *tokens, uint32_t n);

/* The eviction policies: name i (0, 1, ...; NULL past the last) and
 * whether it is offline (needs the future: the replayer only). */
const char *core_policy_name(size_t i, int *offline);
/* 0 and *offline (may be NULL) when name is a policy, else KVS_EINVAL. */
int core_policy_find(const char *name, int *offline);
/* The policies' names, ", "-separated, into buf (cut to len); offline ones
 * only when offline is 1. */
void core_policy_list(char *buf, size_t len, int offline);

/* KVS_EINVAL (bad config, unknown policy, an offline policy without
 * allow_offline) or KVS_ENOMEM. */
int core_create(const core_config *cfg, core **out);
/* Frees every request and the core. */
void core_destroy(core *c);

/* Tells an offline policy when block b is next used: value orders uses
 * (the replayer passes a request number); UINT32_MAX = never.  Takes
 * effect when b is next released.  A no-op for other policies. */
void core_policy_hint(core *c, uint32_t b, uint32_t value);
/* 1 when c's policy is offline (wants core_policy_hint). */
int core_policy_offline(const core *c);

/* A new, empty request.  salt (may be NULL/0) isolates its cache: blocks
 * hashed with one salt never match a lookup with another. */
int core_req_create(core *c, const void *salt, size_t salt_len,
                    core_req **out);

/* Frees the request: its blocks are released tail-first (the chain tail
 * reaches the free queue first, so it is evicted before its parents). */
void core_req_free(core *c, core_req *r);

/*
 * Longest cached prefix of a prompt, in whole blocks.  The request must be
 * empty (new or preempted).  Never counts the prompt's last token: at most
 * (n - 1) / block_size blocks hit, so at least one token is computed.  The hit
 * blocks join the request (ref + 1) as its first slots, committed and sealed;
 * all n tokens become known, so a later commit may pass tokens = NULL for
 * them.  *hit_tokens = hit blocks * block_size.
 * Errors: KVS_ESTATE (request not empty), KVS_ENOMEM.
 */
int core_lookup(core *c, core_req *r, const uint32_t *tokens, uint32_t n,
                uint32_t *hit_tokens);

/* A copy-on-write pair: the client copies block src into block dst before it
 * writes.  src == KVS_BLOCK_NONE when there is nothing to copy. */
typedef struct core_cow {
  uint32_t src, dst;
} core_cow;

/*
 * Slots for n more tokens (prefill).  New blocks are appended to the block
 * table.  If the last block is partial and shared (after a fork), it is first
 * replaced by a private copy, named in *cow (cow may be NULL only when the
 * caller knows no fork happened; pass it always).  Fails with KVS_ENOSPC,
 * changing nothing, when fewer than needed + reserve_blocks blocks are free
 * or cached.
 */
int core_allocate(core *c, core_req *r, uint32_t n, core_cow *cow);

/* Like core_allocate for decode: may dip into the reserve. */
int core_append(core *c, core_req *r, uint32_t n, core_cow *cow);

/*
 * The client wrote K/V for positions [start, start + n), which hold these
 * token ids (tokens may be NULL when every one of those positions is already
 * known).  Full blocks in [0, written) are sealed: hashed, and published in
 * the prefix index unless another block already holds that hash.
 * *sealed (may be NULL) = blocks sealed by this call.
 * Errors: KVS_ERANGE (start > written: a gap; or start + n > slots: tokens
 * without a slot, i.e. not written by this request), KVS_EMISMATCH (a token
 * differs from one the request already knows, or from the tokens a shared
 * block was sealed with), KVS_EINVAL (tokens NULL for unknown positions).
 */
int core_commit(core *c, core_req *r, uint32_t start, const uint32_t *tokens,
                uint32_t n, uint32_t *sealed);

/* A child sharing every block of r (ref + 1 each), with r's tokens, salt and
 * state.  Every slot of r must be written (committed) first, so that a shared
 * block is never written by two requests: KVS_ESTATE otherwise.  The first
 * append/allocate of either into their shared partial last block gets a
 * private copy (core_cow).  KVS_ENOMEM. */
int core_fork(core *c, core_req *r, core_req **child);

/* Releases every block of r tail-first and empties it; the request stays
 * valid (lookup may take its prefix back). */
int core_preempt(core *c, core_req *r);

/* Request state. */
uint32_t core_req_num_slots(const core_req *r);
uint32_t core_req_num_known(const core_req *r);
uint32_t core_req_num_written(const core_req *r);
uint32_t core_req_num_sealed(const core_req *r);
/* The block table; valid until the next operation on r. */
const uint32_t *core_req_blocks(const core_req *r, uint32_t *n);
/* Caller's pointer, for the daemon's session bookkeeping. */
void core_req_set_udata(core_req *r, void *udata);
void *core_req_udata(const core_req *r);

/*
 * Pins block b, which must be IN USE: one more reference that no request
 * owns, so that b stays off the free queue (never reallocated, never
 * evicted) however its requests are freed, until core_unpin.  The daemon
 * pins the blocks it copies into or out of for as long as the copy runs.
 * KVS_ERANGE (b out of range), KVS_ESTATE (b not IN USE), KVS_ELIMIT (255
 * pins on b already).
 */
int core_pin(core *c, uint32_t b);
/* Drops one pin of b (which must have one); b returns to the free queue
 * when that was its last reference, as a request's release would. */
void core_unpin(core *c, uint32_t b);

/*
 * ---- Lower tiers --------------------------------------------------------
 *
 * With tier_slots, the core keeps the books of sealed blocks whose bytes
 * also (or only) live below the device pool: in host memory, on disk.  An
 * entry per hash holds a slot in one tier or both; each tier drops its least
 * recently used entry when it needs a slot (the host tier first writes it to
 * disk when the disk tier exists and does not hold it yet).  The daemon
 * moves the bytes; the core says what to move and is told when it is done:
 *
 *   core_tier_plan    demotions to start: CACHED blocks near the head of the
 *                     free queue (the next to be evicted) with no copy
 *                     below are copied down (device -> host, or -> disk),
 *                     and host entries to disk when the host tier needs
 *                     room.  A block being copied down is busy: allocation
 *                     skips it until core_tier_done.
 *   core_lookup_promote  a lookup whose chain goes on below the device:
 *                     device blocks are allocated for those blocks (sealed,
 *                     not yet indexed, pinned) and listed to be filled;
 *   core_promote_finish  filled (or not): the good ones are indexed, the
 *                     request keeps its blocks up to the first failure, a
 *                     failed entry is dropped from its tier.
 * An entry being read or written is busy in its tiers: never dropped.
 * Device blocks evicted with no copy below are counted (tier_lost): the
 * daemon's demotion did not keep up.
 */
typedef struct core_tier_stats {
  uint32_t slots;        /* capacity */
  uint32_t used;         /* slots holding an entry (valid or being written) */
  uint64_t demotions;    /* blocks written into this tier */
  uint64_t promotions;   /* blocks brought up to the device from it */
  uint64_t hit_blocks;   /* blocks lookups found here (promoted or not) */
  uint64_t drops;        /* entries dropped to make room */
  uint64_t failures;     /* moves into it or promotions from it that failed */
  uint32_t held;         /* of used, slots swapped-out requests keep */
} core_tier_stats;

typedef enum core_move_kind {
  CORE_MOVE_DOWN = 0,         /* device block -> a slot of `tier` */
  CORE_MOVE_HOST_TO_DISK = 1, /* host slot src_slot -> disk slot `slot` */
  CORE_MOVE_SWAP = 2,         /* a swapping request's block -> a slot of
                                 `tier` (ended by core_swap_out_finish) */
} core_move_kind;

typedef struct core_move {
  core_move_kind kind;
  uint32_t tier;      /* destination tier */
  uint32_t block;     /* CORE_MOVE_DOWN: the device block (busy) */
  uint32_t entry;     /* the entry (busy) */
  uint32_t slot;      /* destination slot */
  uint32_t src_slot;  /* CORE_MOVE_HOST_TO_DISK: the host slot */
  kvs_hash128 hash;   /* the block's hash (for slot headers) */
} core_move;

/* Up to max moves to start now (tier_sync: always 0).  Each must be ended
 * by core_tier_done, whatever its outcome. */
uint32_t core_tier_plan(core *c, core_move *moves, uint32_t max);
/* Move m ended: ok 1, the bytes are in place; 0, they are not (I/O error):
 * the destination slot is given back. */
void core_tier_done(core *c, const core_move *m, int ok);

typedef struct core_promo {
  uint32_t block;  /* device block to fill */
  uint32_t pos;    /* its index in the request's block table */
  uint32_t entry;
  uint32_t tier;   /* where the bytes are: CORE_TIER_* */
  uint32_t slot;   /* their slot there */
  kvs_hash128 hash;
  kvs_hash128 parent; /* the hash of the block before it (pos > 0) */
} core_promo;

typedef struct core_lookup_out {
  uint32_t hit_tokens;     /* the request's cached prefix, promotions
                              included (they must succeed: see finish) */
  uint32_t device_blocks;  /* hit blocks resident on the device */
  uint32_t tier_blocks[CORE_TIERS]; /* blocks to promote from each tier */
  uint32_t npromos;        /* entries filled in promos */
} core_lookup_out;

/*
 * core_lookup, then, where the chain goes on below the device and promote
 * is set, the rest of the cached prefix: blocks resident on the device are
 * taken as hits, blocks found in a tier get a fresh device block each (as
 * Allocate would, keeping the reserve; fewer when space runs out), sealed
 * with their hash and tokens, not indexed, pinned, and listed in promos (up
 * to max_promos).  The request holds them from now on; its hit_tokens count
 * them.  The caller fills each block from its tier slot and then calls
 * core_promote_finish exactly once.  Without promote, blocks found below
 * are only counted (tier hit stats), not taken.
 */
int core_lookup_promote(core *c, core_req *r, const uint32_t *tokens,
                        uint32_t n, int promote, core_promo *promos,
                        uint32_t max_promos, core_lookup_out *out);

/*
 * The blocks of promos[0..n) are filled: ok[i] says whether block i got the
 * right bytes.  Good blocks before the first failure are indexed; the
 * request (NULL when it was freed meanwhile) keeps its table up to the
 * first failed promotion (its hit shrinks to there); a failed entry is
 * dropped from its tier (its bytes are bad or unreadable); every block is
 * unpinned.  ok NULL: nothing was tried (the copies could not start): no
 * block is kept, and every copy below stays where it is, not counted as a
 * failure.  Returns the request's hit_tokens after it.
 */
uint32_t core_promote_finish(core *c, core_req *r, const core_promo *promos,
                             uint32_t n, const int *ok);

/*
 * ---- Swap ---------------------------------------------------------------
 *
 * An engine that preempts a whole request may swap it out: the bytes of
 * its blocks go below (the host tier, else the disk tier), its device
 * blocks are released, and it keeps its tokens and its blocks' identity;
 * swap-in gives it device blocks again and brings the bytes back.
 *
 *   core_swap_out   every block of r gets a copy below that r holds (a held
 *                   copy is never dropped to make room): a sealed block
 *                   whose hash has a good copy below already holds that
 *                   one; any other block gets a slot and a move
 *                   (CORE_MOVE_SWAP) to fill, and is pinned while it runs.
 *                   From now until its finish r is swapping: every
 *                   operation on it but core_req_free fails with KVS_ESTATE.
 *   core_swap_out_finish  the moves ended, ok[i] each (NULL: none did).
 *                   All good: r releases its blocks, tail first (sealed
 *                   ones stay CACHED), and is swapped out.  Else what it
 *                   held below is let go and r is as it was: KVS_EIO.
 *   core_swap_in    r swapped out: its sealed blocks still resident on the
 *                   device are taken back as a lookup hit takes them; the
 *                   others get fresh blocks (as Allocate: the reserve is
 *                   kept, else KVS_ENOSPC and nothing changes), pinned,
 *                   listed in promos to fill from their copies.  A block
 *                   whose copy went bad is not listed: the table ends
 *                   before it.
 *   core_swap_in_finish  filled (ok[i] each; NULL: none was tried, the
 *                   copies below are not counted as failures).  r keeps its table
 *                   up to the first failure, its slots, written and sealed
 *                   cut there; sealed blocks brought up join the prefix
 *                   index; the copies below are let go.  Returns r's
 *                   written tokens after it.
 * Both finishes take r = NULL when the request was freed meanwhile.
 * Errors of core_swap_out: KVS_ESTATE (r is swapping or swapped out),
 * KVS_ENOTSUP (no tier), KVS_EINVAL (max < r's blocks), KVS_ENOSPC (no
 * slot below: nothing changes), KVS_ELIMIT (a block pinned 255 times, or a
 * copy held by 65535 requests), KVS_ENOMEM.
 */
enum {
  CORE_SWAP_NONE = 0,
  CORE_SWAP_OUT_PENDING = 1,
  CORE_SWAP_OUT = 2,
  CORE_SWAP_IN_PENDING = 3
};

int core_swap_out(core *c, core_req *r, core_move *moves, uint32_t max,
                  uint32_t *nmoves);
int core_swap_out_finish(core *c, core_req *r, const core_move *moves,
                         uint32_t n, const int *ok);
int core_swap_in(core *c, core_req *r, core_promo *promos, uint32_t max,
                 uint32_t *npromos);
uint32_t core_swap_in_finish(core *c, core_req *r, const core_promo *promos,
                             uint32_t n, const int *ok);
/* CORE_SWAP_*; the blocks a swapped-out request will take back, and its
 * written tokens (0 when not swapped out). */
int core_req_swap_state(const core_req *r);
uint32_t core_req_swap_blocks(const core_req *r);
uint32_t core_req_swap_written(const core_req *r);

/*
 * ---- Restart: a disk tier that outlives the daemon -----------------------
 *
 * A daemon whose disk tier file is kept across restarts rebuilds that
 * tier's books from the slot headers before it serves anything:
 *   core_tier_restore_begin  tier t exists and no tier holds an entry yet (a
 *                     core just created).
 *   core_tier_restore  slot s of tier t holds the good bytes of hash h,
 *                     written at gen (larger: written later); tokens are
 *                     its block_size token ids (NULL: unknown, refused when
 *                     verify_tokens is on).  A hash restored already keeps
 *                     the copy with the larger gen (ties: the first); the
 *                     other slot stays free.
 *   core_tier_restore_end  the tier's LRU is ordered by gen (the oldest
 *                     written goes first); every slot not restored is free.
 * No other call on c between begin and end.  Restored entries are found by
 * lookups and promoted as any other copy below.
 */
int core_tier_restore_begin(core *c, int t);
/* 0 restored, 1 a duplicate (one copy kept), KVS_EINVAL (slot out of
 * range or given twice, tokens NULL with verify_tokens, the zero hash),
 * KVS_ESTATE (no restore begun). */
int core_tier_restore(core *c, uint32_t slot, uint64_t gen, kvs_hash128 h,
                      const uint32_t *tokens);
/* Returns the entries the tier holds. */
uint32_t core_tier_restore_end(core *c);

/* What a slot header records of a move's entry (core_move.entry, while the
 * move runs): its token ids (NULL without verify_tokens) in *tokens; 1 when
 * a restart may restore it (a cache entry), 0 for a swapped request's own
 * copy. */
int core_tier_entry(const core *c, uint32_t entry, const uint32_t **tokens);

/* Per-tier counters (zeros for a tier that does not exist). */
void core_tier_get_stats(const core *c, core_tier_stats st[CORE_TIERS]);

typedef enum core_block_state {
  CORE_BLOCK_FREE = 0,
  CORE_BLOCK_CACHED = 1,
  CORE_BLOCK_IN_USE = 2
} core_block_state;

typedef struct core_block_info {
  core_block_state state;
  uint32_t ref;
  uint32_t pins;    /* of ref, those held by core_pin */
  int busy;         /* being copied down a tier */
  int indexed;      /* its hash is in the prefix index */
  kvs_hash128 hash; /* valid when sealed (indexed or not) */
} core_block_info;

/* KVS_ERANGE for b >= num_blocks. */
int core_block_get(const core *c, uint32_t b, core_block_info *info);

typedef struct core_stats {
  uint32_t num_blocks;
  uint32_t free_blocks;   /* FREE */
  uint32_t cached_blocks; /* CACHED */
  uint32_t used_blocks;   /* IN USE */
  uint32_t num_requests;
  uint64_t lookups;
  uint64_t query_tokens;  /* tokens of all looked-up prompts */
  uint64_t hit_tokens;
  uint64_t hit_blocks;
  uint64_t miss_blocks;   /* full blocks looked up that missed */
  uint64_t allocated_blocks;
  uint64_t evictions;     /* CACHED blocks reused for something else */
  uint64_t cow_copies;
  uint64_t sealed_blocks;
  uint64_t duplicate_blocks; /* sealed with a hash already indexed */
  uint64_t collisions;       /* hash matched, stored tokens did not */
  uint64_t no_space;         /* allocations refused with KVS_ENOSPC */
  uint64_t tier_lost;        /* CACHED blocks evicted with no copy below
                                (tiers on: demotion did not keep up) */
  uint32_t swapped_requests; /* swapped out now (or swapping) */
  uint64_t swap_outs, swap_ins;   /* finished with every block good */
  uint64_t swap_failures;    /* swap-outs undone, swap-ins cut short */
  uint64_t swap_out_blocks;  /* blocks copied down by swap-outs */
  uint64_t swap_kept_blocks; /* blocks whose copy below was there already */
  uint64_t swap_in_blocks;   /* blocks copied up by swap-ins */
  uint64_t swap_resident_blocks; /* taken back from the device, no copy */
  uint32_t indexed_blocks;   /* hashes in the prefix index (CACHED, and
                                sealed blocks in use) */
} core_stats;

void core_get_stats(const core *c, core_stats *st);
/* acc += x, field by field (the partitions of a daemon with tenants). */
void core_stats_add(core_stats *acc, const core_stats *x);

/*
 * ---- Index events ---------------------------------------------------------
 *
 * An observer is told of every hash that enters the prefix index (a block
 * sealed, or brought up from a tier) and of every one that leaves it (its
 * block evicted), in order, as the operation that does it runs: the
 * daemon's KV event stream (daemon/observe/events.c).  The callbacks must not
 * change the core (its const queries are fine).
 *   stored   h, the hash of the block before it in its chain (parent; NULL
 *            for a chain's first block) and its block_size token ids (NULL
 *            when unknown: a block brought up from a tier with neither
 *            verify_tokens nor keep_tokens).
 *   removed  h left the index.
 *   sealed   (after stored) h entered the index from a commit: the bytes
 *            a worker wrote are in block b (sealed: they never change until
 *            b is evicted), at index pos of its request's block table.
 *            Not called for blocks brought up from below (their bytes came
 *            from a copy that exists already): the remote tier's
 *            write-through (daemon/tiers/remote.c).
 *   tier     a copy of h in tier t (CORE_TIER_HOST, CORE_TIER_DISK,
 *            CORE_TIER_REMOTE) became readable (present 1: a demotion or a
 *            swap-out finished, a persisted slot was restored, a remote
 *            write was acknowledged) or went (present 0: dropped for room,
 *            failed, or a read found it bad).  Copies private to a swapped
 *            request (unsealed blocks) are not told of; nor are remote
 *            copies going (the server evicts on its own).
 * Any callback may be NULL.  Up to CORE_OBSERVERS observers, each told in
 * the order they were added.
 */
typedef struct core_observer {
  void (*stored)(void *arg, kvs_hash128 h, const kvs_hash128 *parent,
                 const uint32_t *tokens);
  void (*removed)(void *arg, kvs_hash128 h);
  void (*sealed)(void *arg, kvs_hash128 h, uint32_t b, uint32_t pos);
  void *arg;
  void (*tier)(void *arg, kvs_hash128 h, int t, int present);
} core_observer;
#define CORE_OBSERVERS 4
/* One more observer (the core keeps a copy): 0, or KVS_ELIMIT. */
int core_add_observer(core *c, const core_observer *obs);
/* Removes every observer whose arg is arg. */
void core_remove_observer(core *c, void *arg);
/* Removes every observer, then adds obs (NULL: none). */
void core_set_observer(core *c, const core_observer *obs);

/*
 * ---- The remote tier ---------------------------------------------------
 *
 * A tier the core keeps no books for: a store shared with other daemons
 * (daemon/tiers/tier_remote.c), where what is there is only known by asking.
 * After a lookup (and its promotions from the tiers below), the daemon
 * asks the store for the rest of the request's chain
 * (core_req_next_hashes), and brings up the longest run it finds:
 *   core_remote_promote  the request's next blocks, by hash: one indexed on
 *                     the device meanwhile is a hit; another gets a fresh
 *                     device block, sealed, pinned, not yet indexed, listed
 *                     in promos with tier CORE_TIER_REMOTE (entry and slot
 *                     KVS_BLOCK_NONE) to be filled;
 *   core_promote_finish  as for the other tiers (a failed remote block is
 *                     only a miss: the core has no copy to drop).
 */
enum { CORE_TIER_REMOTE = CORE_TIERS };

/* A remote write of h was acknowledged: the observers hear of it (tier
 * CORE_TIER_REMOTE, present 1). */
void core_remote_stored(core *c, kvs_hash128 h);

/* 1 when a tier below the pool (host, disk) holds a readable copy of h. */
int core_tier_holds(const core *c, kvs_hash128 h);

/* fn for every readable copy in the tiers below the pool (host, disk; not
 * swapped requests' own), as an observer added late would have heard of
 * it. */
void core_tier_each(const core *c, void (*fn)(void *arg, kvs_hash128 h, int t),
                    void *arg);

/* The chained hashes of r's known full blocks after its block table, as a
 * lookup walks them (never the block of the last known token): up to max
 * into out; returns how many. */
uint32_t core_req_next_hashes(const core *c, const core_req *r,
                              kvs_hash128 *out, uint32_t max);

/*
 * r (just looked up: every block sealed, not swapping) goes on with the n
 * blocks of hashes[0..n), which must be r's next chained hashes (the list
 * ends at the first that is not).  Each is taken as a device hit when
 * indexed (and its tokens match with verify_tokens), else gets a fresh
 * block (as Allocate: the reserve is kept; the list ends where space
 * does), listed in promos (room for n).  *taken = blocks r gained, of
 * which *npromos are to fill; core_promote_finish exactly once when
 * *npromos > 0.  KVS_ESTATE (r not in that state), KVS_ENOMEM.
 */
int core_remote_promote(core *c, core_req *r, const kvs_hash128 *hashes,
                        uint32_t n, core_promo *promos, uint32_t *npromos,
                        uint32_t *taken);

/* r's known token ids (core_req_num_known of them); valid until the next
 * operation on r. */
const uint32_t *core_req_tokens(const core_req *r);
/* Sealed block b's block_size token ids, or NULL when the core keeps none
 * (neither verify_tokens nor keep_tokens). */
const uint32_t *core_block_tokens(const core *c, uint32_t b);

/* Block b holds hash h, sealed and indexed: 2 when IN USE (core_pin may
 * hold it), 1 when CACHED; 0 when not (evicted, reused, out of range). */
int core_block_holds(const core *c, uint32_t b, kvs_hash128 h);

/*
 * Checks every invariant over the whole pool: ref counts equal the (request,
 * slot) holders plus the pins, the free queue holds exactly the ref-0 blocks and is well
 * linked, index entries point at blocks holding that hash, per-request
 * counters are consistent.  Returns 0, or KVS_EINTERNAL with a description of
 * the first violation in msg.
 */
int core_check(const core *c, char *msg, size_t msg_len);

#ifdef __cplusplus
}
#endif
#endif /* KVS_CORE_H */
