/* The grammar module: GBNF parsing and its error messages, matching (accept and reject, split
 * UTF-8), masks over the demo tokenizer against a per-token check, the JSON Schema compiler
 * (every schema under tests/grammar/schemas walked at random, each document valid JSON), and
 * the refusal of keywords it does not implement. schema.test.mjs validates the same walks
 * against the schemas with ajv. */
#include "grammar/grammar.h"
#include "gram_walk.h"
#include "test.h"

#include <dirent.h>
#include <jansson.h>
#include <string.h>

static gram_grammar *parse_ok(const char *text) {
    gram_grammar *g = NULL;
    base_err err = {{0}};
    int rc = gram_parse(text, strlen(text), &g, &err);
    CHECK_MSG(rc == 0, "grammar %s: %s", text, err.msg);
    return rc ? NULL : g;
}

/* Whether the whole of s is a sentence of g (matched through a character vocabulary). */
static bool matches(const gram_grammar *g, const gram_vocab *v, const char *s, size_t len) {
    gram_matcher *m = gram_matcher_new(g, v);
    gram_state *st = gram_state_new(m);
    bool ok = gram_state_accept_bytes(st, s, len, NULL) == 0 && gram_state_can_end(st);
    gram_state_free(st);
    gram_matcher_free(m);
    return ok;
}

typedef struct match_case {
    const char *grammar;
    const char *yes[6]; /* sentences */
    const char *no[6];  /* non-sentences */
} match_case;

