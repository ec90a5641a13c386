/* `mlxcel inspect`: the memory breakdown of a model, from its headers and config only. */
#include "model/arch/arch.h"
#include "cli/cli_runtime.h"

#include <jansson.h>
#include <stdlib.h>

static const char *g_help =
    "usage: mlxcel inspect -m MODEL [-c N] [-np N] [--kv-cache-budget BYTES|auto] [--json]\n"
    "\n"
    "Reads config.json and the safetensors headers (no weights) and prints how memory would\n"
    "be used: weights, the weight bytes one decode step reads per sequence (as `mlxcel bench`\n"
    "counts them: a mixture of experts reads its router and top_k of its experts, and the\n"
    "figure with every expert read is shown beside it), KV bytes per token and per block, the\n"
    "decode workspace reserve, the KV blocks the budget buys and the context that fits per\n"
    "sequence at -np. A model with sliding-window (local) layers keeps only their window: the\n"
    "global and local blocks are counted apart, and the context that fits is shown with and\n"
    "without that bound.\n"
    "\n"
    "options:\n"
    "%s"
    "  -np, --parallel N        sequences served at once (default 1)\n"
    "      --json               one JSON object\n"
    "\n"
    "example:\n"
    "  mlxcel inspect -m ./Llama-3.2-1B-Instruct-4bit -c 8192 -np 4 --kv-cache-budget 4Gi\n";

/* Tokens per sequence that `blocks` hold at -np. */
static int64_t fit_per_seq(const engine_kv_plan *p, int64_t blocks) {
    return p->n_parallel ? blocks * p->geom.block_size / p->n_parallel : 0;
}

static void print_plan(const char *model_dir, const io_model_config *c,
                       const model_decode_read *decode, const engine_kv_plan *p,
                       const char *backend, bool json) {
    bool all_local = p->n_local_layers == p->geom.n_layers;
    int64_t fit = all_local ? -1 : fit_per_seq(p, p->kv_blocks);
    int64_t fit_full = fit_per_seq(p, p->kv_blocks_full);
    if (json) {
        json_t *o = json_pack(
            "{s:s, s:s, s:s, s:I, s:i, s:i, s:s, s:I, s:i, s:I, s:I, s:I, s:I, s:I}", "model",
            model_dir, "arch", c->model_type, "backend", backend, "weights_bytes",
            (json_int_t)p->weights_bytes, "ctx_size", p->ctx_size, "parallel", p->n_parallel,
            "kv_dtype", base_dtype_name(p->geom.dtype), "kv_bytes_per_token",
            (json_int_t)p->kv_bytes_per_token, "kv_block_size", p->geom.block_size,
            "kv_bytes_per_block", (json_int_t)p->kv_bytes_per_block,
            "decode_workspace_reserve_bytes", (json_int_t)p->reserve_bytes, "kv_budget_bytes",
            (json_int_t)p->budget_bytes, "kv_blocks", (json_int_t)p->kv_blocks,
            "context_fits_per_seq_full_attention", (json_int_t)fit_full);
        json_object_set_new(o, "context_fits_per_seq", fit < 0 ? json_null() : json_integer(fit));
        json_object_set_new(o, "decode_read_bytes", json_integer((json_int_t)decode->routed));
        json_object_set_new(o, "decode_read_bytes_all_experts",
                            json_integer((json_int_t)decode->all_experts));
        json_object_set_new(o, "kv_local_layers", json_integer(p->n_local_layers));
        if (p->n_local_layers) {
            json_t *l = json_pack("{s:i, s:I, s:I, s:I, s:I}", "window", p->geom.window,
                                  "global_bytes_per_block", (json_int_t)p->global_bytes_per_block,
                                  "local_bytes_per_block", (json_int_t)p->local_bytes_per_block,
                                  "local_blocks", (json_int_t)p->kv_local_blocks,
                                  "local_blocks_per_seq", (json_int_t)p->local_blocks_per_seq);
            json_object_set_new(o, "kv_local", l);
        }
        cli_print_json(o);
        return;
    }
    printf("model            %s (%s, %d layers, %d/%d heads, head_dim %d)\n", model_dir,
           c->model_type, c->num_hidden_layers, c->num_attention_heads, c->num_key_value_heads,
           c->head_dim);
    printf("backend          %s\n", backend);
    printf("weights          %llu bytes\n", (unsigned long long)p->weights_bytes);
    if (c->n_experts)
        printf("decode reads     %llu bytes a step per sequence (routed experts: %d of %d), %llu "
               "with every expert\n",
               (unsigned long long)decode->routed, c->n_experts_used, c->n_experts,
               (unsigned long long)decode->all_experts);
    else
        printf("decode reads     %llu bytes a step per sequence\n",
               (unsigned long long)decode->routed);
    printf("KV per token     %llu bytes (%s, K and V, all layers)\n",
           (unsigned long long)p->kv_bytes_per_token, base_dtype_name(p->geom.dtype));
    printf("KV block         %d tokens, %llu bytes\n", p->geom.block_size,
           (unsigned long long)p->kv_bytes_per_block);
    if (p->n_local_layers)
        printf("KV layers        %d global (%llu bytes a block), %d local keeping a %d-token "
               "window (%llu bytes a block)\n",
               p->geom.n_layers - p->n_local_layers, (unsigned long long)p->global_bytes_per_block,
               p->n_local_layers, p->geom.window, (unsigned long long)p->local_bytes_per_block);
    printf("decode reserve   %llu bytes\n", (unsigned long long)p->reserve_bytes);
    printf("KV budget        %llu bytes\n", (unsigned long long)p->budget_bytes);
    if (!p->n_local_layers) {
        printf("KV blocks        %lld\n", (long long)p->kv_blocks);
        printf("context          %d per sequence (-c); %lld tokens fit per sequence at -np %d\n",
               p->ctx_size, (long long)fit, p->n_parallel);
        return;
    }
    printf("KV blocks        %lld global, %lld local (%lld per sequence)\n",
           (long long)p->kv_blocks, (long long)p->kv_local_blocks,
           (long long)p->local_blocks_per_seq);
    if (all_local)
        printf("context          %d per sequence (-c); every layer is local, so the budget bounds "
               "no context at -np %d (%lld tokens with every layer keeping the whole context)\n",
               p->ctx_size, p->n_parallel, (long long)fit_full);
    else
        printf("context          %d per sequence (-c); %lld tokens fit per sequence at -np %d "
               "with window-bounded local layers, %lld with every layer keeping the whole "
               "context\n",
               p->ctx_size, (long long)fit, p->n_parallel, (long long)fit_full);
}

