/* cpu_avx512_util.h: pieces the AVX-512 kernel files share (included only by files compiled
 * with AVX-512 flags). */
#ifndef PAGEDATTN_CPU_AVX512_UTIL_H
#define PAGEDATTN_CPU_AVX512_UTIL_H

#include <immintrin.h>
#include <stdbool.h>

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

AI __m512 red2(bool mx, __m512 a, __m512 b)
{
    return mx ? _mm512_max_ps(a, b) : _mm512_add_ps(a, b);
}

/* [sum a[0], ..., sum a[15]] in one vector (mx: the maxima instead), by a transpose-and-add
 * tree: 30 shuffles and 15 additions for 16 sums, against 44 shuffles and 30 more operations
 * for hsum_n's two groups of 8 (whose vhaddps are two shuffles each on Intel cores). Each sum's
 * order is fixed: lanes i and i + 2, then i and i + 1 of each 128-bit block, then the blocks
 * 0 + 2, 1 + 3, then those two (hsum1z's order). */
AI __m512 hred16z(bool mx, const __m512 *a)
{
    __m512 v[4];
    for (int h = 0; h < 4; h++) {
        const __m512 *x = a + 4 * h;
        /* per 128-bit block: (x0[0] + x0[2], x1[0] + x1[2], x0[1] + x0[3], x1[1] + x1[3]) */
        __m512 t0 = red2(mx, _mm512_unpacklo_ps(x[0], x[1]), _mm512_unpackhi_ps(x[0], x[1]));
        __m512 t1 = red2(mx, _mm512_unpacklo_ps(x[2], x[3]), _mm512_unpackhi_ps(x[2], x[3]));
        /* per 128-bit block: the block's sums of x0, x1, x2, x3 */
        v[h] = red2(mx, _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t1))),
                    _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t1))));
    }
    /* blocks (v0: 0+2, 1+3; v1: 0+2, 1+3), then (v0, v1, v2, v3 whole) */
    __m512 x01 = red2(mx, _mm512_shuffle_f32x4(v[0], v[1], 0x44), _mm512_shuffle_f32x4(v[0], v[1], 0xee));
    __m512 x23 = red2(mx, _mm512_shuffle_f32x4(v[2], v[3], 0x44), _mm512_shuffle_f32x4(v[2], v[3], 0xee));
    return red2(mx, _mm512_shuffle_f32x4(x01, x23, 0x88), _mm512_shuffle_f32x4(x01, x23, 0xdd));
}

AI __m512 hsum16z(const __m512 *a)
{
    return hred16z(false, a);
}

/* The sum of a's lanes in hred16z's order (the same bits as its lane for a) */
AI float hsum1z(__m512 a)
{
    __m512 t = _mm512_add_ps(a, _mm512_shuffle_ps(a, a, 0x4e)); /* per block: 0 + 2, 1 + 3 */
    t = _mm512_add_ps(t, _mm512_shuffle_ps(t, t, 0xb1));        /* then those two */
    t = _mm512_add_ps(t, _mm512_shuffle_f32x4(t, t, 0x4e));     /* blocks 0 + 2, 1 + 3 */
    t = _mm512_add_ps(t, _mm512_shuffle_f32x4(t, t, 0xb1));     /* then those two */
    return _mm512_cvtss_f32(t);
}

/* The R x KB dot products of a decode QK block (a[h * KB + u]: row h, key c0 + u; a holds 16
 * vectors, those past R x KB zero) times mul into s[h * lds + c0 + u]. Blocks of 12 or more by
 * the tree, one store per row (a row's KB = 4 or 8 sums are contiguous in it), else hsum_n. */
AI void store_scores(int R, int KB, const __m512 *a, float mul, float *s, int lds, int c0)
{
    if (R * KB >= 12 && (KB == 4 || KB == 8)) {
        __m512 f = hsum16z(a);
        if (mul != 1.0f) f = _mm512_mul_ps(f, _mm512_set1_ps(mul));
        for (int h = 0; h < R; h++) {
            float *sh = s + (size_t)h * lds + c0;
            if (KB == 4)
                _mm_storeu_ps(sh, h == 0 ? _mm512_castps512_ps128(f)
                                  : h == 1 ? _mm512_extractf32x4_ps(f, 1)
                                  : h == 2 ? _mm512_extractf32x4_ps(f, 2)
                                           : _mm512_extractf32x4_ps(f, 3));
            else
                _mm256_storeu_ps(sh, h == 0 ? _mm512_castps512_ps256(f)
                                            : _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1)));
        }
        return;
    }
    float t[16];
    hsum_n(a, R * KB, t);
    for (int h = 0; h < R; h++)
        for (int u = 0; u < KB; u++) s[(size_t)h * lds + c0 + u] = t[h * KB + u] * mul;
}

/* The prefill QK's chunk c of the head done (cpu.h, CPU_QK_GROUP), its sums in a[0 .. n): into
 * its group's sums at g (last: the head's last chunk); true when the group is complete, a then
 * holding the group's sums. The branches stay outside the store loops: with one inside them the
 * f32 prefill ran 10% slower (bench/NOTES.md, thirty-fourth pass). */
AI bool qk_group_step(__m512 *a, int n, float *g, int c, bool last)
{
    const bool gfirst = c % CPU_QK_GROUP == 0, glast = c % CPU_QK_GROUP == CPU_QK_GROUP - 1 || last;
    if (!glast) {
        if (gfirst)
            for (int v = 0; v < n; v++) _mm512_store_ps(g + 16 * v, a[v]);
        else
            for (int v = 0; v < n; v++) _mm512_store_ps(g + 16 * v, _mm512_add_ps(_mm512_load_ps(g + 16 * v), a[v]));
        return false;
    }
    if (!gfirst)
        for (int v = 0; v < n; v++) a[v] = _mm512_add_ps(_mm512_load_ps(g + 16 * v), a[v]);
    return true;
}

/* Keys per decode QK block for R query rows (1..4): 16 accumulators (2 x 8, 4 x 4), 12 for 3
 * rows, 8 for one row (whose 16 would need 16 key vectors as well). */
AI int qk_keys_per_block(int R)
{
    return R == 2 ? 8 : R == 1 ? 8 : 4;
}

#endif
