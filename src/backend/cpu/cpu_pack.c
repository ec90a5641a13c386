/* Weights repacked into the integer dots' tiles (the layout is in cpu_internal.h), at load for
 * the whole linear, or a chunk at a time by a matmul on a linear that was not repacked.
 *
 * The copy costs (bits / 8 + 8 / g) bytes a weight against the original's (bits / 8 + 2 *
 * scale size / g). */
#include "backend/cpu/cpu_internal.h"

#include <stdlib.h>
#include <string.h>

#define PACK_CHUNK 64 /* groups whose scales are widened at a time */

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

/* Row o's scales or biases (its own layout, dtype w->dtype), groups [g0, g0 + ng), widened
 * into dst. */
static void pack_widen(const cpu_kernels *k, const be_linear *w, const void *src, int64_t o,
                       int64_t g0, int64_t ng, float *dst) {
    size_t first = (size_t)(o * (w->in / w->group_size) + g0);
    if (w->dtype == BASE_DTYPE_F32) {
        memcpy(dst, (const float *)src + first, (size_t)ng * sizeof(float));
    } else if (w->dtype == BASE_DTYPE_F16) {
        k->cvt_f16((const uint16_t *)src + first, dst, ng);
    } else {
        k->cvt_bf16((const uint16_t *)src + first, dst, ng);
    }
}

void cpu_pack_tile(const cpu_kernels *k, const be_linear *w, int64_t o, int64_t g0, int64_t ng,
                   uint8_t *codes, float *sb) {
    int g = w->group_size;
    size_t row_bytes = (size_t)w->in * (size_t)w->bits / 8;
    /* a unit takes 2 bytes of each row, at both widths */
    int64_t units = ng * g * w->bits / 16;
    memset(codes, 0, (size_t)units * CPU_PACK_UNIT);
    memset(sb, 0, (size_t)(ng * 2 * CPU_PACK_ROWS) * sizeof(float));
    for (int j = 0; j < CPU_PACK_ROWS && o + j < w->out; j++) {
        const uint8_t *src = (const uint8_t *)w->weight + (size_t)(o + j) * row_bytes +
                             (size_t)(g0 * g * w->bits / 8);
        for (int64_t u = 0; u < units; u++) {
            uint8_t a = src[2 * u], b = src[2 * u + 1], *dst = codes + u * CPU_PACK_UNIT + 2 * j;
            if (w->bits == 8) {
                dst[0] = a;
                dst[1] = b;
            } else { /* a = v0 | v1 << 4, b = v2 | v3 << 4 */
                dst[0] = (uint8_t)((a & 15u) | (b & 15u) << 4);
                dst[1] = (uint8_t)((a >> 4) | (b & 0xf0u));
            }
        }
        float wide[PACK_CHUNK];
        for (int64_t c0 = 0; c0 < ng; c0 += PACK_CHUNK) {
            int64_t nc = ng - c0 < PACK_CHUNK ? ng - c0 : PACK_CHUNK;
            for (int part = 0; part < 2; part++) {
                pack_widen(k, w, part ? w->biases : w->scales, o + j, g0 + c0, nc, wide);
                for (int64_t i = 0; i < nc; i++)
                    sb[((c0 + i) * 2 + part) * CPU_PACK_ROWS + j] = wide[i];
            }
        }
    }
}

typedef struct pack_ctx {
    const cpu_kernels *k;
    const be_linear *w;   /* the original */
    const be_linear *dst; /* w with packed set, not yet filled */
} pack_ctx;

static void pack_task(void *vctx, int64_t t) {
    const pack_ctx *c = vctx;
    cpu_pack_tile(c->k, c->w, t * CPU_PACK_ROWS, 0, c->w->in / c->w->group_size,
                  (uint8_t *)cpu_pack_codes(c->dst, t), (float *)cpu_pack_scales(c->dst, t));
}

int cpu_pack_linear(be_backend *be, be_linear *w, base_err *err) {
    w->packed = NULL;
    if (!cpu_packs(w)) return 0;
    if (cpu_check_linear(w, "pack_linear", err)) return -1;
    int64_t tiles = pack_tiles(w);
    size_t bytes = (size_t)tiles * (pack_codes_bytes(w) + pack_scales_count(w) * sizeof(float));
    void *dst = malloc(bytes);
    if (!dst) return 0; /* the matmuls pack w a chunk at a time */
    be_linear p = *w;
    p.packed = dst;
    pack_ctx c = {.k = cpu_krn(be), .w = w, .dst = &p};
    base_pool_for(cpu_pool(be), tiles, pack_task, &c);
    w->packed = dst;
    return 0;
}
