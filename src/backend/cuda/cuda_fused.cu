/* The fused ops of decode: residual add with RMSNorm, Q/K/V in one GEMV, gate and up with
 * the GLU's activation and product in one GEMV, RoPE with the KV append. At batch 1 every one of
 * the unfused ops is a launch of a few microseconds whatever its size, so fusing is what removes
 * their time. The matmul fusions run the decode GEMVs when they serve every matrix, RMSNorm folded
 * into their prologue, and compose the plain ops otherwise (64 rows and more, other bit widths,
 * mixed geometries): the norm into the caller's scratch, then the matmuls. The row kernels here let
 * the next kernel start at once and wait for the previous one before touching memory, as those of
 * cuda_ops.cu do. */
#include "backend/cuda/cuda_internal.h"

static int check_float(const be_tensor *t, const char *name, base_err *err) {
    if (!cuda_float_dtype(t->dtype))
        return base_fail(err, "cuda: %s: dtype %s is not F32, F16 or BF16", name,
                         base_dtype_name(t->dtype));
    return 0;
}

/* ---- residual add + RMSNorm ---- */

/* One block per row. The norm's weights depend on no kernel, so they are loaded before the
 * wait; after it, each thread keeps the sums it stores, rounded to x's dtype, so the norm sees
 * x as stored, as the composed ops would. y's writes come after the block-wide sum, when every
 * read of d is done, so y may alias d. */
__global__ void add_rmsnorm_kernel(void *x, base_dtype x_dt, const void *d, base_dtype d_dt,
                                   const void *w, base_dtype w_dt, float eps, int64_t cols, void *y,
                                   base_dtype y_dt) {
    cuda_pdl_trigger();
    const size_t base = (size_t)blockIdx.x * (size_t)cols;
    const int64_t t = threadIdx.x, nt = blockDim.x;
    float wv[CUDA_ROW_VPT], xv[CUDA_ROW_VPT];
    cuda_row_weights(w, w_dt, cols, wv);
    cuda_pdl_wait();
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < CUDA_ROW_VPT; k++) {
        const int64_t c = t + k * nt;
        xv[k] = 0.0f;
        if (c >= cols) continue;
        xv[k] = cuda_round(x_dt, cuda_load(x, x_dt, base + c) + cuda_load(d, d_dt, base + c));
        cuda_store(x, x_dt, base + c, xv[k]);
        ss += xv[k] * xv[k];
    }
    for (int64_t c = t + CUDA_ROW_VPT * nt; c < cols; c += nt) {
        const float v =
            cuda_round(x_dt, cuda_load(x, x_dt, base + c) + cuda_load(d, d_dt, base + c));
        cuda_store(x, x_dt, base + c, v);
        ss += v * v;
    }
    const float inv = cuda_rms_inv(cuda_block_sum(ss), cols, eps);
    cuda_row_store_normed(y, y_dt, x, x_dt, w, w_dt, xv, wv, base, cols, inv);
}

int cuda_add_rmsnorm(be_backend *be, be_tensor *x, const be_tensor *d, const be_tensor *weight,
                     float eps, be_tensor *y, base_err *err) {
    if (check_float(x, "add_rmsnorm x", err) || check_float(d, "add_rmsnorm d", err) ||
        check_float(y, "add_rmsnorm output", err) || check_float(weight, "add_rmsnorm weight", err))
        return -1;
    if (d->rows != x->rows || d->cols != x->cols || y->rows != x->rows || y->cols != x->cols ||
        weight->rows * weight->cols != x->cols)
        return base_fail(err,
                         "cuda: add_rmsnorm: x [%lld, %lld], d [%lld, %lld], y [%lld, %lld], "
                         "weight of %lld values",
                         (long long)x->rows, (long long)x->cols, (long long)d->rows,
                         (long long)d->cols, (long long)y->rows, (long long)y->cols,
                         (long long)(weight->rows * weight->cols));
    if (x->rows == 0) return 0;
    int64_t threads = ((x->cols + 127) / 128) * 32;
    threads = threads < 32 ? 32 : (threads > 1024 ? 1024 : threads);
    return cuda_launch_pdl(cuda_impl(be), add_rmsnorm_kernel, (unsigned)x->rows, (unsigned)threads,
                           0, "add_rmsnorm", err, x->data, x->dtype, d->data, d->dtype,
                           weight->data, weight->dtype, eps, x->cols, y->data, y->dtype);
}

