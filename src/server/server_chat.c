/* A chat request's tools and reasoning: the fields OpenAI's API and vLLM define for them
 * (tools, tool_choice, parallel_tool_calls, reasoning_effort, chat_template_kwargs) checked and
 * turned into template variables, a grammar for a forced call, the engine's thinking budget,
 * and how the answer is to be split. */
#include "server/server_params.h"

#include <string.h>

static json_t *field(json_t *b, const char *key) {
    json_t *v = json_object_get(b, key);
    return json_is_null(v) ? NULL : v;
}

/* OpenAI's rule for function names: 1 to 64 of [a-zA-Z0-9_-]. It also keeps names out of
 * the quoting of the wire formats and grammars. */
static bool valid_name(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 64) return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '_' || *s == '-'))
            return false;
    return true;
}

/* Every key of o is one of keys (NULL-ended); `what` and i name o in the error. */
static int known_keys(json_t *o, const char *what, size_t i, const char *const *keys,
                      base_err *err) {
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) {
        size_t k = 0;
        while (keys[k] && strcmp(key, keys[k]) != 0) k++;
        if (!keys[k]) return base_fail(err, "'tools[%zu]%s.%s' is not supported", i, what, key);
    }
    return 0;
}

static int check_tool(json_t *t, size_t i, base_err *err) {
    static const char *const tool_keys[] = {"type", "function", NULL};
    static const char *const fn_keys[] = {"name", "description", "parameters", "strict", NULL};
    json_t *fn = json_object_get(t, "function");
    const char *type = json_string_value(json_object_get(t, "type"));
    if (!json_is_object(t) || !type || strcmp(type, "function") != 0 || !json_is_object(fn))
        return base_fail(err, "'tools[%zu]' must be {\"type\": \"function\", \"function\": {...}}",
                         i);
    if (known_keys(t, "", i, tool_keys, err) || known_keys(fn, ".function", i, fn_keys, err))
        return -1;
    json_t *strict = field(fn, "strict");
    if (strict && !json_is_boolean(strict))
        return base_fail(err, "'tools[%zu].function.strict' must be true or false", i);
    const char *name = json_string_value(json_object_get(fn, "name"));
    if (!name || !valid_name(name))
        return base_fail(err,
                         "'tools[%zu].function.name' must be 1 to 64 of a-z, A-Z, 0-9, _ and -", i);
    json_t *params = field(fn, "parameters"), *desc = field(fn, "description");
    if (params && !json_is_object(params))
        return base_fail(err, "'tools[%zu].function.parameters' must be a JSON Schema object", i);
    if (desc && !json_is_string(desc))
        return base_fail(err, "'tools[%zu].function.description' must be a string", i);
    return 0;
}

/* tools: checked, names unique. */
static int check_tools(json_t *tools, base_err *err) {
    if (!json_is_array(tools)) return base_fail(err, "'tools' must be an array");
    size_t i, j;
    json_t *t;
    json_array_foreach(tools, i, t) {
        if (check_tool(t, i, err)) return -1;
        const char *name =
            json_string_value(json_object_get(json_object_get(t, "function"), "name"));
        for (j = 0; j < i; j++)
            if (strcmp(name, json_string_value(json_object_get(
                                 json_object_get(json_array_get(tools, j), "function"), "name"))) ==
                0)
                return base_fail(err, "'tools[%zu].function.name' '%s' is also tools[%zu]'s", i,
                                 name, j);
    }
    return 0;
}

typedef struct tool_choice {
    bool none, required;
    const char *only; /* a named function */
} tool_choice;

