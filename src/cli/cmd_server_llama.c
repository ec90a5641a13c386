/* The llama-server flags a launch script is likely to carry, so that the script runs unchanged:
 * taken where they mean something here (batch limits, KV dtype, chat template, keys, endpoint
 * switches, logging), accepted with a one-line note where they are moot (mlxcel always runs
 * every layer on the one device, with its own attention kernels and continuous batching, and
 * reads weights through mmap), refused with the reason where following them silently would
 * change what a client gets (--ctx-shift). */
#include "cli/cmd_server_flags.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void note(const char *flag, const char *why) {
    fprintf(stderr, "mlxcel-server: note: %s is moot here: %s\n", flag, why);
}

/* A Jinja template for the built-in names of llama-server that a model's own template does
 * not already cover and that render the same here; NULL for a name we know but cannot map. */
static const struct {
    const char *name, *jinja;
} g_builtin[] = {
    {"chatml", "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
               "message['content'] + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt "
               "%}{{ '<|im_start|>assistant\\n' }}{% endif %}"},
    {"llama3", "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + "
               "message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + "
               "'<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}{{ "
               "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"},
};

/* llama-server's other built-in names (llama_chat_apply_template's list). */
static const char *const g_unmapped[] = {
    "llama2",
    "llama2-sys",
    "llama2-sys-bos",
    "llama2-sys-strip",
    "mistral-v1",
    "mistral-v3",
    "mistral-v3-tekken",
    "mistral-v7",
    "mistral-v7-tekken",
    "phi3",
    "phi4",
    "falcon3",
    "zephyr",
    "monarch",
    "gemma",
    "orion",
    "openchat",
    "vicuna",
    "vicuna-orca",
    "deepseek",
    "deepseek2",
    "deepseek3",
    "command-r",
    "chatglm3",
    "chatglm4",
    "glmedge",
    "minicpm",
    "exaone3",
    "exaone4",
    "rwkv-world",
    "granite",
    "gigachat",
    "megrez",
    "yandex",
    "bailing",
    "llama4",
    "smolvlm",
    "hunyuan-moe",
    "gpt-oss",
    "hunyuan-dense",
    "kimi-k2",
    "seed_oss",
    "grok-2",
};

/* --chat-template NAME|JINJA: text with a Jinja tag is the template itself; else a name. */
static void take_template(cli_parser *p, server_flags *f, const char *v) {
    if (strstr(v, "{%") || strstr(v, "{{")) {
        f->template_text = v;
        return;
    }
    for (size_t i = 0; i < sizeof g_builtin / sizeof *g_builtin; i++)
        if (strcmp(v, g_builtin[i].name) == 0) {
            f->template_text = g_builtin[i].jinja;
            return;
        }
    for (size_t i = 0; i < sizeof g_unmapped / sizeof *g_unmapped; i++)
        if (strcmp(v, g_unmapped[i]) == 0) {
            cli_usage(p,
                      "%s: --chat-template: llama-server's built-in template '%s' has no "
                      "equivalent here (chatml and llama3 do): give its Jinja text to "
                      "--chat-template or --chat-template-file, or leave the flag out to use the "
                      "model's own template",
                      p->command, v);
            return;
        }
    cli_usage(p,
              "%s: --chat-template: '%s' is neither Jinja text nor a built-in template name "
              "(chatml, llama3)",
              p->command, v);
}

/* -fa [on|off|auto]: the value is optional, as in llama-server's older spelling. */
static bool take_flash_attn(cli_parser *p) {
    static const char *const values[] = {"on", "off", "auto", "1", "0", "true", "false"};
    const char *arg = cli_arg(p), *eq = strchr(arg, '=');
    size_t n = eq ? (size_t)(eq - arg) : strlen(arg);
    bool is_short = strcmp(arg, "-fa") == 0;
    if (!cli_flag(p, "-fa", NULL) && !(n == 12 && strncmp(arg, "--flash-attn", 12) == 0))
        return false;
    const char *v = eq ? eq + 1 : NULL;
    if (!v && p->i + 1 < p->argc) {
        for (size_t i = 0; i < sizeof values / sizeof *values; i++)
            if (strcmp(p->argv[p->i + 1], values[i]) == 0) v = p->argv[++p->i];
    }
    if (v && eq) {
        size_t i = 0;
        while (i < sizeof values / sizeof *values && strcmp(v, values[i]) != 0) i++;
        if (i == sizeof values / sizeof *values) {
            cli_usage(p, "%s: --flash-attn wants on, off or auto, got '%s'", p->command, v);
            return true;
        }
    }
    note(is_short ? "-fa" : "--flash-attn",
         "attention always runs in mlxcel's own fused kernels (paged decode, flash-style "
         "prefill)");
    return true;
}

