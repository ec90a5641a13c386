/* The engine on the CPU backend for a test: two threads, the caller's context, parallel
 * sequences and KV block size; a model that does not open ends the test. */
#ifndef MLXCEL_TESTS_ENGINE_TEST_RUNTIME_H
#define MLXCEL_TESTS_ENGINE_TEST_RUNTIME_H

#include "engine/engine.h"

#include <stdio.h>
#include <stdlib.h>

/* block_size <= 0: the engine's default. */
static inline engine_options test_cpu_options(int ctx_size, int n_parallel, int block_size) {
    engine_options o;
    engine_options_defaults(&o);
    o.device = "cpu";
    o.n_threads = 2;
    o.ctx_size = ctx_size;
    o.n_parallel = n_parallel;
    o.kv_block_size = block_size;
    return o;
}

static inline engine_runtime *test_open_runtime(const char *dir, int ctx_size, int n_parallel,
                                                int block_size) {
    engine_options o = test_cpu_options(ctx_size, n_parallel, block_size);
    engine_runtime *rt = NULL;
    base_err err;
    if (engine_runtime_open(dir, &o, &rt, &err)) {
        fprintf(stderr, "%s: %s\n", dir, err.msg);
        exit(1);
    }
    return rt;
}

#endif
