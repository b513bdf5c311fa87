/*
 * test_tenants — tenants are partitions: a worker of one tenant cannot
 * read or write one byte of another's KV memory, nor hit its prompts, nor
 * take its share of the pool or of a tier.
 *
 * Runs as root (it starts workers as other uids): a daemon with tenants a
 * (uid 40001, 64 blocks) and b (uid 40002, 128 blocks) on a 256-block pool
 * (64 left unused), a host and a disk tier.  Workers are forked children
 * that drop to their tenant's uid, as an attacker's worker would run:
 *  - observers and strangers: root without no_map is refused, with no_map
 *    it may only run Stats and Ping, and sees every partition; uid 40003
 *    (no tenant) is refused; a tenant at its max_tenant_connections is
 *    refused one more, and the other tenant still connects; a tenant's
 *    sessions share its token budget (max_tenant_tokens), the other's is
 *    its own;
 *  - memory: a worker maps its own partition only (/proc/self/maps holds
 *    one pool mapping of its partition's size; on the stand-in CUDA driver,
 *    only its partition's chunks), cannot open the daemon's descriptors or
 *    memory through /proc, and gets no address for a block id past its
 *    partition;
 *  - index: b's lookup of a's prompt misses; b writes the same prompt with
 *    its own bytes, and a later reads back its own bytes, unchanged;
 *  - traffic: b's Stats counts its own sessions, frames and protocol
 *    errors, never the daemon's (they would tell b when a works);
 *  - quotas: a churns through twice its share (evictions in a), and a
 *    request over its share fails with ENOSPC; b's cached prompt still
 *    hits with b's bytes, b evicted nothing, and b's host tier is b's size
 *    (its disk tier's staging buffers as many as its slots);
 *  - kill -9 of a's worker and SIGTERM of b's, each holding blocks: each
 *    partition gets its blocks back;
 *  - the invariant check of every partition; no leak; the daemon's stop.
 * Then persisted disk tiers: after a restart each tenant hits its own
 * prompts with its own bytes; with the tenants' files swapped nothing is
 * restored and nothing hits (their slots commit to the other tenant).
 * Then the same on the stand-in CUDA driver (each partition its own VMM
 * chunks), ending with SIGTERM of the daemon under a worker's load.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/integration/itest.h"

#define UID_A 40001
#define UID_B 40002
#define UID_NONE 40003
#define BLOCKS_A 64
#define BLOCKS_B 128
#define BS 16
#define PLEN (3 * BS + 5) /* 3 full blocks and a partial one */
#define HOST_TIER (1u << 20)

static itest_daemon d;
static int cuda;
static char disk_dir[64];

static void prompt(uint32_t *tok, uint32_t n, uint32_t seed) {
  for (uint32_t i = 0; i < n; i++)
    tok[i] = seed * 100003u + i * 7u + 1;
}

/* This process becomes uid (its group: the same number). */
static void become(uid_t uid) {
  CHECK(setgroups(0, NULL) == 0);
  CHECK(setresgid(uid, uid, uid) == 0);
  CHECK(setresuid(uid, uid, uid) == 0);
}

static int try_connect(const char *name, int no_map, kvs_client **c) {
  kvs_connect_opts o = {name, 30000, no_map};
  *c = NULL;
  return kvs_connect(d.socket, &o, c);
}

static kvs_client *connect_as(const char *name) {
  kvs_client *c;
  int rc = try_connect(name, 0, &c);
  if (rc) {
    fprintf(stderr, "%s: kvs_connect: %s: %s\n", name, kvs_status_name(rc),
            kvs_last_message(NULL));
    exit(1);
  }
  return c;
}

/* Runs fn(arg) in a child as uid; returns the child's pid. */
static pid_t spawn(uid_t uid, int (*fn)(void *), void *arg) {
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    become(uid);
    _exit(fn(arg));
  }
  return pid;
}

