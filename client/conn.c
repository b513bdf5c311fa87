/*
 * conn.c — libkvshare: connect, handshake, pool mapping, the round trip.
 */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "client/client_int.h"
#include "kvs_compact.h"
#include "kvs_frame.h"
#include "kvs_packed.h"
#include "kvs_shm.h"

const char *kvs_version(void) { return "0.1.0"; }

/* Why the calling thread's last kvs_connect failed: kvs_last_message(NULL). */
static __thread char connect_msg[512];

void kvs__copy_str(char *dst, size_t cap, const char *src) {
  size_t n = src ? strlen(src) : 0;
  if (n >= cap)
    n = cap - 1;
  if (n)
    memcpy(dst, src, n);
  dst[n] = '\0';
}

void kvs__drop_last(kvs_client *c) { kvs__arena_reset(&c->arena); }

void kvs__take_reply(kvs_client *c, kvs__arena *keep) {
  kvs__arena tmp = *keep;

  kvs__arena_reset(&tmp); /* (its old contents go: empty for the client) */
  *keep = c->arena;
  c->arena = tmp;
}

static int fail(kvs_client *c, int rc) {
  c->broken = 1;
  return rc;
}

/* Sends the whole buffer; -errno or KVS_ECLOSED on failure. */
static int send_all(int fd, const uint8_t *p, size_t n) {
  while (n) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      if (errno == EPIPE || errno == ECONNRESET)
        return KVS_ECLOSED;
      return -errno;
    }
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

int kvs__ensure_cap(uint8_t **buf, size_t *cap, size_t need) {
  if (need <= *cap)
    return 0;
  size_t ncap = *cap ? *cap : 4096;
  while (ncap < need)
    ncap *= 2;
  uint8_t *nb = realloc(*buf, ncap);
  if (!nb)
    return KVS_ENOMEM;
  *buf = nb;
  *cap = ncap;
  return 0;
}

/* Rounds of the socket spin before each round yields the CPU (a daemon on
 * the same core then gets to run). */
#define SOCK_SPIN_EAGER 8

/* recv without blocking, again and again, for up to c->sock_spin_ns (and
 * never past timeout_ms): the reply of a daemon that polls its sockets
 * (socket_poll_us) comes back without waking this thread.  When none
 * came, the rest of timeout_ms is waited in poll() (-EAGAIN when it ran
 * out), or, without a timeout, *block says that the caller's blocking
 * recv is left to do. */
static ssize_t recv_spin(kvs_client *c, int *block) {
  const uint64_t t0 = kvs__now_ns();
  const uint64_t limit = c->timeout_ms > 0 ? (uint64_t)c->timeout_ms * 1000000u : 0;
  const uint64_t spin = limit && c->sock_spin_ns > limit ? limit : c->sock_spin_ns;

  *block = 0;
  for (unsigned i = 0;; i++) {
    ssize_t r = recv(c->fd, c->rbuf + c->rlen, c->rcap - c->rlen, MSG_DONTWAIT);
    if (r >= 0)
      return r;
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      return -errno;
    uint64_t t = kvs__now_ns() - t0;
    if (t < spin) { /* spinning */
      if (i >= SOCK_SPIN_EAGER)
        sched_yield();
      continue;
    }
    if (!limit) {
      *block = 1;
      return -EAGAIN;
    }
    if (t >= limit)
      return -EAGAIN;
    struct pollfd p = {c->fd, POLLIN, 0}; /* the rest of the timeout */
    if (poll(&p, 1, (int)((limit - t + 999999) / 1000000)) < 0 && errno != EINTR)
      return -errno;
  }
}

/*
 * Receives one whole frame into c->rbuf: *frame points at it (header
 * included, *flen bytes), valid until the next receive.  When fds is not
 * NULL, file descriptors passed with the bytes are collected there (up to
 * max; extra ones are closed); otherwise any passed fd is closed.
 */
