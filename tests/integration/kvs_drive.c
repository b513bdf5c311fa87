/*
 * kvs_drive — drives a daemon from a script on stdin, for tests written in
 * other languages (test_observe.sh).  One command per line:
 *
 *   fill T1 T2 ...    a request computes this prompt: lookup, allocate the
 *                     rest, commit every token, free (its full blocks stay
 *                     CACHED); prints "fill HIT SEALED"
 *   probe T1 T2 ...   a request looks the prompt up and is freed; prints
 *                     "probe HIT"
 *   pings N           one Batch of N Pings; prints "pings N"
 *   quit
 *
 * Exit 0 when every command succeeded; 1 (with the status on stderr) at the
 * first failure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/kvshare.h"

#define MAX_TOKENS 65536

static int fail(const char *what, int rc, kvs_client *c) {
  fprintf(stderr, "kvs_drive: %s: %s (%s)\n", what, kvs_strerror(rc),
          c ? kvs_last_message(c) : "");
  return 1;
}

int main(int argc, char **argv) {
  static uint32_t toks[MAX_TOKENS];
  kvs_client *c;
  char line[1 << 20];
  uint64_t req = 1;
  int rc;

  if (argc != 2) {
    fprintf(stderr, "usage: kvs_drive SOCKET <script\n");
    return 2;
  }
  rc = kvs_connect(argv[1], NULL, &c);
  if (rc != 0)
    return fail("connect", rc, NULL);
  while (fgets(line, sizeof(line), stdin)) {
    char *save = NULL, *w = strtok_r(line, " \t\n", &save);
    uint32_t n = 0;
    kvs_lookup_result hit;

    if (w == NULL)
      continue;
    if (strcmp(w, "quit") == 0)
      break;
    if (strcmp(w, "pings") == 0) {
      char *t = strtok_r(NULL, " \t\n", &save);
      uint32_t k = t ? (uint32_t)strtoul(t, NULL, 10) : 0;
      kvs_batch *b;

      if ((rc = kvs_batch_new(&b)) != 0) {
        kvs_close(c);
        return fail("batch", rc, NULL);
      }
      for (uint32_t i = 0; i < k && rc >= 0; i++)
        rc = kvs_batch_ping(b, "x", 1);
      if (rc >= 0)
        rc = kvs_batch_submit(c, b);
      kvs_batch_free(b);
      if (rc != 0) {
        fail("pings", rc, c);
        kvs_close(c);
        return 1;
      }
      printf("pings %u\n", k);
      fflush(stdout);
      continue;
    }
    if (strcmp(w, "fill") != 0 && strcmp(w, "probe") != 0) {
      fprintf(stderr, "kvs_drive: unknown command '%s'\n", w);
      kvs_close(c);
      return 2;
    }
    int fill = w[0] == 'f';
    char *t;
    while ((t = strtok_r(NULL, " \t\n", &save)) && n < MAX_TOKENS)
      toks[n++] = (uint32_t)strtoul(t, NULL, 10);
    if (n == 0) {
      fprintf(stderr, "kvs_drive: %s without tokens\n", w);
      kvs_close(c);
      return 2;
    }
    req++;
    if ((rc = kvs_lookup(c, req, toks, n, NULL, 0, &hit)) != 0) {
      fail("lookup", rc, c);
      kvs_close(c);
      return 1;
    }
    if (fill) {
      kvs_alloc_result ar;
      uint32_t sealed = 0;

      if ((rc = kvs_allocate(c, req, n - hit.hit_tokens, &ar)) != 0 ||
          (rc = kvs_commit(c, req, hit.hit_tokens, toks + hit.hit_tokens,
                           n - hit.hit_tokens, NULL, 0, &sealed)) != 0) {
        fail("fill", rc, c);
        kvs_close(c);
        return 1;
      }
      printf("fill %u %u\n", hit.hit_tokens, sealed);
    } else {
      printf("probe %u\n", hit.hit_tokens);
    }
    fflush(stdout);
    if ((rc = kvs_free(c, req)) != 0) {
      fail("free", rc, c);
      kvs_close(c);
      return 1;
    }
  }
  kvs_close(c);
  return 0;
}
