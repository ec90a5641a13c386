/* Shared by the chat module's files only: the arena, runtime values, the syntax tree, and
 * the lexer/parser/renderer entry points. Other modules include chat.h. */
#ifndef MLXCEL_CHAT_INTERNAL_H
#define MLXCEL_CHAT_INTERNAL_H

#include "chat/chat.h"

#include <stdio.h>

/* ---- arena: every allocation of one compile or one render, freed at once ---- */

typedef struct chat_chunk chat_chunk;
typedef struct chat_arena {
    chat_chunk *head;
    size_t used;  /* bytes handed out so far */
    size_t limit; /* a request past this fails (0 = no limit) */
} chat_arena;

/* Zeroed memory, or NULL past the limit or out of memory. */
void *chat_alloc(chat_arena *a, size_t n);
void chat_arena_free(chat_arena *a);

/* ---- values ---- */

typedef enum {
    CV_UNDEF = 0,
    CV_NONE,
    CV_BOOL,
    CV_INT,
    CV_FLOAT,
    CV_STR,
    CV_LIST,
    CV_DICT,
    CV_NS,    /* namespace(): a dict whose attributes `set` may assign */
    CV_LOOP,  /* the `loop` object of the innermost for */
    CV_MACRO, /* a {% macro %} */
    CV_FUNC,  /* a global function: range, namespace, dict, raise_exception, strftime_now */
} cv_type;

typedef struct cv cv;
typedef struct cv_str {
    const char *p; /* (len) bytes of UTF-8, not owned; NUL-terminated when made here */
    size_t len;
} cv_str;
typedef struct cv_list {
    size_t n;
    cv *items; /* (n) */
    bool tuple;
} cv_list;
typedef struct cv_dict {
    size_t n, cap;
    cv *keys; /* (cap), first n used, insertion order; never lists or dicts (chat_dict_key),
                 so that finding a key never looks inside values */
    cv *vals; /* (cap) */
} cv_dict;
typedef struct chat_loop chat_loop;
typedef struct cnode cnode;

struct cv {
    cv_type t;
    union {
        bool b;
        int64_t i;
        double f;
        const cv_str *s;
        cv_list *l;
        cv_dict *d;            /* CV_DICT and CV_NS */
        const chat_loop *loop; /* CV_LOOP */
        const cnode *macro;    /* CV_MACRO */
        int fn;                /* CV_FUNC: a chat_global */
        const char *name;      /* CV_UNDEF: the missing name, for messages (may be NULL) */
    };
};

struct chat_loop {
    const cv_list *items; /* the (filtered) sequence being iterated */
    size_t i;             /* current index0 */
};

enum chat_global { CG_RANGE, CG_NAMESPACE, CG_DICT, CG_RAISE, CG_STRFTIME, CG_COUNT };

static inline cv cv_undef(const char *name) {
    cv v = {.t = CV_UNDEF};
    v.name = name;
    return v;
}
static inline cv cv_none(void) {
    return (cv){.t = CV_NONE};
}
static inline cv cv_bool(bool b) {
    cv v = {.t = CV_BOOL};
    v.b = b;
    return v;
}
static inline cv cv_int(int64_t i) {
    cv v = {.t = CV_INT};
    v.i = i;
    return v;
}
static inline cv cv_float(double f) {
    cv v = {.t = CV_FLOAT};
    v.f = f;
    return v;
}

