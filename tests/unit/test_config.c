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
#include <sys/stat.h>
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
  expect_error("dtype = fp64\n", "fp32|fp16|bf16|int8|fp8");
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

/* ---- tenants ---- */

/* Loads text (a config file) into c, which must take it. */
static void load_ok(cfg *c, const char *text) {
  char err[256] = "";

  cfg_init(c);
  if (cfg_load_string(c, text, "t.conf", err, sizeof(err)) != 0)
    fail_msg("refused: %s", err);
}

/* Each share form, names resolved, fields in any order, a quoted value. */
static void test_tenant_parse(void **state) {
  char err[256];
  cfg c;

  (void)state;
  cfg_init(&c);
  assert_int_equal(c.ntenants, 0);
  load_ok(&c, "tenant = team-a uids=root,1000 gids=root share=12.5%\n"
              "tenant = \"b.2 blocks=100 gids=100,101\"\n"
              "tenant =   C_3   bytes=1M   uids=1001  \n"
              "tenant = d uids=1002 share=100%\n"
              "tenant = e gids=102\n");
  assert_int_equal(c.ntenants, 5);
  assert_string_equal(c.tenants[0].name, "team-a");
  assert_int_equal(c.tenants[0].uids.n, 2);
  assert_int_equal(c.tenants[0].uids.ids[0], 0); /* root */
  assert_int_equal(c.tenants[0].uids.ids[1], 1000);
  assert_int_equal(c.tenants[0].gids.n, 1);
  assert_int_equal(c.tenants[0].gids.ids[0], 0);
  assert_true(c.tenants[0].share_frac == 0.125);
  assert_int_equal(c.tenants[0].share_blocks, 0);
  assert_int_equal(c.tenants[0].share_bytes, 0);

  assert_string_equal(c.tenants[1].name, "b.2");
  assert_int_equal(c.tenants[1].uids.n, 0);
  assert_int_equal(c.tenants[1].gids.n, 2);
  assert_int_equal(c.tenants[1].gids.ids[1], 101);
  assert_int_equal(c.tenants[1].share_blocks, 100);
  assert_true(c.tenants[1].share_frac == 0);

  assert_string_equal(c.tenants[2].name, "C_3");
  assert_int_equal(c.tenants[2].share_bytes, 1u << 20);
  assert_int_equal(c.tenants[2].uids.ids[0], 1001);

  assert_true(c.tenants[3].share_frac == 1.0);

  /* no share: an equal part of what the others leave */
  assert_int_equal(c.tenants[4].share_blocks, 0);
  assert_int_equal(c.tenants[4].share_bytes, 0);
  assert_true(c.tenants[4].share_frac == 0);
  assert_int_equal(c.tenants[4].gids.ids[0], 102);

  /* cfg_set takes one, as a flag does; a name of 31 characters fits */
  cfg_init(&c);
  assert_int_equal(cfg_set(&c, "tenant", "abcdefghijabcdefghijabcdefghija "
                           "uids=5 share=0.5%", err, sizeof(err)), 0);
  assert_int_equal(c.ntenants, 1);
  assert_string_equal(c.tenants[0].name, "abcdefghijabcdefghijabcdefghija");
  assert_true(c.tenants[0].share_frac == 0.005);
  /* an empty value drops the tenants given before it */
  assert_int_equal(cfg_set(&c, "tenant", "", err, sizeof(err)), 0);
  assert_int_equal(c.ntenants, 0);
  assert_string_equal(c.tenants[0].name, "");
  assert_int_equal(cfg_set(&c, "tenant", "x uids=5", err, sizeof(err)), 0);
  assert_int_equal(c.ntenants, 1);
}

/* A tenant refused: KVS_EINVAL, the file and line, the tenant and what is
 * wrong; nothing of it kept. */
