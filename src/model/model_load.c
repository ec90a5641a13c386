/* Loading: config.json through the family's descriptor, the checkpoint, and binding every
 * tensor the family needs by the names its descriptor gives, dense or MLX affine-quantized,
 * into backend memory. */
#include "model/model_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int map_tensor(model *m, const io_tensor *t, const void **dev, base_err *err) {
    m->bytes_bound += t->nbytes;
    /* a sharded linear keeps the host bytes: model_shard_map maps the rank's part of them */
    if (m->sharded_bind && m->in_linear) {
        *dev = t->data;
        return 0;
    }
    if (m->be->ops->map_weights(m->be, t->data, t->nbytes, dev, err))
        return base_fail_wrap(err, "%s: tensor %s", t->file, t->name);
    if (*dev != t->data) model_own_buffer(m, *dev);
    return 0;
}

static bool is_float_dtype(base_dtype dt) {
    return dt == BASE_DTYPE_F32 || dt == BASE_DTYPE_F16 || dt == BASE_DTYPE_BF16;
}

void model_shape_str(const io_tensor *t, char *buf, size_t size) {
    int n = snprintf(buf, size, "[");
    for (int i = 0; i < t->ndim && n < (int)size; i++)
        n += snprintf(buf + n, size - (size_t)n, i ? ", %lld" : "%lld", (long long)t->shape[i]);
    if (n < (int)size) snprintf(buf + n, size - (size_t)n, "]");
}

/* Whether t is [d0, d1], or while stacked experts are bound [n, d0 / n, d1] for n experts
 * (mlx-lm's [experts, out, in]), which is the same memory. */
static bool shape_2d(const model *m, const io_tensor *t, int64_t d0, int64_t d1) {
    if (t->ndim == 2) return t->shape[0] == d0 && t->shape[1] == d1;
    return m->stacking > 0 && t->ndim == 3 && t->shape[0] == m->stacking &&
           t->shape[0] * t->shape[1] == d0 && t->shape[2] == d1;
}

/* Finds `name` and checks it is a float tensor of shape [d0] or [d0, d1] (d1 < 0: 1-D). */
static int find_float(model *m, const char *name, int64_t d0, int64_t d1, const io_tensor **out,
                      base_err *err) {
    const io_tensor *t = io_checkpoint_find(m->ck, name);
    if (!t) return base_fail(err, "checkpoint: missing tensor %s", name);
    /* A stacked experts' bias [n, d0 / n] is the vector [d0]. */
    bool shape_ok = d1 < 0 ? (t->ndim == 1 && t->shape[0] == d0) ||
                                 (m->stacking > 0 && t->ndim == 2 && t->shape[0] == m->stacking &&
                                  t->shape[0] * t->shape[1] == d0)
                           : shape_2d(m, t, d0, d1);
    if (!shape_ok) {
        char got[96];
        model_shape_str(t, got, sizeof got);
        if (d1 < 0)
            return base_fail(err, "%s: tensor %s has shape %s, expected [%lld] from config.json",
                             t->file, name, got, (long long)d0);
        return base_fail(err, "%s: tensor %s has shape %s, expected [%lld, %lld] from config.json",
                         t->file, name, got, (long long)d0, (long long)d1);
    }
    if (!is_float_dtype(t->dtype))
        return base_fail(err, "%s: tensor %s has dtype %s, expected F32, F16 or BF16", t->file,
                         name, base_dtype_name(t->dtype));
    *out = t;
    return 0;
}

void model_own_buffer(model *m, const void *dev) {
    if (m->n_mapped == m->cap_mapped) {
        m->cap_mapped = m->cap_mapped ? m->cap_mapped * 2 : 64;
        m->mapped = base_xrealloc(m->mapped, (size_t)m->cap_mapped * sizeof *m->mapped);
    }
    m->mapped[m->n_mapped++] = dev;
}

