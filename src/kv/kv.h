/* kv: the paged KV pool (per-layer K and V slabs in backend memory, 64-bit element offsets),
 * the block allocator (free list, refcounts, copy-on-write), prefix hashes with LRU eviction,
 * per-sequence page tables packed into CSR batches, and the KV budget. Launches no kernels:
 * block copies for copy-on-write go through the backend's `copy`.
 *
 * Accounting invariant (kv_pool_check): referenced + cached + free == capacity. */
#ifndef MLXCEL_KV_H
#define MLXCEL_KV_H

#include "backend/backend.h"

#define KV_DEFAULT_BLOCK_SIZE 32

typedef struct kv_geometry {
    int n_layers;
    int n_kv_heads;
    int head_dim;
    int block_size;   /* tokens per block */
    base_dtype dtype; /* F16, BF16 (F32 on the CPU) */
} kv_geometry;

typedef struct kv_pool kv_pool;
typedef struct kv_seq kv_seq;

/* Allocates num_blocks blocks per layer and side in backend memory. The pool keeps `be`. */
int kv_pool_create(be_backend *be, const kv_geometry *geom, int64_t num_blocks, kv_pool **out,
                   base_err *err);
void kv_pool_destroy(kv_pool *pool);
const kv_geometry *kv_pool_geometry(const kv_pool *pool);
const be_kv_layer *kv_pool_layer(const kv_pool *pool, int layer);
int64_t kv_pool_capacity(const kv_pool *pool);

typedef struct kv_pool_stats {
    int64_t capacity, free, cached, referenced;
} kv_pool_stats;
kv_pool_stats kv_pool_get_stats(const kv_pool *pool);
/* Recounts everything from scratch; -1 with a message when the invariant is broken. */
int kv_pool_check(const kv_pool *pool, base_err *err);

kv_seq *kv_seq_create(kv_pool *pool);
/* Drops the sequence's references; its full blocks stay in the prefix cache. */
void kv_seq_free(kv_pool *pool, kv_seq *seq);
int kv_seq_len(const kv_seq *seq);

/* Adopts the longest chain of cached full blocks matching a prefix of tokens (tokens are
 * compared, so a hash collision never changes output). Returns the tokens adopted, a
 * multiple of the block size, at most n - 1 so that one token is always left to compute. */
int kv_seq_adopt_prefix(kv_pool *pool, kv_seq *seq, const int32_t *tokens, int n);
/* Reserves room for n more tokens (with their ids, for prefix hashing): allocates blocks and
 * copies a shared last block before writing into it. All or nothing: when blocks run out it
 * returns -1, changes nothing, and err says how many blocks were needed and free. */
int kv_seq_append(kv_pool *pool, kv_seq *seq, const int32_t *tokens, int n, base_err *err);
/* Removes the last n tokens (e.g. a rejected continuation). */
void kv_seq_truncate(kv_pool *pool, kv_seq *seq, int new_len);
/* A new sequence sharing all blocks of seq (refcounts up; copy-on-write later). */
kv_seq *kv_seq_fork(kv_pool *pool, const kv_seq *seq);

/* One step's host-side CSR batch: the sequences and how many of their last tokens are
 * computed in this step (appended already). `view` points into arrays the batch owns. */
typedef struct kv_batch {
    be_paged_batch view;
    int max_kv_len;
    int max_q_len;
    void *storage; /* owned */
} kv_batch;

int kv_batch_build(const kv_pool *pool, kv_seq *const *seqs, const int *q_lens, int n_seqs,
                   kv_batch *out, base_err *err);
void kv_batch_free(kv_batch *batch);

#endif
