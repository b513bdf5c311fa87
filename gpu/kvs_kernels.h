/*
 * kvs_kernels.h — the K/V kernels of kvshare: CUDA kernels and their C twins.
 *
 * Workers run attention themselves over the shared pool.  Every kernel exists
 * twice with the same signature and the same semantics:
 *
 *   kvs_cpu_<op>(const kvs_<op>_args *a, void *stream)   C, on host memory
 *   kvs_cuda_<op>(const kvs_<op>_args *a, void *stream)  CUDA, on device memory
 *
 * and both sets are also reachable through a table (kvs_kernels_cpu(),
 * kvs_kernels_cuda()) so an engine picks a backend once.  The CPU twin is the
 * reference the CUDA kernel is tested against.
 *
 * Memory and ownership
 *   - Every pointer inside an args struct (pool base, q, out, k, v, slots,
 *     seq_lens, q_start, block_tables, pairs, blocks, staging, workspace) is a
 *     host pointer for kvs_cpu_* and a device pointer (a CUdeviceptr cast to
 *     void *) for kvs_cuda_*.  The caller owns all of them; no kernel keeps a
 *     pointer after it returns (CPU) or after the stream reaches it (CUDA).
 *   - The args struct itself is read during the call only (it is copied into
 *     the launch), so it may live on the caller's stack.
 *   - stream: ignored by the CPU twins (pass NULL).  For CUDA, a CUstream of
 *     the context that kvs_cuda_open() made current, or NULL for the legacy
 *     default stream.  CUDA calls are asynchronous: they return once the work
 *     is queued; synchronise (kvs_cuda_sync) before reading results on the
 *     host or before committing written blocks to the daemon.
 *
 * Layout
 *   The pool is the block-major layout of kvs_layout.h: block b starts at
 *   base + b * block_stride; layer l's K plane then V plane, each
 *   [block_size][num_kv_heads][head_dim].  Kernels never take a per-layer
 *   tensor: they take a kvs_paged_kv (base, block_stride, byte offsets of the
 *   layer's K and V planes inside a block, token/head strides), which
 *   kvs_paged_kv_init() fills from a kvs_layout and a layer index with the
 *   layout header's own offset math.
 *
 * Quantized caches (int8, fp8)
 *   An element is one byte; each (token, kv head) of a plane has
 *   kvs_scale_floats(dtype) float32 in the plane's scale array
 *   (kvs_paged_kv.scale_offset): int8 a scale and the row's minimum, fp8 a
 *   scale (kvs_quantize_row).  The write
 *   kernel quantizes (kvs_quantize_row, int8 rows rotated first; the CUDA
 *   kernel gives the same bytes); attention dequantizes in registers as it
 *   reads, on both backends (over int8, q is rotated once and the output
 *   rotated back once); copy/gather/scatter move whole blocks, scales
 *   included.  int8 takes head_dim up to 4096 (KVS_EINVAL past it).  q,
 *   out and the write kernel's sources are never quantized (KVS_EINVAL).
 *
 * Errors: every function returns 0 or a negative status (kvs_status.h codes,
 * or -errno).  The libraries never log.  kvs_cuda_* return KVS_ENODEV when no
 * CUDA device is usable (see kvs_cuda_available()) and KVS_ENOTSUP for a shape
 * the CUDA kernels do not handle (see docs/kernels.md).
 *
 * Threads: the CPU twins are reentrant and keep no state.  The CUDA side keeps
 * one process-wide device/context/module, set up once by kvs_cuda_open() (or
 * lazily by the first kernel call); it is safe to call from several threads.
 */
#ifndef KVS_KERNELS_H
#define KVS_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "kvs_layout.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- fp16 / bf16 conversion (round to nearest even; NaN stays NaN) ------ */

/* IEEE binary16 bits -> float (exact). */
float kvs_fp16_to_float(uint16_t h);
/* float -> IEEE binary16 bits, round to nearest even, overflow to inf. */
uint16_t kvs_float_to_fp16(float f);
/* bfloat16 bits -> float (exact). */
float kvs_bf16_to_float(uint16_t b);
/* float -> bfloat16 bits, round to nearest even; NaN stays a quiet NaN. */
uint16_t kvs_float_to_bf16(float f);

/* Convert n elements between dtypes (any of fp32/fp16/bf16, either way; the
 * same dtype is a copy).  Returns 0, or KVS_EINVAL for an unknown dtype or a
 * quantized one (int8/fp8 bytes mean nothing without their scale: see
 * kvs_quantize_row). */
int kvs_convert(void *dst, uint32_t dst_dtype, const void *src,
                uint32_t src_dtype, size_t n);

