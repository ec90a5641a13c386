/* The single-row quantized GEMV of decode: y = x W^T for one F32 row of x, 4- or 8-bit MLX
 * affine weights, at the memory-bandwidth limit. The same kernel serves the fused matmuls:
 * up to three matrices that share x (Q, K and V) in one launch, and gate with up followed by
 * SiLU-mul.
 *
 * Design: a CTA of K threads covers one whole row of W, each thread a fixed k-slice of UPT
 * 16-byte units (32 4-bit or 16 8-bit values each, always inside one group). The thread loads
 * its slice of x into registers once and reuses it for every output row the CTA computes, so
 * x costs no memory traffic per weight; CTAs are persistent and walk R rows per step, issuing
 * all R * UPT 16-byte weight loads before using any. The affine form is folded:
 * sum_k (s q_k + b) x_k = s * dot(q, x) + b * sum(x), with sum(x) of each unit computed once.
 * A value q at bit 4j (or 8j) of a 16-bit half word becomes a float without a conversion
 * instruction: 0x4B000000 | (w & mask) is the float 2^23 + q * 2^(4j) exactly, so subtracting
 * 2^23 leaves q * 2^(4j), and x's slice is pre-scaled by 2^(-4j) once (exact: a power of two).
 * That is three instructions per weight (LOP3, FADD, FFMA). Each step's partial sums meet in a
 * warp shuffle and one shared-memory pass across the CTA's warps. */
#include "backend/cuda/cuda_internal.h"

#include <type_traits>

/* Output rows a CTA computes per step. */
#ifndef GEMV1_R
#define GEMV1_R 4
#endif
/* Most threads a CTA may have: the slice per thread grows instead. */
#define GEMV1_MAX_THREADS 256

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

