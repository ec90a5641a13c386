/* The tensor-parallel split of a model (model.h's model_shard): which heads, columns, rows
 * and experts each rank holds, and the checks that each rank's part is whole. */
#include "model/model_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether n splits over n_ranks; the error names what. */
static int even(int64_t n, int n_ranks, const char *what, base_err *err) {
    if (n % n_ranks == 0) return 0;
    return base_fail(err, "--tensor-parallel %d: %s %lld does not split over %d ranks", n_ranks,
                     what, (long long)n, n_ranks);
}

/* The quantization group of `module` where it is quantized: a row-parallel split of its k
 * range into parts of k_part columns must keep whole groups. */
static int whole_groups(const io_model_config *cfg, const char *module, int64_t k_part, int n_ranks,
                        base_err *err) {
    io_quant_spec q = io_config_quant_for(cfg, module);
    if (q.bits == 0 || k_part % q.group_size == 0) return 0;
    return base_fail(err,
                     "--tensor-parallel %d: %s would be split into %lld columns per rank, not a "
                     "multiple of its quantization group (%d)",
                     n_ranks, module, (long long)k_part, q.group_size);
}

static bool layer_moe(const io_model_config *c, int l) {
    return c->n_experts > 0 && (!c->layer_moe || c->layer_moe[l]);
}

/* Every layer's row-parallel weights split on group boundaries. */
static int check_groups(const io_model_config *c, const model_arch *arch, int n, base_err *err) {
    int64_t o_part = (int64_t)c->num_attention_heads / n * c->head_dim;
    int64_t down_part = (int64_t)c->intermediate_size / n;
    char module[256];
    for (int l = 0; l < c->num_hidden_layers; l++) {
        snprintf(module, sizeof module, "%slayers.%d.self_attn.o_proj", arch->names.prefix, l);
        if (whole_groups(c, module, o_part, n, err)) return -1;
        if (layer_moe(c, l)) continue;
        snprintf(module, sizeof module, "%slayers.%d.mlp.down_proj", arch->names.prefix, l);
        if (whole_groups(c, module, down_part, n, err)) return -1;
    }
    return 0;
}

static bool any_dense_mlp(const io_model_config *c) {
    for (int l = 0; l < c->num_hidden_layers; l++)
        if (!layer_moe(c, l)) return true;
    return false;
}

int model_shard_plan(const io_model_config *c, int n, int rank, model_shard *out, base_err *err) {
    if (n < 1 || rank < 0 || rank >= n)
        return base_fail(err, "--tensor-parallel %d: no rank %d", n, rank);
    const model_arch *arch = model_arch_find(c->model_type);
    if (!arch) return base_fail(err, "tensor parallelism: unknown model_type '%s'", c->model_type);
    int H = c->num_attention_heads, KV = c->num_key_value_heads;
    if (even(H, n, "num_attention_heads", err)) return -1;
    if (KV % n != 0 && n % KV != 0)
        return base_fail(err,
                         "--tensor-parallel %d: num_key_value_heads %d neither splits over %d "
                         "ranks nor divides them",
                         n, KV, n);
    /* RMSNorm over the whole q and k projections (OLMo 2) needs every head's sum of squares:
     * one more all-reduce per layer that is not written */
    if (n > 1 && c->qk_norm == IO_QK_NORM_FULL)
        return base_fail(err,
                         "--tensor-parallel %d: %s normalizes q and k over every head at once "
                         "(qk norm over the whole projection), which a split by heads does not "
                         "serve",
                         n, c->model_type);
    if (any_dense_mlp(c) && even(c->intermediate_size, n, "intermediate_size", err)) return -1;
    if (c->n_experts > 0 && even(c->n_experts, n, "the experts (num_experts)", err)) return -1;
    if (even(c->vocab_size, n, "vocab_size", err)) return -1;
    if (check_groups(c, arch, n, err)) return -1;
    int hpr = H / n;
    /* the query heads of a rank read consecutive KV heads: H / KV queries share one */
    int kv0 = rank * hpr / (H / KV);
    int nkv = KV >= n ? KV / n : 1;
    *out = (model_shard){.rank = rank,
                         .n_ranks = n,
                         .head0 = rank * hpr,
                         .n_heads = hpr,
                         .kv_head0 = kv0,
                         .n_kv_heads = nkv,
                         .inter0 = rank * (int64_t)c->intermediate_size / n,
                         .inter = c->intermediate_size / n,
                         .vocab0 = rank * (int64_t)c->vocab_size / n,
                         .vocab = c->vocab_size / n,
                         .expert0 = c->n_experts ? rank * (c->n_experts / n) : 0,
                         .n_experts = c->n_experts / n};
    return 0;
}