/* x += rmsnorm(d) * w, one block per row: a post-block norm and its residual add in one pass
 * (Gemma's post-attention and post-FFN norms). Each thread keeps its first CUDA_ROW_VPT values
 * of d in registers; the sum is stored rounded to x's dtype, as the composed ops would. */
__global__ void rmsnorm_add_kernel(const void *d, base_dtype d_dt, const void *w, base_dtype w_dt,
                                   float eps, int64_t cols, void *x, base_dtype x_dt) {
    cuda_pdl_trigger();
    const size_t base = (size_t)blockIdx.x * (size_t)cols;
    const int64_t t = threadIdx.x, nt = blockDim.x;
    float wv[CUDA_ROW_VPT], dv[CUDA_ROW_VPT];
    cuda_row_weights(w, w_dt, cols, wv);
    cuda_pdl_wait();
    const float inv = cuda_row_inv(d, d_dt, base, cols, eps, dv);
#pragma unroll
    for (int k = 0; k < CUDA_ROW_VPT; k++) {
        const size_t i = base + t + k * nt;
        if (t + k * nt < cols) cuda_store(x, x_dt, i, cuda_load(x, x_dt, i) + dv[k] * inv * wv[k]);
    }
    for (int64_t c = t + CUDA_ROW_VPT * nt; c < cols; c += nt)
        cuda_store(x, x_dt, base + c,
                   cuda_load(x, x_dt, base + c) +
                       cuda_load(d, d_dt, base + c) * inv * cuda_load(w, w_dt, c));
}

int cuda_rmsnorm_add(be_backend *be, const be_tensor *d, const be_tensor *weight, float eps,
                     be_tensor *x, base_err *err) {
    if (check_float(x, "rmsnorm_add x", err) || check_float(d, "rmsnorm_add d", err) ||
        check_float(weight, "rmsnorm_add weight", err))
        return -1;
    if (d->rows != x->rows || d->cols != x->cols || weight->rows * weight->cols != x->cols)
        return base_fail(err,
                         "cuda: rmsnorm_add: x [%lld, %lld], d [%lld, %lld], weight of %lld values",
                         (long long)x->rows, (long long)x->cols, (long long)d->rows,
                         (long long)d->cols, (long long)(weight->rows * weight->cols));
    if (x->rows == 0) return 0;
    int64_t threads = ((x->cols + 127) / 128) * 32;
    threads = threads < 32 ? 32 : (threads > 1024 ? 1024 : threads);
    return cuda_launch_pdl(cuda_impl(be), rmsnorm_add_kernel, (unsigned)x->rows, (unsigned)threads,
                           0, "rmsnorm_add", err, d->data, d->dtype, weight->data, weight->dtype,
                           eps, x->cols, x->data, x->dtype);
}

/* ---- Q, K, V and gate/up GEMVs, with the RMSNorm before them ---- */

static bool same_geometry(const be_linear *a, const be_linear *b) {
    return a->in == b->in && a->bits == b->bits && a->group_size == b->group_size &&
           a->dtype == b->dtype;
}

bool cuda_gemv_norm_fits(const be_tensor *w, int64_t in) {
    return cuda_float_dtype(w->dtype) && w->rows * w->cols == in && ((uintptr_t)w->data & 15) == 0;
}

/* The GEMV folding of norm, when the GEMV serves the op (gemv) and takes its weight. */
static bool fold_norm(const be_norm *norm, bool gemv, const be_tensor *x, cuda_gemv_fuse *fz) {
    *fz = cuda_gemv_fuse{};
    if (!norm) return gemv;
    if (!gemv || !cuda_gemv_norm_fits(norm->weight, x->cols)) return false;
    fz->norm = norm->weight->data;
    fz->norm_dt = norm->weight->dtype;
    fz->eps = norm->eps;
    return true;
}

