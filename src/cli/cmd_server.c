/* `mlxcel-server`: flags (llama-server's spellings, and its LLAMA_ARG_* environment variables
 * underneath them), startup, and a graceful stop on SIGINT, SIGTERM or SIGHUP. The HTTP port
 * opens before the model loads so that /health can say 503 meanwhile. */
#include "cli/cmd_server.h"
#include "cli/cmd_server_flags.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Environment variable -> flag, llama-server's names. A boolean variable takes 1, true, on or
 * enabled to give `flag`, and 0, false, off or disabled to give `negated` (or nothing). */
static const struct {
    const char *env, *flag, *negated;
    bool boolean;
} g_env[] = {
    {"LLAMA_ARG_MODEL", "--model", NULL, false},
    {"LLAMA_ARG_HOST", "--host", NULL, false},
    {"LLAMA_ARG_PORT", "--port", NULL, false},
    {"LLAMA_ARG_CTX_SIZE", "--ctx-size", NULL, false},
    {"LLAMA_ARG_N_PARALLEL", "--parallel", NULL, false},
    {"LLAMA_ARG_THREADS", "--threads", NULL, false},
    {"LLAMA_ARG_N_PREDICT", "--n-predict", NULL, false},
    {"LLAMA_API_KEY", "--api-key", NULL, false},
    {"LLAMA_ARG_API_KEY", "--api-key", NULL, false},
    {"LLAMA_ARG_ENDPOINT_METRICS", "--metrics", NULL, true},
    {"LLAMA_ARG_ENDPOINT_SLOTS", "--slots", "--no-slots", true},
    {"LLAMA_ARG_NO_ENDPOINT_SLOTS", "--no-slots", NULL, true},
    {"LLAMA_ARG_ENDPOINT_PROPS", "--props", NULL, true},
    {"LLAMA_ARG_EMBEDDINGS", "--embeddings", NULL, true},
    {"LLAMA_ARG_RERANKING", "--reranking", NULL, true},
    {"LLAMA_ARG_NO_WEBUI", "--no-webui", NULL, true},
    {"LLAMA_ARG_CHAT_TEMPLATE", "--chat-template", NULL, false},
    {"LLAMA_ARG_CHAT_TEMPLATE_FILE", "--chat-template-file", NULL, false},
    {"LLAMA_ARG_TIMEOUT", "--timeout", NULL, false},
    {"LLAMA_ARG_ALIAS", "--alias", NULL, false},
    {"LLAMA_ARG_DEVICE", "--device", NULL, false},
    {"LLAMA_ARG_BATCH", "--batch-size", NULL, false},
    {"LLAMA_ARG_UBATCH", "--ubatch-size", NULL, false},
    {"LLAMA_ARG_CACHE_TYPE_K", "--cache-type-k", NULL, false},
    {"LLAMA_ARG_CACHE_TYPE_V", "--cache-type-v", NULL, false},
    {"LLAMA_ARG_N_GPU_LAYERS", "--n-gpu-layers", NULL, false},
    {"LLAMA_ARG_FLASH_ATTN", "--flash-attn", NULL, false},
    {"LLAMA_ARG_CONT_BATCHING", "--cont-batching", "--no-cont-batching", true},
    {"LLAMA_ARG_NO_CONT_BATCHING", "--no-cont-batching", NULL, true},
    {"LLAMA_ARG_JINJA", "--jinja", "--no-jinja", true},
    {"LLAMA_ARG_MLOCK", "--mlock", NULL, true},
    {"LLAMA_ARG_NO_MMAP", "--no-mmap", NULL, true},
    {"LLAMA_ARG_CONTEXT_SHIFT", "--context-shift", "--no-context-shift", true},
    {"LLAMA_ARG_NO_CONTEXT_SHIFT", "--no-context-shift", NULL, true},
    {"LLAMA_ARG_KV_CACHE_BUDGET", "--kv-cache-budget", NULL, false},
    {"LLAMA_ARG_MAX_QUEUE", "--max-queue", NULL, false},
    {"LLAMA_ARG_MAX_BATCH_TOKENS", "--max-batch-tokens", NULL, false},
    {"LLAMA_ARG_PREFILL_CHUNK_SIZE", "--prefill-chunk-size", NULL, false},
    {"LLAMA_ARG_SHUTDOWN_TIMEOUT", "--shutdown-timeout", NULL, false},
    {"LLAMA_ARG_THINK", "--reasoning-format", NULL, false},
    {"LLAMA_ARG_THINK_BUDGET", "--reasoning-budget", NULL, false},
    {"LLAMA_ARG_CHAT_TEMPLATE_KWARGS", "--chat-template-kwargs", NULL, false},
};

