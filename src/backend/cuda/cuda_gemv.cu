/* The single-row quantized GEMV of decode: y = x W^T for one F32 row of x, 4- or 8-bit MLX
 * affine weights, at the memory-bandwidth limit. The same kernel serves the fused matmuls:
 * up to three matrices that share x (Q, K and V) in one launch, and gate with up followed by
 * SiLU-mul.
 *
 * Design: a CTA of K threads covers one whole row of W, each thread a fixed k-slice of UPT
 * 16-byte units (32 4-bit or 16 8-bit values each, always inside one group). The thread loads
 * its slice of x into registers once and reuses it for every output row the CTA computes, so
 * x costs no memory traffic per weight. CTAs are persistent and walk R rows per step.
 *
 * The kernel is bound by how many bytes are in flight, not by arithmetic: with the weights
 * loaded into registers, an H200 SM held about 28 KB in flight and the GEMV read 1.8 TB/s
 * whatever the arithmetic (a tensor-core variant measured the same). So each thread streams
 * its own units (and the words holding their scale and bias) into a private ring of D steps
 * in shared memory with cp.async, D - 1 steps ahead of the one it computes: about 128 KB per
 * SM in flight, and no barrier is needed since a thread reads only what it copied.
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

__device__ __forceinline__ void cp_async4(void *dst, const void *src, bool ok) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(
                     (uint32_t)__cvta_generic_to_shared(dst)),
                 "l"(src), "r"(ok ? 4 : 0));
}

/* Up to three matrices of the same geometry sharing one x: rows [0, out) of the first, then
 * the second's, then the third's (PLAIN); or gate and up (GLU) where output row o is
 * silu(x . gate[o]) * (x . up[o]). */
struct gemv1_mat {
    const uint4 *w;    /* (out, units) */
    const void *s, *b; /* (out, groups) */
    const void *bias;  /* (out) or NULL */
    base_dtype bias_dt;
    void *y; /* (out) */
    base_dtype y_dt;
    int64_t out;
};

struct gemv1_job {
    gemv1_mat m[3];
    int nm;
    const float *x; /* (in) */
    int64_t units;  /* 16-byte units per row */
    int64_t groups; /* groups per row */
    int gshift;     /* unit index >> gshift = group index */
    int64_t rows;   /* PLAIN: sum of the outs; GLU: out */
    int64_t steps;  /* ceil(rows / rows per step) */
};

/* Field f of matrix i, selected without indexing the parameter array (which would copy it to
 * local memory). */
template <typename T>
__device__ __forceinline__ T pick(const gemv1_job &j, int i, T gemv1_mat::*f) {
    return i == 0 ? j.m[0].*f : (i == 1 ? j.m[1].*f : j.m[2].*f);
}

__device__ __forceinline__ float mag(uint32_t v) {
    return __uint_as_float(0x4B000000u | v) - 8388608.0f;
}

/* dot(q, x) of one unit: four words, each split into two 16-bit halves of 16 / BITS values. */
template <int BITS> __device__ __forceinline__ float unit_dot(uint4 q, const float *xs) {
    constexpr int PER_HALF = 16 / BITS;
    constexpr uint32_t M = (1u << BITS) - 1u;
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
    float d0 = 0.0f, d1 = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const uint32_t lo = w[k], hi = w[k] >> 16;
#pragma unroll
        for (int j = 0; j < PER_HALF; j++) {
            d0 = fmaf(mag(lo & (M << (BITS * j))), xs[k * 2 * PER_HALF + j], d0);
            d1 = fmaf(mag(hi & (M << (BITS * j))), xs[k * 2 * PER_HALF + PER_HALF + j], d1);
        }
    }
    return d0 + d1;
}

/* A scale or bias from the 4-byte word cp_async4 copied: the word itself for F32, else the
 * half of it that holds element i. */
template <typename S> __device__ __forceinline__ float scale_of(uint32_t word, int64_t i) {
    if (std::is_same<S, float>::value) return __uint_as_float(word);
    const uint16_t h = (uint16_t)(i & 1 ? word >> 16 : word & 0xFFFFu);
    if (std::is_same<S, __half>::value) return __half2float(__ushort_as_half(h));
    return __bfloat162float(__ushort_as_bfloat16(h));
}

