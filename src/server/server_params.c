/* Request fields to an engine request: types and ranges checked field by field, so that a
 * 400 names the field at fault. Absent and null fields keep the server's defaults. */
#include "server/server_params.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static json_t *field(json_t *b, const char *key) {
    json_t *v = json_object_get(b, key);
    return json_is_null(v) ? NULL : v;
}

static int get_number(json_t *b, const char *key, double lo, double hi, double *out,
                      base_err *err) {
    json_t *v = field(b, key);
    if (!v) return 0;
    if (!json_is_number(v)) return base_fail(err, "'%s' must be a number", key);
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi)) return base_fail(err, "'%s' must be in [%g, %g]", key, lo, hi);
    *out = d;
    return 0;
}

static int get_float(json_t *b, const char *key, double lo, double hi, float *out, base_err *err) {
    double d = *out;
    if (get_number(b, key, lo, hi, &d, err)) return -1;
    *out = (float)d;
    return 0;
}

static int get_int(json_t *b, const char *key, long long lo, long long hi, long long *out,
                   base_err *err) {
    json_t *v = field(b, key);
    if (!v) return 0;
    if (!json_is_integer(v)) return base_fail(err, "'%s' must be an integer", key);
    long long x = json_integer_value(v);
    if (x < lo || x > hi) return base_fail(err, "'%s' must be in [%lld, %lld]", key, lo, hi);
    *out = x;
    return 0;
}

static int get_bool(json_t *b, const char *key, bool *out, base_err *err) {
    json_t *v = field(b, key);
    if (!v) return 0;
    if (!json_is_boolean(v)) return base_fail(err, "'%s' must be true or false", key);
    *out = json_is_true(v);
    return 0;
}

static int parse_stop(json_t *b, server_params *p, base_err *err) {
    json_t *v = field(b, "stop");
    if (!v) return 0;
    if (json_is_string(v)) {
        if (!json_string_length(v)) return base_fail(err, "'stop' must be a non-empty string");
        p->stop[p->n_stop++] = json_string_value(v);
        return 0;
    }
    if (!json_is_array(v) || json_array_size(v) > SERVER_MAX_STOP)
        return base_fail(err, "'stop' must be a string or an array of at most %d strings",
                         SERVER_MAX_STOP);
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) {
        if (!json_is_string(e) || !json_string_length(e))
            return base_fail(err, "'stop[%zu]' must be a non-empty string", i);
        p->stop[p->n_stop++] = json_string_value(e);
    }
    return 0;
}

static int parse_logit_bias(json_t *b, int vocab, server_params *p, base_err *err) {
    json_t *v = field(b, "logit_bias");
    if (!v) return 0;
    if (!json_is_object(v)) return base_fail(err, "'logit_bias' must be an object");
    p->bias = base_xcalloc(json_object_size(v) + 1, sizeof *p->bias);
    const char *key;
    json_t *e;
    json_object_foreach(v, key, e) {
        char *end;
        long t = strtol(key, &end, 10);
        if (end == key || *end || t < 0 || t >= vocab)
            return base_fail(err, "'logit_bias' key '%s' is not a token id below %d", key, vocab);
        /* bounded so that biases added to a logit, however many name one token, stay
         * finite: +inf would leave the sampler's softmax all NaN */
        double d = json_is_number(e) ? json_number_value(e) : 0;
        if ((!json_is_number(e) && !json_is_false(e)) || !(fabs(d) <= 1e6))
            return base_fail(err, "'logit_bias[%s]' must be false or a number in [-1e6, 1e6]", key);
        float bias = json_is_false(e) ? -INFINITY : (float)d;
        p->bias[p->req.sampling.n_logit_bias++] = (engine_logit_bias){(int32_t)t, bias};
    }
    p->req.sampling.logit_bias = p->bias;
    return 0;
}

