/* Experts in Hugging Face's layout (model_experts.c): the dense MoE fixtures rewritten from
 * mlx-lm's stacked layout into the one transformers loads (experts.N.gate_proj, Mixtral's
 * experts.N.w1/w3/w2, GPT-OSS's fused gate_up_proj with gate and up interleaved and down_proj
 * [experts, in, out], with their _bias), by the mapping tools/reference/make_moe_fixtures.py
 * hands transformers when it makes the fixtures' reference. Each rewrite must load to logits
 * identical to the stacked fixture's and within 1e-3 of transformers', count the same decode
 * bytes from its headers and quantize to the same tensors; a missing expert, a quantized one
 * and OpenAI's MXFP4 blocks are refused by name. */
#include "fixture_ref.h"
#include "test_file.h"

#include "engine/engine_test_runtime.h"
#include "model/arch/arch.h"
#include "model/model.h"

#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

/* How the rewrite may be spoiled, to see the loader refuse it. */
typedef enum { WRITE_WHOLE, WRITE_DROP_EXPERT, WRITE_QUANTIZED_EXPERT, WRITE_BLOCKS } write_mode;

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* The tensors of ck under Hugging Face's names into out (a malloc'd copy where the layout
 * changes; freed through bufs). */
typedef struct hf_out {
    io_tensor_out t[512];
    size_t n;
    void *bufs[128];
    size_t n_bufs;
    char *names[512];
    size_t n_names;
} hf_out;

static char *keep_name(hf_out *o, const char *s) {
    return o->names[o->n_names++] = base_xstrdup(s);
}

static void *keep_buf(hf_out *o, size_t bytes) {
    return o->bufs[o->n_bufs++] = calloc(1, bytes + 1);
}

static void add(hf_out *o, const char *name, base_dtype dt, int ndim, const int64_t *shape,
                const void *data) {
    io_tensor_out *t = &o->t[o->n++];
    *t = (io_tensor_out){.name = keep_name(o, name), .dtype = dt, .ndim = ndim, .data = data};
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
}

/* One stacked [E, out, in] tensor as E tensors [out, in] (pointers into its data). */
static void per_expert(hf_out *o, const io_tensor *t, const char *p, const model_names *nm,
                       int proj, write_mode mode) {
    const int64_t E = t->shape[0], shape[2] = {t->shape[1], t->shape[2]};
    const size_t bytes = t->nbytes / (size_t)E;
    char name[320];
    for (int64_t e = 0; e < E; e++) {
        if (mode == WRITE_DROP_EXPERT && e == 1 && proj == 1) continue;
        snprintf(name, sizeof name, "%s%s.%lld.%s.weight", p, nm->hf_experts, (long long)e,
                 nm->hf_proj[proj]);
        const bool quant = mode == WRITE_QUANTIZED_EXPERT && e == 1 && proj == 1;
        const int64_t qshape[2] = {shape[0], shape[1] * (int64_t)base_dtype_size(t->dtype) / 4};
        add(o, name, quant ? BASE_DTYPE_U32 : t->dtype, 2, quant ? qshape : shape,
            (const char *)t->data + (size_t)e * bytes);
    }
}

static const io_tensor *find(const io_checkpoint *ck, const char *p, const char *experts,
                             const char *what) {
    char name[320];
    snprintf(name, sizeof name, "%s%s.%s", p, experts, what);
    const io_tensor *t = io_checkpoint_find(ck, name);
    CHECK_MSG(t != NULL, "fixture lacks %s", name);
    return t;
}

/* Layer prefix p's stacked GPT-OSS experts as gate_up_proj [E, h, 2I] (gate at even columns,
 * up at odd ones), down_proj [E, I, h] and their biases: make_moe_fixtures.py's hf_weights. */
