/* CPU matmul against a scalar double-precision reference: dense F32/F16/BF16 and every MLX
 * affine bit width x group size x scale dtype, with and without a bias, for 1, 3, 7 and 64
 * rows of x (both the fused decode path and the tiled prefill path; 4 and 8 bits at more row
 * counts, odd ones and past the integer dots' blocks of 4, 8 and 32), on every instruction set
 * this CPU has with 1, 2 and 3 threads. The reference uses the same dtype-rounded weights, so
 * the only difference left is f32 accumulation and the bound stays 1e-5.
 *
 * 4 and 8 bits run on integer dots over x quantized per group to int16: against a reference
 * given the same quantized x (each group's codes round(x * 32767 / max|x|)) the bound is still
 * 1e-5; against x itself the rounding adds about 1e-5 (uniform x), so that bound is 4e-5. Their
 * rows must also come out the same bits alone as among 7 others, whatever the thread count and
 * the instruction set, and the same bits from the weights repacked at load (45 rows: a tile of
 * 16 left partial) as from the linear's own layout. */
#include "cpu_test_util.h"

#include <math.h>

#define TOL      1e-5
#define TOL_XQ   4e-5 /* the integer dots against the unquantized x */
#define XQ_CODES 32767.0

/* A weight and its exact dequantized values. */
typedef struct mat {
    be_linear lin; /* bias left NULL; tests set it */
    void *w;       /* packed (out, in * bits / 8) bytes, or dense (out, in) */
    void *s, *b;   /* (out, in / g) quantized only */
    void *bias;    /* (out) of the scale / weight dtype */
    double *wd;    /* (out, in) */
    double *bd;    /* (out, in / g) each group's b, quantized only */
    double *biasd; /* (out) */
} mat;

static void mat_bias(mat *m, int64_t out, base_dtype dt) {
    m->bias = calloc((size_t)out, base_dtype_size(dt));
    m->biasd = malloc((size_t)out * sizeof(double));
    for (int64_t o = 0; o < out; o++)
        m->biasd[o] = tu_store_round(m->bias, dt, o, tu_uniform(-1, 1));
    m->lin.bias_dtype = dt;
}

static void mat_quant(mat *m, int64_t out, int64_t in, int bits, int g, base_dtype sdt) {
    memset(m, 0, sizeof *m);
    size_t row_bytes = (size_t)(in * bits / 8), ng = (size_t)(in / g);
    uint8_t *w = calloc((size_t)out, row_bytes);
    m->s = calloc((size_t)out * ng, base_dtype_size(sdt));
    m->b = calloc((size_t)out * ng, base_dtype_size(sdt));
    m->wd = malloc((size_t)(out * in) * sizeof(double));
    m->bd = malloc((size_t)out * ng * sizeof(double));
    for (int64_t o = 0; o < out; o++) {
        for (size_t gi = 0; gi < ng; gi++) {
            size_t i = (size_t)o * ng + gi;
            double s = tu_store_round(m->s, sdt, i, tu_uniform(-0.05f, 0.05f));
            double b = tu_store_round(m->b, sdt, i, tu_uniform(-0.5f, 0.5f));
            m->bd[i] = b;
            for (int j = 0; j < g; j++) {
                int64_t k = (int64_t)gi * g + j;
                unsigned q = (unsigned)(tu_next() % (1u << bits));
                tu_pack(w + (size_t)o * row_bytes, bits, k, q);
                m->wd[o * in + k] = s * q + b;
            }
        }
    }
    m->w = w;
    m->lin = (be_linear){.out = out,
                         .in = in,
                         .bits = bits,
                         .group_size = g,
                         .dtype = sdt,
                         .weight = w,
                         .scales = m->s,
                         .biases = m->b};
    mat_bias(m, out, sdt);
}