static void test_tenant_refusals(void **state) {
  static const struct {
    const char *text, *want;
  } bad[] = {
      {"tenant = a/b uids=1\n", "bad.conf:1: tenant: 'a/b' is not a "
       "tenant's name (the value starts with it: 1 to 31 characters of "
       "[A-Za-z0-9_.-])"},
      {"tenant = abcdefghijabcdefghijabcdefghijab uids=1\n",
       "'abcdefghijabcdefghijabcdefghijab' is not a tenant's name"},
      {"tenant = uids=1 share=5%\n", "'uids=1' is not a tenant's name"},
      {"tenant = a uids=1\ntenant = a uids=2\n",
       "bad.conf:2: tenant a: tenant a is declared twice"},
      {"tenant = a uids=1,no-such-user-kvs\n",
       "bad.conf:1: tenant a: unknown user 'no-such-user-kvs'"},
      {"tenant = a gids=no-such-group-kvs\n",
       "bad.conf:1: tenant a: unknown group 'no-such-group-kvs'"},
      {"tenant = a uids=99999999999\n", "tenant a: '99999999999' is not a "
       "numeric uid"},
      {"tenant = a uids=root\n\ntenant = b uids=7,0\n",
       "bad.conf:3: tenant b: uid 0 is in tenant a too"},
      {"tenant = a gids=5\ntenant = b gids=root uids=9\ntenant = c gids=5\n",
       "bad.conf:3: tenant c: gid 5 is in tenant a too"},
      {"tenant = a uids=5,5\n", "tenant a: uid 5 is listed twice"},
      {"tenant = a uids=0,root\n", "tenant a: uid 0 is listed twice"},
      {"tenant = a share=10%\n", "bad.conf:1: tenant a: lists no user and "
       "no group (give uids=, gids= or both)"},
      {"tenant = a\n", "tenant a: lists no user and no group"},
      {"tenant = a uids= gids=1\n", "tenant a: uids= lists no user"},
      {"tenant = a uids=1,,2\n", "tenant a: uids=1,,2 has an empty or "
       "overlong item"},
      {"tenant = a uids=1 uids=2\n", "tenant a: uids= given twice"},
      {"tenant = a uids=1 share=10% blocks=5\n", "tenant a: two shares; "
       "give one of share=, blocks= and bytes="},
      {"tenant = a uids=1 bytes=1M blocks=5\n", "tenant a: two shares"},
      {"tenant = a uids=1 share=10% share=20%\n", "tenant a: two shares"},
      {"tenant = a uids=1 share=0%\n", "tenant a: share '0%' is not a "
       "percent above 0 and at most 100 (as 25% or 12.5%)"},
      {"tenant = a uids=1 share=0.0%\n", "share '0.0%' is not a percent"},
      {"tenant = a uids=1 share=100.5%\n", "share '100.5%' is not a percent"},
      {"tenant = a uids=1 share=101%\n", "share '101%' is not a percent"},
      {"tenant = a uids=1 share=-5%\n", "share '-5%' is not a percent"},
      {"tenant = a uids=1 share=abc%\n", "share 'abc%' is not a percent"},
      {"tenant = a uids=1 share=nan%\n", "share 'nan%' is not a percent"},
      {"tenant = a uids=1 share=1e1%\n", "share '1e1%' is not a percent"},
      {"tenant = a uids=1 share=50\n", "share '50' is not a percent"},
      {"tenant = a uids=1 share=\n", "share '' is not a percent"},
      {"tenant = a uids=1 blocks=0\n", "tenant a: blocks '0' is not a number "
       "of blocks in [1, 67108864]"},
      {"tenant = a uids=1 blocks=x\n", "blocks 'x' is not a number"},
      {"tenant = a uids=1 bytes=0\n", "tenant a: bytes '0' is not a byte "
       "count in [1, 16T]"},
      {"tenant = a uids=1 bytes=1Q\n", "bytes '1Q' is not a byte count"},
      {"tenant = a uids=1 bytes=17T\n", "bytes '17T' is not a byte count"},
      {"tenant = a uids=1 quota=5\n", "bad.conf:1: tenant a: unknown field "
       "'quota=5' (uids=, gids=, share=, blocks= or bytes=)"},
      {"tenant = a uids=1 50%\n", "tenant a: unknown field '50%'"},
      {"tenant = a UIDS=1\n", "tenant a: unknown field 'UIDS=1'"},
  };
  char err[256];
  cfg c;

  (void)state;
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    cfg_init(&c);
    err[0] = '\0';
    if (cfg_load_string(&c, bad[i].text, "bad.conf", err, sizeof(err)) !=
        KVS_EINVAL)
      fail_msg("accepted: %s", bad[i].text);
    if (!strstr(err, bad[i].want))
      fail_msg("%s: error '%s' does not say '%s'", bad[i].text, err,
               bad[i].want);
    /* the refused tenant is not in the list */
    assert_true(c.ntenants <= 2);
    for (uint32_t t = 0; t < c.ntenants; t++)
      assert_true(strlen(c.tenants[t].name) == 1);
  }
  /* nothing of a refused tenant is kept */
  cfg_init(&c);
  assert_int_equal(cfg_set(&c, "tenant", "a uids=1", err, sizeof(err)), 0);
  assert_int_equal(cfg_set(&c, "tenant", "b uids=2 gids=1 share=0%", err,
                           sizeof(err)), KVS_EINVAL);
  assert_int_equal(cfg_set(&c, "tenant", "b uids=1", err, sizeof(err)),
                   KVS_EINVAL);
  assert_int_equal(c.ntenants, 1);
  assert_string_equal(c.tenants[1].name, "");
}

