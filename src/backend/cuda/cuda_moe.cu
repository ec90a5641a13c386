/* The CUDA backend's mixture-of-experts MLP (be_ops.moe), all on the device: no host round
 * trip, no synchronization and no allocation once the scratch has grown, so a decode step that
 * holds it still records as a graph. On the backend's stream, for at most as many (row, expert)
 * pairs as there are experts (decode):
 *
 * 1. route: the router logits into the scratch (one or two rows through the decode GEMV, more
 *    a warp per (row, expert) over many CTAs); then a warp per row takes the softmax over all
 *    experts in F32 and the top_k (cuda_moe_route, exactly as the CPU's route_row) and writes
 *    each (row, slot) pair's expert and weight into the scratch: in a kernel of its own, or as
 *    the decode GEMV's gate/up job starts.
 * 2. glu: act(x' gate_e^T) * (x' up_e^T) of each pair's expert e, into the scratch.
 * 3. down: down_e of each of the row's pairs and their weighted sum, in a fixed order, so that
 *    results are deterministic.
 *
 * For 4- and 8-bit affine and MXFP4 experts the decode GEMV serves glu and down (cuda_gemv1_moe):
 * its integer dots, weight chunks in flight and SMs filled however few the rows, with each row's
 * experts gathered by id (the warp-per-feature kernels here read 4-bit experts at 0.2 to 0.3
 * TB/s on the H200, bench/RESULTS.md). Other formats take those kernels: a warp per (pair,
 * feature) for glu, a warp per (row, output feature) for down summing the slots in order. That
 * reads an expert's weights once per pair routed to it. With more pairs than experts (prefill,
 * large decode batches) the pairs are first listed expert by expert (group), and glu and down
 * run per (expert, feature), a warp walking its expert's pairs MOE_CHUNK at a time so that each
 * weight, read once, meets all of them; down then writes each pair's output and a last kernel
 * (combine) takes each row's weighted sum, slot by slot.
 *
 * Weights of every format (dense F32/F16/BF16, MLX affine 2..8 bits, MXFP4) are read eight
 * values at a time and dequantized in registers straight from the stacked tensors. Every
 * product sums in F32 over the weights' exact values, as the CPU's op does: the router does
 * not go through cuda_matmul, whose tensor-core paths round x to 16 bits, because a near tie
 * of two experts would turn that rounding into another expert. */
#include "backend/cuda/cuda_internal.h"

#include <limits.h>

/* Warps of a CTA: each owns an output feature (glu, down) or a router logit. */
#define MOE_WARPS 8
/* Experts a router may have: a lane marks the experts it has chosen in one 32-bit mask. */
#define MOE_MAX_EXPERTS 1024
/* Pairs a warp of the grouped kernels serves per pass over its weight row. */
#define MOE_CHUNK 8
/* Threads of the one CTA that lists the pairs expert by expert. */
#define MOE_GROUP_THREADS 1024
/* Rows up to which the decode GEMV's MoE jobs serve their experts even with more pairs
 * than experts: reading an expert once per pair routed to it still beats the grouped kernels
 * here, which stay far from the bandwidth limit (bench/RESULTS.md). */
#define MOE_GEMV_ROWS 64

/* One linear layer as the kernels read it: rows are absolute rows of the stacked tensor. */
struct moe_mat {
    const void *w;     /* dense [rows, in] of dt, or packed words [rows, in * bits / 32] */
    const void *s, *b; /* [rows, in / group]: affine scales and biases of dt; MXFP4 scales U8 */
    const void *bias;  /* [rows] of bias_dt, or NULL */
    base_dtype dt, bias_dt;
    int bits, group;
    bool mxfp4;
    int64_t in;
};

static moe_mat moe_mat_of(const be_linear *l) {
    moe_mat m;
    m.w = l->weight;
    m.s = l->scales;
    m.b = l->biases;
    m.bias = l->bias;
    m.dt = l->dtype;
    m.bias_dt = l->bias_dtype;
    m.bits = l->bits;
    m.group = l->group_size;
    m.mxfp4 = l->bits && l->quant == BE_QUANT_MXFP4;
    m.in = l->in;
    return m;
}

