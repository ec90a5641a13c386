/* A generation request's JSON body parsed into an engine request. */
#ifndef MLXCEL_SERVER_PARAMS_H
#define MLXCEL_SERVER_PARAMS_H

#include "server/server.h"

#include <jansson.h>

#define SERVER_MAX_STOP 16

typedef enum { SERVER_CHAT, SERVER_COMPLETIONS, SERVER_LLAMA_COMPLETION } server_kind;

typedef struct server_params {
    server_kind kind;
    engine_request req; /* prompt, stop and logit_bias point into this struct and the body */
    bool stream, include_usage;
    const char *stop[SERVER_MAX_STOP]; /* (n_stop) strings of the JSON body */
    int n_stop;
    int32_t *ids; /* (n_ids) the prompt, owned */
    int n_ids;
    engine_logit_bias *bias; /* owned */
} server_params;

/* Fills p from the body (which must outlive p). On failure err names the field; call
 * server_params_free either way. */
int server_params_parse(json_t *body, server_kind kind, const server_options *o,
                        const engine_prompter *pr, int vocab, server_params *p, base_err *err);
void server_params_free(server_params *p);

#endif
