/* Mixture-of-experts families in mlx-lm's layout (experts stacked per layer): Qwen3-MoE
 * (softmax over all experts, top-k, renormalized when norm_topk_prob; dense MLP layers among the
 * MoE ones by decoder_sparse_step and mlp_only_layers; per-head q/k norm) and Mixtral (top-k of
 * the router logits, softmax over the chosen, which is the same renormalized). */
#include "model/arch/arch.h"

#include <jansson.h>

/* mlp_only_layers: a list of layer indices that keep a dense MLP. */
static int read_dense_layers(const io_cfg_at *at, io_model_config *cfg) {
    int step;
    if (io_cfg_pos_int(at, "decoder_sparse_step", 1, &step)) return -1;
    int n = cfg->num_hidden_layers;
    cfg->layer_moe = base_xcalloc((size_t)n, sizeof *cfg->layer_moe);
    for (int i = 0; i < n; i++) cfg->layer_moe[i] = (i + 1) % step == 0;
    json_t *only = json_object_get(at->obj, "mlp_only_layers");
    if (!only || json_is_null(only)) return 0;
    if (!json_is_array(only)) return io_cfg_fail(at, "mlp_only_layers", "must be a list");
    size_t i;
    json_t *v;
    json_array_foreach(only, i, v) {
        json_int_t l = json_is_integer(v) ? json_integer_value(v) : -1;
        if (l < 0 || l >= n) return io_cfg_fail(at, "mlp_only_layers", "must list layer indices");
        cfg->layer_moe[l] = false;
    }
    return 0;
}

static int qwen3_moe_configure(const io_cfg_at *at, io_model_config *cfg) {
    bool windowed;
    if (arch_moe(at, cfg, "num_experts", "num_experts_per_tok", "moe_intermediate_size") ||
        io_cfg_bool(at, "norm_topk_prob", false, &cfg->moe_norm_topk) ||
        io_cfg_bool(at, "use_sliding_window", false, &windowed) || read_dense_layers(at, cfg))
        return -1;
    if (windowed) return io_cfg_fail(at, "use_sliding_window", "true is not supported");
    cfg->qk_norm = IO_QK_NORM_HEAD;
    return 0;
}

static int mixtral_configure(const io_cfg_at *at, io_model_config *cfg) {
    cfg->moe_norm_topk = true;
    return arch_moe(at, cfg, "num_local_experts", "num_experts_per_tok", "intermediate_size") ||
           arch_window_all(at, cfg);
}

const model_arch arch_qwen3_moe = {
    .model_type = "qwen3_moe",
    .summary = "Qwen3-MoE (30B-A3B, Coder): experts stacked as mlx-lm writes them, dense layers "
               "by mlp_only_layers; CPU only for now",
    .configure = qwen3_moe_configure,
    .names = {.prefix = "model.",
              .attn_norm = "input_layernorm",
              .mlp_norm = "post_attention_layernorm",
              .router = "mlp.gate",
              .experts = "mlp.switch_mlp"},
};

const model_arch arch_mixtral = {
    .model_type = "mixtral",
    .summary = "Mixtral: experts stacked as mlx-lm writes them; CPU only for now",
    .configure = mixtral_configure,
    .names = {.prefix = "model.",
              .attn_norm = "input_layernorm",
              .mlp_norm = "post_attention_layernorm",
              .router = "block_sparse_moe.gate",
              .experts = "block_sparse_moe.switch_mlp"},
};
