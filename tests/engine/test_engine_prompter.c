/* The prompter's tokenizer is held to the model's vocabulary: its config.json's vocab_size
 * bounds the ids (a model padded past its tokenizer loads; a tokenizer past its model does
 * not), and a folder without config.json loads the tokenizer alone. */
#include "engine/engine.h"
#include "test.h"
#include "test_file.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_dir[64];

/* models/demo's config.json with vocab_size replaced. */
static void write_config(const char *demo_config, int vocab_size) {
    const char *at = strstr(demo_config, "\"vocab_size\": 32000");
    CHECK(at != NULL);
    if (!at) return;
    size_t n = strlen(demo_config) + 32;
    char *text = malloc(n);
    snprintf(text, n, "%.*s\"vocab_size\": %d%s", (int)(at - demo_config), demo_config, vocab_size,
             at + strlen("\"vocab_size\": 32000"));
    test_write_file(g_dir, "config.json", text);
    free(text);
}

/* Opens the prompter on g_dir; returns 0 or -1 with the message in err. */
static int open_prompter(base_err *err) {
    engine_prompter *p = NULL;
    int rc = engine_prompter_open(g_dir, NULL, &p, err);
    CHECK(rc == 0 ? p != NULL : p == NULL);
    engine_prompter_close(p);
    return rc;
}

int main(void) {
    strcpy(g_dir, "/tmp/mlxcel-prompter-XXXXXX");
    CHECK(mkdtemp(g_dir) != NULL);
    char *config_path = base_path_join(test_source_dir(), "models/demo/config.json");
    char *demo_config = NULL;
    base_err err;
    CHECK_MSG(base_read_file(config_path, &demo_config, NULL, &err) == 0, "%s", err.msg);
    free(config_path);
    if (!demo_config) TEST_MAIN_END();
    test_write_file(g_dir, "tokenizer_config.json",
                    "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}");
    /* Five ids: a, b, ab and the added <s> (3) and </s> (4). */
    test_write_file(g_dir, "tokenizer.json",
                    "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, "
                    "\"merges\": [\"a b\"]}, \"added_tokens\": [{\"id\": 3, \"content\": \"<s>\", "
                    "\"special\": true}, {\"id\": 4, \"content\": \"</s>\", \"special\": true}]}");

    int rc = open_prompter(&err);
    CHECK_MSG(rc == 0, "no config.json: %s", err.msg);
    write_config(demo_config, 5);
    rc = open_prompter(&err);
    CHECK_MSG(rc == 0, "vocab_size 5: %s", err.msg);
    write_config(demo_config, 32000);
    rc = open_prompter(&err);
    CHECK_MSG(rc == 0, "vocab_size 32000: %s", err.msg);
    write_config(demo_config, 4);
    CHECK(open_prompter(&err) == -1);
    CHECK_MSG(strstr(err.msg, "tokenizer.json: added_tokens[1] '</s>' has id 4, past the model's "
                              "vocab_size 4"),
              "got [%s]", err.msg);
    test_write_file(g_dir, "config.json", "{\"vocab_size\": 5}");
    CHECK(open_prompter(&err) == -1);
    CHECK_MSG(strstr(err.msg, "config.json"), "got [%s]", err.msg);

    free(demo_config);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    CHECK(system(cmd) == 0);
    TEST_MAIN_END();
}
