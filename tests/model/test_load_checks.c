/* Loading a checkpoint that disagrees with its config.json fails with an error naming the
 * tensor at fault (a size from the config, a wrong-shaped tensor, a missing shard), and
 * weights holding NaN or Inf load with a warning naming the tensor. Each case is the llama_f32
 * fixture with one thing changed. */
#include "io/io_test_util.h"
#include "model/model.h"

#include <fcntl.h>
#include <jansson.h>
#include <math.h>

static char g_fixture[4096];

/* Rewrites one tensor of the copy: may set a new shape and point data at *owned. */
typedef void (*tensor_edit)(io_tensor_out *t, void **owned);

/* Writes dir/config.json from the fixture's with one integer field set (key NULL: as is). */
static void write_config(const char *dir, const char *key, json_int_t value) {
    char *src = base_path_join(g_fixture, "config.json"), *dst = base_path_join(dir, "config.json");
    json_error_t je;
    json_t *cfg = json_load_file(src, 0, &je);
    if (!cfg) {
        fprintf(stderr, "%s: %s\n", src, je.text);
        exit(1);
    }
    if (key) json_object_set_new(cfg, key, json_integer(value));
    if (json_dump_file(cfg, dst, JSON_INDENT(1)) != 0) {
        perror(dst);
        exit(1);
    }
    json_decref(cfg);
    free(src);
    free(dst);
}