/* A host F32 array copied into a new backend buffer the model owns. */
static int upload_f32(model *m, const float *host, int64_t n, be_tensor *out, base_err *err) {
    be_backend *be = m->be;
    void *dev;
    size_t bytes = (size_t)n * sizeof(float);
    if (be->ops->alloc(be, bytes, &dev, err)) return -1;
    model_own_buffer(m, dev);
    if (be->ops->upload(be, dev, host, bytes, err)) return -1;
    *out = (be_tensor){.data = dev, .dtype = BASE_DTYPE_F32, .rows = 1, .cols = n};
    return 0;
}

/* A float vector [n] copied to F32 in backend memory (attention sinks, which the attention
 * kernels read as F32 whatever the checkpoint stores). */
static int bind_f32(model *m, const char *name, int64_t n, be_tensor *out, base_err *err) {
    const io_tensor *t;
    if (find_float(m, name, n, -1, &t, err)) return -1;
    float *v = base_xmalloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = base_load_float(t->data, t->dtype, i);
    int rc = upload_f32(m, v, n, out, err);
    free(v);
    return rc;
}

/* A norm's scale vector [n]. Gemma stores w for a (1 + w) scale: the sum is formed once here,
 * in F32 (exact for bf16 and f16 weights of Gemma's magnitudes), so that every norm op, fused
 * or not, takes a plain scale. */
static int bind_norm(model *m, const char *name, int64_t n, be_tensor *out, base_err *err) {
    const io_tensor *t;
    if (find_float(m, name, n, -1, &t, err)) return -1;
    if (!m->cfg.norm_plus_one) {
        const void *dev;
        if (map_tensor(m, t, &dev, err)) return -1;
        *out = (be_tensor){.data = (void *)dev, .dtype = t->dtype, .rows = 1, .cols = n};
        return 0;
    }
    float *w = base_xmalloc((size_t)n * sizeof *w);
    for (int64_t i = 0; i < n; i++) w[i] = 1.0f + base_load_float(t->data, t->dtype, i);
    int rc = upload_f32(m, w, n, out, err);
    free(w);
    return rc;
}

/* MXFP4: scales are one E8M0 byte per 32 values, [out, in / 32] U8, and there are no
 * biases (a biases tensor would mean the config's mode is wrong). */
static int bind_mxfp4(model *m, const char *module, const io_tensor *w, io_quant_spec spec,
                      int64_t out, be_linear *lin, base_err *err) {
    char name[256];
    snprintf(name, sizeof name, "%s.scales", module);
    const io_tensor *scales = io_checkpoint_find(m->ck, name);
    if (!scales) return base_fail(err, "checkpoint: missing tensor %s", name);
    if (scales->dtype != BASE_DTYPE_U8 || !shape_2d(m, scales, out, lin->in / 32)) {
        char got[96];
        model_shape_str(scales, got, sizeof got);
        return base_fail(err, "%s: tensor %s is %s %s, expected U8 [%lld, %lld] for mxfp4",
                         scales->file, name, base_dtype_name(scales->dtype), got, (long long)out,
                         (long long)(lin->in / 32));
    }
    snprintf(name, sizeof name, "%s.biases", module);
    if (io_checkpoint_find(m->ck, name))
        return base_fail(err, "%s: tensor %s exists, but config.json says module %s is mxfp4",
                         scales->file, name, module);
    lin->bits = spec.bits;
    lin->group_size = spec.group_size;
    lin->quant = BE_QUANT_MXFP4;
    lin->dtype = BASE_DTYPE_U8;
    if (map_tensor(m, w, &lin->weight, err) || map_tensor(m, scales, &lin->scales, err)) return -1;
    return 0;
}

