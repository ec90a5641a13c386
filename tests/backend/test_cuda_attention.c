/* CUDA paged attention (decode v1, v2 + merge, prefill rows) against a dense double-precision
 * reference on random geometries: GQA groups 1 to 16, head_dim 32/64/96/128/256 (96, Phi-3's,
 * on the F32 kernel for every row, in sub-groups of at most 2 heads), f16 and bf16 pools,
 * scattered pages, lengths that are not multiples of the block size, a first-page offset, and
 * mixed prefill + decode batches. Pool slots no live token occupies hold NaN, so reading one
 * shows. Decode rows at head_dim 64/128 (groups up to 16) and 256 (groups up to 8), blocks of
 * 16/32/48/64 run on the tensor cores, in single terms for 16-bit activations and split terms
 * for F32 (whose bound is F32's), unless the decode grid has at most 16 CTAs (a few rows of few
 * kv heads); the other cases keep the F32 kernel, as do prompt rows at head_dim 32 (the others
 * take the tensor-core prefill kernel). A long row among four others at every block size gives a
 * CTA's warps far more tiles than one window of the page table holds (v1 takes the tensor cores
 * from 4 kv heads on). v2 plans run from one chunk to hundreds (about 40 among them), their merge
 * kernel taking one chunk's weights or many blocks of them. Every plan runs twice on the same
 * workspace, and the second output must equal the first bit for bit: whatever the kernels
 * leave behind for the next launch (the wide decode kernel's counters) shows there, and so
 * does a merge that depends on which CTA finished last. Batches of decode rows
 * only, whose rows times kv heads are 16 or fewer, at head_dim 64/128/256, take the wide decode
 * kernel whatever the plan (every decode_only, offsets and the one- and two-row batches below):
 * rows of one token to over 2000, spans that do not divide the row, spans past a short row's end,
 * first-page offsets. rope_kv_attention, which folds RoPE and the append into that kernel, against
 * rope_kv_append then attention on the same batches. Attention with a logit soft-cap, a
 * sliding window or sinks against the reference and the CPU backend, on the kernel each batch
 * takes as above: the wide decode kernel (decode_only, two_rows, and long_row's few kv heads
 * once a window shortens its rows), the tensor cores (mixed's and long_row's decode rows at
 * head_dim 64 to 256; mixed's prompt rows on the prefill kernel) and the F32 kernel (head_dim
 * 32, blocks of 8). A kernel that dropped the cap, the window or the sinks would differ from
 * both by far more than the tolerance (a cap of 2 bends every score; a window of 1 to 300
 * keys leaves keys out of rows of up to 8400). Skipped when no CUDA device is present. */
#include "test_cuda_util.h"

#include "attn/attn.h"

#include <math.h>
#include <stdlib.h>

/* With attn's soft-cap and window: a row that sees nvis keys sees the last `window` of them;
 * with its sinks (host memory here), head h's denominator has one more term, e^sinks[h]. */
static void reference(const tc_batch *b, const tc_att_case *c, const float *q, const float *kf,
                      const float *vf, be_attn attn, double *out) {
    int D = c->head_dim, nkv = c->n_kv, H = c->group * nkv, width = nkv * D;
    double *sc = malloc(sizeof(double) * (b->max_kv + 1));
    for (int s = 0; s < b->n_seqs; s++) {
        int ql = b->q_indptr[s + 1] - b->q_indptr[s];
        for (int i = 0; i < ql; i++) {
            int row = b->q_indptr[s] + i, nvis = b->kv_len[s] - ql + i + 1;
            int j0 = attn.window > 0 && nvis > attn.window ? nvis - attn.window : 0;
            for (int h = 0; h < H; h++) {
                int kvh = h / c->group;
                const float *qr = q + (size_t)row * H * D + (size_t)h * D;
                double mx = -INFINITY, sum = 0;
                for (int j = j0; j < nvis; j++) {
                    const float *kr = kf + tc_tok_offset(b, s, j, c->block_size, width) + kvh * D;
                    double d = 0;
                    for (int e = 0; e < D; e++) d += (double)qr[e] * kr[e];
                    sc[j] = d * attn.scale;
                    if (attn.softcap > 0) sc[j] = attn.softcap * tanh(sc[j] / attn.softcap);
                    mx = sc[j] > mx ? sc[j] : mx;
                }
                if (attn.sinks) mx = fmax(mx, attn.sinks[h]);
                for (int j = j0; j < nvis; j++) sum += (sc[j] = exp(sc[j] - mx));
                if (attn.sinks) sum += exp(attn.sinks[h] - mx);
                double *o = out + (size_t)row * H * D + (size_t)h * D;
                for (int e = 0; e < D; e++) o[e] = 0;
                for (int j = j0; j < nvis; j++) {
                    const float *vr = vf + tc_tok_offset(b, s, j, c->block_size, width) + kvh * D;
                    for (int e = 0; e < D; e++) o[e] += sc[j] / sum * vr[e];
                }
            }
        }
    }
    free(sc);
}

