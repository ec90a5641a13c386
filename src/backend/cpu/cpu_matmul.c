/* CPU matmul: y [n, out] = x [n, in] W^T (+ bias), W dense, MLX affine-quantized or MXFP4.
 *
 * 4- and 8-bit affine weights take the integer dots (cpu_internal.h) at every row count, so a
 * row's result never depends on its batch. The other weights take one of two paths, both
 * parallel over blocks of output rows and both accumulating in f32:
 *
 * - One row of x (decode): a fused dot per weight row that unpacks the packed values in
 *   registers and never writes them out, so the weights stream from memory once. The affine
 *   form lets the biases leave the inner loop: sum_i (s q_i + b) x_i = s sum_i q_i x_i +
 *   b sum_i x_i, with the per-group sums of x computed once per call.
 * - More rows (prefill, batched decode): each task dequantizes a tile of CPU_TILE_ROWS
 *   weight rows by CPU_TILE_K columns (32 KiB, L1-sized) and runs the GEMM micro-kernel of
 *   every x row against it, so one dequantization serves the whole batch. Dense f32 weights
 *   are used in place. At two rows this already beats running the fused dot twice. */
#include "backend/cpu/cpu_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define CPU_TILE_ROWS    16  /* output rows per task on the GEMM path */
#define CPU_TILE_K       512 /* columns per tile: a multiple of every group size */
#define CPU_GEMV_ROWS    16  /* output rows per task on the fused path */
#define CPU_GEMV_MAX_N   1   /* rows of x up to which the fused path is faster (measured) */
#define CPU_GROUP_CHUNK  64  /* groups whose scales are converted at a time */
#define CPU_IDOT_XBLOCK  32  /* rows of x an integer-dot task runs per pass over its tile */
#define CPU_IDOT_OWN_MAX 4   /* rows of x below which a linear not repacked is read row by row */

static bool cpu_float_dtype(base_dtype dt) {
    return dt == BASE_DTYPE_F32 || dt == BASE_DTYPE_F16 || dt == BASE_DTYPE_BF16;
}

int cpu_check_tensor(const be_tensor *t, base_dtype dt, const char *op, const char *what,
                     base_err *err) {
    if (!t) return base_fail(err, "%s: %s is NULL", op, what);
    if (t->dtype != dt) {
        return base_fail(err, "%s: %s has dtype %s, expected %s", op, what,
                         base_dtype_name(t->dtype), base_dtype_name(dt));
    }
    if (t->rows < 0 || t->cols <= 0) {
        return base_fail(err, "%s: %s has shape [%lld, %lld]", op, what, (long long)t->rows,
                         (long long)t->cols);
    }
    if (!t->data && t->rows > 0) return base_fail(err, "%s: %s has no data", op, what);
    return 0;
}

int cpu_check_linear(const be_linear *w, const char *op, base_err *err) {
    if (!w || !w->weight) return base_fail(err, "%s: weight has no data", op);
    if (w->out <= 0 || w->in <= 0) {
        return base_fail(err, "%s: weight has shape [%lld, %lld]", op, (long long)w->out,
                         (long long)w->in);
    }
    if (w->bits && w->quant == BE_QUANT_MXFP4) {
        if (w->bits != 4 || w->group_size != 32 || w->in % 32 || w->dtype != BASE_DTYPE_U8 ||
            !w->scales)
            return base_fail(err, "%s: mxfp4 weight needs bits 4, group 32 and U8 scales", op);
        if (w->bias && !cpu_float_dtype(w->bias_dtype))
            return base_fail(err, "%s: bias dtype %s is not F32, F16 or BF16", op,
                             base_dtype_name(w->bias_dtype));
        return 0;
    }
    if (!cpu_float_dtype(w->dtype)) {
        return base_fail(err, "%s: weight dtype %s is not F32, F16 or BF16", op,
                         base_dtype_name(w->dtype));
    }
    if (w->bias && !cpu_float_dtype(w->bias_dtype)) {
        return base_fail(err, "%s: bias dtype %s is not F32, F16 or BF16", op,
                         base_dtype_name(w->bias_dtype));
    }
    if (w->bits == 0) return 0;
    if (w->bits != 2 && w->bits != 3 && w->bits != 4 && w->bits != 5 && w->bits != 6 &&
        w->bits != 8) {
        return base_fail(err, "%s: quantized bits %d is not 2, 3, 4, 5, 6 or 8", op, w->bits);
    }
    if (w->group_size != 32 && w->group_size != 64 && w->group_size != 128) {
        return base_fail(err, "%s: group size %d is not 32, 64 or 128", op, w->group_size);
    }
    if (w->in % w->group_size != 0) {
        return base_fail(err, "%s: in %lld is not a multiple of the group size %d", op,
                         (long long)w->in, w->group_size);
    }
    if (!w->scales || !w->biases) return base_fail(err, "%s: quantized weight lacks scales", op);
    return 0;
}

