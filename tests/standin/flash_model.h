/*
 * flash_model.h — a C model of the flash prefill kernel
 * (gpu/kernels_prefill.cuh), for machines without a GPU: the stand-in driver
 * runs it for a launch of kvs_prefill_flash_*, and test_gpu_flash_model
 * compares it with the C twin.  Test code; not part of libkvshare.
 */
#ifndef KVS_FLASH_MODEL_H
#define KVS_FLASH_MODEL_H

#include "gpu/kvs_kernels.h"

/* Deliberate faults, so a test can prove its checks fail. */
enum kvs__flash_plant {
  KVS__FLASH_PLANT_NONE = 0,
  KVS__FLASH_PLANT_MASK, /* a masked tile lets a row see one key too many */
  KVS__FLASH_PLANT_NOSKIP, /* boundary tiles are not masked at all */
};

/*
 * Run the kernel's CTAs (grid_x, grid_y) as the kernel would, in scalar
 * fp32: each CTA takes its (request, tile) through kvs__pf_locate, walks the
 * key tiles of kvs__pf_plan_tile with the kernel's tile sizes, masks the
 * tiles the plan says, updates a running max and sum per row once per key
 * tile (rescaling the accumulators), rounds the softmax weights to the cache
 * dtype before P.V, and never reads a key or value past the plan's n_keys
 * (those read as zeros, as the kernel zero-fills them in shared memory).
 * The kernel's own conditions (fp16/bf16 cache, q/out of the same dtype,
 * head_dim 64/128/256) are the caller's: returns KVS_EINVAL otherwise.
 */
int kvs__flash_model(const kvs_attn_args *a, uint32_t grid_x, uint32_t grid_y,
                     int plant);

#endif /* KVS_FLASH_MODEL_H */
