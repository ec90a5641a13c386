/* Converts a dense (bf16/f16/f32) checkpoint to MLX quantization, as mlx-lm's convert writes
 * it: every Linear and Embedding weight (and a MoE family's stacked experts, [experts, out,
 * in], quantized along the last axis) whose input size is a multiple of the group size becomes
 * `weight` (uint32, each row a little-endian bit stream) and `scales`, plus `biases` in affine
 * mode; everything else is copied; config.json gains `quantization` and
 * `quantization_config`. A MoE family's routers stay at 8 bits affine, group 64 (mlx-lm's
 * quant_predicate for qwen3_moe, mixtral and gpt_oss), written as per-module entries.
 *
 * Affine: per group the scale and bias follow MLX's affine rule (the edge of larger magnitude
 * is represented exactly, and zero stays exact when it can), computed as MLX's CPU kernel
 * does, so that the output is byte for byte what MLX writes.
 *
 * MXFP4: as MLX's GPU kernels (Metal and CUDA) write it: the E8M0 scale is the smallest power
 * of two at or above the group's largest magnitude / 6, so that no value saturates, and each
 * value / scale rounds to the nearest E2M1 value, ties to the even code, keeping its sign bit
 * (a small negative value becomes -0). MLX's CPU fallback differs (scale exponent rounded to
 * nearest in the weight dtype, ties to the smaller magnitude); checkpoints come from the
 * GPU. */
#include "model/arch/arch.h"
#include "model/model.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* mlx-lm's quant_predicate for the MoE families' routers. */
static const io_quant_spec g_router_spec = {8, 64, IO_QUANT_AFFINE};

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

/* The E8M0 byte of the smallest power of two >= x, exponent within [-127, 127]; 0xFF (NaN)
 * for a non-finite x, as MLX writes it. */
static uint8_t e8m0_at_least(float x) {
    if (!isfinite(x)) return 0xFF;
    if (x <= 0) return 0;
    int e;
    float f = frexpf(x, &e); /* x = f * 2^e, f in [0.5, 1) */
    int n = f == 0.5f ? e - 1 : e;
    n = n < -127 ? -127 : n > 127 ? 127 : n;
    return (uint8_t)(n + 127);
}

/* The E2M1 code of x: bit 3 the sign, bits 0-2 the nearest magnitude, a tie going to the even
 * code; beyond 6 saturates; NaN is 7. */
static uint8_t e2m1_code(float x) {
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    if (isnan(x)) return 7;
    float a = fabsf(x);
    uint8_t code = 0;
    for (int k = 1; k < 8; k++) {
        float mid = 0.5f * (mag[k - 1] + mag[k]);
        if (a > mid || (a == mid && k % 2 == 0)) code = (uint8_t)k;
    }
    return (uint8_t)(code | (signbit(x) ? 8 : 0));
}

/* One MXFP4 group of 32: two codes a byte, the first in the low nibble (so eight to a
 * little-endian uint32, lowest nibble first). */
static void mxfp4_group(const float *w, uint8_t *packed, uint8_t *scale_byte) {
    float amax = 0;
    for (int i = 0; i < 32; i++) amax = fabsf(w[i]) > amax ? fabsf(w[i]) : amax;
    *scale_byte = e8m0_at_least(amax / 6.0f);
    /* 2^(byte - 127): byte 0 is 2^-127 (a float32 subnormal), 0xFF infinity. */
    float inv = 1.0f / ldexpf(1.0f, (int)*scale_byte - 127);
    for (int i = 0; i < 32; i += 2)
        packed[i / 2] = (uint8_t)(e2m1_code(w[i] * inv) | e2m1_code(w[i + 1] * inv) << 4);
}

typedef struct quant_out {
    void *packed, *scales, *biases; /* biases NULL for mxfp4 */
} quant_out;

