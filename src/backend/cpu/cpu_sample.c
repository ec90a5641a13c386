/* Sampling candidates on the CPU: one pass over each row keeps a min-heap of the k best
 * (token, adjusted logit) pairs, walking the row's token-sorted adjustments alongside, then
 * sorts the heap. This is the reference the CUDA op is checked against and the order the
 * host sampler's own full-row selection uses, so both paths pick identical tokens. Rows run
 * in parallel over the backend's pool. */
#include "backend/cpu/cpu_internal.h"

#include <math.h>
#include <stdlib.h>

typedef struct topk_ctx {
    const float *logits; /* (rows, vocab) */
    int64_t vocab;
    const be_topk_row *reqs; /* (n_req) */
    const int64_t *offsets;  /* (n_req) first output slot of each request */
    const be_logit_adj *adj; /* (sum of the requests' ranges) */
    int32_t *cand_id;        /* (sum of k) */
    float *cand_logit;       /* (sum of k) */
    int32_t *n_cand;         /* (n_req) */
    double *lse;             /* (n_req) or NULL */
} topk_ctx;

/* a is worse than b: lower logit, or the same logit and a higher id. */
static bool worse(float la, int32_t ia, float lb, int32_t ib) {
    return la < lb || (la == lb && ia > ib);
}

/* Sift-down of a min-heap whose root is the worst candidate. */
static void sift(float *l, int32_t *id, int n, int i) {
    for (;;) {
        int m = i, a = 2 * i + 1, b = a + 1;
        if (a < n && worse(l[a], id[a], l[m], id[m])) m = a;
        if (b < n && worse(l[b], id[b], l[m], id[m])) m = b;
        if (m == i) return;
        float tl = l[i];
        l[i] = l[m];
        l[m] = tl;
        int32_t ti = id[i];
        id[i] = id[m];
        id[m] = ti;
        i = m;
    }
}

/* The adjusted logit of token t, whose adjustments start at adj[*j] when adj[*j].token == t;
 * advances *j past them. */
static float adjusted(const float *row, int32_t t, const be_logit_adj *adj, int end, int *j) {
    float l = row[t];
    for (; *j < end && adj[*j].token == t; (*j)++) {
        const be_logit_adj *a = &adj[*j];
        if (a->kind == BE_ADJ_ADD) {
            l = l + a->a;
        } else {
            l = l <= 0 ? l * a->a : l / a->a;
            l = l - a->b;
        }
    }
    return l;
}

/* max + log(sum exp(x - max)) in token order; the max is the first largest, as argmax finds. */
static double row_lse(const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    float mx = x[best];
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += exp((double)x[i] - mx);
    return mx + log(sum);
}

static void topk_row(void *vctx, int64_t i) {
    const topk_ctx *c = vctx;
    const be_topk_row *r = &c->reqs[i];
    const float *row = c->logits + (size_t)r->row * (size_t)c->vocab;
    float *l = c->cand_logit + c->offsets[i];
    int32_t *id = c->cand_id + c->offsets[i];
    int k = r->k, n = 0, j = r->adj_begin;
    for (int64_t t = 0; t < c->vocab && k > 0; t++) {
        float v = adjusted(row, (int32_t)t, c->adj, r->adj_end, &j);
        if (isnan(v) || (isinf(v) && v < 0)) continue;
        if (n < k) {
            l[n] = v;
            id[n] = (int32_t)t;
            if (++n == k)
                for (int h = k / 2 - 1; h >= 0; h--) sift(l, id, k, h);
        } else if (v > l[0]) {
            l[0] = v;
            id[0] = (int32_t)t;
            sift(l, id, k, 0);
        }
    }
    if (n < k)
        for (int h = n / 2 - 1; h >= 0; h--) sift(l, id, n, h);
    for (int end = n - 1; end > 0; end--) {
        float tl = l[0];
        l[0] = l[end];
        l[end] = tl;
        int32_t ti = id[0];
        id[0] = id[end];
        id[end] = ti;
        sift(l, id, end, 0);
    }
    c->n_cand[i] = n;
    if (c->lse && r->want_lse) c->lse[i] = row_lse(row, c->vocab);
}

int cpu_topk_candidates(be_backend *be, const be_tensor *logits, const be_topk_row *reqs, int n_req,
                        const be_logit_adj *adj, int32_t *cand_id, float *cand_logit,
                        int32_t *n_cand, double *lse, base_err *err) {
    if (be_topk_check(logits, reqs, n_req, adj, err)) return -1;
    if (n_req <= 0) return 0;
    int64_t *offsets = base_xmalloc((size_t)n_req * sizeof *offsets);
    int64_t off = 0;
    for (int i = 0; i < n_req; i++) {
        offsets[i] = off;
        off += reqs[i].k;
    }
    topk_ctx c = {logits->data, logits->cols, reqs, offsets, adj, cand_id, cand_logit, n_cand, lse};
    base_pool_for(cpu_pool(be), n_req, topk_row, &c);
    free(offsets);
    return 0;
}
