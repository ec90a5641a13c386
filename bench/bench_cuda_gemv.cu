/* The decode matmuls of a Llama-3.1-8B-shaped MLX model (hidden 4096, 32/8 heads of 128, MLP
 * 14336, vocab 128256), through the backend's ops: GB/s of weights read (packed values, scales
 * and biases) for 1 to 256 rows of F32 x (powers of two), 4 and 8 bits, group 64, BF16 scales, and
 * the fraction of the device-to-device copy bandwidth measured in the same run (a 1 GiB
 * cudaMemcpy, read + write counted). Q/K/V and gate/up run through their fused ops. Each case
 * runs through the ops once for each kernel: with the decode GEMV forced to each of its two
 * kernels, "rows" (integer dot products, one or two rows a pass over W) and "mma" (tensor cores, 32
 * rows a pass), both of which give way to cuBLAS from CUDA_GEMM_MIN_ROWS rows; as "cublas", the
 * path before the quantized GEMM (the GEMVs below CUDA_GEMM_MIN_ROWS rows, W dequantized to BF16
 * for cuBLAS from there); as "auto", what the backend picks (the quantized GEMM from
 * CUDA_QGEMM_MIN_ROWS rows); and as "gemm", the quantized GEMM at every row count. "err" is the
 * normalized difference of a kernel's outputs from the first one's.
 *
 * Each shape's weights are copied until the copies pass 512 MB (eight times the H200's L2) and
 * the timed launches rotate through them, so every launch reads device memory. The launches
 * are captured in a CUDA graph and replayed, so the host's launch rate is not what is timed;
 * each figure is the median of the replays' CUDA-event timings after warm-up. The last case,
 * "layer", runs a decode layer's four matmuls one after another as decode does (bench_layer):
 * single-matrix loops let a launch overlap another of the same shape, decode does not.
 * Usage: bench_cuda_gemv [reps [matrix [bits [kernels [rows]]]]]: matrix ("all" for every one),
 * bits, a comma-separated list of kernels and one of row counts pick cases, as for a profiler. */
#include "bench_cuda.h"

#include <algorithm>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#ifndef MLXCEL_GIT_COMMIT
#define MLXCEL_GIT_COMMIT "unknown"
#endif

/* Pseudo-random bytes from a hash of the index: weights need no particular values. */
__global__ void fill_bytes(uint32_t *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        p[i] = h;
    }
}

/* Scales and biases small enough that outputs stay finite. */
__global__ void fill_bf16(__nv_bfloat16 *p, size_t n, float amp) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = __float2bfloat16(amp * (float)((i * 7919u) % 1000u) / 1000.0f - amp / 2);
}

__global__ void fill_f32(float *p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = (float)((i * 104729u) % 2000u) / 1000.0f - 1.0f;
}

static void *dev_alloc(size_t bytes) {
    void *p = NULL;
    bench_cuda_ok(cudaMalloc(&p, bytes), "cudaMalloc");
    return p;
}

/* A weight's geometry without memory, for counting its bytes. */
static be_linear make_weight_shape(int64_t out, int64_t in, int bits) {
    be_linear w = {};
    w.out = out, w.in = in, w.bits = bits, w.group_size = 64, w.dtype = BASE_DTYPE_BF16;
    return w;
}

/* A random weight, with the packed copy a loaded model's linears carry. */
static be_linear make_weight(be_backend *be, int64_t out, int64_t in, int bits, uint32_t seed) {
    be_linear w = make_weight_shape(out, in, bits);
    size_t words = (size_t)(out * in * bits / 32), groups = (size_t)(out * in / 64);
    w.weight = dev_alloc(words * 4);
    w.scales = dev_alloc(groups * 2);
    w.biases = dev_alloc(groups * 2);
    fill_bytes<<<1024, 256>>>((uint32_t *)w.weight, words, seed);
    fill_bf16<<<1024, 256>>>((__nv_bfloat16 *)w.scales, groups, 0.02f);
    fill_bf16<<<1024, 256>>>((__nv_bfloat16 *)w.biases, groups, 0.1f);
    bench_cuda_ok(cudaDeviceSynchronize(), "fill");
    base_err err = {};
    if (be->ops->pack_linear(be, &w, &err) || !w.packed) bench_die("pack", err.msg);
    return w;
}

static size_t weight_bytes(const be_linear &w) {
    return (size_t)(w.out * w.in * w.bits / 8) + 2 * (size_t)(w.out * (w.in / w.group_size)) * 2;
}

static void free_weight(const be_linear &w) {
    cudaFree((void *)w.weight);
    cudaFree((void *)w.scales);
    cudaFree((void *)w.biases);
    cudaFree((void *)w.packed);
}

static float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

/* Median seconds of one call of fn(copy) over graph replays of `per` calls that rotate
 * through `copies`. */
