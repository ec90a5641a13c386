/* The paged decode plan. v1 gives one work item per (decode row, kv head) and reads every
 * page once; v2 splits each sequence's pages into chunks, at the price of a workspace and a
 * merge, so that chunks x kv heads x rows fills the device's waves: a few rows leave most of
 * the device idle under v1, and a CTA count just past a whole number of waves leaves the
 * last wave nearly empty for a whole CTA's time. */
#include "attn/attn.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int64_t div_ceil(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

int attn_decode_target(const be_backend *be) {
    const char *env = getenv("MLXCEL_PAGED_DECODE_V2_TARGET_CTAS");
    if (env && *env) {
        char *end = NULL;
        long v = strtol(env, &end, 10);
        if (*end == '\0' && v > 0 && v <= INT32_MAX) return (int)v;
    }
    return be && be->target_parallelism > 0 ? be->target_parallelism : 1;
}

uint64_t attn_v2_bytes(int64_t n_decode, int64_t max_chunks, int n_heads, int head_dim) {
    if (n_decode <= 0 || max_chunks <= 0 || n_heads <= 0 || head_dim <= 0) return 0;
    /* partial outputs (head_dim floats) and one LSE per (row, chunk, head) */
    uint64_t per = base_sat_mul_u64((uint64_t)head_dim + 1, sizeof(float));
    uint64_t n = base_sat_mul_u64((uint64_t)n_decode, (uint64_t)max_chunks);
    return base_sat_mul_u64(base_sat_mul_u64(n, (uint64_t)n_heads), per);
}

/* Modelled time (attn.h) of `chunks` chunks of ppc pages for `items` (row, kv head) pairs: a
 * CTA's time (ppc + ATTN_PLAN_CTA_PAGES) per full wave, and that times max(rest / target,
 * 1 / ATTN_PLAN_SOLO) for a last wave of rest CTAs, since a CTA running nearly alone is
 * bounded by the bytes it keeps in flight, not by the device's bandwidth; times
 * ATTN_PLAN_V2_COST for a split. */
static double plan_time(int64_t items, int64_t chunks, int64_t ppc, int target) {
    double ctas = (double)items * (double)chunks;
    double full = floor(ctas / target), rest = ctas - full * target;
    double last = rest > 0 ? fmax(rest / target, 1.0 / ATTN_PLAN_SOLO) : 0.0;
    double t = (double)(ppc + ATTN_PLAN_CTA_PAGES) * (full + last);
    return chunks > 1 ? t * ATTN_PLAN_V2_COST : t;
}

/* The candidate chunking for w waves (w = 0: one chunk): the most chunks whose CTAs fit in w
 * waves, of ATTN_PLAN_MIN_PAGES pages or more, within the grid limit. Returns the chunk count,
 * 0 when w waves hold no split. */
static int64_t wave_chunks(int64_t items, int64_t max_pages, int target, int64_t w, int64_t *ppc) {
    if (w == 0) {
        *ppc = max_pages;
        return 1;
    }
    int64_t c = w * target / items;
    if (c > max_pages / ATTN_PLAN_MIN_PAGES) c = max_pages / ATTN_PLAN_MIN_PAGES;
    if (c < 2) return 0;
    *ppc = div_ceil(max_pages, c);
    int64_t ppc_min = div_ceil(max_pages, ATTN_GRID_YZ_MAX);
    if (*ppc < ppc_min) *ppc = ppc_min;
    return div_ceil(max_pages, *ppc);
}

/* The v2 chunking for n_decode rows whose longest has max_pages pages (attn.h). Returns the
 * chunk count; 1 means v2 would not split anything. */
static int64_t plan_chunks(int64_t n_decode, int n_kv_heads, int64_t max_pages, int target,
                           int64_t *pages_per_chunk) {
    const int64_t items = n_decode * n_kv_heads;
    int64_t chunks[ATTN_PLAN_WAVES + 1], ppc[ATTN_PLAN_WAVES + 1];
    double time[ATTN_PLAN_WAVES + 1], best = INFINITY;
    for (int w = 0; w <= ATTN_PLAN_WAVES; w++) {
        chunks[w] = wave_chunks(items, max_pages, target, w, &ppc[w]);
        time[w] = chunks[w] ? plan_time(items, chunks[w], ppc[w], target) : INFINITY;
        best = fmin(best, time[w]);
    }
    /* The candidates come in order of chunk count: the first within the slack has fewest
     * (w = 0, one chunk, always is a candidate). */
    int w = 0;
    while (time[w] > best * ATTN_PLAN_SLACK) w++;
    *pages_per_chunk = ppc[w];
    return chunks[w];
}

