/* Constrained decoding's cost in the scheduler: C concurrent requests (C = 1, 16) on a model
 * (the demo model by default), each a 64-token prompt and 128 sampled tokens (llama-server's
 * default chain), free or
 * constrained by one JSON Schema's grammar (an array of at least 50 of tests/grammar/schemas'
 * issue objects, so that no request can end early and both variants generate the same tokens).
 * A constrained row's mask comes from the matcher (cached per grammar state) and goes with the
 * row's candidate request to the backend, which applies it where the logits are.
 *
 * The ceiling is the same requests unconstrained, in the same scheduler, interleaved round by
 * round, which of the two goes first alternating. The machine may be shared, which moves wall
 * time by tens of percent from run to run, so the cost is measured in CPU time (the process's,
 * every thread: the pool's workers sleep when idle, so time another process takes is not
 * counted): the median over rounds of constrained / free CPU seconds per token, minus 1, within
 * the round. Each tok/s figure is the best of ROUNDS (wall time). All requests of a
 * grammar share one matcher, as the server's do; its mask cache is warm after the first round,
 * whose figure (a schema never seen before, and the vocabulary built by its first request) is
 * printed too. On a GPU (a machine of its own) the wall-time cost, the median over rounds of
 * free / constrained tok/s - 1, is the figure; on a shared CPU the CPU-time one.
 *
 *   build/bench/bench_constrained [THREADS [MODEL_DIR [DEVICE]]] (2, models/demo, cpu) */
#include "engine/engine.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { PROMPT = 64, GEN = 128, ROUNDS = 5 };

typedef struct run_state {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int remaining, tokens, wrong; /* wrong: requests that did not run to max_tokens */
} run_state;

