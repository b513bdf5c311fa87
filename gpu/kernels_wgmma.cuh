/*
 * kernels_wgmma.cuh — the warpgroup MMAs of the sm_90a flash prefill variant
 * (kernels_prefill.cuh, WG): wgmma.mma_async with A (16 rows of the
 * warpgroup's 64 per warp, mma.m16n8k16's A fragment) in registers and B
 * read from shared memory through a descriptor (kvs_prefill_sched.h), f32
 * accumulators laid out as N / 8 mma.m16n8 accumulator tiles per warp
 * (d[n][0..3]), so the rest of the kernel reads them as it reads the mma.sync
 * ones.  Compiled where __CUDA_ARCH_FEAT_SM90_ALL is defined (the sm_90a
 * image); elsewhere the same names trap, and are never reached:
 * kvs_prefill_flash_wg_* runs the mma.sync body on any other image.
 *
 * The instructions are asynchronous: a batch is wg_hold() on the
 * accumulators (so that the compiler sinks no write of them past the
 * fence: the PTX ISA leaves a register access between the fence and the
 * MMAs undefined), wg_arrive() (wgmma.fence), the MMAs, wg_commit_wait()
 * (waits for all of them); wg_hold() again ties each accumulator register
 * to the wait, so that the compiler moves no read of them above it.  The
 * operand lists are written out (one "+f" per accumulator: 32 for N = 64,
 * 64 for N = 128).
 */
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KVS_WGMMA 1
__device__ __forceinline__ void wg_arrive() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_commit_wait() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
/* Shared memory written by the generic proxy (cp.async, st.shared) made
 * visible to the tensor cores' reads (the async proxy). */
__device__ __forceinline__ void wg_proxy_fence() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
template <int NT> __device__ __forceinline__ void wg_hold(float (*d)[4]) {
#pragma unroll
  for (int n = 0; n < NT; n++)
#pragma unroll
    for (int e = 0; e < 4; e++)
      asm volatile("" : "+f"(d[n][e])::"memory");
}

/* The accumulators: "+f" operands 0 .. N/2 - 1 (N = 64: 32; N = 128: 64). */
#define KVS_WG_D32(d) \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), \
  "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), \
  "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), \
  "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), \
  "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), \
  "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), \
  "+f"(d[7][2]), "+f"(d[7][3])
#define KVS_WG_D64(d) \
  KVS_WG_D32(d), \
  "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), \
  "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), \
  "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), \
  "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), \
  "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), \
  "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), \
  "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), \
  "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
#define KVS_WG_R32 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29," \
  "%30, %31}"
#define KVS_WG_R64 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15," \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29," \
  "%30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43," \
  "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57," \
  "%58, %59, %60, %61, %62, %63}"
/* One MMA: accumulators (REGS, OPS), then A's four registers, B's
 * descriptor and the scale-d predicate's source at operands A0 .. A0 + 5
 * (their numbers as strings); imm-scale-a/b 1, imm-tnsp-b TB. */
#define KVS_WG_SPEC(T, TY, N, TB, REGS, OPS, A0, A1, A2, A3, DS, ONE)          \
  template <> struct Wg<T, N, TB> {                                             \
    static __device__ __forceinline__ void run(float (*d)[4], const uint32_t *a, \
                                               uint64_t desc) {                 \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" ONE ", 0;\n"            \
                   "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY   \
                   " " REGS ", {%" A0 ", %" A1 ", %" A2 ", %" A3 "}, %" DS     \
                   ", p, 1, 1, " #TB ";\n}\n"                                    \
                   : OPS(d)                                                     \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1)); \
    }                                                                           \
  };
template <typename T, int N, int TNSP_B> struct Wg;
KVS_WG_SPEC(__half, "f16", 64, 0, KVS_WG_R32, KVS_WG_D32, "32", "33", "34", "35", "36", "37")
KVS_WG_SPEC(__half, "f16", 128, 1, KVS_WG_R64, KVS_WG_D64, "64", "65", "66", "67", "68", "69")
KVS_WG_SPEC(__nv_bfloat16, "bf16", 64, 0, KVS_WG_R32, KVS_WG_D32, "32", "33", "34", "35", "36",
            "37")
KVS_WG_SPEC(__nv_bfloat16, "bf16", 128, 1, KVS_WG_R64, KVS_WG_D64, "64", "65", "66", "67", "68",
            "69")
#else /* not the sm_90a image: never called (the kernels trap first) */
#define KVS_WGMMA 0
__device__ __forceinline__ void wg_arrive() {}
__device__ __forceinline__ void wg_commit_wait() {}
__device__ __forceinline__ void wg_proxy_fence() {}
template <int NT> __device__ __forceinline__ void wg_hold(float (*)[4]) {}
template <typename T, int N, int TNSP_B> struct Wg {
  static __device__ __forceinline__ void run(float (*)[4], const uint32_t *, uint64_t) {
    __trap();
  }
};
#endif
