/* The parser: tokens to a tree, with Jinja's grammar and operator precedence (loosest first:
 * `x if c else y`, or, and, not, comparisons and `in`, + -, ~, * / // %, **, unary - +, then
 * filters `|` and tests `is`, then postfix . [] ()). Unknown filters and tests are errors
 * here, as Jinja reports them when compiling. */
#include "chat/chat_internal.h"

#include <stdlib.h>
#include <string.h>

#define PARSE_MAX_DEPTH 200
/* Blocks ({% if %}, {% for %}, ...) inside one another. The parser and the renderer recurse
 * once per level (about 1.5 KiB of stack a level under AddressSanitizer), so a template from
 * a downloaded tokenizer_config.json must not choose the depth. Real templates nest fewer
 * than 10; 100 also leaves most of CHAT_MAX_DEPTH to the expressions inside, so a template
 * that parses is not refused for its nesting when it renders. */
#define PARSE_MAX_BLOCKS 100

typedef struct parser {
    chat_arena *a;
    const ctok *t; /* (n) */
    int n, i;
    int depth;      /* expression nesting */
    int blocks;     /* blocks around the current statement, bounded by PARSE_MAX_BLOCKS */
    int tag;        /* index of the '{%' of the last statement begun: a body's opening tag */
    int loop_depth; /* for loops around the current statement, for break/continue */
    base_err *err;
} parser;

static const ctok *cur(const parser *P) {
    return &P->t[P->i];
}

static int fail_at(parser *P, const ctok *k, const char *fmt, const char *arg) {
    char what[256];
    snprintf(what, sizeof what, fmt, arg ? arg : "");
    return base_fail(P->err, "template line %d, column %d: %s", k->line, k->col, what);
}

static const char *tok_desc(const ctok *k) {
    switch (k->t) {
    case T_EOF:
        return "end of template";
    case T_TEXT:
        return "text";
    case T_VAR_BEGIN:
        return "'{{'";
    case T_VAR_END:
        return "'}}'";
    case T_BLOCK_BEGIN:
        return "'{%'";
    case T_BLOCK_END:
        return "'%}'";
    case T_NAME:
        return k->s;
    case T_STRING:
        return "a string";
    case T_INT:
    case T_FLOAT:
        return "a number";
    default:
        return "an operator";
    }
}

static int unexpected(parser *P, const char *expected) {
    const ctok *k = cur(P);
    char what[200];
    snprintf(what, sizeof what, "expected %s, got %s", expected, tok_desc(k));
    return fail_at(P, k, "%s", what);
}

static bool is_op(const parser *P, int op) {
    return cur(P)->t == T_OP && cur(P)->op == op;
}

static bool is_name(const parser *P, const char *name) {
    return cur(P)->t == T_NAME && strcmp(cur(P)->s, name) == 0;
}

static bool skip_op(parser *P, int op) {
    if (!is_op(P, op)) return false;
    P->i++;
    return true;
}

static bool skip_name(parser *P, const char *name) {
    if (!is_name(P, name)) return false;
    P->i++;
    return true;
}

static int expect_op(parser *P, int op) {
    if (skip_op(P, op)) return 0;
    char e[8] = {'\'', (char)op, '\'', 0};
    return unexpected(P, e);
}

static cnode *node(parser *P, cnode_kind kind, int line) {
    cnode *n = chat_alloc(P->a, sizeof *n);
    if (!n) {
        base_fail(P->err, "template line %d: template too large", line);
        return NULL;
    }
    n->kind = kind;
    n->line = line;
    return n;
}

/* A growable array of pointers, copied into the arena when done. */
typedef struct vec {
    void **p;
    int n, cap;
} vec;

static void vec_push(vec *v, void *x) {
    if (v->n == v->cap) {
        v->cap = v->cap ? v->cap * 2 : 8;
        v->p = base_xrealloc(v->p, (size_t)v->cap * sizeof(void *));
    }
    v->p[v->n++] = x;
}

