/*
 * fuzz_gen.h — deterministic generators of kvshare frames for the fuzz tests:
 * valid Requests of every kind (small request ids and a small token alphabet,
 * so that ops meet each other's requests and prefixes), Batches of them, and
 * mutations of the bytes (bit flips, cuts, splices, random lengths, garbage).
 * Seeded: the same seed gives the same frames.
 */
#ifndef KVS_FUZZ_GEN_H
#define KVS_FUZZ_GEN_H

#include <stddef.h>
#include <stdint.h>

typedef struct fz_rng {
  uint64_t s;
} fz_rng;

void fz_seed(fz_rng *r, uint64_t seed);
uint64_t fz_next(fz_rng *r);
/* Uniform in [0, n) (n > 0). */
uint32_t fz_below(fz_rng *r, uint32_t n);

/* A valid Envelope { seq, Request } payload (no header) into out; returns
 * its length, or 0 when cap is too small.  Request ids are below 8. */
size_t fz_request(fz_rng *r, uint64_t seq, uint8_t *out, size_t cap);
/* A compact request payload (proto/kvs_compact.h; the frame's header must
 * carry KVS_FRAME_COMPACT): mostly valid — one op (any kind: those with no
 * record form are refused in its record), a batch that makes sense, a
 * Ping — now and then with a header that lies.  0 when cap is too small. */
size_t fz_compact(fz_rng *r, uint64_t seq, uint8_t *out, size_t cap);
/* A valid Hello payload. */
size_t fz_hello(uint64_t seq, uint8_t *out, size_t cap);

/* Mutates buf[0, len) in place (cap bytes of room); returns the new length. */
size_t fz_mutate(fz_rng *r, uint8_t *buf, size_t len, size_t cap);

/* One frame for a fuzzing connection: mostly a valid header and a valid or
 * mutated Request (an Envelope, or a compact one), sometimes a bad header, a lying length or garbage (never
 * these three when keep_framing: the connection then stays in sync).
 * Returns its length (<= cap; cap should be >= 64 KiB). */
size_t fz_frame(fz_rng *r, uint64_t seq, uint8_t *out, size_t cap,
                int keep_framing);

#endif
