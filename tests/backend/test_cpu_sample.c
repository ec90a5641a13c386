/* The CPU sampling-candidates op against a brute-force reference (adjust a copy of the row,
 * sort every eligible token by logit descending then id ascending, take k): ties, signed
 * zeros, banned (-inf) and NaN tokens, k above the number of eligible tokens, several
 * adjustments on one token, the log-sum-exp, and the argument checks. */
#include "backend/backend.h"
#include "test.h"

#include <math.h>
#include <string.h>

static uint64_t rng = 0x243f6a8885a308d3ull;

/* Coarse values so that many tokens tie; some -inf, zeros of both signs, and NaN when asked. */
static float coarse_logit(bool nan) {
    uint32_t u = test_rand_u32(&rng) % 100;
    if (u < 3) return -INFINITY;
    if (u < 5) return nan ? NAN : 1.0f;
    if (u < 8) return (u & 1) ? -0.0f : 0.0f;
    return (float)((int)(test_rand_u32(&rng) % 33) - 16) * 0.25f;
}

typedef struct ref_cand {
    float l;
    int32_t id;
} ref_cand;

static int ref_order(const void *pa, const void *pb) {
    const ref_cand *a = pa, *b = pb;
    if (a->l != b->l) return a->l > b->l ? -1 : 1;
    return a->id < b->id ? -1 : (a->id > b->id);
}

/* The adjusted row, by applying each adjustment in list order. */
static void ref_adjust(const float *row, int vocab, const be_logit_adj *adj, int b, int e,
                       float *out) {
    memcpy(out, row, (size_t)vocab * sizeof *out);
    for (int j = b; j < e; j++) {
        float l = out[adj[j].token];
        if (adj[j].kind == BE_ADJ_ADD)
            l = l + adj[j].a;
        else
            l = (l <= 0 ? l * adj[j].a : l / adj[j].a) - adj[j].b;
        out[adj[j].token] = l;
    }
}

static int ref_topk(const float *adjusted, int vocab, int k, ref_cand *out) {
    ref_cand *all = malloc((size_t)vocab * sizeof *all);
    int n = 0;
    for (int t = 0; t < vocab; t++)
        if (!isnan(adjusted[t]) && adjusted[t] != -INFINITY) all[n++] = (ref_cand){adjusted[t], t};
    qsort(all, (size_t)n, sizeof *all, ref_order);
    if (n > k) n = k;
    memcpy(out, all, (size_t)n * sizeof *out);
    free(all);
    return n;
}

static long double ref_lse(const float *row, int vocab) {
    long double mx = -INFINITY, sum = 0;
    for (int t = 0; t < vocab; t++)
        if (row[t] > mx) mx = row[t];
    for (int t = 0; t < vocab; t++) sum += expl((long double)row[t] - mx);
    return mx + logl(sum);
}

