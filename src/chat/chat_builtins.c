/* The builtin filters, tests, string and dict methods and global functions, with the
 * semantics of Python Jinja (and of the Python str / dict methods templates call). */
#include "chat/chat_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

/* ---- small helpers ---- */

static int buf_done(chat_render *R, int line, chat_buf *b, int rc, cv *out) {
    if (rc) {
        free(b->p);
        return chat_rfail(R, line, "string result too large");
    }
    *out = chat_str_value(&R->a, b->p ? b->p : "", b->len);
    free(b->p);
    return out->t == CV_STR ? 0 : chat_oom(R, line);
}

static int make_str(chat_render *R, int line, const char *p, size_t len, cv *out) {
    *out = chat_str_value(&R->a, p, len);
    return out->t == CV_STR ? 0 : chat_oom(R, line);
}

static int make_list(chat_render *R, int line, size_t n, cv_list **l, cv *out) {
    *l = chat_list_new(&R->a, n);
    if (!*l) return chat_oom(R, line);
    out->t = CV_LIST;
    out->l = *l;
    return 0;
}

static int pair(chat_render *R, int line, cv a, cv b, cv *out) {
    cv_list *l;
    if (make_list(R, line, 2, &l, out)) return -1;
    l->tuple = true;
    l->items[0] = a;
    l->items[1] = b;
    return 0;
}

/* The operand as text: strings as they are, anything else through str(). */
static int text_of(chat_render *R, int line, cv v, const cv_str **s) {
    cv t;
    if (chat_stringify(R, line, v, &t)) return -1;
    *s = t.s;
    return 0;
}

static bool arg_bool(const chat_args *A, int pos, const char *name, bool def) {
    cv v;
    return chat_arg(A, pos, name, &v) ? chat_truthy(v) : def;
}

static int arg_int(chat_render *R, int line, const chat_args *A, int pos, const char *name,
                   int64_t def, int64_t *out) {
    cv v;
    *out = def;
    if (!chat_arg(A, pos, name, &v) || v.t == CV_NONE) return 0;
    if (v.t == CV_INT)
        *out = v.i;
    else if (v.t == CV_BOOL)
        *out = v.b;
    else
        return chat_rfail(R, line, "'%s' must be an integer, not %s", name, chat_type_name(v));
    return 0;
}

static int arg_str(chat_render *R, int line, const chat_args *A, int pos, const char *name,
                   const cv_str **out) {
    cv v;
    *out = NULL;
    if (!chat_arg(A, pos, name, &v) || v.t == CV_NONE) return 0;
    if (v.t != CV_STR)
        return chat_rfail(R, line, "'%s' must be a string, not %s", name, chat_type_name(v));
    *out = v.s;
    return 0;
}

typedef enum { CASE_UPPER, CASE_LOWER, CASE_TITLE, CASE_WORDS, CASE_CAPITALIZE } case_mode;

static bool is_cased(int32_t cp) {
    utf8proc_category_t c = utf8proc_category(cp);
    return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
}

/* Python's full case mappings where one character becomes several (SpecialCasing.txt, the
 * unconditional ones that occur in practice); utf8proc maps one to one. */
static const struct {
    int32_t cp;
    const char *upper, *title, *lower; /* NULL: the one-to-one mapping */
} g_special_case[] = {
    {0x00DF, "SS", "Ss", NULL},
    {0x0130, NULL, NULL, "i\xCC\x87"},
    {0x0149, "\xCA\xBCN", "\xCA\xBCN", NULL},
    {0xFB00, "FF", "Ff", NULL},
    {0xFB01, "FI", "Fi", NULL},
    {0xFB02, "FL", "Fl", NULL},
    {0xFB03, "FFI", "Ffi", NULL},
    {0xFB04, "FFL", "Ffl", NULL},
    {0xFB05, "ST", "St", NULL},
    {0xFB06, "ST", "St", NULL},
};

typedef enum { TO_SAME, TO_UPPER, TO_TITLE, TO_LOWER } case_target;

static int put_case(chat_buf *b, int32_t cp, case_target to, const char *orig, size_t len) {
    if (to == TO_SAME || cp > 0x10FFFF) return chat_buf_put(b, orig, len);
    for (size_t i = 0; i < sizeof g_special_case / sizeof g_special_case[0]; i++) {
        if (g_special_case[i].cp != cp) continue;
        const char *m = to == TO_UPPER   ? g_special_case[i].upper
                        : to == TO_TITLE ? g_special_case[i].title
                                         : g_special_case[i].lower;
        if (m) return chat_buf_puts(b, m);
    }
    int32_t m = to == TO_UPPER   ? utf8proc_toupper(cp)
                : to == TO_TITLE ? utf8proc_totitle(cp)
                                 : utf8proc_tolower(cp);
    if (m == cp) return chat_buf_put(b, orig, len);
    utf8proc_uint8_t enc[4];
    utf8proc_ssize_t n = utf8proc_encode_char(m, enc);
    return chat_buf_put(b, (const char *)enc, (size_t)n);
}

/* CASE_TITLE is Python's str.title (a letter after a cased letter goes lower); CASE_WORDS is
 * Jinja's title filter (words start after whitespace, '-', '(', '{', '[' or '<'). */
