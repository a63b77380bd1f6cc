/* cpu_x86_fp8.h: fp8 E4M3 to f16 bits, shared by the AVX2 and AVX-512 kernel files (both are
 * compiled with AVX2 and F16C enabled).
 *
 * E4M3 through f16: the byte sign-extended to 16 bits and shifted left by 7 puts the sign in bit
 * 15 (and a copy in bit 14, cleared) and eeee.mmm in an f16's exponent and mantissa: an f16 2^-8
 * times the E4M3 value (E4M3 subnormals land on f16 subnormals, exactly; vcvtph2ps then makes
 * normal f32s of them, so no f32 subnormal ever enters an arithmetic instruction). S.1111.111 is
 * NaN: it lands on (+-)0x3f80 and is forced to an f16 NaN when fix_nan is set (callers that know
 * their rows hold no NaN byte skip the fix-up). The f32 result is 2^-8 times the value. */
#ifndef PAGEDATTN_CPU_X86_FP8_H
#define PAGEDATTN_CPU_X86_FP8_H

#include <immintrin.h>
#include <stdbool.h>

/* 8 values: x16 is the bytes sign-extended to 16 bits */
static inline __attribute__((always_inline)) __m128i pa__e4m3_to_f16x8(__m128i x16, bool fix_nan)
{
    __m128i h = _mm_and_si128(_mm_slli_epi16(x16, 7), _mm_set1_epi16((short)0xbfff));
    if (!fix_nan) return h;
    __m128i nan = _mm_cmpeq_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7fff)), _mm_set1_epi16(0x3f80));
    return _mm_or_si128(h, _mm_and_si128(nan, _mm_set1_epi16(0x7e00)));
}

/* 16 values at p */
static inline __attribute__((always_inline)) __m256i pa__e4m3_to_f16x16(const void *p, bool fix_nan)
{
    __m256i x = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
    __m256i h = _mm256_and_si256(_mm256_slli_epi16(x, 7), _mm256_set1_epi16((short)0xbfff));
    if (!fix_nan) return h;
    __m256i nan = _mm256_cmpeq_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x7fff)), _mm256_set1_epi16(0x3f80));
    return _mm256_or_si256(h, _mm256_and_si256(nan, _mm256_set1_epi16(0x7e00)));
}

/* 16 E4M3 values at p as bf16 words in memory order (so each 32-bit lane holds a pair, as 16
 * bf16 values loaded from memory would): the byte sign-extended and shifted left by 4 puts the
 * sign in bit 15 (copies in bits 14-11, cleared) and eeee.mmm in the low exponent bits and the
 * top of the mantissa, a bf16 2^-120 times the E4M3 value; E4M3 subnormals land on bf16
 * subnormals, exactly (as f32 they are subnormal: FMA inputs, at full speed on the x86 cores
 * measured, bench/NOTES.md twenty-first pass). NaN (S.1111.111) lands on (+-)0x07f0 and is
 * forced to a bf16 NaN when fix_nan is set. */
static inline __attribute__((always_inline)) __m256i pa__e4m3_to_bf16x16(const void *p, bool fix_nan)
{
    __m256i x = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
    __m256i h = _mm256_and_si256(_mm256_slli_epi16(x, 4), _mm256_set1_epi16((short)0x87f0));
    if (!fix_nan) return h;
    __m256i nan = _mm256_cmpeq_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x7ff0)), _mm256_set1_epi16(0x07f0));
    return _mm256_or_si256(h, _mm256_and_si256(nan, _mm256_set1_epi16(0x7fc0)));
}

/* ps[r * CPU_KT + c] = p[r * ldp + c] * 2^120 for r < nr, c < nc (ps 32-byte aligned): the
 * probabilities of a PV over E4M3 rows as bf16 or f32 words (2^-120 times the value), so that
 * every product is the unscaled one. Exact: probabilities are at most 1, the masked ones -0. */
static inline void pa__cpu_probs_up(const float *p, int ldp, int nr, int nc, float *ps)
{
    const __m256 up = _mm256_set1_ps(PA__CPU_E4M3_UP);
    for (int r = 0; r < nr; r++) {
        int c = 0;
        for (; c + 8 <= nc; c += 8)
            _mm256_store_ps(ps + r * CPU_KT + c, _mm256_mul_ps(_mm256_loadu_ps(p + (size_t)r * ldp + c), up));
        for (; c < nc; c++) ps[r * CPU_KT + c] = p[(size_t)r * ldp + c] * PA__CPU_E4M3_UP;
    }
}

/* Whether some E4M3 value among the first d bytes of the n rows is a NaN (S.1111.111): the
 * maximum of the bytes' low 7 bits, kept in four vectors (one per 32 bytes of each 128-byte step
 * of a row, so that no single chain of maxima sets the pace), then 32-byte steps, then bytes.
 * (The AVX-512 kernels have a 64-byte twin, a5_e4m3_rows_nan.) */
static inline bool pa__e4m3_rows_nan(const void *const *rows, int n, int d)
{
    const __m256i m = _mm256_set1_epi8(0x7f);
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (int i = 0; i < n; i++) {
        const unsigned char *r = rows[i];
        int j = 0;
        for (; j + 128 <= d; j += 128) {
            a0 = _mm256_max_epu8(a0, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(r + j)), m));
            a1 = _mm256_max_epu8(a1, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(r + j + 32)), m));
            a2 = _mm256_max_epu8(a2, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(r + j + 64)), m));
            a3 = _mm256_max_epu8(a3, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(r + j + 96)), m));
        }
        for (; j + 32 <= d; j += 32) a0 = _mm256_max_epu8(a0, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(r + j)), m));
        for (; j < d; j++)
            if ((r[j] & 0x7f) == 0x7f) return true;
    }
    a0 = _mm256_max_epu8(_mm256_max_epu8(a0, a1), _mm256_max_epu8(a2, a3));
    return _mm256_movemask_epi8(_mm256_cmpeq_epi8(a0, m)) != 0;
}

#endif
