/* The forward pass, written once against the backend ops, top to bottom as the Llama paper
 * family reads:
 *   x = embed(tokens)
 *   per layer:  h = rmsnorm(x); q,k,v = h Wq, h Wk, h Wv (+ biases); [qwen3: rmsnorm per head]
 *               rope(q, k); append k, v to the paged pool; a = attention(q, pool)
 *               x += a Wo;  h = rmsnorm(x);  x += (silu(h Wgate) * h Wup) Wdown
 *   logits = rmsnorm(x[rows wanted]) Wlm_head
 * A backend with matmul_add folds each norm into the matmuls after it and each residual add
 * into the matmul before it: per layer q,k,v = rmsnorm(x) W..; x += a Wo;
 * x += (silu(rmsnorm(x) Wgate) * (rmsnorm(x) Wup)) Wdown, with no h in between. */
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
        size_t qdim = (size_t)c->num_attention_heads * c->head_dim;
        size_t kvdim = (size_t)c->num_key_value_heads * c->head_dim;
        TRY(grow(m, &s->x, rows * c->hidden_size * act, err));
        TRY(grow(m, &s->h, rows * c->hidden_size * act, err));
        TRY(grow(m, &s->q, rows * qdim * act, err));
        TRY(grow(m, &s->k, rows * kvdim * act, err));
        TRY(grow(m, &s->v, rows * kvdim * act, err));
        TRY(grow(m, &s->att, rows * qdim * act, err));
        TRY(grow(m, &s->gate, rows * c->intermediate_size * act, err));
        TRY(grow(m, &s->up, rows * c->intermediate_size * act, err));
        TRY(grow(m, &s->ids, rows * sizeof(int32_t), err));
        s->cap_tokens = n;
    }
    if (n_out > s->cap_out) {
        TRY(grow(m, &s->out_x, (size_t)n_out * c->hidden_size * act, err));
        TRY(grow(m, &s->logits, (size_t)n_out * c->vocab_size * sizeof(float), err));
        s->cap_out = n_out;
    }
    return 0;
}

/* Copies the batch's CSR arrays into backend memory in one upload; *dev points into it. */
static int upload_batch(model *m, const be_paged_batch *hb, be_paged_batch *dev, base_err *err) {
    int ns = hb->n_seqs, nt = hb->n_tokens, np = hb->page_indptr[ns];
    struct {
        const void *src;
        size_t bytes;
        const void **dst;
    } parts[] = {
        {hb->q_indptr, (size_t)(ns + 1) * 4, (const void **)&dev->q_indptr},
        {hb->kv_len, (size_t)ns * 4, (const void **)&dev->kv_len},
        {hb->page_indptr, (size_t)(ns + 1) * 4, (const void **)&dev->page_indptr},
        {hb->last_page_len, (size_t)ns * 4, (const void **)&dev->last_page_len},
        {hb->first_page_offset, hb->first_page_offset ? (size_t)ns * 4 : 0,
         (const void **)&dev->first_page_offset},
        {hb->slots, (size_t)nt * 8, (const void **)&dev->slots},
        {hb->positions, (size_t)nt * 4, (const void **)&dev->positions},
        /* Last: the only part whose size changes from one decode step to the next, so that
         * the others keep their addresses for a recorded step. */
        {hb->page_indices, (size_t)np * 4, (const void **)&dev->page_indices},
    };
    size_t n_parts = sizeof parts / sizeof parts[0], total = 0;
    for (size_t i = 0; i < n_parts; i++) total += align8(parts[i].bytes);
    model_scratch *s = &m->s;
    if (total > s->cap_meta) {
        /* Room to grow: each reallocation makes recorded steps stale. */
        size_t cap = total + total / 2;
        TRY(grow(m, &s->meta, cap, err));
        s->meta_host = base_xrealloc(s->meta_host, cap);
        s->cap_meta = cap;
    }
    *dev = *hb;
    size_t off = 0;
    for (size_t i = 0; i < n_parts; i++) {
        if (parts[i].bytes) memcpy(s->meta_host + off, parts[i].src, parts[i].bytes);
        *parts[i].dst = parts[i].bytes ? (char *)s->meta + off : NULL;
        off += align8(parts[i].bytes);
    }
    return m->be->ops->upload(m->be, s->meta, s->meta_host, total, err);
}

