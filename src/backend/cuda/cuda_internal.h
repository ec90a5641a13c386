/* The CUDA backend's private parts shared by its .cu files (compiled as CUDA C by nvcc).
 *
 * Every op runs on the backend's one stream and returns once its kernels are queued; a launch
 * error is reported by the op that launched, an execution error by the next `sync`. Tensors
 * hold F32, F16 or BF16 and are read and written through cuda_load / cuda_store, so any
 * activation dtype meets any weight dtype; arithmetic is F32 throughout. */
#ifndef MLXCEL_BACKEND_CUDA_INTERNAL_H
#define MLXCEL_BACKEND_CUDA_INTERNAL_H

#ifdef __cplusplus
extern "C" {
#endif
#include "backend/backend.h"
#ifdef __cplusplus
}
#endif

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <limits.h>

typedef struct cuda_tmap cuda_tmap; /* cuda_attention.cu */

typedef struct cuda_backend {
    int device;
    int sm_count;
    cudaStream_t stream;
    cublasHandle_t blas; /* bound to `stream` */
    void *blas_ws;       /* (CUDA_BLAS_WORKSPACE) cuBLAS's workspace, fixed so graphs can hold it */
    int att_stages;      /* paged attention: shared-memory pipeline depth in pages (2..5) */
    void *wtmp;          /* (wtmp_bytes) a weight dequantized to BF16 for the GEMM path */
    size_t wtmp_bytes;
    void *xtmp; /* (xtmp_bytes) the GEMM path's input rows as BF16 */
    size_t xtmp_bytes;
    /* (tk_bytes) topk_candidates' requests, adjustments and outputs; kept apart from
     * cuda_scratch because no recording names it, so growing it leaves recordings valid */
    void *tk_buf;
    void *tk_host; /* (tk_bytes) their page-locked host mirror */
    size_t tk_bytes;
    void *ftmp; /* (ftmp_bytes) up's output when gate and up are not fused in one GEMV */
    size_t ftmp_bytes;
    int pdl; /* programmatic dependent launch: 0 not yet decided, 1 on, -1 off */
    /* (qg_bytes) the quantized GEMM's split-tile counters, prepared x and partial sums */
    void *qg_buf;
    size_t qg_bytes;
    /* (gmma_bytes) the tensor-core GEMV's m-block counters and partial sums */
    void *gmma_buf;
    size_t gmma_bytes;
    /* (wide_bytes) the wide decode attention's (row, kv head) counters and span partials */
    void *wide_buf;
    size_t wide_bytes;
    /* (moe_bytes) the moe op's routing and gate/up outputs, for the most (row, expert) pairs
     * of any call so far */
    void *moe_buf;
    size_t moe_bytes;
    /* Which decode GEMV cuda_gemv1 runs: CUDA_GEMV_AUTO, or one forced for benchmarks. */
    int gemv_kernel;
    /* (n_tmaps) tensor maps of KV pools for the decode attention's bulk tensor copies, and
     * the driver's cuTensorMapEncodeTiled that makes them */
    cuda_tmap *tmaps;
    int n_tmaps;
    void *tmap_encode;
} cuda_backend;

static inline cuda_backend *cuda_impl(be_backend *be) {
    return (cuda_backend *)be->impl;
}

/* Grows one of the backend's scratch buffers to at least `bytes` (cuda_matmul.cu); recorded
 * graphs that name the old buffer are stale from then on, which be->generation tells. */
int cuda_scratch(be_backend *be, void **buf, size_t *cap, size_t bytes, const char *what,
                 base_err *err);

/* Returns -1 with the CUDA error named when the last launch failed. */
int cuda_check_launch(const char *what, base_err *err);

/* Raises kern's dynamic shared-memory limit to smem where smem passes the 48 KB every kernel
 * may take without asking; errors name `what`. */
template <typename K>
static inline int cuda_smem_limit(K kern, size_t smem, const char *what, base_err *err) {
    if (smem <= 48 * 1024) return 0;
    cudaError_t e =
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess)
        return base_fail(err, "cuda: %s: %zu bytes of shared memory: %s", what, smem,
                         cudaGetErrorString(e));
    return 0;
}

/* kern<<<grid, threads, smem, st>>>(args) after cuda_smem_limit; errors name `what`. */
template <typename P>
static inline int cuda_launch_smem(void (*kern)(P), dim3 grid, int threads, size_t smem,
                                   cudaStream_t st, const P &args, const char *what,
                                   base_err *err) {
    if (cuda_smem_limit(kern, smem, what, err)) return -1;
    kern<<<grid, threads, smem, st>>>(args);
    return cuda_check_launch(what, err);
}

