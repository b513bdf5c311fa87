/*
 * cuda_driver.c — the host side of the CUDA kernels: through the driver that
 * cuda_loader.c opened (no CUDA header, no link against CUDA), loads the
 * fatbin the build embedded (kvs__cuda_fatbin) into the device's primary
 * context and launches the kernels; and the small memory helpers.
 *
 * Nothing here needs a GPU to link or load: every machine gets the same
 * library, and kvs_cuda_available() says at run time whether it can run.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvs_cuda_int.h"
#include "kvs_kernels_int.h"
#include "kvs_prefill_sched.h"
#include "kvs_status.h"

/* The embedded fatbin: cuda_fatbin.S (built with nvcc) or cuda_nofatbin.c
 * (size 0, when the build had no nvcc). */
extern const unsigned char kvs__cuda_fatbin[];
extern const unsigned long long kvs__cuda_fatbin_size;

/* ---- process-wide state ------------------------------------------------------ */

/* Attention kernels per cache dtype (kvs_dtype order: fp32, fp16, bf16,
 * int8, fp8), vectors per lane and query-head group. */
enum { DT_N = 5, NV_N = 2, G_N = 4 };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char reason_buf[512];
static int kernels_rc = 1; /* 1: module not loaded yet; then 0 or a status */
static int opened; /* device, context and module ready: written once under
                      lock (release), read without it (acquire) */
static CUmodule mod;
static char dev_name[256];
static int dev_sms = 1;
static int dev_cc = 0; /* compute capability, major * 10 + minor */
/* Attention blocks per SM the split aims at (a tuning knob for the bench). */
int kvs__cuda_attn_blocks_per_sm = 0;
/* Largest query-head group one attention block takes (bench knob). */
int kvs__cuda_attn_max_group = 8;
/* Use the tensor-core kernel where it applies (bench knob). */
int kvs__cuda_attn_mma = 1;
/* Prefill on the flash kernel (kernels_prefill.cuh) where it applies: on
 * by default since tests/gpu/run.sh passed on an H100 (docs/kernels.md). */
int kvs__cuda_prefill_flash = 1;
int kvs__cuda_prefill_flash_split = 1;
int kvs__cuda_prefill_wgmma = 1;
int kvs__cuda_decode_flash = 4;
uint32_t kvs__cuda_attn_last_nsplit = 1;
uint32_t kvs__cuda_attn_last_flash = 0;
uint32_t kvs__cuda_attn_last_wg = 0;
static CUfunction f_write, f_write_q, f_blocks, f_merge;
static CUfunction f_attn[DT_N][NV_N][G_N];
static CUfunction f_mma[2][2]; /* [fp16, bf16][d64, d128] */
static CUfunction f_flash[2][3]; /* [fp16, bf16][d64, d128, d256] */
static CUfunction f_flash_wg[2]; /* sm_90a, head_dim 128: [fp16, bf16] */
/* int8/fp8 caches: [int8, fp8][q/out fp16, bf16][d64, d128] */
static CUfunction f_flash_q[2][2][2];
static CUfunction f_flash_merge;
/*
 * Decode over an int8/fp8 cache on the flash kernel (kvs__cuda_decode_flash):
 * a decode call is a prefill whose requests have one new row each, the
 * last of their seq_len keys, so q_start is 0, 1, .., num_seqs.  One device
 * array of that, made when the kernels load (256 KiB) and synchronized
 * there, so that no decode call allocates or copies (a stream capture
 * could not take it) and no stream's kernel can read it unwritten; a call
 * of more requests keeps the decode kernel.
 */
#define KVS__IOTA_N 65537u
static CUdeviceptr d_iota;
/* The context is current in this thread: kvshare made it current once and
 * does not check again, so a thread that switches to another context of
 * its own makes kvshare's later calls run there.  (Engines that use the
 * device's primary context — PyTorch does — never see the difference.) */
static __thread int tls_ctx;

