/* Flags shared by the subcommands that run a model (-m, -t, --device, -c, --kv-*). */
#ifndef MLXCEL_CLI_RUNTIME_H
#define MLXCEL_CLI_RUNTIME_H

#include "cli/cli.h"
#include "cli/cli_progress.h"
#include "engine/engine.h"

#include <limits.h>

typedef struct cli_runtime_flags {
    const char *model; /* as given to -m; cli_runtime_resolve points it at model_dir */
    bool offline;      /* --offline: never download */
    char model_dir[PATH_MAX];
    engine_options opts;
    cli_progress load_bar; /* opts.on_load_ctx points here: f must stay where it was inited */
} cli_runtime_flags;

void cli_runtime_init(cli_runtime_flags *f);
/* Takes one of the shared flags at the parser's position. */
bool cli_take_runtime(cli_parser *p, cli_runtime_flags *f);
/* Turns f->model (a directory, owner/name or a name) into the model's directory, downloading
 * it when needed. */
int cli_runtime_resolve(cli_runtime_flags *f, base_err *err);
/* Takes a sampling flag: --temp, --top-k, --top-p, --min-p, --repeat-penalty, --seed. */
bool cli_take_sampling(cli_parser *p, engine_sampling *s);
/* The help lines for the runtime flags. */
const char *cli_runtime_help(void);

#endif
