/* The CPU's mixture-of-experts MLP: routing per row on the host, then each expert once over
 * the rows routed to it (gathered into one matrix, so its weights are read once per call), its
 * output added into those rows with their router weights. */
#include "backend/cpu/cpu_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Row r's top_k experts and weights from its router logits (n_experts of them). */
static void route_row(const float *logits, const be_moe *moe, int32_t *ids, float *w) {
    int E = moe->n_experts;
    float mx = -INFINITY;
    for (int e = 0; e < E; e++) mx = logits[e] > mx ? logits[e] : mx;
    float sum = 0.0f;
    for (int e = 0; e < E; e++) sum += expf(logits[e] - mx);
    for (int k = 0; k < moe->top_k; k++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            bool taken = false;
            for (int j = 0; j < k; j++) taken |= ids[j] == e;
            if (!taken && (best < 0 || logits[e] > logits[best])) best = e;
        }
        ids[k] = best;
        w[k] = expf(logits[best] - mx) / sum;
    }
    if (!moe->norm_topk) return;
    float chosen = 0.0f;
    for (int k = 0; k < moe->top_k; k++) chosen += w[k];
    for (int k = 0; k < moe->top_k; k++) w[k] /= chosen;
}

static int check_moe(const be_tensor *x, const be_moe *moe, const be_tensor *y, base_err *err) {
    if (moe->n_experts < 1 || moe->top_k < 1 || moe->top_k > moe->n_experts || moe->inter < 1)
        return base_fail(err, "moe: top %d of %d experts of %d rows", moe->top_k, moe->n_experts,
                         moe->inter);
    const be_linear *r = moe->router, *g = moe->gate, *u = moe->up, *d = moe->down;
    int64_t E = moe->n_experts, I = moe->inter, held = moe->n_local ? moe->n_local : E;
    if (moe->n_local < 0 || moe->expert0 < 0 || moe->expert0 + held > E)
        return base_fail(err, "moe: experts [%d, +%lld) of %lld", moe->expert0, (long long)held,
                         (long long)E);
    if (r->out != E || r->in != x->cols || g->out != held * I || u->out != held * I ||
        g->in != x->cols || u->in != x->cols || d->in != I || d->out != held * y->cols ||
        y->rows != x->rows)
        return base_fail(err,
                         "moe: router [%lld, %lld], gate [%lld, %lld], down [%lld, %lld] do not "
                         "fit %lld experts of %lld for x [%lld, %lld] and y [%lld, %lld]",
                         (long long)r->out, (long long)r->in, (long long)g->out, (long long)g->in,
                         (long long)d->out, (long long)d->in, (long long)held, (long long)I,
                         (long long)x->rows, (long long)x->cols, (long long)y->rows,
                         (long long)y->cols);
    if (x->data == y->data) return base_fail(err, "moe: y may not alias x");
    return 0;
}

int cpu_moe(be_backend *be, const be_tensor *x, const be_norm *norm, const be_moe *moe,
            be_tensor *y, base_err *err) {
    if (cpu_check_tensor(x, BASE_DTYPE_F32, "moe", "x", err) ||
        cpu_check_tensor(y, BASE_DTYPE_F32, "moe", "y", err) || check_moe(x, moe, y, err) ||
        be_norm_apart(be, norm, &x, "moe", err))
        return -1;
    const int64_t n = x->rows, in = x->cols, out = y->cols, I = moe->inter;
    const int E = moe->n_experts, K = moe->top_k;
    const int e0 = moe->expert0, e1 = e0 + (moe->n_local ? moe->n_local : E);
    float *logits = malloc((size_t)n * E * sizeof(float));
    int32_t *ids = malloc((size_t)n * K * sizeof(int32_t));
    float *w = malloc((size_t)n * K * sizeof(float));
    int64_t *rows = malloc((size_t)n * sizeof(int64_t));
    float *xs = malloc((size_t)n * in * sizeof(float));
    float *gs = malloc((size_t)n * I * sizeof(float)), *us = malloc((size_t)n * I * sizeof(float));
    float *ds = malloc((size_t)n * out * sizeof(float));
    float *weights = malloc((size_t)n * sizeof(float));
    int rc = 0;
    if (!logits || !ids || !w || !rows || !xs || !gs || !us || !ds || !weights) {
        rc = base_fail(err, "moe: out of memory for %lld rows", (long long)n);
        goto done;
    }
    be_tensor lt = {logits, BASE_DTYPE_F32, n, E};
    if ((rc = cpu_matmul_exact(be, x, moe->router, &lt, err))) goto done;
    for (int64_t r = 0; r < n; r++) route_row(logits + r * E, moe, ids + r * K, w + r * K);
    memset(y->data, 0, (size_t)n * out * sizeof(float));
    const float *xf = x->data;
    float *yf = y->data;
    for (int e = e0; e < e1 && rc == 0; e++) {
        int64_t m = 0;
        for (int64_t r = 0; r < n; r++)
            for (int k = 0; k < K; k++)
                if (ids[r * K + k] == e) {
                    rows[m] = r;
                    weights[m] = w[r * K + k];
                    memcpy(xs + m * in, xf + r * in, (size_t)in * sizeof(float));
                    m++;
                }
        if (m == 0) continue;
        int64_t h = e - e0; /* its place among the experts held */
        be_linear ge = be_linear_rows(moe->gate, h * I, I), ue = be_linear_rows(moe->up, h * I, I);
        be_linear de = be_linear_rows(moe->down, h * out, out);
        be_tensor xt = {xs, BASE_DTYPE_F32, m, in}, gt = {gs, BASE_DTYPE_F32, m, I};
        be_tensor ut = {us, BASE_DTYPE_F32, m, I}, dt = {ds, BASE_DTYPE_F32, m, out};
        rc = be->ops->matmul(be, &xt, &ge, &gt, err);
        if (!rc) rc = be->ops->matmul(be, &xt, &ue, &ut, err);
        if (!rc) rc = be->ops->glu(be, moe->act, &gt, &ut, &gt, err);
        if (!rc) rc = be->ops->matmul(be, &gt, &de, &dt, err);
        for (int64_t j = 0; rc == 0 && j < m; j++)
            for (int64_t c = 0; c < out; c++) yf[rows[j] * out + c] += weights[j] * ds[j * out + c];
    }
done:
    free(logits);
    free(ids);
    free(w);
    free(rows);
    free(xs);
    free(gs);
    free(us);
    free(ds);
    free(weights);
    return rc;
}
