/* The registry of family descriptors, and config.json read through them. */
#include "model/arch/arch.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static const model_arch *const g_archs[] = {
    &arch_llama,       &arch_mistral, &arch_qwen2,   &arch_qwen3, &arch_gemma2,
    &arch_gemma3_text, &arch_gemma3,  &arch_phi3,    &arch_olmo2, &arch_granite,
    &arch_qwen3_moe,   &arch_mixtral, &arch_gpt_oss,
};
#define N_ARCHS ((int)(sizeof g_archs / sizeof g_archs[0]))

const model_arch *model_arch_find(const char *model_type) {
    for (int i = 0; i < N_ARCHS; i++)
        if (strcmp(g_archs[i]->model_type, model_type) == 0) return g_archs[i];
    return NULL;
}

const model_arch *const *model_arch_all(int *n) {
    *n = N_ARCHS;
    return g_archs;
}

const char *model_arch_names(void) {
    static char list[256];
    if (!list[0]) {
        /* Bounded: a registry outgrowing the buffer truncates the list, never overruns it. */
        size_t n = 0;
        for (int i = 0; i < N_ARCHS && n < sizeof list; i++)
            n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "",
                                  g_archs[i]->model_type);
    }
    return list;
}

static int config_from_json(json_t *root, const char *origin, io_model_config *cfg,
                            const model_arch **arch_out, base_err *err) {
    memset(cfg, 0, sizeof *cfg);
    if (arch_out) *arch_out = NULL;
    if (!json_is_object(root)) return base_fail(err, "%s: must be a JSON object", origin);
    const char *type = json_string_value(json_object_get(root, "model_type"));
    const model_arch *a = type ? model_arch_find(type) : NULL;
    if (type && !a)
        return base_fail(err, "%s: model_type '%s' is not supported (supported: %s)", origin, type,
                         model_arch_names());
    json_t *text = io_config_text(root);
    if (a && a->defaults) {
        json_error_t jerr;
        json_t *d = json_loads(a->defaults, 0, &jerr);
        if (!d) return base_fail(err, "%s: the defaults of %s do not parse", origin, type);
        json_object_update_missing(text, d);
        json_decref(d);
    }
    /* Without a model_type the generic parse names the missing field. */
    if (io_config_parse_json(root, origin, cfg, err)) return -1;
    io_cfg_at at = {text, origin, text == root ? "" : "text_config.", err};
    if (a && a->configure && a->configure(&at, cfg)) {
        io_config_free(cfg);
        return -1;
    }
    if (arch_out) *arch_out = a;
    return 0;
}

int model_config_parse(const char *json_text, const char *origin, io_model_config *cfg,
                       const model_arch **arch, base_err *err) {
    json_error_t jerr;
    json_t *root = json_loads(json_text, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        memset(cfg, 0, sizeof *cfg);
        return base_fail(err, "%s: line %d: %s", origin, jerr.line, jerr.text);
    }
    int rc = config_from_json(root, origin, cfg, arch, err);
    json_decref(root);
    return rc;
}

int model_config_load(const char *dir, io_model_config *cfg, const model_arch **arch,
                      base_err *err) {
    json_t *root;
    char *origin;
    memset(cfg, 0, sizeof *cfg);
    int rc = io_config_read_json(dir, &root, &origin, err);
    if (rc == 0) rc = config_from_json(root, origin, cfg, arch, err);
    json_decref(root);
    free(origin);
    return rc;
}

int arch_window_all(const io_cfg_at *at, io_model_config *cfg) {
    if (io_cfg_int(at, "sliding_window", 0, &cfg->sliding_window)) return -1;
    if (cfg->sliding_window < 0) return io_cfg_fail(at, "sliding_window", "must not be negative");
    /* A window that spans the whole trained context (Phi-3.5-mini and Phi-4-mini write 262144
     * beside 131072 positions) masks nothing there: it is no window, and marking the layers
     * local would only keep them off the attention kernels that take no window. */
    if (cfg->sliding_window >= cfg->max_position_embeddings) cfg->sliding_window = 0;
    if (cfg->sliding_window == 0) return 0;
    int n = cfg->num_hidden_layers;
    cfg->layer_local = base_xcalloc((size_t)n, sizeof *cfg->layer_local);
    for (int i = 0; i < n; i++) cfg->layer_local[i] = true;
    return 0;
}

int arch_window_refused(const io_cfg_at *at) {
    bool windowed;
    if (io_cfg_bool(at, "use_sliding_window", false, &windowed)) return -1;
    return windowed ? io_cfg_fail(at, "use_sliding_window", "true is not supported") : 0;
}

int arch_window_pattern(const io_cfg_at *at, io_model_config *cfg, int period) {
    if (io_cfg_pos_int(at, "sliding_window", 0, &cfg->sliding_window)) return -1;
    int n = cfg->num_hidden_layers;
    cfg->layer_local = base_xcalloc((size_t)n, sizeof *cfg->layer_local);
    bool given;
    if (io_cfg_layer_types(at, n, cfg->layer_local, &given)) return -1;
    if (!given)
        for (int i = 0; i < n; i++) cfg->layer_local[i] = (i + 1) % period != 0;
    return 0;
}

int arch_moe(const io_cfg_at *at, io_model_config *cfg, const char *n_key, const char *k_key,
             const char *inter_key) {
    if (!io_cfg_has(at, n_key)) return io_cfg_fail(at, n_key, "is missing");
    if (io_cfg_pos_int(at, n_key, 1, &cfg->n_experts) ||
        io_cfg_pos_int(at, k_key, 1, &cfg->n_experts_used) ||
        io_cfg_pos_int(at, inter_key, cfg->intermediate_size, &cfg->moe_intermediate_size))
        return -1;
    if (cfg->n_experts_used > cfg->n_experts)
        return io_cfg_fail(at, k_key, "must not exceed the number of experts");
    return 0;
}
