/*
 * test_gpu_kernels.c — the C twins of the kernels against plain references:
 * dtype conversion against the compiler's _Float16, the write kernel against
 * per-element addressing through kvs_layout.h, decode and prefill attention
 * against a naive contiguous attention over many shapes (block sizes 8/16/32,
 * GQA ratios 1/4/8 and 16, head_dim 64/128, lengths on and off block
 * boundaries, shuffled block tables, fp32/fp16/bf16), block copy and
 * gather/scatter against memcmp, and argument checks.  The attention tests
 * run on the body this CPU picks (AVX-512F, else AVX2+FMA+F16C, on x86-64
 * that has them), again on the AVX2 body (kvs__cpu_attn_avx512 = 0) and on
 * the portable C body (kvs__cpu_attn_portable).  test_quant_<body> run
 * int8/fp8 decode and prefill (up to 1500 keys, NaN codes, NaN scales) on
 * each body by name, and say so when this CPU lacks one (skipped).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "gpu/kvs_kernels_int.h"
#include "kvs_status.h"
#include "test_gpu_util.h"

/* ---- conversions ------------------------------------------------------- */

static void test_fp16_all_bits(void **state) {
  (void)state;
  for (uint32_t b = 0; b < 65536; b++) {
    uint16_t h = (uint16_t)b;
    _Float16 ref;
    memcpy(&ref, &h, 2);
    float want = (float)ref, got = kvs_fp16_to_float(h);
    if (isnan(want)) {
      assert_true(isnan(got));
      /* and back: still a NaN */
      uint16_t back = kvs_float_to_fp16(got);
      assert_true((back & 0x7c00) == 0x7c00 && (back & 0x3ff) != 0);
      continue;
    }
    assert_memory_equal(&want, &got, 4);
    assert_int_equal(kvs_float_to_fp16(got), h); /* exact round trip */
  }
}

static void test_fp16_rounding(void **state) {
  (void)state;
  uint64_t rng = 7;
  for (int i = 0; i < 2000000; i++) {
    uint32_t bits = (uint32_t)tg_next(&rng);
    /* Mostly values near the fp16 range, plus raw bit patterns. */
    float f;
    if (i & 1) {
      f = (float)ldexp((double)tg_unif(&rng), (int)(tg_next(&rng) % 44) - 26);
    } else {
      memcpy(&f, &bits, 4);
    }
    if (isnan(f))
      continue;
    _Float16 ref = (_Float16)f;
    uint16_t want;
    memcpy(&want, &ref, 2);
    uint16_t got = kvs_float_to_fp16(f);
    if (got != want) {
      fprintf(stderr, "fp16(%a): got %04x want %04x\n", (double)f, got, want);
      fail();
    }
  }
  /* Halfway cases round to even. */
  assert_int_equal(kvs_float_to_fp16(1.0f + 0x1p-11f), 0x3c00);
  assert_int_equal(kvs_float_to_fp16(1.0f + 3 * 0x1p-11f), 0x3c02);
  assert_int_equal(kvs_float_to_fp16(65520.0f), 0x7c00);
  assert_int_equal(kvs_float_to_fp16(65519.0f), 0x7bff);
  assert_int_equal(kvs_float_to_fp16(0x1p-25f), 0x0000);
  assert_int_equal(kvs_float_to_fp16(0x1.8p-25f), 0x0001);
}

static void test_bf16(void **state) {
  (void)state;
  assert_int_equal(kvs_float_to_bf16(1.0f), 0x3f80);
  assert_int_equal(kvs_float_to_bf16(-2.0f), 0xc000);
  float tie_even, tie_odd;
  uint32_t u = 0x3f808000u; /* halfway between 0x3f80 and 0x3f81 */
  memcpy(&tie_even, &u, 4);
  u = 0x3f818000u; /* halfway between 0x3f81 and 0x3f82 */
  memcpy(&tie_odd, &u, 4);
  assert_int_equal(kvs_float_to_bf16(tie_even), 0x3f80);
  assert_int_equal(kvs_float_to_bf16(tie_odd), 0x3f82);
  assert_true(isnan(kvs_bf16_to_float(kvs_float_to_bf16(NAN))));
  assert_int_equal(kvs_float_to_bf16(INFINITY), 0x7f80);
  /* Against double arithmetic: the nearest bf16, ties to even. */
  uint64_t rng = 11;
  for (int i = 0; i < 200000; i++) {
    float f = (float)ldexp((double)tg_unif(&rng), (int)(tg_next(&rng) % 60) - 30);
    uint16_t got = kvs_float_to_bf16(f);
    double lo = kvs_bf16_to_float(got);
    double up = kvs_bf16_to_float((uint16_t)(got + 1));
    double dn = kvs_bf16_to_float((uint16_t)(got - 1));
    double e = fabs(lo - f);
    assert_true(e <= fabs(up - f));
    assert_true(e <= fabs(dn - f));
  }
  for (uint32_t b = 0; b < 65536; b++)
    if (!isnan(kvs_bf16_to_float((uint16_t)b)))
      assert_int_equal(kvs_float_to_bf16(kvs_bf16_to_float((uint16_t)b)), b);
}

/* ---- write ---------------------------------------------------------------- */

static void check_write(uint32_t dtype, uint32_t src_dtype) {
  kvs_layout l = {.block_size = 16, .num_layers = 3, .num_kv_heads = 2,
                  .head_dim = 64, .dtype = dtype, .num_blocks = 9};
  assert_int_equal(kvs_layout_finish(&l), 0);
  size_t es = kvs_dtype_size(dtype), ses = kvs_dtype_size(src_dtype);
  uint64_t bytes = kvs_pool_bytes(&l);
  char *pool = tg_xmalloc(bytes), *want = tg_xmalloc(bytes);
  uint64_t rng = 3 + dtype * 10 + src_dtype;
  for (uint64_t i = 0; i < bytes; i++)
    pool[i] = (char)tg_next(&rng);
  memcpy(want, pool, bytes);
  enum { N = 40 };
  uint32_t row = l.num_kv_heads * l.head_dim, stride = row + 5;
  char *k = tg_xmalloc((size_t)N * stride * ses), *v = tg_xmalloc((size_t)N * stride * ses);
  for (uint32_t i = 0; i < N * stride; i++) {
    float a = tg_unif(&rng), b = tg_unif(&rng);
    kvs_convert(k + i * ses, src_dtype, &a, KVS_DTYPE_FP32, 1);
    kvs_convert(v + i * ses, src_dtype, &b, KVS_DTYPE_FP32, 1);
  }
  int64_t slots[N];
  for (uint32_t i = 0; i < N; i++) /* distinct slots, every 7th skipped */
    slots[i] = i % 7 == 3 ? -1 : (int64_t)((i * 37 + 5) % (l.num_blocks * l.block_size));
  uint32_t layer = 1;
  for (uint32_t i = 0; i < N; i++) {
    if (slots[i] < 0)
      continue;
    uint32_t b = (uint32_t)(slots[i] / l.block_size), t = (uint32_t)(slots[i] % l.block_size);
    for (uint32_t h = 0; h < l.num_kv_heads; h++) {
      if (kvs_dtype_quantized(dtype)) { /* each row with its own scale */
        float fr[64];
        for (uint32_t kv = 0; kv < 2; kv++) {
          kvs_convert(fr, KVS_DTYPE_FP32,
                      (kv ? v : k) + ((size_t)i * stride + h * l.head_dim) * ses,
                      src_dtype, l.head_dim);
          assert_int_equal(kvs_quantize_row(
                               kvs_elem_ptr(want, &l, b, layer, kv, t, h),
                               kvs_scale_ptr(want, &l, b, layer, kv, t, h),
                               dtype, fr, l.head_dim), 0);
        }
        continue;
      }
      kvs_convert(kvs_elem_ptr(want, &l, b, layer, 0, t, h), dtype,
                  k + ((size_t)i * stride + h * l.head_dim) * ses, src_dtype, l.head_dim);
      kvs_convert(kvs_elem_ptr(want, &l, b, layer, 1, t, h), dtype,
                  v + ((size_t)i * stride + h * l.head_dim) * ses, src_dtype, l.head_dim);
    }
  }
  kvs_write_args a = {.k = k, .v = v, .slots = slots, .src_token_stride = stride,
                      .src_dtype = src_dtype, .num_tokens = N};
  assert_int_equal(kvs_paged_kv_init(&a.kv, pool, &l, layer), 0);
  assert_int_equal(kvs_cpu_write_kv(&a, NULL), 0);
  assert_memory_equal(pool, want, bytes);
  (void)es;
  /* A slot past the pool is refused before anything is written; so is a
   * quantized source. */
  slots[0] = (int64_t)l.num_blocks * l.block_size;
  assert_int_equal(kvs_cpu_write_kv(&a, NULL), KVS_ERANGE);
  slots[0] = 0;
  a.src_dtype = KVS_DTYPE_INT8;
  assert_int_equal(kvs_cpu_write_kv(&a, NULL), KVS_EINVAL);
  assert_memory_equal(pool, want, bytes);
  free(pool);
  free(want);
  free(k);
  free(v);
}

