/*
 * kvs_cuda_int.h — the CUDA driver API as kvshare uses it, and the loader.
 * Internal to gpu/ and to the test stand-in driver; not installed.
 *
 * Nothing in kvshare links against CUDA or includes a CUDA header.  The
 * driver is opened with dlopen at run time (gpu/cuda_loader.c) and reached
 * only through the table kvs__cu, whose entries are declared here with the
 * driver's own signatures (cuda.h of CUDA 12/13; tests/unit/
 * test_cuda_abi.c checks them against cuda.h wherever the toolkit is
 * installed).  Which library is opened: $KVS_CUDA_DRIVER when set (a path;
 * the tests point it at the stand-in driver, tests/standin/), else
 * "libcuda.so.1".
 *
 * Two groups of entry points:
 *   KVS_CU_CORE  device, context, module, launch, plain memory, streams,
 *                events: what the kernels need.  All must resolve.
 *   KVS_CU_VMM   the virtual memory management calls (cuMemCreate ...), the
 *                host callback and the async copies: what the GPU pool and
 *                the daemon's copy engine need.  A driver without them still
 *                runs the kernels; kvs__cu_vmm says whether they resolved.
 */
#ifndef KVS_CUDA_INT_H
#define KVS_CUDA_INT_H

#include <stddef.h>
#include <stdint.h>

/* ---- types and constants -----------------------------------------------
 *
 * Declared as cuda.h declares them, under struct tags of our own, so that
 * test_cuda_abi.c can include cuda.h and this header in one file (with
 * KVS_CUDA_ABI_CHECK defined: no typedefs, no constants here) and check
 * sizes, offsets, values and every entry point's prototype against it.
 */

struct kvs__cu_uuid {
  unsigned char bytes[16];
};

struct kvs__cu_mem_location {
  int type; /* CU_MEM_LOCATION_TYPE_* */
  int id;   /* device ordinal */
};

struct kvs__cu_mem_prop {
  int type;                 /* CU_MEM_ALLOCATION_TYPE_* */
  int requestedHandleTypes; /* CU_MEM_HANDLE_TYPE_* */
  struct kvs__cu_mem_location location;
  void *win32HandleMetaData;
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
};

struct kvs__cu_mem_access {
  struct kvs__cu_mem_location location;
  int flags; /* CU_MEM_ACCESS_FLAGS_* */
};

struct kvs__cu_memcpy_attrs {
  int srcAccessOrder; /* CU_MEMCPY_SRC_ACCESS_ORDER_* */
  struct kvs__cu_mem_location srcLocHint, dstLocHint;
  unsigned flags;     /* CU_MEMCPY_FLAG_* */
};

