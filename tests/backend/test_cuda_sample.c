/* The CUDA sampling-candidates op equals the CPU op (itself checked against a brute-force
 * reference in test_cpu_sample): ids and logits exactly, the log-sum-exp to rounding, on
 * random rows of vocab 128256 (smooth, tied across the k-th place, banned, NaN, adjusted) and
 * on the fixtures' real logits. Then the engine's picker on the GPU against the full-row
 * sampler over the same device logits (tokens equal; log-probabilities to rounding, as the
 * GPU sums the log-sum-exp in another order). Prints the op's time at 1, 64 and 256 rows.
 * Skipped without a GPU. */
#include "backend/backend.h"
#include "engine/engine.h"
#include "test.h"
#include "model/fixture_ref.h"
#include "test_cuda_util.h"

#include <math.h>
#include <string.h>

enum { BIG_VOCAB = 128256 };

typedef struct topk_out {
    int32_t *ids;
    float *logits;
    int32_t *n;
    double *lse;
} topk_out;

static topk_out run_op(be_backend *be, const be_tensor *logits, const be_topk_row *reqs, int n_req,
                       const be_logit_adj *adj) {
    int total = 0;
    for (int i = 0; i < n_req; i++) total += reqs[i].k;
    topk_out o = {malloc((size_t)(total + 1) * sizeof(int32_t)),
                  malloc((size_t)(total + 1) * sizeof(float)),
                  malloc((size_t)n_req * sizeof(int32_t)), malloc((size_t)n_req * sizeof(double))};
    base_err err = {{0}};
    int rc =
        be->ops->topk_candidates(be, logits, reqs, n_req, adj, o.ids, o.logits, o.n, o.lse, &err);
    CHECK_MSG(rc == 0, "%s: %s", be->name, err.msg);
    if (rc) memset(o.n, 0, (size_t)n_req * sizeof(int32_t));
    return o;
}

static void free_out(topk_out *o) {
    free(o->ids);
    free(o->logits);
    free(o->n);
    free(o->lse);
}

/* Runs reqs on both backends over host logits [rows, vocab] and compares. */
static void compare(be_backend *gpu, be_backend *cpu, const char *what, const float *logits,
                    int rows, int vocab, const be_topk_row *reqs, int n_req,
                    const be_logit_adj *adj) {
    be_tensor ht = {(void *)logits, BASE_DTYPE_F32, rows, vocab};
    be_tensor dt = tc_tensor(gpu, logits, BASE_DTYPE_F32, rows, vocab);
    topk_out want = run_op(cpu, &ht, reqs, n_req, adj), got = run_op(gpu, &dt, reqs, n_req, adj);
    for (int i = 0, off = 0; i < n_req; off += reqs[i].k, i++) {
        CHECK_MSG(got.n[i] == want.n[i], "%s request %d: %d candidates, cpu %d", what, i, got.n[i],
                  want.n[i]);
        int bad = 0;
        for (int j = 0; j < want.n[i] && j < got.n[i]; j++)
            if (got.ids[off + j] != want.ids[off + j] ||
                got.logits[off + j] != want.logits[off + j])
                bad++;
        CHECK_MSG(bad == 0, "%s request %d (k %d): %d of %d candidates differ", what, i, reqs[i].k,
                  bad, want.n[i]);
        if (reqs[i].want_lse)
            CHECK_MSG(fabs(got.lse[i] - want.lse[i]) <= 1e-10 * fmax(1.0, fabs(want.lse[i])),
                      "%s request %d: lse %.17g, cpu %.17g", what, i, got.lse[i], want.lse[i]);
    }
    free_out(&want);
    free_out(&got);
    gpu->ops->free(gpu, dt.data);
}

