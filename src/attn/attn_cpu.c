/* CPU attention through the pages. Every path walks a sequence's tokens in tiles of
 * ATTN_TILE, loads the tile's K and V rows once into f32, and serves every query head of the
 * GQA group from them, so K/V are read once per (row or sequence, kv head). Scores use an
 * online softmax (a running max and sum per head, rescaled once per tile); all accumulation
 * is f32. The gather path is deliberately different (copy to contiguous memory, two-pass
 * softmax) so that it stays a trustworthy fallback.
 *
 * Pool offsets are 64-bit from the first multiply (see backend.h). */
#include "attn/attn.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define ATTN_TILE 32

static uint64_t pool_offset(const be_kv_layer *layer, const int32_t *pages, int64_t first,
                            int64_t token, int kv_head) {
    uint64_t idx = (uint64_t)first + (uint64_t)token;
    uint64_t bs = (uint64_t)layer->block_size;
    uint64_t page = (uint64_t)pages[idx / bs];
    uint64_t row = (uint64_t)layer->n_kv_heads * (uint64_t)layer->head_dim;
    return (page * bs + idx % bs) * row + (uint64_t)kv_head * (uint64_t)layer->head_dim;
}

static void load_row(const void *slab, base_dtype dt, uint64_t off, int n, float *dst) {
    if (dt == BASE_DTYPE_F32) {
        memcpy(dst, (const float *)slab + off, (size_t)n * sizeof(float));
    } else if (dt == BASE_DTYPE_F16) {
        const uint16_t *src = (const uint16_t *)slab + off;
        for (int i = 0; i < n; i++) dst[i] = base_f16_to_f32(src[i]);
    } else {
        const uint16_t *src = (const uint16_t *)slab + off;
        for (int i = 0; i < n; i++) dst[i] = base_bf16_to_f32(src[i]);
    }
}

static void store_row(void *slab, base_dtype dt, uint64_t off, int n, const float *src) {
    if (dt == BASE_DTYPE_F32) {
        memcpy((float *)slab + off, src, (size_t)n * sizeof(float));
    } else if (dt == BASE_DTYPE_F16) {
        uint16_t *dst = (uint16_t *)slab + off;
        for (int i = 0; i < n; i++) dst[i] = base_f32_to_f16(src[i]);
    } else {
        uint16_t *dst = (uint16_t *)slab + off;
        for (int i = 0; i < n; i++) dst[i] = base_f32_to_bf16(src[i]);
    }
}

static bool pool_dtype_ok(base_dtype dt) {
    return dt == BASE_DTYPE_F32 || dt == BASE_DTYPE_F16 || dt == BASE_DTYPE_BF16;
}

/* ---- kv append ---- */

typedef struct append_ctx {
    const be_kv_layer *layer;
    const float *k, *v; /* (n_tokens, n_kv_heads * head_dim) */
    const int64_t *slots;
} append_ctx;

static void append_one(void *arg, int64_t t) {
    const append_ctx *c = arg;
    const be_kv_layer *layer = c->layer;
    uint64_t row = (uint64_t)layer->n_kv_heads * (uint64_t)layer->head_dim;
    uint64_t off = (uint64_t)c->slots[t] * row;
    store_row(layer->k, layer->dtype, off, (int)row, c->k + (uint64_t)t * row);
    store_row(layer->v, layer->dtype, off, (int)row, c->v + (uint64_t)t * row);
}

int attn_cpu_kv_append(base_pool *pool, const be_kv_layer *layer, const be_tensor *k,
                       const be_tensor *v, const be_paged_batch *batch, base_err *err) {
    if (!pool_dtype_ok(layer->dtype))
        return base_fail(err, "kv_append: pool dtype %s is not F32, F16 or BF16",
                         base_dtype_name(layer->dtype));
    int64_t row = (int64_t)layer->n_kv_heads * layer->head_dim;
    const be_tensor *kv[2] = {k, v};
    for (int i = 0; i < 2; i++) {
        if (kv[i]->dtype != BASE_DTYPE_F32 || kv[i]->rows != batch->n_tokens || kv[i]->cols != row)
            return base_fail(err, "kv_append: %s is %s [%lld, %lld], want F32 [%d, %lld]",
                             i ? "v" : "k", base_dtype_name(kv[i]->dtype), (long long)kv[i]->rows,
                             (long long)kv[i]->cols, batch->n_tokens, (long long)row);
    }
    if (!batch->slots && batch->n_tokens > 0) return base_fail(err, "kv_append: slots is NULL");
    int64_t n_slots = layer->num_blocks * layer->block_size;
    for (int t = 0; t < batch->n_tokens; t++) {
        if (batch->slots[t] < 0 || batch->slots[t] >= n_slots)
            return base_fail(err, "kv_append: slots[%d] = %lld outside the pool of %lld slots", t,
                             (long long)batch->slots[t], (long long)n_slots);
    }
    append_ctx c = {layer, k->data, v->data, batch->slots};
    base_pool_for(pool, batch->n_tokens, append_one, &c);
    return 0;
}

