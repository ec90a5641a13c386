/* Qwen 2/2.5 (q/k/v biases, which its config never states) and Qwen 3 (per-head q/k RMSNorm). */
#include "model/arch/arch.h"

static int qwen2_configure(const io_cfg_at *at, io_model_config *cfg) {
    cfg->attention_bias = true;
    cfg->o_bias = false;
    return arch_window_refused(at);
}

static int qwen3_configure(const io_cfg_at *at, io_model_config *cfg) {
    cfg->qk_norm = IO_QK_NORM_HEAD;
    return arch_window_refused(at);
}

const model_arch arch_qwen2 = {
    .model_type = "qwen2",
    .summary = "Qwen 2 and 2.5: q/k/v biases; use_sliding_window refused",
    .configure = qwen2_configure,
    .names = {ARCH_LLAMA_NAMES},
};

const model_arch arch_qwen3 = {
    .model_type = "qwen3",
    .summary = "Qwen 3 (dense): per-head q/k RMSNorm; use_sliding_window refused",
    .configure = qwen3_configure,
    .names = {ARCH_LLAMA_NAMES},
};
