/*
 * test_cuda_abi.c — kvshare declares the CUDA driver API itself
 * (gpu/kvs_cuda_int.h: no CUDA header at build time, no link against CUDA).
 * Wherever the CUDA toolkit is installed, this checks those declarations
 * against its cuda.h: every constant's value, the layout of every struct
 * passed to the driver, every entry point's prototype (at compile time),
 * and that each entry point is resolved under the symbol name cuda.h maps
 * its API name to (at run time), but for the deliberate exceptions below.
 * A wrong declaration here would only show on a real GPU, as a crash.
 */
#include <stdio.h>
#include <string.h>

#ifndef KVS_HAVE_CUDA_H
int main(void) {
  printf("skipped: no cuda.h (the CUDA toolkit is not installed)\n");
  return 77;
}
#else
#include <stddef.h>

#include <cuda.h>

#define KVS_CUDA_ABI_CHECK
#include "gpu/kvs_cuda_int.h"

/* Constants. */
#define CHECK_CONST(ours, theirs, value)                                     \
  _Static_assert((theirs) == (value), #ours " is not cuda.h's " #theirs);
KVS_CU_CONSTS(CHECK_CONST)

/* Structs: sizes and every field's offset and size. */
#define SAME_FIELD(ours, theirs, f)                                          \
  _Static_assert(offsetof(struct ours, f) == offsetof(theirs, f) &&          \
                     sizeof(((struct ours *)0)->f) ==                        \
                         sizeof(((theirs *)0)->f),                           \
                 #ours "." #f " differs from cuda.h's " #theirs);
_Static_assert(sizeof(struct kvs__cu_uuid) == sizeof(CUuuid), "CUuuid");
SAME_FIELD(kvs__cu_uuid, CUuuid, bytes)
_Static_assert(sizeof(struct kvs__cu_mem_location) == sizeof(CUmemLocation),
               "CUmemLocation");
SAME_FIELD(kvs__cu_mem_location, CUmemLocation, type)
SAME_FIELD(kvs__cu_mem_location, CUmemLocation, id)
_Static_assert(sizeof(struct kvs__cu_mem_prop) == sizeof(CUmemAllocationProp),
               "CUmemAllocationProp");
SAME_FIELD(kvs__cu_mem_prop, CUmemAllocationProp, type)
SAME_FIELD(kvs__cu_mem_prop, CUmemAllocationProp, requestedHandleTypes)
SAME_FIELD(kvs__cu_mem_prop, CUmemAllocationProp, location)
SAME_FIELD(kvs__cu_mem_prop, CUmemAllocationProp, win32HandleMetaData)
SAME_FIELD(kvs__cu_mem_prop, CUmemAllocationProp, allocFlags)
SAME_FIELD(kvs__cu_mem_prop, CUmemAllocationProp, allocFlags.compressionType)
SAME_FIELD(kvs__cu_mem_prop, CUmemAllocationProp,
           allocFlags.gpuDirectRDMACapable)
SAME_FIELD(kvs__cu_mem_prop, CUmemAllocationProp, allocFlags.usage)
SAME_FIELD(kvs__cu_mem_prop, CUmemAllocationProp, allocFlags.reserved)
_Static_assert(sizeof(struct kvs__cu_mem_access) == sizeof(CUmemAccessDesc),
               "CUmemAccessDesc");
SAME_FIELD(kvs__cu_mem_access, CUmemAccessDesc, location)
SAME_FIELD(kvs__cu_mem_access, CUmemAccessDesc, flags)
_Static_assert(sizeof(struct kvs__cu_memcpy_attrs) == sizeof(CUmemcpyAttributes),
               "CUmemcpyAttributes");
SAME_FIELD(kvs__cu_memcpy_attrs, CUmemcpyAttributes, srcAccessOrder)
SAME_FIELD(kvs__cu_memcpy_attrs, CUmemcpyAttributes, srcLocHint)
SAME_FIELD(kvs__cu_memcpy_attrs, CUmemcpyAttributes, dstLocHint)
SAME_FIELD(kvs__cu_memcpy_attrs, CUmemcpyAttributes, flags)

/* Prototypes: our parameter lists, read with cuda.h's types, against the
 * function cuda.h declares under the API name. */
#define CHECK_PROTO(field, sym, args)                                        \
  _Static_assert(                                                            \
      __builtin_types_compatible_p(__typeof__(&field), CUresult(*) args),    \
      #field "'s prototype differs from cuda.h's");
KVS_CU_CORE(CHECK_PROTO)
KVS_CU_VMM(CHECK_PROTO)
KVS_CU_BATCH(CHECK_PROTO)

/* Symbol names: the API name as cuda.h spells it after its macros. */
#define STR(x) #x
#define XSTR(x) STR(x)
static const struct {
  const char *api, *cuda_h, *ours;
} names[] = {
#define NAME_ROW(field, sym, args) {#field, XSTR(field), sym},
    KVS_CU_CORE(NAME_ROW) KVS_CU_VMM(NAME_ROW) KVS_CU_BATCH(NAME_ROW)
#undef NAME_ROW
};

/* Entry points kvshare resolves under an older name on purpose: the same
 * prototype, and drivers older than the newest name still have them. */
static const char *const older_on_purpose[][2] = {
    /* cuEventElapsedTime_v2 appeared with CUDA 12.8 */
    {"cuEventElapsedTime", "cuEventElapsedTime_v2"},
    /* _v2 reports MIG instances' UUIDs; kvshare names whole GPUs (the
     * pool of a MIG instance is not supported yet: docs/decisions.md) */
    {"cuDeviceGetUuid", "cuDeviceGetUuid_v2"},
};

int main(void) {
  size_t i, j, n = sizeof names / sizeof *names, bad = 0;

  for (i = 0; i < n; i++) {
    if (strcmp(names[i].cuda_h, names[i].ours) == 0)
      continue;
    for (j = 0; j < sizeof older_on_purpose / sizeof *older_on_purpose; j++)
      if (!strcmp(names[i].ours, older_on_purpose[j][0]) &&
          !strcmp(names[i].cuda_h, older_on_purpose[j][1]))
        break;
    if (j < sizeof older_on_purpose / sizeof *older_on_purpose) {
      printf("%s: resolved as %s, cuda.h says %s (on purpose)\n",
             names[i].api, names[i].ours, names[i].cuda_h);
      continue;
    }
    printf("FAIL %s: kvshare resolves %s, cuda.h (%d) maps it to %s\n",
           names[i].api, names[i].ours, CUDA_VERSION, names[i].cuda_h);
    bad++;
  }
  printf("%zu entry points, their prototypes, the constants and the structs "
         "checked against cuda.h (CUDA_VERSION %d): %zu mismatched\n",
         n, CUDA_VERSION, bad);
  return bad ? 1 : 0;
}
#endif
