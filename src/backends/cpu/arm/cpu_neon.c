/* cpu_neon.c: AArch64 Advanced SIMD kernels (fp32 FMA; f16 through FCVTL, bf16 and fp8 through
 * integer shifts). Advanced SIMD is part of every AArch64 CPU, so this file needs no extra flags
 * and the path is always usable there. Overrides every entry of the generic table, with the same
 * contract as the AVX2 file: fp32 accumulation, a column masked out by colmask is never read (a
 * NaN in a masked key's V row cannot reach the output), -inf scores give exactly 0. Loops never
 * read past a row's head_size elements: the last d % 8 (f32: d % 4) elements of a row are
 * converted one by one.
 *
 * Dot products (qk, qk_src) keep one 4-lane accumulator per (row, key) over the head dimension
 * and add its lanes as (l0 + l1) + (l2 + l3), whatever the blocking; P V accumulates in key order
 * after O * alpha, as the generic kernel does. */
#include "../cpu.h"

#include <arm_neon.h>

#define PA__INLINE static inline __attribute__((always_inline))

/* ---- conversions -------------------------------------------------------------------------- */

/* 8 halves, as two float32x4 */
PA__INLINE void cvt_f16x8(const void *p, float32x4_t *lo, float32x4_t *hi)
{
    float16x8_t h = vreinterpretq_f16_u16(vld1q_u16((const uint16_t *)p));
    *lo = vcvt_f32_f16(vget_low_f16(h));
    *hi = vcvt_high_f32_f16(h);
}

/* bf16 is the upper half of an f32: shift each into place */
PA__INLINE void cvt_bf16x8(const void *p, float32x4_t *lo, float32x4_t *hi)
{
    uint16x8_t x = vld1q_u16((const uint16_t *)p);
    *lo = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(x), 16));
    *hi = vreinterpretq_f32_u32(vshll_high_n_u16(x, 16));
}

/* E5M2 is the upper byte of an f16: exact, infinities and NaN included. */
PA__INLINE void cvt_e5m2x8(const void *p, float32x4_t *lo, float32x4_t *hi)
{
    float16x8_t h = vreinterpretq_f16_u16(vshll_n_u8(vld1_u8((const uint8_t *)p), 8));
    *lo = vcvt_f32_f16(vget_low_f16(h));
    *hi = vcvt_high_f32_f16(h);
}

/* E4M3 through f16: the byte sign-extended to 16 bits and shifted left by 7 puts the sign in bit
 * 15 (a copy in bit 14, cleared) and eeee.mmm in an f16's exponent and mantissa, i.e. an f16 2^-8
 * times the E4M3 value (subnormals included, exactly); the f32 result is scaled by 2^8.
 * S.1111.111 (the only NaN) lands on 0x3f80 and is forced to an f16 NaN. */
PA__INLINE void cvt_e4m3x8_raw(const void *p, bool fix_nan, float32x4_t *lo, float32x4_t *hi)
{
    uint16x8_t h = vreinterpretq_u16_s16(vshlq_n_s16(vmovl_s8(vld1_s8((const int8_t *)p)), 7));
    h = vandq_u16(h, vdupq_n_u16(0xbfff));
    if (fix_nan) {
        uint16x8_t nan = vceqq_u16(vandq_u16(h, vdupq_n_u16(0x7fff)), vdupq_n_u16(0x3f80));
        h = vorrq_u16(h, vandq_u16(nan, vdupq_n_u16(0x7e00)));
    }
    float16x8_t f = vreinterpretq_f16_u16(h);
    *lo = vcvt_f32_f16(vget_low_f16(f));
    *hi = vcvt_high_f32_f16(f);
}

PA__INLINE void cvt_e4m3x8(const void *p, float32x4_t *lo, float32x4_t *hi)
{
    cvt_e4m3x8_raw(p, true, lo, hi);
    *lo = vmulq_n_f32(*lo, 256.0f);
    *hi = vmulq_n_f32(*hi, 256.0f);
}

/* 8 elements of `dt` at p as f32 (dt is a constant after inlining). */
PA__INLINE void cvt8(pa_dtype dt, const char *p, float32x4_t *lo, float32x4_t *hi)
{
    switch (dt) {
    case PA_DTYPE_F16: cvt_f16x8(p, lo, hi); break;
    case PA_DTYPE_BF16: cvt_bf16x8(p, lo, hi); break;
    case PA_DTYPE_FP8_E5M2: cvt_e5m2x8(p, lo, hi); break;
    case PA_DTYPE_FP8_E4M3: cvt_e4m3x8(p, lo, hi); break;
    default:
        *lo = vld1q_f32((const float *)p);
        *hi = vld1q_f32((const float *)p + 4);
        break;
    }
}