static void test_write(void **state) {
  (void)state;
  for (uint32_t d = 0; d < KVS_DTYPE__COUNT; d++)
    for (uint32_t s = 0; s < 3; s++)
      check_write(d, s);
}

/* ---- quantized dtypes ------------------------------------------------------- */

/* The layout of a quantized plane: data, padding to 16 bytes, scales. */
static void test_quant_layout(void **state) {
  (void)state;
  kvs_layout l = {.block_size = 5, .num_layers = 3, .num_kv_heads = 3,
                  .head_dim = 37, .dtype = KVS_DTYPE_FP8, .num_blocks = 4};
  assert_int_equal(kvs_layout_finish(&l), 0);
  assert_int_equal(kvs_dtype_size(KVS_DTYPE_INT8), 1);
  assert_int_equal(kvs_dtype_size(KVS_DTYPE_FP8), 1);
  assert_true(kvs_dtype_quantized(KVS_DTYPE_INT8) && kvs_dtype_quantized(KVS_DTYPE_FP8));
  assert_false(kvs_dtype_quantized(KVS_DTYPE_FP16) || kvs_dtype_quantized(7));
  assert_string_equal(kvs_dtype_name(KVS_DTYPE_INT8), "int8");
  assert_string_equal(kvs_dtype_name(KVS_DTYPE_FP8), "fp8");
  assert_int_equal(kvs_plane_data_bytes(&l), 5 * 3 * 37);       /* 555 */
  assert_int_equal(kvs_scale_offset(&l), 560);
  assert_int_equal(kvs_plane_bytes(&l), 560 + 64);               /* 15 scales */
  assert_int_equal(kvs_block_bytes(&l), 3 * 2 * 624);
  assert_int_equal(l.block_stride, 4096);
  assert_int_equal(kvs_scale_elem_offset(&l, 2, 1, 1, 4, 2),
                   2 * 4096 + 624 * 3 + 560 + (4 * 3 + 2) * 4);
  kvs_paged_kv kv;
  assert_int_equal(kvs_paged_kv_init(&kv, &l, &l, 2), 0);
  assert_int_equal(kv.scale_offset, 560);
  assert_int_equal(kv.k_offset, 4 * 624);
  /* int8 keeps two floats per row (the scale and the minimum). */
  assert_int_equal(kvs_scale_floats(KVS_DTYPE_INT8), 2);
  assert_int_equal(kvs_scale_floats(KVS_DTYPE_FP8), 1);
  assert_int_equal(kvs_scale_floats(KVS_DTYPE_BF16), 0);
  kvs_layout l8 = l;
  l8.dtype = KVS_DTYPE_INT8;
  assert_int_equal(kvs_layout_finish(&l8), 0);
  assert_int_equal(kvs_scale_offset(&l8), 560);
  assert_int_equal(kvs_plane_bytes(&l8), 560 + 128);             /* 15 x 2 */
  assert_int_equal(kvs_block_bytes(&l8), 3 * 2 * 688);
  assert_int_equal(kvs_scale_elem_offset(&l8, 2, 1, 1, 4, 2),
                   2 * 8192 + 688 * 3 + 560 + (4 * 3 + 2) * 8);
  /* A view whose scales would overlap its elements is refused. */
  kv.scale_offset = 100;
  kvs_write_args w = {.kv = kv, .k = &l, .v = &l, .slots = (int64_t[]){0},
                      .src_token_stride = 111, .num_tokens = 1};
  assert_int_equal(kvs_cpu_write_kv(&w, NULL), KVS_EINVAL);
  /* Unquantized layouts keep their sizes. */
  l.dtype = KVS_DTYPE_FP16;
  assert_int_equal(kvs_layout_finish(&l), 0);
  assert_int_equal(kvs_plane_bytes(&l), 5 * 3 * 37 * 2);
  assert_int_equal(kvs_scale_offset(&l), kvs_plane_bytes(&l));
  assert_int_equal(kvs_paged_kv_init(&kv, &l, &l, 0), 0);
  assert_int_equal(kv.scale_offset, 0);
  /* Quantized bytes mean nothing alone: kvs_convert refuses them. */
  uint8_t b = 0;
  float f = 1.f;
  assert_int_equal(kvs_convert(&b, KVS_DTYPE_INT8, &f, KVS_DTYPE_FP32, 1), KVS_EINVAL);
  assert_int_equal(kvs_convert(&f, KVS_DTYPE_FP32, &b, KVS_DTYPE_FP8, 1), KVS_EINVAL);
}

/* fp8 e4m3: every code round-trips, ties go to even, the range saturates,
 * NaN stays NaN; the quantizer's corner cases. */
