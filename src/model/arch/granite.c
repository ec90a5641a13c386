/* Granite 3.x (dense): Llama's blocks with four multipliers: on the embedding, on the attention
 * scores (instead of 1 / sqrt(head_dim)), on each block's output, and a divisor of the logits. */
#include "model/arch/arch.h"

static int granite_configure(const io_cfg_at *at, io_model_config *cfg) {
    float logits_scaling;
    if (io_cfg_pos_float(at, "embedding_multiplier", 1, &cfg->embed_scale) ||
        io_cfg_pos_float(at, "attention_multiplier", 1, &cfg->attn_scale) ||
        io_cfg_pos_float(at, "residual_multiplier", 1, &cfg->residual_scale) ||
        io_cfg_pos_float(at, "logits_scaling", 1, &logits_scaling))
        return -1;
    cfg->logits_scale = 1.0f / logits_scaling;
    return 0;
}

const model_arch arch_granite = {
    .model_type = "granite",
    .summary = "Granite 3.x dense: embedding, attention, residual and logits multipliers",
    .configure = granite_configure,
    .names = {ARCH_LLAMA_NAMES},
};
