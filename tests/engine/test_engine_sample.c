/* The candidate path picks exactly what the full-row sampler picks. For many parameter sets
 * and seeds, two samplers with the same parameters run side by side over the same random
 * logits for many steps (each step's token joins both histories, so the penalties move): one
 * through the picker on the CPU backend (its topk_candidates op), the other through the
 * picker on the same backend with the op removed (every row downloaded and run through
 * engine_sampler_next, the reference). Tokens and log-probabilities must be equal, bit for
 * bit; the candidate path must have served every row it can, downloading none of them
 * (with top-k off, the rows its candidates decide). Rows limited to an allowed set (a
 * grammar's mask, over a vocabulary shorter than the row) go through the op too, unless they
 * want log-probabilities or a wide pick, and never pick a token outside the set. */
#include "engine/engine.h"
#include "test.h"

#include <math.h>
#include <string.h>

enum { VOCAB = 2000, STEPS = 40, SEEDS = 4, MASKED_VOCAB = VOCAB - 37 };

static const be_ops *g_real; /* the CPU backend's own op table */
static int g_downloads, g_topk_rows;

/* Counts downloaded rows, however they are copied. */
static int count_download(be_backend *be, void *dst, const void *src, size_t bytes, base_err *err) {
    g_downloads += (int)(bytes / (VOCAB * sizeof(float)));
    return g_real->download(be, dst, src, bytes, err);
}

static int count_download_async(be_backend *be, void *dst, const void *src, size_t bytes,
                                base_err *err) {
    g_downloads += (int)(bytes / (VOCAB * sizeof(float)));
    return g_real->download_async(be, dst, src, bytes, err);
}

static int count_topk(be_backend *be, const be_tensor *logits, const be_topk_row *reqs, int n_req,
                      const be_logit_adj *adj, int32_t *cand_id, float *cand_logit, int32_t *n_cand,
                      double *lse, base_err *err) {
    g_topk_rows += n_req;
    return g_real->topk_candidates(be, logits, reqs, n_req, adj, cand_id, cand_logit, n_cand, lse,
                                   err);
}

static uint64_t rng = 0x853c49e6748fea9bull;

/* Row r of a step: smooth model-like values on even rows, a coarse grid (many ties) on odd
 * ones, a few -inf everywhere; a sparse row keeps 10 tokens above -inf, a flat row is all
 * ties (the nucleus of any top-p spans more than BE_TOPK_MAX tokens). */
static void fill_row(float *x, int r, bool sparse, bool flat) {
    for (int t = 0; t < VOCAB; t++) {
        uint32_t u = test_rand_u32(&rng);
        if (u % 200 == 0)
            x[t] = -INFINITY;
        else if (r & 1)
            x[t] = (float)((int)(u % 24) - 12) * 0.5f;
        else
            x[t] = (float)(u % 1000000) * 2e-5f - 10.0f;
        if (sparse && t % 200 != 7) x[t] = -INFINITY;
        if (flat && !isinf(x[t])) x[t] = 1.5f;
    }
}

typedef struct param_set {
    const char *name;
    engine_sampling s;
    int top_logprobs; /* < 0: none */
    bool full;        /* the candidates cannot serve it */
    bool maybe;       /* the candidates serve some of its picks, the full row the others */
    bool sparse;      /* its rows hold only 10 tokens above -inf */
    bool flat;        /* its rows are all ties */
    int masked;       /* 0: no allowed set; 1: a random tenth of the tokens; 2: none allowed */
} param_set;

static engine_logit_bias g_bias[] = {
    {7, 3.0f}, {7, -1.25f}, {100, -INFINITY}, {1999, 2.5f}, {1500, 0.5f}};
static engine_logit_bias g_ban[VOCAB]; /* bans every token; a prefix of it leaves some */

static param_set g_sets[32];
static int g_n_sets;

/* A new set with llama-server's defaults. */
static engine_sampling *add_set(const char *name, int top_logprobs, bool full) {
    param_set *ps = &g_sets[g_n_sets++];
    *ps = (param_set){.name = name, .top_logprobs = top_logprobs, .full = full};
    engine_sampling_defaults(&ps->s);
    return &ps->s;
}

