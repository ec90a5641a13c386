/* CPU backend ops but matmul against scalar double references (rmsnorm, add, glu, scale, softcap,
 * rope, argmax, embedding), the memory ops, creation, and argument errors; on every instruction set
 * this CPU has, with 1 and 3 threads. */
#include "cpu_test_util.h"

#include <math.h>

#define TOL 1e-5

static const int64_t row_counts[] = {1, 7, 64};

static void test_create(void) {
    base_err err = {{0}};
    be_backend *be = NULL;
    CHECK(be_cpu_create(0, &be, &err) == 0);
    if (be) {
        CHECK(strcmp(be->name, "cpu") == 0);
        CHECK(be->act_dtype == BASE_DTYPE_F32);
        CHECK(be->n_threads == base_cpu_count());
        CHECK(be->target_parallelism == be->n_threads);
        be_destroy(be);
    }
    be_destroy(NULL);
    setenv("MLXCEL_CPU_ISA", "sse9", 1);
    be = NULL;
    CHECK(be_cpu_create(1, &be, &err) == -1 && be == NULL);
    CHECK_MSG(strstr(err.msg, "MLXCEL_CPU_ISA=sse9") != NULL, "%s", err.msg);
    unsetenv("MLXCEL_CPU_ISA");
#ifndef MLXCEL_HAVE_CUDA
    CHECK(be_cuda_create(0, &be, &err) == -1 && be == NULL);
    CHECK_MSG(strstr(err.msg, "without CUDA") != NULL, "%s", err.msg);
#endif
}

static void test_memory(be_backend *be) {
    base_err err = {{0}};
    void *a = NULL, *b = NULL;
    CHECK(be->ops->alloc(be, 1000, &a, &err) == 0 && ((uintptr_t)a % 64) == 0);
    CHECK(be->ops->alloc(be, 1000, &b, &err) == 0 && ((uintptr_t)b % 64) == 0);
    uint8_t src[1000], back[1000];
    for (int i = 0; i < 1000; i++) src[i] = (uint8_t)(tu_next() | 1);
    CHECK(be->ops->upload(be, a, src, sizeof src, &err) == 0);
    CHECK(be->ops->copy(be, b, a, sizeof src, &err) == 0);
    CHECK(be->ops->download(be, back, b, sizeof back, &err) == 0);
    CHECK(memcmp(src, back, sizeof src) == 0);
    CHECK(be->ops->sync(be, &err) == 0);
    const void *dev = NULL;
    CHECK(be->ops->map_weights(be, src, sizeof src, &dev, &err) == 0 && dev == src);
    be->ops->free(be, a);
    be->ops->free(be, b);
    /* read_sum: every word once, whatever the thread count; a word count that no thread count
     * here divides leaves the last thread a longer slice and a tail shorter than 8 */
    CHECK(be->ceiling == BE_CEILING_READ);
    enum { n_words = 1003 };
    uint64_t words[n_words], want = 0, sum = 1;
    for (int i = 0; i < n_words; i++) want += words[i] = tu_next();
    CHECK(be->ops->read_sum(be, words, sizeof words, &sum, &err) == 0 && sum == want);
    CHECK(be->ops->read_sum(be, words, 0, &sum, &err) == 0 && sum == 0);
    CHECK(be->ops->read_sum(be, words, 12, &sum, &err) == -1 && strstr(err.msg, "8-byte words"));
    CHECK(be->ops->read_sum(be, (char *)words + 4, 8, &sum, &err) == -1 &&
          strstr(err.msg, "aligned"));
    uint64_t free_b = 0, total_b = 0;
    CHECK(be->ops->memory_info(be, &free_b, &total_b) == 0);
    CHECK(total_b > (1ull << 20) && free_b > 0 && free_b <= total_b);
}

