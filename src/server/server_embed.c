/* Embeddings, with --embeddings: OpenAI's POST /v1/embeddings (also /embeddings) and
 * llama-server's /embedding. Each input is text, tokenized with the tokenizer's special tokens
 * as sentence-transformers tokenizes it, or token ids; it is embedded (engine_embed: pooled as
 * the checkpoint says, normalized) on the scheduler's thread between two steps, where the
 * runtime is free, so that it never races a step. */
#include "server/server_internal.h"

#include <stdlib.h>
#include <string.h>

/* OpenAI's limit on the inputs of one request. */
#define SERVER_MAX_EMBED_INPUTS 2048

bool server_is_embed_route(const char *url) {
    return strcmp(url, "/v1/embeddings") == 0 || strcmp(url, "/embeddings") == 0 ||
           strcmp(url, "/embedding") == 0;
}

void server_serve_embeddings(server *s, engine_pooling pooling) {
    s->embeddings = true;
    s->pooling = pooling;
}

typedef struct embed_input {
    int32_t *ids; /* (n) owned */
    int n;
} embed_input;

typedef struct embed_job {
    engine_pooling pooling;
    const embed_input *in;
    float *out;
} embed_job;

static int embed_between(void *ctx, engine_runtime *rt, base_err *err) {
    embed_job *j = ctx;
    return engine_embed(rt, j->pooling, j->in->ids, j->in->n, j->out, err);
}

/* One input: a string, or an array of token ids; `what` names it in errors. */
static int parse_one(server *s, json_t *v, const char *what, embed_input *e, base_err *err) {
    int vocab = model_config(s->rt->model)->vocab_size, ctx = s->rt->kv_plan.ctx_size;
    if (json_is_string(v)) {
        if (!json_string_length(v)) return base_fail(err, "'%s' is an empty string", what);
        return engine_prompter_encode_text(s->pr, json_string_value(v), ctx, &e->ids, &e->n, err);
    }
    if (!json_is_array(v) || !json_array_size(v))
        return base_fail(err, "'%s' must be a non-empty string or array of token ids", what);
    e->n = (int)json_array_size(v);
    e->ids = base_xmalloc((size_t)e->n * sizeof *e->ids);
    for (int i = 0; i < e->n; i++) {
        json_t *t = json_array_get(v, (size_t)i);
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= vocab)
            return base_fail(err, "'%s[%d]' must be a token id below %d", what, i, vocab);
        e->ids[i] = (int32_t)json_integer_value(t);
    }
    return 0;
}

/* The inputs: one string, one array of ids, or an array of either. *in: caller frees. */
static int parse_inputs(server *s, json_t *v, const char *key, embed_input **in, int *n,
                        base_err *err) {
    json_t *first = json_array_get(v, 0);
    bool several = json_is_array(v) && (json_is_string(first) || json_is_array(first));
    *n = several ? (int)json_array_size(v) : 1;
    if (*n > SERVER_MAX_EMBED_INPUTS)
        return base_fail(err, "'%s' holds more than %d inputs", key, SERVER_MAX_EMBED_INPUTS);
    *in = base_xcalloc((size_t)*n, sizeof **in);
    char what[48];
    for (int i = 0; i < *n; i++) {
        if (several)
            snprintf(what, sizeof what, "%s[%d]", key, i);
        else
            snprintf(what, sizeof what, "%s", key);
        if (parse_one(s, several ? json_array_get(v, (size_t)i) : v, what, &(*in)[i], err))
            return -1;
        if ((*in)[i].n > s->rt->kv_plan.ctx_size)
            return base_fail(err, "'%s' has %d tokens, more than the context size (%d)", what,
                             (*in)[i].n, s->rt->kv_plan.ctx_size);
    }
    return 0;
}

static char *base64(const float *v, int n) {
    static const char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    /* float32 little-endian, as OpenAI's clients decode it */
    size_t len = (size_t)n * sizeof *v;
    unsigned char *b = base_xmalloc(len);
    for (int i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], sizeof u);
        for (int k = 0; k < 4; k++) b[4 * i + k] = (unsigned char)(u >> (8 * k));
    }
    char *out = base_xmalloc((len + 2) / 3 * 4 + 1), *w = out;
    for (size_t i = 0; i < len; i += 3) {
        uint32_t x = (uint32_t)b[i] << 16 | (i + 1 < len ? (uint32_t)b[i + 1] << 8 : 0) |
                     (i + 2 < len ? b[i + 2] : 0);
        *w++ = digits[x >> 18 & 63];
        *w++ = digits[x >> 12 & 63];
        *w++ = i + 1 < len ? digits[x >> 6 & 63] : '=';
        *w++ = i + 2 < len ? digits[x & 63] : '=';
    }
    *w = 0;
    free(b);
    return out;
}

