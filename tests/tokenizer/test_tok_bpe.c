/* The BPE core on two tiny hand-made tokenizers whose expected ids are worked out by hand from
 * the merge ranks, plus the long-word and multi-thread behaviour. */
#include "tok_test.h"

#include <pthread.h>

static void test_merge_order(void) {
    tok_tokenizer *tok = tt_load("sp_tiny");
    /* "▁hi": ▁+h (rank 0), then ▁h+i (rank 1). */
    CHECK(tt_encodes(tok, "hi", false, IDS(266)));
    /* The template adds <s> only when asked. */
    CHECK(tt_encodes(tok, "hi", true, IDS(1, 266)));
    /* "▁abc": b+c (rank 2) beats a+b (rank 3), then a+bc (rank 4). */
    CHECK(tt_encodes(tok, "abc", false, IDS(259, 269)));
    /* Equal ranks merge leftmost first: a a a -> aa a. */
    CHECK(tt_encodes(tok, "aaa", false, IDS(259, 270, 260)));
    CHECK(tt_encodes(tok, "aaaa", false, IDS(259, 270, 270)));
    /* Spaces become ▁ and each section gets one ▁ in front. */
    CHECK(tt_encodes(tok, "hi abc", false, IDS(266, 259, 269)));
    CHECK(tt_encodes(tok, "", true, IDS(1)));
    CHECK(tt_encodes(tok, "", false, NULL, 0));
    tok_free(tok);
}

static void test_byte_fallback(void) {
    tok_tokenizer *tok = tt_load("sp_tiny");
    /* '€' is not in the vocabulary: its bytes E2 82 AC become <0xE2> <0x82> <0xAC>, whose ids
     * are 3 + byte. */
    CHECK(tt_encodes(tok, "\xE2\x82\xAC", false, IDS(259, 3 + 0xE2, 3 + 0x82, 3 + 0xAC)));
    /* 'z' has no token either: one byte. */
    CHECK(tt_encodes(tok, "za", false, IDS(259, 3 + 'z', 260)));
    /* Special tokens in the text are matched before normalization. */
    CHECK(tt_encodes(tok, "a<s>b", false, IDS(259, 260, 1, 259, 261)));
    tok_free(tok);
}

static void test_byte_level(void) {
    tok_tokenizer *tok = tt_load("bl_tiny");
    /* " the" is one word; its bytes map to Ġ t h e; Ġ+t, h+e, then Ġt+he. */
    CHECK(tt_encodes(tok, " the", false, IDS(258)));
    /* "the" has no Ġ: h+e only. */
    CHECK(tt_encodes(tok, "the", false, IDS('t', 257)));
    /* Multi-byte characters become one id per byte (the id of a byte is its value here). */
    CHECK(tt_encodes(tok, "\xE2\x82\xAC", false, IDS(0xE2, 0x82, 0xAC)));
    /* Added tokens, special or not, and the template's suffix. */
    CHECK(tt_encodes(tok, "a<x>b<|end|>", true, IDS('a', 260, 'b', 259, 259)));
    /* The split regex keeps runs of spaces apart from the word that follows. */
    CHECK(tt_encodes(tok, "a   the", false, IDS('a', 0x20, 0x20, 258)));
    tok_free(tok);
}

static void test_long_word(void) {
    /* The SentencePiece-style file has no pre-tokenizer, so a whole text is one word: merging
     * must stay O(n log n). 400k symbols would take hours in a quadratic loop. */
    tok_tokenizer *tok = tt_load("sp_tiny");
    size_t n = 399999;
    char *text = malloc(n + 1);
    for (size_t i = 0; i < n; i++) text[i] = "abc"[i % 3];
    text[n] = 0;
    double t0 = base_now();
    int32_t *ids;
    size_t n_ids;
    base_err err;
    CHECK(tok_encode(tok, text, n, false, &ids, &n_ids, &err) == 0);
    double dt = base_now() - t0;
    CHECK_MSG(dt < 5.0, "400k-character word took %.2f s", dt);
    /* ▁ then "abc" (id 269) repeated. */
    bool all = n_ids == 1 + n / 3 && ids[0] == 259;
    for (size_t i = 1; all && i < n_ids; i++) all = ids[i] == 269;
    CHECK(all);
    free(ids);
    free(text);
    tok_free(tok);
}

typedef struct {
    const tok_tokenizer *tok;
    const char *text;
    int32_t *ids;
    size_t n;
} worker_arg;

