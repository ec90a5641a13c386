/* The SVG line chart: a fixed 760x460 canvas, the plot area left of the legend, axes with
 * round ticks, one polyline with markers per series. */
#include "cli/cli_plot.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

enum { W = 760, H = 460, LEFT = 78, RIGHT = 200, TOP = 62, BOTTOM = 56 };

typedef struct frame {
    double x0, x1, y1; /* data ranges: x in [x0, x1] (log2 when asked), y in [0, y1] */
    double ystep;      /* between y ticks */
    bool log2_x;
} frame;

static double fx(const frame *f, double x) {
    double v = f->log2_x ? log2(x) : x;
    double span = f->x1 > f->x0 ? f->x1 - f->x0 : 1;
    double at = f->x1 > f->x0 ? (v - f->x0) / span : 0.5;
    return LEFT + at * (W - LEFT - RIGHT);
}

static double fy(const frame *f, double y) {
    return H - BOTTOM - y / f->y1 * (H - TOP - BOTTOM);
}

/* Text from the outside (a model's path) cannot break the markup. */
static void put_text(FILE *o, const char *s) {
    for (; *s; s++) {
        if (*s == '<')
            fputs("&lt;", o);
        else if (*s == '>')
            fputs("&gt;", o);
        else if (*s == '&')
            fputs("&amp;", o);
        else if (*s == '"')
            fputs("&quot;", o);
        else
            fputc(*s, o);
    }
}

/* 1, 2 or 5 times a power of ten, the smallest such step that gives at most 6 ticks to max. */
static double round_step(double max) {
    double raw = max / 6, p = pow(10, floor(log10(raw)));
    return raw <= p ? p : raw <= 2 * p ? 2 * p : raw <= 5 * p ? 5 * p : 10 * p;
}

static void axes(FILE *o, const cli_plot *p, const frame *f) {
    double step = f->ystep;
    fprintf(o, "<g font-size=\"12\" fill=\"#444\">\n");
    for (double y = 0; y <= f->y1 + step / 2; y += step) {
        fprintf(o, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#e3e3e3\"/>\n", LEFT,
                W - RIGHT, fy(f, y), fy(f, y));
        fprintf(o, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", LEFT - 6,
                fy(f, y) + 4, y);
    }
    if (f->log2_x) {
        for (double e = ceil(f->x0); e <= f->x1 + 1e-9; e++)
            fprintf(o, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%g</text>\n",
                    fx(f, exp2(e)), H - BOTTOM + 18, exp2(e));
    } else {
        double xs = round_step(f->x1);
        for (double x = 0; x <= f->x1 + xs / 2; x += xs)
            fprintf(o, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%g</text>\n", fx(f, x),
                    H - BOTTOM + 18, x);
    }
    fprintf(o, "<line x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\" stroke=\"#444\"/>\n", LEFT, W - RIGHT,
            H - BOTTOM, H - BOTTOM);
    fprintf(o, "<line x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\" stroke=\"#444\"/>\n", LEFT, LEFT, TOP,
            H - BOTTOM);
    fprintf(o, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">", (LEFT + W - RIGHT) / 2, H - 14);
    put_text(o, p->x_label);
    fprintf(o, "</text>\n<text transform=\"translate(18 %d) rotate(-90)\" text-anchor=\"middle\">",
            (TOP + H - BOTTOM) / 2);
    put_text(o, p->y_label);
    fputs("</text>\n</g>\n", o);
}

static void series(FILE *o, const frame *f, const cli_plot_series *s, int index) {
    fprintf(o, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"", s->color,
            s->dashed ? " stroke-dasharray=\"6 4\"" : "");
    for (int i = 0; i < s->n; i++)
        fprintf(o, "%s%.1f,%.1f", i ? " " : "", fx(f, s->x[i]), fy(f, s->y[i]));
    fputs("\"/>\n", o);
    for (int i = 0; i < s->n && !s->dashed; i++)
        fprintf(o,
                "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"><title>%g: "
                "%.1f</title></circle>\n",
                fx(f, s->x[i]), fy(f, s->y[i]), s->color, s->x[i], s->y[i]);
    int ly = TOP + 10 + 22 * index;
    fprintf(o,
            "<line x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\"%s/>\n",
            W - RIGHT + 16, W - RIGHT + 40, ly, ly, s->color,
            s->dashed ? " stroke-dasharray=\"6 4\"" : "");
    fprintf(o, "<text x=\"%d\" y=\"%d\" font-size=\"12\">", W - RIGHT + 46, ly + 4);
    put_text(o, s->name);
    fputs("</text>\n", o);
}

static bool frame_of(const cli_plot *p, const cli_plot_series *s, int n_series, frame *f) {
    bool any = false;
    double lo = 0, hi = 0, ymax = 0;
    for (int k = 0; k < n_series; k++)
        for (int i = 0; i < s[k].n; i++) {
            if (p->log2_x && !(s[k].x[i] > 0)) return false;
            double v = p->log2_x ? log2(s[k].x[i]) : s[k].x[i];
            lo = any && lo < v ? lo : v;
            hi = any && hi > v ? hi : v;
            ymax = s[k].y[i] > ymax ? s[k].y[i] : ymax;
            any = true;
        }
    if (!any) return false;
    /* a linear x axis starts at 0, as the y axis does; a log2 one spans the powers of two
     * around the data */
    *f = (frame){
        .x0 = p->log2_x ? floor(lo) : 0, .x1 = p->log2_x ? ceil(hi) : hi, .log2_x = p->log2_x};
    double step = round_step(ymax > 0 ? ymax : 1);
    f->y1 = ceil((ymax > 0 ? ymax : 1) * 1.02 / step) * step;
    f->ystep = step;
    return true;
}

int cli_plot_svg(const char *path, const cli_plot *p, const cli_plot_series *s, int n_series,
                 base_err *err) {
    frame f;
    if (!frame_of(p, s, n_series, &f))
        return base_fail(err, "%s: nothing to plot (no points, or an x <= 0 on a log scale)", path);
    FILE *o = fopen(path, "w");
    if (!o) return base_fail(err, "%s: %s", path, strerror(errno));
    fprintf(o,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d "
            "%d\" "
            "font-family=\"sans-serif\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"#fff\"/>\n",
            W, H, W, H);
    fprintf(o, "<text x=\"%d\" y=\"24\" font-size=\"15\" font-weight=\"bold\">", LEFT);
    put_text(o, p->title);
    fprintf(o, "</text>\n<text x=\"%d\" y=\"44\" font-size=\"12\" fill=\"#666\">", LEFT);
    put_text(o, p->subtitle ? p->subtitle : "");
    fputs("</text>\n", o);
    axes(o, p, &f);
    for (int k = 0; k < n_series; k++) series(o, &f, &s[k], k);
    fputs("</svg>\n", o);
    if (fclose(o)) return base_fail(err, "%s: %s", path, strerror(errno));
    return 0;
}
