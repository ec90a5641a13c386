/* cli: the `mlxcel` subcommands and `mlxcel-server`, and the one flag parser they share.
 * Exit status: 0 success, 1 runtime error, 2 usage error. Errors print one line
 * "mlxcel: error: ..." to stderr naming the flag, file, tensor or field at fault. */
#ifndef MLXCEL_CLI_H
#define MLXCEL_CLI_H

#include "base/base.h"

#include <jansson.h>

#include <stdio.h>

enum { CLI_OK = 0, CLI_FAIL = 1, CLI_USAGE = 2 };

/* The flag parser walks argv with an index; every subcommand loops:
 *     cli_parser p;
 *     cli_parser_init(&p, "generate", argc, argv);
 *     while (cli_next(&p)) {
 *         if (cli_take(&p, "-m", "--model", &model)) continue;
 *         ...
 *         cli_unknown(&p);
 *     }
 *     if (cli_done(&p)) return CLI_USAGE;
 * A parse error is recorded in the parser (first one wins) and reported by cli_done. */
typedef struct cli_parser {
    const char *command; /* "generate", used in messages */
    int argc;
    char **argv;
    int i;      /* index of the argument being looked at */
    int status; /* CLI_OK, or CLI_USAGE after the first error */
    char msg[512];
    /* the flag name closest to the current argument among those it was tried against, for
     * cli_unknown's suggestion: every take/flag call offers its names */
    const char *nearest;
    int nearest_dist;
} cli_parser;

void cli_parser_init(cli_parser *p, const char *command, int argc, char **argv);
/* Next argument index to look at, or false at the end. */
bool cli_next(cli_parser *p);
const char *cli_arg(const cli_parser *p);
/* True when the current argument is `short_name` or `long_name` (either may be NULL), also
 * in the --long=value form; takes its value (error when missing). */
bool cli_take(cli_parser *p, const char *short_name, const char *long_name, const char **value);
/* True when the current argument is this boolean flag. */
bool cli_flag(cli_parser *p, const char *short_name, const char *long_name);
bool cli_take_int(cli_parser *p, const char *short_name, const char *long_name, long min, long max,
                  long *value);
bool cli_take_float(cli_parser *p, const char *short_name, const char *long_name, double min,
                    double max, double *value);
/* Records "unknown option" (or a stray positional) for the current argument; an option gets
 * the closest spelling of the flags it was tried against suggested. */
void cli_unknown(cli_parser *p);
/* Records a usage error (first one wins). */
void cli_usage(cli_parser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prints the recorded usage error, if any, and returns the status (0 or 2). */
int cli_done(cli_parser *p);

/* Parses "1,2,3" into ids (caller frees); a usage error names `flag` on bad input. */
int cli_parse_ids(const char *flag, const char *text, int32_t **ids, int *n, char *msg,
                  size_t msg_size);

/* Sets the log level from MLXCEL_LOG_LEVEL (error, warn, info, debug; default warn). */
void cli_log_from_env(void);

/* Prints o as one compact line on stdout (keys in insertion order) and releases it. */
void cli_print_json(json_t *o);

/* Prints "mlxcel: error: <msg>" and returns CLI_FAIL. */
int cli_fail(const base_err *err);
/* Prints "mlxcel: error: <fmt>" and returns CLI_USAGE. */
int cli_usage_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Subcommands: each takes argv with argv[0] = the subcommand's name. The table of them is
 * in main_mlxcel.c. */
typedef int (*cli_cmd_fn)(int argc, char **argv);
int cli_cmd_generate(int argc, char **argv);
int cli_cmd_logits(int argc, char **argv);
int cli_cmd_quantize(int argc, char **argv);
int cli_cmd_run(int argc, char **argv);
int cli_cmd_bench(int argc, char **argv);
int cli_cmd_arch(int argc, char **argv);
int cli_cmd_inspect(int argc, char **argv);
int cli_cmd_perplexity(int argc, char **argv);

int cli_cmd_template(int argc, char **argv);

#endif
