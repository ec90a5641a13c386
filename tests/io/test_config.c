/* config.json through the family descriptors: the families as their published configs spell
 * them, rope and quantization variants, and one bad field per validation rule. */
#include "io/io_test_util.h"
#include "model/arch/arch.h"

static base_err g_err;

static int parse(const char *json, io_model_config *cfg) {
    memset(&g_err, 0, sizeof g_err);
    return model_config_parse(json, "cfg.json", cfg, NULL, &g_err);
}

/* Parsing must fail with a message naming the origin and holding want (and want2). */
static void bad(const char *json, const char *want, const char *want2, int line) {
    io_model_config cfg;
    int rc = parse(json, &cfg);
    CHECK_MSG(rc == -1, "line %d: parsed", line);
    CHECK_MSG(iot_has(&g_err, "cfg.json") && iot_has(&g_err, want) &&
                  (!want2 || iot_has(&g_err, want2)),
              "line %d: %s", line, g_err.msg);
    CHECK_MSG(cfg.quant_overrides == NULL && cfg.n_quant_overrides == 0, "line %d: leaked", line);
}

#define BAD(json, want, want2) bad(json, want, want2, __LINE__)

/* Shape fields every test config shares, so each case writes only what it is about. */
#define BASE_FIELDS                                                                                \
    "\"vocab_size\": 1000, \"hidden_size\": 64, \"intermediate_size\": 128, "                      \
    "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"max_position_embeddings\": 256"
#define LLAMA(extra) "{\"model_type\": \"llama\", " BASE_FIELDS extra "}"

static const char g_llama32[] =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, "
    "\"attention_dropout\": 0.0, \"bos_token_id\": 128000, \"eos_token_id\": [128001, 128008, "
    "128009], \"head_dim\": 64, \"hidden_act\": \"silu\", \"hidden_size\": 2048, "
    "\"initializer_range\": 0.02, \"intermediate_size\": 8192, \"max_position_embeddings\": "
    "131072, \"mlp_bias\": false, \"model_type\": \"llama\", \"num_attention_heads\": 32, "
    "\"num_hidden_layers\": 16, \"num_key_value_heads\": 8, \"pretraining_tp\": 1, "
    "\"rms_norm_eps\": 1e-05, \"rope_scaling\": {\"factor\": 32.0, \"high_freq_factor\": 4.0, "
    "\"low_freq_factor\": 1.0, \"original_max_position_embeddings\": 8192, \"rope_type\": "
    "\"llama3\"}, \"rope_theta\": 500000.0, \"tie_word_embeddings\": true, \"torch_dtype\": "
    "\"bfloat16\", \"use_cache\": true, \"vocab_size\": 128256}";

static const char g_mistral[] =
    "{\"architectures\": [\"MistralForCausalLM\"], \"bos_token_id\": 1, \"eos_token_id\": 2, "
    "\"hidden_act\": \"silu\", \"hidden_size\": 4096, \"initializer_range\": 0.02, "
    "\"intermediate_size\": 14336, \"max_position_embeddings\": 32768, \"model_type\": "
    "\"mistral\", \"num_attention_heads\": 32, \"num_hidden_layers\": 32, "
    "\"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0, "
    "\"sliding_window\": 4096, \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", "
    "\"use_cache\": true, \"vocab_size\": 32000}";

static const char g_qwen2[] =
    "{\"architectures\": [\"Qwen2ForCausalLM\"], \"attention_dropout\": 0.0, \"bos_token_id\": "
    "151643, \"eos_token_id\": 151643, \"hidden_act\": \"silu\", \"hidden_size\": 896, "
    "\"initializer_range\": 0.02, \"intermediate_size\": 4864, \"max_position_embeddings\": "
    "32768, \"max_window_layers\": 24, \"model_type\": \"qwen2\", \"num_attention_heads\": 14, "
    "\"num_hidden_layers\": 24, \"num_key_value_heads\": 2, \"rms_norm_eps\": 1e-06, "
    "\"rope_theta\": 1000000.0, \"sliding_window\": 32768, \"tie_word_embeddings\": true, "
    "\"torch_dtype\": \"bfloat16\", \"use_cache\": true, \"use_sliding_window\": false, "
    "\"vocab_size\": 151936, \"quantization\": {\"group_size\": 64, \"bits\": 4}, "
    "\"quantization_config\": {\"group_size\": 64, \"bits\": 4}}";

