/* Memory read bandwidth, the ceiling of a decode step that streams the weights: T threads each
 * sum their own slice of a buffer far larger than the caches, best of R passes, bytes read per
 * second printed in GB/s (1e9). A copy's read + write is not this ceiling (a write costs
 * a read for ownership and a write-back), so `mlxcel bench`'s copy bandwidth is not used here.
 *
 *   bench_read_bw [THREADS=2] [MIB=1024] [REPS=5]
 *
 * Built by bench/run_cpu.sh: cc -std=c11 -O2 -pthread. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    const uint64_t *p;
    size_t n;
    pthread_barrier_t *start;
    uint64_t sum;
} slice;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Eight independent sums so that the loads, not an add chain, set the pace; the sum is
 * stored where the caller can see it, so the compiler keeps every load. */
static void *read_slice(void *arg) {
    slice *s = arg;
    pthread_barrier_wait(s->start);
    uint64_t a[8] = {0};
    for (size_t i = 0; i + 8 <= s->n; i += 8)
        for (int k = 0; k < 8; k++) a[k] += s->p[i + k];
    s->sum = a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
    return NULL;
}

static int arg(int argc, char **argv, int i, int def, int lo, int hi) {
    if (argc <= i) return def;
    char *end;
    long v = strtol(argv[i], &end, 10);
    if (*end || v < lo || v > hi) {
        fprintf(stderr, "bench_read_bw: argument %d (%s) must be an integer in %d..%d\n", i,
                argv[i], lo, hi);
        exit(2);
    }
    return (int)v;
}

int main(int argc, char **argv) {
    if (argc > 4) {
        fprintf(stderr, "usage: bench_read_bw [THREADS=2] [MIB=1024] [REPS=5]\n");
        return 2;
    }
    int threads = arg(argc, argv, 1, 2, 1, 256);
    int mib = arg(argc, argv, 2, 1024, 64, 65536);
    int reps = arg(argc, argv, 3, 5, 1, 1000);
    size_t words = (size_t)mib << 17, per = words / (size_t)threads / 8 * 8;
    uint64_t *buf = malloc(words * sizeof *buf);
    pthread_t *tid = malloc((size_t)threads * sizeof *tid);
    slice *sl = malloc((size_t)threads * sizeof *sl);
    if (!buf || !tid || !sl) {
        fprintf(stderr, "bench_read_bw: cannot allocate %d MiB\n", mib);
        return 1;
    }
    memset(buf, 1, words * sizeof *buf); /* faults every page in before the timing */
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
    double best = 0;
    for (int r = 0; r < reps; r++) {
        for (int t = 0; t < threads; t++) {
            sl[t] = (slice){.p = buf + (size_t)t * per, .n = per, .start = &start};
            if (pthread_create(&tid[t], NULL, read_slice, &sl[t])) {
                fprintf(stderr, "bench_read_bw: cannot start thread %d\n", t);
                return 1;
            }
        }
        pthread_barrier_wait(&start);
        double t0 = now();
        for (int t = 0; t < threads; t++) pthread_join(tid[t], NULL);
        double sec = now() - t0;
        if (best == 0 || sec < best) best = sec;
    }
    double bytes = (double)per * (double)threads * sizeof *buf;
    printf("{\"threads\":%d,\"mib\":%d,\"read_gb_per_s\":%.3f}\n", threads, mib,
           bytes / best / 1e9);
    pthread_barrier_destroy(&start);
    free(sl);
    free(tid);
    free(buf);
    return 0;
}
