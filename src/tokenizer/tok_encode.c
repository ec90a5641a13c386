/* Encoding: added-token split, normalizers, pre-tokenizers, BPE per word, post-processor.
 *
 * As in the reference: the raw text is first cut around added tokens that match before
 * normalization; every other section is normalized on its own, cut around added tokens that
 * match after normalization, pre-tokenized into words, and each word goes through BPE. */
#include "tokenizer/tok_internal.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ---- the byte-to-character map of byte-level BPE (GPT-2) ---- */

/* Printable bytes stand for themselves; the 68 others (0-32, 127-160, 173) take the code points
 * from 256 up, in byte order. */
static int32_t byte_to_cp(unsigned char b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return b;
    if (b <= 32) return 256 + b;
    if (b <= 160) return 256 + 33 + (b - 127);
    return 256 + 67;
}

/* ---- normalizers ---- */

static void cp_put(tok_buf *out, int32_t cp) {
    char enc[4];
    tok_buf_put(out, enc, tok_utf8_put(enc, cp));
}

static int unicode_form(const tok_normalizer *nm, const char *s, size_t n, tok_buf *out,
                        base_err *err) {
    static const int opts[] = {
        [TOK_NORM_NFC] = UTF8PROC_STABLE | UTF8PROC_COMPOSE,
        [TOK_NORM_NFD] = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE,
        [TOK_NORM_NFKC] = UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT,
        [TOK_NORM_NFKD] = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT,
    };
    if (n == 0) return 0;
    utf8proc_uint8_t *res = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &res,
                                      (utf8proc_option_t)opts[nm->type]);
    if (r < 0) return base_fail(err, "normalizer: %s", utf8proc_errmsg(r));
    tok_buf_put(out, (const char *)res, (size_t)r);
    free(res);
    return 0;
}

static void replace_all(const tok_pattern *pat, const char *content, size_t content_len,
                        const char *s, size_t n, pcre2_match_data *md, tok_buf *out) {
    size_t at = 0, ms, me;
    while (tok_pattern_find(pat, s, n, at, md, &ms, &me)) {
        tok_buf_put(out, s + at, ms - at);
        tok_buf_put(out, content, content_len);
        at = me;
    }
    tok_buf_put(out, s + at, n - at);
}

static int normalize_one(const tok_normalizer *nm, const char *s, size_t n, tok_buf *out,
                         pcre2_match_data *md, base_err *err) {
    switch (nm->type) {
    case TOK_NORM_NFC:
    case TOK_NORM_NFD:
    case TOK_NORM_NFKC:
    case TOK_NORM_NFKD:
        return unicode_form(nm, s, n, out, err);
    case TOK_NORM_LOWERCASE:
    case TOK_NORM_STRIP_ACCENTS:
        for (size_t i = 0; i < n;) {
            size_t l;
            int32_t cp = tok_utf8_cp(s + i, &l);
            if (nm->type == TOK_NORM_LOWERCASE)
                cp_put(out, utf8proc_tolower(cp));
            else if (utf8proc_category(cp) != UTF8PROC_CATEGORY_MN)
                tok_buf_put(out, s + i, l);
            i += l;
        }
        return 0;
    case TOK_NORM_STRIP: {
        size_t a = 0, b = n, l;
        while (nm->left && a < b && tok_is_space_cp(tok_utf8_cp(s + a, &l))) a += l;
        while (nm->right && b > a) {
            size_t p = b - 1;
            while (p > a && ((unsigned char)s[p] & 0xC0) == 0x80) p--;
            if (!tok_is_space_cp(tok_utf8_cp(s + p, &l))) break;
            b = p;
        }
        tok_buf_put(out, s + a, b - a);
        return 0;
    }
    case TOK_NORM_REPLACE:
        replace_all(&nm->pattern, nm->content, nm->content_len, s, n, md, out);
        return 0;
    case TOK_NORM_PREPEND:
        if (n) tok_buf_put(out, nm->content, nm->content_len);
        tok_buf_put(out, s, n);
        return 0;
    case TOK_NORM_SEQUENCE: {
        tok_buf cur = {0}, next = {0};
        tok_buf_put(&cur, s, n);
        int rc = 0;
        for (size_t i = 0; i < nm->n_items && rc == 0; i++) {
            next.len = 0;
            tok_buf_put(&next, "", 0);
            rc = normalize_one(&nm->items[i], cur.data, cur.len, &next, md, err);
            tok_buf t = cur;
            cur = next;
            next = t;
        }
        if (rc == 0) tok_buf_put(out, cur.data, cur.len);
        free(cur.data);
        free(next.data);
        return rc;
    }
    }
    return base_fail(err, "normalizer: unknown type %d", (int)nm->type);
}