/* CFG_MAX_TENANTS tenants, CFG_MAX_IDS ids each way; one more refused. */
static void test_tenant_limits(void **state) {
  char err[256], text[4096], v[1024];
  size_t len = 0;
  cfg c;

  (void)state;
  for (int t = 0; t < CFG_MAX_TENANTS; t++)
    len += (size_t)snprintf(text + len, sizeof(text) - len,
                            "tenant = t%d uids=%d\n", t, 1000 + t);
  load_ok(&c, text);
  assert_int_equal(c.ntenants, CFG_MAX_TENANTS);
  assert_string_equal(c.tenants[CFG_MAX_TENANTS - 1].name, "t15");
  snprintf(text + len, sizeof(text) - len, "tenant = t16 uids=2000\n");
  cfg_init(&c);
  assert_int_equal(cfg_load_string(&c, text, "bad.conf", err, sizeof(err)),
                   KVS_EINVAL);
  assert_string_equal(err, "bad.conf:17: tenant t16: more than 16 tenants");

  for (int k = 0; k < 2; k++) {
    const char *key = k ? "gids" : "uids";

    len = (size_t)snprintf(v, sizeof(v), "a %s=", key);
    for (int i = 0; i < CFG_MAX_IDS; i++)
      len += (size_t)snprintf(v + len, sizeof(v) - len, "%s%d", i ? "," : "",
                              100 + i);
    cfg_init(&c);
    assert_int_equal(cfg_set(&c, "tenant", v, err, sizeof(err)), 0);
    assert_int_equal(k ? c.tenants[0].gids.n : c.tenants[0].uids.n,
                     CFG_MAX_IDS);
    snprintf(v + len, sizeof(v) - len, ",999");
    cfg_init(&c);
    assert_int_equal(cfg_set(&c, "tenant", v, err, sizeof(err)), KVS_EINVAL);
    assert_string_equal(err, k ? "tenant a: more than 32 gids"
                               : "tenant a: more than 32 uids");
    assert_int_equal(c.ntenants, 0);
  }
}

/* Flags add tenants to the file's, after them; an empty flag drops the
 * file's; a flag's error names the flag. */