/* ---- mapping a rank's part (model_internal.h's model_shard_map) ---- */

static size_t weight_row_bytes(const be_linear *w, int64_t cols) {
    return w->bits ? (size_t)cols * (size_t)w->bits / 8 : (size_t)cols * base_dtype_size(w->dtype);
}

static size_t scale_row_bytes(const be_linear *w, int64_t cols) {
    return (size_t)(cols / w->group_size) * base_dtype_size(w->dtype);
}

/* Maps host bytes into the backend, *dev replacing them. `copy` is a host buffer of the
 * model's making: freed once the backend has its own copy, kept while the backend reads it in
 * place. */
static int map_part(model *m, const void *host, size_t bytes, void *copy, const void **dev,
                    base_err *err) {
    if (m->be->ops->map_weights(m->be, host, bytes, dev, err)) {
        free(copy);
        return -1;
    }
    if (*dev != host) {
        model_own_buffer(m, *dev);
        free(copy);
    } else if (copy) {
        m->host_parts =
            base_xrealloc(m->host_parts, (size_t)(m->n_host_parts + 1) * sizeof(void *));
        m->host_parts[m->n_host_parts++] = copy;
    }
    return 0;
}

/* Maps every tensor of a linear layer whose pointers are host memory. */
static int map_linear(model *m, be_linear *w, base_err *err) {
    if (!w->weight) return 0;
    size_t out = (size_t)w->out;
    if (map_part(m, w->weight, out * weight_row_bytes(w, w->in), NULL, &w->weight, err)) return -1;
    if (w->bits && map_part(m, w->scales, out * scale_row_bytes(w, w->in), NULL, &w->scales, err))
        return -1;
    if (w->bits && w->biases &&
        map_part(m, w->biases, out * scale_row_bytes(w, w->in), NULL, &w->biases, err))
        return -1;
    if (w->bias && map_part(m, w->bias, out * base_dtype_size(w->bias_dtype), NULL, &w->bias, err))
        return -1;
    return 0;
}

/* Column-parallel: rows [r0, r0 + n) of w, mapped. */
static int map_rows(model *m, be_linear *w, int64_t r0, int64_t n, base_err *err) {
    if (!w->weight) return 0;
    *w = be_linear_rows(w, r0, n);
    return map_linear(m, w, err);
}

/* Columns [k0, k0 + k) of every row of a [rows, row_bytes] host array of `unit` bytes per
 * column, copied and mapped. */
static int map_cols(model *m, const void *host, int64_t rows, size_t row_bytes, size_t k0_bytes,
                    size_t k_bytes, const void **dev, base_err *err) {
    char *copy = base_xmalloc((size_t)rows * k_bytes);
    for (int64_t r = 0; r < rows; r++)
        memcpy(copy + (size_t)r * k_bytes, (const char *)host + (size_t)r * row_bytes + k0_bytes,
               k_bytes);
    return map_part(m, copy, (size_t)rows * k_bytes, copy, dev, err);
}

/* Row-parallel: input columns [k0, k0 + k) of w (whole groups), mapped; the additive bias
 * goes to one rank only, since the ranks' outputs are summed. */
static int map_in_cols(model *m, be_linear *w, int64_t k0, int64_t k, bool keep_bias,
                       base_err *err) {
    if (!w->weight) return 0;
    int64_t in = w->in;
    if (map_cols(m, w->weight, w->out, weight_row_bytes(w, in), weight_row_bytes(w, k0),
                 weight_row_bytes(w, k), &w->weight, err))
        return -1;
    if (w->bits && map_cols(m, w->scales, w->out, scale_row_bytes(w, in), scale_row_bytes(w, k0),
                            scale_row_bytes(w, k), &w->scales, err))
        return -1;
    if (w->bits && w->biases &&
        map_cols(m, w->biases, w->out, scale_row_bytes(w, in), scale_row_bytes(w, k0),
                 scale_row_bytes(w, k), &w->biases, err))
        return -1;
    w->in = k;
    if (!keep_bias) w->bias = NULL;
    if (w->bias &&
        map_part(m, w->bias, (size_t)w->out * base_dtype_size(w->bias_dtype), NULL, &w->bias, err))
        return -1;
    return 0;
}