static size_t elem_size(pa_dtype dt)
{
    return dt == PA_DTYPE_F32 ? 4 : dt == PA_DTYPE_F16 || dt == PA_DTYPE_BF16 ? 2 : 1;
}

/* PA__CPU_E4M3F (cpu.h), E4M3 rows known to hold no NaN byte: the decode kernels convert them
 * without the NaN fix-up, and every E4M3 row without the multiplication by 2^8, which they apply
 * once to the finished scores and outputs (exact: a power of two); 3 operations per 8 values
 * before the f16 conversion instead of 9. n_qk_src and n_pv_src check each call's rows
 * (rows_nan). */

/* cvt8 for the decode kernels: E4M3 comes out 2^-8 times its value */
PA__INLINE void cvt8r(pa_dtype dt, const char *p, float32x4_t *lo, float32x4_t *hi)
{
    if (pa__cpu_is_e4m3(dt)) cvt_e4m3x8_raw(p, dt == PA_DTYPE_FP8_E4M3, lo, hi);
    else cvt8(dt, p, lo, hi);
}

/* Whether some E4M3 value among the first d bytes of the n rows is a NaN. */
static bool rows_nan(const void *const *rows, int n, int d)
{
    uint8x16_t acc = vdupq_n_u8(0);
    for (int i = 0; i < n; i++) {
        const uint8_t *r = rows[i];
        int j = 0;
        for (; j + 16 <= d; j += 16) acc = vmaxq_u8(acc, vandq_u8(vld1q_u8(r + j), vdupq_n_u8(0x7f)));
        for (; j < d; j++)
            if ((r[j] & 0x7f) == 0x7f) return true;
    }
    return vmaxvq_u8(acc) == 0x7f;
}

PA__INLINE void load_rows_body(pa_dtype dt, const void *const *rows, int n, int d, int dp, float *dst)
{
    const size_t es = elem_size(dt);
    const int dv = d & ~7;
    for (int i = 0; i < n; i++) {
        float *o = dst + (size_t)i * dp;
        const char *src = rows[i];
        int j = 0;
        for (; j < dv; j += 8) {
            float32x4_t lo, hi;
            cvt8(dt, src + j * es, &lo, &hi);
            vst1q_f32(o + j, lo);
            vst1q_f32(o + j + 4, hi);
        }
        if (dt == PA_DTYPE_F32)
            for (; j + 4 <= d; j += 4) vst1q_f32(o + j, vld1q_f32((const float *)src + j));
        for (; j < d; j++) o[j] = pa__load_f32(dt, src, j);
        for (; j < dp; j++) o[j] = 0.0f;
    }
}

static void n_load_rows(pa_dtype dtype, const void *const *rows, int n, int d, int dp, float *dst)
{
    switch (dtype) {
    case PA_DTYPE_F32: load_rows_body(PA_DTYPE_F32, rows, n, d, dp, dst); break;
    case PA_DTYPE_F16: load_rows_body(PA_DTYPE_F16, rows, n, d, dp, dst); break;
    case PA_DTYPE_BF16: load_rows_body(PA_DTYPE_BF16, rows, n, d, dp, dst); break;
    case PA_DTYPE_FP8_E4M3: load_rows_body(PA_DTYPE_FP8_E4M3, rows, n, d, dp, dst); break;
    case PA_DTYPE_FP8_E5M2: load_rows_body(PA_DTYPE_FP8_E5M2, rows, n, d, dp, dst); break;
    default: break;
    }
}

/* ---- reductions --------------------------------------------------------------------------- */

/* [sum a0, sum a1, sum a2, sum a3], each as (l0 + l1) + (l2 + l3) */
PA__INLINE float32x4_t hsum4(float32x4_t a0, float32x4_t a1, float32x4_t a2, float32x4_t a3)
{
    return vpaddq_f32(vpaddq_f32(a0, a1), vpaddq_f32(a2, a3));
}

/* (l0 + l1) + (l2 + l3), as hsum4 */
PA__INLINE float hsum1(float32x4_t a)
{
    float32x4_t t = vpaddq_f32(a, a);
    return vgetq_lane_f32(vpaddq_f32(t, t), 0);
}

/* ---- S = Q K^T ---------------------------------------------------------------------------- */

