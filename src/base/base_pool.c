/* The thread pool: persistent workers woken per parallel-for, so that a forward pass with
 * hundreds of small ops does not pay thread creation each time. The caller is worker 0. */
#include "base/base.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

struct base_pool {
    int n_threads;      /* workers including the caller */
    pthread_t *threads; /* (n_threads - 1) */
    pthread_mutex_t mu;
    pthread_cond_t wake; /* new job or shutdown */
    pthread_cond_t done; /* a worker finished its range */
    uint64_t generation; /* bumped per job */
    int pending;         /* workers still running the current job */
    bool stop;
    base_pool_fn fn;
    void *ctx;
    int64_t n;
};

typedef struct {
    base_pool *pool;
    int index;
} pool_worker;

static void pool_run_range(base_pool *p, int index) {
    int64_t per = (p->n + p->n_threads - 1) / p->n_threads;
    int64_t lo = per * index;
    int64_t hi = lo + per < p->n ? lo + per : p->n;
    for (int64_t i = lo; i < hi; i++) p->fn(p->ctx, i);
}

static void *pool_worker_main(void *arg) {
    pool_worker *w = arg;
    base_pool *p = w->pool;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->generation == seen) pthread_cond_wait(&p->wake, &p->mu);
        if (p->stop) break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        pool_run_range(p, w->index);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    free(w);
    return NULL;
}

int base_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

base_pool *base_pool_create(int n_threads) {
    if (n_threads <= 0) n_threads = base_cpu_count();
    base_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    for (int i = 1; i < n_threads; i++) {
        pool_worker *w = malloc(sizeof *w);
        w->pool = p;
        w->index = i;
        if (pthread_create(&p->threads[i - 1], NULL, pool_worker_main, w) != 0) {
            free(w);
            p->n_threads = i; /* run with the workers that did start */
            break;
        }
    }
    return p;
}

void base_pool_destroy(base_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i - 1], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    free(p->threads);
    free(p);
}

int base_pool_threads(const base_pool *p) {
    return p ? p->n_threads : 1;
}

void base_pool_for(base_pool *p, int64_t n, base_pool_fn fn, void *ctx) {
    if (n <= 0) return;
    if (!p || p->n_threads == 1 || n == 1) {
        for (int64_t i = 0; i < n; i++) fn(ctx, i);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->pending = p->n_threads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    pool_run_range(p, 0);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

void base_cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, int ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(cv, mu, &ts);
}
