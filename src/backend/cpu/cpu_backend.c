/* The CPU backend: host memory, the instruction-set choice and the op table. Memory is plain
 * host memory, so uploads and downloads are copies and weights are used where they lie. */
#include "backend/cpu/cpu_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CPU_ALIGN 64 /* a cache line and an AVX-512 register */

static const char *const cpu_isa_names[] = {"portable", "avx2", "avx512", "avx512vnni"};
#define CPU_N_ISAS ((int)(sizeof cpu_isa_names / sizeof cpu_isa_names[0]))

const char *cpu_isa_name(const be_backend *be) {
    return cpu_isa_names[((const cpu_impl *)be->impl)->isa];
}

#if defined(__x86_64__) || defined(__i386__)
/* F16C straight from CPUID (leaf 1, ECX bit 29): clang 14 does not know the name "f16c" in
 * __builtin_cpu_supports. The AVX2 check before it covers the OS saving the YMM state. */
static bool cpu_has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
#endif

bool cpu_isa_supported(cpu_isa isa) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
    switch (isa) {
    case CPU_ISA_PORTABLE:
        return true;
    case CPU_ISA_AVX2:
        return avx2;
    case CPU_ISA_AVX512:
        return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    case CPU_ISA_AVX512VNNI:
        return cpu_isa_supported(CPU_ISA_AVX512) && __builtin_cpu_supports("avx512vnni");
    }
    return false;
#else
    return isa == CPU_ISA_PORTABLE;
#endif
}

static const cpu_kernels *cpu_isa_kernels(cpu_isa isa) {
#if defined(__x86_64__) || defined(__i386__)
    if (isa == CPU_ISA_AVX512 || isa == CPU_ISA_AVX512VNNI) return &cpu_kernels_avx512;
    if (isa == CPU_ISA_AVX2) return &cpu_kernels_avx2;
#endif
    return &cpu_kernels_portable;
}

static const cpu_ikernels *cpu_isa_ikernels(cpu_isa isa) {
#if defined(__x86_64__) || defined(__i386__)
    if (isa == CPU_ISA_AVX512VNNI) return &cpu_ikernels_avx512vnni;
    if (isa == CPU_ISA_AVX512) return &cpu_ikernels_avx512;
    if (isa == CPU_ISA_AVX2) return &cpu_ikernels_avx2;
#endif
    return &cpu_ikernels_portable;
}

/* The best instruction set this CPU has, or the one MLXCEL_CPU_ISA names. */
static int cpu_pick_isa(cpu_isa *out, base_err *err) {
    const char *env = getenv("MLXCEL_CPU_ISA");
    if (!env || !*env) {
        *out = CPU_ISA_PORTABLE;
        for (int i = CPU_N_ISAS - 1; i > 0; i--) {
            if (!cpu_isa_supported((cpu_isa)i)) continue;
            *out = (cpu_isa)i;
            break;
        }
        return 0;
    }
    for (int i = 0; i < CPU_N_ISAS; i++) {
        if (strcmp(env, cpu_isa_names[i]) != 0) continue;
        if (!cpu_isa_supported((cpu_isa)i)) {
            return base_fail(err, "MLXCEL_CPU_ISA=%s: this CPU lacks that instruction set", env);
        }
        *out = (cpu_isa)i;
        return 0;
    }
    return base_fail(err, "MLXCEL_CPU_ISA=%s: expected portable, avx2, avx512 or avx512vnni", env);
}

static void cpu_destroy(be_backend *be) {
    cpu_impl *impl = be->impl;
    base_pool_destroy(impl->pool);
    free(impl);
    free(be);
}

