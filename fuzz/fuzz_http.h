/* The HTTP routes' request bodies, shared by fuzz/fuzz_http_body.c and by the regression test
 * (tests/fuzz_regress). The first byte picks the route (its value modulo 6, so that '0' to '5'
 * keep seed files readable); the rest is the body, parsed as the server parses it and handed
 * to the route's own body handling with the demo model's tokenizer and chat template. It
 * stops where the server would submit to the scheduler, and checks what the code after that
 * point takes for granted. */
#ifndef MLXCEL_FUZZ_HTTP_H
#define MLXCEL_FUZZ_HTTP_H

#include "fuzz_targets.h"
#include "server/server_params.h"

#include <math.h>

enum {
    FUZZ_HTTP_CHAT,           /* /v1/chat/completions */
    FUZZ_HTTP_COMPLETIONS,    /* /v1/completions */
    FUZZ_HTTP_LLAMA,          /* /completion */
    FUZZ_HTTP_TOKENIZE,       /* /tokenize */
    FUZZ_HTTP_DETOKENIZE,     /* /detokenize */
    FUZZ_HTTP_APPLY_TEMPLATE, /* /apply-template */
    FUZZ_HTTP_N_ROUTES
};

/* The context prompts are judged against before they are tokenized (the demo model holds 512). */
#define FUZZ_HTTP_CTX 512

/* mlxcel-server's default --max-body: larger bodies get a 413 before they are parsed. */
#define FUZZ_HTTP_MAX_BODY (8u << 20)

/* What every input shares, loaded once. */
typedef struct fuzz_http_state {
    engine_prompter *pr;
    int vocab;        /* config.json's vocab_size: the server checks ids against it */
    server_options o; /* mlxcel-server's defaults that the parser reads */
    float *bias_sum;  /* (vocab) the logit biases added up, as the sampler adds them */
} fuzz_http_state;

/* Loads the demo model's tokenizer, template and vocabulary size; exits when it cannot, since
 * every input would then test nothing. */
static inline const fuzz_http_state *fuzz_http_setup(void) {
    static fuzz_http_state st;
    if (st.pr) return &st;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/models/demo", fuzz_source_dir());
    base_err err = {{0}};
    io_model_config cfg;
    if (engine_prompter_open(dir, NULL, &st.pr, &err) || model_config_load(dir, &cfg, NULL, &err)) {
        fprintf(stderr, "fuzz: cannot load the demo model: %s\n", err.msg);
        exit(1);
    }
    st.vocab = cfg.vocab_size;
    io_config_free(&cfg);
    engine_sampling_defaults(&st.o.defaults);
    st.bias_sum = base_xcalloc((size_t)st.vocab, sizeof *st.bias_sum);
    return &st;
}

/* A response must be something server_reply_json can send; a NULL or unprintable one would
 * drop the connection instead of answering. */
static inline void fuzz_http_require_reply(json_t *o, const char *key) {
    fuzz_require(json_is_object(o), "a successful route built no response object");
    fuzz_require(json_object_get(o, key) != NULL, "the response lacks its field");
    char *text = json_dumps(o, JSON_COMPACT);
    fuzz_require(text != NULL, "the response cannot be serialized");
    free(text);
}

