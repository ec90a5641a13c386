/* Reranking: one relevance score for a (query, document) pair, from a sequence classifier's
 * score head or from a causal LM's "yes" and "no" logits, on the last token of the pair as
 * llama-server joins it. */
#include "engine/engine.h"

#include <stdlib.h>
#include <string.h>

int engine_reranker_open(const model *m, const tok_tokenizer *tok, engine_reranker *out,
                         base_err *err) {
    memset(out, 0, sizeof *out);
    const io_model_config *c = model_config(m);
    if (c->num_labels > 0) {
        if (c->num_labels != 1)
            return base_fail(err,
                             "the checkpoint's score head has %d labels (config.json's id2label); "
                             "reranking takes a head of one label, a relevance logit",
                             c->num_labels);
        return model_score_head(m, &out->head, err);
    }
    /* transformers' convert_tokens_to_ids: vocabulary entries, not encoded text */
    out->yes = tok ? tok_token_id(tok, "yes") : -1;
    out->no = tok ? tok_token_id(tok, "no") : -1;
    if (out->yes < 0 || out->no < 0)
        return base_fail(err,
                         "--reranking: the model has no score head (it is not a "
                         "*ForSequenceClassification checkpoint) and its tokenizer has no "
                         "single token %s%s%s to judge relevance with as Qwen3-Reranker does",
                         out->yes < 0 ? "\"yes\"" : "", out->yes < 0 && out->no < 0 ? " nor " : "",
                         out->no < 0 ? "\"no\"" : "");
    return 0;
}

void engine_reranker_close(engine_reranker *r) {
    free(r->head);
    r->head = NULL;
}

int engine_rerank_pair(const tok_tokenizer *tok, const char *query, const char *doc, int max_doc,
                       int32_t **ids, int *n, base_err *err) {
    int32_t *q = NULL, *d = NULL;
    size_t nq = 0, nd = 0, n_pre, n_suf;
    const int32_t *pre, *suf;
    tok_special_ends(tok, &pre, &n_pre, &suf, &n_suf);
    if (tok_encode(tok, query, strlen(query), true, &q, &nq, err))
        return base_fail_wrap(err, "the query");
    if (tok_encode(tok, doc, strlen(doc), false, &d, &nd, err)) {
        free(q);
        return base_fail_wrap(err, "the document");
    }
    if (max_doc > 0 && nd > (size_t)max_doc) nd = (size_t)max_doc;
    *n = (int)(nq + nd + n_suf);
    *ids = base_xmalloc(((size_t)*n + 1) * sizeof **ids);
    if (nq) memcpy(*ids, q, nq * sizeof *q);
    if (nd) memcpy(*ids + nq, d, nd * sizeof *d);
    if (n_suf) memcpy(*ids + nq + nd, suf, n_suf * sizeof *suf);
    free(q);
    free(d);
    return 0;
}

/* The score from the last token's row: the head's dot product with its hidden state, or the
 * yes/no logit difference. */
static int last_row(engine_runtime *rt, const engine_reranker *r, kv_batch *batch,
                    const int32_t *tokens, int row, double *score, base_err *err) {
    const io_model_config *c = model_config(rt->model);
    int width = r->head ? c->hidden_size : c->vocab_size;
    float *v = base_xmalloc((size_t)width * sizeof *v);
    int rc = r->head ? model_forward_hidden(rt->model, rt->pool, batch, tokens, &row, 1, v, err)
                     : model_forward(rt->model, rt->pool, batch, tokens, &row, 1, v, err);
    double s = 0;
    if (rc == 0 && r->head)
        for (int d = 0; d < width; d++) s += (double)r->head[d] * v[d];
    else if (rc == 0)
        s = (double)v[r->yes] - v[r->no];
    free(v);
    *score = s;
    return rc;
}

int engine_rerank(engine_runtime *rt, const engine_reranker *r, const int32_t *tokens, int n,
                  double *score, base_err *err) {
    if (n <= 0) return base_fail(err, "the input is empty");
    if (n > rt->kv_plan.ctx_size)
        return base_fail(err, "the input has %d tokens, more than the context size (%d; -c)", n,
                         rt->kv_plan.ctx_size);
    int chunk = engine_prefill_chunk(rt->be), rc = 0;
    kv_seq *seq = kv_seq_create(rt->pool);
    for (int start = 0; start < n && rc == 0;) {
        int len = n - start < chunk ? n - start : chunk;
        kv_batch batch;
        if (kv_seq_append(rt->pool, seq, tokens + start, len, err) ||
            kv_batch_build(rt->pool, &seq, &len, 1, &batch, err)) {
            rc = -1;
            break;
        }
        if (start + len == n)
            rc = last_row(rt, r, &batch, tokens + start, len - 1, score, err);
        else
            rc = model_forward_hidden(rt->model, rt->pool, &batch, tokens + start, NULL, 0, NULL,
                                      err);
        kv_batch_free(&batch);
        start += len;
    }
    kv_seq_free(rt->pool, seq);
    return rc;
}
