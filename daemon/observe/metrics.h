/*
 * metrics.h — Prometheus metrics at http://ADDR:PORT/metrics
 * (`metrics_listen`), served by libmicrohttpd from its own thread.
 *
 * The loop thread owns every number.  A scrape asks the loop for a fresh
 * snapshot (uv_async) and waits for it (at most a second; then it is
 * answered 503), so that one scrape's numbers are all from the same moment
 * between two frames; the HTTP thread renders the text from that copy.
 * The loop also feeds the histograms (request latency per op, ops per
 * batch), which cost one clock read per frame while metrics are on and
 * nothing while they are off.
 */
#ifndef KVS_DAEMON_METRICS_H
#define KVS_DAEMON_METRICS_H

#include <stdint.h>
#include <uv.h>

#include "daemon/config.h"
#include "daemon/core/core.h"
#include "daemon/observe/events.h"
#include "daemon/tiers/tiers.h"

typedef struct metrics metrics;

/* One tenant's partition (daemon/part/partition.h), as a scrape sees it. */
typedef struct metrics_tenant {
  char name[CFG_TENANT_NAME];
  core_stats core;       /* its core's */
  uint32_t sessions;     /* its sessions now */
  uint64_t pool_bytes;   /* its pool memory */
} metrics_tenant;

/* One scrape's numbers, as the daemon hands them over (snapshot_fn). */
typedef struct metrics_snap {
  core_stats core;
  tiers_stats tiers[TIERS_MAX];
  uint32_t ntiers;
  int events_on;
  events_stats ev;
  int remote_on;
  tier_remote_stats rs;
  uint32_t sessions;
  uint64_t frames_in, compact_frames, protocol_errors, queued;
  int rings_on;
  uint64_t ring_requests, ring_socket_replies, ring_wakeups;
  uint64_t copies, copy_blocks, copy_errors;
  uint64_t pool_bytes;
  uint32_t block_size;
  char backend[16], gpu_uuid[64], policy[32], model_id[128], version[32];
  tier_hist th[TIER_HISTS]; /* the tiers' latencies (tier_hist.h) */
  /* With tenants (cfg ntenants > 0), one line per partition, in the
   * configuration's order; ntenants 0 without (no tenant series). */
  metrics_tenant tenants[CFG_MAX_TENANTS];
  uint32_t ntenants;
} metrics_snap;

/* Fills *out from the daemon's modules, on the loop thread. */
typedef void (*metrics_snapshot_fn)(void *arg, metrics_snap *out);

/* Starts serving c->metrics_listen, taking each scrape's numbers from
 * snapshot(arg) on the loop; *out stays NULL when it is empty.  0, or -1
 * with a reason in err. */
int metrics_start(uv_loop_t *loop, const cfg *c, metrics_snapshot_fn snapshot,
                  void *arg, metrics **out, char *err, size_t len);
/* Stops the HTTP thread (a scrape in progress gets 503) and frees.  NULL:
 * nothing. */
void metrics_stop(metrics *m);

/* The kinds of request timed: the op codes (proto/kvs_op.h), and two
 * batch kinds. */
#define METRICS_BATCH 9         /* a Batch of Envelopes */
#define METRICS_PACKED_BATCH 13 /* records: a PackedBatch, a compact batch */
#define METRICS_OPS 14
/* A request of kind op was answered ns after its frame was taken up. */
void metrics_request(metrics *m, int op, uint64_t ns);
/* A Batch or PackedBatch of n ops. */
void metrics_batch(metrics *m, uint64_t n);

#endif
