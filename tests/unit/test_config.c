/* kvshared's option table: defaults, config-file syntax and errors, flags
 * and their precedence, bounds, derived layout, peer check, and the example
 * config in deploy/ (it parses, and it is what the table generates). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon/config.h"
#include "kvs_status.h"

static void test_defaults(void **state) {
  char err[256];
  cfg c;

  (void)state;
  cfg_init(&c);
  assert_int_equal(c.pool_blocks, 4096);
  assert_int_equal(c.pool_bytes, 0);
  assert_int_equal(c.block_size, 16);
  assert_int_equal(c.num_layers, 4);
  assert_int_equal(c.num_kv_heads, 4);
  assert_int_equal(c.head_dim, 64);
  assert_int_equal(c.dtype, KVS_DTYPE_FP32);
  assert_int_equal(c.max_frame, 16u << 20);
  assert_int_equal(c.max_connections, 256);
  assert_int_equal(c.verify_tokens, 1);
  assert_int_equal(c.ready_fd, -1);
  assert_int_equal(c.log_level, 2); /* info */
  assert_string_equal(c.backend, "auto");
  assert_string_equal(c.policy, "slru");
  assert_string_equal(c.socket, "");
  assert_int_equal(cfg_finish(&c, err, sizeof(err)), 0);
  assert_true(c.socket[0] == '/');
  assert_int_equal(c.layout.num_blocks, 4096);
  /* 16 tokens x 4 heads x 64 dims x 4 bytes x (K, V) x 4 layers */
  assert_int_equal(c.layout.block_stride, 16 * 4 * 64 * 4 * 2 * 4);
}

static void test_default_socket(void **state) {
  char path[CFG_SOCKET_MAX];
  char *old = getenv("XDG_RUNTIME_DIR");
  char *saved = old ? strdup(old) : NULL;

  (void)state;
  setenv("XDG_RUNTIME_DIR", "/run/user/1234", 1);
  cfg_default_socket(path, sizeof(path));
  assert_string_equal(path, "/run/user/1234/kvshare/kvshared.sock");
  unsetenv("XDG_RUNTIME_DIR");
  cfg_default_socket(path, sizeof(path));
  assert_string_equal(path, "/run/kvshare/kvshared.sock");
  setenv("XDG_RUNTIME_DIR", "relative", 1);
  cfg_default_socket(path, sizeof(path));
  assert_string_equal(path, "/run/kvshare/kvshared.sock");
  if (saved)
    setenv("XDG_RUNTIME_DIR", saved, 1);
  else
    unsetenv("XDG_RUNTIME_DIR");
  free(saved);
}

static void test_file_syntax(void **state) {
  char err[256];
  cfg c;

  (void)state;
  cfg_init(&c);
  assert_int_equal(
      cfg_load_string(&c,
                      "# a comment\n"
                      "\n"
                      "   pool_blocks=100   \n"
                      "block-size = 32 # trailing comment\n"
                      "socket = \"/tmp/x#y.sock\"\n"
                      "model_id = llama#3\n"
                      "dtype = bf16\n"
                      "verify_tokens = no\n"
                      "max_frame = 1M\n"
                      "pool_bytes = 2GiB\n"
                      "allow_uids = 1000, 1001,1002\n"
                      "allow_gids =\n"
                      "log_level = debug\n"
                      "pool_blocks = 200", /* last one wins; no newline */
                      "t.conf", err, sizeof(err)),
      0);
  assert_int_equal(c.pool_blocks, 200);
  assert_int_equal(c.block_size, 32);
  assert_string_equal(c.socket, "/tmp/x#y.sock");
  assert_string_equal(c.model_id, "llama#3"); /* '#' inside a word stays */
  assert_int_equal(c.dtype, KVS_DTYPE_BF16);
  assert_int_equal(c.verify_tokens, 0);
  assert_int_equal(c.max_frame, 1u << 20);
  assert_int_equal(c.pool_bytes, 2ull << 30);
  assert_int_equal(c.allow_uids.n, 3);
  assert_int_equal(c.allow_uids.ids[2], 1002);
  assert_int_equal(c.allow_gids.n, 0);
  assert_int_equal(c.log_level, 3);
}

