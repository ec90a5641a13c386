/* The renderer: walks the tree with Python Jinja's semantics. Scopes: the render variables
 * and top-level `set`s live in the root scope; each for loop and each macro call opens one
 * scope (so a `set` inside a loop does not leak out, and namespace() is the way to carry a
 * value out, as in Jinja). Undefined names evaluate to undefined, which prints empty. */
#include "chat/chat_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct chat_scope {
    chat_scope *parent;
    cv_dict *vars;
};

/* Result of running statements: normal, or a loop control on its way up. */
enum { EX_OK = 0, EX_BREAK = 1, EX_CONTINUE = 2, EX_ERR = -1 };

int chat_rfail(chat_render *R, int line, const char *fmt, ...) {
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return base_fail(R->err, "template line %d: %s", line, msg);
}

int chat_oom(chat_render *R, int line) {
    return chat_rfail(R, line, "render needs more than %u MiB of memory",
                      (unsigned)(CHAT_MAX_MEMORY >> 20));
}

bool chat_arg(const chat_args *A, int pos, const char *name, cv *out) {
    int k = 0;
    for (int i = 0; i < A->n; i++) {
        if (A->kw[i]) {
            if (name && strcmp(A->kw[i], name) == 0) {
                *out = A->v[i];
                return true;
            }
        } else if (k++ == pos) {
            *out = A->v[i];
            return true;
        }
    }
    return false;
}

int chat_positional_count(const chat_args *A) {
    int k = 0;
    for (int i = 0; i < A->n; i++) k += A->kw[i] == NULL;
    return k;
}

int chat_stringify(chat_render *R, int line, cv v, cv *out) {
    if (v.t == CV_STR) {
        *out = v;
        return 0;
    }
    chat_buf b = {.limit = CHAT_MAX_OUTPUT};
    if (chat_to_str(&b, v)) {
        free(b.p);
        return chat_rfail(R, line, "string too large");
    }
    *out = chat_str_value(&R->a, b.p ? b.p : "", b.len);
    free(b.p);
    return out->t == CV_STR ? 0 : chat_oom(R, line);
}

int chat_iterate(chat_render *R, int line, cv v, cv_list **out) {
    switch (v.t) {
    case CV_LIST:
        *out = v.l;
        return 0;
    case CV_UNDEF:
        *out = chat_list_new(&R->a, 0);
        break;
    case CV_DICT:
        *out = chat_list_new(&R->a, v.d->n);
        if (*out) memcpy((*out)->items, v.d->keys, v.d->n * sizeof(cv));
        break;
    case CV_STR: {
        size_t n = chat_utf8_count(v.s->p, v.s->len);
        *out = chat_list_new(&R->a, n);
        for (size_t i = 0, k = 0; *out && i < v.s->len; k++) {
            int32_t cp;
            int len = chat_utf8_next((const unsigned char *)v.s->p + i, v.s->len - i, &cp);
            (*out)->items[k] = chat_str_value(&R->a, v.s->p + i, (size_t)len);
            if ((*out)->items[k].t != CV_STR) *out = NULL;
            i += (size_t)len;
        }
        break;
    }
    default:
        return chat_rfail(R, line, "'%s' object is not iterable", chat_type_name(v));
    }
    return *out ? 0 : chat_oom(R, line);
}

static bool is_num(cv v) {
    return v.t == CV_BOOL || v.t == CV_INT || v.t == CV_FLOAT;
}

static double num_f(cv v) {
    return v.t == CV_FLOAT ? v.f : v.t == CV_INT ? (double)v.i : (double)v.b;
}

static int64_t num_i(cv v) {
    return v.t == CV_INT ? v.i : v.b;
}

/* Counts one step of the render; fails past CHAT_MAX_STEPS. */
static int step(chat_render *R, int line) {
    if (++R->steps <= CHAT_MAX_STEPS) return 0;
    return chat_rfail(R, line, "template takes more than %u steps (a runaway loop?)",
                      (unsigned)CHAT_MAX_STEPS);
}

static int too_deep(chat_render *R, int line) {
    return chat_rfail(R, line, "values nested deeper than %d levels", CHAT_MAX_DEPTH);
}

/* chat_equal of values `depth` levels inside the ones compared. */
static int equal_at(chat_render *R, int line, cv a, cv b, int depth, bool *out) {
    bool lists = a.t == CV_LIST && b.t == CV_LIST, dicts = a.t == CV_DICT && b.t == CV_DICT;
    if (!lists && !dicts) {
        *out = chat_equal_shallow(a, b);
        return 0;
    }
    if (depth >= CHAT_MAX_DEPTH) return too_deep(R, line);
    if (step(R, line)) return -1;
    size_t n = lists ? a.l->n : a.d->n;
    *out = n == (lists ? b.l->n : b.d->n);
    for (size_t i = 0; i < n && *out; i++) {
        const cv *y = lists ? &b.l->items[i] : chat_dict_find(b.d, a.d->keys[i]);
        *out = y != NULL;
        if (y && equal_at(R, line, lists ? a.l->items[i] : a.d->vals[i], *y, depth + 1, out))
            return -1;
    }
    return 0;
}

