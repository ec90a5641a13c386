/* `mlxcel generate` and `mlxcel logits`. */
#include "cli/cli_runtime.h"
#include "io/io.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static const char *g_generate_help =
    "usage: mlxcel generate -m MODEL (-p TEXT | --tokens 1,2,3) [options]\n"
    "\n"
    "Generates a continuation of the prompt.\n"
    "\n"
    "options:\n"
    "%s"
    "  -p, --prompt TEXT        prompt text (tokenized with the model's tokenizer)\n"
    "      --tokens IDS         prompt as comma-separated token ids\n"
    "  -n, --n-predict N        tokens to generate (default 128)\n"
    "      --temp T             temperature; 0 = greedy (default 0.8)\n"
    "      --top-k K            (default 40; 0 = off)\n"
    "      --top-p P            (default 0.95; 1 = off)\n"
    "      --min-p P            (default 0.05; 0 = off)\n"
    "      --repeat-penalty R   (default 1 = off)\n"
    "      --seed S             random seed (default: from the clock)\n"
    "      --json               print one JSON object as the last line of stdout\n"
    "\n"
    "example:\n"
    "  mlxcel generate -m tests/fixtures/llama-bf16 --tokens 1,2,3 -n 8 --temp 0 --json\n";

typedef struct gen_flags {
    cli_runtime_flags rt;
    const char *tokens;
    const char *prompt;
    long n_predict;
    engine_sampling sampling;
    bool json;
} gen_flags;

static int load_prompt(const char *flag, const char *text, int32_t **ids, int *n) {
    char msg[512];
    if (cli_parse_ids(flag, text, ids, n, msg, sizeof msg)) return cli_usage_fail("%s", msg);
    return CLI_OK;
}

static void print_json_result(const engine_generate_result *res, int n_prompt, const char *text) {
    json_t *o = json_object(), *toks = json_array();
    for (int i = 0; i < res->n_tokens; i++)
        json_array_append_new(toks, json_integer(res->tokens[i]));
    json_object_set_new(o, "tokens", toks);
    if (text) json_object_set_new(o, "text", json_string(text));
    json_object_set_new(o, "n_prompt", json_integer(n_prompt));
    json_object_set_new(o, "stopped_by_eos", json_boolean(res->stopped_by_eos));
    json_object_set_new(o, "prefill_seconds", json_real(res->prefill_seconds));
    json_object_set_new(o, "decode_seconds", json_real(res->decode_seconds));
    cli_print_json(o);
}

