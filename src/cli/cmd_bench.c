/* `mlxcel bench`: llama-bench style throughput table, with decode measured against the
 * backend's memory ceiling measured in the same run. */
#include "cli/cli_runtime.h"
#include "cli/cmd_bench_plot.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static const char *g_help =
    "usage: mlxcel bench -m MODEL [-p 512] [-n 128] [-d 0] [-b 1,8,64] [-r 3] [--json] "
    "[options]\n"
    "\n"
    "Measures prompt processing (ppP: a P-token prompt) and token generation (tgN: N decode\n"
    "steps of B sequences at once, after a first token each; tgN@dD: each sequence already\n"
    "holds a D-token prompt of its own), best of R runs. Decode is also given as bytes read\n"
    "per second (the weights once a step, plus every sequence's K and V at its context) and as\n"
    "a share (of bw) of the backend's memory ceiling measured in the same run, which the header\n"
    "names: on the CPU the read bandwidth (a read-only stream over 512 MiB, every thread\n"
    "summing its own slice), on CUDA the copy bandwidth (read + write of 256 MiB).\n"
    "\n"
    "options:\n"
    "%s"
    "  -p, --n-prompt P         prompt tokens (default 512; 0 = skip)\n"
    "  -n, --n-gen N            decode steps (default 128; 0 = skip)\n"
    "  -d, --n-depth D          prompt tokens in each sequence's cache before tgN (default 0)\n"
    "  -b, --batch LIST         concurrent sequences for tgN, comma-separated (default 1)\n"
    "  -r, --repetitions R      runs of each test, the best is kept (default 3)\n"
    "      --json               one JSON object per test, one per line\n"
    "      --plot FILE.svg      also draw decode tok/s against batch, with the ceiling, as an\n"
    "                           SVG\n"
    "      --plot-from ROWS     draw FILE.svg from the --json rows of an earlier run instead\n"
    "                           of running (no -m)\n"
    "\n"
    "On a terminal, stderr shows which test is running; each row is printed as it finishes.\n"
    "\n"
    "example:\n"
    "  mlxcel bench -m models/demo -p 512 -n 128 -d 512 -b 1,8 -t 2\n"
    "  mlxcel bench -m models/demo -p 0 -n 32 -b 1,2,4,8 --plot decode.svg\n";

typedef struct bench_row {
    char test[48];
    int batch;
    int depth; /* decode only: prompt tokens per sequence before the timed steps */
    double tok_per_s;
    double gb_per_s;      /* decode only: weights and KV read */
    double kv_gb_per_s;   /* decode only: the KV part of gb_per_s */
    double ceiling_share; /* decode only */
} bench_row;

static void print_row(const char *model_dir, const engine_runtime *rt,
                      const engine_ceiling *ceiling, const bench_row *r, bool json) {
    const be_backend *be = rt->be;
    if (json) {
        json_t *o =
            json_pack("{s:s, s:s, s:s, s:i, s:s, s:i, s:i, s:f}", "model", model_dir, "backend",
                      be->name, "device", be->device, "threads", be->n_threads, "test", r->test,
                      "batch", r->batch, "n_depth", r->depth, "tok_per_s", r->tok_per_s);
        if (r->gb_per_s > 0) {
            json_object_set_new(o, "weight_gb_per_s", json_real(r->gb_per_s - r->kv_gb_per_s));
            json_object_set_new(o, "kv_gb_per_s", json_real(r->kv_gb_per_s));
            json_object_set_new(o, "ceiling", json_string(ceiling->name));
            json_object_set_new(o, "ceiling_gb_per_s", json_real(ceiling->bytes_per_second / 1e9));
            json_object_set_new(o, "ceiling_share", json_real(r->ceiling_share));
        }
        cli_print_json(o);
        fflush(stdout);
        return;
    }
    printf("| %-24s | %-4s | %7d | %-10s | %5d | %10.1f |", model_dir, be->name, be->n_threads,
           r->test, r->batch, r->tok_per_s);
    if (r->gb_per_s > 0)
        printf(" %8.2f | %5.1f%% |\n", r->gb_per_s, 100.0 * r->ceiling_share);
    else
        printf(" %8s | %6s |\n", "-", "-");
    fflush(stdout);
}

static int parse_batches(const char *s, int *out, int max, int *n) {
    *n = 0;
    while (*s && *n < max) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > 4096 || (*end && *end != ',')) return -1;
        out[(*n)++] = (int)v;
        s = *end ? end + 1 : end;
    }
    return *n ? 0 : -1;
}

