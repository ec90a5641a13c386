/* The model commands through the binary: `logits` writes transformers' logits, `generate
 * --json` ends with transformers' greedy tokens, and bad input gets one "mlxcel: error:" line
 * with exit status 2 (usage) or 1 (everything else). */
#include "test.h"

#include "io/io.h"

#include <jansson.h>
#include <math.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Runs `mlxcel <args>`; returns its exit status, stdout in out and stderr in err_out. */
static int run(const char *args, char *out, size_t size, char *err_out, size_t err_size) {
    char cmd[8192], err_path[64];
    snprintf(err_path, sizeof err_path, "/tmp/mlxcel-cli-stderr-%d", (int)getpid());
    snprintf(cmd, sizeof cmd, "%s/mlxcel %s 2>%s", getenv("MLXCEL_BIN_DIR"), args, err_path);
    FILE *p = popen(cmd, "r");
    size_t n = p ? fread(out, 1, size - 1, p) : 0;
    out[n] = 0;
    int status = p ? pclose(p) : -1;
    FILE *e = fopen(err_path, "r");
    n = e ? fread(err_out, 1, err_size - 1, e) : 0;
    err_out[n] = 0;
    if (e) fclose(e);
    remove(err_path);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static char *ids_text(json_t *arr) {
    size_t cap = json_array_size(arr) * 12 + 1, n = 0;
    char *s = malloc(cap);
    s[0] = 0;
    for (size_t i = 0; i < json_array_size(arr); i++)
        n += (size_t)snprintf(s + n, cap - n, i ? ",%lld" : "%lld",
                              (long long)json_integer_value(json_array_get(arr, i)));
    return s;
}

/* The last line of text. */
static const char *last_line(char *text) {
    size_t n = strlen(text);
    while (n && text[n - 1] == '\n') text[--n] = 0;
    char *nl = strrchr(text, '\n');
    return nl ? nl + 1 : text;
}

int main(void) {
    char fx[1024], args[8192], out[65536], err[4096];
    snprintf(fx, sizeof fx, "%s/tests/fixtures/llama_q4_g64", test_source_dir());
    char *ref_path = base_path_join(fx, "reference.json");
    json_t *ref = json_load_file(ref_path, 0, NULL);
    free(ref_path);
    CHECK(ref != NULL);
    if (!ref) TEST_MAIN_END();
    char *prompt = ids_text(json_object_get(ref, "tokens"));
    char *greedy = ids_text(json_object_get(ref, "greedy"));
    int n_greedy = (int)json_array_size(json_object_get(ref, "greedy"));

    /* logits of every position against transformers' */
    snprintf(args, sizeof args, "logits -m %s --tokens %s -o /tmp/mlxcel-cli-logits.npy -t 2", fx,
             prompt);
    CHECK_MSG(run(args, out, sizeof out, err, sizeof err) == 0, "logits: %s", err);
    float *got = NULL, *want = NULL;
    int64_t gs[8], ws[8];
    int gd = 0, wd = 0;
    base_err e;
    char *want_path = base_path_join(fx, "logits.npy");
    CHECK(io_npy_read_f32("/tmp/mlxcel-cli-logits.npy", &got, gs, &gd, &e) == 0);
    CHECK(io_npy_read_f32(want_path, &want, ws, &wd, &e) == 0);
    free(want_path);
    if (got && want) {
        CHECK(gd == 2 && wd == 2 && gs[0] == ws[0] && gs[1] == ws[1]);
        double rel = test_rel_err(got, want, (size_t)(ws[0] * ws[1]));
        printf("  logits: %lld x %lld, relative error %.2e\n", (long long)ws[0], (long long)ws[1],
               rel);
        CHECK(rel < 1e-3);
    }
    free(got);
    free(want);

    /* greedy generation: the last stdout line is one JSON object whose tokens are transformers' */
    snprintf(args, sizeof args, "generate -m %s --tokens %s -n %d --temp 0 --json -t 2", fx, prompt,
             n_greedy);
    CHECK_MSG(run(args, out, sizeof out, err, sizeof err) == 0, "generate: %s", err);
    json_t *res = json_loads(last_line(out), 0, NULL);
    CHECK_MSG(res != NULL, "generate --json: last line is not JSON: %s", out);
    if (res) {
        char *toks = ids_text(json_object_get(res, "tokens"));
        CHECK_MSG(strcmp(toks, greedy) == 0, "generate: %s, want %s", toks, greedy);
        free(toks);
        json_decref(res);
    }

    /* usage errors: exit 2, one line naming the flag */
    static const struct {
        const char *args, *needle;
        int status;
    } bad[] = {
        {"generate --tokens 1,2", "-m", 2},
        {"generate -m . --tokens 1,x", "--tokens", 2},
        {"generate -m . --tokens 1 --temp abc", "--temp", 2},
        {"generate -m . --tokens 1 --bogus", "--bogus", 2},
        {"logits -m . --tokens 1", "-o", 2},
        {"frobnicate", "frobnicate", 2},
        {"generate -m /nonexistent/model --tokens 1", "/nonexistent/model", 1},
        {"logits -m FIXTURE --tokens 1,99999 -o /tmp/mlxcel-cli-x.npy", "99999", 1},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char a[2048];
        const char *fixture = strstr(bad[i].args, "FIXTURE");
        if (fixture)
            snprintf(a, sizeof a, "%.*s%s%s", (int)(fixture - bad[i].args), bad[i].args, fx,
                     fixture + 7);
        else
            snprintf(a, sizeof a, "%s", bad[i].args);
        int status = run(a, out, sizeof out, err, sizeof err);
        bool one_line = strncmp(err, "mlxcel: error: ", 15) == 0 && strchr(err, '\n') &&
                        strchr(err, '\n')[1] == 0;
        CHECK_MSG(status == bad[i].status && one_line && strstr(err, bad[i].needle),
                  "mlxcel %s: status %d, stderr '%s'", a, status, err);
    }
    /* inspect: the budget buys floor((budget - reserve) / bytes per block) blocks */
    snprintf(
        args, sizeof args,
        "inspect -m %s/models/demo -c 512 -np 2 --kv-cache-budget 10000000 --json --device cpu",
        test_source_dir());
    CHECK_MSG(run(args, out, sizeof out, err, sizeof err) == 0, "inspect: %s", err);
    json_t *plan = json_loads(out, 0, NULL);
    CHECK_MSG(plan != NULL, "inspect --json: %s", out);
    if (plan) {
        static const char *keys[] = {"weights_bytes", "kv_block_size", "kv_bytes_per_block",
                                     "decode_workspace_reserve_bytes", "kv_blocks"};
        for (size_t i = 0; i < 5; i++) CHECK_MSG(json_object_get(plan, keys[i]), "%s", keys[i]);
        long long bpb = json_integer_value(json_object_get(plan, "kv_bytes_per_block"));
        long long reserve =
            json_integer_value(json_object_get(plan, "decode_workspace_reserve_bytes"));
        long long blocks = json_integer_value(json_object_get(plan, "kv_blocks"));
        CHECK(bpb > 0 && blocks == (10000000 - reserve) / bpb);
        json_decref(plan);
    }
    /* bench -d: each sequence's prompt goes into its cache before the timed steps. A budget of
     * one 300-token context (11 blocks of 32) holds four sequences of 5 tokens, not of 205. */
    for (int depth = 0; depth <= 200; depth += 200) {
        snprintf(args, sizeof args,
                 "bench -m %s/models/demo -p 0 -n 4 -d %d -c 300 -b 4 --kv-cache-budget 2200000 "
                 "-r 1 --json --device cpu",
                 test_source_dir(), depth);
        int status = run(args, out, sizeof out, err, sizeof err);
        if (depth == 0) {
            json_t *row = json_loads(out, 0, NULL);
            CHECK_MSG(status == 0 && row &&
                          !strcmp(json_string_value(json_object_get(row, "test")), "tg4"),
                      "bench -d 0: %d %s %s", status, out, err);
            json_decref(row);
        } else {
            CHECK_MSG(status == 1 && strstr(err, "kv cache full"), "bench -d 200: %d %s", status,
                      err);
        }
    }
    snprintf(args, sizeof args,
             "bench -m %s/models/demo -p 0 -n 4 -d 100 -b 2 -r 1 --json --device cpu",
             test_source_dir());
    CHECK_MSG(run(args, out, sizeof out, err, sizeof err) == 0 && strstr(out, "\"tg4@d100\"") &&
                  strstr(out, "\"n_depth\":100"),
              "bench -d 100: %s %s", out, err);
    /* bytes read: the weights once a step, K and V of both sequences at each timed step's
     * context (100 + 1 + i for i = 1..4, a mean of 103.5), in the header's units */
    json_t *row = json_loads(out, 0, NULL);
    snprintf(args, sizeof args, "bench -m %s/models/demo -p 0 -n 1 -r 1 --device cpu",
             test_source_dir());
    unsigned long long step = 0, per_tok = 0;
    const char *hdr =
        run(args, out, sizeof out, err, sizeof err) == 0 ? strstr(out, "bytes, ") : NULL;
    CHECK_MSG(hdr &&
                  sscanf(hdr, "bytes, %llu read per decode step, plus %llu", &step, &per_tok) == 2,
              "bench header: %s", out);
    double w = json_real_value(json_object_get(row, "weight_gb_per_s"));
    double kv = json_real_value(json_object_get(row, "kv_gb_per_s"));
    double kv_want = 2.0 * (double)per_tok * 103.5 / (double)step;
    CHECK_MSG(w > 0 && per_tok > 0 && fabs(kv / w - kv_want) < 1e-9 * kv_want,
              "kv/weights %g, want %g", kv / w, kv_want);
    json_decref(row);
    snprintf(args, sizeof args, "bench -m %s/models/demo -p 0 -n 8 -d 32 -c 40", test_source_dir());
    CHECK_MSG(run(args, out, sizeof out, err, sizeof err) == 2 && strstr(err, "-d 32") &&
                  strstr(err, "-c is 40"),
              "bench -d past -c: %s", err);
    /* a budget that cannot hold one full-context sequence is refused, naming both numbers */
    snprintf(args, sizeof args, "inspect -m %s/models/demo -c 512 --kv-cache-budget 1000",
             test_source_dir());
    CHECK_MSG(run(args, out, sizeof out, err, sizeof err) == 1 && strstr(err, "1000 bytes") &&
                  strstr(err, "needs"),
              "inspect small budget: %s", err);

    free(prompt);
    free(greedy);
    json_decref(ref);
    TEST_MAIN_END();
}