static void test_rmsnorm(tu_backends *bk) {
    static const base_dtype wdts[] = {BASE_DTYPE_F32, BASE_DTYPE_F16, BASE_DTYPE_BF16};
    /* [n, 203] rows, and the per-head view [n * 4, 64] */
    static const int64_t cols_list[] = {203, 64};
    const float eps = 1e-5f;
    for (int ci = 0; ci < 2; ci++) {
        for (int ni = 0; ni < 3; ni++) {
            int64_t cols = cols_list[ci], rows = row_counts[ni] * (ci ? 4 : 1);
            size_t n = (size_t)(rows * cols);
            float *x = tu_randf(n, -3, 3), *ref = malloc(n * sizeof(float));
            float *y = malloc(n * sizeof(float));
            /* even rows small enough that eps matters */
            for (int64_t r = 0; r < rows; r += 2) {
                for (int64_t i = 0; i < cols; i++) x[r * cols + i] *= 0.003f;
            }
            for (int di = 0; di < 3; di++) {
                uint16_t wbuf[2 * 203];
                double wd[203];
                for (int64_t i = 0; i < cols; i++) {
                    wd[i] = tu_store_round(wbuf, wdts[di], (size_t)i, tu_uniform(0.5f, 1.5f));
                }
                for (int64_t r = 0; r < rows; r++) {
                    double ss = 0;
                    for (int64_t i = 0; i < cols; i++)
                        ss += (double)x[r * cols + i] * x[r * cols + i];
                    double inv = 1.0 / sqrt(ss / cols + eps);
                    for (int64_t i = 0; i < cols; i++) {
                        ref[r * cols + i] = (float)(x[r * cols + i] * inv * wd[i]);
                    }
                }
                be_tensor wt = {wbuf, wdts[di], 1, cols};
                for (int b = 0; b < bk->n; b++) {
                    be_backend *be = bk->be[b];
                    base_err err = {{0}};
                    be_tensor xt = {x, BASE_DTYPE_F32, rows, cols},
                              yt = {y, BASE_DTYPE_F32, rows, cols};
                    int rc = be->ops->rmsnorm(be, &xt, &wt, eps, &yt, &err);
                    double e = test_rel_err(y, ref, n);
                    CHECK_MSG(rc == 0 && e < TOL, "rmsnorm %s [%lld, %lld] on %s: err %.3g %s",
                              base_dtype_name(wdts[di]), (long long)rows, (long long)cols,
                              bk->label[b], e, err.msg);
                    /* in place: y aliases x */
                    memcpy(y, x, n * sizeof(float));
                    be_tensor io = {y, BASE_DTYPE_F32, rows, cols};
                    rc = be->ops->rmsnorm(be, &io, &wt, eps, &io, &err);
                    CHECK(rc == 0 && test_rel_err(y, ref, n) < TOL);
                }
            }
            free(x);
            free(ref);
            free(y);
        }
    }
}

static void test_add_silu(tu_backends *bk) {
    for (int ni = 0; ni < 3; ni++) {
        int64_t rows = row_counts[ni], cols = 1031; /* 64 rows span several pool chunks */
        size_t n = (size_t)(rows * cols);
        float *a = tu_randf(n, -8, 8), *b = tu_randf(n, -2, 2);
        float *sum = malloc(n * sizeof(float)), *prod = malloc(n * sizeof(float));
        float *y = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) {
            sum[i] = (float)((double)a[i] + b[i]);
            prod[i] = (float)(a[i] / (1.0 + exp(-(double)a[i])) * b[i]);
        }
        be_tensor at = {a, BASE_DTYPE_F32, rows, cols}, bt = {b, BASE_DTYPE_F32, rows, cols};
        be_tensor yt = {y, BASE_DTYPE_F32, rows, cols};
        for (int k = 0; k < bk->n; k++) {
            be_backend *be = bk->be[k];
            base_err err = {{0}};
            CHECK(be->ops->add(be, &at, &bt, &yt, &err) == 0);
            CHECK_MSG(test_rel_err(y, sum, n) < TOL, "add on %s", bk->label[k]);
            CHECK(be->ops->glu(be, BE_ACT_SILU, &at, &bt, &yt, &err) == 0);
            CHECK_MSG(test_rel_err(y, prod, n) < TOL, "silu_mul on %s", bk->label[k]);
            /* y aliasing an input */
            memcpy(y, a, n * sizeof(float));
            CHECK(be->ops->glu(be, BE_ACT_SILU, &yt, &bt, &yt, &err) == 0);
            CHECK(test_rel_err(y, prod, n) < TOL);
            memcpy(y, b, n * sizeof(float));
            CHECK(be->ops->add(be, &at, &yt, &yt, &err) == 0);
            CHECK(test_rel_err(y, sum, n) < TOL);
        }
        free(a);
        free(b);
        free(sum);
        free(prod);
        free(y);
    }
}

