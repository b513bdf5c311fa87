/*
 * test_fuzz_dispatch — drives the in-process fuzz target (fuzz_dispatch.c)
 * with deterministic inputs: runs of valid and mutated Requests from two
 * sessions, and raw streams of framed, misframed and garbage bytes.  Every
 * input ends with both sessions closed and the pool whole (the target
 * aborts otherwise).
 *
 *   test_fuzz_dispatch [ITERATIONS [SEED]]
 *   test_fuzz_dispatch --corpus DIR [N]   write N inputs as a libFuzzer seed
 *                                         corpus and exit
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvs_frame.h"
#include "tests/fuzz/fuzz_gen.h"
#include "tests/fuzz/fuzz_target.h"

#define INPUT_MAX (256u << 10)

/* One input into buf; returns its length. */
static size_t make_input(fz_rng *r, uint8_t *buf) {
  size_t len = 1, k, nframes = 1 + fz_below(r, 40);
  uint64_t seq = 1;

  if (fz_below(r, 4) == 0) { /* a raw stream */
    buf[0] = 1;
    for (k = 0; k < nframes && INPUT_MAX - len > (64u << 10); k++)
      len += fz_frame(r, seq++, buf + len, INPUT_MAX - len, fz_below(r, 2));
    return len;
  }
  if (fz_below(r, 4) == 0) { /* ring requests: whole frames, some cut,
                                 some mutated, some over the ring's area */
    buf[0] = 2;
    for (k = 0; k < nframes && INPUT_MAX - len > (64u << 10) + 3; k++) {
      size_t n = fz_frame(r, seq++, buf + len + 3, 65535, fz_below(r, 4));

      if (fz_below(r, 8) == 0)
        n = fz_mutate(r, buf + len + 3, n, 65535);
      else if (fz_below(r, 16) == 0 && n > 1)
        n -= 1 + fz_below(r, (uint32_t)n - 1);
      buf[len] = (uint8_t)fz_below(r, 2);
      buf[len + 1] = (uint8_t)n;
      buf[len + 2] = (uint8_t)(n >> 8);
      len += 3 + n;
    }
    return len;
  }
  buf[0] = 0;
  for (k = 0; k < nframes && INPUT_MAX - len > (64u << 10); k++) {
    int compact = fz_below(r, 3) == 0; /* (the session byte's top bit) */
    size_t n = compact ? fz_compact(r, seq++, buf + len + 3, (32u << 10))
                       : fz_request(r, seq++, buf + len + 3, (32u << 10));

    if (fz_below(r, 4) == 0)
      n = fz_mutate(r, buf + len + 3, n, (32u << 10));
    buf[len] = (uint8_t)(fz_below(r, 2) | (compact ? 0x80 : 0));
    buf[len + 1] = (uint8_t)n;
    buf[len + 2] = (uint8_t)(n >> 8);
    len += 3 + n;
  }
  return len;
}

static int write_corpus(const char *dir, unsigned n) {
  uint8_t *buf = malloc(INPUT_MAX);
  fz_rng r;
  unsigned i;

  if (!buf)
    return 1;
  fz_seed(&r, 1);
  for (i = 0; i < n; i++) {
    char path[4096];
    size_t len = make_input(&r, buf);
    FILE *f;

    snprintf(path, sizeof(path), "%s/seed-%04u", dir, i);
    f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, len, f) != len) {
      perror(path);
      return 1;
    }
    fclose(f);
  }
  free(buf);
  return 0;
}

int main(int argc, char **argv) {
  unsigned long iters = 20000, seed = 20261122, i;
  uint8_t *buf;
  fz_rng r;

  if (argc >= 3 && strcmp(argv[1], "--corpus") == 0)
    return write_corpus(argv[2], argc > 3 ? (unsigned)strtoul(argv[3], NULL, 0)
                                          : 256);
  if (argc > 1)
    iters = strtoul(argv[1], NULL, 0);
  if (argc > 2)
    seed = strtoul(argv[2], NULL, 0);
  buf = malloc(INPUT_MAX);
  if (!buf)
    return 1;
  fz_seed(&r, seed);
  for (i = 0; i < iters; i++) {
    size_t len = make_input(&r, buf);

    LLVMFuzzerTestOneInput(buf, len);
  }
  /* Inputs no generator makes: empty, one byte, a header alone. */
  LLVMFuzzerTestOneInput(buf, 0);
  buf[0] = 1;
  LLVMFuzzerTestOneInput(buf, 1);
  kvs_frame_header_encode(buf + 1, 100);
  LLVMFuzzerTestOneInput(buf, 1 + KVS_FRAME_HEADER_SIZE);
  free(buf);
  fuzz_dispatch_report(stdout);
  printf("%lu inputs (seed %lu): no crash, no leak, pool whole\n", iters,
         seed);
  return 0;
}
