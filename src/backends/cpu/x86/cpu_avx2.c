/* cpu_avx2.c: AVX2 + FMA + F16C kernels (compiled with -mavx2 -mfma -mf16c; chosen at run
 * time only after CPUID + XGETBV say the machine runs them). Overrides every entry of the
 * generic table. Loops never read past a row's head_size elements: the last d % 8 elements of
 * a row are converted one by one. */
#include "../cpu.h"

#include <immintrin.h>

#include "cpu_x86_fp8.h"


/* ---- conversions -------------------------------------------------------------------------- */

static inline __m256 cvt_bf16x8(const void *p)
{
    __m256i x = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
}

static inline __m256 cvt_f16x8(const void *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

/* E5M2 is the upper byte of an f16: exact, infinities and NaN included. */
static inline __m256 cvt_e5m2x8(const void *p)
{
    __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p));
    return _mm256_cvtph_ps(_mm_slli_epi16(b, 8));
}

static inline void cvt_e4m3x16(const void *p, float *dst)
{
    __m256i h = pa__e4m3_to_f16x16(p, true);
    __m256 s = _mm256_set1_ps(256.0f);
    _mm256_store_ps(dst, _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), s));
    _mm256_store_ps(dst + 8, _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), s));
}

static void a2_load_rows(pa_dtype dtype, const void *const *rows, int n, int d, int dp, float *dst)
{
    int dv = d & ~7;
    for (int i = 0; i < n; i++) {
        float *o = dst + (size_t)i * dp;
        const char *src = rows[i];
        int j = 0;
        switch (dtype) {
        case PA_DTYPE_F32:
            for (; j < dv; j += 8) _mm256_store_ps(o + j, _mm256_loadu_ps((const float *)src + j));
            break;
        case PA_DTYPE_F16:
            for (; j < dv; j += 8) _mm256_store_ps(o + j, cvt_f16x8(src + 2 * j));
            break;
        case PA_DTYPE_BF16:
            for (; j < dv; j += 8) _mm256_store_ps(o + j, cvt_bf16x8(src + 2 * j));
            break;
        case PA_DTYPE_FP8_E4M3:
            for (; j + 16 <= d; j += 16) cvt_e4m3x16(src + j, o + j);
            break;
        case PA_DTYPE_FP8_E5M2:
            for (; j < dv; j += 8) _mm256_store_ps(o + j, cvt_e5m2x8(src + j));
            break;
        default: break;
        }
        for (; j < d; j++) o[j] = pa__load_f32(dtype, src, j);
        for (; j < dp; j++) o[j] = 0.0f;
    }
}

/* ---- reductions --------------------------------------------------------------------------- */

/* [sum a0, sum a1, ..., sum a7] */
static inline __m256 hsum8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5,
                           __m256 a6, __m256 a7)
{
    __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

static inline float hsum1(__m256 a)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_hadd_ps(s, s);
    s = _mm_hadd_ps(s, s);
    return _mm_cvtss_f32(s);
}

/* Rows covered by 6-row blocks so that the rest is a multiple of 4 where it can be (64 = 60 + 4,
 * 128 = 120 + 8): the 4-row blocks run at the full FMA rate, single rows at a quarter of it. */
static int rows6(int nr)
{
    int n6 = nr / 6;
    while (n6 > 0 && (nr - 6 * n6) % 4 != 0) n6--;
    return (nr - 6 * n6) % 4 == 0 ? 6 * n6 : nr / 6 * 6;
}

/* ---- S = Q K^T ---------------------------------------------------------------------------- */

static void a2_qk(const float *q, int nr, const float *k, int nc, int dp, float *s, int lds)
{
    int r = 0, r6 = rows6(nr);
    /* 6 rows x 2 keys: 12 accumulators hide the FMA latency (prefill tiles) */
    for (; r < r6; r += 6) {
        const float *q0 = q + (size_t)r * dp;
        int c = 0;
        for (; c + 2 <= nc; c += 2) {
            const float *k0 = k + (size_t)c * dp, *k1 = k0 + dp;
            __m256 a[6][2];
            for (int i = 0; i < 6; i++) a[i][0] = a[i][1] = _mm256_setzero_ps();
            for (int j = 0; j < dp; j += 8) {
                __m256 x0 = _mm256_load_ps(k0 + j), x1 = _mm256_load_ps(k1 + j);
                for (int i = 0; i < 6; i++) {
                    __m256 y = _mm256_load_ps(q0 + (size_t)i * dp + j);
                    a[i][0] = _mm256_fmadd_ps(y, x0, a[i][0]);
                    a[i][1] = _mm256_fmadd_ps(y, x1, a[i][1]);
                }
            }
            float t[16];
            __m256 z = _mm256_setzero_ps();
            _mm256_storeu_ps(t, hsum8(a[0][0], a[0][1], a[1][0], a[1][1], a[2][0], a[2][1], a[3][0], a[3][1]));
            _mm256_storeu_ps(t + 8, hsum8(a[4][0], a[4][1], a[5][0], a[5][1], z, z, z, z));
            for (int i = 0; i < 6; i++) {
                s[(size_t)(r + i) * lds + c] = t[2 * i];
                s[(size_t)(r + i) * lds + c + 1] = t[2 * i + 1];
            }
        }
        for (; c < nc; c++) {
            const float *k0 = k + (size_t)c * dp;
            __m256 a[6];
            for (int i = 0; i < 6; i++) a[i] = _mm256_setzero_ps();
            for (int j = 0; j < dp; j += 8) {
                __m256 x = _mm256_load_ps(k0 + j);
                for (int i = 0; i < 6; i++)
                    a[i] = _mm256_fmadd_ps(_mm256_load_ps(q0 + (size_t)i * dp + j), x, a[i]);
            }
            for (int i = 0; i < 6; i++) s[(size_t)(r + i) * lds + c] = hsum1(a[i]);
        }
    }
    for (; r + 4 <= nr; r += 4) {
        const float *q0 = q + (size_t)r * dp, *q1 = q0 + dp, *q2 = q1 + dp, *q3 = q2 + dp;
        int c = 0;
        for (; c + 2 <= nc; c += 2) {
            const float *k0 = k + (size_t)c * dp, *k1 = k0 + dp;
            __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00;
            __m256 a20 = a00, a21 = a00, a30 = a00, a31 = a00;
            for (int j = 0; j < dp; j += 8) {
                __m256 x0 = _mm256_load_ps(k0 + j), x1 = _mm256_load_ps(k1 + j);
                __m256 y = _mm256_load_ps(q0 + j);
                a00 = _mm256_fmadd_ps(y, x0, a00);
                a01 = _mm256_fmadd_ps(y, x1, a01);
                y = _mm256_load_ps(q1 + j);
                a10 = _mm256_fmadd_ps(y, x0, a10);
                a11 = _mm256_fmadd_ps(y, x1, a11);
                y = _mm256_load_ps(q2 + j);
                a20 = _mm256_fmadd_ps(y, x0, a20);
                a21 = _mm256_fmadd_ps(y, x1, a21);
                y = _mm256_load_ps(q3 + j);
                a30 = _mm256_fmadd_ps(y, x0, a30);
                a31 = _mm256_fmadd_ps(y, x1, a31);
            }
            float t[8];
            _mm256_storeu_ps(t, hsum8(a00, a01, a10, a11, a20, a21, a30, a31));
            for (int i = 0; i < 4; i++) {
                s[(size_t)(r + i) * lds + c] = t[2 * i];
                s[(size_t)(r + i) * lds + c + 1] = t[2 * i + 1];
            }
        }
        for (; c < nc; c++) {
            const float *k0 = k + (size_t)c * dp;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int j = 0; j < dp; j += 8) {
                __m256 x = _mm256_load_ps(k0 + j);
                a0 = _mm256_fmadd_ps(_mm256_load_ps(q0 + j), x, a0);
                a1 = _mm256_fmadd_ps(_mm256_load_ps(q1 + j), x, a1);
                a2 = _mm256_fmadd_ps(_mm256_load_ps(q2 + j), x, a2);
                a3 = _mm256_fmadd_ps(_mm256_load_ps(q3 + j), x, a3);
            }
            s[(size_t)r * lds + c] = hsum1(a0);
            s[(size_t)(r + 1) * lds + c] = hsum1(a1);
            s[(size_t)(r + 2) * lds + c] = hsum1(a2);
            s[(size_t)(r + 3) * lds + c] = hsum1(a3);
        }
    }
    for (; r < nr; r++) {
        const float *q0 = q + (size_t)r * dp;
        float *sr = s + (size_t)r * lds;
        int c = 0;
        for (; c + 8 <= nc; c += 8) {
            const float *kc = k + (size_t)c * dp;
            __m256 a[8];
            for (int i = 0; i < 8; i++) a[i] = _mm256_setzero_ps();
            for (int j = 0; j < dp; j += 8) {
                __m256 y = _mm256_load_ps(q0 + j);
                for (int i = 0; i < 8; i++)
                    a[i] = _mm256_fmadd_ps(y, _mm256_load_ps(kc + (size_t)i * dp + j), a[i]);
            }
            _mm256_storeu_ps(sr + c, hsum8(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]));
        }
        for (; c < nc; c++) {
            const float *kc = k + (size_t)c * dp;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0;
            for (int j = 0; j < dp; j += 16) {
                a0 = _mm256_fmadd_ps(_mm256_load_ps(q0 + j), _mm256_load_ps(kc + j), a0);
                a1 = _mm256_fmadd_ps(_mm256_load_ps(q0 + j + 8), _mm256_load_ps(kc + j + 8), a1);
            }
            sr[c] = hsum1(_mm256_add_ps(a0, a1));
        }
    }
}

/* ---- S = Q K^T with K transposed (prefill tiles) ------------------------------------------ */

