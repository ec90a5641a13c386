/* JSON Schema (draft 2020-12, the subset OpenAI's strict mode and common generators emit) ->
 * GBNF. The grammar's language is a subset of the documents the schema accepts, chosen so a
 * model cannot run forever where the schema sets no bound on layout:
 *
 * - whitespace between tokens is at most a blank, or a newline and up to 20 blanks;
 * - an object lists its properties in the schema's order (required ones always, optional ones
 *   or not); without `additionalProperties` an object that lists properties holds only those,
 *   and one that lists none holds any; additional keys are written without escapes and never
 *   equal a listed name;
 * - integers have at most 16 digits, fractions 16, exponents 2 (so every number is finite);
 * - \u escapes never name a UTF-16 surrogate (so lengths count as the validator counts);
 * - `oneOf` is read as `anyOf`: exact when its branches are disjoint, as they usually are;
 * - `format` email is RFC 5322's dot-atom form (letters, digits, _ + - in the local part).
 *
 * Supported: type (one or a list), enum, const, anyOf, oneOf, allOf over object schemas,
 * $ref to #, #/$defs/... and #/definitions/... (recursion allowed), properties, required,
 * additionalProperties (true, false or a schema), items, prefixItems, minItems, maxItems,
 * minLength, maxLength, format (date, time, date-time, uuid, email), minimum, maximum,
 * exclusiveMinimum, exclusiveMaximum (on integers; on numbers inclusive integer bounds).
 * Annotations are ignored; so are keywords that are not JSON Schema's (vendor extensions).
 * Every other JSON Schema keyword is refused with its JSON pointer. */
#include "grammar/grammar_internal.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The largest integer magnitude the grammar writes: 16 digits. */
#define INT_CAP 9999999999999999LL

typedef struct sb {
    char *p;
    size_t n, cap;
} sb;

