/* CUDA tensor-core prefill attention against a double-precision reference, element by element
 * under a bound derived from the rounding the kernel is allowed to do.
 *
 * Batches mix prompts of 2 to 300 rows (fresh ones, kv_len == q_len, and continuations with
 * earlier tokens in the cache), decode rows, partly filled last pages, a first-page offset and
 * page ids shuffled over a pool with spare blocks; GQA groups 1 to 8, head_dim 64, 128 and
 * 256, f16 and bf16 pools, F32 and BF16 activations. Pool slots no live token occupies hold
 * NaN, so reading one shows; outputs start as NaN, so a row left unwritten shows. Then Gemma's
 * and GPT-OSS's attention on the same kernel: a logit soft-cap, windows of 1, 50 and 100 keys
 * (shorter than the 300-row prompts, whose later tiles then start past the keys before their
 * window), and sinks, alone and together; each with a control that the bound would see the
 * feature dropped (no cap, a window one key wider, no sinks).
 *
 * The bound. The kernel multiplies q by scale * log2(e) in F32 and rounds it to the pool
 * dtype (mma.sync takes both operands in one type); the reference starts from those same
 * rounded values q', so scores s_j = q'.k_j (log2 domain) differ only by F32 summation:
 * products of f16/bf16 values are exact in F32, each of the D additions and the subtraction of
 * the running max errs by at most one ulp (the tensor cores may truncate rather than round),
 * so |ds_j| <= (D + 4) 2^-23 sum_e |q'_e k_je|, plus 2^-21 for exp2f; call the largest over
 * the row's keys E (in log2 units, times ln 2 below). A perturbation of every score by at most E
 * moves each softmax weight by at most p_j (e^(2E ln2) - 1). The kernel then rounds the
 * unnormalized weights (<= 1) to the pool dtype, unit roundoff u (2^-11 f16, 2^-8 bf16), for P V
 * while the denominator sums the unrounded ones: relative error u on each term of the numerator.
 * The F32 sums over keys and tiles add (n_keys + D + 64) 2^-24 relative. With A_e = sum_j p_j
 * |v_je|: |out_e - ref_e| <= (e^(2E ln2) (1 + u) - 1 + (n_keys + D + 64) 2^-24) A_e + u_out |ref_e|
 * where u_out is the output dtype's rounding (0 for F32); f16 weights that fall to subnormals
 * add n_keys 2^-25 / l absolutely (|v| < 1, l the softmax denominator). The soft-cap
 * c tanh(s / c) (c = cap log2 e) has slope at most 1, so it passes E on, plus tanhf's and the
 * division's rounding, c 2^-20 at most; a sink's logit, scaled by log2 e in F32, errs by
 * |sink| 2^-22 at most, and joins the denominator as one more weight. Skipped with no CUDA
 * device. */
#include "test_cuda_util.h"

#include <math.h>

static double pf_round_unit(base_dtype dt) {
    return dt == BASE_DTYPE_F16 ? ldexp(1, -11) : dt == BASE_DTYPE_BF16 ? ldexp(1, -8) : 0;
}

/* ref and bound (n_tokens x H x D) for every row under attn (sinks in host memory): q' is
 * q * scale * log2 e rounded to the pool dtype, as the kernel sees it. `extra` more keys (up to
 * kv_len) are visible to prompt rows: 0 for the true function, 1 for a reference with the
 * causal mask one key too wide. Decode
 * rows are exact softmax too, with a bound of the same form: with F32 activations (split terms,
 * or the F32 kernel) u = 0; with 16-bit activations the tensor-core decode kernel takes q rounded
 * to the pool dtype before the scale (q' = round(q), then its F32 scores times scale * log2 e,
 * one rounding more) and rounds the weights to the pool dtype for P V (u as for prompt rows). */
