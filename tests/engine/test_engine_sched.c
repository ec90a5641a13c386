/* The scheduler on a fixture model: batched greedy output equals the single-sequence path,
 * preemption when blocks run out (outputs unchanged, nothing leaked), cancellation frees
 * blocks at once, admission is first come first served and every running sequence advances
 * every step, the queue limit, prompts longer than the context, per-request seeds; and the
 * preemption run again on a model whose local layers keep only their window. */
#include "engine/engine_test_collector.h"
#include "engine/engine_test_runtime.h"
#include "test.h"

#include <string.h>

static char g_model[4096];

static void make_prompt(int32_t *p, int n, int salt, int vocab) {
    for (int i = 0; i < n; i++) p[i] = (int32_t)((i * 7 + salt * 13 + 3) % vocab);
}

static engine_request greedy_req(const int32_t *prompt, int n, int max_tokens, collector *c) {
    engine_request r = {.prompt = prompt, .n_prompt = n, .max_tokens = max_tokens};
    engine_sampling_defaults(&r.sampling);
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    r.on_event = collect_event;
    r.ctx = c;
    return r;
}

static uint64_t submit(engine_sched *s, const engine_request *r) {
    uint64_t id = 0;
    engine_reject why;
    base_err err;
    int rc = engine_submit(s, r, &id, &why, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    return id;
}

static void reference(engine_runtime *rt, const int32_t *prompt, int n, int max_new, int32_t *out) {
    engine_sampling sp;
    engine_sampling_defaults(&sp);
    sp.temperature = 0;
    engine_generate_result res;
    base_err err;
    CHECK_MSG(engine_generate(rt, prompt, n, max_new, &sp, NULL, NULL, &res, &err) == 0, "%s",
              err.msg);
    memcpy(out, res.tokens, (size_t)res.n_tokens * sizeof *out);
    CHECK(res.n_tokens == max_new);
    free(res.tokens);
}

static void check_pool_idle(engine_runtime *rt, engine_sched *s) {
    engine_sched_stats st = engine_sched_get_stats(s);
    CHECK_MSG(st.pool.referenced == 0, "referenced %lld", (long long)st.pool.referenced);
    CHECK(st.pool.free + st.pool.cached + st.pool.referenced == st.pool.capacity);
    kv_pool_stats local = kv_pool_get_local_stats(rt->pool);
    CHECK(memcmp(&st.local_pool, &local, sizeof local) == 0);
    CHECK(local.capacity == 0 ||
          (local.referenced == 0 && local.free + local.cached == local.capacity));
    CHECK(kv_pool_has_local(rt->pool) == (local.capacity > 0));
    base_err err;
    CHECK_MSG(kv_pool_check(rt->pool, &err) == 0, "%s", err.msg);
}

/* Three requests that together need more blocks than the pool has: the newest is preempted
 * and recomputed; every output equals what the request gives alone. */
static void test_preemption(void) {
    enum { N = 3, PROMPT = 20, GEN = 40 };
    /* the pool holds one sequence of 64 tokens (5 blocks of 16): three need 12 */
    engine_runtime *rt = test_open_runtime(g_model, 64, 1, 16);
    int vocab = model_config(rt->model)->vocab_size;
    int32_t prompts[N][PROMPT], ref[N][GEN];
    for (int i = 0; i < N; i++) {
        make_prompt(prompts[i], PROMPT, i + 1, vocab);
        reference(rt, prompts[i], PROMPT, GEN, ref[i]);
    }
    engine_sched_options so = {.n_parallel = N, .ctx_size = 64};
    engine_sched *s;
    base_err err;
    CHECK(engine_sched_start(rt, &so, &s, &err) == 0);
    collector c[N];
    for (int i = 0; i < N; i++) {
        collector_init(&c[i]);
        engine_request r = greedy_req(prompts[i], PROMPT, GEN, &c[i]);
        submit(s, &r);
    }
    for (int i = 0; i < N; i++) {
        collector_wait(&c[i]);
        CHECK(c[i].finish == ENGINE_FINISH_LENGTH);
        CHECK(c[i].n_final == 1);
        CHECK(c[i].n_tokens == GEN);
        CHECK_MSG(memcmp(c[i].tokens, ref[i], sizeof ref[i]) == 0, "request %d differs", i);
    }
    engine_sched_wait_idle(s);
    engine_sched_stats st = engine_sched_get_stats(s);
    CHECK_MSG(st.preemptions > 0, "no preemption happened");
    CHECK(st.requests_done == N);
    check_pool_idle(rt, s);
    engine_sched_stop(s);
    engine_runtime_close(rt);
}

/* A running request is cancelled between steps: its blocks are back before the next step. */
static void test_cancel(void) {
    engine_runtime *rt = test_open_runtime(g_model, 128, 2, 16);
    int vocab = model_config(rt->model)->vocab_size;
    int32_t prompt[40];
    make_prompt(prompt, 40, 5, vocab);
    engine_sched_options so = {.n_parallel = 2};
    engine_sched *s;
    base_err err;
    CHECK(engine_sched_start(rt, &so, &s, &err) == 0);
    engine_sched_set_step_limit(s, 0);
    collector c;
    collector_init(&c);
    engine_request r = greedy_req(prompt, 40, 50, &c);
    uint64_t id = submit(s, &r);
    engine_sched_set_step_limit(s, 3);
    engine_sched_wait_idle(s);
    engine_sched_stats st = engine_sched_get_stats(s);
    CHECK(st.running == 1);
    CHECK_MSG(st.pool.referenced >= 3, "referenced %lld", (long long)st.pool.referenced);
    CHECK(c.n_tokens == 3);
    engine_cancel(s, id);
    collector_wait(&c);
    CHECK(c.finish == ENGINE_FINISH_CANCELLED);
    engine_sched_wait_idle(s);
    st = engine_sched_get_stats(s);
    CHECK(st.steps == 3); /* freed without another step */
    CHECK(st.requests_cancelled == 1);
    check_pool_idle(rt, s);
    /* a waiting request is cancelled too, and an unknown id is ignored */
    collector c2;
    collector_init(&c2);
    r.ctx = &c2;
    id = submit(s, &r);
    engine_cancel(s, id);
    engine_cancel(s, id + 100);
    collector_wait(&c2);
    CHECK(c2.finish == ENGINE_FINISH_CANCELLED && c2.n_tokens == 0 && c2.n_final == 1);
    engine_sched_stop(s);
    engine_runtime_close(rt);
}

/* Four requests, two slots: the first two run together, each advancing one token per step;
 * the other two start in submission order once slots free up. */
static void test_fairness(void) {
    engine_runtime *rt = test_open_runtime(g_model, 128, 2, 16);
    int vocab = model_config(rt->model)->vocab_size;
    enum { N = 4 };
    int32_t prompts[N][12];
    int gen[N] = {6, 10, 5, 5};
    engine_sched_options so = {.n_parallel = 2};
    engine_sched *s;
    base_err err;
    CHECK(engine_sched_start(rt, &so, &s, &err) == 0);
    engine_sched_set_step_limit(s, 0);
    collector c[N];
    collect_order = 0;
    for (int i = 0; i < N; i++) {
        make_prompt(prompts[i], 12, 20 + i, vocab);
        collector_init(&c[i]);
        engine_request r = greedy_req(prompts[i], 12, gen[i], &c[i]);
        submit(s, &r);
    }
    for (int k = 1; k <= 4; k++) {
        engine_sched_set_step_limit(s, 1);
        engine_sched_wait_idle(s);
        CHECK(c[0].n_tokens == k && c[1].n_tokens == k);
        CHECK(c[2].n_tokens == 0 && c[3].n_tokens == 0);
        CHECK(engine_sched_get_stats(s).waiting == 2);
    }
    engine_sched_set_step_limit(s, -1);
    for (int i = 0; i < N; i++) collector_wait(&c[i]);
    CHECK(c[0].order < c[2].order && c[1].order < c[2].order && c[2].order < c[3].order);
    for (int i = 0; i < N; i++) CHECK(c[i].n_tokens == gen[i] && c[i].n_final == 1);
    engine_sched_wait_idle(s);
    check_pool_idle(rt, s);
    engine_sched_stop(s);
    engine_runtime_close(rt);
}

/* Rejections: an over-long prompt is the client's fault, a full queue is "busy". A request
 * stopped with the scheduler still gets its final event. */
static void test_limits(void) {
    engine_runtime *rt = test_open_runtime(g_model, 32, 1, 16);
    int32_t prompt[40];
    make_prompt(prompt, 40, 1, model_config(rt->model)->vocab_size);
    engine_sched_options so = {.n_parallel = 1, .max_queue = 1};
    engine_sched *s;
    base_err err;
    CHECK(engine_sched_start(rt, &so, &s, &err) == 0);
    engine_sched_set_step_limit(s, 0);
    collector c[2];
    collector_init(&c[0]);
    collector_init(&c[1]);
    engine_request r = greedy_req(prompt, 32, 4, &c[0]);
    uint64_t id;
    engine_reject why;
    CHECK(engine_submit(s, &r, &id, &why, &err) == -1 && why == ENGINE_REJECT_INVALID);
    CHECK(strstr(err.msg, "32") != NULL);
    /* ids past the vocabulary are rejected */
    int32_t bad[2] = {1, 1 << 30};
    r.prompt = bad;
    r.n_prompt = 2;
    CHECK(engine_submit(s, &r, &id, &why, &err) == -1 && why == ENGINE_REJECT_INVALID);
    r.prompt = prompt;
    r.n_prompt = 8;
    CHECK(engine_submit(s, &r, &id, &why, &err) == 0);
    r.ctx = &c[1];
    CHECK(engine_submit(s, &r, &id, &why, &err) == -1 && why == ENGINE_REJECT_BUSY);
    engine_sched_stop(s);
    CHECK(c[0].n_final == 1 && c[0].finish == ENGINE_FINISH_CANCELLED);
    CHECK(c[1].n_final == 0);
    engine_runtime_close(rt);
}

/* The same seed gives the same sampled tokens, whether run alone or next to another
 * request; another seed gives other tokens. */
static void test_seeds(void) {
    engine_runtime *rt = test_open_runtime(g_model, 128, 3, 16);
    int32_t prompt[10];
    make_prompt(prompt, 10, 9, model_config(rt->model)->vocab_size);
    engine_sched_options so = {.n_parallel = 3};
    engine_sched *s;
    base_err err;
    CHECK(engine_sched_start(rt, &so, &s, &err) == 0);
    collector c[3];
    uint64_t seeds[3] = {42, 42, 43};
    for (int i = 0; i < 3; i++) {
        collector_init(&c[i]);
        engine_request r = greedy_req(prompt, 10, 24, &c[i]);
        r.sampling.temperature = 1.5f;
        r.sampling.top_k = 0;
        r.sampling.top_p = 1;
        r.sampling.min_p = 0;
        r.sampling.seed = seeds[i];
        submit(s, &r);
        if (i == 0) collector_wait(&c[0]);
    }
    for (int i = 0; i < 3; i++) collector_wait(&c[i]);
    CHECK(c[0].n_tokens == 24 && c[1].n_tokens == 24 && c[2].n_tokens == 24);
    CHECK(memcmp(c[0].tokens, c[1].tokens, 24 * sizeof(int32_t)) == 0);
    CHECK(memcmp(c[0].tokens, c[2].tokens, 24 * sizeof(int32_t)) != 0);
    engine_sched_stop(s);
    engine_runtime_close(rt);
}

int main(void) {
    snprintf(g_model, sizeof g_model, "%s/tests/fixtures/llama_bf16", test_source_dir());
    test_preemption();
    test_cancel();
    test_fairness();
    test_limits();
    test_seeds();
    /* local layers keep only their 16-token window: preempted, recomputed and batched, each
     * output is still what the request gives alone */
    snprintf(g_model, sizeof g_model, "%s/tests/fixtures/gemma3_text_bf16", test_source_dir());
    test_preemption();
    TEST_MAIN_END();
}
