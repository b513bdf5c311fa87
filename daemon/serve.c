/*
 * serve.c — `kvshared [serve]`: configuration, the pool, the core, the
 * tiers, the listening socket, signals and shutdown.  The top of the
 * daemon: it opens every room below it and wires them together (sessions
 * in net/, ops in dispatch/, the tiers in tiers/, the pool in pool/,
 * metrics and KV events in observe/); nothing below calls back up here but
 * through the functions it hands down.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "daemon/dispatch/dispatch.h"
#include "daemon/log.h"
#include "daemon/net/ring.h"
#include "daemon/net/session.h"
#include "daemon/observe/events.h"
#include "daemon/observe/metrics.h"
#include "daemon/part/partition.h"
#include "daemon/pool/backend.h"
#include "daemon/pool/copy.h"
#include "daemon/serve.h"
#include "daemon/tiers/tiers.h"
#include "kvs_frame.h"
#include "kvs_shm.h"

#define KVSHARED_VERSION "0.1"

typedef struct srv {
  uv_loop_t *loop;
  uv_pipe_t listener;
  uv_signal_t sig_term, sig_int;
  uv_timer_t drain_timer;
  uv_timer_t sweep_timer; /* closes connections that never say Hello or
                             stall mid-frame */
  const cfg *cfg;
  kvs_layout layout;       /* the whole pool's (every partition's blocks) */
  /* One partition per tenant (one without tenants): pool, core, copy
   * engine, tiers, and what its sessions' ops run against. */
  partition parts[CFG_MAX_TENANTS];
  uint32_t nparts;
  disp_env *envs[CFG_MAX_TENANTS];
  disp_env observer;       /* the sessions of peers in no tenant */
  metrics *metrics;        /* /metrics; NULL: off */
  events *events;          /* the KV event stream; NULL: off */
  rings *rings;            /* request rings; NULL: off */
  sess_hub hub;            /* the sessions */
  int null_fd;             /* /dev/null, for releasing ready_fd; or -1 */
  int stopping;
  int socket_passed;       /* the listener came from systemd: never
                              unlinked */
} srv;

/* mkdir -p of the socket's folder (mode 0755 for what it creates). */
static int make_parent(const char *path) {
  char dir[CFG_SOCKET_MAX];
  char *p;

  snprintf(dir, sizeof(dir), "%s", path);
  p = strrchr(dir, '/');
  if (!p || p == dir)
    return 0;
  *p = '\0';
  for (p = dir + 1; *p; p++) {
    if (*p != '/')
      continue;
    *p = '\0';
    if (mkdir(dir, 0755) < 0 && errno != EEXIST)
      return -errno;
    *p = '/';
  }
  if (mkdir(dir, 0755) < 0 && errno != EEXIST)
    return -errno;
  return 0;
}

/*
 * A socket file left at path: live (another daemon answers) is an error;
 * stale (connection refused) is removed; anything but a socket is an error.
 */
static int check_stale(const char *path) {
  struct sockaddr_un sa;
  struct stat st;
  int fd, rc;

  if (lstat(path, &st) < 0) {
    if (errno == ENOENT)
      return 0;
    rc = -errno;
    log_error(rc, "the socket %s", path);
    return rc;
  }
  if (!S_ISSOCK(st.st_mode)) {
    log_error(0, "%s exists and is not a socket", path);
    return KVS_EEXIST;
  }
  fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -errno;
  memset(&sa, 0, sizeof(sa));
  sa.sun_family = AF_UNIX;
  snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
  rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
  if (rc == 0) {
    close(fd);
    log_error(0, "%s: another daemon is listening there", path);
    return KVS_EEXIST;
  }
  rc = errno;
  close(fd);
  if (rc != ECONNREFUSED) {
    log_error(rc, "%s: cannot tell whether the socket is stale", path);
    return -rc;
  }
  if (unlink(path) < 0 && errno != ENOENT)
    return -errno;
  log_info(0, "removed the stale socket %s", path);
  return 0;
}

static int resolve_group(const char *name, gid_t *gid) {
  struct group *g;
  char *end;
  unsigned long v;

  errno = 0;
  v = strtoul(name, &end, 10);
  if (!errno && end != name && !*end) {
    *gid = (gid_t)v;
    return 0;
  }
  g = getgrnam(name); /* at start-up, before the loop runs */
  if (!g)
    return KVS_ENOENT;
  *gid = g->gr_gid;
  return 0;
}

