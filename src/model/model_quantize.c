/* Converts a dense (bf16/f16/f32) checkpoint to MLX affine quantization, as mlx-lm writes it:
 * every Linear and Embedding weight whose input size is a multiple of the group size becomes
 * `weight` (uint32, each row a little-endian bit stream), `scales` and `biases` (the weight's
 * dtype); everything else is copied; config.json gains `quantization` and
 * `quantization_config`. Per group the scale and bias follow MLX's affine rule (the edge of
 * larger magnitude is represented exactly, and zero stays exact when it can), computed as
 * MLX's CPU kernel does, so that the output is byte for byte what MLX writes. */
#include "model/arch/arch.h"
#include "model/model.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Quantizes one group of n floats as MLX's CPU kernel does, in float32: fills q (n values in
 * [0, 2^bits - 1]), scale and bias. The codes come from the float32 scale and bias; the
 * caller stores those rounded to the weight dtype, as MLX does. */
static void quantize_group(const float *w, int n, int bits, uint32_t *q, float *scale_out,
                           float *bias_out) {
    float lo = w[0], hi = w[0];
    for (int i = 1; i < n; i++) {
        lo = w[i] < lo ? w[i] : lo;
        hi = w[i] > hi ? w[i] : hi;
    }
    float n_bins = (float)((1u << bits) - 1);
    bool min_edge = fabsf(lo) > fabsf(hi);
    float scale = (hi - lo) / n_bins;
    if (scale < 1e-7f) scale = 1e-7f;
    if (!min_edge) scale = -scale;
    float edge = min_edge ? lo : hi;
    float q0 = rintf(edge / scale);
    if (q0 != 0) scale = edge / q0;
    float bias = q0 == 0 ? 0.0f : edge;
    for (int i = 0; i < n; i++) {
        float v = rintf((w[i] - bias) / scale);
        q[i] = v < 0 ? 0 : v > n_bins ? (uint32_t)n_bins : (uint32_t)v;
    }
    *scale_out = scale;
    *bias_out = bias;
}

/* Appends `bits` bits of v at bit offset *pos of the little-endian stream `out`. */
static void put_bits(uint8_t *out, uint64_t *pos, uint32_t v, int bits) {
    for (int b = 0; b < bits; b++, (*pos)++)
        if (v >> b & 1) out[*pos >> 3] |= (uint8_t)(1u << (*pos & 7));
}

typedef struct quant_out {
    void *packed, *scales, *biases;
} quant_out;

static void quantize_matrix(const io_tensor *t, int bits, int group, quant_out *o) {
    int64_t rows = t->shape[0], cols = t->shape[1], groups = cols / group;
    size_t es = base_dtype_size(t->dtype);
    size_t row_bytes = (size_t)cols * bits / 8;
    o->packed = base_xcalloc((size_t)rows, row_bytes);
    o->scales = base_xmalloc((size_t)(rows * groups) * es);
    o->biases = base_xmalloc((size_t)(rows * groups) * es);
    float *w = base_xmalloc((size_t)group * sizeof *w);
    uint32_t *q = base_xmalloc((size_t)group * sizeof *q);
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *row = (uint8_t *)o->packed + (size_t)r * row_bytes;
        uint64_t pos = 0;
        for (int64_t g = 0; g < groups; g++) {
            for (int i = 0; i < group; i++)
                w[i] = base_load_float(t->data, t->dtype, (size_t)(r * cols + g * group + i));
            float s, b;
            quantize_group(w, group, bits, q, &s, &b);
            base_store_float(o->scales, t->dtype, (size_t)(r * groups + g), s);
            base_store_float(o->biases, t->dtype, (size_t)(r * groups + g), b);
            for (int i = 0; i < group; i++) put_bits(row, &pos, q[i], bits);
        }
    }
    free(w);
    free(q);
}

/* True for the weights mlx-lm quantizes: Linear and Embedding layers. */
static bool is_quantizable(const io_tensor *t, int group) {
    static const char *const suffixes[] = {
        "q_proj.weight",    "k_proj.weight",       "v_proj.weight",
        "o_proj.weight",    "gate_proj.weight",    "up_proj.weight",
        "down_proj.weight", "embed_tokens.weight", NULL};
    if (t->ndim != 2 || t->shape[1] % group != 0) return false;
    if (strcmp(t->name, "lm_head.weight") == 0) return true;
    size_t n = strlen(t->name);
    for (int i = 0; suffixes[i]; i++) {
        size_t m = strlen(suffixes[i]);
        if (n >= m && strcmp(t->name + n - m, suffixes[i]) == 0) return true;
    }
    return false;
}