static inline void transpose8(__m256 *r)
{
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* R rows x 16 keys: 2R accumulators; one broadcast of q per row and dimension; the head in
 * chunks of CPU_QK_CHUNK dims, their sums in groups (g), the group sums added to the total in S
 * (cpu.h). */
PA__QK_GROUP_SCRATCH_BEGIN
static inline __attribute__((always_inline)) void qkt_block(int R, const float *q, const float *kt,
                                                            int c0, int dp, float *s, int lds)
{
    float g[6 * 16] __attribute__((aligned(32)));
    for (int j0 = 0; j0 < dp; j0 += CPU_QK_CHUNK) {
        const int j1 = dp - j0 > CPU_QK_CHUNK ? j0 + CPU_QK_CHUNK : dp;
        __m256 a[6][2];
        for (int i = 0; i < R; i++) a[i][0] = a[i][1] = _mm256_setzero_ps();
        for (int j = j0; j < j1; j++) {
            __m256 k0 = _mm256_load_ps(kt + (size_t)j * CPU_KT + c0);
            __m256 k1 = _mm256_load_ps(kt + (size_t)j * CPU_KT + c0 + 8);
            for (int i = 0; i < R; i++) {
                __m256 b = _mm256_broadcast_ss(q + (size_t)i * dp + j);
                a[i][0] = _mm256_fmadd_ps(b, k0, a[i][0]);
                a[i][1] = _mm256_fmadd_ps(b, k1, a[i][1]);
            }
        }
        const int c = j0 / CPU_QK_CHUNK;
        const bool gfirst = c % CPU_QK_GROUP == 0, glast = c % CPU_QK_GROUP == CPU_QK_GROUP - 1 || j1 == dp;
        if (!glast) {
            if (gfirst)
                for (int i = 0; i < R; i++) {
                    _mm256_store_ps(g + 16 * i, a[i][0]);
                    _mm256_store_ps(g + 16 * i + 8, a[i][1]);
                }
            else
                for (int i = 0; i < R; i++) {
                    _mm256_store_ps(g + 16 * i, _mm256_add_ps(_mm256_load_ps(g + 16 * i), a[i][0]));
                    _mm256_store_ps(g + 16 * i + 8, _mm256_add_ps(_mm256_load_ps(g + 16 * i + 8), a[i][1]));
                }
            continue;
        }
        for (int i = 0; i < R; i++) {
            float *si = s + (size_t)i * lds + c0;
            if (!gfirst) {
                a[i][0] = _mm256_add_ps(_mm256_load_ps(g + 16 * i), a[i][0]);
                a[i][1] = _mm256_add_ps(_mm256_load_ps(g + 16 * i + 8), a[i][1]);
            }
            if (c >= CPU_QK_GROUP) {
                a[i][0] = _mm256_add_ps(_mm256_loadu_ps(si), a[i][0]);
                a[i][1] = _mm256_add_ps(_mm256_loadu_ps(si + 8), a[i][1]);
            }
            _mm256_storeu_ps(si, a[i][0]);
            _mm256_storeu_ps(si + 8, a[i][1]);
        }
    }
}
PA__QK_GROUP_SCRATCH_END

/* pf: spread over the 6-row blocks, one share per block of 16 keys (the rest of the rows, when
 * nr is not a multiple of 6, take none) */
static void a2_qk_t(const float *q, int nr, const float *kt, int nc, int dp, float *s, int lds,
                    const pa__cpu_pf *pf)
{
    int n16 = (nc + 15) & ~15, r = 0, r6 = rows6(nr), g = 0, ng = r6 / 6 * (n16 / 16);
    if (!ng) pf_share(pf, 0, 1);
    for (; r < r6; r += 6)
        for (int c0 = 0; c0 < n16; c0 += 16) {
            pf_share(pf, g++, ng);
            qkt_block(6, q + (size_t)r * dp, kt, c0, dp, s + (size_t)r * lds, lds);
        }
    for (; r + 4 <= nr; r += 4)
        for (int c0 = 0; c0 < n16; c0 += 16) qkt_block(4, q + (size_t)r * dp, kt, c0, dp, s + (size_t)r * lds, lds);
    for (; r < nr; r++)
        for (int c0 = 0; c0 < n16; c0 += 16) qkt_block(1, q + (size_t)r * dp, kt, c0, dp, s + (size_t)r * lds, lds);
}

/* ---- softmax pieces ----------------------------------------------------------------------- */

/* (MAXPS drops a NaN in its first operand: NaN lanes are collected apart) */
static float a2_row_max(const float *s, int n)
{
    __m256 m = _mm256_set1_ps(-INFINITY), nan = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(s + i);
        m = _mm256_max_ps(m, x);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    }
    if (_mm256_movemask_ps(nan)) return NAN;
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    float r = _mm_cvtss_f32(h);
    for (; i < n; i++)
        if (isnan(s[i]) || s[i] > r) r = s[i];
    return r;
}

/* exp(x) for x <= 0 (the softmax's s - m; inputs above 0 are taken as 0): Cody-Waite reduction
 * by ln 2 and a degree-6 polynomial (Cephes expf's coefficients), ~1 ulp. Below -87.3 the result
 * is an fp32 subnormal (down to -103.97) or 0, as the contract's fp32 exp has it: p 2^n (n in
 * [-150, 0]) is built as (2^-64 p) 2^(n + 64), both factors normal, the first one exactly 2^-64
 * times Cephes' polynomial (its coefficients scaled, no operation more), the product rounded
 * once: the same bits as p times 2^n wherever the result is normal. (Until 2026-11-30 inputs
 * were clamped at -87.3, so a key more than 87.3 below its row's maximum weighed 2^-126: an
 * independent oracle found it, bench/NOTES.md, thirty-sixth pass.) Inputs below -104 give 0
 * (the caller zeroes -inf lanes).
 * With sh > 0 (a constant; 64: a softmax weight, p_exp in cpu.h): 2^sh exp(x) for x down to
 * -131, +0 below (and for NaN), p 2^(n + sh) with Cephes' own coefficients: wherever exp(x) is
 * an fp32 normal, exactly 2^sh times the unshifted value, and never a subnormal. */
static inline __attribute__((always_inline)) __m256 exp8k(__m256 x, const int sh)
{
    const __m256 keep = sh ? _mm256_cmp_ps(x, _mm256_set1_ps(-PA__CPU_FAR_LIMIT), _CMP_GE_OQ) : _mm256_setzero_ps();
    x = _mm256_max_ps(x, _mm256_set1_ps(sh ? -PA__CPU_FAR_LIMIT : -104.0f));
    x = _mm256_min_ps(x, _mm256_setzero_ps());
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    /* the polynomial with every coefficient (and the 1 of r + 1) 2^-64 times Cephes', exact
     * powers of two: each step's result is 2^-64 times the unscaled one's, bit for bit (sh:
     * Cephes' own) */
    const float u = sh ? 1.0f : 0x1p-64f;
    __m256 p = _mm256_set1_ps(1.9875691500E-4f * u);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507E-3f * u));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073E-3f * u));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894E-2f * u));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459E-1f * u));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201E-1f * u));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_fmadd_ps(r, _mm256_set1_ps(u), _mm256_set1_ps(u)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127 + (sh ? sh : 64))), 23);
    const __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return sh ? _mm256_and_ps(y, keep) : y;
}

static inline __m256 exp8(__m256 x) { return exp8k(x, 0); }


/* One weight 2^sh exp(x) (exp_row's tail): expf scaled exactly wherever expf(x) is normal;
 * below, where expf's result is subnormal or 0, exp in double scaled before the rounding to
 * fp32 (an audit found the tail's far keys weighed 0 or 1.7% off); +0 below -131 as exp8k */
static inline float exp1k(float x, const int sh)
{
    if (!sh) return expf(x);
    if (x < -PA__CPU_FAR_LIMIT || x != x) return 0.0f;
    return x >= -87.0f ? ldexpf(expf(x), sh) : (float)ldexp(exp((double)x), sh);
}

/* p[0..8) = the weights exp8k(p - m, sh), masked (-inf) entries -0; returns them */
static inline __attribute__((always_inline)) __m256 exp8_store(float *p, __m256 vm, __m256 ninf, const int sh)
{
    __m256 x = _mm256_loadu_ps(p);
    __m256 e = exp8k(_mm256_sub_ps(x, vm), sh);
    e = _mm256_blendv_ps(e, _mm256_set1_ps(-0.0f), _mm256_cmp_ps(x, ninf, _CMP_EQ_OQ));
    _mm256_storeu_ps(p, e);
    return e;
}

/* exp_row's whole vectors (s[0 .. n rounded down to 8)), their sum unreduced. Two vectors per
 * step: their exp8 chains are independent, and written side by side the core's scheduler finds
 * the second one's work while the first waits on its latency (the sums in the same order as one
 * vector at a time). */
static inline __attribute__((always_inline)) __m256 exp_row_acc(float *s, int n, __m256 vm, const int sh)
{
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 e0 = exp8_store(s + i, vm, ninf, sh), e1 = exp8_store(s + i + 8, vm, ninf, sh);
        acc = _mm256_add_ps(_mm256_add_ps(acc, e0), e1);
    }
    for (; i + 8 <= n; i += 8) acc = _mm256_add_ps(acc, exp8_store(s + i, vm, ninf, sh));
    return acc;
}

/* softcap_rows (cpu.h): the avx512 table's form (cpu_avx512.c, a5_softcap_rows) 8 lanes at a
 * time: tanh of y = s / cap by its odd series to y^15 below |y| = 0.5, (1 - e) / (1 + e) with
 * e = exp8(-2 |y|) above, the sign of y put back, NaN lanes passed through (exp8 clamps a NaN to
 * -104). A row's tail (nc not a multiple of 8) goes through a buffer of 8: nothing past nc is
 * read or written. */
static inline __m256 cap8(__m256 x, __m256 inv, __m256 vcap)
{
    const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
    const __m256 y = _mm256_mul_ps(x, inv), a = _mm256_andnot_ps(sign, y);
    const __m256 e = exp8(_mm256_mul_ps(a, _mm256_set1_ps(-2.0f)));
    const __m256 big = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
    const __m256 y2 = _mm256_mul_ps(a, a);
    __m256 q = _mm256_set1_ps(pa__cpu_tanh_series[0]);
    for (int i = 1; i < PA__CPU_TANH_SERIES_N; i++) q = _mm256_fmadd_ps(q, y2, _mm256_set1_ps(pa__cpu_tanh_series[i]));
    const __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(q, y2), a, a);
    __m256 t = _mm256_blendv_ps(big, small, _mm256_cmp_ps(a, _mm256_set1_ps(0.5f), _CMP_LT_OQ));
    t = _mm256_or_ps(t, _mm256_and_ps(y, sign));
    t = _mm256_blendv_ps(t, y, _mm256_cmp_ps(y, y, _CMP_UNORD_Q));
    return _mm256_mul_ps(vcap, t);
}

static void a2_softcap_rows(float *s, int lds, int nr, int nc, float cap)
{
    const __m256 inv = _mm256_set1_ps(1.0f / cap), vcap = _mm256_set1_ps(cap);
    for (int r = 0; r < nr; r++) {
        float *p = s + (size_t)r * lds;
        int c = 0;
        for (; c + 8 <= nc; c += 8) _mm256_storeu_ps(p + c, cap8(_mm256_loadu_ps(p + c), inv, vcap));
        if (c < nc) {
            float t[8] = {0};
            memcpy(t, p + c, sizeof(float) * (size_t)(nc - c));
            _mm256_storeu_ps(t, cap8(_mm256_loadu_ps(t), inv, vcap));
            memcpy(p + c, t, sizeof(float) * (size_t)(nc - c));
        }
    }
}

/* The sum of a's lanes in hsum8's order (the same bits as its lane for a) */
static inline float hsum1_tree(__m256 a)
{
    __m256 t = _mm256_hadd_ps(a, a);
    t = _mm256_hadd_ps(t, t);
    return _mm_cvtss_f32(_mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)));
}

static inline __attribute__((always_inline)) float exp_row_k(float *s, int n, float m, const int sh)
{
    float sum = hsum1_tree(exp_row_acc(s, n, _mm256_set1_ps(m), sh));
    for (int i = n / 8 * 8; i < n; i++) {
        float e = s[i] == -INFINITY ? -0.0f : exp1k(s[i] - m, sh);
        s[i] = e;
        sum += e;
    }
    return sum;
}

static float a2_exp_row(float *s, int n, float m) { return exp_row_k(s, n, m, PA__CPU_P_EXP); }

static float a2_exp_row_unscaled(float *s, int n, float m) { return exp_row_k(s, n, m, 0); }

