/* The quantized GEMV of decode: y = x W^T for one or two F32 rows of x, 4- or 8-bit MLX affine
 * weights, aiming at the memory-bandwidth limit. The same kernel serves the fused matmuls: up
 * to three matrices that share x (Q, K and V) in one launch, and gate with up followed by the
 * GLU (act(gate) * up, the activation from the job's fz). More rows of x take more passes
 * (from CUDA_GEMV_MMA_ROWS rows the tensor-core kernel serves them instead). A mixture of
 * experts' routed experts are jobs of their own (cuda_gemv1_moe): rows gathered from the stacked
 * experts by the routed ids, each row of x on the grid's y; their weights may also be MXFP4
 * (E2M1 codes, one E8M0 scale a 32-value unit, no biases), which only those jobs take.
 *
 * Arithmetic: integer dot products. x is cut into units of the 32 (4-bit) or 16 (8-bit) values
 * one 16-byte word of weights holds; each unit's values, scaled by a power of two above its
 * largest |x|, are rounded to 23-bit integers and split into three signed base-256 digits. One
 * dp4a multiplies four u8 weights with four s8 digits and adds them to an int32 sum, so four
 * 4-bit weights cost three dp4a (one per digit) plus the nibble split, against a LOP3, an FADD
 * and an FFMA for each weight in F32; the rounding (2^-23 of the unit's largest |x|) stays far
 * inside the F32 grade tests/backend/test_cuda_ops.c asks for. The affine form is folded per
 * unit: sum_k (s q_k + b) x_k = s dot(q, x) + b sum(x). An MXFP4 code is twice its E2M1 value
 * as a signed integer in [-12, 12] (two byte permutes a word of codes look it up), so its unit
 * is a signed dp4a product scaled by half its power-of-two scale.
 *
 * Layout: each CTA first turns all of x into digits in shared memory (four threads a unit, so
 * the step after the wait stays short), then its warps work alone. A warp walks blocks of
 * GEMV1_R rows a chunk of 32 GEMV1_C units at a time (lane l takes units l, l + 32, ...), the
 * next three chunks' weights, scales and biases already loading into registers while it
 * computes this one, and sums its lanes with shuffles at the end of each block: no shared-memory
 * reduction and no barrier in the loop. The first chunks' loads are issued before the wait on
 * the previous kernel.
 *
 * On the H200 (bench/bench_cuda_gemv.cu, 4-bit, group 64, BF16 scales, one row), against the
 * F32 kernel with a cp.async ring this replaces: lm_head [128256 x 4096] 92% of copy bandwidth
 * (was 43%), gate+up 85% (38%), down 52% (28%), q+k+v 51% (25%), o 45% (21%); in that ring
 * kernel dp4a alone reached 67% on lm_head, held back by the instructions of its loads and
 * reduction. The small matrices are bound by latency: one short wave per SM. */
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_packed.h"

#include <type_traits>

/* Warps per CTA (one CTA per SM: the registers of the chunks in flight bound it), 16-byte
 * units a lane takes from each row of a chunk (64 units: rows of 4096 and 14336 4-bit values
 * are whole chunks), and rows per block. A warp holds four chunks: one computed while the
 * other three load. */
#define GEMV1_WARPS 12
#define GEMV1_C     2
#define GEMV1_R     2
/* Most dynamic shared memory a CTA may take for the digits of x (of the H200's 227 KB): two
 * rows of 32768 4-bit or 16384 8-bit values. */
#define GEMV1_MAX_SMEM (220 << 10)

/* Up to three matrices of the same geometry sharing one x: rows [0, out) of the first, then
 * the second's, then the third's (PLAIN); or gate and up (GLU) where output row o is
 * act(x . gate[o]) * (x . up[o]), act = fz.act. */
struct gemv1_job {
    cuda_gemv_mat m[3];
    int nm;
    const float *x; /* (nx, in) */
    int64_t in;     /* values per row */
    int64_t units;  /* 16-byte units per row */
    int64_t groups; /* groups per row */
    int gshift;     /* unit index >> gshift = group index */
    int64_t rows;   /* PLAIN: sum of the outs; GLU: out */
    int64_t steps;  /* blocks: ceil(rows / rows per block) */
    int64_t warps;  /* warps that take blocks (warp w takes w, w + warps, ...) */
    int nx;         /* rows of x in this pass (1 to the kernel's NX); y rows follow them */
    cuda_gemv_fuse fz;
    /* MoE jobs (cuda_gemv1_moe, NX 1): row y of the grid is row y of x, x_stride and y_stride
     * values apart, whose top_k routed experts are ids[y top_k ..] (weights wts). A GLU job's
     * output o < top_k seg is feature o % seg of slot o / seg: rows ids[slot] seg + o % seg of
     * the stacked gate and up. A down job's x is the slots' inputs one after the other, seg units
     * each, slot k's scaled by its weight as it is read; output o sums over the slots, unit u of
     * slot k = u / seg meeting unit u - k seg of row ids[k] out + o of the stacked down. */
    int32_t *ids;
    float *wts;
    int top_k;
    int64_t seg;
    int64_t x_stride, y_stride;
    /* A GLU job that also routes (route.lg not NULL): row y's experts come from its router
     * logits (cuda_moe_route), and CTA 0 of the row writes them and their weights to ids and wts
     * for the down job after it. */
    cuda_moe_router route;
};

/* Units of x the digits in shared memory cover: whole chunks, the tail zero. */
__host__ __device__ static inline int64_t gemv1_padded(int64_t units) {
    return (units + 32 * GEMV1_C - 1) / (32 * GEMV1_C) * (32 * GEMV1_C);
}

