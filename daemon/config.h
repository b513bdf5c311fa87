/*
 * config.h — kvshared's configuration, from one option table.
 *
 * The table in config.c (name, type, bounds, default, help) drives the
 * config-file parser (`key = value` lines, `#` comments), the command-line
 * flags (`--key value`, `--key=value`; '-' and '_' are the same in a key),
 * `--help`, and the annotated example config (`--print-example-config`, the
 * source of deploy/kvshared.conf).  Precedence: built-in defaults, then the file
 * named by --config, then the other flags.  The one repeatable option,
 * tenant, appends a tenant each time it is given (an empty value empties
 * the list): the flags' tenants come after the file's.
 *
 * Functions return 0 or KVS_EINVAL with a one-line reason in err.  Nothing
 * here logs or touches the event loop.
 */
#ifndef KVS_DAEMON_CONFIG_H
#define KVS_DAEMON_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "kvs_layout.h"

#define CFG_MAX_IDS 32
#define CFG_MAX_BLOCKS (1u << 26) /* the core keeps ~100 bytes per block */
#define CFG_SOCKET_MAX 108 /* sizeof(sockaddr_un.sun_path) */

typedef struct cfg_idlist {
  uint32_t n;
  uint32_t ids[CFG_MAX_IDS];
} cfg_idlist;

/* A tenant (docs/operations.md "Tenants"): whose processes belong to it and
 * its share of the pool.  Its partition is its own pool memory, core and
 * tiers (serve.c); a session's tenant comes from SO_PEERCRED. */
#define CFG_MAX_TENANTS 16
#define CFG_TENANT_NAME 32 /* 1..31 of [A-Za-z0-9_.-] */

typedef struct cfg_tenant {
  char name[CFG_TENANT_NAME];
  cfg_idlist uids;       /* user ids (names resolved when parsed) */
  cfg_idlist gids;       /* group ids: a peer's primary gid */
  /* The share: at most one of the three; none: an equal part of what the
   * tenants with a share leave. */
  uint32_t share_blocks; /* blocks=N */
  uint64_t share_bytes;  /* bytes=SIZE */
  double share_frac;     /* share=P% (0 < P <= 100), as a fraction */
} cfg_tenant;

typedef struct cfg {
  /* listening */
  char socket[CFG_SOCKET_MAX]; /* "" until cfg_finish fills the default
                                  (or, with socket_dir, run() names it) */
  char socket_dir[CFG_SOCKET_MAX]; /* run() names the socket in it */
  char socket_group[64];
  cfg_idlist allow_uids;
  cfg_idlist allow_gids;
  uint32_t max_connections;
  uint32_t max_tenant_connections; /* 0: max_connections / tenants */
  uint32_t max_requests;  /* per session */
  uint32_t max_batch_ops;
  uint64_t max_session_tokens;
  uint64_t max_tenant_tokens;  /* 0: 4 x max_session_tokens */
  uint64_t max_frame;
  uint64_t max_queued_bytes;
  /* the pool */
  char backend[16];
  char gpu[64];           /* UUID or ordinal; "" = the first device */
  double gpu_memory_fraction; /* 0: off */
  uint64_t gpu_reserve;
  uint64_t gpu_chunk_size;
  uint32_t pool_blocks;
  uint64_t pool_bytes;    /* 0: use pool_blocks */
  uint32_t block_size;
  uint32_t num_layers;
  uint32_t num_kv_heads;
  uint32_t head_dim;
  uint32_t dtype;         /* kvs_dtype */
  char model_id[128];
  /* the core */
  /* tiers below the pool */
  uint64_t host_tier_bytes; /* 0: none */
  char disk_tier[256];      /* "": none */
  uint64_t disk_tier_bytes;
  int disk_tier_persist;    /* keep and reread the disk tier's file */
  uint32_t tier_window;     /* 0: the core's default */
  uint32_t tier_promote_max;
  char tier_fault[128];     /* tests: tier_disk.h's fault spec */
  /* the remote tier (tier_remote.h) */
  char remote_tier[512];    /* "": none */
  char remote_tier_prefix[48];
  char remote_tier_password_file[256];
  uint32_t remote_tier_ttl_ms;
  uint32_t remote_tier_timeout_ms;
  uint64_t remote_tier_inflight_bytes;
  int remote_tier_write;
  uint32_t reserve_blocks;
  int verify_tokens;
  char policy[32];
  /* observability */
  char metrics_listen[128];   /* "": no /metrics */
  char kv_events_endpoint[256]; /* "": no KV events */
  char kv_events_replay_endpoint[256];
  char kv_events_topic[64];
  uint32_t kv_events_buffer;  /* event batches kept for replay */
  uint32_t kv_events_format;  /* 0 map (vLLM now), 1 array (older vLLM) */
  /* process */
  int log_level;          /* enum log_level */
  int ready_fd;           /* -1: none */
  int exit_with_parent;
  int dumpable;          /* yes: PR_SET_DUMPABLE left at 1 */
  uint32_t shutdown_timeout_ms;
  uint32_t handshake_timeout_ms;
  uint32_t frame_timeout_ms;
  uint64_t ring_bytes;   /* each way; 0: no rings */
  uint32_t ring_poll_us;
  uint32_t socket_poll_us; /* 0: sleep when no socket has a frame */
  /* tenants: none configured, every admitted peer is one tenant */
  uint32_t ntenants;
  cfg_tenant tenants[CFG_MAX_TENANTS];

  /* A partition's (daemon/part/partition.c), not an option: its tenant,
   * whose name salts the root hash of its core and tiers; "" without
   * tenants. */
  char part_tenant[CFG_TENANT_NAME];

  /* Derived by cfg_finish. */
  kvs_layout layout;
} cfg;