static void expect_error(const char *text, const char *needle) {
  char err[256] = "";
  cfg c;

  cfg_init(&c);
  assert_int_equal(cfg_load_string(&c, text, "bad.conf", err, sizeof(err)),
                   KVS_EINVAL);
  if (!strstr(err, needle))
    fail_msg("error '%s' does not mention '%s'", err, needle);
}

static void test_file_errors(void **state) {
  (void)state;
  expect_error("pool_blocks = 1\nno_such_option = 3\n", "bad.conf:2");
  expect_error("no_such_option = 3\n", "unknown option 'no_such_option'");
  expect_error("pool_blocks\n", "expected 'key = value'");
  expect_error("pool_blocks = lots\n", "not a decimal number");
  expect_error("pool_blocks = 0\n", "out of range");
  expect_error("pool_blocks = -5\n", "not a decimal number");
  expect_error("block_size = 99999\n", "out of range");
  expect_error("max_frame = 12Q\n", "bad.conf:1: max_frame: '12Q' is not a "
               "byte count (a decimal number, optionally followed by K, M, G "
               "or T)");
  expect_error("max_frame = 100\n", "out of range");
  expect_error("dtype = fp64\n", "fp32|fp16|bf16");
  expect_error("backend = cuda9\n", "auto|host");
  expect_error("verify_tokens = maybe\n", "yes or no");
  expect_error("allow_uids = 1,x\n", "numeric id");
  expect_error("log_level = loud\n", "error|warn|info|debug");
  expect_error("ready_fd = -2\n", "out of range");
  expect_error("pool_blocks = 99999999999999999999999\n", "not a decimal number");
  {
    char big[300];

    memset(big, 'a', sizeof(big));
    memcpy(big, "socket = /", 10);
    big[sizeof(big) - 1] = '\0';
    expect_error(big, "longer than");
  }
}

/* Numbers are decimal, whatever their leading zeros; model ids and topics
 * are UTF-8 text. */
static void test_numbers_and_text(void **state) {
  static const char *bad_text[] = {
      "a\xff",          /* not UTF-8 */
      "\xc0\xaf",       /* an overlong '/' */
      "\xe0\x80\xaf",   /* another */
      "\xed\xa0\x80",   /* a surrogate */
      "\xf4\x90\x80\x80", /* over U+10FFFF */
      "\xe6\xa8",       /* cut short */
      "red\x1b[31m",    /* C0: an escape sequence */
      "tab\there",
      "del\x7f",
      "c1\xc2\x85",     /* C1: NEL */
  };
  char err[256];
  cfg c;

  (void)state;
  cfg_init(&c);
  assert_int_equal(cfg_set(&c, "pool_blocks", "0100", err, sizeof(err)), 0);
  assert_int_equal(c.pool_blocks, 100);
  assert_int_equal(cfg_set(&c, "max_frame", "010K", err, sizeof(err)), 0);
  assert_int_equal(c.max_frame, 10u << 10);
  assert_int_equal(cfg_set(&c, "pool_blocks", "0x10", err, sizeof(err)),
                   KVS_EINVAL);
  assert_string_equal(err, "pool_blocks: '0x10' is not a decimal number");
  assert_int_equal(c.pool_blocks, 100);
  assert_int_equal(cfg_set(&c, "max_frame", "0x10K", err, sizeof(err)),
                   KVS_EINVAL);
  assert_string_equal(err, "max_frame: '0x10K' is not a byte count (a "
                           "decimal number, optionally followed by K, M, G "
                           "or T)");
  assert_int_equal(cfg_set(&c, "max_frame", "10X", err, sizeof(err)),
                   KVS_EINVAL);
  assert_string_equal(err, "max_frame: '10X' is not a byte count (a decimal "
                           "number, optionally followed by K, M, G or T)");
  assert_int_equal(cfg_set(&c, "max_frame", "100", err, sizeof(err)),
                   KVS_EINVAL);
  assert_string_equal(err, "max_frame: 100 is out of range [1K, 1G] bytes");
  assert_int_equal(cfg_set(&c, "ready_fd", "x", err, sizeof(err)),
                   KVS_EINVAL);
  assert_string_equal(err, "ready_fd: 'x' is not a decimal integer");
  assert_int_equal(cfg_set(&c, "model_id", "Llama-3 \xc3\xbc \xe6\xa8\xa1"
                           "\xf0\x9f\x98\x80", err, sizeof(err)), 0);
  for (size_t i = 0; i < sizeof(bad_text) / sizeof(bad_text[0]); i++) {
    err[0] = '\0';
    if (cfg_set(&c, "model_id", bad_text[i], err, sizeof(err)) != KVS_EINVAL)
      fail_msg("model id #%zu accepted", i);
    assert_string_equal(err, "model_id: not UTF-8 text (control characters "
                             "and invalid UTF-8 are refused)");
    assert_int_equal(cfg_set(&c, "kv_events_topic", bad_text[i], err,
                             sizeof(err)), KVS_EINVAL);
  }
  assert_string_equal(c.model_id, "Llama-3 \xc3\xbc \xe6\xa8\xa1\xf0\x9f\x98\x80");
}

