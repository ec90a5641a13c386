/* Decode steps as recorded graphs. A decode step is the same few hundred ops every time, and
 * only the data they read changes: token ids, positions, slots and page tables live in
 * backend buffers that the step fills before it runs. So a step recorded once can be replayed
 * while nothing the recording holds fixed has changed: the number of sequences, the buffers
 * (the scratch generations), the pool, and the attention plan with its length bound. Lengths
 * are bucketed by powers of two in pages, and the plan is made for the bucket's top, so that
 * a sequence growing token by token keeps one recording for a long stretch.
 *
 * A key seen for the first time runs directly (one-off batch shapes are not worth recording);
 * the second time it is recorded and replayed. A key whose recording fails runs directly from
 * then on. MLXCEL_DECODE_GRAPHS=0 turns recording off; such steps still plan by bucket, so that
 * the two give the same logits. */
#include "model/model_internal.h"

#include <stdlib.h>
#include <string.h>

static bool graphs_enabled(void) {
    const char *env = getenv("MLXCEL_DECODE_GRAPHS");
    return !(env && strcmp(env, "0") == 0);
}

bool model_graph_usable(const model *m, const model_step *st) {
    const be_ops *op = m->be->ops;
    const be_paged_batch *hb = st->host;
    if (!op->capture_begin || !op->capture_end || !op->graph_launch || !op->graph_free)
        return false;
    if (!st->freqs || st->hidden) return false;
    if (hb->max_q_len != 1 || hb->n_tokens != hb->n_seqs || st->n_out != hb->n_tokens) return false;
    for (int i = 0; i < st->n_out; i++)
        if (st->out_rows[i] != i) return false;
    return true;
}

static bool key_equal(const model_graph_key *a, const model_graph_key *b) {
    return a->pool == b->pool && a->n_seqs == b->n_seqs && a->kv_bound == b->kv_bound &&
           a->page_offsets == b->page_offsets && a->pages_at == b->pages_at &&
           a->plan.kind == b->plan.kind && a->plan.pages_per_chunk == b->plan.pages_per_chunk &&
           a->plan.max_chunks == b->plan.max_chunks && a->plan.workspace == b->plan.workspace &&
           a->model_generation == b->model_generation &&
           a->backend_generation == b->backend_generation && a->freqs == b->freqs;
}

static void entry_clear(model *m, model_graph_entry *e) {
    if (e->graph) m->be->ops->graph_free(m->be, e->graph);
    memset(e, 0, sizeof *e);
}

/* The entry for key, or a fresh one (the least recently used, cleared) with used = false. */
static model_graph_entry *entry_for(model *m, const model_graph_key *key, bool *used) {
    model_graph_entry *lru = &m->graphs[0];
    for (int i = 0; i < MODEL_GRAPH_CACHE; i++) {
        model_graph_entry *e = &m->graphs[i];
        if (e->last_use && key_equal(&e->key, key)) {
            *used = true;
            return e;
        }
        if (e->last_use < lru->last_use) lru = e;
    }
    entry_clear(m, lru);
    lru->key = *key;
    *used = false;
    return lru;
}

/* Records the step and keeps the recording in e; on failure the step is not run. */
static int record(model *m, const model_step *st, model_graph_entry *e, base_err *err) {
    be_backend *be = m->be;
    if (be->ops->capture_begin(be, err)) return -1;
    base_err body_err;
    int rc = model_forward_body(m, st, &body_err);
    be_graph *g = NULL;
    int end = be->ops->capture_end(be, &g, err);
    if (rc || end) {
        if (g) be->ops->graph_free(be, g);
        if (rc) *err = body_err;
        return -1;
    }
    e->graph = g;
    m->graphs_recorded++;
    return 0;
}

int model_graph_step(model *m, model_step *st, base_err *err) {
    const be_paged_batch *hb = st->host;
    int block = kv_pool_geometry(st->pool)->block_size;
    int64_t max_pages = 1;
    for (int i = 0; i < hb->n_seqs; i++) {
        int64_t pages = hb->page_indptr[i + 1] - hb->page_indptr[i];
        if (pages > max_pages) max_pages = pages;
    }
    int64_t bucket = 1;
    while (bucket < max_pages) bucket *= 2;
    model_plan_pages(m, hb->n_seqs, bucket, st->plan);
    int64_t bound = bucket * block;
    st->dev->max_kv_len = bound < INT32_MAX ? (int)bound : INT32_MAX;
    /* the local view's lengths are at most the global ones: the same bound holds */
    if (st->dev_local) st->dev_local->max_kv_len = st->dev->max_kv_len;

    model_graph_key key;
    memset(&key, 0, sizeof key);
    key.pool = st->pool;
    key.n_seqs = hb->n_seqs;
    key.page_offsets = hb->first_page_offset != NULL;
    /* where the page list starts in the uploaded arrays: the local view's parts before it
     * move it (upload_batch) */
    key.pages_at = (uint64_t)((const char *)st->dev->page_indices - (const char *)m->s.meta);
    key.kv_bound = st->dev->max_kv_len;
    key.plan = *st->plan;
    key.model_generation = m->s.generation;
    key.backend_generation = m->be->generation;
    key.freqs = st->freqs;
    /* Unrecorded, the step still takes the bucket's plan: recording on or off gives the same
     * logits, bit for bit. */
    if (!graphs_enabled()) return model_forward_body(m, st, err);
    bool used;
    model_graph_entry *e = entry_for(m, &key, &used);
    e->last_use = ++m->graph_clock;
    if (used && !e->graph && !e->failed) {
        base_log(BASE_LOG_DEBUG,
                 "recording a decode step of %d sequences up to %d tokens: plan kind %d, %d "
                 "chunks of %d pages",
                 hb->n_seqs, st->dev->max_kv_len, (int)st->plan->kind, st->plan->max_chunks,
                 st->plan->pages_per_chunk);
        base_err rec_err;
        if (record(m, st, e, &rec_err) != 0) {
            base_log(BASE_LOG_DEBUG, "decode step of %d sequences runs unrecorded: %s", hb->n_seqs,
                     rec_err.msg);
            e->failed = true;
        }
    }
    if (e->graph) {
        m->graphs_replayed++;
        return m->be->ops->graph_launch(m->be, e->graph, err);
    }
    return model_forward_body(m, st, err);
}

void model_graphs_free(model *m) {
    for (int i = 0; i < MODEL_GRAPH_CACHE; i++) entry_clear(m, &m->graphs[i]);
}

void model_graph_counts(const model *m, uint64_t *recorded, uint64_t *replayed) {
    *recorded = m->graphs_recorded;
    *replayed = m->graphs_replayed;
}
