/* Hugging Face's per-expert layout of a mixture of experts, stacked at open into the layout
 * the loader binds (mlx-lm's: <experts>.{gate,up,down}_proj.weight [experts, out, in]), as
 * mlx-lm's sanitize step does when it converts such a checkpoint. Two forms (model_names):
 * one tensor an expert and projection, <hf_experts>.N.<hf_proj[i]>.weight [out, in]
 * (transformers' Qwen3-MoE and Mixtral checkpoints), and GPT-OSS's fused one,
 * <experts>.gate_up_proj [experts, in, 2 inter] with gate and up interleaved along the last
 * axis and down_proj [experts, inter, hidden], each followed by its _bias. Only dense weights
 * come in these forms here; the stacked copies live in host memory the checkpoint owns, in
 * place of the tensors they replace, so that every later step (binding, sharding, the decode
 * byte count) sees one layout. */
#include "model/model_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The tensors a layer's conversion drops and adds. */
typedef struct restack {
    const char **drop;
    size_t n_drop, cap_drop;
    io_tensor_new add[6];
    size_t n_add;
    bool data; /* the checkpoint's data is mapped: build the stacked copies */
} restack;

static void drop_name(restack *r, const char *name) {
    if (r->n_drop == r->cap_drop) {
        r->cap_drop = r->cap_drop ? 2 * r->cap_drop : 16;
        r->drop = base_xrealloc(r->drop, r->cap_drop * sizeof *r->drop);
    }
    r->drop[r->n_drop++] = name;
}

/* A new tensor [d0, d1, d2] (d2 0: [d0, d1]) of dt under `name`, its data to be filled. */
static io_tensor_new *new_tensor(restack *r, const char *name, base_dtype dt, int64_t d0,
                                 int64_t d1, int64_t d2) {
    io_tensor_new *t = &r->add[r->n_add++];
    *t = (io_tensor_new){.name = base_xstrdup(name), .dtype = dt, .ndim = d2 ? 3 : 2};
    t->shape[0] = d0, t->shape[1] = d1, t->shape[2] = d2;
    size_t n = (size_t)d0 * (size_t)d1 * (size_t)(d2 ? d2 : 1);
    t->data = r->data ? base_xmalloc(n * base_dtype_size(dt) + 1) : NULL;
    return t;
}

/* `name` as a dense float tensor [d0, d1, d2] (d2 0: 2-D), or an error naming it. */
static int want(const io_checkpoint *ck, const char *name, int64_t d0, int64_t d1, int64_t d2,
                const io_tensor **out, base_err *err) {
    const io_tensor *t = io_checkpoint_find(ck, name);
    if (!t) return base_fail(err, "checkpoint: missing tensor %s", name);
    if (t->dtype != BASE_DTYPE_F32 && t->dtype != BASE_DTYPE_F16 && t->dtype != BASE_DTYPE_BF16)
        return base_fail(err,
                         "%s: tensor %s is %s: experts in Hugging Face's per-expert layout are "
                         "read dense only (convert the checkpoint with mlx-lm to quantize them)",
                         t->file, name, base_dtype_name(t->dtype));
    const int nd = d2 ? 3 : 2;
    const int64_t d[3] = {d0, d1, d2};
    bool ok = t->ndim == nd;
    for (int i = 0; ok && i < nd; i++) ok = t->shape[i] == d[i];
    if (!ok) {
        char got[96];
        model_shape_str(t, got, sizeof got);
        return base_fail(err,
                         "%s: tensor %s has shape %s, expected [%lld, %lld%s] from config.json",
                         t->file, name, got, (long long)d0, (long long)d1, d2 ? ", ..." : "");
    }
    *out = t;
    return 0;
}

/* Element si of src to element di of dst, es bytes each (the checkpoint's data is not
 * promised to be aligned). */
