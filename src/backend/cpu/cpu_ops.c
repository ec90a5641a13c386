/* CPU element-wise and row ops: embedding, rmsnorm, add, glu, scale, softcap, rope, argmax. They
 * are memory-bound, so they stay portable C and only split large inputs over the thread pool. */
#include "backend/cpu/cpu_internal.h"

#include <math.h>
#include <stdlib.h>

#define CPU_EW_CHUNK 16384 /* elements per task of an element-wise op */

static int cpu_same_shape(const be_tensor *a, const be_tensor *b, const char *op, const char *an,
                          const char *bn, base_err *err) {
    if (a->rows == b->rows && a->cols == b->cols) return 0;
    return base_fail(err, "%s: %s is [%lld, %lld] but %s is [%lld, %lld]", op, an,
                     (long long)a->rows, (long long)a->cols, bn, (long long)b->rows,
                     (long long)b->cols);
}

int cpu_embedding(be_backend *be, const be_linear *table, const be_tensor *ids, be_tensor *out,
                  base_err *err) {
    if (cpu_check_linear(table, "embedding", err) ||
        cpu_check_tensor(ids, BASE_DTYPE_I32, "embedding", "ids", err) ||
        cpu_check_tensor(out, BASE_DTYPE_F32, "embedding", "out", err)) {
        return -1;
    }
    if (ids->cols != 1) {
        return base_fail(err, "embedding: ids has %lld columns, expected 1", (long long)ids->cols);
    }
    if (out->rows != ids->rows || out->cols != table->in) {
        return base_fail(err, "embedding: out is [%lld, %lld], expected [%lld, %lld]",
                         (long long)out->rows, (long long)out->cols, (long long)ids->rows,
                         (long long)table->in);
    }
    const int32_t *id = ids->data;
    for (int64_t i = 0; i < ids->rows; i++) {
        if (id[i] < 0 || id[i] >= table->out) {
            return base_fail(err, "embedding: id %d at row %lld is outside the table's %lld rows",
                             id[i], (long long)i, (long long)table->out);
        }
    }
    float *y = out->data;
    for (int64_t i = 0; i < ids->rows; i++) cpu_linear_row(be, table, id[i], y + i * table->in);
    return 0;
}

typedef struct rms_ctx {
    const float *x; /* (rows, cols) */
    const float *w; /* (cols) */
    float *y;       /* (rows, cols) */
    int64_t cols;
    float eps;
} rms_ctx;

static void rms_row(void *vctx, int64_t r) {
    const rms_ctx *c = vctx;
    const float *x = c->x + r * c->cols;
    float *y = c->y + r * c->cols;
    double ss = 0.0;
    for (int64_t i = 0; i < c->cols; i++) ss += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(ss / (double)c->cols + (double)c->eps));
    for (int64_t i = 0; i < c->cols; i++) y[i] = x[i] * inv * c->w[i];
}

int cpu_rmsnorm(be_backend *be, const be_tensor *x, const be_tensor *weight, float eps,
                be_tensor *y, base_err *err) {
    if (cpu_check_tensor(x, BASE_DTYPE_F32, "rmsnorm", "x", err) ||
        cpu_check_tensor(y, BASE_DTYPE_F32, "rmsnorm", "y", err) ||
        cpu_same_shape(x, y, "rmsnorm", "x", "y", err)) {
        return -1;
    }
    if (!weight || !weight->data) return base_fail(err, "rmsnorm: weight has no data");
    if (weight->dtype != BASE_DTYPE_F32 && weight->dtype != BASE_DTYPE_F16 &&
        weight->dtype != BASE_DTYPE_BF16) {
        return base_fail(err, "rmsnorm: weight dtype %s is not F32, F16 or BF16",
                         base_dtype_name(weight->dtype));
    }
    if (weight->rows != 1 || weight->cols != x->cols) {
        return base_fail(err, "rmsnorm: weight is [%lld, %lld], expected [1, %lld]",
                         (long long)weight->rows, (long long)weight->cols, (long long)x->cols);
    }
    if (!(eps >= 0.0f)) return base_fail(err, "rmsnorm: eps %g is negative", (double)eps);
    float *w = malloc((size_t)x->cols * sizeof(float));
    if (!w) return base_fail(err, "rmsnorm: out of memory for %lld columns", (long long)x->cols);
    for (int64_t i = 0; i < x->cols; i++) w[i] = base_load_float(weight->data, weight->dtype, i);
    rms_ctx c = {.x = x->data, .w = w, .y = y->data, .cols = x->cols, .eps = eps};
    base_pool_for(cpu_pool(be), x->rows, rms_row, &c);
    free(w);
    return 0;
}

typedef struct ew_ctx {
    const float *a, *b; /* (n) */
    float *y;           /* (n) */
    int64_t n;
    float s; /* scale's factor, softcap's cap */
} ew_ctx;

