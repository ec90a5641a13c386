/* The forward pass, written once against the backend ops for every family; what differs is
 * what the descriptors put in the layers (model_internal.h):
 *   x = embed(tokens) [* embed_scale]
 *   per layer:  h = [rmsnorm(x) * attn_norm]; q,k,v = h Wq, h Wk, h Wv (+ biases);
 *               [q, k = rmsnorm per head or whole]; rope(q, k) with the layer's table;
 *               append k, v to the paged pool; a = attention(q, pool) [capped, windowed]
 *               a = a Wo [-> rmsnorm * post_attn_norm] [* residual_scale];  x += a
 *               h = [rmsnorm(x) * mlp_norm];  d = (act(h Wgate) * h Wup) Wdown
 *               [d -> rmsnorm * post_mlp_norm] [* residual_scale];  x += d
 *   logits = rmsnorm(x[rows wanted]) * final_norm Wlm_head [* logits_scale] [-> softcap]
 * A backend with matmul_add folds each norm before a block into the matmuls after it, and
 * each residual add into the matmul before it where the block's output goes to the residual
 * as it is (Llama-like families): q,k,v = rmsnorm(x) W..; x += a Wo; x += (act(rmsnorm(x)
 * Wgate) * (rmsnorm(x) Wup)) Wdown, with no h in between.
 * Under tensor parallelism (model_load_shard) every rank runs this over its heads, columns and
 * experts (m->shard; the whole model with one rank): the outputs of Wo, Wdown and the experts
 * are the rank's partial sums, all-reduced before the residual add (so never folded into the
 * matmul), and the logits its vocabulary columns, gathered from every rank; the embedding is
 * its vocabulary rows' share of x (a zero row for the others'), all-reduced likewise. */
#include "model/model_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        if ((expr) != 0) return -1;                                                                \
    } while (0)

static size_t align8(size_t n) {
    return (n + 7) & ~(size_t)7;
}

/* Replaces *buf with a larger buffer; recorded steps that name the old one are stale from
 * then on, which the scratch generation tells them. */
static int grow(model *m, void **buf, size_t bytes, base_err *err) {
    be_backend *be = m->be;
    m->s.generation++;
    if (*buf) be->ops->free(be, *buf);
    *buf = NULL;
    return be->ops->alloc(be, bytes ? bytes : 8, buf, err);
}

/* Grows the activation buffers to hold n tokens and n_out logit rows. */
static int scratch_reserve(model *m, int n, int n_out, base_err *err) {
    model_scratch *s = &m->s;
    be_backend *be = m->be;
    const io_model_config *c = &m->cfg;
    size_t act = base_dtype_size(be->act_dtype);
    if (n > s->cap_tokens) {
        size_t rows = (size_t)n;
        size_t qdim = (size_t)m->shard.n_heads * c->head_dim;
        size_t kvdim = (size_t)m->shard.n_kv_heads * c->head_dim;
        TRY(grow(m, &s->x, rows * c->hidden_size * act, err));
        TRY(grow(m, &s->h, rows * c->hidden_size * act, err));
        TRY(grow(m, &s->q, rows * qdim * act, err));
        TRY(grow(m, &s->k, rows * kvdim * act, err));
        TRY(grow(m, &s->v, rows * kvdim * act, err));
        TRY(grow(m, &s->att, rows * qdim * act, err));
        TRY(grow(m, &s->gate, rows * (size_t)m->shard.inter * act, err));
        TRY(grow(m, &s->up, rows * (size_t)m->shard.inter * act, err));
        if (c->n_experts > 0) TRY(grow(m, &s->moe_out, rows * c->hidden_size * act, err));
        TRY(grow(m, &s->ids, rows * sizeof(int32_t), err));
        s->cap_tokens = n;
    }
    if (n_out > s->cap_out) {
        TRY(grow(m, &s->out_x, (size_t)n_out * c->hidden_size * act, err));
        TRY(grow(m, &s->logits, (size_t)n_out * c->vocab_size * sizeof(float), err));
        if (m->comm)
            TRY(grow(m, &s->logits_part, (size_t)n_out * (size_t)m->shard.vocab * sizeof(float),
                     err));
        s->cap_out = n_out;
    }
    return 0;
}

/* Ints of the local view's page list in backend memory: at least what n_seqs decode rows
 * can hold (kv_local_blocks_per_step of one token each), so that the global page list after
 * it keeps its address from one decode step to the next. */
