/*
 * events.h — the KV event stream: the prefix index's changes, published for
 * KV-aware routers in the format vLLM's engines publish theirs.
 *
 * Each core observed (one, or one per tenant) tells of every hash that
 * enters or leaves its index, and of every copy below the pool that comes
 * or goes (core_observer); the events of one loop iteration, of every
 * core, become one batch, msgpack-encoded as vLLM's
 * KVEventBatch: maps (current vLLM) or arrays (older vLLM;
 * kv_events_format), the fields listed in docs/operations.md:
 *
 *   BlockStored    a run of blocks in one medium: in the pool a chain
 *                  (each the parent of the next) with its token ids; in a
 *                  tier (CPU or CPU_TIER, DISK, REMOTE) copies, no chain
 *   BlockRemoved   blocks that left a medium
 *   AllBlocksCleared   at start and at shutdown
 *
 * A block is published under the engine's key when a commit gave one
 * (events_keys_begin; kept while the block is in the pool or a local
 * tier), else under the low 64 bits of the core's 128-bit chained hash.
 * medium is "GPU" for the cuda pool, "CPU" for the host pool.  Each batch
 * goes out on a ZMQ PUB socket as three frames (topic, 8-byte big-endian
 * sequence number, payload); the last kv_events_buffer batches are kept,
 * and a ZMQ ROUTER socket (optional) answers a request [start_seq] with
 * [seq, payload] for each kept batch from start_seq on, then [-1, ""] (the
 * end marker).  Nothing here blocks: a subscriber that cannot keep up
 * loses messages (its sequence numbers jump; it asks for a replay).
 */
#ifndef KVS_DAEMON_EVENTS_H
#define KVS_DAEMON_EVENTS_H

#include <stdint.h>
#include <uv.h>

#include "daemon/config.h"
#include "daemon/core/core.h"
#include "kvs_op.h"

typedef struct events events;

typedef struct events_stats {
  uint64_t batches;       /* published */
  uint64_t stored;        /* BlockStored blocks */
  uint64_t removed;       /* BlockRemoved blocks */
  uint64_t dropped;       /* batches the PUB socket refused (or lost to
                             memory) */
  uint64_t replays;       /* replay requests answered */
  uint64_t bad_requests;  /* malformed replay requests */
  uint64_t subscriptions; /* taken (they can match the topic) */
  uint64_t refused_subscriptions; /* that could never match: ignored */
  uint64_t subscriber_drops; /* connections dropped for too many of them */
  uint64_t tier_blocks;   /* of stored + removed: copies below the pool */
  uint64_t key_failures;  /* engine keys not used (out of memory, or the
                             block had copies below published under the
                             daemon's hash): those blocks keep it */
  uint64_t lora_failures; /* LoRA names not kept (the table of
                             EV_LORAS_MAX is full): published as nil */
  uint32_t kept;          /* batches kept for replay */
  uint64_t kept_bytes;
} events_stats;

/*
 * Binds the sockets of c->kv_events_endpoint (and the replay endpoint),
 * publishes AllBlocksCleared and becomes the observer of each of the
 * ncores (>= 1) cores: the daemon's one, or one per tenant, whose hashes
 * never collide (their roots differ).  Their events go out on the one
 * stream, each as it happens; the copies below that a core holds already
 * (a persisted tier, restored) are published after AllBlocksCleared,
 * core by core.  The cores outlive e (events_close first).  *out = NULL
 * when c->kv_events_endpoint is empty.  0, or -1 with a reason in err.
 */
int events_open(uv_loop_t *loop, const cfg *c, core *const *cores,
                uint32_t ncores, const char *medium, uint32_t block_size,
                events **out, char *err, size_t len);
/* Publishes what is pending and AllBlocksCleared (the daemon's cache goes
 * away), stops observing every core of events_open and closes (the
 * sockets linger up to half a second to deliver).  NULL: nothing. */
void events_close(events *e);
void events_get_stats(const events *e, events_stats *st);

/*
 * A Commit carrying the engine's block keys (op->keys, counts checked) is
 * about to seal its blocks; first: the block-table index of the first block
 * it completes.  The blocks it seals are published with the engine's keys
 * (and LoRA name, extra keys), as are their later moves and removals.
 * -1 with a reason in err: extra keys that are not one msgpack object
 * every subscriber decodes.  events_keys_end after
 * the commit.  e NULL: 0, nothing kept.
 */
int events_keys_begin(events *e, const kvs_op *op, uint32_t first, char *err,
                      size_t len);
void events_keys_end(events *e);

#endif
