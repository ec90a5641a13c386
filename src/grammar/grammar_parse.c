/* GBNF text -> the compiled element code of grammar_internal.h.
 *
 * Groups and repetitions become generated rules, so that a parse stack only ever holds
 * offsets of whole alternatives: `x*` is `r ::= x r |`, `x+` is `x r` with that r, `x?` is
 * `r ::= x |`, and `x{m,n}` is m copies of x followed by a chain of n - m nested optional
 * rules (each copy is the element's code again, cheap since a group is one call). Right
 * recursion in `r ::= x r |` costs no stack depth: the matcher drops a frame whose
 * continuation is an alternative's end. Left recursion would make the matcher's expansion
 * loop, so it is found here (a rule reaching itself through calls that can match nothing) and
 * refused. Token terminals (`<|end|>`, `<[id]>`) are resolved to ids against the vocabulary
 * while parsing, so a grammar that names a token its model lacks fails here, with its place. */
#include "grammar/grammar_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bound on a repetition count: past it the copies' code would be large for no real use. */
#define GRAM_MAX_REPEAT 10000

typedef struct rule_build {
    char *name;
    size_t def_at; /* offset of the definition, or of the construct it was made for */
    size_t ref_at; /* offset of the first reference (for "undefined rule") */
    bool defined;
    uint32_t chain_start; /* gram_rule.chain_start */
    uint32_t *code;       /* (n_code) alternatives, each ending in GOP_END */
    size_t n_code, cap_code;
    uint32_t *alt; /* (n_alt) local offsets of the alternatives' starts */
    size_t n_alt, cap_alt;
} rule_build;

typedef struct parser {
    const char *s;
    size_t len, pos;
    rule_build *rules;
    size_t n_rules, cap_rules;
    const gram_vocab *v; /* token terminals' ids; NULL: token terminals are refused */
    bool tokens;         /* a token terminal was parsed */
    base_err *err;
    bool failed;
} parser;

/* 1-based line and column (in code points) of byte offset at. */
static void locate(const parser *p, size_t at, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < at && i < p->len; i++) {
        unsigned char c = (unsigned char)p->s[i];
        if (c == '\n') {
            (*line)++;
            *col = 1;
        } else if ((c & 0xC0) != 0x80) {
            (*col)++;
        }
    }
}

static int fail_at(parser *p, size_t at, const char *what) {
    if (p->failed) return -1;
    int line, col;
    locate(p, at, &line, &col);
    p->failed = true;
    return base_fail(p->err, "grammar: line %d, column %d: %s", line, col, what);
}

static void emit(rule_build *r, uint32_t w) {
    if (r->n_code == r->cap_code) {
        r->cap_code = r->cap_code ? 2 * r->cap_code : 16;
        r->code = base_xrealloc(r->code, r->cap_code * sizeof *r->code);
    }
    r->code[r->n_code++] = w;
}

static void start_alt(rule_build *r) {
    if (r->n_alt == r->cap_alt) {
        r->cap_alt = r->cap_alt ? 2 * r->cap_alt : 4;
        r->alt = base_xrealloc(r->alt, r->cap_alt * sizeof *r->alt);
    }
    r->alt[r->n_alt++] = (uint32_t)r->n_code;
}

/* Index of a new rule (pointers into p->rules move when it grows: callers hold indices). */
static uint32_t new_rule(parser *p, const char *name, size_t name_len, size_t at) {
    if (p->n_rules == p->cap_rules) {
        p->cap_rules = p->cap_rules ? 2 * p->cap_rules : 16;
        p->rules = base_xrealloc(p->rules, p->cap_rules * sizeof *p->rules);
    }
    rule_build *r = &p->rules[p->n_rules];
    memset(r, 0, sizeof *r);
    r->name = base_xmalloc(name_len + 1);
    memcpy(r->name, name, name_len);
    r->name[name_len] = 0;
    r->def_at = r->ref_at = at;
    r->chain_start = UINT32_MAX;
    return (uint32_t)p->n_rules++;
}