static void fused(hf_out *o, const io_checkpoint *ck, const char *p, const model_names *nm,
                  write_mode mode) {
    const io_tensor *g = find(ck, p, nm->experts, "gate_proj.weight"),
                    *u = find(ck, p, nm->experts, "up_proj.weight"),
                    *d = find(ck, p, nm->experts, "down_proj.weight"),
                    *gb = find(ck, p, nm->experts, "gate_proj.bias"),
                    *ub = find(ck, p, nm->experts, "up_proj.bias"),
                    *db = find(ck, p, nm->experts, "down_proj.bias");
    if (!g || !u || !d || !gb || !ub || !db) return;
    const int64_t E = g->shape[0], I = g->shape[1], h = g->shape[2];
    const size_t es = base_dtype_size(g->dtype), bs = base_dtype_size(gb->dtype);
    char *gu = keep_buf(o, (size_t)(E * h * 2 * I) * es), *dn = keep_buf(o, d->nbytes),
         *gub = keep_buf(o, (size_t)(E * 2 * I) * bs);
    for (int64_t e = 0; e < E; e++) {
        for (int64_t i = 0; i < I; i++)
            for (int64_t k = 0; k < h; k++)
                for (int s = 0; s < 2; s++)
                    memcpy(gu + (size_t)((e * h + k) * 2 * I + 2 * i + s) * es,
                           (const char *)(s ? u : g)->data + (size_t)((e * I + i) * h + k) * es,
                           es);
        for (int64_t o2 = 0; o2 < h; o2++)
            for (int64_t i = 0; i < I; i++)
                memcpy(dn + (size_t)((e * I + i) * h + o2) * es,
                       (const char *)d->data + (size_t)((e * h + o2) * I + i) * es, es);
        for (int64_t i = 0; i < I; i++)
            for (int s = 0; s < 2; s++)
                memcpy(gub + (size_t)(e * 2 * I + 2 * i + s) * bs,
                       (const char *)(s ? ub : gb)->data + (size_t)(e * I + i) * bs, bs);
    }
    char name[320];
    const int64_t s_gu[3] = {E, h, 2 * I}, s_dn[3] = {E, I, h}, s_gub[2] = {E, 2 * I},
                  s_db[2] = {E, h};
    /* OpenAI's release names its MXFP4 codes gate_up_proj_blocks */
    snprintf(name, sizeof name, "%s%s.gate_up_proj%s", p, nm->experts,
             mode == WRITE_BLOCKS ? "_blocks" : "");
    add(o, name, g->dtype, 3, s_gu, gu);
    snprintf(name, sizeof name, "%s%s.gate_up_proj_bias", p, nm->experts);
    add(o, name, gb->dtype, 2, s_gub, gub);
    snprintf(name, sizeof name, "%s%s.down_proj", p, nm->experts);
    add(o, name, d->dtype, 3, s_dn, dn);
    snprintf(name, sizeof name, "%s%s.down_proj_bias", p, nm->experts);
    add(o, name, db->dtype, 2, s_db, db->data);
}

/* The fixture in src rewritten into dir (model.safetensors and its reference files). */
static bool write_hf(const char *src, const char *dir, write_mode mode) {
    base_err err;
    io_model_config cfg;
    const model_arch *arch;
    io_checkpoint *ck;
    if (model_config_load(src, &cfg, &arch, &err) || io_checkpoint_open_dir(src, &ck, &err)) {
        CHECK_MSG(0, "%s: %s", src, err.msg);
        return false;
    }
    const model_names *nm = &arch->names;
    hf_out *o = calloc(1, sizeof *o);
    for (size_t i = 0; i < io_checkpoint_count(ck); i++) {
        const io_tensor *t = io_checkpoint_at(ck, i);
        const char *at = strstr(t->name, nm->experts);
        if (!at || at[strlen(nm->experts)] != '.') {
            add(o, t->name, t->dtype, t->ndim, t->shape, t->data);
            continue;
        }
        char p[160];
        snprintf(p, sizeof p, "%.*s", (int)(at - t->name), t->name);
        if (nm->hf_gate_up) {
            if (ends_with(t->name, ".gate_proj.weight")) fused(o, ck, p, nm, mode);
            continue;
        }
        for (int proj = 0; proj < 3; proj++) {
            static const char *const stacked[3] = {".gate_proj.weight", ".up_proj.weight",
                                                   ".down_proj.weight"};
            if (ends_with(t->name, stacked[proj])) per_expert(o, t, p, nm, proj, mode);
        }
    }
    char *path = base_path_join(dir, "model.safetensors");
    bool ok = io_safetensors_write(path, o->t, o->n, NULL, 0, &err) == 0;
    CHECK_MSG(ok, "%s", err.msg);
    free(path);
    static const char *const copies[] = {"config.json", "reference.json", "logits.npy"};
    for (size_t i = 0; ok && i < sizeof copies / sizeof copies[0]; i++) {
        char *from = base_path_join(src, copies[i]), *to = base_path_join(dir, copies[i]);
        char *data = NULL;
        size_t len = 0;
        ok = base_read_file(from, &data, &len, &err) == 0;
        CHECK_MSG(ok, "%s", err.msg);
        FILE *f = ok ? fopen(to, "wb") : NULL;
        ok = f && fwrite(data, 1, len, f) == len;
        if (f) ok = fclose(f) == 0 && ok;
        CHECK_MSG(ok, "cannot write %s", to);
        if (data) free(data);
        free(from), free(to);
    }
    for (size_t i = 0; i < o->n_bufs; i++) free(o->bufs[i]);
    for (size_t i = 0; i < o->n_names; i++) free(o->names[i]);
    free(o);
    io_checkpoint_close(ck);
    io_config_free(&cfg);
    return ok;
}

