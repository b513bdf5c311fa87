#include "daemon/config.h"

#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <limits.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/core/core.h"
#include "kvs_frame.h"
#include "kvs_status.h"
#include "kvs_utf8.h"

enum cfg_type {
  T_U32,  /* a decimal integer (a leading 0 is not octal, 0x is refused) */
  T_U64,
  T_SIZE, /* bytes; suffix K, M, G or T (powers of 1024) */
  T_INT,
  T_BOOL, /* yes/no, true/false, on/off, 1/0 */
  T_STR,  /* a string; one of choices ("a|b|c") when choices is set */
  T_ENUM, /* one of choices ("a|b|c"); stored as its index (4 bytes) */
  T_IDS,  /* comma-separated numeric ids */
  T_FRAC, /* a fraction in [0, 1] (double); 0 means off */
  T_LISTEN, /* a string: HOST:PORT, [IPV6]:PORT or *:PORT (cfg_listen_addr);
             * HOST must resolve */
  T_ZMQ,  /* a string: a ZMQ endpoint to bind (tcp://, ipc://, inproc://) */
  T_TENANT, /* one tenant (parse_tenant), appended to c->tenants each time
             * the option is given; an empty value empties the list */
};

typedef struct cfg_option {
  const char *name;
  enum cfg_type type;
  size_t off, size;
  long long min;
  unsigned long long max;
  const char *def; /* the default, as text */
  const char *choices;
  const char *arg; /* the value's name in --help */
  const char *section;
  const char *help;
} cfg_option;

#define F(field) offsetof(cfg, field), sizeof(((cfg *)0)->field)

#define CFG_MAX_POOL_BYTES (1ull << 44) /* pool_bytes, a tenant's bytes= */
_Static_assert(CFG_MAX_TENANTS == 16, "the tenant option's help says 16");

