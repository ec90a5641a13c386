/* Tool calls in generated text: each family's wire format parsed into calls, and the grammar
 * that forces a call (tool_choice required or a named function).
 *
 * A scan parses from the first call marker on, call after call; a call is taken only once it
 * is whole, so streaming shows calls as they complete. Anything that does not parse stops the
 * scan: before the end it may be a call still arriving (held), at the end it is content, so
 * malformed output reaches the client as text instead of vanishing. */
#include "engine/engine.h"

#include <stdlib.h>
#include <string.h>

static const char *const g_names[] = {"hermes", "qwen3_coder", "llama3_json", "mistral", "harmony"};

#define HERMES_OPEN  "<tool_call>"
#define HERMES_CLOSE "</tool_call>"
#define PYTHON_TAG   "<|python_tag|>"
#define MISTRAL_TAG  "[TOOL_CALLS]"
#define MISTRAL_ARGS "[ARGS]"

int engine_tool_format_from_name(const char *name, engine_tool_format *out, base_err *err) {
    /* vLLM calls GPT-OSS's parser "openai": its launch lines work here unchanged */
    if (strcmp(name, "openai") == 0) name = "harmony";
    for (size_t i = 0; i < sizeof g_names / sizeof *g_names; i++)
        if (strcmp(name, g_names[i]) == 0) {
            *out = (engine_tool_format)i;
            return 0;
        }
    return base_fail(err,
                     "tool-call parser '%s' is not implemented (hermes, qwen3_coder, llama3_json, "
                     "mistral or harmony)",
                     name);
}

const char *engine_tool_format_name(engine_tool_format f) {
    return g_names[f];
}

engine_tool_format engine_tool_format_detect(const char *src) {
    if (!src) return ENGINE_TOOLS_HERMES;
    /* GPT-OSS's template opens every turn with <|start|>ROLE and heads messages with channels */
    if (strstr(src, "<|channel|>") && strstr(src, "<|start|>assistant"))
        return ENGINE_TOOLS_HARMONY;
    if (strstr(src, "<function=") && strstr(src, HERMES_OPEN)) return ENGINE_TOOLS_QWEN3_CODER;
    if (strstr(src, HERMES_OPEN)) return ENGINE_TOOLS_HERMES;
    if (strstr(src, MISTRAL_TAG)) return ENGINE_TOOLS_MISTRAL;
    if (strstr(src, PYTHON_TAG) || strstr(src, "ipython")) return ENGINE_TOOLS_LLAMA3_JSON;
    return ENGINE_TOOLS_HERMES;
}

bool engine_tool_format_special(engine_tool_format f) {
    return f == ENGINE_TOOLS_LLAMA3_JSON || f == ENGINE_TOOLS_MISTRAL || f == ENGINE_TOOLS_HARMONY;
}

/* ---- parsing ---- */

/* What a parse step found at the text it was given. */
enum { STEP_MORE = 0, STEP_CALLS = 1, STEP_BAD = -1 };

static bool starts(const char *s, size_t n, const char *lit) {
    size_t k = strlen(lit);
    return n >= k && memcmp(s, lit, k) == 0;
}

/* Whether s (n bytes) is a proper prefix of lit: more text may complete it. */
static bool prefix_of(const char *s, size_t n, const char *lit) {
    return n < strlen(lit) && memcmp(s, lit, n) == 0;
}

static size_t skip_ws(const char *s, size_t n, size_t i) {
    while (i < n && strchr(" \t\r\n", s[i])) i++;
    return i;
}

static const char *find(const char *s, size_t n, const char *lit) {
    return memmem(s, n, lit, strlen(lit));
}

void engine_tool_calls_add(engine_tool_call **calls, int *n_calls, const char *name,
                           size_t name_len, const json_t *args) {
    *calls = base_xrealloc(*calls, (size_t)(*n_calls + 1) * sizeof **calls);
    engine_tool_call *c = &(*calls)[(*n_calls)++];
    c->name = base_xmalloc(name_len + 1);
    memcpy(c->name, name, name_len);
    c->name[name_len] = 0;
    c->arguments = json_dumps(args, JSON_COMPACT);
}

