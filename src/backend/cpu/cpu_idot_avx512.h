/* The AVX-512 integer dots, written once for the two files that compile them: with
 * IA5_DP512 / IA5_DP256 as vpmaddwd + vpaddd (cpu_idot_avx512.c) or as vpdpwssd
 * (cpu_idot_avx512vnni.c). The int32 sums are exact either way, so both give the same bits.
 *
 * 4-bit: 32 bytes widened to 32 int16 lanes give the low nibbles (values 0, 2, .., 62) and the
 * high ones (1, 3, .., 63), so x's codes are stored per 64 values as evens then odds; groups
 * of 32 take half-width vectors instead (per 32 values, evens then odds), since a 64-value
 * step would straddle two groups. Each group's int32 lanes are scaled into f32 lanes once,
 * and the lanes are added up once a call: the same order for every row, whatever nr.
 *
 * The includer defines IA5_DP512(acc, a, b), IA5_DP256(acc, a, b) and IA5_TABLE (the name of
 * the cpu_ikernels table), and includes cpu_internal.h and immintrin.h first. */

/* The dots are compute-bound on one core, so the hardware prefetcher alone leaves the memory
 * idle between bursts; asking for the line CPU_PREFETCH bytes ahead overlaps the two. */
#define CPU_PREFETCH 2048

static void ia5_quant_x(const float *x, int64_t in, int bits, int g, int16_t *codes, float *d,
                        float *sums) {
    cpu_quant_x_span(x, in, g, bits == 4 ? (g == 32 ? 32 : 64) : 0, codes, d, sums);
}

/* Groups of 64 or more values, weight rows [j0, j0 + nw) by nr rows of x: each weight step is
 * unpacked once for the nr rows and each step of x's codes loaded once for the nw rows. Forced
 * inline so that each call site's constant bits, nw and nr unroll the loops and keep the
 * accumulators in registers (left to itself, GCC made one copy with nr a variable, spilling
 * them: half the decode speed). */
static inline __attribute__((always_inline)) void ia5_rows(int bits, const cpu_idot_args *a, int j0,
                                                           int nw, int nr, float *out) {
    const uint8_t *w = a->w + j0 * a->ldw;
    const float *s = a->s + j0 * a->lds;
    const __m512i m15 = _mm512_set1_epi16(15);
    int g = a->g;
    __m512 f[CPU_IDOT_WROWS][CPU_IDOT_ROWS];
    for (int j = 0; j < nw; j++)
        for (int r = 0; r < nr; r++) f[j][r] = _mm512_setzero_ps();
    for (int64_t gi = 0; gi < a->n_groups; gi++) {
        const int16_t *cg = a->codes + gi * g;
        __m512i acc[CPU_IDOT_WROWS][CPU_IDOT_ROWS];
        for (int j = 0; j < nw; j++) {
            _mm_prefetch((const char *)(w + j * a->ldw + gi * a->ldg) + CPU_PREFETCH, _MM_HINT_T0);
            for (int r = 0; r < nr; r++) acc[j][r] = _mm512_setzero_si512();
        }
        for (int i = 0; i < g; i += 64) {
            __m512i q0[CPU_IDOT_WROWS], q1[CPU_IDOT_WROWS];
            for (int j = 0; j < nw; j++) {
                const uint8_t *p = w + j * a->ldw + gi * a->ldg + i * bits / 8;
                if (bits == 4) {
                    __m512i q = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)p));
                    q0[j] = _mm512_and_si512(q, m15);
                    q1[j] = _mm512_srli_epi16(q, 4);
                } else {
                    q0[j] = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)p));
                    q1[j] = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(p + 32)));
                }
            }
            for (int r = 0; r < nr; r++) {
                __m512i c0 = _mm512_loadu_si512(cg + r * a->ldc + i);
                __m512i c1 = _mm512_loadu_si512(cg + r * a->ldc + i + 32);
                for (int j = 0; j < nw; j++) {
                    acc[j][r] = IA5_DP512(acc[j][r], q0[j], c0);
                    acc[j][r] = IA5_DP512(acc[j][r], q1[j], c1);
                }
            }
        }
        for (int j = 0; j < nw; j++) {
            for (int r = 0; r < nr; r++) {
                __m512 sd = _mm512_set1_ps(s[j * a->lds + gi] * a->d[r * a->ldd + gi]);
                f[j][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[j][r]), sd, f[j][r]);
            }
        }
    }
    for (int j = 0; j < nw; j++)
        for (int r = 0; r < nr; r++)
            out[(j0 + j) * CPU_IDOT_ROWS + r] = _mm512_reduce_add_ps(f[j][r]);
}