/* R rows (1 or 4) x C keys (1 or 4) of S; one accumulator per pair. kr[c] points at key c. */
PA__INLINE void qk_block(int R, int C, const float *q, int dp, const float *const *kr, float *s,
                         int lds)
{
    float32x4_t a[4][4];
    for (int i = 0; i < R; i++)
        for (int c = 0; c < C; c++) a[i][c] = vdupq_n_f32(0.0f);
    for (int j = 0; j < dp; j += 4) {
        float32x4_t x[4];
        for (int c = 0; c < C; c++) x[c] = vld1q_f32(kr[c] + j);
        for (int i = 0; i < R; i++) {
            float32x4_t y = vld1q_f32(q + (size_t)i * dp + j);
            for (int c = 0; c < C; c++) a[i][c] = vfmaq_f32(a[i][c], y, x[c]);
        }
    }
    for (int i = 0; i < R; i++) {
        if (C == 4) vst1q_f32(s + (size_t)i * lds, hsum4(a[i][0], a[i][1], a[i][2], a[i][3]));
        else s[(size_t)i * lds] = hsum1(a[i][0]);
    }
}

static void n_qk(const float *q, int nr, const float *k, int nc, int dp, float *s, int lds)
{
    for (int r = 0; r < nr;) {
        int R = nr - r >= 4 ? 4 : 1;
        const float *qr = q + (size_t)r * dp;
        float *sr = s + (size_t)r * lds;
        int c = 0;
        for (; c + 4 <= nc; c += 4) {
            const float *kr[4];
            for (int u = 0; u < 4; u++) kr[u] = k + (size_t)(c + u) * dp;
            if (R == 4) qk_block(4, 4, qr, dp, kr, sr + c, lds);
            else qk_block(1, 4, qr, dp, kr, sr + c, lds);
        }
        for (; c < nc; c++) {
            const float *kr[1] = {k + (size_t)c * dp};
            if (R == 4) qk_block(4, 1, qr, dp, kr, sr + c, lds);
            else qk_block(1, 1, qr, dp, kr, sr + c, lds);
        }
        r += R;
    }
}

/* ---- S = Q K^T with K transposed (prefill tiles) ------------------------------------------ */

static void n_load_rows_t(pa_dtype dtype, const void *const *rows, int n, int d, int dp, float *kt)
{
    float tmp[4 * 512] __attribute__((aligned(64)));
    int n16 = (n + 15) & ~15;
    for (int i0 = 0; i0 < n16; i0 += 4) {
        int m = n - i0 < 4 ? (n - i0 > 0 ? n - i0 : 0) : 4;
        n_load_rows(dtype, rows + i0, m, d, dp, tmp);
        for (int i = m; i < 4; i++) memset(tmp + (size_t)i * dp, 0, (size_t)dp * sizeof(float));
        for (int j = 0; j < dp; j += 4) {
            float32x4_t r0 = vld1q_f32(tmp + j), r1 = vld1q_f32(tmp + dp + j);
            float32x4_t r2 = vld1q_f32(tmp + 2 * (size_t)dp + j), r3 = vld1q_f32(tmp + 3 * (size_t)dp + j);
            /* 4 x 4 transpose: pairs of lanes, then pairs of pairs */
            float32x4_t t0 = vtrn1q_f32(r0, r1), t1 = vtrn2q_f32(r0, r1);
            float32x4_t t2 = vtrn1q_f32(r2, r3), t3 = vtrn2q_f32(r2, r3);
            float64x2_t u0 = vreinterpretq_f64_f32(t0), u1 = vreinterpretq_f64_f32(t1);
            float64x2_t u2 = vreinterpretq_f64_f32(t2), u3 = vreinterpretq_f64_f32(t3);
            float *col = kt + (size_t)j * CPU_KT + i0;
            vst1q_f32(col, vreinterpretq_f32_f64(vtrn1q_f64(u0, u2)));
            vst1q_f32(col + CPU_KT, vreinterpretq_f32_f64(vtrn1q_f64(u1, u3)));
            vst1q_f32(col + 2 * CPU_KT, vreinterpretq_f32_f64(vtrn2q_f64(u0, u2)));
            vst1q_f32(col + 3 * CPU_KT, vreinterpretq_f32_f64(vtrn2q_f64(u1, u3)));
        }
    }
}

/* R rows (1 or 4) x 16 keys as outer products: 4R accumulators; q read 4 dimensions at a time
 * and used lane by lane; the head in chunks of CPU_QK_CHUNK dims, their sums in groups (g), the
 * group sums added to the total in S (cpu.h). */
