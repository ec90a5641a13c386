/* Backend-independent entry points: destruction through the op table, the argument checks
 * that every backend shares, a fused matmul's norm run apart (through the op table, for the
 * backends and for the model when nothing folds it), and the CUDA constructor's stand-in for
 * builds without CUDA. */
#include "backend/backend.h"

void be_destroy(be_backend *be) {
    if (be) be->ops->destroy(be);
}

int be_norm_apart(be_backend *be, const be_norm *norm, const be_tensor **x, const char *what,
                  base_err *err) {
    if (!norm) return 0;
    const be_tensor *s = norm->scratch;
    if (!s || s->rows != (*x)->rows || s->cols != (*x)->cols || s->data == (*x)->data)
        return base_fail(err, "%s: the norm needs a scratch of the input's shape, apart from it",
                         what);
    if (be->ops->rmsnorm(be, *x, norm->weight, norm->eps, norm->scratch, err)) return -1;
    *x = s;
    return 0;
}

int be_topk_check(const be_tensor *logits, const be_topk_row *reqs, int n_req,
                  const be_logit_adj *adj, base_err *err) {
    if (!logits->data || logits->dtype != BASE_DTYPE_F32 || logits->rows <= 0 || logits->cols <= 0)
        return base_fail(err, "topk_candidates: logits must be a non-empty F32 tensor");
    if (logits->cols > INT32_MAX)
        return base_fail(err, "topk_candidates: vocabulary of %lld tokens is too large",
                         (long long)logits->cols);
    for (int i = 0; i < n_req; i++) {
        const be_topk_row *r = &reqs[i];
        if (r->row < 0 || r->row >= logits->rows)
            return base_fail(err, "topk_candidates: request %d asks for row %d of %lld", i, r->row,
                             (long long)logits->rows);
        if (r->k < 0 || r->k > BE_TOPK_MAX)
            return base_fail(err, "topk_candidates: request %d asks for k = %d (0..%d)", i, r->k,
                             BE_TOPK_MAX);
        if (r->allowed && (r->allowed_n < 0 || r->allowed_n > logits->cols))
            return base_fail(err,
                             "topk_candidates: request %d's allowed set covers %d tokens "
                             "(vocab %lld)",
                             i, r->allowed_n, (long long)logits->cols);
        if (r->adj_begin < 0 || r->adj_end < r->adj_begin)
            return base_fail(err, "topk_candidates: request %d has adjustments [%d, %d)", i,
                             r->adj_begin, r->adj_end);
        for (int j = r->adj_begin; j < r->adj_end; j++) {
            if (adj[j].token < 0 || adj[j].token >= logits->cols)
                return base_fail(err, "topk_candidates: adjustment %d names token %d (vocab %lld)",
                                 j, adj[j].token, (long long)logits->cols);
            if (j > r->adj_begin && adj[j].token < adj[j - 1].token)
                return base_fail(err,
                                 "topk_candidates: adjustments of request %d are not sorted "
                                 "by token",
                                 i);
            if (adj[j].kind != BE_ADJ_ADD && adj[j].kind != BE_ADJ_PENALTY)
                return base_fail(err, "topk_candidates: adjustment %d has kind %d", j, adj[j].kind);
        }
    }
    return 0;
}

#ifndef MLXCEL_HAVE_CUDA
int be_cuda_create(int device, be_backend **out, base_err *err) {
    *out = NULL;
    return base_fail(err, "cuda device %d: mlxcel was built without CUDA", device);
}

int be_cuda_device_count(void) {
    return 0;
}

int be_comm_nccl_create(be_nccl *nccl, be_backend *const *bes, int n_ranks, be_comm **comms,
                        base_err *err) {
    (void)nccl;
    (void)bes;
    (void)comms;
    return base_fail(err, "nccl: %d ranks: mlxcel was built without CUDA", n_ranks);
}
#endif