static void run_as(uid_t uid, int (*fn)(void *), void *arg) {
  CHECK(itest_reap(spawn(uid, fn, arg), 0) == 0);
}

/* ---- what a worker may see of memory -------------------------------------- */

/* Bytes of this process's mappings whose name holds `what`. */
static uint64_t mapped_bytes(const char *what, int *count) {
  FILE *f = fopen("/proc/self/maps", "r");
  char line[512];
  uint64_t sum = 0;
  *count = 0;
  CHECK(f);
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    if (strstr(line, what) && sscanf(line, "%lx-%lx", &lo, &hi) == 2) {
      sum += hi - lo;
      (*count)++;
    }
  }
  fclose(f);
  return sum;
}

/* The daemon's descriptors and memory through /proc: none opens. */
static void check_no_proc_access(void) {
  char path[64], fdp[384];
  snprintf(path, sizeof path, "/proc/%d/fd", (int)d.pid);
  DIR *dir = opendir(path);
  if (dir) { /* (listing may be refused already) */
    struct dirent *e;
    while ((e = readdir(dir))) {
      if (e->d_name[0] == '.')
        continue;
      snprintf(fdp, sizeof fdp, "%s/%s", path, e->d_name);
      int fd = open(fdp, O_RDONLY);
      if (fd >= 0) {
        fprintf(stderr, "opened the daemon's %s\n", fdp);
        exit(1);
      }
    }
    closedir(dir);
  }
  snprintf(path, sizeof path, "/proc/%d/mem", (int)d.pid);
  CHECK(open(path, O_RDONLY) < 0);
  snprintf(path, sizeof path, "/proc/%d/map_files", (int)d.pid);
  dir = opendir(path);
  if (dir) {
    struct dirent *e;
    while ((e = readdir(dir))) {
      if (e->d_name[0] == '.')
        continue;
      snprintf(fdp, sizeof fdp, "%s/%s", path, e->d_name);
      CHECK(open(fdp, O_RDONLY) < 0);
    }
    closedir(dir);
  }
}

/* The worker's pool is its partition, and nothing else is mapped. */
static void check_mapping(kvs_client *c, uint32_t blocks) {
  const kvs_layout *l = kvs_layout_of(c);
  uint64_t want = (uint64_t)blocks * l->block_stride;
  int n;
  CHECK(l->num_blocks == blocks);
  CHECK(kvs_block_ptr(c, blocks - 1) != NULL);
  CHECK(kvs_block_ptr(c, blocks) == NULL);
  CHECK(kvs_block_ptr(c, BLOCKS_A + BLOCKS_B) == NULL);
  CHECK(kvs_plane_ptr(c, blocks, 0, 0) == NULL);
  if (!cuda) {
    uint64_t got = mapped_bytes("kvshare-pool", &n);
    CHECK(kvs_pool_size(c) == want);
    if (n != 1 || got != want) {
      fprintf(stderr, "%d pool mappings of %llu bytes; the partition is "
              "%llu\n", n, (unsigned long long)got,
              (unsigned long long)want);
      exit(1);
    }
  } else {
    /* Its own chunks (2 MiB each), none of another partition's. */
    uint64_t chunks = (want + (2u << 20) - 1) / (2u << 20);
    uint64_t got = mapped_bytes("kvs-standin:", &n);
    if ((uint64_t)n != chunks || got != chunks * (2u << 20)) {
      fprintf(stderr, "%d stand-in mappings of %llu bytes; the partition "
              "has %llu chunks\n", n, (unsigned long long)got,
              (unsigned long long)chunks);
      exit(1);
    }
  }
  check_no_proc_access();
}

/* ---- worker roles ---------------------------------------------------------- */