static void test_args(void **state) {
  char err[256], path[] = "/tmp/kvs-test-config-XXXXXX";
  enum cfg_action act;
  cfg c;
  int fd;

  (void)state;
  fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(dprintf(fd, "pool_blocks = 100\nhead_dim = 128\n") > 0, 1);
  close(fd);
  {
    char *argv[] = {"kvshared", "--pool-blocks", "7", "--config", path,
                    "--log_level=warn", "--verify-tokens", "--socket",
                    "/tmp/s.sock", NULL};

    cfg_init(&c);
    assert_int_equal(cfg_parse_args(&c, 9, argv, &act, err, sizeof(err)), 0);
    assert_int_equal(act, CFG_RUN);
    /* flags override the file, wherever they stand */
    assert_int_equal(c.pool_blocks, 7);
    assert_int_equal(c.head_dim, 128);
    assert_int_equal(c.log_level, 1);
    assert_int_equal(c.verify_tokens, 1);
    assert_string_equal(c.socket, "/tmp/s.sock");
  }
  {
    char *argv[] = {"kvshared", "--verify-tokens", "no", NULL};

    cfg_init(&c);
    assert_int_equal(cfg_parse_args(&c, 3, argv, &act, err, sizeof(err)), 0);
    assert_int_equal(c.verify_tokens, 0);
  }
  {
    char *argv[] = {"kvshared", "--help", "--bogus", NULL};

    assert_int_equal(cfg_parse_args(&c, 3, argv, &act, err, sizeof(err)), 0);
    assert_int_equal(act, CFG_HELP);
  }
  {
    char *argv[] = {"kvshared", "--bogus", "1", NULL};

    assert_int_equal(cfg_parse_args(&c, 3, argv, &act, err, sizeof(err)),
                     KVS_EINVAL);
    assert_non_null(strstr(err, "--bogus"));
  }
  {
    char *argv[] = {"kvshared", "--pool-blocks", NULL};

    assert_int_equal(cfg_parse_args(&c, 2, argv, &act, err, sizeof(err)),
                     KVS_EINVAL);
    assert_string_equal(err, "--pool-blocks needs a value");
  }
  {
    /* A flag is named as it was typed, dashes or underscores. */
    char *argv[] = {"kvshared", "--pool_blocks", "10X", NULL};

    assert_int_equal(cfg_parse_args(&c, 3, argv, &act, err, sizeof(err)),
                     KVS_EINVAL);
    assert_string_equal(err, "--pool_blocks: '10X' is not a decimal number");
  }
  {
    char *argv[] = {"kvshared", "--pool-blocks", "--verify-tokens", NULL};

    assert_int_equal(cfg_parse_args(&c, 3, argv, &act, err, sizeof(err)),
                     KVS_EINVAL);
    assert_string_equal(err, "--pool-blocks needs a value");
  }
  {
    char *argv[] = {"kvshared", "stray", NULL};

    assert_int_equal(cfg_parse_args(&c, 2, argv, &act, err, sizeof(err)),
                     KVS_EINVAL);
  }
  {
    char *argv[] = {"kvshared", "--config", "/nonexistent/kvs.conf", NULL};

    assert_int_equal(cfg_parse_args(&c, 3, argv, &act, err, sizeof(err)),
                     KVS_EINVAL);
    assert_non_null(strstr(err, "/nonexistent/kvs.conf"));
  }
  {
    char *argv[] = {"kvshared", "--print-config", "--pool-blocks", "9", NULL};

    cfg_init(&c);
    assert_int_equal(cfg_parse_args(&c, 4, argv, &act, err, sizeof(err)), 0);
    assert_int_equal(act, CFG_PRINT_CONFIG);
    assert_int_equal(c.pool_blocks, 9);
  }
  unlink(path);
}

