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

typedef struct srv srv;
typedef struct metrics metrics;

/* Starts serving c->metrics_listen; s->metrics stays NULL when it is
 * empty.  0, or -1 with a reason in err. */
int metrics_start(srv *s, char *err, size_t len);
/* Stops the HTTP thread (a scrape in progress gets 503) and frees. */
void metrics_stop(srv *s);

/* Request op numbers are Kvshare__Request's op cases (1..13). */
#define METRICS_OPS 14
/* A request of kind op was answered ns after its frame was taken up. */
void metrics_request(metrics *m, int op, uint64_t ns);
/* A Batch or PackedBatch of n ops. */
void metrics_batch(metrics *m, uint64_t n);

#endif