static const char g_qwen3[] =
    "{\"architectures\": [\"Qwen3ForCausalLM\"], \"attention_bias\": false, "
    "\"attention_dropout\": 0.0, \"bos_token_id\": 151643, \"eos_token_id\": 151645, "
    "\"head_dim\": 128, \"hidden_act\": \"silu\", \"hidden_size\": 1024, "
    "\"initializer_range\": 0.02, \"intermediate_size\": 3072, \"max_position_embeddings\": "
    "40960, \"max_window_layers\": 28, \"model_type\": \"qwen3\", \"num_attention_heads\": 16, "
    "\"num_hidden_layers\": 28, \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-06, "
    "\"rope_scaling\": null, \"rope_theta\": 1000000, \"sliding_window\": null, "
    "\"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\", \"use_cache\": true, "
    "\"use_sliding_window\": false, \"vocab_size\": 151936}";

/* Phi-4-mini-instruct's config, its 48 long and short factors all written as 1 (%s twice): a
 * sliding_window past max_position_embeddings. */
static const char g_phi4_mini[] =
    "{\"architectures\": [\"Phi3ForCausalLM\"], \"attention_bias\": false, "
    "\"bos_token_id\": 199999, \"eos_token_id\": 199999, \"full_attn_mod\": 1, "
    "\"hidden_act\": \"silu\", \"hidden_size\": 3072, \"intermediate_size\": 8192, "
    "\"interpolate_factor\": 1, \"lm_head_bias\": false, \"max_position_embeddings\": 131072, "
    "\"mlp_bias\": false, \"model_type\": \"phi3\", \"num_attention_heads\": 24, "
    "\"num_hidden_layers\": 32, \"num_key_value_heads\": 8, "
    "\"original_max_position_embeddings\": 4096, \"pad_token_id\": 199999, "
    "\"partial_rotary_factor\": 0.75, \"rms_norm_eps\": 1e-05, \"rope_scaling\": "
    "{\"long_factor\": [%s], \"short_factor\": [%s], \"type\": \"longrope\"}, "
    "\"rope_theta\": 10000.0, \"sliding_window\": 262144, \"tie_word_embeddings\": true, "
    "\"torch_dtype\": \"bfloat16\", \"use_cache\": true, \"vocab_size\": 200064}";

static void test_phi_window(void) {
    char ones[48 * 3] = "1", json[sizeof g_phi4_mini + 2 * sizeof ones];
    for (int i = 1; i < 48; i++) strcat(ones, ", 1");
    snprintf(json, sizeof json, g_phi4_mini, ones, ones);
    /* A window as long as the context or longer is none: no layer is local (it would take
     * the attention kernels that serve windows for nothing). */
    io_model_config c;
    CHECK_MSG(parse(json, &c) == 0, "%s", g_err.msg);
    CHECK(strcmp(c.model_type, "phi3") == 0 && c.head_dim == 128 && c.tie_word_embeddings);
    CHECK(c.rope_scaling.type == IO_ROPE_LONGROPE && c.rotary_dim == 96);
    CHECK(c.sliding_window == 0 && c.layer_local == NULL);
    io_config_free(&c);
    CHECK(parse("{\"model_type\": \"phi3\", " BASE_FIELDS ", \"sliding_window\": 256}", &c) == 0);
    CHECK(c.sliding_window == 0 && c.layer_local == NULL);
    io_config_free(&c);
    CHECK(parse("{\"model_type\": \"phi3\", " BASE_FIELDS ", \"sliding_window\": 255}", &c) == 0);
    CHECK(c.sliding_window == 255 && c.layer_local && c.layer_local[0] && c.layer_local[1]);
    io_config_free(&c);
}

