/* Runtime values: the arena, strings, lists and dicts, Python-style printing (str, repr,
 * json.dumps) and conversion from JSON. */
#include "chat/chat_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ---- arena ---- */

struct chat_chunk {
    chat_chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

void *chat_alloc(chat_arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    if (a->limit && (n > a->limit || a->used > a->limit - n)) return NULL;
    chat_chunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > (64u << 10) ? n : (64u << 10);
        c = malloc(sizeof(chat_chunk) + cap);
        if (!c) return NULL;
        c->cap = cap;
        c->used = 0;
        if (n > (64u << 10) && a->head) {
            /* A big block goes behind the current chunk so that chunk keeps filling. */
            c->next = a->head->next;
            a->head->next = c;
        } else {
            c->next = a->head;
            a->head = c;
        }
    }
    void *p = c->data + c->used;
    c->used += n;
    a->used += n;
    memset(p, 0, n);
    return p;
}

void chat_arena_free(chat_arena *a) {
    chat_chunk *c = a->head;
    while (c) {
        chat_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
    a->used = 0;
}

/* ---- output buffer ---- */

int chat_buf_put(chat_buf *b, const char *s, size_t n) {
    if (b->limit && (n > b->limit || b->len > b->limit - n)) return -1;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return -1;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

int chat_buf_puts(chat_buf *b, const char *s) {
    return chat_buf_put(b, s, strlen(s));
}

int chat_buf_printf(chat_buf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return -1;
    return chat_buf_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* ---- UTF-8 ---- */

int chat_utf8_next(const unsigned char *s, size_t n, int32_t *cp) {
    unsigned c = s[0];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 1 || len == 0 || (size_t)len > n) {
        *cp = (int32_t)c;
        return 1;
    }
    int32_t v = (int32_t)(c & (0x7F >> len));
    for (int k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80) {
            *cp = (int32_t)c;
            return 1;
        }
        v = (v << 6) | (s[k] & 0x3F);
    }
    *cp = v;
    return len;
}

size_t chat_utf8_count(const char *s, size_t len) {
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        int32_t cp;
        i += (size_t)chat_utf8_next((const unsigned char *)s + i, len - i, &cp);
        n++;
    }
    return n;
}

