/* The quantized GEMV of decode: y = x W^T for 1 to 16 F32 rows of x, 4- or 8-bit MLX affine
 * weights, aiming at the memory-bandwidth limit. The same kernel serves the fused matmuls: up
 * to three matrices that share x (Q, K and V) in one launch, and gate with up followed by
 * SiLU-mul. One pass over W serves the rows of x a thread can hold in registers (two where its
 * slice is one unit, else one); more rows take more passes.
 *
 * Design: a CTA of K threads covers one whole row of W, each thread a fixed k-slice of UPT
 * 16-byte units (32 4-bit or 16 8-bit values each, always inside one group). The thread loads
 * its slice of x into registers once and reuses it for every output row the CTA computes, so
 * x costs no memory traffic per weight. CTAs are persistent and walk R rows per step.
 *
 * Each thread streams its own units (and the words holding their scale and bias) into a
 * private ring of D steps in shared memory with cp.async, D - 1 steps ahead of the one it
 * computes; no barrier is needed for that, since a thread reads only what it copied. On the
 * H200 (bench/bench_cuda_gemv.cu, 4-bit [128256 x 4096]) this reads 1.87 TB/s against 1.80
 * with the loads held in registers, and the profile shows the SMs busy issuing (73% of issue
 * slots), not waiting on memory: the instructions per weight are what bound it. Two
 * tensor-core variants (f16 hi/lo x on m16n8k16, weights dequantized in registers) measured
 * 1.1 to 1.75 TB/s: their per-thread addressing and shared-memory traffic outweighed the
 * multiply they saved.
 *
 * The affine form is folded: sum_k (s q_k + b) x_k = s * dot(q, x) + b * sum(x), with sum(x)
 * of each unit computed once. A value q at bit 4j (or 8j) of a 16-bit half word becomes a
 * float without a conversion instruction: 0x4B000000 | (w & mask) is the float 2^23 + q *
 * 2^(4j) exactly, so subtracting 2^23 leaves q * 2^(4j), and x's slice is pre-scaled by
 * 2^(-4j) once (exact: a power of two). That is three instructions per weight (LOP3, FADD,
 * FFMA). Each step's partial sums meet in a warp shuffle and one shared-memory pass across
 * the CTA's warps. */
#include "backend/cuda/cuda_internal.h"

#include <type_traits>

/* Most threads a CTA may have: the slice per thread grows instead. */
#define GEMV1_MAX_THREADS 256
/* 16-byte units a thread has in flight: steps ahead x rows per step x units per row. */
#ifndef GEMV1_INFLIGHT
#define GEMV1_INFLIGHT 16
#endif

/* Rows per step and steps in the ring for UPT units per thread. */
template <int UPT> __host__ __device__ constexpr int gemv1_rows() {
    return 4 / UPT < 2 ? 2 : 4 / UPT;
}
template <int UPT> __host__ __device__ constexpr int gemv1_depth() {
    return GEMV1_INFLIGHT / (gemv1_rows<UPT>() * UPT) < 2
               ? 2
               : GEMV1_INFLIGHT / (gemv1_rows<UPT>() * UPT);
}
/* Shared memory of a CTA of k threads: each (step, row, unit, thread) holds 16 bytes of
 * weights and the 4-byte words of its scale and bias. */
template <int UPT> static size_t gemv1_smem(int k) {
    return (size_t)gemv1_depth<UPT>() * gemv1_rows<UPT>() * UPT * k * 24;
}

__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(
                     (uint32_t)__cvta_generic_to_shared(dst)),
                 "l"(src), "r"(ok ? 16 : 0));
}

/* Copies the n <= 4 bytes at src into the word at dst, zero-filling the rest: the last word
 * of an array of 2-byte scales may hold only one of them. */
__device__ __forceinline__ void cp_async4(void *dst, const void *src, int n) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(
                     (uint32_t)__cvta_generic_to_shared(dst)),
                 "l"(src), "r"(n));
}

/* Bytes of the 4-byte word wi of an array of `bytes` bytes that exist (0 to 4). */
__device__ __forceinline__ int word_bytes(int64_t wi, int64_t bytes) {
    const int64_t n = bytes - wi * 4;
    return n <= 0 ? 0 : (n >= 4 ? 4 : (int)n);
}

/* Up to three matrices of the same geometry sharing one x: rows [0, out) of the first, then
 * the second's, then the third's (PLAIN); or gate and up (GLU) where output row o is
 * silu(x . gate[o]) * (x . up[o]). */