/* An E2M1 magnitude (3 bits: exponent 2, mantissa 1): 0, 0.5, 1, 1.5, 2, 3, 4, 6. */
__device__ __forceinline__ float moe_e2m1(uint32_t q) {
    const uint32_t e = q >> 1, m = q & 1u;
    if (e == 0) return 0.5f * (float)m;
    return ldexpf(1.0f + 0.5f * (float)m, (int)e - 1);
}

/* Values [c0, c0 + 8) of row `row` of m (c0 a multiple of 8, so the eight share a group). */
__device__ __forceinline__ void moe_load8(const moe_mat &m, int64_t row, int64_t c0, float *v) {
    if (m.bits == 0) {
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = cuda_load(m.w, m.dt, (size_t)(row * m.in + c0 + k));
        return;
    }
    const uint32_t *words = (const uint32_t *)m.w + row * (m.in * m.bits / 32);
    const size_t g = (size_t)(row * (m.in / m.group) + c0 / m.group);
    if (m.mxfp4) {
        /* Eight codes to a word, lowest nibble first; the group's scale is 2^(s - 127). */
        const uint32_t word = words[c0 / 8];
        const int ex = (int)((const uint8_t *)m.s)[g] - 127;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const uint32_t q = (word >> (4 * k)) & 15u;
            const float a = ldexpf(moe_e2m1(q & 7u), ex);
            v[k] = q & 8u ? -a : a;
        }
        return;
    }
    const float s = cuda_load(m.s, m.dt, g), b = cuda_load(m.b, m.dt, g);
    /* 4 and 8 bits: the eight codes are one word or two, taken whole (the same codes as
     * cuda_quant_value's, with one load per word instead of one per value). */
    if (m.bits == 4 || m.bits == 8) {
        const int per = 32 / m.bits;
        const uint32_t w0 = words[c0 / per], w1 = m.bits == 8 ? words[c0 / per + 1] : 0u;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const uint32_t q =
                m.bits == 4 ? (w0 >> (4 * k)) & 15u : ((k < 4 ? w0 : w1) >> (8 * (k & 3))) & 255u;
            v[k] = fmaf(s, (float)q, b);
        }
        return;
    }
#pragma unroll
    for (int k = 0; k < 8; k++) v[k] = fmaf(s, (float)cuda_quant_value(words, c0 + k, m.bits), b);
}

/* Row `row` of m times the vector at element x0 of x, summed over the warp: every lane gets
 * it. Lanes take eight values at a time. */
__device__ __forceinline__ float moe_dot(const moe_mat &m, int64_t row, const void *x,
                                         base_dtype x_dt, size_t x0) {
    const int lane = threadIdx.x & 31;
    float acc = 0.0f;
    /* Unrolled so that several steps' weight loads may be in flight at once: a warp walks only
     * a few steps of a row (with the word-wide 4-bit codes, under 10% faster on the H200). */
#pragma unroll 4
    for (int64_t c0 = (int64_t)lane * 8; c0 < m.in; c0 += 32 * 8) {
        float w[8];
        moe_load8(m, row, c0, w);
#pragma unroll
        for (int k = 0; k < 8; k++)
            acc = fmaf(w[k], cuda_load(x, x_dt, x0 + (size_t)(c0 + k)), acc);
    }
    return cuda_warp_sum(acc);
}

__device__ __forceinline__ float moe_bias(const moe_mat &m, int64_t row) {
    return m.bias ? cuda_load(m.bias, m.bias_dt, (size_t)row) : 0.0f;
}

/* Warp (blockIdx.y, warp) owns expert e of row r = blockIdx.x (rows on x, whose grid reaches
 * 2^31 - 1): lg[r, e] = x'[r] . router[e] + bias. The logits of a row spread over CTAs: one CTA
 * alone took 66 us a layer for 128 experts of 2048 (Qwen3-30B-A3B's router) on the H200. */
