/* The template lexer. Whitespace handling follows transformers' environment (trim_blocks and
 * lstrip_blocks on, one trailing newline dropped) in the order @huggingface/jinja applies
 * it: first lstrip_blocks over the whole source, then trim_blocks, then the `-` markers while
 * tokenizing. Each byte of the rewritten source keeps its original line and column so that
 * errors point at the template as written. */
#include "chat/chat_internal.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

typedef struct src_map {
    char *p;   /* (len + 1) */
    int *line; /* (len + 1): original line of each byte */
    int *col;  /* (len + 1) */
    size_t len;
} src_map;

static void map_free(src_map *m) {
    free(m->p);
    free(m->line);
    free(m->col);
}

static void map_alloc(src_map *m, size_t cap) {
    m->p = base_xmalloc(cap + 1);
    m->line = base_xmalloc((cap + 1) * sizeof(int));
    m->col = base_xmalloc((cap + 1) * sizeof(int));
    m->len = 0;
}

static void map_push(src_map *m, char c, int line, int col) {
    m->p[m->len] = c;
    m->line[m->len] = line;
    m->col[m->len] = col;
    m->len++;
}

static void map_end(src_map *m, int line, int col) {
    m->p[m->len] = 0;
    m->line[m->len] = line;
    m->col[m->len] = col;
}

/* lstrip_blocks: spaces and tabs between a line start and "{%" or "{#" go. */
static void pass_lstrip(const src_map *in, src_map *out) {
    map_alloc(out, in->len);
    size_t i = 0;
    while (i < in->len) {
        bool line_start = i == 0 || in->p[i - 1] == '\n' || in->p[i - 1] == '\r';
        if (line_start) {
            size_t j = i;
            while (j < in->len && (in->p[j] == ' ' || in->p[j] == '\t')) j++;
            if (j > i && j + 1 < in->len && in->p[j] == '{' &&
                (in->p[j + 1] == '%' || in->p[j + 1] == '#'))
                i = j;
        }
        map_push(out, in->p[i], in->line[i], in->col[i]);
        i++;
    }
    map_end(out, in->line[in->len], in->col[in->len]);
}

/* trim_blocks: the newline right after "%}" or "#}" goes. */
static void pass_trim(const src_map *in, src_map *out) {
    map_alloc(out, in->len);
    for (size_t i = 0; i < in->len; i++) {
        map_push(out, in->p[i], in->line[i], in->col[i]);
        if (in->p[i] == '}' && i > 0 && (in->p[i - 1] == '%' || in->p[i - 1] == '#') &&
            i + 1 < in->len && in->p[i + 1] == '\n')
            i++;
    }
    map_end(out, in->line[in->len], in->col[in->len]);
}