static void test_big_vocab(be_backend *gpu, be_backend *cpu) {
    enum { ROWS = 8 };
    float *x = malloc(sizeof(float) * ROWS * BIG_VOCAB);
    tc_fill(x, (size_t)ROWS * BIG_VOCAB, 12.0f);
    /* row 1: values on a coarse grid, so ties straddle every k-th place */
    for (int t = 0; t < BIG_VOCAB; t++) x[BIG_VOCAB + t] = (float)(tc_u32() % 64) * 0.125f;
    /* row 2: all banned but 30 tokens, two of them tied */
    for (int t = 0; t < BIG_VOCAB; t++) x[2 * BIG_VOCAB + t] = -INFINITY;
    for (int t = 0; t < 30; t++) x[2 * BIG_VOCAB + 4001 * t + 5] = (float)(t / 2);
    /* row 3: NaNs, -inf, both zeros and the largest floats */
    for (int t = 0; t < BIG_VOCAB; t += 97) x[3 * BIG_VOCAB + t] = NAN;
    for (int t = 13; t < BIG_VOCAB; t += 101) x[3 * BIG_VOCAB + t] = -INFINITY;
    for (int t = 29; t < BIG_VOCAB; t += 89) x[3 * BIG_VOCAB + t] = (t & 1) ? -0.0f : 0.0f;
    x[3 * BIG_VOCAB + 7] = 3e38f;
    x[3 * BIG_VOCAB + 8] = INFINITY;
    /* adjustments: a penalty window of 300 tokens, bias on some, a ban, duplicates */
    be_logit_adj adj[400];
    int na = 0;
    for (int t = 0; t < 300; t++) {
        int32_t tok = 400 * t + 11;
        if (t % 7 == 0) adj[na++] = (be_logit_adj){tok, BE_ADJ_ADD, 2.5f, 0};
        if (t % 11 == 0) adj[na++] = (be_logit_adj){tok, BE_ADJ_ADD, -INFINITY, 0};
        if (t % 13 == 0) adj[na++] = (be_logit_adj){tok, BE_ADJ_ADD, 0.75f, 0};
        adj[na++] = (be_logit_adj){tok, BE_ADJ_PENALTY, 1.3f, 0.1f * (float)(t % 4)};
    }
    be_topk_row reqs[] = {
        {0, 1, 0, 0, 1, NULL, 0},    {0, 40, 0, 0, 0, NULL, 0},    {0, 1024, 0, 0, 1, NULL, 0},
        {1, 1, 0, 0, 0, NULL, 0},    {1, 40, 0, 0, 1, NULL, 0},    {1, 1024, 0, 0, 0, NULL, 0},
        {2, 40, 0, 0, 1, NULL, 0},   {2, 1, 0, 0, 0, NULL, 0},     {3, 64, 0, 0, 0, NULL, 0},
        {4, 40, 0, na, 1, NULL, 0},  {4, 1, 0, na, 0, NULL, 0},    {5, 0, 0, 0, 1, NULL, 0},
        {6, 500, 0, na, 0, NULL, 0}, {7, 1024, 0, na, 1, NULL, 0}, {1, 40, 0, na, 0, NULL, 0},
    };
    compare(gpu, cpu, "vocab 128256", x, ROWS, BIG_VOCAB, reqs, (int)(sizeof reqs / sizeof *reqs),
            adj);
    free(x);
}

/* Many rows at once: every CTA on its own request. */
static void test_many_rows(be_backend *gpu, be_backend *cpu) {
    enum { ROWS = 200 };
    float *x = malloc(sizeof(float) * ROWS * BIG_VOCAB);
    tc_fill(x, (size_t)ROWS * BIG_VOCAB, 20.0f);
    be_topk_row reqs[ROWS];
    for (int i = 0; i < ROWS; i++)
        reqs[i] = (be_topk_row){ROWS - 1 - i, 1 + i % 50, 0, 0, i % 3 == 0, NULL, 0};
    compare(gpu, cpu, "200 rows", x, ROWS, BIG_VOCAB, reqs, ROWS, NULL);
    free(x);
}

/* Allowed sets (a grammar's masks): sparse, dense, one token, none, over a vocabulary shorter
 * than the row (ids past it never allowed), with adjustments on allowed and left-out tokens,
 * on split rows (few requests) and whole ones (many). */
static void test_allowed(be_backend *gpu, be_backend *cpu) {
    enum { ROWS = 4, N_ALLOWED = BIG_VOCAB - 300, WORDS = (N_ALLOWED + 31) / 32, REQS = 300 };
    float *x = malloc(sizeof(float) * ROWS * BIG_VOCAB);
    tc_fill(x, (size_t)ROWS * BIG_VOCAB, 12.0f);
    static uint32_t masks[5][WORDS];
    for (int w = 0; w < WORDS; w++) {
        uint32_t u = tc_u32(), v = tc_u32();
        masks[0][w] = u & v & tc_u32(); /* an eighth */
        masks[1][w] = ~(u & v);         /* three quarters */
        masks[2][w] = 0;
        masks[3][w] = (w % 64 == 0) ? u : 0; /* a few tokens in scattered words */
        masks[4][w] = 0;
    }
    masks[2][1000] = 1u << 7;  /* one token */
    masks[4][WORDS - 1] = ~0u; /* the last words: tokens past N_ALLOWED are not allowed */
    be_logit_adj adj[64];
    int na = 0;
    for (int t = 0; t < 64; t++)
        adj[na++] = (be_logit_adj){2003 * t + 1, t % 3 ? BE_ADJ_ADD : BE_ADJ_PENALTY,
                                   t % 3 ? 9.0f : 1.3f, 0.25f};
    be_topk_row reqs[REQS];
    for (int i = 0; i < REQS; i++) {
        static const int ks[] = {1, 40, 1024};
        reqs[i] = (be_topk_row){i % ROWS,
                                ks[i % 3],
                                0,
                                i % 2 ? na : 0,
                                0,
                                masks[i % 5],
                                i % 5 == 4 ? N_ALLOWED : N_ALLOWED - 5 * (i % 4)};
    }
    compare(gpu, cpu, "allowed sets, split rows", x, ROWS, BIG_VOCAB, reqs, 5, adj);
    compare(gpu, cpu, "allowed sets, whole rows", x, ROWS, BIG_VOCAB, reqs, REQS, adj);
    free(x);
}

