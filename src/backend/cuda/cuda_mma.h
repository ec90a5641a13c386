/* Tensor-core and asynchronous-copy primitives shared by the attention kernels (decode in
 * cuda_attention.cu, prefill in cuda_attention_prefill.cu): PTX the CUDA headers do not wrap.
 * Compiled as CUDA C by nvcc. */
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

#endif
