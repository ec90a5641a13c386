/* AVX2 integer dots (vpmaddwd: int16 pairs into int32 lanes). Chosen at run time only when the
 * CPU has AVX2, FMA and F16C; this file is compiled with those flags and nothing else may call
 * into it.
 *
 * 4-bit: 16 bytes widened to 16 int16 lanes give the low nibbles (values 0, 2, .., 30) and the
 * high ones (1, 3, .., 31), so x's codes are stored per 32 values as evens then odds. Each
 * group's int32 lanes are scaled into f32 lanes once, and the lanes are added up once a call:
 * the same order for every row, whatever nr. */
#if defined(__x86_64__) || defined(__i386__)
#include "backend/cpu/cpu_internal.h"

#include <immintrin.h>

/* Ahead of the weights: cpu_idot_avx512.h says why. */
#define CPU_PREFETCH 2048

static inline float ia2_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static void ia2_quant_x(const float *x, int64_t in, int bits, int g, int16_t *codes, float *d,
                        float *sums) {
    cpu_quant_x_span(x, in, g, bits == 4 ? 32 : 0, codes, d, sums);
}

static inline __m256i ia2_madd(__m256i acc, __m256i q, const int16_t *c) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(q, _mm256_loadu_si256((const __m256i *)c)));
}

/* Weight row j of a against nr rows of x, for both widths; forced inline so that the
 * constant bits and nr of each call site keep the accumulators in registers
 * (cpu_idot_avx512.h says why). One weight row a pass: two would not fit the 16 registers. */
static inline __attribute__((always_inline)) void ia2_rows(int bits, const cpu_idot_args *a, int j,
                                                           int nr, float *out) {
    const __m256i m15 = _mm256_set1_epi16(15);
    const uint8_t *w = a->w + j * a->ldw;
    const float *s = a->s + j * a->lds;
    int g = a->g;
    __m256 f[CPU_IDOT_ROWS];
    for (int r = 0; r < nr; r++) f[r] = _mm256_setzero_ps();
    for (int64_t gi = 0; gi < a->n_groups; gi++) {
        const uint8_t *wg = w + gi * a->ldg;
        const int16_t *cg = a->codes + gi * g;
        _mm_prefetch((const char *)wg + CPU_PREFETCH, _MM_HINT_T0);
        __m256i acc[CPU_IDOT_ROWS];
        for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_si256();
        for (int i = 0; i < g; i += 32) {
            const uint8_t *p = wg + i * bits / 8;
            __m256i q0, q1;
            if (bits == 4) {
                __m256i q = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
                q0 = _mm256_and_si256(q, m15);
                q1 = _mm256_srli_epi16(q, 4);
            } else {
                q0 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
                q1 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(p + 16)));
            }
            for (int r = 0; r < nr; r++) {
                acc[r] = ia2_madd(acc[r], q0, cg + r * a->ldc + i);
                acc[r] = ia2_madd(acc[r], q1, cg + r * a->ldc + i + 16);
            }
        }
        for (int r = 0; r < nr; r++) {
            __m256 sd = _mm256_set1_ps(s[gi] * a->d[r * a->ldd + gi]);
            f[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r]), sd, f[r]);
        }
    }
    for (int r = 0; r < nr; r++) out[j * CPU_IDOT_ROWS + r] = ia2_hsum(f[r]);
}

static void ia2_idot4(const cpu_idot_args *a, float *out) {
    for (int j = 0; j < a->nw; j++) {
        if (a->nr == CPU_IDOT_ROWS) {
            ia2_rows(4, a, j, CPU_IDOT_ROWS, out);
        } else {
            ia2_rows(4, a, j, 1, out);
        }
    }
}

static void ia2_idot8(const cpu_idot_args *a, float *out) {
    for (int j = 0; j < a->nw; j++) {
        if (a->nr == CPU_IDOT_ROWS) {
            ia2_rows(8, a, j, CPU_IDOT_ROWS, out);
        } else {
            ia2_rows(8, a, j, 1, out);
        }
    }
}

const cpu_ikernels cpu_ikernels_avx2 = {
    .quant_x = ia2_quant_x,
    .idot4 = ia2_idot4,
    .idot8 = ia2_idot8,
};
#endif