static inline void put(void *dst, size_t di, const void *src, size_t si, size_t es) {
    switch (es) {
    case 2:
        memcpy((char *)dst + di * 2, (const char *)src + si * 2, 2);
        break;
    case 4:
        memcpy((char *)dst + di * 4, (const char *)src + si * 4, 4);
        break;
    default:
        memcpy((char *)dst + di * es, (const char *)src + si * es, es);
    }
}

/* Experts stored one tensor an expert: each projection's E tensors one after another. */
static int per_expert(const io_checkpoint *ck, const model_names *nm, const char *p,
                      const io_model_config *c, restack *r, base_err *err) {
    const int64_t E = c->n_experts, h = c->hidden_size, inter = c->moe_intermediate_size;
    static const char *const mlx_proj[3] = {"gate_proj", "up_proj", "down_proj"};
    char name[320];
    for (int i = 0; i < 3; i++) {
        const int64_t out = i == 2 ? h : inter, in = i == 2 ? inter : h;
        io_tensor_new *dst = NULL;
        size_t bytes = 0;
        for (int64_t e = 0; e < E; e++) {
            snprintf(name, sizeof name, "%s%s.%lld.%s.weight", p, nm->hf_experts, (long long)e,
                     nm->hf_proj[i]);
            const io_tensor *t;
            if (want(ck, name, out, in, 0, &t, err)) return -1;
            if (!dst) {
                snprintf(name, sizeof name, "%s%s.%s.weight", p, nm->experts, mlx_proj[i]);
                dst = new_tensor(r, name, t->dtype, E, out, in);
                bytes = t->nbytes;
            } else if (t->dtype != dst->dtype) {
                return base_fail(err, "%s: tensor %s is %s, expert 0's is %s", t->file, t->name,
                                 base_dtype_name(t->dtype), base_dtype_name(dst->dtype));
            }
            if (dst->data) memcpy((char *)dst->data + (size_t)e * bytes, t->data, bytes);
            drop_name(r, t->name);
        }
    }
    return 0;
}

/* GPT-OSS's fused experts: gate [e, o, k] = gate_up [e, k, 2 o], up [e, o, k] = gate_up
 * [e, k, 2 o + 1], down [e, o, k] = down_proj [e, k, o]; the gate/up bias de-interleaved the
 * same way, down's bias as it is. */
static int fused(const io_checkpoint *ck, const model_names *nm, const char *p,
                 const io_model_config *c, restack *r, base_err *err) {
    const int64_t E = c->n_experts, h = c->hidden_size, inter = c->moe_intermediate_size;
    char name[320];
    const io_tensor *gu, *gub, *dn, *dnb;
    snprintf(name, sizeof name, "%s%s.gate_up_proj", p, nm->experts);
    if (want(ck, name, E, h, 2 * inter, &gu, err)) return -1;
    snprintf(name, sizeof name, "%s%s.gate_up_proj_bias", p, nm->experts);
    if (want(ck, name, E, 2 * inter, 0, &gub, err)) return -1;
    snprintf(name, sizeof name, "%s%s.down_proj", p, nm->experts);
    if (want(ck, name, E, inter, h, &dn, err)) return -1;
    snprintf(name, sizeof name, "%s%s.down_proj_bias", p, nm->experts);
    if (want(ck, name, E, h, 0, &dnb, err)) return -1;
    const size_t es = base_dtype_size(gu->dtype), bs = base_dtype_size(gub->dtype);
    io_tensor_new *w[3], *b[3];
    static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
    for (int i = 0; i < 3; i++) {
        const io_tensor *src = i == 2 ? dn : gu, *bsrc = i == 2 ? dnb : gub;
        snprintf(name, sizeof name, "%s%s.%s.weight", p, nm->experts, proj[i]);
        w[i] = new_tensor(r, name, src->dtype, E, i == 2 ? h : inter, i == 2 ? inter : h);
        snprintf(name, sizeof name, "%s%s.%s.bias", p, nm->experts, proj[i]);
        b[i] = new_tensor(r, name, bsrc->dtype, E, i == 2 ? h : inter, 0);
    }
    if (r->data) {
        const size_t des = base_dtype_size(dn->dtype);
        for (int64_t e = 0; e < E; e++) {
            for (int64_t k = 0; k < h; k++)
                for (int64_t o = 0; o < inter; o++)
                    for (int i = 0; i < 2; i++)
                        put(w[i]->data, (size_t)((e * inter + o) * h + k), gu->data,
                            (size_t)((e * h + k) * 2 * inter + 2 * o + i), es);
            for (int64_t k = 0; k < inter; k++)
                for (int64_t o = 0; o < h; o++)
                    put(w[2]->data, (size_t)((e * h + o) * inter + k), dn->data,
                        (size_t)((e * inter + k) * h + o), des);
            for (int64_t o = 0; o < inter; o++)
                for (int i = 0; i < 2; i++)
                    put(b[i]->data, (size_t)(e * inter + o), gub->data,
                        (size_t)(e * 2 * inter + 2 * o + i), bs);
        }
        memcpy(b[2]->data, dnb->data, dnb->nbytes);
    }
    drop_name(r, gu->name);
    drop_name(r, gub->name);
    drop_name(r, dn->name);
    drop_name(r, dnb->name);
    return 0;
}