/* gelu_pytorch_tanh times up, scale and softcap against double references. */
static void test_gelu_scale_softcap(tu_backends *bk) {
    int64_t rows = 7, cols = 3001; /* several pool chunks */
    size_t n = (size_t)(rows * cols);
    float *a = tu_randf(n, -8, 8), *b = tu_randf(n, -2, 2);
    float *gelu = malloc(n * sizeof(float)), *scaled = malloc(n * sizeof(float));
    float *capped = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        double g = a[i];
        gelu[i] = (float)(0.5 * g * (1 + tanh(sqrt(2 / M_PI) * (g + 0.044715 * g * g * g))) * b[i]);
        scaled[i] = (float)(g * 0.22);
        capped[i] = (float)(tanh(g / 5.0) * 5.0);
    }
    be_tensor at = {a, BASE_DTYPE_F32, rows, cols}, bt = {b, BASE_DTYPE_F32, rows, cols};
    be_tensor yt = {y, BASE_DTYPE_F32, rows, cols};
    for (int k = 0; k < bk->n; k++) {
        be_backend *be = bk->be[k];
        base_err err = {{0}};
        CHECK(be->ops->glu(be, BE_ACT_GELU_TANH, &at, &bt, &yt, &err) == 0);
        CHECK_MSG(test_rel_err(y, gelu, n) < TOL, "gelu_tanh on %s", bk->label[k]);
        CHECK(be->ops->scale(be, &at, 0.22f, &yt, &err) == 0);
        CHECK_MSG(test_rel_err(y, scaled, n) < TOL, "scale on %s", bk->label[k]);
        memcpy(y, a, n * sizeof(float));
        CHECK(be->ops->softcap(be, &yt, 5.0f, &yt, &err) == 0);
        CHECK_MSG(test_rel_err(y, capped, n) < TOL, "softcap on %s", bk->label[k]);
        CHECK(be->ops->softcap(be, &at, 0.0f, &yt, &err) == -1 && strstr(err.msg, "cap 0"));
        CHECK(be->ops->glu(be, (be_act)9, &at, &bt, &yt, &err) == -1 &&
              strstr(err.msg, "activation 9"));
    }
    free(a);
    free(b);
    free(gelu);
    free(scaled);
    free(capped);
    free(y);
}

static void test_rope_dims(tu_backends *bk, int half);

/* Whole heads, and the first 48 of 64 dims (partial_rotary_factor 0.75: the pairs are (i,
 * i + 24), the last 16 dims unchanged). */
static void test_rope(tu_backends *bk) {
    for (int half = 32; half >= 24; half -= 8) test_rope_dims(bk, half);
}