static void test_fixtures(be_backend *gpu, be_backend *cpu) {
    char *root = base_path_join(test_source_dir(), "tests/fixtures");
    char *names[64];
    int n = fixture_list(root, names, 64);
    CHECK(n > 0);
    for (int f = 0; f < n; f++) {
        char *dir = base_path_join(root, names[f]);
        fixture_ref ref;
        base_err err = {{0}};
        if (fixture_ref_load(dir, &ref, &err) == 0) {
            int rows = ref.n_tokens, vocab = (int)ref.vocab;
            be_logit_adj adj[] = {{1, BE_ADJ_PENALTY, 1.5f, 0.5f},
                                  {(int32_t)(vocab / 2), BE_ADJ_ADD, 4.0f, 0},
                                  {(int32_t)(vocab - 1), BE_ADJ_ADD, -INFINITY, 0}};
            be_topk_row *reqs = malloc((size_t)rows * 3 * sizeof *reqs);
            for (int r = 0; r < rows; r++) {
                reqs[3 * r] = (be_topk_row){r, 1, 0, 0, 1, NULL, 0};
                reqs[3 * r + 1] = (be_topk_row){r, 40, 0, 3, 0, NULL, 0};
                reqs[3 * r + 2] =
                    (be_topk_row){r, vocab < BE_TOPK_MAX ? vocab : BE_TOPK_MAX, 0, 0, 0, NULL, 0};
            }
            compare(gpu, cpu, names[f], ref.logits, rows, vocab, reqs, 3 * rows, adj);
            free(reqs);
            fixture_ref_free(&ref);
        } else {
            CHECK_MSG(0, "%s", err.msg);
        }
        free(dir);
        free(names[f]);
    }
    free(root);
}

/* Several sampling set-ups, two samplers each (same seed), over random device logits for a
 * few steps: the picker with the op and the picker on the same backend without it. The last
 * two have top-k off and rows with a spike of 64 tokens, so the op's candidates and the
 * row's log-sum-exp decide their picks. */
