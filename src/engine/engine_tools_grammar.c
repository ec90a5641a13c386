/* The grammar of a forced tool call (tool_choice required, or a named function): the model's
 * own wire format around arguments that follow each tool's parameters schema, so that the
 * call parses (engine_tools_scan) and validates. The schemas compile with the structured-output
 * compiler (gram_schemas_to_gbnf); what it cannot enforce is refused, never loosened.
 *
 * Markers that are special tokens (Mistral's [TOOL_CALLS], Llama's <|python_tag|>) are never in
 * a grammar's masks, so those formats are forced without them; the scan of forced output
 * expects that. Harmony's call is nothing but special tokens around its header words, so it
 * is written with token terminals (`<|channel|>`), which match those tokens alone. */
#include "engine/engine.h"

#include <stdlib.h>
#include <string.h>

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static void put(sbuf *b, const char *s) {
    size_t k = strlen(s);
    if (b->n + k + 1 > b->cap) {
        b->cap = (b->n + k + 1) * 2;
        b->p = base_xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, k + 1);
    b->n += k;
}

/* A GBNF literal of s. */
static void put_lit(sbuf *b, const char *s) {
    put(b, "\"");
    for (; *s; s++) {
        char esc[8] = {*s, 0};
        if (*s == '"' || *s == '\\')
            snprintf(esc, sizeof esc, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            snprintf(esc, sizeof esc, "\\x%02X", (unsigned char)*s);
        put(b, esc);
    }
    put(b, "\"");
}

/* Rule names carry indexes as letters: the schema compiler's own names end in digits. */
static void put_name(sbuf *b, const char *stem, size_t i) {
    char buf[32];
    size_t k = 0;
    do buf[k++] = (char)('a' + i % 26);
    while ((i /= 26) && k < sizeof buf - 1);
    buf[k] = 0;
    put(b, stem);
    put(b, buf);
}

static char *name_of(const char *stem, size_t i) {
    sbuf b = {0};
    put_name(&b, stem, i);
    return b.p;
}

typedef struct schemas {
    char **text, **names;
    size_t *lens;
    int n;
} schemas;

/* Queues a schema for compilation under rule `name` (taken). */
static void add_schema(schemas *s, const json_t *schema, char *name) {
    s->text = base_xrealloc(s->text, (size_t)(s->n + 1) * sizeof *s->text);
    s->names = base_xrealloc(s->names, (size_t)(s->n + 1) * sizeof *s->names);
    s->lens = base_xrealloc(s->lens, (size_t)(s->n + 1) * sizeof *s->lens);
    s->text[s->n] = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY);
    s->lens[s->n] = strlen(s->text[s->n]);
    s->names[s->n++] = name;
}

static void schemas_free(schemas *s) {
    for (int i = 0; i < s->n; i++) free(s->text[i]), free(s->names[i]);
    free(s->text);
    free(s->names);
    free(s->lens);
}

static bool only_keys(const json_t *o, const char *const *keys) {
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)o, k, v) {
        size_t i = 0;
        while (keys[i] && strcmp(keys[i], k) != 0) i++;
        if (!keys[i]) return false;
    }
    return true;
}

/* A qwen3_coder parameter's value: written as plain text when the schema is a string (any, or
 * one of an enum), as JSON otherwise. */
static int coder_value(sbuf *g, schemas *s, const char *tool, const char *param,
                       const json_t *schema, size_t ti, size_t pi, base_err *err) {
    static const char *const plain[] = {"type",    "description", "title",
                                        "default", "examples",    NULL};
    static const char *const with_enum[] = {"type",     "description", "title", "default",
                                            "examples", "enum",        NULL};
    const char *type = json_string_value(json_object_get(schema, "type"));
    const json_t *en = json_object_get(schema, "enum");
    if (type && strcmp(type, "string") == 0 && only_keys(schema, plain)) {
        put(g, "coder-text");
        return 0;
    }
    if (json_is_array(en) && json_array_size(en) && only_keys(schema, with_enum)) {
        size_t i;
        const json_t *v;
        json_array_foreach(en, i, v) if (!json_is_string(v)) goto as_json;
        put(g, "(");
        json_array_foreach(en, i, v) {
            if (i) put(g, " | ");
            put_lit(g, json_string_value(v));
        }
        put(g, ")");
        return 0;
    }
as_json:
    if (type && strcmp(type, "string") == 0)
        return base_fail(err,
                         "tool '%s' parameter '%s': a constrained string cannot be enforced in "
                         "the qwen3_coder format, which writes strings unquoted",
                         tool, param);
    sbuf name = {0};
    put_name(&name, "param-", ti);
    put_name(&name, "-", pi);
    put(g, name.p);
    add_schema(s, schema, name.p);
    return 0;
}

/* <function=NAME> then each property in order (required ones always) </function>. */
static int coder_tool(sbuf *g, schemas *s, const char *tool, const json_t *params, size_t ti,
                      base_err *err) {
    put(g, "\"<function=\" ");
    put_lit(g, tool);
    put(g, " \">\\n\"");
    const json_t *props = json_object_get(params, "properties"),
                 *req = json_object_get(params, "required");
    const char *key;
    const json_t *v;
    size_t pi = 0;
    json_object_foreach((json_t *)props, key, v) {
        bool required = false;
        size_t i;
        const json_t *r;
        json_array_foreach(req, i, r) required =
            required || (json_is_string(r) && strcmp(json_string_value(r), key) == 0);
        put(g, " (\"<parameter=\" ");
        put_lit(g, key);
        put(g, " \">\\n\" ");
        if (coder_value(g, s, tool, key, v, ti, pi++, err)) return -1;
        put(g, " \"\\n</parameter>\\n\")");
        if (!required) put(g, "?");
    }
    put(g, " \"</function>\"");
    return 0;
}