/* Largest |a - b| over two device tensors of equal shape, NaN where exactly one of a pair is
 * NaN (pool slots no token occupies hold NaN in both). */
static double dev_diff(be_backend *be, const be_tensor *a, const be_tensor *b) {
    size_t n = (size_t)(a->rows * a->cols);
    float *x = tc_read(be, a), *y = tc_read(be, b);
    double d = 0;
    for (size_t i = 0; i < n && !isnan(d); i++) {
        if (isnan(x[i]) || isnan(y[i]))
            d = isnan(x[i]) && isnan(y[i]) ? d : NAN;
        else
            d = fmax(d, fabs((double)x[i] - y[i]));
    }
    free(x), free(y);
    return d;
}

/* The CPU backend, for attention with a soft-cap or a window. */
static be_backend *cpu;

/* The CPU backend's attention on the same pools, batch and q (host copies), as F32. */
static float *cpu_attention(const tc_batch *b, const tc_att_case *c, const tc_pools *pools,
                            const float *q, be_attn attn) {
    const int D = c->head_dim, H = c->group * c->n_kv;
    const size_t qn = (size_t)b->n_tokens * H * D;
    float *out = malloc(sizeof(float) * qn);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)b->n_tokens);
    for (int s = 0; s < b->n_seqs; s++) {
        const int ql = b->q_indptr[s + 1] - b->q_indptr[s];
        for (int i = 0; i < ql; i++) pos[b->q_indptr[s] + i] = b->kv_len[s] - ql + i;
    }
    be_kv_layer layer = {pools->kh,     pools->vh, c->pool_dt, b->num_blocks,
                         c->block_size, c->n_kv,   D};
    be_paged_batch hb = {.n_seqs = b->n_seqs,
                         .n_tokens = b->n_tokens,
                         .max_q_len = b->max_q,
                         .max_kv_len = b->max_kv,
                         .q_indptr = b->q_indptr,
                         .kv_len = b->kv_len,
                         .page_indptr = b->page_indptr,
                         .page_indices = b->pages,
                         .last_page_len = b->last_len,
                         .first_page_offset = b->first,
                         .positions = pos};
    be_tensor tq = {(void *)q, BASE_DTYPE_F32, b->n_tokens, (int64_t)H * D};
    be_tensor to = {out, BASE_DTYPE_F32, b->n_tokens, (int64_t)H * D};
    base_err err = {{0}};
    CHECK_MSG(cpu->ops->attention(cpu, &tq, &layer, &hb, NULL, H, attn, &to, &err) == 0,
              "cpu attention: %s", err.msg);
    free(pos);
    return out;
}

/* Attention at 1 / sqrt(head_dim) with the given soft-cap and window (0, 0: plain), and with
 * random sinks when `sinks`, against the reference; with any of them, also against the CPU
 * backend. */
