/* backend: the op interface every device implements (cpu/ and cuda/), and the plain data the
 * ops read. The model's forward pass is written once against these ops; it never touches
 * device memory directly. Knows nothing about requests.
 *
 * Memory: `data` pointers in be_tensor, be_linear, be_kv_layer and be_paged_batch are backend
 * memory (host pointers on the CPU backend, device pointers on CUDA). Ops may run
 * asynchronously; `sync` waits and reports a deferred error. An op returns -1 with err filled
 * for arguments it cannot serve (wrong dtype, shape mismatch); it never aborts. */
#ifndef MLXCEL_BACKEND_H
#define MLXCEL_BACKEND_H

#include "base/base.h"

/* A row-major contiguous 2-D array: [rows, cols]. Vectors are [1, n]. */
typedef struct be_tensor {
    void *data;
    base_dtype dtype;
    int64_t rows, cols;
} be_tensor;

/* The n rows of t from row r0: a view into t's data, owning nothing. */
static inline be_tensor be_tensor_rows(const be_tensor *t, int64_t r0, int64_t n) {
    be_tensor v = *t;
    v.data = (char *)t->data + (size_t)r0 * (size_t)t->cols * base_dtype_size(t->dtype);
    v.rows = n;
    return v;
}

/* A linear layer y = x W^T (+ bias). Dense: `weight` is [out, in] of `dtype` (F32/F16/BF16).
 * MLX affine-quantized (bits > 0): `weight` is packed uint32 [out, in * bits / 32], `scales`
 * and `biases` are [out, in / group_size] of `dtype`, and w[o, i] = scales[o, i / g] *
 * q[o, i] + biases[o, i / g] with q read from the little-endian bit stream of row o (for
 * bits 2/4/8 that is also "value k of a uint32 word at bits [k*bits, (k+1)*bits)"). The same
 * struct is an embedding table ([vocab, dim]) and a tied output head. */
typedef enum {
    BE_QUANT_AFFINE = 0, /* MLX affine: w = scales * q + biases */
    /* MXFP4: bits 4, group 32, q an E2M1 code (bit 3 the sign, bits 0-2 index {0, 0.5, 1,
     * 1.5, 2, 3, 4, 6}), scales one E8M0 byte (2^(s - 127)) per group, no biases. */
    BE_QUANT_MXFP4,
} be_quant;

typedef struct be_linear {
    int64_t out, in;
    int bits;         /* 0 = dense; else 2, 3, 4, 5, 6, 8 */
    int group_size;   /* 32, 64, 128 when quantized */
    be_quant quant;   /* the format when bits > 0 */
    base_dtype dtype; /* dense weight dtype, or scales/biases dtype (U8 for MXFP4) */
    const void *weight;
    const void *scales; /* (out, in / group_size), quantized only */
    const void *biases; /* (out, in / group_size), quantized only */
    const void *bias;   /* (out) or NULL: the linear layer's additive bias */
    base_dtype bias_dtype;
    /* NULL, or a copy of weight, scales and biases that `pack_linear` made in the layout the
     * backend's batched kernels stream (freed with `free`); weight and the rest stay valid. */
    const void *packed;
} be_linear;

/* Rows [r0, r0 + n) of a linear layer: a view into its weight (and scales, biases and bias),
 * owning nothing: a fused projection split in parts, one expert of a stacked tensor. */
static inline be_linear be_linear_rows(const be_linear *w, int64_t r0, int64_t n) {
    be_linear v = *w;
    size_t row =
        w->bits ? (size_t)w->in * (size_t)w->bits / 8 : (size_t)w->in * base_dtype_size(w->dtype);
    v.weight = (const char *)w->weight + (size_t)r0 * row;
    if (w->bits) {
        size_t srow = (size_t)(w->in / w->group_size) * base_dtype_size(w->dtype);
        v.scales = (const char *)w->scales + (size_t)r0 * srow;
        if (w->biases) v.biases = (const char *)w->biases + (size_t)r0 * srow;
    }
    if (w->bias) v.bias = (const char *)w->bias + (size_t)r0 * base_dtype_size(w->bias_dtype);
    v.out = n;
    /* A packed copy holds whole tiles of rows: a view of some of them is repacked apart. */
    v.packed = NULL;
    return v;
}

