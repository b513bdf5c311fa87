/*
 * cuda_standin.c — a stand-in CUDA driver for machines without a GPU.
 *
 * A shared object (libcuda-standin.so) that exports the subset of the CUDA
 * driver API kvshare resolves (gpu/kvs_cuda_int.h: KVS_CU_CORE and
 * KVS_CU_VMM, with the driver's own symbol names such as cuMemAlloc_v2),
 * built over memfd, mmap and threads.  kvshare opens it instead of
 * libcuda.so.1 when KVS_CUDA_DRIVER names it, so `make test` runs the GPU
 * code paths (the daemon's VMM export, the workers' import and mapping,
 * copies, kernel launches, the copy engine's host callbacks) on any CPU
 * machine.  This file holds configuration, devices, contexts and memory;
 * standin_exec.c holds streams, events, modules and kernel launches.
 *
 * The trick: a device pointer IS a host address.  cuMemCreate makes a memfd
 * (named "kvs-standin:<uuid>:<pid>:<n>": the creating process and its n-th
 * allocation, so that a test can tell whose memory a process maps, and in
 * which order), export hands out a dup of it, import takes
 * one, cuMemMap maps it MAP_SHARED into a PROT_NONE reservation; so a block
 * written by one process is read by another, as through a real GPU pool.
 *
 * What it emulates faithfully (where kvshare could be wrong on a real GPU):
 *   - cuInit first; a current context for the calls that need one; nothing
 *     usable in a child forked after cuInit (CUDA_ERROR_NOT_INITIALIZED).
 *   - VMM rules: granularity-multiple sizes, a mapping only inside a
 *     reservation and not over another one, memory inaccessible (PROT_NONE)
 *     until cuMemSetAccess, unmapping whole mappings only, the address range
 *     freed only once unmapped, handles and mappings reference-counted, a
 *     per-device memory budget (CUDA_ERROR_OUT_OF_MEMORY).
 *   - Streams run on their own threads, in order, after the call returned:
 *     reading a result before synchronising sees stale bytes.  Kernel
 *     parameters are copied at launch.  The legacy NULL stream waits for the
 *     blocking streams (not for CU_STREAM_NON_BLOCKING ones).  An async copy
 *     from or to pageable host memory behaves as the driver documents
 *     (staged / synchronous); registered host memory is read and written
 *     when the stream gets there.  Host functions run in stream order on
 *     the stream's thread, may not call the driver (CUDA_ERROR_NOT_PERMITTED)
 *     and are skipped once the context faulted.
 *   - Every pointer a copy or a kernel dereferences on the device side must
 *     be device memory (cuMemAlloc, a mapped range with access set) or
 *     registered host memory; a kernel that touches anything else, or whose
 *     C twin returns an error, loses the context: one line on stderr, and
 *     every later synchronisation returns CUDA_ERROR_ILLEGAL_ADDRESS.
 *   - KVS_STANDIN_FAIL makes chosen calls fail, to test error paths.
 *
 * What it cannot emulate:
 *   - Device memory: the CPU can read and write "device" pointers once
 *     access is set, where a real GPU would fault (and host code
 *     dereferencing a device pointer is a bug this cannot catch).
 *   - Kernels: they are the C twins (gpu/kernels_cpu.c), so a run proves
 *     the plumbing (arguments, ordering, memory), never the CUDA kernels'
 *     math; tests comparing CUDA with C skip on this device (its name says
 *     "stand-in").
 *   - Timing: events measure the CPU, so elapsed times mean nothing.
 *   - Memory accounting ends with the last handle and mapping, while a real
 *     driver also waits for every exported fd to be closed.
 *
 * Configuration (environment, read once by the first cuInit):
 *   KVS_STANDIN_GPUS         comma-separated "GPU-xxxxxxxx-xxxx-xxxx-xxxx-
 *                            xxxxxxxxxxxx" UUIDs of the visible devices
 *                            (default one: GPU-5354414e-4449-4e00-8000-
 *                            000000000001; empty: no device)
 *   KVS_STANDIN_MEM          bytes per device, K/M/G suffix (default 4G)
 *   KVS_STANDIN_GRANULARITY  allocation granularity, a power of two (2M)
 *   KVS_STANDIN_NAME         device name (default "kvshare CUDA stand-in
 *                            (no GPU)")
 *   KVS_STANDIN_FAIL         failure points, "name" (every call) or
 *                            "name:N" (the Nth call only), comma-separated;
 *                            see fail_names below ("fault": an async copy
 *                            faults on the stream and loses the context)
 *   KVS_STANDIN_COPY_DELAY_MS  each async copy takes this long on its
 *                            stream (to hold one in flight in a test)
 *   KVS_STANDIN_PINNED_ONLY  1: an async copy from or to host memory that
 *                            is not registered is refused (a real driver
 *                            copies it synchronously; a test that must
 *                            prove every copy of a stream is asynchronous
 *                            sets this)
 * A malformed value prints one line to stderr and makes cuInit fail.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "standin_int.h"

#define DEFAULT_UUID "GPU-5354414e-4449-4e00-8000-000000000001"
#define DEFAULT_NAME "kvshare CUDA stand-in (no GPU)"
#define MEMFD_PREFIX "kvs-standin:"
#define MAX_DEVICES 16

pthread_mutex_t standin__lock = PTHREAD_MUTEX_INITIALIZER;
unsigned standin__copy_delay_ms;
int standin__pinned_only;
pthread_cond_t standin__changed = PTHREAD_COND_INITIALIZER;
__thread int standin__in_host_fn;

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
  char line[512];
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  fprintf(stderr, "cuda-standin: %s\n", line);
}

/* ---- configuration and init ---------------------------------------------- */

struct device {
  CUuuid uuid;
  char uuid_text[48];
  struct CUctx_st ctx;
  size_t used; /* bytes of cuMemCreate + cuMemAlloc held, this process */
};