struct gemv1_job {
    cuda_gemv_mat m[3];
    int nm;
    const float *x; /* (in) */
    int64_t units;  /* 16-byte units per row */
    int64_t groups; /* groups per row */
    int gshift;     /* unit index >> gshift = group index */
    int64_t rows;   /* PLAIN: sum of the outs; GLU: out */
    int64_t steps;  /* ceil(rows / rows per step) */
    int nx;         /* rows of x in this pass (1 to the kernel's NX); y rows follow them */
};

/* A thread's x for one unit in the form the integer dot product takes. Each value, scaled by
 * 2^(22 - e) where 2^e > the unit's largest |x|, is rounded to an integer X (|X| <= 2^22, off
 * by at most 2^-23 of that largest |x|) and written as three balanced base-256 digits,
 * X = d2 65536 + d1 256 + d0 with d0, d1 in [-128, 127] and d2 in [-64, 64]. Word 3 b + c
 * packs digit c of the four values that weight word b's bytes meet, in byte order: 4-bit
 * words split into two words of bytes (even nibbles, then odd), so b runs over 8 such words,
 * 8-bit over 4. */
template <int BITS> struct gemv1_xu {
    uint32_t d[3 * (128 / BITS) / 4];
    float unscale; /* 2^(e - 22); NaN where the unit holds an infinity or a NaN */
    float sum;     /* sum of the unit's x, for the biases */
};

/* x[u * WPU + k] of row j, k < WPU, into v: the one place the kernel reads x (zeros past the
 * row's units). Coherent loads (not __ldg, whose non-coherent path is for data no kernel writes
 * while this grid runs) that still keep x in L1 for the SM's other CTAs: from L2 alone, every
 * CTA's read of x cost the step 20%. */
