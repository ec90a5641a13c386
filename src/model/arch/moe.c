/* Mixture-of-experts families in mlx-lm's layout (experts stacked per layer; Hugging Face's layouts
 * are stacked into it at open, model_experts.c): Qwen3-MoE (softmax over all experts, top-k,
 * renormalized when norm_topk_prob; dense MLP layers among the MoE ones by decoder_sparse_step and
 * mlp_only_layers; per-head q/k norm), Mixtral (top-k of the router logits, softmax over the
 * chosen, which is the same renormalized) and GPT-OSS. */
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
    if (arch_moe(at, cfg, "num_experts", "num_experts_per_tok", "moe_intermediate_size") ||
        io_cfg_bool(at, "norm_topk_prob", false, &cfg->moe_norm_topk) || arch_window_refused(at) ||
        read_dense_layers(at, cfg))
        return -1;
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
    .summary = "Qwen3-MoE (30B-A3B, Coder): experts stacked as mlx-lm writes them or, dense, "
               "one tensor an expert as transformers does; dense layers by decoder_sparse_step "
               "and mlp_only_layers; use_sliding_window refused",
    .configure = qwen3_moe_configure,
    .names = {ARCH_LLAMA_NAMES, .router = "mlp.gate", .experts = "mlp.switch_mlp",
              .hf_experts = "mlp.experts", .hf_proj = {"gate_proj", "up_proj", "down_proj"}},
};

const model_arch arch_mixtral = {
    .model_type = "mixtral",
    .summary = "Mixtral: experts stacked as mlx-lm writes them or, dense, as w1/w3/w2 an "
               "expert; sliding_window over every "
               "layer (none when it spans max_position_embeddings); on CUDA a windowed decode "
               "row is not split over the context",
    .configure = mixtral_configure,
    .names = {ARCH_LLAMA_NAMES, .router = "block_sparse_moe.gate",
              .experts = "block_sparse_moe.switch_mlp", .hf_experts = "block_sparse_moe.experts",
              .hf_proj = {"w1", "w3", "w2"}},
};

/* GPT-OSS: top-k of the router logits (with bias), softmax over the chosen; the clamped
 * SwiGLU with alpha 1.702 and limit 7, which is the only limit the kernels take; attention
 * sinks; q/k/v/o, router and expert biases; sliding and full layers alternating
 * (layer_types). */
static int gpt_oss_configure(const io_cfg_at *at, io_model_config *cfg) {
    float limit;
    if (arch_moe(at, cfg, "num_local_experts", "num_experts_per_tok", "intermediate_size") ||
        io_cfg_float(at, "swiglu_limit", 7.0f, &limit) || arch_window_pattern(at, cfg, 2))
        return -1;
    if (limit != 7.0f) return io_cfg_fail(at, "swiglu_limit", "must be 7.0");
    cfg->moe_norm_topk = true;
    cfg->act = IO_ACT_SWIGLU_OAI;
    cfg->attn_sinks = true;
    cfg->moe_bias = true;
    return 0;
}

const model_arch arch_gpt_oss = {
    .model_type = "gpt_oss",
    .summary = "GPT-OSS (20b, 120b): attention sinks, MXFP4 experts (mlx-community's "
               "MXFP4-Q8) or dense ones stacked or in transformers' fused gate_up_proj, biases, "
               "clamped SwiGLU (swiglu_limit 7 only), local layers every "
               "other layer; on CUDA a decode row with sinks or a window is not split over the "
               "context",
    .configure = gpt_oss_configure,
    .names = {ARCH_LLAMA_NAMES, .router = "mlp.router", .experts = "mlp.experts",
              .hf_gate_up = true},
};
