/*
 * test_gpu_quant.c — int8/fp8 caches against numpy (tests/unit/
 * test_gpu_quant.py).  For each quantized dtype, K/V distribution (Gaussian,
 * Student-t with 3 degrees of freedom, Gaussian with 4 outlier channels)
 * and length (1, 17, 512, 8192), the C
 * write kernel quantizes fp32 K/V into a pool whose unused bytes are random
 * and whose unused scales and int8 minimums are NaN/Inf, then decode and
 * chunked-prefill attention run over it.  A few more cases write fp16/bf16
 * sources through strided rows and padding slots.  Everything goes to a
 * temporary directory and numpy checks: the bytes, scales and minimums
 * against its own quantizer (exact),
 * the outputs against float64 attention over the dequantized cache (fp32
 * tolerance), and the quantization error against attention over the
 * unquantized K/V (relative RMS, bounded, printed).  Plain C; skipped (77)
 * without a Python that imports numpy.
 */
#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvs_status.h"
#include "test_gpu_util.h"

enum { BS = 16, KVH = 2, DIM = 128, RATIO = 4, PRE_ROWS = 8 };

static int write_file(const char *dir, const char *name, const char *ext,
                      const void *p, size_t n) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s%s", dir, name, ext);
  FILE *f = fopen(path, "wb");
  if (!f)
    return -1;
  size_t w = n ? fwrite(p, 1, n, f) : 0;
  return (fclose(f) == 0 && w == n) ? 0 : -1;
}

/* Standard normal (Box-Muller), and Student-t with 3 dof: a normal over the
 * root of a chi-square with 3 dof divided by 3. */
