/* The CPU backend's private parts shared by its files (not part of the backend interface). */
#ifndef MLXCEL_BACKEND_CPU_INTERNAL_H
#define MLXCEL_BACKEND_CPU_INTERNAL_H

#include "backend/backend.h"

/* Instruction sets with their own kernels; MLXCEL_CPU_ISA=portable|avx2|avx512|avx512vnni
 * forces one. avx512vnni is avx512 with vpdpwssd for the integer dots. */
typedef enum { CPU_ISA_PORTABLE = 0, CPU_ISA_AVX2, CPU_ISA_AVX512, CPU_ISA_AVX512VNNI } cpu_isa;

/* The f32 inner loops of matmul for one instruction set (4- and 8-bit weights take the
 * integer dots below). Quantized rows are read from byte pointers that start on a group
 * boundary; `s` holds that span's scales converted to f32. */
typedef struct cpu_kernels {
    float (*dot_f32)(const float *w, const float *x, int64_t k);
    float (*dot_f16)(const uint16_t *w, const float *x, int64_t k);
    float (*dot_bf16)(const uint16_t *w, const float *x, int64_t k);
    /* dst (n_groups * g) = s[g] * q + b[g], in natural order. */
    void (*deq4)(const uint8_t *w, const float *s, const float *b, int64_t n_groups, int g,
                 float *dst);
    void (*deq8)(const uint8_t *w, const float *s, const float *b, int64_t n_groups, int g,
                 float *dst);
    void (*cvt_f16)(const uint16_t *src, float *dst, int64_t k);
    void (*cvt_bf16)(const uint16_t *src, float *dst, int64_t k);
    /* y[i * ldy + j] += sum_{t < k} x[i * ldx + t] * w[j * ldw + t] for i < n, j < m. */
    void (*gemm)(int64_t n, int64_t m, int64_t k, const float *x, int64_t ldx, const float *w,
                 int64_t ldw, float *y, int64_t ldy);
} cpu_kernels;

extern const cpu_kernels cpu_kernels_portable;
#if defined(__x86_64__) || defined(__i386__)
extern const cpu_kernels cpu_kernels_avx2;
extern const cpu_kernels cpu_kernels_avx512;
#endif

/* Portable kernels that the SIMD tables share for the bit widths they do not specialize. */
float cpu_qdot_bits(int bits, const uint8_t *w, const float *s, int64_t n_groups, int g,
                    const float *x);
void cpu_deq_bits(int bits, const uint8_t *w, const float *s, const float *b, int64_t n_groups,
                  int g, float *dst);

/* Integer dot products for 4- and 8-bit affine weights (cpu_idot*.c). Each row of x is
 * quantized per weight group to int16 codes c with a scale d (x ~ d c) and the group's sum of
 * x, so that a weight row w = s q + b gives w . x = sum_g s_g d_g (q_g . c_g) + b_g sum(x_g):
 * the products and their sums within a group are exact in int32, only the scaling of each
 * group is rounded (in f32). int16, not int8, codes: one int8 code per value put the fixtures'
 * logits 8e-2 off transformers' (bench/RESULTS.md), 15 bits keep them within 1e-3, and
 * vpdpwssd / vpmaddwd take int16 pairs at the rate vpdpbusd takes two int8 codes.
 *
 * A row's result depends only on that row and the weight, never on how many rows share the
 * call: the server's same-seed guarantee needs decode and prefill to agree to the bit. */
#define CPU_IDOT_ROWS  4 /* rows of x that one idot call may take together */
#define CPU_IDOT_WROWS 4 /* weight rows that one idot call may take: a packed tile's */
#define CPU_XQ_MAX     32767

/* One idot call: nw weight rows against nr rows of x over n_groups groups of g values. A
 * linear's own layout has rows ldw = in * bits / 8 bytes apart and groups ldg = g * bits / 8;
 * a packed tile (cpu_pack.c) has its rows' groups side by side: ldw = g * bits / 8 and
 * ldg = CPU_PACK_ROWS * ldw, so one contiguous stream feeds every row of the tile. */
