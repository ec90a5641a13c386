/* Matmul y [n, out] = x [n, in] W^T (+ bias) for dense F32/F16/BF16 weights and MLX affine
 * quantized weights (bits 2, 3, 4, 5, 6, 8; groups 32, 64, 128).
 *
 * Design: decode is bound by reading the weights once, so the kernel is a GEMV that serves up
 * to 16 rows of x in one pass over W. A warp owns GEMV_R output features; each lane walks the
 * input dimension in units (32 quantized values = `bits` words, which lie in one group, or 8
 * dense values = one 16-byte load), dequantizes the unit in registers and multiplies it into
 * every row of x, accumulating in F32; the warp sums its lanes at the end. 4- and 8-bit units
 * are whole 16-byte loads; 2 and 6 bits use 8-byte loads, 3 and 5 bits 4-byte loads.
 *
 * From CUDA_GEMM_MIN_ROWS rows of x (prefill, large decode batches) the GEMV's cost grows with the
 * rows (one pass over W per 16 rows, every multiply on the CUDA cores), so W is instead
 * dequantized once into a BF16 scratch and multiplied by cuBLAS on the tensor cores with F32
 * accumulation. That rounds each weight and input to BF16 (relative 2^-9), as a BF16 model's
 * inference does at every matmul.
 *
 * F32 rows below CUDA_GEMM_MIN_ROWS against 4- or 8-bit weights (decode) take the faster
 * kernels of cuda_gemv.cu and cuda_gemv_mma.cu, and CUDA_QGEMM_MIN_ROWS to CUDA_QGEMM_MAX_ROWS
 * rows against a packed copy the quantized GEMM of cuda_qgemm.cu, which reads W once and
 * writes nothing but y; cuBLAS on the dequantized W keeps the rows past it (prefill chunks),
 * where its faster tensor-core GEMM repays the dequantization. */
#include "backend/cuda/cuda_internal.h"

#include <string.h>

#define GEMV_WARPS  4
#define GEMV_R      2
#define GEMV_MAX_NR 16
/* CUDA_GEMM_MIN_ROWS, from which the dequantize + cuBLAS path runs: at 64 rows the GEMV reads
 * W four times, while the dequantization writes and re-reads 4 bytes per weight once. */

template <int N> __device__ __forceinline__ void load_words(const uint32_t *p, uint32_t *w) {
    if constexpr (N % 4 == 0) {
#pragma unroll
        for (int i = 0; i < N / 4; i++) {
            uint4 v = __ldg((const uint4 *)p + i);
            w[4 * i] = v.x;
            w[4 * i + 1] = v.y;
            w[4 * i + 2] = v.z;
            w[4 * i + 3] = v.w;
        }
    } else if constexpr (N % 2 == 0) {
#pragma unroll
        for (int i = 0; i < N / 2; i++) {
            uint2 v = __ldg((const uint2 *)p + i);
            w[2 * i] = v.x;
            w[2 * i + 1] = v.y;
        }
    } else {
#pragma unroll
        for (int i = 0; i < N; i++) w[i] = __ldg(p + i);
    }
}

/* Eight consecutive values of a 16-byte-aligned float array as float. */
__device__ __forceinline__ void load8(const void *p, base_dtype dt, size_t i, float *v) {
    if (dt == BASE_DTYPE_F32) {
        float4 a = __ldg((const float4 *)((const float *)p + i));
        float4 b = __ldg((const float4 *)((const float *)p + i) + 1);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
        v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
        return;
    }
    uint4 raw = __ldg((const uint4 *)((const uint16_t *)p + i));
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float2 f;
        if (dt == BASE_DTYPE_F16) {
            __half2 h;
            memcpy(&h, &w[k], sizeof h);
            f = __half22float2(h);
        } else {
            __nv_bfloat162 b;
            memcpy(&b, &w[k], sizeof b);
            f = __bfloat1622float2(b);
        }
        v[2 * k] = f.x;
        v[2 * k + 1] = f.y;
    }
}