int kvs_cuda_available(const char **reason) {
  int rc;

  if (kvs__cuda_fatbin_size == 0) {
    if (reason)
      *reason = "built without CUDA kernels (nvcc was not found at build time)";
    return KVS_ENODEV;
  }
  rc = kvs__cu_load(reason);
  if (rc)
    return rc;
  /* The device answered, but its kernels may not have loaded (no image
   * for this GPU): once tried, that is the answer.  (reason_buf is written
   * once, under the lock, before kernels_rc.) */
  pthread_mutex_lock(&lock);
  rc = kernels_rc == 1 ? 0 : kernels_rc;
  if (rc && reason)
    *reason = reason_buf;
  pthread_mutex_unlock(&lock);
  return rc;
}

/* Loads the kernels into the open context; caller holds lock. */
static int load_kernels_locked(void) {
  CUresult r;

  if (kernels_rc != 1)
    return kernels_rc;
  kernels_rc = KVS_ENODEV;
  if (kvs__cuda_fatbin_size == 0) {
    snprintf(reason_buf, sizeof reason_buf, "built without CUDA kernels "
             "(nvcc was not found at build time)");
    return kernels_rc;
  }
  if ((r = kvs__cu.cuModuleLoadData(&mod, kvs__cuda_fatbin))) {
    kvs__cu_describe(reason_buf, sizeof reason_buf,
                     "cannot load the kernels (no image for this GPU?)", r);
    return kernels_rc = kvs__cu_status(r);
  }
  if ((r = kvs__cu.cuModuleGetFunction(&f_write, mod, "kvs_write_kv_kernel")) ||
      (r = kvs__cu.cuModuleGetFunction(&f_write_q, mod, "kvs_write_kv_q_kernel")) ||
      (r = kvs__cu.cuModuleGetFunction(&f_blocks, mod, "kvs_blocks_kernel")) ||
      (r = kvs__cu.cuModuleGetFunction(&f_merge, mod, "kvs_attn_merge_kernel")) ||
      (r = kvs__cu.cuModuleGetFunction(&f_flash_merge, mod,
                                       "kvs_prefill_flash_merge_kernel")))
    return kernels_rc = kvs__cu_status(r);
  static const char *dts[DT_N] = {"fp32", "fp16", "bf16", "int8", "fp8"};
  for (int t = 0; t < DT_N; t++)
    for (int v = 0; v < NV_N; v++)
      for (int g = 0; g < G_N; g++) {
        char name[64];
        if (kvs_dtype_quantized((uint32_t)t) && v == 1 && g == 3)
          continue; /* not built (it would spill): groups of 4 at most */
        snprintf(name, sizeof name, "kvs_attn_%s_nv%d_g%d", dts[t], v + 1,
                 1 << g);
        if ((r = kvs__cu.cuModuleGetFunction(&f_attn[t][v][g], mod, name)))
          return kernels_rc = kvs__cu_status(r);
      }
  for (int t = 0; t < 2; t++)
    for (int d = 0; d < 2; d++) {
      char name[64];
      snprintf(name, sizeof name, "kvs_attn_mma_%s_d%d", t ? "bf16" : "fp16",
               d ? 128 : 64);
      if ((r = kvs__cu.cuModuleGetFunction(&f_mma[t][d], mod, name)))
        return kernels_rc = kvs__cu_status(r);
    }
  for (int t = 0; t < 2; t++)
    for (int d = 0; d < 3; d++) {
      char name[64];
      snprintf(name, sizeof name, "kvs_prefill_flash_%s_d%d",
               t ? "bf16" : "fp16", 64 << d);
      if ((r = kvs__cu.cuModuleGetFunction(&f_flash[t][d], mod, name)))
        return kernels_rc = kvs__cu_status(r);
      if (d != 1)
        continue;
      snprintf(name, sizeof name, "kvs_prefill_flash_wg_%s_d128", t ? "bf16" : "fp16");
      if ((r = kvs__cu.cuModuleGetFunction(&f_flash_wg[t], mod, name)))
        return kernels_rc = kvs__cu_status(r);
    }
  for (int c = 0; c < 2; c++)
    for (int t = 0; t < 2; t++)
      for (int d = 0; d < 2; d++) {
        char name[64];
        snprintf(name, sizeof name, "kvs_prefill_flash_%s_%s_d%d", c ? "fp8" : "int8",
                 t ? "bf16" : "fp16", 64 << d);
        if ((r = kvs__cu.cuModuleGetFunction(&f_flash_q[c][t][d], mod, name)))
          return kernels_rc = kvs__cu_status(r);
      }
  {
    /* The knobs without a rebuild (for a GPU check or a bench run from
     * Python), read when the kernels load. */
    const char *e = getenv("KVS_CUDA_PREFILL_FLASH");
    if (e && *e)
      kvs__cuda_prefill_flash = strcmp(e, "0") != 0;
    e = getenv("KVS_CUDA_PREFILL_WGMMA");
    if (e && *e)
      kvs__cuda_prefill_wgmma = strcmp(e, "0") != 0;
    e = getenv("KVS_CUDA_DECODE_FLASH");
    if (e && *e) {
      const int n = atoi(e);
      kvs__cuda_decode_flash = n > 0 ? n : 0;
    }
  }
  {
    uint32_t *h = malloc(KVS__IOTA_N * sizeof *h);
    if (!h)
      return kernels_rc = KVS_ENOMEM;
    for (uint32_t i = 0; i < KVS__IOTA_N; i++)
      h[i] = i;
    r = kvs__cu.cuMemAlloc(&d_iota, KVS__IOTA_N * sizeof *h);
    if (r == CUDA_SUCCESS)
      r = kvs__cu.cuMemcpyHtoD(d_iota, h, KVS__IOTA_N * sizeof *h);
    if (r == CUDA_SUCCESS)
      r = kvs__cu.cuCtxSynchronize();
    free(h);
    if (r != CUDA_SUCCESS) {
      if (d_iota)
        kvs__cu.cuMemFree(d_iota);
      d_iota = 0;
      return kernels_rc = kvs__cu_status(r);
    }
  }
  CUdevice dev = kvs__cuda_device();
  kvs__cu.cuDeviceGetName(dev_name, sizeof dev_name, dev);
  if (kvs__cu.cuDeviceGetAttribute(&dev_sms, CU_ATTR_MULTIPROCESSOR_COUNT, dev) ||
      dev_sms < 1)
    dev_sms = 1;
  int ccmaj = 0, ccmin = 0;
  if (kvs__cu.cuDeviceGetAttribute(&ccmaj, CU_ATTR_CC_MAJOR, dev) ||
      kvs__cu.cuDeviceGetAttribute(&ccmin, CU_ATTR_CC_MINOR, dev))
    ccmaj = ccmin = 0;
  dev_cc = 10 * ccmaj + ccmin;
  __atomic_store_n(&opened, 1, __ATOMIC_RELEASE);
  return kernels_rc = 0;
}