__global__ void __launch_bounds__(MOE_WARPS * 32)
    moe_logits_kernel(moe_mat router, const void *x, base_dtype x_dt, int n_experts, float *lg) {
    const int64_t e = (int64_t)blockIdx.y * MOE_WARPS + (threadIdx.x >> 5), r = blockIdx.x;
    if (e >= n_experts) return;
    const float v = moe_dot(router, e, x, x_dt, (size_t)r * (size_t)router.in);
    if ((threadIdx.x & 31) == 0) lg[r * n_experts + e] = v + moe_bias(router, e);
}

/* One warp per row r routes from the row's logits (cuda_moe_route). */
__global__ void __launch_bounds__(32) moe_route_kernel(const float *lg, int n_experts, int top_k,
                                                       bool norm_topk, int32_t *ids, float *wts) {
    const int64_t r = blockIdx.x;
    cuda_moe_route(lg + r * n_experts, n_experts, top_k, norm_topk, ids + r * top_k,
                   wts + r * top_k);
}

/* Warp (blockIdx.x, warp) owns intermediate feature i of pair p = blockIdx.y (at most
 * n_experts pairs take this path): h[p, i] = act(x'[row of p] . gate_e[i] + bias,
 * x' . up_e[i] + bias) for p's expert e. */
__global__ void __launch_bounds__(MOE_WARPS * 32)
    moe_glu_kernel(moe_mat gate, moe_mat up, const void *x, base_dtype x_dt, const int32_t *ids,
                   int top_k, int64_t inter, be_act act, float *h) {
    const int64_t i = (int64_t)blockIdx.x * MOE_WARPS + (threadIdx.x >> 5), p = blockIdx.y;
    if (i >= inter) return;
    const int64_t row = (int64_t)ids[p] * inter + i;
    const size_t x0 = (size_t)(p / top_k) * (size_t)gate.in;
    const float g = moe_dot(gate, row, x, x_dt, x0) + moe_bias(gate, row);
    const float u = moe_dot(up, row, x, x_dt, x0) + moe_bias(up, row);
    if ((threadIdx.x & 31) == 0) h[p * inter + i] = cuda_moe_act(act, g, u);
}

/* Warp (blockIdx.x, warp) owns output feature o of row r = blockIdx.y: y[r, o] = the sum over
 * the row's slots k, in order, of w_k * (h[p] . down_e[o] + bias). */
__global__ void __launch_bounds__(MOE_WARPS * 32)
    moe_down_kernel(moe_mat down, const float *h, const int32_t *ids, const float *wts, int top_k,
                    int64_t out, void *y, base_dtype y_dt) {
    const int64_t o = (int64_t)blockIdx.x * MOE_WARPS + (threadIdx.x >> 5), r = blockIdx.y;
    if (o >= out) return;
    float acc = 0.0f;
    for (int k = 0; k < top_k; k++) {
        const int64_t p = r * top_k + k, row = (int64_t)ids[p] * out + o;
        const float d = moe_dot(down, row, h, BASE_DTYPE_F32, (size_t)p * (size_t)down.in) +
                        moe_bias(down, row);
        acc += wts[p] * d;
    }
    if ((threadIdx.x & 31) == 0) cuda_store(y, y_dt, (size_t)(r * out + o), acc);
}

/* One CTA: the pairs of expert e are order[off[e] .. off[e + 1]), pair indices. Their order
 * within an expert is the atomics', which changes no value: each pair's sums are its own. */
__global__ void __launch_bounds__(MOE_GROUP_THREADS)
    moe_group_kernel(const int32_t *ids, int64_t pairs, int n_experts, int32_t *off,
                     int32_t *order) {
    __shared__ int32_t cnt[MOE_MAX_EXPERTS];
    for (int e = threadIdx.x; e < n_experts; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) atomicAdd(&cnt[ids[p]], 1);
    __syncthreads();
    if (threadIdx.x == 0) {
        int32_t run = 0;
        for (int e = 0; e < n_experts; e++) {
            const int32_t k = cnt[e];
            off[e] = run;
            cnt[e] = run;
            run += k;
        }
        off[n_experts] = run;
    }
    __syncthreads();
    for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x)
        order[atomicAdd(&cnt[ids[p]], 1)] = (int32_t)p;
}

