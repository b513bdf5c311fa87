/*
 * top.c — `kvshare top`: a live view of a running kvshared.
 *
 *   kvshare [--socket PATH] top [--interval S] [--count N] [-b | --batch]
 *                               [--json]
 *
 * Every S seconds (default 1, fractions allowed) it takes one sample of the
 * daemon's counters (kvs_stats_get, then kvs_tier_stats_get and, when tiers
 * exist, kvs_swap_stats_get; when the daemon has tenants,
 * kvs_tenant_stats_get) and shows a frame: the pool by state, the token hit
 * rate over the last interval and over the daemon's life, rates computed
 * from counter deltas over the measured time between two samples, sessions
 * and requests, errors, a line per tenant, the tiers and swaps.  Whether
 * the daemon has tenants is asked once, before the first sample (a daemon
 * does not gain them while it runs): without tenants a sample makes no
 * call more than it did before tenants existed.
 *
 * Three outputs:
 *   interactive  stdout is a terminal and neither -b nor --json: the frame
 *                is redrawn in place on the alternate screen (ANSI
 *                sequences); 'q' quits; a resize redraws at the new size;
 *                the terminal is restored on 'q', on SIGINT/SIGTERM/SIGHUP
 *                (after which the signal is raised again) and on ^Z.
 *   batch        plain text frames, one per interval, a blank line between.
 *   json         one JSON object per frame and line.
 *
 * A sample's time is the midpoint of its kvs_stats_get round trip.  The
 * daemon counts top's own requests in frames_in; the frames rate leaves
 * them out (JSON: own_frames).  The first frame has no interval yet: its
 * rates are null ("-").
 *
 * Exit status: 0 after --count frames or 'q', 1 when the daemon goes away
 * (or stops answering) or stdout fails, 2 usage, 3 cannot connect.
 */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "client/cli.h"
#include "client/kvshare.h"

#define TOP_MAX_TIERS 4
#define TOP_MAX_TENANTS 16 /* a daemon's most (daemon/config.h) */
#define TOP_CALL_TIMEOUT_MS 5000 /* a daemon that stops answering: exit 1 */

/* The counters of kvs_stats shown as deltas and rates. */
#define TOP_COUNTERS(X)                                                       \
  X(lookups) X(query_tokens) X(hit_tokens) X(hit_blocks) X(miss_blocks)       \
  X(allocated_blocks) X(evictions) X(sealed_blocks) X(cow_copies)             \
  X(no_space) X(frames_in) X(protocol_errors) X(copy_errors)

typedef struct top_sample {
  double t;             /* CLOCK_MONOTONIC seconds: the Stats call's midpoint */
  double wall;          /* CLOCK_REALTIME seconds, same moment */
  kvs_stats st;
  kvs_tier_stats tiers[TOP_MAX_TIERS];
  uint32_t ntiers;      /* shown: at most TOP_MAX_TIERS */
  uint64_t tier_lost;
  kvs_swap_stats sw;    /* zero without tiers */
  kvs_tenant_stats tenants[TOP_MAX_TENANTS];
  uint32_t ntenants;    /* shown: at most TOP_MAX_TENANTS; 0 without */
  uint32_t calls_after; /* top's frames sent after the Stats call */
} top_sample;

typedef struct top_opts {
  const char *path;
  double interval;
  long count;           /* 0: forever */
  int json, batch;
  int tenants;          /* the daemon has tenants: sample their lines */
} top_opts;

/* Where a text frame goes: lines of at most width columns (longer ones
 * wrap, see top_line); interactive, rows lines at most. */
typedef struct top_out {
  int tty;
  int width, rows, row;
} top_out;

typedef struct top_term {
  int screen;           /* the alternate screen is on */
  int raw;              /* stdin's termios changed (saved holds the old) */
  int keys;             /* stdin is a terminal: read keys from it */
  struct termios saved;
  int cols, rows;
} top_term;

static volatile sig_atomic_t top_stop_sig, top_winch, top_tstp;

static void top_on_signal(int sig) {
  if (sig == SIGWINCH || sig == SIGCONT)
    top_winch = 1; /* redraw (after a resize, or a stop from outside) */
  else if (sig == SIGTSTP)
    top_tstp = 1;
  else if (!top_stop_sig)
    top_stop_sig = sig;
}

