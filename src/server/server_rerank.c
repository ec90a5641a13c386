/* Reranking, with --reranking: POST /v1/rerank (also /rerank, /v1/reranking, /reranking as
 * llama-server spells them) in the Jina / Cohere shape that llama-server and vLLM answer, and
 * the TEI shape llama-server also takes (`texts` instead of `documents`). Each document is
 * joined to the query (engine_rerank_pair) and scored (engine_rerank) on the scheduler's
 * thread between two steps, as embeddings are. relevance_score is the sigmoid of the model's
 * logit, a probability as vLLM, Cohere and Jina give it (and llama-server for Qwen3-style
 * rerankers); TEI's `raw_scores` gives the logit. */
#include "server/server_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Cohere's limit on the documents of one request. */
#define SERVER_MAX_RERANK_DOCS 1000

bool server_is_rerank_route(const char *url) {
    return strcmp(url, "/v1/rerank") == 0 || strcmp(url, "/rerank") == 0 ||
           strcmp(url, "/v1/reranking") == 0 || strcmp(url, "/reranking") == 0;
}

void server_serve_reranking(server *s, const engine_reranker *r) {
    s->reranker = r;
}

typedef struct rerank_doc {
    const char *text; /* in the body */
    int32_t *ids;     /* (n) owned: the pair's tokens */
    int n;
    double logit;
} rerank_doc;

typedef struct rerank_req {
    bool tei;          /* `texts`: TEI's shape, answered as a bare array */
    const char *query; /* in the body */
    rerank_doc *docs;  /* (n_docs) owned */
    int n_docs;
    int top_n;        /* results answered */
    int max_doc;      /* tokens of a document kept (Cohere's max_tokens_per_doc); 0: all */
    bool return_docs; /* each result carries its document (TEI: return_text) */
    bool raw;         /* TEI's raw_scores: the logit, not its sigmoid */
    int tokens;       /* of every pair */
} rerank_req;

static int get_bool(json_t *b, const char *key, bool *out, base_err *err) {
    json_t *v = server_json_field(b, key);
    if (v && !json_is_boolean(v)) return base_fail(err, "'%s' must be true or false", key);
    if (v) *out = json_is_true(v);
    return 0;
}

static int get_count(json_t *b, const char *key, int *out, base_err *err) {
    json_t *v = server_json_field(b, key);
    if (!v) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > INT32_MAX)
        return base_fail(err, "'%s' must be a positive integer", key);
    *out = (int)json_integer_value(v);
    return 0;
}

/* The body's fields: known ones only, the query, and the options of its shape. */
static int parse_fields(json_t *b, rerank_req *q, base_err *err) {
    static const char *const jina_keys[] = {
        "model", "query", "documents", "top_n", "return_documents", "max_tokens_per_doc", NULL};
    static const char *const tei_keys[] = {"model",       "query",      "texts",
                                           "return_text", "raw_scores", NULL};
    q->tei = json_object_get(b, "texts") != NULL;
    if (q->tei && json_object_get(b, "documents"))
        return base_fail(err, "'documents' and 'texts' (TEI's name for them) are both given");
    if (server_known_keys(b, "", q->tei ? tei_keys : jina_keys, err)) return -1;
    json_t *name = server_json_field(b, "model"), *query = server_json_field(b, "query");
    if (name && !json_is_string(name)) return base_fail(err, "'model' must be a string");
    if (!query) return base_fail(err, "'query' is required");
    if (!json_is_string(query) || !json_string_length(query))
        return base_fail(err, "'query' must be a non-empty string");
    q->query = json_string_value(query);
    return get_bool(b, q->tei ? "return_text" : "return_documents", &q->return_docs, err) ||
           get_bool(b, "raw_scores", &q->raw, err) || get_count(b, "top_n", &q->top_n, err) ||
           get_count(b, "max_tokens_per_doc", &q->max_doc, err);
}

/* documents[i]: a string, or Cohere's {"text": string}. */
static int doc_text(json_t *v, const char *key, size_t i, const char **text, base_err *err) {
    static const char *const keys[] = {"text", NULL};
    char at[48];
    snprintf(at, sizeof at, "%s[%zu]", key, i);
    if (json_is_object(v)) {
        if (server_known_keys(v, at, keys, err)) return -1;
        v = json_object_get(v, "text");
        if (!json_is_string(v)) return base_fail(err, "'%s.text' must be a string", at);
    } else if (!json_is_string(v)) {
        return base_fail(err, "'%s' must be a string or an object {\"text\": string}", at);
    }
    *text = json_string_value(v);
    return 0;
}