static void test_picker(be_backend *gpu) {
    enum { SETS = 8, STEPS = 8, SPIKE = 64 };
    static engine_logit_bias bias[] = {{5, 2.0f}, {99, -INFINITY}, {64000, 1.5f}};
    engine_sampling sets[SETS];
    int top[SETS] = {-1, -1, -1, -1, 5, 0, -1, 3};
    for (int i = 0; i < SETS; i++) {
        engine_sampling_defaults(&sets[i]);
        sets[i].seed = 77 + (uint64_t)i;
    }
    sets[1].temperature = 0;
    sets[2].repeat_penalty = 1.3f, sets[2].presence_penalty = 0.5f, sets[2].top_k = 200;
    sets[3].logit_bias = bias, sets[3].n_logit_bias = 3, sets[3].temperature = 1.2f;
    sets[4].top_k = 10;
    sets[5].temperature = 0;
    sets[6].top_k = 0, sets[6].top_p = 0.9f;
    sets[7].top_k = 0, sets[7].top_p = 1, sets[7].min_p = 0, sets[7].temperature = 1;
    be_ops plain_ops = *gpu->ops;
    plain_ops.topk_candidates = NULL;
    be_backend plain = *gpu;
    plain.ops = &plain_ops;
    engine_sampler *a[SETS], *b[SETS];
    base_err err = {{0}};
    for (int i = 0; i < SETS; i++) {
        CHECK(engine_sampler_new(&sets[i], BIG_VOCAB, &a[i], &err) == 0);
        CHECK(engine_sampler_new(&sets[i], BIG_VOCAB, &b[i], &err) == 0);
    }
    int32_t hist[SETS][STEPS + 4];
    for (int i = 0; i < SETS; i++)
        for (int j = 0; j < 4; j++) hist[i][j] = (int32_t)(tc_u32() % 1000);
    float *x = malloc(sizeof(float) * SETS * BIG_VOCAB);
    engine_picker *pa = engine_picker_new(BIG_VOCAB), *pb = engine_picker_new(BIG_VOCAB);
    int mismatched = 0;
    double worst_lp = 0;
    for (int step = 0; step < STEPS; step++) {
        tc_fill(x, (size_t)SETS * BIG_VOCAB, 8.0f);
        for (int r = 6; r < SETS; r++)
            for (int j = 0; j < SPIKE; j++)
                x[(size_t)r * BIG_VOCAB + (tc_u32() % BIG_VOCAB)] += 24.0f;
        be_tensor dt = tc_tensor(gpu, x, BASE_DTYPE_F32, SETS, BIG_VOCAB);
        engine_pick ka[SETS], kb[SETS];
        for (int i = 0; i < SETS; i++) {
            ka[i] = (engine_pick){
                .sampler = a[i], .history = hist[i], .n_history = 4 + step, .top_logprobs = top[i]};
            kb[i] = ka[i];
            kb[i].sampler = b[i];
        }
        CHECK_MSG(engine_picker_run(pa, gpu, &dt, ka, SETS, &err) == 0, "%s", err.msg);
        CHECK_MSG(engine_picker_run(pb, &plain, &dt, kb, SETS, &err) == 0, "%s", err.msg);
        for (int i = 0; i < SETS; i++) {
            mismatched += ka[i].token != kb[i].token;
            for (int j = 0; j < top[i]; j++) mismatched += ka[i].top_ids[j] != kb[i].top_ids[j];
            if (top[i] >= 0 && fabs(ka[i].logprob - kb[i].logprob) > worst_lp)
                worst_lp = fabs(ka[i].logprob - kb[i].logprob);
            hist[i][4 + step] = kb[i].token;
        }
        gpu->ops->free(gpu, dt.data);
    }
    CHECK_MSG(mismatched == 0, "picker on the GPU: %d tokens differ from the full row's",
              mismatched);
    CHECK_MSG(worst_lp <= 1e-5, "picker on the GPU: log-probabilities off by %g", worst_lp);
    for (int i = 0; i < SETS; i++) {
        engine_sampler_free(a[i]);
        engine_sampler_free(b[i]);
    }
    engine_picker_free(pa);
    engine_picker_free(pb);
    free(x);
}

/* Not a check: the op's time, for the record. */
static void time_op(be_backend *gpu) {
    enum { ROWS = 256 };
    float *x = malloc(sizeof(float) * ROWS * BIG_VOCAB);
    tc_fill(x, (size_t)ROWS * BIG_VOCAB, 12.0f);
    be_tensor dt = tc_tensor(gpu, x, BASE_DTYPE_F32, ROWS, BIG_VOCAB);
    int rows[] = {1, 64, 256};
    for (int k = 1; k <= 40; k += 39)
        for (size_t c = 0; c < sizeof rows / sizeof *rows; c++) {
            be_topk_row reqs[ROWS];
            for (int i = 0; i < rows[c]; i++) reqs[i] = (be_topk_row){i, k, 0, 0, 0, NULL, 0};
            topk_out o = run_op(gpu, &dt, reqs, rows[c], NULL);
            free_out(&o);
            double t0 = base_now();
            for (int rep = 0; rep < 10; rep++) {
                o = run_op(gpu, &dt, reqs, rows[c], NULL);
                free_out(&o);
            }
            printf("topk_candidates: %3d rows of %d, k %2d: %.1f us (host call, round trip)\n",
                   rows[c], BIG_VOCAB, k, (base_now() - t0) / 10 * 1e6);
        }
    gpu->ops->free(gpu, dt.data);
    free(x);
}

int main(void) {
    be_backend *gpu = tc_backend();
    if (!gpu) return TEST_SKIP;
    be_backend *cpu = NULL;
    base_err err = {{0}};
    if (be_cpu_create(0, &cpu, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    test_big_vocab(gpu, cpu);
    test_many_rows(gpu, cpu);
    test_allowed(gpu, cpu);
    test_fixtures(gpu, cpu);
    time_op(gpu);
    test_picker(gpu);
    be_destroy(cpu);
    be_destroy(gpu);
    TEST_MAIN_END();
}
