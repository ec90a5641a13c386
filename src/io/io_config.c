/* config.json -> io_model_config. Field defaults follow the transformers config classes for
 * each family; a field with the wrong JSON type or an impossible value is an error naming it
 * rather than a silent default, since a wrong head count only shows up later as garbage. */
#include "io/io_internal.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const g_arch_names[IO_ARCH_COUNT] = {
    [IO_ARCH_LLAMA] = "llama",
    [IO_ARCH_MISTRAL] = "mistral",
    [IO_ARCH_QWEN2] = "qwen2",
    [IO_ARCH_QWEN3] = "qwen3",
};

const char *io_arch_name(io_arch arch) {
    return (unsigned)arch < IO_ARCH_COUNT ? g_arch_names[arch] : "?";
}

const char *io_arch_supported_list(void) {
    return "llama, mistral, qwen2, qwen3";
}

/* Where errors point: the origin (file) and the object's prefix ("" or "rope_scaling."). */
typedef struct cfg_at {
    const char *origin;
    const char *prefix;
    base_err *err;
} cfg_at;

static int field_fail(const cfg_at *at, const char *key, const char *what, const json_t *v) {
    if (v)
        return base_fail(at->err, "%s: field '%s%s' %s, got %s", at->origin, at->prefix, key, what,
                         io_json_kind(v));
    return base_fail(at->err, "%s: field '%s%s' %s", at->origin, at->prefix, key, what);
}

/* Absent and null both mean "use the default". */
static json_t *field(json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    return json_is_null(v) ? NULL : v;
}

static int get_int(const cfg_at *at, json_t *obj, const char *key, bool required, int def,
                   int *out) {
    json_t *v = field(obj, key);
    if (!v) {
        if (required) return field_fail(at, key, "is missing", NULL);
        *out = def;
        return 0;
    }
    if (!json_is_integer(v)) return field_fail(at, key, "must be an integer", v);
    json_int_t x = json_integer_value(v);
    if (x < INT_MIN || x > INT_MAX) return field_fail(at, key, "is out of range", NULL);
    *out = (int)x;
    return 0;
}

static int get_pos_int(const cfg_at *at, json_t *obj, const char *key, bool required, int def,
                       int *out) {
    if (get_int(at, obj, key, required, def, out) != 0) return -1;
    if (*out <= 0) return field_fail(at, key, "must be positive", NULL);
    return 0;
}

static int get_float(const cfg_at *at, json_t *obj, const char *key, float def, float *out) {
    json_t *v = field(obj, key);
    if (!v) {
        *out = def;
        return 0;
    }
    if (!json_is_number(v)) return field_fail(at, key, "must be a number", v);
    double x = json_number_value(v);
    if (!isfinite(x) || fabs(x) > 3.4e38) return field_fail(at, key, "is out of range", NULL);
    *out = (float)x;
    return 0;
}

static int get_pos_float(const cfg_at *at, json_t *obj, const char *key, bool required, float def,
                         float *out) {
    if (required && !field(obj, key)) return field_fail(at, key, "is missing", NULL);
    if (get_float(at, obj, key, def, out) != 0) return -1;
    if (!(*out > 0)) return field_fail(at, key, "must be positive", NULL);
    return 0;
}

static int get_bool(const cfg_at *at, json_t *obj, const char *key, bool def, bool *out) {
    json_t *v = field(obj, key);
    if (!v) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v)) return field_fail(at, key, "must be true or false", v);
    *out = json_is_true(v);
    return 0;
}

/* The rope object: transformers < 5 writes `rope_scaling`, 5 writes `rope_parameters` (with
 * rope_theta inside); `type` is the older spelling of `rope_type`. */
