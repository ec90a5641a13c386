/* Weights repacked at load for the integer dots (the layout is in cpu_internal.h).
 *
 * In the linear's own layout a decode call runs one weight row a pass, converts its scales a
 * chunk at a time and keeps one accumulator chain busy. In a tile the rows' groups lie side by
 * side, so one pass feeds four rows that share each load of x's codes, and the scales and
 * biases are f32 already. The copy costs (bits / 8 + 8 / g) bytes a weight against the
 * original's (bits / 8 + 2 * scale size / g). */
#include "backend/cpu/cpu_internal.h"

#include <stdlib.h>
#include <string.h>

bool cpu_packs(const be_linear *w) {
    return (w->bits == 4 || w->bits == 8) && w->quant != BE_QUANT_MXFP4;
}

static int64_t pack_tiles(const be_linear *w) {
    return (w->out + CPU_PACK_ROWS - 1) / CPU_PACK_ROWS;
}

static size_t pack_codes_bytes(const be_linear *w) {
    return CPU_PACK_ROWS * (size_t)w->in * (size_t)w->bits / 8;
}

static size_t pack_scales_count(const be_linear *w) {
    return 2 * CPU_PACK_ROWS * (size_t)(w->in / w->group_size);
}

const uint8_t *cpu_pack_codes(const be_linear *w, int64_t t) {
    return (const uint8_t *)w->packed + (size_t)t * pack_codes_bytes(w);
}

const float *cpu_pack_scales(const be_linear *w, int64_t t) {
    const uint8_t *end = cpu_pack_codes(w, pack_tiles(w));
    return (const float *)end + (size_t)t * pack_scales_count(w);
}

typedef struct pack_ctx {
    const cpu_kernels *k;
    const be_linear *w;   /* the original */
    const be_linear *dst; /* w with packed set, not yet filled */
} pack_ctx;

/* Row o's scales or biases (its own layout, dtype w->dtype) widened into dst (n_groups). */
static void pack_widen(const pack_ctx *c, const void *src, int64_t o, float *dst) {
    const be_linear *w = c->w;
    int64_t n_groups = w->in / w->group_size;
    size_t first = (size_t)(o * n_groups);
    if (w->dtype == BASE_DTYPE_F32) {
        memcpy(dst, (const float *)src + first, (size_t)n_groups * sizeof(float));
    } else if (w->dtype == BASE_DTYPE_F16) {
        c->k->cvt_f16((const uint16_t *)src + first, dst, n_groups);
    } else {
        c->k->cvt_bf16((const uint16_t *)src + first, dst, n_groups);
    }
}

/* Tile t; rows past w->out are zero codes with zero scales and biases. */
static void pack_tile(void *vctx, int64_t t) {
    const pack_ctx *c = vctx;
    const be_linear *w = c->w;
    int64_t n_groups = w->in / w->group_size;
    size_t gbytes = (size_t)w->group_size * (size_t)w->bits / 8;
    size_t row_bytes = (size_t)n_groups * gbytes;
    uint8_t *codes = (uint8_t *)cpu_pack_codes(c->dst, t);
    float *scales = (float *)cpu_pack_scales(c->dst, t);
    float *biases = scales + CPU_PACK_ROWS * n_groups;
    memset(codes, 0, pack_codes_bytes(w));
    memset(scales, 0, pack_scales_count(w) * sizeof(float));
    for (int j = 0; j < CPU_PACK_ROWS; j++) {
        int64_t o = t * CPU_PACK_ROWS + j;
        if (o >= w->out) break;
        const uint8_t *row = (const uint8_t *)w->weight + (size_t)o * row_bytes;
        for (int64_t gi = 0; gi < n_groups; gi++)
            memcpy(codes + ((size_t)gi * CPU_PACK_ROWS + (size_t)j) * gbytes, row + gi * gbytes,
                   gbytes);
        pack_widen(c, w->scales, o, scales + j * n_groups);
        pack_widen(c, w->biases, o, biases + j * n_groups);
    }
}

int cpu_pack_linear(be_backend *be, be_linear *w, base_err *err) {
    w->packed = NULL;
    if (!cpu_packs(w)) return 0;
    if (cpu_check_linear(w, "pack_linear", err)) return -1;
    int64_t tiles = pack_tiles(w);
    size_t bytes = (size_t)tiles * (pack_codes_bytes(w) + pack_scales_count(w) * sizeof(float));
    void *dst = malloc(bytes);
    if (!dst) return 0; /* the matmuls read w as it is */
    be_linear p = *w;
    p.packed = dst;
    pack_ctx c = {.k = cpu_krn(be), .w = w, .dst = &p};
    base_pool_for(cpu_pool(be), tiles, pack_tile, &c);
    w->packed = dst;
    return 0;
}