template <int WPU>
__device__ __forceinline__ void gemv1_load_x(const gemv1_job &job, int j, int64_t u, bool ok,
                                             float (&v)[WPU]) {
    const float4 *p = (const float4 *)(job.x + j * job.units * WPU + u * WPU);
#pragma unroll
    for (int c = 0; c < WPU / 4; c++) {
        const float4 f = ok ? __ldca(p + c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        v[4 * c] = f.x, v[4 * c + 1] = f.y, v[4 * c + 2] = f.z, v[4 * c + 3] = f.w;
    }
}

/* The digits cost a few instructions a value, without conversion instructions: t = x 2^(22 - e)
 * + 1.5 2^23 in F32 rounds to the integer X in t's low 22 bits, d0's byte is X's low byte,
 * d1's that of (X + 128) >> 8 and d2's that of (X + 32896) >> 16. Every CTA prepares all of x,
 * so this is paid once per CTA, not once per launch. */
template <int BITS>
__device__ __forceinline__ void gemv1_digits(const float (&v)[128 / BITS], gemv1_xu<BITS> &xu) {
    constexpr int WPU = 128 / BITS;
    float m = 0.0f, sum = 0.0f;
#pragma unroll
    for (int k = 0; k < WPU; k++) m = fmaxf(m, fabsf(v[k])), sum += v[k];
    /* 2^e > m, from m's exponent field (a subnormal or zero m gives 2^-126). */
    int e = (__float_as_int(m) >> 23) - 126;
    e = e > 128 ? 128 : e;
    xu.unscale = ldexpf(1.0f, e - 22) + (sum - sum);
    xu.sum = sum;
    /* Below 2^-100, x is first scaled by 2^64 so that 2^(22 - e) stays a float. */
    const float pre = e < -100 ? 0x1p64f : 1.0f;
    const float f = __int_as_float((127 + 22 - (e < -100 ? e + 64 : e)) << 23);
#pragma unroll
    for (int b = 0; b < WPU / 4; b++) {
        uint32_t t[4], t1[4], t2[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int k = BITS == 4 ? 8 * (b / 2) + 2 * i + (b % 2) : 4 * b + i;
            t[i] = __float_as_uint(fmaf(v[k] * pre, f, 12582912.0f));
            t1[i] = t[i] + 128u;
            /* 1.5 2^23 puts 0x40 in byte 2 of t, taken off here. */
            t2[i] = t[i] + 32896u - 0x400000u;
        }
        xu.d[3 * b] =
            __byte_perm(__byte_perm(t[0], t[1], 0x0040), __byte_perm(t[2], t[3], 0x0040), 0x5410);
        xu.d[3 * b + 1] = __byte_perm(__byte_perm(t1[0], t1[1], 0x0051),
                                      __byte_perm(t1[2], t1[3], 0x0051), 0x5410);
        xu.d[3 * b + 2] = __byte_perm(__byte_perm(t2[0], t2[1], 0x0062),
                                      __byte_perm(t2[2], t2[3], 0x0062), 0x5410);
    }
}

/* Four u8 weights times four s8 digits, added to c. */
__device__ __forceinline__ int dp4a_us(uint32_t a, uint32_t b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

/* dot(q, X) of one unit, times 2^(22 - e) against x: one integer sum per digit (|sum| < 2^20),
 * put together in F32. */
template <int BITS> __device__ __forceinline__ float unit_dot(uint4 q, const gemv1_xu<BITS> &xu) {
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
    int a0 = 0, a1 = 0, a2 = 0;
#pragma unroll
    for (int k = 0; k < 4; k++)
#pragma unroll
        for (int h = 0; h < (BITS == 4 ? 2 : 1); h++) {
            const int b = BITS == 4 ? 2 * k + h : k;
            const uint32_t wb = BITS == 4 ? (w[k] >> (4 * h)) & 0x0F0F0F0Fu : w[k];
            a0 = dp4a_us(wb, xu.d[3 * b], a0);
            a1 = dp4a_us(wb, xu.d[3 * b + 1], a1);
            a2 = dp4a_us(wb, xu.d[3 * b + 2], a2);
        }
    return fmaf((float)a2, 65536.0f, (float)(a1 * 256 + a0));
}

/* A scale or bias from the 4-byte word cp_async4 copied: the word itself for F32, else the
 * half of it that holds element i. */
template <typename S> __device__ __forceinline__ float scale_of(uint32_t word, int64_t i) {
    if (std::is_same<S, float>::value) return __uint_as_float(word);
    const uint16_t h = (uint16_t)(i & 1 ? word >> 16 : word & 0xFFFFu);
    if (std::is_same<S, __half>::value) return __half2float(__ushort_as_half(h));
    return __bfloat162float(__ushort_as_bfloat16(h));
}

/* Where step `step` reads: its matrix (-1 past the end) and its first row there. A step never
 * straddles two matrices (cuda_gemv1 asks every boundary to be a multiple of the rows per
 * step); GLU steps read the same rows of gate (matrix 0) and up (matrix 1). */
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

/* Output row r of step `step` for row j of x: v (GLU: v of gate's row, v2 of up's). */
template <bool GLU, int R>
__device__ __forceinline__ void gemv1_emit(const gemv1_job &job, int64_t step, int r, int j,
                                           float v, float v2) {
    int64_t row0;
    const int mi = step_start<GLU, R>(job, step, &row0);
    const int64_t row = row0 + r;
    if (GLU) {
        if (row < job.rows) {
            if (job.m[0].bias) v += cuda_load(job.m[0].bias, job.m[0].bias_dt, (size_t)row);
            if (job.m[1].bias) v2 += cuda_load(job.m[1].bias, job.m[1].bias_dt, (size_t)row);
            cuda_store(job.m[0].y, job.m[0].y_dt, (size_t)(j * job.rows + row),
                       v / (1.0f + __expf(-v)) * v2);
        }
    } else if (step * R + r < job.rows) {
        cuda_gemv_store(job, mi, j, row, v);
    }
}

template <int BITS, int UPT, bool GLU, typename S, int NX>
__global__ void __launch_bounds__(GEMV1_MAX_THREADS) gemv1_kernel(const gemv1_job job) {
    constexpr int WPU = 128 / BITS, R = gemv1_rows<UPT>(), D = gemv1_depth<UPT>();
    constexpr int OUT_PER_STEP = GLU ? R / 2 : R;
    constexpr int SB = sizeof(S) == 4 ? 4 : 2;
    extern __shared__ uint4 gemv1_ring[];
    __shared__ float red[2][GEMV1_MAX_THREADS / 32][R * NX];
    const int t = threadIdx.x, K = blockDim.x, lane = t & 31, warp = t >> 5;
    /* Slot (d, r, i) of thread t: weights at wq[((d * R + r) * UPT + i) * K + t], the scale
     * and bias words at the same index of ws and wb: consecutive threads, consecutive words. */
    uint4 *wq = gemv1_ring;
    uint32_t *ws = (uint32_t *)(wq + D * R * UPT * K), *wb = ws + D * R * UPT * K;
    /* The thread's units, and their groups' offsets within a row. */
    int64_t uo[UPT], go[UPT];
    bool uok[UPT];
#pragma unroll
    for (int i = 0; i < UPT; i++) {
        uo[i] = t + (int64_t)i * K;
        uok[i] = uo[i] < job.units;
        go[i] = uo[i] >> job.gshift;
    }

    auto issue = [&](int64_t step, int d) {
        if (step < job.steps) {
            int64_t row0;
            const int m0 = step_start<GLU, R>(job, step, &row0);
#pragma unroll
            for (int half = 0; half < (GLU ? 2 : 1); half++) {
                const int mi = GLU ? half : m0;
                const uint4 *w =
                    (const uint4 *)cuda_gemv_pick(job, mi, &cuda_gemv_mat::w) + row0 * job.units;
                const uint32_t *sp = (const uint32_t *)cuda_gemv_pick(job, mi, &cuda_gemv_mat::s);
                const uint32_t *bp = (const uint32_t *)cuda_gemv_pick(job, mi, &cuda_gemv_mat::b);
                const int64_t out = cuda_gemv_pick(job, mi, &cuda_gemv_mat::out);
                const int64_t sbytes = out * job.groups * SB, g0 = row0 * job.groups;
#pragma unroll
                for (int r = 0; r < OUT_PER_STEP; r++) {
                    const bool live = row0 + r < out;
#pragma unroll
                    for (int i = 0; i < UPT; i++) {
                        const bool ok = live && uok[i];
                        const int64_t gi = g0 + r * job.groups + go[i];
                        const int64_t wi = SB == 4 ? gi : gi >> 1;
                        const int slot = ((d * R + half * OUT_PER_STEP + r) * UPT + i) * K + t;
                        const int n = ok ? word_bytes(wi, sbytes) : 0;
                        cp_async16(&wq[slot], ok ? w + r * job.units + uo[i] : w, ok);
                        cp_async4(&ws[slot], sp + (n ? wi : 0), n);
                        cp_async4(&wb[slot], bp + (n ? wi : 0), n);
                    }
                }
            }
        }
        asm volatile("cp.async.commit_group;");
    };

    /* The weights depend on no kernel: the ring's first steps load while the previous kernel
     * finishes, and x is read only after it has (gemv1_load_x). */
    cuda_pdl_trigger();
    const int64_t grid = gridDim.x;
#pragma unroll
    for (int d = 0; d < D - 1; d++) issue(blockIdx.x + d * grid, d);
    cuda_pdl_wait();

    gemv1_xu<BITS> xs[NX][UPT];
#pragma unroll
    for (int j = 0; j < NX; j++)
#pragma unroll
        for (int i = 0; i < UPT; i++) {
            float v[WPU];
            gemv1_load_x<WPU>(job, j, uo[i], uok[i] && j < job.nx, v);
            gemv1_digits<BITS>(v, xs[j][i]);
        }

    int d = 0, par = 0;
    for (int64_t step = blockIdx.x; step < job.steps; step += grid, par ^= 1) {
        issue(step + (D - 1) * grid, d == 0 ? D - 1 : d - 1);
        asm volatile("cp.async.wait_group %0;" ::"n"(D - 1));
        int64_t row0;
        step_start<GLU, R>(job, step, &row0);
        /* Which half of a 2-byte scale word row r's group sits in: the parity of its index. */
        const int64_t gpar = row0 * job.groups;
        float acc[R][NX];
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int64_t gr = gpar + (r % OUT_PER_STEP) * job.groups;
#pragma unroll
            for (int j = 0; j < NX; j++) acc[r][j] = 0.0f;
#pragma unroll
            for (int i = 0; i < UPT; i++) {
                const int slot = ((d * R + r) * UPT + i) * K + t;
                const int64_t gi = gr + go[i];
                const float sc = scale_of<S>(ws[slot], gi), bi = scale_of<S>(wb[slot], gi);
                const uint4 q = wq[slot];
#pragma unroll
                for (int j = 0; j < NX; j++)
                    /* Scaled before the unscale, which may be subnormal for tiny x. */
                    acc[r][j] = fmaf(sc * unit_dot<BITS>(q, xs[j][i]), xs[j][i].unscale,
                                     fmaf(bi, xs[j][i].sum, acc[r][j]));
            }
        }
        d = d == D - 1 ? 0 : d + 1;
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int j = 0; j < NX; j++) {
#pragma unroll
                for (int o = 16; o > 0; o >>= 1)
                    acc[r][j] += __shfl_xor_sync(0xffffffffu, acc[r][j], o);
                if (lane == 0) red[par][warp][j * R + r] = acc[r][j];
            }
        __syncthreads();
        if (t >= OUT_PER_STEP * NX) continue;
        /* Thread t writes output row t % OUT_PER_STEP of the step for x row t / OUT_PER_STEP. */
        const int j = t / OUT_PER_STEP, tr = t % OUT_PER_STEP;
        if (j >= job.nx) continue;
        const int nw = K >> 5;
        float v = 0.0f, v2 = 0.0f;
        for (int k = 0; k < nw; k++) {
            v += red[par][k][j * R + tr];
            if (GLU) v2 += red[par][k][j * R + tr + OUT_PER_STEP];
        }
        gemv1_emit<GLU, R>(job, step, tr, j, v, v2);
    }
}

