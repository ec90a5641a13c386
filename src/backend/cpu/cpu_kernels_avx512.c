/* AVX-512 matmul kernels (16 f32 lanes). Chosen at run time only when the CPU has AVX-512F,
 * BW, VL and DQ; this file is compiled with those flags and nothing else may call into it.
 *
 * 4-bit: one 16-byte load holds 32 values; widening the bytes to 16 int32 lanes and taking
 * the low and high nibbles gives values 0, 2, .., 30 and 1, 3, .., 31, which dequantization
 * for the GEMM tile interleaves back. The GEMM micro-kernel computes a 4 x 4 block of dot products
 * with 16 vector accumulators and reduces each once per K block. */
#if defined(__x86_64__) || defined(__i386__)
#include "backend/cpu/cpu_internal.h"

#include <immintrin.h>

static inline __mmask16 a512_tail(int64_t r) {
    return (__mmask16)((1u << r) - 1u);
}

static inline __m512 a512_q8(const uint8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

static inline __m512 a512_bf16(__m256i v) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}

static float a512_dot_f32(const float *w, const float *x, int64_t k) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= k; i += 32) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 16), _mm512_loadu_ps(x + i + 16), a1);
    }
    for (; i < k; i += 16) {
        __mmask16 m = k - i >= 16 ? (__mmask16)0xffff : a512_tail(k - i);
        a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w + i), _mm512_maskz_loadu_ps(m, x + i), a0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

static float a512_dot_f16(const uint16_t *w, const float *x, int64_t k) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= k; i += 32) {
        __m512 w0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + i)));
        __m512 w1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + i + 16)));
        a0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + i), a0);
        a1 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + i + 16), a1);
    }
    for (; i < k; i += 16) {
        __mmask16 m = k - i >= 16 ? (__mmask16)0xffff : a512_tail(k - i);
        __m512 w0 = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, w + i));
        a0 = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(m, x + i), a0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

static float a512_dot_bf16(const uint16_t *w, const float *x, int64_t k) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= k; i += 32) {
        __m512 w0 = a512_bf16(_mm256_loadu_si256((const __m256i *)(w + i)));
        __m512 w1 = a512_bf16(_mm256_loadu_si256((const __m256i *)(w + i + 16)));
        a0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + i), a0);
        a1 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + i + 16), a1);
    }
    for (; i < k; i += 16) {
        __mmask16 m = k - i >= 16 ? (__mmask16)0xffff : a512_tail(k - i);
        __m512 w0 = a512_bf16(_mm256_maskz_loadu_epi16(m, w + i));
        a0 = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(m, x + i), a0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

static void a512_deq4(const uint8_t *w, const float *s, const float *b, int64_t n_groups, int g,
                      float *dst) {
    const __m512i m15 = _mm512_set1_epi32(15);
    const __m512i i0 = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i i1 = _mm512_add_epi32(i0, _mm512_set1_epi32(8));
    for (int64_t gi = 0; gi < n_groups; gi++) {
        __m512 sv = _mm512_set1_ps(s[gi]), bv = _mm512_set1_ps(b[gi]);
        const uint8_t *wg = w + gi * (g / 2);
        float *d = dst + gi * g;
        for (int i = 0; i < g; i += 32) {
            __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(wg + i / 2)));
            __m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(q, m15));
            __m512 hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(q, 4));
            _mm512_storeu_ps(d + i, _mm512_fmadd_ps(_mm512_permutex2var_ps(lo, i0, hi), sv, bv));
            _mm512_storeu_ps(d + i + 16,
                             _mm512_fmadd_ps(_mm512_permutex2var_ps(lo, i1, hi), sv, bv));
        }
    }
}

