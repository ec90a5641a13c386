/* What a test request's events brought, gathered under a lock for the test thread to wait on:
 * tokens, text, the finish and its error, and the order in which requests got a first token. */
#ifndef MLXCEL_TESTS_ENGINE_TEST_COLLECTOR_H
#define MLXCEL_TESTS_ENGINE_TEST_COLLECTOR_H

#include "engine/engine.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define COLLECT_MAX_TOKENS 160

typedef struct collector {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t tokens[COLLECT_MAX_TOKENS];
    int n_tokens;
    int n_events; /* token events, kept or not */
    char text[4096];
    size_t text_len;
    engine_finish finish;
    int n_final; /* must end at exactly 1 */
    int order;   /* collect_order when its first token came: admission order */
    char error[512];
} collector;

/* Requests that have had a first token; a test of admission order resets it. */
static int collect_order;

/* The engine_request.on_event of a request whose ctx is a collector. */
static inline void collect_event(void *ctx, const engine_event *ev) {
    collector *c = ctx;
    pthread_mutex_lock(&c->mu);
    if (ev->token >= 0) {
        if (c->n_tokens == 0) c->order = __atomic_add_fetch(&collect_order, 1, __ATOMIC_SEQ_CST);
        if (c->n_tokens < COLLECT_MAX_TOKENS) c->tokens[c->n_tokens++] = ev->token;
        c->n_events++;
    }
    if (ev->text_len && c->text_len + ev->text_len < sizeof c->text) {
        memcpy(c->text + c->text_len, ev->text, ev->text_len);
        c->text_len += ev->text_len;
    }
    if (ev->error) snprintf(c->error, sizeof c->error, "%s", ev->error);
    if (ev->finish != ENGINE_FINISH_NONE) {
        c->finish = ev->finish;
        c->n_final++;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
}

static inline void collector_init(collector *c) {
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
}

/* Until the request has finished. */
static inline void collector_wait(collector *c) {
    pthread_mutex_lock(&c->mu);
    while (c->n_final == 0) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

#endif
