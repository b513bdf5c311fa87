/*
 * trace.h — reader of request traces in the Mooncake format.
 *
 * One JSON object per line:
 *   {"timestamp": ms, "input_length": tokens, "output_length": tokens,
 *    "hash_ids": [int, ...]}
 * hash_ids are chained ids of 512-token blocks, remapped to dense integers
 * (0 .. distinct - 1); len(hash_ids) == ceil(input_length / 512).  See
 * ../shared/traces/README.md.
 *
 * A trace carries no token ids.  trace_rec_tokens() gives trace block id h
 * the 512 token ids trace_token(h, 0..511) and cuts the last block to
 * input_length, so a prefix cache sees exactly the sharing structure of the
 * trace.
 */
#ifndef KVS_REPLAY_TRACE_H
#define KVS_REPLAY_TRACE_H

#include <stddef.h>
#include <stdint.h>

#define TRACE_BLOCK_TOKENS 512u

typedef struct trace_rec {
  uint64_t timestamp;      /* ms */
  uint32_t input_length;   /* prompt tokens (>= 1) */
  uint32_t output_length;  /* generated tokens */
  uint32_t num_hash_ids;   /* == ceil(input_length / 512) */
  uint32_t line;           /* 1-based line in the file */
  size_t first_hash;       /* index of its first id in trace.hash_ids */
} trace_rec;

typedef struct trace {
  trace_rec *recs;         /* sorted by timestamp (stable: file order on ties) */
  size_t num_recs;
  uint32_t *hash_ids;      /* every record's ids, concatenated */
  size_t num_hash_ids;
  uint32_t max_hash_id;    /* ids are dense: max_hash_id < num_hash_ids */
  uint32_t max_input_length;
  uint64_t input_tokens;   /* sum of input_length */
  uint64_t output_tokens;  /* sum of output_length */
} trace;

/*
 * Reads a trace file; limit > 0 keeps only the first `limit` records of the
 * file.  Blank lines are skipped.  Returns 0, -errno when the file cannot be
 * read, KVS_EINVAL for a malformed record (err says which line and why;
 * err may be NULL), KVS_ENOMEM.  *out is owned by the caller: trace_free().
 */
int trace_load(const char *path, size_t limit, trace **out, char *err,
               size_t err_len);

/* Drops the first n records (in timestamp order; all when n >= num_recs):
 * what is left replays as if the trace began there.  Hash ids keep their
 * numbers. */
void trace_skip(trace *t, size_t n);

/* Frees a trace (NULL is fine). */
void trace_free(trace *t);

/* The record's hash ids; valid as long as the trace. */
static inline const uint32_t *trace_rec_hash_ids(const trace *t,
                                                 const trace_rec *r) {
  return t->hash_ids + r->first_hash;
}

/* The token id at offset i (< 512) of trace block id h: a fixed mix of
 * (h, i), so different (h, i) give different ids with high probability. */
uint32_t trace_token(uint32_t hash_id, uint32_t offset);

/* The record's prompt: input_length token ids written to out. */
void trace_rec_tokens(const trace *t, const trace_rec *r, uint32_t *out);

#endif /* KVS_REPLAY_TRACE_H */