static void **vec_done(parser *P, vec *v, int *n) {
    void **out = chat_alloc(P->a, (size_t)(v->n ? v->n : 1) * sizeof(void *));
    if (out && v->n) memcpy(out, v->p, (size_t)v->n * sizeof(void *));
    *n = v->n;
    free(v->p);
    v->p = NULL;
    if (!out) base_fail(P->err, "template too large");
    return out;
}

static cnode *parse_expr(parser *P);
static cnode *parse_or(parser *P);
static cnode *parse_unary(parser *P, bool with_filter);
static cnode *parse_primary(parser *P);
static cnode *parse_postfix(parser *P, cnode *n);

/* Parses "(a, b=c, ...)" into n->args / n->kw; the '(' is current. */
static int parse_call_args(parser *P, cnode *n) {
    if (expect_op(P, '(')) return -1;
    vec args = {0}, kw = {0};
    bool seen_kw = false;
    while (!is_op(P, ')')) {
        if (args.n && expect_op(P, ',')) goto fail;
        if (is_op(P, ')')) break;
        const char *name = NULL;
        if (cur(P)->t == T_NAME && P->t[P->i + 1].t == T_OP && P->t[P->i + 1].op == '=') {
            name = cur(P)->s;
            P->i += 2;
            seen_kw = true;
        } else if (seen_kw) {
            fail_at(P, cur(P), "positional argument after keyword argument", NULL);
            goto fail;
        }
        cnode *x = parse_expr(P);
        if (!x) goto fail;
        vec_push(&args, x);
        vec_push(&kw, (void *)name);
    }
    P->i++;
    int nk;
    n->args = (cnode **)vec_done(P, &args, &n->n_args);
    n->kw = (const char **)vec_done(P, &kw, &nk);
    return n->args && n->kw ? 0 : -1;
fail:
    free(args.p);
    free(kw.p);
    return -1;
}

/* Comma-separated expressions; a tuple when there is a comma (or none inside parens). */
static cnode *parse_tuple(parser *P, bool in_parens, bool with_condexpr) {
    int line = cur(P)->line;
    vec items = {0};
    bool comma = false;
    for (;;) {
        if (in_parens && is_op(P, ')')) break;
        cnode *x = with_condexpr ? parse_expr(P) : parse_or(P);
        if (!x) {
            free(items.p);
            return NULL;
        }
        vec_push(&items, x);
        if (!skip_op(P, ',')) break;
        comma = true;
        if (!in_parens && (cur(P)->t == T_BLOCK_END || cur(P)->t == T_VAR_END)) break;
    }
    if (items.n == 1 && !comma) {
        cnode *x = items.p[0];
        free(items.p);
        return x;
    }
    cnode *t = node(P, N_TUPLE, line);
    if (!t) {
        free(items.p);
        return NULL;
    }
    t->args = (cnode **)vec_done(P, &items, &t->n_args);
    return t->args ? t : NULL;
}

static cnode *parse_list_or_dict(parser *P, bool dict) {
    int line = cur(P)->line;
    P->i++;
    int close = dict ? '}' : ']';
    vec items = {0};
    while (!is_op(P, close)) {
        if (items.n && expect_op(P, ',')) goto fail;
        if (is_op(P, close)) break;
        cnode *x = parse_expr(P);
        if (!x) goto fail;
        vec_push(&items, x);
        if (dict) {
            if (expect_op(P, ':')) goto fail;
            cnode *v = parse_expr(P);
            if (!v) goto fail;
            vec_push(&items, v);
        }
    }
    P->i++;
    cnode *n = node(P, dict ? N_DICT : N_LIST, line);
    if (!n) goto fail;
    n->args = (cnode **)vec_done(P, &items, &n->n_args);
    return n->args ? n : NULL;
fail:
    free(items.p);
    return NULL;
}