static size_t local_pages_region(const kv_pool *pool, const be_paged_batch *hl) {
    size_t used = (size_t)hl->page_indptr[hl->n_seqs];
    size_t decode =
        (size_t)hl->n_seqs * (size_t)kv_local_blocks_per_step(kv_pool_geometry(pool), 1);
    return used > decode ? used : decode;
}

/* Copies the batch's CSR arrays, both views, into backend memory in one upload; *dev (and
 * *dev_local, with a local view) point into it. The views share q_indptr and positions. */
static int upload_batch(model *m, const kv_pool *pool, const kv_batch *batch, be_paged_batch *dev,
                        be_paged_batch *dev_local, base_err *err) {
    const be_paged_batch *hb = &batch->view, *hl = &batch->local;
    bool local = kv_pool_has_local(pool);
    int ns = hb->n_seqs, nt = hb->n_tokens, np = hb->page_indptr[ns];
    size_t nl = local ? (size_t)hl->page_indptr[ns] : 0;
    size_t local_region = local ? local_pages_region(pool, hl) * 4 : 0;
    struct {
        const void *src;
        size_t bytes, room;
        const void **dst;
    } parts[] = {
        {hb->q_indptr, (size_t)(ns + 1) * 4, 0, (const void **)&dev->q_indptr},
        {hb->positions, (size_t)nt * 4, 0, (const void **)&dev->positions},
        {hb->kv_len, (size_t)ns * 4, 0, (const void **)&dev->kv_len},
        {hb->page_indptr, (size_t)(ns + 1) * 4, 0, (const void **)&dev->page_indptr},
        {hb->last_page_len, (size_t)ns * 4, 0, (const void **)&dev->last_page_len},
        {hb->first_page_offset, hb->first_page_offset ? (size_t)ns * 4 : 0, 0,
         (const void **)&dev->first_page_offset},
        {hb->slots, (size_t)nt * 8, 0, (const void **)&dev->slots},
        {hl->kv_len, local ? (size_t)ns * 4 : 0, 0, (const void **)&dev_local->kv_len},
        {hl->page_indptr, local ? (size_t)(ns + 1) * 4 : 0, 0,
         (const void **)&dev_local->page_indptr},
        {hl->last_page_len, local ? (size_t)ns * 4 : 0, 0,
         (const void **)&dev_local->last_page_len},
        {hl->slots, local ? (size_t)nt * 8 : 0, 0, (const void **)&dev_local->slots},
        /* sized for the batch's decode rows at least (local_pages_region) */
        {hl->page_indices, nl * 4, local_region, (const void **)&dev_local->page_indices},
        /* Last: the only part whose size changes from one decode step to the next, so that
         * the others keep their addresses for a recorded step. */
        {hb->page_indices, (size_t)np * 4, 0, (const void **)&dev->page_indices},
    };
    size_t n_parts = sizeof parts / sizeof parts[0], total = 0;
    for (size_t i = 0; i < n_parts; i++)
        total += align8(parts[i].room > parts[i].bytes ? parts[i].room : parts[i].bytes);
    model_scratch *s = &m->s;
    if (total > s->cap_meta) {
        /* Room to grow: each reallocation makes recorded steps stale. */
        size_t cap = total + total / 2;
        TRY(grow(m, &s->meta, cap, err));
        s->meta_host = base_xrealloc(s->meta_host, cap);
        s->cap_meta = cap;
    }
    *dev = *hb;
    if (local) *dev_local = *hl;
    size_t off = 0;
    for (size_t i = 0; i < n_parts; i++) {
        if (parts[i].bytes) memcpy(s->meta_host + off, parts[i].src, parts[i].bytes);
        *parts[i].dst = parts[i].bytes ? (char *)s->meta + off : NULL;
        off += align8(parts[i].room > parts[i].bytes ? parts[i].room : parts[i].bytes);
    }
    if (local) {
        dev_local->q_indptr = dev->q_indptr;
        dev_local->positions = dev->positions;
    }
    return m->be->ops->upload(m->be, s->meta, s->meta_host, total, err);
}

static be_tensor act_tensor(const model *m, void *data, int64_t rows, int64_t cols) {
    return (be_tensor){.data = data, .dtype = m->be->act_dtype, .rows = rows, .cols = cols};
}

/* The RoPE table of layer L in a step whose other layers take `freqs` (NULL: each sequence
 * its own): the local layers' own where the family has one. */