/* Writes prompt seed with the bytes of key, commits, frees. */
static void write_prompt(kvs_client *c, uint32_t seed, uint64_t key) {
  uint32_t tok[PLEN];
  kvs_lookup_result lr;
  kvs_alloc_result ar;
  prompt(tok, PLEN, seed);
  CHECK_OK(c, kvs_lookup(c, 1, tok, PLEN, NULL, 0, &lr));
  CHECK(lr.hit_tokens == 0);
  CHECK_OK(c, kvs_allocate(c, 1, PLEN, &ar));
  for (uint32_t i = 0; i < ar.num_blocks; i++)
    itest_block_bytes(c, ar.blocks[i], key, i, 0);
  CHECK_OK(c, kvs_commit(c, 1, 0, tok, PLEN, NULL, 0, NULL));
  CHECK_OK(c, kvs_free(c, 1));
}

/* Looks prompt seed up: a full hit with the bytes of key. */
static void read_prompt(kvs_client *c, uint32_t seed, uint64_t key) {
  uint32_t tok[PLEN];
  kvs_lookup_result lr;
  prompt(tok, PLEN, seed);
  CHECK_OK(c, kvs_lookup(c, 2, tok, PLEN, NULL, 0, &lr));
  CHECK(lr.hit_tokens == (PLEN / BS) * BS);
  for (uint32_t i = 0; i < lr.num_blocks; i++) {
    long bad = itest_block_bytes(c, lr.blocks[i], key, i, 1);
    if (bad) {
      fprintf(stderr, "prompt %u block %u (pool block %u): %ld wrong "
              "bytes\n", seed, i, lr.blocks[i], bad);
      exit(1);
    }
  }
  CHECK_OK(c, kvs_free(c, 2));
}

static int a_first(void *arg) {
  (void)arg;
  kvs_client *c = connect_as("tenant-a");
  check_mapping(c, BLOCKS_A);
  write_prompt(c, 1, 0xA);
  kvs_close(c);
  return 0;
}

static int b_first(void *arg) {
  (void)arg;
  kvs_client *c = connect_as("tenant-b");
  uint32_t tok[PLEN];
  kvs_lookup_result lr;
  kvs_stats st;
  /* Its own traffic only: its one session (not the observer's), its own
   * frames (Hello and this Stats, none of a's), no protocol error (the
   * stranger's refusal is not b's). */
  CHECK_OK(c, kvs_stats_get(c, 0, &st));
  CHECK(st.sessions == 1);
  CHECK(st.frames_in == 2);
  CHECK(st.protocol_errors == 0);
  check_mapping(c, BLOCKS_B);
  /* a's prompt, word for word: a miss. */
  prompt(tok, PLEN, 1);
  CHECK_OK(c, kvs_lookup(c, 1, tok, PLEN, NULL, 0, &lr));
  CHECK(lr.hit_tokens == 0);
  CHECK_OK(c, kvs_free(c, 1));
  write_prompt(c, 1, 0xB);
  read_prompt(c, 1, 0xB);
  CHECK_OK(c, kvs_stats_get(c, 0, &st));
  CHECK(st.num_blocks == BLOCKS_B);
  kvs_close(c);
  return 0;
}

static int a_again(void *arg) {
  (void)arg;
  kvs_client *c = connect_as("tenant-a");
  read_prompt(c, 1, 0xA); /* a's bytes, not b's */
  kvs_close(c);
  return 0;
}

/* a churns through twice its share, then asks for more than its share. */
static int a_pressure(void *arg) {
  (void)arg;
  kvs_client *c = connect_as("tenant-a");
  kvs_alloc_result ar;
  kvs_stats st;
  for (uint32_t p = 100; p < 100 + 2 * BLOCKS_A / 4 + 4; p++)
    write_prompt(c, p, p);
  CHECK_OK(c, kvs_stats_get(c, 0, &st));
  CHECK(st.num_blocks == BLOCKS_A);
  CHECK(st.evictions > 0);
  /* Most of its share in use, then more than what is left: ENOSPC (its
   * cached blocks evicted first), never a block of b's. */
  uint32_t tok[1] = {5};
  kvs_lookup_result lr;
  CHECK_OK(c, kvs_lookup(c, 9, tok, 1, NULL, 0, &lr));
  CHECK_OK(c, kvs_allocate(c, 9, BLOCKS_A / 2 * BS, &ar));
  CHECK_OK(c, kvs_lookup(c, 10, tok, 1, NULL, 0, &lr));
  CHECK_RC(c, kvs_allocate(c, 10, (BLOCKS_A / 2 + 8) * BS, &ar), KVS_ENOSPC);
  CHECK_OK(c, kvs_free(c, 10));
  CHECK_OK(c, kvs_free(c, 9));
  kvs_close(c);
  return 0;
}