/* The register-pipelined variant: warps work alone. Each CTA turns all of x into digits in
 * shared memory once; each warp then walks blocks of GEMV2_R rows, a chunk of 32 GEMV2_C units
 * at a time (lane l takes units l, l + 32, ...), with the next chunk's weights, scales and
 * biases loaded into registers while it computes this one, and sums its lanes with shuffles
 * at the end of each block: no shared-memory reduction, no barrier. */
#define GEMV2_WARPS 4
#define GEMV2_C     4
#define GEMV2_R     2
/* Most dynamic shared memory a CTA may take for the digits of x. */
#define GEMV2_MAX_SMEM (160 << 10)

__device__ __forceinline__ uint4 gemv2_ld16(const uint4 *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* A scale or bias as its raw bits: 32 of an F32, 16 of an F16 or BF16. */
template <typename S> __device__ __forceinline__ uint32_t gemv2_ldscale(const S *p) {
    if (sizeof(S) == 4) {
        uint32_t v;
        asm volatile("ld.global.nc.L1::no_allocate.b32 %0, [%1];" : "=r"(v) : "l"(p));
        return v;
    }
    unsigned short v;
    asm volatile("ld.global.nc.L1::no_allocate.b16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}

template <typename S> __device__ __forceinline__ float gemv2_scale(uint32_t raw) {
    if (std::is_same<S, float>::value) return __uint_as_float(raw);
    if (std::is_same<S, __half>::value) return __half2float(__ushort_as_half((uint16_t)raw));
    return __uint_as_float(raw << 16);
}

/* Units of x the digits in shared memory cover: whole chunks, the tail zero. */
__host__ __device__ static inline int64_t gemv2_units(int64_t units) {
    return (units + 32 * GEMV2_C - 1) / (32 * GEMV2_C) * (32 * GEMV2_C);
}

template <int BITS, int NX> static size_t gemv2_smem(int64_t units) {
    return (size_t)NX * gemv2_units(units) * (3 * (128 / BITS) / 16 * 16 + 8);
}

template <int BITS, bool GLU, typename S, int NX>
__global__ void __launch_bounds__(GEMV2_WARPS * 32) gemv2_kernel(const gemv1_job job) {
    constexpr int WPU = 128 / BITS, R = GEMV2_R, C = GEMV2_C, OUT = GLU ? R / 2 : R;
    constexpr int DW = 3 * WPU / 16;   /* 16-byte words of digits per unit */
    extern __shared__ uint4 gemv2_x[]; /* (NX, DW, up) digits, then (NX, up) unscale and sum */
    const int lane = threadIdx.x & 31;
    const int64_t U = job.units, up = gemv2_units(U), chunks = up / (32 * C);
    float2 *xf = (float2 *)(gemv2_x + (size_t)NX * DW * up);
    const int64_t nwarps = (int64_t)gridDim.x * GEMV2_WARPS;

    struct buf {
        uint4 q[R][C];
        uint32_t s[R][C], b[R][C];
    };
    auto load = [&](buf &B, int64_t blk, int64_t ch) {
        if (blk >= job.steps) return;
        int64_t row0;
        const int m0 = step_start<GLU, R>(job, blk, &row0);
#pragma unroll
        for (int half = 0; half < (GLU ? 2 : 1); half++) {
            const int mi = GLU ? half : m0;
            const int64_t out = cuda_gemv_pick(job, mi, &cuda_gemv_mat::out);
            const uint4 *w = (const uint4 *)cuda_gemv_pick(job, mi, &cuda_gemv_mat::w);
            const S *sp = (const S *)cuda_gemv_pick(job, mi, &cuda_gemv_mat::s);
            const S *bp = (const S *)cuda_gemv_pick(job, mi, &cuda_gemv_mat::b);
#pragma unroll
            for (int r = 0; r < OUT; r++) {
                const int64_t row = row0 + r;
                const bool live = row < out;
#pragma unroll
                for (int c = 0; c < C; c++) {
                    const int64_t u = ch * 32 * C + c * 32 + lane;
                    const bool ok = live && u < U;
                    const int64_t g = row * job.groups + (u >> job.gshift);
                    B.q[half * OUT + r][c] =
                        ok ? gemv2_ld16(w + row * U + u) : make_uint4(0, 0, 0, 0);
                    B.s[half * OUT + r][c] = ok ? gemv2_ldscale(sp + g) : 0u;
                    B.b[half * OUT + r][c] = ok ? gemv2_ldscale(bp + g) : 0u;
                }
            }
        }
    };

    int64_t blk = blockIdx.x * GEMV2_WARPS + (threadIdx.x >> 5), ch = 0;
    buf A, B;
    /* The first chunk's weights depend on no kernel: they load while the previous one ends. */
    load(A, blk, 0);
    cuda_pdl_trigger();
    cuda_pdl_wait();
    for (int64_t u = threadIdx.x; u < up; u += blockDim.x)
#pragma unroll
        for (int j = 0; j < NX; j++) {
            float v[WPU];
            gemv1_xu<BITS> xu;
            gemv1_load_x<WPU>(job, j, u, u < U && j < job.nx, v);
            gemv1_digits<BITS>(v, xu);
#pragma unroll
            for (int k = 0; k < DW; k++)
                gemv2_x[(j * DW + k) * up + u] =
                    make_uint4(xu.d[4 * k], xu.d[4 * k + 1], xu.d[4 * k + 2], xu.d[4 * k + 3]);
            xf[j * up + u] = make_float2(xu.unscale, xu.sum);
        }
    __syncthreads();

    float acc[R][NX];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int j = 0; j < NX; j++) acc[r][j] = 0.0f;
    auto step = [&](const buf &cur, buf &nxt) {
        if (blk >= job.steps) return false;
        int64_t nblk = blk, nch = ch + 1;
        if (nch == chunks) nch = 0, nblk += nwarps;
        load(nxt, nblk, nch);
#pragma unroll
        for (int c = 0; c < C; c++) {
            const int64_t u = ch * 32 * C + c * 32 + lane;
#pragma unroll
            for (int j = 0; j < NX; j++) {
                gemv1_xu<BITS> xu;
#pragma unroll
                for (int k = 0; k < DW; k++) {
                    const uint4 d = gemv2_x[(j * DW + k) * up + u];
                    xu.d[4 * k] = d.x, xu.d[4 * k + 1] = d.y, xu.d[4 * k + 2] = d.z,
                             xu.d[4 * k + 3] = d.w;
                }
                const float2 f = xf[j * up + u];
#pragma unroll
                for (int r = 0; r < R; r++)
                    acc[r][j] = fmaf(gemv2_scale<S>(cur.s[r][c]) * unit_dot<BITS>(cur.q[r][c], xu),
                                     f.x, fmaf(gemv2_scale<S>(cur.b[r][c]), f.y, acc[r][j]));
            }
        }
        if (ch == chunks - 1) {
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int j = 0; j < NX; j++) {
#pragma unroll
                    for (int o = 16; o > 0; o >>= 1)
                        acc[r][j] += __shfl_xor_sync(0xffffffffu, acc[r][j], o);
                }
            if (lane == 0)
#pragma unroll
                for (int j = 0; j < NX; j++)
                    if (j < job.nx)
#pragma unroll
                        for (int r = 0; r < OUT; r++)
                            gemv1_emit<GLU, R>(job, blk, r, j, acc[r][j],
                                               GLU ? acc[OUT + r][j] : 0.0f);
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int j = 0; j < NX; j++) acc[r][j] = 0.0f;
        }
        blk = nblk, ch = nch;
        return true;
    };
    while (step(A, B) && step(B, A)) {
    }
}

