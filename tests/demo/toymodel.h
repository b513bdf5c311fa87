/*
 * toymodel.h — a small deterministic stand-in model for the demo workers and
 * the kernel tests.
 *
 * For a layout-compatible shape (num_layers, num_heads, num_kv_heads,
 * head_dim) the model gives, for a token id at a position in a layer, the
 * query [num_heads][head_dim] and key/value [num_kv_heads][head_dim] vectors
 * (fp32): fixed pseudo-random projections (seeded) of a token embedding plus
 * a positional term.  Everything is a pure function of (seed, layer, token,
 * position), so two processes with the same seed agree bit for bit.
 *
 * toy_reference() computes a request's attention output for one of its tokens
 * from scratch — no cache, contiguous, double precision — which is what a
 * worker's paged attention over the shared pool must reproduce.
 */
#ifndef KVS_TOYMODEL_H
#define KVS_TOYMODEL_H

#include <stdint.h>

typedef struct toy_model {
  uint32_t num_layers, num_heads, num_kv_heads, head_dim;
  uint32_t embed_dim; /* width of the token embedding (TOY_EMBED) */
  uint64_t seed;
  float *w;           /* [layer][num_heads + 2 * num_kv_heads][head_dim][embed] */
} toy_model;

#define TOY_EMBED 32u

/* Build the projections.  Returns 0, -EINVAL (a zero size, num_heads not a
 * multiple of num_kv_heads) or -ENOMEM.  Free with toy_free. */
int toy_init(toy_model *m, uint32_t num_layers, uint32_t num_heads,
             uint32_t num_kv_heads, uint32_t head_dim, uint64_t seed);
void toy_free(toy_model *m);

/* q [num_heads][head_dim], k and v [num_kv_heads][head_dim] of `token` at
 * position `pos` in `layer`.  Any of q, k, v may be NULL. */
void toy_qkv(const toy_model *m, uint32_t layer, uint32_t token, uint32_t pos,
             float *q, float *k, float *v);

/* Softmax scale the model uses: 1 / sqrt(head_dim). */
float toy_scale(const toy_model *m);

/*
 * Attention output of token i (0 <= i < n) of the request tokens[0..n) in
 * `layer`: it attends to tokens 0..i (causal), out [num_heads][head_dim].
 * K and V are first rounded through kv_dtype and q through q_dtype (what a
 * cache of that dtype holds: for int8/fp8 each (token, kv head) row is
 * quantized with its own scales and read back), then everything is
 * computed in double.
 * Returns 0 or -EINVAL / -ENOMEM.
 */
int toy_reference(const toy_model *m, uint32_t layer, const uint32_t *tokens,
                  uint32_t n, uint32_t i, uint32_t kv_dtype, uint32_t q_dtype,
                  float *out);

#endif /* KVS_TOYMODEL_H */