/* A set with top-k, top-p and min-p off at temperature 1: only where the draw lands decides
 * whether the candidates serve it. */
static param_set *add_draw_only(const char *name) {
    engine_sampling *s = add_set(name, -1, false);
    s->top_k = 0;
    s->top_p = 1;
    s->min_p = 0;
    s->temperature = 1;
    g_sets[g_n_sets - 1].maybe = true;
    return &g_sets[g_n_sets - 1];
}

static void make_sets(void) {
    for (int t = 0; t < VOCAB; t++) g_ban[t] = (engine_logit_bias){VOCAB - 1 - t, -INFINITY};
    add_set("greedy", -1, false)->temperature = 0;
    add_set("llama-server defaults", -1, false);
    engine_sampling *s = add_set("hot, k 1024, no top-p or min-p", -1, false);
    s->temperature = 1.5f;
    s->top_k = 1024;
    s->top_p = 1;
    s->min_p = 0;
    s = add_set("penalties, k 5", -1, false);
    s->temperature = 1;
    s->top_k = 5;
    s->top_p = 0.5f;
    s->min_p = 0.2f;
    s->repeat_penalty = 1.3f;
    s->repeat_last_n = 16;
    s->presence_penalty = 0.5f;
    s->frequency_penalty = 0.25f;
    s = add_set("bias and whole-history penalty, k 100", -1, false);
    s->temperature = 0.7f;
    s->top_k = 100;
    s->repeat_penalty = 0.8f;
    s->repeat_last_n = -1;
    s->logit_bias = g_bias;
    s->n_logit_bias = (int)(sizeof g_bias / sizeof *g_bias);
    s = add_set("top-k off", -1, true);
    s->top_k = 0;
    s->repeat_penalty = 1.2f;
    add_set("top-k above the cap", -1, true)->top_k = BE_TOPK_MAX + 476;
    /* top-k off with no bias or penalty: the best BE_TOPK_MAX tokens and the log-sum-exp decide
     * the pick where top-p or min-p stop inside them, or a draw at temperature 1 lands there */
    s = add_set("top-k off, top-p 0.5", -1, false);
    s->top_k = 0;
    s->top_p = 0.5f;
    s->min_p = 0;
    s = add_set("top-k off, min-p 0.1", 1, false);
    s->top_k = 0;
    s->top_p = 1;
    s->min_p = 0.1f;
    add_draw_only("top-k off, temperature 1 alone");
    s = add_set("top-k at the vocabulary, flat rows", -1, true);
    s->top_k = VOCAB;
    g_sets[g_n_sets - 1].flat = true;
    add_draw_only("top-k off, temperature 1 alone, flat rows")->flat = true;
    s = add_set("greedy, penalties, logprobs", 5, true);
    s->temperature = 0;
    s->frequency_penalty = 0.4f;
    add_set("defaults, 20 logprobs", 20, false);
    s = add_set("k 3, 10 logprobs", 10, false);
    s->temperature = 1;
    s->top_k = 3;
    s = add_set("k 50, logprob of the token only", 0, false);
    s->temperature = 1;
    s->top_k = 50;
    s->top_p = 0.9f;
    s = add_set("all but 12 tokens banned, k 40", -1, false);
    s->temperature = 2;
    s->min_p = 0;
    s->logit_bias = g_ban;
    s->n_logit_bias = VOCAB - 12;
    s = add_set("every token banned", -1, false);
    s->logit_bias = g_ban;
    s->n_logit_bias = VOCAB;
    /* fewer candidates than alternatives wanted: found out only after the op */
    add_set("20 logprobs of a row with 10 tokens", 20, true);
    g_sets[g_n_sets - 1].sparse = true;
    s = add_set("every token banned, greedy", -1, false);
    s->temperature = 0;
    s->logit_bias = g_ban;
    s->n_logit_bias = VOCAB;
    add_set("defaults, allowed set", -1, false);
    g_sets[g_n_sets - 1].masked = 1;
    add_set("greedy, allowed set", -1, false)->temperature = 0;
    g_sets[g_n_sets - 1].masked = 1;
    s = add_set("penalties and bias, k 5, allowed set", -1, false);
    s->top_k = 5;
    s->repeat_penalty = 1.3f;
    s->logit_bias = g_bias;
    s->n_logit_bias = (int)(sizeof g_bias / sizeof *g_bias);
    g_sets[g_n_sets - 1].masked = 1;
    add_set("defaults, nothing allowed", -1, false);
    g_sets[g_n_sets - 1].masked = 2;
    add_set("defaults, 3 logprobs, allowed set", 3, true);
    g_sets[g_n_sets - 1].masked = 1;
    s = add_set("top-k off, top-p 0.5, allowed set", -1, true);
    s->top_k = 0;
    s->top_p = 0.5f;
    s->min_p = 0;
    g_sets[g_n_sets - 1].masked = 1;
}