/* Row h of step `step`: its matrix, its row there, and whether it exists. */
template <bool GLU, int R>
__device__ __forceinline__ int step_row(const gemv1_job &job, int64_t step, int h, int64_t *row) {
    constexpr int OUT_PER_STEP = GLU ? R / 2 : R;
    if (GLU) {
        *row = step * OUT_PER_STEP + (h % OUT_PER_STEP);
        return *row < job.rows ? (h < OUT_PER_STEP ? 0 : 1) : -1;
    }
    const int64_t g = step * R + h, e0 = job.m[0].out, e1 = e0 + job.m[1].out;
    *row = g < e0 ? g : (g < e1 ? g - e0 : g - e1);
    return g < job.rows ? (g < e0 ? 0 : (g < e1 ? 1 : 2)) : -1;
}

template <int BITS, int UPT, bool GLU, typename S>
__global__ void __launch_bounds__(GEMV1_MAX_THREADS) gemv1_kernel(const gemv1_job job) {
    constexpr int WPU = 128 / BITS, R = gemv1_rows<UPT>(), D = gemv1_depth<UPT>();
    constexpr int OUT_PER_STEP = GLU ? R / 2 : R, PER_HALF = 16 / BITS;
    constexpr int SB = sizeof(S) == 4 ? 4 : 2;
    extern __shared__ uint4 gemv1_ring[];
    __shared__ float red[2][GEMV1_MAX_THREADS / 32][R];
    const int t = threadIdx.x, K = blockDim.x, lane = t & 31, warp = t >> 5;
    /* Slot (d, r, i) of thread t: weights at wq[((d * R + r) * UPT + i) * K + t], the scale
     * and bias words at the same index of ws and wb: consecutive threads, consecutive words. */
    uint4 *wq = gemv1_ring;
    uint32_t *ws = (uint32_t *)(wq + D * R * UPT * K), *wb = ws + D * R * UPT * K;

    auto issue = [&](int64_t step, int d) {
        if (step < job.steps) {
#pragma unroll
            for (int r = 0; r < R; r++) {
                int64_t row;
                const int mi = step_row<GLU, R>(job, step, r, &row);
                const int ms = mi < 0 ? 0 : mi;
                const uint4 *w = pick(job, ms, &gemv1_mat::w);
                const char *sp = (const char *)pick(job, ms, &gemv1_mat::s);
                const char *bp = (const char *)pick(job, ms, &gemv1_mat::b);
#pragma unroll
                for (int i = 0; i < UPT; i++) {
                    const int64_t u = t + (int64_t)i * K;
                    const bool ok = mi >= 0 && u < job.units;
                    const int64_t gi = ok ? row * job.groups + (u >> job.gshift) : 0;
                    const int64_t off = SB == 4 ? gi * 4 : (gi & ~(int64_t)1) * 2;
                    const int slot = ((d * R + r) * UPT + i) * K + t;
                    cp_async16(&wq[slot], ok ? w + row * job.units + u : w, ok);
                    cp_async4(&ws[slot], sp + off, ok);
                    cp_async4(&wb[slot], bp + off, ok);
                }
            }
        }
        asm volatile("cp.async.commit_group;");
    };

    const int64_t grid = gridDim.x;
#pragma unroll
    for (int d = 0; d < D - 1; d++) issue(blockIdx.x + d * grid, d);

    float xs[UPT][WPU], sx[UPT];
#pragma unroll
    for (int i = 0; i < UPT; i++) {
        const int64_t u = t + (int64_t)i * K;
        sx[i] = 0.0f;
#pragma unroll
        for (int c = 0; c < WPU / 4; c++) {
            float4 v = u < job.units ? __ldg((const float4 *)(job.x + u * WPU) + c)
                                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            xs[i][4 * c] = v.x, xs[i][4 * c + 1] = v.y, xs[i][4 * c + 2] = v.z,
                      xs[i][4 * c + 3] = v.w;
        }
#pragma unroll
        for (int k = 0; k < WPU; k++) {
            sx[i] += xs[i][k];
            xs[i][k] *= __uint_as_float((127u - BITS * (k % PER_HALF)) << 23);
        }
    }

    int d = 0, par = 0;
    for (int64_t step = blockIdx.x; step < job.steps; step += grid, par ^= 1) {
        issue(step + (D - 1) * grid, d == 0 ? D - 1 : d - 1);
        asm volatile("cp.async.wait_group %0;" ::"n"(D - 1));
        float acc[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            int64_t row;
            const int mi = step_row<GLU, R>(job, step, r, &row);
            acc[r] = 0.0f;
#pragma unroll
            for (int i = 0; i < UPT; i++) {
                const int slot = ((d * R + r) * UPT + i) * K + t;
                const int64_t u = t + (int64_t)i * K;
                const int64_t gi = mi >= 0 ? row * job.groups + (u >> job.gshift) : 0;
                const float sc = scale_of<S>(ws[slot], gi), bi = scale_of<S>(wb[slot], gi);
                acc[r] = fmaf(sc, unit_dot<BITS>(wq[slot], xs[i]), fmaf(bi, sx[i], acc[r]));
            }
        }
        d = d == D - 1 ? 0 : d + 1;
#pragma unroll
        for (int r = 0; r < R; r++) {
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
            if (lane == 0) red[par][warp][r] = acc[r];
        }
        __syncthreads();
        if (t >= OUT_PER_STEP) continue;
        const int nw = K >> 5;
        float v = 0.0f, v2 = 0.0f;
        for (int k = 0; k < nw; k++) {
            v += red[par][k][t];
            if (GLU) v2 += red[par][k][t + OUT_PER_STEP];
        }
        if (GLU) {
            const int64_t o = step * OUT_PER_STEP + t;
            if (o < job.rows) {
                if (job.m[0].bias) v += cuda_load(job.m[0].bias, job.m[0].bias_dt, (size_t)o);
                if (job.m[1].bias) v2 += cuda_load(job.m[1].bias, job.m[1].bias_dt, (size_t)o);
                cuda_store(job.m[0].y, job.m[0].y_dt, (size_t)o, v / (1.0f + __expf(-v)) * v2);
            }
        } else {
            int64_t row;
            const int mi = step_row<GLU, R>(job, step, t, &row);
            if (mi >= 0) {
                const void *bias = pick(job, mi, &gemv1_mat::bias);
                if (bias) v += cuda_load(bias, pick(job, mi, &gemv1_mat::bias_dt), (size_t)row);
                cuda_store(pick(job, mi, &gemv1_mat::y), pick(job, mi, &gemv1_mat::y_dt),
                           (size_t)row, v);
            }
        }
    }
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
    int threads;
    return x->rows == 1 && x->dtype == BASE_DTYPE_F32 && (w->bits == 4 || w->bits == 8) &&
           (w->in * w->bits) % 128 == 0 &&
           (w->group_size == 32 || w->group_size == 64 || w->group_size == 128) &&
           w->in % w->group_size == 0 && ((uintptr_t)w->weight & 15) == 0 &&
           ((uintptr_t)x->data & 15) == 0 && ((uintptr_t)w->scales & 3) == 0 &&
           ((uintptr_t)w->biases & 3) == 0 && cuda_float_dtype(w->dtype) &&
           (!w->bias || cuda_float_dtype(w->bias_dtype)) &&
           gemv1_shape(w->in * w->bits / 128, &threads) != 0;
}

