/* The CUDA backend's row, elementwise and matmul ops against double-precision references
 * written here, and its fused ops against the CPU backend's plain ops composed, by normalized
 * error; skipped when no CUDA device is present. */
#include "test_cuda_util.h"

#include <math.h>

static const base_dtype act_types[] = {BASE_DTYPE_F32, BASE_DTYPE_F16, BASE_DTYPE_BF16};

/* The GLU activations in double precision. */
static double act_ref(be_act act, double x) {
    if (act == BE_ACT_GELU_TANH)
        return 0.5 * x *
               (1.0 + tanh(0.7978845608028654 /* sqrt(2 / pi) */ * (x + 0.044715 * x * x * x)));
    return x / (1.0 + exp(-x));
}

/* 300 columns, and 9000: past the values a thread keeps in registers. */
static void test_rmsnorm(be_backend *be) {
    for (int a = 0; a < 6; a++) {
        base_dtype dt = act_types[a % 3];
        int rows = 5, cols = a < 3 ? 300 : 9000;
        float *x = malloc(sizeof(float) * rows * cols), *w = malloc(sizeof(float) * cols);
        tc_fill(x, (size_t)rows * cols, 3.0f);
        tc_fill(w, cols, 1.0f);
        tc_round(x, (size_t)rows * cols, dt);
        tc_round(w, cols, BASE_DTYPE_BF16);
        double *ref = malloc(sizeof(double) * rows * cols);
        for (int r = 0; r < rows; r++) {
            double ss = 0;
            for (int c = 0; c < cols; c++) ss += (double)x[r * cols + c] * x[r * cols + c];
            double inv = 1.0 / sqrt(ss / cols + 1e-5);
            for (int c = 0; c < cols; c++) ref[r * cols + c] = x[r * cols + c] * inv * w[c];
        }
        be_tensor tx = tc_tensor(be, x, dt, rows, cols);
        be_tensor tw = tc_tensor(be, w, BASE_DTYPE_BF16, 1, cols);
        be_tensor ty = tc_poisoned(be, dt, rows, cols);
        base_err err = {{0}};
        CHECK_MSG(be->ops->rmsnorm(be, &tx, &tw, 1e-5f, &ty, &err) == 0, "%s", err.msg);
        double e = tc_err(be, &ty, ref);
        CHECK_MSG(e < tc_tol(dt), "rmsnorm %s err %g", base_dtype_name(dt), e);
        /* y may alias x */
        CHECK(be->ops->rmsnorm(be, &tx, &tw, 1e-5f, &tx, &err) == 0);
        e = tc_err(be, &tx, ref);
        CHECK_MSG(e < tc_tol(dt), "rmsnorm in place %s err %g", base_dtype_name(dt), e);
        be->ops->free(be, tx.data);
        be->ops->free(be, tw.data);
        be->ops->free(be, ty.data);
        free(x), free(w);
        free(ref);
    }
}

static void test_binary(be_backend *be) {
    for (int a = 0; a < 3; a++) {
        base_dtype dt = act_types[a];
        int n = 1000;
        float x[1000], y[1000];
        double add[1000], sm[1000], gl[1000], sc[1000], cap[1000];
        tc_fill(x, n, 6.0f);
        tc_fill(y, n, 2.0f);
        tc_round(x, n, dt);
        tc_round(y, n, dt);
        for (int i = 0; i < n; i++) {
            add[i] = (double)x[i] + y[i];
            sm[i] = act_ref(BE_ACT_SILU, x[i]) * y[i];
            gl[i] = act_ref(BE_ACT_GELU_TANH, x[i]) * y[i];
            sc[i] = x[i] * (double)-0.37f;
            cap[i] = 2.5 * tanh(x[i] / 2.5);
        }
        be_tensor tx = tc_tensor(be, x, dt, 4, 250), ty = tc_tensor(be, y, dt, 4, 250);
        be_tensor to = tc_poisoned(be, dt, 4, 250);
        base_err err = {{0}};
        CHECK(be->ops->add(be, &tx, &ty, &to, &err) == 0);
        double e = tc_err(be, &to, add);
        CHECK_MSG(e < tc_tol(dt), "add %s err %g", base_dtype_name(dt), e);
        CHECK(be->ops->glu(be, BE_ACT_SILU, &tx, &ty, &to, &err) == 0);
        e = tc_err(be, &to, sm);
        CHECK_MSG(e < tc_tol(dt), "glu silu %s err %g", base_dtype_name(dt), e);
        CHECK(be->ops->glu(be, BE_ACT_GELU_TANH, &tx, &ty, &to, &err) == 0);
        e = tc_err(be, &to, gl);
        CHECK_MSG(e < tc_tol(dt), "glu gelu_tanh %s err %g", base_dtype_name(dt), e);
        CHECK(be->ops->scale(be, &tx, -0.37f, &to, &err) == 0);
        e = tc_err(be, &to, sc);
        CHECK_MSG(e < tc_tol(dt), "scale %s err %g", base_dtype_name(dt), e);
        CHECK(be->ops->softcap(be, &tx, 2.5f, &to, &err) == 0);
        e = tc_err(be, &to, cap);
        CHECK_MSG(e < tc_tol(dt), "softcap %s err %g", base_dtype_name(dt), e);
        /* a 16-bit input into an F32 output (logits), and y aliasing x */
        be_tensor tf = tc_poisoned(be, BASE_DTYPE_F32, 4, 250);
        CHECK(be->ops->softcap(be, &tx, 2.5f, &tf, &err) == 0);
        e = tc_err(be, &tf, cap);
        CHECK_MSG(e < 1e-5, "softcap %s into F32 err %g", base_dtype_name(dt), e);
        CHECK(be->ops->softcap(be, &tf, 2.5f, &tf, &err) == 0);
        for (int i = 0; i < n; i++) cap[i] = 2.5 * tanh(cap[i] / 2.5);
        e = tc_err(be, &tf, cap);
        CHECK_MSG(e < 1e-5, "softcap in place %s err %g", base_dtype_name(dt), e);
        CHECK(be->ops->softcap(be, &tx, 0.0f, &to, &err) == -1 && strstr(err.msg, "softcap"));
        be->ops->free(be, tf.data);
        be_tensor bad = {ty.data, dt, 5, 200};
        CHECK(be->ops->add(be, &tx, &bad, &to, &err) == -1 && strstr(err.msg, "add"));
        be->ops->free(be, tx.data);
        be->ops->free(be, ty.data);
        be->ops->free(be, to.data);
    }
}

/* Whole-head rotation, and partial rotary embeddings (the first 2 * half of 64 dims: 16 and
 * 26, the rest unchanged); a table wider than half the head fails. */
static void test_rope(be_backend *be) {
    int n = 3, heads = 4, hd = 64;
    const int halves[] = {32, 8, 13};
    int32_t pos[3] = {0, 7, 4000};
    float inv[32], x[3 * 4 * 64];
    for (int hv = 0; hv < 3; hv++) {
        const int half = halves[hv];
        for (int i = 0; i < half; i++) inv[i] = (float)pow(10000.0, -1.0 * i / half);
        for (int a = 0; a < 3; a++) {
            base_dtype dt = act_types[a];
            tc_fill(x, sizeof x / sizeof x[0], 2.0f);
            tc_round(x, sizeof x / sizeof x[0], dt);
            double ref[3 * 4 * 64];
            for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) ref[i] = x[i];
            float ms = 1.25f;
            for (int t = 0; t < n; t++)
                for (int h = 0; h < heads; h++)
                    for (int i = 0; i < half; i++) {
                        int b = (t * heads + h) * hd;
                        double ang = (double)((float)pos[t] * inv[i]);
                        double c = cos(ang) * ms, s = sin(ang) * ms;
                        ref[b + i] = x[b + i] * c - x[b + i + half] * s;
                        ref[b + i + half] = x[b + i + half] * c + x[b + i] * s;
                    }
            be_tensor tx = tc_tensor(be, x, dt, n, heads * hd);
            be_tensor tf = tc_tensor(be, inv, BASE_DTYPE_F32, 1, half);
            be_tensor tp = {tc_dev_bytes(be, pos, sizeof pos), BASE_DTYPE_I32, n, 1};
            base_err err = {{0}};
            CHECK_MSG(be->ops->rope(be, &tx, heads, hd, &tp, &tf, ms, &err) == 0, "%s", err.msg);
            double e = tc_err(be, &tx, ref);
            CHECK_MSG(e < tc_tol(dt) + 1e-5, "rope %s rotary %d err %g", base_dtype_name(dt),
                      2 * half, e);
            be->ops->free(be, tx.data);
            be->ops->free(be, tf.data);
            be->ops->free(be, tp.data);
        }
    }
    float wide[33] = {0};
    be_tensor tx = tc_poisoned(be, BASE_DTYPE_F32, 1, 64);
    be_tensor tf = tc_tensor(be, wide, BASE_DTYPE_F32, 1, 33);
    int32_t p0 = 0;
    be_tensor tp = {tc_dev_bytes(be, &p0, sizeof p0), BASE_DTYPE_I32, 1, 1};
    base_err err = {{0}};
    CHECK(be->ops->rope(be, &tx, 1, 64, &tp, &tf, 1.0f, &err) == -1 && strstr(err.msg, "inv_freq"));
    be->ops->free(be, tx.data);
    be->ops->free(be, tf.data);
    be->ops->free(be, tp.data);
}

static void test_argmax(be_backend *be) {
    int rows = 3, cols = 5000;
    float *x = malloc(sizeof(float) * rows * cols);
    tc_fill(x, (size_t)rows * cols, 1.0f);
    int32_t want[3] = {4321, 17, 4999};
    x[0 * cols + 4321] = 5.0f;
    x[1 * cols + 17] = 5.0f;
    x[1 * cols + 3000] = 5.0f; /* a tie goes to the lower index */
    x[2 * cols + 4999] = 5.0f;
    x[2 * cols + 10] = NAN; /* NaN never wins */
    for (int a = 0; a < 3; a++) {
        be_tensor tx = tc_tensor(be, x, act_types[a], rows, cols);
        be_tensor ti = {NULL, BASE_DTYPE_I32, rows, 1};
        base_err err = {{0}};
        CHECK(be->ops->alloc(be, sizeof want, &ti.data, &err) == 0);
        CHECK(be->ops->argmax(be, &tx, &ti, &err) == 0);
        int32_t got[3] = {-1, -1, -1};
        CHECK(be->ops->sync(be, &err) == 0);
        CHECK(be->ops->download(be, got, ti.data, sizeof got, &err) == 0);
        for (int r = 0; r < rows; r++)
            CHECK_MSG(got[r] == want[r], "argmax %s row %d: %d", base_dtype_name(act_types[a]), r,
                      got[r]);
        be->ops->free(be, tx.data);
        be->ops->free(be, ti.data);
    }
    free(x);
}