static void preprocess(const char *source, src_map *out) {
    size_t n = strlen(source);
    if (n > 0 && source[n - 1] == '\n') n--;
    src_map raw;
    map_alloc(&raw, n);
    int line = 1, col = 1;
    for (size_t i = 0; i < n; i++) {
        map_push(&raw, source[i], line, col);
        if (source[i] == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    map_end(&raw, line, col);
    src_map mid;
    pass_lstrip(&raw, &mid);
    map_free(&raw);
    pass_trim(&mid, out);
    map_free(&mid);
}

typedef struct lexer {
    chat_arena *a;
    src_map m;
    size_t pos;
    ctok *toks; /* (cap) */
    int n, cap;
    base_err *err;
} lexer;

static int lex_fail(lexer *L, size_t at, const char *what) {
    return base_fail(L->err, "template line %d, column %d: %s", L->m.line[at], L->m.col[at], what);
}

static ctok *push(lexer *L, ctok_type t, size_t at) {
    if (L->n == L->cap) {
        L->cap = L->cap ? L->cap * 2 : 256;
        L->toks = base_xrealloc(L->toks, (size_t)L->cap * sizeof(ctok));
    }
    ctok *k = &L->toks[L->n++];
    memset(k, 0, sizeof *k);
    k->t = t;
    k->line = L->m.line[at];
    k->col = L->m.col[at];
    return k;
}

static char *arena_strndup(chat_arena *a, const char *s, size_t n) {
    char *p = chat_alloc(a, n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

/* Length of the whitespace run that ends at `end` (start bound `begin`), by code point. */
static size_t trailing_space(const char *s, size_t begin, size_t end) {
    size_t e = end;
    while (e > begin) {
        size_t k = e - 1;
        while (k > begin && ((unsigned char)s[k] & 0xC0) == 0x80 && e - k < 4) k--;
        int32_t cp;
        chat_utf8_next((const unsigned char *)s + k, e - k, &cp);
        if (!chat_is_space(cp)) break;
        e = k;
    }
    return end - e;
}

static size_t leading_space(const char *s, size_t pos, size_t len) {
    size_t p = pos;
    while (p < len) {
        int32_t cp;
        int k = chat_utf8_next((const unsigned char *)s + p, len - p, &cp);
        if (!chat_is_space(cp)) break;
        p += (size_t)k;
    }
    return p - pos;
}

static int emit_text(lexer *L, size_t start, size_t end) {
    if (end <= start) return 0;
    ctok *k = push(L, T_TEXT, start);
    k->s = arena_strndup(L->a, L->m.p + start, end - start);
    k->len = end - start;
    if (!k->s) return lex_fail(L, start, "template too large");
    return 0;
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static void put_utf8(chat_buf *b, uint32_t cp) {
    char u[4];
    int n;
    if (cp < 0x80) {
        u[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        u[0] = (char)(0xC0 | (cp >> 6));
        u[1] = (char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        u[0] = (char)(0xE0 | (cp >> 12));
        u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        u[0] = (char)(0xF0 | (cp >> 18));
        u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[3] = (char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    chat_buf_put(b, u, (size_t)n);
}

/* A quoted string with Python's escapes; an unknown escape keeps its backslash, as Python
 * does. */
static int lex_string(lexer *L) {
    const char *s = L->m.p;
    size_t start = L->pos;
    char q = s[L->pos++];
    chat_buf b = {0};
    for (;;) {
        if (L->pos >= L->m.len) {
            free(b.p);
            return lex_fail(L, start, "unterminated string");
        }
        char c = s[L->pos++];
        if (c == q) break;
        if (c != '\\') {
            chat_buf_put(&b, &c, 1);
            continue;
        }
        if (L->pos >= L->m.len) continue;
        char e = s[L->pos++];
        int nhex = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (nhex) {
            uint32_t cp = 0;
            int k = 0;
            for (; k < nhex && L->pos < L->m.len && hexval(s[L->pos]) >= 0; k++)
                cp = cp * 16 + (uint32_t)hexval(s[L->pos++]);
            if (k != nhex || cp > 0x10FFFF) {
                free(b.p);
                return lex_fail(L, start, "bad \\x, \\u or \\U escape in string");
            }
            put_utf8(&b, cp);
            continue;
        }
        if (e >= '0' && e <= '7') {
            uint32_t cp = (uint32_t)(e - '0');
            for (int k = 0; k < 2 && L->pos < L->m.len && s[L->pos] >= '0' && s[L->pos] <= '7'; k++)
                cp = cp * 8 + (uint32_t)(s[L->pos++] - '0');
            put_utf8(&b, cp);
            continue;
        }
        const char *from = "nrtabfv\\'\"\n";
        const char *to = "\n\r\t\a\b\f\v\\'\"";
        const char *hit = strchr(from, e);
        if (e == '\n') continue;
        if (hit) {
            chat_buf_put(&b, &to[hit - from], 1);
        } else {
            chat_buf_put(&b, "\\", 1);
            chat_buf_put(&b, &e, 1);
        }
    }
    ctok *k = push(L, T_STRING, start);
    k->s = arena_strndup(L->a, b.p ? b.p : "", b.len);
    k->len = b.len;
    free(b.p);
    if (!k->s) return lex_fail(L, start, "template too large");
    return 0;
}

static int lex_number(lexer *L) {
    const char *s = L->m.p;
    size_t start = L->pos;
    char buf[64];
    size_t n = 0;
    bool is_float = false;
    while (L->pos < L->m.len && (isdigit((unsigned char)s[L->pos]) || s[L->pos] == '_')) {
        if (s[L->pos] != '_' && n < sizeof buf - 1) buf[n++] = s[L->pos];
        L->pos++;
    }
    if (L->pos + 1 < L->m.len && s[L->pos] == '.' && isdigit((unsigned char)s[L->pos + 1])) {
        is_float = true;
        if (n < sizeof buf - 1) buf[n++] = s[L->pos];
        L->pos++;
        while (L->pos < L->m.len && (isdigit((unsigned char)s[L->pos]) || s[L->pos] == '_')) {
            if (s[L->pos] != '_' && n < sizeof buf - 1) buf[n++] = s[L->pos];
            L->pos++;
        }
    }
    if (L->pos < L->m.len && (s[L->pos] == 'e' || s[L->pos] == 'E')) {
        size_t p = L->pos + 1;
        if (p < L->m.len && (s[p] == '+' || s[p] == '-')) p++;
        if (p < L->m.len && isdigit((unsigned char)s[p])) {
            is_float = true;
            while (L->pos < p && n < sizeof buf - 1) buf[n++] = s[L->pos++];
            while (L->pos < L->m.len && isdigit((unsigned char)s[L->pos]) && n < sizeof buf - 1)
                buf[n++] = s[L->pos++];
        }
    }
    buf[n] = 0;
    if (n >= sizeof buf - 1) return lex_fail(L, start, "number literal too long");
    ctok *k = push(L, is_float ? T_FLOAT : T_INT, start);
    if (is_float) {
        k->f = strtod(buf, NULL);
    } else {
        char *end;
        unsigned long long v = strtoull(buf, &end, 10);
        if (v > INT64_MAX) return lex_fail(L, start, "integer literal too large");
        k->i = (int64_t)v;
    }
    return 0;
}

static const struct {
    const char *s;
    int op;
} g_ops2[] = {{"**", OP_POW}, {"//", OP_FLOORDIV}, {"==", OP_EQ},
              {"!=", OP_NE},  {"<=", OP_LE},       {">=", OP_GE}};

/* Tokens inside {{ }} or {% %} up to and including the closing marker. */
static int lex_tag(lexer *L, bool block, size_t open_at) {
    const char *s = L->m.p;
    int depth = 0;
    const char *close = block ? "%}" : "}}";
    for (;;) {
        while (L->pos < L->m.len && isspace((unsigned char)s[L->pos])) L->pos++;
        if (L->pos >= L->m.len)
            return lex_fail(L, open_at, block ? "unclosed '{%' tag" : "unclosed '{{' tag");
        size_t at = L->pos;
        bool can_close = block || depth == 0;
        if (can_close && s[at] == '-' && strncmp(s + at + 1, close, 2) == 0) {
            push(L, block ? T_BLOCK_END : T_VAR_END, at);
            L->pos = at + 3;
            L->pos += leading_space(s, L->pos, L->m.len);
            return 0;
        }
        if (can_close && strncmp(s + at, close, 2) == 0) {
            push(L, block ? T_BLOCK_END : T_VAR_END, at);
            L->pos = at + 2;
            return 0;
        }
        char c = s[at];
        if (c == '\'' || c == '"') {
            if (lex_string(L)) return -1;
            continue;
        }
        if (isdigit((unsigned char)c)) {
            if (lex_number(L)) return -1;
            continue;
        }
        if (isalpha((unsigned char)c) || c == '_') {
            size_t e = at;
            while (e < L->m.len && (isalnum((unsigned char)s[e]) || s[e] == '_')) e++;
            ctok *k = push(L, T_NAME, at);
            k->s = arena_strndup(L->a, s + at, e - at);
            k->len = e - at;
            if (!k->s) return lex_fail(L, at, "template too large");
            L->pos = e;
            continue;
        }
        int op = 0;
        for (size_t k = 0; k < sizeof g_ops2 / sizeof g_ops2[0]; k++)
            if (strncmp(s + at, g_ops2[k].s, 2) == 0) op = g_ops2[k].op;
        if (op) {
            push(L, T_OP, at)->op = op;
            L->pos = at + 2;
            continue;
        }
        if (strchr("+-*/%~<>=()[]{},.:|", c) && c) {
            if (c == '{') depth++;
            if (c == '}') depth--;
            push(L, T_OP, at)->op = c;
            L->pos = at + 1;
            continue;
        }
        char msg[64];
        snprintf(msg, sizeof msg, "unexpected character '%c' in tag", c);
        return lex_fail(L, at, msg);
    }
}

/* After "{% raw %}": everything up to "{% endraw %}" is text. */
static int lex_raw(lexer *L, size_t open_at) {
    const char *s = L->m.p;
    size_t p = L->pos;
    for (;;) {
        const char *hit = strstr(s + p, "{%");
        if (!hit) return lex_fail(L, open_at, "missing {% endraw %}");
        size_t at = (size_t)(hit - s), q = at + 2;
        bool strip_before = s[q] == '-';
        if (strip_before) q++;
        while (q < L->m.len && isspace((unsigned char)s[q])) q++;
        if (strncmp(s + q, "endraw", 6) != 0) {
            p = at + 2;
            continue;
        }
        q += 6;
        while (q < L->m.len && isspace((unsigned char)s[q])) q++;
        bool strip_after = s[q] == '-';
        if (strip_after) q++;
        if (strncmp(s + q, "%}", 2) != 0) return lex_fail(L, at, "expected '%}' after endraw");
        size_t end = at;
        if (strip_before) end -= trailing_space(s, L->pos, end);
        if (emit_text(L, L->pos, end)) return -1;
        L->pos = q + 2;
        if (strip_after) L->pos += leading_space(s, L->pos, L->m.len);
        return 0;
    }
}

static int lex_all(lexer *L) {
    const char *s = L->m.p;
    while (L->pos < L->m.len) {
        size_t k = L->pos;
        while (k < L->m.len &&
               !(s[k] == '{' && (s[k + 1] == '{' || s[k + 1] == '%' || s[k + 1] == '#')))
            k++;
        size_t end = k;
        if (k < L->m.len && s[k + 2] == '-') end -= trailing_space(s, L->pos, end);
        if (emit_text(L, L->pos, end)) return -1;
        if (k >= L->m.len) break;
        L->pos = k + 2;
        bool strip = s[L->pos] == '-';
        if (strip) L->pos++;
        if (s[k + 1] == '#') {
            const char *e = strstr(s + L->pos, "#}");
            if (!e) return lex_fail(L, k, "unclosed comment");
            size_t at = (size_t)(e - s);
            L->pos = at + 2;
            if (at > k + 2 && s[at - 1] == '-') L->pos += leading_space(s, L->pos, L->m.len);
            continue;
        }
        bool block = s[k + 1] == '%';
        int first = L->n;
        push(L, block ? T_BLOCK_BEGIN : T_VAR_BEGIN, k);
        if (lex_tag(L, block, k)) return -1;
        if (block && L->n - first == 3 && L->toks[first + 1].t == T_NAME &&
            strcmp(L->toks[first + 1].s, "raw") == 0) {
            L->n = first;
            if (lex_raw(L, k)) return -1;
        }
    }
    push(L, T_EOF, L->m.len);
    return 0;
}

int chat_lex(chat_arena *a, const char *source, ctok **toks, int *n, base_err *err) {
    lexer L = {.a = a, .err = err};
    preprocess(source, &L.m);
    int rc = lex_all(&L);
    map_free(&L.m);
    if (rc) {
        free(L.toks);
        return -1;
    }
    *toks = L.toks;
    *n = L.n;
    return 0;
}