/* A generation body that parses must be one the scheduler and the response code can take. */
static inline void fuzz_http_check_params(const fuzz_http_state *st, server_kind kind,
                                          const server_params *p) {
    const engine_request *r = &p->req;
    fuzz_require(p->kind == kind, "the parsed kind differs from the route");
    fuzz_require(p->n_stop >= 0 && p->n_stop <= SERVER_MAX_STOP, "n_stop out of bounds");
    fuzz_require(r->n_stop == p->n_stop && r->stop == p->stop, "the request's stop list differs");
    for (int i = 0; i < p->n_stop; i++)
        fuzz_require(p->stop[i] && p->stop[i][0], "a stop string is NULL or empty");
    fuzz_require(p->n_prompts >= 1 && p->prompts, "no prompt");
    fuzz_require(p->n_choices >= 1 && p->best_of >= p->n_choices &&
                     p->n_prompts * p->best_of <= SERVER_MAX_CHOICES,
                 "n, best_of or the prompt count out of bounds");
    for (int k = 0; k < p->n_prompts; k++) {
        const server_prompt *e = &p->prompts[k];
        fuzz_require(e->n_ids > 0 && e->ids, "prompt ids missing");
        for (int i = 0; i < e->n_ids; i++)
            fuzz_require(e->ids[i] >= 0 && e->ids[i] < st->vocab &&
                             e->ids[i] < tok_vocab_size(st->pr->tok),
                         "a prompt id outside the vocabulary");
    }
    for (int i = 0; i < r->n_stop_ids; i++)
        fuzz_require(r->stop_ids[i] >= 0 && r->stop_ids[i] < st->vocab,
                     "a stop token id outside the vocabulary");
    fuzz_require(r->top_logprobs >= 0 && r->top_logprobs <= ENGINE_MAX_TOP_LOGPROBS,
                 "top_logprobs out of bounds");
    fuzz_require(r->top_logprobs == 0 || r->logprobs, "top_logprobs without logprobs");
    fuzz_require(r->max_tokens >= -1, "max_tokens below -1");
    const engine_sampling *s = &r->sampling;
    fuzz_require(s->n_logit_bias >= 0 && (s->n_logit_bias == 0 || s->logit_bias == p->bias),
                 "the request's logit biases differ");
    for (int i = 0; i < s->n_logit_bias; i++) {
        int32_t t = s->logit_bias[i].token;
        fuzz_require(t >= 0 && t < st->vocab, "a logit_bias token outside the vocabulary");
        st->bias_sum[t] += s->logit_bias[i].bias;
    }
    /* the sampler adds the biases to the logits: a logit must stay finite, or become -inf (a
     * ban), else softmax turns to NaN and the draw picks an arbitrary token */
    bool finite = true;
    for (int i = 0; i < s->n_logit_bias; i++) {
        float b = st->bias_sum[s->logit_bias[i].token];
        if (!(b == -INFINITY || fabsf(b) <= 1e30f)) finite = false;
        st->bias_sum[s->logit_bias[i].token] = 0;
    }
    fuzz_require(finite, "logit biases add up to +inf, NaN, or near the float limit");
    engine_sampler *smp = NULL;
    base_err err = {{0}};
    if (engine_sampler_new(s, st->vocab, &smp, &err) != 0) {
        fprintf(stderr, "fuzz: %s\n", err.msg);
        fuzz_require(false, "the sampler refuses parameters the parser accepted");
    }
    engine_sampler_free(smp);
    /* the grammar is the body's own GBNF (the engine refuses a bad one at submission) or one
     * compiled from a schema, which must always parse */
    fuzz_require(!r->grammar || r->grammar == p->gbnf || r->grammar[0],
                 "an empty grammar was passed on");
    if (p->gbnf) {
        gram_grammar *g = NULL;
        fuzz_require(r->grammar == p->gbnf, "a compiled grammar that the request does not use");
        if (gram_parse(p->gbnf, strlen(p->gbnf), &g, &err) != 0) {
            fprintf(stderr, "fuzz: %s\n", err.msg);
            fuzz_require(false, "the GBNF compiled from a schema does not parse");
        }
        gram_free(g);
    }
    /* a forced tool call's grammar, built from the tools' schemas, must always parse too */
    if (p->tool_gbnf) {
        gram_grammar *g = NULL;
        fuzz_require(r->grammar == p->tool_gbnf,
                     "a tool-call grammar that the request does not use");
        if (gram_parse(p->tool_gbnf, strlen(p->tool_gbnf), &g, &err) != 0) {
            fprintf(stderr, "fuzz: %s\n", err.msg);
            fuzz_require(false, "the GBNF of a forced tool call does not parse");
        }
        gram_free(g);
    }
}

static inline int fuzz_http_body(const uint8_t *data, size_t size) {
    const fuzz_http_state *st = fuzz_http_setup();
    if (size == 0 || size - 1 > FUZZ_HTTP_MAX_BODY) return 0;
    int route = data[0] % FUZZ_HTTP_N_ROUTES;
    json_error_t je;
    json_t *body = json_loadb((const char *)data + 1, size - 1, 0, &je);
    if (!body || !json_is_object(body)) {
        json_decref(body);
        return 0;
    }
    base_err err = {{0}};
    json_t *out = NULL;
    int rc;
    switch (route) {
    case FUZZ_HTTP_TOKENIZE:
        rc = server_body_tokenize(st->pr, body, &out, &err);
        if (rc == 0) {
            fuzz_http_require_reply(out, "tokens");
            size_t i;
            json_t *e;
            json_array_foreach(json_object_get(out, "tokens"), i, e) {
                fuzz_require(json_is_integer(e) && json_integer_value(e) >= 0 &&
                                 json_integer_value(e) < tok_vocab_size(st->pr->tok),
                             "/tokenize returned an id outside the vocabulary");
            }
        }
        break;
    case FUZZ_HTTP_DETOKENIZE:
        rc = server_body_detokenize(st->pr, body, &out, &err);
        if (rc == 0) fuzz_http_require_reply(out, "content");
        break;
    case FUZZ_HTTP_APPLY_TEMPLATE:
        rc = server_body_apply_template(st->pr, body, &out, &err);
        if (rc == 0) fuzz_http_require_reply(out, "prompt");
        break;
    default: {
        static const server_kind kinds[] = {SERVER_CHAT, SERVER_COMPLETIONS,
                                            SERVER_LLAMA_COMPLETION};
        server_params p;
        rc = server_params_parse(body, kinds[route], &st->o, st->pr, st->vocab, FUZZ_HTTP_CTX, &p,
                                 &err);
        if (rc == 0) fuzz_http_check_params(st, kinds[route], &p);
        server_params_free(&p);
    }
    }
    if (rc != 0) {
        fuzz_require(rc == -1, "a failure returned something other than -1");
        fuzz_require_err(&err);
    }
    json_decref(out);
    json_decref(body);
    return 0;
}

#endif
