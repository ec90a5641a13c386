/* The packed copy of a 4- or 8-bit MLX affine weight that the tensor-core kernels stream
 * (cuda_gemv_mma.cu, which makes it and owns its layout's description, and cuda_qgemm.cu), and
 * the register-level helpers both use: the copy's geometry, x's power-of-two scaling into F16,
 * and the dequantization of packed words into F16 pairs. Compiled as CUDA C by nvcc. */
#ifndef MLXCEL_BACKEND_CUDA_PACKED_H
#define MLXCEL_BACKEND_CUDA_PACKED_H

#include "backend/cuda/cuda_internal.h"

#include <type_traits>

/* Bytes of a packed sector of one m-tile: 16 rows x 32 bytes. */
#define GMMA_SECTOR_BYTES 512

/* 4-bit: 64 values a 32-byte sector, 16 a lane; 8-bit: 32 and 8. */
template <int BITS> __host__ __device__ constexpr int gmma_vps() {
    return 256 / BITS;
}
template <int BITS> __host__ __device__ constexpr int gmma_vpl() {
    return 64 / BITS;
}
/* uint4s of x fragments per lane, sector and n-tile. */
template <int BITS> __host__ __device__ constexpr int gmma_parts() {
    return gmma_vpl<BITS>() / 8;
}

/* A packed copy's geometry: m-tiles, sectors a row, groups a row; the codes come first. */
struct gmma_geom {
    int64_t tiles, sectors, groups;
};
static inline gmma_geom gmma_geometry(const be_linear *w) {
    return {(w->out + 15) / 16, w->in * w->bits / 256, w->in / w->group_size};
}
__host__ __device__ static inline int64_t gmma_code_bytes(int64_t tiles, int64_t sectors) {
    return tiles * sectors * GMMA_SECTOR_BYTES;
}

/* 2^e as a float, for -126 <= e <= 127. */
__device__ __forceinline__ float gmma_pow2(int e) {
    return __int_as_float((127 + e) << 23);
}

/* e for a row of x whose largest |x| has the bits m: 2^e puts it in [2^14, 2^15). e is at most
 * 126 (a row under 2^-111 keeps that scale) and at least -113 (floats are under 2^128), so 2^e
 * and 2^-e are floats and scaling by them is exact. */
__device__ __forceinline__ int gmma_exp(int m_bits) {
    const float m = __int_as_float(m_bits);
    int E = 0;
    frexpf(m, &E);
    const int e = m > 0.0f && isfinite(m) ? 15 - E : 0;
    return e < 126 ? e : 126;
}

/* A weight load that bypasses L1: each byte is read once. */
__device__ __forceinline__ uint4 gmma_ld_nc(const uint8_t *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* A row's (scale, bias) of one group as the packed copy holds it: one register for 16-bit
 * dtypes, two for F32. */
template <typename S>
using gmma_sb_t = typename std::conditional<sizeof(S) == 4, float2, uint32_t>::type;

template <typename S> __device__ __forceinline__ float2 gmma_sb(gmma_sb_t<S> raw) {
    if constexpr (std::is_same<S, float>::value) {
        return raw;
    } else if constexpr (std::is_same<S, __half>::value) {
        return __half22float2(*(const __half2 *)&raw);
    } else {
        return __bfloat1622float2(*(const __nv_bfloat162 *)&raw);
    }
}

__device__ __forceinline__ uint32_t gmma_hsub(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

__device__ __forceinline__ uint32_t gmma_hfma(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

/* The 8 4-bit values of w as F16 pairs (q0, q4), (q1, q5), (q2, q6), (q3, q7). */
__device__ __forceinline__ void gmma_dq4(uint32_t w, uint32_t *h) {
    const uint32_t magic = 0x64006400u, w8 = w >> 8;
    h[0] = gmma_hsub((w & 0x000F000Fu) | magic, magic);
    h[1] = gmma_hfma((w & 0x00F000F0u) | magic, 0x2C002C00u /* 1/16 */, 0xD400D400u /* -64 */);
    h[2] = gmma_hsub((w8 & 0x000F000Fu) | magic, magic);
    h[3] = gmma_hfma((w8 & 0x00F000F0u) | magic, 0x2C002C00u, 0xD400D400u);
}

/* The 4 8-bit values of w as F16 pairs (q0, q2), (q1, q3). */
__device__ __forceinline__ void gmma_dq8(uint32_t w, uint32_t *h) {
    const uint32_t magic = 0x64006400u;
    h[0] = gmma_hsub((w & 0x00FF00FFu) | magic, magic);
    h[1] = gmma_hsub(((w >> 8) & 0x00FF00FFu) | magic, magic);
}

/* Word wd (0 or 1) of a lane's 16 bytes of a packed sector, for row g (h0) and row g + 8
 * (h1), as the F16 pairs of gmma_dq4 (4 a row) or gmma_dq8 (2 a row). */
template <int BITS>
__device__ __forceinline__ void gmma_dq_rows(const uint4 &w, int wd, uint32_t *h0, uint32_t *h1) {
    const uint32_t w0 = wd ? w.y : w.x, w1 = wd ? w.w : w.z;
    if (BITS == 4) {
        gmma_dq4(w0, h0);
        gmma_dq4(w1, h1);
    } else {
        gmma_dq8(w0, h0);
        gmma_dq8(w1, h1);
    }
}

/* The fields both kernels' jobs share, from cuda_gemv1's arguments: the matrices, their packed
 * copies and m-tiles, the geometry of their (one) weight shape, x's rows and what fz folds in.
 * Returns the output rows the job walks (cuda_gemv_mats'), 0 for nothing to do. */
template <typename J>
static inline int64_t gmma_job_init(J *job, const be_tensor *x, const be_linear *const *ws,
                                    be_tensor *const *ys, int n, bool glu,
                                    const cuda_gemv_fuse *fz) {
    const be_linear *w = ws[0];
    if (fz) job->fz = *fz;
    job->in = w->in;
    job->groups = w->in / w->group_size;
    job->gshift = w->group_size == 32 ? 5 : (w->group_size == 64 ? 6 : 7);
    job->sectors = w->in * w->bits / 256;
    job->nx = (int)x->rows;
    job->rows = cuda_gemv_mats(job->m, ws, ys, n, glu);
    for (int i = 0; i < n; i++) {
        job->pk[i] = (const uint8_t *)ws[i]->packed;
        job->mt[i] = gmma_geometry(ws[i]).tiles;
        job->tiles += job->mt[i];
    }
    return job->nx > 0 ? job->rows : 0;
}

/* m-tile `tile` of a job of up to three matrices (j.mt[i] m-tiles each, in turn; with GLU gate
 * and up alternating): its matrix, and its tile there in *lt. */
template <bool GLU, typename J>
__device__ __forceinline__ int gmma_tile(const J &j, int64_t tile, int64_t *lt) {
    if (GLU) {
        *lt = tile >> 1;
        return (int)(tile & 1);
    }
    if (tile < j.mt[0]) {
        *lt = tile;
        return 0;
    }
    if (tile < j.mt[0] + j.mt[1]) {
        *lt = tile - j.mt[0];
        return 1;
    }
    *lt = tile - j.mt[0] - j.mt[1];
    return 2;
}

#endif