int chat_equal(chat_render *R, int line, cv a, cv b, bool *out) {
    return equal_at(R, line, a, b, 0, out);
}

static int compare_at(chat_render *R, int line, cv a, cv b, bool ignore_case, int depth, int *c) {
    if (is_num(a) && is_num(b)) {
        if (a.t != CV_FLOAT && b.t != CV_FLOAT) {
            *c = num_i(a) < num_i(b) ? -1 : num_i(a) > num_i(b);
        } else {
            double x = num_f(a), y = num_f(b);
            *c = x < y ? -1 : x > y;
        }
        return 0;
    }
    if (a.t == CV_STR && b.t == CV_STR) {
        if (ignore_case) {
            cv la, lb;
            chat_args none = {0};
            bool f;
            if (chat_call_method(R, line, a, "lower", &none, &la, &f) ||
                chat_call_method(R, line, b, "lower", &none, &lb, &f))
                return -1;
            a = la;
            b = lb;
        }
        size_t n = a.s->len < b.s->len ? a.s->len : b.s->len;
        int m = memcmp(a.s->p, b.s->p, n);
        *c = m < 0 ? -1 : m > 0 ? 1 : a.s->len < b.s->len ? -1 : a.s->len > b.s->len;
        return 0;
    }
    if (a.t == CV_LIST && b.t == CV_LIST) {
        if (depth >= CHAT_MAX_DEPTH) return too_deep(R, line);
        if (step(R, line)) return -1;
        for (size_t i = 0; i < a.l->n && i < b.l->n; i++) {
            bool eq;
            if (equal_at(R, line, a.l->items[i], b.l->items[i], depth + 1, &eq)) return -1;
            if (eq) continue;
            return compare_at(R, line, a.l->items[i], b.l->items[i], ignore_case, depth + 1, c);
        }
        *c = a.l->n < b.l->n ? -1 : a.l->n > b.l->n;
        return 0;
    }
    return chat_rfail(R, line, "cannot compare '%s' with '%s'", chat_type_name(a),
                      chat_type_name(b));
}

int chat_compare(chat_render *R, int line, cv a, cv b, bool ignore_case, int *c) {
    return compare_at(R, line, a, b, ignore_case, 0, c);
}

static cv loop_field(const chat_loop *L, const char *name) {
    size_t n = L->items->n, i = L->i;
    if (strcmp(name, "index") == 0) return cv_int((int64_t)i + 1);
    if (strcmp(name, "index0") == 0) return cv_int((int64_t)i);
    if (strcmp(name, "revindex") == 0) return cv_int((int64_t)(n - i));
    if (strcmp(name, "revindex0") == 0) return cv_int((int64_t)(n - i - 1));
    if (strcmp(name, "first") == 0) return cv_bool(i == 0);
    if (strcmp(name, "last") == 0) return cv_bool(i + 1 == n);
    if (strcmp(name, "length") == 0) return cv_int((int64_t)n);
    if (strcmp(name, "depth") == 0) return cv_int(1);
    if (strcmp(name, "depth0") == 0) return cv_int(0);
    if (strcmp(name, "previtem") == 0) return i > 0 ? L->items->items[i - 1] : cv_undef(name);
    if (strcmp(name, "nextitem") == 0) return i + 1 < n ? L->items->items[i + 1] : cv_undef(name);
    return cv_undef(name);
}

cv chat_getattr(cv obj, const char *name) {
    if (obj.t == CV_DICT || obj.t == CV_NS) {
        cv *hit = chat_dict_get(obj.d, name, strlen(name));
        return hit ? *hit : cv_undef(name);
    }
    if (obj.t == CV_LOOP) return loop_field(obj.loop, name);
    return cv_undef(name);
}

cv chat_getitem(chat_render *R, cv obj, cv key) {
    if (obj.t == CV_DICT || obj.t == CV_NS) {
        cv *hit = chat_dict_find(obj.d, key);
        return hit ? *hit : cv_undef(key.t == CV_STR ? key.s->p : NULL);
    }
    if (key.t == CV_STR) return chat_getattr(obj, key.s->p);
    if (key.t != CV_INT && key.t != CV_BOOL) return cv_undef(NULL);
    int64_t i = num_i(key);
    if (obj.t == CV_LIST) {
        int64_t n = (int64_t)obj.l->n;
        if (i < 0) i += n;
        return i >= 0 && i < n ? obj.l->items[i] : cv_undef(NULL);
    }
    if (obj.t == CV_STR) {
        int64_t n = (int64_t)chat_utf8_count(obj.s->p, obj.s->len);
        if (i < 0) i += n;
        if (i < 0 || i >= n) return cv_undef(NULL);
        size_t p = 0;
        int32_t cp;
        for (int64_t k = 0; k < i; k++)
            p += (size_t)chat_utf8_next((const unsigned char *)obj.s->p + p, obj.s->len - p, &cp);
        int len = chat_utf8_next((const unsigned char *)obj.s->p + p, obj.s->len - p, &cp);
        return chat_str_value(&R->a, obj.s->p + p, (size_t)len);
    }
    return cv_undef(NULL);
}