/* One layer of the paged KV pool: K and V slabs [num_blocks, block_size, n_kv_heads,
 * head_dim]. Element offset of (block, slot, head) is
 * ((uint64_t)block * block_size + slot) * (n_kv_heads * head_dim) + head * head_dim,
 * widened before the first multiply. */
typedef struct be_kv_layer {
    void *k, *v;
    base_dtype dtype; /* F16 or BF16 (F32 allowed on the CPU) */
    int64_t num_blocks;
    int block_size, n_kv_heads, head_dim;
} be_kv_layer;

/* One step's sequences, packed in CSR form. Token rows of sequence s are
 * [q_indptr[s], q_indptr[s+1]); they are the last q_len tokens of its kv_len tokens (the
 * causal mask follows from that). Its pages are page_indices[page_indptr[s] ..
 * page_indptr[s+1]), the last holding last_page_len[s] tokens. */
typedef struct be_paged_batch {
    int n_seqs;
    int n_tokens;
    int max_q_len;                    /* largest q_len of any sequence (host value) */
    int max_kv_len;                   /* largest kv_len of any sequence, or a bound above it */
    const int32_t *q_indptr;          /* (n_seqs + 1) */
    const int32_t *kv_len;            /* (n_seqs) tokens in the cache including this step's */
    const int32_t *page_indptr;       /* (n_seqs + 1) */
    const int32_t *page_indices;      /* (page_indptr[n_seqs]) block ids */
    const int32_t *last_page_len;     /* (n_seqs) */
    const int32_t *first_page_offset; /* (n_seqs) tokens skipped in the first page, or NULL */
    const int64_t *slots;             /* (n_tokens) block * block_size + slot of each new token */
    const int32_t *positions;         /* (n_tokens) RoPE positions */
} be_paged_batch;

typedef enum {
    BE_DECODE_GATHER = 0, /* copy each sequence's K/V to contiguous memory, dense attention */
    BE_DECODE_V1,         /* one pass per (sequence, kv head) over all its pages */
    BE_DECODE_V2,         /* pages split in chunks; partial outputs + LSE; then a merge */
} be_decode_kind;

/* How decode rows (q_len == 1) are computed in one step; made by the attn module. */
typedef struct be_decode_plan {
    be_decode_kind kind;
    int pages_per_chunk; /* v2: pages per chunk */
    int max_chunks;      /* v2: chunks of the longest sequence */
    void *workspace;     /* v2: partial outputs and LSEs, backend memory */
    uint64_t workspace_bytes;
} be_decode_plan;

/* Sampling candidates. The sampler's chain (bias and penalties, then top-k, top-p, min-p,
 * temperature, a draw) looks past the bias and penalties only at the top-k tokens, so a row's
 * top-k after its adjustments is all the host needs to pick exactly the token the full row
 * would give: k ids and logits cross to the host instead of the vocabulary. */

/* The most candidates one row may ask for; a request above it takes the full row. */
#define BE_TOPK_MAX 1024

typedef enum {
    BE_ADJ_ADD = 0,     /* l = l + a (logit bias) */
    BE_ADJ_PENALTY = 1, /* l = (l <= 0 ? l * a : l / a) - b (repetition, then presence and
                           frequency) */
} be_adj_kind;

/* One change to one logit before candidates are chosen. A row's adjustments are sorted by
 * token; those of one token apply in the order given, starting from the raw logit, in F32
 * with no fused multiply-add, as the host sampler computes them. */
typedef struct be_logit_adj {
    int32_t token;
    int32_t kind; /* be_adj_kind */
    float a, b;
} be_logit_adj;

