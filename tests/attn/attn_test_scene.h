/* Shared by the attention tests: a pool with host-side copies of what each sequence's K/V
 * should be, steps that append tokens and write their K/V through the backend, and a dense
 * reference computed in double from the host copies. */
#ifndef MLXCEL_TESTS_ATTN_SCENE_H
#define MLXCEL_TESTS_ATTN_SCENE_H

#include "test.h"
#include "kv/kv_test_backend.h"
#include "attn/attn.h"
#include "kv/kv.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static inline uint32_t rnd(void) {
    return (uint32_t)(test_rand_u64(&rng_state) >> 32);
}

/* inclusive */
static inline int irand(int lo, int hi) {
    return lo + (int)(rnd() % (uint32_t)(hi - lo + 1));
}

static inline float frand(void) {
    return (float)rnd() / 4294967296.0f * 2.0f - 1.0f;
}

static inline float round_to(base_dtype dt, float x) {
    if (dt == BASE_DTYPE_F16) return base_f16_to_f32(base_f32_to_f16(x));
    if (dt == BASE_DTYPE_BF16) return base_bf16_to_f32(base_f32_to_bf16(x));
    return x;
}

/* One sequence and the K/V its pages should hold. */
typedef struct ref_seq {
    kv_seq *seq;
    int len, cap;
    float *k, *v; /* (cap, n_kv_heads * head_dim) as stored (rounded to the pool dtype) */
} ref_seq;

typedef struct scene {
    be_backend *be;
    kv_pool *pool;
    int n_kv, group, n_heads, head_dim, block_size;
    base_dtype dtype;
} scene;

static inline int scene_row(const scene *sc) {
    return sc->n_kv * sc->head_dim;
}

static inline void ref_push(const scene *sc, ref_seq *r, const float *k, const float *v) {
    int row = scene_row(sc);
    if (r->len == r->cap) {
        r->cap = r->cap ? r->cap * 2 : 16;
        r->k = realloc(r->k, (size_t)r->cap * row * sizeof(float));
        r->v = realloc(r->v, (size_t)r->cap * row * sizeof(float));
    }
    memcpy(r->k + (size_t)r->len * row, k, (size_t)row * sizeof(float));
    memcpy(r->v + (size_t)r->len * row, v, (size_t)row * sizeof(float));
    r->len++;
}

static inline ref_seq ref_fork(const scene *sc, const ref_seq *src) {
    ref_seq r = {kv_seq_fork(sc->pool, src->seq), 0, 0, NULL, NULL};
    for (int t = 0; t < src->len; t++)
        ref_push(sc, &r, src->k + (size_t)t * scene_row(sc), src->v + (size_t)t * scene_row(sc));
    return r;
}

static inline void ref_free(const scene *sc, ref_seq *r) {
    kv_seq_free(sc->pool, r->seq);
    free(r->k);
    free(r->v);
}

/* Appends q_lens[s] random tokens to each sequence, writes random K/V for them through
 * kv_append and commits; returns the step's batch (caller frees). Returns -1 on failure. */
static inline int scene_step(const scene *sc, ref_seq **rs, const int *q_lens, int n,
                             kv_batch *batch) {
    base_err err;
    kv_seq **seqs = malloc((size_t)n * sizeof *seqs);
    for (int s = 0; s < n; s++) {
        int32_t ids[64];
        for (int done = 0; done < q_lens[s];) {
            int m = q_lens[s] - done < 64 ? q_lens[s] - done : 64;
            for (int i = 0; i < m; i++) ids[i] = irand(0, 3);
            if (kv_seq_append(sc->pool, rs[s]->seq, ids, m, &err)) {
                fprintf(stderr, "append: %s\n", err.msg);
                free(seqs);
                return -1;
            }
            done += m;
        }
        seqs[s] = rs[s]->seq;
    }
    int rc = kv_batch_build(sc->pool, seqs, q_lens, n, batch, &err);
    free(seqs);
    if (rc) {
        fprintf(stderr, "batch: %s\n", err.msg);
        return -1;
    }
    int row = scene_row(sc);
    int nt = batch->view.n_tokens;
    float *k = malloc((size_t)(nt ? nt : 1) * row * sizeof(float));
    float *v = malloc((size_t)(nt ? nt : 1) * row * sizeof(float));
    for (int s = 0, t = 0; s < n; s++) {
        for (int i = 0; i < q_lens[s]; i++, t++) {
            for (int j = 0; j < row; j++) {
                k[(size_t)t * row + j] = round_to(sc->dtype, frand());
                v[(size_t)t * row + j] = round_to(sc->dtype, frand());
            }
            ref_push(sc, rs[s], k + (size_t)t * row, v + (size_t)t * row);
        }
    }
    be_tensor kt = {k, BASE_DTYPE_F32, nt, row}, vt = {v, BASE_DTYPE_F32, nt, row};
    rc = sc->be->ops->kv_append(sc->be, kv_pool_layer(sc->pool, 0), &kt, &vt, &batch->view, &err);
    if (rc) fprintf(stderr, "kv_append: %s\n", err.msg);
    for (int s = 0; s < n; s++) kv_seq_commit(sc->pool, rs[s]->seq);
    free(k);
    free(v);
    return rc;
}

