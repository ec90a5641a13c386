/* Scheduler throughput on the CPU: C concurrent streaming requests (C = 1, 4, 16, 64), each a
 * 64-token prompt and 64 generated tokens, through the scheduler the server uses. Prints, per
 * C, output tokens/s, time to first token (mean and worst), and the share of step time spent
 * outside the model's forward pass (batching, sampling, bookkeeping).
 *
 *   build/bench/bench_server [MODEL_DIR] [THREADS] [DEVICE]
 *       (defaults tests/fixtures/llama_bf16, 2, cpu; DEVICE cuda runs on the GPU) */
#include "engine/engine.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { PROMPT = 64, GEN = 64 };

typedef struct run_state {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int remaining;
    double ttft_sum, ttft_max;
} run_state;

static void on_event(void *ctx, const engine_event *ev) {
    run_state *r = ctx;
    if (ev->finish == ENGINE_FINISH_NONE) return;
    pthread_mutex_lock(&r->mu);
    r->ttft_sum += ev->seconds_to_first_token;
    if (ev->seconds_to_first_token > r->ttft_max) r->ttft_max = ev->seconds_to_first_token;
    if (--r->remaining == 0) pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static int bench_one(const char *model_dir, const char *device, int threads, int clients) {
    engine_options o;
    engine_options_defaults(&o);
    o.device = device;
    o.n_threads = threads;
    o.ctx_size = PROMPT + GEN;
    o.n_parallel = clients;
    engine_runtime *rt;
    engine_sched *s;
    base_err err;
    engine_sched_options so = {.n_parallel = clients};
    if (engine_runtime_open(model_dir, &o, &rt, &err) || engine_sched_start(rt, &so, &s, &err)) {
        fprintf(stderr, "bench_server: %s\n", err.msg);
        return -1;
    }
    int vocab = model_config(rt->model)->vocab_size;
    run_state r = {.remaining = clients};
    pthread_mutex_init(&r.mu, NULL);
    pthread_cond_init(&r.cv, NULL);
    int32_t prompt[PROMPT];
    double t0 = base_now();
    for (int c = 0; c < clients; c++) {
        /* distinct prompts: no prefix sharing flatters the numbers */
        for (int i = 0; i < PROMPT; i++) prompt[i] = (int32_t)((c * 131 + i * 7 + 1) % vocab);
        engine_request q = {.prompt = prompt, .n_prompt = PROMPT, .max_tokens = GEN};
        engine_sampling_defaults(&q.sampling);
        q.sampling.seed = (uint64_t)c;
        q.ignore_eos = true;
        q.on_event = on_event;
        q.ctx = &r;
        uint64_t id;
        engine_reject why;
        if (engine_submit(s, &q, &id, &why, &err)) {
            fprintf(stderr, "bench_server: %s\n", err.msg);
            return -1;
        }
    }
    pthread_mutex_lock(&r.mu);
    while (r.remaining > 0) pthread_cond_wait(&r.cv, &r.mu);
    pthread_mutex_unlock(&r.mu);
    double wall = base_now() - t0;
    engine_sched_wait_idle(s); /* the last step's counters land after its final events */
    engine_sched_stats st = engine_sched_get_stats(s);
    printf("| %3d | %8.1f | %8.1f | %8.1f | %5.1f%% | %6llu |\n", clients,
           (double)st.generated_tokens / wall, 1e3 * r.ttft_sum / clients, 1e3 * r.ttft_max,
           100.0 * (1.0 - st.forward_seconds / st.step_seconds), (unsigned long long)st.steps);
    if (st.generated_tokens != (uint64_t)clients * GEN)
        fprintf(stderr, "bench_server: %llu tokens generated\n",
                (unsigned long long)st.generated_tokens);
    engine_sched_stop(s);
    engine_runtime_close(rt);
    return 0;
}

int main(int argc, char **argv) {
    const char *model_dir = argc > 1 ? argv[1] : "tests/fixtures/llama_bf16";
    int threads = argc > 2 ? atoi(argv[2]) : 2;
    const char *device = argc > 3 ? argv[3] : "cpu";
    printf("model %s, %s, %d threads, prompt %d, generated %d per client\n\n", model_dir, device,
           threads, PROMPT, GEN);
    printf("| clients | output tok/s | TTFT mean ms | TTFT max ms | outside forward | steps |\n");
    printf("|---|---|---|---|---|---|\n");
    static const int clients[] = {1, 4, 16, 64};
    for (size_t i = 0; i < sizeof clients / sizeof *clients; i++)
        if (bench_one(model_dir, device, threads, clients[i])) return 1;
    return 0;
}