/* A quantized linear: weight U32 [out, in*bits/32], scales and biases [out, in/group]. */
static int bind_quantized(model *m, const char *module, const io_tensor *w, io_quant_spec spec,
                          int64_t out, int64_t in, be_linear *lin, base_err *err) {
    char name[256];
    if (spec.bits == 0)
        return base_fail(err,
                         "%s: tensor %s.weight is packed (U32) but config.json's quantization does "
                         "not cover module %s",
                         w->file, module, module);
    if (in % spec.group_size != 0 || (in * spec.bits) % 32 != 0)
        return base_fail(err, "%s: module %s: input size %lld is not a multiple of group size %d",
                         w->file, module, (long long)in, spec.group_size);
    int64_t packed = in * spec.bits / 32, groups = in / spec.group_size;
    if (w->dtype != BASE_DTYPE_U32 || !shape_2d(m, w, out, packed)) {
        char got[96];
        model_shape_str(w, got, sizeof got);
        return base_fail(err,
                         "%s: tensor %s.weight is %s %s, expected U32 [%lld, %lld] for %d-bit "
                         "weights of [%lld, %lld]",
                         w->file, module, base_dtype_name(w->dtype), got, (long long)out,
                         (long long)packed, spec.bits, (long long)out, (long long)in);
    }
    /* Stacked experts are read by the moe op alone, which may read formats matmul does not. */
    unsigned kinds = m->stacking ? m->be->moe_quant_kinds : m->be->quant_kinds;
    if (!(kinds & 1u << (spec.mode == IO_QUANT_MXFP4 ? BE_QUANT_MXFP4 : BE_QUANT_AFFINE)))
        return base_fail(err, "%s: module %s is %s, which the %s backend does not read yet",
                         w->file, module, spec.mode == IO_QUANT_MXFP4 ? "mxfp4" : "affine",
                         m->be->name);
    if (spec.mode == IO_QUANT_MXFP4) return bind_mxfp4(m, module, w, spec, out, lin, err);
    const io_tensor *scales, *biases;
    snprintf(name, sizeof name, "%s.scales", module);
    if (find_float(m, name, out, groups, &scales, err)) return -1;
    snprintf(name, sizeof name, "%s.biases", module);
    if (find_float(m, name, out, groups, &biases, err)) return -1;
    if (scales->dtype != biases->dtype)
        return base_fail(err, "%s: module %s: scales are %s but biases are %s", scales->file,
                         module, base_dtype_name(scales->dtype), base_dtype_name(biases->dtype));
    lin->bits = spec.bits;
    lin->group_size = spec.group_size;
    lin->dtype = scales->dtype;
    if (map_tensor(m, w, &lin->weight, err) || map_tensor(m, scales, &lin->scales, err) ||
        map_tensor(m, biases, &lin->biases, err))
        return -1;
    return 0;
}

static int bind_linear_whole(model *m, const char *module, int64_t out, int64_t in, bool has_bias,
                             be_linear *lin, base_err *err);

/* Binds module.weight [out, in] (dense or quantized), and module.bias [out] when has_bias; in
 * a sharded model its pointers are host memory until model_shard_map. */
static int bind_linear(model *m, const char *module, int64_t out, int64_t in, bool has_bias,
                       be_linear *lin, base_err *err) {
    m->in_linear = true;
    int rc = bind_linear_whole(m, module, out, in, has_bias, lin, err);
    m->in_linear = false;
    return rc;
}

static int bind_linear_whole(model *m, const char *module, int64_t out, int64_t in, bool has_bias,
                             be_linear *lin, base_err *err) {
    char name[256];
    memset(lin, 0, sizeof *lin);
    lin->out = out;
    lin->in = in;
    snprintf(name, sizeof name, "%s.weight", module);
    const io_tensor *w = io_checkpoint_find(m->ck, name);
    if (!w) return base_fail(err, "checkpoint: missing tensor %s", name);
    snprintf(name, sizeof name, "%s.scales", module);
    bool quantized = io_checkpoint_find(m->ck, name) != NULL || w->dtype == BASE_DTYPE_U32;
    if (quantized) {
        io_quant_spec spec = io_config_quant_for(&m->cfg, module);
        if (bind_quantized(m, module, w, spec, out, in, lin, err)) return -1;
    } else {
        snprintf(name, sizeof name, "%s.weight", module);
        if (find_float(m, name, out, in, &w, err)) return -1;
        lin->dtype = w->dtype;
        if (map_tensor(m, w, &lin->weight, err)) return -1;
    }
    if (has_bias) {
        const io_tensor *b;
        snprintf(name, sizeof name, "%s.bias", module);
        if (find_float(m, name, out, -1, &b, err)) return -1;
        lin->bias_dtype = b->dtype;
        if (map_tensor(m, b, &lin->bias, err)) return -1;
    }
    return 0;
}