static void pf_reference(const tc_batch *b, const tc_att_case *c, const float *q, const float *kf,
                         const float *vf, be_attn attn, int extra, double *ref, double *bound) {
    const int D = c->head_dim, H = c->group * c->n_kv, width = c->n_kv * D;
    const double u_out = pf_round_unit(c->act_dt);
    const float scale = attn.scale;
    const double cap = attn.softcap * 1.4426950408889634; /* log2 domain */
    double *sc = malloc(sizeof(double) * (size_t)(b->max_kv + 1));
    double *qr = malloc(sizeof(double) * (size_t)D);
    for (int s = 0; s < b->n_seqs; s++) {
        const int ql = b->q_indptr[s + 1] - b->q_indptr[s];
        const bool single = ql == 1 && c->act_dt != BASE_DTYPE_F32 && c->block_size % 16 == 0;
        const double u = ql > 1 || single ? pf_round_unit(c->pool_dt) : 0;
        for (int i = 0; i < ql; i++) {
            const int row = b->q_indptr[s] + i;
            const int causal = b->kv_len[s] - ql + i + 1;
            const int j0 = attn.window > 0 && causal > attn.window ? causal - attn.window : 0;
            int nvis = causal + (ql > 1 ? extra : 0);
            if (nvis > b->kv_len[s]) nvis = b->kv_len[s];
            for (int h = 0; h < H; h++) {
                const int kvh = h / c->group;
                const float *qh = q + ((size_t)row * H + h) * D;
                for (int e = 0; e < D; e++) {
                    float x = qh[e] * (scale * 1.4426950408889634f), y = qh[e];
                    if (ql > 1) tc_round(&x, 1, c->pool_dt);
                    if (single) tc_round(&y, 1, c->pool_dt);
                    qr[e] = ql > 1 ? x : (double)y * scale * 1.4426950408889634;
                }
                /* the sink (log2 domain), with its F32 scaling's error */
                const double sk = attn.sinks ? attn.sinks[h] * 1.4426950408889634 : -INFINITY;
                double mx = sk, sum = 0, E = attn.sinks ? fabs(sk) * ldexp(1, -22) : 0;
                for (int j = j0; j < nvis; j++) {
                    const float *kr = kf + tc_tok_offset(b, s, j, c->block_size, width) + kvh * D;
                    double d = 0, a = 0;
                    for (int e = 0; e < D; e++) d += qr[e] * kr[e], a += fabs(qr[e] * kr[e]);
                    double ej = (D + 4 + single) * ldexp(a, -23) + ldexp(1, -21);
                    if (cap > 0) d = cap * tanh(d / cap), ej += cap * ldexp(1, -20);
                    sc[j] = d;
                    E = ej > E ? ej : E;
                    mx = d > mx ? d : mx;
                }
                for (int j = j0; j < nvis; j++) sum += (sc[j] = exp2(sc[j] - mx));
                if (attn.sinks) sum += exp2(sk - mx);
                const int n_keys = nvis - j0;
                const double rel =
                    exp(2 * E * M_LN2) * (1 + u) - 1 + (n_keys + D + 64) * ldexp(1, -24);
                double *o = ref + ((size_t)row * H + h) * D,
                       *bo = bound + ((size_t)row * H + h) * D;
                for (int e = 0; e < D; e++) o[e] = bo[e] = 0;
                for (int j = j0; j < nvis; j++) {
                    const float *vr = vf + tc_tok_offset(b, s, j, c->block_size, width) + kvh * D;
                    for (int e = 0; e < D; e++) {
                        o[e] += sc[j] * vr[e];
                        bo[e] += sc[j] * fabs(vr[e]);
                    }
                }
                /* f16 weights below 2^-14 are subnormal: absolute error 2^-25 each, |v| < 1 */
                const double sub =
                    c->pool_dt == BASE_DTYPE_F16 && u > 0 ? n_keys * ldexp(1, -25) : 0;
                for (int e = 0; e < D; e++) {
                    o[e] /= sum;
                    bo[e] = rel * bo[e] / sum + sub / sum + u_out * fabs(o[e]);
                }
            }
        }
    }
    free(sc);
    free(qr);
}

/* Elements of got outside [ref - bound, ref + bound]; *worst: the index of the largest
 * error relative to its bound, *ratio that ratio. */
