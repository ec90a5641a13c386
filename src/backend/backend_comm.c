/* The in-process collectives: the ranks are threads of one process, each with its own backend;
 * a collective stages every rank's tensor in host memory (download), waits for all of them at
 * a barrier, and each rank then builds its result from the staged copies in rank order
 * (upload). Slow next to a device link, but exact and independent of the backend: it is what
 * proves a sharded forward equal to the unsharded one on the CPU. */
#include "backend/backend.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct comm_shared {
    int n_ranks;
    int live; /* communicators not yet destroyed */
    pthread_mutex_t mu;
    pthread_barrier_t barrier;
    void **staged; /* (n_ranks) each rank's tensor as it downloaded it */
} comm_shared;

typedef struct comm_rank {
    be_comm comm;
    comm_shared *sh;
    size_t staged_cap;
    float *sum; /* all_reduce_sum's result in F32, before it is narrowed to x's dtype */
    size_t sum_cap;
    void *out; /* the result in the tensor's dtype, for the upload */
    size_t out_cap;
} comm_rank;

static void *grow(void *p, size_t *cap, size_t bytes) {
    if (bytes <= *cap) return p;
    *cap = bytes;
    return base_xrealloc(p, bytes);
}

static float load_f32(base_dtype dt, const void *p, size_t i) {
    if (dt == BASE_DTYPE_F32) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return dt == BASE_DTYPE_BF16 ? base_bf16_to_f32(h) : base_f16_to_f32(h);
}

static void store_f32(base_dtype dt, void *p, size_t i, float v) {
    if (dt == BASE_DTYPE_F32)
        ((float *)p)[i] = v;
    else
        ((uint16_t *)p)[i] = dt == BASE_DTYPE_BF16 ? base_f32_to_bf16(v) : base_f32_to_f16(v);
}

/* Downloads t into this rank's staging buffer, then waits for every rank to have done so. */
static int stage(comm_rank *r, be_backend *be, const be_tensor *t, size_t bytes, base_err *err) {
    comm_shared *sh = r->sh;
    sh->staged[r->comm.rank] = grow(sh->staged[r->comm.rank], &r->staged_cap, bytes);
    int rc = be->ops->download(be, sh->staged[r->comm.rank], t->data, bytes, err);
    /* a failed rank still meets the barrier, or the others would wait for it forever */
    pthread_barrier_wait(&sh->barrier);
    return rc;
}

static int all_reduce_sum(be_comm *c, be_backend *be, be_tensor *x, base_err *err) {
    comm_rank *r = c->impl;
    comm_shared *sh = r->sh;
    base_dtype dt = x->dtype;
    if (dt != BASE_DTYPE_F32 && dt != BASE_DTYPE_F16 && dt != BASE_DTYPE_BF16)
        return base_fail(err, "all_reduce_sum: dtype %s is not F32, F16 or BF16",
                         base_dtype_name(dt));
    size_t n = (size_t)x->rows * (size_t)x->cols, bytes = n * base_dtype_size(dt);
    int rc = stage(r, be, x, bytes, err);
    r->sum = grow(r->sum, &r->sum_cap, n * sizeof(float));
    r->out = grow(r->out, &r->out_cap, bytes);
    for (size_t i = 0; i < n; i++) r->sum[i] = 0.0f;
    for (int q = 0; q < sh->n_ranks; q++)
        for (size_t i = 0; i < n; i++) r->sum[i] += load_f32(dt, sh->staged[q], i);
    for (size_t i = 0; i < n; i++) store_f32(dt, r->out, i, r->sum[i]);
    /* every rank has read the staged copies before any stages the next collective's */
    pthread_barrier_wait(&sh->barrier);
    if (rc) return -1;
    return be->ops->upload(be, x->data, r->out, bytes, err);
}

static int all_gather_cols(be_comm *c, be_backend *be, const be_tensor *part, be_tensor *full,
                           base_err *err) {
    comm_rank *r = c->impl;
    comm_shared *sh = r->sh;
    if (full->dtype != part->dtype || full->rows != part->rows ||
        full->cols != part->cols * sh->n_ranks)
        return base_fail(err, "all_gather_cols: full [%lld, %lld] is not %d parts [%lld, %lld]",
                         (long long)full->rows, (long long)full->cols, sh->n_ranks,
                         (long long)part->rows, (long long)part->cols);
    size_t row = (size_t)part->cols * base_dtype_size(part->dtype);
    size_t bytes = row * (size_t)part->rows;
    int rc = stage(r, be, part, bytes, err);
    r->out = grow(r->out, &r->out_cap, bytes * (size_t)sh->n_ranks);
    for (int64_t i = 0; i < part->rows; i++)
        for (int q = 0; q < sh->n_ranks; q++)
            memcpy((char *)r->out + ((size_t)i * (size_t)sh->n_ranks + (size_t)q) * row,
                   (const char *)sh->staged[q] + (size_t)i * row, row);
    pthread_barrier_wait(&sh->barrier);
    if (rc) return -1;
    return be->ops->upload(be, full->data, r->out, bytes * (size_t)sh->n_ranks, err);
}

static void destroy(be_comm *c) {
    comm_rank *r = c->impl;
    comm_shared *sh = r->sh;
    pthread_mutex_lock(&sh->mu);
    free(sh->staged[c->rank]);
    bool last = --sh->live == 0;
    pthread_mutex_unlock(&sh->mu);
    if (last) {
        pthread_barrier_destroy(&sh->barrier);
        pthread_mutex_destroy(&sh->mu);
        free(sh->staged);
        free(sh);
    }
    free(r->sum);
    free(r->out);
    free(r);
}

static const be_comm_ops g_local_ops = {
    .all_reduce_sum = all_reduce_sum,
    .all_gather_cols = all_gather_cols,
    .destroy = destroy,
};

int be_comm_local_create(int n_ranks, be_comm **comms, base_err *err) {
    if (n_ranks < 1) return base_fail(err, "be_comm_local_create: %d ranks", n_ranks);
    comm_shared *sh = base_xcalloc(1, sizeof *sh);
    if (pthread_barrier_init(&sh->barrier, NULL, (unsigned)n_ranks) != 0) {
        free(sh);
        return base_fail(err, "be_comm_local_create: no barrier for %d ranks", n_ranks);
    }
    pthread_mutex_init(&sh->mu, NULL);
    sh->n_ranks = sh->live = n_ranks;
    sh->staged = base_xcalloc((size_t)n_ranks, sizeof *sh->staged);
    for (int i = 0; i < n_ranks; i++) {
        comm_rank *r = base_xcalloc(1, sizeof *r);
        r->sh = sh;
        r->comm = (be_comm){&g_local_ops, i, n_ranks, r};
        comms[i] = &r->comm;
    }
    return 0;
}
