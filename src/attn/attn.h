/* attn: the paged decode plan (v1 or v2, chunking from the device's target parallelism,
 * workspace sizes, validation) and the CPU attention kernels through the pages: prefill with
 * a causal mask, decode v1, decode v2 with its merge, and the gather fallback.
 *
 * Batch contract (on top of backend.h): the pages of sequence s hold its kv_len[s] tokens in
 * order, starting first_page_offset[s] slots into its first page (0 when the array is NULL),
 * so kv_len[s] == (pages - 1) * block_size + last_page_len[s] - first_page_offset[s]. Its
 * q_len = q_indptr[s+1] - q_indptr[s] rows are its last q_len tokens; row i sees the kv
 * tokens [0, kv_len - q_len + i]. q_len == 1 rows are decode rows and follow the plan; the
 * others take the prefill path.
 *
 * v2 workspace (F32, decode rows numbered 0..n_decode-1 in batch order):
 *   partial [n_decode, max_chunks, n_heads, head_dim] outputs, each normalized over its chunk
 *   lse     [n_decode, max_chunks, n_heads] log-sum-exp of the chunk's scaled scores
 * Chunk c of a sequence covers its pages [c * pages_per_chunk, (c + 1) * pages_per_chunk). */
#ifndef MLXCEL_ATTN_H
#define MLXCEL_ATTN_H

#include "backend/backend.h"

/* CUDA's limit on grid y and z, which carry chunks and sequences. */
#define ATTN_GRID_YZ_MAX  65535
#define ATTN_MAX_HEAD_DIM 512

/* The decode target: MLXCEL_PAGED_DECODE_V2_TARGET_CTAS when set to a positive integer,
 * else be->target_parallelism (at least 1). */
int attn_decode_target(const be_backend *be);

/* Bytes of v2 workspace for n_decode rows and max_chunks chunks (saturating). */
uint64_t attn_v2_bytes(int64_t n_decode, int64_t max_chunks, int n_heads, int head_dim);

/* The v2 workspace the largest plan attn_plan_decode can make for these limits: every decode
 * row count up to max_seqs and every context up to max_context tokens, with the given
 * target. Exact for the real GQA geometry, not a worst-case multiple; 0 when every such
 * plan is v1. */
uint64_t attn_workspace_bytes(int n_heads, int n_kv_heads, int head_dim, int block_size,
                              int max_seqs, int64_t max_context, int target);

/* The chunking's wave model, fitted to H200 measurements of the Llama-3.1-8B decode shapes
 * (bench_attention's chunk sweep): `target` CTAs (rows x kv heads x chunks) run at once, a
 * wave; a CTA costs its pages plus ATTN_PLAN_CTA_PAGES (its start and end); a full wave costs
 * one CTA's time, a last wave of rest CTAs that times max(rest / target, 1 / ATTN_PLAN_SOLO),
 * as the CTAs of a partial wave run at most ATTN_PLAN_SOLO times as fast as in a full one
 * (each is bounded by the bytes it keeps in flight); a split costs ATTN_PLAN_V2_COST times
 * that, for the merge and the workspace traffic. Chunkings past ATTN_PLAN_WAVES waves, or
 * within ATTN_PLAN_SLACK of a chunking with fewer chunks, gain too little for their workspace
 * and merge. No split makes chunks of fewer than ATTN_PLAN_MIN_PAGES pages: a CTA's fixed
 * latency (its batch arrays, q, the first copies, its epilogue) and the merge outweigh what
 * so short a chunk saves, which the wave model does not see when the grid is far from a wave.
 * H200, batch-1 decode of the Llama-3.1-8B shape (blocks of 32, contexts 512 to 640, the
 * decode step's tok/s): 8 CTAs of v1 486.1, 2 chunks of 16 pages 468.9, 4 of 8 459.5, 32 of 1
 * 460.5; at contexts of 64 and 1024 to 1152, v1 also beat one-page chunks by 4-5%. The
 * large-batch shapes' chunks are 43 pages and more, so they keep their plans. */