static void test_families(void) {
    io_model_config c;
    CHECK_MSG(parse(g_llama32, &c) == 0, "%s", g_err.msg);
    CHECK(strcmp(c.model_type, "llama") == 0 && strcmp(c.model_type, "llama") == 0);
    CHECK(c.vocab_size == 128256 && c.hidden_size == 2048 && c.intermediate_size == 8192);
    CHECK(c.num_hidden_layers == 16 && c.num_attention_heads == 32 && c.num_key_value_heads == 8);
    CHECK(c.head_dim == 64 && c.max_position_embeddings == 131072);
    CHECK(c.rms_norm_eps == 1e-5f && c.rope_theta == 500000.0f);
    CHECK(c.rope_scaling.type == IO_ROPE_LLAMA3 && c.rope_scaling.factor == 32.0f);
    CHECK(c.rope_scaling.low_freq_factor == 1.0f && c.rope_scaling.high_freq_factor == 4.0f);
    CHECK(c.rope_scaling.original_max_position_embeddings == 8192);
    CHECK(c.tie_word_embeddings && !c.attention_bias && !c.qk_norm && c.sliding_window == 0);
    CHECK(c.bos_token_id == 128000 && c.n_eos == 3 && c.eos_token_ids[0] == 128001 &&
          c.eos_token_ids[2] == 128009);
    CHECK(c.torch_dtype == BASE_DTYPE_BF16 && c.quant.bits == 0);
    io_config_free(&c);

    CHECK_MSG(parse(g_mistral, &c) == 0, "%s", g_err.msg);
    CHECK(strcmp(c.model_type, "mistral") == 0 && c.sliding_window == 4096 && c.head_dim == 128);
    CHECK(!c.tie_word_embeddings && !c.attention_bias && c.rope_theta == 10000.0f);
    CHECK(c.bos_token_id == 1 && c.n_eos == 1 && c.eos_token_ids[0] == 2);
    CHECK(c.rope_scaling.type == IO_ROPE_NONE);
    io_config_free(&c);

    CHECK_MSG(parse(g_qwen2, &c) == 0, "%s", g_err.msg);
    CHECK(strcmp(c.model_type, "qwen2") == 0 && c.attention_bias && !c.qk_norm);
    CHECK(c.head_dim == 64 && c.num_key_value_heads == 2 && c.tie_word_embeddings);
    CHECK(c.sliding_window == 0 && c.rms_norm_eps == 1e-6f);
    CHECK(c.quant.bits == 4 && c.quant.group_size == 64 && c.n_quant_overrides == 0);
    io_quant_spec q = io_config_quant_for(&c, "model.layers.0.mlp.down_proj");
    CHECK(q.bits == 4 && q.group_size == 64);
    io_config_free(&c);
    CHECK(c.quant_overrides == NULL);

    /* Qwen3's head_dim (128) is not hidden_size / heads (64) */
    CHECK_MSG(parse(g_qwen3, &c) == 0, "%s", g_err.msg);
    CHECK(strcmp(c.model_type, "qwen3") == 0 && c.qk_norm && !c.attention_bias);
    CHECK(c.head_dim == 128 && c.hidden_size == 1024 && c.num_attention_heads == 16);
    CHECK(c.rope_theta == 1000000.0f && c.rope_scaling.type == IO_ROPE_NONE);
    CHECK(c.sliding_window == 0 && c.bos_token_id == 151643 && c.eos_token_ids[0] == 151645);
    io_config_free(&c);

    CHECK(strcmp(model_arch_names(), "llama, mistral, qwen2, qwen3, gemma2, gemma3_text, gemma3, "
                                     "phi3, olmo2, granite, qwen3_moe, mixtral, gpt_oss") == 0);
}