/* What one row asks of topk_candidates. */
typedef struct be_topk_row {
    int32_t row;       /* row of the logits */
    int32_t k;         /* candidates wanted, 0 .. BE_TOPK_MAX */
    int32_t adj_begin; /* its adjustments are adj[adj_begin .. adj_end) */
    int32_t adj_end;
    int32_t want_lse; /* nonzero: also the log-sum-exp of the raw row */
    /* NULL, or host memory of (allowed_n + 31) / 32 words: token t may be a candidate only
     * when t < allowed_n and bit t % 32 of word t / 32 is set (a grammar's allowed set, applied
     * where the logits are, so that a constrained row crosses PCIe as k candidates too) */
    const uint32_t *allowed;
    int32_t allowed_n;
} be_topk_row;

/* Checks a topk_candidates call (rows, k, adjustment ranges, tokens sorted and inside the
 * vocabulary); both backends call it first. */
int be_topk_check(const be_tensor *logits, const be_topk_row *reqs, int n_req,
                  const be_logit_adj *adj, base_err *err);

/* The RMSNorm a fused matmul applies to each row of its input before the product:
 * x / sqrt(mean(x^2) + eps) * weight, the mean in F32 as `rmsnorm` computes it. Where the
 * backend cannot fold it into the product, it writes the normed rows to `scratch` and
 * multiplies those: scratch is [rows, cols] of the input, in backend memory, neither the input
 * nor an output, and holds nothing useful afterwards. */
typedef struct be_norm {
    const be_tensor *weight; /* [1, cols] */
    float eps;
    be_tensor *scratch;
} be_norm;

/* The activation of a gated linear unit: y = act(gate) * up. */
typedef enum {
    BE_ACT_SILU = 0,  /* x / (1 + e^-x) */
    BE_ACT_GELU_TANH, /* 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), gelu_pytorch_tanh */
    /* GPT-OSS's clamped SwiGLU: g = min(gate, 7), u = clamp(up, -7, 7),
     * y = g * sigmoid(1.702 g) * (u + 1). */
    BE_ACT_SWIGLU_OAI,
} be_act;

/* What one layer's attention computes besides softmax(q K^T) V: scores are scaled, then
 * soft-capped (cap * tanh(s / cap)) when softcap > 0, and a query at position p sees the keys
 * at positions p - window + 1 .. p when window > 0 (all keys up to p otherwise). With sinks,
 * head h's softmax has one more logit, sinks[h], in its denominator only (GPT-OSS). */
typedef struct be_attn {
    float scale;
    float softcap;      /* 0 = none */
    int window;         /* 0 = the whole causal span */
    const float *sinks; /* (n_heads) F32 in backend memory, or NULL */
} be_attn;

/* Plain causal attention at `scale`: no cap, no window. */
static inline be_attn be_attn_plain(float scale) {
    be_attn a;
    a.scale = scale;
    a.softcap = 0.0f;
    a.window = 0;
    a.sinks = NULL;
    return a;
}

/* A mixture-of-experts MLP. Experts are stacked: gate and up hold expert e's rows at
 * [e * inter, (e + 1) * inter), down its rows at [e * out, (e + 1) * out). */
typedef struct be_moe {
    const be_linear *router; /* [n_experts, in] (+ bias) */
    const be_linear *gate, *up, *down;
    int n_experts, top_k, inter;
    bool norm_topk; /* the chosen experts' weights renormalized to sum 1 */
    be_act act;
    /* A rank's share under tensor parallelism: gate, up and down hold experts [expert0,
     * expert0 + n_local) only; the router still scores all n_experts and picks among all, and
     * y sums the chosen experts this rank holds (the ranks' y add up to the whole). n_local 0:
     * every expert, here. */
    int expert0, n_local;
} be_moe;

/* The memory ceiling `mlxcel bench` puts decode against: the bandwidth that bounds a decode
 * step's stream of weights on the device, measured in the same run. */