/* Quantizes t ([..., cols], the leading axes as rows) group by group along its last axis. */
static void quantize_tensor(const io_tensor *t, io_quant_spec spec, quant_out *o) {
    int64_t cols = t->shape[t->ndim - 1], rows = 1, groups = cols / spec.group_size;
    for (int d = 0; d + 1 < t->ndim; d++) rows *= t->shape[d];
    bool mx = spec.mode == IO_QUANT_MXFP4;
    size_t es = mx ? 1 : base_dtype_size(t->dtype);
    size_t row_bytes = (size_t)cols * (size_t)spec.bits / 8;
    o->packed = base_xcalloc((size_t)rows, row_bytes);
    o->scales = base_xmalloc((size_t)(rows * groups) * es);
    o->biases = mx ? NULL : base_xmalloc((size_t)(rows * groups) * es);
    float *w = base_xmalloc((size_t)spec.group_size * sizeof *w);
    uint32_t *q = base_xmalloc((size_t)spec.group_size * sizeof *q);
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *row = (uint8_t *)o->packed + (size_t)r * row_bytes;
        uint64_t pos = 0;
        for (int64_t g = 0; g < groups; g++) {
            size_t at = (size_t)(r * cols + g * spec.group_size), gi = (size_t)(r * groups + g);
            for (int i = 0; i < spec.group_size; i++)
                w[i] = base_load_float(t->data, t->dtype, at + (size_t)i);
            if (mx) {
                mxfp4_group(w, row + g * 16, (uint8_t *)o->scales + gi);
                continue;
            }
            float s, b;
            quantize_group(w, spec.group_size, spec.bits, q, &s, &b);
            base_store_float(o->scales, t->dtype, gi, s);
            base_store_float(o->biases, t->dtype, gi, b);
            for (int i = 0; i < spec.group_size; i++) put_bits(row, &pos, q[i], spec.bits);
        }
    }
    free(w);
    free(q);
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* "<anything>.<part>.<tail>": part (a module path such as "mlp.gate") as whole components
 * right before tail. */
static bool names_module(const char *name, const char *part, const char *tail) {
    char want[128];
    snprintf(want, sizeof want, ".%s.%s", part, tail);
    return ends_with(name, want);
}

/* The spec mlx-lm's convert gives tensor t, or bits 0 where it leaves t as it is: Linear and
 * Embedding weights and stacked experts at `spec`, routers at 8 bits, when their input size
 * is a multiple of the group size. *router says t is a router. */
static io_quant_spec weight_spec(const io_tensor *t, const model_names *names, io_quant_spec spec,
                                 bool *router) {
    static const char *const suffixes[] = {
        "q_proj.weight",    "k_proj.weight",       "v_proj.weight",
        "o_proj.weight",    "gate_proj.weight",    "up_proj.weight",
        "down_proj.weight", "embed_tokens.weight", NULL};
    static const io_quant_spec dense = {0, 0, IO_QUANT_AFFINE};
    *router = false;
    bool is_float =
        t->dtype == BASE_DTYPE_F32 || t->dtype == BASE_DTYPE_F16 || t->dtype == BASE_DTYPE_BF16;
    if (!is_float || t->ndim < 2 || t->shape[t->ndim - 1] % spec.group_size != 0) return dense;
    if (t->ndim == 2 && names->router && names_module(t->name, names->router, "weight")) {
        *router = true;
        return t->shape[1] % g_router_spec.group_size == 0 ? g_router_spec : dense;
    }
    bool stacked = names->experts && strstr(t->name, names->experts);
    if (t->ndim != (stacked ? 3 : 2)) return dense;
    if (strcmp(t->name, "lm_head.weight") == 0) return spec;
    for (int i = 0; suffixes[i]; i++)
        if (ends_with(t->name, suffixes[i])) return spec;
    return dense;
}

/* A MoE family's experts left other than stacked as mlx-lm writes them (<experts>.gate_proj.weight
 * [experts, out, in] and its bias) once model_checkpoint_open has stacked the Hugging Face
 * layouts it knows: quantizing these as mlx-lm would needs its sanitize step first. */
