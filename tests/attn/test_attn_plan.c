/* The decode plan: v1 or v2 from the target and the wave model, the chunkings of the 8B
 * decode shapes, the grid and workspace bounds, the workspace size matching the largest plan,
 * validation, the environment overrides, and rejected plans answering through gather. */
#include "attn_test_scene.h"

#include <stdlib.h>

/* n decode rows of `pages` pages each (all page 0). Caller frees with free_batch. */
static be_paged_batch decode_batch(int n, int pages, int block_size) {
    int32_t *q_indptr = malloc((size_t)(n + 1) * sizeof(int32_t));
    int32_t *page_indptr = malloc((size_t)(n + 1) * sizeof(int32_t));
    int32_t *kv_len = malloc((size_t)n * sizeof(int32_t));
    int32_t *last = malloc((size_t)n * sizeof(int32_t));
    int32_t *indices = calloc((size_t)n * pages + 1, sizeof(int32_t));
    for (int s = 0; s <= n; s++) {
        q_indptr[s] = s;
        page_indptr[s] = s * pages;
    }
    for (int s = 0; s < n; s++) {
        kv_len[s] = pages * block_size;
        last[s] = block_size;
    }
    return (be_paged_batch){.n_seqs = n,
                            .n_tokens = n,
                            .max_q_len = 1,
                            .max_kv_len = pages * block_size,
                            .q_indptr = q_indptr,
                            .kv_len = kv_len,
                            .page_indptr = page_indptr,
                            .page_indices = indices,
                            .last_page_len = last};
}

static void free_batch(be_paged_batch *b) {
    free((void *)b->q_indptr);
    free((void *)b->page_indptr);
    free((void *)b->kv_len);
    free((void *)b->last_page_len);
    free((void *)b->page_indices);
}

