/* Embeddings: a text's hidden states after the final norm, pooled as the checkpoint's
 * sentence-transformers config says (mean by default), then L2-normalized, as
 * sentence-transformers and the embedding APIs give them. */
#include "engine/engine.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The Pooling module's directory named by modules.json, or NULL (caller frees). */
static char *pooling_dir(const char *model_dir) {
    char *path = base_path_join(model_dir, "modules.json");
    json_t *mods = json_load_file(path, 0, NULL);
    free(path);
    char *dir = NULL;
    size_t i;
    json_t *m;
    json_array_foreach(mods, i, m) {
        const char *type = json_string_value(json_object_get(m, "type"));
        const char *sub = json_string_value(json_object_get(m, "path"));
        size_t n = type ? strlen(type) : 0;
        if (!dir && sub && n >= 7 && strcmp(type + n - 7, "Pooling") == 0)
            dir = base_path_join(model_dir, sub);
    }
    json_decref(mods);
    return dir;
}

int engine_pooling_read(const char *model_dir, engine_pooling *out, base_err *err) {
    static const struct {
        const char *key;
        engine_pooling pooling;
    } modes[] = {{"pooling_mode_mean_tokens", ENGINE_POOL_MEAN},
                 {"pooling_mode_lasttoken", ENGINE_POOL_LAST},
                 {"pooling_mode_cls_token", ENGINE_POOL_CLS}};
    *out = ENGINE_POOL_MEAN;
    char *dir = pooling_dir(model_dir);
    if (!dir) return 0;
    char *path = base_path_join(dir, "config.json");
    free(dir);
    json_error_t je;
    json_t *cfg = json_load_file(path, 0, &je);
    int rc = 0, n_on = 0;
    const char *key;
    json_t *v;
    if (!json_is_object(cfg)) rc = base_fail(err, "%s: %s", path, je.text);
    json_object_foreach(cfg, key, v) {
        if (rc || strncmp(key, "pooling_mode_", 13) != 0 || !json_is_true(v)) continue;
        size_t k = 0;
        while (k < sizeof modes / sizeof *modes && strcmp(key, modes[k].key) != 0) k++;
        if (k == sizeof modes / sizeof *modes)
            rc = base_fail(err, "%s: '%s' is not supported (mean, last token or CLS pooling)", path,
                           key);
        else
            *out = modes[k].pooling, n_on++;
    }
    if (!rc && n_on > 1)
        rc = base_fail(err, "%s: more than one pooling mode is on, which is not supported", path);
    json_decref(cfg);
    free(path);
    return rc;
}

int engine_embed(engine_runtime *rt, engine_pooling pooling, const int32_t *tokens, int n,
                 float *out, base_err *err) {
    if (n <= 0) return base_fail(err, "the input is empty");
    if (n > rt->kv_plan.ctx_size)
        return base_fail(err, "the input has %d tokens, more than the context size (%d; -c)", n,
                         rt->kv_plan.ctx_size);
    int dim = model_config(rt->model)->hidden_size, chunk = engine_prefill_chunk(rt->be);
    float *h = base_xmalloc((size_t)chunk * dim * sizeof *h);
    int32_t *rows = base_xmalloc((size_t)chunk * sizeof *rows);
    double *sum = base_xcalloc((size_t)dim, sizeof *sum);
    kv_seq *seq = kv_seq_create(rt->pool);
    int rc = 0;
    /* a causal model's first token sees only itself: CLS needs the first chunk alone */
    int end = pooling == ENGINE_POOL_CLS ? 1 : n;
    for (int start = 0; start < end && rc == 0;) {
        int len = end - start < chunk ? end - start : chunk, n_out = 0;
        kv_batch batch;
        if (kv_seq_append(rt->pool, seq, tokens + start, len, err) ||
            kv_batch_build(rt->pool, &seq, &len, 1, &batch, err)) {
            rc = -1;
            break;
        }
        if (pooling == ENGINE_POOL_MEAN)
            for (; n_out < len; n_out++) rows[n_out] = n_out;
        else if (start + len == end)
            rows[n_out++] = pooling == ENGINE_POOL_LAST ? len - 1 : 0;
        rc = model_forward_hidden(rt->model, rt->pool, &batch, tokens + start, rows, n_out, h, err);
        kv_batch_free(&batch);
        for (int r = 0; rc == 0 && r < n_out; r++)
            for (int d = 0; d < dim; d++) sum[d] += h[(size_t)r * dim + d];
        start += len;
    }
    kv_seq_free(rt->pool, seq);
    double norm = 0;
    for (int d = 0; d < dim; d++) norm += sum[d] * sum[d];
    /* the mean's scale goes with the normalization */
    norm = sqrt(norm);
    for (int d = 0; rc == 0 && d < dim; d++) out[d] = norm > 0 ? (float)(sum[d] / norm) : 0.0f;
    free(h);
    free(rows);
    free(sum);
    return rc;
}
