/* AVX-512 integer dots without VNNI: vpmaddwd then vpaddd (the body is cpu_idot_avx512.h).
 * Chosen at run time only when the CPU has AVX-512F, BW, VL and DQ; this file is compiled
 * with those flags and nothing else may call into it. */
#if defined(__x86_64__) || defined(__i386__)
#include "backend/cpu/cpu_internal.h"

#include <immintrin.h>

#define IA5_DP(acc, a, b) _mm512_add_epi32((acc), _mm512_madd_epi16((a), (b)))
#define IA5_TABLE         cpu_ikernels_avx512
#include "backend/cpu/cpu_idot_avx512.h"
#endif
