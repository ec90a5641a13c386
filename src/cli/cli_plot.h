/* Line charts as plain SVG text (no dependencies): for `mlxcel bench --plot`. */
#ifndef MLXCEL_CLI_PLOT_H
#define MLXCEL_CLI_PLOT_H

#include "base/base.h"

#include <stdbool.h>

typedef struct cli_plot_series {
    const char *name;    /* in the legend */
    const char *color;   /* an SVG color */
    bool dashed;         /* drawn dashed, as a ceiling rather than a measurement */
    const double *x, *y; /* (n) the points, x ascending */
    int n;
} cli_plot_series;

typedef struct cli_plot {
    const char *title, *subtitle, *x_label, *y_label;
    bool log2_x; /* x on a log2 scale (batch sizes), ticked at powers of two */
} cli_plot;

/* Writes the chart to path; y runs from 0 to a round number over the largest value. Needs at
 * least one point; x values must be > 0 with log2_x. */
int cli_plot_svg(const char *path, const cli_plot *p, const cli_plot_series *s, int n_series,
                 base_err *err);

#endif
