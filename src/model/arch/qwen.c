/* Qwen 2/2.5 (q/k/v biases, which its config never states) and Qwen 3 (per-head q/k RMSNorm). */
#include "model/arch/arch.h"

/* Qwen's window covers only the layers past max_window_layers; no released checkpoint turns it
 * on, and refusing beats attending over the wrong span. */
static int refuse_window(const io_cfg_at *at) {
    bool windowed;
    if (io_cfg_bool(at, "use_sliding_window", false, &windowed)) return -1;
    return windowed ? io_cfg_fail(at, "use_sliding_window", "true is not supported") : 0;
}

static int qwen2_configure(const io_cfg_at *at, io_model_config *cfg) {
    cfg->attention_bias = true;
    cfg->o_bias = false;
    return refuse_window(at);
}

static int qwen3_configure(const io_cfg_at *at, io_model_config *cfg) {
    cfg->qk_norm = IO_QK_NORM_HEAD;
    return refuse_window(at);
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