/* Fills c with the table's defaults. */
void cfg_init(cfg *c);

/* Sets one option from its text value.  key may use '-' or '_'.  A tenant
 * is checked against those already set (name, uids, gids) as it is
 * appended; against the other options in cfg_finish. */
int cfg_set(cfg *c, const char *key, const char *value, char *err,
            size_t err_len);

/* Parses a config file: `key = value`, blank lines, `#` comments (a `#`
 * that starts a line or follows white space), values optionally in double
 * quotes.  Errors name the file and line. */
int cfg_load_file(cfg *c, const char *path, char *err, size_t err_len);
/* The same over a string (for tests); name is used in error messages. */
int cfg_load_string(cfg *c, const char *text, const char *name, char *err,
                    size_t err_len);

/* What the command line asked for besides options. */
enum cfg_action {
  CFG_RUN = 0,
  CFG_HELP,         /* --help, -h */
  CFG_VERSION,      /* --version */
  CFG_PRINT_CONFIG, /* --print-config: the effective values */
  CFG_PRINT_EXAMPLE, /* --print-example-config: deploy/kvshared.conf */
};

/*
 * Parses argv[1..argc) (argv[0] is the program or the "serve" word): first
 * finds --config FILE and loads it, then applies every other --key value.
 * *action tells what to do next.
 */
int cfg_parse_args(cfg *c, int argc, char **argv, enum cfg_action *action,
                   char *err, size_t err_len);

/* Fills the defaults that depend on the environment (socket path) and
 * derives the layout (pool_bytes -> number of blocks).  With
 * gpu_memory_fraction the number of blocks is known only once the GPU is
 * open: the backend sets it (backend_open).  Refuses tenants beside
 * allow_uids or allow_gids, percent shares over 100%, and, when the pool's
 * size is known, shares cfg_tenant_blocks refuses. */
int cfg_finish(cfg *c, char *err, size_t err_len);

/* The default socket path: $XDG_RUNTIME_DIR/kvshare/kvshared.sock when that
 * variable is set to an absolute path, else /run/kvshare/kvshared.sock. */
void cfg_default_socket(char *out, size_t len);

/* The least reserve of demoted blocks kept over a disk tier
 * (cfg_tier_window): about 30 ms of an NVMe drive's writes. */
#define CFG_DISK_WINDOW_BYTES (64ull << 20)

/* The core's tier_window for a pool of num_blocks blocks of block_stride
 * bytes: c's tier_window when set; with a disk tier, num_blocks / 16
 * raised to CFG_DISK_WINDOW_BYTES of blocks but not past a quarter of the
 * pool, and at least 8 (never more than the pool); else 0 (the core's
 * default: num_blocks / 16, at least 8). */
uint32_t cfg_tier_window(const cfg *c, uint32_t num_blocks,
                         uint64_t block_stride);

/* The address of a listening option's value (metrics_listen): HOST:PORT,
 * [IPV6]:PORT or *:PORT (every interface: the IPv6 wildcard, dual stack).
 * HOST is a name, resolved with getaddrinfo (the first address), or a
 * numeric address.  0, or KVS_EINVAL with the reason in err. */
int cfg_listen_addr(const char *spec, struct sockaddr_storage *ss,
                    socklen_t *sl, char *err, size_t err_len);

/* Is this peer allowed (uid 0, the daemon's own uid, or in the lists; with
 * tenants, in a tenant)? */
int cfg_peer_allowed(const cfg *c, uid_t uid, gid_t gid, uid_t self);

/* The tenant of a peer: the index of the tenant listing its uid, else of
 * the one listing its gid; -1 when none does (or no tenant is configured). */
int cfg_tenant_of(const cfg *c, uid_t uid, gid_t gid);

/* Each tenant's share in blocks of a pool of pool_blocks blocks of
 * block_stride bytes, into blocks[0..ntenants): blocks=N as given,
 * bytes=SIZE rounded down to whole blocks, share=P% of pool_blocks rounded
 * down; the tenants without a share split what is left equally (the
 * remainder of the division stays unused).  KVS_EINVAL with the reason
 * when the shares add up to more than the pool, or a tenant would get
 * fewer than CFG_TENANT_MIN_BLOCKS blocks or not more than reserve_blocks. */
#define CFG_TENANT_MIN_BLOCKS 4
int cfg_tenant_blocks(const cfg *c, uint32_t pool_blocks, uint64_t block_stride,
                      uint32_t *blocks, char *err, size_t err_len);

void cfg_print_help(FILE *out, const char *prog);
/* The annotated example config: every option, commented out, with its
 * default and help. */
void cfg_print_example(FILE *out);
/* The effective configuration, one `key = value` line each. */
void cfg_print_values(FILE *out, const cfg *c);

#endif