static uint32_t find_rule(parser *p, const char *name, size_t n, size_t at) {
    for (size_t i = 0; i < p->n_rules; i++)
        if (strlen(p->rules[i].name) == n && !memcmp(p->rules[i].name, name, n)) return (uint32_t)i;
    return new_rule(p, name, n, at);
}

static bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

static char peek(const parser *p) {
    return p->pos < p->len ? p->s[p->pos] : 0;
}

/* Skips blanks and comments, and newlines too when newline_ok (inside a group, after `|` or
 * `::=`): at the top level a newline ends a rule. */
static void skip_space(parser *p, bool newline_ok) {
    while (p->pos < p->len) {
        char c = p->s[p->pos];
        if (c == ' ' || c == '\t') {
            p->pos++;
        } else if (c == '#') {
            while (p->pos < p->len && p->s[p->pos] != '\n') p->pos++;
        } else if (newline_ok && (c == '\n' || c == '\r')) {
            p->pos++;
        } else {
            break;
        }
    }
}

static int hex_digits(parser *p, int n, uint32_t *out) {
    uint32_t v = 0;
    for (int i = 0; i < n; i++) {
        char c = peek(p);
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) return fail_at(p, p->pos, "expected a hexadecimal digit in an escape");
        v = v << 4 | (uint32_t)d;
        p->pos++;
    }
    *out = v;
    return 0;
}

/* One UTF-8 character of the text. */
static int utf8_char(parser *p, uint32_t *out) {
    const unsigned char *s = (const unsigned char *)p->s + p->pos;
    size_t left = p->len - p->pos;
    unsigned char c = s[0];
    int n = c < 0x80             ? 1
            : (c & 0xE0) == 0xC0 ? 2
            : (c & 0xF0) == 0xE0 ? 3
            : (c & 0xF8) == 0xF0 ? 4
                                 : 0;
    if (n == 0 || (size_t)n > left) return fail_at(p, p->pos, "invalid UTF-8");
    uint32_t cp = n == 1 ? c : c & (0x7F >> n);
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return fail_at(p, p->pos, "invalid UTF-8");
        cp = cp << 6 | (s[i] & 0x3F);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return fail_at(p, p->pos, "invalid UTF-8");
    p->pos += (size_t)n;
    *out = cp;
    return 0;
}

/* One character of a literal or class, escapes decoded. */
static int parse_char(parser *p, uint32_t *out) {
    if (p->pos >= p->len) return fail_at(p, p->pos, "unexpected end of input");
    if (peek(p) != '\\') return utf8_char(p, out);
    size_t at = p->pos++;
    char c = peek(p);
    p->pos++;
    switch (c) {
    case 'n':
        *out = '\n';
        return 0;
    case 't':
        *out = '\t';
        return 0;
    case 'r':
        *out = '\r';
        return 0;
    case '"':
    case '\\':
    case '[':
    case ']':
    case '-':
        *out = (uint32_t)c;
        return 0;
    case 'x':
    case 'u':
    case 'U':
        if (hex_digits(p, c == 'x' ? 2 : c == 'u' ? 4 : 8, out)) return -1;
        if (*out > 0x10FFFF) return fail_at(p, at, "escape past U+10FFFF");
        if (*out >= 0xD800 && *out <= 0xDFFF)
            return fail_at(p, at, "escape of a UTF-16 surrogate, which is not a character");
        return 0;
    default:
        return fail_at(p, at,
                       "unknown escape (known: \\n \\t \\r \\\" \\\\ \\[ \\] \\- \\x \\u \\U)");
    }
}

static int parse_alternates(parser *p, uint32_t rule, bool nested);

static int parse_literal(parser *p, uint32_t rule) {
    size_t at = p->pos++;
    while (peek(p) != '"') {
        if (p->pos >= p->len) return fail_at(p, at, "unterminated string literal");
        uint32_t cp;
        if (parse_char(p, &cp)) return -1;
        emit(&p->rules[rule], GOP_CLASS | 1u << 8);
        emit(&p->rules[rule], cp);
        emit(&p->rules[rule], cp);
    }
    p->pos++;
    return 0;
}

