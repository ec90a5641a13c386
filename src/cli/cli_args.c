/* The flag parser shared by every subcommand. */
#include "cli/cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

void cli_parser_init(cli_parser *p, const char *command, int argc, char **argv) {
    memset(p, 0, sizeof *p);
    p->command = command;
    p->argc = argc;
    p->argv = argv;
    p->i = 0;
}

bool cli_next(cli_parser *p) {
    if (p->status != CLI_OK) return false;
    p->i++;
    p->nearest = NULL;
    return p->i < p->argc;
}

const char *cli_arg(const cli_parser *p) {
    return p->argv[p->i];
}

void cli_usage(cli_parser *p, const char *fmt, ...) {
    if (p->status != CLI_OK) return;
    p->status = CLI_USAGE;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->msg, sizeof p->msg, fmt, ap);
    va_end(ap);
}

/* Levenshtein distance of a[0..na) and b[0..nb), capped at 64 bytes each (flag names). */
static int edit_distance(const char *a, size_t na, const char *b, size_t nb) {
    if (na > 64 || nb > 64) return 64;
    int row[65];
    for (size_t j = 0; j <= nb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= na; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= nb; j++) {
            int up = row[j], best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            diag = up;
            row[j] = best;
        }
    }
    return row[nb];
}

/* Keeps the flag name nearest to the current argument (its part before any '='). */
static void offer(cli_parser *p, const char *name) {
    if (!name) return;
    const char *arg = cli_arg(p), *eq = strchr(arg, '=');
    size_t n = eq ? (size_t)(eq - arg) : strlen(arg);
    int d = edit_distance(arg, n, name, strlen(name));
    if (!p->nearest || d < p->nearest_dist) {
        p->nearest = name;
        p->nearest_dist = d;
    }
}

/* Matches "-x", "--long" or "--long=value"; sets *inline_value for the last form. */
static bool match_name(const char *arg, const char *short_name, const char *long_name,
                       const char **inline_value) {
    *inline_value = NULL;
    if (short_name && strcmp(arg, short_name) == 0) return true;
    if (!long_name) return false;
    size_t n = strlen(long_name);
    if (strncmp(arg, long_name, n) != 0) return false;
    if (arg[n] == 0) return true;
    if (arg[n] == '=') {
        *inline_value = arg + n + 1;
        return true;
    }
    return false;
}

bool cli_take(cli_parser *p, const char *short_name, const char *long_name, const char **value) {
    const char *inline_value;
    offer(p, short_name);
    offer(p, long_name);
    if (!match_name(cli_arg(p), short_name, long_name, &inline_value)) return false;
    if (inline_value) {
        *value = inline_value;
    } else if (p->i + 1 < p->argc) {
        *value = p->argv[++p->i];
    } else {
        cli_usage(p, "%s: option %s needs a value", p->command, cli_arg(p));
        *value = NULL;
    }
    return true;
}

bool cli_flag(cli_parser *p, const char *short_name, const char *long_name) {
    const char *arg = cli_arg(p);
    offer(p, short_name);
    offer(p, long_name);
    return (short_name && strcmp(arg, short_name) == 0) ||
           (long_name && strcmp(arg, long_name) == 0);
}

bool cli_take_int(cli_parser *p, const char *short_name, const char *long_name, long min, long max,
                  long *value) {
    const char *flag = cli_arg(p), *s;
    if (!cli_take(p, short_name, long_name, &s)) return false;
    if (!s) return true;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < min || v > max)
        cli_usage(p, "%s: %s wants an integer in [%ld, %ld], got '%s'", p->command, flag, min, max,
                  s);
    else
        *value = v;
    return true;
}

bool cli_take_float(cli_parser *p, const char *short_name, const char *long_name, double min,
                    double max, double *value) {
    const char *flag = cli_arg(p), *s;
    if (!cli_take(p, short_name, long_name, &s)) return false;
    if (!s) return true;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= min && v <= max))
        cli_usage(p, "%s: %s wants a number in [%g, %g], got '%s'", p->command, flag, min, max, s);
    else
        *value = v;
    return true;
}

void cli_unknown(cli_parser *p) {
    const char *arg = cli_arg(p);
    /* a suggestion only when it is plausibly a typo: at most a third of the name differs */
    size_t n = strcspn(arg, "=");
    bool near = p->nearest && p->nearest_dist <= 3 && (size_t)p->nearest_dist * 3 <= n;
    if (arg[0] == '-' && near)
        cli_usage(p, "%s: unknown option '%s'; did you mean '%s'? (see mlxcel %s --help)",
                  p->command, arg, p->nearest, p->command);
    else if (arg[0] == '-')
        cli_usage(p, "%s: unknown option '%s' (see mlxcel %s --help)", p->command, arg, p->command);
    else
        cli_usage(p, "%s: unexpected argument '%s'", p->command, arg);
}

int cli_done(cli_parser *p) {
    if (p->status != CLI_OK) fprintf(stderr, "mlxcel: error: %s\n", p->msg);
    return p->status;
}

int cli_parse_ids(const char *flag, const char *text, int32_t **ids, int *n, char *msg,
                  size_t msg_size) {
    size_t cap = 16;
    int count = 0;
    int32_t *out = base_xmalloc(cap * sizeof *out);
    const char *s = text;
    while (*s) {
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (errno || end == s || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
            snprintf(msg, msg_size, "%s: expected comma-separated token ids, got '%s'", flag, text);
            free(out);
            return -1;
        }
        if ((size_t)count == cap) out = base_xrealloc(out, (cap *= 2) * sizeof *out);
        out[count++] = (int32_t)v;
        s = *end ? end + 1 : end;
    }
    if (count == 0) {
        snprintf(msg, msg_size, "%s: no token ids given", flag);
        free(out);
        return -1;
    }
    *ids = out;
    *n = count;
    return 0;
}

int cli_fail(const base_err *err) {
    fprintf(stderr, "mlxcel: error: %s\n", err->msg);
    return CLI_FAIL;
}

int cli_usage_fail(const char *fmt, ...) {
    fprintf(stderr, "mlxcel: error: ");
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return CLI_USAGE;
}

void cli_print_json(json_t *o) {
    char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (s) printf("%s\n", s);
    free(s);
    json_decref(o);
}

void cli_log_from_env(void) {
    static const char *const names[] = {"error", "warn", "info", "debug"};
    const char *v = getenv("MLXCEL_LOG_LEVEL");
    for (int i = 0; v && i < 4; i++)
        if (strcmp(v, names[i]) == 0) base_log_set_level((base_log_level)i);
}
