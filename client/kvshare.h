/*
 * kvshare.h — libkvshare, the client library of the kvshare KV-cache service.
 *
 * This is the one public header.  It includes kvs_status.h (status codes),
 * kvs_layout.h (the block layout and its offset math) and kvs_kernels.h (the
 * K/V kernels and their C twins), which are installed beside it.
 *
 * A worker connects to the daemon `kvshared` over its Unix socket.  The
 * connection is a session: every request id (req_id, any 64-bit value the
 * worker picks) lives in its session only, and when the connection closes —
 * kvs_close, exit, crash, kill -9 — the daemon frees every request of the
 * session.  During the handshake the daemon passes the pool's memory; the
 * library maps it, so the worker reads and writes K/V itself at
 *
 *     kvs_pool_base(c) + b * kvs_layout_of(c)->block_stride   (block b)
 *
 * with the offset math of kvs_layout.h.  Block ids are indexes into the pool;
 * they are the same in every process, addresses are not.
 *
 * Operations (one round trip each, or many in one kvs_batch):
 *   kvs_lookup    longest cached prefix of a prompt; creates the request
 *   kvs_allocate  slots for n more tokens (prefill)
 *   kvs_append    slots for n more tokens (decode; may use the reserve)
 *   kvs_commit    positions [start, start+n) are written and hold these
 *                 tokens; full blocks are sealed and shared
 *   kvs_fork      a child request sharing every block (copy-on-write)
 *   kvs_free      release a request's blocks and forget it
 *   kvs_preempt   release a request's blocks, keep the request
 *   kvs_stats_get counters, optionally the daemon's pool invariant check
 *   kvs_ping      an echo round trip
 *
 * Return values
 *   Every function returning int returns 0 on success or a negative status:
 *   a kvshare code from kvs_status.h (KVS_ENOSPC, ...) or a system error as
 *   -errno.  The batch builder's kvs_batch_* "add" functions return the index
 *   (>= 0) of the op they added.  kvs_strerror() turns any of them into text.
 *   After a call failed with a status the daemon sent, kvs_last_message()
 *   gives the daemon's message for it.  The library never logs or prints.
 *
 *   A transport failure (the daemon closed the socket, a malformed reply)
 *   leaves the client broken: every later call returns KVS_ECLOSED, and the
 *   only thing left to do is kvs_close().  The pool mapping stays valid until
 *   kvs_close() even then.
 *
 * Ownership
 *   - kvs_client and kvs_batch are opaque; each is created by one function
 *     and released by one (kvs_close, kvs_batch_free).
 *   - Block ids in results (kvs_lookup_result.blocks, kvs_alloc_result.blocks)
 *     point into memory owned by the client (direct calls) or the batch
 *     (batched ops).  They stay valid until the next call on the same client
 *     returns (so they may be passed as an argument to that call, e.g. an
 *     allocation's blocks to kvs_commit), or until the batch is submitted
 *     again, reset or freed (batched ops).  Copy them out to keep them.
 *   - kvs_layout_of() and kvs_pool_base() stay valid until kvs_close().
 *   - Arrays the caller passes in (tokens, blocks, salt, payload) are read
 *     during the call only (or, for the batch builder, copied when the op is
 *     added).
 *
 * Threads
 *   One kvs_client belongs to one thread at a time: calls on the same client
 *   must not overlap (the library takes no lock).  Different clients are
 *   independent and may be used from different threads at once.  A kvs_batch
 *   is likewise used by one thread at a time.  The pool memory is shared by
 *   every process; the daemon's reference counts say who may write a block:
 *   only the request that allocated a block writes it, and only before it
 *   commits it; a sealed (committed, full) block is read-only for everyone.
 *
 * fork(2)
 *   A child process must not use its parent's kvs_client (the session is
 *   the parent's).  It may call kvs_close() on it to release the memory, and
 *   connect anew.
 */
#ifndef KVSHARE_H
#define KVSHARE_H

#include <stddef.h>
#include <stdint.h>

