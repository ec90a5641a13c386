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
#define CPU_PREFETCH 1024

static void ia5_quant_x(const float *x, int64_t in, int bits, int g, int16_t *codes, float *d,
                        float *sums) {
    cpu_quant_x_span(x, in, g, bits == 4 ? (g == 32 ? 32 : 64) : 0, codes, d, sums);
}

static inline __m512i ia5_dp(__m512i acc, __m512i q, const int16_t *c) {
    return IA5_DP512(acc, q, _mm512_loadu_si512(c));
}

/* Groups of 64 or more values; bits and nr are constants where it is inlined. */
static inline void ia5_rows(int bits, const uint8_t *w, const float *s, int64_t n_groups, int g,
                            const int16_t *codes, int64_t ldc, const float *d, int64_t ldd, int nr,
                            float *out) {
    const __m512i m15 = _mm512_set1_epi16(15);
    __m512 f[CPU_IDOT_ROWS];
    for (int r = 0; r < nr; r++) f[r] = _mm512_setzero_ps();
    int64_t gbytes = (int64_t)g * bits / 8;
    for (int64_t gi = 0; gi < n_groups; gi++) {
        const uint8_t *wg = w + gi * gbytes;
        const int16_t *cg = codes + gi * g;
        _mm_prefetch((const char *)wg + CPU_PREFETCH, _MM_HINT_T0);
        __m512i a[CPU_IDOT_ROWS];
        for (int r = 0; r < nr; r++) a[r] = _mm512_setzero_si512();
        for (int i = 0; i < g; i += 64) {
            const uint8_t *p = wg + i * bits / 8;
            __m512i q0, q1;
            if (bits == 4) {
                __m512i q = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)p));
                q0 = _mm512_and_si512(q, m15);
                q1 = _mm512_srli_epi16(q, 4);
            } else {
                q0 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)p));
                q1 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(p + 32)));
            }
            for (int r = 0; r < nr; r++) {
                a[r] = ia5_dp(a[r], q0, cg + r * ldc + i);
                a[r] = ia5_dp(a[r], q1, cg + r * ldc + i + 32);
            }
        }
        for (int r = 0; r < nr; r++) {
            __m512 sd = _mm512_set1_ps(s[gi] * d[r * ldd + gi]);
            f[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[r]), sd, f[r]);
        }
    }
    for (int r = 0; r < nr; r++) out[r] = _mm512_reduce_add_ps(f[r]);
}

static inline float ia5_hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Groups of 32 values (both widths): one 256-bit step of 16 codes pairs a group. */
static inline void ia5_rows_g32(int bits, const uint8_t *w, const float *s, int64_t n_groups,
                                const int16_t *codes, int64_t ldc, const float *d, int64_t ldd,
                                int nr, float *out) {
    const __m256i m15 = _mm256_set1_epi16(15);
    __m256 f[CPU_IDOT_ROWS];
    for (int r = 0; r < nr; r++) f[r] = _mm256_setzero_ps();
    int64_t gbytes = 32 * bits / 8;
    for (int64_t gi = 0; gi < n_groups; gi++) {
        const uint8_t *wg = w + gi * gbytes;
        const int16_t *cg = codes + gi * 32;
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
            const int16_t *c = cg + r * ldc;
            __m256i a =
                IA5_DP256(_mm256_setzero_si256(), q0, _mm256_loadu_si256((const __m256i *)c));
            a = IA5_DP256(a, q1, _mm256_loadu_si256((const __m256i *)(c + 16)));
            __m256 sd = _mm256_set1_ps(s[gi] * d[r * ldd + gi]);
            f[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a), sd, f[r]);
        }
    }
    for (int r = 0; r < nr; r++) out[r] = ia5_hsum256(f[r]);
}

static inline void ia5_idot(int bits, const uint8_t *w, const float *s, int64_t n_groups, int g,
                            const int16_t *codes, int64_t ldc, const float *d, int64_t ldd, int nr,
                            float *out) {
    if (g == 32 && nr == CPU_IDOT_ROWS) {
        ia5_rows_g32(bits, w, s, n_groups, codes, ldc, d, ldd, CPU_IDOT_ROWS, out);
    } else if (g == 32) {
        ia5_rows_g32(bits, w, s, n_groups, codes, ldc, d, ldd, 1, out);
    } else if (nr == CPU_IDOT_ROWS) {
        ia5_rows(bits, w, s, n_groups, g, codes, ldc, d, ldd, CPU_IDOT_ROWS, out);
    } else {
        ia5_rows(bits, w, s, n_groups, g, codes, ldc, d, ldd, 1, out);
    }
}

static void ia5_idot4(const uint8_t *w, const float *s, int64_t n_groups, int g,
                      const int16_t *codes, int64_t ldc, const float *d, int64_t ldd, int nr,
                      float *out) {
    ia5_idot(4, w, s, n_groups, g, codes, ldc, d, ldd, nr, out);
}

static void ia5_idot8(const uint8_t *w, const float *s, int64_t n_groups, int g,
                      const int16_t *codes, int64_t ldc, const float *d, int64_t ldd, int nr,
                      float *out) {
    ia5_idot(8, w, s, n_groups, g, codes, ldc, d, ldd, nr, out);
}

const cpu_ikernels IA5_TABLE = {
    .quant_x = ia5_quant_x,
    .idot4 = ia5_idot4,
    .idot8 = ia5_idot8,
};