static void test_defaults(void) {
    io_model_config c;
    CHECK_MSG(parse(LLAMA(""), &c) == 0, "%s", g_err.msg);
    CHECK(c.num_key_value_heads == 4 && c.head_dim == 16 && c.rope_theta == 10000.0f);
    CHECK(c.rms_norm_eps == 1e-6f && !c.tie_word_embeddings && !c.attention_bias);
    CHECK(c.bos_token_id == -1 && c.n_eos == 0 && c.torch_dtype == BASE_DTYPE_F32);
    CHECK(c.quant.bits == 0 && c.rope_scaling.type == IO_ROPE_NONE);
    io_config_free(&c);

    /* null means "default" for every optional field */
    CHECK_MSG(parse(LLAMA(", \"head_dim\": null, \"num_key_value_heads\": null, \"bos_token_id\": "
                          "null, \"eos_token_id\": null, \"rope_theta\": null, "
                          "\"rope_scaling\": null, \"quantization\": null, \"torch_dtype\": null"),
                    &c) == 0,
              "%s", g_err.msg);
    CHECK(c.head_dim == 16 && c.num_key_value_heads == 4 && c.bos_token_id == -1);
    CHECK(c.n_eos == 0 && c.rope_theta == 10000.0f && c.quant.bits == 0);
    io_config_free(&c);

    CHECK(parse(LLAMA(", \"attention_bias\": true, \"dtype\": \"float16\""), &c) == 0);
    CHECK(c.attention_bias && c.torch_dtype == BASE_DTYPE_F16);
    io_config_free(&c);
    CHECK(parse(LLAMA(", \"torch_dtype\": \"float32\", \"dtype\": \"bfloat16\""), &c) == 0);
    CHECK(c.torch_dtype == BASE_DTYPE_F32);
    io_config_free(&c);

    /* qwen2 carries biases whatever attention_bias says; mistral never does */
    CHECK(parse("{\"model_type\": \"qwen2\", " BASE_FIELDS ", \"attention_bias\": false}", &c) ==
          0);
    CHECK(c.attention_bias);
    io_config_free(&c);
    CHECK(parse("{\"model_type\": \"mistral\", " BASE_FIELDS ", \"sliding_window\": null}", &c) ==
          0);
    CHECK(c.sliding_window == 0 && !c.attention_bias);
    io_config_free(&c);
    CHECK(parse("{\"model_type\": \"qwen3\", " BASE_FIELDS ", \"attention_bias\": true}", &c) == 0);
    CHECK(c.attention_bias && c.qk_norm && c.head_dim == 16);
    io_config_free(&c);
}