static int64_t div_up(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

/* The wave model of attn.h, written out from its description: the time of `chunks` chunks of
 * ppc pages over `items` (row, kv head) pairs when `target` CTAs make a wave. */
static double model_time(int64_t items, int64_t chunks, int64_t ppc, int target) {
    int64_t ctas = items * chunks, full = ctas / target, rest = ctas % target;
    double last = 0.0;
    if (rest) {
        last = (double)rest / target;
        if (last < 1.0 / ATTN_PLAN_SOLO) last = 1.0 / ATTN_PLAN_SOLO;
    }
    double t = (double)(ppc + ATTN_PLAN_CTA_PAGES) * ((double)full + last);
    return chunks > 1 ? t * ATTN_PLAN_V2_COST : t;
}

/* The plan's chunking for n rows of `pages` pages over kv heads at this target: 1 for v1. */
static int64_t planned(int n, int pages, int kv, int target, int64_t *ppc) {
    static char ws[1];
    be_paged_batch batch = decode_batch(n, pages, 16);
    be_decode_plan p;
    attn_plan_decode(&batch, 16, kv * 4, kv, 64, target, ws, UINT64_MAX, &p);
    free_batch(&batch);
    CHECK(p.kind == BE_DECODE_V1 || p.kind == BE_DECODE_V2);
    *ppc = p.kind == BE_DECODE_V2 ? p.pages_per_chunk : pages;
    return p.kind == BE_DECODE_V2 ? p.max_chunks : 1;
}

/* With room to spare, the plan is, of one chunk and every whole number of waves up to
 * ATTN_PLAN_WAVES (each with as many chunks of ATTN_PLAN_MIN_PAGES pages or more as fit), the
 * one of fewest chunks whose modelled time is within ATTN_PLAN_SLACK of the least. */
static void chunk_choice(void) {
    const int ns[] = {1, 2, 5, 64}, pages_list[] = {1, 2, 7, 64, 95, 1000};
    const int targets[] = {1, 8, 132, 396, 2000}, kvs[] = {1, 8};
    for (size_t a = 0; a < 4; a++)
        for (size_t b = 0; b < 6; b++)
            for (size_t c = 0; c < 5; c++)
                for (size_t k = 0; k < 2; k++) {
                    int n = ns[a], pages = pages_list[b], target = targets[c], kv = kvs[k];
                    int64_t ppc, chunks = planned(n, pages, kv, target, &ppc);
                    int64_t items = (int64_t)n * kv;
                    CHECK(chunks == div_up(pages, ppc));
                    if (pages < 2 * ATTN_PLAN_MIN_PAGES) CHECK(chunks == 1);
                    if (chunks > 1) CHECK(ppc >= ATTN_PLAN_MIN_PAGES);
                    /* the candidates: one chunk, then each whole number of waves */
                    int64_t cand_chunks[ATTN_PLAN_WAVES + 1];
                    double cand_time[ATTN_PLAN_WAVES + 1], best;
                    cand_chunks[0] = 1;
                    cand_time[0] = best = model_time(items, 1, pages, target);
                    for (int w = 1; w <= ATTN_PLAN_WAVES; w++) {
                        int64_t fit = (int64_t)w * target / items;
                        if (fit > pages / ATTN_PLAN_MIN_PAGES) fit = pages / ATTN_PLAN_MIN_PAGES;
                        cand_chunks[w] = 0;
                        cand_time[w] = 0.0;
                        if (fit < 2) continue;
                        int64_t wp = div_up(pages, fit);
                        cand_chunks[w] = div_up(pages, wp);
                        cand_time[w] = model_time(items, cand_chunks[w], wp, target);
                        if (cand_time[w] < best) best = cand_time[w];
                    }
                    double t = model_time(items, chunks, ppc, target);
                    CHECK_MSG(t <= best * ATTN_PLAN_SLACK, "n %d pages %d target %d kv %d", n,
                              pages, target, kv);
                    for (int w = 0; w <= ATTN_PLAN_WAVES; w++)
                        if (cand_chunks[w] && cand_chunks[w] < chunks)
                            CHECK_MSG(cand_time[w] > best * ATTN_PLAN_SLACK,
                                      "n %d pages %d target %d kv %d: %lld chunks, %lld as good", n,
                                      pages, target, kv, (long long)chunks,
                                      (long long)cand_chunks[w]);
                }
}

/* Llama-3.1-8B decode (8 kv heads, blocks of 32) on 132 SMs at 3 CTAs each: one wave holds
 * 396 CTAs. Counted by hand from the model: one row of 131072 tokens takes 49 chunks of 84
 * pages (392 CTAs, one wave) rather than the 50 (400 CTAs) that would leave 4 CTAs nearly
 * alone for a second wave; 4 rows of 16384, 12 chunks of 43 pages (384); 16 rows of 8192, 3
 * chunks of 86 pages (384); 64 rows of 4096, 3 chunks of 43 (1536 CTAs, 3.9 waves) rather
 * than v1's 512 CTAs (1.3 waves); 256 rows of 2048 stay v1 (2048 CTAs, 5.2 waves), as two
 * chunks would gain less than the split costs. */
static void chunk_waves(void) {
    const int rows[] = {1, 4, 16, 64, 256}, tokens[] = {131072, 16384, 8192, 4096, 2048};
    const int want_chunks[] = {49, 12, 3, 3, 1}, want_ppc[] = {84, 43, 86, 43, 64};
    for (int i = 0; i < 5; i++) {
        int64_t ppc, chunks = planned(rows[i], tokens[i] / 32, 8, 396, &ppc);
        CHECK_MSG(chunks == want_chunks[i] && ppc == want_ppc[i],
                  "%d x %d: %lld chunks of %lld pages", rows[i], tokens[i], (long long)chunks,
                  (long long)ppc);
    }
}

/* Within the slack, fewer chunks win. 9 rows x 8 kv heads of 224 pages, 132 CTAs a wave, by
 * hand: v1 costs 226 x 0.8 = 180.8; one wave holds no second chunk; 3 chunks of 75 pages (216
 * CTAs, 1.8 waves) 77 x 1.8 x 1.05 = 145.53; 5 of 45 (360 CTAs, 2.8 waves) 47 x 2.8 x 1.05 =
 * 138.18; 7 of 32, the most chunks of ATTN_PLAN_MIN_PAGES (504 CTAs, 3.82 waves), 34 x 3.82 x
 * 1.05 = 136.31, the least, but 5 chunks are within 2% of it. */
static void chunk_slack(void) {
    int64_t ppc, chunks = planned(9, 224, 8, 132, &ppc);
    CHECK_MSG(chunks == 5 && ppc == 45, "%lld chunks of %lld pages", (long long)chunks,
              (long long)ppc);
}

/* Batch-1 decode of the 8B shape (8 kv heads, 396 CTAs a wave): one chunk up to 2 x
 * ATTN_PLAN_MIN_PAGES - 1 pages, whatever the waves would take; then chunks of
 * ATTN_PLAN_MIN_PAGES pages at least. */
static void chunk_minimum(void) {
    for (int pages = 1; pages <= 4096; pages++) {
        int64_t ppc, chunks = planned(1, pages, 8, 396, &ppc);
        if (pages < 2 * ATTN_PLAN_MIN_PAGES)
            CHECK_MSG(chunks == 1, "%d pages: %lld chunks", pages, (long long)chunks);
        else
            CHECK_MSG(chunks >= 2 && ppc >= ATTN_PLAN_MIN_PAGES, "%d pages: %lld chunks of %lld",
                      pages, (long long)chunks, (long long)ppc);
    }
}

/* The chunk count never passes the grid limit, and a workspace caps it too. */
static void chunk_bounds(void) {
    int pages = (ATTN_GRID_YZ_MAX + 1) * ATTN_PLAN_MIN_PAGES + 1000;
    be_paged_batch b = decode_batch(1, pages, 1);
    be_kv_layer layer = {NULL, NULL, BASE_DTYPE_F16, 1, 1, 1, 64};
    static char big[1];
    be_decode_plan p;
    attn_plan_decode(&b, 1, 4, 1, 64, 1000000, big, UINT64_MAX, &p);
    CHECK(p.kind == BE_DECODE_V2 && p.max_chunks <= ATTN_GRID_YZ_MAX);
    CHECK((int64_t)p.max_chunks * p.pages_per_chunk >= pages);
    p.workspace_bytes = attn_v2_bytes(1, p.max_chunks, 4, 64);
    base_err err;
    CHECK(attn_plan_validate(&p, &b, &layer, 4, &err) == 0);

    CHECK(attn_workspace_bytes(4, 1, 64, 1, 1, pages, 1000000) ==
          attn_v2_bytes(1, ATTN_GRID_YZ_MAX, 4, 64));

    uint64_t three = attn_v2_bytes(1, 3, 4, 64);
    attn_plan_decode(&b, 1, 4, 1, 64, 1000000, big, three, &p);
    CHECK(p.kind == BE_DECODE_V2 && p.max_chunks <= 3 && p.max_chunks >= 2);
    CHECK(attn_plan_validate(&p, &b, &layer, 4, &err) == 0);
    attn_plan_decode(&b, 1, 4, 1, 64, 1000000, NULL, 0, &p);
    CHECK(p.kind == BE_DECODE_V1);

    be_decode_plan over = {BE_DECODE_V2, 4, ATTN_GRID_YZ_MAX + 1, big, UINT64_MAX};
    CHECK(attn_plan_validate(&over, &b, &layer, 4, &err) == -1);
    CHECK(strstr(err.msg, "max_chunks") != NULL);
    free_batch(&b);

    /* 65,536 decode rows exceed grid z for v2 and grid y for v1 */
    be_paged_batch many = decode_batch(ATTN_GRID_YZ_MAX + 1, 1, 1);
    be_decode_plan v1 = {.kind = BE_DECODE_V1};
    CHECK(attn_plan_validate(&v1, &many, &layer, 4, &err) == -1);
    be_decode_plan v2 = {BE_DECODE_V2, 1, 1, big, UINT64_MAX};
    CHECK(attn_plan_validate(&v2, &many, &layer, 4, &err) == -1);
    free_batch(&many);
}

/* attn_workspace_bytes is exactly what the largest plan within the limits needs. */
static void workspace_matches_plans(void) {
    const int targets[] = {16, 132, 512};
    static char ws[1];
    for (size_t t = 0; t < 6; t++) {
        int n_heads = 12, kv = 4, dim = 64, bs = 8, max_seqs = t < 3 ? 6 : 1, max_ctx = 3000;
        uint64_t reserve =
            attn_workspace_bytes(n_heads, kv, dim, bs, max_seqs, max_ctx, targets[t % 3]);
        uint64_t largest = 0;
        for (int n = 1; n <= max_seqs; n++) {
            for (int pages = 1; pages <= div_up(max_ctx, bs); pages++) {
                be_paged_batch b = decode_batch(n, pages, bs);
                be_decode_plan p;
                attn_plan_decode(&b, bs, n_heads, kv, dim, targets[t % 3], ws, UINT64_MAX, &p);
                if (p.kind == BE_DECODE_V2) {
                    uint64_t need = attn_v2_bytes(n, p.max_chunks, n_heads, dim);
                    if (need > largest) largest = need;
                }
                free_batch(&b);
            }
        }
        CHECK_MSG(reserve == largest, "target %d: reserve %llu, largest plan %llu", targets[t % 3],
                  (unsigned long long)reserve, (unsigned long long)largest);
    }
}

static void environment(void) {
    be_backend be = {.target_parallelism = 40};
    CHECK(attn_decode_target(&be) == 40);
    setenv("MLXCEL_PAGED_DECODE_V2_TARGET_CTAS", "77", 1);
    CHECK(attn_decode_target(&be) == 77);
    setenv("MLXCEL_PAGED_DECODE_V2_TARGET_CTAS", "7x", 1);
    CHECK(attn_decode_target(&be) == 40);
    unsetenv("MLXCEL_PAGED_DECODE_V2_TARGET_CTAS");

    static char ws[1];
    be_paged_batch b = decode_batch(64, 4, 16);
    be_decode_plan p;
    attn_plan_decode(&b, 16, 32, 8, 128, 100, ws, UINT64_MAX, &p);
    CHECK(p.kind == BE_DECODE_V1);
    setenv("MLXCEL_PAGED_ATTENTION_NATIVE", "1", 1);
    attn_plan_decode(&b, 16, 32, 8, 128, 100, ws, UINT64_MAX, &p);
    CHECK(p.kind == BE_DECODE_V2 && p.max_chunks >= 1);
    setenv("MLXCEL_PAGED_ATTENTION_NATIVE", "0", 1);
    attn_plan_decode(&b, 16, 32, 8, 128, 100000, ws, UINT64_MAX, &p);
    CHECK(p.kind == BE_DECODE_GATHER);
    unsetenv("MLXCEL_PAGED_ATTENTION_NATIVE");
    free_batch(&b);
}

/* Plans that validation rejects give the gather answer, which matches the reference. */
static void rejected_plans_gather(void) {
    be_backend *be = tb_create(2);
    scene sc = {be, NULL, 2, 4, 8, 64, 8, BASE_DTYPE_F16};
    kv_geometry g = {1, 2, 64, 8, BASE_DTYPE_F16, 0, NULL};
    base_err err;
    CHECK(kv_pool_create(be, &g, 64, 0, &sc.pool, &err) == 0);
    ref_seq seqs[3] = {0};
    ref_seq *rs[3];
    int q_lens[3] = {37, 20, 5};
    for (int s = 0; s < 3; s++) {
        seqs[s].seq = kv_seq_create(sc.pool);
        rs[s] = &seqs[s];
    }
    kv_batch batch;
    CHECK(scene_step(&sc, rs, q_lens, 3, &batch) == 0);
    kv_batch_free(&batch);
    q_lens[0] = q_lens[1] = 1;
    q_lens[2] = 3;
    CHECK(scene_step(&sc, rs, q_lens, 3, &batch) == 0);
    const be_paged_batch *b = &batch.view;
    size_t n = (size_t)b->n_tokens * 8 * 64;
    float *q = malloc(n * sizeof(float)), *ref = malloc(n * sizeof(float));
    float *want = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) q[i] = frand();
    dense_ref(&sc, rs, b, q, ref, be_attn_plain(0.125f));
    be_decode_plan gather = {.kind = BE_DECODE_GATHER};
    CHECK(scene_attend(&sc, b, &gather, q, want, be_attn_plain(0.125f)) == 0);
    CHECK(test_rel_err(want, ref, n) < 2e-5);
    uint64_t fits = attn_v2_bytes(2, 5, 8, 64); /* the longest decode row has 5 pages */
    void *ws = malloc(fits);
    const be_decode_plan bad[] = {
        {BE_DECODE_V2, 1, 4, ws, fits},                   /* 5 pages need 5 chunks */
        {BE_DECODE_V2, 1, 5, ws, fits - 1},               /* workspace too small */
        {BE_DECODE_V2, 1, 5, NULL, 0},                    /* no workspace */
        {BE_DECODE_V2, 0, 5, ws, fits},                   /* no pages per chunk */
        {(be_decode_kind)7, 1, 5, ws, fits},              /* unknown kind */
        {BE_DECODE_V2, 1, ATTN_GRID_YZ_MAX + 1, ws, fits} /* past the grid */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(attn_plan_validate(&bad[i], b, kv_pool_layer(sc.pool, 0), 8, &err) == -1);
        for (size_t j = 0; j < n; j++) got[j] = NAN;
        CHECK(scene_attend(&sc, b, &bad[i], q, got, be_attn_plain(0.125f)) == 0);
        CHECK_MSG(memcmp(got, want, n * sizeof(float)) == 0, "rejected plan %zu", i);
    }
    be_decode_plan good = {BE_DECODE_V2, 1, 5, ws, fits};
    CHECK(attn_plan_validate(&good, b, kv_pool_layer(sc.pool, 0), 8, &err) == 0);
    CHECK(attn_plan_validate(&good, b, kv_pool_layer(sc.pool, 0), 7, &err) == -1);
    CHECK(strstr(err.msg, "multiple") != NULL);
    free(ws);
    free(q);
    free(ref);
    free(want);
    free(got);
    kv_batch_free(&batch);
    for (int s = 0; s < 3; s++) ref_free(&sc, &seqs[s]);
    kv_pool_destroy(sc.pool);
    tb_destroy(be);
}

