/* A CPU backend built by hand for the kv and attn tests: host memory, memcpy copies, and the
 * paged ops of cpu_attention.c on a thread pool of its own. */
#ifndef MLXCEL_TESTS_KV_TEST_BACKEND_H
#define MLXCEL_TESTS_KV_TEST_BACKEND_H

#include "backend/cpu/cpu_internal.h"

#include <stdlib.h>
#include <string.h>

/* calloc so that huge slabs cost only the pages that are touched */
static inline int tb_alloc(be_backend *be, size_t bytes, void **ptr, base_err *err) {
    *ptr = calloc(1, bytes ? bytes : 1);
    if (!*ptr) return base_fail(err, "test backend: cannot allocate %zu bytes", bytes);
    return 0;
}

static inline void tb_free(be_backend *be, void *ptr) {
    free(ptr);
}

static inline int tb_copy(be_backend *be, void *dst, const void *src, size_t bytes, base_err *err) {
    memmove(dst, src, bytes);
    return 0;
}

static const be_ops tb_ops = {
    .alloc = tb_alloc,
    .free = tb_free,
    .copy = tb_copy,
    .kv_append = cpu_kv_append,
    .attention = cpu_attention,
};

/* Caller frees with tb_destroy. */
static inline be_backend *tb_create(int n_threads) {
    be_backend *be = calloc(1, sizeof *be);
    cpu_impl *impl = calloc(1, sizeof *impl);
    impl->pool = base_pool_create(n_threads);
    *be = (be_backend){.name = "cpu",
                       .ops = &tb_ops,
                       .act_dtype = BASE_DTYPE_F32,
                       .n_threads = base_pool_threads(impl->pool),
                       .target_parallelism = base_pool_threads(impl->pool),
                       .impl = impl};
    return be;
}

static inline void tb_destroy(be_backend *be) {
    base_pool_destroy(cpu_pool(be));
    free(be->impl);
    free(be);
}

#endif