/*
 * Socket activation.  systemd (or systemd-socket-activate) may start the
 * daemon with its listening socket already made: LISTEN_FDS=1, LISTEN_PID
 * ours, the socket at fd 3 (SD_LISTEN_FDS_START).  The daemon then serves
 * that socket as it is: it does not create, chmod, chown or unlink it (its
 * path, mode and group are the socket unit's).
 *
 * activation_check runs in serve_main, before the loop: it refuses anything
 * but exactly one AF_UNIX SOCK_STREAM socket that listens on a path, and
 * makes that path the configured socket, so that every log line, `ready` and
 * READY=1 name the socket really served.  A socket set by --socket or the
 * config file that differs is overridden with a warning: systemd owns the
 * socket and clients may already wait on it.  It leaves LISTEN_FDS in the
 * environment for take_passed_socket.  Returns 0 (not activated), 1, or a
 * negative status (logged).
 */
static int activation_check(cfg *c, int socket_given) {
  struct sockaddr_un sa;
  socklen_t len = sizeof(sa);
  const int fd = SD_LISTEN_FDS_START;
  int n, rc;

  n = sd_listen_fds(0);
  if (n == 0)
    return 0;
  if (n < 0) {
    log_error(n, "socket activation: bad LISTEN_FDS/LISTEN_PID");
    return n;
  }
  if (c->socket_dir[0]) {
    log_error(0, "socket activation: socket_dir names the socket by the "
              "pool's GPU, but systemd passed one already made (drop "
              "socket_dir, or the socket unit)");
    return KVS_EINVAL;
  }
  if (n != 1) {
    log_error(0, "socket activation: %d descriptors passed (LISTEN_FDS=%d); "
              "kvshared takes exactly one listening Unix socket (one "
              "ListenStream= in kvshared.socket)", n, n);
    return KVS_EINVAL;
  }
  rc = sd_is_socket_unix(fd, 0, -1, NULL, 0);
  if (rc <= 0) {
    log_error(rc, "socket activation: fd %d is not a Unix socket", fd);
    return rc < 0 ? rc : KVS_EINVAL;
  }
  if (sd_is_socket_unix(fd, SOCK_STREAM, -1, NULL, 0) <= 0) {
    log_error(0, "socket activation: fd %d is not a stream socket (use "
              "ListenStream=)", fd);
    return KVS_EINVAL;
  }
  if (sd_is_socket_unix(fd, SOCK_STREAM, 1, NULL, 0) <= 0) {
    log_error(0, "socket activation: fd %d is not listening (a connection? "
              "use Accept=no)", fd);
    return KVS_EINVAL;
  }
  memset(&sa, 0, sizeof(sa));
  if (getsockname(fd, (struct sockaddr *)&sa, &len) < 0) {
    rc = -errno;
    log_error(rc, "socket activation: getsockname of fd %d", fd);
    return rc;
  }
  if (len <= offsetof(struct sockaddr_un, sun_path) || !sa.sun_path[0]) {
    log_error(0, "socket activation: fd %d is an unnamed or abstract socket; "
              "kvshared serves a socket with a path", fd);
    return KVS_EINVAL;
  }
  if (strnlen(sa.sun_path, sizeof(sa.sun_path)) >= sizeof(c->socket)) {
    log_error(0, "socket activation: the path of fd %d is too long", fd);
    return KVS_EINVAL;
  }
  if (strcmp(c->socket, sa.sun_path) != 0) {
    if (socket_given)
      log_warn(0, "socket activation: serving the socket systemd passed, %s, "
               "not the configured socket %s", sa.sun_path, c->socket);
    snprintf(c->socket, sizeof(c->socket), "%s", sa.sun_path);
  }
  if (c->socket_group[0])
    log_warn(0, "socket activation: socket_group '%s' is ignored (the "
             "socket unit's SocketGroup= owns %s)", c->socket_group,
             c->socket);
  return 1;
}