static const be_tensor *layer_freqs(const model *m, const model_layer *L, const be_tensor *freqs,
                                    float *mscale) {
    bool local = L->local && m->inv_freq_local.data;
    *mscale = local ? m->rope_local_mscale : m->rope_mscale;
    return local ? &m->inv_freq_local : freqs;
}

const be_tensor *model_step_freqs(const model *m, const be_paged_batch *hb) {
    if (model_rope_static(&m->cfg.rope_scaling)) return &m->inv_freq;
    int long_after = model_rope_long_after(&m->cfg);
    if (long_after == 0 || hb->n_seqs == 0) return NULL;
    bool first_long = hb->kv_len[0] > long_after;
    for (int i = 1; i < hb->n_seqs; i++)
        if ((hb->kv_len[i] > long_after) != first_long) return NULL;
    return first_long ? &m->inv_freq : &m->inv_freq_short;
}

/* RoPE on q and k with layer L's table of the step (layer_freqs); where there is none (dynamic
 * NTK, longrope on both sides of its switch) each sequence runs with its own table. */
static int apply_rope(model *m, const model_layer *L, const be_paged_batch *hb,
                      const be_paged_batch *db, const be_tensor *step_freqs, be_tensor *q,
                      be_tensor *k, base_err *err) {
    const io_model_config *c = &m->cfg;
    be_backend *be = m->be;
    int H = m->shard.n_heads, KV = m->shard.n_kv_heads, hd = c->head_dim;
    float mscale;
    const be_tensor *freqs = layer_freqs(m, L, step_freqs, &mscale);
    if (freqs) {
        be_tensor pos = {(void *)db->positions, BASE_DTYPE_I32, hb->n_tokens, 1};
        TRY(be->ops->rope(be, q, H, hd, &pos, freqs, mscale, err));
        return be->ops->rope(be, k, KV, hd, &pos, freqs, mscale, err);
    }
    model_scratch *s = &m->s;
    int half = c->rotary_dim / 2, ns = hb->n_seqs;
    size_t table = (size_t)half * sizeof(float);
    if (ns > s->cap_inv_freq_seqs) {
        TRY(grow(m, &s->inv_freq, (size_t)ns * table, err));
        s->cap_inv_freq_seqs = ns;
    }
    float *host = base_xmalloc((size_t)ns * table);
    for (int i = 0; i < ns; i++)
        model_rope_freqs(c, false, hb->kv_len[i], host + (size_t)i * half, &mscale);
    int rc = be->ops->upload(be, s->inv_freq, host, (size_t)ns * table, err);
    free(host);
    TRY(rc);
    for (int i = 0; i < ns && rc == 0; i++) {
        int r0 = hb->q_indptr[i], nr = hb->q_indptr[i + 1] - r0;
        if (nr == 0) continue;
        /* Every sequence's scale is the same: it depends on the config alone. */
        be_tensor tab = {(char *)s->inv_freq + (size_t)i * table, BASE_DTYPE_F32, 1, half};
        be_tensor pos = {(void *)(db->positions + r0), BASE_DTYPE_I32, nr, 1};
        be_tensor qs = be_tensor_rows(q, r0, nr), ks = be_tensor_rows(k, r0, nr);
        rc = be->ops->rope(be, &qs, H, hd, &pos, &tab, mscale, err);
        if (!rc) rc = be->ops->rope(be, &ks, KV, hd, &pos, &tab, mscale, err);
    }
    return rc;
}

/* t [rows, heads * d] seen as [rows * heads, d]. */
static be_tensor per_head(const be_tensor *t, int heads) {
    be_tensor v = *t;
    v.rows = t->rows * heads;
    v.cols = t->cols / heads;
    return v;
}

/* x += d, then h = rmsnorm(x) * norm, or only the add when norm is NULL (the last layer: the
 * logits' norm runs on the gathered rows). */
static int residual(model *m, const be_tensor *norm, be_tensor *x, be_tensor *d, be_tensor *h,
                    base_err *err) {
    const be_ops *op = m->be->ops;
    if (!norm) return op->add(m->be, x, d, x, err);
    if (op->add_rmsnorm) return op->add_rmsnorm(m->be, x, d, norm, m->cfg.rms_norm_eps, h, err);
    TRY(op->add(m->be, x, d, x, err));
    return op->rmsnorm(m->be, x, norm, m->cfg.rms_norm_eps, h, err);
}