static int parse_sampling(json_t *b, engine_sampling *s, base_err *err) {
    long long top_k = s->top_k, last_n = s->repeat_last_n, seed = -1;
    if (get_float(b, "temperature", 0, 1e6, &s->temperature, err) ||
        get_float(b, "top_p", 0, 1, &s->top_p, err) ||
        get_float(b, "min_p", 0, 1, &s->min_p, err) ||
        get_float(b, "presence_penalty", -2, 2, &s->presence_penalty, err) ||
        get_float(b, "frequency_penalty", -2, 2, &s->frequency_penalty, err) ||
        get_float(b, "repeat_penalty", 1e-6, 1e6, &s->repeat_penalty, err) ||
        get_int(b, "top_k", 0, INT32_MAX, &top_k, err) ||
        get_int(b, "repeat_last_n", -1, INT32_MAX, &last_n, err) ||
        get_int(b, "seed", INT64_MIN, INT64_MAX, &seed, err))
        return -1;
    s->top_k = (int)top_k;
    s->repeat_last_n = (int)last_n;
    /* -1 is llama-server's "random seed" */
    if (field(b, "seed") && seed != -1) s->seed = (uint64_t)seed;
    return 0;
}

/* The grammar of a JSON Schema (any JSON value, as the body holds it) into p->gbnf; `what`
 * names the field in errors, which otherwise name the schema's keyword and JSON pointer. */
static int schema_grammar(json_t *schema, const char *what, server_params *p, base_err *err) {
    char *text = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!text) return base_fail(err, "'%s' cannot be serialized", what);
    base_err e;
    int rc = gram_schema_to_gbnf(text, strlen(text), &p->gbnf, &e);
    free(text);
    return rc ? base_fail(err, "'%s': %s", what, e.msg) : 0;
}

json_t *server_json_field(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_null(v) ? NULL : v;
}

int server_map_tools(json_t *body, json_t *chat,
                     int (*add)(json_t *t, size_t i, json_t *out, base_err *err), base_err *err) {
    json_t *tools = server_json_field(body, "tools");
    if (!tools) return 0;
    if (!json_is_array(tools)) return base_fail(err, "'tools' must be an array");
    json_t *out = json_array();
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        if (add(t, i, out, err)) {
            json_decref(out);
            return -1;
        }
    }
    json_object_set_new(chat, "tools", out);
    return 0;
}

int server_known_keys(json_t *o, const char *at, const char *const *keys, base_err *err) {
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) {
        size_t k = 0;
        while (keys[k] && strcmp(key, keys[k]) != 0) k++;
        if (!keys[k]) return base_fail(err, "'%s%s%s' is not supported", at, *at ? "." : "", key);
    }
    return 0;
}

/* Every key of object o is one of `keys` (n); `what` names o in the error. */
static int known_keys(json_t *o, const char *what, const char *const *keys, size_t n,
                      base_err *err) {
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) {
        size_t i = 0;
        while (i < n && strcmp(key, keys[i]) != 0) i++;
        if (i == n) return base_fail(err, "'%s.%s' is not supported", what, key);
    }
    return 0;
}

/* OpenAI's json_schema format: {"name", "description", "schema", "strict"}. The grammar is
 * enforced whatever `strict` says: the output then always validates. */
static int parse_format_schema(json_t *f, server_params *p, base_err *err) {
    static const char *const keys[] = {"name", "description", "schema", "strict"};
    json_t *js = json_object_get(f, "json_schema");
    if (!json_is_object(js))
        return base_fail(err, "'response_format.json_schema' must be an object");
    if (known_keys(js, "response_format.json_schema", keys, sizeof keys / sizeof *keys, err))
        return -1;
    json_t *name = field(js, "name"), *desc = field(js, "description"), *schema;
    if (name && !json_is_string(name))
        return base_fail(err, "'response_format.json_schema.name' must be a string");
    if (desc && !json_is_string(desc))
        return base_fail(err, "'response_format.json_schema.description' must be a string");
    bool strict = false;
    if (get_bool(js, "strict", &strict, err)) return -1;
    if (!(schema = field(js, "schema")))
        return base_fail(err, "'response_format.json_schema.schema' is missing");
    return schema_grammar(schema, "response_format.json_schema.schema", p, err);
}