static void test_quant_rounding(void **state) {
  (void)state;
  for (uint32_t c = 0; c < 256; c++) {
    float f = kvs_fp8_to_float((uint8_t)c);
    if ((c & 0x7f) == 0x7f) {
      assert_true(isnan(f));
      continue;
    }
    assert_int_equal(kvs_float_to_fp8(f), c);
    if ((c & 0x7f) < 0x7e) { /* the midpoint to the next code: even wins */
      float next = kvs_fp8_to_float((uint8_t)(c + 1));
      float mid = (f + next) / 2;
      assert_int_equal(kvs_float_to_fp8(mid), (c & 1) ? c + 1 : c);
    }
  }
  assert_true(kvs_fp8_to_float(0x7e) == 448.f && kvs_fp8_to_float(0x01) == 0x1p-9f);
  assert_int_equal(kvs_float_to_fp8(1e6f), 0x7e);
  assert_int_equal(kvs_float_to_fp8(-INFINITY), 0xfe);
  assert_int_equal(kvs_float_to_fp8(NAN) & 0x7f, 0x7f);
  assert_int_equal(kvs_float_to_fp8(1e-30f), 0);

  /* int8: the row rotated (y = H x / 4, exact for these rows: H's
   * products written out below), then 255 steps from the minimum, ties to
   * even, one multiply-add back, and H times that is the row again */
  float row[4] = {254.5f, -253.5f, 251.5f, -256.5f}, sc[2]; /* y: -1 254 1.5 0 */
  uint8_t q[4];
  assert_int_equal(kvs_quantize_row(q, sc, KVS_DTYPE_INT8, row, 4), 0);
  assert_true(sc[0] == 1.f && sc[1] == -1.f);
  assert_true(q[0] == 0 && q[1] == 255 && q[2] == 2 && q[3] == 1); /* 2.5 */
  float row8[4] = {-0.5f, 3.5f, -2.5f, 1.5f}; /* y: 0.5 -2 1 0 */
  const float y8[4] = {0.5f, -2.f, 1.f, 0.f};
  assert_int_equal(kvs_quantize_row(q, sc, KVS_DTYPE_INT8, row8, 4), 0);
  assert_true(sc[0] == 3.f / 255.f && sc[1] == -2.f);
  assert_true(q[0] == 212 && q[1] == 0 && q[2] == 255 && q[3] == 170); /* 212.5 */
  float back[4];
  for (int i = 0; i < 4; i++) { /* within half a step of y */
    back[i] = q[i] * sc[0] + sc[1];
    assert_true(fabsf(back[i] - y8[i]) <= sc[0] / 2 * 1.001f);
  }
  kvs__hadamard(back, 4, 0); /* each of the row's elements: 4 such errors */
  for (int i = 0; i < 4; i++)
    assert_true(fabsf(back[i] - row8[i]) <= 4 * sc[0] / 2 * 1.001f);
  float flat[4] = {12.f, 0.f, 0.f, 0.f}; /* y constant: scale 0, reads as min */
  assert_int_equal(kvs_quantize_row(q, sc, KVS_DTYPE_INT8, flat, 4), 0);
  assert_true(sc[0] == 0.f && sc[1] == 3.f && q[0] == 0 && q[3] == 0);
  float row2[4] = {0.5f, -2.f, 1.f, 0.f};
  uint8_t e[4];
  assert_int_equal(kvs_quantize_row(e, sc, KVS_DTYPE_FP8, row2, 4), 0);
  assert_true(sc[0] == 2.f / 448.f && e[1] == 0xfe && e[3] == 0);
  float zero[4] = {0};
  assert_int_equal(kvs_quantize_row(e, sc, KVS_DTYPE_FP8, zero, 4), 0);
  assert_true(sc[0] == 0.f && e[0] == 0 && e[3] == 0);
  row2[2] = INFINITY; /* a row with an infinity (or a NaN) reads as NaN */
  assert_int_equal(kvs_quantize_row(q, sc, KVS_DTYPE_INT8, row2, 4), 0);
  assert_true(isnan(sc[0]) && isnan(sc[1]) && q[0] == 0);
  assert_int_equal(kvs_quantize_row(e, sc, KVS_DTYPE_FP8, row2, 4), 0);
  assert_true(isnan(sc[0]) && e[0] == 0);
  float tiny8[2] = {0.f, 0x1p-148f}; /* y = +-2^-149: a scale that underflows */
  assert_int_equal(kvs_quantize_row(q, sc, KVS_DTYPE_INT8, tiny8, 2), 0);
  assert_true(sc[0] == 0.f && sc[1] == -0x1p-149f && q[0] == 0 && q[1] == 0);
  float tiny[2] = {0x1p-149f, -0x1p-149f};
  assert_int_equal(kvs_quantize_row(e, sc, KVS_DTYPE_FP8, tiny, 2), 0);
  assert_true(sc[0] == 0.f && e[0] == 0 && e[1] == 0);
  float wide[2] = {-3e38f, 3e38f}; /* the rotation's x0 - x1 overflows: NaN */
  assert_int_equal(kvs_quantize_row(q, sc, KVS_DTYPE_INT8, wide, 2), 0);
  assert_true(isnan(sc[0]) && isnan(sc[1]) && q[1] == 0);
  float big[KVS__QROW_MAX + 1] = {0};
  assert_int_equal(kvs_quantize_row(q, sc, KVS_DTYPE_INT8, big, KVS__QROW_MAX + 1),
                   KVS_EINVAL);
  assert_int_equal(kvs_quantize_row(q, sc, KVS_DTYPE_FP16, row2, 4), KVS_EINVAL);
}

/* kvs__hadamard against the matrix product (tg_unrotate: entries
 * (-1)^popcount(i & j) per power-of-two segment, in double), for lengths
 * of one segment and of several; down then up is the row again, exactly
 * for these small integers. */
static void test_hadamard(void **state) {
  (void)state;
  static const uint32_t ns[] = {1, 2, 3, 7, 64, 80, 96, 128, 200, 256};
  uint64_t rng = 99;
  for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
    const uint32_t n = ns[k];
    float x[256] = {0}, y[256], ref[256];
    for (uint32_t i = 0; i < n; i++)
      x[i] = (float)((int)(tg_next(&rng) % 201) - 100);
    memcpy(y, x, sizeof x);
    memcpy(ref, x, sizeof x);
    kvs__hadamard(y, n, 0);
    tg_unrotate(ref, n);
    for (uint32_t i = 0; i < n; i++)
      assert_true(y[i] == ref[i]); /* integers: exact both ways */
    uint32_t seg = 0; /* 80: 64 + 16; 200: 128 + 64 + 8 */
    for (uint32_t off = 0; off < n; off += kvs__hadamard_seg(n, off))
      seg++;
    assert_int_equal(seg, (uint32_t)__builtin_popcount(n));
    kvs__hadamard(y, n, 1); /* H (H x) / m = x */
    for (uint32_t i = 0; i < n; i++)
      assert_true(y[i] == x[i]);
  }
}

/* Attention over a quantized cache refuses quantized q/out, and the write
 * kernel quantized sources, on both backends (CUDA before it needs a
 * device: the CUDA kernels take int8/fp8 caches, test_gpu_cuda and
 * test_gpu_pool run them). */