/* X(our name, cuda.h's name, value) */
#define KVS_CU_CONSTS(X)                                                     \
  X(CUDA_SUCCESS, CUDA_SUCCESS, 0)                                           \
  X(CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_INVALID_VALUE, 1)                   \
  X(CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_OUT_OF_MEMORY, 2)                   \
  X(CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_NOT_INITIALIZED, 3)               \
  X(CUDA_ERROR_NO_DEVICE, CUDA_ERROR_NO_DEVICE, 100)                         \
  X(CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_DEVICE, 101)               \
  X(CUDA_ERROR_INVALID_IMAGE, CUDA_ERROR_INVALID_IMAGE, 200)                 \
  X(CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_CONTEXT, 201)             \
  X(CUDA_ERROR_NO_BINARY_FOR_GPU, CUDA_ERROR_NO_BINARY_FOR_GPU, 209)         \
  X(CUDA_ERROR_OPERATING_SYSTEM, CUDA_ERROR_OPERATING_SYSTEM, 304)           \
  X(CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_HANDLE, 400)               \
  X(CUDA_ERROR_NOT_FOUND, CUDA_ERROR_NOT_FOUND, 500)                         \
  X(CUDA_ERROR_NOT_READY, CUDA_ERROR_NOT_READY, 600)                         \
  X(CUDA_ERROR_NOT_PERMITTED, CUDA_ERROR_NOT_PERMITTED, 800)                 \
  X(CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_NOT_SUPPORTED, 801)                 \
  X(CU_ATTR_MULTIPROCESSOR_COUNT, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,  \
    16)                                                                      \
  X(CU_ATTR_MEMORY_CLOCK_RATE, CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, 36)    \
  X(CU_ATTR_CLOCK_RATE, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, 13)                  \
  X(CU_ATTR_CC_MAJOR, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 75)      \
  X(CU_ATTR_CC_MINOR, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 76)      \
  X(CU_ATTR_GLOBAL_MEMORY_BUS_WIDTH,                                         \
    CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, 37)                         \
  X(CU_ATTR_VMM_SUPPORTED,                                                   \
    CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 102)            \
  X(CU_ATTR_POSIX_FD_SUPPORTED,                                              \
    CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 103)    \
  X(CU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_ALLOCATION_TYPE_PINNED, 1)         \
  X(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,                                \
    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 1)                             \
  X(CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_LOCATION_TYPE_DEVICE, 1)             \
  X(CU_MEM_ACCESS_FLAGS_PROT_READWRITE, CU_MEM_ACCESS_FLAGS_PROT_READWRITE,  \
    3)                                                                       \
  X(CU_MEM_ALLOC_GRANULARITY_MINIMUM, CU_MEM_ALLOC_GRANULARITY_MINIMUM, 0)   \
  X(CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,                                    \
    CU_MEM_ALLOC_GRANULARITY_RECOMMENDED, 1)                                 \
  X(CU_STREAM_NON_BLOCKING, CU_STREAM_NON_BLOCKING, 1)                       \
  X(CU_EVENT_DISABLE_TIMING, CU_EVENT_DISABLE_TIMING, 2)                     \
  X(CU_MEMHOSTREGISTER_PORTABLE, CU_MEMHOSTREGISTER_PORTABLE, 1)           \
  X(CU_MEMCPY_SRC_ACCESS_ORDER_STREAM, CU_MEMCPY_SRC_ACCESS_ORDER_STREAM, 1)

#ifndef KVS_CUDA_ABI_CHECK
typedef int CUresult;
typedef int CUdevice;
typedef int CUdevice_attribute;
typedef int CUmemAllocationHandleType;
typedef int CUmemAllocationGranularity_flags;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef void (*CUhostFn)(void *user_data);
typedef struct kvs__cu_uuid CUuuid;
typedef struct kvs__cu_mem_location CUmemLocation;
typedef struct kvs__cu_mem_prop CUmemAllocationProp;
typedef struct kvs__cu_mem_access CUmemAccessDesc;
typedef struct kvs__cu_memcpy_attrs CUmemcpyAttributes;

#define KVS_CU_CONST_ENUM(ours, theirs, value) ours = value,
enum { KVS_CU_CONSTS(KVS_CU_CONST_ENUM) };
#undef KVS_CU_CONST_ENUM
#endif

/* ---- the entry points ------------------------------------------------------ */

