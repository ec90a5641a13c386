/* base: half-precision conversion, saturating arithmetic, the thread pool, error messages. */
#include "test.h"

#include "base/base.h"

#include <string.h>

/* The value of an f16 bit pattern, computed from its fields in double. */
static double f16_value(uint16_t h) {
    int sign = h >> 15, exp = (h >> 10) & 31, man = h & 1023;
    double v = exp == 0 ? ldexp(man, -24) : ldexp(1024 + man, exp - 25);
    return sign ? -v : v;
}

static void test_f16(void) {
    int bad_roundtrip = 0, bad_value = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        int exp = (h >> 10) & 31;
        float f = base_f16_to_f32((uint16_t)h);
        if (exp == 31) {
            if ((h & 1023) ? !isnan(f) : !isinf(f)) bad_value++;
            continue;
        }
        if ((double)f != f16_value((uint16_t)h)) bad_value++;
        if (base_f32_to_f16(f) != h) bad_roundtrip++;
    }
    CHECK_MSG(bad_value == 0, "%d halves decode wrongly", bad_value);
    CHECK_MSG(bad_roundtrip == 0, "%d halves do not round-trip", bad_roundtrip);
    /* ties go to even: 1 + 2^-11 is halfway between 1 and 1 + 2^-10 */
    CHECK(base_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00);
    CHECK(base_f32_to_f16(1.0f + 3 * 0x1p-11f) == 0x3c02);
    CHECK(base_f32_to_f16(65504.0f) == 0x7bff);
    CHECK(base_f32_to_f16(65520.0f) == 0x7c00); /* rounds past the largest half */
    CHECK(base_f32_to_f16(0x1p-25f) == 0x0000); /* half of the smallest subnormal: even */
    CHECK(base_f32_to_f16(0x1.8p-25f) == 0x0001);
    CHECK((base_f32_to_f16(NAN) & 0x7c00) == 0x7c00 && (base_f32_to_f16(NAN) & 0x3ff));
    /* every f32 near a random half rounds to the nearest half */
    uint32_t x = 12345;
    int bad_nearest = 0;
    for (int i = 0; i < 200000; i++) {
        x = x * 1664525u + 1013904223u;
        float f = ldexpf((float)(x >> 8) / (1 << 24), (int)(x % 30) - 15) * ((x & 1) ? -1 : 1);
        uint16_t h = base_f32_to_f16(f);
        double err = fabs(f16_value(h) - f);
        double up = fabs(f16_value((uint16_t)(h + 1)) - f);
        double down = (h & 0x7fff) ? fabs(f16_value((uint16_t)(h - 1)) - f) : INFINITY;
        if (err > up || err > down) bad_nearest++;
    }
    CHECK_MSG(bad_nearest == 0, "%d floats not rounded to the nearest half", bad_nearest);
}

static void test_bf16(void) {
    CHECK(base_f32_to_bf16(1.0f) == 0x3f80);
    CHECK(base_bf16_to_f32(0x3f80) == 1.0f);
    CHECK(base_f32_to_bf16(1.0f + 0x1p-8f) == 0x3f80);     /* tie -> even */
    CHECK(base_f32_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3f82); /* tie -> even (up) */
    CHECK(base_f32_to_bf16(1.0f + 0x1.8p-8f) == 0x3f81);   /* above the tie */
    CHECK(isnan(base_bf16_to_f32(base_f32_to_bf16(NAN))));
    CHECK(isinf(base_bf16_to_f32(base_f32_to_bf16(INFINITY))));
    float v[3] = {0};
    base_store_float(v, BASE_DTYPE_F32, 1, 2.5f);
    CHECK(base_load_float(v, BASE_DTYPE_F32, 1) == 2.5f);
    uint16_t h[2];
    base_store_float(h, BASE_DTYPE_BF16, 1, -3.0f);
    CHECK(base_load_float(h, BASE_DTYPE_BF16, 1) == -3.0f);
}

