/*
 * kvshare — command-line client of kvshared.
 *
 *   kvshare [--socket PATH] stats [--json] [--check]
 *   kvshare [--socket PATH] ping [--count N]
 *   kvshare [--socket PATH] layout [--json]
 *   kvshare [--socket PATH] top [--interval S] [--count N] [-b] [--json]
 *                                                      (top.c)
 *
 * PATH defaults to $KVS_SOCKET, then the daemon's default
 * ($XDG_RUNTIME_DIR/kvshare/kvshared.sock, else KVS_DEFAULT_SOCKET).  Exit status: 0 ok,
 * 1 the daemon answered with an error (or the invariant check failed), 2
 * usage, 3 cannot connect.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client/cli.h"
#include "client/kvshare.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: kvshare [--socket PATH] COMMAND [options]\n"
          "  stats [--json] [--check]  the daemon's counters, and a line per\n"
          "                            tenant when it has tenants (--check:\n"
          "                            also run the pool invariant check)\n"
          "  ping [--count N]          round trips to the daemon\n"
          "  layout [--json]           the pool layout the daemon announces\n"
          "  top [--interval S] [--count N] [-b | --batch] [--json]\n"
          "                            a live view, every S seconds (default 1,\n"
          "                            fractions allowed): the pool by state,\n"
          "                            the token hit rate (last interval and\n"
          "                            since the daemon started), lookups,\n"
          "                            frames, block allocations, evictions per\n"
          "                            second, sessions, requests, errors, a\n"
          "                            line per tenant (when the daemon has\n"
          "                            tenants), tiers and swaps.  On a terminal\n"
          "                            it redraws in place ('q' quits); -b (the\n"
          "                            default when stdout is not a terminal):\n"
          "                            plain text frames; --json: one object per\n"
          "                            line; --count N: stop after N frames.\n"
          "                            Exit 1 when the daemon goes away\n"
          "PATH defaults to $KVS_SOCKET, then\n"
          "$XDG_RUNTIME_DIR/kvshare/kvshared.sock, then %s\n",
          KVS_DEFAULT_SOCKET);
}

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* (cli.h) */
int kvs__cli_connect(const char **path, const kvs_connect_opts *opts,
                     kvs_client **c) {
  static char buf[256];
  const char *why;
  int rc;

  if (!*path)
    *path = kvs__default_socket(buf, sizeof(buf));
  rc = kvs_connect(*path, opts, c);
  if (rc == 0)
    return 0;
  why = kvs_last_message(NULL);
  if (!*why || strcmp(why, kvs_strerror(rc)) == 0)
    why = NULL;
  fprintf(stderr, "kvshare: cannot connect to %s: %s%s%s\n", *path,
          kvs_strerror(rc), why ? ": " : "", why ? why : "");
  return 3;
}

void kvs__cli_json_str(const char *s) {
  putchar('"');
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\')
      printf("\\%c", ch);
    else if (ch < 0x20)
      printf("\\u%04x", ch);
    else
      putchar(ch);
  }
  putchar('"');
}

#define STATS_FIELDS(X)                                                       \
  X(num_blocks) X(free_blocks) X(cached_blocks) X(used_blocks)                \
  X(num_requests) X(sessions) X(lookups) X(query_tokens) X(hit_tokens)        \
  X(hit_blocks) X(miss_blocks) X(allocated_blocks) X(evictions)               \
  X(cow_copies) X(sealed_blocks) X(no_space) X(frames_in) X(protocol_errors) \
  X(pool_bytes) X(daemon_copies) X(daemon_copy_blocks) X(copy_errors)         \
  X(queued_bytes) X(indexed_blocks)

#define TIER_FIELDS(X)                                                        \
  X(capacity_bytes) X(slots) X(used) X(demotions) X(promotions) X(hit_blocks) \
  X(drops) X(failures) X(bytes_in) X(bytes_out) X(io_errors)                  \
  X(checksum_failures)

#define SWAP_FIELDS(X)                                                        \
  X(swapped_requests) X(held_slots) X(swap_outs) X(swap_ins) X(failures)     \
  X(out_blocks) X(kept_blocks) X(in_blocks) X(resident_blocks)

#define TENANT_FIELDS(X)                                                      \
  X(num_blocks) X(free_blocks) X(cached_blocks) X(used_blocks)                \
  X(num_requests) X(sessions) X(lookups) X(query_tokens) X(hit_tokens)        \
  X(evictions) X(no_space) X(pool_bytes)

/* The most tenant lines shown (a daemon has at most 16). */
#define CLI_MAX_TENANTS 64

/* A tenant's token hit rate as text: "-" before its first lookup. */
static const char *hit_rate(char *buf, size_t len, const kvs_tenant_stats *t) {
  if (!t->query_tokens)
    snprintf(buf, len, "-");
  else
    snprintf(buf, len, "%.1f%%",
             100.0 * (double)t->hit_tokens / (double)t->query_tokens);
  return buf;
}