/* Value k of a little-endian bit stream of `bits`-bit values, read bit by bit. */
static uint32_t stream_value(const uint8_t *bytes, int64_t k, int bits) {
    uint32_t v = 0;
    for (int b = 0; b < bits; b++) {
        int64_t bit = k * bits + b;
        v |= (uint32_t)((bytes[bit / 8] >> (bit % 8)) & 1) << b;
    }
    return v;
}

/* A random quantized (bits > 0) or dense linear layer in host memory, its dequantized
 * weights in *wf (out x in), and a device copy in *dev. */
typedef struct host_linear {
    be_linear host, dev;
    float *wf;
    void *bufs[4];
} host_linear;

static void make_linear(be_backend *be, host_linear *L, int64_t out, int64_t in, int bits,
                        int group, base_dtype dt, bool bias) {
    memset(L, 0, sizeof *L);
    be_linear *h = &L->host;
    h->out = out, h->in = in, h->bits = bits, h->group_size = group, h->dtype = dt;
    L->wf = malloc(sizeof(float) * out * in);
    base_err err = {{0}};
    size_t wbytes;
    if (bits == 0) {
        wbytes = (size_t)(out * in) * base_dtype_size(dt);
        void *w = malloc(wbytes);
        for (int64_t i = 0; i < out * in; i++) {
            base_store_float(w, dt, (size_t)i, tc_uniform());
            L->wf[i] = base_load_float(w, dt, (size_t)i);
        }
        h->weight = w;
    } else {
        wbytes = (size_t)(out * in * bits / 8);
        uint8_t *w = malloc(wbytes);
        for (size_t i = 0; i < wbytes; i++) w[i] = (uint8_t)tc_u32();
        int64_t ng = in / group;
        void *s = malloc((size_t)(out * ng) * base_dtype_size(dt));
        void *b = malloc((size_t)(out * ng) * base_dtype_size(dt));
        for (int64_t i = 0; i < out * ng; i++) {
            base_store_float(s, dt, (size_t)i, 0.05f * tc_uniform());
            base_store_float(b, dt, (size_t)i, 0.1f * tc_uniform());
        }
        for (int64_t o = 0; o < out; o++)
            for (int64_t i = 0; i < in; i++) {
                size_t g = (size_t)(o * ng + i / group);
                L->wf[o * in + i] = base_load_float(s, dt, g) *
                                        (float)stream_value(w + o * in * bits / 8, i, bits) +
                                    base_load_float(b, dt, g);
            }
        h->weight = w, h->scales = s, h->biases = b;
        CHECK(be->ops->map_weights(be, s, (size_t)(out * ng) * base_dtype_size(dt), &L->dev.scales,
                                   &err) == 0);
        CHECK(be->ops->map_weights(be, b, (size_t)(out * ng) * base_dtype_size(dt), &L->dev.biases,
                                   &err) == 0);
    }
    L->dev = (be_linear){.out = out,
                         .in = in,
                         .bits = bits,
                         .group_size = group,
                         .dtype = dt,
                         .scales = L->dev.scales,
                         .biases = L->dev.biases};
    CHECK(be->ops->map_weights(be, h->weight, wbytes, &L->dev.weight, &err) == 0);
    if (bias) {
        float *bb = malloc(sizeof(float) * out);
        tc_fill(bb, (size_t)out, 1.0f);
        h->bias = bb;
        h->bias_dtype = BASE_DTYPE_F32;
        CHECK(be->ops->map_weights(be, bb, sizeof(float) * out, &L->dev.bias, &err) == 0);
        L->dev.bias_dtype = BASE_DTYPE_F32;
    }
    /* The batched kernels read the packed copy, as a loaded model's linears have it. */
    if (bits && be->ops->pack_linear) {
        CHECK(be->ops->pack_linear(be, &L->dev, &err) == 0);
        CHECK((L->dev.packed != NULL) == ((bits == 4 || bits == 8) && (in * bits) % 256 == 0));
    }
}

static void free_linear(be_backend *be, host_linear *L) {
    be->ops->free(be, (void *)L->dev.weight);
    be->ops->free(be, (void *)L->dev.scales);
    be->ops->free(be, (void *)L->dev.biases);
    be->ops->free(be, (void *)L->dev.bias);
    be->ops->free(be, (void *)L->dev.packed);
    free((void *)L->host.weight);
    free((void *)L->host.scales);
    free((void *)L->host.biases);
    free((void *)L->host.bias);
    free(L->wf);
}

static void check_matmul(be_backend *be, host_linear *L, int n, base_dtype x_dt, base_dtype y_dt,
                         const char *what) {
    int64_t in = L->host.in, out = L->host.out;
    float *x = malloc(sizeof(float) * n * in);
    tc_fill(x, (size_t)(n * in), 1.0f);
    tc_round(x, (size_t)(n * in), x_dt);
    double *ref = malloc(sizeof(double) * n * out);
    const float *bias = L->host.bias;
    for (int r = 0; r < n; r++)
        for (int64_t o = 0; o < out; o++) {
            double s = bias ? bias[o] : 0.0;
            for (int64_t i = 0; i < in; i++) s += (double)x[r * in + i] * L->wf[o * in + i];
            ref[r * out + o] = s;
        }
    be_tensor tx = tc_tensor(be, x, x_dt, n, in);
    be_tensor ty = tc_poisoned(be, y_dt, n, out);
    base_err err = {{0}};
    CHECK_MSG(be->ops->matmul(be, &tx, &L->dev, &ty, &err) == 0, "%s: %s", what, err.msg);
    double e = tc_err(be, &ty, ref);
    /* From 64 rows the backend multiplies on the tensor cores with W and x rounded to BF16,
     * unless both are F32. */
    double tol = tc_tol(y_dt) * (y_dt == BASE_DTYPE_F32 ? 10 : 1);
    bool f32_gemm = L->host.bits == 0 && L->host.dtype == BASE_DTYPE_F32 && x_dt == BASE_DTYPE_F32;
    if (n >= 64 && !f32_gemm) tol = tc_tol(BASE_DTYPE_BF16);
    CHECK_MSG(e < tol, "%s n=%d x %s y %s: err %g", what, n, base_dtype_name(x_dt),
              base_dtype_name(y_dt), e);
    be->ops->free(be, tx.data);
    be->ops->free(be, ty.data);
    free(x);
    free(ref);
}

static void test_matmul_dense(be_backend *be) {
    for (int w = 0; w < 3; w++) {
        host_linear L;
        make_linear(be, &L, 37, 200, 0, 0, act_types[w], w == 1);
        char what[64];
        snprintf(what, sizeof what, "dense %s", base_dtype_name(act_types[w]));
        int ns[] = {1, 3, 16, 21, 70};
        for (int i = 0; i < 5; i++)
            check_matmul(be, &L, ns[i], BASE_DTYPE_BF16, BASE_DTYPE_F32, what);
        check_matmul(be, &L, 66, BASE_DTYPE_BF16, BASE_DTYPE_BF16, what);
        check_matmul(be, &L, 72, BASE_DTYPE_F32, BASE_DTYPE_F32, what);
        check_matmul(be, &L, 2, BASE_DTYPE_F32, BASE_DTYPE_BF16, what);
        check_matmul(be, &L, 5, BASE_DTYPE_F16, BASE_DTYPE_F16, what);
        free_linear(be, &L);
    }
}

static void test_matmul_quant(be_backend *be) {
    const int bits[] = {2, 3, 4, 5, 6, 8}, groups[] = {32, 64, 128};
    for (int b = 0; b < 6; b++)
        for (int g = 0; g < 3; g++) {
            host_linear L;
            base_dtype sdt = (b + g) % 2 ? BASE_DTYPE_F16 : BASE_DTYPE_BF16;
            /* in = 384 is three 128-value groups: units cross no group, rows are not powers
             * of two, and out = 19 leaves a partial warp of output rows. */
            make_linear(be, &L, 19, 384, bits[b], groups[g], sdt, g == 1);
            char what[64];
            snprintf(what, sizeof what, "q%d g%d", bits[b], groups[g]);
            int ns[] = {1, 4, 7, 16, 19, 80};
            for (int i = 0; i < 6; i++)
                check_matmul(be, &L, ns[i], BASE_DTYPE_BF16, BASE_DTYPE_F32, what);
            check_matmul(be, &L, 3, BASE_DTYPE_F32, BASE_DTYPE_BF16, what);
            check_matmul(be, &L, 65, BASE_DTYPE_F32, BASE_DTYPE_F32, what);
            free_linear(be, &L);
        }
    /* Rejected, not crashed: a group size MLX never writes. */
    host_linear L;
    make_linear(be, &L, 4, 96, 4, 32, BASE_DTYPE_BF16, false);
    L.dev.group_size = 48;
    float x[96] = {0};
    be_tensor tx = tc_tensor(be, x, BASE_DTYPE_BF16, 1, 96),
              ty = tc_poisoned(be, BASE_DTYPE_F32, 1, 4);
    base_err err = {{0}};
    CHECK(be->ops->matmul(be, &tx, &L.dev, &ty, &err) == -1 && strstr(err.msg, "group size"));
    be->ops->free(be, tx.data);
    be->ops->free(be, ty.data);
    free_linear(be, &L);
}

static void test_embedding(be_backend *be) {
    int32_t ids[4] = {5, 0, 18, 5};
    for (int q = 0; q < 3; q++) {
        host_linear L;
        int bits = q == 0 ? 0 : (q == 1 ? 4 : 3);
        make_linear(be, &L, 19, 128, bits, 64, BASE_DTYPE_BF16, false);
        double ref[4 * 128];
        for (int r = 0; r < 4; r++)
            for (int c = 0; c < 128; c++) ref[r * 128 + c] = L.wf[ids[r] * 128 + c];
        be_tensor ti = {tc_dev_bytes(be, ids, sizeof ids), BASE_DTYPE_I32, 4, 1};
        be_tensor to = tc_poisoned(be, BASE_DTYPE_F32, 4, 128);
        base_err err = {{0}};
        CHECK_MSG(be->ops->embedding(be, &L.dev, &ti, &to, &err) == 0, "%s", err.msg);
        double e = tc_err(be, &to, ref);
        CHECK_MSG(e < 1e-6, "embedding bits %d err %g", bits, e);
        be->ops->free(be, ti.data);
        be->ops->free(be, to.data);
        free_linear(be, &L);
    }
}

