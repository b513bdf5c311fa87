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
  KVS__FLASH_PLANT_QHI, /* int8: the rotated q rounded once to 16 bits
                         * (no low half) */
  KVS__FLASH_PLANT_PHI, /* int8/fp8: a weight times its value scale
                         * rounded once to fp16 (no low half) */
  KVS__FLASH_PLANT_SPLIT, /* a split stops one key tile short */
};

/*
 * Run the kernel's CTAs (grid_x, grid_y) as the kernel would, in scalar
 * fp32: each CTA takes its (request, tile) through kvs__pf_locate, walks the
 * key tiles of kvs__pf_plan_tile with the kernel's tile sizes, masks the
 * tiles the plan says, updates a running max and sum per row once per key
 * tile (rescaling the accumulators), rounds the softmax weights to the cache
 * dtype before P.V, and never reads a key or value past the plan's n_keys
 * (those read as zeros, as the kernel zero-fills them in shared memory).
 * int8/fp8 caches as the kernel takes them: codes staged as 16-bit values
 * (int8 values centred at their row's rounded mean), the key's scale and
 * offset applied to each score, the value's scale (in a per-tile power of
 * two) folded into the weight, which is split into two fp16 halves, the
 * offsets' share summed apart; int8's q rotated once per row and split
 * into two 16-bit halves, the output rotated back.  The kernel's own conditions (q/out fp16 or
 * bf16; a 16-bit cache of the same dtype with head_dim 64/128/256, or an
 * int8/fp8 cache with head_dim 64/128) are the caller's: returns
 * KVS_EINVAL otherwise.
 *
 * span > 0: split z < grid_z walks the keys [z * span, (z + 1) * span) of
 * each tile and writes the rows' partials (max in natural-log units, sum,
 * unnormalised output; grid_z partitions) to the workspace instead of out
 * (kvs__pf_split_tiles); span must be a multiple of KVS__ATTN_PART and the
 * workspace kvs_attn_workspace_bytes(a) at least, else KVS_EINVAL.
 */
int kvs__flash_model(const kvs_attn_args *a, uint32_t grid_x, uint32_t grid_y,
                     uint32_t grid_z, uint32_t span, int plant);

/* The merge kernel after a split launch (span > 0: `parts` splits of span
 * keys each, the partials in a->workspace): a->out from the partials, as
 * kvs_prefill_flash_merge_kernel computes it (gpu/kernels.cu). */
void kvs__flash_model_merge(const kvs_attn_args *a, uint32_t parts,
                            uint32_t span);

#endif /* KVS_FLASH_MODEL_H */