/* Whether the norms go into the matmuls after them and the residual adds into those before. */
static bool folded(const model *m) {
    return m->be->ops->matmul_add != NULL;
}

/* Whether a block's output goes to the residual stream as the matmul gives it, so that the
 * add can fold into that matmul: no post-block norm and no residual multiplier. */
static bool plain_output(const model *m, const be_tensor *post_norm) {
    return !post_norm->data && m->cfg.residual_scale == 1.0f;
}

/* A norm the layer may not have (data NULL): NULL then. */
static const be_tensor *opt_norm(const be_tensor *t) {
    return t->data ? t : NULL;
}

/* ys = in' Wq, Wk, Wv (+ biases), in' = rmsnorm(in) * norm->weight with norm (written to
 * norm->scratch where the backend does not fold it), in itself without. */
static int project_qkv(model *m, const model_layer *L, const be_tensor *in, const be_norm *norm,
                       be_tensor *const *ys, base_err *err) {
    const be_ops *op = m->be->ops;
    const be_linear *ws[3] = {&L->q, &L->k, &L->v};
    if (op->matmul_qkv) return op->matmul_qkv(m->be, in, norm, ws, ys, err);
    TRY(be_norm_apart(m->be, norm, &in, "q/k/v", err));
    for (int i = 0; i < 3; i++) TRY(op->matmul(m->be, in, ws[i], ys[i], err));
    return 0;
}

/* gate = act(in' Wgate) * (in' Wup), in' as for project_qkv; up is scratch. */
static int project_glu(model *m, const model_layer *L, const be_tensor *in, const be_norm *norm,
                       be_tensor *gate, be_tensor *up, base_err *err) {
    const be_ops *op = m->be->ops;
    be_backend *be = m->be;
    be_act act = model_act(m->cfg.act);
    if (op->matmul_glu) return op->matmul_glu(be, in, norm, &L->gate, &L->up, act, gate, err);
    TRY(be_norm_apart(be, norm, &in, "gate/up", err));
    TRY(op->matmul(be, in, &L->gate, gate, err));
    TRY(op->matmul(be, in, &L->up, up, err));
    return op->glu(be, act, gate, up, gate, err);
}

/* A block's output d on its way to the residual: the post-block norm, the residual multiplier,
 * where the family has them. */
static int block_output(model *m, const be_tensor *post_norm, be_tensor *d, base_err *err) {
    const be_ops *op = m->be->ops;
    if (post_norm->data) TRY(op->rmsnorm(m->be, d, post_norm, m->cfg.rms_norm_eps, d, err));
    if (m->cfg.residual_scale != 1.0f) TRY(op->scale(m->be, d, m->cfg.residual_scale, d, err));
    return 0;
}

/* q and k normalized per head or over the whole projection (qk_norm), in one op where the
 * backend has the pair. */
static int norm_qk(model *m, const model_layer *L, be_tensor *q, be_tensor *k, base_err *err) {
    const io_model_config *c = &m->cfg;
    const be_ops *op = m->be->ops;
    if (c->qk_norm == IO_QK_NORM_NONE) return 0;
    bool head = c->qk_norm == IO_QK_NORM_HEAD;
    be_tensor qv = per_head(q, head ? m->shard.n_heads : 1);
    be_tensor kv = per_head(k, head ? m->shard.n_kv_heads : 1);
    float eps = c->rms_norm_eps;
    if (op->rmsnorm_pair)
        return op->rmsnorm_pair(m->be, &qv, &L->q_norm, &qv, &kv, &L->k_norm, &kv, eps, err);
    TRY(op->rmsnorm(m->be, &qv, &L->q_norm, eps, &qv, err));
    return op->rmsnorm(m->be, &kv, &L->k_norm, eps, &kv, err);
}

/* x += d through the block's post norm (a family's post-attention or post-FFN norm), in one op
 * where the backend fuses it and no residual multiplier comes between; false where the caller
 * composes block_output and the add. */
static bool post_norm_add(model *m, const be_tensor *post_norm, be_tensor *d, be_tensor *x, int *rc,
                          base_err *err) {
    const be_ops *op = m->be->ops;
    if (!post_norm->data || m->cfg.residual_scale != 1.0f || !op->rmsnorm_add) return false;
    *rc = op->rmsnorm_add(m->be, d, post_norm, m->cfg.rms_norm_eps, x, err);
    return true;
}

