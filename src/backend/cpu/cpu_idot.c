/* The integer dots' quantization of x (shared by every instruction set) and their portable
 * kernels, which compute what the SIMD ones do in the same order (cpu_internal.h).
 *
 * Each group of x gets d = max|x| / CPU_XQ_MAX and codes round(x / d), so the codes never
 * reach -32768 and a pair of products (at most 2 * 255 * 32767) never overflows an int32 lane
 * of vpmaddwd. The group's sum is taken from x itself, not from the codes: the bias term then
 * carries no quantization error. */
#include "backend/cpu/cpu_internal.h"

#include <math.h>

#include "backend/cpu/cpu_idot_row.h"

void cpu_quant_x(const float *x, int64_t in, int g, int16_t *codes, float *d, float *sums) {
    for (int64_t g0 = 0; g0 < in; g0 += g) {
        float amax = 0.0f, sum = 0.0f;
        for (int i = 0; i < g; i++) {
            float v = x[g0 + i];
            sum += v;
            amax = fabsf(v) > amax ? fabsf(v) : amax;
        }
        float inv = amax > 0.0f ? (float)CPU_XQ_MAX / amax : 0.0f;
        d[g0 / g] = amax / (float)CPU_XQ_MAX;
        sums[g0 / g] = sum;
        for (int i = 0; i < g; i++) codes[g0 + i] = (int16_t)lrintf(x[g0 + i] * inv);
    }
}

/* Value i of row j in a group's units (the layout in cpu_internal.h). */
static inline unsigned port_q(int bits, const uint8_t *w, int j, int i) {
    if (bits == 8) return w[(i / 2) * CPU_PACK_UNIT + 2 * j + i % 2];
    unsigned byte = w[(i / 4) * CPU_PACK_UNIT + 2 * j + i % 2];
    return (byte >> (4 * (i % 4 / 2))) & 15u;
}

static void port_tile(int bits, const cpu_tile_args *a) {
    int64_t gbytes = (int64_t)a->g * CPU_PACK_ROWS * bits / 8;
    for (int r = 0; r < a->nr; r++) {
        const int16_t *c = a->codes + r * a->ldc;
        const float *d = a->d + r * a->ldd, *sums = a->sums + r * a->ldd;
        for (int j = 0; j < CPU_PACK_ROWS; j++) {
            float acc = a->acc[r * CPU_PACK_ROWS + j];
            for (int64_t gi = 0; gi < a->n_groups; gi++) {
                const uint8_t *wg = a->w + gi * gbytes;
                const float *sb = a->sb + gi * 2 * CPU_PACK_ROWS;
                int32_t t = 0;
                for (int i = 0; i < a->g; i++)
                    t += (int32_t)port_q(bits, wg, j, i) * c[gi * a->g + i];
                /* fmaf, not a * b + c: the vector kernels' fused rounding */
                acc = fmaf((float)t, sb[j] * d[gi], acc);
                acc = fmaf(sb[CPU_PACK_ROWS + j], sums[gi], acc);
            }
            a->acc[r * CPU_PACK_ROWS + j] = acc;
        }
    }
}

static void port_tile4(const cpu_tile_args *a) {
    port_tile(4, a);
}

static void port_tile8(const cpu_tile_args *a) {
    port_tile(8, a);
}

const cpu_ikernels cpu_ikernels_portable = {
    .tile4 = port_tile4, .tile8 = port_tile8, .row = cpu_idot_row_own};