/* ---- quantized K/V (int8, fp8 e4m3) --------------------------------------- */

/* fp8 e4m3 (the "FN" variant: no infinities, 0x7f/0xff NaN, largest finite
 * 448) bits -> float (exact). */
float kvs_fp8_to_float(uint8_t b);
/* float -> fp8 e4m3 bits, round to nearest even, saturating to +-448
 * (infinities included); NaN becomes 0x7f (with the sign). */
uint8_t kvs_float_to_fp8(float f);

/*
 * Quantize one row (the head_dim elements of one token and kv head) of n
 * floats into n bytes of dtype (KVS_DTYPE_INT8 or KVS_DTYPE_FP8) and its
 * kvs_scale_floats(dtype) float32 scales[], as the write kernel does, every
 * operation in float32:
 *   int8: the row rotated first, y = H x / m over each power-of-two segment
 *         of m elements (largest first; H the Sylvester Hadamard matrix, as
 *         butterflies: docs/kernels.md, "Quantized KV blocks"); then
 *         (asymmetric) lo = min y[i], hi = max y[i];
 *         scales[0] = (hi - lo) / 255, scales[1] = lo;
 *         byte i = round_even((y[i] - lo) / scales[0]) clamped to [0, 255];
 *         y reads back as byte * scales[0] + scales[1] (one multiply-add),
 *         and the row as H times that, per segment.
 *         A constant y (scales[0] == 0): bytes 0, y reads back as lo.
 *   fp8:  scales[0] = max |src[i]| / 448, byte i = kvs_float_to_fp8(src[i] /
 *         scales[0]); reads back as kvs_fp8_to_float(byte i) * scales[0].
 *         An all-zero row (scales[0] == 0): bytes 0.
 * A row with a NaN or an infinity (or, int8, whose rotation or range hi -
 * lo overflows float32): bytes 0 and every scale NaN (the row then reads
 * as NaN, as a NaN stored in an fp16 cache does).  Returns 0, or
 * KVS_EINVAL (also for n past 4096, the layout's largest head_dim).
 */
int kvs_quantize_row(void *dst, float *scales, uint32_t dtype,
                     const float *src, size_t n);

/* ---- the paged K/V view of one layer ------------------------------------ */

typedef struct kvs_paged_kv {
  void *base;             /* pool base in this process (host or device) */
  uint64_t block_stride;  /* bytes from block b to block b+1 */
  uint64_t k_offset;      /* bytes from a block's start to this layer's K plane */
  uint64_t v_offset;      /* bytes from a block's start to this layer's V plane */
  uint64_t token_stride;  /* elements from token t to t+1 inside a plane */
  uint64_t head_stride;   /* elements from kv head h to h+1 inside a token */
  uint32_t block_size;    /* tokens per block */
  uint32_t num_kv_heads;
  uint32_t head_dim;
  uint32_t dtype;         /* kvs_dtype of the cache */
  uint32_t num_blocks;    /* blocks in the pool: block indexes are checked
                             against it on the CPU (0 = unchecked) */
  uint32_t scale_offset;  /* quantized dtypes: bytes from a plane's start
                             (k_offset or v_offset) to its float32 scales
                             [block_size][num_kv_heads][kvs_scale_floats];
                             0 otherwise */
} kvs_paged_kv;

/* Fill kv for layer `layer` of the pool at base described by l (which must
 * have been through kvs_layout_finish).  Returns 0 or KVS_EINVAL. */
int kvs_paged_kv_init(kvs_paged_kv *kv, void *base, const kvs_layout *l,
                      uint32_t layer);

/* ---- kernel arguments --------------------------------------------------- */

/*
 * Write: scatter the K and V of num_tokens new tokens into their slots of one
 * layer.  k and v are [num_tokens] rows of [num_kv_heads][head_dim] elements
 * of src_dtype, row i starting src_token_stride elements after row i-1 (pass
 * num_kv_heads * head_dim for packed rows), heads packed inside a row.  Token
 * i goes to slot slots[i] = block * block_size + offset; a negative slot is
 * skipped (padding).  Values are converted to the cache dtype (round to
 * nearest even; for int8/fp8 each head's row is quantized with its own scale,
 * kvs_quantize_row).  Two tokens with the same slot: one of them wins on
 * the CPU and for 16/32-bit caches; for an int8/fp8 cache on a GPU the slot
 * may end with one token's bytes and the other's scale, so pass distinct
 * slots (vLLM-style slot mappings are).
 */
