/* Paged attention on the CPU: v1, v2 (several chunkings), gather and the planned path all
 * agree with a dense double-precision reference, over random shapes (GQA 1 to 16, head_dim
 * 64/128/256, lengths off the block size, forked sequences sharing blocks, prefill rows mixed
 * with decode rows) and every pool dtype. */
#include "attn_test_scene.h"

#define TOL 2e-5

static const char *kind_name(be_decode_kind k) {
    return k == BE_DECODE_V1 ? "v1" : k == BE_DECODE_V2 ? "v2" : "gather";
}

/* Runs the batch under `plan` and compares with the reference. */
static void check_plan(const scene *sc, const be_paged_batch *b, const be_decode_plan *plan,
                       const float *q, const float *ref, float *out, be_attn at, const char *what) {
    size_t n = (size_t)b->n_tokens * sc->n_heads * sc->head_dim;
    for (size_t i = 0; i < n; i++) out[i] = NAN;
    int rc = scene_attend(sc, b, plan, q, out, at);
    double e = test_rel_err(out, ref, n);
    CHECK_MSG(rc == 0 && e < TOL,
              "%s %s: dtype %s, %d kv heads x %d, head_dim %d, block %d, cap %g, window %d: err %g",
              what, kind_name(plan->kind), base_dtype_name(sc->dtype), sc->n_kv, sc->group,
              sc->head_dim, sc->block_size, (double)at.softcap, at.window, e);
}

static int max_decode_pages(const be_paged_batch *b, int *n_decode) {
    int mx = 0;
    *n_decode = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        if (b->q_indptr[s + 1] - b->q_indptr[s] != 1) continue;
        (*n_decode)++;
        int pages = b->page_indptr[s + 1] - b->page_indptr[s];
        if (pages > mx) mx = pages;
    }
    return mx;
}

/* Every path on one batch for one kind of attention. */
static void check_paths(const scene *sc, ref_seq *const *rs, const be_paged_batch *b, be_attn at) {
    size_t n = (size_t)b->n_tokens * sc->n_heads * sc->head_dim;
    float *q = malloc(n * sizeof(float)), *ref = malloc(n * sizeof(float));
    float *out = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) q[i] = frand();
    dense_ref(sc, rs, b, q, ref, at);

    be_decode_plan v1 = {.kind = BE_DECODE_V1}, gather = {.kind = BE_DECODE_GATHER};
    check_plan(sc, b, &v1, q, ref, out, at, "fixed");
    check_plan(sc, b, &gather, q, ref, out, at, "fixed");
    int n_decode;
    int pages = max_decode_pages(b, &n_decode);
    for (int ppc = 1; ppc <= 3 && n_decode > 0; ppc++) {
        be_decode_plan v2 = {.kind = BE_DECODE_V2, .pages_per_chunk = ppc};
        v2.max_chunks = (pages + ppc - 1) / ppc;
        v2.workspace_bytes = attn_v2_bytes(n_decode, v2.max_chunks, sc->n_heads, sc->head_dim);
        v2.workspace = malloc(v2.workspace_bytes);
        check_plan(sc, b, &v2, q, ref, out, at, "fixed");
        free(v2.workspace);
    }
    /* The planned path for several device targets, each with the workspace the model would
     * reserve for it: the plan must fit that workspace and give the same answer. */
    const int targets[] = {1, 3, 16, 100, 5000};
    int max_len = 0;
    for (int s = 0; s < b->n_seqs; s++) max_len = b->kv_len[s] > max_len ? b->kv_len[s] : max_len;
    for (size_t t = 0; t < sizeof targets / sizeof targets[0]; t++) {
        uint64_t ws = attn_workspace_bytes(sc->n_heads, sc->n_kv, sc->head_dim, sc->block_size,
                                           b->n_seqs, max_len, targets[t]);
        void *mem = malloc(ws ? ws : 1);
        be_decode_plan plan;
        attn_plan_decode(b, sc->block_size, sc->n_heads, sc->n_kv, sc->head_dim, targets[t], mem,
                         ws, &plan);
        base_err err;
        int ok = attn_plan_validate(&plan, b, kv_pool_layer(sc->pool, 0), sc->n_heads, &err);
        CHECK_MSG(ok == 0, "target %d: planned %s rejected: %s", targets[t], kind_name(plan.kind),
                  err.msg);
        char what[32];
        snprintf(what, sizeof what, "target %d", targets[t]);
        check_plan(sc, b, &plan, q, ref, out, at, what);
        free(mem);
    }
    /* A plan made for longer rows (the length bucket of a recorded decode step) serves this
     * batch too: its chunks past a row's pages are empty. */
    for (int mult = 2; mult <= 8 && n_decode > 0; mult *= 4) {
        uint64_t ws = attn_workspace_bytes(sc->n_heads, sc->n_kv, sc->head_dim, sc->block_size,
                                           b->n_seqs, (int64_t)max_len * mult, 16);
        void *mem = malloc(ws ? ws : 1);
        be_decode_plan plan;
        attn_plan_decode_pages(n_decode, (int64_t)pages * mult, sc->n_heads, sc->n_kv, sc->head_dim,
                               16, mem, ws, &plan);
        base_err err;
        int ok = attn_plan_validate(&plan, b, kv_pool_layer(sc->pool, 0), sc->n_heads, &err);
        CHECK_MSG(ok == 0, "plan for %dx the pages rejected: %s", mult, err.msg);
        check_plan(sc, b, &plan, q, ref, out, at, "bucket");
        free(mem);
    }
    free(q);
    free(ref);
    free(out);
}