static void test_rope_dims(tu_backends *bk, int half) {
    const int n_heads = 3, head_dim = 64;
    const int64_t cols = n_heads * head_dim;
    float inv_freq[32];
    for (int i = 0; i < half; i++) inv_freq[i] = (float)pow(500000.0, -1.0 * i / half);
    static const float mscales[] = {1.0f, 1.2f};
    for (int ni = 0; ni < 3; ni++) {
        int64_t rows = row_counts[ni];
        size_t n = (size_t)(rows * cols);
        int32_t *pos = malloc((size_t)rows * sizeof(int32_t));
        /* positions up to 131072, where an f32 angle would be visibly wrong */
        for (int64_t r = 0; r < rows; r++) {
            pos[r] = r == 0 ? 131071 : (int32_t)(tu_next() % 131073);
        }
        float *x = tu_randf(n, -2, 2), *ref = malloc(n * sizeof(float));
        float *y = malloc(n * sizeof(float));
        for (int mi = 0; mi < 2; mi++) {
            for (int64_t r = 0; r < rows; r++) {
                for (int h = 0; h < n_heads; h++) {
                    const float *xh = x + r * cols + h * head_dim;
                    float *rh = ref + r * cols + h * head_dim;
                    for (int i = 2 * half; i < head_dim; i++) rh[i] = xh[i];
                    for (int i = 0; i < half; i++) {
                        double a = (double)pos[r] * inv_freq[i];
                        double c = cos(a) * mscales[mi], s = sin(a) * mscales[mi];
                        rh[i] = (float)(xh[i] * c - xh[i + half] * s);
                        rh[i + half] = (float)(xh[i + half] * c + xh[i] * s);
                    }
                }
            }
            be_tensor pt = {pos, BASE_DTYPE_I32, rows, 1}, ft = {inv_freq, BASE_DTYPE_F32, 1, half};
            be_tensor yt = {y, BASE_DTYPE_F32, rows, cols};
            for (int k = 0; k < bk->n; k++) {
                be_backend *be = bk->be[k];
                base_err err = {{0}};
                memcpy(y, x, n * sizeof(float));
                int rc = be->ops->rope(be, &yt, n_heads, head_dim, &pt, &ft, mscales[mi], &err);
                double e = test_rel_err(y, ref, n);
                CHECK_MSG(rc == 0 && e < TOL,
                          "rope rows %lld mscale %g rotary %d on %s: err %.3g %s", (long long)rows,
                          (double)mscales[mi], 2 * half, bk->label[k], e, err.msg);
            }
        }
        free(pos);
        free(x);
        free(ref);
        free(y);
    }
}

static void test_argmax(tu_backends *bk) {
    for (int ni = 0; ni < 3; ni++) {
        int64_t rows = row_counts[ni], cols = 1000;
        float *l = tu_randf((size_t)(rows * cols), -5, 5);
        int32_t *want = malloc((size_t)rows * sizeof(int32_t));
        int32_t *got = malloc((size_t)rows * sizeof(int32_t));
        for (int64_t r = 0; r < rows; r++) {
            float *row = l + r * cols;
            /* a tie: the first of two equal maxima wins */
            int64_t a = (int64_t)(tu_next() % (uint64_t)cols),
                    b = (int64_t)(tu_next() % (uint64_t)cols);
            row[a] = row[b] = 9.0f;
            want[r] = (int32_t)(a < b ? a : b);
            if (r == 1) row[0] = NAN;
        }
        be_tensor lt = {l, BASE_DTYPE_F32, rows, cols}, it = {got, BASE_DTYPE_I32, rows, 1};
        for (int k = 0; k < bk->n; k++) {
            base_err err = {{0}};
            memset(got, 0xff, (size_t)rows * sizeof(int32_t));
            CHECK(bk->be[k]->ops->argmax(bk->be[k], &lt, &it, &err) == 0);
            CHECK_MSG(memcmp(got, want, (size_t)rows * sizeof(int32_t)) == 0,
                      "argmax rows %lld on %s", (long long)rows, bk->label[k]);
        }
        free(l);
        free(want);
        free(got);
    }
}

