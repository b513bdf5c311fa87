/*
 * test_gpu_toymodel.c — the demo's path end to end on the CPU: the toy model
 * gives K/V per token and layer, the write kernel scatters them into pool
 * blocks (shuffled, two requests sharing a prefix's blocks), paged decode and
 * prefill attention run over the pool, and the outputs match the toy model's
 * from-scratch reference.  Also checks the toy model is deterministic.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "kvs_status.h"
#include "test_gpu_util.h"
#include "tests/demo/toymodel.h"

static void test_deterministic(void **state) {
  (void)state;
  toy_model a, b, c;
  assert_int_equal(toy_init(&a, 2, 4, 2, 16, 42), 0);
  assert_int_equal(toy_init(&b, 2, 4, 2, 16, 42), 0);
  assert_int_equal(toy_init(&c, 2, 4, 2, 16, 43), 0);
  float qa[64], ka[32], va[32], qb[64], kb[32], vb[32];
  toy_qkv(&a, 1, 77, 5, qa, ka, va);
  toy_qkv(&b, 1, 77, 5, qb, kb, vb);
  assert_memory_equal(qa, qb, sizeof qa);
  assert_memory_equal(ka, kb, sizeof ka);
  assert_memory_equal(va, vb, sizeof va);
  toy_qkv(&c, 1, 77, 5, qb, kb, vb); /* another seed differs */
  assert_memory_not_equal(ka, kb, sizeof ka);
  toy_qkv(&a, 0, 77, 5, qb, kb, vb); /* another layer differs */
  assert_memory_not_equal(ka, kb, sizeof ka);
  toy_qkv(&a, 1, 77, 6, qb, kb, vb); /* another position differs */
  assert_memory_not_equal(ka, kb, sizeof ka);
  toy_free(&c);
  assert_int_equal(toy_init(&c, 2, 5, 2, 16, 1), -EINVAL);
  toy_free(&a);
  toy_free(&b);
}

/* Two requests; the second shares the first's first `shared` tokens and, for
 * the full blocks among them, their blocks. */