/* CTA (feature block, expert e); warp (blockIdx.x, warp) owns feature i of e and walks e's
 * pairs MOE_CHUNK at a time, each weight value meeting every pair of the chunk, with each
 * pair's sums in moe_dot's order. Pair p's input is row p / x_div of x. GLU: out[p, i] =
 * act(gate . x + bias, up . x + bias) with a = gate, b = up; else out[p, i] = a . x + bias. */
template <bool GLU>
__global__ void __launch_bounds__(MOE_WARPS * 32)
    moe_grouped_kernel(moe_mat a, moe_mat b, const void *x, base_dtype x_dt, int x_div,
                       const int32_t *off, const int32_t *order, int64_t feats, be_act act,
                       float *out) {
    const int e = blockIdx.y, lane = threadIdx.x & 31;
    const int64_t i = (int64_t)blockIdx.x * MOE_WARPS + (threadIdx.x >> 5);
    if (i >= feats) return;
    const int32_t p0 = off[e], p1 = off[e + 1];
    const int64_t row = (int64_t)e * feats + i;
    for (int32_t c = p0; c < p1; c += MOE_CHUNK) {
        const int nc = p1 - c < MOE_CHUNK ? p1 - c : MOE_CHUNK;
        size_t x0[MOE_CHUNK];
        float acc_a[MOE_CHUNK], acc_b[MOE_CHUNK];
#pragma unroll
        for (int j = 0; j < MOE_CHUNK; j++) {
            x0[j] = (size_t)(order[c + (j < nc ? j : 0)] / x_div) * (size_t)a.in;
            acc_a[j] = acc_b[j] = 0.0f;
        }
        for (int64_t c0 = (int64_t)lane * 8; c0 < a.in; c0 += 32 * 8) {
            float wa[8], wb[8];
            moe_load8(a, row, c0, wa);
            if (GLU) moe_load8(b, row, c0, wb);
#pragma unroll
            for (int j = 0; j < MOE_CHUNK; j++) {
                if (j >= nc) break;
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    const float xv = cuda_load(x, x_dt, x0[j] + (size_t)(c0 + k));
                    acc_a[j] = fmaf(wa[k], xv, acc_a[j]);
                    if (GLU) acc_b[j] = fmaf(wb[k], xv, acc_b[j]);
                }
            }
        }
#pragma unroll
        for (int j = 0; j < MOE_CHUNK; j++) {
            if (j >= nc) break;
            const int64_t p = order[c + j];
            const float va = cuda_warp_sum(acc_a[j]) + moe_bias(a, row);
            float v = va;
            if (GLU) v = cuda_moe_act(act, va, cuda_warp_sum(acc_b[j]) + moe_bias(b, row));
            if (lane == 0) out[p * feats + i] = v;
        }
    }
}

/* y[r, o] = sum over the row's slots k, in order, of w_k * d[p, o], as moe_down_kernel sums. */
__global__ void moe_combine_kernel(const float *d, const float *wts, int top_k, int64_t rows,
                                   int64_t out, void *y, base_dtype y_dt) {
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < rows * out;
         t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = t / out, o = t % out;
        float acc = 0.0f;
        for (int k = 0; k < top_k; k++) {
            const int64_t p = r * top_k + k;
            acc += wts[p] * d[p * out + o];
        }
        cuda_store(y, y_dt, (size_t)t, acc);
    }
}