static void run_case_sinks(be_backend *be, const tc_att_case *c, const tc_seq *seqs, int n_seqs,
                           float softcap, int window, bool sinks) {
    tc_batch b;
    tc_batch_build(seqs, n_seqs, c->block_size, 7, &b);
    int D = c->head_dim, H = c->group * c->n_kv;
    tc_pools pools;
    tc_pools_fill(&b, c, &pools);
    size_t qn = (size_t)b.n_tokens * H * D;
    float *q = malloc(sizeof(float) * qn);
    tc_fill(q, qn, 2.0f);
    tc_round(q, qn, c->act_dt);
    float *hs = malloc(sizeof(float) * H);
    if (sinks) tc_fill(hs, H, 3.0f);
    be_attn attn = {1.0f / sqrtf((float)D), softcap, window, sinks ? hs : NULL};
    const bool plain = softcap == 0.0f && window == 0 && !sinks;
    double *ref = malloc(sizeof(double) * qn);
    reference(&b, c, q, pools.kf, pools.vf, attn, ref);
    float *cref = plain ? NULL : cpu_attention(&b, c, &pools, q, attn);
    /* the device reads its own copy */
    float *ds = sinks ? tc_dev_bytes(be, hs, sizeof(float) * H) : NULL;
    attn.sinks = ds;

    be_kv_layer layer = tc_dev_layer(be, &pools, &b, c);
    be_paged_batch db = tc_dev_batch(be, &b);
    be_tensor tq = tc_tensor(be, q, c->act_dt, b.n_tokens, (int64_t)H * D);
    /* plans: none (v1), v1, gather (served as v1), v2 at 1 and 3 pages per chunk, in about 40
     * chunks, and in 2 and 1 chunks */
    const int whole = b.max_pages + 1;
    int kinds[] = {-1,           BE_DECODE_V1, BE_DECODE_GATHER, BE_DECODE_V2,
                   BE_DECODE_V2, BE_DECODE_V2, BE_DECODE_V2,     BE_DECODE_V2};
    int ppcs[] = {0, 0, 0, 1, 3, whole > 40 ? whole / 40 : 1, (whole + 1) / 2, whole};
    for (int k = 0; k < 8; k++) {
        be_decode_plan plan = {0}, *pp = NULL;
        if (kinds[k] >= 0) {
            plan.kind = (be_decode_kind)kinds[k];
            pp = &plan;
        }
        if (kinds[k] == BE_DECODE_V2) {
            /* chunks for one page more than the longest row holds, which a first-page
             * offset may add: a plan short of that is served as v1 */
            plan.pages_per_chunk = ppcs[k];
            plan.max_chunks = (b.max_pages + 1 + ppcs[k] - 1) / ppcs[k];
            plan.workspace_bytes =
                (uint64_t)b.n_seqs * plan.max_chunks * H * (uint64_t)(D + 1) * sizeof(float);
            base_err e2 = {{0}};
            CHECK(be->ops->alloc(be, plan.workspace_bytes, &plan.workspace, &e2) == 0);
        }
        be_tensor to = tc_poisoned(be, c->act_dt, b.n_tokens, (int64_t)H * D);
        base_err err = {{0}};
        int rc = be->ops->attention(be, &tq, &layer, &db, pp, H, attn, &to, &err);
        CHECK_MSG(rc == 0, "%s", err.msg);
        CHECK_MSG(be->ops->sync(be, &err) == 0, "%s", err.msg);
        double e = tc_err(be, &to, ref);
        double tol = c->act_dt == BASE_DTYPE_F32 ? 1e-5 : tc_tol(c->act_dt);
        /* Prompt rows at head_dim 64 to 256 run on the tensor cores with q and the softmax
         * weights rounded to the pool dtype (test_cuda_prefill bounds that path element by
         * element); the other rows compute in F32. */
        if (b.max_q > 1 && D >= 64 && tc_tol(c->pool_dt) > tol) tol = tc_tol(c->pool_dt);
        CHECK_MSG(e < tol,
                  "attention G%d kv%d d%d bs%d pool %s act %s plan %d ppc %d cap %g window %d "
                  "sinks %d: err %g (seqs %d)",
                  c->group, c->n_kv, D, c->block_size, base_dtype_name(c->pool_dt),
                  base_dtype_name(c->act_dt), kinds[k], ppcs[k], (double)softcap, window, sinks, e,
                  n_seqs);
        if (cref) {
            float *got = tc_read(be, &to);
            const double ec = test_rel_err(got, cref, qn);
            CHECK_MSG(ec < tol,
                      "attention G%d kv%d d%d bs%d plan %d cap %g window %d sinks %d: against "
                      "the CPU, err %g (seqs %d)",
                      c->group, c->n_kv, D, c->block_size, kinds[k], (double)softcap, window, sinks,
                      ec, n_seqs);
            free(got);
        }
        /* The same launch again on the same workspace: what a launch leaves behind (the wide
         * decode kernel's counters, the workspace's partials) must not change the next. */
        be_tensor again = tc_poisoned(be, c->act_dt, b.n_tokens, (int64_t)H * D);
        rc = be->ops->attention(be, &tq, &layer, &db, pp, H, attn, &again, &err);
        CHECK_MSG(rc == 0 && be->ops->sync(be, &err) == 0, "%s", err.msg);
        double d2 = dev_diff(be, &to, &again);
        CHECK_MSG(d2 == 0,
                  "attention G%d kv%d d%d bs%d plan %d ppc %d: second launch differs by %g",
                  c->group, c->n_kv, D, c->block_size, kinds[k], ppcs[k], d2);
        be->ops->free(be, again.data);
        be->ops->free(be, to.data);
        be->ops->free(be, plan.workspace);
    }
    be->ops->free(be, tq.data);
    be->ops->free(be, ds);
    tc_dev_layer_free(be, &layer);
    tc_dev_batch_free(be, &db);
    tc_pools_free(&pools);
    free(q), free(ref), free(cref), free(hs);
    tc_batch_free(&b);
}