static void run_model(uint32_t dtype, uint32_t qo_dtype, uint32_t bs,
                      uint32_t ratio) {
  const uint32_t L = 3, KVH = 2, D = 64, H = KVH * ratio;
  toy_model m;
  assert_int_equal(toy_init(&m, L, H, KVH, D, 7 + dtype), 0);
  enum { NA = 45, NB = 61, SHARED = 37 };
  uint32_t ta[NA], tb[NB];
  for (uint32_t i = 0; i < NA; i++)
    ta[i] = (i * 7919u + 13u) % 32000u;
  for (uint32_t i = 0; i < NB; i++)
    tb[i] = i < SHARED ? ta[i] : (i * 104729u + 5u) % 32000u;
  kvs_layout l = {.block_size = bs, .num_layers = L, .num_kv_heads = KVH,
                  .head_dim = D, .dtype = dtype, .num_blocks = 24};
  assert_int_equal(kvs_layout_finish(&l), 0);
  char *pool = tg_xmalloc(kvs_pool_bytes(&l));
  memset(pool, 0x7f, kvs_pool_bytes(&l)); /* garbage */
  /* Block tables: request A gets blocks from a shuffled list; B reuses A's
   * full shared blocks, then gets fresh ones (copy-on-write is the client's
   * business; here the partial shared block is simply re-written). */
  uint32_t order[24];
  for (uint32_t i = 0; i < 24; i++)
    order[i] = (i * 11 + 5) % 24;
  uint32_t mb = 8, tab[2 * 8], next = 0;
  uint32_t nba = (NA + bs - 1) / bs, nbb = (NB + bs - 1) / bs;
  assert_true(nba <= mb && nbb <= mb);
  for (uint32_t b = 0; b < mb; b++)
    tab[b] = b < nba ? order[next++] : 0;
  uint32_t full_shared = SHARED / bs;
  for (uint32_t b = 0; b < mb; b++)
    tab[mb + b] = b < full_shared ? tab[b] : b < nbb ? order[next++] : 0;
  assert_true(next <= 24);

  size_t row = (size_t)KVH * D;
  float *k = tg_xmalloc(sizeof(float) * NB * row);
  float *v = tg_xmalloc(sizeof(float) * NB * row);
  int64_t slots[NB];
  for (uint32_t layer = 0; layer < L; layer++) {
    for (uint32_t r = 0; r < 2; r++) {
      const uint32_t *toks = r ? tb : ta;
      uint32_t n = r ? NB : NA, first = r ? full_shared * bs : 0;
      for (uint32_t t = 0; t < n; t++) {
        toy_qkv(&m, layer, toks[t], t, NULL, k + t * row, v + t * row);
        /* B writes only what it does not share */
        slots[t] = t < first ? -1
                             : (int64_t)tab[r * mb + t / bs] * bs + t % bs;
      }
      kvs_write_args w = {.k = k, .v = v, .slots = slots,
                          .src_token_stride = row, .src_dtype = KVS_DTYPE_FP32,
                          .num_tokens = n};
      assert_int_equal(kvs_paged_kv_init(&w.kv, pool, &l, layer), 0);
      assert_int_equal(kvs_cpu_write_kv(&w, NULL), 0);
    }
  }

  /* Decode: the last token of each request, every layer. */
  size_t qes = kvs_dtype_size(qo_dtype);
  uint32_t lens[2] = {NA, NB};
  char *q = tg_xmalloc(2 * H * D * qes), *out = tg_xmalloc(2 * H * D * qes);
  float *qf = tg_xmalloc(sizeof(float) * H * D);
  float *ref = tg_xmalloc(sizeof(float) * H * D);
  double tol = tg_tol(qo_dtype);
  for (uint32_t layer = 0; layer < L; layer++) {
    toy_qkv(&m, layer, ta[NA - 1], NA - 1, qf, NULL, NULL);
    kvs_convert(q, qo_dtype, qf, KVS_DTYPE_FP32, H * D);
    toy_qkv(&m, layer, tb[NB - 1], NB - 1, qf, NULL, NULL);
    kvs_convert(q + H * D * qes, qo_dtype, qf, KVS_DTYPE_FP32, H * D);
    kvs_attn_args a = {.out = out, .q = q, .seq_lens = lens,
                       .block_tables = tab, .num_seqs = 2, .num_rows = 2,
                       .num_heads = H, .max_blocks_per_seq = mb,
                       .max_seq_len = NB, .qo_dtype = qo_dtype,
                       .scale = toy_scale(&m)};
    assert_int_equal(kvs_paged_kv_init(&a.kv, pool, &l, layer), 0);
    memset(out, 0xff, 2 * H * D * qes);
    assert_int_equal(kvs_cpu_decode_attention(&a, NULL), 0);
    for (uint32_t r = 0; r < 2; r++) {
      assert_int_equal(toy_reference(&m, layer, r ? tb : ta, r ? NB : NA,
                                     (r ? NB : NA) - 1, dtype, qo_dtype, ref),
                       0);
      double want[H * D];
      for (uint32_t e = 0; e < H * D; e++)
        want[e] = ref[e];
      double err = tg_max_err(out + r * H * D * qes, qo_dtype, want, H * D);
      if (!(err <= tol))
        fprintf(stderr, "decode layer %u req %u kv=%s: err %g\n", layer, r,
                kvs_dtype_name(dtype), err);
      assert_true(err <= tol);
    }
  }

  /* Chunked prefill of B's last 20 tokens (the rest is the cached prefix). */
  enum { QL = 20 };
  uint32_t qs[2] = {0, QL}, lb[1] = {NB};
  char *q2 = tg_xmalloc((size_t)QL * H * D * qes), *o2 = tg_xmalloc((size_t)QL * H * D * qes);
  uint32_t layer = L - 1;
  for (uint32_t i = 0; i < QL; i++) {
    toy_qkv(&m, layer, tb[NB - QL + i], NB - QL + i, qf, NULL, NULL);
    kvs_convert(q2 + (size_t)i * H * D * qes, qo_dtype, qf, KVS_DTYPE_FP32, H * D);
  }
  kvs_attn_args p = {.out = o2, .q = q2, .seq_lens = lb, .q_start = qs,
                     .block_tables = tab + mb, .num_seqs = 1, .num_rows = QL,
                     .num_heads = H, .max_blocks_per_seq = mb, .max_seq_len = NB,
                     .qo_dtype = qo_dtype, .scale = toy_scale(&m)};
  assert_int_equal(kvs_paged_kv_init(&p.kv, pool, &l, layer), 0);
  assert_int_equal(kvs_cpu_prefill_attention(&p, NULL), 0);
  for (uint32_t i = 0; i < QL; i++) {
    assert_int_equal(toy_reference(&m, layer, tb, NB, NB - QL + i, dtype,
                                   qo_dtype, ref), 0);
    double want[H * D];
    for (uint32_t e = 0; e < H * D; e++)
      want[e] = ref[e];
    assert_true(tg_max_err(o2 + (size_t)i * H * D * qes, qo_dtype, want, H * D) <= tol);
  }
  /* And it can fail: the same outputs do not match another request. */
  assert_int_equal(toy_reference(&m, layer, ta, NA, NA - 1, dtype, qo_dtype, ref), 0);
  double want[H * D];
  for (uint32_t e = 0; e < H * D; e++)
    want[e] = ref[e];
  assert_true(tg_max_err(o2 + (size_t)(QL - 1) * H * D * qes, qo_dtype, want, H * D) > tol);

  free(q2);
  free(o2);
  free(q);
  free(out);
  free(qf);
  free(ref);
  free(k);
  free(v);
  free(pool);
  toy_free(&m);
}

static void test_model_fp32(void **state) {
  (void)state;
  run_model(KVS_DTYPE_FP32, KVS_DTYPE_FP32, 16, 4);
  run_model(KVS_DTYPE_FP32, KVS_DTYPE_FP32, 8, 1);
}

static void test_model_fp16(void **state) {
  (void)state;
  run_model(KVS_DTYPE_FP16, KVS_DTYPE_FP16, 16, 4);
  run_model(KVS_DTYPE_FP16, KVS_DTYPE_FP32, 32, 8);
}

static void test_model_bf16(void **state) {
  (void)state;
  run_model(KVS_DTYPE_BF16, KVS_DTYPE_BF16, 16, 4);
  run_model(KVS_DTYPE_BF16, KVS_DTYPE_FP32, 8, 8);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_deterministic),
      cmocka_unit_test(test_model_fp32),
      cmocka_unit_test(test_model_fp16),
      cmocka_unit_test(test_model_bf16),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