static const char g_help[] =
    "usage: mlxcel-server -m MODEL [options]\n"
    "\n"
    "OpenAI-compatible server: POST /v1/chat/completions, /v1/completions, /completion,\n"
    "/v1/responses, /v1/messages and /v1/messages/count_tokens (Anthropic's), /v1/embeddings\n"
    "and /embedding (with --embeddings), /v1/rerank (with --reranking), /infill, /tokenize,\n"
    "/detokenize, /apply-template, /props, /slots/ID?action=erase; GET /v1/models,\n"
    "/v1/models/ID, /v1/responses/ID (and DELETE), /health, /v1/health, /metrics, /slots,\n"
    "/props; a chat page at / for a browser.\n"
    "\n"
    "%s"
    "  -np, --parallel N        sequences generated at once (default 4). -c is the limit of\n"
    "                           EACH sequence, not a total divided among them (llama-server\n"
    "                           divides it); the KV pool is sized for N full sequences unless\n"
    "                           --kv-cache-budget says otherwise, and sequences then share it\n"
    "  -n, --n-predict N        default max_tokens of a request (default: up to the context)\n"
    "      --host ADDR          address to listen on (default 127.0.0.1)\n"
    "      --port N             port (default 8080; 0 picks a free one)\n"
    "      --api-key KEY[,KEY]  require 'Authorization: Bearer KEY' or 'x-api-key: KEY', one\n"
    "                           of the keys (not on /health)\n"
    "      --api-key-file F     more keys, one a line\n"
    "      --alias NAME         model name in responses (default: the directory's name)\n"
    "      --metrics            serve Prometheus metrics on GET /metrics\n"
    "      --no-slots           no GET /slots (served by default, as --slots says)\n"
    "      --props              let POST /props change the sampling defaults\n"
    "      --embeddings         serve POST /v1/embeddings, /embeddings and /embedding: the\n"
    "                           hidden states after the final norm, mean-pooled (or as the\n"
    "                           model's sentence-transformers Pooling config says), normalized\n"
    "      --reranking          serve POST /v1/rerank (also /rerank, /v1/reranking): the\n"
    "                           score head of a *ForSequenceClassification checkpoint, else\n"
    "                           the logits of \"yes\" minus \"no\" (Qwen3-Reranker); the\n"
    "                           relevance_score is its sigmoid\n"
    "      --no-webui           no chat page at / (served by default, without the API key:\n"
    "                           the page asks for it)\n"
    "      --chat-template-file F  a Jinja chat template replacing the model's\n"
    "      --chat-template T    the same as text, or llama-server's name chatml or llama3\n"
    "      --timeout S          close connections idle for S seconds (default 600)\n"
    "      --read-timeout S     a request's headers and body must arrive within S seconds of\n"
    "                           the connection opening or of its previous response, or the\n"
    "                           connection is closed (default 30; 0: no limit)\n"
    "      --max-connections N  connections open at once (default 1024), and from one client\n"
    "      --max-connections-per-ip N  address (default 256; 0: no limit). A connection past\n"
    "                           a limit replaces the oldest one of its address (or any, past\n"
    "                           the first) that has been sending a request for a second or\n"
    "                           more; when there is none, its request gets a 503\n"
    "      --max-header BYTES   request line and headers, at most (default 32 KiB; more gets\n"
    "                           431)\n"
    "      --cors ORIGIN        allow browsers from ORIGIN ('*' for any): Access-Control-*\n"
    "                           headers and OPTIONS preflight answers (default: none). Other\n"
    "                           sites' pages get 403, and so does a Host header that is not a\n"
    "                           name of this machine while the server listens on loopback\n"
    "      --shutdown-timeout S on SIGTERM, SIGINT or SIGHUP, running requests may finish for\n"
    "                           S seconds (default 10); queued ones get 503, and what is still\n"
    "                           running then ends with finish_reason \"abort\". A second signal\n"
    "                           ends them at once. Exit status 1 when a request was cut short\n"
    "      --max-queue N        requests waiting to start, at most; more get 503 (default 256)\n"
    "      --max-batch-tokens N tokens per scheduler step, decode rows and prefill chunks\n"
    "                           together (default 2048)\n"
    "      --prefill-chunk-size N  prompt tokens of one sequence per step (default: the\n"
    "                           backend's, 512 on the CPU, 2048 on CUDA)\n"
    "      --max-body BYTES     largest request body; more gets 413 (default 8 MiB)\n"
    "%s"
    "      --temp, --top-k, --top-p, --min-p, --repeat-penalty\n"
    "                           sampling defaults for requests that leave them out\n"
    "  -s, --seed N             the seed of requests that give none (default: a fresh one\n"
    "                           each), so that equal requests give equal output\n"
    "      --log-format F       text (default) or json: one line per request on stderr\n"
    "                           (method, route, status, tokens in and out, TTFT, total)\n"
    "  -v, --verbose            debug logging; --log-disable: errors only, no request lines\n"
    "\n"
    "llama-server's flags: -b/--batch-size is --max-batch-tokens, -ub/--ubatch-size is\n"
    "--prefill-chunk-size, -ctk/-ctv (--cache-type-k/v) f16, bf16 or f32 is --kv-dtype (K and\n"
    "V share one); -ngl, -fa, -cb, --jinja, --mlock and --no-mmap are taken with a note (moot\n"
    "here); --ctx-shift is refused (context is never shifted).\n"
    "  -h, --help               this help\n"
    "\n"
    "Flags can also come from the environment as llama-server names them (LLAMA_ARG_MODEL,\n"
    "LLAMA_ARG_HOST, LLAMA_ARG_PORT, LLAMA_ARG_CTX_SIZE, LLAMA_ARG_N_PARALLEL, LLAMA_ARG_THREADS,\n"
    "LLAMA_ARG_N_PREDICT, LLAMA_API_KEY or LLAMA_ARG_API_KEY, LLAMA_ARG_ENDPOINT_METRICS,\n"
    "LLAMA_ARG_ENDPOINT_SLOTS, LLAMA_ARG_ENDPOINT_PROPS, LLAMA_ARG_NO_WEBUI, LLAMA_ARG_TIMEOUT, "
    "LLAMA_ARG_ALIAS,\n"
    "LLAMA_ARG_EMBEDDINGS, LLAMA_ARG_RERANKING,\n"
    "LLAMA_ARG_CHAT_TEMPLATE, LLAMA_ARG_CHAT_TEMPLATE_FILE, LLAMA_ARG_BATCH, LLAMA_ARG_UBATCH,\n"
    "LLAMA_ARG_CACHE_TYPE_K, LLAMA_ARG_CACHE_TYPE_V, LLAMA_ARG_N_GPU_LAYERS, "
    "LLAMA_ARG_FLASH_ATTN,\n"
    "LLAMA_ARG_CONT_BATCHING, LLAMA_ARG_JINJA, LLAMA_ARG_MLOCK, LLAMA_ARG_NO_MMAP,\n"
    "LLAMA_ARG_CONTEXT_SHIFT, LLAMA_ARG_KV_CACHE_BUDGET, LLAMA_ARG_MAX_QUEUE,\n"
    "LLAMA_ARG_MAX_BATCH_TOKENS, LLAMA_ARG_PREFILL_CHUNK_SIZE, LLAMA_ARG_SHUTDOWN_TIMEOUT,\n"
    "LLAMA_ARG_THINK, LLAMA_ARG_THINK_BUDGET, LLAMA_ARG_CHAT_TEMPLATE_KWARGS); a flag\n"
    "on the command line wins, and a bad value is an error naming the variable.\n"
    "\n"
    "examples:\n"
    "  mlxcel-server -m models/demo\n"
    "  mlxcel-server -m ~/models/Qwen3-4B-4bit -c 8192 -np 8 --port 9000 --metrics\n"
    "  LLAMA_ARG_API_KEY=secret mlxcel-server -m models/demo --host 0.0.0.0\n"
    "  curl http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' \\\n"
    "       -d '{\"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}]}'\n";