/* The line on stderr that says which test runs, while it runs. */
static void show_running(cli_progress *bar, const bench_row *r, long rep, long reps) {
    char label[80];
    snprintf(label, sizeof label, "%s, batch %d", r->test, r->batch);
    if (rep == 0) cli_progress_init(bar, label, "runs");
    cli_progress_draw(bar, rep, reps);
}

/* K and V bytes one sequence's timed decode step reads, on average: step i (1..n_gen) reads
 * its n_depth + i + 1 tokens in the global layers and, in the local ones, the last `window`
 * of them. */
static double kv_step_bytes(const engine_kv_plan *p, long n_depth, long n_gen) {
    double bs = (double)p->geom.block_size;
    double mean_ctx = (double)n_depth + 1.0 + (double)(n_gen + 1) / 2.0;
    double global = (double)p->global_bytes_per_block / bs * mean_ctx;
    if (!p->n_local_layers) return global;
    double seen = 0;
    for (long i = 1; i <= n_gen; i++) {
        long ctx = n_depth + i + 1;
        seen += (double)(ctx < p->geom.window ? ctx : p->geom.window);
    }
    return global + (double)p->local_bytes_per_block / bs * seen / (double)n_gen;
}

static int run_bench(const char *model_dir, engine_runtime *rt, long n_prompt, long n_gen,
                     long n_depth, const int *batches, int n_batches, long reps, bool json,
                     bench_curve *curve, base_err *err) {
    cli_progress bar;
    engine_ceiling ceiling;
    if (engine_bench_ceiling(rt->be, &ceiling, err)) return -1;
    uint64_t step_bytes = model_decode_bytes(rt->model).routed;
    if (!json) {
        printf("device: %s (%s backend); commit %s; %s bandwidth %.2f GB/s (%s)\n", rt->be->device,
               rt->be->name, MLXCEL_GIT_COMMIT, ceiling.name, ceiling.bytes_per_second / 1e9,
               ceiling.how);
        const engine_kv_plan *kp = &rt->kv_plan;
        printf("model: %s, %llu weight bytes, %llu read per decode step, plus %llu of K and V "
               "per token of each sequence's context",
               model_dir, (unsigned long long)model_weight_bytes(rt->model),
               (unsigned long long)step_bytes,
               (unsigned long long)(kp->global_bytes_per_block / (uint64_t)kp->geom.block_size));
        if (kp->n_local_layers)
            printf(" (global layers) and %llu per token of its last %d (local layers)",
                   (unsigned long long)(kp->local_bytes_per_block / (uint64_t)kp->geom.block_size),
                   kp->geom.window);
        printf("\n\n");
        printf("| %-24s | %-4s | %7s | %-10s | %5s | %10s | %8s | %6s |\n", "model", "dev",
               "threads", "test", "batch", "tok/s", "GB/s", "of bw");
        printf("|%s|------|---------|------------|-------|------------|----------|--------|\n",
               "--------------------------");
    }
    if (n_prompt > 0) {
        bench_row r = {.batch = 1};
        snprintf(r.test, sizeof r.test, "pp%ld", n_prompt);
        for (long i = 0; i < reps; i++) {
            double sec;
            show_running(&bar, &r, i, reps);
            if (engine_bench_prefill(rt, (int)n_prompt, &sec, err)) return -1;
            if (sec > 0 && n_prompt / sec > r.tok_per_s) r.tok_per_s = (double)n_prompt / sec;
        }
        cli_progress_clear(&bar);
        print_row(model_dir, rt, &ceiling, &r, json);
    }
    for (int b = 0; b < n_batches && n_gen > 0; b++) {
        bench_row r = {.batch = batches[b], .depth = (int)n_depth};
        if (n_depth > 0)
            snprintf(r.test, sizeof r.test, "tg%ld@d%ld", n_gen, n_depth);
        else
            snprintf(r.test, sizeof r.test, "tg%ld", n_gen);
        double best = 0;
        for (long i = 0; i < reps; i++) {
            double sec;
            show_running(&bar, &r, i, reps);
            if (engine_bench_decode(rt, batches[b], (int)n_depth, (int)n_gen, &sec, err)) return -1;
            if (sec > 0 && (best == 0 || sec < best)) best = sec;
        }
        r.tok_per_s = (double)n_gen * batches[b] / best;
        const double kv_step = (double)batches[b] * kv_step_bytes(&rt->kv_plan, n_depth, n_gen);
        r.kv_gb_per_s = kv_step * (double)n_gen / best / 1e9;
        r.gb_per_s = (double)step_bytes * (double)n_gen / best / 1e9 + r.kv_gb_per_s;
        r.ceiling_share =
            ceiling.bytes_per_second > 0 ? r.gb_per_s * 1e9 / ceiling.bytes_per_second : 0;
        cli_progress_clear(&bar);
        print_row(model_dir, rt, &ceiling, &r, json);
        bench_curve_add(curve, r.batch, r.tok_per_s, r.ceiling_share);
        if (b == 0) {
            snprintf(curve->title, sizeof curve->title, "%s: decode, %s", model_dir, r.test);
            snprintf(curve->subtitle, sizeof curve->subtitle, "%s (%s backend), commit %s",
                     rt->be->device, rt->be->name, MLXCEL_GIT_COMMIT);
            snprintf(curve->ceiling_name, sizeof curve->ceiling_name, "%s", ceiling.name);
        }
    }
    return 0;
}