/* hsum8's tree with max for +: [max a0, ..., max a7] */
static inline __m256 hmax8(const __m256 *a)
{
#define PA_HMAX(x, y) _mm256_max_ps(_mm256_shuffle_ps((x), (y), 0x88), _mm256_shuffle_ps((x), (y), 0xdd))
    __m256 u0 = PA_HMAX(PA_HMAX(a[0], a[1]), PA_HMAX(a[2], a[3]));
    __m256 u1 = PA_HMAX(PA_HMAX(a[4], a[5]), PA_HMAX(a[6], a[7]));
#undef PA_HMAX
    return _mm256_max_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* any_neg_inf (cpu.h): 8 scores a compare, the tail one by one */
static bool a2_any_neg_inf(const float *s, int lds, int nr, int nc)
{
    __m256 any = _mm256_setzero_ps();
    bool tail = false;
    for (int r = 0; r < nr; r++) {
        const float *sr = s + (size_t)r * lds;
        int c = 0;
        for (; c + 8 <= nc; c += 8)
            any = _mm256_or_ps(any, _mm256_cmp_ps(_mm256_loadu_ps(sr + c), _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ));
        for (; c < nc; c++) tail |= sr[c] == -INFINITY;
    }
    return tail || _mm256_movemask_ps(any) != 0;
}

/* softmax_rows (cpu.h): the rows 8 at a time, their maxima by hmax8 and their sums by hsum8
 * (one tree per 8 rows where row_max and exp_row reduce each row on its own); tiles whose width
 * is not a multiple of 8 (exp_row's scalar tail) are declined to the driver's loop. */
static inline __attribute__((always_inline)) bool softmax_rows_k(float *s, int lds, int nr, int nc, float *m,
                                                                  float *l, float *alpha, const int sh)
{
    if (nr < 1 || nr > CPU_ROWS || nc < 8 || nc > CPU_KT || nc % 8) return false;
    float mn[CPU_ROWS];
    const __m256 ninf = _mm256_set1_ps(-INFINITY), pinf = _mm256_set1_ps(INFINITY);
    __m256 odd = _mm256_setzero_ps(); /* a NaN score, or an infinite maximum: declined */
    for (int r0 = 0; r0 < nr; r0 += 8) {
        const int g = nr - r0 < 8 ? nr - r0 : 8;
        __m256 mx[8];
        for (int i = 0; i < 8; i++) {
            const float *sr = s + (size_t)(r0 + (i < g ? i : g - 1)) * lds;
            __m256 x = ninf;
            for (int c = 0; c < nc; c += 8) {
                const __m256 y = _mm256_loadu_ps(sr + c);
                odd = _mm256_or_ps(odd, _mm256_cmp_ps(y, y, _CMP_UNORD_Q));
                x = _mm256_max_ps(x, y);
            }
            mx[i] = x;
        }
        const __m256 t = hmax8(mx);
        odd = _mm256_or_ps(odd, _mm256_or_ps(_mm256_cmp_ps(t, ninf, _CMP_EQ_OQ), _mm256_cmp_ps(t, pinf, _CMP_EQ_OQ)));
        _mm256_storeu_ps(mn + r0, t);
    }
    if (_mm256_movemask_ps(odd)) return false;
    for (int r = 0; r < nr; r++) /* a maximum that rose by more than 87: the driver's loop */
        if (pa__cpu_far(m[r] - mn[r])) return false;
    for (int r0 = 0; r0 < nr; r0 += 8) {
        const int g = nr - r0 < 8 ? nr - r0 : 8;
        __m256 acc[8];
        float mr[8], sum[8];
        for (int i = 0; i < 8; i++) {
            /* max(mx, m): m where equal, as the driver's "mx > m ? mx : m" */
            mr[i] = i < g ? (mn[r0 + i] > m[r0 + i] ? mn[r0 + i] : m[r0 + i]) : 0.0f;
            acc[i] = i < g ? exp_row_acc(s + (size_t)(r0 + i) * lds, nc, _mm256_set1_ps(mr[i]), sh) : _mm256_setzero_ps();
        }
        _mm256_storeu_ps(sum, hsum8(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7]));
        for (int i = 0; i < g; i++) {
            const int r = r0 + i;
            const float al = pa__cpu_alpha(m[r], mr[i]);
            l[r] = l[r] * al + sum[i];
            m[r] = mr[i];
            alpha[r] = al;
        }
    }
    return true;
}

static bool a2_softmax_rows(float *s, int lds, int nr, int nc, float *m, float *l, float *alpha)
{
    return softmax_rows_k(s, lds, nr, nc, m, l, alpha, PA__CPU_P_EXP);
}

static bool a2_softmax_rows_unscaled(float *s, int lds, int nr, int nc, float *m, float *l, float *alpha)
{
    return softmax_rows_k(s, lds, nr, nc, m, l, alpha, 0);
}

/* PA__CPU_E4M3F (cpu.h), E4M3 rows known to hold no NaN byte: the decode kernels convert them
 * without the NaN fix-up (4 of the conversion's ~11 operations per 16 values); a2_qk_src and
 * a2_pv_src check each call's rows first (pa__e4m3_rows_nan, cpu_x86_fp8.h) and take the exact
 * conversion when one is there. */

/* 8 elements of `dt` at p as f32 (dt is a constant after inlining). */
static inline __attribute__((always_inline)) __m256 cvt8(pa_dtype dt, const char *p)
{
    if (dt == PA__CPU_E4M3F) {
        __m128i h = pa__e4m3_to_f16x8(_mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)p)), false);
        return _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
    }
    switch (dt) {
    case PA_DTYPE_F16: return cvt_f16x8(p);
    case PA_DTYPE_BF16: return cvt_bf16x8(p);
    case PA_DTYPE_FP8_E5M2: return cvt_e5m2x8(p);
    case PA_DTYPE_FP8_E4M3: {
        __m128i h = pa__e4m3_to_f16x8(_mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)p)), true);
        return _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
    }
    default: return _mm256_loadu_ps((const float *)p);
    }
}

/* Converted and transposed in registers, 8 rows x 8 dims at a time, straight from the rows (no
 * intermediate copy); the last d % 8 dims one by one. */
static inline __attribute__((always_inline)) void load_rows_t_body(pa_dtype dtype, const void *const *rows, int n,
                                                                   int d, int dp, float *kt)
{
    const size_t es = pa_dtype_size(dtype);
    int n16 = (n + 15) & ~15, dv = d & ~7;
    for (int i0 = 0; i0 < n16; i0 += 8) {
        int m = n - i0 < 8 ? (n - i0 > 0 ? n - i0 : 0) : 8;
        for (int j = 0; j < dv; j += 8) {
            __m256 r[8];
            for (int i = 0; i < 8; i++)
                r[i] = i < m ? cvt8(dtype, (const char *)rows[i0 + i] + (size_t)j * es) : _mm256_setzero_ps();
            transpose8(r);
            for (int t = 0; t < 8; t++) _mm256_store_ps(kt + (size_t)(j + t) * CPU_KT + i0, r[t]);
        }
        for (int j = dv; j < dp; j++)
            for (int i = 0; i < 8; i++)
                kt[(size_t)j * CPU_KT + i0 + i] = i < m && j < d ? pa__load_f32(dtype, rows[i0 + i], j) : 0.0f;
    }
}

static void a2_load_rows_t(pa_dtype dtype, const void *const *rows, int n, int d, int dp, float *kt)
{
    switch (dtype) {
    case PA_DTYPE_F32: load_rows_t_body(PA_DTYPE_F32, rows, n, d, dp, kt); break;
    case PA_DTYPE_F16: load_rows_t_body(PA_DTYPE_F16, rows, n, d, dp, kt); break;
    case PA_DTYPE_BF16: load_rows_t_body(PA_DTYPE_BF16, rows, n, d, dp, kt); break;
    case PA_DTYPE_FP8_E4M3: load_rows_t_body(PA_DTYPE_FP8_E4M3, rows, n, d, dp, kt); break;
    case PA_DTYPE_FP8_E5M2: load_rows_t_body(PA_DTYPE_FP8_E5M2, rows, n, d, dp, kt); break;
    default: break;
    }
}

/* O[r] = O[r] * alpha[r] + sum_c P[r][c] V[c] over 4 rows at a time, then single rows; V row c is
 * vrows[c] in dtype dt (decode, straight from the cache) or, with vrows NULL, the dense fp32 row
 * vdense + c * dp (prefill scratch). */
static inline __attribute__((always_inline)) void pv_src_body(pa_dtype dt, const void *const *vrows, const float *vdense,
                                                              int nc, const float *p, int ldp, int nr,
                                                              int dp, const float *alpha,
                                                              const unsigned char *colmask, float *o)
{
    const size_t es = dt == PA_DTYPE_F32 ? 4 : dt == PA_DTYPE_F16 || dt == PA_DTYPE_BF16 ? 2 : 1;
    int r = 0;
    for (; r + 4 <= nr; r += 4) {
        const float *p0 = p + (size_t)r * ldp, *p1 = p0 + ldp, *p2 = p1 + ldp, *p3 = p2 + ldp;
        float *o0 = o + (size_t)r * dp, *o1 = o0 + dp, *o2 = o1 + dp, *o3 = o2 + dp;
        __m256 al0 = _mm256_set1_ps(alpha[r]), al1 = _mm256_set1_ps(alpha[r + 1]);
        __m256 al2 = _mm256_set1_ps(alpha[r + 2]), al3 = _mm256_set1_ps(alpha[r + 3]);
        for (int j = 0; j < dp; j += 16) {
            __m256 c00 = _mm256_mul_ps(_mm256_load_ps(o0 + j), al0);
            __m256 c01 = _mm256_mul_ps(_mm256_load_ps(o0 + j + 8), al0);
            __m256 c10 = _mm256_mul_ps(_mm256_load_ps(o1 + j), al1);
            __m256 c11 = _mm256_mul_ps(_mm256_load_ps(o1 + j + 8), al1);
            __m256 c20 = _mm256_mul_ps(_mm256_load_ps(o2 + j), al2);
            __m256 c21 = _mm256_mul_ps(_mm256_load_ps(o2 + j + 8), al2);
            __m256 c30 = _mm256_mul_ps(_mm256_load_ps(o3 + j), al3);
            __m256 c31 = _mm256_mul_ps(_mm256_load_ps(o3 + j + 8), al3);
            for (int c = 0; c < nc; c++) {
                if (colmask && !colmask[c]) continue;
                const char *vc = vrows ? (const char *)vrows[c] + j * es : (const char *)(vdense + (size_t)c * dp + j);
                __m256 x0 = cvt8(dt, vc), x1 = cvt8(dt, vc + 8 * es);
                __m256 w = _mm256_broadcast_ss(p0 + c);
                c00 = _mm256_fmadd_ps(w, x0, c00);
                c01 = _mm256_fmadd_ps(w, x1, c01);
                w = _mm256_broadcast_ss(p1 + c);
                c10 = _mm256_fmadd_ps(w, x0, c10);
                c11 = _mm256_fmadd_ps(w, x1, c11);
                w = _mm256_broadcast_ss(p2 + c);
                c20 = _mm256_fmadd_ps(w, x0, c20);
                c21 = _mm256_fmadd_ps(w, x1, c21);
                w = _mm256_broadcast_ss(p3 + c);
                c30 = _mm256_fmadd_ps(w, x0, c30);
                c31 = _mm256_fmadd_ps(w, x1, c31);
            }
            _mm256_store_ps(o0 + j, c00);
            _mm256_store_ps(o0 + j + 8, c01);
            _mm256_store_ps(o1 + j, c10);
            _mm256_store_ps(o1 + j + 8, c11);
            _mm256_store_ps(o2 + j, c20);
            _mm256_store_ps(o2 + j + 8, c21);
            _mm256_store_ps(o3 + j, c30);
            _mm256_store_ps(o3 + j + 8, c31);
        }
    }
    for (; r < nr; r++) {
        const float *pr = p + (size_t)r * ldp;
        float *orow = o + (size_t)r * dp;
        __m256 al = _mm256_set1_ps(alpha[r]);
        for (int j = 0; j < dp; j += 16) {
            __m256 a0 = _mm256_mul_ps(_mm256_load_ps(orow + j), al);
            __m256 a1 = _mm256_mul_ps(_mm256_load_ps(orow + j + 8), al);
            for (int c = 0; c < nc; c++) {
                if (colmask && !colmask[c]) continue;
                const char *vc = vrows ? (const char *)vrows[c] + j * es : (const char *)(vdense + (size_t)c * dp + j);
                __m256 w = _mm256_broadcast_ss(pr + c);
                a0 = _mm256_fmadd_ps(w, cvt8(dt, vc), a0);
                a1 = _mm256_fmadd_ps(w, cvt8(dt, vc + 8 * es), a1);
            }
            _mm256_store_ps(orow + j, a0);
            _mm256_store_ps(orow + j + 8, a1);
        }
    }
}