int cuda_matmul_qkv(be_backend *be, const be_tensor *x, const be_norm *norm,
                    const be_linear *const *ws, be_tensor *const *ys, base_err *err) {
    bool one = true;
    for (int i = 0; i < 3; i++) {
        if (cuda_matmul_check(x, ws[i], ys[i], err)) return base_fail_wrap(err, "qkv");
        /* The single-row GEMV's steps of 4 rows never straddle two matrices. */
        one = one && cuda_gemv1_fits(cuda_impl(be), x, ws[i]) && same_geometry(ws[0], ws[i]) &&
              (i == 2 || ws[i]->out % 4 == 0);
    }
    cuda_gemv_fuse fz;
    if (fold_norm(norm, one, x, &fz)) return cuda_gemv1(be, x, ws, ys, 3, false, &fz, err);
    if (be_norm_apart(be, norm, &x, "cuda: qkv", err)) return -1;
    for (int i = 0; i < 3; i++)
        if (cuda_matmul(be, x, ws[i], ys[i], err)) return -1;
    return 0;
}

int cuda_matmul_glu(be_backend *be, const be_tensor *x, const be_norm *norm, const be_linear *gate,
                    const be_linear *up, be_act act, be_tensor *y, base_err *err) {
    if (act != BE_ACT_SILU && act != BE_ACT_GELU_TANH)
        return base_fail(err, "cuda: gate/up: unknown activation %d", (int)act);
    if (cuda_matmul_check(x, gate, y, err) || cuda_matmul_check(x, up, y, err))
        return base_fail_wrap(err, "gate/up");
    cuda_gemv_fuse fz;
    if (fold_norm(norm,
                  cuda_gemv1_fits(cuda_impl(be), x, gate) &&
                      cuda_gemv1_fits(cuda_impl(be), x, up) && same_geometry(gate, up),
                  x, &fz)) {
        fz.act = act;
        const be_linear *ws[2] = {gate, up};
        be_tensor *ys[1] = {y};
        return cuda_gemv1(be, x, ws, ys, 2, true, &fz, err);
    }
    if (be_norm_apart(be, norm, &x, "cuda: gate/up", err)) return -1;
    cuda_backend *c = cuda_impl(be);
    size_t bytes = (size_t)(y->rows * y->cols) * base_dtype_size(y->dtype);
    if (cuda_scratch(be, &c->ftmp, &c->ftmp_bytes, bytes, "gate/up", err)) return -1;
    be_tensor u = {c->ftmp, y->dtype, y->rows, y->cols};
    if (cuda_matmul(be, x, gate, y, err) || cuda_matmul(be, x, up, &u, err)) return -1;
    return cuda_glu(be, act, y, &u, y, err);
}

/* ---- RoPE + KV append ---- */

/* One thread per (token, head, unit i < head_dim / 2) over q's heads, then k's. With rh pairs
 * rotated (the table's width; rh < head_dim / 2 for partial RoPE), unit i < rh rotates x[i]
 * with x[i + rh] as rope_kernel does (F32 angle, accurate sincosf), and unit i >= rh owns the
 * two unrotated dims 2 rh + 2 (i - rh) and the next. A k head's thread also writes its two
 * dims of k and of v into the pool at the token's slot (none for a negative slot). Positions
 * and frequencies come from copies made before the step's first kernel, so a thread's first
 * angle is computed before the wait for the GEMV that writes q, k and v. */
