/* The decode bytes `mlxcel inspect` prints from a checkpoint's headers alone must be what
 * `mlxcel bench` counts from the loaded model (model_decode_bytes), for every committed
 * fixture and the demo model: dense and MoE, quantized (per-module overrides, MXFP4), tied
 * embeddings, mixed dense and MoE layers, mlx-vlm's Gemma 3 with its vision tower. A MoE
 * model's routed figure is the all-experts one less the experts a row is not routed to. */
#include "io/io_test_util.h"
#include "model/arch/arch.h"
#include "model/model.h"

#include <jansson.h>

/* Bytes of every stacked-experts tensor in the checkpoint, found by name alone. */
static uint64_t expert_bytes(const io_checkpoint *ck, const model_arch *arch) {
    char part[64];
    snprintf(part, sizeof part, ".%s.", arch->names.experts);
    uint64_t sum = 0;
    for (size_t i = 0; i < io_checkpoint_count(ck); i++) {
        const io_tensor *t = io_checkpoint_at(ck, i);
        if (strstr(t->name, part)) sum += t->nbytes;
    }
    return sum;
}

static void check_model(const char *name, const char *dir, int *n_moe) {
    base_err err = {{0}};
    io_model_config cfg;
    const model_arch *arch;
    io_checkpoint *ck = NULL;
    model_decode_read peek;
    if (model_config_load(dir, &cfg, &arch, &err) || io_checkpoint_open_headers(dir, &ck, &err) ||
        model_checkpoint_decode_bytes(&cfg, ck, &peek, &err)) {
        CHECK_MSG(0, "%s: %s", name, err.msg);
        io_checkpoint_close(ck);
        io_config_free(&cfg);
        return;
    }
    be_backend *be;
    model *m = NULL;
    CHECK_MSG(be_cpu_create(1, &be, &err) == 0 && model_load(dir, be, NULL, NULL, &m, &err) == 0,
              "%s: %s", name, err.msg);
    if (m) {
        model_decode_read got = model_decode_bytes(m);
        CHECK_MSG(peek.routed == got.routed && peek.all_experts == got.all_experts,
                  "%s: headers give %llu (%llu all experts), the loaded model %llu (%llu)", name,
                  (unsigned long long)peek.routed, (unsigned long long)peek.all_experts,
                  (unsigned long long)got.routed, (unsigned long long)got.all_experts);
        model_free(m);
    }
    be->ops->destroy(be);
    uint64_t experts = cfg.n_experts ? expert_bytes(ck, arch) : 0;
    if (cfg.n_experts)
        printf("  %-22s decode %8llu bytes, %8llu with every expert (%llu of experts, %d of %d "
               "read)\n",
               name, (unsigned long long)peek.routed, (unsigned long long)peek.all_experts,
               (unsigned long long)experts, cfg.n_experts_used, cfg.n_experts);
    else
        printf("  %-22s decode %8llu bytes\n", name, (unsigned long long)peek.routed);
    if (cfg.n_experts) {
        /* A row reads top_k / n_experts of the experts, all of everything else. */
        uint64_t n = (uint64_t)cfg.n_experts, k = (uint64_t)cfg.n_experts_used;
        CHECK_MSG(experts > 0 && peek.routed < peek.all_experts &&
                      (peek.all_experts - peek.routed) * n == experts * (n - k),
                  "%s: routed %llu, all %llu, experts %llu: not %llu of %llu experts read", name,
                  (unsigned long long)peek.routed, (unsigned long long)peek.all_experts,
                  (unsigned long long)experts, (unsigned long long)k, (unsigned long long)n);
        ++*n_moe;
    } else {
        CHECK_MSG(peek.routed == peek.all_experts, "%s: a dense model with two figures", name);
    }
    io_checkpoint_close(ck);
    io_config_free(&cfg);
}

/* The header walk names a tensor the loader would bind and the checkpoint lacks: the
 * qwen3_moe fixture's config with one layer more than its tensors. */
static void check_missing_tensor(const char *fixture) {
    char dir[64], *src = base_path_join(fixture, "config.json");
    iot_mkdtemp(dir);
    json_t *cfg = json_load_file(src, 0, NULL);
    CHECK(cfg != NULL);
    if (!cfg) return;
    json_int_t layers = json_integer_value(json_object_get(cfg, "num_hidden_layers"));
    json_object_set_new(cfg, "num_hidden_layers", json_integer(layers + 1));
    char *dst = base_path_join(dir, "config.json"),
         *w = base_path_join(fixture, "model.safetensors"),
         *link = base_path_join(dir, "model.safetensors");
    CHECK(json_dump_file(cfg, dst, 0) == 0 && symlink(w, link) == 0);
    base_err err = {{0}};
    io_model_config c;
    io_checkpoint *ck = NULL;
    model_decode_read r;
    char want[128];
    snprintf(want, sizeof want, "model.layers.%lld.", (long long)layers);
    bool opened = model_config_load(dir, &c, NULL, &err) == 0 &&
                  io_checkpoint_open_headers(dir, &ck, &err) == 0;
    CHECK_MSG(opened, "%s: %s", dir, err.msg);
    if (opened)
        CHECK_MSG(model_checkpoint_decode_bytes(&c, ck, &r, &err) == -1 &&
                      strstr(err.msg, "missing tensor") && strstr(err.msg, want),
                  "error '%s' does not name a tensor of %s", err.msg, want);
    io_checkpoint_close(ck);
    io_config_free(&c);
    json_decref(cfg);
    free(src);
    free(dst);
    free(w);
    free(link);
    iot_rm_tree(dir);
}

static int name_cmp(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(void) {
    char *root = base_path_join(test_source_dir(), "tests/fixtures");
    char *names[256];
    int n = 0, n_moe = 0;
    DIR *d = opendir(root);
    for (struct dirent *e; d && (e = readdir(d)) && n < 256;) {
        char *dir = base_path_join(root, e->d_name), *cfg = base_path_join(dir, "config.json");
        if (e->d_name[0] != '.' && base_file_exists(cfg)) names[n++] = base_xstrdup(e->d_name);
        free(cfg);
        free(dir);
    }
    if (d) closedir(d);
    qsort(names, (size_t)n, sizeof *names, name_cmp);
    CHECK_MSG(n >= 10, "expected the committed fixtures under %s, found %d", root, n);
    for (int i = 0; i < n; i++) {
        char *dir = base_path_join(root, names[i]);
        check_model(names[i], dir, &n_moe);
        free(dir);
        free(names[i]);
    }
    CHECK_MSG(n_moe >= 4, "expected the MoE fixtures, found %d", n_moe);
    char *demo = base_path_join(test_source_dir(), "models/demo");
    check_model("models/demo", demo, &n_moe);
    free(demo);
    char *moe = base_path_join(root, "qwen3_moe_q4_g64");
    check_missing_tensor(moe);
    free(moe);
    free(root);
    TEST_MAIN_END();
}