/* ---- O = O * alpha + P V ------------------------------------------------------------------ */

/* 6 rows x 16 dims: 12 accumulators (prefill tiles). Instantiated with the probability stride
 * a compile-time constant and with / without a column mask: with ldp and colmask as variables
 * gcc ran out of general registers and reloaded three row offsets from the stack, and tested
 * the mask, for every key (32 instructions per 12 FMAs; 24 now, as in qkt_block) */
static inline __attribute__((always_inline)) void pv6_rows(const float *p, int ldp, int r6, const float *v,
                                                           const void *const *vrows, int nc, int dp,
                                                           const float *alpha, const unsigned char *colmask,
                                                           float *o, const pa__cpu_pf *pf)
{
    int g = 0, ng = r6 / 6 * (dp / 16);
    if (!ng) pf_share(pf, 0, 1);
    for (int r = 0; r < r6; r += 6) {
        const float *p0 = p + (size_t)r * ldp;
        float *o0 = o + (size_t)r * dp;
        for (int j = 0; j < dp; j += 16) {
            pf_share(pf, g++, ng); /* one share per block of 6 rows x 16 dims */
            __m256 a[6][2];
            for (int i = 0; i < 6; i++) {
                __m256 al = _mm256_set1_ps(alpha[r + i]);
                a[i][0] = _mm256_mul_ps(_mm256_load_ps(o0 + (size_t)i * dp + j), al);
                a[i][1] = _mm256_mul_ps(_mm256_load_ps(o0 + (size_t)i * dp + j + 8), al);
            }
            for (int c = 0; c < nc; c++) {
                if (colmask && !colmask[c]) continue;
                /* (vrows: fp32 rows where they lie, pv_rows; else the dense scratch tile) */
                const float *vc = vrows ? (const float *)vrows[c] + j : v + (size_t)c * dp + j;
                __m256 x0 = vrows ? _mm256_loadu_ps(vc) : _mm256_load_ps(vc);
                __m256 x1 = vrows ? _mm256_loadu_ps(vc + 8) : _mm256_load_ps(vc + 8);
                for (int i = 0; i < 6; i++) {
                    __m256 w = _mm256_broadcast_ss(p0 + (size_t)i * ldp + c);
                    a[i][0] = _mm256_fmadd_ps(w, x0, a[i][0]);
                    a[i][1] = _mm256_fmadd_ps(w, x1, a[i][1]);
                }
            }
            for (int i = 0; i < 6; i++) {
                _mm256_store_ps(o0 + (size_t)i * dp + j, a[i][0]);
                _mm256_store_ps(o0 + (size_t)i * dp + j + 8, a[i][1]);
            }
        }
    }
}

static void a2_pv(const float *p, int ldp, int nr, const float *v, int nc, int dp,
                  const float *alpha, const unsigned char *colmask, float *o, const pa__cpu_pf *pf)
{
    int r = rows6(nr);
    if (ldp == CPU_KT && !colmask) pv6_rows(p, CPU_KT, r, v, NULL, nc, dp, alpha, NULL, o, pf);
    else if (ldp == CPU_KT) pv6_rows(p, CPU_KT, r, v, NULL, nc, dp, alpha, colmask, o, pf);
    else pv6_rows(p, ldp, r, v, NULL, nc, dp, alpha, colmask, o, pf);
    /* the rest: the decode PV body over dense fp32 rows */
    if (r < nr)
        pv_src_body(PA_DTYPE_F32, NULL, v, nc, p + (size_t)r * ldp, ldp, nr - r, dp, alpha + r, colmask,
                    o + (size_t)r * dp);
}

/* pv_rows (cpu.h): a2_pv over fp32 V rows where they lie */
static void a2_pv_rows(const float *p, int ldp, int nr, const void *const *vrows, int nc, int dp,
                       const float *alpha, const unsigned char *colmask, float *o, const pa__cpu_pf *pf)
{
    int r = rows6(nr);
    if (ldp == CPU_KT && !colmask) pv6_rows(p, CPU_KT, r, NULL, vrows, nc, dp, alpha, NULL, o, pf);
    else pv6_rows(p, ldp, r, NULL, vrows, nc, dp, alpha, colmask, o, pf);
    if (r < nr)
        pv_src_body(PA_DTYPE_F32, vrows, NULL, nc, p + (size_t)r * ldp, ldp, nr - r, dp, alpha + r, colmask,
                    o + (size_t)r * dp);
}

/* ---- decode: products straight from the cache rows ------------------------------------------ */

/* ---- decode, 4 query rows of one KV head at a time ---------------------------------------------
 * (GQA 4 is one group; GQA 8 two.) QK: 3 keys x 4 rows = 12 dot-product accumulators over 8-dim
 * steps (the last 2 or 4 keys as pairs over 16-dim steps), each K chunk converted once for the 4
 * rows; one reduction tree per key group. PV: the dims are the outer loop (24 at a time: 4 rows x
 * 3 vectors = 12 accumulators kept in registers over the whole tile, one key per step), each V
 * chunk converted once per key and used by the 4 rows' broadcast probabilities; when some keys
 * are masked, the visible ones are listed (with their probabilities pre-broadcast) before the
 * loop, so masked keys are never multiplied in. E4M3 is converted without its 2^8 factor (an
 * exact power of two), applied once to the scores and to the PV accumulators. Rows that are not
 * a group of 4 (GQA 1-3; the last rows of GQA 5-7) take the same kernels with 1-3 rows: more keys
 * (QK) or dims (PV) at a time for the same number of accumulators. */

/* Scores of 4 rows x 2 keys (c, c + 1) from hsum8(r0k0, r0k1, r1k0, r1k1, ..., r3k1). */
static inline __attribute__((always_inline)) void store4x2(float *s, int lds, int c, __m256 t)
{
    __m128 lo = _mm256_castps256_ps128(t), hi = _mm256_extractf128_ps(t, 1);
    _mm_storel_pi((__m64 *)(s + c), lo);
    _mm_storeh_pi((__m64 *)(s + lds + c), lo);
    _mm_storel_pi((__m64 *)(s + 2 * lds + c), hi);
    _mm_storeh_pi((__m64 *)(s + 3 * lds + c), hi);
}

/* 8 elements of dt as f32; E4M3 comes out 2^-8 times its value, as bf16 words (PA__CPU_E4M3B,
 * rows without NaN bytes; PA__CPU_E4M3BN, with the NaN fix-up of pa__e4m3_to_bf16x16) 2^-120
 * times. */
static inline __attribute__((always_inline)) __m256 cvt8r(pa_dtype dt, const char *p)
{
    if (dt == PA__CPU_E4M3B || dt == PA__CPU_E4M3BN) {
        __m128i x = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)p));
        __m128i h = _mm_and_si128(_mm_slli_epi16(x, 4), _mm_set1_epi16((short)0x87f0));
        if (dt == PA__CPU_E4M3BN) {
            __m128i nan = _mm_cmpeq_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7ff0)), _mm_set1_epi16(0x07f0));
            h = _mm_or_si128(h, _mm_and_si128(nan, _mm_set1_epi16(0x7fc0)));
        }
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    if (pa__cpu_is_e4m3(dt))
        return _mm256_cvtph_ps(
            pa__e4m3_to_f16x8(_mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)p)), dt == PA_DTYPE_FP8_E4M3));
    return cvt8(dt, p);
}

/* 16 elements of dt as f32 (E4M3: 2^-8 times), 8-bit types with 256-bit integer steps. */
static inline __attribute__((always_inline)) void cvt16r(pa_dtype dt, const char *p, __m256 *x0, __m256 *x1)
{
    if (pa__cpu_is_e4m3(dt)) {
        __m256i h = pa__e4m3_to_f16x16(p, dt == PA_DTYPE_FP8_E4M3);
        *x0 = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
        *x1 = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
    } else if (dt == PA__CPU_E4M3B || dt == PA__CPU_E4M3BN) { /* (the tail kernels' key pairs) */
        *x0 = cvt8r(dt, p);
        *x1 = cvt8r(dt, p + 8);
    } else if (dt == PA_DTYPE_FP8_E5M2) {
        __m256i h = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p)), 8);
        *x0 = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
        *x1 = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
    } else {
        const size_t es = dt == PA_DTYPE_F32 ? 4 : 2;
        *x0 = cvt8(dt, p);
        *x1 = cvt8(dt, p + 8 * es);
    }
}