static void on_event(void *ctx, const engine_event *ev) {
    run_state *r = ctx;
    pthread_mutex_lock(&r->mu);
    if (ev->token >= 0) r->tokens++;
    if (ev->finish != ENGINE_FINISH_NONE) {
        if (ev->finish != ENGINE_FINISH_LENGTH) r->wrong++;
        if (--r->remaining == 0) pthread_cond_signal(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
}

static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Output tokens per wall second and CPU seconds per token of `clients` requests submitted at
 * once (grammar NULL: free). */
static int run(engine_sched *s, int vocab, int clients, const char *grammar, double *tok_s,
               double *cpu_tok, base_err *err) {
    run_state r = {.remaining = clients};
    pthread_mutex_init(&r.mu, NULL);
    pthread_cond_init(&r.cv, NULL);
    int32_t prompt[PROMPT];
    double t0 = base_now(), c0 = cpu_seconds();
    for (int c = 0; c < clients; c++) {
        /* distinct prompts: no prefix sharing flatters the numbers */
        for (int i = 0; i < PROMPT; i++) prompt[i] = (int32_t)((c * 131 + i * 7 + 1) % vocab);
        engine_request q = {
            .prompt = prompt, .n_prompt = PROMPT, .max_tokens = GEN, .grammar = grammar};
        engine_sampling_defaults(&q.sampling);
        q.sampling.seed = (uint64_t)c;
        q.ignore_eos = true;
        q.on_event = on_event;
        q.ctx = &r;
        uint64_t id;
        engine_reject why;
        if (engine_submit(s, &q, &id, &why, err)) return -1;
    }
    pthread_mutex_lock(&r.mu);
    while (r.remaining > 0) pthread_cond_wait(&r.cv, &r.mu);
    pthread_mutex_unlock(&r.mu);
    *tok_s = r.tokens / (base_now() - t0);
    *cpu_tok = (cpu_seconds() - c0) / r.tokens;
    if (r.wrong || r.tokens != clients * GEN)
        return base_fail(err, "%d requests ended early (%d tokens)", r.wrong, r.tokens);
    return 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int bench_clients(const char *model_dir, const char *device, const tok_tokenizer *tok,
                         int threads, int clients, const char *gbnf, base_err *err) {
    engine_options o;
    engine_options_defaults(&o);
    o.device = device;
    o.n_threads = threads;
    o.ctx_size = PROMPT + GEN;
    o.n_parallel = clients;
    engine_runtime *rt;
    engine_sched *s;
    engine_sched_options so = {.n_parallel = clients, .tok = tok};
    if (engine_runtime_open(model_dir, &o, &rt, err)) return -1;
    if (engine_sched_start(rt, &so, &s, err)) {
        engine_runtime_close(rt);
        return -1;
    }
    int vocab = model_config(rt->model)->vocab_size;
    double best_free = 0, best_gram = 0, cold = 0, cost[ROUNDS], wall[ROUNDS], cpu_free[ROUNDS];
    int rc = 0;
    for (int round = 0; round < ROUNDS && rc == 0; round++) {
        double f = 0, g = 0, cf = 0, cg = 0;
        for (int k = 0; k < 2 && rc == 0; k++) {
            bool constrained = (k + round) % 2 == 1;
            rc = run(s, vocab, clients, constrained ? gbnf : NULL, constrained ? &g : &f,
                     constrained ? &cg : &cf, err);
        }
        if (rc) break;
        if (round == 0) cold = g;
        if (f > best_free) best_free = f;
        if (g > best_gram) best_gram = g;
        cost[round] = cg / cf - 1.0;
        wall[round] = f / g - 1.0;
        cpu_free[round] = cf;
    }
    if (rc == 0) {
        qsort(cost, ROUNDS, sizeof *cost, cmp_double);
        qsort(wall, ROUNDS, sizeof *wall, cmp_double);
        qsort(cpu_free, ROUNDS, sizeof *cpu_free, cmp_double);
        printf(
            "| %2d | %7.1f | %7.1f | %7.1f | %5.1f%% (%.1f%% to %.1f%%) | %6.2f | %5.1f%% (%.1f%% "
            "to %.1f%%) |\n",
            clients, best_free, best_gram, cold, 100.0 * wall[ROUNDS / 2], 100.0 * wall[0],
            100.0 * wall[ROUNDS - 1], 1e3 * cpu_free[ROUNDS / 2], 100.0 * cost[ROUNDS / 2],
            100.0 * cost[0], 100.0 * cost[ROUNDS - 1]);
    }
    engine_sched_stop(s);
    engine_runtime_close(rt);
    return rc;
}

/* The issue schema as the items of an array that must hold at least 50. */
static int bench_grammar(const char *src, char **gbnf, base_err *err) {
    char path[4096], *issue;
    snprintf(path, sizeof path, "%s/tests/grammar/schemas/26-issue.json", src);
    if (base_read_file(path, &issue, NULL, err)) return -1;
    size_t n = strlen(issue) + 64;
    char *schema = base_xmalloc(n);
    snprintf(schema, n, "{\"type\": \"array\", \"minItems\": 50, \"items\": %s}", issue);
    int rc = gram_schema_to_gbnf(schema, strlen(schema), gbnf, err);
    free(schema);
    free(issue);
    return rc;
}

int main(int argc, char **argv) {
    const char *src = getenv("MLXCEL_SOURCE_DIR") ? getenv("MLXCEL_SOURCE_DIR") : ".";
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    const char *device = argc > 3 ? argv[3] : "cpu";
    char model_dir[4096];
    if (argc > 2)
        snprintf(model_dir, sizeof model_dir, "%s", argv[2]);
    else
        snprintf(model_dir, sizeof model_dir, "%s/models/demo", src);
    base_err err;
    tok_tokenizer *tok;
    char *gbnf;
    if (tok_load(model_dir, 0, &tok, &err) || bench_grammar(src, &gbnf, &err)) {
        fprintf(stderr, "bench_constrained: %s\n", err.msg);
        return 1;
    }
    printf("device: %s, %d threads\ncommit: %s\nmodel: %s, prompt %d, %d sampled tokens per "
           "request (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05)\ngrammar: array of >= 50 "
           "issues (tests/grammar/schemas/26-issue.json), %zu bytes of GBNF\n\n",
           device, threads, MLXCEL_GIT_COMMIT, model_dir, PROMPT, GEN, strlen(gbnf));
    printf("| clients | free tok/s | constrained tok/s | constrained, first round | wall cost, "
           "median (range) | free CPU ms per token | CPU cost, median (range) |\n");
    printf("|---|---|---|---|---|---|---|\n");
    static const int clients[] = {1, 16};
    int rc = 0;
    for (size_t i = 0; i < sizeof clients / sizeof *clients && rc == 0; i++)
        rc = bench_clients(model_dir, device, tok, threads, clients[i], gbnf, &err);
    if (rc) fprintf(stderr, "bench_constrained: %s\n", err.msg);
    free(gbnf);
    tok_free(tok);
    return rc ? 1 : 0;
}