static bool take_server_flag(cli_parser *p, server_flags *f) {
    long v;
    if (cli_take_int(p, "-np", "--parallel", 1, 4096, &v)) {
        f->rt.opts.n_parallel = f->sched.n_parallel = (int)v;
        return true;
    }
    if (cli_take_int(p, "-n", "--n-predict", -1, INT32_MAX, &v)) {
        f->srv.n_predict = (int)v;
        return true;
    }
    if (cli_take(p, NULL, "--host", &f->srv.host)) return true;
    if (cli_take_int(p, NULL, "--port", 0, 65535, &v)) {
        f->srv.port = (int)v;
        return true;
    }
    if (cli_take(p, NULL, "--api-key", &f->api_key_list)) return true;
    if (cli_take_int(p, NULL, "--shutdown-timeout", 0, 1 << 20, &v)) {
        f->shutdown_timeout_s = (int)v;
        return true;
    }
    if (cli_take(p, "-a", "--alias", &f->srv.model_id)) return true;
    if (cli_flag(p, NULL, "--metrics")) {
        f->srv.metrics = true;
        return true;
    }
    if (cli_flag(p, NULL, "--no-webui")) {
        f->srv.webui = false;
        return true;
    }
    if (cli_take(p, NULL, "--chat-template-file", &f->template_file)) return true;
    if (cli_take_int(p, "-to", "--timeout", 0, 1 << 30, &v)) {
        f->srv.timeout_s = (int)v;
        return true;
    }
    if (cli_take_int(p, NULL, "--read-timeout", 0, 1 << 30, &v)) {
        f->srv.read_timeout_s = (int)v;
        return true;
    }
    if (cli_take_int(p, NULL, "--max-connections", 1, 1 << 20, &v)) {
        f->srv.max_connections = (unsigned)v;
        return true;
    }
    if (cli_take_int(p, NULL, "--max-connections-per-ip", 0, 1 << 20, &v)) {
        f->srv.max_connections_ip = (unsigned)v;
        return true;
    }
    if (cli_take_int(p, NULL, "--max-header", 4096, 1 << 30, &v)) {
        f->srv.max_header = (size_t)v;
        return true;
    }
    if (cli_take(p, NULL, "--cors", &f->srv.cors_origin)) return true;
    if (cli_take_int(p, NULL, "--max-queue", 0, 1 << 30, &v)) {
        f->sched.max_queue = (int)v;
        return true;
    }
    if (cli_take_int(p, NULL, "--max-batch-tokens", 1, 1 << 24, &v)) {
        f->sched.max_batch_tokens = (int)v;
        return true;
    }
    if (cli_take_int(p, NULL, "--prefill-chunk-size", 1, 1 << 24, &v)) {
        f->rt.opts.prefill_chunk = f->sched.prefill_chunk = (int)v;
        return true;
    }
    if (cli_take_int(p, NULL, "--max-body", 1024, 1L << 34, &v)) {
        f->srv.max_body = (size_t)v;
        return true;
    }
    return false;
}

