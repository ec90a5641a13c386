/* `mlxcel tokenize` (stdin -> JSON ids) and `mlxcel detokenize` (ids -> text). */
#include "cli/cmd_tokenize.h"

#include "cli/cli.h"
#include "cli/cmd_models.h"
#include "tokenizer/tokenizer.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

static const char k_tokenize_help[] =
    "usage: mlxcel tokenize -m MODEL [--no-special] < text\n"
    "\n"
    "Reads all of stdin and prints its token ids as one JSON array on one line.\n"
    "\n"
    "  -m, --model M     directory with tokenizer.json (and tokenizer_config.json), or a\n"
    "                    Hugging Face repo id owner/name, or a name (mlx-community/name)\n"
    "  --offline         never download (also HF_HUB_OFFLINE=1)\n"
    "  --no-special      do not add the post-processor's special tokens (e.g. BOS)\n"
    "  -h, --help        show this help\n"
    "\n"
    "example:\n"
    "  echo -n 'Hello world' | mlxcel tokenize -m models/Llama-3.2-1B-Instruct-4bit\n";

static const char k_detokenize_help[] =
    "usage: mlxcel detokenize -m MODEL --tokens 1,2,3 [--skip-special]\n"
    "\n"
    "Prints the text of the token ids, with nothing added (no newline).\n"
    "\n"
    "  -m, --model M     directory with tokenizer.json (and tokenizer_config.json), or a\n"
    "                    Hugging Face repo id owner/name, or a name (mlx-community/name)\n"
    "  --offline         never download (also HF_HUB_OFFLINE=1)\n"
    "  --tokens IDS      comma-separated token ids\n"
    "  --skip-special    leave special tokens out of the text\n"
    "  -h, --help        show this help\n"
    "\n"
    "example:\n"
    "  mlxcel detokenize -m models/Llama-3.2-1B-Instruct-4bit --tokens 9906,1917\n";

static int read_stdin(char **data, size_t *len, base_err *err) {
    size_t cap = 1 << 16, n = 0;
    char *buf = base_xmalloc(cap);
    for (;;) {
        if (n == cap) buf = base_xrealloc(buf, cap *= 2);
        size_t got = fread(buf + n, 1, cap - n, stdin);
        n += got;
        if (got == 0) break;
    }
    if (ferror(stdin)) {
        free(buf);
        return base_fail(err, "tokenize: cannot read stdin");
    }
    *data = buf;
    *len = n;
    return 0;
}

int cli_cmd_tokenize(int argc, char **argv) {
    const char *model = NULL;
    bool special = true, offline = false;
    char dir[PATH_MAX];
    cli_parser p;
    cli_parser_init(&p, "tokenize", argc, argv);
    while (cli_next(&p)) {
        if (cli_flag(&p, "-h", "--help")) {
            fputs(k_tokenize_help, stdout);
            return CLI_OK;
        }
        if (cli_take_model(&p, &model, &offline)) continue;
        if (cli_flag(&p, NULL, "--no-special")) {
            special = false;
            continue;
        }
        cli_unknown(&p);
    }
    if (p.status == CLI_OK && !model) cli_usage(&p, "tokenize: -m MODEL is required");
    if (cli_done(&p)) return CLI_USAGE;

    base_err err;
    tok_tokenizer *tok;
    if (cli_model_resolve(&model, offline, dir, sizeof dir, &err) || tok_load(model, 0, &tok, &err))
        return cli_fail(&err);
    char *text = NULL;
    size_t len = 0, n = 0;
    int32_t *ids = NULL;
    if (read_stdin(&text, &len, &err) || tok_encode(tok, text, len, special, &ids, &n, &err)) {
        free(text);
        tok_free(tok);
        return cli_fail(&err);
    }
    putchar('[');
    for (size_t i = 0; i < n; i++) printf(i ? ",%d" : "%d", ids[i]);
    fputs("]\n", stdout);
    free(ids);
    free(text);
    tok_free(tok);
    return CLI_OK;
}

int cli_cmd_detokenize(int argc, char **argv) {
    const char *model = NULL, *tokens = NULL;
    bool skip = false, offline = false;
    char dir[PATH_MAX];
    cli_parser p;
    cli_parser_init(&p, "detokenize", argc, argv);
    while (cli_next(&p)) {
        if (cli_flag(&p, "-h", "--help")) {
            fputs(k_detokenize_help, stdout);
            return CLI_OK;
        }
        if (cli_take_model(&p, &model, &offline)) continue;
        if (cli_take(&p, NULL, "--tokens", &tokens)) continue;
        if (cli_flag(&p, NULL, "--skip-special")) {
            skip = true;
            continue;
        }
        cli_unknown(&p);
    }
    if (p.status == CLI_OK && !model) cli_usage(&p, "detokenize: -m MODEL is required");
    if (p.status == CLI_OK && !tokens) cli_usage(&p, "detokenize: --tokens IDS is required");
    if (cli_done(&p)) return CLI_USAGE;
    int32_t *ids;
    int n;
    char msg[512];
    if (cli_parse_ids("--tokens", tokens, &ids, &n, msg, sizeof msg))
        return cli_usage_fail("detokenize: %s", msg);

    base_err err;
    tok_tokenizer *tok;
    if (cli_model_resolve(&model, offline, dir, sizeof dir, &err) ||
        tok_load(model, 0, &tok, &err)) {
        free(ids);
        return cli_fail(&err);
    }
    char *text;
    size_t len;
    int rc = tok_decode(tok, ids, (size_t)n, skip, &text, &len, &err);
    free(ids);
    tok_free(tok);
    if (rc) return cli_fail(&err);
    fwrite(text, 1, len, stdout);
    free(text);
    return CLI_OK;
}