/* q < 2^23 as float, exactly: placed in the mantissa of 2^23, then 2^23 subtracted. The
 * integer-to-float instruction runs at an eighth of the FMA rate; one per weight would cost an
 * 8B model's single-row step about 1.8 ms on an H200, more than reading its weights. */
__device__ __forceinline__ float small_u2f(uint32_t q) {
    return __uint_as_float(0x4B000000u | q) - 8388608.0f;
}

/* One quantized unit: 32 values of row o from word u * BITS, all in one group. `fetch` issues
 * the unit's loads, `decode` turns them into values, so that a lane can have several units'
 * loads in flight before it waits on any. */
template <int BITS> struct quant_unit {
    static constexpr int U = 32;
    struct raw_t {
        uint32_t w[BITS];
        float s, b;
    };
    const uint32_t *w;
    const void *scales, *biases;
    base_dtype dt;
    int64_t words_per_row, groups_per_row;
    int group_size;

    __device__ __forceinline__ void fetch(int64_t o, int64_t u, raw_t &r) const {
        load_words<BITS>(w + o * words_per_row + u * BITS, r.w);
        size_t g = (size_t)(o * groups_per_row + (u * 32) / group_size);
        r.s = cuda_load(scales, dt, g);
        r.b = cuda_load(biases, dt, g);
    }
    __device__ __forceinline__ void decode(const raw_t &r, float *out) const {
#pragma unroll
        for (int k = 0; k < 32; k++) {
            constexpr uint32_t mask = (1u << BITS) - 1u;
            const int bit = k * BITS, wi = bit >> 5, sh = bit & 31;
            uint32_t q = r.w[wi] >> sh;
            if (sh + BITS > 32) q |= r.w[wi + 1] << (32 - sh);
            out[k] = fmaf(r.s, small_u2f(q & mask), r.b);
        }
    }
};

/* One dense unit: 8 values of row o (16-byte aligned rows). */
template <base_dtype DT> struct dense_unit {
    static constexpr int U = 8;
    struct raw_t {
        float v[8];
    };
    const void *w;
    int64_t in;

    __device__ __forceinline__ void fetch(int64_t o, int64_t u, raw_t &r) const {
        load8(w, DT, (size_t)(o * in + u * 8), r.v);
    }
    __device__ __forceinline__ void decode(const raw_t &r, float *out) const {
#pragma unroll
        for (int k = 0; k < 8; k++) out[k] = r.v[k];
    }
};

/* Units a lane fetches before decoding any: 2 and 4 ran slower on the H200 (registers cost
 * resident warps; bench/RESULTS.md). A build may set it to measure again. */
#ifndef GEMV_UNROLL
#define GEMV_UNROLL 1
#endif

template <class Unit, int NR>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_kernel(Unit unit, int64_t units, int64_t out_features, const void *x, base_dtype x_dt,
                int64_t in, int nr, const void *bias, base_dtype bias_dt, void *y, base_dtype y_dt,
                int64_t y_stride, bool add) {
    constexpr int U = Unit::U;
    const int lane = threadIdx.x & 31;
    const int64_t o0 = ((int64_t)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5)) * GEMV_R;
    if (o0 >= out_features) return;
    float acc[GEMV_R][NR];
#pragma unroll
    for (int j = 0; j < GEMV_R; j++)