static int parse_class(parser *p, uint32_t rule) {
    size_t at = p->pos++;
    bool neg = peek(p) == '^';
    if (neg) p->pos++;
    uint32_t ranges[2 * 256];
    uint32_t n = 0;
    while (peek(p) != ']') {
        if (p->pos >= p->len) return fail_at(p, at, "unterminated character class");
        if (n == 256) return fail_at(p, at, "character class with more than 256 ranges");
        uint32_t lo = 0, hi;
        if (parse_char(p, &lo)) return -1;
        hi = lo;
        if (peek(p) == '-' && p->pos + 1 < p->len && p->s[p->pos + 1] != ']') {
            size_t range_at = p->pos++;
            if (parse_char(p, &hi)) return -1;
            if (hi < lo)
                return fail_at(p, range_at, "character range whose end is before its start");
        }
        ranges[2 * n] = lo;
        ranges[2 * n + 1] = hi;
        n++;
    }
    p->pos++;
    rule_build *r = &p->rules[rule];
    emit(r, (neg ? GOP_NCLASS : GOP_CLASS) | n << 8);
    for (uint32_t i = 0; i < 2 * n; i++) emit(r, ranges[i]);
    return 0;
}

/* A token terminal, `<[id]>` or `<text>` (the token whose text is exactly that, brackets
 * included, up to the first '>'), as llama.cpp writes them. */
static int parse_token(parser *p, uint32_t rule) {
    size_t at = p->pos;
    if (!p->v)
        return fail_at(p, at, "a token terminal needs the model's vocabulary (none was given)");
    const char *end = memchr(p->s + at, '>', p->len - at),
               *nl = memchr(p->s + at, '\n', p->len - at);
    if (!end || (nl && nl < end)) return fail_at(p, at, "unterminated token terminal (no '>')");
    size_t n = (size_t)(end - (p->s + at)) + 1;
    int64_t id = -1;
    if (n > 3 && p->s[at + 1] == '[' && p->s[at + n - 2] == ']') {
        id = 0;
        for (size_t i = at + 2; i < at + n - 2; i++) {
            if (p->s[i] < '0' || p->s[i] > '9' || id > INT32_MAX)
                return fail_at(p, at, "a token id <[id]> must be decimal digits");
            id = id * 10 + (p->s[i] - '0');
        }
        if (id >= gram_vocab_size(p->v)) {
            char msg[160];
            snprintf(msg, sizeof msg, "token id %lld is outside the vocabulary (%d)", (long long)id,
                     gram_vocab_size(p->v));
            return fail_at(p, at, msg);
        }
    } else {
        id = gram_vocab_find(p->v, p->s + at, n);
        if (id < 0) {
            char msg[200];
            snprintf(msg, sizeof msg, "'%.*s' is not the text of one token of the vocabulary",
                     n > 120 ? 120 : (int)n, p->s + at);
            return fail_at(p, at, msg);
        }
    }
    p->pos = at + n;
    p->tokens = true;
    emit(&p->rules[rule], GOP_TOKEN);
    emit(&p->rules[rule], (uint32_t)id);
    return 0;
}

static int parse_count(parser *p, uint32_t *out) {
    if (peek(p) < '0' || peek(p) > '9') return fail_at(p, p->pos, "expected a repetition count");
    uint64_t v = 0;
    while (peek(p) >= '0' && peek(p) <= '9') {
        v = v * 10 + (uint64_t)(peek(p) - '0');
        if (v > GRAM_MAX_REPEAT) return fail_at(p, p->pos, "repetition count above 10000");
        p->pos++;
    }
    *out = (uint32_t)v;
    return 0;
}