/* The one option table.  Every option is a config-file key and a flag. */
static const cfg_option options[] = {
    {"socket", T_STR, F(socket), 0, 0, "", NULL, "PATH", "Listening",
     "Unix socket to listen on.  Default: $XDG_RUNTIME_DIR/kvshare/"
     "kvshared.sock, or /run/kvshare/kvshared.sock when XDG_RUNTIME_DIR is "
     "unset.  The folder is created (mode 0755) if missing; the socket gets "
     "mode 0660.  A stale socket left by a dead daemon is replaced; a live "
     "one is an error."},
    {"socket_dir", T_STR, F(socket_dir), 0, 0, "", NULL, "DIR", "Listening",
     "Name the socket by the pool's GPU, for one daemon per GPU: "
     "DIR/GPU-<uuid>.sock (DIR/kvshared.sock with a host pool), once the "
     "pool is made.  A worker given DIR as its socket (KVS_SOCKET) connects "
     "to the daemon of the GPU it sees.  Excludes socket."},
    {"socket_group", T_STR, F(socket_group), 0, 0, "", NULL, "GROUP",
     "Listening",
     "Group (name or number) to own the socket, so that its members can "
     "connect.  Empty: the daemon's own group."},
    {"allow_uids", T_IDS, F(allow_uids), 0, UINT32_MAX, "", NULL, "UID,...",
     "Listening",
     "User ids allowed to connect (checked with SO_PEERCRED), besides root "
     "and the daemon's own uid, which always are.  Not with tenants (a "
     "tenant lists its users)."},
    {"allow_gids", T_IDS, F(allow_gids), 0, UINT32_MAX, "", NULL, "GID,...",
     "Listening",
     "Group ids whose processes may connect (the peer's primary gid).  Not "
     "with tenants."},
    {"max_connections", T_U32, F(max_connections), 1, 65536, "256", NULL, "N",
     "Listening",
     "Most sessions at once.  A connection over the limit gets a Welcome "
     "with status ELIMIT and is closed."},
    {"max_tenant_connections", T_U32, F(max_tenant_connections), 0, 65536,
     "0", NULL, "N", "Listening",
     "With tenants: most sessions of one tenant at once, so that one tenant "
     "cannot take every connection slot from the others.  A connection over "
     "it gets a Welcome with status ELIMIT and is closed.  0: "
     "max_connections divided by the number of tenants (at least 1).  "
     "Observers (root, the daemon's uid) count against max_connections "
     "only."},
    {"max_tenant_tokens", T_U64, F(max_tenant_tokens), 0, 1ull << 44, "0",
     NULL, "N", "Listening",
     "With tenants: most token positions the requests of all of one "
     "tenant's sessions may hold together (counted as max_session_tokens "
     "counts them), so that one tenant cannot make the daemon keep more "
     "than about 4 bytes times this for it.  A Lookup, Allocate, Append or "
     "Fork that would go over it fails with ELIMIT.  0: 4 x "
     "max_session_tokens."},
    {"max_requests", T_U32, F(max_requests), 1, 1u << 24, "65536", NULL, "N",
     "Listening",
     "Most live requests per session; creating one more fails with ELIMIT."},
    {"max_batch_ops", T_U32, F(max_batch_ops), 1, 1u << 20, "16384", NULL,
     "N", "Listening",
     "Most ops in one Batch; a longer Batch is refused whole with ELIMIT "
     "(none of its ops runs)."},
    {"max_session_tokens", T_U64, F(max_session_tokens), 1, 1ull << 40,
     "67108864", NULL, "N", "Listening",
     "Most token positions the requests of one session may hold together "
     "(a request counts the larger of its known tokens and its slots; a "
     "forked child counts again).  A Lookup, Allocate, Append or Fork that "
     "would go over it fails with ELIMIT.  Bounds the memory one client can "
     "make the daemon keep (about 4 bytes per position)."},
    {"handshake_timeout_ms", T_U32, F(handshake_timeout_ms), 0, 3600000,
     "10000", NULL, "MS", "Listening",
     "A connection that has not sent its Hello this long after it was "
     "accepted gets a Welcome with EPROTO and is closed, so silent "
     "connections cannot hold the max_connections slots.  0: no limit."},
    {"frame_timeout_ms", T_U32, F(frame_timeout_ms), 0, 3600000, "10000",
     NULL, "MS", "Listening",
     "After the handshake: a session that has sent part of a frame and "
     "then nothing more for this long is closed (an EPROTO reply with seq "
     "0 first), so peers that stall mid-frame cannot hold the "
     "max_connections slots.  Time the daemon itself stops reading (a "
     "peer not reading its replies, a reply waiting on a copy) does not "
     "count.  0: no limit."},
    {"max_queued_bytes", T_SIZE, F(max_queued_bytes), 1u << 20, 1ull << 40,
     "256M", NULL, "BYTES", "Listening",
     "Replies queued for all sessions together before the daemon also "
     "stops reading from every session with more than 1 MiB queued (each "
     "session is paused at 32 MiB anyway).  Bounds the memory clients that "
     "do not read their replies can make the daemon hold."},
    {"ring_bytes", T_SIZE, F(ring_bytes), 0, 64u << 20, "1M", NULL, "BYTES",
     "Listening",
     "A client that asks for it (KVS_RING=1) gets a request ring: a shared "
     "mapping of this many bytes each way beside its socket, through which "
     "its calls go without a system call while the daemon is polling (see "
     "ring_poll_us).  Frames that do not fit go on the socket.  0: no "
     "rings."},
    {"ring_poll_us", T_U32, F(ring_poll_us), 0, 1000000, "50", NULL, "US",
     "Listening",
     "After the last request taken from a ring, the daemon polls the rings "
     "this long (one CPU busy) before it sleeps; a client that posts to a "
     "sleeping daemon wakes it through an eventfd.  0: never poll (every "
     "ring request costs a wake-up)."},
    {"socket_poll_us", T_U32, F(socket_poll_us), 0, 1000000, "0", NULL, "US",
     "Listening",
     "After each frame read from a socket, the daemon keeps polling the "
     "sockets this long (one CPU busy, yielding) instead of sleeping, so "
     "that the next request finds it awake; with clients that spin on their "
     "replies (KVS_SOCKET_SPIN_US) a round trip costs no wake-up.  0: sleep "
     "at once."},
    {"max_frame", T_SIZE, F(max_frame), 1024, 1u << 30, "16M", NULL, "BYTES",
     "Listening",
     "Largest frame payload accepted.  A longer frame gets ETOOBIG and the "
     "connection is closed.  Announced to clients in Welcome.max_frame."},

    {"backend", T_STR, F(backend), 0, 0, "auto", "auto|host|cuda", "NAME",
     "Pool",
     "Where the block pool lives.  cuda: GPU memory (CUDA virtual memory "
     "management), exported to workers as file descriptors they map; the "
     "daemon fails to start when no usable GPU is there.  host: a memfd "
     "shared with the workers.  auto: cuda when a CUDA driver and a GPU "
     "that supports it are present, else host (one log line says why)."},
    {"gpu", T_STR, F(gpu), 0, 0, "", NULL, "UUID|N", "Pool",
     "The GPU of the cuda backend: its UUID (GPU-..., as nvidia-smi -L "
     "prints it; the form to use in production, since ordinals change with "
     "CUDA_VISIBLE_DEVICES) or its ordinal among the visible devices.  "
     "Empty: the first visible device."},
    {"gpu_memory_fraction", T_FRAC, F(gpu_memory_fraction), 0, 1, "0", NULL,
     "F", "Pool",
     "With the cuda backend: size the pool as F x (the GPU's free memory "
     "at start-up - gpu_reserve), in whole blocks, instead of pool_blocks "
     "or pool_bytes.  Leave room for the workers' weights and activations "
     "(they are usually loaded after the daemon starts).  0: off.  Ignored "
     "(logged) when auto falls back to the host backend."},
    {"gpu_reserve", T_SIZE, F(gpu_reserve), 0, 1ull << 44, "1G", NULL,
     "BYTES", "Pool",
     "Device memory gpu_memory_fraction leaves out before taking its "
     "fraction (the daemon's own CUDA context and copy engine)."},
    {"gpu_chunk_size", T_SIZE, F(gpu_chunk_size), 1u << 20, 1ull << 40, "1G",
     NULL, "BYTES", "Pool",
     "The cuda pool is allocated as physical chunks of this size (rounded "
     "up to the GPU's allocation granularity; grown so that a pool has at "
     "most 16 chunks), each sent to a worker as one file descriptor."},
    {"pool_blocks", T_U32, F(pool_blocks), 1, CFG_MAX_BLOCKS, "4096", NULL,
     "N", "Pool", "Blocks in the pool (unless pool_bytes is set)."},
    {"pool_bytes", T_SIZE, F(pool_bytes), 0, CFG_MAX_POOL_BYTES, "0", NULL,
     "BYTES", "Pool",
     "Byte budget for the pool; when nonzero the pool holds as many whole "
     "blocks as fit, and pool_blocks is ignored."},
    {"block_size", T_U32, F(block_size), 1, 4096, "16", NULL, "TOKENS", "Pool",
     "Tokens per block."},
    {"num_layers", T_U32, F(num_layers), 1, 1024, "4", NULL, "N", "Pool",
     "Model layers (every block holds all of them)."},
    {"num_kv_heads", T_U32, F(num_kv_heads), 1, 1024, "4", NULL, "N", "Pool",
     "K/V heads per layer."},
    {"head_dim", T_U32, F(head_dim), 1, 4096, "64", NULL, "N", "Pool",
     "Elements per head."},
    {"dtype", T_ENUM, F(dtype), 0, 0, "fp32", "fp32|fp16|bf16|int8|fp8",
     "TYPE", "Pool",
     "Element type of K and V.  int8 and fp8 (e4m3) are quantized: one byte "
     "per element and float32 scales per token and kv head (int8: a scale "
     "and a minimum, of the row rotated by a Hadamard transform), stored "
     "inside the block; the C and CUDA kernels read and write them."},
    {"model_id", T_STR, F(model_id), 0, 0, "kvshare-default", NULL, "NAME",
     "Pool",
     "Model name: part of the root of every block hash, so caches of "
     "different models never match."},

    {"tenant", T_TENANT, F(tenants), 0, 0, "", NULL,
     "'NAME [uids=U,...] [gids=G,...] [share=P%|blocks=N|bytes=SIZE]'",
     "Tenants",
     "A tenant: workers with a part of the pool of their own (its own "
     "memory, prefix index and eviction).  The value is NAME, then fields "
     "in any order, separated by spaces: team-a uids=alice,1001 gids=ml "
     "share=25%.  NAME: 1 to 31 characters of [A-Za-z0-9_.-].  uids=: the "
     "workers' user ids or names; gids=: their primary group ids or names "
     "(at least one of the two; names are resolved when the option is "
     "read).  A worker's tenant is the one listing its uid, else the one "
     "listing its gid; a uid or gid is in one tenant at most.  The share: "
     "share=P% of the pool (0 < P <= 100, as 12.5%), blocks=N or "
     "bytes=SIZE, at most one; the tenants without one split what the "
     "others leave equally.  Give the option once per tenant (at most 16): "
     "the flags' tenants are added to the config file's, and an empty "
     "value drops those given before it.  With tenants, a session whose "
     "uid and gid are in no tenant is refused, except root's and the "
     "daemon's own uid's, which may only observe (Stats and Ping, no pool "
     "mapped); allow_uids and allow_gids are refused (list the users in a "
     "tenant).  "
     "Empty: no tenants, one pool for every admitted peer."},

    {"host_tier_bytes", T_SIZE, F(host_tier_bytes), 0, 1ull << 46, "0", NULL,
     "BYTES", "Tiers",
     "A host-memory tier below the pool: cached blocks about to be evicted "
     "are copied here in the background, and a Lookup that finds its "
     "prefix here brings the blocks back up instead of leaving them to be "
     "recomputed.  Pinned for the GPU's copies with the cuda backend.  0: "
     "none."},
    {"disk_tier", T_STR, F(disk_tier), 0, 0, "", NULL, "PATH", "Tiers",
     "A file or block device for a disk tier below the host tier (or below "
     "the pool when there is no host tier), read and written O_DIRECT "
     "through io_uring.  Its contents outlive the daemon only with "
     "disk_tier_persist.  Needs disk_tier_bytes.  With the cuda backend its "
     "staging buffers are pinned for the GPU's copies."},
    {"disk_tier_bytes", T_SIZE, F(disk_tier_bytes), 0, 1ull << 50, "0", NULL,
     "BYTES", "Tiers",
     "Size of the disk tier: each slot is a block plus a 4 KiB header "
     "(magic, hash, length, XXH3 checksums, token ids, layout)."},
    {"disk_tier_persist", T_BOOL, F(disk_tier_persist), 0, 1, "no", NULL,
     "BOOL", "Tiers",
     "Keep the disk tier's file across restarts: at start the daemon reads "
     "every slot header and serves again the blocks written under this "
     "layout and model id (a persistent prefix cache); a clean stop "
     "fdatasyncs the file.  After a crash the checksums decide: a torn "
     "slot is skipped or a miss, never served.  no: the file's contents "
     "are ignored at start."},
    {"tier_window", T_U32, F(tier_window), 0, UINT32_MAX - 1, "0", NULL, "N",
     "Tiers",
     "Cached blocks at the cold end of the pool that background demotion "
     "keeps copied below, so that evicting them loses nothing and an "
     "allocation never waits for a copy.  0: pool_blocks / 16 (at least "
     "8); with a disk tier, at least 64 MiB of blocks (up to a quarter of "
     "the pool), to ride out the disk's slow writes."},
    {"tier_promote_max", T_U32, F(tier_promote_max), 1, 65536, "256", NULL,
     "N", "Tiers",
     "Most blocks one Lookup brings up from the tiers (its hit stops "
     "there)."},
    {"tier_fault", T_STR, F(tier_fault), 0, 0, "", NULL, "SPEC", "Tiers",
     "For tests only: make the disk tier fail its Nth I/O of a kind, as "
     "KIND:N[,KIND:N...] with KIND read-eio, write-eio, write-enospc, short "
     "or flip (a bit of the data); write-slow:N makes every write take N "
     "ms.  Empty: none."},

    {"remote_tier", T_STR, F(remote_tier), 0, 0, "", NULL, "URL",
     "Remote tier",
     "A store shared by the daemons of several nodes, below the other "
     "tiers: redis://[[USER]:PASSWORD@]HOST[:PORT][/DB], "
     "unix:///PATH[?db=N], or redis-cluster://HOST:PORT[,HOST:PORT...] "
     "(Redis or Valkey).  Every block a worker seals is written to it in "
     "the background; a Lookup whose chain ends here asks it for the rest "
     "in one pipelined round trip and brings up what it finds.  Whoever "
     "can read the server can read these blocks.  Empty: none."},
    {"remote_tier_prefix", T_STR, F(remote_tier_prefix), 0, 0, "kvshare",
     NULL, "NAME", "Remote tier",
     "First part of every key (PREFIX:ROOT:HASH): daemons that share "
     "blocks use the same one."},
    {"remote_tier_password_file", T_STR, F(remote_tier_password_file), 0, 0,
     "", NULL, "PATH", "Remote tier",
     "A file whose first line is PASSWORD or USER PASSWORD (an ACL user) "
     "for AUTH; keeps the password off the command line.  Overrides one "
     "in the URL."},
    {"remote_tier_ttl_ms", T_U32, F(remote_tier_ttl_ms), 0, UINT32_MAX - 1,
     "0", NULL, "MS", "Remote tier",
     "Expiry of each written block (PX); 0: none, the server's "
     "maxmemory-policy decides what goes."},
    {"remote_tier_timeout_ms", T_U32, F(remote_tier_timeout_ms), 1, 60000,
     "50", NULL, "MS", "Remote tier",
     "Longest a Lookup waits for the remote tier's answer; what has not "
     "come by then is a miss."},
    {"remote_tier_inflight_bytes", T_SIZE, F(remote_tier_inflight_bytes),
     1 << 20, 1ull << 40, "64M", NULL, "BYTES", "Remote tier",
     "Bound on the bytes of reads and writes waiting for the remote tier: "
     "past it reads miss and writes are skipped (counted)."},
    {"remote_tier_write", T_BOOL, F(remote_tier_write), 0, 1, "yes", NULL,
     "BOOL", "Remote tier",
     "Write sealed blocks to the remote tier; no: only read what other "
     "daemons wrote."},

    {"reserve_blocks", T_U32, F(reserve_blocks), 0, UINT32_MAX - 1, "0", NULL,
     "N", "Core",
     "Blocks Allocate leaves free for Append (decode of running requests)."},
    {"verify_tokens", T_BOOL, F(verify_tokens), 0, 1, "yes", NULL, "BOOL",
     "Core",
     "On a prefix hit, also compare the stored token ids, so a hash "
     "collision never serves another prefix."},
    {"policy", T_STR, F(policy), 0, 0, "slru", NULL, "NAME", "Core",
     "Eviction policy of the core: slru (segmented LRU with ghost "
     "admission), lru or mq (multi-queue); see docs/policies.md."},

    {"metrics_listen", T_LISTEN, F(metrics_listen), 0, 0, "", NULL,
     "HOST:PORT", "Observability",
     "Serve Prometheus metrics at http://HOST:PORT/metrics (pool by state, "
     "tiers, lookups and hits, evictions, sessions, protocol errors, "
     "request latency and batch size histograms; docs/operations.md).  "
     "HOST is a name (localhost; resolved once, at start-up, to its first "
     "address), an IPv4 address, an IPv6 address in brackets ([::1]:9400) "
     "or * for every interface.  At most 16 connections, each closed after "
     "10 s idle.  Empty: off."},
    {"kv_events_endpoint", T_ZMQ, F(kv_events_endpoint), 0, 0, "", NULL,
     "ENDPOINT", "Observability",
     "Publish the prefix index's changes (BlockStored, BlockRemoved, "
     "AllBlocksCleared; msgpack, as vLLM's KV events) on a ZMQ PUB socket "
     "bound here: tcp://ADDRESS:PORT (a numeric address or an interface "
     "name, not a host name: libzmq binds no names), tcp://*:PORT, "
     "ipc://PATH (or "
     "inproc://NAME), as tcp://*:5557 or ipc:///run/kvshare/events (its "
     "form is checked when the options are read).  For KV-aware "
     "routers.  Bounds per peer: messages of 256 bytes at most (longer: "
     "dropped), 64 of them queued, a handshake within 5 s; a subscription "
     "that is not a prefix of the topic is ignored, and a connection that "
     "sends 1024 such within 10 s is dropped.  libzmq sets no limit on "
     "connections (each takes a descriptor): bind to a trusted network.  "
     "Empty: off."},
    {"kv_events_replay_endpoint", T_ZMQ, F(kv_events_replay_endpoint), 0, 0,
     "", NULL, "ENDPOINT", "Observability",
     "A ZMQ ROUTER socket bound here answers a late subscriber's request "
     "(an 8-byte big-endian sequence number) with every kept event batch "
     "from that number on, then an end marker.  A peer's requests are 256 "
     "bytes at most, 64 of them queued.  Empty: no replay."},
    {"kv_events_topic", T_STR, F(kv_events_topic), 0, 0, "", NULL, "TOPIC",
     "Observability",
     "Topic (the first frame of each published message)."},
    {"kv_events_buffer", T_U32, F(kv_events_buffer), 1, 1u << 24, "10000",
     NULL, "N", "Observability",
     "Event batches kept for replay (the oldest go first; at most 64 MiB "
     "of them)."},
    {"kv_events_format", T_ENUM, F(kv_events_format), 0, 0, "map",
     "map|array", "FORMAT", "Observability",
     "How events are encoded: map (current vLLM: an EventBatch and each "
     "event a msgpack map, events tagged by a \"type\" key) or array (older "
     "vLLM: msgpack arrays, the event's name first).  The fields are listed "
     "in docs/operations.md."},

    {"log_level", T_ENUM, F(log_level), 0, 0, "info",
     "error|warn|info|debug", "LEVEL", "Process",
     "Least severe level logged to stderr."},
    {"ready_fd", T_INT, F(ready_fd), -1, INT_MAX, "-1", NULL, "FD", "Process",
     "Once listening, write \"ready\\n\" to this inherited descriptor and "
     "release it (it is pointed at /dev/null, so its reader sees end of "
     "file).  For tests and supervisors.  -1: none.  The daemon also prints "
     "\"ready <socket>\" on stdout."},
    {"exit_with_parent", T_BOOL, F(exit_with_parent), 0, 1, "no", NULL,
     "BOOL", "Process",
     "Stop (as on SIGTERM) when the process that started the daemon exits, "
     "so a test that dies never leaves a daemon behind."},
    {"dumpable", T_BOOL, F(dumpable), 0, 1, "no", NULL, "BOOL", "Process",
     "yes: leave the daemon dumpable, so that processes of its uid may read "
     "/proc/PID/fd (the pool, the tier file, every session's ring), attach "
     "a debugger and get a core dump.  For debugging only: with no, only "
     "root may."},
    {"shutdown_timeout_ms", T_U32, F(shutdown_timeout_ms), 0, 600000, "2000",
     NULL, "MS", "Process",
     "On SIGTERM/SIGINT, how long replies still queued may take to drain "
     "before the connections are closed anyway.  Copies the daemon is "
     "making (on a GPU) get one more such time after that; a daemon whose "
     "copies outlast it (a hung GPU) exits with status 1 without them."},
};