#include "kvs_kernels.h"
#include "kvs_layout.h"
#include "kvs_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The protocol version this library speaks (Hello.version). */
#define KVS_PROTO_VERSION_CLIENT 1u

/* Library version. */
#define KVS_VERSION_MAJOR 0
#define KVS_VERSION_MINOR 1
#define KVS_VERSION_PATCH 0
/* "0.1.0": the version of the library actually loaded. */
const char *kvs_version(void);

typedef struct kvs_client kvs_client;
typedef struct kvs_batch kvs_batch;

/* ---- connecting ---------------------------------------------------------- */

typedef struct kvs_connect_opts {
  const char *client_name; /* shown in the daemon's logs; NULL: "libkvshare" */
  int timeout_ms;          /* per-call socket timeout; 0: wait forever.  A
                              call that times out returns -EAGAIN and
                              leaves the client broken (the reply may
                              still come, out of step) */
  int no_map;              /* 1: do not map the pool (tools such as the CLI) */
} kvs_connect_opts;

/*
 * Connect to the daemon at the Unix socket `path` (NULL: $KVS_SOCKET, else
 * the daemon's default: $XDG_RUNTIME_DIR/kvshare/kvshared.sock when that
 * variable is an absolute path, else KVS_DEFAULT_SOCKET), say Hello, receive the Welcome and the pool's file
 * descriptors, and map the pool.  opts may be NULL (defaults).
 * A path that is a folder holds the sockets of one daemon per GPU (kvshared
 * socket_dir): <GPU UUID>.sock each; the one of this process's GPU is taken
 * (the first UUID of CUDA_VISIBLE_DEVICES, else the one UUID of
 * NVIDIA_VISIBLE_DEVICES with a daemon there; no UUID: kvshared.sock, a
 * host pool), else KVS_ENODEV and kvs_last_message(NULL) names the GPUs.
 * On success *out is a new client; release it with kvs_close().
 * Errors: KVS_EINVAL, -ENOENT / -ECONNREFUSED (no daemon), KVS_EVERSION,
 * KVS_EPROTO, KVS_ENOTSUP (a pool backend this build cannot map), KVS_ENOMEM,
 * KVS_ENODEV (no daemon of this process's GPU in the folder; a GPU pool on a
 * GPU this process cannot use), other -errno.
 */
#define KVS_DEFAULT_SOCKET "/run/kvshare/kvshared.sock"
int kvs_connect(const char *path, const kvs_connect_opts *opts,
                kvs_client **out);

/* Unmap the pool, close the socket (the daemon frees the session's
 * requests) and free the client.  NULL is a no-op. */
void kvs_close(kvs_client *c);

/* The pool layout the daemon announced (block_stride filled in).  Valid
 * until kvs_close().  (Not named kvs_layout: that is the struct's type.) */
const kvs_layout *kvs_layout_of(const kvs_client *c);

/* This process's address of the pool (NULL when opened with no_map or with
 * a device backend not mapped in this process). */
void *kvs_pool_base(const kvs_client *c);
/* Bytes of the pool. */
uint64_t kvs_pool_size(const kvs_client *c);
/* "host" or "cuda": where the pool lives. */
const char *kvs_pool_backend(const kvs_client *c);
/* The cuda pool's GPU ("GPU-...", as nvidia-smi -L prints it); "" for a
 * host pool. */
const char *kvs_pool_gpu_uuid(const kvs_client *c);
/* The kernels that run on this pool: kvs_kernels_cuda() for a mapped cuda
 * pool, kvs_kernels_cpu() otherwise. */
const kvs_kernels *kvs_pool_kernels(const kvs_client *c);

/* Session id, model id and the largest frame the daemon accepts. */
uint64_t kvs_session_id(const kvs_client *c);
const char *kvs_model_id(const kvs_client *c);
uint32_t kvs_max_frame(const kvs_client *c);