int kvs__recv_raw(kvs_client *c, uint32_t max_frame, int *fds, int *nfds,
                  int max, const uint8_t **frame, size_t *flen_out) {
  for (;;) {
    size_t avail = c->rlen - c->rpos, flen = 0;
    int pr = kvs_frame_parse(c->rbuf + c->rpos, avail, max_frame, &flen);
    if (pr < 0)
      return pr;
    if (pr == 1) {
      *frame = c->rbuf + c->rpos;
      *flen_out = flen;
      c->rpos += flen;
      if (c->rpos == c->rlen)
        c->rpos = c->rlen = 0; /* (the bytes stay until the next receive) */
      return 0;
    }
    /* Need more bytes: make room for the whole frame (or at least 64 KiB,
     * so a small reply arrives in one recv). */
    if (c->rpos && c->rpos == c->rlen)
      c->rpos = c->rlen = 0;
    if (c->rpos + flen > c->rcap && c->rpos) {
      memmove(c->rbuf, c->rbuf + c->rpos, avail);
      c->rpos = 0;
      c->rlen = avail;
    }
    size_t want = c->rpos + (flen > 65536 ? flen : 65536);
    int rc = kvs__ensure_cap(&c->rbuf, &c->rcap, want);
    if (rc)
      return rc;
    /* The Welcome's descriptors come through recvmsg; after it, plain recv
     * (no ancillary data to parse: about 2% of a small call's round trip
     * on one core): a descriptor a daemon passed anyway is released by
     * the kernel, never left in the socket or this process. */
    int got[KVS_SHM_MAX_FDS], ngot = 0;
    ssize_t r;
    if (!fds) {
      int block = 1;
      r = c->sock_spin_ns ? recv_spin(c, &block) : -EAGAIN;
      if (block) {
        do
          r = recv(c->fd, c->rbuf + c->rlen, c->rcap - c->rlen, 0);
        while (r < 0 && errno == EINTR);
        if (r < 0)
          r = -errno;
      }
    } else {
      r = kvs_recv_fds(c->fd, c->rbuf + c->rlen, c->rcap - c->rlen, got,
                       KVS_SHM_MAX_FDS, &ngot);
    }
    for (int i = 0; i < ngot; i++) {
      if (fds && *nfds < max)
        fds[(*nfds)++] = got[i];
      else
        close(got[i]);
    }
    if (r == 0)
      return KVS_ECLOSED;
    if (r < 0)
      return r == -ECONNRESET ? KVS_ECLOSED : (int)r;
    c->rlen += (size_t)r;
  }
}

/* Sends the buffer in c->wbuf (flen bytes) on the socket. */
static int send_wbuf(kvs_client *c, size_t flen) {
  return send_all(c->fd, c->wbuf, flen);
}

/* Sends the frame in c->wbuf (flen bytes; through the ring when there is
 * one and it fits) and receives the reply frame (see kvs__recv_raw). */
static int roundtrip(kvs_client *c, size_t flen, const uint8_t **frame,
                     size_t *rlen) {
  int rc;

  if (c->rh != NULL && flen <= c->ring_area)
    rc = kvs__ring_roundtrip(c, flen); /* the reply: in rbuf, or coming */
  else
    rc = send_all(c->fd, c->wbuf, flen);
  return rc ? rc
            : kvs__recv_raw(c, KVS__CLIENT_MAX_FRAME, NULL, NULL, 0, frame,
                            rlen);
}

/* Can every op of a batch go as a record, and does the packed frame fit?
 * (Token ids are 4 bytes each there, 1 to 5 as varints: a batch of small
 * ids near max_frame may fit only as a Batch.) */
static int packable(const kvs_client *c, const kvs_call *call) {
  uint64_t bytes;

  if (!c->packed_batch || call->nops == 0)
    return 0;
  bytes = kvs_records_size(call);
  return bytes && bytes + 64 <= c->max_frame;
}

/* The call as a frame in c->wbuf, in its shape: *flen its bytes.
 * KVS_ETOOBIG: over the daemon's max_frame (nothing sent). */
static int encode_call(kvs_client *c, kvs_call *call, size_t *flen) {
  kvs_request rq;
  size_t len;
  int rc;

  if (!kvs_shape_is_compact(call->shape)) /* (compact ones use none) */
    kvs__arena_reset(&c->scratch);
  len = kvs_request_size(&rq, call, &c->scratch);
  if (len == 0)
    return kvs_shape_is_compact(call->shape) ? KVS_ETOOBIG : KVS_ENOMEM;
  if (len - KVS_FRAME_HEADER_SIZE > c->max_frame)
    return KVS_ETOOBIG;
  rc = kvs__ensure_cap(&c->wbuf, &c->wcap, len);
  if (rc)
    return rc;
  kvs_request_encode(&rq, c->wbuf);
  *flen = len;
  return 0;
}

