/* The CUDA backend's moe op against the CPU backend's on the same random inputs: stacked
 * experts in BF16, 4-bit affine (groups of 64), 8-bit affine (groups of 32) and MXFP4; 8
 * experts, top 2, 1, 3, 5, 33 and 80 rows (BF16: up to 4 rows the per-pair kernels, from 5 the
 * kernels grouped by expert; 4-bit, 8-bit and MXFP4: the decode GEMV's MoE jobs up to 64 rows,
 * grouped from there); then a wider layer of 16 experts, top 6, in 4 and 8 bits and MXFP4, whose
 * rows span several of the GEMV's chunks; each activation; norm_topk on and off; with and without
 * the router's and the experts' biases; with and without the RMSNorm before. Then the op recorded
 * as a graph and replayed on both paths, its scratch refusing to grow while recording, and
 * its argument checks. Skipped when no CUDA device is present.
 *
 * The tolerances. The CUDA op sums every product in F32 over the weights' exact values (the
 * decode GEMV's MoE jobs and its router logits: integer dots over x rounded to 2^-23 of each
 * unit's largest |x|) and routes in F32 (nothing is rounded to BF16 on the way), so it is held
 * to TOL_EXACT against the op computed here in double from the same values: F32 sums of 256 and
 * 128 products and two weighted experts stay far below it (the CPU's F32 paths, BF16 and MXFP4
 * here, come within 3e-7; the GEMV's, 2e-6). Against the CPU backend the same bound holds for BF16
 * and MXFP4 experts; for 4- and 8-bit ones the CPU's integer dots round x to int16 codes per group
 * (2^-16 of the group's largest |x|, and the gate/up output that feeds down has a long tail), which
 * puts the CPU itself up to 1.7e-4 from the double op on these inputs: TOL_CPU_INT is 3 times that.
 * A wrong expert, weight, scale or activation moves y by a sizeable share of its norm. The closest
 * second and third router logits of the first layer's rows were 3.6e-5 apart, far more than
 * F32 sums of the logits can move them, so both backends pick the same experts (a row whose
 * experts differed would miss TOL_EXACT against the double op by far). */
#include "test_cuda_util.h"

#include <math.h>

#define TOL_EXACT   1e-5
#define TOL_CPU_INT 5e-4
#define NORM_EPS    1e-5f

typedef enum { FMT_BF16, FMT_Q4_G64, FMT_Q8_G32, FMT_MXFP4, FMT_COUNT } fmt;

static const char *fmt_name[FMT_COUNT] = {"bf16", "q4_g64", "q8_g32", "mxfp4"};

static be_backend *cpu;

/* The layer's shape, one at a time (test_vs_cpu walks them). */
typedef struct shape {
    int experts, top_k;
    int64_t hidden, inter;
} shape;

static shape G = {8, 2, 256, 128};

/* A linear layer in host memory (for the CPU backend) and its device copy. */
typedef struct mlin {
    be_linear host, dev;
    void *h[4]; /* weight, scales, biases, bias in host memory (NULL where absent) */
} mlin;

static void *host_bf16(size_t n, float amp) {
    uint16_t *p = malloc(n * 2 + 2);
    for (size_t i = 0; i < n; i++) p[i] = base_f32_to_bf16(amp * tc_uniform());
    return p;
}

static void *host_words(size_t bytes) {
    uint32_t *p = malloc(bytes + 4);
    for (size_t i = 0; i < (bytes + 3) / 4; i++) p[i] = tc_u32();
    return p;
}

