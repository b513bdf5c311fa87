/*
 * tier_disk.c — the disk tier's slot I/O (tier_disk.h): io_uring with a
 * registered file and registered staging buffers, one submit per loop turn,
 * completions through an eventfd.
 */
#include "daemon/tiers/tier_disk.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <linux/fs.h>
#include <xxhash.h>

#include "daemon/log.h"
#include "kvs_status.h"

#define HDR_BYTES 4096u
#define ALIGN 4096u
#define MAGIC 0x3152454954535a4bull /* the bytes "KZSTIER1" */
#define VERSION 2u
#define TOK_OFF 128u
#define FLAG_RESTORABLE 1u
#define FLAG_TOKENS 2u

/* The header's fixed part (tier_disk.h gives the offsets); the token ids
 * follow at TOK_OFF, zeros after them. */
typedef struct slot_hdr {
  uint64_t magic;
  uint32_t version, hdr_bytes;
  uint64_t hash_lo, hash_hi;
  uint64_t data_len;
  uint64_t data_xxh3;
  uint64_t hdr_xxh3; /* of the whole header, this field read as zero */
  uint64_t gen;
  uint32_t block_size, num_layers, num_kv_heads, head_dim, dtype;
  uint32_t flags;
  uint64_t root_lo, root_hi;
  uint8_t zero[TOK_OFF - 104];
} slot_hdr;
_Static_assert(sizeof(slot_hdr) == TOK_OFF, "slot header layout");
_Static_assert(offsetof(slot_hdr, hdr_xxh3) == 48 &&
                   offsetof(slot_hdr, gen) == 56 &&
                   offsetof(slot_hdr, flags) == 84 &&
                   offsetof(slot_hdr, root_lo) == 88,
               "slot header offsets (tier_disk.h)");
_Static_assert(TOK_OFF + TIER_DISK_MAX_TOKENS * 4 <= HDR_BYTES,
               "token ids fit the header");

enum { F_READ_EIO, F_WRITE_EIO, F_WRITE_ENOSPC, F_SHORT, F_FLIP, F_WRITE_SLOW,
       F_KINDS };
static const char *const fault_names[F_KINDS] = {"read-eio", "write-eio",
                                                 "write-enospc", "short",
                                                 "flip", "write-slow"};

struct tier_disk {
  uv_loop_t *loop;
  int fd, efd, direct, registered;
  struct io_uring ring;
  int ring_ok;
  uv_poll_t poll;
  uv_check_t check;     /* flushes what poll-phase callbacks prepared */
  uv_prepare_t prepare; /* ... and what timers did, before the loop blocks */
  int handles;       /* uv handles open (closing frees the last) */
  uint64_t data_len, data_bytes, slot_bytes; /* block, rounded, + header */
  uint32_t nslots;
  /* staging buffers: nbufs x slot_bytes, one mapping */
  uint8_t *bufs;
  uint32_t nbufs, *free_bufs, nfree;
  disk_io *waiting;       /* no SQE free: submitted later, in order */
  disk_io **waiting_tail;
  uint32_t unsubmitted, inflight;
  uint64_t fault_at[F_KINDS], fault_seen[F_KINDS];
  /* write-slow:MS: every write's completion held MS ms (a slow disk) */
  uv_timer_t slow;
  disk_io *slow_head, *slow_tail;
  tier_disk_stats st;
  int warned_io, warned_sum;
  tier_disk_stamp stamp;
  uint64_t gen; /* the next write's */
};

static uint8_t *buf_of(const tier_disk *d, uint32_t b) {
  return d->bufs + (size_t)b * d->slot_bytes;
}

