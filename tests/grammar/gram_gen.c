/* Prints random documents of a JSON Schema's grammar, one a line as a JSON string, for the
 * ajv check (schema.test.mjs):
 *   gram_gen (--schema FILE | --json-object) [-n N] [--seed S] [--tokenizer DIR] [--gbnf]
 * Walks over single characters, or over the tokenizer's tokens with --tokenizer; --gbnf prints
 * the compiled grammar instead. */
#include "grammar/grammar.h"
#include "gram_walk.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int run(int argc, char **argv, base_err *err) {
    const char *schema_path = NULL, *tok_dir = NULL;
    bool json_object = false, print_gbnf = false;
    int n = 20;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *next = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--schema") && next)
            schema_path = argv[++i];
        else if (!strcmp(a, "--tokenizer") && next)
            tok_dir = argv[++i];
        else if (!strcmp(a, "-n") && next)
            n = atoi(argv[++i]);
        else if (!strcmp(a, "--seed") && next)
            seed = strtoull(argv[++i], NULL, 10) | 1;
        else if (!strcmp(a, "--json-object"))
            json_object = true;
        else if (!strcmp(a, "--gbnf"))
            print_gbnf = true;
        else
            return base_fail(err, "usage: gram_gen (--schema FILE | --json-object) [-n N] "
                                  "[--seed S] [--tokenizer DIR] [--gbnf]");
    }
    char *gbnf = NULL;
    if (json_object) {
        gbnf = gram_json_object_gbnf();
    } else {
        char *text;
        size_t len;
        if (!schema_path) return base_fail(err, "gram_gen: --schema or --json-object is needed");
        if (base_read_file(schema_path, &text, &len, err)) return -1;
        int rc = gram_schema_to_gbnf(text, len, &gbnf, err);
        free(text);
        if (rc) return -1;
    }
    if (print_gbnf) {
        fputs(gbnf, stdout);
        free(gbnf);
        return 0;
    }
    gram_grammar *g;
    int rc = gram_parse(gbnf, strlen(gbnf), &g, err);
    free(gbnf);
    if (rc) return -1;
    walk_ctx w;
    tok_tokenizer *tok = NULL;
    if (tok_dir) {
        if (tok_load(tok_dir, 0, &tok, err) || walk_init_tokenizer(&w, tok, seed, err)) {
            tok_free(tok);
            gram_free(g);
            return -1;
        }
    } else {
        walk_init_chars(&w, seed);
    }
    gram_matcher *m = gram_matcher_new(g, w.v);
    for (int i = 0; i < n && !rc; i++) {
        char *doc;
        size_t len;
        rc = walk_sentence(&w, m, 200, &doc, &len, err) < 0;
        if (!rc) {
            json_t *s = json_stringn(doc, len);
            char *line = s ? json_dumps(s, JSON_ENCODE_ANY) : NULL;
            if (!line)
                rc = base_fail(err, "gram_gen: a document is not valid UTF-8: %s", doc);
            else
                puts(line);
            free(line);
            json_decref(s);
        }
        free(doc);
    }
    gram_matcher_free(m);
    walk_free(&w);
    tok_free(tok);
    gram_free(g);
    return rc ? -1 : 0;
}

int main(int argc, char **argv) {
    base_err err = {{0}};
    if (run(argc, argv, &err)) {
        fprintf(stderr, "gram_gen: error: %s\n", err.msg);
        return 1;
    }
    return 0;
}