/* Takes over the socket activation_check accepted. */
static int take_passed_socket(srv *s) {
  const cfg *c = s->cfg;
  struct stat st;
  int rc;

  if (sd_listen_fds(1) != 1)
    return KVS_EINVAL; /* activation_check said otherwise */
  rc = uv_pipe_init(s->loop, &s->listener, 0);
  if (rc < 0)
    return rc;
  s->listener.data = s;
  rc = uv_pipe_open(&s->listener, SD_LISTEN_FDS_START);
  if (rc < 0) {
    log_error(rc, "socket activation: uv_pipe_open fd %d",
              SD_LISTEN_FDS_START);
    return rc;
  }
  s->socket_passed = 1;
  if (stat(c->socket, &st) < 0) {
    /* Someone removed the file: the socket still works for whoever holds
     * it, and nobody else can reach it. */
    log_warn(errno, "socket activation: %s (fd %d)", c->socket,
             SD_LISTEN_FDS_START);
  } else {
    log_info(0, "socket activation: serving %s (fd %d from systemd, mode "
             "%04o, uid %u, gid %u)", c->socket, SD_LISTEN_FDS_START,
             (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid,
             (unsigned)st.st_gid);
    if (st.st_mode & 0002) /* connect needs write permission */
      log_warn(0, "%s: every user may connect (SocketMode=0660 is meant); "
               "peers are still checked with SO_PEERCRED", c->socket);
  }
  return 0;
}

static void on_connection(uv_stream_t *listener, int status) {
  srv *s = listener->data;

  if (status < 0) {
    log_warn(status, "listener");
    return;
  }
  if (s->stopping)
    return;
  sess_accept(&s->hub, listener);
}

/* Creates the socket at the configured path (no socket activation). */
static int bind_socket(srv *s) {
  const cfg *c = s->cfg;
  mode_t old;
  int rc;

  rc = make_parent(c->socket);
  if (rc < 0) {
    log_error(rc, "creating the folder of %s", c->socket);
    return rc;
  }
  rc = check_stale(c->socket);
  if (rc < 0)
    return rc;
  rc = uv_pipe_init(s->loop, &s->listener, 0);
  if (rc < 0)
    return rc;
  s->listener.data = s;
  /* The socket is born 0660: no window where others could connect. */
  old = umask(0117);
  rc = uv_pipe_bind(&s->listener, c->socket);
  umask(old);
  if (rc < 0) {
    log_error(rc, "bind %s", c->socket);
    return rc;
  }
  if (chmod(c->socket, 0660) < 0) {
    rc = -errno;
    log_error(rc, "chmod %s", c->socket);
    return rc;
  }
  if (c->socket_group[0]) {
    gid_t gid;

    if (resolve_group(c->socket_group, &gid) < 0) {
      log_error(0, "socket_group '%s': no such group", c->socket_group);
      return KVS_ENOENT;
    }
    if (chown(c->socket, (uid_t)-1, gid) < 0) {
      rc = -errno;
      log_error(rc, "chown %s to group %s", c->socket, c->socket_group);
      return rc;
    }
  }
  return 0;
}

static int start_listening(srv *s) {
  int rc;

  /* LISTEN_FDS is left set only when activation_check accepted the one
   * socket systemd passed. */
  if (sd_listen_fds(0) > 0)
    rc = take_passed_socket(s);
  else
    rc = bind_socket(s);
  if (rc < 0)
    return rc;
  rc = uv_listen((uv_stream_t *)&s->listener, SOMAXCONN, on_connection);
  if (rc < 0) {
    log_error(rc, "listen %s", s->cfg->socket);
    return rc;
  }
  return 0;
}

static void on_handle_closed(uv_handle_t *h) { (void)h; }

static void close_handle(uv_handle_t *h) {
  if (h->loop && !uv_is_closing(h))
    uv_close(h, on_handle_closed);
}

/* Stops accepting.  The socket file goes, unless systemd passed it: it is
 * the socket unit's, and a restarted daemon gets the same socket again. */
static void stop_listening(srv *s) {
  sd_notify(0, "STOPPING=1");
  close_handle((uv_handle_t *)&s->listener);
  if (!s->socket_passed)
    unlink(s->cfg->socket);
}

/* No copy and no tier move in flight. */
static int srv_io_idle(const srv *s) {
  for (uint32_t i = 0; i < s->nparts; i++)
    if (!part_io_idle(&s->parts[i]))
      return 0;
  return 1;
}

/* No copy in flight (tier I/O may be). */
static int srv_copies_idle(const srv *s) {
  for (uint32_t i = 0; i < s->nparts; i++)
    if (s->parts[i].copy_open && !copy_idle(&s->parts[i].copy))
      return 0;
  return 1;
}

static void stop_observers(srv *s);

static void on_drain_timeout(uv_timer_t *t) {
  srv *s = t->data;

  if (!s->hub.sessions && !srv_io_idle(s)) {
    if (srv_copies_idle(s)) {
      /* Only the tiers' own I/O is left: disk reads and writes of their
       * staging buffers, remote answers.  None touches the pool; a slot
       * left half written fails its checksum at the next start (counted
       * torn).  A slow or failing disk must not turn a clean stop into a
       * failure. */
      log_warn(0, "shutdown: tier I/O still in flight %u ms after the "
               "sessions closed (a slow disk or remote server); exiting "
               "without it", s->cfg->shutdown_timeout_ms);
      /* What a clean stop does but wait: the last events (and
       * AllBlocksCleared) go out, the writes that did complete are made
       * durable. */
      stop_observers(s);
      for (uint32_t i = 0; i < s->nparts; i++)
        tiers_abandon(s->parts[i].tiers);
      _exit(0);
    }
    /* Sessions are gone and the copies have had a second timeout: only a
     * hung GPU gets here.  The pool cannot be released while the GPU may
     * still write it, and waiting could be forever: leave now (the driver
     * reclaims the memory with the process). */
    log_error(0, "shutdown: copies still in flight %u ms after the "
              "sessions closed; exiting without them",
              s->cfg->shutdown_timeout_ms);
    _exit(1);
  }
  if (s->hub.sessions)
    log_warn(0, "shutdown: replies still queued after %u ms; closing anyway",
             s->cfg->shutdown_timeout_ms);
  sess_shutdown_all(&s->hub, 1);
  /* Copies still running get one more timeout. */
  if (!srv_io_idle(s))
    uv_timer_start(&s->drain_timer, on_drain_timeout,
                   s->cfg->shutdown_timeout_ms, 0);
}

/* One scrape's numbers, from every room (on the loop; metrics.h): the
 * partitions' added up. */
static void snapshot(void *arg, metrics_snap *o) {
  const srv *s = arg;
  const partition *p0 = &s->parts[0];

  memset(&o->core, 0, sizeof(o->core));
  o->ntiers = 0;
  o->remote_on = 0;
  memset(&o->rs, 0, sizeof(o->rs));
  memset(o->th, 0, sizeof(o->th));
  o->copies = o->copy_blocks = o->copy_errors = o->pool_bytes = 0;
  o->ntenants = 0;
  for (uint32_t i = 0; i < s->nparts; i++) {
    const partition *p = &s->parts[i];
    tiers_stats ts[TIERS_MAX];
    tier_hist th[TIER_HISTS];
    tier_remote_stats rs;
    core_stats st;
    uint32_t nt = 0;

    core_get_stats(p->core, &st);
    core_stats_add(&o->core, &st);
    tiers_get_stats(p->tiers, ts, &nt);
    tiers_stats_add(o->tiers, &o->ntiers, ts, nt);
    if (tiers_remote_stats(p->tiers, &rs) == 0) {
      o->remote_on = 1;
      tier_remote_stats_add(&o->rs, &rs);
    }
    tiers_get_hists(p->tiers, th);
    for (uint32_t h = 0; h < TIER_HISTS; h++)
      tier_hist_merge(&o->th[h], &th[h]);
    o->copies += p->copy.jobs;
    o->copy_blocks += p->copy.blocks;
    o->copy_errors += p->copy.errors;
    o->pool_bytes += p->pool->ex.size;
    if (s->cfg->ntenants) {
      metrics_tenant *t = &o->tenants[o->ntenants++];

      snprintf(t->name, sizeof(t->name), "%s", p->name);
      t->core = st;
      t->sessions = p->disp.own.sessions;
      t->pool_bytes = p->pool->ex.size;
    }
  }
  o->events_on = s->events != NULL;
  events_get_stats(s->events, &o->ev);
  o->sessions = s->hub.counts.sessions;
  o->frames_in = s->hub.counts.frames_in;
  o->compact_frames = s->hub.counts.compact_frames;
  o->protocol_errors = s->hub.counts.protocol_errors;
  o->queued = s->hub.counts.queued_bytes;
  o->rings_on = s->rings != NULL;
  rings_counts(s->rings, &o->ring_requests, &o->ring_socket_replies,
               &o->ring_wakeups);
  o->block_size = s->layout.block_size;
  snprintf(o->backend, sizeof(o->backend), "%s", p0->pool->ex.backend);
  snprintf(o->gpu_uuid, sizeof(o->gpu_uuid), "%s", p0->pool->ex.gpu_uuid);
  snprintf(o->policy, sizeof(o->policy), "%s", s->cfg->policy);
  snprintf(o->model_id, sizeof(o->model_id), "%s", s->cfg->model_id);
  snprintf(o->version, sizeof(o->version), "%s", KVSHARED_VERSION);
}

static int keys_begin(void *arg, const kvs_op *op, uint32_t first, char *err,
                      size_t len) {
  return events_keys_begin(((srv *)arg)->events, op, first, err, len);
}

static void keys_end(void *arg) { events_keys_end(((srv *)arg)->events); }

/* The KV event stream and /metrics, before the listening socket (no session
 * can change the index before AllBlocksCleared goes out; a failure leaves
 * no socket behind). */
static int start_observers(srv *s) {
  core *cores[CFG_MAX_TENANTS];
  char err[256];

  for (uint32_t i = 0; i < s->nparts; i++)
    cores[i] = s->parts[i].core;
  if (events_open(s->loop, s->cfg, cores, s->nparts,
                  strcmp(s->parts[0].pool->ex.backend, "cuda") == 0 ? "GPU"
                                                                   : "CPU",
                  s->layout.block_size, &s->events, err, sizeof(err)) < 0) {
    log_error(0, "kv events: %s", err);
    return KVS_EINVAL;
  }
  if (metrics_start(s->loop, s->cfg, snapshot, s, &s->metrics, err,
                    sizeof(err)) < 0) {
    log_error(0, "metrics: %s", err);
    return KVS_EINVAL;
  }
  s->hub.metrics = s->metrics;
  if (s->events) {
    for (uint32_t i = 0; i < s->nparts; i++) {
      s->parts[i].disp.keys_begin = keys_begin;
      s->parts[i].disp.keys_end = keys_end;
      s->parts[i].disp.keys_arg = s;
    }
  }
  return 0;
}

static void stop_observers(srv *s) {
  metrics_stop(s->metrics);
  s->metrics = NULL;
  s->hub.metrics = NULL;
  events_close(s->events);
  s->events = NULL;
}

/* The tiers and the copy engine (all idle) close. */
static void close_movers(srv *s) {
  for (uint32_t i = 0; i < s->nparts; i++)
    part_stop_movers(&s->parts[i]);
}

/* A stopping daemon is done when no session and no copy is left: the
 * last handles close and uv_run returns. */
static void srv_maybe_done(srv *s) {
  if (!s->stopping || s->hub.sessions || !srv_io_idle(s))
    return;
  close_handle((uv_handle_t *)&s->drain_timer);
  close_movers(s);
  stop_observers(s);
}

/* A session is gone, or the last move in flight ended. */
static void on_io_done(void *data) { srv_maybe_done(data); }

static void srv_stop(srv *s, const char *why) {
  if (s->stopping)
    return;
  s->stopping = s->hub.stopping = 1;
  for (uint32_t i = 0; i < s->nparts; i++)
    s->parts[i].disp.stopping = 1;
  log_info(0, "%s: stopping (%u sessions)", why, s->hub.counts.sessions);
  stop_listening(s);
  /* Closing a signal handle restores the default action: a second signal
   * ends the process at once. */
  close_handle((uv_handle_t *)&s->sig_term);
  close_handle((uv_handle_t *)&s->sig_int);
  close_handle((uv_handle_t *)&s->sweep_timer);
  for (uint32_t i = 0; i < s->nparts; i++)
    tiers_stop(s->parts[i].tiers);
  rings_stop(s->rings);
  s->rings = s->hub.rings = NULL;
  sockpoll_close(&s->hub.poll);
  sess_shutdown_all(&s->hub, 0);
  if (s->hub.sessions || !srv_io_idle(s))
    uv_timer_start(&s->drain_timer, on_drain_timeout,
                   s->cfg->shutdown_timeout_ms, 0);
  else
    srv_maybe_done(s);
}

static void on_sweep_timer(uv_timer_t *t) {
  srv *s = t->data;

  sess_sweep(&s->hub);
}

static void on_signal(uv_signal_t *h, int signum) {
  srv_stop(h->data, signum == SIGTERM ? "SIGTERM" : "SIGINT");
}

/* Tells whoever started the daemon that it listens.  The ready descriptor
 * is released by pointing it at /dev/null in one dup3: the reader sees end
 * of file, and from then on the daemon's descriptor table does not change
 * until a client connects (tests count it).  nul is opened before and kept,
 * for the same reason. */
static void announce_ready(srv *s) {
  const cfg *c = s->cfg;

  if (c->ready_fd >= 0) {
    static const char msg[] = "ready\n";
    ssize_t n;

    do
      n = write(c->ready_fd, msg, sizeof(msg) - 1);
    while (n < 0 && errno == EINTR);
    if (n < 0)
      log_warn(errno, "ready_fd %d", c->ready_fd);
    if (s->null_fd < 0 || dup3(s->null_fd, c->ready_fd, O_CLOEXEC) < 0)
      close(c->ready_fd);
  }
  printf("ready %s\n", c->socket);
  fflush(stdout);
  /* Type=notify; nothing happens without NOTIFY_SOCKET. */
  sd_notifyf(0, "READY=1\nSTATUS=listening on %s", c->socket);
}

/* What can be checked before the pool is allocated (which takes long on a
 * GPU): the socket's folder, the tiers' paths and URL.  (The options' forms,
 * endpoints and the metrics address were checked as they were read.) */
/* 0 when a TCP socket could be bound at ss now (it is closed again), else
 * -errno.  Port 0 is always free. */
static int probe_bind(const struct sockaddr_storage *ss, socklen_t sl) {
  int fd, one = 1, zero = 0, rc = 0;

  if ((ss->ss_family == AF_INET &&
       ((const struct sockaddr_in *)ss)->sin_port == 0) ||
      (ss->ss_family == AF_INET6 &&
       ((const struct sockaddr_in6 *)ss)->sin6_port == 0))
    return 0;
  fd = socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return 0; /* (the real bind will say) */
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (ss->ss_family == AF_INET6)
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
  if (bind(fd, (const struct sockaddr *)ss, sl) < 0)
    rc = -errno;
  close(fd);
  return rc;
}

/* A tcp:// ZMQ endpoint's address, as the metrics address is read
 * (cfg_listen_addr; the options allow only *, numeric addresses and
 * interfaces, and an interface or a port * is not probed): 0, else -1.
 * libzmq binds * as IPv4's every interface. */
static int zmq_tcp_addr(const char *ep, struct sockaddr_storage *ss,
                        socklen_t *sl) {
  char err[256];

  if (strncmp(ep, "tcp://", 6) != 0 ||
      cfg_listen_addr(ep + 6, ss, sl, err, sizeof(err)) < 0)
    return -1;
  if (ss->ss_family == AF_INET6 &&
      IN6_IS_ADDR_UNSPECIFIED(&((struct sockaddr_in6 *)ss)->sin6_addr) &&
      strncmp(ep + 6, "*:", 2) == 0) {
    uint16_t port = ((struct sockaddr_in6 *)ss)->sin6_port;
    struct sockaddr_in *a = (struct sockaddr_in *)ss;

    memset(ss, 0, sizeof(*ss));
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_ANY);
    a->sin_port = port;
    *sl = sizeof(*a);
  }
  return 0;
}