/* ---- scopes ---- */

static chat_scope *scope_new(chat_render *R, chat_scope *parent) {
    chat_scope *s = chat_alloc(&R->a, sizeof *s);
    if (!s) return NULL;
    s->parent = parent;
    s->vars = chat_dict_new(&R->a, 8);
    return s->vars ? s : NULL;
}

static int scope_set(chat_render *R, int line, chat_scope *s, const char *name, cv v) {
    cv *slot = chat_dict_get(s->vars, name, strlen(name));
    if (slot) {
        *slot = v;
        return 0;
    }
    cv key = {.t = CV_STR};
    cv_str *ks = chat_alloc(&R->a, sizeof *ks);
    if (!ks) return chat_oom(R, line);
    ks->p = name;
    ks->len = strlen(name);
    key.s = ks;
    return chat_dict_set(&R->a, s->vars, key, v) ? chat_oom(R, line) : 0;
}

static cv scope_get(const chat_scope *s, const char *name) {
    size_t len = strlen(name);
    for (; s; s = s->parent) {
        cv *hit = chat_dict_get(s->vars, name, len);
        if (hit) return *hit;
    }
    int g = chat_global_id(name);
    if (g >= 0) {
        cv f = {.t = CV_FUNC};
        f.fn = g;
        return f;
    }
    return cv_undef(name);
}

/* ---- expressions ---- */

static int eval(chat_render *R, chat_scope *S, const cnode *n, cv *out);
static int exec_body(chat_render *R, chat_scope *S, cnode *const *body, int n, chat_buf *out);

static int undefined_error(chat_render *R, int line, cv v) {
    if (v.name) return chat_rfail(R, line, "'%s' is undefined", v.name);
    return chat_rfail(R, line, "operation on an undefined value");
}

static int type_error(chat_render *R, int line, const char *op, cv a, cv b) {
    if (a.t == CV_UNDEF) return undefined_error(R, line, a);
    if (b.t == CV_UNDEF) return undefined_error(R, line, b);
    return chat_rfail(R, line, "unsupported operand type(s) for %s: '%s' and '%s'", op,
                      chat_type_name(a), chat_type_name(b));
}

static int eval_args(chat_render *R, chat_scope *S, const cnode *n, chat_args *A) {
    A->n = n->n_args;
    A->kw = n->kw;
    A->v = chat_alloc(&R->a, (size_t)(n->n_args ? n->n_args : 1) * sizeof(cv));
    if (!A->v) return chat_oom(R, n->line);
    for (int i = 0; i < n->n_args; i++)
        if (eval(R, S, n->args[i], &A->v[i])) return -1;
    if (!A->kw) {
        static const char *const none[1] = {NULL};
        A->kw = (const char **)none;
    }
    return 0;
}

static int concat_strings(chat_render *R, int line, const cv_str *a, const cv_str *b, cv *out) {
    size_t n = a->len + b->len;
    char *d;
    cv_str *s = chat_str_alloc(&R->a, n, &d);
    if (!s) return chat_oom(R, line);
    memcpy(d, a->p, a->len);
    memcpy(d + a->len, b->p, b->len);
    out->t = CV_STR;
    out->s = s;
    return 0;
}

static int repeat(chat_render *R, int line, cv seq, int64_t times, cv *out) {
    if (times < 0) times = 0;
    size_t unit = seq.t == CV_STR ? seq.s->len : seq.l->n * sizeof(cv);
    if (unit && (uint64_t)times > CHAT_MAX_MEMORY / unit) return chat_oom(R, line);
    if (seq.t == CV_STR) {
        size_t n = seq.s->len * (size_t)times;
        char *d;
        cv_str *s = chat_str_alloc(&R->a, n, &d);
        if (!s) return chat_oom(R, line);
        for (int64_t k = 0; k < times; k++)
            memcpy(d + (size_t)k * seq.s->len, seq.s->p, seq.s->len);
        out->t = CV_STR;
        out->s = s;
        return 0;
    }
    cv_list *l = chat_list_new(&R->a, seq.l->n * (size_t)times);
    if (!l) return chat_oom(R, line);
    for (int64_t k = 0; k < times; k++)
        memcpy(l->items + (size_t)k * seq.l->n, seq.l->items, seq.l->n * sizeof(cv));
    out->t = CV_LIST;
    out->l = l;
    return 0;
}