static int parse_rope(const cfg_at *root_at, json_t *obj, const char *name, io_rope_scaling *rs) {
    char prefix[32];
    snprintf(prefix, sizeof prefix, "%s.", name);
    cfg_at at = {root_at->origin, prefix, root_at->err};
    if (!json_is_object(obj)) return field_fail(root_at, name, "must be an object or null", obj);
    json_t *t = field(obj, "rope_type");
    const char *tkey = "rope_type";
    if (!t) {
        t = field(obj, "type");
        tkey = "type";
    }
    if (!t) return field_fail(&at, "rope_type", "is missing", NULL);
    if (!json_is_string(t)) return field_fail(&at, tkey, "must be a string", t);
    static const char *const names[] = {"default", "linear", "dynamic", "llama3", "yarn"};
    static const io_rope_type types[] = {IO_ROPE_NONE, IO_ROPE_LINEAR, IO_ROPE_DYNAMIC,
                                         IO_ROPE_LLAMA3, IO_ROPE_YARN};
    int found = -1;
    for (int i = 0; i < 5; i++) {
        if (strcmp(json_string_value(t), names[i]) == 0) found = i;
    }
    if (found < 0)
        return base_fail(at.err,
                         "%s: field '%s%s' is '%s': unsupported (supported: default, linear, "
                         "dynamic, llama3, yarn)",
                         at.origin, prefix, tkey, json_string_value(t));
    *rs = (io_rope_scaling){.type = types[found]};
    if (rs->type == IO_ROPE_NONE) return 0;
    bool llama3 = rs->type == IO_ROPE_LLAMA3;
    if (get_pos_float(&at, obj, "factor", true, 0, &rs->factor) != 0 ||
        get_int(&at, obj, "original_max_position_embeddings", llama3, 0,
                &rs->original_max_position_embeddings) != 0)
        return -1;
    if (rs->original_max_position_embeddings < 0)
        return field_fail(&at, "original_max_position_embeddings", "must not be negative", NULL);
    if (llama3) {
        if (get_pos_float(&at, obj, "low_freq_factor", true, 0, &rs->low_freq_factor) != 0 ||
            get_pos_float(&at, obj, "high_freq_factor", true, 0, &rs->high_freq_factor) != 0)
            return -1;
        if (rs->original_max_position_embeddings == 0)
            return field_fail(&at, "original_max_position_embeddings", "must be positive", NULL);
        if (!(rs->high_freq_factor > rs->low_freq_factor))
            return field_fail(&at, "high_freq_factor", "must be above low_freq_factor", NULL);
    }
    if (rs->type == IO_ROPE_YARN) {
        if (get_float(&at, obj, "beta_fast", 32, &rs->beta_fast) != 0 ||
            get_float(&at, obj, "beta_slow", 1, &rs->beta_slow) != 0 ||
            get_float(&at, obj, "mscale", 0, &rs->mscale) != 0 ||
            get_float(&at, obj, "mscale_all_dim", 0, &rs->mscale_all_dim) != 0 ||
            get_float(&at, obj, "attention_factor", 0, &rs->attention_factor) != 0)
            return -1;
    }
    return 0;
}

static int parse_rope_all(const cfg_at *at, json_t *root, io_model_config *cfg) {
    json_t *scaling = field(root, "rope_scaling"), *params = field(root, "rope_parameters");
    if (scaling && parse_rope(at, scaling, "rope_scaling", &cfg->rope_scaling) != 0) return -1;
    if (!scaling && params && parse_rope(at, params, "rope_parameters", &cfg->rope_scaling) != 0)
        return -1;
    if (field(root, "rope_theta"))
        return get_pos_float(at, root, "rope_theta", false, 0, &cfg->rope_theta);
    json_t *holder = params && field(params, "rope_theta") ? params : scaling;
    if (holder && field(holder, "rope_theta")) {
        cfg_at in = {at->origin, holder == params ? "rope_parameters." : "rope_scaling.", at->err};
        return get_pos_float(&in, holder, "rope_theta", false, 0, &cfg->rope_theta);
    }
    cfg->rope_theta = 10000.0f;
    return 0;
}

