/* The model module's private structures, shared by its files. */
#ifndef MLXCEL_MODEL_INTERNAL_H
#define MLXCEL_MODEL_INTERNAL_H

#include "model/arch/arch.h"
#include "model/model.h"

/* A layer as the forward pass runs it. A norm whose data is NULL is one the family does not
 * have (model_names); norms are stored as the scale they apply, (1 + w) already added for
 * Gemma. */
typedef struct model_layer {
    be_linear q, k, v, o;     /* (H*hd, hidden) (KV*hd, hidden) x2 (hidden, H*hd) */
    be_linear gate, up, down; /* (inter, hidden) x2 (hidden, inter) */
    be_tensor attn_norm;      /* (1, hidden) before attention */
    be_tensor post_attn_norm; /* (1, hidden) on attention's output */
    be_tensor mlp_norm;       /* (1, hidden) before the MLP */
    be_tensor post_mlp_norm;  /* (1, hidden) on the MLP's output */
    be_tensor q_norm, k_norm; /* (1, head_dim) per head, or (1, H*hd) and (1, KV*hd) whole */
    bool moe;                 /* a mixture of experts instead of gate, up, down */
    be_linear router;         /* (n_experts, hidden) */
    be_linear egate, eup;     /* (n_experts * expert inter, hidden), experts stacked */
    be_linear edown;          /* (n_experts * hidden, expert inter) */
    be_moe experts;           /* the op's view of the four above */
    be_tensor sinks;          /* (1, n_heads) F32 attention sinks, or data NULL */
    be_attn attn;             /* scale, cap, window and sinks of this layer's attention */
    bool local;               /* a local layer: its window and the local RoPE table */
} model_layer;

/* Activations for one step, grown to the largest step seen. */
typedef struct model_scratch {
    int cap_tokens;                            /* rows every buffer below holds */
    int cap_out;                               /* rows of out_x and logits */
    size_t cap_meta;                           /* bytes of meta */
    void *x, *h, *q, *k, *v, *att, *gate, *up; /* (cap_tokens, width) each */
    void *moe_out;                             /* (cap_tokens, hidden), MoE models only */
    void *ids;                                 /* (cap_tokens) I32 */
    void *out_x;                               /* (cap_out, hidden) */
    void *logits;                              /* (cap_out, vocab) F32 */
    void *logits_part; /* (cap_out, shard.vocab) F32: this rank's columns, with more than one */
    void *meta;        /* the step's batch arrays in backend memory */
    unsigned char *meta_host; /* (cap_meta) staging for one upload */
    void *inv_freq;           /* (n_seqs, head_dim / 2) F32, dynamic RoPE only */
    int cap_inv_freq_seqs;
    uint64_t generation; /* bumped whenever a buffer above or the workspace is replaced */
} model_scratch;

/* A recorded decode step (model_graph.c), keyed by everything a recording holds fixed. */
typedef struct model_graph_key {
    const kv_pool *pool;
    int n_seqs;        /* decode rows, one per sequence, all of them logits rows */
    int kv_bound;      /* the max_kv_len the ops saw: a bucket of lengths shares one recording */
    bool page_offsets; /* the batch has first_page_offset (it moves the arrays after it) */
    uint64_t pages_at; /* byte offset of the page list in the step's arrays (model_scratch) */
    be_decode_plan plan;
    uint64_t model_generation, backend_generation;
    const be_tensor *freqs; /* the step's RoPE table: longrope's short or long one */
} model_graph_key;

typedef struct model_graph_entry {
    model_graph_key key;
    be_graph *graph; /* NULL: seen once, run directly; recorded on the next sight */
    bool failed;     /* the step could not be recorded: it always runs directly */
    uint64_t last_use;
} model_graph_entry;

#define MODEL_GRAPH_CACHE 16

/* One step's inputs as the forward body reads them. */
typedef struct model_step {
    const kv_pool *pool;
    const be_paged_batch *host; /* the batch arrays in host memory */
    be_paged_batch *dev;        /* the same arrays in backend memory */
    be_paged_batch *dev_local;  /* the local group's view in backend memory, or NULL */
    be_decode_plan *plan;
    const int32_t *out_rows; /* (n_out) */
    int n_out;
    bool hidden; /* stop at the output head's input (model_forward_hidden) */
    /* The one RoPE table of the step's non-local layers (model_step_freqs), or NULL where
     * each sequence takes its own (dynamic NTK; longrope with sequences on both sides of the
     * switch to the long factors). */
    const be_tensor *freqs;
} model_step;