static void test_rope(void) {
    io_model_config c;
    CHECK(parse(LLAMA(", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}"), &c) == 0);
    CHECK(c.rope_scaling.type == IO_ROPE_LINEAR && c.rope_scaling.factor == 2.0f);
    io_config_free(&c);
    CHECK(parse(LLAMA(", \"rope_scaling\": {\"rope_type\": \"dynamic\", \"factor\": 4}"), &c) == 0);
    CHECK(c.rope_scaling.type == IO_ROPE_DYNAMIC && c.rope_scaling.factor == 4.0f);
    io_config_free(&c);

    CHECK_MSG(parse(LLAMA(", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0, "
                          "\"original_max_position_embeddings\": 32768}"),
                    &c) == 0,
              "%s", g_err.msg);
    CHECK(c.rope_scaling.type == IO_ROPE_YARN && c.rope_scaling.factor == 4.0f);
    CHECK(c.rope_scaling.beta_fast == 32.0f && c.rope_scaling.beta_slow == 1.0f);
    CHECK(c.rope_scaling.mscale == 0 && c.rope_scaling.attention_factor == 0);
    CHECK(c.rope_scaling.original_max_position_embeddings == 32768);
    io_config_free(&c);
    CHECK(parse(LLAMA(", \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 8, \"beta_fast\": 16, "
                      "\"beta_slow\": 2, \"mscale\": 0.707, \"mscale_all_dim\": 1.0, "
                      "\"attention_factor\": 1.5}"),
                &c) == 0);
    CHECK(c.rope_scaling.beta_fast == 16.0f && c.rope_scaling.beta_slow == 2.0f);
    CHECK(c.rope_scaling.mscale == 0.707f && c.rope_scaling.mscale_all_dim == 1.0f);
    CHECK(c.rope_scaling.attention_factor == 1.5f);
    io_config_free(&c);

    /* transformers 5: rope_parameters, rope_theta inside it, "default" meaning none */
    CHECK_MSG(parse(LLAMA(", \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": "
                          "1000000.0}"),
                    &c) == 0,
              "%s", g_err.msg);
    CHECK(c.rope_scaling.type == IO_ROPE_NONE && c.rope_theta == 1000000.0f);
    io_config_free(&c);
    CHECK(parse(LLAMA(", \"rope_parameters\": {\"rope_type\": \"llama3\", \"rope_theta\": 500000, "
                      "\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
                      "\"original_max_position_embeddings\": 8192}"),
                &c) == 0);
    CHECK(c.rope_scaling.type == IO_ROPE_LLAMA3 && c.rope_theta == 500000.0f);
    CHECK(c.rope_scaling.factor == 8.0f);
    io_config_free(&c);
    CHECK(parse(LLAMA(", \"rope_theta\": 20000, \"rope_parameters\": {\"rope_type\": \"default\", "
                      "\"rope_theta\": 30000}"),
                &c) == 0);
    CHECK(c.rope_theta == 20000.0f);
    io_config_free(&c);

    BAD(LLAMA(", \"rope_scaling\": {\"rope_type\": \"longrope\", \"factor\": 2}"),
        "rope_scaling.short_factor", "missing");
    BAD(LLAMA(", \"rope_scaling\": {\"type\": \"su\", \"short_factor\": [1], "
              "\"long_factor\": [1, 2]}"),
        "rope_scaling.long_factor", "as many entries");
    BAD(LLAMA(", \"rope_scaling\": {\"type\": \"su\", \"short_factor\": [1], "
              "\"long_factor\": [2]}"),
        "short_factor", "half the rotated dims");
    BAD(LLAMA(", \"rope_scaling\": {\"type\": \"ntk\", \"factor\": 2}"), "rope_scaling.type",
        "yarn, longrope");
    BAD(LLAMA(", \"partial_rotary_factor\": 1.5"), "partial_rotary_factor", "even number");
    BAD(LLAMA(", \"rope_scaling\": {\"factor\": 2}"), "rope_scaling.rope_type", "missing");
    BAD(LLAMA(", \"rope_scaling\": {\"type\": 3}"), "rope_scaling.type", "string");
    BAD(LLAMA(", \"rope_scaling\": \"linear\""), "rope_scaling", "object");
    BAD(LLAMA(", \"rope_scaling\": {\"type\": \"linear\"}"), "rope_scaling.factor", "missing");
    BAD(LLAMA(", \"rope_scaling\": {\"type\": \"linear\", \"factor\": \"2\"}"),
        "rope_scaling.factor", "number");
    BAD(LLAMA(", \"rope_scaling\": {\"type\": \"linear\", \"factor\": -1}"), "rope_scaling.factor",
        "positive");
    BAD(LLAMA(
            ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, \"high_freq_factor\": "
            "4, \"original_max_position_embeddings\": 8192}"),
        "rope_scaling.low_freq_factor", NULL);
    BAD(LLAMA(", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": "
              "1, \"high_freq_factor\": 4}"),
        "rope_scaling.original_max_position_embeddings", NULL);
    BAD(LLAMA(", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": "
              "4, \"high_freq_factor\": 4, \"original_max_position_embeddings\": 8192}"),
        "rope_scaling.high_freq_factor", NULL);
    BAD(LLAMA(", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 8, \"beta_fast\": \"x\"}"),
        "rope_scaling.beta_fast", NULL);
    BAD(LLAMA(", \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": \"big\"}"),
        "rope_parameters.rope_theta", NULL);
    BAD(LLAMA(", \"rope_theta\": 0"), "'rope_theta'", "positive");
}

