/* Tensor-core and asynchronous-copy primitives shared by the attention kernels (decode in
 * cuda_attention.cu, prefill in cuda_attention_prefill.cu) and the quantized GEMM
 * (cuda_qgemm.cu): PTX the CUDA headers do not wrap. Compiled as CUDA C by nvcc. */
#ifndef MLXCEL_BACKEND_CUDA_MMA_H
#define MLXCEL_BACKEND_CUDA_MMA_H

#include "backend/cuda/cuda_internal.h"

#include <string.h>

__device__ __forceinline__ unsigned cuda_smem_addr(const void *p) {
    return (unsigned)__cvta_generic_to_shared(p);
}

/* 16 bytes global -> shared, bypassing L1. */
__device__ __forceinline__ void cuda_cp_async16(void *smem, const void *gmem) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(cuda_smem_addr(smem)),
                 "l"(gmem));
}

/* Copies 16 bytes, or writes 16 zero bytes when !full (nothing is read then). */
__device__ __forceinline__ void cuda_cp_async16_zfill(void *smem, const void *gmem, bool full) {
    int n = full ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(cuda_smem_addr(smem)),
                 "l"(gmem), "r"(n));
}

__device__ __forceinline__ void cuda_cp_async_commit(void) {
    asm volatile("cp.async.commit_group;\n" ::);
}

/* Waits until at most N of this thread's copy groups are pending. */
template <int N> __device__ __forceinline__ void cuda_cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* Four 8x8 b16 matrices from shared memory, as mma A or B fragments; _trans transposes. */
__device__ __forceinline__ void cuda_ldmatrix_x4(uint32_t *r, const void *smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(cuda_smem_addr(smem))
                 : "memory");
}
__device__ __forceinline__ void cuda_ldmatrix_x4_trans(uint32_t *r, const void *smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(cuda_smem_addr(smem))
                 : "memory");
}

/* c += a b for one m16n8k16 tile in F32; a: the 4 registers of the A fragment, b0 b1: B's. */
template <typename KT>
__device__ __forceinline__ void cuda_mma16816(float *c, const uint32_t *a, uint32_t b0,
                                              uint32_t b1);
template <>
__device__ __forceinline__ void cuda_mma16816<__half>(float *c, const uint32_t *a, uint32_t b0,
                                                      uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void cuda_mma16816<__nv_bfloat16>(float *c, const uint32_t *a,
                                                             uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Two floats rounded to KT (f16 or bf16), packed low first as one operand register. */
template <typename KT> __device__ __forceinline__ uint32_t cuda_pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t cuda_pack2<__half>(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    uint32_t w;
    memcpy(&w, &h, sizeof w);
    return w;
}
template <> __device__ __forceinline__ uint32_t cuda_pack2<__nv_bfloat16>(float lo, float hi) {
    __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);
    uint32_t w;
    memcpy(&w, &b, sizeof w);
    return w;
}

/* The two KT values packed in w (low first), as floats: cuda_pack2's inverse. */
template <typename KT> __device__ __forceinline__ float2 cuda_unpack2(uint32_t w);
template <> __device__ __forceinline__ float2 cuda_unpack2<__half>(uint32_t w) {
    __half2 h;
    memcpy(&h, &w, sizeof h);
    return __half22float2(h);
}
template <> __device__ __forceinline__ float2 cuda_unpack2<__nv_bfloat16>(uint32_t w) {
    __nv_bfloat162 b;
    memcpy(&b, &w, sizeof b);
    return __bfloat1622float2(b);
}

/* Warpgroup MMA (sm_90a: compiled where __CUDA_ARCH_FEAT_SM90_ALL is defined). A warpgroup's
 * four warps issue each of these together. */
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define CUDA_HAVE_WGMMA 1

/* Orders this thread's register writes (A fragments, accumulators) before the wgmmas after it. */
__device__ __forceinline__ void cuda_wgmma_fence(void) {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cuda_wgmma_commit(void) {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
/* Waits until at most N of this warpgroup's wgmma groups are pending. */
template <int N> __device__ __forceinline__ void cuda_wgmma_wait(void) {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* Makes this thread's shared-memory writes of the generic proxy (stores, cp.async) visible to
 * the async proxy that wgmma reads its shared operands through. */
__device__ __forceinline__ void cuda_fence_proxy_async(void) {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
/* Keeps the compiler from moving reads or writes of an accumulator across the asynchronous
 * wgmmas that write it. */
__device__ __forceinline__ void cuda_wgmma_hold(float &r) {
    asm volatile("" : "+f"(r)::"memory");
}

/* The shared-memory descriptor of a K-major operand without swizzling: core matrices of 8 rows
 * of 16 bytes (128 contiguous bytes), `kstride` bytes apart along K (the leading dimension
 * offset) and `nstride` bytes apart along M or N (the stride dimension offset). */
__device__ __forceinline__ uint64_t cuda_wgmma_desc(const void *smem, unsigned kstride,
                                                    unsigned nstride) {
    return (uint64_t)((cuda_smem_addr(smem) & 0x3FFFF) >> 4) | (uint64_t)(kstride >> 4) << 16 |
           (uint64_t)(nstride >> 4) << 32;
}

/* d (64 x 64, F32, the mma.m16n8k16 C layout of 8 n-tiles in each warp's 16 rows) += A B: A the
 * warp's 16 rows x 16 of F16 in registers (the mma.m16n8k16 A layout), B 16 x 64 of F16 in
 * shared memory, K-major (desc). */
__device__ __forceinline__ void cuda_wgmma_m64n64k16(float *d, const uint32_t *a, uint64_t desc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "
                 "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, "
                 "%33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                   "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
                   "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
                   "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}
#endif

#endif