static void test_kv_append(be_backend *be) {
    int nkv = 2, hd = 64, bs = 16, nblocks = 5, n = 3;
    int64_t width = nkv * hd, slots[3] = {4 * 16 + 15, 0, 2 * 16 + 7};
    float k[3 * 128], v[3 * 128];
    tc_fill(k, sizeof k / sizeof k[0], 1.0f);
    tc_fill(v, sizeof v / sizeof v[0], 1.0f);
    size_t pool_elems = (size_t)nblocks * bs * width;
    for (int d = 0; d < 2; d++) {
        base_dtype pdt = d ? BASE_DTYPE_BF16 : BASE_DTYPE_F16;
        size_t bytes = pool_elems * 2;
        uint8_t *init = malloc(bytes);
        memset(init, 0x3c, bytes);
        be_kv_layer layer = {tc_dev_bytes(be, init, bytes),
                             tc_dev_bytes(be, init, bytes),
                             pdt,
                             nblocks,
                             bs,
                             nkv,
                             hd};
        be_paged_batch batch = {.n_tokens = n, .slots = tc_dev_bytes(be, slots, sizeof slots)};
        be_tensor tk = tc_tensor(be, k, BASE_DTYPE_BF16, n, width);
        be_tensor tv = tc_tensor(be, v, BASE_DTYPE_F32, n, width);
        base_err err = {{0}};
        CHECK_MSG(be->ops->kv_append(be, &layer, &tk, &tv, &batch, &err) == 0, "%s", err.msg);
        uint8_t *gk = malloc(bytes), *gv = malloc(bytes);
        CHECK(be->ops->sync(be, &err) == 0);
        CHECK(be->ops->download(be, gk, layer.k, bytes, &err) == 0);
        CHECK(be->ops->download(be, gv, layer.v, bytes, &err) == 0);
        /* Expected pool: init everywhere, the rows at the slots replaced. */
        uint8_t *wk = malloc(bytes), *wv = malloc(bytes);
        memcpy(wk, init, bytes);
        memcpy(wv, init, bytes);
        float kr[3 * 128];
        memcpy(kr, k, sizeof kr);
        tc_round(kr, 3 * 128, BASE_DTYPE_BF16);
        for (int t = 0; t < n; t++)
            for (int e = 0; e < width; e++) {
                base_store_float(wk, pdt, (size_t)(slots[t] * width + e), kr[t * width + e]);
                base_store_float(wv, pdt, (size_t)(slots[t] * width + e), v[t * width + e]);
            }
        CHECK_MSG(memcmp(gk, wk, bytes) == 0, "kv_append k %s", base_dtype_name(pdt));
        CHECK_MSG(memcmp(gv, wv, bytes) == 0, "kv_append v %s", base_dtype_name(pdt));
        be->ops->free(be, layer.k);
        be->ops->free(be, layer.v);
        be->ops->free(be, (void *)batch.slots);
        be->ops->free(be, tk.data);
        be->ops->free(be, tv.data);
        free(init), free(gk), free(gv), free(wk), free(wv);
    }
}

/* ---- the GEMVs and the fused ops, against an exact matmul and the CPU backend's other ops ---- */

static be_backend *cpu;

/* y = x W^T (+ bias) summed in double over W's values as the backends dequantize them (s q + b
 * in F32): the reference the GEMVs are held to. Not the CPU backend's matmul: for 4 and 8 bits
 * it rounds x to int16 codes a group (a relative 2^-16 of the group's largest |x|), which
 * alone exceeds the 1e-5 the GEMVs are allowed at one and two rows. */
static void ref_matmul(const float *x, int n, const be_linear *w, float *y) {
    const int64_t in = w->in, ng = w->bits ? in / w->group_size : 0;
    float *row = malloc(sizeof(float) * (size_t)in);
    for (int64_t o = 0; o < w->out; o++) {
        const uint8_t *codes = (const uint8_t *)w->weight + o * in * w->bits / 8;
        for (int64_t k = 0; k < in; k++) {
            const size_t g = (size_t)(o * ng + (w->bits ? k / w->group_size : 0));
            row[k] = w->bits ? base_load_float(w->scales, w->dtype, g) *
                                       (float)stream_value(codes, k, w->bits) +
                                   base_load_float(w->biases, w->dtype, g)
                             : base_load_float(w->weight, w->dtype, (size_t)(o * in + k));
        }
        for (int r = 0; r < n; r++) {
            double acc = w->bias ? base_load_float(w->bias, w->bias_dtype, (size_t)o) : 0.0;
            for (int64_t k = 0; k < in; k++) acc += (double)x[r * in + k] * row[k];
            y[r * w->out + o] = (float)acc;
        }
    }
    free(row);
}

/* Normalized error of a device tensor against a float reference. */
static double dev_err(be_backend *be, const be_tensor *t, const float *ref) {
    size_t n = (size_t)(t->rows * t->cols);
    float *got = tc_read(be, t);
    double e = test_rel_err(got, ref, n);
    free(got);
    return e;
}

static float *rand_rows(int n, int64_t in) {
    float *x = malloc(sizeof(float) * (size_t)(n * in));
    tc_fill(x, (size_t)(n * in), 1.0f);
    return x;
}

/* Rows of x from which the tensor-core GEMV serves a product (CUDA_GEMV_MMA_ROWS); the one-row
 * GEMV below them keeps x exact in integer digits. */
#define MMA_ROWS 3

/* Rows of x for which the quantized GEMM serves a product (CUDA_QGEMM_MIN_ROWS to
 * CUDA_QGEMM_MAX_ROWS), for 8-bit weights and 4-bit ones in groups of 64 or 128. */
#define QGEMM_MIN_ROWS 33
#define QGEMM_MAX_ROWS 128
static bool qgemm_serves(const be_linear *h, int n) {
    return n >= QGEMM_MIN_ROWS && n <= QGEMM_MAX_ROWS &&
           (h->bits == 8 || (h->bits == 4 && h->group_size >= 64)) && (h->in * h->bits) % 256 == 0;
}

/* The quantized GEMM rounds x' as the tensor-core GEMV does (f16x_dev below) and each weight
 * w = s q + b to F16 after its scale and bias went to F16: w moves by at most 2^-11 (|w| +
 * |s q| + |b|) (2^-25 more where it is subnormal), so a product w x moves by at most 2^-11
 * |x| (2 |w| + |s q| + |b|) + 2^-24 |x|, plus x''s floor of 2^-39 m_r against |w|, per output
 * summed over k. Returns that bound per output, (n, out); the caller frees it. */
static double *f16wx_dev(const host_linear *L, const float *x, int n) {
    const be_linear *h = &L->host;
    const int64_t in = h->in, out = h->out, ng = in / h->group_size;
    double *d = malloc(sizeof(double) * (size_t)(n * out)), *a = malloc(sizeof(double) * in),
           *aw = malloc(sizeof(double) * in);
    for (int64_t o = 0; o < out; o++) {
        const uint8_t *w = (const uint8_t *)h->weight + o * in * h->bits / 8;
        for (int64_t k = 0; k < in; k++) {
            const size_t gi = (size_t)(o * ng + k / h->group_size);
            const double sq =
                fabs(base_load_float(h->scales, h->dtype, gi)) * stream_value(w, k, h->bits);
            const double b = fabs(base_load_float(h->biases, h->dtype, gi));
            aw[k] = fabs((double)L->wf[o * in + k]);
            a[k] = ldexp(2 * aw[k] + sq + b, -11) + ldexp(1.0, -24);
        }
        for (int r = 0; r < n; r++) {
            double e = 0, sw = 0, m = 0;
            for (int64_t k = 0; k < in; k++) {
                const double v = fabs((double)x[r * in + k]);
                e += a[k] * v, sw += aw[k], m = v > m ? v : m;
            }
            d[r * out + o] = e + ldexp(m * sw, -39);
        }
    }
    free(a), free(aw);
    return d;
}

/* The tensor-core GEMV rounds x' (each row of x scaled by a power of two so
 * that its largest |x'| lies in [2^14, 2^15)) to one F16 term instead of two: by at most
 * 2^-11 |x'| where x' is a normal F16 and 2^-25 where it is subnormal, which scaled back is at
 * most 2^-39 of the row's largest |x|, m_r (2^-e <= m_r 2^-14). The products with the quantized
 * values q are exact and each group's bias meets the unrounded sum of x', so output o of row r
 * moves by at most 2^-11 sum_k |s_k q_k x_k| + 2^-39 m_r sum_k |s_k q_k|. Returns that bound
 * per output, (n, out); the caller frees it. */
static double *f16x_dev(const host_linear *L, const float *x, int n) {
    const be_linear *h = &L->host;
    const int64_t in = h->in, out = h->out, ng = in / h->group_size;
    if (qgemm_serves(h, n)) return f16wx_dev(L, x, n);
    double *d = malloc(sizeof(double) * (size_t)(n * out)), *sq = malloc(sizeof(double) * in);
    for (int64_t o = 0; o < out; o++) {
        const uint8_t *w = (const uint8_t *)h->weight + o * in * h->bits / 8;
        for (int64_t k = 0; k < in; k++)
            sq[k] =
                fabs(base_load_float(h->scales, h->dtype, (size_t)(o * ng + k / h->group_size))) *
                stream_value(w, k, h->bits);
        for (int r = 0; r < n; r++) {
            double a = 0, s = 0, m = 0;
            for (int64_t k = 0; k < in; k++) {
                const double v = fabs((double)x[r * in + k]);
                a += sq[k] * v, s += sq[k], m = v > m ? v : m;
            }
            d[r * out + o] = ldexp(a, -11) + ldexp(m * s, -39);
        }
    }
    free(sq);
    return d;
}

/* The normalized error (test_rel_err's) allowed against ref (len values): 1e-5 for the F32
 * sums, plus what the deviations d (f16x_dev's, or NULL: none) add. */
static double f16x_tol(const double *d, const float *ref, size_t len) {
    if (!d) return 1e-5;
    double num = 0, den = 0;
    for (size_t i = 0; i < len; i++) num += d[i] * d[i], den += (double)ref[i] * ref[i];
    return 1e-5 + (den > 0 ? sqrt(num / den) : sqrt(num));
}

/* f16x_tol of n rows of x against L's outputs ref: the F32 allowance alone below MMA_ROWS. */
static double gemv_tol(const host_linear *L, const float *x, int n, const float *ref) {
    if (n < MMA_ROWS) return 1e-5;
    double *d = f16x_dev(L, x, n);
    const double t = f16x_tol(d, ref, (size_t)(n * L->host.out));
    free(d);
    return t;
}

/* f16x_tol of y = silu(x G^T) * (x U^T) from the products g and u: silu's slope is under 1.1
 * in magnitude, so y moves by at most 1.1 dg (|u| + du) + |silu(g)| du. */
static double glu_tol(const host_linear *G, const host_linear *U, const float *x, int n,
                      const float *g, const float *u, be_act act) {
    if (n < MMA_ROWS) return 1e-5;
    const size_t len = (size_t)(n * G->host.out);
    double *dg = f16x_dev(G, x, n), *du = f16x_dev(U, x, n);
    float *y = malloc(sizeof(float) * len);
    /* the activation's slope stays below 1.1 (SiLU) and 1.13 (GELU-tanh) */
    const double slope = act == BE_ACT_GELU_TANH ? 1.13 : 1.1;
    for (size_t i = 0; i < len; i++) {
        const double sg = act_ref(act, g[i]);
        y[i] = (float)(sg * u[i]);
        dg[i] = slope * dg[i] * (fabs(u[i]) + du[i]) + fabs(sg) * du[i];
    }
    const double t = f16x_tol(dg, y, len);
    free(dg), free(du), free(y);
    return t;
}

/* 1 to 16 F32 rows, the decode case: every bit width and group, odd row counts, rows of x
 * past the ones a pass holds, and enough output rows that CTAs take several steps; 4 and 8
 * bits from MMA_ROWS rows within the tensor-core GEMV's bound. */