typedef enum be_ceiling {
    BE_CEILING_COPY = 0, /* a device-to-device copy, bytes read + written a second */
    /* a read-only stream, all threads at once (read_sum): a decode step on a CPU is reads on
     * every thread, while a copy's write also costs a read for ownership and a write-back and
     * memcpy runs on one thread */
    BE_CEILING_READ,
} be_ceiling;

typedef struct be_backend be_backend;
typedef struct be_graph be_graph; /* a recorded sequence of ops (backend-defined) */

/* The norm of a fused matmul run apart, where it is not folded into the product: `rmsnorm` of
 * *x into norm->scratch, which *x then points to; nothing without a norm. Fails, naming `what`,
 * when the scratch is missing, of another shape than *x, or *x itself. */
int be_norm_apart(be_backend *be, const be_norm *norm, const be_tensor **x, const char *what,
                  base_err *err);

typedef struct be_ops {
    void (*destroy)(be_backend *be);

    /* memory */
    int (*alloc)(be_backend *be, size_t bytes, void **ptr, base_err *err);
    void (*free)(be_backend *be, void *ptr);
    int (*upload)(be_backend *be, void *dst, const void *src, size_t bytes, base_err *err);
    int (*download)(be_backend *be, void *dst, const void *src, size_t bytes, base_err *err);
    /* Host memory that download_async copies into: page-locked on CUDA, so a copy runs at the
     * bus's speed without the host waiting on it. Freed with free_host. */
    int (*alloc_host)(be_backend *be, size_t bytes, void **ptr, base_err *err);
    void (*free_host)(be_backend *be, void *ptr);
    /* Queues a copy into dst (from alloc_host); it has landed once `sync`, or an op that waits
     * (download, topk_candidates), returns. */
    int (*download_async)(be_backend *be, void *dst, const void *src, size_t bytes, base_err *err);
    int (*copy)(be_backend *be, void *dst, const void *src, size_t bytes, base_err *err);
    /* *sum = the wrapping sum of the bytes / 8 uint64 words at src (8-byte aligned), each of the
     * backend's threads reading its own slice at once: the stream that BE_CEILING_READ times.
     * NULL where the ceiling is the copy. */
    int (*read_sum)(be_backend *be, const void *src, size_t bytes, uint64_t *sum, base_err *err);
    /* Makes host weight bytes (an mmap that outlives the backend's use) usable by ops. The
     * CPU returns the host pointer itself; CUDA uploads once. Freed with `free` unless
     * *dev == host. */
    int (*map_weights)(be_backend *be, const void *host, size_t bytes, const void **dev,
                       base_err *err);
    /* Optional (NULL: no kernel reads another layout). Sets w->packed to a new buffer holding
     * w's quantized weights in the layout the backend's batched matmuls stream, once at load;
     * leaves it NULL, returning 0, where none of them would take w or memory is short (the
     * matmuls then read w as it is, slower where they would have taken the copy). */
    int (*pack_linear)(be_backend *be, be_linear *w, base_err *err);
    int (*sync)(be_backend *be, base_err *err);
    /* Optional (NULL: any thread may call the ops as it is). Makes this backend's device the
     * calling thread's, for a process that runs several backends, one thread each (the ranks
     * of a tensor-parallel model): CUDA keeps the current device per thread. */
    int (*bind_thread)(be_backend *be, base_err *err);
    /* Free and total bytes of the memory this backend computes in. */
    int (*memory_info)(be_backend *be, uint64_t *free_bytes, uint64_t *total_bytes);

    /* ops */
    /* out[i] = row ids[i] of table (dequantized); ids I32 [n, 1]; out [n, dim]. */
    int (*embedding)(be_backend *be, const be_linear *table, const be_tensor *ids, be_tensor *out,
                     base_err *err);
    /* y [n, out] = x [n, in] W^T (+ bias). */
    int (*matmul)(be_backend *be, const be_tensor *x, const be_linear *w, be_tensor *y,
                  base_err *err);
    /* y = x / rms(x) * weight, per row; weight [1, cols]. y may alias x. */
    int (*rmsnorm)(be_backend *be, const be_tensor *x, const be_tensor *weight, float eps,
                   be_tensor *y, base_err *err);
    /* y = a + b elementwise. y may alias a or b. */
    int (*add)(be_backend *be, const be_tensor *a, const be_tensor *b, be_tensor *y, base_err *err);
    /* y = act(gate) * up. y may alias gate or up. */
    int (*glu)(be_backend *be, be_act act, const be_tensor *gate, const be_tensor *up, be_tensor *y,
               base_err *err);
    /* y = x * s elementwise. y may alias x. */
    int (*scale)(be_backend *be, const be_tensor *x, float s, be_tensor *y, base_err *err);
    /* y = cap * tanh(x / cap) elementwise (cap > 0). y may alias x. */
    int (*softcap)(be_backend *be, const be_tensor *x, float cap, be_tensor *y, base_err *err);
    /* In place, rotate-half convention over the first rotary_dim = 2 * inv_freq->cols dims of
     * each head (rotary_dim <= head_dim; the rest pass unchanged, as partial rotary embeddings
     * leave them): x [n, n_heads * head_dim], positions I32 [n, 1], inv_freq F32
     * [1, rotary_dim / 2]; cos and sin are multiplied by mscale (YaRN, longrope). */
    int (*rope)(be_backend *be, be_tensor *x, int n_heads, int head_dim, const be_tensor *positions,
                const be_tensor *inv_freq, float mscale, base_err *err);
    /* Writes k, v [n_tokens, n_kv_heads * head_dim] into the pool at batch->slots. */
    int (*kv_append)(be_backend *be, const be_kv_layer *layer, const be_tensor *k,
                     const be_tensor *v, const be_paged_batch *batch, base_err *err);
    /* out [n_tokens, n_heads * head_dim] = softmax(cap(q K^T * scale) + causal and window
     * mask) V through the pages, as `attn` says; decode rows follow `plan`, other rows take
     * the prefill path. */
    int (*attention)(be_backend *be, const be_tensor *q, const be_kv_layer *layer,
                     const be_paged_batch *batch, const be_decode_plan *plan, int n_heads,
                     be_attn attn, be_tensor *out, base_err *err);
    /* ids I32 [rows, 1] = argmax over each row of logits. */
    int (*argmax)(be_backend *be, const be_tensor *logits, be_tensor *ids, base_err *err);
    /* Sampling candidates from logits F32 [rows, vocab] (backend memory, left unchanged);
     * reqs, adj and every output are host memory, and the op returns once they are written.
     * Request i takes row reqs[i].row with its adjustments applied and writes its
     * min(k, tokens above -inf in its allowed set) best tokens, adjusted logit descending and ties
     * to the lower id (a NaN is never a candidate), to cand_id and cand_logit at offset reqs[0].k +
     * ... + reqs[i - 1].k; n_cand[i] says how many. With want_lse, lse[i] is max + log(sum exp(raw
     * - max)) over the raw row, the sum in double (the CPU sums in token order, as engine_logprobs
     * does). NULL in a backend without it. */
    int (*topk_candidates)(be_backend *be, const be_tensor *logits, const be_topk_row *reqs,
                           int n_req, const be_logit_adj *adj, int32_t *cand_id, float *cand_logit,
                           int32_t *n_cand, double *lse, base_err *err);

    /* y [n, out] = the mixture `moe` of x' (x' as for matmul_qkv): each row's router logits
     * x' router^T, softmax over all experts in F32, the top_k largest (ties to the lower
     * expert), renormalized with norm_topk; then the sum over those experts of weight *
     * down_e(act(x' gate_e^T) * (x' up_e^T)). y may not alias x. NULL where a backend has
     * no MoE (the model then refuses to load such a model on it). */
    int (*moe)(be_backend *be, const be_tensor *x, const be_norm *norm, const be_moe *moe,
               be_tensor *y, base_err *err);

    /* Recording (optional: NULL where a backend has none). Ops queued between capture_begin
     * and capture_end are recorded, not run; graph_launch runs the recording again with the
     * same arguments (pointers, sizes, grids) over whatever the buffers hold by then. A
     * recording stays valid while `generation` is unchanged and every buffer it names is
     * alive. capture_end always ends the capture; it fails (no graph) when an op could not be
     * recorded. */
    int (*capture_begin)(be_backend *be, base_err *err);
    int (*capture_end)(be_backend *be, be_graph **graph, base_err *err);
    int (*graph_launch)(be_backend *be, be_graph *graph, base_err *err);
    void (*graph_free)(be_backend *be, be_graph *graph);
    /* Optional fusions of the ops above, NULL where a backend has none (the CPU's): the
     * forward pass then composes the ops above, with the same result up to rounding. */
    /* x += d; y = rmsnorm(x) * weight, per row. y may alias d, not x. */
    int (*add_rmsnorm)(be_backend *be, be_tensor *x, const be_tensor *d, const be_tensor *weight,
                       float eps, be_tensor *y, base_err *err);
    /* x += rmsnorm(d) * weight, per row: a post-block norm and its residual add. */
    int (*rmsnorm_add)(be_backend *be, const be_tensor *d, const be_tensor *weight, float eps,
                       be_tensor *x, base_err *err);
    /* `rmsnorm` of xa into ya and of xb into yb (each y may alias its x), in one pass: q's and
     * k's norms. */
    int (*rmsnorm_pair)(be_backend *be, const be_tensor *xa, const be_tensor *wa, be_tensor *ya,
                        const be_tensor *xb, const be_tensor *wb, be_tensor *yb, float eps,
                        base_err *err);
    /* ys[i] = x' ws[i]^T (+ bias) for i < 3 (Q, K and V sharing x), as three `matmul`s, where
     * x' = rmsnorm(x) * norm->weight with `norm`, x itself when norm is NULL. */
    int (*matmul_qkv)(be_backend *be, const be_tensor *x, const be_norm *norm,
                      const be_linear *const *ws, be_tensor *const *ys, base_err *err);
    /* y [n, out] = act(x' gate^T) * (x' up^T), biases included; gate and up of one shape;
     * x' as for matmul_qkv. */
    int (*matmul_glu)(be_backend *be, const be_tensor *x, const be_norm *norm,
                      const be_linear *gate, const be_linear *up, be_act act, be_tensor *y,
                      base_err *err);
    /* `rope` on q (n_heads = q->cols / layer->head_dim) and on k with one static table
     * (inv_freq [1, r], r <= head_dim / 2: the first 2 r dims of a head rotate, as in `rope`),
     * then `kv_append` of k and v: q and k are rotated in place. */
    int (*rope_kv_append)(be_backend *be, be_tensor *q, be_tensor *k, const be_tensor *v,
                          const be_tensor *positions, const be_tensor *inv_freq, float mscale,
                          const be_kv_layer *layer, const be_paged_batch *batch, base_err *err);
    /* `rope_kv_append` then `attention` (out from the rotated q, `attn` as there): q and k
     * are left rotated or not, at the backend's choice. */
    int (*rope_kv_attention)(be_backend *be, be_tensor *q, be_tensor *k, const be_tensor *v,
                             const be_tensor *positions, const be_tensor *inv_freq, float mscale,
                             const be_kv_layer *layer, const be_paged_batch *batch,
                             const be_decode_plan *plan, int n_heads, be_attn attn, be_tensor *out,
                             base_err *err);
    /* y [n, out] += x [n, in] W^T (+ bias): `matmul` then `add` into y, the residual stream
     * updated in place. y may not alias x. */
    int (*matmul_add)(be_backend *be, const be_tensor *x, const be_linear *w, be_tensor *y,
                      base_err *err);
} be_ops;

