/* The bench's decode curve: gathered from a run or from its --json rows, drawn by cli_plot. */
#include "cli/cmd_bench_plot.h"

#include "cli/cli_plot.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Kept in batch order, so that the lines run left to right. */
void bench_curve_add(bench_curve *c, int batch, double tok_s, double share) {
    if (c->n == BENCH_CURVE_MAX) return;
    int i = c->n++;
    for (; i > 0 && c->batch[i - 1] > batch; i--) {
        c->batch[i] = c->batch[i - 1];
        c->tok_s[i] = c->tok_s[i - 1];
        c->ceiling[i] = c->ceiling[i - 1];
    }
    c->batch[i] = batch;
    c->tok_s[i] = tok_s;
    /* the share is measured / ceiling, both in bytes read a second */
    c->ceiling[i] = share > 0 ? tok_s / share : 0;
}

/* One --json row: decode rows (those with a ceiling share) join the curve; every decode row
 * must be of the same test and ceiling. */
static int add_row(const char *where, json_t *o, bench_curve *c, char *test, size_t test_size,
                   base_err *err) {
    if (!json_is_object(o)) return base_fail(err, "%s: not a JSON object", where);
    json_t *share = json_object_get(o, "ceiling_share");
    if (!share) return 0;
    json_t *b = json_object_get(o, "batch"), *t = json_object_get(o, "tok_per_s");
    const char *name = json_string_value(json_object_get(o, "test"));
    const char *ceiling = json_string_value(json_object_get(o, "ceiling"));
    if (!json_is_integer(b) || json_integer_value(b) < 1)
        return base_fail(err, "%s: 'batch' is not a positive integer", where);
    if (!json_is_number(t) || json_number_value(t) < 0)
        return base_fail(err, "%s: 'tok_per_s' is not a number >= 0", where);
    if (!json_is_number(share)) return base_fail(err, "%s: 'ceiling_share' is not a number", where);
    if (!name) return base_fail(err, "%s: 'test' is not a string", where);
    if (!ceiling || strlen(ceiling) >= sizeof c->ceiling_name)
        return base_fail(err, "%s: 'ceiling' is not a bandwidth's name", where);
    if (test[0] && strcmp(test, name) != 0)
        return base_fail(err, "%s: a row of test %s among rows of %s: plot one run's rows", where,
                         name, test);
    if (test[0] && strcmp(c->ceiling_name, ceiling) != 0)
        return base_fail(err,
                         "%s: a row against the %s bandwidth among rows against the %s: "
                         "plot one run's rows",
                         where, ceiling, c->ceiling_name);
    if (c->n == BENCH_CURVE_MAX)
        return base_fail(err, "%s: more than %d decode rows", where, BENCH_CURVE_MAX);
    if (!test[0]) {
        snprintf(test, test_size, "%s", name);
        snprintf(c->ceiling_name, sizeof c->ceiling_name, "%s", ceiling);
        const char *model = json_string_value(json_object_get(o, "model"));
        const char *device = json_string_value(json_object_get(o, "device"));
        const char *backend = json_string_value(json_object_get(o, "backend"));
        snprintf(c->title, sizeof c->title, "%s: decode, %s", model ? model : "model", name);
        snprintf(c->subtitle, sizeof c->subtitle, "%s (%s backend)", device ? device : "device",
                 backend ? backend : "?");
    }
    bench_curve_add(c, (int)json_integer_value(b), json_number_value(t), json_number_value(share));
    return 0;
}

int bench_curve_read(const char *path, bench_curve *c, base_err *err) {
    FILE *f = fopen(path, "r");
    if (!f) return base_fail(err, "--plot-from %s: %s", path, strerror(errno));
    char line[8192], where[PATH_MAX + 32], test[48] = "";
    int rc = 0;
    for (int no = 1; rc == 0 && fgets(line, sizeof line, f); no++) {
        if (strspn(line, " \t\r\n") == strlen(line)) continue;
        snprintf(where, sizeof where, "%s:%d", path, no);
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        rc = o ? add_row(where, o, c, test, sizeof test, err)
               : base_fail(err, "%s: not JSON: %s", where, je.text);
        json_decref(o);
    }
    fclose(f);
    if (rc == 0 && c->n == 0)
        return base_fail(err, "--plot-from %s: no decode rows (rows with ceiling_share)", path);
    return rc;
}

int bench_curve_plot(const char *path, const bench_curve *c, base_err *err) {
    double ceil_x[BENCH_CURVE_MAX], ceil_y[BENCH_CURVE_MAX];
    int n_ceil = 0;
    for (int i = 0; i < c->n; i++)
        if (c->ceiling[i] > 0) ceil_x[n_ceil] = c->batch[i], ceil_y[n_ceil++] = c->ceiling[i];
    char ceiling[48];
    snprintf(ceiling, sizeof ceiling, "%s-bandwidth ceiling", c->ceiling_name);
    cli_plot_series s[2] = {
        {.name = "measured", .color = "#2f63d8", .x = c->batch, .y = c->tok_s, .n = c->n},
        {.name = ceiling,
         .color = "#d0542f",
         .dashed = true,
         .x = ceil_x,
         .y = ceil_y,
         .n = n_ceil},
    };
    char sub[400];
    if (n_ceil)
        snprintf(sub, sizeof sub,
                 "%s; ceiling: weights once a step + every sequence's K/V at the %s bandwidth",
                 c->subtitle, c->ceiling_name);
    else
        snprintf(sub, sizeof sub, "%s", c->subtitle);
    cli_plot p = {.title = c->title,
                  .subtitle = sub,
                  .x_label = "concurrent sequences (batch)",
                  .y_label = "output tokens/s",
                  .log2_x = true};
    return cli_plot_svg(path, &p, s, n_ceil ? 2 : 1, err);
}