static int b_after_pressure(void *arg) {
  (void)arg;
  kvs_client *c = connect_as("tenant-b");
  kvs_stats st;
  kvs_tier_stats ts[4];
  uint32_t nt = 0;
  read_prompt(c, 1, 0xB);
  CHECK_OK(c, kvs_stats_get(c, 0, &st));
  CHECK(st.num_blocks == BLOCKS_B);
  CHECK(st.evictions == 0);
  CHECK_OK(c, kvs_tier_stats_get(c, ts, 4, &nt, NULL));
  CHECK(nt == 2);
  CHECK(strcmp(ts[0].name, "host") == 0);
  /* Its share of the host tier (half the pool's worth), untouched. */
  CHECK(ts[0].slots == (HOST_TIER / 2) / kvs_layout_of(c)->block_stride);
  CHECK(ts[0].drops == 0);
  CHECK(strcmp(ts[1].name, "disk") == 0);
  CHECK(ts[1].drops == 0);
  kvs_close(c);
  return 0;
}

/* Holds n blocks, says so on fd, waits to be killed. */
static _Noreturn int holder(int fd, uint32_t n, const char *name) {
  kvs_client *c = connect_as(name);
  uint32_t tok[1] = {77};
  kvs_lookup_result lr;
  kvs_alloc_result ar;
  CHECK_OK(c, kvs_lookup(c, 1, tok, 1, NULL, 0, &lr));
  CHECK_OK(c, kvs_allocate(c, 1, n * BS, &ar));
  CHECK(write(fd, "r", 1) == 1);
  for (;;)
    pause();
}

static int hold_fd;
static int a_holder(void *arg) { return holder(hold_fd, *(uint32_t *)arg, "a-holder"); }
static int b_holder(void *arg) { return holder(hold_fd, *(uint32_t *)arg, "b-holder"); }

static int b_connects(void *arg) {
  (void)arg;
  kvs_close(connect_as("b-while-a-is-full"));
  return 0;
}

static int stranger(void *arg) {
  (void)arg;
  kvs_client *c;
  int rc = try_connect("stranger", 0, &c);
  if (rc != KVS_EPERM) {
    fprintf(stderr, "uid %d, in no tenant, connected: %s\n", UID_NONE,
            kvs_status_name(rc));
    exit(1);
  }
  rc = try_connect("stranger", 1, &c);
  CHECK(rc == KVS_EPERM);
  return 0;
}

/* a opens its max_tenant_connections (3) and is refused a fourth; it
 * holds the three until told (the test connects b meanwhile). */
static int limit_ready[2], limit_go[2];
static int a_conn_limit(void *arg) {
  kvs_client *cs[3], *extra;
  char ch;
  (void)arg;
  for (int i = 0; i < 3; i++)
    cs[i] = connect_as("a-many");
  int rc = try_connect("a-many", 0, &extra);
  if (rc != KVS_ELIMIT ||
      !strstr(kvs_last_message(NULL), "too many connections of tenant a")) {
    fprintf(stderr, "a's fourth session: %s (%s)\n", kvs_status_name(rc),
            kvs_last_message(NULL));
    exit(1);
  }
  CHECK(write(limit_ready[1], "r", 1) == 1);
  CHECK(read(limit_go[0], &ch, 1) == 1);
  for (int i = 0; i < 3; i++)
    kvs_close(cs[i]);
  return 0;
}

