/* io: safetensors (mmap, full header validation, sharded index, writer), config.json -> model
 * config, and the .npy writer. Never allocates device memory.
 *
 * Ownership: an io_checkpoint owns its mmaps; every io_tensor pointer and every `data`
 * pointer stays valid until io_checkpoint_close. */
#ifndef MLXCEL_IO_H
#define MLXCEL_IO_H

#include "base/base.h"

#define IO_MAX_DIMS 8

typedef struct io_tensor {
    const char *name; /* owned by the checkpoint */
    const char *file; /* path of the shard holding it */
    base_dtype dtype;
    int ndim;
    int64_t shape[IO_MAX_DIMS];
    const void *data; /* into the mmap; 8-byte alignment is not promised */
    uint64_t nbytes;
} io_tensor;

typedef struct io_checkpoint io_checkpoint;

/* Opens one .safetensors file and validates its whole header: header length bounded by the
 * file, well-formed JSON object, known dtypes, shape x dtype size == byte span, spans inside
 * the data section, sorted spans not overlapping, unique names, dims non-negative and their
 * product not overflowing. Every rejection names the file and the tensor. */
int io_checkpoint_open_file(const char *path, io_checkpoint **out, base_err *err);
/* Opens a checkpoint directory: model.safetensors.index.json when present (every shard it
 * names must exist and hold the tensors it maps to it), else model.safetensors, else every
 * *.safetensors file in the directory (sorted). Index shard names must be plain file names
 * (no '/' or ".."). Tensor names must be unique across shards. On failure *out is NULL; on
 * success the caller closes it with io_checkpoint_close. */
int io_checkpoint_open_dir(const char *dir, io_checkpoint **out, base_err *err);
void io_checkpoint_close(io_checkpoint *ck);

size_t io_checkpoint_count(const io_checkpoint *ck);
/* Tensors in shard order (sorted file names), and in data order within a shard, so walking
 * them reads each file front to back. NULL past the end. */
const io_tensor *io_checkpoint_at(const io_checkpoint *ck, size_t i);
/* NULL when absent. */
const io_tensor *io_checkpoint_find(const io_checkpoint *ck, const char *name);
/* The "__metadata__" value for key, or NULL. */
const char *io_checkpoint_metadata(const io_checkpoint *ck, const char *key);
/* Sum of all tensor bytes. */
uint64_t io_checkpoint_bytes(const io_checkpoint *ck);

/* A tensor io_checkpoint_replace adds: data (NULL in a checkpoint of headers only) is
 * prod(shape) elements of dtype from malloc, which the checkpoint frees when it closes. */
typedef struct io_tensor_new {
    char *name; /* malloc'd; the checkpoint takes it */
    base_dtype dtype;
    int ndim;
    int64_t shape[IO_MAX_DIMS];
    void *data;
} io_tensor_new;

/* Replaces the tensors named in drop (each must exist) with those of add, which the checkpoint
 * takes over (names and data, on failure too): a layout converted at load, whose new tensors
 * keep the file of drop[0] for messages. Every io_tensor pointer found before is invalid
 * after. */
int io_checkpoint_replace(io_checkpoint *ck, const char *const *drop, size_t n_drop,
                          io_tensor_new *add, size_t n_add, base_err *err);

/* As io_checkpoint_open_dir, reading only the headers (no mmap of data): every tensor's name,
 * dtype, shape and nbytes, its `data` NULL. For sizing a model without touching its weights. */
int io_checkpoint_open_headers(const char *dir, io_checkpoint **out, base_err *err);

/* ---- writer ---- */

typedef struct io_tensor_out {
    const char *name;
    base_dtype dtype;
    int ndim;
    int64_t shape[IO_MAX_DIMS];
    const void *data; /* nbytes = prod(shape) * dtype size */
} io_tensor_out;

/* Writes a safetensors file (tensors laid out in the given order, header padded with spaces
 * to a multiple of 8 bytes). It writes `path.tmp` and renames it, so on failure no file, or
 * the previous one, is under `path`. metadata_kv: NULL or an array of 2*n_meta strings
 * (key, value). The caller keeps ownership of everything passed in. */
int io_safetensors_write(const char *path, const io_tensor_out *tensors, size_t n,
                         const char *const *metadata_kv, size_t n_meta, base_err *err);