template <typename S> __device__ __forceinline__ float ld_scale(const void *p, int64_t i) {
    return cuda_load(p,
                     std::is_same<S, float>::value
                         ? BASE_DTYPE_F32
                         : (std::is_same<S, __half>::value ? BASE_DTYPE_F16 : BASE_DTYPE_BF16),
                     (size_t)i);
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

template <int BITS, int UPT, bool GLU, typename S>
__global__ void __launch_bounds__(GEMV1_MAX_THREADS) gemv1_kernel(const gemv1_job job) {
    constexpr int WPU = 128 / BITS, R = GEMV1_R, OUT_PER_STEP = GLU ? R / 2 : R;
    constexpr int PER_HALF = 16 / BITS;
    __shared__ float red[2][GEMV1_MAX_THREADS / 32][R];
    const int t = threadIdx.x, K = blockDim.x, lane = t & 31, warp = t >> 5;

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

    int it = 0;
    for (int64_t step = blockIdx.x; step < job.steps; step += gridDim.x, it ^= 1) {
        uint4 q[R][UPT];
        float s[R][UPT], b[R][UPT];
#pragma unroll
        for (int r = 0; r < R; r++) {
            int64_t row;
            const uint4 *w;
            const void *sp, *bp;
            if (GLU) {
                row = step * OUT_PER_STEP + (r % OUT_PER_STEP);
                const int mi = r < OUT_PER_STEP ? 0 : 1;
                w = pick(job, mi, &gemv1_mat::w);
                sp = pick(job, mi, &gemv1_mat::s);
                bp = pick(job, mi, &gemv1_mat::b);
            } else {
                const int64_t g = step * R + r, e0 = job.m[0].out, e1 = e0 + job.m[1].out;
                const int mi = g < e0 ? 0 : (g < e1 ? 1 : 2);
                row = g < e0 ? g : (g < e1 ? g - e0 : g - e1);
                w = pick(job, mi, &gemv1_mat::w);
                sp = pick(job, mi, &gemv1_mat::s);
                bp = pick(job, mi, &gemv1_mat::b);
            }
            const bool live =
                (GLU ? step * OUT_PER_STEP + (r % OUT_PER_STEP) : step * R + r) < job.rows;
#pragma unroll
            for (int i = 0; i < UPT; i++) {
                const int64_t u = t + (int64_t)i * K;
                if (live && u < job.units) {
                    q[r][i] = __ldg(w + row * job.units + u);
                    const int64_t gi = row * job.groups + (u >> job.gshift);
                    s[r][i] = ld_scale<S>(sp, gi);
                    b[r][i] = ld_scale<S>(bp, gi);
                } else {
                    q[r][i] = make_uint4(0, 0, 0, 0);
                    s[r][i] = b[r][i] = 0.0f;
                }
            }
        }
        float acc[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            acc[r] = 0.0f;
#pragma unroll
            for (int i = 0; i < UPT; i++)
                acc[r] =
                    fmaf(s[r][i], unit_dot<BITS>(q[r][i], xs[i]), fmaf(b[r][i], sx[i], acc[r]));
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
            if (lane == 0) red[it][warp][r] = acc[r];
        }
        __syncthreads();
        if (t < OUT_PER_STEP) {
            const int nw = K >> 5;
            float v = 0.0f, v2 = 0.0f;
            for (int k = 0; k < nw; k++) {
                v += red[it][k][t];
                if (GLU) v2 += red[it][k][t + OUT_PER_STEP];
            }
            if (GLU) {
                const int64_t o = step * OUT_PER_STEP + t;
                if (o < job.rows) {
                    if (job.m[0].bias) v += cuda_load(job.m[0].bias, job.m[0].bias_dt, (size_t)o);
                    if (job.m[1].bias) v2 += cuda_load(job.m[1].bias, job.m[1].bias_dt, (size_t)o);
                    cuda_store(job.m[0].y, job.m[0].y_dt, (size_t)o, v / (1.0f + __expf(-v)) * v2);
                }
            } else {
                const int64_t g = step * R + t, e0 = job.m[0].out, e1 = e0 + job.m[1].out;
                if (g < job.rows) {
                    const int mi = g < e0 ? 0 : (g < e1 ? 1 : 2);
                    const int64_t row = g < e0 ? g : (g < e1 ? g - e0 : g - e1);
                    const void *bias = pick(job, mi, &gemv1_mat::bias);
                    if (bias) v += cuda_load(bias, pick(job, mi, &gemv1_mat::bias_dt), (size_t)row);
                    cuda_store(pick(job, mi, &gemv1_mat::y), pick(job, mi, &gemv1_mat::y_dt),
                               (size_t)row, v);
                }
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
           ((uintptr_t)x->data & 15) == 0 && cuda_float_dtype(w->dtype) &&
           (!w->bias || cuda_float_dtype(w->bias_dtype)) &&
           gemv1_shape(w->in * w->bits / 128, &threads) != 0;
}

template <int BITS, int UPT, bool GLU, typename S>
static int gemv1_launch(cuda_backend *c, const gemv1_job &job, int threads, base_err *err) {
    auto kernel = gemv1_kernel<BITS, UPT, GLU, S>;
    /* Resident CTAs per SM for each CTA size (a multiple of 32 up to the maximum). */
    static int resident[GEMV1_MAX_THREADS / 32 + 1];
    int &per_sm = resident[threads / 32];
    if (per_sm == 0) {
        cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0);
        if (e != cudaSuccess || per_sm < 1) per_sm = 1;
    }
    /* Every CTA walks the same number of steps, so no SM waits on a last partial wave. */
    int64_t grid = (int64_t)per_sm * c->sm_count;
    if (grid > job.steps) grid = job.steps;
    int64_t iters = (job.steps + grid - 1) / grid;
    grid = (job.steps + iters - 1) / iters;
    kernel<<<(unsigned)grid, threads, 0, c->stream>>>(job);
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
    const int per_step = glu ? GEMV1_R / 2 : GEMV1_R;
    job.steps = (job.rows + per_step - 1) / per_step;
    if (job.steps == 0) return 0;
    cuda_backend *c = cuda_impl(be);
    if (w->bits == 4)
        return glu ? gemv1_dispatch_dt<4, true>(c, job, w->dtype, err)
                   : gemv1_dispatch_dt<4, false>(c, job, w->dtype, err);
    return glu ? gemv1_dispatch_dt<8, true>(c, job, w->dtype, err)
               : gemv1_dispatch_dt<8, false>(c, job, w->dtype, err);
}