int tok_normalize(const tok_normalizer *nm, const char *s, size_t n, tok_buf *out,
                  pcre2_match_data *md, base_err *err) {
    pcre2_match_data *own = md ? NULL : pcre2_match_data_create(16, NULL);
    int rc = normalize_one(nm, s, n, out, md ? md : own, err);
    if (own) pcre2_match_data_free(own);
    return rc;
}

/* ---- splitting with a behaviour (Split, Digits, Metaspace) ---- */

typedef struct span {
    size_t start, end;
    bool match;
} span;

typedef struct spans {
    span *v; /* (cap) */
    size_t n, cap;
} spans;

static void spans_push(spans *sp, size_t start, size_t end, bool match) {
    if (sp->n == sp->cap) {
        sp->cap = sp->cap ? sp->cap * 2 : 32;
        sp->v = base_xrealloc(sp->v, sp->cap * sizeof *sp->v);
    }
    sp->v[sp->n++] = (span){start, end, match};
}

/* Applies the behaviour to spans covering a piece, pushing the resulting pieces. */
static void emit_split(const char *s, spans *sp, tok_split_behavior behavior, bool invert,
                       tok_pieces *out) {
    if (invert)
        for (size_t i = 0; i < sp->n; i++) sp->v[i].match = !sp->v[i].match;
    size_t n_out = 0;
    bool prev_match = false;
    span *v = sp->v;
    switch (behavior) {
    case TOK_SPLIT_REMOVED:
        for (size_t i = 0; i < sp->n; i++)
            if (!v[i].match) v[n_out++] = v[i];
        break;
    case TOK_SPLIT_ISOLATED:
        n_out = sp->n;
        break;
    case TOK_SPLIT_MERGED_PREV:
    case TOK_SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < sp->n; i++) {
            bool join = behavior == TOK_SPLIT_CONTIGUOUS ? v[i].match == prev_match
                                                         : v[i].match && !prev_match;
            if (join && n_out)
                v[n_out - 1].end = v[i].end;
            else
                v[n_out++] = v[i];
            prev_match = v[i].match;
        }
        break;
    case TOK_SPLIT_MERGED_NEXT: {
        /* Walk backwards so that a match joins the piece after it. */
        size_t w = sp->n;
        for (size_t k = sp->n; k-- > 0;) {
            if (v[k].match && !prev_match && w < sp->n)
                v[w].start = v[k].start;
            else
                v[--w] = v[k];
            prev_match = v[k].match;
        }
        memmove(v, v + w, (sp->n - w) * sizeof *v);
        n_out = sp->n - w;
        break;
    }
    }
    for (size_t i = 0; i < n_out; i++)
        if (v[i].end > v[i].start) tok_pieces_push(out, s + v[i].start, v[i].end - v[i].start, 0);
}

static void split_by_pattern(const tok_pattern *pat, const char *s, size_t n, pcre2_match_data *md,
                             spans *sp) {
    size_t at = 0, ms, me;
    while (tok_pattern_find(pat, s, n, at, md, &ms, &me)) {
        if (ms > at) spans_push(sp, at, ms, false);
        spans_push(sp, ms, me, true);
        at = me;
    }
    if (at < n) spans_push(sp, at, n, false);
}

