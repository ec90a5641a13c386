/* The tensor-parallel split of a model (model.h's model_shard): which heads, columns, rows
 * and experts each rank holds, and the checks that each rank's part is whole. */
#include "model/model_internal.h"

#include <stdio.h>

/* Whether n splits over n_ranks; the error names what. */
static int even(int64_t n, int n_ranks, const char *what, base_err *err) {
    if (n % n_ranks == 0) return 0;
    return base_fail(err, "--tensor-parallel %d: %s %lld does not split over %d ranks", n_ranks,
                     what, (long long)n, n_ranks);
}

/* The quantization group of `module` where it is quantized: a row-parallel split of its k
 * range into parts of k_part columns must keep whole groups. */
static int whole_groups(const io_model_config *cfg, const char *module, int64_t k_part, int n_ranks,
                        base_err *err) {
    io_quant_spec q = io_config_quant_for(cfg, module);
    if (q.bits == 0 || k_part % q.group_size == 0) return 0;
    return base_fail(err,
                     "--tensor-parallel %d: %s would be split into %lld columns per rank, not a "
                     "multiple of its quantization group (%d)",
                     n_ranks, module, (long long)k_part, q.group_size);
}

static bool layer_moe(const io_model_config *c, int l) {
    return c->n_experts > 0 && (!c->layer_moe || c->layer_moe[l]);
}

/* Every layer's row-parallel weights split on group boundaries. */
static int check_groups(const io_model_config *c, const model_arch *arch, int n, base_err *err) {
    int64_t o_part = (int64_t)c->num_attention_heads / n * c->head_dim;
    int64_t down_part = (int64_t)c->intermediate_size / n;
    char module[256];
    for (int l = 0; l < c->num_hidden_layers; l++) {
        snprintf(module, sizeof module, "%slayers.%d.self_attn.o_proj", arch->names.prefix, l);
        if (whole_groups(c, module, o_part, n, err)) return -1;
        if (layer_moe(c, l)) continue;
        snprintf(module, sizeof module, "%slayers.%d.mlp.down_proj", arch->names.prefix, l);
        if (whole_groups(c, module, down_part, n, err)) return -1;
    }
    return 0;
}

static bool any_dense_mlp(const io_model_config *c) {
    for (int l = 0; l < c->num_hidden_layers; l++)
        if (!layer_moe(c, l)) return true;
    return false;
}

int model_shard_plan(const io_model_config *c, int n, int rank, model_shard *out, base_err *err) {
    if (n < 1 || rank < 0 || rank >= n)
        return base_fail(err, "--tensor-parallel %d: no rank %d", n, rank);
    const model_arch *arch = model_arch_find(c->model_type);
    if (!arch) return base_fail(err, "tensor parallelism: unknown model_type '%s'", c->model_type);
    int H = c->num_attention_heads, KV = c->num_key_value_heads;
    if (even(H, n, "num_attention_heads", err)) return -1;
    if (KV % n != 0 && n % KV != 0)
        return base_fail(err,
                         "--tensor-parallel %d: num_key_value_heads %d neither splits over %d "
                         "ranks nor divides them",
                         n, KV, n);
    /* RMSNorm over the whole q and k projections (OLMo 2) needs every head's sum of squares:
     * one more all-reduce per layer that is not written */
    if (n > 1 && c->qk_norm == IO_QK_NORM_FULL)
        return base_fail(err,
                         "--tensor-parallel %d: %s normalizes q and k over every head at once "
                         "(qk norm over the whole projection), which a split by heads does not "
                         "serve",
                         n, c->model_type);
    if (any_dense_mlp(c) && even(c->intermediate_size, n, "intermediate_size", err)) return -1;
    if (c->n_experts > 0 && even(c->n_experts, n, "the experts (num_experts)", err)) return -1;
    if (even(c->vocab_size, n, "vocab_size", err)) return -1;
    if (check_groups(c, arch, n, err)) return -1;
    int hpr = H / n;
    /* the query heads of a rank read consecutive KV heads: H / KV queries share one */
    int kv0 = rank * hpr / (H / KV);
    int nkv = KV >= n ? KV / n : 1;
    *out = (model_shard){.rank = rank,
                         .n_ranks = n,
                         .head0 = rank * hpr,
                         .n_heads = hpr,
                         .kv_head0 = kv0,
                         .n_kv_heads = nkv,
                         .inter0 = rank * (int64_t)c->intermediate_size / n,
                         .inter = c->intermediate_size / n,
                         .vocab0 = rank * (int64_t)c->vocab_size / n,
                         .vocab = c->vocab_size / n,
                         .expert0 = c->n_experts ? rank * (c->n_experts / n) : 0,
                         .n_experts = c->n_experts / n};
    return 0;
}