/* Shared memory of the digits of NX rows of x: per unit, 3 (128 / BITS) / 4 words of digits
 * and its unscale and sum; then a MoE job's top_k experts and their weights. */
static size_t gemv1_smem(int bits, int nx, int64_t units, int top_k) {
    return (size_t)nx * gemv1_padded(units) * (3 * (128 / bits) + 8) +
           (size_t)top_k * (sizeof(int32_t) + sizeof(float));
}

/* x[k0 + k] of row j, k < N, into v: the one place the kernel reads x (zeros where !ok).
 * Coherent loads (not __ldg, whose non-coherent path is for data no kernel writes while this
 * grid runs) that still keep x in L1 for the CTA's other threads. */
template <int N>
__device__ __forceinline__ void gemv1_load_x(const gemv1_job &job, int64_t xr, int j, int64_t k0,
                                             bool ok, float (&v)[N]) {
    const float4 *p = (const float4 *)(job.x + xr * job.x_stride + j * job.in + k0);
#pragma unroll
    for (int c = 0; c < N / 4; c++) {
        const float4 f = ok ? __ldca(p + c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        v[4 * c] = f.x, v[4 * c + 1] = f.y, v[4 * c + 2] = f.z, v[4 * c + 3] = f.w;
    }
}

/* A quarter of a unit of x in the form the integer dot product takes, given the unit's largest
 * |x| m and its sum. Each value, scaled by 2^(22 - e) where 2^e > m, is rounded to an integer X
 * (|X| <= 2^22, off by at most 2^-23 of m) and written as three balanced base-256 digits,
 * X = d2 65536 + d1 256 + d0 with d0, d1 in [-128, 127] and d2 in [-64, 64]. Word 3 h + c of
 * d packs digit c of the four values that the bytes of the quarter's weight word h meet, in
 * byte order: a 4-bit quarter is one weight word of 8 values, split into its even nibbles
 * (h = 0) and odd ones (h = 1), or for MXFP4 (FP4) into its low half-word (h = 0) and high one
 * (the byte permutes of fp4_bytes keep the codes in order); an 8-bit quarter is one word of 4
 * values.
 *
 * No conversion instructions: t = x 2^(22 - e) + 1.5 2^23 in F32 rounds to the integer X in
 * t's low 22 bits; d0's byte is X's low byte, d1's that of (X + 128) >> 8 and d2's that of
 * (X + 32896) >> 16. Returns 2^(e - 22), by which the dot product of the digits is scaled back
 * (NaN where the unit holds an infinity or a NaN, which sum carries). */
template <int BITS, bool FP4>
__device__ __forceinline__ float gemv1_digits(const float (&v)[32 / BITS], float m, float sum,
                                              uint32_t (&d)[3 * 8 / BITS]) {
    /* 2^e > m, from m's exponent field (a subnormal or zero m gives 2^-126). */
    int e = (__float_as_int(m) >> 23) - 126;
    e = e > 128 ? 128 : e;
    /* Below 2^-100, x is first scaled by 2^64 so that 2^(22 - e) stays a float. */
    const float pre = e < -100 ? 0x1p64f : 1.0f;
    const float f = __int_as_float((127 + 22 - (e < -100 ? e + 64 : e)) << 23);
#pragma unroll
    for (int h = 0; h < 8 / BITS; h++) {
        uint32_t t[4], t1[4], t2[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            t[i] = __float_as_uint(fmaf(v[FP4         ? 4 * h + i
                                          : BITS == 4 ? 2 * i + h
                                                      : i] *
                                            pre,
                                        f, 12582912.0f));
            t1[i] = t[i] + 128u;
            /* 1.5 2^23 puts 0x40 in byte 2 of t, taken off here. */
            t2[i] = t[i] + 32896u - 0x400000u;
        }
        d[3 * h] =
            __byte_perm(__byte_perm(t[0], t[1], 0x0040), __byte_perm(t[2], t[3], 0x0040), 0x5410);
        d[3 * h + 1] = __byte_perm(__byte_perm(t1[0], t1[1], 0x0051),
                                   __byte_perm(t1[2], t1[3], 0x0051), 0x5410);
        d[3 * h + 2] = __byte_perm(__byte_perm(t2[0], t2[1], 0x0062),
                                   __byte_perm(t2[2], t2[3], 0x0062), 0x5410);
    }
    return ldexpf(1.0f, e - 22) + (sum - sum);
}

/* Four u8 weights times four s8 digits, added to c. */
__device__ __forceinline__ int dp4a_us(uint32_t a, uint32_t b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

/* dot(q, X) of one unit from its digits (word 3 b + c: digit c against weight byte word b, as
 * gemv1_digits packs them quarter by quarter): one integer sum per digit (|sum| < 2^20), put
 * together in F32. */
template <int BITS>
__device__ __forceinline__ float unit_dot(uint4 q, const uint32_t (&d)[3 * 32 / BITS]) {
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
    int a0 = 0, a1 = 0, a2 = 0;
#pragma unroll
    for (int k = 0; k < 4; k++)
#pragma unroll
        for (int h = 0; h < 8 / BITS; h++) {
            const int b = k * (8 / BITS) + h;
            const uint32_t wb = BITS == 4 ? (w[k] >> (4 * h)) & 0x0F0F0F0Fu : w[k];
            a0 = dp4a_us(wb, d[3 * b], a0);
            a1 = dp4a_us(wb, d[3 * b + 1], a1);
            a2 = dp4a_us(wb, d[3 * b + 2], a2);
        }
    return fmaf((float)a2, 65536.0f, (float)(a1 * 256 + a0));
}

/* Four s8 weights times four s8 digits, added to c. */
__device__ __forceinline__ int dp4a_ss(uint32_t a, uint32_t b, int c) {
    int d;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

/* The four MXFP4 codes of the half-word h of w as signed bytes of twice their E2M1 value, in
 * order: each code's magnitude looked up in the positive and the negative table (3-bit
 * selectors), then the byte of the table its sign bit names. */
__device__ __forceinline__ uint32_t fp4_bytes(uint32_t w, int h) {
    const uint32_t c = h ? w >> 16 : w, sel = c & 0x7777u;
    const uint32_t pos = __byte_perm(0x03020100u, 0x0C080604u, sel); /* 0 1 2 3 | 4 6 8 12 */
    const uint32_t neg = __byte_perm(0xFDFEFF00u, 0xF4F8FAFCu, sel); /* their negatives */
    return __byte_perm(pos, neg, ((c >> 1) & 0x4444u) | 0x3210u);
}

/* dot(2 e2m1(q), X) of one MXFP4 unit from its digits (word 3 b + c: digit c against half-word
 * b of the codes, as gemv1_digits<4, true> packs them). */
__device__ __forceinline__ float unit_dot_fp4(uint4 q, const uint32_t (&d)[24]) {
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
    int a0 = 0, a1 = 0, a2 = 0;
#pragma unroll
    for (int k = 0; k < 4; k++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int b = 2 * k + h;
            const uint32_t wb = fp4_bytes(w[k], h);
            a0 = dp4a_ss(wb, d[3 * b], a0);
            a1 = dp4a_ss(wb, d[3 * b + 1], a1);
            a2 = dp4a_ss(wb, d[3 * b + 2], a2);
        }
    return fmaf((float)a2, 65536.0f, (float)(a1 * 256 + a0));
}

/* One unit's integer dot product in the weights' format. */
template <int BITS, bool FP4>
__device__ __forceinline__ float gemv1_unit(uint4 q, const uint32_t (&d)[3 * 32 / BITS]) {
    if constexpr (FP4)
        return unit_dot_fp4(q, d);
    else
        return unit_dot<BITS>(q, d);
}

/* A scale or bias as its raw bits: 32 of an F32, 16 of an F16 or BF16, 8 of an MXFP4 scale
 * (S = uint8_t stands for MXFP4 throughout this file). */
template <typename S> __device__ __forceinline__ uint32_t gemv1_ldscale(const S *p) {
    if (sizeof(S) == 1) {
        unsigned short v;
        asm volatile("ld.global.nc.L1::no_allocate.u8 %0, [%1];" : "=h"(v) : "l"(p));
        return v;
    }
    if (sizeof(S) == 4) {
        uint32_t v;
        asm volatile("ld.global.nc.L1::no_allocate.b32 %0, [%1];" : "=r"(v) : "l"(p));
        return v;
    }
    unsigned short v;
    asm volatile("ld.global.nc.L1::no_allocate.b16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}

template <typename S> __device__ __forceinline__ float gemv1_scale(uint32_t raw) {
    /* E8M0: 2^(raw - 127), halved for the doubled codes: 2^(raw - 128), subnormal below 2. */
    if (std::is_same<S, uint8_t>::value)
        return raw >= 2 ? __uint_as_float((raw - 1) << 23) : __uint_as_float(0x200000u << raw);
    if (std::is_same<S, float>::value) return __uint_as_float(raw);
    if (std::is_same<S, __half>::value) return __half2float(__ushort_as_half((uint16_t)raw));
    return __uint_as_float(raw << 16);
}

/* Where block `step` reads: its matrix and its first row there. A block never straddles two
 * matrices (cuda_gemv1 asks every boundary to be a multiple of 4 rows); GLU blocks read the
 * same rows of gate (matrix 0) and up (matrix 1). */
template <bool GLU, int R>
__device__ __forceinline__ int step_start(const gemv1_job &job, int64_t step, int64_t *row0) {
    if (GLU) {
        *row0 = step * (R / 2);
        return 0;
    }
    const int64_t g = step * R, e0 = job.m[0].out, e1 = e0 + job.m[1].out;
    *row0 = g < e0 ? g : (g < e1 ? g - e0 : g - e1);
    return g < e0 ? 0 : (g < e1 ? 1 : 2);
}

/* Output row r of block `step` for row j of x: v (GLU: v of gate's row, v2 of up's), added to
 * prev (cuda_gemv_prev) when the job adds into y. */
template <bool GLU, int R>
__device__ __forceinline__ void gemv1_emit(const gemv1_job &job, int64_t step, int r, int j,
                                           float v, float v2, float prev) {
    int64_t row0;
    const int mi = step_start<GLU, R>(job, step, &row0);
    const int64_t row = row0 + r;
    if (GLU) {
        if (row < job.rows) {
            if (job.m[0].bias) v += cuda_load(job.m[0].bias, job.m[0].bias_dt, (size_t)row);
            if (job.m[1].bias) v2 += cuda_load(job.m[1].bias, job.m[1].bias_dt, (size_t)row);
            cuda_store(job.m[0].y, job.m[0].y_dt, (size_t)(j * job.rows + row),
                       cuda_act(job.fz.act, v) * v2);
        }
    } else if (step * R + r < job.rows) {
        cuda_gemv_store(job, mi, j, row, v, prev);
    }
}

/* The row of the stacked gate and up that a MoE GLU job's output o reads (sids: the row of x's
 * experts): feature o % seg of slot o / seg's expert. */
__device__ __forceinline__ int64_t gemv1_moe_row(const gemv1_job &job, const int32_t *sids,
                                                 int64_t o) {
    const int64_t k = o / job.seg;
    return sids[k] * job.seg + o - k * job.seg;
}

/* The MoE jobs' output row r of block `step` for row xr of x (sids: its experts), v (GLU: v of
 * gate's row, v2 of up's); a down job adds its slots' biases, each times its slot's weight. */
template <bool GLU, int R>
__device__ __forceinline__ void gemv1_emit_moe(const gemv1_job &job, int64_t xr, int64_t step,
                                               int r, float v, float v2, const int32_t *sids) {
    const cuda_gemv_mat &m = job.m[0];
    if (GLU) {
        const int64_t o = step * (R / 2) + r;
        if (o >= job.rows) return;
        const int64_t row = gemv1_moe_row(job, sids, o);
        if (m.bias) v += cuda_load(m.bias, m.bias_dt, (size_t)row);
        if (job.m[1].bias) v2 += cuda_load(job.m[1].bias, job.m[1].bias_dt, (size_t)row);
        cuda_store(m.y, m.y_dt, (size_t)(xr * job.y_stride + o), cuda_moe_act(job.fz.act, v, v2));
        return;
    }
    const int64_t o = step * R + r;
    if (o >= job.rows) return;
    for (int k = 0; m.bias && k < job.top_k; k++)
        v = fmaf(job.wts[xr * job.top_k + k],
                 cuda_load(m.bias, m.bias_dt, (size_t)(sids[k] * m.out + o)), v);
    cuda_store(m.y, m.y_dt, (size_t)(xr * job.y_stride + o), v);
}

template <int BITS, bool GLU, typename S, int NX, bool MOE>
__global__ void __launch_bounds__(GEMV1_WARPS * 32) gemv1_kernel(const gemv1_job job) {
    constexpr int WPU = 128 / BITS, R = GEMV1_R, C = GEMV1_C, OUT = GLU ? R / 2 : R;
    constexpr bool FP4 = std::is_same<S, uint8_t>::value; /* MXFP4: no biases */
    constexpr int DW = 3 * WPU / 16;                      /* 16-byte words of digits per unit */
    constexpr int QW = 3 * 8 / BITS;   /* 4-byte words of digits per quarter unit */
    extern __shared__ uint4 gemv1_x[]; /* (NX, DW, up) digits, then (NX, up) unscale and sum */
    const int lane = threadIdx.x & 31;
    const int U = (int)job.units, up = (int)gemv1_padded(U), chunks = up / (32 * C);
    uint32_t *xw = (uint32_t *)gemv1_x;
    float2 *xf = (float2 *)(gemv1_x + (size_t)NX * DW * up);
    int32_t *sids = (int32_t *)(xf + (size_t)NX * up);     /* a MoE job's experts */
    float *swts = (float *)(sids + (MOE ? job.top_k : 0)); /* and their weights, if it routes */
    const int64_t xr = MOE ? (int64_t)blockIdx.y : 0;

    struct buf {
        uint4 q[R][C];
        uint32_t s[R][C], b[R][C];
    };
    /* The chunk computed next (blk, ch) and the one loaded next (lblk, lch), with where each
     * row of lblk reads its weights, scales and biases. No branches: a row past the matrix
     * reads its last row (nothing stores it), a unit past the row its last unit (the digits of
     * x there are zero). */
    const int64_t gw = (int64_t)(threadIdx.x >> 5) * gridDim.x + blockIdx.x;
    int64_t blk = gw < job.warps ? gw : job.steps, lblk = blk;
    int ch = 0, lch = 0;
    const uint4 *lw[R];
    const S *ls[R], *lb[R];
    int64_t lo[R]; /* a MoE down job's output rows, whose weights load() finds unit by unit */
    auto seek = [&]() {
        if (lblk >= job.steps) return;
        int64_t row0;
        const int m0 = step_start<GLU, R>(job, lblk, &row0);
        if (MOE && !GLU) {
#pragma unroll
            for (int r = 0; r < R; r++) lo[r] = row0 + r < job.rows ? row0 + r : job.rows - 1;
        }
#pragma unroll
        for (int half = 0; half < (MOE && !GLU ? 0 : GLU ? 2 : 1); half++) {
            const int mi = GLU ? half : m0;
            const int64_t out = cuda_gemv_pick(job, mi, &cuda_gemv_mat::out);
            const uint4 *w = (const uint4 *)cuda_gemv_pick(job, mi, &cuda_gemv_mat::w);
            const S *sp = (const S *)cuda_gemv_pick(job, mi, &cuda_gemv_mat::s);
            const S *bp = (const S *)cuda_gemv_pick(job, mi, &cuda_gemv_mat::b);
#pragma unroll
            for (int r = 0; r < OUT; r++) {
                int64_t row = row0 + r < out ? row0 + r : out - 1;
                if (MOE)
                    row = gemv1_moe_row(job, sids, row0 + r < job.rows ? row0 + r : job.rows - 1);
                lw[half * OUT + r] = w + row * U;
                ls[half * OUT + r] = sp + row * job.groups;
                if (!FP4) lb[half * OUT + r] = bp + row * job.groups;
            }
        }
    };
    auto load = [&](buf &B) {
        if (lblk >= job.steps) return;
#pragma unroll
        for (int c = 0; c < C; c++) {
            int u = lch * 32 * C + c * 32 + lane;
            u = u < U ? u : U - 1;
            if (MOE && !GLU) {
                /* unit lu of slot k's expert row */
                const int k = u / (int)job.seg, lu = u - k * (int)job.seg, g = lu >> job.gshift;
                const int64_t base = (int64_t)sids[k] * job.m[0].out;
#pragma unroll
                for (int r = 0; r < R; r++) {
                    const int64_t row = base + lo[r];
                    B.q[r][c] = gmma_ld_nc(
                        (const uint8_t *)((const uint4 *)job.m[0].w + row * job.seg + lu));
                    B.s[r][c] = gemv1_ldscale((const S *)job.m[0].s + row * job.groups + g);
                    if (!FP4)
                        B.b[r][c] = gemv1_ldscale((const S *)job.m[0].b + row * job.groups + g);
                }
                continue;
            }
            const int g = u >> job.gshift;
#pragma unroll
            for (int r = 0; r < R; r++) {
                B.q[r][c] = gmma_ld_nc((const uint8_t *)(lw[r] + u));
                B.s[r][c] = gemv1_ldscale(ls[r] + g);
                if (!FP4) B.b[r][c] = gemv1_ldscale(lb[r] + g);
            }
        }
        if (++lch == chunks) {
            lch = 0;
            lblk += job.warps;
            seek();
        }
    };
    /* Four slots, named rather than indexed, so that all of them stay in registers. */
    buf b0, b1, b2, b3;
    /* The weights depend on no kernel: the first chunks load while the previous kernel ends
     * (those of a MoE job depend on its experts, read after the wait). */
    if (!MOE) {
        seek();
        load(b0);
        load(b1);
        load(b2);
    }
    /* Nor do the norm's weights, which every CTA reads whole after the wait: into L1 now. */
    if (job.fz.norm)
        for (int64_t o = threadIdx.x * 128LL;
             o < job.in * (job.fz.norm_dt == BASE_DTYPE_F32 ? 4 : 2); o += blockDim.x * 128LL)
            asm volatile("prefetch.global.L1 [%0];" ::"l"((const char *)job.fz.norm + o));
    cuda_pdl_trigger();
    cuda_pdl_wait();
    const bool routes = MOE && GLU && job.route.lg;
    if (routes) {
        /* the first warp routes while the others turn x into digits */
        if (threadIdx.x < 32)
            cuda_moe_route(job.route.lg + xr * job.route.n_experts, job.route.n_experts, job.top_k,
                           job.route.norm_topk, sids, swts);
    } else if (MOE) {
        for (int k = threadIdx.x; k < job.top_k; k += blockDim.x)
            sids[k] = job.ids[xr * job.top_k + k];
        /* The experts are known: their first chunks load while x turns into digits. */
        __syncthreads();
        seek();
        load(b0);
        load(b1);
        load(b2);
    }
    /* Four threads a unit (lanes 4i to 4i + 3 of a warp: up * 4 is a multiple of 32, so whole
     * warps take part in the shuffles), each a quarter of it. With a norm, x is multiplied by
     * its weight here and the sums of squares meet at the barrier after. */
    __shared__ float nss[GEMV1_WARPS][NX]; /* each warp's share of x's sums of squares */
    float ss[NX];
#pragma unroll
    for (int j = 0; j < NX; j++) ss[j] = 0.0f;
    for (int i = threadIdx.x; i < up * 4; i += blockDim.x) {
        const int u = i >> 2, qt = i & 3;
        float nw[WPU / 4];
        if (job.fz.norm && u < U)
            cuda_load_ro<WPU / 4>(job.fz.norm, job.fz.norm_dt, (size_t)(u * WPU + qt * (WPU / 4)),
                                  nw);
#pragma unroll
        for (int j = 0; j < NX; j++) {
            float v[WPU / 4];
            gemv1_load_x<WPU / 4>(job, xr, j, u * WPU + qt * (WPU / 4), u < U && j < job.nx, v);
            if (MOE && !GLU && u < U) {
                const float wk = job.wts[xr * job.top_k + u / job.seg];
#pragma unroll
                for (int k = 0; k < WPU / 4; k++) v[k] *= wk;
            }
            if (job.fz.norm && u < U) {
#pragma unroll
                for (int k = 0; k < WPU / 4; k++) ss[j] += v[k] * v[k], v[k] *= nw[k];
            }
            float m = 0.0f, sum = 0.0f;
#pragma unroll
            for (int k = 0; k < WPU / 4; k++) m = fmaxf(m, fabsf(v[k])), sum += v[k];
#pragma unroll
            for (int o = 1; o < 4; o <<= 1) {
                m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
                sum += __shfl_xor_sync(0xffffffffu, sum, o);
            }
            uint32_t d[QW];
            const float unscale = gemv1_digits<BITS, FP4>(v, m, sum, d);
#pragma unroll
            for (int k = 0; k < QW; k++) {
                const int wd = qt * QW + k; /* the word's index within the unit */
                xw[((j * DW + wd / 4) * up + u) * 4 + wd % 4] = d[k];
            }
            if (qt == 0) xf[j * up + u] = make_float2(unscale, sum);
        }
    }
    if (job.fz.norm) {
#pragma unroll
        for (int j = 0; j < NX; j++) {
            ss[j] = cuda_warp_sum(ss[j]);
            if (lane == 0) nss[threadIdx.x >> 5][j] = ss[j];
        }
    }
    __syncthreads();
    /* Each row's 1/rms scales its outputs (1 without a norm). */
    float inv[NX];
#pragma unroll
    for (int j = 0; j < NX; j++) {
        float t = 0.0f;
        for (int k = 0; job.fz.norm && k < GEMV1_WARPS; k++) t += nss[k][j];
        inv[j] = job.fz.norm ? cuda_rms_inv(t, job.in, job.fz.eps) : 1.0f;
    }
    if (routes) {
        if (blockIdx.x == 0)
            for (int k = threadIdx.x; k < job.top_k; k += blockDim.x) {
                job.ids[xr * job.top_k + k] = sids[k];
                job.wts[xr * job.top_k + k] = swts[k];
            }
        seek();
        load(b0);
        load(b1);
        load(b2);
    }

    float acc[R][NX];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int j = 0; j < NX; j++) acc[r][j] = 0.0f;
    /* The output a lane stores for its block, when the job adds into y: read as the block
     * starts, ahead of its sums. */
    float prev = 0.0f;
    auto step = [&](const buf &cur, buf &nxt) {
        load(nxt);
        if (!MOE && !GLU && job.fz.acc && ch == 0 && lane < OUT * NX && lane / OUT < job.nx &&
            blk * R + lane % OUT < job.rows) {
            int64_t row0;
            const int m0 = step_start<GLU, R>(job, blk, &row0);
            prev = cuda_gemv_prev(job, m0, lane / OUT, row0 + lane % OUT);
        }
#pragma unroll
        for (int c = 0; c < C; c++) {
            const int u = ch * 32 * C + c * 32 + lane;
#pragma unroll
            for (int j = 0; j < NX; j++) {
                uint32_t d[4 * DW];
#pragma unroll
                for (int k = 0; k < DW; k++) {
                    const uint4 w4 = gemv1_x[(j * DW + k) * up + u];
                    d[4 * k] = w4.x, d[4 * k + 1] = w4.y, d[4 * k + 2] = w4.z, d[4 * k + 3] = w4.w;
                }
                const float2 f = xf[j * up + u];
#pragma unroll
                for (int r = 0; r < R; r++) {
                    /* Scaled before the unscale, which may be subnormal for tiny x. */
                    const float sd =
                        gemv1_scale<S>(cur.s[r][c]) * gemv1_unit<BITS, FP4>(cur.q[r][c], d);
                    acc[r][j] =
                        fmaf(sd, f.x,
                             FP4 ? acc[r][j] : fmaf(gemv1_scale<S>(cur.b[r][c]), f.y, acc[r][j]));
                }
            }
        }
        if (ch == chunks - 1) {
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int j = 0; j < NX; j++) acc[r][j] = cuda_warp_sum(acc[r][j]);
            /* Lane j OUT + r stores output row r for row j of x. */
            float v = 0.0f, v2 = 0.0f;
#pragma unroll
            for (int j = 0; j < NX; j++)
#pragma unroll
                for (int r = 0; r < OUT; r++)
                    if (lane == j * OUT + r)
                        v = acc[r][j] * inv[j], v2 = GLU ? acc[OUT + r][j] * inv[j] : 0.0f;
            if (MOE && lane < OUT)
                gemv1_emit_moe<GLU, R>(job, xr, blk, lane, v, v2, sids);
            else if (!MOE && lane < OUT * NX && lane / OUT < job.nx)
                gemv1_emit<GLU, R>(job, blk, lane % OUT, lane / OUT, v, v2, prev);
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int j = 0; j < NX; j++) acc[r][j] = 0.0f;
        }
        if (++ch == chunks) ch = 0, blk += job.warps;
    };
    /* Slot i % 4 holds chunk i. */
    while (blk < job.steps) {
        step(b0, b3);
        if (blk >= job.steps) break;
        step(b1, b0);
        if (blk >= job.steps) break;
        step(b2, b1);
        if (blk >= job.steps) break;
        step(b3, b2);
    }
}

/* A job's geometry for rows of `in` values of w's bits and groups (a MoE down job's rows are
 * its slots' rows end to end). */
static gemv1_job gemv1_job_of(const be_linear *w, int64_t in) {
    gemv1_job job = {};
    job.in = in;
    job.units = in * w->bits / 128;
    job.groups = w->in / w->group_size;
    int g_units = w->group_size / (128 / w->bits), shift = 0;
    while ((1 << shift) < g_units) shift++;
    job.gshift = shift;
    return job;
}

/* The weight conditions both entry points ask: affine 4 or 8 bits in rows of whole 16-byte
 * units, groups of 32, 64 or 128, the kernel's alignments and float scales and bias. */
static bool gemv1_weight_fits(const be_linear *w) {
    return w->quant == BE_QUANT_AFFINE && (w->bits == 4 || w->bits == 8) &&
           (w->in * w->bits) % 128 == 0 &&
           (w->group_size == 32 || w->group_size == 64 || w->group_size == 128) &&
           w->in % w->group_size == 0 && ((uintptr_t)w->weight & 15) == 0 &&
           ((uintptr_t)w->scales & 3) == 0 && ((uintptr_t)w->biases & 3) == 0 &&
           cuda_float_dtype(w->dtype) && (!w->bias || cuda_float_dtype(w->bias_dtype));
}

bool cuda_gemv1_fits(const cuda_backend *c, const be_tensor *x, const be_linear *w) {
    /* A forced kernel keeps the rules below (F32 x only, the GEMM path from 64 rows). */
    if (cuda_qgemm_takes(c, x->rows) && cuda_qgemm_fits(x, w)) return true;
    /* Past CUDA_GEMV_PAIR_ROWS rows only the tensor-core kernel serves them, in slices of
     * CUDA_GEMV_MAX_ROWS rows (a last slice of one or two rows on this one), until the GEMM
     * path starts. */
    if (x->rows > CUDA_GEMV_PAIR_ROWS) {
        be_tensor slice = *x;
        slice.rows = CUDA_GEMV_PAIR_ROWS;
        return x->rows < CUDA_GEMM_MIN_ROWS && cuda_gemv_mma_fits(&slice, w) &&
               cuda_gemv1_fits(c, &slice, w);
    }
    return x->rows >= 1 && x->dtype == BASE_DTYPE_F32 && ((uintptr_t)x->data & 15) == 0 &&
           gemv1_weight_fits(w) &&
           gemv1_smem(w->bits, 2, w->in * w->bits / 128, 0) <= GEMV1_MAX_SMEM;
}

/* Launches the job over `xrows` rows of x: the pass's job.nx rows, or a MoE job's rows (grid y). */
template <int BITS, bool GLU, typename S, int NX, bool MOE>
static int gemv1_launch(cuda_backend *c, gemv1_job job, int64_t xrows, base_err *err) {
    auto kernel = gemv1_kernel<BITS, GLU, S, NX, MOE>;
    const size_t smem = gemv1_smem(BITS, NX, job.units, MOE ? job.top_k : 0);
    /* Shared memory the kernel may take on this device, and resident CTAs per SM at that. */
    static int limit, per_sm;
    if (per_sm == 0) {
        cudaError_t e =
            cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, c->device);
        if (limit > GEMV1_MAX_SMEM) limit = GEMV1_MAX_SMEM;
        if (e == cudaSuccess)
            e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, limit);
        if (e == cudaSuccess)
            e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, GEMV1_WARPS * 32,
                                                              limit);
        if (e != cudaSuccess)
            return base_fail(err, "cuda: matmul: single-row GEMV: %s", cudaGetErrorString(e));
        if (per_sm < 1) per_sm = 1;
    }
    if (smem > (size_t)limit)
        return base_fail(err,
                         "cuda: matmul: single-row GEMV: rows of %lld values need %zu bytes of "
                         "shared memory, the device offers %d",
                         (long long)job.in, smem, limit);
    job.steps = (job.rows + (GLU ? GEMV1_R / 2 : GEMV1_R) - 1) / (GLU ? GEMV1_R / 2 : GEMV1_R);
    /* Every warp that takes blocks takes as many as the others (a warp left alone on a last
     * block costs a whole memory latency), and those warps spread over every SM (the loads in
     * flight, not the blocks per warp, set the pace of a short launch): warp w of CTA b is
     * warp w grid + b of the grid. */
    int64_t grid = (int64_t)per_sm * c->sm_count;
    /* a MoE job's rows of x share the SMs */
    if (MOE) grid = grid / xrows > 1 ? grid / xrows : 1;
    const int64_t per_cta = (job.steps + GEMV1_WARPS - 1) / GEMV1_WARPS;
    if (grid > per_cta) grid = per_cta;
    const int64_t iters = (job.steps + grid * GEMV1_WARPS - 1) / (grid * GEMV1_WARPS);
    job.warps = (job.steps + iters - 1) / iters;
    return cuda_launch_pdl(c, kernel, dim3((unsigned)grid, MOE ? (unsigned)xrows : 1u),
                           GEMV1_WARPS * 32, smem,
                           MOE ? "moe experts (GEMV)" : "matmul (single-row GEMV)", err, job);
}

