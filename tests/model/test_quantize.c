/* mlxcel's quantizer against checkpoints that tools/reference wrote from the same bf16 weights:
 * affine with a line-by-line translation of MLX's CPU quantize kernel (make_fixtures.py; the
 * MoE one with its 8-bit routers, make_moe_fixtures.py), MXFP4 with one of MLX's GPU kernel
 * (make_moe_fixtures.py's gpt_oss_mxfp4): every tensor must be byte for byte the same, and
 * config.json's quantization say the same per module. Then MXFP4 copies must load and give
 * logits about as near the bf16 model's as affine 4-bit copies do. */
#include "fixture_ref.h"
#include "model/arch/arch.h"
#include "test.h"

#include "engine/engine_test_runtime.h"
#include "io/io.h"
#include "model/model.h"

#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void compare_tensors(io_checkpoint *got, io_checkpoint *want, const char *label) {
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
}

static bool same_spec(io_quant_spec a, io_quant_spec b) {
    return a.bits == b.bits && a.group_size == b.group_size && (a.bits == 0 || a.mode == b.mode);
}

/* The default spec and every per-module entry of want's quantization, in got's. */
static void compare_quant(const char *got_dir, const char *want_dir, const char *label) {
    io_model_config a, b;
    base_err err;
    if (model_config_load(got_dir, &a, NULL, &err)) {
        CHECK_MSG(0, "%s: %s", label, err.msg);
        return;
    }
    if (model_config_load(want_dir, &b, NULL, &err) == 0) {
        CHECK_MSG(same_spec(a.quant, b.quant), "%s: default quantization differs", label);
        CHECK_MSG(a.n_quant_overrides == b.n_quant_overrides, "%s: %d per-module entries, want %d",
                  label, a.n_quant_overrides, b.n_quant_overrides);
        for (int i = 0; i < b.n_quant_overrides; i++) {
            const char *mod = b.quant_overrides[i].module;
            CHECK_MSG(same_spec(io_config_quant_for(&a, mod), b.quant_overrides[i].spec),
                      "%s: module %s quantized otherwise", label, mod);
        }
        io_config_free(&b);
    } else {
        CHECK_MSG(0, "%s: %s", label, err.msg);
    }
    io_config_free(&a);
}

static void compare_checkpoints(const char *got_dir, const char *want_dir, const char *label) {
    io_checkpoint *got, *want;
    base_err err;
    int rc = io_checkpoint_open_dir(got_dir, &got, &err);
    CHECK_MSG(rc == 0, "%s: %s", label, err.msg);
    if (rc) return;
    rc = io_checkpoint_open_dir(want_dir, &want, &err);
    CHECK_MSG(rc == 0, "%s: %s", label, err.msg);
    if (rc == 0) {
        compare_tensors(got, want, label);
        io_checkpoint_close(want);
    }
    io_checkpoint_close(got);
    compare_quant(got_dir, want_dir, label);
}

/* The relative error of the logits of quantized (a checkpoint) on bf16_fixture's prompt against
 * transformers' logits of the bf16 model there; -1 when it does not load or run. */
static double logits_error(const char *quantized, const fixture_ref *ref) {
    engine_options o = test_cpu_options(ref->n_tokens + 1, 1, 32);
    engine_runtime *rt;
    base_err err;
    double e = -1;
    int rc = engine_runtime_open(quantized, &o, &rt, &err);
    CHECK_MSG(rc == 0, "%s: %s", quantized, err.msg);
    if (rc) return e;
    float *got;
    rc = engine_prefill_logits(rt, ref->tokens, ref->n_tokens, &got, NULL, &err);
    CHECK_MSG(rc == 0, "%s: %s", quantized, err.msg);
    if (rc == 0) {
        e = test_rel_err(got, ref->logits, (size_t)ref->n_tokens * (size_t)ref->vocab);
        free(got);
    }
    engine_runtime_close(rt);
    return e;
}

/* Round trip: the MXFP4 copy of a bf16 fixture loads, and its logits stay as near the bf16
 * model's as those of the affine 4-bit, group 32 copy, give or take: both formats spend 4 bits
 * and a scale per 32 values (MXFP4 has no bias and a power-of-two scale, so it loses some). On
 * these fixtures, whose logits are large and sensitive, affine moves them by 30-50% and MXFP4
 * by 1.2-1.4 times that; a wrong scale exponent or code table moves them by far more. */
static void check_round_trip(const char *tmp, const char *name) {
    char src[1024], out[2][1200];
    snprintf(src, sizeof src, "%s/tests/fixtures/%s", test_source_dir(), name);
    fixture_ref ref;
    base_err err;
    if (fixture_ref_load(src, &ref, &err)) {
        CHECK_MSG(0, "%s", err.msg);
        return;
    }
    double e[2] = {-1, -1};
    for (int k = 0; k < 2; k++) {
        snprintf(out[k], sizeof out[k], "%s/round_trip_%s_%s", tmp, name, k ? "mxfp4" : "q4_g32");
        mkdir(out[k], 0755);
        io_quant_spec spec = {4, 32, k ? IO_QUANT_MXFP4 : IO_QUANT_AFFINE};
        int rc = model_quantize(src, out[k], spec, &err);
        CHECK_MSG(rc == 0, "%s: %s", out[k], err.msg);
        if (rc == 0) e[k] = logits_error(out[k], &ref);
    }
    printf("  round trip %s: logits rel err against bf16: affine 4-bit g32 %.3f, mxfp4 %.3f\n",
           name, e[0], e[1]);
    CHECK_MSG(e[0] >= 0 && e[1] >= 0 && e[1] < 1.75 * e[0],
              "round trip %s: mxfp4 rel err %.3f, affine %.3f", name, e[1], e[0]);
    fixture_ref_free(&ref);
}