template <int BITS, bool GLU, typename S, int NX>
static int gemv2_launch(cuda_backend *c, gemv1_job job, base_err *err) {
    auto kernel = gemv2_kernel<BITS, GLU, S, NX>;
    const size_t smem = gemv2_smem<BITS, NX>(job.units);
    /* Resident CTAs per SM, for the last shared-memory size asked. */
    static size_t last_smem;
    static int per_sm;
    if (per_sm == 0 || last_smem != smem) {
        cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             GEMV2_MAX_SMEM);
        if (e == cudaSuccess)
            e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, GEMV2_WARPS * 32,
                                                              smem);
        if (e != cudaSuccess)
            return base_fail(err, "cuda: matmul: register-pipelined GEMV: %s",
                             cudaGetErrorString(e));
        if (per_sm < 1) per_sm = 1;
        last_smem = smem;
    }
    job.steps = (job.rows + (GLU ? GEMV2_R / 2 : GEMV2_R) - 1) / (GLU ? GEMV2_R / 2 : GEMV2_R);
    /* Every warp walks the same number of row blocks. */
    int64_t grid = (int64_t)per_sm * c->sm_count;
    const int64_t per_cta = (job.steps + GEMV2_WARPS - 1) / GEMV2_WARPS;
    if (grid > per_cta) grid = per_cta;
    const int64_t iters = (per_cta + grid - 1) / grid;
    grid = (per_cta + iters - 1) / iters;
    return cuda_launch_pdl(c, kernel, (unsigned)grid, GEMV2_WARPS * 32, smem,
                           "matmul (register-pipelined GEMV)", err, job);
}