template <int BITS, bool GLU, typename S>
static int gemv1_rows(cuda_backend *c, const gemv1_job &job, int64_t moe_rows, base_err *err) {
    if (moe_rows) return gemv1_launch<BITS, GLU, S, 1, true>(c, job, moe_rows, err);
    return job.nx == 1 ? gemv1_launch<BITS, GLU, S, 1, false>(c, job, 1, err)
                       : gemv1_launch<BITS, GLU, S, 2, false>(c, job, 1, err);
}

/* The kernel for the glu and scales' dtype at BITS: a pass of job.nx rows, or a MoE job's
 * moe_rows rows (0: none). */
template <int BITS>
static int gemv1_scaled(cuda_backend *c, const gemv1_job &job, bool glu, base_dtype dt,
                        int64_t moe_rows, base_err *err) {
    if (dt == BASE_DTYPE_F32)
        return glu ? gemv1_rows<BITS, true, float>(c, job, moe_rows, err)
                   : gemv1_rows<BITS, false, float>(c, job, moe_rows, err);
    if (dt == BASE_DTYPE_F16)
        return glu ? gemv1_rows<BITS, true, __half>(c, job, moe_rows, err)
                   : gemv1_rows<BITS, false, __half>(c, job, moe_rows, err);
    return glu ? gemv1_rows<BITS, true, __nv_bfloat16>(c, job, moe_rows, err)
               : gemv1_rows<BITS, false, __nv_bfloat16>(c, job, moe_rows, err);
}