static void test_tenant_args(void **state) {
  char err[256], path[] = "/tmp/kvs-test-config-XXXXXX";
  enum cfg_action act;
  cfg c;
  int fd;

  (void)state;
  fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_true(dprintf(fd, "tenant = a uids=1001\ntenant = b gids=77\n") > 0);
  close(fd);
  {
    char *argv[] = {"kvshared", "--tenant", "c uids=1003 blocks=8",
                    "--config", path, "--tenant=d uids=1004", NULL};

    cfg_init(&c);
    assert_int_equal(cfg_parse_args(&c, 6, argv, &act, err, sizeof(err)), 0);
    assert_int_equal(c.ntenants, 4);
    assert_string_equal(c.tenants[0].name, "a");
    assert_string_equal(c.tenants[1].name, "b");
    assert_string_equal(c.tenants[2].name, "c");
    assert_int_equal(c.tenants[2].share_blocks, 8);
    assert_string_equal(c.tenants[3].name, "d");
  }
  {
    char *argv[] = {"kvshared", "--config", path, "--tenant", "",
                    "--tenant", "e uids=1001", NULL};

    cfg_init(&c);
    assert_int_equal(cfg_parse_args(&c, 7, argv, &act, err, sizeof(err)), 0);
    assert_int_equal(c.ntenants, 1);
    assert_string_equal(c.tenants[0].name, "e");
  }
  {
    char *argv[] = {"kvshared", "--config", path, "--tenant",
                    "c uids=5 gids=77", NULL};

    cfg_init(&c);
    assert_int_equal(cfg_parse_args(&c, 5, argv, &act, err, sizeof(err)),
                     KVS_EINVAL);
    assert_string_equal(err, "--tenant c: gid 77 is in tenant b too (a gid "
                             "belongs to one tenant)");
  }
  {
    char *argv[] = {"kvshared", "--tenant", NULL};

    cfg_init(&c);
    assert_int_equal(cfg_parse_args(&c, 2, argv, &act, err, sizeof(err)),
                     KVS_EINVAL);
    assert_string_equal(err, "--tenant needs a value");
  }
  unlink(path);
}

/* cfg_finish: no allow lists beside tenants; shares over the pool refused
 * when its size is known, percents over 100% always. */
