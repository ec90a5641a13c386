/* The public C API (include/mlxcel.h) over the engine: a runtime, a prompter and a scheduler
 * held together, requests translated to engine requests and engine events to API events.
 * Only this file knows both sides, so the public header stays free of internal types. */
#include "mlxcel.h"

#include "engine/engine.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mlxcel_engine {
    engine_runtime *rt;  /* owned */
    engine_prompter *pr; /* owned */
    engine_sched *sched; /* owned; stopped before rt and pr go */
    int32_t eos[1];      /* (n_eos) the tokenizer's EOS, besides the model config's */
    int n_eos;
};

/* One accepted request's user callback; freed on its final event. */
typedef struct api_sink {
    mlxcel_event_fn fn;
    void *ctx;
} api_sink;

static void copy_err(char *dst, size_t len, const char *msg) {
    if (dst && len > 0) snprintf(dst, len, "%s", msg);
}

static int fail(char *dst, size_t len, const base_err *err) {
    copy_err(dst, len, err->msg);
    return -1;
}

const char *mlxcel_version(void) {
    return MLXCEL_VERSION_STRING;
}

mlxcel_options mlxcel_options_default(void) {
    return (mlxcel_options){.device = "auto", .n_parallel = 4};
}

mlxcel_request mlxcel_request_default(void) {
    engine_sampling s;
    engine_sampling_defaults(&s);
    return (mlxcel_request){
        .temperature = s.temperature, .top_k = s.top_k, .top_p = s.top_p, .min_p = s.min_p};
}

/* The engine's own check names a command-line flag; an embedder set a struct field. */
static int check_options(const mlxcel_options *o, base_err *err) {
    const char *dev = o->device ? o->device : "auto";
    if (strcmp(dev, "auto") && strcmp(dev, "cpu") && strcmp(dev, "cuda"))
        return base_fail(
            err, "mlxcel_options.device: unknown device '%s' (expected auto, cpu or cuda)", dev);
    if (o->n_parallel < 1)
        return base_fail(err, "mlxcel_options.n_parallel: %d (expected at least 1)", o->n_parallel);
    return 0;
}

static int engine_open(mlxcel_engine *e, const char *model_dir, const mlxcel_options *o,
                       base_err *err) {
    if (!model_dir) return base_fail(err, "mlxcel_open: model_dir is NULL");
    if (!base_dir_exists(model_dir))
        return base_fail(err, "%s: no such model directory", model_dir);
    if (check_options(o, err)) return -1;
    char budget[32];
    engine_options eo;
    engine_options_defaults(&eo);
    eo.device = o->device ? o->device : "auto";
    eo.n_threads = o->n_threads;
    eo.ctx_size = o->ctx_size;
    eo.n_parallel = o->n_parallel;
    if (o->kv_budget) {
        snprintf(budget, sizeof budget, "%" PRIu64, o->kv_budget);
        eo.kv_budget = budget;
    }
    if (engine_runtime_open(model_dir, &eo, &e->rt, err) ||
        engine_prompter_open(model_dir, o->chat_tmpl, &e->pr, err))
        return -1;
    if (tok_eos_id(e->pr->tok) >= 0) e->eos[e->n_eos++] = tok_eos_id(e->pr->tok);
    engine_sched_options so = {.n_parallel = e->rt->kv_plan.n_parallel,
                               .ctx_size = e->rt->kv_plan.ctx_size,
                               .tok = e->pr->tok,
                               .n_eos = e->n_eos,
                               .eos_ids = e->eos};
    return engine_sched_start(e->rt, &so, &e->sched, err);
}

int mlxcel_open(const char *model_dir, const mlxcel_options *opts, mlxcel_engine **out, char *err,
                size_t err_len) {
    base_err e = {{0}};
    if (!out) {
        copy_err(err, err_len, "mlxcel_open: out is NULL");
        return -1;
    }
    *out = NULL;
    mlxcel_options defaults = mlxcel_options_default();
    mlxcel_engine *eng = calloc(1, sizeof *eng);
    if (!eng) {
        copy_err(err, err_len, "mlxcel_open: out of memory");
        return -1;
    }
    if (engine_open(eng, model_dir, opts ? opts : &defaults, &e)) {
        mlxcel_close(eng);
        return fail(err, err_len, &e);
    }
    *out = eng;
    return 0;
}