static double top_clock(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint64_t top_delta(uint64_t cur, uint64_t prev) {
  return cur >= prev ? cur - prev : 0;
}

/* ---- sampling --------------------------------------------------------- */

static int top_sample_get(kvs_client *c, const top_opts *op,
                          top_sample *s) {
  double t0 = top_clock(CLOCK_MONOTONIC);
  int rc = kvs_stats_get(c, 0, &s->st);
  double t1 = top_clock(CLOCK_MONOTONIC);

  s->t = (t0 + t1) / 2;
  s->wall = top_clock(CLOCK_REALTIME) - (t1 - s->t);
  s->calls_after = 0;
  s->ntiers = 0;
  s->tier_lost = 0;
  s->ntenants = 0;
  memset(&s->sw, 0, sizeof(s->sw));
  if (rc)
    return rc;
  s->calls_after++;
  rc = kvs_tier_stats_get(c, s->tiers, TOP_MAX_TIERS, &s->ntiers,
                          &s->tier_lost);
  if (rc)
    return rc;
  if (s->ntiers > TOP_MAX_TIERS)
    s->ntiers = TOP_MAX_TIERS;
  if (s->ntiers) {
    s->calls_after++;
    rc = kvs_swap_stats_get(c, &s->sw);
    if (rc)
      return rc;
  }
  if (!op->tenants)
    return 0;
  s->calls_after++;
  rc = kvs_tenant_stats_get(c, s->tenants, TOP_MAX_TENANTS, &s->ntenants);
  if (s->ntenants > TOP_MAX_TENANTS)
    s->ntenants = TOP_MAX_TENANTS;
  return rc;
}

/* Tenant i of cur in prev (the same line of the same tenant), or NULL. */
static const kvs_tenant_stats *top_prev_tenant(const top_sample *prev,
                                               const top_sample *cur,
                                               uint32_t i) {
  if (!prev || i >= prev->ntenants ||
      strcmp(prev->tenants[i].name, cur->tenants[i].name) != 0)
    return NULL;
  return &prev->tenants[i];
}

/* Frames the daemon counted from top itself between prev's Stats and cur's
 * (cur's own Stats frame included: the daemon counts a frame first). */
static uint64_t top_own_frames(const top_sample *prev) {
  return (uint64_t)prev->calls_after + 1;
}

/* The rate of a counter; frames_in without top's own. */
static double top_rate(uint64_t cur, uint64_t prev, uint64_t own,
                       double elapsed) {
  uint64_t d = top_delta(cur, prev);
  d = d > own ? d - own : 0;
  return elapsed > 0 ? (double)d / elapsed : 0;
}

/* Token hit rate, or -1 when no token was looked up. */
static double top_hit_rate(uint64_t hit, uint64_t query) {
  return query ? (double)hit / (double)query : -1;
}

/* ---- the text frame --------------------------------------------------- */

/* One line of the screen (n <= o->width characters). */
static void top_emit(top_out *o, const char *s, int n) {
  if (o->tty && o->row >= o->rows)
    return;
  if (o->tty)
    printf("%s%.*s\033[K", o->row ? "\n" : "", n, s);
  else
    printf("%.*s\n", n, s);
  o->row++;
}

/* Appends s[0..n) to buf (at *len), elided in the middle ("...") to fit
 * room columns: the end of a path says more than its middle. */
static void top_put(char *buf, int *len, const char *s, int n, int room) {
  if (n > room && room > 3) {
    int head = (room - 3) / 3, tail = room - 3 - head;

    memcpy(buf + *len, s, (size_t)head);
    memcpy(buf + *len + head, "...", 3);
    memcpy(buf + *len + head + 3, s + n - tail, (size_t)tail);
    *len += room;
    return;
  }
  if (n > room)
    n = room > 0 ? room : 0;
  memcpy(buf + *len, s, (size_t)n);
  *len += n;
}

/*
 * A line of the frame: "label     field  field  ...", fields apart by two
 * spaces.  A line wider than o->width wraps between fields, the rest
 * indented under the first field (column 10, or 2 for the title line); a
 * field wider than a whole line is elided in the middle.
 */
__attribute__((format(printf, 2, 3)))
static void top_line(top_out *o, const char *fmt, ...) {
  char line[1024], out[1024];
  const char *p;
  int n, len = 0, indent, fresh = 1, w = o->width;
  va_list ap;

  va_start(ap, fmt);
  n = vsnprintf(line, sizeof(line), fmt, ap);
  va_end(ap);
  if (n < 0)
    n = 0;
  if ((size_t)n >= sizeof(line))
    n = (int)sizeof(line) - 1;
  if (w < 20)
    w = 20;
  if (n <= w) {
    top_emit(o, line, n);
    return;
  }
  indent = n > 10 && line[9] == ' ' && line[10] != ' ' ? 10 : 2;
  p = line;
  if (indent == 10) { /* the label column */
    memcpy(out, line, 10);
    len = 10;
    p += 10;
  }
  while (*p) {
    const char *end = strstr(p, "  ");
    int flen = end ? (int)(end - p) : (int)strlen(p);

    if (!fresh && len + 2 + flen > w) {
      top_emit(o, out, len);
      memset(out, ' ', (size_t)indent);
      len = indent;
      fresh = 1;
    }
    if (!fresh) {
      memcpy(out + len, "  ", 2);
      len += 2;
    }
    top_put(out, &len, p, flen, w - len);
    fresh = 0;
    p += flen;
    while (*p == ' ')
      p++;
  }
  top_emit(o, out, len);
}

/* A rate as text, "-" on the first frame. */
static const char *top_fmt_rate(char *buf, size_t len, double r, int have) {
  if (!have)
    snprintf(buf, len, "-");
  else
    snprintf(buf, len, "%.1f", r);
  return buf;
}

static const char *top_fmt_pct(char *buf, size_t len, double r) {
  if (r < 0)
    snprintf(buf, len, "-");
  else
    snprintf(buf, len, "%.1f%%", 100 * r);
  return buf;
}

static const char *top_fmt_bytes(char *buf, size_t len, uint64_t b) {
  static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)b;
  int u = 0;

  while (v >= 1024 && u < 4) {
    v /= 1024;
    u++;
  }
  snprintf(buf, len, u ? "%.1f %s" : "%.0f %s", v, unit[u]);
  return buf;
}