/* One embedding table, dense or quantized, against its dequantized rows. */
static void check_embedding(tu_backends *bk, int bits, int g, base_dtype dt) {
    const int64_t vocab = 50, dim = 256, n = 7;
    be_linear t = {.out = vocab, .in = dim, .bits = bits, .group_size = g, .dtype = dt};
    double *td = malloc((size_t)(vocab * dim) * sizeof(double));
    void *w, *s = NULL, *b = NULL;
    if (bits) {
        size_t rb = (size_t)(dim * bits / 8), ng = (size_t)(dim / g);
        w = calloc((size_t)vocab, rb);
        s = calloc((size_t)vocab * ng, base_dtype_size(dt));
        b = calloc((size_t)vocab * ng, base_dtype_size(dt));
        for (int64_t v = 0; v < vocab; v++) {
            for (size_t gi = 0; gi < ng; gi++) {
                double sv = tu_store_round(s, dt, (size_t)v * ng + gi, tu_uniform(-0.1f, 0.1f));
                double bv = tu_store_round(b, dt, (size_t)v * ng + gi, tu_uniform(-1, 1));
                for (int j = 0; j < g; j++) {
                    unsigned q = (unsigned)(tu_next() % (1u << bits));
                    tu_pack((uint8_t *)w + v * rb, bits, (int64_t)gi * g + j, q);
                    td[v * dim + (int64_t)gi * g + j] = sv * q + bv;
                }
            }
        }
    } else {
        w = calloc((size_t)(vocab * dim), base_dtype_size(dt));
        for (int64_t i = 0; i < vocab * dim; i++)
            td[i] = tu_store_round(w, dt, (size_t)i, tu_uniform(-1, 1));
    }
    t.weight = w;
    t.scales = s;
    t.biases = b;
    int32_t ids[7] = {3, 0, 49, 17, 17, 8, 31};
    float ref[7 * 256], y[7 * 256];
    for (int64_t i = 0; i < n; i++) {
        for (int64_t c = 0; c < dim; c++) ref[i * dim + c] = (float)td[ids[i] * dim + c];
    }
    be_tensor it = {ids, BASE_DTYPE_I32, n, 1}, yt = {y, BASE_DTYPE_F32, n, dim};
    for (int k = 0; k < bk->n; k++) {
        base_err err = {{0}};
        int rc = bk->be[k]->ops->embedding(bk->be[k], &t, &it, &yt, &err);
        double e = test_rel_err(y, ref, (size_t)(n * dim));
        CHECK_MSG(rc == 0 && e < TOL, "embedding q%d g%d %s on %s: err %.3g %s", bits, g,
                  base_dtype_name(dt), bk->label[k], e, err.msg);
    }
    free(td);
    free(w);
    free(s);
    free(b);
}

static void test_embedding(tu_backends *bk) {
    static const int bits[] = {2, 3, 4, 5, 6, 8};
    static const int groups[] = {32, 64, 128};
    static const base_dtype dts[] = {BASE_DTYPE_F32, BASE_DTYPE_F16, BASE_DTYPE_BF16};
    for (int di = 0; di < 3; di++) {
        check_embedding(bk, 0, 0, dts[di]);
        for (int bi = 0; bi < 6; bi++) {
            for (int gi = 0; gi < 3; gi++) check_embedding(bk, bits[bi], groups[gi], dts[di]);
        }
    }
}

