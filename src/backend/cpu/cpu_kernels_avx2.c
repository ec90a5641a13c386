/* AVX2 + FMA + F16C matmul kernels (8 f32 lanes). Chosen at run time only when the CPU has
 * all three; this file is compiled with those flags and nothing else may call into it.
 *
 * 4-bit: 8 bytes widened to 8 int32 lanes give values 0, 2, .., 14 (low nibbles) and 1, 3,
 * .., 15 (high nibbles), which dequantization interleaves back. The GEMM
 * micro-kernel is 3 x rows by 4 weight rows: 12 accumulators plus 4 operands fill the 16
 * vector registers without spilling. */
#if defined(__x86_64__) || defined(__i386__)
#include "backend/cpu/cpu_internal.h"

#include <immintrin.h>

static inline float a2_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __m256i a2_bytes8(const uint8_t *p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}

static inline __m256 a2_bf16(const uint16_t *p) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

static inline __m256 a2_f16(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

static float a2_dot_f32(const float *w, const float *x, int64_t k) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
    }
    float acc = a2_hsum(_mm256_add_ps(a0, a1));
    for (; i < k; i++) acc += w[i] * x[i];
    return acc;
}

static float a2_dot_f16(const uint16_t *w, const float *x, int64_t k) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        a0 = _mm256_fmadd_ps(a2_f16(w + i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(a2_f16(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
    }
    float acc = a2_hsum(_mm256_add_ps(a0, a1));
    for (; i < k; i++) acc += base_f16_to_f32(w[i]) * x[i];
    return acc;
}

static float a2_dot_bf16(const uint16_t *w, const float *x, int64_t k) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        a0 = _mm256_fmadd_ps(a2_bf16(w + i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(a2_bf16(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
    }
    float acc = a2_hsum(_mm256_add_ps(a0, a1));
    for (; i < k; i++) acc += base_bf16_to_f32(w[i]) * x[i];
    return acc;
}

static void a2_deq4(const uint8_t *w, const float *s, const float *b, int64_t n_groups, int g,
                    float *dst) {
    const __m256i m15 = _mm256_set1_epi32(15);
    for (int64_t gi = 0; gi < n_groups; gi++) {
        __m256 sv = _mm256_set1_ps(s[gi]), bv = _mm256_set1_ps(b[gi]);
        const uint8_t *wg = w + gi * (g / 2);
        float *d = dst + gi * g;
        for (int i = 0; i < g; i += 16) {
            __m256i q = a2_bytes8(wg + i / 2);
            __m256 lo = _mm256_cvtepi32_ps(_mm256_and_si256(q, m15));
            __m256 hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(q, 4));
            /* per 128-bit half: (0 1 2 3 | 8 9 10 11) and (4 5 6 7 | 12 13 14 15) */
            __m256 a = _mm256_unpacklo_ps(lo, hi), c = _mm256_unpackhi_ps(lo, hi);
            __m256 v0 = _mm256_permute2f128_ps(a, c, 0x20);
            __m256 v1 = _mm256_permute2f128_ps(a, c, 0x31);
            _mm256_storeu_ps(d + i, _mm256_fmadd_ps(v0, sv, bv));
            _mm256_storeu_ps(d + i + 8, _mm256_fmadd_ps(v1, sv, bv));
        }
    }
}

static void a2_deq8(const uint8_t *w, const float *s, const float *b, int64_t n_groups, int g,
                    float *dst) {
    for (int64_t gi = 0; gi < n_groups; gi++) {
        __m256 sv = _mm256_set1_ps(s[gi]), bv = _mm256_set1_ps(b[gi]);
        for (int i = 0; i < g; i += 8) {
            int64_t k = gi * g + i;
            __m256 q = _mm256_cvtepi32_ps(a2_bytes8(w + k));
            _mm256_storeu_ps(dst + k, _mm256_fmadd_ps(q, sv, bv));
        }
    }
}

static void a2_cvt_f16(const uint16_t *src, float *dst, int64_t k) {
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) _mm256_storeu_ps(dst + i, a2_f16(src + i));
    for (; i < k; i++) dst[i] = base_f16_to_f32(src[i]);
}

static void a2_cvt_bf16(const uint16_t *src, float *dst, int64_t k) {
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) _mm256_storeu_ps(dst + i, a2_bf16(src + i));
    for (; i < k; i++) dst[i] = base_bf16_to_f32(src[i]);
}

/* y[3 x 4 block] += x[3 rows] . w[4 rows] over k. */
static void a2_block3x4(int64_t k, const float *x, int64_t ldx, const float *w, int64_t ldw,
                        float *y, int64_t ldy) {
    __m256 c[3][4];
    for (int r = 0; r < 3; r++) {
        for (int j = 0; j < 4; j++) c[r][j] = _mm256_setzero_ps();
    }
    int64_t t = 0;
    for (; t + 8 <= k; t += 8) {
        __m256 xv[3];
        for (int r = 0; r < 3; r++) xv[r] = _mm256_loadu_ps(x + r * ldx + t);
        for (int j = 0; j < 4; j++) {
            __m256 wv = _mm256_loadu_ps(w + j * ldw + t);
            for (int r = 0; r < 3; r++) c[r][j] = _mm256_fmadd_ps(xv[r], wv, c[r][j]);
        }
    }
    for (int r = 0; r < 3; r++) {
        for (int j = 0; j < 4; j++) {
            float acc = a2_hsum(c[r][j]);
            for (int64_t u = t; u < k; u++) acc += x[r * ldx + u] * w[j * ldw + u];
            y[r * ldy + j] += acc;
        }
    }
}

static void a2_gemm(int64_t n, int64_t m, int64_t k, const float *x, int64_t ldx, const float *w,
                    int64_t ldw, float *y, int64_t ldy) {
    int64_t i = 0;
    for (; i + 3 <= n; i += 3) {
        int64_t j = 0;
        for (; j + 4 <= m; j += 4) {
            a2_block3x4(k, x + i * ldx, ldx, w + j * ldw, ldw, y + i * ldy + j, ldy);
        }
        for (; j < m; j++) {
            for (int r = 0; r < 3; r++) {
                y[(i + r) * ldy + j] += a2_dot_f32(w + j * ldw, x + (i + r) * ldx, k);
            }
        }
    }
    for (; i < n; i++) {
        for (int64_t j = 0; j < m; j++) y[i * ldy + j] += a2_dot_f32(w + j * ldw, x + i * ldx, k);
    }
}

const cpu_kernels cpu_kernels_avx2 = {
    .dot_f32 = a2_dot_f32,
    .dot_f16 = a2_dot_f16,
    .dot_bf16 = a2_dot_bf16,
    .deq4 = a2_deq4,
    .deq8 = a2_deq8,
    .cvt_f16 = a2_cvt_f16,
    .cvt_bf16 = a2_cvt_bf16,
    .gemm = a2_gemm,
};
#endif
