/* The decode GEMV on the tensor cores: y = x W^T for 1 to 32 F32 rows of x against 4- or 8-bit
 * MLX affine weights, every row of x served by ONE pass over W (the single-row GEMV of
 * cuda_gemv.cu holds x in registers and serves one or two rows a pass). 4-bit groups of 32
 * take 16 rows a pass.
 *
 * Precision. A quantized value q is exact in F16, and a word of packed values becomes F16
 * pairs without conversions: (w & 0x000F000F) | 0x64006400 is the half2 (1024 + q0, 1024 + q4),
 * one packed subtraction leaves (q0, q4); the nibbles at bits 4..7 come out as 1024 + 16 q and
 * one packed FMA by (1/16, -64) leaves q. 8-bit bytes take the same path (1024 + q, q < 256).
 * Up to 16 rows x is split into two F16 terms, hi = f16(x') and lo = f16(x' - hi), of
 * x' = x 2^e, where the power of two e puts the largest |x'| of a row of x over one CTA's
 * k-range in [2^14, 2^15): no term overflows whatever the row's range, and hi + lo carries 22
 * bits of each value, with an absolute floor of 2^-25 (F16's subnormals) against a largest
 * value of 2^14. Past 16 rows x' is hi alone (relative 2^-11, the same floor): half the mmas
 * and fragments, and still finer than the BF16 (2^-9) of the GEMM path. Products of q and a
 * term are exact and the tensor core sums them in F32. The affine form is folded per group:
 * y = sum_g s_g dot(q_g, x'_g) + b_g sum(x'_g), with sum(x'_g) computed once from the
 * unrounded x', and each partial sum is scaled back by 2^-e before the k-ranges meet. This
 * needs every mma's k-range inside one group.
 *
 * Layout. An m16n8k16 mma takes W as A (16 output rows) and x as B (8 columns, the rows of x).
 * Within an mma the k order is free as long as A and B agree: the quad of lane g (lanes 4g to
 * 4g + 3, t = lane % 4) reads one 32-byte sector of rows g and g + 8 of the tile, lane t the
 * 8 bytes at 8t (16 4-bit or 8 8-bit values, two words), and each word feeds two mmas (4-bit)
 * or one (8-bit). A sector is 64 4-bit values: one group of 64, half of one of 128, two of 32.
 * With groups of 32 the quad's lanes 0-1 hold one group and lanes 2-3 the next, so the columns
 * of an n-tile are split in two classes: column 2j takes row j of x against the first group
 * only (zeros in lanes 2-3 of B), column 2j + 1 against the second; an n-tile then serves 4
 * rows of x instead of 8.
 *
 * Work split. A CTA owns a k-range of the rows and an m-block of tiles. It first converts its
 * k-range of x into B fragments in shared memory (the order of the values in a register
 * follows the pairs of the weight word: values j and j + 4 of a 4-bit word, j and j + 2 of an
 * 8-bit one), with the sums of each column and one e per row of x. Then each warp streams its
 * own 32 rows (16 when x takes two n-tiles or more) across the whole k-range: per sector an
 * 8-byte load per row and lane, the next sector's loads in flight while this one computes,
 * the rows' next lines prefetched into L2, and no barrier. The CTAs of one m-block (one per
 * k-range, as many as it takes to fill the device) write partial sums to scratch; the last of
 * them to finish (a counter per m-block) adds them in k order, deterministically, and writes
 * y with the bias, the GLU of gate/up (act(gate) * up, act from fz), and the output dtype.
 *
 * Fused forms (cuda_gemv_fuse). An RMSNorm before the product needs each row's whole sum of
 * squares, while a CTA sees one k-range: so the CTA multiplies x by the norm's weight as it
 * makes the fragments and leaves the sum of squares of its k-range beside its partials; the
 * last CTA adds those in k order and scales each row's sums by its 1/rms (a factor per row of
 * x commutes with the product). The residual add reads y in that last CTA's store.
 *
 * Measured (H200, bench/bench_cuda_gemv.cu, 4-bit group 64, BF16 scales, copy 4243 GB/s;
 * us for 1 / 4 / 8 / 16 rows, the one-row kernel's in brackets): q+k+v 17.6 / 21.7 / 27.1 /
 * 37.7 (13.2 / 33.0 / 72.8 / 137.8), gate+up 62.7 / 66.0 / 70.0 / 86.5 (40.5 / 102.6 / 205.6 /
 * 413.4), down 31.3 / 35.2 / 39.4 / 61.5 (27.4 / 104.9 / 209.2 / 416.1), lm_head 232.8 / 254.5
 * / 285.0 / 431.8 (163.5 / 381.9 / 762.1 / 1522.5). lm_head at one row reads 1269 GB/s, 30% of
 * copy (ncu: L2 throughput 81%, DRAM 40%, 9.5 cycles per issued instruction, 128 registers).
 * 8 rows cost 1.2 to 1.5 times one row; at one row this kernel is slower than the one-row
 * kernel (its ~2.3 instructions per weight, a third of them the dequantization, against that
 * kernel's 3 per weight and row), so cuda_gemv1 keeps 1 and 2 rows. A first version that met
 * the warps of a CTA in shared memory after every 2 m-tiles was latency-bound at 10-17% of
 * copy; streaming each warp's rows without barriers doubled that. Past 16 rows (H200, decode
 * of the 8B model after 512 tokens, tok/s): 32 rows in one pass 2707 against 1915 in two of
 * 16; 64 rows in one pass of 8 n-tiles 2161 against 2979 on the GEMM path (its decode layer
 * 793 us, 3.7% of copy, the staging of x, the partial sums and the last CTA's reduction
 * growing with the rows), so a pass stops at 4 n-tiles and 64 rows take cuBLAS. */