#define NOPTIONS (sizeof(options) / sizeof(options[0]))

static int fail(char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(char *err, size_t err_len, const char *fmt, ...) {
  va_list ap;

  if (err && err_len) {
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
  }
  return KVS_EINVAL;
}

static const cfg_option *find(const char *key, size_t len) {
  size_t i, j;

  for (i = 0; i < NOPTIONS; i++) {
    const char *n = options[i].name;

    for (j = 0; j < len && n[j]; j++) {
      char k = key[j] == '-' ? '_' : key[j];

      if (k != n[j])
        break;
    }
    if (j == len && n[j] == '\0')
      return &options[i];
  }
  return NULL;
}

static int parse_ull(const char *s, unsigned long long *v, int sized) {
  char *end;
  unsigned long long x, mul = 1;

  while (isspace((unsigned char)*s))
    s++;
  if (!isdigit((unsigned char)*s))
    return -1;
  errno = 0;
  x = strtoull(s, &end, 10); /* decimal: "0100" is 100, "0x10" refused */
  if (errno)
    return -1;
  if (sized && *end) {
    switch (toupper((unsigned char)*end)) {
    case 'K':
      mul = 1ull << 10;
      break;
    case 'M':
      mul = 1ull << 20;
      break;
    case 'G':
      mul = 1ull << 30;
      break;
    case 'T':
      mul = 1ull << 40;
      break;
    default:
      return -1;
    }
    end++;
    if (toupper((unsigned char)*end) == 'I') /* KiB, MiB, ... */
      end++;
    if (toupper((unsigned char)*end) == 'B')
      end++;
  }
  if (*end)
    return -1;
  if (x > ULLONG_MAX / mul)
    return -1;
  *v = x * mul;
  return 0;
}

/* Is s UTF-8 text (kvs_utf8.h)?  What lands in /metrics labels, events
 * and logs must be. */
static int utf8_text(const char *s) {
  return kvs_utf8_valid((const uint8_t *)s, strlen(s), 1);
}

static int choice_index(const char *choices, const char *v) {
  const char *p = choices;
  size_t vl = strlen(v);
  int i = 0;

  while (*p) {
    const char *bar = strchr(p, '|');
    size_t l = bar ? (size_t)(bar - p) : strlen(p);

    if (l == vl && strncmp(p, v, l) == 0)
      return i;
    if (!bar)
      break;
    p = bar + 1;
    i++;
  }
  return -1;
}

static void choice_name(const char *choices, int index, char *out,
                        size_t len) {
  const char *p = choices;

  while (index-- > 0 && p) {
    p = strchr(p, '|');
    if (p)
      p++;
  }
  if (!p) {
    snprintf(out, len, "?");
    return;
  }
  snprintf(out, len, "%.*s", (int)(strchrnul(p, '|') - p), p);
}

/* A port: 0 to 65535 in decimal, nothing else. */
static int parse_port(const char *s, unsigned *port) {
  unsigned long long p;

  if (!isdigit((unsigned char)*s) || parse_ull(s, &p, 0) < 0 || p > 65535)
    return -1;
  *port = (unsigned)p;
  return 0;
}

/* Splits HOST:PORT, [IPV6]:PORT or *:PORT; host gets "" for "*". */
static int split_hostport(const char *spec, char *host, size_t hlen,
                          unsigned *port) {
  const char *colon, *h = spec;
  size_t n;

  if (spec[0] == '[') {
    const char *rb = strchr(spec, ']');

    if (!rb || rb[1] != ':')
      return -1;
    h = spec + 1;
    n = (size_t)(rb - h);
    colon = rb + 1;
  } else {
    colon = strrchr(spec, ':');
    if (!colon)
      return -1;
    n = (size_t)(colon - spec);
    if (memchr(spec, ':', n)) /* an IPv6 address wants its brackets */
      return -1;
  }
  if (n == 0 || n >= hlen || parse_port(colon + 1, port) < 0)
    return -1;
  memcpy(host, h, n);
  host[n] = '\0';
  if (strcmp(host, "*") == 0)
    host[0] = '\0';
  return 0;
}

int cfg_listen_addr(const char *spec, struct sockaddr_storage *ss,
                    socklen_t *sl, char *err, size_t err_len) {
  struct addrinfo hints, *res = NULL;
  char host[256], port_s[8];
  unsigned port;
  int rc;

  memset(ss, 0, sizeof(*ss));
  if (split_hostport(spec, host, sizeof(host), &port) < 0)
    return fail(err, err_len, "'%s' is not HOST:PORT (localhost:9400, "
                "10.0.0.5:9400, [::1]:9400 or *:9400)", spec);
  if (!host[0]) {
    struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;

    a->sin6_family = AF_INET6; /* every interface, dual stack */
    a->sin6_addr = in6addr_any;
    a->sin6_port = htons((uint16_t)port);
    *sl = sizeof(*a);
    return 0;
  }
  memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | AI_ADDRCONFIG;
  snprintf(port_s, sizeof(port_s), "%u", port);
  rc = getaddrinfo(host, port_s, &hints, &res);
  if (rc == EAI_ADDRFAMILY || rc == EAI_NONAME) { /* no AI_ADDRCONFIG */
    hints.ai_flags = AI_NUMERICSERV;
    rc = getaddrinfo(host, port_s, &hints, &res);
  }
  if (rc != 0)
    return fail(err, err_len, "'%s': cannot resolve '%s' (%s)", spec, host,
                rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
  if (res->ai_addrlen > sizeof(*ss)) {
    freeaddrinfo(res);
    return fail(err, err_len, "'%s': an address too long", spec);
  }
  memcpy(ss, res->ai_addr, res->ai_addrlen);
  *sl = (socklen_t)res->ai_addrlen;
  freeaddrinfo(res);
  return 0;
}

/* Is v a ZMQ endpoint to bind: tcp://ADDRESS:PORT (ADDRESS numeric,
 * [IPV6], an interface of this machine or *; PORT a number or *),
 * ipc://PATH or inproc://NAME?  1 yes, 0 no, -1 tcp:// with a host name
 * (libzmq binds none). */
static int zmq_endpoint(const char *v) {
  if (strncmp(v, "tcp://", 6) == 0) {
    const char *hp = v + 6, *colon = strrchr(hp, ':');
    unsigned port;

    if (!colon || colon == hp || strpbrk(hp, " \t/"))
      return 0;
    if (hp[0] == '[' ? colon[-1] != ']'
                     : memchr(hp, ':', (size_t)(colon - hp)) != NULL)
      return 0; /* an IPv6 address wants its brackets */
    if (strcmp(colon + 1, "*") != 0 && parse_port(colon + 1, &port) != 0)
      return 0;
    {
      /* libzmq binds to *, a numeric address or an interface: not a name */
      char host[256];
      size_t n = (size_t)(colon - hp);
      struct addrinfo hints, *ai = NULL;

      if (hp[0] == '[')
        hp++, n -= 2;
      if (n >= sizeof(host))
        return 0;
      memcpy(host, hp, n);
      host[n] = '\0';
      if (strcmp(host, "*") == 0 || if_nametoindex(host) != 0)
        return 1;
      memset(&hints, 0, sizeof(hints));
      hints.ai_flags = AI_NUMERICHOST;
      if (getaddrinfo(host, NULL, &hints, &ai) != 0)
        return -1;
      freeaddrinfo(ai);
    }
    return 1;
  }
  if (strncmp(v, "ipc://", 6) == 0)
    return v[6] != '\0';
  if (strncmp(v, "inproc://", 9) == 0)
    return v[9] != '\0';
  return 0;
}

/* A byte count as its shortest exact form: 1048576 is "1M". */
static void bytes_text(unsigned long long x, char *out, size_t len) {
  static const char unit[] = "KMGT";
  int u = -1;

  while (u < 3 && x && x % 1024 == 0) {
    x /= 1024;
    u++;
  }
  if (u < 0)
    snprintf(out, len, "%llu", x);
  else
    snprintf(out, len, "%llu%c", x, unit[u]);
}

/* A user's or group's id from an item of uids= or gids=: a number (all
 * digits), else a name looked up with getpwnam_r or getgrnam_r.  0; -1 no
 * such name; another negative status when the lookup itself failed (why
 * in *why). */
static int resolve_id(const char *item, int group, uint32_t *id,
                      const char **why) {
  unsigned long long u;
  size_t cap = 1024;
  char *buf = NULL;
  int rc;

  if (item[strspn(item, "0123456789")] == '\0') {
    if (parse_ull(item, &u, 0) < 0 || u > UINT32_MAX)
      return -1;
    *id = (uint32_t)u;
    return 0;
  }
  for (;;) {
    struct passwd pw, *pwr = NULL;
    struct group gr, *grr = NULL;
    char *t = realloc(buf, cap);

    if (!t) {
      rc = -ENOMEM;
      break;
    }
    buf = t;
    if (group) {
      rc = getgrnam_r(item, &gr, buf, cap, &grr);
      if (rc == 0 && grr)
        *id = (uint32_t)grr->gr_gid;
    } else {
      rc = getpwnam_r(item, &pw, buf, cap, &pwr);
      if (rc == 0 && pwr)
        *id = (uint32_t)pwr->pw_uid;
    }
    if (rc == ERANGE && cap < (1u << 24)) {
      cap *= 4;
      continue;
    }
    /* Not found is 0 and no entry; glibc may also say ENOENT or ESRCH. */
    if (rc == 0 || rc == ENOENT || rc == ESRCH)
      rc = (grr || pwr) ? 0 : -1;
    else
      rc = -rc;
    break;
  }
  free(buf);
  if (rc < -1)
    *why = strerror(-rc);
  return rc;
}

/* Is s (n bytes, then a space or the end) a tenant's name: 1 to
 * CFG_TENANT_NAME - 1 of [A-Za-z0-9_.-]? */
static int tenant_name_ok(const char *s, size_t n) {
  static const char ok[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                           "abcdefghijklmnopqrstuvwxyz0123456789_.-";

  return n > 0 && n < CFG_TENANT_NAME && strspn(s, ok) == n;
}

/* uids=ITEM,... or gids=ITEM,... of tenant name into l. */
static int tenant_ids(const char *as, const char *name, const char *v,
                      size_t vlen, int group, cfg_idlist *l, char *err,
                      size_t err_len) {
  const char *p = v, *end = v + vlen;
  const char *what = group ? "group" : "user";
  const char *idn = group ? "gid" : "uid";

  if (vlen == 0)
    return fail(err, err_len, "%s %s: %ss= lists no %s", as, name, idn,
                what);
  while (p < end) {
    const char *comma = memchr(p, ',', (size_t)(end - p));
    size_t n = (size_t)((comma ? comma : end) - p);
    const char *why = NULL;
    char item[256];
    uint32_t id = 0, i;
    int rc;

    if (n == 0 || n >= sizeof(item))
      return fail(err, err_len, "%s %s: %ss=%.*s has an empty or overlong "
                  "item (%ss or %s names, separated by commas)", as, name,
                  idn, (int)vlen, v, idn, what);
    memcpy(item, p, n);
    item[n] = '\0';
    rc = resolve_id(item, group, &id, &why);
    if (rc == -1 && item[strspn(item, "0123456789")] == '\0')
      return fail(err, err_len, "%s %s: '%s' is not a numeric %s", as, name,
                  item, idn);
    if (rc == -1)
      return fail(err, err_len, "%s %s: unknown %s '%s'", as, name, what,
                  item);
    if (rc < 0)
      return fail(err, err_len, "%s %s: cannot look up %s '%s' (%s)", as,
                  name, what, item, why);
    for (i = 0; i < l->n; i++)
      if (l->ids[i] == id)
        return fail(err, err_len, "%s %s: %s %u is listed twice", as, name,
                    idn, id);
    if (l->n == CFG_MAX_IDS)
      return fail(err, err_len, "%s %s: more than %d %ss", as, name,
                  CFG_MAX_IDS, idn);
    l->ids[l->n++] = id;
    p += n;
    if (p < end)
      p++; /* the comma */
  }
  return 0;
}

/* share=P%: a decimal number (digits, perhaps a point and more digits)
 * and a '%', 0 < P <= 100, as a fraction. */
static int tenant_percent(const char *v, size_t n, double *frac) {
  char num[32];
  size_t d;
  double x;

  if (n < 2 || n >= sizeof(num) || v[n - 1] != '%')
    return -1;
  memcpy(num, v, n - 1);
  num[n - 1] = '\0';
  d = strspn(num, "0123456789");
  if (num[d] == '.')
    d += 1 + strspn(num + d + 1, "0123456789");
  if (num[d] || !isdigit((unsigned char)num[0]))
    return -1;
  x = strtod(num, NULL);
  if (!(x > 0.0 && x <= 100.0))
    return -1;
  *frac = x / 100.0;
  return 0;
}

/* One tenant from its text: NAME, then FIELD=VALUE in any order, separated
 * by white space (the table's help).  Checks the tenant alone; set_option
 * checks it against the others. */
static int parse_tenant(const char *as, const char *v, cfg_tenant *t,
                        char *err, size_t err_len) {
  static const char space[] = " \t\r\n\v\f";
  const char *p = v + strspn(v, space);
  size_t n = strcspn(p, space);
  unsigned seen = 0; /* 1 uids, 2 gids, 4 a share */

  memset(t, 0, sizeof(*t));
  if (!tenant_name_ok(p, n))
    return fail(err, err_len, "%s: '%.*s' is not a tenant's name (the value "
                "starts with it: 1 to %d characters of [A-Za-z0-9_.-])", as,
                (int)n, p, CFG_TENANT_NAME - 1);
  memcpy(t->name, p, n);
  for (p += n;; p += n) {
    const char *eq, *fv;
    size_t klen, flen;
    unsigned long long u;
    int rc;

    p += strspn(p, space);
    if (!*p)
      break;
    n = strcspn(p, space);
    eq = memchr(p, '=', n);
    klen = eq ? (size_t)(eq - p) : n;
    fv = eq ? eq + 1 : p + n;
    flen = (size_t)(p + n - fv);
#define FIELD(name) (klen == sizeof(name) - 1 && !memcmp(p, name, klen) && eq)
    if (FIELD("uids") || FIELD("gids")) {
      int group = p[0] == 'g';
      unsigned bit = group ? 2 : 1;

      if (seen & bit)
        return fail(err, err_len, "%s %s: %.*s= given twice", as, t->name,
                    (int)klen, p);
      seen |= bit;
      rc = tenant_ids(as, t->name, fv, flen, group,
                      group ? &t->gids : &t->uids, err, err_len);
      if (rc < 0)
        return rc;
      continue;
    }
    if (!FIELD("share") && !FIELD("blocks") && !FIELD("bytes"))
      return fail(err, err_len, "%s %s: unknown field '%.*s' (uids=, gids=, "
                  "share=, blocks= or bytes=)", as, t->name, (int)n, p);
    if (seen & 4)
      return fail(err, err_len, "%s %s: two shares; give one of share=, "
                  "blocks= and bytes=", as, t->name);
    seen |= 4;
    if (FIELD("share")) {
      if (tenant_percent(fv, flen, &t->share_frac) < 0)
        return fail(err, err_len, "%s %s: share '%.*s' is not a percent "
                    "above 0 and at most 100 (as 25%% or 12.5%%)", as,
                    t->name, (int)flen, fv);
    } else {
      int blocks = FIELD("blocks"); /* else bytes= */
      char num[32];

      if (flen == 0 || flen >= sizeof(num))
        u = 0;
      else {
        memcpy(num, fv, flen);
        num[flen] = '\0';
        if (parse_ull(num, &u, !blocks) < 0)
          u = 0;
      }
      if (blocks && (u == 0 || u > CFG_MAX_BLOCKS))
        return fail(err, err_len, "%s %s: blocks '%.*s' is not a number of "
                    "blocks in [1, %u]", as, t->name, (int)flen, fv,
                    CFG_MAX_BLOCKS);
      if (!blocks && (u == 0 || u > CFG_MAX_POOL_BYTES))
        return fail(err, err_len, "%s %s: bytes '%.*s' is not a byte count "
                    "in [1, 16T] (a decimal number, optionally followed by "
                    "K, M, G or T)", as, t->name, (int)flen, fv);
      if (blocks)
        t->share_blocks = (uint32_t)u;
      else
        t->share_bytes = (uint64_t)u;
    }
#undef FIELD
  }
  if (!(seen & 3))
    return fail(err, err_len, "%s %s: lists no user and no group (give "
                "uids=, gids= or both)", as, t->name);
  return 0;
}

/* Appends tenant text v to c's tenants, or empties the list when v is
 * blank.  The new one must differ from those already there: its name, each
 * uid, each gid. */
static int add_tenant(cfg *c, const char *as, const char *v, char *err,
                      size_t err_len) {
  cfg_tenant t;
  uint32_t i, j, k;
  int rc;

  if (!v[strspn(v, " \t\r\n\v\f")]) {
    c->ntenants = 0;
    memset(c->tenants, 0, sizeof(c->tenants));
    return 0;
  }
  rc = parse_tenant(as, v, &t, err, err_len);
  if (rc < 0)
    return rc;
  if (c->ntenants == CFG_MAX_TENANTS)
    return fail(err, err_len, "%s %s: more than %d tenants", as, t.name,
                CFG_MAX_TENANTS);
  for (i = 0; i < c->ntenants; i++) {
    const cfg_tenant *o = &c->tenants[i];

    if (strcmp(o->name, t.name) == 0)
      return fail(err, err_len, "%s %s: tenant %s is declared twice", as,
                  t.name, t.name);
    for (j = 0; j < t.uids.n; j++)
      for (k = 0; k < o->uids.n; k++)
        if (t.uids.ids[j] == o->uids.ids[k])
          return fail(err, err_len, "%s %s: uid %u is in tenant %s too (a "
                      "uid belongs to one tenant)", as, t.name,
                      t.uids.ids[j], o->name);
    for (j = 0; j < t.gids.n; j++)
      for (k = 0; k < o->gids.n; k++)
        if (t.gids.ids[j] == o->gids.ids[k])
          return fail(err, err_len, "%s %s: gid %u is in tenant %s too (a "
                      "gid belongs to one tenant)", as, t.name,
                      t.gids.ids[j], o->name);
  }
  c->tenants[c->ntenants++] = t;
  return 0;
}

/* Sets o from its text v; messages name the option as the user wrote it
 * (as: "--pool-blocks" for a flag, "pool_blocks" in a file). */
static int set_option(cfg *c, const cfg_option *o, const char *as,
                      const char *v, char *err, size_t err_len) {
  char *field = (char *)c + o->off;
  unsigned long long u;

  switch (o->type) {
  case T_U32:
  case T_U64:
    if (parse_ull(v, &u, 0) < 0)
      return fail(err, err_len, "%s: '%s' is not a decimal number", as, v);
    if (u < (unsigned long long)o->min || u > o->max)
      return fail(err, err_len, "%s: %s is out of range [%lld, %llu]", as, v,
                  o->min, o->max);
    if (o->type == T_U32)
      *(uint32_t *)field = (uint32_t)u;
    else
      *(uint64_t *)field = (uint64_t)u;
    return 0;
  case T_SIZE: {
    char lo[32], hi[32];

    if (parse_ull(v, &u, 1) < 0)
      return fail(err, err_len, "%s: '%s' is not a byte count (a decimal "
                  "number, optionally followed by K, M, G or T)", as, v);
    bytes_text((unsigned long long)o->min, lo, sizeof(lo));
    bytes_text(o->max, hi, sizeof(hi));
    if (u < (unsigned long long)o->min || u > o->max)
      return fail(err, err_len, "%s: %s is out of range [%s, %s] bytes", as,
                  v, lo, hi);
    *(uint64_t *)field = (uint64_t)u;
    return 0;
  }
  case T_INT: {
    char *end;
    long long x;

    errno = 0;
    x = strtoll(v, &end, 10);
    if (errno || end == v || *end)
      return fail(err, err_len, "%s: '%s' is not a decimal integer", as, v);
    if (x < o->min || (x > 0 && (unsigned long long)x > o->max))
      return fail(err, err_len, "%s: %s is out of range [%lld, %llu]",
                  as, v, o->min, o->max);
    *(int *)field = (int)x;
    return 0;
  }
  case T_BOOL:
    if (!strcmp(v, "yes") || !strcmp(v, "true") || !strcmp(v, "on") ||
        !strcmp(v, "1"))
      *(int *)field = 1;
    else if (!strcmp(v, "no") || !strcmp(v, "false") || !strcmp(v, "off") ||
             !strcmp(v, "0"))
      *(int *)field = 0;
    else
      return fail(err, err_len, "%s: '%s' is not yes or no", as, v);
    return 0;
  case T_LISTEN:
  case T_ZMQ:
  case T_STR:
    if (o->type == T_ZMQ && v[0] && zmq_endpoint(v) < 0)
      return fail(err, err_len, "%s: '%s': libzmq binds to *, a numeric "
                  "address or a network interface, not a host name "
                  "(tcp://*:PORT, tcp://127.0.0.1:PORT, tcp://eth0:PORT)", as,
                  v);
    if (o->type == T_ZMQ && v[0] && !zmq_endpoint(v))
      return fail(err, err_len, "%s: '%s' is not a ZMQ endpoint (tcp://*:%s, "
                  "tcp://ADDRESS:PORT, ipc://PATH or inproc://NAME)", as, v,
                  v[strspn(v, "0123456789")] || !v[0] ? "5557" : v);
    if (o->type == T_LISTEN && v[0]) {
      struct sockaddr_storage ss;
      socklen_t sl;
      char why[400];

      if (cfg_listen_addr(v, &ss, &sl, why, sizeof(why)) < 0)
        return fail(err, err_len, "%s: %s", as, why);
    }
    if (o->choices && choice_index(o->choices, v) < 0)
      return fail(err, err_len, "%s: '%s' is not one of %s", as, v,
                  o->choices);
    if (strlen(v) >= o->size)
      return fail(err, err_len, "%s: longer than %zu characters", as,
                  o->size - 1);
    if ((field == c->model_id || field == c->kv_events_topic) &&
        !utf8_text(v))
      return fail(err, err_len, "%s: not UTF-8 text (control characters "
                  "and invalid UTF-8 are refused)", as);
    memcpy(field, v, strlen(v) + 1);
    return 0;
  case T_ENUM: {
    int i = choice_index(o->choices, v);

    if (i < 0)
      return fail(err, err_len, "%s: '%s' is not one of %s", as, v,
                  o->choices);
    _Static_assert(sizeof(int) == sizeof(uint32_t), "enum fields");
    memcpy(field, &i, sizeof(i));
    return 0;
  }
  case T_FRAC: {
    char *end;
    double x;

    errno = 0;
    x = strtod(v, &end);
    if (errno || end == v || *end || !(x >= 0.0 && x <= 1.0))
      return fail(err, err_len, "%s: '%s' is not a fraction in [0, 1]",
                  as, v);
    memcpy(field, &x, sizeof(x));
    return 0;
  }
  case T_IDS: {
    cfg_idlist l = {0, {0}};
    const char *p = v;

    while (*p) {
      char num[32];
      size_t n;

      while (*p == ',' || isspace((unsigned char)*p))
        p++;
      if (!*p)
        break;
      n = strcspn(p, ", \t");
      if (n >= sizeof(num) || l.n == CFG_MAX_IDS)
        return fail(err, err_len, "%s: too long (at most %d ids)", as,
                    CFG_MAX_IDS);
      memcpy(num, p, n);
      num[n] = '\0';
      if (parse_ull(num, &u, 0) < 0 || u > o->max)
        return fail(err, err_len, "%s: '%s' is not a numeric id", as,
                    num);
      l.ids[l.n++] = (uint32_t)u;
      p += n;
    }
    memcpy(field, &l, sizeof(l));
    return 0;
  }
  case T_TENANT:
    return add_tenant(c, as, v, err, err_len);
  }
  return fail(err, err_len, "%s: bad option type", as);
}

void cfg_init(cfg *c) {
  size_t i;

  memset(c, 0, sizeof(*c));
  for (i = 0; i < NOPTIONS; i++) {
    int rc = set_option(c, &options[i], options[i].name, options[i].def,
                        NULL, 0);

    /* The table's defaults must parse: checked by test_config too. */
    if (rc < 0)
      abort();
  }
}

int cfg_set(cfg *c, const char *key, const char *value, char *err,
            size_t err_len) {
  const cfg_option *o = find(key, strlen(key));

  if (!o)
    return fail(err, err_len, "unknown option '%s'", key);
  return set_option(c, o, key, value, err, err_len);
}

int cfg_load_string(cfg *c, const char *text, const char *name, char *err,
                    size_t err_len) {
  const char *line = text;
  unsigned lineno = 0;

  while (line && *line) {
    const char *eol = strchrnul(line, '\n');
    char buf[4096], msg[512];
    char *k, *v, *eq, *end, *hash;
    size_t len = (size_t)(eol - line);

    lineno++;
    if (len >= sizeof(buf))
      return fail(err, err_len, "%s:%u: line too long", name, lineno);
    memcpy(buf, line, len);
    buf[len] = '\0';
    line = *eol ? eol + 1 : NULL;

    /* Comments: '#' at the start or after white space. */
    for (hash = buf; (hash = strchr(hash, '#')); hash++)
      if (hash == buf || isspace((unsigned char)hash[-1])) {
        *hash = '\0';
        break;
      }
    k = buf;
    while (isspace((unsigned char)*k))
      k++;
    end = k + strlen(k);
    while (end > k && isspace((unsigned char)end[-1]))
      *--end = '\0';
    if (!*k)
      continue;
    eq = strchr(k, '=');
    if (!eq)
      return fail(err, err_len, "%s:%u: expected 'key = value'", name,
                  lineno);
    v = eq + 1;
    while (eq > k && isspace((unsigned char)eq[-1]))
      eq--;
    *eq = '\0';
    while (isspace((unsigned char)*v))
      v++;
    end = v + strlen(v);
    if (end - v >= 2 && *v == '"' && end[-1] == '"') {
      end[-1] = '\0';
      v++;
    }
    if (!find(k, strlen(k)))
      return fail(err, err_len, "%s:%u: unknown option '%s'", name, lineno,
                  k);
    if (cfg_set(c, k, v, msg, sizeof(msg)) < 0)
      return fail(err, err_len, "%s:%u: %s", name, lineno, msg);
  }
  return 0;
}

int cfg_load_file(cfg *c, const char *path, char *err, size_t err_len) {
  FILE *f = fopen(path, "re");
  char *text = NULL;
  size_t len = 0, cap = 0, n;
  int rc;

  if (!f)
    return fail(err, err_len, "%s: %s", path, strerror(errno));
  for (;;) {
    if (cap - len < 4096) {
      char *t;

      if (cap > (1u << 22)) {
        rc = fail(err, err_len, "%s: file too large", path);
        goto out;
      }
      cap = cap ? cap * 2 : 8192;
      t = realloc(text, cap);
      if (!t) {
        rc = fail(err, err_len, "%s: out of memory", path);
        goto out;
      }
      text = t;
    }
    n = fread(text + len, 1, cap - len - 1, f);
    len += n;
    if (n == 0)
      break;
  }
  if (ferror(f)) {
    rc = fail(err, err_len, "%s: read error", path);
    goto out;
  }
  text[len] = '\0';
  if (strlen(text) != len) {
    rc = fail(err, err_len, "%s: contains a NUL byte", path);
    goto out;
  }
  rc = cfg_load_string(c, text, path, err, err_len);
out:
  free(text);
  fclose(f);
  return rc;
}

static int is_flag_value(const char *s) {
  return s && !(s[0] == '-' && s[1] == '-');
}

int cfg_parse_args(cfg *c, int argc, char **argv, enum cfg_action *action,
                   char *err, size_t err_len) {
  int i, rc;

  *action = CFG_RUN;
  /* First pass: --config, --help, --version, --print-config. */
  for (i = 1; i < argc; i++) {
    const char *a = argv[i];

    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      *action = CFG_HELP;
      return 0;
    }
    if (!strcmp(a, "--version")) {
      *action = CFG_VERSION;
      return 0;
    }
    if (!strcmp(a, "--print-config")) {
      *action = CFG_PRINT_CONFIG;
      continue;
    }
    if (!strcmp(a, "--print-example-config")) {
      *action = CFG_PRINT_EXAMPLE;
      return 0;
    }
    if (!strcmp(a, "--config") || !strncmp(a, "--config=", 9)) {
      const char *path = a[8] == '=' ? a + 9 : (i + 1 < argc ? argv[++i] : NULL);

      if (!path || !*path)
        return fail(err, err_len, "--config needs a file name");
      rc = cfg_load_file(c, path, err, err_len);
      if (rc < 0)
        return rc;
    }
  }
  /* Second pass: every other option overrides the file. */
  for (i = 1; i < argc; i++) {
    const char *a = argv[i], *eq, *v;
    const cfg_option *o;
    char msg[512], flag[64];
    size_t klen;

    if (!strcmp(a, "--print-config"))
      continue;
    if (!strcmp(a, "--config")) {
      i++;
      continue;
    }
    if (!strncmp(a, "--config=", 9))
      continue;
    if (strncmp(a, "--", 2) != 0 || !a[2])
      return fail(err, err_len, "unexpected argument '%s' (try --help)", a);
    a += 2;
    eq = strchr(a, '=');
    klen = eq ? (size_t)(eq - a) : strlen(a);
    o = find(a, klen);
    if (!o)
      return fail(err, err_len, "unknown option '--%.*s' (try --help)",
                  (int)klen, a);
    snprintf(flag, sizeof(flag), "--%.*s", (int)klen, a); /* as typed */
    if (eq) {
      v = eq + 1;
    } else if (o->type == T_BOOL && !is_flag_value(i + 1 < argc ? argv[i + 1]
                                                                : NULL)) {
      v = "yes"; /* a bare boolean flag */
    } else if (i + 1 < argc && is_flag_value(argv[i + 1])) {
      v = argv[++i];
    } else { /* at the end, or followed by another --flag */
      return fail(err, err_len, "%s needs a value", flag);
    }
    if (set_option(c, o, flag, v, msg, sizeof(msg)) < 0)
      return fail(err, err_len, "%s", msg);
  }
  return 0;
}

void cfg_default_socket(char *out, size_t len) {
  const char *xdg = getenv("XDG_RUNTIME_DIR");

  if (xdg && xdg[0] == '/' &&
      strlen(xdg) + sizeof("/kvshare/kvshared.sock") <= len)
    snprintf(out, len, "%s/kvshare/kvshared.sock", xdg);
  else
    snprintf(out, len, "/run/kvshare/kvshared.sock");
}

/* The tenants against the rest of the configuration: no allow list beside
 * them (a tenant lists its users), and their shares within the pool.  The
 * percents are checked here; the whole split (cfg_tenant_blocks) only when
 * the pool's size is known: with gpu_memory_fraction the backend learns it
 * at start, where cfg_tenant_blocks checks the split again. */
static int check_tenants(const cfg *c, char *err, size_t err_len) {
  uint32_t blocks[CFG_MAX_TENANTS], t;
  double frac = 0;
  struct stat sb;

  if (!c->ntenants)
    return 0;
  if (c->allow_uids.n || c->allow_gids.n)
    return fail(err, err_len, "%s does not go with tenants: with tenants, "
                "list the users in a tenant (uids=, gids=)",
                c->allow_uids.n ? "allow_uids" : "allow_gids");
  /* Each tenant's disk tier is the file disk_tier.NAME: beside a block
   * device (or any other special file, or a folder) that would be a
   * regular file in its folder (/dev/nvme1n1.a, on devtmpfs), not the
   * disk that was named. */
  if (c->disk_tier[0] && stat(c->disk_tier, &sb) == 0 &&
      !S_ISREG(sb.st_mode))
    return fail(err, err_len, "disk_tier %s is %s: with tenants each "
                "tenant's disk tier is a file of its own (%s.NAME); name a "
                "file on the disk instead", c->disk_tier,
                S_ISBLK(sb.st_mode)   ? "a block device, which cannot be "
                                        "split among tenants"
                : S_ISDIR(sb.st_mode) ? "a folder"
                                      : "not a regular file",
                c->disk_tier);
  for (t = 0; t < c->ntenants; t++)
    frac += c->tenants[t].share_frac;
  if (frac > 1.0 + 1e-9)
    return fail(err, err_len, "the tenants' shares add up to %.15g%% of the "
                "pool", frac * 100.0);
  if (c->gpu_memory_fraction > 0)
    return 0;
  return cfg_tenant_blocks(c, c->layout.num_blocks, c->layout.block_stride,
                           blocks, err, err_len);
}

int cfg_finish(cfg *c, char *err, size_t err_len) {
  kvs_layout *l = &c->layout;
  int offline;

  if (c->socket_dir[0]) {
    /* The longest name run() may give the socket: a GPU or MIG UUID. */
    static const char longest[] =
        "/MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" KVS_SOCKET_GPU_SUFFIX;

    if (c->socket[0])
      return fail(err, err_len, "socket and socket_dir exclude each other "
                  "(socket_dir names the socket by the pool's GPU)");
    if (strlen(c->socket_dir) + sizeof(longest) > sizeof(c->socket))
      return fail(err, err_len, "socket_dir '%s' is too long for a Unix "
                  "socket path with a GPU UUID in it", c->socket_dir);
  } else if (!c->socket[0]) {
    cfg_default_socket(c->socket, sizeof(c->socket));
  }
  memset(l, 0, sizeof(*l));
  l->block_size = c->block_size;
  l->num_layers = c->num_layers;
  l->num_kv_heads = c->num_kv_heads;
  l->head_dim = c->head_dim;
  l->dtype = c->dtype;
  l->num_blocks = 1;
  if (kvs_layout_finish(l) < 0)
    return fail(err, err_len,
                "the layout (block_size %u, num_layers %u, num_kv_heads %u, "
                "head_dim %u) makes a block over 1 GiB",
                c->block_size, c->num_layers, c->num_kv_heads, c->head_dim);
  if (c->pool_bytes) {
    uint64_t n = c->pool_bytes / l->block_stride;

    if (n == 0)
      return fail(err, err_len,
                  "pool_bytes %llu is smaller than one block (%llu bytes)",
                  (unsigned long long)c->pool_bytes,
                  (unsigned long long)l->block_stride);
    if (n > CFG_MAX_BLOCKS)
      return fail(err, err_len,
                  "pool_bytes %llu makes %llu blocks, more than %u",
                  (unsigned long long)c->pool_bytes, (unsigned long long)n,
                  CFG_MAX_BLOCKS);
    l->num_blocks = (uint32_t)n;
  } else {
    l->num_blocks = c->pool_blocks;
  }
  if (kvs_layout_finish(l) < 0)
    return fail(err, err_len, "bad layout");
  if (kvs_pool_bytes(l) / l->block_stride != l->num_blocks ||
      kvs_pool_bytes(l) > CFG_MAX_POOL_BYTES)
    return fail(err, err_len, "the pool (%u blocks of %llu bytes) is too big",
                l->num_blocks, (unsigned long long)l->block_stride);
  if (c->gpu_memory_fraction > 0 && strcmp(c->backend, "host") == 0)
    return fail(err, err_len, "gpu_memory_fraction sizes a GPU pool; the "
                "host backend takes pool_blocks or pool_bytes");
  if (!c->disk_tier[0] != !c->disk_tier_bytes)
    return fail(err, err_len, "disk_tier and disk_tier_bytes go together "
                "(the file and its size)");
  if (c->disk_tier_persist && !c->disk_tier[0])
    return fail(err, err_len, "disk_tier_persist keeps a disk tier: it "
                "needs disk_tier");
  if (c->disk_tier_persist && c->verify_tokens && l->block_size > 992)
    return fail(err, err_len, "disk_tier_persist with verify_tokens keeps "
                "each block's token ids in its 4 KiB slot header: block_size "
                "%u is above the 992 that fit", l->block_size);
  if (c->kv_events_endpoint[0] &&
      strcmp(c->kv_events_endpoint, c->kv_events_replay_endpoint) == 0)
    return fail(err, err_len, "kv_events_endpoint and "
                "kv_events_replay_endpoint must differ (both %s)",
                c->kv_events_endpoint);
  if (core_policy_find(c->policy, &offline) != 0 || offline) {
    char names[128];
    core_policy_list(names, sizeof(names), 0);
    return fail(err, err_len, "policy '%s' is not one of the daemon's "
                "eviction policies (%s; 'opt' needs the future: the "
                "replayer only)", c->policy, names);
  }
  if (c->reserve_blocks >= l->num_blocks && c->gpu_memory_fraction == 0)
    return fail(err, err_len, "reserve_blocks %u must be below the pool's %u "
                "blocks", c->reserve_blocks, l->num_blocks);
  return check_tenants(c, err, err_len);
}

uint32_t cfg_tier_window(const cfg *c, uint32_t num_blocks,
                         uint64_t block_stride) {
  uint64_t w = num_blocks / 16, floor;

  if (c->tier_window || !c->disk_tier[0])
    return c->tier_window;
  /* A disk's writes take milliseconds, its slow ones many: a sixteenth of
   * a small pool is gone in less than that. */
  floor = block_stride ? CFG_DISK_WINDOW_BYTES / block_stride : 0;
  if (floor > num_blocks / 4)
    floor = num_blocks / 4;
  if (w < floor)
    w = floor;
  if (w < 8)
    w = 8;
  return (uint32_t)(w < num_blocks ? w : num_blocks);
}

int cfg_peer_allowed(const cfg *c, uid_t uid, gid_t gid, uid_t self) {
  uint32_t i;

  if (uid == 0 || uid == self)
    return 1;
  if (c->ntenants)
    return cfg_tenant_of(c, uid, gid) >= 0;
  for (i = 0; i < c->allow_uids.n; i++)
    if (c->allow_uids.ids[i] == uid)
      return 1;
  for (i = 0; i < c->allow_gids.n; i++)
    if (c->allow_gids.ids[i] == gid)
      return 1;
  return 0;
}

int cfg_tenant_of(const cfg *c, uid_t uid, gid_t gid) {
  uint32_t t, i;

  for (t = 0; t < c->ntenants; t++)
    for (i = 0; i < c->tenants[t].uids.n; i++)
      if (c->tenants[t].uids.ids[i] == uid)
        return (int)t;
  for (t = 0; t < c->ntenants; t++)
    for (i = 0; i < c->tenants[t].gids.n; i++)
      if (c->tenants[t].gids.ids[i] == gid)
        return (int)t;
  return -1;
}

/* A tenant's share=P% of pool_blocks, rounded down.  P was read as
 * decimal text: 29% is 0.29 only to the nearest double, and 0.29 x 100 is
 * 28.999999999999996; the nudge (far below a block for any pool) keeps
 * such a product on its whole number. */
static uint64_t frac_blocks(double frac, uint32_t pool_blocks) {
  return (uint64_t)(frac * (double)pool_blocks * (1.0 + 1e-12));
}

int cfg_tenant_blocks(const cfg *c, uint32_t pool_blocks, uint64_t block_stride,
                      uint32_t *blocks, char *err, size_t err_len) {
  uint64_t given = 0, b;
  uint32_t t, nrest = 0, rest, least;

  for (t = 0; t < c->ntenants; t++) {
    const cfg_tenant *x = &c->tenants[t];

    if (x->share_blocks)
      b = x->share_blocks;
    else if (x->share_bytes)
      b = block_stride ? x->share_bytes / block_stride : 0;
    else if (x->share_frac > 0)
      b = frac_blocks(x->share_frac, pool_blocks);
    else {
      nrest++;
      blocks[t] = 0;
      continue;
    }
    if (b > (1ull << 40)) /* far over any pool; 16 of them add up safely */
      b = 1ull << 40;
    blocks[t] = b > UINT32_MAX ? UINT32_MAX : (uint32_t)b;
    given += b;
  }
  if (given > pool_blocks)
    return fail(err, err_len, "the tenants' shares add up to %llu blocks; "
                "the pool has %u", (unsigned long long)given, pool_blocks);
  least = c->reserve_blocks >= CFG_TENANT_MIN_BLOCKS ? c->reserve_blocks + 1
                                                     : CFG_TENANT_MIN_BLOCKS;
  rest = nrest ? (uint32_t)((pool_blocks - given) / nrest) : 0;
  if (nrest && rest < least)
    return fail(err, err_len, "the tenants' shares leave %llu of the pool's "
                "%u blocks to the %u without one: %u each, too few (a "
                "tenant needs at least %u, and more than reserve_blocks %u)",
                (unsigned long long)(pool_blocks - given), pool_blocks, nrest,
                rest, least, c->reserve_blocks);
  for (t = 0; t < c->ntenants; t++) {
    const cfg_tenant *x = &c->tenants[t];

    if (!x->share_blocks && !x->share_bytes && !(x->share_frac > 0))
      blocks[t] = rest;
    if (blocks[t] < least)
      return fail(err, err_len, "tenant %s: a share of %u blocks is too "
                  "small (a tenant needs at least %u, and more than "
                  "reserve_blocks %u)",
                  x->name, blocks[t], least, c->reserve_blocks);
  }
  return 0;
}

/* A URL with its password (USER:PASSWORD@ or PASSWORD@) shown as "***". */
static void print_url(FILE *out, const char *name, const char *url) {
  const char *scheme = strstr(url, "://"), *at, *slash, *colon;

  if (!scheme || !(at = strchr(scheme + 3, '@')) ||
      ((slash = strchr(scheme + 3, '/')) && slash < at)) {
    fprintf(out, "%s = %s\n", name, url);
    return;
  }
  colon = memchr(scheme + 3, ':', (size_t)(at - scheme - 3));
  fprintf(out, "%s = %.*s***%s\n", name,
          (int)((colon ? colon + 1 : scheme + 3) - url), url, at);
}

/* Wraps text at width, each line starting with prefix. */
static void wrap(FILE *out, const char *prefix, const char *text,
                 size_t width) {
  const char *p = text;

  while (*p) {
    const char *end = p, *brk = NULL;

    while (*end && (size_t)(end - p) < width) {
      if (*end == ' ')
        brk = end;
      end++;
    }
    const char *stop;

    if (*end && brk)
      end = brk;
    for (stop = end; stop > p && stop[-1] == ' ';)
      stop--;
    fprintf(out, "%s%.*s\n", prefix, (int)(stop - p), p);
    p = end;
    while (*p == ' ')
      p++;
  }
}

void cfg_print_help(FILE *out, const char *prog) {
  const char *section = "";
  size_t i;

  fprintf(out,
          "Usage: %s [serve] [--config FILE] [--OPTION VALUE]...\n"
          "       %s replay --help\n"
          "\n"
          "kvshared owns a pool of KV-cache blocks and the prefix index over "
          "it, and\nserves worker processes over a Unix socket.\n"
          "\n"
          "  --config FILE        read `key = value` lines first (flags "
          "override them;\n"
          "                       --tenant adds to the file's tenants)\n"
          "  --print-config       print the effective configuration and "
          "exit\n"
          "  --print-example-config  print the annotated example config "
          "(deploy/kvshared.conf)\n"
          "  --help, --version\n"
          "\n"
          "N, MS, US and BYTES are decimal (a leading 0 is not octal; 0x is "
          "refused);\nBYTES take a K, M, G or T suffix (powers of 1024). "
          "--model-id and\n--kv-events-topic are UTF-8 text without control "
          "characters.\n",
          prog, prog);
  for (i = 0; i < NOPTIONS; i++) {
    const cfg_option *o = &options[i];
    char flag[128], def[160];

    if (strcmp(section, o->section) != 0) {
      section = o->section;
      fprintf(out, "\n%s:\n", section);
    }
    snprintf(flag, sizeof(flag), "--%s %s", o->name, o->arg);
    for (char *f = flag + 2; *f && *f != ' '; f++)
      if (*f == '_')
        *f = '-';
    fprintf(out, "  %s\n", flag);
    wrap(out, "        ", o->help, 70);
    if (o->choices)
      fprintf(out, "        One of: %s.\n", o->choices);
    snprintf(def, sizeof(def), "%s", o->def[0] ? o->def : "(empty)");
    if (strcmp(o->name, "socket") != 0)
      fprintf(out, "        Default: %s.\n", def);
  }
  fprintf(out, "\nSignals: SIGTERM or SIGINT stop accepting, free every "
               "session and exit 0.\n");
}

void cfg_print_example(FILE *out) {
  const char *section = "";
  size_t i;

  fprintf(out,
          "# kvshared.conf — example configuration of the kvshare daemon.\n"
          "#\n"
          "# Generated from kvshared's option table by `kvshared "
          "--print-example-config`.\n"
          "# Syntax: `key = value` per line; `#` starts a comment.  Every key "
          "is also a\n"
          "# command-line flag (`--key value`, with '-' or '_'), and flags "
          "override this\n"
          "# file.  Each option below is commented out and shows its "
          "default.\n");
  for (i = 0; i < NOPTIONS; i++) {
    const cfg_option *o = &options[i];

    if (strcmp(section, o->section) != 0) {
      section = o->section;
      fprintf(out, "\n# ---- %s ----\n", section);
    }
    fprintf(out, "\n");
    wrap(out, "# ", o->help, 76);
    if (o->choices)
      fprintf(out, "# One of: %s.\n", o->choices);
    fprintf(out, "#%s =%s%s\n", o->name, o->def[0] ? " " : "", o->def);
  }
}

/* A tenant as the option's value: NAME uids=... gids=... SHARE, the ids as
 * numbers (names were resolved when it was read). */
static void print_tenant(FILE *out, const cfg_tenant *t) {
  static const char *const key[] = {"uids", "gids"};
  const cfg_idlist *l[] = {&t->uids, &t->gids};
  uint32_t i, j;

  fprintf(out, "%s", t->name);
  for (i = 0; i < 2; i++) {
    if (l[i]->n)
      fprintf(out, " %s=", key[i]);
    for (j = 0; j < l[i]->n; j++)
      fprintf(out, "%s%u", j ? "," : "", l[i]->ids[j]);
  }
  if (t->share_blocks)
    fprintf(out, " blocks=%u", t->share_blocks);
  else if (t->share_bytes) {
    char b[32];

    bytes_text(t->share_bytes, b, sizeof(b));
    fprintf(out, " bytes=%s", b);
  } else if (t->share_frac > 0)
    fprintf(out, " share=%.15g%%", t->share_frac * 100.0);
}

void cfg_print_values(FILE *out, const cfg *c) {
  size_t i;

  for (i = 0; i < NOPTIONS; i++) {
    const cfg_option *o = &options[i];
    const char *field = (const char *)c + o->off;
    char buf[256];

    switch (o->type) {
    case T_U32:
      fprintf(out, "%s = %u\n", o->name, *(const uint32_t *)field);
      break;
    case T_U64:
    case T_SIZE:
      fprintf(out, "%s = %llu\n", o->name,
              (unsigned long long)*(const uint64_t *)field);
      break;
    case T_INT:
      fprintf(out, "%s = %d\n", o->name, *(const int *)field);
      break;
    case T_BOOL:
      fprintf(out, "%s = %s\n", o->name, *(const int *)field ? "yes" : "no");
      break;
    case T_STR:
    case T_LISTEN:
    case T_ZMQ:
      if (strcmp(o->name, "remote_tier") == 0)
        print_url(out, o->name, field);
      else
        fprintf(out, "%s = %s\n", o->name, field);
      break;
    case T_ENUM: {
      int idx;

      memcpy(&idx, field, sizeof(idx));
      choice_name(o->choices, idx, buf, sizeof(buf));
      fprintf(out, "%s = %s\n", o->name, buf);
      break;
    }
    case T_FRAC: {
      double x;

      memcpy(&x, field, sizeof(x));
      fprintf(out, "%s = %g\n", o->name, x);
      break;
    }
    case T_IDS: {
      const cfg_idlist *l = (const cfg_idlist *)field;
      uint32_t j;

      fprintf(out, "%s = ", o->name);
      for (j = 0; j < l->n; j++)
        fprintf(out, "%s%u", j ? "," : "", l->ids[j]);
      fprintf(out, "\n");
      break;
    }
    case T_TENANT: {
      uint32_t t;

      if (!c->ntenants)
        fprintf(out, "%s = \n", o->name);
      for (t = 0; t < c->ntenants; t++) {
        fprintf(out, "%s = ", o->name);
        print_tenant(out, &c->tenants[t]);
        fprintf(out, "\n");
      }
      break;
    }
    }
  }
}