static void test_gemv_rows(be_backend *be) {
    const int bits[] = {2, 3, 4, 5, 6, 8}, groups[] = {32, 64, 128}, ns[] = {1, 2, 5, 16};
    struct {
        int64_t out, in;
    } sizes[] = {{19, 384}, {5003, 256}};
    for (int b = 0; b < 6; b++)
        for (int g = 0; g < 3; g++)
            for (int z = 0; z < 2; z++) {
                host_linear L;
                base_dtype sdt = (b + g + z) % 2 ? BASE_DTYPE_F16 : BASE_DTYPE_BF16;
                make_linear(be, &L, sizes[z].out, sizes[z].in, bits[b], groups[g], sdt, g == 1);
                for (int k = 0; k < 4; k++) {
                    int n = ns[k];
                    float *x = rand_rows(n, L.host.in);
                    float *ref = malloc(sizeof(float) * (size_t)(n * L.host.out));
                    ref_matmul(x, n, &L.host, ref);
                    be_tensor tx = tc_tensor(be, x, BASE_DTYPE_F32, n, L.host.in);
                    be_tensor ty = tc_poisoned(be, BASE_DTYPE_F32, n, L.host.out);
                    base_err err = {{0}};
                    CHECK_MSG(be->ops->matmul(be, &tx, &L.dev, &ty, &err) == 0, "%s", err.msg);
                    double e = dev_err(be, &ty, ref);
                    const bool mma = bits[b] == 4 || bits[b] == 8;
                    const double tol = mma ? gemv_tol(&L, x, n, ref) : 1e-5;
                    CHECK_MSG(e < tol, "q%d g%d [%lld x %lld] n=%d: err %g", bits[b], groups[g],
                              (long long)L.host.out, (long long)L.host.in, n, e);
                    be->ops->free(be, tx.data);
                    be->ops->free(be, ty.data);
                    free(x), free(ref);
                }
                free_linear(be, &L);
            }
    /* Long rows, one and two at a time: up to 32768 4-bit and 16384 8-bit values, the most
     * whose digits two rows of x keep in shared memory; 14336 and 7168 are 7 chunks of 64
     * units, 9216 and 4608 four and a half; BF16 output. */
    const int64_t ins[2][3] = {{9216, 14336, 32768}, {4608, 7168, 16384}};
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < 3; i++)
            for (int n = 1; n <= 2; n++) {
                host_linear L;
                make_linear(be, &L, 21, ins[b][i], b ? 8 : 4, 64, BASE_DTYPE_BF16, i == 1);
                float *x = rand_rows(n, L.host.in), ref[2 * 21];
                ref_matmul(x, n, &L.host, ref);
                tc_round(ref, (size_t)(n * 21), BASE_DTYPE_BF16);
                be_tensor tx = tc_tensor(be, x, BASE_DTYPE_F32, n, L.host.in);
                be_tensor ty = tc_poisoned(be, BASE_DTYPE_BF16, n, 21);
                base_err err = {{0}};
                CHECK_MSG(be->ops->matmul(be, &tx, &L.dev, &ty, &err) == 0, "%s", err.msg);
                double e = dev_err(be, &ty, ref);
                CHECK_MSG(e < 4e-3, "long rows q%d in %lld n=%d: err %g", b ? 8 : 4,
                          (long long)L.host.in, n, e);
                be->ops->free(be, tx.data);
                be->ops->free(be, ty.data);
                free(x);
                free_linear(be, &L);
            }
}

/* Rows of x whose ranges differ by tens of orders of magnitude, each row checked on its own so
 * that a row the others dwarf still counts: 1e5, 1e-20, 1e4 and 1e-4 alternating within the
 * row, unit, and all zero; every 4- and 8-bit group, scales in F32, F16 and BF16, row counts
 * that split n-tiles unevenly, and an out that is no multiple of 16. */
/* Value i of a row of kind 0 (scaled by 1e5), 1 (1e-20) or 2 (1e4 and 1e-4 alternating). */
static void scale_ranged(float *v, int kind, int64_t i) {
    static const float scale[] = {1e5f, 1e-20f};
    *v *= kind < 2 ? scale[kind] : (i % 2 ? 1e-4f : 1e4f);
}

static float *ranged_rows(int n, int64_t in) {
    float *x = rand_rows(n, in);
    for (int r = 0; r < n; r++)
        for (int64_t i = 0; i < in; i++) {
            float *v = &x[r * in + i];
            if (r % 5 < 3)
                scale_ranged(v, r % 5, i);
            else if (r == 4)
                *v = 0.0f;
        }
    return x;
}

static void test_gemv_ranges(be_backend *be) {
    const int bits[] = {4, 8}, groups[] = {32, 64, 128}, ns[] = {3, 8, 9, 15, 16, 17, 34, 63};
    const base_dtype sdts[] = {BASE_DTYPE_F32, BASE_DTYPE_F16, BASE_DTYPE_BF16};
    const int64_t out = 37, in = 512;
    for (int b = 0; b < 2; b++)
        for (int g = 0; g < 3; g++)
            for (int d = 0; d < 3; d++) {
                host_linear L;
                make_linear(be, &L, out, in, bits[b], groups[g], sdts[d], (g + d) % 2 == 0);
                for (int k = 0; k < 8; k++) {
                    int n = ns[k];
                    float *x = ranged_rows(n, in);
                    float *ref = malloc(sizeof(float) * (size_t)(n * out));
                    ref_matmul(x, n, &L.host, ref);
                    be_tensor tx = tc_tensor(be, x, BASE_DTYPE_F32, n, in);
                    be_tensor ty = tc_poisoned(be, BASE_DTYPE_F32, n, out);
                    base_err err = {{0}};
                    CHECK_MSG(be->ops->matmul(be, &tx, &L.dev, &ty, &err) == 0, "%s", err.msg);
                    float *got = tc_read(be, &ty);
                    double *dv = n >= MMA_ROWS ? f16x_dev(&L, x, n) : NULL;
                    for (int r = 0; r < n; r++) {
                        double e = test_rel_err(got + r * out, ref + r * out, (size_t)out);
                        double tol = f16x_tol(dv ? dv + r * out : NULL, ref + r * out, (size_t)out);
                        CHECK_MSG(e < tol, "q%d g%d scales %s n=%d row %d: err %g", bits[b],
                                  groups[g], base_dtype_name(sdts[d]), n, r, e);
                    }
                    be->ops->free(be, tx.data);
                    be->ops->free(be, ty.data);
                    free(x), free(ref), free(got), free(dv);
                }
                free_linear(be, &L);
            }
}

/* Rows at the edges of the integer form the one- and two-row GEMV takes x in (per 32 or 16
 * values, a power of two above the largest |x| and three base-256 digits): 1e5, 1e-20, 1e4 and
 * 1e-4 alternating, maxima exactly at powers of two, all-zero groups, near FLT_MAX / 2^23,
 * below 2^-100 (where 2^22 over the maximum leaves the float range), one large value among
 * small ones per 128. */
enum { EDGE_ROWS = 8 };
static float *edge_rows(int64_t in) {
    float *x = rand_rows(EDGE_ROWS, in);
    for (int r = 0; r < EDGE_ROWS; r++)
        for (int64_t i = 0; i < in; i++) {
            float *v = &x[r * in + i];
            switch (r) {
            case 0:
            case 1:
            case 2:
                scale_ranged(v, r, i);
                break;
            case 3:
                *v = ldexpf(i % 16 == 3 ? (*v < 0 ? -1.0f : 1.0f) : 0.99f * *v, (int)(i / 16 % 5));
                break;
            case 4:
                if (i / 128 % 2 == 0) *v = 0.0f;
                break;
            case 5:
                *v *= 1e32f;
                break;
            case 6:
                *v *= 1e-33f;
                break;
            case 7:
                *v *= i % 128 == 77 ? 1e3f : 1e-3f;
                break;
            }
        }
    return x;
}

/* Every edge row through one-row launches, then through two-row launches in pairs. */
static void check_edges(be_backend *be, host_linear *L, const char *what) {
    const int64_t in = L->host.in, out = L->host.out;
    float *x = edge_rows(in), *ref = malloc(sizeof(float) * (size_t)(EDGE_ROWS * out));
    ref_matmul(x, EDGE_ROWS, &L->host, ref);
    for (int n = 1; n <= 2; n++)
        for (int r0 = 0; r0 + n <= EDGE_ROWS; r0 += n) {
            be_tensor tx = tc_tensor(be, x + r0 * in, BASE_DTYPE_F32, n, in);
            be_tensor ty = tc_poisoned(be, BASE_DTYPE_F32, n, out);
            base_err err = {{0}};
            CHECK_MSG(be->ops->matmul(be, &tx, &L->dev, &ty, &err) == 0, "%s", err.msg);
            float *got = tc_read(be, &ty);
            for (int r = 0; r < n; r++) {
                double e = test_rel_err(got + r * out, ref + (r0 + r) * out, (size_t)out);
                CHECK_MSG(e < 1e-5, "%s n=%d row %d: err %g", what, n, r0 + r, e);
            }
            be->ops->free(be, tx.data);
            be->ops->free(be, ty.data);
            free(got);
        }
    free(x), free(ref);
}

static void test_gemv_edges(be_backend *be) {
    const int bits[] = {4, 8}, groups[] = {32, 64, 128};
    const base_dtype sdts[] = {BASE_DTYPE_F32, BASE_DTYPE_F16, BASE_DTYPE_BF16};
    char what[64];
    for (int b = 0; b < 2; b++) {
        for (int g = 0; g < 3; g++)
            for (int d = 0; d < 3; d++) {
                host_linear L;
                make_linear(be, &L, 37, 512, bits[b], groups[g], sdts[d], (g + d) % 2 == 0);
                snprintf(what, sizeof what, "edges q%d g%d scales %s", bits[b], groups[g],
                         base_dtype_name(sdts[d]));
                check_edges(be, &L, what);
                free_linear(be, &L);
            }
        /* The MLP's down projection: 14336 values a row, several units per thread. */
        host_linear L;
        make_linear(be, &L, 21, 14336, bits[b], 64, BASE_DTYPE_BF16, b == 0);
        snprintf(what, sizeof what, "edges q%d in 14336", bits[b]);
        check_edges(be, &L, what);
        free_linear(be, &L);
    }
}

/* Q, K and V from one x: one geometry (one GEMV launch at one row), mixed bit widths and
 * groups (three matmuls), at 1, 3 and 35 rows (three slices of the fused launch), with the
 * biases qwen2 has. */