/* Layer l's experts, if the checkpoint holds them in a Hugging Face form. */
static int restack_layer(io_checkpoint *ck, const model_arch *arch, const io_model_config *c, int l,
                         bool data, base_err *err) {
    const model_names *nm = &arch->names;
    char p[160], name[320];
    snprintf(p, sizeof p, "%slayers.%d.", nm->prefix, l);
    snprintf(name, sizeof name, "%s%s.gate_proj.weight", p, nm->experts);
    if (io_checkpoint_find(ck, name)) return 0; /* stacked already */
    snprintf(name, sizeof name, "%s%s.gate_up_proj_blocks", p, nm->experts);
    const io_tensor *blocks = nm->hf_gate_up ? io_checkpoint_find(ck, name) : NULL;
    if (blocks)
        return base_fail(err,
                         "%s: tensor %s: experts in the MXFP4 blocks layout of OpenAI's release, "
                         "which mlxcel does not read; mlx-lm's convert writes them as "
                         "mlx-community's gpt-oss checkpoints hold them",
                         blocks->file, name);
    snprintf(name, sizeof name, "%s%s.gate_up_proj", p, nm->experts);
    const bool is_fused = nm->hf_gate_up && io_checkpoint_find(ck, name);
    bool per = false;
    if (!is_fused && nm->hf_experts) {
        snprintf(name, sizeof name, "%s%s.0.%s.weight", p, nm->hf_experts, nm->hf_proj[0]);
        per = io_checkpoint_find(ck, name) != NULL;
    }
    if (!is_fused && !per) return 0; /* neither: the binding names what is missing */
    restack r = {.data = data};
    int rc = is_fused ? fused(ck, nm, p, c, &r, err) : per_expert(ck, nm, p, c, &r, err);
    if (rc == 0) {
        rc = io_checkpoint_replace(ck, r.drop, r.n_drop, r.add, r.n_add, err);
    } else {
        for (size_t i = 0; i < r.n_add; i++) free(r.add[i].name), free(r.add[i].data);
    }
    free(r.drop);
    return rc;
}

int model_checkpoint_open(const char *dir, const io_model_config *c, bool map_data,
                          io_checkpoint **out, base_err *err) {
    const model_arch *arch = model_arch_find(c->model_type);
    if (!arch) return base_fail(err, "model_type '%s' is not supported", c->model_type);
    if ((map_data ? io_checkpoint_open_dir(dir, out, err)
                  : io_checkpoint_open_headers(dir, out, err)))
        return -1;
    for (int l = 0; c->n_experts > 0 && l < c->num_hidden_layers; l++) {
        if (c->layer_moe && !c->layer_moe[l]) continue;
        if (restack_layer(*out, arch, c, l, map_data, err)) {
            io_checkpoint_close(*out);
            *out = NULL;
            return -1;
        }
    }
    return 0;
}
