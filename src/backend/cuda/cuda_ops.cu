/* Row and elementwise ops: embedding, RMSNorm, add, GLU, scale, soft-cap, RoPE, KV append,
 * argmax.
 *
 * These are memory-bound and small next to the matmuls and attention, so each is the plain
 * version: one thread per element, or one block per row where a row reduction is needed,
 * with F32 arithmetic whatever the tensor dtypes. Each is launched through cuda_launch_pdl and
 * lets the next kernel start at once, then waits for the previous one before touching memory:
 * what little they do has nothing to go ahead with. */
#include "backend/cuda/cuda_internal.h"

#define ROW_THREADS  256
#define ELEM_THREADS 256

static unsigned grid_for(int64_t n) {
    int64_t b = (n + ELEM_THREADS - 1) / ELEM_THREADS;
    return (unsigned)(b < 1 ? 1 : (b > 1048576 ? 1048576 : b));
}

static int check_float(const be_tensor *t, const char *name, base_err *err) {
    if (!cuda_float_dtype(t->dtype))
        return base_fail(err, "cuda: %s: dtype %s is not F32, F16 or BF16", name,
                         base_dtype_name(t->dtype));
    return 0;
}

static int same_shape(const be_tensor *a, const be_tensor *b, const char *what, base_err *err) {
    if (a->rows != b->rows || a->cols != b->cols)
        return base_fail(err, "cuda: %s: shape [%lld, %lld] vs [%lld, %lld]", what,
                         (long long)a->rows, (long long)a->cols, (long long)b->rows,
                         (long long)b->cols);
    return 0;
}

/* ---- embedding ---- */

__global__ void embedding_kernel(be_linear t, const int32_t *ids, int64_t n, void *out,
                                 base_dtype out_dt) {
    cuda_pdl_trigger();
    cuda_pdl_wait();
    int64_t total = n * t.in;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / t.in, c = i % t.in;
        int64_t id = ids[r];
        float v = 0.0f;
        if (id >= 0 && id < t.out) {
            if (t.bits == 0) {
                v = cuda_load(t.weight, t.dtype, (size_t)(id * t.in + c));
            } else {
                const uint32_t *row = (const uint32_t *)t.weight + id * (t.in * t.bits / 32);
                size_t g = (size_t)(id * (t.in / t.group_size) + c / t.group_size);
                v = cuda_load(t.scales, t.dtype, g) * (float)cuda_quant_value(row, c, t.bits) +
                    cuda_load(t.biases, t.dtype, g);
            }
        }
        cuda_store(out, out_dt, (size_t)i, v);
    }
}

int cuda_embedding(be_backend *be, const be_linear *table, const be_tensor *ids, be_tensor *out,
                   base_err *err) {
    if (ids->dtype != BASE_DTYPE_I32) return base_fail(err, "cuda: embedding: ids must be I32");
    if (check_float(out, "embedding output", err)) return -1;
    if (out->rows != ids->rows || out->cols != table->in)
        return base_fail(err, "cuda: embedding: output [%lld, %lld] for %lld ids of dim %lld",
                         (long long)out->rows, (long long)out->cols, (long long)ids->rows,
                         (long long)table->in);
    int64_t total = out->rows * out->cols;
    if (total == 0) return 0;
    return cuda_launch_pdl(cuda_impl(be), embedding_kernel, grid_for(total), ELEM_THREADS, 0,
                           "embedding", err, *table, (const int32_t *)ids->data, ids->rows,
                           out->data, out->dtype);
}

/* ---- RMSNorm ---- */

/* One RMSNorm of the rmsnorm kernel: rows of cols values of x into y, with weight w. */
struct rms_part {
    const void *x, *w;
    void *y;
    base_dtype x_dt, w_dt, y_dt;
    int64_t rows, cols;
};

/* One block per row of a's rows, then of b's (b.rows 0 for a single norm); the weights load
 * before the wait (they depend on no kernel) and each thread keeps its first CUDA_ROW_VPT values
 * of x in registers. y may alias x. */
