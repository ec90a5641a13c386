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

/* Reads only the headers of the checkpoint in dir (no mmap of data): total tensor bytes. */
int io_checkpoint_peek_bytes(const char *dir, uint64_t *bytes, base_err *err);

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
    IO_ARCH_LLAMA = 0,
    IO_ARCH_MISTRAL,
    IO_ARCH_QWEN2,
    IO_ARCH_QWEN3,
    IO_ARCH_COUNT
} io_arch;

const char *io_arch_name(io_arch arch);
/* "llama, mistral, qwen2, qwen3" */
const char *io_arch_supported_list(void);

typedef enum {
    IO_ROPE_NONE = 0, /* also "default" */
    IO_ROPE_LINEAR,
    IO_ROPE_DYNAMIC,
    IO_ROPE_LLAMA3,
    IO_ROPE_YARN,
} io_rope_type;

typedef struct io_rope_scaling {
    io_rope_type type;
    float factor;
    float low_freq_factor;                /* llama3 */
    float high_freq_factor;               /* llama3 */
    int original_max_position_embeddings; /* llama3, yarn, dynamic (0 = unset) */
    float beta_fast, beta_slow;           /* yarn (defaults 32, 1) */
    float mscale, mscale_all_dim;         /* yarn (0 = unset) */
    float attention_factor;               /* yarn (0 = derive from factor) */
} io_rope_scaling;

/* bits == 0 means dense (not quantized). */
typedef struct io_quant_spec {
    int bits;       /* 2, 3, 4, 5, 6, 8 */
    int group_size; /* 32, 64, 128 */
} io_quant_spec;

typedef struct io_quant_override {
    char *module; /* module path, e.g. "model.layers.3.mlp.down_proj" */
    io_quant_spec spec;
} io_quant_override;

#define IO_MAX_EOS 8

typedef struct io_model_config {
    io_arch arch;
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
    bool attention_bias; /* q/k/v biases (qwen2 always; llama's attention_bias) */
    bool qk_norm;        /* per-head RMSNorm on q and k (qwen3) */
    int sliding_window;  /* 0 = none */
    int bos_token_id;    /* -1 = none */
    int n_eos;
    int eos_token_ids[IO_MAX_EOS];
    base_dtype torch_dtype; /* F32 when absent */
    /* quantization: default spec (bits 0 = not quantized) and per-module overrides; an
     * override with bits 0 marks a module left dense. */
    io_quant_spec quant;
    int n_quant_overrides;
    io_quant_override *quant_overrides;
} io_model_config;

/* Parses dir/config.json. Missing required fields, wrong types and impossible values
 * (heads not dividing, zero sizes, unsupported bits or group size) are errors naming the
 * field; an unknown model_type lists the supported ones. */
int io_config_load(const char *dir, io_model_config *cfg, base_err *err);
/* Same, from a JSON text; `origin` names it in errors. */
int io_config_parse(const char *json_text, const char *origin, io_model_config *cfg, base_err *err);
void io_config_free(io_model_config *cfg);
/* The quantization spec for a module path (override if any, else the default). */
io_quant_spec io_config_quant_for(const io_model_config *cfg, const char *module);

#endif
