/*
 * replay_sweep.c — `kvshare-replay --sweep CAPS --policy A,B,...`: one replay
 * per capacity and policy on a fresh core, a table of token hit rates (and
 * wall times), and optionally a plot of hit rate against capacity drawn by
 * gnuplot.
 */
#include "tools/replay/replay.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

typedef struct cell {
  double hit, block_hit, seconds;
  uint64_t tier_hits;
} cell;

/* One replay of t at capacity cap under policy pol. */
static int sweep_one(const trace *t, const replay_config *base,
                     const replay_plan *plan, uint64_t cap, uint64_t bytes,
                     const char *pol, cell *out) {
  replay_config cfg = *base;
  replay_result res;
  uint32_t nb;
  int rc;

  cfg.capacity_tokens = cap;
  cfg.capacity_bytes = bytes;
  cfg.policy = pol;
  cfg.progress = 0;
  if ((rc = replay_checked(t, &cfg, plan, &nb, &res)) != 0)
    return rc;
  out->hit = replay_token_hit_rate(&res);
  out->block_hit = replay_block_hit_rate(&res);
  out->seconds = res.seconds;
  out->tier_hits = res.tier_hit_tokens[0] + res.tier_hit_tokens[1];
  return rc;
}

/* 3000000 -> "3e6", 2500000 -> "25e5", 0 -> "unlimited". */
static void sweep_cap_name(uint64_t cap, char *buf, size_t len) {
  int e = 0;
  if (cap == 0) {
    snprintf(buf, len, "unlimited");
    return;
  }
  while (cap % 10 == 0) {
    cap /= 10;
    e++;
  }
  if (e < 3)
    snprintf(buf, len, "%" PRIu64, cap * (e == 0 ? 1 : e == 1 ? 10 : 100));
  else
    snprintf(buf, len, "%" PRIu64 "e%d", cap, e);
}

/* 8589934592 -> "8G", 1536 -> "1536": bytes, in the largest power of 1024
 * that divides them. */
static void sweep_bytes_name(uint64_t bytes, char *buf, size_t len) {
  static const char units[] = "KMGT";
  int u = -1;
  while (u < 3 && bytes >= 1024 && bytes % 1024 == 0) {
    bytes /= 1024;
    u++;
  }
  if (u < 0)
    snprintf(buf, len, "%" PRIu64, bytes);
  else
    snprintf(buf, len, "%" PRIu64 "%c", bytes, units[u]);
}

static void sweep_print(const trace *t, const replay_config *base,
                        const replay_plan *plan, const uint64_t *caps,
                        const uint64_t *cap_bytes, size_t ncaps,
                        const char *const *pols, size_t npols,
                        const cell *cells) {
  int bytes = 0;
  kvs_layout l;
  for (size_t k = 0; k < ncaps && cap_bytes != NULL; k++)
    bytes |= cap_bytes[k] != 0;
  if (bytes && replay_layout(base, 1, &l) == 0)
    printf("capacity in bytes of %s blocks of %" PRIu64 " bytes (%u layers, "
           "%u kv heads, head dim %u, %u tokens): floor(bytes / block) "
           "blocks\n",
           kvs_dtype_name(base->dtype), l.block_stride, base->num_layers,
           base->num_kv_heads, base->head_dim, base->block_size);
  if (replay_tenant_mode(base))
    printf("%u tenants, a partition each of the capacity (their total hit "
           "rate); a user: the\nrecords with the same hash id at depth %u\n",
           base->tenants, replay_tenant_depth(t, base));
  printf("token hit rate by capacity (tokens) and policy; wall time of each "
         "replay in ()\n%-12s", "capacity");
  if (bytes)
    printf(" %12s", "tokens");
  for (size_t p = 0; p < npols; p++)
    printf(" %16s", pols[p]);
  printf("\n");
  for (size_t k = 0; k < ncaps; k++) {
    char cap[32];
    if (bytes && cap_bytes[k])
      sweep_bytes_name(cap_bytes[k], cap, sizeof(cap));
    else
      sweep_cap_name(caps[k], cap, sizeof(cap));
    printf("%-12s", cap);
    if (bytes)
      printf(" %12" PRIu64, caps[k]);
    for (size_t p = 0; p < npols; p++) {
      const cell *x = &cells[k * npols + p];
      printf("   %.4f (%5.2fs)", x->hit, x->seconds);
    }
    printf("\n");
  }
  printf("ideal        %.4f  (an unlimited cache)\n",
         plan->query_tokens
             ? (double)plan->ideal_hit_tokens / (double)plan->query_tokens
             : 0.0);
}