/* Since 0.8.  The session's tenant, as the daemon's Welcome named it: the
 * tenant whose partition of the pool this session uses (daemon tenants,
 * docs/operations.md "Tenants"); "" when the daemon has no tenants, and
 * for an observer (a peer in no tenant: root or the daemon's own uid, which
 * must connect with no_map and may only ask for stats and ping).  Valid
 * until kvs_close(). */
const char *kvs_tenant(const kvs_client *c);

/* The socket's file descriptor (to poll for the daemon going away).  Do not
 * read, write or close it. */
int kvs_fd(const kvs_client *c);

/* The daemon's message for the last status it sent back on this client
 * ("" when none).  Valid until the next call on c.  With c NULL: why the
 * calling thread's last kvs_connect failed (the daemon's refusal, or the
 * library's own reason, e.g. "the pool lives on GPU-..., which this
 * process cannot use"); "" after a success.  Valid until that thread's
 * next kvs_connect. */
const char *kvs_last_message(const kvs_client *c);

/* Address of block b in this process, or NULL (b out of range, no mapping). */
void *kvs_block_ptr(const kvs_client *c, uint32_t b);

/* Address of layer `layer`'s K plane (kv = 0) or V plane (kv = 1) of block
 * b, or NULL. */
void *kvs_plane_ptr(const kvs_client *c, uint32_t b, uint32_t layer,
                    uint32_t kv);

/* The paged view of one layer, for the kernels of kvs_kernels.h.
 * Returns 0, KVS_EINVAL (layer out of range) or KVS_ESTATE (no mapping). */
int kvs_paged_kv_of(const kvs_client *c, uint32_t layer, kvs_paged_kv *kv);

/* ---- results ------------------------------------------------------------- */

typedef struct kvs_lookup_result {
  uint32_t hit_tokens;    /* tokens of the prompt already cached */
  uint32_t num_blocks;
  const uint32_t *blocks; /* the request's block table after the lookup
                             (never NULL, even when num_blocks is 0) */
} kvs_lookup_result;

typedef struct kvs_alloc_result {
  uint32_t first_index;   /* block-table index of blocks[0] */
  uint32_t num_blocks;
  const uint32_t *blocks; /* blocks appended to the request's table
                             (never NULL) */
  int has_cow;            /* 1: copy block cow_src into cow_dst (e.g. with
                             kvs_copy_blocks) before writing; the table now
                             holds cow_dst at cow_index.  2: the same, but
                             the daemon already copied (kvs_set_daemon_copy):
                             only the table changed */
  uint32_t cow_src;
  uint32_t cow_dst;
  uint32_t cow_index;
} kvs_alloc_result;

typedef struct kvs_stats {
  uint32_t num_blocks;
  uint32_t free_blocks;   /* FREE: no hash */
  uint32_t cached_blocks; /* CACHED: ref 0, hash indexed, reusable */
  uint32_t used_blocks;   /* IN USE: ref >= 1 */
  uint32_t num_requests;
  uint32_t sessions;
  uint64_t lookups;
  uint64_t query_tokens;
  uint64_t hit_tokens;
  uint64_t hit_blocks;
  uint64_t miss_blocks;
  uint64_t allocated_blocks;
  uint64_t evictions;
  uint64_t cow_copies;
  uint64_t sealed_blocks;
  uint64_t no_space;
  uint64_t frames_in;
  uint64_t protocol_errors;
  int32_t check;            /* the invariant check's status (asked for) */
  char check_message[256];  /* its description of a violation, or "" */
  /* Since 0.2 (a program built against 0.1 gets the fields above only). */
  char backend[16];         /* "host" or "cuda" */
  char gpu_uuid[64];        /* the pool's GPU, "" for host */
  uint64_t pool_bytes;      /* bytes of the pool's memory */
  uint64_t daemon_copies;   /* copy jobs the daemon ran (kvs_set_daemon_copy) */
  uint64_t daemon_copy_blocks;
  uint64_t copy_errors;     /* of those, failed (their sessions closed) */
  /* Since 0.5. */
  uint64_t queued_bytes;    /* replies queued for all sessions, not written */
  uint32_t indexed_blocks;  /* hashes in the prefix index (cached blocks, and
                               sealed blocks in use) */
} kvs_stats;

