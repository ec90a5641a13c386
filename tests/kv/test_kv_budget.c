/* The KV budget: block bytes, the decode workspace reserve, explicit and auto budgets (a
 * budget below the reserve is 0 blocks, huge values saturate), and --kv-cache-budget
 * parsing. */
#include "test.h"
#include "attn/attn.h"
#include "kv/kv.h"

#include <limits.h>
#include <string.h>

/* Llama 3 8B: 32 layers, 32 query and 8 kv heads of 128, f16, block 32. */
static const kv_geometry LLAMA3 = {32, 8, 128, 32, BASE_DTYPE_F16, 0, NULL};

static void block_counts(void) {
    uint64_t bpb = kv_bytes_per_block(&LLAMA3);
    CHECK(bpb == 2ull * 32 * 32 * 8 * 128 * 2);
    uint64_t reserve = kv_decode_reserve_bytes(&LLAMA3, 32, 64, 131072, 512);
    CHECK(reserve > 0);
    CHECK(kv_budget_blocks(reserve + 10 * bpb + bpb - 1, reserve, bpb) == 10);
    CHECK(kv_budget_blocks(reserve + 10 * bpb, reserve, bpb) == 10);
    CHECK(kv_budget_blocks(reserve + 10 * bpb - 1, reserve, bpb) == 9);
    CHECK(kv_budget_blocks(reserve, reserve, bpb) == 0);
    CHECK(kv_budget_blocks(reserve - 1, reserve, bpb) == 0);
    CHECK(kv_budget_blocks(0, reserve, bpb) == 0);
    CHECK(kv_budget_blocks(1000, 0, 0) == 0);
    /* a reserve larger than a budget of 100 blocks resolves to 0, never a wrapped count */
    CHECK(kv_budget_blocks(100 * 131072ull, 17040384, 131072) == 0);
}

static void reserve_from_geometry(void) {
    uint64_t reserve = kv_decode_reserve_bytes(&LLAMA3, 32, 64, 131072, 512);
    CHECK(reserve == attn_workspace_bytes(32, 8, 128, 32, 64, 131072, 512));
    /* The one-size reserve of 2 launches x (2 x target / kv heads + batch) chunks x 16 heads
     * per kv head is 16.25 MiB here; the real GQA ratio of 4 needs far less. */
    uint64_t worst = 2ull * (2 * 512 / 8 + 1) * (8 * 16) * (128 + 1) * 4;
    CHECK_MSG(reserve < worst / 4, "reserve %llu, worst-case %llu", (unsigned long long)reserve,
              (unsigned long long)worst);
    /* A device so wide that every decode row takes v1 needs no workspace. */
    CHECK(kv_decode_reserve_bytes(&LLAMA3, 32, 64, 131072, 8) == 0);
}

static void saturation(void) {
    kv_geometry huge = {INT_MAX, INT_MAX, INT_MAX, INT_MAX, BASE_DTYPE_F32, 0, NULL};
    CHECK(kv_bytes_per_block(&huge) == UINT64_MAX);
    kv_geometry bad = {0, 8, 128, 32, BASE_DTYPE_F16, 0, NULL};
    CHECK(kv_bytes_per_block(&bad) == 0);
    CHECK(kv_budget_blocks(UINT64_MAX, 0, 1) == INT32_MAX);
    CHECK(kv_budget_blocks(UINT64_MAX, UINT64_MAX, 1) == 0);
    CHECK(kv_budget_blocks(5, UINT64_MAX, UINT64_MAX) == 0);
    CHECK(kv_budget_auto(UINT64_MAX, 1.0, 0, 0) == UINT64_MAX);
    CHECK(kv_budget_auto(UINT64_MAX, 0.9, UINT64_MAX, UINT64_MAX) == 0);
    CHECK(kv_budget_auto(UINT64_MAX, 0.5, 0, 0) < UINT64_MAX / 2 + 4096);
    CHECK(kv_budget_auto(1000, 0.9, 1000, 0) == 0);
    uint64_t gb = 1000ull * 1000 * 1000;
    CHECK(kv_budget_auto(80 * gb, KV_BUDGET_AUTO_FRACTION, 16 * gb, gb) == 72 * gb - 17 * gb);
    CHECK(kv_budget_auto(80 * gb, 0.0, 0, 0) == 0);
    CHECK(kv_budget_auto(80 * gb, 1.5, 0, 0) == 0);
    CHECK(kv_budget_auto(80 * gb, NAN, 0, 0) == 0);
    /* the smallest context a split reaches */
    CHECK(attn_workspace_bytes(INT_MAX, 1, INT_MAX, 1, 1, 2 * ATTN_PLAN_MIN_PAGES, 1000) ==
          UINT64_MAX);
}

static void parse_ok(const char *text, bool is_auto, uint64_t bytes) {
    kv_budget_spec spec;
    base_err err = {{0}};
    int rc = kv_budget_parse("--kv-cache-budget", text, &spec, &err);
    CHECK_MSG(rc == 0 && spec.is_auto == is_auto && (is_auto || spec.bytes == bytes),
              "'%s': rc %d, auto %d, bytes %llu: %s", text, rc, spec.is_auto,
              (unsigned long long)spec.bytes, err.msg);
}

static void parse_bad(const char *text) {
    kv_budget_spec spec;
    base_err err = {{0}};
    int rc = kv_budget_parse("--kv-cache-budget", text, &spec, &err);
    CHECK_MSG(rc == -1 && strstr(err.msg, "--kv-cache-budget") != NULL, "'%s': rc %d, '%s'", text,
              rc, err.msg);
}

static void parsing(void) {
    parse_ok("auto", true, 0);
    parse_ok("0", false, 0);
    parse_ok("123456", false, 123456);
    parse_ok("4K", false, 4000);
    parse_ok("4Ki", false, 4096);
    parse_ok("3M", false, 3000000);
    parse_ok("3Mi", false, 3ull << 20);
    parse_ok("20G", false, 20000000000ull);
    parse_ok("20Gi", false, 20ull << 30);
    parse_ok("2T", false, 2000000000000ull);
    parse_ok("2Ti", false, 2ull << 40);
    parse_ok("18446744073709551615", false, UINT64_MAX);
    parse_bad("");
    parse_bad("Auto");
    parse_bad("abc");
    parse_bad("-5");
    parse_bad(" 5");
    parse_bad("1.5G");
    parse_bad("12X");
    parse_bad("12Gib");
    parse_bad("18446744073709551616");
    parse_bad("17179869184Gi");
}

int main(void) {
    block_counts();
    reserve_from_geometry();
    saturation();
    parsing();
    TEST_MAIN_END();
}