/* The observers' TCP ports, tried before the pool is made (a busy port
 * said at once, not after minutes of zeroing a GPU pool).  The real binds
 * come later and may still fail: this only says early what it can. */
static int probe_ports(const cfg *c) {
  const char *eps[2] = {c->kv_events_endpoint, c->kv_events_replay_endpoint};
  struct sockaddr_storage ss;
  socklen_t sl;
  char err[256];
  int rc;

  if (c->metrics_listen[0] &&
      cfg_listen_addr(c->metrics_listen, &ss, &sl, err, sizeof(err)) == 0 &&
      (rc = probe_bind(&ss, sl)) < 0) {
    log_error(rc, "metrics: cannot serve metrics on %s", c->metrics_listen);
    return KVS_EINVAL;
  }
  for (int i = 0; i < 2; i++)
    if (eps[i][0] && zmq_tcp_addr(eps[i], &ss, &sl) == 0 &&
        (rc = probe_bind(&ss, sl)) < 0) {
      log_error(rc, "kv events: cannot bind %s", eps[i]);
      return KVS_EINVAL;
    }
  return 0;
}

static int preflight(const cfg *c) {
  char err[512], dir[CFG_SOCKET_MAX], *slash;
  int rc;

  rc = tiers_check(c, err, sizeof(err));
  if (rc < 0) {
    log_error(0, "%s", err);
    return rc;
  }
  if ((rc = probe_ports(c)) < 0)
    return rc;
  if (sd_listen_fds(0) > 0) /* the socket comes from systemd */
    return 0;
  if (c->socket_dir[0] && !c->socket[0]) {
    /* (the socket's name comes with the pool: its folder now) */
    struct stat st;
    char probe[CFG_SOCKET_MAX + 2];

    snprintf(probe, sizeof(probe), "%s/x", c->socket_dir);
    if ((rc = make_parent(probe)) < 0 && rc != -ENOTDIR) {
      log_error(rc, "socket_dir %s", c->socket_dir);
      return rc;
    }
    if (stat(c->socket_dir, &st) < 0 || !S_ISDIR(st.st_mode)) {
      log_error(0, "socket_dir %s: not a folder", c->socket_dir);
      return KVS_EINVAL;
    }
    if (access(c->socket_dir, W_OK | X_OK) < 0) {
      rc = -errno;
      log_error(rc, "socket_dir %s", c->socket_dir);
      return rc;
    }
    return 0;
  }
  rc = make_parent(c->socket);
  if (rc < 0) {
    log_error(rc, "creating the folder of %s", c->socket);
    return rc;
  }
  snprintf(dir, sizeof(dir), "%s", c->socket);
  slash = strrchr(dir, '/');
  if (slash && slash != dir) {
    struct stat st;

    *slash = '\0';
    if (stat(dir, &st) == 0 && !S_ISDIR(st.st_mode)) {
      log_error(0, "the socket %s: %s is not a folder", c->socket, dir);
      return KVS_EINVAL;
    }
    if (access(dir, W_OK | X_OK) < 0) {
      rc = -errno;
      log_error(rc, "the socket %s: its folder %s", c->socket, dir);
      return rc;
    }
  }
  return check_stale(c->socket);
}

