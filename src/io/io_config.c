/* config.json -> io_model_config. Field defaults follow the transformers config classes for
 * each family; a field with the wrong JSON type or an impossible value is an error naming it
 * rather than a silent default, since a wrong head count only shows up later as garbage. */
#include "io/io_internal.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

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

/* One longrope list: positive numbers; n (the first list's length) must match. */
static int parse_factors(const cfg_at *at, json_t *obj, const char *key, int *n, float **out) {
    json_t *v = field(obj, key);
    if (!v) return field_fail(at, key, "is missing", NULL);
    if (!json_is_array(v) || json_array_size(v) == 0 || json_array_size(v) > 4096)
        return field_fail(at, key, "must be a list of 1 to 4096 numbers", v);
    if (*n && (int)json_array_size(v) != *n)
        return field_fail(at, key, "must have as many entries as short_factor", NULL);
    *n = (int)json_array_size(v);
    *out = base_xmalloc((size_t)*n * sizeof **out);
    size_t i;
    json_t *x;
    json_array_foreach(v, i, x) {
        double d = json_is_number(x) ? json_number_value(x) : 0;
        if (!(d > 0) || d > 1e30) return field_fail(at, key, "must list positive numbers", x);
        (*out)[i] = (float)d;
    }
    return 0;
}

/* Phi-3's longrope: short and long factor lists, optional factor, attention_factor and
 * original_max_position_embeddings (Phi-3 writes the last at the top level instead). */
static int parse_longrope(const cfg_at *at, json_t *obj, io_rope_scaling *rs) {
    if (parse_factors(at, obj, "short_factor", &rs->n_factors, &rs->short_factor) != 0 ||
        parse_factors(at, obj, "long_factor", &rs->n_factors, &rs->long_factor) != 0 ||
        get_float(at, obj, "factor", 0, &rs->factor) != 0 ||
        get_float(at, obj, "attention_factor", 0, &rs->attention_factor) != 0 ||
        get_int(at, obj, "original_max_position_embeddings", false, 0,
                &rs->original_max_position_embeddings) != 0)
        return -1;
    if (rs->factor < 0 || rs->attention_factor < 0 || rs->original_max_position_embeddings < 0)
        return field_fail(at, "factor", "and attention_factor must not be negative", NULL);
    return 0;
}

/* The rope object: transformers < 5 writes `rope_scaling`, 5 writes `rope_parameters` (with
 * rope_theta inside); `type` is the older spelling of `rope_type`. */
static int parse_rope(const cfg_at *root_at, json_t *obj, const char *name, io_rope_scaling *rs) {
    char prefix[64];
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
    static const char *const names[] = {"default", "linear",   "dynamic", "llama3",
                                        "yarn",    "longrope", "su"};
    static const io_rope_type types[] = {IO_ROPE_NONE,    IO_ROPE_LINEAR, IO_ROPE_DYNAMIC,
                                         IO_ROPE_LLAMA3,  IO_ROPE_YARN,   IO_ROPE_LONGROPE,
                                         IO_ROPE_LONGROPE};
    int found = -1;
    for (int i = 0; i < (int)(sizeof names / sizeof names[0]); i++) {
        if (strcmp(json_string_value(t), names[i]) == 0) found = i;
    }
    if (found < 0)
        return base_fail(at.err,
                         "%s: field '%s%s' is '%s': unsupported (supported: default, linear, "
                         "dynamic, llama3, yarn, longrope)",
                         at.origin, prefix, tkey, json_string_value(t));
    *rs = (io_rope_scaling){.type = types[found]};
    if (rs->type == IO_ROPE_NONE) return 0;
    if (rs->type == IO_ROPE_LONGROPE) return parse_longrope(&at, obj, rs);
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
            get_float(&at, obj, "attention_factor", 0, &rs->attention_factor) != 0 ||
            get_bool(&at, obj, "truncate", true, &rs->truncate) != 0)
            return -1;
    }
    return 0;
}

/* transformers 5's per-layer-type form, {"full_attention": {...}, "sliding_attention":
 * {...}} (Gemma 3): the global table and the local layers' own, each with its theta. */