static void mat_dense(mat *m, int64_t out, int64_t in, base_dtype dt) {
    memset(m, 0, sizeof *m);
    m->w = calloc((size_t)(out * in), base_dtype_size(dt));
    m->wd = malloc((size_t)(out * in) * sizeof(double));
    for (int64_t i = 0; i < out * in; i++)
        m->wd[i] = tu_store_round(m->w, dt, i, tu_uniform(-1, 1));
    m->lin = (be_linear){.out = out, .in = in, .dtype = dt, .weight = m->w};
    mat_bias(m, out, dt == BASE_DTYPE_F32 ? BASE_DTYPE_BF16 : BASE_DTYPE_F32);
}

static void mat_free(mat *m) {
    free(m->w);
    free(m->s);
    free(m->b);
    free(m->bias);
    free(m->wd);
    free(m->bd);
    free(m->biasd);
}

static bool uses_idot(const mat *m) {
    return m->lin.bits == 4 || m->lin.bits == 8;
}

/* x as the integer dots see it: per group of g, d * round(x / d) with d = max|x| / 32767. */
static double *quantized_x(const float *x, int64_t n, int64_t in, int g) {
    double *xq = malloc((size_t)(n * in) * sizeof(double));
    for (int64_t g0 = 0; g0 < n * in; g0 += g) {
        double amax = 0;
        for (int i = 0; i < g; i++) amax = fmax(amax, fabs((double)x[g0 + i]));
        double d = amax / XQ_CODES;
        for (int i = 0; i < g; i++) xq[g0 + i] = d > 0 ? d * round(x[g0 + i] / d) : 0.0;
    }
    return xq;
}

/* ref[r][o] = x[r] . W[o] (+ bias) in double. With xd, xd replaces x in the s q part of each
 * w = s q + b, and x stays in the b part: the integer dots take the bias term from the sums
 * of x itself. */
static void reference(const mat *m, const float *x, const double *xd, int64_t n, bool with_bias,
                      float *ref) {
    int64_t in = m->lin.in, out = m->lin.out;
    for (int64_t r = 0; r < n; r++) {
        for (int64_t o = 0; o < out; o++) {
            double acc = with_bias ? m->biasd[o] : 0.0;
            for (int64_t k = 0; k < in; k++) {
                double w = m->wd[o * in + k], xk = x[r * in + k];
                if (!xd) {
                    acc += w * xk;
                    continue;
                }
                double b = m->bd[o * (in / m->lin.group_size) + k / m->lin.group_size];
                acc += (w - b) * xd[r * in + k] + b * xk;
            }
            ref[r * out + o] = (float)acc;
        }
    }
}

/* Runs x [n, in] through every backend, with and without the bias, against the reference. */
static void check_matmul(tu_backends *bk, mat *m, int64_t n, const char *what) {
    int64_t in = m->lin.in, out = m->lin.out;
    float *x = tu_randf((size_t)(n * in), -1, 1);
    float *ref = malloc((size_t)(n * out) * sizeof(float));
    float *refq = malloc((size_t)(n * out) * sizeof(float));
    float *y = malloc((size_t)(n * out) * sizeof(float));
    double *xq = uses_idot(m) ? quantized_x(x, n, in, m->lin.group_size) : NULL;
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        reference(m, x, NULL, n, with_bias, ref);
        if (xq) reference(m, x, xq, n, with_bias, refq);
        be_linear lin = m->lin;
        lin.bias = with_bias ? m->bias : NULL;
        for (int i = 0; i < bk->n; i++) {
            for (int64_t j = 0; j < n * out; j++) y[j] = NAN;
            be_tensor xt = {x, BASE_DTYPE_F32, n, in}, yt = {y, BASE_DTYPE_F32, n, out};
            base_err err = {{0}};
            int rc = bk->be[i]->ops->matmul(bk->be[i], &xt, &lin, &yt, &err);
            double e = test_rel_err(y, ref, (size_t)(n * out));
            double tol = xq ? TOL_XQ : TOL;
            CHECK_MSG(rc == 0 && e < tol, "%s n=%lld bias=%d on %s: rc %d err %.3g (%s)", what,
                      (long long)n, with_bias, bk->label[i], rc, e, err.msg);
            if (!xq) continue;
            double eq = test_rel_err(y, refq, (size_t)(n * out));
            CHECK_MSG(eq < TOL, "%s n=%lld bias=%d on %s: err %.3g against the quantized x", what,
                      (long long)n, with_bias, bk->label[i], eq);
        }
    }
    free(x);
    free(xq);
    free(ref);
    free(refq);
    free(y);
}

