/*
 * cuda_loader.c — opens the CUDA driver with dlopen, resolves the entry
 * points of kvs_cuda_int.h, and opens the one device (and its primary
 * context) a process works on.  Shared by the kernels' launcher
 * (cuda_driver.c) and the VMM pool (vmm.c).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kvs_cuda_int.h"
#include "kvs_status.h"

kvs__cu_table kvs__cu;
int kvs__cu_vmm;
int kvs__cu_batch;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int load_rc = 1; /* 1: not tried yet; then 0 or KVS_ENODEV */
static const char *load_reason = "";
static char reason_buf[512];

/* The open device: written once under lock, then read without it. */
static int dev_open;
static CUdevice dev;
static CUcontext ctx;
static char dev_uuid[64];

int kvs__cu_status(CUresult r) {
  switch (r) {
  case CUDA_SUCCESS:
    return 0;
  case CUDA_ERROR_INVALID_VALUE:
  case CUDA_ERROR_INVALID_HANDLE:
    return KVS_EINVAL;
  case CUDA_ERROR_OUT_OF_MEMORY:
    return KVS_ENOMEM;
  case CUDA_ERROR_NO_DEVICE:
  case CUDA_ERROR_INVALID_DEVICE:
  case CUDA_ERROR_NOT_INITIALIZED:
    return KVS_ENODEV;
  case CUDA_ERROR_NOT_SUPPORTED:
  case CUDA_ERROR_NO_BINARY_FOR_GPU:
    return KVS_ENOTSUP;
  case CUDA_ERROR_NOT_PERMITTED:
    return KVS_EPERM;
  /* The errors after which the context is lost for good (cuda.h: "the
   * process is left in an inconsistent state and any further CUDA work will
   * return the same error"), with every allocation and stream of this
   * process on that GPU: an uncorrectable ECC error, a fault in a kernel or
   * copy, a launch that timed out or failed, a device assert, an unknown
   * error (typically a GPU that fell off the bus). */
  case 214: /* ECC_UNCORRECTABLE */
  case 700: /* ILLEGAL_ADDRESS */
  case 702: /* LAUNCH_TIMEOUT */
  case 709: /* CONTEXT_IS_DESTROYED */
  case 710: /* ASSERT */
  case 714: /* HARDWARE_STACK_ERROR */
  case 715: /* ILLEGAL_INSTRUCTION */
  case 716: /* MISALIGNED_ADDRESS */
  case 717: /* INVALID_ADDRESS_SPACE */
  case 718: /* INVALID_PC */
  case 719: /* LAUNCH_FAILED */
  case 999: /* UNKNOWN */
    return KVS_EDEVICE;
  default:
    return KVS_EINTERNAL;
  }
}

void kvs__cu_describe(char *buf, size_t len, const char *what, CUresult r) {
  const char *s = NULL;

  if (kvs__cu.cuGetErrorString)
    kvs__cu.cuGetErrorString(r, &s);
  snprintf(buf, len, "%s: %s (CUresult %d)", what, s ? s : "unknown error",
           r);
}

void kvs__cu_format_uuid(char *out, size_t len, const CUuuid *u) {
  const unsigned char *b = u->bytes;

  snprintf(out, len,
           "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
           "%02x%02x%02x%02x%02x%02x",
           b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10],
           b[11], b[12], b[13], b[14], b[15]);
}

/* Resolves one entry point; 0 or -1. */
static int resolve(void *h, const char *sym, void *field) {
  void *p = dlsym(h, sym);

  if (!p)
    return -1;
  memcpy(field, &p, sizeof p);
  return 0;
}

static int load_locked(void) {
  const char *path = getenv("KVS_CUDA_DRIVER");
  void *h;
  CUresult r;
  int n = 0;

  if (load_rc != 1)
    return load_rc;
  load_rc = KVS_ENODEV;
  if (!path || !*path)
    path = "libcuda.so.1";
  h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();

    snprintf(reason_buf, sizeof reason_buf, "no CUDA driver: %s",
             e ? e : path);
    load_reason = reason_buf;
    return load_rc;
  }
#define KVS_CU_CORE_LOAD(field, sym, args)                                   \
  if (resolve(h, sym, &kvs__cu.field) < 0) {                                 \
    snprintf(reason_buf, sizeof reason_buf,                                  \
             "%s lacks " sym " (driver too old)", path);                     \
    load_reason = reason_buf;                                                \
    return load_rc;                                                          \
  }
  KVS_CU_CORE(KVS_CU_CORE_LOAD)
#undef KVS_CU_CORE_LOAD
  kvs__cu_vmm = 1;
#define KVS_CU_VMM_LOAD(field, sym, args)                                    \
  if (resolve(h, sym, &kvs__cu.field) < 0)                                   \
    kvs__cu_vmm = 0;
  KVS_CU_VMM(KVS_CU_VMM_LOAD)
#undef KVS_CU_VMM_LOAD
  {
    const char *e = getenv("KVS_CUDA_COPY_BATCH");

    kvs__cu_batch = !(e && strcmp(e, "0") == 0);
  }
