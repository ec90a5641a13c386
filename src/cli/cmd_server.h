/* `mlxcel-server`: the OpenAI-compatible server over a model directory. */
#ifndef MLXCEL_CMD_SERVER_H
#define MLXCEL_CMD_SERVER_H

#include "cli/cli.h"
#include "server/server.h"

int cli_cmd_server(int argc, char **argv);

/* The chat-answer flags (cmd_server_chat.c): their help lines, the parser's hook (kwargs: the
 * parsed --chat-template-kwargs, caller decrefs), and their effect on the loaded prompter,
 * whose template variables take the kwargs. */
extern const char cli_server_chat_help[];
bool cli_take_server_chat(cli_parser *p, server_options *o, json_t **kwargs);
void cli_server_chat_apply(const server_options *o, json_t *kwargs, engine_prompter *pr);

#endif