#define ATTN_PLAN_SOLO      1.25
#define ATTN_PLAN_CTA_PAGES 2
#define ATTN_PLAN_V2_COST   1.05
#define ATTN_PLAN_WAVES     4
#define ATTN_PLAN_SLACK     1.02
#define ATTN_PLAN_MIN_PAGES 32

/* Picks the decode path for the batch's decode rows. Candidates: one chunk (v1) and, for w =
 * 1 to ATTN_PLAN_WAVES, the most chunks whose CTAs fit in w waves and whose chunks hold
 * ATTN_PLAN_MIN_PAGES pages or more; the plan is the candidate
 * of fewest chunks whose modelled time is within ATTN_PLAN_SLACK times the least; v2 when
 * that is more than one chunk, within ATTN_GRID_YZ_MAX chunks and the workspace. Environment:
 * MLXCEL_PAGED_ATTENTION_NATIVE=0 forces gather, =1 forces v2. `batch` is host memory;
 * `workspace` is kept in the plan, not owned. */
void attn_plan_decode(const be_paged_batch *batch, int block_size, int n_heads, int n_kv_heads,
                      int head_dim, int target, void *workspace, uint64_t workspace_bytes,
                      be_decode_plan *out);

/* The same choice for n_decode decode rows whose longest has max_pages pages. A plan made for
 * more pages than a batch has serves that batch too (its chunks past a row's pages are
 * empty), which lets one plan, and one recorded decode step, cover a range of lengths. */
void attn_plan_decode_pages(int64_t n_decode, int64_t max_pages, int n_heads, int n_kv_heads,
                            int head_dim, int target, void *workspace, uint64_t workspace_bytes,
                            be_decode_plan *out);

/* Whether a v2 plan's chunks cover every decode row of a batch known only by its host
 * scalars (a backend that cannot read the page table): max_kv_len tokens span at most
 * ceil(max_kv_len / block_size) pages, one more when first-page offsets may be nonzero. A
 * plan from attn_plan_decode_pages for the batch's pages covers it when the offsets are NULL. */
bool attn_plan_covers(const be_decode_plan *plan, const be_paged_batch *batch, int block_size);

/* Checks that the batch arrays are consistent with each other and with the layer: indptrs
 * start at 0 and never decrease, every page id is inside the pool, every kv_len matches its
 * pages, every q_len is at most its kv_len, slots are inside the pool. */
int attn_batch_check(const be_paged_batch *batch, const be_kv_layer *layer, base_err *err);

/* Checks a plan against the batch it is for: the kind, GQA divisibility, head_dim, grid
 * limits (chunks and sequences at most ATTN_GRID_YZ_MAX), max_chunks covering the longest
 * decode row, and the workspace bound. A rejected plan is served by the gather path. */
int attn_plan_validate(const be_decode_plan *plan, const be_paged_batch *batch,
                       const be_kv_layer *layer, int n_heads, base_err *err);

/* CPU kernels. k, v, q, out are host F32 tensors; the pool is host memory; `pool` runs the
 * work. */

/* Writes k, v [n_tokens, n_kv_heads * head_dim] into the layer at batch->slots, converted
 * to the pool dtype. */
int attn_cpu_kv_append(base_pool *pool, const be_kv_layer *layer, const be_tensor *k,
                       const be_tensor *v, const be_paged_batch *batch, base_err *err);

/* out [n_tokens, n_heads * head_dim] = softmax(cap(q K^T * scale), causal, windowed) V for
 * every row, as `attn` says (backend.h). Decode
 * rows follow `plan` (NULL means v1); a plan that attn_plan_validate rejects falls back to
 * gather. Prefill rows run one work item per (row, kv head), decode v1 and gather one per
 * (sequence, kv head), v2 one per (sequence, kv head, chunk) and then the merge. */
int attn_cpu_attention(base_pool *pool, const be_tensor *q, const be_kv_layer *layer,
                       const be_paged_batch *batch, const be_decode_plan *plan, int n_heads,
                       be_attn attn, be_tensor *out, base_err *err);

#endif
