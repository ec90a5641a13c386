/* dtypes, half-precision conversion, saturating arithmetic, hashing. */
#include "base/base.h"

#include <math.h>
#include <string.h>

static const struct {
    const char *name;
    size_t size;
} g_dtypes[BASE_DTYPE_COUNT] = {
    [BASE_DTYPE_F32] = {"F32", 4},   [BASE_DTYPE_F16] = {"F16", 2}, [BASE_DTYPE_BF16] = {"BF16", 2},
    [BASE_DTYPE_F64] = {"F64", 8},   [BASE_DTYPE_I8] = {"I8", 1},   [BASE_DTYPE_U8] = {"U8", 1},
    [BASE_DTYPE_I16] = {"I16", 2},   [BASE_DTYPE_U16] = {"U16", 2}, [BASE_DTYPE_I32] = {"I32", 4},
    [BASE_DTYPE_U32] = {"U32", 4},   [BASE_DTYPE_I64] = {"I64", 8}, [BASE_DTYPE_U64] = {"U64", 8},
    [BASE_DTYPE_BOOL] = {"BOOL", 1},
};

size_t base_dtype_size(base_dtype dt) {
    return (unsigned)dt < BASE_DTYPE_COUNT ? g_dtypes[dt].size : 0;
}

const char *base_dtype_name(base_dtype dt) {
    return (unsigned)dt < BASE_DTYPE_COUNT ? g_dtypes[dt].name : "?";
}

int base_dtype_parse(const char *name, base_dtype *out) {
    for (int i = 0; i < BASE_DTYPE_COUNT; i++) {
        if (strcmp(name, g_dtypes[i].name) == 0) {
            *out = (base_dtype)i;
            return 0;
        }
    }
    return -1;
}

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float base_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24 */
        float v = (float)man * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    if (exp == 31) return bits_f32(sign | 0x7f800000u | (man << 13));
    return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t base_f32_to_f16(float f) {
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return sign | (ax > 0x7f800000u ? 0x7e00 : 0x7c00);
    if (ax >= 0x477ff000u) return sign | 0x7c00; /* rounds past the largest half: inf */
    if (ax < 0x38800000u) {
        /* subnormal half: scale so that the rounding of the float add does the work */
        float v = bits_f32(ax) + 0.5f;
        return sign | (uint16_t)(f32_bits(v) - 0x3f000000u);
    }
    uint32_t mant_odd = (ax >> 13) & 1;
    ax += 0xc8000fffu + mant_odd; /* rebias exponent (-112 << 23) and round to nearest even */
    return sign | (uint16_t)(ax >> 13);
}

float base_bf16_to_f32(uint16_t b) {
    return bits_f32((uint32_t)b << 16);
}

uint16_t base_f32_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fffu + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

float base_load_float(const void *data, base_dtype dt, size_t i) {
    switch (dt) {
    case BASE_DTYPE_F32:
        return ((const float *)data)[i];
    case BASE_DTYPE_F16:
        return base_f16_to_f32(((const uint16_t *)data)[i]);
    case BASE_DTYPE_BF16:
        return base_bf16_to_f32(((const uint16_t *)data)[i]);
    case BASE_DTYPE_F64:
        return (float)((const double *)data)[i];
    default:
        return NAN;
    }
}

void base_store_float(void *data, base_dtype dt, size_t i, float v) {
    switch (dt) {
    case BASE_DTYPE_F32:
        ((float *)data)[i] = v;
        break;
    case BASE_DTYPE_F16:
        ((uint16_t *)data)[i] = base_f32_to_f16(v);
        break;
    case BASE_DTYPE_BF16:
        ((uint16_t *)data)[i] = base_f32_to_bf16(v);
        break;
    case BASE_DTYPE_F64:
        ((double *)data)[i] = v;
        break;
    default:
        break;
    }
}

uint64_t base_sat_add_u64(uint64_t a, uint64_t b) {
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

uint64_t base_sat_sub_u64(uint64_t a, uint64_t b) {
    return a > b ? a - b : 0;
}

uint64_t base_sat_mul_u64(uint64_t a, uint64_t b) {
    uint64_t r;
    return base_mul_ok_u64(a, b, &r) ? r : UINT64_MAX;
}

bool base_mul_ok_u64(uint64_t a, uint64_t b, uint64_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}

uint64_t base_hash64(uint64_t seed, const void *data, size_t len) {
    const unsigned char *p = data;
    uint64_t h = seed;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}