int kvs__call(kvs_client *c, kvs_call *call) {
  uint8_t want = call->shape; /* KVS_SHAPE_OP or KVS_SHAPE_BATCH */
  const uint8_t *frame;
  size_t flen = 0, rlen;
  int rc = KVS_ETOOBIG;

  c->msg[0] = '\0';
  if (c->broken) {
    kvs__drop_last(c);
    return KVS_ECLOSED;
  }
  call->seq = c->next_seq++;
  call->status = 0;
  call->message = NULL;
  /* The leanest encoding the daemon takes, else the next one.  Token ids
   * take 4 bytes each in records, 1 to 5 as varints: an Envelope may fit
   * where records do not. */
  if (want == KVS_SHAPE_OP && c->compact &&
      (call->ops[0].code == KVS_OP_PING || kvs_op_has_record(&call->ops[0]))) {
    call->shape = call->ops[0].code == KVS_OP_PING ? KVS_SHAPE_COMPACT_PING
                                                    : KVS_SHAPE_COMPACT_OP;
    rc = encode_call(c, call, &flen);
  } else if (want == KVS_SHAPE_BATCH && packable(c, call)) {
    call->shape = c->compact ? KVS_SHAPE_COMPACT_BATCH : KVS_SHAPE_PACKED;
    rc = encode_call(c, call, &flen);
    if (rc == KVS_ETOOBIG && call->shape == KVS_SHAPE_COMPACT_BATCH) {
      call->shape = KVS_SHAPE_PACKED;
      rc = encode_call(c, call, &flen);
    }
  }
  if (rc == KVS_ETOOBIG) {
    call->shape = want;
    rc = encode_call(c, call, &flen);
  }
  if (rc == KVS_ETOOBIG) {
    call->shape = want;
    return rc; /* nothing was sent: the connection is still usable */
  }
  /* Only now may the previous reply go: the request may point into it (a
   * result's blocks passed straight to the next call). */
  kvs__drop_last(c);
  if (rc == 0)
    rc = roundtrip(c, flen, &frame, &rlen);
  if (rc == 0)
    rc = kvs_reply_decode(call, frame, rlen, c->max_batch_ops, &c->arena);
  if (rc) {
    if (call->message)
      kvs__copy_str(c->msg, sizeof c->msg, call->message);
    return fail(c, rc);
  }
  if (!kvs_shape_is_batch(call->shape)) {
    kvs__copy_str(c->msg, sizeof c->msg, call->res[0].message);
    return call->res[0].status;
  }
  kvs__copy_str(c->msg, sizeof c->msg, call->message);
  return call->status;
}

/* Maps the host pool (one memfd).  On success the mapping owns the fd and
 * *fd is set to -1. */
static int map_pool(kvs_client *c, int *fd) {
  kvs_region r;
  int rc = kvs_region_map(*fd, c->pool_size, &r);
  if (rc) {
    snprintf(c->msg, sizeof c->msg, "mapping the host pool: %s",
             kvs_strerror(rc));
    return rc;
  }
  *fd = -1;
  c->pool = r;
  c->pool_base = r.base;
  return 0;
}

/* Imports and maps the GPU pool (the fds stay the caller's to close). */
static int map_gpu_pool(kvs_client *c, const int *fds, int nfds,
                        uint64_t chunk_size) {
  int rc = kvs__vmm_import(c->gpu_uuid, fds, nfds, chunk_size, c->pool_size,
                           &c->gpu, c->msg, sizeof c->msg);
  if (rc == KVS_ENODEV) {
    size_t at = strlen(c->msg);

    snprintf(c->msg + at, sizeof c->msg - at, " (CUDA_VISIBLE_DEVICES=%s, "
             "NVIDIA_VISIBLE_DEVICES=%s).  Connect to the daemon of this "
             "process's GPU: with one daemon per GPU (socket_dir), give their "
             "socket folder as the socket (KVS_SOCKET) and libkvshare picks "
             "it", getenv("CUDA_VISIBLE_DEVICES") ?: "unset",
             getenv("NVIDIA_VISIBLE_DEVICES") ?: "unset");
  }
  if (rc)
    return rc;
  c->pool_base = (void *)(uintptr_t)c->gpu.base;
  return 0;
}