void mlxcel_close(mlxcel_engine *engine) {
    if (!engine) return;
    if (engine->sched) engine_sched_stop(engine->sched);
    engine_prompter_close(engine->pr);
    engine_runtime_close(engine->rt);
    free(engine);
}

static mlxcel_finish api_finish(engine_finish f) {
    switch (f) {
    case ENGINE_FINISH_NONE:
        return MLXCEL_FINISH_NONE;
    case ENGINE_FINISH_STOP:
        return MLXCEL_FINISH_STOP;
    case ENGINE_FINISH_LENGTH:
        return MLXCEL_FINISH_LENGTH;
    case ENGINE_FINISH_CANCELLED:
        return MLXCEL_FINISH_CANCELLED;
    case ENGINE_FINISH_ERROR:
        break;
    }
    return MLXCEL_FINISH_ERROR;
}

/* Token events whose text is still held back (a split character, a possible stop string)
 * carry nothing an embedder can show, so they are not passed on. */
static void on_engine_event(void *ctx, const engine_event *ev) {
    api_sink *sink = ctx;
    bool final = ev->finish != ENGINE_FINISH_NONE;
    if (!final && ev->text_len == 0) return;
    mlxcel_event out = {.id = ev->id,
                        .text = ev->text_len ? ev->text : "",
                        .text_len = ev->text_len,
                        .finish = api_finish(ev->finish),
                        .n_prompt = ev->n_prompt,
                        .n_generated = ev->n_generated,
                        .error = ev->finish == ENGINE_FINISH_ERROR
                                     ? (ev->error ? ev->error : "generation failed")
                                     : NULL};
    sink->fn(sink->ctx, &out);
    if (final) free(sink);
}

/* messages as the JSON array the chat template reads; *out: caller decrefs. */
static int messages_json(const mlxcel_request *r, json_t **out, base_err *err) {
    json_t *arr = json_array();
    for (int i = 0; i < r->n_messages; i++) {
        const mlxcel_message *m = &r->messages[i];
        if (!m->role || !m->content) {
            json_decref(arr);
            return base_fail(err, "mlxcel_request.messages[%d].%s is NULL", i,
                             m->role ? "content" : "role");
        }
        json_array_append_new(arr, json_pack("{s:s,s:s}", "role", m->role, "content", m->content));
    }
    *out = arr;
    return 0;
}

/* The request's prompt tokens. *ids: caller frees. */
static int encode_prompt(const mlxcel_engine *e, const mlxcel_request *r, int32_t **ids, int *n,
                         base_err *err) {
    if (r->n_messages > 0) {
        if (!r->messages) return base_fail(err, "mlxcel_request.messages is NULL");
        json_t *msgs = NULL;
        if (messages_json(r, &msgs, err)) return -1;
        engine_chat_options opts = engine_chat_defaults(msgs);
        int rc = engine_prompter_encode_chat(e->pr, msgs, &opts, 0, ids, n, err);
        json_decref(msgs);
        return rc;
    }
    if (!r->prompt)
        return base_fail(err, "mlxcel_request.prompt is NULL (and there are no messages)");
    return engine_prompter_encode_text(e->pr, r->prompt, 0, ids, n, err);
}