static int parse_format(json_t *b, server_params *p, base_err *err) {
    json_t *v = field(b, "response_format");
    if (!v) return 0;
    json_t *t = json_is_object(v) ? json_object_get(v, "type") : NULL;
    if (!json_is_string(t)) return base_fail(err, "'response_format' must be {\"type\": ...}");
    const char *type = json_string_value(t);
    static const char *const plain[] = {"type"}, *const with_schema[] = {"type", "json_schema"};
    bool schema = strcmp(type, "json_schema") == 0;
    if (!schema && strcmp(type, "text") != 0 && strcmp(type, "json_object") != 0)
        return base_fail(err,
                         "'response_format' type '%s' is not supported (text, json_object or "
                         "json_schema)",
                         type);
    if (known_keys(v, "response_format", schema ? with_schema : plain, schema ? 2 : 1, err))
        return -1;
    if (schema) return parse_format_schema(v, p, err);
    if (strcmp(type, "json_object") == 0) p->gbnf = gram_json_object_gbnf();
    return 0;
}

/* What the output must match: response_format, or llama-server's `grammar` (GBNF text; ""
 * is its "none") or `json_schema` (a schema); at most one of them. The engine compiles the
 * GBNF when the request is submitted (a bad grammar is a 400 from there). */
static int parse_constraint(json_t *b, server_params *p, base_err *err) {
    json_t *g = field(b, "grammar"), *js = field(b, "json_schema");
    if (g && !json_is_string(g)) return base_fail(err, "'grammar' must be a string (GBNF)");
    if (g && !json_string_length(g)) g = NULL;
    if (parse_format(b, p, err)) return -1;
    if ((p->gbnf != NULL) + (g != NULL) + (js != NULL) > 1)
        return base_fail(err, "'response_format' (json_object or json_schema), 'grammar' and "
                              "'json_schema' exclude one another");
    if (js && schema_grammar(js, "json_schema", p, err)) return -1;
    p->req.grammar = g ? json_string_value(g) : p->gbnf;
    return 0;
}

static int parse_logprobs(json_t *b, server_kind kind, server_params *p, base_err *err) {
    long long top = 0;
    json_t *v = field(b, "logprobs");
    if (kind == SERVER_CHAT) {
        if (get_bool(b, "logprobs", &p->req.logprobs, err) ||
            get_int(b, "top_logprobs", 0, ENGINE_MAX_TOP_LOGPROBS, &top, err))
            return -1;
        if (top > 0 && !p->req.logprobs)
            return base_fail(err, "'top_logprobs' needs 'logprobs': true");
    } else if (v) {
        if (get_int(b, "logprobs", 0, ENGINE_MAX_TOP_LOGPROBS, &top, err)) return -1;
        p->req.logprobs = true;
    }
    p->req.top_logprobs = (int)top;
    return 0;
}

static int parse_limits(json_t *b, const server_options *o, server_params *p, base_err *err) {
    long long max_tokens = o->n_predict, min_tokens = 0;
    if (get_int(b, "max_tokens", -1, INT32_MAX, &max_tokens, err) ||
        get_int(b, "max_completion_tokens", -1, INT32_MAX, &max_tokens, err) ||
        get_int(b, "n_predict", -1, INT32_MAX, &max_tokens, err) ||
        get_int(b, "min_tokens", 0, INT32_MAX, &min_tokens, err))
        return -1;
    if (field(b, "max_tokens") && max_tokens == 0)
        return base_fail(err, "'max_tokens' must be at least 1");
    if (max_tokens > 0 && min_tokens > max_tokens)
        return base_fail(err, "'min_tokens' (%lld) is more than 'max_tokens' (%lld)", min_tokens,
                         max_tokens);
    p->req.max_tokens = (int)max_tokens;
    p->req.min_tokens = (int)min_tokens;
    return 0;
}

