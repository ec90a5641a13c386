/* `mlxcel template`: the variables it passes, exact output bytes, and exit statuses. */
#include "base/base.h"
#include "test.h"
#include "test_file.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_dir[64];

/* Runs `mlxcel template <args> <redirect>` in g_dir; returns the exit status, what the
 * redirection leaves on stdout in out. */
static int run_redirected(const char *args, const char *redirect, char *out, size_t size) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "cd %s && %s/mlxcel template %s %s", g_dir, getenv("MLXCEL_BIN_DIR"),
             args, redirect);
    FILE *p = popen(cmd, "r");
    size_t n = p ? fread(out, 1, size - 1, p) : 0;
    out[n] = 0;
    int status = p ? pclose(p) : -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Its stdout in out. */
static int run(const char *args, char *out, size_t size) {
    return run_redirected(args, "2>/dev/null", out, size);
}

/* Its stderr in out. */
static int run_stderr(const char *args, char *out, size_t size) {
    return run_redirected(args, "2>&1 >/dev/null", out, size);
}

/* A model folder `deep` whose tokenizer_config.json holds a template of 20,000 nested ifs, as
 * a hostile download may: the command fails with the position, it does not crash. */
static void test_deep_template(void) {
    char *dir = base_path_join(g_dir, "deep");
    CHECK(mkdir(dir, 0755) == 0);
    free(dir);
    static const char head[] = "{\"chat_template\": \"";
    size_t size = sizeof head + 20000 * 21 + 8;
    char *cfg = malloc(size), *p = stpcpy(cfg, head);
    for (int i = 0; i < 20000; i++) p = stpcpy(p, "{% if 1 %}");
    for (int i = 0; i < 20000; i++) p = stpcpy(p, "{% endif %}");
    strcpy(p, "\"}");
    test_write_file(g_dir, "deep/tokenizer_config.json", cfg);
    free(cfg);
    char err[4096];
    CHECK(run_stderr("-m deep --messages chat.json", err, sizeof err) == 1);
    CHECK_MSG(strstr(err, "mlxcel: error: ") == err && strstr(err, "deep") &&
                  strstr(err, "template line 1, column 1001: blocks nested deeper than 100"),
              "got [%s]", err);
}

int main(void) {
    char cwd[512];
    CHECK(getcwd(cwd, sizeof cwd) != NULL);
    strcpy(g_dir, "/tmp/mlxcel-template-XXXXXX");
    CHECK(mkdtemp(g_dir) != NULL);
    /* The commands run inside g_dir, so the binary's folder must be absolute. */
    const char *bin = getenv("MLXCEL_BIN_DIR");
    if (!bin) bin = "build/bin";
    if (bin[0] != '/') {
        char abs_bin[1024];
        snprintf(abs_bin, sizeof abs_bin, "%s/%s", cwd, bin);
        setenv("MLXCEL_BIN_DIR", abs_bin, 1);
    }
    test_write_file(
        g_dir, "tokenizer_config.json",
        "{\"bos_token\": {\"content\": \"<s>\"}, \"eos_token\": \"</s>\", \"pad_token\": "
        "null, \"chat_template\": \"{{ bos_token }}{% for m in messages %}[{{ m.role }}:"
        "{{ m.content }}]{% endfor %}{% if tools is none %}T0{% endif %}{% for t in tools or [] "
        "%}T{{ t.name }}{% endfor %}{% if pad_token is defined %}P{% endif %}"
        "{% if add_generation_prompt %}>{% endif %}{{ extra }}\\n\"}");
    test_write_file(g_dir, "tokenizer.json", "{}");
    test_write_file(g_dir, "chat.json", "[{\"role\": \"user\", \"content\": \"hi\"}]");
    test_write_file(g_dir, "obj.json",
                    "{\"messages\": [{\"role\": \"user\", \"content\": \"é\"}], "
                    "\"tools\": [{\"name\": \"f\"}], \"extra\": \"X\"}");
    test_write_file(g_dir, "other.jinja", "{{ eos_token }}{{ messages | length }}");
    test_write_file(g_dir, "bad.json", "{\"messages\": 3}");

    char out[4096];
    /* The template ends in "\n"; the single trailing newline is dropped as Jinja does, and
     * nothing is added after the prompt. */
    CHECK(run("-m . --messages chat.json", out, sizeof out) == 0);
    CHECK_MSG(strcmp(out, "<s>[user:hi]T0>") == 0, "got [%s]", out);
    CHECK(run("-m . --messages chat.json --no-generation-prompt", out, sizeof out) == 0);
    CHECK_MSG(strcmp(out, "<s>[user:hi]T0") == 0, "got [%s]", out);
    CHECK(run("-m . --messages obj.json", out, sizeof out) == 0);
    CHECK_MSG(strcmp(out, "<s>[user:é]Tf>X") == 0, "got [%s]", out);
    CHECK(run("-m . --messages obj.json --kwargs '{\"extra\": \"K\", \"bos_token\": \"\"}'", out,
              sizeof out) == 0);
    CHECK_MSG(strcmp(out, "[user:é]Tf>K") == 0, "got [%s]", out);
    CHECK(run("-m . --messages chat.json --chat-template-file other.jinja", out, sizeof out) == 0);
    CHECK_MSG(strcmp(out, "</s>1") == 0, "got [%s]", out);
    CHECK(run("--help", out, sizeof out) == 0 && strstr(out, "example:"));

    CHECK(run("--messages chat.json", out, sizeof out) == 2);
    CHECK(run("-m .", out, sizeof out) == 2);
    CHECK(run("-m . --messages chat.json --bogus", out, sizeof out) == 2);
    CHECK(run("-m . --messages chat.json --kwargs '[1]'", out, sizeof out) == 2);
    CHECK(run("-m . --messages chat.json --kwargs", out, sizeof out) == 2);
    CHECK(run("-m nowhere --messages chat.json", out, sizeof out) == 1);
    CHECK(run("-m . --messages missing.json", out, sizeof out) == 1);
    CHECK(run("-m . --messages bad.json", out, sizeof out) == 1);
    CHECK(run("-m . --messages chat.json --chat-template-file missing.jinja", out, sizeof out) ==
          1);
    test_deep_template();
    test_write_file(g_dir, "broken.jinja", "{% if %}");
    CHECK(run("-m . --messages chat.json --chat-template-file broken.jinja", out, sizeof out) == 1);

    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    CHECK(system(cmd) == 0);
    TEST_MAIN_END();
}
