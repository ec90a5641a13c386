/* Fill-in-the-middle: llama-server's POST /infill (input_prefix, input_suffix, input_extra,
 * prompt, and /completion's other fields) and the prompt of the completions routes' `suffix`.
 * The prompt is built in the prefix-suffix-middle order llama-server builds:
 *
 *   [REPO]myproject\n [SEP]name\n text ... [SEP]filename\n   (input_extra, when there is any)
 *   [BOS] PRE prefix prompt SUF suffix MID
 *
 * with REPO and SEP where the tokenizer has them (Qwen2.5-Coder's <|repo_name|> and
 * <|file_sep|>, StarCoder's <reponame> and <file_sep>), else each extra chunk after a
 * "--- snippet ---" line; the model writes what goes at MID. /infill cuts the parts as
 * llama-server does (server_fim_parts' budget), so that an editor may send whole files: the
 * prefix and suffix to fit one batch, 3:1 (the prefix's end and the suffix's start: the text
 * nearest the cursor), the extra context's end to fill what the context leaves. */
#include "server/server_internal.h"
#include "server/server_params.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The spellings of PRE, SUF, MID by family, and of the repository and file separators. */
static const char *const g_fim[][3] = {
    {"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"}, /* Qwen2.5-Coder, Qwen3 */
    {"<fim_prefix>", "<fim_suffix>", "<fim_middle>"},       /* StarCoder */
    {"<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"}, /* DeepSeek-Coder */
    {"▁<PRE>", "▁<SUF>", "▁<MID>"},                         /* CodeLlama */
    {"<PRE>", "<SUF>", "<MID>"},
};
static const char *const g_repo[] = {"<|repo_name|>", "<reponame>", "<repo_name>"};
static const char *const g_sep[] = {"<|file_sep|>", "<file_sep>"};

static int32_t first_of(const tok_tokenizer *tok, const char *const *names, size_t n) {
    for (size_t i = 0; i < n; i++) {
        int32_t id = tok_token_id(tok, names[i]);
        if (id >= 0) return id;
    }
    return -1;
}

int server_fim_tokens(const tok_tokenizer *tok, server_fim *f, base_err *err) {
    for (size_t i = 0; i < sizeof g_fim / sizeof *g_fim; i++) {
        for (int k = 0; k < 3; k++) f->ids[k] = tok_token_id(tok, g_fim[i][k]);
        if (f->ids[0] >= 0 && f->ids[1] >= 0 && f->ids[2] >= 0) {
            f->repo = first_of(tok, g_repo, sizeof g_repo / sizeof *g_repo);
            f->sep = first_of(tok, g_sep, sizeof g_sep / sizeof *g_sep);
            return 0;
        }
    }
    return base_fail(err, "this model's tokenizer has no fill-in-the-middle tokens (it has none of "
                          "<|fim_prefix|> <|fim_suffix|> <|fim_middle|>, <fim_prefix> <fim_suffix> "
                          "<fim_middle>, <｜fim▁begin｜> <｜fim▁hole｜> <｜fim▁end｜>, <PRE> <SUF> "
                          "<MID>)");
}

typedef struct ids_buf {
    int32_t *v; /* (cap) */
    int n, cap;
} ids_buf;

static void put(ids_buf *b, const int32_t *ids, size_t n) {
    if (b->n + (int)n > b->cap) {
        b->cap = (b->n + (int)n) * 2 + 16;
        b->v = base_xrealloc(b->v, (size_t)b->cap * sizeof *b->v);
    }
    if (n) memcpy(b->v + b->n, ids, n * sizeof *ids);
    b->n += (int)n;
}

static void put1(ids_buf *b, int32_t id) {
    put(b, &id, 1);
}

/* Text without the tokenizer's special tokens; `what` names it in errors. */
static int put_text(ids_buf *b, const engine_prompter *pr, const char *text, const char *what,
                    base_err *err) {
    int32_t *ids = NULL;
    size_t n = 0;
    if (tok_encode(pr->tok, text, strlen(text), false, &ids, &n, err))
        return base_fail_wrap(err, "'%s'", what);
    put(b, ids, n);
    free(ids);
    return 0;
}