/* socket_dir: the socket is named by the pool's GPU (kvs_frame.h).
 * Returns 0 or KVS_EINVAL (logged) when the path does not fit. */
static int name_socket(cfg *c, const backend *pool) {
  const char *uuid = pool->ex.gpu_uuid;
  int n;

  if (uuid && uuid[0])
    n = snprintf(c->socket, sizeof(c->socket), "%s/%s" KVS_SOCKET_GPU_SUFFIX,
                 c->socket_dir, uuid);
  else
    n = snprintf(c->socket, sizeof(c->socket), "%s/" KVS_SOCKET_HOST_NAME,
                 c->socket_dir);
  if (n < 0 || (size_t)n >= sizeof(c->socket)) {
    log_error(0, "socket_dir %s: the socket's path for GPU %s is too long",
              c->socket_dir, uuid);
    return KVS_EINVAL;
  }
  return 0;
}

/* The partitions' pools and cores: one per tenant, or one for everyone.
 * 0, or -1 (logged; run() closes what was opened). */
static int open_partitions(srv *s, cfg *c) {
  uint32_t blocks[CFG_MAX_TENANTS];
  char err[256];

  if (c->ntenants == 0) {
    s->nparts = 1;
    if (part_open(&s->parts[0], c, 0, c->layout.num_blocks,
                  c->layout.num_blocks) < 0)
      return -1;
    s->layout = s->parts[0].layout; /* (gpu_memory_fraction: set now) */
    return 0;
  }
  if (cfg_tenant_blocks(c, c->layout.num_blocks, c->layout.block_stride,
                        blocks, err, sizeof(err)) < 0) {
    log_error(0, "tenants: %s", err);
    return -1;
  }
  s->layout.num_blocks = 0;
  for (uint32_t i = 0; i < c->ntenants; i++) {
    s->nparts = i + 1;
    if (part_open(&s->parts[i], c, i, blocks[i], c->layout.num_blocks) < 0)
      return -1;
    s->layout.num_blocks += blocks[i];
  }
  if (kvs_layout_finish(&s->layout) != 0) {
    log_error(0, "tenants: the partitions' layout");
    return -1;
  }
  return 0;
}