static void test_matching(const gram_vocab *chars) {
    static const match_case cases[] = {
        {"root ::= \"ab\" | \"a\" [0-9]+", {"ab", "a0", "a123"}, {"", "a", "abc", "a1b"}},
        {"root ::= [^a-c\\n]*", {"", "xyz", "d e"}, {"a", "xbx", "\n"}},
        {"# comment\nroot ::= x{2} y{1,} z{0,2} w{0,} # trailing\nx ::= \"x\"\ny ::= \"y\"\n"
         "z ::= \"z\"\nw ::= \"w\"",
         {"xxy", "xxyyzzw", "xxyz", "xxyww"},
         {"xy", "xxyzzz", "xxz", "xxyzzzw"}},
        {"root ::= \"\\x41\\u00e9\\U0001F600\\t\\\"\\\\\"",
         {"A\xC3\xA9\xF0\x9F\x98\x80\t\"\\"},
         {"A\xC3\xA9", "A\xC3\xA9\xF0\x9F\x98\x80\t\""}},
        {"root ::= . . \"!\"", {"ab!", "\xC3\xA9\xE4\xB8\xAD!"}, {"a!", "abc!"}},
        {"root ::= (\"(\" root \")\")*", {"", "()", "(())()", "((()))"}, {"(", ")(", "(()"}},
        {"root ::= \"[\" ( item (\",\" item)* )? \"]\"\nitem ::= [0-9]{1,3}",
         {"[]", "[1]", "[12,345,6]"},
         {"[,]", "[1234]", "[1,]"}},
        {"root ::= [a-z]{2,4} \"-\"? (\"x\" | )",
         {"ab", "abcd-", "abcx", "ab-x"},
         {"a", "abcde", "ab--", "x"}},
        {"root ::= [\\[\\]\\-]+", {"[", "]-[", "-"}, {"a", ""}},
        {"root ::= \"ab\"+? \"c\"{2}", {"cc", "abcc", "ababcc"}, {"c", "acc", "abccc"}},
        {"root ::=\n  \"a\" |\n  \"b\"\n\nroot2 ::= \"c\"", {"a", "b"}, {"c", "ab"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        gram_grammar *g = parse_ok(cases[i].grammar);
        if (!g) continue;
        for (int k = 0; k < 6 && cases[i].yes[k]; k++)
            CHECK_MSG(matches(g, chars, cases[i].yes[k], strlen(cases[i].yes[k])),
                      "grammar %zu should match '%s'", i, cases[i].yes[k]);
        for (int k = 0; k < 6 && cases[i].no[k]; k++)
            CHECK_MSG(!matches(g, chars, cases[i].no[k], strlen(cases[i].no[k])),
                      "grammar %zu should not match '%s'", i, cases[i].no[k]);
        gram_free(g);
    }
}

static void test_parse_errors(void) {
    static const struct {
        const char *text, *msg;
    } cases[] = {
        {"root ::= a\n", "line 1, column 10: undefined rule 'a'"},
        {"root ::= \"x\"\nroot ::= \"y\"\n", "line 2, column 1: rule 'root' is defined twice"},
        {"x ::= \"a\"\n", "no 'root' rule"},
        {"root ::= \"abc\n", "line 1, column 10: unterminated string literal"},
        {"root ::= [abc\n", "line 1, column 10: unterminated character class"},
        {"root ::= (\"a\" \n", "line 1, column 10: unclosed '('"},
        {"root ::= \"a\")\n", "line 1, column 13: ')' without a matching '('"},
        {"root ::= \"\\q\"\n", "line 1, column 11: unknown escape"},
        {"root ::= \"\\x4\"\n", "line 1, column 14: expected a hexadecimal digit"},
        {"root ::= \"\\uD800\"\n", "line 1, column 11: escape of a UTF-16 surrogate"},
        {"root ::= [z-a]\n", "line 1, column 12: character range whose end is before its start"},
        {"root ::= * \"a\"\n", "line 1, column 10: repetition with no element before it"},
        {"root ::= \"a\"{3,2}\n", "line 1, column 13: repetition {m,n} with n < m"},
        {"root ::= \"a\"{x}\n", "line 1, column 14: expected a repetition count"},
        {"root ::= \"a\"{99999}\n", "repetition count above 10000"},
        {"root ::= \"a\"\n  \"b\"\n", "line 2, column 3: expected a rule name"},
        {"root = \"a\"\n", "line 1, column 6: expected '::='"},
        {"\n\nroot ::= \"a\" @\n", "line 3, column 14: unexpected character"},
        {"root ::= expr\nexpr ::= expr \"+\" term | term\nterm ::= [0-9]\n",
         "line 2, column 1: left recursion: rule 'expr'"},
        {"root ::= a\na ::= b? a \"x\"\nb ::= \"y\"\n", "left recursion: rule 'a'"},
        {"root ::= (\"\" )* \"x\"\n", "left recursion: rule 'root'"},
        {"root ::= \"x\"** \"y\"\n", "left recursion: rule 'root'"},
        {"root ::= \"\xC3\"\n", "line 1, column 11: invalid UTF-8"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        gram_grammar *g = NULL;
        base_err err = {{0}};
        int rc = gram_parse(cases[i].text, strlen(cases[i].text), &g, &err);
        CHECK_MSG(rc == -1 && g == NULL && strstr(err.msg, cases[i].msg),
                  "case %zu: expected '%s', got '%s'", i, cases[i].msg, rc ? err.msg : "success");
        gram_free(g);
    }
}

/* Tokens that end inside a character: allowed when some allowed character completes them. */
static void test_partial_utf8(void) {
    gram_grammar *g = parse_ok("root ::= \"\xC3\xA9\" [a-z] | \"\xE4\xB8\xAD\"");
    if (!g) return;
    const char *bytes[] = {"\xC3",     "\xA9", "\xC3\xA9", "\xC3\xA8", "\xE4", "\xE4\xB8",
                           "\xB8\xAD", "\xAD", "\xC0\xAE", "\xE4\xB9", "x",    "\xA9x"};
    size_t lens[12];
    for (int i = 0; i < 12; i++) lens[i] = strlen(bytes[i]);
    gram_vocab *v = gram_vocab_new(bytes, lens, 12);
    gram_matcher *m = gram_matcher_new(g, v);
    gram_state *s = gram_state_new(m);
    uint32_t mask[1];
    base_err err;
    CHECK(gram_state_mask(s, mask, &err) == 0);
    CHECK_MSG(mask[0] == (1u << 0 | 1u << 2 | 1u << 4 | 1u << 5), "first mask %#x", mask[0]);
    gram_state *c = gram_state_clone(s);
    CHECK(gram_state_accept(s, 0, &err) == 0); /* \xC3: é is pending */
    CHECK(!gram_state_can_end(s));
    CHECK(gram_state_mask(s, mask, &err) == 0);
    CHECK_MSG(mask[0] == (1u << 1 | 1u << 11), "after C3 %#x", mask[0]);
    CHECK(gram_state_accept(s, 11, &err) == 0 && gram_state_can_end(s) && gram_state_done(s));
    CHECK(gram_state_accept(c, 5, &err) == 0); /* \xE4\xB8: 中 is pending */
    CHECK(gram_state_mask(c, mask, &err) == 0);
    CHECK_MSG(mask[0] == 1u << 7, "after E4 B8 %#x", mask[0]);
    CHECK(gram_state_accept(c, 3, &err) == -1 && strstr(err.msg, "token 3"));
    CHECK(gram_state_accept_bytes(c, "\xAD", 1, &err) == 0 && gram_state_can_end(c));
    gram_state_free(c);
    gram_state_free(s);
    gram_matcher_free(m);
    gram_vocab_free(v);
    gram_free(g);
}

/* Every state met on random walks: the trie walk's mask equals accepting each token on its
 * own, in a second matcher whose cache starts empty. */
static void check_masks(const gram_grammar *g, walk_ctx *w, int walks, uint64_t seed) {
    gram_matcher *m = gram_matcher_new(g, w->v), *ref = gram_matcher_new(g, w->v);
    int nw = gram_mask_words(w->v), vocab = gram_vocab_size(w->v), states = 0, bad = 0;
    uint32_t *mask = calloc((size_t)nw, sizeof *mask), *brute = calloc((size_t)nw, sizeof *brute);
    base_err err;
    w->rng = seed;
    for (int k = 0; k < walks; k++) {
        gram_state *s = gram_state_new(m), *r = gram_state_new(ref);
        for (int step = 0; step < 40; step++) {
            if (gram_state_mask(s, mask, &err)) break;
            memset(brute, 0, (size_t)nw * sizeof *brute);
            for (int t = 0; t < vocab; t++) {
                gram_state *c = gram_state_clone(r);
                if (gram_state_accept(c, t, NULL) == 0) brute[t / 32] |= 1u << (t % 32);
                gram_state_free(c);
            }
            states++;
            if (memcmp(mask, brute, (size_t)nw * sizeof *mask)) bad++;
            int n = 0;
            for (int t = 0; t < vocab; t++)
                if (mask[t / 32] >> (t % 32) & 1) w->allowed[n++] = t;
            if (n == 0) break;
            int32_t t = w->allowed[test_rand_u32(&w->rng) % (uint32_t)n];
            if (gram_state_accept(s, t, &err) || gram_state_accept(r, t, &err)) break;
        }
        gram_state_free(s);
        gram_state_free(r);
    }
    CHECK_MSG(bad == 0 && states >= walks * 2, "%d of %d masks differ from the per-token check",
              bad, states);
    gram_stats st;
    gram_matcher_stats(m, &st);
    CHECK(st.masks == (uint64_t)states && st.mask_hits > 0);
    free(mask);
    free(brute);
    gram_matcher_free(m);
    gram_matcher_free(ref);
}

static gram_grammar *compile_schema(const char *schema, size_t len, base_err *err) {
    char *gbnf;
    if (gram_schema_to_gbnf(schema, len, &gbnf, err)) return NULL;
    gram_grammar *g = NULL;
    if (gram_parse(gbnf, strlen(gbnf), &g, err)) base_fail_wrap(err, "compiled grammar");
    free(gbnf);
    return g;
}

static void test_masks(const tok_tokenizer *tok) {
    walk_ctx w;
    base_err err;
    if (walk_init_tokenizer(&w, tok, 7, &err)) {
        CHECK_MSG(0, "%s", err.msg);
        return;
    }
    gram_vocab *v;
    CHECK(gram_vocab_from_tokenizer(tok, &v, &err) == 0);
    CHECK(gram_vocab_size(v) == 32000 && gram_mask_words(v) == 1000);
    gram_vocab_free(v);
    char *path = base_path_join(test_source_dir(), "tests/grammar/schemas/26-issue.json"), *text;
    size_t len;
    if (base_read_file(path, &text, &len, &err) == 0) {
        gram_grammar *g = compile_schema(text, len, &err);
        CHECK_MSG(g, "%s", err.msg);
        if (g) check_masks(g, &w, 6, 11);
        gram_free(g);
        free(text);
    }
    free(path);
    char *obj = gram_json_object_gbnf();
    gram_grammar *g = parse_ok(obj);
    if (g) check_masks(g, &w, 6, 12);
    gram_free(g);
    free(obj);
    /* runs of plain characters the trie walk takes whole: ASCII only (a token with a character
     * past it must not be allowed), a bounded run, one with a single character past ASCII, and
     * characters past ASCII only */
    static const char *const runs[] = {
        "root ::= [a-z ]* \".\"",
        "root ::= [a-z ]{0,12} \".\"",
        "root ::= ([a-z ] | \"\xC3\xA9\")* \"!\"",
        "root ::= \"\xC3\xA9t\xC3\xA9 \" [\xE4\xB8\x80-\xE9\xBF\xBF]+ \" \xF0\x9F\x98\x80\"",
    };
    for (int i = 0; i < 4; i++) {
        g = parse_ok(runs[i]);
        if (g) check_masks(g, &w, 8, 13 + (uint64_t)i);
        gram_free(g);
    }
    walk_free(&w);
}

/* Random documents of every schema under tests/grammar/schemas: valid JSON each, over single
 * characters and over the demo tokenizer's tokens. */
static void test_schemas(const tok_tokenizer *tok) {
    char *dir = base_path_join(test_source_dir(), "tests/grammar/schemas");
    DIR *d = opendir(dir);
    CHECK_MSG(d, "cannot open %s", dir);
    if (!d) {
        free(dir);
        return;
    }
    walk_ctx chars, toks;
    base_err err;
    walk_init_chars(&chars, 3);
    if (walk_init_tokenizer(&toks, tok, 5, &err)) {
        CHECK_MSG(0, "%s", err.msg);
        closedir(d);
        free(dir);
        return;
    }
    int n_schemas = 0, n_docs = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strstr(e->d_name, ".json")) continue;
        char *path = base_path_join(dir, e->d_name), *text;
        size_t len;
        if (base_read_file(path, &text, &len, &err)) {
            CHECK_MSG(0, "%s", err.msg);
            free(path);
            continue;
        }
        gram_grammar *g = compile_schema(text, len, &err);
        CHECK_MSG(g, "%s: %s", e->d_name, err.msg);
        free(text);
        free(path);
        if (!g) continue;
        n_schemas++;
        for (int pass = 0; pass < 2; pass++) {
            walk_ctx *w = pass ? &toks : &chars;
            gram_matcher *m = gram_matcher_new(g, w->v);
            for (int k = 0; k < (pass ? 4 : 40); k++) {
                char *doc;
                size_t dl;
                int steps = walk_sentence(w, m, 200, &doc, &dl, &err);
                CHECK_MSG(steps > 0, "%s: %s", e->d_name, err.msg);
                json_error_t je;
                json_t *j = json_loadb(doc, dl, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
                CHECK_MSG(j, "%s: not JSON (%s): %s", e->d_name, je.text, doc);
                json_decref(j);
                n_docs++;
                free(doc);
            }
            gram_matcher_free(m);
        }
        gram_free(g);
    }
    closedir(d);
    free(dir);
    CHECK_MSG(n_schemas >= 20, "only %d schemas", n_schemas);
    printf("%d schemas, %d documents\n", n_schemas, n_docs);
    walk_free(&chars);
    walk_free(&toks);
}

static void test_refused(void) {
    static const struct {
        const char *schema, *msg;
    } cases[] = {
        {"{\"type\":\"string\",\"pattern\":\"^a\"}", "keyword 'pattern' at #: not supported"},
        {"{\"properties\":{\"a\":{\"type\":\"number\",\"multipleOf\":3}}}",
         "keyword 'multipleOf' at #/properties/a: not supported"},
        {"{\"type\":\"array\",\"uniqueItems\":true}", "keyword 'uniqueItems' at #"},
        {"{\"not\":{\"type\":\"null\"}}", "keyword 'not' at #"},
        {"{\"if\":{},\"then\":{}}", "keyword 'if' at #"},
        {"{\"type\":\"object\",\"patternProperties\":{\"^x\":{}}}", "keyword 'patternProperties'"},
        {"{\"$defs\":{\"a\":{\"type\":\"object\",\"minProperties\":1}},\"$ref\":\"#/$defs/a\"}",
         "keyword 'minProperties' at #/$defs/a"},
        {"{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"string\"},{\"contains\":{}}]}}",
         "keyword 'contains' at #/items/anyOf/1"},
        {"{\"type\":\"string\",\"format\":\"uri\"}", "keyword 'format' at #: only date"},
        {"{\"type\":\"integer\",\"format\":\"int32\"}",
         "keyword 'format' at #: supported on strings"},
        {"{\"type\":\"number\",\"minimum\":0.5}", "keyword 'minimum' at #: a fractional bound"},
        {"{\"type\":\"number\",\"exclusiveMinimum\":0}", "keyword 'exclusiveMinimum' at #"},
        {"{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "no integer of at most 16"},
        {"{\"type\":\"integer\",\"minimum\":1e17}", "keyword 'minimum' at #: no integer"},
        {"{\"type\":\"number\",\"minimum\":1e17}", "keyword 'minimum' at #: past the 16"},
        {"{\"type\":\"string\",\"minLength\":3,\"maxLength\":2}", "keyword 'minLength' at #"},
        {"{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", "keyword 'minItems' at #"},
        {"{\"type\":\"array\",\"items\":[{}]}", "keyword 'items' at #: an array of schemas"},
        {"{\"$ref\":\"#/$defs/missing\"}", "keyword '$ref' at #"},
        {"{\"$ref\":\"http://example.com/s.json\"}", "keyword '$ref' at #"},
        {"{\"$ref\":\"#/$defs/a\",\"type\":\"object\",\"$defs\":{\"a\":{}}}",
         "keyword 'type' at #: not supported beside $ref"},
        {"{\"enum\":[1,2],\"minimum\":2}", "keyword 'minimum' at #: not supported beside enum"},
        {"{\"type\":\"string\",\"enum\":[1,2]}", "keyword 'enum' at #: no value is allowed"},
        {"{\"enum\":\"a\"}", "keyword 'enum' at #: must be an array"},
        {"{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"strin\"}}}",
         "keyword 'type' at #/properties/x: unknown type 'strin'"},
        {"{\"allOf\":[{\"type\":\"string\"},{\"maxLength\":3}]}", "keyword 'type' at #/allOf/0"},
        {"{\"allOf\":[{\"properties\":{\"a\":{}},\"additionalProperties\":false},"
         "{\"properties\":{\"b\":{}}}]}",
         "keyword 'additionalProperties' at #/allOf/0"},
        {"{\"properties\":{\"a~b/c\":{\"dependentRequired\":{}}}}",
         "keyword 'dependentRequired' at #/properties/a~0b~1c"},
        {"{\"required\":[\"z\"],\"additionalProperties\":false}", "keyword 'required' at #"},
        {"{\"type\":\"object\",\"properties\":{\"a\":false}}", "#/properties/a: a schema must be"},
        {"{\"type\":", "json schema: line 1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *gbnf = NULL;
        base_err err = {{0}};
        int rc = gram_schema_to_gbnf(cases[i].schema, strlen(cases[i].schema), &gbnf, &err);
        CHECK_MSG(rc == -1 && strstr(err.msg, cases[i].msg), "case %zu: expected '%s', got '%s'", i,
                  cases[i].msg, rc ? err.msg : "success");
        free(gbnf);
    }
}

/* Specific documents accepted or refused by compiled schemas (the walks only show that what
 * the grammar makes is valid; these show it makes what the schema needs, and no more). */
static void test_schema_language(const gram_vocab *chars) {
    static const struct {
        const char *schema;
        const char *yes[5], *no[5];
    } cases[] = {
        {"{\"type\":\"integer\",\"minimum\":-12,\"maximum\":345}",
         {"-12", "0", "345", "99", "-1"},
         {"-13", "346", "1000", "01", "-0"}},
        {"{\"type\":\"integer\",\"exclusiveMinimum\":7,\"exclusiveMaximum\":10}",
         {"8", "9"},
         {"7", "10", "8.0"}},
        {"{\"type\":\"number\",\"minimum\":-2,\"maximum\":3}",
         {"-2", "-1.99", "3.000", "0.5", "2.999"},
         {"-2.01", "3.01", "4", "1e2"}},
        {"{\"type\":\"integer\",\"minimum\":-1e300,\"maximum\":9223372036854775807}",
         {"-9999999999999999", "9999999999999999", "0"},
         {"10000000000000000"}},
        {"{\"type\":\"number\",\"minimum\":9999999999999998,\"maximum\":9999999999999999}",
         {"9999999999999998.5", "9999999999999999", "9999999999999999.00"},
         {"9999999999999999.5", "9999999999999997"}},
        {"{\"type\":\"number\",\"maximum\":1e300}", {"-3.5", "9999999999999999.5"}, {"1e5"}},
        {"{\"type\":\"string\",\"format\":\"date\"}",
         {"\"2024-02-29\"", "\"2000-02-29\"", "\"2023-12-31\"", "\"1999-04-30\""},
         {"\"2023-02-29\"", "\"1900-02-29\"", "\"2023-04-31\"", "\"2023-13-01\"",
          "\"2023-00-10\""}},
        {"{\"type\":\"string\",\"format\":\"date-time\"}",
         {"\"2024-01-02T03:04:05Z\"", "\"2024-01-02T23:59:59.123+05:30\""},
         {"\"2024-01-02T24:00:00Z\"", "\"2024-01-02T03:04:05\"", "\"2024-01-02 03:04:05Z\""}},
        {"{\"type\":\"string\",\"format\":\"uuid\"}",
         {"\"123e4567-e89b-12d3-a456-426614174000\""},
         {"\"123e4567e89b12d3a456426614174000\"", "\"123e4567-e89b-12d3-a456-42661417400\""}},
        {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}",
         {"\"ab\"", "\"a\\nb\"", "\"\\u00e9\xC3\xA9\""},
         {"\"a\"", "\"abcd\"", "\"\\ud83d\\ude00\"", "\"a\nb\""}},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":"
         "\"boolean\"}},\"required\":[\"b\"]}",
         {"{\"b\":true}", "{\"a\":1,\"b\":false}", "{ \"a\" : 1 ,\n  \"b\": true }"},
         {"{}", "{\"a\":1}", "{\"b\":true,\"a\":1}", "{\"b\":true,\"c\":1}", "{\"b\":true,}"}},
        {"{\"type\":\"object\",\"properties\":{\"ab\":{\"type\":\"integer\"}},"
         "\"additionalProperties\":"
         "{\"type\":\"null\"}}",
         {"{\"ab\":1,\"a\":null}", "{\"abc\":null}", "{\"b\":null,\"x\":null}", "{}"},
         {"{\"ab\":null}", "{\"ab\":1,\"ab\":null}", "{\"a\":1}"}},
        {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"integer\"}],"
         "\"items\":{\"type\":\"boolean\"},\"minItems\":1,\"maxItems\":3}",
         {"[\"a\"]", "[\"a\",1]", "[\"a\",1,true]"},
         {"[]", "[1]", "[\"a\",true]", "[\"a\",1,true,false]"}},
        {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2,\"maxItems\":3}",
         {"[1,2]", "[1, 2, 3]", "[\n  1,\n  2\n]"},
         {"[1]", "[1,2,3,4]", "[1,,2]", "[1,2]   ", "[1,                        2]"}},
        {"{\"const\":[1,{\"a\":null}]}", {"[1,{\"a\":null}]"}, {"1", "[1]"}},
        {"{\"anyOf\":[{\"type\":\"null\"},{\"enum\":[\"x\",3]}]}",
         {"null", "\"x\"", "3"},
         {"\"y\"", "4", "\"null\""}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        base_err err;
        gram_grammar *g = compile_schema(cases[i].schema, strlen(cases[i].schema), &err);
        CHECK_MSG(g, "schema %zu: %s", i, err.msg);
        if (!g) continue;
        for (int k = 0; k < 5 && cases[i].yes[k]; k++)
            CHECK_MSG(matches(g, chars, cases[i].yes[k], strlen(cases[i].yes[k])),
                      "schema %zu should accept %s", i, cases[i].yes[k]);
        for (int k = 0; k < 5 && cases[i].no[k]; k++)
            CHECK_MSG(!matches(g, chars, cases[i].no[k], strlen(cases[i].no[k])),
                      "schema %zu should refuse %s", i, cases[i].no[k]);
        gram_free(g);
    }
}

/* gram_mask_apply: left-out ids (and ids past the vocabulary, a padded row) to -inf, the rest
 * untouched. */
static void test_mask_apply(void) {
    const char *bytes[70];
    size_t lens[70];
    for (int i = 0; i < 70; i++) {
        bytes[i] = "a";
        lens[i] = 1;
    }
    gram_vocab *v = gram_vocab_new(bytes, lens, 70);
    CHECK(gram_mask_words(v) == 3);
    uint32_t mask[3] = {UINT32_MAX, 0, 0x5};
    float logits[80];
    for (int i = 0; i < 80; i++) logits[i] = (float)i;
    gram_mask_apply(v, mask, logits, 80);
    int bad = 0;
    for (int i = 0; i < 80; i++) {
        bool keep = i < 32 || i == 64 || i == 66;
        if (keep ? logits[i] != (float)i : !(isinf(logits[i]) && logits[i] < 0)) bad++;
    }
    CHECK_MSG(bad == 0, "%d logits wrong", bad);
    gram_vocab_free(v);
}

/* Clones advance on their own; done, can_end and min_remaining follow the input. */
static void test_states(const gram_vocab *chars) {
    gram_grammar *g = parse_ok("root ::= \"ab\" [0-9]{0,2} | \"abc\"");
    if (!g) return;
    gram_matcher *m = gram_matcher_new(g, chars);
    gram_state *s = gram_state_new(m);
    base_err err;
    CHECK(gram_state_min_remaining(s) == 2 && !gram_state_can_end(s) && !gram_state_done(s));
    CHECK(gram_state_accept_bytes(s, "ab", 2, &err) == 0);
    gram_state *c = gram_state_clone(s);
    CHECK(gram_state_accept_bytes(c, "c", 1, &err) == 0 && gram_state_done(c));
    CHECK(gram_state_can_end(s) && !gram_state_done(s) && gram_state_min_remaining(s) == 0);
    CHECK(gram_state_accept_bytes(s, "1x", 2, &err) == -1 && strstr(err.msg, "byte 1 (0x78)"));
    CHECK(gram_state_accept_bytes(s, "12", 2, &err) == 0 && gram_state_done(s));
    CHECK(gram_state_accept_bytes(c, "1", 1, &err) == -1); /* the clone stayed after "abc" */
    uint32_t mask[4];
    CHECK(gram_state_mask(c, mask, &err) == 0 && !mask[0] && !mask[1] && !mask[2] && !mask[3]);
    gram_state_free(c);
    gram_state_free(s);
    gram_matcher_free(m);
    gram_free(g);
}

/* Past its bound on states the matcher drops its cache; live states carry on from their own
 * copy of their stacks. 9 runs of up to 8000 letters: far more states than the bound. */
static void test_cache_drop(const gram_vocab *chars) {
    gram_grammar *g = parse_ok("root ::= x{1,9} \".\"\nx ::= [a-z]{1,8000} \" \"");
    if (!g) return;
    gram_matcher *m = gram_matcher_new(g, chars);
    gram_state *s = gram_state_new(m), *early = NULL;
    base_err err;
    char run[8001];
    memset(run, 'q', 8000);
    run[8000] = ' ';
    int rc = 0;
    for (int k = 0; k < 9 && !rc; k++) {
        for (int i = 0; i < 8001 && !rc; i++) rc = gram_state_accept_bytes(s, run + i, 1, &err);
        if (k == 0) early = gram_state_clone(s);
    }
    CHECK_MSG(rc == 0, "%s", err.msg);
    gram_stats st;
    gram_matcher_stats(m, &st);
    CHECK_MSG(st.resets >= 1, "%llu resets", (unsigned long long)st.resets);
    /* after 9 runs only the final "." may come; the clone taken after one may go on */
    uint32_t mask[8];
    CHECK(gram_state_mask(s, mask, &err) == 0);
    int dot = -1;
    for (int t = 0; t < gram_vocab_size(chars); t++)
        if (mask[t / 32] >> (t % 32) & 1) dot = dot == -1 ? t : -2;
    CHECK_MSG(dot >= 0, "one token (the dot) allowed, got %d", dot);
    CHECK(gram_state_accept_bytes(s, ".", 1, &err) == 0 && gram_state_can_end(s));
    /* new states over the slots the clone's old ids named, before the clone is used */
    gram_state *t = gram_state_new(m);
    for (int i = 0; i < 2 * 8001 && !rc; i++)
        rc = gram_state_accept_bytes(t, run + i % 8001, 1, &err);
    CHECK(rc == 0);
    gram_state_free(t);
    /* the clone may end at once (a mid-run state may not): a stale id would show */
    gram_state *e2 = early ? gram_state_clone(early) : NULL;
    CHECK(e2 && gram_state_accept_bytes(e2, ".", 1, &err) == 0 && gram_state_can_end(e2));
    CHECK(early && gram_state_accept_bytes(early, "ab .", 4, &err) == 0 &&
          gram_state_can_end(early));
    gram_state_free(e2);
    gram_state_free(early);
    gram_state_free(s);
    gram_matcher_free(m);
    gram_free(g);
}

int main(void) {
    walk_ctx chars;
    walk_init_chars(&chars, 1);
    test_matching(chars.v);
    test_parse_errors();
    test_partial_utf8();
    test_refused();
    test_schema_language(chars.v);
    test_mask_apply();
    test_states(chars.v);
    test_cache_drop(chars.v);
    walk_free(&chars);

    tok_tokenizer *tok = NULL;
    base_err err;
    char *dir = base_path_join(test_source_dir(), "models/demo");
    CHECK_MSG(tok_load(dir, 0, &tok, &err) == 0, "%s", err.msg);
    free(dir);
    if (tok) {
        test_masks(tok);
        test_schemas(tok);
        tok_free(tok);
    }
    TEST_MAIN_END();
}
