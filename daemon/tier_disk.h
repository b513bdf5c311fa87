/*
 * tier_disk.h — the disk tier's slots: a file or block device, opened
 * O_DIRECT, read and written through io_uring (liburing) without blocking
 * the loop.
 *
 * On disk a slot is one 4 KiB header and the block's bytes (rounded up to
 * 4 KiB):
 *   header  magic "KVSTIER1", version, the block's chained hash, the data
 *           length, XXH3-64 of the data, XXH3-64 of the header itself.
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

struct disk_io {
  int write;        /* 1: staging buffer -> slot; 0: slot -> buffer */
  uint32_t slot;
  uint32_t buf;     /* staging buffer (tier_disk_buf_get) */
  kvs_hash128 hash; /* written into the header / expected in it */
  int status;       /* 0, KVS_EIO or KVS_ECHECKSUM (set before cb) */
  disk_cb cb;       /* on the loop thread, once */
  void *data;
  disk_io *next;    /* the tier's */
};

typedef struct tier_disk_stats {
  uint64_t reads, writes;       /* completed, good or bad */
  uint64_t bytes_read, bytes_written; /* good ones, data bytes */
  uint64_t io_errors;           /* EIO, ENOSPC, short I/O */
  uint64_t checksum_failures;   /* a header or data checksum mismatch */
} tier_disk_stats;

/*
 * Opens path (created when missing; a regular file is sized to hold the
 * slots) for slots of block_bytes, as many as fit in bytes, with nbufs
 * staging buffers.  O_DIRECT, unless the file system refuses it (tmpfs):
 * then buffered, and *direct = 0.  fault: NULL or a spec (above).  0, or a
 * negative status with a reason in err.
 */
int tier_disk_open(uv_loop_t *loop, const char *path, uint64_t bytes,
                   uint64_t block_bytes, uint32_t nbufs, const char *fault,
                   tier_disk **out, char *err, size_t err_len);
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

/* Starts io (submitted at the end of this loop turn). */
void tier_disk_submit(tier_disk *d, disk_io *io);
int tier_disk_idle(const tier_disk *d);
void tier_disk_get_stats(const tier_disk *d, tier_disk_stats *st);

#endif
