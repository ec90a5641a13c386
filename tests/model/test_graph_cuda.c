/* Recorded decode steps on the CUDA backend give the logits of unrecorded ones. A script of
 * decode steps over three sequences runs twice on the same fixture, once with recording off
 * (MLXCEL_DECODE_GRAPHS=0) and once on: the batch changes size (a sequence leaves and comes
 * back), lengths cross several page buckets, and the tokens differ every step, so a recording
 * that replayed stale arguments (a size, a page table address, a plan) would give other
 * logits. Both runs plan decode steps by length bucket, so they run the same kernels on the
 * same data and must agree to the bit; the first GPU run, whose unrecorded steps still
 * planned for their exact lengths, differed by up to 2e-4 through the chunking alone. The recorded
 * run must actually replay (counted by the model). The windowed fixtures add the local layers'
 * view, whose blocks go back to the pool as the sequences pass their windows. Skipped when no
 * CUDA device can be opened. */
#include "backend/test_cuda_util.h"
#include "fixture_ref.h"

#include "engine/engine.h"

#define N_SEQS  3
#define N_STEPS 48

/* Which sequences decode at step t: the second sits out steps 16-27. */
static bool active(int s, int t) {
    return !(s == 1 && t >= 16 && t < 28);
}

/* Runs the script; out receives the logits of every decode row in order. Returns the rows. */
static int run_script(engine_runtime *rt, const fixture_ref *ref, float *out, base_err *err) {
    int vocab = model_config(rt->model)->vocab_size, rows = 0, rc = 0;
    static const int prompt_len[N_SEQS] = {5, 17, 40};
    kv_seq *seqs[N_SEQS];
    int32_t tok[N_SEQS];
    for (int s = 0; s < N_SEQS; s++) seqs[s] = kv_seq_create(rt->pool);
    /* Prompts, one sequence per step, no logits. */
    for (int s = 0; s < N_SEQS && rc == 0; s++) {
        int n = prompt_len[s];
        int32_t *p = malloc((size_t)n * sizeof *p);
        for (int i = 0; i < n; i++) p[i] = ref->tokens[(i * 7 + s) % ref->n_tokens];
        kv_batch batch;
        rc = kv_seq_append(rt->pool, seqs[s], p, n, err);
        if (rc == 0) rc = kv_batch_build(rt->pool, &seqs[s], &n, 1, &batch, err);
        if (rc == 0) {
            rc = model_forward(rt->model, rt->pool, &batch, p, NULL, 0, NULL, err);
            kv_batch_free(&batch);
        }
        free(p);
    }
    for (int t = 0; t < N_STEPS && rc == 0; t++) {
        kv_seq *step[N_SEQS];
        int q_lens[N_SEQS], out_rows[N_SEQS], n = 0;
        for (int s = 0; s < N_SEQS && rc == 0; s++) {
            if (!active(s, t)) continue;
            tok[n] = (int32_t)((t * 131 + s * 17 + 3) % vocab);
            rc = kv_seq_append(rt->pool, seqs[s], &tok[n], 1, err);
            step[n] = seqs[s];
            q_lens[n] = 1;
            out_rows[n] = n;
            n++;
        }
        kv_batch batch;
        if (rc == 0) rc = kv_batch_build(rt->pool, step, q_lens, n, &batch, err);
        if (rc) break;
        rc = model_forward(rt->model, rt->pool, &batch, tok, out_rows, n,
                           out + (size_t)rows * vocab, err);
        kv_batch_free(&batch);
        rows += n;
    }
    for (int s = 0; s < N_SEQS; s++) kv_seq_free(rt->pool, seqs[s]);
    return rc ? -1 : rows;
}