static int change_case(chat_render *R, int line, const cv_str *s, case_mode mode, cv *out) {
    chat_buf b = {0};
    int rc = 0;
    bool boundary = true;
    for (size_t i = 0; i < s->len && !rc;) {
        int32_t cp;
        int k = chat_utf8_next((const unsigned char *)s->p + i, s->len - i, &cp);
        case_target to = TO_SAME;
        switch (mode) {
        case CASE_UPPER:
            to = TO_UPPER;
            break;
        case CASE_LOWER:
            to = TO_LOWER;
            break;
        case CASE_TITLE:
            to = boundary ? TO_TITLE : TO_LOWER;
            boundary = !is_cased(cp);
            break;
        case CASE_WORDS:
            if (chat_is_space(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' ||
                cp == '<') {
                boundary = true;
            } else {
                to = boundary ? TO_UPPER : TO_LOWER;
                boundary = false;
            }
            break;
        case CASE_CAPITALIZE:
            to = i == 0 ? TO_TITLE : TO_LOWER;
            break;
        }
        rc = put_case(&b, cp, to, s->p + i, (size_t)k);
        i += (size_t)k;
    }
    return buf_done(R, line, &b, rc, out);
}

static bool in_chars(int32_t cp, const cv_str *chars) {
    if (!chars) return chat_is_space(cp);
    for (size_t i = 0; i < chars->len;) {
        int32_t c;
        i += (size_t)chat_utf8_next((const unsigned char *)chars->p + i, chars->len - i, &c);
        if (c == cp) return true;
    }
    return false;
}

/* str.strip / lstrip / rstrip with Python's whitespace, or the given characters. */
static int strip(chat_render *R, int line, const cv_str *s, const cv_str *chars, bool left,
                 bool right, cv *out) {
    size_t b = 0, e = s->len;
    while (left && b < e) {
        int32_t cp;
        int k = chat_utf8_next((const unsigned char *)s->p + b, e - b, &cp);
        if (!in_chars(cp, chars)) break;
        b += (size_t)k;
    }
    while (right && e > b) {
        size_t k = e - 1;
        while (k > b && ((unsigned char)s->p[k] & 0xC0) == 0x80 && e - k < 4) k--;
        int32_t cp;
        chat_utf8_next((const unsigned char *)s->p + k, e - k, &cp);
        if (!in_chars(cp, chars)) break;
        e = k;
    }
    return make_str(R, line, s->p + b, e - b, out);
}

static const char *find_bytes(const char *h, size_t hn, const char *n, size_t nn) {
    if (nn == 0) return h;
    if (nn > hn) return NULL;
    return memmem(h, hn, n, nn);
}

static int replace(chat_render *R, int line, const cv_str *s, const cv_str *old, const cv_str *new,
                   int64_t count, cv *out) {
    chat_buf b = {0};
    int rc = 0;
    if (count < 0) count = INT64_MAX;
    if (old->len == 0) {
        /* Python inserts `new` before every character and at the end. */
        size_t i = 0;
        for (; i < s->len && count > 0 && !rc; count--) {
            int32_t cp;
            int k = chat_utf8_next((const unsigned char *)s->p + i, s->len - i, &cp);
            rc = chat_buf_put(&b, new->p, new->len);
            if (!rc) rc = chat_buf_put(&b, s->p + i, (size_t)k);
            i += (size_t)k;
        }
        if (!rc && count > 0) rc = chat_buf_put(&b, new->p, new->len);
        if (!rc) rc = chat_buf_put(&b, s->p + i, s->len - i);
        return buf_done(R, line, &b, rc, out);
    }
    size_t i = 0;
    while (!rc && count > 0) {
        const char *hit = find_bytes(s->p + i, s->len - i, old->p, old->len);
        if (!hit) break;
        size_t at = (size_t)(hit - s->p);
        rc = chat_buf_put(&b, s->p + i, at - i);
        if (!rc) rc = chat_buf_put(&b, new->p, new->len);
        i = at + old->len;
        count--;
    }
    if (!rc) rc = chat_buf_put(&b, s->p + i, s->len - i);
    return buf_done(R, line, &b, rc, out);
}

static int split(chat_render *R, int line, const cv_str *s, const cv_str *sep, int64_t maxsplit,
                 cv *out) {
    if (sep && sep->len == 0) return chat_rfail(R, line, "split: empty separator");
    size_t cap = 8, n = 0;
    cv *parts = malloc(cap * sizeof *parts);
    if (!parts) return chat_oom(R, line);
    size_t i = 0;
    int rc = 0;
#define PUSH_PART(p_, len_)                                                                        \
    do {                                                                                           \
        if (n == cap) {                                                                            \
            cap *= 2;                                                                              \
            cv *np_ = realloc(parts, cap * sizeof *parts);                                         \
            if (!np_) {                                                                            \
                rc = chat_oom(R, line);                                                            \
                goto done;                                                                         \
            }                                                                                      \
            parts = np_;                                                                           \
        }                                                                                          \
        if (make_str(R, line, (p_), (len_), &parts[n])) {                                          \
            rc = -1;                                                                               \
            goto done;                                                                             \
        }                                                                                          \
        n++;                                                                                       \
    } while (0)
    if (sep) {
        for (;;) {
            const char *hit =
                maxsplit == 0 ? NULL : find_bytes(s->p + i, s->len - i, sep->p, sep->len);
            if (!hit) break;
            PUSH_PART(s->p + i, (size_t)(hit - s->p) - i);
            i = (size_t)(hit - s->p) + sep->len;
            if (maxsplit > 0) maxsplit--;
        }
        PUSH_PART(s->p + i, s->len - i);
    } else {
        for (;;) {
            while (i < s->len) {
                int32_t cp;
                int k = chat_utf8_next((const unsigned char *)s->p + i, s->len - i, &cp);
                if (!chat_is_space(cp)) break;
                i += (size_t)k;
            }
            if (i >= s->len) break;
            if (maxsplit == 0) {
                size_t e = s->len;
                while (e > i && chat_is_space((unsigned char)s->p[e - 1])) e--;
                PUSH_PART(s->p + i, e - i);
                break;
            }
            size_t st = i;
            while (i < s->len) {
                int32_t cp;
                int k = chat_utf8_next((const unsigned char *)s->p + i, s->len - i, &cp);
                if (chat_is_space(cp)) break;
                i += (size_t)k;
            }
            PUSH_PART(s->p + st, i - st);
            if (maxsplit > 0) maxsplit--;
        }
    }
#undef PUSH_PART
    cv_list *l;
    rc = make_list(R, line, n, &l, out);
    if (!rc && n) memcpy(l->items, parts, n * sizeof *parts);
done:
    free(parts);
    return rc;
}

/* Python's "{} {0} {name}".format(...); a format spec after ':' is not applied. */
static int format_braces(chat_render *R, int line, const cv_str *f, const chat_args *A, cv *out) {
    chat_buf b = {0};
    int rc = 0, next = 0;
    for (size_t i = 0; i < f->len && !rc; i++) {
        char c = f->p[i];
        if ((c == '{' || c == '}') && i + 1 < f->len && f->p[i + 1] == c) {
            rc = chat_buf_put(&b, &c, 1);
            i++;
            continue;
        }
        if (c != '{') {
            rc = chat_buf_put(&b, &c, 1);
            continue;
        }
        const char *close = memchr(f->p + i, '}', f->len - i);
        if (!close) {
            free(b.p);
            return chat_rfail(R, line, "format: single '{' in format string");
        }
        size_t fl = (size_t)(close - f->p) - i - 1, nl = 0;
        const char *field = f->p + i + 1;
        while (nl < fl && field[nl] != ':' && field[nl] != '!') nl++;
        cv v;
        bool ok;
        if (nl == 0) {
            ok = chat_arg(A, next++, NULL, &v);
        } else if (field[0] >= '0' && field[0] <= '9') {
            ok = chat_arg(A, atoi(field), NULL, &v);
        } else {
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)nl, field);
            ok = chat_arg(A, -1, name, &v);
        }
        if (!ok) {
            free(b.p);
            return chat_rfail(R, line, "format: no argument for field '{%.*s}'", (int)fl, field);
        }
        rc = chat_to_str(&b, v);
        i = (size_t)(close - f->p);
    }
    return buf_done(R, line, &b, rc, out);
}

