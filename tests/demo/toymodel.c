/*
 * toymodel.c — see toymodel.h.
 */
#include "toymodel.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/kvs_kernels.h"
#include "tests/unit/test_gpu_util.h"

static uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Deterministic value in [-1, 1) for a (seed, a, b, c) tuple. */
static float unit(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  uint64_t h = mix(seed ^ mix(a + 0x9e3779b97f4a7c15ull * (b + 1) +
                              0x632be59bd9b4e019ull * (c + 1)));
  return (float)((double)(h >> 11) * 0x1p-52 - 1.0);
}

int toy_init(toy_model *m, uint32_t num_layers, uint32_t num_heads,
             uint32_t num_kv_heads, uint32_t head_dim, uint64_t seed) {
  memset(m, 0, sizeof *m);
  if (!num_layers || !num_heads || !num_kv_heads || !head_dim ||
      num_heads % num_kv_heads)
    return -EINVAL;
  m->num_layers = num_layers;
  m->num_heads = num_heads;
  m->num_kv_heads = num_kv_heads;
  m->head_dim = head_dim;
  m->embed_dim = TOY_EMBED;
  m->seed = seed;
  size_t rows = (size_t)num_heads + 2 * num_kv_heads;
  size_t n = (size_t)num_layers * rows * head_dim * TOY_EMBED;
  m->w = malloc(n * sizeof(float));
  if (!m->w)
    return -ENOMEM;
  /* Scaled so that q.k / sqrt(D) spreads over a few units: a softmax that
   * is neither flat nor one-hot. */
  float s = 1.2f / sqrtf((float)TOY_EMBED);
  for (size_t i = 0; i < n; i++)
    m->w[i] = s * unit(seed, 1, i, 0);
  return 0;
}

void toy_free(toy_model *m) {
  free(m->w);
  memset(m, 0, sizeof *m);
}

float toy_scale(const toy_model *m) { return 1.0f / sqrtf((float)m->head_dim); }

static void project(const float *w, const float *x, float *out, uint32_t rows) {
  for (uint32_t r = 0; r < rows; r++) {
    float acc = 0.f;
    for (uint32_t j = 0; j < TOY_EMBED; j++)
      acc += w[(size_t)r * TOY_EMBED + j] * x[j];
    out[r] = acc;
  }
}

void toy_qkv(const toy_model *m, uint32_t layer, uint32_t token, uint32_t pos,
             float *q, float *k, float *v) {
  float x[TOY_EMBED];
  for (uint32_t j = 0; j < TOY_EMBED; j++)
    x[j] = unit(m->seed, 2, token, j) +
           0.5f * sinf((float)pos / powf(100.f, (float)j / TOY_EMBED)) +
           0.25f * unit(m->seed, 3, layer, j);
  uint32_t D = m->head_dim;
  size_t rows = (size_t)m->num_heads + 2 * m->num_kv_heads;
  const float *w = m->w + (size_t)layer * rows * D * TOY_EMBED;
  if (q)
    project(w, x, q, m->num_heads * D);
  w += (size_t)m->num_heads * D * TOY_EMBED;
  if (k)
    project(w, x, k, m->num_kv_heads * D);
  w += (size_t)m->num_kv_heads * D * TOY_EMBED;
  if (v)
    project(w, x, v, m->num_kv_heads * D);
}

static float round_to(float f, uint32_t dtype) {
  float r = f;
  if (dtype == KVS_DTYPE_FP16)
    r = kvs_fp16_to_float(kvs_float_to_fp16(f));
  else if (dtype == KVS_DTYPE_BF16)
    r = kvs_bf16_to_float(kvs_float_to_bf16(f));
  return r;
}

/* One (token, kv head) row of n floats as a cache of dtype holds it: each
 * element rounded (fp16/bf16), or the row quantized with its own scales
 * and read back (int8/fp8, kvs_quantize_row; docs/kernels.md). */
static void round_row(float *x, uint32_t n, uint32_t dtype) {
  if (!kvs_dtype_quantized(dtype)) {
    for (uint32_t e = 0; e < n; e++)
      x[e] = round_to(x[e], dtype);
    return;
  }
  uint8_t q[4096]; /* the layout's largest head_dim (kvs_layout_check) */
  float sc[2];
  if (n > sizeof q || kvs_quantize_row(q, sc, dtype, x, n)) {
    for (uint32_t e = 0; e < n; e++)
      x[e] = NAN;
    return;
  }
  for (uint32_t e = 0; e < n; e++)
    x[e] = dtype == KVS_DTYPE_INT8 ? fmaf((float)q[e], sc[0], sc[1])
                                   : kvs_fp8_to_float(q[e]) * sc[0];
  if (dtype == KVS_DTYPE_INT8) /* the row, from its rotation read back */
    tg_unrotate(x, n);
}

int toy_reference(const toy_model *m, uint32_t layer, const uint32_t *tokens,
                  uint32_t n, uint32_t i, uint32_t kv_dtype, uint32_t q_dtype,
                  float *out) {
  if (layer >= m->num_layers || i >= n || !tokens || !out)
    return -EINVAL;
  uint32_t H = m->num_heads, KVH = m->num_kv_heads, D = m->head_dim;
  uint32_t nk = i + 1;
  float *k = malloc(sizeof(float) * nk * KVH * D);
  float *v = malloc(sizeof(float) * nk * KVH * D);
  float *q = malloc(sizeof(float) * H * D);
  double *w = malloc(sizeof(double) * nk);
  int rc = -ENOMEM;
  if (!k || !v || !q || !w)
    goto out;
  for (uint32_t t = 0; t < nk; t++) {
    toy_qkv(m, layer, tokens[t], t, NULL, k + (size_t)t * KVH * D,
            v + (size_t)t * KVH * D);
    for (uint32_t h = 0; h < KVH; h++) {
      round_row(k + ((size_t)t * KVH + h) * D, D, kv_dtype);
      round_row(v + ((size_t)t * KVH + h) * D, D, kv_dtype);
    }
  }
  toy_qkv(m, layer, tokens[i], i, q, NULL, NULL);
  double scale = 1.0 / sqrt((double)D);
  for (uint32_t hq = 0; hq < H; hq++) {
    uint32_t h = hq / (H / KVH);
    double mx = -INFINITY, sum = 0;
    for (uint32_t t = 0; t < nk; t++) {
      double x = 0;
      for (uint32_t d = 0; d < D; d++)
        x += (double)round_to(q[hq * D + d], q_dtype) *
             k[((size_t)t * KVH + h) * D + d];
      w[t] = x * scale;
      mx = w[t] > mx ? w[t] : mx;
    }
    for (uint32_t t = 0; t < nk; t++) {
      w[t] = exp(w[t] - mx);
      sum += w[t];
    }
    for (uint32_t d = 0; d < D; d++) {
      double x = 0;
      for (uint32_t t = 0; t < nk; t++)
        x += w[t] * v[((size_t)t * KVH + h) * D + d];
      out[hq * D + d] = (float)(x / sum);
    }
  }
  rc = 0;
out:
  free(k);
  free(v);
  free(q);
  free(w);
  return rc;
}