static size_t mm_row_bytes(const be_linear *w) {
    if (w->bits) return (size_t)w->in * (size_t)w->bits / 8;
    return (size_t)w->in * base_dtype_size(w->dtype);
}

/* Scales and biases of row o, groups [g0, g0 + ng), as f32. Converted a span at a time with
 * the vector kernels: one call per element here would cost more than the dot itself. */
static void mm_scales(const cpu_kernels *k, const be_linear *w, int64_t o, int64_t g0, int64_t ng,
                      float *s, float *b) {
    size_t first = (size_t)o * (size_t)(w->in / w->group_size) + (size_t)g0;
    if (w->dtype == BASE_DTYPE_F32) {
        memcpy(s, (const float *)w->scales + first, (size_t)ng * sizeof(float));
        memcpy(b, (const float *)w->biases + first, (size_t)ng * sizeof(float));
        return;
    }
    void (*cvt)(const uint16_t *, float *, int64_t) =
        w->dtype == BASE_DTYPE_F16 ? k->cvt_f16 : k->cvt_bf16;
    cvt((const uint16_t *)w->scales + first, s, ng);
    cvt((const uint16_t *)w->biases + first, b, ng);
}

/* Columns [k0, k0 + kb) of an MXFP4 row (multiples of 32): codes two to a byte, low nibble
 * first; each group's scale byte is a power of two. */
static void mm_dequant_mxfp4(const be_linear *w, int64_t o, int64_t k0, int64_t kb, float *dst) {
    static const float e2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    const uint8_t *codes = (const uint8_t *)w->weight + (size_t)o * (size_t)(w->in / 2);
    const uint8_t *scales = (const uint8_t *)w->scales + (size_t)o * (size_t)(w->in / 32);
    for (int64_t i = 0; i < kb; i++) {
        int64_t c = k0 + i;
        unsigned q = (codes[c / 2] >> (4 * (c % 2))) & 15u;
        float v = ldexpf(e2m1[q & 7u], (int)scales[c / 32] - 127);
        dst[i] = q & 8u ? -v : v;
    }
}

/* Columns [k0, k0 + kb) of row o as f32 into dst; k0 and kb are multiples of the group size
 * when quantized, and kb is at most CPU_TILE_K. */
static void mm_dequant(const cpu_kernels *k, const be_linear *w, int64_t o, int64_t k0, int64_t kb,
                       float *dst) {
    const uint8_t *row = (const uint8_t *)w->weight + (size_t)o * mm_row_bytes(w);
    if (w->bits == 0) {
        const uint16_t *src = (const uint16_t *)row + k0;
        if (w->dtype == BASE_DTYPE_F32) {
            memcpy(dst, (const float *)row + k0, (size_t)kb * sizeof(float));
        } else if (w->dtype == BASE_DTYPE_F16) {
            k->cvt_f16(src, dst, kb);
        } else {
            k->cvt_bf16(src, dst, kb);
        }
        return;
    }
    if (w->quant == BE_QUANT_MXFP4) {
        mm_dequant_mxfp4(w, o, k0, kb, dst);
        return;
    }
    int g = w->group_size;
    float s[CPU_TILE_K / 32], b[CPU_TILE_K / 32];
    int64_t g0 = k0 / g, ng = kb / g;
    mm_scales(k, w, o, g0, ng, s, b);
    const uint8_t *wp = row + (size_t)k0 * (size_t)w->bits / 8;
    if (w->bits == 4) {
        k->deq4(wp, s, b, ng, g, dst);
    } else if (w->bits == 8) {
        k->deq8(wp, s, b, ng, g, dst);
    } else {
        cpu_deq_bits(w->bits, wp, s, b, ng, g, dst);
    }
}