/* Python's "%s %d" % args, for the format filter. */
static int format_percent(chat_render *R, int line, const cv_str *f, const chat_args *A, cv *out) {
    chat_buf b = {0};
    int rc = 0, next = 0;
    for (size_t i = 0; i < f->len && !rc; i++) {
        char c = f->p[i];
        if (c != '%' || i + 1 >= f->len) {
            rc = chat_buf_put(&b, &c, 1);
            continue;
        }
        char spec = f->p[++i];
        if (spec == '%') {
            rc = chat_buf_put(&b, "%", 1);
            continue;
        }
        cv v;
        if (!chat_arg(A, next++, NULL, &v)) {
            free(b.p);
            return chat_rfail(R, line, "format: not enough arguments for format string");
        }
        if (spec == 'd' || spec == 'i') {
            if (v.t == CV_FLOAT) v = cv_int((int64_t)v.f);
            if (v.t != CV_INT && v.t != CV_BOOL) {
                free(b.p);
                return chat_rfail(R, line, "format: %%d needs a number, not %s", chat_type_name(v));
            }
            rc = chat_buf_printf(&b, "%lld", (long long)(v.t == CV_BOOL ? v.b : v.i));
        } else if (spec == 'r') {
            rc = chat_repr(&b, v);
        } else if (spec == 's') {
            rc = chat_to_str(&b, v);
        } else {
            free(b.p);
            return chat_rfail(R, line, "format: unsupported conversion '%%%c'", spec);
        }
    }
    return buf_done(R, line, &b, rc, out);
}

/* Dotted attribute path ("a.b", "items.0") as map/selectattr/sort take it. */
static cv attr_path(chat_render *R, cv v, const cv_str *path) {
    size_t i = 0;
    while (i <= path->len) {
        const char *dot = memchr(path->p + i, '.', path->len - i);
        size_t e = dot ? (size_t)(dot - path->p) : path->len;
        char part[256];
        snprintf(part, sizeof part, "%.*s", (int)(e - i), path->p + i);
        char *end;
        long idx = strtol(part, &end, 10);
        if (*part && !*end && v.t == CV_LIST)
            v = chat_getitem(R, v, cv_int(idx));
        else
            v = chat_getattr(v, part);
        if (!dot) break;
        i = e + 1;
    }
    return v;
}

static int length_of(chat_render *R, int line, cv x, int64_t *n) {
    switch (x.t) {
    case CV_STR:
        *n = (int64_t)chat_utf8_count(x.s->p, x.s->len);
        return 0;
    case CV_LIST:
        *n = (int64_t)x.l->n;
        return 0;
    case CV_DICT:
    case CV_NS:
        *n = (int64_t)x.d->n;
        return 0;
    case CV_UNDEF:
        *n = 0;
        return 0;
    default:
        return chat_rfail(R, line, "object of type '%s' has no len()", chat_type_name(x));
    }
}

/* ---- sorting ---- */

typedef struct sort_item {
    cv key, val;
} sort_item;

typedef struct sort_ctx {
    chat_render *R;
    int line;
    bool ignore_case, reverse;
} sort_ctx;

/* Insertion-stable merge sort: qsort is not stable and Python's sort is. */
static int sort_items(sort_ctx *S, sort_item *a, size_t n) {
    if (n < 2) return 0;
    sort_item *tmp = malloc(n * sizeof *tmp);
    if (!tmp) return chat_oom(S->R, S->line);
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                int c;
                if (chat_compare(S->R, S->line, a[j].key, a[i].key, S->ignore_case, &c)) {
                    free(tmp);
                    return -1;
                }
                if (S->reverse) c = -c;
                tmp[k++] = c < 0 ? a[j++] : a[i++];
            }
            while (i < mid) tmp[k++] = a[i++];
            while (j < hi) tmp[k++] = a[j++];
        }
        memcpy(a, tmp, n * sizeof *tmp);
    }
    free(tmp);
    return 0;
}

static cv fold_case(chat_render *R, cv v, bool ignore_case) {
    cv out;
    if (ignore_case && v.t == CV_STR && change_case(R, 0, v.s, CASE_LOWER, &out) == 0) return out;
    return v;
}

/* ---- filters ---- */

/* One name a line would be long; clang-format cannot settle on a layout for a packed
 * list, so it leaves this one alone. */
/* clang-format off */
#define FILTERS(X) \
    X(abs) X(attr) X(capitalize) X(count) X(d) X(default) X(dictsort) X(first) \
    X(float) X(format) X(indent) X(int) X(items) X(join) X(last) X(length) \
    X(list) X(lower) X(map) X(max) X(min) X(reject) X(rejectattr) X(replace) \
    X(reverse) X(round) X(safe) X(select) X(selectattr) X(sort) X(string) X(sum) \
    X(title) X(tojson) X(trim) X(unique) X(upper) X(wordcount)
/* clang-format on */

#define FILTER_ENUM(n) F_##n,
enum { FILTERS(FILTER_ENUM) F_COUNT };
#define FILTER_NAME(n) #n,
static const char *const g_filters[] = {FILTERS(FILTER_NAME)};

int chat_filter_id(const char *name) {
    for (int i = 0; i < F_COUNT; i++)
        if (strcmp(name, g_filters[i]) == 0) return i;
    return -1;
}

/* select / reject / selectattr / rejectattr. */
static int filter_select(chat_render *R, int line, cv x, const chat_args *A, bool attr, bool keep,
                         cv *out) {
    cv_list *in;
    if (chat_iterate(R, line, x, &in)) return -1;
    const cv_str *path = NULL;
    int first_test_arg = 0;
    if (attr) {
        if (arg_str(R, line, A, 0, "attribute", &path)) return -1;
        if (!path) return chat_rfail(R, line, "selectattr/rejectattr need an attribute");
        first_test_arg = 1;
    }
    int test = -1;
    cv name;
    if (chat_arg(A, first_test_arg, NULL, &name)) {
        if (name.t != CV_STR) return chat_rfail(R, line, "the test name must be a string");
        test = chat_test_id(name.s->p);
        if (test < 0) return chat_rfail(R, line, "no test named '%s'", name.s->p);
    }
    chat_args targs = {A->v, A->kw, A->n};
    int skip = first_test_arg + 1;
    targs.v += skip < A->n ? skip : A->n;
    targs.kw += skip < A->n ? skip : A->n;
    targs.n = A->n > skip ? A->n - skip : 0;
    cv_list *res;
    if (make_list(R, line, in->n, &res, out)) return -1;
    res->n = 0;
    for (size_t i = 0; i < in->n; i++) {
        cv v = attr ? attr_path(R, in->items[i], path) : in->items[i];
        bool ok;
        if (test >= 0) {
            if (chat_apply_test(R, line, test, v, &targs, &ok)) return -1;
        } else {
            ok = chat_truthy(v);
        }
        if (ok == keep) res->items[res->n++] = in->items[i];
    }
    return 0;
}