/* Programmatic dependent launch (sm_90 and later). A kernel launched through cuda_launch_pdl
 * may start while the kernel before it on the stream is still running: as soon as every CTA of
 * that one has called cuda_pdl_trigger or exited. Its launch latency and ramp-up, and whatever
 * it does first that depends on no earlier kernel (a GEMV's first weight loads), then overlap
 * the previous kernel's tail. So every kernel launched that way calls cuda_pdl_wait, in every
 * thread and on every path, before it reads what an earlier kernel wrote or writes what an
 * earlier kernel reads. The wait returns once the previous kernel has completed with its
 * writes visible; as that kernel waited the same way before it finished, all earlier ones have
 * too. What earlier kernels wrote is read after the wait through coherent loads, never the
 * non-coherent path (__ldg): this grid began before they finished, so that path may hold lines
 * from before their writes. Kernels launched plainly, or on devices before sm_90, find both
 * calls no-ops. */
__device__ __forceinline__ void cuda_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* Lets the next kernel launched through cuda_launch_pdl start once every CTA of this one has
 * called it; the caller's own work goes on. */
__device__ __forceinline__ void cuda_pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}

/* Whether launches through cuda_launch_pdl carry the attribute: on devices of compute
 * capability 9.0 and later unless MLXCEL_PDL=0 (to compare the two). On the H200, batch-1
 * decode of a Llama-3.1-8B-shaped 4-bit model (recorded steps): 264.5 tok/s without, 283.0
 * with. */
bool cuda_pdl_enabled(cuda_backend *c);

/* kern<<<grid, block, smem, c->stream>>>(args), allowed to overlap the kernel before it as
 * cuda_pdl_wait describes, with the launch's shared-memory carveout preference (percent of the
 * SM's shared memory, cudaLaunchAttributePreferredSharedMemoryCarveout; -1 leaves the driver's
 * choice); errors name `what`. */
template <typename... P, typename... A>
static inline int cuda_launch_pdl_carveout(cuda_backend *c, void (*kern)(P...), dim3 grid,
                                           dim3 block, size_t smem, int carveout, const char *what,
                                           base_err *err, A... args) {
    cudaLaunchAttribute attr[2];
    unsigned n = 0;
    if (cuda_pdl_enabled(c)) {
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (carveout >= 0) {
        attr[n].id = cudaLaunchAttributePreferredSharedMemoryCarveout;
        attr[n++].val.sharedMemCarveout = (unsigned)carveout;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->stream;
    cfg.attrs = attr;
    cfg.numAttrs = n;
    cudaError_t e = cudaLaunchKernelEx(&cfg, kern, args...);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return base_fail(err, "cuda: %s: launch failed: %s", what, cudaGetErrorString(e));
    }
    return cuda_check_launch(what, err);
}

/* cuda_launch_pdl_carveout with the driver's carveout. */
template <typename... P, typename... A>
static inline int cuda_launch_pdl(cuda_backend *c, void (*kern)(P...), dim3 grid, dim3 block,
                                  size_t smem, const char *what, base_err *err, A... args) {
    return cuda_launch_pdl_carveout(c, kern, grid, block, smem, -1, what, err, args...);
}

/* CTAs of 256 threads for a grid-stride loop over n elements. */
static inline unsigned cuda_elem_grid(int64_t n) {
    int64_t blocks = (n + 255) / 256;
    return (unsigned)(blocks < 1 ? 1 : (blocks < 65535 * 16 ? blocks : 65535 * 16));
}

/* Element i of a float array of dtype dt (F32, F16 or BF16), as float. */
__device__ __forceinline__ float cuda_load(const void *p, base_dtype dt, size_t i) {
    if (dt == BASE_DTYPE_F32) return ((const float *)p)[i];
    if (dt == BASE_DTYPE_F16) return __half2float(((const __half *)p)[i]);
    return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
}

__device__ __forceinline__ void cuda_store(void *p, base_dtype dt, size_t i, float v) {
    if (dt == BASE_DTYPE_F32)
        ((float *)p)[i] = v;
    else if (dt == BASE_DTYPE_F16)
        ((__half *)p)[i] = __float2half_rn(v);
    else
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
}

/* v as an array of dtype dt would store it. */
__device__ __forceinline__ float cuda_round(base_dtype dt, float v) {
    if (dt == BASE_DTYPE_F16) return __half2float(__float2half_rn(v));
    if (dt == BASE_DTYPE_BF16) return __bfloat162float(__float2bfloat16_rn(v));
    return v;
}

/* RoPE's angle at position pos and frequency inv_freq, as its sine and cosine times mscale:
 * F32 as the CPU computes it, with sincosf (not the fast intrinsic) so that large positions stay
 * accurate. Every RoPE kernel (plain, with the KV append, folded into the wide decode attention)
 * takes it and cuda_rope_rotate from here, so the fused paths rotate exactly as the plain one. */
__device__ __forceinline__ void cuda_rope_sincos(int32_t pos, float inv_freq, float mscale,
                                                 float *s, float *c) {
    sincosf((float)pos * inv_freq, s, c);
    *s *= mscale;
    *c *= mscale;
}

/* The pair (x[i], x[i + head_dim / 2]) rotated by the angle of cuda_rope_sincos. */
__device__ __forceinline__ float2 cuda_rope_rotate(float x1, float x2, float s, float c) {
    return make_float2(x1 * c - x2 * s, x2 * c + x1 * s);
}

/* A gated linear unit's activation of v (be_act), for the elementwise glu and the GEMVs'
 * gate/up epilogue alike, so that the fused and plain paths agree. SiLU with the fast exp, as
 * it always was; GELU-tanh with tanhf, whose accuracy the tails of the curve need. */
__device__ __forceinline__ float cuda_act(be_act act, float v) {
    if (act == BE_ACT_GELU_TANH)
        return 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
    return v / (1.0f + __expf(-v));
}

/* A mixture-of-experts GLU's activation of gate g times up u (be_act), with the CPU's formulas
 * (cpu_ops.c's ew_*), accurate expf included, so that the two backends' experts agree: both MoE
 * paths (cuda_moe.cu, the decode GEMV's MoE jobs) take it. */
__device__ __forceinline__ float cuda_moe_act(be_act act, float g, float u) {
    if (act == BE_ACT_SWIGLU_OAI) {
        g = fminf(g, 7.0f);
        u = fminf(fmaxf(u, -7.0f), 7.0f);
        return g / (1.0f + expf(-1.702f * g)) * (u + 1.0f);
    }
    if (act == BE_ACT_GELU_TANH)
        return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g))) * u;
    return g / (1.0f + expf(-g)) * u;
}

