/*
 * test_standin.c — the stand-in CUDA driver (tests/standin/), driven through
 * kvshare's own loader (gpu/cuda_loader.c: kvs__cu_load and the kvs__cu
 * table) and checked against expectations computed here: the VMM rules and
 * an export/import across processes, memory inaccessible before
 * cuMemSetAccess, the memory budget, every KVS_STANDIN_FAIL point, stream
 * order and asynchrony, kernel parameters copied at launch, the emulated
 * kernels' bytes, events, the sticky error after a fault, and no fd, mapping
 * or thread left behind.
 *
 * Plain C (no cmocka).  Exit 0 pass, 1 fail; every failed check prints what
 * it checked.  The driver is $KVS_BUILD/tests/standin/libcuda-standin.so.
 *
 * The stand-in reads its configuration once per process (at cuInit), and a
 * real driver cannot be used in a child forked after cuInit; so the cases
 * that need another configuration run in children forked before this
 * process first loads the driver.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpu/kvs_cuda_int.h"
#include "gpu/kvs_kernels.h"
#include "kvs_shm.h"
#include "kvs_status.h"

#define CUDA_ERROR_ALREADY_MAPPED 208
#define CUDA_ERROR_ILLEGAL_ADDRESS 700
#define CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED 712
#define CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED 713

#define UUID0 "GPU-00112233-4455-6677-8899-aabbccddeeff"
#define UUID0_UPPER "GPU-00112233-4455-6677-8899-AABBCCDDEEFF"
#define UUID1 "GPU-5354414e-4449-4e00-8000-000000000002"
#define UUID2 "GPU-5354414e-4449-4e00-8000-000000000003"
#define DEFAULT_UUID "GPU-5354414e-4449-4e00-8000-000000000001"
#define MiB ((size_t)1 << 20)
#define GRAN (2 * MiB)

static int failures;
static char so_path[4096];

#define CHECK(cond, ...)                                                     \
  do {                                                                       \
    if (!(cond)) {                                                           \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                   \
      fprintf(stderr, __VA_ARGS__);                                          \
      fprintf(stderr, "\n");                                                 \
      failures++;                                                            \
    }                                                                        \
  } while (0)

/* A driver call that must return `want`. */
#define EXPECT(want, call)                                                   \
  do {                                                                       \
    CUresult r_ = (call);                                                    \
    if (r_ != (want)) {                                                      \
      fprintf(stderr, "FAIL %s:%d: %s returned %d, expected %d\n", __FILE__, \
              __LINE__, #call, r_, (int)(want));                             \
      failures++;                                                            \
    }                                                                        \
  } while (0)
#define OK(call) EXPECT(CUDA_SUCCESS, call)

/* A call the rest of the test depends on. */
#define MUST(call)                                                           \
  do {                                                                       \
    CUresult r_ = (call);                                                    \
    if (r_ != CUDA_SUCCESS) {                                                \
      fprintf(stderr, "FAIL %s:%d: %s returned %d; cannot go on\n",          \
              __FILE__, __LINE__, #call, r_);                                \
      exit(1);                                                               \
    }                                                                        \
  } while (0)

#define CU kvs__cu

/* ---- helpers ------------------------------------------------------------- */

static int count_dir(const char *path) {
  DIR *d = opendir(path);
  struct dirent *e;
  int n = 0;

  if (!d)
    return -1;
  while ((e = readdir(d)))
    if (e->d_name[0] != '.')
      n++;
  closedir(d);
  return n;
}

/* Open fds (the directory's own fd not counted). */
static int count_fds(void) { return count_dir("/proc/self/fd") - 1; }
static int count_threads(void) { return count_dir("/proc/self/task"); }

/* Lines of /proc/self/maps naming a stand-in memfd. */
static int count_maps(void) {
  FILE *f = fopen("/proc/self/maps", "r");
  char line[1024];
  int n = 0;

  if (!f)
    return -1;
  while (fgets(line, sizeof line, f))
    if (strstr(line, "kvs-standin"))
      n++;
  fclose(f);
  return n;
}

static double now_ms(void) {
  struct timespec t;

  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static void sleep_ms(int ms) {
  struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};

  nanosleep(&t, NULL);
}

/* Loads the driver through kvshare's loader; exits when it cannot. */
static void load(void) {
  const char *reason = "";

  if (kvs__cu_load(&reason) != 0) {
    fprintf(stderr, "FAIL: kvs__cu_load: %s\n", reason);
    exit(1);
  }
  if (!kvs__cu_vmm) {
    fprintf(stderr, "FAIL: the stand-in lacks a KVS_CU_VMM entry point\n");
    exit(1);
  }
}

/* Device `ordinal`'s primary context, made current in this thread. */
static CUcontext open_dev(int ordinal) {
  CUdevice d;
  CUcontext c;

  MUST(CU.cuDeviceGet(&d, ordinal));
  MUST(CU.cuDevicePrimaryCtxRetain(&c, d));
  MUST(CU.cuCtxSetCurrent(c));
  return c;
}

static CUmemAllocationProp prop_of(int dev) {
  CUmemAllocationProp p;

  memset(&p, 0, sizeof p);
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = dev;
  return p;
}

static CUmemAccessDesc access_of(int dev, int flags) {
  CUmemAccessDesc a;

  memset(&a, 0, sizeof a);
  a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.location.id = dev;
  a.flags = flags;
  return a;
}

static CUresult set_access(CUdeviceptr p, size_t n, int flags) {
  CUmemAccessDesc a = access_of(0, flags);

  return CU.cuMemSetAccess(p, n, &a, 1);
}

/* Runs fn in a forked child; returns its exit status (or 128 + signal). */
static int in_child(int (*fn)(const void *), const void *arg) {
  pid_t pid;
  int st;

  fflush(NULL);
  pid = fork();
  if (pid < 0) {
    perror("fork");
    exit(1);
  }
  if (pid == 0) {
    failures = 0; /* the child's own count */
    _exit(fn(arg) ? 1 : 0);
  }
  if (waitpid(pid, &st, 0) < 0)
    return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Forks a child that reads (write = 0) or writes one byte at p: 0 when it
 * survived, else the signal that killed it (or 1000 + its exit status). */
static int probe(volatile char *p, int write) {
  pid_t pid;
  int st;

  fflush(NULL);
  pid = fork();
  if (pid == 0) {
    struct rlimit no_core = {0, 0};

    setrlimit(RLIMIT_CORE, &no_core);
    signal(SIGSEGV, SIG_DFL); /* die of it (not a sanitizer's report) */
    signal(SIGBUS, SIG_DFL);
    if (write)
      *p = 1;
    else
      (void)*p;
    _exit(0);
  }
  if (pid < 0 || waitpid(pid, &st, 0) < 0)
    return -1;
  return WIFSIGNALED(st)   ? WTERMSIG(st)
         : WEXITSTATUS(st) ? 1000 + WEXITSTATUS(st)
                           : 0;
}

/* A host function that holds its stream until the test opens it. */
typedef struct gate {
  pthread_mutex_t m;
  pthread_cond_t c;
  int open;
} gate;

static void gate_init(gate *g) {
  pthread_mutex_init(&g->m, NULL);
  pthread_cond_init(&g->c, NULL);
  g->open = 0;
}

static void gate_fn(void *arg) {
  gate *g = arg;

  pthread_mutex_lock(&g->m);
  while (!g->open)
    pthread_cond_wait(&g->c, &g->m);
  pthread_mutex_unlock(&g->m);
}

static void gate_open(gate *g) {
  pthread_mutex_lock(&g->m);
  g->open = 1;
  pthread_cond_broadcast(&g->c);
  pthread_mutex_unlock(&g->m);
}

static void gate_destroy(gate *g) {
  pthread_mutex_destroy(&g->m);
  pthread_cond_destroy(&g->c);
}

static void sleep_fn(void *arg) { sleep_ms(*(int *)arg); }

static CUdeviceptr dev_alloc(size_t n, int fill) {
  CUdeviceptr p;

  MUST(CU.cuMemAlloc(&p, n));
  MUST(CU.cuMemsetD8(p, (unsigned char)fill, n));
  return p;
}

static void *ptr(CUdeviceptr p) { return (void *)(uintptr_t)p; }

static int all_bytes(const void *p, size_t n, int v) {
  const unsigned char *b = p;

  for (size_t i = 0; i < n; i++)
    if (b[i] != (unsigned char)v)
      return 0;
  return 1;
}

/* ---- the library itself, before cuInit ----------------------------------- */

static void test_exports(void) {
  void *h = dlopen(so_path, RTLD_NOW | RTLD_LOCAL);
  CUresult (*count)(int *);
  CUresult (*errstr)(CUresult, const char **);
  const char *s = NULL;
  int n = -1;

  CHECK(h, "dlopen %s: %s", so_path, dlerror());
  if (!h)
    return;
  /* The C twins it links stay local (standin.map). */
  CHECK(!dlsym(h, "kvs_cpu_write_kv"), "the stand-in exports kvs_cpu_write_kv");
  CHECK(!dlsym(h, "kvs_strerror"), "the stand-in exports kvs_strerror");
  CHECK(!dlsym(h, "cuMemAlloc"), "cuMemAlloc (not _v2) is exported");
  *(void **)&count = dlsym(h, "cuDeviceGetCount");
  *(void **)&errstr = dlsym(h, "cuGetErrorString");
  CHECK(count && errstr, "cuDeviceGetCount / cuGetErrorString not exported");
  if (count && errstr) {
    CHECK(count(&n) == CUDA_ERROR_NOT_INITIALIZED,
          "cuDeviceGetCount before cuInit must be NOT_INITIALIZED");
    CHECK(errstr(CUDA_ERROR_OUT_OF_MEMORY, &s) == CUDA_SUCCESS && s &&
              strcmp(s, "out of memory") == 0,
          "cuGetErrorString(OUT_OF_MEMORY) works before cuInit");
    s = "untouched";
    CHECK(errstr(12345, &s) == CUDA_ERROR_INVALID_VALUE &&
              strcmp(s, "untouched") == 0,
          "cuGetErrorString(12345) must be INVALID_VALUE, *s untouched");
  }
  dlclose(h);
}

/* ---- KVS_STANDIN_FAIL, in children --------------------------------------- */

typedef struct fail_case {
  const char *spec;
  int (*run)(void);
} fail_case;

static int child_open(void) {
  load();
  open_dev(0);
  return 0;
}

static int fc_init(void) {
  const char *reason = "";

  CHECK(kvs__cu_load(&reason) == KVS_ENODEV && strstr(reason, "cuInit"),
        "init: kvs__cu_load must fail in cuInit, said '%s'", reason);
  EXPECT(CUDA_ERROR_NO_DEVICE, CU.cuInit(0)); /* every call */
  return failures;
}

static int fc_init_first(void) {
  int n = 0;

  CHECK(kvs__cu_load(NULL) == KVS_ENODEV, "init:1: the first cuInit fails");
  OK(CU.cuInit(0)); /* the second succeeds */
  OK(CU.cuDeviceGetCount(&n));
  CHECK(n == 1, "init:1: %d devices after the second cuInit", n);
  return failures;
}

static int fc_attr(int attr_fails, int attr_ok) {
  int v = -1;

  child_open();
  OK(CU.cuDeviceGetAttribute(&v, attr_fails, 0));
  CHECK(v == 0, "attribute %d must read 0, read %d", attr_fails, v);
  OK(CU.cuDeviceGetAttribute(&v, attr_ok, 0));
  CHECK(v == 1, "attribute %d must read 1, read %d", attr_ok, v);
  return failures;
}

static int fc_vmm(void) {
  return fc_attr(CU_ATTR_VMM_SUPPORTED, CU_ATTR_POSIX_FD_SUPPORTED);
}

static int fc_posix(void) {
  return fc_attr(CU_ATTR_POSIX_FD_SUPPORTED, CU_ATTR_VMM_SUPPORTED);
}

static int fc_create(void) {
  CUmemAllocationProp p = prop_of(0);
  CUmemGenericAllocationHandle h;

  child_open();
  EXPECT(CUDA_ERROR_OUT_OF_MEMORY, CU.cuMemCreate(&h, GRAN, &p, 0));
  EXPECT(CUDA_ERROR_OUT_OF_MEMORY, CU.cuMemCreate(&h, GRAN, &p, 0));
  return failures;
}

static int fc_create_2(void) {
  CUmemAllocationProp p = prop_of(0);
  CUmemGenericAllocationHandle a, b, c;

  child_open();
  OK(CU.cuMemCreate(&a, GRAN, &p, 0));
  EXPECT(CUDA_ERROR_OUT_OF_MEMORY, CU.cuMemCreate(&b, GRAN, &p, 0));
  OK(CU.cuMemCreate(&c, GRAN, &p, 0));
  OK(CU.cuMemRelease(a));
  OK(CU.cuMemRelease(c));
  return failures;
}

static int fc_export_import(int import_fails) {
  CUmemAllocationProp p = prop_of(0);
  CUmemGenericAllocationHandle h, h2;
  int fd = -1;

  child_open();
  MUST(CU.cuMemCreate(&h, GRAN, &p, 0));
  if (!import_fails) {
    EXPECT(CUDA_ERROR_INVALID_VALUE,
           CU.cuMemExportToShareableHandle(&fd, h, 1, 0));
  } else {
    OK(CU.cuMemExportToShareableHandle(&fd, h, 1, 0));
    EXPECT(CUDA_ERROR_INVALID_VALUE,
           CU.cuMemImportFromShareableHandle(&h2, (void *)(intptr_t)fd, 1));
    close(fd);
  }
  OK(CU.cuMemRelease(h));
  return failures;
}

static int fc_export(void) { return fc_export_import(0); }
static int fc_import(void) { return fc_export_import(1); }

/* Reserve, map, set access: `stage` (0, 1, 2) is the call that must fail. */
static int fc_vmm_stage(int stage) {
  CUmemAllocationProp p = prop_of(0);
  CUmemGenericAllocationHandle h;
  CUdeviceptr va = 0;

  child_open();
  MUST(CU.cuMemCreate(&h, GRAN, &p, 0));
  if (stage == 0) {
    EXPECT(CUDA_ERROR_INVALID_VALUE,
           CU.cuMemAddressReserve(&va, GRAN, 0, 0, 0));
    goto out;
  }
  MUST(CU.cuMemAddressReserve(&va, GRAN, 0, 0, 0));
  if (stage == 1) {
    EXPECT(CUDA_ERROR_INVALID_VALUE, CU.cuMemMap(va, GRAN, 0, h, 0));
  } else {
    OK(CU.cuMemMap(va, GRAN, 0, h, 0));
    EXPECT(CUDA_ERROR_INVALID_VALUE, set_access(va, GRAN, 3));
    OK(CU.cuMemUnmap(va, GRAN));
  }
  OK(CU.cuMemAddressFree(va, GRAN));
out:
  OK(CU.cuMemRelease(h));
  return failures;
}

static int fc_reserve(void) { return fc_vmm_stage(0); }
static int fc_map(void) { return fc_vmm_stage(1); }
static int fc_set_access(void) { return fc_vmm_stage(2); }

static int fc_module(void) {
  CUmodule m;
  static const char image[16];

  child_open();
  EXPECT(CUDA_ERROR_NO_BINARY_FOR_GPU, CU.cuModuleLoadData(&m, image));
  return failures;
}

static int fc_launch(void) {
  static const char image[16];
  CUmodule m;
  CUfunction f;
  CUdeviceptr d = dev_alloc(4096, 0);
  char *base = ptr(d), *staging = NULL;
  uint64_t stride = 64;
  const uint32_t *idx = ptr(d);
  int mode = 0;
  void *params[] = {&base, &stride, &staging, &idx, &mode};

  MUST(CU.cuModuleLoadData(&m, image));
  MUST(CU.cuModuleGetFunction(&f, m, "kvs_blocks_kernel"));
  EXPECT(CUDA_ERROR_INVALID_VALUE,
         CU.cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL));
  OK(CU.cuMemFree(d));
  return failures;
}

static int fc_launch_main(void) {
  child_open();
  return fc_launch();
}

static void nop_fn(void *arg) { (void)arg; }

static int fc_hostfunc(void) {
  child_open();
  EXPECT(CUDA_ERROR_INVALID_VALUE, CU.cuLaunchHostFunc(NULL, nop_fn, NULL));
  return failures;
}

/* The async copies; `which` (1-based) is the call that fails, 0 all. */
static int fc_copy_n(int which) {
  CUdeviceptr a, b;
  char host[64];
  CUresult r[3];

  child_open();
  a = dev_alloc(64, 1);
  b = dev_alloc(64, 2);
  r[0] = CU.cuMemcpyDtoDAsync(b, a, 64, NULL);
  r[1] = CU.cuMemcpyHtoDAsync(b, host, 64, NULL);
  r[2] = CU.cuMemcpyDtoHAsync(host, a, 64, NULL);
  for (int i = 0; i < 3; i++) {
    CUresult want = which == 0 || which == i + 1 ? CUDA_ERROR_INVALID_VALUE
                                                  : CUDA_SUCCESS;
    CHECK(r[i] == want, "async copy %d returned %d, expected %d", i + 1, r[i],
          want);
  }
  OK(CU.cuMemFree(a));
  OK(CU.cuMemFree(b));
  return failures;
}

static int fc_copy(void) { return fc_copy_n(0); }
static int fc_copy_2(void) { return fc_copy_n(2); }

/* fault:2: the second async copy run on a stream faults there — nothing
 * moves, the context is lost, and the stream says so (cuStreamQuery) — while
 * the first landed; a host function queued after it never runs. */
static int ran_after_fault;
static void fault_mark_fn(void *arg) { (void)arg; ran_after_fault = 1; }

static int fc_fault(void) {
  CUdeviceptr a, b, c2;
  CUstream s;

  child_open();
  a = dev_alloc(64, 1);
  b = dev_alloc(64, 2);
  c2 = dev_alloc(64, 3);
  MUST(CU.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  OK(CU.cuMemcpyDtoDAsync(b, a, 64, s));
  OK(CU.cuStreamSynchronize(s));
  CHECK(all_bytes(ptr(b), 64, 1), "the first copy landed");
  OK(CU.cuMemcpyDtoDAsync(c2, a, 64, s));
  CUresult r = CU.cuLaunchHostFunc(s, fault_mark_fn, NULL);
  CHECK(r == CUDA_SUCCESS || r == 700, "host function after the fault: %d", r);
  EXPECT(700, CU.cuStreamSynchronize(s));
  EXPECT(700, CU.cuStreamQuery(s));
  CHECK(all_bytes(ptr(c2), 64, 3), "the faulted copy moved nothing");
  CHECK(!ran_after_fault, "a host function ran after the fault");
  EXPECT(700, CU.cuCtxSynchronize());
  OK(CU.cuStreamDestroy(s));
  return failures;
}

/* KVS_STANDIN_COPY_DELAY_MS: the copy is still running (NOT_READY) right
 * after the call, done after the delay. */
static int fc_delay(void) {
  CUdeviceptr a, b;
  CUstream s;

  setenv("KVS_STANDIN_COPY_DELAY_MS", "300", 1);
  child_open();
  a = dev_alloc(64, 1);
  b = dev_alloc(64, 2);
  MUST(CU.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  OK(CU.cuMemcpyDtoDAsync(b, a, 64, s));
  EXPECT(CUDA_ERROR_NOT_READY, CU.cuStreamQuery(s));
  CHECK(all_bytes(ptr(b), 64, 2), "the delayed copy already landed");
  OK(CU.cuStreamSynchronize(s));
  EXPECT(CUDA_SUCCESS, CU.cuStreamQuery(s));
  CHECK(all_bytes(ptr(b), 64, 1), "the delayed copy did not land");
  OK(CU.cuStreamDestroy(s));
  return failures;
}

static int fc_run(const void *arg) {
  const fail_case *c = arg;

  setenv("KVS_STANDIN_FAIL", c->spec, 1);
  return c->run();
}

static void test_fail_points(void) {
  static const fail_case cases[] = {
      {"init", fc_init},         {"init:1", fc_init_first},
      {"vmm", fc_vmm},           {"posix_fd", fc_posix},
      {"create", fc_create},     {"create:2", fc_create_2},
      {"export", fc_export},     {"import", fc_import},
      {"reserve", fc_reserve},   {"map", fc_map},
      {"set_access", fc_set_access}, {"module", fc_module},
      {"launch", fc_launch_main}, {"hostfunc", fc_hostfunc},
      {"copy", fc_copy},         {"copy:2", fc_copy_2},
      {"vmm:5,copy:2", fc_copy_2},
      {"fault:2", fc_fault},     {"", fc_delay},
  };

  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int rc = in_child(fc_run, &cases[i]);

    CHECK(rc == 0, "KVS_STANDIN_FAIL=%s: the child failed (exit %d)",
          cases[i].spec, rc);
  }
}

/* ---- malformed configuration, defaults ----------------------------------- */

typedef struct env_case {
  const char *var, *value;
} env_case;

static int bad_env_run(const void *arg) {
  const env_case *c = arg;
  const char *reason = "";

  setenv(c->var, c->value, 1);
  if (kvs__cu_load(&reason) != KVS_ENODEV) {
    fprintf(stderr, "%s=%s: the driver loaded\n", c->var, c->value);
    return 1;
  }
  return 0;
}

static void test_bad_config(void) {
  static const env_case cases[] = {
      {"KVS_STANDIN_FAIL", "maap"},
      {"KVS_STANDIN_FAIL", "create:0"},
      {"KVS_STANDIN_FAIL", "create:x"},
      {"KVS_STANDIN_FAIL", "create:"},
      {"KVS_STANDIN_FAIL", "map,,copy"},
      {"KVS_STANDIN_FAIL", "map,"},
      {"KVS_STANDIN_MEM", "12Q"},
      {"KVS_STANDIN_MEM", "0"},
      {"KVS_STANDIN_GRANULARITY", "3M"},
      {"KVS_STANDIN_GPUS", "GPU-1234"},
      {"KVS_STANDIN_GPUS", UUID0 ","},
      {"KVS_STANDIN_GPUS", ""}, /* no device: cuInit says so */
  };

  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int rc = in_child(bad_env_run, &cases[i]);

    CHECK(rc == 0, "%s='%s' must make cuInit fail (child exit %d)",
          cases[i].var, cases[i].value, rc);
  }
}

static int defaults_run(const void *arg) {
  CUmemAllocationProp p = prop_of(0);
  char name[128], uuid[64];
  size_t g = 0, fr = 0, tot = 0;
  CUuuid u;
  int n = 0;

  (void)arg;
  unsetenv("KVS_STANDIN_GPUS");
  unsetenv("KVS_STANDIN_MEM");
  unsetenv("KVS_STANDIN_NAME");
  unsetenv("KVS_STANDIN_GRANULARITY");
  child_open();
  OK(CU.cuDeviceGetCount(&n));
  CHECK(n == 1, "default: %d devices", n);
  OK(CU.cuDeviceGetUuid(&u, 0));
  kvs__cu_format_uuid(uuid, sizeof uuid, &u);
  CHECK(strcmp(uuid, DEFAULT_UUID) == 0, "default UUID is %s", uuid);
  OK(CU.cuDeviceGetName(name, sizeof name, 0));
  CHECK(strstr(name, "stand-in"), "default name '%s' lacks 'stand-in'", name);
  OK(CU.cuMemGetInfo(&fr, &tot));
  CHECK(tot == (size_t)4 << 30 && fr == tot, "default memory %zu of %zu", fr,
        tot);
  OK(CU.cuMemGetAllocationGranularity(&g, &p, 1));
  CHECK(g == GRAN, "default granularity %zu", g);
  return failures;
}

/* ---- devices, contexts, errors ------------------------------------------- */

static void *no_ctx_thread(void *arg) {
  CUdeviceptr p;
  CUstream s;
  size_t a, b;

  (void)arg;
  EXPECT(CUDA_ERROR_INVALID_CONTEXT, CU.cuMemAlloc(&p, 64));
  EXPECT(CUDA_ERROR_INVALID_CONTEXT, CU.cuStreamCreate(&s, 0));
  EXPECT(CUDA_ERROR_INVALID_CONTEXT, CU.cuMemGetInfo(&a, &b));
  EXPECT(CUDA_ERROR_INVALID_CONTEXT, CU.cuCtxSynchronize());
  return NULL;
}

static int fork_after_init_run(const void *arg) {
  int n = -1;

  (void)arg;
  EXPECT(CUDA_ERROR_NOT_INITIALIZED, CU.cuDeviceGetCount(&n));
  EXPECT(CUDA_ERROR_NOT_INITIALIZED, CU.cuInit(0));
  return failures;
}

static void test_devices(void) {
  static const char *uuids[] = {UUID0, UUID1, UUID2};
  char text[64], name[8];
  const char *s;
  pthread_t t;
  CUdevice d;
  CUuuid u;
  int n = 0, v;

  OK(CU.cuDeviceGetCount(&n));
  CHECK(n == 3, "%d devices, expected 3", n);
  for (int i = 0; i < 3 && i < n; i++) {
    OK(CU.cuDeviceGetUuid(&u, i));
    kvs__cu_format_uuid(text, sizeof text, &u);
    CHECK(strcmp(text, uuids[i]) == 0, "device %d: UUID %s, expected %s", i,
          text, uuids[i]);
  }
  EXPECT(CUDA_ERROR_INVALID_DEVICE, CU.cuDeviceGet(&d, 3));
  EXPECT(CUDA_ERROR_INVALID_DEVICE, CU.cuDeviceGet(&d, -1));
  OK(CU.cuDeviceGetName(name, sizeof name, 0));
  CHECK(strcmp(name, "test-gp") == 0, "name truncated to '%s'", name);
  OK(CU.cuDeviceGetAttribute(&v, CU_ATTR_MULTIPROCESSOR_COUNT, 0));
  CHECK(v == 4, "SM count %d", v);
  OK(CU.cuDeviceGetAttribute(&v, CU_ATTR_MEMORY_CLOCK_RATE, 0));
  CHECK(v == 1000000, "memory clock %d", v);
  OK(CU.cuDeviceGetAttribute(&v, CU_ATTR_GLOBAL_MEMORY_BUS_WIDTH, 0));
  CHECK(v == 256, "bus width %d", v);
  OK(CU.cuDeviceGetAttribute(&v, CU_ATTR_VMM_SUPPORTED, 2));
  CHECK(v == 1, "VMM supported %d", v);
  OK(CU.cuDeviceGetAttribute(&v, 1, 0));
  CHECK(v == 0, "an unknown attribute reads %d", v);
  OK(CU.cuInit(0)); /* again: fine */
  OK(CU.cuGetErrorString(CUDA_ERROR_ILLEGAL_ADDRESS, &s));
  CHECK(strstr(s, "illegal memory access"), "700 is '%s'", s);
  EXPECT(CUDA_ERROR_INVALID_CONTEXT, CU.cuCtxSetCurrent((CUcontext)&t));
  /* A thread that never made a context current has none. */
  pthread_create(&t, NULL, no_ctx_thread, NULL);
  pthread_join(t, NULL);
  /* A child forked after cuInit cannot use the driver. */
  CHECK(in_child(fork_after_init_run, NULL) == 0,
        "a child forked after cuInit could use the driver");
}

/* ---- VMM rules, memory budget, access ------------------------------------ */

static void test_vmm_rules(void) {
  CUmemAllocationProp p = prop_of(0), bad;
  CUmemGenericAllocationHandle h, big;
  CUdeviceptr va, va2;
  size_t g = 0;
  int fd;

  OK(CU.cuMemGetAllocationGranularity(&g, &p,
                                      CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CHECK(g == GRAN, "granularity %zu, expected %zu", g, GRAN);
  bad = p;
  bad.location.id = 7;
  EXPECT(CUDA_ERROR_INVALID_DEVICE,
         CU.cuMemGetAllocationGranularity(&g, &bad, 1));
  bad = p;
  bad.requestedHandleTypes = 0;
  EXPECT(CUDA_ERROR_INVALID_VALUE,
         CU.cuMemGetAllocationGranularity(&g, &bad, 1));

  EXPECT(CUDA_ERROR_INVALID_VALUE, CU.cuMemCreate(&h, GRAN + 4096, &p, 0));
  EXPECT(CUDA_ERROR_INVALID_VALUE, CU.cuMemCreate(&h, 0, &p, 0));
  bad = p;
  bad.type = 2;
  EXPECT(CUDA_ERROR_INVALID_VALUE, CU.cuMemCreate(&h, GRAN, &bad, 0));
  /* Created without the POSIX fd handle type: it cannot be exported. */
  bad = p;
  bad.requestedHandleTypes = 0;
  MUST(CU.cuMemCreate(&h, GRAN, &bad, 0));
  CHECK(CU.cuMemExportToShareableHandle(&fd, h, 1, 0) != CUDA_SUCCESS,
        "an allocation without the POSIX fd type was exported");
  OK(CU.cuMemRelease(h));
  EXPECT(CUDA_ERROR_INVALID_VALUE, CU.cuMemRelease(h)); /* released */
  EXPECT(CUDA_ERROR_INVALID_VALUE, CU.cuMemRelease(12345));

  MUST(CU.cuMemCreate(&h, GRAN, &p, 0));
  MUST(CU.cuMemCreate(&big, 2 * GRAN, &p, 0));
  EXPECT(CUDA_ERROR_INVALID_VALUE,
         CU.cuMemAddressReserve(&va, GRAN + 1, 0, 0, 0));
  EXPECT(CUDA_ERROR_INVALID_VALUE,
         CU.cuMemAddressReserve(&va, GRAN, 3 * GRAN, 0, 0));
  MUST(CU.cuMemAddressReserve(&va, 4 * GRAN, 4 * GRAN, 0, 0));
  CHECK(va % (4 * GRAN) == 0, "reservation %#llx not aligned to 8M", va);
  /* Whole allocations only, inside the reservation, not twice. */
  EXPECT(CUDA_ERROR_INVALID_VALUE, CU.cuMemMap(va, GRAN, GRAN, h, 0));
  EXPECT(CUDA_ERROR_INVALID_VALUE, CU.cuMemMap(va, GRAN, 0, big, 0));
  EXPECT(CUDA_ERROR_INVALID_VALUE, CU.cuMemMap(va + 4096, GRAN, 0, h, 0));
  EXPECT(CUDA_ERROR_INVALID_VALUE,
         CU.cuMemMap(va + 3 * GRAN, 2 * GRAN, 0, big, 0));
  EXPECT(CUDA_ERROR_INVALID_VALUE, CU.cuMemMap(va + 4 * GRAN, GRAN, 0, h, 0));
  OK(CU.cuMemMap(va + GRAN, 2 * GRAN, 0, big, 0));
  EXPECT(CUDA_ERROR_ALREADY_MAPPED, CU.cuMemMap(va + 2 * GRAN, GRAN, 0, h, 0));
  OK(CU.cuMemMap(va, GRAN, 0, h, 0));
  /* Releasing the handles keeps the mapped memory. */
  OK(CU.cuMemRelease(h));
  OK(CU.cuMemRelease(big));
  EXPECT(CUDA_ERROR_INVALID_VALUE,
         set_access(va, 2 * GRAN, 3)); /* half of big */
  EXPECT(CUDA_ERROR_INVALID_VALUE,
         set_access(va, 4 * GRAN, 3)); /* unmapped tail */
  OK(set_access(va, 3 * GRAN, 3));
  memset(ptr(va), 0x77, 3 * GRAN); /* both mappings, back to back */
  CHECK(CU.cuMemsetD8(va + GRAN - 8, 0x11, 16) == CUDA_SUCCESS &&
            all_bytes((char *)ptr(va) + GRAN - 8, 16, 0x11),
        "a memset across two mappings");
  EXPECT(CUDA_ERROR_INVALID_VALUE, CU.cuMemsetD8(va + 3 * GRAN - 8, 0, 16));
  EXPECT(CUDA_ERROR_INVALID_VALUE, CU.cuMemUnmap(va, 2 * GRAN)); /* half */
  EXPECT(CUDA_ERROR_INVALID_VALUE,
         CU.cuMemAddressFree(va, 4 * GRAN)); /* mapped */
  EXPECT(CUDA_ERROR_INVALID_VALUE,
         CU.cuMemAddressFree(va, 2 * GRAN)); /* size */
  OK(CU.cuMemUnmap(va, 3 * GRAN));
  EXPECT(CUDA_ERROR_INVALID_VALUE, CU.cuMemsetD8(va, 0, 16)); /* unmapped */
  OK(CU.cuMemAddressFree(va, 4 * GRAN));
  EXPECT(CUDA_ERROR_INVALID_VALUE, CU.cuMemAddressFree(va, 4 * GRAN));
  CHECK(count_maps() == 0, "a stand-in memfd is still mapped");

  /* Plain memory. */
  EXPECT(CUDA_ERROR_INVALID_VALUE, CU.cuMemAlloc(&va2, 0));
  EXPECT(CUDA_ERROR_INVALID_VALUE, CU.cuMemFree(12345));
}

static void test_memory_budget(void) {
  CUmemAllocationProp p = prop_of(0);
  CUmemGenericAllocationHandle h[40];
  size_t fr0, tot, fr;
  CUdeviceptr small;
  CUresult r = CUDA_SUCCESS;
  int n = 0;

  OK(CU.cuMemGetInfo(&fr0, &tot));
  CHECK(tot == 64 * MiB && fr0 == tot, "memory: %zu free of %zu, expected "
        "all of 64M", fr0, tot);
  while (n < 40 && (r = CU.cuMemCreate(&h[n], GRAN, &p, 0)) == CUDA_SUCCESS)
    n++;
  CHECK(r == CUDA_ERROR_OUT_OF_MEMORY && n == 32,
        "64M held %d chunks of 2M, then %d (expected 32, then OUT_OF_MEMORY)",
        n, r);
  OK(CU.cuMemGetInfo(&fr, &tot));
  CHECK(fr == 0, "%zu bytes free with the device full", fr);
  EXPECT(CUDA_ERROR_OUT_OF_MEMORY, CU.cuMemAlloc(&small, 1));
  if (n > 0)
    OK(CU.cuMemRelease(h[--n]));
  MUST(CU.cuMemAlloc(&small, 4096)); /* cuMemAlloc counts too */
  OK(CU.cuMemGetInfo(&fr, &tot));
  CHECK(fr == GRAN - 4096, "%zu free, expected 2M - 4K", fr);
  EXPECT(CUDA_ERROR_OUT_OF_MEMORY, CU.cuMemCreate(&h[n], GRAN, &p, 0));
  OK(CU.cuMemFree(small));
  EXPECT(CUDA_ERROR_INVALID_VALUE, CU.cuMemFree(small));
  OK(CU.cuMemCreate(&h[n], GRAN, &p, 0));
  n++;
  while (n > 0)
    OK(CU.cuMemRelease(h[--n]));
  OK(CU.cuMemGetInfo(&fr, &tot));
  CHECK(fr == fr0, "%zu free after releasing everything, expected %zu", fr,
        fr0);
  /* Other devices have their own budget. */
  CHECK(CU.cuMemCreate(&h[0], 32 * MiB, &p, 0) == CUDA_SUCCESS, "32M on dev 0");
  p.location.id = 1;
  CHECK(CU.cuMemCreate(&h[1], 64 * MiB, &p, 0) == CUDA_SUCCESS,
        "64M on device 1 while device 0 holds 32M");
  OK(CU.cuMemRelease(h[0]));
  OK(CU.cuMemRelease(h[1]));
}

static void test_access(void) {
  CUmemAllocationProp p = prop_of(0);
  CUmemGenericAllocationHandle h;
  CUdeviceptr va;
  volatile char *c;

  MUST(CU.cuMemCreate(&h, GRAN, &p, 0));
  MUST(CU.cuMemAddressReserve(&va, GRAN, 0, 0, 0));
  c = (volatile char *)ptr(va) + 100;
  CHECK(probe(c, 0) == SIGSEGV, "reserved, unmapped memory was readable");
  MUST(CU.cuMemMap(va, GRAN, 0, h, 0));
  CHECK(count_maps() == 1, "%d stand-in mappings, expected 1", count_maps());
  CHECK(probe(c, 0) == SIGSEGV, "mapped memory was readable before "
        "cuMemSetAccess");
  EXPECT(CUDA_ERROR_INVALID_VALUE, CU.cuMemsetD8(va, 0, 16));
  OK(set_access(va, GRAN, 1)); /* read only */
  CHECK(probe(c, 0) == 0, "read-only memory was not readable");
  CHECK(probe(c, 1) == SIGSEGV, "read-only memory was writable");
  EXPECT(CUDA_ERROR_INVALID_VALUE, CU.cuMemsetD8(va, 0, 16));
  OK(set_access(va, GRAN, 3));
  CHECK(probe(c, 1) == 0, "read-write memory was not writable");
  OK(CU.cuMemsetD8(va, 0x42, 16));
  OK(set_access(va, GRAN, 0));
  CHECK(probe(c, 0) == SIGSEGV, "memory stayed readable after access 0");
  OK(CU.cuMemUnmap(va, GRAN));
  CHECK(probe(c, 0) == SIGSEGV, "unmapped memory was readable");
  CHECK(count_maps() == 0, "%d stand-in mappings after unmap", count_maps());
  OK(CU.cuMemAddressFree(va, GRAN));
  OK(CU.cuMemRelease(h));
}

/* ---- export, import in another process ----------------------------------- */

#define IPC_CHUNKS 2
#define IPC_BYTES (IPC_CHUNKS * GRAN)
#define IPC_MARK 0xc3
#define IPC_MARK_AT (GRAN - 2048) /* straddles the two chunks */
#define IPC_MARK_LEN 4096

static unsigned char ipc_byte(size_t i) { return (unsigned char)(i * 13 + 7); }

/* The worker: imports the chunks the parent sends, checks its bytes, writes
 * the mark across the chunk boundary, releases everything. */
static int ipc_child(int sock) {
  CUmemGenericAllocationHandle h[IPC_CHUNKS], again;
  int fds[IPC_CHUNKS], nfds = 0, fd0, maps0, other, efd = -1;
  uint64_t sizes[IPC_CHUNKS];
  unsigned char *host, ok;
  CUdeviceptr va;
  char err[256];
  size_t bad = 0;

  fd0 = count_fds();
  maps0 = count_maps();
  load();
  if (kvs__cuda_ctx_open(UUID0, err, sizeof err)) {
    fprintf(stderr, "FAIL child: kvs__cuda_ctx_open: %s\n", err);
    return 1;
  }
  if (kvs_recv_fds(sock, sizes, sizeof sizes, fds, IPC_CHUNKS, &nfds) !=
          (ssize_t)sizeof sizes ||
      nfds != IPC_CHUNKS) {
    fprintf(stderr, "FAIL child: did not receive the chunks\n");
    return 1;
  }
  for (int i = 0; i < IPC_CHUNKS; i++) {
    MUST(CU.cuMemImportFromShareableHandle(&h[i], (void *)(intptr_t)fds[i], 1));
    close(fds[i]); /* the import holds its own reference */
    CHECK(sizes[i] == GRAN, "chunk %d: %llu bytes", i,
          (unsigned long long)sizes[i]);
  }
  /* Only a stand-in's memfd imports. */
  other = memfd_create("not-a-gpu", MFD_CLOEXEC);
  CHECK(other >= 0 && ftruncate(other, GRAN) == 0, "memfd_create");
  EXPECT(CUDA_ERROR_INVALID_VALUE,
         CU.cuMemImportFromShareableHandle(&again, (void *)(intptr_t)other, 1));
  EXPECT(CUDA_ERROR_INVALID_VALUE,
         CU.cuMemImportFromShareableHandle(&again, (void *)(intptr_t)sock, 1));
  close(other);
  /* An imported handle exports again. */
  OK(CU.cuMemExportToShareableHandle(&efd, h[0], 1, 0));
  CHECK(efd >= 0, "export of an imported handle gave fd %d", efd);
  close(efd);

  MUST(CU.cuMemAddressReserve(&va, IPC_BYTES, 0, 0, 0));
  for (int i = 0; i < IPC_CHUNKS; i++)
    MUST(CU.cuMemMap(va + (CUdeviceptr)i * GRAN, GRAN, 0, h[i], 0));
  CHECK(count_maps() == maps0 + IPC_CHUNKS, "child: %d stand-in mappings",
        count_maps());
  MUST(set_access(va, IPC_BYTES, 3));
  host = malloc(IPC_BYTES);
  MUST(CU.cuMemcpyDtoH(host, va, IPC_BYTES));
  for (size_t i = 0; i < IPC_BYTES; i++)
    bad += host[i] != ipc_byte(i);
  CHECK(bad == 0, "child: %zu bytes differ from what the parent wrote", bad);
  memset(host, IPC_MARK, IPC_MARK_LEN);
  MUST(CU.cuMemcpyHtoD(va + IPC_MARK_AT, host, IPC_MARK_LEN));
  free(host);
  for (int i = 0; i < IPC_CHUNKS; i++) {
    OK(CU.cuMemUnmap(va + (CUdeviceptr)i * GRAN, GRAN));
    OK(CU.cuMemRelease(h[i]));
  }
  OK(CU.cuMemAddressFree(va, IPC_BYTES));
  CHECK(count_maps() == maps0, "child: stand-in mappings left");
  CHECK(count_fds() == fd0, "child: %d fds open, %d before", count_fds(), fd0);
  ok = failures ? 1 : 0;
  if (write(sock, &ok, 1) != 1)
    return 1;
  return failures ? 1 : 0;
}

static pid_t ipc_start(int *sock) {
  int sv[2];
  pid_t pid;

  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
    perror("socketpair");
    exit(1);
  }
  fflush(NULL);
  pid = fork();
  if (pid == 0) {
    close(sv[0]);
    _exit(ipc_child(sv[1]));
  }
  close(sv[1]);
  *sock = sv[0];
  return pid;
}

static void test_ipc(pid_t pid, int sock) {
  CUmemAllocationProp p = prop_of(0);
  CUmemGenericAllocationHandle h[IPC_CHUNKS];
  uint64_t sizes[IPC_CHUNKS];
  int fds[IPC_CHUNKS], st = 0;
  unsigned char *host, ok = 1;
  CUdeviceptr va;
  size_t bad = 0;

  for (int i = 0; i < IPC_CHUNKS; i++) {
    MUST(CU.cuMemCreate(&h[i], GRAN, &p, 0));
    MUST(CU.cuMemExportToShareableHandle(&fds[i], h[i], 1, 0));
    CHECK(fcntl(fds[i], F_GETFD) & FD_CLOEXEC, "exported fd not close-on-exec");
    sizes[i] = GRAN;
  }
  MUST(CU.cuMemAddressReserve(&va, IPC_BYTES, 0, 0, 0));
  for (int i = 0; i < IPC_CHUNKS; i++)
    MUST(CU.cuMemMap(va + (CUdeviceptr)i * GRAN, GRAN, 0, h[i], 0));
  MUST(set_access(va, IPC_BYTES, 3));
  host = malloc(IPC_BYTES);
  for (size_t i = 0; i < IPC_BYTES; i++)
    host[i] = ipc_byte(i);
  MUST(CU.cuMemcpyHtoD(va, host, IPC_BYTES));
  CHECK(kvs_send_fds(sock, sizes, sizeof sizes, fds, IPC_CHUNKS) ==
            (ssize_t)sizeof sizes,
        "sending the chunks");
  for (int i = 0; i < IPC_CHUNKS; i++)
    close(fds[i]); /* the caller owns exported fds */
  CHECK(read(sock, &ok, 1) == 1 && ok == 0, "the importing child failed");
  waitpid(pid, &st, 0);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "importing child: status %#x",
        st);
  close(sock);
  /* The child's mark, across the chunk boundary; the rest unchanged. */
  MUST(CU.cuMemcpyDtoH(host, va, IPC_BYTES));
  for (size_t i = 0; i < IPC_BYTES; i++) {
    unsigned char want = i >= IPC_MARK_AT && i < IPC_MARK_AT + IPC_MARK_LEN
                             ? IPC_MARK
                             : ipc_byte(i);
    bad += host[i] != want;
  }
  CHECK(bad == 0, "parent: %zu bytes differ after the child wrote", bad);
  free(host);
  for (int i = 0; i < IPC_CHUNKS; i++)
    OK(CU.cuMemRelease(h[i])); /* before unmapping: the mapping holds it */
  OK(CU.cuMemUnmap(va, IPC_BYTES)); /* both mappings in one call */
  OK(CU.cuMemAddressFree(va, IPC_BYTES));
}

/* ---- streams ------------------------------------------------------------- */

typedef struct observer {
  const unsigned char *dst; /* a device pointer the CPU can read here */
  size_t n;
  int want;
  int landed;     /* the copy before it was complete when it ran */
  int order[8];
  int norder;
  CUresult api;   /* what a driver call inside a host function got */
} observer;

typedef struct mark {
  observer *o;
  int id;
} mark;

static void mark_fn(void *arg) {
  mark *m = arg;

  m->o->order[m->o->norder++] = m->id;
}

static void observe_fn(void *arg) {
  observer *o = arg;

  o->landed = all_bytes(o->dst, o->n, o->want);
  o->order[o->norder++] = 99;
  o->api = CU.cuCtxSynchronize(); /* host functions may not call CUDA */
}

static void test_streams(void) {
  const size_t n = MiB;
  CUdeviceptr a = dev_alloc(n, 0x5a), b = dev_alloc(n, 0), c = dev_alloc(n, 0);
  unsigned char *host = malloc(n), *pinned;
  observer o = {.dst = ptr(b), .n = n, .want = 0x5a};
  mark m1 = {&o, 1}, m2 = {&o, 2};
  CUstream s, sb;
  int delay = 30;
  gate g;

  EXPECT(CUDA_ERROR_INVALID_VALUE, CU.cuStreamCreate(&s, 2));
  MUST(CU.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  MUST(CU.cuStreamCreate(&sb, 0));
  CHECK(count_threads() >= 3, "streams run on their own threads");

  /* FIFO order; the host function runs after the copy landed; nothing ran
   * before the gate opened. */
  gate_init(&g);
  OK(CU.cuLaunchHostFunc(s, gate_fn, &g));
  OK(CU.cuLaunchHostFunc(s, mark_fn, &m1));
  OK(CU.cuMemcpyDtoDAsync(b, a, n, s));
  OK(CU.cuLaunchHostFunc(s, observe_fn, &o));
  OK(CU.cuLaunchHostFunc(s, mark_fn, &m2));
  sleep_ms(20);
  CHECK(all_bytes(ptr(b), n, 0) && o.norder == 0,
        "the stream ran past a host function that had not returned");
  /* The legacy stream does not wait for a non-blocking stream. */
  OK(CU.cuMemcpyDtoH(host, b, n));
  CHECK(all_bytes(host, n, 0), "a sync copy waited for a non-blocking stream");
  gate_open(&g);
  OK(CU.cuStreamSynchronize(s));
  CHECK(o.landed, "the host function ran before the DtoDAsync landed");
  CHECK(o.norder == 3 && o.order[0] == 1 && o.order[1] == 99 && o.order[2] == 2,
        "operations out of order (%d ran)", o.norder);
  CHECK(o.api == CUDA_ERROR_NOT_PERMITTED,
        "a driver call inside a host function returned %d, expected 800",
        o.api);
  gate_destroy(&g);

  /* The legacy stream waits for a blocking stream. */
  OK(CU.cuLaunchHostFunc(sb, sleep_fn, &delay));
  OK(CU.cuMemcpyDtoDAsync(c, a, n, sb));
  OK(CU.cuMemcpyDtoH(host, c, n));
  CHECK(all_bytes(host, n, 0x5a), "a sync copy did not wait for a blocking "
        "stream's copy");

  /* From pageable memory the bytes are taken at the call; from registered
   * memory when the stream gets there. */
  gate_init(&g);
  memset(host, 0x11, n);
  OK(CU.cuLaunchHostFunc(s, gate_fn, &g));
  OK(CU.cuMemcpyHtoDAsync(b, host, n, s));
  memset(host, 0x22, n);
  gate_open(&g);
  OK(CU.cuStreamSynchronize(s));
  CHECK(all_bytes(ptr(b), n, 0x11), "HtoDAsync from pageable memory read the "
        "buffer late");
  gate_destroy(&g);
  pinned = aligned_alloc(4096, n);
  OK(CU.cuMemHostRegister(pinned, n, CU_MEMHOSTREGISTER_PORTABLE));
  EXPECT(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
         CU.cuMemHostRegister(pinned + 4096, 4096, 0));
  gate_init(&g);
  memset(pinned, 0x11, n);
  OK(CU.cuLaunchHostFunc(s, gate_fn, &g));
  OK(CU.cuMemcpyHtoDAsync(b, pinned, n, s));
  memset(pinned, 0x22, n);
  OK(CU.cuMemcpyDtoHAsync(pinned, a, 64, s)); /* registered: returns at once */
  CHECK(pinned[0] == 0x22, "DtoHAsync to registered memory ran early");
  gate_open(&g);
  OK(CU.cuStreamSynchronize(s));
  CHECK(all_bytes(ptr(b), n, 0x22), "HtoDAsync from registered memory did not "
        "read it when the stream ran");
  CHECK(all_bytes(pinned, 64, 0x5a), "DtoHAsync to registered memory");
  gate_destroy(&g);
  /* To pageable memory the call returns once the copy is done. */
  memset(host, 0, n);
  OK(CU.cuLaunchHostFunc(s, sleep_fn, &delay));
  OK(CU.cuMemcpyDtoHAsync(host, a, n, s));
  CHECK(all_bytes(host, n, 0x5a), "DtoHAsync to pageable memory returned "
        "before the copy");
  /* Device pointers must be device memory. */
  EXPECT(CUDA_ERROR_INVALID_VALUE,
         CU.cuMemcpyDtoDAsync(b, (uintptr_t)host, 64, s));
  EXPECT(CUDA_ERROR_INVALID_VALUE,
         CU.cuMemcpyHtoD((uintptr_t)host, pinned, 64));
  OK(CU.cuMemcpyHtoD((uintptr_t)pinned, host, 64)); /* registered: fine */
  EXPECT(CUDA_ERROR_INVALID_VALUE, CU.cuMemcpyDtoH(host, b + n - 32, 64));
  EXPECT(CUDA_ERROR_INVALID_HANDLE,
         CU.cuMemcpyDtoDAsync(b, a, 64, (CUstream)host));

  OK(CU.cuMemHostUnregister(pinned));
  EXPECT(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, CU.cuMemHostUnregister(pinned));
  free(pinned);
  OK(CU.cuStreamDestroy(s));
  OK(CU.cuStreamDestroy(sb));
  EXPECT(CUDA_ERROR_INVALID_HANDLE, CU.cuStreamSynchronize(s));
  OK(CU.cuMemFree(a));
  OK(CU.cuMemFree(b));
  OK(CU.cuMemFree(c));
  free(host);
}

/* ---- kernels ------------------------------------------------------------- */

static CUfunction f_write, f_blocks, f_merge, f_attn;

static void test_module(void) {
  static const char *dts[] = {"fp32", "fp16", "bf16"};
  static const unsigned char image[64]; /* not read */
  CUfunction f;
  CUmodule m;
  char name[64];

  EXPECT(CUDA_ERROR_INVALID_VALUE, CU.cuModuleLoadData(&m, NULL));
  MUST(CU.cuModuleLoadData(&m, image));
  MUST(CU.cuModuleGetFunction(&f_write, m, "kvs_write_kv_kernel"));
  MUST(CU.cuModuleGetFunction(&f_blocks, m, "kvs_blocks_kernel"));
  MUST(CU.cuModuleGetFunction(&f_merge, m, "kvs_attn_merge_kernel"));
  MUST(CU.cuModuleGetFunction(&f_attn, m, "kvs_attn_fp32_nv1_g2"));
  for (int t = 0; t < 3; t++)
    for (int v = 1; v <= 2; v++)
      for (int g = 1; g <= 8; g *= 2) {
        snprintf(name, sizeof name, "kvs_attn_%s_nv%d_g%d", dts[t], v, g);
        OK(CU.cuModuleGetFunction(&f, m, name));
      }
  for (int t = 1; t < 3; t++)
    for (int d = 64; d <= 128; d *= 2) {
      snprintf(name, sizeof name, "kvs_attn_mma_%s_d%d", dts[t], d);
      OK(CU.cuModuleGetFunction(&f, m, name));
    }
  EXPECT(CUDA_ERROR_NOT_FOUND,
         CU.cuModuleGetFunction(&f, m, "kvs_attn_fp32_nv1_g16"));
  EXPECT(CUDA_ERROR_NOT_FOUND,
         CU.cuModuleGetFunction(&f, m, "kvs_attn_mma_fp32_d64"));
  EXPECT(CUDA_ERROR_INVALID_HANDLE,
         CU.cuModuleGetFunction(&f, (CUmodule)name, "kvs_blocks_kernel"));
}

#define NB 8
#define STRIDE 1040u /* not a multiple of 16 */

static unsigned char blk_byte(int b, size_t k) {
  return (unsigned char)(b * 31 + k * 7 + 1);
}

/* Pairs, gather, scatter on a stream (parameters mutated after each launch
 * while a gate holds the stream), against the same moves done here. */
static void test_blocks_kernel(void) {
  static const uint32_t pairs[] = {0, 5, 3, 3, 2, 7};
  static const uint32_t gidx[] = {6, 1, 5};
  static const uint32_t sidx[] = {4, 0};
  const size_t pool_bytes = (size_t)NB * STRIDE;
  unsigned char *want = malloc(pool_bytes), *got = malloc(pool_bytes);
  unsigned char *stage_want = calloc(3, STRIDE), *sc = malloc(2 * STRIDE);
  CUdeviceptr pool = dev_alloc(pool_bytes, 0), d_pairs = dev_alloc(64, 0);
  CUdeviceptr d_gidx = dev_alloc(64, 0), d_sidx = dev_alloc(64, 0);
  CUdeviceptr stg = dev_alloc(3 * STRIDE, 0),
              stg_other = dev_alloc(3 * STRIDE, 0);
  CUdeviceptr sstg = dev_alloc(2 * STRIDE, 0);
  char *base, *staging;
  const uint32_t *idx;
  uint64_t stride;
  int mode;
  void *params[] = {&base, &stride, &staging, &idx, &mode};
  CUstream s;
  gate g;

  for (int b = 0; b < NB; b++)
    for (size_t k = 0; k < STRIDE; k++)
      want[(size_t)b * STRIDE + k] = blk_byte(b, k);
  for (size_t k = 0; k < 2 * STRIDE; k++)
    sc[k] = (unsigned char)(k * 5 + 3);
  MUST(CU.cuMemcpyHtoD(pool, want, pool_bytes));
  MUST(CU.cuMemcpyHtoD(d_pairs, pairs, sizeof pairs));
  MUST(CU.cuMemcpyHtoD(d_gidx, gidx, sizeof gidx));
  MUST(CU.cuMemcpyHtoD(d_sidx, sidx, sizeof sidx));
  MUST(CU.cuMemcpyHtoD(sstg, sc, 2 * STRIDE));
  MUST(CU.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  gate_init(&g);
  OK(CU.cuLaunchHostFunc(s, gate_fn, &g));

  base = ptr(pool), stride = STRIDE, staging = NULL, idx = ptr(d_pairs),
  mode = 0;
  OK(CU.cuLaunchKernel(f_blocks, 3, 1, 1, 256, 1, 1, 0, s, params, NULL));
  base = ptr(pool), staging = ptr(stg), idx = ptr(d_gidx), mode = 1;
  OK(CU.cuLaunchKernel(f_blocks, 3, 2, 1, 256, 1, 1, 0, s, params, NULL));
  staging = ptr(sstg), idx = ptr(d_sidx), mode = 2;
  OK(CU.cuLaunchKernel(f_blocks, 2, 1, 1, 256, 1, 1, 0, s, params, NULL));
  /* What the stream still has to run must not see these. */
  base = NULL, stride = 1, staging = ptr(stg_other), idx = NULL, mode = 1;
  /* Launches the hardware refuses. */
  EXPECT(CUDA_ERROR_INVALID_VALUE,
         CU.cuLaunchKernel(f_blocks, 0, 1, 1, 256, 1, 1, 0, s, params, NULL));
  EXPECT(CUDA_ERROR_INVALID_VALUE,
         CU.cuLaunchKernel(f_blocks, 1, 1, 1, 2048, 1, 1, 0, s, params, NULL));
  EXPECT(CUDA_ERROR_INVALID_VALUE,
         CU.cuLaunchKernel(f_attn, 1, 1, 1, 512, 1, 1, 0, s, params, NULL));
  EXPECT(CUDA_ERROR_INVALID_VALUE,
         CU.cuLaunchKernel(f_blocks, 1, 1, 1, 256, 1, 1, 64 * 1024, s, params,
                           NULL));
  EXPECT(CUDA_ERROR_INVALID_VALUE,
         CU.cuLaunchKernel(NULL, 1, 1, 1, 256, 1, 1, 0, s, params, NULL));
  EXPECT(CUDA_ERROR_INVALID_HANDLE,
         CU.cuLaunchKernel((CUfunction)&g, 1, 1, 1, 256, 1, 1, 0, s, params,
                           NULL));
  gate_open(&g);
  OK(CU.cuStreamSynchronize(s));
  gate_destroy(&g);

  /* The same moves, here. */
  memcpy(want + 5 * STRIDE, want + 0 * STRIDE, STRIDE);
  memcpy(want + 7 * STRIDE, want + 2 * STRIDE, STRIDE);
  for (int i = 0; i < 3; i++)
    memcpy(stage_want + (size_t)i * STRIDE, want + (size_t)gidx[i] * STRIDE,
           STRIDE);
  for (int i = 0; i < 2; i++)
    memcpy(want + (size_t)sidx[i] * STRIDE, sc + (size_t)i * STRIDE, STRIDE);
  MUST(CU.cuMemcpyDtoH(got, pool, pool_bytes));
  CHECK(memcmp(got, want, pool_bytes) == 0, "pool after pairs + scatter");
  MUST(CU.cuMemcpyDtoH(got, stg, 3 * STRIDE));
  CHECK(memcmp(got, stage_want, 3 * STRIDE) == 0, "staging after gather");
  MUST(CU.cuMemcpyDtoH(got, stg_other, 3 * STRIDE));
  CHECK(all_bytes(got, 3 * STRIDE, 0), "the launch used parameters changed "
        "after it returned");

  OK(CU.cuStreamDestroy(s));
  OK(CU.cuMemFree(pool));
  OK(CU.cuMemFree(d_pairs));
  OK(CU.cuMemFree(d_gidx));
  OK(CU.cuMemFree(d_sidx));
  OK(CU.cuMemFree(stg));
  OK(CU.cuMemFree(stg_other));
  OK(CU.cuMemFree(sstg));
  free(want);
  free(got);
  free(stage_want);
  free(sc);
}

/* One fp32 layer: 3 blocks of 4 tokens, 2 kv heads of 8. */
#define W_BS 4
#define W_KVH 2
#define W_D 8
#define W_ROW (W_KVH * W_D)
#define W_PLANE (W_BS * W_ROW * 4)
#define W_STRIDE (2 * W_PLANE)
#define W_NB 3
#define W_NT 6

static void test_write_kernel(void) {
  /* -1 padding; 12 and 40 lie past the pool (3 blocks of 4): skipped */
  static const int64_t slots[W_NT] = {5, -1, 11, 12, 0, 40};
  float k[W_NT][W_ROW], v[W_NT][W_ROW];
  unsigned char *want = malloc(W_NB * W_STRIDE), *got = malloc(W_NB * W_STRIDE);
  CUdeviceptr pool = dev_alloc(W_NB * W_STRIDE, 0xab);
  CUdeviceptr d_slots = dev_alloc(sizeof slots, 0),
              d_k = dev_alloc(sizeof k, 0);
  CUdeviceptr d_v = dev_alloc(sizeof v, 0);
  kvs_write_args wa;
  void *params[] = {&wa};
  CUstream s;
  gate g;

  for (int i = 0; i < W_NT; i++)
    for (int e = 0; e < W_ROW; e++) {
      k[i][e] = 100.0f * (float)i + (float)e + 0.5f;
      v[i][e] = -k[i][e];
    }
  MUST(CU.cuMemcpyHtoD(d_slots, slots, sizeof slots));
  MUST(CU.cuMemcpyHtoD(d_k, k, sizeof k));
  MUST(CU.cuMemcpyHtoD(d_v, v, sizeof v));
  memset(&wa, 0, sizeof wa);
  wa.kv.base = ptr(pool);
  wa.kv.block_stride = W_STRIDE;
  wa.kv.k_offset = 0;
  wa.kv.v_offset = W_PLANE;
  wa.kv.token_stride = W_ROW;
  wa.kv.head_stride = W_D;
  wa.kv.block_size = W_BS;
  wa.kv.num_kv_heads = W_KVH;
  wa.kv.head_dim = W_D;
  wa.kv.dtype = KVS_DTYPE_FP32;
  wa.kv.num_blocks = W_NB;
  wa.k = ptr(d_k);
  wa.v = ptr(d_v);
  wa.slots = ptr(d_slots);
  wa.src_token_stride = W_ROW;
  wa.src_dtype = KVS_DTYPE_FP32;
  wa.num_tokens = W_NT;

  MUST(CU.cuStreamCreate(&s, 0));
  gate_init(&g);
  OK(CU.cuLaunchHostFunc(s, gate_fn, &g));
  OK(CU.cuLaunchKernel(f_write, W_NT, 1, 1, 128, 1, 1, 0, s, params, NULL));
  memset(&wa, 0, sizeof wa); /* the launch has its own copy */
  gate_open(&g);
  OK(CU.cuStreamSynchronize(s));
  gate_destroy(&g);

  /* Expected bytes: block b = slot / 4, token t = slot % 4; K of head h,
   * element d at byte b * stride + (t * 16 + h * 8 + d) * 4, V one plane
   * further. */
  memset(want, 0xab, W_NB * W_STRIDE);
  for (int i = 0; i < W_NT; i++) {
    if (slots[i] < 0 || slots[i] >= W_NB * W_BS)
      continue;
    size_t b = (size_t)slots[i] / W_BS, t = (size_t)slots[i] % W_BS;
    for (int e = 0; e < W_ROW; e++) {
      size_t off = b * W_STRIDE + (t * W_ROW + (size_t)e) * 4;
      memcpy(want + off, &k[i][e], 4);
      memcpy(want + off + W_PLANE, &v[i][e], 4);
    }
  }
  MUST(CU.cuMemcpyDtoH(got, pool, W_NB * W_STRIDE));
  CHECK(memcmp(got, want, W_NB * W_STRIDE) == 0,
        "write kernel: pool bytes differ (skipped slots written?)");
  OK(CU.cuStreamDestroy(s));
  OK(CU.cuMemFree(pool));
  OK(CU.cuMemFree(d_slots));
  OK(CU.cuMemFree(d_k));
  OK(CU.cuMemFree(d_v));
  free(want);
  free(got);
}

/* Decode attention on the legacy stream, against the C twin on host
 * copies (the stand-in runs the same twin: this checks the plumbing). */
static void test_attention(void) {
  enum { BS = 4, D = 16, H = 2, SEQS = 2, MAXB = 2, NBLK = 4 };
  static const uint32_t lens[SEQS] = {5, 3};
  static const uint32_t tables[SEQS * MAXB] = {2, 0, 3, 1};
  const size_t pool_bytes = (size_t)NBLK * 2 * BS * D * 4;
  float *pool = malloc(pool_bytes), q[SEQS * H * D], out[SEQS * H * D];
  float got[SEQS * H * D];
  CUdeviceptr d_pool = dev_alloc(pool_bytes, 0), d_q = dev_alloc(sizeof q, 0);
  CUdeviceptr d_out = dev_alloc(sizeof out, 0),
              d_lens = dev_alloc(sizeof lens, 0);
  CUdeviceptr d_tab = dev_alloc(sizeof tables, 0);
  kvs_attn_args a, h;
  int prefill = 0;
  uint32_t lanes = 4, split = 0, parts = 1, span = 0;
  void *params[] = {&a, &prefill, &lanes, &split};
  void *mparams[] = {&a, &prefill, &parts, &span};

  for (size_t i = 0; i < pool_bytes / 4; i++)
    pool[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
  for (size_t i = 0; i < SEQS * H * D; i++)
    q[i] = (float)((i * 11) % 23) / 11.0f - 1.0f;
  MUST(CU.cuMemcpyHtoD(d_pool, pool, pool_bytes));
  MUST(CU.cuMemcpyHtoD(d_q, q, sizeof q));
  MUST(CU.cuMemcpyHtoD(d_lens, lens, sizeof lens));
  MUST(CU.cuMemcpyHtoD(d_tab, tables, sizeof tables));
  memset(&h, 0, sizeof h);
  h.kv.base = pool;
  h.kv.block_stride = 2 * BS * D * 4;
  h.kv.v_offset = BS * D * 4;
  h.kv.token_stride = D;
  h.kv.head_stride = D;
  h.kv.block_size = BS;
  h.kv.num_kv_heads = 1;
  h.kv.head_dim = D;
  h.kv.dtype = KVS_DTYPE_FP32;
  h.kv.num_blocks = NBLK;
  h.out = out;
  h.q = q;
  h.seq_lens = lens;
  h.block_tables = tables;
  h.num_seqs = h.num_rows = SEQS;
  h.num_heads = H;
  h.max_blocks_per_seq = MAXB;
  h.max_seq_len = 8;
  h.qo_dtype = KVS_DTYPE_FP32;
  h.scale = 0.25f;
  CHECK(kvs_cpu_decode_attention(&h, NULL) == 0, "the C twin on host memory");
  a = h;
  a.kv.base = ptr(d_pool);
  a.out = ptr(d_out);
  a.q = ptr(d_q);
  a.seq_lens = ptr(d_lens);
  a.block_tables = ptr(d_tab);
  OK(CU.cuLaunchKernel(f_attn, SEQS, 1, 1, 256, 1, 1, 0, NULL, params, NULL));
  OK(CU.cuLaunchKernel(f_merge, SEQS, H, 1, 128, 1, 1, 0, NULL, mparams, NULL));
  OK(CU.cuCtxSynchronize());
  MUST(CU.cuMemcpyDtoH(got, d_out, sizeof got));
  CHECK(memcmp(got, out, sizeof out) == 0, "decode attention output differs "
        "from the C twin's");
  OK(CU.cuMemFree(d_pool));
  OK(CU.cuMemFree(d_q));
  OK(CU.cuMemFree(d_out));
  OK(CU.cuMemFree(d_lens));
  OK(CU.cuMemFree(d_tab));
  free(pool);
}

/* ---- events -------------------------------------------------------------- */

static void test_events(void) {
  CUevent e0, e1, e2, nt;
  CUstream s;
  float ms = -1;
  gate g;

  MUST(CU.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  MUST(CU.cuEventCreate(&e0, 0));
  MUST(CU.cuEventCreate(&e1, 0));
  MUST(CU.cuEventCreate(&nt, CU_EVENT_DISABLE_TIMING));
  EXPECT(CUDA_ERROR_INVALID_VALUE, CU.cuEventCreate(&e2, 0x100));
  OK(CU.cuEventSynchronize(e1)); /* never recorded: nothing to wait for */
  EXPECT(CUDA_ERROR_INVALID_HANDLE, CU.cuEventElapsedTime(&ms, e0, e1));

  gate_init(&g);
  OK(CU.cuEventRecord(e0, s));
  OK(CU.cuLaunchHostFunc(s, gate_fn, &g));
  OK(CU.cuEventRecord(e1, s));
  OK(CU.cuEventRecord(nt, s));
  EXPECT(CUDA_ERROR_NOT_READY, CU.cuEventElapsedTime(&ms, e0, e1));
  double t0 = now_ms();
  sleep_ms(40);
  gate_open(&g);
  OK(CU.cuEventSynchronize(e1));
  double waited = now_ms() - t0;
  OK(CU.cuEventElapsedTime(&ms, e0, e1));
  CHECK(ms >= 30.0f && ms <= waited + 5.0, "elapsed %.2f ms, expected about 40",
        (double)ms);
  EXPECT(CUDA_ERROR_INVALID_HANDLE, CU.cuEventElapsedTime(&ms, e0, nt));
  gate_destroy(&g);

  /* Destroyed while its record is queued: released when the stream passes. */
  gate_init(&g);
  MUST(CU.cuEventCreate(&e2, 0));
  OK(CU.cuLaunchHostFunc(s, gate_fn, &g));
  OK(CU.cuEventRecord(e2, s));
  OK(CU.cuEventDestroy(e2));
  EXPECT(CUDA_ERROR_INVALID_HANDLE, CU.cuEventSynchronize(e2));
  gate_open(&g);
  OK(CU.cuStreamSynchronize(s));
  gate_destroy(&g);

  /* On the legacy stream: recorded at once. */
  OK(CU.cuEventRecord(e0, NULL));
  OK(CU.cuEventRecord(e1, NULL));
  OK(CU.cuEventElapsedTime(&ms, e0, e1));
  CHECK(ms >= 0.0f && ms < 1000.0f, "legacy-stream events %.3f ms apart",
        (double)ms);
  OK(CU.cuEventDestroy(e0));
  OK(CU.cuEventDestroy(e1));
  OK(CU.cuEventDestroy(nt));
  EXPECT(CUDA_ERROR_INVALID_HANDLE, CU.cuEventDestroy(nt));
  OK(CU.cuStreamDestroy(s));
}

/* ---- sticky errors ------------------------------------------------------- */

static void flag_fn(void *arg) { *(int *)arg = 1; }

/* Runs fn with stderr going to a file; returns what it printed. */
static char *capture_stderr(void (*fn)(void *), void *arg) {
  static char text[4096];
  FILE *f = tmpfile();
  int saved = dup(2);
  size_t n;

  fflush(stderr);
  dup2(fileno(f), 2);
  fn(arg);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  rewind(f);
  n = fread(text, 1, sizeof text - 1, f);
  text[n] = '\0';
  fclose(f);
  fputs(text, stderr); /* keep it in the log */
  return text;
}

typedef struct sticky_run {
  CUstream s;
  CUevent e;
  int ran;
  CUresult sync;
} sticky_run;

/* A gather whose index array is host memory: an illegal address. */
static void illegal_gather(void *arg) {
  sticky_run *r = arg;
  static const uint32_t host_idx[1] = {0};
  CUdeviceptr pool = dev_alloc(4096, 0), stg = dev_alloc(4096, 0);
  char *base = ptr(pool), *staging = ptr(stg);
  const uint32_t *idx = host_idx;
  uint64_t stride = 64;
  int mode = 1;
  void *params[] = {&base, &stride, &staging, &idx, &mode};
  gate g;

  gate_init(&g);
  OK(CU.cuLaunchHostFunc(r->s, gate_fn, &g));
  OK(CU.cuLaunchKernel(f_blocks, 1, 1, 1, 256, 1, 1, 0, r->s, params, NULL));
  OK(CU.cuEventRecord(r->e, r->s));
  OK(CU.cuLaunchHostFunc(r->s, flag_fn, &r->ran));
  gate_open(&g);
  r->sync = CU.cuStreamSynchronize(r->s);
  gate_destroy(&g);
  OK(CU.cuMemFree(pool));
  OK(CU.cuMemFree(stg));
}

/* A write whose source dtype the C twin refuses, on the legacy stream. */
static void bad_write(void *arg) {
  sticky_run *r = arg;
  CUdeviceptr pool = dev_alloc(4096, 0);
  kvs_write_args wa;
  void *params[] = {&wa};

  memset(&wa, 0, sizeof wa);
  wa.kv.base = ptr(pool);
  wa.kv.block_stride = 1024;
  wa.kv.token_stride = wa.kv.head_stride = wa.kv.head_dim = 8;
  wa.kv.block_size = wa.kv.num_kv_heads = 1;
  wa.k = wa.v = ptr(pool);
  wa.slots = ptr(pool); /* zeros: slot 0 */
  wa.src_token_stride = 8;
  wa.src_dtype = 99;
  wa.num_tokens = 1;
  OK(CU.cuLaunchKernel(f_write, 1, 1, 1, 128, 1, 1, 0, NULL, params, NULL));
  r->sync = CU.cuCtxSynchronize();
  OK(CU.cuMemFree(pool));
}

static void test_sticky(CUcontext ctx0) {
  unsigned char host[64];
  CUdeviceptr p;
  CUcontext c1, c2;
  sticky_run r = {0};
  const char *text;
  float ms;

  /* Device 1: an illegal address on a stream. */
  c1 = open_dev(1);
  MUST(CU.cuStreamCreate(&r.s, 0));
  MUST(CU.cuEventCreate(&r.e, 0));
  MUST(CU.cuMemAlloc(&p, 64));
  text = capture_stderr(illegal_gather, &r);
  CHECK(strstr(text, "kvs_blocks_kernel") && strstr(text, "block indexes"),
        "the fault's line names neither the kernel nor the pointer: '%s'",
        text);
  CHECK(r.sync == CUDA_ERROR_ILLEGAL_ADDRESS, "stream sync after the fault: %d",
        r.sync);
  CHECK(!r.ran, "a host function ran after the context faulted");
  EXPECT(CUDA_ERROR_ILLEGAL_ADDRESS, CU.cuEventSynchronize(r.e));
  EXPECT(CUDA_ERROR_NOT_READY, CU.cuEventElapsedTime(&ms, r.e, r.e));
  EXPECT(CUDA_ERROR_ILLEGAL_ADDRESS, CU.cuCtxSynchronize());
  EXPECT(CUDA_ERROR_ILLEGAL_ADDRESS, CU.cuStreamSynchronize(NULL));
  EXPECT(CUDA_ERROR_ILLEGAL_ADDRESS, CU.cuMemcpyDtoH(host, p, 64));
  EXPECT(CUDA_ERROR_ILLEGAL_ADDRESS, CU.cuMemcpyHtoD(p, host, 64));
  EXPECT(CUDA_ERROR_ILLEGAL_ADDRESS, CU.cuMemcpyDtoDAsync(p, p, 64, r.s));
  EXPECT(CUDA_ERROR_ILLEGAL_ADDRESS, CU.cuLaunchHostFunc(r.s, flag_fn, &r.ran));
  /* Releasing still works (the process must clean up). */
  OK(CU.cuMemFree(p));
  OK(CU.cuEventDestroy(r.e));
  OK(CU.cuStreamDestroy(r.s));

  /* Device 2: the C twin refuses a write. */
  c2 = open_dev(2);
  {
    /* A stream of another context (device 0's) is refused; the event is
     * then not left waiting for a record that never got queued. */
    CUstream s0;
    CUevent e2;

    MUST(CU.cuCtxSetCurrent(ctx0));
    MUST(CU.cuStreamCreate(&s0, 0));
    MUST(CU.cuCtxSetCurrent(c2));
    MUST(CU.cuEventCreate(&e2, 0));
    EXPECT(CUDA_ERROR_INVALID_HANDLE, CU.cuEventRecord(e2, s0));
    EXPECT(CUDA_ERROR_INVALID_HANDLE, CU.cuLaunchHostFunc(s0, flag_fn, &r.ran));
    OK(CU.cuEventSynchronize(e2));
    OK(CU.cuEventDestroy(e2));
    OK(CU.cuStreamDestroy(s0));
  }
  text = capture_stderr(bad_write, &r);
  CHECK(strstr(text, "kvs_write_kv_kernel") && strstr(text, "EINVAL"),
        "the fault's line: '%s'", text);
  CHECK(r.sync == CUDA_ERROR_ILLEGAL_ADDRESS, "context sync after the fault: "
        "%d", r.sync);
  (void)c1;
  (void)c2;

  /* Device 0's context is another one: unaffected. */
  MUST(CU.cuCtxSetCurrent(ctx0));
  OK(CU.cuCtxSynchronize());
  MUST(CU.cuMemAlloc(&p, 64));
  OK(CU.cuMemcpyDtoH(host, p, 64));
  OK(CU.cuMemFree(p));
}

/* ---- main ---------------------------------------------------------------- */

int main(void) {
  const char *build = getenv("KVS_BUILD");
  int fd0, maps0, threads0, sock;
  char err[256];
  CUcontext ctx0;
  pid_t ipc;

  setvbuf(stdout, NULL, _IONBF, 0);
  snprintf(so_path, sizeof so_path, "%s/tests/standin/libcuda-standin.so",
           build && *build ? build : "build");
  if (access(so_path, R_OK) != 0) {
    fprintf(stderr, "FAIL: %s: %s (build it first)\n", so_path,
            strerror(errno));
    return 1;
  }
  setenv("KVS_CUDA_DRIVER", so_path, 1);
  unsetenv("KVS_STANDIN_FAIL");
  fd0 = count_fds();
  maps0 = count_maps();
  threads0 = count_threads();

  /* Children with their own configuration, before this process loads. */
  test_exports();
  test_fail_points();
  test_bad_config();
  CHECK(in_child(defaults_run, NULL) == 0, "defaults: the child failed");

  /* Upper case here: the importing child (same variable) and the UUIDs
   * read back must come out in the canonical lower-case form. */
  setenv("KVS_STANDIN_GPUS", UUID0_UPPER "," UUID1 "," UUID2, 1);
  setenv("KVS_STANDIN_MEM", "64M", 1);
  setenv("KVS_STANDIN_NAME", "test-gpu (stand-in)", 1);
  unsetenv("KVS_STANDIN_GRANULARITY");
  ipc = ipc_start(&sock); /* forked before this process initialises */

  load();
  /* kvshare's own device selection, by UUID, finds device 0. */
  if (kvs__cuda_ctx_open(UUID0, err, sizeof err)) {
    fprintf(stderr, "FAIL: kvs__cuda_ctx_open(%s): %s\n", UUID0, err);
    return 1;
  }
  CHECK(strcmp(kvs__cuda_uuid(), UUID0) == 0, "opened %s", kvs__cuda_uuid());
  MUST(CU.cuDevicePrimaryCtxRetain(&ctx0, 0));

  test_devices();
  test_vmm_rules();
  test_memory_budget();
  test_access();
  test_ipc(ipc, sock);
  test_streams();
  test_module();
  test_blocks_kernel();
  test_write_kernel();
  test_attention();
  test_events();
  test_sticky(ctx0);

  /* Nothing left behind. */
  CHECK(count_fds() == fd0, "%d fds open at the end, %d at the start",
        count_fds(), fd0);
  CHECK(count_maps() == maps0, "%d stand-in mappings at the end, %d at the "
        "start", count_maps(), maps0);
  CHECK(count_threads() == threads0, "%d threads at the end, %d at the start",
        count_threads(), threads0);
  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("test_standin: all checks passed\n");
  return 0;
}
