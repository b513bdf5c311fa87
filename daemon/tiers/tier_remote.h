/*
 * tier_remote.h — the remote tier's store: Redis or Valkey, standalone or
 * a Redis Cluster, shared by the daemons of several nodes, spoken to
 * through hiredis's async API on the daemon's loop.
 *
 * The store holds block values under keys
 *     PREFIX ":" <root hash lo, 16 hex> ":" <block hash, 32 hex>
 * The root hash commits to the layout and the model id, and the chained
 * block hash to the salt and every token of the prefix: one key names one
 * block of one prefix of one model.  (The salt itself is not in the key:
 * a salt may be a tenant's secret, and the hash already separates salts.)
 * A value is a header and the block's bytes (little-endian):
 *     0  magic "KVSREMT1"     8  version (u32)   12  header bytes (u32)
 *    16  data length (u64)   24  the block's hash (lo, hi)
 *    40  root hash (lo, hi)  56  block_size (u32)  60  token ids (u32: 0
 *        or block_size)
 *    64  XXH3-64 of the data 72  XXH3-64 of the token ids, seeded with
 *        XXH3-64 of the 80 header bytes (this field as zero)
 *    80  the token ids, then the data.
 * A value read back is served only when every field matches what the
 * lookup asked for (hash, root, lengths, both checksums, and the token ids
 * when the caller passes them): anything else is a miss, counted.
 *
 * Capacity and expiry are the server's (maxmemory, maxmemory-policy; an
 * optional TTL on each write).  Faults never block the loop or serve bad
 * bytes: a server that is down, restarting or slow makes misses (a read
 * waits at most timeout_ms) and skipped writes; connections come back with
 * an exponential back-off (100 ms to 5 s), each outage logged once.
 * Memory for requests in flight is bounded by inflight_bytes (reads
 * reserve their values' size before they are sent; writes count until
 * answered).
 *
 * Each server gets two connections: one for reads, one for writes, so a
 * Lookup's GETs never queue behind a window of large SETs (the server
 * serves its connections in turn).
 *
 * Cluster (redis-cluster://): the slot map comes from CLUSTER SLOTS on a
 * seed, keys go to their slot's master (CRC16 of the key), two
 * connections per master; a MOVED or ASK answer is a miss that refreshes
 * the map (at most once a second).
 */
#ifndef KVS_DAEMON_TIER_REMOTE_H
#define KVS_DAEMON_TIER_REMOTE_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "daemon/core/core.h"
#include "daemon/tiers/tier_hist.h"

typedef struct tier_remote tier_remote;
typedef struct tier_remote_get tier_remote_get;

typedef struct tier_remote_config {
  const char *url;        /* redis://, unix://, redis-cluster:// */
  const char *password_file; /* "" or NULL: none (else overrides the URL's) */
  const char *prefix;     /* key prefix */
  uint32_t ttl_ms;        /* 0: no expiry */
  uint32_t timeout_ms;    /* a read's longest wait */
  uint64_t inflight_bytes;
  uint64_t block_bytes;   /* the pool's block_stride */
  uint32_t block_size;    /* tokens per block */
  kvs_hash128 root;       /* core_root_hash(layout, model id) */
} tier_remote_config;

/* Parses the URL and starts connecting (the first connection may come up
 * later: until then reads miss).  KVS_EINVAL with a reason for a bad URL
 * or password file, KVS_ENOMEM. */
int tier_remote_open(uv_loop_t *loop, const tier_remote_config *rc, tier_remote **out,
                char *err, size_t err_len);
/* What tier_remote_open checks first, without connecting: the URL's form
 * and the password file (password_file may be NULL or "").  0, or
 * KVS_EINVAL with a reason, KVS_ENOMEM. */
int tier_remote_check(const char *url, const char *password_file, char *err,
                      size_t err_len);
/* Disconnects: writes already sent are flushed (up to 2 s), reads in
 * flight end as misses; the handles close on the loop, then rm is freed. */
void tier_remote_close(tier_remote *rm);

/* ---- reads ---------------------------------------------------------------- */

typedef void (*tier_remote_get_cb)(tier_remote_get *g);

