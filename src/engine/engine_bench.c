/* Throughput measurements for `mlxcel bench`: prompt processing, batched decode, and the
 * backend's memory ceiling (its read or its copy bandwidth), all on the runtime as loaded. */
#include "engine/engine.h"

#include <stdlib.h>
#include <string.h>

/* Token ids for benchmarks: spread over the vocabulary, never zero. */
static void bench_tokens(int32_t *ids, int n, int vocab, uint32_t seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        ids[i] = 1 + (int32_t)(seed >> 8) % (vocab - 1);
    }
}

int engine_bench_prefill(engine_runtime *rt, int n_tokens, double *seconds, base_err *err) {
    int vocab = model_config(rt->model)->vocab_size;
    int32_t *ids = base_xmalloc((size_t)n_tokens * sizeof *ids);
    float *logits = base_xmalloc((size_t)vocab * sizeof *logits);
    bench_tokens(ids, n_tokens, vocab, 7);
    double t0 = base_now();
    int rc = engine_prefill_logits(rt, ids, n_tokens, NULL, logits, err);
    *seconds = base_now() - t0;
    free(ids);
    free(logits);
    return rc;
}

int engine_bench_decode(engine_runtime *rt, int n_seqs, int n_depth, int n_steps, double *seconds,
                        base_err *err) {
    const io_model_config *c = model_config(rt->model);
    kv_seq **seqs = base_xcalloc((size_t)n_seqs, sizeof *seqs);
    int32_t *ids = base_xmalloc((size_t)n_seqs * sizeof *ids);
    int *q_lens = base_xmalloc((size_t)n_seqs * sizeof *q_lens);
    int32_t *rows = base_xmalloc((size_t)n_seqs * sizeof *rows);
    engine_sampler **samplers = base_xcalloc((size_t)n_seqs, sizeof *samplers);
    engine_pick *picks = base_xcalloc((size_t)n_seqs, sizeof *picks);
    engine_picker *picker = engine_picker_new(c->vocab_size);
    engine_sampling sp;
    engine_sampling_defaults(&sp);
    int rc = 0;
    for (int s = 0; s < n_seqs && rc == 0; s++) {
        seqs[s] = kv_seq_create(rt->pool);
        q_lens[s] = 1;
        rows[s] = s;
        sp.seed = (uint64_t)s;
        rc = engine_sampler_new(&sp, c->vocab_size, &samplers[s], err);
    }
    /* Each sequence's own prompt (no shared prefix): its attention reads its own pages. */
    int32_t *prompt = n_depth > 0 ? base_xmalloc((size_t)n_depth * sizeof *prompt) : NULL;
    for (int s = 0; s < n_seqs && rc == 0 && n_depth > 0; s++) {
        bench_tokens(prompt, n_depth, c->vocab_size, 101u + (uint32_t)s);
        rc = engine_prefill_seq(rt, seqs[s], prompt, n_depth, err);
    }
    free(prompt);
    double t0 = 0;
    /* step 0 writes each sequence's first token and is not timed (it is a 1-token prefill).
     * Every step samples each row as the server does (llama-server's default chain), but
     * feeds fixed ids back so that every run does the same work. */
    for (int step = 0; step <= n_steps && rc == 0; step++) {
        if (step == 1) t0 = base_now();
        bench_tokens(ids, n_seqs, c->vocab_size, 11u + (uint32_t)step);
        for (int s = 0; s < n_seqs && rc == 0; s++)
            rc = kv_seq_append(rt->pool, seqs[s], &ids[s], 1, err);
        kv_batch batch;
        if (rc == 0) rc = kv_batch_build(rt->pool, seqs, q_lens, n_seqs, &batch, err);
        if (rc) break;
        rc = model_forward(rt->model, rt->pool, &batch, ids, rows, n_seqs, NULL, err);
        kv_batch_free(&batch);
        for (int s = 0; s < n_seqs && rc == 0; s++)
            picks[s] = (engine_pick){
                .sampler = samplers[s], .history = &ids[s], .n_history = 1, .top_logprobs = -1};
        be_tensor logits = model_logits(rt->model, n_seqs);
        if (rc == 0) rc = engine_picker_run(picker, rt->be, &logits, picks, n_seqs, err);
    }
    *seconds = base_now() - t0;
    for (int s = 0; s < n_seqs; s++) {
        if (seqs[s]) kv_seq_free(rt->pool, seqs[s]);
        engine_sampler_free(samplers[s]);
    }
    free(samplers);
    free(picks);
    engine_picker_free(picker);
    free(seqs);
    free(ids);
    free(q_lens);
    free(rows);
    return rc;
}

