/* Helpers shared by the tokenizer's C tests. */
#ifndef MLXCEL_TOK_TEST_H
#define MLXCEL_TOK_TEST_H

#include "test.h"
#include "tokenizer/tokenizer.h"

#include <string.h>

/* Loads tests/tokenizer/fixtures/NAME; aborts the test when it cannot. */
static inline tok_tokenizer *tt_load(const char *name) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/tokenizer/fixtures/%s", test_source_dir(), name);
    base_err err;
    tok_tokenizer *tok;
    if (tok_load(dir, 0, &tok, &err)) {
        fprintf(stderr, "cannot load %s: %s\n", dir, err.msg);
        exit(1);
    }
    return tok;
}

/* Encodes text and compares with the expected ids. */
static inline bool tt_encodes(const tok_tokenizer *tok, const char *text, bool special,
                              const int32_t *want, size_t n_want) {
    int32_t *ids;
    size_t n;
    base_err err;
    if (tok_encode(tok, text, strlen(text), special, &ids, &n, &err)) {
        fprintf(stderr, "encode '%s': %s\n", text, err.msg);
        return false;
    }
    bool ok = n == n_want && (n == 0 || memcmp(ids, want, n * sizeof *ids) == 0);
    if (!ok) {
        fprintf(stderr, "encode '%s' gave", text);
        for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n");
    }
    free(ids);
    return ok;
}

/* Decodes ids and compares with the expected text. */
static inline bool tt_decodes(const tok_tokenizer *tok, const int32_t *ids, size_t n, bool skip,
                              const char *want) {
    char *text;
    size_t len;
    base_err err;
    if (tok_decode(tok, ids, n, skip, &text, &len, &err)) {
        fprintf(stderr, "decode: %s\n", err.msg);
        return false;
    }
    bool ok = len == strlen(want) && memcmp(text, want, len) == 0;
    if (!ok) fprintf(stderr, "decode gave '%s', want '%s'\n", text, want);
    free(text);
    return ok;
}

#define IDS(...) ((const int32_t[]){__VA_ARGS__}), (sizeof((const int32_t[]){__VA_ARGS__}) / 4)

#endif