static int cpu_alloc(be_backend *be, size_t bytes, void **ptr, base_err *err) {
    size_t rounded = (bytes + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN;
    if (rounded < bytes) return base_fail(err, "cpu alloc: %zu bytes overflow", bytes);
    *ptr = aligned_alloc(CPU_ALIGN, rounded ? rounded : CPU_ALIGN);
    if (!*ptr) return base_fail(err, "cpu alloc: out of memory for %zu bytes", bytes);
    return 0;
}

static void cpu_free(be_backend *be, void *ptr) {
    free(ptr);
}

static int cpu_memcpy(be_backend *be, void *dst, const void *src, size_t bytes, base_err *err) {
    if (bytes && (!dst || !src))
        return base_fail(err, "cpu copy: NULL pointer for %zu bytes", bytes);
    if (bytes) memcpy(dst, src, bytes);
    return 0;
}

typedef struct cpu_read_job {
    const uint64_t *w;
    size_t n;       /* words */
    int parts;      /* one a thread */
    uint64_t *sums; /* (parts) */
} cpu_read_job;

/* Eight independent sums, so that the loads and not one chain of adds set the pace. The
 * baseline instruction set's loads are enough: on the 2-core EPYC VM an AVX2 build of this
 * loop read no faster. */
static void cpu_read_part(void *ctx, int64_t i) {
    const cpu_read_job *j = ctx;
    size_t per = j->n / (size_t)j->parts, k = per * (size_t)i;
    size_t end = i == j->parts - 1 ? j->n : k + per;
    uint64_t a[8] = {0};
    for (; k + 8 <= end; k += 8)
        for (int l = 0; l < 8; l++) a[l] += j->w[k + l];
    for (; k < end; k++) a[0] += j->w[k];
    j->sums[i] = a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
}

static int cpu_read_sum(be_backend *be, const void *src, size_t bytes, uint64_t *sum,
                        base_err *err) {
    if (bytes % 8 || (uintptr_t)src % 8 || (bytes && !src))
        return base_fail(err, "cpu read_sum: %zu bytes at %p: want 8-byte words, 8-byte aligned",
                         bytes, src);
    cpu_read_job j = {.w = src, .n = bytes / 8, .parts = be->n_threads};
    j.sums = base_xcalloc((size_t)j.parts, sizeof *j.sums);
    base_pool_for(cpu_pool(be), j.parts, cpu_read_part, &j);
    *sum = 0;
    for (int i = 0; i < j.parts; i++) *sum += j.sums[i];
    free(j.sums);
    return 0;
}

static int cpu_map_weights(be_backend *be, const void *host, size_t bytes, const void **dev,
                           base_err *err) {
    *dev = host;
    return 0;
}

static int cpu_sync(be_backend *be, base_err *err) {
    return 0;
}

/* MemAvailable and MemTotal from /proc/meminfo. */
static int cpu_memory_info(be_backend *be, uint64_t *free_bytes, uint64_t *total_bytes) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return -1;
    char line[256];
    unsigned long long avail = 0, total = 0;
    bool have_avail = false, have_total = false;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "MemAvailable: %llu kB", &avail) == 1) have_avail = true;
        if (sscanf(line, "MemTotal: %llu kB", &total) == 1) have_total = true;
    }
    fclose(f);
    if (!have_avail || !have_total) return -1;
    *free_bytes = base_sat_mul_u64(avail, 1024);
    *total_bytes = base_sat_mul_u64(total, 1024);
    return 0;
}

static const be_ops cpu_ops = {
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_memcpy,
    .download = cpu_memcpy,
    .alloc_host = cpu_alloc,
    .free_host = cpu_free,
    .download_async = cpu_memcpy,
    .copy = cpu_memcpy,
    .read_sum = cpu_read_sum,
    .map_weights = cpu_map_weights,
    .pack_linear = cpu_pack_linear,
    .sync = cpu_sync,
    .memory_info = cpu_memory_info,
    .embedding = cpu_embedding,
    .matmul = cpu_matmul,
    .rmsnorm = cpu_rmsnorm,
    .add = cpu_add,
    .glu = cpu_glu,
    .scale = cpu_scale,
    .softcap = cpu_softcap,
    .moe = cpu_moe,
    .rope = cpu_rope,
    .kv_append = cpu_kv_append,
    .attention = cpu_attention,
    .argmax = cpu_argmax,
    .topk_candidates = cpu_topk_candidates,
};

/* The "model name" line of /proc/cpuinfo, or "unknown CPU". */
static void cpu_model_name(char *buf, size_t size) {
    snprintf(buf, size, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) != 0 || !colon) continue;
        colon += 1 + (colon[1] == ' ');
        colon[strcspn(colon, "\n")] = 0;
        snprintf(buf, size, "%s", colon);
        break;
    }
    fclose(f);
}

int be_cpu_create(int n_threads, be_backend **out, base_err *err) {
    *out = NULL;
    cpu_isa isa = CPU_ISA_PORTABLE;
    if (cpu_pick_isa(&isa, err)) return -1;
    be_backend *be = calloc(1, sizeof *be);
    cpu_impl *impl = calloc(1, sizeof *impl);
    base_pool *pool = base_pool_create(n_threads);
    if (!be || !impl || !pool) {
        free(be);
        free(impl);
        base_pool_destroy(pool);
        return base_fail(err, "cpu backend: out of memory");
    }
    impl->pool = pool;
    impl->isa = isa;
    impl->krn = cpu_isa_kernels(isa);
    impl->ikrn = cpu_isa_ikernels(isa);
    be->name = "cpu";
    cpu_model_name(be->device, sizeof be->device);
    be->ops = &cpu_ops;
    be->act_dtype = BASE_DTYPE_F32;
    be->n_threads = base_pool_threads(pool);
    be->ceiling = BE_CEILING_READ;
    be->quant_kinds = 1u << BE_QUANT_AFFINE | 1u << BE_QUANT_MXFP4;
    be->moe_quant_kinds = be->quant_kinds;
    be->target_parallelism = be->n_threads;
    be->prefill_chunk = 512;
    be->impl = impl;
    *out = be;
    return 0;
}