/* KVS_STANDIN_FAIL's names, in the order of enum standin_fail. */
static const char *const fail_names[FAIL__COUNT] = {
    "init",   "vmm",    "posix_fd", "create",     "export",
    "import", "reserve", "map",     "set_access", "module",
    "launch", "hostfunc", "copy", "fault", "memcpy_batch"};

static unsigned create_serial; /* cuMemCreate calls of this process */
static int config_done;    /* the environment was read (under lock) */
static CUresult config_rc; /* what reading it gave */
static struct device devs[MAX_DEVICES];
static int ndev;
static size_t mem_total, granularity;
static char dev_name[256];
static int fail_on[FAIL__COUNT];            /* 1: this point is configured */
static unsigned long fail_nth[FAIL__COUNT]; /* 0: every call; else the Nth */
static unsigned long fail_calls[FAIL__COUNT];

static int inited; /* a cuInit succeeded (atomic) */
static int forked; /* this is a child forked after cuInit (atomic) */
static int atfork_done;
static __thread struct CUctx_st *tls_ctx;

static void on_fork_child(void) {
  __atomic_store_n(&forked, 1, __ATOMIC_RELAXED);
}

/* "123", "64K", "512M", "4G" -> bytes; -1 when malformed. */
static int parse_size(const char *s, size_t *out) {
  unsigned long long v, mul = 1;
  char *end;

  if (!s || *s < '0' || *s > '9')
    return -1;
  errno = 0;
  v = strtoull(s, &end, 10);
  if (errno)
    return -1;
  if (*end == 'K' || *end == 'k')
    mul = 1ull << 10;
  else if (*end == 'M' || *end == 'm')
    mul = 1ull << 20;
  else if (*end == 'G' || *end == 'g')
    mul = 1ull << 30;
  if (mul != 1)
    end++;
  if (*end || v == 0 || v > SIZE_MAX / mul)
    return -1;
  *out = (size_t)(v * mul);
  return 0;
}

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (len bytes) -> 16 bytes. */
static int parse_uuid(const char *s, size_t len, CUuuid *u) {
  static const char form[] = "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx";
  int n = 0;

  if (len != sizeof form - 1)
    return -1;
  for (size_t i = 0; i < len; i++) {
    if (form[i] != 'x') {
      if (s[i] != form[i])
        return -1;
      continue;
    }
    char c = s[i];
    int d = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : -1;
    if (d < 0)
      return -1;
    if (n % 2 == 0)
      u->bytes[n / 2] = (unsigned char)(d << 4);
    else
      u->bytes[n / 2] |= (unsigned char)d;
    n++;
  }
  return 0;
}

/* 16 bytes -> "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi. */
static void format_uuid(char *out, size_t len, const CUuuid *u) {
  const unsigned char *b = u->bytes;

  snprintf(out, len,
           "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
           "%02x%02x%02x%02x%02x%02x",
           b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10],
           b[11], b[12], b[13], b[14], b[15]);
}

static int parse_gpus(const char *s) {
  const char *p = s;

  ndev = 0;
  if (!*s)
    return 0; /* set and empty: a machine with no device */
  for (;;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    struct device *d;

    if (ndev == MAX_DEVICES) {
      say("KVS_STANDIN_GPUS: more than %d devices", MAX_DEVICES);
      return -1;
    }
    d = &devs[ndev];
    if (parse_uuid(p, len, &d->uuid)) {
      say("KVS_STANDIN_GPUS: '%.*s' is not a GPU-xxxxxxxx-xxxx-xxxx-xxxx-"
          "xxxxxxxxxxxx UUID", (int)len, p);
      return -1;
    }
    /* Canonical (lower-case) text: it names the memfds another process
     * matches against its own list. */
    format_uuid(d->uuid_text, sizeof d->uuid_text, &d->uuid);
    ndev++;
    if (!comma)
      return 0;
    p = comma + 1;
  }
}

static int parse_fail(const char *s) {
  const char *p = s;

  while (*p) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    const char *colon = memchr(p, ':', len);
    size_t name_len = colon ? (size_t)(colon - p) : len;
    unsigned long nth = 0;
    int f;

    for (f = 0; f < FAIL__COUNT; f++)
      if (strlen(fail_names[f]) == name_len &&
          memcmp(fail_names[f], p, name_len) == 0)
        break;
    if (f == FAIL__COUNT) {
      say("KVS_STANDIN_FAIL: unknown failure point '%.*s' (known: init, "
          "vmm, posix_fd, create, export, import, reserve, map, set_access, "
          "module, launch, hostfunc, copy, fault)", (int)name_len, p);
      return -1;
    }
    if (colon) {
      char num[24], *end;
      size_t nlen = len - name_len - 1;

      if (nlen == 0 || nlen >= sizeof num) {
        say("KVS_STANDIN_FAIL: bad call number in '%.*s'", (int)len, p);
        return -1;
      }
      memcpy(num, colon + 1, nlen);
      num[nlen] = '\0';
      errno = 0;
      nth = strtoul(num, &end, 10);
      if (errno || *end || nth == 0 || num[0] < '0' || num[0] > '9') {
        say("KVS_STANDIN_FAIL: bad call number in '%.*s' (1 or more)",
            (int)len, p);
        return -1;
      }
    }
    fail_on[f] = 1;
    fail_nth[f] = nth;
    if (!comma)
      break;
    p = comma + 1;
    if (!*p) {
      say("KVS_STANDIN_FAIL: '%s' ends with a comma", s);
      return -1;
    }
  }
  return 0;
}