static void test_quant_refusals(void **state) {
  (void)state;
  uint32_t lens[] = {10, 20};
  tg_params p = {.block_size = 8, .num_kv_heads = 2, .head_dim = 64,
                 .ratio = 2, .dtype = KVS_DTYPE_INT8, .qo_dtype = KVS_DTYPE_FP32,
                 .num_layers = 1, .num_seqs = 2, .lens = lens,
                 .spare_blocks = 1, .q_scale = 1.f, .seed = 1};
  tg_case c;
  assert_int_equal(tg_case_build(&c, &p), 0);
  float out[2 * 4 * 64];
  kvs_attn_args a;
  tg_case_args(&c, &a, c.pool, out, c.q, c.seq_lens, NULL, c.tables);
  assert_int_equal(kvs_cpu_decode_attention(&a, NULL), 0);
  kvs_attn_args b = a;
  b.qo_dtype = KVS_DTYPE_FP8;
  assert_int_equal(kvs_cpu_decode_attention(&b, NULL), KVS_EINVAL);
  assert_int_equal(kvs_cuda_decode_attention(&b, NULL), KVS_EINVAL);
  b.qo_dtype = KVS_DTYPE_INT8;
  assert_int_equal(kvs_cuda_decode_attention(&b, NULL), KVS_EINVAL);
  kvs_write_args w = {.kv = a.kv, .k = out, .v = out, .slots = (int64_t[]){0},
                      .src_token_stride = 128, .src_dtype = KVS_DTYPE_INT8,
                      .num_tokens = 1};
  assert_int_equal(kvs_cpu_write_kv(&w, NULL), KVS_EINVAL);
  assert_int_equal(kvs_cuda_write_kv(&w, NULL), KVS_EINVAL);
  /* An int8 row past 4096 elements (the layout's largest head_dim) cannot
   * be rotated whole: refused by both backends, nothing written. */
  w.src_dtype = KVS_DTYPE_FP32;
  w.kv.head_dim = w.kv.head_stride = KVS__QROW_MAX + 1;
  w.kv.token_stride = 2 * (uint64_t)w.kv.head_stride;
  w.kv.scale_offset = 8 * 2 * (KVS__QROW_MAX + 1) * 2;
  w.kv.num_blocks = 0;
  assert_int_equal(kvs_cpu_write_kv(&w, NULL), KVS_EINVAL);
  assert_int_equal(kvs_cuda_write_kv(&w, NULL), KVS_EINVAL);
  w.kv.dtype = KVS_DTYPE_FP8; /* (fp8 rows are not rotated: no such limit) */
  assert_int_equal(kvs__check_paged_kv(&w.kv), 0);
  tg_case_free(&c);
}

/* ---- attention -------------------------------------------------------------- */

static int run_case(const tg_params *p, int prefill) {
  tg_case c;
  if (tg_case_build(&c, p))
    return -1;
  size_t n = (size_t)c.num_rows * c.num_heads * p->head_dim;
  size_t qes = kvs_dtype_size(p->qo_dtype);
  void *out = tg_xmalloc(n * qes);
  memset(out, 0xff, n * qes); /* NaN everywhere: every element must be written */
  double *ref = tg_xmalloc(sizeof(double) * (n ? n : 1));
  kvs_attn_args a;
  tg_case_args(&c, &a, c.pool, out, c.q, c.seq_lens, c.q_start, c.tables);
  int rc = prefill ? kvs_cpu_prefill_attention(&a, NULL)
                   : kvs_cpu_decode_attention(&a, NULL);
  if (rc) {
    fprintf(stderr, "attention returned %d (%s)\n", rc, kvs_strerror(rc));
    return -1;
  }
  tg_naive(&c, ref);
  double err = tg_max_err(out, p->qo_dtype, ref, n);
  int bad = !(err <= tg_tol(p->qo_dtype));
  if (bad)
    fprintf(stderr,
            "%s bs=%u kvh=%u D=%u ratio=%u kv=%s qo=%s seqs=%u: max err %g\n",
            prefill ? "prefill" : "decode", p->block_size, p->num_kv_heads,
            p->head_dim, p->ratio, kvs_dtype_name(p->dtype),
            kvs_dtype_name(p->qo_dtype), p->num_seqs, err);
  free(out);
  free(ref);
  tg_case_free(&c);
  return bad ? -1 : 0;
}

static void test_decode_shapes(void **state) {
  (void)state;
  static const uint32_t bss[] = {8, 16, 32}, ratios[] = {1, 4, 8, 16},
                        dims[] = {64, 128};
  int cases = 0;
  for (uint32_t dt = 0; dt < KVS_DTYPE__COUNT; dt++)
    for (size_t ib = 0; ib < 3; ib++)
      for (size_t ir = 0; ir < 4; ir++)
        for (size_t id = 0; id < 2; id++) {
          uint32_t bs = bss[ib];
          /* on a boundary, one past, one short, a single token, long */
          uint32_t lens[] = {bs, bs + 1, 3 * bs - 1, 1, 4 * bs, 7 * bs + 5};
          tg_params p = {.block_size = bs, .num_kv_heads = 2,
                         .head_dim = dims[id], .ratio = ratios[ir], .dtype = dt,
                         .qo_dtype = (uint32_t)(dt + ir) % 3, .num_layers = 3,
                         .layer = (uint32_t)(ib % 3), .num_seqs = 6,
                         .lens = lens, .spare_blocks = 5,
                         .q_scale = ir % 2 ? 6.f : 1.f,
                         .seed = 1000 + cases};
          assert_int_equal(run_case(&p, 0), 0);
          cases++;
        }
  assert_int_equal(cases, 24 * KVS_DTYPE__COUNT);
}

static void test_decode_empty_and_one_head(void **state) {
  (void)state;
  uint32_t lens[] = {0, 5, 0, 33};
  tg_params p = {.block_size = 16, .num_kv_heads = 1, .head_dim = 64,
                 .ratio = 3, .dtype = KVS_DTYPE_FP32, .qo_dtype = KVS_DTYPE_FP32,
                 .num_layers = 1, .num_seqs = 4, .lens = lens,
                 .spare_blocks = 2, .q_scale = 2.f, .seed = 5};
  assert_int_equal(run_case(&p, 0), 0);
  /* an odd head_dim works on the CPU */
  p.head_dim = 37;
  p.dtype = KVS_DTYPE_FP16;
  assert_int_equal(run_case(&p, 0), 0);
}

static void test_prefill_shapes(void **state) {
  (void)state;
  static const uint32_t bss[] = {8, 16, 32}, ratios[] = {1, 4, 8};
  int cases = 0;
  for (uint32_t dt = 0; dt < KVS_DTYPE__COUNT; dt++)
    for (size_t ib = 0; ib < 3; ib++)
      for (size_t ir = 0; ir < 3; ir++) {
        uint32_t bs = bss[ib];
        /* whole prompt, chunk after a cached prefix on and off a boundary,
         * a single new token (decode-like), an empty request */
        uint32_t lens[] = {2 * bs + 3, 3 * bs, 2 * bs + 7, bs + 1, 0};
        uint32_t qlens[] = {2 * bs + 3, bs, 9, 1, 0};
        tg_params p = {.block_size = bs, .num_kv_heads = 2,
                       .head_dim = ir == 1 ? 128 : 64, .ratio = ratios[ir],
                       .dtype = dt, .qo_dtype = dt % 3, .num_layers = 2,
                       .layer = 1, .num_seqs = 5, .lens = lens, .qlens = qlens,
                       .spare_blocks = 3, .q_scale = 3.f, .seed = 77 + cases};
        assert_int_equal(run_case(&p, 1), 0);
        cases++;
      }
}