/* What one layer's attention reads: the step's batch (host and backend copies: RoPE's
 * positions and lengths are the sequence's own) and the view of the layer's KV group in
 * backend memory (a local layer's pages start at its window), with the layer's slabs. */
typedef struct kv_layer_views {
    const be_paged_batch *host, *dev, *dev_group;
    const be_kv_layer *layer;
    const be_tensor *freqs; /* the step's RoPE table (model_step.freqs) */
} kv_layer_views;

/* RoPE, the KV append and attention of layer L, fused where the backend and the layer allow:
 * the fused ops rotate with one static table (the first rotary_dim dims of each head). */
static int rope_attend(model *m, const model_layer *L, const kv_layer_views *kv,
                       const be_decode_plan *plan, be_tensor *q, be_tensor *k, be_tensor *v,
                       be_tensor *att, base_err *err) {
    const be_paged_batch *hb = kv->host, *db = kv->dev, *kdb = kv->dev_group;
    const be_kv_layer *kvl = kv->layer;
    const be_ops *op = m->be->ops;
    be_backend *be = m->be;
    int H = m->shard.n_heads;
    float mscale;
    const be_tensor *freqs = layer_freqs(m, L, kv->freqs, &mscale);
    be_tensor pos = {(void *)db->positions, BASE_DTYPE_I32, hb->n_tokens, 1};
    if (op->rope_kv_attention && freqs)
        return op->rope_kv_attention(be, q, k, v, &pos, freqs, mscale, kvl, kdb, plan, H, L->attn,
                                     att, err);
    if (op->rope_kv_append && freqs) {
        TRY(op->rope_kv_append(be, q, k, v, &pos, freqs, mscale, kvl, kdb, err));
    } else {
        TRY(apply_rope(m, L, hb, db, kv->freqs, q, k, err));
        TRY(op->kv_append(be, kvl, k, v, kdb, err));
    }
    return op->attention(be, q, kvl, kdb, plan, H, L->attn, att, err);
}

/* Layer L's attention half. Folded: x holds the residual on entry and exit. Otherwise on entry
 * h holds rmsnorm(x) * attn_norm where the layer has that norm (the previous layer's residual
 * step computed it; the first layer computes it here); on exit x holds the residual and h the
 * MLP's input (rmsnorm(x) * mlp_norm, where the layer has that norm). */
static int attention_block(model *m, const model_layer *L, const kv_layer_views *kv,
                           const be_decode_plan *plan, base_err *err) {
    const be_paged_batch *hb = kv->host;
    const io_model_config *c = &m->cfg;
    const be_ops *op = m->be->ops;
    be_backend *be = m->be;
    model_scratch *s = &m->s;
    int n = hb->n_tokens, H = m->shard.n_heads, KV = m->shard.n_kv_heads;
    int hd = c->head_dim;
    be_tensor x = act_tensor(m, s->x, n, c->hidden_size),
              h = act_tensor(m, s->h, n, c->hidden_size);
    be_tensor q = act_tensor(m, s->q, n, (int64_t)H * hd);
    be_tensor k = act_tensor(m, s->k, n, (int64_t)KV * hd);
    be_tensor v = act_tensor(m, s->v, n, (int64_t)KV * hd);
    be_tensor att = act_tensor(m, s->att, n, (int64_t)H * hd);
    be_tensor *ys[3] = {&q, &k, &v};
    const bool fold = folded(m);
    const be_tensor *pre = opt_norm(&L->attn_norm);
    const be_norm norm = {pre, c->rms_norm_eps, &h};
    if (!fold && pre && L == m->layers) TRY(op->rmsnorm(be, &x, pre, c->rms_norm_eps, &h, err));
    TRY(project_qkv(m, L, fold || !pre ? &x : &h, fold && pre ? &norm : NULL, ys, err));
    TRY(norm_qk(m, L, &q, &k, err));
    TRY(rope_attend(m, L, kv, plan, &q, &k, &v, &att, err));
    if (fold && !m->comm && plain_output(m, &L->post_attn_norm))
        return op->matmul_add(be, &att, &L->o, &x, err);
    TRY(op->matmul(be, &att, &L->o, &h, err));
    if (m->comm) TRY(m->comm->ops->all_reduce_sum(m->comm, be, &h, err));
    int rc;
    if (fold && post_norm_add(m, &L->post_attn_norm, &h, &x, &rc, err)) return rc;
    TRY(block_output(m, &L->post_attn_norm, &h, err));
    if (fold) return op->add(be, &x, &h, &x, err);
    return residual(m, opt_norm(&L->mlp_norm), &x, &h, &h, err);
}