static int arith_int(chat_render *R, int line, int op, int64_t x, int64_t y, cv *out) {
    int64_t r = 0;
    bool over = false;
    switch (op) {
    case OP_ADD:
        over = __builtin_add_overflow(x, y, &r);
        break;
    case OP_SUB:
        over = __builtin_sub_overflow(x, y, &r);
        break;
    case OP_MUL:
        over = __builtin_mul_overflow(x, y, &r);
        break;
    case OP_FLOORDIV:
    case OP_MOD:
        if (y == 0) return chat_rfail(R, line, "integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) {
            over = op == OP_FLOORDIV;
            break;
        }
        r = op == OP_FLOORDIV ? x / y : x % y;
        if (op == OP_FLOORDIV && (x % y != 0) && ((x < 0) != (y < 0))) r--;
        if (op == OP_MOD && r != 0 && ((r < 0) != (y < 0))) r += y;
        break;
    case OP_POW: {
        if (y < 0) {
            if (x == 0) return chat_rfail(R, line, "0 cannot be raised to a negative power");
            *out = cv_float(pow((double)x, (double)y));
            return 0;
        }
        r = 1;
        for (int64_t b = x, e = y; e && !over; e >>= 1) {
            if (e & 1) over = __builtin_mul_overflow(r, b, &r);
            if (e > 1 && !over) over = __builtin_mul_overflow(b, b, &b);
        }
        break;
    }
    }
    if (over) return chat_rfail(R, line, "integer overflow");
    *out = cv_int(r);
    return 0;
}

static int arith(chat_render *R, int line, int op, cv a, cv b, cv *out) {
    static const char *const names[] = {"", "+", "-", "*", "/", "//", "%", "**"};
    if (is_num(a) && is_num(b)) {
        if (op == OP_DIV) {
            if (num_f(b) == 0) return chat_rfail(R, line, "division by zero");
            *out = cv_float(num_f(a) / num_f(b));
            return 0;
        }
        if (a.t != CV_FLOAT && b.t != CV_FLOAT)
            return arith_int(R, line, op, num_i(a), num_i(b), out);
        double x = num_f(a), y = num_f(b), r = 0;
        switch (op) {
        case OP_ADD:
            r = x + y;
            break;
        case OP_SUB:
            r = x - y;
            break;
        case OP_MUL:
            r = x * y;
            break;
        case OP_FLOORDIV:
        case OP_MOD:
            if (y == 0) return chat_rfail(R, line, "float division or modulo by zero");
            r = op == OP_FLOORDIV ? floor(x / y) : x - floor(x / y) * y;
            break;
        case OP_POW:
            r = pow(x, y);
            break;
        }
        *out = cv_float(r);
        return 0;
    }
    if (op == OP_ADD && a.t == CV_STR && b.t == CV_STR)
        return concat_strings(R, line, a.s, b.s, out);
    if (op == OP_ADD && a.t == CV_LIST && b.t == CV_LIST) {
        cv_list *l = chat_list_new(&R->a, a.l->n + b.l->n);
        if (!l) return chat_oom(R, line);
        memcpy(l->items, a.l->items, a.l->n * sizeof(cv));
        memcpy(l->items + a.l->n, b.l->items, b.l->n * sizeof(cv));
        out->t = CV_LIST;
        out->l = l;
        return 0;
    }
    if (op == OP_MUL && (a.t == CV_STR || a.t == CV_LIST) && (b.t == CV_INT || b.t == CV_BOOL))
        return repeat(R, line, a, num_i(b), out);
    if (op == OP_MUL && (b.t == CV_STR || b.t == CV_LIST) && (a.t == CV_INT || a.t == CV_BOOL))
        return repeat(R, line, b, num_i(a), out);
    return type_error(R, line, names[op], a, b);
}

static int contains(chat_render *R, int line, cv item, cv seq, bool *out) {
    chat_args A = {&seq, NULL, 1};
    static const char *const none[1] = {NULL};
    A.kw = (const char **)none;
    if (seq.t == CV_UNDEF) {
        *out = false;
        return 0;
    }
    if (seq.t != CV_STR && seq.t != CV_LIST && seq.t != CV_DICT && seq.t != CV_NS)
        return chat_rfail(R, line, "argument of type '%s' is not iterable", chat_type_name(seq));
    return chat_apply_test(R, line, chat_test_id("in"), item, &A, out);
}

static int eval_compare(chat_render *R, chat_scope *S, const cnode *n, cv *out) {
    cv left;
    if (eval(R, S, n->args[0], &left)) return -1;
    for (int k = 1; k < n->n_args; k++) {
        cv right;
        if (eval(R, S, n->args[k], &right)) return -1;
        int op = n->ops[k - 1], c;
        bool r;
        switch (op) {
        case OP_EQ:
        case OP_NE:
            if (chat_equal(R, n->line, left, right, &r)) return -1;
            if (op == OP_NE) r = !r;
            break;
        case OP_IN:
        case OP_NOTIN:
            if (contains(R, n->line, left, right, &r)) return -1;
            if (op == OP_NOTIN) r = !r;
            break;
        default:
            if ((left.t == CV_UNDEF || right.t == CV_UNDEF))
                return undefined_error(R, n->line, left.t == CV_UNDEF ? left : right);
            if (chat_compare(R, n->line, left, right, false, &c)) return -1;
            r = op == OP_LT ? c < 0 : op == OP_LE ? c <= 0 : op == OP_GT ? c > 0 : c >= 0;
        }
        if (!r) {
            *out = cv_bool(false);
            return 0;
        }
        left = right;
    }
    *out = cv_bool(true);
    return 0;
}