__global__ void rmsnorm_kernel(rms_part a, rms_part b, float eps) {
    cuda_pdl_trigger();
    const bool first = blockIdx.x < a.rows;
    const rms_part &p = first ? a : b;
    const size_t base = (size_t)(first ? blockIdx.x : blockIdx.x - a.rows) * (size_t)p.cols;
    const int64_t cols = p.cols;
    float wv[CUDA_ROW_VPT], xv[CUDA_ROW_VPT];
    cuda_row_weights(p.w, p.w_dt, cols, wv);
    cuda_pdl_wait();
    const float inv = cuda_row_inv(p.x, p.x_dt, base, cols, eps, xv);
    cuda_row_store_normed(p.y, p.y_dt, p.x, p.x_dt, p.w, p.w_dt, xv, wv, base, cols, inv);
}

static int rms_part_of(const be_tensor *x, const be_tensor *weight, be_tensor *y, rms_part *p,
                       base_err *err) {
    if (check_float(x, "rmsnorm input", err) || check_float(y, "rmsnorm output", err) ||
        check_float(weight, "rmsnorm weight", err) || same_shape(x, y, "rmsnorm", err))
        return -1;
    if (weight->rows * weight->cols != x->cols)
        return base_fail(err, "cuda: rmsnorm: weight has %lld values for %lld columns",
                         (long long)(weight->rows * weight->cols), (long long)x->cols);
    *p = rms_part{x->data,       weight->data, y->data, x->dtype,
                  weight->dtype, y->dtype,     x->rows, x->cols};
    return 0;
}

/* About four values a thread of the widest row: a loop of dependent loads was the kernel's
 * whole time (16 us for one row of 4096 at 256 threads on the H200). */
static int rmsnorm_launch(be_backend *be, const rms_part &a, const rms_part &b, float eps,
                          base_err *err) {
    if (a.rows + b.rows == 0) return 0;
    const int64_t cols = a.cols > b.cols ? a.cols : b.cols;
    int64_t threads = ((cols + 127) / 128) * 32;
    threads = threads < 32 ? 32 : (threads > 1024 ? 1024 : threads);
    return cuda_launch_pdl(cuda_impl(be), rmsnorm_kernel, (unsigned)(a.rows + b.rows),
                           (unsigned)threads, 0, "rmsnorm", err, a, b, eps);
}

int cuda_rmsnorm(be_backend *be, const be_tensor *x, const be_tensor *weight, float eps,
                 be_tensor *y, base_err *err) {
    rms_part a, none = {};
    if (rms_part_of(x, weight, y, &a, err)) return -1;
    return rmsnorm_launch(be, a, none, eps, err);
}

int cuda_rmsnorm_pair(be_backend *be, const be_tensor *xa, const be_tensor *wa, be_tensor *ya,
                      const be_tensor *xb, const be_tensor *wb, be_tensor *yb, float eps,
                      base_err *err) {
    rms_part a, b;
    if (rms_part_of(xa, wa, ya, &a, err) || rms_part_of(xb, wb, yb, &b, err)) return -1;
    if (a.rows + b.rows > INT32_MAX)
        return base_fail(err, "cuda: rmsnorm: %lld rows", (long long)(a.rows + b.rows));
    return rmsnorm_launch(be, a, b, eps, err);
}

/* ---- add, glu, scale, softcap ---- */

__global__ void binary_kernel(const void *a, base_dtype a_dt, const void *b, base_dtype b_dt,
                              void *y, base_dtype y_dt, int64_t n, int glu, be_act act) {
    cuda_pdl_trigger();
    cuda_pdl_wait();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float u = cuda_load(a, a_dt, (size_t)i), v = cuda_load(b, b_dt, (size_t)i);
        cuda_store(y, y_dt, (size_t)i, glu ? cuda_act(act, u) * v : u + v);
    }
}

static int binary(be_backend *be, const be_tensor *a, const be_tensor *b, be_tensor *y, int glu,
                  be_act act, const char *what, base_err *err) {
    if (check_float(a, what, err) || check_float(b, what, err) || check_float(y, what, err) ||
        same_shape(a, b, what, err) || same_shape(a, y, what, err))
        return -1;
    int64_t n = a->rows * a->cols;
    if (n == 0) return 0;
    return cuda_launch_pdl(cuda_impl(be), binary_kernel, grid_for(n), ELEM_THREADS, 0, what, err,
                           a->data, a->dtype, b->data, b->dtype, y->data, y->dtype, n, glu, act);
}

int cuda_add(be_backend *be, const be_tensor *a, const be_tensor *b, be_tensor *y, base_err *err) {
    return binary(be, a, b, y, 0, BE_ACT_SILU, "add", err);
}