/* Layer L's MLP half (dense, or a mixture of experts): h holds the MLP's input on entry
 * (folded: x alone); on exit x holds the residual and h the next layer's input (folded:
 * nothing). After the last layer, with `tail`, out_x holds rmsnorm(x) * final_norm (every
 * row's logits are wanted, in order); without, nothing more. */
static int mlp_block(model *m, const model_layer *L, int n, bool tail, base_err *err) {
    const io_model_config *c = &m->cfg;
    const be_ops *op = m->be->ops;
    be_backend *be = m->be;
    model_scratch *s = &m->s;
    be_tensor x = act_tensor(m, s->x, n, c->hidden_size),
              h = act_tensor(m, s->h, n, c->hidden_size);
    be_tensor gate = act_tensor(m, s->gate, n, m->shard.inter);
    be_tensor up = act_tensor(m, s->up, n, m->shard.inter);
    be_tensor ox = act_tensor(m, m->s.out_x, n, c->hidden_size);
    const bool last = L + 1 == m->layers + c->num_hidden_layers;
    const bool fold = folded(m);
    const be_tensor *pre = opt_norm(&L->mlp_norm);
    const be_norm norm = {pre, c->rms_norm_eps, &h};
    const be_tensor *in = fold || !pre ? &x : &h;
    const be_norm *in_norm = fold && pre ? &norm : NULL;
    /* The block's output d: h, or its own buffer where the MoE op reads h. */
    be_tensor d = L->moe ? act_tensor(m, s->moe_out, n, c->hidden_size) : h;
    bool added = false;
    if (L->moe) {
        TRY(op->moe(be, in, in_norm, &L->experts, &d, err));
    } else {
        TRY(project_glu(m, L, in, in_norm, &gate, &up, err));
        added = fold && !m->comm && plain_output(m, &L->post_mlp_norm);
        TRY(added ? op->matmul_add(be, &gate, &L->down, &x, err)
                  : op->matmul(be, &gate, &L->down, &d, err));
    }
    if (m->comm) TRY(m->comm->ops->all_reduce_sum(m->comm, be, &d, err));
    int rc = 0;
    if (fold && !added && post_norm_add(m, &L->post_mlp_norm, &d, &x, &rc, err)) {
        TRY(rc);
        added = true;
    }
    if (!added) TRY(block_output(m, &L->post_mlp_norm, &d, err));
    if (fold) {
        if (!added) TRY(op->add(be, &x, &d, &x, err));
        if (!last || !tail) return 0;
        return op->rmsnorm(be, &x, &m->final_norm, c->rms_norm_eps, &ox, err);
    }
    if (!last) return residual(m, opt_norm(&L[1].attn_norm), &x, &d, &h, err);
    if (!tail) return residual(m, NULL, &x, &d, &h, err);
    return residual(m, &m->final_norm, &x, &d, &ox, err);
}

/* Whether the logits' rows are the batch's rows in order (every decode step): then the last
 * residual step normalizes straight into out_x, two launches fewer than gathering the rows
 * and normalizing them apart. */
static bool logits_of_every_row(const model_step *st) {
    if (st->n_out != st->host->n_tokens) return false;
    for (int i = 0; i < st->n_out; i++)
        if (st->out_rows[i] != i) return false;
    return true;
}

/* Copies the wanted rows of x into out_x, one copy per contiguous run. */
static int gather_rows(model *m, const int32_t *rows, int n_out, base_err *err) {
    size_t row_bytes = (size_t)m->cfg.hidden_size * base_dtype_size(m->be->act_dtype);
    for (int i = 0; i < n_out;) {
        int j = i + 1;
        while (j < n_out && rows[j] == rows[j - 1] + 1) j++;
        TRY(m->be->ops->copy(m->be, (char *)m->s.out_x + (size_t)i * row_bytes,
                             (char *)m->s.x + (size_t)rows[i] * row_bytes,
                             (size_t)(j - i) * row_bytes, err));
        i = j;
    }
    return 0;
}

