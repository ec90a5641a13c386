/* kv: the paged KV pool (per-layer K and V slabs in backend memory, 64-bit element offsets),
 * the block allocator (free list, refcounts, copy-on-write), prefix hashes with LRU eviction,
 * per-sequence page tables packed into CSR batches, and the KV budget. Launches no kernels:
 * block copies for copy-on-write go through the backend's `copy`.
 *
 * Layer groups. A model with sliding-window ("local") layers splits the pool in two groups,
 * each its own block space with its own slabs: the global group (every other layer) keeps a
 * sequence's whole context; the local group keeps only the blocks that some future query of
 * the sequence can still see. A query at position p sees keys p - window + 1 .. p, so once a
 * step starts at position p0 (its first new token), the local blocks wholly before
 * p0 - window + 1 are released (kv_seq_append does it, before it takes new blocks). A sequence
 * holds one page list per group, indexed alike by block of the sequence: the global list from
 * block 0, the local one from its first kept block. kv_batch_build gives each group its view:
 * the local view's pages start at that block and its kv_len counts from there, so attention's
 * relative window sees the same keys, while positions stay absolute for RoPE. Both views share
 * q_indptr and positions. A long context then costs about n_global * ctx + n_local *
 * (window + step) tokens of K/V instead of n_layers * ctx. The global group always exists,
 * even with no layers (every layer local): its blocks then have no slabs and keep only the
 * token ids and prefix keys that adoption matches.
 *
 * Accounting invariant (kv_pool_check, each group): referenced + cached + free == capacity. A
 * block is referenced while some sequence holds it, cached when no sequence holds it but it is
 * in the prefix cache, and free otherwise.
 *
 * Prefix cache contract: a global block enters the cache only when it is full and its K/V are
 * written, which the pool learns from kv_seq_commit (call it after the step's kv_append has
 * run for every layer). Its key chains the parent block's key with the block's token ids;
 * adoption compares the tokens and the parent block too, so a key collision can only miss,
 * never match the wrong block. A full local block the committing sequence still holds is
 * attached to the global block of the same index: its K/V are a function of that block's
 * exact chain. Adoption takes a chain of global blocks and, for the blocks the window of its
 * first computed token needs, their attached local blocks; it adopts the longest chain whose
 * needed local blocks are all attached. Evicting a global block frees its attached local
 * block; evicting a local block only detaches it. Cached blocks are evicted least recently
 * released first, and only when the free list is empty. A block that is shared or cached is
 * never written: an append into it first copies it (copy-on-write). */
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
    int block_size;          /* tokens per block */
    base_dtype dtype;        /* F16, BF16 (F32 on the CPU) */
    int window;              /* local layers' window in tokens; 0 = no local group */
    const bool *layer_local; /* (n_layers) which layers are local, or NULL (none); read by
                                kv_pool_create and the budget functions, not kept */
} kv_geometry;

/* Local layers in the geometry (0 when window is 0 or layer_local is NULL). */
int kv_geometry_local_layers(const kv_geometry *geom);
/* Blocks of one sequence that the local group holds at most in a step of up to q_len new
 * tokens: those of the window before the step's first token and of the step itself. */
int64_t kv_local_blocks_per_step(const kv_geometry *geom, int q_len);

typedef struct kv_pool kv_pool;
typedef struct kv_seq kv_seq;

/* Allocates num_blocks global and num_local_blocks local blocks (each 1 .. INT32_MAX, as page
 * ids are int32; num_local_blocks 0 exactly when the geometry has no local layers) per layer
 * and side in backend memory, one allocation per layer and side; their contents start
 * undefined. The pool keeps `be` (which must outlive it) and owns the slabs; kv_pool_destroy
 * frees all. The returned geometry keeps the window but not layer_local (kv_pool_layer_local
 * answers it). */
int kv_pool_create(be_backend *be, const kv_geometry *geom, int64_t num_blocks,
                   int64_t num_local_blocks, kv_pool **out, base_err *err);
void kv_pool_destroy(kv_pool *pool);
const kv_geometry *kv_pool_geometry(const kv_pool *pool);
const be_kv_layer *kv_pool_layer(const kv_pool *pool, int layer);
/* Whether the layer belongs to the local group (its slabs and the batch's `local` view). */
bool kv_pool_layer_local(const kv_pool *pool, int layer);
/* Whether the pool has a local group. */
bool kv_pool_has_local(const kv_pool *pool);