/* X(field, symbol, parameter list) */
#define KVS_CU_CORE(X)                                                       \
  X(cuInit, "cuInit", (unsigned flags))                                      \
  X(cuDeviceGetCount, "cuDeviceGetCount", (int *count))                      \
  X(cuDeviceGet, "cuDeviceGet", (CUdevice * dev, int ordinal))               \
  X(cuDeviceGetName, "cuDeviceGetName", (char *name, int len, CUdevice dev)) \
  X(cuDeviceGetUuid, "cuDeviceGetUuid", (CUuuid * uuid, CUdevice dev))       \
  X(cuDeviceGetAttribute, "cuDeviceGetAttribute",                            \
    (int *value, CUdevice_attribute attr, CUdevice dev))                                    \
  X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain",                    \
    (CUcontext * ctx, CUdevice dev))                                         \
  X(cuCtxSetCurrent, "cuCtxSetCurrent", (CUcontext ctx))                     \
  X(cuCtxSynchronize, "cuCtxSynchronize", (void))                            \
  X(cuModuleLoadData, "cuModuleLoadData", (CUmodule * mod, const void *img)) \
  X(cuModuleGetFunction, "cuModuleGetFunction",                              \
    (CUfunction * f, CUmodule mod, const char *name))                        \
  X(cuLaunchKernel, "cuLaunchKernel",                                        \
    (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,       \
     unsigned by, unsigned bz, unsigned smem, CUstream s, void **params,     \
     void **extra))                                                          \
  X(cuMemGetInfo, "cuMemGetInfo_v2", (size_t * free_b, size_t * total_b))    \
  X(cuMemAlloc, "cuMemAlloc_v2", (CUdeviceptr * p, size_t bytes))            \
  X(cuMemFree, "cuMemFree_v2", (CUdeviceptr p))                              \
  X(cuMemcpyHtoD, "cuMemcpyHtoD_v2",                                         \
    (CUdeviceptr dst, const void *src, size_t bytes))                        \
  X(cuMemcpyDtoH, "cuMemcpyDtoH_v2",                                         \
    (void *dst, CUdeviceptr src, size_t bytes))                              \
  X(cuMemcpyDtoD, "cuMemcpyDtoD_v2",                                         \
    (CUdeviceptr dst, CUdeviceptr src, size_t bytes))                        \
  X(cuMemsetD8, "cuMemsetD8_v2",                                             \
    (CUdeviceptr p, unsigned char value, size_t bytes))                      \
  X(cuStreamCreate, "cuStreamCreate", (CUstream * s, unsigned flags))        \
  X(cuStreamDestroy, "cuStreamDestroy_v2", (CUstream s))                     \
  X(cuStreamSynchronize, "cuStreamSynchronize", (CUstream s))                \
  X(cuEventCreate, "cuEventCreate", (CUevent * e, unsigned flags))           \
  X(cuEventRecord, "cuEventRecord", (CUevent e, CUstream s))                 \
  X(cuEventSynchronize, "cuEventSynchronize", (CUevent e))                   \
  X(cuEventElapsedTime, "cuEventElapsedTime",                                \
    (float *ms, CUevent start, CUevent end))                                 \
  X(cuEventDestroy, "cuEventDestroy_v2", (CUevent e))                        \
  X(cuGetErrorString, "cuGetErrorString", (CUresult r, const char **s))