/* Two sessions of b share its token budget (max_tenant_tokens 1500; b,
 * whose share is 128 blocks, so that the 63 blocks asked for never wait
 * on blocks still being demoted); a's budget is its own. */
static int b_shared_budget(void *arg) {
  kvs_client *c1 = connect_as("b-budget-1"), *c2 = connect_as("b-budget-2");
  uint32_t tok[1] = {9};
  kvs_lookup_result lr;
  kvs_alloc_result ar;
  (void)arg;
  CHECK_OK(c1, kvs_lookup(c1, 1, tok, 1, NULL, 0, &lr));
  CHECK_OK(c1, kvs_allocate(c1, 1, 1000, &ar));
  CHECK_OK(c2, kvs_lookup(c2, 1, tok, 1, NULL, 0, &lr));
  CHECK_RC(c2, kvs_allocate(c2, 1, 600, &ar), KVS_ELIMIT);
  CHECK(strstr(kvs_last_message(c2), "max_tenant_tokens"));
  CHECK_OK(c1, kvs_free(c1, 1));
  CHECK_OK(c2, kvs_allocate(c2, 1, 600, &ar));
  CHECK_OK(c2, kvs_free(c2, 1));
  kvs_close(c1);
  kvs_close(c2);
  return 0;
}

static int a_own_budget(void *arg) {
  kvs_client *c = connect_as("a-budget");
  uint32_t tok[1] = {9};
  kvs_lookup_result lr;
  kvs_alloc_result ar;
  (void)arg;
  CHECK_OK(c, kvs_lookup(c, 1, tok, 1, NULL, 0, &lr));
  CHECK_OK(c, kvs_allocate(c, 1, 700, &ar));
  CHECK_OK(c, kvs_lookup(c, 2, tok, 1, NULL, 0, &lr));
  CHECK_RC(c, kvs_allocate(c, 2, 900, &ar), KVS_ELIMIT);
  CHECK(strstr(kvs_last_message(c), "tenant a would hold"));
  CHECK_OK(c, kvs_free(c, 2));
  CHECK_OK(c, kvs_free(c, 1));
  kvs_close(c);
  return 0;
}

/* A worker of a that loops until it is killed (the daemon's SIGTERM). */
static _Noreturn int a_busy(void *arg) {
  (void)arg;
  kvs_client *c = connect_as("a-busy");
  for (uint32_t p = 1000;; p++) {
    uint32_t tok[PLEN];
    kvs_lookup_result lr;
    kvs_alloc_result ar;
    prompt(tok, PLEN, p);
    if (kvs_lookup(c, 1, tok, PLEN, NULL, 0, &lr) ||
        kvs_allocate(c, 1, PLEN, &ar) ||
        kvs_commit(c, 1, 0, tok, PLEN, NULL, 0, NULL) || kvs_free(c, 1))
      break;
  }
  for (;;)
    pause();
}

/* ---- the observer ----------------------------------------------------------- */

static kvs_client *observer(void) {
  kvs_client *c;
  int rc = try_connect("observer", 0, &c);
  /* root is in no tenant: mapping is refused, with the reason. */
  if (rc != KVS_EPERM ||
      !strstr(kvs_last_message(NULL), "belongs to no tenant")) {
    fprintf(stderr, "root connected with a mapping: %s (%s)\n",
            kvs_status_name(rc), kvs_last_message(NULL));
    exit(1);
  }
  CHECK_OK(NULL, try_connect("observer", 1, &c));
  CHECK(kvs_pool_base(c) == NULL);
  return c;
}

static void wait_used(kvs_client *obs, uint32_t used) {
  kvs_stats st;
  double t0 = itest_now();
  for (;;) {
    CHECK_OK(obs, kvs_stats_get(obs, 0, &st));
    if (st.used_blocks == used)
      return;
    if (itest_now() - t0 > 20) {
      fprintf(stderr, "used blocks %u, wanted %u\n", st.used_blocks, used);
      exit(1);
    }
    usleep(5000);
  }
}

