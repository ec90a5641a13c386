/* Shared by the CPU backend tests: a seeded generator, an independent MLX bit packer, and one
 * backend per instruction set this CPU has, times thread counts 1, 2 and 3. */
#ifndef MLXCEL_TESTS_CPU_TEST_UTIL_H
#define MLXCEL_TESTS_CPU_TEST_UTIL_H

#include "backend/cpu/cpu_internal.h"
#include "test.h"

#include <string.h>

static uint64_t tu_state = 0x9e3779b97f4a7c15ull;

static inline uint64_t tu_next(void) {
    return test_rand_u64(&tu_state);
}

/* Uniform in [lo, hi), never exactly zero. */
static inline float tu_uniform(float lo, float hi) {
    float u = (float)((tu_next() >> 40) + 1) / (float)(1ull << 24);
    float v = lo + (hi - lo) * u;
    return v == 0.0f ? 1e-3f : v;
}

static inline float *tu_randf(size_t n, float lo, float hi) {
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = tu_uniform(lo, hi);
    return p;
}

/* Stores v as dtype dt at index i of p and returns the value it now holds. */
static inline float tu_store_round(void *p, base_dtype dt, size_t i, float v) {
    base_store_float(p, dt, i, v);
    return base_load_float(p, dt, i);
}

/* Writes `bits` of q at bit k * bits of a byte stream, one bit at a time. */
static inline void tu_pack(uint8_t *row, int bits, int64_t k, unsigned q) {
    for (int j = 0; j < bits; j++) {
        int64_t bit = k * bits + j;
        if ((q >> j) & 1u) row[bit / 8] |= (uint8_t)(1u << (bit % 8));
    }
}

#define TU_MAX_BACKENDS 12
#define TU_N_ISAS       4
#define TU_N_THREADS    3

typedef struct tu_backends {
    be_backend *be[TU_MAX_BACKENDS];
    const char *label[TU_MAX_BACKENDS];
    int n;
} tu_backends;

static inline bool tu_cpu_has(const char *isa) {
    if (strcmp(isa, "avx2") == 0) return cpu_isa_supported(CPU_ISA_AVX2);
    if (strcmp(isa, "avx512") == 0) return cpu_isa_supported(CPU_ISA_AVX512);
    if (strcmp(isa, "avx512vnni") == 0) return cpu_isa_supported(CPU_ISA_AVX512VNNI);
    return strcmp(isa, "portable") == 0;
}

/* Every instruction set this CPU has, each with 1 and 3 threads; checks that the forced set
 * is the one in use, so that a silent fallback cannot pass for agreement. */
static inline void tu_backends_open(tu_backends *b) {
    static const char *isas[TU_N_ISAS] = {"portable", "avx2", "avx512", "avx512vnni"};
    static const char *labels[TU_N_ISAS * TU_N_THREADS] = {
        "portable/1", "portable/2", "portable/3", "avx2/1",       "avx2/2",       "avx2/3",
        "avx512/1",   "avx512/2",   "avx512/3",   "avx512vnni/1", "avx512vnni/2", "avx512vnni/3"};
    b->n = 0;
    for (int i = 0; i < TU_N_ISAS; i++) {
        if (!tu_cpu_has(isas[i])) {
            printf("skipping %s: this CPU lacks it\n", isas[i]);
            continue;
        }
        setenv("MLXCEL_CPU_ISA", isas[i], 1);
        for (int t = 0; t < TU_N_THREADS; t++) {
            base_err err = {{0}};
            be_backend *be = NULL;
            int rc = be_cpu_create(t + 1, &be, &err);
            CHECK_MSG(rc == 0, "%s: %s", labels[TU_N_THREADS * i + t], err.msg);
            if (rc) continue;
            CHECK(strcmp(cpu_isa_name(be), isas[i]) == 0);
            CHECK(be->n_threads == t + 1);
            b->label[b->n] = labels[TU_N_THREADS * i + t];
            b->be[b->n++] = be;
        }
    }
    unsetenv("MLXCEL_CPU_ISA");
}

static inline void tu_backends_close(tu_backends *b) {
    for (int i = 0; i < b->n; i++) be_destroy(b->be[i]);
    b->n = 0;
}

#endif
