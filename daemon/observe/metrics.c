/*
 * metrics.c — /metrics in the Prometheus text format (metrics.h).
 *
 * Two threads: the loop (owner of every number: metrics_request,
 * metrics_batch, and the snapshot taken in on_async) and libmicrohttpd's
 * thread (the HTTP side: asks for a snapshot, waits, renders).  They share
 * only the struct's mutex-guarded part: want/done generations, closing, and
 * the snapshot.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <malloc.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "daemon/log.h"
#include "daemon/observe/metrics.h"
#include "kvs_asan.h"
#include "kvs_op.h"

#if KVS_ASAN /* (the runtime's interface; gcc installs no header) */
size_t __sanitizer_get_current_allocated_bytes(void);
#endif

#define SCRAPE_WAIT_MS 1000

/* Request latency buckets, seconds (upper bounds; +Inf after). */
static const double lat_le[] = {5e-6,   1e-5,  2.5e-5, 5e-5, 1e-4, 2.5e-4,
                                5e-4,   1e-3,  2.5e-3, 5e-3, 1e-2, 2.5e-2,
                                5e-2,   0.1,   0.25,   0.5,  1,    2.5};
#define LAT_N (sizeof(lat_le) / sizeof(lat_le[0]))
/* Ops per batch: 1, 2, 4, ... 16384 (the default max_batch_ops); +Inf. */
#define BAT_N 15

/* The label of a request kind. */
static const char *op_label(int op) {
  if (op == METRICS_BATCH)
    return "batch";
  if (op == METRICS_PACKED_BATCH)
    return "packed_batch";
  return kvs_op_name((unsigned)op);
}

_Static_assert(METRICS_OPS == KVS_OP_CODES + 1 &&
                   METRICS_PACKED_BATCH == KVS_OP_CODES &&
                   METRICS_BATCH < KVS_OP_CODES,
               "the request kinds are the op codes and two batch kinds");

typedef struct hist {
  uint64_t lat[METRICS_OPS][LAT_N + 1];
  uint64_t lat_sum_ns[METRICS_OPS];
  uint64_t bat[BAT_N + 1];
  uint64_t bat_sum;
} hist;

/* One scrape's numbers: the daemon's, and the histograms. */
typedef struct msnap {
  metrics_snap d;
  double start_time;
  hist h;
} msnap;

struct metrics {
  metrics_snapshot_fn snapshot;
  void *snapshot_arg;
  struct MHD_Daemon *httpd;
  uv_async_t async;
  hist h;              /* the loop's */
  double start_time;
  /* shared with the HTTP thread, under mu */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t want, done; /* snapshot generations asked for, taken */
  int closing;
  msnap snap;
};

/* ---- the loop's side ------------------------------------------------------ */

void metrics_request(metrics *m, int op, uint64_t ns) {
  double sec = (double)ns * 1e-9;
  size_t i = 0;

  if ((unsigned)op >= METRICS_OPS)
    op = 0;
  while (i < LAT_N && sec > lat_le[i])
    i++;
  m->h.lat[op][i]++;
  m->h.lat_sum_ns[op] += ns;
}

void metrics_batch(metrics *m, uint64_t n) {
  size_t i = 0;

  while (i < BAT_N && n > (1ull << i))
    i++;
  m->h.bat[i]++;
  m->h.bat_sum += n;
}

static void take_snapshot(metrics *m, msnap *o) {
  memset(o, 0, sizeof(*o));
  m->snapshot(m->snapshot_arg, &o->d);
  o->start_time = m->start_time;
  o->h = m->h;
}

static void on_async(uv_async_t *a) {
  metrics *m = a->data;
  msnap *tmp = malloc(sizeof(*tmp));
  uint64_t want;

  if (tmp == NULL)
    return; /* the scrape times out: 503 */
  pthread_mutex_lock(&m->mu);
  want = m->want;
  pthread_mutex_unlock(&m->mu);
  if (want == m->done) {
    free(tmp);
    return;
  }
  take_snapshot(m, tmp);
  pthread_mutex_lock(&m->mu);
  m->snap = *tmp;
  m->done = want;
  pthread_cond_broadcast(&m->cv);
  pthread_mutex_unlock(&m->mu);
  free(tmp);
}

/* ---- the HTTP side -------------------------------------------------------- */

/* A fresh snapshot into out: 0, or -1 (timed out or closing). */
static int fetch(metrics *m, msnap *out) {
  struct timespec dl;
  uint64_t my;
  int rc = 0;

  clock_gettime(CLOCK_MONOTONIC, &dl);
  dl.tv_nsec += (long)(SCRAPE_WAIT_MS % 1000) * 1000000L;
  dl.tv_sec += SCRAPE_WAIT_MS / 1000 + dl.tv_nsec / 1000000000L;
  dl.tv_nsec %= 1000000000L;
  pthread_mutex_lock(&m->mu);
  my = ++m->want;
  if (!m->closing)
    uv_async_send(&m->async);
  while (!m->closing && m->done < my && rc == 0)
    rc = pthread_cond_timedwait(&m->cv, &m->mu, &dl);
  if (m->closing || m->done < my)
    rc = -1;
  else
    *out = m->snap;
  pthread_mutex_unlock(&m->mu);
  return rc ? -1 : 0;
}