static void test_tenant_finish(void **state) {
  char err[256];
  cfg c;

  (void)state;
  load_ok(&c, "pool_blocks = 100\n"
              "tenant = a uids=1001 share=50%\n"
              "tenant = b uids=1002 blocks=30\n"
              "tenant = c gids=77\n");
  assert_int_equal(cfg_finish(&c, err, sizeof(err)), 0);

  load_ok(&c, "tenant = a uids=1001\nallow_uids = 1002\n");
  assert_int_equal(cfg_finish(&c, err, sizeof(err)), KVS_EINVAL);
  assert_string_equal(err, "allow_uids does not go with tenants: with "
                           "tenants, list the users in a tenant (uids=, "
                           "gids=)");
  load_ok(&c, "allow_gids = 5\ntenant = a uids=1001\n");
  assert_int_equal(cfg_finish(&c, err, sizeof(err)), KVS_EINVAL);
  assert_non_null(strstr(err, "allow_gids does not go with tenants"));

  /* blocks over the pool */
  load_ok(&c, "pool_blocks = 100\n"
              "tenant = a uids=1001 blocks=60\n"
              "tenant = b uids=1002 blocks=50\n");
  assert_int_equal(cfg_finish(&c, err, sizeof(err)), KVS_EINVAL);
  assert_string_equal(err, "the tenants' shares add up to 110 blocks; the "
                           "pool has 100");
  /* bytes and a percent over a pool given in bytes (16 blocks of 64K) */
  load_ok(&c, "pool_bytes = 1M\ndtype = fp16\n"
              "tenant = a uids=1001 bytes=640K\n"
              "tenant = b uids=1002 share=50%\n");
  assert_int_equal(cfg_finish(&c, err, sizeof(err)), KVS_EINVAL);
  assert_string_equal(err, "the tenants' shares add up to 18 blocks; the "
                           "pool has 16");
  /* too small a share */
  load_ok(&c, "pool_blocks = 100\ntenant = a uids=1001 blocks=3\n");
  assert_int_equal(cfg_finish(&c, err, sizeof(err)), KVS_EINVAL);
  assert_non_null(strstr(err, "tenant a: a share of 3 blocks is too small"));

  /* percents: over 100% whatever the pool */
  load_ok(&c, "backend = cuda\ngpu_memory_fraction = 0.5\n"
              "tenant = a uids=1001 share=60%\n"
              "tenant = b uids=1002 share=40.5%\n");
  assert_int_equal(cfg_finish(&c, err, sizeof(err)), KVS_EINVAL);
  assert_string_equal(err, "the tenants' shares add up to 100.5% of the "
                           "pool");
  /* with gpu_memory_fraction the pool's size is not known yet: blocks
   * pass here (cfg_tenant_blocks checks them once it is) */
  load_ok(&c, "backend = cuda\ngpu_memory_fraction = 0.5\npool_blocks = 10\n"
              "tenant = a uids=1001 blocks=60\n"
              "tenant = b uids=1002 share=60%\n");
  assert_int_equal(cfg_finish(&c, err, sizeof(err)), 0);
  /* 100% in all is the whole pool */
  load_ok(&c, "tenant = a uids=1001 share=60%\n"
              "tenant = b uids=1002 share=30%\n"
              "tenant = c uids=1003 share=10%\n");
  assert_int_equal(cfg_finish(&c, err, sizeof(err)), 0);

  /* A disk tier that is not a file: each tenant's would be PATH.NAME
   * beside it (/dev/nvme1n1.a on devtmpfs for a block device).  A file,
   * or a path not made yet, is the tenants' prefix. */
  load_ok(&c, "tenant = a uids=1001\ndisk_tier = /dev/null\n"
              "disk_tier_bytes = 1M\n");
  assert_int_equal(cfg_finish(&c, err, sizeof(err)), KVS_EINVAL);
  assert_string_equal(err, "disk_tier /dev/null is not a regular file: with "
                           "tenants each tenant's disk tier is a file of its "
                           "own (/dev/null.NAME); name a file on the disk "
                           "instead");
  load_ok(&c, "tenant = a uids=1001\ndisk_tier = /\ndisk_tier_bytes = 1M\n");
  assert_int_equal(cfg_finish(&c, err, sizeof(err)), KVS_EINVAL);
  assert_non_null(strstr(err, "disk_tier / is a folder"));
  load_ok(&c, "tenant = a uids=1001\ndisk_tier = /nonexistent/kvs.tier\n"
              "disk_tier_bytes = 1M\n");
  assert_int_equal(cfg_finish(&c, err, sizeof(err)), 0);
  {
    struct stat sb; /* a block device, where the machine has one */

    if (stat("/dev/loop0", &sb) == 0 && S_ISBLK(sb.st_mode)) {
      load_ok(&c, "tenant = a uids=1001\ndisk_tier = /dev/loop0\n"
                  "disk_tier_bytes = 1M\n");
      assert_int_equal(cfg_finish(&c, err, sizeof(err)), KVS_EINVAL);
      assert_non_null(strstr(err, "disk_tier /dev/loop0 is a block device, "
                                  "which cannot be split among tenants"));
    }
  }
  /* without tenants the tier's own checks apply (at open) */
  load_ok(&c, "disk_tier = /dev/null\ndisk_tier_bytes = 1M\n");
  assert_int_equal(cfg_finish(&c, err, sizeof(err)), 0);
}

/* --print-config prints one `tenant = ` line per tenant, ids as numbers,
 * and what it prints reads back to the same configuration. */
