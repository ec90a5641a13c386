/* `mlxcel run`: chat with a model (the embedded demo model by default), interactively with
 * line editing and history, or once with -p. */
#include "cli/cli_runtime.h"

#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef MLXCEL_HAVE_LIBEDIT
#include <editline/readline.h>
#endif

static const char *g_help =
    "usage: mlxcel run [MODEL] [-p TEXT] [-n N] [options]\n"
    "\n"
    "Chats with MODEL (a model directory; without one, the embedded demo model). With -p it\n"
    "answers once and exits; otherwise it reads messages interactively: /reset starts a new\n"
    "conversation, /exit (or Ctrl-D) quits, Ctrl-C stops the current reply.\n"
    "\n"
    "options:\n"
    "%s"
    "  -p, --prompt TEXT        answer this one message and exit\n"
    "  -n, --n-predict N        most tokens per reply (default: until the end of the reply)\n"
    "      --temp T, --top-k K, --top-p P, --min-p P, --seed S   sampling, as in generate\n"
    "      --raw                send the prompt as plain text, without the chat template, and\n"
    "                           (with -p) print it before its continuation, as a text to go on\n"
    "      --show-reasoning     print the model's thinking (<think>..</think>) too; without it\n"
    "                           only the answer is shown\n"
    "\n"
    "examples:\n"
    "  mlxcel run -p \"Once upon a time\" -n 60\n"
    "  mlxcel run ./Llama-3.2-1B-Instruct-4bit\n";

static volatile sig_atomic_t g_interrupted;

static void on_sigint(int sig) {
    (void)sig;
    g_interrupted = 1;
}

/* The demo model: $MLXCEL_DEMO_MODEL, else models/demo beside the binary's build tree, else in
 * the source tree it was built from. */
static const char *demo_model_dir(char *buf, size_t size) {
    const char *env = getenv("MLXCEL_DEMO_MODEL");
    if (env) return env;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) *slash = 0;
        char guess[PATH_MAX + 32];
        snprintf(guess, sizeof guess, "%s/../../models/demo", exe);
        if (realpath(guess, buf) && base_dir_exists(buf)) return buf;
    }
    snprintf(buf, size, "%s/models/demo", MLXCEL_SOURCE_DIR);
    return buf;
}

typedef struct run_session {
    engine_runtime *rt;
    engine_prompter *pr;
    engine_sampling sampling;
    int max_new;
    bool raw, show_reasoning;
    json_t *messages; /* the conversation so far */
    tok_stream *stream;
    /* the reply so far, and how much of it is printed: all of it with --show-reasoning, else
     * only the answer after the thinking */
    char *reply;
    size_t reply_len, reply_cap, printed;
    bool inside; /* the prompt opened the thinking */
} run_session;

/* Adds a piece of the reply and prints what may be shown of it now (final: all of it). */
static void reply_add(run_session *s, const char *piece, size_t len, bool final) {
    if (s->reply_len + len + 1 > s->reply_cap) {
        s->reply_cap = (s->reply_len + len + 1) * 2;
        s->reply = base_xrealloc(s->reply, s->reply_cap);
    }
    memcpy(s->reply + s->reply_len, piece, len);
    s->reply_len += len;
    size_t from = 0;
    if (!s->show_reasoning) {
        engine_think_split t;
        engine_think_split_text(s->reply, s->reply_len, s->inside, final, &t);
        from = t.content_start;
    }
    if (s->printed < from) s->printed = from;
    fwrite(s->reply + s->printed, 1, s->reply_len - s->printed, stdout);
    fflush(stdout);
    s->printed = s->reply_len;
}

static bool print_token(void *ctx, int32_t token) {
    run_session *s = ctx;
    char *piece;
    size_t len;
    base_err err;
    if (tok_stream_push(s->stream, token, &piece, &len, &err) == 0 && len)
        reply_add(s, piece, len, false);
    free(piece);
    return !g_interrupted;
}

/* Sends one user message and streams the reply; the reply joins the conversation. */
/* Tokens kept free for the reply when old turns must make room for a new one. */
#define RUN_REPLY_ROOM 128

/* Encodes the conversation for the next reply. When it no longer fits the context, the
 * oldest turns are dropped (the newest message always stays), as a chat UI scrolls. */
static int encode_turn(run_session *s, const char *text, int32_t **ids, int *n, base_err *err) {
    if (s->raw || !s->pr->tmpl) return engine_prompter_encode_text(s->pr, text, 0, ids, n, err);
    int room = s->rt->kv_plan.ctx_size - RUN_REPLY_ROOM;
    for (;;) {
        engine_chat_options o = {.add_generation_prompt = true};
        char *prompt;
        if (engine_prompter_render(s->pr, s->messages, &o, &prompt, err)) return -1;
        s->inside = engine_prompt_opens_think(prompt);
        int rc = engine_prompter_encode_rendered(s->pr, prompt, 0, ids, n, err);
        free(prompt);
        if (rc) return -1;
        if (*n <= room || json_array_size(s->messages) <= 1) return 0;
        free(*ids);
        json_array_remove(s->messages, 0);
    }
}