/* log2(e): the attention kernels take scores in the log2 domain (exp2f). */
#define CUDA_LOG2E 1.4426950408889634f

/* Values of a row a thread of the row kernels (RMSNorm, residual add + RMSNorm) keeps in
 * registers; a longer row's rest is read again from memory. */
#define CUDA_ROW_VPT 8

/* The norm weights a row kernel's thread keeps: w[t + k * nt] for k < CUDA_ROW_VPT (0 past the
 * row). They depend on no earlier kernel, so the kernels load them before their PDL wait. */
__device__ __forceinline__ void cuda_row_weights(const void *w, base_dtype w_dt, int64_t cols,
                                                 float *wv) {
    const int64_t t = threadIdx.x, nt = blockDim.x;
#pragma unroll
    for (int k = 0; k < CUDA_ROW_VPT; k++)
        wv[k] = t + k * nt < cols ? cuda_load(w, w_dt, (size_t)(t + k * nt)) : 0.0f;
}

/* y = x * inv * w over the row at base: the thread's first CUDA_ROW_VPT values of x and w from
 * registers (xv, wv), the rest of a longer row read again from x and w. */
__device__ __forceinline__ void cuda_row_store_normed(void *y, base_dtype y_dt, const void *x,
                                                      base_dtype x_dt, const void *w,
                                                      base_dtype w_dt, const float *xv,
                                                      const float *wv, size_t base, int64_t cols,
                                                      float inv) {
    const int64_t t = threadIdx.x, nt = blockDim.x;
#pragma unroll
    for (int k = 0; k < CUDA_ROW_VPT; k++)
        if (t + k * nt < cols) cuda_store(y, y_dt, base + t + k * nt, xv[k] * inv * wv[k]);
    for (int64_t c = t + CUDA_ROW_VPT * nt; c < cols; c += nt)
        cuda_store(y, y_dt, base + c, cuda_load(x, x_dt, base + c) * inv * cuda_load(w, w_dt, c));
}

/* 1/rms of a row of `cols` values whose squares sum to ss (in F32), as every RMSNorm here
 * computes it: the row kernels and the decode GEMVs' prologue. */
__device__ __forceinline__ float cuda_rms_inv(float ss, int64_t cols, float eps) {
    return rsqrtf(ss / (float)cols + eps);
}

/* N (4 or 8) consecutive values from element i of a float array of dtype dt that no kernel
 * writes while the reader runs (weights), through the non-coherent path: i * element size
 * and the array 8-byte (N = 4, 16-bit dtypes) or 16-byte aligned. */