/* Reads the environment once; lock held. */
static CUresult config_locked(void) {
  const char *s;

  if (config_done)
    return config_rc;
  config_done = 1;
  config_rc = CUDA_ERROR_INVALID_VALUE;
  s = getenv("KVS_STANDIN_GPUS");
  if (parse_gpus(s ? s : DEFAULT_UUID))
    return config_rc;
  s = getenv("KVS_STANDIN_MEM");
  mem_total = (size_t)4 << 30;
  if (s && parse_size(s, &mem_total)) {
    say("KVS_STANDIN_MEM: '%s' is not a size (bytes, K, M or G)", s);
    return config_rc;
  }
  s = getenv("KVS_STANDIN_GRANULARITY");
  granularity = (size_t)2 << 20;
  if (s && (parse_size(s, &granularity) || (granularity & (granularity - 1)) ||
            granularity < (size_t)sysconf(_SC_PAGESIZE))) {
    say("KVS_STANDIN_GRANULARITY: '%s' is not a power of two of at least a "
        "page", s);
    return config_rc;
  }
  s = getenv("KVS_STANDIN_NAME");
  snprintf(dev_name, sizeof dev_name, "%s", s && *s ? s : DEFAULT_NAME);
  s = getenv("KVS_STANDIN_FAIL");
  if (s && parse_fail(s))
    return config_rc;
  s = getenv("KVS_STANDIN_COPY_DELAY_MS");
  if (s) {
    char *end;
    long v = strtol(s, &end, 10);

    if (end == s || *end || v < 0 || v > 60000) {
      say("KVS_STANDIN_COPY_DELAY_MS: '%s' is not 0 to 60000", s);
      return config_rc;
    }
    standin__copy_delay_ms = (unsigned)v;
  }
  s = getenv("KVS_STANDIN_PINNED_ONLY");
  if (s && strcmp(s, "0") && strcmp(s, "1")) {
    say("KVS_STANDIN_PINNED_ONLY: '%s' is not 0 or 1", s);
    return config_rc;
  }
  standin__pinned_only = s && !strcmp(s, "1");
  for (int i = 0; i < ndev; i++)
    devs[i].ctx.dev = i;
  return config_rc = CUDA_SUCCESS;
}

int standin__fail(enum standin_fail f) {
  int hit;

  pthread_mutex_lock(&standin__lock);
  fail_calls[f]++;
  hit = fail_on[f] && (fail_nth[f] == 0 || fail_nth[f] == fail_calls[f]);
  pthread_mutex_unlock(&standin__lock);
  return hit;
}

CUresult standin__enter(void) {
  if (standin__in_host_fn)
    return CUDA_ERROR_NOT_PERMITTED;
  if (!__atomic_load_n(&inited, __ATOMIC_ACQUIRE) ||
      __atomic_load_n(&forked, __ATOMIC_RELAXED))
    return CUDA_ERROR_NOT_INITIALIZED;
  return CUDA_SUCCESS;
}

CUresult cuInit(unsigned flags) {
  CUresult r;

  if (standin__in_host_fn)
    return CUDA_ERROR_NOT_PERMITTED;
  if (__atomic_load_n(&forked, __ATOMIC_RELAXED))
    return CUDA_ERROR_NOT_INITIALIZED;
  if (flags != 0)
    return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&standin__lock);
  r = config_locked();
  if (r == CUDA_SUCCESS && !atfork_done) {
    /* A forked child cannot use its parent's driver state (threads are
     * gone, and a real driver refuses it too). */
    pthread_atfork(NULL, NULL, on_fork_child);
    atfork_done = 1;
  }
  pthread_mutex_unlock(&standin__lock);
  if (r != CUDA_SUCCESS)
    return r;
  if (standin__fail(FAIL_INIT))
    return CUDA_ERROR_NO_DEVICE;
  if (ndev == 0)
    return CUDA_ERROR_NO_DEVICE;
  __atomic_store_n(&inited, 1, __ATOMIC_RELEASE);
  return CUDA_SUCCESS;
}

/* ---- devices and contexts ------------------------------------------------ */

static int dev_ok(CUdevice d) { return d >= 0 && d < ndev; }

CUresult cuDeviceGetCount(int *count) {
  STANDIN_ENTER();
  if (!count)
    return CUDA_ERROR_INVALID_VALUE;
  *count = ndev;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
  STANDIN_ENTER();
  if (!dev)
    return CUDA_ERROR_INVALID_VALUE;
  if (!dev_ok(ordinal))
    return CUDA_ERROR_INVALID_DEVICE;
  *dev = ordinal;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
  STANDIN_ENTER();
  if (!name || len <= 0)
    return CUDA_ERROR_INVALID_VALUE;
  if (!dev_ok(dev))
    return CUDA_ERROR_INVALID_DEVICE;
  snprintf(name, (size_t)len, "%s", dev_name);
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) {
  STANDIN_ENTER();
  if (!uuid)
    return CUDA_ERROR_INVALID_VALUE;
  if (!dev_ok(dev))
    return CUDA_ERROR_INVALID_DEVICE;
  *uuid = devs[dev].uuid;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *value, int attr, CUdevice dev) {
  STANDIN_ENTER();
  if (!value)
    return CUDA_ERROR_INVALID_VALUE;
  if (!dev_ok(dev))
    return CUDA_ERROR_INVALID_DEVICE;
  switch (attr) {
  case CU_ATTR_VMM_SUPPORTED:
    *value = !standin__fail(FAIL_VMM);
    break;
  case CU_ATTR_POSIX_FD_SUPPORTED:
    *value = !standin__fail(FAIL_POSIX_FD);
    break;
  case CU_ATTR_MULTIPROCESSOR_COUNT:
    *value = 4;
    break;
  case CU_ATTR_MEMORY_CLOCK_RATE:
    *value = 1000000;
    break;
  case CU_ATTR_GLOBAL_MEMORY_BUS_WIDTH:
    *value = 256;
    break;
  case CU_ATTR_CLOCK_RATE: /* (kHz) */
    *value = 1000000;
    break;
  case CU_ATTR_CC_MAJOR:
    *value = 9;
    break;
  default:
    *value = 0;
    break;
  }
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
  STANDIN_ENTER();
  if (!ctx)
    return CUDA_ERROR_INVALID_VALUE;
  if (!dev_ok(dev))
    return CUDA_ERROR_INVALID_DEVICE;
  pthread_mutex_lock(&standin__lock);
  devs[dev].ctx.refs++;
  pthread_mutex_unlock(&standin__lock);
  *ctx = &devs[dev].ctx;
  return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
  int ok;

  STANDIN_ENTER();
  if (!ctx) {
    tls_ctx = NULL;
    return CUDA_SUCCESS;
  }
  ok = 0;
  pthread_mutex_lock(&standin__lock);
  for (int i = 0; i < ndev; i++)
    if (ctx == &devs[i].ctx && ctx->refs > 0)
      ok = 1;
  pthread_mutex_unlock(&standin__lock);
  if (!ok)
    return CUDA_ERROR_INVALID_CONTEXT;
  tls_ctx = ctx;
  return CUDA_SUCCESS;
}

