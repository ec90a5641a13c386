/* The integer dots' quantization of x (shared by every instruction set) and their portable
 * kernels, the reference the SIMD ones are tested against.
 *
 * Each group of x gets d = max|x| / CPU_XQ_MAX and codes round(x / d), so the codes never
 * reach -32768 and a pair of products (at most 2 * 255 * 32767) never overflows an int32 lane
 * of vpmaddwd. The group's sum is taken from x itself, not from the codes: the bias term then
 * carries no quantization error. */
#include "backend/cpu/cpu_internal.h"

#include <math.h>

void cpu_quant_x_span(const float *x, int64_t in, int g, int span, int16_t *codes, float *d,
                      float *sums) {
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
        for (int i = 0; i < g; i++) {
            int64_t k = g0 + i, at = k;
            if (span) {
                int64_t base = k - k % span, j = k % span;
                at = base + (j % 2 ? span / 2 + j / 2 : j / 2);
            }
            codes[at] = (int16_t)lrintf(x[k] * inv);
        }
    }
}

static void port_quant_x(const float *x, int64_t in, int bits, int g, int16_t *codes, float *d,
                         float *sums) {
    cpu_quant_x_span(x, in, g, 0, codes, d, sums);
}

/* Value i of a group's codes. */
static inline unsigned port_q(int bits, const uint8_t *w, int i) {
    return bits == 8 ? w[i] : (unsigned)(w[i / 2] >> (4 * (i % 2))) & 15u;
}

static void port_idot(int bits, const cpu_idot_args *a, float *out) {
    for (int j = 0; j < a->nw; j++) {
        const uint8_t *w = a->w + j * a->ldw;
        for (int r = 0; r < a->nr; r++) {
            const int16_t *c = a->codes + r * a->ldc;
            float acc = 0.0f;
            for (int64_t gi = 0; gi < a->n_groups; gi++) {
                int32_t t = 0;
                for (int i = 0; i < a->g; i++)
                    t += (int32_t)port_q(bits, w + gi * a->ldg, i) * c[gi * a->g + i];
                acc += (float)t * (a->s[j * a->lds + gi] * a->d[r * a->ldd + gi]);
            }
            out[j * CPU_IDOT_ROWS + r] = acc;
        }
    }
}

static void port_idot4(const cpu_idot_args *a, float *out) {
    port_idot(4, a, out);
}

static void port_idot8(const cpu_idot_args *a, float *out) {
    port_idot(8, a, out);
}

const cpu_ikernels cpu_ikernels_portable = {
    .quant_x = port_quant_x,
    .idot4 = port_idot4,
    .idot8 = port_idot8,
};