static int filter_map(chat_render *R, int line, cv x, const chat_args *A, cv *out) {
    cv_list *in, *res;
    if (chat_iterate(R, line, x, &in) || make_list(R, line, in->n, &res, out)) return -1;
    const cv_str *path;
    if (arg_str(R, line, A, -1, "attribute", &path)) return -1;
    if (path) {
        cv def = cv_undef(NULL);
        chat_arg(A, -1, "default", &def);
        for (size_t i = 0; i < in->n; i++) {
            cv v = attr_path(R, in->items[i], path);
            res->items[i] = v.t == CV_UNDEF ? def : v;
        }
        return 0;
    }
    cv name;
    if (!chat_arg(A, 0, NULL, &name) || name.t != CV_STR)
        return chat_rfail(R, line, "map needs a filter name or attribute=");
    int f = chat_filter_id(name.s->p);
    if (f < 0) return chat_rfail(R, line, "no filter named '%s'", name.s->p);
    chat_args fargs = {A->v + 1, A->kw + 1, A->n - 1};
    for (size_t i = 0; i < in->n; i++)
        if (chat_apply_filter(R, line, f, in->items[i], &fargs, &res->items[i])) return -1;
    return 0;
}

static int filter_sort(chat_render *R, int line, int id, cv x, const chat_args *A, cv *out) {
    cv_list *in;
    if (chat_iterate(R, line, x, &in)) return -1;
    const cv_str *path = NULL;
    bool ignore_case = !arg_bool(A, id == F_sort ? 1 : 0, "case_sensitive", false);
    if (arg_str(R, line, A, id == F_sort ? 2 : 1, "attribute", &path)) return -1;
    sort_ctx S = {R, line, ignore_case, id == F_sort && arg_bool(A, 0, "reverse", false)};
    sort_item *it = malloc((in->n ? in->n : 1) * sizeof *it);
    if (!it) return chat_oom(R, line);
    for (size_t i = 0; i < in->n; i++) {
        it[i].val = in->items[i];
        it[i].key = path ? attr_path(R, in->items[i], path) : in->items[i];
    }
    int rc = 0;
    if (id == F_sort) {
        rc = sort_items(&S, it, in->n);
        cv_list *res;
        if (!rc) rc = make_list(R, line, in->n, &res, out);
        for (size_t i = 0; !rc && i < in->n; i++) res->items[i] = it[i].val;
    } else if (in->n == 0) {
        *out = cv_undef(NULL);
    } else {
        size_t best = 0;
        for (size_t i = 1; i < in->n && !rc; i++) {
            int c;
            rc = chat_compare(R, line, it[i].key, it[best].key, ignore_case, &c);
            if (!rc && (id == F_max ? c > 0 : c < 0)) best = i;
        }
        *out = it[best].val;
    }
    free(it);
    return rc;
}

static int filter_dictsort(chat_render *R, int line, cv x, const chat_args *A, cv *out) {
    if (x.t != CV_DICT)
        return chat_rfail(R, line, "dictsort needs a dict, not %s", chat_type_name(x));
    bool ignore_case = !arg_bool(A, 0, "case_sensitive", false);
    const cv_str *by = NULL;
    if (arg_str(R, line, A, 1, "by", &by)) return -1;
    bool by_value = by && by->len == 5 && memcmp(by->p, "value", 5) == 0;
    if (by && !by_value && !(by->len == 3 && memcmp(by->p, "key", 3) == 0))
        return chat_rfail(R, line, "dictsort: 'by' must be 'key' or 'value'");
    sort_ctx S = {R, line, ignore_case, arg_bool(A, 2, "reverse", false)};
    size_t n = x.d->n;
    sort_item *it = malloc((n ? n : 1) * sizeof *it);
    if (!it) return chat_oom(R, line);
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        rc = pair(R, line, x.d->keys[i], x.d->vals[i], &it[i].val);
        it[i].key = by_value ? x.d->vals[i] : x.d->keys[i];
    }
    if (!rc) rc = sort_items(&S, it, n);
    cv_list *res;
    if (!rc) rc = make_list(R, line, n, &res, out);
    for (size_t i = 0; !rc && i < n; i++) res->items[i] = it[i].val;
    free(it);
    return rc;
}

static int filter_unique(chat_render *R, int line, cv x, const chat_args *A, cv *out) {
    cv_list *in, *res;
    if (chat_iterate(R, line, x, &in) || make_list(R, line, in->n, &res, out)) return -1;
    bool ignore_case = !arg_bool(A, 0, "case_sensitive", false);
    const cv_str *path = NULL;
    if (arg_str(R, line, A, 1, "attribute", &path)) return -1;
    cv *seen = malloc((in->n ? in->n : 1) * sizeof *seen);
    if (!seen) return chat_oom(R, line);
    res->n = 0;
    for (size_t i = 0; i < in->n; i++) {
        cv key = fold_case(R, path ? attr_path(R, in->items[i], path) : in->items[i], ignore_case);
        bool dup = false;
        for (size_t j = 0; j < res->n && !dup; j++) {
            if (chat_equal(R, line, seen[j], key, &dup)) {
                free(seen);
                return -1;
            }
        }
        if (dup) continue;
        seen[res->n] = key;
        res->items[res->n++] = in->items[i];
    }
    free(seen);
    return 0;
}

static int filter_tojson(chat_render *R, int line, cv x, const chat_args *A, cv *out) {
    int64_t indent = -1;
    cv v;
    if (chat_arg(A, 0, "indent", &v) && v.t != CV_NONE) {
        if (v.t != CV_INT) return chat_rfail(R, line, "tojson: indent must be an integer");
        indent = v.i < 0 ? 0 : v.i > 64 ? 64 : v.i;
    }
    if (arg_bool(A, -1, "ensure_ascii", false))
        return chat_rfail(R, line, "tojson: ensure_ascii=True is not supported");
    const char *item_sep = indent >= 0 ? "," : ", ", *key_sep = ": ";
    if (chat_arg(A, -1, "separators", &v) && v.t != CV_NONE) {
        if (v.t != CV_LIST || v.l->n != 2 || v.l->items[0].t != CV_STR || v.l->items[1].t != CV_STR)
            return chat_rfail(R, line, "tojson: separators must be a pair of strings");
        item_sep = v.l->items[0].s->p;
        key_sep = v.l->items[1].s->p;
    }
    chat_buf b = {.limit = CHAT_MAX_OUTPUT};
    char msg[256] = "value too large";
    if (chat_to_json(&b, x, (int)indent, item_sep, key_sep, arg_bool(A, -1, "sort_keys", false), 0,
                     msg, sizeof msg)) {
        free(b.p);
        return chat_rfail(R, line, "%s", msg);
    }
    return buf_done(R, line, &b, 0, out);
}

/* Jinja's indent: every line but the first (unless first=True) and blank ones (unless
 * blank=True) gets the prefix. */