struct be_backend {
    const char *name; /* "cpu", "cuda" */
    char device[128]; /* what it runs on, for reports: the CPU model, the GPU's name */
    const be_ops *ops;
    base_dtype act_dtype;     /* activations dtype the backend computes in */
    int n_threads;            /* CPU worker threads (1 for GPU backends) */
    be_ceiling ceiling;       /* the bandwidth `mlxcel bench` measures decode against */
    unsigned quant_kinds;     /* the be_quant formats its matmul and embedding read, 1 << kind */
    unsigned moe_quant_kinds; /* the be_quant formats its moe op reads in stacked experts */
    int target_parallelism;   /* work items that fill the device: SMs x k, or CPU threads */
    uint64_t generation;      /* bumped when the backend replaces internal scratch memory */
    int prefill_chunk;        /* prompt tokens per forward step it suggests: large enough that
                                 the per-step weight traffic is paid rarely, small enough to
                                 bound activation memory */
    void *impl;
};

/* ---- collectives among the ranks of one model (tensor parallelism) ----
 * Each rank runs the forward pass on its own backend over its shard of the weights; after a
 * row-parallel matmul the ranks' partial outputs are summed, and the output head's columns
 * (the vocabulary) gathered. Every rank calls each collective in the same order with tensors
 * of the same shape; a call returns once this rank's result is in place (queued on its
 * backend, for a device's). */