/* Row r of 8 computed alone and among the 8 gives the same bits, on every backend, and every
 * backend (instruction set and thread count) gives the bits of the first, the portable
 * kernels at one thread. */
static void check_batch_invariance(tu_backends *bk, mat *m, const char *what) {
    enum { N = 8 };
    int64_t in = m->lin.in, out = m->lin.out;
    float *x = tu_randf((size_t)(N * in), -1, 1);
    float *all = malloc((size_t)(N * out) * sizeof(float));
    float *one = malloc((size_t)out * sizeof(float));
    float *first = malloc((size_t)(N * out) * sizeof(float));
    for (int i = 0; i < bk->n; i++) {
        base_err err = {{0}};
        be_backend *be = bk->be[i];
        be_tensor xt = {x, BASE_DTYPE_F32, N, in}, yt = {all, BASE_DTYPE_F32, N, out};
        CHECK(be->ops->matmul(be, &xt, &m->lin, &yt, &err) == 0);
        for (int64_t r = 0; r < N; r++) {
            be_tensor xr = {x + r * in, BASE_DTYPE_F32, 1, in}, yr = {one, BASE_DTYPE_F32, 1, out};
            CHECK(be->ops->matmul(be, &xr, &m->lin, &yr, &err) == 0);
            CHECK_MSG(memcmp(one, all + r * out, (size_t)out * sizeof(float)) == 0,
                      "%s on %s: row %lld alone differs from the same row among %d", what,
                      bk->label[i], (long long)r, N);
        }
        if (i == 0) {
            memcpy(first, all, (size_t)(N * out) * sizeof(float));
        } else {
            CHECK_MSG(memcmp(first, all, (size_t)(N * out) * sizeof(float)) == 0,
                      "%s on %s: differs from %s", what, bk->label[i], bk->label[0]);
        }
    }
    free(x);
    free(all);
    free(one);
    free(first);
}

/* The linear repacked as at load (by the first backend: every instruction set reads the same
 * layout) gives each backend exactly the bits of the linear's own layout (read row by row
 * below 4 rows of x, packed a chunk at a time per call from 4), with and without the bias, at
 * row counts below, at and past the blocks of 4, 8 and 32 rows; then the packed copy passes
 * the reference and batch-invariance checks the original does. */
static void check_packed(tu_backends *bk, mat *m, const char *what) {
    static const int64_t ns[] = {1, 2, 3, 4, 5, 9, 17, 37};
    be_backend *owner = bk->be[0];
    be_linear p = m->lin;
    base_err err = {{0}};
    CHECK_MSG(owner->ops->pack_linear(owner, &p, &err) == 0 && p.packed, "%s: pack_linear: %s",
              what, err.msg);
    if (!p.packed) return;
    char pwhat[80];
    snprintf(pwhat, sizeof pwhat, "%s packed", what);
    int64_t in = m->lin.in, out = m->lin.out;
    for (int ni = 0; ni < 8; ni++) {
        int64_t n = ns[ni];
        float *x = tu_randf((size_t)(n * in), -1, 1);
        float *y0 = malloc((size_t)(n * out) * sizeof(float));
        float *y1 = malloc((size_t)(n * out) * sizeof(float));
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            be_linear u = m->lin;
            u.bias = p.bias = with_bias ? m->bias : NULL;
            for (int i = 0; i < bk->n; i++) {
                be_backend *be = bk->be[i];
                be_tensor xt = {x, BASE_DTYPE_F32, n, in};
                be_tensor yt0 = {y0, BASE_DTYPE_F32, n, out}, yt1 = {y1, BASE_DTYPE_F32, n, out};
                CHECK(be->ops->matmul(be, &xt, &u, &yt0, &err) == 0);
                CHECK(be->ops->matmul(be, &xt, &p, &yt1, &err) == 0);
                CHECK_MSG(memcmp(y0, y1, (size_t)(n * out) * sizeof(float)) == 0,
                          "%s n=%lld bias=%d on %s: differs from the unpacked layout", pwhat,
                          (long long)n, with_bias, bk->label[i]);
            }
        }
        free(x);
        free(y0);
        free(y1);
    }
    mat mp = *m;
    mp.lin.packed = p.packed;
    check_matmul(bk, &mp, 5, pwhat);
    check_batch_invariance(bk, &mp, pwhat);
    owner->ops->free(owner, (void *)p.packed);
}