struct model {
    io_model_config cfg;
    const model_arch *arch;
    int stacking;      /* while binding stacked experts: their count (3-D tensors accepted) */
    io_checkpoint *ck; /* owned */
    be_backend *be;    /* not owned */
    model_progress_fn progress; /* may be NULL; used only while loading */
    uint64_t bytes_bound;       /* checkpoint bytes mapped so far, for progress */
    void *progress_ctx;
    be_linear embed;          /* (vocab, hidden) */
    be_linear lm_head;        /* (vocab, hidden); == embed when tied; weight NULL: none */
    const io_tensor *score;   /* (num_labels, hidden) a sequence classifier's head, or NULL */
    be_tensor final_norm;     /* (1, hidden) */
    model_layer *layers;      /* (n_layers) */
    be_tensor inv_freq;       /* (1, rotary_dim / 2) F32, static RoPE table */
    float rope_mscale;        /* YaRN or longrope attention factor on cos/sin; 1 otherwise */
    be_tensor inv_freq_local; /* local layers' table where it differs (Gemma 3), else data NULL */
    be_tensor inv_freq_short; /* longrope: the table within the pretrained length (inv_freq
                               * then holds the long factors' one), else data NULL */
    float rope_local_mscale;
    const void **mapped; /* (n_mapped) backend copies of weights to free */
    int n_mapped, cap_mapped;
    model_scratch s;
    void *workspace; /* decode v2 partials, backend memory */
    uint64_t workspace_bytes;
    model_shard shard; /* this rank's part (model_shard_plan); with one rank, the whole model */
    be_comm *comm;     /* the ranks' collectives, not owned; NULL with one rank */
    bool sharded_bind; /* binding a sharded model: linears stay host memory (model_shard_map) */
    bool in_linear;    /* binding a linear layer's tensors */
    void **host_parts; /* (n_host_parts) rank parts copied on the host that the backend maps in
                          place (the CPU's): they live as long as the model */
    int n_host_parts;
    model_graph_entry graphs[MODEL_GRAPH_CACHE];
    uint64_t graph_clock;
    uint64_t graphs_recorded, graphs_replayed;
};

/* The backend's activation for the config's. */
static inline be_act model_act(io_act act) {
    return act == IO_ACT_GELU_TANH    ? BE_ACT_GELU_TANH
           : act == IO_ACT_SWIGLU_OAI ? BE_ACT_SWIGLU_OAI
                                      : BE_ACT_SILU;
}

/* Binds every weight of the architecture (model_load.c). */
int model_bind_weights(model *m, base_err *err);
/* Records a backend buffer the model owns (freed with it). */
void model_own_buffer(model *m, const void *dev);
/* t's shape as "[d0, d1, ...]" into buf, for messages. */
void model_shape_str(const io_tensor *t, char *buf, size_t size);
/* The backend's packed copy of a quantized linear layer, owned by the model (none while a
 * sharded model binds). */
int model_pack_linear(model *m, be_linear *lin, base_err *err);
/* Maps the rank's part of every linear layer a sharded bind left in host memory, per
 * m->shard (model_shard.c). */
int model_shard_map(model *m, base_err *err);
/* A sharded model's embedding ids for tokens (n of them): a token of this rank's vocabulary
 * rows its row there, any other the zero row after them. */
void model_shard_ids(const model *m, const int32_t *tokens, int n, int32_t *ids);

/* RoPE inverse frequencies (rotary_dim / 2 floats) and the cos/sin scale for the configured
 * scaling, of the local layers' table when `local`; seq_len matters only where the table
 * depends on the sequence: "dynamic" (transformers' dynamic NTK: the base grows once the
 * sequence passes max_position_embeddings) and "longrope" (long factors past the original
 * length). */
void model_rope_freqs(const io_model_config *cfg, bool local, int seq_len, float *inv_freq,
                      float *mscale);
/* Whether a scaling gives one table for every sequence. */
bool model_rope_static(const io_rope_scaling *rs);
/* longrope: the sequence length past which the long factors apply (transformers' switch);
 * 0 for every other type. */
int model_rope_long_after(const io_model_config *cfg);

/* The decode plan for this step (model_plan.c), using the reserved workspace. */
int model_plan_step(model *m, const kv_pool *pool, const kv_batch *batch, be_decode_plan *plan,
                    base_err *err);
/* The plan for n_decode decode rows whose longest has up to max_pages pages. */
void model_plan_pages(model *m, int64_t n_decode, int64_t max_pages, be_decode_plan *plan);

/* Embedding to logits in backend memory (s.logits), the ops queued, not waited for
 * (model_forward.c). st->dev and st->plan must be final. */
int model_forward_body(model *m, const model_step *st, base_err *err);
/* The one RoPE table of a step's non-local layers (model_step.freqs), or NULL. */
const be_tensor *model_step_freqs(const model *m, const be_paged_batch *hb);

/* Whether this step can run as a recorded graph: the backend records, every row is a decode
 * row whose logits are wanted in order, the step has one RoPE table (model_graph.c). */
bool model_graph_usable(const model *m, const model_step *st);
/* Plans the step for its length bucket (st->plan, st->dev->max_kv_len), then replays its
 * recording, records it, or runs it directly. */
int model_graph_step(model *m, model_step *st, base_err *err);
void model_graphs_free(model *m);

#endif
