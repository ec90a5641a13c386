/* GET /metrics: Prometheus text format 0.0.4. The server's own families are named mlxcel_* and
 * mlxcel:*; those llama-server also has are given again under its llamacpp:* names, so that
 * dashboards built for it read this server unchanged. */
#include "server/server_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Request-level latencies span milliseconds to minutes; token gaps a millisecond to a second. */
static const double g_latency_bounds[SERVER_HIST_BUCKETS - 1] = {
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
static const double g_token_bounds[SERVER_HIST_BUCKETS - 1] = {
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10};

void server_metrics_init(server_metrics *m) {
    memset(m, 0, sizeof *m);
    m->ttft.bounds = g_latency_bounds;
    m->latency.bounds = g_latency_bounds;
    m->inter_token.bounds = g_token_bounds;
}

void server_hist_observe(server_hist *h, double seconds) {
    int i = 0;
    while (i < SERVER_HIST_BUCKETS - 1 && seconds > h->bounds[i]) i++;
    __atomic_add_fetch(&h->bucket[i], 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&h->count, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&h->sum_ns, (uint64_t)(seconds > 0 ? seconds * 1e9 : 0), __ATOMIC_RELAXED);
}

void server_metrics_request(server_metrics *m, int n_prompt, int n_generated, double ttft,
                            double total) {
    __atomic_add_fetch(&m->prompt_tokens, (uint64_t)n_prompt, __ATOMIC_RELAXED);
    __atomic_add_fetch(&m->predicted_tokens, (uint64_t)n_generated, __ATOMIC_RELAXED);
    if (n_generated > 0) {
        server_hist_observe(&m->ttft, ttft);
        __atomic_add_fetch(&m->prompt_ns, (uint64_t)(ttft * 1e9), __ATOMIC_RELAXED);
        if (total > ttft)
            __atomic_add_fetch(&m->predicted_ns, (uint64_t)((total - ttft) * 1e9),
                               __ATOMIC_RELAXED);
    }
    server_hist_observe(&m->latency, total);
}

typedef struct text {
    char *buf;
    size_t len, cap;
} text;

static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (t->len + (size_t)n + 1 > t->cap) {
        t->cap = (t->len + (size_t)n + 1) * 2;
        t->buf = base_xrealloc(t->buf, t->cap);
    }
    va_start(ap, fmt);
    vsnprintf(t->buf + t->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    t->len += (size_t)n;
}

static void metric(text *t, const char *type, const char *name, const char *help, double v) {
    put(t, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

static uint64_t load(const uint64_t *v) {
    return __atomic_load_n(v, __ATOMIC_RELAXED);
}

static void histogram(text *t, const char *name, const char *help, const server_hist *h) {
    put(t, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < SERVER_HIST_BUCKETS; i++) {
        cum += load(&h->bucket[i]);
        if (i < SERVER_HIST_BUCKETS - 1)
            put(t, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[i], (unsigned long long)cum);
        else
            put(t, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
    }
    /* the count is the +Inf bucket's, so that a scrape between two updates stays consistent */
    put(t, "%s_sum %.9f\n%s_count %llu\n", name, (double)load(&h->sum_ns) * 1e-9, name,
        (unsigned long long)cum);
}

static void http_families(text *t, const server *s) {
    metric(t, "counter", "mlxcel_http_requests_total", "HTTP requests received",
           (double)load(&s->n_requests));
    metric(t, "counter", "mlxcel_http_read_timeouts_total",
           "connections closed because a request did not arrive within --read-timeout",
           (double)load(&s->n_dropped));
    metric(t, "counter", "mlxcel_http_connections_replaced_total",
           "connections slow to send a request, shut down to make room for a new one",
           (double)load(&s->n_replaced));
    metric(t, "counter", "mlxcel_http_connections_refused_total",
           "connections opened past --max-connections or --max-connections-per-ip",
           (double)load(&s->n_refused));
}

static void engine_families(text *t, const engine_sched_stats *st) {
    metric(t, "counter", "mlxcel_requests_finished_total", "generation requests finished",
           (double)st->requests_done);
    metric(t, "counter", "mlxcel_requests_cancelled_total", "generation requests cancelled",
           (double)st->requests_cancelled);
    metric(t, "gauge", "mlxcel_requests_processing", "sequences running", st->running);
    metric(t, "gauge", "mlxcel_requests_deferred", "requests waiting", st->waiting);
    metric(t, "counter", "mlxcel_tokens_computed_total",
           "tokens through the model (prompt and decode)", (double)st->computed_tokens);
    metric(t, "counter", "mlxcel_prompt_tokens_cached_total",
           "prompt tokens adopted from the prefix cache", (double)st->cached_tokens);
    metric(t, "counter", "mlxcel_tokens_predicted_total", "tokens generated",
           (double)st->generated_tokens);
    metric(t, "counter", "mlxcel_preemptions_total", "sequences preempted for lack of KV blocks",
           (double)st->preemptions);
    metric(t, "counter", "mlxcel_steps_total", "scheduler steps", (double)st->steps);
    metric(t, "counter", "mlxcel_step_seconds_total", "time in scheduler steps", st->step_seconds);
    metric(t, "counter", "mlxcel_forward_seconds_total", "time in the model's forward pass",
           st->forward_seconds);
    metric(t, "gauge", "mlxcel_kv_blocks_capacity", "KV blocks in the pool",
           (double)st->pool.capacity);
    metric(t, "gauge", "mlxcel_kv_blocks_free", "KV blocks free", (double)st->pool.free);
    metric(t, "gauge", "mlxcel_kv_blocks_cached", "KV blocks held only by the prefix cache",
           (double)st->pool.cached);
    metric(t, "gauge", "mlxcel_kv_blocks_referenced", "KV blocks held by sequences",
           (double)st->pool.referenced);
    if (st->local_pool.capacity == 0) return;
    /* the local (sliding-window) layers' blocks, which go back as sequences pass the window */
    metric(t, "gauge", "mlxcel_kv_local_blocks_capacity", "local-layer KV blocks in the pool",
           (double)st->local_pool.capacity);
    metric(t, "gauge", "mlxcel_kv_local_blocks_free", "local-layer KV blocks free",
           (double)st->local_pool.free);
    metric(t, "gauge", "mlxcel_kv_local_blocks_cached",
           "local-layer KV blocks held only by the prefix cache", (double)st->local_pool.cached);
    metric(t, "gauge", "mlxcel_kv_local_blocks_referenced",
           "local-layer KV blocks held by sequences", (double)st->local_pool.referenced);
}

static double ratio(double a, double b) {
    return b > 0 ? a / b : 0;
}

/* The latency families, the queue, the KV use and the prefix cache's share of prompts. */
static void service_families(text *t, const server *s, const engine_sched_stats *st) {
    const server_metrics *m = &s->metrics;
    histogram(t, "mlxcel:time_to_first_token_seconds",
              "from a generation request's arrival to its first token", &m->ttft);
    histogram(t, "mlxcel:inter_token_latency_seconds",
              "between consecutive tokens of a generation request", &m->inter_token);
    histogram(t, "mlxcel:request_latency_seconds", "from a generation request's arrival to its end",
              &m->latency);
    metric(t, "gauge", "mlxcel:queue_depth", "requests waiting to start", st->waiting);
    double kv_used = ratio((double)st->pool.referenced, (double)st->pool.capacity);
    metric(t, "gauge", "mlxcel:kv_cache_usage_ratio", "share of KV blocks held by sequences",
           kv_used);
    metric(t, "gauge", "mlxcel:prefix_cache_hit_ratio",
           "share of finished requests' prompt tokens adopted from the prefix cache",
           ratio((double)st->cached_tokens, (double)load(&m->prompt_tokens)));
}

/* llama-server's families, as its /metrics names and means them. */
static void llamacpp_families(text *t, const server *s, const engine_sched_stats *st) {
    const server_metrics *m = &s->metrics;
    double prompt_s = (double)load(&m->prompt_ns) * 1e-9;
    double predicted_s = (double)load(&m->predicted_ns) * 1e-9;
    double prompt = (double)load(&m->prompt_tokens), predicted = (double)load(&m->predicted_tokens);
    int64_t block = s->rt->kv_plan.geom.block_size;
    metric(t, "counter", "llamacpp:prompt_tokens_total", "Number of prompt tokens processed.",
           prompt);
    metric(t, "counter", "llamacpp:prompt_seconds_total", "Prompt process time", prompt_s);
    metric(t, "counter", "llamacpp:tokens_predicted_total",
           "Number of generation tokens processed.", predicted);
    metric(t, "counter", "llamacpp:tokens_predicted_seconds_total", "Predict process time",
           predicted_s);
    metric(t, "counter", "llamacpp:n_decode_total", "Total number of llama_decode() calls",
           (double)st->steps);
    metric(t, "gauge", "llamacpp:prompt_tokens_seconds", "Average prompt throughput in tokens/s.",
           ratio(prompt, prompt_s));
    metric(t, "gauge", "llamacpp:predicted_tokens_seconds",
           "Average generation throughput in tokens/s.", ratio(predicted, predicted_s));
    metric(t, "gauge", "llamacpp:kv_cache_usage_ratio",
           "KV-cache usage. 1 means 100 percent usage.",
           ratio((double)st->pool.referenced, (double)st->pool.capacity));
    metric(t, "gauge", "llamacpp:kv_cache_tokens", "KV-cache tokens.",
           (double)(st->pool.referenced * block));
    metric(t, "gauge", "llamacpp:requests_processing", "Number of requests processing.",
           st->running);
    metric(t, "gauge", "llamacpp:requests_deferred", "Number of requests deferred.", st->waiting);
}

enum MHD_Result server_route_metrics(server *s, struct MHD_Connection *c) {
    if (!s->o.metrics)
        return server_reply_error(s, c, 501, "not_supported_error",
                                  "metrics are off (start the server with --metrics)");
    engine_sched_stats st = engine_sched_get_stats(s->sched);
    text t = {0};
    http_families(&t, s);
    engine_families(&t, &st);
    service_families(&t, s, &st);
    llamacpp_families(&t, s, &st);
    struct MHD_Response *r = MHD_create_response_from_buffer(t.len, t.buf, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", "text/plain; version=0.0.4");
    enum MHD_Result rc = server_queue(s, c, 200, r);
    MHD_destroy_response(r);
    return rc;
}