void engine_tool_calls_free(engine_tool_call *calls, int n_calls) {
    for (int i = 0; i < n_calls; i++) {
        free(calls[i].name);
        free(calls[i].arguments);
    }
    free(calls);
}

static void add_call(engine_tool_scan *out, const char *name, size_t name_len, const json_t *args) {
    engine_tool_calls_add(&out->calls, &out->n_calls, name, name_len, args);
}

/* One JSON value at s: STEP_CALLS with *v and *used, STEP_MORE when the text ends inside it,
 * STEP_BAD when it cannot be JSON. */
static int json_at(const char *s, size_t n, json_t **v, size_t *used) {
    json_error_t e;
    *v = json_loadb(s, n, JSON_DISABLE_EOF_CHECK | JSON_DECODE_ANY, &e);
    if (*v) {
        *used = (size_t)e.position;
        return STEP_CALLS;
    }
    return e.position >= (int)n || json_error_code(&e) == json_error_premature_end_of_input
               ? STEP_MORE
               : STEP_BAD;
}

/* {"name": string, <args_key>: object or a JSON string of one} as a call. */
static int object_call(const json_t *o, const char *args_key, engine_tool_scan *out) {
    const json_t *name = json_object_get(o, "name"), *args = json_object_get(o, args_key);
    if (!args && strcmp(args_key, "arguments") != 0) args = json_object_get(o, "arguments");
    if (!json_is_object(o) || !json_is_string(name) || !json_string_length(name)) return STEP_BAD;
    json_t *parsed = NULL;
    if (json_is_string(args) && !(args = parsed = json_loads(json_string_value(args), 0, NULL)))
        return STEP_BAD;
    json_t *empty = args ? NULL : json_object();
    int rc = STEP_BAD;
    if (!args || json_is_object(args)) {
        add_call(out, json_string_value(name), json_string_length(name), args ? args : empty);
        rc = STEP_CALLS;
    }
    json_decref(parsed);
    json_decref(empty);
    return rc;
}

/* <tool_call>{json}</tool_call> at s. */
static int hermes_step(const char *s, size_t n, engine_tool_scan *out, size_t *used) {
    if (!starts(s, n, HERMES_OPEN)) return prefix_of(s, n, HERMES_OPEN) ? STEP_MORE : STEP_BAD;
    size_t i = strlen(HERMES_OPEN);
    const char *end = find(s + i, n - i, HERMES_CLOSE);
    if (!end) return STEP_MORE;
    json_error_t e;
    json_t *o = json_loadb(s + i, (size_t)(end - s) - i, 0, &e);
    int rc = o ? object_call(o, "arguments", out) : STEP_BAD;
    json_decref(o);
    *used = (size_t)(end - s) + strlen(HERMES_CLOSE);
    return rc;
}

/* The declared JSON type of parameter `param` of tool `name`, or NULL. */
static const char *param_type(const json_t *tools, const char *name, const char *param) {
    size_t i;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        const json_t *fn = json_object_get(t, "function");
        if (!json_is_string(json_object_get(fn, "name")) ||
            strcmp(json_string_value(json_object_get(fn, "name")), name) != 0)
            continue;
        const json_t *props = json_object_get(json_object_get(fn, "parameters"), "properties");
        return json_string_value(json_object_get(json_object_get(props, param), "type"));
    }
    return NULL;
}

/* A qwen3_coder parameter's text as a value: strings as written (one newline on each side
 * trimmed, as the template writes them), other declared types as JSON when they parse. */
static json_t *coder_value(const char *v, size_t n, const char *type) {
    if (n && v[0] == '\n') v++, n--;
    if (n && v[n - 1] == '\n') n--;
    if (type && strcmp(type, "string") != 0) {
        json_t *j = json_loadb(v, n, JSON_DECODE_ANY, NULL);
        if (j) return j;
    }
    return json_stringn(v, n);
}

