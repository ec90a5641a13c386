/* Phi-3, Phi-3.5 and Phi-4-mini: fused qkv_proj and gate_up_proj (bound as row views), longrope
 * ("su") scaling with short and long factors, partial rotary embeddings (Phi-4-mini), and
 * Phi-3-mini-4k's sliding window over every layer (the 262144 of Phi-3.5-mini and Phi-4-mini
 * spans their context: arch_window_all makes it none). */
#include "model/arch/arch.h"

/* Phi-3 writes original_max_position_embeddings at the top level, not in rope_scaling. */
static int phi3_configure(const io_cfg_at *at, io_model_config *cfg) {
    io_rope_scaling *rs = &cfg->rope_scaling;
    if (rs->type == IO_ROPE_LONGROPE && rs->original_max_position_embeddings == 0 &&
        io_cfg_pos_int(at, "original_max_position_embeddings", cfg->max_position_embeddings,
                       &rs->original_max_position_embeddings))
        return -1;
    return arch_window_all(at, cfg);
}

const model_arch arch_phi3 = {
    .model_type = "phi3",
    .summary = "Phi-3, Phi-3.5-mini, Phi-4-mini: fused qkv and gate_up, longrope, partial "
               "rotary, sliding_window over every layer unless it spans max_position_embeddings "
               "(Phi-3.5-mini, Phi-4-mini: no window); on CUDA head_dim 96 (Phi-3-mini, "
               "Phi-3.5-mini) takes the generic attention kernel",
    .configure = phi3_configure,
    .names = {ARCH_LLAMA_NAMES, .qkv = "self_attn.qkv_proj", .gate_up = "mlp.gate_up_proj"},
};