/* A label value, escaped as the text format wants (\\, \", \n). */
static void put_label(FILE *f, const char *v) {
  for (; *v; v++) {
    if (*v == '\\' || *v == '"')
      fprintf(f, "\\%c", *v);
    else if (*v == '\n')
      fputs("\\n", f);
    else
      fputc(*v, f);
  }
}

static void family(FILE *f, const char *name, const char *type,
                   const char *help) {
  fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void one(FILE *f, const char *name, const char *type, const char *help,
                uint64_t v) {
  family(f, name, type, help);
  fprintf(f, "%s %llu\n", name, (unsigned long long)v);
}

static void one_d(FILE *f, const char *name, const char *type,
                  const char *help, double v) {
  family(f, name, type, help);
  fprintf(f, "%s %.3f\n", name, v);
}

/* The tiers' numbers, each one family with a value per tier. */
enum tier_field {
  TF_CAPACITY, TF_SLOTS, TF_USED, TF_HELD, TF_DEMOTIONS, TF_PROMOTIONS,
  TF_HITS, TF_DROPS, TF_FAILURES, TF_BYTES_IN, TF_BYTES_OUT, TF_IO_ERRORS,
  TF_CHECKSUMS, TF_BACKOFFS
};

static uint64_t tier_value(const tiers_stats *t, enum tier_field f) {
  switch (f) {
  case TF_CAPACITY: return t->capacity_bytes;
  case TF_SLOTS: return t->core.slots;
  case TF_USED: return t->core.used;
  case TF_HELD: return t->core.held;
  case TF_DEMOTIONS: return t->core.demotions;
  case TF_PROMOTIONS: return t->core.promotions;
  case TF_HITS: return t->core.hit_blocks;
  case TF_DROPS: return t->core.drops;
  case TF_FAILURES: return t->core.failures;
  case TF_BYTES_IN: return t->bytes_in;
  case TF_BYTES_OUT: return t->bytes_out;
  case TF_IO_ERRORS: return t->io_errors;
  case TF_CHECKSUMS: return t->checksum_failures;
  case TF_BACKOFFS: return t->backoffs;
  }
  return 0;
}

static const struct tier_fam {
  const char *name, *type, *help;
  enum tier_field field;
} tier_fams[] = {
    {"kvshare_tier_capacity_bytes", "gauge", "Bytes of the tier.", TF_CAPACITY},
    {"kvshare_tier_slots", "gauge", "Block slots of the tier.", TF_SLOTS},
    {"kvshare_tier_used_slots", "gauge",
     "Slots holding a block (or being written).", TF_USED},
    {"kvshare_tier_held_slots", "gauge",
     "Of the used slots, those swapped-out requests hold.", TF_HELD},
    {"kvshare_tier_demotions_total", "counter", "Blocks written into the tier.",
     TF_DEMOTIONS},
    {"kvshare_tier_promotions_total", "counter",
     "Blocks brought up from the tier.", TF_PROMOTIONS},
    {"kvshare_tier_hit_blocks_total", "counter",
     "Blocks lookups found in the tier.", TF_HITS},
    {"kvshare_tier_drops_total", "counter",
     "Blocks dropped from the tier to make room.", TF_DROPS},
    {"kvshare_tier_failures_total", "counter",
     "Moves into or promotions from the tier that failed.", TF_FAILURES},
    {"kvshare_tier_written_bytes_total", "counter",
     "Bytes written into the tier.", TF_BYTES_IN},
    {"kvshare_tier_read_bytes_total", "counter", "Bytes read from the tier.",
     TF_BYTES_OUT},
    {"kvshare_tier_io_errors_total", "counter",
     "Disk I/O errors (EIO, ENOSPC, short I/O).", TF_IO_ERRORS},
    {"kvshare_tier_checksum_failures_total", "counter",
     "Disk reads that failed their header or checksum.", TF_CHECKSUMS},
    {"kvshare_tier_backoffs_total", "counter",
     "Times demotion into the tier paused after failed writes (the pause "
     "doubles from 10 ms to 5 s while writes keep failing).", TF_BACKOFFS},
};

static void tier_family(FILE *f, const msnap *sn, const struct tier_fam *t) {
  family(f, t->name, t->type, t->help);
  for (uint32_t i = 0; i < sn->d.ntiers; i++)
    fprintf(f, "%s{tier=\"%s\"} %llu\n", t->name, sn->d.tiers[i].name,
            (unsigned long long)tier_value(&sn->d.tiers[i], t->field));
}

/* The tenants' numbers (with tenants only), each one family with a value
 * per tenant. */
enum tenant_field {
  TN_CAPACITY, TN_POOL_BYTES, TN_REQUESTS, TN_SESSIONS, TN_LOOKUPS,
  TN_QUERY_TOKENS, TN_HIT_TOKENS, TN_EVICTIONS, TN_NO_SPACE
};

static uint64_t tenant_value(const metrics_tenant *t, enum tenant_field f) {
  switch (f) {
  case TN_CAPACITY: return t->core.num_blocks;
  case TN_POOL_BYTES: return t->pool_bytes;
  case TN_REQUESTS: return t->core.num_requests;
  case TN_SESSIONS: return t->sessions;
  case TN_LOOKUPS: return t->core.lookups;
  case TN_QUERY_TOKENS: return t->core.query_tokens;
  case TN_HIT_TOKENS: return t->core.hit_tokens;
  case TN_EVICTIONS: return t->core.evictions;
  case TN_NO_SPACE: return t->core.no_space;
  }
  return 0;
}

static const struct tenant_fam {
  const char *name, *type, *help;
  enum tenant_field field;
} tenant_fams[] = {
    {"kvshare_tenant_capacity_blocks", "gauge",
     "Blocks of the tenant's share of the pool.", TN_CAPACITY},
    {"kvshare_tenant_pool_bytes", "gauge",
     "Bytes of the tenant's pool memory.", TN_POOL_BYTES},
    {"kvshare_tenant_requests", "gauge", "The tenant's live requests.",
     TN_REQUESTS},
    {"kvshare_tenant_sessions", "gauge", "The tenant's open sessions.",
     TN_SESSIONS},
    {"kvshare_tenant_lookups_total", "counter", "The tenant's lookups.",
     TN_LOOKUPS},
    {"kvshare_tenant_query_tokens_total", "counter",
     "Tokens of every prompt the tenant looked up.", TN_QUERY_TOKENS},
    {"kvshare_tenant_hit_tokens_total", "counter",
     "The tenant's prompt tokens served from its cache.", TN_HIT_TOKENS},
    {"kvshare_tenant_evictions_total", "counter",
     "The tenant's cached blocks reused for something else.", TN_EVICTIONS},
    {"kvshare_tenant_no_space_total", "counter",
     "The tenant's allocations refused for want of blocks in its share "
     "(ENOSPC).", TN_NO_SPACE},
};

/* One sample NAME{tenant="T"[,EXTRA]} V. */
static void tenant_sample(FILE *f, const char *name, const metrics_tenant *t,
                          const char *extra, uint64_t v) {
  fprintf(f, "%s{tenant=\"", name);
  put_label(f, t->name);
  fprintf(f, "\"%s} %llu\n", extra, (unsigned long long)v);
}

/* The per-tenant series: the pool's families, one line per partition. */
static void render_tenants(FILE *f, const msnap *sn) {
  static const char *const states[] = {"free", "cached", "used"};

  family(f, "kvshare_tenant_blocks", "gauge",
         "Blocks of the tenant's share of the pool by state.");
  for (uint32_t i = 0; i < sn->d.ntenants; i++) {
    const metrics_tenant *t = &sn->d.tenants[i];
    const uint32_t v[] = {t->core.free_blocks, t->core.cached_blocks,
                          t->core.used_blocks};

    for (size_t k = 0; k < 3; k++) {
      char extra[32];

      snprintf(extra, sizeof(extra), ",state=\"%s\"", states[k]);
      tenant_sample(f, "kvshare_tenant_blocks", t, extra, v[k]);
    }
  }
  for (size_t k = 0; k < sizeof(tenant_fams) / sizeof(tenant_fams[0]); k++) {
    const struct tenant_fam *tf = &tenant_fams[k];

    family(f, tf->name, tf->type, tf->help);
    for (uint32_t i = 0; i < sn->d.ntenants; i++)
      tenant_sample(f, tf->name, &sn->d.tenants[i], "",
                    tenant_value(&sn->d.tenants[i], tf->field));
  }
}

/* A latency histogram's samples: name{labels,le=...} for the n bounds (in
 * seconds) and +Inf, then its sum and count.  b: n + 1 counts. */
static void put_hist(FILE *f, const char *name, const char *labels,
                     const uint64_t *b, size_t n, const double *le,
                     uint64_t sum_ns) {
  uint64_t cum = 0;
  const char *sep = labels[0] ? "," : "";

  for (size_t i = 0; i <= n; i++) {
    cum += b[i];
    if (i < n)
      fprintf(f, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels, sep, le[i],
              (unsigned long long)cum);
    else
      fprintf(f, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, sep,
              (unsigned long long)cum);
  }
  fprintf(f, "%s_sum%s%s%s %.9f\n", name, labels[0] ? "{" : "", labels,
          labels[0] ? "}" : "", (double)sum_ns * 1e-9);
  fprintf(f, "%s_count%s%s%s %llu\n", name, labels[0] ? "{" : "", labels,
          labels[0] ? "}" : "", (unsigned long long)cum);
}

static void render_hist(FILE *f, const msnap *sn) {
  family(f, "kvshare_request_duration_seconds", "histogram",
         "Time from a request's frame being taken up to its reply being "
         "queued (promotions and daemon copies included), by op.");
  for (int op = 1; op < METRICS_OPS; op++) {
    char labels[48];

    snprintf(labels, sizeof(labels), "op=\"%s\"", op_label(op));
    put_hist(f, "kvshare_request_duration_seconds", labels, sn->h.lat[op],
             LAT_N, lat_le, sn->h.lat_sum_ns[op]);
  }
  family(f, "kvshare_batch_ops", "histogram",
         "Ops per Batch or PackedBatch request.");
  {
    uint64_t cum = 0;

    for (size_t i = 0; i <= BAT_N; i++) {
      cum += sn->h.bat[i];
      if (i < BAT_N)
        fprintf(f, "kvshare_batch_ops_bucket{le=\"%llu\"} %llu\n",
                1ull << i, (unsigned long long)cum);
      else
        fprintf(f, "kvshare_batch_ops_bucket{le=\"+Inf\"} %llu\n",
                (unsigned long long)cum);
    }
    fprintf(f, "kvshare_batch_ops_sum %llu\n",
            (unsigned long long)sn->h.bat_sum);
    fprintf(f, "kvshare_batch_ops_count %llu\n", (unsigned long long)cum);
  }
}

/* One tier latency histogram (tier_hist.h's bounds). */
static void put_tier_hist(FILE *f, const char *name, const char *labels,
                          const tier_hist *h) {
  double le[TIER_HIST_N];

  for (size_t i = 0; i < TIER_HIST_N; i++)
    le[i] = (double)tier_hist_le_ns[i] * 1e-9;
  put_hist(f, name, labels, h->b, TIER_HIST_N, le, h->sum_ns);
}

/* The latency histograms of the tiers that exist. */
static void render_tier_hists(FILE *f, const msnap *sn) {
  static const char *const dirs[] = {"promotion", "demotion"};
  int host = 0, disk = 0;

  for (uint32_t i = 0; i < sn->d.ntiers; i++) {
    host |= strcmp(sn->d.tiers[i].name, "host") == 0;
    disk |= strcmp(sn->d.tiers[i].name, "disk") == 0;
  }
  for (int d = 0; d < 2 && (host || disk); d++) {
    char name[64], labels[32];

    snprintf(name, sizeof(name), "kvshare_tier_%s_duration_seconds", dirs[d]);
    family(f, name, "histogram",
           d == 0 ? "Blocks brought up from a tier (promotions, swap-ins): "
                    "each block's time from its batch's start to its end."
                  : "Blocks copied down to a tier (demotions, swap-outs): "
                    "each block's time from its batch's start to its end.");
    if (host) {
      snprintf(labels, sizeof(labels), "tier=\"host\"");
      put_tier_hist(f, name, labels, &sn->d.th[TIER_HIST_HOST_UP + d]);
    }
    if (disk) {
      snprintf(labels, sizeof(labels), "tier=\"disk\"");
      put_tier_hist(f, name, labels, &sn->d.th[TIER_HIST_DISK_UP + d]);
    }
  }
  if (sn->d.remote_on) {
    family(f, "kvshare_remote_get_duration_seconds", "histogram",
           "Reads of a chain from the remote tier: sent to the last answer.");
    put_tier_hist(f, "kvshare_remote_get_duration_seconds", "",
                  &sn->d.th[TIER_HIST_REMOTE_GET]);
    family(f, "kvshare_remote_put_duration_seconds", "histogram",
           "Writes of a block to the remote tier: sent to the server's OK.");
    put_tier_hist(f, "kvshare_remote_put_duration_seconds", "",
                  &sn->d.th[TIER_HIST_REMOTE_PUT]);
  }
}

/* The process, as Prometheus client libraries name it: CPU, memory, file
 * descriptors (read from /proc on the HTTP thread). */
static void render_process(FILE *f, double start_time) {
  unsigned long utime = 0, stime = 0, vsize = 0;
  long rss = 0, tick = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
  struct rlimit rl;
  FILE *st = fopen("/proc/self/stat", "r");
  DIR *d;
  int fds = 0, have = 0;

  if (st) {
    char buf[1024], *p;
    size_t n = fread(buf, 1, sizeof(buf) - 1, st);

    buf[n] = '\0';
    /* after the command's closing parenthesis: state is field 3 */
    p = strrchr(buf, ')');
    have = p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u "
                       "%lu %lu %*d %*d %*d %*d %*d %*d %*u %lu %ld",
                       &utime, &stime, &vsize, &rss) == 4;
    fclose(st);
  }
  if (have && tick > 0) {
    one_d(f, "process_cpu_seconds_total", "counter",
          "User and system CPU time spent, seconds.",
          (double)(utime + stime) / (double)tick);
    one(f, "process_virtual_memory_bytes", "gauge",
        "Virtual memory size, bytes.", vsize);
    one(f, "process_resident_memory_bytes", "gauge",
        "Resident memory size, bytes.", (uint64_t)rss * (uint64_t)page);
  }
  if ((d = opendir("/proc/self/fd")) != NULL) {
    struct dirent *e;

    while ((e = readdir(d)) != NULL)
      fds += e->d_name[0] != '.';
    closedir(d);
    one(f, "process_open_fds", "gauge", "Open file descriptors.",
        (uint64_t)(fds - 1)); /* (not the one reading the folder) */
  }
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
    one(f, "process_max_fds", "gauge", "The limit of open file descriptors.",
        rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : (uint64_t)rl.rlim_cur);
  one_d(f, "process_start_time_seconds", "gauge",
        "When the process started, seconds since the epoch.", start_time);
}

