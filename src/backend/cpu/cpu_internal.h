/* The CPU backend's private parts shared by its files (not part of the backend interface). */
#ifndef MLXCEL_BACKEND_CPU_INTERNAL_H
#define MLXCEL_BACKEND_CPU_INTERNAL_H

#include "backend/backend.h"

typedef struct cpu_impl {
    base_pool *pool;         /* owned */
} cpu_impl;

static inline base_pool *cpu_pool(be_backend *be) {
    return ((cpu_impl *)be->impl)->pool;
}

/* Paged KV ops (cpu_attention.c), over the attn module's CPU kernels. */
int cpu_kv_append(be_backend *be, const be_kv_layer *layer, const be_tensor *k,
                  const be_tensor *v, const be_paged_batch *batch, base_err *err);
int cpu_attention(be_backend *be, const be_tensor *q, const be_kv_layer *layer,
                  const be_paged_batch *batch, const be_decode_plan *plan, int n_heads,
                  float scale, be_tensor *out, base_err *err);

#endif