template <int BITS, int UPT, bool GLU, typename S>
static int gemv1_launch(cuda_backend *c, gemv1_job job, int threads, base_err *err) {
    auto kernel = gemv1_kernel<BITS, UPT, GLU, S>;
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
    kernel<<<(unsigned)grid, threads, smem, c->stream>>>(job);
    return cuda_check_launch("matmul (single-row GEMV)", err);
}

template <int BITS, bool GLU, typename S>
static int gemv1_dispatch_upt(cuda_backend *c, const gemv1_job &job, base_err *err) {
    int threads = 0;
    switch (gemv1_shape(job.units, &threads)) {
    case 1:
        return gemv1_launch<BITS, 1, GLU, S>(c, job, threads, err);
    case 2:
        return gemv1_launch<BITS, 2, GLU, S>(c, job, threads, err);
    default:
        return gemv1_launch<BITS, 4, GLU, S>(c, job, threads, err);
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

/* ---- tensor-core variant ---- */

#define GEMVT_WARPS 8
#ifndef GEMVT_D
#define GEMVT_D 4
#endif

template <int BITS> struct gemvt_cfg {
    static constexpr int CH = 128 / BITS; /* values per chunk (one 16-byte load of a row) */
    static constexpr int STEPS = CH / 4;  /* MMA k16 steps per kblock (four chunks) */
    static constexpr int XW = 2 * STEPS;  /* f16x2 words of x per chunk and half (hi or lo) */
};

__device__ __forceinline__ uint32_t h2_sub(uint32_t a, uint32_t b) {
    uint32_t r;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}

__device__ __forceinline__ uint32_t h2_fma(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t r;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}

__device__ __forceinline__ void mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* A chunk's values as exact f16 pairs in MMA step order: a[s][0] fills k-slots (2 tig, 2 tig
 * + 1) of step s, a[s][1] slots (2 tig + 8, 2 tig + 9). 0x6400 | v is the f16 1024 + v for
 * v < 1024, so one LOP3 and one f16x2 subtract (or FMA, for a nibble 4 bits up) make two
 * values. 4 bits: word d gives pairs (0,4), (1,5) to step 2d and (2,6), (3,7) to step 2d + 1;
 * 8 bits: word d gives (0,2), (1,3) to step d. */
template <int BITS>
__device__ __forceinline__ void gemvt_dequant(uint4 raw, uint32_t (&a)[gemvt_cfg<BITS>::STEPS][2]) {
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
    const uint32_t magic = 0x64006400u;
#pragma unroll
    for (int d = 0; d < 4; d++) {
        const uint32_t w8 = w[d] >> 8;
        if (BITS == 4) {
            a[2 * d][0] = h2_sub((w[d] & 0x000F000Fu) | magic, magic);
            a[2 * d][1] =
                h2_fma((w[d] & 0x00F000F0u) | magic, 0x2C002C00u /* 1/16 */, 0xD400D400u /* -64 */);
            a[2 * d + 1][0] = h2_sub((w8 & 0x000F000Fu) | magic, magic);
            a[2 * d + 1][1] = h2_fma((w8 & 0x00F000F0u) | magic, 0x2C002C00u, 0xD400D400u);
        } else {
            a[d][0] = h2_sub((w[d] & 0x00FF00FFu) | magic, magic);
            a[d][1] = h2_sub((w8 & 0x00FF00FFu) | magic, magic);
        }
    }
}

/* Position within its chunk of the first value of f16x2 word p of x (the second is 16 / BITS
 * further), matching gemvt_dequant's pairs. */
template <int BITS> __device__ __forceinline__ int gemvt_xpos(int p) {
    const int s = p >> 1, sel = p & 1;
    return BITS == 4 ? 8 * (s >> 1) + 2 * (s & 1) + sel : 4 * s + sel;
}

/* Tile row h (0..15) of tile `tile`: its matrix (-1 past the end) and its row there. GLU
 * tiles hold 8 gate rows, then the same 8 rows of up. */
template <bool GLU>
__device__ __forceinline__ int tile_row(const gemv1_job &job, int64_t tile, int h, int64_t *row) {
    if (GLU) {
        *row = tile * 8 + (h & 7);
        return *row < job.rows ? h >> 3 : -1;
    }
    const int64_t g = tile * 16 + h, e0 = job.m[0].out, e1 = e0 + job.m[1].out;
    *row = g < e0 ? g : (g < e1 ? g - e0 : g - e1);
    return g < job.rows ? (g < e0 ? 0 : (g < e1 ? 1 : 2)) : -1;
}

/* One F32 row of x against 4- or 8-bit weights on the tensor cores. A warp computes a tile of
 * 16 rows over its kpw kblocks (four chunks of each row); the CTA's warps split k and meet in
 * shared memory. Thread (g = lane / 4, tig = lane % 4) streams chunk tig of rows g and g + 8
 * (with their scale and bias words) through a private cp.async ring of GEMVT_D kblocks and
 * turns them into exact f16 A fragments. B carries x split into f16 hi + lo (22 bits, after
 * scaling x by a power of two that puts its largest value near 2^14) in 8 columns: column 2c
 * holds chunk c's hi part at the k-slots chunk c's values occupy and zeros elsewhere, column
 * 2c + 1 its lo part. So C's columns (2 tig, 2 tig + 1) are exactly dot(q, x) of the thread's
 * own chunk, which lies in one group: the thread applies that group's scale and bias
 * (s dot + b sum(x)) with nothing exchanged. */
template <int BITS, bool GLU, typename S>
__global__ void __launch_bounds__(GEMVT_WARPS * 32)
    gemvt_kernel(const gemv1_job job, int nkb, int kpw) {
    using C = gemvt_cfg<BITS>;
    constexpr int SB = sizeof(S) == 4 ? 4 : 2, T = GEMVT_WARPS * 32;
    extern __shared__ uint4 gemvt_smem[];
    /* Ring slot (d, h) of thread t: weights at rq[(d * 2 + h) * T + t], scale and bias words
     * at rs and rb with the same index. */
    uint4 *rq = gemvt_smem;
    uint32_t *rs = (uint32_t *)(rq + GEMVT_D * 2 * T), *rb = rs + GEMVT_D * 2 * T;
    uint32_t *xsm = rb + GEMVT_D * 2 * T;                      /* (nkb * 4, 2, XW) */
    float *sxm = (float *)(xsm + (size_t)nkb * 4 * 2 * C::XW); /* (nkb * 4) */
    __shared__ float red[2][GEMVT_WARPS][16];
    __shared__ float wmax[GEMVT_WARPS];
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5, g = lane >> 2, tig = lane & 3;
    const int64_t in = job.units * C::CH, nchunks = (int64_t)nkb * 4, grid = gridDim.x;
    const int kb_begin = warp * kpw;

    /* Work w of this thread: kblock kb_begin + w % kpw of tile blockIdx.x + (w / kpw) * grid. */
    auto issue = [&](int64_t w) {
        const int64_t tile = blockIdx.x + (w / kpw) * grid;
        const int64_t u = (int64_t)(kb_begin + (int)(w % kpw)) * 4 + tig;
        const int d = (int)(w % GEMVT_D);
        if (tile < job.steps) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int64_t row;
                const int mi = tile_row<GLU>(job, tile, g + 8 * h, &row);
                const int ms = mi < 0 ? 0 : mi;
                const bool ok = mi >= 0 && u < job.units;
                const int64_t gi = ok ? row * job.groups + (u >> job.gshift) : 0;
                const int64_t off = SB == 4 ? gi * 4 : (gi & ~(int64_t)1) * 2;
                const uint4 *wp = pick(job, ms, &gemv1_mat::w);
                const int slot = (d * 2 + h) * T + t;
                cp_async16(&rq[slot], ok ? wp + row * job.units + u : wp, ok);
                cp_async4(&rs[slot], (const char *)pick(job, ms, &gemv1_mat::s) + off, ok);
                cp_async4(&rb[slot], (const char *)pick(job, ms, &gemv1_mat::b) + off, ok);
            }
        }
        asm volatile("cp.async.commit_group;");
    };