#pragma unroll
        for (int r = 0; r < NR; r++) acc[j][r] = 0.0f;

    for (int64_t ub = lane; ub < units; ub += 32 * GEMV_UNROLL) {
        typename Unit::raw_t raw[GEMV_UNROLL][GEMV_R];
#pragma unroll
        for (int i = 0; i < GEMV_UNROLL; i++)
#pragma unroll
            for (int j = 0; j < GEMV_R; j++) {
                raw[i][j] = {};
                if (ub + i * 32 < units && o0 + j < out_features)
                    unit.fetch(o0 + j, ub + i * 32, raw[i][j]);
            }
#pragma unroll
        for (int i = 0; i < GEMV_UNROLL; i++) {
            const int64_t u = ub + i * 32;
            if (u >= units) break;
            float w[GEMV_R][U];
#pragma unroll
            for (int j = 0; j < GEMV_R; j++) unit.decode(raw[i][j], w[j]);
#pragma unroll
            for (int r = 0; r < NR; r++) {
                if (r >= nr) break;
#pragma unroll
                for (int kc = 0; kc < U / 8; kc++) {
                    float xv[8];
                    load8(x, x_dt, (size_t)(r * in + u * U + kc * 8), xv);
#pragma unroll
                    for (int k = 0; k < 8; k++)
#pragma unroll
                        for (int j = 0; j < GEMV_R; j++)
                            acc[j][r] = fmaf(w[j][kc * 8 + k], xv[k], acc[j][r]);
                }
            }
        }
    }
#pragma unroll
    for (int j = 0; j < GEMV_R; j++) {
#pragma unroll
        for (int r = 0; r < NR; r++) {
            float v = cuda_warp_sum(acc[j][r]);
            if (lane == 0 && r < nr && o0 + j < out_features) {
                if (bias) v += cuda_load(bias, bias_dt, (size_t)(o0 + j));
                const size_t i = (size_t)(r * y_stride + o0 + j);
                if (add) v = cuda_load(y, y_dt, i) + v;
                cuda_store(y, y_dt, i, v);
            }
        }
    }
}

/* Launches one pass per GEMV_MAX_NR rows of x; NR is the smallest template that holds them. */
template <class Unit>
static int gemv_launch(be_backend *be, const Unit &unit, int64_t units, const be_tensor *x,
                       const be_linear *w, be_tensor *y, bool acc, base_err *err) {
    cudaStream_t s = cuda_impl(be)->stream;
    unsigned grid = (unsigned)((w->out + GEMV_WARPS * GEMV_R - 1) / (GEMV_WARPS * GEMV_R));
    size_t xs = base_dtype_size(x->dtype), ys = base_dtype_size(y->dtype);
    for (int64_t r0 = 0; r0 < x->rows; r0 += GEMV_MAX_NR) {
        int nr = (int)(x->rows - r0 < GEMV_MAX_NR ? x->rows - r0 : GEMV_MAX_NR);
        const char *xp = (const char *)x->data + (size_t)r0 * (size_t)w->in * xs;
        char *yp = (char *)y->data + (size_t)r0 * (size_t)w->out * ys;
#define GEMV_ARGS                                                                                  \
    unit, units, w->out, xp, x->dtype, w->in, nr, w->bias, w->bias_dtype, yp, y->dtype, w->out, acc
        if (nr == 1)
            gemv_kernel<Unit, 1><<<grid, GEMV_WARPS * 32, 0, s>>>(GEMV_ARGS);
        else if (nr <= 4)
            gemv_kernel<Unit, 4><<<grid, GEMV_WARPS * 32, 0, s>>>(GEMV_ARGS);
        else if (nr <= 8)
            gemv_kernel<Unit, 8><<<grid, GEMV_WARPS * 32, 0, s>>>(GEMV_ARGS);
        else
            gemv_kernel<Unit, 16><<<grid, GEMV_WARPS * 32, 0, s>>>(GEMV_ARGS);
#undef GEMV_ARGS
        if (cuda_check_launch("matmul", err)) return -1;
    }
    return 0;
}

template <int BITS>
static int quant_launch(be_backend *be, const be_tensor *x, const be_linear *w, be_tensor *y,
                        bool acc, base_err *err) {
    quant_unit<BITS> u;
    u.w = (const uint32_t *)w->weight;
    u.scales = w->scales;
    u.biases = w->biases;
    u.dt = w->dtype;
    u.words_per_row = w->in * BITS / 32;
    u.groups_per_row = w->in / w->group_size;
    u.group_size = w->group_size;
    return gemv_launch(be, u, w->in / 32, x, w, y, acc, err);
}