static void scenario(void) {
  char disk[128], path[160], blocks_a[64], blocks_b[64], host[32];
  struct stat sb;
  snprintf(disk_dir, sizeof disk_dir, "/tmp/kvs-tenants-XXXXXX");
  CHECK(mkdtemp(disk_dir) != NULL);
  snprintf(disk, sizeof disk, "%s/disk", disk_dir);
  snprintf(host, sizeof host, "%u", HOST_TIER);
  snprintf(blocks_a, sizeof blocks_a, "a uids=%d blocks=%d", UID_A, BLOCKS_A);
  snprintf(blocks_b, sizeof blocks_b, "b uids=%d blocks=%d", UID_B, BLOCKS_B);
  const char *args[] = {"--pool-blocks", "256", "--block-size", "16",
                        "--num-layers", "2", "--num-kv-heads", "2",
                        "--head-dim", "16", "--dtype", "fp16",
                        "--tenant", blocks_a, "--tenant", blocks_b,
                        "--host-tier-bytes", host, "--disk-tier", disk,
                        "--disk-tier-bytes", "2M",
                        "--backend", cuda ? "cuda" : "host",
                        "--gpu-chunk-size", "2M",
                        "--max-tenant-connections", "3",
                        "--max-tenant-tokens", "1500", NULL};
  itest_daemon_start(&d, args);
  CHECK(chmod(d.dir, 0755) == 0);
  CHECK(chmod(d.socket, 0666) == 0);
  /* A disk file per tenant, none shared. */
  CHECK(stat(disk, &sb) < 0 && errno == ENOENT);
  snprintf(path, sizeof path, "%s.a", disk);
  CHECK(stat(path, &sb) == 0);
  snprintf(path, sizeof path, "%s.b", disk);
  CHECK(stat(path, &sb) == 0);
  {
    /* Staging buffers for b's 128 slots, not the 512 of a whole pool's
     * tier: every partition has its own. */
    char line[256];
    snprintf(line, sizeof line, "disk tier: %s, 128 slots, 128 staging "
             "buffers", path);
    CHECK(itest_log_says(&d, line));
  }
  int my_fds = itest_fd_count(0);

  kvs_client *obs = observer();
  kvs_stats st;
  CHECK_OK(obs, kvs_stats_get(obs, 0, &st));
  CHECK(st.num_blocks == BLOCKS_A + BLOCKS_B);
  {
    uint32_t tok[1] = {1};
    kvs_lookup_result lr;
    CHECK_RC(obs, kvs_lookup(obs, 1, tok, 1, NULL, 0, &lr), KVS_EPERM);
    CHECK_OK(obs, kvs_ping(obs, "x", 1));
  }
  run_as(UID_NONE, stranger, NULL);

  run_as(UID_A, a_first, NULL);
  run_as(UID_B, b_first, NULL);
  run_as(UID_A, a_again, NULL);
  run_as(UID_A, a_pressure, NULL);
  run_as(UID_B, b_after_pressure, NULL);
  wait_used(obs, 0);
  {
    /* a at its connection limit; b still connects. */
    char ch;
    CHECK(pipe(limit_ready) == 0 && pipe(limit_go) == 0);
    pid_t a = spawn(UID_A, a_conn_limit, NULL);
    close(limit_ready[1]); /* (a's death: the read ends) */
    close(limit_go[0]);
    limit_ready[1] = limit_go[0] = -1;
    CHECK(read(limit_ready[0], &ch, 1) == 1);
    run_as(UID_B, b_connects, NULL);
    CHECK(write(limit_go[1], "g", 1) == 1);
    CHECK(itest_reap(a, 0) == 0);
    close(limit_ready[0]);
    close(limit_go[1]);
  }

  run_as(UID_B, b_shared_budget, NULL);
  run_as(UID_A, a_own_budget, NULL);
  wait_used(obs, 0);

  /* kill -9 and SIGTERM, one holder per tenant. */
  int p[2];
  char ch;
  uint32_t na = 10, nb = 5;
  CHECK(pipe(p) == 0);
  hold_fd = p[1];
  pid_t ha = spawn(UID_A, a_holder, &na);
  pid_t hb = spawn(UID_B, b_holder, &nb);
  CHECK(read(p[0], &ch, 1) == 1 && read(p[0], &ch, 1) == 1);
  close(p[0]);
  close(p[1]);
  wait_used(obs, na + nb);
  kill(ha, SIGKILL);
  CHECK(itest_reap(ha, 1) == 128 + SIGKILL);
  wait_used(obs, nb);
  kill(hb, SIGTERM);
  CHECK(itest_wait(hb) == 128 + SIGTERM);
  wait_used(obs, 0);

  /* Every partition's invariant. */
  CHECK_OK(obs, kvs_stats_get(obs, 1, &st));
  CHECK(st.check == 0);
  kvs_close(obs);
  if (!cuda) {
    itest_daemon_finish(&d, my_fds);
  } else {
    pid_t busy = spawn(UID_A, a_busy, NULL);
    usleep(200000);
    itest_term_under_load(&d, busy);
    itest_daemon_kill(&d);
  }
  snprintf(path, sizeof path, "%s.a", disk);
  unlink(path);
  snprintf(path, sizeof path, "%s.b", disk);
  unlink(path);
  CHECK(rmdir(disk_dir) == 0);
}

