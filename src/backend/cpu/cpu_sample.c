/* Sampling candidates on the CPU: one pass over each row keeps a min-heap of the k best
 * (token, adjusted logit) pairs (base_topk), walking the row's token-sorted adjustments
 * alongside, then sorts the heap. This is the reference the CUDA op is checked against and the
 * order the host sampler's own full-row selection uses, so both paths pick identical tokens. Rows
 * run in parallel over the backend's pool. */
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
    base_topk top = {c->cand_logit + c->offsets[i], c->cand_id + c->offsets[i], r->k, 0};
    int j = r->adj_begin;
    for (int64_t t = 0; t < c->vocab && r->k > 0; t++) {
        float v = adjusted(row, (int32_t)t, c->adj, r->adj_end, &j);
        if (isnan(v) || (isinf(v) && v < 0)) continue;
        if (r->allowed && (t >= r->allowed_n || !(r->allowed[t >> 5] >> (t & 31) & 1))) continue;
        base_topk_push(&top, v, (int32_t)t);
    }
    int n = base_topk_finish(&top);
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