template <int BITS, bool GLU, typename S>
static int gemv2_dispatch_nx(cuda_backend *c, const gemv1_job &job, base_err *err) {
    return job.nx == 1 ? gemv2_launch<BITS, GLU, S, 1>(c, job, err)
                       : gemv2_launch<BITS, GLU, S, 2>(c, job, err);
}

/* Units per thread and threads per CTA for a row of `units`: the fewest units per thread that
 * keep the CTA within GEMV1_MAX_THREADS. Returns 0 when no choice fits. */
static int gemv1_shape(int64_t units, int *threads) {
    for (int upt = 1; upt <= 4; upt *= 2) {
        int64_t k = ((units + upt - 1) / upt + 31) / 32 * 32;
        if (k <= GEMV1_MAX_THREADS) {
            *threads = (int)k;
            return upt;
        }
    }
    return 0;
}

bool cuda_gemv1_fits(const be_tensor *x, const be_linear *w) {
    /* Past 16 rows cuda_gemv1 takes slices of 16 rows, each on the tensor-core kernel (a last
     * slice of one or two rows on this one), until the GEMM path starts. */
    if (x->rows > CUDA_GEMV_MAX_ROWS) {
        be_tensor slice = *x;
        slice.rows = CUDA_GEMV_MAX_ROWS;
        return x->rows < CUDA_GEMM_MIN_ROWS && cuda_gemv_mma_fits(&slice, w) &&
               cuda_gemv1_fits(&slice, w);
    }
    int threads;
    return x->rows >= 1 && x->dtype == BASE_DTYPE_F32 && (w->bits == 4 || w->bits == 8) &&
           (w->in * w->bits) % 128 == 0 &&
           (w->group_size == 32 || w->group_size == 64 || w->group_size == 128) &&
           w->in % w->group_size == 0 && ((uintptr_t)w->weight & 15) == 0 &&
           ((uintptr_t)x->data & 15) == 0 && ((uintptr_t)w->scales & 3) == 0 &&
           ((uintptr_t)w->biases & 3) == 0 && cuda_float_dtype(w->dtype) &&
           (!w->bias || cuda_float_dtype(w->bias_dtype)) &&
           gemv1_shape(w->in * w->bits / 128, &threads) != 0;
}

