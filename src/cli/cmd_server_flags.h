/* mlxcel-server's flags, shared by cmd_server.c (startup, its own flags, the environment) and
 * cmd_server_llama.c (the llama-server flags that launch scripts carry). */
#ifndef MLXCEL_CMD_SERVER_FLAGS_H
#define MLXCEL_CMD_SERVER_FLAGS_H

#include "cli/cli_runtime.h"
#include "server/server.h"

typedef struct server_flags {
    cli_runtime_flags rt;
    server_options srv;
    engine_sched_options sched;
    const char *template_file;
    const char *template_text; /* --chat-template: Jinja text, a built-in name's text, or NULL */
    json_t *template_kwargs;   /* --chat-template-kwargs, owned */
    const char *cache_type_k, *cache_type_v; /* as given, checked by server_flags_finish */
    const char *api_key_list;                /* --api-key: comma-separated keys */
    const char *api_key_file;                /* --api-key-file: one key a line */
    char **keys;                             /* (n_keys) owned: both of the above together */
    int n_keys;
    bool verbose, log_disable;
    bool embeddings; /* --embeddings */
    bool reranking;  /* --reranking */
    int shutdown_timeout_s;
    bool help;
} server_flags;

/* Takes one of llama-server's flags (-b, -ub, -ctk, -ctv, --chat-template, --api-key-file,
 * --slots, --no-slots, --props, --embeddings, --reranking, --log-format, -v, --log-disable, and the
 * moot ones: -ngl, -fa, -cb, --jinja, --mlock, --no-mmap; --ctx-shift is refused). A moot flag
 * prints a one-line note on stderr. */
bool server_take_llama_flag(cli_parser *p, server_flags *f);
/* What needs all the flags: the KV dtype from -ctk/-ctv, the keys of --api-key and
 * --api-key-file, the log level. Prints its error; returns CLI_OK, CLI_USAGE or CLI_FAIL. */
int server_flags_finish(server_flags *f);
void server_flags_free(server_flags *f);

#endif