#define KVS_CU_VMM(X)                                                        \
  X(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity",          \
    (size_t * gran, const CUmemAllocationProp *prop,                        \
     CUmemAllocationGranularity_flags option))            \
  X(cuMemCreate, "cuMemCreate",                                              \
    (CUmemGenericAllocationHandle * h, size_t bytes,                         \
     const CUmemAllocationProp *prop, unsigned long long flags))             \
  X(cuMemRelease, "cuMemRelease", (CUmemGenericAllocationHandle h))          \
  X(cuMemExportToShareableHandle, "cuMemExportToShareableHandle",            \
    (void *shareable, CUmemGenericAllocationHandle h,                        \
     CUmemAllocationHandleType type, unsigned long long flags))                                              \
  X(cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle",        \
    (CUmemGenericAllocationHandle * h, void *os_handle,                      \
     CUmemAllocationHandleType type))           \
  X(cuMemAddressReserve, "cuMemAddressReserve",                              \
    (CUdeviceptr * p, size_t bytes, size_t align, CUdeviceptr addr,          \
     unsigned long long flags))                                              \
  X(cuMemAddressFree, "cuMemAddressFree", (CUdeviceptr p, size_t bytes))     \
  X(cuMemMap, "cuMemMap",                                                    \
    (CUdeviceptr p, size_t bytes, size_t offset,                             \
     CUmemGenericAllocationHandle h, unsigned long long flags))              \
  X(cuMemUnmap, "cuMemUnmap", (CUdeviceptr p, size_t bytes))                 \
  X(cuMemSetAccess, "cuMemSetAccess",                                        \
    (CUdeviceptr p, size_t bytes, const CUmemAccessDesc *desc,               \
     size_t count))                                                          \
  X(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2",                               \
    (CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s))            \
  X(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2",                               \
    (CUdeviceptr dst, const void *src, size_t bytes, CUstream s))            \
  X(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2",                               \
    (void *dst, CUdeviceptr src, size_t bytes, CUstream s))                  \
  X(cuLaunchHostFunc, "cuLaunchHostFunc",                                    \
    (CUstream s, CUhostFn fn, void *user_data))                              \
  X(cuStreamQuery, "cuStreamQuery", (CUstream s))                            \
  X(cuMemHostRegister, "cuMemHostRegister_v2",                               \
    (void *p, size_t bytes, unsigned flags))                                 \
  X(cuMemHostUnregister, "cuMemHostUnregister", (void *p))

/* Batched copies (CUDA 12.8; _v2, without the failure index, since 13):
 * optional, as the VMM entry points are.  The copies of one call run in
 * no set order: never give it two that depend on each other. */
#define KVS_CU_BATCH(X)                                                      \
  X(cuMemcpyBatchAsync, "cuMemcpyBatchAsync_v2",                             \
    (CUdeviceptr * dsts, CUdeviceptr * srcs, size_t * sizes, size_t count,   \
     CUmemcpyAttributes * attrs, size_t * attrsIdxs, size_t numAttrs,        \
     CUstream s))

typedef struct kvs__cu_table {
#define KVS_CU_FIELD(field, sym, args) CUresult(*field) args;
  KVS_CU_CORE(KVS_CU_FIELD)
  KVS_CU_VMM(KVS_CU_FIELD)
  KVS_CU_BATCH(KVS_CU_FIELD)
#undef KVS_CU_FIELD
} kvs__cu_table;

/* The driver's entry points; valid once kvs__cu_load() returned 0. */
extern kvs__cu_table kvs__cu;
/* 1 when every KVS_CU_VMM entry point resolved too. */
extern int kvs__cu_vmm;
/* 1 when KVS_CU_BATCH resolved and $KVS_CUDA_COPY_BATCH is not 0. */
extern int kvs__cu_batch;

/*
 * Opens the driver once per process (thread-safe), resolves the table and
 * calls cuInit.  Returns 0, or KVS_ENODEV with *reason (static text) saying
 * why: no driver library, an entry point missing, cuInit failing, no device.
 */
int kvs__cu_load(const char **reason);

/* Maps a CUresult to a kvshare status. */
int kvs__cu_status(CUresult r);

/* "what: the driver's text (CUresult N)" into buf. */
void kvs__cu_describe(char *buf, size_t len, const char *what, CUresult r);

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi -L prints it. */
void kvs__cu_format_uuid(char *out, size_t len, const CUuuid *u);

/*
 * The device and its primary context, shared by the kernels and the pool:
 * `want` is a UUID ("GPU-..." or the bare hex form), a decimal ordinal among
 * the visible devices, or NULL / "" for the first one.  Opens the device
 * (once per process), retains its primary context and makes it current in
 * the calling thread.  Asking for another device than the one already open
 * is KVS_ESTATE.  Returns 0, KVS_ENODEV (no driver or device), KVS_ENOENT
 * (no visible device matches want), KVS_ESTATE, or another status; err gets
 * a one-line reason.
 */
int kvs__cuda_ctx_open(const char *want, char *err, size_t err_len);

/* The open device and its UUID (valid after kvs__cuda_ctx_open returned 0;
 * the UUID is "" before). */
CUdevice kvs__cuda_device(void);
const char *kvs__cuda_uuid(void);

#endif /* KVS_CUDA_INT_H */