/* A MoE checkpoint whose experts are in a Hugging Face layout (per-expert tensors, GPT-OSS's
 * fused gate_up_proj) but not of the shapes its config gives is refused, naming the tensor,
 * before anything is written (test_hf_experts quantizes well-formed ones). fixture's
 * config.json, one such tensor. */
static void check_unstacked_refused(const char *tmp, const char *fixture, const char *tensor) {
    char dir[1200], out[1300], cmd[2600];
    snprintf(dir, sizeof dir, "%s/unstacked_%s", tmp, fixture);
    snprintf(out, sizeof out, "%s/out", dir);
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s/tests/fixtures/%s/config.json %s/", out,
             test_source_dir(), fixture, dir);
    CHECK(system(cmd) == 0);
    static const uint16_t w[4 * 64] = {0};
    io_tensor_out t = {tensor, BASE_DTYPE_BF16, 3, {1, 4, 64}, w};
    char path[1400];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    base_err err;
    CHECK_MSG(io_safetensors_write(path, &t, 1, NULL, 0, &err) == 0, "%s", err.msg);
    int rc = model_quantize(dir, out, (io_quant_spec){4, 64, IO_QUANT_AFFINE}, &err);
    CHECK_MSG(rc == -1 && strstr(err.msg, tensor) && strstr(err.msg, "shape"), "%s: %s", fixture,
              rc ? err.msg : "accepted");
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    CHECK(!base_file_exists(path));
}

int main(void) {
    static const struct {
        const char *src, *fixture;
        io_quant_spec spec;
    } cases[] = {
        {"llama_bf16", "llama_q2_g32", {2, 32, IO_QUANT_AFFINE}},
        {"llama_bf16", "llama_q3_g64", {3, 64, IO_QUANT_AFFINE}},
        {"llama_bf16", "llama_q4_g64", {4, 64, IO_QUANT_AFFINE}},
        {"llama_bf16", "llama_q5_g64", {5, 64, IO_QUANT_AFFINE}},
        {"llama_bf16", "llama_q6_g32", {6, 32, IO_QUANT_AFFINE}},
        {"llama_bf16", "llama_q8_g32", {8, 32, IO_QUANT_AFFINE}},
        /* stacked experts quantized along their last axis, the routers at 8 bits */
        {"qwen3_moe_bf16", "qwen3_moe_q4_g64", {4, 64, IO_QUANT_AFFINE}},
        {"gpt_oss_bf16", "gpt_oss_mxfp4", {4, 32, IO_QUANT_MXFP4}},
    };
    char src[1024], want[1024], tmpl[] = "/tmp/mlxcel-quantize-XXXXXX";
    CHECK(mkdtemp(tmpl) != NULL);
    base_err err;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char out[1100];
        snprintf(out, sizeof out, "%s/%s", tmpl, cases[i].fixture);
        mkdir(out, 0755);
        snprintf(src, sizeof src, "%s/tests/fixtures/%s", test_source_dir(), cases[i].src);
        snprintf(want, sizeof want, "%s/tests/fixtures/%s", test_source_dir(), cases[i].fixture);
        int rc = model_quantize(src, out, cases[i].spec, &err);
        CHECK_MSG(rc == 0, "%s: %s", cases[i].fixture, err.msg);
        if (rc == 0) compare_checkpoints(out, want, cases[i].fixture);
        printf("  quantize %s -> %s: %s\n", cases[i].src, cases[i].fixture,
               rc == 0 ? "compared" : err.msg);
    }
    check_round_trip(tmpl, "llama_bf16");
    check_round_trip(tmpl, "gpt_oss_bf16");

    /* inputs the quantizer must refuse, with a message naming the problem */
    char out[1100];
    snprintf(src, sizeof src, "%s/tests/fixtures/llama_bf16", test_source_dir());
    snprintf(want, sizeof want, "%s/tests/fixtures/llama_q4_g64", test_source_dir());
    snprintf(out, sizeof out, "%s/refused", tmpl);
    mkdir(out, 0755);
    io_quant_spec q4 = {4, 64, IO_QUANT_AFFINE};
    CHECK(model_quantize(want, out, q4, &err) == -1 && strstr(err.msg, "already quantized"));
    CHECK(model_quantize(src, out, (io_quant_spec){7, 64, IO_QUANT_AFFINE}, &err) == -1 &&
          strstr(err.msg, "--bits"));
    CHECK(model_quantize(src, out, (io_quant_spec){4, 48, IO_QUANT_AFFINE}, &err) == -1 &&
          strstr(err.msg, "--group-size"));
    CHECK(model_quantize(src, out, (io_quant_spec){8, 32, IO_QUANT_MXFP4}, &err) == -1 &&
          strstr(err.msg, "--bits") && strstr(err.msg, "mxfp4"));
    CHECK(model_quantize(src, out, (io_quant_spec){4, 64, IO_QUANT_MXFP4}, &err) == -1 &&
          strstr(err.msg, "--group-size") && strstr(err.msg, "mxfp4"));
    CHECK(model_quantize(src, "/nonexistent/dir", q4, &err) == -1 &&
          strstr(err.msg, "/nonexistent/dir"));
    check_unstacked_refused(tmpl, "qwen3_moe_bf16",
                            "model.layers.0.mlp.experts.0.gate_proj.weight");
    check_unstacked_refused(tmpl, "gpt_oss_bf16", "model.layers.0.mlp.experts.gate_up_proj");
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpl);
    CHECK(system(cmd) == 0);
    TEST_MAIN_END();
}
