/* `mlxcel bench --plot`: decode tok/s against batch size, with the bandwidth ceiling, as SVG;
 * from this run's rows, or (--plot-from) from the --json rows of an earlier one. */
#ifndef MLXCEL_CMD_BENCH_PLOT_H
#define MLXCEL_CMD_BENCH_PLOT_H

#include "base/base.h"

#define BENCH_CURVE_MAX 64

typedef struct bench_curve {
    int n;
    double batch[BENCH_CURVE_MAX];   /* (n) ascending */
    double tok_s[BENCH_CURVE_MAX];   /* (n) measured output tokens/s */
    double ceiling[BENCH_CURVE_MAX]; /* (n) tokens/s at the ceiling's bandwidth; 0: not known */
    char ceiling_name[16];           /* "read", "copy": the bandwidth of `ceiling` */
    char title[256], subtitle[256];
} bench_curve;

/* Adds a decode row; share: the row's share of the ceiling's bandwidth (0: unknown). */
void bench_curve_add(bench_curve *c, int batch, double tok_s, double share);
/* Reads the rows `mlxcel bench --json` printed (one object a line; prefill rows are passed
 * over). An error names the file, the line and the field. */
int bench_curve_read(const char *path, bench_curve *c, base_err *err);
int bench_curve_plot(const char *path, const bench_curve *c, base_err *err);

#endif