static void test_quantization(void) {
    io_model_config c;
    CHECK_MSG(parse(LLAMA(", \"quantization\": {\"group_size\": 64, \"bits\": 4, \"mode\": "
                          "\"affine\", \"model.layers.1.mlp.down_proj\": {\"group_size\": 32, "
                          "\"bits\": 8}, \"model.layers.0.self_attn.v_proj\": {\"bits\": 6}, "
                          "\"lm_head\": false}"),
                    &c) == 0,
              "%s", g_err.msg);
    CHECK(c.quant.bits == 4 && c.quant.group_size == 64 && c.n_quant_overrides == 3);
    io_quant_spec q = io_config_quant_for(&c, "model.layers.1.mlp.down_proj");
    CHECK(q.bits == 8 && q.group_size == 32);
    q = io_config_quant_for(&c, "model.layers.0.self_attn.v_proj");
    CHECK(q.bits == 6 && q.group_size == 64);
    q = io_config_quant_for(&c, "lm_head");
    CHECK(q.bits == 0);
    q = io_config_quant_for(&c, "model.layers.0.mlp.down_proj");
    CHECK(q.bits == 4 && q.group_size == 64 && q.mode == IO_QUANT_AFFINE);
    io_config_free(&c);

    /* MXFP4: globally, or per module beside affine ones (mlx-community's MXFP4-Q8). */
    CHECK_MSG(parse(LLAMA(", \"quantization\": {\"group_size\": 64, \"bits\": 8, "
                          "\"model.layers.0.mlp.up_proj\": {\"group_size\": 32, \"bits\": 4, "
                          "\"mode\": \"mxfp4\"}}"),
                    &c) == 0,
              "%s", g_err.msg);
    q = io_config_quant_for(&c, "model.layers.0.mlp.up_proj");
    CHECK(q.bits == 4 && q.group_size == 32 && q.mode == IO_QUANT_MXFP4);
    q = io_config_quant_for(&c, "model.layers.0.mlp.down_proj");
    CHECK(q.bits == 8 && q.mode == IO_QUANT_AFFINE);
    io_config_free(&c);
    CHECK_MSG(parse(LLAMA(", \"quantization\": {\"group_size\": 32, \"bits\": 4, "
                          "\"mode\": \"mxfp4\"}"),
                    &c) == 0,
              "%s", g_err.msg);
    CHECK(c.quant.mode == IO_QUANT_MXFP4);
    io_config_free(&c);
    /* what mlx-lm's convert --q-mode mxfp4 writes for GPT-OSS: an entry without a mode (the
     * 8-bit router) is affine, not the default's mxfp4 */
    CHECK_MSG(parse(LLAMA(", \"quantization\": {\"group_size\": 32, \"bits\": 4, \"mode\": "
                          "\"mxfp4\", \"model.layers.0.mlp.router\": {\"group_size\": 64, "
                          "\"bits\": 8}}"),
                    &c) == 0,
              "%s", g_err.msg);
    q = io_config_quant_for(&c, "model.layers.0.mlp.router");
    CHECK(q.bits == 8 && q.group_size == 64 && q.mode == IO_QUANT_AFFINE);
    q = io_config_quant_for(&c, "model.layers.0.self_attn.q_proj");
    CHECK(q.bits == 4 && q.group_size == 32 && q.mode == IO_QUANT_MXFP4);
    io_config_free(&c);

    /* an override's missing field falls back to the default spec */
    CHECK(parse(LLAMA(", \"quantization\": {\"group_size\": 128, \"bits\": 8, \"lm_head\": "
                      "{\"group_size\": 32}}"),
                &c) == 0);
    q = io_config_quant_for(&c, "lm_head");
    CHECK(q.bits == 8 && q.group_size == 32);
    io_config_free(&c);

    /* quantization_config is read only when quantization is absent */
    CHECK(parse(LLAMA(", \"quantization_config\": {\"group_size\": 128, \"bits\": 3}"), &c) == 0);
    CHECK(c.quant.bits == 3 && c.quant.group_size == 128);
    io_config_free(&c);
    CHECK(parse(LLAMA(", \"quantization\": {\"group_size\": 32, \"bits\": 2}, "
                      "\"quantization_config\": {\"group_size\": 128, \"bits\": 3}"),
                &c) == 0);
    CHECK(c.quant.bits == 2 && c.quant.group_size == 32);
    io_config_free(&c);
    for (int bits = 1; bits <= 9; bits++) {
        char buf[512];
        snprintf(buf, sizeof buf, LLAMA(", \"quantization\": {\"group_size\": 64, \"bits\": %d}"),
                 bits);
        bool want_ok = bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8;
        CHECK_MSG((parse(buf, &c) == 0) == want_ok, "bits %d", bits);
        CHECK(want_ok || iot_has(&g_err, "quantization.bits"));
        io_config_free(&c);
    }

    BAD(LLAMA(", \"quantization\": {\"group_size\": 16, \"bits\": 4}"), "quantization.group_size",
        "16");
    BAD(LLAMA(", \"quantization\": {\"bits\": 4}"), "quantization.group_size", "missing");
    BAD(LLAMA(", \"quantization\": {\"group_size\": 64, \"bits\": \"4\"}"), "quantization.bits",
        "integer");
    BAD(LLAMA(
            ", \"quantization\": {\"group_size\": 64, \"bits\": 4, \"model.layers.1.mlp.up_proj\": "
            "{\"bits\": 7}}"),
        "quantization.model.layers.1.mlp.up_proj.bits", NULL);
    BAD(LLAMA(", \"quantization\": {\"group_size\": 64, \"bits\": 4, \"lm_head\": false, "
              "\"model.layers.1.mlp.up_proj\": {\"group_size\": 48}}"),
        "up_proj.group_size", NULL);
    BAD(LLAMA(", \"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 4, "
              "\"group_size\": 128}"),
        "quantization_config.quant_method", NULL);
    BAD(LLAMA(", \"quantization\": [4, 64]"), "'quantization'", "object");
    BAD(LLAMA(", \"quantization\": {\"group_size\": 64, \"bits\": 4, \"mode\": \"mxfp4\"}"),
        "mxfp4 has 4 and 32", NULL);
    BAD(LLAMA(", \"quantization\": {\"group_size\": 32, \"bits\": 4, \"mode\": \"nvfp4\"}"),
        "'nvfp4'", "not implemented yet");
    BAD(LLAMA(", \"quantization\": {\"group_size\": 64, \"bits\": 4, "
              "\"model.layers.0.mlp.up_proj\": {\"mode\": \"fp3\"}}"),
        "up_proj.mode", "supported affine, mxfp4");
}