static void defaults(server_flags *f) {
    memset(f, 0, sizeof *f);
    cli_runtime_init(&f->rt);
    f->rt.opts.n_parallel = f->sched.n_parallel = 4;
    f->srv.host = "127.0.0.1";
    f->srv.port = 8080;
    f->srv.timeout_s = 600;
    f->srv.read_timeout_s = 30;
    f->srv.max_connections = 1024;
    f->srv.max_connections_ip = 256;
    f->shutdown_timeout_s = 10;
    f->srv.max_header = 32u << 10;
    f->srv.max_body = 8u << 20;
    f->sched.max_queue = 256;
    f->srv.reasoning_format = ENGINE_REASONING_AUTO;
    f->srv.slots = true;
    f->srv.webui = true;
    f->srv.log_requests = true;
    engine_sampling_defaults(&f->srv.defaults);
}

/* One argument list through every flag taker; -s/--seed also fixes the unseeded requests'
 * seed. */
static void parse_args(cli_parser *p, server_flags *f) {
    while (cli_next(p)) {
        if (cli_flag(p, "-h", "--help")) {
            f->help = true;
            continue;
        }
        const char *arg = cli_arg(p);
        if (cli_take_runtime(p, &f->rt) || take_server_flag(p, f) || server_take_llama_flag(p, f) ||
            cli_take_sampling(p, &f->srv.defaults) ||
            cli_take_server_chat(p, &f->srv, &f->template_kwargs)) {
            if (strcmp(arg, "-s") == 0 || strncmp(arg, "--seed", 6) == 0) f->srv.seed_fixed = true;
            continue;
        }
        cli_unknown(p);
    }
}