/* Python slice bounds for a sequence of length len. */
static int slice_bounds(chat_render *R, const cnode *n, chat_scope *S, int64_t len, int64_t *start,
                        int64_t *step, int64_t *count) {
    cv v[3];
    const cnode *parts[3] = {n->b, n->c, n->d};
    for (int k = 0; k < 3; k++) {
        v[k] = cv_none();
        if (parts[k] && eval(R, S, parts[k], &v[k])) return -1;
        if (v[k].t == CV_UNDEF) v[k] = cv_none();
        if (v[k].t != CV_NONE && v[k].t != CV_INT && v[k].t != CV_BOOL)
            return chat_rfail(R, n->line, "slice indices must be integers or None");
    }
    *step = v[2].t == CV_NONE ? 1 : num_i(v[2]);
    if (*step == 0) return chat_rfail(R, n->line, "slice step cannot be zero");
    int64_t b, e;
    bool neg = *step < 0;
    if (v[0].t == CV_NONE) {
        b = neg ? len - 1 : 0;
    } else {
        b = num_i(v[0]);
        if (b < 0)
            b = b + len < 0 ? (neg ? -1 : 0) : b + len;
        else if (b >= len)
            b = neg ? len - 1 : len;
    }
    if (v[1].t == CV_NONE) {
        e = neg ? -1 : len;
    } else {
        e = num_i(v[1]);
        if (e < 0)
            e = e + len < 0 ? (neg ? -1 : 0) : e + len;
        else if (e >= len)
            e = neg ? len - 1 : len;
    }
    if (!neg)
        *count = b < e ? (e - b - 1) / *step + 1 : 0;
    else
        *count = e < b ? (b - e - 1) / (-*step) + 1 : 0;
    *start = b;
    return 0;
}

static int eval_slice(chat_render *R, chat_scope *S, const cnode *n, cv *out) {
    cv obj;
    if (eval(R, S, n->a, &obj)) return -1;
    if (obj.t == CV_UNDEF) {
        *out = obj;
        return 0;
    }
    if (obj.t != CV_LIST && obj.t != CV_STR)
        return chat_rfail(R, n->line, "'%s' object is not subscriptable", chat_type_name(obj));
    cv_list *items;
    if (chat_iterate(R, n->line, obj, &items)) return -1;
    int64_t start = 0, step = 1, count = 0;
    if (slice_bounds(R, n, S, (int64_t)items->n, &start, &step, &count)) return -1;
    if (obj.t == CV_LIST) {
        cv_list *l = chat_list_new(&R->a, (size_t)count);
        if (!l) return chat_oom(R, n->line);
        for (int64_t k = 0; k < count; k++) l->items[k] = items->items[start + k * step];
        out->t = CV_LIST;
        out->l = l;
        return 0;
    }
    chat_buf b = {0};
    int rc = 0;
    for (int64_t k = 0; k < count && !rc; k++) {
        const cv_str *c = items->items[start + k * step].s;
        rc = chat_buf_put(&b, c->p, c->len);
    }
    *out = chat_str_value(&R->a, b.p ? b.p : "", b.len);
    free(b.p);
    return rc || out->t != CV_STR ? chat_oom(R, n->line) : 0;
}

static int call_macro(chat_render *R, int line, const cnode *m, const chat_args *A, cv *out) {
    chat_scope *S = scope_new(R, R->root);
    if (!S) return chat_oom(R, line);
    int np = chat_positional_count(A);
    if (np > m->n_names)
        return chat_rfail(R, line, "macro '%s' takes not more than %d argument(s)", m->name,
                          m->n_names);
    for (int i = 0; i < A->n; i++) {
        if (!A->kw[i]) continue;
        bool known = false;
        for (int k = 0; k < m->n_names; k++) known |= strcmp(m->names[k], A->kw[i]) == 0;
        if (!known)
            return chat_rfail(R, line, "macro '%s' takes no keyword argument '%s'", m->name,
                              A->kw[i]);
    }
    for (int k = 0; k < m->n_names; k++) {
        cv v;
        if (!chat_arg(A, k, m->names[k], &v)) {
            v = cv_undef(m->names[k]);
            if (m->args[k] && eval(R, S, m->args[k], &v)) return -1;
        }
        if (scope_set(R, line, S, m->names[k], v)) return -1;
    }
    chat_buf b = {.limit = CHAT_MAX_OUTPUT};
    int rc = exec_body(R, S, m->body, m->n_body, &b);
    if (rc == EX_OK) {
        *out = chat_str_value(&R->a, b.p ? b.p : "", b.len);
        if (out->t != CV_STR) rc = chat_oom(R, line);
    }
    free(b.p);
    return rc == EX_OK ? 0 : -1;
}