int kvs_cuda_open(const char *uuid) {
  int rc = kvs__cuda_ctx_open(uuid, NULL, 0);
  if (rc)
    return rc;
  tls_ctx = 1;
  pthread_mutex_lock(&lock);
  rc = load_kernels_locked();
  pthread_mutex_unlock(&lock);
  return rc;
}

/* Memory helpers: the device open (the first one if nobody chose) and its
 * context current in this thread. */
static int ctx_ready(void) {
  if (tls_ctx)
    return 0;
  int rc = kvs__cuda_ctx_open(NULL, NULL, 0);
  if (rc == 0)
    tls_ctx = 1;
  return rc;
}

/* Kernel launches: the context and the kernels. */
static int ready(void) {
  if (tls_ctx && __atomic_load_n(&opened, __ATOMIC_ACQUIRE))
    return 0;
  return kvs_cuda_open(NULL);
}

const char *kvs_cuda_device_name(void) {
  return __atomic_load_n(&opened, __ATOMIC_ACQUIRE) ? dev_name : "";
}

const char *kvs_cuda_device_uuid(void) { return kvs__cuda_uuid(); }

/* ---- memory helpers ----------------------------------------------------------- */

int kvs_cuda_malloc(void **dptr, size_t bytes) {
  int rc = ctx_ready();
  if (rc)
    return rc;
  CUdeviceptr p = 0;
  rc = kvs__cu_status(kvs__cu.cuMemAlloc(&p, bytes ? bytes : 1));
  *dptr = rc ? NULL : (void *)(uintptr_t)p;
  return rc;
}