/* Copy engines and tiers, on the loop; the sessions' envs.  0 or -1. */
static int start_partitions(srv *s) {
  for (uint32_t i = 0; i < s->nparts; i++) {
    partition *p = &s->parts[i];

    if (part_start(p, s->loop, &s->hub.counts) < 0)
      return -1;
    if (p->tiers)
      tiers_set_idle_cb(p->tiers, on_io_done, s);
    s->envs[i] = &p->disp;
  }
  /* An observer's env: no core; its Stats adds up the partitions. */
  s->observer = s->parts[0].disp;
  s->observer.core = NULL;
  s->observer.tiers = NULL;
  s->observer.layout = s->layout;
  s->observer.cfg = s->cfg;
  s->observer.tenant = "";
  memset(&s->observer.own, 0, sizeof(s->observer.own));
  s->observer.parts = s->envs;
  s->observer.nparts = s->nparts;
  s->hub.parts = s->envs;
  s->hub.nparts = s->nparts;
  s->hub.observer = &s->observer;
  return 0;
}

static int run(cfg *c) {
  uv_loop_t loop;
  srv s;
  int rc, status = 1;

  memset(&s, 0, sizeof(s));
  s.cfg = c;
  s.null_fd = c->ready_fd >= 0 ? open("/dev/null", O_RDONLY | O_CLOEXEC) : -1;
  s.layout = c->layout;

  if (preflight(c) < 0)
    goto out_pool;
  if (open_partitions(&s, c) < 0)
    goto out_pool;
  if (c->socket_dir[0] && !c->socket[0] && name_socket(c, s.parts[0].pool) < 0)
    goto out_pool;
  rc = uv_loop_init(&loop);
  if (rc < 0) {
    log_error(rc, "uv_loop_init");
    goto out_pool;
  }
  s.loop = &loop;
  if (start_partitions(&s) < 0) {
    close_movers(&s);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    goto out_pool;
  }
  s.hub.loop = &loop;
  s.hub.cfg = c;
  s.hub.self_uid = getuid();
  s.hub.on_gone = on_io_done;
  s.hub.data = &s;
  uv_signal_init(&loop, &s.sig_term);
  uv_signal_init(&loop, &s.sig_int);
  uv_timer_init(&loop, &s.drain_timer);
  uv_timer_init(&loop, &s.sweep_timer);
  s.sig_term.data = s.sig_int.data = s.drain_timer.data = &s;
  s.sweep_timer.data = &s;
  uv_signal_start(&s.sig_term, on_signal, SIGTERM);
  uv_signal_start(&s.sig_int, on_signal, SIGINT);

  rc = rings_start(&loop, c, &sess_ring_ops, &s.rings);
  if (rc < 0)
    log_error(rc, "request rings (ring_bytes)");
  s.hub.rings = s.rings;
  if (rc == 0)
    rc = start_observers(&s);
  if (rc == 0)
    rc = start_listening(&s);
  if (rc < 0) {
    s.stopping = 1;
    rings_stop(s.rings);
    s.rings = s.hub.rings = NULL;
    stop_observers(&s);
    close_handle((uv_handle_t *)&s.listener);
    close_handle((uv_handle_t *)&s.sig_term);
    close_handle((uv_handle_t *)&s.sig_int);
    close_handle((uv_handle_t *)&s.drain_timer);
    close_handle((uv_handle_t *)&s.sweep_timer);
    close_movers(&s);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    goto out_pool;
  }
  log_info(0, "listening on %s: %s pool of %u blocks of %u tokens (%s, %u "
              "layers, %u kv heads, head_dim %u, %llu bytes per block, %llu "
              "MiB%s%u%s)",
           c->socket, s.parts[0].pool->ex.backend, s.layout.num_blocks,
           s.layout.block_size,
           kvs_dtype_name(s.layout.dtype), s.layout.num_layers,
           s.layout.num_kv_heads, s.layout.head_dim,
           (unsigned long long)s.layout.block_stride,
           (unsigned long long)(kvs_pool_bytes(&s.layout) >> 20),
           c->ntenants ? ", " : "", c->ntenants,
           c->ntenants ? " tenants" : "");
  if (c->handshake_timeout_ms || c->frame_timeout_ms) {
    /* A sweep every quarter of the shorter timeout: a silent connection
     * goes between 1 and 1.25 timeouts after it fell silent. */
    uint64_t t = c->handshake_timeout_ms, every;

    if (!t || (c->frame_timeout_ms && c->frame_timeout_ms < t))
      t = c->frame_timeout_ms;
    every = t / 4 ? t / 4 : 1;
    uv_timer_start(&s.sweep_timer, on_sweep_timer, every, every);
  }
  sockpoll_init(&s.hub.poll, &loop, c->socket_poll_us);
  announce_ready(&s);

  uv_run(&loop, UV_RUN_DEFAULT);

  /* Every session is closed and its requests freed: every partition's pool
   * must be whole. */
  status = 0;
  for (uint32_t i = 0; i < s.nparts; i++)
    if (part_check_exit(&s.parts[i]) < 0)
      status = 1;
  if (status == 0)
    log_info(0, "stopped cleanly (%llu frames, %llu protocol errors)",
             (unsigned long long)s.hub.counts.frames_in,
             (unsigned long long)s.hub.counts.protocol_errors);
  rc = uv_loop_close(&loop);
  if (rc < 0) {
    log_error(rc, "uv_loop_close");
    status = 1;
  }
out_pool:
  sess_hub_free(&s.hub);
  for (uint32_t i = 0; i < s.nparts; i++)
    part_close(&s.parts[i]);
  if (s.null_fd >= 0)
    close(s.null_fd);
  return status;
}

