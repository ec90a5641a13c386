/* Reranking: one relevance score for a (query, document) pair, from a sequence classifier's
 * score head on the pair as llama-server joins it, or from a causal LM's "yes" and "no" logits
 * after Qwen3-Reranker's judge prompt. */
#include "engine/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Qwen3-Reranker's prompt, as its model card builds it (and llama.cpp's rerank template for
 * it): a system turn that asks for "yes" or "no", the pair in a user turn after the default
 * instruction, and an assistant turn opened past an empty thought, so that the next token is
 * the verdict. The three parts are encoded apart, without special tokens, as the card does. */
static const char g_judge_prefix[] =
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    "and the Instruct provided. Note that the answer can only be \"yes\" or \"no\"."
    "<|im_end|>\n<|im_start|>user\n";
static const char g_judge_suffix[] = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
static const char g_judge_head[] = "<Instruct>: Given a web search query, retrieve relevant "
                                   "passages that answer the query\n<Query>: %s\n<Document>:";

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

typedef struct pair_ids {
    int32_t *v;
    size_t n;
} pair_ids;

static int encode(const tok_tokenizer *tok, const char *text, bool special, pair_ids *out,
                  const char *what, base_err *err) {
    if (tok_encode(tok, text, strlen(text), special, &out->v, &out->n, err))
        return base_fail_wrap(err, "%s", what);
    return 0;
}

/* The pair as llama-server joins it for a classifier: the query with the tokenizer's special
 * tokens, the document, what the post-processor puts after a sequence. */
static int classifier_pair(const tok_tokenizer *tok, const char *query, const char *doc,
                           int max_doc, pair_ids part[3], base_err *err) {
    const int32_t *pre, *suf;
    size_t n_pre, n_suf;
    tok_special_ends(tok, &pre, &n_pre, &suf, &n_suf);
    if (encode(tok, query, true, &part[0], "the query", err) ||
        encode(tok, doc, false, &part[1], "the document", err))
        return -1;
    if (max_doc > 0 && part[1].n > (size_t)max_doc) part[1].n = (size_t)max_doc;
    part[2].v = base_xmalloc((n_suf + 1) * sizeof *part[2].v);
    if (n_suf) memcpy(part[2].v, suf, n_suf * sizeof *suf);
    part[2].n = n_suf;
    return 0;
}

/* Qwen3-Reranker's prompt around the pair. max_doc keeps the first max_doc tokens after
 * "<Document>:", which is where transformers' truncation of the middle part would cut it. */
static int judge_pair(const tok_tokenizer *tok, const char *query, const char *doc, int max_doc,
                      pair_ids part[3], base_err *err) {
    size_t len = strlen(g_judge_head) + strlen(query) + strlen(doc) + 2;
    char *middle = base_xmalloc(len);
    int n_head = snprintf(middle, len, g_judge_head, query);
    pair_ids head = {0};
    int rc = encode(tok, g_judge_prefix, false, &part[0], "the judge prompt", err) ||
             encode(tok, g_judge_suffix, false, &part[2], "the judge prompt", err) ||
             (max_doc > 0 && encode(tok, middle, false, &head, "the query", err));
    snprintf(middle + n_head, len - (size_t)n_head, " %s", doc);
    rc = rc || encode(tok, middle, false, &part[1], "the pair", err);
    if (rc == 0 && max_doc > 0 && part[1].n > head.n + (size_t)max_doc)
        part[1].n = head.n + (size_t)max_doc;
    free(head.v);
    free(middle);
    return rc;
}

int engine_rerank_pair(const tok_tokenizer *tok, const engine_reranker *r, const char *query,
                       const char *doc, int max_doc, int32_t **ids, int *n, base_err *err) {
    pair_ids part[3] = {{0}};
    int rc = r->head ? classifier_pair(tok, query, doc, max_doc, part, err)
                     : judge_pair(tok, query, doc, max_doc, part, err);
    if (rc == 0) {
        *n = (int)(part[0].n + part[1].n + part[2].n);
        *ids = base_xmalloc(((size_t)*n + 1) * sizeof **ids);
        for (int k = 0, at = 0; k < 3; at += (int)part[k].n, k++)
            if (part[k].n) memcpy(*ids + at, part[k].v, part[k].n * sizeof *part[k].v);
    }
    for (int k = 0; k < 3; k++) free(part[k].v);
    return rc;
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
