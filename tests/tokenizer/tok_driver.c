/* Runs the tokenizer over many texts in one process for the conformance script, and times it
 * for the benchmark.
 *
 *   tok_driver DIR < texts.json    texts: a JSON array of strings. Prints a JSON array with,
 *                                  per text: ids (no special tokens), ids_special, the decodes
 *                                  of ids_special with and without special tokens, and
 *                                  whether streaming each id reproduced both decodes.
 *   tok_driver --bench DIR FILE    prints {"load_s", "encode_s", "bytes", "tokens"} */
#include "tokenizer/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static json_t *ids_json(const int32_t *ids, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

/* Streams ids one by one and compares the concatenated pieces with the full decode. */
static bool stream_matches(const tok_tokenizer *tok, const int32_t *ids, size_t n, bool skip,
                           const char *want, size_t want_len) {
    tok_stream *s = tok_stream_new(tok, skip);
    char *acc = NULL;
    size_t acc_len = 0;
    base_err err;
    bool ok = true;
    for (size_t i = 0; i <= n && ok; i++) {
        char *piece;
        size_t len;
        int rc = i < n ? tok_stream_push(s, ids[i], &piece, &len, &err)
                       : tok_stream_flush(s, &piece, &len, &err);
        if (rc) {
            ok = false;
            break;
        }
        acc = realloc(acc, acc_len + len + 1);
        memcpy(acc + acc_len, piece, len);
        acc_len += len;
        free(piece);
    }
    ok = ok && acc_len == want_len && (want_len == 0 || memcmp(acc, want, want_len) == 0);
    free(acc);
    tok_stream_free(s);
    return ok;
}

static int run_texts(const tok_tokenizer *tok) {
    json_error_t jerr;
    json_t *texts = json_loadf(stdin, JSON_ALLOW_NUL, &jerr);
    if (!json_is_array(texts)) {
        fprintf(stderr, "tok_driver: stdin: %s\n", jerr.text);
        return 1;
    }
    json_t *out = json_array();
    for (size_t i = 0; i < json_array_size(texts); i++) {
        const json_t *t = json_array_get(texts, i);
        json_t *r = json_object();
        base_err err;
        int32_t *ids, *ids_sp;
        size_t n, n_sp;
        if (tok_encode(tok, json_string_value(t), json_string_length(t), false, &ids, &n, &err) ||
            tok_encode(tok, json_string_value(t), json_string_length(t), true, &ids_sp, &n_sp,
                       &err)) {
            json_object_set_new(r, "error", json_string(err.msg));
            json_array_append_new(out, r);
            continue;
        }
        json_object_set_new(r, "ids", ids_json(ids, n));
        json_object_set_new(r, "ids_special", ids_json(ids_sp, n_sp));
        for (int skip = 0; skip < 2; skip++) {
            char *text;
            size_t len;
            if (tok_decode(tok, ids_sp, n_sp, skip, &text, &len, &err)) {
                json_object_set_new(r, "error", json_string(err.msg));
                continue;
            }
            json_object_set_new(r, skip ? "decoded_skip" : "decoded", json_stringn(text, len));
            json_object_set_new(r, skip ? "stream_skip_ok" : "stream_ok",
                                json_boolean(stream_matches(tok, ids_sp, n_sp, skip, text, len)));
            free(text);
        }
        free(ids);
        free(ids_sp);
        json_array_append_new(out, r);
    }
    json_dumpf(out, stdout, JSON_COMPACT);
    putchar('\n');
    json_decref(out);
    json_decref(texts);
    return 0;
}

static int run_bench(const char *dir, const char *file) {
    base_err err;
    char *data;
    size_t len;
    if (base_read_file(file, &data, &len, &err)) {
        fprintf(stderr, "tok_driver: %s\n", err.msg);
        return 1;
    }
    double t0 = base_now();
    tok_tokenizer *tok;
    if (tok_load(dir, 0, &tok, &err)) {
        fprintf(stderr, "tok_driver: %s\n", err.msg);
        free(data);
        return 1;
    }
    double t1 = base_now();
    int32_t *ids;
    size_t n;
    int rc = tok_encode(tok, data, len, false, &ids, &n, &err);
    double t2 = base_now();
    if (rc)
        fprintf(stderr, "tok_driver: %s\n", err.msg);
    else
        printf("{\"load_s\":%.4f,\"encode_s\":%.4f,\"bytes\":%zu,\"tokens\":%zu}\n", t1 - t0,
               t2 - t1, len, n);
    free(ids);
    free(data);
    tok_free(tok);
    return rc ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "--bench") == 0) return run_bench(argv[2], argv[3]);
    if (argc != 2) {
        fprintf(stderr, "usage: tok_driver DIR < texts.json | tok_driver --bench DIR FILE\n");
        return 2;
    }
    base_err err;
    tok_tokenizer *tok;
    if (tok_load(argv[1], 0, &tok, &err)) {
        fprintf(stderr, "tok_driver: %s\n", err.msg);
        return 1;
    }
    int rc = run_texts(tok);
    tok_free(tok);
    return rc;
}