uint64_t attn_workspace_bytes(int n_heads, int n_kv_heads, int head_dim, int block_size,
                              int max_seqs, int64_t max_context, int target) {
    if (n_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0 || block_size <= 0 || max_seqs <= 0 ||
        max_context <= 0 || target <= 0)
        return 0;
    int64_t max_pages = div_ceil(max_context, block_size);
    uint64_t best = 0;
    for (int64_t n = 1; n <= max_seqs; n++) {
        /* No plan for n rows has more chunks than fit in ATTN_PLAN_WAVES waves, nor more
         * than chunks of ATTN_PLAN_MIN_PAGES pages, nor more than the grid holds; from the
         * row count whose waves hold no second chunk on, all v1. */
        int64_t bound = (int64_t)ATTN_PLAN_WAVES * target / (n * n_kv_heads);
        if (bound > max_pages / ATTN_PLAN_MIN_PAGES) bound = max_pages / ATTN_PLAN_MIN_PAGES;
        if (bound > ATTN_GRID_YZ_MAX) bound = ATTN_GRID_YZ_MAX;
        if (bound < 2) break;
        int64_t most = 0;
        for (int64_t pages = max_pages; pages / ATTN_PLAN_MIN_PAGES > most && most < bound;
             pages--) {
            int64_t ppc;
            int64_t chunks = plan_chunks(n, n_kv_heads, pages, target, &ppc);
            if (chunks > most) most = chunks;
        }
        if (most < 2) continue;
        uint64_t bytes = attn_v2_bytes(n, most, n_heads, head_dim);
        if (bytes > best) best = bytes;
    }
    return best;
}

/* -1 unset, else the value 0 or 1 */
static int native_env(void) {
    const char *env = getenv("MLXCEL_PAGED_ATTENTION_NATIVE");
    if (env && strcmp(env, "0") == 0) return 0;
    if (env && strcmp(env, "1") == 0) return 1;
    return -1;
}

void attn_plan_decode_pages(int64_t n_decode, int64_t max_pages, int n_heads, int n_kv_heads,
                            int head_dim, int target, void *workspace, uint64_t workspace_bytes,
                            be_decode_plan *out) {
    memset(out, 0, sizeof *out);
    out->workspace = workspace;
    out->workspace_bytes = workspace_bytes;
    int native = native_env();
    if (native == 0) {
        out->kind = BE_DECODE_GATHER;
        return;
    }
    out->kind = BE_DECODE_V1;
    if (n_decode <= 0 || max_pages <= 0 || n_kv_heads <= 0 || target <= 0) return;
    int64_t ppc;
    int64_t chunks = plan_chunks(n_decode, n_kv_heads, max_pages, target, &ppc);
    uint64_t per_chunk = attn_v2_bytes(n_decode, 1, n_heads, head_dim);
    int64_t fit = per_chunk ? (int64_t)(workspace_bytes / per_chunk) : 0;
    if (chunks > fit && fit >= 1) {
        ppc = div_ceil(max_pages, fit);
        chunks = div_ceil(max_pages, ppc);
    }
    /* A single chunk is v1 with extra work, unless v2 was asked for; a plan that does not
     * fit the workspace is then rejected by validation and served by gather. */
    if (native != 1 && (chunks < 2 || fit < 2)) return;
    out->kind = BE_DECODE_V2;
    out->pages_per_chunk = (int)(ppc < INT32_MAX ? ppc : INT32_MAX);
    out->max_chunks = (int)chunks;
}

void attn_plan_decode(const be_paged_batch *batch, int block_size, int n_heads, int n_kv_heads,
                      int head_dim, int target, void *workspace, uint64_t workspace_bytes,
                      be_decode_plan *out) {
    int64_t n_decode = 0, max_pages = 0;
    for (int s = 0; s < batch->n_seqs; s++) {
        if (batch->q_indptr[s + 1] - batch->q_indptr[s] != 1) continue;
        n_decode++;
        int64_t pages = batch->page_indptr[s + 1] - batch->page_indptr[s];
        if (pages > max_pages) max_pages = pages;
    }
    attn_plan_decode_pages(n_decode, max_pages, n_heads, n_kv_heads, head_dim, target, workspace,
                           workspace_bytes, out);
}