template <int N>
__device__ __forceinline__ void cuda_load_ro(const void *p, base_dtype dt, size_t i, float *v) {
    if (dt == BASE_DTYPE_F32) {
#pragma unroll
        for (int k = 0; k < N / 4; k++) {
            const float4 a = __ldg((const float4 *)((const float *)p + i) + k);
            v[4 * k] = a.x, v[4 * k + 1] = a.y, v[4 * k + 2] = a.z, v[4 * k + 3] = a.w;
        }
        return;
    }
    uint32_t w[N / 2];
    if constexpr (N == 8) {
        const uint4 raw = __ldg((const uint4 *)((const uint16_t *)p + i));
        w[0] = raw.x, w[1] = raw.y, w[2] = raw.z, w[3] = raw.w;
    } else {
        const uint2 raw = __ldg((const uint2 *)((const uint16_t *)p + i));
        w[0] = raw.x, w[1] = raw.y;
    }
#pragma unroll
    for (int k = 0; k < N / 2; k++) {
        const uint16_t lo = (uint16_t)(w[k] & 0xFFFFu), hi = (uint16_t)(w[k] >> 16);
        if (dt == BASE_DTYPE_F16) {
            v[2 * k] = __half2float(__ushort_as_half(lo));
            v[2 * k + 1] = __half2float(__ushort_as_half(hi));
        } else {
            v[2 * k] = __bfloat162float(__ushort_as_bfloat16(lo));
            v[2 * k + 1] = __bfloat162float(__ushort_as_bfloat16(hi));
        }
    }
}

/* Sum over a warp; every lane gets it, in the same order. */
__device__ __forceinline__ float cuda_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Block-wide sum; every thread gets the total. Every thread of the block must call it. */
__device__ __forceinline__ float cuda_block_sum(float v) {
    __shared__ float part[32];
    v = cuda_warp_sum(v);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) part[warp] = v;
    __syncthreads();
    int nw = (blockDim.x + 31) >> 5;
    v = cuda_warp_sum(lane < nw ? part[lane] : 0.0f);
    __syncthreads();
    return v;
}

/* A row's routing from its router logits, by one whole warp: the softmax over all n_experts in
 * F32 and the top_k (renormalized with norm_topk), exactly as the CPU's route_row; lane 0 writes
 * the slots' experts rid[k] and weights rw[k] (global or shared memory). Expert e belongs to lane
 * e % 32 for the top-k, which picks, top_k times, the largest logit not yet taken, ties to the
 * lower expert: a NaN logit counts as -inf there (its row's weights are NaN whichever experts are
 * taken, as on the CPU), so every pick is a valid expert. n_experts <= 1024 (a lane marks its
 * taken experts in one 32-bit mask). */
__device__ __forceinline__ void cuda_moe_route(const float *logits, int n_experts, int top_k,
                                               bool norm_topk, int32_t *rid, float *rw) {
    const int lane = threadIdx.x & 31;
    /* max ignores NaN, as the CPU's comparison does */
    float mx = -INFINITY;
    for (int e = lane; e < n_experts; e += 32) mx = fmaxf(mx, logits[e]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.0f;
    for (int e = lane; e < n_experts; e += 32) sum += expf(logits[e] - mx);
    sum = cuda_warp_sum(sum);
    uint32_t taken = 0; /* bit j: expert lane + 32 j */
    float chosen = 0.0f;
    for (int k = 0; k < top_k; k++) {
        float bv = -INFINITY;
        int bi = INT_MAX;
        for (int j = 0, e = lane; e < n_experts; j++, e += 32) {
            const float v = logits[e] != logits[e] ? -INFINITY : logits[e];
            if (!(taken >> j & 1u) && (v > bv || (v == bv && e < bi))) bv = v, bi = e;
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
        }
        if ((bi & 31) == lane) taken |= 1u << (bi >> 5);
        if (lane == 0) {
            const float w = expf(logits[bi] - mx) / sum;
            rid[k] = bi;
            rw[k] = w;
            chosen += w;
        }
    }
    if (lane != 0 || !norm_topk) return;
    for (int k = 0; k < top_k; k++) rw[k] /= chosen;
}

/* The 1/rms of the row at base of x (cols values) in a row kernel, one block per row: the
 * thread's first CUDA_ROW_VPT values of it into v (0 past the row), for the kernel's own pass
 * after; a longer row's rest is read once here and again there. Every thread of the block must
 * call it. */
__device__ __forceinline__ float cuda_row_inv(const void *x, base_dtype x_dt, size_t base,
                                              int64_t cols, float eps, float *v) {
    const int64_t t = threadIdx.x, nt = blockDim.x;
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < CUDA_ROW_VPT; k++) {
        v[k] = t + k * nt < cols ? cuda_load(x, x_dt, base + t + k * nt) : 0.0f;
        ss += v[k] * v[k];
    }
    for (int64_t c = t + CUDA_ROW_VPT * nt; c < cols; c += nt) {
        const float u = cuda_load(x, x_dt, base + c);
        ss += u * u;
    }
    return cuda_rms_inv(cuda_block_sum(ss), cols, eps);
}