/* Endpoints and listening addresses are checked as they are read. */
static void test_endpoints(void **state) {
  static const char *good_zmq[] = {"tcp://*:5557", "tcp://127.0.0.1:5557",
                                   "tcp://[::1]:5557", "tcp://eth0:5557",
                                   "tcp://*:*", "ipc:///run/kvshare/events",
                                   "inproc://events", ""};
  static const char *bad_zmq[] = {"tcp://*", "tcp://:5557", "tcp://*:70000",
                                  "tcp://::1:5557", "ipc://", "udp://x:1",
                                  "localhost:5557"};
  static const char *good_listen[] = {"127.0.0.1:9400", "[::1]:0", "*:9400",
                                      "localhost:9400", ""};
  static const char *bad_listen[] = {"127.0.0.1", "::1:9400", "*:70000",
                                     ":9400", "[::1]9400"};
  char err[256];
  cfg c;

  (void)state;
  cfg_init(&c);
  for (size_t i = 0; i < sizeof(good_zmq) / sizeof(good_zmq[0]); i++)
    if (cfg_set(&c, "kv_events_endpoint", good_zmq[i], err, sizeof(err)))
      fail_msg("'%s' refused: %s", good_zmq[i], err);
  for (size_t i = 0; i < sizeof(bad_zmq) / sizeof(bad_zmq[0]); i++)
    if (!cfg_set(&c, "kv_events_replay_endpoint", bad_zmq[i], err,
                 sizeof(err)))
      fail_msg("'%s' accepted", bad_zmq[i]);
  assert_int_equal(cfg_set(&c, "kv-events-endpoint", "5557", err,
                           sizeof(err)), KVS_EINVAL);
  assert_string_equal(err, "kv-events-endpoint: '5557' is not a ZMQ endpoint "
                           "(tcp://*:5557, tcp://ADDRESS:PORT, ipc://PATH or "
                           "inproc://NAME)");
  for (size_t i = 0; i < sizeof(good_listen) / sizeof(good_listen[0]); i++)
    if (cfg_set(&c, "metrics_listen", good_listen[i], err, sizeof(err)))
      fail_msg("'%s' refused: %s", good_listen[i], err);
  for (size_t i = 0; i < sizeof(bad_listen) / sizeof(bad_listen[0]); i++)
    if (!cfg_set(&c, "metrics_listen", bad_listen[i], err, sizeof(err)))
      fail_msg("'%s' accepted", bad_listen[i]);
  assert_string_equal(err, "metrics_listen: '[::1]9400' is not HOST:PORT "
                           "(localhost:9400, 10.0.0.5:9400, [::1]:9400 or "
                           "*:9400)");
  assert_int_equal(cfg_set(&c, "metrics_listen", "nosuch.invalid:9400", err,
                           sizeof(err)), KVS_EINVAL);
  assert_non_null(strstr(err, "metrics_listen: 'nosuch.invalid:9400': cannot "
                              "resolve 'nosuch.invalid' ("));
}