/* A norm the family may not have: name NULL leaves out->data NULL. */
static int bind_norm_opt(model *m, const char *p, const char *name, int64_t n, be_tensor *out,
                         base_err *err) {
    memset(out, 0, sizeof *out);
    if (!name) return 0;
    char full[256];
    snprintf(full, sizeof full, "%s%s.weight", p, name);
    return bind_norm(m, full, n, out, err);
}

static int bind_attention(model *m, const char *p, model_layer *L, base_err *err) {
    const io_model_config *c = &m->cfg;
    const model_names *nm = &m->arch->names;
    int64_t hidden = c->hidden_size;
    int64_t qdim = (int64_t)c->num_attention_heads * c->head_dim;
    int64_t kvdim = (int64_t)c->num_key_value_heads * c->head_dim;
    char name[256];
#define MODULE(suffix) (snprintf(name, sizeof name, "%s%s", p, suffix), name)
    if (nm->qkv) {
        be_linear fused;
        if (bind_linear(m, MODULE(nm->qkv), qdim + 2 * kvdim, hidden, c->attention_bias, &fused,
                        err))
            return -1;
        L->q = be_linear_rows(&fused, 0, qdim);
        L->k = be_linear_rows(&fused, qdim, kvdim);
        L->v = be_linear_rows(&fused, qdim + kvdim, kvdim);
    } else if (bind_linear(m, MODULE("self_attn.q_proj"), qdim, hidden, c->attention_bias, &L->q,
                           err) ||
               bind_linear(m, MODULE("self_attn.k_proj"), kvdim, hidden, c->attention_bias, &L->k,
                           err) ||
               bind_linear(m, MODULE("self_attn.v_proj"), kvdim, hidden, c->attention_bias, &L->v,
                           err)) {
        return -1;
    }
    if (bind_linear(m, MODULE("self_attn.o_proj"), hidden, qdim, c->o_bias, &L->o, err)) return -1;
    memset(&L->sinks, 0, sizeof L->sinks);
    if (c->attn_sinks &&
        bind_f32(m, MODULE("self_attn.sinks"), c->num_attention_heads, &L->sinks, err))
        return -1;
    memset(&L->q_norm, 0, sizeof L->q_norm);
    memset(&L->k_norm, 0, sizeof L->k_norm);
    if (c->qk_norm != IO_QK_NORM_NONE) {
        bool head = c->qk_norm == IO_QK_NORM_HEAD;
        if (bind_norm(m, MODULE("self_attn.q_norm.weight"), head ? c->head_dim : qdim, &L->q_norm,
                      err) ||
            bind_norm(m, MODULE("self_attn.k_norm.weight"), head ? c->head_dim : kvdim, &L->k_norm,
                      err))
            return -1;
    }
#undef MODULE
    return 0;
}

static int bind_mlp(model *m, const char *p, model_layer *L, base_err *err) {
    const io_model_config *c = &m->cfg;
    const model_names *nm = &m->arch->names;
    int64_t hidden = c->hidden_size, inter = c->intermediate_size;
    char name[256];
#define MODULE(suffix) (snprintf(name, sizeof name, "%s%s", p, suffix), name)
    if (nm->gate_up) {
        be_linear fused;
        if (bind_linear(m, MODULE(nm->gate_up), 2 * inter, hidden, false, &fused, err)) return -1;
        L->gate = be_linear_rows(&fused, 0, inter);
        L->up = be_linear_rows(&fused, inter, inter);
    } else if (bind_linear(m, MODULE("mlp.gate_proj"), inter, hidden, false, &L->gate, err) ||
               bind_linear(m, MODULE("mlp.up_proj"), inter, hidden, false, &L->up, err)) {
        return -1;
    }
    return bind_linear(m, MODULE("mlp.down_proj"), hidden, inter, false, &L->down, err);
#undef MODULE
}

