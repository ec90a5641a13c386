/* libmlxcel against the engine it wraps: greedy text through the public API equals
 * engine_generate's tokens, decoded, for the same prompt on the demo model. (The engine side
 * needs the internal headers; test_api.c checks the rest through include/mlxcel.h alone.) */
#include "engine/engine_test_runtime.h"
#include "mlxcel.h"
#include "test.h"

#include <string.h>

#define PROMPT  "The quick brown fox"
#define MAX_NEW 24

/* engine_generate's greedy text for PROMPT; caller frees. */
static char *engine_text(const char *dir) {
    engine_options o = test_cpu_options(256, 1, 0);
    base_err err = {{0}};
    engine_runtime *rt = NULL;
    engine_prompter *pr = NULL;
    int32_t *ids = NULL;
    int n = 0;
    char *text = NULL;
    size_t len = 0;
    engine_generate_result res = {0};
    engine_sampling greedy;
    engine_sampling_defaults(&greedy);
    greedy.temperature = 0;
    int rc = engine_runtime_open(dir, &o, &rt, &err) ||
             engine_prompter_open(dir, NULL, &pr, &err) ||
             engine_prompter_encode_text(pr, PROMPT, 0, &ids, &n, &err) ||
             engine_generate(rt, ids, n, MAX_NEW, &greedy, NULL, NULL, &res, &err) ||
             tok_decode(pr->tok, res.tokens, (size_t)res.n_tokens, true, &text, &len, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    CHECK(res.n_tokens > 0);
    free(res.tokens);
    free(ids);
    engine_prompter_close(pr);
    engine_runtime_close(rt);
    return text;
}

int main(void) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/models/demo", test_source_dir());
    char *want = engine_text(dir);

    mlxcel_options o = mlxcel_options_default();
    o.device = "cpu";
    o.n_threads = 2;
    o.ctx_size = 256;
    mlxcel_engine *e = NULL;
    char err[512] = "";
    CHECK_MSG(mlxcel_open(dir, &o, &e, err, sizeof err) == 0, "%s", err);
    mlxcel_request r = mlxcel_request_default();
    r.prompt = PROMPT;
    r.max_tokens = MAX_NEW;
    r.temperature = 0;
    char *got = NULL;
    if (e) CHECK_MSG(mlxcel_generate(e, &r, &got, err, sizeof err) == 0, "%s", err);
    CHECK_MSG(want && got && strcmp(got, want) == 0, "api '%s' vs engine '%s'", got ? got : "",
              want ? want : "");
    CHECK(want && strlen(want) > 0);
    mlxcel_free(got);
    free(want);
    mlxcel_close(e);
    TEST_MAIN_END();
}