static int parse_rope_by_type(const cfg_at *at, json_t *params, io_model_config *cfg) {
    json_t *full = field(params, "full_attention"), *local = field(params, "sliding_attention");
    cfg_at fat = {at->origin, "rope_parameters.full_attention.", at->err};
    cfg_at lat = {at->origin, "rope_parameters.sliding_attention.", at->err};
    if (!json_is_object(full))
        return field_fail(at, "rope_parameters.full_attention", "must be an object", full);
    if (parse_rope(at, full, "rope_parameters.full_attention", &cfg->rope_scaling) != 0 ||
        get_pos_float(&fat, full, "rope_theta", false, 10000.0f, &cfg->rope_theta) != 0)
        return -1;
    if (!local) return 0;
    if (!json_is_object(local))
        return field_fail(at, "rope_parameters.sliding_attention", "must be an object", local);
    if (parse_rope(at, local, "rope_parameters.sliding_attention", &cfg->rope_local_scaling) != 0)
        return -1;
    return get_pos_float(&lat, local, "rope_theta", false, cfg->rope_theta, &cfg->rope_local_theta);
}

static int parse_rope_all(const cfg_at *at, json_t *root, io_model_config *cfg) {
    json_t *scaling = field(root, "rope_scaling"), *params = field(root, "rope_parameters");
    if (!scaling && json_is_object(params) && field(params, "full_attention"))
        return parse_rope_by_type(at, params, cfg);
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

/* A quantization mode by name: MLX's affine and mxfp4; the other formats MLX writes are
 * refused until they are implemented. */
static int parse_mode(const cfg_at *at, json_t *obj, io_quant_mode def, io_quant_mode *out) {
    json_t *mode = field(obj, "mode");
    *out = def;
    if (!mode) return 0;
    if (!json_is_string(mode)) return field_fail(at, "mode", "must be a string", mode);
    const char *m = json_string_value(mode);
    if (strcmp(m, "affine") == 0) {
        *out = IO_QUANT_AFFINE;
    } else if (strcmp(m, "mxfp4") == 0) {
        *out = IO_QUANT_MXFP4;
    } else {
        return base_fail(at->err, "%s: field '%smode' is '%s': supported affine, mxfp4%s",
                         at->origin, at->prefix, m,
                         strcmp(m, "nvfp4") == 0 || strcmp(m, "mxfp8") == 0
                             ? " (nvfp4 and mxfp8 are not implemented yet)"
                             : "");
    }
    return 0;
}

static int check_spec(const cfg_at *at, const io_quant_spec *q) {
    if (q->mode == IO_QUANT_MXFP4) {
        if (q->bits != 4 || q->group_size != 32)
            return base_fail(at->err,
                             "%s: field '%sbits' and 'group_size' are %d and %d: mxfp4 has 4 "
                             "and 32",
                             at->origin, at->prefix, q->bits, q->group_size);
        return 0;
    }
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
 * module dense, and any other value is a setting we have no use for. An entry without a mode
 * is affine whatever the default's mode: mlx-lm passes the entry to the module's
 * to_quantized, whose mode defaults to affine (an MXFP4 model's 8-bit routers). */
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
    if (parse_mode(&at, q, IO_QUANT_AFFINE, &cfg->quant.mode) != 0 ||
        get_int(&at, q, "bits", true, 0, &cfg->quant.bits) != 0 ||
        get_int(&at, q, "group_size", true, 0, &cfg->quant.group_size) != 0 ||
        check_spec(&at, &cfg->quant) != 0)
        return -1;
    const char *key;
    json_t *v;
    json_object_foreach(q, key, v) {
        if (json_is_false(v)) {
            push_override(cfg, key, (io_quant_spec){0, 0, IO_QUANT_AFFINE});
        } else if (json_is_object(v)) {
            char sub[300];
            snprintf(sub, sizeof sub, "%s%s.", prefix, key);
            cfg_at mat = {at.origin, sub, at.err};
            io_quant_spec s = {0, 0, IO_QUANT_AFFINE};
            if (parse_mode(&mat, v, IO_QUANT_AFFINE, &s.mode) != 0 ||
                get_int(&mat, v, "bits", false, cfg->quant.bits, &s.bits) != 0 ||
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

static int parse_model_type(const cfg_at *at, json_t *root, io_model_config *cfg) {
    json_t *mt = json_object_get(root, "model_type");
    if (!mt) return field_fail(at, "model_type", "is missing", NULL);
    if (!json_is_string(mt)) return field_fail(at, "model_type", "must be a string", mt);
    if (strlen(json_string_value(mt)) >= sizeof cfg->model_type)
        return field_fail(at, "model_type", "is too long", NULL);
    snprintf(cfg->model_type, sizeof cfg->model_type, "%s", json_string_value(mt));
    return 0;
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
    float partial;
    if (get_float(at, root, "partial_rotary_factor", 1.0f, &partial) != 0) return -1;
    c->rotary_dim = (int)((float)c->head_dim * partial);
    if (!(partial > 0 && partial <= 1) || c->rotary_dim < 2 || c->rotary_dim % 2 != 0)
        return base_fail(at->err,
                         "%s: field 'partial_rotary_factor' (%g) must leave an even number of "
                         "rotated dims in head_dim %d",
                         at->origin, (double)partial, c->head_dim);
    if (get_bool(at, root, "tie_word_embeddings", false, &c->tie_word_embeddings) ||
        get_bool(at, root, "attention_bias", false, &c->attention_bias))
        return -1;
    /* transformers gives o_proj the same bias flag (Llama, OLMo 2, Granite, GPT-OSS). */
    c->o_bias = c->attention_bias;
    return 0;
}

/* A *ForSequenceClassification checkpoint (architectures) has a score head instead of an LM
 * head: its outputs are the labels of id2label (transformers saves num_labels only that way;
 * its default is 2). */
static int parse_labels(const cfg_at *at, json_t *root, io_model_config *c) {
    static const char suffix[] = "ForSequenceClassification";
    json_t *archs = field(root, "architectures"), *a;
    size_t i;
    bool seq_cls = false;
    json_array_foreach(archs, i, a) {
        const char *name = json_string_value(a);
        size_t n = name ? strlen(name) : 0;
        if (n >= sizeof suffix - 1 && strcmp(name + n - (sizeof suffix - 1), suffix) == 0)
            seq_cls = true;
    }
    if (!seq_cls) return 0;
    json_t *labels = field(root, "id2label");
    if (labels && !json_is_object(labels))
        return field_fail(at, "id2label", "must be an object", labels);
    c->num_labels = labels ? (int)json_object_size(labels) : 2;
    if (c->num_labels < 1)
        return field_fail(at, "id2label", "must name at least one label", labels);
    return 0;
}

/* Phi-3's longrope lists cover the rotated dims, one factor per frequency. */
static int check_longrope(const cfg_at *at, const io_model_config *c) {
    const io_rope_scaling *rs = &c->rope_scaling;
    if (rs->type != IO_ROPE_LONGROPE || rs->n_factors == c->rotary_dim / 2) return 0;
    return base_fail(at->err,
                     "%s: field 'rope_scaling.short_factor' has %d entries, expected %d (half "
                     "the rotated dims)",
                     at->origin, rs->n_factors, c->rotary_dim / 2);
}

int io_config_parse_json(json_t *root, const char *origin, io_model_config *cfg, base_err *err) {
    memset(cfg, 0, sizeof *cfg);
    cfg_at at = {origin, "", err};
    if (!json_is_object(root)) return base_fail(err, "%s: must be a JSON object", origin);
    json_t *text = io_config_text(root);
    cfg_at tat = {origin, text == root ? "" : "text_config.", err};
    cfg->act = IO_ACT_SILU;
    cfg->embed_scale = cfg->residual_scale = cfg->logits_scale = 1.0f;
    int rc = parse_model_type(&at, root, cfg);
    if (rc == 0) rc = parse_shapes(&tat, text, cfg);
    if (rc == 0) rc = parse_rope_all(&tat, text, cfg);
    if (rc == 0) rc = check_longrope(&tat, cfg);
    /* Vision-language checkpoints keep the end-of-sequence ids at the top level. */
    if (rc == 0)
        rc = parse_tokens(field(root, "eos_token_id") ? &at : &tat,
                          field(root, "eos_token_id") ? root : text, cfg);
    if (rc == 0) rc = parse_dtype(&at, root, &cfg->torch_dtype);
    if (rc == 0) rc = parse_quant(&at, root, cfg);
    if (rc == 0) rc = parse_labels(&at, root, cfg);
    if (rc != 0) io_config_free(cfg);
    return rc;
}

json_t *io_config_text(json_t *root) {
    json_t *t = json_object_get(root, "text_config");
    return json_is_object(t) ? t : root;
}

int io_config_read_json(const char *dir, json_t **root, char **origin, base_err *err) {
    *root = NULL;
    *origin = base_path_join(dir, "config.json");
    char *text = NULL;
    if (base_read_file(*origin, &text, NULL, err)) return -1;
    json_error_t jerr;
    *root = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!*root) return base_fail(err, "%s: line %d: %s", *origin, jerr.line, jerr.text);
    return 0;
}

static void rope_free(io_rope_scaling *rs) {
    free(rs->short_factor);
    free(rs->long_factor);
}

void io_config_free(io_model_config *cfg) {
    for (int i = 0; i < cfg->n_quant_overrides; i++) free(cfg->quant_overrides[i].module);
    free(cfg->quant_overrides);
    free(cfg->layer_local);
    free(cfg->layer_moe);
    rope_free(&cfg->rope_scaling);
    rope_free(&cfg->rope_local_scaling);
    memset(cfg, 0, sizeof *cfg);
}

io_quant_spec io_config_quant_for(const io_model_config *cfg, const char *module) {
    for (int i = 0; i < cfg->n_quant_overrides; i++) {
        if (strcmp(cfg->quant_overrides[i].module, module) == 0)
            return cfg->quant_overrides[i].spec;
    }
    return cfg->quant;
}

/* ---- reads for the family descriptors ---- */

static cfg_at at_of(const io_cfg_at *a) {
    return (cfg_at){a->origin, a->prefix ? a->prefix : "", a->err};
}

bool io_cfg_has(const io_cfg_at *at, const char *key) {
    return field(at->obj, key) != NULL;
}

int io_cfg_int(const io_cfg_at *at, const char *key, int def, int *out) {
    cfg_at a = at_of(at);
    return get_int(&a, at->obj, key, false, def, out);
}

int io_cfg_pos_int(const io_cfg_at *at, const char *key, int def, int *out) {
    cfg_at a = at_of(at);
    return get_pos_int(&a, at->obj, key, false, def, out);
}

int io_cfg_float(const io_cfg_at *at, const char *key, float def, float *out) {
    cfg_at a = at_of(at);
    return get_float(&a, at->obj, key, def, out);
}

int io_cfg_pos_float(const io_cfg_at *at, const char *key, float def, float *out) {
    cfg_at a = at_of(at);
    return get_pos_float(&a, at->obj, key, false, def, out);
}

int io_cfg_bool(const io_cfg_at *at, const char *key, bool def, bool *out) {
    cfg_at a = at_of(at);
    return get_bool(&a, at->obj, key, def, out);
}

int io_cfg_str_is(const io_cfg_at *at, const char *key, const char *want, bool *out) {
    cfg_at a = at_of(at);
    json_t *v = field(at->obj, key);
    *out = false;
    if (!v) return 0;
    if (!json_is_string(v)) return field_fail(&a, key, "must be a string", v);
    *out = strcmp(json_string_value(v), want) == 0;
    return 0;
}

int io_cfg_layer_types(const io_cfg_at *at, int n, bool *local, bool *present) {
    cfg_at a = at_of(at);
    json_t *v = field(at->obj, "layer_types");
    *present = v != NULL;
    if (!v) return 0;
    if (!json_is_array(v) || json_array_size(v) != (size_t)n)
        return field_fail(&a, "layer_types", "must list one type per layer", v);
    for (int i = 0; i < n; i++) {
        const char *t = json_string_value(json_array_get(v, (size_t)i));
        if (t && strcmp(t, "sliding_attention") == 0)
            local[i] = true;
        else if (t && strcmp(t, "full_attention") == 0)
            local[i] = false;
        else
            return field_fail(&a, "layer_types",
                              "must hold \"sliding_attention\" or \"full_attention\"", NULL);
    }
    return 0;
}

int io_cfg_fail(const io_cfg_at *at, const char *key, const char *what) {
    cfg_at a = at_of(at);
    return field_fail(&a, key, what, NULL);
}
