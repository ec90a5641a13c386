/* `mlxcel-server`: see cmd_server.c. */
#include "cli/cli.h"
#include "cli/cmd_server.h"

int main(int argc, char **argv) {
    cli_log_from_env();
    return cli_cmd_server(argc, argv);
}