static int sweep_json(const trace *t, const replay_config *base,
                      const replay_plan *plan, const uint64_t *caps,
                      const uint64_t *cap_bytes, size_t ncaps, const char *const *pols, size_t npols,
                      const cell *cells) {
  json_t *runs = json_array(), *o;
  int rc = -1;
  if (runs == NULL)
    return -1;
  for (size_t k = 0; k < ncaps; k++)
    for (size_t p = 0; p < npols; p++) {
      const cell *x = &cells[k * npols + p];
      json_t *r = json_pack("{s:I, s:I, s:s, s:f, s:f, s:I, s:f}",
                            "capacity_tokens", (json_int_t)caps[k],
                            "capacity_bytes",
                            (json_int_t)(cap_bytes ? cap_bytes[k] : 0),
                            "policy", pols[p],
                            "token_hit_rate", x->hit, "block_hit_rate",
                            x->block_hit, "tier_hit_tokens",
                            (json_int_t)x->tier_hits, "seconds", x->seconds);
      if (r == NULL || json_array_append_new(runs, r) != 0) {
        json_decref(runs);
        return -1;
      }
    }
  o = json_pack("{s:o, s:f}", "runs", runs, "ideal_token_hit_rate",
                plan->query_tokens ? (double)plan->ideal_hit_tokens /
                                         (double)plan->query_tokens
                                   : 0.0);
  if (o == NULL)
    return -1;
  if (replay_json_layout(o, base) != 0) {
    json_decref(o);
    return -1;
  }
  if (replay_tenant_mode(base) &&
      (json_object_set_new(o, "tenant_count", json_integer(base->tenants)) ||
       json_object_set_new(o, "tenant_key_depth",
                           json_integer(replay_tenant_depth(t, base))))) {
    json_decref(o);
    return -1;
  }
  rc = json_dumpf(o, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  fputc('\n', stdout);
  json_decref(o);
  return rc;
}

/* gnuplot's string quoting: no quote or backslash in what we pass. */
static int plot_safe(const char *s) {
  return strpbrk(s, "\"'\\\n") == NULL;
}

/* A tic label: 2000 -> "2k", 5000000 -> "5M". */
static void tic_label(double v, char *buf, size_t len) {
  static const char unit[] = " kMGTP";
  int u = 0;

  while (v >= 1000 && u < 5) {
    v /= 1000;
    u++;
  }
  snprintf(buf, len, u ? "%g%c" : "%g", v, unit[u]);
}

/* The x tics of a log axis over [lo, hi]: 1, 2 and 5 of every decade
 * labelled, the other digits minor (gnuplot draws no minor tics of its
 * own beside a list). */
static void plot_xtics(FILE *f, double lo, double hi) {
  double d = 1;
  int n = 0;

  while (d * 10 <= lo)
    d *= 10;
  fprintf(f, "set xtics (");
  for (; d <= hi * 10 && n < 200; d *= 10)
    for (int m = 1; m <= 9; m++) {
      double x = m * d;
      char lab[16] = "";

      if (x < lo || x > hi)
        continue;
      if (m == 1 || m == 2 || m == 5)
        tic_label(x, lab, sizeof(lab));
      fprintf(f, "%s\"%s\" %.0f %d", n++ ? ", " : "", lab, x,
              lab[0] ? 0 : 1);
    }
  fprintf(f, ")\n");
}

/* The gnuplot script that draws png, its data inline: a line per policy
 * (hit rate in % against capacity, log scale, 1-2-5 tics), the trace's
 * ideal (an unlimited cache) as a dashed line, y from 0 to 100 %. */
static void plot_script(FILE *f, const char *png, const char *title,
                        const uint64_t *caps, size_t ncaps,
                        const char *const *pols, size_t npols,
                        const cell *cells, uint64_t unlimited_tokens,
                        double ideal) {
  double lo = 0, hi = 0;

  for (size_t k = 0; k < ncaps; k++) {
    double x = (double)(caps[k] ? caps[k] : unlimited_tokens);

    if (k == 0 || x < lo)
      lo = x;
    if (k == 0 || x > hi)
      hi = x;
  }
  if (lo < 1)
    lo = 1;
  lo /= 1.25; /* room for the end points */
  hi *= 1.25;
  fprintf(f, "$sweep << EOD\n");
  for (size_t k = 0; k < ncaps; k++) {
    fprintf(f, "%" PRIu64, caps[k] ? caps[k] : unlimited_tokens);
    for (size_t p = 0; p < npols; p++)
      fprintf(f, " %.4f", 100 * cells[k * npols + p].hit);
    fprintf(f, "\n");
  }
  fprintf(f,
          "EOD\n"
          "set terminal png size 900,560\n"
          "set output \"%s\"\n"
          "set title \"%s\" noenhanced\n"
          "set logscale x 10\n"
          "set xrange [%.6g:%.6g]\n",
          png, title, lo, hi);
  plot_xtics(f, lo, hi);
  fprintf(f,
          "set xlabel \"capacity (tokens)\"\n"
          "set yrange [0:100]\n"
          "set ytics 0,10,100\n"
          "set format y \"%%g%%%%\"\n"
          "set ylabel \"token hit rate\"\n"
          "set key left top noenhanced\n"
          "set grid xtics mxtics ytics\n"
          "plot ");
  for (size_t p = 0; p < npols; p++)
    fprintf(f, "$sweep using 1:%zu with linespoints title \"%s\", ", p + 2,
            pols[p]);
  fprintf(f, "%.4f with lines dashtype 2 linewidth 2 linecolor rgb \"black\" "
          "title \"ideal (unlimited cache): %.1f%%\"\n",
          100 * ideal, 100 * ideal);
}

/* Writes the script (into script_path, or a temporary file) and has
 * gnuplot draw png. */
static int sweep_plot(const char *png, const char *script_path,
                      const char *title, const uint64_t *caps, size_t ncaps,
                      const char *const *pols, size_t npols,
                      const cell *cells, uint64_t unlimited_tokens,
                      double ideal) {
  char dir[] = "/tmp/kvshare-replay-XXXXXX", tmp[64];
  const char *script = script_path;
  FILE *f;
  int rc = -1, status;
  pid_t pid;

  if (!plot_safe(png) || !plot_safe(title)) {
    fprintf(stderr, "kvshare-replay: --plot: no quotes or backslashes in "
            "the file name or trace path, please\n");
    return -1;
  }
  if (!script) {
    if (mkdtemp(dir) == NULL) {
      fprintf(stderr, "kvshare-replay: --plot: %s\n", strerror(errno));
      return -1;
    }
    snprintf(tmp, sizeof(tmp), "%s/sweep.gp", dir);
    script = tmp;
  }
  if ((f = fopen(script, "w")) == NULL)
    goto io;
  plot_script(f, png, title, caps, ncaps, pols, npols, cells,
              unlimited_tokens, ideal);
  if (fclose(f) != 0)
    goto io;
  char *argv[] = {"gnuplot", (char *)script, NULL};
  if ((errno = posix_spawnp(&pid, "gnuplot", NULL, NULL, argv, environ)) != 0) {
    fprintf(stderr, "kvshare-replay: --plot needs gnuplot (Debian: "
            "gnuplot-nox): %s\n", strerror(errno));
    goto out;
  }
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0) {
    fprintf(stderr, "kvshare-replay: gnuplot failed drawing %s\n", png);
    goto out;
  }
  rc = 0;
  goto out;
io:
  fprintf(stderr, "kvshare-replay: --plot: %s: %s\n", script,
          strerror(errno));
out:
  if (!script_path) {
    unlink(tmp);
    rmdir(dir);
  }
  return rc;
}