/* A matrix of the op the kernels can read, its `what` named in the error. */
static int check_mat(const be_linear *w, const char *what, base_err *err) {
    if (!w || !w->weight) return base_fail(err, "cuda: moe: the %s has no weight", what);
    if (w->in <= 0 || w->in % 8)
        return base_fail(err, "cuda: moe: the %s's input dim %lld is not a multiple of 8", what,
                         (long long)w->in);
    if (w->bias && !cuda_float_dtype(w->bias_dtype))
        return base_fail(err, "cuda: moe: the %s's bias dtype %s is not F32, F16 or BF16", what,
                         base_dtype_name(w->bias_dtype));
    if (w->bits == 0) {
        if (!cuda_float_dtype(w->dtype))
            return base_fail(err, "cuda: moe: the %s's dtype %s is not F32, F16 or BF16", what,
                             base_dtype_name(w->dtype));
        return 0;
    }
    if (w->quant == BE_QUANT_MXFP4) {
        if (w->bits != 4 || w->group_size != 32 || w->dtype != BASE_DTYPE_U8 || !w->scales ||
            w->biases)
            return base_fail(err,
                             "cuda: moe: the %s is mxfp4 with bits %d, group %d, %s scales%s; "
                             "it needs bits 4, group 32, U8 scales and no biases",
                             what, w->bits, w->group_size, base_dtype_name(w->dtype),
                             w->biases ? " and biases" : "");
        return 0;
    }
    if (w->quant != BE_QUANT_AFFINE)
        return base_fail(err, "cuda: moe: the %s has unknown quantization %d", what, (int)w->quant);
    if (w->bits != 2 && w->bits != 3 && w->bits != 4 && w->bits != 5 && w->bits != 6 &&
        w->bits != 8)
        return base_fail(err, "cuda: moe: the %s has %d bits (2, 3, 4, 5, 6 or 8)", what, w->bits);
    if ((w->group_size != 32 && w->group_size != 64 && w->group_size != 128) ||
        w->in % w->group_size)
        return base_fail(err, "cuda: moe: the %s's group size %d for input dim %lld", what,
                         w->group_size, (long long)w->in);
    if (!cuda_float_dtype(w->dtype) || !w->scales || !w->biases)
        return base_fail(err, "cuda: moe: the %s needs F32, F16 or BF16 scales and biases", what);
    return 0;
}

static int check_moe(const be_tensor *x, const be_moe *moe, const be_tensor *y, base_err *err) {
    if (!cuda_float_dtype(x->dtype) || !cuda_float_dtype(y->dtype))
        return base_fail(err, "cuda: moe: x is %s and y %s (F32, F16 or BF16)",
                         base_dtype_name(x->dtype), base_dtype_name(y->dtype));
    if (moe->n_experts < 1 || moe->n_experts > MOE_MAX_EXPERTS || moe->top_k < 1 ||
        moe->top_k > moe->n_experts || moe->inter < 1)
        return base_fail(err,
                         "cuda: moe: top %d of %d experts (at most %d) of %d intermediate "
                         "features",
                         moe->top_k, moe->n_experts, MOE_MAX_EXPERTS, moe->inter);
    if (moe->act != BE_ACT_SILU && moe->act != BE_ACT_GELU_TANH && moe->act != BE_ACT_SWIGLU_OAI)
        return base_fail(err, "cuda: moe: unknown activation %d", (int)moe->act);
    /* the routing kernels index the stacked experts by expert id: a rank's share is not
     * served here yet (issue 25) */
    if (moe->n_local != 0 && moe->n_local != moe->n_experts)
        return base_fail(err, "cuda: moe: a share of %d of %d experts is not served yet",
                         moe->n_local, moe->n_experts);
    if (check_mat(moe->router, "router", err) || check_mat(moe->gate, "experts' gate", err) ||
        check_mat(moe->up, "experts' up", err) || check_mat(moe->down, "experts' down", err))
        return -1;
    const be_linear *r = moe->router, *g = moe->gate, *u = moe->up, *d = moe->down;
    const int64_t E = moe->n_experts, I = moe->inter;
    if (r->out != E || r->in != x->cols || g->out != E * I || u->out != E * I || g->in != x->cols ||
        u->in != x->cols || d->in != I || d->out != E * y->cols || y->rows != x->rows)
        return base_fail(err,
                         "cuda: moe: router [%lld, %lld], gate [%lld, %lld], up [%lld, %lld], "
                         "down [%lld, %lld] do not fit %lld experts of %lld for x [%lld, %lld] "
                         "and y [%lld, %lld]",
                         (long long)r->out, (long long)r->in, (long long)g->out, (long long)g->in,
                         (long long)u->out, (long long)u->in, (long long)d->out, (long long)d->in,
                         (long long)E, (long long)I, (long long)x->rows, (long long)x->cols,
                         (long long)y->rows, (long long)y->cols);
    if (x->data == y->data) return base_fail(err, "cuda: moe: y may not alias x");
    return 0;
}

