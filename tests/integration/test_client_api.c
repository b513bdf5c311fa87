/*
 * test_client_api — libkvshare's own behaviour around the daemon.
 *
 * Without a daemon: connecting to a missing socket or a path too long, NULL
 * arguments, the batch builder before a submit (counts, ESTATE, ERANGE,
 * reset).  With a daemon (max_frame 4096): a batch larger than the frame
 * limit fails with ETOOBIG before anything is sent and the connection goes
 * on; a result's blocks passed straight into the next call; per-op results
 * of the wrong kind; the accessors (layout, pool, session, model id, plane
 * and paged views); a daemon at its connection limit refuses with ELIMIT.  Then the daemon is killed under a connected client:
 * the next call fails with ECLOSED and every later one too, the pool
 * mapping stays readable until kvs_close, and nothing leaks (ASan, fds).
 */
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "tests/integration/itest.h"

static itest_daemon d;

static void no_daemon(void) {
  kvs_client *c = (kvs_client *)1;
  CHECK(kvs_connect("/nonexistent/kvshared.sock", NULL, &c) == -ENOENT);
  CHECK(c == NULL);
  /* every failure says why in kvs_last_message(NULL), the early ones too */
  CHECK(strcmp(kvs_last_message(NULL), kvs_strerror(-ENOENT)) == 0);
  char longpath[200];
  memset(longpath, 'x', sizeof longpath - 1);
  longpath[sizeof longpath - 1] = '\0';
  CHECK(kvs_connect(longpath, NULL, &c) == KVS_EINVAL);
  CHECK(strstr(kvs_last_message(NULL), "socket path is longer") != NULL);
  CHECK(kvs_connect("/tmp/x", NULL, NULL) == KVS_EINVAL);
  CHECK(strstr(kvs_last_message(NULL), "out is NULL") != NULL);
  kvs_close(NULL);

  CHECK(kvs_batch_new(NULL) == KVS_EINVAL);
  kvs_batch *b;
  CHECK(kvs_batch_new(&b) == 0);
  CHECK(kvs_batch_count(b) == 0);
  uint32_t tok[3] = {1, 2, 3};
  CHECK(kvs_batch_lookup(b, 1, tok, 3, NULL, 0) == 0);
  CHECK(kvs_batch_lookup(b, 1, NULL, 3, NULL, 0) == KVS_EINVAL);
  CHECK(kvs_batch_lookup(b, 1, tok, 3, NULL, 4) == KVS_EINVAL);
  CHECK(kvs_batch_commit(b, 1, 0, tok, 3, NULL, 2) == KVS_EINVAL);
  CHECK(kvs_batch_allocate(b, 1, 5) == 1);
  CHECK(kvs_batch_ping(b, NULL, 1) == KVS_EINVAL);
  CHECK(kvs_batch_count(b) == 2);
  CHECK(kvs_batch_status(b, 0) == KVS_ESTATE);
  kvs_lookup_result lr;
  CHECK(kvs_batch_lookup_result(b, 0, &lr) == KVS_ESTATE);
  CHECK(strcmp(kvs_batch_message(b, 0), "") == 0);
  kvs_batch_reset(b);
  CHECK(kvs_batch_count(b) == 0);
  for (int i = 0; i < 10000; i++)
    CHECK(kvs_batch_append(b, (uint64_t)i, 1) == i);
  kvs_batch_free(b);
  kvs_batch_free(NULL);
  CHECK(kvs_batch_count(NULL) == 0);
  CHECK(strcmp(kvs_strerror(KVS_ENOSPC), "no space: not enough free blocks") == 0);
  CHECK(strcmp(kvs_status_name(KVS_EMISMATCH), "EMISMATCH") == 0);
  CHECK(strcmp(kvs_version(), "0.1.0") == 0);
}