static cnode *parse_primary(parser *P) {
    const ctok *k = cur(P);
    cnode *n;
    switch (k->t) {
    case T_NAME: {
        static const char *const consts[] = {"true", "True", "false", "False", "none", "None"};
        for (int c = 0; c < 6; c++) {
            if (strcmp(k->s, consts[c]) != 0) continue;
            if (!(n = node(P, N_CONST, k->line))) return NULL;
            n->val = c < 4 ? cv_bool(c < 2) : cv_none();
            P->i++;
            return n;
        }
        if (!(n = node(P, N_NAME, k->line))) return NULL;
        n->name = k->s;
        P->i++;
        return n;
    }
    case T_STRING: {
        if (!(n = node(P, N_CONST, k->line))) return NULL;
        chat_buf b = {0};
        while (cur(P)->t == T_STRING) {
            chat_buf_put(&b, cur(P)->s, cur(P)->len);
            P->i++;
        }
        n->val = chat_str_value(P->a, b.p ? b.p : "", b.len);
        free(b.p);
        if (n->val.t != CV_STR) return base_fail(P->err, "template too large"), NULL;
        return n;
    }
    case T_INT:
    case T_FLOAT:
        if (!(n = node(P, N_CONST, k->line))) return NULL;
        n->val = k->t == T_INT ? cv_int(k->i) : cv_float(k->f);
        P->i++;
        return n;
    case T_OP:
        if (k->op == '(') {
            P->i++;
            n = parse_tuple(P, true, true);
            if (!n || expect_op(P, ')')) return NULL;
            return n;
        }
        if (k->op == '[') return parse_list_or_dict(P, false);
        if (k->op == '{') return parse_list_or_dict(P, true);
        break;
    default:
        break;
    }
    unexpected(P, "an expression");
    return NULL;
}

static cnode *parse_subscript(parser *P, cnode *obj, int line) {
    cnode *parts[3] = {0};
    int np = 0;
    bool slice = false;
    for (;;) {
        if (!is_op(P, ':') && !is_op(P, ']')) {
            if (!(parts[np] = parse_expr(P))) return NULL;
        }
        if (is_op(P, ':')) {
            slice = true;
            if (++np > 2) return unexpected(P, "']'"), NULL;
            P->i++;
            continue;
        }
        break;
    }
    if (expect_op(P, ']')) return NULL;
    if (!slice && !parts[0]) return unexpected(P, "a subscript"), NULL;
    cnode *n = node(P, slice ? N_SLICE : N_ITEM, line);
    if (!n) return NULL;
    n->a = obj;
    n->b = parts[0];
    n->c = parts[1];
    n->d = parts[2];
    return n;
}

/* A call of callee at the `(` of its arguments. */
static cnode *call_node(parser *P, cnode *callee, int line) {
    cnode *m = node(P, N_CALL, line);
    if (!m) return NULL;
    m->a = callee;
    return parse_call_args(P, m) ? NULL : m;
}

static cnode *parse_postfix(parser *P, cnode *n) {
    for (;;) {
        int line = cur(P)->line;
        if (skip_op(P, '.')) {
            const ctok *k = cur(P);
            cnode *m;
            if (k->t == T_NAME) {
                if (!(m = node(P, N_ATTR, line))) return NULL;
                m->name = k->s;
            } else if (k->t == T_INT) {
                cnode *idx = node(P, N_CONST, line);
                if (!idx || !(m = node(P, N_ITEM, line))) return NULL;
                idx->val = cv_int(k->i);
                m->b = idx;
            } else {
                unexpected(P, "an attribute name");
                return NULL;
            }
            P->i++;
            m->a = n;
            n = m;
        } else if (skip_op(P, '[')) {
            if (!(n = parse_subscript(P, n, line))) return NULL;
        } else if (is_op(P, '(')) {
            if (!(n = call_node(P, n, line))) return NULL;
        } else {
            return n;
        }
    }
}

/* A filter or test node applied to a, named by the current token and found by lookup; expected
 * and unknown (a format of the name) word the errors. */
static cnode *named_node(parser *P, cnode_kind kind, int line, const char *expected,
                         const char *unknown, int (*lookup)(const char *), cnode *a) {
    const ctok *k = cur(P);
    if (k->t != T_NAME) return unexpected(P, expected), NULL;
    int id = lookup(k->s);
    if (id < 0) return fail_at(P, k, unknown, k->s), NULL;
    P->i++;
    cnode *m = node(P, kind, line);
    if (!m) return NULL;
    m->id = id;
    m->name = k->s;
    m->a = a;
    return m;
}