static void test_bad_fields(void) {
    BAD("{\"model_type\": \"gemma7\", " BASE_FIELDS "}", "gemma7", model_arch_names());
    BAD("{" BASE_FIELDS "}", "model_type", "missing");
    BAD("{\"model_type\": 5, " BASE_FIELDS "}", "model_type", "string");
    BAD("{\"model_type\": \"llama\", \"vocab_size\": 9, \"hidden_size\": \"64\"}", "'hidden_size'",
        "integer");
    BAD("{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 128, "
        "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"max_position_embeddings\": 8}",
        "'vocab_size'", "missing");
    BAD(LLAMA(", \"vocab_size\": 0"), "cfg.json: line", NULL); /* duplicate key */
    BAD("{\"model_type\": \"llama\", \"vocab_size\": 0, \"hidden_size\": 64}", "'vocab_size'",
        "positive");
    BAD("{\"model_type\": \"llama\", \"vocab_size\": 10, \"hidden_size\": 64, "
        "\"intermediate_size\": "
        "128, \"num_hidden_layers\": 2, \"num_attention_heads\": -4}",
        "'num_attention_heads'", "positive");
    BAD("{\"model_type\": \"llama\", \"vocab_size\": 10, \"hidden_size\": 64, "
        "\"intermediate_size\": "
        "128, \"num_hidden_layers\": 3000000000}",
        "'num_hidden_layers'", "range");
    BAD("{\"model_type\": \"llama\", \"vocab_size\": 10.5}", "'vocab_size'", "integer");
    BAD(LLAMA(", \"num_key_value_heads\": 3"), "num_key_value_heads", "divide");
    BAD(LLAMA(", \"num_key_value_heads\": 0"), "num_key_value_heads", "positive");
    BAD(LLAMA(", \"head_dim\": 15"), "head_dim", "even");
    BAD(LLAMA(", \"head_dim\": \"16\""), "head_dim", "integer");
    BAD("{\"model_type\": \"llama\", \"vocab_size\": 1000, \"hidden_size\": 66, "
        "\"intermediate_size\": 128, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
        "\"max_position_embeddings\": 256}",
        "head_dim", "hidden_size (66)");
    BAD(LLAMA(", \"rms_norm_eps\": \"1e-6\""), "rms_norm_eps", "number");
    BAD(LLAMA(", \"rms_norm_eps\": 0"), "rms_norm_eps", "positive");
    BAD(LLAMA(", \"tie_word_embeddings\": \"yes\""), "tie_word_embeddings", "true or false");
    BAD(LLAMA(", \"attention_bias\": 1"), "attention_bias", "true or false");
    BAD(LLAMA(", \"bos_token_id\": \"1\""), "bos_token_id", "integer");
    BAD(LLAMA(", \"eos_token_id\": \"2\""), "eos_token_id", "list");
    BAD(LLAMA(", \"eos_token_id\": [2, \"3\"]"), "eos_token_id", "integers");
    BAD(LLAMA(", \"eos_token_id\": [1, 2, 3, 4, 5, 6, 7, 8, 9]"), "eos_token_id", "9 ids");
    BAD(LLAMA(", \"torch_dtype\": 16"), "torch_dtype", "string");
    BAD(LLAMA(", \"torch_dtype\": \"float8_e4m3fn\""), "torch_dtype", "float8_e4m3fn");
    BAD(LLAMA(", \"dtype\": \"int8\""), "'dtype'", "int8");
    BAD("{\"model_type\": \"mistral\", " BASE_FIELDS ", \"sliding_window\": -1}", "sliding_window",
        "negative");
    BAD("{\"model_type\": \"mistral\", " BASE_FIELDS ", \"sliding_window\": \"4k\"}",
        "sliding_window", "integer");
    BAD("{\"model_type\": \"qwen2\", " BASE_FIELDS ", \"use_sliding_window\": true}",
        "use_sliding_window", "not supported");
    BAD("{\"model_type\": \"llama\", ", "cfg.json: line 1", NULL);
    BAD("[1]", "JSON object", NULL);
    BAD("", "cfg.json", NULL);
}