static int filter_indent(chat_render *R, int line, const cv_str *s, const chat_args *A, cv *out) {
    char spaces[257];
    const char *prefix = spaces;
    size_t plen;
    cv w;
    if (chat_arg(A, 0, "width", &w) && w.t == CV_STR) {
        prefix = w.s->p;
        plen = w.s->len;
    } else {
        int64_t width;
        if (arg_int(R, line, A, 0, "width", 4, &width)) return -1;
        plen = width < 0 ? 0 : width > 256 ? 256 : (size_t)width;
        memset(spaces, ' ', plen);
    }
    bool first = arg_bool(A, 1, "first", false), blank = arg_bool(A, 2, "blank", false);
    chat_buf b = {0};
    int rc = 0;
    size_t i = 0;
    for (int ln = 0; i < s->len || ln == 0; ln++) {
        size_t e = i;
        while (e < s->len && s->p[e] != '\n' && s->p[e] != '\r') e++;
        size_t nl =
            e < s->len ? (s->p[e] == '\r' && e + 1 < s->len && s->p[e + 1] == '\n' ? 2 : 1) : 0;
        bool empty = e == i;
        if ((ln > 0 || first) && (!empty || blank)) rc |= chat_buf_put(&b, prefix, plen);
        rc |= chat_buf_put(&b, s->p + i, e - i + nl);
        i = e + nl;
        if (i >= s->len) break;
    }
    return buf_done(R, line, &b, rc, out);
}

static int filter_round(chat_render *R, int line, cv x, const chat_args *A, cv *out) {
    int64_t prec;
    if (arg_int(R, line, A, 0, "precision", 0, &prec)) return -1;
    const cv_str *method = NULL;
    if (arg_str(R, line, A, 1, "method", &method)) return -1;
    if (x.t == CV_INT || x.t == CV_BOOL) {
        *out = cv_float((double)(x.t == CV_INT ? x.i : x.b));
        if (!method || strcmp(method->p, "common") == 0) {
            *out = x.t == CV_INT ? x : cv_int(x.b);
            return 0;
        }
    } else if (x.t == CV_FLOAT) {
        *out = x;
    } else {
        return chat_rfail(R, line, "round needs a number, not %s", chat_type_name(x));
    }
    double v = out->f, scale = pow(10.0, (double)prec);
    if (!method || strcmp(method->p, "common") == 0) {
        char buf[512];
        /* printf rounds the exact binary value half-to-even, as Python's round() does. */
        snprintf(buf, sizeof buf, "%.*f", (int)(prec < 0 ? 0 : prec > 300 ? 300 : prec), v);
        *out = cv_float(prec < 0 ? round(v * scale) / scale : strtod(buf, NULL));
    } else if (strcmp(method->p, "floor") == 0) {
        *out = cv_float(floor(v * scale) / scale);
    } else if (strcmp(method->p, "ceil") == 0) {
        *out = cv_float(ceil(v * scale) / scale);
    } else {
        return chat_rfail(R, line, "round: method must be 'common', 'ceil' or 'floor'");
    }
    return 0;
}

static int filter_int(chat_render *R, int line, cv x, const chat_args *A, bool to_float, cv *out) {
    cv def = to_float ? cv_float(0) : cv_int(0);
    chat_arg(A, 0, "default", &def);
    switch (x.t) {
    case CV_INT:
        *out = to_float ? cv_float((double)x.i) : x;
        return 0;
    case CV_BOOL:
        *out = to_float ? cv_float(x.b) : cv_int(x.b);
        return 0;
    case CV_FLOAT:
        if (to_float)
            *out = x;
        else if (isfinite(x.f) && fabs(x.f) < 9.2e18)
            *out = cv_int((int64_t)x.f);
        else
            *out = def;
        return 0;
    case CV_STR: {
        char buf[128];
        snprintf(buf, sizeof buf, "%.*s", (int)(x.s->len < 127 ? x.s->len : 127), x.s->p);
        char *p = buf, *end;
        while (chat_is_space((unsigned char)*p)) p++;
        size_t n = strlen(p);
        while (n && chat_is_space((unsigned char)p[n - 1])) p[--n] = 0;
        if (!to_float) {
            long long v = strtoll(p, &end, 10);
            if (*p && !*end) {
                *out = cv_int(v);
                return 0;
            }
        }
        double f = strtod(p, &end);
        if (*p && !*end && (to_float || (isfinite(f) && fabs(f) < 9.2e18))) {
            *out = to_float ? cv_float(f) : cv_int((int64_t)f);
            return 0;
        }
        *out = def;
        return 0;
    }
    default:
        *out = def;
        return 0;
    }
}