int cuda_glu(be_backend *be, be_act act, const be_tensor *gate, const be_tensor *up, be_tensor *y,
             base_err *err) {
    if (act != BE_ACT_SILU && act != BE_ACT_GELU_TANH)
        return base_fail(err, "cuda: glu: unknown activation %d", (int)act);
    return binary(be, gate, up, y, 1, act, "glu", err);
}

/* y = x * s, or with cap (> 0) y = cap * tanh(x / cap). */
__global__ void unary_kernel(const void *x, base_dtype x_dt, void *y, base_dtype y_dt, int64_t n,
                             float s, int cap) {
    cuda_pdl_trigger();
    cuda_pdl_wait();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float v = cuda_load(x, x_dt, (size_t)i);
        cuda_store(y, y_dt, (size_t)i, cap ? s * tanhf(v / s) : v * s);
    }
}

static int unary(be_backend *be, const be_tensor *x, float s, int cap, be_tensor *y,
                 const char *what, base_err *err) {
    if (check_float(x, what, err) || check_float(y, what, err) || same_shape(x, y, what, err))
        return -1;
    int64_t n = x->rows * x->cols;
    if (n == 0) return 0;
    return cuda_launch_pdl(cuda_impl(be), unary_kernel, grid_for(n), ELEM_THREADS, 0, what, err,
                           x->data, x->dtype, y->data, y->dtype, n, s, cap);
}

int cuda_scale(be_backend *be, const be_tensor *x, float s, be_tensor *y, base_err *err) {
    return unary(be, x, s, 0, y, "scale", err);
}

int cuda_softcap(be_backend *be, const be_tensor *x, float cap, be_tensor *y, base_err *err) {
    if (!(cap > 0.0f)) return base_fail(err, "cuda: softcap: cap %g is not positive", (double)cap);
    return unary(be, x, cap, 1, y, "softcap", err);
}

/* ---- RoPE ---- */

/* One thread per (token, head, pair i) with i < half, half = rotary_dim / 2: rotates x[i] with
 * x[i + half]; the head's dims past rotary_dim are left alone (partial rotary embeddings). The
 * angle is formed in F32 as the CPU does; sincosf (not the fast intrinsic) keeps large
 * positions accurate. */
__global__ void rope_kernel(void *x, base_dtype dt, int n_heads, int head_dim, int half, int64_t n,
                            const int32_t *pos, const float *inv_freq, float mscale) {
    cuda_pdl_trigger();
    cuda_pdl_wait();
    int64_t total = n * n_heads * half;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        int p = (int)(i % half);
        int64_t th = i / half;
        int64_t t = th / n_heads;
        size_t base = (size_t)th * head_dim;
        float s, c;
        cuda_rope_sincos(pos[t], inv_freq[p], mscale, &s, &c);
        const float2 r =
            cuda_rope_rotate(cuda_load(x, dt, base + p), cuda_load(x, dt, base + p + half), s, c);
        cuda_store(x, dt, base + p, r.x);
        cuda_store(x, dt, base + p + half, r.y);
    }
}

int cuda_rope(be_backend *be, be_tensor *x, int n_heads, int head_dim, const be_tensor *positions,
              const be_tensor *inv_freq, float mscale, base_err *err) {
    if (check_float(x, "rope input", err)) return -1;
    if (positions->dtype != BASE_DTYPE_I32 || inv_freq->dtype != BASE_DTYPE_F32)
        return base_fail(err, "cuda: rope: positions must be I32 and inv_freq F32");
    if (head_dim < 2 || (int64_t)n_heads * head_dim != x->cols || positions->rows != x->rows)
        return base_fail(err, "cuda: rope: x [%lld, %lld] does not match %d heads of %d",
                         (long long)x->rows, (long long)x->cols, n_heads, head_dim);
    /* The table's width sets the rotary dims: 2 * cols of the head's first dims. */
    if (inv_freq->rows != 1 || inv_freq->cols < 1 || 2 * inv_freq->cols > head_dim)
        return base_fail(err,
                         "cuda: rope: inv_freq [%lld, %lld] for heads of %d (want [1, n] with "
                         "1 <= n <= %d)",
                         (long long)inv_freq->rows, (long long)inv_freq->cols, head_dim,
                         head_dim / 2);
    const int half = (int)inv_freq->cols;
    int64_t total = x->rows * n_heads * half;
    if (total == 0) return 0;
    return cuda_launch_pdl(cuda_impl(be), rope_kernel, grid_for(total), ELEM_THREADS, 0, "rope",
                           err, x->data, x->dtype, n_heads, head_dim, half, x->rows,
                           (const int32_t *)positions->data, (const float *)inv_freq->data, mscale);
}

