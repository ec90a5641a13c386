/* PLACEHOLDER until the paged-attention work lands: replaced by the kv/attn implementation. */
#include "backend/cpu/cpu_internal.h"

int cpu_kv_append(be_backend *be, const be_kv_layer *layer, const be_tensor *k,
                  const be_tensor *v, const be_paged_batch *batch, base_err *err) {
    return base_fail(err, "paged KV append is not built yet");
}

int cpu_attention(be_backend *be, const be_tensor *q, const be_kv_layer *layer,
                  const be_paged_batch *batch, const be_decode_plan *plan, int n_heads,
                  float scale, be_tensor *out, base_err *err) {
    return base_fail(err, "paged attention is not built yet");
}
