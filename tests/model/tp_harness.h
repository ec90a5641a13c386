/* Tensor parallelism against the whole model, shared by the CPU and CUDA tests: a fixture's
 * prompt (logits of every position) and greedy decode steps after it, run on the whole model
 * and on n ranks, each rank a thread with its own backend, its part of the weights and its KV
 * heads' slab of the pool, all laid out by the whole model's one block table. */
#ifndef MLXCEL_TEST_TP_HARNESS_H
#define MLXCEL_TEST_TP_HARNESS_H

#include "fixture_ref.h"

#include "model/model.h"

#include <pthread.h>
#include <string.h>

#define TP_BLOCK    16
#define TP_DECODE   4
#define TP_MAX_RANK 4

/* Where the ranks run. */
typedef struct tp_env {
    /* the backend of rank r (the whole model runs on rank 0's kind) */
    int (*open_backend)(int rank, be_backend **be, base_err *err);
    /* one communicator per rank's backend */
    int (*open_comms)(be_backend *const *bes, int n, be_comm **comms, base_err *err);
    base_dtype kv_dtype;
} tp_env;

/* One model and its pool: the whole model, or one rank. */
typedef struct tp_runner {
    be_backend *be;
    model *m;
    kv_pool *pool;
    /* the step every runner runs */
    const kv_batch *batch;
    const int32_t *tokens, *rows;
    int n_out;
    float *logits; /* (n_out, vocab) */
    int rc;
    base_err err;
} tp_runner;

static inline int tp_bind(be_backend *be, base_err *err) {
    return be->ops->bind_thread ? be->ops->bind_thread(be, err) : 0;
}

static inline void *tp_run_step(void *p) {
    tp_runner *r = p;
    r->rc = tp_bind(r->be, &r->err) || model_forward(r->m, r->pool, r->batch, r->tokens, r->rows,
                                                     r->n_out, r->logits, &r->err);
    return NULL;
}

static inline int tp_open_backend(const tp_env *env, tp_runner *r, int rank, base_err *err) {
    memset(r, 0, sizeof *r);
    return env->open_backend(rank, &r->be, err);
}

/* The model (rank `rank` of n_ranks) and a pool of its KV heads with blocks for ctx tokens. */
static inline int tp_open_model(const tp_env *env, tp_runner *r, const char *dir, int n_ranks,
                                int rank, be_comm *comm, const io_model_config *c, int ctx,
                                base_err *err) {
    if (tp_bind(r->be, err) ||
        model_load_shard(dir, r->be, n_ranks, rank, comm, NULL, NULL, &r->m, err))
        return -1;
    kv_geometry g = {
        c->num_hidden_layers, model_kv_heads(r->m), c->head_dim, TP_BLOCK, env->kv_dtype, 0, NULL};
    if (c->sliding_window > 0 && c->layer_local) {
        g.window = c->sliding_window;
        g.layer_local = c->layer_local;
    }
    int64_t blocks = ctx / TP_BLOCK + 2;
    int64_t local = kv_geometry_local_layers(&g) ? blocks : 0;
    return model_reserve_decode(r->m, TP_BLOCK, 1, ctx, err) ||
           kv_pool_create(r->be, &g, blocks, local, &r->pool, err);
}

static inline void tp_close(tp_runner *r) {
    if (r->be) tp_bind(r->be, &r->err);
    kv_pool_destroy(r->pool);
    model_free(r->m);
    if (r->be) be_destroy(r->be);
    free(r->logits);
}

/* Runs one step on the whole model and on every rank (a thread each); the worst relative
 * error of a rank's logits row against the whole model's. */