static int eval_call(chat_render *R, chat_scope *S, const cnode *n, cv *out) {
    cv fn;
    chat_args A;
    if (n->a->kind == N_ATTR) {
        cv obj;
        if (eval(R, S, n->a->a, &obj) || eval_args(R, S, n, &A)) return -1;
        bool found;
        if (chat_call_method(R, n->line, obj, n->a->name, &A, out, &found)) return -1;
        if (found) return 0;
        fn = chat_getattr(obj, n->a->name);
        if (fn.t == CV_UNDEF && obj.t != CV_DICT && obj.t != CV_NS && obj.t != CV_LOOP)
            return chat_rfail(R, n->line, "'%s' object has no attribute '%s'", chat_type_name(obj),
                              n->a->name);
    } else {
        if (eval(R, S, n->a, &fn) || eval_args(R, S, n, &A)) return -1;
    }
    switch (fn.t) {
    case CV_MACRO:
        return call_macro(R, n->line, fn.macro, &A, out);
    case CV_FUNC:
        return chat_call_global(R, n->line, fn.fn, &A, out);
    case CV_UNDEF:
        return undefined_error(R, n->line, fn);
    default:
        return chat_rfail(R, n->line, "'%s' object is not callable", chat_type_name(fn));
    }
}

static int eval_seq(chat_render *R, chat_scope *S, const cnode *n, bool tuple, cv *out) {
    cv_list *l = chat_list_new(&R->a, (size_t)n->n_args);
    if (!l) return chat_oom(R, n->line);
    l->tuple = tuple;
    for (int i = 0; i < n->n_args; i++)
        if (eval(R, S, n->args[i], &l->items[i])) return -1;
    out->t = CV_LIST;
    out->l = l;
    return 0;
}

static int eval_inner(chat_render *R, chat_scope *S, const cnode *n, cv *out) {
    cv a, b;
    chat_args A;
    bool t;
    switch (n->kind) {
    case N_CONST:
        *out = n->val;
        return 0;
    case N_NAME:
        *out = scope_get(S, n->name);
        return 0;
    case N_LIST:
        return eval_seq(R, S, n, false, out);
    case N_TUPLE:
        return eval_seq(R, S, n, true, out);
    case N_DICT: {
        cv_dict *d = chat_dict_new(&R->a, (size_t)n->n_args / 2 + 1);
        if (!d) return chat_oom(R, n->line);
        for (int i = 0; i + 1 < n->n_args; i += 2) {
            if (eval(R, S, n->args[i], &a) || eval(R, S, n->args[i + 1], &b)) return -1;
            if (!chat_dict_key(a)) {
                if (a.t == CV_LIST || a.t == CV_DICT)
                    return chat_rfail(R, n->line, "unhashable type: '%s'", chat_type_name(a));
                return chat_rfail(R, n->line, "dict keys of type '%s' are not supported",
                                  chat_type_name(a));
            }
            if (chat_dict_set(&R->a, d, a, b)) return chat_oom(R, n->line);
        }
        out->t = CV_DICT;
        out->d = d;
        return 0;
    }
    case N_ATTR:
        if (eval(R, S, n->a, &a)) return -1;
        *out = chat_getattr(a, n->name);
        return 0;
    case N_ITEM:
        if (eval(R, S, n->a, &a) || eval(R, S, n->b, &b)) return -1;
        *out = chat_getitem(R, a, b);
        return 0;
    case N_SLICE:
        return eval_slice(R, S, n, out);
    case N_CALL:
        return eval_call(R, S, n, out);
    case N_FILTER:
        if (eval(R, S, n->a, &a) || eval_args(R, S, n, &A)) return -1;
        return chat_apply_filter(R, n->line, n->id, a, &A, out);
    case N_TEST:
        if (eval(R, S, n->a, &a) || eval_args(R, S, n, &A)) return -1;
        if (chat_apply_test(R, n->line, n->id, a, &A, &t)) return -1;
        *out = cv_bool(t != n->negate);
        return 0;
    case N_NEG:
    case N_POS:
        if (eval(R, S, n->a, &a)) return -1;
        if (a.t == CV_FLOAT) {
            *out = cv_float(n->kind == N_NEG ? -a.f : a.f);
        } else if (a.t == CV_INT || a.t == CV_BOOL) {
            if (n->kind == N_NEG && num_i(a) == INT64_MIN)
                return chat_rfail(R, n->line, "integer overflow");
            *out = cv_int(n->kind == N_NEG ? -num_i(a) : num_i(a));
        } else {
            if (a.t == CV_UNDEF) return undefined_error(R, n->line, a);
            return chat_rfail(R, n->line, "bad operand type for unary %c: '%s'",
                              n->kind == N_NEG ? '-' : '+', chat_type_name(a));
        }
        return 0;
    case N_NOT:
        if (eval(R, S, n->a, &a)) return -1;
        *out = cv_bool(!chat_truthy(a));
        return 0;
    case N_AND:
    case N_OR:
        if (eval(R, S, n->a, &a)) return -1;
        if (chat_truthy(a) == (n->kind == N_OR)) {
            *out = a;
            return 0;
        }
        return eval(R, S, n->b, out);
    case N_COND:
        if (eval(R, S, n->a, &a)) return -1;
        if (chat_truthy(a)) return eval(R, S, n->b, out);
        if (n->c) return eval(R, S, n->c, out);
        *out = cv_undef(NULL);
        return 0;
    case N_CMP:
        return eval_compare(R, S, n, out);
    case N_BIN:
        if (eval(R, S, n->a, &a) || eval(R, S, n->b, &b)) return -1;
        if (n->op == OP_CONCAT) {
            cv x, y;
            if (chat_stringify(R, n->line, a, &x) || chat_stringify(R, n->line, b, &y)) return -1;
            return concat_strings(R, n->line, x.s, y.s, out);
        }
        return arith(R, n->line, n->op, a, b, out);
    default:
        return chat_rfail(R, n->line, "statement used as an expression");
    }
}

