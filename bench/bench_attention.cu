/* Paged decode attention at Llama-3.1-8B geometry (32 q heads, 8 kv heads, head_dim 128, f16
 * KV, block 32): TB/s = bytes of K and V read / kernel time, for v1 and v2 (+ merge), next to
 * the device-to-device copy bandwidth measured in the same run as the ceiling. The v2 columns
 * run the planner's plan (attn_plan_decode_pages) at the backend's target and at twice it, as
 * the runtime would: v1 where the planner keeps one chunk. q and out are F32, as the CUDA
 * backend's activations are (the split-term path), and BF16 (single terms).
 *
 * Pages are a random permutation of the pool, as a long-running server's would be. Each
 * figure is the median of CUDA-event timings after warm-up; every shape's K/V is far larger
 * than the L2, so repeated runs read device memory. Output: a sweep of v2's chunk count per
 * shape, one line per shape, machine-readable (`shape ...`), and a table. Usage: bench_attention
 * [reps [BxL [chunks]]]; with BxL only that shape runs, without the sweep: v1 once, then the
 * planner's plan (F32) reps + 3 times, or v2 at the chunk count given, which is what a profiler
 * wants to skip to.
 *
 * `bench_attention serve` answers each stdin line `BxL reps [stages]` with `ours BxL ms...`:
 * that many calls of the planner's plan (F32 q/out, as the runtime runs it; at that pipeline
 * depth when given), each timed alone behind a spin that keeps the stream ahead of the host;
 * a line `env NAME VALUE` sets that environment variable for the calls after it.
 * tools/reference/sdpa_peer.py --ours alternates these with cuDNN's calls, timed the same way. */
#include "bench_cuda.h"

extern "C" {
#include "attn/attn.h"
}

#include <algorithm>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#define NQ  32
#define NKV 8
#define HD  128
#define BS  32

/* The planner's plan for `batch` rows of `pages` pages at this target, its workspace not yet
 * allocated. */
static be_decode_plan planned(int pages, int batch, int target) {
    static char ws[1];
    be_decode_plan plan;
    attn_plan_decode_pages(batch, pages, NQ, NKV, HD, target, ws, UINT64_MAX, &plan);
    plan.workspace = NULL;
    plan.workspace_bytes = 0;
    return plan;
}

/* Pages per chunk of the planner's chunking at this target; all the pages for v1. */
static int plan_ppc(int pages, int batch, int target) {
    be_decode_plan plan = planned(pages, batch, target);
    return plan.kind == BE_DECODE_V2 ? plan.pages_per_chunk : pages;
}

/* Pages per chunk to sweep, ascending: the planner's at the target and at twice it, and for
 * k waves the most chunks whose CTAs fit in k waves of the target (one chunk more too at one
 * and two waves, where the last wave runs nearly alone). */
static std::vector<int> sweep_ppcs(int pages, int batch, int target) {
    std::vector<int> ppc = {plan_ppc(pages, batch, target), plan_ppc(pages, batch, 2 * target)};
    const int units = batch * NKV;
    for (int k : {1, 2, 3, 4, 6, 8, 12, 16}) {
        const int c = k * target / units;
        for (int cc = c; cc <= c + (k <= 2); cc++)
            if (cc >= 1 && cc <= pages) ppc.push_back((pages + cc - 1) / cc);
    }
    std::sort(ppc.begin(), ppc.end());
    ppc.erase(std::unique(ppc.begin(), ppc.end()), ppc.end());
    return ppc;
}

