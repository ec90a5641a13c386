/* Gemma 2 and Gemma 3 (text, and the text half of mlx-vlm's vision-language checkpoints):
 * RMSNorm scaling by (1 + w), a norm before and after each block, GELU-tanh MLP, the embedding
 * times sqrt(hidden), scores scaled by query_pre_attn_scalar^-1/2, soft-capped scores and logits
 * (Gemma 2), per-head q/k norm and a local RoPE base (Gemma 3), local layers in a fixed pattern:
 * every other layer (Gemma 2), five of six (Gemma 3). */
#include "model/arch/arch.h"

#include <math.h>

/* Only the tanh approximation: transformers' Gemma configs all name it, and exact GELU would
 * need another activation kernel. */
static int read_act(const io_cfg_at *at, io_model_config *cfg) {
    bool tanh_gelu;
    if (io_cfg_str_is(at, "hidden_activation", "gelu_pytorch_tanh", &tanh_gelu)) return -1;
    if (!tanh_gelu) return io_cfg_fail(at, "hidden_activation", "must be gelu_pytorch_tanh");
    cfg->act = IO_ACT_GELU_TANH;
    return 0;
}

static int gemma_common(const io_cfg_at *at, io_model_config *cfg) {
    float pre_attn;
    if (read_act(at, cfg) || io_cfg_pos_float(at, "query_pre_attn_scalar", 256, &pre_attn) ||
        io_cfg_float(at, "attn_logit_softcapping", 0, &cfg->attn_softcap) ||
        io_cfg_float(at, "final_logit_softcapping", 0, &cfg->final_softcap))
        return -1;
    if (cfg->attn_softcap < 0 || cfg->final_softcap < 0)
        return io_cfg_fail(at, "attn_logit_softcapping",
                           "and final_logit_softcapping must not "
                           "be negative");
    cfg->norm_plus_one = true;
    cfg->embed_scale = sqrtf((float)cfg->hidden_size);
    cfg->attn_scale = 1.0f / sqrtf(pre_attn);
    return 0;
}

static int gemma2_configure(const io_cfg_at *at, io_model_config *cfg) {
    return gemma_common(at, cfg) || arch_window_pattern(at, cfg, 2);
}

static int gemma3_configure(const io_cfg_at *at, io_model_config *cfg) {
    int period;
    if (gemma_common(at, cfg) || io_cfg_pos_int(at, "sliding_window_pattern", 6, &period) ||
        arch_window_pattern(at, cfg, period))
        return -1;
    cfg->qk_norm = IO_QK_NORM_HEAD;
    /* transformers 5 writes the local table under rope_parameters (read by io_config); 4 wrote
     * its base alone, the local layers taking plain RoPE. */
    if (cfg->rope_local_theta == 0) {
        if (io_cfg_pos_float(at, "rope_local_base_freq", 10000, &cfg->rope_local_theta)) return -1;
        cfg->rope_local_scaling = (io_rope_scaling){.type = IO_ROPE_NONE};
    }
    return 0;
}

#define GEMMA_NAMES(pfx)                                                                           \
    {                                                                                              \
        .prefix = pfx, .attn_norm = "input_layernorm",                                             \
        .post_attn_norm = "post_attention_layernorm", .mlp_norm = "pre_feedforward_layernorm",     \
        .post_mlp_norm = "post_feedforward_layernorm"                                              \
    }

const model_arch arch_gemma2 = {
    .model_type = "gemma2",
    .summary = "Gemma 2: soft-capped scores and logits, local layers every other layer, "
               "GELU-tanh only; on CUDA a decode row of a local layer is not split over the "
               "context",
    .defaults = "{\"head_dim\": 256, \"hidden_activation\": \"gelu_pytorch_tanh\", "
                "\"query_pre_attn_scalar\": 256, \"attn_logit_softcapping\": 50.0, "
                "\"final_logit_softcapping\": 30.0, \"sliding_window\": 4096, "
                "\"rms_norm_eps\": 1e-6, \"max_position_embeddings\": 8192, "
                "\"tie_word_embeddings\": true, \"bos_token_id\": 2, \"eos_token_id\": 1}",
    .configure = gemma2_configure,
    .names = GEMMA_NAMES("model."),
};

/* Gemma3TextConfig's defaults: Google's configs leave most of them out. */
#define GEMMA3_DEFAULTS                                                                            \
    "{\"vocab_size\": 262208, \"hidden_size\": 2304, \"intermediate_size\": 9216, "                \
    "\"num_hidden_layers\": 26, \"num_attention_heads\": 8, \"num_key_value_heads\": 4, "          \
    "\"head_dim\": 256, \"hidden_activation\": \"gelu_pytorch_tanh\", "                            \
    "\"max_position_embeddings\": 131072, \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000.0, "     \
    "\"query_pre_attn_scalar\": 256, \"sliding_window\": 4096, \"rope_local_base_freq\": "         \
    "10000.0, "                                                                                    \
    "\"sliding_window_pattern\": 6, \"tie_word_embeddings\": true, \"bos_token_id\": 2, "          \
    "\"eos_token_id\": 1}"

const model_arch arch_gemma3_text = {
    .model_type = "gemma3_text",
    .summary = "Gemma 3 text (1B and the text half of larger ones): per-head q/k norm, local "
               "layers five of six with their own RoPE base, GELU-tanh only; on CUDA a decode "
               "row of a local layer is not split over the context",
    .defaults = GEMMA3_DEFAULTS,
    .configure = gemma3_configure,
    .names = GEMMA_NAMES("model."),
};

const model_arch arch_gemma3 = {
    .model_type = "gemma3",
    .summary = "Gemma 3 vision-language checkpoints (mlx-vlm layout): the text model under "
               "language_model., text_config nested; images not supported, the vision tower "
               "is ignored; CUDA as gemma3_text",
    .defaults = GEMMA3_DEFAULTS,
    .configure = gemma3_configure,
    .names = GEMMA_NAMES("language_model.model."),
};