template <class F> static double time_rotating(be_backend *be, int copies, int reps, F fn) {
    cudaStream_t s = cuda_impl(be)->stream;
    base_err err = {};
    for (int i = 0; i < copies; i++)
        if (fn(i, &err)) bench_die("warm-up", err.msg);
    bench_cuda_ok(cudaStreamSynchronize(s), "warm-up");
    int per = std::max(copies, 8);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    bench_cuda_ok(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "capture");
    for (int i = 0; i < per; i++)
        if (fn(i % copies, &err)) bench_die("capture", err.msg);
    bench_cuda_ok(cudaStreamEndCapture(s, &graph), "end capture");
    bench_cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
    cudaEvent_t a, b;
    bench_cuda_ok(cudaEventCreate(&a), "event");
    bench_cuda_ok(cudaEventCreate(&b), "event");
    bench_cuda_ok(cudaGraphLaunch(exec, s), "replay");
    std::vector<float> ms;
    for (int r = 0; r < reps; r++) {
        bench_cuda_ok(cudaEventRecord(a, s), "record");
        bench_cuda_ok(cudaGraphLaunch(exec, s), "replay");
        bench_cuda_ok(cudaEventRecord(b, s), "record");
        bench_cuda_ok(cudaEventSynchronize(b), "sync");
        float t;
        bench_cuda_ok(cudaEventElapsedTime(&t, a, b), "elapsed");
        ms.push_back(t);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    return median(ms) / 1e3 / per;
}

static double copy_bandwidth(be_backend *be, int reps) {
    size_t bytes = (size_t)1 << 30;
    void *a = dev_alloc(bytes), *b = dev_alloc(bytes);
    cudaStream_t s = cuda_impl(be)->stream;
    cudaEvent_t e0, e1;
    bench_cuda_ok(cudaEventCreate(&e0), "event");
    bench_cuda_ok(cudaEventCreate(&e1), "event");
    std::vector<float> ms;
    for (int r = 0; r < reps + 2; r++) {
        bench_cuda_ok(cudaEventRecord(e0, s), "record");
        bench_cuda_ok(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s), "copy");
        bench_cuda_ok(cudaEventRecord(e1, s), "record");
        bench_cuda_ok(cudaEventSynchronize(e1), "sync");
        float t;
        bench_cuda_ok(cudaEventElapsedTime(&t, e0, e1), "elapsed");
        if (r >= 2) ms.push_back(t);
    }
    cudaFree(a);
    cudaFree(b);
    return 2.0 * (double)bytes / (median(ms) / 1e3);
}

enum kind { PLAIN, QKV, GATE_UP };

struct shape {
    const char *name;
    kind k;
    int64_t out[3]; /* PLAIN: out[0]; QKV: q, k, v; GATE_UP: out[0] twice */
    int64_t in;
};

/* One decode layer's matmuls, in decode's order and form: the RMSNorm folded into Q/K/V and
 * into gate/up, the residual added by o and down (matmul_add), each launch right after the
 * previous one as decode issues them. Layers of distinct weights are copied until they pass 512
 * MB, and the timed replays rotate through them, so the figure is that of a run of layers
 * reading device memory: its share of copy bandwidth is the whole sequence's. */