/* Grows the scratch to `bytes`, only outside a recording: a graph cannot hold the allocation,
 * and the step it would record must run once unrecorded first (model_graph.c records a step
 * the second time). */
static int moe_scratch_grow(be_backend *be, int64_t pairs, size_t bytes, base_err *err) {
    cuda_backend *c = cuda_impl(be);
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing(c->stream, &st);
    if (e != cudaSuccess)
        return base_fail(err, "cuda: moe: querying the stream's capture: %s",
                         cudaGetErrorString(e));
    if (st != cudaStreamCaptureStatusNone)
        return base_fail(err,
                         "cuda: moe: the scratch for %lld (row, expert) pairs must grow to %zu "
                         "bytes, which a recording cannot do",
                         (long long)pairs, bytes);
    return cuda_scratch(be, &c->moe_buf, &c->moe_bytes, bytes, "moe", err);
}

/* The scratch: h [pairs, inter] and d [pairs, out] F32 (d on the grouped path), the router
 * logits [rows, n_experts] F32, the pairs' weights (F32), experts (I32) and order (I32), the
 * experts' offsets (I32, n_experts + 1). */
struct moe_bufs {
    float *h, *d, *lg, *wts;
    int32_t *ids, *order, *off;
};

static size_t moe_scratch_bytes(int64_t rows, int64_t pairs, int64_t inter, int64_t out,
                                int n_experts) {
    return (size_t)pairs * ((size_t)(inter + out) * sizeof(float) + 3 * sizeof(int32_t)) +
           (size_t)rows * (size_t)n_experts * sizeof(float) +
           (size_t)(n_experts + 1) * sizeof(int32_t);
}

static int moe_scratch(be_backend *be, int64_t rows, int64_t pairs, int64_t inter, int64_t out,
                       int n_experts, moe_bufs *b, base_err *err) {
    cuda_backend *c = cuda_impl(be);
    const size_t bytes = moe_scratch_bytes(rows, pairs, inter, out, n_experts);
    if (bytes > c->moe_bytes && moe_scratch_grow(be, pairs, bytes, err)) return -1;
    b->h = (float *)c->moe_buf;
    b->d = b->h + pairs * inter;
    b->lg = b->d + pairs * out;
    b->wts = b->lg + rows * n_experts;
    b->ids = (int32_t *)(b->wts + pairs);
    b->order = b->ids + pairs;
    b->off = b->order + pairs;
    return 0;
}