static int gemv1_dispatch(cuda_backend *c, const gemv1_job &job, int bits, bool glu, base_dtype dt,
                          int64_t moe_rows, base_err *err) {
    /* U8 scales: MXFP4, which only the MoE jobs take (gemv1_moe_weight_fits) */
    if (dt == BASE_DTYPE_U8)
        return glu ? gemv1_launch<4, true, uint8_t, 1, true>(c, job, moe_rows, err)
                   : gemv1_launch<4, false, uint8_t, 1, true>(c, job, moe_rows, err);
    return bits == 4 ? gemv1_scaled<4>(c, job, glu, dt, moe_rows, err)
                     : gemv1_scaled<8>(c, job, glu, dt, moe_rows, err);
}

int64_t cuda_gemv_mats(cuda_gemv_mat *m, const be_linear *const *ws, be_tensor *const *ys, int n,
                       bool glu) {
    int64_t rows = 0;
    for (int i = 0; i < n; i++) {
        const be_tensor *y = ys[glu ? 0 : i];
        m[i] = {ws[i]->weight,     ws[i]->scales, ws[i]->biases, ws[i]->bias,
                ws[i]->bias_dtype, y->data,       y->dtype,      ws[i]->out};
        rows += ws[i]->out;
    }
    return glu ? ws[0]->out : rows;
}

