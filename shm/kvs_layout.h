/*
 * kvs_layout.h — the one description of the KV-cache block layout.
 *
 * The daemon, the client library and the kernels all compute addresses with
 * the functions below and nothing else.  A block is "block-major": all layers
 * of block b are contiguous, starting at  base + b * block_stride.  Inside a
 * block, layer l holds its K plane then its V plane, each laid out as
 * [block_size][num_kv_heads][head_dim] (NHD).  block_stride is rounded up to
 * KVS_BLOCK_ALIGN bytes so that one block is one O_DIRECT I/O.
 *
 * Quantized dtypes (int8, fp8 e4m3) store one byte per element and, per
 * (token, kv head), kvs_scale_floats(dtype) float32 inside the plane: a
 * quantized plane is its data [block_size][num_kv_heads][head_dim] bytes,
 * padding up to a multiple of 16 bytes, then its scales
 * [block_size][num_kv_heads][kvs_scale_floats] float32, padded to a multiple
 * of 16 bytes.  For int8 (asymmetric: a scale and a minimum) the bytes of
 * (token t, head h) are the row rotated by a Hadamard transform: element x
 * of the rotated row reads as byte * scale[t][h][0] + scale[t][h][1] with
 * the byte unsigned (0..255), and the row is H times the rotated row (per
 * power-of-two segment; docs/kernels.md); for fp8, element x reads as
 * fp8_to_float(byte) * scale[t][h][0].
 * A block thus carries everything needed to read it (docs/kernels.md,
 * "Quantized KV blocks").
 *
 * The handle of a block is its index in the pool; addresses are per process.
 * This header is pure C (no system headers beyond <stdint.h>/<stddef.h>).
 */
#ifndef KVS_LAYOUT_H
#define KVS_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVS_BLOCK_ALIGN 4096u
#define KVS_BLOCK_NONE UINT32_MAX

#if defined(__CUDACC__)
#define KVS_HD __host__ __device__
#else
#define KVS_HD
#endif

/* Element types of K/V.  Values are part of the wire format: never renumber.
 * The size is the bytes of one element (without the scales of the quantized
 * ones: INT8 and FP8, see kvs_dtype_quantized). */
#define KVS_DTYPE_MAP(X) \
  X(FP32, 0, 4, "fp32")  \
  X(FP16, 1, 2, "fp16")  \
  X(BF16, 2, 2, "bf16")  \
  X(INT8, 3, 1, "int8")  \
  X(FP8, 4, 1, "fp8")

typedef enum kvs_dtype {
#define KVS_DTYPE_ENUM(name, val, size, str) KVS_DTYPE_##name = val,
  KVS_DTYPE_MAP(KVS_DTYPE_ENUM)
#undef KVS_DTYPE_ENUM
  KVS_DTYPE__COUNT
} kvs_dtype;

/* The layout of one daemon's pool.  Fixed for the daemon's lifetime. */
typedef struct kvs_layout {
  uint32_t block_size;   /* tokens per block */
  uint32_t num_layers;
  uint32_t num_kv_heads;
  uint32_t head_dim;
  uint32_t dtype;        /* kvs_dtype */
  uint32_t num_blocks;   /* blocks in the device pool */
  uint64_t block_stride; /* bytes from one block to the next (derived) */
} kvs_layout;

static inline KVS_HD size_t kvs_dtype_size(uint32_t dtype) {
  switch (dtype) {
#define KVS_DTYPE_SIZE(name, val, size, str) \
  case val:                                  \
    return size;
    KVS_DTYPE_MAP(KVS_DTYPE_SIZE)
#undef KVS_DTYPE_SIZE
  default:
    return 0;
  }
}

static inline const char *kvs_dtype_name(uint32_t dtype) {
  switch (dtype) {
#define KVS_DTYPE_STR(name, val, size, str) \
  case val:                                 \
    return str;
    KVS_DTYPE_MAP(KVS_DTYPE_STR)
#undef KVS_DTYPE_STR
  default:
    return "unknown";
  }
}

/* 1 for the dtypes stored as bytes with float32 scales per (token, kv
 * head): INT8 (asymmetric: scale = (max - min) / 255 and the minimum) and
 * FP8 (e4m3, scale = amax / 448). */
static inline KVS_HD int kvs_dtype_quantized(uint32_t dtype) {
  return dtype == KVS_DTYPE_INT8 || dtype == KVS_DTYPE_FP8;
}

/* The float32 a quantized dtype stores per (token, kv head): 2 for INT8
 * (the scale, then the row's minimum), 1 for FP8 (the scale); 0 for the
 * others. */
static inline KVS_HD uint32_t kvs_scale_floats(uint32_t dtype) {
  return dtype == KVS_DTYPE_INT8 ? 2u : dtype == KVS_DTYPE_FP8 ? 1u : 0u;
}

/* Alignment of a quantized plane's scales and of its end. */
#define KVS_SCALE_ALIGN 16u

static inline KVS_HD uint64_t kvs_round_up(uint64_t x, uint64_t a) {
  return (x + a - 1) / a * a;
}

/* Bytes of the elements of one K (or V) plane of one layer of one block. */
static inline KVS_HD uint64_t kvs_plane_data_bytes(const kvs_layout *l) {
  return (uint64_t)l->block_size * l->num_kv_heads * l->head_dim *
         kvs_dtype_size(l->dtype);
}

/* Byte offset, from a plane's start, of its scales
 * [block_size][num_kv_heads][kvs_scale_floats] float32 (quantized dtypes;
 * for the others, the plane's end). */
