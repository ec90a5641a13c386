/* The ids that end a chat answer (server_extra_eos): with GPT-OSS's tokenizer (from tests/node,
 * tools/install-deps.sh) and a Harmony template, <|return|> and <|call|> end it even where no
 * generation_config.json says so, and a template of another format adds neither. */
#include "engine/engine_test_harmony.h"
#include "server/server.h"

#include <string.h>

static bool has(const int32_t *ids, int n, int32_t id) {
    for (int i = 0; i < n; i++)
        if (ids[i] == id) return true;
    return false;
}

int main(void) {
    char dir[1024];
    engine_prompter *p = test_open_harmony(dir, sizeof dir);
    if (!p) TEST_MAIN_END();
    base_err err = {0};
    int32_t *ids = NULL;
    int n = 0;
    server_extra_eos(dir, p, &ids, &n);
    CHECK_MSG(has(ids, n, 200002) && has(ids, n, 200012), "harmony: %d ids", n);
    free(ids);
    CHECK(engine_prompter_set_template(p, "{{ '<tool_call>' }}", &err) == 0);
    server_extra_eos(dir, p, &ids, &n);
    CHECK_MSG(!has(ids, n, 200012), "hermes: %d ids", n);
    free(ids);
    engine_prompter_close(p);
    TEST_MAIN_END();
}
