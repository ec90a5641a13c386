/* Containers, UTF-8 helpers, the string map, patterns and the added-token trie. */
#include "tokenizer/tok_internal.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ---- pieces, buffers, id vectors ---- */

void tok_pieces_clear(tok_pieces *p) {
    p->len = 0;
    p->n = 0;
}

void tok_pieces_free(tok_pieces *p) {
    free(p->buf);
    free(p->off);
    free(p->plen);
    free(p->flags);
    memset(p, 0, sizeof *p);
}

static void pieces_reserve_bytes(tok_pieces *p, size_t extra) {
    if (p->len + extra <= p->cap) return;
    size_t cap = p->cap ? p->cap : 256;
    while (cap < p->len + extra) cap *= 2;
    p->buf = base_xrealloc(p->buf, cap);
    p->cap = cap;
}

void tok_pieces_push(tok_pieces *p, const char *data, size_t len, uint8_t flags) {
    if (p->n == p->ncap) {
        p->ncap = p->ncap ? p->ncap * 2 : 16;
        p->off = base_xrealloc(p->off, p->ncap * sizeof *p->off);
        p->plen = base_xrealloc(p->plen, p->ncap * sizeof *p->plen);
        p->flags = base_xrealloc(p->flags, p->ncap * sizeof *p->flags);
    }
    pieces_reserve_bytes(p, len);
    if (len) memcpy(p->buf + p->len, data, len);
    p->off[p->n] = p->len;
    p->plen[p->n] = len;
    p->flags[p->n] = flags;
    p->len += len;
    p->n++;
}

void tok_pieces_extend(tok_pieces *p, const char *data, size_t len) {
    pieces_reserve_bytes(p, len);
    if (len) memcpy(p->buf + p->len, data, len);
    p->len += len;
    p->plen[p->n - 1] += len;
}

void tok_buf_put(tok_buf *b, const char *data, size_t len) {
    if (b->len + len + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + len + 1) cap *= 2;
        b->data = base_xrealloc(b->data, cap);
        b->cap = cap;
    }
    if (len) memcpy(b->data + b->len, data, len);
    b->len += len;
    b->data[b->len] = 0;
}

void tok_buf_putc(tok_buf *b, char c) {
    tok_buf_put(b, &c, 1);
}

void tok_ids_push(tok_ids *v, int32_t id) {
    if (v->len == v->cap) {
        v->cap = v->cap ? v->cap * 2 : 64;
        v->data = base_xrealloc(v->data, v->cap * sizeof *v->data);
    }
    v->data[v->len++] = id;
}

/* ---- UTF-8 ---- */

int32_t tok_utf8_cp(const char *s, size_t *len) {
    const unsigned char *u = (const unsigned char *)s;
    size_t n = tok_utf8_len(u[0]);
    *len = n;
    switch (n) {
    case 1:
        return u[0];
    case 2:
        return ((u[0] & 0x1F) << 6) | (u[1] & 0x3F);
    case 3:
        return ((u[0] & 0x0F) << 12) | ((u[1] & 0x3F) << 6) | (u[2] & 0x3F);
    default:
        return ((u[0] & 0x07) << 18) | ((u[1] & 0x3F) << 12) | ((u[2] & 0x3F) << 6) | (u[3] & 0x3F);
    }
}

size_t tok_utf8_put(char *out, int32_t cp) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* How one well-formed sequence may start (Unicode table 3-7): its length, and the range of
 * its second byte. Returns 0 for a byte that cannot start one. */
static size_t utf8_lead(unsigned char c, unsigned char *lo, unsigned char *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) {
        if (c == 0xE0) *lo = 0xA0;
        if (c == 0xED) *hi = 0x9F;
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (c == 0xF0) *lo = 0x90;
        if (c == 0xF4) *hi = 0x8F;
        return 4;
    }
    return 0;
}

/* Scans one unit at s[i]: returns its length and sets *valid; a unit cut short by the end of
 * the input sets *truncated. */
static size_t utf8_unit(const unsigned char *s, size_t n, size_t i, bool *valid, bool *truncated) {
    *truncated = false;
    if (s[i] < 0x80) {
        *valid = true;
        return 1;
    }
    unsigned char lo, hi;
    size_t need = utf8_lead(s[i], &lo, &hi);
    *valid = false;
    if (need == 0) return 1;
    size_t j = i + 1;
    for (size_t k = 1; k < need; k++, j++) {
        if (j >= n) {
            *truncated = true;
            return j - i;
        }
        if (s[j] < lo || s[j] > hi) return j - i;
        lo = 0x80;
        hi = 0xBF;
    }
    *valid = true;
    return need;
}

size_t tok_utf8_check(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        bool valid, truncated;
        size_t len = utf8_unit(u, n, i, &valid, &truncated);
        if (!valid) return i;
        i += len;
    }
    return n;
}