int cli_cmd_bench(int argc, char **argv) {
    cli_runtime_flags rtf;
    cli_runtime_init(&rtf);
    long n_prompt = 512, n_gen = 128, n_depth = 0, reps = 3;
    const char *batch_list = "1", *plot = NULL, *plot_from = NULL;
    bool json = false;
    cli_parser p;
    cli_parser_init(&p, "bench", argc, argv);
    while (cli_next(&p)) {
        if (cli_flag(&p, "-h", "--help")) {
            printf(g_help, cli_runtime_help());
            return CLI_OK;
        }
        if (cli_take_runtime(&p, &rtf) ||
            cli_take_int(&p, "-p", "--n-prompt", 0, 1 << 20, &n_prompt) ||
            cli_take_int(&p, "-n", "--n-gen", 0, 1 << 20, &n_gen) ||
            cli_take_int(&p, "-d", "--n-depth", 0, 1 << 20, &n_depth) ||
            cli_take_int(&p, "-r", "--repetitions", 1, 1000, &reps) ||
            cli_take(&p, "-b", "--batch", &batch_list) || cli_take(&p, NULL, "--plot", &plot) ||
            cli_take(&p, NULL, "--plot-from", &plot_from))
            continue;
        if (cli_flag(&p, NULL, "--json")) {
            json = true;
            continue;
        }
        cli_unknown(&p);
    }
    if (cli_done(&p)) return CLI_USAGE;
    base_err err;
    bench_curve curve = {0};
    if (plot_from) {
        if (!plot) return cli_usage_fail("bench: --plot-from needs --plot FILE.svg to draw into");
        if (rtf.model) return cli_usage_fail("bench: --plot-from runs nothing: leave out -m");
        return bench_curve_read(plot_from, &curve, &err) || bench_curve_plot(plot, &curve, &err)
                   ? cli_fail(&err)
                   : CLI_OK;
    }
    if (!rtf.model) return cli_usage_fail("bench: -m MODEL is required");
    if (plot && n_gen == 0)
        return cli_usage_fail("bench: --plot draws the decode tests, and -n 0 runs none");
    int batches[64], n_batches;
    if (parse_batches(batch_list, batches, 64, &n_batches))
        return cli_usage_fail("bench: -b wants comma-separated batch sizes in [1, 4096], got '%s'",
                              batch_list);
    int max_batch = 1;
    for (int i = 0; i < n_batches; i++) max_batch = batches[i] > max_batch ? batches[i] : max_batch;
    /* a decoded sequence ends with n_depth + n_gen + 1 tokens */
    const long decode_len = n_depth + n_gen + 1;
    if (rtf.opts.ctx_size <= 0)
        rtf.opts.ctx_size = (int)(n_prompt > decode_len ? n_prompt : decode_len);
    else if (n_gen > 0 && decode_len > rtf.opts.ctx_size)
        return cli_usage_fail("bench: -d %ld with -n %ld needs a context of %ld tokens; -c is %d",
                              n_depth, n_gen, decode_len, rtf.opts.ctx_size);
    rtf.opts.n_parallel = max_batch;
    engine_runtime *rt;
    if (cli_runtime_resolve(&rtf, &err) || engine_runtime_open(rtf.model, &rtf.opts, &rt, &err))
        return cli_fail(&err);
    int rc = run_bench(rtf.model, rt, n_prompt, n_gen, n_depth, batches, n_batches, reps, json,
                       &curve, &err);
    engine_runtime_close(rt);
    if (rc == 0 && plot) rc = bench_curve_plot(plot, &curve, &err);
    return rc ? cli_fail(&err) : CLI_OK;
}