/* n and best_of: several sequences per prompt. best_of ranks them by log-probability, so it
 * cannot stream (the best are known only at the end), as OpenAI has it. */
static int parse_choices(json_t *b, server_kind kind, server_params *p, base_err *err) {
    long long n = 1, best = 0;
    if (get_int(b, "n", 1, SERVER_MAX_CHOICES, &n, err) ||
        get_int(b, "best_of", 1, SERVER_MAX_CHOICES, &best, err))
        return -1;
    if (kind == SERVER_LLAMA_COMPLETION && n > 1)
        return base_fail(err, "'n' is not a field of /completion (use /v1/completions)");
    if (kind != SERVER_COMPLETIONS && field(b, "best_of"))
        return base_fail(err, "'best_of' is a field of /v1/completions only");
    if (best && best < n)
        return base_fail(err, "'best_of' (%lld) must be at least 'n' (%lld)", best, n);
    if (best > n && p->stream) return base_fail(err, "'best_of' cannot be used with 'stream'");
    p->n_choices = (int)n;
    p->best_of = best ? (int)best : (int)n;
    return 0;
}

static int parse_stop_ids(json_t *b, int vocab, server_params *p, base_err *err) {
    json_t *v = field(b, "stop_token_ids");
    if (!v) return 0;
    if (!json_is_array(v) || json_array_size(v) > SERVER_MAX_STOP_IDS)
        return base_fail(err, "'stop_token_ids' must be an array of at most %d token ids",
                         SERVER_MAX_STOP_IDS);
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) {
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) >= vocab)
            return base_fail(err, "'stop_token_ids[%zu]' must be a token id below %d", i, vocab);
        p->stop_ids[p->req.n_stop_ids++] = (int32_t)json_integer_value(e);
    }
    p->req.stop_ids = p->stop_ids;
    return 0;
}

/* echo (the prompt's text before each choice's) and llama-server's n_probs. */
static int parse_echo_probs(json_t *b, server_kind kind, server_params *p, base_err *err) {
    long long n_probs = 0;
    if (get_bool(b, "echo", &p->echo, err) ||
        get_int(b, "n_probs", 0, ENGINE_MAX_TOP_LOGPROBS, &n_probs, err))
        return -1;
    if (p->echo && kind != SERVER_COMPLETIONS)
        return base_fail(err, "'echo' is a field of /v1/completions only");
    /* OpenAI's echo with logprobs gives the prompt's tokens theirs, which are not computed */
    if (p->echo && p->req.logprobs)
        return base_fail(err, "'echo' with 'logprobs' (the prompt's log-probabilities) is not "
                              "supported");
    if (n_probs && kind != SERVER_LLAMA_COMPLETION)
        return base_fail(err, "'n_probs' is a field of /completion (use 'logprobs' here)");
    if (n_probs) {
        p->req.logprobs = true;
        p->req.top_logprobs = (int)n_probs;
    }
    p->n_probs = (int)n_probs;
    return 0;
}

static int parse_stream(json_t *b, server_params *p, base_err *err) {
    if (get_bool(b, "stream", &p->stream, err)) return -1;
    json_t *so = field(b, "stream_options");
    if (!so) return 0;
    if (!json_is_object(so)) return base_fail(err, "'stream_options' must be an object");
    return get_bool(so, "include_usage", &p->include_usage, err);
}

static server_prompt *add_prompt(server_params *p) {
    p->prompts = base_xrealloc(p->prompts, (size_t)(p->n_prompts + 1) * sizeof *p->prompts);
    server_prompt *e = &p->prompts[p->n_prompts++];
    memset(e, 0, sizeof *e);
    return e;
}