int cuda_gemv_in_slices(be_backend *be, const be_tensor *x, const be_linear *const *ws,
                        be_tensor *const *ys, int n, bool glu, const cuda_gemv_fuse *fz,
                        int64_t most, cuda_gemv_pass_fn pass, base_err *err) {
    for (int64_t r0 = 0; r0 < x->rows; r0 += most) {
        const int64_t rows = x->rows - r0 < most ? x->rows - r0 : most;
        const be_tensor xs = be_tensor_rows(x, r0, rows);
        be_tensor yv[3], *yp[3];
        for (int i = 0; i < (glu ? 1 : n); i++) {
            yv[i] = be_tensor_rows(ys[i], r0, rows);
            yp[i] = &yv[i];
        }
        if (pass(be, &xs, ws, yp, n, glu, fz, err)) return -1;
    }
    return 0;
}

int cuda_gemv1(be_backend *be, const be_tensor *x, const be_linear *const *ws, be_tensor *const *ys,
               int n, bool glu, const cuda_gemv_fuse *fz, base_err *err) {
    const int pick = cuda_impl(be)->gemv_kernel;
    bool gemm = cuda_qgemm_takes(cuda_impl(be), x->rows);
    for (int i = 0; i < n; i++) gemm = gemm && cuda_qgemm_fits(x, ws[i]);
    if (gemm) return cuda_qgemm(be, x, ws, ys, n, glu, fz, err);
    if (x->rows > CUDA_GEMV_MAX_ROWS)
        return cuda_gemv_in_slices(be, x, ws, ys, n, glu, fz, CUDA_GEMV_MAX_ROWS, cuda_gemv1, err);
    /* The tensor-core kernel reads W once for every row of x but costs more per weight: it
     * overtakes this one from CUDA_GEMV_MMA_ROWS rows. */
    bool mma = pick == CUDA_GEMV_MMA || (pick == CUDA_GEMV_AUTO && x->rows >= CUDA_GEMV_MMA_ROWS);
    for (int i = 0; i < n; i++) mma = mma && cuda_gemv_mma_fits(x, ws[i]);
    if (mma) return cuda_gemv_mma(be, x, ws, ys, n, glu, fz, err);
    const be_linear *w = ws[0];
    gemv1_job job = gemv1_job_of(w, w->in);
    job.nm = n;
    job.x = (const float *)x->data;
    if (fz) job.fz = *fz;
    job.rows = cuda_gemv_mats(job.m, ws, ys, n, glu);
    if (job.rows == 0) return 0;
    cuda_backend *c = cuda_impl(be);
    for (int64_t r0 = 0; r0 < x->rows; r0 += 2) {
        gemv1_job pass = job;
        pass.nx = x->rows - r0 < 2 ? 1 : 2;
        pass.x = (const float *)be_tensor_rows(x, r0, 1).data;
        for (int i = 0; i < (glu ? 1 : n); i++) pass.m[i].y = be_tensor_rows(ys[i], r0, 1).data;
        if (gemv1_dispatch(c, pass, w->bits, glu, w->dtype, 0, err)) return -1;
    }
    return 0;
}

