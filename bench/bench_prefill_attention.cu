/* Causal paged prefill attention at Llama-3.1-8B geometry (32 q heads, 8 kv heads, head_dim
 * 128, f16 KV, block 32): TFLOP/s of the tensor-core kernel in each launch shape, for
 * fresh prompts (kv_len == q_len) of 1 x 2048, 1 x 8192 and 4 x 4096 tokens. FLOPs are the
 * causal half of Q K^T and P V: 2 * 2 * B * H * N^2 * D / 2, the count FlashAttention's and
 * PyTorch's benchmarks use, so tools/reference/sdpa_prefill_peer.py (cuDNN and flash SDPA,
 * is_causal, same shapes) prints comparable figures in the same run.
 *
 * Pages are a random permutation of the pool; q is F32 as the model hands it over. Each figure
 * is the median of CUDA-event timings after warm-up; every variant's output must agree with
 * variant 0's (the one the backend uses).
 * Output: one machine-readable line per shape (`shape ...`) and a table.
 * Usage: bench_prefill_attention [reps] */
#include "bench_cuda.h"

#include <algorithm>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

#define NQ  32
#define NKV 8
#define HD  128
#define BS  32

static void *dev_upload(be_backend *be, const void *host, size_t bytes) {
    void *d = NULL;
    base_err err = {{0}};
    if (be->ops->alloc(be, bytes, &d, &err) || be->ops->upload(be, d, host, bytes, &err))
        bench_die("upload", err.msg);
    return d;
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 20;
    be_backend *be = bench_cuda_backend();
    base_err err = {};
    cudaStream_t st = cuda_impl(be)->stream;
    cudaDeviceProp prop;
    bench_cuda_ok(cudaGetDeviceProperties(&prop, 0), "properties");
    const char *commit = MLXCEL_GIT_COMMIT; /* the commit CMake was configured at */
    printf("device %s, %d SMs; commit %s; %d q / %d kv heads, head_dim %d, f16 KV, block %d\n",
           prop.name, prop.multiProcessorCount, commit, NQ, NKV, HD, BS);

    const int shapes[][2] = {{1, 2048}, {1, 8192}, {4, 4096}};
    int64_t max_tokens = 0;
    for (auto &s : shapes) max_tokens = std::max(max_tokens, (int64_t)s[0] * s[1]);
    const int64_t nblocks = max_tokens / BS + 16;
    const size_t side = (size_t)nblocks * BS * NKV * HD * 2;
    be_kv_layer layer = {NULL, NULL, BASE_DTYPE_F16, nblocks, BS, NKV, HD};
    std::vector<uint16_t> pool(side / 2);
    uint32_t x = 12345;
    for (auto &v : pool) {
        x = x * 1664525u + 1013904223u;
        v = base_f32_to_f16((float)((x >> 8) & 0xffff) / 32768.0f - 1.0f);
    }
    layer.k = dev_upload(be, pool.data(), side);
    std::reverse(pool.begin(), pool.end());
    layer.v = dev_upload(be, pool.data(), side);
    std::vector<int32_t> perm(nblocks);
    for (int64_t i = 0; i < nblocks; i++) perm[i] = (int32_t)i;
    srand(7);
    for (int64_t i = nblocks - 1; i > 0; i--) std::swap(perm[i], perm[rand() % (i + 1)]);
    const float scale = 1.0f / sqrtf((float)HD);

    const char *names[CUDA_PREFILL_VARIANTS] = {"4w x2", "4w x3", "8w x1"};
    printf("\n%-10s", "batch x N");
    for (int v = 0; v < CUDA_PREFILL_VARIANTS; v++) printf(" | %-5s ms TFLOP/s", names[v]);
    printf(" | max diff\n");
    for (auto &shape : shapes) {
        const int B = shape[0], N = shape[1], pages = (N + BS - 1) / BS;
        std::vector<int32_t> q_indptr(B + 1), kv_len(B, N), page_indptr(B + 1),
            last(B, N - (pages - 1) * BS), idx((size_t)B * pages);
        for (int b = 0; b <= B; b++) q_indptr[b] = b * N, page_indptr[b] = b * pages;
        for (size_t i = 0; i < idx.size(); i++) idx[i] = perm[i];
        be_paged_batch db = {};
        db.n_seqs = B;
        db.n_tokens = B * N;
        db.max_q_len = N;
        db.max_kv_len = N;
        db.q_indptr = (int32_t *)dev_upload(be, q_indptr.data(), q_indptr.size() * 4);
        db.kv_len = (int32_t *)dev_upload(be, kv_len.data(), kv_len.size() * 4);
        db.page_indptr = (int32_t *)dev_upload(be, page_indptr.data(), page_indptr.size() * 4);
        db.page_indices = (int32_t *)dev_upload(be, idx.data(), idx.size() * 4);
        db.last_page_len = (int32_t *)dev_upload(be, last.data(), last.size() * 4);
        const size_t qn = (size_t)B * N * NQ * HD;
        std::vector<float> qh(qn);
        for (auto &v : qh) v = 4.0f * (rand() / (float)RAND_MAX - 0.5f);
        be_tensor q = {dev_upload(be, qh.data(), qn * 4), BASE_DTYPE_F32, (int64_t)B * N, NQ * HD};
        be_tensor out[CUDA_PREFILL_VARIANTS];
        for (auto &o : out) {
            o = q;
            if (be->ops->alloc(be, qn * 4, &o.data, &err)) bench_die("out", err.msg);
        }
        const double flop = 2.0 * 2.0 * B * NQ * (double)N * N * HD / 2.0;
        double tf[CUDA_PREFILL_VARIANTS], diff = 0;
        std::vector<float> a(qn), b(qn);
        char name[32];
        snprintf(name, sizeof name, "%dx%d", B, N);
        printf("%-10s", name);
        for (int v = 0; v < CUDA_PREFILL_VARIANTS; v++) {
            const float ms = bench_time_ms(st, reps, [&] {
                if (cuda_attention_prefill_variant(be, &q, &layer, &db, NQ, be_attn_plain(scale),
                                                   &out[v], v, &err))
                    bench_die("attention", err.msg);
            });
            tf[v] = flop / (ms * 1e-3) / 1e12;
            printf(" | %8.3f %7.1f", ms, tf[v]);
            if (be->ops->download(be, (v ? b : a).data(), out[v].data, qn * 4, &err))
                bench_die("download", err.msg);
            for (size_t i = 0; v && i < qn; i++) {
                const double d = fabs((double)a[i] - b[i]);
                diff = d == d ? std::max(diff, d) : INFINITY;
            }
        }
        printf(" | %.1e%s\n", diff, diff < 1e-5 ? "" : "  MISMATCH");
        printf("shape %s", name);
        for (int v = 0; v < CUDA_PREFILL_VARIANTS; v++) printf(" tflops_v%d %.2f", v, tf[v]);
        printf("\n");
        be->ops->free(be, q.data);
        for (auto &o : out) be->ops->free(be, o.data);
        be->ops->free(be, (void *)db.q_indptr);
        be->ops->free(be, (void *)db.kv_len);
        be->ops->free(be, (void *)db.page_indptr);
        be->ops->free(be, (void *)db.page_indices);
        be->ops->free(be, (void *)db.last_page_len);
    }
    be->ops->free(be, layer.k);
    be->ops->free(be, layer.v);
    be->ops->destroy(be);
    return 0;
}