/* ---- scores and the window ---- */

/* A raw q.k product as the softmax sees it: scaled, then soft-capped. */
static inline float score(const be_attn *at, float dot) {
    float s = dot * at->scale;
    return at->softcap > 0 ? tanhf(s / at->softcap) * at->softcap : s;
}

/* The first of a row's `visible` keys (the row's own is the last) inside its window. */
static inline int64_t window_start(const be_attn *at, int64_t visible) {
    return at->window > 0 && visible > at->window ? visible - at->window : 0;
}

/* ---- the online-softmax accumulator over a token range ---- */

typedef struct attn_acc {
    int group, head_dim;
    float *m;   /* (group) running max of the scaled scores */
    float *l;   /* (group) running sum of exp(score - m) */
    float *acc; /* (group, head_dim) unnormalized output */
    float *kt;  /* (ATTN_TILE, head_dim) the tile's K rows */
    float *vt;  /* (ATTN_TILE, head_dim) the tile's V rows */
    float *s;   /* (ATTN_TILE) one head's scores */
} attn_acc;

/* One allocation holds every array; NULL when out of memory. Freed with free(a->m). */
static bool acc_init(attn_acc *a, int group, int head_dim) {
    size_t n = (size_t)group * (2 + (size_t)head_dim) + (size_t)ATTN_TILE * (2 * head_dim + 1);
    float *mem = malloc(n * sizeof(float));
    if (!mem) return false;
    a->group = group;
    a->head_dim = head_dim;
    a->m = mem;
    a->l = a->m + group;
    a->acc = a->l + group;
    a->kt = a->acc + (size_t)group * head_dim;
    a->vt = a->kt + (size_t)ATTN_TILE * head_dim;
    a->s = a->vt + (size_t)ATTN_TILE * head_dim;
    return true;
}

static void acc_reset(attn_acc *a) {
    for (int h = 0; h < a->group; h++) {
        a->m[h] = -INFINITY;
        a->l[h] = 0.0f;
    }
    memset(a->acc, 0, (size_t)a->group * a->head_dim * sizeof(float));
}

/* Folds kv tokens [t0, t1) of one sequence and kv head into the accumulator. q holds the
 * group's query rows, head after head. */
static void acc_run(attn_acc *a, const float *q, const be_attn *at, const be_kv_layer *layer,
                    const int32_t *pages, int64_t first, int kv_head, int64_t t0, int64_t t1) {
    int d = a->head_dim;
    for (int64_t t = t0; t < t1; t += ATTN_TILE) {
        int n = t1 - t < ATTN_TILE ? (int)(t1 - t) : ATTN_TILE;
        for (int i = 0; i < n; i++) {
            uint64_t off = pool_offset(layer, pages, first, t + i, kv_head);
            load_row(layer->k, layer->dtype, off, d, a->kt + (size_t)i * d);
            load_row(layer->v, layer->dtype, off, d, a->vt + (size_t)i * d);
        }
        for (int h = 0; h < a->group; h++) {
            const float *qh = q + (size_t)h * d;
            float tile_max = -INFINITY;
            for (int i = 0; i < n; i++) {
                const float *kr = a->kt + (size_t)i * d;
                float dot = 0.0f;
                for (int j = 0; j < d; j++) dot += qh[j] * kr[j];
                a->s[i] = score(at, dot);
                if (a->s[i] > tile_max) tile_max = a->s[i];
            }
            float m_new = a->m[h] > tile_max ? a->m[h] : tile_max;
            float corr = expf(a->m[h] - m_new);
            float *acc = a->acc + (size_t)h * d;
            float l = a->l[h] * corr;
            for (int j = 0; j < d; j++) acc[j] *= corr;
            for (int i = 0; i < n; i++) {
                float p = expf(a->s[i] - m_new);
                const float *vr = a->vt + (size_t)i * d;
                l += p;
                for (int j = 0; j < d; j++) acc[j] += p * vr[j];
            }
            a->l[h] = l;
            a->m[h] = m_new;
        }
    }
}

/* Writes the normalized output of each head (out, head after head) and, when lse is not
 * NULL, its log-sum-exp; an empty range gives zeros and -inf. */