#pragma unroll
    for (int w = 0; w < GEMVT_D - 1; w++) issue(w);

    float m = 0.0f;
    for (int64_t i = t; i < in; i += T) m = fmaxf(m, fabsf(job.x[i]));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) wmax[warp] = m;
    __syncthreads();
    m = 0.0f;
#pragma unroll
    for (int w = 0; w < GEMVT_WARPS; w++) m = fmaxf(m, wmax[w]);
    int e = m > 0.0f ? 14 - ilogbf(m) : 0;
    e = e < -100 ? -100 : (e > 100 ? 100 : e);
    const float up = ldexpf(1.0f, e), down = ldexpf(1.0f, -e);
    for (int64_t i = t; i < nchunks * C::XW; i += T) {
        const int64_t u = i / C::XW;
        const int p = (int)(i % C::XW), k0 = gemvt_xpos<BITS>(p);
        float v0 = 0.0f, v1 = 0.0f;
        if (u < job.units) {
            v0 = job.x[u * C::CH + k0] * up;
            v1 = job.x[u * C::CH + k0 + 16 / BITS] * up;
        }
        const __half h0 = __float2half_rn(v0), h1 = __float2half_rn(v1);
        const __half l0 = __float2half_rn(v0 - __half2float(h0));
        const __half l1 = __float2half_rn(v1 - __half2float(h1));
        const __half2 hi = __halves2half2(h0, h1), lo = __halves2half2(l0, l1);
        xsm[(u * 2) * C::XW + p] = *(const uint32_t *)&hi;
        xsm[(u * 2 + 1) * C::XW + p] = *(const uint32_t *)&lo;
    }
    for (int64_t u = t; u < nchunks; u += T) {
        float sum = 0.0f;
        if (u < job.units)
            for (int k = 0; k < C::CH; k++) sum += job.x[u * C::CH + k];
        sxm[u] = sum;
    }
    __syncthreads();

    const bool b_live = (g >> 1) == tig;
    const int b_half = g & 1;
    int64_t w = 0;
    int par = 0;
    for (int64_t tile = blockIdx.x; tile < job.steps; tile += grid, par ^= 1) {
        int64_t row[2];
        int mi[2];
#pragma unroll
        for (int h = 0; h < 2; h++) mi[h] = tile_row<GLU>(job, tile, g + 8 * h, &row[h]);
        float accd[2] = {0.0f, 0.0f}, accb[2] = {0.0f, 0.0f};
        for (int j = 0; j < kpw; j++, w++) {
            issue(w + GEMVT_D - 1);
            asm volatile("cp.async.wait_group %0;" ::"n"(GEMVT_D - 1));
            const int kb = kb_begin + j, d = (int)(w % GEMVT_D);
            if (kb >= nkb) continue;
            uint32_t bx[C::XW];
            if (b_live) {
                const uint4 *src =
                    (const uint4 *)(xsm + ((int64_t)(kb * 4 + tig) * 2 + b_half) * C::XW);
#pragma unroll
                for (int q = 0; q < C::XW / 4; q++) {
                    uint4 v = src[q];
                    bx[4 * q] = v.x, bx[4 * q + 1] = v.y, bx[4 * q + 2] = v.z, bx[4 * q + 3] = v.w;
                }
            } else {
#pragma unroll
                for (int q = 0; q < C::XW; q++) bx[q] = 0u;
            }
            uint32_t a0[C::STEPS][2], a1[C::STEPS][2];
            gemvt_dequant<BITS>(rq[(d * 2) * T + t], a0);
            gemvt_dequant<BITS>(rq[(d * 2 + 1) * T + t], a1);
            float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int st = 0; st < C::STEPS; st++)
                mma16816(c, a0[st][0], a1[st][0], a0[st][1], a1[st][1], bx[2 * st], bx[2 * st + 1]);
            const int64_t u = (int64_t)kb * 4 + tig;
            const float sx = sxm[u];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int64_t gi = mi[h] >= 0 ? row[h] * job.groups + (u >> job.gshift) : 0;
                const int slot = (d * 2 + h) * T + t;
                accd[h] = fmaf(scale_of<S>(rs[slot], gi), c[2 * h] + c[2 * h + 1], accd[h]);
                accb[h] = fmaf(scale_of<S>(rb[slot], gi), sx, accb[h]);
            }
        }
        float v[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            v[h] = fmaf(accd[h], down, accb[h]);
            v[h] += __shfl_xor_sync(0xffffffffu, v[h], 1);
            v[h] += __shfl_xor_sync(0xffffffffu, v[h], 2);
        }
        if (tig == 0) {
            red[par][warp][g] = v[0];
            red[par][warp][g + 8] = v[1];
        }
        __syncthreads();
        if (t >= (GLU ? 8 : 16)) continue;
        float a = 0.0f, b = 0.0f;