/* Group sizes that take the 2- and 1-head register blocks of the AVX2 body,
 * head sizes with a tail of 1 to 7 elements, tiny and odd block sizes,
 * every prefetch mode. */
static void test_decode_odd_groups(void **state) {
  (void)state;
  static const uint32_t ratios[] = {2, 3, 6, 12}, dims[] = {8, 24, 37, 72, 130},
                        bss[] = {1, 4, 5, 16};
  int cases = 0;
  for (uint32_t dt = 0; dt < KVS_DTYPE__COUNT; dt++)
    for (size_t ir = 0; ir < 4; ir++)
      for (size_t id = 0; id < 5; id++) {
        uint32_t bs = bss[(ir + id) % 4];
        uint32_t lens[] = {1, bs + 2, 9 * bs + 3, 2, 17};
        tg_params p = {.block_size = bs, .num_kv_heads = 1 + (uint32_t)(id % 3),
                       .head_dim = dims[id], .ratio = ratios[ir], .dtype = dt,
                       .qo_dtype = (uint32_t)(dt + id) % 3, .num_layers = 2,
                       .layer = (uint32_t)(ir % 2), .num_seqs = 5,
                       .lens = lens, .spare_blocks = 3, .q_scale = 4.f,
                       .seed = 500 + cases};
        kvs__cpu_prefetch = cases % 3;
        int rc = run_case(&p, 0);
        kvs__cpu_prefetch = -1;
        assert_int_equal(rc, 0);
        cases++;
      }
  assert_int_equal(cases, 20 * KVS_DTYPE__COUNT);
}

/* Which bodies this CPU runs: the tests run on the one it picks (AVX-512F
 * where it has it), again on the AVX2 one ("(AVX2 body)") and on the
 * portable one ("(portable body)").  A vector body the CPU lacks is
 * reported skipped here (its runs were then another body's). */
static void test_attn_bodies(void **state) {
  (void)state;
  printf("attention bodies here: AVX-512F %s, AVX2+FMA+F16C %s\n",
         kvs__cpu_attn_simd512() ? "yes" : "no",
         kvs__cpu_attn_simd() ? "yes" : "no");
  if (!kvs__cpu_attn_simd512())
    skip();
}

/* A case that must fail: a wrong reference would pass silently otherwise. */
static void test_reference_can_fail(void **state) {
  (void)state;
  uint32_t lens[] = {20};
  tg_params p = {.block_size = 8, .num_kv_heads = 1, .head_dim = 64,
                 .ratio = 1, .dtype = KVS_DTYPE_FP32, .qo_dtype = KVS_DTYPE_FP32,
                 .num_layers = 1, .num_seqs = 1, .lens = lens,
                 .spare_blocks = 2, .q_scale = 4.f, .seed = 9};
  tg_case c;
  assert_int_equal(tg_case_build(&c, &p), 0);
  float out[64];
  double ref[64];
  kvs_attn_args a;
  tg_case_args(&c, &a, c.pool, out, c.q, c.seq_lens, NULL, c.tables);
  c.tables[1] = c.tables[0]; /* point the 2nd block at the 1st */
  assert_int_equal(kvs_cpu_decode_attention(&a, NULL), 0);
  tg_naive(&c, ref);
  assert_true(tg_max_err(out, KVS_DTYPE_FP32, ref, 64) > 1e-3);
  tg_case_free(&c);
}

/* NaN in the cache.  A NaN key makes the scores of its token NaN; the
 * portable body's expf carries it into the weights and every output of
 * that kv head's query heads is NaN, as the naive reference says.  The AVX2
 * body must agree (it once clamped the NaN score to -87 and dropped the
 * token).  A NaN value element makes that output element NaN.  Everything
 * else must still match the reference.  Run on both bodies, every dtype,
 * with the NaN token in the vector part and in the tail of a tile. */
static void test_nan_propagates(void **state) {
  (void)state;
  static const uint32_t where[] = {0, 7, 8, 37, 39};
  int cases = 0;
  for (int body = 0; body < 3; body++) /* picked, AVX2, portable */
    for (uint32_t dt = 0; dt < 3; dt++) /* (quantized: tg_case_build poisons) */
      for (size_t w = 0; w < sizeof where / sizeof *where; w++) {
        uint32_t lens[] = {40, 40, 23};
        tg_params p = {.block_size = 16, .num_kv_heads = 2, .head_dim = 64,
                       .ratio = 4, .dtype = dt, .qo_dtype = KVS_DTYPE_FP32,
                       .num_layers = 1, .num_seqs = 3, .lens = lens,
                       .spare_blocks = 2, .q_scale = 2.f,
                       .seed = 4242 + (uint64_t)cases};
        tg_case c;
        assert_int_equal(tg_case_build(&c, &p), 0);
        const kvs_layout *l = &c.layout;
        size_t es = kvs_dtype_size(dt);
        float nan = NAN;
        uint32_t t = where[w], D = p.head_dim, kvh = p.num_kv_heads;
        /* seq 0: a NaN key element of kv head 0 at token t */
        uint32_t b0 = c.tables[0 * c.max_blocks + t / 16];
        kvs_convert((char *)kvs_elem_ptr(c.pool, l, b0, 0, 0, t % 16, 0) +
                        5 * es, dt, &nan, KVS_DTYPE_FP32, 1);
        c.k[0][((size_t)t * kvh + 0) * D + 5] = NAN;
        /* seq 1: a NaN value element (dim 9) of kv head 1 at token t */
        uint32_t b1 = c.tables[1 * c.max_blocks + t / 16];
        kvs_convert((char *)kvs_elem_ptr(c.pool, l, b1, 0, 1, t % 16, 1) +
                        9 * es, dt, &nan, KVS_DTYPE_FP32, 1);
        c.v[1][((size_t)t * kvh + 1) * D + 9] = NAN;

        size_t n = (size_t)c.num_rows * c.num_heads * D;
        float *out = tg_xmalloc(n * sizeof(float));
        double *ref = tg_xmalloc(n * sizeof(double));
        kvs_attn_args a;
        tg_case_args(&c, &a, c.pool, out, c.q, c.seq_lens, NULL, c.tables);
        kvs__cpu_attn_portable = body == 2;
        kvs__cpu_attn_avx512 = body == 0;
        const char *name = kvs__cpu_attn_body();
        assert_int_equal(kvs_cpu_decode_attention(&a, NULL), 0);
        kvs__cpu_attn_portable = 0;
        kvs__cpu_attn_avx512 = 1;
        tg_naive(&c, ref);
        size_t nans = 0;
        for (size_t i = 0; i < n; i++) {
          if (isnan(ref[i]) != isnan(out[i]))
            fail_msg("%s body, %s cache, NaN at token %u: element %zu is %g, "
                     "the reference %g", name, kvs_dtype_name(dt), t, i,
                     out[i], ref[i]);
          if (isnan(ref[i])) {
            nans++;
            continue;
          }
          if (!(fabs(out[i] - ref[i]) <= tg_tol(KVS_DTYPE_FP32)))
            fail_msg("element %zu: %g, the reference %g", i, out[i], ref[i]);
        }
        /* seq 0: 4 query heads x 64 dims; seq 1: 4 heads x dim 9 */
        assert_int_equal(nans, 4 * 64 + 4);
        free(out);
        free(ref);
        tg_case_free(&c);
        cases++;
      }
  assert_int_equal(cases, 45);
}

