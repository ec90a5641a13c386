/* Shared by the CUDA benchmarks (compiled as C++ by nvcc): leaving on an error with the
 * program's name, and the median of CUDA-event timings. */
#ifndef MLXCEL_BENCH_CUDA_H
#define MLXCEL_BENCH_CUDA_H

#include "backend/cuda/cuda_internal.h"

#include <algorithm>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

/* Prints "<program>: what: msg" and exits with 1. */
static inline void bench_die(const char *what, const char *msg) {
    fprintf(stderr, "%s: %s: %s\n", program_invocation_short_name, what, msg ? msg : "");
    exit(1);
}

static inline void bench_cuda_ok(cudaError_t e, const char *what) {
    if (e != cudaSuccess) bench_die(what, cudaGetErrorString(e));
}

/* The CUDA backend on device 0, or exit naming why not. */
static inline be_backend *bench_cuda_backend(void) {
    be_backend *be = NULL;
    base_err err = {};
    if (be_cuda_create(0, &be, &err)) bench_die("backend", err.msg);
    return be;
}

/* Median milliseconds of fn over reps runs on stream s, after three warm-up runs. */
template <class F> static float bench_time_ms(cudaStream_t s, int reps, F fn) {
    for (int i = 0; i < 3; i++) fn();
    bench_cuda_ok(cudaStreamSynchronize(s), "warm-up");
    std::vector<cudaEvent_t> ev(2 * reps);
    for (auto &e : ev) bench_cuda_ok(cudaEventCreate(&e), "event");
    for (int i = 0; i < reps; i++) {
        cudaEventRecord(ev[2 * i], s);
        fn();
        cudaEventRecord(ev[2 * i + 1], s);
    }
    bench_cuda_ok(cudaStreamSynchronize(s), "timed runs");
    std::vector<float> ms(reps);
    for (int i = 0; i < reps; i++) cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]);
    for (auto &e : ev) cudaEventDestroy(e);
    std::sort(ms.begin(), ms.end());
    return ms[reps / 2];
}

#endif