template <base_dtype DT>
static int dense_launch(be_backend *be, const be_tensor *x, const be_linear *w, be_tensor *y,
                        bool acc, base_err *err) {
    dense_unit<DT> u;
    u.w = w->weight;
    u.in = w->in;
    return gemv_launch(be, u, w->in / 8, x, w, y, acc, err);
}

/* W as BF16 [out, in], 8 values per thread with one 16-byte store (in % 8 == 0 and a group
 * holds a multiple of 8 values, so the 8 share a group). */
__global__ void dequant_bf16_kernel(be_linear w, __nv_bfloat16 *out) {
    const int64_t per_row = w.in / 8, n = w.out * per_row;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t o = i / per_row, c0 = (i % per_row) * 8;
        __align__(16) __nv_bfloat16 v[8];
        if (w.bits == 0) {
#pragma unroll
            for (int k = 0; k < 8; k++)
                v[k] =
                    __float2bfloat16_rn(cuda_load(w.weight, w.dtype, (size_t)(o * w.in + c0 + k)));
        } else {
            const uint32_t *row = (const uint32_t *)w.weight + o * (w.in * w.bits / 32);
            const size_t g = (size_t)(o * (w.in / w.group_size) + c0 / w.group_size);
            const float sc = cuda_load(w.scales, w.dtype, g), bi = cuda_load(w.biases, w.dtype, g);
#pragma unroll
            for (int k = 0; k < 8; k++)
                v[k] =
                    __float2bfloat16_rn(fmaf(sc, (float)cuda_quant_value(row, c0 + k, w.bits), bi));
        }
        *(uint4 *)(out + o * w.in + c0) = *(const uint4 *)v;
    }
}

__global__ void add_bias_kernel(void *y, base_dtype y_dt, int64_t rows, int64_t cols,
                                const void *bias, base_dtype bias_dt) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < rows * cols;
         i += (int64_t)gridDim.x * blockDim.x)
        cuda_store(y, y_dt, (size_t)i,
                   cuda_load(y, y_dt, (size_t)i) + cuda_load(bias, bias_dt, (size_t)(i % cols)));
}

/* x rounded to BF16 into out[0, n); with split, also the rounding's remainder into out[n, 2n),
 * so that hi + lo carries x to about 16 bits. */
__global__ void to_bf16_kernel(const void *x, base_dtype dt, int64_t n, bool split,
                               __nv_bfloat16 *out) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float v = cuda_load(x, dt, (size_t)i);
        const __nv_bfloat16 hi = __float2bfloat16_rn(v);
        out[i] = hi;
        if (split) out[n + i] = __float2bfloat16_rn(v - __bfloat162float(hi));
    }
}

int cuda_scratch(be_backend *be, void **buf, size_t *cap, size_t bytes, const char *what,
                 base_err *err) {
    if (bytes <= *cap) return 0;
    be->generation++;
    /* cudaFree waits for queued work that still reads the old buffer. */
    cudaFree(*buf);
    *buf = NULL;
    *cap = 0;
    cudaError_t e = cudaMalloc(buf, bytes);
    if (e != cudaSuccess)
        return base_fail(err, "cuda: %s: %zu bytes of scratch: %s", what, bytes,
                         cudaGetErrorString(e));
    *cap = bytes;
    return 0;
}

/* y = x W^T through cuBLAS, which sees W as column-major [in, out], x as [in, rows] and y as
 * [out, rows]. F32 weights with F32 x stay F32 (exact F32 GEMM); otherwise both operands go
 * to BF16 (W dequantized, x rounded, each in the backend's scratch unless BF16 already) for
 * the tensor cores, accumulating in F32; with acc, cuBLAS adds the product to y (beta 1).
 * Dense BF16 weights are exact in BF16, so x's rounding would be the product's only error
 * (8 bits, which puts Gemma 2's BF16 prefill past the fixtures' 2e-2): there x is split into
 * BF16 hi + lo and y = hi W^T + lo W^T, two GEMMs on the same W, when y is F32 to hold the sum. */