static int handshake(kvs_client *c, const kvs_connect_opts *opts) {
  kvs_hello hello;
  kvs_welcome w;
  const uint8_t *frame;
  size_t flen, len;

  memset(&hello, 0, sizeof hello);
  hello.version = KVS_PROTO_VERSION;
  hello.client_name =
      opts && opts->client_name ? opts->client_name : "libkvshare";
  hello.pid = (uint32_t)getpid();
  {
    const char *e = getenv("KVS_RING");

    hello.ring = e != NULL && strcmp(e, "1") == 0 && !(opts && opts->no_map);
  }
  hello.no_map = opts && opts->no_map;
  uint64_t seq = c->next_seq++;
  len = kvs_hello_frame_size(&hello, seq);
  int send_rc = kvs__ensure_cap(&c->wbuf, &c->wcap, len);
  if (send_rc)
    return send_rc;
  kvs_hello_frame_encode(&hello, seq, c->wbuf, len);
  /* A daemon that refuses the connection (ELIMIT, EPERM) answers before the
   * Hello and closes: if the Hello cannot be sent, its answer may still be
   * there to read. */
  send_rc = send_wbuf(c, len);
  if (send_rc && send_rc != KVS_ECLOSED)
    return send_rc;

  int fds[KVS_FRAME_MAX_FDS];
  int nfds = 0;
  int rc = kvs__recv_raw(c, KVS__CLIENT_MAX_FRAME, fds, &nfds,
                         KVS_FRAME_MAX_FDS, &frame, &flen);
  if (rc == 0)
    rc = kvs_welcome_decode(frame, flen, c->max_batch_ops, &c->arena, &w);
  if (rc) {
    if (send_rc)
      rc = send_rc;
    goto out;
  }
  if (w.status < 0) {
    kvs__copy_str(c->msg, sizeof c->msg, w.message);
    rc = w.status;
    goto out;
  }
  if (w.version != KVS_PROTO_VERSION) {
    rc = KVS_EVERSION;
    goto out;
  }
  if (!w.has_layout || !w.has_pool) {
    rc = KVS_EPROTO;
    goto out;
  }
  kvs_layout *l = &c->layout;
  l->block_size = w.block_size;
  l->num_layers = w.num_layers;
  l->num_kv_heads = w.num_kv_heads;
  l->head_dim = w.head_dim;
  l->dtype = w.dtype;
  l->num_blocks = w.num_blocks;
  if (kvs_layout_finish(l) != 0 || l->block_stride != w.block_stride ||
      w.pool_size < kvs_pool_bytes(l)) {
    rc = KVS_EPROTO;
    goto out;
  }
  c->pool_size = w.pool_size;
  c->session_id = w.session_id;
  c->max_frame = w.max_frame ? w.max_frame : KVS_FRAME_MAX_DEFAULT;
  c->max_batch_ops = w.max_batch_ops ? w.max_batch_ops
                                     : KVS_UNPACK_OPS_DEFAULT;
  {
    const char *e = getenv("KVS_PACKED_BATCH");

    c->packed_batch = (w.features & KVS_FEATURE_PACKED_BATCH) &&
                      !(e && strcmp(e, "0") == 0);
    e = getenv("KVS_COMPACT");
    c->compact = (w.features & KVS_FEATURE_COMPACT) &&
                 !(e && strcmp(e, "0") == 0);
  }
  kvs__copy_str(c->backend, sizeof c->backend, w.backend);
  kvs__copy_str(c->gpu_uuid, sizeof c->gpu_uuid, w.gpu_uuid);
  kvs__copy_str(c->model_id, sizeof c->model_id, w.model_id);
  kvs__copy_str(c->tenant, sizeof c->tenant, w.tenant);
  uint32_t ring_fds = w.ring_bytes && hello.ring ? 2 : 0;
  if ((uint32_t)nfds != w.num_fds + ring_fds) {
    snprintf(c->msg, sizeof c->msg, "the Welcome announced %u descriptors, "
             "%d arrived", w.num_fds + ring_fds, nfds);
    rc = KVS_EPROTO;
    goto out;
  }
  if (ring_fds) {
    int *rfds = fds + w.num_fds;
    rc = kvs__ring_setup(c, rfds, w.ring_bytes);
    if (rc) {
      snprintf(c->msg, sizeof c->msg, "the daemon's request ring (%u bytes) "
               "could not be mapped", w.ring_bytes);
      goto out;
    }
    rfds[0] = rfds[1] = -1; /* the client's now */
    nfds = (int)w.num_fds;
  }
  if (opts && opts->no_map) {
    rc = 0;
  } else if (strcmp(c->backend, "host") == 0 && nfds == 1) {
    rc = map_pool(c, &fds[0]);
  } else if (strcmp(c->backend, "cuda") == 0) {
    rc = map_gpu_pool(c, fds, nfds, w.chunk_size);
  } else {
    snprintf(c->msg, sizeof c->msg, "the daemon's pool backend '%s' (%d "
             "descriptors) is unknown to this libkvshare", c->backend, nfds);
    rc = KVS_ENOTSUP;
  }
out:
  for (int i = 0; i < nfds; i++)
    if (fds[i] >= 0)
      close(fds[i]);
  kvs__arena_reset(&c->arena); /* the Welcome */
  return rc;
}