/* Flags that change nothing here: taken (with their value) and noted. */
static bool take_moot(cli_parser *p) {
    const char *v;
    if (cli_take(p, "-ngl", "--n-gpu-layers", &v) || cli_take(p, NULL, "--gpu-layers", &v)) {
        char *end;
        if (v && strcmp(v, "auto") != 0 && strcmp(v, "all") != 0 && (strtol(v, &end, 10), *end))
            cli_usage(p, "%s: -ngl wants a number of layers, auto or all, got '%s'", p->command, v);
        else
            note("-ngl", "every layer runs on the device --device picks (CUDA when present)");
        return true;
    }
    if (take_flash_attn(p)) return true;
    if (cli_flag(p, "-cb", "--cont-batching") || cli_flag(p, "-nocb", "--no-cont-batching")) {
        note(cli_arg(p), "batching is always continuous here");
        return true;
    }
    if (cli_flag(p, NULL, "--jinja") || cli_flag(p, NULL, "--no-jinja")) {
        note(cli_arg(p), "chat templates are always rendered as Jinja here");
        return true;
    }
    if (cli_flag(p, NULL, "--mlock")) {
        note("--mlock", "weights are copied into backend memory, not paged from the file");
        return true;
    }
    if (cli_flag(p, NULL, "--no-mmap") || cli_flag(p, NULL, "--mmap")) {
        note(cli_arg(p), "safetensors are always mapped, then copied into backend memory");
        return true;
    }
    if (cli_flag(p, NULL, "--no-context-shift")) {
        note("--no-context-shift", "context is never shifted here");
        return true;
    }
    return false;
}

static bool take_cache_type(cli_parser *p, server_flags *f) {
    return cli_take(p, "-ctk", "--cache-type-k", &f->cache_type_k) ||
           cli_take(p, "-ctv", "--cache-type-v", &f->cache_type_v);
}

static bool take_logging(cli_parser *p, server_flags *f) {
    const char *v;
    if (cli_take(p, NULL, "--log-format", &v)) {
        if (v && strcmp(v, "json") == 0)
            f->srv.log_json = true;
        else if (v && strcmp(v, "text") == 0)
            f->srv.log_json = false;
        else if (v)
            cli_usage(p, "%s: --log-format wants text or json, got '%s'", p->command, v);
        return true;
    }
    if (cli_flag(p, "-v", "--verbose") || cli_flag(p, NULL, "--log-verbose")) {
        f->verbose = true;
        return true;
    }
    if (cli_flag(p, NULL, "--log-disable")) {
        f->log_disable = true;
        return true;
    }
    return false;
}

bool server_take_llama_flag(cli_parser *p, server_flags *f) {
    long v;
    const char *s;
    if (cli_take_int(p, "-b", "--batch-size", 1, 1 << 24, &v)) {
        f->sched.max_batch_tokens = (int)v;
        return true;
    }
    if (cli_take_int(p, "-ub", "--ubatch-size", 1, 1 << 24, &v)) {
        f->rt.opts.prefill_chunk = f->sched.prefill_chunk = (int)v;
        return true;
    }
    if (take_cache_type(p, f)) return true;
    if (cli_take(p, NULL, "--chat-template", &s)) {
        if (s) take_template(p, f, s);
        return true;
    }
    if (cli_take(p, NULL, "--api-key-file", &f->api_key_file)) return true;
    if (cli_flag(p, NULL, "--slots") || cli_flag(p, NULL, "--no-slots")) {
        f->srv.slots = strcmp(cli_arg(p), "--slots") == 0;
        return true;
    }
    if (cli_flag(p, NULL, "--props")) {
        f->srv.props = true;
        return true;
    }
    if (cli_flag(p, NULL, "--embeddings") || cli_flag(p, NULL, "--embedding")) {
        f->embeddings = true;
        return true;
    }
    if (cli_flag(p, NULL, "--reranking") || cli_flag(p, NULL, "--rerank")) {
        f->reranking = true;
        return true;
    }
    if (cli_flag(p, NULL, "--ctx-shift") || cli_flag(p, NULL, "--context-shift")) {
        cli_usage(p,
                  "%s: %s is not supported: mlxcel never drops the start of a sequence's "
                  "context; a sequence that reaches -c ends with finish_reason \"length\"",
                  p->command, cli_arg(p));
        return true;
    }
    return take_logging(p, f) || take_moot(p);
}