#pragma unroll
        for (int k = 0; k < GEMVT_WARPS; k++) {
            a += red[par][k][t];
            if (GLU) b += red[par][k][t + 8];
        }
        int64_t r;
        const int mo = tile_row<GLU>(job, tile, t, &r);
        if (mo < 0) continue;
        if (GLU) {
            if (job.m[0].bias) a += cuda_load(job.m[0].bias, job.m[0].bias_dt, (size_t)r);
            if (job.m[1].bias) b += cuda_load(job.m[1].bias, job.m[1].bias_dt, (size_t)r);
            cuda_store(job.m[0].y, job.m[0].y_dt, (size_t)r, a / (1.0f + __expf(-a)) * b);
        } else {
            const void *bias = pick(job, mo, &gemv1_mat::bias);
            if (bias) a += cuda_load(bias, pick(job, mo, &gemv1_mat::bias_dt), (size_t)r);
            cuda_store(pick(job, mo, &gemv1_mat::y), pick(job, mo, &gemv1_mat::y_dt), (size_t)r, a);
        }
    }
    asm volatile("cp.async.wait_group 0;");
}

template <int BITS> static size_t gemvt_smem(int nkb) {
    return (size_t)GEMVT_D * 2 * GEMVT_WARPS * 32 * 24 +
           (size_t)nkb * 4 * (2 * gemvt_cfg<BITS>::XW * 4 + 4);
}