/* A failure before the client exists: its reason for kvs_last_message. */
static int connect_fail(int rc, const char *why) {
  kvs__copy_str(connect_msg, sizeof connect_msg, why);
  return rc;
}

int kvs_connect(const char *path, const kvs_connect_opts *opts,
                kvs_client **out) {
  if (!out)
    return connect_fail(KVS_EINVAL, "no place for the client (out is NULL)");
  *out = NULL;
  char def[sizeof(struct sockaddr_un)];
  char picked[sizeof(struct sockaddr_un)];
  struct stat st;
  if (!path)
    path = kvs__default_socket(def, sizeof def);
  if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
    int rc = kvs__socket_in_dir(path, picked, sizeof picked, connect_msg,
                                sizeof connect_msg);
    if (rc)
      return rc;
    path = picked;
  }
  struct sockaddr_un sa = {0};
  sa.sun_family = AF_UNIX;
  if (strlen(path) >= sizeof sa.sun_path)
    return connect_fail(KVS_EINVAL, "the socket path is longer than a Unix "
                                    "socket address holds");
  strcpy(sa.sun_path, path);

  kvs_client *c = calloc(1, sizeof *c);
  if (!c)
    return connect_fail(KVS_ENOMEM, "out of memory");
  c->fd = -1;
  c->pool.fd = -1;
  c->next_seq = 1;
  c->max_frame = KVS_FRAME_MAX_DEFAULT;
  c->max_batch_ops = KVS_UNPACK_OPS_DEFAULT;
  c->timeout_ms = opts ? opts->timeout_ms : 0;
  const char *spin = getenv("KVS_SOCKET_SPIN_US");
  if (spin && *spin) { /* (a negative or unreadable value: 0, no spin) */
    long us = strtol(spin, NULL, 10);
    c->sock_spin_ns = us <= 0 ? 0 : (uint64_t)(us < 1000000 ? us : 1000000) * 1000u;
  }
  int rc = 0;
  c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (c->fd < 0) {
    rc = -errno;
    goto out;
  }
  if (opts && opts->timeout_ms > 0) {
    struct timeval tv = {opts->timeout_ms / 1000,
                         (opts->timeout_ms % 1000) * 1000};
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  }
  while (connect(c->fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    if (errno == EINTR)
      continue;
    rc = -errno;
    goto out;
  }
  rc = handshake(c, opts);
out:
  if (rc) {
    if (c->msg[0])
      kvs__copy_str(connect_msg, sizeof connect_msg, c->msg);
    else
      kvs__copy_str(connect_msg, sizeof connect_msg, kvs_strerror(rc));
    kvs_close(c);
    return rc;
  }
  connect_msg[0] = '\0';
  *out = c;
  return 0;
}