/* <function=NAME> (<parameter=P>V</parameter>)* </function>, between s and end. */
static int coder_function(const char *s, const char *end, const json_t *tools,
                          engine_tool_scan *out) {
    size_t n = (size_t)(end - s), i = skip_ws(s, n, 0);
    if (!starts(s + i, n - i, "<function=")) return STEP_BAD;
    i += strlen("<function=");
    const char *gt = memchr(s + i, '>', n - i);
    if (!gt || gt == s + i) return STEP_BAD;
    char *name = base_xmalloc((size_t)(gt - s) - i + 1);
    memcpy(name, s + i, (size_t)(gt - s) - i);
    name[(size_t)(gt - s) - i] = 0;
    json_t *args = json_object();
    int rc = STEP_BAD;
    for (i = (size_t)(gt - s) + 1;;) {
        i = skip_ws(s, n, i);
        if (starts(s + i, n - i, "</function>")) {
            rc = skip_ws(s, n, i + strlen("</function>")) == n ? STEP_CALLS : STEP_BAD;
            break;
        }
        if (!starts(s + i, n - i, "<parameter=")) break;
        i += strlen("<parameter=");
        const char *pgt = memchr(s + i, '>', n - i);
        const char *close = pgt ? find(pgt, (size_t)(end - pgt), "</parameter>") : NULL;
        if (!close || pgt == s + i) break;
        char *param = base_xmalloc((size_t)(pgt - s) - i + 1);
        memcpy(param, s + i, (size_t)(pgt - s) - i);
        param[(size_t)(pgt - s) - i] = 0;
        json_object_set_new(args, param,
                            coder_value(pgt + 1, (size_t)(close - pgt) - 1,
                                        tools ? param_type(tools, name, param) : NULL));
        free(param);
        i = (size_t)(close - s) + strlen("</parameter>");
    }
    if (rc == STEP_CALLS) add_call(out, name, strlen(name), args);
    free(name);
    json_decref(args);
    return rc;
}

static int coder_step(const char *s, size_t n, const json_t *tools, engine_tool_scan *out,
                      size_t *used) {
    if (!starts(s, n, HERMES_OPEN)) return prefix_of(s, n, HERMES_OPEN) ? STEP_MORE : STEP_BAD;
    size_t i = strlen(HERMES_OPEN);
    const char *end = find(s + i, n - i, HERMES_CLOSE);
    if (!end) return STEP_MORE;
    *used = (size_t)(end - s) + strlen(HERMES_CLOSE);
    return coder_function(s + i, end, tools, out);
}

/* A JSON object {"name", "parameters"} at s, after <|python_tag|> or not; several are joined
 * by ';'. */
static int llama_step(const char *s, size_t n, engine_tool_scan *out, size_t *used) {
    size_t i = 0;
    if (starts(s, n, PYTHON_TAG))
        i = skip_ws(s, n, strlen(PYTHON_TAG));
    else if (prefix_of(s, n, PYTHON_TAG))
        return STEP_MORE;
    if (out->n_calls && i == 0 && n && s[0] == ';') i = skip_ws(s, n, 1);
    if (i == n) return STEP_MORE;
    if (s[i] != '{') return STEP_BAD;
    json_t *o;
    size_t k;
    int rc = json_at(s + i, n - i, &o, &k);
    if (rc != STEP_CALLS) return rc;
    rc = object_call(o, "parameters", out);
    json_decref(o);
    *used = i + k;
    return rc;
}

/* NAME[ARGS]{json} (Mistral's tokenizers v11 and later) at s. */
static int mistral_named(const char *s, size_t n, engine_tool_scan *out, size_t *used) {
    const char *args = find(s, n, MISTRAL_ARGS);
    if (!args) return memchr(s, '{', n) ? STEP_BAD : STEP_MORE;
    size_t name_len = (size_t)(args - s), i = name_len + strlen(MISTRAL_ARGS);
    for (size_t k = 0; k < name_len; k++)
        if (strchr(" \t\r\n{}[]\"", s[k])) return STEP_BAD;
    json_t *o;
    size_t k;
    int rc = name_len ? json_at(s + i, n - i, &o, &k) : STEP_BAD;
    if (rc != STEP_CALLS) return rc;
    rc = json_is_object(o) ? STEP_CALLS : STEP_BAD;
    if (rc == STEP_CALLS) add_call(out, s, name_len, o);
    json_decref(o);
    *used = i + k;
    return rc;
}