/* This step's allowed set of a lane whose set is masked (words over MASKED_VOCAB). */
static void fill_mask(uint32_t *mask, int kind) {
    int words = (MASKED_VOCAB + 31) / 32;
    for (int w = 0; w < words; w++) {
        uint32_t m = 0;
        for (int b = 0; b < 32; b++)
            if (kind == 1 && test_rand_u32(&rng) % 10 == 0) m |= 1u << b;
        mask[w] = m;
    }
}

typedef struct lane {
    engine_sampler *cand, *ref;
    int32_t hist[STEPS + 8];
    int n_hist;
    int top_logprobs;
} lane;

static void compare_picks(const char *name, uint64_t seed, int step, const engine_pick *a,
                          const engine_pick *b, int top) {
    CHECK_MSG(a->token == b->token, "%s seed %llu step %d: token %d, full row %d", name,
              (unsigned long long)seed, step, a->token, b->token);
    if (top < 0) return;
    CHECK_MSG(a->logprob == b->logprob, "%s step %d: logprob %.9g, full row %.9g", name, step,
              a->logprob, b->logprob);
    int bad = 0;
    for (int j = 0; j < top; j++)
        bad += a->top_ids[j] != b->top_ids[j] || a->top_lp[j] != b->top_lp[j];
    CHECK_MSG(bad == 0, "%s step %d: %d of %d alternatives differ", name, step, bad, top);
}

