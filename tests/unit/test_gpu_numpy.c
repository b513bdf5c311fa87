/*
 * test_gpu_numpy.c — runs the C attention twins on random paged cases, writes
 * inputs and outputs to a temporary directory, and has numpy recompute them
 * (tests/unit/test_gpu_numpy.py) with its own layout arithmetic and dtype
 * decoding.  Plain C.  Needs a Python with numpy: $KVS_PYTHON when set,
 * else the python3 on PATH, else /usr/bin/python3 (pick_python); skipped
 * (77) when none can import numpy.
 */
#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvs_status.h"
#include "test_gpu_util.h"

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

static int dump_case(const char *dir, FILE *idx, const char *name,
                     const tg_params *p) {
  tg_case c;
  if (tg_case_build(&c, p))
    return -1;
  int prefill = p->qlens != NULL;
  size_t n = (size_t)c.num_rows * c.num_heads * p->head_dim;
  size_t qes = kvs_dtype_size(p->qo_dtype);
  void *out = tg_xmalloc(n * qes);
  kvs_attn_args a;
  tg_case_args(&c, &a, c.pool, out, c.q, c.seq_lens, c.q_start, c.tables);
  int rc = prefill ? kvs_cpu_prefill_attention(&a, NULL)
                   : kvs_cpu_decode_attention(&a, NULL);
  if (rc) {
    fprintf(stderr, "%s: attention %d (%s)\n", name, rc, kvs_strerror(rc));
    return -1;
  }
  if (write_file(dir, name, ".pool", c.pool, kvs_pool_bytes(&c.layout)) ||
      write_file(dir, name, ".lens", c.seq_lens, 4 * p->num_seqs) ||
      write_file(dir, name, ".tables", c.tables, 4 * (size_t)p->num_seqs * c.max_blocks) ||
      write_file(dir, name, ".q", c.q, n * qes) ||
      write_file(dir, name, ".out", out, n * qes) ||
      (prefill && write_file(dir, name, ".qstart", c.q_start, 4 * (p->num_seqs + 1))))
    return -1;
  fprintf(idx, "%s %u %u %u %u %u %u %u %u %u %llu %u %u %d %.9g\n", name,
          p->dtype, p->qo_dtype, p->block_size, p->num_layers, p->layer,
          p->num_kv_heads, p->head_dim, c.num_heads, c.layout.num_blocks,
          (unsigned long long)c.layout.block_stride, p->num_seqs, c.max_blocks,
          prefill, (double)a.scale);
  free(out);
  tg_case_free(&c);
  return 0;
}

/* The first of the candidates that imports numpy: $KVS_PYTHON alone when
 * set, else the python3 on PATH (on the GPU machines the one with numpy
 * and PyTorch), else Debian's.  NULL: none can. */
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
    printf("skipped: no python3 that imports numpy (%s; install python3-numpy "
           "or set KVS_PYTHON)\n", getenv("KVS_PYTHON") ? getenv("KVS_PYTHON")
                                                     : "python3 on PATH, "
                                                       "/usr/bin/python3");
    return 77;
  }
  printf("numpy from %s\n", py);
  fflush(stdout);
  char cmd[1024];
  const char *src = getenv("KVS_SRCDIR");
  char script[512];
  snprintf(script, sizeof script, "%s/tests/unit/test_gpu_numpy.py",
           src ? src : ".");
  if (access(script, R_OK) != 0) {
    fprintf(stderr, "cannot find %s (run from the source tree or set KVS_SRCDIR)\n",
            script);
    return 1;
  }
  char dir[] = "/tmp/kvs-numpy-XXXXXX";
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  char path[600];
  snprintf(path, sizeof path, "%s/cases.txt", dir);
  FILE *idx = fopen(path, "w");
  if (!idx)
    return 1;
  int k = 0, bad = 0;
  static const uint32_t bss[] = {8, 16, 32}, ratios[] = {1, 4, 8};
  for (uint32_t dt = 0; dt < KVS_DTYPE__COUNT; dt++) /* int8, fp8 too */
    for (int ir = 0; ir < 3; ir++) {
      uint32_t bs = bss[(dt + (uint32_t)ir) % 3];
      uint32_t lens[] = {bs, 2 * bs + 3, 1, 5 * bs - 1, 0};
      char name[32];
      snprintf(name, sizeof name, "dec%d", k);
      tg_params p = {.block_size = bs, .num_kv_heads = 2,
                     .head_dim = ir == 1 ? 128 : 64, .ratio = ratios[ir],
                     .dtype = dt, .qo_dtype = (dt + (uint32_t)ir) % 3,
                     .num_layers = 3, .layer = (uint32_t)ir, .num_seqs = 5,
                     .lens = lens, .spare_blocks = 3, .q_scale = 4.f,
                     .seed = 321 + (uint64_t)k};
      bad |= dump_case(dir, idx, name, &p);
      k++;
      uint32_t plens[] = {3 * bs, 2 * bs + 5, 7};
      uint32_t qlens[] = {bs + 2, 2 * bs + 5, 1};
      snprintf(name, sizeof name, "pre%d", k);
      p.lens = plens;
      p.qlens = qlens;
      p.num_seqs = 3;
      p.seed++;
      bad |= dump_case(dir, idx, name, &p);
      k++;
    }
  fclose(idx);
  if (bad) {
    fprintf(stderr, "could not write the cases\n");
    return 1;
  }
  snprintf(cmd, sizeof cmd, "%s %s %s", py, script, dir);
  int rc = system(cmd);
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0)
    fprintf(stderr, "could not remove %s\n", dir);
  return (rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 0) ? 0 : 1;
}
