/* `mlxcel`: dispatches to a subcommand. */
#include "model/arch/arch.h"
#include "cli/cli.h"
#include "cli/cmd_models.h"
#include "io/io.h"
#include "cli/cmd_tokenize.h"

#include <string.h>

typedef struct cli_command {
    const char *name;
    cli_cmd_fn fn;
    const char *summary;
} cli_command;

static const cli_command g_commands[] = {
    {"arch", cli_cmd_arch, "list the supported model families and weight formats"},
    {"bench", cli_cmd_bench, "prompt and generation throughput against the memory ceiling"},
    {"detokenize", cli_cmd_detokenize, "print the text of token ids"},
    {"generate", cli_cmd_generate, "generate a continuation of a prompt"},
    {"inspect", cli_cmd_inspect, "memory breakdown of a model: weights, KV blocks, context"},
    {"list", cli_cmd_list, "models in the store and the Hugging Face cache, with sizes"},
    {"logits", cli_cmd_logits, "write the logits of every position to a .npy file"},
    {"perplexity", cli_cmd_perplexity, "perplexity of a text file"},
    {"quantize", cli_cmd_quantize, "convert a bf16/f16 checkpoint to MLX affine bits"},
    {"rm", cli_cmd_rm, "delete a model from the store"},
    {"run", cli_cmd_run, "chat with a model (the demo model when none is given)"},
    {"template", cli_cmd_template, "render a model's chat template over a conversation"},
    {"tokenize", cli_cmd_tokenize, "print the token ids of stdin as a JSON array"},
    {NULL, NULL, NULL},
};

int cli_cmd_arch(int argc, char **argv) {
    if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        printf("usage: mlxcel arch\n\nLists the model families, weight formats and RoPE scalings "
               "mlxcel runs.\n\nexample:\n  mlxcel arch\n");
        return CLI_OK;
    }
    if (argc > 1) return cli_usage_fail("arch: unexpected argument '%s'", argv[1]);
    int n;
    const model_arch *const *archs = model_arch_all(&n);
    printf("families (config.json model_type):\n");
    for (int i = 0; i < n; i++) printf("  %-12s %s\n", archs[i]->model_type, archs[i]->summary);
    printf("weights:  dense F32, F16, BF16; MLX affine-quantized, bits 2, 3, 4, 5, 6, 8 with "
           "group sizes 32, 64, 128 (per-module overrides); MXFP4 (on CUDA in stacked experts "
           "only)\n");
    printf("rope:     default, linear, dynamic, llama3, yarn, longrope; partial rotary\n");
    printf("attention: sliding windows (all layers or per layer; a local layer keeps only its "
           "window in the KV cache), attention sinks, score and logit soft-capping\n");
    printf("cuda:     attention head_dim 32, 64, 96, 128 or 256; the tensor-core prefill and the "
           "small-batch decode kernels take head_dim 64 and 128 without soft-cap, window or "
           "sinks, other layers the generic kernel (a window or sinks: decode not split over "
           "the context)\n");
    return CLI_OK;
}

static void print_usage(FILE *f) {
    fprintf(f, "usage: mlxcel <command> [options]\n\ncommands:\n");
    for (const cli_command *c = g_commands; c->name; c++)
        fprintf(f, "  %-12s %s\n", c->name, c->summary);
    fprintf(f, "\nRun 'mlxcel <command> --help' for a command's options.\n");
}

int main(int argc, char **argv) {
    cli_log_from_env();
    if (argc < 2) {
        print_usage(stderr);
        return CLI_USAGE;
    }
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0 ||
        strcmp(argv[1], "help") == 0) {
        print_usage(stdout);
        return CLI_OK;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("mlxcel 0.1.0\n");
        return CLI_OK;
    }
    for (const cli_command *c = g_commands; c->name; c++)
        if (strcmp(argv[1], c->name) == 0) return c->fn(argc - 1, argv + 1);
    return cli_usage_fail("unknown command '%s' (see mlxcel --help)", argv[1]);
}