/* The documents, each joined to the query in tokens. */
static int parse_docs(server *s, json_t *b, rerank_req *q, base_err *err) {
    const char *key = q->tei ? "texts" : "documents";
    json_t *docs = server_json_field(b, key);
    if (!docs) return base_fail(err, "'%s' is required", key);
    if (!json_is_array(docs) || !json_array_size(docs))
        return base_fail(err, "'%s' must be a non-empty array", key);
    if (json_array_size(docs) > SERVER_MAX_RERANK_DOCS)
        return base_fail(err, "'%s' holds more than %d documents", key, SERVER_MAX_RERANK_DOCS);
    q->n_docs = (int)json_array_size(docs);
    q->docs = base_xcalloc((size_t)q->n_docs, sizeof *q->docs);
    int ctx = s->rt->kv_plan.ctx_size;
    for (int i = 0; i < q->n_docs; i++) {
        rerank_doc *d = &q->docs[i];
        if (doc_text(json_array_get(docs, (size_t)i), key, (size_t)i, &d->text, err)) return -1;
        if (engine_rerank_pair(s->pr->tok, s->reranker, q->query, d->text, q->max_doc, &d->ids,
                               &d->n, err))
            return base_fail_wrap(err, "'%s[%d]'", key, i);
        if (d->n > ctx)
            return base_fail(err,
                             "'%s[%d]' with the query is %d tokens, more than the context size "
                             "(%d)%s",
                             key, i, d->n, ctx,
                             q->tei ? "" : " (max_tokens_per_doc keeps a document's first tokens)");
        q->tokens += d->n;
    }
    if (!q->top_n || q->top_n > q->n_docs) q->top_n = q->n_docs;
    return 0;
}

typedef struct rerank_job {
    const engine_reranker *r;
    rerank_doc *d;
} rerank_job;

static int score_between(void *ctx, engine_runtime *rt, base_err *err) {
    rerank_job *j = ctx;
    return engine_rerank(rt, j->r, j->d->ids, j->d->n, &j->d->logit, err);
}

/* Highest score first; equal scores keep the documents' order. */
static int by_score(const void *a, const void *b) {
    const rerank_doc *x = *(rerank_doc *const *)a, *y = *(rerank_doc *const *)b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return x < y ? -1 : x > y;
}

static json_t *response(server *s, const rerank_req *q) {
    rerank_doc **order = base_xmalloc((size_t)q->n_docs * sizeof *order);
    for (int i = 0; i < q->n_docs; i++) order[i] = &q->docs[i];
    qsort(order, (size_t)q->n_docs, sizeof *order, by_score);
    json_t *results = json_array();
    for (int k = 0; k < q->top_n; k++) {
        const rerank_doc *d = order[k];
        double score = q->raw ? d->logit : 1.0 / (1.0 + exp(-d->logit));
        json_t *r = json_pack("{s:i,s:f}", "index", (int)(d - q->docs),
                              q->tei ? "score" : "relevance_score", score);
        if (q->return_docs)
            json_object_set_new(r, q->tei ? "text" : "document",
                                q->tei ? json_string(d->text)
                                       : json_pack("{s:s}", "text", d->text));
        json_array_append_new(results, r);
    }
    free(order);
    if (q->tei) return results;
    static uint64_t counter;
    char id[48];
    snprintf(id, sizeof id, "rerank-%llx%06llx", (unsigned long long)time(NULL),
             (unsigned long long)__atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
    return json_pack("{s:s,s:s,s:s,s:o,s:{s:i,s:i}}", "id", id, "model", s->o.model_id, "object",
                     "list", "results", results, "usage", "prompt_tokens", q->tokens,
                     "total_tokens", q->tokens);
}

enum MHD_Result server_route_rerank(server *s, struct MHD_Connection *c, json_t *body,
                                    server_exchange *x) {
    if (!s->reranker)
        return server_reply_error(s, c, 501, "not_supported_error",
                                  "reranking is off: start the server with --reranking");
    rerank_req q = {0};
    base_err err;
    unsigned status = parse_fields(body, &q, &err) || parse_docs(s, body, &q, &err) ? 400 : 200;
    for (int i = 0; status == 200 && i < q.n_docs; i++) {
        rerank_job j = {s->reranker, &q.docs[i]};
        if (engine_sched_run_between(s->sched, score_between, &j, &err)) status = 500;
    }
    x->n_in = q.tokens;
    x->n_out = 0;
    enum MHD_Result r =
        status != 200 ? server_reply_error(s, c, status,
                                           status == 400 ? "invalid_request_error" : "server_error",
                                           "%s", err.msg)
                      : server_reply_json(s, c, 200, response(s, &q));
    for (int i = 0; i < q.n_docs; i++) free(q.docs[i].ids);
    free(q.docs);
    return r;
}
