/* Models by name on the command line: `mlxcel list`, `mlxcel rm`, and the -m resolution the
 * model commands share (a directory, an owner/name repo id, or a bare name). */
#ifndef MLXCEL_CMD_MODELS_H
#define MLXCEL_CMD_MODELS_H

#include "cli/cli.h"

int cli_cmd_list(int argc, char **argv);
int cli_cmd_rm(int argc, char **argv);

/* Takes -m/--model NAME or --offline at the parser's position. */
bool cli_take_model(cli_parser *p, const char **model, bool *offline);
/* Replaces *model by the directory that holds it, downloading it into the store when needed
 * (an error when offline). The directory is written into dir (dir_size bytes, caller's), and
 * *model then points at dir. A name that is neither a directory nor a repo id is left as it
 * is, for the loader to report. */
int cli_model_resolve(const char **model, bool offline, char *dir, size_t dir_size, base_err *err);

#endif