static void a512_deq8(const uint8_t *w, const float *s, const float *b, int64_t n_groups, int g,
                      float *dst) {
    for (int64_t gi = 0; gi < n_groups; gi++) {
        __m512 sv = _mm512_set1_ps(s[gi]), bv = _mm512_set1_ps(b[gi]);
        for (int i = 0; i < g; i += 16) {
            int64_t k = gi * g + i;
            _mm512_storeu_ps(dst + k, _mm512_fmadd_ps(a512_q8(w + k), sv, bv));
        }
    }
}

static void a512_cvt_f16(const uint16_t *src, float *dst, int64_t k) {
    for (int64_t i = 0; i < k; i += 16) {
        __mmask16 m = k - i >= 16 ? (__mmask16)0xffff : a512_tail(k - i);
        _mm512_mask_storeu_ps(dst + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, src + i)));
    }
}

static void a512_cvt_bf16(const uint16_t *src, float *dst, int64_t k) {
    for (int64_t i = 0; i < k; i += 16) {
        __mmask16 m = k - i >= 16 ? (__mmask16)0xffff : a512_tail(k - i);
        _mm512_mask_storeu_ps(dst + i, m, a512_bf16(_mm256_maskz_loadu_epi16(m, src + i)));
    }
}

/* One k step of the 4 x 4 block: 4 x loads, 4 weight loads, 16 FMAs. */
static inline void a512_step4x4(__m512 c[4][4], __mmask16 m, const float *x, int64_t ldx,
                                const float *w, int64_t ldw) {
    __m512 xv[4];
    for (int r = 0; r < 4; r++) xv[r] = _mm512_maskz_loadu_ps(m, x + r * ldx);
    for (int j = 0; j < 4; j++) {
        __m512 wv = _mm512_maskz_loadu_ps(m, w + j * ldw);
        for (int r = 0; r < 4; r++) c[r][j] = _mm512_fmadd_ps(xv[r], wv, c[r][j]);
    }
}

/* y[4 x 4 block] += x[4 rows] . w[4 rows] over k. */
static void a512_block4x4(int64_t k, const float *x, int64_t ldx, const float *w, int64_t ldw,
                          float *y, int64_t ldy) {
    __m512 c[4][4];
    for (int r = 0; r < 4; r++) {
        for (int j = 0; j < 4; j++) c[r][j] = _mm512_setzero_ps();
    }
    int64_t t = 0;
    for (; t + 16 <= k; t += 16) a512_step4x4(c, (__mmask16)0xffff, x + t, ldx, w + t, ldw);
    if (t < k) a512_step4x4(c, a512_tail(k - t), x + t, ldx, w + t, ldw);
    for (int r = 0; r < 4; r++) {
        for (int j = 0; j < 4; j++) y[r * ldy + j] += _mm512_reduce_add_ps(c[r][j]);
    }
}

static void a512_gemm(int64_t n, int64_t m, int64_t k, const float *x, int64_t ldx, const float *w,
                      int64_t ldw, float *y, int64_t ldy) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        int64_t j = 0;
        for (; j + 4 <= m; j += 4) {
            a512_block4x4(k, x + i * ldx, ldx, w + j * ldw, ldw, y + i * ldy + j, ldy);
        }
        for (; j < m; j++) {
            for (int r = 0; r < 4; r++) {
                y[(i + r) * ldy + j] += a512_dot_f32(w + j * ldw, x + (i + r) * ldx, k);
            }
        }
    }
    for (; i < n; i++) {
        for (int64_t j = 0; j < m; j++) y[i * ldy + j] += a512_dot_f32(w + j * ldw, x + i * ldx, k);
    }
}

const cpu_kernels cpu_kernels_avx512 = {
    .dot_f32 = a512_dot_f32,
    .dot_f16 = a512_dot_f16,
    .dot_bf16 = a512_dot_bf16,
    .deq4 = a512_deq4,
    .deq8 = a512_deq8,
    .cvt_f16 = a512_cvt_f16,
    .cvt_bf16 = a512_cvt_bf16,
    .gemm = a512_gemm,
};
#endif