/* Dense causal attention in double over the host copies, scaled, capped, windowed and with
 * sinks as `at` says. */
static inline void dense_ref(const scene *sc, ref_seq *const *rs, const be_paged_batch *b,
                             const float *q, float *out, be_attn at) {
    int d = sc->head_dim, row = scene_row(sc);
    int max_len = 1;
    for (int s = 0; s < b->n_seqs; s++) max_len = rs[s]->len > max_len ? rs[s]->len : max_len;
    double *p = malloc((size_t)max_len * sizeof(double));
    for (int s = 0; s < b->n_seqs; s++) {
        const ref_seq *r = rs[s];
        int q_len = b->q_indptr[s + 1] - b->q_indptr[s];
        for (int i = 0; i < q_len; i++) {
            int tok = b->q_indptr[s] + i;
            int visible = r->len - q_len + i + 1;
            for (int h = 0; h < sc->n_heads; h++) {
                int g = h / sc->group;
                const float *qh = q + ((size_t)tok * sc->n_heads + h) * d;
                double mx = -INFINITY, sum = 0;
                int lo = at.window > 0 && visible > at.window ? visible - at.window : 0;
                for (int t = 0; t < visible; t++) {
                    double dot = 0;
                    for (int j = 0; j < d; j++)
                        dot += (double)qh[j] * r->k[(size_t)t * row + (size_t)g * d + j];
                    p[t] = dot * at.scale;
                    if (at.softcap > 0) p[t] = tanh(p[t] / at.softcap) * at.softcap;
                    if (t < lo) p[t] = -INFINITY;
                    if (p[t] > mx) mx = p[t];
                }
                /* A sink: one more logit in the denominator (the CPU backend's memory is the
                 * host's, so the test reads the array it passed). */
                if (at.sinks && at.sinks[h] > mx) mx = at.sinks[h];
                if (at.sinks) sum = exp(at.sinks[h] - mx);
                for (int t = 0; t < visible; t++) sum += p[t] = exp(p[t] - mx);
                float *oh = out + ((size_t)tok * sc->n_heads + h) * d;
                for (int j = 0; j < d; j++) {
                    double acc = 0;
                    for (int t = 0; t < visible; t++)
                        acc += p[t] * r->v[(size_t)t * row + (size_t)g * d + j];
                    oh[j] = (float)(acc / sum);
                }
            }
        }
    }
    free(p);
}

static inline int scene_attend(const scene *sc, const be_paged_batch *b, const be_decode_plan *plan,
                               const float *q, float *out, be_attn at) {
    base_err err;
    int64_t cols = (int64_t)sc->n_heads * sc->head_dim;
    be_tensor qt = {(void *)q, BASE_DTYPE_F32, b->n_tokens, cols};
    be_tensor ot = {out, BASE_DTYPE_F32, b->n_tokens, cols};
    int rc = sc->be->ops->attention(sc->be, &qt, kv_pool_layer(sc->pool, 0), b, plan, sc->n_heads,
                                    at, &ot, &err);
    if (rc) fprintf(stderr, "attention: %s\n", err.msg);
    return rc;
}

#endif
