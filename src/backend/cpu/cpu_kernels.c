/* Portable matmul kernels: plain C that is always correct and is the reference the SIMD
 * tables are tested against. Any bit width is read from the row's little-endian bit stream,
 * so these also serve 2, 3, 5 and 6 bits for every instruction set. */
#include "backend/cpu/cpu_internal.h"

/* Value k of a little-endian bit stream of `bits`-wide values (bits <= 8, so a value spans at
 * most two bytes; the second is read only when the value crosses into it). */
static inline unsigned cpu_bits_at(const uint8_t *w, int bits, int64_t k) {
    int64_t bit = k * bits;
    int64_t j = bit >> 3;
    int off = (int)(bit & 7);
    unsigned v = (unsigned)w[j] >> off;
    if (off + bits > 8) v |= (unsigned)w[j + 1] << (8 - off);
    return v & ((1u << bits) - 1u);
}

float cpu_qdot_bits(int bits, const uint8_t *w, const float *s, int64_t n_groups, int g,
                    const float *x) {
    float acc = 0.0f;
    for (int64_t gi = 0; gi < n_groups; gi++) {
        float t = 0.0f;
        for (int i = 0; i < g; i++) {
            int64_t k = gi * g + i;
            t += (float)cpu_bits_at(w, bits, k) * x[k];
        }
        acc += s[gi] * t;
    }
    return acc;
}

void cpu_deq_bits(int bits, const uint8_t *w, const float *s, const float *b, int64_t n_groups,
                  int g, float *dst) {
    for (int64_t gi = 0; gi < n_groups; gi++) {
        for (int i = 0; i < g; i++) {
            int64_t k = gi * g + i;
            dst[k] = s[gi] * (float)cpu_bits_at(w, bits, k) + b[gi];
        }
    }
}

static float port_dot_f32(const float *w, const float *x, int64_t k) {
    float a[4] = {0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 4 <= k; i += 4) {
        for (int j = 0; j < 4; j++) a[j] += w[i + j] * x[i + j];
    }
    for (; i < k; i++) a[0] += w[i] * x[i];
    return (a[0] + a[1]) + (a[2] + a[3]);
}

static float port_dot_f16(const uint16_t *w, const float *x, int64_t k) {
    float acc = 0.0f;
    for (int64_t i = 0; i < k; i++) acc += base_f16_to_f32(w[i]) * x[i];
    return acc;
}

static float port_dot_bf16(const uint16_t *w, const float *x, int64_t k) {
    float acc = 0.0f;
    for (int64_t i = 0; i < k; i++) acc += base_bf16_to_f32(w[i]) * x[i];
    return acc;
}

static void port_deq4(const uint8_t *w, const float *s, const float *b, int64_t n_groups, int g,
                      float *dst) {
    for (int64_t gi = 0; gi < n_groups; gi++) {
        const uint8_t *wg = w + gi * (g / 2);
        float *d = dst + gi * g;
        for (int i = 0; i < g / 2; i++) {
            d[2 * i] = s[gi] * (float)(wg[i] & 15) + b[gi];
            d[2 * i + 1] = s[gi] * (float)(wg[i] >> 4) + b[gi];
        }
    }
}

static void port_deq8(const uint8_t *w, const float *s, const float *b, int64_t n_groups, int g,
                      float *dst) {
    for (int64_t gi = 0; gi < n_groups; gi++) {
        for (int i = 0; i < g; i++) dst[gi * g + i] = s[gi] * (float)w[gi * g + i] + b[gi];
    }
}

static void port_cvt_f16(const uint16_t *src, float *dst, int64_t k) {
    for (int64_t i = 0; i < k; i++) dst[i] = base_f16_to_f32(src[i]);
}

static void port_cvt_bf16(const uint16_t *src, float *dst, int64_t k) {
    for (int64_t i = 0; i < k; i++) dst[i] = base_bf16_to_f32(src[i]);
}

static void port_gemm(int64_t n, int64_t m, int64_t k, const float *x, int64_t ldx, const float *w,
                      int64_t ldw, float *y, int64_t ldy) {
    for (int64_t i = 0; i < n; i++) {
        for (int64_t j = 0; j < m; j++) y[i * ldy + j] += port_dot_f32(w + j * ldw, x + i * ldx, k);
    }
}

const cpu_kernels cpu_kernels_portable = {
    .dot_f32 = port_dot_f32,
    .dot_f16 = port_dot_f16,
    .dot_bf16 = port_dot_bf16,
    .deq4 = port_deq4,
    .deq8 = port_deq8,
    .cvt_f16 = port_cvt_f16,
    .cvt_bf16 = port_cvt_bf16,
    .gemm = port_gemm,
};