static int write_config(const char *in_dir, const char *out_dir, int bits, int group,
                        base_err *err) {
    char *in = base_path_join(in_dir, "config.json"), *out = base_path_join(out_dir, "config.json");
    json_error_t jerr;
    json_t *cfg = json_load_file(in, 0, &jerr);
    int rc = 0;
    if (!cfg) {
        rc = base_fail(err, "%s: line %d: %s", in, jerr.line, jerr.text);
    } else {
        for (int i = 0; i < 2; i++) {
            json_t *q =
                json_pack("{s:i, s:i, s:s}", "group_size", group, "bits", bits, "mode", "affine");
            json_object_set_new(cfg, i ? "quantization_config" : "quantization", q);
        }
        if (json_dump_file(cfg, out, JSON_INDENT(2) | JSON_PRESERVE_ORDER))
            rc = base_fail(err, "%s: cannot write", out);
        json_decref(cfg);
    }
    free(in);
    free(out);
    return rc;
}

static int copy_file(const char *in_dir, const char *out_dir, const char *name, base_err *err) {
    char *src = base_path_join(in_dir, name), *dst = base_path_join(out_dir, name);
    int rc = 0;
    if (base_file_exists(src)) {
        char *data;
        size_t len;
        rc = base_read_file(src, &data, &len, err);
        if (rc == 0) {
            FILE *f = fopen(dst, "wb");
            if (!f || fwrite(data, 1, len, f) != len) rc = base_fail(err, "%s: cannot write", dst);
            if (f && fclose(f) != 0 && rc == 0) rc = base_fail(err, "%s: cannot write", dst);
            free(data);
        }
    }
    free(src);
    free(dst);
    return rc;
}

int model_quantize(const char *in_dir, const char *out_dir, int bits, int group, base_err *err) {
    if (bits != 2 && bits != 3 && bits != 4 && bits != 5 && bits != 6 && bits != 8)
        return base_fail(err, "--bits: %d is not supported (2, 3, 4, 5, 6 or 8)", bits);
    if (group != 32 && group != 64 && group != 128)
        return base_fail(err, "--group-size: %d is not supported (32, 64 or 128)", group);
    io_model_config cfg;
    if (model_config_load(in_dir, &cfg, NULL, err)) return -1;
    bool already = cfg.quant.bits != 0;
    io_config_free(&cfg);
    if (already) return base_fail(err, "%s: the checkpoint is already quantized", in_dir);
    if (!base_dir_exists(out_dir)) return base_fail(err, "%s: no such directory", out_dir);
    io_checkpoint *ck;
    if (io_checkpoint_open_dir(in_dir, &ck, err)) return -1;
    size_t n = io_checkpoint_count(ck), n_out = 0;
    io_tensor_out *outs = base_xcalloc(n * 3, sizeof *outs);
    void **owned = base_xcalloc(n * 3, sizeof *owned);
    char **names = base_xcalloc(n * 3, sizeof *names);
    size_t n_owned = 0, n_names = 0;
    for (size_t i = 0; i < n; i++) {
        const io_tensor *t = io_checkpoint_at(ck, i);
        bool is_float =
            t->dtype == BASE_DTYPE_F32 || t->dtype == BASE_DTYPE_F16 || t->dtype == BASE_DTYPE_BF16;
        if (!is_float || !is_quantizable(t, group)) {
            outs[n_out++] = (io_tensor_out){t->name, t->dtype, t->ndim, {0}, t->data};
            memcpy(outs[n_out - 1].shape, t->shape, sizeof t->shape);
            continue;
        }
        quant_out q;
        quantize_matrix(t, bits, group, &q);
        size_t base_len = strlen(t->name) - strlen("weight");
        const char *suffix[3] = {"weight", "scales", "biases"};
        void *data[3] = {q.packed, q.scales, q.biases};
        for (int k = 0; k < 3; k++) {
            char *name = base_xmalloc(base_len + 8);
            memcpy(name, t->name, base_len);
            strcpy(name + base_len, suffix[k]);
            names[n_names++] = name;
            owned[n_owned++] = data[k];
            io_tensor_out *o = &outs[n_out++];
            *o = (io_tensor_out){name, k ? t->dtype : BASE_DTYPE_U32, 2, {t->shape[0]}, data[k]};
            o->shape[1] = k ? t->shape[1] / group : t->shape[1] * bits / 32;
        }
    }
    char *path = base_path_join(out_dir, "model.safetensors");
    const char *meta[] = {"format", "mlx"};
    int rc = io_safetensors_write(path, outs, n_out, meta, 1, err);
    free(path);
    for (size_t i = 0; i < n_owned; i++) free(owned[i]);
    for (size_t i = 0; i < n_names; i++) free(names[i]);
    free(owned);
    free(names);
    free(outs);
    io_checkpoint_close(ck);
    static const char *const extra[] = {"tokenizer.json",          "tokenizer_config.json",
                                        "special_tokens_map.json", "generation_config.json",
                                        "chat_template.jinja",     NULL};
    if (rc == 0) rc = write_config(in_dir, out_dir, bits, group, err);
    for (int i = 0; extra[i] && rc == 0; i++) rc = copy_file(in_dir, out_dir, extra[i], err);
    return rc;
}