PA__QK_GROUP_SCRATCH_BEGIN
PA__INLINE void qkt_block(int R, const float *q, const float *kt, int c0, int dp, float *s, int lds)
{
    float g[4 * 16];
    for (int j0 = 0; j0 < dp; j0 += CPU_QK_CHUNK) {
        const int j1 = dp - j0 > CPU_QK_CHUNK ? j0 + CPU_QK_CHUNK : dp;
        float32x4_t a[4][4];
        for (int i = 0; i < R; i++)
            for (int u = 0; u < 4; u++) a[i][u] = vdupq_n_f32(0.0f);
        for (int j = j0; j < j1; j += 4) {
            float32x4_t y[4];
            for (int i = 0; i < R; i++) y[i] = vld1q_f32(q + (size_t)i * dp + j);
#define PA__QKT_STEP(t)                                                                            \
        do {                                                                                       \
            const float *kj = kt + (size_t)(j + (t)) * CPU_KT + c0;                                \
            float32x4_t k0 = vld1q_f32(kj), k1 = vld1q_f32(kj + 4);                                \
            float32x4_t k2 = vld1q_f32(kj + 8), k3 = vld1q_f32(kj + 12);                           \
            for (int i = 0; i < R; i++) {                                                          \
                a[i][0] = vfmaq_laneq_f32(a[i][0], k0, y[i], t);                                   \
                a[i][1] = vfmaq_laneq_f32(a[i][1], k1, y[i], t);                                   \
                a[i][2] = vfmaq_laneq_f32(a[i][2], k2, y[i], t);                                   \
                a[i][3] = vfmaq_laneq_f32(a[i][3], k3, y[i], t);                                   \
            }                                                                                      \
        } while (0)
            PA__QKT_STEP(0);
            PA__QKT_STEP(1);
            PA__QKT_STEP(2);
            PA__QKT_STEP(3);
#undef PA__QKT_STEP
        }
        const int c = j0 / CPU_QK_CHUNK;
        const bool gfirst = c % CPU_QK_GROUP == 0, glast = c % CPU_QK_GROUP == CPU_QK_GROUP - 1 || j1 == dp;
        if (!glast) {
            if (gfirst)
                for (int i = 0; i < R; i++)
                    for (int u = 0; u < 4; u++) vst1q_f32(g + 16 * i + 4 * u, a[i][u]);
            else
                for (int i = 0; i < R; i++)
                    for (int u = 0; u < 4; u++)
                        vst1q_f32(g + 16 * i + 4 * u, vaddq_f32(vld1q_f32(g + 16 * i + 4 * u), a[i][u]));
            continue;
        }
        if (!gfirst)
            for (int i = 0; i < R; i++)
                for (int u = 0; u < 4; u++) a[i][u] = vaddq_f32(vld1q_f32(g + 16 * i + 4 * u), a[i][u]);
        for (int i = 0; i < R; i++)
            for (int u = 0; u < 4; u++) {
                float *si = s + (size_t)i * lds + c0 + 4 * u;
                vst1q_f32(si, c >= CPU_QK_GROUP ? vaddq_f32(vld1q_f32(si), a[i][u]) : a[i][u]);
            }
    }
}
PA__QK_GROUP_SCRATCH_END

static void n_qk_t(const float *q, int nr, const float *kt, int nc, int dp, float *s, int lds,
                   const pa__cpu_pf *pf)
{
    int n16 = (nc + 15) & ~15, r = 0;
    if (nr < 4) pf_share(pf, 0, 1);
    for (; r + 4 <= nr; r += 4) {
        pf_share(pf, r / 4, nr / 4); /* one share per 4 rows */
        for (int c0 = 0; c0 < n16; c0 += 16)
            qkt_block(4, q + (size_t)r * dp, kt, c0, dp, s + (size_t)r * lds, lds);
    }
    for (; r < nr; r++)
        for (int c0 = 0; c0 < n16; c0 += 16)
            qkt_block(1, q + (size_t)r * dp, kt, c0, dp, s + (size_t)r * lds, lds);
}

/* ---- softmax pieces ----------------------------------------------------------------------- */

/* FMAX (not FMAXNM) returns NaN when an operand is NaN: a NaN score reaches the result. */
static float n_row_max(const float *s, int n)
{
    float32x4_t m = vdupq_n_f32(-INFINITY);
    int i = 0;
    for (; i + 4 <= n; i += 4) m = vmaxq_f32(m, vld1q_f32(s + i));
    float r = vmaxvq_f32(m);
    for (; i < n; i++)
        if (isnan(s[i]) || s[i] > r) r = s[i];
    return r;
}

/* exp(x) for x <= 0: the AVX2 file's exp8 (Cody-Waite reduction by ln 2, Cephes expf's degree-6
 * polynomial, ~1 ulp; fp32 subnormals below -87.3 as (2^-64 p) 2^(n + 64), 0 below -104; the
 * same bits); the caller zeroes -inf lanes. */
