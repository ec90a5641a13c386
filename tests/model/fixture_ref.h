/* Reading the reference fixtures (tests/fixtures/<name>/: reference.json and logits.npy), shared
 * by the CPU and CUDA fixture tests. */
#ifndef MLXCEL_TEST_FIXTURE_REF_H
#define MLXCEL_TEST_FIXTURE_REF_H

#include "test.h"

#include "io/io.h"

#include <dirent.h>
#include <jansson.h>
#include <string.h>

typedef struct fixture_ref {
    int32_t *tokens;    /* (n_tokens) the prompt */
    int32_t *greedy;    /* (n_greedy) transformers' greedy continuation */
    double *margin_rel; /* (n_greedy) top-2 margin of each greedy step over the row's RMS */
    int n_tokens, n_greedy;
    float *logits; /* (n_tokens, vocab) transformers' logits of every position */
    int64_t vocab;
} fixture_ref;

static inline int32_t *fixture_read_ids(json_t *arr, int *n) {
    *n = (int)json_array_size(arr);
    int32_t *ids = malloc((size_t)(*n ? *n : 1) * sizeof *ids);
    for (int i = 0; i < *n; i++)
        ids[i] = (int32_t)json_integer_value(json_array_get(arr, (size_t)i));
    return ids;
}

static inline void fixture_ref_free(fixture_ref *ref) {
    free(ref->tokens);
    free(ref->greedy);
    free(ref->margin_rel);
    free(ref->logits);
    memset(ref, 0, sizeof *ref);
}

/* Loads dir's reference.json and logits.npy; -1 with err filled on any problem. */
static inline int fixture_ref_load(const char *dir, fixture_ref *ref, base_err *err) {
    memset(ref, 0, sizeof *ref);
    char *path = base_path_join(dir, "reference.json");
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    free(path);
    if (!root) return base_fail(err, "%s: reference.json: %s", dir, jerr.text);
    ref->tokens = fixture_read_ids(json_object_get(root, "tokens"), &ref->n_tokens);
    ref->greedy = fixture_read_ids(json_object_get(root, "greedy"), &ref->n_greedy);
    json_t *m = json_object_get(root, "greedy_top2_margin_rel");
    ref->margin_rel = calloc((size_t)(ref->n_greedy ? ref->n_greedy : 1), sizeof(double));
    bool margins_ok = json_array_size(m) == (size_t)ref->n_greedy;
    for (int i = 0; margins_ok && i < ref->n_greedy; i++)
        ref->margin_rel[i] = json_number_value(json_array_get(m, (size_t)i));
    json_decref(root);
    if (!margins_ok) {
        fixture_ref_free(ref);
        return base_fail(err, "%s: reference.json: greedy_top2_margin_rel does not match greedy",
                         dir);
    }
    int64_t shape[IO_MAX_DIMS];
    int ndim;
    char *npy = base_path_join(dir, "logits.npy");
    int rc = io_npy_read_f32(npy, &ref->logits, shape, &ndim, err);
    free(npy);
    if (rc == 0 && (ndim != 2 || shape[0] != ref->n_tokens))
        rc = base_fail(err, "%s: logits.npy is not [%d, vocab]", dir, ref->n_tokens);
    if (rc) {
        fixture_ref_free(ref);
        return -1;
    }
    ref->vocab = shape[1];
    return 0;
}

/* Largest per-position relative error of ours ([n, vocab]) against ref. */
static inline double fixture_max_position_error(const float *ours, const float *ref, int n,
                                                int vocab) {
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double e = test_rel_err(ours + (size_t)i * vocab, ref + (size_t)i * vocab, (size_t)vocab);
        if (e > worst) worst = e;
    }
    return worst;
}

static inline int fixture_cmp_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The fixtures under root (folders holding reference.json), sorted; names are heap strings. */
static inline int fixture_list(const char *root, char **names, int max) {
    DIR *d = opendir(root);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d)) && n < max;) {
        if (e->d_name[0] == '.') continue;
        char *dir = base_path_join(root, e->d_name);
        char *ref = base_path_join(dir, "reference.json");
        if (base_file_exists(ref)) names[n++] = base_xstrdup(e->d_name);
        free(ref);
        free(dir);
    }
    if (d) closedir(d);
    qsort(names, (size_t)n, sizeof *names, fixture_cmp_name);
    return n;
}

/* Runs run(name, dir, ctx) on every committed fixture (tests/fixtures), in name order. */
static inline void fixture_each(void (*run)(const char *, const char *, void *), void *ctx) {
    char *root = base_path_join(test_source_dir(), "tests/fixtures");
    char *names[256];
    int n = fixture_list(root, names, 256);
    CHECK_MSG(n >= 10, "expected the committed fixtures under %s, found %d", root, n);
    for (int i = 0; i < n; i++) {
        char *dir = base_path_join(root, names[i]);
        run(names[i], dir, ctx);
        free(dir);
        free(names[i]);
    }
    free(root);
}

/* A decode path to run every fixture through: MLXCEL_PAGED_ATTENTION_NATIVE's value (NULL:
 * unset, the planner's choice), its label, and the KV block size. */
typedef struct fixture_path {
    const char *native;
    const char *label;
    int block;
} fixture_path;

typedef struct fixture_path_run {
    const fixture_path *path;
    void (*run)(const char *, const char *, const char *, int);
} fixture_path_run;

static inline void fixture_path_one(const char *name, const char *dir, void *ctx) {
    const fixture_path_run *pr = (const fixture_path_run *)ctx;
    pr->run(name, dir, pr->path->label, pr->path->block);
}

/* Runs every committed fixture through each path with run(name, dir, label, block). */
static inline void fixture_run_paths(const fixture_path *paths, size_t n_paths,
                                     void (*run)(const char *, const char *, const char *, int)) {
    for (size_t p = 0; p < n_paths; p++) {
        if (paths[p].native)
            setenv("MLXCEL_PAGED_ATTENTION_NATIVE", paths[p].native, 1);
        else
            unsetenv("MLXCEL_PAGED_ATTENTION_NATIVE");
        fixture_path_run pr = {&paths[p], run};
        fixture_each(fixture_path_one, &pr);
    }
}

#endif