static bool is_numeric_cp(int32_t cp) {
    utf8proc_category_t c = utf8proc_category(cp);
    return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

static void split_digits(const char *s, size_t n, spans *sp) {
    size_t run = 0;
    for (size_t i = 0; i < n;) {
        size_t l;
        bool digit = is_numeric_cp(tok_utf8_cp(s + i, &l));
        if (digit) {
            if (run < i) spans_push(sp, run, i, false);
            spans_push(sp, i, i + l, true);
            run = i + l;
        }
        i += l;
    }
    if (run < n) spans_push(sp, run, n, false);
}

/* ---- pre-tokenizers ---- */

typedef struct encode_ctx {
    const tok_tokenizer *tok;
    tok_scratch scratch;
    tok_pieces a, b; /* ping-pong buffers of the pre-tokenizer */
    spans sp;
    tok_buf tmp, norm;
} encode_ctx;

static void pretok_piece(encode_ctx *c, const tok_pretok *pt, const char *s, size_t n, bool first,
                         tok_pieces *out) {
    pcre2_match_data *md = c->scratch.md;
    c->sp.n = 0;
    switch (pt->type) {
    case TOK_PRE_SPLIT:
        split_by_pattern(&pt->pattern, s, n, md, &c->sp);
        emit_split(s, &c->sp, pt->behavior, pt->invert, out);
        return;
    case TOK_PRE_DIGITS:
        split_digits(s, n, &c->sp);
        emit_split(s, &c->sp, pt->individual_digits ? TOK_SPLIT_ISOLATED : TOK_SPLIT_CONTIGUOUS,
                   false, out);
        return;
    case TOK_PRE_METASPACE: {
        tok_buf *t = &c->tmp;
        t->len = 0;
        size_t rl = strlen(pt->replacement);
        bool starts = n >= rl && memcmp(s, pt->replacement, rl) == 0;
        bool starts_space = n > 0 && s[0] == ' ';
        if (!starts && !starts_space &&
            (pt->prepend == TOK_PREPEND_ALWAYS || (pt->prepend == TOK_PREPEND_FIRST && first)))
            tok_buf_put(t, pt->replacement, rl);
        for (size_t i = 0; i < n; i++)
            if (s[i] == ' ')
                tok_buf_put(t, pt->replacement, rl);
            else
                tok_buf_putc(t, s[i]);
        if (!pt->split) {
            tok_pieces_push(out, t->data, t->len, 0);
            return;
        }
        split_by_pattern(&pt->pattern, t->data, t->len, md, &c->sp);
        emit_split(t->data, &c->sp, TOK_SPLIT_MERGED_NEXT, false, out);
        return;
    }
    case TOK_PRE_BYTE_LEVEL: {
        tok_buf *t = &c->tmp;
        t->len = 0;
        if (pt->add_prefix_space && !(n > 0 && s[0] == ' ')) tok_buf_putc(t, ' ');
        tok_buf_put(t, s, n);
        if (pt->use_regex)
            split_by_pattern(&pt->pattern, t->data, t->len, md, &c->sp);
        else
            spans_push(&c->sp, 0, t->len, true);
        for (size_t k = 0; k < c->sp.n; k++) {
            span v = c->sp.v[k];
            if (v.end == v.start) continue;
            tok_pieces_push(out, "", 0, 0);
            for (size_t i = v.start; i < v.end; i++) {
                char enc[4];
                tok_pieces_extend(out, enc,
                                  tok_utf8_put(enc, byte_to_cp((unsigned char)t->data[i])));
            }
        }
        return;
    }
    case TOK_PRE_SEQUENCE:
        break; /* handled by pretokenize */
    }
}

/* Runs a pre-tokenizer over every piece of *in, leaving the result in *in. */
static void pretokenize(encode_ctx *c, const tok_pretok *pt, tok_pieces **in, tok_pieces **spare,
                        bool first) {
    if (pt->type == TOK_PRE_SEQUENCE) {
        for (size_t i = 0; i < pt->n_items; i++) pretokenize(c, &pt->items[i], in, spare, first);
        return;
    }
    tok_pieces *src = *in, *dst = *spare;
    tok_pieces_clear(dst);
    for (size_t i = 0; i < src->n; i++)
        pretok_piece(c, pt, tok_piece(src, i), src->plen[i], first && i == 0, dst);
    *in = dst;
    *spare = src;
}

/* ---- added tokens ---- */

static bool is_word_cp(int32_t cp) {
    if (cp == '_') return true;
    utf8proc_category_t c = utf8proc_category(cp);
    return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
           (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
}

static size_t prev_char(const char *s, size_t i) {
    do i--;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80);
    return i;
}

/* A segment: text [start, end) or, when added >= 0, that added token. */
typedef struct segment {
    size_t start, end;
    int32_t added;
} segment;

typedef struct segments {
    segment *v; /* (cap) */
    size_t n, cap;
} segments;

static void seg_push(segments *sg, size_t start, size_t end, int32_t added) {
    if (added < 0 && end <= start) return;
    if (sg->n == sg->cap) {
        sg->cap = sg->cap ? sg->cap * 2 : 16;
        sg->v = base_xrealloc(sg->v, sg->cap * sizeof *sg->v);
    }
    sg->v[sg->n++] = (segment){start, end, added};
}

/* Cuts s around the added tokens of trie t (leftmost, then longest match). */
static void split_added(const tok_tokenizer *tok, const tok_trie *t, const char *s, size_t n,
                        segments *out) {
    size_t i = 0, text_start = 0, l;
    while (i < n) {
        int32_t idx = -1;
        size_t m = tok_trie_match(t, s, n, i, &idx);
        if (m) {
            const tok_added *a = &tok->added[idx];
            size_t ms = i, me = i + m;
            bool ok = true;
            if (a->single_word) {
                ok = (ms == 0 || !is_word_cp(tok_utf8_cp(s + prev_char(s, ms), &l))) &&
                     (me == n || !is_word_cp(tok_utf8_cp(s + me, &l)));
            }
            if (ok) {
                while (a->lstrip && ms > text_start) {
                    size_t p = prev_char(s, ms);
                    if (!tok_is_space_cp(tok_utf8_cp(s + p, &l))) break;
                    ms = p;
                }
                while (a->rstrip && me < n && tok_is_space_cp(tok_utf8_cp(s + me, &l))) me += l;
                seg_push(out, text_start, ms, -1);
                seg_push(out, ms, me, idx);
                i = text_start = me;
                continue;
            }
        }
        i += tok_utf8_len((unsigned char)s[i]);
    }
    seg_push(out, text_start, n, -1);
}

/* ---- encode ---- */

static int encode_section(encode_ctx *c, const char *s, size_t n, bool first, tok_ids *out,
                          base_err *err) {
    const tok_tokenizer *tok = c->tok;
    c->norm.len = 0;
    tok_buf_put(&c->norm, "", 0);
    if (tok->normalizer) {
        if (tok_normalize(tok->normalizer, s, n, &c->norm, c->scratch.md, err)) return -1;
    } else {
        tok_buf_put(&c->norm, s, n);
    }
    char *text = c->norm.data;
    size_t len = c->norm.len;
    segments sg = {0};
    split_added(tok, &tok->trie_norm, text, len, &sg);
    for (size_t k = 0; k < sg.n; k++) {
        segment g = sg.v[k];
        if (g.added >= 0) {
            tok_ids_push(out, tok->added[g.added].id);
            continue;
        }
        tok_pieces *in = &c->a, *spare = &c->b;
        tok_pieces_clear(in);
        tok_pieces_push(in, text + g.start, g.end - g.start, 0);
        if (tok->pretok) pretokenize(c, tok->pretok, &in, &spare, first && k == 0);
        for (size_t i = 0; i < in->n; i++)
            tok_bpe_word(tok, &c->scratch, tok_piece(in, i), in->plen[i], out);
    }
    free(sg.v);
    return 0;
}

int tok_encode(const tok_tokenizer *tok, const char *text, size_t len, bool add_special,
               int32_t **ids, size_t *n, base_err *err) {
    *ids = NULL;
    *n = 0;
    size_t bad = tok_utf8_check(text, len);
    if (bad < len) return base_fail(err, "tokenize: input is not valid UTF-8 at byte %zu", bad);
    encode_ctx c = {.tok = tok};
    c.scratch.md = pcre2_match_data_create(16, NULL);
    tok_ids out = {0};
    if (add_special)
        for (size_t i = 0; i < tok->n_prefix; i++) tok_ids_push(&out, tok->prefix[i]);
    segments sg = {0};
    split_added(tok, &tok->trie_raw, text, len, &sg);
    int rc = 0;
    for (size_t k = 0; k < sg.n && rc == 0; k++) {
        segment g = sg.v[k];
        if (g.added >= 0)
            tok_ids_push(&out, tok->added[g.added].id);
        else
            rc = encode_section(&c, text + g.start, g.end - g.start, k == 0, &out, err);
    }
    if (add_special)
        for (size_t i = 0; i < tok->n_suffix; i++) tok_ids_push(&out, tok->suffix[i]);
    free(sg.v);
    free(c.sp.v);
    free(c.tmp.data);
    free(c.norm.data);
    tok_pieces_free(&c.a);
    tok_pieces_free(&c.b);
    tok_scratch_free(&c.scratch);
    if (rc) {
        free(out.data);
        return -1;
    }
    *ids = out.data;
    *n = out.len;
    return 0;
}