static bool is_in(const char *v, const char *const *set) {
    for (; *set; set++)
        if (strcmp(v, *set) == 0) return true;
    return false;
}

/* The environment's flags, before the command line's so that those win; an error names the
 * variable. */
static int parse_env(server_flags *f) {
    static const char *const truthy[] = {"1", "true", "on", "enabled", NULL};
    static const char *const falsy[] = {"0", "false", "off", "disabled", NULL};
    for (size_t i = 0; i < sizeof g_env / sizeof *g_env; i++) {
        char *val = getenv(g_env[i].env);
        if (!val) continue;
        char *argv[3] = {"mlxcel-server", (char *)g_env[i].flag, val};
        int argc = 3;
        if (g_env[i].boolean) {
            if (!is_in(val, truthy) && !is_in(val, falsy))
                return cli_usage_fail("mlxcel-server: %s=%s: wants 1, true, on or enabled, or 0, "
                                      "false, off or disabled",
                                      g_env[i].env, val);
            argv[1] = (char *)(is_in(val, truthy) ? g_env[i].flag : g_env[i].negated);
            argc = 2;
            if (!argv[1]) continue;
        }
        cli_parser p;
        cli_parser_init(&p, "mlxcel-server", argc, argv);
        parse_args(&p, f);
        if (p.status != CLI_OK)
            return cli_usage_fail("environment variable %s=%s: %s", g_env[i].env, val, p.msg);
    }
    return CLI_OK;
}

static int parse(int argc, char **argv, server_flags *f) {
    int rc = parse_env(f);
    if (rc != CLI_OK) return rc;
    cli_parser p;
    cli_parser_init(&p, "mlxcel-server", argc, argv);
    parse_args(&p, f);
    rc = cli_done(&p);
    if (rc == CLI_OK) rc = server_flags_finish(f);
    if (rc == CLI_OK && !f->help && !f->rt.model)
        rc = cli_usage_fail("mlxcel-server: -m MODEL is required (see --help)");
    return rc;
}

static const char *base_name(const char *path) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    const char *s = path + n;
    while (s > path && s[-1] != '/') s--;
    return s;
}

static void print_startup(const char *model_dir, const engine_runtime *rt, const server *srv,
                          const server_options *so) {
    char desc[512];
    engine_runtime_describe(rt, model_dir, desc, sizeof desc);
    fprintf(stderr, "mlxcel-server: %s; listening on http://%s:%d\n", desc, so->host,
            server_port(srv));
}

typedef struct loaded {
    engine_runtime *rt;
    engine_prompter *pr;
    engine_sched *sched;
    int32_t *eos;
    engine_pooling pooling;
    engine_reranker reranker;
} loaded;

