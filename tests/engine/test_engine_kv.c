/* Sizing the KV pool (engine_plan_kv): the context a model runs with by default, with and
 * without a sliding window (which the attention of its local layers applies, not the
 * context size), and the local layers' blocks counted apart from the global ones: each
 * sequence's window and longest step (the backend's prefill chunk, or a longer one the
 * scheduler will run). */
#include "engine/engine.h"
#include "test.h"

#include <stdio.h>
#include <string.h>

static io_model_config small_config(int max_pos, int window) {
    io_model_config c;
    memset(&c, 0, sizeof c);
    c.hidden_size = 64;
    c.intermediate_size = 128;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 16;
    c.vocab_size = 100;
    c.max_position_embeddings = max_pos;
    c.sliding_window = window;
    return c;
}

/* ctx_size from engine_plan_kv for -c ctx (0: not given); -1 with err filled when refused. */
static int plan_ctx(be_backend *be, int max_pos, int window, int ctx, base_err *err) {
    io_model_config c = small_config(max_pos, window);
    engine_options o;
    engine_options_defaults(&o);
    o.ctx_size = ctx;
    engine_kv_plan p;
    if (engine_plan_kv(&c, 0, be, &o, &p, err)) return -1;
    return p.ctx_size;
}

/* One local layer of two, a 64-token window, blocks of 32, 2 sequences of 1000 tokens. */
static void local_plan(be_backend *be) {
    io_model_config c = small_config(4096, 64);
    bool local[2] = {true, false};
    c.layer_local = local;
    engine_options o;
    engine_options_defaults(&o);
    o.ctx_size = 1000;
    o.n_parallel = 2;
    engine_kv_plan p;
    base_err err;
    CHECK_MSG(engine_plan_kv(&c, 0, be, &o, &p, &err) == 0, "%s", err.msg);
    /* the CPU steps 512 tokens: 63 + 512 span 18 blocks, one more for where the span starts,
     * one spare */
    CHECK(p.n_local_layers == 1 && p.prefill_step == 512 && p.local_blocks_per_seq == 20);
    CHECK(p.kv_blocks == 2 * 33 && p.kv_local_blocks == 2 * 20);
    CHECK(p.global_bytes_per_block == p.local_bytes_per_block &&
          p.global_bytes_per_block + p.local_bytes_per_block == p.kv_bytes_per_block);
    CHECK(p.budget_bytes == 106 * p.global_bytes_per_block + p.reserve_bytes);
    /* a scheduler stepping 700 tokens: 763 span 24 blocks */
    o.prefill_chunk = 700;
    CHECK(engine_plan_kv(&c, 0, be, &o, &p, &err) == 0);
    CHECK(p.prefill_step == 700 && p.local_blocks_per_seq == 26);
    /* a window past the context: the context's blocks */
    o.prefill_chunk = 0;
    o.ctx_size = 100;
    CHECK(engine_plan_kv(&c, 0, be, &o, &p, &err) == 0);
    CHECK(p.local_blocks_per_seq == 5 && p.blocks_per_seq == 5);
    /* a budget: the local group's blocks first, the global ones from the rest; one that
     * cannot hold a sequence's window is refused naming it */
    o.ctx_size = 1000;
    char budget[64];
    uint64_t want_global = 100;
    snprintf(
        budget, sizeof budget, "%llu",
        (unsigned long long)(p.reserve_bytes + (2 * 20 + want_global) * p.local_bytes_per_block));
    o.kv_budget = budget;
    CHECK(engine_plan_kv(&c, 0, be, &o, &p, &err) == 0);
    CHECK_MSG(p.kv_local_blocks == 40 && p.kv_blocks == (int64_t)want_global &&
                  p.kv_blocks_full == (2 * 20 + 100) / 2,
              "local %lld global %lld full %lld", (long long)p.kv_local_blocks,
              (long long)p.kv_blocks, (long long)p.kv_blocks_full);
    snprintf(budget, sizeof budget, "%llu",
             (unsigned long long)(p.reserve_bytes + 10 * p.local_bytes_per_block));
    CHECK(engine_plan_kv(&c, 0, be, &o, &p, &err) == -1);
    CHECK_MSG(strstr(err.msg, "local-layer KV blocks") && strstr(err.msg, "64-token window"), "%s",
              err.msg);
}

int main(void) {
    be_backend *be = NULL;
    base_err err = {{0}};
    CHECK_MSG(be_cpu_create(1, &be, &err) == 0, "%s", err.msg);

    /* No window: the model's limit, capped at 4096 by default; -c as given. */
    CHECK(plan_ctx(be, 2048, 0, 0, &err) == 2048);
    CHECK(plan_ctx(be, 131072, 0, 0, &err) == 4096);
    CHECK(plan_ctx(be, 2048, 0, 8192, &err) == 8192);

    /* A window no longer bounds the context: attention masks each local layer to it. */
    CHECK(plan_ctx(be, 32768, 1024, 0, &err) == 4096);
    CHECK(plan_ctx(be, 32768, 1024, 8192, &err) == 8192);

    local_plan(be);

    be_destroy(be);
    TEST_MAIN_END();
}