/* What the MoE jobs also take: MXFP4 (codes 4 bits, one U8 scale a 32-value unit, no biases),
 * the weight aligned for 16-byte loads and the bias in a float dtype. */
static bool gemv1_moe_weight_fits(const be_linear *w) {
    if (w->quant != BE_QUANT_MXFP4) return gemv1_weight_fits(w);
    return w->bits == 4 && w->group_size == 32 && w->dtype == BASE_DTYPE_U8 && w->in % 32 == 0 &&
           ((uintptr_t)w->weight & 15) == 0 && (!w->bias || cuda_float_dtype(w->bias_dtype));
}

/* Gate and up (b, its twin) or down (b NULL) of a MoE job, top_k slots of rows of a->in. */
static bool gemv1_moe_mats_fit(const be_linear *a, const be_linear *b, int top_k) {
    if (b && (b->bits != a->bits || b->group_size != a->group_size || b->dtype != a->dtype ||
              b->in != a->in || b->quant != a->quant || !gemv1_moe_weight_fits(b)))
        return false;
    const int64_t units = (b ? a->in : a->in * top_k) * a->bits / 128;
    return gemv1_moe_weight_fits(a) && units <= INT32_MAX &&
           gemv1_smem(a->bits, 1, units, top_k) <= GEMV1_MAX_SMEM;
}

