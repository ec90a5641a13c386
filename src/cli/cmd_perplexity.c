/* `mlxcel perplexity`: perplexity of a text file the way llama.cpp's perplexity tool computes
 * it, so that the figures compare. */
#include "cli/cli_runtime.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *g_help =
    "usage: mlxcel perplexity -m MODEL -f TEXT_FILE [-c CTX] [options]\n"
    "\n"
    "As llama-perplexity does: tokenizes the whole file (with the tokenizer's BOS), cuts it\n"
    "into non-overlapping windows of CTX tokens (a shorter last window is dropped), makes the\n"
    "first token of each window BOS, runs each window on its own and scores the predictions of\n"
    "its second half: PPL = exp(mean negative log-likelihood).\n"
    "\n"
    "options:\n"
    "%s"
    "  -f, --file FILE          the text\n"
    "      --chunks N           score only the first N windows (default: all)\n"
    "\n"
    "example:\n"
    "  mlxcel perplexity -f heldout.txt -c 256\n";

/* Sum of -log p(token[j] | tokens[<j]) for j in [first, n), from the logits of every
 * position. */
static double window_nll(const float *logits, const int32_t *tokens, int first, int n, int vocab) {
    double nll = 0;
    for (int j = first; j < n; j++) {
        const float *row = logits + (size_t)(j - 1) * vocab;
        float mx = row[0];
        for (int v = 1; v < vocab; v++) mx = row[v] > mx ? row[v] : mx;
        double sum = 0;
        for (int v = 0; v < vocab; v++) sum += exp((double)row[v] - mx);
        nll -= (double)row[tokens[j]] - mx - log(sum);
    }
    return nll;
}

int cli_cmd_perplexity(int argc, char **argv) {
    cli_runtime_flags rtf;
    cli_runtime_init(&rtf);
    const char *file = NULL;
    long chunks = -1;
    cli_parser p;
    cli_parser_init(&p, "perplexity", argc, argv);
    while (cli_next(&p)) {
        if (cli_flag(&p, "-h", "--help")) {
            printf(g_help, cli_runtime_help());
            return CLI_OK;
        }
        if (cli_take_runtime(&p, &rtf) || cli_take(&p, "-f", "--file", &file) ||
            cli_take_int(&p, NULL, "--chunks", 1, 1 << 30, &chunks))
            continue;
        cli_unknown(&p);
    }
    if (cli_done(&p)) return CLI_USAGE;
    if (!rtf.model || !file) return cli_usage_fail("perplexity: -m MODEL and -f FILE are required");
    if (rtf.opts.ctx_size <= 0) rtf.opts.ctx_size = 512;
    base_err err;
    if (cli_runtime_resolve(&rtf, &err)) return cli_fail(&err);
    char *text;
    if (base_read_file(file, &text, NULL, &err)) return cli_fail(&err);
    engine_prompter *pr;
    int32_t *ids = NULL;
    int n = 0;
    int rc = engine_prompter_open(rtf.model, NULL, &pr, &err);
    if (rc == 0) {
        rc = engine_prompter_encode_text(pr, text, 0, &ids, &n, &err);
        engine_prompter_close(pr);
    }
    free(text);
    engine_runtime *rt = NULL;
    if (rc == 0) rc = engine_runtime_open(rtf.model, &rtf.opts, &rt, &err);
    int ctx = rc == 0 ? rt->kv_plan.ctx_size : 0, windows = ctx ? n / ctx : 0;
    if (chunks > 0 && windows > chunks) windows = (int)chunks;
    if (rc == 0 && windows == 0)
        rc = base_fail(&err, "%s: %d tokens is less than one window of %d (-c)", file, n, ctx);
    int32_t bos = rt ? model_config(rt->model)->bos_token_id : -1;
    int32_t *window = base_xmalloc((size_t)(ctx ? ctx : 1) * sizeof *window);
    int first = ctx / 2 > 0 ? ctx / 2 : 1;
    double nll = 0;
    long scored = 0;
    for (int w = 0; w < windows && rc == 0; w++) {
        float *logits;
        memcpy(window, ids + (size_t)w * ctx, (size_t)ctx * sizeof *window);
        if (bos >= 0) window[0] = bos;
        rc = engine_prefill_logits(rt, window, ctx, &logits, NULL, &err);
        if (rc) break;
        nll += window_nll(logits, window, first + 1, ctx, model_config(rt->model)->vocab_size);
        scored += ctx - 1 - first;
        free(logits);
        fprintf(stderr, "[%d]%.4f%s", w + 1, exp(nll / (double)scored),
                w + 1 < windows ? "," : "\n");
    }
    if (rc == 0)
        printf("perplexity: %.4f over %ld tokens in %d windows of %d\n", exp(nll / (double)scored),
               scored, windows, ctx);
    engine_runtime_close(rt);
    free(window);
    free(ids);
    return rc ? cli_fail(&err) : CLI_OK;
}
