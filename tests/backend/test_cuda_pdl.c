/* The decode path's kernels queued back to back, each reading what the one before wrote, with
 * no synchronization between them: a decode layer's chain (residual add + RMSNorm, fused
 * Q/K/V GEMV, RoPE with the KV append, a GEMV, gate/up with SiLU-mul, the down GEMV) repeated,
 * run directly and as a recording, against the CPU backend's plain ops. The GEMVs are large
 * enough (8 to 32 MB of weights) that a kernel allowed to start early and reading its input
 * before waiting for the GEMV that writes it reads the previous layer's values instead. */
#include "test_cuda_util.h"

#include <math.h>
#include <stdlib.h>

#define D      4096 /* hidden size */
#define KVW    1024 /* kv heads x head_dim */
#define HD     128  /* head_dim */
#define INTER  8192 /* MLP width */
#define LAYERS 3
#define BS     16 /* pool block size */

static be_backend *cpu;

/* A random 4-bit group-64 layer with BF16 scales and biases: host in *h, device in *d. */
static void make_q4(be_backend *be, int64_t out, int64_t in, be_linear *h, be_linear *d) {
    size_t wbytes = (size_t)(out * in / 2), ng = (size_t)(out * in / 64);
    uint32_t *w = malloc(wbytes);
    for (size_t i = 0; i < wbytes / 4; i++) w[i] = tc_u32();
    uint16_t *s = malloc(ng * 2), *b = malloc(ng * 2);
    for (size_t i = 0; i < ng; i++) {
        s[i] = base_f32_to_bf16(0.02f * tc_uniform());
        b[i] = base_f32_to_bf16(0.05f * tc_uniform());
    }
    *h = (be_linear){.weight = w,
                     .scales = s,
                     .biases = b,
                     .dtype = BASE_DTYPE_BF16,
                     .out = out,
                     .in = in,
                     .bits = 4,
                     .group_size = 64};
    *d = *h;
    d->weight = tc_dev_bytes(be, w, wbytes);
    d->scales = tc_dev_bytes(be, s, ng * 2);
    d->biases = tc_dev_bytes(be, b, ng * 2);
}

static void free_q4(be_backend *be, be_linear *h, be_linear *d) {
    be->ops->free(be, (void *)d->weight);
    be->ops->free(be, (void *)d->scales);
    be->ops->free(be, (void *)d->biases);
    free((void *)h->weight), free((void *)h->scales), free((void *)h->biases);
}

/* One side of the comparison: a backend, its weights and its buffers. */
typedef struct side {
    be_backend *be;
    be_linear q, k, v, o, gate, up, down;
    be_tensor norm1, norm2, x, h, tq, tk, tv, d, g, u, pos, freqs;
    be_kv_layer pool;
    be_paged_batch batch;
} side;

static be_tensor buf(be_backend *be, const float *init, int64_t cols) {
    float *z = calloc((size_t)cols, sizeof(float));
    be_tensor t = tc_tensor(be, init ? init : z, BASE_DTYPE_F32, 1, cols);
    free(z);
    return t;
}

/* The chain: the fused ops (the device) or their plain composition (the CPU); then
 * x += d and h = rmsnorm(x). */
static int run_chain(side *s, bool fused, base_err *err) {
    be_backend *be = s->be;
    const be_ops *op = be->ops;
    for (int l = 0; l < LAYERS; l++) {
        if (fused) {
            if (op->add_rmsnorm(be, &s->x, &s->d, &s->norm1, 1e-5f, &s->h, err)) return -1;
            const be_linear *ws[3] = {&s->q, &s->k, &s->v};
            be_tensor *ys[3] = {&s->tq, &s->tk, &s->tv};
            if (op->matmul_qkv(be, &s->h, ws, ys, err) ||
                op->rope_kv_append(be, &s->tq, &s->tk, &s->tv, &s->pos, &s->freqs, 1.0f, &s->pool,
                                   &s->batch, err) ||
                op->matmul(be, &s->tq, &s->o, &s->d, err) ||
                op->add_rmsnorm(be, &s->x, &s->d, &s->norm2, 1e-5f, &s->h, err) ||
                op->matmul_silu_mul(be, &s->h, &s->gate, &s->up, &s->g, err) ||
                op->matmul(be, &s->g, &s->down, &s->d, err))
                return -1;
            continue;
        }
        if (op->add(be, &s->x, &s->d, &s->x, err) ||
            op->rmsnorm(be, &s->x, &s->norm1, 1e-5f, &s->h, err) ||
            op->matmul(be, &s->h, &s->q, &s->tq, err) ||
            op->matmul(be, &s->h, &s->k, &s->tk, err) ||
            op->matmul(be, &s->h, &s->v, &s->tv, err) ||
            op->rope(be, &s->tq, D / HD, HD, &s->pos, &s->freqs, 1.0f, err) ||
            op->rope(be, &s->tk, KVW / HD, HD, &s->pos, &s->freqs, 1.0f, err) ||
            op->kv_append(be, &s->pool, &s->tk, &s->tv, &s->batch, err) ||
            op->matmul(be, &s->tq, &s->o, &s->d, err) || op->add(be, &s->x, &s->d, &s->x, err) ||
            op->rmsnorm(be, &s->x, &s->norm2, 1e-5f, &s->h, err) ||
            op->matmul(be, &s->h, &s->gate, &s->g, err) ||
            op->matmul(be, &s->h, &s->up, &s->u, err) ||
            op->silu_mul(be, &s->g, &s->u, &s->g, err) ||
            op->matmul(be, &s->g, &s->down, &s->d, err))
            return -1;
    }
    if (op->add(be, &s->x, &s->d, &s->x, err)) return -1;
    return op->rmsnorm(be, &s->x, &s->norm1, 1e-5f, &s->h, err);
}

