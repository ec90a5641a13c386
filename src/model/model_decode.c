/* The weight bytes one decode step reads per sequence, counted two ways by one rule: from a
 * loaded model's bound tensors (for bench's bandwidth figures) and from a checkpoint's headers
 * alone (for inspect, which must not map a 30B model's weights to size it). The rule, what of
 * each tensor a decode row reads, is count() below; each walk only says what a tensor is. */
#include "model/model_internal.h"

#include <stdio.h>
#include <string.h>

/* What of a tensor one decode row reads, by its part in the forward pass. */
typedef enum {
    READ_WHOLE,   /* dense linears, norms, a router, the output head: every byte */
    READ_ROW,     /* the embedding table: the token's row */
    READ_EXPERTS, /* a layer's stacked experts: the top_k the row is routed to */
} read_role;

/* Adds a tensor of `bytes` (as the forward pass holds it) to r: `parts` is the table's rows
 * (READ_ROW) or the experts stacked (READ_EXPERTS), `used` the experts a row is routed to. A
 * stacked tensor's bytes are whole experts, and a table's whole rows, so the division is
 * exact. */
static void count(model_decode_read *r, read_role role, uint64_t bytes, int64_t parts,
                  int64_t used) {
    switch (role) {
    case READ_WHOLE:
        r->routed += bytes;
        r->all_experts += bytes;
        break;
    case READ_ROW:
        r->routed += bytes / (uint64_t)parts;
        r->all_experts += bytes / (uint64_t)parts;
        break;
    case READ_EXPERTS:
        r->routed += bytes / (uint64_t)parts * (uint64_t)used;
        r->all_experts += bytes;
        break;
    }
}

/* ---- a loaded model ---- */

/* Packed weights, scales, biases (affine only: MXFP4 has none) and the additive bias. */
static uint64_t linear_bytes(const be_linear *l) {
    uint64_t n = (uint64_t)l->out * (uint64_t)l->in;
    uint64_t groups = l->bits ? n / (uint64_t)l->group_size : 0;
    uint64_t bytes = l->bits ? n * (uint64_t)l->bits / 8 +
                                   (l->biases ? 2 : 1) * groups * base_dtype_size(l->dtype)
                             : n * base_dtype_size(l->dtype);
    if (l->bias) bytes += (uint64_t)l->out * base_dtype_size(l->bias_dtype);
    return bytes;
}

static uint64_t vector_bytes(const be_tensor *t) {
    return t->data ? (uint64_t)t->cols * base_dtype_size(t->dtype) : 0;
}

model_decode_read model_decode_bytes(const model *m) {
    model_decode_read r = {0};
    /* Tied embeddings: lm_head is the table, read whole as the head and a row as the input. */
    count(&r, READ_WHOLE, linear_bytes(&m->lm_head), 1, 1);
    count(&r, READ_WHOLE, vector_bytes(&m->final_norm), 1, 1);
    count(&r, READ_ROW, linear_bytes(&m->embed), m->embed.out, 1);
    for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
        const model_layer *L = &m->layers[l];
        const be_linear *lins[] = {&L->q, &L->k, &L->v, &L->o, &L->gate, &L->up, &L->down};
        for (size_t i = 0; i < sizeof lins / sizeof lins[0]; i++)
            count(&r, READ_WHOLE, linear_bytes(lins[i]), 1, 1);
        if (L->moe) {
            const be_linear *experts[] = {&L->egate, &L->eup, &L->edown};
            count(&r, READ_WHOLE, linear_bytes(&L->router), 1, 1);
            for (size_t i = 0; i < sizeof experts / sizeof experts[0]; i++)
                count(&r, READ_EXPERTS, linear_bytes(experts[i]), L->experts.n_experts,
                      L->experts.top_k);
        }
        const be_tensor *vecs[] = {&L->attn_norm,     &L->post_attn_norm, &L->mlp_norm,
                                   &L->post_mlp_norm, &L->q_norm,         &L->k_norm};
        for (size_t i = 0; i < sizeof vecs / sizeof vecs[0]; i++)
            count(&r, READ_WHOLE, vector_bytes(vecs[i]), 1, 1);
    }
    return r;
}

/* ---- a checkpoint's headers, by the names the loader binds (model_load.c) ---- */

typedef struct header_walk {
    const io_model_config *cfg;
    const io_checkpoint *ck;
    model_decode_read *r;
    base_err *err;
} header_walk;

static uint64_t bytes_if_present(const io_checkpoint *ck, const char *module, const char *part) {
    char name[256];
    snprintf(name, sizeof name, "%s.%s", module, part);
    const io_tensor *t = io_checkpoint_find(ck, name);
    return t ? t->nbytes : 0;
}

/* A linear module as bind_linear binds it: weight, scales and biases when quantized (MXFP4
 * has no biases, a dense module neither), and .bias when the config gives it one. */
static int add_linear(header_walk *w, const char *module, bool has_bias, read_role role,
                      int64_t parts, int64_t used) {
    char name[256];
    snprintf(name, sizeof name, "%s.weight", module);
    const io_tensor *t = io_checkpoint_find(w->ck, name);
    if (!t) return base_fail(w->err, "checkpoint: missing tensor %s", name);
    uint64_t bytes = t->nbytes + bytes_if_present(w->ck, module, "scales") +
                     bytes_if_present(w->ck, module, "biases");
    if (has_bias) bytes += bytes_if_present(w->ck, module, "bias");
    count(w->r, role, bytes, parts, used);
    return 0;
}