/* [####++++......]: used, cached, free blocks in width characters. */
static void top_bar(char *buf, int width, const kvs_stats *st) {
  uint64_t n = st->num_blocks ? st->num_blocks : 1;
  int u = (int)(((uint64_t)st->used_blocks * (uint64_t)width + n / 2) / n);
  int uc = (int)((((uint64_t)st->used_blocks + st->cached_blocks) *
                      (uint64_t)width + n / 2) / n);
  int i = 0;

  if (uc > width)
    uc = width;
  if (u > uc)
    u = uc;
  buf[i++] = '[';
  for (int k = 0; k < width; k++)
    buf[i++] = k < u ? '#' : k < uc ? '+' : '.';
  buf[i++] = ']';
  buf[i] = '\0';
}

static void top_text(top_out *o, const top_opts *op, kvs_client *c,
                     const top_sample *prev, const top_sample *cur,
                     long frame) {
  const kvs_stats *st = &cur->st;
  double el = prev ? cur->t - prev->t : 0;
  int have = prev && el > 0;
  char clock[16], b[6][32], bar[256];
  struct tm tm;
  time_t secs = (time_t)cur->wall;

  localtime_r(&secs, &tm);
  strftime(clock, sizeof(clock), "%H:%M:%S", &tm);
  top_line(o, "kvshare top  %s  frame %ld  every %gs%s  model %s  socket %s",
           clock, frame, op->interval, o->tty ? "  (q: quit)" : "",
           kvs_model_id(c), op->path);
  top_line(o, "pool      blocks %u  free %u  cached %u  used %u  (%s, %s)",
           st->num_blocks, st->free_blocks, st->cached_blocks,
           st->used_blocks, st->backend[0] ? st->backend : "?",
           top_fmt_bytes(b[0], sizeof(b[0]), st->pool_bytes));
  {
    /* The bar and its legend on one line where the width allows. */
    static const char legend[] = "# used, + cached, . free";
    int w = o->width - 10 - 2 - 2 - (int)strlen(legend);
    if (w > (int)sizeof(bar) - 3)
      w = (int)sizeof(bar) - 3;
    if (w < 10)
      w = 10;
    top_bar(bar, w, st);
    top_line(o, "          %s  %s", bar, legend);
  }
  {
    uint64_t dq = prev ? top_delta(st->query_tokens, prev->st.query_tokens) : 0;
    uint64_t dh = prev ? top_delta(st->hit_tokens, prev->st.hit_tokens) : 0;
    top_line(o, "hit       interval %s  total %s  (tokens hit %llu of %llu "
             "this interval)",
             top_fmt_pct(b[0], sizeof(b[0]), prev ? top_hit_rate(dh, dq) : -1),
             top_fmt_pct(b[1], sizeof(b[1]),
                         top_hit_rate(st->hit_tokens, st->query_tokens)),
             (unsigned long long)dh, (unsigned long long)dq);
  }
#define R(field, own)                                                         \
  (have ? top_rate(st->field, prev->st.field, own, el) : 0)
  top_line(o, "rate/s    lookups %s  frames %s  allocs %s  evictions %s  "
           "sealed %s",
           top_fmt_rate(b[0], sizeof(b[0]), R(lookups, 0), have),
           top_fmt_rate(b[1], sizeof(b[1]),
                        R(frames_in, have ? top_own_frames(prev) : 0), have),
           top_fmt_rate(b[2], sizeof(b[2]), R(allocated_blocks, 0), have),
           top_fmt_rate(b[3], sizeof(b[3]), R(evictions, 0), have),
           top_fmt_rate(b[4], sizeof(b[4]), R(sealed_blocks, 0), have));
#undef R
  top_line(o, "load      sessions %u  requests %u  queued %llu B  "
           "indexed %u", st->sessions, st->num_requests,
           (unsigned long long)st->queued_bytes, st->indexed_blocks);
  top_line(o, "errors    protocol %llu  no_space %llu  copy %llu",
           (unsigned long long)st->protocol_errors,
           (unsigned long long)st->no_space,
           (unsigned long long)st->copy_errors);
  for (uint32_t i = 0; i < cur->ntenants; i++) {
    const kvs_tenant_stats *t = &cur->tenants[i];
    const kvs_tenant_stats *p = top_prev_tenant(prev, cur, i);
    int ht = have && p;
#define NR(field) (ht ? top_rate(t->field, p->field, 0, el) : 0)
    top_line(o, "tenant    %s  blocks %u  free %u  cached %u  used %u  hit %s  "
             "lookups/s %s  evictions/s %s  sessions %u",
             t->name, t->num_blocks, t->free_blocks, t->cached_blocks,
             t->used_blocks,
             top_fmt_pct(b[0], sizeof(b[0]),
                         top_hit_rate(t->hit_tokens, t->query_tokens)),
             top_fmt_rate(b[1], sizeof(b[1]), NR(lookups), ht),
             top_fmt_rate(b[2], sizeof(b[2]), NR(evictions), ht),
             t->sessions);
#undef NR
  }
  for (uint32_t i = 0; i < cur->ntiers; i++) {
    const kvs_tier_stats *t = &cur->tiers[i];
    const kvs_tier_stats *p = prev && i < prev->ntiers ? &prev->tiers[i] : NULL;
    int ht = have && p;
#define TR(field) (ht ? top_rate(t->field, p->field, 0, el) : 0)
    top_line(o, "tier %-4s used %u/%u (%s)  demotions/s %s  promotions/s %s  "
             "drops/s %s  failures %llu  io_errors %llu",
             t->name, t->used, t->slots,
             top_fmt_pct(b[0], sizeof(b[0]),
                         t->slots ? (double)t->used / t->slots : -1),
             top_fmt_rate(b[1], sizeof(b[1]), TR(demotions), ht),
             top_fmt_rate(b[2], sizeof(b[2]), TR(promotions), ht),
             top_fmt_rate(b[3], sizeof(b[3]), TR(drops), ht),
             (unsigned long long)t->failures,
             (unsigned long long)(t->io_errors + t->checksum_failures));
#undef TR
  }
  if (cur->ntiers) {
    const kvs_swap_stats *w = &cur->sw;
#define SR(field) (have ? top_rate(w->field, prev->sw.field, 0, el) : 0)
    top_line(o, "swap      swapped %u  held_slots %u  outs/s %s  ins/s %s  "
             "failures %llu  tier_lost %llu",
             w->swapped_requests, w->held_slots,
             top_fmt_rate(b[0], sizeof(b[0]), SR(swap_outs), have),
             top_fmt_rate(b[1], sizeof(b[1]), SR(swap_ins), have),
             (unsigned long long)w->failures,
             (unsigned long long)cur->tier_lost);
#undef SR
  }
}