/* A generated rule `gen ::= elem gen |` (star) or `gen ::= elem next |` (an optional link). */
static uint32_t gen_optional(parser *p, uint32_t rule, const uint32_t *elem, size_t n, size_t at,
                             bool star, uint32_t next) {
    uint32_t g = new_rule(p, p->rules[rule].name, strlen(p->rules[rule].name), at);
    rule_build *r = &p->rules[g];
    r->defined = true;
    start_alt(r);
    for (size_t i = 0; i < n; i++) emit(r, elem[i]);
    if (star || next != UINT32_MAX) {
        emit(r, GOP_REF);
        emit(r, star ? g : next);
    }
    emit(r, GOP_END);
    start_alt(r);
    emit(r, GOP_END);
    return g;
}

/* Applies the repetition at p->pos to the element code[from, n_code) of rule. */
static int parse_repeat(parser *p, uint32_t rule, size_t from) {
    size_t at = p->pos;
    char c = p->s[p->pos++];
    uint32_t lo = 0, hi = UINT32_MAX;
    if (c == '+') lo = 1;
    if (c == '?') hi = 1;
    if (c == '{') {
        skip_space(p, true);
        if (parse_count(p, &lo)) return -1;
        skip_space(p, true);
        hi = lo;
        if (peek(p) == ',') {
            p->pos++;
            skip_space(p, true);
            hi = UINT32_MAX;
            if (peek(p) != '}' && parse_count(p, &hi)) return -1;
            skip_space(p, true);
        }
        if (peek(p) != '}') return fail_at(p, p->pos, "expected '}' to close a repetition");
        p->pos++;
        if (hi < lo) return fail_at(p, at, "repetition {m,n} with n < m");
    }
    size_t n = p->rules[rule].n_code - from;
    uint32_t *elem = base_xmalloc(n * sizeof *elem);
    memcpy(elem, p->rules[rule].code + from, n * sizeof *elem);
    p->rules[rule].n_code = from;
    for (uint32_t i = 0; i < lo; i++)
        for (size_t k = 0; k < n; k++) emit(&p->rules[rule], elem[k]);
    uint32_t tail = UINT32_MAX;
    if (hi == UINT32_MAX) {
        tail = gen_optional(p, rule, elem, n, at, true, 0);
    } else {
        uint32_t start = (uint32_t)p->n_rules;
        for (uint32_t i = lo; i < hi; i++) {
            tail = gen_optional(p, rule, elem, n, at, false, tail);
            p->rules[tail].chain_start = start;
        }
    }
    free(elem);
    if (tail != UINT32_MAX) {
        emit(&p->rules[rule], GOP_REF);
        emit(&p->rules[rule], tail);
    }
    return 0;
}

static int parse_sequence(parser *p, uint32_t rule, bool nested) {
    size_t last = SIZE_MAX; /* start of the last element, for a repetition */
    for (;;) {
        char c = peek(p);
        size_t here = p->rules[rule].n_code;
        if (c == '"') {
            if (parse_literal(p, rule)) return -1;
        } else if (c == '[') {
            if (parse_class(p, rule)) return -1;
        } else if (c == '.') {
            p->pos++;
            emit(&p->rules[rule], GOP_NCLASS);
        } else if (c == '<') {
            if (parse_token(p, rule)) return -1;
        } else if (c == '!' && p->pos + 1 < p->len && p->s[p->pos + 1] == '<') {
            return fail_at(p, p->pos,
                           "a negated token terminal (!<...>) is not implemented (special tokens "
                           "never match '.' or a class, so `.*` already leaves them out)");
        } else if (c == '(') {
            size_t at = p->pos++;
            uint32_t g = new_rule(p, p->rules[rule].name, strlen(p->rules[rule].name), at);
            p->rules[g].defined = true;
            skip_space(p, true);
            if (parse_alternates(p, g, true)) return -1;
            if (peek(p) != ')') return fail_at(p, at, "unclosed '(' (expected ')')");
            p->pos++;
            emit(&p->rules[rule], GOP_REF);
            emit(&p->rules[rule], g);
        } else if (is_name_char(c)) {
            size_t at = p->pos;
            while (is_name_char(peek(p))) p->pos++;
            uint32_t ref = find_rule(p, p->s + at, p->pos - at, at);
            emit(&p->rules[rule], GOP_REF);
            emit(&p->rules[rule], ref);
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            if (last == SIZE_MAX) return fail_at(p, p->pos, "repetition with no element before it");
            if (parse_repeat(p, rule, last)) return -1;
            here = last; /* as llama.cpp: `x+?` repeats the repetition */
        } else {
            return 0;
        }
        last = here;
        skip_space(p, nested);
    }
}

