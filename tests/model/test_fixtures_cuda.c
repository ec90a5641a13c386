/* Every fixture in tests/fixtures through the whole model on the CUDA backend. The logits of
 * every prompt position must match transformers' within 2e-2 relative error twice: from one
 * prefill step (the tensor-core GEMM path, BF16 at its inputs) and from one decode step per
 * token (the GEMV and paged decode attention; not with dynamic NTK RoPE). The greedy continuation
 * must equal transformers' up to the first step whose top-2 margin is not clear of the measured
 * error. Each fixture runs with the planner's choice at block 32 and with the split (v2) decode
 * path forced at block 16. Skipped when no CUDA device can be opened. */
#include "backend/test_cuda_util.h"
#include "fixture_ref.h"

#include "engine/engine.h"

#define LOGITS_TOL 2e-2
/* A step's margin (over the row's RMS) is clear when it exceeds this many times the measured
 * relative error: the difference of two logits' errors has an RMS of about sqrt(2) times the
 * error, so 4 times is 2.8 of those. */
#define MARGIN_FACTOR 4.0

/* The logits of every position of tokens, one decode step per token (n x vocab into out). */
static int decode_logits(engine_runtime *rt, const int32_t *tokens, int n, float *out,
                         base_err *err) {
    int vocab = model_config(rt->model)->vocab_size, one = 1, row = 0, rc = 0;
    kv_seq *seq = kv_seq_create(rt->pool);
    for (int i = 0; i < n && rc == 0; i++) {
        kv_batch batch;
        rc = kv_seq_append(rt->pool, seq, &tokens[i], 1, err);
        if (rc == 0) rc = kv_batch_build(rt->pool, &seq, &one, 1, &batch, err);
        if (rc) break;
        rc = model_forward(rt->model, rt->pool, &batch, &tokens[i], &row, 1,
                           out + (size_t)i * vocab, err);
        kv_batch_free(&batch);
    }
    kv_seq_free(rt->pool, seq);
    return rc;
}

/* Steps before the first whose margin is within reach of the error e. */
static int clear_steps(const fixture_ref *ref, double e) {
    double need = MARGIN_FACTOR * (e > 1e-3 ? e : 1e-3);
    int k = 0;
    while (k < ref->n_greedy && ref->margin_rel[k] > need) k++;
    return k;
}

static void run_fixture(const char *name, const char *dir, const char *variant, int block_size) {
    fixture_ref ref;
    base_err err;
    if (fixture_ref_load(dir, &ref, &err)) {
        CHECK_MSG(0, "%s: %s", name, err.msg);
        return;
    }
    float *want = ref.logits;
    int rc;
    engine_options o;
    engine_options_defaults(&o);
    o.device = "cuda";
    o.kv_block_size = block_size;
    o.ctx_size = ref.n_tokens + ref.n_greedy + 1;
    engine_runtime *rt;
    rc = engine_runtime_open(dir, &o, &rt, &err);
    CHECK_MSG(rc == 0, "%s: %s", name, err.msg);
    if (rc == 0) {
        int vocab = model_config(rt->model)->vocab_size;
        CHECK(ref.vocab == vocab);
        double e = 1.0;
        float *got;
        rc = engine_prefill_logits(rt, ref.tokens, ref.n_tokens, &got, NULL, &err);
        CHECK_MSG(rc == 0, "%s: %s", name, err.msg);
        if (rc == 0) {
            e = fixture_max_position_error(got, want, ref.n_tokens, vocab);
            printf("  %-20s %-4s block %2d  max rel err prefill %.2e", name, variant, block_size,
                   e);
            CHECK_MSG(e < LOGITS_TOL, "%s (%s): prefill logits rel err %.3e", name, variant, e);
            /* Dynamic NTK scales RoPE by the length a step reaches, and longrope takes its
             * long factors only once a step passes the original length (transformers decides
             * per call), so one token per step legitimately differs from one prefill there. */
            io_rope_type rt_type = model_config(rt->model)->rope_scaling.type;
            if (rt_type != IO_ROPE_DYNAMIC && rt_type != IO_ROPE_LONGROPE) {
                rc = decode_logits(rt, ref.tokens, ref.n_tokens, got, &err);
                CHECK_MSG(rc == 0, "%s: %s", name, err.msg);
                double ed =
                    rc == 0 ? fixture_max_position_error(got, want, ref.n_tokens, vocab) : 1.0;
                printf(" decode %.2e", ed);
                CHECK_MSG(ed < LOGITS_TOL, "%s (%s): decode logits rel err %.3e", name, variant,
                          ed);
            }
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
            int k = clear_steps(&ref, e);
            bool same = res.n_tokens >= k;
            for (int i = 0; same && i < k; i++) same = res.tokens[i] == ref.greedy[i];
            printf("  greedy %2d/%2d clear steps %s\n", k, ref.n_greedy,
                   same ? "identical" : "DIFFERENT");
            CHECK_MSG(same, "%s (%s): greedy continuation differs in its first %d steps", name,
                      variant, k);
            free(res.tokens);
        }
        base_err perr;
        CHECK_MSG(kv_pool_check(rt->pool, &perr) == 0, "%s: %s", name, perr.msg);
        engine_runtime_close(rt);
    }
    fixture_ref_free(&ref);
}

int main(void) {
    be_backend *probe = tc_backend();
    if (!probe) return TEST_SKIP;
    be_destroy(probe);

    static const fixture_path paths[] = {{NULL, "auto", 32}, {"1", "v2", 16}};
    fixture_run_paths(paths, sizeof paths / sizeof paths[0], run_fixture);
    TEST_MAIN_END();
}
