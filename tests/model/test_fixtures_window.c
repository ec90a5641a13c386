/* The fixtures with sliding-window (local) layers, run with blocks of 8 tokens so that their
 * 100-token prompts span many blocks past the window: the local layers' blocks must actually
 * go back to the pool while the logits stay those of transformers (within 1e-3), through
 *   - token-by-token decode steps (each position's logits against the reference row),
 *   - prefill chunks of 13 tokens (many query rows over a window whose first blocks are gone),
 *   - a second sequence adopting the first's cached prefix, local blocks included,
 *   - a fork that decodes on from the first sequence's state;
 * and a scheduler stepping further than the local group was sized for is refused.
 * A fixture without local layers is not one of these; none at all fails the test. */
#include "fixture_ref.h"

#include "engine/engine_test_runtime.h"

#define BLOCK 8
#define CHUNK 13

/* Appends tokens [start, start + n) to seq, runs them as one step and checks every row's
 * logits against the reference; returns the worst error. */
static double run_step(engine_runtime *rt, kv_seq *seq, const fixture_ref *ref, int start, int n,
                       float *logits, int32_t *rows) {
    base_err err;
    kv_batch batch;
    for (int i = 0; i < n; i++) rows[i] = i;
    int rc = kv_seq_append(rt->pool, seq, ref->tokens + start, n, &err);
    if (rc == 0) rc = kv_batch_build(rt->pool, &seq, &n, 1, &batch, &err);
    if (rc == 0) {
        rc = model_forward(rt->model, rt->pool, &batch, ref->tokens + start, rows, n, logits, &err);
        kv_batch_free(&batch);
    }
    CHECK_MSG(rc == 0, "step at %d: %s", start, err.msg);
    if (rc) return 1.0;
    kv_seq_commit(rt->pool, seq);
    return fixture_max_position_error(logits, ref->logits + (size_t)start * ref->vocab, n,
                                      ref->vocab);
}

/* Local blocks a sequence must hold once the token at pos is its last: its pages from the
 * block of that token's first visible key. */
static int64_t window_blocks(int pos, int window) {
    int lo = pos - window + 1;
    int first = lo > 0 ? lo / BLOCK : 0;
    return (pos + BLOCK) / BLOCK - first;
}