static void run_fixture(const char *root, const char *name, int block_size) {
    char *dir = base_path_join(root, name);
    fixture_ref ref;
    base_err err;
    if (fixture_ref_load(dir, &ref, &err)) {
        CHECK_MSG(0, "%s: %s", name, err.msg);
        free(dir);
        return;
    }
    engine_options o;
    engine_options_defaults(&o);
    o.device = "cuda";
    o.kv_block_size = block_size;
    o.ctx_size = 128;
    o.n_parallel = N_SEQS;
    float *got[2] = {NULL, NULL};
    int rows[2] = {0, 0};
    uint64_t recorded[2] = {0, 0}, replayed[2] = {0, 0};
    for (int pass = 0; pass < 2; pass++) {
        setenv("MLXCEL_DECODE_GRAPHS", pass == 0 ? "0" : "1", 1);
        engine_runtime *rt;
        int rc = engine_runtime_open(dir, &o, &rt, &err);
        CHECK_MSG(rc == 0, "%s: %s", name, err.msg);
        if (rc) break;
        size_t vocab = (size_t)model_config(rt->model)->vocab_size;
        got[pass] = calloc((size_t)N_SEQS * N_STEPS * vocab, sizeof(float));
        rows[pass] = run_script(rt, &ref, got[pass], &err);
        CHECK_MSG(rows[pass] > 0, "%s: %s", name, err.msg);
        model_graph_counts(rt->model, &recorded[pass], &replayed[pass]);
        engine_runtime_close(rt);
    }
    unsetenv("MLXCEL_DECODE_GRAPHS");
    if (got[0] && got[1] && rows[0] > 0 && rows[0] == rows[1]) {
        size_t n = (size_t)rows[0] * (size_t)ref.vocab;
        double worst = 0;
        for (size_t i = 0; i < n; i++) {
            double d = fabs((double)got[0][i] - got[1][i]);
            if (!(d <= worst)) worst = isnan(d) ? INFINITY : d;
        }
        printf("  %-20s block %2d: %d rows, recorded %llu, replayed %llu, max |diff| %.3g\n", name,
               block_size, rows[1], (unsigned long long)recorded[1],
               (unsigned long long)replayed[1], worst);
        CHECK_MSG(recorded[0] == 0 && replayed[0] == 0, "%s: recording was off", name);
        CHECK_MSG(recorded[1] >= 3 && replayed[1] >= (uint64_t)N_STEPS / 2,
                  "%s: only %llu of %d steps replayed", name, (unsigned long long)replayed[1],
                  N_STEPS);
        /* The same kernels on the same data: any difference is a stale argument. */
        CHECK_MSG(worst <= 1e-5, "%s: recorded steps differ by %.3g", name, worst);
    }
    free(got[0]);
    free(got[1]);
    fixture_ref_free(&ref);
    free(dir);
}

int main(void) {
    be_backend *probe = tc_backend();
    if (!probe) return TEST_SKIP;
    be_destroy(probe);
    /* A step that cannot be recorded says why at debug level. */
    base_log_set_level(BASE_LOG_DEBUG);
    char *root = base_path_join(test_source_dir(), "tests/fixtures");
    /* dense, and mixtures of experts (routed on the device, recorded like the rest) */
    static const char *names[] = {"llama_q4_g64", "qwen3_bf16", "qwen2_bf16", "qwen3_moe_q4_g64",
                                  "gpt_oss_mxfp4_q8"};
    unsetenv("MLXCEL_PAGED_ATTENTION_NATIVE");
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) run_fixture(root, names[i], 16);
    setenv("MLXCEL_PAGED_ATTENTION_NATIVE", "1", 1);
    run_fixture(root, "llama_q4_g64", 8);
    unsetenv("MLXCEL_PAGED_ATTENTION_NATIVE");
    /* Local layers read their group's view: its page list moves the global one and changes
     * every few steps as blocks leave the window (windows of 16 to 40 tokens, blocks of 8;
     * phi3_window has no global layer at all). */
    static const char *windowed[] = {"gemma3_text_bf16", "gpt_oss_bf16", "phi3_window_q4_g64"};
    for (size_t i = 0; i < sizeof windowed / sizeof windowed[0]; i++)
        run_fixture(root, windowed[i], 8);
    free(root);
    TEST_MAIN_END();
}