static int gemm_launch(be_backend *be, const be_tensor *x, const be_linear *w, be_tensor *y,
                       bool acc, base_err *err) {
    cuda_backend *c = cuda_impl(be);
    const void *a = w->weight, *b = x->data;
    cudaDataType_t t = CUDA_R_16BF;
    bool split = false;
    if (w->bits == 0 && w->dtype == BASE_DTYPE_F32 && x->dtype == BASE_DTYPE_F32) {
        t = CUDA_R_32F;
    } else {
        if (w->bits != 0 || w->dtype != BASE_DTYPE_BF16) {
            size_t bytes = (size_t)w->out * (size_t)w->in * sizeof(__nv_bfloat16);
            if (cuda_scratch(be, &c->wtmp, &c->wtmp_bytes, bytes, "matmul", err)) return -1;
            dequant_bf16_kernel<<<cuda_elem_grid(w->out * w->in / 8), 256, 0, c->stream>>>(
                *w, (__nv_bfloat16 *)c->wtmp);
            if (cuda_check_launch("matmul dequantize", err)) return -1;
            a = c->wtmp;
        }
        if (x->dtype != BASE_DTYPE_BF16) {
            int64_t n = x->rows * x->cols;
            split = w->bits == 0 && y->dtype == BASE_DTYPE_F32;
            if (cuda_scratch(be, &c->xtmp, &c->xtmp_bytes,
                             (size_t)n * (split ? 2 : 1) * sizeof(__nv_bfloat16), "matmul", err))
                return -1;
            to_bf16_kernel<<<cuda_elem_grid(n), 256, 0, c->stream>>>(x->data, x->dtype, n, split,
                                                                     (__nv_bfloat16 *)c->xtmp);
            if (cuda_check_launch("matmul input to BF16", err)) return -1;
            b = c->xtmp;
        }
    }
    cudaDataType_t yt = y->dtype == BASE_DTYPE_F32 ? CUDA_R_32F : CUDA_R_16BF;
    for (int part = 0; part < (split ? 2 : 1); part++) {
        const float alpha = 1.0f, beta = acc || part ? 1.0f : 0.0f;
        const void *bp = (const __nv_bfloat16 *)b + (size_t)part * x->rows * x->cols;
        cublasStatus_t st =
            cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)w->out, (int)x->rows, (int)w->in,
                         &alpha, a, t, (int)w->in, bp, t, (int)w->in, &beta, y->data, yt,
                         (int)w->out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS)
            return base_fail(err, "cuda: matmul: cuBLAS GEMM [%lld x %lld] x [%lld]: %s",
                             (long long)w->out, (long long)w->in, (long long)x->rows,
                             cublasGetStatusString(st));
    }
    if (w->bias) {
        add_bias_kernel<<<cuda_elem_grid(y->rows * y->cols), 256, 0, c->stream>>>(
            y->data, y->dtype, y->rows, y->cols, w->bias, w->bias_dtype);
        if (cuda_check_launch("matmul bias", err)) return -1;
    }
    return 0;
}

/* The GEMM path writes BF16 or F32 outputs and takes cuBLAS's int sizes. */
static bool gemm_fits(const be_tensor *x, const be_linear *w, const be_tensor *y) {
    return x->rows >= CUDA_GEMM_MIN_ROWS &&
           (y->dtype == BASE_DTYPE_BF16 || y->dtype == BASE_DTYPE_F32) && w->in <= INT32_MAX &&
           w->out <= INT32_MAX && x->rows <= INT32_MAX;
}

static bool aligned(const void *p, size_t a) {
    return ((uintptr_t)p & (a - 1)) == 0;
}