/* One tier below the pool (kvs_tier_stats_get); since 0.3. */
typedef struct kvs_tier_stats {
  char name[16];            /* "host" or "disk" */
  uint64_t capacity_bytes;
  uint32_t slots;           /* blocks it can hold */
  uint32_t used;            /* slots holding a block (or being written) */
  uint64_t demotions;       /* blocks written into it */
  uint64_t promotions;      /* blocks brought up from it by lookups */
  uint64_t hit_blocks;      /* blocks lookups found in it */
  uint64_t drops;           /* blocks dropped to make room */
  uint64_t failures;        /* moves into it or promotions from it that
                               failed: a miss, never wrong bytes */
  uint64_t bytes_in, bytes_out;
  uint64_t io_errors;       /* disk: EIO, ENOSPC, short I/O */
  uint64_t checksum_failures; /* disk: a slot whose header or XXH3 did not
                               match */
} kvs_tier_stats;

/* One tenant's partition of the pool (kvs_tenant_stats_get); since 0.8. */
typedef struct kvs_tenant_stats {
  char name[32];            /* the tenant's name (at most 31 characters) */
  uint32_t num_blocks;      /* its share of the pool */
  uint32_t free_blocks;     /* of its share: FREE, CACHED, IN USE */
  uint32_t cached_blocks;
  uint32_t used_blocks;
  uint32_t num_requests;
  uint32_t sessions;        /* its sessions now */
  uint64_t lookups;
  uint64_t query_tokens;    /* tokens of every looked-up prompt */
  uint64_t hit_tokens;      /* of those, served from its cache */
  uint64_t evictions;
  uint64_t no_space;        /* allocations refused for want of blocks */
  uint64_t pool_bytes;      /* bytes of its pool memory */
} kvs_tenant_stats;

/* ---- operations, one round trip each -------------------------------------- */

/*
 * Longest cached prefix of tokens[0..n) (never its last token).  Creates the
 * request req_id when it is new in this session (salt, salt_len: its cache
 * salt, may be NULL/0); a known, empty (new or preempted) request may look up
 * again.  The hit blocks join the request.  res may be NULL.
 */
int kvs_lookup(kvs_client *c, uint64_t req_id, const uint32_t *tokens,
               uint32_t n, const void *salt, size_t salt_len,
               kvs_lookup_result *res);

/* Slots for num_tokens more tokens (prefill; keeps the daemon's decode
 * reserve).  res may be NULL only if the caller does not need the blocks. */
int kvs_allocate(kvs_client *c, uint64_t req_id, uint32_t num_tokens,
                 kvs_alloc_result *res);

/* Slots for num_tokens more tokens (decode; may use the reserve). */
int kvs_append(kvs_client *c, uint64_t req_id, uint32_t num_tokens,
               kvs_alloc_result *res);

/*
 * Positions [start, start + n) of the request are written and hold
 * tokens[0..n).  tokens may be NULL when the daemon already knows them (the
 * Lookup's prompt).  blocks (may be NULL, nblocks 0) are the block ids the
 * caller wrote, for block-table indexes start / block_size ..
 * (start + n - 1) / block_size; the daemon checks them.  *sealed (may be
 * NULL) = full blocks sealed and published by this commit.
 */
int kvs_commit(kvs_client *c, uint64_t req_id, uint32_t start,
               const uint32_t *tokens, uint32_t n, const uint32_t *blocks,
               uint32_t nblocks, uint32_t *sealed);