/* The CUDA test's tolerance against the twin (tg_twin_tol, run only on a
 * GPU): one ulp of the output dtype, with its floors, checked here. */
static void test_twin_tolerance(void **state) {
  (void)state;
  assert_true(tg_twin_tol(KVS_DTYPE_FP16, 0.7) == 0x1p-11);   /* [0.5, 1) */
  assert_true(tg_twin_tol(KVS_DTYPE_FP16, 1.5) == 0x1p-10);
  assert_true(tg_twin_tol(KVS_DTYPE_FP16, 0.01) == 4e-4);     /* floor */
  assert_true(tg_twin_tol(KVS_DTYPE_BF16, 0.7) == 0x1p-8);
  assert_true(tg_twin_tol(KVS_DTYPE_BF16, -3.0) == 0x1p-6);
  assert_true(tg_twin_tol(KVS_DTYPE_BF16, 0.1) == 3e-3);      /* floor */
  assert_true(tg_twin_tol(KVS_DTYPE_FP32, 0.5) == 2e-5);
  for (uint32_t dt = KVS_DTYPE_FP16; dt <= KVS_DTYPE_BF16; dt++) {
    /* neighbours in the dtype pass, two steps apart fail */
    uint16_t a[3], b[3];
    float f = 0.75f;
    kvs_convert(&a[0], dt, &f, KVS_DTYPE_FP32, 1);
    a[1] = a[2] = a[0];
    b[0] = a[0];
    b[1] = (uint16_t)(a[0] + 1);
    b[2] = (uint16_t)(a[0] + 2);
    assert_true(tg_twin_excess(b, a, dt, 2) <= 1.0);
    assert_true(tg_twin_excess(b, a, dt, 3) > 1.0);
  }
  float nan = NAN, one = 1.f;
  assert_true(tg_twin_excess(&nan, &one, KVS_DTYPE_FP32, 1) > 1.0);
}

static void test_attn_errors(void **state) {
  (void)state;
  uint32_t lens[] = {10, 20};
  tg_params p = {.block_size = 8, .num_kv_heads = 2, .head_dim = 64,
                 .ratio = 2, .dtype = KVS_DTYPE_FP32, .qo_dtype = KVS_DTYPE_FP32,
                 .num_layers = 1, .num_seqs = 2, .lens = lens,
                 .spare_blocks = 1, .q_scale = 1.f, .seed = 1};
  tg_case c;
  assert_int_equal(tg_case_build(&c, &p), 0);
  float out[2 * 4 * 64];
  kvs_attn_args a;
  tg_case_args(&c, &a, c.pool, out, c.q, c.seq_lens, NULL, c.tables);
  assert_int_equal(kvs_cpu_decode_attention(&a, NULL), 0);
  kvs_attn_args b = a;
  b.num_heads = 3; /* not a multiple of num_kv_heads */
  assert_int_equal(kvs_cpu_decode_attention(&b, NULL), KVS_EINVAL);
  b = a;
  b.max_seq_len = 19; /* below a length */
  assert_int_equal(kvs_cpu_decode_attention(&b, NULL), KVS_EINVAL);
  b = a;
  b.qo_dtype = 7;
  assert_int_equal(kvs_cpu_decode_attention(&b, NULL), KVS_EINVAL);
  b = a;
  b.q_start = c.seq_lens; /* decode takes no q_start */
  assert_int_equal(kvs_cpu_decode_attention(&b, NULL), KVS_EINVAL);
  c.tables[0] = c.layout.num_blocks; /* past the pool */
  assert_int_equal(kvs_cpu_decode_attention(&a, NULL), KVS_ERANGE);
  uint32_t qs[3] = {0, 11, 12}; /* 11 new tokens in a 10-token request */
  b = a;
  b.q_start = qs;
  b.num_rows = 12;
  assert_int_equal(kvs_cpu_prefill_attention(&b, NULL), KVS_EINVAL);
  assert_int_equal(kvs_cpu_decode_attention(NULL, NULL), KVS_EINVAL);
  tg_case_free(&c);
}

/* ---- whole blocks ------------------------------------------------------------- */

static void test_blocks(void **state) {
  (void)state;
  kvs_layout l = {.block_size = 16, .num_layers = 2, .num_kv_heads = 2,
                  .head_dim = 64, .dtype = KVS_DTYPE_BF16, .num_blocks = 12};
  assert_int_equal(kvs_layout_finish(&l), 0);
  uint64_t bytes = kvs_pool_bytes(&l), st = l.block_stride;
  char *pool = tg_xmalloc(bytes), *orig = tg_xmalloc(bytes);
  uint64_t rng = 99;
  for (uint64_t i = 0; i < bytes; i++)
    pool[i] = (char)tg_next(&rng);
  memcpy(orig, pool, bytes);

  uint32_t pairs[] = {3, 7, 5, 5, 0, 11};
  kvs_copy_args ca = {.base = pool, .block_stride = st, .pairs = pairs,
                      .num_pairs = 3, .num_blocks = l.num_blocks};
  assert_int_equal(kvs_cpu_copy_blocks(&ca, NULL), 0);
  for (uint32_t b = 0; b < l.num_blocks; b++) {
    uint32_t from = b == 7 ? 3 : b == 11 ? 0 : b;
    assert_memory_equal(pool + b * st, orig + from * st, st);
  }
  pairs[1] = 12;
  assert_int_equal(kvs_cpu_copy_blocks(&ca, NULL), KVS_ERANGE);

  uint32_t list[] = {9, 2, 4};
  char *stg = tg_xmalloc(3 * st);
  kvs_xfer_args xa = {.base = pool, .block_stride = st, .staging = stg,
                      .blocks = list, .count = 3, .num_blocks = l.num_blocks};
  assert_int_equal(kvs_cpu_gather_blocks(&xa, NULL), 0);
  for (uint32_t i = 0; i < 3; i++)
    assert_memory_equal(stg + i * st, pool + list[i] * st, st);
  /* scatter them back in another order */
  uint32_t back[] = {1, 6, 10};
  xa.blocks = back;
  memcpy(orig, pool, bytes);
  assert_int_equal(kvs_cpu_scatter_blocks(&xa, NULL), 0);
  for (uint32_t b = 0; b < l.num_blocks; b++) {
    const char *want = b == 1 ? stg : b == 6 ? stg + st : b == 10 ? stg + 2 * st
                                                                   : orig + b * st;
    assert_memory_equal(pool + b * st, want, st);
  }
  back[2] = 99;
  assert_int_equal(kvs_cpu_scatter_blocks(&xa, NULL), KVS_ERANGE);
  free(stg);
  free(pool);
  free(orig);
}