typedef struct cpu_idot_args {
    const uint8_t *w; /* (nw) rows of codes, ldw bytes apart, their groups ldg apart */
    int64_t ldw;
    int64_t ldg;
    const float *s; /* (nw, n_groups) the weight rows' scales, lds apart */
    int64_t lds;
    const int16_t *codes; /* (nr) rows of x's codes, ldc apart */
    int64_t ldc;
    const float *d; /* (nr, n_groups) the codes' scales, ldd apart */
    int64_t ldd;
    int64_t n_groups;
    int g;
    int nw; /* 1 to CPU_IDOT_WROWS */
    int nr; /* 1 or CPU_IDOT_ROWS */
} cpu_idot_args;

typedef struct cpu_ikernels {
    /* codes (in), d and sums (in / g) of one row of x for `bits`-wide weights in groups of g;
     * the codes in the order idot reads the weights' values. */
    void (*quant_x)(const float *x, int64_t in, int bits, int g, int16_t *codes, float *d,
                    float *sums);
    /* out[j * CPU_IDOT_ROWS + r] = sum_gi s[j][gi] d[r][gi] (q_j,gi . c_r,gi) for j < nw,
     * r < nr; neither nw nor nr changes a result. */
    void (*idot4)(const cpu_idot_args *a, float *out);
    void (*idot8)(const cpu_idot_args *a, float *out);
} cpu_ikernels;

extern const cpu_ikernels cpu_ikernels_portable;
#if defined(__x86_64__) || defined(__i386__)
extern const cpu_ikernels cpu_ikernels_avx2;
extern const cpu_ikernels cpu_ikernels_avx512;
extern const cpu_ikernels cpu_ikernels_avx512vnni;
#endif

/* Weights repacked at load for the integer dots: tiles of CPU_PACK_ROWS weight rows, the last
 * padded with zero rows. Tile t holds rows [t * CPU_PACK_ROWS, (t + 1) * CPU_PACK_ROWS): its
 * codes (cpu_pack_codes), group by group the rows' codes of that group side by side (row j's
 * group gi at (gi * CPU_PACK_ROWS + j) * g * bits / 8), and its scales (cpu_pack_scales), the
 * rows' scales as f32, (CPU_PACK_ROWS, in / g), then their biases likewise. Every tile's codes
 * come first, back to back, and every tile's scales after them: with each tile's scales in
 * front of its codes the stream had a gap every few KiB, and decode from DRAM ran at half the
 * speed (bench/RESULTS.md). The values are those of the linear's own layout (scales widened
 * exactly), so both layouts give the same bits. */
#define CPU_PACK_ROWS CPU_IDOT_WROWS

/* Whether pack_linear repacks w: the affine 4- and 8-bit weights, which take the integer
 * dots. */
bool cpu_packs(const be_linear *w);
/* Tile t's codes and scales in w->packed. */
const uint8_t *cpu_pack_codes(const be_linear *w, int64_t t);
const float *cpu_pack_scales(const be_linear *w, int64_t t);
/* be_ops.pack_linear: w->packed gets a buffer in the layout above (freed with free), or stays
 * NULL where w is not repacked or memory is short. */
int cpu_pack_linear(be_backend *be, be_linear *w, base_err *err);

/* Quantizes one row of x for the integer dots; codes are stored in natural order, or, with
 * span > 0, each span of values as its even-indexed values then its odd ones (the order in
 * which a SIMD kernel unpacks the low and high nibbles of span / 2 bytes). */
void cpu_quant_x_span(const float *x, int64_t in, int g, int span, int16_t *codes, float *d,
                      float *sums);

