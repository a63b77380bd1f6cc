/* cpu_avx512_util.h: pieces the AVX-512 kernel files share (included only by files compiled
 * with AVX-512 flags). */
#ifndef PAGEDATTN_CPU_AVX512_UTIL_H
#define PAGEDATTN_CPU_AVX512_UTIL_H

#include <immintrin.h>

#define AI static inline __attribute__((always_inline))

/* ---- reductions --------------------------------------------------------------------------- */

AI __m256 halves(__m512 a)
{
    return _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}

/* [sum a[0], ..., sum a[7]] */
AI __m256 hsum8z(const __m512 *a)
{
    __m256 b0 = halves(a[0]), b1 = halves(a[1]), b2 = halves(a[2]), b3 = halves(a[3]);
    __m256 b4 = halves(a[4]), b5 = halves(a[5]), b6 = halves(a[6]), b7 = halves(a[7]);
    __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(b0, b1), _mm256_hadd_ps(b2, b3));
    __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(b4, b5), _mm256_hadd_ps(b6, b7));
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* out[i] = sum acc[i] for i < n (n <= 16), in groups of 8 (unused slots summed as zeros) */
AI void hsum_n(const __m512 *acc, int n, float *out)
{
    __m512 g[16];
    for (int i = 0; i < 16; i++) g[i] = i < n ? acc[i] : _mm512_setzero_ps();
    _mm256_storeu_ps(out, hsum8z(g));
    if (n > 8) _mm256_storeu_ps(out + 8, hsum8z(g + 8));
}

#endif