/* Value k of a row of MLX affine-quantized weights: the row's words are one little-endian bit
 * stream, value k at bits [k * bits, (k + 1) * bits); 3, 5 and 6 bits can straddle words. */
__device__ __forceinline__ uint32_t cuda_quant_value(const uint32_t *row, int64_t k, int bits) {
    uint64_t bit = (uint64_t)k * (uint64_t)bits;
    uint32_t w = (uint32_t)(bit >> 5), sh = (uint32_t)(bit & 31);
    uint32_t lo = row[w] >> sh;
    if (sh + (uint32_t)bits > 32) lo |= row[w + 1] << (32 - sh);
    return lo & ((1u << bits) - 1u);
}

static inline bool cuda_float_dtype(base_dtype dt) {
    return dt == BASE_DTYPE_F32 || dt == BASE_DTYPE_F16 || dt == BASE_DTYPE_BF16;
}

/* Ops, one .cu file each family; signatures as in be_ops. */
int cuda_embedding(be_backend *be, const be_linear *table, const be_tensor *ids, be_tensor *out,
                   base_err *err);
int cuda_matmul(be_backend *be, const be_tensor *x, const be_linear *w, be_tensor *y,
                base_err *err);
int cuda_rmsnorm(be_backend *be, const be_tensor *x, const be_tensor *weight, float eps,
                 be_tensor *y, base_err *err);
int cuda_add(be_backend *be, const be_tensor *a, const be_tensor *b, be_tensor *y, base_err *err);
int cuda_glu(be_backend *be, be_act act, const be_tensor *gate, const be_tensor *up, be_tensor *y,
             base_err *err);
int cuda_scale(be_backend *be, const be_tensor *x, float s, be_tensor *y, base_err *err);
int cuda_softcap(be_backend *be, const be_tensor *x, float cap, be_tensor *y, base_err *err);
int cuda_rope(be_backend *be, be_tensor *x, int n_heads, int head_dim, const be_tensor *positions,
              const be_tensor *inv_freq, float mscale, base_err *err);
int cuda_kv_append(be_backend *be, const be_kv_layer *layer, const be_tensor *k, const be_tensor *v,
                   const be_paged_batch *batch, base_err *err);
int cuda_attention(be_backend *be, const be_tensor *q, const be_kv_layer *layer,
                   const be_paged_batch *batch, const be_decode_plan *plan, int n_heads,
                   be_attn attn, be_tensor *out, base_err *err);
/* The arguments' checks of cuda_attention (head_dim, heads, pool dtype, q and out shapes, a
 * soft-cap and window that are not negative). */
int cuda_attention_check(const be_tensor *q, const be_kv_layer *layer, const be_paged_batch *batch,
                         int n_heads, be_attn attn, const be_tensor *out, base_err *err);
/* Decode attention for tiny grids (cuda_attention_wide.cu): every row a decode row, each (row,
 * kv head) split into spans over the SMs and merged by the last CTA of its spans, with attn's
 * scale, soft-cap, window and sinks. _fits says whether it serves the batch (head_dim 64, 128
 * or 256, few rows of few kv heads, rows, or their windows, short enough for its shared
 * memory); arguments as cuda_attention's, already validated by it. */
bool cuda_attention_wide_fits(be_backend *be, const be_kv_layer *layer, const be_paged_batch *batch,
                              int n_heads, be_attn attn);
int cuda_attention_wide(be_backend *be, const be_tensor *q, const be_kv_layer *layer,
                        const be_paged_batch *batch, int n_heads, be_attn attn, be_tensor *out,
                        base_err *err);
/* The rope_kv_attention op: RoPE of q and k, k and v's append and the attention in the wide
 * decode kernel where it serves the batch (q and k left as they were), else rope_kv_append
 * then cuda_attention. */
int cuda_rope_kv_attention(be_backend *be, be_tensor *q, be_tensor *k, const be_tensor *v,
                           const be_tensor *positions, const be_tensor *inv_freq, float mscale,
                           const be_kv_layer *layer, const be_paged_batch *batch,
                           const be_decode_plan *plan, int n_heads, be_attn attn, be_tensor *out,
                           base_err *err);
/* Tensor-core prefill attention (cuda_attention_prefill.cu): the rows of sequences with
 * q_len > 1, causal, through the pages, with attn's scale, soft-cap, window and sinks; decode
 * rows are left untouched. Serves what cuda_attention_prefill_fits accepts (head_dim 64, 128
 * or 256, F16 or BF16 pools, any block size and first-page offset); arguments as
 * cuda_attention's, already validated by it. */
bool cuda_attention_prefill_fits(const be_kv_layer *layer, const be_paged_batch *batch);
int cuda_attention_prefill(be_backend *be, const be_tensor *q, const be_kv_layer *layer,
                           const be_paged_batch *batch, int n_heads, be_attn attn, be_tensor *out,
                           base_err *err);