static void test_finish(void **state) {
  char err[256];
  cfg c;

  (void)state;
  cfg_init(&c);
  /* a byte budget: as many whole blocks as fit */
  assert_int_equal(cfg_set(&c, "pool_bytes", "1M", err, sizeof(err)), 0);
  assert_int_equal(cfg_set(&c, "dtype", "fp16", err, sizeof(err)), 0);
  assert_int_equal(cfg_finish(&c, err, sizeof(err)), 0);
  assert_int_equal(c.layout.block_stride, 65536);
  assert_int_equal(c.layout.num_blocks, 16);

  cfg_init(&c);
  assert_int_equal(cfg_set(&c, "pool_bytes", "4K", err, sizeof(err)), 0);
  assert_int_equal(cfg_finish(&c, err, sizeof(err)), KVS_EINVAL);
  assert_non_null(strstr(err, "smaller than one block"));

  cfg_init(&c); /* 16 TiB of 128 KiB blocks: too many blocks */
  assert_int_equal(cfg_set(&c, "pool_bytes", "16T", err, sizeof(err)), 0);
  assert_int_equal(cfg_finish(&c, err, sizeof(err)), KVS_EINVAL);
  assert_non_null(strstr(err, "blocks, more than"));
  assert_int_equal(cfg_set(&c, "pool_blocks", "67108865", err, sizeof(err)),
                   KVS_EINVAL);

  cfg_init(&c);
  assert_int_equal(cfg_set(&c, "pool_blocks", "10", err, sizeof(err)), 0);
  assert_int_equal(cfg_set(&c, "reserve_blocks", "10", err, sizeof(err)), 0);
  assert_int_equal(cfg_finish(&c, err, sizeof(err)), KVS_EINVAL);

  /* the daemon's policies, named; the offline one refused with a reason */
  const char *ok[] = {"lru", "slru", "mq"};
  for (size_t i = 0; i < 3; i++) {
    cfg_init(&c);
    assert_int_equal(cfg_set(&c, "policy", ok[i], err, sizeof(err)), 0);
    assert_int_equal(cfg_finish(&c, err, sizeof(err)), 0);
  }
  cfg_init(&c);
  assert_int_equal(cfg_set(&c, "policy", "opt", err, sizeof(err)), 0);
  assert_int_equal(cfg_finish(&c, err, sizeof(err)), KVS_EINVAL);
  assert_non_null(strstr(err, "replayer only"));
  cfg_init(&c);
  assert_int_equal(cfg_set(&c, "policy", "lfu", err, sizeof(err)), 0);
  assert_int_equal(cfg_finish(&c, err, sizeof(err)), KVS_EINVAL);
  assert_non_null(strstr(err, "lru, slru, mq"));

  cfg_init(&c); /* 4096 * 1024 * 4096 * 2 * 2 * 4 bytes: over 1 GiB */
  assert_int_equal(cfg_set(&c, "block_size", "4096", err, sizeof(err)), 0);
  assert_int_equal(cfg_set(&c, "num_kv_heads", "1024", err, sizeof(err)), 0);
  assert_int_equal(cfg_finish(&c, err, sizeof(err)), KVS_EINVAL);
}

/* The GPU pool's options: backend names, the device, the fraction's
 * bounds, and a fraction with the host backend refused. */
/* The tier options: sizes, the disk tier's file and size go together. */
static void test_tier_options(void **state) {
  char err[256];
  cfg c;

  (void)state;
  cfg_init(&c);
  assert_int_equal(c.host_tier_bytes, 0);
  assert_string_equal(c.disk_tier, "");
  assert_int_equal(c.tier_promote_max, 256);
  assert_int_equal(cfg_set(&c, "host-tier-bytes", "2G", err, sizeof(err)), 0);
  assert_int_equal(c.host_tier_bytes, 2ull << 30);
  assert_int_equal(cfg_set(&c, "tier_promote_max", "0", err, sizeof(err)),
                   KVS_EINVAL);
  assert_int_equal(cfg_set(&c, "disk_tier", "/var/cache/kvshare/tier", err,
                           sizeof(err)), 0);
  assert_int_equal(cfg_finish(&c, err, sizeof(err)), KVS_EINVAL);
  assert_non_null(strstr(err, "disk_tier_bytes"));
  assert_int_equal(cfg_set(&c, "disk_tier_bytes", "100G", err, sizeof(err)),
                   0);
  assert_int_equal(cfg_finish(&c, err, sizeof(err)), 0);
}

/* The reserve of demoted blocks the daemon gives the core, by hand-worked
 * cases: which of pool / 16, the 64 MiB floor, its quarter-of-the-pool cap,
 * the least 8 and the pool itself decides. */