int kvs_cuda_free(void *dptr) {
  int rc = ctx_ready();
  return rc ? rc : (dptr ? kvs__cu_status(kvs__cu.cuMemFree((CUdeviceptr)(uintptr_t)dptr)) : 0);
}

int kvs_cuda_memcpy_htod(void *dst, const void *src, size_t bytes) {
  int rc = ctx_ready();
  return rc ? rc : kvs__cu_status(kvs__cu.cuMemcpyHtoD((CUdeviceptr)(uintptr_t)dst, src, bytes));
}

int kvs_cuda_memcpy_dtoh(void *dst, const void *src, size_t bytes) {
  int rc = ctx_ready();
  return rc ? rc : kvs__cu_status(kvs__cu.cuMemcpyDtoH(dst, (CUdeviceptr)(uintptr_t)src, bytes));
}

int kvs_cuda_memcpy_dtod(void *dst, const void *src, size_t bytes) {
  int rc = ctx_ready();
  return rc ? rc
            : kvs__cu_status(kvs__cu.cuMemcpyDtoD((CUdeviceptr)(uintptr_t)dst,
                                     (CUdeviceptr)(uintptr_t)src, bytes));
}

int kvs_cuda_memset(void *dptr, uint8_t value, size_t bytes) {
  int rc = ctx_ready();
  return rc ? rc : kvs__cu_status(kvs__cu.cuMemsetD8((CUdeviceptr)(uintptr_t)dptr, value, bytes));
}

int kvs_cuda_sync(void *stream) {
  int rc = ctx_ready();
  if (rc)
    return rc;
  return kvs__cu_status(stream ? kvs__cu.cuStreamSynchronize((CUstream)stream)
                       : kvs__cu.cuCtxSynchronize());
}

int kvs_cuda_time_ms(void *stream, int (*fn)(void *arg), void *arg, int reps,
                     float *ms) {
  int rc = ctx_ready();
  if (rc)
    return rc;
  CUevent e0 = NULL, e1 = NULL;
  if ((rc = kvs__cu_status(kvs__cu.cuEventCreate(&e0, 0))) ||
      (rc = kvs__cu_status(kvs__cu.cuEventCreate(&e1, 0))))
    goto out;
  if ((rc = kvs__cu_status(kvs__cu.cuEventRecord(e0, (CUstream)stream))))
    goto out;
  for (int i = 0; i < reps && !rc; i++)
    rc = fn(arg);
  if (rc || (rc = kvs__cu_status(kvs__cu.cuEventRecord(e1, (CUstream)stream))) ||
      (rc = kvs__cu_status(kvs__cu.cuEventSynchronize(e1))))
    goto out;
  rc = kvs__cu_status(kvs__cu.cuEventElapsedTime(ms, e0, e1));
out:
  if (e0)
    kvs__cu.cuEventDestroy(e0);
  if (e1)
    kvs__cu.cuEventDestroy(e1);
  return rc;
}

int kvs_cuda_device_info(int *mem_clock_khz, int *bus_width_bits,
                         int *num_sms) {
  int rc = ctx_ready();
  if (rc)
    return rc;
  *mem_clock_khz = *bus_width_bits = *num_sms = 0;
  kvs__cu.cuDeviceGetAttribute(mem_clock_khz, CU_ATTR_MEMORY_CLOCK_RATE, kvs__cuda_device());
  kvs__cu.cuDeviceGetAttribute(bus_width_bits, CU_ATTR_GLOBAL_MEMORY_BUS_WIDTH, kvs__cuda_device());
  kvs__cu.cuDeviceGetAttribute(num_sms, CU_ATTR_MULTIPROCESSOR_COUNT, kvs__cuda_device());
  return 0;
}

