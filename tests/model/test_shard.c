/* The tensor-parallel planner (model_shard_plan) on the config of every committed fixture and
 * on configs written to hit each refusal: for 1, 2, 4 and 8 ranks either every rank's part is
 * whole and the parts cover the model exactly once (KV heads: each rank holds the heads its
 * query heads read, no more), or the plan is refused with the field named. */
#include "fixture_ref.h"

#include "model/arch/arch.h"
#include "model/model.h"

#include <string.h>

/* The parts of every rank cover [0, total) in rank order, each `each` long. */
static bool covers(const int64_t *begin, const int64_t *count, int n, int64_t total) {
    int64_t at = 0;
    for (int r = 0; r < n; r++) {
        if (begin[r] != at || count[r] != total / n) return false;
        at += count[r];
    }
    return at == total;
}

/* Every invariant of a successful plan over n ranks. */
static void check_plan(const char *name, const io_model_config *c, const model_shard *s, int n) {
    int64_t b[4][8], k[4][8];
    int H = c->num_attention_heads, KV = c->num_key_value_heads, group = H / KV;
    for (int r = 0; r < n; r++) {
        CHECK_MSG(s[r].rank == r && s[r].n_ranks == n, "%s: rank %d of %d", name, r, n);
        b[0][r] = s[r].head0, k[0][r] = s[r].n_heads;
        b[1][r] = s[r].inter0, k[1][r] = s[r].inter;
        b[2][r] = s[r].vocab0, k[2][r] = s[r].vocab;
        b[3][r] = s[r].expert0, k[3][r] = s[r].n_experts;
        /* the rank's KV heads are exactly those its query heads read */
        int first = s[r].head0 / group, last = (s[r].head0 + s[r].n_heads - 1) / group;
        CHECK_MSG(s[r].kv_head0 == first && s[r].n_kv_heads == last - first + 1,
                  "%s x%d rank %d: kv heads [%d, +%d) for query heads [%d, +%d)", name, n, r,
                  s[r].kv_head0, s[r].n_kv_heads, s[r].head0, s[r].n_heads);
        io_quant_spec q = c->quant;
        if (q.bits)
            CHECK_MSG((int64_t)s[r].n_heads * c->head_dim % q.group_size == 0,
                      "%s x%d: o_proj's part cuts a group", name, n);
    }
    CHECK_MSG(covers(b[0], k[0], n, H), "%s x%d: query heads", name, n);
    CHECK_MSG(covers(b[1], k[1], n, c->intermediate_size), "%s x%d: intermediate", name, n);
    CHECK_MSG(covers(b[2], k[2], n, c->vocab_size), "%s x%d: vocabulary", name, n);
    CHECK_MSG(covers(b[3], k[3], n, c->n_experts), "%s x%d: experts", name, n);
    /* every KV head is held somewhere, once per rank reading it */
    for (int h = 0; h < KV; h++) {
        bool held = false;
        for (int r = 0; r < n; r++)
            held |= h >= s[r].kv_head0 && h < s[r].kv_head0 + s[r].n_kv_heads;
        CHECK_MSG(held, "%s x%d: kv head %d held by no rank", name, n, h);
    }
}

/* Plans every rank; true when the plan is made (every rank agrees), else *why holds rank 0's
 * error. */
static bool plan_all(const io_model_config *c, int n, model_shard *s, char *why, size_t size) {
    base_err err;
    int ok = 0;
    for (int r = 0; r < n; r++) ok += model_shard_plan(c, n, r, &s[r], &err) == 0;
    if (ok != 0 && ok != n) snprintf(why, size, "ranks disagree");
    if (ok == 0) snprintf(why, size, "%s", err.msg);
    return ok == n;
}

/* What each fixture's plan must say, by name and rank count: NULL = made, else a part of
 * the refusal. Every fixture not listed must plan at 1 and 2 ranks. */
static const struct {
    const char *fixture;
    int n;
    const char *refusal;
} g_expect[] = {
    {"llama_bf16", 4, NULL},
    {"llama_bf16", 8, "num_attention_heads 4 does not split over 8 ranks"},
    {"llama_q4_g64", 4,
     "model.layers.0.self_attn.o_proj would be split into 32 columns per rank, not a multiple "
     "of its quantization group (64)"},
    {"llama_q8_g32", 4, NULL},
    {"olmo2_bf16", 2, "normalizes q and k over every head at once"},
    {"olmo2_bf16", 1, NULL},
    {"phi3_hd96_q4_g64", 2,
     "model.layers.0.self_attn.o_proj would be split into 96 columns per rank, not a multiple "
     "of its quantization group (64)"},
    {"phi3_hd96_q4_g64", 1, NULL},
    {"gemma3_text_bf16", 2, NULL},
    {"gemma3_text_bf16", 4, "num_attention_heads 2 does not split over 4 ranks"},
    {"qwen2_bf16", 4, NULL},
    {"qwen3_moe_bf16", 4, NULL},
    {"mixtral_bf16", 4, NULL},
    {"gpt_oss_bf16", 4, NULL},
};