/* The router and the stacked experts of an MoE layer. */
static int bind_moe(model *m, const char *p, model_layer *L, base_err *err) {
    const io_model_config *c = &m->cfg;
    const model_names *nm = &m->arch->names;
    int64_t hidden = c->hidden_size, inter = c->moe_intermediate_size, E = c->n_experts;
    char name[256];
    snprintf(name, sizeof name, "%s%s", p, nm->router);
    bool bias = c->moe_bias;
    if (bind_linear(m, name, E, hidden, bias, &L->router, err)) return -1;
    m->stacking = (int)E;
    int rc = 0;
    snprintf(name, sizeof name, "%s%s.gate_proj", p, nm->experts);
    rc = bind_linear(m, name, E * inter, hidden, bias, &L->egate, err);
    snprintf(name, sizeof name, "%s%s.up_proj", p, nm->experts);
    if (!rc) rc = bind_linear(m, name, E * inter, hidden, bias, &L->eup, err);
    snprintf(name, sizeof name, "%s%s.down_proj", p, nm->experts);
    if (!rc) rc = bind_linear(m, name, E * hidden, inter, bias, &L->edown, err);
    m->stacking = 0;
    /* Expert views are rows of the stacked tensors: the in dims must still be whole. */
    L->egate.in = L->eup.in = hidden;
    L->edown.in = inter;
    L->moe = true;
    L->experts = (be_moe){.router = &L->router,
                          .gate = &L->egate,
                          .up = &L->eup,
                          .down = &L->edown,
                          .n_experts = c->n_experts,
                          .top_k = c->n_experts_used,
                          .inter = (int)inter,
                          .norm_topk = c->moe_norm_topk,
                          .act = model_act(c->act)};
    return rc;
}

/* The backend's own copy of a linear layer for its batched kernels, freed with the model. */
int model_pack_linear(model *m, be_linear *lin, base_err *err) {
    /* a sharded model packs each rank's part once it is mapped (model_shard_map) */
    if (m->sharded_bind || !m->be->ops->pack_linear || lin->bits == 0) return 0;
    if (m->be->ops->pack_linear(m->be, lin, err)) return -1;
    if (lin->packed) model_own_buffer(m, lin->packed);
    return 0;
}

static int bind_layer(model *m, int l, base_err *err) {
    const io_model_config *c = &m->cfg;
    const model_names *nm = &m->arch->names;
    model_layer *L = &m->layers[l];
    int64_t hidden = c->hidden_size;
    char p[160];
    snprintf(p, sizeof p, "%slayers.%d.", nm->prefix, l);
    bool moe = c->n_experts > 0 && (!c->layer_moe || c->layer_moe[l]);
    if (bind_attention(m, p, L, err) || (moe ? bind_moe(m, p, L, err) : bind_mlp(m, p, L, err)) ||
        bind_norm_opt(m, p, nm->attn_norm, hidden, &L->attn_norm, err) ||
        bind_norm_opt(m, p, nm->post_attn_norm, hidden, &L->post_attn_norm, err) ||
        bind_norm_opt(m, p, nm->mlp_norm, hidden, &L->mlp_norm, err) ||
        bind_norm_opt(m, p, nm->post_mlp_norm, hidden, &L->post_mlp_norm, err))
        return -1;
    be_linear *lins[] = {&L->q, &L->k, &L->v, &L->o, &L->gate, &L->up, &L->down};
    for (size_t i = 0; i < sizeof lins / sizeof lins[0]; i++)
        if (model_pack_linear(m, lins[i], err)) return -1;
    L->local = c->layer_local && c->layer_local[l];
    L->attn = be_attn_plain(c->attn_scale > 0 ? c->attn_scale : 1.0f / sqrtf((float)c->head_dim));
    L->attn.softcap = c->attn_softcap;
    L->attn.window = L->local ? c->sliding_window : 0;
    L->attn.sinks = L->sinks.data;
    return 0;
}