/* Bytes the heap has handed out and not taken back: what the daemon holds,
 * which RSS shows only as a high-water mark (freed memory stays mapped).
 * glibc's count over all its arenas; under AddressSanitizer (whose
 * allocator glibc's does not see), the sanitizer's. */
static void render_heap(FILE *f) {
  uint64_t bytes;
#if KVS_ASAN
  bytes = __sanitizer_get_current_allocated_bytes();
#else
  struct mallinfo2 mi = mallinfo2();

  bytes = (uint64_t)mi.uordblks + (uint64_t)mi.hblkhd;
#endif
  one(f, "kvshare_heap_bytes", "gauge",
      "Bytes of the daemon's heap allocated and not freed.", bytes);
}

static void render(FILE *f, const msnap *sn) {
  const core_stats *c = &sn->d.core;

  family(f, "kvshare_info", "gauge",
         "The daemon and its pool (labels); always 1.");
  fputs("kvshare_info{backend=\"", f);
  put_label(f, sn->d.backend);
  fputs("\",gpu_uuid=\"", f);
  put_label(f, sn->d.gpu_uuid);
  fputs("\",policy=\"", f);
  put_label(f, sn->d.policy);
  fputs("\",model_id=\"", f);
  put_label(f, sn->d.model_id);
  fputs("\",version=\"", f);
  put_label(f, sn->d.version);
  fputs("\"} 1\n", f);
  family(f, "kvshare_start_time_seconds", "gauge",
         "When the daemon started, seconds since the epoch.");
  fprintf(f, "kvshare_start_time_seconds %.3f\n", sn->start_time);

  family(f, "kvshare_pool_blocks", "gauge", "Blocks of the pool by state.");
  fprintf(f, "kvshare_pool_blocks{state=\"free\"} %u\n", c->free_blocks);
  fprintf(f, "kvshare_pool_blocks{state=\"cached\"} %u\n", c->cached_blocks);
  fprintf(f, "kvshare_pool_blocks{state=\"used\"} %u\n", c->used_blocks);
  one(f, "kvshare_pool_size_blocks", "gauge", "Blocks in the pool.",
      c->num_blocks);
  one(f, "kvshare_pool_bytes", "gauge", "Bytes of the pool's memory.",
      sn->d.pool_bytes);
  one(f, "kvshare_block_size_tokens", "gauge", "Tokens per block.",
      sn->d.block_size);
  one(f, "kvshare_indexed_blocks", "gauge",
      "Hashes in the prefix index (cached blocks, and sealed ones in use).",
      c->indexed_blocks);
  one(f, "kvshare_requests", "gauge", "Live requests, all sessions.",
      c->num_requests);
  one(f, "kvshare_swapped_requests", "gauge",
      "Requests swapped out now (or swapping).", c->swapped_requests);

  one(f, "kvshare_lookups_total", "counter", "Lookups.", c->lookups);
  one(f, "kvshare_lookup_tokens_total", "counter",
      "Tokens of every looked-up prompt.", c->query_tokens);
  one(f, "kvshare_hit_tokens_total", "counter",
      "Prompt tokens served from the cache.", c->hit_tokens);
  one(f, "kvshare_hit_blocks_total", "counter", "Full blocks lookups hit.",
      c->hit_blocks);
  one(f, "kvshare_miss_blocks_total", "counter", "Full blocks lookups missed.",
      c->miss_blocks);
  one(f, "kvshare_allocated_blocks_total", "counter",
      "Blocks handed out by Allocate, Append and promotions.",
      c->allocated_blocks);
  one(f, "kvshare_evictions_total", "counter",
      "Cached blocks reused for something else.", c->evictions);
  one(f, "kvshare_sealed_blocks_total", "counter",
      "Full blocks hashed and published.", c->sealed_blocks);
  one(f, "kvshare_cow_copies_total", "counter",
      "Copy-on-write pairs handed to clients.", c->cow_copies);
  one(f, "kvshare_no_space_total", "counter",
      "Allocations refused for want of blocks (ENOSPC).", c->no_space);

  one(f, "kvshare_sessions", "gauge", "Open sessions.", sn->d.sessions);
  one(f, "kvshare_frames_total", "counter", "Frames received.",
      sn->d.frames_in);
  one(f, "kvshare_compact_frames_total", "counter",
      "Of the frames received, those in the compact encoding.",
      sn->d.compact_frames);
  one(f, "kvshare_protocol_errors_total", "counter",
      "Frames refused as malformed or out of place.", sn->d.protocol_errors);
  one(f, "kvshare_queued_bytes", "gauge",
      "Reply bytes queued for all sessions, not yet written.", sn->d.queued);
  if (sn->d.rings_on) {
    one(f, "kvshare_ring_requests_total", "counter",
        "Requests taken from request rings (KVS_RING=1 sessions).",
        sn->d.ring_requests);
    one(f, "kvshare_ring_socket_replies_total", "counter",
        "Replies to ring requests too big for the ring, sent on the socket.",
        sn->d.ring_socket_replies);
    one(f, "kvshare_ring_wakeups_total", "counter",
        "Times a client woke the daemon from its sleep (past ring_poll_us).",
        sn->d.ring_wakeups);
  }
  one(f, "kvshare_daemon_copies_total", "counter",
      "Copy jobs the daemon's copy engine ran.", sn->d.copies);
  one(f, "kvshare_daemon_copy_blocks_total", "counter",
      "Blocks the daemon's copy engine copied.", sn->d.copy_blocks);
  one(f, "kvshare_copy_errors_total", "counter",
      "Copy jobs that failed (their sessions closed).", sn->d.copy_errors);

  one(f, "kvshare_tier_lost_total", "counter",
      "Cached blocks evicted with no copy below (demotion did not keep up).",
      c->tier_lost);
  for (size_t i = 0; i < sizeof(tier_fams) / sizeof(tier_fams[0]); i++)
    tier_family(f, sn, &tier_fams[i]);

  one(f, "kvshare_swap_outs_total", "counter", "SwapOuts done.", c->swap_outs);
  one(f, "kvshare_swap_ins_total", "counter",
      "SwapIns that restored every token.", c->swap_ins);
  one(f, "kvshare_swap_failures_total", "counter",
      "SwapOuts undone and SwapIns cut short.", c->swap_failures);
  one(f, "kvshare_swap_out_blocks_total", "counter",
      "Blocks copied down by SwapOuts.", c->swap_out_blocks);
  one(f, "kvshare_swap_in_blocks_total", "counter",
      "Blocks copied up by SwapIns.", c->swap_in_blocks);

  if (sn->d.ntenants)
    render_tenants(f, sn);

  if (sn->d.events_on) {
    one(f, "kvshare_kv_event_batches_total", "counter",
        "KV event batches published.", sn->d.ev.batches);
    family(f, "kvshare_kv_event_blocks_total", "counter",
           "Blocks in published KV events, by event.");
    fprintf(f, "kvshare_kv_event_blocks_total{event=\"stored\"} %llu\n",
            (unsigned long long)sn->d.ev.stored);
    fprintf(f, "kvshare_kv_event_blocks_total{event=\"removed\"} %llu\n",
            (unsigned long long)sn->d.ev.removed);
    one(f, "kvshare_kv_event_dropped_total", "counter",
        "KV event batches lost to memory (drops per subscriber are not seen).",
        sn->d.ev.dropped);
    one(f, "kvshare_kv_event_replays_total", "counter",
        "Replay requests answered.", sn->d.ev.replays);
    one(f, "kvshare_kv_event_bad_requests_total", "counter",
        "Malformed replay requests.", sn->d.ev.bad_requests);
    one(f, "kvshare_kv_event_subscriptions_total", "counter",
        "Subscriptions taken (a prefix of the topic).", sn->d.ev.subscriptions);
    one(f, "kvshare_kv_event_refused_subscriptions_total", "counter",
        "Subscriptions that could never match the topic: ignored.",
        sn->d.ev.refused_subscriptions);
    one(f, "kvshare_kv_event_subscriber_drops_total", "counter",
        "Event connections dropped for sending 1024 subscriptions that "
        "could never match.", sn->d.ev.subscriber_drops);
    one(f, "kvshare_kv_event_kept_batches", "gauge",
        "KV event batches kept for replay.", sn->d.ev.kept);
    one(f, "kvshare_kv_event_kept_bytes", "gauge",
        "Bytes of the KV event batches kept for replay.", sn->d.ev.kept_bytes);
    one(f, "kvshare_kv_event_tier_blocks_total", "counter",
        "Of the blocks in published KV events, copies in the tiers below "
        "the pool (medium CPU, DISK, REMOTE).", sn->d.ev.tier_blocks);
    one(f, "kvshare_kv_event_key_failures_total", "counter",
        "Engine block keys not used (no memory, or the block's copies below "
        "went out under the daemon's hash, which it keeps).",
        sn->d.ev.key_failures);
    one(f, "kvshare_kv_event_lora_failures_total", "counter",
        "LoRA names not kept (4096 known already): published as nil.",
        sn->d.ev.lora_failures);
  }
  if (sn->d.remote_on) {
    const tier_remote_stats *r = &sn->d.rs;
    one(f, "kvshare_remote_nodes", "gauge",
        "Servers of the remote tier (cluster masters).", r->nodes);
    one(f, "kvshare_remote_nodes_up", "gauge",
        "Servers of the remote tier connected now.", r->nodes_up);
    one(f, "kvshare_remote_inflight_bytes", "gauge",
        "Bytes of reads and writes waiting for the remote tier.",
        r->inflight_bytes);
    one(f, "kvshare_remote_reads_total", "counter",
        "Lookups that asked the remote tier.", r->gets);
    family(f, "kvshare_remote_read_blocks_total", "counter",
           "Blocks asked of the remote tier, by answer.");
    fprintf(f, "kvshare_remote_read_blocks_total{answer=\"hit\"} %llu\n"
            "kvshare_remote_read_blocks_total{answer=\"miss\"} %llu\n"
            "kvshare_remote_read_blocks_total{answer=\"bad\"} %llu\n"
            "kvshare_remote_read_blocks_total{answer=\"error\"} %llu\n",
            (unsigned long long)r->hit_blocks,
            (unsigned long long)r->miss_blocks,
            (unsigned long long)r->bad_blocks,
            (unsigned long long)r->error_blocks);
    one(f, "kvshare_remote_timeouts_total", "counter",
        "Remote reads cut short by remote_tier_timeout_ms.", r->timeouts);
    one(f, "kvshare_remote_unavailable_total", "counter",
        "Remote reads not sent: no server, or the in-flight bound.",
        r->unavailable);
    one(f, "kvshare_remote_writes_skipped_total", "counter",
        "Remote writes not sent: no server, or the in-flight bound.",
        r->puts_skipped);
    one(f, "kvshare_remote_reconnects_total", "counter",
        "Connections to the remote tier made again after a loss.",
        r->reconnects);
    one(f, "kvshare_remote_dropped_total", "counter",
        "Connections to the remote tier dropped for their replies (over a "
        "bound, not RESP2, not asked for, or silent while owing answers).",
        r->dropped);
  }
  render_hist(f, sn);
  render_tier_hists(f, sn);
  render_process(f, sn->start_time);
  render_heap(f);
}

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned code,
                             const char *type, char *body, size_t len) {
  struct MHD_Response *r =
      MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
  enum MHD_Result rc;

  if (r == NULL) {
    free(body);
    return MHD_NO;
  }
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
  rc = MHD_queue_response(conn, code, r);
  MHD_destroy_response(r);
  return rc;
}