static int check_spec(const cfg_at *at, const io_quant_spec *q) {
    if (q->bits != 2 && q->bits != 3 && q->bits != 4 && q->bits != 5 && q->bits != 6 &&
        q->bits != 8)
        return base_fail(at->err, "%s: field '%sbits' is %d: supported 2, 3, 4, 5, 6, 8",
                         at->origin, at->prefix, q->bits);
    if (q->group_size != 32 && q->group_size != 64 && q->group_size != 128)
        return base_fail(at->err, "%s: field '%sgroup_size' is %d: supported 32, 64, 128",
                         at->origin, at->prefix, q->group_size);
    return 0;
}

static void push_override(io_model_config *cfg, const char *module, io_quant_spec spec) {
    cfg->quant_overrides = base_xrealloc(
        cfg->quant_overrides, (size_t)(cfg->n_quant_overrides + 1) * sizeof *cfg->quant_overrides);
    cfg->quant_overrides[cfg->n_quant_overrides++] =
        (io_quant_override){.module = base_xstrdup(module), .spec = spec};
}

/* mlx-lm writes `quantization`; HF-side copies carry `quantization_config`. Keys other than
 * the defaults are per-module entries: an object overrides bits/group_size, false leaves the
 * module dense, and any other value is a setting we have no use for. */
static int parse_quant(const cfg_at *root_at, json_t *root, io_model_config *cfg) {
    const char *name = "quantization";
    json_t *q = field(root, name);
    if (!q) {
        name = "quantization_config";
        q = field(root, name);
    }
    if (!q) return 0;
    if (!json_is_object(q)) return field_fail(root_at, name, "must be an object", q);
    char prefix[32];
    snprintf(prefix, sizeof prefix, "%s.", name);
    cfg_at at = {root_at->origin, prefix, root_at->err};
    json_t *method = field(q, "quant_method");
    if (method && (!json_is_string(method) || strcmp(json_string_value(method), "mlx") != 0))
        return field_fail(&at, "quant_method", "is not supported (only MLX affine)", method);
    json_t *mode = field(q, "mode");
    if (mode && !json_is_string(mode)) return field_fail(&at, "mode", "must be a string", mode);
    if (mode && strcmp(json_string_value(mode), "affine") != 0)
        return base_fail(at.err, "%s: field '%smode' is '%s': only 'affine' is supported",
                         at.origin, prefix, json_string_value(mode));
    if (get_int(&at, q, "bits", true, 0, &cfg->quant.bits) != 0 ||
        get_int(&at, q, "group_size", true, 0, &cfg->quant.group_size) != 0 ||
        check_spec(&at, &cfg->quant) != 0)
        return -1;
    const char *key;
    json_t *v;
    json_object_foreach(q, key, v) {
        if (json_is_false(v)) {
            push_override(cfg, key, (io_quant_spec){0, 0});
        } else if (json_is_object(v)) {
            char sub[300];
            snprintf(sub, sizeof sub, "%s%s.", prefix, key);
            cfg_at mat = {at.origin, sub, at.err};
            io_quant_spec s = {0, 0};
            if (get_int(&mat, v, "bits", false, cfg->quant.bits, &s.bits) != 0 ||
                get_int(&mat, v, "group_size", false, cfg->quant.group_size, &s.group_size) != 0 ||
                check_spec(&mat, &s) != 0)
                return -1;
            push_override(cfg, key, s);
        }
    }
    return 0;
}

static int parse_dtype(const cfg_at *at, json_t *root, base_dtype *out) {
    const char *key = field(root, "torch_dtype") ? "torch_dtype" : "dtype";
    json_t *v = field(root, key);
    *out = BASE_DTYPE_F32;
    if (!v) return 0;
    if (!json_is_string(v)) return field_fail(at, key, "must be a string", v);
    const char *s = json_string_value(v);
    if (strcmp(s, "bfloat16") == 0)
        *out = BASE_DTYPE_BF16;
    else if (strcmp(s, "float16") == 0)
        *out = BASE_DTYPE_F16;
    else if (strcmp(s, "float32") != 0)
        return base_fail(at->err, "%s: field '%s' is '%s': supported bfloat16, float16, float32",
                         at->origin, key, s);
    return 0;
}