static inline __attribute__((always_inline)) void qk4_body(pa_dtype dt, const void *const *krows, int nc,
                                                           const float *q, int d, int dp, float *s, int lds,
                                                           const pa__cpu_pf *pf)
{
    int pi = 0; /* pf rows issued so far: spread evenly over the key pairs */
    const size_t es = dt == PA_DTYPE_F32 ? 4 : dt == PA_DTYPE_F16 || dt == PA_DTYPE_BF16 ? 2 : 1;
    const float *q0 = q, *q1 = q0 + dp, *q2 = q1 + dp, *q3 = q2 + dp;
    const __m256 sc = _mm256_set1_ps(256.0f);
    int c = 0;
    /* 3 keys at a time over 8-dim steps, 12 accumulators with one FMA each per step (pairs over
     * 16-dim steps chain two FMAs per accumulator and step: at the FMA latency that is the whole
     * FMA throughput, with no slack); the last 2 or 4 keys go as pairs. fp8 keys too, converted
     * 8 at a time with 128-bit integer steps: on a Zen 1-class core (256-bit operations in two
     * halves) E4M3 decode 5% and E5M2 15% faster than pairs with 256-bit conversions
     * (bench/NOTES.md, eleventh pass) */
    for (; nc - c >= 3 && nc - c != 4; c += 3) {
        const char *k0 = krows[c], *k1 = krows[c + 1], *k2 = krows[c + 2];
        __m256 a[4][3];
        for (int h = 0; h < 4; h++) a[h][0] = a[h][1] = a[h][2] = _mm256_setzero_ps();
        for (int j = 0; j < d; j += 8) {
            __m256 x[3] = {cvt8r(dt, k0 + j * es), cvt8r(dt, k1 + j * es), cvt8r(dt, k2 + j * es)};
            for (int h = 0; h < 4; h++) {
                __m256 w = _mm256_load_ps(q0 + (size_t)h * dp + j);
                for (int u = 0; u < 3; u++) a[h][u] = _mm256_fmadd_ps(w, x[u], a[h][u]);
            }
        }
        __m256 t = hsum8(a[0][0], a[0][1], a[1][0], a[1][1], a[2][0], a[2][1], a[3][0], a[3][1]);
        __m256 z = _mm256_hadd_ps(_mm256_hadd_ps(a[0][2], a[1][2]), _mm256_hadd_ps(a[2][2], a[3][2]));
        __m128 u = _mm_add_ps(_mm256_castps256_ps128(z), _mm256_extractf128_ps(z, 1));
        if (pa__cpu_is_e4m3(dt)) t = _mm256_mul_ps(t, sc), u = _mm_mul_ps(u, _mm256_castps256_ps128(sc));
        if (pf) {
            int pe = (int)((int64_t)(c + 3) * pf->n / nc);
            pf_rows(pf, pi, pe);
            pi = pe;
        }
        __m128 lo = _mm256_castps256_ps128(t), hi = _mm256_extractf128_ps(t, 1);
        float uu[4];
        _mm_storeu_ps(uu, u);
        _mm_storel_pi((__m64 *)(s + c), lo);
        _mm_storeh_pi((__m64 *)(s + lds + c), lo);
        _mm_storel_pi((__m64 *)(s + 2 * lds + c), hi);
        _mm_storeh_pi((__m64 *)(s + 3 * lds + c), hi);
        for (int i = 0; i < 4; i++) s[(size_t)i * lds + c + 2] = uu[i];
    }
    for (; c + 2 <= nc; c += 2) {
        const char *k0 = krows[c], *k1 = krows[c + 1];
        __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00;
        __m256 a20 = a00, a21 = a00, a30 = a00, a31 = a00;
        /* the 4 rows' FMAs over 8 dims from jj of the two keys (x0, x1) */
#define QK4X2(jj, x0, x1)                                                                            \
    do {                                                                                             \
        __m256 w = _mm256_load_ps(q0 + (jj));                                                        \
        a00 = _mm256_fmadd_ps(w, x0, a00);                                                           \
        a01 = _mm256_fmadd_ps(w, x1, a01);                                                           \
        w = _mm256_load_ps(q1 + (jj));                                                               \
        a10 = _mm256_fmadd_ps(w, x0, a10);                                                           \
        a11 = _mm256_fmadd_ps(w, x1, a11);                                                           \
        w = _mm256_load_ps(q2 + (jj));                                                               \
        a20 = _mm256_fmadd_ps(w, x0, a20);                                                           \
        a21 = _mm256_fmadd_ps(w, x1, a21);                                                           \
        w = _mm256_load_ps(q3 + (jj));                                                               \
        a30 = _mm256_fmadd_ps(w, x0, a30);                                                           \
        a31 = _mm256_fmadd_ps(w, x1, a31);                                                           \
    } while (0)
        int j = 0;
        for (; j + 16 <= d; j += 16) {
            __m256 x0, y0, x1, y1;
            cvt16r(dt, k0 + j * es, &x0, &y0);
            cvt16r(dt, k1 + j * es, &x1, &y1);
            QK4X2(j, x0, x1);
            QK4X2(j + 8, y0, y1);
        }
        if (j < d) { /* the last 8 dims of a head size 8 past a multiple of 16 (qk_src_tail) */
            const __m256 x0 = cvt8r(dt, k0 + j * es), x1 = cvt8r(dt, k1 + j * es);
            QK4X2(j, x0, x1);
        }
#undef QK4X2
        __m256 t = hsum8(a00, a01, a10, a11, a20, a21, a30, a31);
        if (pf) {
            int pe = (int)((int64_t)(c + 2) * pf->n / nc);
            pf_rows(pf, pi, pe);
            pi = pe;
        }
        if (pa__cpu_is_e4m3(dt)) t = _mm256_mul_ps(t, sc);
        store4x2(s, lds, c, t);
    }
    if (c < nc) {
        const char *k0 = krows[c];
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, z = a0;
        for (int j = 0; j < d; j += 8) {
            __m256 x = cvt8r(dt, k0 + j * es);
            a0 = _mm256_fmadd_ps(_mm256_load_ps(q0 + j), x, a0);
            a1 = _mm256_fmadd_ps(_mm256_load_ps(q1 + j), x, a1);
            a2 = _mm256_fmadd_ps(_mm256_load_ps(q2 + j), x, a2);
            a3 = _mm256_fmadd_ps(_mm256_load_ps(q3 + j), x, a3);
        }
        __m256 t = hsum8(a0, a1, a2, a3, z, z, z, z);
        if (pa__cpu_is_e4m3(dt)) t = _mm256_mul_ps(t, sc);
        float u[8];
        _mm256_storeu_ps(u, t);
        for (int i = 0; i < 4; i++) s[(size_t)i * lds + c] = u[i];
    }
    if (pf) pf_rows(pf, pi, pf->n);
}

/* s[h * lds + u] = mul * (sum of a[h * KN + u]'s lanes) for h < R, u < KN, 8 sums per hsum8,
 * whose tree adds each vector's lanes in the same order wherever it sits. */
static inline __attribute__((always_inline)) void store_sums(const __m256 *a, int R, int KN, float mul, float *s,
                                                             int lds)
{
    const int n = R * KN;
    const __m256 z = _mm256_setzero_ps();
    for (int g = 0; g < n; g += 8) {
#define SUMS_A(i) (g + (i) < n ? a[g + (i)] : z)
        __m256 t = hsum8(SUMS_A(0), SUMS_A(1), SUMS_A(2), SUMS_A(3), SUMS_A(4), SUMS_A(5), SUMS_A(6), SUMS_A(7));
#undef SUMS_A
        if (mul != 1.0f) t = _mm256_mul_ps(t, _mm256_set1_ps(mul));
        float u[8];
        _mm256_storeu_ps(u, t);
        for (int i = g; i < n && i < g + 8; i++) s[(size_t)(i / KN) * lds + i % KN] = u[i - g];
    }
}

/* Scores of R (1-3) rows x KN keys (krows[0 .. KN)): R x KN accumulators over 8-dim steps,
 * each K chunk converted once for the R rows (one row: converted where it is used). The sums go
 * through hsum8, 8 at a time, whose tree adds each vector's lanes in the same order wherever it
 * sits, so a score does not depend on KN or on its key's place in the tile. */
static inline __attribute__((always_inline)) void qkr_keys(int R, int KN, pa_dtype dt, const void *const *krows,
                                                           const float *q, int d, int dp, float *s, int lds)
{
    const size_t es = dt == PA_DTYPE_F32 ? 4 : dt == PA_DTYPE_F16 || dt == PA_DTYPE_BF16 ? 2 : 1;
    const int n = R * KN;
    __m256 a[12];
    for (int i = 0; i < n; i++) a[i] = _mm256_setzero_ps();
    for (int j = 0; j < d; j += 8) {
        if (R == 1) {
            __m256 w = _mm256_load_ps(q + j);
            for (int u = 0; u < KN; u++) a[u] = _mm256_fmadd_ps(w, cvt8r(dt, (const char *)krows[u] + j * es), a[u]);
            continue;
        }
        __m256 x[4];
        for (int u = 0; u < KN; u++) x[u] = cvt8r(dt, (const char *)krows[u] + j * es);
        for (int h = 0; h < R; h++) {
            __m256 w = _mm256_load_ps(q + (size_t)h * dp + j);
            for (int u = 0; u < KN; u++) a[h * KN + u] = _mm256_fmadd_ps(w, x[u], a[h * KN + u]);
        }
    }
    store_sums(a, R, KN, pa__cpu_is_e4m3(dt) ? 256.0f : 1.0f, s, lds);
}

/* Keeps a loaded vector in a register: gcc folds a load into every instruction that uses it
 * when it can, so a query vector feeding two FMAs was loaded twice (20 loads per 16 FMAs, more
 * than a Zen 1-class core's one 256-bit load per cycle keeps up with). */
#define PIN(x) __asm__("" : "+x"(x))

/* 16 values of a bf16 row (as loaded) or an E4M3 row (PA__CPU_E4M3B / BN: as bf16 words) at
 * element j, for the pair-split kernels: lane i holds values 2i (low half) and 2i + 1. */
static inline __attribute__((always_inline)) __m256i pair_words(pa_dtype dt, const void *row, int j)
{
    if (dt == PA_DTYPE_BF16) return _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + j));
    return pa__e4m3_to_bf16x16((const uint8_t *)row + j, dt == PA__CPU_E4M3BN);
}

/* QK of R (1-3) pair-split query rows over KN bf16 or E4M3 (bf16 words) keys, 16-dim steps: the
 * lanes of every accumulator take the even dims, then the odd ones, of each step, as in
 * qk4_pairs, and the sums go through hsum8, so a score is the same whatever R, KN or its key's
 * place. 1-2 rows: the query vectors of a step stay in registers (2R) and each key is converted
 * where it is used (KN x R accumulators + 2R + 3 registers); 3 rows: qk4_pairs' order (the key
 * words and their conversions held, one query vector at a time). */
static inline __attribute__((always_inline)) void qkp_keys(int R, int KN, pa_dtype dt, const void *const *krows,
                                                           const float *q, int dp, float *s, int lds)
{
    const __m256i odd = _mm256_set1_epi32((int)0xffff0000u);
    const int n = R * KN;
    __m256 a[12];
    for (int i = 0; i < n; i++) a[i] = _mm256_setzero_ps();
    for (int j = 0; j < dp; j += 16) {
        if (R <= 2) {
            __m256 qe[2], qo[2];
            for (int h = 0; h < R; h++) {
                qe[h] = _mm256_load_ps(q + (size_t)h * dp + j);
                qo[h] = _mm256_load_ps(q + (size_t)h * dp + j + 8);
                PIN(qe[h]);
                PIN(qo[h]);
            }
            for (int u = 0; u < KN; u++) {
                __m256i w = pair_words(dt, krows[u], j);
                __m256 xe = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
                __m256 xo = _mm256_castsi256_ps(_mm256_and_si256(w, odd));
                for (int h = 0; h < R; h++) a[h * KN + u] = _mm256_fmadd_ps(qe[h], xe, a[h * KN + u]);
                for (int h = 0; h < R; h++) a[h * KN + u] = _mm256_fmadd_ps(qo[h], xo, a[h * KN + u]);
            }
            continue;
        }
        __m256i w[2];
        for (int u = 0; u < KN; u++) {
            w[u] = pair_words(dt, krows[u], j);
            PIN(w[u]);
        }
        for (int e = 0; e < 2; e++) {
            __m256 x[2];
            for (int u = 0; u < KN; u++)
                x[u] = _mm256_castsi256_ps(e ? _mm256_and_si256(w[u], odd) : _mm256_slli_epi32(w[u], 16));
            for (int h = 0; h < R; h++) {
                __m256 qv = _mm256_load_ps(q + (size_t)h * dp + j + 8 * e);
                PIN(qv);
                for (int u = 0; u < KN; u++) a[h * KN + u] = _mm256_fmadd_ps(qv, x[u], a[h * KN + u]);
            }
        }
    }
    store_sums(a, R, KN, 1.0f, s, lds);
}

