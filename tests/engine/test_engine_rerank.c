/* Reranking with a sequence classifier against transformers: the qwen3_seqcls_bf16 fixture is
 * a tiny Qwen3ForSequenceClassification (a score head of one label, no LM head) whose
 * scores.json holds token sequences and the scores transformers gives them (float64). Each
 * sequence, scored on the CPU backend by engine_rerank (the head on the last token's hidden
 * state after the final norm), must give its score within 1e-3 of the scores' RMS, and the
 * whole set within 1e-3 relative error. The model gives no logits, and says why. */
#include "engine/engine_test_runtime.h"
#include "test.h"

#include <jansson.h>
#include <string.h>

static void check_scores(engine_runtime *rt, const engine_reranker *r, json_t *ref) {
    json_t *seqs = json_object_get(ref, "sequences"), *scores = json_object_get(ref, "scores");
    size_t n = json_array_size(seqs);
    CHECK_MSG(n > 0 && json_array_size(scores) == n, "scores.json: %zu sequences, %zu scores", n,
              json_array_size(scores));
    double *got = calloc(n + 1, sizeof *got), *want = calloc(n + 1, sizeof *want), ss = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_array_get(seqs, i);
        int len = (int)json_array_size(s);
        int32_t *ids = malloc(((size_t)len + 1) * sizeof *ids);
        for (int k = 0; k < len; k++) ids[k] = (int32_t)json_integer_value(json_array_get(s, k));
        want[i] = json_number_value(json_array_get(json_array_get(scores, i), 0));
        base_err err;
        int rc = engine_rerank(rt, r, ids, len, &got[i], &err);
        CHECK_MSG(rc == 0, "sequence %zu: %s", i, rc ? err.msg : "");
        ss += want[i] * want[i];
        free(ids);
    }
    double rms = sqrt(ss / (double)n), err2 = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs(got[i] - want[i]);
        err2 += e * e;
        printf("sequence %zu: %zu tokens, score %.6f, transformers %.6f, |error| %.2e\n", i,
               json_array_size(json_array_get(seqs, i)), got[i], want[i], e);
        CHECK_MSG(e <= 1e-3 * rms, "sequence %zu: %.6f against %.6f", i, got[i], want[i]);
    }
    double rel = sqrt(err2) / sqrt(ss);
    printf("relative error over the %zu scores: %.2e\n", n, rel);
    CHECK(rel <= 1e-3);
    free(got);
    free(want);
}

int main(void) {
    const char *src = getenv("MLXCEL_SOURCE_DIR");
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/qwen3_seqcls_bf16", src ? src : ".");
    snprintf(path, sizeof path, "%s/scores.json", dir);
    json_error_t je;
    json_t *ref = json_load_file(path, 0, &je);
    if (!ref) {
        fprintf(stderr, "%s: %s\n", path, je.text);
        return 1;
    }
    engine_runtime *rt = test_open_runtime(dir, 256, 1, 0);
    const io_model_config *c = model_config(rt->model);
    CHECK_MSG(c->num_labels == 1, "num_labels %d", c->num_labels);
    CHECK(!model_has_lm_head(rt->model));

    engine_reranker r;
    base_err err;
    int rc = engine_reranker_open(rt->model, NULL, &r, &err);
    CHECK_MSG(rc == 0 && r.head, "%s", rc ? err.msg : "no head");
    if (rc == 0) check_scores(rt, &r, ref);
    engine_reranker_close(&r);

    /* no LM head: asking for logits is an error that says what the checkpoint is */
    int32_t ids[3] = {1, 2, 3};
    float *all = NULL;
    rc = engine_prefill_logits(rt, ids, 3, &all, NULL, &err);
    CHECK_MSG(rc != 0 && strstr(err.msg, "sequence classifier"), "logits: %s",
              rc ? err.msg : "given");
    free(all);

    engine_runtime_close(rt);
    json_decref(ref);
    TEST_MAIN_END();
}
