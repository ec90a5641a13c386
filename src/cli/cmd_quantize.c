/* `mlxcel quantize`: a dense checkpoint to MLX affine bits / group size. */
#include "cli/cli.h"
#include "model/model.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

static const char *g_help =
    "usage: mlxcel quantize -m IN_DIR -o OUT_DIR [--bits 4] [--group-size 64]\n"
    "\n"
    "Writes an MLX affine-quantized copy of a bf16/f16/f32 checkpoint, with the tensor names\n"
    "and config.json `quantization` block mlx-lm writes (MLX loads it too). Linear and\n"
    "embedding weights are quantized; norms stay dense. Tokenizer files are copied.\n"
    "\n"
    "options:\n"
    "  -m, --model DIR          the dense checkpoint\n"
    "  -o, --output DIR         where to write (created if missing)\n"
    "      --bits N             2, 3, 4, 5, 6 or 8 (default 4)\n"
    "      --group-size N       32, 64 or 128 (default 64)\n"
    "\n"
    "example:\n"
    "  mlxcel quantize -m ./Llama-3.2-1B -o ./Llama-3.2-1B-4bit --bits 4 --group-size 64\n";

int cli_cmd_quantize(int argc, char **argv) {
    const char *in = NULL, *out = NULL;
    long bits = 4, group = 64;
    cli_parser p;
    cli_parser_init(&p, "quantize", argc, argv);
    while (cli_next(&p)) {
        if (cli_flag(&p, "-h", "--help")) {
            fputs(g_help, stdout);
            return CLI_OK;
        }
        if (cli_take(&p, "-m", "--model", &in) || cli_take(&p, "-o", "--output", &out) ||
            cli_take_int(&p, NULL, "--bits", 2, 8, &bits) ||
            cli_take_int(&p, NULL, "--group-size", 32, 128, &group))
            continue;
        cli_unknown(&p);
    }
    if (cli_done(&p)) return CLI_USAGE;
    if (!in || !out) return cli_usage_fail("quantize: -m IN_DIR and -o OUT_DIR are required");
    if (bits == 7) return cli_usage_fail("quantize: --bits wants 2, 3, 4, 5, 6 or 8, got 7");
    if (group != 32 && group != 64 && group != 128)
        return cli_usage_fail("quantize: --group-size wants 32, 64 or 128, got %ld", group);
    if (mkdir(out, 0755) != 0 && errno != EEXIST)
        return cli_usage_fail("quantize: %s: %s", out, strerror(errno));
    base_err err;
    if (model_quantize(in, out, (int)bits, (int)group, &err)) return cli_fail(&err);
    return CLI_OK;
}