typedef struct kvs_write_args {
  kvs_paged_kv kv;
  const void *k;
  const void *v;
  const int64_t *slots;      /* [num_tokens] */
  uint64_t src_token_stride; /* elements */
  uint32_t src_dtype;
  uint32_t num_tokens;
} kvs_write_args;

/*
 * Paged attention, decode and prefill.
 *
 * Query rows.  Decode (q_start == NULL): one query token per request; row s
 * is request s's last token, at position seq_lens[s] - 1, num_rows ==
 * num_seqs.  Prefill (q_start != NULL, [num_seqs + 1], non-decreasing,
 * q_start[0] == 0, q_start[num_seqs] == num_rows): request s has q_len =
 * q_start[s+1] - q_start[s] new tokens, rows q_start[s] .. q_start[s+1]-1,
 * the last q_len of its seq_lens[s] tokens (chunked prefill: the first
 * seq_lens[s] - q_len are the cached prefix).  Row i of request s is at
 * position p = seq_lens[s] - q_len + i and attends to keys 0..p of its
 * request (causal).  The new tokens' K/V must already be in the cache (write
 * them first with the write kernel).
 *
 * Keys of request s: token j lives in block block_tables[s *
 * max_blocks_per_seq + j / block_size] at offset j % block_size.
 *
 * q and out: [num_rows][num_heads][head_dim] of qo_dtype, packed.
 * Grouped-query attention: num_heads is a multiple of num_kv_heads; query
 * head hq reads kv head hq / (num_heads / num_kv_heads).
 * out = softmax(scale * q . K^T) V over the row's keys, accumulated in fp32.
 * A row with no key (seq_lens[s] == 0) gets zeros.  Where the cache and q/out
 * are the same 16-bit dtype and the GQA ratio is 4 or more (for prefill on
 * the flash kernel, on by default: any ratio and head_dim 64, 128 or 256;
 * it also takes int8/fp8 caches with q/out fp16 or bf16 at head_dim 64 and
 * 128, for prefill and, at GQA 4 or more, for decode), the CUDA kernel uses
 * tensor cores and rounds the softmax weights to that dtype for the product
 * with V (sums stay fp32): the result may then differ from the C twin by
 * about one unit in the last place of the output dtype.
 *
 * max_seq_len: an upper bound of every seq_lens[s] (the CUDA launch needs it
 * on the host).  workspace/workspace_bytes: device scratch for the CUDA
 * split-sequence path (kvs_attn_workspace_bytes() says how much); with none
 * or too little, the CUDA kernel runs one pass per row (slower for long
 * sequences, same result).  The CPU twins ignore the workspace.
 */
typedef struct kvs_attn_args {
  kvs_paged_kv kv;
  void *out;
  const void *q;
  const uint32_t *seq_lens;     /* [num_seqs] */
  const uint32_t *q_start;      /* NULL (decode) or [num_seqs + 1] */
  const uint32_t *block_tables; /* [num_seqs][max_blocks_per_seq] */
  void *workspace;
  uint64_t workspace_bytes;
  uint32_t num_seqs;
  uint32_t num_rows;            /* == num_seqs for decode */
  uint32_t num_heads;
  uint32_t max_blocks_per_seq;
  uint32_t max_seq_len;
  uint32_t qo_dtype;
  float scale;                  /* softmax scale, e.g. 1/sqrt(head_dim) */
  uint32_t reserved_;
} kvs_attn_args;

/*
 * Block copy (copy-on-write): for each i, block pairs[2i+1] := block
 * pairs[2i] (the whole block_stride bytes, all layers).  A pair with src ==
 * dst is a no-op; pairs must not chain (no dst is another pair's src).
 */
typedef struct kvs_copy_args {
  void *base;
  uint64_t block_stride;
  const uint32_t *pairs;  /* [num_pairs][2] = (src, dst) */
  uint32_t num_pairs;
  uint32_t num_blocks;    /* checked on the CPU when non-zero */
} kvs_copy_args;

/*
 * Gather / scatter of whole blocks to and from a contiguous staging buffer
 * (tier moves).  Gather: staging[i] := block blocks[i]; scatter: block
 * blocks[i] := staging[i]; staging[i] is the block_stride bytes at staging +
 * i * block_stride.  The staging buffer is host memory for the CPU twins; for
 * CUDA it is device memory or pinned host memory mapped into the device's
 * address space (a device pointer either way).
 */
typedef struct kvs_xfer_args {
  void *base;
  uint64_t block_stride;
  void *staging;
  const uint32_t *blocks; /* [num_blocks_moved] */
  uint32_t count;
  uint32_t num_blocks;    /* checked on the CPU when non-zero */
} kvs_xfer_args;

/* Bytes of CUDA workspace that lets an attention call split long sequences
 * (0 when splitting would not help). */