/* [TOOL_CALLS] then a JSON array of calls, or NAME[ARGS]{..}; forced output has no marker. */
static int mistral_step(const char *s, size_t n, bool forced, engine_tool_scan *out, size_t *used) {
    size_t i = 0;
    if (starts(s, n, MISTRAL_TAG))
        i = skip_ws(s, n, strlen(MISTRAL_TAG));
    else if (prefix_of(s, n, MISTRAL_TAG))
        return STEP_MORE;
    else if (!forced || out->n_calls)
        return STEP_BAD;
    if (i == n) return STEP_MORE;
    size_t k;
    if (s[i] != '[') {
        int rc = mistral_named(s + i, n - i, out, &k);
        *used = i + k;
        return rc;
    }
    json_t *arr;
    int rc = json_at(s + i, n - i, &arr, &k);
    if (rc != STEP_CALLS) return rc;
    size_t j;
    json_t *o;
    rc = json_is_array(arr) && json_array_size(arr) ? STEP_CALLS : STEP_BAD;
    int before = out->n_calls;
    json_array_foreach(arr, j, o) if (rc == STEP_CALLS) rc = object_call(o, "arguments", out);
    if (rc != STEP_CALLS)
        while (out->n_calls > before) {
            out->n_calls--;
            free(out->calls[out->n_calls].name);
            free(out->calls[out->n_calls].arguments);
        }
    json_decref(arr);
    *used = i + k;
    return rc;
}

static int step_at(engine_tool_format f, const char *s, size_t n, bool forced, const json_t *tools,
                   engine_tool_scan *out, size_t *used) {
    switch (f) {
    case ENGINE_TOOLS_HERMES:
        return hermes_step(s, n, out, used);
    case ENGINE_TOOLS_QWEN3_CODER:
        return coder_step(s, n, tools, out, used);
    case ENGINE_TOOLS_LLAMA3_JSON:
        return llama_step(s, n, out, used);
    case ENGINE_TOOLS_MISTRAL:
        return mistral_step(s, n, forced, out, used);
    case ENGINE_TOOLS_HARMONY: /* its calls are messages, split by engine_harmony_split_text */
        break;
    }
    return STEP_BAD;
}

/* Where the first call may begin: a marker; in forced output and llama3_json replies the
 * first non-blank (llama3_json's calls are the whole reply: '{' or <|python_tag|> first). len
 * when there is none, with *partial set when the text ends with what may still become one. */
static size_t first_marker(engine_tool_format f, const char *s, size_t n, bool forced,
                           bool *partial) {
    size_t i = skip_ws(s, n, 0);
    *partial = i == n;
    if (forced) return i;
    if (f == ENGINE_TOOLS_LLAMA3_JSON) {
        bool call = i < n && (s[i] == '{' || starts(s + i, n - i, PYTHON_TAG) ||
                              prefix_of(s + i, n - i, PYTHON_TAG));
        return call || *partial ? i : n;
    }
    *partial = false;
    const char *lit = f == ENGINE_TOOLS_MISTRAL ? MISTRAL_TAG : HERMES_OPEN;
    const char *at = find(s, n, lit);
    if (at) return (size_t)(at - s);
    size_t k = strlen(lit);
    for (i = n > k ? n - k : 0; i < n; i++)
        if (prefix_of(s + i, n - i, lit)) {
            *partial = true;
            return i;
        }
    return n;
}

void engine_tools_scan(engine_tool_format f, const char *text, size_t len, bool final, bool forced,
                       const json_t *tools, engine_tool_scan *out) {
    memset(out, 0, sizeof *out);
    bool partial;
    size_t at = first_marker(f, text, len, forced, &partial);
    out->content_len = out->rest_start = len;
    if ((at == len && !partial) || (partial && final)) return;
    out->content_len = at;
    if (partial) return;
    out->in_call = true;
    size_t i = at;
    int rc = STEP_CALLS;
    while (rc == STEP_CALLS) {
        i = skip_ws(text, len, i);
        if (i == len) break;
        size_t used = 0;
        rc = step_at(f, text + i, len - i, forced, tools, out, &used);
        if (rc == STEP_CALLS) i += used;
    }
    if (!final) return;
    if (out->n_calls == 0) {
        out->content_len = len;
        out->in_call = false;
        return;
    }
    out->rest_start = skip_ws(text, len, i) == len ? len : i;
}

void engine_tool_scan_free(engine_tool_scan *s) {
    engine_tool_calls_free(s->calls, s->n_calls);
    memset(s, 0, sizeof *s);
}