static enum MHD_Result reply_text(struct MHD_Connection *conn, unsigned code,
                                  const char *text) {
  char *b = strdup(text);

  return b ? reply(conn, code, "text/plain; charset=utf-8", b, strlen(b))
           : MHD_NO;
}

static enum MHD_Result on_http(void *cls, struct MHD_Connection *conn,
                               const char *url, const char *method,
                               const char *version, const char *upload,
                               size_t *upload_size, void **state) {
  metrics *m = cls;
  msnap *sn;
  char *body = NULL;
  size_t len = 0;
  FILE *f;

  (void)version;
  (void)upload;
  (void)state;
  if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
    return reply_text(conn, MHD_HTTP_METHOD_NOT_ALLOWED,
                      "only GET and HEAD\n");
  if (*upload_size)
    return MHD_NO;
  if (strcmp(url, "/") == 0)
    return reply_text(conn, MHD_HTTP_OK, "kvshared: metrics at /metrics\n");
  if (strcmp(url, "/metrics") != 0)
    return reply_text(conn, MHD_HTTP_NOT_FOUND, "not found; try /metrics\n");
  sn = malloc(sizeof(*sn));
  if (sn == NULL)
    return reply_text(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "out of memory\n");
  if (fetch(m, sn) < 0) {
    free(sn);
    return reply_text(conn, MHD_HTTP_SERVICE_UNAVAILABLE,
                      "the daemon is stopping or busy; retry\n");
  }
  f = open_memstream(&body, &len);
  if (f == NULL) {
    free(sn);
    return reply_text(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "out of memory\n");
  }
  render(f, sn);
  free(sn);
  if (fclose(f) != 0 || body == NULL) {
    free(body);
    return reply_text(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "out of memory\n");
  }
  return reply(conn, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8",
               body, len);
}