int cli_cmd_inspect(int argc, char **argv) {
    cli_runtime_flags rtf;
    cli_runtime_init(&rtf);
    bool json = false;
    long np = 1;
    cli_parser p;
    cli_parser_init(&p, "inspect", argc, argv);
    while (cli_next(&p)) {
        if (cli_flag(&p, "-h", "--help")) {
            printf(g_help, cli_runtime_help());
            return CLI_OK;
        }
        if (cli_take_runtime(&p, &rtf) || cli_take_int(&p, "-np", "--parallel", 1, 65536, &np))
            continue;
        if (cli_flag(&p, NULL, "--json")) {
            json = true;
            continue;
        }
        cli_unknown(&p);
    }
    if (cli_done(&p)) return CLI_USAGE;
    if (!rtf.model) return cli_usage_fail("inspect: -m MODEL is required");
    rtf.opts.n_parallel = (int)np;
    base_err err;
    io_model_config cfg;
    io_checkpoint *ck = NULL;
    model_decode_read decode;
    be_backend *be = NULL;
    engine_kv_plan plan;
    if (cli_runtime_resolve(&rtf, &err) || model_config_load(rtf.model, &cfg, NULL, &err))
        return cli_fail(&err);
    int rc = model_checkpoint_open(rtf.model, &cfg, false, &ck, &err);
    if (rc == 0) rc = model_checkpoint_decode_bytes(&cfg, ck, &decode, &err);
    if (rc == 0) rc = engine_backend_open(&rtf.opts, &be, &err);
    if (rc == 0) rc = engine_plan_kv(&cfg, io_checkpoint_bytes(ck), be, &rtf.opts, &plan, &err);
    if (rc == 0) print_plan(rtf.model, &cfg, &decode, &plan, be->name, json);
    if (be) be_destroy(be);
    io_checkpoint_close(ck);
    io_config_free(&cfg);
    return rc ? cli_fail(&err) : CLI_OK;
}
