/* The runtime: one backend, one model and the paged pool sized for it; and single-sequence
 * prefill and generation on top (the CLI's generate, logits and perplexity). */
#include "engine/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Prompt tokens per forward step when the backend suggests none. */
#define ENGINE_PREFILL_CHUNK 512

void engine_options_defaults(engine_options *o) {
    *o = (engine_options){.device = "auto",
                          .n_threads = 0,
                          .ctx_size = 0,
                          .n_parallel = 1,
                          .kv_block_size = KV_DEFAULT_BLOCK_SIZE,
                          .kv_dtype = BASE_DTYPE_COUNT,
                          .kv_budget = NULL,
                          .prefill_chunk = 0,
                          .tensor_parallel = 1};
}

int engine_backend_open(const engine_options *o, be_backend **be, base_err *err) {
    const char *dev = o->device ? o->device : "auto";
    if (strcmp(dev, "cpu") == 0) return be_cpu_create(o->n_threads, be, err);
    if (strcmp(dev, "cuda") == 0) return be_cuda_create(0, be, err);
    if (strcmp(dev, "auto") != 0)
        return base_fail(err, "--device: unknown device '%s' (expected auto, cpu or cuda)", dev);
    base_err ignored;
    if (be_cuda_create(0, be, &ignored) == 0) return 0;
    return be_cpu_create(o->n_threads, be, err);
}

int engine_check_tensor_parallel(const engine_options *o, const be_backend *be, base_err *err) {
    int n = o->tensor_parallel;
    if (n < 1) return base_fail(err, "--tensor-parallel: wants 1 or more ranks, got %d", n);
    if (n == 1) return 0;
    if (strcmp(be->name, "cuda") != 0)
        return base_fail(err,
                         "--tensor-parallel %d: the %s backend runs one rank; tensor parallelism "
                         "spreads a model over CUDA GPUs",
                         n, be->name);
    int devices = be_cuda_device_count();
    if (devices < n)
        return base_fail(err, "--tensor-parallel %d: %d CUDA device%s visible", n, devices,
                         devices == 1 ? "" : "s");
    be_nccl *nccl;
    if (be_nccl_open(&nccl, err)) return -1;
    be_nccl_close(nccl);
    return base_fail(err,
                     "--tensor-parallel %d: the sharded step is not wired into the engine yet "
                     "(issue 25); run with -tp 1",
                     n);
}

int engine_runtime_open(const char *model_dir, const engine_options *o, engine_runtime **out,
                        base_err *err) {
    engine_runtime *rt = base_xcalloc(1, sizeof *rt);
    if (engine_backend_open(o, &rt->be, err) || engine_check_tensor_parallel(o, rt->be, err) ||
        model_load(model_dir, rt->be, o->on_load, o->on_load_ctx, &rt->model, err) ||
        engine_plan_kv(model_config(rt->model), model_weight_bytes(rt->model), rt->be, o,
                       &rt->kv_plan, err)) {
        engine_runtime_close(rt);
        return -1;
    }
    const engine_kv_plan *kp = &rt->kv_plan;
    if (model_reserve_decode(rt->model, kp->geom.block_size, kp->n_parallel, kp->ctx_size, err) ||
        kv_pool_create(rt->be, &kp->geom, kp->kv_blocks, kp->kv_local_blocks, &rt->pool, err)) {
        engine_runtime_close(rt);
        return -1;
    }
    *out = rt;
    return 0;
}