/* QK of R (1-3) rows: the rows of a KV head that are not a group of 4 (GQA 1, 2, 3; the last
 * 1-3 rows of GQA 5-7), by qkp_keys (pairs: bf16 keys, pair-split rows) or qkr_keys. Keys in
 * groups of KN (1 row: 4; 2 rows: 3 pair-split, else 4; 3 rows: 2 pair-split, else 3), the rest
 * in groups of 2 and 1; prefetches spread over the groups as in qk4_body. One row takes 4 keys,
 * not 8: 8 key rows read at once ran MHA 7-15% slower from DRAM (bench/NOTES.md, thirteenth
 * pass). */
static inline __attribute__((always_inline)) void qkr_body(bool pairs, int R, pa_dtype dt, const void *const *krows,
                                                           int nc, const float *q, int d, int dp, float *s, int lds,
                                                           const pa__cpu_pf *pf)
{
    const int KN = R == 1 ? 4 : R == 2 ? (pairs ? 3 : 4) : (pairs ? 2 : 3);
#define QKR_KEYS(n)                                                                                  \
    do {                                                                                             \
        if (pairs) qkp_keys(R, n, dt, krows + c, q, dp, s + c, lds);                                 \
        else qkr_keys(R, n, dt, krows + c, q, d, dp, s + c, lds);                                    \
    } while (0)
    int c = 0, pi = 0;
    for (; c + KN <= nc; c += KN) {
        QKR_KEYS(KN);
        if (pf) {
            int pe = (int)((int64_t)(c + KN) * pf->n / nc);
            pf_rows(pf, pi, pe);
            pi = pe;
        }
    }
    if (KN > 2 && nc - c >= 2) {
        QKR_KEYS(2);
        c += 2;
    }
    if (c < nc) QKR_KEYS(1);
#undef QKR_KEYS
    if (pf) pf_rows(pf, pi, pf->n);
}

/* dims [j, j + 8 NV) of R (1-4) rows over the listed keys; probabilities broadcast from p (rows
 * ldp apart, all keys listed) or, when pb is given, read pre-broadcast from pb (32 per key, 8
 * per row) */
static inline __attribute__((always_inline)) void pvr_chunk(int R, int NV, pa_dtype dt, const void *const *vl,
                                                            const float *p, int ldp, const float *pb,
                                                            int nv, int j, int dp, const float *alpha,
                                                            float *o)
{
    const size_t es = dt == PA_DTYPE_F32 ? 4 : dt == PA_DTYPE_F16 || dt == PA_DTYPE_BF16 ? 2 : 1;
    const float in = pa__cpu_is_e4m3(dt) ? 1.0f / 256.0f : 1.0f;
    /* bf16, each pair of vectors: "pair split". One 32-byte load holds dims 2i (low half of
     * 32-bit word i) and 2i + 1 (high half): a shift gives the even dims, an AND the odd ones, 2
     * operations per 16 values against 4 (zero-extend and shift, twice). Their accumulators start
     * at 0 and hold dims (0 2 .. 14) and (1 3 .. 15); the end interleaves them (4 shuffles per row
     * and pair, once per call) and adds them to alpha * O. bf16 decode 1-3% faster on a Zen
     * 1-class core, where every 256-bit operation takes two issue slots (bench/NOTES.md, tenth
     * pass). */
    const bool split = dt == PA_DTYPE_BF16 || dt == PA__CPU_E4M3B || dt == PA__CPU_E4M3BN;
    const int NS = split ? NV / 2 * 2 : 0; /* vectors that come pair-split */
    __m256 acc[4][8];
    for (int h = 0; h < R; h++) {
        __m256 al = _mm256_set1_ps(alpha[h] * in);
        for (int u = 0; u < NV; u++)
            acc[h][u] = u < NS ? _mm256_setzero_ps() : _mm256_mul_ps(_mm256_load_ps(o + (size_t)h * dp + j + 8 * u), al);
    }
    /* V vectors u and u + 1 (u < NS: pair-split; else 16 values converted at once) */
#define PVR_CVT2(u, x0, x1)                                                                          \
    do {                                                                                             \
        if ((u) < NS) {                                                                              \
            __m256i wd = pair_words(dt, vp, (u) * 8);                                                \
            x0 = _mm256_castsi256_ps(_mm256_slli_epi32(wd, 16));                                     \
            x1 = _mm256_castsi256_ps(_mm256_and_si256(wd, _mm256_set1_epi32((int)0xffff0000u)));    \
        } else                                                                                       \
            cvt16r(dt, vp + (u) * 8 * es, &x0, &x1);                                                 \
    } while (0)
#define PVR_W(i, h) (pb ? _mm256_load_ps(pb + (size_t)(i) * 32 + 8 * (h)) : _mm256_broadcast_ss(p + (size_t)(h) * ldp + (i)))
    /* 3-4 rows: the V vectors of a key converted first, then each row's probability (13-16
     * registers); 1-2 rows: the probabilities first, then each V pair converted and used (8
     * accumulators + 2 + 2). Unrolled by two keys, gcc spilled accumulators to the stack. */
    for (int i = 0; i < nv; i++) {
        const char *vp = (const char *)vl[i] + (size_t)j * es;
        if (R >= 3 && NV <= 3) { /* (pvr_dims gives 3-4 rows at most 3 vectors) */
            __m256 x[3];
            if (NV >= 2) PVR_CVT2(0, x[0], x[1]);
            if (NV != 2) x[NV - 1] = cvt8r(dt, vp + (size_t)(NV - 1) * 8 * es);
            for (int h = 0; h < R; h++) {
                __m256 wv = PVR_W(i, h);
                for (int v = 0; v < NV; v++) acc[h][v] = _mm256_fmadd_ps(wv, x[v], acc[h][v]);
            }
        } else {
            __m256 wv[4];
            for (int h = 0; h < R; h++) wv[h] = PVR_W(i, h);
            int u = 0;
            for (; u + 2 <= NV; u += 2) {
                __m256 x0, x1;
                PVR_CVT2(u, x0, x1);
                for (int h = 0; h < R; h++) {
                    acc[h][u] = _mm256_fmadd_ps(wv[h], x0, acc[h][u]);
                    acc[h][u + 1] = _mm256_fmadd_ps(wv[h], x1, acc[h][u + 1]);
                }
            }
            if (u < NV) {
                __m256 x0 = cvt8r(dt, vp + u * 8 * es);
                for (int h = 0; h < R; h++) acc[h][u] = _mm256_fmadd_ps(wv[h], x0, acc[h][u]);
            }
        }
    }
#undef PVR_W
#undef PVR_CVT2
    const __m256 out = _mm256_set1_ps(256.0f);
    for (int h = 0; h < R; h++)
        for (int u = NS; u < NV; u++)
            _mm256_store_ps(o + (size_t)h * dp + j + 8 * u, pa__cpu_is_e4m3(dt) ? _mm256_mul_ps(acc[h][u], out) : acc[h][u]);
    for (int h = 0; h < R; h++)
        for (int u = 0; u < NS; u += 2) {
            float *oh = o + (size_t)h * dp + j + 8 * u;
            __m256 al = _mm256_set1_ps(alpha[h]);
            __m256 lo = _mm256_unpacklo_ps(acc[h][u], acc[h][u + 1]); /* dims 0-3 | 8-11 */
            __m256 hi = _mm256_unpackhi_ps(acc[h][u], acc[h][u + 1]); /* dims 4-7 | 12-15 */
            _mm256_store_ps(oh, _mm256_fmadd_ps(_mm256_load_ps(oh), al, _mm256_permute2f128_ps(lo, hi, 0x20)));
            _mm256_store_ps(oh + 8, _mm256_fmadd_ps(_mm256_load_ps(oh + 8), al, _mm256_permute2f128_ps(lo, hi, 0x31)));
        }
}

/* (pf: a share of the rows before each chunk of dims, in proportion to its width). Chunks of
 * 24 dims for 3-4 rows (12 accumulators with 4), 32 for 2 rows, 64 for one. */
static inline __attribute__((always_inline)) void pvr_dims(int R, pa_dtype dt, const void *const *vl, const float *p,
                                                           int ldp, const float *pb, int nv, int d, int dp,
                                                           const float *alpha, float *o, const pa__cpu_pf *pf)
{
    const int NVM = R == 1 ? 8 : R == 2 ? 4 : 3;
    int j = 0, pi = 0;
    /* (the same step as in qk4_body, written out: an always-inline helper for it changed gcc's
     * register allocation here and put an fp8 accumulator on the stack) */
#define PVR_PF(w)                                                                                    \
    do {                                                                                             \
        if (pf) {                                                                                    \
            int pe = (int)((int64_t)(j + (w)) * pf->n / d);                                          \
            pf_rows(pf, pi, pe);                                                                     \
            pi = pe;                                                                                 \
        }                                                                                            \
    } while (0)
    for (; j + 8 * NVM <= d; j += 8 * NVM) {
        PVR_PF(8 * NVM);
        pvr_chunk(R, NVM, dt, vl, p, ldp, pb, nv, j, dp, alpha, o);
    }
    if (NVM > 4 && j + 32 <= d) {
        PVR_PF(32);
        pvr_chunk(R, 4, dt, vl, p, ldp, pb, nv, j, dp, alpha, o);
        j += 32;
    }
    for (; j + 16 <= d; j += 16) {
        PVR_PF(16);
        pvr_chunk(R, 2, dt, vl, p, ldp, pb, nv, j, dp, alpha, o);
    }
    for (; j < d; j += 8) {
        PVR_PF(8);
        pvr_chunk(R, 1, dt, vl, p, ldp, pb, nv, j, dp, alpha, o);
    }
#undef PVR_PF
}

static inline __attribute__((always_inline)) void pvr_body(int R, pa_dtype dt, const void *const *vrows, int nc,
                                                           const float *p, int ldp, int d, int dp,
                                                           const float *alpha, const unsigned char *colmask,
                                                           float *o, const pa__cpu_pf *pf)
{
    if (!colmask) { /* every key of the tile: probabilities broadcast in the loop */
        pvr_dims(R, dt, vrows, p, ldp, NULL, nc, d, dp, alpha, o, pf);
        return;
    }
    const void *vl[CPU_KT];
    float pb[CPU_KT * 32] __attribute__((aligned(32)));
    int nv = 0;
    for (int c = 0; c < nc; c++) {
        if (!colmask[c]) continue;
        vl[nv] = vrows[c];
        for (int h = 0; h < R; h++) _mm256_store_ps(pb + (size_t)nv * 32 + 8 * h, _mm256_broadcast_ss(p + (size_t)h * ldp + c));
        nv++;
    }
    pvr_dims(R, dt, vl, p, ldp, pb, nv, d, dp, alpha, o, pf);
}