template <class K>
static void bench_layer(be_backend *be, int bits, int rows, int reps, double copy,
                        const char *const *kernels, const int *kernel_ids, int n_kernels,
                        K wanted) {
    const int64_t hid = 4096, kv = 1024, mlp = 14336;
    struct layer {
        be_linear q, k, v, o, gate, up, down;
    };
    const size_t per_layer = weight_bytes(make_weight_shape(hid, hid, bits)) * 2 +
                             weight_bytes(make_weight_shape(kv, hid, bits)) * 2 +
                             weight_bytes(make_weight_shape(mlp, hid, bits)) * 3;
    const int n_layers = (int)(((size_t)512 << 20) / per_layer + 1);
    std::vector<layer> ls;
    for (int i = 0; i < n_layers; i++) {
        const uint32_t s = (uint32_t)(100 + 7 * i);
        ls.push_back({make_weight(be, hid, hid, bits, s), make_weight(be, kv, hid, bits, s + 1),
                      make_weight(be, kv, hid, bits, s + 2), make_weight(be, hid, hid, bits, s + 3),
                      make_weight(be, mlp, hid, bits, s + 4),
                      make_weight(be, mlp, hid, bits, s + 5),
                      make_weight(be, hid, mlp, bits, s + 6)});
    }
    auto f32 = [&](int64_t r, int64_t c) {
        float *p = (float *)dev_alloc((size_t)(r * c) * 4);
        fill_f32<<<256, 256>>>(p, (size_t)(r * c));
        return be_tensor{p, BASE_DTYPE_F32, r, c};
    };
    be_tensor h = f32(rows, hid), q = f32(rows, hid), k = f32(rows, kv), v = f32(rows, kv),
              act = f32(rows, mlp), scratch = f32(rows, hid);
    __nv_bfloat16 *nw = (__nv_bfloat16 *)dev_alloc((size_t)hid * 2);
    fill_bf16<<<16, 256>>>(nw, (size_t)hid, 2.0f);
    const be_tensor norm_w = {nw, BASE_DTYPE_BF16, 1, hid};
    const be_norm norm = {&norm_w, 1e-5f, &scratch};
    char dims[32];
    snprintf(dims, sizeof dims, "%dx%.0fMB", n_layers, per_layer / 1e6);
    printf("%-8s %-14s %4d %4d", "layer", dims, bits, rows);
    for (int ki = 0; ki < n_kernels; ki++) {
        if (!wanted(kernels[ki])) continue;
        cuda_impl(be)->gemv_kernel = kernel_ids[ki];
        auto run = [&](int c, base_err *e) {
            const layer &L = ls[c];
            const be_linear *ws[3] = {&L.q, &L.k, &L.v};
            be_tensor *ys[3] = {&q, &k, &v};
            return be->ops->matmul_qkv(be, &h, &norm, ws, ys, e) ||
                           be->ops->matmul_add(be, &q, &L.o, &h, e) ||
                           be->ops->matmul_glu(be, &h, &norm, &L.gate, &L.up, BE_ACT_SILU, &act,
                                               e) ||
                           be->ops->matmul_add(be, &act, &L.down, &h, e)
                       ? -1
                       : 0;
        };
        const double sec = time_rotating(be, n_layers, reps, run);
        const double gbs = (double)per_layer / sec / 1e9;
        printf(" | %6s %8.2f %6.0f %6.1f%% %7s", kernels[ki], sec * 1e6, gbs,
               100.0 * gbs * 1e9 / copy, "-");
    }
    printf("\n");
    fflush(stdout);
    for (be_tensor *t : {&h, &q, &k, &v, &act, &scratch}) cudaFree(t->data);
    cudaFree(nw);
    for (layer &L : ls)
        for (be_linear *w : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down}) free_weight(*w);
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 20;
    const char *only = argc > 2 ? argv[2] : NULL;
    int only_bits = argc > 3 ? atoi(argv[3]) : 0;
    const char *only_kernel = argc > 4 ? argv[4] : NULL;
    const char *only_rows = argc > 5 ? argv[5] : NULL;
    if (reps < 3) reps = 3;
    be_backend *be = bench_cuda_backend();
    base_err err = {};
    double copy = copy_bandwidth(be, reps);
    printf("device %s, commit %s\n", be->device, MLXCEL_GIT_COMMIT);
    printf("copy bandwidth %.0f GB/s (1 GiB device-to-device, read + write)\n", copy / 1e9);
    const shape shapes[] = {
        {"q+k+v", QKV, {4096, 1024, 1024}, 4096}, {"o", PLAIN, {4096}, 4096},
        {"gate+up", GATE_UP, {14336}, 4096},      {"down", PLAIN, {4096}, 14336},
        {"lm_head", PLAIN, {128256}, 4096},
    };
    const int bits_list[] = {4, 8}, rows_list[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
    const char *kernels[] = {"rows", "mma", "cublas", "auto", "gemm"};
    const int kernel_ids[] = {CUDA_GEMV_ROWS, CUDA_GEMV_MMA, CUDA_GEMV_CUBLAS, CUDA_GEMV_AUTO,
                              CUDA_GEMV_QGEMM};
    const int n_kernels = 5;
    /* An item runs when no list is given or it is in the comma-separated list. */
    auto listed = [](const char *only_list, const char *k) {
        if (!only_list) return true;
        char key[32], list[256];
        snprintf(key, sizeof key, ",%s,", k);
        snprintf(list, sizeof list, ",%s,", only_list);
        return strstr(list, key) != NULL;
    };
    auto wanted = [&](const char *k) { return listed(only_kernel, k); };
    printf("%-8s %-14s %4s %4s", "matrix", "shape", "bits", "rows");
    for (const char *k : kernels)
        if (wanted(k)) printf(" | %6s %8s %6s %7s %7s", k, "us", "GB/s", "of copy", "err");
    printf("\n");
    for (const shape &sh : shapes) {
        if (only && strcmp(only, "all") != 0 && strcmp(only, sh.name) != 0) continue;
        int nm = sh.k == QKV ? 3 : (sh.k == GATE_UP ? 2 : 1);
        int64_t total_out = 0;
        for (int i = 0; i < nm; i++) total_out += sh.k == GATE_UP ? sh.out[0] : sh.out[i];
        for (int bits : bits_list) {
            if (only_bits && bits != only_bits) continue;
            std::vector<std::vector<be_linear>> copies;
            size_t bytes = 0;
            for (int i = 0; i < nm; i++) {
                be_linear w =
                    make_weight(be, sh.k == GATE_UP ? sh.out[0] : sh.out[i], sh.in, bits, 1);
                bytes += weight_bytes(w);
                free_weight(w);
            }
            int n_copies = (int)std::max<size_t>(1, ((size_t)512 << 20) / bytes + 1);
            for (int c = 0; c < n_copies; c++) {
                std::vector<be_linear> set;
                for (int i = 0; i < nm; i++)
                    set.push_back(make_weight(be, sh.k == GATE_UP ? sh.out[0] : sh.out[i], sh.in,
                                              bits, (uint32_t)(c * 3 + i + 1)));
                copies.push_back(set);
            }
            for (int rows : rows_list) {
                char rows_name[16];
                snprintf(rows_name, sizeof rows_name, "%d", rows);
                if (!listed(only_rows, rows_name)) continue;
                float *x = (float *)dev_alloc((size_t)rows * sh.in * 4);
                fill_f32<<<256, 256>>>(x, (size_t)rows * sh.in);
                be_tensor tx = {x, BASE_DTYPE_F32, rows, sh.in};
                std::vector<be_tensor> ty;
                for (int i = 0; i < nm; i++) {
                    int64_t o = sh.k == GATE_UP ? sh.out[0] : sh.out[i];
                    ty.push_back({dev_alloc((size_t)rows * o * 4), BASE_DTYPE_F32, rows, o});
                }
                char dims[32];
                snprintf(dims, sizeof dims, "%lldx%lld", (long long)total_out, (long long)sh.in);
                printf("%-8s %-14s %4d %4d", sh.name, dims, bits, rows);
                /* Outputs of the first kernel run, against which the others' are compared. */
                std::vector<float> first;
                for (int ki = 0; ki < n_kernels; ki++) {
                    if (!wanted(kernels[ki])) continue;
                    cuda_impl(be)->gemv_kernel = kernel_ids[ki];
                    auto run = [&](int c, base_err *e) {
                        const std::vector<be_linear> &w = copies[c];
                        if (sh.k == QKV) {
                            const be_linear *ws[3] = {&w[0], &w[1], &w[2]};
                            be_tensor *ys[3] = {&ty[0], &ty[1], &ty[2]};
                            return be->ops->matmul_qkv(be, &tx, NULL, ws, ys, e);
                        }
                        if (sh.k == GATE_UP)
                            return be->ops->matmul_glu(be, &tx, NULL, &w[0], &w[1], BE_ACT_SILU,
                                                       &ty[0], e);
                        return be->ops->matmul(be, &tx, &w[0], &ty[0], e);
                    };
                    double sec = time_rotating(be, n_copies, reps, run);
                    if (run(0, &err) || be->ops->sync(be, &err)) bench_die("check run", err.msg);
                    std::vector<float> got;
                    for (const be_tensor &t : ty) {
                        std::vector<float> h((size_t)(t.rows * t.cols));
                        bench_cuda_ok(
                            cudaMemcpy(h.data(), t.data, h.size() * 4, cudaMemcpyDeviceToHost),
                            "download");
                        got.insert(got.end(), h.begin(), h.end());
                    }
                    double num = 0, den = 0;
                    if (first.empty()) first = got;
                    for (size_t i = 0; i < got.size(); i++) {
                        num += ((double)got[i] - first[i]) * ((double)got[i] - first[i]);
                        den += (double)first[i] * first[i];
                    }
                    double gbs = (double)bytes / sec / 1e9;
                    printf(" | %6s %8.2f %6.0f %6.1f%% %7.1e", kernels[ki], sec * 1e6, gbs,
                           100.0 * gbs * 1e9 / copy, den > 0 ? sqrt(num / den) : sqrt(num));
                }
                printf("\n");
                fflush(stdout);
                cudaFree(x);
                for (auto &t : ty) cudaFree(t.data);
            }
            for (auto &set : copies)
                for (auto &w : set) free_weight(w);
        }
    }
    if (!only || strcmp(only, "all") == 0 || strcmp(only, "layer") == 0)
        for (int bits : bits_list) {
            if (only_bits && bits != only_bits) continue;
            for (int rows : rows_list) {
                char rows_name[16];
                snprintf(rows_name, sizeof rows_name, "%d", rows);
                if (!listed(only_rows, rows_name)) continue;
                bench_layer(be, bits, rows, reps, copy, kernels, kernel_ids, n_kernels, wanted);
            }
        }
    if (be->ops->sync(be, &err)) bench_die("sync", err.msg);
    be->ops->destroy(be);
    return 0;
}
