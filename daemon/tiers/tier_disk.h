/*
 * tier_disk.h — the disk tier's slots: a file or block device, opened
 * O_DIRECT, read and written through io_uring (liburing) without blocking
 * the loop.
 *
 * On disk a slot is one 4 KiB header and the block's bytes (rounded up to
 * 4 KiB).  The header (version 2; little-endian, offsets in bytes):
 *     0  magic (the bytes "KZSTIER1")  8  version (u32)  12  header bytes
 *    16  the block's chained hash (lo, hi: u64 each)
 *    32  data length (u64)          40  XXH3-64 of the data
 *    48  XXH3-64 of the whole 4 KiB header, this field read as zero
 *    56  gen (u64): the tier's write counter, so a restart knows which
 *        copy was written last and orders its LRU by it
 *    64  the layout stamp: block_size, num_layers, num_kv_heads, head_dim,
 *        dtype (u32 each); 84 flags (u32: 1 a cache entry a restart may
 *        restore, not a swapped request's own copy; 2 token ids present)
 *    88  the root hash (lo, hi): layout and model id
 *   128  the block's block_size token ids (u32 each), when they fit
 *        (block_size <= TIER_DISK_MAX_TOKENS) and the core keeps them
 * The rest is zero.
 * Every I/O goes through a staging buffer of the same layout (the buffers
 * are one registered region, so reads and writes are READ_FIXED /
 * WRITE_FIXED on a registered file).  A write fills the header from the
 * hash and the data; a read checks all of it: a short read, an I/O error or
 * a header or checksum that does not match ends the read with KVS_EIO or
 * KVS_ECHECKSUM, and its bytes are never used.
 *
 * Submissions made during a loop turn go to the kernel in one
 * io_uring_submit at the end of it (a uv_check handle); completions come
 * back through an eventfd registered with the ring and watched by uv_poll.
 *
 * Restart (disk_tier_persist): tier_disk_scan reads every slot's header
 * before the loop runs and hands back those a restarted daemon may serve
 * again; the others are counted by why they are not.
 *
 * Fault injection (for tests): a spec of comma-separated KIND:N, each
 * failing the Nth I/O of that kind (counted from 1): read-eio, write-eio,
 * write-enospc, short (the Nth read comes back short), flip (one bit of the
 * Nth read's data is flipped before the checksum is checked).
 */
#ifndef KVS_DAEMON_TIER_DISK_H
#define KVS_DAEMON_TIER_DISK_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "daemon/core/core.h"

typedef struct tier_disk tier_disk;
typedef struct disk_io disk_io;

typedef void (*disk_cb)(disk_io *io);

#define TIER_DISK_MAX_TOKENS 992u /* token ids a header holds */

struct disk_io {
  int write;        /* 1: staging buffer -> slot; 0: slot -> buffer */
  uint32_t slot;
  uint32_t buf;     /* staging buffer (tier_disk_buf_get) */
  kvs_hash128 hash; /* written into the header / expected in it */
  /* a write's header: */
  const uint32_t *tokens; /* the block's token ids, or NULL */
  int restorable;   /* 1: a cache entry (header flag 1) */
  int has_sum;      /* 1: sum is the data's checksum (tier_disk_sum, taken
                       off the loop); 0: the submit takes it */
  uint64_t sum;
  int status;       /* 0, KVS_EIO or KVS_ECHECKSUM (set before cb) */
  disk_cb cb;       /* on the loop thread, once */
  void *data;
  disk_io *next;    /* the tier's */
  uint64_t due_ms;  /* the tier's (its write-slow fault) */
};

typedef struct tier_disk_stats {
  uint64_t reads, writes;       /* completed, good or bad */
  uint64_t bytes_read, bytes_written; /* good ones, data bytes */
  uint64_t io_errors;           /* EIO, ENOSPC, short I/O */
  uint64_t checksum_failures;   /* a header or data checksum mismatch */
} tier_disk_stats;