static int map_layer(model *m, model_layer *L, base_err *err) {
    const io_model_config *c = &m->cfg;
    const model_shard *s = &m->shard;
    int64_t hd = c->head_dim, hidden = c->hidden_size;
    if (map_rows(m, &L->q, s->head0 * hd, s->n_heads * hd, err) ||
        map_rows(m, &L->k, s->kv_head0 * hd, s->n_kv_heads * hd, err) ||
        map_rows(m, &L->v, s->kv_head0 * hd, s->n_kv_heads * hd, err) ||
        map_in_cols(m, &L->o, s->head0 * hd, s->n_heads * hd, s->rank == 0, err))
        return -1;
    if (L->sinks.data) {
        L->sinks.data = (float *)L->sinks.data + s->head0;
        L->sinks.cols = s->n_heads;
        L->attn.sinks = L->sinks.data;
    }
    if (L->moe) {
        int64_t I = L->experts.inter, e0 = s->expert0, ne = s->n_experts;
        if (map_linear(m, &L->router, err) || map_rows(m, &L->egate, e0 * I, ne * I, err) ||
            map_rows(m, &L->eup, e0 * I, ne * I, err) ||
            map_rows(m, &L->edown, e0 * hidden, ne * hidden, err))
            return -1;
        L->experts.expert0 = (int)e0;
        L->experts.n_local = (int)ne;
    } else if (map_rows(m, &L->gate, s->inter0, s->inter, err) ||
               map_rows(m, &L->up, s->inter0, s->inter, err) ||
               map_in_cols(m, &L->down, s->inter0, s->inter, s->rank == 0, err)) {
        return -1;
    }
    be_linear *lins[] = {&L->q, &L->k, &L->v, &L->o, &L->gate, &L->up, &L->down};
    for (size_t i = 0; i < sizeof lins / sizeof lins[0]; i++)
        if (model_pack_linear(m, lins[i], err)) return -1;
    return 0;
}

/* The rank's rows of the embedding table, and a row of zeros after them where the ids of the
 * other ranks' rows are sent (model_shard_ids): each rank's lookup is its share of x, and the
 * all-reduce after it the whole. A quantized zero row is zero codes, scales and biases. */
static int map_embed(model *m, base_err *err) {
    int64_t n = m->shard.vocab;
    be_linear v = be_linear_rows(&m->embed, m->shard.vocab0, n);
    size_t srow = v.bits ? scale_row_bytes(&v, v.in) : 0;
    struct {
        const void *src;
        size_t row;
        const void **dst;
    } parts[] = {{v.weight, weight_row_bytes(&v, v.in), &v.weight},
                 {v.scales, srow, &v.scales},
                 {v.biases, srow, &v.biases}};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        if (!parts[i].src || !parts[i].row) continue;
        char *copy = base_xcalloc((size_t)n + 1, parts[i].row);
        memcpy(copy, parts[i].src, (size_t)n * parts[i].row);
        if (map_part(m, copy, ((size_t)n + 1) * parts[i].row, copy, parts[i].dst, err)) return -1;
    }
    v.out = n + 1;
    m->embed = v;
    return 0;
}

void model_shard_ids(const model *m, const int32_t *tokens, int n, int32_t *ids) {
    int64_t v0 = m->shard.vocab0, nv = m->shard.vocab;
    for (int i = 0; i < n; i++)
        ids[i] = tokens[i] >= v0 && tokens[i] < v0 + nv ? (int32_t)(tokens[i] - v0) : (int32_t)nv;
}

int model_shard_map(model *m, base_err *err) {
    m->sharded_bind = false;
    if (map_embed(m, err) || map_rows(m, &m->lm_head, m->shard.vocab0, m->shard.vocab, err) ||
        model_pack_linear(m, &m->lm_head, err))
        return -1;
    for (int l = 0; l < m->cfg.num_hidden_layers; l++)
        if (map_layer(m, &m->layers[l], err)) return -1;
    return 0;
}

int model_kv_heads(const model *m) {
    return m->shard.n_kv_heads;
}