static int parse_choice(json_t *b, json_t *tools, tool_choice *c, base_err *err) {
    json_t *v = field(b, "tool_choice");
    memset(c, 0, sizeof *c);
    if (!v) return 0;
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        c->none = strcmp(s, "none") == 0;
        c->required = strcmp(s, "required") == 0;
        if (!c->none && !c->required && strcmp(s, "auto") != 0)
            return base_fail(err, "'tool_choice' must be none, auto, required or {\"type\": "
                                  "\"function\", \"function\": {\"name\": ...}}");
    } else {
        const char *type = json_string_value(json_object_get(v, "type"));
        c->only = json_string_value(json_object_get(json_object_get(v, "function"), "name"));
        if (!type || strcmp(type, "function") != 0 || !c->only)
            return base_fail(err, "'tool_choice' must be none, auto, required or {\"type\": "
                                  "\"function\", \"function\": {\"name\": ...}}");
    }
    if (!json_array_size(tools) && !c->none) return base_fail(err, "'tool_choice' needs 'tools'");
    size_t i;
    json_t *t;
    bool found = !c->only;
    json_array_foreach(tools, i, t) found =
        found || strcmp(json_string_value(json_object_get(json_object_get(t, "function"), "name")),
                        c->only) == 0;
    if (!found) return base_fail(err, "'tool_choice' names '%s', which is not in 'tools'", c->only);
    return 0;
}

int server_chat_vars(json_t *b, server_params *p, engine_chat_options *o, base_err *err) {
    json_t *kw = field(b, "chat_template_kwargs"), *tools = field(b, "tools");
    json_t *effort = field(b, "reasoning_effort");
    static const char *const efforts[] = {"minimal", "low", "medium", "high"};
    if (kw && !json_is_object(kw))
        return base_fail(err, "'chat_template_kwargs' must be an object");
    json_t *par = field(b, "parallel_tool_calls");
    if (tools && check_tools(tools, err)) return -1;
    if (par && !json_is_boolean(par))
        return base_fail(err, "'parallel_tool_calls' must be true or false");
    tool_choice c;
    if (parse_choice(b, tools, &c, err)) return -1;
    bool known = !effort;
    for (size_t i = 0; effort && i < sizeof efforts / sizeof *efforts; i++)
        known =
            known || (json_is_string(effort) && strcmp(json_string_value(effort), efforts[i]) == 0);
    if (!known) return base_fail(err, "'reasoning_effort' must be minimal, low, medium or high");
    p->vars = kw ? json_deep_copy(kw) : json_object();
    /* as transformers' apply_chat_template(tools=...): an empty list is no tools */
    if (tools && json_array_size(tools) && !c.none) json_object_set(p->vars, "tools", tools);
    if (effort) json_object_set(p->vars, "reasoning_effort", effort);
    o->extra = p->vars;
    return 0;
}

/* The first tool that asks for strict arguments, or -1. */
static long strict_tool(const json_t *tools) {
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        if (json_is_true(json_object_get(json_object_get(t, "function"), "strict"))) return (long)i;
    }
    return -1;
}

/* The answer's tool calls: the format to parse, and a grammar when a call is forced. */
static int setup_tools(json_t *b, const server_options *o, const engine_prompter *pr,
                       server_params *p, base_err *err) {
    json_t *tools = json_object_get(p->vars, "tools");
    if (!tools) return 0;
    tool_choice c;
    bool parallel = true;
    if (parse_choice(b, tools, &c, err)) return -1;
    json_t *par = field(b, "parallel_tool_calls");
    if (par) parallel = json_is_true(par);
    p->out.tools = true;
    p->out.format = o->has_tool_parser ? o->tool_parser : pr->tool_format;
    p->out.tool_defs = json_incref(tools);
    p->req.keep_special = engine_tool_format_special(p->out.format);
    /* strict arguments are what the grammar of a forced call gives; a free answer has none */
    long strict = strict_tool(tools);
    if (!c.required && !c.only && strict >= 0)
        return base_fail(err,
                         "'tools[%ld].function.strict': strict arguments are enforced only with "
                         "'tool_choice' required or a named function",
                         strict);
    if (!c.required && !c.only) {
        /* one call at most: the scan stops after the first (server_gen reads calls_max) */
        p->out.calls_max = parallel ? 0 : 1;
        return 0;
    }
    if (p->req.grammar)
        return base_fail(err,
                         "'tool_choice' %s and 'response_format' or 'grammar' exclude one "
                         "another",
                         c.only ? "naming a function" : "required");
    /* a named function is called once, as OpenAI's API does */
    if (engine_tools_grammar(p->out.format, tools, c.only, parallel && !c.only, &p->tool_gbnf, err))
        return -1;
    p->out.forced = true;
    p->req.grammar = p->tool_gbnf;
    return 0;
}