void tok_utf8_lossy(tok_buf *out, const char *s, size_t n, size_t *complete) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0;
    while (i < n) {
        bool valid, truncated;
        size_t len = utf8_unit(u, n, i, &valid, &truncated);
        if (valid) {
            i += len;
            continue;
        }
        tok_buf_put(out, s + run, i - run);
        if (truncated && complete) {
            *complete = i;
            return;
        }
        tok_buf_put(out, "\xEF\xBF\xBD", 3);
        i += len;
        run = i;
    }
    tok_buf_put(out, s + run, n - run);
    if (complete) *complete = n;
}

bool tok_is_space_cp(int32_t cp) {
    if ((cp >= 0x09 && cp <= 0x0D) || cp == 0x85) return true;
    utf8proc_category_t c = utf8proc_category(cp);
    return c == UTF8PROC_CATEGORY_ZS || c == UTF8PROC_CATEGORY_ZL || c == UTF8PROC_CATEGORY_ZP;
}

/* ---- hashing and the string map ---- */

uint64_t tok_hash(const char *s, size_t n) {
    /* FNV-1a over 8-byte words: tokens are short and this runs once per lookup. */
    uint64_t h = 0xcbf29ce484222325ull ^ n;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
    }
    uint64_t w = 0;
    memcpy(&w, s + i, n - i);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 32;
    return h * 0x9E3779B97F4A7C15ull;
}

int32_t tok_map_get(const tok_tokenizer *tok, const char *s, size_t n) {
    const tok_strmap *m = &tok->map;
    if (!m->cap) return -1;
    uint64_t h = tok_hash(s, n);
    size_t mask = m->cap - 1;
    for (size_t i = (size_t)(h >> 20) & mask;; i = (i + 1) & mask) {
        int32_t id = m->slot[i];
        if (id < 0) return -1;
        if (m->hash[i] == (uint32_t)h && tok->tlen[id] == n && memcmp(tok->text[id], s, n) == 0)
            return id;
    }
}

static void map_insert(tok_strmap *m, uint64_t h, int32_t id, const tok_tokenizer *tok) {
    size_t mask = m->cap - 1;
    for (size_t i = (size_t)(h >> 20) & mask;; i = (i + 1) & mask) {
        int32_t cur = m->slot[i];
        if (cur < 0) {
            m->slot[i] = id;
            m->hash[i] = (uint32_t)h;
            m->n++;
            return;
        }
        /* A later entry with the same string wins: added tokens override the vocabulary. */
        if (m->hash[i] == (uint32_t)h && tok->tlen[cur] == tok->tlen[id] &&
            memcmp(tok->text[cur], tok->text[id], tok->tlen[id]) == 0) {
            m->slot[i] = id;
            return;
        }
    }
}

void tok_map_put(tok_tokenizer *tok, int32_t id) {
    tok_strmap *m = &tok->map;
    if ((m->n + 1) * 2 > m->cap) {
        tok_strmap old = *m;
        m->cap = old.cap ? old.cap * 2 : 1024;
        m->slot = base_xmalloc(m->cap * sizeof *m->slot);
        m->hash = base_xmalloc(m->cap * sizeof *m->hash);
        memset(m->slot, 0xFF, m->cap * sizeof *m->slot);
        m->n = 0;
        for (size_t i = 0; i < old.cap; i++)
            if (old.slot[i] >= 0)
                map_insert(m, tok_hash(tok->text[old.slot[i]], tok->tlen[old.slot[i]]), old.slot[i],
                           tok);
        free(old.slot);
        free(old.hash);
    }
    map_insert(m, tok_hash(tok->text[id], tok->tlen[id]), id, tok);
}

/* ---- patterns ---- */

/* Oniguruma folds case inside (?i:...) for ASCII only as the JavaScript reference translates
 * it, while PCRE2 would also fold e.g. U+017F into 's'. A group of plain literals is rewritten
 * with explicit [sS] classes; anything more complex is left to PCRE2's own (?i). */
static char *fold_ascii_groups(const char *re) {
    tok_buf out = {0};
    const char *p = re;
    while (*p) {
        if (strncmp(p, "(?i:", 4) == 0) {
            const char *end = p + 4;
            while (*end && *end != ')' && *end != '[' && *end != '\\' && *end != '(') end++;
            if (*end == ')') {
                tok_buf_put(&out, "(?:", 3);
                for (const char *q = p + 4; q < end; q++) {
                    char c = *q;
                    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
                        char cls[4] = {'[', (char)(c | 0x20), (char)(c & ~0x20), ']'};
                        tok_buf_put(&out, cls, 4);
                    } else {
                        tok_buf_putc(&out, c);
                    }
                }
                p = end;
                continue;
            }
        }
        tok_buf_putc(&out, *p++);
    }
    tok_buf_putc(&out, 0);
    return out.data;
}