static void mm_dequant_row(const cpu_kernels *k, const be_linear *w, int64_t r, float *dst) {
    int64_t step = w->bits ? (CPU_TILE_K / w->group_size) * w->group_size : CPU_TILE_K;
    for (int64_t k0 = 0; k0 < w->in; k0 += step) {
        int64_t kb = w->in - k0 < step ? w->in - k0 : step;
        mm_dequant(k, w, r, k0, kb, dst + k0);
    }
}

void cpu_linear_row(be_backend *be, const be_linear *w, int64_t r, float *dst) {
    mm_dequant_row(cpu_krn(be), w, r, dst);
}

typedef struct mm_ctx {
    const cpu_kernels *k;
    const be_linear *w;
    const float *x;    /* (n, in) */
    const float *xsum; /* (n, in / group_size) sums of x per group; fused and integer paths */
    const int16_t *xc; /* (n, in) x's codes; integer path only */
    const float *xd;   /* (n, in / group_size) the codes' scales; integer path only */
    const cpu_ikernels *ik;
    float *rows; /* (tasks, in) each task's dequantized weight row; exact path only */
    float *y;    /* (n, out) */
    int64_t n;
} mm_ctx;

static float mm_bias(const be_linear *w, int64_t o) {
    return w->bias ? base_load_float(w->bias, w->bias_dtype, (size_t)o) : 0.0f;
}

/* acc[r] += row o of a quantized W . x[r] for every row r of x. */
static void mm_qdot_row(const mm_ctx *c, const uint8_t *row, int64_t o, float *acc) {
    const be_linear *w = c->w;
    int g = w->group_size;
    int64_t n_groups = w->in / g;
    float s[CPU_GROUP_CHUNK], b[CPU_GROUP_CHUNK];
    for (int64_t g0 = 0; g0 < n_groups; g0 += CPU_GROUP_CHUNK) {
        int64_t ng = n_groups - g0 < CPU_GROUP_CHUNK ? n_groups - g0 : CPU_GROUP_CHUNK;
        mm_scales(c->k, w, o, g0, ng, s, b);
        const uint8_t *wp = row + (size_t)(g0 * g) * (size_t)w->bits / 8;
        for (int64_t r = 0; r < c->n; r++) {
            const float *x = c->x + r * w->in + g0 * g;
            float part = cpu_qdot_bits(w->bits, wp, s, ng, g, x);
            const float *xs = c->xsum + r * n_groups + g0;
            for (int64_t i = 0; i < ng; i++) part += b[i] * xs[i];
            acc[r] += part;
        }
    }
}

static void mm_gemv_task(void *vctx, int64_t t) {
    const mm_ctx *c = vctx;
    const be_linear *w = c->w;
    int64_t o1 = (t + 1) * CPU_GEMV_ROWS < w->out ? (t + 1) * CPU_GEMV_ROWS : w->out;
    for (int64_t o = t * CPU_GEMV_ROWS; o < o1; o++) {
        const uint8_t *row = (const uint8_t *)w->weight + (size_t)o * mm_row_bytes(w);
        float acc[CPU_GEMV_MAX_N] = {0};
        if (w->bits) {
            mm_qdot_row(c, row, o, acc);
        } else {
            for (int64_t r = 0; r < c->n; r++) {
                const float *x = c->x + r * w->in;
                if (w->dtype == BASE_DTYPE_F32) {
                    acc[r] = c->k->dot_f32((const float *)row, x, w->in);
                } else if (w->dtype == BASE_DTYPE_F16) {
                    acc[r] = c->k->dot_f16((const uint16_t *)row, x, w->in);
                } else {
                    acc[r] = c->k->dot_bf16((const uint16_t *)row, x, w->in);
                }
            }
        }
        float bias = mm_bias(w, o);
        for (int64_t r = 0; r < c->n; r++) c->y[r * w->out + o] = acc[r] + bias;
    }
}