static void test_matmul_qkv(be_backend *be) {
    const int cfg[3][3][2] = {
        {{4, 64}, {4, 64}, {4, 64}}, {{8, 32}, {8, 32}, {8, 32}}, {{4, 64}, {8, 64}, {4, 32}}};
    /* q's 100 rows end inside a 16-row tile. */
    const int64_t outs[3] = {100, 36, 40}, in = 256;
    for (int c = 0; c < 3; c++)
        for (int n = 1; n <= 35; n = n == 1 ? 3 : n + 32) {
            host_linear L[3];
            be_tensor ty[3];
            float *ref[3];
            float *x = rand_rows(n, in);
            for (int i = 0; i < 3; i++) {
                make_linear(be, &L[i], outs[i], in, cfg[c][i][0], cfg[c][i][1], BASE_DTYPE_BF16,
                            c != 1);
                ref[i] = malloc(sizeof(float) * (size_t)(n * outs[i]));
                ref_matmul(x, n, &L[i].host, ref[i]);
                ty[i] = tc_poisoned(be, BASE_DTYPE_F32, n, outs[i]);
            }
            be_tensor tx = tc_tensor(be, x, BASE_DTYPE_F32, n, in);
            const be_linear *ws[3] = {&L[0].dev, &L[1].dev, &L[2].dev};
            be_tensor *ys[3] = {&ty[0], &ty[1], &ty[2]};
            base_err err = {{0}};
            CHECK_MSG(be->ops->matmul_qkv(be, &tx, NULL, ws, ys, &err) == 0, "%s", err.msg);
            for (int i = 0; i < 3; i++) {
                double e = dev_err(be, &ty[i], ref[i]);
                CHECK_MSG(e < gemv_tol(&L[i], x, n, ref[i]), "qkv config %d n=%d output %d: err %g",
                          c, n, i, e);
                be->ops->free(be, ty[i].data);
                free(ref[i]);
                free_linear(be, &L[i]);
            }
            be->ops->free(be, tx.data);
            free(x);
        }
}

/* act(x gate^T) * (x up^T), SiLU and GELU-tanh: fused at 1, 5 and 40 rows (4 and 8 bits, with
 * and without biases, an odd out), composed for mixed bit widths. */
static void test_matmul_glu(be_backend *be) {
    const int cfg[3][2] = {{4, 8}, {8, 8}, {4, 4}};
    const int64_t out = 301, in = 384;
    for (int a = 0; a < 2; a++)
        for (int c = 0; c < 3; c++)
            for (int n = 1; n <= 40; n = n == 1 ? 5 : n + 35) {
                const be_act act = a ? BE_ACT_GELU_TANH : BE_ACT_SILU;
                host_linear G, U;
                make_linear(be, &G, out, in, cfg[c][0], 64, BASE_DTYPE_F16, c == 0);
                make_linear(be, &U, out, in, cfg[c][1], 64, BASE_DTYPE_F16, c == 0);
                float *x = rand_rows(n, in);
                float *g = malloc(sizeof(float) * (size_t)(n * out));
                float *u = malloc(sizeof(float) * (size_t)(n * out));
                ref_matmul(x, n, &G.host, g);
                ref_matmul(x, n, &U.host, u);
                be_tensor tg = {g, BASE_DTYPE_F32, n, out}, tu = {u, BASE_DTYPE_F32, n, out};
                const double tol = glu_tol(&G, &U, x, n, g, u, act);
                base_err err = {{0}};
                CHECK_MSG(cpu->ops->glu(cpu, act, &tg, &tu, &tg, &err) == 0, "%s", err.msg);
                be_tensor tx = tc_tensor(be, x, BASE_DTYPE_F32, n, in);
                be_tensor ty = tc_poisoned(be, BASE_DTYPE_F32, n, out);
                CHECK_MSG(be->ops->matmul_glu(be, &tx, NULL, &G.dev, &U.dev, act, &ty, &err) == 0,
                          "%s", err.msg);
                double e = dev_err(be, &ty, g);
                CHECK_MSG(e < tol, "glu act %d config %d n=%d: err %g", a, c, n, e);
                be->ops->free(be, tx.data);
                be->ops->free(be, ty.data);
                free(x), free(g), free(u);
                free_linear(be, &G);
                free_linear(be, &U);
            }
}

/* The ops past Llama's (glu with GELU-tanh, scale, softcap, partial RoPE) against the CPU
 * backend on the same F32 inputs: rows of a 50007-token vocabulary for the logit ops, y
 * aliasing x on the device. */
static void test_vs_cpu(be_backend *be) {
    base_err err = {{0}};
    const int gr = 7;
    const int64_t gc = 1001;
    float *g = rand_rows(gr, gc), *u = rand_rows(gr, gc);
    for (int64_t i = 0; i < gr * gc; i++) g[i] *= 4.0f;
    for (int a = 0; a < 2; a++) {
        const be_act act = a ? BE_ACT_GELU_TANH : BE_ACT_SILU;
        float *ref = malloc(sizeof(float) * (size_t)(gr * gc));
        be_tensor cg = {g, BASE_DTYPE_F32, gr, gc}, cu = {u, BASE_DTYPE_F32, gr, gc};
        be_tensor cy = {ref, BASE_DTYPE_F32, gr, gc};
        CHECK_MSG(cpu->ops->glu(cpu, act, &cg, &cu, &cy, &err) == 0, "%s", err.msg);
        be_tensor tg = tc_tensor(be, g, BASE_DTYPE_F32, gr, gc);
        be_tensor tu = tc_tensor(be, u, BASE_DTYPE_F32, gr, gc);
        CHECK_MSG(be->ops->glu(be, act, &tg, &tu, &tg, &err) == 0, "%s", err.msg);
        double e = dev_err(be, &tg, ref);
        CHECK_MSG(e < 1e-5, "glu act %d against the CPU: err %g", a, e);
        be->ops->free(be, tg.data);
        be->ops->free(be, tu.data);
        free(ref);
    }
    free(g), free(u);

    const int lr = 3;
    const int64_t lc = 50007;
    float *l = rand_rows(lr, lc), *ref = malloc(sizeof(float) * (size_t)(lr * lc));
    for (int64_t i = 0; i < lr * lc; i++) l[i] *= 60.0f;
    be_tensor cl = {l, BASE_DTYPE_F32, lr, lc}, cy = {ref, BASE_DTYPE_F32, lr, lc};
    be_tensor tl = tc_tensor(be, l, BASE_DTYPE_F32, lr, lc);
    CHECK_MSG(cpu->ops->scale(cpu, &cl, 0.0883883f, &cy, &err) == 0, "%s", err.msg);
    CHECK_MSG(be->ops->scale(be, &tl, 0.0883883f, &tl, &err) == 0, "%s", err.msg);
    double e = dev_err(be, &tl, ref);
    CHECK_MSG(e < 1e-6, "scale against the CPU: err %g", e);
    be->ops->free(be, tl.data);
    tl = tc_tensor(be, l, BASE_DTYPE_F32, lr, lc);
    CHECK_MSG(cpu->ops->softcap(cpu, &cl, 30.0f, &cy, &err) == 0, "%s", err.msg);
    CHECK_MSG(be->ops->softcap(be, &tl, 30.0f, &tl, &err) == 0, "%s", err.msg);
    e = dev_err(be, &tl, ref);
    CHECK_MSG(e < 1e-5, "softcap against the CPU: err %g", e);
    be->ops->free(be, tl.data);
    free(l), free(ref);

    /* partial rotary: the first 32 of 128 dims, and 96 of 96 (the whole head, a short table) */
    const int dims[2][2] = {{128, 16}, {96, 48}};
    for (int k = 0; k < 2; k++) {
        const int hd = dims[k][0], half = dims[k][1], heads = 3, n = 5;
        /* CUDA forms the angle in F32 (cuda_rope_sincos), the CPU in double: past a few
         * thousand positions they part by more than rounding, so the cross-backend check keeps
         * to the span and the tolerance of test_rope_kv_append's; test_rope above checks long
         * positions against the F32 formula itself. */
        int32_t pos[5] = {0, 1, 100, 2500, 5000};
        float inv[64];
        for (int i = 0; i < half; i++) inv[i] = (float)pow(10000.0, -1.0 * i / half);
        float *x = rand_rows(n, (int64_t)heads * hd);
        be_tensor tx = tc_tensor(be, x, BASE_DTYPE_F32, n, (int64_t)heads * hd);
        be_tensor tf = tc_tensor(be, inv, BASE_DTYPE_F32, 1, half);
        be_tensor tp = {tc_dev_bytes(be, pos, sizeof pos), BASE_DTYPE_I32, n, 1};
        be_tensor cx = {x, BASE_DTYPE_F32, n, (int64_t)heads * hd};
        be_tensor cf = {inv, BASE_DTYPE_F32, 1, half}, cp = {pos, BASE_DTYPE_I32, n, 1};
        CHECK_MSG(cpu->ops->rope(cpu, &cx, heads, hd, &cp, &cf, 1.2f, &err) == 0, "%s", err.msg);
        CHECK_MSG(be->ops->rope(be, &tx, heads, hd, &tp, &tf, 1.2f, &err) == 0, "%s", err.msg);
        e = dev_err(be, &tx, x);
        CHECK_MSG(e < 1e-4, "rope of %d of %d dims against the CPU: err %g", 2 * half, hd, e);
        be->ops->free(be, tx.data);
        be->ops->free(be, tf.data);
        be->ops->free(be, tp.data);
        free(x);
    }
}

/* ---- RMSNorm folded before the fused matmuls, the residual add after a matmul ---- */

/* Row counts: the one-row GEMV (1, 2), the tensor-core GEMV in one pass (3 to 32) and slices
 * of 32 (33, 40, 64). */
static const int fused_rows[] = {1, 2, 3, 8, 16, 17, 33, 40, 64};
#define N_FUSED_ROWS 9

/* gemv, the GEMVs' bound, below 64 rows; from 64 the product runs on cuBLAS with W and x
 * rounded to BF16. */
static double fused_tol(int n, double gemv) {
    return n < 64 ? gemv : tc_tol(BASE_DTYPE_BF16);
}

/* Rows of different scales (row r times 1 + 3r), so that a row normed by another's 1/rms
 * shows. */
static float *scaled_rows(int n, int64_t in) {
    float *x = rand_rows(n, in);
    for (int r = 0; r < n; r++)
        for (int64_t i = 0; i < in; i++) x[r * in + i] *= 1.0f + 3.0f * (float)r;
    return x;
}

/* A norm weight around 1 as stored in dt: host values in *w, the device tensor returned. */
static be_tensor norm_weight(be_backend *be, int64_t in, base_dtype dt, float **w) {
    *w = malloc(sizeof(float) * (size_t)in);
    for (int64_t i = 0; i < in; i++) (*w)[i] = 1.0f + 0.5f * tc_uniform();
    tc_round(*w, (size_t)in, dt);
    return tc_tensor(be, *w, dt, 1, in);
}

/* rmsnorm(x) * w by the CPU backend (caller frees). */
static float *cpu_normed(const float *x, int n, int64_t in, float *w) {
    float *h = malloc(sizeof(float) * (size_t)(n * in));
    be_tensor tx = {(void *)x, BASE_DTYPE_F32, n, in}, th = {h, BASE_DTYPE_F32, n, in};
    be_tensor tw = {w, BASE_DTYPE_F32, 1, in};
    base_err err = {{0}};
    CHECK_MSG(cpu->ops->rmsnorm(cpu, &tx, &tw, 1e-5f, &th, &err) == 0, "cpu rmsnorm: %s", err.msg);
    return h;
}

