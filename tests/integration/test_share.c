/*
 * test_share — several worker processes share one prefix through the pool.
 *
 * A writer process looks a prompt up (miss), allocates, writes recognisable
 * K/V bytes into its blocks through its own mapping, and commits.  Then
 * several reader processes, each with its own connection and mapping, look
 * the same prompt up: they must get the same block ids for the full blocks
 * and read the writer's bytes.  One reader uses the batch builder for its
 * whole step; one uses a different cache salt and must get no hit.  A fork
 * shares blocks and a write into the shared partial block comes back as a
 * copy-on-write pair.  The test ends with the pool invariant, block counts
 * back to zero in use, and no fd leak in the daemon or here.
 */
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/integration/itest.h"

#define NREADERS 4
#define FULL_BLOCKS 4

static itest_daemon d;

/* The byte the writer puts at byte i of element (position p, layer, kv,
 * head) for token tok. */
static uint8_t pattern(uint32_t tok, uint32_t p, uint32_t layer, uint32_t kv,
                       uint32_t h, uint32_t i) {
  uint32_t x = tok * 2654435761u ^ (p * 40503u + layer * 977u + kv * 131u +
                                    h * 17u + i);
  return (uint8_t)(x ^ (x >> 11) ^ (x >> 23));
}

static void fill_prompt(uint32_t *tok, uint32_t n) {
  for (uint32_t i = 0; i < n; i++)
    tok[i] = 1000 + i * 7;
}

/* Writes (or, when check is set, verifies) the K/V bytes of positions
 * [from, to) of a request whose block table is blocks.  Returns mismatches. */
static long kv_bytes(kvs_client *c, const uint32_t *blocks,
                     const uint32_t *tok, uint32_t from, uint32_t to,
                     int check) {
  const kvs_layout *l = kvs_layout_of(c);
  size_t es = kvs_dtype_size(l->dtype);
  long bad = 0;
  for (uint32_t p = from; p < to; p++) {
    uint32_t b = blocks[p / l->block_size], t = p % l->block_size;
    for (uint32_t layer = 0; layer < l->num_layers; layer++)
      for (uint32_t kv = 0; kv < 2; kv++)
        for (uint32_t h = 0; h < l->num_kv_heads; h++) {
          uint8_t *e = kvs_elem_ptr(kvs_pool_base(c), l, b, layer, kv, t, h);
          for (uint32_t i = 0; i < l->head_dim * es; i++) {
            uint8_t want = pattern(tok[p], p, layer, kv, h, i);
            if (check)
              bad += e[i] != want;
            else
              e[i] = want;
          }
        }
  }
  return bad;
}

static int writer(int wfd, int gofd, uint32_t n) {
  kvs_client *c = itest_connect(&d, "writer");
  const kvs_layout *l = kvs_layout_of(c);
  uint32_t *tok = malloc(n * sizeof *tok);
  fill_prompt(tok, n);
  kvs_lookup_result lr;
  CHECK_OK(c, kvs_lookup(c, 1, tok, n, NULL, 0, &lr));
  CHECK(lr.hit_tokens == 0 && lr.num_blocks == 0);
  kvs_alloc_result ar;
  CHECK_OK(c, kvs_allocate(c, 1, n, &ar));
  CHECK(ar.first_index == 0);
  CHECK(ar.num_blocks == (n + l->block_size - 1) / l->block_size);
  CHECK(!ar.has_cow);
  uint32_t blocks[64];
  memcpy(blocks, ar.blocks, ar.num_blocks * sizeof *blocks);
  for (uint32_t i = 0; i < ar.num_blocks; i++)
    CHECK(blocks[i] < l->num_blocks);
  kv_bytes(c, blocks, tok, 0, n, 0);
  uint32_t sealed = 0;
  CHECK_OK(c, kvs_commit(c, 1, 0, NULL, n, blocks, ar.num_blocks, &sealed));
  CHECK(sealed == FULL_BLOCKS);
  CHECK(write(wfd, blocks, sizeof blocks) == sizeof blocks);
  /* Hold the request until the readers are done. */
  char go;
  CHECK(read(gofd, &go, 1) == 1);
  CHECK_OK(c, kvs_free(c, 1));
  CHECK_RC(c, kvs_free(c, 1), KVS_ENOENT);
  kvs_close(c);
  free(tok);
  return 0;
}