/* `x | name(args)` and `x is [not] name arg` chains. */
static cnode *parse_filter_expr(parser *P, cnode *n) {
    for (;;) {
        int line = cur(P)->line;
        if (skip_op(P, '|')) {
            cnode *m = named_node(P, N_FILTER, line, "a filter name", "no filter named '%s'",
                                  chat_filter_id, n);
            if (!m) return NULL;
            if (is_op(P, '(') && parse_call_args(P, m)) return NULL;
            n = m;
        } else if (skip_name(P, "is")) {
            bool negate = skip_name(P, "not");
            cnode *m =
                named_node(P, N_TEST, line, "a test name", "no test named '%s'", chat_test_id, n);
            if (!m) return NULL;
            m->negate = negate;
            const ctok *nx = cur(P);
            if (is_op(P, '(')) {
                if (parse_call_args(P, m)) return NULL;
            } else if ((nx->t == T_NAME || nx->t == T_STRING || nx->t == T_INT ||
                        nx->t == T_FLOAT || is_op(P, '[') || is_op(P, '{')) &&
                       !is_name(P, "else") && !is_name(P, "or") && !is_name(P, "and")) {
                cnode *arg = parse_primary(P);
                if (!arg || !(arg = parse_postfix(P, arg))) return NULL;
                m->args = chat_alloc(P->a, sizeof(cnode *));
                m->kw = chat_alloc(P->a, sizeof(char *));
                if (!m->args || !m->kw) return base_fail(P->err, "template too large"), NULL;
                m->args[0] = arg;
                m->n_args = 1;
            }
            n = m;
        } else if (is_op(P, '(')) {
            if (!(n = call_node(P, n, line))) return NULL;
        } else {
            return n;
        }
    }
}

static cnode *parse_unary(parser *P, bool with_filter) {
    int line = cur(P)->line;
    if (++P->depth > PARSE_MAX_DEPTH) {
        fail_at(P, cur(P), "expression nested too deeply", NULL);
        return NULL;
    }
    cnode *n;
    if (is_op(P, '-') || is_op(P, '+')) {
        bool neg = cur(P)->op == '-';
        P->i++;
        cnode *x = parse_unary(P, false);
        if (!x || !(n = node(P, neg ? N_NEG : N_POS, line))) return NULL;
        n->a = x;
    } else {
        n = parse_primary(P);
    }
    if (n) n = parse_postfix(P, n);
    if (n && with_filter) n = parse_filter_expr(P, n);
    P->depth--;
    return n;
}