static void test_tables(void **state) {
  (void)state;
  assert_string_equal(kvs_kernels_cpu()->name, "cpu");
  assert_ptr_equal(kvs_kernels_cpu()->decode_attention, kvs_cpu_decode_attention);
  assert_string_equal(kvs_kernels_cuda()->name, "cuda");
  const char *why = NULL;
  int rc = kvs_cuda_available(&why);
  assert_true(rc == 0 || rc == KVS_ENODEV);
  assert_non_null(why);
  if (rc)
    printf("cuda: %s\n", why);
  kvs_attn_args a;
  memset(&a, 0, sizeof a);
  kvs_layout l = {.block_size = 16, .num_layers = 1, .num_kv_heads = 1,
                  .head_dim = 64, .dtype = 0, .num_blocks = 4};
  kvs_layout_finish(&l);
  kvs_paged_kv_init(&a.kv, (void *)&l, &l, 0);
  a.num_rows = 2;
  a.num_heads = 4;
  a.max_seq_len = 1000;
  /* 4 partitions of 256: 2 rows x 4 heads x 4 x (64 + 2) floats */
  assert_int_equal(kvs_attn_workspace_bytes(&a), 4ull * 2 * 4 * 4 * 66);
  a.max_seq_len = 200;
  assert_int_equal(kvs_attn_workspace_bytes(&a), 0);
  assert_int_equal(kvs_paged_kv_init(&a.kv, NULL, &l, 1), KVS_EINVAL);
}

/* ---- int8 / fp8 caches on every body --------------------------------------- */

/* The bodies by number: 0 AVX-512F, 1 AVX2+FMA+F16C, 2 portable C. */
static const char *const quant_body_names[] = {"AVX-512F", "AVX2+FMA+F16C",
                                               "portable C"};

/* Select a body through the knobs; 0 when this CPU lacks it (the knobs are
 * then left as they were). */
static int quant_body_select(int body) {
  if ((body == 0 && !kvs__cpu_attn_simd512()) ||
      (body == 1 && !kvs__cpu_attn_simd()))
    return 0;
  kvs__cpu_attn_portable = body == 2;
  kvs__cpu_attn_avx512 = body == 0;
  return 1;
}

static void quant_body_reset(void) {
  kvs__cpu_attn_portable = 0;
  kvs__cpu_attn_avx512 = 1;
}

/* The quantized cases' parameters: 2 kv heads, 2 layers (the second one
 * attended), 3 spare blocks of garbage. */
static tg_params quant_params(uint32_t dt, uint32_t bs, uint32_t dim,
                              uint32_t ratio, uint32_t qo_dtype,
                              uint32_t num_seqs, const uint32_t *lens,
                              const uint32_t *qlens, float q_scale,
                              uint64_t seed) {
  return (tg_params){.block_size = bs, .num_kv_heads = 2, .head_dim = dim,
                     .ratio = ratio, .dtype = dt, .qo_dtype = qo_dtype,
                     .num_layers = 2, .layer = 1, .num_seqs = num_seqs,
                     .lens = lens, .qlens = qlens, .spare_blocks = 3,
                     .q_scale = q_scale, .seed = seed};
}

/* Decode and prefill over int8/fp8 caches against the float64 reference
 * over the dequantized cache (tg_case_build writes through the write kernel
 * into a pool whose unused bytes are random and unused scales NaN/Inf):
 * GQA 4/8/6/1, block sizes 16/32, head_dim 64/128, ragged lengths from 1
 * to 1500 keys, q/out of each dtype. */
static void quant_shapes(void) {
  /* head_dim 96 and 40: int8 rows of two segments (64 + 32, 32 + 8) */
  static const uint32_t bss[] = {16, 32}, dims[] = {64, 128, 96, 40},
                        ratios[] = {4, 8, 6, 1};
  int cases = 0;
  for (uint32_t dt = KVS_DTYPE_INT8; dt <= KVS_DTYPE_FP8; dt++)
    for (size_t ib = 0; ib < 2; ib++)
      for (size_t id = 0; id < 4; id++)
        for (int prefill = 0; prefill < 2; prefill++) {
          uint32_t bs = bss[ib];
          uint32_t lens[] = {1, 1500, bs - 1, 2 * bs + 3, 0, bs};
          uint32_t qlens[] = {1, 3, 3, 2 * bs + 3, 0, 1};
          tg_params p = quant_params(
              dt, bs, dims[id], ratios[cases % 4], (uint32_t)cases % 3, 6,
              lens, prefill ? qlens : NULL, cases % 2 ? 6.f : 1.f,
              9000 + (uint64_t)cases);
          if (run_case(&p, prefill))
            fail_msg("%s body, %s cache, %s case %d", kvs__cpu_attn_body(),
                     kvs_dtype_name(dt), prefill ? "prefill" : "decode",
                     cases);
          cases++;
        }
  assert_int_equal(cases, 32);
}

/* Decode over case c on the selected body (*out, n floats) and the float64
 * reference (*ref), both the caller's to free. */
static void quant_decode(tg_case *c, size_t n, float **out, double **ref) {
  kvs_attn_args a;
  *out = tg_xmalloc(n * sizeof(float));
  *ref = tg_xmalloc(n * sizeof(double));
  tg_case_args(c, &a, c->pool, *out, c->q, c->seq_lens, NULL, c->tables);
  assert_int_equal(kvs_cpu_decode_attention(&a, NULL), 0);
  tg_naive(c, *ref);
}

/* NaN inside a written row reaches the outputs as the reference says: an
 * fp8 NaN code (0x7f, 0xff) in a key (every output of its kv head's query
 * heads NaN) or a value (that output element NaN); an int8 row whose scale
 * (key) or minimum (value) is NaN reads as NaN everywhere. */
static void quant_nan(void) {
  static const uint32_t where[] = {0, 7, 37, 39};
  for (uint32_t dt = KVS_DTYPE_INT8; dt <= KVS_DTYPE_FP8; dt++)
    for (size_t w = 0; w < sizeof where / sizeof *where; w++) {
      const uint32_t lens[] = {40, 40, 23}, t = where[w], D = 64, kvh = 2;
      const tg_params p = quant_params(dt, 16, D, 4, KVS_DTYPE_FP32, 3, lens,
                                       NULL, 2.f, 777 + (uint64_t)w);
      tg_case c;
      assert_int_equal(tg_case_build(&c, &p), 0);
      const kvs_layout *l = &c.layout;
      /* seq 0, kv head 0: the key; seq 1, kv head 1: the value */
      uint32_t b0 = c.tables[0 * c.max_blocks + t / 16];
      uint32_t b1 = c.tables[1 * c.max_blocks + t / 16];
      float *k = c.k[0] + ((size_t)t * kvh + 0) * D;
      float *v = c.v[1] + ((size_t)t * kvh + 1) * D;
      if (dt == KVS_DTYPE_FP8) {
        ((uint8_t *)kvs_elem_ptr(c.pool, l, b0, 1, 0, t % 16, 0))[5] = 0x7f;
        ((uint8_t *)kvs_elem_ptr(c.pool, l, b1, 1, 1, t % 16, 1))[9] = 0xff;
        k[5] = v[9] = NAN;
      } else {
        kvs_scale_ptr(c.pool, l, b0, 1, 0, t % 16, 0)[0] = NAN;
        kvs_scale_ptr(c.pool, l, b1, 1, 1, t % 16, 1)[1] = NAN;
        for (uint32_t d = 0; d < D; d++)
          k[d] = v[d] = NAN;
      }
      size_t n = (size_t)c.num_rows * c.num_heads * D, nans = 0;
      float *out;
      double *ref;
      quant_decode(&c, n, &out, &ref);
      for (size_t i = 0; i < n; i++) {
        if (isnan(ref[i]) != isnan(out[i]))
          fail_msg("%s body, %s cache, NaN at token %u: element %zu is %g, "
                   "the reference %g", kvs__cpu_attn_body(),
                   kvs_dtype_name(dt), t, i, out[i], ref[i]);
        nans += isnan(ref[i]) != 0;
        if (!isnan(ref[i]) && !(fabs(out[i] - ref[i]) <= tg_tol(KVS_DTYPE_FP32)))
          fail_msg("element %zu: %g, the reference %g", i, out[i], ref[i]);
      }
      /* seq 0: 4 query heads x 64 dims; seq 1: 4 heads x one dim (fp8) or
       * all 64 (int8) */
      assert_int_equal(nans, 4 * 64 + 4 * (dt == KVS_DTYPE_FP8 ? 1 : 64));
      free(out);
      free(ref);
      tg_case_free(&c);
    }
}