#include "backend/cuda/cuda_mma.h"

#include <type_traits>

/* Warps per CTA. */
#define GMMA_WARPS 8
/* Most rows of x one launch serves: 4 n-tiles of 8 (cuda_gemv1 slices more). */
#define GMMA_MAX_NX 32
/* Most m-blocks a launch may have. Their counters sit first in the scratch at a fixed size, so
 * a launch never finds another launch's partial sums where it expects a counter at zero. */
#define GMMA_MAX_MBLOCKS 4096
/* 128-byte lines of each of its rows a warp has prefetched into L2 ahead of its loads. */
#define GMMA_L2_AHEAD 3

/* 4-bit: 64 values a 32-byte sector, 16 a lane; 8-bit: 32 and 8. */
template <int BITS> __host__ __device__ constexpr int gmma_vps() {
    return 256 / BITS;
}
template <int BITS> __host__ __device__ constexpr int gmma_vpl() {
    return 64 / BITS;
}
/* Whether x takes its lo term: up to 16 rows (NT n-tiles of 8 / C rows). Past them one F16
 * term (relative 2^-11) is still finer than the GEMM path's BF16 (2^-9) and halves the mmas
 * and the fragments. */
template <int C, int NT> __host__ __device__ constexpr bool gmma_lo() {
    return NT * (8 / C) <= 16;
}
/* uint4s of x fragments per lane, sector and n-tile: the hi words, then the lo words if any. */
template <int BITS, int C, int NT> __host__ __device__ constexpr int gmma_parts() {
    return gmma_vpl<BITS>() / (gmma_lo<C, NT>() ? 4 : 8);
}
/* Shared memory a CTA may give its x fragments: two CTAs fit on an SM. Past 16 rows the
 * fragments of a sector grow, and the k-ranges take the most two CTAs can share (fewer
 * k-ranges: fewer partial sums to write and add). */
template <int C, int NT> __host__ __device__ constexpr int gmma_smem_cap() {
    return gmma_lo<C, NT>() ? 64 << 10 : 110 << 10;
}
/* m-tiles a warp computes together, sharing each read of the x fragments: one when several
 * n-tiles of fragments already fill the registers. */
template <int NT> __host__ __device__ constexpr int gmma_mb() {
    return NT == 1 ? 2 : 1;
}

struct gmma_job {
    cuda_gemv_mat m[3];
    base_dtype sdt;    /* scales and biases */
    int64_t in;        /* values per row of W and x */
    int64_t row_bytes; /* in * bits / 8 */
    int64_t groups;    /* groups per row */
    int gsize;         /* values per group */
    int gshift;        /* log2(gsize) */
    int64_t sectors;   /* 32-byte sectors per row */
    int64_t rows;      /* PLAIN: the outs summed; GLU: out */
    int64_t tiles;     /* m-tiles: PLAIN ceil(rows / 16); GLU 2 ceil(out / 16), gate and up
                        * alternating */
    int64_t tpb;       /* m-tiles per m-block (even) */
    int nx;            /* rows of x */
    int ksplit;        /* k-ranges (CTAs per m-block) */
    int spc;           /* sectors per k-range */
    const float *x;    /* (nx, in) */
    float *part;       /* (ksplit, nx, tiles * 16) partial sums */
    float *ssq;        /* (m-blocks, ksplit, GMMA_MAX_NX) with a norm: x's sums of squares
                        * per k-range */
    unsigned *count;   /* (m-blocks) CTAs done, reset to 0 by the last */
    cuda_gemv_fuse fz;
};