static double gauss(uint64_t *rng) {
  double u = ((double)(tg_next(rng) >> 11) + 0.5) * 0x1p-53;
  double v = (double)(tg_next(rng) >> 11) * 0x1p-53;
  return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static double student3(uint64_t *rng) {
  double z = gauss(rng), c = 0;
  for (int i = 0; i < 3; i++) {
    double g = gauss(rng);
    c += g * g;
  }
  return z / sqrt(c / 3.0);
}

/* dist 2: Gaussian with these 4 channels (of every head) 20 times larger,
 * as a real model's K has (tests/bench/quant_groups.py draws the same). */
static int is_outlier_channel(uint32_t d) {
  return d == 3 || d == 50 || d == 77 || d == 101;
}

/*
 * One case: len tokens of K/V (dist 0 Gaussian, 1 Student-t, 2 Gaussian
 * with outlier channels) in src_dtype
 * (rows src_stride elements apart), written into a pool of the quantized
 * dtype; then decode (the last position) and prefill (the last min(len,
 * PRE_ROWS) positions) attention with fp32 q/out.
 */
static int run_case(const char *dir, FILE *idx, const char *name,
                    uint32_t dtype, int dist, uint32_t len, uint32_t src_dtype,
                    uint64_t seed) {
  uint64_t rng = seed;
  const uint32_t nb = (len + BS - 1) / BS, H = KVH * RATIO;
  const uint32_t stride = KVH * DIM + (src_dtype == KVS_DTYPE_FP32 ? 0 : 3);
  kvs_layout l = {.block_size = BS, .num_layers = 2, .num_kv_heads = KVH,
                  .head_dim = DIM, .dtype = dtype, .num_blocks = nb + 3};
  if (kvs_layout_finish(&l))
    return -1;
  const uint32_t layer = 1;
  uint64_t bytes = kvs_pool_bytes(&l);
  uint8_t *pool = tg_xmalloc(bytes);
  for (uint64_t i = 0; i < bytes; i++)
    pool[i] = (uint8_t)tg_next(&rng);
  static const float poison[] = {NAN, INFINITY, -INFINITY};
  for (uint32_t b = 0; b < l.num_blocks; b++)
    for (uint32_t ly = 0; ly < l.num_layers; ly++)
      for (uint32_t kv = 0; kv < 2; kv++)
        for (uint32_t t = 0; t < BS; t++)
          for (uint32_t h = 0; h < KVH; h++)
            for (uint32_t f = 0; f < kvs_scale_floats(dtype); f++)
              kvs_scale_ptr(pool, &l, b, ly, kv, t, h)[f] =
                  poison[(b + t + kv + f) % 3];

  /* Shuffled blocks; every 5th source row a padding slot (-1) followed by
   * the real one, so the write kernel skips rows. */
  uint32_t *table = tg_xmalloc(sizeof(uint32_t) * (nb + 1));
  uint32_t *perm = tg_xmalloc(sizeof(uint32_t) * l.num_blocks);
  for (uint32_t i = 0; i < l.num_blocks; i++)
    perm[i] = i;
  for (uint32_t i = l.num_blocks; i > 1; i--) {
    uint32_t j = (uint32_t)(tg_next(&rng) % i), t = perm[i - 1];
    perm[i - 1] = perm[j];
    perm[j] = t;
  }
  for (uint32_t i = 0; i <= nb; i++)
    table[i] = perm[i];
  free(perm);
  const uint32_t rows = len + len / 5 + 1; /* every 6th a padding slot */
  size_t ses = kvs_dtype_size(src_dtype);
  char *k = tg_xmalloc((size_t)rows * stride * ses);
  char *v = tg_xmalloc((size_t)rows * stride * ses);
  int64_t *slots = tg_xmalloc(sizeof(int64_t) * rows);
  for (uint32_t r = 0, t = 0; r < rows; r++) {
    int pad = (r % 6 == 5) || t == len;
    slots[r] = pad ? -1 : (int64_t)table[t / BS] * BS + t % BS;
    for (uint32_t i = 0; i < stride; i++) {
      float a = (float)(dist == 1 ? student3(&rng) : gauss(&rng));
      float b = (float)(dist == 1 ? student3(&rng) : gauss(&rng));
      if (dist == 2 && is_outlier_channel(i % DIM)) {
        a *= 20.f;
        b *= 20.f;
      }
      kvs_convert(k + ((size_t)r * stride + i) * ses, src_dtype, &a,
                  KVS_DTYPE_FP32, 1);
      kvs_convert(v + ((size_t)r * stride + i) * ses, src_dtype, &b,
                  KVS_DTYPE_FP32, 1);
    }
    t += !pad;
  }
  kvs_write_args w = {.k = k, .v = v, .slots = slots, .src_token_stride = stride,
                      .src_dtype = src_dtype, .num_tokens = rows};
  if (kvs_paged_kv_init(&w.kv, pool, &l, layer) || kvs_cpu_write_kv(&w, NULL)) {
    fprintf(stderr, "%s: write failed\n", name);
    return -1;
  }

  /* q: rows of the prefill (the decode row is its last). */
  const uint32_t qr = len < PRE_ROWS ? len : PRE_ROWS;
  float *q = tg_xmalloc(sizeof(float) * qr * H * DIM);
  for (uint32_t i = 0; i < qr * H * DIM; i++)
    q[i] = (float)gauss(&rng);
  float *dec = tg_xmalloc(sizeof(float) * H * DIM);
  float *pre = tg_xmalloc(sizeof(float) * qr * H * DIM);
  uint32_t seq_len = len, q_start[2] = {0, qr};
  kvs_attn_args a = {.out = dec, .q = q + (size_t)(qr - 1) * H * DIM,
                     .seq_lens = &seq_len, .block_tables = table,
                     .num_seqs = 1, .num_rows = 1, .num_heads = H,
                     .max_blocks_per_seq = nb + 1, .max_seq_len = len,
                     .qo_dtype = KVS_DTYPE_FP32,
                     .scale = 1.0f / sqrtf((float)DIM)};
  kvs_paged_kv_init(&a.kv, pool, &l, layer);
  int rc = kvs_cpu_decode_attention(&a, NULL);
  a.out = pre;
  a.q = q;
  a.q_start = q_start;
  a.num_rows = qr;
  if (!rc)
    rc = kvs_cpu_prefill_attention(&a, NULL);
  if (rc) {
    fprintf(stderr, "%s: attention %d (%s)\n", name, rc, kvs_strerror(rc));
    return -1;
  }
  if (write_file(dir, name, ".pool", pool, bytes) ||
      write_file(dir, name, ".table", table, 4 * (size_t)(nb + 1)) ||
      write_file(dir, name, ".slots", slots, 8 * (size_t)rows) ||
      write_file(dir, name, ".k", k, (size_t)rows * stride * ses) ||
      write_file(dir, name, ".v", v, (size_t)rows * stride * ses) ||
      write_file(dir, name, ".q", q, 4 * (size_t)qr * H * DIM) ||
      write_file(dir, name, ".dec", dec, 4 * (size_t)H * DIM) ||
      write_file(dir, name, ".pre", pre, 4 * (size_t)qr * H * DIM))
    return -1;
  fprintf(idx, "%s %u %d %u %u %u %u %u %u %u %u %llu %u %u %.9g\n", name,
          dtype, dist, len, src_dtype, stride, rows, BS, KVH, DIM, H,
          (unsigned long long)l.block_stride, layer, qr, (double)a.scale);
  free(pool);
  free(table);
  free(k);
  free(v);
  free(slots);
  free(q);
  free(dec);
  free(pre);
  return 0;
}

/* The first of the candidates that imports numpy ($KVS_PYTHON alone when
 * set), as test_gpu_numpy picks it. */
static const char *pick_python(void) {
  static const char *const cands[] = {"python3", "/usr/bin/python3"};
  const char *env = getenv("KVS_PYTHON");
  char cmd[1024];
  for (size_t i = 0; i < (env ? 1 : sizeof cands / sizeof *cands); i++) {
    const char *py = env ? env : cands[i];
    snprintf(cmd, sizeof cmd, "'%s' -c 'import numpy' >/dev/null 2>&1", py);
    if (system(cmd) == 0)
      return py;
  }
  return NULL;
}

int main(void) {
  const char *py = pick_python();
  if (!py) {
    printf("skipped: no python3 that imports numpy (install python3-numpy "
           "or set KVS_PYTHON)\n");
    return 77;
  }
  const char *src = getenv("KVS_SRCDIR");
  char script[512];
  snprintf(script, sizeof script, "%s/tests/unit/test_gpu_quant.py",
           src ? src : ".");
  if (access(script, R_OK) != 0) {
    fprintf(stderr, "cannot find %s (run from the source tree or set "
                    "KVS_SRCDIR)\n", script);
    return 1;
  }
  char dir[] = "/tmp/kvs-quant-XXXXXX";
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  char path[600];
  snprintf(path, sizeof path, "%s/cases.txt", dir);
  FILE *idx = fopen(path, "w");
  if (!idx)
    return 1;
  static const uint32_t lens[] = {1, 17, 512, 8192};
  int bad = 0, k = 0;
  char name[32];
  for (uint32_t dt = KVS_DTYPE_INT8; dt <= KVS_DTYPE_FP8; dt++)
    for (int dist = 0; dist < 2; dist++)
      for (size_t i = 0; i < sizeof lens / sizeof *lens; i++) {
        snprintf(name, sizeof name, "err%d", k);
        bad |= run_case(dir, idx, name, dt, dist, lens[i], KVS_DTYPE_FP32,
                        7000 + (uint64_t)k);
        k++;
      }
  for (uint32_t dt = KVS_DTYPE_INT8; dt <= KVS_DTYPE_FP8; dt++)
    for (uint32_t sdt = KVS_DTYPE_FP16; sdt <= KVS_DTYPE_BF16; sdt++) {
      snprintf(name, sizeof name, "src%d", k);
      bad |= run_case(dir, idx, name, dt, (int)sdt - 1, 45, sdt,
                      7000 + (uint64_t)k);
      k++;
    }
  for (uint32_t dt = KVS_DTYPE_INT8; dt <= KVS_DTYPE_FP8; dt++)
    for (size_t i = 0; i < sizeof lens / sizeof *lens; i++) {
      snprintf(name, sizeof name, "err%d", k);
      bad |= run_case(dir, idx, name, dt, 2, lens[i], KVS_DTYPE_FP32,
                      7000 + (uint64_t)k);
      k++;
    }
  fclose(idx);
  if (bad) {
    fprintf(stderr, "could not run or write the cases\n");
    return 1;
  }
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "%s %s %s", py, script, dir);
  int rc = system(cmd);
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0)
    fprintf(stderr, "could not remove %s\n", dir);
  return (rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 0) ? 0 : 1;
}