int attn_batch_check(const be_paged_batch *b, const be_kv_layer *layer, base_err *err) {
    if (b->n_seqs < 0 || b->n_tokens < 0)
        return base_fail(err, "paged batch: negative n_seqs %d or n_tokens %d", b->n_seqs,
                         b->n_tokens);
    if (!b->q_indptr || !b->kv_len || !b->page_indptr || !b->last_page_len ||
        (!b->page_indices && b->n_seqs > 0))
        return base_fail(err, "paged batch: a required array is NULL");
    if (b->q_indptr[0] != 0 || b->page_indptr[0] != 0)
        return base_fail(err, "paged batch: q_indptr[0] and page_indptr[0] must be 0");
    if (b->q_indptr[b->n_seqs] != b->n_tokens)
        return base_fail(err, "paged batch: q_indptr[n_seqs] = %d, n_tokens = %d",
                         b->q_indptr[b->n_seqs], b->n_tokens);
    int64_t bs = layer->block_size;
    for (int s = 0; s < b->n_seqs; s++) {
        int64_t q_len = (int64_t)b->q_indptr[s + 1] - b->q_indptr[s];
        int64_t pages = (int64_t)b->page_indptr[s + 1] - b->page_indptr[s];
        if (q_len < 0 || pages < 0)
            return base_fail(err, "paged batch: q_indptr or page_indptr decreases at %d", s);
        int64_t first = b->first_page_offset ? b->first_page_offset[s] : 0;
        int64_t last = b->last_page_len[s];
        int64_t held = 0;
        if (pages > 0) {
            if (last < 1 || last > bs || first < 0 || first >= bs || (pages == 1 && first >= last))
                return base_fail(err,
                                 "paged batch: sequence %d: last_page_len %lld or "
                                 "first_page_offset %lld out of range for block size %lld",
                                 s, (long long)last, (long long)first, (long long)bs);
            held = (pages - 1) * bs + last - first;
        }
        if (b->kv_len[s] != held || q_len > held)
            return base_fail(err,
                             "paged batch: sequence %d: kv_len %d, pages hold %lld, q_len %lld", s,
                             b->kv_len[s], (long long)held, (long long)q_len);
        for (int64_t p = b->page_indptr[s]; p < b->page_indptr[s + 1]; p++) {
            if (b->page_indices[p] < 0 || b->page_indices[p] >= layer->num_blocks)
                return base_fail(err, "paged batch: page_indices[%lld] = %d outside %lld blocks",
                                 (long long)p, b->page_indices[p], (long long)layer->num_blocks);
        }
    }
    if (b->slots) {
        int64_t n_slots = layer->num_blocks * bs;
        for (int t = 0; t < b->n_tokens; t++) {
            if (b->slots[t] < 0 || b->slots[t] >= n_slots)
                return base_fail(err, "paged batch: slots[%d] = %lld outside the pool", t,
                                 (long long)b->slots[t]);
        }
    }
    return 0;
}

bool attn_plan_covers(const be_decode_plan *plan, const be_paged_batch *batch, int block_size) {
    if (!plan || plan->pages_per_chunk < 1 || plan->max_chunks < 1 || block_size < 1) return false;
    int64_t span = (int64_t)batch->max_kv_len + (batch->first_page_offset ? block_size - 1 : 0);
    return (int64_t)plan->max_chunks * plan->pages_per_chunk >= div_ceil(span, block_size);
}

int attn_plan_validate(const be_decode_plan *plan, const be_paged_batch *batch,
                       const be_kv_layer *layer, int n_heads, base_err *err) {
    if (!plan) return base_fail(err, "decode plan: missing");
    int n_kv = layer->n_kv_heads;
    if (n_heads <= 0 || n_kv <= 0 || n_heads % n_kv != 0)
        return base_fail(err, "decode plan: %d heads not a multiple of %d kv heads", n_heads, n_kv);
    if (layer->head_dim <= 0 || layer->head_dim > ATTN_MAX_HEAD_DIM)
        return base_fail(err, "decode plan: head_dim %d outside 1..%d", layer->head_dim,
                         ATTN_MAX_HEAD_DIM);
    switch (plan->kind) {
    case BE_DECODE_GATHER:
        return 0;
    case BE_DECODE_V1:
        if (batch->n_seqs > ATTN_GRID_YZ_MAX)
            return base_fail(err, "decode plan: v1 over %d sequences exceeds the grid limit %d",
                             batch->n_seqs, ATTN_GRID_YZ_MAX);
        return 0;
    case BE_DECODE_V2:
        break;
    default:
        return base_fail(err, "decode plan: unknown kind %d", (int)plan->kind);
    }
    if (plan->pages_per_chunk < 1 || plan->max_chunks < 1 || plan->max_chunks > ATTN_GRID_YZ_MAX)
        return base_fail(err, "decode plan: v2 pages_per_chunk %d, max_chunks %d (limit %d)",
                         plan->pages_per_chunk, plan->max_chunks, ATTN_GRID_YZ_MAX);
    int64_t n_decode = 0;
    for (int s = 0; s < batch->n_seqs; s++) {
        if (batch->q_indptr[s + 1] - batch->q_indptr[s] != 1) continue;
        n_decode++;
        int64_t pages = (int64_t)batch->page_indptr[s + 1] - batch->page_indptr[s];
        if (div_ceil(pages, plan->pages_per_chunk) > plan->max_chunks)
            return base_fail(err, "decode plan: sequence %d needs more than max_chunks %d", s,
                             plan->max_chunks);
    }
    if (n_decode > ATTN_GRID_YZ_MAX)
        return base_fail(err, "decode plan: v2 over %lld decode rows exceeds the grid limit %d",
                         (long long)n_decode, ATTN_GRID_YZ_MAX);
    uint64_t need = attn_v2_bytes(n_decode, plan->max_chunks, n_heads, layer->head_dim);
    if (need > 0 && (!plan->workspace || need > plan->workspace_bytes))
        return base_fail(err, "decode plan: v2 needs %llu workspace bytes, has %llu",
                         (unsigned long long)need,
                         (unsigned long long)(plan->workspace ? plan->workspace_bytes : 0));
    return 0;
}