bool chat_is_space(int32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

/* ---- construction ---- */

cv_str *chat_str_alloc(chat_arena *a, size_t len, char **bytes) {
    cv_str *s = chat_alloc(a, sizeof *s + len + 1);
    if (!s) return NULL;
    char *d = (char *)(s + 1);
    d[len] = 0;
    s->p = d;
    s->len = len;
    *bytes = d;
    return s;
}

cv_str *chat_str_new(chat_arena *a, const char *p, size_t len) {
    char *d;
    cv_str *s = chat_str_alloc(a, len, &d);
    if (s && len) memcpy(d, p, len);
    return s;
}

cv chat_str_value(chat_arena *a, const char *p, size_t len) {
    cv_str *s = chat_str_new(a, p, len);
    if (!s) return cv_undef(NULL);
    cv v = {.t = CV_STR};
    v.s = s;
    return v;
}

cv_list *chat_list_new(chat_arena *a, size_t n) {
    cv_list *l = chat_alloc(a, sizeof *l);
    if (!l) return NULL;
    if (n > SIZE_MAX / sizeof(cv)) return NULL;
    l->items = chat_alloc(a, n * sizeof(cv));
    if (!l->items) return NULL;
    l->n = n;
    return l;
}

cv_dict *chat_dict_new(chat_arena *a, size_t cap) {
    cv_dict *d = chat_alloc(a, sizeof *d);
    if (!d) return NULL;
    if (cap < 4) cap = 4;
    d->keys = chat_alloc(a, cap * sizeof(cv));
    d->vals = chat_alloc(a, cap * sizeof(cv));
    if (!d->keys || !d->vals) return NULL;
    d->cap = cap;
    return d;
}

cv *chat_dict_find(const cv_dict *d, cv key) {
    for (size_t i = 0; i < d->n; i++)
        if (chat_equal_shallow(d->keys[i], key)) return &d->vals[i];
    return NULL;
}

bool chat_dict_key(cv v) {
    return v.t == CV_UNDEF || v.t == CV_NONE || v.t == CV_BOOL || v.t == CV_INT ||
           v.t == CV_FLOAT || v.t == CV_STR;
}

cv *chat_dict_get(const cv_dict *d, const char *key, size_t len) {
    for (size_t i = 0; i < d->n; i++) {
        const cv *k = &d->keys[i];
        if (k->t == CV_STR && k->s->len == len && memcmp(k->s->p, key, len) == 0)
            return &d->vals[i];
    }
    return NULL;
}

int chat_dict_set(chat_arena *a, cv_dict *d, cv key, cv val) {
    cv *slot = chat_dict_find(d, key);
    if (slot) {
        *slot = val;
        return 0;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap * 2;
        cv *keys = chat_alloc(a, cap * sizeof(cv));
        cv *vals = chat_alloc(a, cap * sizeof(cv));
        if (!keys || !vals) return -1;
        memcpy(keys, d->keys, d->n * sizeof(cv));
        memcpy(vals, d->vals, d->n * sizeof(cv));
        d->keys = keys;
        d->vals = vals;
        d->cap = cap;
    }
    d->keys[d->n] = key;
    d->vals[d->n] = val;
    d->n++;
    return 0;
}

/* ---- semantics ---- */

bool chat_truthy(cv v) {
    switch (v.t) {
    case CV_UNDEF:
    case CV_NONE:
        return false;
    case CV_BOOL:
        return v.b;
    case CV_INT:
        return v.i != 0;
    case CV_FLOAT:
        return v.f != 0;
    case CV_STR:
        return v.s->len > 0;
    case CV_LIST:
        return v.l->n > 0;
    case CV_DICT:
        return v.d->n > 0;
    default:
        return true;
    }
}

static bool is_num(cv v) {
    return v.t == CV_BOOL || v.t == CV_INT || v.t == CV_FLOAT;
}

bool chat_equal_shallow(cv a, cv b) {
    if (is_num(a) && is_num(b)) {
        if (a.t != CV_FLOAT && b.t != CV_FLOAT) {
            int64_t x = a.t == CV_BOOL ? a.b : a.i, y = b.t == CV_BOOL ? b.b : b.i;
            return x == y;
        }
        double x = a.t == CV_FLOAT ? a.f : a.t == CV_BOOL ? a.b : (double)a.i;
        double y = b.t == CV_FLOAT ? b.f : b.t == CV_BOOL ? b.b : (double)b.i;
        return x == y;
    }
    if (a.t != b.t) return false;
    switch (a.t) {
    case CV_UNDEF:
    case CV_NONE:
        return true;
    case CV_STR:
        return a.s->len == b.s->len && memcmp(a.s->p, b.s->p, a.s->len) == 0;
    case CV_LIST:
        return a.l == b.l;
    case CV_DICT:
    case CV_NS:
        return a.d == b.d;
    case CV_LOOP:
        return a.loop == b.loop;
    case CV_MACRO:
        return a.macro == b.macro;
    case CV_FUNC:
        return a.fn == b.fn;
    default:
        return false;
    }
}

const char *chat_type_name(cv v) {
    static const char *names[] = {"undefined", "NoneType",    "bool",  "int",
                                  "float",     "str",         "list",  "dict",
                                  "Namespace", "LoopContext", "Macro", "function"};
    if (v.t == CV_LIST && v.l->tuple) return "tuple";
    return names[v.t];
}

/* ---- printing ---- */

void chat_float_repr(double f, char *out, size_t size) {
    if (isnan(f)) {
        snprintf(out, size, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(out, size, f < 0 ? "-inf" : "inf");
        return;
    }
    char buf[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, f);
        if (strtod(buf, NULL) == f) break;
    }
    /* buf is [-]d[.ddd]e[+-]xx: pull out the digits and the exponent. */
    const char *p = buf;
    bool neg = *p == '-';
    if (neg) p++;
    char digits[24];
    int nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    char res[64];
    int n = 0;
    if (neg) res[n++] = '-';
    if (exp < -4 || exp >= 16) {
        res[n++] = digits[0];
        if (nd > 1) {
            res[n++] = '.';
            for (int k = 1; k < nd; k++) res[n++] = digits[k];
        }
        n += snprintf(res + n, sizeof res - (size_t)n, "e%c%02d", exp < 0 ? '-' : '+', abs(exp));
    } else if (exp < 0) {
        res[n++] = '0';
        res[n++] = '.';
        for (int k = 0; k < -exp - 1; k++) res[n++] = '0';
        for (int k = 0; k < nd; k++) res[n++] = digits[k];
    } else {
        for (int k = 0; k <= exp; k++) res[n++] = k < nd ? digits[k] : '0';
        res[n++] = '.';
        if (nd > exp + 1) {
            for (int k = exp + 1; k < nd; k++) res[n++] = digits[k];
        } else {
            res[n++] = '0';
        }
    }
    res[n] = 0;
    snprintf(out, size, "%s", res);
}

static int repr_str(chat_buf *b, const cv_str *s) {
    bool has_single = memchr(s->p, '\'', s->len) != NULL;
    bool has_double = memchr(s->p, '"', s->len) != NULL;
    char q = has_single && !has_double ? '"' : '\'';
    if (chat_buf_put(b, &q, 1)) return -1;
    for (size_t i = 0; i < s->len;) {
        int32_t cp;
        int k = chat_utf8_next((const unsigned char *)s->p + i, s->len - i, &cp);
        int rc = 0;
        if (cp == q || cp == '\\') {
            char e[2] = {'\\', (char)cp};
            rc = chat_buf_put(b, e, 2);
        } else if (cp == '\n') {
            rc = chat_buf_puts(b, "\\n");
        } else if (cp == '\r') {
            rc = chat_buf_puts(b, "\\r");
        } else if (cp == '\t') {
            rc = chat_buf_puts(b, "\\t");
        } else if (cp < 0x20 || cp == 0x7F) {
            rc = chat_buf_printf(b, "\\x%02x", (unsigned)cp);
        } else if (cp >= 0x80) {
            utf8proc_category_t cat = utf8proc_category(cp);
            bool hidden = cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF ||
                          cat == UTF8PROC_CATEGORY_CS || cat == UTF8PROC_CATEGORY_CO ||
                          cat == UTF8PROC_CATEGORY_CN || cat == UTF8PROC_CATEGORY_ZL ||
                          cat == UTF8PROC_CATEGORY_ZP || cat == UTF8PROC_CATEGORY_ZS;
            if (!hidden)
                rc = chat_buf_put(b, s->p + i, (size_t)k);
            else if (cp < 0x100)
                rc = chat_buf_printf(b, "\\x%02x", (unsigned)cp);
            else if (cp < 0x10000)
                rc = chat_buf_printf(b, "\\u%04x", (unsigned)cp);
            else
                rc = chat_buf_printf(b, "\\U%08x", (unsigned)cp);
        } else {
            rc = chat_buf_put(b, s->p + i, (size_t)k);
        }
        if (rc) return -1;
        i += (size_t)k;
    }
    return chat_buf_put(b, &q, 1);
}

static int print_value(chat_buf *b, cv v, bool repr, int depth);

static int print_items(chat_buf *b, const cv_dict *d, int depth) {
    if (chat_buf_puts(b, "{")) return -1;
    for (size_t i = 0; i < d->n; i++) {
        if (i && chat_buf_puts(b, ", ")) return -1;
        if (print_value(b, d->keys[i], true, depth + 1) || chat_buf_puts(b, ": ") ||
            print_value(b, d->vals[i], true, depth + 1))
            return -1;
    }
    return chat_buf_puts(b, "}");
}

static int print_value(chat_buf *b, cv v, bool repr, int depth) {
    if (depth > 100) return chat_buf_puts(b, "...");
    char num[64];
    switch (v.t) {
    case CV_UNDEF:
        return 0;
    case CV_NONE:
        return chat_buf_puts(b, "None");
    case CV_BOOL:
        return chat_buf_puts(b, v.b ? "True" : "False");
    case CV_INT:
        return chat_buf_printf(b, "%lld", (long long)v.i);
    case CV_FLOAT:
        chat_float_repr(v.f, num, sizeof num);
        return chat_buf_puts(b, num);
    case CV_STR:
        return repr ? repr_str(b, v.s) : chat_buf_put(b, v.s->p, v.s->len);
    case CV_LIST: {
        if (chat_buf_puts(b, v.l->tuple ? "(" : "[")) return -1;
        for (size_t i = 0; i < v.l->n; i++) {
            if (i && chat_buf_puts(b, ", ")) return -1;
            if (print_value(b, v.l->items[i], true, depth + 1)) return -1;
        }
        if (v.l->tuple && v.l->n == 1 && chat_buf_puts(b, ",")) return -1;
        return chat_buf_puts(b, v.l->tuple ? ")" : "]");
    }
    case CV_DICT:
        return print_items(b, v.d, depth);
    case CV_NS:
        if (chat_buf_puts(b, "<Namespace ") || print_items(b, v.d, depth)) return -1;
        return chat_buf_puts(b, ">");
    case CV_LOOP:
        return chat_buf_printf(b, "<LoopContext %zu/%zu>", v.loop->i + 1, v.loop->items->n);
    case CV_MACRO:
        return chat_buf_printf(b, "<Macro '%s'>", v.macro->name);
    case CV_FUNC:
        return chat_buf_puts(b, "<built-in function>");
    }
    return 0;
}

int chat_to_str(chat_buf *b, cv v) {
    return print_value(b, v, false, 0);
}

int chat_repr(chat_buf *b, cv v) {
    return print_value(b, v, true, 0);
}

/* ---- JSON ---- */

static int json_str(chat_buf *b, const char *p, size_t len) {
    if (chat_buf_put(b, "\"", 1)) return -1;
    size_t run = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)p[i];
        const char *esc = NULL;
        char hex[8];
        if (c == '"')
            esc = "\\\"";
        else if (c == '\\')
            esc = "\\\\";
        else if (c == '\n')
            esc = "\\n";
        else if (c == '\r')
            esc = "\\r";
        else if (c == '\t')
            esc = "\\t";
        else if (c == '\b')
            esc = "\\b";
        else if (c == '\f')
            esc = "\\f";
        else if (c < 0x20) {
            snprintf(hex, sizeof hex, "\\u%04x", c);
            esc = hex;
        }
        if (!esc) continue;
        if (chat_buf_put(b, p + run, i - run) || chat_buf_puts(b, esc)) return -1;
        run = i + 1;
    }
    if (chat_buf_put(b, p + run, len - run)) return -1;
    return chat_buf_put(b, "\"", 1);
}