/* Growable byte buffer (malloc'd) with a size cap; a write past the cap fails. */
typedef struct chat_buf {
    char *p; /* (cap) */
    size_t len, cap, limit;
} chat_buf;
int chat_buf_put(chat_buf *b, const char *s, size_t n);
int chat_buf_puts(chat_buf *b, const char *s);
int chat_buf_printf(chat_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Value helpers (chat_value.c). Those that allocate return NULL / -1 when the arena is
 * exhausted; the caller reports the memory limit. */
cv_str *chat_str_new(chat_arena *a, const char *p, size_t len); /* copies */
/* A string of len bytes (NUL-terminated) that the caller fills through *bytes. */
cv_str *chat_str_alloc(chat_arena *a, size_t len, char **bytes);
cv chat_str_value(chat_arena *a, const char *p, size_t len); /* CV_UNDEF on no memory */
cv_list *chat_list_new(chat_arena *a, size_t n);
cv_dict *chat_dict_new(chat_arena *a, size_t cap);
/* Sets key to val (replacing an equal key in place). */
int chat_dict_set(chat_arena *a, cv_dict *d, cv key, cv val);
/* Pointer to the value under a string key, or NULL. */
cv *chat_dict_get(const cv_dict *d, const char *key, size_t len);
cv *chat_dict_find(const cv_dict *d, cv key);
/* Whether v may be a dict key: what Python hashes without looking inside (None, booleans,
 * numbers, strings, undefined). */
bool chat_dict_key(cv v);
bool chat_truthy(cv v);
/* Python == where neither a nor b holds other values; lists and dicts compare by identity
 * (chat_equal looks inside them). */
bool chat_equal_shallow(cv a, cv b);
const char *chat_type_name(cv v);
/* Python str() of v appended to b (strings as they are, None as "None", lists as repr). */
int chat_to_str(chat_buf *b, cv v);
/* Python repr(). */
int chat_repr(chat_buf *b, cv v);
/* json.dumps(v, ensure_ascii=False, indent, separators, sort_keys) as transformers' tojson;
 * indent < 0 means none. Fails (with msg) for values JSON cannot hold. */
int chat_to_json(chat_buf *b, cv v, int indent, const char *item_sep, const char *key_sep,
                 bool sort_keys, int depth, char *msg, size_t msg_size);
/* Python float repr ("1.0", "0.1", "1e-05"). */
void chat_float_repr(double f, char *out, size_t size);
/* Converts JSON to a value; strings point into the json_t, which must outlive the value. */
int chat_from_json(chat_arena *a, const json_t *j, cv *out);

/* UTF-8 helpers: decode one code point at s (n bytes left), returning its byte length;
 * invalid bytes decode as themselves, one at a time. */
int chat_utf8_next(const unsigned char *s, size_t n, int32_t *cp);
size_t chat_utf8_count(const char *s, size_t len);
bool chat_is_space(int32_t cp); /* Python str.isspace */

/* ---- syntax tree ---- */

typedef enum {
    /* expressions */
    N_CONST,
    N_NAME,
    N_LIST,
    N_TUPLE,
    N_DICT,   /* args: key0, val0, key1, val1, ... */
    N_ATTR,   /* a.name */
    N_ITEM,   /* a[b] */
    N_SLICE,  /* a[b:c:d], each of b, c, d may be NULL */
    N_CALL,   /* a(args) */
    N_FILTER, /* a | id(args) */
    N_TEST,   /* a is [not] id(args) */
    N_NEG,
    N_POS,
    N_NOT,
    N_BIN, /* a op b: arithmetic, ~ */
    N_CMP, /* args[0] ops[0] args[1] ops[1] args[2] ... (chained like Python) */
    N_AND,
    N_OR,
    N_COND, /* b if a else c (c may be NULL) */
    /* statements */
    S_TEXT,
    S_OUT,
    S_IF,    /* if a: body else alt */
    S_FOR,   /* for names in a if b: body else alt */
    S_SET,   /* names = b, or a.name = b (a namespace), or names = capture of body */
    S_MACRO, /* name(names = args defaults) body */
    S_BREAK,
    S_CONTINUE,
    S_FILTER, /* body | b (an N_FILTER whose operand a is NULL) */
    S_BLOCK,  /* body as it is ({% generation %}) */
} cnode_kind;

enum {
    OP_ADD = 1,
    OP_SUB,
    OP_MUL,
    OP_DIV,
    OP_FLOORDIV,
    OP_MOD,
    OP_POW,
    OP_CONCAT,
    OP_EQ,
    OP_NE,
    OP_LT,
    OP_LE,
    OP_GT,
    OP_GE,
    OP_IN,
    OP_NOTIN,
};

struct cnode {
    cnode_kind kind;
    int line;
    int op; /* N_BIN */
    int id; /* N_FILTER / N_TEST: the filter or test */
    bool negate;
    const char *name; /* N_NAME, N_ATTR, S_MACRO, S_SET attribute */
    cnode *a, *b, *c, *d;
    cnode **args; /* (n_args): positional then keyword arguments, list items, dict pairs */
    int n_args;
    const char **kw;    /* (n_args): keyword name of args[i], NULL for positional */
    int *ops;           /* (n_args - 1): N_CMP operators */
    const char **names; /* (n_names): for/set targets, macro parameters */
    int n_names;
    cnode **body; /* (n_body) */
    int n_body;
    cnode **alt; /* (n_alt) */
    int n_alt;
    cv val; /* N_CONST, S_TEXT */
};

struct chat_template {
    chat_arena arena; /* holds the tree and its strings */
    cnode **body;     /* (n_body) */
    int n_body;
};

/* ---- lexer (chat_lex.c) ---- */

typedef enum {
    T_EOF = 0,
    T_TEXT,
    T_VAR_BEGIN,
    T_VAR_END,
    T_BLOCK_BEGIN,
    T_BLOCK_END,
    T_NAME,
    T_STRING,
    T_INT,
    T_FLOAT,
    T_OP, /* op: a character, or OP_POW / OP_FLOORDIV / OP_EQ / OP_NE / OP_LE / OP_GE */
} ctok_type;

typedef struct ctok {
    ctok_type t;
    int line, col; /* in the source as written */
    const char *s; /* T_TEXT, T_NAME, T_STRING: NUL-terminated, in the arena */
    size_t len;    /* of s */
    int op;        /* T_OP */
    int64_t i;     /* T_INT */
    double f;      /* T_FLOAT */
} ctok;

/* Tokens of source, ending with T_EOF; *toks is malloc'd (caller frees), their strings live
 * in a. */
int chat_lex(chat_arena *a, const char *source, ctok **toks, int *n, base_err *err);

/* ---- rendering (chat_render.c) and the builtins (chat_builtins.c) ---- */

typedef struct chat_scope chat_scope;
typedef struct chat_render {
    chat_arena a; /* every value of this render */
    base_err *err;
    int depth;        /* nested evaluations, bounded by CHAT_MAX_DEPTH */
    uint32_t steps;   /* expressions and statements evaluated, bounded by CHAT_MAX_STEPS */
    chat_scope *root; /* the render variables and top-level sets */
} chat_render;

/* Evaluated call arguments: v[i] is keyword argument kw[i], or positional when kw[i] is
 * NULL. */
typedef struct chat_args {
    cv *v;           /* (n) */
    const char **kw; /* (n) */
    int n;
} chat_args;

/* "template line N: <msg>" into R->err; returns -1. */
int chat_rfail(chat_render *R, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int chat_oom(chat_render *R, int line);
/* Positional argument `pos` or keyword `name` (either may be -1 / NULL); false when absent. */
bool chat_arg(const chat_args *A, int pos, const char *name, cv *out);
int chat_positional_count(const chat_args *A);
/* str(v) as a string value. */
int chat_stringify(chat_render *R, int line, cv v, cv *out);
/* The sequence `for` iterates over v: lists as they are, dict keys, string characters,
 * nothing for undefined. */
int chat_iterate(chat_render *R, int line, cv v, cv_list **out);
/* Python == into *out. A loop can wrap a list in itself any number of times, or double it
 * (sharing the items, so that two such lists have 2^n pairs to compare): values nested
 * deeper than CHAT_MAX_DEPTH fail, and each pair of lists or dicts looked at is a step of the
 * render. */
int chat_equal(chat_render *R, int line, cv a, cv b, bool *out);
/* Python ordering for sort, min, max, dictsort and the < > operators; *c is -1, 0 or 1.
 * Bounded as chat_equal. */
int chat_compare(chat_render *R, int line, cv a, cv b, bool ignore_case, int *c);
/* obj.name (attribute first, then item) and obj[key]. */
cv chat_getattr(cv obj, const char *name);
cv chat_getitem(chat_render *R, cv obj, cv key);

int chat_filter_id(const char *name); /* -1 when unknown */
int chat_test_id(const char *name);
int chat_global_id(const char *name);
int chat_apply_filter(chat_render *R, int line, int id, cv x, const chat_args *A, cv *out);
int chat_apply_test(chat_render *R, int line, int id, cv x, const chat_args *A, bool *out);
/* Method calls on strings and dicts (s.strip(), d.items(), ...); *found false when `name` is
 * no method of obj's type. */
int chat_call_method(chat_render *R, int line, cv obj, const char *name, const chat_args *A,
                     cv *out, bool *found);
int chat_call_global(chat_render *R, int line, int fn, const chat_args *A, cv *out);

#endif