int chat_apply_filter(chat_render *R, int line, int id, cv x, const chat_args *A, cv *out) {
    const cv_str *s, *a1, *a2;
    cv v;
    int64_t n = 0;
    cv_list *l, *res;
    switch (id) {
    case F_abs:
        if (x.t == CV_INT) {
            if (x.i == INT64_MIN) return chat_rfail(R, line, "integer overflow in abs");
            *out = cv_int(x.i < 0 ? -x.i : x.i);
        } else if (x.t == CV_FLOAT) {
            *out = cv_float(fabs(x.f));
        } else if (x.t == CV_BOOL) {
            *out = cv_int(x.b);
        } else {
            return chat_rfail(R, line, "bad operand type for abs(): '%s'", chat_type_name(x));
        }
        return 0;
    case F_attr:
        if (arg_str(R, line, A, 0, "name", &a1)) return -1;
        *out = a1 ? chat_getattr(x, a1->p) : cv_undef(NULL);
        return 0;
    case F_capitalize:
        return text_of(R, line, x, &s) || change_case(R, line, s, CASE_CAPITALIZE, out);
    case F_title:
        return text_of(R, line, x, &s) || change_case(R, line, s, CASE_WORDS, out);
    case F_upper:
        return text_of(R, line, x, &s) || change_case(R, line, s, CASE_UPPER, out);
    case F_lower:
        return text_of(R, line, x, &s) || change_case(R, line, s, CASE_LOWER, out);
    case F_count:
    case F_length:
        if (length_of(R, line, x, &n)) return -1;
        *out = cv_int(n);
        return 0;
    case F_d:
    case F_default:
        *out = x;
        if (x.t == CV_UNDEF || (arg_bool(A, 1, "boolean", false) && !chat_truthy(x))) {
            if (!chat_arg(A, 0, "default_value", out) && make_str(R, line, "", 0, out)) return -1;
        }
        return 0;
    case F_dictsort:
        return filter_dictsort(R, line, x, A, out);
    case F_first:
    case F_last:
        if (chat_iterate(R, line, x, &l)) return -1;
        *out = l->n ? l->items[id == F_first ? 0 : l->n - 1] : cv_undef(NULL);
        return 0;
    case F_float:
        return filter_int(R, line, x, A, true, out);
    case F_int:
        return filter_int(R, line, x, A, false, out);
    case F_format:
        return text_of(R, line, x, &s) || format_percent(R, line, s, A, out);
    case F_indent:
        return text_of(R, line, x, &s) || filter_indent(R, line, s, A, out);
    case F_items:
        if (x.t == CV_UNDEF) return make_list(R, line, 0, &res, out);
        if (x.t != CV_DICT)
            return chat_rfail(R, line, "items needs a dict, not %s", chat_type_name(x));
        if (make_list(R, line, x.d->n, &res, out)) return -1;
        for (size_t i = 0; i < x.d->n; i++)
            if (pair(R, line, x.d->keys[i], x.d->vals[i], &res->items[i])) return -1;
        return 0;
    case F_join: {
        if (chat_iterate(R, line, x, &l)) return -1;
        if (arg_str(R, line, A, 0, "d", &a1)) return -1;
        if (arg_str(R, line, A, 1, "attribute", &a2)) return -1;
        chat_buf b = {.limit = CHAT_MAX_OUTPUT};
        int rc = 0;
        for (size_t i = 0; i < l->n && !rc; i++) {
            if (i && a1) rc = chat_buf_put(&b, a1->p, a1->len);
            if (!rc) rc = chat_to_str(&b, a2 ? attr_path(R, l->items[i], a2) : l->items[i]);
        }
        return buf_done(R, line, &b, rc, out);
    }
    case F_list:
        if (chat_iterate(R, line, x, &l) || make_list(R, line, l->n, &res, out)) return -1;
        if (l->n) memcpy(res->items, l->items, l->n * sizeof(cv));
        return 0;
    case F_map:
        return filter_map(R, line, x, A, out);
    case F_max:
    case F_min:
    case F_sort:
        return filter_sort(R, line, id, x, A, out);
    case F_reject:
        return filter_select(R, line, x, A, false, false, out);
    case F_rejectattr:
        return filter_select(R, line, x, A, true, false, out);
    case F_select:
        return filter_select(R, line, x, A, false, true, out);
    case F_selectattr:
        return filter_select(R, line, x, A, true, true, out);
    case F_replace:
        if (text_of(R, line, x, &s) || arg_str(R, line, A, 0, "old", &a1) ||
            arg_str(R, line, A, 1, "new", &a2) || arg_int(R, line, A, 2, "count", -1, &n))
            return -1;
        if (!a1 || !a2) return chat_rfail(R, line, "replace needs two strings");
        return replace(R, line, s, a1, a2, n, out);
    case F_reverse:
        if (x.t == CV_STR) {
            chat_buf b = {0};
            int rc = 0;
            for (size_t e = x.s->len; e > 0 && !rc;) {
                size_t k = e - 1;
                while (k > 0 && ((unsigned char)x.s->p[k] & 0xC0) == 0x80 && e - k < 4) k--;
                rc = chat_buf_put(&b, x.s->p + k, e - k);
                e = k;
            }
            return buf_done(R, line, &b, rc, out);
        }
        if (chat_iterate(R, line, x, &l) || make_list(R, line, l->n, &res, out)) return -1;
        for (size_t i = 0; i < l->n; i++) res->items[i] = l->items[l->n - 1 - i];
        return 0;
    case F_round:
        return filter_round(R, line, x, A, out);
    case F_safe:
        *out = x;
        return 0;
    case F_string:
        return chat_stringify(R, line, x, out);
    case F_sum: {
        if (chat_iterate(R, line, x, &l) || arg_str(R, line, A, 0, "attribute", &a1)) return -1;
        cv acc = cv_int(0);
        chat_arg(A, 1, "start", &acc);
        for (size_t i = 0; i < l->n; i++) {
            v = a1 ? attr_path(R, l->items[i], a1) : l->items[i];
            if (v.t == CV_FLOAT || acc.t == CV_FLOAT) {
                double p = acc.t == CV_FLOAT ? acc.f : (double)acc.i;
                double q = v.t == CV_FLOAT ? v.f : v.t == CV_INT ? (double)v.i : v.b;
                if (v.t != CV_FLOAT && v.t != CV_INT && v.t != CV_BOOL) goto sum_type;
                acc = cv_float(p + q);
            } else if (v.t == CV_INT || v.t == CV_BOOL) {
                int64_t q = v.t == CV_INT ? v.i : v.b;
                if (__builtin_add_overflow(acc.i, q, &acc.i))
                    return chat_rfail(R, line, "integer overflow in sum");
            } else {
                goto sum_type;
            }
        }
        *out = acc;
        return 0;
    sum_type:
        return chat_rfail(R, line, "sum: unsupported operand type '%s'", chat_type_name(v));
    }
    case F_tojson:
        return filter_tojson(R, line, x, A, out);
    case F_trim:
        if (text_of(R, line, x, &s) || arg_str(R, line, A, 0, "chars", &a1)) return -1;
        return strip(R, line, s, a1, true, true, out);
    case F_unique:
        return filter_unique(R, line, x, A, out);
    case F_wordcount:
        if (text_of(R, line, x, &s) || split(R, line, s, NULL, -1, &v)) return -1;
        *out = cv_int((int64_t)v.l->n);
        return 0;
    }
    return chat_rfail(R, line, "unknown filter");
}

/* ---- tests ---- */

/* One name a line would be long; clang-format cannot settle on a layout for a packed
 * list, so it leaves this one alone. */
/* clang-format off */
#define TESTS(X) \
    X(boolean) X(callable) X(defined) X(divisibleby) X(eq) X(equalto) X(escaped) X(even) \
    X(false) X(float) X(ge) X(greaterthan) X(gt) X(in) X(integer) X(iterable) \
    X(le) X(lessthan) X(lower) X(lt) X(mapping) X(ne) X(none) X(number) \
    X(odd) X(sameas) X(sequence) X(string) X(true) X(undefined) X(upper)
/* clang-format on */

#define TEST_ENUM(n) TS_##n,
enum { TESTS(TEST_ENUM) TS_COUNT };
#define TEST_NAME(n) #n,
static const char *const g_tests[] = {TESTS(TEST_NAME)};

int chat_test_id(const char *name) {
    if (strcmp(name, "==") == 0) return TS_eq;
    for (int i = 0; i < TS_COUNT; i++)
        if (strcmp(name, g_tests[i]) == 0) return i;
    return -1;
}

static bool is_int_like(cv v) {
    return v.t == CV_INT || v.t == CV_BOOL;
}