/* ---- .npy ---- */

/* Writes a float32 C-order array of the given shape (ndim 0..IO_MAX_DIMS) as .npy version
 * 1.0, header padded to 64 bytes as numpy writes it; through `path.tmp` like the writer. */
int io_npy_write_f32(const char *path, const float *data, const int64_t *shape, int ndim,
                     base_err *err);
/* Reads a little-endian float32 or float64 C-order .npy into a new float32 buffer (caller
 * frees *data); shape has room for IO_MAX_DIMS. */
int io_npy_read_f32(const char *path, float **data, int64_t *shape, int *ndim, base_err *err);

/* ---- config.json ---- */

typedef enum {
    IO_ROPE_NONE = 0, /* also "default" */
    IO_ROPE_LINEAR,
    IO_ROPE_DYNAMIC,
    IO_ROPE_LLAMA3,
    IO_ROPE_YARN,
    IO_ROPE_LONGROPE, /* also "su": short and long factors per frequency (Phi-3) */
} io_rope_type;

typedef struct io_rope_scaling {
    io_rope_type type;
    float factor;
    float low_freq_factor;                /* llama3 */
    float high_freq_factor;               /* llama3 */
    int original_max_position_embeddings; /* llama3, yarn, dynamic (0 = unset) */
    float beta_fast, beta_slow;           /* yarn (defaults 32, 1) */
    float mscale, mscale_all_dim;         /* yarn (0 = unset) */
    bool truncate;                        /* yarn: correction range floored/ceiled (default) */
    float attention_factor;               /* yarn, longrope (0 = derive from factor) */
    int n_factors;                        /* longrope: entries of each list below */
    float *short_factor, *long_factor;    /* longrope (owned by the config) */
} io_rope_scaling;

typedef enum {
    IO_QUANT_AFFINE = 0, /* MLX affine: per-group scale and bias */
    IO_QUANT_MXFP4,      /* E2M1 codes, one E8M0 scale byte per 32 values, no biases */
} io_quant_mode;

/* bits == 0 means dense (not quantized). */
typedef struct io_quant_spec {
    int bits;       /* 2, 3, 4, 5, 6, 8 (affine); 4 (mxfp4) */
    int group_size; /* 32, 64, 128 (affine); 32 (mxfp4) */
    io_quant_mode mode;
} io_quant_spec;

typedef struct io_quant_override {
    char *module; /* module path, e.g. "model.layers.3.mlp.down_proj" */
    io_quant_spec spec;
} io_quant_override;

struct json_t;

#define IO_MAX_EOS 8

/* What a family does differently from Llama, as its descriptor (model/arch) reads it from the
 * config; the generic parse leaves Llama's choices. */
typedef enum { IO_ACT_SILU = 0, IO_ACT_GELU_TANH, IO_ACT_SWIGLU_OAI } io_act;
typedef enum {
    IO_QK_NORM_NONE = 0,
    IO_QK_NORM_HEAD, /* RMSNorm over each head of q and k (Qwen3, Gemma 3) */
    IO_QK_NORM_FULL, /* RMSNorm over the whole q and k projections (OLMo 2) */
} io_qk_norm;

