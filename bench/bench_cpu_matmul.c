/* The CPU quantized matmul alone, on the Llama-3.2-1B shapes: one row of x (decode, figure:
 * weight GB/s) and 128 rows (prefill, figure: GMAC/s), 4- and 8-bit MLX affine weights in
 * groups of 64 with bf16 scales. In one thread times are the thread's CPU time, best of
 * ROUNDS rounds of CALLS calls: on a machine shared with other work that is what stays
 * comparable between two builds run in turns (wall time counts the other work's slices too);
 * with more threads they are wall time. Weights are malloc'd, not a checkpoint's mmap. Each
 * shape runs on the linear's own layout and, where the backend repacks it as a model's load
 * does (pack_linear), on the packed copy.
 *
 *   build/bench/bench_cpu_matmul [BITS] [ROWS] [THREADS]   (defaults: both widths, 1 and 128
 *                                                            rows, 1 thread) */
#include "backend/backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { ROUNDS = 5, GROUP = 64 };

static clockid_t clock_id = CLOCK_THREAD_CPUTIME_ID;

static double thread_seconds(void) {
    struct timespec ts;
    clock_gettime(clock_id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng = 0x2545f4914f6cdd1dull;

static uint8_t rand_byte(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint8_t)(rng >> 32);
}

/* Best seconds per call of y = x W^T for a random out x in weight of `bits`, repacked first
 * with `pack`; -1 where the backend does not repack it. */
static double time_matmul(be_backend *be, int bits, int64_t out, int64_t in, int64_t n, int calls,
                          bool pack) {
    size_t wbytes = (size_t)(out * in * bits / 8), ng = (size_t)(out * in / GROUP);
    uint8_t *w = malloc(wbytes);
    uint16_t *s = malloc(ng * sizeof(uint16_t)), *b = malloc(ng * sizeof(uint16_t));
    float *x = malloc((size_t)(n * in) * sizeof(float)), *y = malloc((size_t)(n * out) * 4);
    for (size_t i = 0; i < wbytes; i++) w[i] = rand_byte();
    for (size_t i = 0; i < ng; i++) {
        s[i] = base_f32_to_bf16(0.01f * (float)(rand_byte() % 7 + 1));
        b[i] = base_f32_to_bf16(-0.05f * (float)(rand_byte() % 5));
    }
    for (int64_t i = 0; i < n * in; i++) x[i] = (float)((int)rand_byte() - 128) / 64.0f;
    be_linear lin = {.out = out,
                     .in = in,
                     .bits = bits,
                     .group_size = GROUP,
                     .dtype = BASE_DTYPE_BF16,
                     .weight = w,
                     .scales = s,
                     .biases = b};
    be_tensor xt = {x, BASE_DTYPE_F32, n, in}, yt = {y, BASE_DTYPE_F32, n, out};
    base_err err = {{0}};
    double best = 1e30;
    if (pack && be->ops->pack_linear && be->ops->pack_linear(be, &lin, &err)) {
        fprintf(stderr, "bench_cpu_matmul: %s\n", err.msg);
        exit(1);
    }
    if (pack && !lin.packed) best = -1;
    for (int round = 0; round <= ROUNDS && best >= 0; round++) {
        double t0 = thread_seconds();
        for (int c = 0; c < calls; c++) {
            if (be->ops->matmul(be, &xt, &lin, &yt, &err)) {
                fprintf(stderr, "bench_cpu_matmul: %s\n", err.msg);
                exit(1);
            }
        }
        double t = (thread_seconds() - t0) / calls;
        if (round > 0 && t < best) best = t; /* round 0 warms the caches and pages */
    }
    if (lin.packed) be->ops->free(be, (void *)lin.packed);
    free(w);
    free(s);
    free(b);
    free(x);
    free(y);
    return best;
}

int main(int argc, char **argv) {
    static const struct {
        const char *what;
        int64_t out, in;
    } shapes[] = {{"q/o", 2048, 2048},
                  {"k/v", 512, 2048},
                  {"gate/up", 8192, 2048},
                  {"down", 2048, 8192},
                  {"lm_head", 128256, 2048}};
    int only_bits = argc > 1 ? atoi(argv[1]) : 0;
    int64_t only_rows = argc > 2 ? atoll(argv[2]) : 0;
    int threads = argc > 3 ? atoi(argv[3]) : 1;
    if (threads > 1) clock_id = CLOCK_MONOTONIC;
    be_backend *be;
    base_err err = {{0}};
    if (be_cpu_create(threads, &be, &err)) {
        fprintf(stderr, "bench_cpu_matmul: %s\n", err.msg);
        return 1;
    }
    printf("device: %s (cpu backend, 1 thread); commit %s; group %d, bf16 scales\n\n", be->device,
           MLXCEL_GIT_COMMIT, GROUP);
    printf("| bits | matmul  |    out |   in | rows | layout |  ms/call |   figure      |\n");
    printf("|------|---------|--------|------|------|--------|----------|---------------|\n");
    static const int bits[] = {4, 8};
    static const int64_t rows[] = {1, 128};
    for (int bi = 0; bi < 2; bi++) {
        if (only_bits && bits[bi] != only_bits) continue;
        for (int ri = 0; ri < 2; ri++) {
            if (only_rows && rows[ri] != only_rows) continue;
            for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
                for (int pack = 0; pack < 2; pack++) {
                    int64_t out = shapes[k].out, in = shapes[k].in, n = rows[ri];
                    double macs = (double)out * (double)in * (double)n;
                    int calls = macs > 4e9 ? 1 : macs > 1e8 ? 3 : 20;
                    double t = time_matmul(be, bits[bi], out, in, n, calls, pack);
                    if (t < 0) continue;
                    double bytes = (double)out * (double)in * bits[bi] / 8;
                    double fig = n == 1 ? bytes / t / 1e9 : macs / t / 1e9;
                    printf("| %4d | %-7s | %6lld | %4lld | %4lld | %-6s | %8.3f | %7.2f %s |\n",
                           bits[bi], shapes[k].what, (long long)out, (long long)in, (long long)n,
                           pack ? "packed" : "own", 1e3 * t, fig, n == 1 ? "GB/s  " : "GMAC/s");
                    fflush(stdout);
                }
            }
        }
    }
    be_destroy(be);
    return 0;
}