static int reader(int idx, const uint32_t *wblocks, uint32_t n) {
  kvs_client *c = itest_connect(&d, "reader");
  const kvs_layout *l = kvs_layout_of(c);
  uint32_t bs = l->block_size;
  uint32_t *tok = malloc((n + 8) * sizeof *tok);
  fill_prompt(tok, n);
  uint64_t req = 100 + (uint64_t)idx;

  if (idx == 1) {
    /* A whole scheduler step in one round trip. */
    kvs_batch *b;
    CHECK_OK(c, kvs_batch_new(&b));
    int i0 = kvs_batch_lookup(b, req, tok, n, NULL, 0);
    int i1 = kvs_batch_allocate(b, req, n - FULL_BLOCKS * bs);
    int i2 = kvs_batch_ping(b, "x", 1);
    CHECK(i0 == 0 && i1 == 1 && i2 == 2 && kvs_batch_count(b) == 3);
    CHECK_OK(c, kvs_batch_submit(c, b));
    kvs_lookup_result lr;
    CHECK_OK(c, kvs_batch_lookup_result(b, 0, &lr));
    CHECK(lr.hit_tokens == FULL_BLOCKS * bs && lr.num_blocks == FULL_BLOCKS);
    CHECK(memcmp(lr.blocks, wblocks, FULL_BLOCKS * sizeof(uint32_t)) == 0);
    kvs_alloc_result ar;
    CHECK_OK(c, kvs_batch_alloc_result(b, 1, &ar));
    CHECK(ar.first_index == FULL_BLOCKS && ar.num_blocks == 1);
    CHECK(ar.blocks[0] != wblocks[FULL_BLOCKS]); /* partial: private */
    CHECK(kvs_batch_status(b, 2) == 0);
    CHECK(kvs_batch_lookup_result(b, 1, &lr) == KVS_EINVAL);
    CHECK(kvs_batch_status(b, 3) == KVS_ERANGE);
    CHECK(kv_bytes(c, wblocks, tok, 0, FULL_BLOCKS * bs, 1) == 0);
    uint32_t tail = ar.blocks[0];
    kvs_batch_reset(b);
    kvs_batch_commit(b, req, FULL_BLOCKS * bs, NULL, n - FULL_BLOCKS * bs,
                     &tail, 1);
    kvs_batch_free_req(b, req);
    kvs_batch_free_req(b, req); /* double free: its own error only */
    CHECK_OK(c, kvs_batch_submit(c, b));
    uint32_t sealed = 99;
    CHECK_OK(c, kvs_batch_commit_result(b, 0, &sealed));
    CHECK(sealed == 0);
    CHECK(kvs_batch_status(b, 1) == 0);
    CHECK(kvs_batch_status(b, 2) == KVS_ENOENT);
    kvs_batch_free(b);
  } else if (idx == 2) {
    /* Another tenant: same tokens, another salt, no hit. */
    kvs_lookup_result lr;
    CHECK_OK(c, kvs_lookup(c, req, tok, n, "tenant-b", 8, &lr));
    CHECK(lr.hit_tokens == 0 && lr.num_blocks == 0);
    CHECK_OK(c, kvs_free(c, req));
  } else if (idx == 3) {
    /* Hit, then extend past the prompt, fork, and write into the shared
     * partial tail: the child gets a copy-on-write pair. */
    kvs_lookup_result lr;
    CHECK_OK(c, kvs_lookup(c, req, tok, n, NULL, 0, &lr));
    CHECK(lr.hit_tokens == FULL_BLOCKS * bs);
    CHECK(memcmp(lr.blocks, wblocks, FULL_BLOCKS * sizeof(uint32_t)) == 0);
    kvs_alloc_result ar;
    CHECK_OK(c, kvs_allocate(c, req, n - lr.hit_tokens, &ar));
    uint32_t table[64];
    memcpy(table, wblocks, FULL_BLOCKS * sizeof(uint32_t));
    table[FULL_BLOCKS] = ar.blocks[0];
    const uint32_t wblocks_tail = ar.blocks[0];
    kv_bytes(c, table, tok, FULL_BLOCKS * bs, n, 0);
    CHECK_OK(c, kvs_commit(c, req, FULL_BLOCKS * bs, NULL,
                           n - FULL_BLOCKS * bs, NULL, 0, NULL));
    CHECK_OK(c, kvs_fork(c, req, req + 1000));
    CHECK_RC(c, kvs_fork(c, req, req + 1000), KVS_EEXIST);
    CHECK_OK(c, kvs_append(c, req + 1000, 1, &ar));
    CHECK(ar.has_cow && ar.cow_src == table[FULL_BLOCKS] &&
          ar.cow_index == FULL_BLOCKS && ar.cow_dst != ar.cow_src);
    /* The client copies: the copy holds the same bytes. */
    memcpy(kvs_block_ptr(c, ar.cow_dst), kvs_block_ptr(c, ar.cow_src),
           l->block_stride);
    table[FULL_BLOCKS] = ar.cow_dst;
    CHECK(kv_bytes(c, table, tok, 0, n, 1) == 0);
    CHECK_OK(c, kvs_free(c, req + 1000));
    /* The daemon copies, for a Batch of 80 forks' appends: 80 blocks, over
     * the 1 MiB the host pool copies on its loop, so on its thread pool. */
    enum { NCOW = 80 };
    CHECK(NCOW * l->block_stride > (1u << 20));
    kvs_batch *b;
    CHECK_OK(c, kvs_batch_new(&b));
    for (uint32_t i = 0; i < NCOW; i++)
      CHECK(kvs_batch_fork(b, req, req + 2000 + i) >= 0);
    for (uint32_t i = 0; i < NCOW; i++)
      CHECK(kvs_batch_append(b, req + 2000 + i, 1) >= 0);
    CHECK_OK(c, kvs_set_daemon_copy(c, 1));
    CHECK_OK(c, kvs_batch_submit(c, b));
    for (uint32_t i = 0; i < NCOW; i++) {
      CHECK_OK(c, kvs_batch_status(b, i));
      CHECK_OK(c, kvs_batch_alloc_result(b, NCOW + i, &ar));
      CHECK(ar.has_cow == 2 && ar.cow_src == wblocks_tail);
      table[FULL_BLOCKS] = ar.cow_dst;
      CHECK(kv_bytes(c, table, tok, 0, n, 1) == 0);
    }
    kvs_batch_reset(b);
    for (uint32_t i = 0; i < NCOW; i++)
      kvs_batch_free_req(b, req + 2000 + i);
    CHECK_OK(c, kvs_batch_submit(c, b));
    kvs_batch_free(b);
    CHECK_OK(c, kvs_free(c, req));
  } else {
    kvs_lookup_result lr;
    CHECK_OK(c, kvs_lookup(c, req, tok, n, NULL, 0, &lr));
    CHECK(lr.hit_tokens == FULL_BLOCKS * bs && lr.num_blocks == FULL_BLOCKS);
    CHECK(memcmp(lr.blocks, wblocks, FULL_BLOCKS * sizeof(uint32_t)) == 0);
    CHECK(kv_bytes(c, wblocks, tok, 0, FULL_BLOCKS * bs, 1) == 0);
    /* Preempt keeps the request; a new lookup takes the prefix back. */
    CHECK_OK(c, kvs_preempt(c, req));
    CHECK_OK(c, kvs_lookup(c, req, tok, n, NULL, 0, &lr));
    CHECK(lr.hit_tokens == FULL_BLOCKS * bs);
    CHECK_OK(c, kvs_free(c, req));
  }
  kvs_close(c);
  free(tok);
  return 0;
}