/* A prompt of token ids; what = its name in errors. */
static int id_prompt(json_t *v, const char *what, const engine_prompter *pr, int vocab,
                     server_params *p, base_err *err) {
    if (json_array_size(v) == 0) return base_fail(err, "'%s' is an empty array", what);
    server_prompt *e = add_prompt(p);
    e->n_ids = (int)json_array_size(v);
    e->ids = base_xmalloc((size_t)e->n_ids * sizeof *e->ids);
    for (int i = 0; i < e->n_ids; i++) {
        json_t *t = json_array_get(v, (size_t)i);
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= vocab)
            return base_fail(err, "'%s[%d]' must be a token id below %d", what, i, vocab);
        e->ids[i] = (int32_t)json_integer_value(t);
    }
    if (p->echo && tok_decode(pr->tok, e->ids, (size_t)e->n_ids, true, &e->echo, &e->echo_len, err))
        return base_fail_wrap(err, "'%s'", what);
    return 0;
}

static int text_prompt(json_t *v, const engine_prompter *pr, int ctx, server_params *p,
                       base_err *err) {
    server_prompt *e = add_prompt(p);
    if (p->echo) {
        e->echo_len = json_string_length(v);
        e->echo = base_xmalloc(e->echo_len + 1);
        memcpy(e->echo, json_string_value(v), e->echo_len + 1);
    }
    return engine_prompter_encode_text(pr, json_string_value(v), ctx, &e->ids, &e->n_ids, err);
}

/* The prompt of /v1/completions and /completion: a string, an array of token ids, or (on
 * /v1/completions) an array of several prompts, all strings or all token-id arrays. */
static int parse_text_prompt(json_t *b, server_kind kind, const engine_prompter *pr, int vocab,
                             int ctx, server_params *p, base_err *err) {
    static const char shapes[] = "a string, an array of token ids, an array of strings or an "
                                 "array of token-id arrays";
    json_t *v = field(b, "prompt");
    if (json_is_string(v)) return text_prompt(v, pr, ctx, p, err);
    if (!json_is_array(v) || json_array_size(v) == 0)
        return base_fail(err, "'prompt' must be %s (non-empty)", shapes);
    json_t *first = json_array_get(v, 0);
    if (json_is_integer(first)) return id_prompt(v, "prompt", pr, vocab, p, err);
    if (json_array_size(v) > 1 && kind == SERVER_LLAMA_COMPLETION)
        return base_fail(err, "'prompt' holds several prompts: /completion takes one here (use "
                              "/v1/completions)");
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) {
        char what[32];
        snprintf(what, sizeof what, "prompt[%zu]", i);
        if (json_is_string(first) && json_is_string(e)) {
            if (text_prompt(e, pr, ctx, p, err)) return -1;
        } else if (json_is_array(first) && json_is_array(e)) {
            if (id_prompt(e, what, pr, vocab, p, err)) return -1;
        } else {
            return base_fail(err, "'%s' does not match 'prompt[0]': 'prompt' must be %s, not a mix",
                             what, shapes);
        }
    }
    return 0;
}

/* How the conversation is rendered: add_generation_prompt and continue_final_message as vLLM
 * spells them, defaulting to continuing a final assistant message (a prefill), and
 * chat_template_kwargs as more template variables. */
int server_chat_options(json_t *b, const json_t *messages, engine_chat_options *o, base_err *err) {
    *o = engine_chat_defaults(messages);
    bool add_set = field(b, "add_generation_prompt") != NULL;
    bool cont_set = field(b, "continue_final_message") != NULL;
    if (get_bool(b, "add_generation_prompt", &o->add_generation_prompt, err) ||
        get_bool(b, "continue_final_message", &o->continue_final_message, err))
        return -1;
    /* naming one of the two decides the other, unless both are named */
    if (add_set && !cont_set) o->continue_final_message = false;
    if (cont_set && !add_set) o->add_generation_prompt = !o->continue_final_message;
    return 0;
}