static void test_load(void) {
    char dir[64];
    iot_mkdtemp(dir);
    char *p = base_path_join(dir, "config.json");
    io_model_config c;
    base_err err = {{0}};
    CHECK(model_config_load(dir, &c, NULL, &err) == -1 && iot_has(&err, p));
    iot_write_bytes(p, g_qwen3, strlen(g_qwen3));
    CHECK_MSG(model_config_load(dir, &c, NULL, &err) == 0, "%s", err.msg);
    CHECK(strcmp(c.model_type, "qwen3") == 0 && c.head_dim == 128);
    io_config_free(&c);
    iot_write_bytes(p, "{\"model_type\": \"phi9\"}", 22);
    CHECK(model_config_load(dir, &c, NULL, &err) == -1 && iot_has(&err, p) &&
          iot_has(&err, "phi9"));
    free(p);
    iot_rm_tree(dir);
}

/* Every prefix and random byte flips of a real config: no crash, no leak of half state. */
static void test_corruption(void) {
    size_t len = strlen(g_llama32);
    char *buf = malloc(len + 1);
    io_model_config c;
    int parsed = 0;
    for (size_t n = 0; n < len; n++) {
        memcpy(buf, g_llama32, n);
        buf[n] = 0;
        if (parse(buf, &c) == 0) parsed++;
        io_config_free(&c);
    }
    CHECK_MSG(parsed == 0, "%d prefixes parsed", parsed);
    uint64_t seed = 7;
    for (int it = 0; it < 3000; it++) {
        memcpy(buf, g_llama32, len + 1);
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        buf[(seed >> 33) % len] = (char)((seed >> 17) & 0x7f ? (seed >> 17) & 0x7f : ' ');
        if (parse(buf, &c) == 0) {
            CHECK(c.num_attention_heads % c.num_key_value_heads == 0 && c.head_dim % 2 == 0);
        }
        io_config_free(&c);
    }
    free(buf);
}

int main(void) {
    test_families();
    test_phi_window();
    test_defaults();
    test_rope();
    test_quantization();
    test_bad_fields();
    test_load();
    test_corruption();
    TEST_MAIN_END();
}