static void acc_finish(const attn_acc *a, float *out, float *lse) {
    int d = a->head_dim;
    for (int h = 0; h < a->group; h++) {
        float l = a->l[h];
        float inv = l > 0.0f ? 1.0f / l : 0.0f;
        for (int j = 0; j < d; j++) out[(size_t)h * d + j] = a->acc[(size_t)h * d + j] * inv;
        if (lse) lse[h] = l > 0.0f ? a->m[h] + logf(l) : -INFINITY;
    }
}

/* ---- the work items of one attention call ---- */

typedef enum { ITEM_PREFILL, ITEM_V1, ITEM_V2, ITEM_GATHER } item_kind;

typedef struct attn_item {
    int32_t kind; /* item_kind */
    int32_t seq;
    int32_t kv_head;
    int32_t extra;  /* prefill: row within the sequence; v2: chunk */
    int32_t decode; /* v2: decode row number (workspace index) */
} attn_item;

typedef struct attn_ctx {
    const be_kv_layer *layer;
    const be_paged_batch *batch;
    const float *q; /* (n_tokens, n_heads * head_dim) */
    float *out;     /* (n_tokens, n_heads * head_dim) */
    int n_heads, group, head_dim;
    be_attn attn;
    int pages_per_chunk, max_chunks;
    float *partial;            /* v2: (n_decode, max_chunks, n_heads, head_dim) */
    float *lse;                /* v2: (n_decode, max_chunks, n_heads) */
    const attn_item *items;    /* (n_items) */
    const int32_t *decode_seq; /* (n_decode) batch sequence of each decode row */
    atomic_int oom;
} attn_ctx;

static size_t row_offset(const attn_ctx *c, int64_t token, int kv_head) {
    return ((size_t)token * c->n_heads + (size_t)kv_head * c->group) * c->head_dim;
}

static const int32_t *seq_pages(const attn_ctx *c, int s) {
    return c->batch->page_indices + c->batch->page_indptr[s];
}

static int64_t seq_first(const attn_ctx *c, int s) {
    return c->batch->first_page_offset ? c->batch->first_page_offset[s] : 0;
}

/* Dense attention over a contiguous copy of the sequence's K/V for this kv head: all q_len
 * rows, each with its causal limit. */
static void run_gather(attn_ctx *c, int s, int kv_head) {
    const be_paged_batch *b = c->batch;
    int d = c->head_dim;
    int64_t kv_len = b->kv_len[s];
    int64_t q0 = b->q_indptr[s], q_len = b->q_indptr[s + 1] - q0;
    float *kc = malloc(((size_t)kv_len * (2 * (size_t)d + 1) + 1) * sizeof(float));
    if (!kc) {
        atomic_store(&c->oom, 1);
        return;
    }
    float *vc = kc + (size_t)kv_len * d;
    float *p = vc + (size_t)kv_len * d;
    for (int64_t t = 0; t < kv_len; t++) {
        uint64_t off = pool_offset(c->layer, seq_pages(c, s), seq_first(c, s), t, kv_head);
        load_row(c->layer->k, c->layer->dtype, off, d, kc + (size_t)t * d);
        load_row(c->layer->v, c->layer->dtype, off, d, vc + (size_t)t * d);
    }
    for (int64_t i = 0; i < q_len; i++) {
        int64_t visible = kv_len - q_len + i + 1;
        for (int h = 0; h < c->group; h++) {
            const float *qh = c->q + row_offset(c, q0 + i, kv_head) + (size_t)h * d;
            float *oh = c->out + row_offset(c, q0 + i, kv_head) + (size_t)h * d;
            float mx = -INFINITY;
            int64_t lo = window_start(&c->attn, visible);
            for (int64_t t = lo; t < visible; t++) {
                float dot = 0.0f;
                for (int j = 0; j < d; j++) dot += qh[j] * kc[(size_t)t * d + j];
                p[t] = score(&c->attn, dot);
                if (p[t] > mx) mx = p[t];
            }
            float sum = 0.0f;
            for (int64_t t = lo; t < visible; t++) {
                p[t] = expf(p[t] - mx);
                sum += p[t];
            }
            for (int j = 0; j < d; j++) oh[j] = 0.0f;
            for (int64_t t = lo; t < visible; t++) {
                float w = p[t] / sum;
                for (int j = 0; j < d; j++) oh[j] += w * vc[(size_t)t * d + j];
            }
        }
    }
    free(kc);
}