/* ---- start / stop --------------------------------------------------------- */

static struct MHD_Daemon *start_httpd(metrics *m, unsigned flags,
                                      const struct sockaddr_storage *ss) {
  return MHD_start_daemon(flags, 0, NULL, NULL, on_http, m,
                          MHD_OPTION_SOCK_ADDR, (const struct sockaddr *)ss,
                          MHD_OPTION_CONNECTION_LIMIT, (unsigned)16,
                          MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10,
                          MHD_OPTION_END);
}

static void on_async_closed(uv_handle_t *h) {
  metrics *m = h->data;

  pthread_cond_destroy(&m->cv);
  pthread_mutex_destroy(&m->mu);
  free(m);
}

int metrics_start(uv_loop_t *loop, const cfg *c, metrics_snapshot_fn snapshot,
                  void *arg, metrics **out, char *err, size_t len) {
  struct sockaddr_storage ss;
  const union MHD_DaemonInfo *info;
  pthread_condattr_t ca;
  struct timespec now;
  char addr[INET6_ADDRSTRLEN + 8] = "?";
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL;
  socklen_t sl = 0;
  metrics *m;

  *out = NULL;
  if (!c->metrics_listen[0])
    return 0;
  if (cfg_listen_addr(c->metrics_listen, &ss, &sl, err, len) < 0)
    return -1;
  m = calloc(1, sizeof(*m));
  if (m == NULL) {
    snprintf(err, len, "out of memory");
    return -1;
  }
  m->snapshot = snapshot;
  m->snapshot_arg = arg;
  clock_gettime(CLOCK_REALTIME, &now);
  m->start_time = (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
  pthread_mutex_init(&m->mu, NULL);
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&m->cv, &ca);
  pthread_condattr_destroy(&ca);
  if (uv_async_init(loop, &m->async, on_async) < 0) {
    snprintf(err, len, "uv_async_init failed");
    pthread_cond_destroy(&m->cv);
    pthread_mutex_destroy(&m->mu);
    free(m);
    return -1;
  }
  m->async.data = m;
  if (ss.ss_family == AF_INET6) {
    flags |= MHD_USE_IPv6;
    if (IN6_IS_ADDR_UNSPECIFIED(&((struct sockaddr_in6 *)&ss)->sin6_addr))
      flags |= MHD_USE_DUAL_STACK;
  }
  m->httpd = start_httpd(m, flags, &ss);
  if (m->httpd == NULL && (flags & MHD_USE_DUAL_STACK) == MHD_USE_DUAL_STACK) {
    /* *:PORT on a host without IPv6: every IPv4 address instead. */
    struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
    uint16_t port = ((struct sockaddr_in6 *)&ss)->sin6_port;

    memset(&ss, 0, sizeof(ss));
    a4->sin_family = AF_INET;
    a4->sin_addr.s_addr = htonl(INADDR_ANY);
    a4->sin_port = port;
    flags &= ~(unsigned)MHD_USE_DUAL_STACK;
    m->httpd = start_httpd(m, flags, &ss);
  }
  if (m->httpd == NULL) {
    snprintf(err, len, "cannot serve metrics on %s (address in use, or not "
             "this machine's?)", c->metrics_listen);
    uv_close((uv_handle_t *)&m->async, on_async_closed);
    return -1;
  }
  info = MHD_get_daemon_info(m->httpd, MHD_DAEMON_INFO_BIND_PORT);
  if (ss.ss_family == AF_INET)
    inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, addr,
              sizeof(addr));
  else if (IN6_IS_ADDR_UNSPECIFIED(&((struct sockaddr_in6 *)&ss)->sin6_addr))
    snprintf(addr, sizeof(addr), "*");
  else {
    addr[0] = '[';
    inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, addr + 1,
              sizeof(addr) - 2);
    strcat(addr, "]");
  }
  log_info(0, "metrics: http://%s:%u/metrics", addr,
           info ? (unsigned)info->port : 0u);
  *out = m;
  return 0;
}

void metrics_stop(metrics *m) {
  if (m == NULL)
    return;
  pthread_mutex_lock(&m->mu);
  m->closing = 1;
  pthread_cond_broadcast(&m->cv);
  pthread_mutex_unlock(&m->mu);
  MHD_stop_daemon(m->httpd); /* joins the HTTP thread */
  uv_close((uv_handle_t *)&m->async, on_async_closed);
}
