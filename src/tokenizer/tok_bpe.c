/* The BPE model: the merge table, merging one word in O(n log n) with a heap of candidate
 * pairs over a linked list of symbols, and a sharded, locked cache of merged words.
 *
 * Merges apply lowest rank first; among equal ranks the leftmost pair first (the order the
 * reference's tie-break by position gives). A heap entry remembers the two ids it would join,
 * so an entry made stale by an earlier merge is recognised when popped and dropped: a symbol
 * only ever grows, so its id never returns to an old value. */
#include "tokenizer/tok_internal.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static const tok_merge *merge_find(const tok_bpe *b, int32_t left, int32_t right) {
    uint64_t key = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    size_t mask = b->merge_cap - 1;
    for (size_t i = (size_t)mix64(key) & mask;; i = (i + 1) & mask) {
        if (b->merges[i].key == key) return &b->merges[i];
        if (b->merges[i].key == UINT64_MAX) return NULL;
    }
}

static void merge_insert(tok_bpe *b, int32_t left, int32_t right, int32_t rank, int32_t id) {
    uint64_t key = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    size_t mask = b->merge_cap - 1;
    for (size_t i = (size_t)mix64(key) & mask;; i = (i + 1) & mask) {
        if (b->merges[i].key == key) return; /* a repeated pair keeps its first (lowest) rank */
        if (b->merges[i].key == UINT64_MAX) {
            b->merges[i] = (tok_merge){key, rank, id};
            b->n_merges++;
            return;
        }
    }
}

/* Splits merge i into its two halves: "a b" strings or ["a", "b"] pairs. */
static int merge_parts(const json_t *m, size_t i, const char **a, size_t *na, const char **b,
                       size_t *nb, const char *where, base_err *err) {
    if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
        json_is_string(json_array_get(m, 1))) {
        *a = json_string_value(json_array_get(m, 0));
        *na = json_string_length(json_array_get(m, 0));
        *b = json_string_value(json_array_get(m, 1));
        *nb = json_string_length(json_array_get(m, 1));
        return 0;
    }
    if (json_is_string(m)) {
        const char *s = json_string_value(m);
        size_t n = json_string_length(m);
        const char *sp = memchr(s, ' ', n);
        if (sp && sp > s && sp + 1 < s + n && !memchr(sp + 1, ' ', (size_t)(s + n - sp - 1))) {
            *a = s;
            *na = (size_t)(sp - s);
            *b = sp + 1;
            *nb = (size_t)(s + n - sp - 1);
            return 0;
        }
    }
    return base_fail(err, "%s: model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", where, i);
}

static int load_merges(tok_tokenizer *tok, const json_t *merges, base_err *err) {
    tok_bpe *b = &tok->bpe;
    size_t n = json_array_size(merges);
    b->merge_cap = 16;
    while (b->merge_cap < 2 * n) b->merge_cap *= 2;
    b->merges = base_xmalloc(b->merge_cap * sizeof *b->merges);
    memset(b->merges, 0xFF, b->merge_cap * sizeof *b->merges);
    tok_buf joined = {0};
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const char *pa = NULL, *pb = NULL;
        size_t na = 0, nb = 0;
        if ((rc = merge_parts(json_array_get(merges, i), i, &pa, &na, &pb, &nb, tok->name, err)))
            break;
        joined.len = 0;
        tok_buf_put(&joined, pa, na);
        tok_buf_put(&joined, pb, nb);
        int32_t ia = tok_map_get(tok, pa, na), ib = tok_map_get(tok, pb, nb);
        int32_t im = tok_map_get(tok, joined.data, joined.len);
        if (ia < 0 || ib < 0 || im < 0)
            rc = base_fail(err, "%s: model.merges[%zu] '%.*s %.*s' uses a token not in the vocab",
                           tok->name, i, (int)na, pa, (int)nb, pb);
        else
            merge_insert(b, ia, ib, (int32_t)i, im);
    }
    free(joined.data);
    return rc;
}