typedef struct kv_pool_stats {
    int64_t capacity, free, cached, referenced;
} kv_pool_stats;
/* The global group's blocks. */
kv_pool_stats kv_pool_get_stats(const kv_pool *pool);
/* The local group's blocks (all zero without one). */
kv_pool_stats kv_pool_get_local_stats(const kv_pool *pool);
/* Drops every cached block (held by no sequence) of both groups from the prefix cache to the
 * free list; returns how many global ones (each a block of tokens). Blocks that sequences hold
 * stay adoptable. */
int64_t kv_pool_drop_cached(kv_pool *pool);
/* Recounts everything from scratch, both groups and the attachments between them; -1 with a
 * message when an invariant is broken. */
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
 * (tokens are compared, so a hash collision never changes output) whose local blocks, where
 * the first token left to compute needs them, are cached too. Returns the tokens adopted, a
 * multiple of the block size, at most n - 1 so that one token is always left to compute. */
int kv_seq_adopt_prefix(kv_pool *pool, kv_seq *seq, const int32_t *tokens, int n);
/* Reserves room for n more tokens (with their ids, for prefix hashing): releases the local
 * blocks wholly outside the window of the first new token, allocates blocks in both groups and
 * copies a shared last block before writing into it. All or nothing: when blocks run out it
 * returns -1, changes nothing, and err says which group and how many blocks were needed and
 * free (a backend copy that fails leaves the length unchanged, the released local blocks
 * released). */
int kv_seq_append(kv_pool *pool, kv_seq *seq, const int32_t *tokens, int n, base_err *err);
/* Keeps the first new_len tokens (e.g. drops a rejected continuation); blocks past them are
 * released. With local layers it fails (-1, nothing changed) when the window of the token at
 * new_len reaches local blocks already released: a sequence can go back to the start of its
 * last append, not before its window. */
int kv_seq_truncate(kv_pool *pool, kv_seq *seq, int new_len, base_err *err);
/* A new sequence sharing all blocks of seq (refcounts up; copy-on-write later). */
kv_seq *kv_seq_fork(kv_pool *pool, const kv_seq *seq);

/* One step's host-side CSR batch: the sequences and how many of their last tokens are
 * computed in this step (appended already). `view` (the global group) and `local` (the local
 * group, when the pool has one; zeroed otherwise) point into arrays the batch owns and share
 * q_indptr and positions; first_page_offset is NULL in both (a view's pages start at their
 * first slot), slots are page * block_size + slot of the view's group and positions the
 * absolute len - q_len + i. It fails when a sequence's first computed token needs local blocks
 * it has released (q_len reaching back past its last append). */
typedef struct kv_batch {
    be_paged_batch view;
    be_paged_batch local;
    void *storage; /* owned */
} kv_batch;

int kv_batch_build(const kv_pool *pool, kv_seq *const *seqs, const int *q_lens, int n_seqs,
                   kv_batch *out, base_err *err);
void kv_batch_free(kv_batch *batch);

/* ---- KV budget: pure functions, saturating everywhere ---- */

#define KV_BUDGET_AUTO_FRACTION 0.9

/* K and V bytes of one block over all layers. */
uint64_t kv_bytes_per_block(const kv_geometry *geom);
/* K and V bytes of one block over the layers of one group (local or global). */
uint64_t kv_group_bytes_per_block(const kv_geometry *geom, bool local);

/* Local blocks one sequence of ctx tokens needs at most, computing up to step tokens at a time
 * (step <= 0: the whole context at once): kv_local_blocks_per_step plus a copy-on-write spare,
 * at most the context's blocks plus that spare; 0 without local layers. */
int64_t kv_local_blocks_per_seq(const kv_geometry *geom, int64_t ctx, int step);
/* How a budget splits between the groups for n_seqs sequences of ctx tokens, each computing
 * up to step tokens at a time: the local group gets exactly what the sequences' windows need
 * (n_seqs x kv_local_blocks_per_seq, or what the budget buys if less), the global group what
 * the budget buys after that and the reserve. With no global layers its blocks cost nothing: it
 * gets n_seqs contexts (and a spare each), the local group the whole budget. Without local layers:
 * all blocks are global. */
typedef struct kv_group_split {
    int64_t global_blocks, local_blocks;
} kv_group_split;
kv_group_split kv_budget_split(const kv_geometry *geom, uint64_t budget, uint64_t reserve,
                               int n_seqs, int64_t ctx, int step);
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
