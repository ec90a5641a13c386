/* The progress line: only on a terminal, as a log or a pipe would keep every redraw. */
#include "cli/cli_progress.h"

#include "base/base.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

void cli_progress_init(cli_progress *p, const char *label, const char *unit) {
    memset(p, 0, sizeof *p);
    p->on = isatty(STDERR_FILENO);
    snprintf(p->label, sizeof p->label, "%s", label);
    p->unit = unit;
}

void cli_progress_draw(cli_progress *p, long done, long total) {
    if (!p->on) return;
    double now = base_now();
    if (!p->drawn) p->t0 = now, p->done0 = done;
    p->drawn = true;
    enum { WIDTH = 30 };
    int fill = total > 0 ? (int)((double)done / (double)total * WIDTH) : WIDTH;
    char bar[WIDTH + 1];
    for (int i = 0; i < WIDTH; i++) bar[i] = i < fill ? '#' : '.';
    bar[WIDTH] = 0;
    double sec = now - p->t0;
    char left[32] = "";
    if (done > p->done0 && done < total && sec > 0)
        snprintf(left, sizeof left, ", ~%.1f s left",
                 sec / (double)(done - p->done0) * (double)(total - done));
    fprintf(stderr, "\r\033[K%s [%s] %3d%% %ld/%ld %s, %.1f s%s", p->label, bar,
            total > 0 ? (int)(100.0 * (double)done / (double)total) : 100, done, total, p->unit,
            sec, left);
    fflush(stderr);
}

void cli_progress_clear(cli_progress *p) {
    if (!p->on || !p->drawn) return;
    fputs("\r\033[K", stderr);
    fflush(stderr);
    p->drawn = false;
}