PA__INLINE float32x4_t exp4(float32x4_t x)
{
    x = vmaxq_f32(x, vdupq_n_f32(-104.0f));
    x = vminq_f32(x, vdupq_n_f32(0.0f));
    float32x4_t n = vrndnq_f32(vmulq_n_f32(x, 1.44269504088896341f));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
    r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
    const float u = 0x1p-64f; /* (the AVX2 file's scaled coefficients) */
    float32x4_t p = vdupq_n_f32(1.9875691500E-4f * u);
    p = vfmaq_f32(vdupq_n_f32(1.3981999507E-3f * u), p, r);
    p = vfmaq_f32(vdupq_n_f32(8.3334519073E-3f * u), p, r);
    p = vfmaq_f32(vdupq_n_f32(4.1665795894E-2f * u), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.6666665459E-1f * u), p, r);
    p = vfmaq_f32(vdupq_n_f32(5.0000001201E-1f * u), p, r);
    p = vfmaq_f32(vfmaq_n_f32(vdupq_n_f32(u), r, u), p, vmulq_f32(r, r));
    int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127 + 64)), 23);
    return vmulq_f32(p, vreinterpretq_f32_s32(e));
}

/* softcap_rows (cpu.h): the avx512 table's form (x86/cpu_avx512.c, a5_softcap_rows) 4 lanes at
 * a time: tanh of y = s / cap by its odd series to y^15 below |y| = 0.5, (1 - e) / (1 + e) with
 * e = exp4(-2 |y|) above, the sign of y put back, NaN lanes passed through. A row's tail goes
 * through a buffer of 4: nothing past nc is read or written. */
PA__INLINE float32x4_t cap4(float32x4_t x, float32x4_t inv, float32x4_t vcap)
{
    const uint32x4_t sign = vdupq_n_u32(0x80000000u);
    const float32x4_t one = vdupq_n_f32(1.0f);
    const float32x4_t y = vmulq_f32(x, inv), a = vabsq_f32(y);
    const float32x4_t e = exp4(vmulq_n_f32(a, -2.0f));
    const float32x4_t big = vdivq_f32(vsubq_f32(one, e), vaddq_f32(one, e));
    const float32x4_t y2 = vmulq_f32(a, a);
    float32x4_t q = vdupq_n_f32(pa__cpu_tanh_series[0]);
    for (int i = 1; i < PA__CPU_TANH_SERIES_N; i++) q = vfmaq_f32(vdupq_n_f32(pa__cpu_tanh_series[i]), q, y2);
    const float32x4_t small = vfmaq_f32(a, vmulq_f32(q, y2), a);
    float32x4_t t = vbslq_f32(vcltq_f32(a, vdupq_n_f32(0.5f)), small, big);
    t = vreinterpretq_f32_u32(vorrq_u32(vreinterpretq_u32_f32(t), vandq_u32(vreinterpretq_u32_f32(y), sign)));
    t = vbslq_f32(vceqq_f32(y, y), t, y); /* NaN lanes: y */
    return vmulq_f32(vcap, t);
}

static void n_softcap_rows(float *s, int lds, int nr, int nc, float cap)
{
    const float32x4_t inv = vdupq_n_f32(1.0f / cap), vcap = vdupq_n_f32(cap);
    for (int r = 0; r < nr; r++) {
        float *p = s + (size_t)r * lds;
        int c = 0;
        for (; c + 4 <= nc; c += 4) vst1q_f32(p + c, cap4(vld1q_f32(p + c), inv, vcap));
        if (c < nc) {
            float t[4] = {0};
            memcpy(t, p + c, sizeof(float) * (size_t)(nc - c));
            vst1q_f32(t, cap4(vld1q_f32(t), inv, vcap));
            memcpy(p + c, t, sizeof(float) * (size_t)(nc - c));
        }
    }
}

static float n_exp_row(float *s, int n, float m)
{
    float32x4_t vm = vdupq_n_f32(m), ninf = vdupq_n_f32(-INFINITY), acc = vdupq_n_f32(0.0f);
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        float32x4_t x = vld1q_f32(s + i);
        float32x4_t e = exp4(vsubq_f32(x, vm));
        e = vbslq_f32(vceqq_f32(x, ninf), vdupq_n_f32(-0.0f), e); /* masked: -0 (see cpu.h) */
        vst1q_f32(s + i, e);
        acc = vaddq_f32(acc, e);
    }
    float sum = hsum1(acc);
    for (; i < n; i++) {
        float e = s[i] == -INFINITY ? -0.0f : expf(s[i] - m);
        s[i] = e;
        sum += e;
    }
    return sum;
}

/* ---- O = O * alpha + P V ------------------------------------------------------------------ */

/* R rows x 4U vectors of O (R * U <= 16 accumulators) at dimension j; V rows from vrow(c). The
 * caller's pv_in and pv_out scale alpha and the stored sums (1 and 1; E4M3 V rows converted 2^-8
 * times their value: 2^-8 and 2^8, exact). */