/* Groups of 4 rows, then the rest (1-3 rows); each group prefetches its share of pf. */
static inline __attribute__((always_inline)) void qk_src_rows(pa_dtype dt, const void *const *krows, int nc,
                                                              const float *q, int nr, int d, int dp, float *s,
                                                              int lds, const pa__cpu_pf *pf)
{
    int r = 0, ng = (nr + 3) / 4;
    for (; r + 4 <= nr; r += 4) {
        pa__cpu_pf part = pf_part(pf, r / 4, ng);
        qk4_body(dt, krows, nc, q + (size_t)r * dp, d, dp, s + (size_t)r * lds, lds, pf ? &part : NULL);
    }
    if (r < nr) {
        pa__cpu_pf part = pf_part(pf, r / 4, ng);
        const float *qr = q + (size_t)r * dp;
        float *sr = s + (size_t)r * lds;
        switch (nr - r) {
        case 1: qkr_body(false, 1, dt, krows, nc, qr, d, dp, sr, lds, pf ? &part : NULL); break;
        case 2: qkr_body(false, 2, dt, krows, nc, qr, d, dp, sr, lds, pf ? &part : NULL); break;
        default: qkr_body(false, 3, dt, krows, nc, qr, d, dp, sr, lds, pf ? &part : NULL); break;
        }
    }
}

static inline __attribute__((always_inline)) void pv_src_rows(pa_dtype dt, const void *const *vrows, int nc,
                                                              const float *p, int ldp, int nr, int d, int dp,
                                                              const float *alpha, const unsigned char *colmask,
                                                              float *o, const pa__cpu_pf *pf)
{
    int r = 0, ng = (nr + 3) / 4;
    for (; r + 4 <= nr && nc <= CPU_KT; r += 4) {
        pa__cpu_pf part = pf_part(pf, r / 4, ng);
        pvr_body(4, dt, vrows, nc, p + (size_t)r * ldp, ldp, d, dp, alpha + r, colmask, o + (size_t)r * dp,
                 pf ? &part : NULL);
    }
    if (r < nr && nc <= CPU_KT) {
        pa__cpu_pf part = pf_part(pf, r / 4, ng);
        const float *pr = p + (size_t)r * ldp;
        float *orow = o + (size_t)r * dp;
        switch (nr - r) {
        case 1: pvr_body(1, dt, vrows, nc, pr, ldp, d, dp, alpha + r, colmask, orow, pf ? &part : NULL); break;
        case 2: pvr_body(2, dt, vrows, nc, pr, ldp, d, dp, alpha + r, colmask, orow, pf ? &part : NULL); break;
        default: pvr_body(3, dt, vrows, nc, pr, ldp, d, dp, alpha + r, colmask, orow, pf ? &part : NULL); break;
        }
    } else if (r < nr) {
        /* the rest of pf at once (nc > CPU_KT: all of it) */
        pa__cpu_pf part = pf_part(pf, r / 4, ng);
        if (pf) part.n = (int)(pf->rows + pf->n - part.rows);
        pf_rows(pf ? &part : NULL, 0, part.n);
        pv_src_body(dt, vrows, NULL, nc, p + (size_t)r * ldp, ldp, nr - r, dp, alpha + r, colmask, o + (size_t)r * dp);
    }
}

/* QK of 4 pair-split query rows (pa__cpu_pair_split) over bf16 key rows, two keys at a time
 * over 16-dim steps: one 32-byte load per key, its even dims by a shift, its odd dims by an AND,
 * 8 accumulators (12 with three keys would need 17 registers with the converted keys, the mask
 * and a query vector). Every key's lanes sum the same dims in the same order, the lone last key
 * included, so a score does not depend on the key's place in the tile. */
static inline __attribute__((always_inline)) void qk4_pairs(pa_dtype dt, const void *const *krows, int nc,
                                                            const float *q, int dp, float *s, int lds,
                                                            const pa__cpu_pf *pf)
{
    int pi = 0;
    const __m256i odd = _mm256_set1_epi32((int)0xffff0000u);
    int c = 0;
    for (; c + 2 <= nc; c += 2) {
        const void *k0 = krows[c], *k1 = krows[c + 1];
        __m256 a[4][2];
        for (int h = 0; h < 4; h++) a[h][0] = a[h][1] = _mm256_setzero_ps();
        for (int j = 0; j < dp; j += 16) {
            __m256i w0 = pair_words(dt, k0, j);
            __m256i w1 = pair_words(dt, k1, j);
            PIN(w0);
            PIN(w1);
            for (int e = 0; e < 2; e++) { /* the even dims, then the odd ones */
                __m256 x0 = _mm256_castsi256_ps(e ? _mm256_and_si256(w0, odd) : _mm256_slli_epi32(w0, 16));
                __m256 x1 = _mm256_castsi256_ps(e ? _mm256_and_si256(w1, odd) : _mm256_slli_epi32(w1, 16));
                for (int h = 0; h < 4; h++) {
                    __m256 w = _mm256_load_ps(q + (size_t)h * dp + j + 8 * e);
                    PIN(w);
                    a[h][0] = _mm256_fmadd_ps(w, x0, a[h][0]);
                    a[h][1] = _mm256_fmadd_ps(w, x1, a[h][1]);
                }
            }
        }
        __m256 t = hsum8(a[0][0], a[0][1], a[1][0], a[1][1], a[2][0], a[2][1], a[3][0], a[3][1]);
        if (pf) {
            int pe = (int)((int64_t)(c + 2) * pf->n / nc);
            pf_rows(pf, pi, pe);
            pi = pe;
        }
        store4x2(s, lds, c, t);
    }
    if (c < nc) {
        const void *k0 = krows[c];
        __m256 a[4], z = _mm256_setzero_ps();
        for (int h = 0; h < 4; h++) a[h] = z;
        for (int j = 0; j < dp; j += 16) {
            const __m256i w0 = pair_words(dt, k0, j);
            for (int e = 0; e < 2; e++) {
                __m256 x = _mm256_castsi256_ps(e ? _mm256_and_si256(w0, odd) : _mm256_slli_epi32(w0, 16));
                for (int h = 0; h < 4; h++)
                    a[h] = _mm256_fmadd_ps(_mm256_load_ps(q + (size_t)h * dp + j + 8 * e), x, a[h]);
            }
        }
        float u[8];
        _mm256_storeu_ps(u, hsum8(a[0], a[1], a[2], a[3], z, z, z, z));
        for (int i = 0; i < 4; i++) s[(size_t)i * lds + c] = u[i];
    }
    if (pf) pf_rows(pf, pi, pf->n);
}

/* (separate functions: inlined into one caller, the bf16 kernel ran ~7% slower, L1-resident) */
static __attribute__((noinline)) void qk4_pairs_bf16(const void *const *krows, int nc, const float *q, int dp,
                                                     float *s, int lds, const pa__cpu_pf *pf)
{
    qk4_pairs(PA_DTYPE_BF16, krows, nc, q, dp, s, lds, pf);
}

static __attribute__((noinline)) void qk4_pairs_e4m3(const void *const *krows, int nc, const float *q, int dp,
                                                     float *s, int lds, const pa__cpu_pf *pf)
{
    qk4_pairs(PA__CPU_E4M3B, krows, nc, q, dp, s, lds, pf);
}

static inline __attribute__((always_inline)) void qk_pairs_rows(pa_dtype dt, const void *const *krows, int nc,
                                                                const float *q, int nr, int dp, float *s,
                                                                int lds, const pa__cpu_pf *pf)
{
    const int ng = (nr + 3) / 4;
    int g = 0;
    for (; 4 * g + 4 <= nr; g++) {
        pa__cpu_pf part = pf_part(pf, g, ng);
        const float *qg = q + (size_t)4 * g * dp;
        float *sg = s + (size_t)4 * g * lds;
        if (dt == PA_DTYPE_BF16) qk4_pairs_bf16(krows, nc, qg, dp, sg, lds, pf ? &part : NULL);
        else if (dt == PA__CPU_E4M3B) qk4_pairs_e4m3(krows, nc, qg, dp, sg, lds, pf ? &part : NULL);
        else qk4_pairs(PA__CPU_E4M3BN, krows, nc, qg, dp, sg, lds, pf ? &part : NULL);
    }
    if (4 * g < nr) {
        pa__cpu_pf part = pf_part(pf, g, ng);
        const float *qr = q + (size_t)4 * g * dp;
        float *sr = s + (size_t)4 * g * lds;
        switch (nr - 4 * g) {
        case 1: qkr_body(true, 1, dt, krows, nc, qr, dp, dp, sr, lds, pf ? &part : NULL); break;
        case 2: qkr_body(true, 2, dt, krows, nc, qr, dp, dp, sr, lds, pf ? &part : NULL); break;
        default: qkr_body(true, 3, dt, krows, nc, qr, dp, dp, sr, lds, pf ? &part : NULL); break;
        }
    }
}

/* pair_split (cpu.h): 16 values at a time, the even ones gathered by one shuffle within each
 * 128-bit half and a permute of 64-bit pairs across them, the odd ones likewise; a group's loads
 * all before its stores (in place). Instances per span and for mul 1 (with a variable span the
 * group's vectors went through the stack: 18k instructions per 32 x 128 query rows). */
static inline __attribute__((always_inline)) void pair_split_k(float *q, size_t n, const int span, const bool mul1,
                                                               float mul)
{
    const __m256 m = _mm256_set1_ps(mul);
    const int half = span / 2, nk = span / 16;
    for (size_t j = 0; j + (size_t)span <= n; j += (size_t)span) {
        float *b = q + j;
        __m256 ev[4], od[4];
        for (int k = 0; k < nk; k++) {
            const __m256 x = _mm256_loadu_ps(b + 16 * k), y = _mm256_loadu_ps(b + 16 * k + 8);
            ev[k] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(x, y, 0x88)), 0xd8));
            od[k] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(x, y, 0xdd)), 0xd8));
        }
        for (int k = 0; k < nk; k++) {
            _mm256_storeu_ps(b + 8 * k, mul1 ? ev[k] : _mm256_mul_ps(ev[k], m));
            _mm256_storeu_ps(b + half + 8 * k, mul1 ? od[k] : _mm256_mul_ps(od[k], m));
        }
    }
}

static void a2_pair_split(float *q, size_t n, int span, float mul)
{
    const bool one = mul == 1.0f;
    switch (span) {
    case 16: one ? pair_split_k(q, n, 16, true, mul) : pair_split_k(q, n, 16, false, mul); break;
    case 32: one ? pair_split_k(q, n, 32, true, mul) : pair_split_k(q, n, 32, false, mul); break;
    case 48: pair_split_k(q, n, 48, false, mul); break;
    default: pair_split_k(q, n, 64, false, mul); break;
    }
}

/* bf16 keys, or E4M3 keys as bf16 words (PA__CPU_E4M3B; the rows scanned for NaN bytes first,
 * as in a2_qk_src) */