static void run_case(be_backend *be, const tc_att_case *c, const tc_seq *seqs, int n_seqs,
                     float softcap, int window) {
    run_case_sinks(be, c, seqs, n_seqs, softcap, window, false);
}

/* rope_kv_attention against rope_kv_append then attention, both on the device from the same
 * q, k, v and pools (positions past the rows' lengths, mscale 1.1) with the given soft-cap and
 * window: the same outputs, and the same pools after, the new token's k and v in their slots. */
static void run_rope_case(be_backend *be, const tc_att_case *c, const tc_seq *seqs, int n_seqs,
                          float softcap, int window) {
    tc_batch b;
    tc_batch_build(seqs, n_seqs, c->block_size, 7, &b);
    const int D = c->head_dim, H = c->group * c->n_kv, W = c->n_kv * D, bs = c->block_size;
    tc_pools pools;
    tc_pools_fill(&b, c, &pools);
    const size_t qn = (size_t)b.n_tokens * H * D, kn = (size_t)b.n_tokens * W;
    float *q = malloc(sizeof(float) * qn), *k = malloc(sizeof(float) * kn);
    float *v = malloc(sizeof(float) * kn), inv[ATTN_MAX_HEAD_DIM / 2];
    tc_fill(q, qn, 2.0f), tc_fill(k, kn, 1.0f), tc_fill(v, kn, 1.0f);
    for (int i = 0; i < D / 2; i++) inv[i] = (float)pow(500000.0, -2.0 * i / D);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)b.n_seqs);
    int64_t *slots = malloc(sizeof(int64_t) * (size_t)b.n_seqs);
    for (int s = 0; s < b.n_seqs; s++) {
        const int u = b.first[s] + b.kv_len[s] - 1;
        pos[s] = b.kv_len[s] + 6;
        slots[s] = (int64_t)b.pages[b.page_indptr[s] + u / bs] * bs + u % bs;
    }
    be_paged_batch db = tc_dev_batch(be, &b);
    db.slots = tc_dev_bytes(be, slots, sizeof(int64_t) * (size_t)b.n_seqs);
    be_tensor tp = {tc_dev_bytes(be, pos, sizeof(int32_t) * (size_t)b.n_seqs), BASE_DTYPE_I32,
                    b.n_tokens, 1};
    be_tensor tf = tc_tensor(be, inv, BASE_DTYPE_F32, 1, D / 2);
    const be_attn attn = {1.0f / sqrtf((float)D), softcap, window, NULL};
    be_kv_layer layer[2];
    be_tensor to[2], tq[2], tk[2], tv[2];
    for (int f = 0; f < 2; f++) {
        layer[f] = tc_dev_layer(be, &pools, &b, c);
        tq[f] = tc_tensor(be, q, c->act_dt, b.n_tokens, (int64_t)H * D);
        tk[f] = tc_tensor(be, k, c->act_dt, b.n_tokens, W);
        tv[f] = tc_tensor(be, v, c->act_dt, b.n_tokens, W);
        to[f] = tc_poisoned(be, c->act_dt, b.n_tokens, (int64_t)H * D);
        base_err err = {{0}};
        int rc =
            f ? be->ops->rope_kv_attention(be, &tq[f], &tk[f], &tv[f], &tp, &tf, 1.1f, &layer[f],
                                           &db, NULL, H, attn, &to[f], &err)
              : be->ops->rope_kv_append(be, &tq[f], &tk[f], &tv[f], &tp, &tf, 1.1f, &layer[f], &db,
                                        &err) ||
                    be->ops->attention(be, &tq[f], &layer[f], &db, NULL, H, attn, &to[f], &err);
        CHECK_MSG(rc == 0, "%s", err.msg);
    }
    const int64_t elems = (int64_t)(pools.bytes / 2);
    be_tensor pk[2], pv[2];
    for (int f = 0; f < 2; f++) {
        pk[f] = (be_tensor){layer[f].k, c->pool_dt, elems, 1};
        pv[f] = (be_tensor){layer[f].v, c->pool_dt, elems, 1};
    }
    double eo = dev_diff(be, &to[0], &to[1]);
    double ek = dev_diff(be, &pk[0], &pk[1]), ev = dev_diff(be, &pv[0], &pv[1]);
    double tol = c->act_dt == BASE_DTYPE_F32 ? 1e-5 : tc_tol(c->act_dt);
    CHECK_MSG(eo < tol && ek < tc_tol(c->pool_dt) && ev == 0,
              "rope_kv_attention G%d kv%d d%d bs%d pool %s act %s cap %g window %d (seqs %d): "
              "out diff %g, pool k diff %g, v diff %g",
              c->group, c->n_kv, D, bs, base_dtype_name(c->pool_dt), base_dtype_name(c->act_dt),
              (double)softcap, window, n_seqs, eo, ek, ev);
    for (int f = 0; f < 2; f++) {
        void *bufs[] = {tq[f].data, tk[f].data, tv[f].data, to[f].data};
        for (int i = 0; i < 4; i++) be->ops->free(be, bufs[i]);
        tc_dev_layer_free(be, &layer[f]);
    }
    be->ops->free(be, tp.data), be->ops->free(be, tf.data), be->ops->free(be, (void *)db.slots);
    tc_dev_batch_free(be, &db);
    tc_pools_free(&pools);
    free(q), free(k), free(v), free(pos), free(slots);
    tc_batch_free(&b);
}