typedef struct be_comm be_comm;

typedef struct be_comm_ops {
    /* x = the sum over the ranks of each rank's x, in place (the rank order fixed: every rank
     * gets the same bits). */
    int (*all_reduce_sum)(be_comm *c, be_backend *be, be_tensor *x, base_err *err);
    /* full [rows, n_ranks * part->cols] = the ranks' part [rows, cols] side by side in rank
     * order; full may not alias part. */
    int (*all_gather_cols)(be_comm *c, be_backend *be, const be_tensor *part, be_tensor *full,
                           base_err *err);
    void (*destroy)(be_comm *c);
} be_comm_ops;

struct be_comm {
    const be_comm_ops *ops;
    int rank, n_ranks;
    void *impl;
};

/* n_ranks communicators of one process (comms[r] for the thread running rank r), exchanging
 * through host memory with each backend's download and upload: any backend, no device link;
 * for tests and for the CPU. Each is freed with its ops->destroy, the shared state with the
 * last. */
int be_comm_local_create(int n_ranks, be_comm **comms, base_err *err);

/* NCCL, loaded at run time (libnccl.so.2, found by the dynamic loader: LD_LIBRARY_PATH may name
 * PyTorch's site-packages/nvidia/nccl/lib), so that a build without it is unchanged. */
typedef struct be_nccl be_nccl;
/* Loads the library and its entry points; an error says which is missing. */
int be_nccl_open(be_nccl **out, base_err *err);
void be_nccl_close(be_nccl *nccl);
/* The library's version as NCCL numbers it (2.21.5 = 22105). */
int be_nccl_version(const be_nccl *nccl);
/* One communicator per CUDA backend in bes (one GPU each, rank r = bes[r]), made together
 * (the ranks of one process), NVLink multicast off; their collectives run on each backend's
 * stream, so a recorded step records them too. Fails without CUDA. */
int be_comm_nccl_create(be_nccl *nccl, be_backend *const *bes, int n_ranks, be_comm **comms,
                        base_err *err);

/* CUDA devices visible to this process: 0 without a GPU or without CUDA in the build. */
int be_cuda_device_count(void);

/* The CPU backend; n_threads <= 0 means the core count. */
int be_cpu_create(int n_threads, be_backend **out, base_err *err);
/* The CUDA backend on device `device`; fails with a clear message when no GPU is present or
 * when mlxcel was built without CUDA. */
int be_cuda_create(int device, be_backend **out, base_err *err);
void be_destroy(be_backend *be);

#endif