static float *logits_of(const char *dir, const fixture_ref *ref) {
    base_err err;
    engine_options opts = test_cpu_options(ref->n_tokens + 1, 1, 32);
    engine_runtime *rt;
    float *got = NULL;
    if (engine_runtime_open(dir, &opts, &rt, &err) == 0) {
        CHECK_MSG(engine_prefill_logits(rt, ref->tokens, ref->n_tokens, &got, NULL, &err) == 0,
                  "%s: %s", dir, err.msg);
        engine_runtime_close(rt);
    } else {
        CHECK_MSG(0, "%s: %s", dir, err.msg);
    }
    return got;
}

static bool decode_bytes(const char *dir, model_decode_read *r) {
    base_err err;
    io_model_config cfg;
    io_checkpoint *ck = NULL;
    bool ok = model_config_load(dir, &cfg, NULL, &err) == 0;
    if (ok) {
        ok = model_checkpoint_open(dir, &cfg, false, &ck, &err) == 0 &&
             model_checkpoint_decode_bytes(&cfg, ck, r, &err) == 0;
        io_checkpoint_close(ck);
        io_config_free(&cfg);
    }
    CHECK_MSG(ok, "%s: %s", dir, err.msg);
    return ok;
}

/* in quantized into in/q; false (and a failed check) when it is not. */
static bool quantize_into(const char *in, io_quant_spec spec) {
    base_err err;
    char *out = base_path_join(in, "q");
    mkdir(out, 0755);
    bool ok = model_quantize(in, out, spec, &err) == 0;
    CHECK_MSG(ok, "%s: %s", in, err.msg);
    free(out);
    return ok;
}

/* Whether the checkpoints in a and b hold the same tensors, byte for byte (in any order). */
static bool same_tensors(const char *a, const char *b) {
    base_err err;
    io_checkpoint *ca = NULL, *cb = NULL;
    bool same = io_checkpoint_open_dir(a, &ca, &err) == 0 &&
                io_checkpoint_open_dir(b, &cb, &err) == 0 &&
                io_checkpoint_count(ca) == io_checkpoint_count(cb);
    for (size_t i = 0; same && i < io_checkpoint_count(ca); i++) {
        const io_tensor *x = io_checkpoint_at(ca, i), *y = io_checkpoint_find(cb, x->name);
        same = y && x->dtype == y->dtype && x->ndim == y->ndim && x->nbytes == y->nbytes &&
               memcmp(x->shape, y->shape, sizeof x->shape) == 0 &&
               memcmp(x->data, y->data, x->nbytes) == 0;
        if (!same) printf("  %s differs\n", x->name);
    }
    io_checkpoint_close(ca);
    io_checkpoint_close(cb);
    return same;
}

static void remove_quantized(const char *in) {
    static const char *const files[] = {"q/config.json", "q/model.safetensors"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char *p = base_path_join(in, files[i]);
        unlink(p);
        free(p);
    }
    char *q = base_path_join(in, "q");
    rmdir(q);
    free(q);
}

static void remove_dir(const char *dir) {
    static const char *const files[] = {"config.json", "reference.json", "logits.npy",
                                        "model.safetensors"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char *p = base_path_join(dir, files[i]);
        unlink(p);
        free(p);
    }
    rmdir(dir);
}