int main(void) {
  int my_fds = itest_fd_count(0);
  static const char *const opts[] = {"--num-layers", "2", "--head-dim", "16",
                                     "--pool-blocks", "256", NULL};
  itest_daemon_start(&d, opts);
  kvs_client *c = itest_connect(&d, "share-main");
  const kvs_layout *l = kvs_layout_of(c);
  CHECK(kvs_pool_base(c) != NULL);
  CHECK(strcmp(kvs_pool_backend(c), "host") == 0);
  CHECK(kvs_pool_size(c) >= kvs_pool_bytes(l));
  CHECK(l->num_blocks > 4 * (FULL_BLOCKS + 2));
  CHECK(kvs_block_ptr(c, l->num_blocks) == NULL);
  uint32_t n = FULL_BLOCKS * l->block_size + 3;
  CHECK_OK(c, kvs_ping(c, NULL, 0));
  CHECK_OK(c, kvs_ping(c, "hello", 5));

  int up[2], go[2];
  CHECK(pipe(up) == 0 && pipe(go) == 0);
  fflush(NULL);
  pid_t w = fork();
  CHECK(w >= 0);
  if (w == 0) {
    close(up[0]);
    close(go[1]);
    _exit(writer(up[1], go[0], n));
  }
  close(up[1]);
  close(go[0]);
  uint32_t wblocks[64];
  CHECK(read(up[0], wblocks, sizeof wblocks) == sizeof wblocks);
  close(up[0]);
  /* The writer holds its request: its blocks are in use. */
  itest_check_pool(c, 2, FULL_BLOCKS + 1, 1);

  pid_t r[NREADERS];
  for (int i = 0; i < NREADERS; i++) {
    r[i] = fork();
    CHECK(r[i] >= 0);
    if (r[i] == 0)
      _exit(reader(i, wblocks, n));
  }
  for (int i = 0; i < NREADERS; i++)
    CHECK(itest_wait(r[i]) == 0);
  CHECK(write(go[1], "g", 1) == 1);
  close(go[1]);
  CHECK(itest_wait(w) == 0);

  /* Nothing in use; the shared prefix stays cached. */
  itest_check_pool(c, 1, 0, 0);
  kvs_stats st;
  CHECK_OK(c, kvs_stats_get(c, 0, &st));
  CHECK(st.cached_blocks >= FULL_BLOCKS);
  CHECK(st.hit_blocks >= FULL_BLOCKS * (NREADERS - 1));
  kvs_close(c);
  itest_daemon_finish(&d, my_fds);
  printf("test_share: ok (%d readers, %u-token prompt, %d shared blocks)\n",
         NREADERS, n, FULL_BLOCKS);
  return 0;
}