/* ---- the JSON frame --------------------------------------------------- */

static void top_json_rate(const char *name, uint64_t cur, uint64_t prev,
                          uint64_t own, double el, int have, int first) {
  printf("%s\"%s\": ", first ? "" : ", ", name);
  if (have)
    printf("%.3f", top_rate(cur, prev, own, el));
  else
    printf("null");
}

/* The tenants' part of a JSON frame: the session's tenant ("" for an
 * observer) and a line per tenant it sees. */
static void top_json_tenants(kvs_client *c, const top_sample *prev,
                             const top_sample *cur, double el, int have) {
  printf(", \"tenant\": ");
  kvs__cli_json_str(kvs_tenant(c));
  printf(", \"tenants\": [");
  for (uint32_t i = 0; i < cur->ntenants; i++) {
    const kvs_tenant_stats *t = &cur->tenants[i];
    const kvs_tenant_stats *p = top_prev_tenant(prev, cur, i);
    int ht = have && p;
    double hr = top_hit_rate(t->hit_tokens, t->query_tokens);

    printf("%s{\"name\": ", i ? ", " : "");
    kvs__cli_json_str(t->name);
    printf(", \"num_blocks\": %u, \"free_blocks\": %u, \"cached_blocks\": %u, "
           "\"used_blocks\": %u, \"num_requests\": %u, \"sessions\": %u, "
           "\"lookups\": %llu, \"query_tokens\": %llu, \"hit_tokens\": %llu, "
           "\"evictions\": %llu, \"no_space\": %llu, \"pool_bytes\": %llu",
           t->num_blocks, t->free_blocks, t->cached_blocks, t->used_blocks,
           t->num_requests, t->sessions, (unsigned long long)t->lookups,
           (unsigned long long)t->query_tokens,
           (unsigned long long)t->hit_tokens,
           (unsigned long long)t->evictions, (unsigned long long)t->no_space,
           (unsigned long long)t->pool_bytes);
    if (hr >= 0)
      printf(", \"hit_rate_total\": %.6f", hr);
    else
      printf(", \"hit_rate_total\": null");
    hr = ht ? top_hit_rate(top_delta(t->hit_tokens, p->hit_tokens),
                           top_delta(t->query_tokens, p->query_tokens))
            : -1;
    if (hr >= 0)
      printf(", \"hit_rate\": %.6f", hr);
    else
      printf(", \"hit_rate\": null");
    printf(", \"rates\": {");
    top_json_rate("lookups", t->lookups, ht ? p->lookups : 0, 0, el, ht, 1);
    top_json_rate("evictions", t->evictions, ht ? p->evictions : 0, 0, el,
                  ht, 0);
    top_json_rate("no_space", t->no_space, ht ? p->no_space : 0, 0, el, ht,
                  0);
    printf("}}");
  }
  printf("]");
}