static int json_newline(chat_buf *b, int indent, int depth) {
    if (chat_buf_put(b, "\n", 1)) return -1;
    for (int k = 0; k < indent * depth; k++)
        if (chat_buf_put(b, " ", 1)) return -1;
    return 0;
}

static int json_key_cmp(const void *x, const void *y) {
    const cv *a = *(const cv *const *)x, *b = *(const cv *const *)y;
    size_t n = a->s->len < b->s->len ? a->s->len : b->s->len;
    int c = memcmp(a->s->p, b->s->p, n);
    if (c) return c;
    return a->s->len < b->s->len ? -1 : a->s->len > b->s->len;
}

int chat_to_json(chat_buf *b, cv v, int indent, const char *item_sep, const char *key_sep,
                 bool sort_keys, int depth, char *msg, size_t msg_size) {
    if (depth > 100) {
        snprintf(msg, msg_size, "tojson: value nested too deeply (circular?)");
        return -1;
    }
    char num[64];
    switch (v.t) {
    case CV_UNDEF:
    case CV_NONE:
        return chat_buf_puts(b, "null");
    case CV_BOOL:
        return chat_buf_puts(b, v.b ? "true" : "false");
    case CV_INT:
        return chat_buf_printf(b, "%lld", (long long)v.i);
    case CV_FLOAT:
        if (isnan(v.f)) return chat_buf_puts(b, "NaN");
        if (isinf(v.f)) return chat_buf_puts(b, v.f < 0 ? "-Infinity" : "Infinity");
        chat_float_repr(v.f, num, sizeof num);
        return chat_buf_puts(b, num);
    case CV_STR:
        return json_str(b, v.s->p, v.s->len);
    case CV_LIST:
        if (chat_buf_puts(b, "[")) return -1;
        for (size_t i = 0; i < v.l->n; i++) {
            if (i && chat_buf_puts(b, item_sep)) return -1;
            if (indent >= 0 && json_newline(b, indent, depth + 1)) return -1;
            if (chat_to_json(b, v.l->items[i], indent, item_sep, key_sep, sort_keys, depth + 1, msg,
                             msg_size))
                return -1;
        }
        if (indent >= 0 && v.l->n && json_newline(b, indent, depth)) return -1;
        return chat_buf_puts(b, "]");
    case CV_DICT: {
        size_t n = v.d->n;
        const cv **keys = malloc((n ? n : 1) * sizeof *keys);
        if (!keys) return -1;
        for (size_t i = 0; i < n; i++) {
            keys[i] = &v.d->keys[i];
            if (keys[i]->t != CV_STR) {
                snprintf(msg, msg_size, "tojson: dict keys must be strings, not %s",
                         chat_type_name(v.d->keys[i]));
                free(keys);
                return -1;
            }
        }
        if (sort_keys) qsort(keys, n, sizeof *keys, json_key_cmp);
        int rc = chat_buf_puts(b, "{");
        for (size_t i = 0; i < n && !rc; i++) {
            const cv *val = &v.d->vals[keys[i] - v.d->keys];
            if (i) rc = chat_buf_puts(b, item_sep);
            if (!rc && indent >= 0) rc = json_newline(b, indent, depth + 1);
            if (!rc) rc = json_str(b, keys[i]->s->p, keys[i]->s->len);
            if (!rc) rc = chat_buf_puts(b, key_sep);
            if (!rc)
                rc = chat_to_json(b, *val, indent, item_sep, key_sep, sort_keys, depth + 1, msg,
                                  msg_size);
        }
        if (!rc && indent >= 0 && n) rc = json_newline(b, indent, depth);
        if (!rc) rc = chat_buf_puts(b, "}");
        free(keys);
        return rc;
    }
    default:
        snprintf(msg, msg_size, "tojson: object of type %s is not JSON serializable",
                 chat_type_name(v));
        return -1;
    }
}

