/* `mlxcel tokenize` and `mlxcel detokenize` as a user runs them: output, exit status, and the
 * one-line error. */
#include "tok_test.h"

#include <sys/wait.h>
#include <unistd.h>

static char g_out[4096], g_err[4096];

/* Runs `mlxcel ARGS` through the shell with stdin from `input`; returns the exit status and
 * leaves stdout and stderr in g_out and g_err. */
static int run(const char *args, const char *input) {
    const char *bin = getenv("MLXCEL_BIN_DIR");
    char files[2][64], cmd[2048];
    snprintf(files[0], sizeof files[0], "/tmp/mlxcel_tok_cli_%d.out", (int)getpid());
    snprintf(files[1], sizeof files[1], "/tmp/mlxcel_tok_cli_%d.err", (int)getpid());
    snprintf(cmd, sizeof cmd, "printf '%%s' '%s' | %s/mlxcel %s >%s 2>%s", input,
             bin ? bin : "build/bin", args, files[0], files[1]);
    int st = system(cmd);
    char *bufs[2] = {g_out, g_err};
    for (int i = 0; i < 2; i++) {
        FILE *f = fopen(files[i], "rb");
        size_t n = f ? fread(bufs[i], 1, sizeof g_out - 1, f) : 0;
        bufs[i][n] = 0;
        if (f) fclose(f);
        remove(files[i]);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* One line "mlxcel: error: ..." that mentions `what`. */
static bool one_error_line(const char *what) {
    size_t n = strlen(g_err);
    return strncmp(g_err, "mlxcel: error: ", 15) == 0 && n > 0 && g_err[n - 1] == '\n' &&
           strchr(g_err, '\n') == g_err + n - 1 && strstr(g_err, what) != NULL;
}

int main(void) {
    char m[1024];
    snprintf(m, sizeof m, "-m %s/tests/tokenizer/fixtures/sp_tiny", test_source_dir());
    char args[1200];

    snprintf(args, sizeof args, "tokenize %s", m);
    CHECK(run(args, "hi abc") == 0 && strcmp(g_out, "[1,266,259,269]\n") == 0);
    snprintf(args, sizeof args, "tokenize %s --no-special", m);
    CHECK(run(args, "hi abc") == 0 && strcmp(g_out, "[266,259,269]\n") == 0);
    CHECK(run(args, "") == 0 && strcmp(g_out, "[]\n") == 0);

    snprintf(args, sizeof args, "detokenize %s --tokens 1,266,259,269", m);
    CHECK(run(args, "") == 0 && strcmp(g_out, "<s> hi abc") == 0);
    snprintf(args, sizeof args, "detokenize %s --tokens=1,266 --skip-special", m);
    CHECK(run(args, "") == 0 && strcmp(g_out, "hi") == 0);

    CHECK(run("tokenize --help", "") == 0 && strstr(g_out, "example") != NULL);
    CHECK(run("detokenize --help", "") == 0 && strstr(g_out, "example") != NULL);

    /* Usage errors exit 2. */
    CHECK(run("tokenize", "x") == 2 && one_error_line("-m"));
    CHECK(run("tokenize -m", "x") == 2 && one_error_line("-m"));
    snprintf(args, sizeof args, "tokenize %s --bogus", m);
    CHECK(run(args, "x") == 2 && one_error_line("--bogus"));
    snprintf(args, sizeof args, "detokenize %s", m);
    CHECK(run(args, "") == 2 && one_error_line("--tokens"));
    snprintf(args, sizeof args, "detokenize %s --tokens 1,x", m);
    CHECK(run(args, "") == 2 && one_error_line("--tokens"));

    /* Other errors exit 1. */
    CHECK(run("tokenize -m /nonexistent", "x") == 1 &&
          one_error_line("/nonexistent/tokenizer.json"));
    snprintf(args, sizeof args, "detokenize %s --tokens 5000", m);
    CHECK(run(args, "") == 1 && one_error_line("5000"));
    snprintf(args, sizeof args, "tokenize %s", m);
    CHECK(run(args, "ab\xff") == 1 && one_error_line("UTF-8"));
    TEST_MAIN_END();
}