/* ---- persisted disk tiers -------------------------------------------------- */

#define NPERSIST 48 /* prompts per tenant: 144 full blocks, past a pool */

/* Writes prompts 500.. with the bytes of key (the same prompts for both
 * tenants, different bytes). */
static int persist_write(void *arg) {
  uint64_t key = *(uint64_t *)arg;
  kvs_client *c = connect_as("persist-writer");
  for (uint32_t p = 0; p < NPERSIST; p++)
    write_prompt(c, 500 + p, key + p);
  kvs_close(c);
  return 0;
}

/* Looks the prompts up: how many hit in full (want_hits: at least so
 * many; -1: none may hit); every byte of a hit is key's. */
static int persist_read(void *arg) {
  const int64_t *w = arg;
  uint64_t key = (uint64_t)w[0];
  int64_t want = w[1];
  kvs_client *c = connect_as("persist-reader");
  uint32_t hits = 0;
  for (uint32_t p = 0; p < NPERSIST; p++) {
    uint32_t tok[PLEN];
    kvs_lookup_result lr;
    prompt(tok, PLEN, 500 + p);
    CHECK_OK(c, kvs_lookup(c, 2, tok, PLEN, NULL, 0, &lr));
    for (uint32_t i = 0; i < lr.num_blocks; i++) {
      long bad = itest_block_bytes(c, lr.blocks[i], key + p, i, 1);
      if (bad) {
        fprintf(stderr, "prompt %u block %u: %ld bytes not this tenant's\n",
                500 + p, i, bad);
        exit(1);
      }
    }
    hits += lr.hit_tokens == (PLEN / BS) * BS;
    CHECK(want >= 0 || lr.hit_tokens == 0);
    CHECK_OK(c, kvs_free(c, 2));
  }
  if (want >= 0 && hits < (uint64_t)want) {
    fprintf(stderr, "%u prompts of %u hit after the restart, wanted %lld\n",
            hits, NPERSIST, (long long)want);
    exit(1);
  }
  kvs_close(c);
  return 0;
}