void engine_runtime_describe(const engine_runtime *rt, const char *model_dir, char *buf,
                             size_t size) {
    const engine_kv_plan *k = &rt->kv_plan;
    const io_model_config *c = model_config(rt->model);
    snprintf(buf, size,
             "model %s (%s, %d layers), backend %s (%s), %d threads, context %d per sequence x %d "
             "parallel, KV %lld blocks of %d tokens (%lld tokens, %.1f MiB)",
             model_dir, c->model_type, c->num_hidden_layers, rt->be->name, rt->be->device,
             rt->be->n_threads, k->ctx_size, k->n_parallel, (long long)k->kv_blocks,
             k->geom.block_size, (long long)k->kv_blocks * k->geom.block_size,
             (double)k->kv_blocks * (double)k->global_bytes_per_block / (1 << 20));
    if (k->n_local_layers) {
        size_t used = strlen(buf);
        snprintf(buf + used, size - used, "; %d local layers (window %d): %lld blocks (%.1f MiB)",
                 k->n_local_layers, k->geom.window, (long long)k->kv_local_blocks,
                 (double)k->kv_local_blocks * (double)k->local_bytes_per_block / (1 << 20));
    }
}

void engine_runtime_close(engine_runtime *rt) {
    if (!rt) return;
    kv_pool_destroy(rt->pool);
    model_free(rt->model);
    be_destroy(rt->be);
    free(rt);
}

/* Appends tokens [0, n) to seq and runs them through the model in chunks; logits of every
 * row land in all (n x vocab) when all is given, else the last row's in last, or in backend
 * memory (model_logits) when last is NULL too. */
static int prefill(engine_runtime *rt, kv_seq *seq, const int32_t *tokens, int n, float *all,
                   float *last, base_err *err) {
    int vocab = model_config(rt->model)->vocab_size;
    int chunk = engine_prefill_chunk(rt->be);
    int32_t *rows = base_xmalloc((size_t)chunk * sizeof *rows);
    int rc = 0;
    for (int start = 0; start < n && rc == 0;) {
        int len = n - start < chunk ? n - start : chunk;
        kv_batch batch;
        rc = kv_seq_append(rt->pool, seq, tokens + start, len, err);
        if (rc) break;
        rc = kv_batch_build(rt->pool, &seq, &len, 1, &batch, err);
        if (rc) break;
        bool final = start + len == n;
        int n_out = all ? len : (final ? 1 : 0);
        for (int i = 0; i < n_out; i++) rows[i] = all ? i : len - 1;
        float *dst = all ? all + (size_t)start * vocab : last;
        rc = model_forward(rt->model, rt->pool, &batch, tokens + start, rows, n_out, dst, err);
        if (rc == 0) kv_seq_commit(rt->pool, seq); /* full blocks become reusable prefixes */
        kv_batch_free(&batch);
        start += len;
    }
    free(rows);
    return rc;
}

int engine_prefill_chunk(const be_backend *be) {
    return be->prefill_chunk > 0 ? be->prefill_chunk : ENGINE_PREFILL_CHUNK;
}

static int check_prompt(const engine_runtime *rt, int n_prompt, base_err *err) {
    if (n_prompt <= 0) return base_fail(err, "the prompt is empty");
    if (n_prompt > rt->kv_plan.ctx_size)
        return base_fail(err, "the prompt has %d tokens, more than the context size (%d; -c)",
                         n_prompt, rt->kv_plan.ctx_size);
    return 0;
}

int engine_prefill_logits(engine_runtime *rt, const int32_t *prompt, int n_prompt,
                          float **all_logits, float *last_logits, base_err *err) {
    if (check_prompt(rt, n_prompt, err)) return -1;
    int vocab = model_config(rt->model)->vocab_size;
    float *all = NULL;
    if (all_logits) all = base_xmalloc((size_t)n_prompt * vocab * sizeof *all);
    kv_seq *seq = kv_seq_create(rt->pool);
    int rc = prefill(rt, seq, prompt, n_prompt, all, last_logits, err);
    kv_seq_free(rt->pool, seq);
    if (rc) {
        free(all);
        return -1;
    }
    if (all_logits) *all_logits = all;
    return 0;
}

int engine_prefill_seq(engine_runtime *rt, kv_seq *seq, const int32_t *tokens, int n,
                       base_err *err) {
    return prefill(rt, seq, tokens, n, NULL, NULL, err);
}