static be_tensor act_tensor(const model *m, void *data, int64_t rows, int64_t cols) {
    return (be_tensor){.data = data, .dtype = m->be->act_dtype, .rows = rows, .cols = cols};
}

/* RoPE on q and k. Dynamic NTK scaling depends on each sequence's length, so it runs per
 * sequence with that sequence's table; every other type uses the one static table. */
static int apply_rope(model *m, const be_paged_batch *hb, const be_paged_batch *db, be_tensor *q,
                      be_tensor *k, base_err *err) {
    const io_model_config *c = &m->cfg;
    be_backend *be = m->be;
    int H = c->num_attention_heads, KV = c->num_key_value_heads, hd = c->head_dim;
    if (c->rope_scaling.type != IO_ROPE_DYNAMIC) {
        be_tensor pos = {(void *)db->positions, BASE_DTYPE_I32, hb->n_tokens, 1};
        TRY(be->ops->rope(be, q, H, hd, &pos, &m->inv_freq, m->rope_mscale, err));
        return be->ops->rope(be, k, KV, hd, &pos, &m->inv_freq, m->rope_mscale, err);
    }
    model_scratch *s = &m->s;
    int half = hd / 2, ns = hb->n_seqs;
    size_t table = (size_t)half * sizeof(float);
    if (ns > s->cap_inv_freq_seqs) {
        TRY(grow(m, &s->inv_freq, (size_t)ns * table, err));
        s->cap_inv_freq_seqs = ns;
    }
    float *host = base_xmalloc((size_t)ns * table);
    float mscale = 1.0f;
    for (int i = 0; i < ns; i++)
        model_rope_freqs(c, hb->kv_len[i], host + (size_t)i * half, &mscale);
    int rc = be->ops->upload(be, s->inv_freq, host, (size_t)ns * table, err);
    free(host);
    TRY(rc);
    for (int i = 0; i < ns && rc == 0; i++) {
        int r0 = hb->q_indptr[i], nr = hb->q_indptr[i + 1] - r0;
        if (nr == 0) continue;
        be_tensor freqs = {(char *)s->inv_freq + (size_t)i * table, BASE_DTYPE_F32, 1, half};
        be_tensor pos = {(void *)(db->positions + r0), BASE_DTYPE_I32, nr, 1};
        be_tensor qs = be_tensor_rows(q, r0, nr), ks = be_tensor_rows(k, r0, nr);
        rc = be->ops->rope(be, &qs, H, hd, &pos, &freqs, mscale, err);
        if (!rc) rc = be->ops->rope(be, &ks, KV, hd, &pos, &freqs, mscale, err);
    }
    return rc;
}