uint64_t kvs_attn_workspace_bytes(const kvs_attn_args *a);

/* ---- the two backends ---------------------------------------------------- */

int kvs_cpu_write_kv(const kvs_write_args *a, void *stream);
int kvs_cpu_decode_attention(const kvs_attn_args *a, void *stream);
int kvs_cpu_prefill_attention(const kvs_attn_args *a, void *stream);
int kvs_cpu_copy_blocks(const kvs_copy_args *a, void *stream);
int kvs_cpu_gather_blocks(const kvs_xfer_args *a, void *stream);
int kvs_cpu_scatter_blocks(const kvs_xfer_args *a, void *stream);

int kvs_cuda_write_kv(const kvs_write_args *a, void *stream);
int kvs_cuda_decode_attention(const kvs_attn_args *a, void *stream);
int kvs_cuda_prefill_attention(const kvs_attn_args *a, void *stream);
int kvs_cuda_copy_blocks(const kvs_copy_args *a, void *stream);
int kvs_cuda_gather_blocks(const kvs_xfer_args *a, void *stream);
int kvs_cuda_scatter_blocks(const kvs_xfer_args *a, void *stream);

typedef struct kvs_kernels {
  const char *name; /* "cpu" or "cuda" */
  int (*write_kv)(const kvs_write_args *a, void *stream);
  int (*decode_attention)(const kvs_attn_args *a, void *stream);
  int (*prefill_attention)(const kvs_attn_args *a, void *stream);
  int (*copy_blocks)(const kvs_copy_args *a, void *stream);
  int (*gather_blocks)(const kvs_xfer_args *a, void *stream);
  int (*scatter_blocks)(const kvs_xfer_args *a, void *stream);
} kvs_kernels;

/* Static tables; never NULL, never freed. */
const kvs_kernels *kvs_kernels_cpu(void);
const kvs_kernels *kvs_kernels_cuda(void);

/* ---- CUDA runtime discovery ---------------------------------------------- */

/*
 * 0 when the CUDA kernels can run here: this build embeds them, libcuda.so.1
 * ($KVS_CUDA_DRIVER when set) loads, a device answers, and — once
 * kvs_cuda_open or a kernel tried — the kernels loaded on it.  Otherwise
 * KVS_ENODEV (or the load's status), and when reason is not NULL *reason
 * points to a static, human-readable line saying why ("built without nvcc",
 * "libcuda.so.1: cannot open shared object file", "no CUDA device",
 * "cannot load the kernels (no image for this GPU?) ...").  Loads the driver
 * with dlopen on first use; never needs a GPU to link or load.
 */
int kvs_cuda_available(const char **reason);

/*
 * Pick the device (uuid: "GPU-xxxxxxxx-xxxx-..." as nvidia-smi -L prints it,
 * or NULL for the first visible device), retain its primary context, make it
 * current in the calling thread, and load the kernels.  Calling it again with
 * the same device just makes the context current.  Returns 0, KVS_ENODEV,
 * KVS_ENOENT (no device with that uuid) or KVS_ESTATE (already opened on
 * another device).
 */
int kvs_cuda_open(const char *uuid);

/* Name and UUID ("GPU-...") of the open device; static strings, "" before
 * kvs_cuda_open. */
const char *kvs_cuda_device_name(void);
const char *kvs_cuda_device_uuid(void);

/* Small driver-API helpers so a C engine (and the tests) need no CUDA
 * headers.  Device pointers travel as void *.  All return 0 or a status. */
int kvs_cuda_malloc(void **dptr, size_t bytes);
int kvs_cuda_free(void *dptr);
int kvs_cuda_memcpy_htod(void *dst, const void *src, size_t bytes);
int kvs_cuda_memcpy_dtoh(void *dst, const void *src, size_t bytes);
int kvs_cuda_memcpy_dtod(void *dst, const void *src, size_t bytes);
int kvs_cuda_memset(void *dptr, uint8_t value, size_t bytes);
int kvs_cuda_sync(void *stream); /* NULL: the whole context */
/* Device-side timing: ms between two points of the stream, measured with
 * CUDA events around `reps` calls of fn(arg). */
int kvs_cuda_time_ms(void *stream, int (*fn)(void *arg), void *arg, int reps,
                     float *ms);
/* Attribute read off the open device: memory clock in kHz and bus width in
 * bits (for a theoretical bandwidth), multiprocessor count. */
int kvs_cuda_device_info(int *mem_clock_khz, int *bus_width_bits,
                         int *num_sms);

#ifdef __cplusplus
}
#endif
#endif /* KVS_KERNELS_H */
