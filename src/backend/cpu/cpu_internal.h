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
 * The kernels read weights as tiles of CPU_PACK_ROWS rows (cpu_pack.c) and give output (j, r)
 * of a tile as one f32 chain over the groups in order: acc = fma(float(t_g), s_g * d_g, acc),
 * then acc = fma(b_g, sum(x_g), acc), with t_g the group's exact int32 dot. Every instruction
 * set computes exactly that, so a row's bits depend on neither its batch nor the thread count
 * nor the instruction set: the server's same-seed guarantee needs decode and prefill to agree
 * to the bit. */
#define CPU_XQ_MAX 32767

/* Quantizes one row of x (in values, natural order) for the integer dots: codes (in), their
 * scales d and x's sums (in / g). */
void cpu_quant_x(const float *x, int64_t in, int g, int16_t *codes, float *d, float *sums);

/* Weight tiles: CPU_PACK_ROWS rows whose codes are interleaved in units of 32 bytes, each unit
 * holding, for every row j of the tile, 2 bytes at 2j: the row's next 2 values (8-bit), or its
 * next 4 values v0..v3 as the bytes v0 | v2 << 4 and v1 | v3 << 4 (4-bit). Widened to int16,
 * a unit is one 512-bit vector whose 32-bit lane j pairs two of row j's values (4-bit: the low
 * nibbles give v0, v1 and the high ones v2, v3), which meets a broadcast pair of x's codes in
 * one vpdpwssd: 16 rows' dots in 16 lanes, so a group's dot needs no horizontal sum. A group
 * of g values is g / 2 (8-bit) or g / 4 (4-bit) units. Beside the codes, each group has its 16
 * rows' scales then their 16 biases, as f32. Rows past the weight are zero codes with zero
 * scales and biases. */
#define CPU_PACK_ROWS 16
#define CPU_PACK_UNIT 32 /* bytes of a unit */

/* Tile rows [o, o + CPU_PACK_ROWS) of a 4- or 8-bit affine w in its own layout, groups [g0, g0 +
 * ng), into codes (ng * g * CPU_PACK_ROWS * bits / 8 bytes) and sb (ng * 2 * CPU_PACK_ROWS). */
void cpu_pack_tile(const cpu_kernels *k, const be_linear *w, int64_t o, int64_t g0, int64_t ng,
                   uint8_t *codes, float *sb);

/* One tile against nr rows of x over n_groups groups of g values. */
typedef struct cpu_tile_args {
    const uint8_t *w;      /* the tile's codes from the first group on */
    const float *sb;       /* (n_groups, 2, CPU_PACK_ROWS) the groups' scales and biases */
    const int16_t *codes;  /* (nr) rows of x's codes from the first group's first value */
    const float *d, *sums; /* (nr) rows of the codes' scales and x's sums from the first group */
    int64_t ldc;           /* codes between rows of x */
    int64_t ldd;           /* d and sums between rows of x */
    int64_t n_groups;
    int g;
    int nr;
    float *acc; /* (nr, CPU_PACK_ROWS) the chains above, carried in and out */
} cpu_tile_args;

typedef struct cpu_ikernels {
    void (*tile4)(const cpu_tile_args *a);
    void (*tile8)(const cpu_tile_args *a);
    /* One weight row in the linear's own layout (4-bit: value 2i in the low nibble of byte i,
     * 2i + 1 in the high one) against one row of x's codes, groups in order, the chain above
     * carried in *acc; s and b are the row's scales and biases as f32. The bits the tiles give
     * that row: a few rows of x take this instead of packing a tile. */
    void (*row)(int bits, const uint8_t *w, const float *s, const float *b, const int16_t *codes,
                const float *d, const float *sums, int64_t n_groups, int g, float *acc);
} cpu_ikernels;

extern const cpu_ikernels cpu_ikernels_portable;
#if defined(__x86_64__) || defined(__i386__)
extern const cpu_ikernels cpu_ikernels_avx2;
extern const cpu_ikernels cpu_ikernels_avx512;
extern const cpu_ikernels cpu_ikernels_avx512vnni;
#endif

/* Weights repacked at load: every tile's codes back to back, then every tile's scales and
 * biases (with each tile's scales in front of its codes the stream had a gap every few KiB,
 * and decode from DRAM ran at half the speed: bench/RESULTS.md). A linear not repacked takes
 * the same kernels through tiles packed a chunk at a time per call, so both give the same
 * bits. */

/* Whether pack_linear repacks w: the affine 4- and 8-bit weights, which take the integer
 * dots. */
bool cpu_packs(const be_linear *w);
/* Tile t's codes and scales in w->packed. */
const uint8_t *cpu_pack_codes(const be_linear *w, int64_t t);
const float *cpu_pack_scales(const be_linear *w, int64_t t);
/* be_ops.pack_linear: w->packed gets a buffer in the layout above (freed with free), or stays
 * NULL where w is not repacked or memory is short. */
int cpu_pack_linear(be_backend *be, be_linear *w, base_err *err);

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
