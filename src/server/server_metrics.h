/* What the server measures for GET /metrics and the per-request log line: latency histograms,
 * token counters, and the Prometheus text they are written as. The counters are atomics,
 * updated from the connection threads and the scheduler's callback. */
#ifndef MLXCEL_SERVER_METRICS_H
#define MLXCEL_SERVER_METRICS_H

#include <stdint.h>

#define SERVER_HIST_BUCKETS 14

/* A Prometheus histogram over fixed bounds (seconds). */
typedef struct server_hist {
    const double *bounds;                 /* (SERVER_HIST_BUCKETS - 1) upper bounds, then +Inf */
    uint64_t bucket[SERVER_HIST_BUCKETS]; /* not cumulative: each observation counts once */
    uint64_t count, sum_ns;
} server_hist;

typedef struct server_metrics {
    server_hist ttft;                         /* submission to first token */
    server_hist inter_token;                  /* between consecutive tokens of a request */
    server_hist latency;                      /* submission to the request's end */
    uint64_t prompt_tokens, predicted_tokens; /* of finished generation requests */
    uint64_t prompt_ns, predicted_ns;         /* their time to first token, and after it */
} server_metrics;

void server_metrics_init(server_metrics *m);
void server_hist_observe(server_hist *h, double seconds);
/* One generation request ended: its histograms and counters. */
void server_metrics_request(server_metrics *m, int n_prompt, int n_generated, double ttft,
                            double total);

#endif