/* out x in in format f, values about amp in size, with a BF16 bias when `bias`. */
static void make_mlin(be_backend *be, mlin *L, fmt f, int64_t out, int64_t in, float amp,
                      bool bias) {
    memset(L, 0, sizeof *L);
    be_linear *w = &L->host;
    w->out = out;
    w->in = in;
    size_t wbytes = 0, sbytes = 0;
    if (f == FMT_BF16) {
        w->dtype = BASE_DTYPE_BF16;
        L->h[0] = host_bf16((size_t)(out * in), amp);
        wbytes = (size_t)(out * in) * 2;
    } else if (f == FMT_MXFP4) {
        w->bits = 4;
        w->group_size = 32;
        w->quant = BE_QUANT_MXFP4;
        w->dtype = BASE_DTYPE_U8;
        wbytes = (size_t)(out * in / 2);
        L->h[0] = host_words(wbytes);
        sbytes = (size_t)(out * in / 32);
        uint8_t *s = malloc(sbytes);
        /* 2^-7 .. 2^-4 times codes up to 6: about amp for amp near 0.1 */
        for (size_t i = 0; i < sbytes; i++) s[i] = (uint8_t)(120 + tc_u32() % 4);
        L->h[1] = s;
    } else {
        w->bits = f == FMT_Q4_G64 ? 4 : 8;
        w->group_size = f == FMT_Q4_G64 ? 64 : 32;
        w->dtype = BASE_DTYPE_BF16;
        wbytes = (size_t)(out * in * w->bits / 8);
        L->h[0] = host_words(wbytes);
        size_t ng = (size_t)(out * in / w->group_size);
        sbytes = ng * 2;
        uint16_t *s = malloc(sbytes), *b = malloc(sbytes);
        const float levels = (float)(1 << w->bits);
        for (size_t i = 0; i < ng; i++) {
            /* q in [0, levels) centred: values in about [-amp, amp] */
            float sc = 2.0f * amp * (0.75f + 0.25f * tc_uniform()) / levels;
            s[i] = base_f32_to_bf16(sc);
            b[i] = base_f32_to_bf16(-sc * levels / 2 + 0.1f * amp * tc_uniform());
        }
        L->h[1] = s;
        L->h[2] = b;
    }
    if (bias) {
        w->bias_dtype = BASE_DTYPE_BF16;
        L->h[3] = host_bf16((size_t)out, 0.3f);
    }
    w->weight = L->h[0];
    w->scales = L->h[1];
    w->biases = L->h[2];
    w->bias = L->h[3];
    L->dev = *w;
    L->dev.weight = tc_dev_bytes(be, L->h[0], wbytes);
    if (L->h[1]) L->dev.scales = tc_dev_bytes(be, L->h[1], sbytes);
    if (L->h[2]) L->dev.biases = tc_dev_bytes(be, L->h[2], sbytes);
    if (L->h[3]) L->dev.bias = tc_dev_bytes(be, L->h[3], (size_t)out * 2);
}

static void free_mlin(be_backend *be, mlin *L) {
    be->ops->free(be, (void *)L->dev.weight);
    be->ops->free(be, (void *)L->dev.scales);
    be->ops->free(be, (void *)L->dev.biases);
    be->ops->free(be, (void *)L->dev.bias);
    for (int i = 0; i < 4; i++) free(L->h[i]);
}

/* One layer's router and experts in both memories. */
typedef struct layer {
    mlin router, gate, up, down;
    be_moe host, dev;
    float *norm_w; /* [hidden] */
} layer;

static void make_layer(be_backend *be, layer *ly, fmt f, bool router_bias, bool expert_bias,
                       be_act act, bool norm_topk) {
    /* The MXFP4 checkpoints (gpt-oss MXFP4-Q8) keep an 8-bit router. */
    make_mlin(be, &ly->router, f == FMT_MXFP4 ? FMT_Q8_G32 : f, G.experts, G.hidden, 0.15f,
              router_bias);
    /* SwiGLU's clamp at 7 is reached with larger gate/up values. */
    const float amp = act == BE_ACT_SWIGLU_OAI ? 0.5f : 0.12f;
    make_mlin(be, &ly->gate, f, G.experts * G.inter, G.hidden, amp, expert_bias);
    make_mlin(be, &ly->up, f, G.experts * G.inter, G.hidden, amp, expert_bias);
    make_mlin(be, &ly->down, f, G.experts * G.hidden, G.inter, 0.12f, expert_bias);
    ly->host = (be_moe){&ly->router.host,
                        &ly->gate.host,
                        &ly->up.host,
                        &ly->down.host,
                        G.experts,
                        G.top_k,
                        G.inter,
                        norm_topk,
                        act,
                        0,
                        0};
    ly->dev = ly->host;
    ly->dev.router = &ly->router.dev;
    ly->dev.gate = &ly->gate.dev;
    ly->dev.up = &ly->up.dev;
    ly->dev.down = &ly->down.dev;
    ly->norm_w = malloc(sizeof(float) * (size_t)G.hidden);
    for (int i = 0; i < G.hidden; i++) ly->norm_w[i] = 1.0f + 0.5f * tc_uniform();
}