static void sb_add(sb *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = b->cap ? b->cap : 256;
        while (b->n + n + 1 > b->cap) b->cap *= 2;
        b->p = base_xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_puts(sb *b, const char *s) {
    sb_add(b, s, strlen(s));
}

static void sb_printf(sb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sb *b, const char *fmt, ...) {
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *buf = base_xmalloc((size_t)n + 1);
    vsnprintf(buf, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    sb_add(b, buf, (size_t)n);
    free(buf);
}

typedef struct ref_rule {
    char *pointer; /* "#/$defs/x" */
    char *name;    /* its rule */
} ref_rule;

typedef struct compiler {
    json_t *root;
    sb rules; /* every generated rule, one a line */
    int n_names;
    ref_rule *refs;
    size_t n_refs, cap_refs;
    size_t n_done; /* refs[0, n_done) have their rules */
    int depth;
    base_err *err;
} compiler;

/* Keywords by how they are handled. */
static const char *const k_annotations[] = {
    "title",       "description", "default",         "examples",         "$comment",
    "$schema",     "$id",         "$anchor",         "$vocabulary",      "deprecated",
    "readOnly",    "writeOnly",   "contentEncoding", "contentMediaType", "$defs",
    "definitions", NULL};
static const char *const k_refused[] = {"pattern",
                                        "multipleOf",
                                        "uniqueItems",
                                        "not",
                                        "if",
                                        "then",
                                        "else",
                                        "patternProperties",
                                        "propertyNames",
                                        "minProperties",
                                        "maxProperties",
                                        "dependentRequired",
                                        "dependentSchemas",
                                        "dependencies",
                                        "unevaluatedProperties",
                                        "unevaluatedItems",
                                        "contains",
                                        "minContains",
                                        "maxContains",
                                        "$dynamicRef",
                                        "$dynamicAnchor",
                                        "$recursiveRef",
                                        "$recursiveAnchor",
                                        "contentSchema",
                                        NULL};
static const char *const k_object[] = {"properties", "required", "additionalProperties", NULL};
static const char *const k_array[] = {"items", "prefixItems", "minItems", "maxItems", NULL};
static const char *const k_string[] = {"minLength", "maxLength", "format", NULL};
static const char *const k_number[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                                       NULL};

static bool in_list(const char *const *list, const char *k) {
    for (; *list; list++)
        if (!strcmp(*list, k)) return true;
    return false;
}

static bool has_any(json_t *schema, const char *const *list) {
    for (; *list; list++)
        if (json_object_get(schema, *list)) return true;
    return false;
}

/* path + "/" + segment escaped as a JSON pointer (~0, ~1); caller frees. */
static char *path_join(const char *path, const char *seg) {
    sb b = {0};
    sb_puts(&b, path);
    sb_puts(&b, "/");
    for (const char *s = seg; *s; s++) {
        if (*s == '~')
            sb_puts(&b, "~0");
        else if (*s == '/')
            sb_puts(&b, "~1");
        else
            sb_add(&b, s, 1);
    }
    return b.p;
}

static char *path_index(const char *path, const char *key, size_t i) {
    char seg[32];
    snprintf(seg, sizeof seg, "%zu", i);
    char *a = path_join(path, key), *b = path_join(a, seg);
    free(a);
    return b;
}

static int fail_kw(compiler *c, const char *path, const char *kw, const char *why) {
    return base_fail(c->err, "json schema: keyword '%s' at %s: %s", kw, path, why);
}

/* A fresh rule name from a hint ([a-z0-9-] only). */
static char *new_name(compiler *c, const char *hint) {
    char buf[64];
    size_t k = 0;
    for (const char *s = hint; *s && k < 24; s++) {
        char ch = *s;
        if ((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9'))
            buf[k++] = ch;
        else if (ch >= 'A' && ch <= 'Z')
            buf[k++] = (char)(ch - 'A' + 'a');
        else if (k > 0 && buf[k - 1] != '-')
            buf[k++] = '-';
    }
    while (k > 0 && buf[k - 1] == '-') k--;
    if (k == 0) buf[k++] = 'r';
    snprintf(buf + k, sizeof buf - k, "-%d", c->n_names++);
    return base_xstrdup(buf);
}

static void add_rule(compiler *c, const char *name, const char *body) {
    sb_printf(&c->rules, "%s ::= ", name);
    sb_puts(&c->rules, body);
    sb_puts(&c->rules, "\n");
}

/* A GBNF string literal for the UTF-8 bytes s (n). */
static void literal(sb *b, const char *s, size_t n) {
    sb_puts(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\')
            sb_printf(b, "\\%c", ch);
        else if (ch < 0x20 || ch == 0x7F)
            sb_printf(b, "\\x%02X", ch);
        else
            sb_add(b, (const char *)&ch, 1);
    }
    sb_puts(b, "\"");
}

/* The JSON text of v (compact, UTF-8 kept) as a GBNF literal. */
static void json_literal(sb *b, json_t *v) {
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    literal(b, s, strlen(s));
    free(s);
}

/* The fixed rules every compiled schema may call. */
static const char k_base_rules[] =
    "ws ::= ([ \\t] | \"\\n\" [ \\t]{0,20})?\n"
    "json-value ::= json-object | json-array | json-string | json-number | \"true\" | \"false\" "
    "| \"null\"\n"
    "json-object ::= \"{\" ws (json-string ws \":\" ws json-value ws (\",\" ws json-string ws "
    "\":\" ws json-value ws)*)? \"}\"\n"
    "json-array ::= \"[\" ws (json-value ws (\",\" ws json-value ws)*)? \"]\"\n"
    "json-string ::= \"\\\"\" json-char* \"\\\"\"\n"
    "json-char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" json-hex4)\n"
    "json-hex4 ::= [0-9a-cA-CeEfF] json-hex json-hex json-hex | [dD] [0-7] json-hex json-hex\n"
    "json-hex ::= [0-9a-fA-F]\n"
    "json-key-char ::= [^\"\\\\\\x00-\\x1F]\n"
    "json-int ::= \"-\"? json-nat\n"
    "json-nat ::= \"0\" | [1-9] [0-9]{0,15}\n"
    "json-number ::= json-int (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,2})?\n"
    "json-frac ::= \".\" [0-9]{1,16}\n"
    "json-zero-frac ::= \".\" \"0\"{1,16}\n"
    "json-d2 ::= [0-9] [0-9]\n"
    "json-date ::= [0-9]{4} \"-\" (\"0\" [13578] | \"1\" [02]) \"-\" (\"0\" [1-9] | [12] [0-9] | "
    "\"3\" [01]) | [0-9]{4} \"-\" (\"0\" [469] | \"11\") \"-\" (\"0\" [1-9] | [12] [0-9] | "
    "\"30\") | [0-9]{4} \"-02-\" (\"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8]) | json-leap-year "
    "\"-02-29\"\n"
    "json-leap-year ::= [0-9] [0-9] (\"0\" [48] | [2468] [048] | [13579] [26]) | ([02468] "
    "[048] | [13579] [26]) \"00\"\n"
    "json-time ::= ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" "
    "[0-9]{1,6})? (\"Z\" | [+-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])\n"
    "json-date-time ::= json-date \"T\" json-time\n"
    "json-uuid ::= json-hex{8} \"-\" json-hex{4} \"-\" json-hex{4} \"-\" json-hex{4} \"-\" "
    "json-hex{12}\n"
    "json-email ::= json-email-atom (\".\" json-email-atom)* \"@\" json-email-label (\".\" "
    "json-email-label)+\n"
    "json-email-atom ::= [a-zA-Z0-9_+-]{1,32}\n"
    "json-email-label ::= [a-zA-Z0-9] ([a-zA-Z0-9-]{0,30} [a-zA-Z0-9])?\n";

static int gen(compiler *c, json_t *schema, const char *path, sb *out);

/* ---- $ref ---- */

static json_t *resolve_pointer(compiler *c, const char *ptr) {
    if (strcmp(ptr, "#") && strncmp(ptr, "#/", 2)) return NULL;
    json_t *cur = c->root;
    const char *s = ptr + 1;
    while (*s == '/' && cur) {
        s++;
        sb seg = {0};
        sb_add(&seg, "", 0);
        for (; *s && *s != '/'; s++) {
            if (s[0] == '~' && s[1] == '0')
                sb_add(&seg, "~", 1), s++;
            else if (s[0] == '~' && s[1] == '1')
                sb_add(&seg, "/", 1), s++;
            else
                sb_add(&seg, s, 1);
        }
        if (json_is_object(cur)) {
            cur = json_object_get(cur, seg.p);
        } else if (json_is_array(cur)) {
            char *end;
            unsigned long i = strtoul(seg.p, &end, 10);
            cur = *seg.p && !*end ? json_array_get(cur, i) : NULL;
        } else {
            cur = NULL;
        }
        free(seg.p);
    }
    return cur;
}

static int gen_ref(compiler *c, json_t *schema, const char *path, sb *out) {
    json_t *ref = json_object_get(schema, "$ref");
    if (!json_is_string(ref)) return fail_kw(c, path, "$ref", "must be a string");
    const char *ptr = json_string_value(ref);
    if (!resolve_pointer(c, ptr))
        return fail_kw(c, path, "$ref",
                       "only references into this document (#, #/$defs/..., #/definitions/...) "
                       "that exist are supported");
    for (size_t i = 0; i < c->n_refs; i++) {
        if (!strcmp(c->refs[i].pointer, ptr)) {
            sb_puts(out, c->refs[i].name);
            return 0;
        }
    }
    if (c->n_refs == c->cap_refs) {
        c->cap_refs = c->cap_refs ? 2 * c->cap_refs : 8;
        c->refs = base_xrealloc(c->refs, c->cap_refs * sizeof *c->refs);
    }
    const char *slash = strrchr(ptr, '/');
    c->refs[c->n_refs].pointer = base_xstrdup(ptr);
    c->refs[c->n_refs].name = new_name(c, slash ? slash + 1 : "ref");
    sb_puts(out, c->refs[c->n_refs++].name);
    return 0;
}

/* Rules for every reference met so far, and those they meet in turn. */
static int gen_refs(compiler *c) {
    while (c->n_done < c->n_refs) {
        size_t i = c->n_done++;
        sb body = {0};
        int rc = gen(c, resolve_pointer(c, c->refs[i].pointer), c->refs[i].pointer, &body);
        if (!rc) add_rule(c, c->refs[i].name, body.p);
        free(body.p);
        if (rc) return rc;
    }
    return 0;
}

/* ---- enum and const ---- */

static bool type_admits(json_t *type, json_t *v) {
    if (!type) return true;
    const char *name[8];
    size_t n = 0;
    if (json_is_string(type)) {
        name[n++] = json_string_value(type);
    } else {
        for (size_t i = 0; i < json_array_size(type) && n < 8; i++)
            if (json_is_string(json_array_get(type, i)))
                name[n++] = json_string_value(json_array_get(type, i));
    }
    for (size_t i = 0; i < n; i++) {
        const char *t = name[i];
        if ((!strcmp(t, "object") && json_is_object(v)) ||
            (!strcmp(t, "array") && json_is_array(v)) ||
            (!strcmp(t, "string") && json_is_string(v)) ||
            (!strcmp(t, "boolean") && json_is_boolean(v)) ||
            (!strcmp(t, "null") && json_is_null(v)) ||
            (!strcmp(t, "number") && json_is_number(v)) ||
            (!strcmp(t, "integer") &&
             (json_is_integer(v) ||
              (json_is_real(v) && floor(json_real_value(v)) == json_real_value(v)))))
            return true;
    }
    return false;
}

static int gen_enum(compiler *c, json_t *schema, const char *path, sb *out) {
    const char *kw = json_object_get(schema, "const") ? "const" : "enum";
    json_t *vals = json_object_get(schema, kw), *type = json_object_get(schema, "type");
    const char *key;
    json_t *val;
    json_object_foreach(schema, key, val) {
        if (strcmp(key, kw) && strcmp(key, "type") && !in_list(k_annotations, key))
            return fail_kw(c, path, key, "not supported beside enum or const");
    }
    bool list = !strcmp(kw, "enum"); /* const's value is one value, an array too */
    if (list && !json_is_array(vals)) return fail_kw(c, path, kw, "must be an array");
    size_t n = 0;
    sb_puts(out, "(");
    for (size_t i = 0; i < (list ? json_array_size(vals) : 1); i++) {
        json_t *v = list ? json_array_get(vals, i) : vals;
        if (!type_admits(type, v)) continue;
        if (n++) sb_puts(out, " | ");
        json_literal(out, v);
    }
    sb_puts(out, ")");
    if (n == 0) return fail_kw(c, path, kw, "no value is allowed (none has the schema's type)");
    return 0;
}

/* ---- anyOf, oneOf, allOf ---- */

static int only_annotations_beside(compiler *c, json_t *schema, const char *path, const char *kw) {
    const char *key;
    json_t *val;
    json_object_foreach(schema, key, val) {
        if (strcmp(key, kw) && !in_list(k_annotations, key)) {
            char why[128];
            snprintf(why, sizeof why, "not supported beside %s", kw);
            return fail_kw(c, path, key, why);
        }
    }
    return 0;
}

static int gen_any_of(compiler *c, json_t *schema, const char *path, const char *kw, sb *out) {
    if (only_annotations_beside(c, schema, path, kw)) return -1;
    json_t *list = json_object_get(schema, kw);
    if (!json_is_array(list) || json_array_size(list) == 0)
        return fail_kw(c, path, kw, "must be a non-empty array");
    sb_puts(out, "(");
    for (size_t i = 0; i < json_array_size(list); i++) {
        if (i) sb_puts(out, " | ");
        char *p = path_index(path, kw, i);
        int rc = gen(c, json_array_get(list, i), p, out);
        free(p);
        if (rc) return rc;
    }
    sb_puts(out, ")");
    return 0;
}

/* Follows $ref chains to the schema itself. */
static json_t *deref(compiler *c, json_t *s) {
    for (int hops = 0; hops < 32 && json_is_object(s) && json_object_get(s, "$ref"); hops++) {
        const char *ptr = json_string_value(json_object_get(s, "$ref"));
        json_t *t = ptr ? resolve_pointer(c, ptr) : NULL;
        if (!t) return s;
        s = t;
    }
    return s;
}

/* allOf over object schemas: one object schema with the members' properties and required
 * names, refused where the members' additionalProperties would interact. */
static int gen_all_of(compiler *c, json_t *schema, const char *path, sb *out) {
    if (only_annotations_beside(c, schema, path, "allOf")) return -1;
    json_t *list = json_object_get(schema, "allOf");
    if (!json_is_array(list) || json_array_size(list) == 0)
        return fail_kw(c, path, "allOf", "must be a non-empty array");
    if (json_array_size(list) == 1) {
        char *p = path_index(path, "allOf", 0);
        int rc = gen(c, json_array_get(list, 0), p, out);
        free(p);
        return rc;
    }
    json_t *props = json_object(), *req = json_array();
    bool closed = false;
    int rc = 0;
    size_t closed_at = 0;
    for (size_t i = 0; i < json_array_size(list) && !rc; i++) {
        json_t *m = deref(c, json_array_get(list, i));
        const char *key;
        json_t *val;
        if (!json_is_object(m)) {
            rc = fail_kw(c, path, "allOf", "members must be object schemas");
            break;
        }
        json_object_foreach(m, key, val) {
            bool ok = in_list(k_annotations, key) || !strcmp(key, "properties") ||
                      !strcmp(key, "required") || !strcmp(key, "$ref") ||
                      (!strcmp(key, "type") && json_is_string(val) &&
                       !strcmp(json_string_value(val), "object")) ||
                      (!strcmp(key, "additionalProperties") && json_is_boolean(val));
            if (!ok) {
                char *p = path_index(path, "allOf", i);
                rc = fail_kw(c, p, key,
                             "allOf is supported over object schemas made of properties, "
                             "required and a boolean additionalProperties");
                free(p);
                break;
            }
        }
        if (rc) break;
        json_object_foreach(json_object_get(m, "properties"), key, val) {
            json_t *had = json_object_get(props, key);
            if (had && !json_equal(had, val)) {
                char *p = path_index(path, "allOf", i);
                rc = fail_kw(c, p, "properties", "a property two members define differently");
                free(p);
                break;
            }
            json_object_set(props, key, val);
        }
        json_t *r = json_object_get(m, "required");
        for (size_t k = 0; k < json_array_size(r); k++)
            json_array_append(req, json_array_get(r, k));
        if (json_is_false(json_object_get(m, "additionalProperties"))) {
            closed = true;
            closed_at = i;
        }
    }
    if (!rc && closed) {
        /* a closed member forbids every property it does not list itself */
        json_t *own = json_object_get(deref(c, json_array_get(list, closed_at)), "properties");
        const char *key;
        json_t *val;
        json_object_foreach(props, key, val) {
            if (!json_object_get(own, key)) {
                char *p = path_index(path, "allOf", closed_at);
                rc = fail_kw(c, p, "additionalProperties",
                             "false here forbids a property another allOf member adds");
                free(p);
                break;
            }
        }
    }
    if (!rc) {
        json_t *merged =
            json_pack("{s:s, s:O, s:O}", "type", "object", "properties", props, "required", req);
        if (closed) json_object_set_new(merged, "additionalProperties", json_false());
        char *p = path_join(path, "allOf");
        rc = gen(c, merged, p, out);
        free(p);
        json_decref(merged);
    }
    json_decref(props);
    json_decref(req);
    return rc;
}

/* ---- numbers ---- */

/* Digits of d-digit numbers (leading zeros allowed) from lo to hi, as a GBNF expression. */
static void digit_range(sb *out, const char *lo, const char *hi, size_t d) {
    if (d == 0) return;
    size_t rest = d - 1;
    bool lo_min = true, hi_max = true; /* lo's tail all 0, hi's tail all 9 */
    for (size_t i = 1; i < d; i++) {
        lo_min = lo_min && lo[i] == '0';
        hi_max = hi_max && hi[i] == '9';
    }
    if (lo[0] == hi[0]) {
        sb_printf(out, "\"%c\"", lo[0]);
        if (rest) {
            sb_puts(out, " (");
            digit_range(out, lo + 1, hi + 1, rest);
            sb_puts(out, ")");
        }
        return;
    }
    if (lo_min && hi_max) {
        sb_printf(out, "[%c-%c]", lo[0], hi[0]);
        if (rest) sb_printf(out, " [0-9]{%zu}", rest);
        return;
    }
    char nines[20], zeros[20];
    memset(nines, '9', rest);
    memset(zeros, '0', rest);
    char first = lo[0], last = hi[0];
    bool any = false;
    if (!lo_min) {
        sb_printf(out, "\"%c\" (", first);
        digit_range(out, lo + 1, nines, rest);
        sb_puts(out, ")");
        first++;
        any = true;
    }
    if (!hi_max) last--;
    if (first <= last) {
        if (any) sb_puts(out, " | ");
        sb_printf(out, "[%c-%c]", first, last);
        if (rest) sb_printf(out, " [0-9]{%zu}", rest);
        any = true;
    }
    if (!hi_max) {
        if (any) sb_puts(out, " | ");
        sb_printf(out, "\"%c\" (", hi[0]);
        digit_range(out, zeros, hi + 1, rest);
        sb_puts(out, ")");
    }
}

/* Natural numbers in [lo, hi] written without leading zeros (0 <= lo <= hi <= INT_CAP). */
static void nat_range(sb *out, long long lo, long long hi) {
    if (lo == 0 && hi == INT_CAP) {
        sb_puts(out, "json-nat");
        return;
    }
    bool any = false;
    sb_puts(out, "(");
    long long p10 = 1;
    for (size_t d = 1; d <= 16; d++, p10 *= 10) {
        long long a = d == 1 ? 0 : p10, b = p10 * 10 - 1;
        if (a < lo) a = lo;
        if (b > hi) b = hi;
        if (a > b) continue;
        char sa[24], sb_[24];
        snprintf(sa, sizeof sa, "%0*lld", (int)d, a);
        snprintf(sb_, sizeof sb_, "%0*lld", (int)d, b);
        if (any) sb_puts(out, " | ");
        digit_range(out, sa, sb_, d);
        any = true;
    }
    sb_puts(out, ")");
}

/* Reads keyword kw as a bound (*has false when absent). Long double holds every 64-bit
 * integer exactly, as a double would not (9999999999999999 would read as 1e16). */
static int read_bound(compiler *c, json_t *schema, const char *path, const char *kw, bool *has,
                      long double *v) {
    json_t *j = json_object_get(schema, kw);
    *has = j != NULL;
    if (!j) return 0;
    if (!json_is_number(j)) return fail_kw(c, path, kw, "must be a number");
    *v = json_is_integer(j) ? (long double)json_integer_value(j) : (long double)json_real_value(j);
    if (!isfinite(*v)) return fail_kw(c, path, kw, "must be finite");
    return 0;
}

/* x as an integer, a bound past the grammar's 16 digits held at NO_BOUND (INT_CAP + 1): the
 * grammar writes nothing past it either way. */
#define NO_BOUND (INT_CAP + 1)
static long long clamp_bound(long double x) {
    if (x >= (long double)NO_BOUND) return NO_BOUND;
    if (x <= -(long double)NO_BOUND) return -NO_BOUND;
    return (long long)x;
}

/* The inclusive integer bounds [*lo, *hi] the schema's bounds give an integer. */
static int int_bounds(compiler *c, json_t *schema, const char *path, long long *lo, long long *hi) {
    bool has;
    long double v = 0;
    *lo = -INT_CAP;
    *hi = INT_CAP;
    if (read_bound(c, schema, path, "minimum", &has, &v)) return -1;
    if (has && clamp_bound(ceill(v)) > *lo) *lo = clamp_bound(ceill(v));
    if (read_bound(c, schema, path, "exclusiveMinimum", &has, &v)) return -1;
    if (has && clamp_bound(floorl(v) + 1) > *lo) *lo = clamp_bound(floorl(v) + 1);
    if (read_bound(c, schema, path, "maximum", &has, &v)) return -1;
    if (has && clamp_bound(floorl(v)) < *hi) *hi = clamp_bound(floorl(v));
    if (read_bound(c, schema, path, "exclusiveMaximum", &has, &v)) return -1;
    if (has && clamp_bound(ceill(v) - 1) < *hi) *hi = clamp_bound(ceill(v) - 1);
    if (*lo > *hi)
        return fail_kw(c, path, "minimum",
                       "no integer of at most 16 digits (the grammar's) lies within the bounds");
    return 0;
}

static int gen_integer(compiler *c, json_t *schema, const char *path, sb *out) {
    if (!has_any(schema, k_number)) {
        sb_puts(out, "json-int");
        return 0;
    }
    long long lo, hi;
    if (int_bounds(c, schema, path, &lo, &hi)) return -1;
    sb_puts(out, "(");
    if (hi >= 0) nat_range(out, lo > 0 ? lo : 0, hi);
    if (lo < 0) {
        if (hi >= 0) sb_puts(out, " | ");
        sb_puts(out, "\"-\" ");
        nat_range(out, hi < 0 ? -hi : 1, -lo);
    }
    sb_puts(out, ")");
    return 0;
}

/* Magnitudes m = I.F with lo <= m <= hi (integers, 0 <= lo <= hi <= INT_CAP): I in
 * [lo, hi - 1] with any fraction, or I = hi with a zero one; hi = NO_BOUND: any I from lo. */
static void magnitude_range(sb *out, long long lo, long long hi) {
    if (hi == NO_BOUND) {
        sb_puts(out, "(");
        nat_range(out, lo, INT_CAP);
        sb_puts(out, " json-frac?)");
        return;
    }
    sb_puts(out, "(");
    if (lo <= hi - 1) {
        nat_range(out, lo, hi - 1);
        sb_puts(out, " json-frac? | ");
    }
    nat_range(out, hi, hi);
    sb_puts(out, " json-zero-frac?)");
}

static int gen_number(compiler *c, json_t *schema, const char *path, sb *out) {
    if (!has_any(schema, k_number)) {
        sb_puts(out, "json-number");
        return 0;
    }
    bool has_lo, has_hi, has;
    long double lo = 0, hi = 0, v = 0;
    if (read_bound(c, schema, path, "exclusiveMinimum", &has, &v)) return -1;
    if (has)
        return fail_kw(c, path, "exclusiveMinimum",
                       "supported on integers only (on numbers, use minimum)");
    if (read_bound(c, schema, path, "exclusiveMaximum", &has, &v)) return -1;
    if (has)
        return fail_kw(c, path, "exclusiveMaximum",
                       "supported on integers only (on numbers, use maximum)");
    if (read_bound(c, schema, path, "minimum", &has_lo, &lo) ||
        read_bound(c, schema, path, "maximum", &has_hi, &hi))
        return -1;
    if ((has_lo && floorl(lo) != lo) || (has_hi && floorl(hi) != hi))
        return fail_kw(c, path, has_lo && floorl(lo) != lo ? "minimum" : "maximum",
                       "a fractional bound on a number cannot be expressed exactly");
    long long a = has_lo ? clamp_bound(lo) : -NO_BOUND, b = has_hi ? clamp_bound(hi) : NO_BOUND;
    if (a > b) return fail_kw(c, path, "minimum", "greater than maximum");
    if (a > INT_CAP || b < -INT_CAP)
        return fail_kw(c, path, a > INT_CAP ? "minimum" : "maximum",
                       "past the 16-digit numbers the grammar writes");
    sb_puts(out, "(");
    if (b >= 0) magnitude_range(out, a > 0 ? a : 0, b);
    if (a < 0) {
        if (b >= 0) sb_puts(out, " | ");
        sb_puts(out, "\"-\" ");
        magnitude_range(out, b < 0 ? -b : 0, -a);
    }
    sb_puts(out, ")");
    return 0;
}

/* ---- strings ---- */

static int read_count(compiler *c, json_t *schema, const char *path, const char *kw, long long def,
                      long long *out) {
    json_t *j = json_object_get(schema, kw);
    *out = def;
    if (!j) return 0;
    if (!json_is_integer(j) || json_integer_value(j) < 0)
        return fail_kw(c, path, kw, "must be a non-negative integer");
    if (json_integer_value(j) > 10000) return fail_kw(c, path, kw, "above 10000 is not supported");
    *out = json_integer_value(j);
    return 0;
}

static int gen_string(compiler *c, json_t *schema, const char *path, sb *out) {
    json_t *format = json_object_get(schema, "format");
    if (format) {
        static const char *const known[] = {"date", "time", "date-time", "uuid", "email", NULL};
        const char *f = json_string_value(format);
        if (!f || !in_list(known, f))
            return fail_kw(c, path, "format",
                           "only date, time, date-time, uuid and email are supported");
        if (json_object_get(schema, "minLength") || json_object_get(schema, "maxLength"))
            return fail_kw(c, path,
                           json_object_get(schema, "minLength") ? "minLength" : "maxLength",
                           "not supported beside format");
        sb_printf(out, "\"\\\"\" json-%s \"\\\"\"", f);
        return 0;
    }
    long long lo, hi;
    if (read_count(c, schema, path, "minLength", 0, &lo) ||
        read_count(c, schema, path, "maxLength", -1, &hi))
        return -1;
    if (hi >= 0 && hi < lo) return fail_kw(c, path, "minLength", "greater than maxLength");
    if (lo == 0 && hi < 0) {
        sb_puts(out, "json-string");
        return 0;
    }
    if (hi < 0)
        sb_printf(out, "\"\\\"\" json-char{%lld,} \"\\\"\"", lo);
    else
        sb_printf(out, "\"\\\"\" json-char{%lld,%lld} \"\\\"\"", lo, hi);
    return 0;
}

/* ---- arrays ---- */

static int gen_array(compiler *c, json_t *schema, const char *path, sb *out) {
    json_t *items = json_object_get(schema, "items"),
           *prefix = json_object_get(schema, "prefixItems");
    if (items && json_is_array(items))
        return fail_kw(c, path, "items",
                       "an array of schemas (the older tuple form): use prefixItems");
    if (prefix && !json_is_array(prefix))
        return fail_kw(c, path, "prefixItems", "must be an array");
    long long lo, hi;
    if (read_count(c, schema, path, "minItems", 0, &lo) ||
        read_count(c, schema, path, "maxItems", -1, &hi))
        return -1;
    size_t p = json_array_size(prefix);
    bool more = !json_is_false(items);
    if (!more && (hi < 0 || hi > (long long)p)) hi = (long long)p;
    if (hi >= 0 && hi < lo)
        return fail_kw(c, path, "minItems",
                       "more items than maxItems (or prefixItems with items false) allow");
    if (hi >= 0 && (long long)p > hi) p = (size_t)hi;
    sb item = {0};
    sb_add(&item, "", 0);
    if (more) {
        char *ip = path_join(path, "items");
        int rc = 0;
        if (items)
            rc = gen(c, items, ip, &item);
        else
            sb_puts(&item, "json-value");
        free(ip);
        if (rc) {
            free(item.p);
            return rc;
        }
    }
    sb_puts(out, "\"[\" ws ");
    if (hi != 0) {
        if (lo == 0) sb_puts(out, "(");
        for (size_t i = 0; i < p; i++) {
            if (i) sb_puts(out, (long long)i >= lo ? "(\",\" ws " : "\",\" ws ");
            char *ep = path_index(path, "prefixItems", i);
            int rc = gen(c, json_array_get(prefix, i), ep, out);
            free(ep);
            if (rc) {
                free(item.p);
                return rc;
            }
            sb_puts(out, " ws ");
        }
        if (more && (hi < 0 || (long long)p < hi)) {
            long long min_tail = lo > (long long)p ? lo - (long long)p : 0;
            long long max_tail = hi < 0 ? -1 : hi - (long long)p;
            if (p == 0) {
                /* the first item carries no comma */
                sb_printf(out, "(%s) ws ", item.p);
                min_tail = min_tail > 0 ? min_tail - 1 : 0;
                max_tail = max_tail > 0 ? max_tail - 1 : max_tail;
            }
            if (max_tail < 0)
                sb_printf(out, "(\",\" ws (%s) ws){%lld,}", item.p, min_tail);
            else if (max_tail > 0)
                sb_printf(out, "(\",\" ws (%s) ws){%lld,%lld}", item.p, min_tail, max_tail);
        }
        for (size_t i = 1; i < p; i++)
            if ((long long)i >= lo) sb_puts(out, ")?");
        if (lo == 0) sb_puts(out, ")?");
    }
    sb_puts(out, " \"]\"");
    free(item.p);
    return 0;
}

/* ---- objects ---- */

/* A key that is none of names (n): written without escapes, it equals a name only if its code
 * points do, so a trie over the names' code points decides; names holding a character that
 * needs an escape cannot collide and are left out. Returns the rule for the key's text after
 * its opening quote. */
typedef struct key_trie {
    uint32_t cp;
    bool final;
    struct key_trie *kids;
    size_t n_kids;
} key_trie;

static void trie_free(key_trie *t) {
    for (size_t i = 0; i < t->n_kids; i++) trie_free(&t->kids[i]);
    free(t->kids);
}

static bool decode_name(const char *s, uint32_t *cps, size_t *n) {
    *n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        uint32_t cp;
        int k = *p < 0x80 ? 1 : (*p & 0xE0) == 0xC0 ? 2 : (*p & 0xF0) == 0xE0 ? 3 : 4;
        cp = k == 1 ? *p : *p & (0x7F >> k);
        for (int i = 1; i < k; i++) cp = cp << 6 | (p[i] & 0x3F);
        p += k;
        if (cp < 0x20 || cp == '"' || cp == '\\') return false;
        cps[(*n)++] = cp;
    }
    return true;
}

static void class_char(sb *b, uint32_t cp) {
    if ((cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z'))
        sb_printf(b, "%c", (char)cp);
    else if (cp < 0x100)
        sb_printf(b, "\\x%02X", cp);
    else if (cp < 0x10000)
        sb_printf(b, "\\u%04X", cp);
    else
        sb_printf(b, "\\U%08X", cp);
}

static void trie_rules(compiler *c, const key_trie *t, const char *name) {
    sb body = {0};
    sb_puts(&body, t->final ? "(" : "(\"\\\"\" | ");
    sb_puts(&body, "[^\"\\\\\\x00-\\x1F");
    for (size_t i = 0; i < t->n_kids; i++) class_char(&body, t->kids[i].cp);
    sb_puts(&body, "] json-key-char* \"\\\"\"");
    for (size_t i = 0; i < t->n_kids; i++) {
        char *kid = new_name(c, "key");
        sb_puts(&body, " | [");
        class_char(&body, t->kids[i].cp);
        sb_printf(&body, "] %s", kid);
        trie_rules(c, &t->kids[i], kid);
        free(kid);
    }
    sb_puts(&body, ")");
    add_rule(c, name, body.p);
    free(body.p);
}

static char *other_key_rule(compiler *c, json_t *names) {
    key_trie root = {0};
    const char *key;
    json_t *val;
    json_object_foreach(names, key, val) {
        size_t len = strlen(key), n;
        uint32_t *cps = base_xmalloc((len + 1) * sizeof *cps);
        if (decode_name(key, cps, &n)) {
            key_trie *t = &root;
            for (size_t i = 0; i < n; i++) {
                size_t k = 0;
                while (k < t->n_kids && t->kids[k].cp != cps[i]) k++;
                if (k == t->n_kids) {
                    t->kids = base_xrealloc(t->kids, (t->n_kids + 1) * sizeof *t->kids);
                    t->kids[t->n_kids++] = (key_trie){.cp = cps[i]};
                }
                t = &t->kids[k];
            }
            t->final = true;
        }
        free(cps);
    }
    char *name = new_name(c, "other-key");
    trie_rules(c, &root, name);
    trie_free(&root);
    return name;
}

static int gen_object(compiler *c, json_t *schema, const char *path, sb *out) {
    json_t *props = json_object_get(schema, "properties"),
           *req = json_object_get(schema, "required"),
           *extra = json_object_get(schema, "additionalProperties");
    if (props && !json_is_object(props)) return fail_kw(c, path, "properties", "must be an object");
    if (req && !json_is_array(req))
        return fail_kw(c, path, "required", "must be an array of names");
    if (extra && !json_is_boolean(extra) && !json_is_object(extra))
        return fail_kw(c, path, "additionalProperties", "must be a boolean or a schema");
    /* the listed properties, then required names the list lacks (valued as additional) */
    json_t *list = props ? json_deep_copy(props) : json_object();
    for (size_t i = 0; i < json_array_size(req); i++) {
        const char *name = json_string_value(json_array_get(req, i));
        if (!name) {
            json_decref(list);
            return fail_kw(c, path, "required", "must be an array of names");
        }
        if (json_object_get(list, name)) continue;
        if (json_is_false(extra)) {
            json_decref(list);
            return fail_kw(c, path, "required",
                           "names a property that properties lacks and additionalProperties false "
                           "forbids");
        }
        json_object_set_new(list, name,
                            extra && json_is_object(extra) ? json_deep_copy(extra) : json_true());
    }
    bool open =
        json_is_true(extra) || json_is_object(extra) || (!extra && json_object_size(list) == 0);
    size_t n = json_object_size(list);
    char **kv = base_xcalloc(n + 1, sizeof *kv);
    bool *required = base_xcalloc(n + 1, sizeof *required);
    int rc = 0;
    size_t i = 0;
    const char *key;
    json_t *val;
    json_object_foreach(list, key, val) {
        for (size_t k = 0; k < json_array_size(req); k++)
            required[i] = required[i] || !strcmp(json_string_value(json_array_get(req, k)), key);
        sb e = {0};
        json_t *name = json_string(key);
        json_literal(&e, name);
        json_decref(name);
        sb_puts(&e, " ws \":\" ws ");
        char *kp =
            path_join(path, json_object_get(props, key) ? "properties" : "additionalProperties");
        char *vp = json_object_get(props, key) ? path_join(kp, key) : base_xstrdup(kp);
        rc = gen(c, val, vp, &e);
        free(kp);
        free(vp);
        sb_puts(&e, " ws");
        kv[i++] = e.p;
        if (rc) break;
    }
    if (!rc && open) {
        sb e = {0};
        sb_puts(&e, "\"\\\"\" ");
        if (n) {
            char *k = other_key_rule(c, list);
            sb_puts(&e, k);
            free(k);
        } else {
            sb_puts(&e, "json-key-char* \"\\\"\"");
        }
        sb_puts(&e, " ws \":\" ws ");
        char *ap = path_join(path, "additionalProperties");
        if (json_is_object(extra))
            rc = gen(c, extra, ap, &e);
        else
            sb_puts(&e, "json-value");
        free(ap);
        sb_puts(&e, " ws");
        kv[n] = e.p;
    }
    if (!rc) {
        /* first[i]: the list from property i with nothing written yet; rest[i]: with
         * something written, so each property carries its leading comma */
        char **first = base_xcalloc(n + 2, sizeof *first),
             **rest = base_xcalloc(n + 2, sizeof *rest);
        first[n] = new_name(c, "obj-end");
        rest[n] = new_name(c, "obj-more");
        if (open) {
            sb a = {0}, b = {0};
            sb_printf(&a, "(%s %s)?", kv[n], rest[n]);
            sb_printf(&b, "(\",\" ws %s)*", kv[n]);
            add_rule(c, first[n], a.p);
            add_rule(c, rest[n], b.p);
            free(a.p);
            free(b.p);
        } else {
            add_rule(c, first[n], "\"\"");
            add_rule(c, rest[n], "\"\"");
        }
        for (size_t k = n; k-- > 0;) {
            first[k] = new_name(c, "obj-first");
            rest[k] = new_name(c, "obj-rest");
            sb a = {0}, b = {0};
            if (required[k]) {
                sb_printf(&a, "%s %s", kv[k], rest[k + 1]);
                sb_printf(&b, "\",\" ws %s %s", kv[k], rest[k + 1]);
            } else {
                sb_printf(&a, "%s %s | %s", kv[k], rest[k + 1], first[k + 1]);
                sb_printf(&b, "(\",\" ws %s)? %s", kv[k], rest[k + 1]);
            }
            add_rule(c, first[k], a.p);
            add_rule(c, rest[k], b.p);
            free(a.p);
            free(b.p);
        }
        sb_printf(out, "\"{\" ws %s \"}\"", first[0]);
        for (size_t k = 0; k <= n; k++) {
            free(first[k]);
            free(rest[k]);
        }
        free(first);
        free(rest);
    }
    for (size_t k = 0; k <= n; k++) free(kv[k]);
    free(kv);
    free(required);
    json_decref(list);
    return rc;
}

/* ---- dispatch ---- */

static int gen_type(compiler *c, json_t *schema, const char *path, const char *t, sb *out) {
    /* ajv-formats checks int32, float and the like on numbers: refused, not left unchecked */
    if (strcmp(t, "string") && json_object_get(schema, "format") &&
        (!strcmp(t, "integer") || !strcmp(t, "number")))
        return fail_kw(c, path, "format", "supported on strings only");
    if (!strcmp(t, "object")) return gen_object(c, schema, path, out);
    if (!strcmp(t, "array")) return gen_array(c, schema, path, out);
    if (!strcmp(t, "string")) return gen_string(c, schema, path, out);
    if (!strcmp(t, "integer")) return gen_integer(c, schema, path, out);
    if (!strcmp(t, "number")) return gen_number(c, schema, path, out);
    if (!strcmp(t, "boolean") || !strcmp(t, "null")) {
        sb_puts(out, !strcmp(t, "null") ? "\"null\"" : "(\"true\" | \"false\")");
        return 0;
    }
    char why[160];
    snprintf(why, sizeof why, "unknown type '%.100s'", t);
    return fail_kw(c, path, "type", why);
}

static int gen(compiler *c, json_t *schema, const char *path, sb *out) {
    if (json_is_true(schema)) {
        sb_puts(out, "json-value");
        return 0;
    }
    if (!json_is_object(schema))
        return base_fail(c->err, "json schema: %s: a schema must be an object or true", path);
    if (++c->depth > 64) {
        c->depth--;
        return base_fail(c->err, "json schema: %s: nested more than 64 deep", path);
    }
    const char *key;
    json_t *val;
    json_object_foreach(schema, key, val) {
        if (in_list(k_refused, key)) {
            c->depth--;
            return fail_kw(c, path, key, "not supported");
        }
    }
    int rc = 0;
    json_t *type = json_object_get(schema, "type");
    if (json_object_get(schema, "$ref")) {
        rc = only_annotations_beside(c, schema, path, "$ref");
        if (!rc) rc = gen_ref(c, schema, path, out);
    } else if (json_object_get(schema, "enum") || json_object_get(schema, "const")) {
        rc = gen_enum(c, schema, path, out);
    } else if (json_object_get(schema, "anyOf")) {
        rc = gen_any_of(c, schema, path, "anyOf", out);
    } else if (json_object_get(schema, "oneOf")) {
        rc = gen_any_of(c, schema, path, "oneOf", out);
    } else if (json_object_get(schema, "allOf")) {
        rc = gen_all_of(c, schema, path, out);
    } else if (json_is_string(type)) {
        rc = gen_type(c, schema, path, json_string_value(type), out);
    } else if (json_is_array(type) && json_array_size(type) > 0) {
        sb_puts(out, "(");
        for (size_t i = 0; i < json_array_size(type) && !rc; i++) {
            if (!json_is_string(json_array_get(type, i))) {
                rc = fail_kw(c, path, "type", "must be a type name or a list of them");
                break;
            }
            if (i) sb_puts(out, " | ");
            rc = gen_type(c, schema, path, json_string_value(json_array_get(type, i)), out);
        }
        sb_puts(out, ")");
    } else if (type) {
        rc = fail_kw(c, path, "type", "must be a type name or a list of them");
    } else if (has_any(schema, k_object)) {
        rc = gen_object(c, schema, path, out); /* the keywords say which type is meant */
    } else if (has_any(schema, k_array)) {
        rc = gen_array(c, schema, path, out);
    } else if (has_any(schema, k_string)) {
        rc = gen_string(c, schema, path, out);
    } else if (has_any(schema, k_number)) {
        rc = gen_number(c, schema, path, out);
    } else {
        sb_puts(out, "json-value");
    }
    c->depth--;
    return rc;
}

/* Compiles one schema: its expression into *body, the rules it needs appended to c->rules
 * (names unique across the schemas one compiler takes, since n_names carries on). */
static int compile_one(compiler *c, const char *schema, size_t len, sb *body, base_err *err) {
    json_error_t jerr;
    json_t *root = json_loadb(schema, len, JSON_DECODE_ANY, &jerr);
    if (!root)
        return base_fail(err, "json schema: line %d, column %d: %s", jerr.line, jerr.column,
                         jerr.text);
    c->root = root;
    c->err = err;
    int rc = gen(c, root, "#", body);
    if (!rc) rc = gen_refs(c);
    for (size_t i = 0; i < c->n_refs; i++) {
        free(c->refs[i].pointer);
        free(c->refs[i].name);
    }
    free(c->refs);
    c->refs = NULL;
    c->n_refs = c->cap_refs = c->n_done = 0;
    c->root = NULL;
    json_decref(root);
    return rc;
}

int gram_schema_to_gbnf(const char *schema, size_t len, char **gbnf, base_err *err) {
    const char *name = "root";
    return gram_schemas_to_gbnf(&schema, &len, &name, 1, gbnf, err);
}

int gram_schemas_to_gbnf(const char *const *schemas, const size_t *lens, const char *const *names,
                         int n, char **gbnf, base_err *err) {
    compiler c = {0};
    sb g = {0};
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        sb body = {0};
        rc = compile_one(&c, schemas[i], lens[i], &body, err);
        if (!rc) sb_printf(&g, "%s ::= %s\n", names[i], body.p);
        free(body.p);
    }
    if (!rc) {
        sb_add(&g, c.rules.p ? c.rules.p : "", c.rules.n);
        sb_puts(&g, k_base_rules);
        *gbnf = g.p;
    } else {
        free(g.p);
    }
    free(c.rules.p);
    return rc;
}

char *gram_json_object_gbnf(void) {
    sb g = {0};
    sb_puts(&g, "root ::= json-object\n");
    sb_puts(&g, k_base_rules);
    return g.p;
}