bool cuda_gemv1_moe_fits(const be_tensor *x, const be_moe *moe) {
    return x->dtype == BASE_DTYPE_F32 && ((uintptr_t)x->data & 15) == 0 && x->cols % 4 == 0 &&
           gemv1_moe_mats_fit(moe->gate, moe->up, moe->top_k) &&
           gemv1_moe_mats_fit(moe->down, NULL, moe->top_k);
}

int cuda_gemv1_moe(be_backend *be, const float *x, int64_t rows, const be_linear *a,
                   const be_linear *b, int32_t *ids, float *wts, int top_k, int64_t feats,
                   const cuda_gemv_fuse *fz, const cuda_moe_router *route, void *y, base_dtype y_dt,
                   base_err *err) {
    const bool glu = b != NULL;
    const int64_t in = glu ? a->in : a->in * top_k;
    gemv1_job job = gemv1_job_of(a, in);
    job.nm = glu ? 2 : 1;
    job.nx = 1;
    job.x = x;
    if (fz) job.fz = *fz;
    job.m[0] = {a->weight, a->scales, a->biases, a->bias, a->bias_dtype, y, y_dt, feats};
    if (glu) job.m[1] = {b->weight, b->scales, b->biases, b->bias, b->bias_dtype, y, y_dt, feats};
    job.rows = glu ? top_k * feats : feats;
    job.ids = ids;
    job.wts = wts;
    job.top_k = top_k;
    if (glu && route) job.route = *route;
    job.seg = glu ? feats : a->in * a->bits / 128;
    job.x_stride = in;
    job.y_stride = glu ? top_k * feats : feats;
    if (rows == 0 || job.rows == 0) return 0;
    return gemv1_dispatch(cuda_impl(be), job, a->bits, glu, a->dtype, rows, err);
}