void kvs_close(kvs_client *c) {
  if (!c)
    return;
  kvs__drop_last(c);
  kvs__arena_destroy(&c->arena);
  kvs__arena_destroy(&c->scratch);
  kvs_region_close(&c->pool);
  if (c->gpu.base && kvs__cuda_ctx_open(c->gpu_uuid, NULL, 0) == 0) {
    /* Kernels of this process may still run on the pool: let them end
     * before the memory goes. */
    kvs__cu.cuCtxSynchronize();
  }
  kvs__vmm_close(&c->gpu);
  kvs__ring_close(c);
  if (c->fd >= 0)
    close(c->fd);
  free(c->wbuf);
  free(c->rbuf);
  free(c);
}

const kvs_layout *kvs_layout_of(const kvs_client *c) { return &c->layout; }
void *kvs_pool_base(const kvs_client *c) { return c->pool_base; }
uint64_t kvs_pool_size(const kvs_client *c) { return c->pool_size; }
const char *kvs_pool_backend(const kvs_client *c) { return c->backend; }
uint64_t kvs_session_id(const kvs_client *c) { return c->session_id; }
const char *kvs_model_id(const kvs_client *c) { return c->model_id; }
const char *kvs_tenant(const kvs_client *c) { return c->tenant; }
uint32_t kvs_max_frame(const kvs_client *c) { return c->max_frame; }
int kvs_fd(const kvs_client *c) { return c->fd; }
const char *kvs_last_message(const kvs_client *c) {
  return c ? c->msg : connect_msg;
}
const char *kvs_pool_gpu_uuid(const kvs_client *c) { return c->gpu_uuid; }

const kvs_kernels *kvs_pool_kernels(const kvs_client *c) {
  return c && c->gpu.base ? kvs_kernels_cuda() : kvs_kernels_cpu();
}

int kvs_set_daemon_copy(kvs_client *c, int on) {
  if (!c)
    return KVS_EINVAL;
  c->daemon_copy = on ? 1 : 0;
  return 0;
}

int kvs_set_promote(kvs_client *c, int on) {
  if (!c)
    return KVS_EINVAL;
  c->no_promote = on ? 0 : 1;
  return 0;
}

int kvs_copy_blocks(kvs_client *c, const uint32_t *pairs, uint32_t n,
                    void *stream) {
  const kvs_layout *l;
  uint32_t i;

  if (!c || (n && !pairs))
    return KVS_EINVAL;
  l = &c->layout;
  for (i = 0; i < 2 * n; i++)
    if (pairs[i] >= l->num_blocks)
      return KVS_ERANGE;
  if (n == 0)
    return 0;
  if (!c->pool_base)
    return KVS_ESTATE;
  if (!c->gpu.base) {
    kvs_copy_args a = {c->pool_base, l->block_stride, pairs, n,
                       l->num_blocks};
    return kvs_cpu_copy_blocks(&a, NULL);
  }
  /* One async device-to-device copy per pair on the caller's stream: a
   * CoW copy is a handful of blocks, and the pairs stay host memory. */
  int rc = kvs__cuda_ctx_open(c->gpu_uuid, NULL, 0);
  if (rc)
    return rc;
  for (i = 0; i < n; i++) {
    CUdeviceptr base = c->gpu.base;
    uint64_t s = pairs[2 * i], d = pairs[2 * i + 1];
    if (s == d)
      continue;
    CUresult r = kvs__cu.cuMemcpyDtoDAsync(base + d * l->block_stride,
                                           base + s * l->block_stride,
                                           l->block_stride, (CUstream)stream);
    if (r != CUDA_SUCCESS)
      return kvs__cu_status(r);
  }
  return 0;
}

void *kvs_block_ptr(const kvs_client *c, uint32_t b) {
  if (!c->pool_base || b >= c->layout.num_blocks)
    return NULL;
  return (char *)c->pool_base + kvs_block_offset(&c->layout, b);
}

void *kvs_plane_ptr(const kvs_client *c, uint32_t b, uint32_t layer,
                    uint32_t kv) {
  char *p = kvs_block_ptr(c, b);
  if (!p || layer >= c->layout.num_layers || kv > 1)
    return NULL;
  return p + kvs_plane_offset(&c->layout, layer, kv);
}

int kvs_paged_kv_of(const kvs_client *c, uint32_t layer, kvs_paged_kv *kv) {
  if (!c || !kv || layer >= c->layout.num_layers)
    return KVS_EINVAL;
  if (!c->pool_base)
    return KVS_ESTATE;
  return kvs_paged_kv_init(kv, c->pool_base, &c->layout, layer);
}