static int submit(mlxcel_engine *e, const mlxcel_request *r, mlxcel_event_fn fn, void *ctx,
                  uint64_t *id, base_err *err) {
    if (!e) return base_fail(err, "mlxcel_submit: engine is NULL");
    if (!r) return base_fail(err, "mlxcel_submit: request is NULL");
    if (!fn) return base_fail(err, "mlxcel_submit: callback is NULL");
    if (r->n_stop < 0 || (r->n_stop > 0 && !r->stop))
        return base_fail(err, "mlxcel_request.stop: NULL with n_stop %d", r->n_stop);
    for (int i = 0; i < r->n_stop; i++)
        if (!r->stop[i]) return base_fail(err, "mlxcel_request.stop[%d] is NULL", i);
    int32_t *ids = NULL;
    int n = 0;
    if (encode_prompt(e, r, &ids, &n, err)) return -1;
    engine_request er = {.prompt = ids,
                         .n_prompt = n,
                         .max_tokens = r->max_tokens,
                         .n_stop = r->n_stop,
                         .stop = r->stop,
                         .on_event = on_engine_event};
    engine_sampling_defaults(&er.sampling);
    er.sampling.temperature = r->temperature;
    er.sampling.top_k = r->top_k;
    er.sampling.top_p = r->top_p;
    er.sampling.min_p = r->min_p;
    er.sampling.seed = r->seed;
    api_sink *sink = base_xmalloc(sizeof *sink);
    *sink = (api_sink){.fn = fn, .ctx = ctx};
    er.ctx = sink;
    uint64_t got = 0;
    engine_reject why;
    int rc = engine_submit(e->sched, &er, &got, &why, err);
    free(ids);
    if (rc) {
        free(sink);
        return -1;
    }
    if (id) *id = got;
    return 0;
}

int mlxcel_submit(mlxcel_engine *engine, const mlxcel_request *req, mlxcel_event_fn callback,
                  void *ctx, uint64_t *id, char *err, size_t err_len) {
    base_err e = {{0}};
    return submit(engine, req, callback, ctx, id, &e) ? fail(err, err_len, &e) : 0;
}

void mlxcel_cancel(mlxcel_engine *engine, uint64_t id) {
    if (engine) engine_cancel(engine->sched, id);
}

/* What mlxcel_generate waits on: the text so far and the final event's outcome. */
typedef struct api_wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char *text; /* (cap) NUL-terminated after len bytes */
    size_t len, cap;
    mlxcel_finish finish;
    base_err err; /* the final event's error */
    bool done;
} api_wait;

static void on_wait_event(void *ctx, const mlxcel_event *ev) {
    api_wait *w = ctx;
    pthread_mutex_lock(&w->mu);
    if (w->len + ev->text_len + 1 > w->cap) {
        w->cap = (w->len + ev->text_len + 1) * 2;
        w->text = base_xrealloc(w->text, w->cap);
    }
    memcpy(w->text + w->len, ev->text, ev->text_len);
    w->len += ev->text_len;
    w->text[w->len] = '\0';
    if (ev->finish != MLXCEL_FINISH_NONE) {
        w->finish = ev->finish;
        if (ev->error) base_fail(&w->err, "request %" PRIu64 ": %s", ev->id, ev->error);
        w->done = true;
        pthread_cond_signal(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
}

int mlxcel_generate(mlxcel_engine *engine, const mlxcel_request *req, char **text, char *err,
                    size_t err_len) {
    if (!text) {
        copy_err(err, err_len, "mlxcel_generate: text is NULL");
        return -1;
    }
    api_wait w = {.cap = 256};
    w.text = base_xmalloc(w.cap);
    w.text[0] = '\0';
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    uint64_t id = 0;
    int rc = submit(engine, req, on_wait_event, &w, &id, &w.err);
    if (rc == 0) {
        pthread_mutex_lock(&w.mu);
        while (!w.done) pthread_cond_wait(&w.cv, &w.mu);
        pthread_mutex_unlock(&w.mu);
        if (w.finish == MLXCEL_FINISH_CANCELLED)
            rc = base_fail(&w.err, "request %" PRIu64 " was cancelled", id);
        else if (w.finish == MLXCEL_FINISH_ERROR)
            rc = -1;
    }
    pthread_cond_destroy(&w.cv);
    pthread_mutex_destroy(&w.mu);
    if (rc) {
        free(w.text);
        return fail(err, err_len, &w.err);
    }
    *text = w.text;
    return 0;
}

void mlxcel_free(void *p) {
    free(p);
}