static void mm_gemm_task(void *vctx, int64_t t) {
    const mm_ctx *c = vctx;
    const be_linear *w = c->w;
    _Alignas(64) float tile[CPU_TILE_ROWS * CPU_TILE_K]; /* (CPU_TILE_ROWS, CPU_TILE_K) */
    int64_t o0 = t * CPU_TILE_ROWS;
    int64_t m = w->out - o0 < CPU_TILE_ROWS ? w->out - o0 : CPU_TILE_ROWS;
    for (int64_t j = 0; j < m; j++) {
        float bias = mm_bias(w, o0 + j);
        for (int64_t r = 0; r < c->n; r++) c->y[r * w->out + o0 + j] = bias;
    }
    for (int64_t k0 = 0; k0 < w->in; k0 += CPU_TILE_K) {
        int64_t kb = w->in - k0 < CPU_TILE_K ? w->in - k0 : CPU_TILE_K;
        const float *wt = tile;
        int64_t ldw = CPU_TILE_K;
        if (w->bits == 0 && w->dtype == BASE_DTYPE_F32) {
            wt = (const float *)w->weight + o0 * w->in + k0;
            ldw = w->in;
        } else {
            for (int64_t j = 0; j < m; j++) mm_dequant(c->k, w, o0 + j, k0, kb, tile + j * ldw);
        }
        c->k->gemm(c->n, m, kb, c->x + k0, w->in, wt, ldw, c->y + o0, w->out);
    }
}

static bool mm_uses_idot(const be_linear *w) {
    return (w->bits == 4 || w->bits == 8) && w->quant != BE_QUANT_MXFP4;
}

/* Values of a linear not repacked that one task packs at a time (32 KiB of 8-bit codes). */
#define CPU_PACK_CHUNK_K 2048

/* Tile t against rows [r0, r0 + nr) of x into acc (nr, CPU_PACK_ROWS): the packed tile in one
 * call, or, when w was not repacked, its groups packed a chunk at a time, the chains carried
 * across the chunks (the same bits as the packed copy's). */
static void mm_idot_block(const mm_ctx *c, int64_t t, int64_t r0, int nr, float *acc) {
    const be_linear *w = c->w;
    int g = w->group_size;
    int64_t n_groups = w->in / g;
    void (*tile)(const cpu_tile_args *) = w->bits == 4 ? c->ik->tile4 : c->ik->tile8;
    cpu_tile_args a = {.codes = c->xc + r0 * w->in,
                       .d = c->xd + r0 * n_groups,
                       .sums = c->xsum + r0 * n_groups,
                       .ldc = w->in,
                       .ldd = n_groups,
                       .g = g,
                       .nr = nr,
                       .acc = acc};
    memset(acc, 0, (size_t)nr * CPU_PACK_ROWS * sizeof(float));
    if (w->packed) {
        a.w = cpu_pack_codes(w, t);
        a.sb = cpu_pack_scales(w, t);
        a.n_groups = n_groups;
        tile(&a);
        return;
    }
    _Alignas(64) uint8_t codes[CPU_PACK_ROWS * CPU_PACK_CHUNK_K];
    _Alignas(64) float sb[2 * CPU_PACK_ROWS * (CPU_PACK_CHUNK_K / 32)];
    int64_t chunk = CPU_PACK_CHUNK_K / g;
    for (int64_t g0 = 0; g0 < n_groups; g0 += chunk) {
        int64_t ng = n_groups - g0 < chunk ? n_groups - g0 : chunk;
        cpu_pack_tile(c->k, w, t * CPU_PACK_ROWS, g0, ng, codes, sb);
        a.w = codes;
        a.sb = sb;
        a.n_groups = ng;
        a.codes = c->xc + r0 * w->in + g0 * g;
        a.d = c->xd + r0 * n_groups + g0;
        a.sums = c->xsum + r0 * n_groups + g0;
        tile(&a);
    }
}

/* Row o of a linear not repacked against the few rows of x that c has, straight from its own
 * layout. */