/*
 * Since 0.7.  The engine's own keys of the blocks a commit completes
 * (block-table indexes start / block_size .. (start + n) / block_size - 1:
 * nblocks of them), for the daemon's KV events: with them, those blocks are
 * published (stored, moved, removed) under the engine's hashes, so that a
 * router that hashes prompts the engine's way matches them
 * (docs/operations.md, "Engine block hashes").  One of hashes (integers)
 * or hash_bytes (nblocks * hash_len bytes, hash_len 1 to 32: vLLM's
 * 32-byte block hashes) is set.  lora_name (NULL: none) goes with each
 * BlockStored; extra (NULL: none) holds one msgpack object per block, back
 * to back, extra_len[i] bytes each (0: none; at most 1024), published as
 * vLLM's extra_keys.  The daemon refuses keys whose count is not the
 * number of blocks the commit completes (KVS_EINVAL, with why).
 */
typedef struct kvs_block_keys {
  uint32_t nblocks;
  const uint64_t *hashes;
  const uint8_t *hash_bytes;
  uint32_t hash_len;
  const char *lora_name;
  const uint8_t *extra;
  const uint32_t *extra_len;
} kvs_block_keys;

/* kvs_commit with the engine's block keys (NULL: as kvs_commit).  Since
 * 0.7. */
int kvs_commit_keys(kvs_client *c, uint64_t req_id, uint32_t start,
                    const uint32_t *tokens, uint32_t n, const uint32_t *blocks,
                    uint32_t nblocks, const kvs_block_keys *keys,
                    uint32_t *sealed);

/*
 * Copies block pairs[2i] into block pairs[2i+1] for i < n (whole blocks,
 * every layer), in this process, on the pool's memory: on a cuda pool one
 * asynchronous device-to-device copy per pair on `stream` (a CUstream of
 * the pool's GPU, NULL: the legacy default stream — order it before the
 * kernels that write the destination, as a stream does); on a host pool a
 * memcpy (stream ignored).  pairs is host memory.  For the copy-on-write
 * pair of kvs_alloc_result.  KVS_ERANGE (a block out of the pool),
 * KVS_ESTATE (the pool is not mapped), KVS_EINVAL.
 */
/*
 * Since 0.3.  The tiers below the daemon's pool (host memory, disk), top
 * first: up to max into out, *n = how many exist (0: none); *tier_lost
 * (may be NULL) = cached blocks the pool evicted with no copy below
 * (demotion did not keep up).  One round trip.
 */
int kvs_tier_stats_get(kvs_client *c, kvs_tier_stats *out, uint32_t max,
                       uint32_t *n, uint64_t *tier_lost);

/*
 * Since 0.8.  The daemon's tenants, one line per partition this session may
 * see: its own tenant's only, or every tenant's for an observer (kvs_tenant
 * is ""), in the daemon's order: up to max into out, *n = how many there
 * are (0: the daemon has no tenants).  out may be NULL when max is 0.  The
 * figures of kvs_stats_get add up the lines an observer sees.  One round
 * trip.
 */
int kvs_tenant_stats_get(kvs_client *c, kvs_tenant_stats *out, uint32_t max,
                         uint32_t *n);

/*
 * Since 0.3.  With tiers below the pool, a kvs_lookup whose prefix goes on
 * in a tier waits while the daemon brings those blocks up (they count in
 * its hit); on = 0 makes this session's lookups take only blocks resident
 * in the pool.  Default on.  Lookups in a batch never wait.
 */
int kvs_set_promote(kvs_client *c, int on);

/*
 * Since 0.6.  1 when this session's calls go through a request ring: a
 * shared mapping beside the socket that the daemon polls, so that a call
 * costs no system call while the daemon is busy.  Asked for with KVS_RING=1
 * in the environment at kvs_connect (granted when the daemon's ring_bytes
 * is not 0); $KVS_RING_SPIN_US (default 50) is how long a call spins on the
 * reply before it sleeps.  Worth it when the worker and the daemon run on
 * different cores; see docs/client.md.  Without a ring, $KVS_SOCKET_SPIN_US
 * (default 0) is how long a call reads its reply from the socket without
 * blocking before it blocks: with a daemon that polls its sockets
 * (socket_poll_us) a round trip then costs no wake-up.
 */
int kvs_ring_active(const kvs_client *c);

