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

/* Holds the stream for `cycles` clocks, so that the calls queued behind it all wait on the
 * device rather than on the host: their event timings then hold no launch latency. */
__global__ void bench_spin(long long cycles) {
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}

/* Milliseconds of each of reps calls of fn on stream s, ascending, after three warm-up calls,
 * from an event pair around every call. With `queued`, the calls wait behind a spin of 200000
 * clocks per call (about 100 us at the H200's clock, more than a launch takes from the host),
 * as sdpa_peer.py times its calls. */
template <class F>
static std::vector<float> bench_times_ms(cudaStream_t s, int reps, bool queued, F fn) {
    for (int i = 0; i < 3; i++) fn();
    bench_cuda_ok(cudaStreamSynchronize(s), "warm-up");
    std::vector<cudaEvent_t> ev(2 * reps);
    for (auto &e : ev) bench_cuda_ok(cudaEventCreate(&e), "event");
    if (queued) bench_spin<<<1, 1, 0, s>>>(200000ll * reps);
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
    return ms;
}

/* Median milliseconds of fn over reps runs on stream s, after three warm-up runs. */
template <class F> static float bench_time_ms(cudaStream_t s, int reps, F fn) {
    return bench_times_ms(s, reps, false, fn)[reps / 2];
}

#endif
