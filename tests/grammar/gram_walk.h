/* Random sentences of a grammar through its public API only: a walk over a vocabulary that at
 * each step takes a random token of the state's mask, stops at random where the grammar may
 * end, and past a length budget steers to the end by taking the token that leaves the fewest
 * code points to match. Shared by test_grammar.c and gram_gen.c. */
#ifndef MLXCEL_GRAM_WALK_H
#define MLXCEL_GRAM_WALK_H

#include "grammar/grammar.h"
#include "test_rand.h"

#include <stdlib.h>
#include <string.h>

typedef struct walk_ctx {
    gram_vocab *v;
    char **bytes;     /* (vocab) each token's bytes, NULL for none */
    size_t *lens;     /* (vocab) */
    uint32_t *mask;   /* (gram_mask_words) */
    int32_t *allowed; /* (vocab) */
    uint64_t rng;
} walk_ctx;

static inline void walk_init(walk_ctx *w, char **bytes, size_t *lens, int n, uint64_t seed) {
    w->bytes = bytes;
    w->lens = lens;
    w->v = gram_vocab_new((const char *const *)bytes, lens, n);
    w->mask = calloc((size_t)gram_mask_words(w->v), sizeof *w->mask);
    w->allowed = calloc((size_t)n, sizeof *w->allowed);
    w->rng = seed;
}

/* Single characters to walk with: tab, newline, printable ASCII, and a few characters of two,
 * three and four bytes. */
static inline void walk_init_chars(walk_ctx *w, uint64_t seed) {
    static const char *const extra[] = {"\xC3\xA9", "\xE4\xB8\xAD", "\xE6\x96\x87",
                                        "\xF0\x9F\x98\x80", "\xC2\xA0"};
    char **bytes = calloc(128, sizeof *bytes);
    size_t *lens = calloc(128, sizeof *lens);
    int n = 0;
    for (int c = 0; c < 128; c++) {
        if (c != '\t' && c != '\n' && (c < 0x20 || c == 0x7F)) continue;
        bytes[n] = malloc(1);
        bytes[n][0] = (char)c;
        lens[n++] = 1;
    }
    for (int i = 0; i < 5; i++) {
        bytes[n] = strdup(extra[i]);
        lens[n++] = strlen(extra[i]);
    }
    walk_init(w, bytes, lens, n, seed);
}

/* The tokenizer's tokens (special ones left out, as gram_vocab_from_tokenizer does). */
static inline int walk_init_tokenizer(walk_ctx *w, const tok_tokenizer *tok, uint64_t seed,
                                      base_err *err) {
    int n = tok_vocab_size(tok);
    char **bytes = calloc((size_t)n, sizeof *bytes);
    size_t *lens = calloc((size_t)n, sizeof *lens);
    for (int i = 0; i < n; i++)
        if (tok_token_text(tok, i) && !tok_is_special(tok, i) &&
            tok_token_bytes(tok, i, &bytes[i], &lens[i], err))
            return -1;
    walk_init(w, bytes, lens, n, seed);
    return 0;
}

static inline void walk_free(walk_ctx *w) {
    for (int i = 0; i < gram_vocab_size(w->v); i++) free(w->bytes[i]);
    free(w->bytes);
    free(w->lens);
    free(w->mask);
    free(w->allowed);
    gram_vocab_free(w->v);
}

/* Appends one random sentence's bytes to *out (caller frees; NUL-terminated) and returns the
 * tokens taken, or -1 (err filled) when the grammar left the walk stuck: no token allowed where
 * the grammar may not end, which a correct matcher over a vocabulary that holds every character
 * the grammar needs never does. */
static inline int walk_sentence(walk_ctx *w, gram_matcher *m, size_t budget, char **out,
                                size_t *out_len, base_err *err) {
    gram_state *s = gram_state_new(m);
    int vocab = gram_vocab_size(w->v), steps = 0;
    size_t len = 0, cap = 64;
    char *buf = malloc(cap);
    int rc = 0;
    for (;;) {
        if ((rc = gram_state_mask(s, w->mask, err))) break;
        int n = 0;
        for (int t = 0; t < vocab; t++)
            if (w->mask[t / 32] >> (t % 32) & 1) w->allowed[n++] = t;
        bool can_end = gram_state_can_end(s);
        if (n == 0 || (can_end && (len > budget || test_rand_u32(&w->rng) % 4 == 0))) {
            if (!can_end) rc = base_fail(err, "walk stuck after %zu bytes: no token allowed", len);
            break;
        }
        int32_t pick = w->allowed[test_rand_u32(&w->rng) % (uint32_t)n];
        if (len > budget) {
            size_t best = SIZE_MAX;
            for (int i = 0; i < n; i++) {
                gram_state *c = gram_state_clone(s);
                if (gram_state_accept(c, w->allowed[i], err)) {
                    gram_state_free(c);
                    rc = -1;
                    break;
                }
                size_t r = gram_state_min_remaining(c);
                if (r < best || (r == best && test_rand_u32(&w->rng) % 2)) {
                    best = r;
                    pick = w->allowed[i];
                }
                gram_state_free(c);
            }
            if (rc) break;
        }
        if ((rc = gram_state_accept(s, pick, err))) break;
        while (len + w->lens[pick] + 1 > cap) buf = realloc(buf, cap *= 2);
        memcpy(buf + len, w->bytes[pick], w->lens[pick]);
        len += w->lens[pick];
        steps++;
    }
    buf[len] = 0;
    gram_state_free(s);
    *out = buf;
    *out_len = len;
    return rc ? -1 : steps;
}

#endif
