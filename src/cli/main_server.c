/* `mlxcel-server`: see cmd_server.c. */
#include "cli/cmd_server.h"

int main(int argc, char **argv) {
    return cli_cmd_server(argc, argv);
}
