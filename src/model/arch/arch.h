/* Model families as descriptors. A descriptor says what its config.json means past the generic
 * fields io_config reads (the layer pattern, norms, activation, scales, caps), where its tensors
 * live and under which names; the forward pass (model_forward.c) and the weight binding
 * (model_load.c) are written once over what descriptors fill in. A new family is one file
 * here and one line in the registry (arch.c). */
#ifndef MLXCEL_MODEL_ARCH_H
#define MLXCEL_MODEL_ARCH_H

#include "io/io.h"

/* A layer's tensors under its prefix ("model.layers.<l>."); NULL = the family has none. A
 * fused projection is bound as row views of one tensor (no copy): qkv holds q, k, v one after
 * another, gate_up holds gate then up. */
typedef struct model_names {
    const char *prefix;         /* of the text model's tensors: "model." or mlx-vlm's */
    const char *attn_norm;      /* before attention */
    const char *post_attn_norm; /* on attention's output, before the residual add */
    const char *mlp_norm;       /* before the MLP */
    const char *post_mlp_norm;  /* on the MLP's output, before the residual add */
    const char *qkv;            /* fused q/k/v projection, instead of q_proj, k_proj, v_proj */
    const char *gate_up;        /* fused gate/up projection, instead of gate_proj, up_proj */
    /* MoE layers: the router, and the experts stacked per projection (mlx-lm's layout:
     * <experts>.{gate,up,down}_proj, each [experts, out, in]). */
    const char *router;
    const char *experts;
    /* The same experts in Hugging Face's layout, which opening the checkpoint stacks into the
     * one above (model_experts.c): one tensor an expert and projection,
     * <hf_experts>.N.<hf_proj[i]>.weight for gate, up and down; or, with hf_gate_up, GPT-OSS's
     * <experts>.gate_up_proj (gate and up interleaved) and down_proj, with their _bias. */
    const char *hf_experts;
    const char *hf_proj[3];
    bool hf_gate_up;
} model_names;

/* The names of Llama's blocks (a norm before attention and one before the MLP, under
 * "model."), which most families keep; a descriptor adds its own fields after them. */
#define ARCH_LLAMA_NAMES                                                                           \
    .prefix = "model.", .attn_norm = "input_layernorm", .mlp_norm = "post_attention_layernorm"

typedef struct model_arch {
    const char *model_type; /* config.json's model_type */
    const char *summary;    /* one line for `mlxcel arch`: what is supported, and the limits */
    /* Config fields the family leaves out and transformers' config class defaults, as a JSON
     * object merged into the text model's object before it is read; NULL for none. */
    const char *defaults;
    /* Reads the family's own fields from `at` (the text model's object) into cfg, which the
     * generic parse has filled; NULL when it has none. */
    int (*configure)(const io_cfg_at *at, io_model_config *cfg);
    model_names names;
} model_arch;

/* The descriptor of a model_type, or NULL. */
const model_arch *model_arch_find(const char *model_type);
/* The registry, in the order `mlxcel arch` lists it. */
const model_arch *const *model_arch_all(int *n);
/* "llama, mistral, ...": every model_type, for error messages. */
const char *model_arch_names(void);

/* dir/config.json through its family's descriptor: the generic fields, then the family's. An
 * unknown model_type is an error listing the supported ones. *arch may be NULL. */
int model_config_load(const char *dir, io_model_config *cfg, const model_arch **arch,
                      base_err *err);
/* Same, from a JSON text; `origin` names it in errors. */
int model_config_parse(const char *json_text, const char *origin, io_model_config *cfg,
                       const model_arch **arch, base_err *err);

/* Helpers for descriptors. */
/* Every layer local (Mistral and Phi-3's sliding_window over all layers) when the config has a
 * window shorter than max_position_embeddings, none otherwise (sliding_window then reads 0). */
int arch_window_all(const io_cfg_at *at, io_model_config *cfg);
/* Qwen's use_sliding_window refused: its window covers only the layers past max_window_layers;
 * no released checkpoint turns it on, and refusing beats attending over the wrong span. */
int arch_window_refused(const io_cfg_at *at);
/* Local layers from layer_types when given, else every layer but each `period`-th (layer i is
 * global when (i + 1) % period == 0), as Gemma's configs mean it. */
int arch_window_pattern(const io_cfg_at *at, io_model_config *cfg, int period);

/* Experts, experts used per token and each expert's intermediate size from the config's keys
 * for them (families spell them differently). */
int arch_moe(const io_cfg_at *at, io_model_config *cfg, const char *n_key, const char *k_key,
             const char *inter_key);

/* The descriptors (one file each under model/arch/). */
extern const model_arch arch_llama, arch_mistral, arch_qwen2, arch_qwen3, arch_gemma2,
    arch_gemma3_text, arch_gemma3, arch_phi3, arch_olmo2, arch_granite, arch_qwen3_moe,
    arch_mixtral, arch_gpt_oss;

#endif