static void test_fixture(const char *name, io_quant_spec spec) {
    char *src = base_path_join(test_source_dir(), "tests/fixtures"),
         *from = base_path_join(src, name);
    char dir[] = "/tmp/mlxcel-hf-experts-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    fixture_ref ref;
    base_err err;
    if (write_hf(from, dir, WRITE_WHOLE) && fixture_ref_load(from, &ref, &err) == 0) {
        float *want = logits_of(from, &ref), *got = logits_of(dir, &ref);
        if (want && got) {
            const size_t n = (size_t)ref.n_tokens * (size_t)ref.vocab;
            double diff = 0;
            for (size_t i = 0; i < n; i++) diff = fmax(diff, fabs((double)got[i] - want[i]));
            const double e =
                fixture_max_position_error(got, ref.logits, ref.n_tokens, (int)ref.vocab);
            printf("  %-16s Hugging Face layout: max |diff| to the stacked fixture %.1e, rel err "
                   "to transformers %.2e\n",
                   name, diff, e);
            CHECK_MSG(diff == 0, "%s: logits differ from the stacked layout's by %.3e", name, diff);
            CHECK_MSG(e < 1e-3, "%s: rel err %.3e against transformers", name, e);
        }
        free(want), free(got);
        model_decode_read a, b;
        if (decode_bytes(from, &a) && decode_bytes(dir, &b))
            CHECK_MSG(a.routed == b.routed && a.all_experts == b.all_experts,
                      "%s: decode bytes %llu / %llu against the stacked %llu / %llu", name,
                      (unsigned long long)b.routed, (unsigned long long)b.all_experts,
                      (unsigned long long)a.routed, (unsigned long long)a.all_experts);
        /* quantize takes the layout too, writing what it writes for the stacked one */
        char copy[] = "/tmp/mlxcel-hf-stacked-XXXXXX";
        CHECK(mkdtemp(copy) != NULL);
        const char *fmt = "cp %s/config.json %s/model.safetensors %s/";
        const size_t cmd_len = strlen(fmt) + 2 * strlen(from) + strlen(copy) + 1;
        char *cmd = malloc(cmd_len);
        snprintf(cmd, cmd_len, fmt, from, from, copy);
        CHECK(system(cmd) == 0);
        free(cmd);
        if (quantize_into(copy, spec) && quantize_into(dir, spec)) {
            char *qa = base_path_join(copy, "q"), *qb = base_path_join(dir, "q");
            CHECK_MSG(same_tensors(qa, qb),
                      "%s: quantized from the Hugging Face layout, not the stacked one's tensors",
                      name);
            free(qa), free(qb);
        }
        remove_quantized(copy);
        remove_quantized(dir);
        remove_dir(copy);
        fixture_ref_free(&ref);
    }
    remove_dir(dir);
    free(src), free(from);
}

/* A per-expert checkpoint spoiled by `mode` must be refused, naming `needle`. */
static void test_refused(const char *name, write_mode mode, const char *needle) {
    char *src = base_path_join(test_source_dir(), "tests/fixtures"),
         *from = base_path_join(src, name);
    char dir[] = "/tmp/mlxcel-hf-experts-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    if (write_hf(from, dir, mode)) {
        base_err err;
        engine_options opts = test_cpu_options(8, 1, 32);
        engine_runtime *rt;
        const bool opened = engine_runtime_open(dir, &opts, &rt, &err) == 0;
        CHECK_MSG(!opened && strstr(err.msg, needle), "%s: want an error naming %s, got %s", name,
                  needle, opened ? "a model" : err.msg);
        if (opened) engine_runtime_close(rt);
    }
    remove_dir(dir);
    free(src), free(from);
}

int main(void) {
    test_fixture("qwen3_moe_bf16", (io_quant_spec){4, 64, IO_QUANT_AFFINE});
    test_fixture("mixtral_bf16", (io_quant_spec){8, 32, IO_QUANT_AFFINE});
    test_fixture("gpt_oss_bf16", (io_quant_spec){4, 32, IO_QUANT_MXFP4});
    test_refused("qwen3_moe_bf16", WRITE_DROP_EXPERT, "mlp.experts.1.up_proj.weight");
    test_refused("mixtral_bf16", WRITE_QUANTIZED_EXPERT, "read dense only");
    test_refused("gpt_oss_bf16", WRITE_BLOCKS, "mlp.experts.gate_up_proj_blocks");
    TEST_MAIN_END();
}