/* The scratch: the m-block counters, then the partial sums. */
static size_t gmma_part_offset(void) {
    return (GMMA_MAX_MBLOCKS * sizeof(unsigned) + 255) & ~(size_t)255;
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

__device__ __forceinline__ uint2 gmma_ld_nc(const uint8_t *p) {
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];"
                 : "=r"(v.x), "=r"(v.y)
                 : "l"(p));
    return v;
}

template <typename S> __device__ __forceinline__ float gmma_scale(const void *p, int64_t i) {
    if (std::is_same<S, __nv_bfloat16>::value)
        return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    if (std::is_same<S, __half>::value) return __half2float(((const __half *)p)[i]);
    return ((const float *)p)[i];
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

/* Output row `i` of m-tile `tile`: its matrix (-1 past the end) and its row there. */
template <bool GLU>
__device__ __forceinline__ int gmma_row(const gmma_job &j, int64_t tile, int i, int64_t *row) {
    if (GLU) {
        *row = (tile >> 1) * 16 + i;
        return *row < j.rows ? (int)(tile & 1) : -1;
    }
    const int64_t g = tile * 16 + i, e0 = j.m[0].out, e1 = e0 + j.m[1].out;
    if (g >= j.rows) return -1;
    *row = g < e0 ? g : (g < e1 ? g - e0 : g - e1);
    return g < e0 ? 0 : (g < e1 ? 1 : 2);
}

/* Partials of the rows of x against the CTA's k-range for its m-block's tiles; the last CTA of
 * the m-block reduces them into y. C: groups per sector (2 for 4-bit groups of 32), NT: n-tiles
 * of 8 / C rows of x. */
template <int BITS, int C, int NT, bool GLU, typename S>
__global__ void __launch_bounds__(GMMA_WARPS * 32, 2) gmma_kernel(const gmma_job job) {
    constexpr int VPS = gmma_vps<BITS>(), VPL = gmma_vpl<BITS>(), XU = VPL / 2;
    constexpr int PARTS = gmma_parts<BITS, C, NT>(), XR = 8 / C, Q = 4 / C, MB = gmma_mb<NT>();
    constexpr bool LO = gmma_lo<C, NT>();
    constexpr int HP = LO ? PARTS / 2 : PARTS; /* uint4s of hi words */
    constexpr int WV = 32 / BITS;              /* values per word */
    extern __shared__ uint4 gmma_smem[];
    __shared__ int cmax[GMMA_MAX_NX];
    __shared__ bool last;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int ks = blockIdx.x;
    const int64_t mb = blockIdx.y;
    const int64_t s_first = (int64_t)ks * job.spc;
    const int ns = (int)(job.sectors - s_first < job.spc ? job.sectors - s_first : job.spc);
    const int64_t k0 = s_first * VPS;
    /* Fragments (spc, NT, PARTS, 32 lanes), then the sums of each B column (spc, NT, 8). */
    uint4 *frag = gmma_smem;
    float *csum = (float *)(frag + (size_t)job.spc * NT * PARTS * 32);

    /* A norm scales each row of x by its weight here and by the row's 1/rms in the final sum:
     * a CTA sees only its k-range, so it leaves the sum of squares over it for the last CTA.
     * Then, with x' the values multiplied, the largest |x'| of each row over the k-range (as
     * bits: they order as the floats). One warp a row: both reductions in a fixed order. */
    const int kq = ns * VPS / 4;
    for (int xr = warp; xr < job.nx; xr += GMMA_WARPS) {
        const float4 *src = (const float4 *)(job.x + xr * job.in + k0);
        float m = 0.0f, ss = 0.0f;
        for (int u = lane; u < kq; u += 32) {
            float4 f = __ldg(src + u);
            if (job.fz.norm) {
                ss += f.x * f.x + f.y * f.y + f.z * f.z + f.w * f.w;
                float w4[4];
                cuda_load_ro<4>(job.fz.norm, job.fz.norm_dt, (size_t)(k0 + 4 * u), w4);
                f.x *= w4[0], f.y *= w4[1], f.z *= w4[2], f.w *= w4[3];
            }
            m = fmaxf(m, fmaxf(fmaxf(fabsf(f.x), fabsf(f.y)), fmaxf(fabsf(f.z), fabsf(f.w))));
        }
        for (int o = 16; o > 0; o >>= 1) {
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
            ss += __shfl_xor_sync(0xffffffffu, ss, o);
        }
        if (lane == 0) {
            cmax[xr] = __float_as_int(m);
            if (job.fz.norm) job.ssq[(mb * job.ksplit + ks) * GMMA_MAX_NX + xr] = ss;
        }
    }
    __syncthreads();
    /* Each lane's B fragments of every sector, as the warp's lane ln will read them, and the
     * column sums: the quad of a column is 4 consecutive lanes of one warp here too. */
    for (int u = tid; u < ns * NT * 32; u += blockDim.x) {
        const int ln = u & 31, nt = (u >> 5) % NT, sl = (u >> 5) / NT;
        const int lg = ln >> 2, lt = ln & 3, xr = nt * XR + lg / C;
        const bool on = xr < job.nx && lg % C == lt * C / 4;
        const float sc = on ? gmma_pow2(gmma_exp(cmax[xr])) : 0.0f;
        const float4 *src =
            (const float4 *)(job.x + (on ? xr : 0) * job.in + k0 + sl * VPS + lt * VPL);
        float xv[VPL], sum = 0.0f;
#pragma unroll
        for (int v = 0; v < VPL / 4; v++) {
            const float4 f = on ? __ldg(src + v) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            float w4[4] = {1.0f, 1.0f, 1.0f, 1.0f};
            if (on && job.fz.norm)
                cuda_load_ro<4>(job.fz.norm, job.fz.norm_dt,
                                (size_t)(k0 + sl * VPS + lt * VPL + 4 * v), w4);
            xv[4 * v] = f.x * w4[0] * sc, xv[4 * v + 1] = f.y * w4[1] * sc,
                   xv[4 * v + 2] = f.z * w4[2] * sc, xv[4 * v + 3] = f.w * w4[3] * sc;
        }
        uint32_t hw[XU], lw[XU];
        /* Word wd's values j and j + WV / 2 make one register, low first. */
#pragma unroll
        for (int wd = 0; wd < 2; wd++)
#pragma unroll
            for (int p = 0; p < WV / 2; p++) {
                const float a = xv[wd * WV + p], b = xv[wd * WV + p + WV / 2];
                sum += a + b;
                const __half2 h = __floats2half2_rn(a, b);
                hw[wd * WV / 2 + p] = *(const uint32_t *)&h;
                if (LO) {
                    const float2 hf = __half22float2(h);
                    const __half2 l = __floats2half2_rn(a - hf.x, b - hf.y);
                    lw[wd * WV / 2 + p] = *(const uint32_t *)&l;
                }
            }
        uint4 *dst = frag + (size_t)(sl * NT + nt) * PARTS * 32 + ln;
#pragma unroll
        for (int p = 0; p < HP; p++) {
            dst[p * 32] = make_uint4(hw[4 * p], hw[4 * p + 1], hw[4 * p + 2], hw[4 * p + 3]);
            if (LO)
                dst[(p + HP) * 32] =
                    make_uint4(lw[4 * p], lw[4 * p + 1], lw[4 * p + 2], lw[4 * p + 3]);
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        if (lt == 0) csum[(sl * NT + nt) * 8 + lg] = sum;
    }
    __syncthreads();

    /* 2^-e of the lane's accumulator columns 2t and 2t + 1. */
    float unscale[NT][2];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const int xr = C == 1 ? nt * 8 + 2 * t + c : nt * 4 + t;
            unscale[nt][c] = xr < job.nx ? gmma_pow2(-gmma_exp(cmax[xr])) : 0.0f;
        }

    const int64_t vrows = job.tiles * 16;
    const int64_t t_begin = mb * job.tpb;
    const int64_t t_end = t_begin + job.tpb < job.tiles ? t_begin + job.tpb : job.tiles;
    /* The weights, scales and biases of one sector: MB m-tiles, rows g and g + 8. */
    struct sector_regs {
        uint2 w[MB][2];
        float s[MB][2][C], b[MB][2][C];
    };
    for (int64_t tile0 = t_begin + warp * MB; tile0 < t_end; tile0 += GMMA_WARPS * MB) {
        const uint8_t *wp[MB][2];
        const S *sp[MB][2], *bp[MB][2]; /* the row's scales and biases */
        bool ok[MB][2];
#pragma unroll
        for (int mt = 0; mt < MB; mt++)
#pragma unroll
            for (int rh = 0; rh < 2; rh++) {
                int64_t row = 0;
                const int mi =
                    tile0 + mt < t_end ? gmma_row<GLU>(job, tile0 + mt, g + 8 * rh, &row) : -1;
                const int m = mi < 0 ? 0 : mi;
                ok[mt][rh] = mi >= 0;
                wp[mt][rh] = (const uint8_t *)cuda_gemv_pick(job, m, &cuda_gemv_mat::w) +
                             row * job.row_bytes + s_first * 32 + t * 8;
                sp[mt][rh] =
                    (const S *)cuda_gemv_pick(job, m, &cuda_gemv_mat::s) + row * job.groups;
                bp[mt][rh] =
                    (const S *)cuda_gemv_pick(job, m, &cuda_gemv_mat::b) + row * job.groups;
            }
        /* Lane l prefetches row l of the warp's tiles into L2: its scales and biases over the
         * k-range now, its weights GMMA_L2_AHEAD lines ahead of the loads. */
        const char *pf = NULL;
        {
            const int r = lane % (MB * 16);
            int64_t row = 0;
            const int mi =
                tile0 + r / 16 < t_end ? gmma_row<GLU>(job, tile0 + r / 16, r % 16, &row) : -1;
            if (mi >= 0) {
                pf = (const char *)cuda_gemv_pick(job, mi, &cuda_gemv_mat::w) +
                     row * job.row_bytes + s_first * 32;
                const int64_t ga = row * job.groups + (k0 >> job.gshift);
                const int64_t gb = row * job.groups + ((k0 + ns * VPS - 1) >> job.gshift);
                const char *sa = (const char *)cuda_gemv_pick(job, mi, &cuda_gemv_mat::s);
                const char *ba = (const char *)cuda_gemv_pick(job, mi, &cuda_gemv_mat::b);
                for (int64_t o = ga * (int64_t)sizeof(S); o <= gb * (int64_t)sizeof(S); o += 128) {
                    asm volatile("prefetch.global.L2 [%0];" ::"l"(sa + o));
                    asm volatile("prefetch.global.L2 [%0];" ::"l"(ba + o));
                }
                for (int d = 0; d < GMMA_L2_AHEAD && d * 128 < ns * 32; d++)
                    asm volatile("prefetch.global.L2 [%0];" ::"l"(pf + d * 128));
            }
        }

        auto load = [&](int sl, sector_regs &st) {
            int gi[C];
#pragma unroll
            for (int c = 0; c < C; c++)
                gi[c] = ((int)(s_first + sl) * VPS + c * (VPS / C)) >> job.gshift;
#pragma unroll
            for (int mt = 0; mt < MB; mt++)
#pragma unroll
                for (int rh = 0; rh < 2; rh++) {
                    const bool on = ok[mt][rh];
                    st.w[mt][rh] = on ? gmma_ld_nc(wp[mt][rh] + sl * 32) : make_uint2(0, 0);
#pragma unroll
                    for (int c = 0; c < C; c++) {
                        st.s[mt][rh][c] = on ? gmma_scale<S>(sp[mt][rh], gi[c]) : 0.0f;
                        st.b[mt][rh][c] = on ? gmma_scale<S>(bp[mt][rh], gi[c]) : 0.0f;
                    }
                }
        };
        float acc[MB][NT][4];
#pragma unroll
        for (int mt = 0; mt < MB; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) acc[mt][nt][i] = 0.0f;
        auto compute = [&](int sl, const sector_regs &st) {
            /* A new line of every row: ask for the one GMMA_L2_AHEAD lines on. */
            if (pf && (sl & 3) == 0 && (sl + 4 * GMMA_L2_AHEAD) < ns)
                asm volatile("prefetch.global.L2 [%0];" ::"l"(pf + sl * 32 + GMMA_L2_AHEAD * 128));
            uint32_t xh[NT][XU], xl[NT][XU];
            float xs[NT][2];
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const uint4 *src = frag + (size_t)(sl * NT + nt) * PARTS * 32 + lane;
#pragma unroll
                for (int p = 0; p < HP; p++) {
                    const uint4 h = src[p * 32];
                    xh[nt][4 * p] = h.x, xh[nt][4 * p + 1] = h.y, xh[nt][4 * p + 2] = h.z,
                               xh[nt][4 * p + 3] = h.w;
                    if (LO) {
                        const uint4 l = src[(p + HP) * 32];
                        xl[nt][4 * p] = l.x, xl[nt][4 * p + 1] = l.y, xl[nt][4 * p + 2] = l.z,
                                   xl[nt][4 * p + 3] = l.w;
                    }
                }
                const float2 cs = *(const float2 *)&csum[(sl * NT + nt) * 8 + 2 * t];
                xs[nt][0] = cs.x, xs[nt][1] = cs.y;
            }
#pragma unroll
            for (int mt = 0; mt < MB; mt++) {
                /* The hi and lo terms in two accumulators: two shorter chains of mmas. */
                float ch[NT][4], cl[NT][4];
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int i = 0; i < 4; i++) ch[nt][i] = cl[nt][i] = 0.0f;
#pragma unroll
                for (int wd = 0; wd < 2; wd++) {
                    const uint32_t w0 = wd ? st.w[mt][0].y : st.w[mt][0].x;
                    const uint32_t w1 = wd ? st.w[mt][1].y : st.w[mt][1].x;
                    constexpr int PAIRS = BITS == 4 ? 4 : 2;
                    uint32_t h0[PAIRS], h1[PAIRS];
                    if (BITS == 4) {
                        gmma_dq4(w0, h0);
                        gmma_dq4(w1, h1);
                    } else {
                        gmma_dq8(w0, h0);
                        gmma_dq8(w1, h1);
                    }
#pragma unroll
                    for (int j = 0; j < PAIRS / 2; j++) {
                        const uint32_t a[4] = {h0[2 * j], h1[2 * j], h0[2 * j + 1], h1[2 * j + 1]};
                        const int u = wd * PAIRS + 2 * j;
#pragma unroll
                        for (int nt = 0; nt < NT; nt++) {
                            cuda_mma16816<__half>(ch[nt], a, xh[nt][u], xh[nt][u + 1]);
                            if (LO) cuda_mma16816<__half>(cl[nt], a, xl[nt][u], xl[nt][u + 1]);
                        }
                    }
                }
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const int rh = i >> 1, c = C == 2 ? (i & 1) : 0;
                        acc[mt][nt][i] =
                            fmaf(st.s[mt][rh][c], LO ? ch[nt][i] + cl[nt][i] : ch[nt][i],
                                 fmaf(st.b[mt][rh][c], xs[nt][i & 1], acc[mt][nt][i]));
                    }
            }
        };
        /* Two sectors in flight: the next one's loads go out before this one computes. */
        sector_regs ra, rb;
        load(0, ra);
        for (int sl = 0; sl < ns; sl += 2) {
            if (sl + 1 < ns) load(sl + 1, rb);
            compute(sl, ra);
            if (sl + 1 >= ns) break;
            if (sl + 2 < ns) load(sl + 2, ra);
            compute(sl + 1, rb);
        }