/* The elements [i0, i1) of element-wise task t. */
static void ew_span(const ew_ctx *c, int64_t t, int64_t *i0, int64_t *i1) {
    *i0 = t * CPU_EW_CHUNK;
    *i1 = (t + 1) * CPU_EW_CHUNK < c->n ? (t + 1) * CPU_EW_CHUNK : c->n;
}

static void ew_add(void *vctx, int64_t t) {
    const ew_ctx *c = vctx;
    int64_t i0, i1;
    ew_span(c, t, &i0, &i1);
    for (int64_t i = i0; i < i1; i++) c->y[i] = c->a[i] + c->b[i];
}

static void ew_silu_mul(void *vctx, int64_t t) {
    const ew_ctx *c = vctx;
    int64_t i0, i1;
    ew_span(c, t, &i0, &i1);
    for (int64_t i = i0; i < i1; i++) {
        float g = c->a[i];
        c->y[i] = g / (1.0f + expf(-g)) * c->b[i];
    }
}

/* gelu_pytorch_tanh; the cube and tanh in F32 as torch computes them for F32 tensors. */
static void ew_gelu_tanh_mul(void *vctx, int64_t t) {
    const ew_ctx *c = vctx;
    const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
    int64_t i0, i1;
    ew_span(c, t, &i0, &i1);
    for (int64_t i = i0; i < i1; i++) {
        float g = c->a[i];
        c->y[i] = 0.5f * g * (1.0f + tanhf(k * (g + 0.044715f * g * g * g))) * c->b[i];
    }
}

static void ew_scale(void *vctx, int64_t t) {
    const ew_ctx *c = vctx;
    int64_t i0, i1;
    ew_span(c, t, &i0, &i1);
    for (int64_t i = i0; i < i1; i++) c->y[i] = c->a[i] * c->s;
}

static void ew_softcap(void *vctx, int64_t t) {
    const ew_ctx *c = vctx;
    int64_t i0, i1;
    ew_span(c, t, &i0, &i1);
    for (int64_t i = i0; i < i1; i++) c->y[i] = tanhf(c->a[i] / c->s) * c->s;
}

static int cpu_binary(be_backend *be, const char *op, const be_tensor *a, const be_tensor *b,
                      be_tensor *y, base_pool_fn fn, base_err *err) {
    if (cpu_check_tensor(a, BASE_DTYPE_F32, op, "first input", err) ||
        cpu_check_tensor(b, BASE_DTYPE_F32, op, "second input", err) ||
        cpu_check_tensor(y, BASE_DTYPE_F32, op, "output", err) ||
        cpu_same_shape(a, b, op, "first input", "second input", err) ||
        cpu_same_shape(a, y, op, "first input", "output", err)) {
        return -1;
    }
    ew_ctx c = {.a = a->data, .b = b->data, .y = y->data, .n = a->rows * a->cols};
    base_pool_for(cpu_pool(be), (c.n + CPU_EW_CHUNK - 1) / CPU_EW_CHUNK, fn, &c);
    return 0;
}

static int cpu_unary(be_backend *be, const char *op, const be_tensor *x, float s, be_tensor *y,
                     base_pool_fn fn, base_err *err) {
    if (cpu_check_tensor(x, BASE_DTYPE_F32, op, "input", err) ||
        cpu_check_tensor(y, BASE_DTYPE_F32, op, "output", err) ||
        cpu_same_shape(x, y, op, "input", "output", err)) {
        return -1;
    }
    if (!isfinite(s)) return base_fail(err, "%s: factor %g is not finite", op, (double)s);
    ew_ctx c = {.a = x->data, .y = y->data, .n = x->rows * x->cols, .s = s};
    base_pool_for(cpu_pool(be), (c.n + CPU_EW_CHUNK - 1) / CPU_EW_CHUNK, fn, &c);
    return 0;
}

int cpu_add(be_backend *be, const be_tensor *a, const be_tensor *b, be_tensor *y, base_err *err) {
    return cpu_binary(be, "add", a, b, y, ew_add, err);
}

int cpu_glu(be_backend *be, be_act act, const be_tensor *gate, const be_tensor *up, be_tensor *y,
            base_err *err) {
    switch (act) {
    case BE_ACT_SILU:
        return cpu_binary(be, "glu (silu)", gate, up, y, ew_silu_mul, err);
    case BE_ACT_GELU_TANH:
        return cpu_binary(be, "glu (gelu_tanh)", gate, up, y, ew_gelu_tanh_mul, err);
    }
    return base_fail(err, "glu: unknown activation %d", (int)act);
}

int cpu_scale(be_backend *be, const be_tensor *x, float s, be_tensor *y, base_err *err) {
    return cpu_unary(be, "scale", x, s, y, ew_scale, err);
}

