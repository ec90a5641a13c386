/* model: architecture descriptors (llama, mistral, qwen2, qwen3), weight binding by tensor
 * name with quantization descriptors, RoPE frequency tables, and the forward pass written
 * once against the backend interface. Contains no device code.
 *
 * One forward call runs one step of a batch: every sequence's new tokens (a prefill chunk or
 * one decode token) through all layers, reading and writing the paged KV pool. */
#ifndef MLXCEL_MODEL_H
#define MLXCEL_MODEL_H

#include "backend/backend.h"
#include "io/io.h"
#include "kv/kv.h"

typedef struct model model;

/* Called as loading goes, after each layer's weights are mapped (and uploaded to a GPU): bytes
 * done of the checkpoint's total, done == total once the last is in (tensors the family does
 * not read, a vision tower say, count as done then), e.g. for a progress bar. */
typedef void (*model_progress_fn)(void *ctx, uint64_t done, uint64_t total);

/* Loads config.json and the safetensors in dir, binds every tensor the architecture needs
 * (a missing tensor, a wrong shape or dtype, or a quantization that disagrees with config.json
 * is an error naming the tensor) and maps the weights into the backend. The model keeps `be`
 * (not owned) and owns the checkpoint mmaps. */
int model_load(const char *dir, be_backend *be, model_progress_fn progress, void *progress_ctx,
               model **out, base_err *err);
void model_free(model *m);

const io_model_config *model_config(const model *m);
/* Whether the model gives logits: a sequence classifier (config num_labels > 0) has a score
 * head instead of an LM head, unless its embeddings are tied. */
bool model_has_lm_head(const model *m);
/* A sequence classifier's score head: score.weight as float32 [num_labels, hidden_size] into
 * *w (host; caller frees). An error for a model without one. */
int model_score_head(const model *m, float **w, base_err *err);
/* Bytes of all weight tensors as stored. */
uint64_t model_weight_bytes(const model *m);
/* Weight bytes one decode step reads per sequence: every linear layer (packed weights,
 * scales, biases, linear biases), every norm (as held: Gemma's in F32), the output head, one
 * row of the embedding table (tied: the table whole as the head and the row), and of each
 * mixture-of-experts layer its router and top_k of its n_experts stacked experts. */
typedef struct model_decode_read {
    uint64_t routed;      /* what a step reads: each MoE layer's top_k experts */
    uint64_t all_experts; /* the same with every expert read (routed for a dense model) */
} model_decode_read;

model_decode_read model_decode_bytes(const model *m);
/* Opens the checkpoint of the model in dir whose config is c (model_config_load): its data
 * mapped, or (map_data false) its headers only; experts stored in a Hugging Face layout
 * (model_names.hf_experts, hf_gate_up) come out stacked, as the loader binds them, dense only.
 * Closed with io_checkpoint_close. */
int model_checkpoint_open(const char *dir, const io_model_config *c, bool map_data,
                          io_checkpoint **out, base_err *err);
/* The same from cfg (model_config_load) and the headers of its checkpoint
 * (model_checkpoint_open without data), without loading the weights: for a checkpoint that loads,
 * what model_decode_bytes gives the loaded model. A tensor the loader would bind that ck lacks is
 * an error naming it. */
int model_checkpoint_decode_bytes(const io_model_config *cfg, const io_checkpoint *ck,
                                  model_decode_read *out, base_err *err);

/* The decode plan's workspace for up to max_seqs sequences of max_ctx tokens in blocks of
 * block_size; the model allocates it in the backend (call again to grow). */
int model_reserve_decode(model *m, int block_size, int max_seqs, int max_ctx, base_err *err);

/* One step. `tokens` (batch->view.n_tokens) are this step's new token ids, row-aligned with
 * the batch; `out_rows` (n_out) names the token rows whose logits are wanted, written to
 * `logits` (host, float32 [n_out, vocab]), or left in backend memory when `logits` is NULL
 * (see model_logits). The batch's slots must have been reserved in `pool` (kv_seq_append). */
int model_forward(model *m, kv_pool *pool, const kv_batch *batch, const int32_t *tokens,
                  const int32_t *out_rows, int n_out, float *logits, base_err *err);