template <int BITS, int UPT, bool GLU, typename S, int NX>
static int gemv1_launch(cuda_backend *c, gemv1_job job, int threads, base_err *err) {
    auto kernel = gemv1_kernel<BITS, UPT, GLU, S, NX>;
    const size_t smem = gemv1_smem<UPT>(threads);
    /* Resident CTAs per SM for each CTA size (a multiple of 32 up to the maximum). */
    static int resident[GEMV1_MAX_THREADS / 32 + 1];
    int &per_sm = resident[threads / 32];
    if (per_sm == 0) {
        cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)gemv1_smem<UPT>(GEMV1_MAX_THREADS));
        if (e == cudaSuccess)
            e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem);
        if (e != cudaSuccess)
            return base_fail(err, "cuda: matmul: single-row GEMV of %d threads: %s", threads,
                             cudaGetErrorString(e));
        if (per_sm < 1) per_sm = 1;
    }
    const int per_step = GLU ? gemv1_rows<UPT>() / 2 : gemv1_rows<UPT>();
    job.steps = (job.rows + per_step - 1) / per_step;
    /* Every CTA walks the same number of steps, so no SM waits on a last partial wave. */
    int64_t grid = (int64_t)per_sm * c->sm_count;
    if (grid > job.steps) grid = job.steps;
    int64_t iters = (job.steps + grid - 1) / grid;
    grid = (job.steps + iters - 1) / iters;
    return cuda_launch_pdl(c, kernel, (unsigned)grid, threads, smem, "matmul (single-row GEMV)",
                           err, job);
}

/* Rows of x one pass holds in registers: two where a thread's slice is one unit, else one. */
static int gemv1_pass_rows(int upt) {
    return upt == 1 ? 2 : 1;
}

template <int BITS, bool GLU, typename S>
static int gemv1_dispatch_upt(cuda_backend *c, const gemv1_job &job, base_err *err) {
    int threads = 0;
    switch (gemv1_shape(job.units, &threads)) {
    case 1:
        return job.nx == 1 ? gemv1_launch<BITS, 1, GLU, S, 1>(c, job, threads, err)
                           : gemv1_launch<BITS, 1, GLU, S, 2>(c, job, threads, err);
    case 2:
        return gemv1_launch<BITS, 2, GLU, S, 1>(c, job, threads, err);
    default:
        return gemv1_launch<BITS, 4, GLU, S, 1>(c, job, threads, err);
    }
}