static int run_turn(run_session *s, const char *text, base_err *err) {
    int32_t *ids;
    int n;
    json_array_append_new(s->messages, json_pack("{s:s, s:s}", "role", "user", "content", text));
    int rc = encode_turn(s, text, &ids, &n, err);
    if (rc) return -1;
    s->stream = tok_stream_new(s->pr->tok, true);
    tok_stream_continue(s->stream);
    engine_generate_result res;
    g_interrupted = 0;
    rc = engine_generate(s->rt, ids, n, s->max_new, &s->sampling, print_token, s, &res, err);
    char *rest;
    size_t len;
    if (rc == 0 && tok_stream_flush(s->stream, &rest, &len, err) == 0) {
        reply_add(s, rest, len, true);
        free(rest);
    }
    s->reply_len = s->printed = 0;
    fputc('\n', stdout);
    if (rc == 0) {
        char *reply;
        size_t rlen;
        if (tok_decode_continued(s->pr->tok, res.tokens, (size_t)res.n_tokens, true, &reply, &rlen,
                                 err) == 0) {
            json_array_append_new(s->messages,
                                  json_pack("{s:s, s:s}", "role", "assistant", "content", reply));
            free(reply);
        }
        free(res.tokens);
    }
    tok_stream_free(s->stream);
    s->stream = NULL;
    free(ids);
    return rc;
}

static char *read_line(const char *prompt) {
#ifdef MLXCEL_HAVE_LIBEDIT
    char *line = readline(prompt);
    if (line && *line) add_history(line);
    return line;
#else
    fputs(prompt, stdout);
    fflush(stdout);
    char buf[8192];
    if (!fgets(buf, sizeof buf, stdin)) return NULL;
    buf[strcspn(buf, "\n")] = 0;
    return base_xstrdup(buf);
#endif
}

static int interactive(run_session *s) {
    base_err err;
    printf("Chatting. /reset starts over, /exit quits, Ctrl-C stops a reply.\n");
    for (;;) {
        g_interrupted = 0;
        char *line = read_line("> ");
        if (!line) {
            if (g_interrupted) continue;
            fputc('\n', stdout);
            return CLI_OK;
        }
        if (strcmp(line, "/exit") == 0 || strcmp(line, "/quit") == 0) {
            free(line);
            return CLI_OK;
        }
        if (strcmp(line, "/reset") == 0) {
            json_array_clear(s->messages);
            printf("(conversation reset)\n");
        } else if (*line && run_turn(s, line, &err)) {
            fprintf(stderr, "mlxcel: error: %s\n", err.msg);
        }
        free(line);
    }
}

int cli_cmd_run(int argc, char **argv) {
    cli_runtime_flags rtf;
    cli_runtime_init(&rtf);
    run_session s = {.max_new = -1};
    engine_sampling_defaults(&s.sampling);
    const char *prompt = NULL;
    long n_predict = -1;
    cli_parser p;
    cli_parser_init(&p, "run", argc, argv);
    while (cli_next(&p)) {
        if (cli_flag(&p, "-h", "--help")) {
            printf(g_help, cli_runtime_help());
            return CLI_OK;
        }
        if (cli_take_runtime(&p, &rtf) || cli_take(&p, "-p", "--prompt", &prompt) ||
            cli_take_int(&p, "-n", "--n-predict", -1, 1 << 24, &n_predict) ||
            cli_take_sampling(&p, &s.sampling))
            continue;
        if (cli_flag(&p, NULL, "--raw")) {
            s.raw = true;
            continue;
        }
        if (cli_flag(&p, NULL, "--show-reasoning")) {
            s.show_reasoning = true;
            continue;
        }
        if (cli_arg(&p)[0] != '-' && !rtf.model) {
            rtf.model = cli_arg(&p);
            continue;
        }
        cli_unknown(&p);
    }
    if (cli_done(&p)) return CLI_USAGE;
    base_err err;
    if (rtf.model && cli_runtime_resolve(&rtf, &err)) return cli_fail(&err);
    char demo[PATH_MAX];
    const char *dir = rtf.model ? rtf.model : demo_model_dir(demo, sizeof demo);
    if (engine_prompter_open(dir, NULL, &s.pr, &err)) return cli_fail(&err);
    if (engine_runtime_open(dir, &rtf.opts, &s.rt, &err)) {
        engine_prompter_close(s.pr);
        return cli_fail(&err);
    }
    s.max_new = n_predict < 0 ? s.rt->kv_plan.ctx_size : (int)n_predict;
    if (!prompt || isatty(STDERR_FILENO)) {
        char desc[512];
        engine_runtime_describe(s.rt, dir, desc, sizeof desc);
        fprintf(stderr, "mlxcel: %s\n", desc);
    }
    s.messages = json_array();
    struct sigaction sa = {.sa_handler = on_sigint};
    sigaction(SIGINT, &sa, NULL);
    int rc = CLI_OK;
    /* a plain continuation reads as one text only with the words it continues */
    if (prompt && s.raw) fputs(prompt, stdout);
    if (prompt)
        rc = run_turn(&s, prompt, &err) ? cli_fail(&err) : CLI_OK;
    else
        rc = interactive(&s);
    json_decref(s.messages);
    free(s.reply);
    engine_runtime_close(s.rt);
    engine_prompter_close(s.pr);
    return rc;
}
