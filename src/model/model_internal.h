/* The model module's private structures, shared by its files. */
#ifndef MLXCEL_MODEL_INTERNAL_H
#define MLXCEL_MODEL_INTERNAL_H

#include "model/model.h"

typedef struct model_layer {
    be_linear q, k, v, o;     /* (H*hd, hidden) (KV*hd, hidden) x2 (hidden, H*hd) */
    be_linear gate, up, down; /* (inter, hidden) x2 (hidden, inter) */
    be_tensor attn_norm;      /* (1, hidden) */
    be_tensor mlp_norm;       /* (1, hidden) */
    be_tensor q_norm, k_norm; /* (1, head_dim), qwen3 only (data NULL otherwise) */
} model_layer;

/* Activations for one step, grown to the largest step seen. */
typedef struct model_scratch {
    int cap_tokens;                            /* rows every buffer below holds */
    int cap_out;                               /* rows of out_x and logits */
    size_t cap_meta;                           /* bytes of meta */
    void *x, *h, *q, *k, *v, *att, *gate, *up; /* (cap_tokens, width) each */
    void *ids;                                 /* (cap_tokens) I32 */
    void *out_x;                               /* (cap_out, hidden) */
    void *logits;                              /* (cap_out, vocab) F32 */
    void *meta;                                /* the step's batch arrays in backend memory */
    unsigned char *meta_host;                  /* (cap_meta) staging for one upload */
    void *inv_freq;                            /* (n_seqs, head_dim / 2) F32, dynamic RoPE only */
    int cap_inv_freq_seqs;
} model_scratch;

struct model {
    io_model_config cfg;
    io_checkpoint *ck;          /* owned */
    be_backend *be;             /* not owned */
    model_progress_fn progress; /* may be NULL; used only while loading */
    void *progress_ctx;
    be_linear embed;      /* (vocab, hidden) */
    be_linear lm_head;    /* (vocab, hidden); == embed when tied */
    be_tensor final_norm; /* (1, hidden) */
    model_layer *layers;  /* (n_layers) */
    be_tensor inv_freq;   /* (1, head_dim / 2) F32, static RoPE table */
    float rope_mscale;    /* YaRN attention factor on cos/sin; 1 otherwise */
    const void **mapped;  /* (n_mapped) backend copies of weights to free */
    int n_mapped, cap_mapped;
    model_scratch s;
    void *workspace; /* decode v2 partials, backend memory */
    uint64_t workspace_bytes;
};

/* Binds every weight of the architecture (model_load.c). */
int model_bind_weights(model *m, base_err *err);

/* RoPE inverse frequencies (head_dim / 2 floats) and the cos/sin scale for the configured
 * scaling; seq_len matters only for "dynamic" (transformers' dynamic NTK: the base grows
 * once the sequence passes max_position_embeddings). */
void model_rope_freqs(const io_model_config *cfg, int seq_len, float *inv_freq, float *mscale);

/* The decode plan for this step (model_plan.c), using the reserved workspace. */
int model_plan_step(model *m, const kv_pool *pool, const kv_batch *batch, be_decode_plan *plan,
                    base_err *err);

#endif