static bool unstacked_expert(const io_tensor *t, const model_names *names) {
    if (!names->experts || !strstr(t->name, "experts")) return false;
    if (!strstr(t->name, names->experts)) return true;
    return !ends_with(t->name, "_proj.weight") && !ends_with(t->name, "_proj.bias");
}

/* config.json with `quantization` (and its Hugging Face copy `quantization_config`): the
 * default spec, then one entry per router (8 bits affine, group 64, as mlx-lm writes a
 * quant_predicate's answer: no mode key, which mlx-lm reads as affine). */
static int write_config(const char *in_dir, const char *out_dir, io_quant_spec spec,
                        char *const *routers, size_t n_routers, base_err *err) {
    char *in = base_path_join(in_dir, "config.json"), *out = base_path_join(out_dir, "config.json");
    json_error_t jerr;
    json_t *cfg = json_load_file(in, 0, &jerr);
    int rc = 0;
    if (!cfg) {
        rc = base_fail(err, "%s: line %d: %s", in, jerr.line, jerr.text);
    } else {
        const char *mode = spec.mode == IO_QUANT_MXFP4 ? "mxfp4" : "affine";
        for (int i = 0; i < 2; i++) {
            json_t *q = json_pack("{s:i, s:i, s:s}", "group_size", spec.group_size, "bits",
                                  spec.bits, "mode", mode);
            for (size_t r = 0; r < n_routers; r++)
                json_object_set_new(q, routers[r],
                                    json_pack("{s:i, s:i}", "group_size", g_router_spec.group_size,
                                              "bits", g_router_spec.bits));
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

static int check_spec(io_quant_spec spec, base_err *err) {
    if (spec.mode == IO_QUANT_MXFP4) {
        if (spec.bits != 4)
            return base_fail(err, "--bits: %d is not supported with --mode mxfp4 (4 only)",
                             spec.bits);
        if (spec.group_size != 32)
            return base_fail(err, "--group-size: %d is not supported with --mode mxfp4 (32 only)",
                             spec.group_size);
        return 0;
    }
    int bits = spec.bits, group = spec.group_size;
    if (bits != 2 && bits != 3 && bits != 4 && bits != 5 && bits != 6 && bits != 8)
        return base_fail(err, "--bits: %d is not supported (2, 3, 4, 5, 6 or 8)", bits);
    if (group != 32 && group != 64 && group != 128)
        return base_fail(err, "--group-size: %d is not supported (32, 64 or 128)", group);
    return 0;
}

/* The tensors of the quantized checkpoint, and what they own. */
typedef struct quant_set {
    io_tensor_out *outs;
    void **owned;
    char **names;   /* the new tensors' names */
    char **routers; /* the routers' module paths, for config.json */
    size_t n_out, n_owned, n_names, n_routers;
} quant_set;

static void quant_set_free(quant_set *s) {
    for (size_t i = 0; i < s->n_owned; i++) free(s->owned[i]);
    for (size_t i = 0; i < s->n_names; i++) free(s->names[i]);
    for (size_t i = 0; i < s->n_routers; i++) free(s->routers[i]);
    free(s->owned);
    free(s->names);
    free(s->routers);
    free(s->outs);
}

/* Adds t's quantized tensors: <module>.weight (U32), .scales and, in affine mode, .biases. */
static void add_quantized(quant_set *s, const io_tensor *t, io_quant_spec spec) {
    quant_out q;
    quantize_tensor(t, spec, &q);
    size_t base_len = strlen(t->name) - strlen("weight");
    const char *suffix[3] = {"weight", "scales", "biases"};
    void *data[3] = {q.packed, q.scales, q.biases};
    base_dtype dt[3] = {BASE_DTYPE_U32, spec.mode == IO_QUANT_MXFP4 ? BASE_DTYPE_U8 : t->dtype,
                        t->dtype};
    int64_t cols = t->shape[t->ndim - 1];
    int64_t last[3] = {cols * spec.bits / 32, cols / spec.group_size, cols / spec.group_size};
    for (int k = 0; k < (q.biases ? 3 : 2); k++) {
        char *name = base_xmalloc(base_len + 8);
        memcpy(name, t->name, base_len);
        strcpy(name + base_len, suffix[k]);
        s->names[s->n_names++] = name;
        s->owned[s->n_owned++] = data[k];
        io_tensor_out *o = &s->outs[s->n_out++];
        *o = (io_tensor_out){name, dt[k], t->ndim, {0}, data[k]};
        memcpy(o->shape, t->shape, sizeof t->shape);
        o->shape[t->ndim - 1] = last[k];
    }
}

int model_quantize(const char *in_dir, const char *out_dir, io_quant_spec spec, base_err *err) {
    if (check_spec(spec, err)) return -1;
    io_model_config cfg;
    const model_arch *arch;
    if (model_config_load(in_dir, &cfg, &arch, err)) return -1;
    io_checkpoint *ck = NULL;
    int rc = 0;
    if (cfg.quant.bits != 0)
        rc = base_fail(err, "%s: the checkpoint is already quantized", in_dir);
    else if (!base_dir_exists(out_dir))
        rc = base_fail(err, "%s: no such directory", out_dir);
    else /* experts in a Hugging Face layout come out stacked, as mlx-lm's sanitize leaves them */
        rc = model_checkpoint_open(in_dir, &cfg, true, &ck, err);
    io_config_free(&cfg);
    if (rc) return -1;
    size_t n = io_checkpoint_count(ck);
    quant_set s = {.outs = base_xcalloc(n * 3, sizeof *s.outs),
                   .owned = base_xcalloc(n * 3, sizeof *s.owned),
                   .names = base_xcalloc(n * 3, sizeof *s.names),
                   .routers = base_xcalloc(n, sizeof *s.routers)};
    for (size_t i = 0; i < n; i++) {
        const io_tensor *t = io_checkpoint_at(ck, i);
        if (unstacked_expert(t, &arch->names)) {
            rc = base_fail(err,
                           "%s: tensor %s: experts in a per-expert or fused layout; quantize "
                           "takes them stacked as mlx-lm writes them (%s.gate_proj.weight "
                           "[experts, out, in])",
                           t->file, t->name, arch->names.experts);
            break;
        }
        bool router;
        io_quant_spec ts = weight_spec(t, &arch->names, spec, &router);
        if (ts.bits == 0) {
            s.outs[s.n_out++] = (io_tensor_out){t->name, t->dtype, t->ndim, {0}, t->data};
            memcpy(s.outs[s.n_out - 1].shape, t->shape, sizeof t->shape);
            continue;
        }
        if (router) {
            size_t len = strlen(t->name) - strlen(".weight");
            s.routers[s.n_routers] = base_xmalloc(len + 1);
            memcpy(s.routers[s.n_routers], t->name, len);
            s.routers[s.n_routers++][len] = '\0';
        }
        add_quantized(&s, t, ts);
    }
    if (rc == 0) {
        char *path = base_path_join(out_dir, "model.safetensors");
        const char *meta[] = {"format", "mlx"};
        rc = io_safetensors_write(path, s.outs, s.n_out, meta, 1, err);
        free(path);
    }
    io_checkpoint_close(ck);
    static const char *const extra[] = {"tokenizer.json",          "tokenizer_config.json",
                                        "special_tokens_map.json", "generation_config.json",
                                        "chat_template.jinja",     NULL};
    if (rc == 0) rc = write_config(in_dir, out_dir, spec, s.routers, s.n_routers, err);
    quant_set_free(&s);
    for (int i = 0; extra[i] && rc == 0; i++) rc = copy_file(in_dir, out_dir, extra[i], err);
    return rc;
}
