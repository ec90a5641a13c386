/* Helpers shared by the CUDA backend tests: the skip rule, random data, and moving float
 * arrays to and from device tensors of any float dtype. */
#ifndef MLXCEL_TEST_CUDA_UTIL_H
#define MLXCEL_TEST_CUDA_UTIL_H

#include "backend/backend.h"
#include "test.h"

#include <stdint.h>
#include <string.h>

/* The CUDA backend, or NULL after printing the skip line when no device can be used. */
static inline be_backend *tc_backend(void) {
    be_backend *be = NULL;
    base_err err = {{0}};
    if (be_cuda_create(0, &be, &err) != 0) {
        printf("skipped: no CUDA device (%s)\n", err.msg);
        return NULL;
    }
    return be;
}

static uint64_t tc_rng_state = 0x9e3779b97f4a7c15ull;

static inline uint32_t tc_u32(void) {
    return test_rand_u32(&tc_rng_state);
}

/* Uniform in [-1, 1). */
static inline float tc_uniform(void) {
    return (float)(tc_u32() & 0xffffff) / 8388608.0f - 1.0f;
}

static inline void tc_fill(float *x, size_t n, float amp) {
    for (size_t i = 0; i < n; i++) x[i] = amp * tc_uniform();
}

/* Rounds x to dtype dt in place, so that references see exactly what the device sees. */
static inline void tc_round(float *x, size_t n, base_dtype dt) {
    for (size_t i = 0; i < n; i++) {
        if (dt == BASE_DTYPE_F16) x[i] = base_f16_to_f32(base_f32_to_f16(x[i]));
        if (dt == BASE_DTYPE_BF16) x[i] = base_bf16_to_f32(base_f32_to_bf16(x[i]));
    }
}