static int parse_alternates(parser *p, uint32_t rule, bool nested) {
    for (;;) {
        start_alt(&p->rules[rule]);
        if (parse_sequence(p, rule, nested)) return -1;
        emit(&p->rules[rule], GOP_END);
        if (peek(p) != '|') return 0;
        p->pos++;
        skip_space(p, true);
    }
}

static int parse_rules(parser *p) {
    for (;;) {
        skip_space(p, true);
        if (p->pos >= p->len) return 0;
        size_t at = p->pos;
        while (is_name_char(peek(p))) p->pos++;
        if (p->pos == at) return fail_at(p, at, "expected a rule name");
        uint32_t r = find_rule(p, p->s + at, p->pos - at, at);
        if (p->rules[r].defined) {
            char msg[300];
            snprintf(msg, sizeof msg, "rule '%s' is defined twice", p->rules[r].name);
            return fail_at(p, at, msg);
        }
        p->rules[r].defined = true;
        p->rules[r].def_at = at;
        skip_space(p, false);
        if (p->pos + 3 > p->len || memcmp(p->s + p->pos, "::=", 3))
            return fail_at(p, p->pos, "expected '::=' after the rule name");
        p->pos += 3;
        skip_space(p, true);
        if (parse_alternates(p, r, false)) return -1;
        skip_space(p, false);
        char c = peek(p);
        if (p->pos < p->len && c != '\n' && c != '\r') {
            if (c == ')') return fail_at(p, p->pos, "')' without a matching '('");
            return fail_at(p, p->pos,
                           "unexpected character (expected an element, '|' or a newline)");
        }
    }
}

/* Fewest code points each rule matches, by iteration to the fixpoint (saturating sums). In
 * creation order: an {m,n} chain's innermost link is made first, so one pass settles it. */
static void compute_min_len(gram_grammar *g) {
    for (size_t i = 0; i < g->n_rules; i++) g->rules[i].min_len = UINT32_MAX;
    for (bool changed = true; changed;) {
        changed = false;
        for (size_t i = 0; i < g->n_rules; i++) {
            gram_rule *r = &g->rules[i];
            for (uint32_t a = 0; a < r->n_alts; a++) {
                uint64_t sum = 0;
                for (uint32_t at = g->alts[r->first_alt + a]; GRAM_OP(g->code[at]) != GOP_END;
                     at += gram_elem_size(g->code, at)) {
                    sum += GRAM_OP(g->code[at]) == GOP_REF ? g->rules[g->code[at + 1]].min_len : 1;
                    if (sum >= UINT32_MAX) break;
                }
                if (sum < r->min_len) {
                    r->min_len = (uint32_t)sum;
                    changed = true;
                }
            }
        }
    }
}

/* Depth-first search over "calls before consuming anything": reaching a rule on the current
 * path is left recursion. color: 0 unseen, 1 on the path, 2 done. */
static int left_dfs(const gram_grammar *g, uint32_t r, uint8_t *color, uint32_t *via) {
    color[r] = 1;
    const gram_rule *rule = &g->rules[r];
    for (uint32_t a = 0; a < rule->n_alts; a++) {
        for (uint32_t at = g->alts[rule->first_alt + a]; GRAM_OP(g->code[at]) != GOP_END;
             at += gram_elem_size(g->code, at)) {
            if (GRAM_OP(g->code[at]) != GOP_REF) break;
            uint32_t t = g->code[at + 1];
            if (color[t] == 1) {
                *via = t;
                return -1;
            }
            if (color[t] == 0 && left_dfs(g, t, color, via)) return -1;
            if (g->rules[t].min_len != 0) break;
        }
    }
    color[r] = 2;
    return 0;
}