static int pf_outside(const float *got, const double *ref, const double *bound, size_t n,
                      size_t *worst, double *ratio) {
    int bad = 0;
    *worst = 0;
    *ratio = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (!(d <= bound[i])) bad++;
        double r = d / (bound[i] > 0 ? bound[i] : 1e-300);
        if (!(r <= *ratio)) *ratio = r, *worst = i;
    }
    return bad;
}

/* What a run's attention adds to plain causal attention: a soft-cap, a window, random sinks. */
typedef struct pf_feat {
    float softcap;
    int window;
    bool sinks;
} pf_feat;

/* Checks that a reference computed as `wrong` leaves some of got outside its bound: that the
 * comparison would see the difference (`what`). */
static void pf_control(const tc_batch *b, const tc_att_case *c, const float *q, const tc_pools *pl,
                       be_attn wrong, int extra, const float *got, double *ref, double *bound,
                       size_t qn, const char *what) {
    size_t worst;
    double worst_ratio;
    pf_reference(b, c, q, pl->kf, pl->vf, wrong, extra, ref, bound);
    int n = pf_outside(got, ref, bound, qn, &worst, &worst_ratio);
    CHECK_MSG(n > 0, "%s stays inside the bound (G%d d%d %s)", what, c->group, c->head_dim,
              base_dtype_name(c->pool_dt));
    printf("  control, %s: %d elements outside the bound\n", what, n);
}

/* Runs one batch against the reference. With `control`, also checks that the bound would
 * see a causal mask one key too wide, and each of f's features dropped, i.e. that the
 * comparison has the power to fail. */
