/* Sequences with known K/V for the pool tests: every token's K/V is a function of its prefix,
 * written through the pool's batch views and read back through the page tables. */
#ifndef MLXCEL_TESTS_KV_TEST_SEQ_H
#define MLXCEL_TESTS_KV_TEST_SEQ_H

#include "test.h"
#include "attn/attn.h"
#include "kv/kv.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static inline bool pool_ok(const kv_pool *pool, const char *after) {
    base_err err;
    int rc = kv_pool_check(pool, &err);
    CHECK_MSG(rc == 0, "after %s: %s", after, err.msg);
    return rc == 0;
}

/* K/V of the token at pos: a function of every token up to it, as in a real model, so that
 * recomputing a prefix gives the same bits as adopting it and a block adopted under another
 * prefix shows. Layer l adds 10 l so that each layer's copy is checked. */
static inline float kv_value(const int32_t *toks, int pos, int j, int layer, int side) {
    uint64_t h = base_hash64(BASE_HASH_SEED, toks, (size_t)(pos + 1) * sizeof(int32_t));
    return (float)(h % 1000) + 0.001f * (float)(pos % 997) + 0.0001f * (float)j + 10.0f * layer +
           100.0f * side;
}

/* The view a layer reads and writes: the local group's for a sliding-window layer. */
static inline const be_paged_batch *view_of(const kv_pool *pool, const kv_batch *b, int layer) {
    return kv_pool_layer_local(pool, layer) ? &b->local : &b->view;
}

/* Appends toks[start, start + n) to seq (which holds toks[0, start)) and writes their K/V in
 * every layer through its group's view. */
static inline int append_written(be_backend *be, kv_pool *pool, kv_seq *seq, const int32_t *all,
                                 int start, int n, base_err *err) {
    if (kv_seq_append(pool, seq, all + start, n, err)) return -1;
    kv_batch b;
    if (kv_batch_build(pool, &seq, &n, 1, &b, err)) return -1;
    const kv_geometry *g = kv_pool_geometry(pool);
    int row = g->n_kv_heads * g->head_dim;
    float *k = malloc((size_t)n * row * sizeof(float)),
          *v = malloc((size_t)n * row * sizeof(float));
    int rc = 0;
    for (int l = 0; l < g->n_layers && rc == 0; l++) {
        for (int i = 0; i < n; i++) {
            for (int j = 0; j < row; j++) {
                k[(size_t)i * row + j] = kv_value(all, b.view.positions[i], j, l, 0);
                v[(size_t)i * row + j] = kv_value(all, b.view.positions[i], j, l, 1);
            }
        }
        be_tensor kt = {k, BASE_DTYPE_F32, n, row}, vt = {v, BASE_DTYPE_F32, n, row};
        rc = be->ops->kv_append(be, kv_pool_layer(pool, l), &kt, &vt, view_of(pool, &b, l), err);
    }
    free(k);
    free(v);
    kv_batch_free(&b);
    return rc;
}

/* Reads the sequence back through each layer's view: a global layer must hold every token, a
 * local one every token from its first kept block, which must still cover the next token's
 * window; each token held must be the one written. */
static inline bool seq_content_ok(kv_pool *pool, kv_seq *seq, const int32_t *expect, int n) {
    if (kv_seq_len(seq) != n) return false;
    kv_batch b;
    int zero = 0;
    base_err err;
    if (kv_batch_build(pool, &seq, &zero, 1, &b, &err)) return false;
    const kv_geometry *g = kv_pool_geometry(pool);
    int bs = g->block_size;
    bool ok = true;
    for (int l = 0; l < g->n_layers && ok; l++) {
        const be_kv_layer *L = kv_pool_layer(pool, l);
        const be_paged_batch *v = view_of(pool, &b, l);
        int start = n - v->kv_len[0];
        if (kv_pool_layer_local(pool, l)) {
            int lo = n - g->window + 1;
            ok = start % bs == 0 && start <= (lo > 0 ? lo / bs * bs : 0);
        } else {
            ok = start == 0;
        }
        if (!ok) fprintf(stderr, "layer %d holds from %d of %d tokens\n", l, start, n);
        for (int t = start; t < n && ok; t++) {
            int32_t page = v->page_indices[(t - start) / bs];
            int head = g->n_kv_heads - 1, j = head * g->head_dim + 1;
            uint64_t off = kv_elem_offset(page, t % bs, head, bs, g->n_kv_heads, g->head_dim);
            ok = ((float *)L->k)[off + 1] == kv_value(expect, t, j, l, 0) &&
                 ((float *)L->v)[off + 1] == kv_value(expect, t, j, l, 1);
        }
    }
    kv_batch_free(&b);
    return ok;
}

enum { KV_TEST_MAX_LEN = 96 };

/* A sequence of a random run and the tokens it holds. */
typedef struct live_seq {
    kv_seq *seq;
    int32_t toks[KV_TEST_MAX_LEN];
    int len;
} live_seq;

static inline void live_fork(kv_pool *pool, live_seq *to, const live_seq *from) {
    to->seq = kv_seq_fork(pool, from->seq);
    memcpy(to->toks, from->toks, sizeof to->toks);
    to->len = from->len;
}

/* After each operation of a random run (mask: its hash mask, op: its index): commits the live
 * sequences when commit says so, then checks the pool's accounting and that every sequence's
 * K/V is still what was written. False ends the run. */
static inline bool live_check(kv_pool *pool, const live_seq *live, int n_live, bool commit,
                              uint64_t mask, int op) {
    if (commit) {
        for (int i = 0; i < n_live; i++) kv_seq_commit(pool, live[i].seq);
    }
    if (!pool_ok(pool, "an operation")) return false;
    bool content = true;
    for (int i = 0; i < n_live; i++)
        content &= seq_content_ok(pool, live[i].seq, live[i].toks, live[i].len);
    CHECK_MSG(content, "mask %llx, op %d: a sequence's K/V changed", (unsigned long long)mask, op);
    return content;
}

#endif