int replay_sweep(const trace *t, const char *path, const replay_config *base,
                 const replay_plan *plan, const uint64_t *caps,
                 const uint64_t *cap_bytes, size_t ncaps,
                 const char *const *pols, size_t npols, int json,
                 const char *plot, const char *plot_script_path) {
  cell *cells = calloc(ncaps * npols, sizeof(*cells));
  int rc = 0;
  if (cells == NULL)
    return KVS_ENOMEM;
  for (size_t k = 0; k < ncaps && rc == 0; k++)
    for (size_t p = 0; p < npols && rc == 0; p++) {
      if (base->progress) {
        char cap[32];
        sweep_cap_name(caps[k], cap, sizeof(cap));
        fprintf(stderr, "replay: %s at %s tokens...\n", pols[p], cap);
      }
      rc = sweep_one(t, base, plan, caps[k], cap_bytes ? cap_bytes[k] : 0,
                     pols[p], &cells[k * npols + p]);
    }
  if (rc == 0) {
    if (json)
      rc = sweep_json(t, base, plan, caps, cap_bytes, ncaps, pols, npols,
                      cells) != 0
               ? KVS_EIO
               : 0;
    else
      sweep_print(t, base, plan, caps, cap_bytes, ncaps, pols, npols, cells);
  }
  if (rc == 0 && plot != NULL)
    rc = sweep_plot(plot, plot_script_path, path, caps, ncaps, pols, npols,
                    cells, plan->unlimited_blocks * base->block_size,
                    plan->query_tokens ? (double)plan->ideal_hit_tokens /
                                             (double)plan->query_tokens
                                       : 0.0) != 0
             ? KVS_EIO
             : 0;
  free(cells);
  return rc;
}
