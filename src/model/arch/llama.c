/* Llama and Mistral: pre-norm blocks, SiLU-gated MLP, RoPE with every scaling transformers
 * defines for them; Mistral adds a sliding window over every layer. */
#include "model/arch/arch.h"

const model_arch arch_llama = {
    .model_type = "llama",
    .summary = "Llama 2/3.x and their fine-tunes: RoPE default, linear, dynamic, llama3, yarn; "
               "attention_bias",
    .names = {ARCH_LLAMA_NAMES},
};

const model_arch arch_mistral = {
    .model_type = "mistral",
    .summary = "Mistral 7B and Ministral: sliding_window over every layer (none when it spans "
               "max_position_embeddings); on CUDA a windowed decode row is not split over "
               "the context",
    .configure = arch_window_all,
    .names = {ARCH_LLAMA_NAMES},
};