/* input_extra: [{"filename": string, "text": string}], the file context before the prefix. */
static int put_extra(ids_buf *b, const engine_prompter *pr, const server_fim *f, json_t *extra,
                     base_err *err) {
    static const char *const keys[] = {"filename", "text", NULL};
    if (!json_is_array(extra))
        return base_fail(err, "'input_extra' must be an array of {\"filename\", \"text\"}");
    if (!json_array_size(extra)) return 0;
    if (f->repo >= 0) {
        put1(b, f->repo);
        if (put_text(b, pr, "myproject\n", "input_extra", err)) return -1;
    }
    size_t i;
    json_t *c;
    json_array_foreach(extra, i, c) {
        char at[48];
        snprintf(at, sizeof at, "input_extra[%zu]", i);
        if (!json_is_object(c)) return base_fail(err, "'%s' must be an object", at);
        if (server_known_keys(c, at, keys, err)) return -1;
        json_t *name = server_json_field(c, "filename"), *text = json_object_get(c, "text");
        if (!json_is_string(text)) return base_fail(err, "'%s.text' must be a string", at);
        if (name && !json_is_string(name))
            return base_fail(err, "'%s.filename' must be a string", at);
        char *line = base_xmalloc((name ? json_string_length(name) : 3) + 2);
        sprintf(line, "%s\n", name ? json_string_value(name) : "tmp");
        int rc = 0;
        if (f->sep >= 0) {
            put1(b, f->sep);
            rc = put_text(b, pr, line, at, err);
        } else {
            rc = put_text(b, pr, "\n\n--- snippet ---\n\n", at, err);
        }
        free(line);
        if (rc || put_text(b, pr, json_string_value(text), at, err)) return -1;
    }
    if (f->sep >= 0) {
        put1(b, f->sep);
        return put_text(b, pr, "filename\n", "input_extra", err);
    }
    return 0;
}

/* Keeps `take` ids of b: its last ones (from_end) or its first. */
static void keep(ids_buf *b, int take, bool from_end) {
    if (take < 0) take = 0;
    if (take >= b->n) return;
    if (from_end) memmove(b->v, b->v + b->n - take, (size_t)take * sizeof *b->v);
    b->n = take;
}

int server_fim_prompt(const engine_prompter *pr, const server_fim *f, const server_fim_parts *in,
                      int32_t **ids, int *n, base_err *err) {
    ids_buf b = {0}, extra = {0}, prefix = {0}, suffix = {0};
    const int32_t *pre, *suf;
    size_t n_pre, n_suf;
    tok_special_ends(pr->tok, &pre, &n_pre, &suf, &n_suf);
    int rc = (in->extra && put_extra(&extra, pr, f, in->extra, err)) ||
             put_text(&prefix, pr, in->prefix, in->prefix_key, err) ||
             put_text(&suffix, pr, in->suffix, in->suffix_key, err);
    if (rc == 0 && in->n_batch > 0) {
        int reserve = in->n_predict > 0 ? 2 * in->n_predict : 0;
        keep(&prefix, 3 * (in->n_batch / 4), true);
        keep(&suffix, in->n_batch / 4 - (2 + in->n_prompt), false);
        keep(&extra, in->n_ctx - in->n_batch - reserve, true);
    }
    if (rc == 0) {
        put(&b, extra.v, (size_t)extra.n);
        put(&b, pre, n_pre);
        put1(&b, f->ids[0]);
        put(&b, prefix.v, (size_t)prefix.n);
        put(&b, in->prompt, (size_t)in->n_prompt);
        put1(&b, f->ids[1]);
        put(&b, suffix.v, (size_t)suffix.n);
        put1(&b, f->ids[2]);
    }
    free(extra.v);
    free(prefix.v);
    free(suffix.v);
    if (rc) {
        free(b.v);
        return -1;
    }
    *ids = b.v;
    *n = b.n;
    return 0;
}