int cli_cmd_generate(int argc, char **argv) {
    gen_flags f = {.n_predict = 128};
    cli_runtime_init(&f.rt);
    engine_sampling_defaults(&f.sampling);
    cli_parser p;
    cli_parser_init(&p, "generate", argc, argv);
    while (cli_next(&p)) {
        if (cli_flag(&p, "-h", "--help")) {
            printf(g_generate_help, cli_runtime_help());
            return CLI_OK;
        }
        if (cli_take_runtime(&p, &f.rt) || cli_take(&p, NULL, "--tokens", &f.tokens) ||
            cli_take(&p, "-p", "--prompt", &f.prompt) ||
            cli_take_int(&p, "-n", "--n-predict", -1, 1 << 24, &f.n_predict) ||
            cli_take_sampling(&p, &f.sampling))
            continue;
        if (cli_flag(&p, NULL, "--json")) {
            f.json = true;
            continue;
        }
        cli_unknown(&p);
    }
    if (cli_done(&p)) return CLI_USAGE;
    if (!f.rt.model) return cli_usage_fail("generate: -m MODEL is required");
    if (!f.tokens == !f.prompt)
        return cli_usage_fail("generate: give a prompt with either -p TEXT or --tokens IDS");
    base_err err;
    if (cli_runtime_resolve(&f.rt, &err)) return cli_fail(&err);
    engine_prompter *pr = NULL;
    int32_t *prompt;
    int n_prompt;
    if (f.tokens) {
        if (load_prompt("--tokens", f.tokens, &prompt, &n_prompt)) return CLI_USAGE;
    } else if (engine_prompter_open(f.rt.model, NULL, &pr, &err) ||
               engine_prompter_encode_text(pr, f.prompt, 0, &prompt, &n_prompt, &err)) {
        engine_prompter_close(pr);
        return cli_fail(&err);
    }
    engine_runtime *rt;
    int rc = engine_runtime_open(f.rt.model, &f.rt.opts, &rt, &err);
    engine_generate_result res = {0};
    if (rc == 0) {
        int max_new = f.n_predict < 0 ? rt->kv_plan.ctx_size : (int)f.n_predict;
        rc = engine_generate(rt, prompt, n_prompt, max_new, &f.sampling, NULL, NULL, &res, &err);
        engine_runtime_close(rt);
    }
    char *text = NULL;
    size_t len;
    if (rc == 0 && pr)
        rc = tok_decode_continued(pr->tok, res.tokens, (size_t)res.n_tokens, true, &text, &len,
                                  &err);
    if (rc == 0) {
        if (f.json) {
            if (text) printf("%s\n", text);
            print_json_result(&res, n_prompt, text);
        } else if (text) {
            printf("%s%s\n", f.prompt, text);
        } else {
            for (int i = 0; i < res.n_tokens; i++) printf(i ? ",%d" : "%d", res.tokens[i]);
            printf("\n");
        }
    }
    free(text);
    free(res.tokens);
    engine_prompter_close(pr);
    free(prompt);
    return rc ? cli_fail(&err) : CLI_OK;
}

static const char *g_logits_help =
    "usage: mlxcel logits -m MODEL --tokens 1,2,3 -o OUT.npy [options]\n"
    "\n"
    "Writes the logits of every position as float32 [n_tokens, vocab] in .npy format.\n"
    "\n"
    "options:\n"
    "%s"
    "      --tokens IDS         comma-separated token ids\n"
    "  -o, --output FILE        the .npy file to write\n"
    "\n"
    "example:\n"
    "  mlxcel logits -m tests/fixtures/llama-bf16 --tokens 1,2,3 -o /tmp/logits.npy\n";

int cli_cmd_logits(int argc, char **argv) {
    cli_runtime_flags rtf;
    cli_runtime_init(&rtf);
    const char *tokens = NULL, *output = NULL;
    cli_parser p;
    cli_parser_init(&p, "logits", argc, argv);
    while (cli_next(&p)) {
        if (cli_flag(&p, "-h", "--help")) {
            printf(g_logits_help, cli_runtime_help());
            return CLI_OK;
        }
        if (cli_take_runtime(&p, &rtf) || cli_take(&p, NULL, "--tokens", &tokens) ||
            cli_take(&p, "-o", "--output", &output))
            continue;
        cli_unknown(&p);
    }
    if (cli_done(&p)) return CLI_USAGE;
    if (!rtf.model) return cli_usage_fail("logits: -m MODEL is required");
    if (!tokens) return cli_usage_fail("logits: --tokens IDS is required");
    if (!output) return cli_usage_fail("logits: -o OUT.npy is required");
    int32_t *ids;
    int n;
    if (load_prompt("--tokens", tokens, &ids, &n)) return CLI_USAGE;
    if (rtf.opts.ctx_size <= 0) rtf.opts.ctx_size = n;
    base_err err;
    engine_runtime *rt;
    if (cli_runtime_resolve(&rtf, &err) || engine_runtime_open(rtf.model, &rtf.opts, &rt, &err)) {
        free(ids);
        return cli_fail(&err);
    }
    float *logits;
    int rc = engine_prefill_logits(rt, ids, n, &logits, NULL, &err);
    if (rc == 0) {
        int64_t shape[2] = {n, model_config(rt->model)->vocab_size};
        rc = io_npy_write_f32(output, logits, shape, 2, &err);
        free(logits);
    }
    engine_runtime_close(rt);
    free(ids);
    return rc ? cli_fail(&err) : CLI_OK;
}