static int load(server_flags *f, loaded *L, base_err *err) {
    if (cli_runtime_resolve(&f->rt, err) ||
        engine_runtime_open(f->rt.model, &f->rt.opts, &L->rt, err) ||
        engine_prompter_open(f->rt.model, f->template_file, &L->pr, err) ||
        (f->template_text && engine_prompter_set_template(L->pr, f->template_text, err)))
        return -1;
    if (f->embeddings && engine_pooling_read(f->rt.model, &L->pooling, err)) return -1;
    if (f->reranking && engine_reranker_open(L->rt->model, L->pr->tok, &L->reranker, err))
        return -1;
    if (!model_has_lm_head(L->rt->model) && !f->reranking && !f->embeddings)
        return base_fail(err,
                         "%s is a sequence classifier (no LM head): it generates nothing; "
                         "serve it with --reranking (or --embeddings)",
                         f->rt.model);
    cli_server_chat_apply(&f->srv, f->template_kwargs, L->pr);
    int n_eos;
    server_extra_eos(f->rt.model, L->pr, &L->eos, &n_eos);
    f->sched.tok = L->pr->tok;
    f->sched.eos_ids = L->eos;
    f->sched.n_eos = n_eos;
    f->sched.ctx_size = L->rt->kv_plan.ctx_size;
    return engine_sched_start(L->rt, &f->sched, &L->sched, err);
}

static void unload(loaded *L) {
    engine_sched_stop(L->sched);
    engine_prompter_close(L->pr);
    engine_runtime_close(L->rt);
    engine_reranker_close(&L->reranker);
    free(L->eos);
}

/* The graceful stop: running requests get up to the timeout, then what is left is aborted;
 * a second signal aborts at once. Returns the exit status: 1 when a request was cut short. */
static int drain(server *srv, const sigset_t *sigs, int timeout_s) {
    server_drain(srv);
    int active = server_active(srv);
    if (active)
        fprintf(stderr,
                "mlxcel-server: stopping: %d request(s) may finish for %d s (a second signal "
                "ends them now)\n",
                active, timeout_s);
    double end = base_now() + timeout_s;
    struct timespec tick = {0, 50 * 1000 * 1000};
    bool aborted = false;
    /* after the abort, the streams write their last chunks; bounded, in case one cannot */
    double give_up = 0;
    while (server_active(srv) > 0) {
        bool second = sigtimedwait(sigs, NULL, &tick) > 0;
        double now = base_now();
        if (!aborted && (second || now >= end)) {
            server_abort(srv);
            aborted = true;
            give_up = now + 5;
        }
        if (aborted && now >= give_up) break;
    }
    int cut = server_cut(srv);
    if (cut) fprintf(stderr, "mlxcel-server: %d request(s) cut short by the stop\n", cut);
    return cut ? CLI_FAIL : CLI_OK;
}

int cli_cmd_server(int argc, char **argv) {
    server_flags f;
    defaults(&f);
    int rc = parse(argc, argv, &f);
    if (rc != CLI_OK || f.help) {
        if (rc == CLI_OK) printf(g_help, cli_runtime_help(), cli_server_chat_help);
        server_flags_free(&f);
        return rc;
    }
    if (!f.srv.model_id) f.srv.model_id = base_name(f.rt.model);
    /* signals are taken by sigwait below; every thread started from here inherits the mask */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    base_err err;
    server *srv;
    if (server_start(&f.srv, &srv, &err)) {
        server_flags_free(&f);
        return cli_fail(&err);
    }
    loaded L = {0};
    if (load(&f, &L, &err)) {
        server_stop(srv);
        unload(&L);
        server_flags_free(&f);
        return cli_fail(&err);
    }
    if (f.embeddings) server_serve_embeddings(srv, L.pooling);
    if (f.reranking) server_serve_reranking(srv, &L.reranker);
    server_attach(srv, L.rt, L.pr, L.sched);
    print_startup(f.rt.model, L.rt, srv, &f.srv);
    int sig;
    sigwait(&sigs, &sig);
    fprintf(stderr, "mlxcel-server: stopping (%s)\n", strsignal(sig));
    rc = drain(srv, &sigs, f.shutdown_timeout_s);
    server_stop(srv);
    unload(&L);
    server_flags_free(&f);
    return rc;
}