int cpu_softcap(be_backend *be, const be_tensor *x, float cap, be_tensor *y, base_err *err) {
    if (!(cap > 0)) return base_fail(err, "softcap: cap %g must be positive", (double)cap);
    return cpu_unary(be, "softcap", x, cap, y, ew_softcap, err);
}

typedef struct rope_ctx {
    float *x;              /* (n, n_heads * head_dim) */
    const int32_t *pos;    /* (n) */
    const float *inv_freq; /* (half) */
    int n_heads, head_dim, half;
    float mscale;
} rope_ctx;

/* The angle is formed in double: at position 131072 an f32 product is off by up to 2^-7
 * radians, which would show in every rotated pair. */
static void rope_row(void *vctx, int64_t r) {
    const rope_ctx *c = vctx;
    float *x = c->x + r * (int64_t)c->n_heads * c->head_dim;
    int half = c->half;
    for (int i = 0; i < half; i++) {
        double angle = (double)c->pos[r] * (double)c->inv_freq[i];
        float cs = (float)(cos(angle) * c->mscale), sn = (float)(sin(angle) * c->mscale);
        for (int h = 0; h < c->n_heads; h++) {
            float *xh = x + h * c->head_dim;
            float x1 = xh[i], x2 = xh[i + half];
            xh[i] = x1 * cs - x2 * sn;
            xh[i + half] = x2 * cs + x1 * sn;
        }
    }
}

int cpu_rope(be_backend *be, be_tensor *x, int n_heads, int head_dim, const be_tensor *positions,
             const be_tensor *inv_freq, float mscale, base_err *err) {
    if (cpu_check_tensor(x, BASE_DTYPE_F32, "rope", "x", err) ||
        cpu_check_tensor(positions, BASE_DTYPE_I32, "rope", "positions", err) ||
        cpu_check_tensor(inv_freq, BASE_DTYPE_F32, "rope", "inv_freq", err)) {
        return -1;
    }
    if (n_heads <= 0 || head_dim <= 0 || head_dim % 2 != 0) {
        return base_fail(err, "rope: n_heads %d and head_dim %d must be positive, head_dim even",
                         n_heads, head_dim);
    }
    if (x->cols != (int64_t)n_heads * head_dim) {
        return base_fail(err, "rope: x has %lld columns, expected n_heads %d x head_dim %d",
                         (long long)x->cols, n_heads, head_dim);
    }
    if (positions->rows != x->rows || positions->cols != 1) {
        return base_fail(err, "rope: positions is [%lld, %lld], expected [%lld, 1]",
                         (long long)positions->rows, (long long)positions->cols,
                         (long long)x->rows);
    }
    if (inv_freq->rows != 1 || inv_freq->cols < 1 || inv_freq->cols > head_dim / 2) {
        return base_fail(err, "rope: inv_freq is [%lld, %lld], expected [1, 1..%d]",
                         (long long)inv_freq->rows, (long long)inv_freq->cols, head_dim / 2);
    }
    rope_ctx c = {.x = x->data,
                  .pos = positions->data,
                  .inv_freq = inv_freq->data,
                  .n_heads = n_heads,
                  .head_dim = head_dim,
                  .half = (int)inv_freq->cols,
                  .mscale = mscale};
    base_pool_for(cpu_pool(be), x->rows, rope_row, &c);
    return 0;
}

typedef struct argmax_ctx {
    const float *logits; /* (rows, cols) */
    int32_t *ids;        /* (rows) */
    int64_t cols;
} argmax_ctx;

/* The first index of the largest value; a NaN never wins over a number. */
static void argmax_row(void *vctx, int64_t r) {
    const argmax_ctx *c = vctx;
    const float *l = c->logits + r * c->cols;
    int64_t best = 0;
    for (int64_t i = 1; i < c->cols; i++) {
        if (l[i] > l[best] || (l[best] != l[best] && l[i] == l[i])) best = i;
    }
    c->ids[r] = (int32_t)best;
}

int cpu_argmax(be_backend *be, const be_tensor *logits, be_tensor *ids, base_err *err) {
    if (cpu_check_tensor(logits, BASE_DTYPE_F32, "argmax", "logits", err) ||
        cpu_check_tensor(ids, BASE_DTYPE_I32, "argmax", "ids", err)) {
        return -1;
    }
    if (ids->rows != logits->rows || ids->cols != 1) {
        return base_fail(err, "argmax: ids is [%lld, %lld], expected [%lld, 1]",
                         (long long)ids->rows, (long long)ids->cols, (long long)logits->rows);
    }
    if (logits->cols > INT32_MAX) {
        return base_fail(err, "argmax: %lld columns overflow an I32 id", (long long)logits->cols);
    }
    argmax_ctx c = {.logits = logits->data, .ids = ids->data, .cols = logits->cols};
    base_pool_for(cpu_pool(be), logits->rows, argmax_row, &c);
    return 0;
}