/* The same in launch shape `variant` (CUDA_PREFILL_VARIANTS of them: 4 warps at 2 or 3 CTAs
 * per SM, 8 warps), for benchmarks. */
#define CUDA_PREFILL_VARIANTS 3
int cuda_attention_prefill_variant(be_backend *be, const be_tensor *q, const be_kv_layer *layer,
                                   const be_paged_batch *batch, int n_heads, be_attn attn,
                                   be_tensor *out, int variant, base_err *err);
int cuda_argmax(be_backend *be, const be_tensor *logits, be_tensor *ids, base_err *err);
int cuda_topk_candidates(be_backend *be, const be_tensor *logits, const be_topk_row *reqs,
                         int n_req, const be_logit_adj *adj, int32_t *cand_id, float *cand_logit,
                         int32_t *n_cand, double *lse, base_err *err);
/* be_ops.moe (cuda_moe.cu): every expert format the backend knows, MXFP4 included. */
int cuda_moe(be_backend *be, const be_tensor *x, const be_norm *norm, const be_moe *moe,
             be_tensor *y, base_err *err);
int cuda_capture_begin(be_backend *be, base_err *err);
int cuda_capture_end(be_backend *be, be_graph **graph, base_err *err);
int cuda_graph_launch(be_backend *be, be_graph *graph, base_err *err);
void cuda_graph_free(be_backend *be, be_graph *graph);
int cuda_rmsnorm_add(be_backend *be, const be_tensor *d, const be_tensor *weight, float eps,
                     be_tensor *x, base_err *err);
int cuda_rmsnorm_pair(be_backend *be, const be_tensor *xa, const be_tensor *wa, be_tensor *ya,
                      const be_tensor *xb, const be_tensor *wb, be_tensor *yb, float eps,
                      base_err *err);
int cuda_add_rmsnorm(be_backend *be, be_tensor *x, const be_tensor *d, const be_tensor *weight,
                     float eps, be_tensor *y, base_err *err);
int cuda_matmul_qkv(be_backend *be, const be_tensor *x, const be_norm *norm,
                    const be_linear *const *ws, be_tensor *const *ys, base_err *err);
int cuda_matmul_glu(be_backend *be, const be_tensor *x, const be_norm *norm, const be_linear *gate,
                    const be_linear *up, be_act act, be_tensor *y, base_err *err);
int cuda_matmul_add(be_backend *be, const be_tensor *x, const be_linear *w, be_tensor *y,
                    base_err *err);
/* The arguments' checks of cuda_rope_kv_append, failing with the one at fault named. */
int cuda_rope_kv_check(const be_tensor *q, const be_tensor *k, const be_tensor *v,
                       const be_tensor *positions, const be_tensor *inv_freq,
                       const be_kv_layer *layer, const be_paged_batch *batch, base_err *err);
int cuda_rope_kv_append(be_backend *be, be_tensor *q, be_tensor *k, const be_tensor *v,
                        const be_tensor *positions, const be_tensor *inv_freq, float mscale,
                        const be_kv_layer *layer, const be_paged_batch *batch, base_err *err);

/* What the decode GEMVs fold around the product, in both kernels: an RMSNorm of each row of
 * x before it (x' = x * cuda_rms_inv(sum of x^2) * norm), and the output added to y instead of
 * stored (the residual add of o_proj and down_proj; not with glu). Both kernels multiply x by
 * the norm's weight as they load it and each output by its row's 1/rms at the end (a factor
 * per row of x commutes with the product): the sum of squares then meets the partial sums
 * where they meet anyway, with no barrier of its own before the product. */
struct cuda_gemv_fuse {
    const void *norm; /* (in) the norm's weight, 16-byte aligned, or NULL: x as is */
    base_dtype norm_dt;
    float eps;
    bool acc;   /* y += x' W^T (+ bias) */
    be_act act; /* glu jobs: the activation of gate's output (zero-initialized: SiLU) */
};

/* Whether the GEMVs take w [1, in] (or [in, 1]) as a norm weight for rows of in values. */
bool cuda_gemv_norm_fits(const be_tensor *w, int64_t in);

/* The decode GEMV (cuda_gemv.cu). cuda_gemv1_fits says whether it serves x [n, in] (n <= 16)
 * against w; cuda_gemv1 then computes ys[i] = x ws[i]^T (+ bias) for i < n (n <= 3, all of
 * one in, bits, group size and scales dtype, every one fitting, every out but the last a
 * multiple of 4), or, with glu (n == 2),
 * ys[0] = act(x ws[0]^T) * (x ws[1]^T) for two matrices of one out, act = fz->act (SiLU when fz
 * is NULL); with what fz folds in (fz NULL: nothing). */
