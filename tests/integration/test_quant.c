/*
 * test_quant — a daemon with an int8 or fp8 pool, and workers sharing
 * quantized blocks through it.
 *
 * For each of --dtype int8 and --dtype fp8: the daemon starts; a writer
 * worker checks the announced layout (dtype, the block stride with the
 * scales), quantizes K/V into its blocks with the C write kernel through
 * its own mapping, runs decode attention, and commits.  A reader process
 * with its own connection and mapping looks the prompt up, gets the same
 * blocks and must compute the same attention output, bit for bit (the
 * scales travelled inside the blocks).  A copy-on-write copy of a block
 * (kvs_cpu_copy_blocks) reads the same too.  The test ends with the pool
 * invariant and no leak.
 */
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu/kvs_kernels.h"
#include "tests/integration/itest.h"

#define NTOK 40 /* 2 full blocks of 16 and 8 tokens */

static itest_daemon d;

static void prompt(uint32_t *tok) {
  for (uint32_t i = 0; i < NTOK; i++)
    tok[i] = 500 + i * 3;
}

/* Decode attention of one query row over the request's NTOK tokens, every
 * layer, into out[layer][H][D]. */
static void attend(kvs_client *c, const uint32_t *blocks, uint32_t nb,
                   float *out) {
  const kvs_layout *l = kvs_layout_of(c);
  uint32_t H = 2 * l->num_kv_heads, D = l->head_dim, len = NTOK;
  float *q = malloc(sizeof(float) * H * D);
  for (uint32_t i = 0; i < H * D; i++)
    q[i] = (float)((i * 37u) % 17u) / 8.f - 1.f;
  for (uint32_t layer = 0; layer < l->num_layers; layer++) {
    kvs_attn_args a = {.out = out + (size_t)layer * H * D, .q = q,
                       .seq_lens = &len, .block_tables = blocks,
                       .num_seqs = 1, .num_rows = 1, .num_heads = H,
                       .max_blocks_per_seq = nb, .max_seq_len = len,
                       .qo_dtype = KVS_DTYPE_FP32, .scale = 0.25f};
    CHECK_OK(c, kvs_paged_kv_of(c, layer, &a.kv));
    CHECK_OK(c, kvs_cpu_decode_attention(&a, NULL));
  }
  free(q);
}

static int writer(int wfd, int gofd) {
  kvs_client *c = itest_connect(&d, "q-writer");
  const kvs_layout *l = kvs_layout_of(c);
  uint32_t tok[NTOK], row = l->num_kv_heads * l->head_dim;
  prompt(tok);
  kvs_lookup_result lr;
  CHECK_OK(c, kvs_lookup(c, 1, tok, NTOK, NULL, 0, &lr));
  CHECK(lr.hit_tokens == 0);
  kvs_alloc_result ar;
  CHECK_OK(c, kvs_allocate(c, 1, NTOK, &ar));
  CHECK(ar.num_blocks == 3);
  uint32_t blocks[3];
  memcpy(blocks, ar.blocks, sizeof blocks);
  float *k = malloc(sizeof(float) * NTOK * row);
  float *v = malloc(sizeof(float) * NTOK * row);
  int64_t slots[NTOK];
  for (uint32_t layer = 0; layer < l->num_layers; layer++) {
    for (uint32_t i = 0; i < NTOK * row; i++) {
      k[i] = (float)(((i + layer) * 2654435761u) >> 20) / 2048.f - 1.f;
      v[i] = (float)(((i * 7 + layer) * 40503u) % 1001u) / 100.f - 5.f;
    }
    for (uint32_t t = 0; t < NTOK; t++)
      slots[t] = (int64_t)blocks[t / l->block_size] * l->block_size +
                 t % l->block_size;
    kvs_write_args w = {.k = k, .v = v, .slots = slots, .src_token_stride = row,
                        .src_dtype = KVS_DTYPE_FP32, .num_tokens = NTOK};
    CHECK_OK(c, kvs_paged_kv_of(c, layer, &w.kv));
    CHECK(w.kv.scale_offset == kvs_scale_offset(l));
    CHECK_OK(c, kvs_cpu_write_kv(&w, NULL));
  }
  float out[4 * 8 * 32];
  attend(c, blocks, 3, out);
  uint32_t sealed = 0;
  CHECK_OK(c, kvs_commit(c, 1, 0, NULL, NTOK, blocks, 3, &sealed));
  CHECK(sealed == 2);
  CHECK(write(wfd, blocks, sizeof blocks) == sizeof blocks);
  CHECK(write(wfd, out, sizeof out) == sizeof out);
  char go;
  CHECK(read(gofd, &go, 1) == 1);
  CHECK_OK(c, kvs_free(c, 1));
  kvs_close(c);
  free(k);
  free(v);
  return 0;
}