int tok_bpe_init(tok_tokenizer *tok, const void *model_json, base_err *err) {
    const json_t *m = model_json;
    tok_bpe *b = &tok->bpe;
    const char *where = tok->name;
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t i = 0; i < 2; i++) {
        const json_t *v = json_object_get(m, affixes[i]);
        if (json_is_string(v) && json_string_length(v) > 0)
            return base_fail(err, "%s: model.%s is not supported", where, affixes[i]);
    }
    const json_t *merges = json_object_get(m, "merges");
    if (!json_is_array(merges)) return base_fail(err, "%s: model.merges must be an array", where);
    b->byte_fallback = json_is_true(json_object_get(m, "byte_fallback"));
    b->fuse_unk = json_is_true(json_object_get(m, "fuse_unk"));
    b->ignore_merges = json_is_true(json_object_get(m, "ignore_merges"));
    const json_t *unk = json_object_get(m, "unk_token");
    b->unk_id = json_is_string(unk)
                    ? tok_map_get(tok, json_string_value(unk), json_string_length(unk))
                    : -1;
    for (int i = 0; i < 256; i++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", i);
        b->byte_id[i] = tok_map_get(tok, name, 6);
    }
    b->bmp_id = base_xmalloc(0x10000 * sizeof *b->bmp_id);
    memset(b->bmp_id, 0xFF, 0x10000 * sizeof *b->bmp_id);
    for (int32_t id = 0; id < tok->n_ids; id++) {
        const char *s = tok->text[id];
        if (!s || !tok->tlen[id] || tok_utf8_check(s, tok->tlen[id]) != tok->tlen[id]) continue;
        size_t l;
        int32_t cp = tok_utf8_cp(s, &l);
        if (l == tok->tlen[id] && cp < 0x10000) b->bmp_id[cp] = tok_map_get(tok, s, l);
    }
    b->cache = base_xcalloc(TOK_CACHE_SHARDS, sizeof *b->cache);
    for (int i = 0; i < TOK_CACHE_SHARDS; i++) pthread_mutex_init(&b->cache[i].mu, NULL);
    return load_merges(tok, merges, err);
}

static void cache_clear_shard(tok_cache_shard *s) {
    for (size_t i = 0; i < TOK_CACHE_SLOTS; i++) {
        free(s->slot[i].key);
        free(s->slot[i].ids);
    }
    memset(s->slot, 0, sizeof s->slot);
    s->used = 0;
}

void tok_bpe_free(tok_bpe *b) {
    if (b->cache) {
        for (int i = 0; i < TOK_CACHE_SHARDS; i++) {
            cache_clear_shard(&b->cache[i]);
            pthread_mutex_destroy(&b->cache[i].mu);
        }
    }
    free(b->cache);
    free(b->merges);
    free(b->bmp_id);
    memset(b, 0, sizeof *b);
}

