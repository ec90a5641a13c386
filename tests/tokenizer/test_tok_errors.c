/* Loading and encoding errors: each names what is at fault. */
#include "tok_test.h"

#include <stdlib.h>
#include <unistd.h>

/* Loads json and expects a failure whose message contains every one of want[]. */
static bool fails_with(const char *json, const char *want1, const char *want2) {
    tok_tokenizer *tok = NULL;
    base_err err = {{0}};
    int rc = tok_load_json(json, strlen(json), NULL, 0, "t.json", &tok, &err);
    bool ok =
        rc == -1 && tok == NULL && strstr(err.msg, want1) && (!want2 || strstr(err.msg, want2));
    if (!ok) fprintf(stderr, "got rc %d, message '%s'\n", rc, err.msg);
    tok_free(tok);
    return ok;
}

#define VOCAB "\"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}"

static void test_load_errors(void) {
    base_err err;
    tok_tokenizer *tok = NULL;
    CHECK(tok_load("/nonexistent/model", &tok, &err) == -1 && tok == NULL);
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
    CHECK(tok_load(dir, &tok, &err) == 0);
    tok_free(tok);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    f = fopen(path, "w");
    fputs("{\"bos_token\": ", f);
    fclose(f);
    CHECK(tok_load(dir, &tok, &err) == -1 && strstr(err.msg, "tokenizer_config.json"));
    unlink(path);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    unlink(path);
    rmdir(dir);
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
    test_encode_errors();
    TEST_MAIN_END();
}