static void test_tenant_round_trip(void **state) {
  char err[256], *out = NULL, *out2 = NULL;
  size_t len = 0, len2 = 0;
  FILE *m;
  cfg c, d;

  (void)state;
  load_ok(&c, "pool_blocks = 1000\n"
              "tenant = team-a uids=root,1000 gids=root share=12.5%\n"
              "tenant = b gids=100,101 blocks=100\n"
              "tenant = c bytes=1M uids=1001\n"
              "tenant = d uids=1002 share=29%\n"
              "tenant = e uids=1003 share=33.333333333%\n"
              "tenant = f gids=102\n");
  assert_int_equal(cfg_finish(&c, err, sizeof(err)), 0);
  m = open_memstream(&out, &len);
  assert_non_null(m);
  cfg_print_values(m, &c);
  fclose(m);
  if (!strstr(out, "\ntenant = team-a uids=0,1000 gids=0 share=12.5%\n"
                   "tenant = b gids=100,101 blocks=100\n"
                   "tenant = c uids=1001 bytes=1M\n"
                   "tenant = d uids=1002 share=29%\n"
                   "tenant = e uids=1003 share=33.333333333%\n"
                   "tenant = f gids=102\n"))
    fail_msg("the tenants as printed:\n%s", out);

  cfg_init(&d);
  assert_int_equal(cfg_load_string(&d, out, "printed", err, sizeof(err)), 0);
  assert_int_equal(cfg_finish(&d, err, sizeof(err)), 0);
  assert_int_equal(d.ntenants, 6);
  assert_memory_equal(d.tenants, c.tenants, sizeof(c.tenants));
  assert_memory_equal(&d, &c, sizeof(c));
  m = open_memstream(&out2, &len2);
  assert_non_null(m);
  cfg_print_values(m, &d);
  fclose(m);
  assert_string_equal(out2, out);
  free(out2);
  free(out);

  /* no tenants: an empty value, which reads back as none */
  out = NULL;
  cfg_init(&c);
  m = open_memstream(&out, &len);
  assert_non_null(m);
  cfg_print_values(m, &c);
  fclose(m);
  assert_non_null(strstr(out, "\ntenant = \n"));
  load_ok(&d, out);
  assert_int_equal(d.ntenants, 0);
  free(out);
}

/* A peer's tenant: its uid's, else its gid's; -1 when none. */
static void test_tenant_of(void **state) {
  cfg c;

  (void)state;
  cfg_init(&c);
  assert_int_equal(cfg_tenant_of(&c, 1000, 100), -1); /* no tenants */
  load_ok(&c, "tenant = a gids=100,101\n"
              "tenant = b uids=1000,1001\n"
              "tenant = c uids=1002 gids=102\n");
  assert_int_equal(cfg_tenant_of(&c, 1000, 100), 1); /* uid beats gid */
  assert_int_equal(cfg_tenant_of(&c, 1002, 101), 2);
  assert_int_equal(cfg_tenant_of(&c, 1001, 5), 1);
  assert_int_equal(cfg_tenant_of(&c, 2000, 101), 0);  /* by gid */
  assert_int_equal(cfg_tenant_of(&c, 2000, 102), 2);
  assert_int_equal(cfg_tenant_of(&c, 2000, 103), -1); /* none */
  assert_int_equal(cfg_tenant_of(&c, 0, 0), -1);
}

/* Shares in blocks: blocks=, bytes= rounded down, percents rounded down,
 * the rest split equally; too much or too little refused. */