int serve_main(int argc, char **argv) {
  enum cfg_action action;
  char err[512];
  int socket_given;
  cfg c;

  cfg_init(&c);
  if (cfg_parse_args(&c, argc, argv, &action, err, sizeof(err)) < 0) {
    fprintf(stderr, "kvshared: %s\n", err);
    return 2;
  }
  switch (action) {
  case CFG_HELP:
    cfg_print_help(stdout, "kvshared");
    return 0;
  case CFG_VERSION:
    printf("kvshared %s (protocol %u)\n", KVSHARED_VERSION, KVS_PROTO_VERSION);
    return 0;
  case CFG_PRINT_EXAMPLE:
    cfg_print_example(stdout);
    return 0;
  default:
    break;
  }
  socket_given = c.socket[0] != '\0'; /* by --socket or the file */
  if (cfg_finish(&c, err, sizeof(err)) < 0) {
    fprintf(stderr, "kvshared: %s\n", err);
    return 2;
  }
  if (action == CFG_PRINT_CONFIG) {
    cfg_print_values(stdout, &c);
    return 0;
  }
  log_level_cur = c.log_level;
  if (activation_check(&c, socket_given) < 0)
    return 1;
  if (c.exit_with_parent) {
    pid_t parent = getppid();

    /* SIGTERM when the parent goes; it may have gone already. */
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) < 0 || getppid() != parent) {
      fprintf(stderr, "kvshared: exit_with_parent: the parent is gone\n");
      return 1;
    }
  }
  /* Not dumpable: /proc/PID/fd (the pool, tier files, rings), ptrace and
   * core dumps are root's only, not every process of the daemon's uid
   * (docs/operations.md, "Who is trusted with what"). */
  if (!c.dumpable && prctl(PR_SET_DUMPABLE, 0) < 0) {
    fprintf(stderr, "kvshared: prctl(PR_SET_DUMPABLE): %s\n", strerror(errno));
    return 1;
  }
  /* A peer that closes early must not kill the daemon with SIGPIPE. */
  signal(SIGPIPE, SIG_IGN);
  return run(&c);
}