/* Every fp8 code but the NaN ones, read by the body: the rows of tokens 3
 * and 4 (key: seq 0, kv head 0; value: seq 1, kv head 1) hold codes 0x00
 * to 0xfe in turn (0x7f, 0xff: 0x00), so that each body's conversion of
 * each code (subnormals, both signs, the largest) meets the reference's
 * kvs_fp8_to_float. */
static void quant_codes(void) {
  const uint32_t lens[] = {40, 40}, D = 128, kvh = 2;
  const tg_params p = quant_params(KVS_DTYPE_FP8, 16, D, 4, KVS_DTYPE_FP32,
                                   2, lens, NULL, 1.f, 4242);
  tg_case c;
  assert_int_equal(tg_case_build(&c, &p), 0);
  const kvs_layout *l = &c.layout;
  for (uint32_t t = 3; t <= 4; t++) {
    uint32_t b0 = c.tables[0 * c.max_blocks + t / 16];
    uint32_t b1 = c.tables[1 * c.max_blocks + t / 16];
    uint8_t *kb = kvs_elem_ptr(c.pool, l, b0, 1, 0, t % 16, 0);
    uint8_t *vb = kvs_elem_ptr(c.pool, l, b1, 1, 1, t % 16, 1);
    float ks = kvs_scale_ptr(c.pool, l, b0, 1, 0, t % 16, 0)[0];
    float vs = kvs_scale_ptr(c.pool, l, b1, 1, 1, t % 16, 1)[0];
    float *k = c.k[0] + ((size_t)t * kvh + 0) * D;
    float *v = c.v[1] + ((size_t)t * kvh + 1) * D;
    for (uint32_t d = 0; d < D; d++) {
      uint8_t code = (uint8_t)((t - 3) * D + d);
      if ((code & 0x7f) == 0x7f)
        code = 0;
      kb[d] = vb[d] = code;
      k[d] = kvs_fp8_to_float(code) * ks;
      v[d] = kvs_fp8_to_float(code) * vs;
    }
  }
  size_t n = (size_t)c.num_rows * c.num_heads * D;
  float *out;
  double *ref;
  quant_decode(&c, n, &out, &ref);
  for (size_t i = 0; i < n; i++)
    if (!(fabs(out[i] - ref[i]) <= tg_tol(KVS_DTYPE_FP32)))
      fail_msg("%s body, every fp8 code: element %zu is %g, the reference "
               "%g", kvs__cpu_attn_body(), i, out[i], ref[i]);
  free(out);
  free(ref);
  tg_case_free(&c);
}

/* Every quantized case on one body, or a visible skip where the CPU lacks
 * it. */
static void quant_on_body(int body) {
  if (!quant_body_select(body)) {
    printf("int8/fp8 on the %s body: skipped, this CPU lacks it\n",
           quant_body_names[body]);
    skip();
  }
  assert_string_equal(kvs__cpu_attn_body(), quant_body_names[body]);
  quant_shapes();
  quant_nan();
  quant_codes();
  quant_body_reset();
}

static void test_quant_avx512(void **state) {
  (void)state;
  quant_on_body(0);
}

static void test_quant_avx2(void **state) {
  (void)state;
  quant_on_body(1);
}

static void test_quant_portable(void **state) {
  (void)state;
  quant_on_body(2);
}

static int quant_teardown(void **state) {
  (void)state;
  quant_body_reset();
  return 0;
}

static int portable_on(void **state) {
  (void)state;
  kvs__cpu_attn_portable = 1;
  return 0;
}

static int portable_off(void **state) {
  (void)state;
  kvs__cpu_attn_portable = 0;
  return 0;
}

static int avx2_on(void **state) {
  (void)state;
  kvs__cpu_attn_avx512 = 0;
  return 0;
}

static int avx2_off(void **state) {
  (void)state;
  kvs__cpu_attn_avx512 = 1;
  return 0;
}

/* A test run again on the portable body, or on the AVX2 body, under its own
 * name. */
#define PORTABLE(f) \
  { #f " (portable body)", f, portable_on, portable_off, NULL }
#define AVX2(f) { #f " (AVX2 body)", f, avx2_on, avx2_off, NULL }

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fp16_all_bits),
      cmocka_unit_test(test_fp16_rounding),
      cmocka_unit_test(test_bf16),
      cmocka_unit_test(test_write),
      cmocka_unit_test(test_quant_layout),
      cmocka_unit_test(test_quant_rounding),
      cmocka_unit_test(test_hadamard),
      cmocka_unit_test(test_quant_refusals),
      cmocka_unit_test(test_decode_shapes),
      cmocka_unit_test(test_decode_empty_and_one_head),
      cmocka_unit_test(test_decode_odd_groups),
      cmocka_unit_test(test_prefill_shapes),
      cmocka_unit_test(test_reference_can_fail),
      cmocka_unit_test(test_attn_bodies),
      /* the same on the AVX2 body (where the CPU picks AVX-512) */
      AVX2(test_decode_shapes),
      AVX2(test_decode_empty_and_one_head),
      AVX2(test_decode_odd_groups),
      AVX2(test_prefill_shapes),
      AVX2(test_reference_can_fail),
      /* the same on the portable C body */
      PORTABLE(test_decode_shapes),
      PORTABLE(test_decode_empty_and_one_head),
      PORTABLE(test_decode_odd_groups),
      PORTABLE(test_prefill_shapes),
      PORTABLE(test_reference_can_fail),
      cmocka_unit_test(test_nan_propagates),
      /* int8 / fp8 on each body (skipped where the CPU lacks one) */
      cmocka_unit_test_teardown(test_quant_avx512, quant_teardown),
      cmocka_unit_test_teardown(test_quant_avx2, quant_teardown),
      cmocka_unit_test_teardown(test_quant_portable, quant_teardown),
      cmocka_unit_test(test_twin_tolerance),
      cmocka_unit_test(test_attn_errors),
      cmocka_unit_test(test_blocks),
      cmocka_unit_test(test_tables),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