static void free_layer(be_backend *be, layer *ly) {
    free_mlin(be, &ly->router);
    free_mlin(be, &ly->gate);
    free_mlin(be, &ly->up);
    free_mlin(be, &ly->down);
    free(ly->norm_w);
}

/* y of n rows of x through the CPU backend (host memory; with the norm when `normed`). */
static float *run_cpu(const layer *ly, const float *x, int n, bool normed) {
    float *y = malloc(sizeof(float) * (size_t)n * G.hidden);
    float *xs = malloc(sizeof(float) * (size_t)n * G.hidden);
    memcpy(xs, x, sizeof(float) * (size_t)n * G.hidden);
    float *scratch = malloc(sizeof(float) * (size_t)n * G.hidden);
    be_tensor tx = {xs, BASE_DTYPE_F32, n, G.hidden}, ty = {y, BASE_DTYPE_F32, n, G.hidden};
    be_tensor tw = {(void *)ly->norm_w, BASE_DTYPE_F32, 1, G.hidden};
    be_tensor ts = {scratch, BASE_DTYPE_F32, n, G.hidden};
    be_norm norm = {&tw, NORM_EPS, &ts};
    base_err err = {{0}};
    CHECK_MSG(cpu->ops->moe(cpu, &tx, normed ? &norm : NULL, &ly->host, &ty, &err) == 0, "cpu: %s",
              err.msg);
    free(xs);
    free(scratch);
    return y;
}

/* The same through the CUDA backend; y starts poisoned, so a row left unwritten fails. */
static float *cuda_moe_run(be_backend *be, const layer *ly, const float *x, int n, bool normed) {
    be_tensor tx = tc_tensor(be, x, BASE_DTYPE_F32, n, G.hidden);
    be_tensor ty = tc_poisoned(be, BASE_DTYPE_F32, n, G.hidden);
    be_tensor tw = tc_tensor(be, ly->norm_w, BASE_DTYPE_F32, 1, G.hidden);
    be_tensor ts = tc_poisoned(be, BASE_DTYPE_F32, n, G.hidden);
    be_norm norm = {&tw, NORM_EPS, &ts};
    base_err err = {{0}};
    CHECK_MSG(be->ops->moe(be, &tx, normed ? &norm : NULL, &ly->dev, &ty, &err) == 0, "cuda: %s",
              err.msg);
    float *y = tc_read(be, &ty);
    be->ops->free(be, tx.data);
    be->ops->free(be, ty.data);
    be->ops->free(be, tw.data);
    be->ops->free(be, ts.data);
    return y;
}

static float *rand_x(int n) {
    float *x = malloc(sizeof(float) * (size_t)n * G.hidden);
    tc_fill(x, (size_t)n * G.hidden, 1.0f);
    return x;
}

