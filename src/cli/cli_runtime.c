/* Flags shared by every subcommand that runs a model. */
#include "cli/cli_runtime.h"
#include "cli/cmd_models.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A progress bar on stderr while the model's weights load (mapped, and uploaded to the device),
 * in MiB, only on a terminal; it is erased once the model is in. */
static void load_progress(void *ctx, uint64_t done, uint64_t total) {
    cli_progress *bar = ctx;
    cli_progress_draw(bar, (long)(done >> 20), (long)(total >> 20));
    if (done == total) cli_progress_clear(bar);
}

void cli_runtime_init(cli_runtime_flags *f) {
    memset(f, 0, sizeof *f);
    engine_options_defaults(&f->opts);
    cli_progress_init(&f->load_bar, "loading", "MiB");
    if (f->load_bar.on) {
        f->opts.on_load = load_progress;
        f->opts.on_load_ctx = &f->load_bar;
    }
}

bool cli_take_runtime(cli_parser *p, cli_runtime_flags *f) {
    long v;
    const char *s;
    if (cli_take_model(p, &f->model, &f->offline)) return true;
    if (cli_take(p, NULL, "--device", &f->opts.device)) return true;
    if (cli_take_int(p, "-t", "--threads", 1, 1024, &v)) {
        f->opts.n_threads = (int)v;
        return true;
    }
    if (cli_take_int(p, "-c", "--ctx-size", 1, 1 << 24, &v)) {
        f->opts.ctx_size = (int)v;
        return true;
    }
    if (cli_take_int(p, NULL, "--kv-block-size", 1, 1024, &v)) {
        f->opts.kv_block_size = (int)v;
        return true;
    }
    if (cli_take(p, NULL, "--kv-cache-budget", &f->opts.kv_budget)) return true;
    if (cli_take(p, NULL, "--kv-dtype", &s)) {
        if (!s) return true;
        if (strcmp(s, "f16") == 0)
            f->opts.kv_dtype = BASE_DTYPE_F16;
        else if (strcmp(s, "bf16") == 0)
            f->opts.kv_dtype = BASE_DTYPE_BF16;
        else if (strcmp(s, "f32") == 0)
            f->opts.kv_dtype = BASE_DTYPE_F32;
        else
            cli_usage(p, "%s: --kv-dtype wants f16, bf16 or f32, got '%s'", p->command, s);
        return true;
    }
    if (cli_take_int(p, "-tp", "--tensor-parallel", 1, 64, &v)) {
        f->opts.tensor_parallel = (int)v;
        return true;
    }
    /* llama.cpp's ways of spreading a model over GPUs: its layer split has no counterpart here,
     * and following a row split's proportions silently would be a different run */
    const char *llama = cli_take(p, "-sm", "--split-mode", &s)     ? "--split-mode"
                        : cli_take(p, "-ts", "--tensor-split", &s) ? "--tensor-split"
                                                                   : NULL;
    if (llama) {
        cli_usage(p,
                  "%s: %s is llama.cpp's; mlxcel spreads a model over GPUs with -tp N "
                  "(--tensor-parallel N), an even split of every layer",
                  p->command, llama);
        return true;
    }
    return false;
}

const char *cli_runtime_help(void) {
    return "  -m, --model M            a model directory, a Hugging Face repo id owner/name, or a\n"
           "                           name (mlx-community/name); downloaded when missing\n"
           "      --offline            never download (also HF_HUB_OFFLINE=1)\n"
           "  -t, --threads N          CPU threads (default: all cores)\n"
           "      --device D           auto, cpu or cuda (default: auto)\n"
           "  -c, --ctx-size N         context limit per sequence (default: the model's, at "
           "most 4096)\n"
           "      --kv-block-size N    tokens per KV block (default 32)\n"
           "      --kv-dtype T         f16, bf16 or f32 KV cache (default: f32 on the CPU, f16 "
           "on CUDA)\n"
           "      --kv-cache-budget B  bytes for the KV pool, or auto\n"
           "  -tp, --tensor-parallel N ranks (GPUs) to spread the model over (default 1)\n";
}

int cli_runtime_resolve(cli_runtime_flags *f, base_err *err) {
    return cli_model_resolve(&f->model, f->offline, f->model_dir, sizeof f->model_dir, err);
}

bool cli_take_sampling(cli_parser *p, engine_sampling *s) {
    double d;
    long v;
    const char *str;
    if (cli_take_float(p, NULL, "--temp", 0, 1e6, &d)) {
        s->temperature = (float)d;
        return true;
    }
    if (cli_take_int(p, NULL, "--top-k", 0, 1 << 30, &v)) {
        s->top_k = (int)v;
        return true;
    }
    if (cli_take_float(p, NULL, "--top-p", 0, 1, &d)) {
        s->top_p = (float)d;
        return true;
    }
    if (cli_take_float(p, NULL, "--min-p", 0, 1, &d)) {
        s->min_p = (float)d;
        return true;
    }
    if (cli_take_float(p, NULL, "--repeat-penalty", 1e-6, 1e6, &d)) {
        s->repeat_penalty = (float)d;
        return true;
    }
    if (cli_take(p, "-s", "--seed", &str)) {
        if (!str) return true;
        char *end;
        unsigned long long seed = strtoull(str, &end, 10);
        if (end == str || *end || str[0] == '-')
            cli_usage(p, "%s: --seed wants a non-negative integer, got '%s'", p->command, str);
        s->seed = seed;
        return true;
    }
    return false;
}