#define PA__PV_BLOCK(R, U, LOADV)                                                                  \
    do {                                                                                           \
        float32x4_t a[R][U];                                                                       \
        for (int i = 0; i < (R); i++)                                                              \
            for (int u = 0; u < (U); u++)                                                          \
                a[i][u] = vmulq_n_f32(vld1q_f32(o0 + (size_t)i * dp + j + 4 * u), alpha[r + i] * pv_in); \
        for (int c = 0; c < nc; c++) {                                                             \
            if (colmask && !colmask[c]) continue; /* masked: its V row is never read */           \
            float32x4_t x[U];                                                                      \
            LOADV;                                                                                 \
            for (int i = 0; i < (R); i++) {                                                        \
                float w = p0[(size_t)i * ldp + c];                                                 \
                for (int u = 0; u < (U); u++) a[i][u] = vfmaq_n_f32(a[i][u], x[u], w);             \
            }                                                                                      \
        }                                                                                          \
        for (int i = 0; i < (R); i++)                                                              \
            for (int u = 0; u < (U); u++) {                                                        \
                float32x4_t y = pv_out != 1.0f ? vmulq_n_f32(a[i][u], pv_out) : a[i][u];          \
                vst1q_f32(o0 + (size_t)i * dp + j + 4 * u, y);                                     \
            }                                                                                      \
    } while (0)

static void n_pv(const float *p, int ldp, int nr, const float *v, int nc, int dp,
                 const float *alpha, const unsigned char *colmask, float *o, const pa__cpu_pf *pf)
{
    const float pv_in = 1.0f, pv_out = 1.0f;
    int r = 0;
    if (nr < 4) pf_share(pf, 0, 1);
    /* 4 rows x 16 dimensions: 16 accumulators; pf one share per 4 rows */
    for (; r + 4 <= nr; r += 4) {
        pf_share(pf, r / 4, nr / 4);
        const float *p0 = p + (size_t)r * ldp;
        float *o0 = o + (size_t)r * dp;
        for (int j = 0; j < dp; j += 16)
            PA__PV_BLOCK(4, 4, for (int u = 0; u < 4; u++) x[u] = vld1q_f32(v + (size_t)c * dp + j + 4 * u));
    }
    for (; r < nr; r++) {
        const float *p0 = p + (size_t)r * ldp;
        float *o0 = o + (size_t)r * dp;
        int j = 0;
        for (; j + 64 <= dp; j += 64)
            PA__PV_BLOCK(1, 16, for (int u = 0; u < 16; u++) x[u] = vld1q_f32(v + (size_t)c * dp + j + 4 * u));
        for (; j < dp; j += 16)
            PA__PV_BLOCK(1, 4, for (int u = 0; u < 4; u++) x[u] = vld1q_f32(v + (size_t)c * dp + j + 4 * u));
    }
}

/* ---- decode: products straight from the cache rows ------------------------------------------ */

/* R rows (1-4) x C keys (1, 4 or 8), keys converted 8 dimensions at a time in registers. */
PA__INLINE void qk_src_block(pa_dtype dt, int R, int C, const float *q, int dp,
                             const char *const *kr, float *s, int lds)
{
    const size_t es = elem_size(dt);
    float32x4_t a[4][8];
    for (int i = 0; i < R; i++)
        for (int c = 0; c < C; c++) a[i][c] = vdupq_n_f32(0.0f);
    for (int j = 0; j < dp; j += 8) {
        float32x4_t x[8][2];
        for (int c = 0; c < C; c++) cvt8r(dt, kr[c] + j * es, &x[c][0], &x[c][1]);
        for (int i = 0; i < R; i++) {
            float32x4_t y0 = vld1q_f32(q + (size_t)i * dp + j), y1 = vld1q_f32(q + (size_t)i * dp + j + 4);
            for (int c = 0; c < C; c++) {
                a[i][c] = vfmaq_f32(a[i][c], y0, x[c][0]);
                a[i][c] = vfmaq_f32(a[i][c], y1, x[c][1]);
            }
        }
    }
    const float mul = pa__cpu_is_e4m3(dt) ? 256.0f : 1.0f;
    for (int i = 0; i < R; i++) {
        for (int c = 0; c + 4 <= C; c += 4) {
            float32x4_t t = hsum4(a[i][c], a[i][c + 1], a[i][c + 2], a[i][c + 3]);
            vst1q_f32(s + (size_t)i * lds + c, mul != 1.0f ? vmulq_n_f32(t, mul) : t);
        }
        if (C == 1) s[(size_t)i * lds] = hsum1(a[i][0]) * mul;
    }
}

/* R rows (1-4) over all nc keys, each key chunk converted once for the R rows: 8 keys at a time
 * for one row, 4 for 2-4 rows (8-16 accumulators), then single keys. Every (row, key) sum is the
 * same FMAs in the same order and the same lane reduction whatever R and C, so a score does not
 * depend on the rows or keys beside it. */
