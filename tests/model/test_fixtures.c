/* Every fixture in tests/fixtures (tiny random-weight models of each family and quantization,
 * made by tools/reference/make_fixtures.py with Hugging Face transformers): the logits of
 * every position must match transformers' within 1e-3 relative error, and the greedy
 * continuation must be identical. Each fixture also runs through the other decode paths
 * (gather, v2) and a block size of 16: the pool must not change the answer. */
#include "test.h"

#include "engine/engine.h"
#include "io/io.h"

#include <dirent.h>
#include <jansson.h>
#include <string.h>

typedef struct fixture_ref {
    int32_t *tokens, *greedy;
    int n_tokens, n_greedy;
} fixture_ref;

static int32_t *read_ids(json_t *arr, int *n) {
    *n = (int)json_array_size(arr);
    int32_t *ids = malloc((size_t)(*n ? *n : 1) * sizeof *ids);
    for (int i = 0; i < *n; i++)
        ids[i] = (int32_t)json_integer_value(json_array_get(arr, (size_t)i));
    return ids;
}

static int load_ref(const char *dir, fixture_ref *ref) {
    char *path = base_path_join(dir, "reference.json");
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    free(path);
    if (!root) return -1;
    ref->tokens = read_ids(json_object_get(root, "tokens"), &ref->n_tokens);
    ref->greedy = read_ids(json_object_get(root, "greedy"), &ref->n_greedy);
    json_decref(root);
    return 0;
}

/* Largest per-position relative error of ours against ref. */
static double max_position_error(const float *ours, const float *ref, int n, int vocab) {
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double e = test_rel_err(ours + (size_t)i * vocab, ref + (size_t)i * vocab, (size_t)vocab);
        if (e > worst) worst = e;
    }
    return worst;
}

static void run_fixture(const char *name, const char *dir, const char *variant, int block_size) {
    fixture_ref ref;
    if (load_ref(dir, &ref)) {
        CHECK_MSG(0, "%s: cannot read reference.json", name);
        return;
    }
    float *want;
    int64_t shape[8];
    int ndim;
    base_err err;
    char *npy = base_path_join(dir, "logits.npy");
    int rc = io_npy_read_f32(npy, &want, shape, &ndim, &err);
    free(npy);
    CHECK_MSG(rc == 0, "%s: %s", name, err.msg);
    if (rc) return;

    engine_options o;
    engine_options_defaults(&o);
    o.device = "cpu";
    o.n_threads = 2;
    o.kv_block_size = block_size;
    o.ctx_size = ref.n_tokens + ref.n_greedy + 1;
    engine_runtime *rt;
    rc = engine_runtime_open(dir, &o, &rt, &err);
    CHECK_MSG(rc == 0, "%s: %s", name, err.msg);
    if (rc == 0) {
        int vocab = model_config(rt->model)->vocab_size;
        CHECK(ndim == 2 && shape[0] == ref.n_tokens && shape[1] == vocab);
        float *got;
        rc = engine_prefill_logits(rt, ref.tokens, ref.n_tokens, &got, NULL, &err);
        CHECK_MSG(rc == 0, "%s: %s", name, err.msg);
        if (rc == 0) {
            double e = max_position_error(got, want, ref.n_tokens, vocab);
            printf("  %-28s %-8s block %2d  max rel err %.2e", name, variant, block_size, e);
            CHECK_MSG(e < 1e-3, "%s (%s): logits rel err %.3e", name, variant, e);
            free(got);
        }
        engine_sampling greedy;
        engine_sampling_defaults(&greedy);
        greedy.temperature = 0;
        engine_generate_result res;
        rc = engine_generate(rt, ref.tokens, ref.n_tokens, ref.n_greedy, &greedy, NULL, NULL, &res,
                             &err);
        CHECK_MSG(rc == 0, "%s: %s", name, err.msg);
        if (rc == 0) {
            bool same = res.n_tokens == ref.n_greedy;
            for (int i = 0; same && i < res.n_tokens; i++) same = res.tokens[i] == ref.greedy[i];
            printf("  greedy %s\n", same ? "identical" : "DIFFERENT");
            CHECK_MSG(same, "%s (%s): greedy continuation differs", name, variant);
            free(res.tokens);
        }
        base_err perr;
        CHECK_MSG(kv_pool_check(rt->pool, &perr) == 0, "%s: %s", name, perr.msg);
        engine_runtime_close(rt);
    }
    free(want);
    free(ref.tokens);
    free(ref.greedy);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(void) {
    char *root = base_path_join(test_source_dir(), "tests/fixtures");
    DIR *d = opendir(root);
    CHECK_MSG(d != NULL, "no fixtures directory at %s", root);
    char *names[256];
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d)) && n < 256;) {
        if (e->d_name[0] == '.') continue;
        char *dir = base_path_join(root, e->d_name);
        char *ref = base_path_join(dir, "reference.json");
        if (base_file_exists(ref)) names[n++] = base_xstrdup(e->d_name);
        free(ref);
        free(dir);
    }
    if (d) closedir(d);
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    CHECK_MSG(n >= 10, "expected the committed fixtures, found %d", n);
    static const struct {
        const char *native;
        const char *label;
        int block;
    } paths[] = {{NULL, "auto", 32}, {"0", "gather", 32}, {"1", "v2", 16}};
    for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
        if (paths[p].native)
            setenv("MLXCEL_PAGED_ATTENTION_NATIVE", paths[p].native, 1);
        else
            unsetenv("MLXCEL_PAGED_ATTENTION_NATIVE");
        for (int i = 0; i < n; i++) {
            char *dir = base_path_join(root, names[i]);
            run_fixture(names[i], dir, paths[p].label, paths[p].block);
            free(dir);
        }
    }
    for (int i = 0; i < n; i++) free(names[i]);
    free(root);
    TEST_MAIN_END();
}
