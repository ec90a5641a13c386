/* Every fixture in tests/fixtures (tiny random-weight models of each family and quantization,
 * made by tools/reference/make_fixtures.py with Hugging Face transformers): the logits of
 * every position must match transformers' within 1e-3 relative error, and the greedy
 * continuation must be identical. Each fixture also runs through the other decode paths
 * (gather, v2) and a block size of 16: the pool must not change the answer. */
#include "fixture_ref.h"

#include "engine/engine_test_runtime.h"

static void run_fixture(const char *name, const char *dir, const char *variant, int block_size) {
    fixture_ref ref;
    base_err err;
    if (fixture_ref_load(dir, &ref, &err)) {
        CHECK_MSG(0, "%s: %s", name, err.msg);
        return;
    }
    float *want = ref.logits;
    int rc;

    engine_options o = test_cpu_options(ref.n_tokens + ref.n_greedy + 1, 1, block_size);
    engine_runtime *rt;
    rc = engine_runtime_open(dir, &o, &rt, &err);
    CHECK_MSG(rc == 0, "%s: %s", name, err.msg);
    if (rc == 0) {
        int vocab = model_config(rt->model)->vocab_size;
        CHECK(ref.vocab == vocab);
        float *got;
        rc = engine_prefill_logits(rt, ref.tokens, ref.n_tokens, &got, NULL, &err);
        CHECK_MSG(rc == 0, "%s: %s", name, err.msg);
        if (rc == 0) {
            double e = fixture_max_position_error(got, want, ref.n_tokens, vocab);
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
    fixture_ref_free(&ref);
}

int main(void) {
    static const fixture_path paths[] = {{NULL, "auto", 32}, {"0", "gather", 32}, {"1", "v2", 16}};
    fixture_run_paths(paths, sizeof paths / sizeof paths[0], run_fixture);
    TEST_MAIN_END();
}