int main(void) {
    be_backend *be = tc_backend();
    if (!be) return TEST_SKIP;
    const tc_att_case cases[] = {
        {1, 4, 64, 16, BASE_DTYPE_F16, BASE_DTYPE_F32},
        {4, 2, 128, 32, BASE_DTYPE_BF16, BASE_DTYPE_F32},
        {8, 1, 256, 16, BASE_DTYPE_F16, BASE_DTYPE_F32},
        {16, 2, 128, 32, BASE_DTYPE_F16, BASE_DTYPE_F32},
        {6, 1, 64, 8, BASE_DTYPE_BF16, BASE_DTYPE_F32},
        {4, 8, 128, 32, BASE_DTYPE_F16, BASE_DTYPE_BF16},
        {2, 2, 256, 32, BASE_DTYPE_BF16, BASE_DTYPE_F16},
        {2, 2, 32, 32, BASE_DTYPE_F16, BASE_DTYPE_BF16},
        {8, 1, 32, 16, BASE_DTYPE_BF16, BASE_DTYPE_F32},
        {6, 1, 64, 32, BASE_DTYPE_BF16, BASE_DTYPE_BF16},
        {8, 2, 128, 16, BASE_DTYPE_F16, BASE_DTYPE_F16},
        {3, 4, 128, 32, BASE_DTYPE_BF16, BASE_DTYPE_F32},
        /* the tensor cores' other blocks: three and four 16-token tiles per page */
        {4, 2, 128, 48, BASE_DTYPE_F16, BASE_DTYPE_F32},
        {2, 4, 64, 64, BASE_DTYPE_BF16, BASE_DTYPE_BF16},
        /* the Llama-3.1-8B decode shape */
        {4, 8, 128, 32, BASE_DTYPE_F16, BASE_DTYPE_F32},
        {4, 8, 128, 32, BASE_DTYPE_BF16, BASE_DTYPE_F32},
        /* Gemma 3 4B: 8 heads over 4, head_dim 256 */
        {2, 4, 256, 32, BASE_DTYPE_BF16, BASE_DTYPE_F32},
        /* head_dim 96 (Phi-3-mini, Phi-3.5-mini: no GQA), and its groups of 2 and of 8 (four
         * sub-groups of 2) */
        {1, 4, 96, 16, BASE_DTYPE_BF16, BASE_DTYPE_F32},
        {2, 2, 96, 32, BASE_DTYPE_F16, BASE_DTYPE_BF16},
        {8, 1, 96, 16, BASE_DTYPE_BF16, BASE_DTYPE_F32},
    };
    /* decode rows of assorted lengths, one with a first-page offset, a fresh prompt and a
     * chunked-prefill continuation */
    const tc_seq mixed[] = {{1, 1, 0},   {37, 1, 0},  {100, 1, 5},
                            {45, 45, 0}, {250, 1, 0}, {70, 9, 0}};
    const tc_seq decode_only[] = {{300, 1, 0}, {33, 1, 0}, {5, 1, 3}};
    /* first-page offsets past the first 16-token tile (one sequence living in its second
     * tile alone) and a long row, for blocks of 32 */
    const tc_seq offsets[] = {{12, 1, 20}, {40, 1, 17}, {700, 1, 31}};
    /* a row of over 512 pages at small blocks: at one page per chunk the merge takes its
     * chunks in more than one block of weights */
    const tc_seq long_row[] = {{8400, 1, 0}, {20, 1, 2}, {2100, 1, 7}, {1, 1, 0}, {700, 1, 3}};
    /* batch-1 and batch-2 decode: a row in many spans, a row of 2100 tokens next to a short one
     * with an offset, a row shorter than one span */
    const tc_seq one_row[] = {{611, 1, 0}};
    const tc_seq two_rows[] = {{2100, 1, 0}, {37, 1, 5}};
    const tc_seq tiny_row[] = {{3, 1, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        run_case(be, &cases[i], mixed, 6, 0.0f, 0);
        run_case(be, &cases[i], decode_only, 3, 0.0f, 0);
        if (cases[i].block_size >= 32) run_case(be, &cases[i], offsets, 3, 0.0f, 0);
        run_case(be, &cases[i], long_row, 5, 0.0f, 0);
        run_case(be, &cases[i], one_row, 1, 0.0f, 0);
        run_case(be, &cases[i], two_rows, 2, 0.0f, 0);
        run_case(be, &cases[i], tiny_row, 1, 0.0f, 0);
    }
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        run_rope_case(be, &cases[i], decode_only, 3, 0.0f, 0);
        if (cases[i].block_size >= 32) run_rope_case(be, &cases[i], offsets, 3, 0.0f, 0);
        run_rope_case(be, &cases[i], one_row, 1, 0.0f, 0);
        run_rope_case(be, &cases[i], two_rows, 2, 0.0f, 0);
        run_rope_case(be, &cases[i], tiny_row, 1, 0.0f, 0);
    }
    /* Soft-capped and windowed attention on every kernel: head_dim 32 to 256, blocks of 8 to
     * 64, 16-bit and F32 activations, on prefill and decode rows with first-page offsets. Windows
     * of one key (a row sees itself alone), inside one page, across pages, past some rows and not
     * others (mixed: rows of 1 to 250 keys; long_row: 1 to 8400), and past every row; the cap with
     * and without a window. */
    base_err err = {{0}};
    CHECK_MSG(be_cpu_create(2, &cpu, &err) == 0, "%s", err.msg);
    const size_t gemma_cases[] = {0, 1, 2, 4, 6, 7, 10, 13, 14, 16, 17, 18};
    const struct {
        float softcap;
        int window;
    } attns[] = {{2.0f, 0}, {0.0f, 1}, {0.0f, 7}, {0.0f, 50}, {2.0f, 300}, {0.0f, 100000}};
    for (size_t g = 0; g < sizeof gemma_cases / sizeof gemma_cases[0]; g++) {
        const tc_att_case *c = &cases[gemma_cases[g]];
        for (size_t a = 0; a < sizeof attns / sizeof attns[0]; a++) {
            const float cap = attns[a].softcap;
            const int win = attns[a].window;
            run_case(be, c, mixed, 6, cap, win);
            run_case(be, c, decode_only, 3, cap, win);
            if (c->block_size >= 32) run_case(be, c, offsets, 3, cap, win);
            run_case(be, c, long_row, 5, cap, win);
            run_case(be, c, two_rows, 2, cap, win);
        }
        run_rope_case(be, c, decode_only, 3, 2.0f, 7);
        run_rope_case(be, c, two_rows, 2, 0.0f, 50);
        run_rope_case(be, c, one_row, 1, 2.0f, 0);
    }
    /* Sinks (GPT-OSS), alone and with a window, on every kernel under every plan: the v2
     * plans' rows take one chunk. */
    for (size_t g = 0; g < sizeof gemma_cases / sizeof gemma_cases[0]; g++) {
        const tc_att_case *c = &cases[gemma_cases[g]];
        for (int win = 0; win <= 50; win += 50) {
            run_case_sinks(be, c, mixed, 6, 0.0f, win, true);
            run_case_sinks(be, c, decode_only, 3, 0.0f, win, true);
            run_case_sinks(be, c, long_row, 5, 0.0f, win, true);
            run_case_sinks(be, c, two_rows, 2, 0.0f, win, true);
        }
    }
    cpu->ops->destroy(cpu);
    be->ops->destroy(be);
    TEST_MAIN_END();
}