static int norm_per_head(model *m, be_tensor *t, int heads, const be_tensor *w, base_err *err) {
    be_tensor v = *t;
    v.rows = t->rows * heads;
    v.cols = t->cols / heads;
    return m->be->ops->rmsnorm(m->be, &v, w, m->cfg.rms_norm_eps, &v, err);
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

/* gate = silu(in' Wgate) * (in' Wup), in' as for project_qkv; up is scratch. */
static int project_glu(model *m, const model_layer *L, const be_tensor *in, const be_norm *norm,
                       be_tensor *gate, be_tensor *up, base_err *err) {
    const be_ops *op = m->be->ops;
    be_backend *be = m->be;
    if (op->matmul_silu_mul) return op->matmul_silu_mul(be, in, norm, &L->gate, &L->up, gate, err);
    TRY(be_norm_apart(be, norm, &in, "gate/up", err));
    TRY(op->matmul(be, in, &L->gate, gate, err));
    TRY(op->matmul(be, in, &L->up, up, err));
    return op->silu_mul(be, gate, up, gate, err);
}

/* Layer L's attention half. Folded: x holds the residual on entry and exit. Otherwise on entry
 * h holds rmsnorm(x) * attn_norm (the previous layer's residual step computed it; the first
 * layer computes it here); on exit x holds the residual and h = rmsnorm(x) * mlp_norm. */
static int attention_block(model *m, const model_layer *L, const be_kv_layer *kvl,
                           const be_paged_batch *hb, const be_paged_batch *db,
                           const be_decode_plan *plan, base_err *err) {
    const io_model_config *c = &m->cfg;
    const be_ops *op = m->be->ops;
    be_backend *be = m->be;
    model_scratch *s = &m->s;
    int n = hb->n_tokens, H = c->num_attention_heads, KV = c->num_key_value_heads;
    int hd = c->head_dim;
    be_tensor x = act_tensor(m, s->x, n, c->hidden_size),
              h = act_tensor(m, s->h, n, c->hidden_size);
    be_tensor q = act_tensor(m, s->q, n, (int64_t)H * hd);
    be_tensor k = act_tensor(m, s->k, n, (int64_t)KV * hd);
    be_tensor v = act_tensor(m, s->v, n, (int64_t)KV * hd);
    be_tensor att = act_tensor(m, s->att, n, (int64_t)H * hd);
    be_tensor *ys[3] = {&q, &k, &v};
    const bool fold = folded(m);
    const be_norm norm = {&L->attn_norm, c->rms_norm_eps, &h};
    if (!fold && L == m->layers) TRY(op->rmsnorm(be, &x, &L->attn_norm, c->rms_norm_eps, &h, err));
    TRY(project_qkv(m, L, fold ? &x : &h, fold ? &norm : NULL, ys, err));
    if (c->qk_norm) {
        TRY(norm_per_head(m, &q, H, &L->q_norm, err));
        TRY(norm_per_head(m, &k, KV, &L->k_norm, err));
    }
    const float scale = 1.0f / sqrtf((float)hd);
    const bool static_rope = c->rope_scaling.type != IO_ROPE_DYNAMIC;
    be_tensor pos = {(void *)db->positions, BASE_DTYPE_I32, hb->n_tokens, 1};
    if (op->rope_kv_attention && static_rope) {
        TRY(op->rope_kv_attention(be, &q, &k, &v, &pos, &m->inv_freq, m->rope_mscale, kvl, db, plan,
                                  H, scale, &att, err));
    } else {
        if (op->rope_kv_append && static_rope) {
            TRY(op->rope_kv_append(be, &q, &k, &v, &pos, &m->inv_freq, m->rope_mscale, kvl, db,
                                   err));
        } else {
            TRY(apply_rope(m, hb, db, &q, &k, err));
            TRY(op->kv_append(be, kvl, &k, &v, db, err));
        }
        TRY(op->attention(be, &q, kvl, db, plan, H, scale, &att, err));
    }
    if (fold) return op->matmul_add(be, &att, &L->o, &x, err);
    TRY(op->matmul(be, &att, &L->o, &h, err));
    return residual(m, &L->mlp_norm, &x, &h, &h, err);
}

/* Layer L's MLP half: h holds rmsnorm(x) * mlp_norm on entry (folded: x alone); on exit x holds
 * the residual and h the next layer's rmsnorm(x) * attn_norm (folded: nothing). After the last
 * layer, with `tail`, out_x holds rmsnorm(x) * final_norm (every row's logits are wanted, in
 * order); without, nothing more. */
static int mlp_block(model *m, const model_layer *L, int n, bool tail, base_err *err) {
    const io_model_config *c = &m->cfg;
    const be_ops *op = m->be->ops;
    be_backend *be = m->be;
    model_scratch *s = &m->s;
    be_tensor x = act_tensor(m, s->x, n, c->hidden_size),
              h = act_tensor(m, s->h, n, c->hidden_size);
    be_tensor gate = act_tensor(m, s->gate, n, c->intermediate_size);
    be_tensor up = act_tensor(m, s->up, n, c->intermediate_size);
    be_tensor ox = act_tensor(m, m->s.out_x, n, c->hidden_size);
    const bool last = L + 1 == m->layers + c->num_hidden_layers;
    if (folded(m)) {
        const be_norm norm = {&L->mlp_norm, c->rms_norm_eps, &h};
        TRY(project_glu(m, L, &x, &norm, &gate, &up, err));
        TRY(op->matmul_add(be, &gate, &L->down, &x, err));
        if (!last || !tail) return 0;
        return op->rmsnorm(be, &x, &m->final_norm, c->rms_norm_eps, &ox, err);
    }
    TRY(project_glu(m, L, &h, NULL, &gate, &up, err));
    TRY(op->matmul(be, &gate, &L->down, &h, err));
    if (!last) return residual(m, &L[1].attn_norm, &x, &h, &h, err);
    if (!tail) return residual(m, NULL, &x, &h, &h, err);
    return residual(m, &m->final_norm, &x, &h, &ox, err);
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
    if (g->n_layers != m->cfg.num_hidden_layers || g->n_kv_heads != m->cfg.num_key_value_heads ||
        g->head_dim != m->cfg.head_dim)
        return base_fail(err,
                         "KV pool geometry (%d layers, %d kv heads, head_dim %d) does not "
                         "match the model (%d, %d, %d)",
                         g->n_layers, g->n_kv_heads, g->head_dim, m->cfg.num_hidden_layers,
                         m->cfg.num_key_value_heads, m->cfg.head_dim);
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
    for (int l = 0; l < c->num_hidden_layers; l++) {
        TRY(attention_block(m, &m->layers[l], kv_pool_layer(st->pool, l), hb, st->dev, st->plan,
                            err));
        TRY(mlp_block(m, &m->layers[l], n, tail, err));
    }
    if (st->n_out == 0) return 0;
    be_tensor ox = act_tensor(m, m->s.out_x, st->n_out, c->hidden_size);
    be_tensor lg = {m->s.logits, BASE_DTYPE_F32, st->n_out, c->vocab_size};
    if (!tail) {
        TRY(gather_rows(m, st->out_rows, st->n_out, err));
        TRY(be->ops->rmsnorm(be, &ox, &m->final_norm, c->rms_norm_eps, &ox, err));
    }
    return be->ops->matmul(be, &ox, &m->lm_head, &lg, err);
}

int model_forward(model *m, kv_pool *pool, const kv_batch *batch, const int32_t *tokens,
                  const int32_t *out_rows, int n_out, float *logits, base_err *err) {
    TRY(check_step(m, pool, batch, tokens, out_rows, n_out, err));
    const io_model_config *c = &m->cfg;
    const be_paged_batch *hb = &batch->view;
    be_backend *be = m->be;
    int n = hb->n_tokens;
    TRY(scratch_reserve(m, n, n_out, err));
    be_paged_batch db;
    TRY(upload_batch(m, hb, &db, err));
    TRY(be->ops->upload(be, m->s.ids, tokens, (size_t)n * sizeof(int32_t), err));
    be_decode_plan plan;
    model_step st = {pool, hb, &db, &plan, out_rows, n_out};
    if (model_graph_usable(m, &st)) {
        TRY(model_graph_step(m, &st, err));
    } else {
        TRY(model_plan_step(m, pool, batch, &plan, err));
        TRY(model_forward_body(m, &st, err));
    }
    if (n_out == 0) return be->ops->sync(be, err);
    if (logits)
        TRY(be->ops->download(be, logits, m->s.logits,
                              (size_t)n_out * (size_t)c->vocab_size * sizeof(float), err));
    return be->ops->sync(be, err);
}

be_tensor model_logits(const model *m, int n_out) {
    return (be_tensor){m->s.logits, BASE_DTYPE_F32, n_out, m->cfg.vocab_size};
}

void model_free(model *m) {
    if (!m) return;
    be_backend *be = m->be;
    model_scratch *s = &m->s;
    void *bufs[] = {s->x,      s->h,    s->q,        s->k,         s->v,
                    s->att,    s->gate, s->up,       s->ids,       s->out_x,
                    s->logits, s->meta, s->inv_freq, m->workspace, m->inv_freq.data};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) be->ops->free(be, bufs[i]);
    model_graphs_free(m);
    for (int i = 0; i < m->n_mapped; i++) be->ops->free(be, (void *)m->mapped[i]);
    free(m->mapped);
    free(s->meta_host);
    free(m->layers);
    io_checkpoint_close(m->ck);
    io_config_free(&m->cfg);
    free(m);
}