/* Every path on one batch: plain attention, soft-capped scores (Gemma 2: a cap the scores
 * reach, so tanh bends them), a window shorter than most rows (local layers), and sinks. */
static void check_all_paths(const scene *sc, ref_seq *const *rs, const be_paged_batch *b) {
    float scale = 1.0f / sqrtf((float)sc->head_dim);
    check_paths(sc, rs, b, be_attn_plain(scale));
    be_attn capped = be_attn_plain(4.0f * scale);
    capped.softcap = 1.5f;
    check_paths(sc, rs, b, capped);
    be_attn local = be_attn_plain(scale);
    local.window = irand(1, 2 * sc->block_size + 3);
    check_paths(sc, rs, b, local);
    /* GPT-OSS: sinks around the scores' scale, on windowed and full attention. */
    float *sinks = malloc((size_t)sc->n_heads * sizeof(float));
    for (int h = 0; h < sc->n_heads; h++) sinks[h] = 2.0f * frand();
    local.sinks = sinks;
    check_paths(sc, rs, b, local);
    be_attn sunk = be_attn_plain(scale);
    sunk.sinks = sinks;
    check_paths(sc, rs, b, sunk);
    free(sinks);
}

/* One random scene: a base sequence, forks of it (sharing its blocks, the last one partial)
 * and fresh sequences, each given some history, then a final step mixing decode and prefill
 * rows, checked on every path. The base's own prefill step is checked too. */
static void random_scene(base_dtype dt, int n_kv, int group, int head_dim, int block_size) {
    be_backend *be = tb_create(2);
    scene sc = {be, NULL, n_kv, group, n_kv * group, head_dim, block_size, dt};
    kv_geometry g = {1, n_kv, head_dim, block_size, dt, 0, NULL};
    base_err err;
    if (kv_pool_create(be, &g, 4096 / block_size + 64, 0, &sc.pool, &err)) {
        CHECK_MSG(0, "pool: %s", err.msg);
        tb_destroy(be);
        return;
    }
    enum { MAX_SEQS = 6 };
    ref_seq seqs[MAX_SEQS] = {0};
    ref_seq *rs[MAX_SEQS];
    int q_lens[MAX_SEQS];
    seqs[0].seq = kv_seq_create(sc.pool);
    rs[0] = &seqs[0];
    kv_batch batch;
    q_lens[0] = irand(2, 3 * block_size + 5);
    CHECK(scene_step(&sc, rs, q_lens, 1, &batch) == 0);
    check_all_paths(&sc, rs, &batch.view);
    kv_batch_free(&batch);

    int n = irand(2, MAX_SEQS);
    int n_hist = 0;
    ref_seq *hist[MAX_SEQS];
    for (int s = 1; s < n; s++) {
        bool fork = rnd() % 2;
        if (fork) {
            seqs[s] = ref_fork(&sc, &seqs[0]);
        } else {
            seqs[s].seq = kv_seq_create(sc.pool);
        }
        rs[s] = &seqs[s];
        int h = fork ? irand(0, 20) : irand(1, 200);
        if (h) {
            hist[n_hist] = rs[s];
            q_lens[n_hist++] = h;
        }
    }
    if (n_hist) {
        CHECK(scene_step(&sc, hist, q_lens, n_hist, &batch) == 0);
        kv_batch_free(&batch);
    }
    for (int s = 0; s < n; s++) q_lens[s] = rnd() % 5 < 3 ? 1 : irand(2, 9);
    q_lens[rnd() % n] = 1;
    CHECK(scene_step(&sc, rs, q_lens, n, &batch) == 0);
    check_all_paths(&sc, rs, &batch.view);
    kv_batch_free(&batch);
    CHECK(kv_pool_check(sc.pool, &err) == 0);
    for (int s = 0; s < n; s++) ref_free(&sc, &seqs[s]);
    kv_pool_destroy(sc.pool);
    tb_destroy(be);
}

