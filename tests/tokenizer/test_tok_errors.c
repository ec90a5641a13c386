/* Loading and encoding errors: each names what is at fault. */
#include "tok_test.h"

#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* Loads json and expects a failure whose message contains every one of want[]. */
static bool fails_with_vocab(const char *json, int vocab_size, const char *want1,
                             const char *want2) {
    tok_tokenizer *tok = NULL;
    base_err err = {{0}};
    int rc = tok_load_json(json, strlen(json), NULL, 0, "t.json", vocab_size, &tok, &err);
    bool ok =
        rc == -1 && tok == NULL && strstr(err.msg, want1) && (!want2 || strstr(err.msg, want2));
    if (!ok) fprintf(stderr, "got rc %d, message '%s'\n", rc, err.msg);
    tok_free(tok);
    return ok;
}

static bool fails_with(const char *json, const char *want1, const char *want2) {
    return fails_with_vocab(json, 0, want1, want2);
}

#define VOCAB "\"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}"

static void test_load_errors(void) {
    base_err err;
    tok_tokenizer *tok = NULL;
    CHECK(tok_load("/nonexistent/model", 0, &tok, &err) == -1 && tok == NULL);
    CHECK(strstr(err.msg, "/nonexistent/model/tokenizer.json") != NULL);

    CHECK(fails_with("{\"model\": {", "t.json", "bad JSON"));
    CHECK(fails_with("[1, 2]", "t.json", "not an object"));
    CHECK(fails_with("{\"model\": {\"type\": \"Unigram\", \"vocab\": [[\"a\", 0.0]]}}", "Unigram",
                     "not supported"));
    CHECK(fails_with("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}}", "WordPiece",
                     "not supported"));
    CHECK(fails_with("{\"model\": {\"vocab\": {\"a\": 0}}}", "only BPE", NULL));
    CHECK(fails_with("{\"model\": {\"type\": \"BPE\", " VOCAB ", \"merges\": [\"a c\"]}}",
                     "merges[0]", "'a c'"));
    CHECK(fails_with("{\"model\": {\"type\": \"BPE\", " VOCAB ", \"merges\": [\"abc\"]}}",
                     "merges[0]", NULL));
    CHECK(fails_with("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -4}, \"merges\": []}}",
                     "vocab['a']", NULL));
    CHECK(fails_with("{\"model\": {\"type\": \"BPE\", " VOCAB ", \"merges\": []},"
                     " \"normalizer\": {\"type\": \"Precompiled\"}}",
                     "normalizer type 'Precompiled'", NULL));
    CHECK(fails_with("{\"model\": {\"type\": \"BPE\", " VOCAB ", \"merges\": []},"
                     " \"pre_tokenizer\": {\"type\": \"BertPreTokenizer\"}}",
                     "pre_tokenizer type 'BertPreTokenizer'", NULL));
    CHECK(fails_with("{\"model\": {\"type\": \"BPE\", " VOCAB ", \"merges\": []},"
                     " \"decoder\": {\"type\": \"CTC\"}}",
                     "decoder type 'CTC'", NULL));
    CHECK(fails_with("{\"model\": {\"type\": \"BPE\", " VOCAB ", \"merges\": []},"
                     " \"pre_tokenizer\": {\"type\": \"Split\", \"behavior\": \"Isolated\","
                     " \"pattern\": {\"Regex\": \"(a\"}}}",
                     "regex '(a'", NULL));
    CHECK(fails_with("{\"model\": {\"type\": \"BPE\", " VOCAB ", \"merges\": []},"
                     " \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\":"
                     " [{\"SpecialToken\": {\"id\": \"<s>\"}}], \"special_tokens\": {}}}",
                     "'<s>'", NULL));

    /* A directory with a broken tokenizer_config.json. */
    char dir[] = "/tmp/mlxcel_tok_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[256];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"model\": {\"type\": \"BPE\", " VOCAB ", \"merges\": [\"a b\"]}}", f);
    fclose(f);
    CHECK(tok_load(dir, 0, &tok, &err) == 0);
    tok_free(tok);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    f = fopen(path, "w");
    fputs("{\"bos_token\": ", f);
    fclose(f);
    CHECK(tok_load(dir, 0, &tok, &err) == -1 && strstr(err.msg, "tokenizer_config.json"));
    unlink(path);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    unlink(path);
    rmdir(dir);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Ids index tables as large as the largest id: one far past the tokens the file lists is
 * refused before anything that size is allocated (it used to cost seconds and gigabytes),
 * naming the token and the id. */