int main(void) {
    be_backend *be = NULL;
    base_err err = {{0}};
    if (be_cpu_create(2, &be, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    g_real = be->ops;
    be_ops counted = *be->ops, plain = *be->ops;
    counted.download = count_download;
    counted.download_async = count_download_async;
    counted.topk_candidates = count_topk;
    plain.topk_candidates = NULL;
    be_backend be_cand = *be, be_full = *be;
    be_cand.ops = &counted;
    be_full.ops = &plain;

    make_sets();
    param_set *sets = g_sets;
    int n = g_n_sets * SEEDS, expect_full = 0, expect_op = 0, n_maybe = 0, maybe_full = 0;
    lane *lanes = calloc((size_t)n, sizeof *lanes);
    for (int i = 0; i < n; i++) {
        param_set *ps = &sets[i / SEEDS];
        engine_sampling s = ps->s;
        s.seed = 1000003u * (uint64_t)(i % SEEDS) + 17;
        CHECK(engine_sampler_new(&s, VOCAB, &lanes[i].cand, &err) == 0);
        CHECK(engine_sampler_new(&s, VOCAB, &lanes[i].ref, &err) == 0);
        /* a short prompt so the penalties have a history from the first step */
        for (int t = 0; t < 8; t++) lanes[i].hist[lanes[i].n_hist++] = (int32_t)(t * 3 % 12);
        lanes[i].top_logprobs = ps->top_logprobs;
        expect_full += ps->full;
        n_maybe += ps->maybe;
        /* sparse and flat rows try their candidates first */
        expect_op += !ps->full || ps->sparse || ps->flat;
    }
    float *logits = malloc(sizeof(float) * (size_t)n * VOCAB);
    const int words = (MASKED_VOCAB + 31) / 32;
    uint32_t *masks = calloc((size_t)n * (size_t)words, sizeof *masks);
    char tok_bytes[MASKED_VOCAB][8];
    const char *tok_ptr[MASKED_VOCAB];
    size_t tok_len[MASKED_VOCAB];
    for (int i = 0; i < MASKED_VOCAB; i++) {
        tok_len[i] = (size_t)snprintf(tok_bytes[i], sizeof tok_bytes[i], "t%d", i);
        tok_ptr[i] = tok_bytes[i];
    }
    gram_vocab *gv = gram_vocab_new(tok_ptr, tok_len, MASKED_VOCAB);
    engine_pick *pa = calloc((size_t)n, sizeof *pa), *pb = calloc((size_t)n, sizeof *pb);
    engine_picker *picker = engine_picker_new(VOCAB), *ref_picker = engine_picker_new(VOCAB);
    be_tensor t = {logits, BASE_DTYPE_F32, n, VOCAB};
    for (int step = 0; step < STEPS; step++) {
        for (int r = 0; r < n; r++)
            fill_row(logits + (size_t)r * VOCAB, r, sets[r / SEEDS].sparse, sets[r / SEEDS].flat);
        for (int i = 0; i < n; i++) {
            int kind = sets[i / SEEDS].masked;
            uint32_t *mask = kind ? masks + (size_t)i * (size_t)words : NULL;
            if (mask) fill_mask(mask, kind);
            pa[i] = (engine_pick){.sampler = lanes[i].cand,
                                  .allowed = mask,
                                  .allowed_vocab = mask ? gv : NULL,
                                  .history = lanes[i].hist,
                                  .n_history = lanes[i].n_hist,
                                  .top_logprobs = lanes[i].top_logprobs};
            pb[i] = (engine_pick){.sampler = lanes[i].ref,
                                  .allowed = mask,
                                  .allowed_vocab = mask ? gv : NULL,
                                  .history = lanes[i].hist,
                                  .n_history = lanes[i].n_hist,
                                  .top_logprobs = lanes[i].top_logprobs};
        }
        int dl = g_downloads;
        CHECK_MSG(engine_picker_run(picker, &be_cand, &t, pa, n, &err) == 0, "%s", err.msg);
        int got = g_downloads - dl;
        CHECK_MSG(got >= expect_full && got <= expect_full + n_maybe,
                  "step %d: %d rows downloaded, expected %d to %d", step, got, expect_full,
                  expect_full + n_maybe);
        maybe_full += got - expect_full;
        CHECK_MSG(engine_picker_run(ref_picker, &be_full, &t, pb, n, &err) == 0, "%s", err.msg);
        for (int i = 0; i < n; i++) {
            compare_picks(sets[i / SEEDS].name, (uint64_t)(i % SEEDS), step, &pa[i], &pb[i],
                          lanes[i].top_logprobs);
            const uint32_t *m = pa[i].allowed;
            int32_t tk = pa[i].token;
            if (sets[i / SEEDS].masked == 1)
                CHECK_MSG(tk < MASKED_VOCAB && (m[tk >> 5] >> (tk & 31) & 1),
                          "%s step %d: token %d "
                          "is not allowed",
                          sets[i / SEEDS].name, step, tk);
            lanes[i].hist[lanes[i].n_hist++] = pb[i].token;
        }
    }
    /* Flat rows at temperature 1 draw past the candidates about half the time: both ways of a
     * wide pick must have run. */
    CHECK_MSG(maybe_full > 0 && maybe_full < STEPS * n_maybe,
              "%d of %d wide picks took the full row", maybe_full, STEPS * n_maybe);
    CHECK_MSG(g_topk_rows == STEPS * expect_op, "%d rows through the op, expected %d", g_topk_rows,
              STEPS * expect_op);
    for (int i = 0; i < n; i++) {
        engine_sampler_free(lanes[i].cand);
        engine_sampler_free(lanes[i].ref);
    }
    engine_picker_free(picker);
    engine_picker_free(ref_picker);
    free(lanes);
    free(logits);
    free(masks);
    gram_vocab_free(gv);
    free(pa);
    free(pb);
    be_destroy(be);
    TEST_MAIN_END();
}
