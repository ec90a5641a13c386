/* Token terminals in GBNF (`<|end|>`, `<[id]>`, as llama.cpp writes them): parsed against a
 * vocabulary with special tokens, matched at token level only. A special token is in the mask
 * exactly where its terminal is expected, the text of a special token spelled by ordinary
 * tokens never matches its terminal, the special token never matches text, and the masks
 * (cached per state) equal a per-token check over a Harmony-like grammar. */
#include "grammar/grammar.h"
#include "test.h"

#include <string.h>

/* Ordinary tokens 0..11, then the special ones. */
enum { T_LT, T_BAR, T_END, T_GT, T_A, T_B, T_ABC, T_ENDTXT, T_SP, T_LB, T_RB, T_THINK, N_PLAIN };
enum { S_START = N_PLAIN, S_END, S_CALL, N_TOKENS };

static const char *const g_bytes[N_TOKENS] = {
    "<", "|", "end", ">", "a", "b", "abc", "<|end|>", " ", "{", "}", "<think>", NULL, NULL, NULL};
static const char *const g_special[N_TOKENS] = {
    [S_START] = "<|start|>", [S_END] = "<|end|>", [S_CALL] = "<|call|>"};

static gram_vocab *vocab(void) {
    size_t lens[N_TOKENS] = {0};
    for (int i = 0; i < N_TOKENS; i++) lens[i] = g_bytes[i] ? strlen(g_bytes[i]) : 0;
    return gram_vocab_new_special(g_bytes, lens, g_special, N_TOKENS);
}

static gram_grammar *parse_ok(const char *text, const gram_vocab *v) {
    gram_grammar *g = NULL;
    base_err err = {{0}};
    int rc = gram_parse_vocab(text, strlen(text), v, &g, &err);
    CHECK_MSG(rc == 0, "grammar %s: %s", text, err.msg);
    return rc ? NULL : g;
}

static bool has(const uint32_t *mask, int id) {
    return mask[id / 32] >> (id % 32) & 1;
}

/* Whether the token sequence (ended by -1) is a whole sentence of g. */
static bool accepts(const gram_grammar *g, const gram_vocab *v, const int *ids) {
    gram_matcher *m = gram_matcher_new(g, v);
    gram_state *s = gram_state_new(m);
    bool ok = true;
    for (int i = 0; ok && ids[i] >= 0; i++) ok = gram_state_accept(s, ids[i], NULL) == 0;
    ok = ok && gram_state_can_end(s);
    gram_state_free(s);
    gram_matcher_free(m);
    return ok;
}