static void test_tier_window(void **state) {
  char err[256];
  cfg c;
  static const struct {
    uint32_t blocks;
    uint64_t stride;
    uint32_t want;
  } disk[] = {
      {512, 64 << 10, 128},     /* floor 1024 blocks, capped at 512 / 4 */
      {8192, 64 << 10, 1024},   /* the floor: 8192 / 16 is only 512 */
      {65536, 64 << 10, 4096},  /* 65536 / 16 is past the floor */
      {30000, 2 << 20, 1875},   /* 2 MiB blocks: floor 32, / 16 wins */
      {64, 4 << 10, 16},        /* the cap */
      {20, 4 << 10, 8},         /* the cap (5) under the least 8 */
      {5, 4 << 10, 5},          /* never more than the pool */
      {1600, 128ull << 20, 100}, /* blocks past 64 MiB: no floor */
  };

  (void)state;
  cfg_init(&c);
  assert_int_equal(cfg_tier_window(&c, 512, 64 << 10), 0); /* no disk */
  assert_int_equal(cfg_set(&c, "host_tier_bytes", "1G", err, sizeof(err)),
                   0);
  assert_int_equal(cfg_tier_window(&c, 512, 64 << 10), 0); /* host only */
  assert_int_equal(cfg_set(&c, "disk_tier", "/tmp/t", err, sizeof(err)), 0);
  for (size_t i = 0; i < sizeof(disk) / sizeof(disk[0]); i++)
    assert_int_equal(cfg_tier_window(&c, disk[i].blocks, disk[i].stride),
                     disk[i].want);
  assert_int_equal(cfg_set(&c, "tier_window", "5", err, sizeof(err)), 0);
  assert_int_equal(cfg_tier_window(&c, 8192, 64 << 10), 5); /* as told */
}

static void test_gpu_options(void **state) {
  char err[256];
  cfg c;

  (void)state;
  cfg_init(&c);
  assert_string_equal(c.gpu, "");
  assert_true(c.gpu_memory_fraction == 0.0);
  assert_int_equal(c.gpu_reserve, 1ull << 30);
  assert_int_equal(c.gpu_chunk_size, 1ull << 30);
  assert_int_equal(cfg_set(&c, "backend", "cuda", err, sizeof(err)), 0);
  assert_int_equal(cfg_set(&c, "backend", "gpu", err, sizeof(err)),
                   KVS_EINVAL);
  assert_non_null(strstr(err, "auto|host|cuda"));
  assert_int_equal(cfg_set(&c, "gpu", "GPU-5354414e-4449-4e00-8000-000000000001",
                           err, sizeof(err)), 0);
  assert_int_equal(cfg_set(&c, "gpu-memory-fraction", "0.85", err,
                           sizeof(err)), 0);
  assert_true(c.gpu_memory_fraction > 0.8499 && c.gpu_memory_fraction < 0.8501);
  assert_int_equal(cfg_set(&c, "gpu_memory_fraction", "1", err, sizeof(err)),
                   0);
  assert_int_equal(cfg_set(&c, "gpu_memory_fraction", "1.01", err,
                           sizeof(err)), KVS_EINVAL);
  assert_int_equal(cfg_set(&c, "gpu_memory_fraction", "-0.5", err,
                           sizeof(err)), KVS_EINVAL);
  assert_int_equal(cfg_set(&c, "gpu_memory_fraction", "nan", err,
                           sizeof(err)), KVS_EINVAL);
  assert_int_equal(cfg_set(&c, "gpu_memory_fraction", "0.5x", err,
                           sizeof(err)), KVS_EINVAL);
  assert_int_equal(cfg_set(&c, "gpu_chunk_size", "512K", err, sizeof(err)),
                   KVS_EINVAL);
  assert_int_equal(cfg_set(&c, "gpu_chunk_size", "2G", err, sizeof(err)), 0);
  /* a fraction sizes a GPU pool: with cuda or auto it passes (the backend
   * sets the block count), with host it is refused */
  assert_int_equal(cfg_finish(&c, err, sizeof(err)), 0);
  assert_int_equal(cfg_set(&c, "backend", "host", err, sizeof(err)), 0);
  assert_int_equal(cfg_finish(&c, err, sizeof(err)), KVS_EINVAL);
  assert_non_null(strstr(err, "gpu_memory_fraction"));
  assert_int_equal(cfg_set(&c, "gpu_memory_fraction", "0", err, sizeof(err)),
                   0);
  assert_int_equal(cfg_finish(&c, err, sizeof(err)), 0);
}