int chat_from_json(chat_arena *a, const json_t *j, cv *out) {
    json_t *m = (json_t *)j; /* jansson's iterators take non-const; nothing is changed */
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        cv_dict *d = chat_dict_new(a, json_object_size(m));
        if (!d) return -1;
        const char *key;
        json_t *val;
        json_object_foreach(m, key, val) {
            cv k = {.t = CV_STR}, x;
            cv_str *ks = chat_alloc(a, sizeof *ks);
            if (!ks) return -1;
            ks->p = key;
            ks->len = strlen(key);
            k.s = ks;
            if (chat_from_json(a, val, &x) || chat_dict_set(a, d, k, x)) return -1;
        }
        out->t = CV_DICT;
        out->d = d;
        return 0;
    }
    case JSON_ARRAY: {
        cv_list *l = chat_list_new(a, json_array_size(m));
        if (!l) return -1;
        for (size_t i = 0; i < l->n; i++)
            if (chat_from_json(a, json_array_get(m, i), &l->items[i])) return -1;
        out->t = CV_LIST;
        out->l = l;
        return 0;
    }
    case JSON_STRING: {
        cv_str *s = chat_alloc(a, sizeof *s);
        if (!s) return -1;
        s->p = json_string_value(m);
        s->len = json_string_length(m);
        out->t = CV_STR;
        out->s = s;
        return 0;
    }
    case JSON_INTEGER:
        *out = cv_int((int64_t)json_integer_value(m));
        return 0;
    case JSON_REAL:
        *out = cv_float(json_real_value(m));
        return 0;
    case JSON_TRUE:
        *out = cv_bool(true);
        return 0;
    case JSON_FALSE:
        *out = cv_bool(false);
        return 0;
    default:
        *out = cv_none();
        return 0;
    }
}