template <int BITS, bool GLU, typename S>
static int gemvt_launch(cuda_backend *c, gemv1_job job, base_err *err) {
    auto kernel = gemvt_kernel<BITS, GLU, S>;
    const int nkb = (int)((job.units + 3) / 4);
    const int kpw = (nkb + GEMVT_WARPS - 1) / GEMVT_WARPS;
    const size_t smem = gemvt_smem<BITS>(nkb);
    static size_t smem_set = 0, per_sm_smem = 0;
    static int per_sm = 0;
    if (smem > smem_set) {
        cudaError_t e =
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess)
            return base_fail(err, "cuda: matmul: %zu bytes of shared memory for x: %s", smem,
                             cudaGetErrorString(e));
        smem_set = smem;
    }
    if (per_sm_smem != smem) {
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, GEMVT_WARPS * 32,
                                                          smem) != cudaSuccess ||
            per_sm < 1)
            per_sm = 1;
        per_sm_smem = smem;
    }
    job.steps = (job.rows + (GLU ? 7 : 15)) / (GLU ? 8 : 16);
    int64_t grid = (int64_t)per_sm * c->sm_count;
    if (grid > job.steps) grid = job.steps;
    int64_t iters = (job.steps + grid - 1) / grid;
    grid = (job.steps + iters - 1) / iters;
    kernel<<<(unsigned)grid, GEMVT_WARPS * 32, smem, c->stream>>>(job, nkb, kpw);
    return cuda_check_launch("matmul (single-row tensor-core GEMV)", err);
}