static void mm_idot_own_row(const mm_ctx *c, int64_t o, float *acc) {
    const be_linear *w = c->w;
    int g = w->group_size;
    int64_t n_groups = w->in / g;
    const uint8_t *row = (const uint8_t *)w->weight + (size_t)o * mm_row_bytes(w);
    float s[CPU_GROUP_CHUNK], b[CPU_GROUP_CHUNK];
    for (int64_t r = 0; r < c->n; r++) acc[r] = 0.0f;
    for (int64_t g0 = 0; g0 < n_groups; g0 += CPU_GROUP_CHUNK) {
        int64_t ng = n_groups - g0 < CPU_GROUP_CHUNK ? n_groups - g0 : CPU_GROUP_CHUNK;
        mm_scales(c->k, w, o, g0, ng, s, b);
        const uint8_t *wp = row + (size_t)(g0 * g) * (size_t)w->bits / 8;
        for (int64_t r = 0; r < c->n; r++)
            c->ik->row(w->bits, wp, s, b, c->xc + r * w->in + g0 * g, c->xd + r * n_groups + g0,
                       c->xsum + r * n_groups + g0, ng, g, acc + r);
    }
}

/* Task t is tile t: blocks of CPU_IDOT_XBLOCK rows of x, each a pass over the tile; or, for a
 * linear not repacked and fewer than CPU_IDOT_OWN_MAX rows of x, the tile's rows one by one
 * (packing a tile costs more than a pass or two over the rows). */
static void mm_idot_task(void *vctx, int64_t t) {
    const mm_ctx *c = vctx;
    const be_linear *w = c->w;
    int64_t o = t * CPU_PACK_ROWS;
    int m = w->out - o < CPU_PACK_ROWS ? (int)(w->out - o) : CPU_PACK_ROWS;
    float bias[CPU_PACK_ROWS];
    for (int j = 0; j < m; j++) bias[j] = mm_bias(w, o + j);
    if (!w->packed && c->n < CPU_IDOT_OWN_MAX) {
        float acc[CPU_IDOT_OWN_MAX];
        for (int j = 0; j < m; j++) {
            mm_idot_own_row(c, o + j, acc);
            for (int64_t r = 0; r < c->n; r++) c->y[r * w->out + o + j] = acc[r] + bias[j];
        }
        return;
    }
    _Alignas(64) float acc[CPU_IDOT_XBLOCK * CPU_PACK_ROWS];
    for (int64_t r0 = 0; r0 < c->n; r0 += CPU_IDOT_XBLOCK) {
        int nr = c->n - r0 < CPU_IDOT_XBLOCK ? (int)(c->n - r0) : CPU_IDOT_XBLOCK;
        mm_idot_block(c, t, r0, nr, acc);
        for (int r = 0; r < nr; r++)
            for (int j = 0; j < m; j++)
                c->y[(r0 + r) * w->out + o + j] = acc[r * CPU_PACK_ROWS + j] + bias[j];
    }
}

static void mm_quant_task(void *vctx, int64_t r) {
    const mm_ctx *c = vctx;
    const be_linear *w = c->w;
    int64_t n_groups = w->in / w->group_size;
    cpu_quant_x(c->x + r * w->in, w->in, w->group_size, (int16_t *)c->xc + r * w->in,
                (float *)c->xd + r * n_groups, (float *)c->xsum + r * n_groups);
}

/* x quantized for the integer dots, then the dots; one buffer for codes, scales and sums. */
static int mm_idot(be_backend *be, mm_ctx *c, base_err *err) {
    const be_linear *w = c->w;
    size_t n_groups = (size_t)(w->in / w->group_size), n = (size_t)c->n;
    size_t codes = n * (size_t)w->in * sizeof(int16_t), f32s = 2 * n * n_groups * sizeof(float);
    char *buf = malloc(codes + f32s);
    if (!buf) return base_fail(err, "matmul: out of memory for %lld rows", (long long)c->n);
    c->ik = cpu_ikrn(be);
    c->xd = (const float *)buf;
    c->xsum = c->xd + n * n_groups;
    c->xc = (const int16_t *)(buf + f32s);
    base_pool_for(cpu_pool(be), c->n, mm_quant_task, c);
    base_pool_for(cpu_pool(be), (w->out + CPU_PACK_ROWS - 1) / CPU_PACK_ROWS, mm_idot_task, c);
    free(buf);
    return 0;
}