static void run_fixture(const char *name, const char *dir, void *ctx) {
    (void)ctx;
    io_model_config c;
    base_err err;
    if (model_config_load(dir, &c, NULL, &err)) {
        CHECK_MSG(0, "%s: %s", name, err.msg);
        return;
    }
    model_shard s[8];
    char why[1024];
    bool listed[2] = {false, false};
    for (size_t i = 0; i < sizeof g_expect / sizeof g_expect[0]; i++) {
        if (strcmp(g_expect[i].fixture, name) != 0) continue;
        int n = g_expect[i].n;
        if (n <= 2) listed[n - 1] = true;
        bool made = plan_all(&c, n, s, why, sizeof why);
        if (!g_expect[i].refusal) {
            CHECK_MSG(made, "%s x%d: %s", name, n, why);
            if (made) check_plan(name, &c, s, n);
        } else {
            CHECK_MSG(!made && strstr(why, g_expect[i].refusal), "%s x%d: wanted '%s', got '%s'",
                      name, n, g_expect[i].refusal, made ? "a plan" : why);
        }
        printf("  %-20s x%d  %s\n", name, n, made ? "planned" : why);
    }
    for (int n = 1; n <= 2; n++) {
        if (listed[n - 1]) continue;
        bool made = plan_all(&c, n, s, why, sizeof why);
        CHECK_MSG(made, "%s x%d: %s", name, n, why);
        if (made) check_plan(name, &c, s, n);
        /* one rank is the whole model */
        if (made && n == 1)
            CHECK(s[0].n_heads == c.num_attention_heads &&
                  s[0].n_kv_heads == c.num_key_value_heads && s[0].vocab == c.vocab_size &&
                  s[0].n_experts == c.n_experts);
    }
    io_config_free(&c);
}

/* A Llama config of 8 heads, 8 KV heads (head_dim 32), intermediate `inter`, vocab `vocab`,
 * 4-bit in groups of 64, `extra` appended inside "quantization". */
static void plan_text(int inter, int vocab, const char *extra, int n, const char *refusal) {
    char text[1024];
    snprintf(text, sizeof text,
             "{\"model_type\": \"llama\", \"hidden_size\": 256, \"intermediate_size\": %d, "
             "\"num_hidden_layers\": 2, \"num_attention_heads\": 8, \"num_key_value_heads\": 8, "
             "\"vocab_size\": %d, \"rms_norm_eps\": 1e-5, \"max_position_embeddings\": 64, "
             "\"quantization\": {\"group_size\": 64, \"bits\": 4%s}}",
             inter, vocab, extra);
    io_model_config c;
    base_err err;
    if (model_config_parse(text, "test", &c, NULL, &err)) {
        CHECK_MSG(0, "config: %s", err.msg);
        return;
    }
    model_shard s[8];
    char why[1024];
    bool made = plan_all(&c, n, s, why, sizeof why);
    if (refusal)
        CHECK_MSG(!made && strstr(why, refusal), "wanted '%s', got '%s'", refusal,
                  made ? "a plan" : why);
    else
        CHECK_MSG(made, "x%d: %s", n, why);
    if (made) check_plan("synthetic", &c, s, n);
    printf("  synthetic inter %d vocab %d x%d  %s\n", inter, vocab, n, made ? "planned" : why);
    io_config_free(&c);
}

int main(void) {
    fixture_each(run_fixture, NULL);
    plan_text(512, 1024, "", 4, NULL);
    plan_text(512, 1024, "", 8, "o_proj would be split into 32 columns");
    plan_text(512, 1001, "", 2, "vocab_size 1001 does not split over 2 ranks");
    plan_text(510, 1024, "", 4, "intermediate_size 510 does not split over 4 ranks");
    /* an override's group counts for its module only */
    plan_text(768, 1024, ", \"model.layers.1.mlp.down_proj\": {\"group_size\": 128, \"bits\": 8}",
              4, "model.layers.1.mlp.down_proj would be split into 192 columns");
    plan_text(768, 1024, "", 4, NULL);
    plan_text(768, 1024, ", \"model.layers.1.mlp.down_proj\": {\"group_size\": 128, \"bits\": 8}",
              2, NULL);
    /* KV heads: 8 over 3 neither splits nor divides */
    plan_text(768, 1536, "", 3, "num_attention_heads 8 does not split over 3 ranks");
    base_err err;
    model_shard one;
    io_model_config c;
    if (model_config_parse("{\"model_type\": \"llama\", \"hidden_size\": 96, "
                           "\"intermediate_size\": 192, \"num_hidden_layers\": 1, "
                           "\"num_attention_heads\": 12, \"num_key_value_heads\": 3, "
                           "\"vocab_size\": 96, \"rms_norm_eps\": 1e-5, "
                           "\"max_position_embeddings\": 64}",
                           "test", &c, NULL, &err) == 0) {
        CHECK(model_shard_plan(&c, 2, 0, &one, &err) != 0 &&
              strstr(err.msg, "num_key_value_heads 3 neither splits over 2 ranks"));
        CHECK(model_shard_plan(&c, 2, 2, &one, &err) != 0 && strstr(err.msg, "no rank 2"));
        CHECK(model_shard_plan(&c, 6, 5, &one, &err) == 0 && one.kv_head0 == 2 &&
              one.n_kv_heads == 1 && one.head0 == 10);
        io_config_free(&c);
    } else {
        CHECK_MSG(0, "config: %s", err.msg);
    }
    TEST_MAIN_END();
}