static void test_huge_ids(void) {
    static const struct {
        const char *json, *want1, *want2;
    } cases[] = {
        {"{\"model\": {\"type\": \"BPE\", " VOCAB ", \"merges\": []}, \"added_tokens\": [{\"id\": "
         "1000000000, \"content\": \"<x>\"}]}",
         "t.json: added_tokens[0] '<x>' has id 1000000000",
         "past twice the 4 tokens the file lists"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 2147483646}, \"merges\": "
         "[]}}",
         "t.json: model.vocab['b'] has id 2147483646", "past twice the 2 tokens the file lists"},
        {"{\"model\": {\"type\": \"BPE\", " VOCAB ", \"merges\": []}, \"post_processor\": "
         "{\"type\": \"BertProcessing\", \"cls\": [\"<c>\", 1000000000], \"sep\": [\"b\", 1]}}",
         "t.json: post_processor: cls id 1000000000", "past the 3 ids of the vocabulary"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double t0 = now_s();
        CHECK(fails_with(cases[i].json, cases[i].want1, cases[i].want2));
        CHECK_MSG(now_s() - t0 < 0.5, "case %zu took %.2f s", i, now_s() - t0);
    }
    /* Added tokens past the vocabulary are what they are for (ids 3 and 4 here). With the
     * model's vocab_size the ids must be below it; a model padded past the tokenizer loads. */
    static const char ok[] = "{\"model\": {\"type\": \"BPE\", " VOCAB ", \"merges\": []}, "
                             "\"added_tokens\": [{\"id\": 3, \"content\": \"<s>\"}, {\"id\": 4, "
                             "\"content\": \"</s>\"}, {\"id\": 0, \"content\": \"a\"}]}";
    CHECK(fails_with_vocab(ok, 4, "added_tokens[1] '</s>' has id 4",
                           "past the model's vocab_size 4"));
    static const int vocab_sizes[] = {0, 5, 32000};
    for (size_t i = 0; i < sizeof vocab_sizes / sizeof vocab_sizes[0]; i++) {
        tok_tokenizer *tok = NULL;
        base_err err;
        CHECK(tok_load_json(ok, strlen(ok), NULL, 0, "t.json", vocab_sizes[i], &tok, &err) == 0);
        CHECK(tok && tok_vocab_size(tok) == 5);
        tok_free(tok);
    }
    /* Holes: ids 3 and 4 unused, 5 of at most 2 * 4 listed tokens. */
    static const char holes[] = "{\"model\": {\"type\": \"BPE\", " VOCAB ", \"merges\": []}, "
                                "\"added_tokens\": [{\"id\": 5, \"content\": \"<s>\"}]}";
    tok_tokenizer *tok = NULL;
    base_err err;
    CHECK(tok_load_json(holes, strlen(holes), NULL, 0, "t.json", 0, &tok, &err) == 0);
    CHECK(tok && tok_vocab_size(tok) == 6 && tok_token_text(tok, 4) == NULL);
    tok_free(tok);
}

static void test_encode_errors(void) {
    tok_tokenizer *tok = tt_load("bl_tiny");
    int32_t *ids;
    size_t n;
    base_err err;
    /* A stray continuation byte at offset 3, an overlong encoding, a surrogate. */
    CHECK(tok_encode(tok, "abc\x80", 4, false, &ids, &n, &err) == -1);
    CHECK(strstr(err.msg, "byte 3") != NULL);
    CHECK(tok_encode(tok, "\xC0\xAF", 2, false, &ids, &n, &err) == -1);
    CHECK(tok_encode(tok, "x\xED\xA0\x80", 4, false, &ids, &n, &err) == -1);
    CHECK(strstr(err.msg, "byte 1") != NULL);
    /* Embedded NUL is text like any other. */
    CHECK(tok_encode(tok, "a\0b", 3, false, &ids, &n, &err) == 0 && n == 3 && ids[1] == 0);
    free(ids);
    tok_free(tok);
}

int main(void) {
    test_load_errors();
    test_huge_ids();
    test_encode_errors();
    TEST_MAIN_END();
}