/*
 * Since 0.4.  Swap: an engine that preempts a whole request may send its
 * blocks below the pool instead of dropping them, and bring them back when
 * it resumes the request.  Both wait for the copies (one round trip, no
 * polling); neither is allowed inside a batch (KVS_ENOTSUP); both need a
 * tier below the daemon's pool (KVS_ENOTSUP otherwise).
 *
 * kvs_swap_out: the bytes of every block of req_id go to the host tier
 * (else the disk tier), then its blocks are released (its sealed ones stay
 * cached); the request keeps its tokens and its blocks' identity, and takes
 * no operation but kvs_swap_in and kvs_free meanwhile (KVS_ESTATE).  The
 * worker must not write into the request's blocks once it asks.  A copy
 * that fails undoes the swap: KVS_EIO, the request as it was.  KVS_ENOSPC:
 * no room below (the tiers are full of swapped requests' blocks).
 *
 * kvs_swap_in: blocks again (sealed blocks still in the pool come back with
 * no copy; the others keep allocate's reserve: KVS_ENOSPC otherwise,
 * nothing changed) and the bytes brought back into them.  res->blocks is
 * the request's block table.  If a copy below turned out bad (an I/O error,
 * a checksum), the request ends before that block: res->tokens are the
 * written tokens restored, res->lost_tokens those to compute again.
 */
typedef struct kvs_swap_result {
  uint32_t tokens;        /* out: written tokens swapped out; in: restored */
  uint32_t lost_tokens;   /* in: written tokens not restored */
  uint32_t copied_blocks; /* blocks whose bytes moved (the others had a copy
                             below already, or were still in the pool) */
  uint32_t num_blocks;    /* in: the request's block table */
  const uint32_t *blocks; /* valid until the client's next call */
} kvs_swap_result;

int kvs_swap_out(kvs_client *c, uint64_t req_id, kvs_swap_result *res);
int kvs_swap_in(kvs_client *c, uint64_t req_id, kvs_swap_result *res);

/* Since 0.4.  The daemon's swap counters.  One round trip. */
typedef struct kvs_swap_stats {
  uint32_t swapped_requests; /* swapped out now (or on their way) */
  uint32_t held_slots;       /* tier slots they keep, all tiers */
  uint64_t swap_outs;        /* kvs_swap_out calls done */
  uint64_t swap_ins;         /* kvs_swap_in calls that restored everything */
  uint64_t failures;         /* swap-outs undone, swap-ins cut short */
  uint64_t out_blocks;       /* blocks copied down */
  uint64_t kept_blocks;      /* blocks with a copy below already */
  uint64_t in_blocks;        /* blocks copied up */
  uint64_t resident_blocks;  /* blocks taken back from the pool */
} kvs_swap_stats;

int kvs_swap_stats_get(kvs_client *c, kvs_swap_stats *st);

int kvs_copy_blocks(kvs_client *c, const uint32_t *pairs, uint32_t n,
                    void *stream);

/*
 * on != 0: ask the daemon to make the copy-on-write copies of this client's
 * allocations itself, on its own copy engine, before it answers (the
 * result's has_cow is then 2 and nothing is left to copy).  It costs the
 * allocation the copy's time in the reply, and saves the worker a copy and
 * a stream synchronisation.  A daemon that cannot (an older one) answers
 * has_cow 1 as before.  Off by default.  0 or KVS_EINVAL.
 */
int kvs_set_daemon_copy(kvs_client *c, int on);

/* A new request child_id sharing every block of req_id. */
int kvs_fork(kvs_client *c, uint64_t req_id, uint64_t child_id);

/* Release every block of req_id and forget it. */
int kvs_free(kvs_client *c, uint64_t req_id);

/* Release every block of req_id; the request stays (lookup may refill). */
int kvs_preempt(kvs_client *c, uint64_t req_id);

/* The daemon's counters.  check != 0 also runs the pool invariant check;
 * its result is in st->check (0 or KVS_EINTERNAL) and st->check_message.
 * The call itself returns 0 even when the check found a violation. */