static int reader(const uint32_t *wblocks, const float *want) {
  kvs_client *c = itest_connect(&d, "q-reader");
  const kvs_layout *l = kvs_layout_of(c);
  uint32_t tok[NTOK];
  prompt(tok);
  kvs_lookup_result lr;
  CHECK_OK(c, kvs_lookup(c, 2, tok, NTOK, NULL, 0, &lr));
  CHECK(lr.hit_tokens == 32 && lr.num_blocks == 2);
  CHECK(memcmp(lr.blocks, wblocks, 2 * sizeof(uint32_t)) == 0);
  /* The partial block is the writer's (private to its request, read here
   * through this process's own mapping of the same pool). */
  uint32_t table[3] = {lr.blocks[0], lr.blocks[1], wblocks[2]};
  float out[4 * 8 * 32];
  attend(c, table, 3, out);
  CHECK(memcmp(out, want, sizeof out) == 0);
  /* A copy of the first block (copy-on-write) carries its scales. */
  kvs_alloc_result ar;
  CHECK_OK(c, kvs_allocate(c, 2, NTOK - 32, &ar)); /* (lr.blocks now stale) */
  uint32_t pair[2] = {table[0], ar.blocks[0]};
  kvs_copy_args ca = {.base = kvs_pool_base(c), .block_stride = l->block_stride,
                      .pairs = pair, .num_pairs = 1, .num_blocks = l->num_blocks};
  CHECK_OK(c, kvs_cpu_copy_blocks(&ca, NULL));
  table[0] = ar.blocks[0];
  attend(c, table, 3, out);
  CHECK(memcmp(out, want, sizeof out) == 0);
  CHECK_OK(c, kvs_free(c, 2));
  kvs_close(c);
  return 0;
}

static void run(const char *dtype, uint32_t want_dtype) {
  int my_fds = itest_fd_count(0);
  const char *const opts[] = {"--num-layers", "4", "--num-kv-heads", "4",
                              "--head-dim", "32", "--block-size", "16",
                              "--pool-blocks", "64", "--dtype", dtype, NULL};
  itest_daemon_start(&d, opts);
  kvs_client *c = itest_connect(&d, "q-main");
  const kvs_layout *l = kvs_layout_of(c);
  CHECK(l->dtype == want_dtype);
  CHECK(strcmp(kvs_dtype_name(l->dtype), dtype) == 0);
  /* 16 x 4 x 32 bytes, then 16 x 4 float32 scales per plane (int8: a
   * scale and a minimum each, 16 x 4 x 2) */
  const uint64_t plane = 2048 + (want_dtype == KVS_DTYPE_INT8 ? 512 : 256);
  CHECK(kvs_plane_bytes(l) == plane);
  CHECK(l->block_stride == kvs_round_up(4 * 2 * plane, 4096));

  int up[2], go[2];
  CHECK(pipe(up) == 0 && pipe(go) == 0);
  fflush(NULL);
  pid_t w = fork();
  CHECK(w >= 0);
  if (w == 0) {
    close(up[0]);
    close(go[1]);
    _exit(writer(up[1], go[0]));
  }
  close(up[1]);
  close(go[0]);
  uint32_t wblocks[3];
  static float want[4 * 8 * 32];
  CHECK(read(up[0], wblocks, sizeof wblocks) == sizeof wblocks);
  CHECK(read(up[0], want, sizeof want) == sizeof want);
  close(up[0]);
  for (size_t i = 0; i < sizeof want / sizeof *want; i++)
    CHECK(want[i] == want[i] && want[i] >= -5.f && want[i] <= 5.f);
  pid_t r = fork();
  CHECK(r >= 0);
  if (r == 0)
    _exit(reader(wblocks, want));
  CHECK(itest_wait(r) == 0);
  CHECK(write(go[1], "g", 1) == 1);
  close(go[1]);
  CHECK(itest_wait(w) == 0);
  itest_check_pool(c, 1, 0, 0);
  kvs_close(c);
  itest_daemon_finish(&d, my_fds);
  printf("test_quant: --dtype %s ok\n", dtype);
}

int main(void) {
  run("int8", KVS_DTYPE_INT8);
  run("fp8", KVS_DTYPE_FP8);
  return 0;
}