/* Looks the word up; on a hit appends its ids to out. */
static bool cache_get(const tok_bpe *b, uint64_t h, const char *w, size_t n, tok_ids *out) {
    tok_cache_shard *s = &b->cache[h % TOK_CACHE_SHARDS];
    bool hit = false;
    pthread_mutex_lock(&s->mu);
    for (size_t i = (h >> 8) % TOK_CACHE_SLOTS; s->slot[i].key; i = (i + 1) % TOK_CACHE_SLOTS) {
        const tok_cache_entry *e = &s->slot[i];
        if (e->hash == h && e->klen == n && memcmp(e->key, w, n) == 0) {
            for (uint32_t k = 0; k < e->n; k++) tok_ids_push(out, e->ids[k]);
            hit = true;
            break;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return hit;
}

static void cache_put(const tok_bpe *b, uint64_t h, const char *w, size_t n, const int32_t *ids,
                      size_t n_ids) {
    tok_cache_shard *s = &b->cache[h % TOK_CACHE_SHARDS];
    pthread_mutex_lock(&s->mu);
    /* Full shards start over: cheaper than LRU bookkeeping, and hot words come straight back. */
    if (s->used * 2 >= TOK_CACHE_SLOTS) cache_clear_shard(s);
    size_t i = (h >> 8) % TOK_CACHE_SLOTS;
    while (s->slot[i].key &&
           !(s->slot[i].hash == h && s->slot[i].klen == n && memcmp(s->slot[i].key, w, n) == 0))
        i = (i + 1) % TOK_CACHE_SLOTS;
    if (!s->slot[i].key) {
        tok_cache_entry *e = &s->slot[i];
        e->key = base_xmalloc(n ? n : 1);
        memcpy(e->key, w, n);
        e->klen = (uint32_t)n;
        e->hash = h;
        e->n = (uint32_t)n_ids;
        e->ids = base_xmalloc((n_ids ? n_ids : 1) * sizeof *e->ids);
        if (n_ids) memcpy(e->ids, ids, n_ids * sizeof *ids);
        s->used++;
    }
    pthread_mutex_unlock(&s->mu);
}

/* ---- merging ---- */

typedef struct heap_entry {
    int32_t rank, pos;       /* order: rank, then position */
    int32_t left, right, id; /* the pair it joins and the result */
} heap_entry;

static bool heap_less(const heap_entry *a, const heap_entry *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(tok_scratch *s, size_t *n, heap_entry e) {
    if (*n == s->heap_cap) {
        s->heap_cap = s->heap_cap ? s->heap_cap * 2 : 64;
        s->heap = base_xrealloc(s->heap, s->heap_cap * sizeof(heap_entry));
    }
    heap_entry *h = s->heap;
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&e, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static heap_entry heap_pop(tok_scratch *s, size_t *n) {
    heap_entry *h = s->heap;
    heap_entry top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(&h[c + 1], &h[c])) c++;
        if (!heap_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

static void try_pair(const tok_bpe *b, tok_scratch *s, size_t *hn, int32_t pos) {
    int32_t nx = s->next[pos];
    if (nx < 0 || s->sym_id[pos] < 0 || s->sym_id[nx] < 0) return;
    const tok_merge *m = merge_find(b, s->sym_id[pos], s->sym_id[nx]);
    if (m) heap_push(s, hn, (heap_entry){m->rank, pos, s->sym_id[pos], s->sym_id[nx], m->id});
}

static void scratch_reserve(tok_scratch *s, size_t n) {
    if (n <= s->cap) return;
    size_t cap = s->cap ? s->cap : 64;
    while (cap < n) cap *= 2;
    s->sym_id = base_xrealloc(s->sym_id, cap * sizeof *s->sym_id);
    s->sym_off = base_xrealloc(s->sym_off, cap * sizeof *s->sym_off);
    s->sym_len = base_xrealloc(s->sym_len, cap * sizeof *s->sym_len);
    s->prev = base_xrealloc(s->prev, cap * sizeof *s->prev);
    s->next = base_xrealloc(s->next, cap * sizeof *s->next);
    s->cap = cap;
}

void tok_scratch_free(tok_scratch *s) {
    free(s->sym_id);
    free(s->sym_off);
    free(s->sym_len);
    free(s->prev);
    free(s->next);
    free(s->heap);
    if (s->md) pcre2_match_data_free(s->md);
    memset(s, 0, sizeof *s);
}

/* Emits a symbol no token covers: its bytes as <0xHH> tokens when the model falls back to
 * bytes and has them all, else the unknown token (once per run when fuse_unk). */
static void emit_unknown(const tok_bpe *b, const char *w, int32_t off, int32_t len, tok_ids *out,
                         bool *last_unk) {
    if (b->byte_fallback) {
        bool all = true;
        for (int32_t k = 0; k < len; k++) all &= b->byte_id[(unsigned char)w[off + k]] >= 0;
        if (all) {
            for (int32_t k = 0; k < len; k++)
                tok_ids_push(out, b->byte_id[(unsigned char)w[off + k]]);
            *last_unk = false;
            return;
        }
    }
    if (b->unk_id < 0) return; /* the reference drops what it cannot name */
    if (!(b->fuse_unk && *last_unk)) tok_ids_push(out, b->unk_id);
    *last_unk = true;
}

static void merge_word(const tok_tokenizer *tok, tok_scratch *s, const char *w, size_t n,
                       tok_ids *out) {
    const tok_bpe *b = &tok->bpe;
    scratch_reserve(s, n);
    int32_t count = 0;
    for (size_t i = 0; i < n;) {
        size_t l;
        int32_t cp = tok_utf8_cp(w + i, &l);
        int32_t id = cp < 0x10000 ? b->bmp_id[cp] : tok_map_get(tok, w + i, l);
        s->sym_id[count] = id;
        s->sym_off[count] = (int32_t)i;
        s->sym_len[count] = (int32_t)l;
        s->prev[count] = count - 1;
        s->next[count] = count + 1;
        count++;
        i += l;
    }
    s->next[count - 1] = -1;
    size_t hn = 0;
    for (int32_t i = 0; i + 1 < count; i++) try_pair(b, s, &hn, i);
    while (hn) {
        heap_entry e = heap_pop(s, &hn);
        int32_t nx = s->next[e.pos];
        if (s->sym_len[e.pos] == 0 || s->sym_id[e.pos] != e.left || nx < 0 ||
            s->sym_id[nx] != e.right)
            continue;
        s->sym_id[e.pos] = e.id;
        s->sym_len[e.pos] += s->sym_len[nx];
        s->sym_len[nx] = 0; /* dead */
        s->next[e.pos] = s->next[nx];
        if (s->next[nx] >= 0) s->prev[s->next[nx]] = e.pos;
        if (s->prev[e.pos] >= 0) try_pair(b, s, &hn, s->prev[e.pos]);
        try_pair(b, s, &hn, e.pos);
    }
    bool last_unk = false;
    for (int32_t i = 0; i >= 0; i = s->next[i]) {
        if (s->sym_id[i] >= 0) {
            tok_ids_push(out, s->sym_id[i]);
            last_unk = false;
        } else {
            emit_unknown(b, w, s->sym_off[i], s->sym_len[i], out, &last_unk);
        }
    }
}

void tok_bpe_word(const tok_tokenizer *tok, tok_scratch *s, const char *w, size_t n, tok_ids *out) {
    if (n == 0) return;
    const tok_bpe *b = &tok->bpe;
    if (b->ignore_merges) {
        int32_t id = tok_map_get(tok, w, n);
        if (id >= 0) {
            tok_ids_push(out, id);
            return;
        }
    }
    if (n >= TOK_CACHE_MAX_WORD) {
        merge_word(tok, s, w, n, out);
        return;
    }
    uint64_t h = tok_hash(w, n);
    if (cache_get(b, h, w, n, out)) return;
    size_t first = out->len;
    merge_word(tok, s, w, n, out);
    /* A word of characters the vocabulary lacks, with no unk token, gives no ids: out may
     * then have no buffer to point into. */
    cache_put(b, h, w, n, out->len > first ? out->data + first : NULL, out->len - first);
}