static int fault_parse(tier_disk *d, const char *spec, char *err,
                       size_t err_len) {
  char tmp[256], *save = NULL;

  if (!spec || !*spec)
    return 0;
  if (strlen(spec) >= sizeof(tmp)) {
    snprintf(err, err_len, "tier_fault: too long");
    return KVS_EINVAL;
  }
  strcpy(tmp, spec);
  for (char *p = strtok_r(tmp, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
    char *colon = strchr(p, ':'), *end;
    int k;
    unsigned long long n;

    if (!colon)
      goto bad;
    *colon = '\0';
    for (k = 0; k < F_KINDS && strcmp(p, fault_names[k]); k++)
      ;
    errno = 0;
    n = strtoull(colon + 1, &end, 10);
    if (k == F_KINDS || errno || *end || n == 0)
      goto bad;
    d->fault_at[k] = n;
  }
  return 0;
bad:
  snprintf(err, err_len, "tier_fault '%s': want KIND:N[,KIND:N...] with KIND "
           "one of read-eio, write-eio, write-enospc, short, flip (the Nth "
           "I/O of the kind fails), or write-slow (every write takes N ms)",
           spec);
  return KVS_EINVAL;
}

/* XXH3-64 of header p (HDR_BYTES) with its own checksum field as zero. */
static uint64_t hdr_sum(uint8_t *p) {
  uint64_t saved, sum, zero = 0;

  memcpy(&saved, p + offsetof(slot_hdr, hdr_xxh3), sizeof(saved));
  memcpy(p + offsetof(slot_hdr, hdr_xxh3), &zero, sizeof(zero));
  sum = XXH3_64bits(p, HDR_BYTES);
  memcpy(p + offsetof(slot_hdr, hdr_xxh3), &saved, sizeof(saved));
  return sum;
}

/* Is this the Nth I/O of fault kind k? */
static int fault_now(tier_disk *d, int k) {
  return d->fault_at[k] && ++d->fault_seen[k] == d->fault_at[k];
}

/* ---- submission ----------------------------------------------------------- */

static int prep(tier_disk *d, disk_io *io) {
  struct io_uring_sqe *sqe = io_uring_get_sqe(&d->ring);
  void *p = buf_of(d, io->buf);
  uint64_t off = (uint64_t)io->slot * d->slot_bytes;
  int fd = d->registered ? 0 : d->fd;

  if (!sqe)
    return -1;
  if (d->registered && io->write)
    io_uring_prep_write_fixed(sqe, fd, p, (unsigned)d->slot_bytes, off, 0);
  else if (d->registered)
    io_uring_prep_read_fixed(sqe, fd, p, (unsigned)d->slot_bytes, off, 0);
  else if (io->write)
    io_uring_prep_write(sqe, fd, p, (unsigned)d->slot_bytes, off);
  else
    io_uring_prep_read(sqe, fd, p, (unsigned)d->slot_bytes, off);
  if (d->registered)
    sqe->flags |= IOSQE_FIXED_FILE;
  io_uring_sqe_set_data(sqe, io);
  d->unsubmitted++;
  d->inflight++;
  return 0;
}

/* Everything prepared goes in one system call: at the end of the loop
 * turn (check), or before the loop blocks in poll (prepare), whichever
 * comes first. */
static void flush(tier_disk *d) {
  while (d->waiting && prep(d, d->waiting) == 0) {
    d->waiting = d->waiting->next;
    if (!d->waiting)
      d->waiting_tail = &d->waiting;
  }
  if (d->unsubmitted) {
    int rc = io_uring_submit(&d->ring);

    if (rc >= 0)
      d->unsubmitted -= (uint32_t)rc < d->unsubmitted ? (uint32_t)rc
                                                      : d->unsubmitted;
    else if (rc != -EAGAIN && rc != -EBUSY && rc != -EINTR)
      log_error(-rc, "disk tier: io_uring_submit");
  }
  if (!d->unsubmitted && !d->waiting) {
    uv_check_stop(&d->check);
    uv_prepare_stop(&d->prepare);
  }
}

static void on_check(uv_check_t *h) { flush(h->data); }
static void on_prepare(uv_prepare_t *h) { flush(h->data); }

static void want_flush(tier_disk *d) {
  uv_check_start(&d->check, on_check);
  uv_prepare_start(&d->prepare, on_prepare);
}

void tier_disk_submit(tier_disk *d, disk_io *io) {
  io->status = 0;
  io->next = NULL;
  if (io->write) {
    uint8_t *p = buf_of(d, io->buf);
    slot_hdr h;

    memset(p, 0, HDR_BYTES);
    memset(&h, 0, sizeof(h));
    h.magic = MAGIC;
    h.version = VERSION;
    h.hdr_bytes = HDR_BYTES;
    h.hash_lo = io->hash.lo;
    h.hash_hi = io->hash.hi;
    h.data_len = d->data_len;
    h.data_xxh3 = io->has_sum ? io->sum
                              : XXH3_64bits(p + HDR_BYTES, d->data_len);
    h.gen = d->gen++;
    h.block_size = d->stamp.block_size;
    h.num_layers = d->stamp.num_layers;
    h.num_kv_heads = d->stamp.num_kv_heads;
    h.head_dim = d->stamp.head_dim;
    h.dtype = d->stamp.dtype;
    h.root_lo = d->stamp.root.lo;
    h.root_hi = d->stamp.root.hi;
    h.flags = io->restorable ? FLAG_RESTORABLE : 0;
    if (io->tokens && d->stamp.block_size <= TIER_DISK_MAX_TOKENS) {
      h.flags |= FLAG_TOKENS;
      memcpy(p + TOK_OFF, io->tokens,
             (size_t)d->stamp.block_size * sizeof(uint32_t));
    }
    memcpy(p, &h, sizeof(h));
    h.hdr_xxh3 = hdr_sum(p);
    memcpy(p + offsetof(slot_hdr, hdr_xxh3), &h.hdr_xxh3,
           sizeof(h.hdr_xxh3));
  }
  if (d->waiting || prep(d, io) != 0) {
    *d->waiting_tail = io;
    d->waiting_tail = &io->next;
  }
  want_flush(d);
}

/* ---- completion ------------------------------------------------------------ */

static int verify(tier_disk *d, disk_io *io) {
  uint8_t *p = buf_of(d, io->buf);
  slot_hdr h;

  memcpy(&h, p, sizeof(h));
  if (h.magic != MAGIC || h.version != VERSION || h.hdr_bytes != HDR_BYTES ||
      h.hdr_xxh3 != hdr_sum(p) ||
      h.hash_lo != io->hash.lo || h.hash_hi != io->hash.hi ||
      h.data_len != d->data_len ||
      h.data_xxh3 != XXH3_64bits(p + HDR_BYTES, d->data_len))
    return KVS_ECHECKSUM;
  return 0;
}

static void complete(tier_disk *d, disk_io *io, int res) {
  const char *what = io->write ? "write" : "read";

  d->inflight--;
  if (io->write) {
    d->st.writes++;
    if (fault_now(d, F_WRITE_EIO))
      res = -EIO;
    if (fault_now(d, F_WRITE_ENOSPC))
      res = -ENOSPC;
  } else {
    d->st.reads++;
    if (fault_now(d, F_READ_EIO))
      res = -EIO;
    if (res > 0 && fault_now(d, F_SHORT))
      res = res / 2;
    if (res == (int)d->slot_bytes && fault_now(d, F_FLIP))
      buf_of(d, io->buf)[HDR_BYTES + d->data_len / 2] ^= 0x10;
  }
  if (res != (int)d->slot_bytes) {
    io->status = KVS_EIO;
    d->st.io_errors++;
    if (!d->warned_io++) {
      char how[64] = "failed";

      if (res >= 0)
        snprintf(how, sizeof(how), "came back short: %d of %llu bytes", res,
                 (unsigned long long)d->slot_bytes);
      log_error(res < 0 ? -res : 0, "disk tier: %s of slot %u %s (counted "
                "in io_errors%s; logged once)", what, io->slot, how,
                io->write ? "; demotion backs off" : " as a miss");
    }
  } else if (!io->write && (io->status = verify(d, io)) != 0) {
    d->st.checksum_failures++;
    if (!d->warned_sum++)
      log_error(0, "disk tier: slot %u failed its header or checksum check "
                "(counted as a miss, never served; logged once)", io->slot);
  } else if (io->write) {
    d->st.bytes_written += d->data_len;
  } else {
    d->st.bytes_read += d->data_len;
  }
  io->cb(io);
}

/* write-slow: the writes held back, in order (each due N ms after it
 * completed; io->status holds its result meanwhile). */
static void on_slow(uv_timer_t *t) {
  tier_disk *d = t->data;
  uint64_t now = uv_now(d->loop);

  while (d->slow_head && d->slow_head->due_ms <= now) {
    disk_io *io = d->slow_head;

    d->slow_head = io->next;
    if (!d->slow_head)
      d->slow_tail = NULL;
    complete(d, io, io->status);
  }
  if (d->slow_head)
    uv_timer_start(&d->slow, on_slow, d->slow_head->due_ms - now, 0);
  if (d->unsubmitted)
    flush(d);
}

static void hold_slow(tier_disk *d, disk_io *io, int res) {
  io->status = res;
  io->due_ms = uv_now(d->loop) + d->fault_at[F_WRITE_SLOW];
  io->next = NULL;
  if (d->slow_tail)
    d->slow_tail->next = io;
  else
    d->slow_head = io;
  d->slow_tail = io;
  if (!uv_is_active((uv_handle_t *)&d->slow))
    uv_timer_start(&d->slow, on_slow, d->fault_at[F_WRITE_SLOW], 0);
}

static void on_poll(uv_poll_t *h, int status, int events) {
  tier_disk *d = h->data;
  struct io_uring_cqe *cqe;
  uint64_t v;
  unsigned head, n = 0;

  (void)status;
  (void)events;
  if (read(d->efd, &v, sizeof(v)) < 0 && errno != EAGAIN)
    log_error(errno, "disk tier: eventfd");
  for (;;) {
    disk_io *batch[64];
    int res[64];
    unsigned k = 0;

    io_uring_for_each_cqe(&d->ring, head, cqe) {
      batch[k] = io_uring_cqe_get_data(cqe);
      res[k] = cqe->res;
      if (++k == 64)
        break;
    }
    if (k == 0)
      break;
    io_uring_cq_advance(&d->ring, k);
    for (unsigned i = 0; i < k; i++) {
      if (d->fault_at[F_WRITE_SLOW] && batch[i]->write) {
        hold_slow(d, batch[i], res[i]);
        continue;
      }
      complete(d, batch[i], res[i]);
      /* What the callbacks queued goes in now and then, not only at the
       * end of the turn: checking a batch of big blocks takes a while, and
       * the device would sit idle meanwhile. */
      if ((i & 7) == 7 && d->unsubmitted)
        flush(d);
    }
    n += k;
  }
  if (n && d->waiting)
    want_flush(d);
}

/* ---- set-up ---------------------------------------------------------------- */

int tier_disk_open(uv_loop_t *loop, const char *path, uint64_t bytes,
                   uint64_t block_bytes, const tier_disk_stamp *stamp,
                   uint32_t nbufs, const char *fault, tier_disk **out,
                   char *err, size_t err_len) {
  tier_disk *d = calloc(1, sizeof(*d));
  struct stat sb;
  uint64_t have;
  int rc;

  *out = NULL;
  if (!d) {
    snprintf(err, err_len, "out of memory");
    return KVS_ENOMEM;
  }
  d->loop = loop;
  d->fd = d->efd = -1;
  d->waiting_tail = &d->waiting;
  d->stamp = *stamp;
  {
    /* Write counters go on growing across runs (the clock, in ns; a scan
     * raises it past every header it saw): a run without persistence
     * still writes restorable headers, newer than any before it. */
    struct timespec now;

    clock_gettime(CLOCK_REALTIME, &now);
    d->gen = (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
  }
  d->data_len = block_bytes;
  d->data_bytes = (block_bytes + ALIGN - 1) / ALIGN * ALIGN;
  d->slot_bytes = HDR_BYTES + d->data_bytes;
  if ((rc = fault_parse(d, fault, err, err_len)) != 0)
    goto fail;
  if (d->slot_bytes > (1u << 30) || bytes / d->slot_bytes == 0 ||
      bytes / d->slot_bytes >= KVS_BLOCK_NONE / 2) {
    snprintf(err, err_len, "disk_tier_bytes %llu holds %llu slots of %llu "
             "bytes (a block and its 4 KiB header); want 1 .. 2^31",
             (unsigned long long)bytes,
             (unsigned long long)(bytes / d->slot_bytes),
             (unsigned long long)d->slot_bytes);
    rc = KVS_EINVAL;
    goto fail;
  }
  d->nslots = (uint32_t)(bytes / d->slot_bytes);
  /* No more staging buffers than slots (TIER_DISK_BUFS_MIN at least): a
   * small tier (a tenant's share of one) has no use for more I/O in
   * flight, and each buffer is a slot's worth of memory, pinned under a
   * GPU pool, for every partition. */
  if (nbufs > d->nslots)
    nbufs = d->nslots > TIER_DISK_BUFS_MIN ? d->nslots
            : nbufs < TIER_DISK_BUFS_MIN   ? nbufs
                                           : TIER_DISK_BUFS_MIN;
  d->direct = 1;
  d->fd = open(path, O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
  if (d->fd < 0 && errno == EINVAL) { /* tmpfs and friends */
    d->direct = 0;
    d->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  }
  if (d->fd < 0 || fstat(d->fd, &sb) != 0) {
    rc = KVS_EIO;
    snprintf(err, err_len, "disk_tier %s: %s", path, strerror(errno));
    goto fail;
  }
  have = (uint64_t)sb.st_size;
  if (S_ISBLK(sb.st_mode)) {
    if (ioctl(d->fd, BLKGETSIZE64, &have) != 0)
      have = 0;
  } else if (!S_ISREG(sb.st_mode)) {
    rc = KVS_EINVAL;
    snprintf(err, err_len, "disk_tier %s is not a regular file or a block "
             "device", path);
    goto fail;
  } else if (sb.st_uid != geteuid() && sb.st_uid != 0) {
    /* Made by someone else before the daemon came (where its folder lets
     * them): they would read every block written down, and with
     * disk_tier_persist write blocks that the next start serves. */
    rc = KVS_EPERM;
    snprintf(err, err_len, "disk_tier %s belongs to uid %u, not to the "
             "daemon's (%u) or root: its owner could read the KV data "
             "written into it; remove it, and keep the tier's folder "
             "writable by the daemon only", path, (unsigned)sb.st_uid,
             (unsigned)geteuid());
    goto fail;
  }
  if (have < (uint64_t)d->nslots * d->slot_bytes) {
    if (S_ISBLK(sb.st_mode) ||
        ftruncate(d->fd, (off_t)((uint64_t)d->nslots * d->slot_bytes)) != 0) {
      rc = KVS_ENOSPC;
      snprintf(err, err_len, "disk_tier %s: %llu bytes, %llu wanted%s%s",
               path, (unsigned long long)have,
               (unsigned long long)d->nslots * d->slot_bytes,
               S_ISBLK(sb.st_mode) ? "" : ": ",
               S_ISBLK(sb.st_mode) ? "" : strerror(errno));
      goto fail;
    }
  }
  /* staging buffers, page-aligned (O_DIRECT) */
  d->nbufs = nbufs;
  d->bufs = mmap(NULL, (size_t)nbufs * d->slot_bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  d->free_bufs = malloc(nbufs * sizeof(uint32_t));
  if (d->bufs == MAP_FAILED || !d->free_bufs) {
    d->bufs = d->bufs == MAP_FAILED ? NULL : d->bufs;
    rc = KVS_ENOMEM;
    snprintf(err, err_len, "disk tier: %u staging buffers of %llu bytes",
             nbufs, (unsigned long long)d->slot_bytes);
    goto fail;
  }
  for (uint32_t i = 0; i < nbufs; i++)
    d->free_bufs[i] = nbufs - 1 - i;
  d->nfree = nbufs;
  rc = io_uring_queue_init(nbufs < 4096 ? nbufs : 4096, &d->ring, 0);
  if (rc < 0) {
    snprintf(err, err_len, "disk tier: io_uring_queue_init: %s",
             strerror(-rc));
    rc = KVS_ENOTSUP;
    goto fail;
  }
  d->ring_ok = 1;
  /* Registered file and buffers when the kernel lets us (memlock limits):
   * else plain reads and writes, said once. */
  {
    struct iovec iov = {d->bufs, (size_t)nbufs * d->slot_bytes};
    int r1 = iov.iov_len <= (1u << 30)
                 ? io_uring_register_buffers(&d->ring, &iov, 1)
                 : -EINVAL;
    int r2 = r1 == 0 ? io_uring_register_files(&d->ring, &d->fd, 1) : r1;
    d->registered = r1 == 0 && r2 == 0;
    if (r1 == 0 && r2 != 0)
      io_uring_unregister_buffers(&d->ring);
    if (!d->registered)
      log_warn(-r2, "disk tier: cannot register buffers and file with "
               "io_uring; using plain reads and writes");
  }
  d->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (d->efd < 0 || io_uring_register_eventfd(&d->ring, d->efd) != 0) {
    rc = KVS_EIO;
    snprintf(err, err_len, "disk tier: eventfd: %s", strerror(errno));
    goto fail;
  }
  uv_poll_init(loop, &d->poll, d->efd);
  uv_check_init(loop, &d->check);
  uv_prepare_init(loop, &d->prepare);
  uv_timer_init(loop, &d->slow);
  d->poll.data = d->check.data = d->prepare.data = d->slow.data = d;
  d->handles = 4;
  uv_poll_start(&d->poll, UV_READABLE, on_poll);
  *out = d;
  return 0;
fail:
  tier_disk_close(d);
  return rc;
}

static void destroy(tier_disk *d) {
  if (d->ring_ok)
    io_uring_queue_exit(&d->ring);
  if (d->efd >= 0)
    close(d->efd);
  if (d->fd >= 0)
    close(d->fd);
  if (d->bufs)
    munmap(d->bufs, (size_t)d->nbufs * d->slot_bytes);
  free(d->free_bufs);
  free(d);
}

static void on_handle_closed(uv_handle_t *h) {
  tier_disk *d = h->data;

  if (--d->handles == 0)
    destroy(d);
}

void tier_disk_close(tier_disk *d) {
  if (!d)
    return;
  if (!d->handles) { /* open failed before the handles */
    destroy(d);
    return;
  }
  uv_close((uv_handle_t *)&d->poll, on_handle_closed);
  uv_close((uv_handle_t *)&d->check, on_handle_closed);
  uv_close((uv_handle_t *)&d->prepare, on_handle_closed);
  uv_close((uv_handle_t *)&d->slow, on_handle_closed);
}

uint32_t tier_disk_slots(const tier_disk *d) { return d->nslots; }
int tier_disk_direct(const tier_disk *d) { return d->direct; }
int tier_disk_registered(const tier_disk *d) { return d->registered; }

int tier_disk_buf_get(tier_disk *d, uint32_t *buf) {
  if (!d->nfree)
    return KVS_ELIMIT;
  *buf = d->free_bufs[--d->nfree];
  return 0;
}

void *tier_disk_buf_data(const tier_disk *d, uint32_t buf) {
  return buf_of(d, buf) + HDR_BYTES;
}

uint64_t tier_disk_sum(const tier_disk *d, uint32_t buf) {
  return XXH3_64bits(buf_of(d, buf) + HDR_BYTES, d->data_len);
}

void tier_disk_bufs_region(const tier_disk *d, void **p, size_t *len) {
  *p = d->bufs;
  *len = (size_t)d->nbufs * d->slot_bytes;
}

void tier_disk_buf_put(tier_disk *d, uint32_t buf) {
  d->free_bufs[d->nfree++] = buf;
}

uint32_t tier_disk_bufs_free(const tier_disk *d) { return d->nfree; }
uint32_t tier_disk_bufs(const tier_disk *d) { return d->nbufs; }

/* ---- restart --------------------------------------------------------------- */

/* Sorts header p of slot s into st; 1 when it is good (cb). */
static int scan_one(tier_disk *d, uint32_t s, uint8_t *p, int res,
                    tier_disk_scan_stats *st) {
  slot_hdr h;
  const tier_disk_stamp *m = &d->stamp;

  memcpy(&h, p, sizeof(h));
  if (res != (int)HDR_BYTES) {
    st->io_errors++;
    return 0;
  }
  if (h.magic == 0 && h.version == 0 && h.hdr_xxh3 == 0) {
    st->empty++;
    return 0;
  }
  if (h.magic != MAGIC) {
    st->torn++;
    return 0;
  }
  if (h.version != VERSION) {
    st->other_version++;
    return 0;
  }
  if (h.hdr_bytes != HDR_BYTES || h.hdr_xxh3 != hdr_sum(p)) {
    st->torn++;
    return 0;
  }
  if (h.gen > st->max_gen)
    st->max_gen = h.gen;
  if (h.block_size != m->block_size || h.num_layers != m->num_layers ||
      h.num_kv_heads != m->num_kv_heads || h.head_dim != m->head_dim ||
      h.dtype != m->dtype || h.data_len != d->data_len) {
    if (!st->other_layout++) {
      char dt[24]; /* the slot's dtype by name; a value unknown here, as is */

      if (kvs_dtype_size(h.dtype))
        snprintf(dt, sizeof(dt), "%s", kvs_dtype_name(h.dtype));
      else
        snprintf(dt, sizeof(dt), "value %u", h.dtype);
      snprintf(st->layout_note, sizeof(st->layout_note),
               "slot %u holds a block of block_size %u, %u layers, %u kv "
               "heads, head_dim %u, dtype %s, %llu bytes; this daemon's: "
               "%u, %u, %u, %u, %s, %llu", s, h.block_size, h.num_layers,
               h.num_kv_heads, h.head_dim, dt,
               (unsigned long long)h.data_len, m->block_size, m->num_layers,
               m->num_kv_heads, m->head_dim, kvs_dtype_name(m->dtype),
               (unsigned long long)d->data_len);
    }
    return 0;
  }
  if (h.root_lo != m->root.lo || h.root_hi != m->root.hi) {
    st->other_model++;
    return 0;
  }
  if (!(h.flags & FLAG_RESTORABLE)) {
    st->private_copies++;
    return 0;
  }
  st->good++;
  return 1;
}

int tier_disk_scan(tier_disk *d, tier_disk_scan_cb cb, void *arg,
                   tier_disk_scan_stats *st) {
  uint32_t depth = d->nbufs < d->ring.sq.ring_entries ? d->nbufs
                                                      : d->ring.sq.ring_entries;
  int res[4096];
  int rc = 0;

  memset(st, 0, sizeof(*st));
  if (depth > 4096)
    depth = 4096;
  if (!tier_disk_idle(d) || d->nfree != d->nbufs || depth == 0)
    return -EBUSY;
  for (uint32_t base = 0; base < d->nslots;) {
    uint32_t n = d->nslots - base < depth ? d->nslots - base : depth;
    uint32_t sent = 0;

    for (uint32_t i = 0; i < n; i++) {
      struct io_uring_sqe *sqe = io_uring_get_sqe(&d->ring);
      uint64_t off = (uint64_t)(base + i) * d->slot_bytes;

      if (!sqe)
        return -EBUSY; /* (cannot happen: depth <= the ring's entries) */
      if (d->registered) {
        io_uring_prep_read_fixed(sqe, 0, buf_of(d, i), HDR_BYTES, off, 0);
        sqe->flags |= IOSQE_FIXED_FILE;
      } else {
        io_uring_prep_read(sqe, d->fd, buf_of(d, i), HDR_BYTES, off);
      }
      io_uring_sqe_set_data64(sqe, i);
      res[i] = -EIO;
    }
    while (sent < n) {
      rc = io_uring_submit(&d->ring);
      if (rc == -EINTR || rc == -EAGAIN)
        continue;
      if (rc < 0)
        return rc;
      sent += (uint32_t)rc;
    }
    for (uint32_t k = 0; k < n;) {
      struct io_uring_cqe *cqe;

      rc = io_uring_wait_cqe(&d->ring, &cqe);
      if (rc == -EINTR)
        continue;
      if (rc < 0)
        return rc;
      res[io_uring_cqe_get_data64(cqe)] = cqe->res;
      io_uring_cqe_seen(&d->ring, cqe);
      k++;
    }
    for (uint32_t i = 0; i < n; i++) {
      uint8_t *p = buf_of(d, i);

      st->slots++;
      if (scan_one(d, base + i, p, res[i], st)) {
        slot_hdr h;
        kvs_hash128 hash;

        memcpy(&h, p, sizeof(h));
        hash.lo = h.hash_lo;
        hash.hi = h.hash_hi;
        cb(arg, base + i, h.gen, hash,
           (h.flags & FLAG_TOKENS) ? (const uint32_t *)(p + TOK_OFF) : NULL);
      }
    }
    base += n;
  }
  if (st->max_gen >= d->gen)
    d->gen = st->max_gen + 1;
  return 0;
}

int tier_disk_sync(tier_disk *d) {
  return fdatasync(d->fd) == 0 ? 0 : -errno;
}

int tier_disk_idle(const tier_disk *d) {
  return d->inflight == 0 && d->waiting == NULL;
}

void tier_disk_get_stats(const tier_disk *d, tier_disk_stats *st) {
  *st = d->st;
}
