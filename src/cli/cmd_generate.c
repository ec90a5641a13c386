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
    long n_predict;
    engine_sampling sampling;
    bool json;
} gen_flags;

static bool take_sampling(cli_parser *p, engine_sampling *s) {
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
    if (cli_take(p, NULL, "--seed", &str)) {
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

static int load_prompt(const char *flag, const char *text, int32_t **ids, int *n) {
    char msg[512];
    if (cli_parse_ids(flag, text, ids, n, msg, sizeof msg)) return cli_usage_fail("%s", msg);
    return CLI_OK;
}

static void print_json_result(const engine_generate_result *res, int n_prompt) {
    json_t *o = json_object(), *toks = json_array();
    for (int i = 0; i < res->n_tokens; i++) json_array_append_new(toks, json_integer(res->tokens[i]));
    json_object_set_new(o, "tokens", toks);
    json_object_set_new(o, "n_prompt", json_integer(n_prompt));
    json_object_set_new(o, "stopped_by_eos", json_boolean(res->stopped_by_eos));
    json_object_set_new(o, "prefill_seconds", json_real(res->prefill_seconds));
    json_object_set_new(o, "decode_seconds", json_real(res->decode_seconds));
    char *s = json_dumps(o, JSON_COMPACT);
    printf("%s\n", s);
    free(s);
    json_decref(o);
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
            cli_take_int(&p, "-n", "--n-predict", -1, 1 << 24, &f.n_predict) ||
            take_sampling(&p, &f.sampling))
            continue;
        if (cli_flag(&p, NULL, "--json")) {
            f.json = true;
            continue;
        }
        cli_unknown(&p);
    }
    if (cli_done(&p)) return CLI_USAGE;
    if (!f.rt.model) return cli_usage_fail("generate: -m MODEL is required");
    if (!f.tokens) return cli_usage_fail("generate: give a prompt with -p TEXT or --tokens IDS");
    int32_t *prompt;
    int n_prompt;
    if (load_prompt("--tokens", f.tokens, &prompt, &n_prompt)) return CLI_USAGE;
    base_err err;
    engine_runtime *rt;
    if (engine_runtime_open(f.rt.model, &f.rt.opts, &rt, &err)) {
        free(prompt);
        return cli_fail(&err);
    }
    engine_generate_result res;
    int max_new = f.n_predict < 0 ? rt->ctx_size : (int)f.n_predict;
    int rc = engine_generate(rt, prompt, n_prompt, max_new, &f.sampling, NULL, NULL, &res, &err);
    if (rc == 0) {
        if (f.json) {
            print_json_result(&res, n_prompt);
        } else {
            for (int i = 0; i < res.n_tokens; i++) printf(i ? ",%d" : "%d", res.tokens[i]);
            printf("\n");
        }
        free(res.tokens);
    }
    engine_runtime_close(rt);
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
    if (engine_runtime_open(rtf.model, &rtf.opts, &rt, &err)) {
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
