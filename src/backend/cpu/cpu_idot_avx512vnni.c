/* AVX-512 VNNI integer dots: vpdpwssd, the multiply and the add in one instruction (the body
 * is cpu_idot_avx512.h). Chosen at run time only when the CPU also has AVX512_VNNI; this file
 * is compiled with those flags and nothing else may call into it. */
#if defined(__x86_64__) || defined(__i386__)
#include "backend/cpu/cpu_internal.h"

#include <immintrin.h>

#define IA5_DP(acc, a, b) _mm512_dpwssd_epi32((acc), (a), (b))
#define IA5_TABLE         cpu_ikernels_avx512vnni
#include "backend/cpu/cpu_idot_avx512.h"
#endif