/* Runs the op over reqs and checks every request against the reference. */
static void check_requests(be_backend *be, const float *logits, int rows, int vocab,
                           const be_topk_row *reqs, int n_req, const be_logit_adj *adj) {
    int total = 0;
    for (int i = 0; i < n_req; i++) total += reqs[i].k;
    int32_t *ids = malloc((size_t)(total + 1) * sizeof *ids);
    float *ls = malloc((size_t)(total + 1) * sizeof *ls);
    int32_t *nc = malloc((size_t)n_req * sizeof *nc);
    double *lse = malloc((size_t)n_req * sizeof *lse);
    memset(ids, 0xff, (size_t)(total + 1) * sizeof *ids);
    be_tensor t = {(void *)logits, BASE_DTYPE_F32, rows, vocab};
    base_err err = {{0}};
    int rc = be->ops->topk_candidates(be, &t, reqs, n_req, adj, ids, ls, nc, lse, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    float *adjusted = malloc((size_t)vocab * sizeof *adjusted);
    ref_cand *want = malloc((size_t)(BE_TOPK_MAX + 1) * sizeof *want);
    int off = 0;
    for (int i = 0; i < n_req && rc == 0; i++) {
        const float *row = logits + (size_t)reqs[i].row * vocab;
        ref_adjust(row, vocab, adj, reqs[i].adj_begin, reqs[i].adj_end, adjusted);
        int n = ref_topk(adjusted, vocab, reqs[i].k, want);
        CHECK_MSG(nc[i] == n, "request %d: %d candidates, expected %d", i, nc[i], n);
        int bad = 0;
        for (int j = 0; j < n && j < nc[i]; j++)
            if (ids[off + j] != want[j].id || ls[off + j] != want[j].l) bad++;
        CHECK_MSG(bad == 0, "request %d (k %d): %d of %d candidates differ", i, reqs[i].k, bad, n);
        if (reqs[i].want_lse) {
            double r = (double)ref_lse(row, vocab);
            CHECK_MSG(fabs(lse[i] - r) <= 1e-12 * fmax(1.0, fabs(r)), "lse %.17g, expected %.17g",
                      lse[i], r);
        }
        off += reqs[i].k;
    }
    free(ids);
    free(ls);
    free(nc);
    free(lse);
    free(adjusted);
    free(want);
}

static void test_random_rows(be_backend *be) {
    enum { ROWS = 6, VOCAB = 3000 };
    float *logits = malloc(sizeof(float) * ROWS * VOCAB);
    /* NaN only in rows 2 and 4, whose requests do not ask for the log-sum-exp */
    for (int i = 0; i < ROWS * VOCAB; i++)
        logits[i] = coarse_logit(i / VOCAB == 2 || i / VOCAB == 4);
    /* row 5: only 7 tokens are above -inf, fewer than any k but the smallest */
    for (int t = 0; t < VOCAB; t++) logits[5 * VOCAB + t] = -INFINITY;
    for (int t = 0; t < 7; t++) logits[5 * VOCAB + 100 * t + 3] = (float)(t % 3);
    be_logit_adj adj[] = {
        /* request 1: a ban, a boost onto a tie, a token with bias then penalty */
        {4, BE_ADJ_ADD, -INFINITY, 0},
        {9, BE_ADJ_ADD, 0.25f, 0},
        {17, BE_ADJ_ADD, 1.5f, 0},
        {17, BE_ADJ_ADD, -0.5f, 0},
        {17, BE_ADJ_PENALTY, 1.3f, 0.2f},
        {2999, BE_ADJ_PENALTY, 1.1f, -3.0f},
        /* request 3: penalties on the row's best tokens push them down */
        {0, BE_ADJ_PENALTY, 2.0f, 1.0f},
        {1, BE_ADJ_PENALTY, 0.5f, 0.0f},
        {2, BE_ADJ_PENALTY, 1.5f, 0.75f},
        /* request 6: un-bans a token of the all -inf row */
        {50, BE_ADJ_ADD, 0.5f, 0},
    };
    be_topk_row reqs[] = {
        {0, 40, 0, 0, 1, NULL, 0},   {1, 40, 0, 6, 1, NULL, 0}, {2, 1, 0, 0, 0, NULL, 0},
        {2, 1024, 6, 9, 0, NULL, 0}, {3, 0, 0, 0, 1, NULL, 0},  {4, 1024, 0, 0, 0, NULL, 0},
        {5, 50, 9, 10, 1, NULL, 0},  {5, 3, 0, 0, 0, NULL, 0},  {0, 1, 0, 6, 0, NULL, 0},
    };
    check_requests(be, logits, ROWS, VOCAB, reqs, (int)(sizeof reqs / sizeof reqs[0]), adj);
    free(logits);
}

/* Smooth random logits (few ties) over many k, the way a model's rows look. */
static void test_many_k(be_backend *be) {
    enum { VOCAB = 5000 };
    float *logits = malloc(sizeof(float) * VOCAB);
    for (int t = 0; t < VOCAB; t++)
        logits[t] = (float)(test_rand_u32(&rng) % 1000000) * 1e-5f - 5.0f;
    int ks[] = {1, 2, 7, 40, 64, 100, 511, 512, 513, 1023, 1024};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        be_topk_row r = {0, ks[i], 0, 0, 1, NULL, 0};
        check_requests(be, logits, 1, VOCAB, &r, 1, NULL);
    }
    free(logits);
}

static void test_rejects(be_backend *be) {
    float logits[8] = {0};
    be_tensor t = {logits, BASE_DTYPE_F32, 1, 8};
    int32_t ids[4];
    float ls[4];
    int32_t nc[1];
    base_err err = {{0}};
    be_logit_adj unsorted[] = {{5, BE_ADJ_ADD, 1, 0}, {3, BE_ADJ_ADD, 1, 0}};
    be_topk_row r = {0, 2, 0, 2, 0, NULL, 0};
    CHECK(be->ops->topk_candidates(be, &t, &r, 1, unsorted, ids, ls, nc, NULL, &err) == -1);
    CHECK(strstr(err.msg, "sorted") != NULL);
    be_logit_adj outside[] = {{8, BE_ADJ_ADD, 1, 0}};
    r = (be_topk_row){0, 2, 0, 1, 0, NULL, 0};
    CHECK(be->ops->topk_candidates(be, &t, &r, 1, outside, ids, ls, nc, NULL, &err) == -1);
    CHECK(strstr(err.msg, "token 8") != NULL);
    r = (be_topk_row){1, 2, 0, 0, 0, NULL, 0};
    CHECK(be->ops->topk_candidates(be, &t, &r, 1, NULL, ids, ls, nc, NULL, &err) == -1);
    CHECK(strstr(err.msg, "row 1") != NULL);
    r = (be_topk_row){0, BE_TOPK_MAX + 1, 0, 0, 0, NULL, 0};
    CHECK(be->ops->topk_candidates(be, &t, &r, 1, NULL, ids, ls, nc, NULL, &err) == -1);
    CHECK(strstr(err.msg, "k = ") != NULL);
    uint32_t all = ~0u;
    r = (be_topk_row){0, 2, 0, 0, 0, &all, 9};
    CHECK(be->ops->topk_candidates(be, &t, &r, 1, NULL, ids, ls, nc, NULL, &err) == -1);
    CHECK(strstr(err.msg, "allowed set covers 9 tokens") != NULL);
}

int main(void) {
    be_backend *be = NULL;
    base_err err = {{0}};
    if (be_cpu_create(2, &be, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    test_random_rows(be);
    test_many_k(be);
    test_rejects(be);
    be_destroy(be);
    TEST_MAIN_END();
}