static bool run_fixture(const char *name, const char *dir) {
    fixture_ref ref;
    base_err err;
    if (fixture_ref_load(dir, &ref, &err)) {
        CHECK_MSG(0, "%s: %s", name, err.msg);
        return false;
    }
    engine_options o = test_cpu_options(ref.n_tokens + ref.n_greedy + 1, 1, BLOCK);
    engine_runtime *rt;
    if (engine_runtime_open(dir, &o, &rt, &err)) {
        CHECK_MSG(0, "%s: %s", name, err.msg);
        fixture_ref_free(&ref);
        return false;
    }
    bool windowed = kv_pool_has_local(rt->pool);
    if (!windowed) {
        engine_runtime_close(rt);
        fixture_ref_free(&ref);
        return false;
    }
    int n = ref.n_tokens, window = kv_pool_geometry(rt->pool)->window;
    CHECK_MSG(n - window > 3 * BLOCK, "%s: a prompt of %d tokens hardly passes the window %d", name,
              n, window);
    float *logits = base_xmalloc((size_t)CHUNK * ref.vocab * sizeof *logits);
    int32_t rows[CHUNK];
    base_err perr;

    /* token by token: every step a decode row */
    kv_seq *seq = kv_seq_create(rt->pool);
    double worst = 0;
    int64_t most_held = 0;
    for (int i = 0; i < n; i++) {
        double e = run_step(rt, seq, &ref, i, 1, logits, rows);
        if (e > worst) worst = e;
        kv_pool_stats ls = kv_pool_get_local_stats(rt->pool);
        if (ls.referenced > most_held) most_held = ls.referenced;
        /* the sequence holds exactly its window's blocks */
        CHECK_MSG(ls.referenced == window_blocks(i, window),
                  "%s: after token %d the local group holds %lld blocks, the window needs %lld",
                  name, i, (long long)ls.referenced, (long long)window_blocks(i, window));
    }
    int64_t full = (n + BLOCK - 1) / BLOCK;
    kv_pool_stats ls = kv_pool_get_local_stats(rt->pool), gs = kv_pool_get_stats(rt->pool);
    printf("  %-20s window %2d  decode steps: max rel err %.2e; local blocks held %lld (at most "
           "%lld), global %lld, full context %lld\n",
           name, window, worst, (long long)ls.referenced, (long long)most_held,
           (long long)gs.referenced, (long long)full);
    CHECK_MSG(worst < 1e-3, "%s: token-by-token logits rel err %.3e", name, worst);
    CHECK_MSG(ls.referenced < full && most_held < full && gs.referenced == full,
              "%s: local blocks held %lld (at most %lld), global %lld, of a %lld-block context",
              name, (long long)ls.referenced, (long long)most_held, (long long)gs.referenced,
              (long long)full);
    CHECK_MSG(kv_pool_check(rt->pool, &perr) == 0, "%s: %s", name, perr.msg);

    /* a fork decodes on from here as the original would: the next reference row is the
     * greedy token's; compare fork and original on the same appended token */
    kv_seq *fork = kv_seq_fork(rt->pool, seq);
    int32_t next = ref.greedy[0];
    float *a = base_xmalloc((size_t)ref.vocab * sizeof *a),
          *b = base_xmalloc((size_t)ref.vocab * sizeof *b);
    kv_seq *pair[2] = {seq, fork};
    float *outs[2] = {a, b};
    for (int s = 0; s < 2; s++) {
        kv_batch batch;
        int one = 1;
        int32_t row = 0;
        int rc = kv_seq_append(rt->pool, pair[s], &next, 1, &err);
        if (rc == 0) rc = kv_batch_build(rt->pool, &pair[s], &one, 1, &batch, &err);
        if (rc == 0) {
            rc = model_forward(rt->model, rt->pool, &batch, &next, &row, 1, outs[s], &err);
            kv_batch_free(&batch);
        }
        CHECK_MSG(rc == 0, "%s: fork step: %s", name, err.msg);
    }
    CHECK_MSG(memcmp(a, b, (size_t)ref.vocab * sizeof *a) == 0,
              "%s: the fork's logits differ from the original's", name);
    free(a);
    free(b);
    kv_seq_free(rt->pool, fork);
    CHECK_MSG(kv_pool_check(rt->pool, &perr) == 0, "%s: after the fork: %s", name, perr.msg);

    /* a second sequence adopts the committed prefix, local blocks of its window included */
    kv_seq *again = kv_seq_create(rt->pool);
    int adopted = kv_seq_adopt_prefix(rt->pool, again, ref.tokens, n);
    CHECK_MSG(adopted == (n - 1) / BLOCK * BLOCK, "%s: adopted %d of %d tokens", name, adopted, n);
    double e = run_step(rt, again, &ref, adopted, n - adopted, logits, rows);
    CHECK_MSG(e < 1e-3, "%s: logits after adopting %d tokens: rel err %.3e", name, adopted, e);
    kv_seq_free(rt->pool, again);
    kv_seq_free(rt->pool, seq);

    /* prefill chunks, with nothing cached to adopt */
    kv_pool_drop_cached(rt->pool);
    CHECK(kv_pool_get_local_stats(rt->pool).free == kv_pool_get_local_stats(rt->pool).capacity);
    seq = kv_seq_create(rt->pool);
    worst = 0;
    for (int start = 0; start < n; start += CHUNK) {
        int len = n - start < CHUNK ? n - start : CHUNK;
        double ce = run_step(rt, seq, &ref, start, len, logits, rows);
        if (ce > worst) worst = ce;
    }
    ls = kv_pool_get_local_stats(rt->pool);
    printf("  %-20s window %2d  prefill chunks of %d: max rel err %.2e; local blocks held %lld\n",
           name, window, CHUNK, worst, (long long)ls.referenced);
    CHECK_MSG(worst < 1e-3, "%s: chunked prefill logits rel err %.3e", name, worst);
    CHECK_MSG(ls.referenced < full, "%s: %lld local blocks held of a %lld-block context", name,
              (long long)ls.referenced, (long long)full);
    kv_seq_free(rt->pool, seq);
    CHECK_MSG(kv_pool_check(rt->pool, &perr) == 0, "%s: %s", name, perr.msg);

    free(logits);
    engine_runtime_close(rt);
    fixture_ref_free(&ref);
    return true;
}

/* A scheduler stepping further than the local group was sized for is refused, naming both;
 * sized for its step (engine_options.prefill_chunk), it starts. */
static void sched_step_sized(const char *dir) {
    engine_options o;
    engine_options_defaults(&o);
    o.device = "cpu";
    o.n_threads = 1;
    o.kv_block_size = BLOCK;
    o.ctx_size = 8192;
    base_err err;
    for (int sized = 0; sized < 2; sized++) {
        o.prefill_chunk = sized ? 4096 : 0;
        engine_runtime *rt;
        if (engine_runtime_open(dir, &o, &rt, &err)) {
            CHECK_MSG(0, "%s", err.msg);
            return;
        }
        engine_sched_options so = {.n_parallel = 1, .prefill_chunk = 4096};
        engine_sched *s = NULL;
        int rc = engine_sched_start(rt, &so, &s, &err);
        if (sized) {
            CHECK_MSG(rc == 0, "%s", err.msg);
            CHECK(rt->kv_plan.prefill_step == 4096);
        } else {
            CHECK_MSG(rc == -1 && strstr(err.msg, "prefill chunk 4096") &&
                          strstr(err.msg, "512-token step"),
                      "rc %d: %s", rc, rc ? err.msg : "");
        }
        if (rc == 0) engine_sched_stop(s);
        engine_runtime_close(rt);
    }
}

int main(void) {
    char *root = base_path_join(test_source_dir(), "tests/fixtures");
    char *names[256];
    int n = fixture_list(root, names, 256), windowed = 0;
    for (int i = 0; i < n; i++) {
        char *dir = base_path_join(root, names[i]);
        windowed += run_fixture(names[i], dir);
        free(dir);
        free(names[i]);
    }
    char *g3 = base_path_join(root, "gemma3_text_bf16");
    sched_step_sized(g3);
    free(g3);
    free(root);
    CHECK_MSG(windowed >= 5, "expected the fixtures with local layers, found %d", windowed);
    TEST_MAIN_END();
}