/* pack_linear repacks only what the integer dots read: other widths and dense weights keep
 * packed NULL (their kernels read the linear's own layout). */
static void test_pack_skips(tu_backends *bk) {
    be_backend *be = bk->be[0];
    static const int bits[] = {0, 2, 3, 5, 6};
    for (int bi = 0; bi < 5; bi++) {
        mat m;
        if (bits[bi]) {
            mat_quant(&m, 9, 128, bits[bi], 64, BASE_DTYPE_BF16);
        } else {
            mat_dense(&m, 9, 128, BASE_DTYPE_BF16);
        }
        base_err err = {{0}};
        be_linear p = m.lin;
        CHECK(be->ops->pack_linear(be, &p, &err) == 0);
        CHECK_MSG(p.packed == NULL, "bits %d: packed", bits[bi]);
        mat_free(&m);
    }
}

/* The integer dots at odd row counts, below, at and past their blocks of 4, 8 and 32 rows of
 * x, on 45 weight rows (a tile of 16 left partial). */
static void test_integer_dots(tu_backends *bk) {
    static const int bits[] = {4, 8};
    static const int groups[] = {32, 64, 128};
    static const int64_t ns[] = {2, 5, 9, 13, 17, 37};
    for (int bi = 0; bi < 2; bi++) {
        for (int gi = 0; gi < 3; gi++) {
            mat m;
            mat_quant(&m, 45, 1152, bits[bi], groups[gi], BASE_DTYPE_BF16);
            char what[64];
            snprintf(what, sizeof what, "idot q%d g%d", bits[bi], groups[gi]);
            for (int ni = 0; ni < 6; ni++) check_matmul(bk, &m, ns[ni], what);
            check_batch_invariance(bk, &m, what);
            check_packed(bk, &m, what);
            mat_free(&m);
        }
    }
}

static void test_quantized(tu_backends *bk) {
    static const int bits[] = {2, 3, 4, 5, 6, 8};
    static const int groups[] = {32, 64, 128};
    static const base_dtype sdts[] = {BASE_DTYPE_F32, BASE_DTYPE_F16, BASE_DTYPE_BF16};
    static const int64_t ns[] = {1, 3, 7, 64};
    for (int bi = 0; bi < 6; bi++) {
        for (int gi = 0; gi < 3; gi++) {
            for (int si = 0; si < 3; si++) {
                mat m;
                /* in = 640: one full 512-column tile and a 128-column tail */
                mat_quant(&m, 37, 640, bits[bi], groups[gi], sdts[si]);
                char what[64];
                snprintf(what, sizeof what, "q%d g%d %s", bits[bi], groups[gi],
                         base_dtype_name(sdts[si]));
                for (int ni = 0; ni < 4; ni++) check_matmul(bk, &m, ns[ni], what);
                mat_free(&m);
            }
        }
    }
}

/* More than one chunk of converted scales per row (128 groups) and many K tiles. */
static void test_quantized_long_rows(tu_backends *bk) {
    static const int bits[] = {3, 4, 8};
    for (int bi = 0; bi < 3; bi++) {
        mat m;
        mat_quant(&m, 19, 4096, bits[bi], 32, BASE_DTYPE_BF16);
        check_matmul(bk, &m, 1, "long row");
        check_matmul(bk, &m, 5, "long row");
        if (uses_idot(&m)) check_packed(bk, &m, "long row");
        mat_free(&m);
    }
}