int model_bind_weights(model *m, base_err *err) {
    const io_model_config *c = &m->cfg;
    const char *prefix = m->arch->names.prefix;
    char name[160];
    snprintf(name, sizeof name, "%sembed_tokens", prefix);
    if (bind_linear(m, name, c->vocab_size, c->hidden_size, false, &m->embed, err)) return -1;
    snprintf(name, sizeof name, "%snorm.weight", prefix);
    if (bind_norm(m, name, c->hidden_size, &m->final_norm, err)) return -1;
    /* Beside the text model: "lm_head" for "model.", "language_model.lm_head" for
     * "language_model.model."; a sequence classifier's "score" likewise. */
    size_t keep = strlen(prefix) >= 6 ? strlen(prefix) - 6 : 0;
    if (c->num_labels > 0) {
        snprintf(name, sizeof name, "%.*sscore.weight", (int)keep, prefix);
        if (find_float(m, name, c->num_labels, c->hidden_size, &m->score, err)) return -1;
    }
    if (c->tie_word_embeddings) {
        m->lm_head = m->embed;
    } else if (c->num_labels == 0) {
        snprintf(name, sizeof name, "%.*slm_head", (int)keep, prefix);
        if (bind_linear(m, name, c->vocab_size, c->hidden_size, false, &m->lm_head, err)) return -1;
    }
    if (model_pack_linear(m, &m->lm_head, err)) return -1;
    m->layers = base_xcalloc((size_t)c->num_hidden_layers, sizeof *m->layers);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        if (bind_layer(m, l, err)) return -1;
        if (m->progress) {
            uint64_t total = io_checkpoint_bytes(m->ck);
            bool last = l + 1 == c->num_hidden_layers;
            m->progress(m->progress_ctx, last || m->bytes_bound > total ? total : m->bytes_bound,
                        total);
        }
    }
    return 0;
}

/* Weights with NaN or Inf load fine and then poison every logit, which looks like a broken
 * kernel; a warning at load names the tensor instead. To stay cheap on multi-gigabyte
 * checkpoints, a tensor of up to FINITE_FULL_SCAN elements (norms, biases, small scales) is
 * read whole, and a larger one (the matrices) at FINITE_SAMPLES evenly spaced elements, its
 * first and last included. Tested on the bits: no conversion, any alignment. */
#define FINITE_FULL_SCAN (1 << 16)
#define FINITE_SAMPLES   1024

static bool element_finite(const uint8_t *p, base_dtype dt) {
    if (dt == BASE_DTYPE_F32) {
        uint32_t u;
        memcpy(&u, p, 4);
        return (u & 0x7f800000u) != 0x7f800000u;
    }
    uint16_t h;
    memcpy(&h, p, 2);
    uint16_t exp_mask = dt == BASE_DTYPE_F16 ? 0x7c00u : 0x7f80u;
    return (h & exp_mask) != exp_mask;
}

/* Logs a warning for each float tensor where NaN or Inf is found. */
static void model_warn_non_finite(const io_checkpoint *ck) {
    for (size_t i = 0; i < io_checkpoint_count(ck); i++) {
        const io_tensor *t = io_checkpoint_at(ck, i);
        if (!is_float_dtype(t->dtype) || t->nbytes == 0) continue;
        size_t esize = base_dtype_size(t->dtype);
        uint64_t n = t->nbytes / esize;
        uint64_t checks = n <= FINITE_FULL_SCAN ? n : FINITE_SAMPLES;
        const uint8_t *data = t->data;
        for (uint64_t k = 0; k < checks; k++) {
            uint64_t idx = checks == n ? k : k * (n - 1) / (checks - 1);
            if (!element_finite(data + idx * esize, t->dtype)) {
                base_log(BASE_LOG_WARN,
                         "%s: tensor %s holds NaN or Inf (element %llu; %s of its %llu values "
                         "checked)",
                         t->file, t->name, (unsigned long long)idx,
                         checks == n ? "all" : "evenly spaced samples", (unsigned long long)n);
                break;
            }
        }
    }
}