/* What makes a block of one daemon usable by another: written into every
 * header, compared by tier_disk_scan. */
typedef struct tier_disk_stamp {
  uint32_t block_size, num_layers, num_kv_heads, head_dim, dtype;
  kvs_hash128 root; /* core_root_hash: the layout and the model id */
} tier_disk_stamp;

/* The fewest staging buffers a disk tier gets (tier_disk_open). */
#define TIER_DISK_BUFS_MIN 64

/*
 * Opens path (created when missing; a regular file is sized to hold the
 * slots) for slots of block_bytes, as many as fit in bytes, with nbufs
 * staging buffers (fewer for a tier of fewer slots: as many as its slots,
 * TIER_DISK_BUFS_MIN at least; tier_disk_bufs says how many).  O_DIRECT, unless the file system refuses it (tmpfs):
 * then buffered, and *direct = 0.  fault: NULL or a spec (above).  0, or a
 * negative status with a reason in err.
 */
int tier_disk_open(uv_loop_t *loop, const char *path, uint64_t bytes,
                   uint64_t block_bytes, const tier_disk_stamp *stamp,
                   uint32_t nbufs, const char *fault, tier_disk **out,
                   char *err, size_t err_len);
/* Every I/O must have completed (tier_disk_idle). */
void tier_disk_close(tier_disk *d);

uint32_t tier_disk_slots(const tier_disk *d);
int tier_disk_direct(const tier_disk *d);
int tier_disk_registered(const tier_disk *d);
/* Staging buffers: a free one (0, or KVS_ELIMIT when none), its data area,
 * giving it back. */
int tier_disk_buf_get(tier_disk *d, uint32_t *buf);
void *tier_disk_buf_data(const tier_disk *d, uint32_t buf);
void tier_disk_buf_put(tier_disk *d, uint32_t buf);
uint32_t tier_disk_bufs_free(const tier_disk *d);
/* How many staging buffers it has. */
uint32_t tier_disk_bufs(const tier_disk *d);
/* The checksum a slot's header holds of a staging buffer's data area
 * (any thread: it reads only the buffer). */
uint64_t tier_disk_sum(const tier_disk *d, uint32_t buf);
/* The staging buffers' memory, all of it (to pin it for a GPU's copies). */
void tier_disk_bufs_region(const tier_disk *d, void **p, size_t *len);

typedef struct tier_disk_scan_stats {
  uint32_t slots, empty;   /* read; never written (all zero) */
  uint32_t good;           /* handed to the callback */
  uint32_t torn;           /* bad magic or header checksum */
  uint32_t other_version, other_layout, other_model;
  uint32_t private_copies; /* a swapped request's own copy */
  uint32_t io_errors;      /* a header read failed or came back short */
  uint64_t max_gen;
  char layout_note[192];   /* the first other layout, in words */
} tier_disk_scan_stats;

/* Called for each good header: slot, gen, hash, token ids (NULL when the
 * header has none). */
typedef void (*tier_disk_scan_cb)(void *arg, uint32_t slot, uint64_t gen,
                                  kvs_hash128 h, const uint32_t *tokens);
/* Reads every slot's header (io_uring, up to nbufs at a time; blocks: call
 * it before the loop serves, with no I/O in flight) and calls cb for those
 * written under this stamp; later writes get gens after the largest seen.
 * 0, or -errno (the ring failed; st says how far it got). */
int tier_disk_scan(tier_disk *d, tier_disk_scan_cb cb, void *arg,
                   tier_disk_scan_stats *st);
/* fdatasync of the file (clean shutdown of a kept tier): 0 or -errno. */
int tier_disk_sync(tier_disk *d);

/* Starts io (submitted at the end of this loop turn). */
void tier_disk_submit(tier_disk *d, disk_io *io);
int tier_disk_idle(const tier_disk *d);
void tier_disk_get_stats(const tier_disk *d, tier_disk_stats *st);

#endif
