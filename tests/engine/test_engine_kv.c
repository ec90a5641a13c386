/* Sizing the KV pool (engine_plan_kv): the context a model runs with by default, with and
 * without a sliding window (which the attention of its local layers applies, not the
 * context size). */
#include "engine/engine.h"
#include "test.h"

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

    be_destroy(be);
    TEST_MAIN_END();
}
