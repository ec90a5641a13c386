/* kv: the paged KV pool (per-layer K and V slabs in backend memory, 64-bit element offsets),
 * the block allocator (free list, refcounts, copy-on-write), prefix hashes with LRU eviction,
 * per-sequence page tables packed into CSR batches, and the KV budget. Launches no kernels:
 * block copies for copy-on-write go through the backend's `copy`.
 *
 * Accounting invariant (kv_pool_check): referenced + cached + free == capacity. A block is
 * referenced while some sequence holds it, cached when no sequence holds it but it is in the
 * prefix cache, and free otherwise.
 *
 * Prefix cache contract: a block enters the cache only when it is full and its K/V are
 * written, which the pool learns from kv_seq_commit (call it after the step's kv_append has
 * run for every layer). Its key chains the parent block's key with the block's token ids;
 * adoption compares the tokens and the parent block too, so a key collision can only miss,
 * never match the wrong block. Cached blocks are evicted least recently released first, and
 * only when the free list is empty. A block that is shared or cached is never written: an
 * append into it first copies it (copy-on-write). */
#ifndef MLXCEL_KV_H
#define MLXCEL_KV_H

#include "backend/backend.h"

#define KV_DEFAULT_BLOCK_SIZE 32

/* Element offset of (block, slot, head) in a slab, widened before the first multiply. */
static inline uint64_t kv_elem_offset(int64_t block, int64_t slot, int64_t head, int64_t block_size,
                                      int64_t n_kv_heads, int64_t head_dim) {
    return ((uint64_t)block * (uint64_t)block_size + (uint64_t)slot) *
               ((uint64_t)n_kv_heads * (uint64_t)head_dim) +
           (uint64_t)head * (uint64_t)head_dim;
}

typedef struct kv_geometry {
    int n_layers;
    int n_kv_heads;
    int head_dim;
    int block_size;   /* tokens per block */
    base_dtype dtype; /* F16, BF16 (F32 on the CPU) */
} kv_geometry;

typedef struct kv_pool kv_pool;
typedef struct kv_seq kv_seq;

/* Allocates num_blocks (1 .. INT32_MAX, as page ids are int32) blocks per layer and side in
 * backend memory, one allocation per layer and side; their contents start undefined. The
 * pool keeps `be` (which must outlive it) and owns the slabs; kv_pool_destroy frees all. */
int kv_pool_create(be_backend *be, const kv_geometry *geom, int64_t num_blocks, kv_pool **out,
                   base_err *err);
void kv_pool_destroy(kv_pool *pool);
const kv_geometry *kv_pool_geometry(const kv_pool *pool);
const be_kv_layer *kv_pool_layer(const kv_pool *pool, int layer);

typedef struct kv_pool_stats {
    int64_t capacity, free, cached, referenced;
} kv_pool_stats;
kv_pool_stats kv_pool_get_stats(const kv_pool *pool);
/* Drops every cached block (held by no sequence) from the prefix cache to the free list;
 * returns how many. Blocks that sequences hold stay adoptable. */
int64_t kv_pool_drop_cached(kv_pool *pool);
/* Recounts everything from scratch; -1 with a message when the invariant is broken. */
int kv_pool_check(const kv_pool *pool, base_err *err);
/* Test hook: every prefix key is ANDed with mask before it is stored or looked up (0 makes
 * every key collide). Set it before the first commit. */
void kv_pool_set_hash_mask(kv_pool *pool, uint64_t mask);

/* An empty sequence; freed with kv_seq_free before the pool is destroyed. */
kv_seq *kv_seq_create(kv_pool *pool);
/* Drops the sequence's references and frees it; its committed full blocks stay in the prefix
 * cache, the others return to the free list. */
void kv_seq_free(kv_pool *pool, kv_seq *seq);
int kv_seq_len(const kv_seq *seq);
/* Marks the sequence's K/V as written through its current length: its full blocks become
 * adoptable through the prefix cache. */
void kv_seq_commit(kv_pool *pool, kv_seq *seq);

/* On an empty sequence, adopts the longest chain of cached full blocks matching a prefix of tokens
 * (tokens are compared, so a hash collision never changes output). Returns the tokens adopted, a
 * multiple of the block size, at most n - 1 so that one token is always left to compute. */
int kv_seq_adopt_prefix(kv_pool *pool, kv_seq *seq, const int32_t *tokens, int n);
/* Reserves room for n more tokens (with their ids, for prefix hashing): allocates blocks and
 * copies a shared last block before writing into it. All or nothing: when blocks run out it
 * returns -1, changes nothing, and err says how many blocks were needed and free. */
int kv_seq_append(kv_pool *pool, kv_seq *seq, const int32_t *tokens, int n, base_err *err);
/* Keeps the first new_len tokens (e.g. drops a rejected continuation); blocks past them are
 * released. */
void kv_seq_truncate(kv_pool *pool, kv_seq *seq, int new_len);
/* A new sequence sharing all blocks of seq (refcounts up; copy-on-write later). */
kv_seq *kv_seq_fork(kv_pool *pool, const kv_seq *seq);

/* One step's host-side CSR batch: the sequences and how many of their last tokens are
 * computed in this step (appended already). `view` points into arrays the batch owns;
 * first_page_offset is NULL (pages start at their first slot: no sliding windows yet), slots are
 * page * block_size + slot and positions kv_len - q_len + i. */
typedef struct kv_batch {
    be_paged_batch view;
    void *storage; /* owned */
} kv_batch;

int kv_batch_build(const kv_pool *pool, kv_seq *const *seqs, const int *q_lens, int n_seqs,
                   kv_batch *out, base_err *err);
void kv_batch_free(kv_batch *batch);

/* ---- KV budget: pure functions, saturating everywhere ---- */

#define KV_BUDGET_AUTO_FRACTION 0.9

/* K and V bytes of one block over all layers. */
uint64_t kv_bytes_per_block(const kv_geometry *geom);
/* Bytes kept back from the KV budget for the v2 decode workspace (attn_workspace_bytes for
 * the model's heads, at most max_seqs decode rows of max_context tokens, device target). */
uint64_t kv_decode_reserve_bytes(const kv_geometry *geom, int n_heads, int max_seqs,
                                 int64_t max_context, int target);
/* (budget - reserve) / bytes_per_block, 0 when the budget is below the reserve or a block
 * has no bytes, at most INT32_MAX (page ids are int32). */
int64_t kv_budget_blocks(uint64_t budget, uint64_t reserve, uint64_t bytes_per_block);
/* The `auto` budget: fraction of free device memory, minus the weights and the activations
 * still to be allocated; 0 when they do not fit. fraction outside (0, 1] is treated as 0. */
uint64_t kv_budget_auto(uint64_t free_bytes, double fraction, uint64_t weight_bytes,
                        uint64_t activation_bytes);

typedef struct kv_budget_spec {
    bool is_auto;
    uint64_t bytes; /* when !is_auto */
} kv_budget_spec;

/* Parses BYTES|auto: plain digits with an optional suffix K, M, G, T (powers of 1000) or Ki,
 * Mi, Gi, Ti (powers of 1024), e.g. 512Mi. Errors name `flag`. */
int kv_budget_parse(const char *flag, const char *text, kv_budget_spec *out, base_err *err);

#endif