int chat_apply_test(chat_render *R, int line, int id, cv x, const chat_args *A, bool *out) {
    cv y = cv_undef(NULL);
    bool has = chat_arg(A, 0, NULL, &y);
    int c;
    switch (id) {
    case TS_boolean:
        *out = x.t == CV_BOOL;
        return 0;
    case TS_callable:
        *out = x.t == CV_MACRO || x.t == CV_FUNC;
        return 0;
    case TS_defined:
        *out = x.t != CV_UNDEF;
        return 0;
    case TS_undefined:
        *out = x.t == CV_UNDEF;
        return 0;
    case TS_escaped:
        *out = false;
        return 0;
    case TS_none:
        *out = x.t == CV_NONE;
        return 0;
    case TS_false:
        *out = x.t == CV_BOOL && !x.b;
        return 0;
    case TS_true:
        *out = x.t == CV_BOOL && x.b;
        return 0;
    case TS_string:
        *out = x.t == CV_STR;
        return 0;
    case TS_mapping:
        *out = x.t == CV_DICT;
        return 0;
    case TS_number:
        *out = x.t == CV_INT || x.t == CV_FLOAT || x.t == CV_BOOL;
        return 0;
    case TS_integer:
        *out = x.t == CV_INT;
        return 0;
    case TS_float:
        *out = x.t == CV_FLOAT;
        return 0;
    case TS_iterable:
    case TS_sequence:
        *out = x.t == CV_STR || x.t == CV_LIST || x.t == CV_DICT || x.t == CV_UNDEF;
        return 0;
    case TS_lower:
    case TS_upper: {
        if (x.t != CV_STR) {
            *out = false;
            return 0;
        }
        cv t;
        if (change_case(R, line, x.s, id == TS_lower ? CASE_LOWER : CASE_UPPER, &t)) return -1;
        *out = chat_equal_shallow(t, x);
        return 0;
    }
    case TS_odd:
    case TS_even:
        if (!is_int_like(x))
            return chat_rfail(R, line, "test '%s' needs an integer, not %s", g_tests[id],
                              chat_type_name(x));
        *out = (((x.t == CV_INT ? x.i : x.b) % 2) != 0) == (id == TS_odd);
        return 0;
    case TS_divisibleby:
        if (!is_int_like(x) || !has || !is_int_like(y))
            return chat_rfail(R, line, "divisibleby needs integers");
        if ((y.t == CV_INT ? y.i : y.b) == 0)
            return chat_rfail(R, line, "divisibleby: division by zero");
        *out = (x.t == CV_INT ? x.i : x.b) % (y.t == CV_INT ? y.i : y.b) == 0;
        return 0;
    case TS_eq:
    case TS_equalto:
        return chat_equal(R, line, x, y, out);
    case TS_ne:
        if (chat_equal(R, line, x, y, out)) return -1;
        *out = !*out;
        return 0;
    case TS_sameas: /* Python's `is`: the same string, list or dict, an equal scalar */
        *out = x.t == y.t && (x.t != CV_STR || x.s == y.s) && chat_equal_shallow(x, y);
        return 0;
    case TS_in: {
        if (y.t == CV_STR) {
            if (x.t != CV_STR)
                return chat_rfail(R, line, "'in <string>' requires string as left operand");
            *out = find_bytes(y.s->p, y.s->len, x.s->p, x.s->len) != NULL;
            return 0;
        }
        if (y.t == CV_DICT || y.t == CV_NS) {
            *out = chat_dict_find(y.d, x) != NULL;
            return 0;
        }
        cv_list *l;
        if (chat_iterate(R, line, y, &l)) return -1;
        *out = false;
        for (size_t i = 0; i < l->n && !*out; i++)
            if (chat_equal(R, line, l->items[i], x, out)) return -1;
        return 0;
    }
    case TS_lt:
    case TS_lessthan:
    case TS_le:
    case TS_gt:
    case TS_greaterthan:
    case TS_ge:
        if (chat_compare(R, line, x, y, false, &c)) return -1;
        *out = id == TS_lt || id == TS_lessthan ? c < 0
               : id == TS_le                    ? c <= 0
               : id == TS_ge                    ? c >= 0
                                                : c > 0;
        return 0;
    }
    return chat_rfail(R, line, "unknown test");
}

/* ---- methods ---- */

static bool name_is(const char *a, const char *b) {
    return strcmp(a, b) == 0;
}

/* startswith / endswith with a string or a tuple of strings. */
static int affix(chat_render *R, int line, const cv_str *s, const chat_args *A, bool end, cv *out) {
    cv p;
    if (!chat_arg(A, 0, NULL, &p))
        return chat_rfail(R, line, "%s needs an argument", end ? "endswith" : "startswith");
    cv_list one = {1, &p, false};
    const cv_list *l = p.t == CV_LIST ? p.l : &one;
    for (size_t i = 0; i < l->n; i++) {
        cv q = l->items[i];
        if (q.t != CV_STR)
            return chat_rfail(R, line, "%s: argument must be str, not %s",
                              end ? "endswith" : "startswith", chat_type_name(q));
        if (q.s->len <= s->len &&
            memcmp(end ? s->p + s->len - q.s->len : s->p, q.s->p, q.s->len) == 0) {
            *out = cv_bool(true);
            return 0;
        }
    }
    *out = cv_bool(false);
    return 0;
}

static int str_predicate(const cv_str *s, const char *name, cv *out) {
    bool all = s->len > 0, any_cased = false, lower = true, upper = true;
    for (size_t i = 0; i < s->len;) {
        int32_t cp;
        i += (size_t)chat_utf8_next((const unsigned char *)s->p + i, s->len - i, &cp);
        utf8proc_category_t c = utf8proc_category(cp);
        bool alpha = c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO;
        bool digit = c == UTF8PROC_CATEGORY_ND;
        if (is_cased(cp)) {
            any_cased = true;
            if (c != UTF8PROC_CATEGORY_LL) lower = false;
            if (c != UTF8PROC_CATEGORY_LU) upper = false;
        }
        if (name_is(name, "isdigit") && !digit) all = false;
        if (name_is(name, "isalpha") && !alpha) all = false;
        if (name_is(name, "isalnum") && !alpha && !digit) all = false;
        if (name_is(name, "isspace") && !chat_is_space(cp)) all = false;
    }
    if (name_is(name, "islower"))
        *out = cv_bool(any_cased && lower);
    else if (name_is(name, "isupper"))
        *out = cv_bool(any_cased && upper);
    else
        *out = cv_bool(all);
    return 0;
}

static int str_method(chat_render *R, int line, const cv_str *s, const char *name,
                      const chat_args *A, cv *out, bool *found) {
    const cv_str *a1 = NULL, *a2 = NULL;
    int64_t n;
    *found = true;
    if (name_is(name, "strip") || name_is(name, "lstrip") || name_is(name, "rstrip")) {
        if (arg_str(R, line, A, 0, "chars", &a1)) return -1;
        return strip(R, line, s, a1, name[0] != 'r', name[0] != 'l', out);
    }
    if (name_is(name, "startswith")) return affix(R, line, s, A, false, out);
    if (name_is(name, "endswith")) return affix(R, line, s, A, true, out);
    if (name_is(name, "split")) {
        if (arg_str(R, line, A, 0, "sep", &a1) || arg_int(R, line, A, 1, "maxsplit", -1, &n))
            return -1;
        return split(R, line, s, a1, n, out);
    }
    if (name_is(name, "upper")) return change_case(R, line, s, CASE_UPPER, out);
    if (name_is(name, "lower")) return change_case(R, line, s, CASE_LOWER, out);
    if (name_is(name, "title")) return change_case(R, line, s, CASE_TITLE, out);
    if (name_is(name, "capitalize")) return change_case(R, line, s, CASE_CAPITALIZE, out);
    if (name_is(name, "replace")) {
        if (arg_str(R, line, A, 0, "old", &a1) || arg_str(R, line, A, 1, "new", &a2) ||
            arg_int(R, line, A, 2, "count", -1, &n))
            return -1;
        if (!a1 || !a2) return chat_rfail(R, line, "replace needs two strings");
        return replace(R, line, s, a1, a2, n, out);
    }
    if (name_is(name, "format")) return format_braces(R, line, s, A, out);
    if (name_is(name, "join")) {
        cv seq;
        cv_list *l;
        if (!chat_arg(A, 0, NULL, &seq)) return chat_rfail(R, line, "join needs an argument");
        if (chat_iterate(R, line, seq, &l)) return -1;
        chat_buf b = {.limit = CHAT_MAX_OUTPUT};
        int rc = 0;
        for (size_t i = 0; i < l->n && !rc; i++) {
            if (i) rc = chat_buf_put(&b, s->p, s->len);
            if (!rc) rc = chat_to_str(&b, l->items[i]);
        }
        return buf_done(R, line, &b, rc, out);
    }
    if (name_is(name, "find") || name_is(name, "count")) {
        if (arg_str(R, line, A, 0, "sub", &a1)) return -1;
        if (!a1) return chat_rfail(R, line, "%s needs a string", name);
        if (name[0] == 'f') {
            const char *hit = find_bytes(s->p, s->len, a1->p, a1->len);
            *out = cv_int(hit ? (int64_t)chat_utf8_count(s->p, (size_t)(hit - s->p)) : -1);
            return 0;
        }
        int64_t c = 0;
        if (a1->len == 0) {
            c = (int64_t)chat_utf8_count(s->p, s->len) + 1;
        } else {
            for (const char *p = s->p, *e = s->p + s->len;
                 (p = find_bytes(p, (size_t)(e - p), a1->p, a1->len)); p += a1->len)
                c++;
        }
        *out = cv_int(c);
        return 0;
    }
    if (strncmp(name, "is", 2) == 0 &&
        (name_is(name, "isdigit") || name_is(name, "isalpha") || name_is(name, "isalnum") ||
         name_is(name, "isspace") || name_is(name, "islower") || name_is(name, "isupper")))
        return str_predicate(s, name, out);
    *found = false;
    return 0;
}