#pragma unroll
        for (int mt = 0; mt < MB; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int q = 0; q < Q; q++) {
                    const float v = C == 1 ? acc[mt][nt][q] * unscale[nt][q & 1]
                                           : acc[mt][nt][2 * q] * unscale[nt][0] +
                                                 acc[mt][nt][2 * q + 1] * unscale[nt][1];
                    const int rh = C == 1 ? q >> 1 : q;
                    const int xr = C == 1 ? nt * 8 + 2 * t + (q & 1) : nt * 4 + t;
                    if (xr < job.nx && tile0 + mt < t_end)
                        job.part[((int64_t)ks * job.nx + xr) * vrows + (tile0 + mt) * 16 + g +
                                 8 * rh] = v;
                }
    }

    /* The last CTA of the m-block to finish adds the k-ranges' partials in order. */
    __threadfence();
    __syncthreads();
    if (tid == 0) last = atomicAdd(&job.count[mb], 1u) == (unsigned)job.ksplit - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    const int64_t r_begin = GLU ? t_begin / 2 * 16 : t_begin * 16;
    int64_t r_end = GLU ? t_end / 2 * 16 : t_end * 16;
    if (r_end > job.rows) r_end = job.rows;
    const int64_t span = r_end - r_begin;
    for (int64_t u = tid; u < span * job.nx; u += blockDim.x) {
        const int xr = (int)(u / span);
        const int64_t r = r_begin + u % span;
        const int64_t v0 = GLU ? (r / 16) * 32 + r % 16 : r;
        int64_t row = 0;
        const int mi = GLU ? 0 : gmma_row<false>(job, r / 16, (int)(r % 16), &row);
        const float prev = GLU ? 0.0f : cuda_gemv_prev(job, mi, xr, row);
        /* The partials and, with a norm, the row's sums of squares, both in k order. */
        float v = 0.0f, v2 = 0.0f, ss = 0.0f;
        for (int k = 0; k < job.ksplit; k++) {
            const float *p = job.part + ((int64_t)k * job.nx + xr) * vrows + v0;
            v += __ldcg(p);
            if (GLU) v2 += __ldcg(p + 16);
            if (job.fz.norm) ss += __ldcg(&job.ssq[(mb * job.ksplit + k) * GMMA_MAX_NX + xr]);
        }
        if (job.fz.norm) {
            const float inv = cuda_rms_inv(ss, job.in, job.fz.eps);
            v *= inv, v2 *= inv;
        }
        if (GLU) {
            if (job.m[0].bias) v += cuda_load(job.m[0].bias, job.m[0].bias_dt, (size_t)r);
            if (job.m[1].bias) v2 += cuda_load(job.m[1].bias, job.m[1].bias_dt, (size_t)r);
            cuda_store(job.m[0].y, job.m[0].y_dt, (size_t)(xr * job.rows + r),
                       cuda_act(job.fz.act, v) * v2);
        } else {
            cuda_gemv_store(job, mi, xr, row, v, prev);
        }
    }
    if (tid == 0) job.count[mb] = 0;
}