template <int BITS, bool GLU>
static int gemv1_dispatch_dt(cuda_backend *c, const gemv1_job &job, base_dtype dt, base_err *err) {
    switch (dt) {
    case BASE_DTYPE_F32:
        return gemv1_dispatch_upt<BITS, GLU, float>(c, job, err);
    case BASE_DTYPE_F16:
        return gemv1_dispatch_upt<BITS, GLU, __half>(c, job, err);
    default:
        return gemv1_dispatch_upt<BITS, GLU, __nv_bfloat16>(c, job, err);
    }
}

template <int BITS, bool GLU>
static int gemv2_dispatch_dt(cuda_backend *c, const gemv1_job &job, base_dtype dt, base_err *err) {
    switch (dt) {
    case BASE_DTYPE_F32:
        return gemv2_dispatch_nx<BITS, GLU, float>(c, job, err);
    case BASE_DTYPE_F16:
        return gemv2_dispatch_nx<BITS, GLU, __half>(c, job, err);
    default:
        return gemv2_dispatch_nx<BITS, GLU, __nv_bfloat16>(c, job, err);
    }
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

int cuda_gemv1(be_backend *be, const be_tensor *x, const be_linear *const *ws, be_tensor *const *ys,
               int n, bool glu, base_err *err) {
    if (x->rows > CUDA_GEMV_MAX_ROWS) {
        for (int64_t r0 = 0; r0 < x->rows; r0 += CUDA_GEMV_MAX_ROWS) {
            const int64_t rows =
                x->rows - r0 < CUDA_GEMV_MAX_ROWS ? x->rows - r0 : CUDA_GEMV_MAX_ROWS;
            const be_tensor xs = be_tensor_rows(x, r0, rows);
            be_tensor yv[3], *yp[3];
            for (int i = 0; i < (glu ? 1 : n); i++) {
                yv[i] = be_tensor_rows(ys[i], r0, rows);
                yp[i] = &yv[i];
            }
            if (cuda_gemv1(be, &xs, ws, yp, n, glu, err)) return -1;
        }
        return 0;
    }
    /* The tensor-core kernel reads W once for every row of x but costs more per weight: it
     * overtakes this one from CUDA_GEMV_MMA_ROWS rows. */
    const int pick = cuda_impl(be)->gemv_kernel;
    bool mma = pick == CUDA_GEMV_MMA || (pick == CUDA_GEMV_AUTO && x->rows >= CUDA_GEMV_MMA_ROWS);
    for (int i = 0; i < n; i++) mma = mma && cuda_gemv_mma_fits(x, ws[i]);
    if (mma) return cuda_gemv_mma(be, x, ws, ys, n, glu, err);
    const be_linear *w = ws[0];
    gemv1_job job = {};
    job.nm = n;
    job.x = (const float *)x->data;
    job.units = w->in * w->bits / 128;
    job.groups = w->in / w->group_size;
    int g_units = w->group_size / (128 / w->bits), shift = 0;
    while ((1 << shift) < g_units) shift++;
    job.gshift = shift;
    job.rows = cuda_gemv_mats(job.m, ws, ys, n, glu);
    if (job.rows == 0) return 0;
    cuda_backend *c = cuda_impl(be);
    int threads;
    const bool regs =
        pick == CUDA_GEMV_REGS &&
        (size_t)2 * gemv2_units(job.units) * (3 * (128 / w->bits) / 16 * 16 + 8) <= GEMV2_MAX_SMEM;
    const int per_pass = regs ? 2 : gemv1_pass_rows(gemv1_shape(job.units, &threads));
    for (int64_t r0 = 0; r0 < x->rows; r0 += per_pass) {
        gemv1_job pass = job;
        pass.nx = (int)(x->rows - r0 < per_pass ? x->rows - r0 : per_pass);
        pass.x = (const float *)be_tensor_rows(x, r0, 1).data;
        for (int i = 0; i < (glu ? 1 : n); i++) pass.m[i].y = be_tensor_rows(ys[i], r0, 1).data;
        int rc;
        if (regs && w->bits == 4)
            rc = glu ? gemv2_dispatch_dt<4, true>(c, pass, w->dtype, err)
                     : gemv2_dispatch_dt<4, false>(c, pass, w->dtype, err);
        else if (regs)
            rc = glu ? gemv2_dispatch_dt<8, true>(c, pass, w->dtype, err)
                     : gemv2_dispatch_dt<8, false>(c, pass, w->dtype, err);
        else if (w->bits == 4)
            rc = glu ? gemv1_dispatch_dt<4, true>(c, pass, w->dtype, err)
                     : gemv1_dispatch_dt<4, false>(c, pass, w->dtype, err);
        else
            rc = glu ? gemv1_dispatch_dt<8, true>(c, pass, w->dtype, err)
                     : gemv1_dispatch_dt<8, false>(c, pass, w->dtype, err);
        if (rc) return -1;
    }
    return 0;
}