static int check_step(const model *m, const kv_pool *pool, const kv_batch *batch,
                      const int32_t *tokens, const int32_t *out_rows, int n_out, base_err *err) {
    const be_paged_batch *hb = &batch->view;
    const kv_geometry *g = kv_pool_geometry(pool);
    if (g->n_layers != m->cfg.num_hidden_layers || g->n_kv_heads != m->shard.n_kv_heads ||
        g->head_dim != m->cfg.head_dim)
        return base_fail(err,
                         "KV pool geometry (%d layers, %d kv heads, head_dim %d) does not "
                         "match the model (%d, %d, %d)",
                         g->n_layers, g->n_kv_heads, g->head_dim, m->cfg.num_hidden_layers,
                         m->shard.n_kv_heads, m->cfg.head_dim);
    for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
        const model_layer *L = &m->layers[l];
        /* a local group keeps only its window: a layer seeing further would read released
         * blocks */
        if (kv_pool_layer_local(pool, l) && !(L->attn.window > 0 && L->attn.window <= g->window))
            return base_fail(err,
                             "KV pool keeps layer %d's last %d tokens only, but the layer's "
                             "attention window is %d",
                             l, g->window, L->attn.window);
    }
    if (hb->n_tokens <= 0) return base_fail(err, "forward: empty batch");
    for (int i = 0; i < hb->n_tokens; i++)
        if (tokens[i] < 0 || tokens[i] >= m->cfg.vocab_size)
            return base_fail(err, "token id %d at position %d is outside the vocabulary (%d)",
                             tokens[i], i, m->cfg.vocab_size);
    for (int i = 0; i < n_out; i++)
        if (out_rows[i] < 0 || out_rows[i] >= hb->n_tokens)
            return base_fail(err, "forward: logits row %d is outside the batch", out_rows[i]);
    return 0;
}

int model_forward_body(model *m, const model_step *st, base_err *err) {
    const io_model_config *c = &m->cfg;
    be_backend *be = m->be;
    const be_paged_batch *hb = st->host;
    int n = hb->n_tokens;
    be_tensor ids = {m->s.ids, BASE_DTYPE_I32, n, 1};
    be_tensor x = act_tensor(m, m->s.x, n, c->hidden_size);
    bool tail = logits_of_every_row(st);
    TRY(be->ops->embedding(be, &m->embed, &ids, &x, err));
    if (m->comm) TRY(m->comm->ops->all_reduce_sum(m->comm, be, &x, err));
    if (c->embed_scale != 1.0f) TRY(be->ops->scale(be, &x, c->embed_scale, &x, err));
    for (int l = 0; l < c->num_hidden_layers; l++) {
        bool local = kv_pool_layer_local(st->pool, l);
        kv_layer_views kv = {hb, st->dev, local ? st->dev_local : st->dev,
                             kv_pool_layer(st->pool, l), st->freqs};
        TRY(attention_block(m, &m->layers[l], &kv, st->plan, err));
        TRY(mlp_block(m, &m->layers[l], n, tail, err));
    }
    if (st->n_out == 0) return 0;
    be_tensor ox = act_tensor(m, m->s.out_x, st->n_out, c->hidden_size);
    be_tensor lg = {m->s.logits, BASE_DTYPE_F32, st->n_out, c->vocab_size};
    if (!tail) {
        TRY(gather_rows(m, st->out_rows, st->n_out, err));
        TRY(be->ops->rmsnorm(be, &ox, &m->final_norm, c->rms_norm_eps, &ox, err));
    }
    if (st->hidden) return 0;
    if (m->comm) {
        be_tensor part = {m->s.logits_part, BASE_DTYPE_F32, st->n_out, m->shard.vocab};
        TRY(be->ops->matmul(be, &ox, &m->lm_head, &part, err));
        TRY(m->comm->ops->all_gather_cols(m->comm, be, &part, &lg, err));
    } else {
        TRY(be->ops->matmul(be, &ox, &m->lm_head, &lg, err));
    }
    if (c->logits_scale != 1.0f) TRY(be->ops->scale(be, &lg, c->logits_scale, &lg, err));
    if (c->final_softcap > 0) TRY(be->ops->softcap(be, &lg, c->final_softcap, &lg, err));
    return 0;
}

/* One step; the wanted rows' logits (or, hidden, their normalized hidden states) stay in
 * backend memory. */