static void test_peer_allowed(void **state) {
  char err[256];
  cfg c;

  (void)state;
  cfg_init(&c);
  assert_true(cfg_peer_allowed(&c, 0, 0, 1000));       /* root */
  assert_true(cfg_peer_allowed(&c, 1000, 5, 1000));    /* ourselves */
  assert_false(cfg_peer_allowed(&c, 1001, 5, 1000));
  assert_int_equal(cfg_set(&c, "allow_uids", "1001", err, sizeof(err)), 0);
  assert_int_equal(cfg_set(&c, "allow-gids", "77,78", err, sizeof(err)), 0);
  assert_true(cfg_peer_allowed(&c, 1001, 5, 1000));
  assert_true(cfg_peer_allowed(&c, 1002, 78, 1000));
  assert_false(cfg_peer_allowed(&c, 1002, 79, 1000));
}

static char *slurp(FILE *f) {
  size_t cap = 1 << 16, len = 0, n;
  char *buf = malloc(cap);

  assert_non_null(buf);
  while ((n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
    len += n;
    if (cap - len < 1024) {
      cap *= 2;
      buf = realloc(buf, cap);
      assert_non_null(buf);
    }
  }
  buf[len] = '\0';
  return buf;
}

static void test_example_config(void **state) {
  const char *path = "deploy/kvshared.conf";
  char err[256], *generated, *file, *mem = NULL;
  size_t memlen = 0;
  FILE *f, *m;
  cfg c, d;

  (void)state;
  f = fopen(path, "r");
  if (!f) {
    /* run from the source tree (make test); say so rather than pass */
    print_message("skip: %s not found from %s\n", path, getcwd(err, 256));
    skip();
  }
  file = slurp(f);
  fclose(f);

  /* It parses, and every value in it is the default. */
  cfg_init(&c);
  assert_int_equal(cfg_load_file(&c, path, err, sizeof(err)), 0);
  cfg_init(&d);
  assert_memory_equal(&c, &d, sizeof(c));

  /* Uncommented, it still parses and still gives the defaults. */
  {
    char *p, *text = strdup(file);

    assert_non_null(text);
    for (p = text; (p = strstr(p, "\n#")); p++)
      if (p[2] >= 'a' && p[2] <= 'z')
        p[1] = ' ';
    cfg_init(&c);
    assert_int_equal(cfg_load_string(&c, text, "uncommented", err,
                                     sizeof(err)),
                     0);
    assert_memory_equal(&c, &d, sizeof(c));
    free(text);
  }

  /* It is exactly what the option table generates. */
  m = open_memstream(&mem, &memlen);
  assert_non_null(m);
  cfg_print_example(m);
  fclose(m);
  generated = mem;
  if (strcmp(generated, file) != 0)
    fail_msg("%s is out of date: regenerate it with "
             "`kvshared --print-example-config > %s`",
             path, path);
  free(generated);
  free(file);
}

static void test_help_lists_every_option(void **state) {
  char *help = NULL, *example = NULL;
  size_t hl = 0, el = 0;
  FILE *m;
  const char *p;

  (void)state;
  m = open_memstream(&help, &hl);
  cfg_print_help(m, "kvshared");
  fclose(m);
  m = open_memstream(&example, &el);
  cfg_print_example(m);
  fclose(m);
  /* every "#key =" of the example is a "--key" in the help */
  for (p = example; (p = strstr(p, "\n#")); p++) {
    char key[64], flag[70];
    size_t n = strcspn(p + 2, " =\n");

    if (p[2] < 'a' || p[2] > 'z' || n >= sizeof(key) || p[2 + n] != ' ')
      continue;
    memcpy(key, p + 2, n);
    key[n] = '\0';
    for (char *k = key; *k; k++)
      if (*k == '_')
        *k = '-';
    snprintf(flag, sizeof(flag), "--%s ", key);
    if (!strstr(help, flag))
      fail_msg("--help does not list %s", flag);
  }
  free(help);
  free(example);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults),
      cmocka_unit_test(test_default_socket),
      cmocka_unit_test(test_file_syntax),
      cmocka_unit_test(test_file_errors),
      cmocka_unit_test(test_numbers_and_text),
      cmocka_unit_test(test_args),
      cmocka_unit_test(test_endpoints),
      cmocka_unit_test(test_finish),
      cmocka_unit_test(test_gpu_options),
      cmocka_unit_test(test_tier_options),
      cmocka_unit_test(test_tier_window),
      cmocka_unit_test(test_peer_allowed),
      cmocka_unit_test(test_example_config),
      cmocka_unit_test(test_help_lists_every_option),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