static int add_whole(header_walk *w, const char *module, bool has_bias) {
    return add_linear(w, module, has_bias, READ_WHOLE, 1, 1);
}

/* A norm's scale as bind_norm holds it: Gemma's (1 + w) formed in F32, any other as stored. */
static int add_norm(header_walk *w, const char *name) {
    const io_tensor *t = io_checkpoint_find(w->ck, name);
    if (!t) return base_fail(w->err, "checkpoint: missing tensor %s", name);
    uint64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (uint64_t)t->shape[i];
    count(w->r, READ_WHOLE, w->cfg->norm_plus_one ? n * sizeof(float) : t->nbytes, 1, 1);
    return 0;
}

static int add_attention(header_walk *w, const model_names *nm, const char *p) {
    const io_model_config *c = w->cfg;
    char name[256];
#define MODULE(suffix) (snprintf(name, sizeof name, "%s%s", p, suffix), name)
    if (nm->qkv ? add_whole(w, MODULE(nm->qkv), c->attention_bias)
                : add_whole(w, MODULE("self_attn.q_proj"), c->attention_bias) ||
                      add_whole(w, MODULE("self_attn.k_proj"), c->attention_bias) ||
                      add_whole(w, MODULE("self_attn.v_proj"), c->attention_bias))
        return -1;
    if (add_whole(w, MODULE("self_attn.o_proj"), c->o_bias)) return -1;
    if (c->qk_norm != IO_QK_NORM_NONE && (add_norm(w, MODULE("self_attn.q_norm.weight")) ||
                                          add_norm(w, MODULE("self_attn.k_norm.weight"))))
        return -1;
#undef MODULE
    return 0;
}

static int add_ffn(header_walk *w, const model_names *nm, const char *p, bool moe) {
    const io_model_config *c = w->cfg;
    char name[256];
#define MODULE(suffix) (snprintf(name, sizeof name, "%s%s", p, suffix), name)
    if (moe) {
        static const char *const proj[] = {"gate_proj", "up_proj", "down_proj"};
        if (add_whole(w, MODULE(nm->router), c->moe_bias)) return -1;
        for (size_t i = 0; i < sizeof proj / sizeof proj[0]; i++) {
            snprintf(name, sizeof name, "%s%s.%s", p, nm->experts, proj[i]);
            if (add_linear(w, name, c->moe_bias, READ_EXPERTS, c->n_experts, c->n_experts_used))
                return -1;
        }
        return 0;
    }
    if (nm->gate_up ? add_whole(w, MODULE(nm->gate_up), false)
                    : add_whole(w, MODULE("mlp.gate_proj"), false) ||
                          add_whole(w, MODULE("mlp.up_proj"), false))
        return -1;
    return add_whole(w, MODULE("mlp.down_proj"), false);
#undef MODULE
}

static int add_layer(header_walk *w, const model_names *nm, int l) {
    const io_model_config *c = w->cfg;
    char p[160], name[256];
    snprintf(p, sizeof p, "%slayers.%d.", nm->prefix, l);
    bool moe = c->n_experts > 0 && (!c->layer_moe || c->layer_moe[l]);
    if (add_attention(w, nm, p) || add_ffn(w, nm, p, moe)) return -1;
    const char *norms[] = {nm->attn_norm, nm->post_attn_norm, nm->mlp_norm, nm->post_mlp_norm};
    for (size_t i = 0; i < sizeof norms / sizeof norms[0]; i++) {
        if (!norms[i]) continue;
        snprintf(name, sizeof name, "%s%s.weight", p, norms[i]);
        if (add_norm(w, name)) return -1;
    }
    return 0;
}

int model_checkpoint_decode_bytes(const io_model_config *cfg, const io_checkpoint *ck,
                                  model_decode_read *out, base_err *err) {
    *out = (model_decode_read){0};
    const model_arch *arch = model_arch_find(cfg->model_type);
    if (!arch) return base_fail(err, "model_type '%s' is not supported", cfg->model_type);
    const model_names *nm = &arch->names;
    header_walk w = {cfg, ck, out, err};
    char embed[160], name[256];
    snprintf(embed, sizeof embed, "%sembed_tokens", nm->prefix);
    /* The output head beside the text model, as model_bind_weights names it. */
    size_t keep = strlen(nm->prefix) >= 6 ? strlen(nm->prefix) - 6 : 0;
    snprintf(name, sizeof name, "%.*slm_head", (int)keep, nm->prefix);
    const char *head = cfg->tie_word_embeddings ? embed : cfg->num_labels == 0 ? name : NULL;
    if ((head && add_whole(&w, head, false)) ||
        add_linear(&w, embed, false, READ_ROW, cfg->vocab_size, 1))
        return -1;
    snprintf(name, sizeof name, "%snorm.weight", nm->prefix);
    if (add_norm(&w, name)) return -1;
    for (int l = 0; l < cfg->num_hidden_layers; l++)
        if (add_layer(&w, nm, l)) return -1;
    return 0;
}
