/* The tests' tiny harness: CHECK records a failure and goes on; TEST_MAIN_END prints the
 * "N passed, N failed" line ctest logs show and returns non-zero on any failure. */
#ifndef MLXCEL_TEST_H
#define MLXCEL_TEST_H

#include "test_rand.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static int test_passed, test_failed;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (cond) {                                                                                \
            test_passed++;                                                                         \
        } else {                                                                                   \
            test_failed++;                                                                         \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
        }                                                                                          \
    } while (0)

#define CHECK_MSG(cond, ...)                                                                       \
    do {                                                                                           \
        if (cond) {                                                                                \
            test_passed++;                                                                         \
        } else {                                                                                   \
            test_failed++;                                                                         \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

/* ||a - b|| / ||b|| over n floats (b all zero: ||a||). */
static inline double test_rel_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    if (num != num) return INFINITY;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Source tree root (ctest sets MLXCEL_SOURCE_DIR). */
static inline const char *test_source_dir(void) {
    const char *s = getenv("MLXCEL_SOURCE_DIR");
    return s ? s : ".";
}

/* What a test returns when it cannot run here (no device, an opt-in size): CTest's
 * SKIP_RETURN_CODE for every C test, so that it reports a skip, never a pass. */
#define TEST_SKIP 77

#define TEST_MAIN_END()                                                                            \
    do {                                                                                           \
        printf("%d passed, %d failed\n", test_passed, test_failed);                                \
        return test_failed ? 1 : 0;                                                                \
    } while (0)

#endif
