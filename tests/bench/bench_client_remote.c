/*
 * bench_client_remote — the reader of tests/bench/bench_remote.py, in C so
 * that the figure is the daemon's, not an interpreter's: looks up PROMPTS
 * prompts of DEPTH full blocks (block size BS, the prompt tokens of
 * bench_remote.py's writer), each a miss in the daemon's own pool and tiers
 * and a hit of DEPTH blocks in its remote tier, frees each, and prints the
 * blocks brought up per second.  Exits 1 when a lookup hits anything but
 * DEPTH blocks.
 *
 *     bench_client_remote SOCKET PROMPTS DEPTH BS
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "client/kvshare.h"

static double now(void) {
  struct timespec ts;

  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  kvs_client *c;
  kvs_lookup_result res;
  uint32_t prompts, depth, bs, n, *toks;
  double t0, dt;
  int rc;

  if (argc != 5) {
    fprintf(stderr, "usage: %s SOCKET PROMPTS DEPTH BS\n", argv[0]);
    return 2;
  }
  prompts = (uint32_t)atoi(argv[2]);
  depth = (uint32_t)atoi(argv[3]);
  bs = (uint32_t)atoi(argv[4]);
  n = depth * bs + 1;
  toks = malloc(n * sizeof(*toks));
  if (!toks || prompts == 0 || depth == 0 || bs == 0)
    return 2;
  rc = kvs_connect(argv[1], NULL, &c);
  if (rc < 0) {
    fprintf(stderr, "connect %s: %s\n", argv[1], kvs_strerror(rc));
    return 1;
  }
  t0 = now();
  for (uint32_t k = 0; k < prompts; k++) {
    for (uint32_t i = 0; i < n; i++)
      toks[i] = k * 100000u + i; /* bench_remote.py's prompt(k) */
    rc = kvs_lookup(c, 1, toks, n, NULL, 0, &res);
    if (rc < 0 || res.hit_tokens != depth * bs) {
      fprintf(stderr, "prompt %u: %s, hit %u of %u tokens\n", k,
              rc < 0 ? kvs_strerror(rc) : "ok", rc < 0 ? 0 : res.hit_tokens,
              depth * bs);
      return 1;
    }
    rc = kvs_free(c, 1);
    if (rc < 0) {
      fprintf(stderr, "free: %s\n", kvs_strerror(rc));
      return 1;
    }
  }
  dt = now() - t0;
  printf("%.0f\n", (double)prompts * depth / dt);
  kvs_close(c);
  free(toks);
  return 0;
}
