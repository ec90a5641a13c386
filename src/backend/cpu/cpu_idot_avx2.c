/* AVX2 integer dots (vpmaddwd: int16 pairs into int32 lanes). Chosen at run time only when the
 * CPU has AVX2, FMA and F16C; this file is compiled with those flags and nothing else may call
 * into it.
 *
 * A tile's unit (cpu_internal.h) is two vectors here, rows 0-7 and rows 8-15, each widened
 * once for IA2_ROWS rows of x. */
#if defined(__x86_64__) || defined(__i386__)
#include "backend/cpu/cpu_internal.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_idot_row.h"

/* Ahead of the weights: cpu_idot_avx512.h says why. */
#define CPU_PREFETCH 2048
#define IA2_ROWS     2 /* rows of x a block takes: 8 accumulators of 16 registers */

static inline __m256i ia2_pair(const int16_t *c) {
    int32_t v;
    memcpy(&v, c, sizeof v);
    return _mm256_set1_epi32(v);
}

static inline __m256i ia2_madd(__m256i acc, __m256i q, __m256i x) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(q, x));
}

/* Rows [r0, r0 + nr) of x against the tile; forced inline so that the constant bits and nr
 * of each call site keep the accumulators in registers (cpu_idot_avx512.h says why). */
static inline __attribute__((always_inline)) void ia2_block(int bits, const cpu_tile_args *a,
                                                            int r0, int nr) {
    const __m256i m15 = _mm256_set1_epi16(15);
    int g = a->g, per_unit = bits == 4 ? 4 : 2;
    int64_t gbytes = (int64_t)g * CPU_PACK_ROWS * bits / 8;
    const int16_t *c = a->codes + r0 * a->ldc;
    __m256 f[IA2_ROWS][2];
    for (int r = 0; r < nr; r++)
        for (int v = 0; v < 2; v++)
            f[r][v] = _mm256_loadu_ps(a->acc + (r0 + r) * CPU_PACK_ROWS + 8 * v);
    for (int64_t gi = 0; gi < a->n_groups; gi++) {
        const uint8_t *wg = a->w + gi * gbytes;
        const int16_t *cg = c + gi * g;
        __m256i acc[IA2_ROWS][2];
        for (int r = 0; r < nr; r++) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
        for (int u = 0; u < g / per_unit; u++) {
            const uint8_t *p = wg + u * CPU_PACK_UNIT;
            const int16_t *cu = cg + u * per_unit;
            if (u % 2 == 0) _mm_prefetch((const char *)p + CPU_PREFETCH, _MM_HINT_T0);
            for (int v = 0; v < 2; v++) {
                __m256i q = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(p + 16 * v)));
                if (bits == 4) {
                    __m256i lo = _mm256_and_si256(q, m15), hi = _mm256_srli_epi16(q, 4);
                    for (int r = 0; r < nr; r++) {
                        acc[r][v] = ia2_madd(acc[r][v], lo, ia2_pair(cu + r * a->ldc));
                        acc[r][v] = ia2_madd(acc[r][v], hi, ia2_pair(cu + r * a->ldc + 2));
                    }
                } else {
                    for (int r = 0; r < nr; r++)
                        acc[r][v] = ia2_madd(acc[r][v], q, ia2_pair(cu + r * a->ldc));
                }
            }
        }
        const float *sb = a->sb + gi * 2 * CPU_PACK_ROWS;
        for (int r = 0; r < nr; r++) {
            const float *d = a->d + (r0 + r) * a->ldd, *sums = a->sums + (r0 + r) * a->ldd;
            __m256 dr = _mm256_set1_ps(d[gi]), xs = _mm256_set1_ps(sums[gi]);
            for (int v = 0; v < 2; v++) {
                __m256 sd = _mm256_mul_ps(_mm256_loadu_ps(sb + 8 * v), dr);
                f[r][v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][v]), sd, f[r][v]);
                f[r][v] = _mm256_fmadd_ps(_mm256_loadu_ps(sb + CPU_PACK_ROWS + 8 * v), xs, f[r][v]);
            }
        }
    }
    for (int r = 0; r < nr; r++)
        for (int v = 0; v < 2; v++)
            _mm256_storeu_ps(a->acc + (r0 + r) * CPU_PACK_ROWS + 8 * v, f[r][v]);
}

static inline __attribute__((always_inline)) void ia2_tile(int bits, const cpu_tile_args *a) {
    int r = 0;
    for (; r + IA2_ROWS <= a->nr; r += IA2_ROWS) ia2_block(bits, a, r, IA2_ROWS);
    for (; r < a->nr; r++) ia2_block(bits, a, r, 1);
}

static void ia2_tile4(const cpu_tile_args *a) {
    ia2_tile(4, a);
}

static void ia2_tile8(const cpu_tile_args *a) {
    ia2_tile(8, a);
}

const cpu_ikernels cpu_ikernels_avx2 = {
    .tile4 = ia2_tile4, .tile8 = ia2_tile8, .row = cpu_idot_row_own};
#endif