static inline KVS_HD uint64_t kvs_scale_offset(const kvs_layout *l) {
  return kvs_dtype_quantized(l->dtype)
             ? kvs_round_up(kvs_plane_data_bytes(l), KVS_SCALE_ALIGN)
             : kvs_plane_data_bytes(l);
}

/* Bytes of one K (or V) plane of one layer of one block: its elements, and
 * for a quantized dtype its scales. */
static inline KVS_HD uint64_t kvs_plane_bytes(const kvs_layout *l) {
  if (!kvs_dtype_quantized(l->dtype))
    return kvs_plane_data_bytes(l);
  return kvs_scale_offset(l) +
         kvs_round_up((uint64_t)l->block_size * l->num_kv_heads *
                          kvs_scale_floats(l->dtype) * 4,
                      KVS_SCALE_ALIGN);
}

/* Bytes of one layer (K plane + V plane) of one block. */
static inline KVS_HD uint64_t kvs_layer_bytes(const kvs_layout *l) {
  return 2 * kvs_plane_bytes(l);
}

/* Useful bytes of one block, before rounding. */
static inline KVS_HD uint64_t kvs_block_bytes(const kvs_layout *l) {
  return kvs_layer_bytes(l) * l->num_layers;
}

/*
 * Check the fields and fill in block_stride.  Returns 0, or -1 when a field is
 * zero or out of range (every field must be > 0, head counts and sizes small
 * enough that a block stays under 1 GiB).
 */
static inline int kvs_layout_finish(kvs_layout *l) {
  if (l->block_size == 0 || l->block_size > 4096 || l->num_layers == 0 ||
      l->num_layers > 1024 || l->num_kv_heads == 0 || l->num_kv_heads > 1024 ||
      l->head_dim == 0 || l->head_dim > 4096 || kvs_dtype_size(l->dtype) == 0 ||
      l->num_blocks == 0 || l->num_blocks == KVS_BLOCK_NONE)
    return -1;
  if (kvs_block_bytes(l) > (1ull << 30))
    return -1;
  l->block_stride = kvs_round_up(kvs_block_bytes(l), KVS_BLOCK_ALIGN);
  return 0;
}

/* Bytes of the whole pool. */
static inline KVS_HD uint64_t kvs_pool_bytes(const kvs_layout *l) {
  return l->block_stride * l->num_blocks;
}

/* Byte offset of block b from the pool base. */
static inline KVS_HD uint64_t kvs_block_offset(const kvs_layout *l,
                                               uint32_t b) {
  return (uint64_t)b * l->block_stride;
}

/* Byte offset, inside a block, of layer `layer`'s K plane (kv = 0) or V plane
 * (kv = 1). */
static inline KVS_HD uint64_t kvs_plane_offset(const kvs_layout *l,
                                               uint32_t layer, uint32_t kv) {
  return (uint64_t)layer * kvs_layer_bytes(l) + (uint64_t)kv * kvs_plane_bytes(l);
}

/* Element strides inside a plane (NHD): token, then head, then dim. */
static inline KVS_HD uint64_t kvs_token_stride(const kvs_layout *l) {
  return (uint64_t)l->num_kv_heads * l->head_dim;
}
static inline KVS_HD uint64_t kvs_head_stride(const kvs_layout *l) {
  return l->head_dim;
}

/* Byte offset from the pool base of element (block b, layer, kv, token t in
 * the block, head h, dim 0). */
static inline KVS_HD uint64_t kvs_elem_offset(const kvs_layout *l, uint32_t b,
                                              uint32_t layer, uint32_t kv,
                                              uint32_t t, uint32_t h) {
  return kvs_block_offset(l, b) + kvs_plane_offset(l, layer, kv) +
         ((uint64_t)t * kvs_token_stride(l) + (uint64_t)h * kvs_head_stride(l)) *
             kvs_dtype_size(l->dtype);
}

/* Byte offset from the pool base of the float32 scales of (block b, layer,
 * kv, token t, head h), kvs_scale_floats(dtype) of them: quantized dtypes
 * only. */
static inline KVS_HD uint64_t kvs_scale_elem_offset(const kvs_layout *l,
                                                   uint32_t b, uint32_t layer,
                                                   uint32_t kv, uint32_t t,
                                                   uint32_t h) {
  return kvs_block_offset(l, b) + kvs_plane_offset(l, layer, kv) +
         kvs_scale_offset(l) + ((uint64_t)t * l->num_kv_heads + h) *
                                   kvs_scale_floats(l->dtype) * 4;
}

/* Pointer to that element inside one process's mapping of the pool. */
static inline void *kvs_elem_ptr(void *base, const kvs_layout *l, uint32_t b,
                                 uint32_t layer, uint32_t kv, uint32_t t,
                                 uint32_t h) {
  return (char *)base + kvs_elem_offset(l, b, layer, kv, t, h);
}

/* Pointer to those scales inside one process's mapping of the pool: [0] the
 * scale, [1] (int8) the row's minimum. */
static inline float *kvs_scale_ptr(void *base, const kvs_layout *l, uint32_t b,
                                   uint32_t layer, uint32_t kv, uint32_t t,
                                   uint32_t h) {
  return (float *)(void *)((char *)base +
                           kvs_scale_elem_offset(l, b, layer, kv, t, h));
}

#ifdef __cplusplus
}
#endif
#endif /* KVS_LAYOUT_H */
