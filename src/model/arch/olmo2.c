/* OLMo 2: no norm before a block, RMSNorm on each block's output before the residual add, and
 * RMSNorm over the whole q and k projections (not per head). */
#include "model/arch/arch.h"

static int olmo2_configure(const io_cfg_at *at, io_model_config *cfg) {
    (void)at;
    cfg->qk_norm = IO_QK_NORM_FULL;
    return 0;
}

const model_arch arch_olmo2 = {
    .model_type = "olmo2",
    .summary = "OLMo 2: post-block norms, q/k norm over the whole projection",
    .configure = olmo2_configure,
    .names = {.prefix = "model.",
              .post_attn_norm = "post_attention_layernorm",
              .post_mlp_norm = "post_feedforward_layernorm"},
};