static int eval(chat_render *R, chat_scope *S, const cnode *n, cv *out) {
    if (step(R, n->line)) return -1;
    if (++R->depth > CHAT_MAX_DEPTH)
        return chat_rfail(R, n->line, "template nests deeper than %d levels (runaway recursion?)",
                          CHAT_MAX_DEPTH);
    int rc = eval_inner(R, S, n, out);
    R->depth--;
    return rc;
}

/* ---- statements ---- */

static int too_big(chat_render *R, int line) {
    return chat_rfail(R, line, "rendered output is larger than %u MiB",
                      (unsigned)(CHAT_MAX_OUTPUT >> 20));
}

static int put(chat_render *R, int line, chat_buf *out, const char *p, size_t n) {
    return chat_buf_put(out, p, n) == 0 ? 0 : too_big(R, line);
}

static int bind_targets(chat_render *R, chat_scope *S, const cnode *n, cv v) {
    if (n->n_names == 1) return scope_set(R, n->line, S, n->names[0], v);
    if (v.t != CV_LIST)
        return chat_rfail(R, n->line, "cannot unpack '%s' into %d names", chat_type_name(v),
                          n->n_names);
    if (v.l->n != (size_t)n->n_names)
        return chat_rfail(R, n->line, "%s values to unpack (expected %d, got %zu)",
                          v.l->n > (size_t)n->n_names ? "too many" : "not enough", n->n_names,
                          v.l->n);
    for (int k = 0; k < n->n_names; k++)
        if (scope_set(R, n->line, S, n->names[k], v.l->items[k])) return -1;
    return 0;
}

static int exec_for(chat_render *R, chat_scope *S, const cnode *n, chat_buf *out) {
    cv seq;
    cv_list *items;
    if (eval(R, S, n->a, &seq) || chat_iterate(R, n->line, seq, &items)) return EX_ERR;
    chat_scope *L = scope_new(R, S);
    if (!L) return chat_oom(R, n->line);
    if (n->b) {
        cv_list *kept = chat_list_new(&R->a, items->n);
        if (!kept) return chat_oom(R, n->line);
        kept->n = 0;
        for (size_t i = 0; i < items->n; i++) {
            cv ok;
            if (step(R, n->line) || bind_targets(R, L, n, items->items[i]) || eval(R, L, n->b, &ok))
                return EX_ERR;
            if (chat_truthy(ok)) kept->items[kept->n++] = items->items[i];
        }
        items = kept;
    }
    if (items->n == 0) return exec_body(R, S, n->alt, n->n_alt, out);
    chat_loop *loop = chat_alloc(&R->a, sizeof *loop);
    if (!loop) return chat_oom(R, n->line);
    loop->items = items;
    cv lv = {.t = CV_LOOP};
    lv.loop = loop;
    if (scope_set(R, n->line, L, "loop", lv)) return EX_ERR;
    for (size_t i = 0; i < items->n; i++) {
        loop->i = i;
        if (step(R, n->line) || bind_targets(R, L, n, items->items[i])) return EX_ERR;
        int rc = exec_body(R, L, n->body, n->n_body, out);
        if (rc == EX_ERR) return EX_ERR;
        if (rc == EX_BREAK) break;
    }
    return EX_OK;
}