bool cuda_gemv1_fits(const cuda_backend *c, const be_tensor *x, const be_linear *w);
int cuda_gemv1(be_backend *be, const be_tensor *x, const be_linear *const *ws, be_tensor *const *ys,
               int n, bool glu, const cuda_gemv_fuse *fz, base_err *err);
/* The routed experts of cuda_moe through the decode GEMV, for x [rows, in] F32 whose rows' top_k
 * experts and weights are ids and wts [rows, top_k] (device memory, written by an earlier kernel
 * on the stream; or, for gate and up with a router, written by this one from the router's
 * logits). With b (gate a, up b, stacked [experts feats, in]): h [rows, top_k, feats] F32
 * = act(x gate_e^T + bias, x up_e^T + bias) of each slot's expert e (cuda_moe_act). Without (a the
 * stacked down [experts feats, in], x [rows, top_k in]): y [rows, feats] of y_dt = the sum over
 * slots k of wts_k (x_k down_e^T + bias). fz (NULL: nothing) gives gate/up's activation and may
 * fold a norm into gate/up (fz.acc is not taken). cuda_gemv1_moe_fits says whether it serves
 * them: 4- or 8-bit affine or MXFP4 weights in rows of whole 16-byte units, gate and up alike. */
bool cuda_gemv1_moe_fits(const be_tensor *x, const be_moe *moe);
/* The router's side of a GLU job that routes as well (cuda_moe_route): logits lg [rows,
 * n_experts] F32 from an earlier kernel. */
struct cuda_moe_router {
    const float *lg;
    int n_experts;
    bool norm_topk;
};
int cuda_gemv1_moe(be_backend *be, const float *x, int64_t rows, const be_linear *a,
                   const be_linear *b, int32_t *ids, float *wts, int top_k, int64_t feats,
                   const cuda_gemv_fuse *fz, const cuda_moe_router *route, void *y, base_dtype y_dt,
                   base_err *err);
/* One matrix of a decode GEMV job, for both GEMV kernels (cuda_gemv.cu, cuda_gemv_mma.cu): up
 * to three share one x (Q, K and V), or gate and up pair for the GLU. */
struct cuda_gemv_mat {
    const void *w;     /* (out, in * bits / 8) packed weights */
    const void *s, *b; /* (out, groups) scales and biases */
    const void *bias;  /* (out) or NULL */
    base_dtype bias_dt;
    void *y; /* (rows of x, out); gate and up write the first's */
    base_dtype y_dt;
    int64_t out;
};

/* A decode GEMV of any row count as passes of at most `most` rows of x (and of each output),
 * each by `pass`, which takes cuda_gemv1's arguments. */
typedef int (*cuda_gemv_pass_fn)(be_backend *be, const be_tensor *x, const be_linear *const *ws,
                                 be_tensor *const *ys, int n, bool glu, const cuda_gemv_fuse *fz,
                                 base_err *err);
int cuda_gemv_in_slices(be_backend *be, const be_tensor *x, const be_linear *const *ws,
                        be_tensor *const *ys, int n, bool glu, const cuda_gemv_fuse *fz,
                        int64_t most, cuda_gemv_pass_fn pass, base_err *err);

/* Fills m[0..n) from cuda_gemv1's matrices and outputs; returns the output rows the job walks:
 * the sum of the outs, or gate's out for gate and up (glu). */
int64_t cuda_gemv_mats(cuda_gemv_mat *m, const be_linear *const *ws, be_tensor *const *ys, int n,
                       bool glu);

/* Field f of job.m[i], selected without indexing the parameter array (which would copy it to
 * local memory). */
template <typename J, typename T>
__device__ __forceinline__ T cuda_gemv_pick(const J &j, int i, T cuda_gemv_mat::*f) {
    return i == 0 ? j.m[0].*f : (i == 1 ? j.m[1].*f : j.m[2].*f);
}

/* Output `row` of matrix mi for row xr of x as y holds it when the job adds into y (j.fz.acc),
 * else 0. An earlier kernel wrote it, so it is read after the PDL wait, coherently; the kernels
 * read it ahead of their sums, so that its latency overlaps them. */
template <typename J>
__device__ __forceinline__ float cuda_gemv_prev(const J &j, int mi, int64_t xr, int64_t row) {
    if (!j.fz.acc) return 0.0f;
    return cuda_load(cuda_gemv_pick(j, mi, &cuda_gemv_mat::y),
                     cuda_gemv_pick(j, mi, &cuda_gemv_mat::y_dt),
                     (size_t)(xr * cuda_gemv_pick(j, mi, &cuda_gemv_mat::out) + row));
}

/* Stores v (+ the bias) as output `row` of matrix mi for row xr of x, or prev + that when the
 * job adds into y (prev from cuda_gemv_prev). */