/* Value (o, k) of the host layer w as both backends read it, in double. */
static double ref_weight(const be_linear *w, int64_t o, int64_t k) {
    if (!w->bits) return base_load_float(w->weight, w->dtype, (size_t)(o * w->in + k));
    const uint8_t *row = (const uint8_t *)w->weight + (size_t)(o * w->in * w->bits / 8);
    const size_t g = (size_t)(o * (w->in / w->group_size) + k / w->group_size);
    if (w->quant == BE_QUANT_MXFP4) {
        /* two codes a byte, the low nibble first; E2M1 magnitudes times 2^(scale - 127) */
        static const double e2m1[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
        const unsigned q = (row[k / 2] >> (4 * (k % 2))) & 15u;
        const double v = ldexp(e2m1[q & 7u], (int)((const uint8_t *)w->scales)[g] - 127);
        return q & 8u ? -v : v;
    }
    /* the row's little-endian bit stream */
    uint32_t q = 0;
    for (int b = 0; b < w->bits; b++) {
        const uint64_t bit = (uint64_t)k * (uint64_t)w->bits + (uint64_t)b;
        q |= (uint32_t)((row[bit / 8] >> (bit % 8)) & 1u) << b;
    }
    return (double)base_load_float(w->scales, w->dtype, g) * q +
           base_load_float(w->biases, w->dtype, g);
}

static double ref_dot(const be_linear *w, int64_t o, const double *x) {
    double acc = w->bias ? base_load_float(w->bias, w->bias_dtype, (size_t)o) : 0.0;
    for (int64_t k = 0; k < w->in; k++) acc += ref_weight(w, o, k) * x[k];
    return acc;
}

static double ref_act(be_act act, double g, double u) {
    if (act == BE_ACT_SWIGLU_OAI) {
        g = fmin(g, 7.0), u = fmin(fmax(u, -7.0), 7.0);
        return g / (1.0 + exp(-1.702 * g)) * (u + 1.0);
    }
    if (act == BE_ACT_GELU_TANH)
        return 0.5 * g * (1.0 + tanh(0.7978845608028654 * (g + 0.044715 * g * g * g))) * u;
    return g / (1.0 + exp(-g)) * u;
}

/* The op in double (be_ops.moe's contract), n rows of x into y. */
static void ref_moe(const layer *ly, const float *x, int n, bool normed, float *y) {
    const be_moe *m = &ly->host;
    for (int r = 0; r < n; r++) {
        double ss = 0, *xr = malloc(sizeof(double) * (size_t)G.hidden),
               *l = malloc(sizeof(double) * (size_t)G.experts),
               *w = malloc(sizeof(double) * (size_t)G.top_k),
               *h = malloc(sizeof(double) * (size_t)G.inter),
               *yr = calloc((size_t)G.hidden, sizeof(double));
        for (int c = 0; c < G.hidden; c++) {
            xr[c] = x[r * G.hidden + c];
            ss += xr[c] * xr[c];
        }
        const double inv = normed ? 1.0 / sqrt(ss / G.hidden + NORM_EPS) : 1.0;
        for (int c = 0; c < G.hidden; c++) xr[c] *= normed ? inv * ly->norm_w[c] : 1.0;
        double mx = -INFINITY, sum = 0, chosen = 0;
        for (int e = 0; e < G.experts; e++) mx = fmax(mx, l[e] = ref_dot(m->router, e, xr));
        for (int e = 0; e < G.experts; e++) sum += exp(l[e] - mx);
        int *ids = malloc(sizeof(int) * (size_t)G.top_k);
        bool *taken = calloc((size_t)G.experts, sizeof(bool));
        for (int k = 0; k < G.top_k; k++) {
            int best = -1;
            for (int e = 0; e < G.experts; e++)
                if (!taken[e] && (best < 0 || l[e] > l[best])) best = e;
            taken[best] = true;
            ids[k] = best;
            chosen += (w[k] = exp(l[best] - mx) / sum);
        }
        for (int k = 0; k < G.top_k; k++) {
            const int64_t e = ids[k];
            for (int i = 0; i < G.inter; i++)
                h[i] = ref_act(m->act, ref_dot(m->gate, e * G.inter + i, xr),
                               ref_dot(m->up, e * G.inter + i, xr));
            for (int o = 0; o < G.hidden; o++)
                yr[o] +=
                    (m->norm_topk ? w[k] / chosen : w[k]) * ref_dot(m->down, e * G.hidden + o, h);
        }
        for (int o = 0; o < G.hidden; o++) y[r * G.hidden + o] = (float)yr[o];
        free(xr), free(l), free(w), free(h), free(yr), free(ids), free(taken);
    }
}

/* The op on shape s against the CPU and the double op, for each count of rows[0..nr): every
 * format, activation, norm_topk and bias choice, or on a wide shape (wide) the 4- and 8-bit
 * formats only (the decode GEMV's MoE jobs), SiLU and the clamped SwiGLU, biases none or all. */
static void test_vs_cpu(be_backend *be, shape s, const int *rows, int nr, bool wide) {
    static const be_act acts[] = {BE_ACT_SILU, BE_ACT_GELU_TANH, BE_ACT_SWIGLU_OAI};
    G = s;
    double worst[FMT_COUNT] = {0}, worst_cpu[FMT_COUNT] = {0};
    int cases = 0;
    for (int f = wide ? FMT_Q4_G64 : 0; f < FMT_COUNT; f++)
        for (int a = 0; a < 3; a += wide ? 2 : 1)
            for (int t = 0; t < 2; t++)
                for (int b = 0; b < 3; b += wide ? 2 : 1) {
                    /* biases: none, the router's alone, the router's and the experts' */
                    layer ly;
                    make_layer(be, &ly, (fmt)f, b > 0, b > 1, acts[a], t);
                    for (int r = 0; r < nr; r++) {
                        const int n = rows[r];
                        const bool normed = (a + b + r) % 2;
                        float *x = rand_x(n);
                        float *want = run_cpu(&ly, x, n, normed);
                        float *exact = malloc(sizeof(float) * (size_t)n * G.hidden);
                        ref_moe(&ly, x, n, normed, exact);
                        float *got = cuda_moe_run(be, &ly, x, n, normed);
                        const size_t len = (size_t)n * G.hidden;
                        const double e = test_rel_err(got, exact, len);
                        const double ec = test_rel_err(got, want, len);
                        const double tol_cpu =
                            f == FMT_Q4_G64 || f == FMT_Q8_G32 ? TOL_CPU_INT : TOL_EXACT;
                        worst[f] = fmax(worst[f], e);
                        worst_cpu[f] = fmax(worst_cpu[f], ec);
                        CHECK_MSG(e < TOL_EXACT && ec < tol_cpu,
                                  "%d of %d experts, hidden %lld, inter %lld: %s act %d norm_topk "
                                  "%d biases %d rows %d norm %d: rel err %.3e, %.3e against the "
                                  "CPU",
                                  s.top_k, s.experts, (long long)s.hidden, (long long)s.inter,
                                  fmt_name[f], (int)acts[a], t, b, n, normed, e, ec);
                        cases++;
                        free(x), free(want), free(exact), free(got);
                    }
                    free_layer(be, &ly);
                }
    printf("  top %d of %d experts, hidden %lld, inter %lld:\n", s.top_k, s.experts,
           (long long)s.hidden, (long long)s.inter);
    for (int f = 0; f < FMT_COUNT; f++)
        if (!wide || f == FMT_Q4_G64 || f == FMT_Q8_G32)
            printf("  moe %-7s max rel err %.2e (against the CPU %.2e)\n", fmt_name[f], worst[f],
                   worst_cpu[f]);
    printf("  moe: %d cases\n", cases);
}

/* n rows through the op recorded, then replayed on new inputs: equal to a direct run bit for
 * bit (the grouped path's pair order, the atomics', changes no value). */
static void record_replay(be_backend *be, const layer *ly, int n) {
    base_err err = {{0}};
    float *x1 = rand_x(n), *x2 = rand_x(n);
    const size_t bytes = sizeof(float) * (size_t)n * G.hidden;
    be_tensor tx = tc_tensor(be, x1, BASE_DTYPE_F32, n, G.hidden);
    be_tensor ty = tc_poisoned(be, BASE_DTYPE_F32, n, G.hidden);
    CHECK_MSG(be->ops->moe(be, &tx, NULL, &ly->dev, &ty, &err) == 0, "%s", err.msg);
    float *direct1 = tc_read(be, &ty);
    CHECK(be->ops->capture_begin(be, &err) == 0);
    CHECK_MSG(be->ops->moe(be, &tx, NULL, &ly->dev, &ty, &err) == 0, "recording: %s", err.msg);
    be_graph *g = NULL;
    CHECK_MSG(be->ops->capture_end(be, &g, &err) == 0 && g, "capture of %d rows: %s", n, err.msg);
    if (g) {
        CHECK(be->ops->upload(be, tx.data, x2, bytes, &err) == 0);
        CHECK_MSG(be->ops->graph_launch(be, g, &err) == 0, "%s", err.msg);
        float *replay2 = tc_read(be, &ty);
        CHECK_MSG(be->ops->moe(be, &tx, NULL, &ly->dev, &ty, &err) == 0, "%s", err.msg);
        float *direct2 = tc_read(be, &ty);
        CHECK_MSG(memcmp(replay2, direct2, bytes) == 0,
                  "%d rows: the replay differs from a direct run", n);
        CHECK_MSG(memcmp(direct1, direct2, bytes) != 0, "%d rows: the replay ignored the new input",
                  n);
        free(replay2), free(direct2);
        be->ops->graph_free(be, g);
    }
    free(direct1);
    be->ops->free(be, tx.data);
    be->ops->free(be, ty.data);
    free(x1), free(x2);
}

/* A recording in which the scratch would have to grow fails, naming the scratch; recordings of
 * one row (the decode GEMV's MoE jobs) and of 80 (grouped by expert) replay. */
static void test_graph(be_backend *be) {
    if (!be->ops->capture_begin) return;
    layer ly;
    make_layer(be, &ly, FMT_Q4_G64, true, true, BE_ACT_SILU, true);
    base_err err = {{0}};
    /* 2000 rows: more pairs than any call before */
    const int big = 2000;
    be_tensor bx = tc_poisoned(be, BASE_DTYPE_F32, big, G.hidden);
    be_tensor by = tc_poisoned(be, BASE_DTYPE_F32, big, G.hidden);
    CHECK(be->ops->capture_begin(be, &err) == 0);
    int rc = be->ops->moe(be, &bx, NULL, &ly.dev, &by, &err);
    CHECK_MSG(rc == -1 && strstr(err.msg, "scratch") && strstr(err.msg, "recording"),
              "growing in a capture: rc %d: %s", rc, err.msg);
    be_graph *g = NULL;
    base_err end_err = {{0}};
    if (be->ops->capture_end(be, &g, &end_err) == 0) be->ops->graph_free(be, g);
    be->ops->free(be, bx.data);
    be->ops->free(be, by.data);
    record_replay(be, &ly, 1);
    record_replay(be, &ly, 80);
    free_layer(be, &ly);
}

/* Bad arguments fail with an error that names the problem, before any launch. */
static void test_checks(be_backend *be) {
    layer ly;
    make_layer(be, &ly, FMT_BF16, false, false, BE_ACT_SILU, false);
    be_tensor tx = tc_poisoned(be, BASE_DTYPE_F32, 3, G.hidden);
    be_tensor ty = tc_poisoned(be, BASE_DTYPE_F32, 3, G.hidden);
    base_err err = {{0}};
    be_moe m = ly.dev;
    m.top_k = G.experts + 1;
    CHECK(be->ops->moe(be, &tx, NULL, &m, &ty, &err) == -1 && strstr(err.msg, "experts"));
    m = ly.dev;
    m.inter = G.inter / 2;
    CHECK(be->ops->moe(be, &tx, NULL, &m, &ty, &err) == -1 && strstr(err.msg, "do not fit"));
    m = ly.dev;
    m.act = (be_act)7;
    CHECK(be->ops->moe(be, &tx, NULL, &m, &ty, &err) == -1 && strstr(err.msg, "activation"));
    be_linear bad = ly.gate.dev;
    bad.bits = 7;
    bad.group_size = 64;
    m = ly.dev;
    m.gate = &bad;
    CHECK(be->ops->moe(be, &tx, NULL, &m, &ty, &err) == -1 && strstr(err.msg, "7 bits"));
    bad = ly.down.dev;
    bad.bits = 4;
    bad.group_size = 32;
    bad.quant = BE_QUANT_MXFP4;
    bad.dtype = BASE_DTYPE_BF16;
    m = ly.dev;
    m.down = &bad;
    CHECK(be->ops->moe(be, &tx, NULL, &m, &ty, &err) == -1 && strstr(err.msg, "mxfp4"));
    CHECK(be->ops->moe(be, &tx, NULL, &ly.dev, &tx, &err) == -1 && strstr(err.msg, "alias"));
    be_tensor ts = tc_poisoned(be, BASE_DTYPE_F32, 2, G.hidden);
    be_norm norm = {&tx, NORM_EPS, &ts};
    CHECK(be->ops->moe(be, &tx, &norm, &ly.dev, &ty, &err) == -1 && strstr(err.msg, "scratch"));
    be->ops->free(be, tx.data);
    be->ops->free(be, ty.data);
    be->ops->free(be, ts.data);
    free_layer(be, &ly);
}

int main(void) {
    be_backend *be = tc_backend();
    if (!be) return TEST_SKIP;
    base_err err = {{0}};
    CHECK_MSG(be_cpu_create(2, &cpu, &err) == 0, "%s", err.msg);
    static const int rows[] = {1, 3, 5, 33, 80}, wide_rows[] = {1, 2, 3};
    test_vs_cpu(be, (shape){8, 2, 256, 128}, rows, 5, false);
    /* Rows of several 64-unit chunks (8-bit gate/up: 72 units; down 6 slots of 24 units, 4-bit
     * and MXFP4 12) whose slots straddle the chunks' lanes; rows of x on the grid's y. */
    test_vs_cpu(be, (shape){16, 6, 1152, 384}, wide_rows, 3, true);
    G = (shape){8, 2, 256, 128};
    test_checks(be);
    test_graph(be);
    cpu->ops->destroy(cpu);
    CHECK_MSG(be->ops->sync(be, &err) == 0, "%s", err.msg);
    be->ops->destroy(be);
    TEST_MAIN_END();
}