/* `suffix`: the prompt becomes fill-in-the-middle (server_fim_prompt): [BOS] PRE prompt SUF
 * suffix MID, and the model writes what goes between. */
static int parse_suffix(json_t *b, const engine_prompter *pr, server_params *p, base_err *err) {
    json_t *suffix = field(b, "suffix"), *prompt = field(b, "prompt");
    server_fim f;
    if (!json_is_string(suffix)) return base_fail(err, "'suffix' must be a string");
    if (server_fim_tokens(pr->tok, &f, err)) return base_fail_wrap(err, "'suffix'");
    if (!json_is_string(prompt) || p->echo)
        return base_fail(err, "'suffix' takes one string 'prompt' and no 'echo'");
    server_fim_parts in = {.prefix = json_string_value(prompt),
                           .suffix = json_string_value(suffix),
                           .prefix_key = "prompt",
                           .suffix_key = "suffix"};
    server_prompt *e = add_prompt(p);
    return server_fim_prompt(pr, &f, &in, &e->ids, &e->n_ids, err);
}

static int parse_prompt(json_t *b, server_kind kind, const server_options *o,
                        const engine_prompter *pr, int vocab, int ctx, server_params *p,
                        base_err *err) {
    if (kind == SERVER_CHAT && field(b, "suffix"))
        return base_fail(err, "'suffix' is a field of the completions routes");
    if (kind == SERVER_CHAT) {
        server_prompt *e = add_prompt(p);
        return server_chat_prompt(b, o, pr, ctx, p, &e->ids, &e->n_ids, err);
    }
    static const char *const chat_only[] = {"tools", "tool_choice", "parallel_tool_calls",
                                            "reasoning_effort", "chat_template_kwargs"};
    for (size_t i = 0; i < sizeof chat_only / sizeof *chat_only; i++)
        if (field(b, chat_only[i]))
            return base_fail(err, "'%s' is for /v1/chat/completions, not this route", chat_only[i]);
    if (field(b, "suffix")) return parse_suffix(b, pr, p, err);
    return parse_text_prompt(b, kind, pr, vocab, ctx, p, err);
}

int server_params_parse(json_t *b, server_kind kind, const server_options *o,
                        const engine_prompter *pr, int vocab, int ctx, server_params *p,
                        base_err *err) {
    memset(p, 0, sizeof *p);
    p->kind = kind;
    p->req.sampling = o->defaults;
    /* a request without a seed gets the server's --seed, else a fresh one */
    if (!o->seed_fixed) {
        engine_sampling fresh;
        engine_sampling_defaults(&fresh);
        p->req.sampling.seed = fresh.seed ^ (uint64_t)(uintptr_t)p;
    }
    p->req.stop = p->stop;
    if (parse_sampling(b, &p->req.sampling, err) || parse_limits(b, o, p, err) ||
        parse_stream(b, p, err) || parse_choices(b, kind, p, err) || parse_stop(b, p, err) ||
        parse_stop_ids(b, vocab, p, err) || parse_logit_bias(b, vocab, p, err) ||
        parse_logprobs(b, kind, p, err) || parse_echo_probs(b, kind, p, err) ||
        parse_constraint(b, p, err) || get_bool(b, "ignore_eos", &p->req.ignore_eos, err) ||
        parse_prompt(b, kind, o, pr, vocab, ctx, p, err))
        return -1;
    if (p->n_prompts * p->best_of > SERVER_MAX_CHOICES)
        return base_fail(err, "%d prompts times %d sequences each is more than %d", p->n_prompts,
                         p->best_of, SERVER_MAX_CHOICES);
    p->req.n_stop = p->n_stop;
    return 0;
}