CUresult standin__current(struct CUctx_st **ctx) {
  *ctx = tls_ctx;
  return tls_ctx ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

void standin__fault(struct CUctx_st *ctx, const char *fmt, ...) {
  char what[400];
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  say("%s; context of %s lost (CUDA_ERROR_ILLEGAL_ADDRESS from now on)",
      what, devs[ctx->dev].uuid_text);
  pthread_mutex_lock(&standin__lock);
  ctx->sticky = CUDA_ERROR_ILLEGAL_ADDRESS;
  pthread_cond_broadcast(&standin__changed);
  pthread_mutex_unlock(&standin__lock);
}

CUresult cuGetErrorString(CUresult r, const char **s) {
  const char *t;

  if (!s)
    return CUDA_ERROR_INVALID_VALUE;
  switch (r) { /* the real driver's texts */
  case CUDA_SUCCESS: t = "no error"; break;
  case CUDA_ERROR_INVALID_VALUE: t = "invalid argument"; break;
  case CUDA_ERROR_OUT_OF_MEMORY: t = "out of memory"; break;
  case CUDA_ERROR_NOT_INITIALIZED: t = "initialization error"; break;
  case CUDA_ERROR_NO_DEVICE: t = "no CUDA-capable device is detected"; break;
  case CUDA_ERROR_INVALID_DEVICE: t = "invalid device ordinal"; break;
  case CUDA_ERROR_INVALID_IMAGE: t = "device kernel image is invalid"; break;
  case CUDA_ERROR_INVALID_CONTEXT: t = "invalid device context"; break;
  case CUDA_ERROR_ALREADY_MAPPED: t = "resource already mapped"; break;
  case CUDA_ERROR_NO_BINARY_FOR_GPU:
    t = "no kernel image is available for execution on the device"; break;
  case CUDA_ERROR_NOT_MAPPED: t = "resource not mapped"; break;
  case CUDA_ERROR_OPERATING_SYSTEM:
    t = "OS call failed or operation not supported on this OS"; break;
  case CUDA_ERROR_INVALID_HANDLE: t = "invalid resource handle"; break;
  case CUDA_ERROR_NOT_FOUND: t = "named symbol not found"; break;
  case CUDA_ERROR_NOT_READY: t = "device not ready"; break;
  case CUDA_ERROR_ILLEGAL_ADDRESS:
    t = "an illegal memory access was encountered"; break;
  case CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED:
    t = "part or all of the requested memory range is already mapped"; break;
  case CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED:
    t = "pointer does not correspond to a registered memory region"; break;
  case CUDA_ERROR_NOT_PERMITTED: t = "operation not permitted"; break;
  case CUDA_ERROR_NOT_SUPPORTED: t = "operation not supported"; break;
  default:
    return CUDA_ERROR_INVALID_VALUE;
  }
  *s = t;
  return CUDA_SUCCESS;
}

/* ---- memory tables ------------------------------------------------------- */

/* A physical allocation (cuMemCreate or import): a memfd.  The handle the
 * caller holds is the record's address. */
struct alloc {
  struct alloc *next;
  int fd;
  int dev;
  size_t size;
  int handle;     /* 1 until cuMemRelease */
  int maps;       /* mappings of it */
  int created;    /* by cuMemCreate here: counts against the device memory */
  int exportable; /* requestedHandleTypes included POSIX fds */
};

/* A VA range of cuMemAddressReserve. */
struct reservation {
  struct reservation *next;
  uintptr_t base;
  size_t size;
  int maps;
};

/* An allocation mapped inside a reservation. */
struct mapping {
  struct mapping *next;
  uintptr_t base;
  size_t size;
  struct alloc *a;
  struct reservation *r;
  int prot; /* PROT_NONE until cuMemSetAccess */
};

/* cuMemAlloc memory (anonymous) and cuMemHostRegister ranges. */
struct range {
  struct range *next;
  uintptr_t base;
  size_t size; /* bytes asked for */
  size_t len;  /* bytes mapped (cuMemAlloc: rounded up to pages) */
  int dev;
};

static struct alloc *allocs;
static struct reservation *reservations;
static struct mapping *mappings;
static struct range *plain; /* cuMemAlloc */
static struct range *host;  /* cuMemHostRegister */

static size_t page_size(void) { return (size_t)sysconf(_SC_PAGESIZE); }

static int gran_multiple(size_t x) { return x && x % granularity == 0; }

static struct alloc *alloc_find_locked(CUmemGenericAllocationHandle h) {
  for (struct alloc *a = allocs; a; a = a->next)
    if ((uintptr_t)a == h && a->handle)
      return a;
  return NULL;
}

/* Frees a when neither the handle nor a mapping holds it; lock held. */
static void alloc_put_locked(struct alloc *a) {
  struct alloc **pp;

  if (a->handle || a->maps)
    return;
  for (pp = &allocs; *pp != a; pp = &(*pp)->next)
    ;
  *pp = a->next;
  if (a->created)
    devs[a->dev].used -= a->size;
  close(a->fd);
  free(a);
}

/* Bytes of readable (writable when `write`) device memory from p to the end
 * of the region holding p, 0 when p is in none; *r gets the reservation
 * when the region is a VMM mapping (NULL otherwise).  Lock held. */
static size_t region_at_locked(uintptr_t p, int write,
                               const struct reservation **r) {
  int need = write ? PROT_READ | PROT_WRITE : PROT_READ;

  *r = NULL;
  for (struct range *a = plain; a; a = a->next)
    if (p >= a->base && p - a->base < a->size)
      return a->size - (p - a->base);
  for (struct mapping *m = mappings; m; m = m->next)
    if (p >= m->base && p - m->base < m->size) {
      *r = m->r;
      return (m->prot & need) == need ? m->size - (p - m->base) : 0;
    }
  for (struct range *a = host; a; a = a->next)
    if (p >= a->base && p - a->base < a->size)
      return a->size - (p - a->base);
  return 0;
}

/* Is p in device memory proper (cuMemAlloc or a VMM mapping), not in pinned
 * host memory, which the device also reaches? */
int standin__on_device(const void *ptr) {
  uintptr_t p = (uintptr_t)ptr;
  int dev = 0;

  pthread_mutex_lock(&standin__lock);
  for (struct range *a = plain; a && !dev; a = a->next)
    dev = p >= a->base && p - a->base < a->size;
  for (struct mapping *m = mappings; m && !dev; m = m->next)
    dev = p >= m->base && p - m->base < m->size;
  pthread_mutex_unlock(&standin__lock);
  return dev;
}

/* One allocation holds the whole range, except that a range may run on
 * through back-to-back mappings of one reservation (kvshare's pool is
 * several chunks mapped in a row): a real driver refuses a copy that runs
 * off an allocation into the next one. */
int standin__dev_range(const void *ptr, size_t n, int write) {
  const struct reservation *first = NULL, *r;
  uintptr_t p = (uintptr_t)ptr;
  int ok = 1;

  if (n == 0)
    return 1;
  if (p + n < p)
    return 0;
  pthread_mutex_lock(&standin__lock);
  for (int i = 0; n; i++) {
    size_t avail = region_at_locked(p, write, &r);

    if (!avail || (i > 0 && r != first)) {
      ok = 0;
      break;
    }
    if (avail >= n)
      break;
    if (i == 0 && !r) { /* plain or host memory: no running on */
      ok = 0;
      break;
    }
    first = r;
    p += avail;
    n -= avail;
  }
  pthread_mutex_unlock(&standin__lock);
  return ok;
}

int standin__host_registered(const void *ptr, size_t n) {
  uintptr_t p = (uintptr_t)ptr;
  int ok = 0;

  pthread_mutex_lock(&standin__lock);
  for (struct range *r = host; r; r = r->next)
    if (p >= r->base && p - r->base < r->size && n <= r->size - (p - r->base))
      ok = 1;
  pthread_mutex_unlock(&standin__lock);
  return ok;
}

/* ---- VMM ----------------------------------------------------------------- */

/* prop describes device memory on a visible device; 0 or a CUresult. */
static CUresult check_prop(const CUmemAllocationProp *prop) {
  if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
    return CUDA_ERROR_INVALID_VALUE;
  if (!dev_ok(prop->location.id))
    return CUDA_ERROR_INVALID_DEVICE;
  return CUDA_SUCCESS;
}

CUresult cuMemGetAllocationGranularity(size_t *gran,
                                       const CUmemAllocationProp *prop,
                                       int option) {
  CUresult r;

  STANDIN_ENTER();
  if (!gran || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
                option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
    return CUDA_ERROR_INVALID_VALUE;
  if ((r = check_prop(prop)))
    return r;
  if (prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
    return CUDA_ERROR_INVALID_VALUE;
  *gran = granularity;
  return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t bytes,
                     const CUmemAllocationProp *prop,
                     unsigned long long flags) {
  char name[96];
  struct alloc *a = NULL;
  struct device *d;
  int fd = -1;
  CUresult r;

  STANDIN_ENTER();
  if (!h || flags || !gran_multiple(bytes))
    return CUDA_ERROR_INVALID_VALUE;
  if ((r = check_prop(prop)))
    return r;
  if (standin__fail(FAIL_CREATE))
    return CUDA_ERROR_OUT_OF_MEMORY;
  d = &devs[prop->location.id];
  pthread_mutex_lock(&standin__lock);
  if (bytes > mem_total - d->used) {
    pthread_mutex_unlock(&standin__lock);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  d->used += bytes; /* claimed now, so two threads cannot both fit */
  pthread_mutex_unlock(&standin__lock);

  r = CUDA_ERROR_OPERATING_SYSTEM;
  snprintf(name, sizeof name, MEMFD_PREFIX "%s:%d:%u", d->uuid_text,
           (int)getpid(), __atomic_add_fetch(&create_serial, 1, __ATOMIC_RELAXED));
  fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0)
    goto fail;
  if (ftruncate(fd, (off_t)bytes) < 0) {
    r = CUDA_ERROR_OUT_OF_MEMORY;
    goto fail;
  }
  a = calloc(1, sizeof *a);
  if (!a) {
    r = CUDA_ERROR_OUT_OF_MEMORY;
    goto fail;
  }
  a->fd = fd;
  a->dev = prop->location.id;
  a->size = bytes;
  a->handle = 1;
  a->created = 1;
  a->exportable = (prop->requestedHandleTypes &
                   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0;
  pthread_mutex_lock(&standin__lock);
  a->next = allocs;
  allocs = a;
  pthread_mutex_unlock(&standin__lock);
  *h = (uintptr_t)a;
  return CUDA_SUCCESS;
fail:
  if (fd >= 0)
    close(fd);
  pthread_mutex_lock(&standin__lock);
  d->used -= bytes;
  pthread_mutex_unlock(&standin__lock);
  return r;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
  struct alloc *a;

  STANDIN_ENTER();
  pthread_mutex_lock(&standin__lock);
  a = alloc_find_locked(h);
  if (a) {
    a->handle = 0; /* the memory stays while a mapping holds it */
    alloc_put_locked(a);
  }
  pthread_mutex_unlock(&standin__lock);
  return a ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemExportToShareableHandle(void *shareable,
                                      CUmemGenericAllocationHandle h, int type,
                                      unsigned long long flags) {
  struct alloc *a;
  int fd = -1;
  CUresult r = CUDA_ERROR_INVALID_VALUE;

  STANDIN_ENTER();
  if (!shareable || flags || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
    return CUDA_ERROR_INVALID_VALUE;
  if (standin__fail(FAIL_EXPORT))
    return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&standin__lock);
  a = alloc_find_locked(h);
  if (a && !a->exportable)
    r = CUDA_ERROR_NOT_SUPPORTED; /* created without the POSIX fd type */
  else if (a) {
    fd = fcntl(a->fd, F_DUPFD_CLOEXEC, 0);
    r = fd < 0 ? CUDA_ERROR_OPERATING_SYSTEM : CUDA_SUCCESS;
  }
  pthread_mutex_unlock(&standin__lock);
  if (r == CUDA_SUCCESS)
    *(int *)shareable = fd;
  return r;
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h,
                                        void *os_handle, int type) {
  static const char want[] = "/memfd:" MEMFD_PREFIX;
  char link[64], target[256];
  int fd = (int)(intptr_t)os_handle, dev = -1, copy;
  struct alloc *a;
  struct stat st;
  ssize_t n;

  STANDIN_ENTER();
  if (!h || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || fd < 0)
    return CUDA_ERROR_INVALID_VALUE;
  if (standin__fail(FAIL_IMPORT))
    return CUDA_ERROR_INVALID_VALUE;
  /* Only what a stand-in exported:
   * "/memfd:kvs-standin:<uuid>:<pid>:<n> (deleted)". */
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  n = readlink(link, target, sizeof target - 1);
  if (n < 0)
    return CUDA_ERROR_INVALID_VALUE;
  target[n] = '\0';
  if (strncmp(target, want, sizeof want - 1) != 0)
    return CUDA_ERROR_INVALID_VALUE;
  for (int i = 0; i < ndev; i++) {
    size_t len = strlen(devs[i].uuid_text);

    if (strncmp(target + sizeof want - 1, devs[i].uuid_text, len) == 0 &&
        (target[sizeof want - 1 + len] == '\0' ||
         target[sizeof want - 1 + len] == ':' ||
         target[sizeof want - 1 + len] == ' '))
      dev = i;
  }
  if (dev < 0)
    return CUDA_ERROR_NOT_SUPPORTED; /* memory of a GPU not visible here */
  if (fstat(fd, &st) < 0 || !gran_multiple((size_t)st.st_size))
    return CUDA_ERROR_INVALID_VALUE;
  copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (copy < 0)
    return CUDA_ERROR_OPERATING_SYSTEM;
  a = calloc(1, sizeof *a);
  if (!a) {
    close(copy);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  a->fd = copy;
  a->dev = dev;
  a->size = (size_t)st.st_size;
  a->handle = 1;
  a->exportable = 1;
  pthread_mutex_lock(&standin__lock);
  a->next = allocs;
  allocs = a;
  pthread_mutex_unlock(&standin__lock);
  *h = (uintptr_t)a;
  return CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr *p, size_t bytes, size_t align,
                             CUdeviceptr addr, unsigned long long flags) {
  struct reservation *r;
  uintptr_t raw, base;
  size_t len;
  void *m;

  STANDIN_ENTER();
  (void)addr; /* a hint only */
  if (!p || flags || !gran_multiple(bytes) || (align & (align - 1)))
    return CUDA_ERROR_INVALID_VALUE;
  if (standin__fail(FAIL_RESERVE))
    return CUDA_ERROR_INVALID_VALUE;
  if (align < granularity)
    align = granularity;
  if (bytes > SIZE_MAX - align)
    return CUDA_ERROR_OUT_OF_MEMORY;
  /* Over-reserve by the alignment, then trim both ends. */
  len = bytes + align;
  m = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
           -1, 0);
  if (m == MAP_FAILED)
    return CUDA_ERROR_OUT_OF_MEMORY;
  raw = (uintptr_t)m;
  base = (raw + align - 1) & ~(uintptr_t)(align - 1);
  if (base > raw)
    munmap(m, base - raw);
  if (raw + len > base + bytes)
    munmap((void *)(base + bytes), raw + len - (base + bytes));
  r = calloc(1, sizeof *r);
  if (!r) {
    munmap((void *)base, bytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  r->base = base;
  r->size = bytes;
  pthread_mutex_lock(&standin__lock);
  r->next = reservations;
  reservations = r;
  pthread_mutex_unlock(&standin__lock);
  *p = base;
  return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr p, size_t bytes) {
  struct reservation **pp, *r = NULL;
  CUresult res = CUDA_ERROR_INVALID_VALUE;

  STANDIN_ENTER();
  pthread_mutex_lock(&standin__lock);
  for (pp = &reservations; *pp; pp = &(*pp)->next)
    if ((*pp)->base == p && (*pp)->size == bytes) {
      r = *pp;
      /* The real driver wants every mapping gone first. */
      if (r->maps == 0) {
        *pp = r->next;
        res = CUDA_SUCCESS;
      }
      break;
    }
  pthread_mutex_unlock(&standin__lock);
  if (res == CUDA_SUCCESS) {
    munmap((void *)r->base, r->size);
    free(r);
  }
  return res;
}

CUresult cuMemMap(CUdeviceptr p, size_t bytes, size_t offset,
                  CUmemGenericAllocationHandle h, unsigned long long flags) {
  struct reservation *r;
  struct mapping *m;
  struct alloc *a;
  CUresult res = CUDA_ERROR_INVALID_VALUE;

  STANDIN_ENTER();
  /* kvshare maps whole allocations only; sub-ranges are refused. */
  if (flags || offset || !gran_multiple(bytes) || p % granularity)
    return CUDA_ERROR_INVALID_VALUE;
  if (standin__fail(FAIL_MAP))
    return CUDA_ERROR_INVALID_VALUE;
  m = calloc(1, sizeof *m);
  if (!m)
    return CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&standin__lock);
  a = alloc_find_locked(h);
  if (!a || a->size != bytes)
    goto out;
  for (r = reservations; r; r = r->next)
    if (p >= r->base && p - r->base < r->size)
      break;
  if (!r || bytes > r->size - (p - r->base))
    goto out;
  for (struct mapping *o = mappings; o; o = o->next)
    if (o->base < p + bytes && p < o->base + o->size) {
      res = CUDA_ERROR_ALREADY_MAPPED;
      goto out;
    }
  /* PROT_NONE: not accessible before cuMemSetAccess, as on a GPU. */
  if (mmap((void *)p, bytes, PROT_NONE, MAP_SHARED | MAP_FIXED, a->fd, 0) ==
      MAP_FAILED) {
    res = CUDA_ERROR_OUT_OF_MEMORY;
    goto out;
  }
  m->base = p;
  m->size = bytes;
  m->a = a;
  m->r = r;
  m->prot = PROT_NONE;
  m->next = mappings;
  mappings = m;
  a->maps++;
  r->maps++;
  m = NULL;
  res = CUDA_SUCCESS;
out:
  pthread_mutex_unlock(&standin__lock);
  free(m);
  return res;
}

/* The mapping starting at p; lock held. */
static struct mapping *mapping_at_locked(uintptr_t p) {
  for (struct mapping *m = mappings; m; m = m->next)
    if (m->base == p)
      return m;
  return NULL;
}

/* Do whole mappings, back to back, cover exactly [p, p + bytes)?  Lock
 * held. */
static int whole_mappings_locked(uintptr_t p, size_t bytes) {
  uintptr_t end = p + bytes;

  if (!bytes || end < p)
    return 0;
  while (p < end) {
    struct mapping *m = mapping_at_locked(p);

    if (!m || m->size > end - p)
      return 0;
    p += m->size;
  }
  return 1;
}

CUresult cuMemSetAccess(CUdeviceptr p, size_t bytes,
                        const CUmemAccessDesc *desc, size_t count) {
  CUresult res = CUDA_ERROR_INVALID_VALUE;
  int prot = -1;

  STANDIN_ENTER();
  if (!desc || count == 0)
    return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < count; i++) {
    int want;

    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE)
      return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(desc[i].location.id))
      return CUDA_ERROR_INVALID_DEVICE;
    if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
      want = PROT_READ | PROT_WRITE;
    else if (desc[i].flags == 1) /* CU_MEM_ACCESS_FLAGS_PROT_READ */
      want = PROT_READ;
    else if (desc[i].flags == 0)
      want = PROT_NONE;
    else
      return CUDA_ERROR_INVALID_VALUE;
    /* One CPU stands for every device: the last descriptor wins. */
    prot = want;
  }
  if (standin__fail(FAIL_SET_ACCESS))
    return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&standin__lock);
  if (whole_mappings_locked(p, bytes)) {
    if (mprotect((void *)p, bytes, prot) == 0) {
      for (uintptr_t q = p; q < p + bytes;) {
        struct mapping *m = mapping_at_locked(q);

        m->prot = prot;
        q += m->size;
      }
      res = CUDA_SUCCESS;
    } else {
      res = CUDA_ERROR_OPERATING_SYSTEM;
    }
  }
  pthread_mutex_unlock(&standin__lock);
  return res;
}

CUresult cuMemUnmap(CUdeviceptr p, size_t bytes) {
  struct mapping *list = NULL;
  CUresult res = CUDA_ERROR_INVALID_VALUE;

  STANDIN_ENTER();
  pthread_mutex_lock(&standin__lock);
  if (!whole_mappings_locked(p, bytes))
    goto out;
  /* The driver synchronises here (cuda.h's note_sync): no stream may still
   * be using the range when it goes. */
  for (int i = 0; i < ndev; i++)
    standin__drain_locked(&devs[i].ctx, 1);
  if (!whole_mappings_locked(p, bytes)) /* changed while we waited */
    goto out;
  /* Back to a reservation: anonymous PROT_NONE over the same range. */
  if (mmap((void *)p, bytes, PROT_NONE,
           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1,
           0) == MAP_FAILED) {
    res = CUDA_ERROR_OPERATING_SYSTEM;
    goto out;
  }
  for (struct mapping **pp = &mappings; *pp;) {
    struct mapping *m = *pp;

    if (m->base >= p && m->base < p + bytes) {
      *pp = m->next;
      m->next = list;
      list = m;
    } else {
      pp = &m->next;
    }
  }
  while (list) {
    struct mapping *m = list;

    list = m->next;
    m->r->maps--;
    m->a->maps--;
    alloc_put_locked(m->a);
    free(m);
  }
  res = CUDA_SUCCESS;
out:
  pthread_mutex_unlock(&standin__lock);
  return res;
}

/* ---- plain memory -------------------------------------------------------- */

CUresult cuMemGetInfo(size_t *free_b, size_t *total_b) {
  struct CUctx_st *ctx;
  CUresult r;

  STANDIN_ENTER();
  if ((r = standin__current(&ctx)))
    return r;
  if (!free_b || !total_b)
    return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&standin__lock);
  *total_b = mem_total;
  *free_b = mem_total - devs[ctx->dev].used;
  pthread_mutex_unlock(&standin__lock);
  return CUDA_SUCCESS;
}

CUresult cuMemAlloc(CUdeviceptr *p, size_t bytes) {
  struct CUctx_st *ctx;
  struct range *a;
  size_t len;
  void *m;
  CUresult r;

  STANDIN_ENTER();
  if ((r = standin__current(&ctx)))
    return r;
  if (!p || bytes == 0)
    return CUDA_ERROR_INVALID_VALUE;
  len = (bytes + page_size() - 1) & ~(page_size() - 1);
  if (len < bytes)
    return CUDA_ERROR_OUT_OF_MEMORY;
  a = calloc(1, sizeof *a);
  if (!a)
    return CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&standin__lock);
  if (len > mem_total - devs[ctx->dev].used) {
    pthread_mutex_unlock(&standin__lock);
    free(a);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  devs[ctx->dev].used += len;
  pthread_mutex_unlock(&standin__lock);
  m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
           0);
  pthread_mutex_lock(&standin__lock);
  if (m == MAP_FAILED) {
    devs[ctx->dev].used -= len;
    pthread_mutex_unlock(&standin__lock);
    free(a);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  a->base = (uintptr_t)m;
  a->size = bytes;
  a->len = len;
  a->dev = ctx->dev;
  a->next = plain;
  plain = a;
  pthread_mutex_unlock(&standin__lock);
  *p = (uintptr_t)m;
  return CUDA_SUCCESS;
}

CUresult cuMemFree(CUdeviceptr p) {
  struct CUctx_st *ctx;
  struct range **pp, *a = NULL;
  CUresult r;

  STANDIN_ENTER();
  if ((r = standin__current(&ctx)))
    return r;
  pthread_mutex_lock(&standin__lock);
  for (pp = &plain; *pp; pp = &(*pp)->next)
    if ((*pp)->base == p) {
      /* cuMemFree synchronises: nothing in flight may still use it. */
      standin__drain_locked(&devs[(*pp)->dev].ctx, 1);
      break;
    }
  for (pp = &plain; *pp; pp = &(*pp)->next) /* again: we may have waited */
    if ((*pp)->base == p) {
      a = *pp;
      *pp = a->next;
      devs[a->dev].used -= a->len;
      break;
    }
  pthread_mutex_unlock(&standin__lock);
  if (!a)
    return CUDA_ERROR_INVALID_VALUE;
  munmap((void *)a->base, a->len);
  free(a);
  return CUDA_SUCCESS;
}

/* A synchronous copy or memset on the legacy NULL stream: waits for the
 * blocking streams, then the context's sticky error; 0 or a CUresult. */
static CUresult legacy_begin(struct CUctx_st **ctx) {
  CUresult r;

  if ((r = standin__current(ctx)))
    return r;
  pthread_mutex_lock(&standin__lock);
  standin__drain_locked(*ctx, 0);
  r = (*ctx)->sticky;
  pthread_mutex_unlock(&standin__lock);
  return r;
}

CUresult cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t bytes) {
  struct CUctx_st *ctx;
  CUresult r;

  STANDIN_ENTER();
  if ((r = legacy_begin(&ctx)))
    return r;
  if (!bytes)
    return CUDA_SUCCESS;
  if (!src || !standin__dev_range((void *)(uintptr_t)dst, bytes, 1))
    return CUDA_ERROR_INVALID_VALUE;
  memcpy((void *)(uintptr_t)dst, src, bytes);
  return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t bytes) {
  struct CUctx_st *ctx;
  CUresult r;

  STANDIN_ENTER();
  if ((r = legacy_begin(&ctx)))
    return r;
  if (!bytes)
    return CUDA_SUCCESS;
  if (!dst || !standin__dev_range((void *)(uintptr_t)src, bytes, 0))
    return CUDA_ERROR_INVALID_VALUE;
  memcpy(dst, (void *)(uintptr_t)src, bytes);
  return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoD(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  struct CUctx_st *ctx;
  CUresult r;

  STANDIN_ENTER();
  if ((r = legacy_begin(&ctx)))
    return r;
  if (!bytes)
    return CUDA_SUCCESS;
  if (!standin__dev_range((void *)(uintptr_t)dst, bytes, 1) ||
      !standin__dev_range((void *)(uintptr_t)src, bytes, 0))
    return CUDA_ERROR_INVALID_VALUE;
  memmove((void *)(uintptr_t)dst, (void *)(uintptr_t)src, bytes);
  return CUDA_SUCCESS;
}

CUresult cuMemsetD8(CUdeviceptr p, unsigned char value, size_t bytes) {
  struct CUctx_st *ctx;
  CUresult r;

  STANDIN_ENTER();
  if ((r = legacy_begin(&ctx)))
    return r;
  if (!bytes)
    return CUDA_SUCCESS;
  if (!standin__dev_range((void *)(uintptr_t)p, bytes, 1))
    return CUDA_ERROR_INVALID_VALUE;
  memset((void *)(uintptr_t)p, value, bytes);
  return CUDA_SUCCESS;
}

CUresult cuMemHostRegister(void *p, size_t bytes, unsigned flags) {
  struct CUctx_st *ctx;
  uintptr_t b = (uintptr_t)p;
  struct range *reg;
  CUresult r;

  STANDIN_ENTER();
  if ((r = standin__current(&ctx)))
    return r;
  if (!p || bytes == 0 || b + bytes < b || (flags & ~0xfu))
    return CUDA_ERROR_INVALID_VALUE;
  reg = calloc(1, sizeof *reg);
  if (!reg)
    return CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&standin__lock);
  for (struct range *o = host; o; o = o->next)
    if (o->base < b + bytes && b < o->base + o->size) {
      pthread_mutex_unlock(&standin__lock);
      free(reg);
      return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    }
  reg->base = b;
  reg->size = reg->len = bytes;
  reg->dev = ctx->dev;
  reg->next = host;
  host = reg;
  pthread_mutex_unlock(&standin__lock);
  return CUDA_SUCCESS;
}

CUresult cuMemHostUnregister(void *p) {
  struct range **pp, *reg = NULL;
  CUresult r;
  struct CUctx_st *ctx;

  STANDIN_ENTER();
  if ((r = standin__current(&ctx)))
    return r;
  pthread_mutex_lock(&standin__lock);
  for (pp = &host; *pp; pp = &(*pp)->next)
    if ((*pp)->base == (uintptr_t)p) {
      reg = *pp;
      *pp = reg->next;
      break;
    }
  pthread_mutex_unlock(&standin__lock);
  if (!reg)
    return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  free(reg);
  return CUDA_SUCCESS;
}
