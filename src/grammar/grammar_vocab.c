/* The vocabulary trie: token byte strings sorted, then laid out as a preorder array of prefix
 * nodes, so that a mask is one forward pass over the array that skips a whole subtree (every
 * token sharing a dead prefix) with one jump. */
#include "grammar/grammar_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct sort_item {
    const char *b;
    size_t n;
    int32_t id;
} sort_item;

static int cmp_item(const void *pa, const void *pb) {
    const sort_item *a = pa, *b = pb;
    size_t n = a->n < b->n ? a->n : b->n;
    int c = memcmp(a->b, b->b, n);
    if (c) return c;
    if (a->n != b->n) return a->n < b->n ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

/* Whether a token's bytes are UTF-8 the matcher can take (a final character may be cut
 * short if some valid character starts so). */
static bool token_clean(const char *b, size_t n) {
    uint32_t part = 0, cp, lo, hi, lo2, hi2;
    for (size_t i = 0; i < n; i++)
        if (gram_utf8_step(&part, (uint8_t)b[i], &cp) < 0) return false;
    return !part || gram_partial_range(part, &lo, &hi, &lo2, &hi2);
}

/* Nodes are made in preorder as the sorted strings are read: a string shares its longest
 * common prefix with the previous one, closes the nodes below that prefix (their subtree ends
 * here) and opens one node per further byte. What lies below each node is then gathered from
 * the last node back to the first, each into its parent. */
static void build_trie(gram_vocab *v, sort_item *items, int n) {
    size_t cap = 2;
    for (int i = 0; i < n; i++) cap += items[i].n;
    v->nodes = base_xcalloc(cap, sizeof *v->nodes);
    uint32_t *parent = base_xcalloc(cap, sizeof *parent);
    bool *tokens_clean = base_xmalloc(cap * sizeof *tokens_clean);
    for (size_t i = 0; i < cap; i++) tokens_clean[i] = true;
    v->tok = base_xmalloc(((size_t)n + 1) * sizeof *v->tok);
    uint16_t max_depth = 0;
    for (int i = 0; i < n; i++)
        if (items[i].n > max_depth) max_depth = (uint16_t)items[i].n;
    uint32_t *path = base_xmalloc(((size_t)max_depth + 1) * sizeof *path); /* open nodes */
    uint32_t nodes = 1, open = 1;
    path[0] = 0;
    const sort_item *prev = NULL;
    for (int i = 0; i < n; i++) {
        const sort_item *it = &items[i];
        size_t lcp = 0;
        if (prev)
            while (lcp < prev->n && lcp < it->n && prev->b[lcp] == it->b[lcp]) lcp++;
        while (open > lcp + 1) v->nodes[path[--open]].end = nodes;
        for (size_t d = lcp; d < it->n; d++) {
            v->nodes[nodes] = (gram_node){.byte = (uint8_t)it->b[d],
                                          .depth = (uint16_t)(d + 1),
                                          .first = (uint32_t)i,
                                          .flags = GRAM_NODE_CLEAN};
            parent[nodes] = path[open - 1];
            path[open++] = nodes++;
        }
        uint32_t leaf = path[open - 1];
        v->nodes[leaf].count++; /* identical byte strings: a handful at most */
        tokens_clean[leaf] = tokens_clean[leaf] && token_clean(it->b, it->n);
        v->tok[i] = it->id;
        prev = it;
    }
    while (open > 0) v->nodes[path[--open]].end = nodes;
    v->nodes[0].flags = GRAM_NODE_CLEAN;
    v->nodes[nodes].first = (uint32_t)n;
    v->below = base_xcalloc(nodes, sizeof *v->below);
    for (uint32_t i = nodes; i-- > 1;) {
        gram_node *x = &v->nodes[i], *up = &v->nodes[parent[i]];
        uint64_t(*b)[2] = &v->below[parent[i]];
        (*b)[0] |= v->below[i][0];
        (*b)[1] |= v->below[i][1];
        if (x->byte < 0x80) (*b)[x->byte >> 6] |= 1ull << (x->byte & 63);
        if (x->byte >= 0x80 || (x->flags & GRAM_NODE_HI)) up->flags |= GRAM_NODE_HI;
        if (x->reach + 1 > up->reach) up->reach = (uint16_t)(x->reach + 1);
        if (!tokens_clean[i] || !(x->flags & GRAM_NODE_CLEAN)) up->flags &= ~GRAM_NODE_CLEAN;
    }
    free(path);
    free(parent);
    free(tokens_clean);
    v->n_nodes = nodes;
    v->max_depth = max_depth;
}

gram_vocab *gram_vocab_new(const char *const *bytes, const size_t *lens, int n) {
    return gram_vocab_new_special(bytes, lens, NULL, n);
}

gram_vocab *gram_vocab_new_special(const char *const *bytes, const size_t *lens,
                                   const char *const *special, int n) {
    gram_vocab *v = base_xcalloc(1, sizeof *v);
    v->n_tokens = n;
    v->bytes = base_xcalloc((size_t)n + 1, sizeof *v->bytes);
    v->lens = base_xcalloc((size_t)n + 1, sizeof *v->lens);
    v->special = base_xcalloc((size_t)n + 1, sizeof *v->special);
    sort_item *items = base_xmalloc(((size_t)n + 1) * sizeof *items);
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (special && special[i]) { /* out of the trie: its text is no input */
            v->special[i] = base_xstrdup(special[i]);
            continue;
        }
        /* a prefix this long cannot be a real token; it would overflow the depth field */
        if (!bytes[i] || lens[i] == 0 || lens[i] > 1024) continue;
        v->bytes[i] = base_xmalloc(lens[i]);
        memcpy(v->bytes[i], bytes[i], lens[i]);
        v->lens[i] = lens[i];
        items[k++] = (sort_item){v->bytes[i], lens[i], i};
    }
    qsort(items, (size_t)k, sizeof *items, cmp_item);
    build_trie(v, items, k);
    free(items);
    return v;
}

