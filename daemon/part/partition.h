/*
 * partition.h — one tenant's share of the daemon: its own pool memory (a
 * memfd, or its own VMM chunks on the GPU), its own core (index, free
 * queue, eviction, quota: the partition's size), its own copy engine and
 * tiers (a share of each tier's capacity, its own disk file, its own key
 * space on the remote tier), and the dispatch environment its sessions'
 * ops run against.  A worker of the tenant is handed this partition's
 * descriptors only: it holds no mapping of another tenant's blocks, and
 * every block id it can name is one of its own.
 *
 * Without tenants the daemon has one partition, named "", configured as
 * the daemon is (today's behaviour, byte for byte: the same root hash, the
 * same disk file, the same remote keys).
 *
 * With tenants, partition i has its tenant's share of the pool
 * (cfg_tenant_blocks) and of each tier (host and disk tier bytes in the
 * same proportion), the disk tier's file gets the suffix ".NAME", the
 * remote tier's key prefix gets ":NAME", and the root hash (which every
 * block hash, disk slot header and remote key commits to) is salted by
 * the tenant's name: no block, slot or key of one tenant can be read back
 * as another's, and a checksum over one tenant's block never validates it
 * for another.
 *
 * serve.c opens every partition (part_open: pool and core, before the
 * loop; part_start: copy engine and tiers, on the loop), and closes them
 * in the reverse order (part_stop_movers, part_close).
 */
#ifndef KVS_DAEMON_PARTITION_H
#define KVS_DAEMON_PARTITION_H

#include <stdint.h>
#include <uv.h>

#include "daemon/config.h"
#include "daemon/core/core.h"
#include "daemon/dispatch/dispatch.h"
#include "daemon/pool/backend.h"
#include "daemon/pool/copy.h"
#include "daemon/tiers/tiers.h"

typedef struct partition {
  uint32_t index;
  const char *name;   /* the tenant's; "" without tenants */
  cfg cfg;            /* the daemon's, narrowed to this partition */
  kvs_layout layout;  /* num_blocks: the partition's */
  backend *pool;
  core *core;
  copy_engine copy;
  int copy_open;
  tiers *tiers;       /* NULL: no tier below the pool */
  disp_env disp;      /* what its sessions' ops run against */
} partition;

/* The configuration of partition index of a daemon configured as c (after
 * cfg_finish), holding blocks blocks: into out.  KVS_EINVAL with the
 * reason when a derived value does not fit (a disk path, a key prefix).
 * No I/O. */
int part_config(const cfg *c, uint32_t index, uint32_t blocks,
                uint32_t pool_blocks, cfg *out, char *err, size_t err_len);

/* Opens the partition's pool and core (p zeroed by the caller).  0, or a
 * negative status (logged); part_close undoes what was done. */
int part_open(partition *p, const cfg *c, uint32_t index, uint32_t blocks,
              uint32_t pool_blocks);
/* Its copy engine and tiers, on the loop.  0, or a negative status
 * (logged; part_stop_movers closes what was opened). */
int part_start(partition *p, uv_loop_t *loop, const disp_counts *counts);
/* The copy engine and tiers are idle. */
int part_io_idle(const partition *p);
/* Closes the tiers and the copy engine (idle; their handles close on the
 * loop). */
void part_stop_movers(partition *p);
/* The core's invariant and its emptiness at exit: 0, or -1 (logged). */
int part_check_exit(const partition *p);
/* Destroys the core and releases the pool.  Idempotent. */
void part_close(partition *p);

#endif