int main(void) {
    be_backend *gpu = tc_backend();
    if (!gpu) return 0;
    base_err err = {{0}};
    CHECK_MSG(be_cpu_create(2, &cpu, &err) == 0, "%s", err.msg);
    side c = {.be = cpu}, g = {.be = gpu};
    make_q4(gpu, D, D, &c.q, &g.q);
    make_q4(gpu, KVW, D, &c.k, &g.k);
    make_q4(gpu, KVW, D, &c.v, &g.v);
    make_q4(gpu, D, D, &c.o, &g.o);
    make_q4(gpu, INTER, D, &c.gate, &g.gate);
    make_q4(gpu, INTER, D, &c.up, &g.up);
    make_q4(gpu, D, INTER, &c.down, &g.down);
    float *x0 = malloc(sizeof(float) * D), *d0 = malloc(sizeof(float) * D);
    float *n1 = malloc(sizeof(float) * D), *n2 = malloc(sizeof(float) * D), inv[HD / 2];
    tc_fill(x0, D, 1.0f);
    tc_fill(d0, D, 1.0f);
    for (int i = 0; i < D; i++)
        n1[i] = 1.0f + 0.5f * tc_uniform(), n2[i] = 1.0f + 0.5f * tc_uniform();
    for (int i = 0; i < HD / 2; i++) inv[i] = (float)pow(500000.0, -2.0 * i / HD);
    int32_t pos = 777;
    int64_t slot = 2 * BS + 5;
    size_t pool_elems = (size_t)4 * BS * KVW;
    uint16_t *pool0 = calloc(pool_elems, 2);
    float *cpu_x = NULL, *cpu_h = NULL, *cpu_pool = NULL;
    for (int pass = 0; pass < 3; pass++) {
        /* pass 0: the CPU reference; 1: the device directly; 2: the device, recorded. */
        side *s = pass ? &g : &c;
        be_backend *be = s->be;
        s->x = buf(be, x0, D), s->d = buf(be, d0, D), s->h = buf(be, NULL, D);
        s->norm1 = buf(be, n1, D), s->norm2 = buf(be, n2, D);
        s->tq = buf(be, NULL, D), s->tk = buf(be, NULL, KVW), s->tv = buf(be, NULL, KVW);
        s->g = buf(be, NULL, INTER), s->u = buf(be, NULL, INTER);
        s->freqs = buf(be, inv, HD / 2);
        s->pos = (be_tensor){tc_dev_bytes(be, &pos, 4), BASE_DTYPE_I32, 1, 1};
        s->pool = (be_kv_layer){tc_dev_bytes(be, pool0, pool_elems * 2),
                                tc_dev_bytes(be, pool0, pool_elems * 2),
                                BASE_DTYPE_F16,
                                4,
                                BS,
                                KVW / HD,
                                HD};
        s->batch = (be_paged_batch){.n_tokens = 1, .slots = tc_dev_bytes(be, &slot, 8)};
        if (pass < 2) {
            CHECK_MSG(run_chain(s, pass == 1, &err) == 0, "chain, pass %d: %s", pass, err.msg);
        } else {
            be_graph *graph = NULL;
            CHECK_MSG(be->ops->capture_begin(be, &err) == 0, "%s", err.msg);
            int rc = run_chain(s, true, &err);
            CHECK_MSG(be->ops->capture_end(be, &graph, &err) == 0 && rc == 0, "recording: %s",
                      err.msg);
            CHECK_MSG(graph && be->ops->graph_launch(be, graph, &err) == 0, "replay: %s", err.msg);
            CHECK_MSG(be->ops->sync(be, &err) == 0, "%s", err.msg);
            if (graph) be->ops->graph_free(be, graph);
        }
        float *x = tc_read(be, &s->x), *h = tc_read(be, &s->h);
        be_tensor pk = {s->pool.k, BASE_DTYPE_F16, (int64_t)pool_elems, 1};
        float *pool = tc_read(be, &pk);
        if (pass == 0) {
            cpu_x = x, cpu_h = h, cpu_pool = pool;
        } else {
            double ex = test_rel_err(x, cpu_x, D), eh = test_rel_err(h, cpu_h, D);
            double ep = test_rel_err(pool, cpu_pool, pool_elems);
            CHECK_MSG(ex < 1e-4 && eh < 1e-4 && ep < 2e-3,
                      "%s: residual err %g, normed err %g, k pool err %g",
                      pass == 1 ? "direct" : "recorded", ex, eh, ep);
            free(x), free(h), free(pool);
        }
        be_tensor *ts[] = {&s->x,  &s->d,  &s->h, &s->norm1, &s->norm2, &s->tq,
                           &s->tk, &s->tv, &s->g, &s->u,     &s->freqs, &s->pos};
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) be->ops->free(be, ts[i]->data);
        be->ops->free(be, s->pool.k);
        be->ops->free(be, s->pool.v);
        be->ops->free(be, (void *)s->batch.slots);
    }
    be_linear *hl[] = {&c.q, &c.k, &c.v, &c.o, &c.gate, &c.up, &c.down};
    be_linear *dl[] = {&g.q, &g.k, &g.v, &g.o, &g.gate, &g.up, &g.down};
    for (int i = 0; i < 7; i++) free_q4(gpu, hl[i], dl[i]);
    free(cpu_x), free(cpu_h), free(cpu_pool), free(x0), free(d0), free(n1), free(n2), free(pool0);
    cpu->ops->destroy(cpu);
    gpu->ops->destroy(gpu);
    TEST_MAIN_END();
}