int tok_pattern_parse(const void *json, tok_pattern *pat, const char *where, base_err *err) {
    const json_t *j = json;
    memset(pat, 0, sizeof *pat);
    const json_t *s = json_object_get(j, "String");
    const json_t *r = json_object_get(j, "Regex");
    if (json_is_string(s)) {
        pat->len = json_string_length(s);
        pat->str = base_xmalloc(pat->len + 1);
        memcpy(pat->str, json_string_value(s), pat->len + 1);
        if (pat->len == 0) return base_fail(err, "%s: empty String pattern", where);
        return 0;
    }
    if (!json_is_string(r))
        return base_fail(err, "%s: pattern needs \"String\" or \"Regex\"", where);
    char *src = fold_ascii_groups(json_string_value(r));
    int code;
    PCRE2_SIZE at;
    pat->re = pcre2_compile((PCRE2_SPTR)src, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &code,
                            &at, NULL);
    free(src);
    if (!pat->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        return base_fail(err, "%s: regex '%s' does not compile at offset %zu: %s", where,
                         json_string_value(r), (size_t)at, (const char *)msg);
    }
    pcre2_jit_compile(pat->re, PCRE2_JIT_COMPLETE); /* the interpreter still works without */
    return 0;
}

void tok_pattern_free(tok_pattern *pat) {
    free(pat->str);
    if (pat->re) pcre2_code_free(pat->re);
    memset(pat, 0, sizeof *pat);
}

bool tok_pattern_find(const tok_pattern *pat, const char *s, size_t n, size_t from,
                      pcre2_match_data *md, size_t *start, size_t *end) {
    if (!pat->re) {
        if (pat->len > n) return false;
        const char *hit =
            from + pat->len <= n ? memmem(s + from, n - from, pat->str, pat->len) : NULL;
        if (!hit) return false;
        *start = (size_t)(hit - s);
        *end = *start + pat->len;
        return true;
    }
    while (from <= n) {
        int rc = pcre2_match(pat->re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc < 0) return false;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (ov[1] > ov[0]) {
            *start = ov[0];
            *end = ov[1];
            return true;
        }
        /* Empty matches split nothing; look again from the next character. */
        if (ov[0] >= n) return false;
        from = ov[0] + tok_utf8_len((unsigned char)s[ov[0]]);
    }
    return false;
}

/* ---- the added-token trie ---- */

static size_t edge_slot(const tok_trie *t, uint64_t key) {
    size_t mask = t->edge_cap - 1;
    size_t i = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & mask;
    while (t->edge_key[i] && t->edge_key[i] != key) i = (i + 1) & mask;
    return i;
}

static int32_t trie_child(const tok_trie *t, int32_t node, unsigned char b) {
    if (!t->edge_cap) return -1;
    size_t i = edge_slot(t, (((uint64_t)node << 8) | b) + 1);
    return t->edge_key[i] ? t->edge_child[i] : -1;
}

static void trie_grow_edges(tok_trie *t) {
    size_t old_cap = t->edge_cap;
    uint64_t *old_key = t->edge_key;
    int32_t *old_child = t->edge_child;
    t->edge_cap = old_cap ? old_cap * 2 : 256;
    t->edge_key = base_xcalloc(t->edge_cap, sizeof *t->edge_key);
    t->edge_child = base_xmalloc(t->edge_cap * sizeof *t->edge_child);
    for (size_t i = 0; i < old_cap; i++) {
        if (!old_key[i]) continue;
        size_t j = edge_slot(t, old_key[i]);
        t->edge_key[j] = old_key[i];
        t->edge_child[j] = old_child[i];
    }
    free(old_key);
    free(old_child);
}

static int32_t trie_new_node(tok_trie *t) {
    if (t->n_nodes == t->node_cap) {
        t->node_cap = t->node_cap ? t->node_cap * 2 : 64;
        t->node_token = base_xrealloc(t->node_token, t->node_cap * sizeof *t->node_token);
    }
    t->node_token[t->n_nodes] = -1;
    return (int32_t)t->n_nodes++;
}

void tok_trie_add(tok_trie *t, const char *s, size_t n, int32_t added_index) {
    if (n == 0) return;
    if (t->n_nodes == 0) trie_new_node(t);
    t->first[(unsigned char)s[0] >> 3] |= (uint8_t)(1u << ((unsigned char)s[0] & 7));
    int32_t node = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        int32_t child = trie_child(t, node, b);
        if (child < 0) {
            if ((t->n_edges + 1) * 2 > t->edge_cap) trie_grow_edges(t);
            child = trie_new_node(t);
            uint64_t key = (((uint64_t)node << 8) | b) + 1;
            size_t j = edge_slot(t, key);
            t->edge_key[j] = key;
            t->edge_child[j] = child;
            t->n_edges++;
        }
        node = child;
    }
    /* A later added token with the same content wins, as in the reference's map. */
    t->node_token[node] = added_index;
}

size_t tok_trie_match(const tok_trie *t, const char *s, size_t n, size_t i, int32_t *added) {
    unsigned char b0 = (unsigned char)s[i];
    if (!t->n_nodes || !(t->first[b0 >> 3] & (1u << (b0 & 7)))) return 0;
    size_t best = 0;
    int32_t node = 0;
    for (size_t j = i; j < n; j++) {
        node = trie_child(t, node, (unsigned char)s[j]);
        if (node < 0) break;
        if (t->node_token[node] >= 0) {
            best = j + 1 - i;
            *added = t->node_token[node];
        }
    }
    return best;
}

void tok_trie_free(tok_trie *t) {
    free(t->node_token);
    free(t->edge_key);
    free(t->edge_child);
    memset(t, 0, sizeof *t);
}