static void top_json(const top_opts *op, kvs_client *c,
                     const top_sample *prev, const top_sample *cur,
                     long frame) {
  const kvs_stats *st = &cur->st;
  double el = prev ? cur->t - prev->t : 0;
  int have = prev && el > 0;
  double hr;

  printf("{\"frame\": %ld, \"time\": %.3f, \"interval\": %g, \"socket\": ",
         frame, cur->wall, op->interval);
  if (op->path)
    kvs__cli_json_str(op->path);
  else
    printf("null");
  printf(", \"model_id\": ");
  kvs__cli_json_str(kvs_model_id(c));
  printf(", \"backend\": ");
  kvs__cli_json_str(st->backend);
  printf(", \"pool_bytes\": %llu, \"num_blocks\": %u, \"free_blocks\": %u, "
         "\"cached_blocks\": %u, \"used_blocks\": %u, \"sessions\": %u, "
         "\"num_requests\": %u, \"queued_bytes\": %llu, \"indexed_blocks\": %u",
         (unsigned long long)st->pool_bytes, st->num_blocks, st->free_blocks,
         st->cached_blocks, st->used_blocks, st->sessions, st->num_requests,
         (unsigned long long)st->queued_bytes, st->indexed_blocks);

  printf(", \"totals\": {");
#define JSON_TOTAL(f)                                                         \
  printf("%s\"" #f "\": %llu", strcmp(#f, "lookups") ? ", " : "",             \
         (unsigned long long)st->f);
  TOP_COUNTERS(JSON_TOTAL)
#undef JSON_TOTAL
  printf("}");

  if (have) {
    printf(", \"elapsed\": %.6f, \"own_frames\": %llu, \"delta\": {", el,
           (unsigned long long)top_own_frames(prev));
#define JSON_DELTA(f)                                                         \
  printf("%s\"" #f "\": %llu", strcmp(#f, "lookups") ? ", " : "",             \
         (unsigned long long)top_delta(st->f, prev->st.f));
    TOP_COUNTERS(JSON_DELTA)
#undef JSON_DELTA
    printf("}");
  } else {
    printf(", \"elapsed\": null, \"own_frames\": null, \"delta\": null");
  }
  printf(", \"rates\": {");
#define JSON_RATE(f)                                                          \
  top_json_rate(#f, st->f, have ? prev->st.f : 0,                             \
                have && !strcmp(#f, "frames_in") ? top_own_frames(prev) : 0,  \
                el, have, !strcmp(#f, "lookups"));
  TOP_COUNTERS(JSON_RATE)
#undef JSON_RATE
  printf("}");

  hr = have ? top_hit_rate(top_delta(st->hit_tokens, prev->st.hit_tokens),
                           top_delta(st->query_tokens, prev->st.query_tokens))
            : -1;
  if (hr >= 0)
    printf(", \"hit_rate\": %.6f", hr);
  else
    printf(", \"hit_rate\": null");
  hr = top_hit_rate(st->hit_tokens, st->query_tokens);
  if (hr >= 0)
    printf(", \"hit_rate_total\": %.6f", hr);
  else
    printf(", \"hit_rate_total\": null");

  printf(", \"tiers\": [");
  for (uint32_t i = 0; i < cur->ntiers; i++) {
    const kvs_tier_stats *t = &cur->tiers[i];
    const kvs_tier_stats *p = prev && i < prev->ntiers ? &prev->tiers[i] : NULL;
    int ht = have && p;

    printf("%s{\"name\": ", i ? ", " : "");
    kvs__cli_json_str(t->name);
    printf(", \"capacity_bytes\": %llu, \"slots\": %u, \"used\": %u, "
           "\"demotions\": %llu, \"promotions\": %llu, \"hit_blocks\": %llu, "
           "\"drops\": %llu, \"failures\": %llu, \"io_errors\": %llu, "
           "\"checksum_failures\": %llu, \"rates\": {",
           (unsigned long long)t->capacity_bytes, t->slots, t->used,
           (unsigned long long)t->demotions, (unsigned long long)t->promotions,
           (unsigned long long)t->hit_blocks, (unsigned long long)t->drops,
           (unsigned long long)t->failures, (unsigned long long)t->io_errors,
           (unsigned long long)t->checksum_failures);
    top_json_rate("demotions", t->demotions, ht ? p->demotions : 0, 0, el,
                  ht, 1);
    top_json_rate("promotions", t->promotions, ht ? p->promotions : 0, 0, el,
                  ht, 0);
    top_json_rate("hit_blocks", t->hit_blocks, ht ? p->hit_blocks : 0, 0, el,
                  ht, 0);
    top_json_rate("drops", t->drops, ht ? p->drops : 0, 0, el, ht, 0);
    printf("}}");
  }
  printf("]");
  if (cur->ntiers) {
    const kvs_swap_stats *w = &cur->sw;

    printf(", \"tier_lost\": %llu, \"swap\": {\"swapped_requests\": %u, "
           "\"held_slots\": %u, \"swap_outs\": %llu, \"swap_ins\": %llu, "
           "\"failures\": %llu, \"rates\": {",
           (unsigned long long)cur->tier_lost, w->swapped_requests,
           w->held_slots, (unsigned long long)w->swap_outs,
           (unsigned long long)w->swap_ins, (unsigned long long)w->failures);
    top_json_rate("swap_outs", w->swap_outs, have ? prev->sw.swap_outs : 0, 0,
                  el, have, 1);
    top_json_rate("swap_ins", w->swap_ins, have ? prev->sw.swap_ins : 0, 0,
                  el, have, 0);
    printf("}}");
  } else {
    printf(", \"tier_lost\": 0, \"swap\": null");
  }
  if (op->tenants)
    top_json_tenants(c, prev, cur, el, have);
  printf("}\n");
}

/* ---- the terminal ------------------------------------------------------- */

/* A positive number from the environment, or def. */
static int top_env_int(const char *name, int def) {
  const char *v = getenv(name);
  char *end;
  long x;

  if (!v || !*v)
    return def;
  x = strtol(v, &end, 10);
  return *end || x < 1 || x > 10000 ? def : (int)x;
}

/* The terminal's size when stdout is one, else $COLUMNS and $LINES, else
 * 80 x 24. */
static void top_size(int *cols, int *rows) {
  struct winsize ws;

  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col && ws.ws_row) {
    *cols = ws.ws_col;
    *rows = ws.ws_row;
    return;
  }
  *cols = top_env_int("COLUMNS", 80);
  *rows = top_env_int("LINES", 24);
}

static void top_term_size(top_term *t) { top_size(&t->cols, &t->rows); }

static void top_term_enter(top_term *t) {
  if (t->keys && tcgetattr(STDIN_FILENO, &t->saved) == 0) {
    struct termios raw = t->saved;

    raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
    raw.c_lflag |= NOFLSH; /* ^C must not throw away what was drawn */
    raw.c_cc[VMIN] = 1;
    raw.c_cc[VTIME] = 0;
    t->raw = tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0;
  }
  /* Alternate screen, cursor hidden, cleared. */
  fputs("\033[?1049h\033[?25l\033[H\033[2J", stdout);
  fflush(stdout);
  t->screen = 1;
  top_term_size(t);
}

static void top_term_leave(top_term *t) {
  if (t->screen) {
    static const char seq[] = "\033[?25h\033[?1049l";
    size_t off = 0;

    /* A signal may have cut the last frame's write short (stdio then
     * drops the rest and marks stdout in error): the way back to the
     * main screen goes straight to the terminal, again after EINTR. */
    fflush(stdout);
    clearerr(stdout);
    while (off < sizeof(seq) - 1) {
      ssize_t n = write(STDOUT_FILENO, seq + off, sizeof(seq) - 1 - off);

      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0)
        break;
      off += (size_t)n;
    }
    t->screen = 0;
  }
  if (t->raw) {
    while (tcsetattr(STDIN_FILENO, TCSANOW, &t->saved) != 0 && errno == EINTR)
      ;
    t->raw = 0;
  }
}

/* ---- the loop ----------------------------------------------------------- */

static int top_draw(const top_opts *op, top_term *t, kvs_client *c,
                    const top_sample *prev, const top_sample *cur,
                    long frame) {
  if (op->json) {
    top_json(op, c, prev, cur, frame);
  } else if (t) {
    /* One column short of the edge: no pending wrap, no scrolling. */
    top_out o = {1, t->cols - 1, t->rows, 0};

    fputs("\033[H", stdout);
    top_text(&o, op, c, prev, cur, frame);
    fputs("\033[J", stdout);
  } else {
    top_out o = {0, 80, 0, 0};
    int rows;

    top_size(&o.width, &rows);
    if (frame > 1)
      putchar('\n');
    top_text(&o, op, c, prev, cur, frame);
  }
  return fflush(stdout) == 0 && !ferror(stdout) ? 0 : -1;
}

/* The daemon went away, or stopped answering (err): says so on stderr. */
static void top_lost(const top_opts *op, kvs_client *c, int err) {
  const char *msg = kvs_last_message(c);

  fprintf(stderr, "kvshare: top: lost the daemon%s%s: %s%s%s\n",
          op->path ? " at " : "", op->path ? op->path : "",
          err == -EAGAIN ? "it did not answer" : kvs_strerror(err),
          *msg ? ": " : "", msg);
}

/* argv[*i] is the option `name VALUE`, `name=VALUE` or `alias VALUE`:
 * *v = VALUE, *i moves past it. */
static int top_opt(int argc, char **argv, int *i, const char *name,
                   const char *alias, const char **v) {
  const char *a = argv[*i];
  size_t len = strlen(name);

  if ((strcmp(a, name) == 0 || strcmp(a, alias) == 0) && *i + 1 < argc) {
    *v = argv[++*i];
    return 1;
  }
  if (strncmp(a, name, len) == 0 && a[len] == '=') {
    *v = a + len + 1;
    return 1;
  }
  return 0;
}

/* 0: run, 1: --help, -1: bad usage (said why). */
static int top_parse(int argc, char **argv, top_opts *op) {
  int seen_cmd = 0;

  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v;
    char *end;

    if (top_opt(argc, argv, &i, "--socket", "--socket", &v)) {
      op->path = v;
    } else if (strcmp(a, "top") == 0 && !seen_cmd) {
      seen_cmd = 1;
    } else if (strcmp(a, "--json") == 0) {
      op->json = 1;
    } else if (strcmp(a, "-b") == 0 || strcmp(a, "--batch") == 0) {
      op->batch = 1;
    } else if (top_opt(argc, argv, &i, "--interval", "-d", &v)) {
      errno = 0;
      op->interval = strtod(v, &end);
      if (errno || end == v || *end || !isfinite(op->interval) ||
          op->interval < 0.01 || op->interval > 86400) {
        fprintf(stderr, "kvshare: top: bad --interval '%s' (seconds, 0.01 "
                "to 86400)\n", v);
        return -1;
      }
    } else if (top_opt(argc, argv, &i, "--count", "-n", &v)) {
      errno = 0;
      op->count = strtol(v, &end, 10);
      if (errno || end == v || *end || op->count < 1) {
        fprintf(stderr, "kvshare: top: bad --count '%s'\n", v);
        return -1;
      }
    } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      return 1;
    } else {
      fprintf(stderr, "kvshare: top: unexpected argument '%s'\n", a);
      return -1;
    }
  }
  return 0;
}

