/* A one-line progress bar on stderr, redrawn in place, for a terminal only:
 *   loading [############..................]  40% 1843/4608 MiB, 1.2 s, ~1.8 s left */
#ifndef MLXCEL_CLI_PROGRESS_H
#define MLXCEL_CLI_PROGRESS_H

#include <stdbool.h>

typedef struct cli_progress {
    bool on;          /* stderr is a terminal: otherwise every call does nothing */
    char label[80];   /* what is in progress */
    const char *unit; /* what done and total count (static) */
    double t0;        /* base_now() at the first draw */
    long done0;       /* done at the first draw: the rate counts only what came after */
    bool drawn;       /* a line is on the screen */
} cli_progress;

void cli_progress_init(cli_progress *p, const char *label, const char *unit);
/* Redraws the line: the bar, the share, done/total, the time so far and, once a rate is known,
 * the time left. */
void cli_progress_draw(cli_progress *p, long done, long total);
/* Erases the line, so that what is printed next takes its place. */
void cli_progress_clear(cli_progress *p);

#endif