/* A sliding-window style page table: the first page starts first_page_offset slots in. */
static void first_page_offset_case(base_dtype dt) {
    be_backend *be = tb_create(2);
    enum { BS = 8, KV = 2, GROUP = 3, D = 64, LEN = 20, OFF = 3 };
    scene sc = {be, NULL, KV, GROUP, KV * GROUP, D, BS, dt};
    kv_geometry g = {1, KV, D, BS, dt, 0, NULL};
    base_err err;
    CHECK(kv_pool_create(be, &g, 16, 0, &sc.pool, &err) == 0);
    const int32_t pages[3] = {5, 2, 9};
    int64_t slots[LEN];
    ref_seq r = {0};
    float k[KV * D], v[KV * D];
    for (int t = 0; t < LEN; t++) {
        int idx = OFF + t;
        slots[t] = (int64_t)pages[idx / BS] * BS + idx % BS;
        for (int j = 0; j < KV * D; j++) {
            k[j] = round_to(dt, frand());
            v[j] = round_to(dt, frand());
        }
        ref_push(&sc, &r, k, v);
    }
    be_paged_batch wb = {.n_tokens = LEN, .slots = slots};
    be_tensor kt = {r.k, BASE_DTYPE_F32, LEN, KV * D}, vt = {r.v, BASE_DTYPE_F32, LEN, KV * D};
    CHECK(be->ops->kv_append(be, kv_pool_layer(sc.pool, 0), &kt, &vt, &wb, &err) == 0);

    /* two sequences over the same pages: one decode row, four prefill rows */
    const int32_t q_indptr[3] = {0, 1, 5}, kv_len[2] = {LEN, LEN}, page_indptr[3] = {0, 3, 6};
    const int32_t page_indices[6] = {5, 2, 9, 5, 2, 9}, last[2] = {LEN + OFF - 2 * BS, 7};
    const int32_t first[2] = {OFF, OFF};
    be_paged_batch b = {.n_seqs = 2,
                        .n_tokens = 5,
                        .max_q_len = 4,
                        .max_kv_len = LEN,
                        .q_indptr = q_indptr,
                        .kv_len = kv_len,
                        .page_indptr = page_indptr,
                        .page_indices = page_indices,
                        .last_page_len = last,
                        .first_page_offset = first};
    ref_seq *rs[2] = {&r, &r};
    check_all_paths(&sc, rs, &b);
    free(r.k);
    free(r.v);
    kv_pool_destroy(sc.pool);
    tb_destroy(be);
}

int main(void) {
    const base_dtype dts[] = {BASE_DTYPE_F32, BASE_DTYPE_F16, BASE_DTYPE_BF16};
    const int groups[] = {1, 2, 4, 8, 16}, dims[] = {64, 128, 256}, blocks[] = {4, 16, 32};
    for (int d = 0; d < 3; d++) {
        for (int i = 0; i < 10; i++) {
            int group = groups[irand(0, 4)];
            int n_kv = group >= 8 ? 1 : irand(1, 2);
            random_scene(dts[d], n_kv, group, dims[irand(0, 2)], blocks[irand(0, 2)]);
        }
        first_page_offset_case(dts[d]);
    }
    /* every GQA ratio and head_dim at least once */
    for (int i = 0; i < 5; i++) random_scene(BASE_DTYPE_F16, 1, groups[i], dims[i % 3], 32);
    TEST_MAIN_END();
}
