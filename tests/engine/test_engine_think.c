/* The thinking budget through the scheduler on the demo model (greedy): the close ids are
 * forced right after the budget's tokens, counted from the start when the prompt opened the
 * thinking or from the model's own open ids, the tokens before them are the free run's, a
 * request that never thinks is untouched; beside a grammar the close goes through it, and a
 * grammar that does not allow it ends the request with an error that says so. */
#include "engine/engine_test_collector.h"
#include "engine/engine_test_runtime.h"
#include "test.h"

#include <string.h>

static const int32_t g_prompt[] = {1, 450, 9939, 28705};
static const int32_t g_close[] = {100, 200, 300};

/* Runs one greedy request of at most 10 tokens with the budget fields of `think` into c. */
static void run_some(engine_sched *s, const engine_request *think, collector *c) {
    collector_init(c);
    engine_request r = *think;
    r.prompt = g_prompt;
    r.n_prompt = 4;
    r.max_tokens = 10;
    engine_sampling_defaults(&r.sampling);
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    r.on_event = collect_event;
    r.ctx = c;
    uint64_t id;
    engine_reject why;
    base_err err;
    CHECK_MSG(engine_submit(s, &r, &id, &why, &err) == 0, "%s", err.msg);
    collector_wait(c);
}

/* The same, all 10 generated. */
static void run(engine_sched *s, const engine_request *think, collector *c) {
    run_some(s, think, c);
    CHECK(c->n_tokens == 10);
}

static bool same(const int32_t *a, const int32_t *b, int n) {
    return memcmp(a, b, (size_t)n * sizeof *a) == 0;
}

int main(void) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/models/demo", test_source_dir());
    base_err err;
    tok_tokenizer *tok = NULL;
    if (tok_load(dir, 0, &tok, &err)) {
        fprintf(stderr, "demo model: %s\n", err.msg);
        return 1;
    }
    engine_runtime *rt = test_open_runtime(dir, 64, 1, 0);
    engine_sched_options so = {.n_parallel = 1, .ctx_size = 64, .tok = tok};
    engine_sched *s = NULL;
    if (engine_sched_start(rt, &so, &s, &err)) {
        fprintf(stderr, "scheduler: %s\n", err.msg);
        return 1;
    }
    collector free_run, c;
    engine_request none = {0};
    run(s, &none, &free_run);

    /* the prompt opened the thinking: 3 tokens, then the close ids */
    engine_request think = {
        .reasoning_budget = 3, .thinking = true, .think_close = g_close, .n_think_close = 3};
    run(s, &think, &c);
    CHECK(same(c.tokens, free_run.tokens, 3) && same(c.tokens + 3, g_close, 3));

    /* a budget of 0 closes at once */
    think.reasoning_budget = 0;
    run(s, &think, &c);
    CHECK(same(c.tokens, g_close, 3));

    /* the model opens it itself (its first two free tokens taken as the open tag): two
     * tokens of thinking after them, then the close */
    think = (engine_request){.reasoning_budget = 2,
                             .think_open = free_run.tokens,
                             .n_think_open = 2,
                             .think_close = g_close,
                             .n_think_close = 3};
    run(s, &think, &c);
    CHECK(same(c.tokens, free_run.tokens, 4) && same(c.tokens + 4, g_close, 3));

    /* never opened: the free run */
    int32_t open[] = {g_close[0], g_close[1]};
    think.think_open = open;
    run(s, &think, &c);
    CHECK(same(c.tokens, free_run.tokens, 10));

    /* beside a grammar the close goes through it: forced where the grammar allows it */
    int32_t *close = NULL;
    size_t n_close = 0;
    CHECK(tok_encode(tok, "</think>", 8, false, &close, &n_close, &err) == 0 && n_close <= 6);
    engine_request both = {.grammar = "root ::= .*\n",
                           .reasoning_budget = 2,
                           .thinking = true,
                           .think_close = close,
                           .n_think_close = (int)n_close};
    run(s, &both, &c);
    CHECK_MSG(same(c.tokens + 2, close, (int)n_close), "the close after 2 tokens, by the grammar");
    /* and an error where it does not */
    both.grammar = "root ::= [a-z]*\n";
    run_some(s, &both, &c);
    CHECK_MSG(c.finish == ENGINE_FINISH_ERROR && c.n_tokens == 2 &&
                  strstr(c.error, "the reasoning budget ends the thinking with token") &&
                  strstr(c.error, "which the grammar does not allow here"),
              "%d tokens, finish %d: %s", c.n_tokens, (int)c.finish, c.error);
    free(close);
    /* the ids that end the thinking are some of the close ids */
    engine_request bad = {.prompt = g_prompt,
                          .n_prompt = 4,
                          .reasoning_budget = 1,
                          .think_close = g_close,
                          .n_think_close = 3,
                          .n_think_end = 4,
                          .on_event = collect_event,
                          .ctx = &c};
    engine_sampling_defaults(&bad.sampling);
    uint64_t id;
    engine_reject why;
    CHECK(engine_submit(s, &bad, &id, &why, &err) == -1 && why == ENGINE_REJECT_INVALID &&
          strstr(err.msg, "n_think_end"));
    engine_sched_stop(s);
    engine_runtime_close(rt);
    tok_free(tok);
    TEST_MAIN_END();
}