__global__ void rope_kv_append_kernel(void *q, base_dtype q_dt, void *k, base_dtype k_dt,
                                      const void *v, base_dtype v_dt, int n_heads, int n_kv_heads,
                                      int head_dim, int rh, int64_t n, const int32_t *pos,
                                      const float *inv_freq, float mscale, void *kp, void *vp,
                                      base_dtype pool_dt, const int64_t *slots) {
    cuda_pdl_trigger();
    const int half = head_dim / 2, heads = n_heads + n_kv_heads;
    const int64_t total = n * heads * half, first = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    float s = 0.0f, c = 0.0f;
    if (first < total && first % half < rh)
        cuda_rope_sincos(pos[first / half / heads], inv_freq[first % half], mscale, &s, &c);
    cuda_pdl_wait();
    for (int64_t i = first; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int p = (int)(i % half);
        const int64_t th = i / half, t = th / heads;
        const int h = (int)(th % heads);
        const bool rotate = p < rh, is_q = h < n_heads;
        if (!rotate && is_q) continue;
        void *x = is_q ? q : k;
        const base_dtype dt = is_q ? q_dt : k_dt;
        const int64_t width = (int64_t)(is_q ? n_heads : n_kv_heads) * head_dim;
        const size_t off = (size_t)(t * width + (int64_t)(is_q ? h : h - n_heads) * head_dim);
        const int a = rotate ? p : 2 * p, b = rotate ? p + rh : 2 * p + 1;
        if (rotate) {
            if (i != first) cuda_rope_sincos(pos[t], inv_freq[p], mscale, &s, &c);
            const float2 r =
                cuda_rope_rotate(cuda_load(x, dt, off + a), cuda_load(x, dt, off + b), s, c);
            cuda_store(x, dt, off + a, r.x);
            cuda_store(x, dt, off + b, r.y);
        }
        if (is_q || slots[t] < 0) continue;
        /* The pool holds k as stored in k's dtype, as kv_append after rope would copy it. */
        const size_t po =
            (size_t)((uint64_t)slots[t] * (uint64_t)width + (uint64_t)(off - (size_t)(t * width)));
        cuda_store(kp, pool_dt, po + a, cuda_load(x, dt, off + a));
        cuda_store(kp, pool_dt, po + b, cuda_load(x, dt, off + b));
        cuda_store(vp, pool_dt, po + a, cuda_load(v, v_dt, off + a));
        cuda_store(vp, pool_dt, po + b, cuda_load(v, v_dt, off + b));
    }
}

int cuda_rope_kv_check(const be_tensor *q, const be_tensor *k, const be_tensor *v,
                       const be_tensor *positions, const be_tensor *inv_freq,
                       const be_kv_layer *layer, const be_paged_batch *batch, base_err *err) {
    if (check_float(q, "rope_kv_append q", err) || check_float(k, "rope_kv_append k", err) ||
        check_float(v, "rope_kv_append v", err))
        return -1;
    if (positions->dtype != BASE_DTYPE_I32 || inv_freq->dtype != BASE_DTYPE_F32)
        return base_fail(err, "cuda: rope_kv_append: positions must be I32 and inv_freq F32");
    if (layer->dtype != BASE_DTYPE_F16 && layer->dtype != BASE_DTYPE_BF16)
        return base_fail(err, "cuda: rope_kv_append: pool dtype %s (F16 or BF16 on CUDA)",
                         base_dtype_name(layer->dtype));
    const int hd = layer->head_dim, kvh = layer->n_kv_heads;
    const int64_t n = q->rows, width = (int64_t)kvh * hd;
    if (hd % 2 || q->cols % hd || k->cols != width || v->cols != width || k->rows != n ||
        v->rows != n || positions->rows != n || n != batch->n_tokens || inv_freq->rows != 1 ||
        inv_freq->cols < 1 || inv_freq->cols > hd / 2)
        return base_fail(err,
                         "cuda: rope_kv_append: q [%lld, %lld], k [%lld, %lld], v [%lld, %lld] "
                         "for %d tokens, %d kv heads of %d",
                         (long long)q->rows, (long long)q->cols, (long long)k->rows,
                         (long long)k->cols, (long long)v->rows, (long long)v->cols,
                         batch->n_tokens, kvh, hd);
    return 0;
}

int cuda_rope_kv_append(be_backend *be, be_tensor *q, be_tensor *k, const be_tensor *v,
                        const be_tensor *positions, const be_tensor *inv_freq, float mscale,
                        const be_kv_layer *layer, const be_paged_batch *batch, base_err *err) {
    if (cuda_rope_kv_check(q, k, v, positions, inv_freq, layer, batch, err)) return -1;
    const int hd = layer->head_dim, kvh = layer->n_kv_heads;
    const int64_t n = q->rows;
    const int heads = (int)(q->cols / hd);
    const int64_t total = n * (heads + kvh) * (hd / 2);
    if (total == 0) return 0;
    int64_t blocks = (total + 255) / 256;
    if (blocks > 1048576) blocks = 1048576;
    return cuda_launch_pdl(cuda_impl(be), rope_kv_append_kernel, (unsigned)blocks, 256, 0,
                           "rope_kv_append", err, q->data, q->dtype, k->data, k->dtype, v->data,
                           v->dtype, heads, kvh, hd, (int)inv_freq->cols, n,
                           (const int32_t *)positions->data, (const float *)inv_freq->data, mscale,
                           layer->k, layer->v, layer->dtype, batch->slots);
}