void server_params_free(server_params *p) {
    for (int i = 0; i < p->n_prompts; i++) {
        free(p->prompts[i].ids);
        free(p->prompts[i].echo);
    }
    free(p->prompts);
    free(p->bias);
    free(p->gbnf);
    json_decref(p->vars);
    json_decref(p->out.tool_defs);
    free(p->tool_gbnf);
    free(p->think_ids);
}

int server_body_props(json_t *b, engine_sampling *d, int *n_predict, bool *seed_fixed,
                      base_err *err) {
    static const char *const keys[] = {"temperature",
                                       "top_k",
                                       "top_p",
                                       "min_p",
                                       "seed",
                                       "repeat_penalty",
                                       "repeat_last_n",
                                       "n_predict",
                                       "presence_penalty",
                                       "frequency_penalty"};
    json_t *settings = json_object_get(b, "default_generation_settings");
    json_t *params = json_object_get(settings, "params");
    if (json_object_size(b) != 1 || !json_is_object(settings) || json_object_size(settings) != 1 ||
        !json_is_object(params))
        return base_fail(err, "only {\"default_generation_settings\": {\"params\": {...}}} can "
                              "be changed");
    if (known_keys(params, "default_generation_settings.params", keys, sizeof keys / sizeof *keys,
                   err))
        return -1;
    long long n = *n_predict;
    engine_sampling s = *d;
    if (parse_sampling(params, &s, err) || get_int(params, "n_predict", -1, INT32_MAX, &n, err))
        return -1;
    /* a seed given here fixes the unseeded requests' seed, as --seed does; -1 frees it */
    json_t *seed = field(params, "seed");
    if (seed) *seed_fixed = json_integer_value(seed) != -1;
    *d = s;
    *n_predict = (int)n;
    return 0;
}

int server_body_tokenize(const engine_prompter *pr, json_t *b, json_t **out, base_err *err) {
    json_t *content = json_object_get(b, "content");
    json_t *special = json_object_get(b, "add_special");
    if (!json_is_string(content)) return base_fail(err, "'content' must be a string");
    if (special && !json_is_boolean(special))
        return base_fail(err, "'add_special' must be true or false");
    int32_t *ids = NULL;
    size_t n = 0;
    if (tok_encode(pr->tok, json_string_value(content), json_string_length(content),
                   json_is_true(special), &ids, &n, err))
        return -1;
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(arr, json_integer(ids[i]));
    free(ids);
    *out = json_pack("{s:o}", "tokens", arr);
    return 0;
}

int server_body_detokenize(const engine_prompter *pr, json_t *b, json_t **out, base_err *err) {
    json_t *tokens = json_object_get(b, "tokens");
    if (!json_is_array(tokens)) return base_fail(err, "'tokens' must be an array of token ids");
    size_t n = json_array_size(tokens);
    int32_t *ids = base_xmalloc((n + 1) * sizeof *ids);
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(tokens, i);
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > INT32_MAX) {
            free(ids);
            return base_fail(err, "'tokens[%zu]' must be a token id", i);
        }
        ids[i] = (int32_t)json_integer_value(e);
    }
    char *text = NULL;
    size_t len = 0;
    int rc = tok_decode(pr->tok, ids, n, false, &text, &len, err);
    free(ids);
    if (rc) return -1;
    *out = json_pack("{s:s%}", "content", text, len);
    free(text);
    return 0;
}

int server_body_apply_template(const engine_prompter *pr, json_t *b, json_t **out, base_err *err) {
    json_t *m = json_object_get(b, "messages");
    if (!json_is_array(m)) return base_fail(err, "'messages' must be an array");
    engine_chat_options o;
    server_params p = {0};
    int rc = server_chat_options(b, m, &o, err) || server_chat_vars(b, &p, &o, err);
    char *prompt = NULL;
    rc = rc || engine_prompter_render(pr, m, &o, &prompt, err);
    server_params_free(&p);
    if (rc) return -1;
    *out = json_pack("{s:s}", "prompt", prompt);
    free(prompt);
    return 0;
}