static void *worker(void *p) {
    worker_arg *a = p;
    base_err err;
    for (int rep = 0; rep < 20; rep++) {
        free(a->ids);
        if (tok_encode(a->tok, a->text, strlen(a->text), true, &a->ids, &a->n, &err)) a->n = 0;
    }
    return NULL;
}

static void test_threads(void) {
    /* Encoding from several threads shares the word cache; every thread must get the result a
     * lone thread gets. */
    tok_tokenizer *tok = tt_load("bl_tiny");
    const char *text = "the the  the\n\tthe cat sat on the mat; the end. \xE2\x82\xAC the";
    int32_t *want;
    size_t n_want;
    base_err err;
    CHECK(tok_encode(tok, text, strlen(text), true, &want, &n_want, &err) == 0);
    pthread_t th[4];
    worker_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (worker_arg){tok, text, NULL, 0};
        pthread_create(&th[i], NULL, worker, &args[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK(args[i].n == n_want && memcmp(args[i].ids, want, n_want * sizeof *want) == 0);
        free(args[i].ids);
    }
    free(want);
    tok_free(tok);
}

static void test_lookups(void) {
    tok_tokenizer *tok = tt_load("sp_tiny");
    CHECK(tok_vocab_size(tok) == 271);
    CHECK(tok_token_id(tok, "abc") == 269);
    CHECK(tok_token_id(tok, "zzz") == -1);
    CHECK(strcmp(tok_token_text(tok, 266), "\xE2\x96\x81hi") == 0);
    CHECK(tok_token_text(tok, 271) == NULL);
    CHECK(tok_is_special(tok, 1) && !tok_is_special(tok, 260));
    /* tokenizer_config.json gives bos as a string and eos as an object. */
    CHECK(strcmp(tok_bos_token(tok), "<s>") == 0 && tok_bos_id(tok) == 1);
    CHECK(strcmp(tok_eos_token(tok), "</s>") == 0 && tok_eos_id(tok) == 2);
    tok_free(tok);
    tok = tt_load("bl_tiny"); /* no tokenizer_config.json */
    CHECK(strcmp(tok_bos_token(tok), "") == 0 && tok_bos_id(tok) == -1);
    CHECK(tok_is_special(tok, 259) && !tok_is_special(tok, 260));
    tok_free(tok);
}

/* Added-token flags: lstrip and rstrip swallow the spaces beside the token, single_word matches
 * only between non-word characters, normalized matches after the normalizer (here Lowercase). */
static const char k_flags_json[] =
    "{\"model\": {\"type\": \"BPE\", \"merges\": [\"h i\"], \"vocab\": {\" \": 0, \"a\": 1,"
    " \"b\": 2, \"h\": 3, \"i\": 4, \"<L>\": 5, \"<R>\": 6, \"w\": 7, \"hi\": 8}},"
    " \"normalizer\": {\"type\": \"Lowercase\"},"
    " \"added_tokens\": ["
    "  {\"id\": 5, \"content\": \"<L>\", \"lstrip\": true, \"normalized\": false, \"special\": "
    "true},"
    "  {\"id\": 6, \"content\": \"<R>\", \"rstrip\": true, \"normalized\": false, \"special\": "
    "true},"
    "  {\"id\": 9, \"content\": \"HI\", \"normalized\": true, \"special\": false},"
    "  {\"id\": 10, \"content\": \"ww\", \"single_word\": true, \"special\": false}]}";

static void test_added_flags(void) {
    tok_tokenizer *tok;
    base_err err;
    CHECK(tok_load_json(k_flags_json, strlen(k_flags_json), NULL, 0, "flags", 0, &tok, &err) == 0);
    if (!tok) return;
    CHECK(tok_vocab_size(tok) == 11);
    CHECK(tt_encodes(tok, "a  <L>b", false, IDS(1, 5, 2)));
    CHECK(tt_encodes(tok, "a<R>  b", false, IDS(1, 6, 2)));
    CHECK(tt_encodes(tok, "a <L> <R> b", false, IDS(1, 5, 0, 6, 2)));
    /* "HI" lowercases to "hi", which is then the added token, not the merged vocab "hi". */
    CHECK(tt_encodes(tok, "a HI b", false, IDS(1, 0, 9, 0, 2)));
    CHECK(tt_encodes(tok, "hi", false, IDS(9)));
    CHECK(tt_encodes(tok, "ww aww ww_", false, IDS(10, 0, 1, 7, 7, 0, 7, 7)));
    tok_free(tok);
}

int main(void) {
    test_merge_order();
    test_byte_fallback();
    test_byte_level();
    test_long_word();
    test_threads();
    test_lookups();
    test_added_flags();
    TEST_MAIN_END();
}