static cnode *binary(parser *P, int op, cnode *a, cnode *b, int line) {
    cnode *n = node(P, N_BIN, line);
    if (!n) return NULL;
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static cnode *parse_pow(parser *P) {
    cnode *n = parse_unary(P, true);
    while (n && is_op(P, OP_POW)) {
        int line = cur(P)->line;
        P->i++;
        cnode *r = parse_unary(P, true);
        n = r ? binary(P, OP_POW, n, r, line) : NULL;
    }
    return n;
}

static cnode *parse_math2(parser *P) {
    cnode *n = parse_pow(P);
    for (;;) {
        if (!n) return NULL;
        int op = is_op(P, '*')           ? OP_MUL
                 : is_op(P, '/')         ? OP_DIV
                 : is_op(P, OP_FLOORDIV) ? OP_FLOORDIV
                 : is_op(P, '%')         ? OP_MOD
                                         : 0;
        if (!op) return n;
        int line = cur(P)->line;
        P->i++;
        cnode *r = parse_pow(P);
        n = r ? binary(P, op, n, r, line) : NULL;
    }
}

static cnode *parse_concat(parser *P) {
    cnode *n = parse_math2(P);
    while (n && is_op(P, '~')) {
        int line = cur(P)->line;
        P->i++;
        cnode *r = parse_math2(P);
        n = r ? binary(P, OP_CONCAT, n, r, line) : NULL;
    }
    return n;
}

static cnode *parse_math1(parser *P) {
    cnode *n = parse_concat(P);
    while (n && (is_op(P, '+') || is_op(P, '-'))) {
        int line = cur(P)->line;
        int op = cur(P)->op == '+' ? OP_ADD : OP_SUB;
        P->i++;
        cnode *r = parse_concat(P);
        n = r ? binary(P, op, n, r, line) : NULL;
    }
    return n;
}

static int compare_op(parser *P) {
    const ctok *k = cur(P);
    if (k->t == T_OP) {
        switch (k->op) {
        case OP_EQ:
            return OP_EQ;
        case OP_NE:
            return OP_NE;
        case OP_LE:
            return OP_LE;
        case OP_GE:
            return OP_GE;
        case '<':
            return OP_LT;
        case '>':
            return OP_GT;
        default:
            return 0;
        }
    }
    if (is_name(P, "in")) return OP_IN;
    if (is_name(P, "not") && P->t[P->i + 1].t == T_NAME && strcmp(P->t[P->i + 1].s, "in") == 0)
        return OP_NOTIN;
    return 0;
}

static cnode *parse_compare(parser *P) {
    int line = cur(P)->line;
    cnode *first = parse_math1(P);
    if (!first || !compare_op(P)) return first;
    vec args = {0}, ops = {0};
    vec_push(&args, first);
    int op;
    while ((op = compare_op(P))) {
        P->i += op == OP_NOTIN ? 2 : 1;
        cnode *r = parse_math1(P);
        if (!r) {
            free(args.p);
            free(ops.p);
            return NULL;
        }
        vec_push(&args, r);
        vec_push(&ops, (void *)(intptr_t)op);
    }
    cnode *n = node(P, N_CMP, line);
    int nops;
    void **raw_ops = n ? vec_done(P, &ops, &nops) : NULL;
    if (!n || !raw_ops) {
        free(args.p);
        free(ops.p);
        return NULL;
    }
    n->ops = chat_alloc(P->a, (size_t)nops * sizeof(int));
    if (!n->ops) {
        free(args.p);
        return base_fail(P->err, "template too large"), NULL;
    }
    for (int k = 0; k < nops; k++) n->ops[k] = (int)(intptr_t)raw_ops[k];
    n->args = (cnode **)vec_done(P, &args, &n->n_args);
    return n->args ? n : NULL;
}

static cnode *parse_not(parser *P) {
    if (is_name(P, "not")) {
        int line = cur(P)->line;
        P->i++;
        if (++P->depth > PARSE_MAX_DEPTH) {
            fail_at(P, cur(P), "expression nested too deeply", NULL);
            return NULL;
        }
        cnode *x = parse_not(P);
        P->depth--;
        cnode *n = x ? node(P, N_NOT, line) : NULL;
        if (n) n->a = x;
        return n;
    }
    return parse_compare(P);
}

/* A left-associative chain of `word`-joined operands parsed by `operand`: a word b word c. */
static cnode *parse_word_chain(parser *P, cnode *(*operand)(parser *), const char *word,
                               cnode_kind kind) {
    cnode *n = operand(P);
    while (n && is_name(P, word)) {
        int line = cur(P)->line;
        P->i++;
        cnode *r = operand(P);
        cnode *m = r ? node(P, kind, line) : NULL;
        if (m) {
            m->a = n;
            m->b = r;
        }
        n = m;
    }
    return n;
}

static cnode *parse_and(parser *P) {
    return parse_word_chain(P, parse_not, "and", N_AND);
}

static cnode *parse_or(parser *P) {
    return parse_word_chain(P, parse_and, "or", N_OR);
}

static cnode *parse_expr(parser *P) {
    if (++P->depth > PARSE_MAX_DEPTH) {
        fail_at(P, cur(P), "expression nested too deeply", NULL);
        return NULL;
    }
    cnode *n = parse_or(P);
    while (n && is_name(P, "if")) {
        int line = cur(P)->line;
        P->i++;
        cnode *cond = parse_or(P), *other = NULL;
        if (!cond) return NULL;
        if (skip_name(P, "else") && !(other = parse_expr(P))) return NULL;
        cnode *m = node(P, N_COND, line);
        if (!m) return NULL;
        m->a = cond;
        m->b = n;
        m->c = other;
        n = m;
    }
    P->depth--;
    return n;
}

/* ---- statements ---- */

static int parse_body(parser *P, const char *const *ends, cnode ***body, int *n_body,
                      const char **end_found);

static int expect_block_end(parser *P) {
    if (cur(P)->t == T_BLOCK_END) {
        P->i++;
        return 0;
    }
    return unexpected(P, "'%}'");
}

/* Loop/set targets: name (, name)*. */
static int parse_targets(parser *P, cnode *n) {
    vec names = {0};
    do {
        if (cur(P)->t != T_NAME) {
            free(names.p);
            return unexpected(P, "a variable name");
        }
        vec_push(&names, (void *)cur(P)->s);
        P->i++;
    } while (skip_op(P, ','));
    n->names = (const char **)vec_done(P, &names, &n->n_names);
    return n->names ? 0 : -1;
}

static cnode *parse_for(parser *P, int line) {
    cnode *n = node(P, S_FOR, line);
    if (!n || parse_targets(P, n)) return NULL;
    if (!skip_name(P, "in")) return unexpected(P, "'in'"), NULL;
    if (!(n->a = parse_tuple(P, false, false))) return NULL;
    if (skip_name(P, "if") && !(n->b = parse_expr(P))) return NULL;
    if (is_name(P, "recursive"))
        return fail_at(P, cur(P), "recursive loops are not supported", NULL), NULL;
    if (expect_block_end(P)) return NULL;
    static const char *const ends[] = {"endfor", "else", NULL};
    const char *end;
    P->loop_depth++;
    int rc = parse_body(P, ends, &n->body, &n->n_body, &end);
    P->loop_depth--;
    if (rc) return NULL;
    if (strcmp(end, "else") == 0) {
        static const char *const ends2[] = {"endfor", NULL};
        if (parse_body(P, ends2, &n->alt, &n->n_alt, &end)) return NULL;
    }
    return n;
}

/* if / elif / else: each elif is an S_IF alone in the alt of the one before. The chain is
 * built in a loop, since a long elif chain is no nesting and must not cost stack. */
static cnode *parse_if(parser *P, int line) {
    static const char *const ends[] = {"endif", "elif", "else", NULL};
    static const char *const ends2[] = {"endif", NULL};
    cnode *first = NULL, *prev = NULL;
    for (;;) {
        cnode *n = node(P, S_IF, line);
        if (!n || !(n->a = parse_expr(P)) || expect_block_end(P)) return NULL;
        if (prev) {
            prev->alt = chat_alloc(P->a, sizeof(cnode *));
            if (!prev->alt) return base_fail(P->err, "template too large"), NULL;
            prev->alt[0] = n;
            prev->n_alt = 1;
        } else {
            first = n;
        }
        prev = n;
        const char *end;
        if (parse_body(P, ends, &n->body, &n->n_body, &end)) return NULL;
        if (strcmp(end, "else") == 0 && parse_body(P, ends2, &n->alt, &n->n_alt, &end)) return NULL;
        if (strcmp(end, "elif") != 0) return first;
        line = P->t[P->i - 1].line;
    }
}

static cnode *parse_set(parser *P, int line) {
    cnode *n = node(P, S_SET, line);
    if (!n) return NULL;
    if (cur(P)->t == T_NAME && P->t[P->i + 1].t == T_OP && P->t[P->i + 1].op == '.') {
        cnode *obj = node(P, N_NAME, line);
        if (!obj) return NULL;
        obj->name = cur(P)->s;
        P->i += 2;
        if (cur(P)->t != T_NAME) return unexpected(P, "an attribute name"), NULL;
        n->a = obj;
        n->name = cur(P)->s;
        P->i++;
    } else if (parse_targets(P, n)) {
        return NULL;
    }
    if (skip_op(P, '=')) {
        if (!(n->b = parse_tuple(P, false, true)) || expect_block_end(P)) return NULL;
        return n;
    }
    if (n->a || n->n_names != 1) return unexpected(P, "'='"), NULL;
    if (expect_block_end(P)) return NULL;
    static const char *const ends[] = {"endset", NULL};
    const char *end;
    if (parse_body(P, ends, &n->body, &n->n_body, &end)) return NULL;
    return n;
}

static cnode *parse_macro(parser *P, int line) {
    cnode *n = node(P, S_MACRO, line);
    if (!n) return NULL;
    if (cur(P)->t != T_NAME) return unexpected(P, "a macro name"), NULL;
    n->name = cur(P)->s;
    P->i++;
    if (expect_op(P, '(')) return NULL;
    vec names = {0}, defs = {0};
    while (!is_op(P, ')')) {
        if (names.n && expect_op(P, ',')) goto fail;
        if (is_op(P, ')')) break;
        if (cur(P)->t != T_NAME) {
            unexpected(P, "a parameter name");
            goto fail;
        }
        vec_push(&names, (void *)cur(P)->s);
        P->i++;
        cnode *def = NULL;
        if (skip_op(P, '=') && !(def = parse_expr(P))) goto fail;
        vec_push(&defs, def);
    }
    P->i++;
    n->names = (const char **)vec_done(P, &names, &n->n_names);
    n->args = (cnode **)vec_done(P, &defs, &n->n_args);
    if (!n->names || !n->args || expect_block_end(P)) return NULL;
    static const char *const ends[] = {"endmacro", NULL};
    const char *end;
    int saved = P->loop_depth;
    P->loop_depth = 0;
    int rc = parse_body(P, ends, &n->body, &n->n_body, &end);
    P->loop_depth = saved;
    return rc ? NULL : n;
fail:
    free(names.p);
    free(defs.p);
    return NULL;
}

static cnode *parse_filter_block(parser *P, int line) {
    cnode *n = node(P, S_FILTER, line);
    if (!n) return NULL;
    const ctok *k = cur(P);
    if (k->t != T_NAME) return unexpected(P, "a filter name"), NULL;
    int id = chat_filter_id(k->s);
    if (id < 0) return fail_at(P, k, "no filter named '%s'", k->s), NULL;
    P->i++;
    cnode *f = node(P, N_FILTER, line);
    if (!f) return NULL;
    f->id = id;
    f->name = k->s;
    if (is_op(P, '(') && parse_call_args(P, f)) return NULL;
    n->b = f;
    if (expect_block_end(P)) return NULL;
    static const char *const ends[] = {"endfilter", NULL};
    const char *end;
    return parse_body(P, ends, &n->body, &n->n_body, &end) ? NULL : n;
}

/* One {% ... %} statement; the '{%' is consumed and the tag name is current. */
static cnode *parse_statement(parser *P) {
    const ctok *k = cur(P);
    if (k->t != T_NAME) return unexpected(P, "a statement name"), NULL;
    int line = k->line;
    const char *name = k->s;
    P->i++;
    if (strcmp(name, "for") == 0) return parse_for(P, line);
    if (strcmp(name, "if") == 0) return parse_if(P, line);
    if (strcmp(name, "set") == 0) return parse_set(P, line);
    if (strcmp(name, "macro") == 0) return parse_macro(P, line);
    if (strcmp(name, "filter") == 0) return parse_filter_block(P, line);
    if (strcmp(name, "break") == 0 || strcmp(name, "continue") == 0) {
        if (!P->loop_depth) return fail_at(P, k, "'%s' outside of a for loop", name), NULL;
        cnode *n = node(P, name[0] == 'b' ? S_BREAK : S_CONTINUE, line);
        return n && !expect_block_end(P) ? n : NULL;
    }
    if (strcmp(name, "generation") == 0) {
        cnode *n = node(P, S_BLOCK, line);
        if (!n || expect_block_end(P)) return NULL;
        static const char *const ends[] = {"endgeneration", NULL};
        const char *end;
        return parse_body(P, ends, &n->body, &n->n_body, &end) ? NULL : n;
    }
    return fail_at(P, k, "unknown or unsupported tag '%s'", name), NULL;
}

/* Statements until a {% tag %} named in `ends` (consumed, with its '%}' unless it is
 * "elif", whose condition follows) or the end of the template when ends is NULL. A block's
 * body (ends not NULL) inside PARSE_MAX_BLOCKS others fails at the block's opening tag. */
static int parse_body(parser *P, const char *const *ends, cnode ***body, int *n_body,
                      const char **end_found) {
    if (ends && P->blocks >= PARSE_MAX_BLOCKS) {
        char what[64];
        snprintf(what, sizeof what, "blocks nested deeper than %d", PARSE_MAX_BLOCKS);
        return fail_at(P, &P->t[P->tag], "%s", what);
    }
    int rc = -1;
    if (ends) P->blocks++;
    vec items = {0};
    int open_line = P->i > 0 ? P->t[P->i - 1].line : 1;
    for (;;) {
        const ctok *k = cur(P);
        cnode *n = NULL;
        if (k->t == T_EOF) {
            if (!ends) break;
            char what[80];
            snprintf(what, sizeof what, "missing {%% %s %%} for the block opened on line %d",
                     ends[0], open_line);
            fail_at(P, k, "%s", what);
            goto done;
        }
        if (k->t == T_TEXT) {
            if (!(n = node(P, S_TEXT, k->line))) goto done;
            cv_str *s = chat_alloc(P->a, sizeof *s);
            if (!s) goto done;
            s->p = k->s;
            s->len = k->len;
            n->val.t = CV_STR;
            n->val.s = s;
            P->i++;
        } else if (k->t == T_VAR_BEGIN) {
            P->i++;
            if (!(n = node(P, S_OUT, k->line))) goto done;
            if (!(n->a = parse_tuple(P, false, true))) goto done;
            if (cur(P)->t != T_VAR_END) {
                unexpected(P, "'}}'");
                goto done;
            }
            P->i++;
        } else if (k->t == T_BLOCK_BEGIN) {
            const ctok *nm = &P->t[P->i + 1];
            if (nm->t == T_NAME && ends) {
                bool hit = false;
                for (int e = 0; ends[e]; e++)
                    if (strcmp(nm->s, ends[e]) == 0) hit = true;
                if (hit) {
                    *end_found = nm->s;
                    P->i += 2;
                    if (strcmp(nm->s, "elif") != 0 && expect_block_end(P)) goto done;
                    break;
                }
            }
            if (nm->t == T_NAME && (strncmp(nm->s, "end", 3) == 0 || strcmp(nm->s, "elif") == 0 ||
                                    strcmp(nm->s, "else") == 0)) {
                fail_at(P, nm, "unexpected {%% %s %%}", nm->s);
                goto done;
            }
            P->tag = P->i++;
            if (!(n = parse_statement(P))) goto done;
        } else {
            unexpected(P, "text or a tag");
            goto done;
        }
        vec_push(&items, n);
    }
    *body = (cnode **)vec_done(P, &items, n_body);
    rc = *body ? 0 : -1;
done:
    free(items.p);
    if (ends) P->blocks--;
    return rc;
}

int chat_template_parse(const char *source, chat_template **out, base_err *err) {
    chat_template *t = base_xcalloc(1, sizeof *t);
    ctok *toks = NULL;
    int n = 0;
    if (chat_lex(&t->arena, source, &toks, &n, err)) {
        chat_template_free(t);
        return -1;
    }
    parser P = {.a = &t->arena, .t = toks, .n = n, .err = err};
    const char *end = NULL;
    int rc = parse_body(&P, NULL, &t->body, &t->n_body, &end);
    free(toks);
    if (rc) {
        chat_template_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

void chat_template_free(chat_template *t) {
    if (!t) return;
    chat_arena_free(&t->arena);
    free(t);
}