static inline void *tc_dev_bytes(be_backend *be, const void *host, size_t bytes) {
    void *d = NULL;
    base_err err = {{0}};
    if (be->ops->alloc(be, bytes, &d, &err) || be->ops->upload(be, d, host, bytes, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    return d;
}

/* A device tensor of dtype dt holding x (rows x cols floats); caller frees .data. */
static inline be_tensor tc_tensor(be_backend *be, const float *x, base_dtype dt, int64_t rows,
                                  int64_t cols) {
    size_t n = (size_t)(rows * cols);
    void *h = malloc(n * base_dtype_size(dt) + 1);
    for (size_t i = 0; i < n; i++) base_store_float(h, dt, i, x[i]);
    be_tensor t = {tc_dev_bytes(be, h, n * base_dtype_size(dt) + 1), dt, rows, cols};
    free(h);
    return t;
}

/* A device tensor whose bytes are all 0xff (NaN in every float dtype): outputs start there,
 * so an element the op forgets to write fails the comparison. */
static inline be_tensor tc_poisoned(be_backend *be, base_dtype dt, int64_t rows, int64_t cols) {
    size_t bytes = (size_t)(rows * cols) * base_dtype_size(dt);
    void *h = malloc(bytes + 1);
    memset(h, 0xff, bytes + 1);
    be_tensor t = {tc_dev_bytes(be, h, bytes + 1), dt, rows, cols};
    free(h);
    return t;
}

/* The tensor's values as floats (caller frees). */
static inline float *tc_read(be_backend *be, const be_tensor *t) {
    size_t n = (size_t)(t->rows * t->cols), bytes = n * base_dtype_size(t->dtype);
    void *h = malloc(bytes + 1);
    float *out = malloc(n * sizeof(float) + 1);
    base_err err = {{0}};
    if (be->ops->sync(be, &err) || be->ops->download(be, h, t->data, bytes, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    for (size_t i = 0; i < n; i++) out[i] = base_load_float(h, t->dtype, i);
    free(h);
    return out;
}

/* Relative error of the device tensor against a double-precision reference. */
static inline double tc_err(be_backend *be, const be_tensor *t, const double *ref) {
    size_t n = (size_t)(t->rows * t->cols);
    float *got = tc_read(be, t);
    float *r = malloc(n * sizeof(float) + 1);
    for (size_t i = 0; i < n; i++) r[i] = (float)ref[i];
    double e = test_rel_err(got, r, n);
    free(got);
    free(r);
    return e;
}

/* Tolerance for an output stored in dt: its rounding, with room for F32 accumulation. */
static inline double tc_tol(base_dtype dt) {
    return dt == BASE_DTYPE_F32 ? 1e-5 : (dt == BASE_DTYPE_F16 ? 2e-3 : 1e-2);
}

/* ---- a paged attention scene: sequences, their pages, the pools, their device copies ---- */

/* One sequence: kv_len tokens in the cache, the last q_len of them this step's rows,
 * first_offset tokens skipped in its first page. */
typedef struct tc_seq {
    int kv_len, q_len, first_offset;
} tc_seq;

/* GQA group, kv heads, head_dim, block size, and the pool's and the activations' dtypes. */
typedef struct tc_att_case {
    int group, n_kv, head_dim, block_size;
    base_dtype pool_dt, act_dt;
} tc_att_case;

/* A batch in host memory; its pages are a random permutation of a pool with spare blocks. */
typedef struct tc_batch {
    int n_seqs, n_tokens, max_q, max_kv, max_pages;
    int32_t *q_indptr, *kv_len, *page_indptr, *pages, *last_len,
        *first; /* CSR, as be_paged_batch */
    int64_t num_blocks;
} tc_batch;

static inline void tc_batch_build(const tc_seq *seqs, int n, int bs, int spare, tc_batch *b) {
    memset(b, 0, sizeof *b);
    b->n_seqs = n;
    b->q_indptr = calloc(n + 1, 4);
    b->kv_len = calloc(n, 4);
    b->page_indptr = calloc(n + 1, 4);
    b->last_len = calloc(n, 4);
    b->first = calloc(n, 4);
    for (int s = 0; s < n; s++) {
        int span = seqs[s].first_offset + seqs[s].kv_len, np = (span + bs - 1) / bs;
        b->q_indptr[s + 1] = b->q_indptr[s] + seqs[s].q_len;
        b->kv_len[s] = seqs[s].kv_len;
        b->page_indptr[s + 1] = b->page_indptr[s] + np;
        b->last_len[s] = span - (np - 1) * bs;
        b->first[s] = seqs[s].first_offset;
        if (seqs[s].q_len > b->max_q) b->max_q = seqs[s].q_len;
        if (seqs[s].kv_len > b->max_kv) b->max_kv = seqs[s].kv_len;
        if (np > b->max_pages) b->max_pages = np;
    }
    b->n_tokens = b->q_indptr[n];
    int total = b->page_indptr[n];
    b->num_blocks = total + spare;
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)b->num_blocks);
    for (int i = 0; i < b->num_blocks; i++) perm[i] = i;
    for (int i = (int)b->num_blocks - 1; i > 0; i--) {
        int j = (int)(tc_u32() % (uint32_t)(i + 1)), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    b->pages = malloc(sizeof(int32_t) * (size_t)(total > 0 ? total : 1));
    memcpy(b->pages, perm, sizeof(int32_t) * (size_t)total);
    free(perm);
}

static inline void tc_batch_free(tc_batch *b) {
    free(b->q_indptr), free(b->kv_len), free(b->page_indptr), free(b->pages), free(b->last_len),
        free(b->first);
}

/* Element offset of token j of sequence s in a slab of `width` elements per token. */
static inline size_t tc_tok_offset(const tc_batch *b, int s, int j, int bs, int width) {
    int pos = b->first[s] + j;
    return ((size_t)b->pages[b->page_indptr[s] + pos / bs] * bs + pos % bs) * width;
}

/* The K and V pools: every live token random, every other slot NaN; the bytes as the pool
 * dtype (kh, vh) and their values as floats (kf, vf). */
typedef struct tc_pools {
    uint8_t *kh, *vh; /* (bytes) */
    float *kf, *vf;   /* (elems) */
    size_t elems, bytes;
} tc_pools;

static inline void tc_pools_fill(const tc_batch *b, const tc_att_case *c, tc_pools *p) {
    int width = c->n_kv * c->head_dim;
    p->elems = (size_t)b->num_blocks * c->block_size * width;
    p->bytes = p->elems * 2;
    p->kh = malloc(p->bytes), p->vh = malloc(p->bytes);
    memset(p->kh, 0xff, p->bytes);
    memset(p->vh, 0xff, p->bytes);
    p->kf = malloc(sizeof(float) * p->elems), p->vf = malloc(sizeof(float) * p->elems);
    for (int s = 0; s < b->n_seqs; s++)
        for (int j = 0; j < b->kv_len[s]; j++) {
            size_t off = tc_tok_offset(b, s, j, c->block_size, width);
            for (int e = 0; e < width; e++) {
                base_store_float(p->kh, c->pool_dt, off + e, tc_uniform());
                base_store_float(p->vh, c->pool_dt, off + e, tc_uniform());
                p->kf[off + e] = base_load_float(p->kh, c->pool_dt, off + e);
                p->vf[off + e] = base_load_float(p->vh, c->pool_dt, off + e);
            }
        }
}

static inline void tc_pools_free(tc_pools *p) {
    free(p->kh), free(p->vh), free(p->kf), free(p->vf);
}

static inline void *tc_dev_i32(be_backend *be, const int32_t *x, int n) {
    return tc_dev_bytes(be, x, sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
}

/* The pools as a device KV layer; free with tc_dev_layer_free. */
static inline be_kv_layer tc_dev_layer(be_backend *be, const tc_pools *p, const tc_batch *b,
                                       const tc_att_case *c) {
    return (be_kv_layer){tc_dev_bytes(be, p->kh, p->bytes),
                         tc_dev_bytes(be, p->vh, p->bytes),
                         c->pool_dt,
                         b->num_blocks,
                         c->block_size,
                         c->n_kv,
                         c->head_dim};
}

static inline void tc_dev_layer_free(be_backend *be, be_kv_layer *l) {
    be->ops->free(be, l->k);
    be->ops->free(be, l->v);
}

/* The batch's arrays in device memory; free with tc_dev_batch_free. */
static inline be_paged_batch tc_dev_batch(be_backend *be, const tc_batch *b) {
    return (be_paged_batch){
        .n_seqs = b->n_seqs,
        .n_tokens = b->n_tokens,
        .max_q_len = b->max_q,
        .max_kv_len = b->max_kv,
        .q_indptr = tc_dev_i32(be, b->q_indptr, b->n_seqs + 1),
        .kv_len = tc_dev_i32(be, b->kv_len, b->n_seqs),
        .page_indptr = tc_dev_i32(be, b->page_indptr, b->n_seqs + 1),
        .page_indices = tc_dev_i32(be, b->pages, b->page_indptr[b->n_seqs]),
        .last_page_len = tc_dev_i32(be, b->last_len, b->n_seqs),
        .first_page_offset = tc_dev_i32(be, b->first, b->n_seqs),
    };
}

static inline void tc_dev_batch_free(be_backend *be, be_paged_batch *db) {
    be->ops->free(be, (void *)db->q_indptr);
    be->ops->free(be, (void *)db->kv_len);
    be->ops->free(be, (void *)db->page_indptr);
    be->ops->free(be, (void *)db->page_indices);
    be->ops->free(be, (void *)db->last_page_len);
    be->ops->free(be, (void *)db->first_page_offset);
}

#endif
