/* Sizing the paged KV pool for a model on a backend. */
#include "engine/engine.h"

#include "attn/attn.h"

#include <string.h>

/* The context a model runs with when -c is not given: its own limit, but at most 4096 so that
 * a 128K-context model does not reserve 128K tokens per sequence by default. */
#define ENGINE_DEFAULT_CTX 4096

static base_dtype default_kv_dtype(const be_backend *be) {
    /* The CPU keeps K/V in f32: memory is plentiful there and it keeps the pool exact. */
    return strcmp(be->name, "cpu") == 0 ? BASE_DTYPE_F32 : BASE_DTYPE_F16;
}

/* Bytes of the activation buffers model_forward allocates for one prefill chunk of rows, each
 * with its logits. */
static uint64_t activation_bytes(const io_model_config *c, const be_backend *be) {
    uint64_t act = base_dtype_size(be->act_dtype);
    uint64_t qdim = (uint64_t)c->num_attention_heads * c->head_dim;
    uint64_t kvdim = (uint64_t)c->num_key_value_heads * c->head_dim;
    uint64_t width =
        2 * (uint64_t)c->hidden_size + 2 * qdim + 2 * kvdim + 2 * (uint64_t)c->intermediate_size;
    return (uint64_t)engine_prefill_chunk(be) * (width * act + (uint64_t)c->vocab_size * 4);
}

int engine_plan_kv(const io_model_config *c, uint64_t weights_bytes, be_backend *be,
                   const engine_options *o, engine_kv_plan *p, base_err *err) {
    memset(p, 0, sizeof *p);
    int bs = o->kv_block_size > 0 ? o->kv_block_size : KV_DEFAULT_BLOCK_SIZE;
    base_dtype dt = o->kv_dtype != BASE_DTYPE_COUNT ? o->kv_dtype : default_kv_dtype(be);
    p->geom =
        (kv_geometry){c->num_hidden_layers, c->num_key_value_heads, c->head_dim, bs, dt, 0, NULL};
    if (c->sliding_window > 0 && c->layer_local) {
        p->geom.window = c->sliding_window;
        p->geom.layer_local = c->layer_local;
        p->n_local_layers = kv_geometry_local_layers(&p->geom);
    }
    p->ctx_size = o->ctx_size > 0 ? o->ctx_size : c->max_position_embeddings;
    if (o->ctx_size <= 0 && p->ctx_size > ENGINE_DEFAULT_CTX) p->ctx_size = ENGINE_DEFAULT_CTX;
    p->n_parallel = o->n_parallel > 0 ? o->n_parallel : 1;
    p->weights_bytes = weights_bytes;
    p->kv_bytes_per_block = kv_bytes_per_block(&p->geom);
    p->kv_bytes_per_token = p->kv_bytes_per_block / (uint64_t)bs;
    p->global_bytes_per_block = kv_group_bytes_per_block(&p->geom, false);
    p->local_bytes_per_block = kv_group_bytes_per_block(&p->geom, true);
    p->reserve_bytes = kv_decode_reserve_bytes(&p->geom, c->num_attention_heads, p->n_parallel,
                                               p->ctx_size, attn_decode_target(be));
    /* one spare block per sequence: appending into a shared block copies it first */
    p->blocks_per_seq = ((int64_t)p->ctx_size + bs - 1) / bs + 1;
    /* the longest step either runs: the backend's prefill chunk or the scheduler's */
    int step = engine_prefill_chunk(be);
    if (o->prefill_chunk > step) step = o->prefill_chunk;
    p->prefill_step = step;
    p->local_blocks_per_seq = kv_local_blocks_per_seq(&p->geom, p->ctx_size, step);
    if (!o->kv_budget) {
        p->kv_blocks = p->blocks_per_seq * p->n_parallel;
        p->kv_local_blocks = p->local_blocks_per_seq * p->n_parallel;
        p->kv_blocks_full = p->kv_blocks;
        uint64_t bytes = base_sat_add_u64(
            base_sat_mul_u64((uint64_t)p->kv_blocks, p->global_bytes_per_block),
            base_sat_mul_u64((uint64_t)p->kv_local_blocks, p->local_bytes_per_block));
        p->budget_bytes = base_sat_add_u64(bytes, p->reserve_bytes);
        return 0;
    }
    kv_budget_spec spec;
    if (kv_budget_parse("--kv-cache-budget", o->kv_budget, &spec, err)) return -1;
    if (spec.is_auto) {
        uint64_t free_bytes = 0, total = 0;
        if (be->ops->memory_info(be, &free_bytes, &total))
            return base_fail(err,
                             "--kv-cache-budget auto: cannot read the %s backend's free "
                             "memory; give a number of bytes",
                             be->name);
        /* weights already live in device memory on a GPU; on the CPU they are mmapped and
         * will take page cache as they are read */
        uint64_t weights = strcmp(be->name, "cpu") == 0 ? weights_bytes : 0;
        p->budget_bytes =
            kv_budget_auto(free_bytes, KV_BUDGET_AUTO_FRACTION, weights, activation_bytes(c, be));
    } else {
        p->budget_bytes = spec.bytes;
    }
    kv_group_split split = kv_budget_split(&p->geom, p->budget_bytes, p->reserve_bytes,
                                           p->n_parallel, p->ctx_size, step);
    p->kv_blocks = split.global_blocks;
    p->kv_local_blocks = split.local_blocks;
    p->kv_blocks_full = kv_budget_blocks(p->budget_bytes, p->reserve_bytes, p->kv_bytes_per_block);
    if (p->n_local_layers && p->kv_local_blocks < p->local_blocks_per_seq)
        return base_fail(err,
                         "--kv-cache-budget: %llu bytes buy %lld local-layer KV blocks after the "
                         "%llu-byte decode reserve, but one sequence's %d-token window needs "
                         "%lld blocks of %llu bytes (raise the budget)",
                         (unsigned long long)p->budget_bytes, (long long)p->kv_local_blocks,
                         (unsigned long long)p->reserve_bytes, p->geom.window,
                         (long long)p->local_blocks_per_seq,
                         (unsigned long long)p->local_bytes_per_block);
    if (p->kv_blocks < p->blocks_per_seq)
        return base_fail(err,
                         "--kv-cache-budget: %llu bytes buy %lld KV blocks after the %llu-byte "
                         "decode reserve%s, but one sequence of the %d-token context needs %lld "
                         "blocks of %llu bytes (lower -c or raise the budget)",
                         (unsigned long long)p->budget_bytes, (long long)p->kv_blocks,
                         (unsigned long long)p->reserve_bytes,
                         p->n_local_layers ? " and the local layers' windows" : "", p->ctx_size,
                         (long long)p->blocks_per_seq,
                         (unsigned long long)(p->n_local_layers ? p->global_bytes_per_block
                                                                : p->kv_bytes_per_block));
    return 0;
}