static inline float ia5_hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Groups of 32 values (both widths), weight row j: one 256-bit step of 16 codes pairs a
 * group. */
static inline __attribute__((always_inline)) void ia5_rows_g32(int bits, const cpu_idot_args *a,
                                                               int j, int nr, float *out) {
    const __m256i m15 = _mm256_set1_epi16(15);
    const uint8_t *w = a->w + j * a->ldw;
    const float *s = a->s + j * a->lds;
    __m256 f[CPU_IDOT_ROWS];
    for (int r = 0; r < nr; r++) f[r] = _mm256_setzero_ps();
    for (int64_t gi = 0; gi < a->n_groups; gi++) {
        const uint8_t *wg = w + gi * a->ldg;
        const int16_t *cg = a->codes + gi * 32;
        _mm_prefetch((const char *)wg + CPU_PREFETCH, _MM_HINT_T0);
        __m256i q0, q1;
        if (bits == 4) {
            __m256i q = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)wg));
            q0 = _mm256_and_si256(q, m15);
            q1 = _mm256_srli_epi16(q, 4);
        } else {
            q0 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)wg));
            q1 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(wg + 16)));
        }
        for (int r = 0; r < nr; r++) {
            const int16_t *c = cg + r * a->ldc;
            __m256i acc =
                IA5_DP256(_mm256_setzero_si256(), q0, _mm256_loadu_si256((const __m256i *)c));
            acc = IA5_DP256(acc, q1, _mm256_loadu_si256((const __m256i *)(c + 16)));
            __m256 sd = _mm256_set1_ps(s[gi] * a->d[r * a->ldd + gi]);
            f[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), sd, f[r]);
        }
    }
    for (int r = 0; r < nr; r++) out[j * CPU_IDOT_ROWS + r] = ia5_hsum256(f[r]);
}

static inline __attribute__((always_inline)) void ia5_idot(int bits, const cpu_idot_args *a,
                                                           float *out) {
    if (a->g == 32) {
        for (int j = 0; j < a->nw; j++) {
            if (a->nr == CPU_IDOT_ROWS) {
                ia5_rows_g32(bits, a, j, CPU_IDOT_ROWS, out);
            } else {
                ia5_rows_g32(bits, a, j, 1, out);
            }
        }
    } else if (a->nr == CPU_IDOT_ROWS) {
        /* Pairs of weight rows: a whole tile by 4 rows of x would need 32 accumulators (int32
         * and f32), all 32 registers before the operands. */
        int j = 0;
        for (; j + 2 <= a->nw; j += 2) ia5_rows(bits, a, j, 2, CPU_IDOT_ROWS, out);
        if (j < a->nw) ia5_rows(bits, a, j, 1, CPU_IDOT_ROWS, out);
    } else if (a->ldw < a->ldg && a->nw == CPU_IDOT_WROWS) {
        /* A packed tile's rows side by side: one stream, each step of x's codes loaded once
         * for the four rows, four independent accumulator chains. */
        ia5_rows(bits, a, 0, CPU_IDOT_WROWS, 1, out);
    } else {
        /* Rows apart, one at a time: with one row of x a pair of separate rows has nothing to
         * share, and each row streams on its own with its prefetch ahead of it (a pair put
         * one row's prefetch onto the other's lines when rows are 2 KiB: 8-bit decode lost a
         * third to the f32 kernels it replaced). */
        for (int j = 0; j < a->nw; j++) ia5_rows(bits, a, j, 1, 1, out);
    }
}

static void ia5_idot4(const cpu_idot_args *a, float *out) {
    ia5_idot(4, a, out);
}

static void ia5_idot8(const cpu_idot_args *a, float *out) {
    ia5_idot(8, a, out);
}

const cpu_ikernels IA5_TABLE = {
    .quant_x = ia5_quant_x,
    .idot4 = ia5_idot4,
    .idot8 = ia5_idot8,
};