static void run_item(void *arg, int64_t index) {
    attn_ctx *c = arg;
    const attn_item *it = &c->items[index];
    const be_paged_batch *b = c->batch;
    int s = it->seq;
    if (it->kind == ITEM_GATHER) {
        run_gather(c, s, it->kv_head);
        return;
    }
    attn_acc a;
    if (!acc_init(&a, c->group, c->head_dim)) {
        atomic_store(&c->oom, 1);
        return;
    }
    acc_reset(&a);
    int64_t kv_len = b->kv_len[s];
    int64_t q0 = b->q_indptr[s], q_len = b->q_indptr[s + 1] - q0;
    const int32_t *pages = seq_pages(c, s);
    int64_t first = seq_first(c, s);
    if (it->kind == ITEM_PREFILL) {
        int64_t row = q0 + it->extra, visible = kv_len - q_len + it->extra + 1;
        acc_run(&a, c->q + row_offset(c, row, it->kv_head), &c->attn, c->layer, pages, first,
                it->kv_head, window_start(&c->attn, visible), visible);
        acc_finish(&a, c->out + row_offset(c, row, it->kv_head), NULL);
    } else if (it->kind == ITEM_V1) {
        acc_run(&a, c->q + row_offset(c, q0, it->kv_head), &c->attn, c->layer, pages, first,
                it->kv_head, window_start(&c->attn, kv_len), kv_len);
        acc_finish(&a, c->out + row_offset(c, q0, it->kv_head), NULL);
    } else {
        /* Chunk boundaries are page boundaries, so token ranges start first_page_offset
         * tokens early. */
        int64_t span = (int64_t)c->pages_per_chunk * c->layer->block_size;
        int64_t t0 = (int64_t)it->extra * span - first;
        int64_t t1 = t0 + span;
        int64_t lo = window_start(&c->attn, kv_len);
        if (t0 < lo) t0 = lo;
        if (t1 > kv_len) t1 = kv_len;
        if (t1 > t0)
            acc_run(&a, c->q + row_offset(c, q0, it->kv_head), &c->attn, c->layer, pages, first,
                    it->kv_head, t0, t1);
        size_t slot = ((size_t)it->decode * c->max_chunks + it->extra) * c->n_heads +
                      (size_t)it->kv_head * c->group;
        acc_finish(&a, c->partial + slot * c->head_dim, c->lse + slot);
    }
    free(a.m);
}

/* Combines the chunks of decode row d, head h by their log-sum-exps. */
static void run_merge(void *arg, int64_t index) {
    attn_ctx *c = arg;
    int64_t d = index / c->n_heads;
    int h = (int)(index % c->n_heads);
    int s = c->decode_seq[d];
    int dim = c->head_dim;
    float *o = c->out + (size_t)c->batch->q_indptr[s] * c->n_heads * dim + (size_t)h * dim;
    float mx = -INFINITY;
    for (int ch = 0; ch < c->max_chunks; ch++) {
        float v = c->lse[((size_t)d * c->max_chunks + ch) * c->n_heads + h];
        if (v > mx) mx = v;
    }
    for (int j = 0; j < dim; j++) o[j] = 0.0f;
    if (mx == -INFINITY) return;
    float total = 0.0f;
    for (int ch = 0; ch < c->max_chunks; ch++) {
        size_t slot = ((size_t)d * c->max_chunks + ch) * c->n_heads + h;
        if (c->lse[slot] == -INFINITY) continue;
        float w = expf(c->lse[slot] - mx);
        total += w;
        const float *po = c->partial + slot * dim;
        for (int j = 0; j < dim; j++) o[j] += w * po[j];
    }
    for (int j = 0; j < dim; j++) o[j] /= total;
}

static int check_tensors(const be_tensor *q, const be_tensor *out, const be_kv_layer *layer,
                         const be_paged_batch *batch, int n_heads, base_err *err) {
    if (!pool_dtype_ok(layer->dtype))
        return base_fail(err, "attention: pool dtype %s is not F32, F16 or BF16",
                         base_dtype_name(layer->dtype));
    if (layer->n_kv_heads <= 0 || n_heads <= 0 || n_heads % layer->n_kv_heads != 0)
        return base_fail(err, "attention: %d heads not a multiple of %d kv heads", n_heads,
                         layer->n_kv_heads);
    if (layer->head_dim <= 0 || layer->head_dim > ATTN_MAX_HEAD_DIM || layer->block_size <= 0)
        return base_fail(err, "attention: head_dim %d or block_size %d out of range",
                         layer->head_dim, layer->block_size);
    int64_t cols = (int64_t)n_heads * layer->head_dim;
    const be_tensor *t[2] = {q, out};
    for (int i = 0; i < 2; i++) {
        if (t[i]->dtype != BASE_DTYPE_F32 || t[i]->rows != batch->n_tokens || t[i]->cols != cols)
            return base_fail(err, "attention: %s is %s [%lld, %lld], want F32 [%d, %lld]",
                             i ? "out" : "q", base_dtype_name(t[i]->dtype), (long long)t[i]->rows,
                             (long long)t[i]->cols, batch->n_tokens, (long long)cols);
    }
    return 0;
}