bool cuda_gemv_mma_fits(const be_tensor *x, const be_linear *w) {
    return x->rows >= 1 && x->rows <= GMMA_MAX_NX && x->dtype == BASE_DTYPE_F32 &&
           (w->bits == 4 || w->bits == 8) && (w->in * w->bits) % 256 == 0 &&
           (w->group_size == 32 || w->group_size == 64 || w->group_size == 128) &&
           w->in % w->group_size == 0 && ((uintptr_t)w->weight & 7) == 0 &&
           ((uintptr_t)x->data & 15) == 0 && cuda_float_dtype(w->dtype) &&
           (!w->bias || cuda_float_dtype(w->bias_dtype));
}

template <int BITS, int C, int NT, bool GLU, typename S>
static int gmma_launch(be_backend *be, gmma_job job, base_err *err) {
    cuda_backend *c = cuda_impl(be);
    auto kernel = gmma_kernel<BITS, C, NT, GLU, S>;
    constexpr int MB = gmma_mb<NT>();
    constexpr int SMEM = gmma_smem_cap<C, NT>();
    constexpr size_t per_sector =
        (size_t)NT * (gmma_parts<BITS, C, NT>() * 32 * 16 + 8 * sizeof(float));
    /* The k-ranges: few enough that each CTA's fragments fit its shared memory, many enough
     * that the warps' units of MB tiles and one k-range fill the device's resident warps. */
    static int per_sm;
    if (per_sm == 0) {
        cudaError_t e =
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
        if (e == cudaSuccess)
            e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, GMMA_WARPS * 32,
                                                              SMEM);
        if (e != cudaSuccess)
            return base_fail(err, "cuda: matmul: tensor-core GEMV occupancy: %s",
                             cudaGetErrorString(e));
        if (per_sm < 1) per_sm = 1;
    }
    const int64_t resident = (int64_t)per_sm * c->sm_count;
    const int64_t units = (job.tiles + MB - 1) / MB;
    const int64_t spc_most = SMEM / per_sector;
    int64_t ksplit = (job.sectors + spc_most - 1) / spc_most;
    const int64_t fill = (resident * GMMA_WARPS + units - 1) / units;
    if (ksplit < fill) ksplit = fill;
    if (ksplit > job.sectors) ksplit = job.sectors;
    job.spc = (int)((job.sectors + ksplit - 1) / ksplit);
    job.ksplit = (int)((job.sectors + job.spc - 1) / job.spc);
    /* One wave: m-blocks enough that their k-ranges fill the device once, each with tiles
     * for all its warps. */
    int64_t mblocks = (resident + job.ksplit - 1) / job.ksplit;
    const int64_t most = (job.tiles + GMMA_WARPS * MB - 1) / (GMMA_WARPS * MB);
    if (mblocks > most) mblocks = most;
    if (mblocks < 1) mblocks = 1;
    if (mblocks > GMMA_MAX_MBLOCKS) mblocks = GMMA_MAX_MBLOCKS;
    int64_t tpb = (job.tiles + mblocks - 1) / mblocks;
    tpb = (tpb + 1) / 2 * 2;
    mblocks = (job.tiles + tpb - 1) / tpb;
    job.tpb = tpb;

    const size_t parts = (size_t)job.ksplit * job.nx * (size_t)job.tiles * 16;
    const size_t bytes =
        gmma_part_offset() + (parts + (size_t)mblocks * job.ksplit * GMMA_MAX_NX) * sizeof(float);
    const size_t cap = c->gmma_bytes;
    if (cuda_scratch(be, &c->gmma_buf, &c->gmma_bytes, bytes, "tensor-core GEMV", err)) return -1;
    /* The counters start at zero once and every launch leaves them there. */
    if (c->gmma_bytes != cap) {
        cudaError_t e = cudaMemsetAsync(c->gmma_buf, 0, c->gmma_bytes, c->stream);
        if (e != cudaSuccess)
            return base_fail(err, "cuda: matmul: tensor-core GEMV scratch: %s",
                             cudaGetErrorString(e));
    }
    job.count = (unsigned *)c->gmma_buf;
    job.part = (float *)((char *)c->gmma_buf + gmma_part_offset());
    job.ssq = job.part + parts;
    const size_t smem = (size_t)job.spc * per_sector;
    kernel<<<dim3((unsigned)job.ksplit, (unsigned)mblocks), GMMA_WARPS * 32, smem, c->stream>>>(
        job);
    return cuda_check_launch("matmul (tensor-core GEMV)", err);
}