/* matmul_qkv with a norm against rmsnorm then three matmuls on the CPU: one geometry with
 * biases and BF16 norm weights (folded into the GEMVs below 64 rows), and mixed geometries
 * with F32 norm weights (normed into the scratch, then three matmuls). */
static void test_qkv_norm(be_backend *be) {
    const int cfg[2][3][2] = {{{4, 64}, {4, 64}, {4, 64}}, {{4, 64}, {8, 64}, {4, 32}}};
    const int64_t outs[3] = {128, 64, 36}, in = 512;
    for (int c = 0; c < 2; c++) {
        host_linear L[3];
        for (int i = 0; i < 3; i++)
            make_linear(be, &L[i], outs[i], in, cfg[c][i][0], cfg[c][i][1], BASE_DTYPE_BF16,
                        c == 0);
        float *w;
        be_tensor tw = norm_weight(be, in, c ? BASE_DTYPE_F32 : BASE_DTYPE_BF16, &w);
        for (int k = 0; k < N_FUSED_ROWS; k++) {
            const int n = fused_rows[k];
            float *x = scaled_rows(n, in), *h = cpu_normed(x, n, in, w), *ref[3];
            be_tensor ty[3];
            for (int i = 0; i < 3; i++) {
                ref[i] = malloc(sizeof(float) * (size_t)(n * outs[i]));
                ref_matmul(h, n, &L[i].host, ref[i]);
                ty[i] = tc_poisoned(be, BASE_DTYPE_F32, n, outs[i]);
            }
            be_tensor tx = tc_tensor(be, x, BASE_DTYPE_F32, n, in);
            be_tensor scratch = tc_poisoned(be, BASE_DTYPE_F32, n, in);
            const be_norm norm = {&tw, 1e-5f, &scratch};
            const be_linear *ws[3] = {&L[0].dev, &L[1].dev, &L[2].dev};
            be_tensor *ys[3] = {&ty[0], &ty[1], &ty[2]};
            base_err err = {{0}};
            CHECK_MSG(be->ops->matmul_qkv(be, &tx, &norm, ws, ys, &err) == 0, "%s", err.msg);
            for (int i = 0; i < 3; i++) {
                double e = dev_err(be, &ty[i], ref[i]);
                CHECK_MSG(e < fused_tol(n, gemv_tol(&L[i], h, n, ref[i])),
                          "normed qkv config %d n=%d output %d: err %g", c, n, i, e);
                be->ops->free(be, ty[i].data);
                free(ref[i]);
            }
            be->ops->free(be, tx.data);
            be->ops->free(be, scratch.data);
            free(x), free(h);
        }
        for (int i = 0; i < 3; i++) free_linear(be, &L[i]);
        be->ops->free(be, tw.data);
        free(w);
    }
}

/* matmul_glu with a norm against rmsnorm, two matmuls and glu on the CPU: 4 bits with biases
 * and F16 norm weights, 8 bits with BF16 ones (both folded below 64 rows), and 4 with 8 bits
 * (normed into the scratch); SiLU at even row counts, GELU-tanh at odd ones. */
static void test_glu_norm(be_backend *be) {
    const int cfg[3][2] = {{4, 4}, {8, 8}, {4, 8}};
    const base_dtype ndt[3] = {BASE_DTYPE_F16, BASE_DTYPE_BF16, BASE_DTYPE_F32};
    const int64_t out = 301, in = 384;
    for (int c = 0; c < 3; c++) {
        host_linear G, U;
        make_linear(be, &G, out, in, cfg[c][0], 64, BASE_DTYPE_F16, c == 0);
        make_linear(be, &U, out, in, cfg[c][1], 64, BASE_DTYPE_F16, c == 0);
        float *w;
        be_tensor tw = norm_weight(be, in, ndt[c], &w);
        for (int k = 0; k < N_FUSED_ROWS; k++) {
            const int n = fused_rows[k];
            float *x = scaled_rows(n, in), *h = cpu_normed(x, n, in, w);
            float *g = malloc(sizeof(float) * (size_t)(n * out));
            float *u = malloc(sizeof(float) * (size_t)(n * out));
            ref_matmul(h, n, &G.host, g);
            ref_matmul(h, n, &U.host, u);
            be_tensor tg = {g, BASE_DTYPE_F32, n, out}, tu = {u, BASE_DTYPE_F32, n, out};
            const be_act act = n % 2 ? BE_ACT_GELU_TANH : BE_ACT_SILU;
            const double tol = fused_tol(n, glu_tol(&G, &U, h, n, g, u, act));
            base_err err = {{0}};
            CHECK(cpu->ops->glu(cpu, act, &tg, &tu, &tg, &err) == 0);
            be_tensor tx = tc_tensor(be, x, BASE_DTYPE_F32, n, in);
            be_tensor scratch = tc_poisoned(be, BASE_DTYPE_F32, n, in);
            be_tensor ty = tc_poisoned(be, BASE_DTYPE_F32, n, out);
            const be_norm norm = {&tw, 1e-5f, &scratch};
            CHECK_MSG(be->ops->matmul_glu(be, &tx, &norm, &G.dev, &U.dev, act, &ty, &err) == 0,
                      "%s", err.msg);
            double e = dev_err(be, &ty, g);
            CHECK_MSG(e < tol, "normed gate/up config %d n=%d: err %g", c, n, e);
            be->ops->free(be, tx.data);
            be->ops->free(be, scratch.data);
            be->ops->free(be, ty.data);
            free(x), free(h), free(g), free(u);
        }
        free_linear(be, &G);
        free_linear(be, &U);
        be->ops->free(be, tw.data);
        free(w);
    }
}

/* y += x W^T against matmul then add on the CPU, y starting from random values: 4 bits with a
 * bias and 8 bits (the decode GEMVs), 3 bits and dense BF16 (the CUDA-core GEMV); every path
 * takes cuBLAS at 64 rows. An output overlapping the input is refused. */
static void test_matmul_add(be_backend *be) {
    const int bits[4] = {4, 8, 3, 0}, groups[4] = {64, 32, 64, 0};
    const int64_t out = 200, in = 256;
    for (int c = 0; c < 4; c++) {
        host_linear L;
        make_linear(be, &L, out, in, bits[c], groups[c], c % 2 ? BASE_DTYPE_F16 : BASE_DTYPE_BF16,
                    c == 0);
        for (int k = 0; k < N_FUSED_ROWS; k++) {
            const int n = fused_rows[k];
            float *x = rand_rows(n, in), *y0 = rand_rows(n, out);
            float *ref = malloc(sizeof(float) * (size_t)(n * out));
            ref_matmul(x, n, &L.host, ref);
            for (int i = 0; i < n * out; i++) ref[i] = y0[i] + ref[i];
            be_tensor tx = tc_tensor(be, x, BASE_DTYPE_F32, n, in);
            be_tensor ty = tc_tensor(be, y0, BASE_DTYPE_F32, n, out);
            base_err err = {{0}};
            CHECK_MSG(be->ops->matmul_add(be, &tx, &L.dev, &ty, &err) == 0, "%s", err.msg);
            double e = dev_err(be, &ty, ref);
            const bool mma = bits[c] == 4 || bits[c] == 8;
            const double tol = fused_tol(n, mma ? gemv_tol(&L, x, n, ref) : 1e-5);
            CHECK_MSG(e < tol, "matmul_add q%d n=%d: err %g", bits[c], n, e);
            CHECK(be->ops->matmul_add(be, &tx, &L.dev, &tx, &err) != 0 &&
                  strstr(err.msg, "overlaps"));
            be->ops->free(be, tx.data);
            be->ops->free(be, ty.data);
            free(x), free(y0), free(ref);
        }
        free_linear(be, &L);
    }
}

/* ---- 17 to 63 rows of x, up to 32 a pass over W ---- */

/* Row counts past 16: n-tiles of 8 rows, full and partial (3 and 4 of them), slices of 32
 * with a last slice of 1, 16 and 31 rows (33, 48, 63), and 4-bit groups of 32, which serve 16
 * rows a pass. */
static const int wide_rows[] = {17, 24, 32, 33, 48, 63};
#define N_WIDE_ROWS 6

/* n rows of x against L, each row within its own bound, rows of very different magnitudes
 * (ranged_rows), a NaN in row 9 and an inf in row n - 2, whose outputs must all be non-finite
 * while every other row's stay in bounds. */
static void check_wide(be_backend *be, const host_linear *L, int n) {
    const int64_t in = L->host.in, out = L->host.out;
    float *x = ranged_rows(n, in);
    x[9 * in + 100] = NAN;
    x[(n - 2) * in + 7] = INFINITY;
    float *ref = malloc(sizeof(float) * (size_t)(n * out));
    ref_matmul(x, n, &L->host, ref);
    double *dv = f16x_dev(L, x, n);
    be_tensor tx = tc_tensor(be, x, BASE_DTYPE_F32, n, in);
    be_tensor ty = tc_poisoned(be, BASE_DTYPE_F32, n, out);
    base_err err = {{0}};
    CHECK_MSG(be->ops->matmul(be, &tx, &L->dev, &ty, &err) == 0, "%s", err.msg);
    float *got = tc_read(be, &ty);
    for (int r = 0; r < n; r++) {
        if (r == 9 || r == n - 2) {
            int finite = 0;
            for (int64_t o = 0; o < out; o++) finite += isfinite(got[r * out + o]);
            CHECK_MSG(finite == 0, "q%d g%d n=%d row %d: %d finite outputs", L->host.bits,
                      L->host.group_size, n, r, finite);
            continue;
        }
        double e = test_rel_err(got + r * out, ref + r * out, (size_t)out);
        double tol = f16x_tol(dv + r * out, ref + r * out, (size_t)out);
        CHECK_MSG(e < tol, "q%d g%d scales %s [%lld x %lld] n=%d row %d: err %g >= %g",
                  L->host.bits, L->host.group_size, base_dtype_name(L->host.dtype), (long long)out,
                  (long long)in, n, r, e, tol);
    }
    be->ops->free(be, tx.data);
    be->ops->free(be, ty.data);
    free(x), free(ref), free(got), free(dv);
}

/* 4 and 8 bits, every group, the three scale dtypes, an out that ends inside a 16-row tile,
 * and a shape of several m-blocks and k-ranges. */
static void test_gemv_wide_rows(be_backend *be) {
    const int bits[] = {4, 8}, groups[] = {32, 64, 128};
    const base_dtype sdts[] = {BASE_DTYPE_BF16, BASE_DTYPE_F16, BASE_DTYPE_F32};
    for (int b = 0; b < 2; b++)
        for (int g = 0; g < 3; g++)
            for (int z = 0; z < 2; z++) {
                const int64_t out = z ? 520 : 37, in = z ? 2048 : 512;
                host_linear L;
                make_linear(be, &L, out, in, bits[b], groups[g], sdts[(b + g + z) % 3], z == 0);
                for (int k = 0; k < N_WIDE_ROWS; k++)
                    if (!z || k % 3 == 2) check_wide(be, &L, wide_rows[k]);
                free_linear(be, &L);
            }
}