int kvs_stats_get(kvs_client *c, int check, kvs_stats *st);

/* An echo round trip carrying len bytes (may be 0); checks the echo. */
int kvs_ping(kvs_client *c, const void *payload, size_t len);

/* ---- the batch builder: many ops, one round trip --------------------------
 *
 * An engine adds the ops of one scheduler step to a batch and submits it
 * once.  The daemon runs the ops in order; each has its own status (a failed
 * op does not stop the ones after it).  Results are read per op index after
 * kvs_batch_submit().  A batch may be reset and reused: its memory is kept.
 * Adding an op to a submitted batch starts the next batch (the ops are
 * dropped); the previous results stay readable by pointer until the next
 * submit, reset or free, so they may be passed to the new ops.
 */

/* A new, empty batch.  KVS_EINVAL or KVS_ENOMEM. */
int kvs_batch_new(kvs_batch **out);
/* NULL is a no-op. */
void kvs_batch_free(kvs_batch *b);
/* Drop every op and result; keep the memory. */
void kvs_batch_reset(kvs_batch *b);
/* Ops added so far. */
uint32_t kvs_batch_count(const kvs_batch *b);

/* Add one op; returns its index (>= 0) or KVS_EINVAL / KVS_ENOMEM.
 * Arrays are copied. */
int kvs_batch_lookup(kvs_batch *b, uint64_t req_id, const uint32_t *tokens,
                     uint32_t n, const void *salt, size_t salt_len);
int kvs_batch_allocate(kvs_batch *b, uint64_t req_id, uint32_t num_tokens);
int kvs_batch_append(kvs_batch *b, uint64_t req_id, uint32_t num_tokens);
int kvs_batch_commit(kvs_batch *b, uint64_t req_id, uint32_t start,
                     const uint32_t *tokens, uint32_t n,
                     const uint32_t *blocks, uint32_t nblocks);
int kvs_batch_fork(kvs_batch *b, uint64_t req_id, uint64_t child_id);
int kvs_batch_free_req(kvs_batch *b, uint64_t req_id);
int kvs_batch_preempt(kvs_batch *b, uint64_t req_id);
int kvs_batch_ping(kvs_batch *b, const void *payload, size_t len);

/*
 * Send every op in one frame and wait for the one reply.  Returns 0 when the
 * round trip worked (each op's own status is then kvs_batch_status()), or
 * the transport's / the whole batch's error (KVS_ETOOBIG: the batch does not
 * fit in the daemon's frame limit — split it).  An empty batch is sent too.
 */
int kvs_batch_submit(kvs_client *c, kvs_batch *b);

/* After a submit: op i's status (0 or negative); KVS_ERANGE for a bad i,
 * KVS_ESTATE before a submit. */
int kvs_batch_status(const kvs_batch *b, uint32_t i);
/* The daemon's message for op i ("" when none or out of range).  Only the
 * first 16 failing ops of a batch get one from the daemon (so that a
 * batch's reply stays small); for the others this is kvs_strerror of the
 * op's status. */
const char *kvs_batch_message(const kvs_batch *b, uint32_t i);
/* Op i's result; fails with op i's status, KVS_ERANGE or KVS_EINVAL (op i
 * is not that kind of op). */
int kvs_batch_lookup_result(const kvs_batch *b, uint32_t i,
                            kvs_lookup_result *res);
int kvs_batch_alloc_result(const kvs_batch *b, uint32_t i,
                           kvs_alloc_result *res);
int kvs_batch_commit_result(const kvs_batch *b, uint32_t i, uint32_t *sealed);
/* kvs_batch_commit with the engine's block keys (kvs_commit_keys; copied).
 * Since 0.7. */
int kvs_batch_commit_keys(kvs_batch *b, uint64_t req_id, uint32_t start,
                          const uint32_t *tokens, uint32_t n,
                          const uint32_t *blocks, uint32_t nblocks,
                          const kvs_block_keys *keys);

#ifdef __cplusplus
}
#endif
#endif /* KVSHARE_H */
