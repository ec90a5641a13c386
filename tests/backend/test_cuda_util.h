/* Helpers shared by the CUDA backend tests: the skip rule, random data, and moving float
 * arrays to and from device tensors of any float dtype. */
#ifndef MLXCEL_TEST_CUDA_UTIL_H
#define MLXCEL_TEST_CUDA_UTIL_H

#include "backend/backend.h"
#include "test.h"

#include <stdint.h>
#include <string.h>

/* The CUDA backend, or NULL after printing the skip line when no device can be used. */
static inline be_backend *tc_backend(void) {
    be_backend *be = NULL;
    base_err err = {{0}};
    if (be_cuda_create(0, &be, &err) != 0) {
        printf("skipped: no CUDA device (%s)\n", err.msg);
        return NULL;
    }
    return be;
}

static uint64_t tc_rng_state = 0x9e3779b97f4a7c15ull;

static inline uint32_t tc_u32(void) {
    tc_rng_state ^= tc_rng_state << 13;
    tc_rng_state ^= tc_rng_state >> 7;
    tc_rng_state ^= tc_rng_state << 17;
    return (uint32_t)(tc_rng_state >> 16);
}

/* Uniform in [-1, 1). */
static inline float tc_uniform(void) {
    return (float)(tc_u32() & 0xffffff) / 8388608.0f - 1.0f;
}

static inline void tc_fill(float *x, size_t n, float amp) {
    for (size_t i = 0; i < n; i++) x[i] = amp * tc_uniform();
}

/* Rounds x to dtype dt in place, so that references see exactly what the device sees. */
static inline void tc_round(float *x, size_t n, base_dtype dt) {
    for (size_t i = 0; i < n; i++) {
        if (dt == BASE_DTYPE_F16) x[i] = base_f16_to_f32(base_f32_to_f16(x[i]));
        if (dt == BASE_DTYPE_BF16) x[i] = base_bf16_to_f32(base_f32_to_bf16(x[i]));
    }
}

static inline void *tc_dev_bytes(be_backend *be, const void *host, size_t bytes) {
    void *d = NULL;
    base_err err = {{0}};
    if (be->ops->alloc(be, bytes, &d, &err) || be->ops->upload(be, d, host, bytes, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    return d;
}

/* A device tensor of dtype dt holding x (rows x cols floats); caller frees .data. */
static inline be_tensor tc_tensor(be_backend *be, const float *x, base_dtype dt, int64_t rows,
                                  int64_t cols) {
    size_t n = (size_t)(rows * cols);
    void *h = malloc(n * base_dtype_size(dt) + 1);
    for (size_t i = 0; i < n; i++) base_store_float(h, dt, i, x[i]);
    be_tensor t = {tc_dev_bytes(be, h, n * base_dtype_size(dt) + 1), dt, rows, cols};
    free(h);
    return t;
}

/* A device tensor whose bytes are all 0xff (NaN in every float dtype): outputs start there,
 * so an element the op forgets to write fails the comparison. */
static inline be_tensor tc_poisoned(be_backend *be, base_dtype dt, int64_t rows, int64_t cols) {
    size_t bytes = (size_t)(rows * cols) * base_dtype_size(dt);
    void *h = malloc(bytes + 1);
    memset(h, 0xff, bytes + 1);
    be_tensor t = {tc_dev_bytes(be, h, bytes + 1), dt, rows, cols};
    free(h);
    return t;
}

/* The tensor's values as floats (caller frees). */
static inline float *tc_read(be_backend *be, const be_tensor *t) {
    size_t n = (size_t)(t->rows * t->cols), bytes = n * base_dtype_size(t->dtype);
    void *h = malloc(bytes + 1);
    float *out = malloc(n * sizeof(float) + 1);
    base_err err = {{0}};
    if (be->ops->sync(be, &err) || be->ops->download(be, h, t->data, bytes, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    for (size_t i = 0; i < n; i++) out[i] = base_load_float(h, t->dtype, i);
    free(h);
    return out;
}

/* Relative error of the device tensor against a double-precision reference. */
static inline double tc_err(be_backend *be, const be_tensor *t, const double *ref) {
    size_t n = (size_t)(t->rows * t->cols);
    float *got = tc_read(be, t);
    float *r = malloc(n * sizeof(float) + 1);
    for (size_t i = 0; i < n; i++) r[i] = (float)ref[i];
    double e = test_rel_err(got, r, n);
    free(got);
    free(r);
    return e;
}

/* Tolerance for an output stored in dt: its rounding, with room for F32 accumulation. */
static inline double tc_tol(base_dtype dt) {
    return dt == BASE_DTYPE_F32 ? 1e-5 : (dt == BASE_DTYPE_F16 ? 2e-3 : 1e-2);
}

#endif
