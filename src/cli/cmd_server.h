/* `mlxcel-server`: the OpenAI-compatible server over a model directory. */
#ifndef MLXCEL_CMD_SERVER_H
#define MLXCEL_CMD_SERVER_H

int cli_cmd_server(int argc, char **argv);

#endif