static void test_tenant_blocks(void **state) {
  uint32_t b[CFG_MAX_TENANTS];
  char err[256];
  cfg c;

  (void)state;
  cfg_init(&c);
  assert_int_equal(cfg_tenant_blocks(&c, 1000, 4096, b, err, sizeof(err)),
                   0); /* no tenants, nothing to split */

  load_ok(&c, "tenant = a uids=1 blocks=100\n"
              "tenant = b uids=2 bytes=402K\n" /* 100.5 blocks */
              "tenant = c uids=3 share=25%\n"
              "tenant = d uids=4\n"
              "tenant = e uids=5\n");
  memset(b, 0xff, sizeof(b));
  assert_int_equal(cfg_tenant_blocks(&c, 1000, 4096, b, err, sizeof(err)),
                   0);
  assert_int_equal(b[0], 100);
  assert_int_equal(b[1], 100);
  assert_int_equal(b[2], 250);
  assert_int_equal(b[3], 275); /* (1000 - 450) / 2 */
  assert_int_equal(b[4], 275);
  /* the remainder of the split stays unused */
  assert_int_equal(cfg_tenant_blocks(&c, 1001, 4096, b, err, sizeof(err)),
                   0);
  assert_int_equal(b[2], 250);
  assert_int_equal(b[3], 275);

  /* percents of the pool, rounded down, never below their decimal value */
  load_ok(&c, "tenant = a uids=1 share=29%\n"
              "tenant = b uids=2 share=57%\n"
              "tenant = c uids=3 share=14%\n");
  assert_int_equal(cfg_tenant_blocks(&c, 100, 4096, b, err, sizeof(err)), 0);
  assert_int_equal(b[0], 29);
  assert_int_equal(b[1], 57);
  assert_int_equal(b[2], 14);
  assert_int_equal(cfg_tenant_blocks(&c, 1001, 4096, b, err, sizeof(err)),
                   0);
  assert_int_equal(b[0], 290); /* 290.29 */
  assert_int_equal(b[1], 570); /* 570.57 */
  assert_int_equal(b[2], 140);

  /* over the pool */
  load_ok(&c, "tenant = a uids=1 blocks=600\n"
              "tenant = b uids=2 share=50%\n");
  assert_int_equal(cfg_tenant_blocks(&c, 1000, 4096, b, err, sizeof(err)),
                   KVS_EINVAL);
  assert_string_equal(err, "the tenants' shares add up to 1100 blocks; the "
                           "pool has 1000");
  assert_int_equal(cfg_tenant_blocks(&c, 1200, 4096, b, err, sizeof(err)),
                   0);
  assert_int_equal(b[1], 600);
  /* huge shares add up without wrapping (2 x 2^63 is 0 in 64 bits) */
  cfg_init(&c);
  c.ntenants = 2;
  for (int t = 0; t < 2; t++) {
    snprintf(c.tenants[t].name, sizeof(c.tenants[t].name), "t%d", t);
    c.tenants[t].uids.n = 1;
    c.tenants[t].uids.ids[0] = (uint32_t)t + 1;
    c.tenants[t].share_bytes = 1ull << 63;
  }
  assert_int_equal(cfg_tenant_blocks(&c, 1000, 1, b, err, sizeof(err)),
                   KVS_EINVAL);
  assert_non_null(strstr(err, "the pool has 1000"));

  /* the tenants without a share get too little */
  load_ok(&c, "tenant = a uids=1 blocks=993\n"
              "tenant = b uids=2\n"
              "tenant = c uids=3\n");
  assert_int_equal(cfg_tenant_blocks(&c, 1000, 4096, b, err, sizeof(err)),
                   KVS_EINVAL);
  assert_string_equal(err, "the tenants' shares leave 7 of the pool's 1000 "
                           "blocks to the 2 without one: 3 each, too few (a "
                           "tenant needs at least 4, and more than "
                           "reserve_blocks 0)");
  assert_int_equal(cfg_tenant_blocks(&c, 1001, 4096, b, err, sizeof(err)),
                   0);
  assert_int_equal(b[1], 4);
  /* a share too small: under CFG_TENANT_MIN_BLOCKS, or not past the
   * reserve; bytes under a block are none */
  load_ok(&c, "tenant = a uids=1 bytes=16K\ntenant = b uids=2\n");
  assert_int_equal(cfg_tenant_blocks(&c, 1000, 4096, b, err, sizeof(err)),
                   0);
  assert_int_equal(b[0], CFG_TENANT_MIN_BLOCKS);
  assert_int_equal(b[1], 996);
  assert_int_equal(cfg_tenant_blocks(&c, 1000, 4097, b, err, sizeof(err)),
                   KVS_EINVAL);
  assert_string_equal(err, "tenant a: a share of 3 blocks is too small (a "
                           "tenant needs at least 4, and more than "
                           "reserve_blocks 0)");
  assert_int_equal(cfg_tenant_blocks(&c, 1000, 32 << 10, b, err,
                                     sizeof(err)), KVS_EINVAL);
  assert_non_null(strstr(err, "tenant a: a share of 0 blocks"));
  assert_int_equal(cfg_set(&c, "reserve_blocks", "4", err, sizeof(err)), 0);
  assert_int_equal(cfg_tenant_blocks(&c, 1000, 4096, b, err, sizeof(err)),
                   KVS_EINVAL);
  assert_string_equal(err, "tenant a: a share of 4 blocks is too small (a "
                           "tenant needs at least 5, and more than "
                           "reserve_blocks 4)");
  assert_int_equal(cfg_tenant_blocks(&c, 1000, 3276, b, err, sizeof(err)),
                   0); /* 16384 / 3276: 5 */
  assert_int_equal(b[0], 5);
  load_ok(&c, "tenant = a uids=1 share=1%\n");
  assert_int_equal(cfg_tenant_blocks(&c, 399, 4096, b, err, sizeof(err)),
                   KVS_EINVAL);
  assert_non_null(strstr(err, "a share of 3 blocks is too small"));
}