/* The tenants' table of `kvshare stats`: one line per tenant. */
static void print_tenants(const kvs_tenant_stats *tn, uint32_t n) {
  int w = 8;

  for (uint32_t i = 0; i < n; i++)
    if ((int)strlen(tn[i].name) > w)
      w = (int)strlen(tn[i].name);
  printf("tenants:\n  %-*s %10s %10s %10s %10s %8s %10s %8s\n", w, "name",
         "blocks", "used", "cached", "free", "hit", "evictions", "sessions");
  for (uint32_t i = 0; i < n; i++) {
    const kvs_tenant_stats *t = &tn[i];
    char hr[16];

    printf("  %-*s %10u %10u %10u %10u %8s %10llu %8u\n", w, t->name,
           t->num_blocks, t->used_blocks, t->cached_blocks, t->free_blocks,
           hit_rate(hr, sizeof(hr), t), (unsigned long long)t->evictions,
           t->sessions);
  }
}

static int cmd_stats(kvs_client *c, int json, int check) {
  static kvs_tenant_stats tn[CLI_MAX_TENANTS];
  kvs_swap_stats sw;
  kvs_stats st;
  kvs_tier_stats ts[4];
  uint32_t nt = 0, nten = 0;
  uint64_t lost = 0;
  int rc = kvs_stats_get(c, check, &st);
  if (!rc)
    rc = kvs_tier_stats_get(c, ts, 4, &nt, &lost);
  if (!rc)
    rc = kvs_swap_stats_get(c, &sw);
  if (!rc)
    rc = kvs_tenant_stats_get(c, tn, CLI_MAX_TENANTS, &nten);
  if (nten > CLI_MAX_TENANTS)
    nten = CLI_MAX_TENANTS;
  if (rc) {
    fprintf(stderr, "kvshare: stats: %s%s%s\n", kvs_strerror(rc),
            *kvs_last_message(c) ? ": " : "", kvs_last_message(c));
    return 1;
  }
  if (json) {
    printf("{");
#define JSON_FIELD(f) printf("\"" #f "\": %llu, ", (unsigned long long)st.f);
    STATS_FIELDS(JSON_FIELD)
#undef JSON_FIELD
    printf("\"backend\": ");
    kvs__cli_json_str(st.backend);
    printf(", \"gpu_uuid\": ");
    kvs__cli_json_str(st.gpu_uuid);
    printf(", \"session_id\": %llu", (unsigned long long)kvs_session_id(c));
    if (nt) {
      printf(", \"tier_lost\": %llu, \"tiers\": [", (unsigned long long)lost);
      for (uint32_t i = 0; i < nt && i < 4; i++) {
        printf("%s{\"name\": ", i ? ", " : "");
        kvs__cli_json_str(ts[i].name);
#define JSON_TIER(f) printf(", \"" #f "\": %llu", (unsigned long long)ts[i].f);
        TIER_FIELDS(JSON_TIER)
#undef JSON_TIER
        printf("}");
      }
      printf("], \"swap\": {");
#define JSON_SWAP(f) printf("%s\"" #f "\": %llu", \
                            strcmp(#f, "swapped_requests") ? ", " : "", \
                            (unsigned long long)sw.f);
      SWAP_FIELDS(JSON_SWAP)
#undef JSON_SWAP
      printf("}");
    }
    if (nten) {
      printf(", \"tenant\": ");
      kvs__cli_json_str(kvs_tenant(c));
      printf(", \"tenants\": [");
      for (uint32_t i = 0; i < nten; i++) {
        printf("%s{\"name\": ", i ? ", " : "");
        kvs__cli_json_str(tn[i].name);
#define JSON_TENANT(f) printf(", \"" #f "\": %llu", (unsigned long long)tn[i].f);
        TENANT_FIELDS(JSON_TENANT)
#undef JSON_TENANT
        printf("}");
      }
      printf("]");
    }
    if (check) {
      printf(", \"check\": %d, \"check_status\": ", (int)st.check);
      kvs__cli_json_str(kvs_status_name(st.check));
      printf(", \"check_message\": ");
      kvs__cli_json_str(st.check_message);
    }
    printf("}\n");
  } else {
    printf("%-18s %s%s%s\n", "backend", st.backend, st.gpu_uuid[0] ? " " : "",
           st.gpu_uuid);
#define TEXT_FIELD(f) printf("%-18s %llu\n", #f, (unsigned long long)st.f);
    STATS_FIELDS(TEXT_FIELD)
#undef TEXT_FIELD
    if (nt)
      printf("%-18s %llu\n", "tier_lost", (unsigned long long)lost);
    for (uint32_t i = 0; i < nt && i < 4; i++) {
      printf("tier %s:\n", ts[i].name);
#define TEXT_TIER(f) printf("  %-16s %llu\n", #f, (unsigned long long)ts[i].f);
      TIER_FIELDS(TEXT_TIER)
#undef TEXT_TIER
    }
    if (nt) {
      printf("swap:\n");
#define TEXT_SWAP(f) printf("  %-16s %llu\n", #f, (unsigned long long)sw.f);
      SWAP_FIELDS(TEXT_SWAP)
#undef TEXT_SWAP
    }
    if (nten && kvs_tenant(c)[0])
      printf("%-18s %s\n", "tenant", kvs_tenant(c));
    if (nten)
      print_tenants(tn, nten);
    if (check)
      printf("%-18s %s\n", "check", st.check ? kvs_status_name(st.check) : "ok");
    if (check && st.check)
      printf("%-18s %s\n", "check_message", st.check_message);
  }
  return check && st.check ? 1 : 0;
}