/* A RoPE table in backend memory, for `local` layers or the others, of a sequence of seq_len. */
static int rope_table(model *m, bool local, int seq_len, be_tensor *out, float *mscale,
                      base_err *err) {
    int half = m->cfg.rotary_dim / 2;
    float *freqs = base_xmalloc((size_t)half * sizeof *freqs);
    model_rope_freqs(&m->cfg, local, seq_len, freqs, mscale);
    int rc = upload_f32(m, freqs, half, out, err);
    free(freqs);
    return rc;
}

int model_load(const char *dir, be_backend *be, model_progress_fn progress, void *progress_ctx,
               model **out, base_err *err) {
    return model_load_shard(dir, be, 1, 0, NULL, progress, progress_ctx, out, err);
}

int model_load_shard(const char *dir, be_backend *be, int n_ranks, int rank, be_comm *comm,
                     model_progress_fn progress, void *progress_ctx, model **out, base_err *err) {
    model *m = base_xcalloc(1, sizeof *m);
    m->be = be;
    m->progress = progress;
    m->progress_ctx = progress_ctx;
    if (model_config_load(dir, &m->cfg, &m->arch, err)) {
        free(m);
        return -1;
    }
    if (model_shard_plan(&m->cfg, n_ranks, rank, &m->shard, err)) {
        model_free(m);
        return -1;
    }
    if (n_ranks > 1 && (!comm || comm->n_ranks != n_ranks || comm->rank != rank)) {
        base_fail(err, "rank %d of %d: no communicator of that rank", rank, n_ranks);
        model_free(m);
        return -1;
    }
    m->comm = n_ranks > 1 ? comm : NULL;
    m->sharded_bind = n_ranks > 1;
    if (m->cfg.n_experts > 0 && !be->ops->moe) {
        base_fail(err,
                  "%s: %s is a mixture of experts, which the %s backend does not run yet "
                  "(use --device cpu)",
                  dir, m->cfg.model_type, be->name);
        model_free(m);
        return -1;
    }
    /* longrope's scale depends on the config alone: the short table's is the long one's. */
    int max_pos = m->cfg.max_position_embeddings, long_after = model_rope_long_after(&m->cfg);
    float short_mscale;
    if (model_checkpoint_open(dir, &m->cfg, true, &m->ck, err) || model_bind_weights(m, err) ||
        (n_ranks > 1 && model_shard_map(m, err)) ||
        rope_table(m, false, max_pos, &m->inv_freq, &m->rope_mscale, err) ||
        (long_after > 0 &&
         rope_table(m, false, long_after, &m->inv_freq_short, &short_mscale, err)) ||
        (m->cfg.rope_local_theta > 0 &&
         rope_table(m, true, max_pos, &m->inv_freq_local, &m->rope_local_mscale, err))) {
        model_free(m);
        return -1;
    }
    model_warn_non_finite(m->ck);
    *out = m;
    return 0;
}

const io_model_config *model_config(const model *m) {
    return &m->cfg;
}

bool model_has_lm_head(const model *m) {
    return m->lm_head.weight != NULL;
}

int model_score_head(const model *m, float **w, base_err *err) {
    *w = NULL;
    if (!m->score)
        return base_fail(err, "the checkpoint is not a sequence classifier: it has no score head");
    const io_tensor *t = m->score;
    int64_t n = (int64_t)m->cfg.num_labels * m->cfg.hidden_size;
    *w = base_xmalloc((size_t)n * sizeof **w);
    for (int64_t i = 0; i < n; i++) (*w)[i] = base_load_float(t->data, t->dtype, i);
    return 0;
}

uint64_t model_weight_bytes(const model *m) {
    return io_checkpoint_bytes(m->ck);
}
