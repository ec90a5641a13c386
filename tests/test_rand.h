/* The tests' reproducible random numbers, for test programs and the generators beside them. */
#ifndef MLXCEL_TEST_RAND_H
#define MLXCEL_TEST_RAND_H

#include <stdint.h>

/* xorshift64 over the caller's state (seeded non-zero): reproducible test data. */
static inline uint64_t test_rand_u64(uint64_t *state) {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

static inline uint32_t test_rand_u32(uint64_t *state) {
    return (uint32_t)(test_rand_u64(state) >> 16);
}

#endif