static void test_saturating(void) {
    CHECK(base_sat_add_u64(UINT64_MAX - 1, 5) == UINT64_MAX);
    CHECK(base_sat_add_u64(2, 3) == 5);
    CHECK(base_sat_sub_u64(3, 5) == 0);
    CHECK(base_sat_mul_u64(1ull << 40, 1ull << 30) == UINT64_MAX);
    CHECK(base_sat_mul_u64(1ull << 20, 1ull << 30) == 1ull << 50);
    uint64_t r;
    CHECK(!base_mul_ok_u64(1ull << 63, 2, &r));
    CHECK(base_mul_ok_u64(1ull << 62, 2, &r) && r == 1ull << 63);
}

typedef struct {
    int *hits;
} pool_ctx;

static void count_hit(void *ctx, int64_t i) {
    __atomic_add_fetch(&((pool_ctx *)ctx)->hits[i], 1, __ATOMIC_RELAXED);
}

static void test_pool(void) {
    for (int threads = 1; threads <= 4; threads++) {
        base_pool *pool = base_pool_create(threads);
        CHECK(pool && base_pool_threads(pool) == threads);
        for (int64_t n = 0; n < 40; n += 7) {
            int hits[40] = {0};
            pool_ctx ctx = {hits};
            for (int rep = 0; rep < 50; rep++) base_pool_for(pool, n, count_hit, &ctx);
            bool exact = true;
            for (int64_t i = 0; i < 40; i++) exact &= hits[i] == (i < n ? 50 : 0);
            CHECK_MSG(exact, "threads %d, n %lld: an index was not run exactly once per call",
                      threads, (long long)n);
        }
        base_pool_destroy(pool);
    }
}

static void test_errors(void) {
    base_err err;
    CHECK(base_fail(&err, "tensor %s: bad", "w") == -1 && strcmp(err.msg, "tensor w: bad") == 0);
    CHECK(base_fail_wrap(&err, "file %s", "a.st") == -1 &&
          strcmp(err.msg, "file a.st: tensor w: bad") == 0);
    char big[2000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    base_fail(&err, "%s", big);
    base_fail_wrap(&err, "prefix");
    CHECK(strncmp(err.msg, "prefix: xxx", 11) == 0 && strlen(err.msg) == sizeof err.msg - 1);
    CHECK(base_fail(NULL, "ignored") == -1);
    char *p = base_path_join("dir/", "f");
    CHECK(strcmp(p, "dir/f") == 0);
    free(p);
    p = base_path_join("dir", "f");
    CHECK(strcmp(p, "dir/f") == 0);
    free(p);
    base_dtype dt;
    CHECK(base_dtype_parse("BF16", &dt) == 0 && dt == BASE_DTYPE_BF16 && base_dtype_size(dt) == 2);
    CHECK(base_dtype_parse("F8_E4M3", &dt) == -1);
}

static void test_utf8(void) {
    char out[64];
    /* well-formed text passes unchanged */
    const char *ok = "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80";
    CHECK(base_utf8_valid(ok, strlen(ok)));
    CHECK(base_utf8_clean(out, sizeof out, ok, strlen(ok)) == strlen(ok) && strcmp(out, ok) == 0);
    /* a lone byte, an overlong form, a surrogate, past U+10FFFF, a cut sequence: each U+FFFD */
    const char *bad[] = {"demo\xE9", "\xC0\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xE2\x82"};
    const char *want[] = {
        "demo\xEF\xBF\xBD", "\xEF\xBF\xBD\xEF\xBF\xBD", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD",
        "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD", "\xEF\xBF\xBD\xEF\xBF\xBD"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK_MSG(!base_utf8_valid(bad[i], strlen(bad[i])), "case %zu", i);
        base_utf8_clean(out, sizeof out, bad[i], strlen(bad[i]));
        CHECK_MSG(strcmp(out, want[i]) == 0, "case %zu", i);
        CHECK(base_utf8_valid(out, strlen(out)));
    }
    /* too small a buffer ends the copy at a character boundary */
    CHECK(base_utf8_clean(out, 5, "ab\xE2\x82\xAC", 5) == 2 && strcmp(out, "ab") == 0);
    CHECK(base_utf8_clean(out, 6, "ab\xE2\x82\xAC", 5) == 5);
    char *d = base_utf8_dup("x\xFFy");
    CHECK(strcmp(d, "x\xEF\xBF\xBDy") == 0);
    free(d);
}

int main(void) {
    test_utf8();
    test_f16();
    test_bf16();
    test_saturating();
    test_pool();
    test_errors();
    TEST_MAIN_END();
}