template <int BITS, int C, bool GLU, typename S>
static int gmma_dispatch_nt(be_backend *be, const gmma_job &job, base_err *err) {
    const int nt = (job.nx + 8 / C - 1) / (8 / C);
    if (nt == 1) return gmma_launch<BITS, C, 1, GLU, S>(be, job, err);
    if (nt == 2) return gmma_launch<BITS, C, 2, GLU, S>(be, job, err);
    return gmma_launch<BITS, C, 4, GLU, S>(be, job, err);
}

template <bool GLU, typename S>
static int gmma_dispatch_s(be_backend *be, const gmma_job &job, int bits, base_err *err) {
    if (bits == 8) return gmma_dispatch_nt<8, 1, GLU, S>(be, job, err);
    if (job.gsize == 32) return gmma_dispatch_nt<4, 2, GLU, S>(be, job, err);
    return gmma_dispatch_nt<4, 1, GLU, S>(be, job, err);
}

template <bool GLU>
static int gmma_dispatch(be_backend *be, const gmma_job &job, int bits, base_err *err) {
    if (job.sdt == BASE_DTYPE_F32) return gmma_dispatch_s<GLU, float>(be, job, bits, err);
    if (job.sdt == BASE_DTYPE_F16) return gmma_dispatch_s<GLU, __half>(be, job, bits, err);
    return gmma_dispatch_s<GLU, __nv_bfloat16>(be, job, bits, err);
}