static int exec_set(chat_render *R, chat_scope *S, const cnode *n) {
    cv v;
    if (n->b) {
        if (eval(R, S, n->b, &v)) return EX_ERR;
    } else {
        chat_buf b = {.limit = CHAT_MAX_OUTPUT};
        int rc = exec_body(R, S, n->body, n->n_body, &b);
        if (rc == EX_OK) {
            v = chat_str_value(&R->a, b.p ? b.p : "", b.len);
            if (v.t != CV_STR) rc = chat_oom(R, n->line);
        }
        free(b.p);
        if (rc != EX_OK) return rc;
    }
    if (!n->a) return bind_targets(R, S, n, v) ? EX_ERR : EX_OK;
    cv ns = scope_get(S, n->a->name);
    if (ns.t != CV_NS)
        return chat_rfail(R, n->line, "cannot assign attribute '%s' on '%s': not a namespace",
                          n->name, n->a->name);
    cv key = chat_str_value(&R->a, n->name, strlen(n->name));
    if (key.t != CV_STR || chat_dict_set(&R->a, ns.d, key, v)) return chat_oom(R, n->line);
    return EX_OK;
}

static int exec_stmt(chat_render *R, chat_scope *S, const cnode *n, chat_buf *out) {
    cv v;
    switch (n->kind) {
    case S_TEXT:
        return put(R, n->line, out, n->val.s->p, n->val.s->len) ? EX_ERR : EX_OK;
    case S_OUT: {
        if (eval(R, S, n->a, &v)) return EX_ERR;
        if (v.t == CV_STR) return put(R, n->line, out, v.s->p, v.s->len) ? EX_ERR : EX_OK;
        return chat_to_str(out, v) == 0 ? EX_OK : too_big(R, n->line);
    }
    case S_IF:
        /* An elif chain (an S_IF alone in the alt) is walked in a loop: it is no nesting,
         * and any length of it must render. */
        for (;;) {
            if (eval(R, S, n->a, &v)) return EX_ERR;
            if (chat_truthy(v)) return exec_body(R, S, n->body, n->n_body, out);
            if (n->n_alt != 1 || n->alt[0]->kind != S_IF)
                return exec_body(R, S, n->alt, n->n_alt, out);
            n = n->alt[0];
            if (step(R, n->line)) return EX_ERR;
        }
    case S_FOR:
        return exec_for(R, S, n, out);
    case S_SET:
        return exec_set(R, S, n);
    case S_MACRO:
        v.t = CV_MACRO;
        v.macro = n;
        return scope_set(R, n->line, S, n->name, v) ? EX_ERR : EX_OK;
    case S_BREAK:
        return EX_BREAK;
    case S_CONTINUE:
        return EX_CONTINUE;
    case S_BLOCK:
        return exec_body(R, S, n->body, n->n_body, out);
    case S_FILTER: {
        chat_buf b = {.limit = CHAT_MAX_OUTPUT};
        int rc = exec_body(R, S, n->body, n->n_body, &b);
        chat_args A;
        if (rc == EX_OK) {
            cv text = chat_str_value(&R->a, b.p ? b.p : "", b.len);
            if (text.t != CV_STR)
                rc = chat_oom(R, n->line);
            else if (eval_args(R, S, n->b, &A) ||
                     chat_apply_filter(R, n->line, n->b->id, text, &A, &v))
                rc = EX_ERR;
        }
        free(b.p);
        if (rc != EX_OK) return rc;
        if (chat_stringify(R, n->line, v, &v)) return EX_ERR;
        return put(R, n->line, out, v.s->p, v.s->len) ? EX_ERR : EX_OK;
    }
    default:
        return chat_rfail(R, n->line, "expression used as a statement");
    }
}

static int exec_body(chat_render *R, chat_scope *S, cnode *const *body, int n, chat_buf *out) {
    for (int i = 0; i < n; i++) {
        if (step(R, body[i]->line)) return EX_ERR;
        if (++R->depth > CHAT_MAX_DEPTH)
            return chat_rfail(R, body[i]->line,
                              "template nests deeper than %d levels (runaway recursion?)",
                              CHAT_MAX_DEPTH);
        int rc = exec_stmt(R, S, body[i], out);
        R->depth--;
        if (rc != EX_OK) return rc;
    }
    return EX_OK;
}

int chat_template_render(const chat_template *t, const json_t *vars, char **out, size_t *len,
                         base_err *err) {
    chat_render R = {.a = {.limit = CHAT_MAX_MEMORY}, .err = err};
    chat_buf b = {.limit = CHAT_MAX_OUTPUT};
    int rc = -1;
    if (vars && !json_is_object(vars)) {
        base_fail(err, "template variables must be a JSON object");
        goto done;
    }
    R.root = scope_new(&R, NULL);
    if (!R.root) {
        chat_oom(&R, 0);
        goto done;
    }
    if (vars) {
        cv all;
        if (chat_from_json(&R.a, vars, &all)) {
            base_fail(err, "template variables need more than %u MiB",
                      (unsigned)(CHAT_MAX_MEMORY >> 20));
            goto done;
        }
        R.root->vars = all.d;
    }
    rc = exec_body(&R, R.root, t->body, t->n_body, &b);
    if (rc == EX_OK && !b.p) rc = chat_buf_put(&b, "", 0);
done:
    chat_arena_free(&R.a);
    if (rc != EX_OK) {
        free(b.p);
        return -1;
    }
    *out = b.p;
    if (len) *len = b.len;
    return 0;
}