/* Fills the item list (caller frees *items and *decode_seq); returns the item count. */
static int64_t build_items(const be_paged_batch *b, be_decode_kind kind, int n_kv, int max_chunks,
                           attn_item **items, int32_t **decode_seq, int64_t *n_decode) {
    int64_t n = 0, nd = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        int64_t q_len = b->q_indptr[s + 1] - b->q_indptr[s];
        if (q_len == 1) {
            nd++;
            n += kind == BE_DECODE_V2 ? (int64_t)max_chunks : 1;
        } else {
            n += q_len;
        }
    }
    n *= n_kv;
    attn_item *it = base_xmalloc((size_t)(n > 0 ? n : 1) * sizeof *it);
    int32_t *ds = base_xmalloc((size_t)(nd > 0 ? nd : 1) * sizeof *ds);
    int64_t k = 0;
    int32_t d = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        int32_t q_len = b->q_indptr[s + 1] - b->q_indptr[s];
        for (int h = 0; h < n_kv; h++) {
            if (q_len != 1) {
                for (int32_t r = 0; r < q_len; r++)
                    it[k++] = (attn_item){ITEM_PREFILL, s, h, r, -1};
            } else if (kind == BE_DECODE_V2) {
                for (int ch = 0; ch < max_chunks; ch++) it[k++] = (attn_item){ITEM_V2, s, h, ch, d};
            } else {
                it[k++] = (attn_item){kind == BE_DECODE_V1 ? ITEM_V1 : ITEM_GATHER, s, h, 0, d};
            }
        }
        if (q_len == 1) ds[d++] = s;
    }
    *items = it;
    *decode_seq = ds;
    *n_decode = nd;
    return k;
}

int attn_cpu_attention(base_pool *pool, const be_tensor *q, const be_kv_layer *layer,
                       const be_paged_batch *batch, const be_decode_plan *plan, int n_heads,
                       be_attn attn, be_tensor *out, base_err *err) {
    if (check_tensors(q, out, layer, batch, n_heads, err)) return -1;
    if (!(attn.softcap >= 0) || attn.window < 0)
        return base_fail(err, "attention: softcap %g and window %d must not be negative",
                         (double)attn.softcap, attn.window);
    if (attn_batch_check(batch, layer, err)) return base_fail_wrap(err, "attention");
    be_decode_plan v1 = {.kind = BE_DECODE_V1};
    be_decode_plan gather = {.kind = BE_DECODE_GATHER};
    if (!plan) plan = &v1;
    base_err why;
    if (attn_plan_validate(plan, batch, layer, n_heads, &why)) {
        base_log(BASE_LOG_DEBUG, "attention: %s; using gather", why.msg);
        plan = &gather;
    }
    attn_ctx c = {
        .layer = layer,
        .batch = batch,
        .q = q->data,
        .out = out->data,
        .n_heads = n_heads,
        .group = n_heads / layer->n_kv_heads,
        .head_dim = layer->head_dim,
        .attn = attn,
        .pages_per_chunk = plan->pages_per_chunk,
        .max_chunks = plan->max_chunks,
    };
    atomic_init(&c.oom, 0);
    attn_item *items;
    int32_t *decode_seq;
    int64_t n_decode;
    int64_t n_items = build_items(batch, plan->kind, layer->n_kv_heads, plan->max_chunks, &items,
                                  &decode_seq, &n_decode);
    c.items = items;
    c.decode_seq = decode_seq;
    if (plan->kind == BE_DECODE_V2 && n_decode > 0) {
        c.partial = plan->workspace;
        c.lse = c.partial + (size_t)n_decode * plan->max_chunks * n_heads * layer->head_dim;
    }
    base_pool_for(pool, n_items, run_item, &c);
    if (plan->kind == BE_DECODE_V2 && !atomic_load(&c.oom))
        base_pool_for(pool, n_decode * n_heads, run_merge, &c);
    free(items);
    free(decode_seq);
    if (atomic_load(&c.oom)) return base_fail(err, "attention: out of host memory for scratch");
    return 0;
}