static json_t *vector_json(const float *v, int n, bool b64) {
    if (b64) {
        char *t = base64(v, n);
        json_t *o = json_string(t);
        free(t);
        return o;
    }
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_real(v[i]));
    return a;
}

/* The body's fields: the inputs' key, encoding_format, and dimensions (which must be the
 * model's: vectors are not truncated). `user` and `model` change nothing. */
static int parse_body(server *s, json_t *b, bool llama, const char **key, bool *b64,
                      base_err *err) {
    static const char *const openai_keys[] = {"input",      "model", "encoding_format",
                                              "dimensions", "user",  NULL};
    static const char *const llama_keys[] = {"content", "input", "encoding_format", NULL};
    const char *const *keys = llama ? llama_keys : openai_keys;
    const char *k;
    json_t *v;
    json_object_foreach(b, k, v) {
        size_t i = 0;
        while (keys[i] && strcmp(k, keys[i]) != 0) i++;
        if (!keys[i]) return base_fail(err, "'%s' is not supported", k);
    }
    *key = llama && json_object_get(b, "content") ? "content" : "input";
    if (!json_object_get(b, *key)) return base_fail(err, "'%s' is required", *key);
    json_t *fmt = json_object_get(b, "encoding_format"), *dims = json_object_get(b, "dimensions");
    const char *f = json_string_value(fmt);
    if (fmt && !(f && (strcmp(f, "float") == 0 || strcmp(f, "base64") == 0)))
        return base_fail(err, "'encoding_format' must be float or base64");
    *b64 = f && strcmp(f, "base64") == 0;
    int dim = model_config(s->rt->model)->hidden_size;
    if (dims && !(json_is_integer(dims) && json_integer_value(dims) == dim))
        return base_fail(
            err, "'dimensions': this model's embeddings have %d (they are not truncated)", dim);
    json_t *user = json_object_get(b, "user");
    if (user && !json_is_string(user)) return base_fail(err, "'user' must be a string");
    return 0;
}

static json_t *response(server *s, bool llama, bool b64, const float *vecs, int n, int dim,
                        int tokens) {
    json_t *data = json_array();
    for (int i = 0; i < n; i++) {
        json_t *v = vector_json(vecs + (size_t)i * dim, dim, b64);
        /* llama-server's /embedding gives each input's vectors as rows: one, pooled */
        json_array_append_new(data, llama ? json_pack("{s:i,s:[o]}", "index", i, "embedding", v)
                                          : json_pack("{s:s,s:i,s:o}", "object", "embedding",
                                                      "index", i, "embedding", v));
    }
    if (llama) return data;
    return json_pack("{s:s,s:o,s:s,s:{s:i,s:i}}", "object", "list", "data", data, "model",
                     s->o.model_id, "usage", "prompt_tokens", tokens, "total_tokens", tokens);
}

enum MHD_Result server_route_embed(server *s, struct MHD_Connection *c, const char *url,
                                   json_t *body, server_exchange *x) {
    if (!s->embeddings)
        return server_reply_error(s, c, 501, "not_supported_error",
                                  "embeddings are off: start the server with --embeddings");
    bool llama = strcmp(url, "/embedding") == 0, b64 = false;
    const char *key = NULL;
    embed_input *in = NULL;
    int n = 0, dim = model_config(s->rt->model)->hidden_size, tokens = 0;
    base_err err;
    int rc = parse_body(s, body, llama, &key, &b64, &err) ||
             parse_inputs(s, json_object_get(body, key), key, &in, &n, &err);
    unsigned status = rc ? 400 : 200;
    float *vecs = rc ? NULL : base_xmalloc((size_t)n * dim * sizeof *vecs);
    for (int i = 0; rc == 0 && i < n; i++) {
        embed_job j = {s->pooling, &in[i], vecs + (size_t)i * dim};
        rc = engine_sched_run_between(s->sched, embed_between, &j, &err);
        tokens += in[i].n;
        if (rc) status = 500;
    }
    for (int i = 0; i < n && in; i++) free(in[i].ids);
    free(in);
    x->n_in = tokens;
    x->n_out = 0;
    enum MHD_Result r =
        status != 200 ? server_reply_error(s, c, status,
                                           status == 400 ? "invalid_request_error" : "server_error",
                                           "%s", err.msg)
                      : server_reply_json(s, c, 200, response(s, llama, b64, vecs, n, dim, tokens));
    free(vecs);
    return r;
}