static bool is_eos(const io_model_config *c, int32_t t) {
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_token_ids[i] == t) return true;
    return false;
}

/* Samples the token after the last forward's one row of logits (left in backend memory). */
static int sample_next(engine_runtime *rt, engine_picker *picker, engine_sampler *sampler,
                       const int32_t *hist, int n_hist, int32_t *t, base_err *err) {
    engine_pick pk = {.sampler = sampler, .history = hist, .n_history = n_hist, .top_logprobs = -1};
    be_tensor logits = model_logits(rt->model, 1);
    if (engine_picker_run(picker, rt->be, &logits, &pk, 1, err)) return -1;
    *t = pk.token;
    return 0;
}

static int decode_loop(engine_runtime *rt, kv_seq *seq, engine_sampler *sampler,
                       engine_picker *picker, int32_t *hist, int n_prompt, int max_new,
                       engine_token_fn on_token, void *ctx, engine_generate_result *res,
                       base_err *err) {
    const io_model_config *c = model_config(rt->model);
    for (;;) {
        int32_t t;
        if (sample_next(rt, picker, sampler, hist, n_prompt + res->n_tokens, &t, err)) return -1;
        hist[n_prompt + res->n_tokens] = t;
        res->tokens[res->n_tokens++] = t;
        if (is_eos(c, t)) {
            res->stopped_by_eos = true;
            return 0;
        }
        if ((on_token && !on_token(ctx, t)) || res->n_tokens == max_new) return 0;
        kv_batch batch;
        int one = 1, row = 0;
        if (kv_seq_append(rt->pool, seq, &t, 1, err) ||
            kv_batch_build(rt->pool, &seq, &one, 1, &batch, err))
            return -1;
        int rc = model_forward(rt->model, rt->pool, &batch, &t, &row, 1, NULL, err);
        kv_batch_free(&batch);
        if (rc) return -1;
        kv_seq_commit(rt->pool, seq);
    }
}

int engine_generate(engine_runtime *rt, const int32_t *prompt, int n_prompt, int max_new,
                    const engine_sampling *sampling, engine_token_fn on_token, void *ctx,
                    engine_generate_result *res, base_err *err) {
    memset(res, 0, sizeof *res);
    if (check_prompt(rt, n_prompt, err)) return -1;
    if (max_new > rt->kv_plan.ctx_size - n_prompt) max_new = rt->kv_plan.ctx_size - n_prompt;
    if (max_new <= 0) return 0;
    const io_model_config *c = model_config(rt->model);
    engine_sampler *sampler;
    if (engine_sampler_new(sampling, c->vocab_size, &sampler, err)) return -1;
    engine_picker *picker = engine_picker_new(c->vocab_size);
    int32_t *hist = base_xmalloc((size_t)(n_prompt + max_new) * sizeof *hist);
    memcpy(hist, prompt, (size_t)n_prompt * sizeof *hist);
    res->tokens = base_xmalloc((size_t)max_new * sizeof *res->tokens);
    kv_seq *seq = kv_seq_create(rt->pool);
    double t0 = base_now();
    /* A prompt that shares full blocks with an earlier one (the next turn of a chat) reuses
     * their K/V from the prefix cache. */
    int adopted = kv_seq_adopt_prefix(rt->pool, seq, prompt, n_prompt);
    int rc = prefill(rt, seq, prompt + adopted, n_prompt - adopted, NULL, NULL, err);
    double t1 = base_now();
    if (!rc)
        rc =
            decode_loop(rt, seq, sampler, picker, hist, n_prompt, max_new, on_token, ctx, res, err);
    res->prefill_seconds = t1 - t0;
    res->decode_seconds = base_now() - t1;
    kv_seq_free(rt->pool, seq);
    engine_sampler_free(sampler);
    engine_picker_free(picker);
    free(hist);
    if (rc) {
        free(res->tokens);
        res->tokens = NULL;
        return -1;
    }
    return 0;
}