int kvs__cuda_device_compute(int *sm_clock_khz, int *cc_major, int *cc_minor) {
  int rc = ctx_ready();
  if (rc)
    return rc;
  *sm_clock_khz = *cc_major = *cc_minor = 0;
  kvs__cu.cuDeviceGetAttribute(sm_clock_khz, CU_ATTR_CLOCK_RATE, kvs__cuda_device());
  kvs__cu.cuDeviceGetAttribute(cc_major, CU_ATTR_CC_MAJOR, kvs__cuda_device());
  kvs__cu.cuDeviceGetAttribute(cc_minor, CU_ATTR_CC_MINOR, kvs__cuda_device());
  return 0;
}

/* ---- kernels ------------------------------------------------------------------- */

static int launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                  unsigned threads, unsigned smem, void *stream, void **params) {
  return kvs__cu_status(kvs__cu.cuLaunchKernel(f, gx, gy, gz, threads, 1, 1, smem,
                                  (CUstream)stream, params, NULL));
}

int kvs_cuda_write_kv(const kvs_write_args *a, void *stream) {
  if (!a || kvs__check_paged_kv(&a->kv) || kvs_dtype_size(a->src_dtype) == 0)
    return KVS_EINVAL;
  if (kvs_dtype_quantized(a->src_dtype))
    return KVS_EINVAL;
  if (a->num_tokens == 0)
    return 0;
  if (!a->k || !a->v || !a->slots ||
      a->src_token_stride < (uint64_t)a->kv.num_kv_heads * a->kv.head_dim)
    return KVS_EINVAL;
  int rc = ready();
  if (rc)
    return rc;
  kvs_write_args copy = *a;
  void *params[] = {&copy};
  /* int8/fp8: a warp per row (its scales need the whole row), so the
   * quantizing kernel; else one thread per element.  int8 rotates each row
   * in D floats of shared memory a warp: 4 warps, fewer for a head_dim
   * past 3072 (48 KiB in all). */
  if (!kvs_dtype_quantized(a->kv.dtype))
    return launch(f_write, a->num_tokens, 1, 1, 128, 0, stream, params);
  unsigned warps = 4, smem = 0;
  if (a->kv.dtype == KVS_DTYPE_INT8) {
    while (warps > 1 && warps * a->kv.head_dim * 4u > 48u * 1024)
      warps--;
    smem = warps * a->kv.head_dim * 4u;
  }
  return launch(f_write_q, a->num_tokens, 1, 1, 32 * warps, smem, stream,
                params);
}

static int cuda_blocks(void *base, uint64_t stride, void *staging,
                       const uint32_t *idx, uint32_t count, int mode,
                       void *stream) {
  if (stride == 0 || (count && (!base || !idx || (mode && !staging))))
    return KVS_EINVAL;
  if (count == 0)
    return 0;
  int rc = ready();
  if (rc)
    return rc;
  uint64_t vecs = (stride + 15) / 16;
  unsigned slices = (unsigned)((vecs + 1023) / 1024);
  if (slices > 64)
    slices = 64;
  void *params[] = {&base, &stride, &staging, &idx, &mode};
  return launch(f_blocks, count, slices, 1, 256, 0, stream, params);
}

int kvs_cuda_copy_blocks(const kvs_copy_args *a, void *stream) {
  if (!a)
    return KVS_EINVAL;
  return cuda_blocks(a->base, a->block_stride, NULL, a->pairs, a->num_pairs, 0,
                     stream);
}

int kvs_cuda_gather_blocks(const kvs_xfer_args *a, void *stream) {
  if (!a)
    return KVS_EINVAL;
  return cuda_blocks(a->base, a->block_stride, a->staging, a->blocks, a->count,
                     1, stream);
}

int kvs_cuda_scatter_blocks(const kvs_xfer_args *a, void *stream) {
  if (!a)
    return KVS_EINVAL;
  return cuda_blocks(a->base, a->block_stride, a->staging, a->blocks, a->count,
                     2, stream);
}

/*
 * The flash prefill kernel (kernels_prefill.cuh) takes a 16-bit cache with
 * q/out of the same dtype and head_dim 64, 128 or 256, or an int8/fp8 cache
 * with q/out fp16 or bf16 and head_dim 64 or 128; q and out 16-byte
 * aligned (its K/V rows passed cuda_attention's alignment check already).
 * Everything else keeps the kernels above.
 */
