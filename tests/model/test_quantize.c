/* mlxcel's quantizer against the fixtures' MLX-layout checkpoints, which
 * tools/reference/make_fixtures.py wrote from the same bf16 weights with a line-by-line
 * translation of MLX's CPU quantize kernel: every tensor must be byte for byte the same. */
#include "model/arch/arch.h"
#include "test.h"

#include "io/io.h"
#include "model/model.h"

#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void compare_checkpoints(const char *got_dir, const char *want_dir, const char *label) {
    io_checkpoint *got, *want;
    base_err err;
    int rc = io_checkpoint_open_dir(got_dir, &got, &err);
    CHECK_MSG(rc == 0, "%s: %s", label, err.msg);
    if (rc) return;
    rc = io_checkpoint_open_dir(want_dir, &want, &err);
    CHECK_MSG(rc == 0, "%s: %s", label, err.msg);
    if (rc) {
        io_checkpoint_close(got);
        return;
    }
    CHECK_MSG(io_checkpoint_count(got) == io_checkpoint_count(want), "%s: %zu tensors, want %zu",
              label, io_checkpoint_count(got), io_checkpoint_count(want));
    size_t differing = 0;
    for (size_t i = 0; i < io_checkpoint_count(want); i++) {
        const io_tensor *w = io_checkpoint_at(want, i);
        const io_tensor *g = io_checkpoint_find(got, w->name);
        bool same = g && g->dtype == w->dtype && g->ndim == w->ndim &&
                    memcmp(g->shape, w->shape, sizeof g->shape) == 0 && g->nbytes == w->nbytes &&
                    memcmp(g->data, w->data, w->nbytes) == 0;
        if (!same && differing++ < 3) fprintf(stderr, "%s: tensor %s differs\n", label, w->name);
    }
    CHECK_MSG(differing == 0, "%s: %zu tensors differ", label, differing);
    io_model_config a, b;
    if (model_config_load(got_dir, &a, NULL, &err) == 0) {
        if (model_config_load(want_dir, &b, NULL, &err) == 0) {
            CHECK(a.quant.bits == b.quant.bits && a.quant.group_size == b.quant.group_size);
            io_config_free(&b);
        }
        io_config_free(&a);
    } else {
        CHECK_MSG(0, "%s: %s", label, err.msg);
    }
    io_checkpoint_close(got);
    io_checkpoint_close(want);
}

int main(void) {
    static const struct {
        const char *fixture;
        int bits, group;
    } cases[] = {{"llama_q2_g32", 2, 32}, {"llama_q3_g64", 3, 64}, {"llama_q4_g64", 4, 64},
                 {"llama_q5_g64", 5, 64}, {"llama_q6_g32", 6, 32}, {"llama_q8_g32", 8, 32}};
    char src[1024], want[1024], tmpl[] = "/tmp/mlxcel-quantize-XXXXXX";
    snprintf(src, sizeof src, "%s/tests/fixtures/llama_bf16", test_source_dir());
    CHECK(mkdtemp(tmpl) != NULL);
    base_err err;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char out[1100];
        snprintf(out, sizeof out, "%s/%s", tmpl, cases[i].fixture);
        mkdir(out, 0755);
        snprintf(want, sizeof want, "%s/tests/fixtures/%s", test_source_dir(), cases[i].fixture);
        int rc = model_quantize(src, out, cases[i].bits, cases[i].group, &err);
        CHECK_MSG(rc == 0, "%s: %s", cases[i].fixture, err.msg);
        if (rc == 0) compare_checkpoints(out, want, cases[i].fixture);
        printf("  quantize llama_bf16 -> %d-bit g%d: %s\n", cases[i].bits, cases[i].group,
               rc == 0 ? "compared" : err.msg);
    }
    /* inputs the quantizer must refuse, with a message naming the problem */
    char out[1100];
    snprintf(out, sizeof out, "%s/refused", tmpl);
    mkdir(out, 0755);
    CHECK(model_quantize(want, out, 4, 64, &err) == -1 && strstr(err.msg, "already quantized"));
    CHECK(model_quantize(src, out, 7, 64, &err) == -1 && strstr(err.msg, "--bits"));
    CHECK(model_quantize(src, out, 4, 48, &err) == -1 && strstr(err.msg, "--group-size"));
    CHECK(model_quantize(src, "/nonexistent/dir", 4, 64, &err) == -1 &&
          strstr(err.msg, "/nonexistent/dir"));
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpl);
    CHECK(system(cmd) == 0);
    TEST_MAIN_END();
}