static void start_persisting(const char *disk) {
  static char ta[64], tb[64];
  snprintf(ta, sizeof ta, "a uids=%d blocks=%d", UID_A, BLOCKS_A);
  snprintf(tb, sizeof tb, "b uids=%d blocks=%d", UID_B, BLOCKS_B);
  const char *args[] = {"--pool-blocks", "256", "--block-size", "16",
                        "--num-layers", "2", "--num-kv-heads", "2",
                        "--head-dim", "16", "--dtype", "fp16",
                        "--tenant", ta, "--tenant", tb,
                        "--disk-tier", disk, "--disk-tier-bytes", "4M",
                        "--disk-tier-persist", "yes", NULL};
  itest_daemon_start(&d, args);
  CHECK(chmod(d.dir, 0755) == 0);
  CHECK(chmod(d.socket, 0666) == 0);
}

/* Each tenant's disk tier comes back to it after a restart, and never to
 * the other: with the two files swapped, nothing is restored (their slots
 * commit to the other tenant's root) and nothing hits. */
static void persist_scenario(void) {
  char disk[128], fa[160], fb[160], tmp[160];
  uint64_t ka = 0xA000, kb = 0xB000;
  int64_t ra[2] = {(int64_t)ka, 1}, rb[2] = {(int64_t)kb, 1};
  int64_t na[2] = {(int64_t)ka, -1}, nb[2] = {(int64_t)kb, -1};
  snprintf(disk_dir, sizeof disk_dir, "/tmp/kvs-tenants-XXXXXX");
  CHECK(mkdtemp(disk_dir) != NULL);
  snprintf(disk, sizeof disk, "%s/disk", disk_dir);
  snprintf(fa, sizeof fa, "%s.a", disk);
  snprintf(fb, sizeof fb, "%s.b", disk);
  snprintf(tmp, sizeof tmp, "%s.swap", disk);

  start_persisting(disk);
  run_as(UID_A, persist_write, &ka);
  run_as(UID_B, persist_write, &kb);
  itest_daemon_finish(&d, -1);

  /* The same files: each tenant gets its own blocks back. */
  start_persisting(disk);
  CHECK(itest_log_count(&d, "slots restored") == 2);
  run_as(UID_A, persist_read, ra);
  run_as(UID_B, persist_read, rb);
  itest_daemon_finish(&d, -1);

  /* Swapped: a's partition reads b's file and the other way round. */
  CHECK(rename(fa, tmp) == 0 && rename(fb, fa) == 0 && rename(tmp, fb) == 0);
  start_persisting(disk);
  if (itest_log_count(&d, "written for another model id") != 2) {
    itest_print_log(&d);
    exit(1);
  }
  run_as(UID_A, persist_read, na);
  run_as(UID_B, persist_read, nb);
  itest_daemon_finish(&d, -1);
  unlink(fa);
  unlink(fb);
  CHECK(rmdir(disk_dir) == 0);
}

int main(void) {
  if (geteuid() != 0) {
    printf("skipped: needs root (it runs workers as other uids)\n");
    return 77;
  }
  signal(SIGPIPE, SIG_IGN);
  scenario();
  printf("host pool: tenants isolated\n");
  persist_scenario();
  printf("persisted disk tiers: each tenant's back to it only\n");

  char driver[512];
  const char *build = getenv("KVS_BUILD") ? getenv("KVS_BUILD") : "build";
  snprintf(driver, sizeof driver, "%s/tests/standin/libcuda-standin.so",
           build);
  if (access(driver, R_OK) != 0) {
    printf("no stand-in CUDA driver at %s: the cuda pool part skipped\n",
           driver);
    return 0;
  }
  if (driver[0] != '/') {
    char cwd[256];
    CHECK(getcwd(cwd, sizeof cwd));
    char abs[800];
    snprintf(abs, sizeof abs, "%s/%s", cwd, driver);
    setenv("KVS_CUDA_DRIVER", abs, 1);
  } else {
    setenv("KVS_CUDA_DRIVER", driver, 1);
  }
  cuda = 1;
  scenario();
  printf("cuda pool (stand-in driver): tenants isolated\n");
  return 0;
}