static void pf_run(be_backend *be, const tc_att_case *c, const tc_seq *seqs, int n_seqs, pf_feat f,
                   int control) {
    tc_batch b;
    tc_batch_build(seqs, n_seqs, c->block_size, 5, &b);
    const int D = c->head_dim, H = c->group * c->n_kv;
    tc_pools pools;
    tc_pools_fill(&b, c, &pools);
    const size_t qn = (size_t)b.n_tokens * H * D;
    float *q = malloc(sizeof(float) * qn), *hs = malloc(sizeof(float) * H);
    tc_fill(q, qn, 2.0f);
    tc_round(q, qn, c->act_dt);
    tc_fill(hs, H, 3.0f);
    be_attn attn = {1.0f / sqrtf((float)D), f.softcap, f.window, f.sinks ? hs : NULL};
    double *ref = malloc(sizeof(double) * qn), *bound = malloc(sizeof(double) * qn);
    pf_reference(&b, c, q, pools.kf, pools.vf, attn, 0, ref, bound);

    be_kv_layer layer = tc_dev_layer(be, &pools, &b, c);
    be_paged_batch db = tc_dev_batch(be, &b);
    be_tensor tq = tc_tensor(be, q, c->act_dt, b.n_tokens, (int64_t)H * D);
    be_tensor to = tc_poisoned(be, c->act_dt, b.n_tokens, (int64_t)H * D);
    be_attn dev_attn = attn;
    dev_attn.sinks = f.sinks ? tc_dev_bytes(be, hs, sizeof(float) * H) : NULL;
    base_err err = {{0}};
    int rc = be->ops->attention(be, &tq, &layer, &db, NULL, H, dev_attn, &to, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    CHECK_MSG(be->ops->sync(be, &err) == 0, "%s", err.msg);
    float *got = tc_read(be, &to);
    size_t worst;
    double worst_ratio;
    int bad = pf_outside(got, ref, bound, qn, &worst, &worst_ratio);
    CHECK_MSG(bad == 0,
              "prefill G%d kv%d d%d bs%d pool %s act %s cap %g window %d sinks %d: %d of %zu "
              "outside the bound; worst at row %zu col %zu: got %g, ref %g, bound %g",
              c->group, c->n_kv, D, c->block_size, base_dtype_name(c->pool_dt),
              base_dtype_name(c->act_dt), (double)f.softcap, f.window, f.sinks, bad, qn,
              worst / ((size_t)H * D), worst % ((size_t)H * D), got[worst], ref[worst],
              bound[worst]);
    printf("G%d kv%d d%-3d bs%-2d pool %-4s act %-4s cap %g window %d sinks %d: %zu elements, "
           "worst error %.3f of the bound\n",
           c->group, c->n_kv, D, c->block_size, base_dtype_name(c->pool_dt),
           base_dtype_name(c->act_dt), (double)f.softcap, f.window, f.sinks, qn, worst_ratio);
    if (control) {
        pf_control(&b, c, q, &pools, attn, 1, got, ref, bound, qn, "mask one key too wide");
        be_attn wrong = attn;
        wrong.softcap = 0;
        if (f.softcap > 0) pf_control(&b, c, q, &pools, wrong, 0, got, ref, bound, qn, "no cap");
        wrong = attn;
        wrong.window++;
        if (f.window > 0)
            pf_control(&b, c, q, &pools, wrong, 0, got, ref, bound, qn, "window one key wider");
        wrong = attn;
        wrong.sinks = NULL;
        if (f.sinks) pf_control(&b, c, q, &pools, wrong, 0, got, ref, bound, qn, "no sinks");
    }
    free(got);
    be->ops->free(be, to.data);
    be->ops->free(be, tq.data);
    be->ops->free(be, (void *)dev_attn.sinks);
    tc_dev_layer_free(be, &layer);
    tc_dev_batch_free(be, &db);
    tc_pools_free(&pools);
    free(q), free(hs), free(ref), free(bound);
    tc_batch_free(&b);
}

int main(void) {
    be_backend *be = tc_backend();
    if (!be) return TEST_SKIP;
    const tc_att_case cases[] = {
        {1, 2, 64, 32, BASE_DTYPE_F16, BASE_DTYPE_F32},
        {4, 2, 128, 32, BASE_DTYPE_BF16, BASE_DTYPE_F32},
        {2, 2, 256, 32, BASE_DTYPE_BF16, BASE_DTYPE_F32},
        {8, 1, 128, 32, BASE_DTYPE_F16, BASE_DTYPE_F32},
        {4, 2, 64, 16, BASE_DTYPE_BF16, BASE_DTYPE_F32},
        {1, 2, 128, 32, BASE_DTYPE_BF16, BASE_DTYPE_F32},
        {8, 1, 64, 32, BASE_DTYPE_F16, BASE_DTYPE_BF16},
        {4, 1, 128, 8, BASE_DTYPE_F16, BASE_DTYPE_F32},
        /* Gemma 3 4B's geometry (8 heads over 4, head_dim 256), and 256 with a larger group */
        {2, 4, 256, 16, BASE_DTYPE_F16, BASE_DTYPE_BF16},
        {8, 1, 256, 32, BASE_DTYPE_F16, BASE_DTYPE_F32},
    };
    /* fresh prompts (2, 300, 65 rows), a continuation of 64 rows after 37 cached tokens, one
     * of 129 after 171 behind a first-page offset, and decode rows between them */
    const tc_seq seqs[] = {{2, 2, 0},     {37, 1, 0},  {300, 300, 0}, {101, 64, 0},
                           {300, 129, 5}, {250, 1, 3}, {65, 65, 0}};
    const int n_seqs = (int)(sizeof seqs / sizeof seqs[0]);
    const size_t n_cases = sizeof cases / sizeof cases[0];
    for (size_t i = 0; i < n_cases; i++)
        pf_run(be, &cases[i], seqs, n_seqs, (pf_feat){0, 0, false}, i < 3);
    /* Gemma 2's cap (small here, so that it bends the scores), windows of one key, inside a
     * tile and across tiles, GPT-OSS's sinks, and all three at once. */
    const pf_feat feats[] = {
        {2.0f, 0, false}, {0, 1, false}, {0, 50, false}, {2.0f, 100, true}, {0, 0, true}};
    const size_t feat_cases[] = {0, 2, 3, 6, 8};
    for (size_t f = 0; f < sizeof feats / sizeof feats[0]; f++)
        for (size_t i = 0; i < sizeof feat_cases / sizeof feat_cases[0]; i++)
            pf_run(be, &cases[feat_cases[i]], seqs, n_seqs, feats[f], i < 2);
    be->ops->destroy(be);
    TEST_MAIN_END();
}