int gram_vocab_from_tokenizer(const tok_tokenizer *tok, gram_vocab **out, base_err *err) {
    int n = tok_vocab_size(tok);
    char **bytes = base_xcalloc((size_t)n + 1, sizeof *bytes);
    size_t *lens = base_xcalloc((size_t)n + 1, sizeof *lens);
    const char **special = base_xcalloc((size_t)n + 1, sizeof *special);
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        /* ids with no token (gaps among added tokens) stay out */
        if (!tok_token_text(tok, i)) continue;
        if (tok_is_special(tok, i)) {
            special[i] = tok_token_text(tok, i);
            continue;
        }
        rc = tok_token_bytes(tok, i, &bytes[i], &lens[i], err);
        if (rc) base_fail_wrap(err, "grammar vocabulary: token %d", i);
    }
    if (!rc) *out = gram_vocab_new_special((const char *const *)bytes, lens, special, n);
    for (int i = 0; i < n; i++) free(bytes[i]);
    free(bytes);
    free(lens);
    free(special);
    return rc;
}

int32_t gram_vocab_find(const gram_vocab *v, const char *text, size_t n) {
    for (int i = 0; i < v->n_tokens; i++)
        if (v->special[i] && strlen(v->special[i]) == n && !memcmp(v->special[i], text, n))
            return i;
    for (int i = 0; i < v->n_tokens; i++)
        if (v->bytes[i] && v->lens[i] == n && !memcmp(v->bytes[i], text, n)) return i;
    return -1;
}

void gram_vocab_free(gram_vocab *v) {
    if (!v) return;
    for (int i = 0; i < v->n_tokens; i++) free(v->bytes[i]), free(v->special[i]);
    free(v->bytes);
    free(v->special);
    free(v->lens);
    free(v->nodes);
    free(v->below);
    free(v->tok);
    free(v);
}

int gram_vocab_size(const gram_vocab *v) {
    return v->n_tokens;
}

int gram_mask_words(const gram_vocab *v) {
    return (v->n_tokens + 31) / 32;
}

void gram_mask_apply(const gram_vocab *v, const uint32_t *mask, float *logits, int n_logits) {
    int n = n_logits < v->n_tokens ? n_logits : v->n_tokens;
    /* whole words first: inside a string most are all ones, elsewhere most are all zeros */
    for (int w = 0; w * 32 < n; w++) {
        uint32_t bits = mask[w];
        int base = w * 32, top = base + 32 < n ? base + 32 : n;
        if (bits == UINT32_MAX && top == base + 32) continue;
        if (bits == 0) {
            for (int i = base; i < top; i++) logits[i] = -INFINITY;
            continue;
        }
        for (int i = base; i < top; i++)
            if (!(bits >> (i - base) & 1)) logits[i] = -INFINITY;
    }
    for (int i = n; i < n_logits; i++) logits[i] = -INFINITY;
}