int kvs__cli_top(int argc, char **argv, void (*usage)(FILE *)) {
  static char outbuf[1 << 16];
  top_opts op = {NULL, 1.0, 0, 0, 0, 0};
  top_term term = {0}, *t = NULL;
  top_sample s[2];
  struct sigaction sa;
  sigset_t block, orig;
  static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGWINCH,
                             SIGTSTP, SIGCONT};
  kvs_connect_opts copts = {"kvshare-top", TOP_CALL_TIMEOUT_MS, 1};
  kvs_client *c = NULL;
  double next;
  long frame;
  int rc, quit = 0;

  rc = top_parse(argc, argv, &op);
  if (rc) {
    usage(rc > 0 ? stdout : stderr);
    return rc > 0 ? 0 : 2;
  }
  rc = kvs__cli_connect(&op.path, &copts, &c);
  if (rc)
    return rc;
  {
    uint32_t n = 0;

    rc = kvs_tenant_stats_get(c, NULL, 0, &n);
    if (rc) {
      top_lost(&op, c, rc);
      kvs_close(c);
      return 1;
    }
    op.tenants = n > 0;
  }

  /* The handlers only set flags, without SA_RESTART: a write stalled on
   * the output returns EINTR and top stops.  Between a check of the flags
   * and the wait the signals are blocked (ppoll unblocks them), so none is
   * lost there.  A signal the caller ignores (nohup) stays ignored. */
  sigemptyset(&block);
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = top_on_signal;
  sigemptyset(&sa.sa_mask);
  for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
    sigaddset(&block, sigs[i]);
  sigprocmask(SIG_BLOCK, &block, &orig);
  for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
    struct sigaction old;

    /* ^Z, resizes and continues matter only on the terminal. */
    if ((sigs[i] == SIGWINCH || sigs[i] == SIGTSTP || sigs[i] == SIGCONT) &&
        (op.json || op.batch || !isatty(STDOUT_FILENO)))
      continue;
    if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler == SIG_IGN)
      continue;
    sigaction(sigs[i], &sa, NULL);
  }
  sigprocmask(SIG_SETMASK, &orig, NULL);

  if (!op.json && !op.batch && isatty(STDOUT_FILENO)) {
    t = &term;
    t->keys = isatty(STDIN_FILENO);
    setvbuf(stdout, outbuf, _IOFBF, sizeof(outbuf));
    top_term_enter(t);
  }

  rc = 0;
  next = top_clock(CLOCK_MONOTONIC);
  for (frame = 1; !quit && !top_stop_sig; frame++) {
    top_sample *cur = &s[frame & 1], *prev = frame > 1 ? &s[~frame & 1] : NULL;
    int err = top_sample_get(c, &op, cur);

    if (err && top_stop_sig)
      break; /* stopped while it waited: not the daemon's fault */
    if (err) {
      top_term_leave(&term);
      top_lost(&op, c, err);
      rc = 1;
      break;
    }
    if (top_draw(&op, t, c, prev, cur, frame))
      goto write_error;
    if (op.count && frame >= op.count)
      break;

    /* Wait for the next sample: keys, signals, the daemon hanging up. */
    next += op.interval;
    if (next < top_clock(CLOCK_MONOTONIC))
      next = top_clock(CLOCK_MONOTONIC); /* late: no burst to catch up */
    while (!quit && !top_stop_sig) {
      struct pollfd pfd[2];
      struct timespec ts;
      double left;
      int nfd = 0;

      if (top_tstp && t) {
        top_tstp = 0;
        top_term_leave(t);
        signal(SIGTSTP, SIG_DFL);
        raise(SIGTSTP); /* stopped here until SIGCONT */
        sigaction(SIGTSTP, &sa, NULL);
        top_term_enter(t);
        top_winch = 1;
      }
      if (top_winch && t) {
        top_winch = 0;
        top_term_size(t);
        fputs("\033[2J", stdout);
        if (top_draw(&op, t, c, prev, cur, frame))
          goto write_error;
      }
      left = next - top_clock(CLOCK_MONOTONIC);
      if (left <= 0)
        break;
      pfd[nfd++] = (struct pollfd){kvs_fd(c), POLLIN, 0};
      if (t && t->keys)
        pfd[nfd++] = (struct pollfd){STDIN_FILENO, POLLIN, 0};
      ts.tv_sec = (time_t)left;
      ts.tv_nsec = (long)((left - (double)ts.tv_sec) * 1e9);
      sigprocmask(SIG_BLOCK, &block, NULL);
      if (top_stop_sig || top_tstp || top_winch) {
        sigprocmask(SIG_SETMASK, &orig, NULL);
        continue; /* arrived since the checks above */
      }
      rc = ppoll(pfd, (nfds_t)nfd, &ts, &orig);
      sigprocmask(SIG_SETMASK, &orig, NULL);
      if (rc <= 0) {
        rc = 0;
        continue; /* a signal, or the time has come */
      }
      rc = 0;
      /* The daemon sends nothing unasked: readable means it hung up.  The
       * next sample finds out and says so. */
      if (pfd[0].revents)
        break;
      if (nfd > 1 && pfd[1].revents) {
        char keys[64];
        ssize_t n = read(STDIN_FILENO, keys, sizeof(keys));

        if (n <= 0)
          t->keys = 0; /* end of input: no more keys */
        for (ssize_t k = 0; k < n; k++)
          if (keys[k] == 'q' || keys[k] == 'Q')
            quit = 1;
      }
    }
  }
  goto out;

write_error:
  top_term_leave(&term);
  if (!top_stop_sig) { /* (a signal interrupts a stalled write) */
    fprintf(stderr, "kvshare: top: cannot write the output\n");
    rc = 1;
  }
out:
  top_term_leave(&term);
  kvs_close(c);
  if (top_stop_sig) {
    /* Die of the signal, as the caller expects. */
    signal(top_stop_sig, SIG_DFL);
    sigprocmask(SIG_UNBLOCK, &block, NULL);
    raise(top_stop_sig);
    return 128 + top_stop_sig;
  }
  sigprocmask(SIG_SETMASK, &orig, NULL);
  return rc;
}
