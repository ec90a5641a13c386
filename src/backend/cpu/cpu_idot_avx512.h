/* The AVX-512 integer dots, written once for the two files that compile them: with IA5_DP as
 * vpmaddwd + vpaddd (cpu_idot_avx512.c) or as vpdpwssd (cpu_idot_avx512vnni.c). The int32
 * sums are exact either way, so both give the same bits.
 *
 * A tile's unit is one vector of 16 lanes, one weight row each (cpu_internal.h): it is
 * widened once and meets IA5_ROWS rows of x, each a broadcast pair of codes, so prefill does
 * IA5_ROWS vpdpwssd a widening and its group's scaling is 4 instructions for 16 x IA5_ROWS
 * outputs. Decode (one row) keeps several int32 chains a group so that the dots do not wait
 * on each other; their sum is exact, so it gives the bits of one chain.
 *
 * The includer defines IA5_DP(acc, a, b) and IA5_TABLE (the name of the cpu_ikernels table),
 * and includes cpu_internal.h and immintrin.h first. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_idot_row.h"

/* The dots are compute-bound on one core, so the hardware prefetcher alone leaves the memory
 * idle between bursts; asking for the line CPU_PREFETCH bytes ahead overlaps the two. */
#define CPU_PREFETCH 2048
#define IA5_ROWS     8 /* rows of x a prefill block takes: 16 accumulators of 32 registers */

static inline __m512i ia5_pair(const int16_t *c) {
    int32_t v;
    memcpy(&v, c, sizeof v);
    return _mm512_set1_epi32(v);
}

/* Rows [r0, r0 + nr) of x against the tile; forced inline so that each call site's constant
 * bits and nr unroll the loops and keep the accumulators in registers (left to itself, GCC
 * made one copy with nr a variable, spilling them: half the decode speed). */
static inline __attribute__((always_inline)) void ia5_block(int bits, const cpu_tile_args *a,
                                                            int r0, int nr) {
    enum { CHAINS = 4 }; /* int32 chains a group when nr is 1 */
    const __m512i m15 = _mm512_set1_epi16(15);
    int g = a->g, per_unit = bits == 4 ? 4 : 2, nch = nr == 1 ? CHAINS : 1;
    int64_t gbytes = (int64_t)g * CPU_PACK_ROWS * bits / 8;
    const int16_t *c = a->codes + r0 * a->ldc;
    __m512 f[IA5_ROWS];
    for (int r = 0; r < nr; r++) f[r] = _mm512_loadu_ps(a->acc + (r0 + r) * CPU_PACK_ROWS);
    for (int64_t gi = 0; gi < a->n_groups; gi++) {
        const uint8_t *wg = a->w + gi * gbytes;
        const int16_t *cg = c + gi * g;
        __m512i acc[IA5_ROWS][CHAINS];
        for (int r = 0; r < nr; r++)
            for (int h = 0; h < nch; h++) acc[r][h] = _mm512_setzero_si512();
        /* two units a step: a 64-byte line, and the chain of each dot known at compile time */
        for (int u = 0; u < g / per_unit; u += 2) {
            _mm_prefetch((const char *)wg + u * CPU_PACK_UNIT + CPU_PREFETCH, _MM_HINT_T0);
            for (int h = 0; h < 2; h++) {
                const uint8_t *p = wg + (u + h) * CPU_PACK_UNIT;
                const int16_t *cu = cg + (u + h) * per_unit;
                __m512i q = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)p));
                if (bits == 4) {
                    __m512i lo = _mm512_and_si512(q, m15), hi = _mm512_srli_epi16(q, 4);
                    for (int r = 0; r < nr; r++) {
                        int c0 = (2 * h) % nch, c1 = (2 * h + 1) % nch;
                        acc[r][c0] = IA5_DP(acc[r][c0], lo, ia5_pair(cu + r * a->ldc));
                        acc[r][c1] = IA5_DP(acc[r][c1], hi, ia5_pair(cu + r * a->ldc + 2));
                    }
                } else {
                    for (int r = 0; r < nr; r++) {
                        int c0 = h % nch;
                        acc[r][c0] = IA5_DP(acc[r][c0], q, ia5_pair(cu + r * a->ldc));
                    }
                }
            }
        }
        const float *sb = a->sb + gi * 2 * CPU_PACK_ROWS;
        __m512 s = _mm512_loadu_ps(sb), b = _mm512_loadu_ps(sb + CPU_PACK_ROWS);
        for (int r = 0; r < nr; r++) {
            __m512i t = acc[r][0];
            for (int h = 1; h < nch; h++) t = _mm512_add_epi32(t, acc[r][h]);
            const float *d = a->d + (r0 + r) * a->ldd, *sums = a->sums + (r0 + r) * a->ldd;
            __m512 sd = _mm512_mul_ps(s, _mm512_set1_ps(d[gi]));
            f[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), sd, f[r]);
            f[r] = _mm512_fmadd_ps(b, _mm512_set1_ps(sums[gi]), f[r]);
        }
    }
    for (int r = 0; r < nr; r++) _mm512_storeu_ps(a->acc + (r0 + r) * CPU_PACK_ROWS, f[r]);
}

/* Blocks of IA5_ROWS rows, then of 4, then single rows: each row's chains are the same in
 * any block. */
static inline __attribute__((always_inline)) void ia5_tile(int bits, const cpu_tile_args *a) {
    int r = 0;
    for (; r + IA5_ROWS <= a->nr; r += IA5_ROWS) ia5_block(bits, a, r, IA5_ROWS);
    for (; r + 4 <= a->nr; r += 4) ia5_block(bits, a, r, 4);
    for (; r < a->nr; r++) ia5_block(bits, a, r, 1);
}

static void ia5_tile4(const cpu_tile_args *a) {
    ia5_tile(4, a);
}

static void ia5_tile8(const cpu_tile_args *a) {
    ia5_tile(8, a);
}

const cpu_ikernels IA5_TABLE = {.tile4 = ia5_tile4, .tile8 = ia5_tile8, .row = cpu_idot_row_own};