typedef struct io_model_config {
    char model_type[32];
    int vocab_size;
    int hidden_size;
    int intermediate_size;
    int num_hidden_layers;
    int num_attention_heads;
    int num_key_value_heads; /* defaults to num_attention_heads */
    int head_dim;            /* defaults to hidden_size / num_attention_heads */
    int max_position_embeddings;
    float rms_norm_eps;
    float rope_theta;
    io_rope_scaling rope_scaling;
    bool tie_word_embeddings;
    /* a *ForSequenceClassification checkpoint: the outputs of its score head (which replaces
     * the LM head); 0 for a causal LM */
    int num_labels;
    bool attention_bias; /* q/k/v biases (qwen2 always; llama's attention_bias) */
    bool o_bias;         /* o_proj's bias: attention_bias, except qwen2's */
    bool attn_sinks;     /* a learned logit per head in each softmax's denominator */
    bool moe_bias;       /* biases on the router and the experts' projections */
    io_qk_norm qk_norm;
    int sliding_window; /* the local layers' window; 0 = none */
    bool *layer_local;  /* (num_hidden_layers) attends within sliding_window; NULL = none */
    int rotary_dim;     /* dims of each head RoPE turns (partial_rotary_factor); head_dim */
    /* Local layers' RoPE where it differs from the global one (Gemma 3): theta 0 = the same
     * table as every other layer. */
    float rope_local_theta;
    io_rope_scaling rope_local_scaling;
    io_act act;
    bool norm_plus_one;   /* RMSNorm scales by (1 + w) (Gemma) */
    float embed_scale;    /* the embedding is multiplied by it (Gemma: sqrt(hidden)) */
    float attn_scale;     /* 0 = 1 / sqrt(head_dim) */
    float attn_softcap;   /* 0 = none */
    float final_softcap;  /* on the logits; 0 = none */
    float residual_scale; /* each block's output is multiplied by it before the add */
    float logits_scale;   /* the logits are multiplied by it */
    /* Mixture of experts; n_experts 0 = dense. */
    int n_experts, n_experts_used;
    int moe_intermediate_size; /* each expert's */
    bool moe_norm_topk;        /* the chosen experts' weights renormalized to sum 1 */
    bool *layer_moe;           /* (num_hidden_layers) MoE or a dense MLP; NULL = all MoE */
    int bos_token_id;          /* -1 = none */
    int n_eos;
    int eos_token_ids[IO_MAX_EOS];
    base_dtype torch_dtype; /* F32 when absent */
    /* quantization: default spec (bits 0 = not quantized) and per-module overrides; an
     * override with bits 0 marks a module left dense. */
    io_quant_spec quant;
    int n_quant_overrides;
    io_quant_override *quant_overrides;
} io_model_config;

/* The generic part of config.json: sizes, RoPE, tokens, dtype, quantization, read from the
 * text model's object (`text_config` when there is one, as vision-language checkpoints nest
 * it; the root otherwise), with dtype and quantization from the root. Missing required fields,
 * wrong types and impossible values (heads not dividing, zero sizes, unsupported bits or group
 * size) are errors naming the field. model_type is read, not judged: the family descriptors
 * (model/arch) know which exist, and model_config_load reads the rest through them. root is
 * not taken over. */
int io_config_parse_json(struct json_t *root, const char *origin, io_model_config *cfg,
                         base_err *err);
/* dir/config.json, parsed as a JSON document (*root owned by the caller: json_decref). */
int io_config_read_json(const char *dir, struct json_t **root, char **origin, base_err *err);
/* The object a config's text-model fields live in: root's `text_config`, else root. */
struct json_t *io_config_text(struct json_t *root);
void io_config_free(io_model_config *cfg);

/* Typed reads of one config field for the family descriptors, with io_config's rules: absent
 * and null mean the default, a wrong type or an impossible value is an error naming
 * origin and field. */
typedef struct io_cfg_at {
    struct json_t *obj;
    const char *origin;
    const char *prefix; /* "" or "text_config.": where obj sits, for errors */
    base_err *err;
} io_cfg_at;
bool io_cfg_has(const io_cfg_at *at, const char *key);
int io_cfg_int(const io_cfg_at *at, const char *key, int def, int *out);
int io_cfg_pos_int(const io_cfg_at *at, const char *key, int def, int *out);
int io_cfg_float(const io_cfg_at *at, const char *key, float def, float *out);
int io_cfg_pos_float(const io_cfg_at *at, const char *key, float def, float *out);
int io_cfg_bool(const io_cfg_at *at, const char *key, bool def, bool *out);
/* A string field compared with `want` (absent: false). */
int io_cfg_str_is(const io_cfg_at *at, const char *key, const char *want, bool *out);
/* A field that must hold `n` strings, each "sliding_attention" or "full_attention"
 * (transformers' layer_types); sets local[i]. Absent: *present false. */
int io_cfg_layer_types(const io_cfg_at *at, int n, bool *local, bool *present);
/* The error "field 'key' what" for a value the descriptor refuses. */
int io_cfg_fail(const io_cfg_at *at, const char *key, const char *what);
/* The quantization spec for a module path (override if any, else the default). */
io_quant_spec io_config_quant_for(const io_model_config *cfg, const char *module);

#endif
