/* `mlxcel-server`: flags (llama-server's spellings, and its LLAMA_ARG_* environment variables
 * underneath them), startup, and a graceful stop on SIGINT, SIGTERM or SIGHUP. The HTTP port
 * opens before the model loads so that /health can say 503 meanwhile. */
#include "cli/cmd_server.h"
#include "cli/cli_runtime.h"
#include "server/server.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct server_flags {
    cli_runtime_flags rt;
    server_options srv;
    engine_sched_options sched;
    const char *template_file;
    json_t *template_kwargs; /* --chat-template-kwargs, owned */
    int shutdown_timeout_s;
    bool help;
} server_flags;

/* Environment variable -> flag; a boolean flag's variable takes 1/true/on to set it. */
static const struct {
    const char *env, *flag;
    bool boolean;
} g_env[] = {
    {"LLAMA_ARG_MODEL", "--model", false},
    {"LLAMA_ARG_HOST", "--host", false},
    {"LLAMA_ARG_PORT", "--port", false},
    {"LLAMA_ARG_CTX_SIZE", "--ctx-size", false},
    {"LLAMA_ARG_N_PARALLEL", "--parallel", false},
    {"LLAMA_ARG_THREADS", "--threads", false},
    {"LLAMA_ARG_N_PREDICT", "--n-predict", false},
    {"LLAMA_ARG_API_KEY", "--api-key", false},
    {"LLAMA_ARG_ENDPOINT_METRICS", "--metrics", true},
    {"LLAMA_ARG_CHAT_TEMPLATE_FILE", "--chat-template-file", false},
    {"LLAMA_ARG_TIMEOUT", "--timeout", false},
    {"LLAMA_ARG_ALIAS", "--alias", false},
    {"LLAMA_ARG_DEVICE", "--device", false},
    {"LLAMA_ARG_KV_CACHE_BUDGET", "--kv-cache-budget", false},
    {"LLAMA_ARG_MAX_QUEUE", "--max-queue", false},
    {"LLAMA_ARG_MAX_BATCH_TOKENS", "--max-batch-tokens", false},
    {"LLAMA_ARG_PREFILL_CHUNK_SIZE", "--prefill-chunk-size", false},
    {"LLAMA_ARG_SHUTDOWN_TIMEOUT", "--shutdown-timeout", false},
    {"LLAMA_ARG_THINK", "--reasoning-format", false},
    {"LLAMA_ARG_THINK_BUDGET", "--reasoning-budget", false},
    {"LLAMA_ARG_CHAT_TEMPLATE_KWARGS", "--chat-template-kwargs", false},
};

static const char g_help[] =
    "usage: mlxcel-server -m MODEL [options]\n"
    "\n"
    "OpenAI-compatible server: POST /v1/chat/completions, /v1/completions, /completion,\n"
    "/tokenize, /detokenize, /apply-template; GET /v1/models, /health, /metrics, /slots, /props.\n"
    "\n"
    "%s"
    "  -np, --parallel N        sequences generated at once (default 4). -c is the limit of\n"
    "                           EACH sequence, not a total divided among them (llama-server\n"
    "                           divides it); the KV pool is sized for N full sequences unless\n"
    "                           --kv-cache-budget says otherwise, and sequences then share it\n"
    "  -n, --n-predict N        default max_tokens of a request (default: up to the context)\n"
    "      --host ADDR          address to listen on (default 127.0.0.1)\n"
    "      --port N             port (default 8080; 0 picks a free one)\n"
    "      --api-key KEY        require 'Authorization: Bearer KEY' (not on /health)\n"
    "      --alias NAME         model name in responses (default: the directory's name)\n"
    "      --metrics            serve Prometheus metrics on GET /metrics\n"
    "      --chat-template-file F  a Jinja chat template replacing the model's\n"
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
    "      --temp, --top-k, --top-p, --min-p, --repeat-penalty, --seed\n"
    "                           sampling defaults for requests that leave them out\n"
    "  -h, --help               this help\n"
    "\n"
    "Every flag can also come from the environment as llama-server names it (LLAMA_ARG_MODEL,\n"
    "LLAMA_ARG_HOST, LLAMA_ARG_PORT, LLAMA_ARG_CTX_SIZE, LLAMA_ARG_N_PARALLEL, LLAMA_ARG_THREADS,\n"
    "LLAMA_ARG_N_PREDICT, LLAMA_ARG_API_KEY, LLAMA_ARG_ENDPOINT_METRICS, LLAMA_ARG_TIMEOUT,\n"
    "LLAMA_ARG_CHAT_TEMPLATE_FILE, LLAMA_ARG_ALIAS, LLAMA_ARG_KV_CACHE_BUDGET,\n"
    "LLAMA_ARG_MAX_QUEUE, LLAMA_ARG_MAX_BATCH_TOKENS, LLAMA_ARG_PREFILL_CHUNK_SIZE,\n"
    "LLAMA_ARG_SHUTDOWN_TIMEOUT, LLAMA_ARG_THINK, LLAMA_ARG_THINK_BUDGET,\n"
    "LLAMA_ARG_CHAT_TEMPLATE_KWARGS); a flag on the command line wins.\n"
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
    if (cli_take(p, NULL, "--api-key", &f->srv.api_key)) {
        /* an empty key would mean no key at all: refused, not taken as "auth off" */
        if (!f->srv.api_key[0])
            cli_usage(p,
                      "%s: --api-key: the key is empty (leave the flag out to serve without "
                      "a key)",
                      p->command);
        return true;
    }
    if (cli_take_int(p, NULL, "--shutdown-timeout", 0, 1 << 20, &v)) {
        f->shutdown_timeout_s = (int)v;
        return true;
    }
    if (cli_take(p, "-a", "--alias", &f->srv.model_id)) return true;
    if (cli_flag(p, NULL, "--metrics")) {
        f->srv.metrics = true;
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
        f->sched.prefill_chunk = (int)v;
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
    engine_sampling_defaults(&f->srv.defaults);
}