static int cmd_ping(kvs_client *c, const char *path, long count) {
  double best = 0, sum = 0;
  for (long i = 0; i < count; i++) {
    double t0 = now_us();
    int rc = kvs_ping(c, "kvshare", 7);
    double dt = now_us() - t0;
    if (rc) {
      fprintf(stderr, "kvshare: ping: %s\n", kvs_strerror(rc));
      return 1;
    }
    sum += dt;
    if (i == 0 || dt < best)
      best = dt;
  }
  printf("pong from %s: session %llu, %ld round trip%s, min %.1f us, avg "
         "%.1f us\n",
         path, (unsigned long long)kvs_session_id(c), count,
         count == 1 ? "" : "s", best, sum / (double)count);
  return 0;
}

static int cmd_layout(kvs_client *c, int json) {
  const kvs_layout *l = kvs_layout_of(c);
  if (json) {
    printf("{\"block_size\": %u, \"num_layers\": %u, \"num_kv_heads\": %u, "
           "\"head_dim\": %u, \"dtype\": ",
           l->block_size, l->num_layers, l->num_kv_heads, l->head_dim);
    kvs__cli_json_str(kvs_dtype_name(l->dtype));
    printf(", \"num_blocks\": %u, \"block_stride\": %llu, \"pool_bytes\": "
           "%llu, \"backend\": ",
           l->num_blocks, (unsigned long long)l->block_stride,
           (unsigned long long)kvs_pool_size(c));
    kvs__cli_json_str(kvs_pool_backend(c));
    printf(", \"gpu_uuid\": ");
    kvs__cli_json_str(kvs_pool_gpu_uuid(c));
    printf(", \"model_id\": ");
    kvs__cli_json_str(kvs_model_id(c));
    printf(", \"max_frame\": %u}\n", kvs_max_frame(c));
  } else {
    printf("block_size   %u\nnum_layers   %u\nnum_kv_heads %u\nhead_dim     "
           "%u\ndtype        %s\nnum_blocks   %u\nblock_stride %llu\n"
           "pool_bytes   %llu\nbackend      %s%s%s\nmodel_id     %s\n"
           "max_frame    %u\n",
           l->block_size, l->num_layers, l->num_kv_heads, l->head_dim,
           kvs_dtype_name(l->dtype), l->num_blocks,
           (unsigned long long)l->block_stride,
           (unsigned long long)kvs_pool_size(c), kvs_pool_backend(c),
           *kvs_pool_gpu_uuid(c) ? " " : "", kvs_pool_gpu_uuid(c),
           kvs_model_id(c), kvs_max_frame(c));
  }
  return 0;
}

int main(int argc, char **argv) {
  const char *path = NULL, *cmd = NULL;
  int json = 0, check = 0;
  long count = 1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--socket") == 0 && i + 1 < argc) {
      path = argv[++i];
    } else if (strncmp(a, "--socket=", 9) == 0) {
      path = a + 9;
    } else if (strcmp(a, "--json") == 0) {
      json = 1;
    } else if (strcmp(a, "--check") == 0) {
      check = 1;
    } else if (strcmp(a, "--count") == 0 && i + 1 < argc) {
      char *end;
      count = strtol(argv[++i], &end, 10);
      if (*end || count < 1 || count > 10000000) {
        fprintf(stderr, "kvshare: bad --count\n");
        return 2;
      }
    } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      usage(stdout);
      return 0;
    } else if (a[0] != '-' && !cmd) {
      cmd = a;
      if (strcmp(cmd, "top") == 0) /* its own options: top.c */
        return kvs__cli_top(argc, argv, usage);
    } else {
      fprintf(stderr, "kvshare: unexpected argument '%s'\n", a);
      usage(stderr);
      return 2;
    }
  }
  if (!cmd) {
    usage(stderr);
    return 2;
  }
  if (strcmp(cmd, "stats") && strcmp(cmd, "ping") && strcmp(cmd, "layout")) {
    fprintf(stderr, "kvshare: unknown command '%s'\n"
            "Commands: stats, ping, layout, top; 'kvshare --help' tells "
            "more.\n", cmd);
    return 2;
  }
  kvs_connect_opts opts = {"kvshare-cli", 10000, 1};
  kvs_client *c;
  int rc = kvs__cli_connect(&path, &opts, &c);
  if (rc)
    return rc;
  if (strcmp(cmd, "stats") == 0)
    rc = cmd_stats(c, json, check);
  else if (strcmp(cmd, "ping") == 0)
    rc = cmd_ping(c, path, count);
  else
    rc = cmd_layout(c, json);
  kvs_close(c);
  return rc;
}