/* A read of the values of n consecutive blocks of a chain (one pipelined
 * round trip).  cb runs once, on the loop, when every answer is in or the
 * timeout passes; then found = the blocks from the first that came back
 * good, in a row. */
struct tier_remote_get {
  tier_remote_get_cb cb;
  void *data;
  uint32_t n;
  uint32_t found;
};

/* Starts a read of hashes[0..n) (tokens: their n * block_size token ids to
 * check against the values', or NULL).  0 and *out; KVS_ELIMIT when the
 * store is not connected or the in-flight bound is reached (nothing sent:
 * a miss), KVS_ENOMEM. */
int tier_remote_get_start(tier_remote *rm, const kvs_hash128 *hashes, uint32_t n,
                     const uint32_t *tokens, tier_remote_get_cb cb, void *data,
                     tier_remote_get **out);
/* Block i's bytes (i < found): block_bytes of them, valid until release. */
const void *tier_remote_get_data(const tier_remote_get *g, uint32_t i);
/* The owner is done with g (after cb, or before it: cb is then never
 * called).  Its memory goes when the last answer is in. */
void tier_remote_get_release(tier_remote_get *g);

/* ---- writes --------------------------------------------------------------- */

/* A write is built in a buffer of tier_remote_put_size bytes whose block bytes
 * go at tier_remote_put_offset (so the copy engine can fill it in place). */
size_t tier_remote_put_size(const tier_remote *rm);
size_t tier_remote_put_offset(const tier_remote *rm);
/* How many writes may go now (0 when not connected): within the in-flight
 * bound, and within the write window (1 MiB, at least two writes, waiting
 * for answers), so that a Lookup's reads never queue behind more than
 * that on a connection. */
uint32_t tier_remote_put_room(const tier_remote *rm);
/* cb(data, h, ok) when the write of h is answered (room for another; ok:
 * the server stored it).  cb must not call tier_remote_put from inside: it
 * schedules the writes. */
void tier_remote_set_room_cb(tier_remote *rm,
                             void (*cb)(void *, kvs_hash128, int),
                             void *data);
/* Sends the write of block hash h (tokens: its block_size token ids, or
 * NULL) whose bytes are at buf + tier_remote_put_offset; buf may be reused on
 * return.  0, or KVS_ELIMIT (not connected, or no room: skipped). */
int tier_remote_put(tier_remote *rm, void *buf, kvs_hash128 h, const uint32_t *tokens);

/* ---- state ---------------------------------------------------------------- */

typedef struct tier_remote_stats {
  uint32_t nodes, nodes_up;
  uint64_t inflight_bytes;
  uint64_t gets;              /* reads started */
  uint64_t get_blocks;        /* blocks asked for */
  uint64_t hit_blocks;        /* came back good */
  uint64_t miss_blocks;       /* not there (nil) */
  uint64_t bad_blocks;        /* a header, length or checksum that did not
                                 match: never served */
  uint64_t error_blocks;      /* error answers, lost connections */
  uint64_t timeouts;          /* reads cut by timeout_ms */
  uint64_t unavailable;       /* reads not sent: down or at the bound */
  uint64_t puts, put_bytes;   /* writes answered OK */
  uint64_t put_errors;        /* writes refused or lost */
  uint64_t puts_skipped;      /* writes not sent: down or at the bound */
  uint64_t bytes_read;        /* value bytes that came back good */
  uint64_t reconnects;        /* connections made again after a loss */
  uint64_t dropped;           /* connections dropped for their replies: over
                                 a bound, not RESP2, unasked for, or silent
                                 while owing answers (resp_gate.h) */
  uint64_t slot_refreshes;    /* cluster slot map reloads */
  tier_hist get_hist;         /* a read of a chain: sent to its last answer */
  tier_hist put_hist;         /* a write: sent to its answer */
} tier_remote_stats;

void tier_remote_get_stats(const tier_remote *rm, tier_remote_stats *st);
/* acc += x, counter by counter (nodes too: the partitions' tiers). */
void tier_remote_stats_add(tier_remote_stats *acc,
                           const tier_remote_stats *x);
/* A one-line description for the log (no password). */
const char *tier_remote_describe(const tier_remote *rm);

#endif