int main(void) {
  int my_fds = itest_fd_count(0);
  no_daemon();

  static const char *const opts[] = {"--num-layers", "2", "--head-dim", "16",
                                     "--pool-blocks", "64", "--max-frame",
                                     "4096", "--model-id", "api-test", NULL};
  itest_daemon_start(&d, opts);
  kvs_client *c = itest_connect(&d, "api");
  const kvs_layout *l = kvs_layout_of(c);
  CHECK(kvs_max_frame(c) == 4096);
  CHECK(strcmp(kvs_model_id(c), "api-test") == 0);
  CHECK(kvs_session_id(c) != 0);
  CHECK(kvs_fd(c) >= 0);
  CHECK(l->num_blocks == 64 && l->num_layers == 2 && l->head_dim == 16);
  CHECK(l->block_stride % KVS_BLOCK_ALIGN == 0);
  CHECK((char *)kvs_plane_ptr(c, 3, 1, 1) ==
        (char *)kvs_pool_base(c) + 3 * l->block_stride +
            kvs_plane_offset(l, 1, 1));
  CHECK(kvs_plane_ptr(c, 3, 2, 0) == NULL && kvs_plane_ptr(c, 3, 0, 2) == NULL);
  kvs_paged_kv kv;
  CHECK(kvs_paged_kv_of(c, 1, &kv) == 0);
  CHECK(kv.base == kvs_pool_base(c) && kv.k_offset == kvs_plane_offset(l, 1, 0));
  CHECK(kvs_paged_kv_of(c, 2, &kv) == KVS_EINVAL);

  /* A batch over the frame limit: refused before it is sent. */
  kvs_batch *b;
  CHECK_OK(c, kvs_batch_new(&b));
  uint32_t tok[400];
  for (int i = 0; i < 400; i++)
    tok[i] = 100 + (uint32_t)i;
  for (int i = 0; i < 8; i++)
    kvs_batch_lookup(b, (uint64_t)i + 1, tok, 400, NULL, 0);
  CHECK_RC(c, kvs_batch_submit(c, b), KVS_ETOOBIG);
  CHECK_OK(c, kvs_ping(c, "still", 5));
  kvs_batch_reset(b);

  /* One call over the frame limit as a compact frame (4 bytes a token id)
   * but not as an Envelope (1 byte each for ids below 128): sent as the
   * Envelope, and it works. */
  {
    uint32_t small[1100];
    kvs_lookup_result lr;

    for (int i = 0; i < 1100; i++)
      small[i] = (uint32_t)(i % 100);
    CHECK_OK(c, kvs_lookup(c, 50, small, 1100, NULL, 0, &lr));
    CHECK(lr.hit_tokens == 0);
    CHECK_OK(c, kvs_free(c, 50));
  }

  /* Results of the wrong kind; blocks straight into the next call. */
  kvs_batch_lookup(b, 1, tok, 40, NULL, 0);
  kvs_batch_allocate(b, 1, 40);
  CHECK_OK(c, kvs_batch_submit(c, b));
  kvs_alloc_result ar;
  uint32_t sealed;
  CHECK(kvs_batch_alloc_result(b, 0, &ar) == KVS_EINVAL);
  CHECK(kvs_batch_commit_result(b, 1, &sealed) == KVS_EINVAL);
  CHECK_OK(c, kvs_batch_alloc_result(b, 1, &ar));
  CHECK(ar.num_blocks == 3);
  /* The next batch names the previous batch's blocks (copied on add). */
  kvs_batch_commit(b, 1, 0, NULL, 40, ar.blocks, ar.num_blocks);
  CHECK(kvs_batch_status(b, 0) == KVS_ESTATE);
  CHECK_OK(c, kvs_batch_submit(c, b));
  CHECK_OK(c, kvs_batch_commit_result(b, 0, &sealed));
  CHECK(sealed == 2);
  CHECK_OK(c, kvs_free(c, 1));
  CHECK_OK(c, kvs_lookup(c, 2, tok, 40, NULL, 0, NULL));
  CHECK_OK(c, kvs_allocate(c, 2, 8, &ar));
  CHECK_OK(c, kvs_commit(c, 2, 32, NULL, 8, ar.blocks, ar.num_blocks, NULL));
  CHECK_OK(c, kvs_free(c, 2));

  /* The engine's block keys: malformed ones never leave the client; a
   * count that is not the blocks the commit completes is the daemon's
   * refusal (KV events off: the keys are checked, then ignored). */
  {
    uint64_t eh[3] = {11, 12, 13};
    uint8_t hb[3 * 32] = {1};
    uint32_t xl[3] = {0, 1, 0};
    kvs_block_keys k = {3, eh, NULL, 0, "lora", NULL, NULL};
    kvs_block_keys both = {3, eh, hb, 32, NULL, NULL, NULL};
    kvs_block_keys neither = {3, NULL, NULL, 0, NULL, NULL, NULL};
    kvs_block_keys long_hash = {3, NULL, hb, 33, NULL, NULL, NULL};
    kvs_block_keys no_len = {3, eh, NULL, 0, NULL, (const uint8_t *)"\xc0", NULL};
    kvs_block_keys two = {2, eh, NULL, 0, NULL, NULL, NULL};
    kvs_block_keys x = {3, NULL, hb, 32, NULL, (const uint8_t *)"\xc0", xl};
    const uint32_t more[8] = {41, 42, 43, 44, 45, 46, 47, 48};

    CHECK_OK(c, kvs_lookup(c, 3, tok, 40, "s", 1, NULL));
    CHECK_OK(c, kvs_allocate(c, 3, 40, &ar));
    CHECK(kvs_commit_keys(c, 3, 0, NULL, 40, NULL, 0, &both, NULL) == KVS_EINVAL);
    CHECK(kvs_commit_keys(c, 3, 0, NULL, 40, NULL, 0, &neither, NULL) == KVS_EINVAL);
    CHECK(kvs_commit_keys(c, 3, 0, NULL, 40, NULL, 0, &long_hash, NULL) ==
          KVS_EINVAL);
    CHECK(kvs_commit_keys(c, 3, 0, NULL, 40, NULL, 0, &no_len, NULL) ==
          KVS_EINVAL);
    kvs_block_keys bad_lora = {2, eh, NULL, 0, "\xff\xfe adapter", NULL, NULL};
    CHECK(kvs_commit_keys(c, 3, 0, NULL, 40, NULL, 0, &bad_lora, NULL) ==
          KVS_EINVAL);
    CHECK(strstr(kvs_last_message(c), "not UTF-8 text") != NULL);
    CHECK(kvs_batch_commit_keys(b, 3, 0, NULL, 40, NULL, 0, &both) == KVS_EINVAL);
    CHECK(kvs_batch_count(b) == 0);
    /* 40 tokens of 16 complete 2 blocks, not 3 */
    CHECK(kvs_commit_keys(c, 3, 0, NULL, 40, NULL, 0, &k, NULL) == KVS_EINVAL);
    CHECK(strstr(kvs_last_message(c), "complete 2 blocks") != NULL);
    CHECK(kvs_commit_keys(c, 3, 0, NULL, 48, NULL, 0, &k, NULL) == KVS_ERANGE);
    CHECK_OK(c, kvs_commit_keys(c, 3, 0, NULL, 40, NULL, 0, &two, &sealed));
    CHECK(sealed == 2);
    /* a batch: the keyed commit goes as an Envelope, beside packed ops */
    CHECK_OK(c, kvs_allocate(c, 3, 8, &ar));
    CHECK(kvs_batch_commit_keys(b, 3, 40, more, 8, NULL, 0, &x) == 0);
    kvs_batch_ping(b, "p", 1);
    CHECK_OK(c, kvs_batch_submit(c, b));
    CHECK(kvs_batch_status(b, 0) == KVS_EINVAL); /* 8 more complete 1 */
    CHECK(strstr(kvs_batch_message(b, 0), "complete 1 blocks") != NULL);
    x.nblocks = 1;
    CHECK(kvs_batch_commit_keys(b, 3, 40, more, 8, NULL, 0, &x) == 0);
    CHECK_OK(c, kvs_batch_submit(c, b));
    CHECK_OK(c, kvs_batch_commit_result(b, 0, &sealed));
    CHECK(sealed == 1);
    CHECK_OK(c, kvs_free(c, 3));
  }
  itest_check_pool(c, 1, 0, 0);
  kvs_batch_free(b);

  /* The clean path: nothing leaked, the daemon stops cleanly. */
  kvs_close(c);
  itest_daemon_finish(&d, my_fds);

  /* A daemon at its connection limit refuses in the Welcome. */
  static const char *const one[] = {"--num-layers", "1", "--head-dim", "8",
                                    "--pool-blocks", "16",
                                    "--max-connections", "1", NULL};
  itest_daemon_start(&d, one);
  c = itest_connect(&d, "first");
  kvs_client *c2 = (kvs_client *)1;
  CHECK(kvs_connect(d.socket, NULL, &c2) == KVS_ELIMIT && c2 == NULL);
  CHECK(strstr(kvs_last_message(NULL), "max_connections") != NULL);
  CHECK_OK(c, kvs_ping(c, "ok", 2));
  kvs_close(c);
  itest_daemon_finish(&d, my_fds);

  /* A daemon that goes away under a connected client. */
  itest_daemon_start(&d, opts);
  c = itest_connect(&d, "api-orphan");
  kvs_lookup_result lr;
  CHECK_OK(c, kvs_lookup(c, 1, tok, 40, NULL, 0, &lr));
  CHECK_OK(c, kvs_allocate(c, 1, 40, &ar));
  uint32_t b0 = ar.blocks[0];
  memset(kvs_block_ptr(c, b0), 0x77, 64);
  kill(d.pid, SIGKILL);
  CHECK(itest_reap(d.pid, 1) == 128 + SIGKILL); /* alive until the kill */
  d.pid = 0;
  CHECK(kvs_ping(c, "x", 1) == KVS_ECLOSED);
  CHECK(kvs_free(c, 1) == KVS_ECLOSED);
  CHECK(kvs_stats_get(c, 0, &(kvs_stats){0}) == KVS_ECLOSED);
  CHECK(((uint8_t *)kvs_block_ptr(c, b0))[63] == 0x77);
  kvs_close(c);
  itest_daemon_kill(&d);
  CHECK(itest_fd_count(0) == my_fds);
  printf("test_client_api: ok\n");
  return 0;
}