/* As model_forward with the logits left in backend memory, but returning once the step is
 * queued, so that the host can work beside it: the backend's next wait (sync, a download,
 * topk_candidates) ends the step and reports its errors. Until then the step's K/V are not
 * written (commit them to the pool after that wait). */
int model_forward_queue(model *m, kv_pool *pool, const kv_batch *batch, const int32_t *tokens,
                        const int32_t *out_rows, int n_out, base_err *err);
/* As model_forward, but what the out_rows give is their hidden state after the final norm
 * (the output head's input: transformers' last_hidden_state), written to `hidden` (host,
 * float32 [n_out, hidden_size]); for embeddings. */
int model_forward_hidden(model *m, kv_pool *pool, const kv_batch *batch, const int32_t *tokens,
                         const int32_t *out_rows, int n_out, float *hidden, base_err *err);
/* The last forward's logits in backend memory, float32 [n_out, vocab] (n_out as passed to
 * it); owned by the model, valid until its next forward. */
be_tensor model_logits(const model *m, int n_out);

/* Decode steps run from a recording so far: recorded (captured) and replayed (every run of a
 * recording, the first included). For tests and reports. */
void model_graph_counts(const model *m, uint64_t *recorded, uint64_t *replayed);

/* ---- tensor parallelism (issue 25): what each of n ranks holds ----
 * Megatron's split of every layer: q, k, v and gate, up column-parallel (each rank computes
 * some heads, some intermediate columns, from the whole hidden state), o and down
 * row-parallel (each rank multiplies its heads' or columns' part and the ranks' partial sums
 * are added by an all-reduce), the embedding and the output head by vocabulary rows, a
 * mixture's experts whole, a share to each rank. A rank's k and v rows are whole KV heads and
 * are its slab of the paged pool; with more ranks than KV heads each head is held by the
 * ranks whose query heads read it (replicated). Row-parallel splits fall on quantization
 * group boundaries, so that each rank's part of a quantized weight is whole groups. */
typedef struct model_shard {
    int rank, n_ranks;
    int head0, n_heads;       /* query heads: rows of q, columns of o, attention sinks */
    int kv_head0, n_kv_heads; /* KV heads: rows of k and v, the rank's slab of the pool */
    int64_t inter0, inter;    /* dense MLP columns: rows of gate and up, columns of down */
    int64_t vocab0, vocab;    /* rows of the embedding table and of the output head */
    int expert0, n_experts;   /* a mixture's experts, whole (0 and 0 for a dense model) */
} model_shard;

/* Rank `rank`'s part of the model cfg describes (a config from model_config_load) over n_ranks.
 * What does not split evenly is an error naming the field and the count: query heads, KV
 * heads (n_ranks must divide them or be a multiple of them), the intermediate size, the
 * vocabulary, the experts, and a row-parallel split that would cut a quantization group
 * (o_proj's and down_proj's group size, per layer). n_ranks 1 is the whole model. */
int model_shard_plan(const io_model_config *cfg, int n_ranks, int rank, model_shard *out,
                     base_err *err);

/* As model_load, for rank `rank` of n_ranks (model_shard_plan says its part): only that part
 * of every layer is mapped into `be`, and the forward pass runs
 * the rank's heads, columns and experts, summing and gathering with the other ranks through
 * `comm` (rank `rank` of n_ranks; not owned, NULL with one rank). Every rank's forward is
 * called with the same batch and tokens, each with a pool of its KV heads (geometry
 * model_kv_heads) laid out by the one block table; each gets the whole logits. model_load is
 * this with one rank. */
int model_load_shard(const char *dir, be_backend *be, int n_ranks, int rank, be_comm *comm,
                     model_progress_fn progress, void *progress_ctx, model **out, base_err *err);
/* The KV heads this model's pool holds: its rank's (all of them with one rank). */
int model_kv_heads(const model *m);

/* Writes out_dir (an existing directory) as the MLX-quantized copy of the dense checkpoint in
 * in_dir, as mlx-lm's convert writes it: spec affine (bits 2, 3, 4, 5, 6 or 8, group size 32,
 * 64 or 128) or mxfp4 (bits 4, group size 32); a MoE family's routers at 8 bits affine, group
 * 64, as per-module entries of config.json's quantization. */
int model_quantize(const char *in_dir, const char *out_dir, io_quant_spec spec, base_err *err);

#endif