int cuda_matmul_check(const be_tensor *x, const be_linear *w, const be_tensor *y, base_err *err) {
    if (!cuda_float_dtype(x->dtype) || !cuda_float_dtype(y->dtype) || !cuda_float_dtype(w->dtype))
        return base_fail(err, "cuda: matmul: x, y and weights must be F32, F16 or BF16");
    if (w->bias && !cuda_float_dtype(w->bias_dtype))
        return base_fail(err, "cuda: matmul: bias dtype %s", base_dtype_name(w->bias_dtype));
    if (x->cols != w->in || y->cols != w->out || x->rows != y->rows)
        return base_fail(err, "cuda: matmul: x [%lld, %lld] W [%lld, %lld] y [%lld, %lld]",
                         (long long)x->rows, (long long)x->cols, (long long)w->out,
                         (long long)w->in, (long long)y->rows, (long long)y->cols);
    /* Units read x eight values at a time with 16-byte loads. */
    if (w->in % 8 || !aligned(x->data, 16))
        return base_fail(err, "cuda: matmul: input dim %lld (a multiple of 8, 16-byte aligned)",
                         (long long)w->in);
    return 0;
}

/* y = x W^T (+ bias), or y += that with acc. */
static int matmul_run(be_backend *be, const be_tensor *x, const be_linear *w, be_tensor *y,
                      bool acc, base_err *err) {
    if (cuda_matmul_check(x, w, y, err)) return -1;
    if (x->rows == 0 || w->out == 0) return 0;
    if (w->bits == 0) {
        if (!aligned(w->weight, 16))
            return base_fail(err, "cuda: matmul: dense weight is not 16-byte aligned");
        if (gemm_fits(x, w, y)) return gemm_launch(be, x, w, y, acc, err);
        switch (w->dtype) {
        case BASE_DTYPE_F32:
            return dense_launch<BASE_DTYPE_F32>(be, x, w, y, acc, err);
        case BASE_DTYPE_F16:
            return dense_launch<BASE_DTYPE_F16>(be, x, w, y, acc, err);
        default:
            return dense_launch<BASE_DTYPE_BF16>(be, x, w, y, acc, err);
        }
    }
    int g = w->group_size;
    if ((g != 32 && g != 64 && g != 128) || w->in % g)
        return base_fail(err, "cuda: matmul: group size %d for input dim %lld", g,
                         (long long)w->in);
    /* A unit of BITS words is loaded with the widest access its offsets allow. */
    size_t need = w->bits % 4 == 0 ? 16 : (w->bits % 2 == 0 ? 8 : 4);
    if (!aligned(w->weight, need))
        return base_fail(err, "cuda: matmul: %d-bit weight is not %zu-byte aligned", w->bits, need);
    if (cuda_gemv1_fits(cuda_impl(be), x, w)) {
        cuda_gemv_fuse fz = {};
        fz.acc = acc;
        return cuda_gemv1(be, x, &w, &y, 1, false, &fz, err);
    }
    if (w->bits >= 2 && w->bits <= 8 && w->bits != 7 && gemm_fits(x, w, y))
        return gemm_launch(be, x, w, y, acc, err);
    switch (w->bits) {
    case 2:
        return quant_launch<2>(be, x, w, y, acc, err);
    case 3:
        return quant_launch<3>(be, x, w, y, acc, err);
    case 4:
        return quant_launch<4>(be, x, w, y, acc, err);
    case 5:
        return quant_launch<5>(be, x, w, y, acc, err);
    case 6:
        return quant_launch<6>(be, x, w, y, acc, err);
    case 8:
        return quant_launch<8>(be, x, w, y, acc, err);
    default:
        return base_fail(err, "cuda: matmul: unsupported bits %d", w->bits);
    }
}

int cuda_matmul(be_backend *be, const be_tensor *x, const be_linear *w, be_tensor *y,
                base_err *err) {
    return matmul_run(be, x, w, y, false, err);
}

int cuda_matmul_add(be_backend *be, const be_tensor *x, const be_linear *w, be_tensor *y,
                    base_err *err) {
    const char *x0 = (const char *)x->data, *y0 = (const char *)y->data;
    const size_t xb = (size_t)(x->rows * x->cols) * base_dtype_size(x->dtype);
    const size_t yb = (size_t)(y->rows * y->cols) * base_dtype_size(y->dtype);
    if (x0 < y0 + yb && y0 < x0 + xb)
        return base_fail(err, "cuda: matmul_add: the output overlaps the input");
    return matmul_run(be, x, w, y, true, err);
}