static int check_left_recursion(parser *p, const gram_grammar *g) {
    uint8_t *color = base_xcalloc(g->n_rules, 1);
    uint32_t via = 0;
    int rc = 0;
    for (uint32_t r = 0; r < g->n_rules && !rc; r++)
        if (color[r] == 0) rc = left_dfs(g, r, color, &via);
    free(color);
    if (!rc) return 0;
    char msg[400];
    snprintf(msg, sizeof msg,
             "left recursion: rule '%s' can reach itself without consuming input (GBNF needs "
             "right recursion, or a repetition of something that cannot match empty)",
             g->rules[via].name);
    return fail_at(p, p->rules[via].def_at, msg);
}

static int finish(parser *p, gram_grammar **out) {
    for (size_t i = 0; i < p->n_rules; i++) {
        if (!p->rules[i].defined) {
            char msg[300];
            snprintf(msg, sizeof msg, "undefined rule '%s'", p->rules[i].name);
            return fail_at(p, p->rules[i].ref_at, msg);
        }
    }
    uint32_t root = UINT32_MAX;
    for (size_t i = 0; i < p->n_rules && root == UINT32_MAX; i++)
        if (!strcmp(p->rules[i].name, "root")) root = (uint32_t)i;
    if (root == UINT32_MAX) {
        p->failed = true;
        return base_fail(p->err, "grammar: no 'root' rule (the start rule)");
    }
    gram_grammar *g = base_xcalloc(1, sizeof *g);
    g->n_rules = p->n_rules;
    g->rules = base_xcalloc(g->n_rules, sizeof *g->rules);
    for (size_t i = 0; i < p->n_rules; i++) {
        g->n_code += p->rules[i].n_code;
        g->n_alts += p->rules[i].n_alt;
    }
    g->code = base_xmalloc((g->n_code ? g->n_code : 1) * sizeof *g->code);
    g->alts = base_xmalloc((g->n_alts ? g->n_alts : 1) * sizeof *g->alts);
    size_t nc = 0, na = 0;
    for (size_t i = 0; i < p->n_rules; i++) {
        rule_build *b = &p->rules[i];
        gram_rule *r = &g->rules[i];
        r->name = base_xstrdup(b->name);
        locate(p, b->def_at, &r->line, &r->col);
        r->first_alt = (uint32_t)na;
        r->chain_start = b->chain_start;
        r->n_alts = (uint32_t)b->n_alt;
        for (size_t a = 0; a < b->n_alt; a++) g->alts[na++] = (uint32_t)nc + b->alt[a];
        memcpy(g->code + nc, b->code, b->n_code * sizeof *b->code);
        nc += b->n_code;
    }
    g->root = root;
    g->tokens = p->tokens;
    compute_min_len(g);
    if (check_left_recursion(p, g)) {
        gram_free(g);
        return -1;
    }
    *out = g;
    return 0;
}

int gram_parse(const char *text, size_t len, gram_grammar **out, base_err *err) {
    return gram_parse_vocab(text, len, NULL, out, err);
}

int gram_parse_vocab(const char *text, size_t len, const gram_vocab *v, gram_grammar **out,
                     base_err *err) {
    parser p = {.s = text, .len = len, .v = v, .err = err};
    *out = NULL;
    int rc = parse_rules(&p);
    if (!rc) rc = finish(&p, out);
    for (size_t i = 0; i < p.n_rules; i++) {
        free(p.rules[i].name);
        free(p.rules[i].code);
        free(p.rules[i].alt);
    }
    free(p.rules);
    return rc;
}

void gram_free(gram_grammar *g) {
    if (!g) return;
    for (size_t i = 0; i < g->n_rules; i++) free(g->rules[i].name);
    free(g->rules);
    free(g->code);
    free(g->alts);
    free(g);
}
