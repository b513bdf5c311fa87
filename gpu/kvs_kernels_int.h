/*
 * kvs_kernels_int.h — internal constants shared by the C twins, the CUDA
 * kernels (gpu/kernels.cu) and the CUDA launcher.  Not installed.
 */
#ifndef KVS_KERNELS_INT_H
#define KVS_KERNELS_INT_H

#include "kvs_kernels.h"

/* Tokens of one split-sequence partition of the CUDA attention kernel. */
#define KVS__ATTN_PART 256u
/* Query heads one CUDA attention block handles (larger GQA groups are split
 * over several blocks). */
#define KVS__ATTN_MAX_GROUP 8u
/* Threads of one CUDA attention block. */
#define KVS__ATTN_THREADS 256u

/*
 * Workspace of the split path, in floats, for R rows, H query heads, P
 * partitions and head_dim D: max[R][H][P], sum[R][H][P], acc[R][H][P][D].
 */
static inline KVS_HD uint64_t kvs__attn_ws_floats(uint64_t rows,
                                                 uint64_t heads,
                                                 uint64_t parts, uint64_t dim) {
  return rows * heads * parts * (dim + 2);
}

static inline KVS_HD uint32_t kvs__attn_parts(uint32_t max_seq_len) {
  return (max_seq_len + KVS__ATTN_PART - 1) / KVS__ATTN_PART;
}

/* Tuning knobs of the CUDA attention launch, for the benches: blocks per SM
 * the split aims at (0, the default: fill whole waves), and the largest
 * group of query heads one block takes (default 8). */
extern int kvs__cuda_attn_blocks_per_sm;
extern int kvs__cuda_attn_max_group;
/* 1 (default): GQA >= 4 over fp16/bf16 with q/out of the same dtype and
 * head_dim 64 or 128 runs on tensor cores; 0: always the CUDA-core kernel. */
extern int kvs__cuda_attn_mma;
/* 1: prefill runs the flash kernel (gpu/kernels_prefill.cuh) where it
 * applies (a 16-bit cache with q/out of the same dtype and head_dim 64, 128
 * or 256; an int8/fp8 cache with q/out fp16 or bf16 and head_dim 64 or
 * 128), the default since it passed tests/gpu/run.sh on an H100; 0 (also
 * KVS_CUDA_PREFILL_FLASH=0 when the kernels load): the kernels above. */
extern int kvs__cuda_prefill_flash;
/* 1 (default): the flash prefill kernel splits long prefixes over several
 * CTAs when its grid would not fill the GPU twice and the call has a
 * workspace; 0: never (for the bench to compare). */
extern int kvs__cuda_prefill_flash_split;
/* 1 (default): where the flash kernel runs a 16-bit cache at head_dim 128
 * on a GPU of compute capability 9.0 (H100, H200), it runs its
 * wgmma variant (kvs_prefill_flash_wg_*, the sm_90a image); 0: the mma.sync
 * kernel everywhere (for the tests and benches to compare; also
 * KVS_CUDA_PREFILL_WGMMA=0 when the kernels load). */
extern int kvs__cuda_prefill_wgmma;
/* N > 0: decode over an int8/fp8 cache (q/out fp16 or bf16, head_dim 64 or
 * 128, fewer than 65537 requests) with GQA groups of N query heads or more
 * runs on the flash prefill kernel, each request one new row; 0: always
 * the decode kernel.  Default 4: on an H100 that was 1.2-1.3x faster than
 * the decode kernel at groups of 4 and 3.6-4x at 8 (docs/benchmarks.md);
 * smaller groups were not measured.  KVS_CUDA_DECODE_FLASH=N when the
 * kernels load. */
extern int kvs__cuda_decode_flash;
/* 1 when the last CUDA attention call of this process ran the flash
 * prefill kernel, else 0; kvs__cuda_attn_last_wg 1 when that was its wgmma
 * variant (for the tests and benches). */
extern uint32_t kvs__cuda_attn_last_flash;
extern uint32_t kvs__cuda_attn_last_wg;
/* Partitions the last CUDA attention launch of this process split each row
 * into (1: not split), for the tests and benches to tell a split run from
 * one that was merely given a workspace. */
extern uint32_t kvs__cuda_attn_last_nsplit;
/* The C twins prefetch the next tile/block of keys/values: 0 no, 1 into L2,
 * 2 into L1, -1 (default) the body's own choice (kernels_cpu.c). */
extern int kvs__cpu_prefetch;
/* C attention: 0 (default) runs a vector body where the CPU has one (AVX-512F,
 * else AVX2+FMA+F16C: kvs__cpu_attn_simd() != 0), 1 forces the portable C
 * body. */
extern int kvs__cpu_attn_portable;
/* Non-zero when this CPU can run the AVX2+FMA+F16C attention body. */
int kvs__cpu_attn_simd(void);
/* C attention: 1 (default) runs the AVX-512F body where the CPU has it
 * (with AVX-512BW, which every AVX-512 Xeon has: kvs__cpu_attn_simd512()),
 * 0 keeps to the AVX2 one. */
extern int kvs__cpu_attn_avx512;
int kvs__cpu_attn_simd512(void);
/* The body the C attention runs now: "portable C", "AVX2+FMA+F16C" or
 * "AVX-512F" (static text). */
const char *kvs__cpu_attn_body(void);

/* The longest row kvs_quantize_row takes: the layout's largest head_dim. */
#define KVS__QROW_MAX 4096u

/*
 * The rotation of an int8 row (docs/kernels.md, "Quantized KV blocks"): the
 * row's n elements split into power-of-two segments, the largest first
 * (n = 96: 64 then 32); each segment of m elements multiplied by the
 * Sylvester Hadamard matrix H_m (H_1 = [1], H_2m = [[H_m, H_m], [H_m,
 * -H_m]]), computed as butterflies (a, b) -> (a + b, a - b) between the
 * elements i and i + h of every pair, for h = 1, 2, 4, ... m / 2 in that
 * order (every step one float32 addition or subtraction, so the CUDA write
 * kernel's bytes equal the C twin's).  H_m is symmetric and H_m H_m = m I:
 * the write kernel stores H_m x / m (kvs__hadamard(x, n, 1): the division
 * by a power of two is exact short of subnormals), and a reader gets x back
 * as H_m times what it read (kvs__hadamard(y, n, 0)); attention instead
 * multiplies q by H_m once and its output once.
 */
static inline KVS_HD uint32_t kvs__hadamard_seg(uint32_t n, uint32_t off) {
  uint32_t m = 1;
  while (m <= (n - off) / 2)
    m *= 2;
  return m;
}
void kvs__hadamard(float *x, uint32_t n, int down);

/* The open device's SM clock in kHz (the driver's "typical" clock) and its
 * compute capability: for the benches' peak TFLOP/s. */
int kvs__cuda_device_compute(int *sm_clock_khz, int *cc_major, int *cc_minor);

/* Validation shared by both backends (host-side fields only). */
int kvs__check_paged_kv(const kvs_paged_kv *kv);
int kvs__check_attn(const kvs_attn_args *a, int prefill);

#endif /* KVS_KERNELS_INT_H */
