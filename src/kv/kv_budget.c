/* The KV budget: how many blocks fit in a byte budget once the decode workspace is kept
 * back. Budgets come from users and from device queries, so every step saturates instead of
 * wrapping: a budget below the reserve is 0 blocks, never a huge count. */
#include "kv/kv.h"

#include "attn/attn.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

uint64_t kv_bytes_per_block(const kv_geometry *g) {
    if (g->n_layers <= 0 || g->n_kv_heads <= 0 || g->head_dim <= 0 || g->block_size <= 0) return 0;
    uint64_t b = base_sat_mul_u64((uint64_t)g->block_size, (uint64_t)g->n_kv_heads);
    b = base_sat_mul_u64(b, (uint64_t)g->head_dim);
    b = base_sat_mul_u64(b, base_dtype_size(g->dtype));
    b = base_sat_mul_u64(b, (uint64_t)g->n_layers);
    return base_sat_mul_u64(b, 2); /* K and V */
}

uint64_t kv_group_bytes_per_block(const kv_geometry *g, bool local) {
    int n_local = kv_geometry_local_layers(g);
    kv_geometry one = *g;
    one.n_layers = local ? n_local : g->n_layers - n_local;
    return kv_bytes_per_block(&one);
}

int64_t kv_local_blocks_per_seq(const kv_geometry *g, int64_t ctx, int step) {
    if (kv_geometry_local_layers(g) == 0 || g->block_size <= 0 || ctx <= 0) return 0;
    int64_t full = (ctx + g->block_size - 1) / g->block_size + 1;
    int q = step > 0 && step < ctx ? step : (int)(ctx < INT32_MAX ? ctx : INT32_MAX);
    /* one spare, as for the global group: appending into a shared block copies it first */
    int64_t windowed = kv_local_blocks_per_step(g, q) + 1;
    return windowed < full ? windowed : full;
}

static int64_t clamp_blocks(uint64_t blocks) {
    return blocks > INT32_MAX ? INT32_MAX : (int64_t)blocks;
}

kv_group_split kv_budget_split(const kv_geometry *g, uint64_t budget, uint64_t reserve, int n_seqs,
                               int64_t ctx, int step) {
    kv_group_split out = {0, 0};
    if (kv_geometry_local_layers(g) == 0) {
        out.global_blocks = kv_budget_blocks(budget, reserve, kv_bytes_per_block(g));
        return out;
    }
    uint64_t seqs = n_seqs > 0 ? (uint64_t)n_seqs : 1;
    uint64_t local_bpb = kv_group_bytes_per_block(g, true);
    uint64_t global_bpb = kv_group_bytes_per_block(g, false);
    if (global_bpb == 0) {
        /* every layer local: the global blocks hold token ids only */
        int64_t full = g->block_size > 0 ? (ctx + g->block_size - 1) / g->block_size + 1 : 0;
        out.global_blocks = clamp_blocks(base_sat_mul_u64((uint64_t)full, seqs));
        out.local_blocks = kv_budget_blocks(budget, reserve, local_bpb);
        return out;
    }
    out.local_blocks =
        clamp_blocks(base_sat_mul_u64((uint64_t)kv_local_blocks_per_seq(g, ctx, step), seqs));
    int64_t affordable = kv_budget_blocks(budget, reserve, local_bpb);
    if (affordable < out.local_blocks) out.local_blocks = affordable;
    uint64_t local_bytes = base_sat_mul_u64((uint64_t)out.local_blocks, local_bpb);
    out.global_blocks =
        kv_budget_blocks(budget, base_sat_add_u64(reserve, local_bytes), global_bpb);
    return out;
}

uint64_t kv_decode_reserve_bytes(const kv_geometry *g, int n_heads, int max_seqs,
                                 int64_t max_context, int target) {
    return attn_workspace_bytes(n_heads, g->n_kv_heads, g->head_dim, g->block_size, max_seqs,
                                max_context, target);
}

int64_t kv_budget_blocks(uint64_t budget, uint64_t reserve, uint64_t bytes_per_block) {
    if (bytes_per_block == 0) return 0;
    uint64_t blocks = base_sat_sub_u64(budget, reserve) / bytes_per_block;
    return blocks > INT32_MAX ? INT32_MAX : (int64_t)blocks;
}

uint64_t kv_budget_auto(uint64_t free_bytes, double fraction, uint64_t weight_bytes,
                        uint64_t activation_bytes) {
    if (!(fraction > 0.0 && fraction <= 1.0)) return 0;
    /* fraction <= 1 keeps the product at or below free_bytes, but the double rounding of a
     * value near 2^64 can still land on 2^64 itself, which does not convert */
    double usable = (double)free_bytes * fraction;
    uint64_t u = usable >= 18446744073709551616.0 ? UINT64_MAX : (uint64_t)usable;
    return base_sat_sub_u64(u, base_sat_add_u64(weight_bytes, activation_bytes));
}

typedef struct budget_suffix {
    const char *name;
    uint64_t scale;
} budget_suffix;

static const budget_suffix SUFFIXES[] = {
    {"", 1ull},
    {"K", 1000ull},
    {"M", 1000ull * 1000},
    {"G", 1000ull * 1000 * 1000},
    {"T", 1000ull * 1000 * 1000 * 1000},
    {"Ki", 1ull << 10},
    {"Mi", 1ull << 20},
    {"Gi", 1ull << 30},
    {"Ti", 1ull << 40},
};

int kv_budget_parse(const char *flag, const char *text, kv_budget_spec *out, base_err *err) {
    *out = (kv_budget_spec){0};
    if (!text || !*text) return base_fail(err, "%s: empty value (want BYTES or auto)", flag);
    if (strcmp(text, "auto") == 0) {
        out->is_auto = true;
        return 0;
    }
    if (!isdigit((unsigned char)text[0]))
        return base_fail(err,
                         "%s: '%s' is not BYTES (digits with an optional K, M, G, T, Ki, "
                         "Mi, Gi or Ti suffix) or auto",
                         flag, text);
    errno = 0;
    char *end = NULL;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno == ERANGE) return base_fail(err, "%s: '%s' is larger than 2^64 bytes", flag, text);
    for (size_t i = 0; i < sizeof SUFFIXES / sizeof SUFFIXES[0]; i++) {
        if (strcmp(end, SUFFIXES[i].name) != 0) continue;
        if (!base_mul_ok_u64(v, SUFFIXES[i].scale, &out->bytes))
            return base_fail(err, "%s: '%s' is larger than 2^64 bytes", flag, text);
        return 0;
    }
    return base_fail(err, "%s: unknown suffix '%s' in '%s' (want K, M, G, T, Ki, Mi, Gi or Ti)",
                     flag, end, text);
}