template <typename J>
__device__ __forceinline__ void cuda_gemv_store(const J &j, int mi, int64_t xr, int64_t row,
                                                float v, float prev) {
    const void *bias = cuda_gemv_pick(j, mi, &cuda_gemv_mat::bias);
    if (bias) v += cuda_load(bias, cuda_gemv_pick(j, mi, &cuda_gemv_mat::bias_dt), (size_t)row);
    if (j.fz.acc) v = prev + v;
    cuda_store(cuda_gemv_pick(j, mi, &cuda_gemv_mat::y),
               cuda_gemv_pick(j, mi, &cuda_gemv_mat::y_dt),
               (size_t)(xr * cuda_gemv_pick(j, mi, &cuda_gemv_mat::out) + row), v);
}

/* Rows of x from which a quantized matmul dequantizes W to BF16 and multiplies with cuBLAS
 * (cuda_matmul.cu); below it the GEMVs serve the rows, CUDA_GEMV_MAX_ROWS a pass over W. */
#define CUDA_GEMM_MIN_ROWS 64
#define CUDA_GEMV_MAX_ROWS 32
/* Most rows of x the one-row kernel serves by itself (in passes of two): past them only the
 * tensor-core kernel fits. */
#define CUDA_GEMV_PAIR_ROWS 16

/* Which kernel cuda_gemv1 runs (cuda_backend.gemv_kernel): chosen by rows, or forced for
 * benchmarks: the one-row GEMV or the tensor-core GEMV (in passes over W below
 * CUDA_GEMM_MIN_ROWS rows, the dequantization and cuBLAS from there), the same without
 * either forced (no quantized GEMM), or the quantized GEMM at every row count it fits. */
enum { CUDA_GEMV_AUTO, CUDA_GEMV_ROWS, CUDA_GEMV_MMA, CUDA_GEMV_CUBLAS, CUDA_GEMV_QGEMM };
/* Rows of x from which CUDA_GEMV_AUTO takes the tensor-core kernel: on the H200 the one-row
 * kernel is faster at 1 and 2 rows, 4 and 8 bits alike (bench/bench_cuda_gemv.cu). */
#define CUDA_GEMV_MMA_ROWS 3
/* The tensor-core decode GEMV (cuda_gemv_mma.cu): one pass over 4- or 8-bit W for 1 to 32 F32
 * rows of x (16 with 4-bit groups of 32, more in passes of that many); arguments as cuda_gemv1's
 * (any out, no multiple of 4 needed), every ws[i] passing cuda_gemv_mma_fits: it reads the
 * packed copy (be_linear.packed) that cuda_pack_linear made. */
bool cuda_gemv_mma_fits(const be_tensor *x, const be_linear *w);
/* be_ops.pack_linear: the copy of a 4- or 8-bit affine weight the tensor-core GEMV streams. */
int cuda_pack_linear(be_backend *be, be_linear *w, base_err *err);
int cuda_gemv_mma(be_backend *be, const be_tensor *x, const be_linear *const *ws,
                  be_tensor *const *ys, int n, bool glu, const cuda_gemv_fuse *fz, base_err *err);
/* Rows of x the quantized GEMM (cuda_qgemm.cu) serves: from past the tensor-core GEMV's pass
 * to where cuBLAS on the dequantized W overtakes it (bench/bench_cuda_gemv.cu). */
#define CUDA_QGEMM_MIN_ROWS 33
#define CUDA_QGEMM_MAX_ROWS 128
/* Whether cuda_gemv1 gives `rows` rows of x to the quantized GEMM: CUDA_QGEMM_MIN_ROWS to
 * CUDA_QGEMM_MAX_ROWS, or any number when it is forced. */
static inline bool cuda_qgemm_takes(const cuda_backend *c, int64_t rows) {
    if (c->gemv_kernel == CUDA_GEMV_QGEMM) return rows >= 1;
    return c->gemv_kernel == CUDA_GEMV_AUTO && rows >= CUDA_QGEMM_MIN_ROWS &&
           rows <= CUDA_QGEMM_MAX_ROWS;
}
/* Whether the quantized GEMM can serve x [n, in] against w (its packed copy, 4 bits in groups of
 * 64 or 128 or 8 bits), at any n; cuda_qgemm then takes cuda_gemv1's arguments, every ws[i]
 * fitting and of one geometry. */
bool cuda_qgemm_fits(const be_tensor *x, const be_linear *w);
int cuda_qgemm(be_backend *be, const be_tensor *x, const be_linear *const *ws, be_tensor *const *ys,
               int n, bool glu, const cuda_gemv_fuse *fz, base_err *err);
/* Checks x, w and y of one matmul (dtypes, shapes, alignment) as cuda_matmul does. */
int cuda_matmul_check(const be_tensor *x, const be_linear *w, const be_tensor *y, base_err *err);

#endif
