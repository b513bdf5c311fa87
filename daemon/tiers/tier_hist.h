/*
 * tier_hist.h — latency histograms of the tiers' moves (for /metrics).
 */
#ifndef KVS_DAEMON_TIER_HIST_H
#define KVS_DAEMON_TIER_HIST_H

#include <stdint.h>

/*
 * Latency histograms of the tiers' moves: each block moved (or each remote
 * read and write) counts once, with the time from its batch's start to its
 * end.  Bucket bounds in nanoseconds (tier_hist_le_ns), then +Inf.
 */
#define TIER_HIST_N 19
extern const uint64_t tier_hist_le_ns[TIER_HIST_N];
typedef struct tier_hist {
  uint64_t b[TIER_HIST_N + 1];
  uint64_t sum_ns;
} tier_hist;
enum {
  TIER_HIST_HOST_UP = 0, /* promotions (and swap-ins) from the host tier */
  TIER_HIST_HOST_DOWN,   /* demotions (and swap-outs) to it */
  TIER_HIST_DISK_UP,
  TIER_HIST_DISK_DOWN,
  TIER_HIST_REMOTE_GET,  /* a lookup's read of a chain */
  TIER_HIST_REMOTE_PUT,  /* one block's write */
  TIER_HISTS
};
static inline void tier_hist_add(tier_hist *h, uint64_t ns) {
  uint32_t i = 0;

  while (i < TIER_HIST_N && ns > tier_hist_le_ns[i])
    i++;
  h->b[i]++;
  h->sum_ns += ns;
}

/* acc += x, bucket by bucket. */
static inline void tier_hist_merge(tier_hist *acc, const tier_hist *x) {
  for (uint32_t i = 0; i <= TIER_HIST_N; i++)
    acc->b[i] += x->b[i];
  acc->sum_ns += x->sum_ns;
}

#endif