/* Copies the fixture's tensors into path, passing each through edit (may be NULL). */
static void write_weights(const char *path, tensor_edit edit) {
    char *src = base_path_join(g_fixture, "model.safetensors");
    io_checkpoint *ck;
    base_err err;
    if (io_checkpoint_open_file(src, &ck, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    size_t n = io_checkpoint_count(ck);
    io_tensor_out *outs = calloc(n, sizeof *outs);
    void **owned = calloc(n, sizeof *owned);
    for (size_t i = 0; i < n; i++) {
        const io_tensor *t = io_checkpoint_at(ck, i);
        outs[i] =
            (io_tensor_out){.name = t->name, .dtype = t->dtype, .ndim = t->ndim, .data = t->data};
        memcpy(outs[i].shape, t->shape, sizeof t->shape);
        if (edit) edit(&outs[i], &owned[i]);
    }
    if (io_safetensors_write(path, outs, n, NULL, 0, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    for (size_t i = 0; i < n; i++) free(owned[i]);
    free(owned);
    free(outs);
    io_checkpoint_close(ck);
    free(src);
}

/* Loads dir with stderr captured into log[log_size]; returns model_load's status. */
static int load_capture(const char *dir, base_err *err, char *log, size_t log_size) {
    be_backend *be;
    if (be_cpu_create(1, &be, err) != 0) return -1;
    char log_path[128];
    snprintf(log_path, sizeof log_path, "%s/stderr.log", dir);
    fflush(stderr);
    int saved = dup(2), fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    model *m = NULL;
    int rc = model_load(dir, be, NULL, NULL, &m, err);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);
    model_free(m);
    be->ops->destroy(be);
    char *text;
    size_t len;
    base_err rerr;
    log[0] = 0;
    if (base_read_file(log_path, &text, &len, &rerr) == 0) {
        snprintf(log, log_size, "%s", text);
        free(text);
    }
    unlink(log_path);
    return rc;
}

/* Loads dir and expects a failure whose message holds both strings. */
static void expect_error(const char *what, const char *dir, const char *want1, const char *want2) {
    base_err err = {{0}};
    char log[4096];
    int rc = load_capture(dir, &err, log, sizeof log);
    CHECK_MSG(rc != 0, "%s: loaded", what);
    CHECK_MSG(rc != 0 && strstr(err.msg, want1) && strstr(err.msg, want2),
              "%s: error '%s' does not name '%s' and '%s'", what, err.msg, want1, want2);
}

/* A fixture copy: the weights from write_weights (or the fixture's), a config with one field
 * changed. Caller removes the directory. */
static const char *make_copy(char *buf, const char *key, json_int_t value, tensor_edit edit) {
    iot_mkdtemp(buf);
    write_config(buf, key, value);
    char *dst = base_path_join(buf, "model.safetensors");
    write_weights(dst, edit);
    free(dst);
    return buf;
}

static void test_config_mismatches(void) {
    char dir[64];
    make_copy(dir, "hidden_size", 96, NULL);
    expect_error("hidden_size 96", dir, "model.embed_tokens.weight", "[256, 96]");
    iot_rm_tree(dir);

    make_copy(dir, "num_key_value_heads", 4, NULL);
    expect_error("num_key_value_heads 4", dir, "model.layers.0.self_attn.k_proj.weight",
                 "[128, 128]");
    iot_rm_tree(dir);

    make_copy(dir, "vocab_size", 300, NULL);
    expect_error("vocab_size 300", dir, "model.embed_tokens.weight", "[300, 128]");
    iot_rm_tree(dir);

    make_copy(dir, "intermediate_size", 512, NULL);
    expect_error("intermediate_size 512", dir, "model.layers.0.mlp.gate_proj.weight", "[512, 128]");
    iot_rm_tree(dir);
}

static void transpose_k0(io_tensor_out *t, void **owned) {
    if (strcmp(t->name, "model.layers.0.self_attn.k_proj.weight") != 0) return;
    int64_t r = t->shape[0];
    t->shape[0] = t->shape[1];
    t->shape[1] = r;
}

static void test_wrong_shape(void) {
    char dir[64];
    make_copy(dir, NULL, 0, transpose_k0);
    expect_error("k_proj transposed", dir, "model.layers.0.self_attn.k_proj.weight", "[128, 64]");
    iot_rm_tree(dir);
}

/* An index whose map sends one tensor to a shard file that is not there. */
static void test_missing_shard(void) {
    char dir[64];
    iot_mkdtemp(dir);
    write_config(dir, NULL, 0);
    char *shard = base_path_join(dir, "model-00001-of-00002.safetensors");
    write_weights(shard, NULL);
    io_checkpoint *ck;
    base_err err;
    CHECK(io_checkpoint_open_file(shard, &ck, &err) == 0);
    json_t *map = json_object();
    for (size_t i = 0; i < io_checkpoint_count(ck); i++)
        json_object_set_new(map, io_checkpoint_at(ck, i)->name,
                            json_string("model-00001-of-00002.safetensors"));
    json_object_set_new(map, "model.norm.weight", json_string("model-00002-of-00002.safetensors"));
    io_checkpoint_close(ck);
    json_t *index = json_pack("{s:{s:i}, s:o}", "metadata", "total_size", 0, "weight_map", map);
    char *index_path = base_path_join(dir, "model.safetensors.index.json");
    CHECK(json_dump_file(index, index_path, 0) == 0);
    json_decref(index);
    expect_error("missing shard", dir, "model-00002-of-00002.safetensors", "model.norm.weight");
    free(index_path);
    free(shard);
    iot_rm_tree(dir);
}

/* A float32 copy of t's data (which the edit then owns) with element i set to v. */
static void poison(io_tensor_out *t, void **owned, int64_t i, float v) {
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    float *copy = malloc(n * sizeof *copy);
    memcpy(copy, t->data, n * sizeof *copy);
    copy[i] = v;
    t->data = copy;
    *owned = copy;
}

static void nan_in_norm(io_tensor_out *t, void **owned) {
    if (strcmp(t->name, "model.norm.weight") == 0) poison(t, owned, 77, NAN);
}

/* intermediate_size 1024 makes each MLP matrix 131072 elements, past the full-scan size, so
 * only samples are read: the first and last elements are always among them. */
static void wide_mlp(io_tensor_out *t, void **owned) {
    bool gate_up = strstr(t->name, "mlp.gate_proj") || strstr(t->name, "mlp.up_proj");
    bool down = strstr(t->name, "mlp.down_proj") != NULL;
    if (!gate_up && !down) return;
    if (gate_up)
        t->shape[0] = 1024;
    else
        t->shape[1] = 1024;
    size_t n = 1024 * 128;
    float *w = malloc(n * sizeof *w);
    for (size_t i = 0; i < n; i++) w[i] = 0.01f * (float)(i % 7);
    if (strcmp(t->name, "model.layers.1.mlp.down_proj.weight") == 0) w[n - 1] = -INFINITY;
    t->data = w;
    *owned = w;
}

static void test_non_finite(void) {
    char dir[64], log[4096];
    base_err err = {{0}};

    make_copy(dir, NULL, 0, NULL);
    CHECK_MSG(load_capture(dir, &err, log, sizeof log) == 0, "clean copy: %s", err.msg);
    CHECK_MSG(strstr(log, "NaN") == NULL, "clean copy warns: %s", log);
    iot_rm_tree(dir);

    make_copy(dir, NULL, 0, nan_in_norm);
    CHECK_MSG(load_capture(dir, &err, log, sizeof log) == 0, "NaN norm: %s", err.msg);
    CHECK_MSG(strstr(log, "warning") && strstr(log, "model.norm.weight") &&
                  strstr(log, "NaN or Inf") && strstr(log, "element 77"),
              "NaN norm: log is '%s'", log);
    CHECK_MSG(strstr(log, "model.layers") == NULL, "NaN norm: other tensors named: %s", log);
    iot_rm_tree(dir);

    make_copy(dir, "intermediate_size", 1024, wide_mlp);
    CHECK_MSG(load_capture(dir, &err, log, sizeof log) == 0, "Inf down_proj: %s", err.msg);
    CHECK_MSG(strstr(log, "model.layers.1.mlp.down_proj.weight") &&
                  strstr(log, "evenly spaced samples") && strstr(log, "131072"),
              "Inf down_proj: log is '%s'", log);
    CHECK_MSG(strstr(log, "model.layers.0") == NULL, "Inf down_proj: other tensors named: %s", log);
    iot_rm_tree(dir);
}

int main(void) {
    snprintf(g_fixture, sizeof g_fixture, "%s/tests/fixtures/llama_f32", test_source_dir());
    test_config_mismatches();
    test_wrong_shape();
    test_missing_shard();
    test_non_finite();
    TEST_MAIN_END();
}