/* ---- The quantized GEMM: 33 to 512 rows ---- */

/* Row counts of one and several n-blocks of 64 rows, full and partial, up to
 * QGEMM_MAX_ROWS. Shapes: 300 outputs (two m-blocks of 256 rows, the
 * last tile partial) over 8 to 16 sectors (one k-range), and 40 outputs (one m-block) over
 * 4096 inputs, whose k-range is split in 8 to 16 (the last CTA's sums in k order). Every
 * bit width and group it serves, the three scale dtypes, with and without a bias. */
static void test_qgemm_rows(be_backend *be) {
    const int cfg[5][2] = {{4, 64}, {4, 128}, {8, 32}, {8, 64}, {8, 128}};
    const int rows[] = {33, 40, 64, 65, 100, 129, 257, 512};
    const base_dtype sdts[] = {BASE_DTYPE_BF16, BASE_DTYPE_F16, BASE_DTYPE_F32};
    for (int c = 0; c < 5; c++)
        for (int z = 0; z < 2; z++) {
            const int64_t out = z ? 40 : 300, in = z ? 4096 : 512;
            host_linear L;
            make_linear(be, &L, out, in, cfg[c][0], cfg[c][1], sdts[(c + z) % 3], (c + z) % 2);
            for (int k = 0; k < 8; k++)
                if ((z == 0 || k % 2 == 0) && rows[k] <= QGEMM_MAX_ROWS)
                    check_wide(be, &L, rows[k]);
            free_linear(be, &L);
        }
}

/* The three fused forms for the rows x (n, in) against the CPU: Q/K/V (L) and gate/up (G, U)
 * with the RMSNorm of weight tw (host copy w) folded in, and y += x A^T from random y; each
 * within the bound of the path its row count takes. `what` names the case in failures. */
static void check_fused_forms(be_backend *be, const host_linear L[3], const host_linear *G,
                              const host_linear *U, const host_linear *A, const be_tensor *tw,
                              float *w, float *x, int n, int64_t in, const char *what) {
    float *h = cpu_normed(x, n, in, w);
    be_tensor tx = tc_tensor(be, x, BASE_DTYPE_F32, n, in);
    be_tensor scratch = tc_poisoned(be, BASE_DTYPE_F32, n, in), ty[3];
    const be_norm norm = {tw, 1e-5f, &scratch};
    base_err err = {{0}};
    /* Q, K and V. */
    float *ref[3];
    for (int i = 0; i < 3; i++) {
        ref[i] = malloc(sizeof(float) * (size_t)(n * L[i].host.out));
        ref_matmul(h, n, &L[i].host, ref[i]);
        ty[i] = tc_poisoned(be, BASE_DTYPE_F32, n, L[i].host.out);
    }
    const be_linear *ws[3] = {&L[0].dev, &L[1].dev, &L[2].dev};
    be_tensor *ys[3] = {&ty[0], &ty[1], &ty[2]};
    CHECK_MSG(be->ops->matmul_qkv(be, &tx, &norm, ws, ys, &err) == 0, "%s", err.msg);
    for (int i = 0; i < 3; i++) {
        double e = dev_err(be, &ty[i], ref[i]);
        CHECK_MSG(e < fused_tol(n, gemv_tol(&L[i], h, n, ref[i])),
                  "%s: normed qkv n=%d output %d: err %g", what, n, i, e);
        be->ops->free(be, ty[i].data);
        free(ref[i]);
    }
    /* Gate and up. */
    const int64_t go = G->host.out;
    float *g = malloc(sizeof(float) * (size_t)(n * go));
    float *u = malloc(sizeof(float) * (size_t)(n * go));
    ref_matmul(h, n, &G->host, g);
    ref_matmul(h, n, &U->host, u);
    const double gtol = fused_tol(n, glu_tol(G, U, h, n, g, u, BE_ACT_SILU));
    be_tensor tg = {g, BASE_DTYPE_F32, n, go}, tu = {u, BASE_DTYPE_F32, n, go};
    CHECK(cpu->ops->glu(cpu, BE_ACT_SILU, &tg, &tu, &tg, &err) == 0);
    be_tensor tyg = tc_poisoned(be, BASE_DTYPE_F32, n, go);
    CHECK_MSG(be->ops->matmul_glu(be, &tx, &norm, &G->dev, &U->dev, BE_ACT_SILU, &tyg, &err) == 0,
              "%s", err.msg);
    double e = dev_err(be, &tyg, g);
    CHECK_MSG(e < gtol, "%s: normed gate/up n=%d: err %g", what, n, e);
    be->ops->free(be, tyg.data);
    free(g), free(u);
    /* y += x A^T from random y. */
    const int64_t out = A->host.out;
    float *y0 = rand_rows(n, out), *ra = malloc(sizeof(float) * (size_t)(n * out));
    ref_matmul(x, n, &A->host, ra);
    for (int i = 0; i < n * out; i++) ra[i] += y0[i];
    be_tensor tya = tc_tensor(be, y0, BASE_DTYPE_F32, n, out);
    CHECK_MSG(be->ops->matmul_add(be, &tx, &A->dev, &tya, &err) == 0, "%s", err.msg);
    e = dev_err(be, &tya, ra);
    CHECK_MSG(e < fused_tol(n, gemv_tol(A, x, n, ra)), "%s: matmul_add q%d n=%d: err %g", what,
              A->host.bits, n, e);
    be->ops->free(be, tya.data);
    free(y0), free(ra);
    be->ops->free(be, tx.data);
    be->ops->free(be, scratch.data);
    free(h);
}

/* The fused forms past 16 rows in geometries the tests above leave out: Q/K/V with a norm on
 * 8-bit groups of 128 and on 4-bit groups of 32, gate/up with a norm on 4-bit groups of 32 and
 * 8-bit groups of 128, y += x W^T on 4-bit groups of 128 and 8-bit groups of 64; rows of x
 * scaled apart (scaled_rows). */
static void test_gemv_wide_fused(be_backend *be) {
    const int cfg[2][2] = {{8, 128}, {4, 32}};
    const int64_t outs[3] = {128, 64, 40}, in = 512, out = 200;
    for (int c = 0; c < 2; c++) {
        host_linear L[3], U, A;
        for (int i = 0; i < 3; i++)
            make_linear(be, &L[i], outs[i], in, cfg[c][0], cfg[c][1], BASE_DTYPE_BF16, c == 1);
        /* Gate is K's matrix, up one more of its shape. */
        make_linear(be, &U, outs[1], in, cfg[c][0], cfg[c][1], BASE_DTYPE_BF16, false);
        make_linear(be, &A, out, in, cfg[c][0] == 8 ? 4 : 8, cfg[c][0] == 8 ? 128 : 64,
                    BASE_DTYPE_F16, c == 0);
        float *w;
        be_tensor tw = norm_weight(be, in, BASE_DTYPE_BF16, &w);
        char what[32];
        snprintf(what, sizeof what, "wide q%d g%d", cfg[c][0], cfg[c][1]);
        for (int k = 0; k < N_WIDE_ROWS; k++) {
            float *x = scaled_rows(wide_rows[k], in);
            check_fused_forms(be, L, &L[1], &U, &A, &tw, w, x, wide_rows[k], in, what);
            free(x);
        }
        for (int i = 0; i < 3; i++) free_linear(be, &L[i]);
        free_linear(be, &U);
        free_linear(be, &A);
        be->ops->free(be, tw.data);
        free(w);
    }
}

/* Rows of 14336 4-bit values (down's: several passes of the one-row GEMV's prologue over x a
 * thread): y += x W^T over 3170 rows (1585 blocks of two rows, one past what one block a warp
 * covers, so some warps take two), Q/K/V with a norm over 1028 + 260 + 256 rows, and gate/up
 * with a norm over an odd out; one and two rows of x. */
static void test_gemv_down(be_backend *be) {
    const int64_t in = 14336, outs[3] = {1028, 260, 256};
    float *w;
    be_tensor tw = norm_weight(be, in, BASE_DTYPE_BF16, &w);
    for (int n = 1; n <= 2; n++) {
        host_linear L[3], G, U, D;
        for (int i = 0; i < 3; i++)
            make_linear(be, &L[i], outs[i], in, 4, 64, BASE_DTYPE_BF16, i == 1);
        make_linear(be, &G, 301, in, 4, 64, BASE_DTYPE_BF16, false);
        make_linear(be, &U, 301, in, 4, 64, BASE_DTYPE_BF16, true);
        make_linear(be, &D, 3170, in, 4, 64, BASE_DTYPE_BF16, n == 2);
        float *x = scaled_rows(n, in);
        check_fused_forms(be, L, &G, &U, &D, &tw, w, x, n, in, "in 14336");
        free(x);
        for (int i = 0; i < 3; i++) free_linear(be, &L[i]);
        free_linear(be, &G);
        free_linear(be, &U);
        free_linear(be, &D);
    }
    be->ops->free(be, tw.data);
    free(w);
}

/* x += d; y = rmsnorm(x) * w against add then rmsnorm on the CPU, y aliasing d; rows of 4100
 * and of 9000 (past the values a thread keeps in registers). */
static void test_add_rmsnorm(be_backend *be) {
    const int rows = 3;
    for (int a = 0; a < 6; a += 2) {
        base_dtype dt = act_types[a % 3];
        const int cols = a < 3 ? 4100 : 9000;
        float *x = rand_rows(rows, cols), *d = rand_rows(rows, cols);
        float *w = malloc(sizeof(float) * cols);
        tc_fill(w, cols, 1.0f);
        tc_round(x, (size_t)rows * cols, dt);
        tc_round(d, (size_t)rows * cols, dt);
        be_tensor tx = tc_tensor(be, x, dt, rows, cols), td = tc_tensor(be, d, dt, rows, cols);
        be_tensor tw = tc_tensor(be, w, BASE_DTYPE_F32, 1, cols);
        be_tensor cx = {x, BASE_DTYPE_F32, rows, cols};
        be_tensor cd = {d, BASE_DTYPE_F32, rows, cols}, cw = {w, BASE_DTYPE_F32, 1, cols};
        base_err err = {{0}};
        CHECK(cpu->ops->add(cpu, &cx, &cd, &cx, &err) == 0);
        /* The device stores x in dt before it normalizes it. */
        tc_round(x, (size_t)rows * cols, dt);
        CHECK(cpu->ops->rmsnorm(cpu, &cx, &cw, 1e-5f, &cd, &err) == 0);
        CHECK_MSG(be->ops->add_rmsnorm(be, &tx, &td, &tw, 1e-5f, &td, &err) == 0, "%s", err.msg);
        double ex = dev_err(be, &tx, x), ey = dev_err(be, &td, d);
        CHECK_MSG(ex < tc_tol(dt) && ey < tc_tol(dt), "add_rmsnorm %s: x err %g, y err %g",
                  base_dtype_name(dt), ex, ey);
        be->ops->free(be, tx.data);
        be->ops->free(be, td.data);
        be->ops->free(be, tw.data);
        free(x), free(d), free(w);
    }
}