#define KVS_CU_BATCH_LOAD(field, sym, args)                                  \
  if (resolve(h, sym, &kvs__cu.field) < 0)                                   \
    kvs__cu_batch = 0;
  KVS_CU_BATCH(KVS_CU_BATCH_LOAD)
#undef KVS_CU_BATCH_LOAD
  r = kvs__cu.cuInit(0);
  if (r != CUDA_SUCCESS) {
    kvs__cu_describe(reason_buf, sizeof reason_buf, "cuInit failed", r);
    load_reason = reason_buf;
    return load_rc;
  }
  r = kvs__cu.cuDeviceGetCount(&n);
  if (r != CUDA_SUCCESS || n == 0) {
    load_reason = "no CUDA device";
    return load_rc;
  }
  load_rc = 0;
  load_reason = "";
  return 0;
}

int kvs__cu_load(const char **reason) {
  int rc;

  pthread_mutex_lock(&lock);
  rc = load_locked();
  if (reason)
    *reason = load_reason;
  pthread_mutex_unlock(&lock);
  return rc;
}

/* Does the device's UUID text `have` ("GPU-...") match `want` (with or
 * without the "GPU-" prefix, any case)? */
static int uuid_match(const char *want, const char *have) {
  if (strncasecmp(want, "GPU-", 4) != 0)
    have += 4;
  return strcasecmp(want, have) == 0;
}

/* A decimal ordinal, or -1. */
static int parse_ordinal(const char *s) {
  char *end;
  long v;

  if (!s || !*s || strlen(s) > 6)
    return -1;
  v = strtol(s, &end, 10);
  return *end || v < 0 ? -1 : (int)v;
}

/* Finds the device `want` names; 0 and *out, *uuid, or a status. */
static int find_device(const char *want, CUdevice *out, char *uuid,
                       size_t uuid_len, char *err, size_t err_len) {
  int n = 0, ord = parse_ordinal(want), i;
  CUresult r = kvs__cu.cuDeviceGetCount(&n);

  if (r != CUDA_SUCCESS) {
    kvs__cu_describe(err, err_len, "cuDeviceGetCount", r);
    return kvs__cu_status(r);
  }
  if (ord >= n) {
    snprintf(err, err_len, "no CUDA device %d (%d visible)", ord, n);
    return KVS_ENOENT;
  }
  for (i = 0; i < n; i++) {
    CUdevice d;
    CUuuid u;
    char s[64];

    if (ord >= 0 && i != ord)
      continue;
    if (kvs__cu.cuDeviceGet(&d, i) != CUDA_SUCCESS ||
        kvs__cu.cuDeviceGetUuid(&u, d) != CUDA_SUCCESS)
      continue;
    kvs__cu_format_uuid(s, sizeof s, &u);
    if (ord >= 0 || !want || !*want || uuid_match(want, s)) {
      *out = d;
      snprintf(uuid, uuid_len, "%s", s);
      return 0;
    }
  }
  snprintf(err, err_len, "no visible CUDA device has the UUID %s (%d visible;"
           " check CUDA_VISIBLE_DEVICES)", want, n);
  return KVS_ENOENT;
}

static int ctx_open_locked(const char *want, char *err, size_t err_len) {
  const char *reason;
  CUdevice d = 0;
  char uuid[64];
  CUresult r;
  int rc = load_locked();

  if (rc) {
    reason = load_reason;
    snprintf(err, err_len, "%s", reason);
    return rc;
  }
  if (dev_open && (!want || !*want))
    return 0;
  rc = find_device(want, &d, uuid, sizeof uuid, err, err_len);
  if (rc)
    return rc;
  if (dev_open) {
    if (strcmp(uuid, dev_uuid) == 0)
      return 0;
    snprintf(err, err_len, "this process already works on %s, not %s",
             dev_uuid, uuid);
    return KVS_ESTATE;
  }
  r = kvs__cu.cuDevicePrimaryCtxRetain(&ctx, d);
  if (r != CUDA_SUCCESS) {
    kvs__cu_describe(err, err_len, "cuDevicePrimaryCtxRetain", r);
    return kvs__cu_status(r);
  }
  dev = d;
  memcpy(dev_uuid, uuid, sizeof dev_uuid);
  __atomic_store_n(&dev_open, 1, __ATOMIC_RELEASE);
  return 0;
}

int kvs__cuda_ctx_open(const char *want, char *err, size_t err_len) {
  char dummy[8];
  CUresult r;
  int rc;

  if (!err || !err_len) {
    err = dummy;
    err_len = sizeof dummy;
  }
  err[0] = '\0';
  pthread_mutex_lock(&lock);
  rc = ctx_open_locked(want, err, err_len);
  pthread_mutex_unlock(&lock);
  if (rc)
    return rc;
  r = kvs__cu.cuCtxSetCurrent(ctx);
  if (r != CUDA_SUCCESS) {
    kvs__cu_describe(err, err_len, "cuCtxSetCurrent", r);
    return kvs__cu_status(r);
  }
  return 0;
}

CUdevice kvs__cuda_device(void) { return dev; }

const char *kvs__cuda_uuid(void) {
  return __atomic_load_n(&dev_open, __ATOMIC_ACQUIRE) ? dev_uuid : "";
}