PA__INLINE void qk_src_rows(pa_dtype dt, int R, const void *const *krows, int nc, const float *q, int dp,
                            float *s, int lds)
{
    const int C = R == 1 ? 8 : 4;
    int c = 0;
    for (; c + C <= nc; c += C) {
        const char *kr[8];
        for (int u = 0; u < C; u++) kr[u] = krows[c + u];
        qk_src_block(dt, R, C, q, dp, kr, s + c, lds);
    }
    if (R == 1 && c + 4 <= nc) {
        const char *kr[4] = {krows[c], krows[c + 1], krows[c + 2], krows[c + 3]};
        qk_src_block(dt, 1, 4, q, dp, kr, s + c, lds);
        c += 4;
    }
    for (; c < nc; c++) {
        const char *kr[1] = {krows[c]};
        qk_src_block(dt, R, 1, q, dp, kr, s + c, lds);
    }
}

/* Rows in groups of 4, the last 1-3 as one group (GQA 1-3 and the rest of GQA 5-7 convert each
 * key once per group, not once per row). */
PA__INLINE void qk_src_body(pa_dtype dt, const void *const *krows, int nc, const float *q, int nr,
                            int dp, float *s, int lds)
{
    for (int r = 0; r < nr; r += 4) {
        const float *qr = q + (size_t)r * dp;
        float *sr = s + (size_t)r * lds;
        switch (nr - r >= 4 ? 4 : nr - r) {
        case 4: qk_src_rows(dt, 4, krows, nc, qr, dp, sr, lds); break;
        case 3: qk_src_rows(dt, 3, krows, nc, qr, dp, sr, lds); break;
        case 2: qk_src_rows(dt, 2, krows, nc, qr, dp, sr, lds); break;
        default: qk_src_rows(dt, 1, krows, nc, qr, dp, sr, lds); break;
        }
    }
}

/* Rows in groups of 4 (x 16 dims), the last 1-3 as one group: 3 rows x 16 dims, 2 rows x 32, one
 * row x 32 (12-16 accumulators, 8 for a last 16 dims); each V chunk converted once per group and
 * key. Every output element accumulates the same products in key order whatever the grouping. */
PA__INLINE void pv_src_body(pa_dtype dt, const void *const *vrows, int nc, const float *p, int ldp,
                            int nr, int dp, const float *alpha, const unsigned char *colmask, float *o)
{
    const size_t es = elem_size(dt);
    const float pv_in = pa__cpu_is_e4m3(dt) ? 1.0f / 256.0f : 1.0f, pv_out = pa__cpu_is_e4m3(dt) ? 256.0f : 1.0f;
    /* (the LOADV argument of PA__PV_BLOCK: key c's V at dimension j as 4 or 8 vectors x[]) */
#define PA__CVT16                                                                                  \
    do {                                                                                           \
        const char *vc = (const char *)vrows[c] + j * es;                                          \
        cvt8r(dt, vc, &x[0], &x[1]);                                                                \
        cvt8r(dt, vc + 8 * es, &x[2], &x[3]);                                                       \
    } while (0)
#define PA__CVT32                                                                                  \
    do {                                                                                           \
        const char *vc = (const char *)vrows[c] + j * es;                                          \
        for (int u = 0; u < 4; u++) cvt8r(dt, vc + 8 * u * es, &x[2 * u], &x[2 * u + 1]);           \
    } while (0)
    for (int r = 0; r < nr; r += 4) {
        const float *p0 = p + (size_t)r * ldp;
        float *o0 = o + (size_t)r * dp;
        int j = 0;
        switch (nr - r >= 4 ? 4 : nr - r) {
        case 4:
            for (; j < dp; j += 16) PA__PV_BLOCK(4, 4, PA__CVT16);
            break;
        case 3:
            for (; j < dp; j += 16) PA__PV_BLOCK(3, 4, PA__CVT16);
            break;
        case 2:
            for (; j + 32 <= dp; j += 32) PA__PV_BLOCK(2, 8, PA__CVT32);
            for (; j < dp; j += 16) PA__PV_BLOCK(2, 4, PA__CVT16);
            break;
        default:
            for (; j + 32 <= dp; j += 32) PA__PV_BLOCK(1, 8, PA__CVT32);
            for (; j < dp; j += 16) PA__PV_BLOCK(1, 4, PA__CVT16);
            break;
        }
    }
#undef PA__CVT16
#undef PA__CVT32
}