static int flash_applies(const kvs_attn_args *a, uint32_t ratio) {
  const kvs_paged_kv *kv = &a->kv;
  uint32_t D = kv->head_dim;
  const int sixteen = kv->dtype == KVS_DTYPE_FP16 || kv->dtype == KVS_DTYPE_BF16;
  return (a->qo_dtype == KVS_DTYPE_FP16 || a->qo_dtype == KVS_DTYPE_BF16) &&
         (sixteen ? a->qo_dtype == kv->dtype && (D == 64 || D == 128 || D == 256)
                  : kvs_dtype_quantized(kv->dtype) && (D == 64 || D == 128)) &&
         ((uintptr_t)a->q | (uintptr_t)a->out) % 16 == 0 &&
         (uint64_t)a->num_rows * ratio <= UINT32_MAX &&
         kvs__pf_grid_x(a->num_rows, a->num_seqs, ratio) <= 0x7fffffffu &&
         kv->num_kv_heads <= 65535;
}

/*
 * grid (an upper bound of the tiles: the kernel finds its request), one kv
 * head per grid.y, splits over long prefixes per grid.z (docs/kernels.md).
 * A grid of fewer CTAs than two waves (two per SM, the launch bound) is
 * split, given a workspace, into enough spans of the longest request's keys
 * (multiples of KVS__ATTN_PART, at most its partitions) to reach two waves;
 * the merge kernel then writes the output.
 */
static int flash_prefill(const kvs_attn_args *a, uint32_t ratio, void *stream) {
  const kvs_paged_kv *kv = &a->kv;
  uint32_t D = kv->head_dim;
  uint64_t gx = kvs__pf_grid_x(a->num_rows, a->num_seqs, ratio);
  uint32_t parts = kvs__attn_parts(a->max_seq_len), nsplit = 1, span = 0;
  /* (the partials are stored as float pairs: an 8-byte aligned workspace) */
  if (kvs__cuda_prefill_flash_split && parts > 1 && a->workspace &&
      (uintptr_t)a->workspace % 8 == 0 &&
      a->workspace_bytes >= kvs_attn_workspace_bytes(a)) {
    uint64_t ctas = gx * kv->num_kv_heads, want = 4 * (uint64_t)dev_sms;
    if (ctas < want) {
      uint64_t k = (want + ctas - 1) / ctas, len = a->max_seq_len;
      uint64_t cand = k < parts ? k : parts;
      uint64_t per = (len + cand - 1) / cand;
      span = (uint32_t)((per + KVS__ATTN_PART - 1) / KVS__ATTN_PART * KVS__ATTN_PART);
      nsplit = (uint32_t)((len + span - 1) / span);
      if (nsplit <= 1) {
        nsplit = 1;
        span = 0;
      }
    }
  }
  kvs_attn_args copy = *a;
  void *params[] = {&copy, &span};
  /* the wgmma variant only where its image runs: sm_90a, compute
   * capability 9.0 exactly; head_dim 128 (docs/kernels.md: ptxas 13.0
   * miscompiled it at 64) */
  const int wg = kvs__cuda_prefill_wgmma && dev_cc == 90 &&
                 !kvs_dtype_quantized(kv->dtype) && D == 128;
  kvs__cuda_attn_last_nsplit = nsplit;
  kvs__cuda_attn_last_flash = 1;
  kvs__cuda_attn_last_wg = (uint32_t)wg;
  const int bf = kv->dtype == KVS_DTYPE_BF16;
  CUfunction f = kvs_dtype_quantized(kv->dtype)
                     ? f_flash_q[kv->dtype == KVS_DTYPE_FP8][a->qo_dtype == KVS_DTYPE_BF16]
                                [D == 128]
                 : wg ? f_flash_wg[bf]
                      : f_flash[bf][D == 64 ? 0 : D == 128 ? 1 : 2];
  int rc = launch(f, (unsigned)gx, kv->num_kv_heads, nsplit, KVS__PF_THREADS,
                  wg ? kvs__pf_wg_smem(D) : kvs__pf_smem_for(kv->dtype, D), stream,
                  params);
  if (rc || !span)
    return rc;
  void *mparams[] = {&copy, &nsplit, &span};
  return launch(f_flash_merge, a->num_rows, a->num_heads, 1, 128, 0, stream, mparams);
}