static int parse_tokens(const cfg_at *at, json_t *root, io_model_config *cfg) {
    if (get_int(at, root, "bos_token_id", false, -1, &cfg->bos_token_id) != 0) return -1;
    json_t *eos = field(root, "eos_token_id");
    if (!eos) return 0;
    if (json_is_integer(eos)) {
        if (get_int(at, root, "eos_token_id", true, 0, &cfg->eos_token_ids[0]) != 0) return -1;
        cfg->n_eos = 1;
        return 0;
    }
    if (!json_is_array(eos))
        return field_fail(at, "eos_token_id", "must be an integer or a list of them", eos);
    if (json_array_size(eos) > IO_MAX_EOS)
        return base_fail(at->err, "%s: field 'eos_token_id' lists %zu ids, at most %d supported",
                         at->origin, json_array_size(eos), IO_MAX_EOS);
    size_t i;
    json_t *v;
    json_array_foreach(eos, i, v) {
        if (!json_is_integer(v) || json_integer_value(v) < INT_MIN ||
            json_integer_value(v) > INT_MAX)
            return field_fail(at, "eos_token_id", "must list integers", v);
        cfg->eos_token_ids[cfg->n_eos++] = (int)json_integer_value(v);
    }
    return 0;
}

static int parse_arch(const cfg_at *at, json_t *root, io_model_config *cfg) {
    json_t *mt = json_object_get(root, "model_type");
    if (!mt) return field_fail(at, "model_type", "is missing", NULL);
    if (!json_is_string(mt)) return field_fail(at, "model_type", "must be a string", mt);
    for (int a = 0; a < IO_ARCH_COUNT; a++) {
        if (strcmp(json_string_value(mt), g_arch_names[a]) == 0) {
            cfg->arch = (io_arch)a;
            snprintf(cfg->model_type, sizeof cfg->model_type, "%s", g_arch_names[a]);
            return 0;
        }
    }
    return base_fail(at->err, "%s: model_type '%s' is not supported (supported: %s)", at->origin,
                     json_string_value(mt), io_arch_supported_list());
}

static int parse_shapes(const cfg_at *at, json_t *root, io_model_config *c) {
    if (get_pos_int(at, root, "vocab_size", true, 0, &c->vocab_size) != 0 ||
        get_pos_int(at, root, "hidden_size", true, 0, &c->hidden_size) != 0 ||
        get_pos_int(at, root, "intermediate_size", true, 0, &c->intermediate_size) != 0 ||
        get_pos_int(at, root, "num_hidden_layers", true, 0, &c->num_hidden_layers) != 0 ||
        get_pos_int(at, root, "num_attention_heads", true, 0, &c->num_attention_heads) != 0 ||
        get_pos_int(at, root, "num_key_value_heads", false, c->num_attention_heads,
                    &c->num_key_value_heads) != 0 ||
        get_pos_int(at, root, "max_position_embeddings", true, 0, &c->max_position_embeddings) !=
            0 ||
        get_pos_float(at, root, "rms_norm_eps", false, 1e-6f, &c->rms_norm_eps) != 0)
        return -1;
    if (c->num_attention_heads % c->num_key_value_heads != 0)
        return base_fail(at->err,
                         "%s: field 'num_key_value_heads' (%d) must divide "
                         "num_attention_heads (%d)",
                         at->origin, c->num_key_value_heads, c->num_attention_heads);
    /* Qwen3 sets head_dim explicitly and it need not equal hidden_size / heads. */
    if (!field(root, "head_dim") && c->hidden_size % c->num_attention_heads != 0)
        return base_fail(at->err,
                         "%s: field 'head_dim' is absent and hidden_size (%d) is not a multiple "
                         "of num_attention_heads (%d)",
                         at->origin, c->hidden_size, c->num_attention_heads);
    if (get_pos_int(at, root, "head_dim", false, c->hidden_size / c->num_attention_heads,
                    &c->head_dim) != 0)
        return -1;
    if (c->head_dim % 2 != 0)
        return base_fail(at->err, "%s: field 'head_dim' (%d) must be even for rotary embeddings",
                         at->origin, c->head_dim);
    return 0;
}