#define EXPECT_FAIL(call, needle)                                                                  \
    do {                                                                                           \
        base_err err_ = {{0}};                                                                     \
        int rc_ = (call);                                                                          \
        CHECK_MSG(rc_ == -1 && strstr(err_.msg, needle), "%s: rc %d '%s'", #call, rc_, err_.msg);  \
    } while (0)

static void test_errors(be_backend *be) {
    float x[4 * 8] = {1}, y[4 * 8] = {0}, w[8] = {1};
    int32_t ids[4] = {0, 1, 2, 3}, pos[4] = {0};
    be_tensor xt = {x, BASE_DTYPE_F32, 4, 8}, yt = {y, BASE_DTYPE_F32, 4, 8};
    be_tensor wt = {w, BASE_DTYPE_F32, 1, 8}, it = {ids, BASE_DTYPE_I32, 4, 1};
    be_tensor xb = {x, BASE_DTYPE_BF16, 4, 8}, y7 = {y, BASE_DTYPE_F32, 4, 7};
    be_tensor w7 = {w, BASE_DTYPE_F32, 1, 7}, wi = {w, BASE_DTYPE_I32, 1, 8};

    EXPECT_FAIL(be->ops->rmsnorm(be, &xb, &wt, 1e-5f, &yt, &err_), "x has dtype BF16");
    EXPECT_FAIL(be->ops->rmsnorm(be, &xt, &w7, 1e-5f, &yt, &err_), "weight is [1, 7]");
    EXPECT_FAIL(be->ops->rmsnorm(be, &xt, &wi, 1e-5f, &yt, &err_), "weight dtype I32");
    EXPECT_FAIL(be->ops->rmsnorm(be, &xt, &wt, 1e-5f, &y7, &err_), "y is [4, 7]");
    EXPECT_FAIL(be->ops->add(be, &xt, &y7, &yt, &err_), "second input is [4, 7]");
    EXPECT_FAIL(be->ops->add(be, &xb, &xt, &yt, &err_), "dtype BF16");
    EXPECT_FAIL(be->ops->glu(be, BE_ACT_SILU, &xt, &xt, &y7, &err_), "output is [4, 7]");

    float f[2] = {1, 0.5f};
    be_tensor ft = {f, BASE_DTYPE_F32, 1, 2}, pt = {pos, BASE_DTYPE_I32, 4, 1};
    be_tensor pf = {pos, BASE_DTYPE_F32, 4, 1}, p3 = {pos, BASE_DTYPE_I32, 3, 1};
    EXPECT_FAIL(be->ops->rope(be, &xt, 2, 4, &pf, &ft, 1.0f, &err_), "positions has dtype F32");
    EXPECT_FAIL(be->ops->rope(be, &xt, 2, 4, &p3, &ft, 1.0f, &err_), "positions is [3, 1]");
    EXPECT_FAIL(be->ops->rope(be, &xt, 3, 4, &pt, &ft, 1.0f, &err_), "x has 8 columns");
    EXPECT_FAIL(be->ops->rope(be, &xt, 8, 1, &pt, &ft, 1.0f, &err_), "head_dim 1");
    EXPECT_FAIL(be->ops->rope(be, &xt, 4, 2, &pt, &ft, 1.0f, &err_), "inv_freq is [1, 2]");

    be_tensor l8 = {x, BASE_DTYPE_F32, 4, 8}, i3 = {ids, BASE_DTYPE_I32, 3, 1};
    EXPECT_FAIL(be->ops->argmax(be, &l8, &i3, &err_), "ids is [3, 1]");
    EXPECT_FAIL(be->ops->argmax(be, &l8, &xt, &err_), "ids has dtype F32");

    be_linear table = {.out = 3, .in = 8, .dtype = BASE_DTYPE_F32, .weight = x};
    EXPECT_FAIL(be->ops->embedding(be, &table, &it, &yt, &err_), "id 3 at row 3");
    ids[3] = -1;
    EXPECT_FAIL(be->ops->embedding(be, &table, &it, &yt, &err_), "id -1 at row 3");
    ids[3] = 2;
    EXPECT_FAIL(be->ops->embedding(be, &table, &it, &y7, &err_), "out is [4, 7]");
    EXPECT_FAIL(be->ops->embedding(be, &table, &xt, &yt, &err_), "ids has dtype F32");
    table.bits = 4;
    table.group_size = 32;
    EXPECT_FAIL(be->ops->embedding(be, &table, &it, &yt, &err_), "not a multiple");
}

int main(void) {
    test_create();
    tu_backends bk;
    tu_backends_open(&bk);
    CHECK(bk.n >= 2);
    for (int i = 0; i < bk.n; i++) test_memory(bk.be[i]);
    test_rmsnorm(&bk);
    test_add_silu(&bk);
    test_gelu_scale_softcap(&bk);
    test_rope(&bk);
    test_argmax(&bk);
    test_embedding(&bk);
    if (bk.n) test_errors(bk.be[0]);
    tu_backends_close(&bk);
    TEST_MAIN_END();
}