/* K and V share one dtype here; each of -ctk and -ctv must name one we have. */
static int finish_cache_type(server_flags *f) {
    static const struct {
        const char *name;
        base_dtype dtype;
    } types[] = {{"f16", BASE_DTYPE_F16}, {"bf16", BASE_DTYPE_BF16}, {"f32", BASE_DTYPE_F32}};
    const char *given[2] = {f->cache_type_k, f->cache_type_v}, *flag[2] = {"-ctk", "-ctv"};
    base_dtype got[2] = {BASE_DTYPE_COUNT, BASE_DTYPE_COUNT};
    for (int k = 0; k < 2; k++) {
        if (!given[k]) continue;
        for (size_t i = 0; i < sizeof types / sizeof *types; i++)
            if (strcmp(given[k], types[i].name) == 0) got[k] = types[i].dtype;
        if (got[k] == BASE_DTYPE_COUNT)
            return cli_usage_fail("mlxcel-server: %s %s: the KV cache holds f16, bf16 or f32 "
                                  "here (no quantized KV cache)",
                                  flag[k], given[k]);
    }
    if (given[0] && given[1] && got[0] != got[1])
        return cli_usage_fail("mlxcel-server: -ctk %s and -ctv %s differ: K and V share one "
                              "dtype here",
                              given[0], given[1]);
    if (given[0] || given[1]) f->rt.opts.kv_dtype = given[0] ? got[0] : got[1];
    return CLI_OK;
}

static void add_key(server_flags *f, const char *s, size_t n) {
    f->keys = base_xrealloc(f->keys, (size_t)(f->n_keys + 1) * sizeof *f->keys);
    char *k = base_xmalloc(n + 1);
    memcpy(k, s, n);
    k[n] = 0;
    f->keys[f->n_keys++] = k;
}

/* --api-key a,b: each comma-separated part is a key (llama-server's spelling); an empty part
 * is refused, since an empty key would read as "no key". */
static int finish_key_list(server_flags *f) {
    const char *s = f->api_key_list;
    if (!s) return CLI_OK;
    for (;;) {
        size_t n = strcspn(s, ",");
        if (n == 0)
            return cli_usage_fail("mlxcel-server: --api-key: the key is empty (leave the flag out "
                                  "to serve without a key)");
        add_key(f, s, n);
        if (!s[n]) return CLI_OK;
        s += n + 1;
    }
}

/* --api-key-file: one key a line; blank lines are skipped, a trailing CR is dropped. */
static int finish_key_file(server_flags *f) {
    if (!f->api_key_file) return CLI_OK;
    char *text = NULL;
    base_err err;
    if (base_read_file(f->api_key_file, &text, NULL, &err)) {
        base_fail_wrap(&err, "--api-key-file");
        return cli_fail(&err);
    }
    int before = f->n_keys;
    for (char *line = text; *line;) {
        size_t n = strcspn(line, "\n");
        size_t len = n && line[n - 1] == '\r' ? n - 1 : n;
        if (len) add_key(f, line, len);
        line += n + (line[n] == '\n');
    }
    free(text);
    if (f->n_keys == before)
        return cli_usage_fail("mlxcel-server: --api-key-file %s holds no key", f->api_key_file);
    return CLI_OK;
}

int server_flags_finish(server_flags *f) {
    int rc = finish_cache_type(f);
    if (rc == CLI_OK) rc = finish_key_list(f);
    if (rc == CLI_OK) rc = finish_key_file(f);
    if (rc != CLI_OK) return rc;
    f->srv.api_keys = (const char *const *)f->keys;
    f->srv.n_api_keys = f->n_keys;
    if (f->verbose) base_log_set_level(BASE_LOG_DEBUG);
    if (f->log_disable) {
        base_log_set_level(BASE_LOG_ERROR);
        f->srv.log_requests = false;
    }
    return CLI_OK;
}

void server_flags_free(server_flags *f) {
    for (int i = 0; i < f->n_keys; i++) free(f->keys[i]);
    free(f->keys);
    json_decref(f->template_kwargs);
}