/* argv with the environment's flags first, so that the command line's come later and win.
 * The returned array (caller frees) points into argv and the environment. */
static char **merge_env(int argc, char **argv, int *out_argc) {
    char **v = base_xcalloc((size_t)argc + 2 * (sizeof g_env / sizeof *g_env) + 1, sizeof *v);
    int n = 0;
    v[n++] = argv[0];
    for (size_t i = 0; i < sizeof g_env / sizeof *g_env; i++) {
        char *val = getenv(g_env[i].env);
        if (!val) continue;
        if (g_env[i].boolean) {
            if (strcmp(val, "1") == 0 || strcmp(val, "true") == 0 || strcmp(val, "on") == 0)
                v[n++] = (char *)g_env[i].flag;
            continue;
        }
        v[n++] = (char *)g_env[i].flag;
        v[n++] = val;
    }
    for (int i = 1; i < argc; i++) v[n++] = argv[i];
    *out_argc = n;
    return v;
}

static int parse(int argc, char **argv, server_flags *f) {
    int n;
    char **v = merge_env(argc, argv, &n);
    cli_parser p;
    cli_parser_init(&p, "mlxcel-server", n, v);
    while (cli_next(&p)) {
        if (cli_flag(&p, "-h", "--help")) {
            f->help = true;
            continue;
        }
        if (cli_take_runtime(&p, &f->rt) || take_server_flag(&p, f) ||
            cli_take_sampling(&p, &f->srv.defaults) ||
            cli_take_server_chat(&p, &f->srv, &f->template_kwargs))
            continue;
        cli_unknown(&p);
    }
    int rc = cli_done(&p);
    free(v);
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
} loaded;

static int load(server_flags *f, loaded *L, base_err *err) {
    if (cli_runtime_resolve(&f->rt, err) ||
        engine_runtime_open(f->rt.model, &f->rt.opts, &L->rt, err) ||
        engine_prompter_open(f->rt.model, f->template_file, &L->pr, err))
        return -1;
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
    if (rc != CLI_OK) {
        json_decref(f.template_kwargs);
        return rc;
    }
    if (f.help) {
        printf(g_help, cli_runtime_help(), cli_server_chat_help);
        json_decref(f.template_kwargs);
        return CLI_OK;
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
        json_decref(f.template_kwargs);
        return cli_fail(&err);
    }
    loaded L = {0};
    if (load(&f, &L, &err)) {
        server_stop(srv);
        unload(&L);
        json_decref(f.template_kwargs);
        return cli_fail(&err);
    }
    server_attach(srv, L.rt, L.pr, L.sched);
    print_startup(f.rt.model, L.rt, srv, &f.srv);
    int sig;
    sigwait(&sigs, &sig);
    fprintf(stderr, "mlxcel-server: stopping (%s)\n", strsignal(sig));
    rc = drain(srv, &sigs, f.shutdown_timeout_s);
    server_stop(srv);
    unload(&L);
    json_decref(f.template_kwargs);
    return rc;
}