/* Token ids of a tag, as the model would write it after other text. */
static int tag_ids(const engine_prompter *pr, const char *tag, int32_t **ids, int *n,
                   base_err *err) {
    size_t count;
    if (tok_encode(pr->tok, tag, strlen(tag), false, ids, &count, err)) return -1;
    *n = (int)count;
    return 0;
}

/* Harmony's analysis message as the model opens it after the prompt's <|start|>assistant, and
 * what the budget writes to end it: the message closed, the final one opened (OpenAI's
 * harmony format guide), or, where a call is forced, only the next message's role, the
 * call's grammar writing the rest. The model's own <|end|> ends the analysis too. */
#define HARMONY_ANALYSIS     "<|channel|>analysis<|message|>"
#define HARMONY_NEXT         "<|end|><|start|>assistant"
#define HARMONY_TO_FINAL     HARMONY_NEXT "<|channel|>final<|message|>"
#define HARMONY_ANALYSIS_END "<|end|>"

/* The thinking budget: the thinking's close forced after --reasoning-budget tokens of it. A
 * grammar's output is what the grammar says, so the forced close must be what it allows there
 * (the engine ends the request with an error where it is not). */
static int setup_budget(const server_options *o, const engine_prompter *pr, server_params *p,
                        base_err *err) {
    if (!o->has_reasoning_budget) return 0;
    bool harmony = p->out.harmony;
    const char *open_tag = harmony ? HARMONY_ANALYSIS : ENGINE_THINK_OPEN;
    const char *close_tag = !harmony        ? ENGINE_THINK_CLOSE
                            : p->out.forced ? HARMONY_NEXT
                                            : HARMONY_TO_FINAL;
    int32_t *open = NULL, *close = NULL, *end = NULL;
    int n_open, n_close, n_end = 0;
    if (harmony && tag_ids(pr, HARMONY_ANALYSIS_END, &end, &n_end, err)) return -1;
    free(end);
    if (tag_ids(pr, open_tag, &open, &n_open, err) ||
        tag_ids(pr, close_tag, &close, &n_close, err)) {
        free(open);
        free(close);
        return -1;
    }
    p->think_ids = base_xmalloc((size_t)(n_open + n_close + 1) * sizeof *p->think_ids);
    memcpy(p->think_ids, open, (size_t)n_open * sizeof *open);
    memcpy(p->think_ids + n_open, close, (size_t)n_close * sizeof *close);
    free(open);
    free(close);
    p->req.reasoning_budget = o->reasoning_budget;
    p->req.thinking = p->out.inside;
    p->req.think_open = p->think_ids;
    p->req.n_think_open = n_open;
    p->req.think_close = p->think_ids + n_open;
    p->req.n_think_close = n_close;
    p->req.n_think_end = n_end;
    return 0;
}

int server_chat_prompt(json_t *b, const server_options *o, const engine_prompter *pr, int ctx,
                       server_params *p, int32_t **ids, int *n, base_err *err) {
    json_t *m = field(b, "messages");
    if (!json_is_array(m) || json_array_size(m) == 0)
        return base_fail(err, "'messages' must be a non-empty array");
    engine_chat_options co;
    char *prompt = NULL;
    if (server_chat_options(b, m, &co, err) || server_chat_vars(b, p, &co, err) ||
        engine_prompter_render(pr, m, &co, &prompt, err))
        return -1;
    /* Harmony's channels are special tokens, with tools or without */
    p->out.harmony =
        (o->has_tool_parser ? o->tool_parser : pr->tool_format) == ENGINE_TOOLS_HARMONY;
    int rc = engine_prompter_encode_rendered(pr, prompt, ctx, ids, n, err) ||
             setup_tools(b, o, pr, p, err);
    /* constrained output is what its grammar says: thinking only where it writes <think> */
    p->out.reasoning = o->reasoning_format != ENGINE_REASONING_NONE;
    p->out.inside = !p->req.grammar && engine_prompt_opens_think(prompt);
    p->req.keep_special = p->req.keep_special || p->out.harmony;
    free(prompt);
    return rc || setup_budget(o, pr, p, err) ? -1 : 0;
}
