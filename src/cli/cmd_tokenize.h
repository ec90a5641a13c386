/* `mlxcel tokenize` and `mlxcel detokenize`. */
#ifndef MLXCEL_CMD_TOKENIZE_H
#define MLXCEL_CMD_TOKENIZE_H

int cli_cmd_tokenize(int argc, char **argv);
int cli_cmd_detokenize(int argc, char **argv);

#endif
