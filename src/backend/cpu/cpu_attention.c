/* The CPU backend's paged KV ops: thin wrappers that run the attn module's CPU kernels on the
 * backend's thread pool. */
#include "backend/cpu/cpu_internal.h"

#include "attn/attn.h"

int cpu_kv_append(be_backend *be, const be_kv_layer *layer, const be_tensor *k, const be_tensor *v,
                  const be_paged_batch *batch, base_err *err) {
    return attn_cpu_kv_append(cpu_pool(be), layer, k, v, batch, err);
}

int cpu_attention(be_backend *be, const be_tensor *q, const be_kv_layer *layer,
                  const be_paged_batch *batch, const be_decode_plan *plan, int n_heads,
                  be_attn attn, be_tensor *out, base_err *err) {
    return attn_cpu_attention(cpu_pool(be), q, layer, batch, plan, n_heads, attn, out, err);
}