/* A plan made for a length bucket serves every batch of that bucket on a backend that sees
 * only max_kv_len (CUDA): kv batches carry no first-page offsets, so a bucket of P pages needs
 * P pages of chunks, not P + 1. With offsets present the launcher must allow one page more,
 * which a plan cut exactly at P does not cover: that was the case where recorded decode steps
 * silently ran as v1 on 8 CTAs. */
static void bucket_plans_cover(void) {
    const int blocks[] = {16, 32}, rows[] = {1, 4, 64, 256};
    int v2_plans = 0, exact = 0;
    for (int bi = 0; bi < 2; bi++)
        for (int ri = 0; ri < 4; ri++)
            for (int64_t pages = 1; pages <= 8192; pages *= 2) {
                be_decode_plan plan;
                attn_plan_decode_pages(rows[ri], pages, 32, 8, 128, 396, (void *)16, UINT64_MAX,
                                       &plan);
                if (plan.kind != BE_DECODE_V2) continue;
                v2_plans++;
                be_paged_batch b = {.n_seqs = rows[ri], .max_kv_len = (int)(pages * blocks[bi])};
                CHECK_MSG(attn_plan_covers(&plan, &b, blocks[bi]),
                          "rows %d, %lld pages of %d: %d chunks of %d pages", rows[ri],
                          (long long)pages, blocks[bi], plan.max_chunks, plan.pages_per_chunk);
                int32_t offsets[1] = {0};
                b.first_page_offset = offsets;
                if ((int64_t)plan.max_chunks * plan.pages_per_chunk == pages) {
                    exact++;
                    CHECK(!attn_plan_covers(&plan, &b, blocks[bi]));
                }
            }
    CHECK(v2_plans > 20 && exact > 5);
}

int main(void) {
    bucket_plans_cover();
    chunk_choice();
    chunk_waves();
    chunk_slack();
    chunk_minimum();
    chunk_bounds();
    workspace_matches_plans();
    environment();
    rejected_plans_gather();
    TEST_MAIN_END();
}
