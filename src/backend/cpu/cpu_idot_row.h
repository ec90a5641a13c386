/* One weight row in the linear's own layout against one row of x's codes (cpu_ikernels.row),
 * written once in plain loops that each instruction set's file compiles (and vectorizes) with
 * its own flags; fmaf becomes that set's fused multiply-add, or the C library's, which rounds
 * the same. The includer includes cpu_internal.h and math.h first. */

/* Exact int32 dots of one group in the linear's own layout; plain loops that the compiler
 * vectorizes. */
static inline int32_t own_dot4(const uint8_t *w, const int16_t *c, int g) {
    int16_t q[128]; /* the largest group, unpacked first: as one loop it did not vectorize */
    for (int i = 0; i < g / 2; i++) {
        q[2 * i] = (int16_t)(w[i] & 15u);
        q[2 * i + 1] = (int16_t)(w[i] >> 4);
    }
    int32_t t = 0;
    for (int i = 0; i < g; i++) t += (int32_t)q[i] * c[i];
    return t;
}

static inline int32_t own_dot8(const uint8_t *w, const int16_t *c, int g) {
    int32_t t = 0;
    for (int i = 0; i < g; i++) t += (int32_t)w[i] * c[i];
    return t;
}

static void cpu_idot_row_own(int bits, const uint8_t *w, const float *s, const float *b,
                             const int16_t *codes, const float *d, const float *sums,
                             int64_t n_groups, int g, float *acc) {
    float a = *acc;
    for (int64_t gi = 0; gi < n_groups; gi++) {
        const int16_t *c = codes + gi * g;
        int32_t t = bits == 4 ? own_dot4(w + gi * g / 2, c, g) : own_dot8(w + gi * g, c, g);
        a = fmaf((float)t, s[gi] * d[gi], a);
        a = fmaf(b[gi], sums[gi], a);
    }
    *acc = a;
}