/* Per-family switches that the config spells differently or not at all. */
static int parse_family(const cfg_at *at, json_t *root, io_model_config *c) {
    bool windowed = false;
    switch (c->arch) {
    case IO_ARCH_QWEN2:
        /* Qwen2 always carries q/k/v biases; its config has no field for it */
        c->attention_bias = true;
        break;
    case IO_ARCH_QWEN3:
        c->qk_norm = true; /* fall through */
    case IO_ARCH_LLAMA:
        if (get_bool(at, root, "attention_bias", false, &c->attention_bias) != 0) return -1;
        break;
    case IO_ARCH_MISTRAL:
        if (get_int(at, root, "sliding_window", false, 0, &c->sliding_window) != 0) return -1;
        if (c->sliding_window < 0)
            return field_fail(at, "sliding_window", "must not be negative", NULL);
        break;
    case IO_ARCH_COUNT:
        break;
    }
    if (c->arch == IO_ARCH_QWEN2 || c->arch == IO_ARCH_QWEN3) {
        if (get_bool(at, root, "use_sliding_window", false, &windowed) != 0) return -1;
        /* Qwen's window covers only the layers past max_window_layers, which one number
         * cannot describe; refusing beats attending over the wrong span. */
        if (windowed) return field_fail(at, "use_sliding_window", "true is not supported", NULL);
    }
    return get_bool(at, root, "tie_word_embeddings", false, &c->tie_word_embeddings);
}

int io_config_parse(const char *json_text, const char *origin, io_model_config *cfg,
                    base_err *err) {
    memset(cfg, 0, sizeof *cfg);
    json_error_t jerr;
    json_t *root = json_loads(json_text, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) return base_fail(err, "%s: line %d: %s", origin, jerr.line, jerr.text);
    cfg_at at = {origin, "", err};
    int rc = 0;
    if (!json_is_object(root)) rc = base_fail(err, "%s: must be a JSON object", origin);
    if (rc == 0) rc = parse_arch(&at, root, cfg);
    if (rc == 0) rc = parse_shapes(&at, root, cfg);
    if (rc == 0) rc = parse_rope_all(&at, root, cfg);
    if (rc == 0) rc = parse_family(&at, root, cfg);
    if (rc == 0) rc = parse_tokens(&at, root, cfg);
    if (rc == 0) rc = parse_dtype(&at, root, &cfg->torch_dtype);
    if (rc == 0) rc = parse_quant(&at, root, cfg);
    json_decref(root);
    if (rc != 0) io_config_free(cfg);
    return rc;
}

int io_config_load(const char *dir, io_model_config *cfg, base_err *err) {
    memset(cfg, 0, sizeof *cfg);
    char *path = base_path_join(dir, "config.json");
    char *text = NULL;
    int rc = base_read_file(path, &text, NULL, err);
    if (rc == 0) rc = io_config_parse(text, path, cfg, err);
    free(text);
    free(path);
    return rc;
}

void io_config_free(io_model_config *cfg) {
    for (int i = 0; i < cfg->n_quant_overrides; i++) free(cfg->quant_overrides[i].module);
    free(cfg->quant_overrides);
    memset(cfg, 0, sizeof *cfg);
}

io_quant_spec io_config_quant_for(const io_model_config *cfg, const char *module) {
    for (int i = 0; i < cfg->n_quant_overrides; i++) {
        if (strcmp(cfg->quant_overrides[i].module, module) == 0)
            return cfg->quant_overrides[i].spec;
    }
    return cfg->quant;
}