static void test_dense(tu_backends *bk) {
    static const base_dtype dts[] = {BASE_DTYPE_F32, BASE_DTYPE_F16, BASE_DTYPE_BF16};
    static const int64_t ins[] = {203, 1100};
    static const int64_t ns[] = {1, 3, 7, 64};
    for (int di = 0; di < 3; di++) {
        for (int ii = 0; ii < 2; ii++) {
            mat m;
            mat_dense(&m, 37, ins[ii], dts[di]);
            char what[64];
            snprintf(what, sizeof what, "dense %s in=%lld", base_dtype_name(dts[di]),
                     (long long)ins[ii]);
            for (int ni = 0; ni < 4; ni++) check_matmul(bk, &m, ns[ni], what);
            mat_free(&m);
        }
    }
}

/* Each bad argument fails with a message naming it, and leaves y alone. */
static void expect_fail(be_backend *be, const be_tensor *x, const be_linear *w, be_tensor *y,
                        const char *needle) {
    base_err err = {{0}};
    float *yd = y->data;
    float before = yd ? yd[0] : 0.0f;
    int rc = be->ops->matmul(be, x, w, y, &err);
    CHECK_MSG(rc == -1 && strstr(err.msg, needle), "expected failure naming '%s', got rc %d '%s'",
              needle, rc, err.msg);
    if (yd) CHECK(yd[0] == before);
}

static void test_errors(be_backend *be) {
    mat m;
    mat_quant(&m, 8, 64, 4, 32, BASE_DTYPE_F16);
    float x[2 * 64] = {0}, y[2 * 8] = {1.5f};
    be_tensor xt = {x, BASE_DTYPE_F32, 2, 64}, yt = {y, BASE_DTYPE_F32, 2, 8};
    be_linear w = m.lin;

    be_tensor bad = xt;
    bad.dtype = BASE_DTYPE_BF16;
    expect_fail(be, &bad, &w, &yt, "BF16");
    bad = xt;
    bad.cols = 63;
    expect_fail(be, &bad, &w, &yt, "63 columns");
    bad = yt;
    bad.cols = 9;
    expect_fail(be, &xt, &w, &bad, "y is [2, 9]");
    bad = yt;
    bad.rows = 3;
    expect_fail(be, &xt, &w, &bad, "y is [3, 8]");

    be_linear bw = w;
    bw.bits = 7;
    expect_fail(be, &xt, &bw, &yt, "bits 7");
    bw = w;
    bw.group_size = 16;
    expect_fail(be, &xt, &bw, &yt, "group size 16");
    bw = w;
    bw.group_size = 128;
    expect_fail(be, &xt, &bw, &yt, "not a multiple");
    bw = w;
    bw.scales = NULL;
    expect_fail(be, &xt, &bw, &yt, "scales");
    bw = w;
    bw.dtype = BASE_DTYPE_I32;
    expect_fail(be, &xt, &bw, &yt, "I32");
    bw = w;
    bw.bias = m.bias;
    bw.bias_dtype = BASE_DTYPE_U8;
    expect_fail(be, &xt, &bw, &yt, "bias dtype U8");
    bw = w;
    bw.weight = NULL;
    expect_fail(be, &xt, &bw, &yt, "weight");
    bw = w;
    bw.bits = 0;
    bw.dtype = BASE_DTYPE_I8;
    expect_fail(be, &xt, &bw, &yt, "I8");
    mat_free(&m);
}

int main(void) {
    tu_backends bk;
    tu_backends_open(&bk);
    CHECK(bk.n >= 2);
    test_quantized(&bk);
    test_quantized_long_rows(&bk);
    test_integer_dots(&bk);
    test_pack_skips(&bk);
    test_dense(&bk);
    if (bk.n) test_errors(bk.be[bk.n - 1]);
    tu_backends_close(&bk);
    TEST_MAIN_END();
}