template <int BITS, bool GLU>
static int gemvt_dispatch(cuda_backend *c, const gemv1_job &job, base_dtype dt, base_err *err) {
    switch (dt) {
    case BASE_DTYPE_F32:
        return gemvt_launch<BITS, GLU, float>(c, job, err);
    case BASE_DTYPE_F16:
        return gemvt_launch<BITS, GLU, __half>(c, job, err);
    default:
        return gemvt_launch<BITS, GLU, __nv_bfloat16>(c, job, err);
    }
}

#ifndef GEMV_TC
#define GEMV_TC 0
#endif

int cuda_gemv1(be_backend *be, const be_tensor *x, const be_linear *const *ws, be_tensor *const *ys,
               int n, bool glu, base_err *err) {
    const be_linear *w = ws[0];
    gemv1_job job = {};
    job.nm = n;
    job.x = (const float *)x->data;
    job.units = w->in * w->bits / 128;
    job.groups = w->in / w->group_size;
    int g_units = w->group_size / (128 / w->bits), shift = 0;
    while ((1 << shift) < g_units) shift++;
    job.gshift = shift;
    for (int i = 0; i < n; i++) {
        const be_tensor *y = ys[glu ? 0 : i];
        job.m[i] = {(const uint4 *)ws[i]->weight,
                    ws[i]->scales,
                    ws[i]->biases,
                    ws[i]->bias,
                    ws[i]->bias_dtype,
                    y->data,
                    y->dtype,
                    ws[i]->out};
        job.rows += ws[i]->out;
    }
    if (glu) job.rows = w->out;
    if (job.rows == 0) return 0;
    cuda_backend *c = cuda_impl(be);
#if GEMV_TC
    if (w->bits == 4)
        return glu ? gemvt_dispatch<4, true>(c, job, w->dtype, err)
                   : gemvt_dispatch<4, false>(c, job, w->dtype, err);
    return glu ? gemvt_dispatch<8, true>(c, job, w->dtype, err)
               : gemvt_dispatch<8, false>(c, job, w->dtype, err);
#endif
    if (w->bits == 4)
        return glu ? gemv1_dispatch_dt<4, true>(c, job, w->dtype, err)
                   : gemv1_dispatch_dt<4, false>(c, job, w->dtype, err);
    return glu ? gemv1_dispatch_dt<8, true>(c, job, w->dtype, err)
               : gemv1_dispatch_dt<8, false>(c, job, w->dtype, err);
}