static int dict_method(chat_render *R, int line, const cv_dict *d, const char *name,
                       const chat_args *A, cv *out, bool *found) {
    cv_list *l;
    *found = true;
    if (name_is(name, "get")) {
        cv key;
        if (!chat_arg(A, 0, "key", &key)) return chat_rfail(R, line, "get needs a key");
        cv *hit = chat_dict_find(d, key);
        if (hit)
            *out = *hit;
        else if (!chat_arg(A, 1, "default", out))
            *out = cv_none();
        return 0;
    }
    if (name_is(name, "keys") || name_is(name, "values") || name_is(name, "items")) {
        if (make_list(R, line, d->n, &l, out)) return -1;
        for (size_t i = 0; i < d->n; i++) {
            if (name[0] == 'k')
                l->items[i] = d->keys[i];
            else if (name[0] == 'v')
                l->items[i] = d->vals[i];
            else if (pair(R, line, d->keys[i], d->vals[i], &l->items[i]))
                return -1;
        }
        return 0;
    }
    *found = false;
    return 0;
}

int chat_call_method(chat_render *R, int line, cv obj, const char *name, const chat_args *A,
                     cv *out, bool *found) {
    *found = false;
    if (obj.t == CV_STR) return str_method(R, line, obj.s, name, A, out, found);
    if (obj.t == CV_DICT) return dict_method(R, line, obj.d, name, A, out, found);
    return 0;
}

/* ---- global functions ---- */

static const char *const g_globals[CG_COUNT] = {"range", "namespace", "dict", "raise_exception",
                                                "strftime_now"};

int chat_global_id(const char *name) {
    for (int i = 0; i < CG_COUNT; i++)
        if (strcmp(name, g_globals[i]) == 0) return i;
    return -1;
}

static int global_range(chat_render *R, int line, const chat_args *A, cv *out) {
    int np = chat_positional_count(A);
    int64_t v[3] = {0, 0, 1};
    if (np < 1 || np > 3) return chat_rfail(R, line, "range expects 1 to 3 arguments");
    for (int k = 0; k < np; k++) {
        cv a;
        chat_arg(A, k, NULL, &a);
        if (!is_int_like(a))
            return chat_rfail(R, line, "range: '%s' object cannot be interpreted as an integer",
                              chat_type_name(a));
        v[np == 1 ? 1 : k] = a.t == CV_INT ? a.i : a.b;
    }
    int64_t start = v[0], stop = v[1], step = v[2];
    if (step == 0) return chat_rfail(R, line, "range: step must not be zero");
    uint64_t count = 0;
    if (step > 0 && start < stop)
        count = ((uint64_t)stop - (uint64_t)start - 1) / (uint64_t)step + 1;
    if (step < 0 && start > stop)
        count = ((uint64_t)start - (uint64_t)stop - 1) / (uint64_t)(-(step + 1) + 1) + 1;
    if (count > CHAT_MAX_MEMORY / sizeof(cv)) return chat_oom(R, line);
    cv_list *l;
    if (make_list(R, line, (size_t)count, &l, out)) return -1;
    for (uint64_t k = 0; k < count; k++) l->items[k] = cv_int(start + (int64_t)k * step);
    return 0;
}

/* namespace(mapping?, **kw) and dict(mapping?, **kw). */
static int global_mapping(chat_render *R, int line, const chat_args *A, bool ns, cv *out) {
    cv_dict *d = chat_dict_new(&R->a, (size_t)A->n + 4);
    if (!d) return chat_oom(R, line);
    for (int k = 0; k < A->n; k++) {
        cv a = A->v[k];
        if (A->kw[k]) {
            cv key;
            if (make_str(R, line, A->kw[k], strlen(A->kw[k]), &key) ||
                chat_dict_set(&R->a, d, key, a))
                return chat_oom(R, line);
        } else if (a.t == CV_DICT || a.t == CV_NS) {
            for (size_t i = 0; i < a.d->n; i++)
                if (chat_dict_set(&R->a, d, a.d->keys[i], a.d->vals[i])) return chat_oom(R, line);
        } else {
            return chat_rfail(R, line, "%s: positional argument must be a mapping",
                              ns ? "namespace" : "dict");
        }
    }
    out->t = ns ? CV_NS : CV_DICT;
    out->d = d;
    return 0;
}

int chat_call_global(chat_render *R, int line, int fn, const chat_args *A, cv *out) {
    cv a;
    switch (fn) {
    case CG_RANGE:
        return global_range(R, line, A, out);
    case CG_NAMESPACE:
        return global_mapping(R, line, A, true, out);
    case CG_DICT:
        return global_mapping(R, line, A, false, out);
    case CG_RAISE: {
        chat_buf b = {.limit = 512};
        if (chat_arg(A, 0, NULL, &a)) chat_to_str(&b, a);
        chat_rfail(R, line, "raise_exception: %s", b.p ? b.p : "");
        free(b.p);
        return -1;
    }
    case CG_STRFTIME: {
        if (!chat_arg(A, 0, NULL, &a) || a.t != CV_STR)
            return chat_rfail(R, line, "strftime_now needs a format string");
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        char buf[512];
        size_t n = strftime(buf, sizeof buf, a.s->p, &tm);
        return make_str(R, line, buf, n, out);
    }
    }
    return chat_rfail(R, line, "unknown function");
}