/* Fills the fused path's per-call views of x; the caller frees *buf. */
static int mm_prepare_x(mm_ctx *c, float **buf, base_err *err) {
    const be_linear *w = c->w;
    *buf = NULL;
    if (w->bits == 0) return 0;
    int64_t n_groups = w->in / w->group_size;
    *buf = malloc((size_t)(c->n * n_groups) * sizeof(float));
    if (!*buf) return base_fail(err, "matmul: out of memory for %lld rows", (long long)c->n);
    float *sums = *buf;
    for (int64_t r = 0; r < c->n; r++) {
        const float *x = c->x + r * w->in;
        for (int64_t gi = 0; gi < n_groups; gi++) {
            float s = 0.0f;
            for (int i = 0; i < w->group_size; i++) s += x[gi * w->group_size + i];
            sums[r * n_groups + gi] = s;
        }
    }
    c->xsum = sums;
    return 0;
}

static int mm_check(const be_tensor *x, const be_linear *w, const be_tensor *y, base_err *err) {
    if (cpu_check_tensor(x, BASE_DTYPE_F32, "matmul", "x", err) ||
        cpu_check_tensor(y, BASE_DTYPE_F32, "matmul", "y", err) ||
        cpu_check_linear(w, "matmul", err)) {
        return -1;
    }
    if (x->cols != w->in) {
        return base_fail(err, "matmul: x has %lld columns but the weight's in is %lld",
                         (long long)x->cols, (long long)w->in);
    }
    if (y->rows != x->rows || y->cols != w->out) {
        return base_fail(err, "matmul: y is [%lld, %lld], expected [%lld, %lld]",
                         (long long)y->rows, (long long)y->cols, (long long)x->rows,
                         (long long)w->out);
    }
    return 0;
}

int cpu_matmul(be_backend *be, const be_tensor *x, const be_linear *w, be_tensor *y,
               base_err *err) {
    if (mm_check(x, w, y, err)) return -1;
    if (x->rows == 0) return 0;
    mm_ctx c = {.k = cpu_krn(be), .w = w, .x = x->data, .y = y->data, .n = x->rows};
    if (mm_uses_idot(w)) return mm_idot(be, &c, err);
    if (c.n > CPU_GEMV_MAX_N || (w->bits && w->quant == BE_QUANT_MXFP4)) {
        base_pool_for(cpu_pool(be), (w->out + CPU_TILE_ROWS - 1) / CPU_TILE_ROWS, mm_gemm_task, &c);
        return 0;
    }
    float *buf;
    if (mm_prepare_x(&c, &buf, err)) return -1;
    base_pool_for(cpu_pool(be), (w->out + CPU_GEMV_ROWS - 1) / CPU_GEMV_ROWS, mm_gemv_task, &c);
    free(buf);
    return 0;
}

/* Task t's weight rows dequantized one by one into its row of c->rows, then one f32 dot per
 * row of x. */
static void mm_exact_task(void *vctx, int64_t t) {
    const mm_ctx *c = vctx;
    const be_linear *w = c->w;
    float *row = c->rows + t * w->in;
    int64_t o1 = (t + 1) * CPU_GEMV_ROWS < w->out ? (t + 1) * CPU_GEMV_ROWS : w->out;
    for (int64_t o = t * CPU_GEMV_ROWS; o < o1; o++) {
        mm_dequant_row(c->k, w, o, row);
        float bias = mm_bias(w, o);
        for (int64_t r = 0; r < c->n; r++)
            c->y[r * w->out + o] = c->k->dot_f32(row, c->x + r * w->in, w->in) + bias;
    }
}

int cpu_matmul_exact(be_backend *be, const be_tensor *x, const be_linear *w, be_tensor *y,
                     base_err *err) {
    if (mm_check(x, w, y, err)) return -1;
    if (x->rows == 0) return 0;
    int64_t n_tasks = (w->out + CPU_GEMV_ROWS - 1) / CPU_GEMV_ROWS;
    float *rows = malloc((size_t)(n_tasks * w->in) * sizeof(float));
    if (!rows) return base_fail(err, "matmul: out of memory for %lld rows", (long long)w->out);
    mm_ctx c = {.k = cpu_krn(be), .w = w, .x = x->data, .rows = rows, .y = y->data, .n = x->rows};
    base_pool_for(cpu_pool(be), n_tasks, mm_exact_task, &c);
    free(rows);
    return 0;
}