/* With tenants, only their peers are admitted, and root and the daemon's
 * own uid; the allow lists no longer count. */
static void test_peer_allowed_tenants(void **state) {
  cfg c;

  (void)state;
  load_ok(&c, "tenant = a uids=1001\ntenant = b gids=77\n");
  assert_true(cfg_peer_allowed(&c, 0, 0, 1000));      /* root */
  assert_true(cfg_peer_allowed(&c, 1000, 5, 1000));   /* ourselves */
  assert_true(cfg_peer_allowed(&c, 1001, 5, 1000));   /* a's uid */
  assert_true(cfg_peer_allowed(&c, 1002, 77, 1000));  /* b's gid */
  assert_false(cfg_peer_allowed(&c, 1002, 78, 1000)); /* in no tenant */
  assert_false(cfg_peer_allowed(&c, 65534, 65534, 1000));
  /* root and the daemon are in no tenant: they only observe */
  assert_int_equal(cfg_tenant_of(&c, 0, 0), -1);
  assert_int_equal(cfg_tenant_of(&c, 1000, 5), -1);
  /* allow lists beside tenants (cfg_finish refuses them) admit no one */
  c.allow_uids.n = 1;
  c.allow_uids.ids[0] = 1003;
  c.allow_gids.n = 1;
  c.allow_gids.ids[0] = 78;
  assert_false(cfg_peer_allowed(&c, 1003, 5, 1000));
  assert_false(cfg_peer_allowed(&c, 1002, 78, 1000));
}

/* --help and the example config describe the option. */
static void test_tenant_help(void **state) {
  char *help = NULL, *example = NULL;
  size_t hl = 0, el = 0;
  FILE *m;

  (void)state;
  m = open_memstream(&help, &hl);
  cfg_print_help(m, "kvshared");
  fclose(m);
  m = open_memstream(&example, &el);
  cfg_print_example(m);
  fclose(m);
  assert_non_null(strstr(help, "\nTenants:\n  --tenant 'NAME [uids=U,...] "
                               "[gids=G,...] [share=P%|blocks=N|bytes=SIZE]'"
                               "\n"));
  assert_non_null(strstr(help, "--tenant adds to the file's tenants"));
  assert_non_null(strstr(help, "may only observe"));
  assert_non_null(strstr(example, "\n# ---- Tenants ----\n"));
  assert_non_null(strstr(example, "\n#tenant =\n"));
  free(help);
  free(example);
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
      cmocka_unit_test(test_tenant_parse),
      cmocka_unit_test(test_tenant_refusals),
      cmocka_unit_test(test_tenant_limits),
      cmocka_unit_test(test_tenant_args),
      cmocka_unit_test(test_tenant_finish),
      cmocka_unit_test(test_tenant_round_trip),
      cmocka_unit_test(test_tenant_of),
      cmocka_unit_test(test_tenant_blocks),
      cmocka_unit_test(test_peer_allowed_tenants),
      cmocka_unit_test(test_tenant_help),
      cmocka_unit_test(test_example_config),
      cmocka_unit_test(test_help_lists_every_option),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