int cuda_moe(be_backend *be, const be_tensor *x, const be_norm *norm, const be_moe *moe,
             be_tensor *y, base_err *err) {
    if (check_moe(x, moe, y, err)) return -1;
    const int64_t n = x->rows, inter = moe->inter, out = y->cols;
    const int K = moe->top_k, E = moe->n_experts;
    const int64_t pairs = n * K;
    if (n == 0) return 0;
    /* Which kernels take the rows: the decode GEMV's MoE jobs (gate/up routes as it starts, down
     * follows) and the router's logits for one or two rows on the decode GEMV (its integer dots
     * round x to 2^-23 of each unit's largest |x|, as fine as F32 sums: no tensor cores), or
     * the kernels below. */
    bool on_gemv = (pairs <= E || n <= MOE_GEMV_ROWS) && cuda_gemv1_moe_fits(x, moe);
    bool router_gemv = n <= 2 && cuda_gemv1_fits(cuda_impl(be), x, moe->router);
    /* When both are on the GEMV, the router's job and gate/up's take the norm as they digitize
     * x (times its weight, each output times 1/rms) instead of a kernel of its own before. */
    cuda_gemv_fuse fz = {};
    fz.act = moe->act;
    if (norm && on_gemv && router_gemv && cuda_gemv_norm_fits(norm->weight, x->cols)) {
        fz.norm = norm->weight->data;
        fz.norm_dt = norm->weight->dtype;
        fz.eps = norm->eps;
    } else if (norm) {
        if (be_norm_apart(be, norm, &x, "cuda: moe", err)) return -1;
        on_gemv = on_gemv && cuda_gemv1_moe_fits(x, moe);
        router_gemv = router_gemv && cuda_gemv1_fits(cuda_impl(be), x, moe->router);
    }
    if (pairs > INT32_MAX)
        return base_fail(err, "cuda: moe: %lld rows of %d experts each", (long long)n, K);
    moe_bufs b;
    if (moe_scratch(be, n, pairs, inter, out, E, &b, err)) return -1;
    cudaStream_t st = cuda_impl(be)->stream;

    if (router_gemv) {
        be_tensor lg = {b.lg, BASE_DTYPE_F32, n, E};
        be_tensor *lgp = &lg;
        if (cuda_gemv1(be, x, &moe->router, &lgp, 1, false, &fz, err)) return -1;
    } else {
        const dim3 lg_grid((unsigned)n, (unsigned)((E + MOE_WARPS - 1) / MOE_WARPS));
        moe_logits_kernel<<<lg_grid, MOE_WARPS * 32, 0, st>>>(moe_mat_of(moe->router), x->data,
                                                              x->dtype, E, b.lg);
        if (cuda_check_launch("moe router", err)) return -1;
    }
    if (on_gemv) {
        const cuda_moe_router route = {b.lg, E, moe->norm_topk};
        if (cuda_gemv1_moe(be, (const float *)x->data, n, moe->gate, moe->up, b.ids, b.wts, K,
                           inter, &fz, &route, b.h, BASE_DTYPE_F32, err))
            return -1;
        return cuda_gemv1_moe(be, b.h, n, moe->down, NULL, b.ids, b.wts, K, out, NULL, NULL,
                              y->data, y->dtype, err);
    }
    moe_route_kernel<<<(unsigned)n, 32, 0, st>>>(b.lg, E, K, moe->norm_topk, b.ids, b.wts);
    if (cuda_check_launch("moe route", err)) return -1;
    const moe_mat gate = moe_mat_of(moe->gate), up = moe_mat_of(moe->up),
                  down = moe_mat_of(moe->down);
    const unsigned inter_blocks = (unsigned)((inter + MOE_WARPS - 1) / MOE_WARPS),
                   out_blocks = (unsigned)((out + MOE_WARPS - 1) / MOE_WARPS);
    if (pairs <= E) {
        const dim3 glu_grid(inter_blocks, (unsigned)pairs);
        moe_glu_kernel<<<glu_grid, MOE_WARPS * 32, 0, st>>>(gate, up, x->data, x->dtype, b.ids, K,
                                                            inter, moe->act, b.h);
        if (cuda_check_launch("moe gate/up", err)) return -1;
        const dim3 down_grid(out_blocks, (unsigned)n);
        moe_down_kernel<<<down_grid, MOE_WARPS * 32, 0, st>>>(down, b.h, b.ids, b.wts, K, out,
                                                              y->data, y->dtype);
        return cuda_check_launch("moe down", err);
    }

    moe_group_kernel<<<1, MOE_GROUP_THREADS, 0, st>>>(b.ids, pairs, E, b.off, b.order);
    if (cuda_check_launch("moe group", err)) return -1;
    moe_grouped_kernel<true><<<dim3(inter_blocks, (unsigned)E), MOE_WARPS * 32, 0, st>>>(
        gate, up, x->data, x->dtype, K, b.off, b.order, inter, moe->act, b.h);
    if (cuda_check_launch("moe gate/up (grouped)", err)) return -1;
    moe_grouped_kernel<false><<<dim3(out_blocks, (unsigned)E), MOE_WARPS * 32, 0, st>>>(
        down, down, b.h, BASE_DTYPE_F32, 1, b.off, b.order, out, moe->act, b.d);
    if (cuda_check_launch("moe down (grouped)", err)) return -1;
    moe_combine_kernel<<<cuda_elem_grid(n * out), 256, 0, st>>>(b.d, b.wts, K, n, out, y->data,
                                                                y->dtype);
    return cuda_check_launch("moe combine", err);
}