int main(int argc, char **argv) {
    const bool serve = argc > 1 && !strcmp(argv[1], "serve");
    int reps = serve ? 20 : argc > 1 ? atoi(argv[1]) : 50;
    const char *only = !serve && argc > 2 ? argv[2] : NULL;
    const int only_chunks = argc > 3 ? atoi(argv[3]) : 0;
    be_backend *be = bench_cuda_backend();
    base_err err = {};
    cudaStream_t st = cuda_impl(be)->stream;
    cudaDeviceProp prop;
    bench_cuda_ok(cudaGetDeviceProperties(&prop, 0), "properties");
    const char *commit = MLXCEL_GIT_COMMIT; /* the commit CMake was configured at */
    printf("device %s, %d SMs, L2 %d MB; commit %s; target CTAs %d\n", prop.name,
           prop.multiProcessorCount, prop.l2CacheSize >> 20, commit, be->target_parallelism);

    const int shapes[][2] = {{1, 131072}, {4, 16384}, {16, 8192}, {64, 4096}, {256, 2048}};
    int64_t max_tokens = 0;
    for (auto &s : shapes) max_tokens = std::max(max_tokens, (int64_t)s[0] * s[1]);
    const int64_t nblocks = max_tokens / BS + 16;
    const size_t side = (size_t)nblocks * BS * NKV * HD * 2;

    be_kv_layer layer = {NULL, NULL, BASE_DTYPE_F16, nblocks, BS, NKV, HD};
    if (be->ops->alloc(be, side, &layer.k, &err) || be->ops->alloc(be, side, &layer.v, &err))
        bench_die("pool", err.msg);
    /* Random f16 bits in [-1, 1): fill through the device RNG-free way, a host pattern
     * copied over the slabs in 64 MB pieces. */
    {
        size_t piece = 64ull << 20;
        std::vector<uint16_t> h(piece / 2);
        uint32_t x = 12345;
        for (auto &v : h) {
            x = x * 1664525u + 1013904223u;
            v = (uint16_t)(0x3000 | ((x >> 9) & 0x0fff) | ((x >> 31) << 15));
        }
        for (size_t off = 0; off < side; off += piece) {
            size_t n = std::min(piece, side - off);
            bench_cuda_ok(cudaMemcpy((char *)layer.k + off, h.data(), n, cudaMemcpyHostToDevice),
                          "fill");
            bench_cuda_ok(
                cudaMemcpy((char *)layer.v + off, h.data() + 7, n - 16, cudaMemcpyHostToDevice),
                "fill");
        }
    }

    /* The ceiling: a device-to-device copy, bytes read + written. */
    float copy_ms = bench_time_ms(st, reps, [&] {
        cudaMemcpyAsync(layer.v, layer.k, side / 2, cudaMemcpyDeviceToDevice, st);
    });
    double copy_tbs = 2.0 * (side / 2) / (copy_ms * 1e-3) / 1e12;
    printf("copy %.3f TB/s (%.1f MB read + written in %.3f ms)\n", copy_tbs, side / 1e6, copy_ms);

    std::vector<int32_t> perm(nblocks);
    for (int64_t i = 0; i < nblocks; i++) perm[i] = (int32_t)i;
    srand(7);
    for (int64_t i = nblocks - 1; i > 0; i--) std::swap(perm[i], perm[rand() % (i + 1)]);

    /* Every shape's batch, q, output and v2 plans (at the target and at twice it), once. */
    struct shape_run {
        int B, L, pages;
        be_paged_batch db;
        void *mem[5];
        be_tensor q, out, q16, out16; /* F32 and BF16 activations */
        be_decode_plan v1, v2[2];
        be_decode_plan ws;      /* v2 with the workspace of the sweep's most chunks */
        std::vector<int> sweep; /* pages per chunk to sweep */
        double kv_bytes;
        std::vector<float> ref; /* v1 output at the default pipeline */
    };
    std::vector<shape_run> runs;
    for (auto &shape : shapes) {
        char shape_name[32];
        snprintf(shape_name, sizeof shape_name, "%dx%d", shape[0], shape[1]);
        if (only && strcmp(only, shape_name)) continue;
        shape_run r = {};
        r.B = shape[0], r.L = shape[1], r.pages = r.L / BS;
        const int B = r.B, pages = r.pages;
        std::vector<int32_t> q_indptr(B + 1), kv_len(B, r.L), page_indptr(B + 1), last(B, BS),
            idx((size_t)B * pages);
        for (int b = 0; b <= B; b++) q_indptr[b] = b, page_indptr[b] = b * pages;
        for (size_t i = 0; i < idx.size(); i++) idx[i] = perm[i];
        const std::vector<int32_t> *src[5] = {&q_indptr, &kv_len, &page_indptr, &idx, &last};
        for (int i = 0; i < 5; i++) {
            size_t bytes = src[i]->size() * 4;
            if (be->ops->alloc(be, bytes, &r.mem[i], &err) ||
                be->ops->upload(be, r.mem[i], src[i]->data(), bytes, &err))
                bench_die("batch", err.msg);
        }
        r.db.n_seqs = B;
        r.db.n_tokens = B;
        r.db.max_q_len = 1;
        r.db.max_kv_len = r.L;
        r.db.q_indptr = (int32_t *)r.mem[0];
        r.db.kv_len = (int32_t *)r.mem[1];
        r.db.page_indptr = (int32_t *)r.mem[2];
        r.db.page_indices = (int32_t *)r.mem[3];
        r.db.last_page_len = (int32_t *)r.mem[4];
        r.q = {NULL, BASE_DTYPE_F32, B, NQ * HD};
        r.out = r.q;
        r.q16 = {NULL, BASE_DTYPE_BF16, B, NQ * HD};
        r.out16 = r.q16;
        if (be->ops->alloc(be, (size_t)B * NQ * HD * 4, &r.q.data, &err) ||
            be->ops->alloc(be, (size_t)B * NQ * HD * 4, &r.out.data, &err) ||
            be->ops->alloc(be, (size_t)B * NQ * HD * 2, &r.q16.data, &err) ||
            be->ops->alloc(be, (size_t)B * NQ * HD * 2, &r.out16.data, &err))
            bench_die("q", err.msg);
        std::vector<float> qh((size_t)B * NQ * HD);
        std::vector<uint16_t> qh16(qh.size());
        for (size_t i = 0; i < qh.size(); i++) {
            qh16[i] = base_f32_to_bf16(4.0f * (rand() / (float)RAND_MAX - 0.5f));
            qh[i] = base_bf16_to_f32(qh16[i]);
        }
        if (be->ops->upload(be, r.q.data, qh.data(), qh.size() * 4, &err) ||
            be->ops->upload(be, r.q16.data, qh16.data(), qh16.size() * 2, &err))
            bench_die("q", err.msg);
        r.kv_bytes = (double)B * r.L * NKV * HD * 2 * 2;
        r.v1.kind = BE_DECODE_V1;
        for (int k = 0; k < 2; k++) {
            be_decode_plan &v2 = r.v2[k];
            v2 = planned(pages, B, be->target_parallelism * (k + 1));
            if (v2.kind != BE_DECODE_V2) continue;
            v2.workspace_bytes = (uint64_t)B * v2.max_chunks * NQ * (HD + 1) * 4;
            if (be->ops->alloc(be, v2.workspace_bytes, &v2.workspace, &err))
                bench_die("workspace", err.msg);
        }
        r.sweep = sweep_ppcs(pages, B, be->target_parallelism);
        r.ws.kind = BE_DECODE_V2;
        const int ws_chunks =
            std::max((pages + r.sweep[0] - 1) / r.sweep[0], std::min(only_chunks, pages));
        r.ws.workspace_bytes = (uint64_t)B * ws_chunks * NQ * (HD + 1) * 4;
        if (be->ops->alloc(be, r.ws.workspace_bytes, &r.ws.workspace, &err))
            bench_die("workspace", err.msg);
        runs.push_back(r);
    }
    const float scale = 0.08838834764831845f;
    auto tbs = [&](shape_run &r, const be_decode_plan *plan, bool f32 = true) {
        const be_tensor *q = f32 ? &r.q : &r.q16;
        be_tensor *out = f32 ? &r.out : &r.out16;
        float ms = bench_time_ms(st, reps, [&] {
            if (be->ops->attention(be, q, &layer, &r.db, plan, NQ, be_attn_plain(scale), out, &err))
                bench_die("attention", err.msg);
        });
        return r.kv_bytes / (ms * 1e-3) / 1e12;
    };
    /* Largest relative difference of r.out from r.ref: every timed variant must compute the
     * same function. */
    auto out_diff = [&](shape_run &r) {
        std::vector<float> got(r.ref.size());
        if (be->ops->download(be, got.data(), r.out.data, got.size() * 4, &err))
            bench_die("out", err.msg);
        double num = 0, den = 0;
        for (size_t i = 0; i < got.size(); i++) {
            double a = got[i], b = r.ref[i];
            num += (a - b) * (a - b);
            den += b * b;
        }
        return num == num ? sqrt(num / (den > 0 ? den : 1)) : INFINITY;
    };
    for (auto &r : runs) {
        if (be->ops->attention(be, &r.q, &layer, &r.db, &r.v1, NQ, be_attn_plain(scale), &r.out,
                               &err))
            bench_die("attention", err.msg);
        r.ref.resize((size_t)r.B * NQ * HD);
        if (be->ops->download(be, r.ref.data(), r.out.data, r.ref.size() * 4, &err))
            bench_die("out", err.msg);
    }

    if (serve) {
        fflush(stdout);
        char line[128];
        while (fgets(line, sizeof line, stdin)) {
            char name[64], value[64];
            if (sscanf(line, "env %63s %63s", name, value) == 2) {
                setenv(name, value, 1);
                printf("env %s %s\n", name, value);
                fflush(stdout);
                continue;
            }
            int B = 0, L = 0, n = 0, stages = 0;
            if (sscanf(line, "%dx%d %d %d", &B, &L, &n, &stages) < 3 || n < 1)
                bench_die("serve", line);
            shape_run *r = NULL;
            for (auto &x : runs)
                if (x.B == B && x.L == L) r = &x;
            if (!r) bench_die("serve: no such shape", line);
            const be_decode_plan *plan = &r->v2[0];
            cuda_backend *cb = cuda_impl(be);
            const int def_stages = cb->att_stages;
            if (stages > 0) cb->att_stages = stages;
            std::vector<float> ms = bench_times_ms(st, n, true, [&] {
                if (be->ops->attention(be, &r->q, &layer, &r->db, plan, NQ, be_attn_plain(scale),
                                       &r->out, &err))
                    bench_die("attention", err.msg);
            });
            cb->att_stages = def_stages;
            printf("ours %dx%d", B, L);
            for (float x : ms) printf(" %.5f", x);
            printf("\n");
            fflush(stdout);
        }
    } else if (only) {
        for (auto &r : runs) {
            be_decode_plan plan = r.v2[0];
            if (only_chunks > 0 && only_chunks <= r.pages) {
                plan = r.ws;
                plan.pages_per_chunk = (r.pages + only_chunks - 1) / only_chunks;
                plan.max_chunks = (r.pages + plan.pages_per_chunk - 1) / plan.pages_per_chunk;
            }
            printf("%dx%d %s %d chunks %.3f TB/s\n", r.B, r.L,
                   plan.kind == BE_DECODE_V2 ? "v2" : "v1",
                   plan.kind == BE_DECODE_V2 ? plan.max_chunks : 1, tbs(r, &plan));
        }
    } else {
        /* Sweep of v2's chunking (F32 activations): how the CTA count falls on the device's
         * waves decides how much of the last wave runs alone. Then three shared-memory stages
         * per warp, which leave room for two CTAs per SM, at chunk counts that fill one and
         * two of those waves. Each variant's output is checked against v1's. */
        cuda_backend *cb = cuda_impl(be);
        const int def_stages = cb->att_stages;
        printf("\nsweep: v2 TB/s by chunk count (CTAs = rows x %d kv heads x chunks; waves of %d "
               "CTAs)\n",
               NKV, be->target_parallelism);
        for (auto &r : runs) {
            double best = 0;
            int best_c = 0, best_s = 0;
            auto one = [&](int ppc, int stages, int wave) {
                be_decode_plan plan = r.ws;
                plan.pages_per_chunk = ppc;
                plan.max_chunks = (r.pages + ppc - 1) / ppc;
                cb->att_stages = stages;
                const double t = tbs(r, &plan), diff = out_diff(r);
                cb->att_stages = def_stages;
                const int ctas = r.B * NKV * plan.max_chunks;
                printf("sweep %dx%d stages %d chunks %d ppc %d CTAs %d waves %.2f: %.3f TB/s diff "
                       "%.0e%s\n",
                       r.B, r.L, stages, plan.max_chunks, ppc, ctas, ctas / (double)wave, t, diff,
                       diff < 1e-4 ? "" : " MISMATCH");
                if (diff < 1e-4 && t > best) best = t, best_c = plan.max_chunks, best_s = stages;
            };
            for (int ppc : r.sweep) one(ppc, def_stages, be->target_parallelism);
            for (int k = 1; k <= 2; k++) {
                const int c = std::max(1, std::min(r.pages, k * 2 * cb->sm_count / (r.B * NKV)));
                one((r.pages + c - 1) / c, 3, 2 * cb->sm_count);
            }
            printf("sweep %dx%d best %d chunks, %d stages: %.3f TB/s\n", r.B, r.L, best_c, best_s,
                   best);
        }

        printf("\n%-12s %8s | %7s %7s %7s %6s %7s %6s | %7s %7s\n", "batch x ctx", "KV MB", "v1",
               "v2", "/copy", "chunks", "v2@2x", "chunks", "v1 bf16", "v2 bf16");
        for (auto &r : runs) {
            double r1 = tbs(r, &r.v1), r2 = tbs(r, &r.v2[0]), r3 = tbs(r, &r.v2[1]);
            double b1 = tbs(r, &r.v1, false), b2 = tbs(r, &r.v2[0], false);
            char name[32];
            snprintf(name, sizeof name, "%dx%d", r.B, r.L);
            const int c0 = r.v2[0].kind == BE_DECODE_V2 ? r.v2[0].max_chunks : 1;
            const int c1 = r.v2[1].kind == BE_DECODE_V2 ? r.v2[1].max_chunks : 1;
            printf("%-12s %8.1f | %7.3f %7.3f %7.2f %6d %7.3f %6d | %7.3f %7.3f\n", name,
                   r.kv_bytes / 1e6, r1, r2, r2 / copy_tbs, c0, r3, c1, b1, b2);
            fprintf(stderr,
                    "shape %s v1_tbs %.4f v2_tbs %.4f v2x2_tbs %.4f v1bf16_tbs %.4f v2bf16_tbs "
                    "%.4f copy_tbs %.4f v2_chunks %d v2x2_chunks %d\n",
                    name, r1, r2, r3, b1, b2, copy_tbs, c0, c1);
        }
    }
    for (auto &r : runs) {
        for (int i = 0; i < 5; i++) be->ops->free(be, r.mem[i]);
        be->ops->free(be, r.q.data);
        be->ops->free(be, r.out.data);
        be->ops->free(be, r.q16.data);
        be->ops->free(be, r.out16.data);
        for (int k = 0; k < 2; k++) be->ops->free(be, r.v2[k].workspace);
        be->ops->free(be, r.ws.workspace);
    }
    be->ops->free(be, layer.k);
    be->ops->free(be, layer.v);
    be->ops->destroy(be);
    return 0;
}