static inline double tp_step(tp_runner *whole, tp_runner *ranks, int n, const kv_batch *batch,
                             const int32_t *tokens, const int32_t *rows, int n_out, int vocab,
                             const char *name) {
    tp_runner *all[TP_MAX_RANK + 1] = {whole};
    for (int r = 0; r < n; r++) all[r + 1] = &ranks[r];
    for (int i = 0; i <= n; i++) {
        all[i]->batch = batch;
        all[i]->tokens = tokens;
        all[i]->rows = rows;
        all[i]->n_out = n_out;
        all[i]->logits = base_xrealloc(all[i]->logits, (size_t)n_out * vocab * sizeof(float));
    }
    tp_run_step(whole);
    pthread_t th[TP_MAX_RANK];
    for (int r = 0; r < n; r++) pthread_create(&th[r], NULL, tp_run_step, &ranks[r]);
    for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
    double worst = 0;
    for (int i = 0; i <= n; i++)
        CHECK_MSG(all[i]->rc == 0, "%s: %s: %s", name, i ? "a rank" : "one rank", all[i]->err.msg);
    if (whole->rc) return INFINITY;
    for (int r = 0; r < n; r++) {
        if (ranks[r].rc) return INFINITY;
        for (int i = 0; i < n_out; i++) {
            double e = test_rel_err(ranks[r].logits + (size_t)i * vocab,
                                    whole->logits + (size_t)i * vocab, (size_t)vocab);
            worst = e > worst ? e : worst;
        }
    }
    return worst;
}

static inline int32_t tp_argmax(const float *row, int vocab) {
    int32_t best = 0;
    for (int i = 1; i < vocab; i++)
        if (row[i] > row[best]) best = i;
    return best;
}

/* The prompt, then TP_DECODE greedy tokens, on the whole model and on n ranks: the worst
 * relative errors of the prompt's logits and of the decode steps' (INFINITY when a step
 * failed). */
static inline void tp_run(const tp_env *env, const char *name, const char *dir,
                          const io_model_config *c, const fixture_ref *ref, int n,
                          double *prompt_err, double *decode_err) {
    int ctx = ref->n_tokens + TP_DECODE + 1, vocab = c->vocab_size;
    base_err err;
    be_comm *comms[TP_MAX_RANK] = {NULL};
    be_backend *bes[TP_MAX_RANK] = {NULL};
    tp_runner whole, ranks[TP_MAX_RANK];
    memset(ranks, 0, sizeof ranks);
    int rc = tp_open_backend(env, &whole, 0, &err);
    for (int r = 0; r < n && rc == 0; r++) {
        rc = tp_open_backend(env, &ranks[r], r, &err);
        bes[r] = ranks[r].be;
    }
    if (rc == 0) rc = env->open_comms(bes, n, comms, &err);
    if (rc == 0) rc = tp_open_model(env, &whole, dir, 1, 0, NULL, c, ctx, &err);
    for (int r = 0; r < n && rc == 0; r++)
        rc = tp_open_model(env, &ranks[r], dir, n, r, comms[r], c, ctx, &err);
    CHECK_MSG(rc == 0, "%s x%d: %s", name, n, err.msg);
    kv_seq *seq = rc == 0 ? kv_seq_create(whole.pool) : NULL;
    int32_t *rows = base_xmalloc((size_t)ref->n_tokens * sizeof *rows);
    for (int i = 0; i < ref->n_tokens; i++) rows[i] = i;
    *prompt_err = INFINITY;
    *decode_err = 0;
    /* the block table is the whole model's pool's: every rank's slab is laid out by it */
    for (int step = 0; rc == 0 && step <= TP_DECODE; step++) {
        int32_t next, row0 = 0;
        const int32_t *tokens = ref->tokens;
        int q = ref->n_tokens;
        if (step > 0) {
            next = tp_argmax(whole.logits + (size_t)(whole.n_out - 1) * vocab, vocab);
            tokens = &next;
            q = 1;
        }
        kv_batch batch;
        rc = kv_seq_append(whole.pool, seq, tokens, q, &err) ||
             kv_batch_build(whole.pool, &seq, &q, 1, &batch, &err);
        CHECK_MSG(rc == 0, "%s x%d: %s", name, n, err.msg);
        if (rc) break;
        double e = tp_step(&whole, ranks, n, &batch, tokens, step ? &row0 : rows, q, vocab, name);
        kv_seq_commit(whole.pool, seq);
        kv_batch_free(&batch);
        if (step == 0)
            *prompt_err = e;
        else
            *decode_err = e > *decode_err ? e : *decode_err;
    }
    if (rc) *decode_err = INFINITY;
    free(rows);
    if (seq) kv_seq_free(whole.pool, seq);
    for (int r = 0; r < n; r++) {
        tp_close(&ranks[r]);
        if (comms[r]) comms[r]->ops->destroy(comms[r]);
    }
    tp_close(&whole);
}

#endif