static void a2_qk_src_pairs(pa_dtype dtype, const void *const *krows, int nc, const float *q, int nr, int dp,
                            float *s, int lds, const pa__cpu_pf *pf)
{
    if (dtype == PA_DTYPE_BF16) qk_pairs_rows(PA_DTYPE_BF16, krows, nc, q, nr, dp, s, lds, pf);
    else if (pa__e4m3_rows_nan(krows, nc, dp)) qk_pairs_rows(PA__CPU_E4M3BN, krows, nc, q, nr, dp, s, lds, pf);
    else qk_pairs_rows(PA__CPU_E4M3B, krows, nc, q, nr, dp, s, lds, pf);
}

/* qk_src and qk_src_tail: d the dims read from each row (d == dp for qk_src; a multiple of 8 for
 * qk_src_tail: the 3-key and 1-key loops step 8 dims, the 2-key loop 16 and then the last 8).
 * E4M3 as bf16 words (PA__CPU_E4M3B) reaches only qk_src_tail: the driver takes qk_src_pairs for
 * it at head sizes that are multiples of 16. */
static inline __attribute__((always_inline)) void qk_src_d(pa_dtype dtype, const void *const *krows, int nc,
                                                           const float *q, int nr, int d, int dp, float *s,
                                                           int lds, const pa__cpu_pf *pf)
{
    switch ((int)dtype) {
    case PA_DTYPE_F32: qk_src_rows(PA_DTYPE_F32, krows, nc, q, nr, d, dp, s, lds, pf); break;
    case PA_DTYPE_F16: qk_src_rows(PA_DTYPE_F16, krows, nc, q, nr, d, dp, s, lds, pf); break;
    case PA_DTYPE_BF16: qk_src_rows(PA_DTYPE_BF16, krows, nc, q, nr, d, dp, s, lds, pf); break;
    case PA_DTYPE_FP8_E4M3:
        if (pa__e4m3_rows_nan(krows, nc, d)) qk_src_rows(PA_DTYPE_FP8_E4M3, krows, nc, q, nr, d, dp, s, lds, pf);
        else qk_src_rows(PA__CPU_E4M3F, krows, nc, q, nr, d, dp, s, lds, pf);
        break;
    case PA__CPU_E4M3B: /* (at d == dp the driver takes qk_src_pairs; these rows work there too) */
        if (pa__e4m3_rows_nan(krows, nc, d)) qk_src_rows(PA__CPU_E4M3BN, krows, nc, q, nr, d, dp, s, lds, pf);
        else qk_src_rows(PA__CPU_E4M3B, krows, nc, q, nr, d, dp, s, lds, pf);
        break;
    case PA_DTYPE_FP8_E5M2: qk_src_rows(PA_DTYPE_FP8_E5M2, krows, nc, q, nr, d, dp, s, lds, pf); break;
    default: break;
    }
}

static void a2_qk_src(pa_dtype dtype, const void *const *krows, int nc, const float *q, int nr, int dp,
                      float *s, int lds, const pa__cpu_pf *pf)
{
    qk_src_d(dtype, krows, nc, q, nr, dp, dp, s, lds, pf);
}

/* qk_src_tail (cpu.h) for head sizes that are multiples of 8 (tail_align): the 8-dim steps of
 * the decode kernels end where the row ends, so nothing past it is read and no mask is needed */
static void a2_qk_src_tail(pa_dtype dtype, const void *const *krows, int nc, const float *q, int nr, int d,
                           int dp, float *s, int lds, const pa__cpu_pf *pf)
{
    qk_src_d(dtype, krows, nc, q, nr, d, dp, s, lds, pf);
}

static inline __attribute__((always_inline)) void pv_src_d(pa_dtype dtype, const void *const *vrows, int nc,
                                                           const float *p, int ldp, int nr, int d, int dp,
                                                           const float *alpha, const unsigned char *colmask,
                                                           float *o, const pa__cpu_pf *pf)
{
    switch ((int)dtype) { /* (int: PA__CPU_E4M3B is a tag beside the enumerators) */
    case PA_DTYPE_F32: pv_src_rows(PA_DTYPE_F32, vrows, nc, p, ldp, nr, d, dp, alpha, colmask, o, pf); break;
    case PA_DTYPE_F16: pv_src_rows(PA_DTYPE_F16, vrows, nc, p, ldp, nr, d, dp, alpha, colmask, o, pf); break;
    case PA_DTYPE_BF16: pv_src_rows(PA_DTYPE_BF16, vrows, nc, p, ldp, nr, d, dp, alpha, colmask, o, pf); break;
    case PA_DTYPE_FP8_E4M3:
        if (pa__e4m3_rows_nan(vrows, nc, d)) pv_src_rows(PA_DTYPE_FP8_E4M3, vrows, nc, p, ldp, nr, d, dp, alpha, colmask, o, pf);
        else pv_src_rows(PA__CPU_E4M3F, vrows, nc, p, ldp, nr, d, dp, alpha, colmask, o, pf);
        break;
    case PA__CPU_E4M3B:
        if (pa__e4m3_rows_nan(vrows, nc, d)) {
            pv_src_rows(PA_DTYPE_FP8_E4M3, vrows, nc, p, ldp, nr, d, dp, alpha, colmask, o, pf);
        } else if (nr <= 16 && nc <= CPU_KT) {
            /* V as bf16 words (2^-120 times), so the probabilities 2^120 times (they are at most
             * 1): every product is the unscaled one. A pair split costs 5 integer operations per
             * 16 values against ~8 through f16. */
            float ps[16 * CPU_KT] __attribute__((aligned(32)));
            pa__cpu_probs_up(p, ldp, nr, nc, ps);
            pv_src_rows(PA__CPU_E4M3B, vrows, nc, ps, CPU_KT, nr, d, dp, alpha, colmask, o, pf);
        } else {
            pv_src_rows(PA__CPU_E4M3F, vrows, nc, p, ldp, nr, d, dp, alpha, colmask, o, pf);
        }
        break;
    case PA_DTYPE_FP8_E5M2: pv_src_rows(PA_DTYPE_FP8_E5M2, vrows, nc, p, ldp, nr, d, dp, alpha, colmask, o, pf); break;
    default: break;
    }
}

static void a2_pv_src(pa_dtype dtype, const void *const *vrows, int nc, const float *p, int ldp, int nr,
                      int dp, const float *alpha, const unsigned char *colmask, float *o,
                      const pa__cpu_pf *pf)
{
    pv_src_d(dtype, vrows, nc, p, ldp, nr, dp, dp, alpha, colmask, o, pf);
}

/* pv_src_tail (cpu.h) for head sizes that are multiples of 8, as a2_qk_src_tail: the 8-dim
 * chunks end at d; o's dims past d are scaled by alpha after (alpha NULL: 1, as the AVX-512
 * entries take it). nr is at most an item's rows (CPU_ROWS). Keys in tiles of at most CPU_KT
 * (the driver's tiles are; longer calls go by such tiles, alpha with the first), so that only
 * pv_src_rows' 4-row groups and 1-3 row rest run, never pv_src_body's 16-dim steps. */
static void a2_pv_src_tail(pa_dtype dtype, const void *const *vrows, int nc, const float *p, int ldp, int nr,
                           int d, int dp, const float *alpha, const unsigned char *colmask, float *o,
                           const pa__cpu_pf *pf)
{
    float one[CPU_ROWS];
    if (!alpha || nc > CPU_KT)
        for (int r = 0; r < nr; r++) one[r] = 1.0f;
    const float *al = alpha ? alpha : one;
    for (int c0 = 0; c0 < nc; c0 += CPU_KT)
        pv_src_d(dtype, vrows + c0, nc - c0 < CPU_KT ? nc - c0 : CPU_KT, p + c0, ldp, nr, d, dp, c0 ? one : al,
                 colmask ? colmask + c0 : NULL, o, c0 ? NULL : pf);
    for (int r = 0; r < nr; r++)
        for (int j = d; j < dp; j += 8) {
            float *oj = o + (size_t)r * dp + j;
            _mm256_store_ps(oj, _mm256_mul_ps(_mm256_load_ps(oj), _mm256_set1_ps(al[r])));
        }
}

/* ---- output ------------------------------------------------------------------------------- */

static void a2_store_row(pa_dtype dtype, const float *src, int d, float mul, void *dst)
{
    __m256 vm = _mm256_set1_ps(mul);
    int j = 0, dv = d & ~7;
    switch (dtype) {
    case PA_DTYPE_F32:
        for (; j < dv; j += 8)
            _mm256_storeu_ps((float *)dst + j, _mm256_mul_ps(_mm256_loadu_ps(src + j), vm));
        break;
    case PA_DTYPE_F16:
        for (; j < dv; j += 8)
            _mm_storeu_si128((__m128i *)((uint16_t *)dst + j),
                             _mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(src + j), vm),
                                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        break;
    case PA_DTYPE_BF16:
        for (; j < dv; j += 8) {
            __m256 x = _mm256_mul_ps(_mm256_loadu_ps(src + j), vm);
            __m256i u = _mm256_castps_si256(x);
            __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
            __m256i rnd = _mm256_srli_epi32(
                _mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
            __m256i qnan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
            __m256 isnan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
            __m256i b = _mm256_castps_si256(
                _mm256_blendv_ps(_mm256_castsi256_ps(rnd), _mm256_castsi256_ps(qnan), isnan));
            b = _mm256_permute4x64_epi64(_mm256_packus_epi32(b, b), 0xd8);
            _mm_storeu_si128((__m128i *)((uint16_t *)dst + j), _mm256_castsi256_si128(b));
        }
        break;
    default: break;
    }
    for (; j < d; j++) pa__store_f32(dtype, dst, j, src[j] * mul);
}

void pa__cpu_kernels_init_avx2(pa__cpu_kernels *k)
{
    k->name = "avx2";
    /* 9-16 query rows per KV head straight from f16 caches: 16 x 4096, one thread, a 3-token
     * step at GQA 4 79.4 -> 58.2 ms, GQA 9 38.0 -> 24.7; fp8 not (E5M2 at GQA 16 +14%) */
    k->direct_rows_f16 = 16;
    k->load_rows = a2_load_rows;
    k->qk = a2_qk;
    k->row_max = a2_row_max;
    k->exp_row = a2_exp_row;
    k->softmax_rows = a2_softmax_rows;
    k->p_exp = PA__CPU_P_EXP;
    k->exp_row_unscaled = a2_exp_row_unscaled;
    k->softmax_rows_unscaled = a2_softmax_rows_unscaled;
    k->any_neg_inf = a2_any_neg_inf;
    k->softcap_rows = a2_softcap_rows;
    k->pv = a2_pv;
    k->pv_rows = a2_pv_rows;
    k->store_row = a2_store_row;
    k->qk_src = a2_qk_src;
    k->qk_src_pairs = a2_qk_src_pairs;
    k->pair_span = 16;
    k->pair_split = a2_pair_split;
    k->load_rows_t = a2_load_rows_t;
    k->qk_t = a2_qk_t;
    k->pv_src = a2_pv_src;
    k->qk_src_tail = a2_qk_src_tail;
    k->pv_src_tail = a2_pv_src_tail;
    k->tail_align = 8;
    k->pf_spread = true;
    k->e4m3_bf16 = true;
}