static int get_text(json_t *b, const char *key, const char **out, base_err *err) {
    json_t *v = server_json_field(b, key);
    *out = "";
    if (v && !json_is_string(v)) return base_fail(err, "'%s' must be a string", key);
    if (v) *out = json_string_value(v);
    return 0;
}

/* /infill's `prompt`: text typed at the cursor, a string or token ids, after input_prefix. */
static int infill_prompt(server *s, json_t *v, int32_t **ids, int *n, base_err *err) {
    int vocab = model_config(s->rt->model)->vocab_size;
    *ids = NULL;
    *n = 0;
    if (!v) return 0;
    if (json_is_string(v)) {
        size_t len = 0;
        if (tok_encode(s->pr->tok, json_string_value(v), json_string_length(v), false, ids, &len,
                       err))
            return base_fail_wrap(err, "'prompt'");
        *n = (int)len;
        return 0;
    }
    if (!json_is_array(v)) return base_fail(err, "'prompt' must be a string or token ids");
    *n = (int)json_array_size(v);
    *ids = base_xmalloc(((size_t)*n + 1) * sizeof **ids);
    for (int i = 0; i < *n; i++) {
        json_t *t = json_array_get(v, (size_t)i);
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= vocab)
            return base_fail(err, "'prompt[%d]' must be a token id below %d", i, vocab);
        (*ids)[i] = (int32_t)json_integer_value(t);
    }
    return 0;
}

/* The body /completion reads: the infill fields replaced by the prompt's token ids. */
static int completion_body(server *s, json_t *body, json_t **out, base_err *err) {
    server_fim f;
    /* the batch as llama.cpp's context takes it: -b, at most the context */
    int ctx = s->rt->kv_plan.ctx_size, batch = engine_sched_batch_tokens(s->sched);
    server_fim_parts in = {.prefix_key = "input_prefix",
                           .suffix_key = "input_suffix",
                           .n_batch = batch < ctx ? batch : ctx,
                           .n_ctx = ctx,
                           .n_predict = server_options_now(s).n_predict};
    if (json_object_get(body, "suffix"))
        return base_fail(err, "'suffix' is the completions routes' field: /infill takes "
                              "'input_suffix'");
    in.extra = server_json_field(body, "input_extra");
    int32_t *prompt = NULL, *ids = NULL;
    int n = 0;
    int rc = server_fim_tokens(s->pr->tok, &f, err) ||
             get_text(body, "input_prefix", &in.prefix, err) ||
             get_text(body, "input_suffix", &in.suffix, err) ||
             infill_prompt(s, server_json_field(body, "prompt"), &prompt, &in.n_prompt, err);
    in.prompt = prompt;
    rc = rc || server_fim_prompt(s->pr, &f, &in, &ids, &n, err);
    free(prompt);
    if (rc) return -1;
    *out = json_deep_copy(body);
    json_object_del(*out, "input_prefix");
    json_object_del(*out, "input_suffix");
    json_object_del(*out, "input_extra");
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(arr, json_integer(ids[i]));
    json_object_set_new(*out, "prompt", arr);
    free(ids);
    return 0;
}

enum MHD_Result server_route_infill(server *s, struct MHD_Connection *c, const char *version,
                                    json_t *body, server_exchange *x) {
    base_err err;
    json_t *b = NULL;
    server_params p;
    server_options o = server_options_now(s);
    int vocab = model_config(s->rt->model)->vocab_size;
    if (completion_body(s, body, &b, &err))
        return server_reply_error(s, c, 400, "invalid_request_error", "%s", err.msg);
    if (server_params_parse(b, SERVER_LLAMA_COMPLETION, &o, s->pr, vocab, s->rt->kv_plan.ctx_size,
                            &p, &err)) {
        server_params_free(&p);
        json_decref(b);
        return server_reply_error(s, c, 400, "invalid_request_error", "%s", err.msg);
    }
    enum MHD_Result rc = server_generate(s, c, version, &p, NULL, x);
    json_decref(b);
    return rc;
}