typedef struct cpu_impl {
    base_pool *pool;          /* owned */
    cpu_isa isa;              /* the kernels in use */
    const cpu_kernels *krn;   /* the table for isa */
    const cpu_ikernels *ikrn; /* the integer dots for isa */
} cpu_impl;

static inline base_pool *cpu_pool(be_backend *be) {
    return ((cpu_impl *)be->impl)->pool;
}

static inline const cpu_kernels *cpu_krn(be_backend *be) {
    return ((cpu_impl *)be->impl)->krn;
}

static inline const cpu_ikernels *cpu_ikrn(be_backend *be) {
    return ((cpu_impl *)be->impl)->ikrn;
}

/* "portable", "avx2", "avx512" or "avx512vnni": the kernels this backend runs. */
const char *cpu_isa_name(const be_backend *be);
/* Whether this CPU (and its OS) can run the kernels of `isa`. */
bool cpu_isa_supported(cpu_isa isa);

/* Checks that t has data of dtype dt and a non-empty shape; `what` names it in the message. */
int cpu_check_tensor(const be_tensor *t, base_dtype dt, const char *op, const char *what,
                     base_err *err);
/* Checks a linear layer's fields (bits, group size, dtypes, pointers). */
int cpu_check_linear(const be_linear *w, const char *op, base_err *err);
/* Row r of w dequantized into dst (w->in); w already checked. */
void cpu_linear_row(be_backend *be, const be_linear *w, int64_t r, float *dst);

int cpu_matmul(be_backend *be, const be_tensor *x, const be_linear *w, be_tensor *y, base_err *err);
/* matmul in f32 whatever the weights, one dot per row of x: for outputs that feed a discrete
 * choice. A MoE router's top-k on the integer dots put qwen3_moe_q4_g64's logits 1.4e-3 off
 * transformers' (bound 1e-3; every other matmul together 9e-4): a near tie of two experts
 * turns a small error into a large one. */
int cpu_matmul_exact(be_backend *be, const be_tensor *x, const be_linear *w, be_tensor *y,
                     base_err *err);
int cpu_embedding(be_backend *be, const be_linear *table, const be_tensor *ids, be_tensor *out,
                  base_err *err);
int cpu_rmsnorm(be_backend *be, const be_tensor *x, const be_tensor *weight, float eps,
                be_tensor *y, base_err *err);
int cpu_add(be_backend *be, const be_tensor *a, const be_tensor *b, be_tensor *y, base_err *err);
int cpu_glu(be_backend *be, be_act act, const be_tensor *gate, const be_tensor *up, be_tensor *y,
            base_err *err);
int cpu_moe(be_backend *be, const be_tensor *x, const be_norm *norm, const be_moe *moe,
            be_tensor *y, base_err *err);
int cpu_scale(be_backend *be, const be_tensor *x, float s, be_tensor *y, base_err *err);
int cpu_softcap(be_backend *be, const be_tensor *x, float cap, be_tensor *y, base_err *err);
int cpu_rope(be_backend *be, be_tensor *x, int n_heads, int head_dim, const be_tensor *positions,
             const be_tensor *inv_freq, float mscale, base_err *err);
int cpu_argmax(be_backend *be, const be_tensor *logits, be_tensor *ids, base_err *err);
int cpu_topk_candidates(be_backend *be, const be_tensor *logits, const be_topk_row *reqs, int n_req,
                        const be_logit_adj *adj, int32_t *cand_id, float *cand_logit,
                        int32_t *n_cand, double *lse, base_err *err);

/* Paged KV ops (cpu_attention.c), over the attn module's CPU kernels. */
int cpu_kv_append(be_backend *be, const be_kv_layer *layer, const be_tensor *k, const be_tensor *v,
                  const be_paged_batch *batch, base_err *err);
int cpu_attention(be_backend *be, const be_tensor *q, const be_kv_layer *layer,
                  const be_paged_batch *batch, const be_decode_plan *plan, int n_heads,
                  be_attn attn, be_tensor *out, base_err *err);

#endif