/* {"name": "NAME", "<key>": ARGS}, ARGS by the parameters schema. */
static void json_tool(sbuf *g, schemas *s, const char *tool, const char *key, const json_t *params,
                      size_t ti) {
    sbuf head = {0};
    put(&head, "{\"name\": \"");
    put(&head, tool);
    put(&head, "\", \"");
    put(&head, key);
    put(&head, "\": ");
    put_lit(g, head.p);
    free(head.p);
    char *args = name_of("args-", ti);
    put(g, " ");
    put(g, args);
    put(g, " \"}\"");
    json_t *any = params ? NULL
                         : json_pack("{s:s,s:{},s:b}", "type", "object", "properties",
                                     "additionalProperties", 0);
    add_schema(s, params ? params : any, args);
    json_decref(any);
}

/* NAME <|constrain|>json<|message|>ARGS: a Harmony call after its `to=functions.`, spelled as
 * OpenAI's harmony format guide shows the model writing it. */
static void harmony_tool(sbuf *g, schemas *s, const char *tool, const json_t *params, size_t ti) {
    put_lit(g, tool);
    put(g, " \" \" <|constrain|> \"json\" <|message|> ");
    char *args = name_of("args-", ti);
    put(g, args);
    json_t *any = params ? NULL
                         : json_pack("{s:s,s:{},s:b}", "type", "object", "properties",
                                     "additionalProperties", 0);
    add_schema(s, params ? params : any, args);
    json_decref(any);
}

/* The call rule: one alternative per tool that may be called. */
static int call_rule(engine_tool_format f, const json_t *tools, const char *only, sbuf *g,
                     schemas *s, base_err *err) {
    put(g, "tool-call ::=");
    size_t i, n = 0;
    const json_t *t;
    json_array_foreach(tools, i, t) {
        const json_t *fn = json_object_get(t, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        const json_t *params = json_object_get(fn, "parameters");
        if (!name || (only && strcmp(name, only) != 0)) continue;
        put(g, n++ ? " | " : " ");
        if (f == ENGINE_TOOLS_QWEN3_CODER) {
            if (coder_tool(g, s, name, params, i, err)) return -1;
        } else if (f == ENGINE_TOOLS_HARMONY) {
            harmony_tool(g, s, name, params, i);
        } else {
            json_tool(g, s, name, f == ENGINE_TOOLS_LLAMA3_JSON ? "parameters" : "arguments",
                      params, i);
        }
    }
    if (!n) return base_fail(err, "no tool named '%s' to call", only ? only : "");
    put(g, "\n");
    return 0;
}

/* Harmony: the prompt ends with <|start|>assistant; the model may think first (one analysis
 * message, as GPT-OSS does before a call), then writes the call on the commentary channel.
 * <|call|> ends the turn (it is a stop token), so a turn holds one call, parallel or not: the
 * client sends its result and the next turn may call again. */
static const char *const harmony_root =
    "root ::= harmony-analysis? <|channel|> \"commentary to=functions.\" tool-call <|call|>\n"
    "harmony-analysis ::= <|channel|> \"analysis\" <|message|> .* <|end|> <|start|> "
    "\"assistant\"\n";

int engine_tools_grammar(engine_tool_format f, const json_t *tools, const char *only, bool parallel,
                         char **gbnf, base_err *err) {
    sbuf g = {0};
    schemas s = {0};
    bool tagged = f == ENGINE_TOOLS_HERMES || f == ENGINE_TOOLS_QWEN3_CODER;
    const char *one = tagged ? "\"<tool_call>\\n\" tool-call \"\\n</tool_call>\"" : "tool-call";
    const char *sep = tagged ? "\"\\n\"" : f == ENGINE_TOOLS_MISTRAL ? "\", \"" : "\"; \"";
    if (f == ENGINE_TOOLS_HARMONY) {
        put(&g, harmony_root);
    } else {
        put(&g, "root ::= ");
        if (f == ENGINE_TOOLS_MISTRAL) put(&g, "\"[\" ");
        put(&g, one);
        if (parallel) {
            put(&g, " (");
            put(&g, sep);
            put(&g, " ");
            put(&g, one);
            put(&g, ")*");
        }
        if (f == ENGINE_TOOLS_MISTRAL) put(&g, " \"]\"");
        put(&g, "\n");
    }
    put(&g, "coder-text ::= [^<]*\n");
    char *rules = NULL;
    int rc = call_rule(f, tools, only, &g, &s, err);
    if (!rc && s.n)
        rc = gram_schemas_to_gbnf((const char *const *)s.text, s.lens, (const char *const *)s.names,
                                  s.n, &rules, err);
    if (!rc && rules) put(&g, rules);
    free(rules);
    schemas_free(&s);
    if (rc) {
        free(g.p);
        return base_fail_wrap(err, "tools");
    }
    *gbnf = g.p;
    return 0;
}