static int cuda_attention(const kvs_attn_args *a, int prefill, void *stream) {
  int rc = kvs__check_attn(a, prefill);
  if (rc)
    return rc;
  if (a->num_seqs == 0 || a->num_rows == 0)
    return 0;
  const kvs_paged_kv *kv = &a->kv;
  size_t es = kvs_dtype_size(kv->dtype);
  uint64_t row_bytes = (uint64_t)kv->head_dim * es;
  /* 16-byte loads of key rows: everything a row address is made of must be a
   * multiple of 16 bytes; int8/fp8 scales are read as 8-byte pairs from
   * arrays that kvs_layout.h aligns to 16 bytes. */
  if (row_bytes % 16 || ((uintptr_t)kv->base | kv->block_stride | kv->k_offset |
                         kv->v_offset | kv->token_stride * es |
                         kv->head_stride * es |
                         (kvs_dtype_quantized(kv->dtype) ? kv->scale_offset : 0)) % 16)
    return KVS_ENOTSUP;
  uint64_t chunks = row_bytes / 16;
  uint32_t lanes, nv;
  if (chunks <= 32 && (chunks & (chunks - 1)) == 0) {
    lanes = (uint32_t)chunks;
    nv = 1;
  } else if (chunks == 64) {
    lanes = 32;
    nv = 2;
  } else {
    return KVS_ENOTSUP;
  }
  rc = ready();
  if (rc)
    return rc;
  uint32_t ratio = a->num_heads / kv->num_kv_heads;
  kvs__cuda_attn_last_flash = 0;
  kvs__cuda_attn_last_wg = 0;
  if (prefill && kvs__cuda_prefill_flash && flash_applies(a, ratio))
    return flash_prefill(a, ratio, stream);
  if (!prefill && kvs__cuda_decode_flash > 0 && ratio >= (uint32_t)kvs__cuda_decode_flash &&
      kvs_dtype_quantized(kv->dtype) &&
      a->num_seqs < KVS__IOTA_N && flash_applies(a, ratio)) {
    kvs_attn_args copy = *a;
    copy.q_start = (const uint32_t *)(uintptr_t)d_iota;
    return flash_prefill(&copy, ratio, stream);
  }
  const int quant = kvs_dtype_quantized(kv->dtype);
  /* Tensor cores for GQA groups of 4 or more over a 16-bit cache, q/out in
   * the same dtype (the products then round nothing the C twin keeps). */
  int mma = kvs__cuda_attn_mma && kvs__cuda_attn_max_group >= 8 && ratio >= 4 &&
            (kv->dtype == KVS_DTYPE_FP16 || kv->dtype == KVS_DTYPE_BF16) &&
            a->qo_dtype == kv->dtype && (kv->head_dim == 64 || kv->head_dim == 128);
  int gi = ratio >= 8 || mma ? 3 : ratio >= 4 ? 2 : ratio >= 2 ? 1 : 0;
  while (gi > 0 && ((1 << gi) > kvs__cuda_attn_max_group ||
                    (quant && nv == 2 && gi == 3)))
    gi--;
  uint32_t G = 1u << gi;
  uint32_t gchunks = (ratio + G - 1) / G;
  /*
   * Split long rows over several blocks (each split a multiple of
   * KVS__ATTN_PART tokens, so the workspace for `parts` always fits).  The
   * number of splits is the one whose blocks fill whole waves best: blocks
   * resident per SM is what the kernel's __launch_bounds__ promise
   * (KVS_ATTN_MINB in kernels.cu).  A non-zero kvs__cuda_attn_blocks_per_sm
   * instead aims at that many blocks per SM (bench knob).
   */
  uint32_t parts = kvs__attn_parts(a->max_seq_len);
  uint64_t base_blocks = (uint64_t)a->num_rows * kv->num_kv_heads * gchunks;
  uint32_t nsplit = 1, span = 0;
  if (parts > 1 && a->workspace &&
      a->workspace_bytes >= kvs_attn_workspace_bytes(a)) {
    uint32_t w = G * nv * (uint32_t)(16 / es);
    uint32_t per_sm = quant ? (nv == 1 && G <= 4 ? 2 : 1)
                      : nv == 1 ? (w <= 32 ? 3 : w <= 64 ? 2 : 1) : (w <= 32 ? 2 : 1);
    if (mma)
      per_sm = 2;
    uint64_t slots = (uint64_t)per_sm * dev_sms;
    uint32_t best = 1;
    if (kvs__cuda_attn_blocks_per_sm > 0) {
      uint64_t want = (uint64_t)kvs__cuda_attn_blocks_per_sm * dev_sms;
      uint64_t k = base_blocks < want ? (want + base_blocks - 1) / base_blocks : 1;
      best = k < parts ? (uint32_t)k : parts;
    } else {
      double best_eff = -1.0;
      for (uint32_t cand = 1; cand <= parts && cand <= 64; cand++) {
        uint32_t per = (a->max_seq_len + cand - 1) / cand;
        uint32_t sp = (per + KVS__ATTN_PART - 1) / KVS__ATTN_PART * KVS__ATTN_PART;
        if ((a->max_seq_len + sp - 1) / sp != cand)
          continue;
        uint64_t blocks = base_blocks * cand;
        uint64_t waves = (blocks + slots - 1) / slots;
        double eff = (double)blocks / (double)(waves * slots);
        if (eff > best_eff + 0.02) {
          best_eff = eff;
          best = cand;
        }
      }
    }
    uint32_t per = (a->max_seq_len + best - 1) / best;
    span = (per + KVS__ATTN_PART - 1) / KVS__ATTN_PART * KVS__ATTN_PART;
    nsplit = (a->max_seq_len + span - 1) / span;
    if (nsplit <= 1)
      span = 0;
  }
  uint32_t split = span;
  kvs__cuda_attn_last_nsplit = split ? nsplit : 1;
  kvs_attn_args copy = *a;
  int pf = prefill;
  if (mma) {
    unsigned msmem =
        (unsigned)(G * (KVS__ATTN_PART + kv->head_dim) * sizeof(float));
    void *params[] = {&copy, &pf, &split};
    rc = launch(f_mma[kv->dtype == KVS_DTYPE_BF16][kv->head_dim == 128],
                a->num_rows, kv->num_kv_heads * gchunks, split ? nsplit : 1,
                KVS__ATTN_THREADS, msmem, stream, params);
  } else {
    unsigned smem =
        (unsigned)(G * (KVS__ATTN_PART + 2 * kv->head_dim) * sizeof(float));
    void *params[] = {&copy, &pf, &lanes, &split};
    rc = launch(f_attn[kv->dtype][nv - 1][gi], a->num_rows,
                kv->num_kv_heads * gchunks, split ? nsplit : 1,
                KVS__ATTN_THREADS, smem, stream, params);
  }
  if (rc || !split)
    return rc;
  void *mparams[] = {&copy, &pf, &nsplit, &span};
  return launch(f_merge, a->num_rows, a->num_heads, 1, 128, 0, stream, mparams);
}

int kvs_cuda_decode_attention(const kvs_attn_args *a, void *stream) {
  if (a && a->q_start)
    return KVS_EINVAL;
  return cuda_attention(a, 0, stream);
}

int kvs_cuda_prefill_attention(const kvs_attn_args *a, void *stream) {
  return cuda_attention(a, 1, stream);
}

static const kvs_kernels cuda_table = {
    .name = "cuda",
    .write_kv = kvs_cuda_write_kv,
    .decode_attention = kvs_cuda_decode_attention,
    .prefill_attention = kvs_cuda_prefill_attention,
    .copy_blocks = kvs_cuda_copy_blocks,
    .gather_blocks = kvs_cuda_gather_blocks,
    .scatter_blocks = kvs_cuda_scatter_blocks,
};

const kvs_kernels *kvs_kernels_cuda(void) { return &cuda_table; }