int cuda_gemv_mma(be_backend *be, const be_tensor *x, const be_linear *const *ws,
                  be_tensor *const *ys, int n, bool glu, const cuda_gemv_fuse *fz, base_err *err) {
    const be_linear *w = ws[0];
    /* 4-bit groups of 32 put 4 rows of x in an n-tile: 4 n-tiles serve 16 rows a pass. */
    const int64_t most = w->bits == 4 && w->group_size == 32 ? GMMA_MAX_NX / 2 : GMMA_MAX_NX;
    if (x->rows > most)
        return cuda_gemv_in_slices(be, x, ws, ys, n, glu, fz, most, cuda_gemv_mma, err);
    gmma_job job = {};
    if (fz) job.fz = *fz;
    job.sdt = w->dtype;
    job.in = w->in;
    job.row_bytes = w->in * w->bits / 8;
    job.groups = w->in / w->group_size;
    job.gsize = w->group_size;
    job.gshift = w->group_size == 32 ? 5 : (w->group_size == 64 ? 6 : 7);
    job.sectors = job.row_bytes / 32;
    job.nx = (int)x->rows;
    job.rows = cuda_gemv_mats(job.m, ws, ys, n, glu);
    if (job.rows == 0) return 0;
    job.tiles = glu ? 2 * ((job.rows + 15) / 16) : (job.rows + 15) / 16;
    job.x = (const float *)x->data;
    return glu ? gmma_dispatch<true>(be, job, w->bits, err)
               : gmma_dispatch<false>(be, job, w->bits, err);
}