/* ---- KV append ---- */

/* One thread per (token, element); the pool offset is 64-bit from the first multiply. A
 * negative slot marks a padding row that writes nothing. */
__global__ void kv_append_kernel(void *kp, void *vp, base_dtype pool_dt, const void *k,
                                 base_dtype k_dt, const void *v, base_dtype v_dt,
                                 const int64_t *slots, int64_t n, int64_t width) {
    cuda_pdl_trigger();
    cuda_pdl_wait();
    int64_t total = n * width;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = i / width, e = i % width;
        int64_t slot = slots[t];
        if (slot < 0) continue;
        size_t off = (size_t)((uint64_t)slot * (uint64_t)width + (uint64_t)e);
        cuda_store(kp, pool_dt, off, cuda_load(k, k_dt, (size_t)i));
        cuda_store(vp, pool_dt, off, cuda_load(v, v_dt, (size_t)i));
    }
}

int cuda_kv_append(be_backend *be, const be_kv_layer *layer, const be_tensor *k, const be_tensor *v,
                   const be_paged_batch *batch, base_err *err) {
    int64_t width = (int64_t)layer->n_kv_heads * layer->head_dim;
    if (check_float(k, "kv_append k", err) || check_float(v, "kv_append v", err) ||
        same_shape(k, v, "kv_append", err))
        return -1;
    if (layer->dtype != BASE_DTYPE_F16 && layer->dtype != BASE_DTYPE_BF16)
        return base_fail(err, "cuda: kv_append: pool dtype %s (F16 or BF16 on CUDA)",
                         base_dtype_name(layer->dtype));
    if (k->cols != width || k->rows != batch->n_tokens)
        return base_fail(err, "cuda: kv_append: k [%lld, %lld] for %d tokens of width %lld",
                         (long long)k->rows, (long long)k->cols, batch->n_tokens, (long long)width);
    int64_t total = k->rows * width;
    if (total == 0) return 0;
    return cuda_launch_pdl(cuda_impl(be), kv_append_kernel, grid_for(total), ELEM_THREADS, 0,
                           "kv_append", err, layer->k, layer->v, layer->dtype, k->data, k->dtype,
                           v->data, v->dtype, batch->slots, k->rows, width);
}

/* ---- argmax ---- */

/* One block per row; ties go to the lowest index, as the CPU sampler does. NaN never wins. */
__global__ void argmax_kernel(const void *x, base_dtype dt, int64_t cols, int32_t *ids) {
    cuda_pdl_trigger();
    cuda_pdl_wait();
    __shared__ float best_v[32];
    __shared__ int32_t best_i[32];
    size_t base = (size_t)blockIdx.x * (size_t)cols;
    float bv = -INFINITY;
    int32_t bi = 0;
    bool any = false;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = cuda_load(x, dt, base + c);
        if (!any || v > bv) {
            if (v == v) {
                bv = v;
                bi = (int32_t)c;
                any = true;
            }
        }
    }
    if (!any) bi = INT32_MAX;
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) {
            bv = ov;
            bi = oi;
        }
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        best_v[warp] = bv;
        best_i[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        int nw = (blockDim.x + 31) >> 5;
        bv = lane < nw ? best_v[lane] : -INFINITY;
        bi = lane < nw ? best_i[lane] : INT32_MAX;
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) {
                bv = ov;
                bi = oi;
            }
        }
        if (lane == 0) ids[blockIdx.x] = bi == INT32_MAX ? 0 : bi;
    }
}

int cuda_argmax(be_backend *be, const be_tensor *logits, be_tensor *ids, base_err *err) {
    if (check_float(logits, "argmax logits", err)) return -1;
    if (ids->dtype != BASE_DTYPE_I32 || ids->rows != logits->rows)
        return base_fail(err, "cuda: argmax: ids must be I32 [%lld, 1]", (long long)logits->rows);
    if (logits->rows == 0) return 0;
    return cuda_launch_pdl(cuda_impl(be), argmax_kernel, (unsigned)logits->rows, ROW_THREADS, 0,
                           "argmax", err, logits->data, logits->dtype, logits->cols,
                           (int32_t *)ids->data);
}