/* x += rmsnorm(d) * w against rmsnorm then add on the CPU; rows of 2560 and of 9000 (past the
 * values a thread keeps in registers). d must come back unchanged. */
static void test_rmsnorm_add(be_backend *be) {
    const int rows = 3;
    for (int a = 0; a < 6; a += 2) {
        base_dtype dt = act_types[a % 3];
        const int cols = a < 3 ? 2560 : 9000;
        float *x = rand_rows(rows, cols), *d = rand_rows(rows, cols), *nd = rand_rows(rows, cols);
        float *w = rand_rows(1, cols);
        tc_round(x, (size_t)rows * cols, dt);
        tc_round(d, (size_t)rows * cols, dt);
        be_tensor tx = tc_tensor(be, x, dt, rows, cols), td = tc_tensor(be, d, dt, rows, cols);
        be_tensor tw = tc_tensor(be, w, BASE_DTYPE_F32, 1, cols);
        be_tensor cx = {x, BASE_DTYPE_F32, rows, cols}, cd = {d, BASE_DTYPE_F32, rows, cols};
        be_tensor cn = {nd, BASE_DTYPE_F32, rows, cols}, cw = {w, BASE_DTYPE_F32, 1, cols};
        base_err err = {{0}};
        CHECK(cpu->ops->rmsnorm(cpu, &cd, &cw, 1e-6f, &cn, &err) == 0);
        CHECK(cpu->ops->add(cpu, &cx, &cn, &cx, &err) == 0);
        CHECK_MSG(be->ops->rmsnorm_add(be, &td, &tw, 1e-6f, &tx, &err) == 0, "%s", err.msg);
        double ex = dev_err(be, &tx, x), ed = dev_err(be, &td, d);
        CHECK_MSG(ex < tc_tol(dt) && ed == 0.0, "rmsnorm_add %s: x err %g, d changed by %g",
                  base_dtype_name(dt), ex, ed);
        be->ops->free(be, tx.data);
        be->ops->free(be, td.data);
        be->ops->free(be, tw.data);
        free(x), free(d), free(nd), free(w);
    }
}

/* q's and k's per-head norms in one pass against two rmsnorms on the CPU: 8 heads of 256 and
 * 4 of 256 (Gemma 3's), 32 of 128 and 8 of 128, and whole rows of 2048 and 512 (OLMo 2's
 * norm over the projection), in place as the forward pass runs them. */
static void test_rmsnorm_pair(be_backend *be) {
    const int rows = 3, shapes[3][3] = {{8, 4, 256}, {32, 8, 128}, {1, 1, 2048}};
    for (int a = 0; a < 3; a++) {
        base_dtype dt = act_types[a];
        const int hq = shapes[a][0], hk = shapes[a][1], hd = shapes[a][2];
        const int kd = a == 2 ? 512 : hd;
        float *q = rand_rows(rows * hq, hd), *k = rand_rows(rows * hk, kd);
        float *wq = rand_rows(1, hd), *wk = rand_rows(1, kd);
        tc_round(q, (size_t)rows * hq * hd, dt);
        tc_round(k, (size_t)rows * hk * kd, dt);
        be_tensor tq = tc_tensor(be, q, dt, rows * hq, hd),
                  tk = tc_tensor(be, k, dt, rows * hk, kd);
        be_tensor twq = tc_tensor(be, wq, BASE_DTYPE_F32, 1, hd);
        be_tensor twk = tc_tensor(be, wk, BASE_DTYPE_F32, 1, kd);
        be_tensor cq = {q, BASE_DTYPE_F32, rows * hq, hd}, ck = {k, BASE_DTYPE_F32, rows * hk, kd};
        be_tensor cwq = {wq, BASE_DTYPE_F32, 1, hd}, cwk = {wk, BASE_DTYPE_F32, 1, kd};
        base_err err = {{0}};
        CHECK(cpu->ops->rmsnorm(cpu, &cq, &cwq, 1e-6f, &cq, &err) == 0);
        CHECK(cpu->ops->rmsnorm(cpu, &ck, &cwk, 1e-6f, &ck, &err) == 0);
        CHECK_MSG(be->ops->rmsnorm_pair(be, &tq, &twq, &tq, &tk, &twk, &tk, 1e-6f, &err) == 0, "%s",
                  err.msg);
        double eq = dev_err(be, &tq, q), ek = dev_err(be, &tk, k);
        CHECK_MSG(eq < tc_tol(dt) && ek < tc_tol(dt),
                  "rmsnorm_pair %s %dx%d/%dx%d: q err %g, k err %g", base_dtype_name(dt), hq, hd,
                  hk, kd, eq, ek);
        be->ops->free(be, tq.data);
        be->ops->free(be, tk.data);
        be->ops->free(be, twq.data);
        be->ops->free(be, twk.data);
        free(q), free(k), free(wq), free(wk);
    }
}

/* RoPE on q and k and the append of k and v against rope, rope and kv_append on the CPU. */
static void test_rope_kv_append(be_backend *be) {
    const int n = 3, H = 4, KV = 2, hd = 64, bs = 16, nblocks = 4;
    const int64_t width = KV * hd;
    int32_t pos[3] = {0, 9, 5000};
    int64_t slots[3] = {3 * 16 + 2, 1, 17};
    float inv[32];
    /* Whole heads, then partial RoPE: 48 of the 64 dims rotate (Phi-4-mini's 0.75). */
    for (int d = 0; d < 4; d++) {
        base_dtype pdt = d % 2 ? BASE_DTYPE_BF16 : BASE_DTYPE_F16;
        const int half = d < 2 ? 32 : 24;
        for (int i = 0; i < half; i++) inv[i] = (float)pow(10000.0, -2.0 * i / (2 * half));
        float *q = rand_rows(n, H * hd), *k = rand_rows(n, width), *v = rand_rows(n, width);
        size_t pool_elems = (size_t)nblocks * bs * width, bytes = pool_elems * 2;
        uint16_t *ck = calloc(pool_elems, 2), *cv = calloc(pool_elems, 2);
        be_kv_layer cl = {ck, cv, pdt, nblocks, bs, KV, hd};
        be_kv_layer gl = {
            tc_dev_bytes(be, ck, bytes), tc_dev_bytes(be, cv, bytes), pdt, nblocks, bs, KV, hd};
        be_tensor tq = tc_tensor(be, q, BASE_DTYPE_F32, n, H * hd);
        be_tensor tk = tc_tensor(be, k, BASE_DTYPE_F32, n, width);
        be_tensor tv = tc_tensor(be, v, BASE_DTYPE_F32, n, width);
        be_tensor tp = {tc_dev_bytes(be, pos, sizeof pos), BASE_DTYPE_I32, n, 1};
        be_tensor tf = tc_tensor(be, inv, BASE_DTYPE_F32, 1, half);
        be_paged_batch gb = {.n_tokens = n, .slots = tc_dev_bytes(be, slots, sizeof slots)};
        base_err err = {{0}};
        CHECK_MSG(be->ops->rope_kv_append(be, &tq, &tk, &tv, &tp, &tf, 1.1f, &gl, &gb, &err) == 0,
                  "%s", err.msg);
        be_tensor cq = {q, BASE_DTYPE_F32, n, H * hd}, ckt = {k, BASE_DTYPE_F32, n, width};
        be_tensor cvt = {v, BASE_DTYPE_F32, n, width}, cp = {pos, BASE_DTYPE_I32, n, 1};
        be_tensor cf = {inv, BASE_DTYPE_F32, 1, half};
        be_paged_batch cb = {.n_tokens = n, .slots = slots};
        CHECK(cpu->ops->rope(cpu, &cq, H, hd, &cp, &cf, 1.1f, &err) == 0);
        CHECK(cpu->ops->rope(cpu, &ckt, KV, hd, &cp, &cf, 1.1f, &err) == 0);
        CHECK_MSG(cpu->ops->kv_append(cpu, &cl, &ckt, &cvt, &cb, &err) == 0, "%s", err.msg);
        double eq = dev_err(be, &tq, q), ek = dev_err(be, &tk, k);
        /* sincosf on the device and the CPU's sine and cosine differ in the last bits. */
        CHECK_MSG(eq < 1e-4 && ek < 1e-4, "rope_kv_append (%d of %d dims) q err %g, k err %g",
                  2 * half, hd, eq, ek);
        be_tensor pk = {gl.k, pdt, (int64_t)pool_elems, 1},
                  pv = {gl.v, pdt, (int64_t)pool_elems, 1};
        float *rk = malloc(sizeof(float) * pool_elems), *rv = malloc(sizeof(float) * pool_elems);
        for (size_t i = 0; i < pool_elems; i++) {
            rk[i] = base_load_float(ck, pdt, i);
            rv[i] = base_load_float(cv, pdt, i);
        }
        double epk = dev_err(be, &pk, rk), epv = dev_err(be, &pv, rv);
        CHECK_MSG(epk < tc_tol(pdt) && epv < 1e-7,
                  "rope_kv_append %s (%d of %d dims) pool: k err %g, v err %g",
                  base_dtype_name(pdt), 2 * half, hd, epk, epv);
        void *bufs[] = {gl.k, gl.v, tq.data, tk.data, tv.data, tp.data, tf.data, (void *)gb.slots};
        for (int i = 0; i < 8; i++) be->ops->free(be, bufs[i]);
        free(q), free(k), free(v), free(ck), free(cv), free(rk), free(rv);
    }
}

int main(void) {
    be_backend *be = tc_backend();
    if (!be) return TEST_SKIP;
    CHECK(strcmp(be->name, "cuda") == 0);
    CHECK(be->target_parallelism > 0);
    uint64_t fr = 0, tot = 0;
    CHECK(be->ops->memory_info(be, &fr, &tot) == 0 && fr > 0 && tot >= fr);
    test_rmsnorm(be);
    test_binary(be);
    test_rope(be);
    test_argmax(be);
    test_embedding(be);
    test_kv_append(be);
    test_matmul_dense(be);
    test_matmul_quant(be);
    base_err err = {{0}};
    CHECK_MSG(be_cpu_create(2, &cpu, &err) == 0, "%s", err.msg);
    test_gemv_rows(be);
    test_gemv_ranges(be);
    test_gemv_edges(be);
    test_matmul_qkv(be);
    test_matmul_glu(be);
    test_vs_cpu(be);
    test_qkv_norm(be);
    test_glu_norm(be);
    test_matmul_add(be);
    test_gemv_wide_rows(be);
    test_qgemm_rows(be);
    test_gemv_wide_fused(be);
    test_gemv_down(be);
    test_add_rmsnorm(be);
    test_rmsnorm_add(be);
    test_rmsnorm_pair(be);
    test_rope_kv_append(be);
    cpu->ops->destroy(cpu);
    CHECK_MSG(be->ops->sync(be, &err) == 0, "%s", err.msg);
    be->ops->destroy(be);
    TEST_MAIN_END();
}