static void test_parse(const gram_vocab *v) {
    static const struct {
        const char *text, *msg;
    } bad[] = {
        {"root ::= <|nope|>\n", "line 1, column 10: '<|nope|>' is not the text of one token"},
        {"root ::= <[15]>\n", "token id 15 is outside the vocabulary (15)"},
        {"root ::= <[1x]>\n", "a token id <[id]> must be decimal digits"},
        {"root ::= \"a\" <|end\n", "line 1, column 14: unterminated token terminal"},
        {"root ::= !<|end|>\n", "a negated token terminal (!<...>) is not implemented"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        gram_grammar *g = NULL;
        base_err err = {{0}};
        int rc = gram_parse_vocab(bad[i].text, strlen(bad[i].text), v, &g, &err);
        CHECK_MSG(rc == -1 && !g && strstr(err.msg, bad[i].msg),
                  "case %zu: expected '%s', got '%s'", i, bad[i].msg, rc ? err.msg : "success");
        gram_free(g);
    }
    /* without a vocabulary a token terminal cannot be resolved */
    gram_grammar *g = NULL;
    base_err err = {{0}};
    CHECK(gram_parse("root ::= <|end|>", 16, &g, &err) == -1 && strstr(err.msg, "vocabulary"));
    /* by id and by text: the same terminal; an ordinary token's text names it too */
    CHECK(gram_vocab_find(v, "<|end|>", 7) == S_END && gram_vocab_find(v, "<think>", 7) == T_THINK);
    g = parse_ok("root ::= \"a\" <[13]> <think>", v);
    CHECK(g && accepts(g, v, (const int[]){T_A, S_END, T_THINK, -1}));
    CHECK(g && !accepts(g, v, (const int[]){T_A, S_END, T_LT, -1}));
    gram_free(g);
    /* an ordinary token named by a terminal keeps both readings: as the terminal, as its bytes */
    g = parse_ok("root ::= <think> \"a\" | \"<think>\" \"b\"", v);
    CHECK(g && accepts(g, v, (const int[]){T_THINK, T_A, -1}));
    CHECK(g && accepts(g, v, (const int[]){T_THINK, T_B, -1}));
    CHECK(g && !accepts(g, v, (const int[]){T_LT, T_B, -1}));
    gram_free(g);
}

/* The terminal takes the special token only, never the text of it spelled by ordinary tokens,
 * and the special token never matches text: `.*` stops at it. */
static void test_token_level(const gram_vocab *v) {
    gram_grammar *g = parse_ok("root ::= \"a\" <|end|> \"b\"", v);
    if (!g) return;
    CHECK(accepts(g, v, (const int[]){T_A, S_END, T_B, -1}));
    CHECK_MSG(!accepts(g, v, (const int[]){T_A, T_ENDTXT, T_B, -1}),
              "the text <|end|> in one ordinary token matched the terminal");
    CHECK_MSG(!accepts(g, v, (const int[]){T_A, T_LT, T_BAR, T_END, T_BAR, T_GT, T_B, -1}),
              "the text <|end|> in ordinary tokens matched the terminal");
    base_err err;
    gram_matcher *m = gram_matcher_new(g, v);
    gram_state *s = gram_state_new(m);
    CHECK(gram_state_accept_bytes(s, "a<|end|>", 8, &err) == -1);
    gram_state_free(s);
    gram_matcher_free(m);
    gram_free(g);
    /* a literal of the text is bytes: the special token does not match it */
    g = parse_ok("root ::= \"a<|end|>\"", v);
    CHECK(g && accepts(g, v, (const int[]){T_A, T_ENDTXT, -1}));
    CHECK(g && !accepts(g, v, (const int[]){T_A, S_END, -1}));
    gram_free(g);
    g = parse_ok("root ::= .* <|end|>", v);
    CHECK(g && accepts(g, v, (const int[]){T_ABC, T_ENDTXT, T_SP, S_END, -1}));
    CHECK(g && !accepts(g, v, (const int[]){T_ABC, S_START, S_END, -1}));
    gram_free(g);
}

/* The mask holds a special token exactly where its terminal is next, from the cache too. */
static void test_mask(const gram_vocab *v) {
    gram_grammar *g = parse_ok("root ::= (\"a\" <|end|>)* <|call|>", v);
    if (!g) return;
    gram_matcher *m = gram_matcher_new(g, v);
    gram_state *s = gram_state_new(m);
    uint32_t mask[1];
    base_err err;
    for (int round = 0; round < 3; round++) {
        CHECK(gram_state_mask(s, mask, &err) == 0);
        CHECK_MSG(mask[0] == (1u << T_A | 1u << S_CALL), "round %d: before \"a\": %#x", round,
                  mask[0]);
        CHECK(has(mask, S_CALL) && !has(mask, S_END) && !has(mask, S_START));
        CHECK(gram_state_accept(s, S_END, &err) == -1 && strstr(err.msg, "<|end|>"));
        CHECK(gram_state_accept(s, T_A, &err) == 0);
        CHECK(gram_state_mask(s, mask, &err) == 0);
        CHECK_MSG(mask[0] == 1u << S_END, "round %d: after \"a\": %#x", round, mask[0]);
        CHECK(!gram_state_can_end(s));
        CHECK(gram_state_accept(s, S_END, &err) == 0);
    }
    gram_stats st;
    gram_matcher_stats(m, &st);
    CHECK_MSG(st.mask_hits >= 4, "%llu of %llu masks from the cache",
              (unsigned long long)st.mask_hits, (unsigned long long)st.masks);
    CHECK(gram_state_accept(s, S_CALL, &err) == 0 && gram_state_can_end(s) && gram_state_done(s));
    gram_state_free(s);
    gram_matcher_free(m);
    gram_free(g);
}

/* A grammar shaped like a Harmony call after an optional analysis: on every state of random
 * walks the mask equals accepting each token on its own in a matcher with a cold cache. */
static void test_masks_exact(const gram_vocab *v) {
    gram_grammar *g = parse_ok("root ::= (<|start|> [a-z ]* <|end|>)? <|start|> \"a\" \" \"? "
                               "\"{\" [a-c]{0,3} \"}\" <|call|>",
                               v);
    if (!g) return;
    gram_matcher *m = gram_matcher_new(g, v), *ref = gram_matcher_new(g, v);
    uint64_t rng = 7;
    int states = 0, bad = 0, specials = 0;
    base_err err;
    for (int walk = 0; walk < 40; walk++) {
        gram_state *s = gram_state_new(m), *r = gram_state_new(ref);
        for (int step = 0; step < 30; step++) {
            uint32_t mask[1], brute = 0;
            if (gram_state_mask(s, mask, &err)) break;
            for (int t = 0; t < N_TOKENS; t++) {
                gram_state *c = gram_state_clone(r);
                if (gram_state_accept(c, t, NULL) == 0) brute |= 1u << t;
                gram_state_free(c);
            }
            states++;
            bad += mask[0] != brute;
            specials += (mask[0] >> N_PLAIN) != 0;
            int allowed[N_TOKENS], n = 0;
            for (int t = 0; t < N_TOKENS; t++)
                if (mask[0] >> t & 1) allowed[n++] = t;
            if (n == 0) break;
            int t = allowed[test_rand_u32(&rng) % (uint32_t)n];
            if (gram_state_accept(s, t, &err) || gram_state_accept(r, t, &err)) break;
        }
        gram_state_free(s);
        gram_state_free(r);
    }
    CHECK_MSG(bad == 0 && states > 100 && specials > 40,
              "%d of %d masks differ from the per-token check (%d with a special token)", bad,
              states, specials);
    gram_matcher_free(m);
    gram_matcher_free(ref);
    gram_free(g);
}

int main(void) {
    gram_vocab *v = vocab();
    test_parse(v);
    test_token_level(v);
    test_mask(v);
    test_masks_exact(v);
    gram_vocab_free(v);
    TEST_MAIN_END();
}