static int forward(model *m, kv_pool *pool, const kv_batch *batch, const int32_t *tokens,
                   const int32_t *out_rows, int n_out, bool hidden, base_err *err) {
    TRY(check_step(m, pool, batch, tokens, out_rows, n_out, err));
    if (!hidden && n_out > 0 && !m->lm_head.weight)
        return base_fail(err, "this checkpoint is a sequence classifier (config.json's "
                              "architectures): it has a score head and no LM head, so it gives "
                              "no logits; serve it with --reranking");
    const be_paged_batch *hb = &batch->view;
    be_backend *be = m->be;
    int n = hb->n_tokens;
    TRY(scratch_reserve(m, n, n_out, err));
    be_paged_batch db, dl;
    memset(&dl, 0, sizeof dl);
    TRY(upload_batch(m, pool, batch, &db, &dl, err));
    int32_t *shard_ids = m->comm ? base_xmalloc((size_t)n * sizeof *shard_ids) : NULL;
    if (shard_ids) model_shard_ids(m, tokens, n, shard_ids);
    int up = be->ops->upload(be, m->s.ids, shard_ids ? shard_ids : tokens,
                             (size_t)n * sizeof(int32_t), err);
    free(shard_ids);
    TRY(up);
    be_decode_plan plan;
    model_step st = {pool,
                     hb,
                     &db,
                     kv_pool_has_local(pool) ? &dl : NULL,
                     &plan,
                     out_rows,
                     n_out,
                     hidden,
                     model_step_freqs(m, hb)};
    if (model_graph_usable(m, &st)) return model_graph_step(m, &st, err);
    TRY(model_plan_step(m, pool, batch, &plan, err));
    return model_forward_body(m, &st, err);
}

int model_forward_queue(model *m, kv_pool *pool, const kv_batch *batch, const int32_t *tokens,
                        const int32_t *out_rows, int n_out, base_err *err) {
    return forward(m, pool, batch, tokens, out_rows, n_out, false, err);
}

int model_forward(model *m, kv_pool *pool, const kv_batch *batch, const int32_t *tokens,
                  const int32_t *out_rows, int n_out, float *logits, base_err *err) {
    be_backend *be = m->be;
    TRY(forward(m, pool, batch, tokens, out_rows, n_out, false, err));
    if (n_out && logits)
        TRY(be->ops->download(be, logits, m->s.logits,
                              (size_t)n_out * (size_t)m->cfg.vocab_size * sizeof(float), err));
    return be->ops->sync(be, err);
}

int model_forward_hidden(model *m, kv_pool *pool, const kv_batch *batch, const int32_t *tokens,
                         const int32_t *out_rows, int n_out, float *hidden, base_err *err) {
    be_backend *be = m->be;
    size_t n = (size_t)n_out * (size_t)m->cfg.hidden_size;
    base_dtype dt = be->act_dtype;
    TRY(forward(m, pool, batch, tokens, out_rows, n_out, true, err));
    if (n_out == 0) return be->ops->sync(be, err);
    /* the activations' dtype, widened on the host: f32 lands in place */
    void *raw = dt == BASE_DTYPE_F32 ? (void *)hidden : base_xmalloc(n * base_dtype_size(dt));
    int rc = be->ops->download(be, raw, m->s.out_x, n * base_dtype_size(dt), err) ||
             be->ops->sync(be, err);
    for (size_t i = 0; rc == 0 && raw != hidden && i < n; i++) {
        uint16_t h = ((const uint16_t *)raw)[i];
        hidden[i] = dt == BASE_DTYPE_BF16 ? base_bf16_to_f32(h) : base_f16_to_f32(h);
    }
    if (raw != hidden) free(raw);
    return rc ? -1 : 0;
}

be_tensor model_logits(const model *m, int n_out) {
    return (be_tensor){m->s.logits, BASE_DTYPE_F32, n_out, m->cfg.vocab_size};
}

void model_free(model *m) {
    if (!m) return;
    be_backend *be = m->be;
    model_scratch *s = &m->s;
    void *bufs[] = {s->x,        s->h,         s->q,       s->k,          s->v,      s->att,
                    s->gate,     s->up,        s->ids,     s->out_x,      s->logits, s->meta,
                    s->inv_freq, m->workspace, s->moe_out, s->logits_part};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) be->ops->free(be, bufs[i]);
    model_graphs_free(m);
    for (int i = 0; i < m->n_mapped; i++) be->ops->free(be, (void *)m->mapped[i]);
    free(m->mapped);
    for (int i = 0; i < m->n_host_parts; i++) free(m->host_parts[i]);
    free(m->host_parts);
    free(s->meta_host);
    free(m->layers);
    io_checkpoint_close(m->ck);
    io_config_free(&m->cfg);
    free(m);
}
