/* `mlxcel quantize`: a dense checkpoint to MLX affine bits / group size, or MXFP4. */
#include "cli/cli.h"
#include "model/model.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

static const char *g_help =
    "usage: mlxcel quantize -m IN_DIR -o OUT_DIR [--mode affine] [--bits 4] [--group-size 64]\n"
    "\n"
    "Writes an MLX-quantized copy of a bf16/f16/f32 checkpoint, with the tensor names and\n"
    "config.json `quantization` block mlx-lm's convert writes (MLX loads it too). Linear and\n"
    "embedding weights and stacked experts are quantized; norms stay dense; a mixture-of-\n"
    "experts model's routers stay at 8 bits affine, group 64, as mlx-lm keeps them. Tokenizer\n"
    "files are copied.\n"
    "\n"
    "options:\n"
    "  -m, --model DIR          the dense checkpoint\n"
    "  -o, --output DIR         where to write (created if missing)\n"
    "      --mode MODE          affine (scale and bias per group) or mxfp4 (E2M1 codes, one\n"
    "                           power-of-two scale per 32 values); default affine\n"
    "      --bits N             affine: 2, 3, 4, 5, 6 or 8 (default 4); mxfp4: 4\n"
    "      --group-size N       affine: 32, 64 or 128 (default 64); mxfp4: 32\n"
    "\n"
    "examples:\n"
    "  mlxcel quantize -m ./Llama-3.2-1B -o ./Llama-3.2-1B-4bit --bits 4 --group-size 64\n"
    "  mlxcel quantize -m ./gpt-oss-20b-bf16 -o ./gpt-oss-20b-mxfp4 --mode mxfp4\n";

/* --mode's value into spec, with the mode's default bits and group size unless given. */
static int parse_mode(const char *mode, long bits, long group, io_quant_spec *spec) {
    if (strcmp(mode, "affine") == 0) {
        *spec = (io_quant_spec){(int)(bits ? bits : 4), (int)(group ? group : 64), IO_QUANT_AFFINE};
        return 0;
    }
    if (strcmp(mode, "nvfp4") == 0 || strcmp(mode, "mxfp8") == 0)
        return cli_usage_fail("quantize: --mode %s is not implemented (affine or mxfp4)", mode);
    if (strcmp(mode, "mxfp4") != 0)
        return cli_usage_fail("quantize: --mode wants affine or mxfp4, got %s", mode);
    /* MXFP4's format fixes both: 4-bit codes in groups of 32. */
    if (bits && bits != 4)
        return cli_usage_fail("quantize: --bits %ld does not go with --mode mxfp4 (4 only)", bits);
    if (group && group != 32)
        return cli_usage_fail("quantize: --group-size %ld does not go with --mode mxfp4 (32 only)",
                              group);
    *spec = (io_quant_spec){4, 32, IO_QUANT_MXFP4};
    return 0;
}

int cli_cmd_quantize(int argc, char **argv) {
    const char *in = NULL, *out = NULL, *mode = "affine";
    long bits = 0, group = 0; /* 0: the mode's default */
    cli_parser p;
    cli_parser_init(&p, "quantize", argc, argv);
    while (cli_next(&p)) {
        if (cli_flag(&p, "-h", "--help")) {
            fputs(g_help, stdout);
            return CLI_OK;
        }
        if (cli_take(&p, "-m", "--model", &in) || cli_take(&p, "-o", "--output", &out) ||
            cli_take(&p, NULL, "--mode", &mode) || cli_take_int(&p, NULL, "--bits", 2, 8, &bits) ||
            cli_take_int(&p, NULL, "--group-size", 32, 128, &group))
            continue;
        cli_unknown(&p);
    }
    if (cli_done(&p)) return CLI_USAGE;
    if (!in || !out) return cli_usage_fail("quantize: -m IN_DIR and -o OUT_DIR are required");
    if (bits == 7) return cli_usage_fail("quantize: --bits wants 2, 3, 4, 5, 6 or 8, got 7");
    if (group && group != 32 && group != 64 && group != 128)
        return cli_usage_fail("quantize: --group-size wants 32, 64 or 128, got %ld", group);
    io_quant_spec spec;
    if (parse_mode(mode, bits, group, &spec)) return CLI_USAGE;
    if (mkdir(out, 0755) != 0 && errno != EEXIST)
        return cli_usage_fail("quantize: %s: %s", out, strerror(errno));
    base_err err;
    if (model_quantize(in, out, spec, &err)) return cli_fail(&err);
    return CLI_OK;
}
