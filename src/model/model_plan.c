/* The decode plan for each step and its workspace, reserved once for the largest plan the
 * runtime's limits allow. */
#include "model/model_internal.h"

#include "attn/attn.h"

int model_reserve_decode(model *m, int block_size, int max_seqs, int max_ctx, base_err *err) {
    const io_model_config *c = &m->cfg;
    uint64_t bytes = attn_workspace_bytes(m->shard.n_heads, m->shard.n_kv_heads, c->head_dim,
                                          block_size, max_seqs, max_ctx, attn_decode_target(m->be));
    if (bytes <= m->workspace_bytes) return 0;
    m->s.generation++;
    if (m->workspace) m->be->ops->free(m->be, m->workspace);
    m->workspace = NULL;
    m->workspace_bytes = 0;
    if (m->be->ops->alloc(m->be, bytes, &m->workspace, err))
        return base_fail_wrap(err, "decode workspace of %llu bytes", (unsigned long long)bytes);
    m->workspace_bytes = bytes;
    return 0;
}

int model_plan_step(model *m, const kv_pool *pool, const kv_batch *batch, be_decode_plan *plan,
                    base_err *err) {
    const io_model_config *c = &m->cfg;
    attn_plan_decode(&batch->view, kv_pool_geometry(pool)->block_size, m->shard.n_heads,
                     m->shard.n_kv_heads, c->head_dim, attn_decode_target(m->be), m->workspace,
                     m->workspace_bytes, plan);
    return 0;
}

void model_plan_pages(model *m, int64_t n_decode, int64_t max_pages, be_decode_plan *plan) {
    const io_model_config *c = &m->cfg;
    attn_plan_decode_pages(n_decode, max_pages, m->shard.n_heads, m->shard.n_kv_heads, c->head_dim,
                           attn_decode_target(m->be), m->workspace, m->workspace_bytes, plan);
}