static void n_qk_src(pa_dtype dtype, const void *const *krows, int nc, const float *q, int nr, int dp,
                     float *s, int lds, const pa__cpu_pf *pf)
{
    (void)pf; /* pf_spread is false: the driver prefetches */
    switch (dtype) {
    case PA_DTYPE_F32: qk_src_body(PA_DTYPE_F32, krows, nc, q, nr, dp, s, lds); break;
    case PA_DTYPE_F16: qk_src_body(PA_DTYPE_F16, krows, nc, q, nr, dp, s, lds); break;
    case PA_DTYPE_BF16: qk_src_body(PA_DTYPE_BF16, krows, nc, q, nr, dp, s, lds); break;
    case PA_DTYPE_FP8_E4M3:
        if (rows_nan(krows, nc, dp)) qk_src_body(PA_DTYPE_FP8_E4M3, krows, nc, q, nr, dp, s, lds);
        else qk_src_body(PA__CPU_E4M3F, krows, nc, q, nr, dp, s, lds);
        break;
    case PA_DTYPE_FP8_E5M2: qk_src_body(PA_DTYPE_FP8_E5M2, krows, nc, q, nr, dp, s, lds); break;
    default: break;
    }
}

static void n_pv_src(pa_dtype dtype, const void *const *vrows, int nc, const float *p, int ldp, int nr,
                     int dp, const float *alpha, const unsigned char *colmask, float *o,
                     const pa__cpu_pf *pf)
{
    (void)pf;
    switch (dtype) {
    case PA_DTYPE_F32: pv_src_body(PA_DTYPE_F32, vrows, nc, p, ldp, nr, dp, alpha, colmask, o); break;
    case PA_DTYPE_F16: pv_src_body(PA_DTYPE_F16, vrows, nc, p, ldp, nr, dp, alpha, colmask, o); break;
    case PA_DTYPE_BF16: pv_src_body(PA_DTYPE_BF16, vrows, nc, p, ldp, nr, dp, alpha, colmask, o); break;
    case PA_DTYPE_FP8_E4M3:
        if (rows_nan(vrows, nc, dp)) pv_src_body(PA_DTYPE_FP8_E4M3, vrows, nc, p, ldp, nr, dp, alpha, colmask, o);
        else pv_src_body(PA__CPU_E4M3F, vrows, nc, p, ldp, nr, dp, alpha, colmask, o);
        break;
    case PA_DTYPE_FP8_E5M2: pv_src_body(PA_DTYPE_FP8_E5M2, vrows, nc, p, ldp, nr, dp, alpha, colmask, o); break;
    default: break;
    }
}

#undef PA__PV_BLOCK

/* ---- output ------------------------------------------------------------------------------- */

/* f16 through FCVTN (round to nearest even under the default FPCR, as the scalar conversion);
 * bf16 rounded to nearest even by integer adds, a NaN kept (quieted) rather than rounded. */
static void n_store_row(pa_dtype dtype, const float *src, int d, float mul, void *dst)
{
    int j = 0, dv = d & ~3;
    switch (dtype) {
    case PA_DTYPE_F32:
        for (; j < dv; j += 4) vst1q_f32((float *)dst + j, vmulq_n_f32(vld1q_f32(src + j), mul));
        break;
    case PA_DTYPE_F16:
        for (; j < dv; j += 4) {
            float16x4_t h = vcvt_f16_f32(vmulq_n_f32(vld1q_f32(src + j), mul));
            vst1_u16((uint16_t *)dst + j, vreinterpret_u16_f16(h));
        }
        break;
    case PA_DTYPE_BF16:
        for (; j < dv; j += 4) {
            float32x4_t x = vmulq_n_f32(vld1q_f32(src + j), mul);
            uint32x4_t u = vreinterpretq_u32_f32(x);
            uint32x4_t odd = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
            uint32x4_t rnd = vshrq_n_u32(vaddq_u32(u, vaddq_u32(odd, vdupq_n_u32(0x7fff))), 16);
            uint32x4_t qnan = vorrq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(0x40));
            uint32x4_t b = vbslq_u32(vceqq_f32(x, x), rnd, qnan);
            vst1_u16((uint16_t *)dst + j, vmovn_u32(b));
        }
        break;
    default: break;
    }
    for (; j < d; j++) pa__store_f32(dtype, dst, j, src[j] * mul);
}

void pa__cpu_kernels_init_neon(pa__cpu_kernels *k)
{
    k->name = "neon";
    k->load_rows = n_load_rows;
    k->qk = n_qk;
    k->row_max = n_row_max;
    k->exp_row = n_exp_row;
    k->softcap_rows = n_softcap_rows;
    k->pv = n_pv;
    k->store_row = n_store_row;
    k->qk_src = n_qk_src;
    k->load_rows_t = n_load_rows_t;
    k->qk_t = n_qk_t;
    k->pv_src = n_pv_src;
}