/* Backend memory of `bytes` holding real data: untouched pages can all map to one zero page
 * and read from cache. */
static int bench_buffer(be_backend *be, size_t bytes, void **buf, base_err *err) {
    const size_t chunk = (size_t)16 << 20;
    uint32_t *host = base_xmalloc(chunk);
    for (size_t i = 0; i < chunk / 4; i++) host[i] = (uint32_t)(i * 2654435761u);
    int rc = be->ops->alloc(be, bytes, buf, err);
    for (size_t at = 0; at < bytes && rc == 0; at += chunk)
        rc = be->ops->upload(be, (char *)*buf + at, host, bytes - at < chunk ? bytes - at : chunk,
                             err);
    free(host);
    return rc;
}

/* Bytes read + written a second, best of 4 copies of 256 MiB. */
static int bench_copy_bandwidth(be_backend *be, double *bytes_per_second, base_err *err) {
    /* large enough to leave every cache, small enough for any machine we run on */
    const size_t bytes = (size_t)256 << 20;
    void *a = NULL, *b = NULL;
    int rc = bench_buffer(be, bytes, &a, err);
    if (rc == 0) rc = be->ops->alloc(be, bytes, &b, err);
    double best = 0;
    for (int rep = 0; rep < 5 && rc == 0; rep++) {
        /* the first copy also faults the pages in and is not counted */
        double t0 = base_now();
        rc = be->ops->copy(be, b, a, bytes, err);
        if (rc == 0) rc = be->ops->sync(be, err);
        double dt = base_now() - t0;
        if (rep > 0 && dt > 0 && 2.0 * (double)bytes / dt > best) best = 2.0 * (double)bytes / dt;
    }
    if (a) be->ops->free(be, a);
    if (b) be->ops->free(be, b);
    *bytes_per_second = best;
    return rc;
}

/* Bytes read a second, best of 5 read_sum passes over 512 MiB: far past the last-level caches
 * of the machines we run on (8 MiB on the 2-core EPYC VM), and the fill and the passes take
 * about 0.4 s there, on every bench. The pool's caller sums a slice too, so a pass's clock
 * starts and stops with the reads; timed from another thread, on a machine with no core to
 * spare it can start late and overstate the rate (a standalone reader did so by a quarter). */
static int bench_read_bandwidth(be_backend *be, double *bytes_per_second, base_err *err) {
    const size_t bytes = (size_t)512 << 20;
    void *a = NULL;
    int rc = be->ops->read_sum
                 ? bench_buffer(be, bytes, &a, err)
                 : base_fail(err, "%s backend: a read ceiling without read_sum", be->name);
    double best = 0;
    for (int rep = 0; rep < 5 && rc == 0; rep++) {
        uint64_t sum;
        double t0 = base_now();
        rc = be->ops->read_sum(be, a, bytes, &sum, err);
        if (rc == 0) rc = be->ops->sync(be, err);
        double dt = base_now() - t0;
        if (dt > 0 && (double)bytes / dt > best) best = (double)bytes / dt;
    }
    if (a) be->ops->free(be, a);
    *bytes_per_second = best;
    return rc;
}

int engine_bench_ceiling(be_backend *be, engine_ceiling *out, base_err *err) {
    if (be->ceiling == BE_CEILING_READ) {
        *out = (engine_ceiling){.name = "read", .how = "read only, all threads"};
        return bench_read_bandwidth(be, &out->bytes_per_second, err);
    }
    *out = (engine_ceiling){.name = "copy", .how = "read + write"};
    return bench_copy_bandwidth(be, &out->bytes_per_second, err);
}
